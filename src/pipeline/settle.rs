//! Settle: what a delivery came to is answered and recorded in the ledger.
//! Ledger writes after the fact go through [`Pipeline::record`], which
//! never holds a job's answer back past a moment once the worker stops.

use std::future::Future;
use std::time::Duration;

use backon::Retryable;

use crate::domain::{DeadReason, EmailAddress, Job};
use crate::ledger::{
    BOUNCE_RUN, BOUNCE_RUN_WINDOW, Bounced, Ending, JobRef, Ledger, LedgerError, Refund,
};
use crate::mailer::MailError;

use super::admit::Admitted;
use super::deliver::Delivery;
use super::outcome::{DELIVERY_UNKNOWN, Outcome};
use super::{Action, Message, Outbox, Pipeline, Waiting};

/// How long a ledger write may still take once the worker is stopping
/// (see [`Pipeline::record`]).
const STOPPING_WRITE: Duration = Duration::from_secs(1);

impl<L: Ledger> Pipeline<L> {
    /// Settle: answers the delivery and records it in the ledger.
    pub(super) async fn settle(
        &self,
        job: &Job,
        job_ref: &JobRef<'_>,
        msg: &Message<'_>,
        out: &impl Outbox,
        delivery: Delivery,
        admitted: Admitted,
    ) -> Action {
        let error = match delivery {
            Delivery::Sent => return self.sent(job, job_ref, msg, out, admitted).await,
            Delivery::Stopped => return Action::HandBack,
            Delivery::Unbuildable(e) => {
                // Templates are test-rendered at start-up, so this takes a
                // job whose variables break a template.
                return self
                    .end(job, job_ref, msg, out, Ending::Refund(Refund::Invalid), e)
                    .await;
            }
            Delivery::Failed(MailError::Unknown(e)) => {
                let e = format!("{DELIVERY_UNKNOWN} ({e})");
                return self.end(job, job_ref, msg, out, Ending::Unknown, e).await;
            }
            Delivery::Failed(MailError::NoMailbox {
                text,
                relay,
                vouched,
            }) => {
                // Its next jobs are answered `suppressed`, before the quota
                // is given back and the job answered.
                let e = self.bounced(job, text, &relay, vouched).await;
                return self
                    .end(job, job_ref, msg, out, Ending::Refund(Refund::Failed), e)
                    .await;
            }
            Delivery::Failed(MailError::Untrusted { text, lift }) => {
                // The relay's word is doubted now: the bounces of its run
                // lose their suppressions too.
                for address in lift.iter().filter_map(|a| EmailAddress::parse(a).ok()) {
                    self.record(|| self.ledger.unbounced(&address)).await;
                }
                return self
                    .end(job, job_ref, msg, out, Ending::Refund(Refund::Failed), text)
                    .await;
            }
            Delivery::Failed(e @ (MailError::Permanent(_) | MailError::Address(_))) => {
                let e = e.to_string();
                return self
                    .end(job, job_ref, msg, out, Ending::Refund(Refund::Failed), e)
                    .await;
            }
            Delivery::Failed(MailError::Relay(e)) => return self.no_relay(job_ref, msg, &e).await,
            Delivery::Failed(e) => e.to_string(),
        };
        self.transient(job, job_ref, msg, out, error).await
    }

    /// A relay said `job`'s mailbox does not exist (`text`), taken at its
    /// word by `relay`'s own runs: the address is suppressed, unless every
    /// worker's bounces of its domain doubt it (`vouched`: the relay took
    /// mail for the domain lately). The job's error.
    async fn bounced(&self, job: &Job, text: String, relay: &str, vouched: bool) -> String {
        let why: String = text.chars().take(200).collect();
        let bounced = (self.record(|| self.ledger.bounced(&job.email, &why, vouched))).await;
        match bounced {
            Some(Bounced::Doubted { lifted }) => {
                crate::telemetry::bounce_doubted(relay);
                let window = humantime::format_duration(BOUNCE_RUN_WINDOW);
                tracing::warn!(
                    relay,
                    lifted,
                    "more than {BOUNCE_RUN} mailboxes of this domain bounced within {window}, on \
                     every worker, while the relay took no mail for it: its word no longer \
                     suppresses them, and theirs are lifted"
                );
                format!(
                    "{text} (not taken as grounds to suppress the mailbox: more than \
                     {BOUNCE_RUN} mailboxes of its domain bounced within {window} while the relay \
                     took no mail for it)"
                )
            }
            Some(Bounced::Suppressed) => {
                crate::telemetry::bounced();
                tracing::info!(
                    "the relay says this mailbox does not exist: it is suppressed \
                     (limits.suppress_bounces_for)"
                );
                text
            }
            Some(Bounced::Off) | None => text,
        }
    }

    /// The mail went out: recorded, then answered `sent`.
    ///
    /// Recorded before the result goes out, so a copy of the job seen after
    /// a crash is answered `sent` again, never "delivery unknown". Whether
    /// the result was confirmed is not recorded (it would cost a round trip
    /// per mail): a crash between the confirm and the ack repeats `sent`.
    async fn sent(
        &self,
        job: &Job,
        job_ref: &JobRef<'_>,
        msg: &Message<'_>,
        out: &impl Outbox,
        admitted: Admitted,
    ) -> Action {
        self.record(|| self.ledger.settle(job_ref, &Ending::Sent, false))
            .await;
        let sent = Outcome::Sent {
            decided_at_ms: admitted.at_ms,
            shadow: admitted.shadow,
            rooms: admitted.rooms,
        };
        let r = sent.result(job.id.as_str(), Some(job), msg, self.disclose);
        self.publish(out, &r).await.err().unwrap_or(Action::Done)
    }

    /// Every relay failed whatever the mail, and nothing was handed over:
    /// not the job's fault, so its lease is given back and it waits without
    /// spending an attempt (an `expires_at` still ends it).
    async fn no_relay(&self, job_ref: &JobRef<'_>, msg: &Message<'_>, e: &str) -> Action {
        self.record(|| self.ledger.release(job_ref)).await;
        // A relay's refusal may quote the recipient.
        let error = crate::redact::mask_emails(e);
        tracing::info!(%error, "every SMTP relay fails whatever the mail; the job waits without spending an attempt");
        Action::Wait {
            delay: self.backoff(msg.attempt),
            why: Waiting::Relay,
        }
    }

    /// A transient failure, nothing handed over: the lease is given back
    /// and the job retried, or, out of attempts, it ends `failed` and is
    /// dead-lettered.
    async fn transient(
        &self,
        job: &Job,
        job_ref: &JobRef<'_>,
        msg: &Message<'_>,
        out: &impl Outbox,
        error: String,
    ) -> Action {
        if msg.attempt < self.settings.retry.max_attempts {
            self.record(|| self.ledger.release(job_ref)).await;
            return self.retry(msg, error);
        }
        let gave_up = format!("gave up after {} attempts: {error}", msg.attempt);
        match self
            .end(
                job,
                job_ref,
                msg,
                out,
                Ending::Refund(Refund::Failed),
                gave_up.clone(),
            )
            .await
        {
            Action::Done => Action::DeadLetter {
                reason: DeadReason::Failed,
                error: gave_up,
            },
            other => other,
        }
    }

    /// Ends an owned job without a confirmed mail: records `ending`, answers
    /// `error` (as the ending's status), then records that it was answered.
    async fn end(
        &self,
        job: &Job,
        job_ref: &JobRef<'_>,
        msg: &Message<'_>,
        out: &impl Outbox,
        ending: Ending,
        error: String,
    ) -> Action {
        self.record(|| self.ledger.settle(job_ref, &ending, false))
            .await;
        let outcome = match ending {
            Ending::Refund(Refund::Invalid) => Outcome::Invalid(error),
            Ending::Refund(Refund::Expired) => Outcome::Expired,
            Ending::Refund(Refund::Superseded) => Outcome::Superseded,
            Ending::Refund(Refund::Failed) | Ending::Unknown | Ending::Sent => {
                Outcome::Failed(error)
            }
        };
        let action = self.answer(out, msg, job, outcome).await;
        if action == Action::Done {
            self.record(|| self.ledger.answered(job_ref)).await;
        }
        action
    }

    /// Runs a ledger write after the fact (the mail is out, or the result
    /// is), retried while Redis is away for up to
    /// [`crate::ledger::OUTAGE_RETRY_FOR`]: if it is lost, a later copy
    /// of the job is answered from what the ledger knew before ("delivery
    /// unknown" for a sent one). Its answer, if it came.
    pub(super) async fn record<T, Fut>(&self, write: impl FnMut() -> Fut) -> Option<T>
    where
        Fut: Future<Output = Result<T, LedgerError>>,
    {
        let retried = write
            .retry(crate::ledger::outage_backoff())
            .when(LedgerError::is_outage);
        // Stopping, a write Redis does not answer gets a moment, no more:
        // the job's answer (a `sent` result) must go out before the
        // shutdown deadline, or the next worker would answer a delivered
        // code "delivery unknown".
        let stopping = async {
            self.stopping.wait().await;
            tokio::time::sleep(STOPPING_WRITE).await;
        };
        let done = tokio::select! {
            done = retried => done.map_err(|e| crate::report::one_line(&e)),
            () = stopping => Err("Redis did not answer in time while the worker stops".into()),
        };
        match done {
            Ok(answer) => Some(answer),
            Err(e) => {
                tracing::warn!(error = %e, "could not record the job's progress in the ledger");
                None
            }
        }
    }
}
