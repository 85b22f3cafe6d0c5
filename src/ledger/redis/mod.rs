//! The production ledger, in Redis ([`RedisLedger`]): its connection and
//! the [`Ledger`] operations; batching, reply decoding, the snapshot, the
//! compare-and-set commits, the routes between them and the script,
//! spread mode, the clock watch, replication, the suppression list and the
//! support tools' questions (`quotas`, `record`) each in a file of their
//! own.

mod batch;
mod clock;
mod commit;
pub mod log;
mod quotas;
mod record;
mod replicas;
pub(crate) mod reply;
mod routes;
mod snapshot;
mod spread;
mod suppression;

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

pub use self::record::{Admitted, JobRecord};
pub use self::suppression::{Spelling, Suppression};

use tokio::sync::mpsc;

use self::batch::{BATCHED, Callee, ONE_BY_ONE, Pending, dispatch};
use self::replicas::Replication;
use super::clock::{Mark, Readings};
use super::{Admission, Ending, Entry, Fingerprint, JobRef, Ledger, LedgerError, Verdict};
use crate::limiter::{Clock, Keyspace};
use crate::settings::{LimitSettings, RedisSettings};
use crate::store::overrides::OverrideStore;
use crate::store::scripts::{self, Calls};
use crate::store::{self as store, Conn};

/// The production ledger: records in Redis, shared by every worker.
///
/// An admission is decided in Rust where it can be: one atomic read per
/// batch (`snapshot`) answers what writes nothing, and what it found room
/// for is written by compare-and-set (`commit`; an admission whose logs
/// this worker believes empty commits with no read first). Every other
/// write is an item of `ledger.lua`'s "batch": items asked while earlier
/// calls are in flight run together in one `EVALSHA` (in arrival order,
/// all at one Redis instant, atomically), so under load the fixed cost of
/// a script call, and its round trip, is shared by the jobs in flight; an
/// idle ledger sends each at once. The same holds for the reads and the
/// commits. The script is loaded again
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
    /// The snapshot's queue (`snapshot`): one read per batch of
    /// admissions, answering what needs no write; `None` with keys spread
    /// over a cluster's shards (no one read can see a job's keys).
    snapshot: Option<mpsc::Sender<snapshot::Question>>,
    /// The compare-and-set admissions' queue (`commit`): what the snapshot
    /// found room for; `None` where there is no snapshot.
    commits: Option<mpsc::Sender<commit::Put>>,
    /// The records the commits wrote (each job sending), which a
    /// sent settle writes over with no script (`commit::Sends`).
    sends: Arc<commit::Sends>,
    /// Which admissions ask the snapshot first (`routes::Hints`).
    hints: Arc<routes::Hints>,
    /// The logs this worker wrote or found written: an admission that
    /// names none of them commits with no read first (`Fits::fresh`).
    busy: Arc<routes::Hints>,
    /// One admission per mailbox on its way to the script while no hint
    /// says it is full, the others waiting for its answer
    /// (`routes::Gates`).
    gates: Arc<routes::Gates>,
    allow_eviction: bool,
    replication: Replication,
    spread: bool,
    calls: Calls,
    /// When `CONFIG GET` was last refused, ms since the epoch; 0 if it
    /// answers (see [`RedisLedger::eviction_policies`]).
    config_refused_at: Arc<std::sync::atomic::AtomicU64>,
}

/// Names the type only: its connection and queue say nothing useful.
impl std::fmt::Debug for RedisLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLedger").finish_non_exhaustive()
    }
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
        if let Some(version) = conn.too_old().await {
            return Err(LedgerError::Unfit(format!(
                "Redis {version} is older than {}.{}, which mailgate needs (a refund rewrites a \
                 log with SET ... KEEPTTL); upgrade Redis",
                store::OLDEST_REDIS.0,
                store::OLDEST_REDIS.1
            )));
        }
        let mut calls = scripts::preload(&mut conn)
            .await
            .map_err(|e| unfit(e, &redis.key_prefix))?;
        if calls == Calls::Functions {
            // Loading is not calling: an ACL may allow one and not the other.
            match probe(&mut conn, calls, &redis.key_prefix).await {
                Err(e) if scripts::without_functions(&e) => {
                    tracing::info!(
                        error = %crate::report::one_line(&e),
                        "this Redis user may not call functions; the ledger calls its script \
                         (EVALSHA) instead"
                    );
                    calls = Calls::Scripts;
                }
                probed => probed.map_err(|e| unfit(e, &redis.key_prefix))?,
            }
        }
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
            calls,
        ));
        let (snapshot, commits) = match spread {
            true => (None, None),
            false => {
                let (snapshot, commits) = without_script(&conn, &keys, replication, calls);
                (Some(snapshot), Some(commits))
            }
        };
        Ok(Self {
            conn,
            keys,
            queue,
            snapshot,
            commits,
            sends: Arc::default(),
            hints: Arc::default(),
            busy: Arc::default(),
            gates: Arc::default(),
            allow_eviction: redis.allow_eviction,
            replication,
            spread,
            calls,
            config_refused_at: Arc::new(std::sync::atomic::AtomicU64::new(0)),
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
}

impl RedisLedger {
    /// Each primary's `maxmemory-policy` (on `on`'s server, or every
    /// primary): by `CONFIG GET`, which costs Redis a sixth of what
    /// `INFO memory` does (read each second by every worker); where CONFIG
    /// is refused (managed services rename or forbid it; an ACL without
    /// `+config`), from `INFO memory`, asking CONFIG again every
    /// [`CONFIG_ASKED_AGAIN_MS`].
    async fn eviction_policies(&self, on: Option<&str>) -> Result<Vec<String>, LedgerError> {
        let now = crate::domain::now_ms();
        let refused_at = self.config_refused_at.load(Relaxed);
        // (A wall clock that stepped back since asks again too.)
        let asked =
            refused_at == 0 || now < refused_at || now - refused_at >= CONFIG_ASKED_AGAIN_MS;
        if asked && let Some(policies) = self.configured_policies(on, now).await? {
            return Ok(policies);
        }
        match self.conn.info("memory", on).await {
            Ok(infos) => Ok((infos.iter())
                .map(|info| {
                    (info.lines())
                        .find_map(|l| l.strip_prefix("maxmemory_policy:"))
                        .map_or("noeviction", str::trim)
                        .to_owned()
                })
                .collect()),
            // INFO refused too: CONFIG's refusal may have been a passing
            // error taken for one (found by review: a user without INFO
            // then stayed unfit until CONFIG was asked again).
            Err(e) if !asked && e.code() == Some("NOPERM") => {
                match self.configured_policies(on, now).await? {
                    Some(policies) => Ok(policies),
                    None => Err(info_refused(&e)),
                }
            }
            Err(e) if e.code() == Some("NOPERM") => Err(info_refused(&e)),
            Err(e) => Err(self.unfit(e)),
        }
    }

    /// Each primary's `maxmemory-policy` by `CONFIG GET`; `None` (and the
    /// time, `now`, kept) if CONFIG is refused or answers without it (a
    /// proxy).
    async fn configured_policies(
        &self,
        on: Option<&str>,
        now: u64,
    ) -> Result<Option<Vec<String>>, LedgerError> {
        let mut get = redis::cmd("CONFIG");
        get.arg("GET").arg("maxmemory-policy");
        match self
            .conn
            .each_server(get, on)
            .await
            .map(policies_configured)
        {
            Ok(Some(policies)) => {
                self.config_refused_at.store(0, Relaxed);
                Ok(Some(policies))
            }
            Err(e) if !config_refused(&e) => Err(self.unfit(e)),
            Ok(None) | Err(_) => {
                self.config_refused_at.store(now.max(1), Relaxed);
                Ok(None)
            }
        }
    }
}

/// Each server's `maxmemory-policy` from its `CONFIG GET` reply; `None`
/// if one lacks it.
fn policies_configured(
    replies: Vec<std::collections::HashMap<String, String>>,
) -> Option<Vec<String>> {
    (replies.into_iter())
        .map(|mut r| r.remove("maxmemory-policy"))
        .collect()
}

/// Readiness's answer to a user that may run neither `CONFIG GET` nor
/// `INFO`.
fn info_refused(e: &redis::RedisError) -> LedgerError {
    LedgerError::Unfit(format!(
        "the Redis user may not run INFO ({e}), nor CONFIG GET; mailgate reads the eviction \
         policy to check that Redis never evicts its keys: grant it +info or +config|get"
    ))
}

/// Starts the tasks that answer admissions with no script: the snapshot's
/// reads and the commits; their queues.
fn without_script(
    conn: &Conn,
    keys: &Arc<Keyspace>,
    replication: Replication,
    calls: Calls,
) -> (mpsc::Sender<snapshot::Question>, mpsc::Sender<commit::Put>) {
    let (snapshot, rx) = mpsc::channel(4 * BATCHED.max_batch);
    tokio::spawn(snapshot::answering(rx, conn.clone(), keys.clone()));
    let (commits, rx) = mpsc::channel(4 * BATCHED.max_batch);
    tokio::spawn(commit::committing(
        rx,
        conn.clone(),
        keys.clone(),
        replication,
        calls,
    ));
    (snapshot, commits)
}

/// How long the eviction check reads `INFO memory` after `CONFIG GET` was
/// refused before it asks CONFIG again: a refusal taken for one (a server
/// error this build does not know) costs at most this long of the dearer
/// read.
const CONFIG_ASKED_AGAIN_MS: u64 = 10 * 60 * 1000;

/// Whether `e` says this user or server does not take `CONFIG GET`: an
/// answer that is no outage (an ACL's `NOPERM`; a command renamed,
/// disabled or refused in a managed service's own words; a reply of
/// another shape), as against a lost connection or a server state that
/// passes (`LOADING`, `BUSY`, `CLUSTERDOWN` …: [`LedgerError::is_outage`]),
/// which leaves readiness failing, naming it, until Redis answers again.
fn config_refused(e: &redis::RedisError) -> bool {
    !LedgerError::from(e.clone()).is_outage()
}

/// What readiness asks (`ledger.lua`'s "probe"), called as the batches call
/// the ledger (`calls`), loading it again if Redis lost it: may this user
/// run it, and write under `prefix`?
async fn probe(conn: &mut Conn, calls: Calls, prefix: &str) -> redis::RedisResult<()> {
    let key = crate::limiter::families::probe_key(prefix);
    let callee = Callee::ledger(calls);
    let mut call = redis::cmd(callee.command());
    call.arg(callee.name()).arg(1).arg(&key).arg("probe");
    match call.query_async::<i64>(conn).await {
        Err(e) if callee.is_lost(&e) => {
            callee.load(conn).await?;
            call.query_async::<i64>(conn).await.map(drop)
        }
        probed => probed.map(drop),
    }
}

/// See [`RedisLedger::unfit`].
fn unfit(e: redis::RedisError, prefix: &str) -> LedgerError {
    match store::conn::refusal(&e, prefix) {
        Some(why) => LedgerError::Unfit(why),
        None => e.into(),
    }
}

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

impl Ledger for RedisLedger {
    async fn admit(&self, entry: &Entry<'_>, clock: Clock) -> Result<Admission, LedgerError> {
        if self.spread {
            return self.admit_spread(entry, clock).await;
        }
        let job = &entry.job;
        let (applicable, by_override) = self.keys.applicable_by(&job.request);
        // The script judges itself late from here, however long the
        // snapshot took (a frozen Redis holds both).
        let mut asked = std::time::Instant::now();
        // Nothing says the mailbox is full: one admission of it goes on to
        // the script, and those that come meanwhile wait for its answer, so
        // a flood's jobs then ask a snapshot (routes only, never answers).
        let mut gate = None;
        let mut hinted = self.hinted(entry, &applicable);
        if self.snapshot.is_some() && !hinted {
            let mailbox = self.keys.suppression_key(job.request.email);
            match self.gates.enter(&mailbox).await {
                routes::Entered::First(first) => gate = Some(first),
                // What the first one learnt routes this one.
                routes::Entered::Waited => hinted = self.hinted(entry, &applicable),
                routes::Entered::Late => return Err(routes::late()),
            }
            // Nothing of Redis was read while it waited.
            asked = std::time::Instant::now();
        }
        let answered = (self.without_script(entry, (clock, asked), &applicable, hinted)).await?;
        if let Some(mut answered) = answered {
            answered.by_override = by_override;
            // Learnt before the gate opens: those waiting go by it.
            self.learn(entry, &applicable, &answered);
            drop(gate);
            return Ok(answered);
        }
        let mut keys = Vec::with_capacity(1 + applicable.len());
        keys.push(self.keys.record_key(job.request.id));
        let mut shape = String::with_capacity(2 * applicable.len());
        let mut scopes = Vec::with_capacity(applicable.len());
        let mut sets = Vec::new();
        for (at, a) in applicable.iter().enumerate() {
            push_shape(&mut shape, a.index);
            keys.push(a.key.clone());
            if a.index >= self.keys.sets.len() {
                // Numbered by its batch.
                sets.push((at, a.set.clone()));
            }
            scopes.push((a.scope, a.set.clone()));
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
        if self.keys.checks_suppression() {
            let sups = self.keys.suppression_keys(job.request.email);
            // The flag's 's<n>:': the last n keys are the suppression keys.
            if let Some(flag) = args.get_mut(5) {
                flag.insert_str(0, &format!("s{}:", sups.len()));
            }
            keys.extend(sups);
        }
        let reply = (self.submit_judged((clock, asked), (args, keys), true, sets)).await?;
        let mut admission = self.decided(entry, &scopes, reply).await?;
        admission.by_override = by_override;
        self.learn(entry, &applicable, &admission);
        drop(gate);
        Ok(admission)
    }

    async fn peek(
        &self,
        entry: &Entry<'_>,
        clock: Clock,
    ) -> Result<Option<Admission>, LedgerError> {
        if self.spread {
            return self.peek_spread(entry, clock).await;
        }
        let (applicable, by_override) = self.keys.applicable_by(&entry.job.request);
        // Nothing known of its keys (a new mailbox from a new network, the
        // common case): no read, since it is most likely admitted (once an
        // SMTP connection is free, `admit` answers it, exactly, whatever it
        // is).
        if !self.hinted(entry, &applicable) && self.fresh(entry, &applicable).is_some() {
            return Ok(None);
        }
        let asked = std::time::Instant::now();
        match (self.snapshot_answer(entry, (clock, asked), &applicable)).await? {
            snapshot::Found::Answered(mut answered) => {
                answered.by_override = by_override;
                self.learn(entry, &applicable, &answered);
                Ok(Some(answered))
            }
            snapshot::Found::Fits(_) | snapshot::Found::Script => Ok(None),
        }
    }

    async fn release(&self, job: &JobRef<'_>) -> Result<bool, LedgerError> {
        (self.sends).forget(&self.keys.record_key(job.request.id), job.holder);
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
        if let (Ending::Sent, false) = (ending, answered)
            && let Some(recorded) = self.settle_sent(job).await?
        {
            return Ok(recorded);
        }
        (self.sends).forget(&self.keys.record_key(job.request.id), job.holder);
        let how = match ending {
            Ending::Sent => b's',
            Ending::Unknown => b'u',
            Ending::Refund(r) => r.code(),
        };
        // A refund takes the admission out of the scope logs (spread over
        // shards: the reservations the record names, given back after):
        // of every one, but the requester's for a failure, where it stays
        // counted (renamed: `decide.lua`'s `keep`).
        let (back, kept): (Vec<_>, Vec<_>) = match ending {
            Ending::Refund(how) if !self.spread => (self.keys.applicable(&job.request))
                .into_iter()
                .partition(|a| how.gives_back(a)),
            _ => (Vec::new(), Vec::new()),
        };
        let counts = match kept.len() {
            0 => back.len().to_string(),
            n => format!("{},{n}", back.len()),
        };
        let scope_keys: Vec<String> = back.into_iter().chain(kept).map(|a| a.key).collect();
        let args = vec![
            "settle".to_owned(),
            job.ticket.as_str().to_owned(),
            attempt(job),
            job.request.id.as_str().to_owned(),
            char::from(how).to_string(),
            if answered { "1" } else { "0" }.to_owned(),
            counts,
        ];
        // A sent job's settle waits for the replicas as its send mark did:
        // one the old primary of a failover took but never passed on was
        // lost, and a copy of the job answered "delivery unknown" though
        // it was sent. (A lost refund leaves its quota taken, and costs no
        // wait: WAIT holds up every call behind it on the connection.)
        let sent = matches!(ending, Ending::Sent);
        let reply = self.mark(job, None, args, scope_keys, sent).await?;
        if let Some(acked) = reply.unreplicated {
            return Err(self.settle_unreplicated(acked));
        }
        if let Ending::Refund(how) = ending {
            // Also when asked again after a lost reply (0, and the names).
            self.give_back_refunded(&job.request, *how, &reply.values)
                .await;
        }
        Ok(reply.values[0] == 1)
    }

    async fn answered(&self, job: &JobRef<'_>) -> Result<bool, LedgerError> {
        let args = vec!["answered".to_owned(), job.ticket.as_str().to_owned()];
        let reply = self.mark(job, None, args, Vec::new(), false).await?;
        Ok(reply.values[0] == 1)
    }

    async fn bounced(
        &self,
        email: &crate::domain::EmailAddress,
        why: &str,
        vouched: bool,
    ) -> Result<super::Bounced, LedgerError> {
        let Some(ms) = self.keys.bounce_suppression_ms() else {
            return Ok(super::Bounced::Off);
        };
        self.bounce(email, why, ms, vouched).await
    }

    async fn unbounced(&self, email: &crate::domain::EmailAddress) -> Result<bool, LedgerError> {
        self.unbounce(email).await
    }

    async fn unrecorded(&self, id: &crate::domain::JobId) -> Result<Option<u64>, LedgerError> {
        let at: i64 = scripts::TOOLS
            .key(self.keys.record_key(id))
            .arg("unrecorded")
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(u64::try_from(at).ok())
    }

    async fn health(&self) -> Result<(), LedgerError> {
        probe(&mut self.conn.clone(), self.calls, &self.keys.prefix)
            .await
            .map_err(|e| self.unfit(e))?;
        // Spread over shards, every primary holds mailgate's keys.
        let on = (!self.spread).then_some(self.keys.prefix.as_str());
        let policies = self.eviction_policies(on).await?;
        let evicting = (policies.iter()).find(|p| p.as_str() != "noeviction");
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
        self.read_clocks().await
    }

    async fn watch_clock(
        &self,
        agrees: bool,
        stepped: Option<u64>,
    ) -> Result<Option<Mark>, LedgerError> {
        self.watch(agrees, stepped).await
    }

    fn horizon_ms(&self) -> u64 {
        self.keys.horizon_ms()
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
        call_id(),
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
/// purposes, so at most 303 sets, far below the 4095 two digits hold (one
/// character per set would run past ASCII at the 79th set).
fn push_shape(shape: &mut String, set: usize) {
    let n = (set + 1).min(4095);
    shape.push(char::from(b'0' + (n / 64) as u8));
    shape.push(char::from(b'0' + (n % 64) as u8));
}
