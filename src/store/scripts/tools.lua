--[[
mailgate tools: questions about one key, each answered in one step on the
key's own server (its shard, on a cluster): reading and clearing one scope
key's log, for support staff (`mailgate limits show|reset`; the log's
layout is decide.lua's), and whether a job has a record, for a worker
dead-lettering it.

op "peek" -- read one scope key's log without changing anything
  KEYS[1] the scope key. ARGV[2] now in ms, or "" for the Redis server's TIME.
  returns {now, then the admission times, oldest first (those after now,
  from before Redis's clock stepped back, included: they count)}

op "reset" -- forget one scope key's admissions
  KEYS[1] the scope key. returns how many admissions were removed

op "unrecorded" -- whether a job has no record, and when that was seen
  KEYS[1] the job's record key. returns the Redis server's TIME in ms if
  the key does not exist, else -1

op "hold" -- keeps a job's record, if it has one, at least ARGV[2] ms more
  (a replay's job must be decided by the record that let it be replayed)
  KEYS[1] the job's record key. returns 1 if the record exists, else 0
]]
local op = ARGV[1]
if #KEYS ~= 1 then
  return redis.error_reply('mailgate tools: takes exactly 1 key')
end

if op == 'peek' and #ARGV == 2 then
  local now
  if ARGV[2] ~= '' then
    now = tonumber(ARGV[2])
    if not now then return redis.error_reply('mailgate limiter tools peek: bad clock') end
  else
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  -- The log's index holds the times newest first (decide.lua).
  local log = redis.call('GET', KEYS[1]) or ''
  local k = log == '' and 0 or tonumber(string.sub(log, 1, 6), 16)
  local out = {now}
  for i = k, 1, -1 do
    out[#out + 1] = tonumber(string.sub(log, 7 + (i - 1) * 12, 6 + i * 12), 16)
  end
  return out
elseif op == 'unrecorded' and #ARGV == 1 then
  if redis.call('EXISTS', KEYS[1]) == 1 then return -1 end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
elseif op == 'hold' and #ARGV == 2 then
  local ms = tonumber(ARGV[2])
  if not ms or ms < 1 or not string.find(ARGV[2], '^%d+$') then
    return redis.error_reply('mailgate tools hold: bad period')
  end
  local left = redis.call('PTTL', KEYS[1])
  if left == -2 then return 0 end
  if left >= 0 and left < ms then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
  return 1
elseif op == 'reset' and #ARGV == 1 then
  local log = redis.call('GET', KEYS[1]) or ''
  redis.call('DEL', KEYS[1])
  return log == '' and 0 or tonumber(string.sub(log, 1, 6), 16)
end
return redis.error_reply('mailgate tools: unknown op or wrong argument count')
