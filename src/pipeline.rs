//! The pipeline: the one place that combines the stages (decode, templates,
//! mailer, limiter) and decides what becomes of a job: answered, retried
//! later, or dead-lettered.
//!
//! Order matters. What can make a job `invalid` (decoding, the template set,
//! the recipient) is checked before the limiter, so a malformed job never
//! uses quota. The mail is rendered and composed only after admission, so a
//! flood of rejected jobs costs no rendering; if rendering fails then (a
//! job's variables break a template), the job is answered `invalid` and its
//! quota refunded. After an admission the only ways out are `sent`, a retry
//! (the admission and its quota are kept), or a refund (`failed`,
//! `expired`, `invalid`).

use std::time::Duration;

use backon::BackoffBuilder;

use crate::domain::Job;
use crate::limiter::{Clock, Decision, LimitError, RateLimiter, Request, Verdict};
use crate::mailer::{MailError, Mailer, Outgoing};
use crate::settings::RetrySettings;
use crate::telemetry;
use crate::templates::Templates;
use crate::wire::{self, DecodeError, JobResult, RuleWire, Status};

/// What the worker must do with a job message.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Publish this result, then acknowledge the job.
    Reply(JobResult),
    /// Send the job to wait `delay` in retry queue `queue_attempt` (the
    /// attempt that failed) and come back as attempt `next_attempt`.
    Retry {
        /// The attempt that failed.
        failed_attempt: u32,
        /// How long to wait.
        delay: Duration,
        /// Why, for the log.
        error: String,
    },
    /// Another attempt owns this job's send: look again after `delay`,
    /// without counting an attempt.
    Wait {
        /// How long to wait.
        delay: Duration,
    },
    /// The message cannot be answered (not JSON, no id): dead-letter it.
    DeadLetter {
        /// Why.
        error: String,
    },
    /// The job failed on every attempt: publish this `failed` result, and
    /// put a copy in the dead-letter queue (with the last error and the
    /// attempt count) for operators, so a poison job is answered, kept, and
    /// never loops.
    GiveUp(JobResult),
    /// This message was answered before (a crash came between its result
    /// and its ack): acknowledge it, answer nothing.
    AlreadyAnswered,
}

/// A job message as the pipeline needs it.
#[derive(Debug, Clone, Copy)]
pub struct Message<'a> {
    /// The raw body.
    pub body: &'a [u8],
    /// 1 for the first attempt.
    pub attempt: u32,
    /// Whether this message was handled before (redelivered by RabbitMQ, or
    /// sent back through a retry or wait queue), as opposed to a new message
    /// that reuses an id.
    pub seen_before: bool,
    /// Copied onto the result.
    pub correlation_id: Option<&'a str>,
}

/// The stages, combined.
pub struct Pipeline<L> {
    limiter: L,
    templates: Templates,
    mailer: Mailer,
    retry: RetrySettings,
}

impl<L: RateLimiter> Pipeline<L> {
    /// Combines the stages.
    pub fn new(limiter: L, templates: Templates, mailer: Mailer, retry: RetrySettings) -> Self {
        Self {
            limiter,
            templates,
            mailer,
            retry,
        }
    }

    /// The limiter, for health checks.
    pub fn limiter(&self) -> &L {
        &self.limiter
    }

    /// The mailer, for health checks.
    pub fn mailer(&self) -> &Mailer {
        &self.mailer
    }

    /// Records that the job with this result was answered; best effort (if it
    /// is lost, a crash before the ack answers the job a second time).
    pub async fn mark_answered(&self, result: &JobResult) {
        let Ok(id) = crate::domain::JobId::parse(&result.id) else {
            return;
        };
        if let Err(e) = self.limiter.mark_answered(&id).await {
            tracing::debug!(error = %e, "could not record the answer");
        }
    }

    /// The wait before retrying after attempt `failed` (1-based): `initial`
    /// doubling per attempt up to `max`, with jitter.
    pub fn backoff(&self, failed: u32) -> Duration {
        backon::ExponentialBuilder::default()
            .with_min_delay(self.retry.initial)
            .with_max_delay(self.retry.max)
            .with_factor(2.0)
            .with_jitter()
            .with_max_times(failed as usize)
            .build()
            .nth(failed.saturating_sub(1) as usize)
            .unwrap_or(self.retry.max)
    }

    /// Processes one job message and says what to do with it. Side effects
    /// (the mail, the limiter) happen here; broker work is the caller's.
    pub async fn handle(&self, msg: &Message<'_>) -> Action {
        let decoded = wire::decode(msg.body);
        // Every later log line about this job carries its id (the worker's
        // span leaves the field empty until the job is parsed).
        if let Ok(job) = &decoded {
            tracing::Span::current().record("id", job.id.as_str());
        } else if let Err(DecodeError::Invalid { id, .. }) = &decoded {
            tracing::Span::current().record("id", id.as_str());
        }
        if msg.seen_before {
            let id = match &decoded {
                Ok(job) => Some(&job.id),
                Err(DecodeError::Invalid { id, .. }) => Some(id),
                Err(DecodeError::Unusable(_)) => None,
            };
            if let Some(id) = id {
                match self.limiter.answered(id).await {
                    Ok(true) => return Action::AlreadyAnswered,
                    Ok(false) => {}
                    // Unknown: answer again rather than risk no answer.
                    Err(e) => {
                        tracing::debug!(error = %e, "cannot tell whether the job was answered")
                    }
                }
            }
        }
        let job = match decoded {
            Ok(job) => job,
            Err(DecodeError::Unusable(error)) => return Action::DeadLetter { error },
            Err(DecodeError::Invalid { id, error }) => {
                let mut r = self.result(id.as_str(), Status::Invalid, msg);
                r.error = Some(error);
                return Action::Reply(r);
            }
        };
        let answer = |status: Status| {
            let mut r = self.result(job.id.as_str(), status, msg);
            r.email = Some(job.email.to_string());
            r
        };
        let invalid = |error: String| {
            let mut r = answer(Status::Invalid);
            r.error = Some(error);
            Action::Reply(r)
        };

        if !self.templates.has_purpose(&job.purpose) {
            return invalid(format!(
                "unknown purpose {:?}; known: {}",
                job.purpose.as_str(),
                self.templates.purposes().collect::<Vec<_>>().join(", ")
            ));
        }
        let now = jiff::Timestamp::now();
        if job.expires_at.is_some_and(|at| at <= now) {
            return self.expire(&job, msg, answer(Status::Expired)).await;
        }
        // The mail itself is rendered only once admitted: in a flood most
        // jobs are rejected, and rendering them would be wasted work.
        if let Err(e) = self.mailer.check_recipient(&job.email) {
            return invalid(e.to_string());
        }

        let req = Request {
            id: &job.id,
            email: &job.email,
            ip: job.ip.as_ref(),
            purpose: Some(&job.purpose),
        };
        let decided_at_ms = match self.limiter.check(&req, Clock::Server).await {
            Err(e) => return self.transient(&job, msg, limiter_error(&e), false).await,
            Ok(Decision {
                decided_at_ms,
                verdict,
            }) => match telemetry::observe_decision(verdict) {
                Verdict::Admitted => decided_at_ms,
                Verdict::Resume { admitted_at_ms } => admitted_at_ms,
                Verdict::Rejected {
                    retry_after_ms,
                    rule,
                } => {
                    let mut r = answer(Status::Rejected);
                    r.decided_at_ms = Some(decided_at_ms);
                    r.retry_after_ms = Some(retry_after_ms);
                    r.rule = Some(RuleWire {
                        scope: rule.scope.as_str(),
                        window_ms: rule.window_ms,
                        max: rule.max,
                    });
                    return Action::Reply(r);
                }
                Verdict::Duplicate { admitted_at_ms } => {
                    // This very message was handled before and its mail went
                    // out (its result was lost): say so. A new message with
                    // the same id is a duplicate.
                    return Action::Reply(if msg.seen_before {
                        let mut r = answer(Status::Sent);
                        r.decided_at_ms = Some(admitted_at_ms);
                        r
                    } else {
                        answer(Status::Duplicate)
                    });
                }
                Verdict::InProgress { lease_left_ms, .. } => {
                    return Action::Wait {
                        delay: Duration::from_millis(lease_left_ms + 100),
                    };
                }
                Verdict::Interrupted { .. } => {
                    // Never twice: the admission stays (no refund) so no
                    // later copy can send either.
                    let mut r = answer(Status::Failed);
                    r.error = Some(
                        "delivery unknown: a worker stopped during this job's SMTP transaction; \
                         the mail may have arrived, so it is not sent again"
                            .into(),
                    );
                    return Action::Reply(r);
                }
            },
        };

        let mail = match self
            .templates
            .render(&job, now)
            .map_err(|e| e.to_string())
            .and_then(|r| {
                self.mailer
                    .compose(&Outgoing {
                        to: &job.email,
                        subject: &r.subject,
                        text: &r.text,
                        html: r.html.as_deref(),
                    })
                    .map_err(|e| e.to_string())
            }) {
            Ok(m) => m,
            Err(e) => {
                // Templates are test-rendered at start-up, so this takes a
                // job whose variables break a template: answer it, and give
                // back the quota it was admitted for.
                let mut r = answer(Status::Invalid);
                r.error = Some(e);
                return self.refund_then(&job, msg, r).await;
            }
        };

        // Take an SMTP slot, then record that the transaction begins: if this
        // worker dies from here until the outcome is recorded, the job is
        // answered `failed` (delivery unknown) rather than mailed twice.
        let slot = self.mailer.reserve().await;
        match self.limiter.mark_sending(&job.id).await {
            Ok(true) => {}
            // Another attempt took the send over (this one's lease lapsed):
            // look again shortly.
            Ok(false) => {
                return Action::Wait {
                    delay: Duration::from_millis(100),
                };
            }
            Err(e) => return self.transient(&job, msg, limiter_error(&e), true).await,
        }
        let started = std::time::Instant::now();
        let sent = self.mailer.send(slot, mail).await;
        let outcome = match &sent {
            Ok(()) => "ok",
            Err(MailError::Transient(_) | MailError::Relay(_)) => "transient",
            Err(_) => "permanent",
        };
        telemetry::smtp_send(outcome, started.elapsed());
        match sent {
            Ok(()) => {
                self.mark_sent(&job).await;
                let mut r = answer(Status::Sent);
                r.decided_at_ms = Some(decided_at_ms);
                Action::Reply(r)
            }
            Err(MailError::Transient(e) | MailError::Relay(e)) => {
                self.transient(&job, msg, e, true).await
            }
            Err(e) => {
                let mut r = answer(Status::Failed);
                r.error = Some(e.to_string());
                self.refund_then(&job, msg, r).await
            }
        }
    }

    fn result(&self, id: &str, status: Status, msg: &Message<'_>) -> JobResult {
        let mut r = JobResult::new(id, status, msg.attempt);
        r.correlation_id = msg.correlation_id.map(str::to_owned);
        r
    }

    /// A transient failure: retry later, or, out of attempts, fail (and
    /// refund). `admitted` says whether this attempt holds the send lease.
    async fn transient(
        &self,
        job: &Job,
        msg: &Message<'_>,
        error: String,
        admitted: bool,
    ) -> Action {
        if msg.attempt < self.retry.max_attempts {
            if admitted {
                // Let the retry resume at once rather than wait for the lease.
                if let Err(e) = self.limiter.release(&job.id).await {
                    tracing::debug!(error = %e, "could not release the send lease; the retry waits for it");
                }
            }
            return Action::Retry {
                failed_attempt: msg.attempt,
                delay: self.backoff(msg.attempt),
                error,
            };
        }
        let mut r = self.result(job.id.as_str(), Status::Failed, msg);
        r.email = Some(job.email.to_string());
        r.error = Some(format!("gave up after {} attempts: {error}", msg.attempt));
        match self.refund_then(job, msg, r).await {
            Action::Reply(r) => Action::GiveUp(r),
            other => other,
        }
    }

    /// The code expired: refund whatever an earlier attempt of this message
    /// was admitted for, then answer.
    async fn expire(&self, job: &Job, msg: &Message<'_>, r: JobResult) -> Action {
        if msg.seen_before {
            self.refund_then(job, msg, r).await
        } else {
            Action::Reply(r)
        }
    }

    /// Refunds the job's admission, then answers `r`. If Redis cannot be
    /// reached the refund is retried with the job while attempts remain; the
    /// last attempt answers anyway (the quota then expires with its window).
    async fn refund_then(&self, job: &Job, msg: &Message<'_>, r: JobResult) -> Action {
        match self.limiter.refund(&job.id).await {
            Ok(_) => Action::Reply(r),
            Err(e) if msg.attempt < self.retry.max_attempts => Action::Retry {
                failed_attempt: msg.attempt,
                delay: self.backoff(msg.attempt),
                error: format!("refund: {}", limiter_error(&e)),
            },
            Err(e) => {
                tracing::warn!(error = %e, "could not refund; the quota expires with its window");
                Action::Reply(r)
            }
        }
    }

    /// Records the send. Retried briefly: if it is lost, a redelivery of the
    /// job after the lease would mail again.
    async fn mark_sent(&self, job: &Job) {
        use backon::Retryable;
        let mark = || async { self.limiter.mark_sent(&job.id).await };
        let marked = mark
            .retry(
                backon::ExponentialBuilder::default()
                    .with_min_delay(Duration::from_millis(50))
                    .with_max_times(5),
            )
            .await;
        if let Err(e) = marked {
            tracing::warn!(error = %e, "mail sent but not recorded as sent; a redelivery after the lease would send again");
        }
    }
}

fn limiter_error(e: &LimitError) -> String {
    format!("rate limiter unavailable: {e}")
}
