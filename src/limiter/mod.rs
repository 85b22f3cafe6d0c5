//! The exact multi-window rate limiter: it decides, and it records
//! admissions. Which job an admission belongs to, and what became of it, is
//! the [`crate::ledger`]'s business.
//!
//! # Semantics
//! A request is a job id, a mailbox and optionally a client IP, decided at a
//! time `t` in milliseconds. Each scope ([`Scope::Email`], [`Scope::Ip`],
//! [`Scope::Domain`]) has a list of rules `(W, N)`. The request is **admitted** iff, for every rule of
//! every scope that applies, the number of admissions for that scope's key
//! after `t − W` is below `N`. Admissions after `t` (recorded before the
//! clock stepped back) count as inside every window, so a backward step of
//! the clock never frees quota; the wait they cause is at most the window
//! plus the step. An admission is recorded in every scope at once; a
//! rejection records nothing anywhere.
//!
//! A rejection carries the exact `retry_after_ms`: the smallest `d ≥ 0` such
//! that the same request at `t + d` would be admitted if nothing else happened.
//! For a violated rule that is `e + W − t`, where `e` is the
//! `(count − N + 1)`-th oldest admission in the window; over all rules it is
//! the largest of those. The rule giving it is the *binding* rule; on a tie
//! the first in order (scopes as listed, rules as configured) binds.
//!
//! # Where the decision runs
//! In Redis, `decide.lua` (in `src/store/scripts/`) holds the decision as
//! Lua functions; the ledger's script runs them in the same atomic call that
//! looks up and writes the job's record, so a job is counted once however
//! many copies of it arrive.
//! In process, `MemoryLogs` holds the same logs for the in-memory ledger.
//! Both ledgers answer the support tools' questions through [`Quotas`].

mod memory;
pub mod overrides;

use std::future::Future;

pub(crate) use self::memory::MemoryLogs;

use crate::domain::{EmailAddress, IpKey, JobId, Name, RegistrableDomain, Session};
pub use crate::domain::{Scope, ScopeMap};
use crate::settings::{LimitSettings, Rule};

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

impl RuleRef {
    /// Names `rule` of `scope`.
    pub fn of(scope: Scope, rule: &Rule) -> Self {
        Self {
            scope,
            window_ms: rule.window_ms(),
            max: rule.max,
        }
    }
}

/// What is left of one scope's quota right after an admission: the
/// enforced rule of the scope that allows the fewest further admissions,
/// as the IETF RateLimit header fields tell an HTTP client, so a producer
/// can tell its user "2 more codes this hour".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Room {
    /// The tightest rule: the fewest `remaining`; on a tie the one whose
    /// next slot frees last (then the first in order).
    pub rule: RuleRef,
    /// How many more admissions the rule allows now.
    pub remaining: u32,
    /// How long until the rule's oldest admission in its window leaves it,
    /// freeing a slot (the window itself when the admission is its only
    /// one).
    pub reset_ms: u64,
}

/// What is left of each scope's quota after an admission: a [`Room`] per
/// scope that counted the request and has an enforced rule. Empty when
/// the admission did not count the request now (a resumed job, or an
/// admission made in an earlier call).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rooms(ScopeMap<Option<Room>>);

impl Rooms {
    /// The room left in `scope`, if the admission counted it there.
    pub fn get(&self, scope: Scope) -> Option<Room> {
        self.0[scope]
    }

    /// Each scope's room, in [`Scope::ALL`] order.
    pub fn iter(&self) -> impl Iterator<Item = Room> + '_ {
        self.0.values().flatten().copied()
    }

    /// Records `room` as its rule's scope's, unless the scope already has
    /// a tighter one (a domain's log and a network's share of it: the
    /// fewer `remaining`, then the later `reset_ms`).
    pub(crate) fn set(&mut self, room: Room) {
        let at = &mut self.0[room.rule.scope];
        if at.is_none_or(|b| {
            room.remaining < b.remaining
                || (room.remaining == b.remaining && room.reset_ms > b.reset_ms)
        }) {
            *at = Some(room);
        }
    }
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
    /// The attempt the producer sent it for, if it says: who may supersede
    /// it (see [`Keyspace::latest_key`]).
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

/// Why the limiter's tools could not answer. Transient: ask again.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LimitError {
    /// Redis could not be reached or returned an error.
    #[error("redis: {0}")]
    Redis(std::sync::Arc<::redis::RedisError>),
    /// Redis answered something this build does not understand.
    #[error("unexpected limiter reply: {0}")]
    Protocol(String),
}

impl From<::redis::RedisError> for LimitError {
    fn from(e: ::redis::RedisError) -> Self {
        LimitError::Redis(std::sync::Arc::new(e))
    }
}

/// What support tools ask of a limiter backend: how much of a subject's
/// quota is used, and forgetting it. Both backends answer alike, checked by
/// one conformance suite.
pub trait Quotas: Send + Sync {
    /// How much of its quota `subject` has used under `purpose`'s rules, at
    /// `clock`, changing nothing (for `mailgate limits show`).
    fn usage(
        &self,
        subject: Subject<'_>,
        purpose: Option<&Name>,
        clock: Clock,
    ) -> impl Future<Output = Result<Usage, LimitError>> + Send;

    /// Forgets every admission counted for `subject` (for support staff).
    /// Job records stay, so redelivered jobs are still de-duplicated.
    /// Returns the key and how many admissions it held.
    fn reset(
        &self,
        subject: Subject<'_>,
    ) -> impl Future<Output = Result<(String, u64), LimitError>> + Send;
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

/// The widest IPv4 network one client counts as in a domain's network
/// share ([`Keyspace::share_key`]): a /24, as hosting providers and
/// offices are commonly given.
pub const SHARE_IPV4_PREFIX: u8 = 24;

/// The widest IPv6 network one client counts as in a domain's network
/// share: a /48, a whole site's allocation (a host given a /48 holds
/// 65 536 /64s, each a network of the IP scope's default grouping).
pub const SHARE_IPV6_PREFIX: u8 = 48;

/// One list of rules for one scope, and how long that scope's keys keep an
/// admission: the longest window of *any* rule set of the scope, because a
/// mailbox's log is shared by every purpose, plus [`CLOCK_SLACK_MS`]. Or a
/// deny (an override): no rules, and every request rejected until
/// `deny_until_ms` (0: for good); a deny's set never records anything.
#[derive(Debug, Clone)]
pub(crate) struct RuleSet {
    pub rules: Vec<Rule>,
    pub keep_ms: u64,
    pub deny_until_ms: Option<u64>,
}

impl RuleSet {
    /// The rules one client network is held to within a domain's log (see
    /// [`Keyspace::applicable`]): each rule's max times `share`, rounded
    /// up; `None` if that holds nothing back (`share` 1, a deny, no rules).
    pub fn shared(&self, share: f64) -> Option<RuleSet> {
        if self.deny_until_ms.is_some() || self.rules.is_empty() || share >= 1.0 {
            return None;
        }
        let rules: Vec<Rule> = (self.rules.iter())
            .map(|r| Rule {
                // At most the max itself (share ≤ 1), at least 1.
                max: ((f64::from(r.max) * share).ceil() as u32).clamp(1, r.max.max(1)),
                ..*r
            })
            .collect();
        (rules != self.rules).then_some(RuleSet {
            rules,
            keep_ms: self.keep_ms,
            deny_until_ms: None,
        })
    }

    /// A deny's wait at `now` (`None` once it has passed, and for rules).
    pub fn deny_wait(&self, now: u64) -> Option<u64> {
        let longest = crate::settings::MAX_PERIOD.as_millis() as u64;
        match self.deny_until_ms? {
            0 => Some(longest),
            until => (until > now).then(|| (until - now).min(longest)),
        }
    }
}

/// One scope that applies to a request: its scope, its key, and the rule
/// set it is judged by (with its number among all rule sets, as shapes
/// name it).
#[derive(Debug, Clone)]
pub(crate) struct Applied {
    pub scope: Scope,
    pub key: String,
    pub index: usize,
    pub set: std::sync::Arc<RuleSet>,
}

/// Key naming and policy lookup shared by both backends, so a mailbox or
/// network means the same key and the same rules whichever backend counts.
#[derive(Debug, Clone)]
pub(crate) struct Keyspace {
    pub prefix: String,
    pub limits: LimitSettings,
    /// The defaults of each scope, then each purpose's own; the
    /// overrides' sets are numbered after them. A set's number is how
    /// script calls name it.
    pub sets: Vec<std::sync::Arc<RuleSet>>,
    /// Each scope's default set's number in `sets`.
    defaults: ScopeMap<usize>,
    /// purpose → its own set's number per scope, if any.
    purposes: std::collections::HashMap<String, ScopeMap<Option<usize>>>,
    /// A domain rule set's number → the number of its network share
    /// ([`RuleSet::shared`]), where the share holds anything back.
    shares: std::collections::HashMap<usize, usize>,
    /// Registrable domains the domain scope does not count.
    exempt: std::collections::HashSet<RegistrableDomain>,
    /// The overrides in force (shared by clones: swapped as they change).
    table: std::sync::Arc<arc_swap::ArcSwap<overrides::Table>>,
    /// `redis.max_clock_skew`, ms: a decision on Redis's own clock is
    /// refused where that clock is further from the worker's (see
    /// `ledger::clock`); `None` in memory (one clock).
    pub clock_guard_ms: Option<u64>,
    /// Redis's time and this host's boot clock at the worker's last reading
    /// of Redis's clocks (`ledger::clock`), so that a decision can tell
    /// where Redis's clock should be now; shared by clones.
    pub redis_clock: std::sync::Arc<std::sync::Mutex<Option<(u64, u64)>>>,
}

impl Keyspace {
    pub fn new(prefix: &str, limits: &LimitSettings) -> Self {
        let set = |scope: Scope, rules: &[Rule]| RuleSet {
            deny_until_ms: None,
            rules: rules.to_vec(),
            keep_ms: (limits.rule_lists(scope).flatten())
                .map(Rule::window_ms)
                .max()
                .unwrap_or(1)
                .max(1)
                .saturating_add(CLOCK_SLACK_MS),
        };
        let mut sets: Vec<std::sync::Arc<RuleSet>> = Vec::new();
        let number = |sets: &mut Vec<_>, scope: Scope, rules: &[Rule]| {
            sets.push(std::sync::Arc::new(set(scope, rules)));
            sets.len() - 1
        };
        let defaults = (limits.scope_rules()).map(|scope, rules| number(&mut sets, scope, rules));
        let mut purposes = std::collections::HashMap::new();
        for purpose in limits.purpose.keys() {
            let own = ScopeMap::from_fn(|scope| {
                (limits.purpose_rules(purpose, scope)).map(|rules| number(&mut sets, scope, rules))
            });
            purposes.insert(purpose.clone(), own);
        }
        let mut shares = std::collections::HashMap::new();
        let domain_sets = std::iter::once(defaults[Scope::Domain])
            .chain(purposes.values().filter_map(|own| own[Scope::Domain]));
        for index in domain_sets.collect::<std::collections::BTreeSet<_>>() {
            if let Some(share) = sets[index].shared(limits.domain.network_share) {
                shares.insert(index, sets.len());
                sets.push(std::sync::Arc::new(share));
            }
        }
        Self {
            prefix: prefix.to_owned(),
            limits: limits.clone(),
            sets,
            defaults,
            purposes,
            shares,
            exempt: limits.domain.exempt.iter().cloned().collect(),
            table: Default::default(),
            clock_guard_ms: None,
            redis_clock: Default::default(),
        }
    }

    /// An override as the limiter counts its subject (found by review): a
    /// network narrower than the IP scope's grouping (`ipv4_prefix`,
    /// `ipv6_prefix`) widened to it, since the clients of one group share
    /// one log; `googlemail.com` as `gmail.com` where mailboxes are
    /// normalized so.
    pub fn counted(&self, mut ov: overrides::Override) -> overrides::Override {
        use overrides::Target;
        let l = &self.limits;
        match &mut ov.target {
            Target::Net(net) => {
                let group = match net {
                    ipnet::IpNet::V4(_) => l.ipv4_prefix.min(32),
                    ipnet::IpNet::V6(_) => l.ipv6_prefix.min(128),
                };
                if net.prefix_len() > group
                    && let Ok(wide) = ipnet::IpNet::new(net.addr(), group)
                {
                    *net = wide.trunc();
                }
            }
            Target::Domain(d)
                if l.normalize.googlemail_alias && d.to_string() == "googlemail.com" =>
            {
                if let Ok(gmail) = RegistrableDomain::parse_exact("gmail.com") {
                    *d = gmail;
                }
            }
            _ => {}
        }
        ov
    }

    /// Puts `overrides` in force (as read at `version`, the stamp of their
    /// hash);
    /// how many are (one per subject, at most [`overrides::MAX_OVERRIDES`]).
    pub fn install(&self, overrides: Vec<overrides::Override>, version: Option<String>) -> usize {
        let keep = |scope: Scope| self.sets[self.defaults[scope]].keep_ms;
        let overrides = overrides.into_iter().map(|o| self.counted(o)).collect();
        let mut table = overrides::Table::new(
            overrides,
            |e| self.key_of(Subject::Email(e)),
            |d| self.key_of(Subject::Domain(d)),
            self.sets.len(),
            keep,
            |set| set.shared(self.limits.domain.network_share),
        );
        table.version = version;
        let n = table.len();
        self.table.store(std::sync::Arc::new(table));
        n
    }

    /// The overrides in force at `now_ms`: built again first if one of
    /// several merged for a subject expired ([`overrides::Table`]).
    fn table_at(&self, now_ms: u64) -> std::sync::Arc<overrides::Table> {
        let table = self.table.load_full();
        if table.rebuild_at.is_none_or(|t| t > now_ms) {
            return table;
        }
        let live = (table.all.iter())
            .filter(|o| o.live(now_ms))
            .cloned()
            .collect();
        self.install(live, table.version.clone());
        self.table.load_full()
    }

    /// The stamp of the overrides' hash in force, if any was read.
    pub fn overrides_version(&self) -> Option<String> {
        self.table.load().version.clone()
    }

    /// The key of job `id`'s ledger record.
    pub fn record_key(&self, id: &JobId) -> String {
        let mut key = String::with_capacity(self.prefix.len() + 4 + id.as_str().len());
        key.push_str(&self.prefix);
        key.push_str("job:");
        key.push_str(id.as_str());
        key
    }

    /// The rule sets as `decide.lua` reads them from ARGV: their count, then
    /// for each its number of rules, how long its keys keep admissions, and
    /// each rule's `(window_ms, max)`; then the overrides' sets `extra`
    /// names (their count, then each one's number and set).
    pub fn rule_set_args(&self, extra: &[(usize, std::sync::Arc<RuleSet>)]) -> Vec<i64> {
        let int = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        let mut args = vec![int(self.sets.len())];
        for set in &self.sets {
            push_rule_set(set, &mut args);
        }
        args.push(int(extra.len()));
        for (index, set) in extra {
            args.push(int(index + 1));
            push_rule_set(set, &mut args);
        }
        args
    }

    /// Rule set `set` alone, as `decide.lua` reads rule sets (a count of 1,
    /// then the set, and no extra ones).
    pub fn one_rule_set_args(set: &RuleSet) -> Vec<i64> {
        let mut args = vec![1];
        push_rule_set(set, &mut args);
        args.push(0);
        args
    }

    /// The rule set a scope uses for a purpose: its own, else the default.
    fn set_for(&self, scope: Scope, purpose: Option<&Name>) -> usize {
        purpose
            .and_then(|p| self.purposes.get(p.as_str()))
            .and_then(|own| own[scope])
            .unwrap_or(self.defaults[scope])
    }

    /// A subject's key, the rules it is judged by under `purpose`, and the
    /// override in force for it, if any (its rules, or a deny, replace the
    /// scope's; an allow leaves it unlimited by the scope).
    pub fn lookup(
        &self,
        subject: Subject<'_>,
        purpose: Option<&Name>,
    ) -> (String, std::sync::Arc<RuleSet>, Option<overrides::Hit>) {
        let key = self.key_of(subject);
        let now = crate::domain::now_ms();
        let table = self.table_at(now);
        let hit = match subject {
            Subject::Email(_) => table.email(&key, now),
            Subject::Domain(_) => table.domain(&key, now),
            Subject::Share(d, _) => table.domain(&self.key_of(Subject::Domain(d)), now),
            Subject::Ip(ip) => table.ip(ip.addr(), now),
        }
        .cloned();
        let own = self.set_for(subject.scope(), purpose);
        // A purpose the domain scope leaves out stays out under a domain's
        // rules (its deny still holds).
        let out = subject.scope() == Scope::Domain && self.leaves_out_domain(purpose);
        let hit_set = hit.as_ref().and_then(|h| match (&h.ov.action, out) {
            (overrides::Action::Rules(_), true) => None,
            _ => h.set.as_ref(),
        });
        let set = match (subject, hit_set) {
            (Subject::Share(..), _) if out => self.sets[own].clone(),
            (Subject::Share(..), _) => match hit.as_ref().map(|h| (&h.ov.action, &h.share)) {
                Some((overrides::Action::Rules(_), Some((_, share)))) => share.clone(),
                Some((overrides::Action::Rules(_), None)) => std::sync::Arc::new(NO_RULES),
                _ => (self.shares.get(&own))
                    .map_or_else(|| std::sync::Arc::new(NO_RULES), |&i| self.sets[i].clone()),
            },
            (_, Some((_, set))) => set.clone(),
            (_, None) => self.sets[own].clone(),
        };
        (key, set, hit)
    }

    /// Whether `purpose` has its own domain rules and they are none: its
    /// jobs go to existing accounts (`[limits.purpose.reset_password.domain]
    /// rules = []`), and the domain scope, against farming of new ones,
    /// leaves them out, a domain override's rules too (found by review: an
    /// onboarding day's override put password resets back under the
    /// domain's rule, and a stranger's flood locked them out).
    fn leaves_out_domain(&self, purpose: Option<&Name>) -> bool {
        (purpose.and_then(|p| self.purposes.get(p.as_str())))
            .and_then(|own| own[Scope::Domain])
            .is_some_and(|i| self.sets[i].rules.is_empty())
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
            Subject::Domain(domain) => format!("{}domain:{domain}", self.prefix),
            Subject::Share(domain, ip) => self.share_key(&self.key_of(Subject::Domain(domain)), ip),
        }
    }

    /// Each scope that applies to `req`, in decision order: the scopes with
    /// rules, as the overrides in force change them (see
    /// [`overrides`]); the domain scope does not count exempt domains.
    ///
    /// A request with a client IP that the domain scope judges is judged
    /// twice there: by the domain's log, and by its client network's share
    /// of it (a log of its own, [`Keyspace::share_key`], with each rule's
    /// max cut by `limits.domain.network_share`). One network cannot spend
    /// a whole domain's quota and lock its other users out; the domain's
    /// own log still counts every network, so farming is cut at its rule.
    pub fn applicable(&self, req: &Request<'_>) -> Vec<Applied> {
        self.applicable_by(req).0
    }

    /// [`Keyspace::applicable`], and the kind of the override that changed
    /// them, if one did (the deny, else the allow, else rules).
    pub fn applicable_by(&self, req: &Request<'_>) -> (Vec<Applied>, Option<&'static str>) {
        let now = crate::domain::now_ms();
        let table = self.table_at(now);
        // The domain is worked out only if something counts it.
        let domain_set = self.set_for(Scope::Domain, req.purpose);
        let domain = (!self.sets[domain_set].rules.is_empty() || table.has_domains())
            .then(|| RegistrableDomain::of(req.email, &self.limits.normalize));
        let keys = ScopeMap::from_fn(|scope| match scope {
            Scope::Email => Some(self.key_of(Subject::Email(req.email))),
            Scope::Ip => req.ip.map(|ip| self.key_of(Subject::Ip(ip))),
            Scope::Domain => domain.as_ref().map(|d| self.key_of(Subject::Domain(d))),
        });
        let hits = ScopeMap::from_fn(|scope| match scope {
            Scope::Email => keys[scope].as_deref().and_then(|k| table.email(k, now)),
            Scope::Ip => req.ip.and_then(|ip| table.ip(ip.addr(), now)),
            Scope::Domain => keys[scope].as_deref().and_then(|k| table.domain(k, now)),
        });
        let mut out = Vec::with_capacity(4);
        // A deny beats everything: judged first, beside the usual scopes
        // (which may set a longer wait).
        let mut by = self.denials(&hits, &keys, &mut out);
        let trusted =
            hits[Scope::Ip].is_some_and(|h| matches!(h.ov.action, overrides::Action::Allow));
        for (scope, key) in keys {
            let Some(key) = key else { continue };
            // A known mailbox is not a new account: the domain scope,
            // against catch-all farming, neither counts nor judges it, its
            // rules overrides included (a deny, above, still holds); nor a
            // job of a purpose that leaves the domain scope out.
            if scope == Scope::Domain && (req.known_mailbox || self.leaves_out_domain(req.purpose))
            {
                continue;
            }
            let hit = hits[scope];
            let exempt =
                scope == Scope::Domain && domain.as_ref().is_some_and(|d| self.exempt.contains(d));
            let Some((index, set)) = self.judged_by(scope, hit, exempt, req.purpose, &mut by)
            else {
                continue;
            };
            // The network's share of a domain's rules (only domain sets
            // have one): an override's rules carry their own. A network an
            // override allows is trusted (an office): it may use the whole
            // domain's quota, which still counts it.
            let share = match hit {
                Some(h) => h.share.clone(),
                None => (self.shares.get(&index)).map(|&i| (i, self.sets[i].clone())),
            };
            let share = share.filter(|_| !trusted).zip(req.ip);
            let share_key = share.as_ref().map(|(_, ip)| self.share_key(&key, ip));
            out.push(Applied {
                scope,
                key,
                index,
                set,
            });
            if let (Some(((index, set), _)), Some(key)) = (share, share_key) {
                out.push(Applied {
                    scope,
                    key,
                    index,
                    set,
                });
            }
        }
        (out, by)
    }

    /// Pushes onto `out` each scope whose override is a deny (with its
    /// key and set); `Some("deny")` if there was one.
    fn denials(
        &self,
        hits: &ScopeMap<Option<&overrides::Hit>>,
        keys: &ScopeMap<Option<String>>,
        out: &mut Vec<Applied>,
    ) -> Option<&'static str> {
        let mut by = None;
        for (scope, hit) in hits.iter() {
            if let (Some(h), Some(key)) = (hit, &keys[scope])
                && let (overrides::Action::Deny, Some((index, set))) = (&h.ov.action, &h.set)
            {
                by = Some("deny");
                out.push(Applied {
                    scope,
                    key: key.clone(),
                    index: *index,
                    set: set.clone(),
                });
            }
        }
        by
    }

    /// The rule set (number and rules) `scope` judges a request by: an
    /// override's rules, else the purpose's or the default set; `None`
    /// where nothing limits it there (an allow, an exempt domain, no
    /// rules). Notes in `by` the override kind that decided, unless one
    /// already did.
    fn judged_by(
        &self,
        scope: Scope,
        hit: Option<&overrides::Hit>,
        exempt: bool,
        purpose: Option<&Name>,
        by: &mut Option<&'static str>,
    ) -> Option<(usize, std::sync::Arc<RuleSet>)> {
        use overrides::Action;
        match hit.map(|h| (&h.ov.action, &h.set)) {
            Some((Action::Allow, _)) => {
                *by = by.or(Some("allow"));
                None
            }
            Some((Action::Rules(_), Some((index, set)))) => {
                *by = by.or(Some("rules"));
                Some((*index, set.clone()))
            }
            _ => {
                let index = self.set_for(scope, purpose);
                if exempt || self.sets[index].rules.is_empty() {
                    return None;
                }
                Some((index, self.sets[index].clone()))
            }
        }
    }

    /// The key of one client network's share of a domain's log
    /// (`domain_key` is the domain's): `<domain key>:net:<network>`, the
    /// network an IPv4 /24 or an IPv6 /48 (narrower if the IP scope groups
    /// wider), so that one customer's whole allocation is one network. A
    /// domain holds no `:`, so no domain's key is another's share.
    pub fn share_key(&self, domain_key: &str, ip: &IpKey) -> String {
        let l = &self.limits;
        let net = ip.network(
            SHARE_IPV4_PREFIX.min(l.ipv4_prefix),
            SHARE_IPV6_PREFIX.min(l.ipv6_prefix),
        );
        format!("{domain_key}:net:{net}")
    }

    /// The key naming the newest job admitted for `req`'s mailbox and
    /// purpose by its requester, if its purpose `supersede`s (see
    /// [`LimitSettings::supersede`]). The requester is the job's `session`,
    /// or without one its client network as the IP scope groups it, or
    /// without either nobody in particular: a job is superseded only by a
    /// newer one of the same requester (found by review: keyed by mailbox
    /// and purpose alone, a stranger asking for the owner's mailbox had the
    /// owner's waiting code answered `superseded`). The requester is hashed
    /// into the key, so no session is stored.
    pub fn latest_key(&self, req: &Request<'_>) -> Option<String> {
        use sha2::Digest;
        let purpose = req.purpose.map_or("", |p| p.as_str());
        if !self.limits.supersedes(purpose) {
            return None;
        }
        let requester = match (req.session, req.ip) {
            (Some(s), _) => [b"s".as_slice(), s.digest()].concat(),
            (None, Some(ip)) => format!("n{}", self.key_of(Subject::Ip(ip))).into_bytes(),
            (None, None) => b"-".to_vec(),
        };
        let digest = sha2::Sha256::digest(&requester);
        let mut key = String::with_capacity(self.prefix.len() + 28 + purpose.len() + 64);
        key.push_str(&self.prefix);
        key.push_str("newest:");
        key.push_str(purpose);
        key.push(':');
        for b in &digest[..8] {
            key.push_str(&format!("{b:02x}"));
        }
        key.push(':');
        req.email.push_mailbox_key(&self.limits.normalize, &mut key);
        Some(key)
    }

    /// Whether `subject` is left uncounted (a domain `limits.domain.exempt`
    /// names).
    pub fn exempts(&self, subject: Subject<'_>) -> bool {
        matches!(subject, Subject::Domain(d) | Subject::Share(d, _) if self.exempt.contains(d))
    }

    /// Where Redis's clock should be now (ms): its time at the last reading
    /// moved on by this host's boot clock, which no one steps; before any
    /// reading, this host's wall clock.
    pub fn expected_redis_ms(&self) -> u64 {
        let last = *self
            .redis_clock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match last {
            Some((redis, boot)) => {
                redis.saturating_add(crate::domain::boot_ms().saturating_sub(boot))
            }
            None => crate::domain::now_ms(),
        }
    }

    /// `limits.supersede_skew` in ms.
    pub fn supersede_skew_ms(&self) -> u64 {
        u64::try_from(self.limits.supersede_skew.as_millis()).unwrap_or(u64::MAX)
    }

    pub fn lease_ms(&self) -> u64 {
        u64::try_from(self.limits.send_lease.as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    pub fn dedup_ms(&self) -> u64 {
        u64::try_from(self.limits.dedup_for.as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// How long Redis keeps a job record (and a `newest` key) after its last
    /// write: `limits.dedup_for` and [`CLOCK_SLACK_MS`], so a forward step
    /// of Redis's clock within the slack deletes no record that still
    /// keeps an id from being mailed twice.
    pub fn record_keep_ms(&self) -> u64 {
        self.dedup_ms().saturating_add(CLOCK_SLACK_MS)
    }

    /// How long anything mailgate keeps can still count: the longest of
    /// `limits.dedup_for` and the configured rules' windows (and stored
    /// overrides' own windows), in ms. Whatever Redis lost by a step of its
    /// clock no longer matters this long after it (see `ledger::clock`).
    pub fn horizon_ms(&self) -> u64 {
        let table = self.table.load();
        let overrides = table.all.iter().flat_map(|ov| match &ov.action {
            overrides::Action::Rules(rules) => rules.as_slice(),
            overrides::Action::Allow | overrides::Action::Deny => &[],
        });
        (self.sets.iter().flat_map(|set| set.rules.iter()))
            .chain(overrides)
            .map(Rule::window_ms)
            .fold(self.dedup_ms(), u64::max)
    }
}

/// A rule set as `decide.lua` reads it: its number of rules, how long its
/// keys keep admissions, and each rule's `(window_ms, max)`, the max
/// negative for a shadow rule. (Settings cap windows and keeps at a year
/// and a day, so every value fits.)
fn push_rule_set(set: &RuleSet, args: &mut Vec<i64>) {
    let int = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    if let Some(until) = set.deny_until_ms {
        // One rule: (until, 0), a deny (0: for good).
        args.extend([1, 1, int(until), 0]);
        return;
    }
    args.push(int(set.rules.len() as u64));
    args.push(int(set.keep_ms));
    for rule in &set.rules {
        args.push(int(rule.window_ms()));
        let max = i64::from(rule.max);
        args.push(if rule.enforce { max } else { -max });
    }
}

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
    /// network uses ([`Keyspace::share_key`]); no rules where the share
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

/// A rule set of no rules: a network share that holds nothing back.
const NO_RULES: RuleSet = RuleSet {
    rules: Vec::new(),
    keep_ms: 1,
    deny_until_ms: None,
};

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
    /// The scope does not count this subject (a domain in
    /// `limits.domain.exempt`, or an override's allow): its requests pass
    /// this scope whatever the log holds.
    pub exempt: bool,
    /// The override in force for the subject, if any.
    pub by_override: Option<InForce>,
}

/// An override in force, as support tools show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InForce {
    /// What it matches (`email:…`, `domain:…`, `ip:…`).
    pub target: String,
    /// `allow`, `deny` or `rules`.
    pub kind: &'static str,
    /// Why it exists.
    pub reason: String,
    /// When it ends, ms since the epoch (`None`: when removed).
    pub expires_at_ms: Option<u64>,
}

impl From<&overrides::Hit> for InForce {
    fn from(hit: &overrides::Hit) -> Self {
        Self {
            target: hit.ov.target.to_string(),
            kind: hit.ov.action.kind(),
            reason: hit.ov.reason.clone(),
            expires_at_ms: hit.ov.expires_at_ms,
        }
    }
}

/// One rule's use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleUsage {
    /// The rule.
    pub rule: RuleRef,
    /// Whether it rejects (false: a shadow rule, which only counts the
    /// requests it would have rejected).
    pub enforce: bool,
    /// Admissions in its window now.
    pub count: u32,
    /// How long until it has room (0: it has room now).
    pub retry_after_ms: u64,
}

/// Usage of `set` by a log with admission `times` (ascending) at `now`,
/// with the override `hit` in force; an `exempt` subject (or one an
/// override allows) never waits, a denied one waits for the deny.
pub(crate) fn usage_of(
    key: String,
    scope: Scope,
    set: &RuleSet,
    hit: Option<&overrides::Hit>,
    times: &[u64],
    now: u64,
    exempt: bool,
) -> Usage {
    let allowed = hit.is_some_and(|h| h.ov.action == overrides::Action::Allow);
    let exempt = exempt || allowed;
    let hi = times.len();
    let rules: Vec<RuleUsage> = (set.rules.iter())
        .map(|r| {
            let lo = times.partition_point(|&t| t.saturating_add(r.window_ms()) <= now);
            let count = hi.saturating_sub(lo);
            let retry_after_ms = wait_of(r, times, now).unwrap_or(0);
            RuleUsage {
                rule: RuleRef::of(scope, r),
                enforce: r.enforce,
                count: u32::try_from(count).unwrap_or(u32::MAX),
                retry_after_ms,
            }
        })
        .collect();
    let retry_after_ms = match exempt {
        true => 0,
        false => (rules.iter().filter(|r| r.enforce))
            .map(|r| r.retry_after_ms)
            .chain(set.deny_wait(now))
            .max()
            .unwrap_or(0),
    };
    Usage {
        key,
        at_ms: now,
        rules,
        retry_after_ms,
        exempt,
        by_override: hit.map(InForce::from),
    }
}

/// For one key: which of the rules that `enforce` (or, with `false`, of
/// the shadow rules) binds and after how long, given the admission times in
/// the key's log (ascending) at time `now`. `None` if each of them has
/// room. Ties go to the earlier rule.
pub(crate) fn binding_rule(
    rules: &[Rule],
    times: &[u64],
    now: u64,
    enforce: bool,
) -> Option<(u64, usize)> {
    let mut best: Option<(u64, usize)> = None;
    for (i, rule) in rules.iter().enumerate() {
        if rule.enforce != enforce {
            continue;
        }
        if let Some(d) = wait_of(rule, times, now)
            && best.is_none_or(|(bd, _)| d > bd)
        {
            best = Some((d, i));
        }
    }
    best
}

/// The room left in `scope` once an admission at `now` joins a log whose
/// admission `times` (ascending) hold everything before it: see [`Room`].
/// `None` if `rules` has no enforced rule.
pub(crate) fn room_of(scope: Scope, rules: &[Rule], times: &[u64], now: u64) -> Option<Room> {
    let mut best: Option<Room> = None;
    for rule in rules.iter().filter(|r| r.enforce) {
        let w = rule.window_ms();
        let lo = times.partition_point(|&t| t.saturating_add(w) <= now);
        let count = times.len() - lo + 1;
        let remaining = u32::try_from((rule.max as usize).saturating_sub(count)).unwrap_or(0);
        // The admission at `now` itself may be the oldest (entries after
        // `now`: the clock stepped back).
        let oldest = times.get(lo).map_or(now, |&t| t.min(now));
        let reset_ms = (oldest + w).saturating_sub(now);
        if best.is_none_or(|b| {
            remaining < b.remaining || (remaining == b.remaining && reset_ms > b.reset_ms)
        }) {
            best = Some(Room {
                rule: RuleRef::of(scope, rule),
                remaining,
                reset_ms,
            });
        }
    }
    best
}

/// How long until `rule` has room in a log with admission `times`
/// (ascending) at `now`; `None` if it has room now.
fn wait_of(rule: &Rule, times: &[u64], now: u64) -> Option<u64> {
    let w = rule.window_ms();
    let max = rule.max as usize;
    // Times after now − w (those after now count too: a clock that stepped
    // back frees no quota).
    let lo = times.partition_point(|&t| t.saturating_add(w) <= now);
    let count = times.len().saturating_sub(lo);
    (count >= max).then(|| (times[lo + count - max] + w).saturating_sub(now))
}
