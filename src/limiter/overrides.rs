//! Overrides: exceptions to the configured limits that support staff and
//! operators add, list and remove at run time (`mailgate overrides`),
//! without a redeploy.
//!
//! An override names one subject (an exact mailbox, a registrable domain,
//! or an IP network) and says what happens to requests that match it:
//! - `allow`: not limited or counted by the subject's own scope (a QA
//!   mailbox, a monitoring network, a big provider's domain); the other
//!   scopes still judge the request, so an allowed network cannot
//!   mail-bomb a victim, nor can anyone spend the relay's quota through an
//!   allowed mailbox from one client (found by review);
//! - `deny`: rejected, with `retry_after_ms` the override's remaining
//!   lifetime (or what the other rules say, if longer);
//! - rules of its own, which replace the scope's for that subject (for
//!   every purpose).
//!
//! A deny beats everything. Each override has a required reason and an
//! optional expiry (at most 366 days).
//!
//! They are stored in Redis, and polled by every worker, by the
//! [`OverrideStore`](crate::store::overrides::OverrideStore); here is what
//! they are and how a request finds the one that applies (`Table`).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

use super::{CLOCK_SLACK_MS, RuleSet, Scope};
use crate::domain::Normalization;
use crate::domain::{EmailAddress, IpKey, RegistrableDomain};
use crate::settings::{MAX_PERIOD, Rule};

/// The widest IPv4 network an override may name without `--force` (a /8:
/// 16 777 216 addresses).
pub const WIDEST_V4: u8 = 8;

/// The widest IPv6 network an override may name without `--force` (a /32:
/// a large provider's whole allocation).
pub const WIDEST_V6: u8 = 32;

/// How many addresses `net` holds, in words (`256 addresses`, `every IPv4
/// address (4294967296)`, `2^64 addresses (4294967296 /64 networks)`).
fn coverage(net: &IpNet) -> String {
    let bits = u32::from(net.max_prefix_len() - net.prefix_len());
    let count = if bits < 64 {
        (1u64 << bits).to_string()
    } else {
        format!("2^{bits}")
    };
    let every = net.prefix_len() == 0;
    match net {
        IpNet::V4(_) if every => format!("every IPv4 address ({count})"),
        IpNet::V4(_) if bits == 0 => "one address".into(),
        IpNet::V4(_) => format!("{count} addresses"),
        IpNet::V6(_) if every => "every IPv6 address".into(),
        IpNet::V6(_) if bits <= 64 => format!("{count} addresses (within one /64 network or less)"),
        IpNet::V6(_) => format!("{count} addresses ({} /64 networks)", {
            let nets = bits - 64;
            if nets < 64 {
                (1u64 << nets).to_string()
            } else {
                format!("2^{nets}")
            }
        }),
    }
}

/// At most this many overrides are kept: each one with rules of its own is
/// a rule set a script call may name (`decide.lua` numbers sets with two
/// base-64 digits, 4095 at most, and settings use up to 303).
pub const MAX_OVERRIDES: usize = 3_000;

/// What an override matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// One mailbox, as the limiter normalizes it.
    Email(EmailAddress),
    /// A registrable domain (the domain scope's subject).
    Domain(RegistrableDomain),
    /// An IP network: every client address in it.
    Net(IpNet),
}

impl Target {
    /// Parses `email:<mailbox>`, `domain:<registrable domain>` or
    /// `ip:<address or network>`.
    pub fn parse(input: &str) -> Result<Self, OverrideError> {
        let bad = |why: String| OverrideError::Invalid(why);
        let (kind, value) = input
            .split_once(':')
            .ok_or_else(|| bad(format!("{input:?}: give email:…, domain:… or ip:…")))?;
        match kind {
            "email" => EmailAddress::parse(value)
                .map(Target::Email)
                .map_err(|e| bad(format!("email {value:?}: {e}"))),
            "domain" => RegistrableDomain::parse_exact(value)
                .map(Target::Domain)
                .map_err(|e| bad(format!("domain {value:?}: {e}"))),
            "ip" => {
                let net = match value.parse::<IpNet>() {
                    Ok(net) => net,
                    Err(_) => IpKey::parse(value)
                        .map(|ip| IpNet::from(ip.addr()))
                        .map_err(|_| bad(format!("ip {value:?}: not an address or a network")))?,
                };
                // A v4-mapped v6 network is the v4 network (as client
                // addresses are).
                Ok(Target::Net(canonical(net)))
            }
            _ => Err(bad(format!(
                "{kind:?}: an override matches email:…, domain:… or ip:…"
            ))),
        }
    }

    /// Parses as [`Self::parse`], and refuses what is likely a mistake in
    /// an override being added: a network with host bits set
    /// (`203.0.113.7/0` reads as every client, not the one address), and,
    /// unless `force`, a network wider than [`WIDEST_V4`] or
    /// [`WIDEST_V6`], which would take most clients out of the IP scope (or
    /// lock them all out) at once.
    pub fn parse_to_add(input: &str, force: bool) -> Result<Self, OverrideError> {
        let target = Self::parse(input)?;
        if let Target::Domain(d) = &target
            && d.is_public_suffix()
        {
            return Err(OverrideError::Invalid(format!(
                "domain:{d} is a public suffix: no mailbox counts as it (alice@acme.{d} counts \
                 as acme.{d}); name the registrable domain"
            )));
        }
        let Target::Net(net) = target else {
            return Ok(target);
        };
        let bad = |why: String| Err(OverrideError::Invalid(why));
        let written = input.split_once(':').map_or(input, |(_, v)| v);
        if let Ok(raw) = written.parse::<IpNet>()
            && raw.addr() != raw.network()
        {
            return bad(format!(
                "ip:{written} has host bits set under /{}: it would cover {}, not the one \
                 address; write ip:{} for the network or ip:{} for the address",
                raw.prefix_len(),
                coverage(&canonical(raw)),
                raw.trunc(),
                raw.addr()
            ));
        }
        let widest = match net {
            IpNet::V4(_) => WIDEST_V4,
            IpNet::V6(_) => WIDEST_V6,
        };
        if net.prefix_len() < widest && !force {
            return bad(format!(
                "ip:{net} covers {}; an override wider than /{WIDEST_V4} (IPv4) or /{WIDEST_V6} \
                 (IPv6) needs --force",
                coverage(&net)
            ));
        }
        Ok(target)
    }

    /// What it covers, said for people: a mailbox, a domain's mailboxes, or
    /// how many client addresses.
    pub fn coverage(&self) -> String {
        match self {
            Target::Email(_) => "one mailbox (every spelling the limiter counts as it)".into(),
            Target::Domain(d) => format!("every mailbox at {d} and its subdomains"),
            Target::Net(n) => coverage(n),
        }
    }

    /// The scope whose subject it names.
    pub fn scope(&self) -> Scope {
        match self {
            Target::Email(_) => Scope::Email,
            Target::Domain(_) => Scope::Domain,
            Target::Net(_) => Scope::Ip,
        }
    }

    /// Its field in the hash, one per subject: the same mailbox spelled
    /// twice is one field.
    pub(crate) fn field(&self, norm: &Normalization) -> String {
        match self {
            Target::Email(e) => format!("email:{}", e.mailbox_key(norm)),
            Target::Domain(d) => format!("domain:{d}"),
            Target::Net(n) => format!("ip:{}", n.trunc()),
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Email(e) => write!(f, "email:{e}"),
            Target::Domain(d) => write!(f, "domain:{d}"),
            Target::Net(n) => write!(f, "ip:{}", n.trunc()),
        }
    }
}

/// A network of IPv4-mapped IPv6 addresses as the IPv4 network.
fn canonical(net: IpNet) -> IpNet {
    match net {
        IpNet::V6(v6) if v6.prefix_len() >= 96 => match v6.addr().to_ipv4_mapped() {
            Some(v4) => ipnet::Ipv4Net::new(v4, v6.prefix_len() - 96)
                .map(IpNet::V4)
                .unwrap_or(net),
            None => net,
        },
        other => other,
    }
}

/// What an override does to the requests it matches.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Not limited or counted by the subject's own scope.
    Allow,
    /// Always rejected while it lasts.
    Deny,
    /// Judged by these rules instead of the scope's.
    Rules(Vec<Rule>),
}

impl Action {
    /// `allow`, `deny` or `rules`: the kind, as metrics and `list` name it.
    pub fn kind(&self) -> &'static str {
        match self {
            Action::Allow => "allow",
            Action::Deny => "deny",
            Action::Rules(_) => "rules",
        }
    }
}

/// One override.
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    /// What it matches.
    pub target: Target,
    /// What it does.
    pub action: Action,
    /// Why it exists (required: whoever finds it later must know).
    pub reason: String,
    /// When it ends, ms since the epoch; `None`: when removed.
    pub expires_at_ms: Option<u64>,
    /// When it was added, ms since the epoch.
    pub added_at_ms: u64,
}

impl Override {
    /// Checks what the CLI cannot: a reason, rules that settings would
    /// accept (whole milliseconds: the limiter counts no finer), an expiry
    /// in the future and at most [`MAX_PERIOD`] away.
    pub fn check(&self, now_ms: u64) -> Result<(), OverrideError> {
        self.check_shape()?;
        let max = u64::try_from(MAX_PERIOD.as_millis()).unwrap_or(u64::MAX);
        match self.expires_at_ms {
            Some(t) if t <= now_ms => {
                Err(OverrideError::Invalid("the expiry is in the past".into()))
            }
            Some(t) if t - now_ms > max => Err(OverrideError::Invalid(
                "an override lasts at most 366 days (or, without an expiry, until removed)".into(),
            )),
            _ => Ok(()),
        }
    }

    /// What every override must be, however it was written (a hand-made
    /// entry in Redis is checked too, and ignored if it fails: one bad rule
    /// set would fail every script call it rode in).
    pub(crate) fn check_shape(&self) -> Result<(), OverrideError> {
        let bad = |why: &str| Err(OverrideError::Invalid(why.to_owned()));
        if self.reason.trim().is_empty() || self.reason.len() > 500 {
            return bad("an override needs a reason (1 to 500 bytes)");
        }
        if let Action::Rules(rules) = &self.action {
            if rules.is_empty() || rules.len() > 16 {
                return bad("give 1 to 16 rules");
            }
            if (rules.iter()).any(|r| r.max == 0 || r.window_ms() == 0 || r.window > MAX_PERIOD) {
                return bad("each rule needs a max of at least 1 and a window of 1ms to 366 days");
            }
        }
        Ok(())
    }

    /// Whether it still holds at `now_ms`.
    pub fn live(&self, now_ms: u64) -> bool {
        self.expires_at_ms.is_none_or(|t| t > now_ms)
    }
}

/// Why an override could not be read, stored or applied.
#[derive(Debug, Clone, thiserror::Error)]
pub enum OverrideError {
    /// What was asked makes no sense (the message says why).
    #[error("{0}")]
    Invalid(String),
    /// Redis could not be reached or refused.
    #[error("redis: {0}")]
    Redis(Arc<::redis::RedisError>),
    /// Redis refuses mailgate for good: credentials, an ACL, a database it
    /// does not have (the message says which).
    #[error("{0}")]
    Unfit(String),
}

impl From<::redis::RedisError> for OverrideError {
    fn from(e: ::redis::RedisError) -> Self {
        OverrideError::Redis(Arc::new(e))
    }
}

/// What applies to one subject: the override, and the rule set it judges
/// by (rules of its own, or a deny).
#[derive(Debug, Clone)]
pub(crate) struct Hit {
    /// The override in force (for rules merged from several, one that
    /// says so: their rules, reasons and first expiry).
    pub ov: Arc<Override>,
    /// For rules and denies: the set, and its number among all rule sets.
    pub set: Option<(usize, Arc<RuleSet>)>,
    /// For a domain's rules: each client network's share of them
    /// ([`RuleSet::shared`]), and its number, if it holds anything back.
    pub share: Option<(usize, Arc<RuleSet>)>,
}

impl Hit {
    fn live(&self, now_ms: u64) -> bool {
        self.ov.live(now_ms)
    }
}

/// The overrides of one subject, in the order they hold: two stored
/// overrides can name one subject once widened as the limiter counts it
/// (an address and its group, found by review). The first live one
/// applies, so when one expires the next holds at once, on every worker
/// alike. Denies first, the longest-lasting first (so the wait answered is
/// the longest); then rules: all live ones together (a request must pass
/// each), as one set holding the tightest max of each window; then allows.
/// When one of several merged rules overrides expires, the table is built
/// again ([`Table::rebuild_at`]).
type Hits = Vec<Hit>;

/// The overrides in force, indexed for lookups on every admission.
#[derive(Debug, Default)]
pub(crate) struct Table {
    /// Full email scope key → its overrides.
    emails: HashMap<String, Hits>,
    /// Full domain scope key → its overrides.
    domains: HashMap<String, Hits>,
    /// Networks, by prefix length, longest first: (length, masked net →
    /// hits).
    nets: Vec<(u8, bool, HashMap<IpNet, Hits>)>,
    /// How many subjects have one.
    len: usize,
    /// The stamp of the hash this was built from (see
    /// [`crate::store::overrides`]: its version and length).
    pub version: Option<String>,
    /// What it was built from.
    pub all: Vec<Override>,
    /// When one of several rules overrides merged for a subject expires:
    /// the table must be built again then, without it (until then the
    /// merged set holds, stricter, never looser).
    pub rebuild_at: Option<u64>,
}

/// A subject's place in the [`Table`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Place {
    Email(String),
    Domain(String),
    Net(IpNet),
}

impl Table {
    /// Indexes `overrides` (several for one subject are kept in the order
    /// they hold: [`Hits`]). `email_key` and `domain_key` name a subject's
    /// scope key; rule sets are numbered from `first_set`, and a scope's
    /// keys keep admissions for at least `keep_ms` of that scope (its
    /// longest window).
    pub fn new(
        overrides: Vec<Override>,
        email_key: impl Fn(&EmailAddress) -> String,
        domain_key: impl Fn(&RegistrableDomain) -> String,
        first_set: usize,
        keep_ms: impl Fn(Scope) -> u64,
        share: impl Fn(&RuleSet) -> Option<RuleSet>,
    ) -> Self {
        let mut subjects: Vec<(Place, Vec<Override>)> = Vec::new();
        let mut at: HashMap<Place, usize> = HashMap::new();
        let all: Vec<Override> = overrides.into_iter().take(MAX_OVERRIDES).collect();
        for ov in all.iter().cloned() {
            let place = match &ov.target {
                Target::Email(e) => Place::Email(email_key(e)),
                Target::Domain(d) => Place::Domain(domain_key(d)),
                Target::Net(net) => Place::Net(net.trunc()),
            };
            match at.get(&place) {
                Some(&i) => subjects[i].1.push(ov),
                None => {
                    at.insert(place.clone(), subjects.len());
                    subjects.push((place, vec![ov]));
                }
            }
        }
        let mut table = Table::default();
        let mut next_set = first_set;
        for (place, ovs) in subjects {
            let (hits, rebuild_at) = hits_of(ovs, &mut next_set, &keep_ms, &share);
            table.rebuild_at = match (table.rebuild_at, rebuild_at) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            table.len += 1;
            match place {
                Place::Email(key) => {
                    table.emails.insert(key, hits);
                }
                Place::Domain(key) => {
                    table.domains.insert(key, hits);
                }
                Place::Net(net) => {
                    let (len, v4) = (net.prefix_len(), matches!(net, IpNet::V4(_)));
                    let i = match (table.nets.iter()).position(|(l, f, _)| *l == len && *f == v4) {
                        Some(i) => i,
                        None => {
                            table.nets.push((len, v4, HashMap::new()));
                            table.nets.sort_by_key(|n| std::cmp::Reverse(n.0));
                            (table.nets.iter())
                                .position(|(l, f, _)| *l == len && *f == v4)
                                .unwrap_or(0)
                        }
                    };
                    table.nets[i].2.insert(net, hits);
                }
            }
        }
        table.all = all;
        table
    }

    /// How many subjects have overrides.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether any override names a domain (else the domain of a request
    /// need not be worked out for them).
    pub fn has_domains(&self) -> bool {
        !self.domains.is_empty()
    }

    /// The override of a mailbox (by its full email scope key) live at
    /// `now_ms`.
    pub fn email(&self, key: &str, now_ms: u64) -> Option<&Hit> {
        first_live(self.emails.get(key), now_ms)
    }

    /// The override of a domain (by its full domain scope key) live at
    /// `now_ms`.
    pub fn domain(&self, key: &str, now_ms: u64) -> Option<&Hit> {
        first_live(self.domains.get(key), now_ms)
    }

    /// The override of the narrowest network holding `ip` live at `now_ms`.
    pub fn ip(&self, ip: IpAddr, now_ms: u64) -> Option<&Hit> {
        let v4 = ip.is_ipv4();
        self.nets
            .iter()
            .filter(|(_, f, _)| *f == v4)
            .find_map(|(len, _, nets)| {
                let net = IpNet::new(ip, *len).ok()?.trunc();
                first_live(nets.get(&net), now_ms)
            })
    }
}

/// The first override of `hits` live at `now_ms`.
fn first_live(hits: Option<&Hits>, now_ms: u64) -> Option<&Hit> {
    hits?.iter().find(|h| h.live(now_ms))
}

/// The overrides of one subject as [`Hits`], their rule sets numbered from
/// `next_set` on; and, if several rules overrides were merged, when the
/// first of them expires.
fn hits_of(
    ovs: Vec<Override>,
    next_set: &mut usize,
    keep_ms: &impl Fn(Scope) -> u64,
    share: &impl Fn(&RuleSet) -> Option<RuleSet>,
) -> (Hits, Option<u64>) {
    let mut number = |set: RuleSet| {
        *next_set += 1;
        Some((*next_set - 1, Arc::new(set)))
    };
    // Longest-lasting first: no expiry, then the latest.
    let lasting = |o: &Override| std::cmp::Reverse(o.expires_at_ms.unwrap_or(u64::MAX));
    let of = |kind: fn(&Action) -> bool| {
        let mut v: Vec<Override> = ovs.iter().filter(|o| kind(&o.action)).cloned().collect();
        v.sort_by_key(lasting);
        v
    };
    let denies = of(|a| matches!(a, Action::Deny));
    let rules = of(|a| matches!(a, Action::Rules(_)));
    let allows = of(|a| matches!(a, Action::Allow));
    let mut hits = Vec::new();
    for ov in denies {
        let set = number(RuleSet {
            rules: Vec::new(),
            keep_ms: 1,
            deny_until_ms: Some(ov.expires_at_ms.unwrap_or(0)),
        });
        hits.push(Hit {
            ov: Arc::new(ov),
            set,
            share: None,
        });
    }
    let mut rebuild_at = None;
    if let Some(first) = rules.first() {
        // Every rule of every one, the tightest max per window (and per
        // shadow window): no more rules than there are windows, however
        // many overrides (found by review: a set per combination grew
        // quadratically).
        let mut tightest: std::collections::BTreeMap<(u64, bool), Rule> = Default::default();
        for o in &rules {
            if let Action::Rules(rs) = &o.action {
                for r in rs {
                    let at = tightest.entry((r.window_ms(), r.enforce)).or_insert(*r);
                    if r.max < at.max {
                        *at = *r;
                    }
                }
            }
        }
        let all: Vec<Rule> = tightest.into_values().collect();
        let set = number(RuleSet {
            keep_ms: (all.iter().map(Rule::window_ms))
                .max()
                .unwrap_or(1)
                .saturating_add(CLOCK_SLACK_MS)
                .max(keep_ms(first.target.scope())),
            rules: all.clone(),
            deny_until_ms: None,
        });
        let ov = match rules.as_slice() {
            [one] => one.clone(),
            several => {
                rebuild_at = several.iter().filter_map(|o| o.expires_at_ms).min();
                Override {
                    target: first.target.clone(),
                    action: Action::Rules(all),
                    reason: format!("{} overrides at once: {}", several.len(), first.reason),
                    // Live as long as one of them is; the table is built
                    // again as each expires.
                    expires_at_ms: first.expires_at_ms,
                    added_at_ms: several.iter().map(|o| o.added_at_ms).max().unwrap_or(0),
                }
            }
        };
        // A domain's own rules hold each network to its share of them too.
        let shared = match (first.target.scope(), &set) {
            (Scope::Domain, Some((_, set))) => share(set).and_then(&mut number),
            _ => None,
        };
        hits.push(Hit {
            ov: Arc::new(ov),
            set,
            share: shared,
        });
    }
    hits.extend(allows.into_iter().map(|ov| Hit {
        ov: Arc::new(ov),
        set: None,
        share: None,
    }));
    (hits, rebuild_at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_and_name_one_field_per_subject() {
        let norm = Normalization::default();
        let a = Target::parse("email:J.o.h.n+x@GMail.com").unwrap();
        let b = Target::parse("email:john@gmail.com").unwrap();
        assert_eq!(a.field(&norm), b.field(&norm));
        let n = Target::parse("ip:10.1.2.3/8").unwrap();
        assert_eq!(n.to_string(), "ip:10.0.0.0/8");
        assert_eq!(
            Target::parse("ip:::ffff:10.0.0.0/104").unwrap(),
            Target::parse("ip:10.0.0.0/8").unwrap()
        );
        assert_eq!(
            Target::parse("ip:2001:db8::1").unwrap().to_string(),
            "ip:2001:db8::1/128"
        );
        assert!(
            Target::parse("domain:a.b.example.co.uk").is_err(),
            "registrable only"
        );
        assert!(Target::parse("domain:example.co.uk").is_ok());
        for bad in ["x", "user:a@b.c", "ip:10.0.0.300", "email:nope"] {
            assert!(Target::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_narrowest_live_network_matches() {
        let ov = |t: &str, expires: Option<u64>| Override {
            target: Target::parse(t).unwrap(),
            action: Action::Allow,
            reason: "r".into(),
            expires_at_ms: expires,
            added_at_ms: 0,
        };
        let table = Table::new(
            vec![
                ov("ip:10.0.0.0/8", None),
                ov("ip:10.1.0.0/16", Some(100)),
                ov("ip:2001:db8::/32", None),
            ],
            |e| e.to_string(),
            |d| d.to_string(),
            3,
            |_| 1,
            |_| None,
        );
        let at = |ip: &str, now| {
            table
                .ip(ip.parse().unwrap(), now)
                .map(|h| h.ov.target.to_string())
        };
        assert_eq!(at("10.1.2.3", 50).as_deref(), Some("ip:10.1.0.0/16"));
        assert_eq!(
            at("10.1.2.3", 100).as_deref(),
            Some("ip:10.0.0.0/8"),
            "expired"
        );
        assert_eq!(at("11.0.0.1", 50), None);
        assert_eq!(at("2001:db8:1::9", 50).as_deref(), Some("ip:2001:db8::/32"));
        assert_eq!(table.len(), 3);
    }

    /// Found by reviews H and I: overrides of one subject (stored apart,
    /// widened to one) were resolved by the order their fields were read
    /// in, then by a "tighter" rule set that was not (1000 a day beat 1 a
    /// minute), a newer, shorter deny hid a longer one, and once the
    /// stronger expired the weaker stayed hidden until the next change.
    #[test]
    fn overrides_of_one_subject_hold_together_in_order() {
        use crate::settings::Rule;
        use std::time::Duration;
        let ov = |action: Action, expires: Option<u64>, added| Override {
            target: Target::parse("ip:10.1.2.0/24").unwrap(),
            action,
            reason: format!("r{added}"),
            expires_at_ms: expires,
            added_at_ms: added,
        };
        let rule = |s: u64, n: u32| Rule::new(Duration::from_secs(s), n);
        // As the table is built again when a merged one expires.
        let held = |ovs: Vec<Override>, now| {
            let ovs = ovs.into_iter().filter(|o| o.live(now)).collect();
            let table = Table::new(
                ovs,
                |e| e.to_string(),
                |d| d.to_string(),
                3,
                |_| 1,
                |_| None,
            );
            assert!(table.len() <= 1);
            let hit = table.ip("10.1.2.3".parse().unwrap(), now).cloned();
            hit.map(|h| (h.ov.action.clone(), h.ov.expires_at_ms))
        };
        let rules_of = |held: Option<(Action, Option<u64>)>| match held {
            Some((Action::Rules(mut r), _)) => {
                r.sort_by_key(|r| (r.window, r.max));
                r
            }
            other => panic!("{other:?}"),
        };
        // 1 a minute and 1000 a day both apply, in either order; when the
        // first to expire does, the other alone.
        for ovs in [
            vec![
                ov(Action::Rules(vec![rule(60, 1)]), Some(100), 1),
                ov(Action::Rules(vec![rule(86400, 1000)]), None, 2),
            ],
            vec![
                ov(Action::Rules(vec![rule(86400, 1000)]), None, 2),
                ov(Action::Rules(vec![rule(60, 1)]), Some(100), 1),
            ],
        ] {
            assert_eq!(
                rules_of(held(ovs.clone(), 10)),
                [rule(60, 1), rule(86400, 1000)]
            );
            assert_eq!(rules_of(held(ovs, 150)), [rule(86400, 1000)]);
        }
        // However many, one set: the tightest max per window; built again
        // when the first of them expires.
        let many: Vec<Override> = (1..=1000)
            .map(|i| {
                ov(
                    Action::Rules(vec![
                        rule(60, 1001 - i),
                        rule(3600 + u64::from(i % 3), 5000),
                    ]),
                    Some(1000 + u64::from(i)),
                    i.into(),
                )
            })
            .collect();
        let table = Table::new(
            many.clone(),
            |e| e.to_string(),
            |d| d.to_string(),
            3,
            |_| 1,
            |_| None,
        );
        assert_eq!(table.rebuild_at, Some(1001));
        let hit = table.ip("10.1.2.3".parse().unwrap(), 10).unwrap();
        let set = &hit.set.as_ref().unwrap().1;
        assert_eq!(set.rules.len(), 4, "{:?}", set.rules);
        assert!(
            set.rules.contains(&rule(60, 1)),
            "the tightest of the minute rules"
        );
        // Of two denies the longest-lasting holds, newer or not.
        let denies = vec![ov(Action::Deny, None, 1), ov(Action::Deny, Some(100), 2)];
        assert_eq!(held(denies, 10), Some((Action::Deny, None)));
        // A deny holds while it lasts; then the rules; then the allow.
        let all = || {
            vec![
                ov(Action::Allow, None, 1),
                ov(Action::Rules(vec![rule(60, 1)]), Some(200), 2),
                ov(Action::Deny, Some(100), 3),
            ]
        };
        assert_eq!(held(all(), 50), Some((Action::Deny, Some(100))));
        assert_eq!(rules_of(held(all(), 150)), [rule(60, 1)]);
        assert_eq!(held(all(), 250), Some((Action::Allow, None)));
        assert_eq!(held(vec![ov(Action::Deny, Some(100), 3)], 150), None);
    }
}
