--[[
mailgate overrides prune: drops the overrides whose expiry passed,
atomically (an `add` that read them first and deleted them after could
delete one re-added in between). The hash's layout is described in
src/store/overrides.rs; '~version' is its version field (VERSION there).

KEYS[1]  the overrides' hash
ARGV[1]  now, ms
ARGV[2]  a new version, set if it dropped any
returns  how many it dropped
]]
if #KEYS ~= 1 or #ARGV ~= 2 or not tonumber(ARGV[1]) or ARGV[2] == '' then
  return redis.error_reply('mailgate overrides prune: takes 1 key, a time and a version')
end
local now, all, n = tonumber(ARGV[1]), redis.call('HGETALL', KEYS[1]), 0
for i = 1, #all, 2 do
  local ok, o = pcall(cjson.decode, all[i + 1])
  if all[i] ~= '~version' and ok and type(o) == 'table'
    and type(o.expires_at_ms) == 'number' and o.expires_at_ms <= now then
    redis.call('HDEL', KEYS[1], all[i])
    n = n + 1
  end
end
if n > 0 then redis.call('HSET', KEYS[1], '~version', ARGV[2]) end
return n
