//! How a job is answered: an [`Outcome`] is the one thing results are
//! built from ([`Outcome::result`]), what a result discloses about scopes
//! its requester does not own is decided by [`Disclosure`], and results go
//! out through the worker's [`Outbox`].

use crate::domain::{DeadReason, Job};
use crate::ledger::{Ledger, Refund};
use crate::limiter::{Room, Rooms, RuleRef, Scope};
use crate::settings::Settings;
use crate::wire::{JobResult, QuotaWire, RuleWire, Status};

use super::{Action, Message, Outbox, Pipeline, Unpublished};

/// How a message is answered; the one place results are built from.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Outcome {
    /// The mail went out (now, or by this lineage before).
    Sent {
        /// When the job was admitted.
        decided_at_ms: u64,
        /// The shadow rule that would have rejected it, if this attempt's
        /// admission found one.
        shadow: Option<RuleRef>,
        /// What this attempt's admission left of each scope's quota.
        rooms: Rooms,
    },
    /// The limiter said no.
    Rejected {
        /// When it decided.
        decided_at_ms: u64,
        /// The exact wait; the result may round it ([`Disclosure::wait`]).
        retry_after_ms: u64,
        /// The rule that rejected it.
        rule: RuleRef,
    },
    /// This id was already admitted and its mail sent (by another lineage).
    Duplicate,
    /// The job can never be mailed; why.
    Invalid(String),
    /// `expires_at` passed before the mail went out.
    Expired,
    /// The job ended without a mail; why.
    Failed(String),
    /// A newer job for the same mailbox and purpose was admitted after
    /// this one: its code is stale, so it is not sent.
    Superseded,
    /// The mailbox is on the suppression list: nothing is sent or counted.
    Suppressed,
}

/// The error of a `suppressed` result.
const SUPPRESSED: &str = "this mailbox is on the suppression list (it does not exist, or its \
     owner asked for no mail); no code was sent and no quota used";

/// The error of a job whose delivery is unknown.
pub(super) const DELIVERY_UNKNOWN: &str = "delivery unknown: the SMTP transaction of this job began and \
     its outcome never came back; the mail may have arrived, so it is not sent again";

/// What a result tells about the scopes its requester does not own (the
/// mailbox's, the domain's): waits rounded up to `granularity_ms`, the
/// domain's quota left out unless `domain_quota` (see
/// [`crate::settings::LimitSettings::result_granularity`]). The requester's
/// own network (the IP scope) is told exactly. So a `rejected` result
/// never tells a stranger, to the millisecond, when the owner last asked,
/// nor `quota` how many codes others at the domain got.
#[derive(Debug, Clone, Copy)]
pub(super) struct Disclosure {
    granularity_ms: u64,
    domain_quota: bool,
}

impl Disclosure {
    /// What `settings.limits` says a result may tell.
    pub(super) fn new(settings: &Settings) -> Self {
        Self {
            granularity_ms: u64::try_from(settings.limits.result_granularity.as_millis())
                .unwrap_or(u64::MAX),
            domain_quota: settings.limits.quota_domain,
        }
    }

    /// A wait of `scope` from `decided_at_ms`, as the result tells it:
    /// the moment it ends rounded up to a whole multiple of the
    /// granularity on the clock, so that every result about the same slot
    /// names the same moment, whenever it was asked. Rounding the wait
    /// itself would not do: many rejections, each cut at its own exact
    /// `decided_at_ms`, would narrow the owner's moment down to a few ms.
    fn wait(self, scope: Scope, decided_at_ms: u64, ms: u64) -> u64 {
        let g = self.granularity_ms;
        if scope == Scope::Ip || g <= 1 {
            return ms;
        }
        let ends = decided_at_ms.saturating_add(ms);
        ends.div_ceil(g)
            .saturating_mul(g)
            .saturating_sub(decided_at_ms)
    }

    /// The quota a result decided at `decided_at_ms` tells.
    fn quota(self, rooms: &Rooms, decided_at_ms: u64) -> Vec<QuotaWire> {
        (rooms.iter())
            .filter(|r| self.domain_quota || r.rule.scope != Scope::Domain)
            .map(|r| {
                QuotaWire::from(Room {
                    reset_ms: self.wait(r.rule.scope, decided_at_ms, r.reset_ms),
                    ..r
                })
            })
            .collect()
    }
}

impl Outcome {
    /// The result for the job `id` (with `job`, once decoded) answering
    /// `msg`, telling what `disclose` allows.
    pub(super) fn result(
        self,
        id: &str,
        job: Option<&Job>,
        msg: &Message<'_>,
        disclose: Disclosure,
    ) -> JobResult {
        let status = match &self {
            Outcome::Sent { .. } => Status::Sent,
            Outcome::Rejected { .. } => Status::Rejected,
            Outcome::Duplicate => Status::Duplicate,
            Outcome::Invalid(_) => Status::Invalid,
            Outcome::Expired => Status::Expired,
            Outcome::Failed(_) => Status::Failed,
            Outcome::Superseded => Status::Superseded,
            Outcome::Suppressed => Status::Suppressed,
        };
        let mut r = JobResult::new(id, status, msg.attempt);
        r.email = job.map(|j| j.email.to_string());
        r.correlation_id = msg.correlation_id.map(str::to_owned);
        match self {
            Outcome::Sent {
                decided_at_ms,
                shadow,
                rooms,
            } => {
                r.decided_at_ms = Some(decided_at_ms);
                r.shadow_rule = shadow.map(RuleWire::from);
                let quota = disclose.quota(&rooms, decided_at_ms);
                r.quota = (!quota.is_empty()).then_some(quota);
            }
            Outcome::Rejected {
                decided_at_ms,
                retry_after_ms,
                rule,
            } => {
                r.decided_at_ms = Some(decided_at_ms);
                let told = disclose.wait(rule.scope, decided_at_ms, retry_after_ms);
                r.retry_after_ms = Some(told);
                r.exact_retry_after_ms = (told != retry_after_ms).then_some(retry_after_ms);
                r.rule = Some(RuleWire::from(rule));
            }
            Outcome::Invalid(e) | Outcome::Failed(e) => r.error = Some(e),
            Outcome::Suppressed => r.error = Some(SUPPRESSED.into()),
            Outcome::Duplicate | Outcome::Expired | Outcome::Superseded => {}
        }
        r
    }
}

impl From<RuleRef> for RuleWire {
    fn from(rule: RuleRef) -> Self {
        Self {
            scope: rule.scope.as_str(),
            window_ms: rule.window_ms,
            max: rule.max,
        }
    }
}

impl From<Room> for QuotaWire {
    fn from(room: Room) -> Self {
        Self {
            rule: RuleWire::from(room.rule),
            remaining: room.remaining,
            reset_ms: room.reset_ms,
        }
    }
}

impl<L: Ledger> Pipeline<L> {
    /// Publishes the result of `outcome` for `job`.
    pub(super) async fn answer(
        &self,
        out: &impl Outbox,
        msg: &Message<'_>,
        job: &Job,
        outcome: Outcome,
    ) -> Action {
        let r = outcome.result(job.id.as_str(), Some(job), msg, self.disclose);
        self.publish(out, &r).await.err().unwrap_or(Action::Done)
    }

    /// Publishes `r`; on failure, what to do with the job instead.
    pub(super) async fn publish(&self, out: &impl Outbox, r: &JobResult) -> Result<(), Action> {
        // Boxed, like delivery: the broker's publish-and-confirm state
        // would otherwise sit in every job's future at each of its call
        // sites.
        match Box::pin(out.publish(r)).await {
            Ok(()) => Ok(()),
            Err(Unpublished::Lost(e)) => {
                tracing::warn!(error = %e, "the result could not be published; the job comes back");
                Err(Action::Abandon)
            }
            Err(Unpublished::Refused(e)) => Err(Action::DeadLetter {
                reason: DeadReason::Unanswerable,
                error: format!("its result could not be delivered: {e}"),
            }),
        }
    }
}

/// How a lineage that ended without a mail is answered again.
pub(super) fn refund_outcome(how: Refund) -> Outcome {
    let again = "this job was answered before with this status; its first result gave the reason";
    match how {
        Refund::Expired => Outcome::Expired,
        Refund::Failed => Outcome::Failed(again.into()),
        Refund::Invalid => Outcome::Invalid(again.into()),
        Refund::Superseded => Outcome::Superseded,
    }
}
