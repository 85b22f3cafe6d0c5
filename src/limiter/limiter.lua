--[[
mailgate limiter: an exact multi-window sliding-log rate limiter with per-job
idempotency. One script, one round trip per call, atomic; the operation is
chosen by ARGV[1]. Requires Redis >= 5 (effects replication, so TIME may be
read before writing). Not for Redis Cluster: a request's keys span slots.

KEYS[1]       the job record, a hash "<prefix>job:<id>" with fields
                at  admission time (ms)
                st  "a" admitted, "s" sent (the mail went out)
                n   number of scope keys, k1..kn the scope keys it was counted in
KEYS[2..]     one sorted set per scope that applies ("<prefix>email:<mailbox>",
              "<prefix>ip:<network>"): member = job id, score = admission ms.
              Members are job ids, never bare timestamps, so two jobs in the
              same millisecond both count. (admit only; refund and sent read
              the scope keys from the job record.)

ARGV[1]       op: "admit" | "refund" | "sent"
ARGV[2]       now in ms, or "" to use the Redis server's TIME (production)
ARGV[3]       job id
ARGV[4]       how long the job record lives, ms (>= the longest window)
ARGV[5..]     admit only: for each scope key in KEYS order, the number of
              rules r, then r pairs (window_ms, max)

Returns
  admit   {1, now}                                    admitted, recorded everywhere
          {0, now, retry_after_ms, scope_i, rule_i}   rejected, nothing recorded;
                                                      1-based indices of the binding rule
          {2, now, admitted_at_ms, sent (0|1)}        duplicate, nothing recorded
  refund  1 if an admission was removed, else 0
  sent    1 if the job record existed, else 0
]]

local op = ARGV[1]
local job = KEYS[1]
local id = ARGV[3]

local now
if ARGV[2] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[2])
end

-- Integers as Redis wants them in commands (never "1.7e+12").
local function int(x)
  return string.format('%.0f', x)
end

if op == 'admit' then
  -- Idempotency first: an admitted id is never counted twice.
  local rec = redis.call('HMGET', job, 'at', 'st')
  if rec[1] then
    return {2, now, tonumber(rec[1]), rec[2] == 's' and 1 or 0}
  end

  local best_d, best_s, best_r = -1, 0, 0
  local longest = {}
  local a = 5
  for s = 2, #KEYS do
    local key = KEYS[s]
    local nrules = tonumber(ARGV[a])
    local first = a + 1
    a = a + 1 + 2 * nrules
    local wmax = 0
    for r = 0, nrules - 1 do
      local w = tonumber(ARGV[first + 2 * r])
      if w > wmax then wmax = w end
    end
    longest[s] = wmax
    -- Forget what no rule can see any more (bounded memory), then read the
    -- rest of the log once, ascending. A brand-new key reads as empty.
    redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now - wmax))
    local log = redis.call('ZRANGEBYSCORE', key, '(' .. int(now - wmax), int(now), 'WITHSCORES')
    local times = {}
    for i = 2, #log, 2 do
      times[#times + 1] = tonumber(log[i])
    end
    for r = 0, nrules - 1 do
      local w = tonumber(ARGV[first + 2 * r])
      local max = tonumber(ARGV[first + 2 * r + 1])
      -- count the times in (now - w, now]; times are ascending
      local lo = 1
      while lo <= #times and times[lo] + w <= now do lo = lo + 1 end
      local count = #times - lo + 1
      if count >= max then
        -- the (count - max + 1)-th oldest admission in the window leaves it
        -- at e + w; only then does the rule have room again
        local d = times[lo + count - max] + w - now
        if d > best_d then
          best_d, best_s, best_r = d, s - 1, r + 1
        end
      end
    end
  end

  if best_d >= 0 then
    return {0, now, best_d, best_s, best_r}
  end

  local fields = {'at', int(now), 'st', 'a', 'n', #KEYS - 1}
  for s = 2, #KEYS do
    redis.call('ZADD', KEYS[s], int(now), id)
    redis.call('PEXPIRE', KEYS[s], int(longest[s]))
    fields[#fields + 1] = 'k' .. (s - 1)
    fields[#fields + 1] = KEYS[s]
  end
  redis.call('HSET', job, unpack(fields))
  redis.call('PEXPIRE', job, ARGV[4])
  return {1, now}

elseif op == 'refund' then
  local n = tonumber(redis.call('HGET', job, 'n'))
  if not n then return 0 end
  for i = 1, n do
    local key = redis.call('HGET', job, 'k' .. i)
    if key then redis.call('ZREM', key, id) end
  end
  redis.call('DEL', job)
  return 1

elseif op == 'sent' then
  if redis.call('EXISTS', job) == 0 then return 0 end
  redis.call('HSET', job, 'st', 's')
  return 1
end

return redis.error_reply('mailgate limiter: unknown op ' .. tostring(op))
