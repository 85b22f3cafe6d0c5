//! The overrides in force as a [`Table`]: indexed by subject for the
//! lookups of every admission, several of one subject kept in the order
//! they hold, and each one's rule set numbered for the scripts.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

use super::{Action, MAX_OVERRIDES, Override, Target};
use crate::domain::{EmailAddress, RegistrableDomain};
use crate::limiter::{CLOCK_SLACK_MS, RuleSet, Scope};
use crate::settings::Rule;

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
/// (an address and its group). The first live one
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
    pub(crate) fn new(
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
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether any override names a domain (else the domain of a request
    /// need not be worked out for them).
    pub(crate) fn has_domains(&self) -> bool {
        !self.domains.is_empty()
    }

    /// The override of a mailbox (by its full email scope key) live at
    /// `now_ms`.
    pub(crate) fn email(&self, key: &str, now_ms: u64) -> Option<&Hit> {
        first_live(self.emails.get(key), now_ms)
    }

    /// The override of a domain (by its full domain scope key) live at
    /// `now_ms`.
    pub(crate) fn domain(&self, key: &str, now_ms: u64) -> Option<&Hit> {
        first_live(self.domains.get(key), now_ms)
    }

    /// The override of the narrowest network holding `ip` live at `now_ms`.
    pub(crate) fn ip(&self, ip: IpAddr, now_ms: u64) -> Option<&Hit> {
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
    let denies = lasting_first(&ovs, |a| matches!(a, Action::Deny));
    let rules = lasting_first(&ovs, |a| matches!(a, Action::Rules(_)));
    let allows = lasting_first(&ovs, |a| matches!(a, Action::Allow));
    let mut hits: Hits = (denies.into_iter())
        .map(|ov| deny_hit(ov, next_set))
        .collect();
    let mut rebuild_at = None;
    if let Some((hit, at)) = rules_hit(&rules, next_set, keep_ms, share) {
        hits.push(hit);
        rebuild_at = at;
    }
    hits.extend(allows.into_iter().map(|ov| Hit {
        ov: Arc::new(ov),
        set: None,
        share: None,
    }));
    (hits, rebuild_at)
}

/// The overrides of `ovs` whose action is of `kind`, the longest-lasting
/// first: no expiry, then the latest.
fn lasting_first(ovs: &[Override], kind: fn(&Action) -> bool) -> Vec<Override> {
    let lasting = |o: &Override| std::cmp::Reverse(o.expires_at_ms.unwrap_or(u64::MAX));
    let mut v: Vec<Override> = ovs.iter().filter(|o| kind(&o.action)).cloned().collect();
    v.sort_by_key(lasting);
    v
}

/// `set` with its number among all rule sets, `next_set`, which moves on.
fn number(next_set: &mut usize, set: RuleSet) -> (usize, Arc<RuleSet>) {
    *next_set += 1;
    (*next_set - 1, Arc::new(set))
}

/// A deny's hit: a set that rejects every request until the deny expires
/// (0: for good), numbered next.
fn deny_hit(ov: Override, next_set: &mut usize) -> Hit {
    let set = number(
        next_set,
        RuleSet {
            rules: Vec::new(),
            keep_ms: 1,
            deny_until_ms: Some(ov.expires_at_ms.unwrap_or(0)),
        },
    );
    Hit {
        ov: Arc::new(ov),
        set: Some(set),
        share: None,
    }
}

/// The rules overrides of one subject (`rules`, the longest-lasting first)
/// as one hit: one set of their [`tightest`] rules, numbered next, kept at
/// least as long as the scope's own keys keep admissions (`keep_ms`); for a
/// domain, each network's share of it (`share`) numbered after it. With it,
/// if several were merged, when the first of them expires. `None` without
/// rules overrides.
fn rules_hit(
    rules: &[Override],
    next_set: &mut usize,
    keep_ms: &impl Fn(Scope) -> u64,
    share: &impl Fn(&RuleSet) -> Option<RuleSet>,
) -> Option<(Hit, Option<u64>)> {
    let first = rules.first()?;
    let all = tightest(rules);
    let set = number(
        next_set,
        RuleSet {
            keep_ms: (all.iter().map(Rule::window_ms))
                .max()
                .unwrap_or(1)
                .saturating_add(CLOCK_SLACK_MS)
                .max(keep_ms(first.target.scope())),
            rules: all.clone(),
            deny_until_ms: None,
        },
    );
    let (ov, rebuild_at) = merged(first, rules, all);
    // A domain's own rules hold each network to its share of them too.
    let shared = match first.target.scope() {
        Scope::Domain => share(&set.1).map(|s| number(next_set, s)),
        _ => None,
    };
    let hit = Hit {
        ov: Arc::new(ov),
        set: Some(set),
        share: shared,
    };
    Some((hit, rebuild_at))
}

/// Every rule of every one of `rules`, the tightest max per window (and per
/// shadow window): no more rules than there are windows, however many
/// overrides (a set per combination would grow quadratically).
fn tightest(rules: &[Override]) -> Vec<Rule> {
    let mut tightest: BTreeMap<(u64, bool), Rule> = Default::default();
    for o in rules {
        if let Action::Rules(rs) = &o.action {
            for r in rs {
                let at = tightest.entry((r.window_ms(), r.enforce)).or_insert(*r);
                if r.max < at.max {
                    *at = *r;
                }
            }
        }
    }
    tightest.into_values().collect()
}

/// The override standing for `rules` (`first` the longest-lasting of them)
/// with their rules `all`: the one itself, or one that says several hold at
/// once; and, for several, when the first of them expires.
fn merged(first: &Override, rules: &[Override], all: Vec<Rule>) -> (Override, Option<u64>) {
    match rules {
        [one] => (one.clone(), None),
        several => {
            let rebuild_at = several.iter().filter_map(|o| o.expires_at_ms).min();
            let ov = Override {
                target: first.target.clone(),
                action: Action::Rules(all),
                reason: format!("{} overrides at once: {}", several.len(), first.reason),
                // Live as long as one of them is; the table is built
                // again as each expires.
                expires_at_ms: first.expires_at_ms,
                added_at_ms: several.iter().map(|o| o.added_at_ms).max().unwrap_or(0),
            };
            (ov, rebuild_at)
        }
    }
}
