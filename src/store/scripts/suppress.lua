--[[
mailgate suppression list: a bounce's suppression of one address as it was
spelled to the relay, set only where it shortens no suppression of it in
force, in one step (another worker's bounce, or one of an earlier version's
that someone made, between a read and a write would otherwise be replaced).

op "run" -- a bounce joins its domain's run: the different addresses of
  the domain that bounced lately, every worker's.
  KEYS[1] the run, <prefix>bounceruns:<domain> (a sorted set: addresses
  scored by when they last bounced, ms).
  ARGV[2] now, ms; ARGV[3] the window, ms (at least 1); ARGV[4] the
  address, as sent.
  Adds (or moves) the address to now, drops those older than the window,
  keeps the run the window; returns the run's addresses.

op "bounce"
  KEYS[1] the address's bounce key, <prefix>bounced:<address>.
  ARGV[2] the value, "<since_ms> bounce <why>"; ARGV[3] how long it lasts,
  ms (at least 1).
  A suppression in force stands if someone made it (its source, the value's
  second word, is not "bounce"), if it lasts until removed, or if it lasts
  at least as long; else the key is set to the value for ARGV[3] ms.
  returns 1 if it set the key, 0 if the one in force stands.
]]
if ARGV[1] == 'run' and #KEYS == 1 and #ARGV == 4 then
  local now, window = tonumber(ARGV[2]), tonumber(ARGV[3])
  if not now or not window or window < 1 or not string.find(ARGV[2] .. ARGV[3], '^%d+$') then
    return redis.error_reply('mailgate suppression run: bad time')
  end
  redis.call('ZADD', KEYS[1], now, ARGV[4])
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. string.format('%d', now - window))
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return redis.call('ZRANGE', KEYS[1], 0, -1)
end
if ARGV[1] ~= 'bounce' or #KEYS ~= 1 or #ARGV ~= 3 then
  return redis.error_reply('mailgate suppression: takes op "run" (1 key, 3 arguments) or "bounce" (1 key, 2 arguments)')
end
local period = tonumber(ARGV[3])
if not period or period < 1 or not string.find(ARGV[3], '^%d+$') then
  return redis.error_reply('mailgate suppression bounce: bad period')
end
local held = redis.call('GET', KEYS[1])
if held then
  local source = string.match(held, '^%d+ (%S+)')
  local left = redis.call('PTTL', KEYS[1])
  if source ~= 'bounce' or left < 0 or left >= period then return 0 end
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
