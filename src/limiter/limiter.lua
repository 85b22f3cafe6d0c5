--[[
mailgate limiter: an exact multi-window sliding-log rate limiter with per-job
idempotency. One script; every call is one round trip and atomic. The
operation is ARGV[1]. Requires Redis >= 5 (effects replication, so TIME may be
read before writing). Not for Redis Cluster: a request's keys span slots.

Data (all keys under the deployment's prefix, all with a TTL):
  <prefix>job:<id>          hash, one per admitted job, lives the dedup period
                              at  admission time (ms)
                              st  "a" admitted, not sending; "x" sending (an
                                  SMTP transaction began); "s" sent (the mail
                                  went out); "u" unknown (its sender vanished
                                  mid-send; never resent)
                              lease  until when (ms) one worker owns the send
                                  of an admitted job; another copy of the job
                                  that arrives meanwhile waits, so one
                                  admission is mailed once
                              m   its member in the scope logs
                              n   number of scope keys; k1..kn those keys
  <prefix>email:<mailbox>   sorted set per scope key: score = admission ms,
  <prefix>ip:<network>        member = "<admission ms, 12 hex digits>:<job id>".
                              Members are unique per job, never bare
                              timestamps, so two jobs in the same millisecond
                              both count; the time is repeated in the member
                              so reads need no WITHSCORES (formatting scores
                              costs Redis more than the rest of a decision).
                              Lives the scope's longest window after its
                              newest admission.

Semantics: a request is admitted iff for every rule (W, N) of every scope,
fewer than N admissions of that key lie in (now - W, now]. That holds iff the
N-th newest admission at or before now (if any) is at or before now - W, so
only the newest few entries of a log are ever read. A full rule frees up at
t_N + W, where t_N is that N-th newest time; retry_after is the largest such
wait over all rules, and the first rule (scope order, then rule order) with
that wait is the binding one.

op "admit" -- decide a batch of requests in order, all at one instant
  KEYS      for each request, its scope keys (the job key is derived from
            ARGV[4] and the id, so it is not declared: another reason this
            script is for a single Redis, not a cluster)
  ARGV[2]   now in ms, or "" to use the Redis server's TIME (production)
  ARGV[3]   how long a job record lives, ms (>= the longest window)
  ARGV[4]   the job key prefix, "<prefix>job:"
  ARGV[5]   the send lease, ms: how long an admission (or a resumption) owns
            the job's send
  ARGV[6]   R, the number of rule sets; then for each rule set: the number of
            rules r, how long its keys keep admissions (ms: the longest window
            of any rule set of the same scope, since keys are shared across
            purposes), then r pairs (window_ms, max)
  then      for each request: its job id, then its shape: one character per
            scope key, '0' + the 1-based rule set of that key ("12": two keys,
            the first limited by rule set 1, the second by rule set 2)
  returns   {now, then 4 integers per request}:
              1, 0, 0, 0                           admitted, recorded in every scope;
                                                   the caller owns the send
              0, retry_after_ms, scope_i, rule_i   rejected, nothing recorded; 1-based
                                                   indices of the binding rule
              2, admitted_at_ms, 0, 0              duplicate: admitted and sent
              3, admitted_at_ms, lease_left_ms, 0  duplicate: admitted, not sent, and
                                                   another attempt owns the send
              4, admitted_at_ms, 0, 0              duplicate: admitted, its send never
                                                   began, the lease had lapsed and is
                                                   now the caller's: it must send
              5, admitted_at_ms, 0, 0              duplicate: its send began and its
                                                   owner vanished mid-send (lease
                                                   lapsed): delivery unknown, so it is
                                                   not sent again

op "refund" -- remove one job's admission from every scope
  KEYS[1] job key. Returns 1 if there was one, else 0.

op "sending" -- an SMTP transaction for the job begins: "a" becomes "x" and
  the lease is renewed
  KEYS[1] job key; ARGV[2] now or ""; ARGV[3] the send lease, ms.
  Returns 1 if the job was admitted and not sending, else 0.

op "sent" -- record that a job's mail went out (and drop the lease)
  KEYS[1] job key. Returns 1 if the job record exists, else 0.

op "peek" -- read one scope key's log without changing anything
  KEYS[1] the scope key; ARGV[2] now or "". Returns {now, then the admission
  times at or before now, oldest first}.

op "reset" -- forget one scope key's admissions (support staff)
  KEYS[1] the scope key. Returns how many admissions were removed.

op "release" -- give up the send lease of an admitted, unsent job (its send
  failed transiently and will be retried): "x" goes back to "a" and the
  retry need not wait for the lease
  KEYS[1] job key. Returns 1 if the job is admitted and unsent, else 0.
]]

local op = ARGV[1]
-- Locals, not globals, in the hot loop: each global is a table lookup.
local call, tonumber, sub, byte, format = redis.call, tonumber, string.sub, string.byte, string.format

-- Integers as Redis wants them in commands (never "1.7e+12").
local function int(x)
  return format('%.0f', x)
end

-- The admission time a log member starts with: 12 hex digits of ms
-- (parsed with strtoul; a decimal prefix would cost a slow strtod).
local function time_of(member)
  return tonumber(sub(member, 1, 12), 16)
end

-- The decision time: ARGV[2] if given, else the Redis server's clock.
local function clock()
  if ARGV[2] ~= '' then return tonumber(ARGV[2]) end
  local t = call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

if op == 'admit' then
  local now = clock()
  local now_s = int(now)
  local dedup_ms, job_prefix, lease_ms = ARGV[3], ARGV[4], tonumber(ARGV[5])
  local lease_s = int(now + lease_ms)

  -- Rule sets: windows, maxes, the longest window, and how many of a log's
  -- newest entries one read fetches: the largest N, but at least 1 (the
  -- newest entry shows whether any lies after now) and at most 16 (a larger
  -- N costs a second read, but only when the log is that long).
  -- Numbers handed back to redis.call are kept as strings: Lua would
  -- otherwise sprintf every one of them on every call.
  local sets = {}
  local a = 7
  for i = 1, tonumber(ARGV[6]) do
    local n = tonumber(ARGV[a])
    -- fetch is at least 1: the newest entry shows whether any is after now.
    local keep_s = ARGV[a + 1]
    local set = {n = n, w = {}, max = {}, rank = {}, keep = tonumber(keep_s), keep_s = keep_s, fetch = 1}
    for r = 1, n do
      local w_s, m_s = ARGV[a + 2 * r], ARGV[a + 2 * r + 1]
      local w, m = tonumber(w_s), tonumber(m_s)
      set.w[r], set.max[r], set.rank[r] = w, m, '-' .. m_s
      if m > set.fetch then set.fetch = m end
    end
    set.fetch = math.min(set.fetch, 16)
    set.fetch_s = '-' .. set.fetch
    sets[i] = set
    a = a + 2 + 2 * n
  end

  local out, o = {now}, 1
  local k = 0
  while a <= #ARGV do
    local id, shape = ARGV[a], ARGV[a + 1]
    local job, nscopes, first_key = job_prefix .. id, #shape, k + 1
    k = k + nscopes
    a = a + 2

    if call('EXISTS', job) == 1 then
      -- Idempotency: an admitted id is never counted twice, and only one
      -- attempt at a time owns its send.
      local rec = call('HMGET', job, 'at', 'st', 'lease')
      local at, lease = tonumber(rec[1]), tonumber(rec[3]) or 0
      if rec[2] == 's' then
        out[o + 1], out[o + 2], out[o + 3], out[o + 4] = 2, at, 0, 0
      elseif lease > now then
        out[o + 1], out[o + 2], out[o + 3], out[o + 4] = 3, at, lease - now, 0
      elseif rec[2] == 'x' then
        -- Its send began and its owner vanished: the mail may have gone
        -- out. Not resent (never twice); the caller answers it.
        call('HSET', job, 'st', 'u')
        out[o + 1], out[o + 2], out[o + 3], out[o + 4] = 5, at, 0, 0
      elseif rec[2] == 'u' then
        out[o + 1], out[o + 2], out[o + 3], out[o + 4] = 5, at, 0, 0
      else
        call('HSET', job, 'lease', lease_s)
        out[o + 1], out[o + 2], out[o + 3], out[o + 4] = 4, at, 0, 0
      end
    else
      local best_d, best_s, best_r = 0, 0, 0
      for s = 1, nscopes do
        local key, set = KEYS[first_key + s - 1], sets[byte(shape, s) - 48]
        -- The newest entries, oldest of them first. A brand-new key reads
        -- as empty. Reading by rank is cheapest; only if the log holds
        -- entries after now (a clock that stepped back) is it read by score,
        -- and then whole.
        local log = call('ZRANGE', key, set.fetch_s, '-1')
        local len = #log
        local newest = len > 0 and time_of(log[len])
        local by_score = newest and newest > now
        if by_score then
          log = call('ZRANGEBYSCORE', key, '-inf', now_s)
          len = #log
          newest = len > 0 and time_of(log[len])
        end
        for r = 1, set.n do
          local n = set.max[r]
          local i = len - n + 1
          local t_n
          if i == len then
            t_n = newest
          elseif i > 0 then
            t_n = time_of(log[i])
          elseif not by_score and n > set.fetch and len == set.fetch then
            -- A large N and a log at least as long as one read: fetch just
            -- the N-th newest.
            local m = call('ZRANGE', key, set.rank[r], set.rank[r])[1]
            t_n = m and time_of(m)
          end
          -- The rule is full iff d > 0; the largest d binds, the first on a tie.
          if t_n then
            local d = t_n + set.w[r] - now
            if d > best_d then best_d, best_s, best_r = d, s, r end
          end
        end
      end

      if best_d > 0 then
        out[o + 1], out[o + 2], out[o + 3], out[o + 4] = 0, best_d, best_s, best_r
      else
        local member = format('%012x', now) .. ':' .. id
        local fields = {'at', now_s, 'st', 'a', 'lease', lease_s, 'm', member, 'n', nscopes}
        for s = 1, nscopes do
          local key, set = KEYS[first_key + s - 1], sets[byte(shape, s) - 48]
          -- Forget what no rule can see any more, so memory stays bounded.
          call('ZREMRANGEBYSCORE', key, '-inf', int(now - set.keep))
          call('ZADD', key, now_s, member)
          call('PEXPIRE', key, set.keep_s)
          fields[#fields + 1] = 'k' .. s
          fields[#fields + 1] = key
        end
        call('HSET', job, unpack(fields))
        call('PEXPIRE', job, dedup_ms)
        out[o + 1], out[o + 2], out[o + 3], out[o + 4] = 1, 0, 0, 0
      end
    end
    o = o + 4
  end
  return out

elseif op == 'refund' then
  local job = KEYS[1]
  local rec = call('HMGET', job, 'm', 'n')
  local member, n = rec[1], tonumber(rec[2])
  if not n then return 0 end
  for i = 1, n do
    local key = call('HGET', job, 'k' .. i)
    if key then call('ZREM', key, member) end
  end
  call('DEL', job)
  return 1

elseif op == 'sending' then
  local job = KEYS[1]
  if call('HGET', job, 'st') ~= 'a' then return 0 end
  call('HSET', job, 'st', 'x', 'lease', int(clock() + tonumber(ARGV[3])))
  return 1

elseif op == 'sent' then
  local job = KEYS[1]
  if call('EXISTS', job) == 0 then return 0 end
  call('HSET', job, 'st', 's')
  call('HDEL', job, 'lease')
  return 1

elseif op == 'peek' then
  local now = clock()
  local out = {now}
  for _, m in ipairs(call('ZRANGEBYSCORE', KEYS[1], '-inf', int(now))) do
    out[#out + 1] = time_of(m)
  end
  return out

elseif op == 'reset' then
  local n = call('ZCARD', KEYS[1])
  call('DEL', KEYS[1])
  return n

elseif op == 'release' then
  local job = KEYS[1]
  local st = call('HGET', job, 'st')
  if st ~= 'a' and st ~= 'x' then return 0 end
  call('HSET', job, 'st', 'a', 'lease', '0')
  return 1
end

return redis.error_reply('mailgate limiter: unknown op ' .. tostring(op))
