//! The job ledger: what became of each job id, so that a job is counted
//! once, mailed at most once, and every message about it gets an answer that
//! agrees with the others.
//!
//! # The record
//! An id gets a record when it is first admitted; rejected, invalid and
//! expired jobs leave nothing behind. The record binds the id to what it was
//! admitted for (its [`Fingerprint`]: mailbox, client address, purpose),
//! holds the job's [`JobState`], the [`Ticket`] of the message lineage that
//! owns its send, and that owner's *send lease*. It lives `limits.dedup_for`
//! after its last change: within that period an id is never mailed twice.
//!
//! ```text
//!            admit (limiter admits; the caller holds a free SMTP connection)
//!   (none) ──────────────────────────────────────────► Sending ──settle: sent──► Sent
//!     ▲                                    ▲   │  │
//!     │                  admit (resumes)   │   │  ├─settle: unknown──► Unknown
//!     │                          Admitted ─┘   │  └─lease lapses, seen──► Unknown
//!     │                              ▲         │
//!     │                              └─release─┘ (a transient failure)
//!     │   admit of a new lineage
//!     └──────── Refunded ◄──settle: refund (expired, failed, invalid), or admit past expires_at
//! ```
//!
//! A job is admitted only once an SMTP connection is free for it, so an
//! admission is its send mark: until then [`Ledger::peek`] answers, read
//! only, what needs no mail (a rejection, a suppression, a copy).
//!
//! # Tickets and lineages
//! A message that reaches mailgate without a ticket (a producer's message,
//! or a dead letter replayed) gets a fresh [`Ticket`]; the copies mailgate
//! publishes itself (retries, lease waits) carry it on, with their attempt
//! number. The record names the owner's ticket and attempt, so the ledger
//! tells "this job's own retry" from "another message with the same id"
//! without remembering anything per message, and a stale write of an earlier
//! attempt is fenced off (see [`JobRef::attempt`]). A ticket is not a
//! credential: a producer can put any ticket in its headers, so a ticket
//! only ever selects which answer a message gets, never a second send.
//!
//! # Backends
//! [`RedisLedger`] (one Lua script, `ledger.lua`, run after the limiter's
//! decision chunk) is shared by any number of workers; [`MemoryLedger`] has
//! the same semantics in one process. One conformance suite checks both.

pub mod clock;
mod memory;
pub(crate) mod redis;
mod standing;

use std::future::Future;
use std::time::Duration;

use sha2::{Digest, Sha256};

pub use self::memory::MemoryLedger;
pub use self::redis::log as scope_log;
pub use self::redis::{Admitted, JobRecord, RedisLedger, Spelling, Suppression};
pub(crate) use self::standing::{Held, Standing, standing};

use crate::domain::{EmailAddress, JobId, Name, Ticket};
use crate::limiter::overrides::OverrideError;
use crate::limiter::{Clock, Quotas, Request, Rooms, RuleRef, Subject, Usage};
use crate::settings::{LimitSettings, RedisSettings};

/// How long a ledger write that must not be lost (a settle, the give-back
/// of a send mark the replicas did not acknowledge) is retried while Redis
/// is away: long enough to outlast a Sentinel failover (writes stop while
/// one is under way, a second or two when forced) or a cluster's
/// promotion of a replica.
pub const OUTAGE_RETRY_FOR: Duration = Duration::from_secs(20);

/// The backoff of such a write: from 50 ms, doubling up to 1 s, for
/// [`OUTAGE_RETRY_FOR`] in all. Retry only outages with it
/// ([`LedgerError::is_outage`]).
pub fn outage_backoff() -> backon::ExponentialBuilder {
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(50))
        .with_max_delay(Duration::from_secs(1))
        .with_total_delay(Some(OUTAGE_RETRY_FOR))
        .without_max_times()
}

/// What an id was admitted for: a digest of the mailbox (as parsed), the
/// client address and the purpose. A message reusing the id for anything
/// else is a conflict and never touches the first job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint(String);

impl Fingerprint {
    /// The fingerprint of `req` (SHA-256, first 128 bits, hex).
    pub fn of(req: &Request<'_>) -> Self {
        let mut h = Sha256::new();
        h.update(req.email.as_str().as_bytes());
        h.update([0]);
        if let Some(ip) = req.ip {
            h.update(ip.addr().to_string().as_bytes());
        }
        h.update([0]);
        h.update(req.purpose.map_or("", |p| p.as_str()).as_bytes());
        let digest = h.finalize();
        Self(digest[..16].iter().map(|b| format!("{b:02x}")).collect())
    }

    /// The fingerprint as stored.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A job's state in its record. The Redis script spells each as one
/// character ([`JobState::code`]); the memory backend holds the enum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    /// Admitted, not sending: a transient failure ended its SMTP
    /// transaction before the message was handed over ([`Ledger::release`]),
    /// and a retry resumes it. (An admission itself is [`JobState::Sending`].)
    Admitted,
    /// An SMTP transaction began and its outcome is not recorded.
    Sending,
    /// The SMTP server accepted the mail.
    Sent,
    /// The mail may or may not have arrived (its sender vanished mid-send,
    /// or the server never answered the end of the message). Never resent.
    Unknown,
    /// Ended without a mail; the quota was given back.
    Refunded(Refund),
}

impl JobState {
    /// The character `ledger.lua` stores in the record's `st` field.
    pub fn code(self) -> u8 {
        match self {
            JobState::Admitted => b'a',
            JobState::Sending => b'x',
            JobState::Sent => b's',
            JobState::Unknown => b'u',
            JobState::Refunded(_) => b'r',
        }
    }
}

/// How a job ended without a mail (its quota given back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refund {
    /// `expires_at` passed before its send began.
    Expired,
    /// The SMTP server refused it, or every attempt failed.
    Failed,
    /// Its mail could not be built (its variables break a template).
    Invalid,
    /// A newer job for the same mailbox and purpose was admitted after it
    /// (`supersede`); only the ledger's admission ends a job so.
    Superseded,
}

impl Refund {
    /// The character `ledger.lua` stores in the record's `fin` field.
    pub fn code(self) -> u8 {
        match self {
            Refund::Expired => b'e',
            Refund::Failed => b'f',
            Refund::Invalid => b'i',
            Refund::Superseded => b'p',
        }
    }

    /// Whether this refund gives the admission back in `scope`'s log:
    /// everywhere, but a failure stays counted in the requester's own
    /// logs (its client network, and that network's share of the domain:
    /// [`Applied::is_requesters`](crate::limiter::Applied)), so that
    /// failures (probes of made-up mailboxes) are not free to whoever asks.
    pub(crate) fn gives_back(self, scope: &crate::limiter::Applied) -> bool {
        self != Refund::Failed || !scope.is_requesters()
    }

    /// The refund a `fin` character stands for.
    pub fn from_code(c: u8) -> Option<Self> {
        [
            Refund::Expired,
            Refund::Failed,
            Refund::Invalid,
            Refund::Superseded,
        ]
        .into_iter()
        .find(|r| r.code() == c)
    }
}

/// One job as one attempt of one message lineage asks about it.
#[derive(Debug, Clone, Copy)]
pub struct JobRef<'a> {
    /// The job as the limiter counts it (id, mailbox, client, purpose).
    pub request: Request<'a>,
    /// The asking lineage.
    pub ticket: &'a Ticket,
    /// The lineage's attempt (1 for the first). The record names the
    /// attempt that owns the send; "release", refunds and
    /// "unknown" are accepted from that attempt only, so a late write of an
    /// earlier attempt (a call that reached Redis after its caller gave up on
    /// it) cannot change what a later attempt owns. An attempt number never
    /// takes a send over: the same attempt can be delivered twice, and a
    /// producer can write any ticket and attempt into its headers.
    pub attempt: u32,
    /// This handling of the message: a random number the pipeline draws
    /// for each delivery it handles. The record names the holder of the
    /// send with the attempt, so two deliveries of one message (a copy
    /// delivered twice, headers a producer wrote) cannot give back or
    /// settle each other's send: a delivery whose admission reply was lost
    /// gives back the mark only if it set it (else one twin's release
    /// could undo the other's mark mid-send, and the job be mailed twice).
    pub holder: u64,
}

/// What admission is asked.
#[derive(Debug, Clone, Copy)]
pub struct Entry<'a> {
    /// The job and the asking lineage.
    pub job: JobRef<'a>,
    /// The job's `expires_at`, ms since the epoch, if it has one.
    pub expires_at_ms: Option<u64>,
    /// When the job was made, ms since the epoch (its `created_at`, else
    /// when it was published), if known: which of two jobs for a mailbox
    /// is the newer where its purpose `supersede`s; unknown, the order of
    /// their admissions says.
    pub made_at_ms: Option<u64>,
}

/// The answer to [`Ledger::admit`], taken at one instant of the backend's
/// clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    /// The decision time (ms since the epoch, backend clock).
    pub decided_at_ms: u64,
    /// What the ledger found or did.
    pub verdict: Verdict,
    /// On [`Verdict::Admitted`]: the shadow rule (`enforce = false`) that
    /// would have rejected the request, the one with the longest wait (the
    /// first on a tie), as an enforced one would have bound. `None` if
    /// every shadow rule had room, and on every other verdict.
    pub shadow: Option<crate::limiter::RuleRef>,
    /// On [`Verdict::Admitted`]: what is left of each scope's quota with
    /// this admission counted. Empty on every other verdict.
    pub rooms: Rooms,
    /// The kind of the override (`allow`, `deny`, `rules`) that changed
    /// how the request was judged, when one did and the request was judged
    /// now (admitted or rejected).
    pub by_override: Option<&'static str>,
}

impl Admission {
    /// `verdict` at `decided_at_ms`, naming no shadow rule, no rooms and
    /// no override.
    pub fn at(decided_at_ms: u64, verdict: Verdict) -> Self {
        Self {
            decided_at_ms,
            verdict,
            shadow: None,
            rooms: Rooms::default(),
            by_override: None,
        }
    }
}

/// What admission found or did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The id had no live admission and the limiter admitted it now, in every
    /// scope. The caller's lineage owns the send for the lease.
    Admitted,
    /// The id's admission was released (a transient failure) and nobody
    /// held its lease: the caller's lineage owns the send now, sending.
    /// Nothing was counted again.
    Resumed {
        /// When the admission was recorded.
        admitted_at_ms: u64,
    },
    /// A limit applies. Nothing was recorded.
    Rejected {
        /// Exactly how long until the same request would be admitted.
        retry_after_ms: u64,
        /// The rule that sets `retry_after_ms`.
        rule: RuleRef,
    },
    /// `expires_at` passed before a send began: nothing is admitted. If the
    /// caller's own lineage held an unsent admission, it was refunded;
    /// another lineage's is left to its owner.
    Expired,
    /// Another attempt owns the send; ask again after `lease_left_ms`.
    Busy {
        /// How long its lease still runs.
        lease_left_ms: u64,
    },
    /// The mailbox is suppressed (`mailgate suppress`): nothing was
    /// counted or recorded, and no mail goes out. Only where the limiter
    /// would decide: an id already admitted goes on as its record says.
    Suppressed,
    /// The id's mail went out.
    Sent {
        /// When its admission was recorded.
        admitted_at_ms: u64,
        /// The caller's lineage sent it.
        by_owner: bool,
        /// The sender's result was confirmed.
        answered: bool,
    },
    /// The id's mail may have arrived (delivery unknown); it is never resent.
    Unknown {
        /// The caller's lineage was the sender.
        by_owner: bool,
        /// The sender's result was confirmed.
        answered: bool,
    },
    /// The caller's own lineage ended without a mail, as `how`.
    Finished {
        /// How it was answered.
        how: Refund,
        /// That answer was confirmed.
        answered: bool,
    },
    /// The id was admitted for another job (another mailbox, client or
    /// purpose). Nothing was touched.
    Conflict,
    /// A newer job for the same mailbox and purpose was admitted after
    /// this one, and its purpose `supersede`s: this one is not sent.
    Superseded {
        /// This job had an unsent admission, now refunded into a record
        /// the caller's lineage owns (false: nothing was counted).
        refunded: bool,
    },
}

/// How many different addresses of one domain may bounce (5.1.1) within
/// [`BOUNCE_RUN_WINDOW`], counted over every worker and across restarts,
/// before a bounce of that domain no worker vouches for is doubted
/// ([`Bounced::Doubted`]).
pub const BOUNCE_RUN: usize = 5;

/// See [`BOUNCE_RUN`].
pub const BOUNCE_RUN_WINDOW: std::time::Duration = std::time::Duration::from_secs(600);

/// What a relay's "no such mailbox" came to ([`Ledger::bounced`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bounced {
    /// The address, as spelled, is suppressed.
    Suppressed,
    /// Bounces suppress nothing here (`limits.suppress_bounces_for` is 0).
    Off,
    /// More than [`BOUNCE_RUN`] different addresses of its domain bounced
    /// within [`BOUNCE_RUN_WINDOW`] (every worker's, since any restart),
    /// and the relay took no mail for the domain lately: a broken
    /// recipient table rather than so many mailboxes that do not exist.
    /// Nothing is suppressed, and the run's suppressions (those of
    /// bounces) are lifted, `lifted` of them now.
    Doubted {
        /// How many suppressions were lifted.
        lifted: u64,
    },
}

/// How an owner's attempt ended, for [`Ledger::settle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// The SMTP server accepted the mail.
    Sent,
    /// The end of the message got no answer: delivery unknown, never resent.
    Unknown,
    /// No mail; give the quota back, answered as this.
    Refund(Refund),
}

/// Why the ledger could not answer: the store's one error
/// ([`crate::store::StoreError`]), under the name the ledger's callers know.
pub use crate::store::StoreError as LedgerError;

/// A ledger backend. Both backends implement exactly the semantics in the
/// module docs (and `ledger.lua`'s header), checked by one conformance suite.
pub trait Ledger: Send + Sync {
    /// Looks up the job's record and, if the id has no live admission, asks
    /// the limiter and records the admission, atomically.
    fn admit(
        &self,
        entry: &Entry<'_>,
        clock: Clock,
    ) -> impl Future<Output = Result<Admission, LedgerError>> + Send;

    /// What [`Ledger::admit`] would answer now, where that answer writes
    /// nothing (a rejection, a suppression, a copy of a job sent or being
    /// sent…), read without writing: a job for which no SMTP connection is
    /// free is answered at once, and is admitted only once one is (an
    /// admission holds its send from the moment it is made). `None`: only
    /// an admission can say (it may admit the job, resume it, or end it),
    /// or the backend cannot tell with one read; never
    /// [`Verdict::Admitted`] or [`Verdict::Resumed`].
    fn peek(
        &self,
        entry: &Entry<'_>,
        clock: Clock,
    ) -> impl Future<Output = Result<Option<Admission>, LedgerError>> + Send;

    /// The owner's send failed before its message was handed over and will
    /// be retried: back to [`JobState::Admitted`] with the lease released, so
    /// the retry resumes at once. `false`: the ticket owned nothing unsent.
    fn release(&self, job: &JobRef<'_>) -> impl Future<Output = Result<bool, LedgerError>> + Send;

    /// Records how the owner's attempt ended, and whether its result was
    /// confirmed (`answered`). A refund removes the admission from every
    /// scope. `false`: nothing was recorded (the record is gone, or a refund
    /// was asked of what the ticket does not own unsent).
    fn settle(
        &self,
        job: &JobRef<'_>,
        ending: &Ending,
        answered: bool,
    ) -> impl Future<Output = Result<bool, LedgerError>> + Send;

    /// The owner's final result was confirmed (after a [`Ledger::settle`]
    /// that came before the result was published).
    fn answered(&self, job: &JobRef<'_>) -> impl Future<Output = Result<bool, LedgerError>> + Send;

    /// A relay said `email`'s mailbox does not exist (`why`: its reply):
    /// the address, as spelled, is suppressed for
    /// `limits.suppress_bounces_for`, so its next jobs are answered
    /// `suppressed` — unless every worker's bounces of its domain say the
    /// relay's word is not to be taken ([`Bounced::Doubted`]), where the
    /// relay did not take mail for the domain lately (`vouched`).
    fn bounced(
        &self,
        email: &EmailAddress,
        why: &str,
        vouched: bool,
    ) -> impl Future<Output = Result<Bounced, LedgerError>> + Send;

    /// Lifts the suppression a bounce made of `email` (as it was sent),
    /// if there is one: the relay turned out to say "no such mailbox" of
    /// too many (`mailer`'s bounce runs). Whether there was one.
    fn unbounced(
        &self,
        email: &EmailAddress,
    ) -> impl Future<Output = Result<bool, LedgerError>> + Send;

    /// Whether the backend holds no record of `id`: if none, its clock now
    /// (ms since the epoch; Redis's `TIME`, read with the record's absence
    /// in one step), from when an admission of the id would be kept at
    /// least `limits.dedup_for`; `None` while it holds one. A dead letter
    /// carries it, so that a replay tells "never admitted since it died"
    /// from "admitted, mailed and forgotten" by the ledger's own clock.
    fn unrecorded(
        &self,
        id: &JobId,
    ) -> impl Future<Output = Result<Option<u64>, LedgerError>> + Send;

    /// Whether the store answers and can keep the ledger's promises (for
    /// readiness checks): Redis answers, lets this client run the script and
    /// write (not a replica, no ACL in the way), and does not evict keys
    /// unless `redis.allow_eviction` says so.
    fn health(&self) -> impl Future<Output = Result<(), LedgerError>> + Send;

    /// Every Redis primary's clock, read now; `None` for a store that
    /// keeps no clock of its own (in memory: this process's).
    fn clocks(&self) -> impl Future<Output = Result<Option<clock::Readings>, LedgerError>> + Send;

    /// Looks after the canary (see [`clock`]): refreshes it if `agrees`
    /// (this worker's clock agrees with every primary's), marks a loss if
    /// Redis expired it early, or if `stepped` (the worker saw Redis's clock
    /// run that many ms ahead of its boot clock: [`clock::Pace`]), and
    /// returns the mark that stands, if any.
    fn watch_clock(
        &self,
        agrees: bool,
        stepped: Option<u64>,
    ) -> impl Future<Output = Result<Option<clock::Mark>, LedgerError>> + Send;

    /// How long anything the store keeps can still count, ms (see
    /// [`clock`]).
    fn horizon_ms(&self) -> u64;
}

/// The ledger a worker uses, chosen by `redis.url`: Redis, or `memory://`
/// for a single worker without Redis (limits are not shared with other
/// workers and nothing survives a restart).
#[derive(Debug)]
pub enum Backend {
    /// Shared, in Redis.
    Redis(RedisLedger),
    /// In this process.
    Memory(MemoryLedger),
}

impl Backend {
    /// Whether `redis.url` asks for the in-memory backend.
    pub fn is_memory(redis: &RedisSettings) -> bool {
        redis.is_memory()
    }

    /// Opens the backend `redis.url` names. For Redis this connects, loads
    /// the scripts, puts the overrides in force (then polls them while the
    /// ledger lives: [`RedisLedger::overrides`]) and checks the store
    /// ([`Ledger::health`]).
    pub async fn open(redis: &RedisSettings, limits: &LimitSettings) -> Result<Self, LedgerError> {
        if Self::is_memory(redis) {
            return Ok(Backend::Memory(MemoryLedger::new(limits)));
        }
        let ledger = RedisLedger::connect(redis, limits).await?;
        (ledger.overrides().start().await).map_err(overrides_unread)?;
        ledger.health().await?;
        Ok(Backend::Redis(ledger))
    }
}

/// Why the overrides could not be read at start, as the ledger's error: a
/// Redis that does not answer (or is loading its data) is an outage, and
/// start-up waits for it as for any other; anything else (a refusal, a key
/// of another type where the overrides belong, a stored override this build
/// cannot read) stops it, since waiting would not change it.
fn overrides_unread(e: OverrideError) -> LedgerError {
    if let OverrideError::Redis(redis) = &e {
        let outage = LedgerError::Redis(redis.clone());
        if outage.is_outage() {
            return outage;
        }
    }
    LedgerError::Unfit(format!(
        "reading the overrides: {}",
        crate::report::one_line(&e)
    ))
}

impl Ledger for Backend {
    async fn admit(&self, entry: &Entry<'_>, clock: Clock) -> Result<Admission, LedgerError> {
        match self {
            Backend::Redis(l) => l.admit(entry, clock).await,
            Backend::Memory(l) => l.admit(entry, clock).await,
        }
    }

    async fn peek(
        &self,
        entry: &Entry<'_>,
        clock: Clock,
    ) -> Result<Option<Admission>, LedgerError> {
        match self {
            Backend::Redis(l) => l.peek(entry, clock).await,
            Backend::Memory(l) => l.peek(entry, clock).await,
        }
    }

    async fn release(&self, job: &JobRef<'_>) -> Result<bool, LedgerError> {
        match self {
            Backend::Redis(l) => l.release(job).await,
            Backend::Memory(l) => l.release(job).await,
        }
    }

    async fn settle(
        &self,
        job: &JobRef<'_>,
        ending: &Ending,
        answered: bool,
    ) -> Result<bool, LedgerError> {
        match self {
            Backend::Redis(l) => l.settle(job, ending, answered).await,
            Backend::Memory(l) => l.settle(job, ending, answered).await,
        }
    }

    async fn answered(&self, job: &JobRef<'_>) -> Result<bool, LedgerError> {
        match self {
            Backend::Redis(l) => l.answered(job).await,
            Backend::Memory(l) => l.answered(job).await,
        }
    }

    async fn bounced(
        &self,
        email: &EmailAddress,
        why: &str,
        vouched: bool,
    ) -> Result<Bounced, LedgerError> {
        match self {
            Backend::Redis(l) => l.bounced(email, why, vouched).await,
            Backend::Memory(l) => l.bounced(email, why, vouched).await,
        }
    }

    async fn unbounced(&self, email: &EmailAddress) -> Result<bool, LedgerError> {
        match self {
            Backend::Redis(l) => l.unbounced(email).await,
            Backend::Memory(l) => l.unbounced(email).await,
        }
    }

    async fn unrecorded(&self, id: &JobId) -> Result<Option<u64>, LedgerError> {
        match self {
            Backend::Redis(l) => l.unrecorded(id).await,
            Backend::Memory(l) => l.unrecorded(id).await,
        }
    }

    async fn health(&self) -> Result<(), LedgerError> {
        match self {
            Backend::Redis(l) => l.health().await,
            Backend::Memory(l) => l.health().await,
        }
    }

    async fn clocks(&self) -> Result<Option<clock::Readings>, LedgerError> {
        match self {
            Backend::Redis(l) => l.clocks().await,
            Backend::Memory(l) => l.clocks().await,
        }
    }

    async fn watch_clock(
        &self,
        agrees: bool,
        stepped: Option<u64>,
    ) -> Result<Option<clock::Mark>, LedgerError> {
        match self {
            Backend::Redis(l) => l.watch_clock(agrees, stepped).await,
            Backend::Memory(l) => l.watch_clock(agrees, stepped).await,
        }
    }

    fn horizon_ms(&self) -> u64 {
        match self {
            Backend::Redis(l) => l.horizon_ms(),
            Backend::Memory(l) => l.horizon_ms(),
        }
    }
}

impl Quotas for Backend {
    type Error = LedgerError;

    async fn usage(
        &self,
        subject: Subject<'_>,
        purpose: Option<&Name>,
        clock: Clock,
    ) -> Result<Usage, LedgerError> {
        match self {
            Backend::Redis(l) => l.usage(subject, purpose, clock).await,
            Backend::Memory(l) => l.usage(subject, purpose, clock).await,
        }
    }

    async fn reset(&self, subject: Subject<'_>) -> Result<(String, u64), LedgerError> {
        match self {
            Backend::Redis(l) => l.reset(subject).await,
            Backend::Memory(l) => l.reset(subject).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ::redis::{ErrorKind, RedisError, ServerErrorKind};

    use super::*;

    /// A Redis still loading its data (or not answering) while the worker
    /// reads the overrides at start is waited for, as at any other step of
    /// start-up; only a lasting refusal stops the worker.
    #[test]
    fn overrides_unread_at_start_wait_out_an_outage() {
        let loading = RedisError::from((
            ErrorKind::Server(ServerErrorKind::BusyLoading),
            "Redis is loading the dataset in memory",
        ));
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        for e in [loading, RedisError::from(refused)] {
            let e = overrides_unread(OverrideError::Redis(Arc::new(e)));
            assert!(e.is_outage(), "{e:?}");
        }
        let unfit = overrides_unread(OverrideError::Unfit("NOPERM".into()));
        assert!(matches!(unfit, LedgerError::Unfit(ref why) if why.contains("NOPERM")));
        assert!(!unfit.is_outage());
    }
}
