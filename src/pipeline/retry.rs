//! When a job cannot go on now: retried later (spending an attempt, with
//! [`Pipeline::backoff`]), waiting for Redis (spending none), or, out of
//! attempts, answered `failed` and dead-lettered.

use std::time::Duration;

use backon::BackoffBuilder;

use crate::domain::{DeadReason, Job};
use crate::ledger::{Ledger, LedgerError};
use crate::telemetry;

use super::outcome::Outcome;
use super::{Action, Message, Outbox, Pipeline, Waiting};

impl<L: Ledger> Pipeline<L> {
    /// A transient failure before anything was sent: retry later.
    pub(super) fn retry(&self, msg: &Message<'_>, error: String) -> Action {
        Action::Retry {
            failed_attempt: msg.attempt,
            delay: self.backoff(msg.attempt),
            error,
        }
    }

    /// Redis is out of reach (or not serving): not the job's fault, so it
    /// waits in RabbitMQ and comes back as the same attempt; meanwhile the
    /// worker takes no new jobs (see `worker`). A job whose `expires_at`
    /// passes meanwhile is answered `expired` when it comes back.
    pub(super) fn outage(&self, msg: &Message<'_>, e: &LedgerError) -> Action {
        // A lost or lagging replica shows on a dashboard.
        if matches!(e, LedgerError::Unreplicated(_)) {
            telemetry::send_mark_unreplicated();
        }
        tracing::debug!(error = %crate::report::one_line(e), "Redis unavailable; the job waits without spending an attempt");
        Action::Wait {
            delay: self.backoff(msg.attempt),
            why: Waiting::Redis,
        }
    }

    /// The ledger could not be asked: retry later, or, out of attempts,
    /// answer `failed` and dead-letter the job (nothing can be recorded).
    pub(super) async fn unavailable(
        &self,
        job: &Job,
        msg: &Message<'_>,
        out: &impl Outbox,
        error: String,
    ) -> Action {
        if msg.attempt < self.settings.retry.max_attempts {
            return self.retry(msg, error);
        }
        let gave_up = format!("gave up after {} attempts: {error}", msg.attempt);
        match self
            .answer(out, msg, job, Outcome::Failed(gave_up.clone()))
            .await
        {
            Action::Done => Action::DeadLetter {
                reason: DeadReason::Failed,
                error: gave_up,
            },
            other => other,
        }
    }

    /// The wait before retrying after attempt `failed` (1-based): `initial`
    /// doubling per attempt up to `max`, with jitter.
    pub fn backoff(&self, failed: u32) -> Duration {
        let retry = &self.settings.retry;
        backon::ExponentialBuilder::default()
            .with_min_delay(retry.initial)
            .with_max_delay(retry.max)
            .with_factor(2.0)
            .with_jitter()
            .with_max_times(failed as usize)
            .build()
            .nth(failed.saturating_sub(1) as usize)
            .unwrap_or(retry.max)
    }
}

/// Why a job could not go on for now, from the ledger's error on its
/// admission or send mark (other than an outage: [`LedgerError::is_outage`]).
pub(super) fn ledger_error(e: &LedgerError) -> String {
    format!("rate limiter unavailable: {}", crate::report::one_line(e))
}
