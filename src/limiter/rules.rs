//! Rule sets: the rules one scope judges a request by, how long its keys
//! keep admissions, and how `decide.lua` reads them from ARGV.

use crate::settings::Rule;

/// One list of rules for one scope, and how long that scope's keys keep an
/// admission: the longest window of *any* rule set of the scope, because a
/// mailbox's log is shared by every purpose, plus
/// [`CLOCK_SLACK_MS`](super::CLOCK_SLACK_MS). Or a deny (an override): no
/// rules, and every request rejected until `deny_until_ms` (0: for good); a
/// deny's set never records anything.
#[derive(Debug, Clone)]
pub(crate) struct RuleSet {
    pub rules: Vec<Rule>,
    pub keep_ms: u64,
    pub deny_until_ms: Option<u64>,
}

impl RuleSet {
    /// The rules one client network is held to within a domain's log (see
    /// [`Keyspace::applicable`](super::Keyspace::applicable)): each rule's
    /// max times `share`, rounded up; `None` if that holds nothing back
    /// (`share` 1, a deny, no rules).
    pub(crate) fn shared(&self, share: f64) -> Option<RuleSet> {
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
    pub(crate) fn deny_wait(&self, now: u64) -> Option<u64> {
        let longest = crate::settings::MAX_PERIOD.as_millis() as u64;
        match self.deny_until_ms? {
            0 => Some(longest),
            until => (until > now).then(|| (until - now).min(longest)),
        }
    }
}

/// A rule set of no rules: a network share that holds nothing back.
pub(super) const NO_RULES: RuleSet = RuleSet {
    rules: Vec::new(),
    keep_ms: 1,
    deny_until_ms: None,
};

/// A rule set as `decide.lua` reads it: its number of rules, how long its
/// keys keep admissions, and each rule's `(window_ms, max)`, the max
/// negative for a shadow rule. (Settings cap windows and keeps at a year
/// and a day, so every value fits.)
pub(super) fn push_rule_set(set: &RuleSet, args: &mut Vec<i64>) {
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
