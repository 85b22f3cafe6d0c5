//! What `ledger.lua` answers, decoded: its result codes, each item's
//! reply, and an admission's verdict, rules and rooms.

use std::sync::Arc;

use super::RedisLedger;
use crate::ledger::{Admission, Entry, LedgerError, Refund, Verdict};
use crate::limiter::{Room, RuleRef, RuleSet, Scope};

/// The result codes of `ledger.lua`'s "admit" item, named as in its `CODE`
/// table (the test in `store::scripts` checks the two agree).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Code {
    Rejected = 0,
    Admitted = 1,
    Expired = 2,
    Resumed = 3,
    Busy = 4,
    Sent = 5,
    Unknown = 6,
    Finished = 7,
    Conflict = 8,
    Absent = 9,
    Superseded = 10,
    Suppressed = 11,
    Unmigrated = 12,
    Changed = 13,
}

/// Every code with its name in `ledger.lua`.
pub(crate) const CODES: [(Code, &str); 14] = [
    (Code::Rejected, "rejected"),
    (Code::Admitted, "admitted"),
    (Code::Expired, "expired"),
    (Code::Resumed, "resumed"),
    (Code::Busy, "busy"),
    (Code::Sent, "sent"),
    (Code::Unknown, "unknown"),
    (Code::Finished, "finished"),
    (Code::Conflict, "conflict"),
    (Code::Absent, "absent"),
    (Code::Superseded, "superseded"),
    (Code::Suppressed, "suppressed"),
    (Code::Unmigrated, "unmigrated"),
    (Code::Changed, "changed"),
];

/// How many integers answer each item of a batch at most, its code and its
/// values (the names `ledger.lua`'s main loop takes them into; the test in
/// `store::scripts` counts them). A reply leaves out the values an item does not have.
pub(crate) const REPLY_WIDTH: usize = 5;

/// What the script answered for one item.
pub(super) struct Reply {
    /// The batch's instant, ms (the Redis clock, or the explicit one).
    pub(super) now_ms: u64,
    /// The item's values: an admission's code and up to four values; for
    /// the other kinds 1 (done) or 0, then what they name, zeros for the
    /// rest.
    pub(super) values: [i64; REPLY_WIDTH],
    /// An item admitted now: for each of its scope keys, the rule, the
    /// admissions it still allows and its reset (decide.lua's `room`).
    pub(super) rooms: Vec<i64>,
    /// Replicas that acknowledged the batch, if the item asked to wait and
    /// fewer than `redis.min_replicas_acked` did.
    pub(super) unreplicated: Option<i64>,
}

/// The rule a script names by its 1-based scope (`scopes`: the scope and
/// rule set of each of the request's scope keys) and 1-based place in that
/// scope's rule set, `wait` its wait; `None` if there is no such rule. A
/// deny is named as a rule of max 0 whose window is the wait.
pub(super) fn rule_named(
    scopes: &[(Scope, Arc<RuleSet>)],
    scope: i64,
    rule: i64,
    wait: u64,
) -> Option<RuleRef> {
    let (scope, set) = scopes.get(usize::try_from(scope - 1).ok()?)?;
    if set.deny_until_ms.is_some() {
        return Some(RuleRef {
            scope: *scope,
            window_ms: wait,
            max: 0,
        });
    }
    let rule = set.rules.get(usize::try_from(rule - 1).ok()?)?;
    Some(RuleRef::of(*scope, rule))
}

/// The room a script names for its 1-based scope `scope` (`scopes` as for
/// [`rule_named`]): `[rule, remaining, reset_ms]`; `None` for a scope with
/// no enforced rule (rule 0) or values that make no sense.
pub(super) fn room_named(
    scopes: &[(Scope, Arc<RuleSet>)],
    scope: i64,
    room: &[i64],
) -> Option<Room> {
    let [rule, remaining, reset_ms] = *room else {
        return None;
    };
    Some(Room {
        rule: rule_named(scopes, scope, rule, 0)?,
        remaining: u32::try_from(remaining).ok()?,
        reset_ms: u64::try_from(reset_ms).ok()?,
    })
}

/// An admission's reply values as a [`Verdict`] (`scopes`: the scope
/// and rule set of each of its scope keys); `None` if they make no sense.
pub(super) fn verdict(scopes: &[(Scope, Arc<RuleSet>)], r: &[i64; REPLY_WIDTH]) -> Option<Verdict> {
    let num = |i: usize| u64::try_from(r[i]).ok();
    let flag = |i: usize| r[i] == 1;
    let (code, _) = CODES.iter().find(|(c, _)| *c as i64 == r[0])?;
    Some(match code {
        Code::Rejected => Verdict::Rejected {
            retry_after_ms: num(1)?,
            rule: rule_named(scopes, r[2], r[3], num(1)?)?,
        },
        Code::Admitted => Verdict::Admitted,
        Code::Expired => Verdict::Expired,
        Code::Resumed => Verdict::Resumed {
            admitted_at_ms: num(1)?,
        },
        Code::Busy => Verdict::Busy {
            lease_left_ms: num(2)?,
        },
        Code::Sent => Verdict::Sent {
            admitted_at_ms: num(1)?,
            by_owner: flag(2),
            answered: flag(3),
        },
        Code::Unknown => Verdict::Unknown {
            by_owner: flag(2),
            answered: flag(3),
        },
        Code::Finished => Verdict::Finished {
            how: Refund::from_code(u8::try_from(r[1]).ok()?)?,
            answered: flag(2),
        },
        Code::Conflict => Verdict::Conflict,
        Code::Superseded => Verdict::Superseded { refunded: flag(1) },
        Code::Suppressed => Verdict::Suppressed,
        Code::Absent | Code::Unmigrated | Code::Changed => return None,
    })
}

impl RedisLedger {
    /// An "admit", "look" or "create" reply as the caller's [`Admission`]
    /// (`scopes`: the scope and rule set of each scope key of an "admit").
    /// A send mark too few replicas acknowledged is given back, and fails;
    /// an unsent admission refunded as expired gives its reservations back.
    pub(super) async fn decided(
        &self,
        entry: &Entry<'_>,
        scopes: &[(Scope, Arc<RuleSet>)],
        reply: Reply,
    ) -> Result<Admission, LedgerError> {
        if reply.values[0] == Code::Unmigrated as i64 {
            return Err(unmigrated(entry));
        }
        let verdict = verdict(scopes, &reply.values).ok_or_else(|| {
            LedgerError::Protocol(format!("an admission answered {:?}", reply.values))
        })?;
        // Admitted (sending): the mark must reach the replicas first.
        if let (Verdict::Admitted | Verdict::Resumed { .. }, Some(acked)) =
            (verdict, reply.unreplicated)
        {
            return Err(self.unreplicated(&entry.job, acked).await);
        }
        if verdict == Verdict::Expired {
            self.give_back_refunded(&entry.job.request, Refund::Expired, &reply.values)
                .await;
        }
        // An admission names the shadow rule that would have rejected it
        // (0: none; a "create" never names one: its scopes answered it).
        let shadow = match (verdict, reply.values[2]) {
            (Verdict::Admitted, s) if s > 0 => rule_named(scopes, s, reply.values[3], 0),
            _ => None,
        };
        let mut admission = Admission::at(reply.now_ms, verdict);
        admission.shadow = shadow;
        for (s, room) in (1..).zip(reply.rooms.chunks_exact(3)) {
            if let Some(room) = room_named(scopes, s, room) {
                admission.rooms.set(room);
            }
        }
        Ok(admission)
    }
}

/// The error of an admission that found a scope log this build cannot
/// read (an earlier build's form, or damaged): an outage (the job waits)
/// until `mailgate admin migrate` runs.
pub(super) fn unmigrated(entry: &Entry<'_>) -> LedgerError {
    LedgerError::Unmigrated(format!(
        "a scope log of job {:?} is not of this build's form: an earlier build's sorted set \
         (run `mailgate admin migrate` with the workers stopped), or damaged (`mailgate limits \
         reset` clears it)",
        entry.job.request.id.as_str()
    ))
}
