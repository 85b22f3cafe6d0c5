//! The ledger's batching: items asked while earlier script calls are in
//! flight gather into the next call of `ledger.lua`'s "batch", all at one
//! Redis instant; an idle ledger sends each at once.

use std::sync::Arc;

use tokio::sync::{Semaphore, mpsc, oneshot};

use super::replicas::Replication;
use super::reply::{Code, REPLY_WIDTH, Reply};
use super::{RedisLedger, push_shape};
use crate::ledger::{JobRef, LedgerError};
use crate::limiter::{Clock, Keyspace, RuleSet, words};
use crate::store::Conn;
use crate::store::scripts::{Calls, FunctionLibrary, LEDGER, LEDGER_LIBRARY};

/// How items share script calls: most items in one call, and calls in
/// flight at once (while they run, new items gather into the next batch).
#[derive(Debug, Clone, Copy)]
pub(super) struct Batching {
    pub(super) max_batch: usize,
    pub(super) max_in_flight: usize,
}

/// One server, or every key in one slot of a cluster: items share calls.
pub(super) const BATCHED: Batching = Batching {
    max_batch: 64,
    max_in_flight: 2,
};

/// Keys spread over a cluster's shards: each item names keys of its own
/// slot, which no other item's call may touch, so each item is a call of its
/// own, and many are in flight (on the shards' connections).
pub(super) const ONE_BY_ONE: Batching = Batching {
    max_batch: 1,
    max_in_flight: 64,
};

/// An item waiting for its batch.
pub(super) struct Pending {
    /// The clock the item is judged by, if it reads one (admit);
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
    /// When it was asked for: a call is judged late (`STALE`, see
    /// [`clock_arg`]) from its oldest item's asking, not from the moment
    /// the batch left, so an item that waited here behind calls a frozen
    /// Redis held is as late as those calls.
    asked: std::time::Instant,
    reply: oneshot::Sender<Result<Reply, LedgerError>>,
}

/// The answer to a queued item.
pub(super) type Answer = oneshot::Receiver<Result<Reply, LedgerError>>;

impl RedisLedger {
    /// Runs one item (`args`: its kind and values) in the next batch.
    pub(super) async fn submit(
        &self,
        clock: Option<Clock>,
        args: Vec<String>,
        keys: Vec<String>,
        wait: bool,
    ) -> Result<Reply, LedgerError> {
        answered(self.enqueue(clock, args, keys, wait).await?).await
    }

    /// [`Self::submit`] of an admission (asked for at the instant beside
    /// its clock) whose shape names the overrides' rule sets `sets`.
    pub(super) async fn submit_judged(
        &self,
        (clock, asked): (Clock, std::time::Instant),
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
            asked,
            reply,
        };
        self.queue.send(pending).await.map_err(|_| stopped())?;
        answered(rx).await
    }

    /// Queues one item for the next batch; its answer arrives on the
    /// receiver (so that several items can be queued before any is awaited).
    pub(super) async fn enqueue(
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
            asked: std::time::Instant::now(),
            reply,
        };
        self.queue.send(pending).await.map_err(|_| stopped())?;
        Ok(rx)
    }

    /// Runs a "release", "settle" or "answered" item on `job`'s record (with
    /// `scope_keys` after it): the script's reply.
    pub(super) async fn mark(
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
}

/// What a queued item's batch answered for it.
pub(super) async fn answered(answer: Answer) -> Result<Reply, LedgerError> {
    answer.await.map_err(|_| stopped())?
}

/// The error of an item whose batching task is gone.
pub(super) fn stopped() -> LedgerError {
    LedgerError::Protocol("the ledger's batching task stopped".into())
}

/// An item a batching queue carries: one that may read an explicit clock
/// (a batch is one instant, so items of two explicit clocks never share
/// one).
pub(super) trait Queued: Send + 'static {
    /// The clock it is judged by, if it reads one.
    fn clock(&self) -> Option<Clock>;
    /// When it was asked for (a call is judged late from its oldest
    /// item's asking: see [`guard`]).
    fn asked(&self) -> std::time::Instant;
}

impl Queued for Pending {
    fn clock(&self) -> Option<Clock> {
        self.clock
    }

    fn asked(&self) -> std::time::Instant {
        self.asked
    }
}

/// Gathers queued items into batches of at most `batching.max_batch` and
/// runs up to `batching.max_in_flight` of them at once with `run` (given
/// the batch and its clock); ends when every sender is gone.
pub(super) async fn gather<T, F, Fut>(mut rx: mpsc::Receiver<T>, batching: Batching, run: F)
where
    T: Queued,
    F: Fn(Vec<T>, Clock) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let in_flight = Arc::new(Semaphore::new(batching.max_in_flight));
    let mut carried: Option<T> = None;
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
        let mut clock = first.clock();
        let mut batch = vec![first];
        while batch.len() < batching.max_batch {
            match rx.try_recv() {
                // One batch is one instant: an item that reads another
                // explicit clock ends the batch.
                Ok(p) if clock.is_none() || p.clock().is_none() || p.clock() == clock => {
                    clock = clock.or(p.clock());
                    batch.push(p);
                }
                Ok(p) => {
                    carried = Some(p);
                    break;
                }
                Err(_) => break,
            }
        }
        let running = run(batch, clock.unwrap_or(Clock::Server));
        tokio::spawn(async move {
            running.await;
            drop(permit);
        });
    }
}

/// Runs the queued items' batches, each one script call.
pub(super) async fn dispatch(
    rx: mpsc::Receiver<Pending>,
    conn: Conn,
    keys: Arc<Keyspace>,
    replication: Replication,
    batching: Batching,
    calls: Calls,
) {
    gather(rx, batching, move |batch, clock| {
        let (mut conn, keys) = (conn.clone(), keys.clone());
        async move {
            let replies = run_batch(&mut conn, &keys, replication, calls, clock, &batch).await;
            answer_each(batch, replies, |p| p.reply);
        }
    })
    .await;
}

/// Sends each item of `batch` its answer (`answers`: one per item, in
/// order), or the call's error to every one (`reply`: where an item's
/// answer goes).
pub(super) fn answer_each<T, R>(
    batch: Vec<T>,
    answers: Result<Vec<R>, LedgerError>,
    reply: impl Fn(T) -> oneshot::Sender<Result<R, LedgerError>>,
) {
    match answers {
        Ok(answers) => {
            for (item, answer) in batch.into_iter().zip(answers) {
                let _ = reply(item).send(Ok(answer));
            }
        }
        Err(e) => {
            for item in batch {
                let _ = reply(item).send(Err(e.clone()));
            }
        }
    }
}

/// A script's time argument: the given time, or Redis's own clock, which
/// the script refuses to decide by if it is further than
/// [`Keyspace::clock_guard_ms`] from where it should be
/// ([`Keyspace::expected_redis_ms`]): a step of Redis's clock, shared with
/// this host's wall clock or not, is refused from its first moment. Where
/// Redis's clock should be is reckoned for `asked`, when the call's oldest
/// request was made: the script then refuses (`STALE`) a call that runs
/// more than a moment after that, however long the request waited in this
/// process first (behind calls that a frozen Redis held).
pub(super) fn clock_arg(clock: Clock, keys: &Keyspace, asked: std::time::Instant) -> String {
    match (clock, guard(keys, asked)) {
        (Clock::At(ms), _) => ms.to_string(),
        (Clock::Server, Some((expected, max))) => format!("~{expected}:{max}"),
        (Clock::Server, None) => String::new(),
    }
}

/// Where the worker reckons Redis's clock was when `asked`, and how far
/// (ms) Redis's own may be from it ([`Keyspace::clock_guard_ms`]); `None`
/// where no guard is set.
pub(super) fn guard(keys: &Keyspace, asked: std::time::Instant) -> Option<(u64, u64)> {
    let max = keys.clock_guard_ms?;
    let waited = u64::try_from(asked.elapsed().as_millis()).unwrap_or(u64::MAX);
    Some((keys.expected_redis_ms().saturating_sub(waited), max))
}

/// Runs `batch` in one script call (`calls` says how); if an item asks to wait and `replication`
/// names replicas, `WAIT`s for them in the same pipeline (on the same
/// connection, so the wait covers the script's writes).
async fn run_batch(
    conn: &mut Conn,
    keys: &Keyspace,
    replication: Replication,
    calls: Calls,
    clock: Clock,
    batch: &[Pending],
) -> Result<Vec<Reply>, LedgerError> {
    let (mut item_keys, mut args) = (Vec::new(), Vec::new());
    let (sets, shapes) = numbered_sets(keys, batch);
    let mut rewritten = shapes.iter();
    // The rule sets the admissions' shapes name: the only ones the call
    // carries.
    let mut named = std::collections::BTreeSet::new();
    for p in batch {
        item_keys.extend(p.keys.iter().map(String::as_str));
        for (i, arg) in p.args.iter().enumerate() {
            let arg = match (i, p.sets.is_empty()) {
                (SHAPE_ARG, false) => rewritten.next().map_or(arg.as_str(), String::as_str),
                _ => arg.as_str(),
            };
            if i == SHAPE_ARG && p.args[0] == "admit" {
                named.extend(sets_of_shape(arg));
            }
            args.push(arg);
        }
    }
    let code = Callee::ledger(calls);
    let mut eval = redis::cmd(code.command());
    eval.arg(code.name())
        .arg(item_keys.len())
        .arg(&item_keys)
        .arg("batch")
        .arg(clock_arg(clock, keys, oldest_asked(batch)));
    // The settings: keep, lease and the rule sets the admissions name.
    let (keep, lease) = (keys.record_keep_ms(), keys.lease_ms());
    let sets = keys.named_rule_set_args(&named, &sets);
    match code {
        Callee::Library(_) => eval.arg(format!("{keep} {lease} {}", words(&sets))),
        Callee::Script(_) => eval.arg(keep).arg(lease).arg(&sets),
    };
    eval.arg(&args);
    let wait = batch.iter().any(|p| p.wait);
    let (reply, unreplicated) = eval_waiting(conn, Some(code), eval, replication, wait).await?;
    replies_of(reply, batch, unreplicated)
}

/// When the oldest item of `batch` was asked for.
pub(super) fn oldest_asked<T: Queued>(batch: &[T]) -> std::time::Instant {
    let now = std::time::Instant::now();
    batch.iter().map(Queued::asked).min().unwrap_or(now)
}

/// The overrides' rule sets a batch's items name, numbered for the batch
/// after the configured ones, and the shapes that name them rewritten so
/// (one for each item that names any, in order).
fn numbered_sets(keys: &Keyspace, batch: &[Pending]) -> (Vec<(usize, Arc<RuleSet>)>, Vec<String>) {
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
    (sets, shapes)
}

/// A batch's reply (`unreplicated`: replicas that acknowledged it, if too
/// few) as each of its items' [`Reply`]: the batch's instant, then each
/// item's code times 8 plus how many values follow, and those values (one
/// left out reads as 0), then the rooms of the items admitted now.
fn replies_of(
    reply: redis::Value,
    batch: &[Pending],
    unreplicated: Option<i64>,
) -> Result<Vec<Reply>, LedgerError> {
    let reply: Vec<i64> = redis::from_redis_value(reply)
        .map_err(|e| LedgerError::Protocol(format!("a batch's reply: {e}")))?;
    let bad = || LedgerError::Protocol(format!("{} values for {} items", reply.len(), batch.len()));
    let mut rest = reply.iter().copied();
    let now_ms = rest
        .next()
        .and_then(|t| u64::try_from(t).ok())
        .ok_or_else(bad)?;
    let mut items = Vec::with_capacity(batch.len());
    for p in batch {
        let head = rest.next().ok_or_else(bad)?;
        let follow = usize::try_from(head % 8).map_err(|_| bad())?;
        if head < 0 || follow >= REPLY_WIDTH {
            return Err(bad());
        }
        let mut values = [head / 8, 0, 0, 0, 0];
        for v in &mut values[1..=follow] {
            *v = rest.next().ok_or_else(bad)?;
        }
        items.push((p, values));
    }
    // After the items, the rooms of those admitted now, in order.
    let replies = items
        .into_iter()
        .map(|(p, values)| {
            let admitted = p.args[0] == "admit" && values[0] == Code::Admitted as i64;
            let keys = if admitted {
                usize::try_from(values[4]).unwrap_or(0)
            } else {
                0
            };
            Reply {
                now_ms,
                values,
                rooms: rest.by_ref().take(3 * keys).collect(),
                unreplicated: unreplicated.filter(|_| p.wait),
            }
        })
        .collect();
    match rest.next() {
        None => Ok(replies),
        Some(_) => Err(bad()),
    }
}

/// What a call runs in Redis: a script (`EVALSHA`) or a function
/// (`FCALL`), each loaded again if the server lost it.
#[derive(Clone, Copy)]
pub(super) enum Callee<'a> {
    /// A script, by its hash.
    Script(&'a redis::Script),
    /// A function library's function, by its name.
    Library(&'a FunctionLibrary),
}

impl Callee<'static> {
    /// The ledger's code, as `calls` says Redis takes it.
    pub(super) fn ledger(calls: Calls) -> Self {
        match calls {
            Calls::Functions => Callee::Library(&LEDGER_LIBRARY),
            Calls::Scripts => Callee::Script(&LEDGER),
        }
    }
}

impl Callee<'_> {
    /// The command that calls it.
    pub(super) fn command(&self) -> &'static str {
        match self {
            Callee::Script(_) => "EVALSHA",
            Callee::Library(_) => "FCALL",
        }
    }

    /// What the call names: the script's hash, or the function's name.
    pub(super) fn name(&self) -> &str {
        match self {
            Callee::Script(script) => script.get_hash(),
            Callee::Library(library) => library.function(),
        }
    }

    /// Whether `e` says the server lost this code (`NOSCRIPT` after a
    /// restart or `SCRIPT FLUSH`; "Function not found" after a
    /// `FUNCTION FLUSH`, or on a new node): the caller loads it again.
    pub(super) fn is_lost(&self, e: &redis::RedisError) -> bool {
        match self {
            Callee::Script(_) => {
                e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
            }
            // Its own error, or the pipeline's first (the call is first).
            Callee::Library(_) => e.clone().into_server_errors().is_some_and(|errors| {
                errors.first().is_some_and(|(_, e)| {
                    e.details()
                        .is_some_and(|d| d.starts_with("Function not found"))
                })
            }),
        }
    }

    /// Loads it again.
    pub(super) async fn load(&self, conn: &mut Conn) -> redis::RedisResult<()> {
        match self {
            Callee::Script(script) => script.prepare_invoke().load_async(conn).await.map(drop),
            Callee::Library(library) => library.load(conn).await,
        }
    }
}

/// Runs `eval`, a call of `code` if it is one (loaded again if the server
/// lost it, e.g. after a restart), and, if `wait` and `replication` names
/// replicas, `WAIT`s for them in the same pipeline (on the same connection,
/// so the wait covers the call's writes). Returns the call's reply
/// and, if fewer replicas than asked acknowledged, how many did.
pub(super) async fn eval_waiting(
    conn: &mut Conn,
    code: Option<Callee<'_>>,
    eval: redis::Cmd,
    replication: Replication,
    wait: bool,
) -> Result<(redis::Value, Option<i64>), LedgerError> {
    let mut pipe = redis::pipe();
    pipe.add_command(eval);
    let wait = wait && replication.replicas > 0;
    // Behind Sentinel, the call and its WAIT run on one primary, and the
    // WAIT counts every replica of it that could be promoted.
    let (mut on, replicas) = match wait {
        true => conn.pin(replication.replicas).await?,
        false => (conn.clone(), 0),
    };
    if wait {
        pipe.cmd("WAIT").arg(replicas).arg(replication.timeout_ms);
    }
    let values = match pipe.query_async::<Vec<redis::Value>>(&mut on).await {
        Err(e) if let Some(code) = code.filter(|c| c.is_lost(&e)) => {
            code.load(&mut on).await?;
            pipe.query_async(&mut on).await?
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
    Ok((reply, acked.filter(|n| *n < i64::from(replicas))))
}

/// Where an "admit" item's shape is among its kind and values.
const SHAPE_ARG: usize = 7;

/// The rule sets (by index) a shape names: two characters per key, as
/// [`push_shape`] writes them.
fn sets_of_shape(shape: &str) -> impl Iterator<Item = usize> + '_ {
    shape.as_bytes().chunks_exact(2).filter_map(|two| {
        let digit = |c: u8| c.checked_sub(b'0').map(usize::from);
        let n = digit(two[0])? * 64 + digit(two[1])?;
        n.checked_sub(1)
    })
}

/// Sets the rule set of a shape's `at`-th key (0-based) to `set`.
fn put_shape(shape: &mut String, at: usize, set: usize) {
    let mut two = String::with_capacity(2);
    push_shape(&mut two, set);
    if shape.len() >= 2 * at + 2 {
        shape.replace_range(2 * at..2 * at + 2, &two);
    }
}
