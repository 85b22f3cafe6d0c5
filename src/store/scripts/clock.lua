--[[
mailgate clock watch: once a second from each worker (src/ledger/clock.rs),
is a mark of a lost key standing, and did Redis just lose its canary?
A script of its own, a few dozen lines: every EVALSHA runs its whole
script, and the ledger's (ledger.lua with its modules) cost Redis more than
twice this one's work a second while a worker idled.

KEYS[1] the mark, a string "<until ms> <seen ms> <since ms>" (Redis's
        clock); KEYS[2] the canary; KEYS[3] when the canary was last
        refreshed (ms; kept a year, far longer than any step it must
        outlive). All three share one slot.
ARGV[1] how: '1' if the worker's clock agrees with every primary's (it may
        refresh the canary), else '0'; 'step:<ahead ms>': the worker saw
        Redis's clock run that far ahead of its own boot clock, more than
        the canary's life (a loss, as a canary gone early); 'accept': an
        operator removes the mark and re-arms the canary (mailgate clock
        --accept)
ARGV[2] how long the canary lives, ms; ARGV[3] how long a mark holds, ms

If the canary is gone while its last refresh is less than its life ago,
Redis expired it early: its clock ran ahead by more than the canary's life
since then. A mark is set (or, if one holds longer, kept), and the canary
re-armed. Returns {now, the standing mark's until (0: none), 1 if a loss was
found now}; 'accept' returns {now, 0, 1 if a mark was removed}.

Example: a worker whose clock agrees, canary life 3 595 000 ms (an hour
less redis.max_clock_skew), marks held 90 000 000 ms:
  EVALSHA <sha> 3 mg:{clock}:mark mg:{clock}:canary mg:{clock}:since
    1 3595000 90000000
  -> {1795000000000, 0, 0}
]]
local call, tonumber, format = redis.call, tonumber, string.format

-- The longest keep Redis is asked for (decide.lua's MAX_KEEP_MS: a year
-- and a day, and an hour).
local MAX_KEEP_MS = 31622400000 + 3600000
-- The largest integer a Lua number holds exactly.
local MAX_INT = 9007199254740991

local function int(x)
  return format('%.0f', x)
end

local function fail(why)
  return redis.error_reply('mailgate clock: ' .. why)
end

local how, ahead = ARGV[1], 0
local step_s = string.match(how or '', '^step:(%d+)$')
if step_s then
  how, ahead = 'step', tonumber(step_s)
end
local life, hold = tonumber(ARGV[2]), tonumber(ARGV[3])
if
  #KEYS ~= 3
  or #ARGV ~= 3
  or (how ~= '0' and how ~= '1' and how ~= 'step' and how ~= 'accept')
  or not (life and life >= 1 and life <= MAX_KEEP_MS)
  or not (hold and hold >= 1 and hold <= MAX_KEEP_MS and string.find(ARGV[3], '^[1-9]%d*$'))
then
  return fail('takes 3 keys, whether the clocks agree, a canary life and a hold')
end

local t = call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if how == 'accept' then
  local removed = call('DEL', KEYS[1])
  call('SET', KEYS[2], '1', 'PX', int(life))
  call('SET', KEYS[3], int(now), 'PX', int(MAX_KEEP_MS))
  return { now, 0, removed }
end

local mark = call('GET', KEYS[1])
-- An unreadable mark holds, as long as a mark can (a junk value must not
-- silence the watch).
local until_ms = mark and (tonumber(string.match(mark, '^(%d+) ')) or now + hold)
if until_ms and until_ms > MAX_INT then
  until_ms = MAX_INT
end
local since = tonumber(call('GET', KEYS[3]))
local lost = 0
if how == 'step' or (since and since <= now and now - since < life and call('EXISTS', KEYS[2]) == 0) then
  lost = 1
  -- Held from now by Redis's clock, stepped or not (a mark made while the
  -- clock is ahead holds that much longer once it is back); seen and since
  -- as the worker's boot clock reckons them.
  local seen = now - ahead
  since = math.min(since or seen, seen)
  if not until_ms or until_ms < now + hold then
    until_ms = now + hold
    call('SET', KEYS[1], int(until_ms) .. ' ' .. int(seen) .. ' ' .. int(since), 'PX', int(hold + 3600000))
  end
end
if lost == 1 or how == '1' then
  call('SET', KEYS[2], '1', 'PX', int(life))
  call('SET', KEYS[3], int(now), 'PX', int(MAX_KEEP_MS))
end
if until_ms and until_ms <= now then
  until_ms = nil
end
return { now, until_ms or 0, lost }
