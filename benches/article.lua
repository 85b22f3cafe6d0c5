-- Article 003's rate-limit script as published, except that
-- oldestTimestamp is checked for nil (the published version fails on a
-- key's first request). The benches' yardstick: mailgate's Redis cost is
-- quoted as a ratio to this call's, measured on the same Redis, in the
-- same run.
-- KEYS[1] the mailbox's sorted set; ARGV: limit1 (5 an hour), limit2 (10
-- a day), the day's window start and now, ms.
local key = KEYS[1]
local limit1 = tonumber(ARGV[1])
local limit2 = tonumber(ARGV[2])
local windowStart = tonumber(ARGV[3])
local currentTime = tonumber(ARGV[4])
redis.call('zremrangebyscore', key, '-inf', windowStart)
local currentSize = tonumber(redis.call('zcard', key))
if currentSize >= limit2 then
  return 0
end
local oldestTimestamp = tonumber(redis.call('zrange', key, -1, -1, 'WITHSCORES')[2])
if oldestTimestamp and (currentTime - oldestTimestamp) < 60000 then
  return 0
end
if currentSize < limit1 then
  redis.call('zadd', key, currentTime, currentTime)
  return 1
else
  local hourAgoTimestamp = currentTime - 3600000
  local fifthTimestamp = tonumber(redis.call('zrange', key, currentSize - limit1, currentSize - limit1, 'WITHSCORES')[2])
  if fifthTimestamp < hourAgoTimestamp then
    redis.call('zadd', key, currentTime, currentTime)
    return 1
  else
    return 0
  end
end
