//! A plain reference model of the limiter and the ledger, written straight
//! from the definitions and sharing no code with either backend: counts are
//! recounted from a flat list of admissions, `retry_after_ms` is found by
//! trying every moment at which some admission leaves some window, and each
//! job's record follows the lifecycle in `src/ledger/mod.rs`.

use mailgate::ledger::{Refund, Verdict};
use mailgate::limiter::{RuleRef, Scope};
use mailgate::settings::Rule;

struct Admission {
    at: u64,
    id: String,
    keys: Vec<String>,
    /// The keys it stays counted in if its job fails: the requester's own,
    /// its client network's and that network's share of a domain.
    requesters: Vec<String>,
    /// Whether its job ended in a refund: a later refund of the same id
    /// (another lineage's admission) leaves it as that one left it.
    refunded: bool,
}

#[derive(Clone, Copy, PartialEq)]
enum State {
    Admitted,
    Sending,
    Sent,
    Unknown,
    Refunded,
}

struct Record {
    id: String,
    /// What the id was admitted for (any value that differs per job).
    fp: String,
    at: u64,
    state: State,
    owner: u32,
    lease_until: u64,
    answered: bool,
}

/// Scopes that apply to one request: `(scope, key, rules)` in decision order.
pub(crate) type Scopes<'a> = Vec<(Scope, String, &'a [Rule])>;

pub(crate) struct Model {
    admissions: Vec<Admission>,
    records: Vec<Record>,
    lease_ms: u64,
    /// The shadow rule the last fresh admission would have been rejected
    /// by (the one with the longest wait, the first on a tie).
    pub shadow: Option<RuleRef>,
    /// What the last fresh admission left of each scope's quota: per
    /// scope with an enforced rule, the rule with the fewest remaining (on
    /// a tie the later reset, then the first), its remaining and its reset.
    pub rooms: Vec<(RuleRef, u32, u64)>,
}

impl Model {
    pub(crate) fn new(lease_ms: u64) -> Self {
        Self {
            admissions: Vec::new(),
            records: Vec::new(),
            lease_ms,
            shadow: None,
            rooms: Vec::new(),
        }
    }

    fn count(&self, key: &str, window_ms: u64, at: u64) -> usize {
        self.admissions
            .iter()
            .filter(|a| a.keys.iter().any(|k| k == key))
            .filter(|a| a.at + window_ms > at)
            .count()
    }

    /// The enforced rules (or, with `enforce` false, the shadow rules) that
    /// are full at `at`, in order.
    fn full(&self, scopes: &Scopes<'_>, at: u64, enforce: bool) -> Vec<RuleRef> {
        let mut full = Vec::new();
        for (scope, key, rules) in scopes {
            for r in rules.iter().filter(|r| r.enforce == enforce) {
                let w = r.window.as_millis() as u64;
                if self.count(key, w, at) >= r.max as usize {
                    full.push(RuleRef {
                        scope: *scope,
                        window_ms: w,
                        max: r.max,
                    });
                }
            }
        }
        full
    }

    fn record(&mut self, id: &str) -> Option<&mut Record> {
        self.records.iter_mut().find(|r| r.id == id)
    }

    /// A new message of lineage `ticket` for job `id` (admitted for `fp`)
    /// at `t`.
    pub(crate) fn admit(
        &mut self,
        id: &str,
        fp: &str,
        ticket: u32,
        scopes: &Scopes<'_>,
        t: u64,
    ) -> Verdict {
        let lease_ms = self.lease_ms;
        self.shadow = None;
        self.rooms.clear();
        if let Some(r) = self.record(id) {
            let mine = r.owner == ticket;
            let (at, answered) = (r.at, r.answered);
            if r.fp != fp {
                return Verdict::Conflict;
            }
            match r.state {
                State::Refunded if mine => {
                    return Verdict::Finished {
                        how: Refund::Failed,
                        answered,
                    };
                }
                State::Sent => {
                    return Verdict::Sent {
                        admitted_at_ms: at,
                        by_owner: mine,
                        answered,
                    };
                }
                State::Unknown => {
                    return Verdict::Unknown {
                        by_owner: mine,
                        answered,
                    };
                }
                State::Admitted | State::Sending if r.lease_until > t => {
                    return Verdict::Busy {
                        lease_left_ms: r.lease_until - t,
                    };
                }
                State::Sending => {
                    r.state = State::Unknown;
                    r.answered = false;
                    return Verdict::Unknown {
                        by_owner: mine,
                        answered: false,
                    };
                }
                State::Admitted => {
                    r.state = State::Sending;
                    r.owner = ticket;
                    r.lease_until = t + lease_ms;
                    r.answered = false;
                    return Verdict::Resumed { admitted_at_ms: at };
                }
                State::Refunded => {}
            }
        }
        if self.full_rules(scopes, t).is_empty() {
            self.shadow = self.first_to_free(scopes, t, false).map(|(_, rule)| rule);
            self.admissions.push(Admission {
                at: t,
                id: id.to_owned(),
                keys: scopes.iter().map(|(_, k, _)| k.clone()).collect(),
                requesters: (scopes.iter())
                    .filter(|(scope, k, _)| *scope == Scope::Ip || k.contains(":net:"))
                    .map(|(_, k, _)| k.clone())
                    .collect(),
                refunded: false,
            });
            self.rooms = self.rooms_at(scopes, t);
            self.records.retain(|r| r.id != id);
            self.records.push(Record {
                id: id.to_owned(),
                fp: fp.to_owned(),
                at: t,
                state: State::Sending,
                owner: ticket,
                lease_until: t + lease_ms,
                answered: false,
            });
            return Verdict::Admitted;
        }
        let (d, rule) = self
            .first_to_free(scopes, t, true)
            .expect("some admission must eventually leave every window");
        Verdict::Rejected {
            retry_after_ms: d,
            rule,
        }
    }

    /// Each scope's tightest enforced rule at `t` (over all its keys), the
    /// admission at `t` counted: how many more it allows, and how long until the oldest
    /// admission in its window leaves it.
    fn rooms_at(&self, scopes: &Scopes<'_>, t: u64) -> Vec<(RuleRef, u32, u64)> {
        let mut rooms = Vec::new();
        for (scope, key, rules) in scopes {
            let mut best: Option<(RuleRef, u32, u64)> = None;
            for r in rules.iter().filter(|r| r.enforce) {
                let w = r.window.as_millis() as u64;
                let left = (r.max as usize).saturating_sub(self.count(key, w, t)) as u32;
                let oldest = (self.admissions.iter())
                    .filter(|a| a.keys.iter().any(|k| k == key) && a.at + w > t)
                    .map(|a| a.at)
                    .min()
                    .expect("the admission at t is in the window");
                let reset = oldest + w - t;
                if best.is_none_or(|(_, l, rs)| left < l || (left == l && reset > rs)) {
                    let rule = RuleRef {
                        scope: *scope,
                        window_ms: w,
                        max: r.max,
                    };
                    best = Some((rule, left, reset));
                }
            }
            // A domain's log and a network's share of it are one scope:
            // the tighter room stands (the first on a tie).
            let Some(b) = best else { continue };
            match rooms
                .iter_mut()
                .find(|r: &&mut (RuleRef, u32, u64)| r.0.scope == *scope)
            {
                Some(r) if b.1 < r.1 || (b.1 == r.1 && b.2 > r.2) => *r = b,
                Some(_) => {}
                None => rooms.push(b),
            }
        }
        rooms
    }

    fn full_rules(&self, scopes: &Scopes<'_>, at: u64) -> Vec<RuleRef> {
        self.full(scopes, at, true)
    }

    /// If some enforced (or shadow) rule is full at `t`: how long until
    /// every one has room, and the rule that binds (the first one still
    /// full just before then).
    fn first_to_free(&self, scopes: &Scopes<'_>, t: u64, enforce: bool) -> Option<(u64, RuleRef)> {
        if self.full(scopes, t, enforce).is_empty() {
            return None;
        }
        // Counts only fall as time passes, so the answer is the first moment
        // some admission leaves some window and every rule has room.
        let mut candidates: Vec<u64> = self
            .admissions
            .iter()
            .flat_map(|a| {
                scopes
                    .iter()
                    .filter(|(_, k, _)| a.keys.contains(k))
                    .flat_map(move |(_, _, rules)| {
                        rules
                            .iter()
                            .map(move |r| a.at + r.window.as_millis() as u64)
                    })
            })
            .filter(|&leave| leave > t)
            .map(|leave| leave - t)
            .collect();
        candidates.sort_unstable();
        let d = candidates
            .into_iter()
            .find(|&d| self.full(scopes, t + d, enforce).is_empty())?;
        Some((d, self.full(scopes, t + d - 1, enforce)[0]))
    }

    /// The mail went out.
    pub(crate) fn sent(&mut self, id: &str, ticket: u32) -> bool {
        match self.record(id) {
            Some(r) if r.state != State::Refunded => {
                r.state = State::Sent;
                r.owner = ticket;
                r.lease_until = 0;
                r.answered = true;
                true
            }
            _ => false,
        }
    }

    /// A refund, as failed: the admission leaves every log but the
    /// requester's own.
    pub(crate) fn refund(&mut self, id: &str, ticket: u32) -> bool {
        match self.record(id) {
            Some(r) if r.owner == ticket && matches!(r.state, State::Admitted | State::Sending) => {
                r.state = State::Refunded;
                r.lease_until = 0;
                r.answered = true;
                for a in self
                    .admissions
                    .iter_mut()
                    .filter(|a| a.id == id && !a.refunded)
                {
                    a.keys = std::mem::take(&mut a.requesters);
                    a.refunded = true;
                }
                self.admissions.retain(|a| !a.keys.is_empty());
                true
            }
            _ => false,
        }
    }

    /// A transient failure gives the lease back.
    pub(crate) fn release(&mut self, id: &str, ticket: u32) -> bool {
        match self.record(id) {
            Some(r) if r.owner == ticket && matches!(r.state, State::Admitted | State::Sending) => {
                r.state = State::Admitted;
                r.lease_until = 0;
                true
            }
            _ => false,
        }
    }
}
