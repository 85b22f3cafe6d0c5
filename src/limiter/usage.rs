//! What a decision and a read of usage say: the rule named, the room left
//! after an admission, each rule's use; and how they are worked out from a
//! log's admission times (the in-memory backend's decision and both
//! backends' reads of usage).

use super::{RuleSet, Scope, ScopeMap, overrides};
use crate::settings::Rule;

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

/// A scope log's admission times as a decision reads them. A rule `(W,
/// N)` is full at `now` iff the log's `N`-th newest admission is after
/// `now - W`, and it frees up at that admission's time + `W`: so a
/// decision needs only a few of a log's newest entries, which a read of
/// Redis can fetch without the rest (`ledger::redis`'s snapshot).
pub(crate) trait Newest {
    /// The time of the log's `n`-th newest admission (1: the newest);
    /// `None` if it holds fewer than `n` (or `n` is 0).
    fn newest(&self, n: usize) -> Option<u64>;
}

/// A whole log, its admission times ascending.
impl Newest for [u64] {
    fn newest(&self, n: usize) -> Option<u64> {
        let i = self.len().checked_sub(n)?;
        (n > 0).then(|| self[i])
    }
}

/// Which enforced rule binds a request at `now`, and after how long
/// (`[0]`), and which shadow rule would have (`[1]`): the largest wait,
/// the first scope and rule on a tie; `None` where each has room.
pub(crate) type Judged = [Option<(u64, RuleRef)>; 2];

/// Judges one of a request's scopes (`set`, read from `log`) at `now`
/// into `best` (see [`Judged`]), in the order the scopes are asked: the
/// one decision of both ledgers. A deny binds while it lasts, named as a
/// rule of max 0 whose window is the wait; it reads no log.
pub(crate) fn judge_scope<L: Newest + ?Sized>(
    best: &mut Judged,
    scope: Scope,
    set: &RuleSet,
    log: &L,
    now: u64,
) {
    if let Some(d) = set.deny_wait(now) {
        if best[0].is_none_or(|(bd, _)| d > bd) {
            let rule = RuleRef {
                scope,
                window_ms: d,
                max: 0,
            };
            best[0] = Some((d, rule));
        }
        return;
    }
    for (best, enforce) in best.iter_mut().zip([true, false]) {
        if let Some((d, i)) = binding_rule(&set.rules, log, now, enforce)
            && best.is_none_or(|(bd, _)| d > bd)
        {
            *best = Some((d, RuleRef::of(scope, &set.rules[i])));
        }
    }
}

/// For one key: which of the rules that `enforce` (or, with `false`, of
/// the shadow rules) binds and after how long, given the key's `log` at
/// time `now`. `None` if each of them has room. Ties go to the earlier
/// rule.
fn binding_rule<L: Newest + ?Sized>(
    rules: &[Rule],
    log: &L,
    now: u64,
    enforce: bool,
) -> Option<(u64, usize)> {
    let mut best: Option<(u64, usize)> = None;
    for (i, rule) in rules.iter().enumerate() {
        if rule.enforce != enforce {
            continue;
        }
        if let Some(d) = wait_of(rule, log, now)
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

/// How long until `rule` has room in `log` at `now`; `None` if it has
/// room now. (Admissions after `now` count too: a clock that stepped back
/// frees no quota.)
fn wait_of<L: Newest + ?Sized>(rule: &Rule, log: &L, now: u64) -> Option<u64> {
    let frees = log
        .newest(rule.max as usize)?
        .saturating_add(rule.window_ms());
    (frees > now).then(|| frees - now)
}
