--[[
mailgate ledger: each job's lifecycle, and its admission. Sent to Redis after
the limiter's decision chunk (src/limiter/decide.lua), whose local functions
rule_sets, shape_ok, judge, record, forget, member_of, int and call it uses.
One operation per call, named by ARGV[1]; each checks its argument counts and
every argument before its first write, so a bad call writes nothing.

Record KEYS <prefix>job:<id>, a hash that lives `dedup_ms` after its last
write (ARGV), so an id is never mailed twice within that period:
  fp     what the id was admitted for (mailbox, client address, purpose), as a
         fingerprint: another job under the same id is a conflict
  at     admission time, ms (Redis clock); the job's member in the scope logs
         is member_of(at, id)
  st     the state (JobState in src/ledger/mod.rs, one character):
           a  admitted; its SMTP transaction has not begun
           x  sending: an SMTP transaction began, its outcome is not recorded
           s  sent: the SMTP server accepted the mail
           u  unknown: its sender vanished mid-send (lease lapsed in x) or
              the server never answered the end of the message; never resent
           r  refunded: ended without a mail (expired, failed, invalid); the
              quota was given back; fin says how it was answered
  own    the ticket of the message lineage that owns the send
  n      the owner's attempt: "sending", "release", a refund and "unknown"
         are accepted only from that attempt, so a late write of an earlier
         one (a call that reached Redis after its caller gave up on it)
         cannot change what a later attempt owns
  lease  until when (ms) the owner holds the send; 0 when released
  ans    '1' once the owner's final result was confirmed by RabbitMQ
  fin    on r: the status answered, 'e' expired, 'f' failed, 'i' invalid

Result codes of "admit" (Code in src/ledger/redis.rs; keep both in step):
]]
local CODE = {
  rejected = 0, -- retry_after_ms, scope, rule: a limit applies; nothing written
  admitted = 1, -- at: admitted now, the caller's ticket owns the send
  expired = 2, -- expires_at passed before a send began: nothing admitted (the
               -- caller's own unsent admission was refunded)
  resumed = 3, -- at: an admission nobody was sending is now the caller's
  busy = 4, -- at, lease_left_ms: another attempt owns the send
  sent = 5, -- at, by_owner, answered: the mail went out
  unknown = 6, -- at, by_owner, answered: delivery unknown; never resent
  finished = 7, -- fin, answered: the caller's own lineage ended without a mail
  conflict = 8, -- the id was admitted for another job; nothing touched
}

local op = ARGV[1]
local NONE = {false, false, false, false, false, false, false}

-- The time: ARGV[i] if given, else the Redis server's clock.
local function clock(i)
  if ARGV[i] ~= '' then return tonumber(ARGV[i]) end
  local t = call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Whether ARGV value `v` is a period Redis can add to its clock.
local function period_ok(v)
  local n = tonumber(v)
  return n ~= nil and n >= 1 and n <= MAX_PERIOD_MS
end

local function fail(why)
  return redis.error_reply('mailgate ledger ' .. tostring(op) .. ': ' .. why)
end

--[[
op "admit" -- decide a batch of requests in order, all at one instant
  ARGV[2]  now in ms, or "" for the Redis server's TIME (production)
  ARGV[3]  dedup_ms: how long a record lives after its last write
  ARGV[4]  lease_ms: how long an admission (or a resumption) owns the send
  ARGV[5]  the rule sets (decide.lua), then for each request 7 values:
             id, fingerprint, ticket, attempt (>= 1),
             send_now ('1': the caller has an SMTP connection free and
               starts its transaction at once, so the record goes straight
               to x; '0': to a, and the caller marks "sending" later),
             expires_at ms ('': never),
             shape (decide.lua; may be empty: no scope has rules)
  KEYS     for each request: its record key, then its scope keys (#shape)
  returns  {now, then 4 integers per request: code and up to 3 values (CODE)}
]]
-- Whether the 7 request values at ARGV[a] are well formed.
local function request_ok(a, sets)
  local attempt, flag, expires, shape = tonumber(ARGV[a + 3]), ARGV[a + 4], ARGV[a + 5], ARGV[a + 6]
  return shape ~= nil and (expires == '' or tonumber(expires) ~= nil)
    and ARGV[a] ~= '' and ARGV[a + 1] ~= '' and ARGV[a + 2] ~= ''
    and attempt ~= nil and attempt >= 1
    and (flag == '1' or flag == '0') and shape_ok(shape, sets)
end

local function admit()
  local now = clock(2)
  local dedup_s, lease = ARGV[3], tonumber(ARGV[4])
  local dedup = tonumber(dedup_s)
  if not now or not dedup or not lease or dedup < 1 or dedup > MAX_PERIOD_MS or lease < 1
    or lease > MAX_PERIOD_MS then
    return fail('bad clock, dedup or lease')
  end
  local sets, first_request = rule_sets(5)
  if not sets then return fail(first_request) end
  -- Every request is checked before the first write.
  local nargs = #ARGV
  local a, k, n = first_request, 1, 0
  while a <= nargs do
    n = n + 1
    if not request_ok(a, sets) then return fail('request ' .. n .. ' is malformed') end
    k = k + 1 + #ARGV[a + 6]
    a = a + 7
  end
  if k - 1 ~= #KEYS then return fail(#KEYS .. ' keys for ' .. (k - 1) .. ' named') end

  local now_s, lease_s = int(now), int(now + lease)
  local out, o = {now}, 1
  local function put(c, x, y, z)
    out[o + 1], out[o + 2], out[o + 3], out[o + 4] = c, x or 0, y or 0, z or 0
    o = o + 4
  end
  a, k = first_request, 1
  while a <= nargs do
    local id, want, ticket, attempt_s = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
    local attempt, state = tonumber(attempt_s), ARGV[a + 4] == '1' and 'x' or 'a'
    local expires, shape = tonumber(ARGV[a + 5]), ARGV[a + 6]
    local key, first = KEYS[k], k + 1
    local last = first + #shape - 1
    a, k = a + 7, last + 1
    local expired = expires ~= nil and expires <= now
    -- Most ids are new: EXISTS costs Redis less than reading seven fields.
    local rec = NONE
    if call('EXISTS', key) == 1 then
      rec = call('HMGET', key, 'fp', 'st', 'own', 'lease', 'at', 'ans', 'fin')
    end
    local fp, st, own, held, at = rec[1], rec[2], rec[3], tonumber(rec[4]) or 0, tonumber(rec[5]) or 0
    local mine, ans = own == ticket and 1 or 0, rec[6] == '1' and 1 or 0
    if fp and fp ~= want then
      put(CODE.conflict)
    elseif fp and st == 'r' and mine == 1 then
      put(CODE.finished, string.byte(rec[7] or 'f'), ans)
    elseif fp and st == 's' then
      put(CODE.sent, at, mine, ans)
    elseif fp and st == 'u' then
      put(CODE.unknown, at, mine, ans)
    elseif fp and st ~= 'r' and held > now then
      put(CODE.busy, at, held - now)
    elseif fp and st == 'x' then
      -- Its send began and its owner vanished: the mail may have gone out.
      -- Never resent (at most once); the caller answers it.
      call('HSET', key, 'st', 'u', 'ans', '0')
      call('PEXPIRE', key, dedup_s)
      put(CODE.unknown, at, mine, 0)
    elseif fp and st == 'a' and expired and mine == 1 then
      -- Admitted, never sent, and now too late: give the quota back.
      forget(first, last, member_of(at, id))
      call('HSET', key, 'st', 'r', 'fin', 'e', 'lease', '0', 'ans', '0', 'n', attempt_s)
      call('PEXPIRE', key, dedup_s)
      put(CODE.expired)
    elseif fp and st == 'a' and expired then
      -- Another message of the job, and too late for it; the owner's own
      -- copy judges its admission by its own expires_at when it comes back.
      put(CODE.expired)
    elseif fp and st == 'a' then
      call('HSET', key, 'st', state, 'own', ticket, 'n', attempt_s, 'lease', lease_s, 'ans', '0')
      call('PEXPIRE', key, dedup_s)
      put(CODE.resumed, at)
    elseif expired then
      -- No admission (or another lineage's refunded one): nothing to do.
      put(CODE.expired)
    else
      local d, s, rule = judge(first, shape, sets, now)
      if d > 0 then
        put(CODE.rejected, d, s, rule)
      else
        record(first, shape, sets, now, now_s, member_of(now, id))
        if fp then call('DEL', key) end
        call('HSET', key, 'fp', want, 'at', now_s, 'st', state, 'own', ticket, 'n', attempt_s,
          'lease', lease_s, 'ans', '0')
        call('PEXPIRE', key, dedup_s)
        put(CODE.admitted, now)
      end
    end
  end
  return out
end

--[[
op "sending" -- the owner begins its SMTP transaction: a becomes x, lease renewed
  KEYS[1] record. ARGV: now or "", dedup_ms, lease_ms, ticket, attempt.
  returns 1 if this attempt of the ticket owns the admission and nothing is
  sending, else 0 (the lease lapsed and another attempt took the send over).
]]
local function sending()
  if #KEYS ~= 1 or #ARGV ~= 6 then return fail('takes 1 key and 6 arguments') end
  local now, dedup_s, lease = clock(2), ARGV[3], tonumber(ARGV[4])
  if not now or not period_ok(dedup_s) or not period_ok(ARGV[4]) or ARGV[5] == '' or not tonumber(ARGV[6]) then
    return fail('bad arguments')
  end
  local rec = call('HMGET', KEYS[1], 'st', 'own', 'n')
  if rec[1] ~= 'a' or rec[2] ~= ARGV[5] or rec[3] ~= ARGV[6] then return 0 end
  call('HSET', KEYS[1], 'st', 'x', 'lease', int(now + lease))
  call('PEXPIRE', KEYS[1], dedup_s)
  return 1
end

--[[
op "release" -- the owner's send failed before the message was handed over
  (a transient failure) and will be retried: x or a becomes a, lease 0, so
  the retry resumes at once instead of waiting for the lease to lapse
  KEYS[1] record. ARGV: dedup_ms, ticket, attempt.
  returns 1 if this attempt of the ticket owned an unsent admission, else 0.
]]
local function release()
  if #KEYS ~= 1 or #ARGV ~= 4 then return fail('takes 1 key and 4 arguments') end
  if not period_ok(ARGV[2]) or ARGV[3] == '' or not tonumber(ARGV[4]) then return fail('bad arguments') end
  local rec = call('HMGET', KEYS[1], 'st', 'own', 'n')
  if (rec[1] ~= 'a' and rec[1] ~= 'x') or rec[2] ~= ARGV[3] or rec[3] ~= ARGV[4] then return 0 end
  call('HSET', KEYS[1], 'st', 'a', 'lease', '0')
  call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end

--[[
op "settle" -- record how the owner's attempt ended
  KEYS[1] record, then the job's scope keys (for a refund).
  ARGV: dedup_ms, ticket, attempt, id, end, answered ('1' if its result was
        confirmed); refunds and "unknown" only from the owning attempt
  end:  's' sent: the SMTP server accepted the mail (recorded even if another
          copy marked it unknown meanwhile: it is the truth)
        'u' unknown: the end of the message got no answer; never resent
        'e' / 'f' / 'i' refund as expired / failed / invalid: only from a or
          x owned by the ticket; the admission leaves every scope log
  returns 1 if recorded, 0 if the record is gone or not the ticket's.
]]
local function settle()
  if #KEYS < 1 or #ARGV ~= 7 then return fail('takes at least 1 key and 7 arguments') end
  local dedup_s, ticket, attempt, id, how, answered = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
  if not period_ok(dedup_s) or ticket == '' or not tonumber(attempt) or id == ''
    or (answered ~= '1' and answered ~= '0')
    or not string.find('suefi', how, 1, true) or #how ~= 1 then
    return fail('bad arguments')
  end
  local key = KEYS[1]
  local rec = call('HMGET', key, 'st', 'own', 'at', 'n')
  local st, own, at = rec[1], rec[2], tonumber(rec[3])
  local owning = own == ticket and rec[4] == attempt
  if not st then return 0 end
  if how == 's' then
    if st == 'r' then return 0 end
    call('HSET', key, 'st', 's', 'own', ticket, 'n', attempt, 'lease', '0', 'ans', answered)
  elseif how == 'u' then
    if not owning or (st ~= 'x' and st ~= 'u') then return 0 end
    call('HSET', key, 'st', 'u', 'lease', '0', 'ans', answered)
  else
    if not owning or (st ~= 'a' and st ~= 'x') then return 0 end
    forget(2, #KEYS, member_of(at, id))
    call('HSET', key, 'st', 'r', 'fin', how, 'lease', '0', 'ans', answered)
  end
  call('PEXPIRE', key, dedup_s)
  return 1
end

--[[
op "answered" -- the owner's final result was confirmed by RabbitMQ
  KEYS[1] record. ARGV: dedup_ms, ticket. returns 1 if the ticket owns the record.
]]
local function answered()
  if #KEYS ~= 1 or #ARGV ~= 3 or not period_ok(ARGV[2]) or ARGV[3] == '' then
    return fail('takes 1 key and 3 arguments')
  end
  if call('HGET', KEYS[1], 'own') ~= ARGV[3] then return 0 end
  call('HSET', KEYS[1], 'ans', '1')
  call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
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

if op == 'admit' then return admit()
elseif op == 'probe' then return probe()
elseif op == 'sending' then return sending()
elseif op == 'release' then return release()
elseif op == 'settle' then return settle()
elseif op == 'answered' then return answered()
end
return fail('unknown op')
