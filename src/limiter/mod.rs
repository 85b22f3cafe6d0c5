//! The exact multi-window rate limiter.
//!
//! # Semantics
//! A request is a job id, a mailbox and optionally a client IP, decided at a
//! time `t` in milliseconds. Each scope ([`Scope::Email`], [`Scope::Ip`]) has a
//! list of rules `(W, N)`. The request is **admitted** iff, for every rule of
//! every scope that applies, the number of admissions for that scope's key in
//! `(t − W, t]` is below `N`. An admission is recorded in every scope at once;
//! a rejection records nothing anywhere.
//!
//! A rejection carries the exact `retry_after_ms`: the smallest `d ≥ 0` such
//! that the same request at `t + d` would be admitted if nothing else happened.
//! For a violated rule that is `e + W − t`, where `e` is the
//! `(count − N + 1)`-th oldest admission in the window; over all rules it is
//! the largest of those. The rule giving it is the *binding* rule; on a tie
//! the first in order (scopes as listed, rules as configured) binds.
//!
//! Admissions are keyed by job id: an id already admitted (and not refunded)
//! is counted no second time. Its answer says whether its mail went out
//! ([`Verdict::Duplicate`]), whether another attempt owns the send right now
//! ([`Verdict::InProgress`]), or whether the send is the caller's to do
//! because no attempt owns it any more ([`Verdict::Resume`]: a worker died
//! between admission and send). The *send lease* makes one admission be
//! mailed by one attempt at a time.
//!
//! # Backends
//! [`RedisLimiter`] is the production backend, shared by any number of
//! workers; [`MemoryLimiter`] has the same semantics within one process.

mod memory;
mod redis;

use std::fmt;
use std::future::Future;

pub use self::memory::MemoryLimiter;
pub use self::redis::RedisLimiter;

use crate::domain::{EmailAddress, IpKey, JobId, Name};
use crate::settings::{LimitSettings, Rule};

/// What a rate-limit key identifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// A normalized mailbox: stops mail bombing of one victim.
    Email,
    /// A client network: stops one client from farming codes for many mailboxes.
    Ip,
}

impl Scope {
    /// The scope's name in keys, results and settings.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Email => "email",
            Scope::Ip => "ip",
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A rule as named in a decision: which scope, which window, which max.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RuleRef {
    /// The scope the rule belongs to.
    pub scope: Scope,
    /// The rule's window in milliseconds.
    pub window_ms: u64,
    /// The rule's maximum admissions per window.
    pub max: u32,
}

/// What the limiter is asked about: one job, for one mailbox, from one client.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The idempotency key; also the admission's identity in every scope.
    pub id: &'a JobId,
    /// The mailbox the code would be mailed to.
    pub email: &'a EmailAddress,
    /// The client that asked for it, if the producer knows it. Without one
    /// the request is limited by mailbox only.
    pub ip: Option<&'a IpKey>,
    /// The job's purpose, which may have rules of its own
    /// (`[limits.purpose.<name>]`); `None` uses the defaults.
    pub purpose: Option<&'a Name>,
}

/// Which clock decides. Production always uses [`Clock::Server`]; tests and
/// tools pass [`Clock::At`] to step through hours without waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clock {
    /// The backend's own clock: Redis `TIME` for Redis, so workers whose clocks
    /// disagree still agree; the system clock for the in-memory backend.
    Server,
    /// An explicit time, milliseconds since the Unix epoch.
    At(u64),
}

/// The answer to a [`Request`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// The time the decision was taken at (ms since the epoch, backend clock).
    pub decided_at_ms: u64,
    /// What was decided.
    pub verdict: Verdict,
}

/// The outcome of a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Within every rule; the admission is now recorded in every scope, and
    /// the caller owns the job's send for the send lease.
    Admitted,
    /// Some rule is full. Nothing was recorded.
    Rejected {
        /// Exactly how long until the same request would be admitted.
        retry_after_ms: u64,
        /// The rule that sets `retry_after_ms`.
        rule: RuleRef,
    },
    /// This job id is already admitted (and not refunded) and its mail went
    /// out. Nothing was counted; nothing must be sent.
    Duplicate {
        /// When the admission was recorded.
        admitted_at_ms: u64,
    },
    /// This job id is already admitted but its mail is not known to have gone
    /// out, and another attempt owns the send (its lease is live). Nothing
    /// was counted; ask again after `lease_left_ms`.
    InProgress {
        /// When the admission was recorded.
        admitted_at_ms: u64,
        /// How long the other attempt's lease still runs.
        lease_left_ms: u64,
    },
    /// This job id is already admitted, its send never began, and no attempt
    /// owns it any more (its lease lapsed or was released): the send lease
    /// is now the caller's, which must send. Nothing was counted.
    Resume {
        /// When the admission was recorded.
        admitted_at_ms: u64,
    },
    /// This job id's SMTP transaction began and its sender vanished before
    /// recording the outcome (its lease lapsed): the mail may have gone out.
    /// It is never sent again; the caller answers it. Nothing was counted.
    Interrupted {
        /// When the admission was recorded.
        admitted_at_ms: u64,
    },
}

/// Why the limiter could not decide. Every variant is transient from the
/// job's point of view: the job should be retried, not answered.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LimitError {
    /// Redis could not be reached or returned an error. Shared, because one
    /// failed script call fails every request batched into it.
    #[error("redis: {0}")]
    Redis(std::sync::Arc<::redis::RedisError>),
    /// The script answered something this build does not understand (a
    /// different script version loaded under the same SHA cannot happen, so
    /// this means a bug or a tampered server).
    #[error("unexpected limiter reply: {0}")]
    Protocol(String),
}

impl From<::redis::RedisError> for LimitError {
    fn from(e: ::redis::RedisError) -> Self {
        LimitError::Redis(std::sync::Arc::new(e))
    }
}

/// A rate limiter backend. Both backends implement exactly the semantics in
/// the module docs, checked by one conformance suite.
pub trait RateLimiter: Send + Sync {
    /// Decides `req` at `clock`, recording an admission atomically in every scope.
    fn check(
        &self,
        req: &Request<'_>,
        clock: Clock,
    ) -> impl Future<Output = Result<Decision, LimitError>> + Send;

    /// Removes the admission of job `id` from every scope, giving its quota
    /// back (a send failed permanently, or the code expired before sending).
    /// Returns whether there was an admission to remove; the id may then be
    /// admitted afresh.
    fn refund(&self, id: &JobId) -> impl Future<Output = Result<bool, LimitError>> + Send;

    /// Records that the SMTP transaction of admitted job `id` begins, renewing
    /// its lease. From now on, if this attempt vanishes, the job is answered
    /// [`Verdict::Interrupted`] rather than sent again. Returns whether the
    /// job was admitted and not already sending.
    fn mark_sending(&self, id: &JobId) -> impl Future<Output = Result<bool, LimitError>> + Send;

    /// Records that the mail of admitted job `id` went out, so that a
    /// redelivery is answered [`Verdict::Duplicate`] rather than mailed
    /// again. Returns whether the job was known.
    fn mark_sent(&self, id: &JobId) -> impl Future<Output = Result<bool, LimitError>> + Send;

    /// Gives up the send lease of admitted, unsent job `id` (its send failed
    /// transiently and will be retried): it is no longer sending, and the
    /// retry is answered [`Verdict::Resume`] at once instead of waiting for
    /// the lease to lapse.
    /// Returns whether the job is admitted and unsent.
    fn release(&self, id: &JobId) -> impl Future<Output = Result<bool, LimitError>> + Send;

    /// How much of its quota `subject` has used under `purpose`'s rules, at
    /// `clock`, changing nothing (for `mailgate limits show`).
    fn usage(
        &self,
        subject: Subject<'_>,
        purpose: Option<&Name>,
        clock: Clock,
    ) -> impl Future<Output = Result<Usage, LimitError>> + Send;

    /// Records that job `id` was answered (its result confirmed by the
    /// broker), for the dedup period, so a redelivery of the same message
    /// after a crash between the result and the ack is not answered twice.
    fn mark_answered(&self, id: &JobId) -> impl Future<Output = Result<(), LimitError>> + Send;

    /// Whether [`RateLimiter::mark_answered`] was called for `id`.
    fn answered(&self, id: &JobId) -> impl Future<Output = Result<bool, LimitError>> + Send;

    /// Whether the backend answers (for readiness checks).
    fn ping(&self) -> impl Future<Output = Result<(), LimitError>> + Send;

    /// Forgets every admission counted for `subject` (for support staff).
    /// Job records stay, so redelivered jobs are still de-duplicated.
    /// Returns the key and how many admissions it held.
    fn reset(
        &self,
        subject: Subject<'_>,
    ) -> impl Future<Output = Result<(String, u64), LimitError>> + Send;
}

/// One list of rules for one scope, and how long that scope's keys keep an
/// admission: the longest window of *any* rule set of the scope, because a
/// mailbox's log is shared by every purpose.
#[derive(Debug, Clone)]
pub(crate) struct RuleSet {
    pub rules: Vec<Rule>,
    pub keep_ms: u64,
}

/// Key naming and policy lookup shared by both backends, so a mailbox or
/// network means the same key and the same rules whichever backend counts.
#[derive(Debug, Clone)]
pub(crate) struct Keyspace {
    pub prefix: String,
    pub limits: LimitSettings,
    /// `[0]` email defaults, `[1]` IP defaults, then each purpose override.
    pub sets: Vec<RuleSet>,
    /// purpose → its override set per scope (`[email, ip]`), if any.
    overrides: std::collections::HashMap<String, [Option<usize>; 2]>,
}

fn scope_index(scope: Scope) -> usize {
    match scope {
        Scope::Email => 0,
        Scope::Ip => 1,
    }
}

impl Keyspace {
    pub fn new(prefix: &str, limits: &LimitSettings) -> Self {
        let keep = |scope: Scope| -> u64 {
            let longest = match scope {
                Scope::Email => limits
                    .email_rule_lists()
                    .flatten()
                    .map(Rule::window_ms)
                    .max(),
                Scope::Ip => limits.ip_rule_lists().flatten().map(Rule::window_ms).max(),
            };
            longest.unwrap_or(1).max(1)
        };
        let set = |scope, rules: &[Rule]| RuleSet {
            rules: rules.to_vec(),
            keep_ms: keep(scope),
        };
        let mut sets = vec![
            set(Scope::Email, &limits.email.rules),
            set(Scope::Ip, &limits.ip.rules),
        ];
        let mut overrides = std::collections::HashMap::new();
        for (purpose, o) in &limits.purpose {
            let mut idx = [None, None];
            for (scope, rules) in [(Scope::Email, &o.email), (Scope::Ip, &o.ip)] {
                if let Some(rules) = rules {
                    idx[scope_index(scope)] = Some(sets.len());
                    sets.push(set(scope, &rules.rules));
                }
            }
            overrides.insert(purpose.clone(), idx);
        }
        Self {
            prefix: prefix.to_owned(),
            limits: limits.clone(),
            sets,
            overrides,
        }
    }

    pub fn job_key(&self, id: &JobId) -> String {
        format!("{}{}", self.job_key_prefix(), id.as_str())
    }

    /// The key marking that job `id` was answered.
    pub fn answered_key(&self, id: &JobId) -> String {
        format!("{}done:{}", self.prefix, id.as_str())
    }

    /// Job keys are this followed by the job id.
    pub fn job_key_prefix(&self) -> String {
        format!("{}job:", self.prefix)
    }

    /// The rule set a scope uses for a purpose: its override, else the default.
    pub fn set_for(&self, scope: Scope, purpose: Option<&Name>) -> usize {
        purpose
            .and_then(|p| self.overrides.get(p.as_str()))
            .and_then(|o| o[scope_index(scope)])
            .unwrap_or(scope_index(scope))
    }

    /// A subject's key and the rules it is judged by under `purpose`.
    pub fn lookup(&self, subject: Subject<'_>, purpose: Option<&Name>) -> (String, &RuleSet) {
        let set = &self.sets[self.set_for(subject.scope(), purpose)];
        (self.key_of(subject), set)
    }

    /// The key of a subject's log.
    pub fn key_of(&self, subject: Subject<'_>) -> String {
        let l = &self.limits;
        match subject {
            Subject::Email(email) => {
                let mut key = String::with_capacity(self.prefix.len() + 6 + email.as_str().len());
                key.push_str(&self.prefix);
                key.push_str("email:");
                email.push_mailbox_key(&l.normalize, &mut key);
                key
            }
            Subject::Ip(ip) => format!(
                "{}ip:{}",
                self.prefix,
                ip.network(l.ipv4_prefix, l.ipv6_prefix)
            ),
        }
    }

    /// `(scope, key, rule set)` for each scope that applies to `req` and has
    /// rules, in decision order.
    pub fn applicable(&self, req: &Request<'_>) -> Vec<(Scope, String, usize)> {
        let mut out = Vec::with_capacity(2);
        let subjects = [Some(Subject::Email(req.email)), req.ip.map(Subject::Ip)];
        for subject in subjects.into_iter().flatten() {
            let scope = subject.scope();
            let set = self.set_for(scope, req.purpose);
            if !self.sets[set].rules.is_empty() {
                out.push((scope, self.key_of(subject), set));
            }
        }
        out
    }

    pub fn lease_ms(&self) -> u64 {
        u64::try_from(self.limits.send_lease.as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    pub fn dedup_ms(&self) -> u64 {
        u64::try_from(self.limits.dedup_period().as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }
}

/// What a support tool asks about: one mailbox or one client address.
#[derive(Debug, Clone, Copy)]
pub enum Subject<'a> {
    /// A mailbox (normalized as the limiter does).
    Email(&'a EmailAddress),
    /// A client address (grouped by network as the limiter does).
    Ip(&'a IpKey),
}

impl Subject<'_> {
    /// The scope the subject is counted in.
    pub fn scope(&self) -> Scope {
        match self {
            Subject::Email(_) => Scope::Email,
            Subject::Ip(_) => Scope::Ip,
        }
    }
}

/// How much of each rule a key has used, without using any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage {
    /// The key that was read.
    pub key: String,
    /// When it was read (backend clock, ms).
    pub at_ms: u64,
    /// Each rule of the scope's rule set for the purpose asked about.
    pub rules: Vec<RuleUsage>,
    /// How long until a request for this key alone would pass this scope
    /// (0: now). Another scope may still reject it.
    pub retry_after_ms: u64,
}

/// One rule's use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleUsage {
    /// The rule.
    pub rule: RuleRef,
    /// Admissions in its window now.
    pub count: u32,
    /// How long until it has room (0: it has room now).
    pub retry_after_ms: u64,
}

/// Usage of `rules` by a log with admission `times` (ascending) at `now`.
pub(crate) fn usage_of(
    key: String,
    scope: Scope,
    rules: &[Rule],
    times: &[u64],
    now: u64,
) -> Usage {
    let hi = times.partition_point(|&t| t <= now);
    let rules: Vec<RuleUsage> = rules
        .iter()
        .map(|r| {
            let lo = times.partition_point(|&t| t.saturating_add(r.window_ms()) <= now);
            let count = hi.saturating_sub(lo);
            let retry_after_ms =
                binding_rule(std::slice::from_ref(r), times, now).map_or(0, |(d, _)| d);
            RuleUsage {
                rule: RuleRef {
                    scope,
                    window_ms: r.window_ms(),
                    max: r.max,
                },
                count: u32::try_from(count).unwrap_or(u32::MAX),
                retry_after_ms,
            }
        })
        .collect();
    let retry_after_ms = rules.iter().map(|r| r.retry_after_ms).max().unwrap_or(0);
    Usage {
        key,
        at_ms: now,
        rules,
        retry_after_ms,
    }
}

/// For one key: which rule binds and after how long, given the admission
/// times in the key's log (ascending) at time `now`. `None` if every rule has
/// room. Ties go to the earlier rule.
pub(crate) fn binding_rule(rules: &[Rule], times: &[u64], now: u64) -> Option<(u64, usize)> {
    let mut best: Option<(u64, usize)> = None;
    for (i, rule) in rules.iter().enumerate() {
        let w = rule.window_ms();
        let max = rule.max as usize;
        // Times in (now − w, now].
        let lo = times.partition_point(|&t| t.saturating_add(w) <= now);
        let hi = times.partition_point(|&t| t <= now);
        let count = hi.saturating_sub(lo);
        if count >= max {
            let e = times[lo + count - max];
            let d = (e + w).saturating_sub(now);
            if best.is_none_or(|(bd, _)| d > bd) {
                best = Some((d, i));
            }
        }
    }
    best
}
