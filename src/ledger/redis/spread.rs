//! The ledger's admissions and refunds with the keys spread over a Redis
//! Cluster's shards ([`RedisSettings::spreads_keys`]): each call names one
//! key, so an admission is a look at the job's record (with a judgement of
//! each scope), a reservation in each scope, and the record's creation; a
//! refund gives the reservations back. `ledger.lua`'s "look" and "create"
//! and `scope.lua` (peek, reserve, unreserve: a script of its own, much
//! smaller than the ledger's, since each call here is one item) document
//! each step.
//!
//! [`RedisSettings::spreads_keys`]: crate::settings::RedisSettings::spreads_keys

use std::sync::Arc;
use std::time::Duration;

use super::batch::{Callee, answered, clock_arg, eval_waiting, stopped};
use super::replicas::Replication;
use super::reply::{Code, REPLY_WIDTH, Reply, room_named, rule_named, verdict};
use super::{RedisLedger, admission_args};
use crate::domain::RegistrableDomain;
use crate::ledger::{Admission, Entry, LedgerError, Refund, Verdict};
use crate::limiter::{Applied, Clock, Keyspace, Request, Rooms, RuleRef, RuleSet, Scope, Subject};
use crate::store::Conn;
use crate::store::scripts::SCOPE;

/// The time of a reservation whose "reserve" reply was lost: it is given
/// back by the job's suffix alone (scope.lua's "unreserve" with no time).
const TIME_UNKNOWN: u64 = u64::MAX;

/// What judging (or reserving in) every scope of a request came to (keys
/// spread over shards).
enum Reservations {
    /// Every scope has room (and holds the reservation): its scope, key
    /// and reservation time; the shadow rule that would have rejected
    /// the request, with its wait (the longest, the first on a tie); and,
    /// for reservations, the room each scope has left with it.
    Held(Vec<(Scope, String, u64)>, Option<(u64, RuleRef)>, Rooms),
    /// A scope rejected, and every reservation was given back: the largest
    /// wait, the first rule with it, and when its scope decided.
    Rejected(Admission),
    /// A scope is full, and one of the entries that fill it is another
    /// copy's of the same job, made within a lease: that copy is being
    /// admitted, and the job's record will answer. Every reservation was
    /// given back.
    Copy,
}

/// How often, and how far apart, a failed "create" asks whether the record
/// was made ([`RedisLedger::not_created`]): some 5 s in all, longer than a
/// cluster's failover with a `cluster-node-timeout` of a few seconds.
const NOT_CREATED_TRIES: usize = 10;
const NOT_CREATED_PAUSE: Duration = Duration::from_millis(500);

/// How long a copy of a job that found another copy's reservation waits
/// before it asks the job's record again (at most).
const COPY_WAIT_MS: u64 = 1_000;

impl RedisLedger {
    /// [`crate::ledger::Ledger::admit`] with keys spread over a cluster's shards: look at
    /// the record and judge every scope at once; then reserve in every
    /// scope; then create the record with the reservations (`ledger.lua`'s
    /// "look", "peek", "reserve" and "create").
    pub(super) async fn admit_spread(
        &self,
        entry: &Entry<'_>,
        clock: Clock,
    ) -> Result<Admission, LedgerError> {
        let record = self.keys.record_key(entry.job.request.id);
        let (scopes, by_override) = self.keys.applicable_by(&entry.job.request);
        let args = admission_args("look", entry, String::new());
        let look = self
            .enqueue(Some(clock), args, vec![record.clone()], true)
            .await?;
        let id = entry.job.request.id.as_str();
        let peeks = self.each_scope(clock, &scopes, id, None).await;
        // The suppression key lives on a shard of its own: read at the
        // same time as the look, and heeded where the limiter would decide.
        let (look, suppressed) = tokio::join!(answered(look), self.suppressed(entry));
        let look = look?;
        if look.values[0] != Code::Absent as i64 {
            return self.decided(entry, &[], look).await;
        }
        if suppressed? {
            return Ok(Admission::at(look.now_ms, Verdict::Suppressed));
        }
        match self.gather(&scopes, peeks, None).await? {
            Reservations::Held(..) => {}
            Reservations::Rejected(mut rejection) => {
                rejection.by_override = by_override;
                return Ok(rejection);
            }
            Reservations::Copy => return self.look_again(entry, clock, &record).await,
        }
        // Unique per reservation: two copies of one job reserving in the same
        // millisecond hold two members, and the loser's give-back leaves the
        // winner's. Never 0 (see `give_back_refunded`).
        let nonce = (uuid::Uuid::new_v4().as_u128() as u32).max(1);
        let suffix = format!("{id}:{nonce}");
        let (held, at, shadow, rooms) =
            match self.reserve(clock, &scopes, id, nonce, &suffix).await? {
                (Reservations::Held(held, shadow, rooms), at) => (held, at, shadow, rooms),
                (Reservations::Rejected(rejection), _) => return Ok(rejection),
                (Reservations::Copy, _) => return self.look_again(entry, clock, &record).await,
            };
        let created = self
            .create(entry, clock, &record, (nonce, &suffix), &held)
            .await?;
        let mut admission = self.decided(entry, &[], created).await?;
        if admission.verdict == Verdict::Admitted {
            if let Clock::At(t) = at {
                admission.decided_at_ms = t;
            }
            admission.shadow = shadow.map(|(_, rule)| rule);
            admission.rooms = rooms;
            admission.by_override = by_override;
        }
        Ok(admission)
    }

    /// [`crate::ledger::Ledger::peek`] with keys spread over a cluster's
    /// shards: whether the job's record exists, whether its mailbox is
    /// suppressed, and each scope's judgement, read at once, as
    /// [`RedisLedger::admit_spread`] reads them before it reserves. A
    /// rejection is the answer where no record exists and nothing is
    /// suppressed, and the job has not expired by the rejection's instant
    /// ("admit" answers those first); anything else is left to `admit`.
    pub(super) async fn peek_spread(
        &self,
        entry: &Entry<'_>,
        clock: Clock,
    ) -> Result<Option<Admission>, LedgerError> {
        let record = self.keys.record_key(entry.job.request.id);
        let (scopes, by_override) = self.keys.applicable_by(&entry.job.request);
        let id = entry.job.request.id.as_str();
        let exists = async {
            let mut conn = self.conn.clone();
            let n: u64 = redis::cmd("EXISTS")
                .arg(&record)
                .query_async(&mut conn)
                .await?;
            Ok::<_, LedgerError>(n > 0)
        };
        let (exists, suppressed, peeks) = tokio::join!(
            exists,
            self.suppressed(entry),
            self.each_scope(clock, &scopes, id, None)
        );
        if exists? || suppressed? {
            return Ok(None);
        }
        match self.gather(&scopes, peeks, None).await? {
            Reservations::Rejected(mut rejection)
                if entry
                    .expires_at_ms
                    .is_none_or(|at| at > rejection.decided_at_ms) =>
            {
                rejection.by_override = by_override;
                Ok(Some(rejection))
            }
            _ => Ok(None),
        }
    }

    /// Whether `entry`'s address or mailbox is suppressed (false if
    /// admissions do not check: `limits.suppress`): its keys
    /// ([`Keyspace::suppression_keys`](crate::limiter::Keyspace)) read at
    /// once, each on its own shard, judged as `ledger.lua` judges them.
    async fn suppressed(&self, entry: &Entry<'_>) -> Result<bool, LedgerError> {
        if !self.keys.checks_suppression() {
            return Ok(false);
        }
        let mut reads = tokio::task::JoinSet::new();
        for (i, key) in (self.keys.suppression_keys(entry.job.request.email))
            .into_iter()
            .enumerate()
        {
            let mut conn = self.conn.clone();
            reads.spawn(async move {
                let value: Option<String> =
                    redis::cmd("GET").arg(key).query_async(&mut conn).await?;
                Ok::<_, redis::RedisError>((i, value))
            });
        }
        let mut values = vec![None; reads.len()];
        while let Some(read) = reads.join_next().await {
            let (i, value) = read.map_err(|e| LedgerError::Protocol(e.to_string()))??;
            values[i] = value;
        }
        let suppressed = crate::limiter::suppressed_by(&values);
        Ok(suppressed)
    }

    /// Reserves job `id`'s room in each of `scopes`, one scope after
    /// another: a request that loses the race for one scope's room holds
    /// none in the scopes after it. Every scope is judged, and its entry
    /// made, at the first reservation's time (returned), so one admission
    /// has one time, as in one script on one server. If a scope rejects,
    /// or another copy of the job holds its room, every reservation of
    /// `suffix` is given back, and that is the answer.
    async fn reserve(
        &self,
        clock: Clock,
        scopes: &[Applied],
        id: &str,
        nonce: u32,
        suffix: &str,
    ) -> Result<(Reservations, Clock), LedgerError> {
        let mut at = clock;
        let mut held = Vec::with_capacity(scopes.len());
        let mut shadow: Option<(u64, RuleRef)> = None;
        let mut rooms = Rooms::default();
        for scope in scopes {
            let one = std::slice::from_ref(scope);
            let reply = self.each_scope(at, one, id, Some(nonce)).await;
            let answer = match self.gather(one, reply, Some(suffix)).await {
                Ok(Reservations::Held(h, would_bind, room)) => {
                    if let (Clock::Server, Some((_, _, t))) = (at, h.first())
                        && *t != TIME_UNKNOWN
                    {
                        at = Clock::At(*t);
                    }
                    held.extend(h);
                    shadow = longer(shadow, would_bind);
                    room.iter().for_each(|r| rooms.set(r));
                    continue;
                }
                other => other,
            };
            self.give_back(suffix, &held).await;
            return answer.map(|answer| (answer, at));
        }
        Ok((Reservations::Held(held, shadow, rooms), at))
    }

    /// Creates the job's record (`ledger.lua`'s "create") with the
    /// reservations `held` of `nonce` (and `suffix`); if it was not created
    /// with them (another copy of the job won the record meanwhile, or the
    /// call failed and Redis can tell that it did not), gives them back.
    async fn create(
        &self,
        entry: &Entry<'_>,
        clock: Clock,
        record: &str,
        (nonce, suffix): (u32, &str),
        held: &[(Scope, String, u64)],
    ) -> Result<Reply, LedgerError> {
        let time_in = |scope| {
            held.iter()
                .find(|(s, ..)| *s == scope)
                .map_or(-1, |(_, _, t)| i128::from(*t))
        };
        // The record's `rv`: the nonce, then one time per scope in
        // `Scope::ALL` order (ledger.lua's `reserved` reads it so).
        let reservations = std::iter::once(i128::from(nonce))
            .chain(Scope::ALL.map(time_in))
            .map(|v| v.to_string())
            .collect::<Vec<_>>()
            .join(" ");
        let args = admission_args("create", entry, reservations);
        let created = match self
            .submit(Some(clock), args, vec![record.to_owned()], true)
            .await
        {
            Ok(created) => created,
            Err(e) => {
                // It may have created the record, or not: if Redis can tell
                // now that it did not, the reservations go back.
                if self.not_created(record, nonce).await {
                    self.give_back(suffix, held).await;
                }
                return Err(e);
            }
        };
        if created.values[0] != Code::Admitted as i64 {
            // Another copy of the job won the record meanwhile.
            self.give_back(suffix, held).await;
        }
        Ok(created)
    }

    /// A "peek" (no nonce) or a "reserve" of job `id` with `nonce` in each
    /// of `scopes`, all at once: their replies, in order. A reservation is
    /// always acknowledged by the replicas (with `redis.min_replicas_acked`):
    /// the job's send mark, on another shard, cannot wait for it.
    async fn each_scope(
        &self,
        clock: Clock,
        scopes: &[Applied],
        id: &str,
        nonce: Option<u32>,
    ) -> Vec<Result<Reply, LedgerError>> {
        let calls = scopes.iter().map(|Applied { key, set, .. }| {
            let mut args: Vec<String> = (Keyspace::one_rule_set_args(set).iter())
                .map(i64::to_string)
                .collect();
            args.push(id.to_owned());
            args.extend(nonce.map(|n| n.to_string()));
            let op = if nonce.is_some() { "reserve" } else { "peek" };
            (key.clone(), op, args)
        });
        self.on_scopes(clock, calls.collect(), nonce.is_some())
            .await
    }

    /// Another copy of the job holds room in a scope: the job's record
    /// answers if that copy created it; if not yet, the caller waits a
    /// moment, as for another attempt's lease, and asks again.
    async fn look_again(
        &self,
        entry: &Entry<'_>,
        clock: Clock,
        record: &str,
    ) -> Result<Admission, LedgerError> {
        let args = admission_args("look", entry, String::new());
        let look = self
            .submit(Some(clock), args, vec![record.to_owned()], true)
            .await?;
        if look.values[0] != Code::Absent as i64 {
            return self.decided(entry, &[], look).await;
        }
        let verdict = Verdict::Busy {
            lease_left_ms: COPY_WAIT_MS,
        };
        Ok(Admission::at(look.now_ms, verdict))
    }

    /// Whether Redis says that the job's record does not hold the
    /// reservations of `nonce` (a "create" whose call failed did not
    /// happen, or was lost with a primary that failed over). Asked for a
    /// few seconds while Redis does not answer (a failover takes about as
    /// long); `false` if it still cannot say.
    async fn not_created(&self, record: &str, nonce: u32) -> bool {
        let ours = format!("{nonce} ");
        for _ in 0..NOT_CREATED_TRIES {
            if let Ok(rv) = self.reservations(record).await {
                return !rv.is_some_and(|rv| rv.starts_with(&ours));
            }
            tokio::time::sleep(NOT_CREATED_PAUSE).await;
        }
        false
    }

    /// The reservations a job's record names (`ledger.lua`'s `rv`), if
    /// it has any: its seventh field (a string record), or its field
    /// `rv` (a hash, as earlier versions wrote records).
    async fn reservations(&self, record: &str) -> redis::RedisResult<Option<String>> {
        let mut conn = self.conn.clone();
        let got: redis::RedisResult<Option<String>> =
            redis::cmd("GET").arg(record).query_async(&mut conn).await;
        match got {
            Ok(text) => Ok(text
                .as_deref()
                .and_then(|t| t.split('|').nth(6))
                .filter(|rv| !rv.is_empty())
                .map(str::to_owned)),
            Err(e) if e.code() == Some("WRONGTYPE") => {
                redis::cmd("HGET")
                    .arg(record)
                    .arg("rv")
                    .query_async(&mut conn)
                    .await
            }
            Err(e) => Err(e),
        }
    }

    /// Runs one scope script call per `(key, op, values)`, all at once:
    /// their replies, in order.
    async fn on_scopes(
        &self,
        clock: Clock,
        calls: Vec<(String, &'static str, Vec<String>)>,
        wait: bool,
    ) -> Vec<Result<Reply, LedgerError>> {
        let n = calls.len();
        let mut running = tokio::task::JoinSet::new();
        let clock = clock_arg(clock, &self.keys, std::time::Instant::now());
        for (i, (key, op, values)) in calls.into_iter().enumerate() {
            let (mut conn, replication, clock) =
                (self.conn.clone(), self.replication, clock.clone());
            running.spawn(async move {
                let reply = on_scope(&mut conn, replication, &clock, &key, op, &values, wait);
                (i, reply.await)
            });
        }
        let mut replies: Vec<Option<Result<Reply, LedgerError>>> = (0..n).map(|_| None).collect();
        while let Some(done) = running.join_next().await {
            if let Ok((i, reply)) = done {
                replies[i] = Some(reply);
            }
        }
        replies
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(stopped())))
            .collect()
    }

    /// The answers of [`Self::each_scope`]: if a scope rejects, the first
    /// with the largest wait binds, unless a scope did not answer (its
    /// call failed, or its values make no sense), whose wait may be the
    /// longest: then there is no answer (found by review: a shard that
    /// hung made a mailbox's minute answer for a network's hour). If a
    /// scope rejects or a call fails, the reservations of `suffix` made
    /// are given back.
    async fn gather(
        &self,
        scopes: &[Applied],
        replies: Vec<Result<Reply, LedgerError>>,
        suffix: Option<&str>,
    ) -> Result<Reservations, LedgerError> {
        let (mut held, mut rejected, mut failed) = (Vec::new(), None::<Admission>, None);
        let mut unanswered = None;
        let (mut copy, mut shadow, mut rooms) = (false, None, Rooms::default());
        for (
            Applied {
                scope, key, set, ..
            },
            reply,
        ) in scopes.iter().zip(replies)
        {
            let one = [(*scope, set.clone())];
            let reply = match reply {
                Ok(reply) => reply,
                // A reserve whose reply was lost may have reserved: that one
                // is given back too, found by the job's suffix (left
                // counted, it would reject the job's own retry for the whole
                // window).
                Err(e) => {
                    if suffix.is_some() {
                        held.push((*scope, key.clone(), TIME_UNKNOWN));
                    }
                    unanswered = Some(e);
                    continue;
                }
            };
            if reply.values[0] == 1 {
                held.push((*scope, key.clone(), reply.now_ms));
                let [_, wait, rule, ..] = reply.values;
                let would_bind = u64::try_from(wait)
                    .ok()
                    .filter(|d| *d > 0)
                    .and_then(|d| rule_named(&one, 1, rule, d).map(|rule| (d, rule)));
                shadow = longer(shadow, would_bind);
                if let Some(room) = room_named(&one, 1, &reply.rooms) {
                    rooms.set(room);
                }
                if let Some(acked) = reply.unreplicated {
                    failed = Some(self.unreplicated_reservation(acked));
                }
                continue;
            }
            let wait = |a: &Admission| match a.verdict {
                Verdict::Rejected { retry_after_ms, .. } => retry_after_ms,
                _ => 0,
            };
            match self.no_room(&one, &reply) {
                None => copy = true,
                Some(Ok(verdict @ Verdict::Rejected { retry_after_ms, .. }))
                    if rejected.as_ref().is_none_or(|r| retry_after_ms > wait(r)) =>
                {
                    rejected = Some(Admission::at(reply.now_ms, verdict));
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => unanswered = Some(e),
            }
        }
        if rejected.is_none() && failed.is_none() && unanswered.is_none() && !copy {
            return Ok(Reservations::Held(held, shadow, rooms));
        }
        if let Some(suffix) = suffix {
            self.give_back(suffix, &held).await;
        }
        if copy {
            return Ok(Reservations::Copy);
        }
        if let Some(e) = unanswered {
            return Err(e);
        }
        match (rejected, failed) {
            (Some(rejection), _) => Ok(Reservations::Rejected(rejection)),
            (None, failed) => Err(failed.unwrap_or_else(stopped)),
        }
    }

    /// What a scope without room answered (`one`: its scope and rule set):
    /// `None` if one of the entries that fill it is another copy's of the
    /// job, made within a lease (that copy is being admitted; an older one,
    /// whose worker died before creating the record, just fills the scope);
    /// else its rejection, or why its values make no sense.
    fn no_room(
        &self,
        one: &[(Scope, Arc<RuleSet>)],
        reply: &Reply,
    ) -> Option<Result<Verdict, LedgerError>> {
        let [code, made_at, d, rule, _] = reply.values;
        if code == 2 {
            let lease = i64::try_from(self.keys.lease_ms()).unwrap_or(i64::MAX);
            let now = i64::try_from(reply.now_ms).unwrap_or(i64::MAX);
            if now.saturating_sub(made_at) < lease {
                return None;
            }
        }
        let values = [Code::Rejected as i64, d, 1, rule, 0];
        Some(match verdict(one, &values) {
            Some(verdict @ Verdict::Rejected { .. }) => Ok(verdict),
            _ => Err(LedgerError::Protocol(format!(
                "a scope answered {:?}",
                reply.values
            ))),
        })
    }

    /// Gives back the reservations a refunded record named (`values`: the
    /// reply's code or flag, then t_email, t_ip, t_domain and the nonce, -1
    /// for none). Only spread over shards: elsewhere the script forgot the
    /// admission in the same call.
    pub(super) async fn give_back_refunded(
        &self,
        request: &Request<'_>,
        how: Refund,
        values: &[i64; REPLY_WIDTH],
    ) {
        // The code, one time per scope in `Scope::ALL` order, the nonce. A
        // reply without them pads with zeros; a nonce is never 0.
        let (times, nonce) = (&values[1..=Scope::ALL.len()], values[Scope::ALL.len() + 1]);
        if !self.spread || nonce <= 0 {
            return;
        }
        let registrable = RegistrableDomain::of(request.email, &self.keys.limits.normalize);
        let subject = |scope| match scope {
            Scope::Email => Some(Subject::Email(request.email)),
            Scope::Ip => request.ip.map(Subject::Ip),
            Scope::Domain => Some(Subject::Domain(&registrable)),
        };
        let mut held: Vec<(Scope, String, u64)> = (Scope::ALL.into_iter().zip(times))
            .filter_map(|(scope, &t)| {
                Some((
                    scope,
                    self.keys.key_of(subject(scope)?),
                    u64::try_from(t).ok()?,
                ))
            })
            .collect();
        // The client network's share of the domain's log was reserved at
        // the domain's time, if it applied (giving back what was not
        // reserved removes nothing).
        let mut share = None;
        if let (Some(ip), Some((_, domain, t))) =
            (request.ip, held.iter().find(|(s, ..)| *s == Scope::Domain))
        {
            share = Some((Scope::Domain, self.keys.share_key(domain, ip), *t));
        }
        // A failure stays counted against its requester: its network and
        // that network's share of the domain (renamed: scope.lua's "keep").
        let mut kept = Vec::new();
        if how == Refund::Failed {
            kept.extend(share.take());
            kept.extend(held.iter().filter(|(s, ..)| *s == Scope::Ip).cloned());
            held.retain(|(scope, ..)| *scope != Scope::Ip);
        }
        held.extend(share);
        let suffix = format!("{}:{nonce}", request.id.as_str());
        self.give_back(&suffix, &held).await;
        self.on_reservations(&suffix, &kept, "keep").await;
    }

    /// Gives back the reservations `held` (scope, key, time) of `suffix`.
    /// One that cannot be given back now (Redis away) stays counted until
    /// its window passes: a rejection too many, never an admission too many.
    async fn give_back(&self, suffix: &str, held: &[(Scope, String, u64)]) {
        self.on_reservations(suffix, held, "unreserve").await;
    }

    /// Runs `op` of `scope.lua` ("unreserve", or "keep": a failure's
    /// reservation stays counted, renamed) on each reservation of `held`,
    /// trying a few times over a second.
    async fn on_reservations(&self, suffix: &str, held: &[(Scope, String, u64)], op: &'static str) {
        if held.is_empty() {
            return;
        }
        let mut left: Vec<(String, &'static str, Vec<String>)> = held
            .iter()
            .map(|(_, key, t)| {
                let t = match *t {
                    TIME_UNKNOWN => String::new(),
                    t => t.to_string(),
                };
                (key.clone(), op, vec![t, suffix.to_owned()])
            })
            .collect();
        // A few tries over a second: the call that failed before this one
        // (a dropped connection) may have left the client reconnecting.
        for pause in [0, 100, 300, 600] {
            if left.is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(pause)).await;
            let replies = self.on_scopes(Clock::Server, left.clone(), false).await;
            left = left
                .into_iter()
                .zip(replies)
                .filter_map(|(call, done)| done.is_err().then_some(call))
                .collect();
        }
        if !left.is_empty() {
            tracing::warn!(
                reservations = left.len(),
                op,
                "could not give a reservation back (or mark it a failure's); it counts until its \
                 window passes"
            );
        }
    }

    /// A reservation too few replicas acknowledged: a failover could lose it
    /// and admit past a rule, so it is given back, and the job retried.
    fn unreplicated_reservation(&self, acked: i64) -> LedgerError {
        LedgerError::Unreplicated(format!(
            "{acked} of the {} Redis replicas redis.min_replicas_acked asks for acknowledged \
             a reservation within {} ms; it was given back, and the job is not sent now",
            self.replication.replicas, self.replication.timeout_ms
        ))
    }
}

/// One call of the scope script on `key` at `clock` (a script's time
/// argument: `clock_arg`; see `scope.lua`), as a [`Reply`]:
/// for "peek" and "reserve", 1 (room; reserved at the reply's time), or
/// `[0, 0, wait, rule]` (full), or `[2, t, wait, rule]` (full, and one of
/// its entries is the same job's, made at t); for "unreserve" 1 if the
/// reservation was there.
async fn on_scope(
    conn: &mut Conn,
    replication: Replication,
    clock: &str,
    key: &str,
    op: &str,
    values: &[String],
    wait: bool,
) -> Result<Reply, LedgerError> {
    let mut eval = redis::cmd("EVALSHA");
    eval.arg(SCOPE.get_hash())
        .arg(1)
        .arg(key)
        .arg(op)
        .arg(clock)
        .arg(values);
    let (reply, unreplicated) =
        eval_waiting(conn, Some(Callee::Script(&SCOPE)), eval, replication, wait).await?;
    let r: Vec<i64> = redis::from_redis_value(reply)
        .map_err(|e| LedgerError::Protocol(format!("a scope's reply: {e}")))?;
    let bad = || LedgerError::Protocol(format!("a scope answered {r:?}"));
    // Each as `gather` reads it: room (1) or not (0); a rejection's 0,
    // 0, wait and rule; another copy's entry (2), its time, wait and rule.
    let (values, rooms) = match r.get(1..) {
        Some([done]) => ([*done, 0, 0, 0, 0], Vec::new()),
        Some([1, shadow_wait, shadow]) => ([1, *shadow_wait, *shadow, 0, 0], Vec::new()),
        Some([1, shadow_wait, shadow, room @ ..]) if room.len() == 3 => {
            ([1, *shadow_wait, *shadow, 0, 0], room.to_vec())
        }
        Some([0, wait, rule]) => ([0, 0, *wait, *rule, 0], Vec::new()),
        Some([2, made_at, wait, rule]) => ([2, *made_at, *wait, *rule, 0], Vec::new()),
        _ => return Err(bad()),
    };
    let now_ms = r
        .first()
        .and_then(|t| u64::try_from(*t).ok())
        .ok_or_else(bad)?;
    Ok(Reply {
        now_ms,
        values,
        rooms,
        unreplicated,
    })
}

/// Of two shadow rules that would have bound, with their waits, the one
/// with the longer wait (the first on a tie).
fn longer(a: Option<(u64, RuleRef)>, b: Option<(u64, RuleRef)>) -> Option<(u64, RuleRef)> {
    match (a, b) {
        (Some(x), Some(y)) if y.0 > x.0 => Some(y),
        (Some(x), _) => Some(x),
        (None, y) => y,
    }
}
