--[[
mailgate limiter: the decision, as Lua functions. This is a library, not a
script: the registry (src/store/scripts/mod.rs) places it, as the body of a
function, in front of each script that decides (ledger.lua, scope.lua), and
binds the table it returns (at the end of this file: its whole API) to
their local `decide`; nothing else of it is visible to them. So the
decision's code lives here once. Requires Redis >= 5 (effects
replication, so TIME may be read before writing). The registry defines
KEEPS_STATE before it: true where this module outlives a call (the ledger's
Redis Function library), so rule sets are built once and kept.

Data: one sorted set per scope key (<prefix>email:<mailbox>,
<prefix>ip:<network>, <prefix>domain:<domain>, and a client network's share
of a domain, <prefix>domain:<domain>:net:<network>): score = admission ms, member =
"<admission ms, 12 hex digits>:<job id>". Members are unique per job, never
bare timestamps, so two jobs in the same millisecond both count; the time is
repeated in the member so reads need no WITHSCORES (formatting scores costs
Redis more than the rest of a decision). A key lives keep_ms (its scope's
longest window and an hour) after its newest admission.

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
local huge, mmin, mmax, floor = math.huge, math.min, math.max, math.floor

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

-- Integers as Redis wants them in commands (never "1.7e+12").
local function int(x)
  return format('%.0f', x)
end

-- '-n' for a read of the newest n entries (n <= 16), as constants: Lua
-- formats a number with sprintf, which costs Redis more than the read.
local NEWEST = {'-1', '-2', '-3', '-4', '-5', '-6', '-7', '-8', '-9', '-10', '-11', '-12', '-13',
  '-14', '-15', '-16'}

-- The admission time a log member starts with: 12 hex digits of ms
-- (parsed with strtoul; a decimal prefix would cost a slow strtod).
local function time_of(member)
  return tonumber(sub(member, 1, 12), 16)
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

-- A job's member in the scope logs. The time's digits are kept for the
-- next member (a call records its admissions at one time, and formatting
-- costs Redis more than the rest of a member).
local hex_at, hex_s = nil, nil
local function member_of(at, id)
  if at ~= hex_at then hex_at, hex_s = at, format('%012x', at) end
  return hex_s .. ':' .. id
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
-- rank[r]: '-max' of a rule with max > 16, made when first read.
-- fetch: how many of a log's newest entries one read gets: the largest N,
-- at most 16; 0 if every N is larger. A rule with a larger N reads its
-- N-th newest entry on its own, only when the log is at least as long as
-- that first read (so a domain's 50 per 10 minutes costs one read, not a
-- read of 16 and then one more). empty: `room`'s answer for an empty log,
-- worked out when first needed.
local function parse_set(v, a, i)
  local n, keep = tonumber(v[a]), tonumber(v[a + 1])
  if not (n and n >= 0 and n <= 4096 and n == floor(n)
    and keep and keep >= 1 and keep <= MAX_KEEP_MS
    -- Spelled as PEXPIRE takes it (not "6e4" or "60000.0").
    and string.find(v[a + 1], '^[1-9]%d*$')) then
    return nil, 'rule set ' .. i
  end
  local w, max = {}, {}
  local top, least, denies = 1, huge, false
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
    if not deny then top, least = mmax(top, m), mmin(least, m) end
  end
  local fetch = least > 16 and 0 or mmin(top, 16)
  -- top_s: the newest entries that can fill a rule, up to 16 (what
  -- scope.lua looks through for a copy of the job).
  return {n = n, w = w, max = max, rank = false, denies = denies, keep = keep,
    keep_s = v[a + 1], fetch = fetch, fetch_s = NEWEST[fetch], top_s = NEWEST[mmin(top, 16)],
    empty = false}
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
-- room). Writes nothing. With a table `logs`, leaves in logs[s] what it
-- read of key s (for `room`).
local function judge(first, ks, now, logs)
  local best_d, best_s, best_r = 0, 0, 0
  local sh_d, sh_s, sh_r = 0, 0, 0
  for s = 1, #ks do
    local key, set = KEYS[first + s - 1], ks[s]
    -- The newest entries, oldest of them first; a brand-new key reads as
    -- empty.
    local log = set.fetch > 0 and call('ZRANGE', key, set.fetch_s, '-1') or {}
    local len = #log
    if logs then logs[s] = log end
    local newest = len > 0 and time_of(log[len])
    local w, max = set.w, set.max
    -- A log read whole and empty (most mailboxes) fills no rule.
    for r = 1, (len > 0 or set.fetch == 0) and set.n or 0 do
      local n = max[r]
      local shadow = n < 0
      if shadow then n = -n end
      local i = len - n + 1
      local t_n
      if set.denies then
        -- Rejected while the deny lasts (for good: the longest wait).
        local d = w[r] == 0 and MAX_PERIOD_MS or mmin(w[r] - now, MAX_PERIOD_MS)
        if d > best_d then best_d, best_s, best_r = d, s, r end
      elseif i == len then
        t_n = newest
      elseif i > 0 then
        t_n = time_of(log[i])
      elseif n > set.fetch and len == set.fetch then
        -- A large N and a log at least as long as one read: fetch just the
        -- N-th newest.
        local rank = set.rank or {}
        set.rank = rank
        rank[r] = rank[r] or '-' .. int(n)
        local m = call('ZRANGE', key, rank[r], rank[r])[1]
        t_n = m and time_of(m)
      end
      -- The rule is full iff d > 0; the largest d binds, the first on a tie.
      if t_n then
        local d = t_n + w[r] - now
        if shadow then
          if d > sh_d then sh_d, sh_s, sh_r = d, s, r end
        elseif d > best_d then
          best_d, best_s, best_r = d, s, r
        end
      end
    end
  end
  return best_d, best_s, best_r, sh_d, sh_s, sh_r
end

-- What is left of each scope's quota once a request that `judge` admitted
-- at `now` is recorded, from what judge read (`logs`). For each scope key,
-- appends to `out` the 1-based enforced rule that allows the fewest further
-- admissions (on a tie the one whose next slot frees last, then the
-- first), how many it allows, and how long until its oldest admission in
-- the window leaves it (the window itself if the request is the oldest);
-- 0 0 0 for a key with no enforced rule. Exact: a rule with room
-- holds fewer than N admissions, so judge's read (the newest N, up to 16)
-- holds them all; a larger N, or a read that holds only entries in the
-- window, asks Redis for the count and the oldest. Returns how many keys.
local function room(first, ks, now, logs, out)
  local o = #out
  for s = 1, #ks do
    local key, set, log = KEYS[first + s - 1], ks[s], logs[s]
    local len = #log
    local best_r, best_left, best_reset = 0, 0, 0
    -- A log read whole and empty (most mailboxes): the same for every
    -- request the set judges, so worked out once per set.
    local empty = len == 0 and set.fetch > 0
    local known = empty and set.empty
    if known then best_r, best_left, best_reset = known[1], known[2], known[3] end
    local times = not known and {}
    for r = 1, known and 0 or set.n do
      -- Enforced rules only (a shadow rule's max is negative, a deny's 0).
      local max = set.max[r]
      if max > 0 then
        local w = set.w[r]
        local since = now - w
        -- Count the read entries in the window, newest first; each entry's
        -- time is parsed once per key, not once per rule.
        local c = 0
        while c < len do
          local t = times[len - c]
          if not t then
            t = time_of(log[len - c])
            times[len - c] = t
          end
          if t <= since then break end
          c = c + 1
        end
        local oldest
        if c == len and len == set.fetch then
          -- Every entry read is in the window: there may be more.
          local after = '(' .. int(since)
          c = call('ZCOUNT', key, after, '+inf')
          local m = c > 0 and call('ZRANGEBYSCORE', key, after, '+inf', 'LIMIT', 0, 1)[1]
          oldest = m and time_of(m)
        elseif c > 0 then
          oldest = time_of(log[len - c + 1])
        end
        local left = max - c - 1
        if left < 0 then left = 0 end
        -- The admission at `now` may be the oldest (entries after `now`:
        -- the clock stepped back).
        local reset = oldest and mmin(oldest, now) + w - now or w
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

-- How often a scope key's log whose entries judge did not all read is
-- trimmed: at its first admission of each hour.
local TRIM_MS = 3600000

-- Records an admission at `now` (`now_s`) in each scope key of a request;
-- `logs` holds what judge read of each key.
local function record(first, ks, now, now_s, member, logs)
  for s = 1, #ks do
    local key, set = KEYS[first + s - 1], ks[s]
    -- A deny records nothing (its key's own set does).
    if not set.denies then
      -- Forget what no rule can see any more (older than keep), so memory
      -- stays bounded. Judge read the whole log if it read fewer entries
      -- than it asked for: trimmed only if its oldest is that old. Else
      -- (or if judge read nothing, fetch 0) when its newest entry is from
      -- an earlier hour than now: such a log holds at most an hour's
      -- admissions more than its keep (older entries are in no window).
      local log = logs[s]
      local len = #log
      local trim
      if len < set.fetch then
        trim = len > 0 and time_of(log[1]) <= now - set.keep
      else
        trim = len == 0 or floor(time_of(log[len]) / TRIM_MS) ~= floor(now / TRIM_MS)
      end
      -- Added before the trim, which then never empties the log: a key
      -- emptied (deleted) and written again in one call fails on a Redis
      -- Cluster slot being migrated, after the call's earlier writes.
      call('ZADD', key, now_s, member)
      if trim then
        call('ZREMRANGEBYSCORE', key, '-inf', int(now - set.keep))
      end
      call('PEXPIRE', key, set.keep_s)
    end
  end
end

-- Removes an admission from the scope keys KEYS[first .. last] (a refund).
local function forget(first, last, member)
  for k = first, last do
    call('ZREM', KEYS[k], member)
  end
end

-- A failed job's admission stays counted in the logs KEYS[first..last]
-- (its requester's), as an entry no job's id can make: `member` with a
-- '\1' appended (ids hold no control character). So the job's id admitted
-- again (another message of it) is a new entry, even in the same
-- millisecond, and never taken for a copy of itself being admitted.
-- Run again, it finds the entry renamed and changes nothing.
local function keep(first, last, member)
  for k = first, last do
    local score = call('ZSCORE', KEYS[k], member)
    if score then
      -- The new entry first: the log is never empty between the two (see
      -- `record`).
      call('ZADD', KEYS[k], score, member .. '\1')
      call('ZREM', KEYS[k], member)
    end
  end
end

-- The API: what the scripts composed after this one call, as decide.<name>
-- (a unit test checks that they use exactly these).
return {
  MAX_PERIOD_MS = MAX_PERIOD_MS,
  MAX_KEEP_MS = MAX_KEEP_MS,
  int = int,
  time_of = time_of,
  clock = clock,
  member_of = member_of,
  words = words,
  built = built,
  rule_sets = rule_sets,
  sets_of = sets_of,
  judge = judge,
  room = room,
  record = record,
  forget = forget,
  keep = keep,
}
