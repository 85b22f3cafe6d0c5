--[[
mailgate migrate: converts one key that an earlier build wrote into this
build's form, in one step (`mailgate admin migrate`, with the workers
stopped). Builds before 2026-12-03 kept each scope log (decide.lua) as a
sorted set: score the admission ms, member "<12 hex digits of ms>:<id>"
(a failure's kept entry with \1 appended). This build reads only the log
string decide.lua describes, and fails a call that meets a sorted set
before it writes.

KEYS[1] a scope key
ARGV[1] "look": say whether it would be converted; "convert": convert it
returns 1 if it holds a sorted set (converted, on "convert": the same
entries as a log string, with the key's expiry), 0 if not (a log string
already, or nothing)

Example: a mailbox's log of two admissions, j1 at 1790000000000 ms and j2
a second later:
  EVALSHA <sha> 1 p:email:a@example.com convert
  -> 1, and p:email:a@example.com holds
     "000002" .. "01a0c4506fe8" .. "01a0c4506c00" .. "\nj1\nj2\n"
]]
local call = redis.call

local how = ARGV[1]
if #KEYS ~= 1 or #ARGV ~= 1 or (how ~= 'look' and how ~= 'convert') then
  return redis.error_reply('mailgate migrate: takes 1 key and "look" or "convert"')
end
local key = KEYS[1]
if call('TYPE', key).ok ~= 'zset' then return 0 end
if how == 'look' then return 1 end

-- Oldest first (by score, then member): the ids in that order, the
-- index the other way round. A member's first 12 characters are its time
-- as the index writes it.
local members = call('ZRANGE', key, 0, -1)
local index, ids = {}, {}
for i, m in ipairs(members) do
  if not string.find(m, '^%x%x%x%x%x%x%x%x%x%x%x%x:') or string.find(m, '\n', 1, true) then
    return redis.error_reply('mailgate migrate: ' .. key .. ' holds a member that is no admission')
  end
  index[#members - i + 1] = string.sub(m, 1, 12)
  ids[i] = string.sub(m, 14) .. '\n'
end
local text = ''
if #members > 0 then
  text = string.format('%06x', #members) .. table.concat(index) .. '\n' .. table.concat(ids)
end
-- One SET replaces the sorted set, keeping its expiry: the key is never
-- absent.
call('SET', key, text, 'KEEPTTL')
return 1
