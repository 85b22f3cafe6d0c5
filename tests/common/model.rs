//! A plain reference model of the limiter semantics, written straight from the
//! definitions and sharing no code with either backend: counts are recounted
//! from a flat list of admissions, and `retry_after_ms` is found by trying
//! every moment at which some admission leaves some window.

use mailgate::limiter::{RuleRef, Scope, Verdict};
use mailgate::settings::Rule;

struct Admission {
    at: u64,
    id: String,
    keys: Vec<String>,
    sent: bool,
    lease_until: u64,
}

/// Scopes that apply to one request: `(scope, key, rules)` in decision order.
pub type Scopes<'a> = Vec<(Scope, String, &'a [Rule])>;

pub struct Model {
    admissions: Vec<Admission>,
    lease_ms: u64,
}

impl Model {
    pub fn new(lease_ms: u64) -> Self {
        Self {
            admissions: Vec::new(),
            lease_ms,
        }
    }

    fn count(&self, key: &str, window_ms: u64, at: u64) -> usize {
        self.admissions
            .iter()
            .filter(|a| a.keys.iter().any(|k| k == key))
            .filter(|a| a.at + window_ms > at && a.at <= at)
            .count()
    }

    fn full_rules(&self, scopes: &Scopes<'_>, at: u64) -> Vec<RuleRef> {
        let mut full = Vec::new();
        for (scope, key, rules) in scopes {
            for r in *rules {
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

    pub fn check(&mut self, id: &str, scopes: &Scopes<'_>, t: u64) -> Verdict {
        let lease_ms = self.lease_ms;
        if let Some(a) = self.admissions.iter_mut().find(|a| a.id == id) {
            let admitted_at_ms = a.at;
            return if a.sent {
                Verdict::Duplicate { admitted_at_ms }
            } else if a.lease_until > t {
                Verdict::InProgress {
                    admitted_at_ms,
                    lease_left_ms: a.lease_until - t,
                }
            } else {
                a.lease_until = t + lease_ms;
                Verdict::Resume { admitted_at_ms }
            };
        }
        if self.full_rules(scopes, t).is_empty() {
            self.admissions.push(Admission {
                at: t,
                id: id.to_owned(),
                keys: scopes.iter().map(|(_, k, _)| k.clone()).collect(),
                sent: false,
                lease_until: t + self.lease_ms,
            });
            return Verdict::Admitted;
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
            .find(|&d| self.full_rules(scopes, t + d).is_empty())
            .expect("some admission must eventually leave every window");
        // The binding rule: the first one still full just before `d`.
        let rule = self.full_rules(scopes, t + d - 1)[0];
        Verdict::Rejected {
            retry_after_ms: d,
            rule,
        }
    }

    pub fn refund(&mut self, id: &str) -> bool {
        let before = self.admissions.len();
        self.admissions.retain(|a| a.id != id);
        before != self.admissions.len()
    }

    pub fn mark_sent(&mut self, id: &str) -> bool {
        match self.admissions.iter_mut().find(|a| a.id == id) {
            Some(a) => {
                a.sent = true;
                a.lease_until = 0;
                true
            }
            None => false,
        }
    }

    pub fn release(&mut self, id: &str) -> bool {
        match self.admissions.iter_mut().find(|a| a.id == id && !a.sent) {
            Some(a) => {
                a.lease_until = 0;
                true
            }
            None => false,
        }
    }
}
