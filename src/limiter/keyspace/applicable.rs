//! Which scopes judge a request, by which rule sets: the purpose's or the
//! default rules, as the overrides in force change them, and a domain's
//! network share.

use super::Keyspace;
use crate::domain::{Name, RegistrableDomain};
use crate::limiter::rules::{NO_RULES, RuleSet};
use crate::limiter::{Request, Scope, ScopeMap, Subject, overrides};

/// One scope that applies to a request: its scope, its key, and the rule
/// set it is judged by (with its number among all rule sets, as shapes
/// name it); `share`: the key is the client network's share of the
/// domain's log.
#[derive(Debug, Clone)]
pub(crate) struct Applied {
    pub scope: Scope,
    pub key: String,
    pub index: usize,
    pub set: std::sync::Arc<RuleSet>,
    pub share: bool,
}

impl Applied {
    /// Whether this log is the requester's own (its client network, or
    /// that network's share of a domain) rather than the mailbox's or the
    /// domain's: an admission whose job failed stays counted in it, so
    /// failures (a probe of made-up mailboxes, a code the relay refuses)
    /// are not free to whoever asks, while the mailbox and the domain,
    /// whom a stranger's failures must not lock out, get theirs back.
    pub(crate) fn is_requesters(&self) -> bool {
        self.scope == Scope::Ip || self.share
    }
}

impl Keyspace {
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
    pub(crate) fn lookup(
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
    /// leaves them out, a domain override's rules too: an override raising
    /// a domain's limits (an onboarding day) puts no password reset back
    /// under the domain's rule, where a stranger's flood would lock it out.
    fn leaves_out_domain(&self, purpose: Option<&Name>) -> bool {
        (purpose.and_then(|p| self.purposes.get(p.as_str())))
            .and_then(|own| own[Scope::Domain])
            .is_some_and(|i| self.sets[i].rules.is_empty())
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
    pub(crate) fn applicable(&self, req: &Request<'_>) -> Vec<Applied> {
        self.applicable_by(req).0
    }

    /// [`Keyspace::applicable`], and the kind of the override that changed
    /// them, if one did (the deny, else the allow, else rules).
    pub(crate) fn applicable_by(&self, req: &Request<'_>) -> (Vec<Applied>, Option<&'static str>) {
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
                share: false,
            });
            if let (Some(((index, set), _)), Some(key)) = (share, share_key) {
                out.push(Applied {
                    scope,
                    key,
                    index,
                    set,
                    share: true,
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
                    share: false,
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
}
