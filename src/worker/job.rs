//! One job: taken from the consumer, run through the
//! [`Pipeline`](crate::pipeline::Pipeline), its results published and the
//! message moved as the pipeline's action says.

use std::time::Duration;

use futures_lite::FutureExt as _;
use tracing::Instrument;

use super::Worker;
use crate::broker::{Broker, BrokerError, DELIVERY_LIMIT, Incoming, Unrecorded};
use crate::domain::{DeadReason, Ticket, now_ms};
use crate::ledger::Ledger;
use crate::pipeline::{Action, Message, Outbox, Unpublished, Waiting};
use crate::telemetry;
use crate::wire::{JobResult, Status};

/// How many times `J` must have handed a message out before without its
/// being settled for a worker to move it to `J.redelivered` (see
/// `Worker::take`): a job that kills its workers gets there on its second
/// victim, the jobs beside it only if they were beside it twice.
const ISOLATE_FROM: u32 = 2;

impl<L: Ledger + 'static> Worker<L> {
    /// A job from `J`: one handed out twice before without being settled
    /// (workers died, or lost their connection, holding it) is moved to
    /// `J.redelivered`, which is taken one message at a time, so a message
    /// that kills its workers takes no other job's deliveries with it to the
    /// delivery limit. The rest, and any that cannot be moved, are
    /// processed. Once is what a dropped connection or one dead worker
    /// costs every job it held: those are processed as usual, so one lost
    /// connection's prefetch does not wait in line behind the one-at-a-time
    /// lane (where its codes would expire).
    pub(super) async fn take(&self, broker: &Broker, job: Incoming) {
        if job.deliveries_before < ISOLATE_FROM {
            return self.process(broker, job).await;
        }
        match broker.isolate(&job).await {
            Ok(()) => {
                telemetry::isolated();
                finished(job.ack().await);
            }
            Err(e) => {
                tracing::warn!(error = %crate::report::one_line(&e), "could not move a redelivered job aside; processing it here");
                self.process(broker, job).await;
            }
        }
    }

    /// Runs one job through the pipeline and carries out the action.
    pub(super) async fn process(&self, broker: &Broker, job: Incoming) {
        // The pipeline records the id once it has parsed the job.
        let queue = broker.topology().jobs.as_str();
        let span = tracing::info_span!(
            "job",
            id = tracing::field::Empty,
            attempt = job.attempt,
            otel.name = format!("process {queue}"),
            otel.kind = "consumer",
        );
        crate::traces::messaging(&span, "process", queue);
        // The producer's trace, if it sent one (a retry's copy carries it).
        crate::traces::continue_trace(&span, &job.trace);
        async {
            // One redelivery is a worker that died or lost its connection;
            // many are a job that takes every worker down with it.
            if i64::from(job.deliveries_before) >= DELIVERY_LIMIT / 2 {
                tracing::warn!(
                    deliveries = job.deliveries_before,
                    limit = DELIVERY_LIMIT,
                    "this message was handed out again and again without being settled; \
                     RabbitMQ dead-letters it at the limit"
                );
                telemetry::redelivered_often();
            }
            let ticket = job.ticket.clone().unwrap_or_default();
            let msg = Message {
                body: job.body(),
                attempt: job.attempt,
                ticket: &ticket,
                continuation: job.ticket.is_some(),
                redelivered: job.redelivered,
                correlation_id: job.correlation_id.as_deref(),
                published_at_ms: job.published_at_ms,
                seen_at_ms: job.seen_at_ms,
            };
            let _in_flight = telemetry::InFlight::enter();
            let out = Replies { broker, job: &job };
            // A panic is a bug, but it must not leave the job unacknowledged
            // to be redelivered, panic again, and loop: dead-letter it.
            let action = match std::panic::AssertUnwindSafe(self.pipeline.handle(&msg, &out))
                .catch_unwind()
                .await
            {
                Ok(action) => action,
                Err(panic) => {
                    let why = panic
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_owned())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    tracing::error!(panic = %why, "the pipeline panicked on this job");
                    Action::DeadLetter {
                        reason: DeadReason::Panic,
                        error: format!("mailgate panicked processing this job: {why}"),
                    }
                }
            };
            // An answered job is only acknowledged. Moving one elsewhere
            // (retry, wait, dead letter) is boxed: its publish state would
            // otherwise be most of every job's task.
            match action {
                Action::Done => finished(job.ack().await),
                Action::HandBack => self.hand_back(&job).await,
                action => Box::pin(self.carry_out(broker, &job, &ticket, action)).await,
            }
        }
        .instrument(span)
        .await
    }
}

impl<L: Ledger + 'static> Worker<L> {
    /// Moves the message as `action` says, then acknowledges it. A copy that
    /// RabbitMQ refuses becomes a dead letter; a dead letter it refuses too is
    /// handed back after a pause, so the pool keeps flowing and nothing is lost.
    async fn carry_out(&self, broker: &Broker, job: &Incoming, ticket: &Ticket, action: Action) {
        let moved = match action {
            Action::Done => Ok(()),
            Action::Abandon | Action::HandBack => return,
            Action::Retry {
                failed_attempt,
                delay,
                error,
            } => {
                tracing::warn!(
                    error = crate::redact::mask_emails(&error),
                    ?delay,
                    "transient failure; retrying later"
                );
                telemetry::retried("transient");
                let queue = broker.topology().retry(failed_attempt);
                broker
                    .delay(job, &queue, ticket, failed_attempt + 1, delay)
                    .await
            }
            Action::Wait { delay, why } => {
                match why {
                    Waiting::Redis => tracing::info!(
                        ?delay,
                        "Redis is unavailable; the job waits, spending no attempt"
                    ),
                    Waiting::Relay => tracing::info!(
                        ?delay,
                        "no SMTP relay takes mail; the job waits, spending no attempt"
                    ),
                    Waiting::Connection => tracing::info!(
                        ?delay,
                        "no SMTP connection came free within limits.send_lease; the job waits, \
                         spending no attempt"
                    ),
                    Waiting::Lease => tracing::info!(
                        ?delay,
                        "another attempt owns the send; waiting for its lease"
                    ),
                }
                telemetry::retried(why.label());
                let (queue, delay) = broker.topology().wait(delay);
                broker.delay(job, &queue, ticket, job.attempt, delay).await
            }
            Action::DeadLetter { reason, error } => {
                return self.dead_letter(broker, job, reason, &error).await;
            }
        };
        let moved = match moved {
            Err(BrokerError::Refused { queue, why }) => {
                let error = format!("rabbitmq refused its copy to {queue}: {why}");
                return self
                    .dead_letter(broker, job, DeadReason::Refused, &error)
                    .await;
            }
            other => other,
        };
        finished(match moved {
            Ok(()) => job.ack().await,
            Err(e) => Err(e),
        });
    }

    /// Sends `job` to the dead-letter queue with why, then acknowledges it. A
    /// dead letter RabbitMQ refuses too is handed back after a pause, so the
    /// pool keeps flowing and nothing is lost.
    async fn dead_letter(&self, broker: &Broker, job: &Incoming, reason: DeadReason, error: &str) {
        tracing::warn!(
            reason = reason.as_str(),
            error = crate::redact::mask_emails(error),
            "dead-lettered"
        );
        telemetry::dead_lettered();
        let unrecorded = self.unrecorded(job, reason).await;
        let done = match broker.dead_letter(job, reason, error, unrecorded).await {
            Ok(()) => job.ack().await,
            Err(BrokerError::Refused { queue, why }) => {
                tracing::error!(queue, %why, "rabbitmq refuses even the dead letter; handing the job back in a while");
                tokio::time::sleep(Duration::from_secs(5)).await;
                job.requeue().await
            }
            Err(e) => Err(e),
        };
        finished(done);
    }

    /// Whether the ledger holds no record of `job` as it is dead-lettered,
    /// for the dead letter's headers ([`Unrecorded`]): a replay then knows
    /// until when a missing record means "never admitted since". `None` for
    /// a body without an id, while the ledger holds a record, or when it
    /// cannot say within a second (Redis away): the replay then needs the
    /// record itself.
    async fn unrecorded(&self, job: &Incoming, reason: DeadReason) -> Option<Unrecorded> {
        if reason == DeadReason::Unreadable {
            return None;
        }
        let id = crate::wire::id_of(job.body()).ok()?;
        let asked = self.pipeline.ledger().unrecorded(&id);
        match tokio::time::timeout(Duration::from_secs(1), asked).await {
            Ok(Ok(at)) => at.map(|at_ms| Unrecorded { at_ms }),
            Ok(Err(e)) => {
                tracing::warn!(error = %crate::report::one_line(&e), "could not ask the ledger whether it holds this dead letter's job; a replay of it will need its record");
                None
            }
            Err(_) => None,
        }
    }
}

/// Logs a job that could not be acknowledged (or handed back).
pub(super) fn finished(done: Result<(), BrokerError>) {
    if let Err(e) = done {
        // Unacknowledged: RabbitMQ redelivers it, and the ledger answers
        // that copy from what it recorded.
        tracing::warn!(error = %crate::report::one_line(&e), "could not finish the job; it will be redelivered");
    }
}

/// Results of one job, published through the worker's broker.
struct Replies<'a> {
    broker: &'a Broker,
    job: &'a Incoming,
}

impl Outbox for Replies<'_> {
    async fn publish(&self, result: &JobResult) -> Result<(), Unpublished> {
        let queue = (self.job.reply_to.as_deref()).unwrap_or(&self.broker.topology().results);
        let span = tracing::info_span!(
            "publish",
            otel.name = format!("send {queue}"),
            otel.kind = "producer",
        );
        crate::traces::messaging(&span, "send", queue);
        // The result continues the job's trace (passes its context on,
        // when no spans are made).
        let trace = crate::traces::headers_of(&span).unwrap_or_else(|| self.job.trace.clone());
        let published = self
            .broker
            .publish_result(self.job, &result.to_json(), &trace)
            .instrument(span)
            .await;
        match published {
            Ok(()) => {
                let since = self
                    .job
                    .published_at_ms
                    .and_then(|p| now_ms().checked_sub(p));
                telemetry::job_answered(result.status, since.map(Duration::from_millis));
                match result.status {
                    Status::Sent | Status::Rejected | Status::Duplicate | Status::Suppressed => {
                        tracing::info!(status = ?result.status, retry_after_ms = result.exact_retry_after_ms.or(result.retry_after_ms), "answered");
                    }
                    _ => tracing::warn!(
                        status = ?result.status,
                        error = result.error.as_deref().map(crate::redact::mask_emails),
                        "answered"
                    ),
                }
                Ok(())
            }
            Err(BrokerError::Refused { queue, why }) => {
                Err(Unpublished::Refused(format!("{queue}: {why}")))
            }
            Err(e) => Err(Unpublished::Lost(crate::report::one_line(&e))),
        }
    }
}
