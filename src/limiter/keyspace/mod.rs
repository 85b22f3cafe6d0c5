//! Key naming and policy shared by both backends: which key counts a
//! mailbox, a network, a domain or a network's share of it; which rule
//! sets there are and how scripts name them; the overrides in force; and
//! the keeps and periods derived from `limits`.

mod applicable;
pub(crate) mod families;

use super::rules::push_rule_set;
use super::{CLOCK_SLACK_MS, Request, RuleSet, Scope, ScopeMap, Subject, overrides};
use crate::domain::{EmailAddress, IpKey, JobId, RegistrableDomain};
use crate::settings::{LimitSettings, Rule};

pub(crate) use self::applicable::Applied;

/// The widest IPv4 network one client counts as in a domain's network
/// share (its own key beside the domain's): a /24, as hosting providers and
/// offices are commonly given.
pub const SHARE_IPV4_PREFIX: u8 = 24;

/// The widest IPv6 network one client counts as in a domain's network
/// share: a /48, a whole site's allocation (a host given a /48 holds
/// 65 536 /64s, each a network of the IP scope's default grouping).
pub const SHARE_IPV6_PREFIX: u8 = 48;

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
    pub(crate) fn new(prefix: &str, limits: &LimitSettings) -> Self {
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

    /// An override as the limiter counts its subject: a network narrower
    /// than the IP scope's grouping (`ipv4_prefix`, `ipv6_prefix`) widened
    /// to it, since the clients of one group share one log;
    /// `googlemail.com` as `gmail.com` where mailboxes are normalized so.
    pub(crate) fn counted(&self, mut ov: overrides::Override) -> overrides::Override {
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
    pub(crate) fn install(
        &self,
        overrides: Vec<overrides::Override>,
        version: Option<String>,
    ) -> usize {
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
    pub(crate) fn overrides_version(&self) -> Option<String> {
        self.table.load().version.clone()
    }

    /// The key of job `id`'s ledger record.
    pub(crate) fn record_key(&self, id: &JobId) -> String {
        let mut key = String::with_capacity(self.prefix.len() + 4 + id.as_str().len());
        key.push_str(&self.prefix);
        key.push_str(families::JOB);
        key.push_str(id.as_str());
        key
    }

    /// The rule sets `named` (by index: the configured ones, then the
    /// overrides' in `extra`, each with its index), as `decide.lua` reads
    /// them: no sets in order, then each named one as an extra set, its
    /// 1-based number then its number of rules, how long its keys keep
    /// admissions, and each rule's `(window_ms, max)`. A call carries only
    /// the sets its requests name (none for the ledger's marks), since
    /// Redis checks and builds every set a call carries (once per text,
    /// where the ledger runs as a Function library: see [`words`]).
    pub(crate) fn named_rule_set_args(
        &self,
        named: &std::collections::BTreeSet<usize>,
        extra: &[(usize, std::sync::Arc<RuleSet>)],
    ) -> Vec<i64> {
        let int = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        // Every index comes from a shape built with these sets; one that
        // were not would make the script refuse the call (its shape names
        // no set).
        let found: Vec<(usize, &std::sync::Arc<RuleSet>)> = (named.iter())
            .filter_map(|&index| {
                let set = (self.sets.get(index))
                    .or_else(|| extra.iter().find(|(i, _)| *i == index).map(|(_, s)| s));
                set.map(|set| (index, set))
            })
            .collect();
        let mut args = vec![0, int(found.len())];
        for (index, set) in found {
            args.push(int(index + 1));
            push_rule_set(set, &mut args);
        }
        args
    }

    /// Rule set `set` alone, as `decide.lua` reads rule sets (a count of 1,
    /// then the set, and no extra ones).
    pub(crate) fn one_rule_set_args(set: &RuleSet) -> Vec<i64> {
        let mut args = vec![1];
        push_rule_set(set, &mut args);
        args.push(0);
        args
    }

    /// The key of a subject's log.
    pub(crate) fn key_of(&self, subject: Subject<'_>) -> String {
        let l = &self.limits;
        match subject {
            Subject::Email(email) => {
                let mut key = String::with_capacity(self.prefix.len() + 6 + email.as_str().len());
                key.push_str(&self.prefix);
                key.push_str(families::EMAIL);
                email.push_mailbox_key(&l.normalize, &mut key);
                key
            }
            Subject::Ip(ip) => format!(
                "{}{}{}",
                self.prefix,
                families::IP,
                ip.network(l.ipv4_prefix, l.ipv6_prefix)
            ),
            Subject::Domain(domain) => format!("{}{}{domain}", self.prefix, families::DOMAIN),
            Subject::Share(domain, ip) => self.share_key(&self.key_of(Subject::Domain(domain)), ip),
        }
    }

    /// The key that marks `email`'s mailbox suppressed (`mailgate suppress
    /// add`): `<prefix>sup:<mailbox>`, a string "<since_ms> <source>
    /// <why>" that lives as long as the suppression. The mailbox is
    /// [`EmailAddress::mailbox_key`], as the limiter counts it, so every
    /// spelling that reaches the inbox (`JÖHN@`, `jöhn+x@`, a quoted local
    /// part) is suppressed with it: a suppressed owner cannot be reached by
    /// another spelling either. Only people write it, never a bounce.
    pub(crate) fn suppression_key(&self, email: &EmailAddress) -> String {
        let mut key = format!("{}{}", self.prefix, families::SUPPRESSION);
        email.push_mailbox_key(&self.limits.normalize, &mut key);
        key
    }

    /// The key that marks `email` as a relay refused it, "no such mailbox"
    /// (a 5.1.1): `<prefix>bounced:<address>`, valued as
    /// [`Keyspace::suppression_key`]. The address is exactly as it was
    /// sent ([`EmailAddress::as_str`]: the local part as written, quotes
    /// and case kept), since a server's "no such mailbox" is about the
    /// spelling it was given (RFC 5321 lets it look mailboxes up as
    /// written), which whoever asked for the code chose: a bounce of
    /// `JANE@owner.example` says nothing of `jane@owner.example`.
    pub(crate) fn bounce_key(&self, email: &EmailAddress) -> String {
        format!("{}{}{}", self.prefix, families::BOUNCED, email.as_str())
    }

    /// The run of bounces of `domain` (lower-case ASCII, as an address
    /// holds it): `<prefix>bounceruns:<domain>`, every worker's.
    pub(crate) fn bounce_run_key(&self, domain: &str) -> String {
        format!("{}{}{domain}", self.prefix, families::BOUNCE_RUNS)
    }

    /// Every key an admission of `email` reads for a suppression, in the
    /// order they are read: its own spelling's bounce
    /// ([`Keyspace::bounce_key`]), its mailbox's suppression
    /// ([`Keyspace::suppression_key`]), and, where it differs, the key
    /// versions before 2026-12-02 wrote a suppression of it under
    /// (`<prefix>sup:` and [`EmailAddress::address_key`]), so that
    /// suppressions people made then still hold. Those versions wrote
    /// bounces under `sup:` keys too, after folding ASCII case, so a
    /// stranger's spelling could suppress the owner: a `sup:` key whose
    /// source is `bounce` suppresses nothing ([`is_bounce_value`]).
    pub(crate) fn suppression_keys(&self, email: &EmailAddress) -> Vec<String> {
        let mailbox = self.suppression_key(email);
        let legacy = format!(
            "{}{}{}",
            self.prefix,
            families::SUPPRESSION,
            email.address_key()
        );
        let mut keys = vec![self.bounce_key(email), mailbox];
        if legacy != keys[1] {
            keys.push(legacy);
        }
        keys
    }

    /// Whether an admission reads its suppression keys
    /// (`limits.suppress`).
    pub(crate) fn checks_suppression(&self) -> bool {
        self.limits.suppress
    }

    /// How long a mailbox a relay said does not exist is suppressed, ms
    /// (`limits.suppress_bounces_for`); `None`: not at all.
    pub(crate) fn bounce_suppression_ms(&self) -> Option<u64> {
        let ms = u64::try_from(self.limits.suppress_bounces_for.as_millis()).unwrap_or(u64::MAX);
        (ms > 0).then_some(ms)
    }

    /// The key of one client network's share of a domain's log
    /// (`domain_key` is the domain's): `<domain key>:net:<network>`, the
    /// network an IPv4 /24 or an IPv6 /48 (narrower if the IP scope groups
    /// wider), so that one customer's whole allocation is one network. A
    /// domain holds no `:`, so no domain's key is another's share.
    pub(crate) fn share_key(&self, domain_key: &str, ip: &IpKey) -> String {
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
    /// newer one of the same requester, so a stranger asking for the
    /// owner's mailbox never has the owner's waiting code answered
    /// `superseded`. The requester is hashed into the key, so no session is
    /// stored.
    pub(crate) fn latest_key(&self, req: &Request<'_>) -> Option<String> {
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
        key.push_str(families::NEWEST);
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
    pub(crate) fn exempts(&self, subject: Subject<'_>) -> bool {
        matches!(subject, Subject::Domain(d) | Subject::Share(d, _) if self.exempt.contains(d))
    }

    /// Where Redis's clock should be now (ms): its time at the last reading
    /// moved on by this host's boot clock, which no one steps; before any
    /// reading, this host's wall clock.
    pub(crate) fn expected_redis_ms(&self) -> u64 {
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
    pub(crate) fn supersede_skew_ms(&self) -> u64 {
        u64::try_from(self.limits.supersede_skew.as_millis()).unwrap_or(u64::MAX)
    }

    pub(crate) fn lease_ms(&self) -> u64 {
        u64::try_from(self.limits.send_lease.as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    pub(crate) fn dedup_ms(&self) -> u64 {
        u64::try_from(self.limits.dedup_for.as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// How long Redis keeps a job record (and a `newest` key) after its last
    /// write: `limits.dedup_for` and [`CLOCK_SLACK_MS`], so a forward step
    /// of Redis's clock within the slack deletes no record that still
    /// keeps an id from being mailed twice.
    pub(crate) fn record_keep_ms(&self) -> u64 {
        self.dedup_ms().saturating_add(CLOCK_SLACK_MS)
    }

    /// How long anything mailgate keeps can still count: the longest of
    /// `limits.dedup_for` and the configured rules' windows (and stored
    /// overrides' own windows), in ms. Whatever Redis lost by a step of its
    /// clock no longer matters this long after it (see `ledger::clock`).
    pub(crate) fn horizon_ms(&self) -> u64 {
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

/// Whether a suppression key's value ("<since_ms> <source> <why>") was
/// written by a bounce: under a `sup:` key, by a version before
/// 2026-12-02, of a spelling a stranger chose, so it suppresses nothing
/// (see [`Keyspace::suppression_keys`]). Read as `ledger.lua` reads it
/// (`^%d+ bounce `).
pub(crate) fn is_bounce_value(value: &str) -> bool {
    let mut words = value.splitn(3, ' ');
    let since = words.next().unwrap_or_default();
    !since.is_empty()
        && since.bytes().all(|b| b.is_ascii_digit())
        && words.next() == Some("bounce")
        && words.next().is_some()
}

/// Whether the values of an admission's suppression keys (as
/// [`Keyspace::suppression_keys`] lists them; `None`: no such key)
/// suppress it: the first exists (a relay refused this spelling), or
/// another holds a suppression someone made ([`is_bounce_value`]).
pub(crate) fn suppressed_by<S: AsRef<str>>(values: &[Option<S>]) -> bool {
    (values.iter().enumerate()).any(|(i, v)| {
        v.as_ref()
            .is_some_and(|v| i == 0 || !is_bounce_value(v.as_ref()))
    })
}

/// Numbers as the words of one script argument, separated by single spaces
/// (`decide.lua`'s `words`): a Redis Function library keeps what it built
/// from a text, and one string costs Redis far less than as many
/// arguments. (A script builds anew each call, and splitting a text costs
/// it more than the arguments do.)
pub(crate) fn words(numbers: &[i64]) -> String {
    let mut text = String::with_capacity(numbers.len() * 8);
    for (i, n) in numbers.iter().enumerate() {
        if i > 0 {
            text.push(' ');
        }
        text.push_str(&n.to_string());
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bounce_value_reads_as_ledger_lua_reads_it() {
        for bounce in ["1800000000000 bounce 550 no such user", "1 bounce "] {
            assert!(is_bounce_value(bounce), "{bounce:?}");
        }
        for made in [
            "1 manual asked",
            "x bounce 550",
            " bounce 550",
            "1 bounce",
            "1 bounced x",
        ] {
            assert!(!is_bounce_value(made), "{made:?}");
        }
        let none: [Option<&str>; 3] = [None, None, None];
        assert!(!suppressed_by(&none));
        assert!(
            suppressed_by(&[Some("1 bounce x"), None]),
            "the first: its own bounce"
        );
        assert!(
            !suppressed_by(&[None, Some("1 bounce x")]),
            "an earlier version's bounce"
        );
        assert!(suppressed_by(&[None, None, Some("1 manual x")]));
    }
}
