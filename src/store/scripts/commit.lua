--[[
mailgate ledger: op "commit" -- admissions the worker decided itself, from
one snapshot of their facts (src/ledger/redis/snapshot.rs: no record of the
id, no suppression, room in every scope), written only if none of those
facts changed since (compare-and-set). A module, composed before ledger.lua
as `commit` (src/store/scripts/mod.rs), whose `main` ledger.lua runs for
ARGV[1] "commit". It decides nothing: a fact that changed answers
`changed`, and the worker asks the ledger's "admit" (ledger.lua), which
decides again.

Why it is exact: the snapshot found room at its instant `seen` in logs
whose newest entries it read; on a log that nobody wrote since, room only
grows with time, so the decision holds at any later instant. So each log
must still begin with the bytes the snapshot read (its count and newest
times), and the call's clock must not be before `seen` (a clock that
stepped back). The record must still be absent, and no suppression key may
exist. The admission is stamped with the call's own clock, as "admit"
stamps its own. Redis commands cost more than the Lua around them, so the
checks are few: one EXISTS of the record, the suppression keys and every
log the snapshot found empty (nearly every admission's logs: a new
mailbox, a new network), then a GET of each other log; only where EXISTS
finds something are those keys read one by one (a log a refund emptied
is '', and a suppression key of an earlier version may hold a bounce
that suppresses nothing).

ARGV[2]  the clock, as "batch"'s ARGV[2] ("~<expected>:<max>", "", or ms)
ARGV[3]  keep_ms of a record; ARGV[4] lease_ms (as "batch"'s settings)
ARGV[5]  the keeps (ms) of the logs the items name, as words; an item names
         each of its logs' keep by its place here, one letter, 'A' the 1st
then     the items, each 6 values and one more per log not found empty:
           id, fingerprint,
           owner "<ticket>|<attempt>|<call id>" (the record's own, n and
             c, none holding '|'; the record is x: every admission sends
             at once),
           expires_at ms ('' never), seen (ms: the snapshot's instant),
           shape: S (how many suppression keys: a digit), E (how many logs
             the snapshot found empty: a digit), then each log's keep, one
             letter;
           then for each log not found empty: the head the snapshot read
             (its count in 6 hex digits and its newest times, 12 hex digits
             each, as many as it read: decide.lua's header)
KEYS     for each item: its record, its S suppression keys, its E logs found
         empty, then its other logs
returns  {now, then per item its code (ledger.lua's CODE) and one value}:
           admitted, at  -- written; at: its admission time (now, or this
                            very call's, run again after its reply was lost)
           changed, 0    -- a fact changed: nothing written
           expired, 0    -- expires_at passed: nothing written
           unmigrated, 0 -- a log this build cannot read (an earlier build's
                            form, or damaged): nothing written
Every item is checked before the first write, so a bad call writes nothing;
an item's keys are all read before its writes.
Example (one job for a@x.com from 10.0.0.20, prefix p:,
its mailbox's log empty and its network's holding one admission):
  FCALL mailgate_ledger_<hash> 5 p:job:j1 p:bounced:a@x.com p:sup:a@x.com
    p:email:a@x.com p:ip:10.0.0.20/32
    commit ~1796284241996:10000 90000000 30000 "90000000 7200000"
    j1 <fingerprint> "<ticket>|1:3dfc|f448" "" 1796284241990 21AB
    000001019a2c3d4e5f6a
]]
local call, tonumber, sub, find, byte = redis.call, tonumber, string.sub, string.find, string.byte
local A, X = records.A, records.X

-- The keeps of ARGV[5], each {ms, as commands take it}; nil if one is not
-- a keep Redis takes.
local function keeps_of(text)
  -- (No log at all: every scope allowed by an override, or rule-less.)
  if text == '' then return {} end
  local words = decide.words(text)
  if not words then return nil end
  local keeps = {}
  for i, w in ipairs(words) do
    local n = tonumber(w)
    if not (find(w, '^[1-9]%d*$') and n <= decide.MAX_KEEP_MS) then return nil end
    keeps[i] = {n, w}
  end
  return keeps
end

-- Whether the item at ARGV[a] is well formed (nkeeps: how many keeps the
-- call carries): its S, E and L (how many logs), else nil. Only what the
-- writes hold is checked: a head is only compared.
local function item_ok(a, nkeeps)
  local id, shape = ARGV[a], ARGV[a + 5]
  if not (shape and id ~= '' and not find(id, '\n', 1, true) and ARGV[a + 1] ~= ''
    and find(ARGV[a + 2], '^[^|]+|[^|]+|[^|]+$')
    and (ARGV[a + 3] == '' or tonumber(ARGV[a + 3]))) then
    return nil
  end
  local S, E, L = (byte(shape, 1) or 0) - 48, (byte(shape, 2) or 0) - 48, #shape - 2
  if not (S >= 0 and S <= 9 and E >= 0 and E <= L) then return nil end
  for i = 3, #shape do
    local keep = byte(shape, i) - 64
    if keep < 1 or keep > nkeeps then return nil end
  end
  return S, E, L
end

-- Whether the call's instant (b.now, b.now_s) is not before the
-- snapshot's `seen` (ms; decimal digits compare as text when as long).
local function not_before(b, seen)
  if #seen == #b.now_s then return seen <= b.now_s end
  local ms = tonumber(seen)
  return ms ~= nil and ms <= b.now
end

-- Whether something EXISTS found among the keys of the item at ARGV[a]
-- (KEYS from k) still lets it be admitted as decided: no record (nil and
-- the code to answer if there is one: this very call again, run after its
-- reply was lost, stands as it was made), no suppression as the script
-- reads one (`suppressed`: an earlier version's bounce value suppresses
-- nothing), and each log found empty still empty (a refund leaves a log
-- it emptied as '').
local function nothing_found(k, a, S, E, CODE, suppressed)
  local st, _, _, _, _, _, c, tail = records.load(KEYS[k])
  if st then
    if (st == A or st == X) and c == string.match(ARGV[a + 2], '([^|]*)$')
      and string.match(tail, '^[^|]*|[^|]*|(.*)$') == ARGV[a + 1] then
      return false, CODE.admitted, records.at_of(tail)
    end
    return false, CODE.changed, 0
  end
  if suppressed(k + 1, S) then return false, CODE.changed, 0 end
  for i = 1, E do
    local log = decide.log_of(KEYS[k + S + i])
    if not log then return false, CODE.unmigrated, 0 end
    if log ~= '' then return false, CODE.changed, 0 end
  end
  return true
end

-- The item at ARGV[a], its keys from KEYS[k] (its shape's S, E, L): its
-- code and value. Every key is read, and every log's new text made,
-- before the first write.
local function commit_one(k, a, b, S, E, L, CODE, suppressed)
  local key, id, owner = KEYS[k], ARGV[a], ARGV[a + 2]
  local now = b.now
  -- Nothing a new admission must not find: no record, no suppression, and
  -- the logs found empty still empty (one EXISTS, most often 0).
  if call('EXISTS', unpack(KEYS, k, k + S + E)) > 0 then
    -- (A key this build cannot read, a hash under a suppression key or a
    -- record that is not one, fails this item alone: nothing written.)
    local read, fine, code, v = pcall(nothing_found, k, a, S, E, CODE, suppressed)
    if not read then return CODE.unmigrated, 0 end
    if not fine then return code, v end
  end
  if ARGV[a + 3] ~= '' and tonumber(ARGV[a + 3]) <= now then return CODE.expired, 0 end
  if not not_before(b, ARGV[a + 4]) then return CODE.changed, 0 end
  local logs = {}
  for i = 1, L - E do
    local log = decide.log_of(KEYS[k + S + E + i])
    if not log then return CODE.unmigrated, 0 end
    local head = ARGV[a + 5 + i]
    if sub(log, 1, #head) ~= head then return CODE.changed, 0 end
    logs[E + i] = log
  end
  -- Each log's new text, before any write: a log damaged past its head
  -- fails here, this item alone, as one this build cannot read.
  local shape = ARGV[a + 5]
  for i = 1, L do
    local ok, text = pcall(decide.append, logs[i] or '', b.keeps[byte(shape, i + 2) - 64][1], now, id)
    if not ok then return CODE.unmigrated, 0 end
    logs[i] = text
  end
  -- Every key read: now the writes. The record as records.lua writes it:
  -- <st>0-|<lease>|<own>|<n>|<c>|<at>||<fp>.
  call('SET', key, 'x0-|' .. b.lease_s .. '|' .. owner .. '|'
    .. b.now_s .. '||' .. ARGV[a + 1], 'PX', b.keep_s)
  for i = 1, L do
    call('SET', KEYS[k + S + i], logs[i], 'PX', b.keeps[byte(shape, i + 2) - 64][2])
  end
  return CODE.admitted, now
end

-- Runs the call (ARGV[1] "commit"); CODE: ledger.lua's codes, fail(why)
-- its error reply, suppressed(k, n) its reading of n suppression keys
-- from KEYS[k].
local function main(CODE, fail, suppressed)
  local now, skewed = decide.clock(2)
  if skewed then return skewed end
  if not now then return fail('bad clock') end
  local keep, lease = ARGV[3], tonumber(ARGV[4])
  local keeps = decide.built(ARGV[5] or '', keeps_of)
  if not (keep and find(keep, '^[1-9]%d*$') and tonumber(keep) <= decide.MAX_KEEP_MS
    and lease and lease >= 1 and lease <= decide.MAX_PERIOD_MS and keeps) then
    return fail('bad keep, lease or keeps')
  end
  -- Every item is checked before the first write.
  local items, a, k = {}, 6, 1
  while a <= #ARGV do
    local S, E, L = item_ok(a, #keeps)
    if not S or a + 5 + L - E > #ARGV then return fail('item ' .. (#items + 1) .. ' is malformed') end
    items[#items + 1] = {a, k, S, E, L}
    a, k = a + 6 + L - E, k + 1 + S + L
  end
  if k - 1 ~= #KEYS then return fail(#KEYS .. ' keys for ' .. (k - 1) .. ' named') end
  local b = {now = now, now_s = decide.int(now), lease_s = decide.int(now + lease), keep_s = keep,
    keeps = keeps}
  local out = {now}
  for i, it in ipairs(items) do
    out[2 * i], out[2 * i + 1] = commit_one(it[2], it[1], b, it[3], it[4], it[5], CODE, suppressed)
  end
  return out
end

return {main = main}
