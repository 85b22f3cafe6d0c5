--[[
mailgate job records: how the ledger (ledger.lua) reads and writes
<prefix>job:<id>. A module, composed before ledger.lua as `records` (see
src/store/scripts/mod.rs); ledger.lua's header says what each field means.
A record is one string, written whole with its expiry by one SET:
  <st><ans><fin>|<lease>|<own>|<n>|<c>|<at>|<rv>|<fp>
the fields a job's life changes first, then those fixed at admission (at,
rv, fp: kept as one tail); only fp may hold '|' (the items' checks refuse
it in a ticket). One string costs Redis half what a hash of its ten fields
does, to read and to write.
Builds before 2026-12-03 could write a record as a hash of those fields
(redis.record_form = "hash", their default): `load` reads one, and `store`
replaces it with a string at the record's next write. No build writes
hashes any more, so none is left once this one has run `dedup_for` and an
hour (the record's keep); FAULTS.md says when the reading can go.
]]

local call, tonumber, sub, byte = redis.call, tonumber, string.sub, string.byte

-- A record's states and answered flag as `load` reads them (bytes).
local A, X, S, U, R, YES = string.byte('axsur1', 1, 6)
-- The fields after the first three: lease, own, n, c, and where the tail
-- (at, rv, fp: fixed at admission) begins.
local RECORD = '^...|([^|]*)|([^|]*)|([^|]*)|([^|]*)|()'

-- A record of an earlier build, a hash (see above), as `load` returns
-- one, or nil if the key holds nothing.
local function from_hash(key)
  local h = call('HMGET', key, 'st', 'ans', 'fin', 'lease', 'own', 'n', 'c', 'at', 'rv', 'fp')
  if not h[1] then return nil end
  local st, ans, fin = byte(h[1] .. (h[2] or '0') .. (h[3] or '-'), 1, 3)
  return st, ans, fin, h[4] or '0', h[5] or '', h[6] or '', h[7] or '',
    (h[8] or '0') .. '|' .. (h[9] or '') .. '|' .. (h[10] or '')
end

-- The record at `key`, or nil if it has none: st, ans, fin (bytes), lease,
-- own, n, c (strings), and the tail "<at>|<rv>|<fp>".
local function load(key)
  local r = redis.pcall('GET', key)
  if not r then
    return nil
  elseif type(r) == 'string' then
    local st, ans, fin = byte(r, 1, 3)
    local lease, own, n, c, rest = string.match(r, RECORD)
    return st, ans, fin, lease, own, n, c, sub(r, rest)
  elseif string.find(r.err or '', 'WRONGTYPE', 1, true) then
    return from_hash(key)
  end
  error(r)
end

-- A tail's admission time (ms; 0 if a record lacks it, so no reply holds
-- a nil among its values).
local function at_of(tail)
  return tonumber(string.match(tail, '^%d*')) or 0
end

-- A tail's reservations (rv), or nil if it has none.
local function rv_of(tail)
  local rv = string.match(tail, '^%d*|([^|]*)')
  return rv ~= '' and rv or nil
end

-- Writes the record at `key`, whole, by one SET, to live b.keep_s ms: st,
-- ans, fin as characters, the rest as `load` reads them. It replaces a
-- hash of an earlier build too, with no DEL first: on a Redis Cluster
-- slot being migrated, a key the node no longer holds is refused, so a
-- write after a DEL would fail, and the call (which Lua does not roll
-- back) would leave the job without its record. No write here leaves the
-- key absent, even for a moment.
local function store(key, b, st, ans, fin, lease, own, n, c, tail)
  call('SET', key, st .. ans .. fin .. '|' .. lease .. '|' .. own .. '|' .. n .. '|' .. c
    .. '|' .. tail, 'PX', b.keep_s)
end

-- Whether a ticket can be written into a record (no '|'): checked where an
-- item may write its own (admit, settle); the others write the record's.
local function ticket_ok(t)
  return t ~= nil and t ~= '' and not string.find(t, '|', 1, true)
end

-- The API: what ledger.lua uses, as records.<name> (a unit test checks
-- that it uses exactly these).
return {
  A = A, X = X, S = S, U = U, R = R, YES = YES,
  load = load,
  store = store,
  at_of = at_of,
  rv_of = rv_of,
  ticket_ok = ticket_ok,
}
