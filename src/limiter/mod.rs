//! The exact multi-window rate limiter: it decides, and it records
//! admissions. Which job an admission belongs to, and what became of it, is
//! the [`crate::ledger`]'s business.
//!
//! # Semantics
//! A [`Request`] is admitted iff every rule of every [`Scope`] that applies
//! to it has room in that scope's sliding window of admissions; an
//! admission is recorded in every scope at once, a rejection nowhere, and
//! carries the exact `retry_after_ms` and the rule that binds it. The one
//! normative text is `docs/contract.md` (section *Behaviour*, bullets
//! *Rules and windows* and *Scopes*); this module and `decide.lua`
//! implement it.
//!
//! # Layout
//! `Keyspace` (`keyspace/`) names the keys and finds the rule sets
//! (`rules`) that judge a request, as the [`overrides`] in force change
//! them; `usage` holds what a decision or a read of usage says ([`Room`],
//! [`RuleUsage`]) and how it is worked out from a log; `memory` holds the
//! in-process logs.
//!
//! # Where the decision runs
//! In Redis, `decide.lua` (in `src/store/scripts/`) holds the decision as
//! Lua functions; the ledger's script runs them in the same atomic call that
//! looks up and writes the job's record, so a job is counted once however
//! many copies of it arrive.
//! In process, `MemoryLogs` holds the same logs for the in-memory ledger.
//! Both ledgers answer the support tools' questions through [`Quotas`].

mod keyspace;
mod memory;
pub mod overrides;
mod rules;
mod usage;

use std::future::Future;

pub(crate) use self::keyspace::{Applied, Keyspace, families, suppressed_by, words};
pub use self::keyspace::{SHARE_IPV4_PREFIX, SHARE_IPV6_PREFIX};
pub(crate) use self::memory::MemoryLogs;
pub(crate) use self::rules::RuleSet;
pub use self::usage::{InForce, Room, Rooms, RuleRef, RuleUsage, Usage};
pub(crate) use self::usage::{Judged, Newest, judge_scope, room_of, usage_of};

use crate::domain::{EmailAddress, IpKey, JobId, Name, RegistrableDomain, Session};
pub use crate::domain::{Scope, ScopeMap};

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
    /// The attempt the producer sent it for, if it says: who may supersede
    /// it (the newest jobs per mailbox and purpose, in `Keyspace`).
    pub session: Option<&'a Session>,
    /// The mailbox belongs to an existing account, the producer says: the
    /// domain scope neither counts nor judges it (a domain's deny override
    /// still holds).
    pub known_mailbox: bool,
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

/// What support tools ask of a limiter backend: how much of a subject's
/// quota is used, and forgetting it. Both backends answer alike, checked by
/// one conformance suite.
pub trait Quotas: Send + Sync {
    /// Why a backend could not answer (the store's error, for both
    /// ledgers). Transient: ask again.
    type Error: std::error::Error + Send + Sync + 'static;

    /// How much of its quota `subject` has used under `purpose`'s rules, at
    /// `clock`, changing nothing (for `mailgate limits show`).
    fn usage(
        &self,
        subject: Subject<'_>,
        purpose: Option<&Name>,
        clock: Clock,
    ) -> impl Future<Output = Result<Usage, Self::Error>> + Send;

    /// Forgets every admission counted for `subject` (for support staff).
    /// Job records stay, so redelivered jobs are still de-duplicated.
    /// Returns the key and how many admissions it held.
    fn reset(
        &self,
        subject: Subject<'_>,
    ) -> impl Future<Output = Result<(String, u64), Self::Error>> + Send;
}

/// How much longer than it is needed every key mailgate writes to Redis
/// lives: an admission longer than any rule can see it, a job record longer
/// than `limits.dedup_for`. Redis expires keys by its own clock, which may
/// step (an NTP correction, a paused VM). Stepped back, an admission
/// forgotten as soon as no window held it would count again; stepped
/// forward, Redis would delete records and logs that still count. With this
/// slack neither happens while the clock is at most an hour off; beyond
/// that, workers that see the step stop admitting (`ledger::clock`).
/// `decide.lua` accepts a keep of `MAX_PERIOD` plus this (its
/// `MAX_KEEP_MS`), so the longest window keeps its slack too.
pub(crate) const CLOCK_SLACK_MS: u64 = 3_600_000;

/// What a support tool asks about: one mailbox, one client address, one
/// domain, or one client network's share of a domain. It borrows the
/// parsed values ([`Subject::of`] names the subject a tool's flags give).
#[derive(Debug, Clone, Copy)]
pub enum Subject<'a> {
    /// A mailbox (normalized as the limiter does).
    Email(&'a EmailAddress),
    /// A client address (grouped by network as the limiter does).
    Ip(&'a IpKey),
    /// A registrable domain.
    Domain(&'a RegistrableDomain),
    /// The share of a registrable domain's quota the client address's
    /// network uses (a key of its own beside the domain's); no rules where the share
    /// holds nothing back.
    Share(&'a RegistrableDomain, &'a IpKey),
}

impl<'a> Subject<'a> {
    /// The subject a mailbox, an address, a domain, or a domain with an
    /// address (its network's share) names; `None` for any other mix.
    pub fn of(
        email: Option<&'a EmailAddress>,
        ip: Option<&'a IpKey>,
        domain: Option<&'a RegistrableDomain>,
    ) -> Option<Self> {
        match (email, ip, domain) {
            (Some(e), None, None) => Some(Subject::Email(e)),
            (None, Some(i), None) => Some(Subject::Ip(i)),
            (None, None, Some(d)) => Some(Subject::Domain(d)),
            (None, Some(i), Some(d)) => Some(Subject::Share(d, i)),
            _ => None,
        }
    }
}

impl Subject<'_> {
    /// The scope the subject is counted in.
    pub fn scope(&self) -> Scope {
        match self {
            Subject::Email(_) => Scope::Email,
            Subject::Ip(_) => Scope::Ip,
            Subject::Domain(_) | Subject::Share(..) => Scope::Domain,
        }
    }
}

/// Every rule `limits` configures, as a metric's labels name it: each
/// scope's rules and each purpose's own, and the domain's network shares
/// of them; whether it is enforced (a shadow rule is not). Known before any
/// job, so that each rule's series can start at zero.
pub fn configured_rules(limits: &crate::settings::LimitSettings) -> Vec<(RuleRef, bool)> {
    let mut found = Vec::new();
    for scope in Scope::ALL {
        for list in limits.rule_lists(scope) {
            let set = RuleSet {
                rules: list.to_vec(),
                keep_ms: 0,
                deny_until_ms: None,
            };
            let shares = (scope == Scope::Domain)
                .then(|| set.shared(limits.domain.network_share))
                .flatten();
            for rule in list.iter().chain(shares.iter().flat_map(|s| &s.rules)) {
                found.push((RuleRef::of(scope, rule), rule.enforce));
            }
        }
    }
    found.sort_by_key(|(r, e)| (r.scope, r.window_ms, r.max, *e));
    found.dedup();
    found
}
