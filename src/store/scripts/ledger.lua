--[[
mailgate ledger: each job's lifecycle, and its admission. Composed after the
limiter's decision (decide.lua), which it calls as decide.<name>.
One operation per call, named by ARGV[1]: "batch" (every write, for one job or
for many at once), "commit" (admissions the worker decided: commit.lua) or
"probe" (readiness); the clock watch is clock.lua's;
each checks its argument counts and every argument before its first write,
so a bad call writes nothing. The file defines the operations and returns
`main`, which runs the one ARGV[1] names: the registry composes it as a
script (run whole by every EVALSHA) and as a Redis Function library (its
definitions run once, at the first FCALL after a load; KEYS and ARGV are
then the library's, set by each call).

Record KEYS <prefix>job:<id>, which lives `keep_ms` after its last write
(ARGV: limits.dedup_for and an hour, limiter::CLOCK_SLACK_MS, in case
Redis's clock steps forward), so an id is never mailed twice within
dedup_for. One string of these fields (records.lua says how, and how a
hash of an earlier build is read).
  fp     what the id was admitted for (mailbox, client address, purpose), as a
         fingerprint: another job under the same id is a conflict
  at     admission time, ms (Redis clock); the job's entry in the scope logs
         (decide.lua) has this time and its id
  st     the state (JobState in src/ledger/mod.rs, one character):
           a  admitted, not sending: its send failed before the message
              was handed over ("release"), and a retry resumes it
           x  sending: an SMTP transaction began, its outcome is not recorded
           s  sent: the SMTP server accepted the mail
           u  unknown: its sender vanished mid-send (lease lapsed in x) or
              the server never answered the end of the message; never resent
           r  refunded: ended without a mail (expired, failed, invalid); the
              quota was given back; fin says how it was answered
  own    the ticket of the message lineage that owns the send
  n      the owner's attempt, "<attempt>:<holder>" (the holder: the one
         handling of the message that holds the send, so two deliveries of
         one attempt cannot give back or settle each other's send):
         "release", a refund and "unknown"
         are accepted only from that attempt, so a late write of an earlier
         one (a call that reached Redis after its caller gave up on it)
         cannot change what a later attempt owns
  lease  until when (ms) the owner holds the send; 0 when released
  ans    '1' once the owner's final result was confirmed by RabbitMQ
  fin    on r: the status answered, 'e' expired, 'f' failed, 'i' invalid,
         'p' superseded (refunded by "admit" itself); '-' before
  c      the id of the call that last admitted or resumed it: that call
         run again (a Redis Cluster client sends a call
         again after its reply was lost) answers as it did the first time
  rv     spread over a cluster's shards only (see "look" below): the job's
         reservations, "<nonce> <t_email> <t_ip> <t_domain>" (-1: that scope
         had none; records of earlier versions lack t_domain);
         its entry in scope log s has the time t_s and the id
         id .. ':' .. nonce

Newest KEYS <prefix>newest:<purpose>:<mailbox>, a sorted set: the newest
16 jobs admitted for a mailbox and purpose whose purpose supersedes older
jobs (by when they were made, then by id), member the job id, score when
it was made (ms); lives keep_ms after its last write. (An earlier version
kept one job, as a string, under latest:…; the new name keeps the two
versions from failing on each other's keys during an upgrade.)

Result codes of an "admit" item (Code in src/ledger/redis/reply.rs; a test in
src/store/scripts/ checks that both agree):
]]
local call, tonumber, sub = redis.call, tonumber, string.sub
-- The record's states (bytes, as records.load reads them) and its I/O.
local A, X, S, U, R, YES = records.A, records.X, records.S, records.U, records.R, records.YES
local load, store, at_of, rv_of, ticket_ok =
  records.load, records.store, records.at_of, records.rv_of, records.ticket_ok

local CODE = {
  rejected = 0, -- retry_after_ms, scope, rule: a limit applies; nothing written
  admitted = 1, -- at, shadow scope, shadow rule, rooms: admitted now, the
                -- caller's ticket owns the send; the shadow rule that would
                -- have rejected it (decide.lua), 0 0 if none (and on
                -- "create"); how many scope keys' rooms (decide.lua's
                -- `room`) this item appended to the batch's reply (0 on
                -- "create", and for this very call run again)
  expired = 2, -- expires_at passed before a send began: nothing admitted (the
               -- caller's own unsent admission was refunded)
  resumed = 3, -- at: a released admission is now the caller's, sending
  busy = 4, -- at, lease_left_ms: another attempt owns the send
  sent = 5, -- at, by_owner, answered: the mail went out
  unknown = 6, -- at, by_owner, answered: delivery unknown; never resent
  finished = 7, -- fin, answered: the caller's own lineage ended without a mail
  conflict = 8, -- the id was admitted for another job; nothing touched
  absent = 9, -- "look" only: no live admission; reserve, then "create"
  superseded = 10, -- refunded: a newer job for the mailbox and purpose was
                   -- admitted after this one ("admit"'s made); 1 if this
                   -- job's unsent admission was refunded (into a record
                   -- the caller's ticket owns), 0 if nothing was counted
  suppressed = 11, -- "admit" with suppression keys: the address or its
                   -- mailbox is suppressed; nothing written
  unmigrated = 12, -- a scope log is of an earlier build's form (`mailgate
                   -- admin migrate` converts it): nothing written; the
                   -- caller waits, as in an outage
  changed = 13, -- "commit" only (commit.lua): a fact the worker decided from
                -- changed since its snapshot; nothing written; the worker
                -- asks "admit", which decides again
}

-- The operation of the call under way (ARGV[1]), for error messages.
local op
-- Whether ARGV value `v` is a period Redis can add to its clock (a keep
-- may be longer by the slack): whole ms, spelled as commands take them
-- (PEXPIRE refuses "6e4" and "60000.0").
local function period_ok(v, max)
  local n = tonumber(v)
  return n ~= nil and n >= 1 and n <= (max or decide.MAX_PERIOD_MS)
    and string.find(v, '^[1-9]%d*$') ~= nil
end

local function fail(why)
  return redis.error_reply('mailgate ledger ' .. tostring(op) .. ': ' .. why)
end

-- A batch's instant (b.now) and the end of a lease taken now, as commands
-- take them: formatted when an item first writes them (a batch of
-- rejections writes neither, and formatting a number costs Redis more
-- than most steps).
local function now_text(b)
  b.now_s = b.now_s or decide.int(b.now)
  return b.now_s
end

local function lease_end(b)
  b.lease_s = b.lease_s or decide.int(b.now + b.lease)
  return b.lease_s
end

--[[
op "batch" -- the ledger's writes: a list of items, run in order, all at one
  instant, so the fixed cost of a script call is shared by concurrent jobs.
  ARGV[2]  now in ms, or "" for the Redis server's TIME (production)
  ARGV[3]  the settings: keep_ms, how long a record lives after its last
           write; lease_ms, how long an admission (or a resumption) owns
           the send;
           the rule sets (decide.lua). Each an argument of its
           own, run as a script; as the words of one argument, run as a
           Function library (KEEPS_STATE), which keeps what it built from
           the same text: one string costs Redis far less than as many
           arguments, and a text seen before converts no number (a script
           builds anew each call, and splitting a text costs it more than
           the arguments do)
  then     the items, each its kind and its values (ITEMS below: admit,
           look, create, release, settle, answered)
  KEYS     for each item: its record key, then its scope keys (admit: one
           per key the shape names; settle: as many as it names)
  returns  {now, then per item its code times 8 plus how many values
           follow (0 to 4), then those values: admit's code and
           up to 4 values (CODE); the other kinds, 1 or 0 and up to 4
           values (a value left out reads as 0: integers cost Redis as
           much as strings to answer); then the rooms of the items
           admitted now, in item order: 3 integers per scope key (rule,
           remaining, reset_ms), as many keys as each item's fourth value
           says}
  Example (the shipped config, read with MONITOR: one job for
  mon0@gmail.com from 10.0.0.20, its mailbox judged by
  rule set 1 and its network by set 2, the suppression list read in three
  keys; prefix p:):
    FCALL mailgate_ledger_<hash> 6 p:job:j20 p:email:mon0@gmail.com
      p:ip:10.0.0.20/32 p:bounced:mon.0@gmail.com p:sup:mon0@gmail.com
      p:sup:mon.0@gmail.com
      batch ~1796284241996:10000
      "90000000 30000 0 2 1 3 90000000 60000 1 3600000 5 86400000 10
       2 3 7200000 60000 5 600000 30 3600000 50"
      admit j20 <fingerprint> <ticket> 1:3dfc771b862349d2
        s3:f4487523151f4e34 1796287841996 0102 ""
  that is: Redis's clock, expected near 1796284241996 within 10 s; keep
  90 000 000 ms, lease 30 000 ms, no rule set the call names (0) but 2
  extra ones: set 1 (3 rules, keep 90 000 000: 1 a minute, 5 an hour, 10
  a day), set 2 (3 rules, keep 7 200 000: 5 a minute, 30 in ten minutes,
  50 an hour); then the item: id, fingerprint, ticket, attempt 1 and its
  holder, 3 suppression keys and the call's id,
  expires_at, shape "0102", no supersede. The reply of a rejection:
  {now, 0 * 8 + 3, retry_after_ms, scope, rule}.
  Every item is checked before the first write, so a bad batch writes
  nothing. A batch run again (a Redis Cluster client sends a call again
  after its reply was lost) answers as the first run did, or as its
  effects now say: an admission finds its own record (the holder in `n`
  is this handling's) and stands; release, settle and answered change
  nothing more.
]]

-- Whether ARGV[i] is an attempt: its number (>= 1) and holder, "<n>:<hex>".
local function attempt_ok(i)
  return string.find(ARGV[i] or '', '^0*[1-9]%d*:%x+$') ~= nil
end

--[[
item "admit" -- decide a request: id, fingerprint, ticket, attempt,
  the call's id, "[s<n>:]<hex>" (the caller holds a free SMTP connection
    and starts its transaction at once: an admission's record is x;
    's<n>' ("admit" only, n from 1 to 9): the
    last n keys are suppression keys, the first the address's own spelling
    as a relay refused it, <prefix>bounced:<address>, then its mailbox's,
    <prefix>sup:<mailbox>, and maybe that of earlier versions),
  expires_at ms ('': never),
  shape (decide.lua; may be empty: no scope has rules),
  made: '' if the job's purpose does not supersede older jobs; else
    "<made>,<skew>": when the job was made (ms; empty if unknown, and a
    time after its admission counts as the admission's: its admission
    time stands in) and how far apart (ms) two jobs' made times must be
    for them to say which is newer (producers' clocks disagree, and the
    AMQP timestamp has whole seconds).
  KEYS: the record, then one scope key per key the shape names (two
  characters each), then, with made, the newest key of the job's mailbox
  and purpose, then, with 's<n>', the n suppression keys.
  Suppressed: where the limiter would decide (no live admission of the id,
  and not expired), a request is answered `suppressed`, and nothing is
  counted or written, if its first suppression key exists, or another
  holds a suppression someone made (a value "<ms> <source> <why>" whose
  source is not "bounce": versions before 2026-12-02 wrote bounces there,
  under a spelling a stranger chose). A job already admitted goes on as
  its record says.
  Superseding: another job of the newest key is newer if it was made more
  than skew later; made within skew of each other, neither is newer (which
  was made first cannot be told: both are mailed). A job with a newer
  one whose record is not refunded is answered
  `superseded` where it would be admitted (nothing is counted) or resumed
  (its unsent admission is refunded, fin 'p'): its code is stale, and a
  newer one is on its way. A job admitted now joins its newest key. A job
  whose send began is never superseded.

items "look" and "create" -- the same decision when the scope keys live on
  other shards of a Redis Cluster (a key prefix without a hash tag), so that
  no one call can judge them and write the record. Their values are
  admit's, but for the shape, and made is always '' (settings refuse
  supersede with the keys spread); KEYS: the record.
  "look": '' instead of the shape. Where "admit" would judge the scopes, it
    answers `absent` and writes nothing. The caller judges each scope
    (scope.lua's "peek", at the same time as the look): if one
    rejects, that is the answer, and nothing was written anywhere. Else it
    reserves in each ("reserve") and, if one rejects after all (a request
    that came in between took the room), gives the others back
    ("unreserve").
  "create": the reservations, "<nonce> <t_email> <t_ip> <t_domain>",
    instead of the shape. Where "admit" would judge, it records the admission with them.
    Any other answer (the record appeared meanwhile: another copy won)
    leaves them unused, and the caller gives them back.
  An "expired" answer that refunded the caller's unsent admission carries
  its reservations, as "settle" does.
]]
-- A record's reservations (its rv field) as "settle" and "expired" answer
-- them: t_email, t_ip, t_domain (-1: none in that scope), nonce; all -1 if
-- it has none. (A record an earlier version made has no t_domain.)
local RESERVED = '^(%d+) (%-?%d+) (%-?%d+) ?(%-?%d*)$'
local function reserved(rv)
  if not rv then return -1, -1, -1, -1 end
  local n, e, i, d = string.match(rv, RESERVED)
  return tonumber(e) or -1, tonumber(i) or -1, tonumber(d) or -1, tonumber(n) or -1
end

local function admit_ok(a, head, kind)
  local flag, expires, last, made = ARGV[a + 4], ARGV[a + 5], ARGV[a + 6], ARGV[a + 7]
  -- "<hex>", or for "admit" "s<n>:<hex>" (n suppression keys).
  local flag_ok = string.find(flag or '', '^%x+$') ~= nil
    or (kind == 'admit' and string.find(flag or '', '^s[1-9]:%x+$') ~= nil)
  local made_ok = made == '' or (kind == 'admit' and string.match(made, '^%d*,%d+$'))
  if not made_ok then return false end
  local last_ok
  if kind == 'admit' then
    last_ok = last ~= nil and decide.sets_of(last, head.sets, head.shapes) ~= nil
  elseif kind == 'look' then
    last_ok = last == ''
  else
    last_ok = last ~= nil and string.match(last, RESERVED) ~= nil
  end
  return last_ok and (expires == '' or tonumber(expires) ~= nil)
    and ARGV[a] ~= '' and ARGV[a + 1] ~= '' and ticket_ok(ARGV[a + 2]) and attempt_ok(a + 3)
    and flag_ok
end

-- How many suppression keys an item's flag (ARGV[a]) names: n of
-- "s<n>:<hex>", else 0.
local function suppression_keys(a)
  if string.byte(ARGV[a], 1) ~= 115 then return 0 end
  return (string.byte(ARGV[a], 2) or 48) - 48
end

-- Whether the n suppression keys from KEYS[k] suppress the request: the
-- first exists (a relay refused this spelling), or another holds a
-- suppression someone made (not an earlier version's bounce).
local function suppressed(k, n)
  if n == 0 then return false end
  if call('EXISTS', KEYS[k]) == 1 then return true end
  for i = k + 1, k + n - 1 do
    local v = call('GET', KEYS[i])
    if v and not string.find(v, '^%d+ bounce ') then return true end
  end
  return false
end

-- Whether job `id`, made at `made` (ms), is superseded: its newest key
-- holds another job made more than `skew` later whose record is not
-- refunded (a refunded job mails nothing). `record`: this job's record
-- key, whose prefix the others' share.
local function superseded(newest, made, skew, id, record)
  local others = call('ZRANGEBYSCORE', newest, '(' .. decide.int(made + skew), '+inf')
  local prefix = sub(record, 1, #record - #id)
  for _, other in ipairs(others) do
    if other ~= id then
      local st = load(prefix .. other)
      if st and st ~= R then return true end
    end
  end
  return false
end

-- An admission item's values (ARGV from a, as admit_ok checked them) and
-- keys (KEYS from k), by name. kind: "admit", "look" or "create".
local function item_of(k, a, kind)
  -- The flag: "[s<n>:]<hex>".
  local flag = ARGV[a + 4]
  local sups = suppression_keys(a + 4)
  local shape = kind == 'admit' and ARGV[a + 6] or ''
  local first = k + 1
  local last = first + #shape / 2 - 1
  local latest = ARGV[a + 7] ~= '' and KEYS[last + 1]
  -- A time after its admission (a producer's clock ahead) counts as the
  -- admission's, so one such job cannot supersede every later one for as
  -- long.
  local made, skew
  if latest then
    local made_s, skew_s = string.match(ARGV[a + 7], '^(%d*),(%d+)$')
    made, skew = tonumber(made_s), tonumber(skew_s)
  end
  return {id = ARGV[a], want = ARGV[a + 1], ticket = ARGV[a + 2], attempt_s = ARGV[a + 3],
    call_id = sub(flag, sups > 0 and 4 or 1),
    expires = ARGV[a + 5] ~= '' and tonumber(ARGV[a + 5]), shape = shape,
    rv = kind == 'create' and ARGV[a + 6] or '', key = KEYS[k], first = first, last = last,
    latest = latest, made = made, skew = skew, sups = sups,
    suppression = last + (latest and 2 or 1)}
end

-- What item j answers from its job's record (load's values), writing what
-- that answer changes; nil where the record leaves the decision to the
-- limiter (another lineage's refunded admission).
local function from_record(j, b, st, ans, fin, lease, own, n, c, tail)
  local now, key = b.now, j.key
  local at, held = at_of(tail), tonumber(lease) or 0
  local mine, answered = own == j.ticket and 1 or 0, ans == YES and 1 or 0
  local expired = j.expires and j.expires <= now
  if string.match(tail, '^[^|]*|[^|]*|(.*)$') ~= j.want then
    return CODE.conflict
  elseif (st == A or st == X) and c == j.call_id then
    -- This very call again (a Redis Cluster client sends a call again
    -- after its reply was lost; each call has an id of its own): its
    -- admission stands, as it was made.
    return CODE.admitted, at
  elseif st == R and mine == 1 then
    -- (A record without its fin: failed.)
    return CODE.finished, fin == 45 and 102 or fin, answered
  elseif st == S then
    return CODE.sent, at, mine, answered
  elseif st == U then
    return CODE.unknown, at, mine, answered
  elseif st ~= R and held > now then
    return CODE.busy, at, held - now
  elseif st == X then
    -- Its send began and its owner vanished: the mail may have gone out.
    -- Never resent (at most once); the caller answers it.
    store(key, b, 'u', '0', '-', lease, own, n, c, tail)
    return CODE.unknown, at, mine, 0
  elseif st == A and expired and mine == 1 then
    -- Admitted, never sent, and now too late: give the quota back.
    decide.forget(j.first, j.last, at, j.id)
    store(key, b, 'r', '0', 'e', '0', own, j.attempt_s, c, tail)
    return CODE.expired, reserved(rv_of(tail))
  elseif st == A and expired then
    -- Another message of the job, and too late for it; the owner's own
    -- copy judges its admission by its own expires_at when it comes back.
    return CODE.expired
  elseif st == A and j.latest
    and superseded(j.latest, math.min(j.made or at, at), j.skew, j.id, key) then
    -- Its code is stale: refunded unsent, and answered by the caller.
    decide.forget(j.first, j.last, at, j.id)
    store(key, b, 'r', '0', 'p', '0', j.ticket, j.attempt_s, c, tail)
    return CODE.superseded, 1
  elseif st == A then
    store(key, b, 'x', '0', '-', lease_end(b), j.ticket, j.attempt_s, j.call_id, tail)
    return CODE.resumed, at
  end
  return nil
end

-- What item j answers with no live admission of its id: expired, absent
-- ("look"), suppressed, superseded or rejected, writing nothing; or
-- admitted now, its record written whole (nothing of a refunded record's
-- earlier life stays) and, for "admit", its admission counted.
local function afresh(j, b, kind)
  local now = b.now
  if j.expires and j.expires <= now then return CODE.expired end
  if kind == 'look' then return CODE.absent end
  if suppressed(j.suppression, j.sups) then return CODE.suppressed end
  local shadow_s, shadow_r, rooms = 0, 0, 0
  if kind == 'admit' then
    local made = j.latest and math.min(j.made or now, now)
    if made and superseded(j.latest, made, j.skew, j.id, j.key) then
      return CODE.superseded, 0
    end
    local d, s, rule, _
    local logs = {}
    local ks = decide.sets_of(j.shape, b.sets, b.shapes)
    d, s, rule, _, shadow_s, shadow_r = decide.judge(j.first, ks, now, logs)
    if not d then return CODE.unmigrated end
    if d > 0 then return CODE.rejected, d, s, rule end
    rooms = decide.room(ks, now, logs, b.rooms)
    decide.record(j.first, ks, now, j.id, logs)
    if made then
      call('ZADD', j.latest, decide.int(made), j.id)
      call('ZREMRANGEBYRANK', j.latest, 0, -17)
      call('PEXPIRE', j.latest, b.keep_s)
    end
  end
  store(j.key, b, 'x', '0', '-', lease_end(b), j.ticket, j.attempt_s, j.call_id,
    now_text(b) .. '|' .. j.rv .. '|' .. j.want)
  return CODE.admitted, now, shadow_s, shadow_r, rooms
end

local function admit(k, a, b, kind)
  local j = item_of(k, a, kind)
  local st, ans, fin, lease, own, n, c, tail = load(j.key)
  if st then
    local code, v, x, y, z = from_record(j, b, st, ans, fin, lease, own, n, c, tail)
    if code then return code, v, x, y, z end
  end
  return afresh(j, b, kind)
end

--[[
item "release" -- the owner's send failed before the message was handed
  over (a transient failure) and will be retried: x or a becomes a, lease 0,
  so the retry resumes at once instead of waiting for the lease to lapse.
  Values: ticket, attempt. KEYS: the record.
  1 if this attempt of the ticket owned an unsent admission, else 0.
]]
local function release(k, a, b)
  local st, ans, _, _, own, n, c, tail = load(KEYS[k])
  if (st ~= A and st ~= X) or own ~= ARGV[a] or n ~= ARGV[a + 1] then
    return 0
  end
  store(KEYS[k], b, 'a', ans == YES and '1' or '0', '-', '0', own, n, c, tail)
  return 1
end

--[[
item "settle" -- record how the owner's attempt ended.
  Values: ticket, attempt, id, end, answered ('1' if its result was
    confirmed), n (how many scope keys follow the record; a refund names
    the job's scope keys: "<n>" or "<n>,<m>", n it leaves, then m it stays
    counted in, renamed as decide.keep does: a failure's requester's).
    Refunds and "unknown" only from the owning attempt.
  end:  's' sent: the SMTP server accepted the mail (recorded even if another
          copy marked it unknown meanwhile: it is the truth)
        'u' unknown: the end of the message got no answer; never resent
        'e' / 'f' / 'i' / 'p' refund as expired / failed / invalid /
          superseded: only from a or
          x owned by the ticket; the admission leaves the n scope logs
  1 if recorded, 0 if the record is gone or not the ticket's; a refund of
  reservations ("create") then names them: t_email, t_ip, t_domain, nonce,
  and so does a refund asked again of the attempt that made it (with 0).
]]
-- A settle's ends (its `end` value).
local ENDS = {s = true, u = true, e = true, f = true, i = true, p = true}

-- A settle's scope keys ("<n>" or "<n>,<m>"): how many it leaves, and how
-- many it stays counted in; nil if malformed.
local function settled_keys(text)
  local n, m = string.match(text or '', '^(%d+),(%d+)$')
  if not n then n, m = string.match(text or '', '^(%d+)$'), '0' end
  if not n then return nil end
  return tonumber(n), tonumber(m)
end

local function settle_ok(a)
  local how, answered = ARGV[a + 3], ARGV[a + 4]
  return ticket_ok(ARGV[a]) and attempt_ok(a + 1) and ARGV[a + 2] ~= ''
    and (answered == '1' or answered == '0') and ENDS[how] ~= nil
    and settled_keys(ARGV[a + 5]) ~= nil
end

local function settle(k, a, b)
  local ticket, attempt, id, how, answered = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]
  local key = KEYS[k]
  local st, _, _, _, own, n, c, tail = load(key)
  if not st then return 0 end
  local owning = own == ticket and n == attempt
  if how == 's' then
    if st == R then return 0 end
    store(key, b, 's', answered, '-', '0', ticket, attempt, c, tail)
  elseif how == 'u' then
    if not owning or (st ~= X and st ~= U) then return 0 end
    store(key, b, 'u', answered, '-', '0', own, n, c, tail)
  else
    -- Asked again (its first reply was lost): 0, and the reservations
    -- again, which the caller gives back again (ZREM is idempotent).
    if owning and st == R then
      local rv = rv_of(tail)
      if rv then return 0, reserved(rv) end
      return 0
    end
    if not owning or (st ~= A and st ~= X) then return 0 end
    local leaves, stays = settled_keys(ARGV[a + 5])
    local at = at_of(tail)
    decide.forget(k + 1, k + leaves, at, id)
    decide.keep(k + leaves + 1, k + leaves + stays, at, id)
    store(key, b, 'r', answered, how, '0', own, n, c, tail)
    local rv = rv_of(tail)
    if rv then return 1, reserved(rv) end
  end
  return 1
end

--[[
item "answered" -- the owner's final result was confirmed by RabbitMQ.
  Values: ticket. KEYS: the record. 1 if the ticket owns the record.
]]
local function answered(k, a, b)
  local st, _, fin, lease, own, n, c, tail = load(KEYS[k])
  if not st or own ~= ARGV[a] then return 0 end
  store(KEYS[k], b, string.char(st), '1', string.char(fin), lease, own, n, c, tail)
  return 1
end

-- Each kind of item: how many values it takes, whether they are well formed
-- (given the rule sets), how many keys it names, and what it does.
local one = function() return 1 end
local ITEMS = {
  admit = {values = 8, ok = function(a, head) return admit_ok(a, head, 'admit') end,
    keys = function(a)
      return 1 + #ARGV[a + 6] / 2 + (ARGV[a + 7] ~= '' and 1 or 0)
        + suppression_keys(a + 4)
    end,
    run = function(k, a, b) return admit(k, a, b, 'admit') end},
  look = {values = 8, ok = function(a, head) return admit_ok(a, head, 'look') end, keys = one,
    run = function(k, a, b) return admit(k, a, b, 'look') end},
  create = {values = 8, ok = function(a, head) return admit_ok(a, head, 'create') end,
    keys = one,
    run = function(k, a, b) return admit(k, a, b, 'create') end},
  release = {values = 2, ok = function(a) return ARGV[a] ~= '' and attempt_ok(a + 1) end,
    keys = one, run = release},
  settle = {values = 6, ok = settle_ok, keys = function(a)
      local leaves, stays = settled_keys(ARGV[a + 5])
      return 1 + leaves + stays
    end,
    run = settle},
  answered = {values = 1, ok = function(a) return ARGV[a] ~= '' end, keys = one, run = answered},
}

-- A batch's settings from v[a] on: keep_ms, lease_ms, then the rule sets;
-- they and the index after them, or nil and why if they are malformed.
local function settings(v, a)
  if not period_ok(v[a], decide.MAX_KEEP_MS) or not period_ok(v[a + 1]) then
    return nil, 'bad dedup or lease'
  end
  local sets, after = decide.rule_sets(v, a + 2)
  if not sets then return nil, after end
  -- shapes: decide.sets_of's memo for these sets.
  return {keep_s = v[a], lease = tonumber(v[a + 1]), sets = sets, shapes = {}}, after
end

-- The settings as the words of one argument (a Function library: see
-- ARGV[3] above).
local function settings_of(text)
  local v = decide.words(text)
  if not v then return nil, 'settings are not words' end
  local head, after = settings(v, 1)
  if head and after ~= #v + 1 then return nil, 'words after the rule sets' end
  return head, after
end

local function batch()
  local now, skewed = decide.clock(2)
  if skewed then return skewed end
  if not now then return fail('bad clock') end
  local head, first_item
  if KEEPS_STATE then
    head, first_item = decide.built(ARGV[3] or '', settings_of)
    if not head then return fail(first_item) end
    first_item = 4
  else
    head, first_item = settings(ARGV, 3)
    if not head then return fail(first_item) end
  end
  local keep_s, lease = head.keep_s, head.lease
  -- Every item is checked before the first write.
  local nargs = #ARGV
  -- keys[n]: how many keys item n names.
  local a, k, n, keys = first_item, 1, 0, {}
  while a <= nargs do
    n = n + 1
    local item = ITEMS[ARGV[a]]
    if not item or a + item.values > nargs or not item.ok(a + 1, head) then
      return fail('item ' .. n .. ' is malformed')
    end
    keys[n] = item.keys(a + 1)
    k = k + keys[n]
    a = a + 1 + item.values
  end
  if k - 1 ~= #KEYS then return fail(#KEYS .. ' keys for ' .. (k - 1) .. ' named') end

  local b = {now = now, lease = lease, now_s = false, lease_s = false, keep_s = keep_s,
    sets = head.sets, shapes = head.shapes, rooms = {}}
  local out, o = {now}, 1
  a, k, n = first_item, 1, 0
  while a <= nargs do
    n = n + 1
    local item = ITEMS[ARGV[a]]
    -- Each item returns its code and at most four values, none nil before
    -- the last: REPLY_WIDTH (src/ledger/redis/reply.rs) integers at most,
    -- the names here (a unit test counts them).
    local c, v, x, y, z = item.run(k, a + 1, b)
    local m = z and 4 or y and 3 or x and 2 or v and 1 or 0
    out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] = c * 8 + m, v, x, y, z
    o = o + 1 + m
    k = k + keys[n]
    a = a + 1 + item.values
  end
  for i = 1, #b.rooms do out[o + i] = b.rooms[i] end
  return out
end

--[[
op "probe" -- what readiness asks: may this client run the ledger's script
  and write under the prefix? (A replica refuses the write, READONLY; a user
  without the right ACL is refused, NOPERM.)
  KEYS[1] <prefix>probe. Sets it and deletes it again. returns 1.
]]
local function probe()
  if #KEYS ~= 1 or #ARGV ~= 1 then return fail('takes 1 key and no arguments') end
  call('SET', KEYS[1], '1', 'PX', '1000')
  call('DEL', KEYS[1])
  return 1
end

-- Runs the operation ARGV[1] names.
local function main()
  op = ARGV[1]
  if op == 'batch' then return batch()
  elseif op == 'commit' then return commit.main(CODE, fail, suppressed)
  elseif op == 'probe' then return probe()
  end
  return fail('unknown op')
end

return main
