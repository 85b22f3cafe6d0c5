--[[
mailgate limiter: the decision, as Lua functions. This is a library, not a
script: the registry (src/store/scripts/mod.rs) places it, as the body of a
function, in front of each script that decides (ledger.lua, scope.lua), and
binds the table it returns (at the end of this file: its whole API) to
their local `decide`; nothing else of it is visible to them. So the
decision's code lives here once. Requires Redis >= 6 (SET ... KEEPTTL; effects
replication, so TIME may be read before writing). The registry defines
KEEPS_STATE before it: true where this module outlives a call (the ledger's
Redis Function library), so rule sets are built once and kept.

Data: one string per scope key (<prefix>email:<mailbox>, <prefix>ip:<network>,
<prefix>domain:<domain>, and a client network's share of a domain,
<prefix>domain:<domain>:net:<network>), its log of admissions:
  ''                        no admissions (a key that does not exist reads so)
  <count><index>\n<ids>     count: 6 hex digits, how many entries (k);
                            index: their admission times, newest first,
                            12 hex digits of ms each (ties: the one
                            recorded later first); ids: their jobs' ids,
                            oldest first, each followed by \n: the job's
                            id ("<id>:<nonce>" for a reservation,
                            scope.lua), or for an admission that stays
                            counted after its job failed (`keep`) the id
                            with \1 appended (no id holds a control
                            character), which no job's id matches.
Example, two admissions, j1 at 1790000000000 ms (hex 1a0c4506c00) and j2
a second later: "000002" .. "01a0c4506fe8" .. "01a0c4506c00" .. "\nj1\nj2\n".
The n-th newest entry's time sits at a fixed offset, so a reader that
needs the newest few reads a few bytes (GETRANGE 0 <6 + 12n - 1>: the
snapshot, src/ledger/redis/snapshot.rs), and a write is one SET ... PX of
the whole log (no ZADD, trim and PEXPIRE), which costs Redis less than a
sorted set's: the logs stay small (an hour more than the longest window
of admissions). src/ledger/redis/log.rs reads and writes the same form.
A key lives keep_ms (its scope's longest window and an hour) after its
newest admission.

Semantics: docs/contract.md is the normative text (Behaviour: "Rules and
windows", "Scopes"); these functions implement it. A rule (W, N) has room
iff the N-th newest admission of its key (if any) is at or before now - W,
so only the newest few entries of a log are ever read, and a full rule
frees up at that admission's time + W. An admission is forgotten only
keep_ms after it (an hour more than the longest window), so quota is never
freed while Redis's clock is at most an hour behind the newest time it
showed.

Rule sets travel as words of one argument, separated by single spaces
(written by limiter::Keyspace::named_rule_set_args, which sends only the
sets a call's requests name, all as extra sets; `words` splits them, and
`built` keeps what was built from a text where this module outlives a
call):
  R, the number of rule sets; then for each: r, the number of its rules;
  keep_ms, how long its keys keep admissions (the longest window of any rule
  set of the same scope, since keys are shared across purposes, plus an
  hour of slack for a clock that steps); then r
  pairs (window_ms, max), max negative for a shadow rule: judged like the
  others over the same log, it never rejects; the one that would have
  bound is answered beside the decision. Then E, the number of extra sets
  (the overrides' sets a call names), each its 1-based number (after the
  R) and the set. A deny (an override) is a set of one rule (until, 0):
  every request is rejected until the ms `until` (0: for good, answered as
  a wait of MAX_PERIOD_MS); it reads no log and records nothing, so it
  stands beside the key's own set.
A request's "shape" names the rule set of each of its scope keys: two
characters per key, the 1-based rule set in base 64 with '0' as the digit
zero, high digit first ("0102": two keys, the first judged by set 1, the
second by set 2; "1@" is set 64 + 16 = 80). Up to 4095 sets: settings allow
100 purposes, 303 sets.
]]

local call, tonumber, sub, byte, format = redis.call, tonumber, string.sub, string.byte, string.format
local mmin, mmax, floor = math.min, math.max, math.floor

-- The longest window, lease or dedup period accepted, in ms (a year and a
-- day, as settings.rs's MAX_PERIOD): longer ones would overflow an expiry,
-- and are refused before anything is written. A keep (a log's, a job
-- record's) may be an hour longer (limiter::CLOCK_SLACK_MS), so even the longest window keeps its slack.
local MAX_PERIOD_MS = 31622400000
local MAX_KEEP_MS = MAX_PERIOD_MS + 3600000

-- How late after the worker asked for it a call may run (ms), judged by where
-- the worker reckoned Redis's clock would be: a call that waited in a
-- frozen or partitioned Redis longer than this may have been given up on
-- (its worker stopped, its task ended at the shutdown deadline), and a send
-- mark it set would be taken for a send that began ("delivery unknown").
-- It writes nothing; the caller waits without spending an attempt.
local LATE_MS = 2000

-- Integers as Redis wants them in commands (never "1.7e+12"). '%d' casts
-- to Lua's integer format, 64 bits wide in every 64-bit Redis build (the
-- log's '%012x' entries rely on the same), and costs Redis about half
-- what '%.0f' does (2 300 instructions, against 4 800).
local function int(x)
  return format('%d', x)
end

-- A log's layout (the header above): the count's digits, an index
-- entry's, the largest count.
local HEAD, E, MAX_COUNT = 6, 12, 16777215

-- How many entries `log` (a log's text, '' if none) holds.
local function count_of(log)
  if log == '' then return 0 end
  return tonumber(sub(log, 1, HEAD), 16)
end

-- The time of `log`'s i-th newest entry (1 <= i <= its count): 12 hex
-- digits of ms (parsed with strtoul; a decimal prefix would cost a slow
-- strtod).
local function nth(log, i)
  local o = HEAD + (i - 1) * E
  return tonumber(sub(log, o + 1, o + E), 16)
end

-- A log's text: the key's value, '' if it has none; nil if the key holds
-- another type (an earlier build's sorted set, which `mailgate admin
-- migrate` converts): the caller writes nothing of that request (a batch's
-- other items go on, so none is left half done).
local function log_of(key)
  local v = redis.pcall('GET', key)
  if type(v) == 'table' then
    if v.err and string.find(v.err, '^WRONGTYPE') then return nil end
    error(v)
  end
  return v or ''
end

-- The time: ARGV[i] if it is one, else the Redis server's clock. With
-- "~<expected>:<max>" (where the worker reckons Redis's clock should be,
-- and redis.max_clock_skew, ms), nil and a CLOCKSKEW error to return if the
-- server's clock is further than max from it (src/ledger/clock.rs):
-- nothing is decided on a clock that stepped, and the caller waits without
-- spending an attempt; and a STALE error if it is more than LATE_MS ahead
-- of it (the call ran late).
local function clock(i)
  local a = ARGV[i]
  if a ~= '' and sub(a, 1, 1) ~= '~' then return tonumber(a) end
  local t = call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if a == '' then return now end
  local wall, max = string.match(a, '^~(%d+):(%d+)$')
  if not wall then return nil end
  local off = now - tonumber(wall)
  if off > tonumber(max) or -off > tonumber(max) then
    return nil, redis.error_reply(format('CLOCKSKEW the Redis clock is %.0f ms from where the '
      .. 'worker reckons it should be (redis.max_clock_skew %s ms)', off, max))
  end
  if off > LATE_MS then
    return nil, redis.error_reply(format('STALE the call ran %.0f ms after the worker asked for it '
      .. '(a frozen or partitioned Redis, or its clock ahead): nothing was written', off))
  end
  return now
end

-- An index entry: `at` in 12 hex digits. The digits are kept for the
-- next one (a call records its admissions at one time, and formatting
-- costs Redis more than the rest of a write).
local hex_at, hex_s = nil, nil
local function entry_of(at)
  if at ~= hex_at then hex_at, hex_s = at, format('%012x', at) end
  return hex_s
end

-- The words of `text`, an argument that carries many numbers at once (one
-- string costs Redis a fraction of what as many arguments do); nil unless
-- single spaces separate them.
local function words(text)
  local v, n, len = {}, 0, -1
  for w in string.gmatch(text, '[^ ]+') do
    n, len = n + 1, len + 1 + #w
    v[n] = w
  end
  -- One space between each two, none around them.
  if n == 0 or len ~= #text then return nil end
  return v
end

-- Where this module outlives a call (KEEPS_STATE), what `built` built so
-- far, by the text it was built from, and how many; emptied past KEPT_MAX
-- (a settings reload, or overrides come and go, make more).
local kept, kept_n, KEPT_MAX = KEEPS_STATE and {} or nil, 0, 1024

-- build(text): a table, or nil and why. Kept by text where this module
-- outlives a call, so a call whose text was seen before converts none of
-- its numbers (a conversion costs Redis more than most of a decision); a
-- failure is not kept.
local function built(text, build)
  local got = kept and kept[text]
  if got then return got end
  local value, why = build(text)
  if value and kept then
    if kept_n >= KEPT_MAX then kept, kept_n = {}, 0 end
    kept[text], kept_n = value, kept_n + 1
  end
  return value, why
end

-- The rule set at v[a] (the i-th; v: words), built into a table; nil and
-- why if it is malformed. Every check is written as what must hold, so NaN
-- and infinities fail it ("nan" passes a check written as what must not).
-- w[r] and max[r]: rule r's window and max; max < 0 for a shadow rule
-- (judged as -max), 0 for a deny (denies: the set's one rule).
-- top: how many of a log's newest entries can fill one of its rules, at
-- most 16 (what scope.lua looks through for a copy of the job). empty:
-- `room`'s answer for an empty log, worked out when first needed.
local function parse_set(v, a, i)
  local n, keep = tonumber(v[a]), tonumber(v[a + 1])
  if not (n and n >= 0 and n <= 4096 and n == floor(n)
    and keep and keep >= 1 and keep <= MAX_KEEP_MS
    -- Spelled as PEXPIRE takes it (not "6e4" or "60000.0").
    and string.find(v[a + 1], '^[1-9]%d*$')) then
    return nil, 'rule set ' .. i
  end
  local w, max = {}, {}
  local top, denies = 1, false
  for r = 1, n do
    local wr, m = tonumber(v[a + 2 * r]), tonumber(v[a + 2 * r + 1])
    local deny = m == 0 and n == 1
    if not (wr and m and m == floor(m) and m >= -2147483648 and m <= 2147483647
      and ((deny and wr >= 0 and wr <= 9007199254740992)
        or (m ~= 0 and wr >= 1 and wr <= MAX_PERIOD_MS))) then
      return nil, 'rule ' .. r .. ' of set ' .. i
    end
    w[r], max[r], denies = wr, m, deny
    if m < 0 then m = -m end
    if not deny then top = mmax(top, m) end
  end
  return {n = n, w = w, max = max, denies = denies, keep = keep, keep_s = v[a + 1],
    top = mmin(top, 16), empty = false}
end

-- The rule sets starting at v[a] (v: words; a call carries only the sets
-- its requests name), each built. Returns them and the index after them,
-- or nil and why (before anything was written: a malformed set fails the
-- call even if no request names it).
local function rule_sets(v, a)
  local count = tonumber(v[a])
  if not count then return nil, 'rule set count' end
  local sets = {}
  a = a + 1
  local i, extra = 0, nil
  while true do
    if i == count and not extra then
      -- The extra sets: their count, then each one's number and set.
      extra = tonumber(v[a])
      if not extra or extra < 0 then return nil, 'extra rule set count' end
      count, a = count + extra, a + 1
    end
    if i == count then break end
    i = i + 1
    local at = i
    if extra then
      at = tonumber(v[a])
      if not at or at < 1 or at > 4095 or sets[at] then return nil, 'extra rule set ' .. i end
      a = a + 1
    end
    local set, why = parse_set(v, a, i)
    if not set then return nil, why end
    sets[at] = set
    a = a + 2 + 2 * set.n
  end
  return sets, a
end

-- The rule set a shape names for each of its keys (ks[s]: key s's), or nil
-- if it names one that does not exist (every script asks before its first
-- write). `memo` (optional): the shapes resolved before against these same
-- sets (a call's admissions mostly share one).
local function sets_of(shape, sets, memo)
  local ks = memo and memo[shape]
  if ks then return ks end
  if #shape % 2 ~= 0 then return nil end
  ks = {}
  for s = 1, #shape / 2 do
    local hi, lo = byte(shape, 2 * s - 1, 2 * s)
    local set = sets[(hi - 48) * 64 + lo - 48]
    if not set then return nil end
    ks[s] = set
  end
  if memo then memo[shape] = ks end
  return ks
end

-- Judges one request at `now`: its scope keys are KEYS[first ..
-- first + #ks - 1], judged by the sets ks (sets_of). Returns 0 if every
-- enforced rule has room, else the wait, the 1-based scope and the 1-based
-- rule that binds; then the same three for the shadow rules (0 if each has
-- room); nil if a log is of an earlier build's form (log_of). Writes
-- nothing. With a table `logs`, leaves in logs[s] the text of key s's log
-- (for `room` and `record`; a deny's key is not read).
local function judge(first, ks, now, logs)
  local best_d, best_s, best_r = 0, 0, 0
  local sh_d, sh_s, sh_r = 0, 0, 0
  for s = 1, #ks do
    local set = ks[s]
    local w, max = set.w, set.max
    if set.denies then
      -- Rejected while the deny lasts (for good: the longest wait).
      local d = w[1] == 0 and MAX_PERIOD_MS or mmin(w[1] - now, MAX_PERIOD_MS)
      if d > best_d then best_d, best_s, best_r = d, s, 1 end
      if logs then logs[s] = '' end
    else
      local log = log_of(KEYS[first + s - 1])
      if not log then return nil end
      if logs then logs[s] = log end
      -- An empty log (most mailboxes) fills no rule.
      local len = count_of(log)
      for r = 1, len > 0 and set.n or 0 do
        local n = max[r]
        local shadow = n < 0
        if shadow then n = -n end
        -- The rule is full iff its n-th newest entry is in its window (d >
        -- 0); the largest d binds, the first on a tie.
        if n <= len then
          local d = nth(log, n) + w[r] - now
          if shadow then
            if d > sh_d then sh_d, sh_s, sh_r = d, s, r end
          elseif d > best_d then
            best_d, best_s, best_r = d, s, r
          end
        end
      end
    end
  end
  return best_d, best_s, best_r, sh_d, sh_s, sh_r
end

-- What is left of each scope's quota once a request that `judge` admitted
-- at `now` is recorded, from the logs judge read (`logs`). For each scope
-- key, appends to `out` the 1-based enforced rule that allows the fewest
-- further admissions (on a tie the one whose next slot frees last, then
-- the first), how many it allows, and how long until its oldest admission
-- in the window leaves it (the window itself if the request is the
-- oldest); 0 0 0 for a key with no enforced rule. Exact: judge read each
-- log whole. Returns how many keys.
local function room(ks, now, logs, out)
  local o = #out
  for s = 1, #ks do
    local set, log = ks[s], logs[s]
    local len = count_of(log)
    local best_r, best_left, best_reset = 0, 0, 0
    -- An empty log (most mailboxes): the same for every request the set
    -- judges, so worked out once per set.
    local empty = len == 0 and not set.denies
    local known = empty and set.empty
    if known then best_r, best_left, best_reset = known[1], known[2], known[3] end
    -- times[i]: the i-th newest entry's, parsed once per key, not per rule.
    local times = not known and {}
    for r = 1, known and 0 or set.n do
      -- Enforced rules only (a shadow rule's max is negative, a deny's 0).
      local max = set.max[r]
      if max > 0 then
        local w = set.w[r]
        local since = now - w
        -- The entries in the window, newest first.
        local c = 0
        while c < len do
          local t = times[c + 1]
          if not t then
            t = nth(log, c + 1)
            times[c + 1] = t
          end
          if t <= since then break end
          c = c + 1
        end
        local left = max - c - 1
        if left < 0 then left = 0 end
        -- The admission at `now` may be the oldest (entries after `now`:
        -- the clock stepped back).
        local reset = c > 0 and mmin(times[c], now) + w - now or w
        if best_r == 0 or left < best_left or (left == best_left and reset > best_reset) then
          best_r, best_left, best_reset = r, left, reset
        end
      end
    end
    if empty and not known then set.empty = {best_r, best_left, best_reset} end
    out[o + 1], out[o + 2], out[o + 3] = best_r, best_left, best_reset
    o = o + 3
  end
  return #ks
end

-- Where the i-th id of `log` (oldest first; count k) begins: its ids
-- follow the index and the \n after it.
local function ids_at(k)
  return HEAD + k * E + 2
end

-- `log` (count k) with a new entry: time `at`, id `id`, p-th in the index
-- (newest first), its id among the others where that puts it; only the
-- keepn newest of the old entries stay (the others are in no window).
local function with_entry(log, k, keepn, p, at, id)
  -- The ids kept: all but the oldest k - keepn.
  local pos = ids_at(k)
  for _ = 1, k - keepn do pos = string.find(log, '\n', pos, true) + 1 end
  local ids = sub(log, pos)
  if p == 1 then
    ids = ids .. id .. '\n'
  else
    -- The clock stepped back: the entry goes where its time puts it, its
    -- id after the keepn - p + 1 oldest.
    local q = 1
    for _ = 1, keepn - p + 1 do q = string.find(ids, '\n', q, true) + 1 end
    ids = sub(ids, 1, q - 1) .. id .. '\n' .. sub(ids, q)
  end
  local split = HEAD + (p - 1) * E
  return format('%06x', keepn + 1) .. sub(log, HEAD + 1, split) .. entry_of(at)
    .. sub(log, split + 1, HEAD + keepn * E) .. '\n' .. ids
end

-- `log` with an admission of `id` at `now`, and without its entries older
-- than `keep` ms (in no window any more), so memory stays bounded.
local function append(log, keep, now, id)
  -- An empty log (most mailboxes): the entry alone.
  if log == '' then return '000001' .. entry_of(now) .. '\n' .. id .. '\n' end
  local k = count_of(log)
  local keepn = k
  while keepn > 0 and nth(log, keepn) <= now - keep do keepn = keepn - 1 end
  -- A log at its largest count forgets its oldest entry.
  if keepn >= MAX_COUNT then keepn = MAX_COUNT - 1 end
  -- Where the entry goes, newest first: first, unless the clock stepped
  -- back below entries already there.
  local p = 1
  while p <= keepn and nth(log, p) > now do p = p + 1 end
  return with_entry(log, k, keepn, p, now, id)
end

-- Records an admission of `id` at `now` in each scope key of a request;
-- `logs` holds the text judge read of each key. One SET ... PX per key, of
-- the whole log (`append`).
local function record(first, ks, now, id, logs)
  for s = 1, #ks do
    local set = ks[s]
    -- A deny records nothing (its key's own set does).
    if not set.denies then
      call('SET', KEYS[first + s - 1], append(logs[s], set.keep, now, id), 'PX', set.keep_s)
    end
  end
end

-- Calls found(log, k, i, pos, nl) for each entry of `log` (count k) whose
-- id is `id` and, if `at` is given, whose time is `at`: i its place in the
-- index (newest first), its id at log[pos .. nl - 1]; stops at the first
-- call that returns a value, and returns it.
local function each_of(log, k, id, at, found)
  local pos = ids_at(k)
  -- Most logs do not hold the id at all: one search says so.
  if k == 0 or not string.find(log, '\n' .. id .. '\n', pos - 1, true) then return nil end
  for j = 1, k do
    local nl = string.find(log, '\n', pos, true)
    if nl - pos == #id and sub(log, pos, nl - 1) == id then
      local i = k - j + 1
      if not at or nth(log, i) == at then
        local got = found(log, k, i, pos, nl)
        if got ~= nil then return got end
      end
    end
    pos = nl + 1
  end
  return nil
end

-- The time of an entry among the `top` newest of `log` whose id is
-- `id`:<digits> (a reservation of that job: scope.lua), or nil.
local function copy_of(log, id, top)
  local k = count_of(log)
  local mine = '\n' .. id .. ':'
  local from = ids_at(k) - 1
  -- Most logs hold no reservation of the id at all: one search says so.
  if k == 0 or not string.find(log, mine, from, true) then return nil end
  local pos = from + 1
  for j = 1, k do
    local nl = string.find(log, '\n', pos, true)
    local i = k - j + 1
    if i <= top and sub(log, pos, pos + #id) == id .. ':'
      and string.find(sub(log, pos + #id + 1, nl - 1), '^%d+$') then
      return nth(log, i)
    end
    pos = nl + 1
  end
  return nil
end

-- Writes `log` back to `key` with the expiry the key has (taking an entry
-- out changes no keep: KEEPTTL, which no PTTL read before can match: one
-- in a key's last millisecond reads 0, found by review). An empty log is
-- written as '' (never deleted: a key emptied and written again in one
-- call fails on a Redis Cluster slot being migrated, after the call's
-- earlier writes).
local function rewrite(key, log)
  call('SET', key, log, 'KEEPTTL')
end

-- `log` without its i-th entry (index, newest first; its id at
-- pos .. nl), or with that id renamed to `as`.
local function without(log, k, i, pos, nl, as)
  local index = HEAD + (i - 1) * E
  if as then
    return sub(log, 1, pos - 1) .. as .. sub(log, nl)
  elseif k == 1 then
    return ''
  end
  return format('%06x', k - 1) .. sub(log, HEAD + 1, index) .. sub(log, index + E + 1, pos - 1)
    .. sub(log, nl + 1)
end

-- Removes the admission of `id` at `at` (nil: at any time) from the scope
-- keys KEYS[first .. last] (a refund); how many it removed.
local function forget(first, last, at, id)
  local n = 0
  for k = first, last do
    local key = KEYS[k]
    -- A log of an earlier build's form keeps the entry (the quota stays
    -- taken: never more than the rules allow).
    local log = log_of(key) or ''
    -- One entry per key (a job's admissions in a log differ by time).
    local gone = each_of(log, count_of(log), id, at, function(l, c, i, pos, nl)
      return without(l, c, i, pos, nl)
    end)
    if gone then
      rewrite(key, gone)
      n = n + 1
    end
  end
  return n
end

-- A failed job's admission of `id` at `at` (nil: at any time) stays
-- counted in the logs KEYS[first..last] (its requester's), under an id no
-- job's can be: its id with '\1' appended (ids hold no control
-- character). So the job's id admitted again (another message of it) is a
-- new entry, and never taken for a copy of itself being admitted. Run
-- again, it finds the id renamed and changes nothing. How many it found.
local function keep(first, last, at, id)
  local n = 0
  for k = first, last do
    local key = KEYS[k]
    local log = log_of(key) or ''
    local renamed = each_of(log, count_of(log), id, at, function(l, c, i, pos, nl)
      return without(l, c, i, pos, nl, id .. '\1')
    end)
    if renamed then
      rewrite(key, renamed)
      n = n + 1
    end
  end
  return n
end

-- The API: what the scripts composed after this one call, as decide.<name>
-- (a unit test checks that they use exactly these).
return {
  MAX_PERIOD_MS = MAX_PERIOD_MS,
  MAX_KEEP_MS = MAX_KEEP_MS,
  int = int,
  clock = clock,
  count_of = count_of,
  nth = nth,
  log_of = log_of,
  each_of = each_of,
  copy_of = copy_of,
  words = words,
  built = built,
  rule_sets = rule_sets,
  sets_of = sets_of,
  judge = judge,
  room = room,
  append = append,
  record = record,
  forget = forget,
  keep = keep,
}
