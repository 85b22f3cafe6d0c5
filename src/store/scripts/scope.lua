--[[
mailgate scope script: one scope's log on its own, for keys spread over a
Redis Cluster's shards (a key prefix without a hash tag). An admission then
judges each scope, reserves in each, and gives the reservations back if one
rejects (src/ledger/redis/spread.rs); the job's record is ledger.lua's
("look", "create"). Composed after the limiter's decision (decide.lua),
which it calls as decide.<name>. One operation per call; each checks its
argument count and values before it writes.

KEYS[1]  the scope key (its log, as decide.lua describes)
ARGV[1]  the operation: "peek", "reserve" or "unreserve"
ARGV[2]  now in ms, or "" for the Redis server's TIME (production)

"peek" -- judges the scope, writing nothing.
  ARGV[3..]  one rule set, as decide.lua's rule sets: 1, then the set;
             then the job's id
  returns    {now, 1, shadow wait, shadow rule} if it has room (the
             shadow rule that would have rejected it, and its wait; 0 0
             if none), else
             {now, 0, wait, binding rule},
             or {now, 2, t, wait, binding rule} if among the entries that
             fill it is one of the same job, made at t (another copy of it
             may be being admitted: the caller asks the job's record again
             instead of answering a rejection)
"reserve" -- the same, and if it has room records the reservation.
  ARGV[3..]  the rule set, then the job's id, then a nonce
  returns    {now, 1, shadow wait, shadow rule, rule, remaining,
             reset_ms} (recorded at now, as the id id .. ':' .. nonce;
             the last three: what is left of the scope's quota with it,
             decide.lua's `room`), else as "peek"; run again (its reply
             lost), {its time, 1, 0, 0}
"unreserve" -- gives a reservation back.
  ARGV[3]    its time, or "" if it is not known (the reply to its "reserve"
             was lost: the log is looked through for the suffix)
  ARGV[4]    its suffix
  returns    {now, 1} if it was there, else {now, 0}
"keep" -- a failed job's reservation stays counted (in its requester's
  logs), renamed as decide.keep does, so that the job's id reserving again
  is never taken for a copy of itself. Arguments and reply as "unreserve".
]]

local tonumber = tonumber
local op = ARGV[1]

local function fail(why)
  return redis.error_reply('mailgate scope ' .. tostring(op) .. ': ' .. why)
end

-- A log of an earlier build's form: an error the worker takes for an
-- outage (the job waits) until `mailgate admin migrate` converts it.
local function unmigrated()
  return redis.error_reply('UNMIGRATED ' .. KEYS[1] .. ' is a log of an earlier build '
    .. '(a sorted set): run mailgate admin migrate')
end

if #KEYS ~= 1 then return fail('takes 1 key') end
local now, skewed = decide.clock(2)
if skewed then return skewed end
if not now then return fail('bad clock') end

if op == 'unreserve' or op == 'keep' then
  local t, suffix = tonumber(ARGV[3]), ARGV[4]
  if #ARGV ~= 4 or (ARGV[3] ~= '' and (not t or t < 0)) or suffix == '' then
    return fail('takes a time (or "") and a suffix')
  end
  -- With no time (the reply to its "reserve" was lost), the entry of the
  -- suffix at any time: a nonce is drawn per reservation.
  local found
  if op == 'keep' then
    found = decide.keep(1, 1, t, suffix)
  else
    found = decide.forget(1, 1, t, suffix)
  end
  return {now, found > 0 and 1 or 0}
elseif op ~= 'peek' and op ~= 'reserve' then
  return fail('unknown op')
end

local sets, a = decide.rule_sets(ARGV, 3)
if not sets then return fail(a) end
local id, nonce = ARGV[a], ARGV[a + 1]
local values = op == 'reserve' and 2 or 1
local ks = decide.sets_of('01', sets)
if #sets ~= 1 or not ks or #ARGV ~= a - 1 + values or id == ''
  or (values == 2 and nonce == '') then
  return fail('takes one rule set and an id' .. (values == 2 and ' and a nonce' or ''))
end
if op == 'reserve' then
  -- This very call again (a Redis Cluster client sends a call again after
  -- its reply was lost): the nonce is drawn per reservation, so an entry
  -- of the same suffix made in the last minute is this one's.
  local log = decide.log_of(KEYS[1])
  if not log then return unmigrated() end
  local t = decide.each_of(log, decide.count_of(log), id .. ':' .. nonce, nil,
    function(l, _, i) return decide.nth(l, i) end)
  if t and t >= now - 60000 then return {t, 1, 0, 0} end
end
local logs = {}
local d, _, rule, shadow_d, _, shadow = decide.judge(1, ks, now, logs)
if not d then return unmigrated() end
if d > 0 then
  -- The entries that fill it are the newest; is one this job's?
  local t = decide.copy_of(logs[1], id, ks[1].top)
  if t then return {now, 2, t, d, rule} end
  return {now, 0, d, rule}
end
if op == 'reserve' then
  local out = {now, 1, shadow_d, shadow}
  decide.room(ks, now, logs, out)
  decide.record(1, ks, now, id .. ':' .. nonce, logs)
  return out
end
return {now, 1, shadow_d, shadow}
