//! The pipeline: the one place that combines the stages (wire, templates,
//! ledger with its limiter, mailer) and decides what becomes of a job
//! message: answered, retried later, waiting for another attempt, or
//! dead-lettered.
//!
//! A job goes through five stages, in this order ([`Pipeline::handle`]):
//! - **decode** (here): the body becomes a [`Job`]; a body without a usable
//!   id is dead-lettered, any other bad input is answered `invalid`;
//! - **screen** (here): everything else that would make the job `invalid`
//!   (its template set, its recipient) is checked before the limiter, so a
//!   malformed job never uses quota;
//! - **admit** (`admit.rs`): the ledger looks up the id and, if it has no
//!   live admission, asks the limiter, atomically. Every answer that needs
//!   no mail ends here;
//! - **deliver** (`deliver.rs`): the mail is rendered (only now, so a flood
//!   of rejections costs no rendering) and sent;
//! - **settle** (`settle.rs`): the outcome is answered and recorded in the
//!   ledger.
//!
//! Results are built in one place, from an `Outcome` (`outcome.rs`), and
//! published through the [`Outbox`] the worker passes in, so the ledger can
//! record that a result was confirmed. A job that cannot go on now is
//! retried or waits (`retry.rs`). The worker carries out the returned
//! [`Action`].

mod admit;
mod deliver;
mod outcome;
mod retry;
mod settle;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::domain::{DeadReason, Job, Ticket};
use crate::ledger::{JobRef, Ledger};
use crate::mailer::Mailer;
use crate::settings::Settings;
use crate::templates::Templates;
use crate::wire::{self, DecodeError, JobResult};

use admit::request;
use outcome::{Disclosure, Outcome};

/// What the worker must do with a job message once the pipeline is done.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Acknowledge it: it was answered (or had been answered before).
    Done,
    /// Send it to wait `delay` in the retry queue of `failed_attempt`, and
    /// come back as the next attempt of the same lineage.
    Retry {
        /// The attempt that failed.
        failed_attempt: u32,
        /// How long to wait.
        delay: Duration,
        /// Why, for the log.
        error: String,
    },
    /// Another attempt owns this job's send, or Redis or the SMTP relays
    /// fail whatever the mail: look again after `delay`, without counting
    /// an attempt.
    Wait {
        /// How long to wait.
        delay: Duration,
        /// Why, for the log and `mailgate_retries_total`.
        why: Waiting,
    },
    /// Put it in the dead-letter queue with `error` and acknowledge it: it
    /// cannot be answered (not JSON, no usable id), its result could not be
    /// delivered, or it failed on every attempt (its `failed` result was
    /// published first).
    DeadLetter {
        /// Why, as one word (the `x-mailgate-reason` header).
        reason: DeadReason,
        /// Why, for people (the `x-mailgate-error` header).
        error: String,
    },
    /// Leave it unacknowledged: the broker connection is gone, so RabbitMQ
    /// delivers it again, and the ledger answers that copy.
    Abandon,
    /// Give it back to RabbitMQ for another worker, as it came: the worker
    /// is stopping ([`Stopping`]) and its SMTP transaction had not begun.
    /// Its lease, if it held one, was given back, so the next worker sends
    /// it at once; nothing was spent.
    HandBack,
}

/// Whether the worker is stopping (SIGTERM, a rolling deploy): from then
/// on no SMTP transaction begins. A job whose transaction has not begun is
/// handed back ([`Action::HandBack`]), its lease released; one whose
/// transaction began finishes. A deploy then never cuts a mail off at the
/// shutdown deadline, and never reports a delivered code as "delivery
/// unknown" for want of time. Clones share the flag.
#[derive(Debug, Clone)]
pub struct Stopping(Arc<tokio::sync::watch::Sender<bool>>);

impl Default for Stopping {
    fn default() -> Self {
        Self(Arc::new(tokio::sync::watch::Sender::new(false)))
    }
}

impl Stopping {
    /// From now on no SMTP transaction begins.
    pub fn begin(&self) {
        self.0.send_replace(true);
    }

    /// Whether [`Stopping::begin`] was called.
    pub fn is_set(&self) -> bool {
        *self.0.borrow()
    }

    /// Completes once [`Stopping::begin`] is called.
    pub async fn wait(&self) {
        let mut rx = self.0.subscribe();
        // The sender lives in `self`, so the channel cannot close.
        let _ = rx.wait_for(|stopping| *stopping).await;
    }
}

/// Why a job waits without spending an attempt ([`Action::Wait`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiting {
    /// Another attempt owns the send (its lease).
    Lease,
    /// Redis cannot be used.
    Redis,
    /// Every SMTP relay failed whatever the mail (connection, session, or
    /// refusals that are the relay's, such as throttling at RCPT while a
    /// NOOP probe passes): not the job's fault, so it spends no attempt.
    Relay,
    /// No SMTP connection came free for the job within
    /// `limits.send_lease` (every one busy with slow sends, or every
    /// relay's circuit open): it was not admitted, and spends no attempt.
    Connection,
}

impl Waiting {
    /// Its `reason` label in `mailgate_retries_total`.
    pub fn label(self) -> &'static str {
        match self {
            Waiting::Lease => "lease",
            Waiting::Redis => "outage",
            Waiting::Relay => "relay",
            Waiting::Connection => "connection",
        }
    }
}

/// A job message as the pipeline needs it.
#[derive(Debug, Clone, Copy)]
pub struct Message<'a> {
    /// The raw body.
    pub body: &'a [u8],
    /// 1 for the first attempt.
    pub attempt: u32,
    /// Its lineage: the one it carried, or a fresh one.
    pub ticket: &'a Ticket,
    /// It carried mailgate's ticket: one of mailgate's own copies (a retry
    /// or a lease wait), not a producer's message.
    pub continuation: bool,
    /// A producer's message RabbitMQ delivered before, or mailgate's copy
    /// of one: its first delivery (its worker died, or lost its connection)
    /// may be what sent the job's mail.
    pub redelivered: bool,
    /// Copied onto the result.
    pub correlation_id: Option<&'a str>,
    /// When the producer published it, ms since the epoch, if it said
    /// (carried on mailgate's copies): when the job was made, if its body
    /// has no `created_at`.
    pub published_at_ms: Option<u64>,
    /// When a worker first took it (carried on mailgate's copies), ms since
    /// the epoch: what `limits.max_age` counts from.
    pub seen_at_ms: u64,
}

/// Why a result was not published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unpublished {
    /// The broker connection is gone: the job comes back and is answered then.
    Lost(String),
    /// No queue would take it (refused, or missing even after declaring it
    /// again): the job is dead-lettered with this reason.
    Refused(String),
}

/// Where results go: the worker's broker, for the job being handled.
pub trait Outbox: Send + Sync {
    /// Publishes `result` and waits for the broker's confirm.
    fn publish(&self, result: &JobResult) -> impl Future<Output = Result<(), Unpublished>> + Send;
}

/// The stages, combined.
#[derive(Debug)]
pub struct Pipeline<L> {
    ledger: L,
    templates: Templates,
    mailer: Mailer,
    settings: Settings,
    disclose: Disclosure,
    stopping: Stopping,
}

impl<L: Ledger> Pipeline<L> {
    /// Combines the stages; once `stopping` is set, no SMTP transaction
    /// begins.
    pub fn new(
        ledger: L,
        templates: Templates,
        mailer: Mailer,
        settings: Settings,
        stopping: Stopping,
    ) -> Self {
        Self {
            ledger,
            templates,
            mailer,
            disclose: Disclosure::new(&settings),
            settings,
            stopping,
        }
    }

    /// The ledger, for health checks.
    pub fn ledger(&self) -> &L {
        &self.ledger
    }

    /// The mailer, for health checks.
    pub fn mailer(&self) -> &Mailer {
        &self.mailer
    }

    /// Processes one job message and says what to do with it. Side effects
    /// (the mail, the ledger, the result) happen here; moving the message
    /// is the caller's.
    pub async fn handle(&self, msg: &Message<'_>, out: &impl Outbox) -> Action {
        // Stopping: the next worker takes it, as it came.
        if self.stopping.is_set() {
            return Action::HandBack;
        }
        let job = match self.decode(msg, out).await {
            Ok(job) => job,
            Err(action) => return action,
        };
        if let Err(why) = self.screen(&job) {
            return self.answer(out, msg, &job, Outcome::Invalid(why)).await;
        }
        let job_ref = JobRef {
            request: request(&job),
            ticket: msg.ticket,
            attempt: msg.attempt,
            // This handling of the message (see `JobRef::holder`).
            holder: uuid::Uuid::new_v4().as_u64_pair().0,
        };
        let expires_ms = self.expires_ms(&job, msg);
        let (admitted, slot) = match (self.admit(&job, &job_ref, msg, out, expires_ms)).await {
            Ok(admitted) => admitted,
            Err(action) => return action,
        };
        // Boxed: the SMTP transaction's state is most of a job's future
        // (about 10 KB), and only admitted jobs need it, so a rejected job's
        // task stays small (it is spawned, and moved, once per message).
        let delivery = Box::pin(self.deliver(&job, &job_ref, slot)).await;
        self.settle(&job, &job_ref, msg, out, delivery, admitted)
            .await
    }

    /// Decode: the job, or what to do with a message that is not one.
    async fn decode(&self, msg: &Message<'_>, out: &impl Outbox) -> Result<Job, Action> {
        match wire::decode(msg.body) {
            Ok(job) => {
                // Every later log line about this job carries its id.
                tracing::Span::current().record("id", job.id.as_str());
                Ok(job)
            }
            Err(DecodeError::Unusable(error)) => Err(Action::DeadLetter {
                reason: DeadReason::Unreadable,
                error,
            }),
            Err(DecodeError::Invalid { id, error }) => {
                tracing::Span::current().record("id", id.as_str());
                let r = Outcome::Invalid(error).result(id.as_str(), None, msg, self.disclose);
                Err(self.publish(out, &r).await.err().unwrap_or(Action::Done))
            }
        }
    }

    /// When the job expires, ms since the epoch: its `expires_at`, else
    /// `limits.max_age` (at most `dedup_for`) after a worker first took it
    /// (carried on mailgate's copies), so no job waits without end; `None`
    /// with neither. Not from its `created_at` or publish time: a producer
    /// may send a field of that name that means something else (when the
    /// account was created), or a clock hours off, and expire its codes
    /// unsent, or set one in the future and have a job wait for ever.
    fn expires_ms(&self, job: &Job, msg: &Message<'_>) -> Option<u64> {
        if let Some(at) = job.expires_at {
            return Some(u64::try_from(at.as_millisecond()).unwrap_or(0));
        }
        let max_age = self.settings.limits.job_max_age()?;
        let max_age = u64::try_from(max_age.as_millis()).unwrap_or(u64::MAX);
        Some(msg.seen_at_ms.saturating_add(max_age))
    }

    /// Screen: why the job can never be mailed, if it cannot.
    fn screen(&self, job: &Job) -> Result<(), String> {
        if !self.templates.has_purpose(&job.purpose) {
            return Err(format!(
                "unknown purpose {:?}; known: {}",
                job.purpose.as_str(),
                self.templates.purposes().collect::<Vec<_>>().join(", ")
            ));
        }
        self.mailer
            .check_recipient(&job.email)
            .map_err(|e| e.to_string())
    }
}
