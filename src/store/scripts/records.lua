--[[
mailgate job records: how the ledger (ledger.lua) reads and writes
<prefix>job:<id>. A module, composed before ledger.lua as `records` (see
src/store/scripts/mod.rs); ledger.lua's header says what each field means.
Two forms, chosen by the batch's settings (redis.record_form):
  hash    the fields by name; what every version reads, and the default
  string  the fields in this order (RECORD below), written whole with
          the record's expiry by one SET:
            <st><ans><fin>|<lease>|<own>|<n>|<c>|<at>|<rv>|<fp>
          the fields a job's life changes first, then those fixed at
          admission (at, rv, fp: kept as one tail); only fp may hold '|'
          (the items' checks refuse it in a ticket). One string costs
          Redis half what a hash of ten fields does, to read and to write;
          versions before it cannot read one (their batch fails, after
          writing what its earlier items wrote), so it is for a
          deployment whose every worker runs this version or a later one.
`load` reads either form; `store` writes a new record, or a hash, in the
batch's form (a hash met by a batch of strings is rewritten whole), and a
string as a string whatever the batch's form (see `store`).
]]

local call, tonumber, sub, byte = redis.call, tonumber, string.sub, string.byte

-- A record's states and answered flag as `load` reads them (bytes).
local A, X, S, U, R, YES = string.byte('axsur1', 1, 6)
-- The fields after the first three: lease, own, n, c, and where the tail
-- (at, rv, fp: fixed at admission) begins.
local RECORD = '^...|([^|]*)|([^|]*)|([^|]*)|([^|]*)|()'

-- Raises the error Redis answered a read with (`r`), unless it is
-- WRONGTYPE: the key holds the record in the other form.
local function other_form(r)
  if not string.find(r.err or '', 'WRONGTYPE', 1, true) then error(r) end
end

-- Reads the record at `key` as a hash (pcall's answer: its fields, or an
-- error); `tail`: with the fields fixed at admission (at, rv, fp).
local function read_hash(key, tail)
  if tail then
    return redis.pcall('HMGET', key, 'st', 'ans', 'fin', 'lease', 'own', 'n', 'c', 'at', 'rv', 'fp')
  end
  return redis.pcall('HMGET', key, 'st', 'ans', 'fin', 'lease', 'own', 'n', 'c')
end

-- A hash's fields (read_hash's answer) as `load` returns them, or nil.
local function from_hash(h, tail)
  if not h[1] then return nil end
  local st, ans, fin = byte(h[1] .. (h[2] or '0') .. (h[3] or '-'), 1, 3)
  return st, ans, fin, h[4] or '0', h[5] or '', h[6] or '', h[7] or '',
    tail and (h[8] or '0') .. '|' .. (h[9] or '') .. '|' .. (h[10] or ''), false
end

-- The record at `key`, or nil if it has none: st, ans, fin (bytes), lease,
-- own, n, c (strings), the tail "<at>|<rv>|<fp>" (read from a hash only
-- with `tail`: a mark that writes a hash needs none of it), and whether it
-- is held as a string. Either form is read; `strings` says which to try
-- first (the one this batch writes). `new`: the key is likely not there
-- (an admission's: most ids are new, and EXISTS costs Redis less than
-- reading the fields).
local function load(key, strings, tail, new)
  if not strings then
    if new and call('EXISTS', key) == 0 then return nil end
    local h = read_hash(key, tail)
    if not h.err then return from_hash(h, tail) end
    other_form(h)
  end
  local r = redis.pcall('GET', key)
  if not r then
    return nil
  elseif type(r) == 'string' then
    local st, ans, fin = byte(r, 1, 3)
    local lease, own, n, c, rest = string.match(r, RECORD)
    return st, ans, fin, lease, own, n, c, sub(r, rest), true
  end
  other_form(r)
  -- A hash met by a batch that writes strings: rewritten whole, tail and all.
  local h = read_hash(key, true)
  if h.err then error(h) end
  return from_hash(h, true)
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

-- Writes the record at `key`, to live b.keep_s ms: st, ans, fin as
-- characters, the rest as `load` reads them. `as`: whether the key holds
-- it as a string now. A string is written whole, by one SET, where the
-- batch writes strings (b.strings; a hash is replaced) or the key holds
-- one; else a hash, the fields a life changes.
-- A string is never turned into a hash: that would take a DEL, and on a
-- Redis Cluster slot being migrated a key the node no longer holds is
-- refused, so the HSET after it would fail, and the call (which Lua does
-- not roll back) would leave the job without its record. No write here
-- leaves the key absent, even for a moment.
local function store(key, b, as, st, ans, fin, lease, own, n, c, tail)
  if b.strings or as then
    call('SET', key, st .. ans .. fin .. '|' .. lease .. '|' .. own .. '|' .. n .. '|' .. c
      .. '|' .. tail, 'PX', b.keep_s)
    return
  end
  call('HSET', key, 'st', st, 'ans', ans, 'lease', lease, 'own', own, 'n', n, 'c', c)
  if fin ~= '-' then call('HSET', key, 'fin', fin) end
  call('PEXPIRE', key, b.keep_s)
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
