mod quotas;
mod spread;

use std::sync::Arc;

use tokio::sync::{Semaphore, mpsc, oneshot};

use super::clock::{self, Mark, Readings};
use super::{Admission, Ending, Entry, Fingerprint, JobRef, Ledger, LedgerError, Refund, Verdict};
use crate::limiter::{Clock, Keyspace, Room, RuleRef, RuleSet, Scope};
use crate::settings::{LimitSettings, RedisSettings};
use crate::store::overrides::OverrideStore;
use crate::store::scripts::{self, LEDGER};
use crate::store::{self as store, Conn};

/// How items share script calls: most items in one call, and calls in
/// flight at once (while they run, new items gather into the next batch).
#[derive(Debug, Clone, Copy)]
struct Batching {
    max_batch: usize,
    max_in_flight: usize,
}

/// One server, or every key in one slot of a cluster: items share calls.
const BATCHED: Batching = Batching {
    max_batch: 64,
    max_in_flight: 2,
};

/// Keys spread over a cluster's shards: each item names keys of its own
/// slot, which no other item's call may touch, so each item is a call of its
/// own, and many are in flight (on the shards' connections).
const ONE_BY_ONE: Batching = Batching {
    max_batch: 1,
    max_in_flight: 64,
};

/// The result codes of `ledger.lua`'s "admit" item, named as in its `CODE` table
/// (a unit test checks the two agree).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Code {
    Rejected = 0,
    Admitted = 1,
    Expired = 2,
    Resumed = 3,
    Busy = 4,
    Sent = 5,
    Unknown = 6,
    Finished = 7,
    Conflict = 8,
    Absent = 9,
    Superseded = 10,
}

/// Every code with its name in `ledger.lua`.
pub(crate) const CODES: [(Code, &str); 11] = [
    (Code::Rejected, "rejected"),
    (Code::Admitted, "admitted"),
    (Code::Expired, "expired"),
    (Code::Resumed, "resumed"),
    (Code::Busy, "busy"),
    (Code::Sent, "sent"),
    (Code::Unknown, "unknown"),
    (Code::Finished, "finished"),
    (Code::Conflict, "conflict"),
    (Code::Absent, "absent"),
    (Code::Superseded, "superseded"),
];

/// The production ledger: records in Redis, shared by every worker.
///
/// Every write is an item of `ledger.lua`'s "batch": items asked while
/// earlier calls are in flight run together in one `EVALSHA` (in arrival
/// order, all at one Redis instant, atomically), so under load the fixed
/// cost of a script call, and its round trip, is shared by the jobs in
/// flight; an idle ledger sends each at once. The script is loaded again
/// on `NOSCRIPT` (e.g. after a Redis restart). The connection is
/// multiplexed and re-established after Redis comes back; a call made
/// while Redis is away fails with [`LedgerError::Redis`], which callers
/// treat as transient.
///
/// With keys spread over a cluster's shards
/// ([`RedisSettings::spreads_keys`]), an admission is a "look" at the
/// job's record, a "reserve" in each scope (concurrently), and a "create"
/// of the record with the reservations; if a scope rejects, every
/// reservation is given back and the largest wait answered. Each call then
/// names one key. A reservation given back may meanwhile have made another
/// request see a rejection it would not have seen (the one weaker point,
/// documented in `docs/contract.md`); nothing is ever admitted past a rule.
#[derive(Clone)]
pub struct RedisLedger {
    conn: Conn,
    keys: Arc<Keyspace>,
    queue: mpsc::Sender<Pending>,
    allow_eviction: bool,
    replication: Replication,
    spread: bool,
}

/// `redis.min_replicas_acked` and its timeout: how a batch that sets a send
/// mark waits for replicas (`WAIT`) before its items are answered.
#[derive(Debug, Clone, Copy)]
struct Replication {
    /// Replicas that must acknowledge; 0 waits for none.
    replicas: u32,
    /// The longest wait, ms (at least 1: `WAIT n 0` would block forever).
    timeout_ms: u64,
}

/// An item waiting for its batch.
struct Pending {
    /// The clock the item is judged by, if it reads one (admit, sending);
    /// items that do not join any batch.
    clock: Option<Clock>,
    /// Its kind, then its values, as `ledger.lua`'s ITEMS take them.
    args: Vec<String>,
    /// Its record key, then its scope keys.
    keys: Vec<String>,
    /// Whether its batch must be acknowledged by the replicas before it is
    /// answered (it may set a send mark).
    wait: bool,
    /// The overrides' rule sets its shape names, by their place in the
    /// shape: each batch numbers them after the configured sets itself (a
    /// batch may hold items built before and after the overrides changed).
    sets: Vec<(usize, Arc<RuleSet>)>,
    reply: oneshot::Sender<Result<Reply, LedgerError>>,
}

/// How many integers answer each item of a batch (`WIDTH` in ledger.lua;
/// keep both in step).
pub(crate) const REPLY_WIDTH: usize = 5;

/// What the script answered for one item.
struct Reply {
    /// The batch's instant, ms (the Redis clock, or the explicit one).
    now_ms: u64,
    /// The item's values: an admission's code and up to four values; for
    /// the other kinds 1 (done) or 0, then what they name, zeros for the
    /// rest.
    values: [i64; REPLY_WIDTH],
    /// An item admitted now: for each of its scope keys, the rule, the
    /// admissions it still allows and its reset (decide.lua's `room`).
    rooms: Vec<i64>,
    /// Replicas that acknowledged the batch, if the item asked to wait and
    /// fewer than `redis.min_replicas_acked` did.
    unreplicated: Option<i64>,
}

impl RedisLedger {
    /// Connects to Redis (failing if it does not answer now) and loads the
    /// scripts, so a bad URL or an unusable server shows at start-up. Must be
    /// called within a Tokio runtime: it starts the batching task, which ends
    /// when the last clone of the ledger is dropped.
    pub async fn connect(
        redis: &RedisSettings,
        limits: &LimitSettings,
    ) -> Result<Self, LedgerError> {
        let mut conn = store::connect(redis)
            .await
            .map_err(|e| unfit(e, &redis.key_prefix))?;
        scripts::preload(&mut conn)
            .await
            .map_err(|e| unfit(e, &redis.key_prefix))?;
        let mut keys = Keyspace::new(&redis.key_prefix, limits);
        keys.clock_guard_ms =
            Some(u64::try_from(redis.max_clock_skew.as_millis()).unwrap_or(u64::MAX));
        let keys = Arc::new(keys);
        let replication = Replication {
            replicas: redis.min_replicas_acked,
            timeout_ms: u64::try_from(redis.replica_ack_timeout.as_millis())
                .unwrap_or(u64::MAX)
                .max(1),
        };
        let spread = redis.spreads_keys();
        if spread && limits.any_supersede() {
            // Settings refuse it too; a ledger built without them must not
            // quietly never supersede.
            return Err(LedgerError::Unfit(
                "limits.supersede needs every key in one slot: give redis.key_prefix a hash tag"
                    .into(),
            ));
        }
        let batching = if spread { ONE_BY_ONE } else { BATCHED };
        let (queue, rx) = mpsc::channel(4 * batching.max_batch.max(batching.max_in_flight));
        tokio::spawn(dispatch(
            rx,
            conn.clone(),
            keys.clone(),
            replication,
            batching,
        ));
        Ok(Self {
            conn,
            keys,
            queue,
            allow_eviction: redis.allow_eviction,
            replication,
            spread,
        })
    }

    /// The overrides this ledger judges by: stored on its connection, and
    /// put in force in its table ([`OverrideStore::start`] polls them).
    pub fn overrides(&self) -> OverrideStore {
        OverrideStore::on(self.conn.clone(), self.keys.clone())
    }

    /// A Redis error as the ledger reports it: a refusal that will not go
    /// away by itself (an ACL that forbids the script or the keys, a
    /// read-only replica) is [`LedgerError::Unfit`], naming the cause.
    fn unfit(&self, e: redis::RedisError) -> LedgerError {
        unfit(e, &self.keys.prefix)
    }

    /// Runs one item (`args`: its kind and values) in the next batch.
    async fn submit(
        &self,
        clock: Option<Clock>,
        args: Vec<String>,
        keys: Vec<String>,
        wait: bool,
    ) -> Result<Reply, LedgerError> {
        answered(self.enqueue(clock, args, keys, wait).await?).await
    }

    /// [`Self::submit`] of an admission whose shape names the overrides'
    /// rule sets `sets`.
    async fn submit_judged(
        &self,
        clock: Clock,
        item: (Vec<String>, Vec<String>),
        wait: bool,
        sets: Vec<(usize, Arc<RuleSet>)>,
    ) -> Result<Reply, LedgerError> {
        let (reply, rx) = oneshot::channel();
        let (args, keys) = item;
        let pending = Pending {
            clock: Some(clock),
            args,
            keys,
            wait,
            sets,
            reply,
        };
        self.queue.send(pending).await.map_err(|_| stopped())?;
        answered(rx).await
    }

    /// Queues one item for the next batch; its answer arrives on the
    /// receiver (so that several items can be queued before any is awaited).
    async fn enqueue(
        &self,
        clock: Option<Clock>,
        args: Vec<String>,
        keys: Vec<String>,
        wait: bool,
    ) -> Result<Answer, LedgerError> {
        let (reply, rx) = oneshot::channel();
        let pending = Pending {
            clock,
            args,
            keys,
            wait,
            sets: Vec::new(),
            reply,
        };
        self.queue.send(pending).await.map_err(|_| stopped())?;
        Ok(rx)
    }

    /// Runs a "release", "settle" or "answered" item on `job`'s record (with
    /// `scope_keys` after it): the script's reply.
    async fn mark(
        &self,
        job: &JobRef<'_>,
        clock: Option<Clock>,
        args: Vec<String>,
        scope_keys: Vec<String>,
        wait: bool,
    ) -> Result<Reply, LedgerError> {
        let mut keys = Vec::with_capacity(1 + scope_keys.len());
        keys.push(self.keys.record_key(job.request.id));
        keys.extend(scope_keys);
        self.submit(clock, args, keys, wait).await
    }

    /// After `job`'s send mark was set by a batch too few replicas
    /// acknowledged (`acked`): gives the mark back, so that a retry resumes
    /// the job rather than finding its delivery unknown, and fails.
    async fn unreplicated(&self, job: &JobRef<'_>, acked: i64) -> LedgerError {
        if let Err(e) = self.release(job).await {
            tracing::warn!(error = %e, "could not give back a send mark the replicas did not acknowledge");
        }
        LedgerError::Unreplicated(format!(
            "{acked} of the {} Redis replicas redis.min_replicas_acked asks for acknowledged \
             the send mark within {} ms; it was given back, and the job is not sent now",
            self.replication.replicas, self.replication.timeout_ms
        ))
    }
}

/// What a queued item's batch answered for it.
async fn answered(answer: Answer) -> Result<Reply, LedgerError> {
    answer.await.map_err(|_| stopped())?
}

fn stopped() -> LedgerError {
    LedgerError::Protocol("the ledger's batching task stopped".into())
}

/// See [`RedisLedger::unfit`].
fn unfit(e: redis::RedisError, prefix: &str) -> LedgerError {
    match store::conn::refusal(&e, prefix) {
        Some(why) => LedgerError::Unfit(why),
        None => e.into(),
    }
}

/// Gathers queued items into batches and runs up to
/// `batching.max_in_flight` script calls at once.
async fn dispatch(
    mut rx: mpsc::Receiver<Pending>,
    conn: Conn,
    keys: Arc<Keyspace>,
    replication: Replication,
    batching: Batching,
) {
    let in_flight = Arc::new(Semaphore::new(batching.max_in_flight));
    let mut carried: Option<Pending> = None;
    loop {
        // Wait for a free slot first: items arriving meanwhile join the batch.
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        let first = match carried.take() {
            Some(p) => p,
            None => match rx.recv().await {
                Some(p) => p,
                None => return,
            },
        };
        // Callers whose answers just arrived are about to ask again: let them
        // run before the batch closes (no timer, so an idle ledger adds no
        // latency).
        tokio::task::yield_now().await;
        let mut clock = first.clock;
        let mut batch = vec![first];
        while batch.len() < batching.max_batch {
            match rx.try_recv() {
                // One batch is one instant: an item that reads another
                // explicit clock ends the batch.
                Ok(p) if clock.is_none() || p.clock.is_none() || p.clock == clock => {
                    clock = clock.or(p.clock);
                    batch.push(p);
                }
                Ok(p) => {
                    carried = Some(p);
                    break;
                }
                Err(_) => break,
            }
        }
        let (mut conn, keys) = (conn.clone(), keys.clone());
        tokio::spawn(async move {
            let clock = clock.unwrap_or(Clock::Server);
            match run_batch(&mut conn, &keys, replication, clock, &batch).await {
                Ok(replies) => {
                    for (p, r) in batch.into_iter().zip(replies) {
                        let _ = p.reply.send(Ok(r));
                    }
                }
                Err(e) => {
                    for p in batch {
                        let _ = p.reply.send(Err(e.clone()));
                    }
                }
            }
            drop(permit);
        });
    }
}

/// A job's attempt as the script takes it (at least 1).
/// A fresh id for one script call's item: the item run again (a Redis
/// Cluster client sends a call again after its reply was lost) finds it in
/// the record, and answers as it did the first time.
fn call_id() -> String {
    format!("{:x}", uuid::Uuid::new_v4().as_u64_pair().0)
}

/// The attempt as the record names its owner: the attempt and the holder,
/// `<attempt>:<holder, hex>` (see [`JobRef::holder`]).
fn attempt(job: &JobRef<'_>) -> String {
    format!("{}:{:x}", job.attempt.max(1), job.holder)
}

/// A script's time argument: the given time, or Redis's own clock, which
/// the script refuses to decide by if it is further than
/// [`Keyspace::clock_guard_ms`] from where it should be
/// ([`Keyspace::expected_redis_ms`]): a step of Redis's clock, shared with
/// this host's wall clock or not, is refused from its first moment.
fn clock_arg(clock: Clock, keys: &Keyspace) -> String {
    match (clock, keys.clock_guard_ms) {
        (Clock::At(ms), _) => ms.to_string(),
        (Clock::Server, Some(max)) => format!("~{}:{max}", keys.expected_redis_ms()),
        (Clock::Server, None) => String::new(),
    }
}

/// Runs `batch` in one script call; if an item asks to wait and
/// `replication` names replicas, `WAIT`s for them in the same pipeline (on
/// the same connection, so the wait covers the script's writes).
async fn run_batch(
    conn: &mut Conn,
    keys: &Keyspace,
    replication: Replication,
    clock: Clock,
    batch: &[Pending],
) -> Result<Vec<Reply>, LedgerError> {
    let (mut item_keys, mut args) = (Vec::new(), Vec::new());
    // The overrides' sets, numbered for this batch after the configured
    // ones, and the shapes that name them rewritten so.
    let mut sets: Vec<(usize, Arc<RuleSet>)> = Vec::new();
    let mut shapes: Vec<String> = Vec::new();
    for p in batch {
        let mut shape = None;
        for (at, set) in &p.sets {
            let index = match sets.iter().find(|(_, s)| Arc::ptr_eq(s, set)) {
                Some((index, _)) => *index,
                None => {
                    let index = keys.sets.len() + sets.len();
                    sets.push((index, set.clone()));
                    index
                }
            };
            let shape = shape.get_or_insert_with(|| p.args[SHAPE_ARG].clone());
            put_shape(shape, *at, index);
        }
        shapes.extend(shape);
    }
    let mut rewritten = shapes.iter();
    for p in batch {
        item_keys.extend(p.keys.iter().map(String::as_str));
        for (i, arg) in p.args.iter().enumerate() {
            let arg = match (i, p.sets.is_empty()) {
                (SHAPE_ARG, false) => rewritten.next().map_or(arg.as_str(), String::as_str),
                _ => arg.as_str(),
            };
            args.push(arg);
        }
    }
    let mut eval = redis::cmd("EVALSHA");
    eval.arg(LEDGER.get_hash())
        .arg(item_keys.len())
        .arg(&item_keys)
        .arg("batch")
        .arg(clock_arg(clock, keys))
        .arg(keys.record_keep_ms())
        .arg(keys.lease_ms())
        .arg(keys.rule_set_args(&sets))
        .arg(&args);
    let wait = batch.iter().any(|p| p.wait);
    let (reply, unreplicated) = eval_waiting(conn, &LEDGER, eval, replication, wait).await?;
    let reply: Vec<i64> = redis::from_redis_value(reply)
        .map_err(|e| LedgerError::Protocol(format!("a batch's reply: {e}")))?;
    let bad = || LedgerError::Protocol(format!("{} values for {} items", reply.len(), batch.len()));
    let fixed = 1 + REPLY_WIDTH * batch.len();
    if reply.len() < fixed {
        return Err(bad());
    }
    let now_ms = u64::try_from(reply[0]).map_err(|_| bad())?;
    // After the items, the rooms of those admitted now, in order.
    let mut rooms = reply[fixed..].iter().copied();
    let replies = reply[1..fixed]
        .chunks_exact(REPLY_WIDTH)
        .zip(batch)
        .map(|(r, p)| {
            let admitted = p.args[0] == "admit" && r[0] == Code::Admitted as i64;
            let keys = if admitted {
                usize::try_from(r[4]).unwrap_or(0)
            } else {
                0
            };
            Reply {
                now_ms,
                values: [r[0], r[1], r[2], r[3], r[4]],
                rooms: rooms.by_ref().take(3 * keys).collect(),
                unreplicated: unreplicated.filter(|_| p.wait),
            }
        })
        .collect();
    match rooms.next() {
        None => Ok(replies),
        Some(_) => Err(bad()),
    }
}

/// Runs `eval`, an `EVALSHA` of `script` (loaded again on `NOSCRIPT`, e.g.
/// after a Redis restart), and, if `wait` and `replication` names
/// replicas, `WAIT`s for them in the same pipeline (on the same connection,
/// so the wait covers the script's writes). Returns the script's reply
/// and, if fewer replicas than asked acknowledged, how many did.
async fn eval_waiting(
    conn: &mut Conn,
    script: &redis::Script,
    eval: redis::Cmd,
    replication: Replication,
    wait: bool,
) -> Result<(redis::Value, Option<i64>), LedgerError> {
    let mut pipe = redis::pipe();
    pipe.add_command(eval);
    let wait = wait && replication.replicas > 0;
    if wait {
        pipe.cmd("WAIT")
            .arg(replication.replicas)
            .arg(replication.timeout_ms);
    }
    let values = match pipe.query_async::<Vec<redis::Value>>(conn).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            script.prepare_invoke().load_async(conn).await?;
            pipe.query_async(conn).await?
        }
        other => other?,
    };
    let mut values = values.into_iter();
    let (Some(reply), acked) = (values.next(), values.next()) else {
        return Err(LedgerError::Protocol(
            "an empty reply to a script call".into(),
        ));
    };
    let acked: Option<i64> = acked
        .map(redis::from_redis_value)
        .transpose()
        .map_err(|e| LedgerError::Protocol(format!("WAIT's reply: {e}")))?;
    Ok((
        reply,
        acked.filter(|n| *n < i64::from(replication.replicas)),
    ))
}

/// The rule a script names by its 1-based scope (`scopes`: the scope and
/// rule set of each of the request's scope keys) and 1-based place in that
/// scope's rule set, `wait` its wait; `None` if there is no such rule. A
/// deny is named as a rule of max 0 whose window is the wait.
fn rule_named(
    scopes: &[(Scope, Arc<RuleSet>)],
    scope: i64,
    rule: i64,
    wait: u64,
) -> Option<RuleRef> {
    let (scope, set) = scopes.get(usize::try_from(scope - 1).ok()?)?;
    if set.deny_until_ms.is_some() {
        return Some(RuleRef {
            scope: *scope,
            window_ms: wait,
            max: 0,
        });
    }
    let rule = set.rules.get(usize::try_from(rule - 1).ok()?)?;
    Some(RuleRef::of(*scope, rule))
}

/// The room a script names for its 1-based scope `scope` (`scopes` as for
/// [`rule_named`]): `[rule, remaining, reset_ms]`; `None` for a scope with
/// no enforced rule (rule 0) or values that make no sense.
fn room_named(scopes: &[(Scope, Arc<RuleSet>)], scope: i64, room: &[i64]) -> Option<Room> {
    let [rule, remaining, reset_ms] = *room else {
        return None;
    };
    Some(Room {
        rule: rule_named(scopes, scope, rule, 0)?,
        remaining: u32::try_from(remaining).ok()?,
        reset_ms: u64::try_from(reset_ms).ok()?,
    })
}

/// An admission's reply values as a [`Verdict`] (`scopes`: the scope
/// and rule set of each of its scope keys); `None` if they make no sense.
fn verdict(scopes: &[(Scope, Arc<RuleSet>)], r: &[i64; REPLY_WIDTH]) -> Option<Verdict> {
    let num = |i: usize| u64::try_from(r[i]).ok();
    let flag = |i: usize| r[i] == 1;
    let (code, _) = CODES.iter().find(|(c, _)| *c as i64 == r[0])?;
    Some(match code {
        Code::Rejected => Verdict::Rejected {
            retry_after_ms: num(1)?,
            rule: rule_named(scopes, r[2], r[3], num(1)?)?,
        },
        Code::Admitted => Verdict::Admitted,
        Code::Expired => Verdict::Expired,
        Code::Resumed => Verdict::Resumed {
            admitted_at_ms: num(1)?,
        },
        Code::Busy => Verdict::Busy {
            lease_left_ms: num(2)?,
        },
        Code::Sent => Verdict::Sent {
            admitted_at_ms: num(1)?,
            by_owner: flag(2),
            answered: flag(3),
        },
        Code::Unknown => Verdict::Unknown {
            by_owner: flag(2),
            answered: flag(3),
        },
        Code::Finished => Verdict::Finished {
            how: Refund::from_code(u8::try_from(r[1]).ok()?)?,
            answered: flag(2),
        },
        Code::Conflict => Verdict::Conflict,
        Code::Superseded => Verdict::Superseded { refunded: flag(1) },
        Code::Absent => return None,
    })
}

impl Ledger for RedisLedger {
    async fn admit(&self, entry: &Entry<'_>, clock: Clock) -> Result<Admission, LedgerError> {
        if self.spread {
            return self.admit_spread(entry, clock).await;
        }
        let job = &entry.job;
        let (applicable, by_override) = self.keys.applicable_by(&job.request);
        let mut keys = Vec::with_capacity(1 + applicable.len());
        keys.push(self.keys.record_key(job.request.id));
        let mut shape = String::with_capacity(2 * applicable.len());
        let mut scopes = Vec::with_capacity(applicable.len());
        let mut sets = Vec::new();
        for (at, a) in applicable.into_iter().enumerate() {
            push_shape(&mut shape, a.index);
            keys.push(a.key);
            if a.index >= self.keys.sets.len() {
                // Numbered by its batch.
                sets.push((at, a.set.clone()));
            }
            scopes.push((a.scope, a.set));
        }
        let mut args = admission_args("admit", entry, shape);
        if let Some(latest) = self.keys.latest_key(&job.request) {
            keys.push(latest);
            // The admission's `made`: when the job was made (if known),
            // and the skew.
            if let Some(made) = args.last_mut() {
                let at = (entry.made_at_ms.map(|ms| ms.to_string())).unwrap_or_default();
                *made = format!("{at},{}", self.keys.supersede_skew_ms());
            }
        }
        let reply = (self.submit_judged(clock, (args, keys), entry.send_now, sets)).await?;
        let mut admission = self.decided(entry, &scopes, reply).await?;
        admission.by_override = by_override;
        Ok(admission)
    }

    async fn sending(&self, job: &JobRef<'_>, clock: Clock) -> Result<bool, LedgerError> {
        let args = vec![
            "sending".to_owned(),
            job.ticket.as_str().to_owned(),
            attempt(job),
            call_id(),
        ];
        let reply = self.mark(job, Some(clock), args, Vec::new(), true).await?;
        let done = reply.values[0] == 1;
        match reply.unreplicated {
            Some(acked) if done => Err(self.unreplicated(job, acked).await),
            _ => Ok(done),
        }
    }

    async fn release(&self, job: &JobRef<'_>) -> Result<bool, LedgerError> {
        let args = vec![
            "release".to_owned(),
            job.ticket.as_str().to_owned(),
            attempt(job),
        ];
        let reply = self.mark(job, None, args, Vec::new(), false).await?;
        Ok(reply.values[0] == 1)
    }

    async fn settle(
        &self,
        job: &JobRef<'_>,
        ending: &Ending,
        answered: bool,
    ) -> Result<bool, LedgerError> {
        let how = match ending {
            Ending::Sent => b's',
            Ending::Unknown => b'u',
            Ending::Refund(r) => r.code(),
        };
        // A refund takes the admission out of every scope log (spread over
        // shards: the reservations the record names, given back after).
        let scope_keys: Vec<String> = match ending {
            Ending::Refund(..) if !self.spread => self
                .keys
                .applicable(&job.request)
                .into_iter()
                .map(|a| a.key)
                .collect(),
            _ => Vec::new(),
        };
        let args = vec![
            "settle".to_owned(),
            job.ticket.as_str().to_owned(),
            attempt(job),
            job.request.id.as_str().to_owned(),
            char::from(how).to_string(),
            if answered { "1" } else { "0" }.to_owned(),
            scope_keys.len().to_string(),
        ];
        let reply = self.mark(job, None, args, scope_keys, false).await?;
        if let Ending::Refund(..) = ending {
            // Also when asked again after a lost reply (0, and the names).
            self.give_back_refunded(&job.request, &reply.values).await;
        }
        Ok(reply.values[0] == 1)
    }

    async fn answered(&self, job: &JobRef<'_>) -> Result<bool, LedgerError> {
        let args = vec!["answered".to_owned(), job.ticket.as_str().to_owned()];
        let reply = self.mark(job, None, args, Vec::new(), false).await?;
        Ok(reply.values[0] == 1)
    }

    async fn health(&self) -> Result<(), LedgerError> {
        let probe: Result<i64, _> = LEDGER
            .key(format!("{}probe", self.keys.prefix))
            .arg("probe")
            .invoke_async(&mut self.conn.clone())
            .await;
        probe.map_err(|e| self.unfit(e))?;
        // Spread over shards, every primary holds mailgate's keys.
        let on = (!self.spread).then_some(self.keys.prefix.as_str());
        let infos = self
            .conn
            .info("memory", on)
            .await
            .map_err(|e| match e.code() {
                Some("NOPERM") => LedgerError::Unfit(format!(
                    "the Redis user may not run INFO ({e}); mailgate reads `INFO memory` to \
                     check that Redis never evicts its keys: grant it +info"
                )),
                _ => self.unfit(e),
            })?;
        let evicting = infos.iter().find_map(|info| {
            let policy = info
                .lines()
                .find_map(|l| l.strip_prefix("maxmemory_policy:"))
                .map(str::trim)
                .unwrap_or("noeviction");
            (policy != "noeviction").then_some(policy)
        });
        if let Some(policy) = evicting
            && !self.allow_eviction
        {
            return Err(LedgerError::Unfit(format!(
                "Redis evicts keys (maxmemory-policy {policy}): under memory pressure it would \
                 drop limiter logs and job records, admitting over the limits and mailing jobs \
                 twice; set maxmemory-policy noeviction, or redis.allow_eviction = true to \
                 accept that"
            )));
        }
        self.replicas_connected().await
    }

    async fn clocks(&self) -> Result<Option<Readings>, LedgerError> {
        let (wall, boot) = (crate::domain::now_ms(), clock::boot_ms());
        let nodes = self.conn.times().await?;
        let rtt_ms = clock::boot_ms().saturating_sub(boot);
        if let Some((_, t)) = nodes.first() {
            *self
                .keys
                .redis_clock
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) =
                Some((*t, boot.saturating_add(rtt_ms / 2)));
        }
        Ok(Some(Readings {
            nodes,
            wall_ms: wall.saturating_add(rtt_ms / 2),
            rtt_ms,
            boot_ms: boot.saturating_add(rtt_ms / 2),
        }))
    }

    async fn watch_clock(
        &self,
        agrees: bool,
        stepped: Option<u64>,
    ) -> Result<Option<Mark>, LedgerError> {
        let how = match (stepped, agrees) {
            (Some(ahead), _) => format!("step:{ahead}"),
            (None, true) => "1".to_owned(),
            (None, false) => "0".to_owned(),
        };
        let (found, until) = self.clock_op(&how).await?;
        if found {
            tracing::error!(
                "Redis expired a key before its time: its clock ran more than an hour ahead; \
                 every worker stops admitting"
            );
        }
        if until == 0 {
            return Ok(None);
        }
        let mark: Option<String> = redis::cmd("GET")
            .arg(self.clock_keys()[0].as_str())
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(Some(mark.as_deref().and_then(Mark::decode).unwrap_or(
            Mark {
                until_ms: until,
                seen_ms: 0,
                since_ms: 0,
            },
        )))
    }

    fn horizon_ms(&self) -> u64 {
        self.keys.horizon_ms()
    }
}

impl RedisLedger {
    /// The clock watch's keys (`ledger.lua`'s "clock"): the mark, the
    /// canary and when it was last refreshed, under the prefix and in one
    /// slot (the prefix's hash tag, or without one `{clock}`).
    fn clock_keys(&self) -> [String; 3] {
        let mark = format!("{}{{clock}}", self.keys.prefix);
        [
            mark.clone(),
            format!("{mark}:canary"),
            format!("{mark}:since"),
        ]
    }

    /// Runs `ledger.lua`'s "clock" as `how`: whether it found a loss (or,
    /// on "accept", removed a mark), and the standing mark's until (0:
    /// none).
    async fn clock_op(&self, how: &str) -> Result<(bool, u64), LedgerError> {
        let life = clock::canary_ms(self.keys.clock_guard_ms.unwrap_or(0));
        let hold = self.keys.horizon_ms();
        let mut script = LEDGER.prepare_invoke();
        for key in self.clock_keys() {
            script.key(key);
        }
        let reply: Vec<u64> = script
            .arg("clock")
            .arg(how)
            .arg(life)
            .arg(hold)
            .invoke_async(&mut self.conn.clone())
            .await?;
        match reply[..] {
            [_, until, found] => Ok((found == 1, until)),
            _ => Err(LedgerError::Protocol(format!("a clock reply: {reply:?}"))),
        }
    }

    /// Removes a [`Mark`] (an operator accepts that codes admitted before
    /// Redis's clock ran ahead may be mailed again) and re-arms the canary;
    /// whether there was one.
    pub async fn clear_clock_mark(&self) -> Result<bool, LedgerError> {
        Ok(self.clock_op("accept").await?.0)
    }
}

impl RedisLedger {
    /// With `redis.min_replicas_acked` set: whether the primary has that
    /// many replicas online now (connected and synced; if not, no job can
    /// be sent).
    async fn replicas_connected(&self) -> Result<(), LedgerError> {
        let wanted = self.replication.replicas;
        if wanted == 0 {
            return Ok(());
        }
        let on = (!self.spread).then_some(self.keys.prefix.as_str());
        let infos = self
            .conn
            .info("replication", on)
            .await
            .map_err(|e| self.unfit(e))?;
        // `slave0:ip=…,port=…,state=online,offset=…,lag=…`: a replica still
        // in its first sync is connected but acknowledges nothing yet. Spread
        // over shards, the primary with the fewest counts.
        let online = infos
            .iter()
            .map(|info| {
                info.lines()
                    .filter(|l| l.starts_with("slave") && l.contains("state=online"))
                    .count()
            })
            .min()
            .unwrap_or(0);
        if online < wanted as usize {
            return Err(LedgerError::Unreplicated(format!(
                "the Redis primary has {online} replicas online and \
                 redis.min_replicas_acked is {wanted}: no job can be sent until enough are back"
            )));
        }
        Ok(())
    }
}

/// The answer to a queued item.
type Answer = oneshot::Receiver<Result<Reply, LedgerError>>;

impl RedisLedger {
    /// An "admit", "look" or "create" reply as the caller's [`Admission`]
    /// (`scopes`: the scope and rule set of each scope key of an "admit").
    /// A send mark too few replicas acknowledged is given back, and fails;
    /// an unsent admission refunded as expired gives its reservations back.
    async fn decided(
        &self,
        entry: &Entry<'_>,
        scopes: &[(Scope, Arc<RuleSet>)],
        reply: Reply,
    ) -> Result<Admission, LedgerError> {
        let verdict = verdict(scopes, &reply.values).ok_or_else(|| {
            LedgerError::Protocol(format!("an admission answered {:?}", reply.values))
        })?;
        // Admitted as sending: the mark must reach the replicas first.
        if let (Verdict::Admitted | Verdict::Resumed { .. }, Some(acked)) =
            (verdict, reply.unreplicated)
            && entry.send_now
        {
            return Err(self.unreplicated(&entry.job, acked).await);
        }
        if verdict == Verdict::Expired {
            self.give_back_refunded(&entry.job.request, &reply.values)
                .await;
        }
        // An admission names the shadow rule that would have rejected it
        // (0: none; a "create" never names one: its scopes answered it).
        let shadow = match (verdict, reply.values[2]) {
            (Verdict::Admitted, s) if s > 0 => rule_named(scopes, s, reply.values[3], 0),
            _ => None,
        };
        let mut admission = Admission::at(reply.now_ms, verdict);
        admission.shadow = shadow;
        for (s, room) in (1..).zip(reply.rooms.chunks_exact(3)) {
            if let Some(room) = room_named(scopes, s, room) {
                admission.rooms.set(room);
            }
        }
        Ok(admission)
    }
}

/// An admission item's kind and values (`last`: the shape of an "admit",
/// nothing for a "look", the reservations of a "create"); its `made` is
/// left empty (an "admit" whose purpose supersedes sets it).
fn admission_args(kind: &str, entry: &Entry<'_>, last: String) -> Vec<String> {
    let job = &entry.job;
    vec![
        kind.to_owned(),
        job.request.id.as_str().to_owned(),
        Fingerprint::of(&job.request).as_str().to_owned(),
        job.ticket.as_str().to_owned(),
        attempt(job),
        format!("{}:{}", if entry.send_now { 1 } else { 0 }, call_id()),
        entry
            .expires_at_ms
            .map(|ms| ms.to_string())
            .unwrap_or_default(),
        last,
        // `made`: set by an "admit" whose purpose supersedes.
        String::new(),
    ]
}

/// Appends rule set `set` (0-based) to a shape: its 1-based number in two
/// base-64 digits from '0' (see `decide.lua`). Settings allow at most 100
/// purposes, so at most 303 sets, far below the 4095 two digits hold (found
/// by review: one character per set ran past ASCII at the 79th set, and
/// every batch with such an admission failed).
fn push_shape(shape: &mut String, set: usize) {
    let n = (set + 1).min(4095);
    shape.push(char::from(b'0' + (n / 64) as u8));
    shape.push(char::from(b'0' + (n % 64) as u8));
}

/// Where an "admit" item's shape is among its kind and values.
const SHAPE_ARG: usize = 7;

/// Sets the rule set of a shape's `at`-th key (0-based) to `set`.
fn put_shape(shape: &mut String, at: usize, set: usize) {
    let mut two = String::with_capacity(2);
    push_shape(&mut two, set);
    if shape.len() >= 2 * at + 2 {
        shape.replace_range(2 * at..2 * at + 2, &two);
    }
}
