//! The pipeline: the one place that combines the stages (wire, templates,
//! ledger with its limiter, mailer) and decides what becomes of a job
//! message: answered, retried later, waiting for another attempt, or
//! dead-lettered.
//!
//! A job goes through five steps, each a function below:
//! - **decode**: the body becomes a [`Job`]; a body without a usable id is
//!   dead-lettered, any other bad input is answered `invalid`;
//! - **screen**: everything else that would make the job `invalid` (its
//!   template set, its recipient) is checked before the limiter, so a
//!   malformed job never uses quota;
//! - **admit**: the ledger looks up the id and, if it has no live admission,
//!   asks the limiter, atomically. Every answer that needs no mail ends here;
//! - **deliver**: the mail is rendered (only now, so a flood of rejections
//!   costs no rendering) and sent;
//! - **settle**: the outcome is answered and recorded in the ledger.
//!
//! Results are built in one place, from an [`Outcome`]. The worker carries
//! out the returned [`Action`]; results are published through the
//! [`Outbox`] it passes in, so the ledger can record that a result was
//! confirmed.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, Retryable};
use tracing::Instrument as _;

use crate::domain::{Job, Ticket};
use crate::ledger::{Admission, Ending, Entry, JobRef, Ledger, LedgerError, Refund, Verdict};
use crate::limiter::{Clock, Request, Room, Rooms, RuleRef, Scope};
use crate::mailer::{MailError, Mailer, Outgoing, Slot};
use crate::settings::Settings;
use crate::telemetry;
use crate::templates::Templates;
use crate::wire::{self, DecodeError, JobResult, QuotaWire, RuleWire, Status};

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
        /// Why.
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

/// How long a ledger write may still take once the worker is stopping
/// (see `Pipeline::record`).
const STOPPING_WRITE: Duration = Duration::from_secs(1);

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
    /// refusals that are the relay's): not the job's fault, so it spends
    /// no attempt (found by review: a relay that throttled at RCPT, while
    /// its NOOP probe passed, failed and dead-lettered every job).
    Relay,
}

impl Waiting {
    /// Its `reason` label in `mailgate_retries_total`.
    pub fn label(self) -> &'static str {
        match self {
            Waiting::Lease => "lease",
            Waiting::Redis => "outage",
            Waiting::Relay => "relay",
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

/// How a message is answered; the one place results are built from.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Sent {
        decided_at_ms: u64,
        /// The shadow rule that would have rejected it, if this attempt's
        /// admission found one.
        shadow: Option<RuleRef>,
        /// What this attempt's admission left of each scope's quota.
        rooms: Rooms,
    },
    Rejected {
        decided_at_ms: u64,
        retry_after_ms: u64,
        rule: RuleRef,
    },
    Duplicate,
    Invalid(String),
    Expired,
    Failed(String),
    Superseded,
}

/// The error of a job whose delivery is unknown.
const DELIVERY_UNKNOWN: &str = "delivery unknown: the SMTP transaction of this job began and \
     its outcome never came back; the mail may have arrived, so it is not sent again";

/// What a result tells about the scopes its requester does not own (the
/// mailbox's, the domain's): waits rounded up to `granularity_ms`, the
/// domain's quota left out unless `domain_quota` (see
/// [`crate::settings::LimitSettings::result_granularity`]). The requester's
/// own network (the IP scope) is told exactly. Found by review: a
/// `rejected` result told a stranger, to the millisecond, when the owner
/// last asked, and `quota` how many codes others at the domain got.
#[derive(Debug, Clone, Copy)]
struct Disclosure {
    granularity_ms: u64,
    domain_quota: bool,
}

impl Disclosure {
    fn new(settings: &Settings) -> Self {
        Self {
            granularity_ms: u64::try_from(settings.limits.result_granularity.as_millis())
                .unwrap_or(u64::MAX),
            domain_quota: settings.limits.quota_domain,
        }
    }

    /// A wait of `scope` from `decided_at_ms`, as the result tells it:
    /// the moment it ends rounded up to a whole multiple of the
    /// granularity on the clock, so that every result about the same slot
    /// names the same moment, whenever it was asked (found by re-review:
    /// rounding the wait itself let 120 free rejections narrow the owner's
    /// time to 16 ms, each one's interval cut by its exact decided_at_ms).
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
    fn result(
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

/// What the admit stage hands on: when the job was admitted (its first
/// admission, for a resumed one), the shadow rule that would have
/// rejected this admission, if any, and what it left of each scope's
/// quota (nothing for a resumed one).
struct Admitted {
    at_ms: u64,
    shadow: Option<RuleRef>,
    rooms: Rooms,
}

/// What delivering an admitted job came to.
enum Delivery {
    /// The SMTP server accepted the mail.
    Sent,
    /// The mail could not be built (its variables break a template).
    Unbuildable(String),
    /// The send was not attempted: another attempt owns it now, or no SMTP
    /// connection came free within the lease. The lease was given back.
    NotNow,
    /// `expires_at` passed while the job waited for an SMTP connection.
    Expired,
    /// The ledger could not record that the send begins; nothing was sent.
    LedgerDown(LedgerError),
    /// The worker is stopping ([`Stopping`]) and the transaction had not
    /// begun. The lease was given back.
    Stopped,
    /// The SMTP send failed.
    Failed(MailError),
}

/// The stages, combined.
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
        let slot = self.mailer.try_reserve();
        let admitted = match self.admit(&job, &job_ref, msg, out, slot.is_some()).await {
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
            Err(DecodeError::Unusable(error)) => Err(Action::DeadLetter { error }),
            Err(DecodeError::Invalid { id, error }) => {
                tracing::Span::current().record("id", id.as_str());
                let r = Outcome::Invalid(error).result(id.as_str(), None, msg, self.disclose);
                Err(self.publish(out, &r).await.err().unwrap_or(Action::Done))
            }
        }
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

    /// Admit: the decision time if this lineage now owns the job's send,
    /// else what to do with the message (answered here if it needs no mail).
    async fn admit(
        &self,
        job: &Job,
        job_ref: &JobRef<'_>,
        msg: &Message<'_>,
        out: &impl Outbox,
        send_now: bool,
    ) -> Result<Admitted, Action> {
        let entry = Entry {
            job: *job_ref,
            send_now,
            expires_at_ms: job.expires_at.map(ms_since_epoch),
            made_at_ms: job.created_at.map(ms_since_epoch).or(msg.published_at_ms),
        };
        let Admission {
            decided_at_ms,
            verdict,
            shadow,
            rooms,
            by_override,
        } = match (self.ledger.admit(&entry, Clock::Server))
            .instrument(tracing::info_span!(
                "limiter decision",
                otel.kind = "client"
            ))
            .await
        {
            Ok(a) => a,
            Err(e) => {
                // The admission may have run and its reply been lost (a
                // dropped connection, a failover): if it marked the job
                // sending, give the mark back, so the retry resumes the job
                // instead of finding its delivery unknown. Safe: no SMTP
                // transaction began, and the release is fenced to this
                // handling of the message (`JobRef::holder`), so it gives
                // back only a mark this admission set. A few tries over a
                // second: a cluster client reconnects before it answers.
                if send_now {
                    self.release_lost_mark(job_ref).await;
                }
                if e.is_outage() {
                    return Err(self.outage(msg, &e));
                }
                return Err(self.unavailable(job, msg, out, ledger_error(&e)).await);
            }
        };
        telemetry::admission(&verdict, shadow.as_ref(), by_override);
        let answered_before = match verdict {
            Verdict::Sent {
                by_owner, answered, ..
            }
            | Verdict::Unknown { by_owner, answered } => by_owner && answered,
            Verdict::Finished { answered, .. } => answered,
            _ => false,
        };
        if answered_before {
            tracing::info!("answered before (its ack was lost); acknowledging");
            return Err(Action::Done);
        }
        let (outcome, by_owner) = match verdict {
            Verdict::Admitted => {
                return Ok(Admitted {
                    at_ms: decided_at_ms,
                    shadow,
                    rooms,
                });
            }
            // Every `sent` of a job carries the time it was admitted.
            Verdict::Resumed { admitted_at_ms } => {
                return Ok(Admitted {
                    at_ms: admitted_at_ms,
                    shadow: None,
                    rooms: Rooms::default(),
                });
            }
            Verdict::Rejected {
                retry_after_ms,
                rule,
            } => (
                Outcome::Rejected {
                    decided_at_ms,
                    retry_after_ms,
                    rule,
                },
                false,
            ),
            // Past its expiry an unsent admission is refunded into a record
            // the asking lineage owns; only mailgate's own copies ask about
            // ids they may have been admitted for, so only they record that
            // their answer went out (a producer's message has nothing to
            // record, and the write would cost a round trip).
            Verdict::Expired => (Outcome::Expired, msg.continuation),
            Verdict::Busy { lease_left_ms } => {
                return Err(Action::Wait {
                    delay: Duration::from_millis(lease_left_ms.saturating_add(100)),
                    why: Waiting::Lease,
                });
            }
            Verdict::Conflict => (
                Outcome::Invalid(format!(
                    "id {:?} was already used for another job (another mailbox, client address \
                     or purpose) within limits.dedup_for; give each job its own id",
                    job.id.as_str()
                )),
                false,
            ),
            Verdict::Sent {
                admitted_at_ms,
                by_owner,
                ..
            } => {
                // This lineage sent it, or this may be the producer's message
                // (or a copy of it) whose first delivery did (its worker
                // died, or lost its connection, before the ack).
                let ours = by_owner || msg.redelivered;
                let outcome = if ours {
                    Outcome::Sent {
                        decided_at_ms: admitted_at_ms,
                        shadow: None,
                        rooms: Rooms::default(),
                    }
                } else {
                    Outcome::Duplicate
                };
                (outcome, by_owner)
            }
            Verdict::Unknown { by_owner, .. } => {
                (Outcome::Failed(DELIVERY_UNKNOWN.into()), by_owner)
            }
            Verdict::Finished { how, .. } => (refund_outcome(how), true),
            // Refunded into a record this lineage owns, which records that
            // its answer went out; nothing was counted otherwise.
            Verdict::Superseded { refunded } => (Outcome::Superseded, refunded),
        };
        let action = self.answer(out, msg, job, outcome).await;
        if by_owner && action == Action::Done {
            self.record(|| self.ledger.answered(job_ref)).await;
        }
        Err(action)
    }

    /// Gives back the send mark an admission whose reply was lost may have
    /// set (see `admit`); tries a few times while Redis does not answer.
    async fn release_lost_mark(&self, job_ref: &JobRef<'_>) {
        for pause in [0, 100, 300, 600] {
            tokio::time::sleep(Duration::from_millis(pause)).await;
            match self.ledger.release(job_ref).await {
                Ok(_) => return,
                Err(e) => tracing::debug!(error = %e, "could not give back a possible send mark"),
            }
        }
    }

    /// Deliver: renders, takes an SMTP connection if the admission did not
    /// come with one, and sends.
    async fn deliver(&self, job: &Job, job_ref: &JobRef<'_>, slot: Option<Slot>) -> Delivery {
        let mail = match self.compose(job) {
            Ok(mail) => mail,
            Err(e) => return Delivery::Unbuildable(e),
        };
        let slot = match slot {
            // Admitted as sending: the transaction begins now.
            Some(slot) => slot,
            None => match self.claim_slot(job, job_ref).await {
                Ok(slot) => slot,
                Err(delivery) => return delivery,
            },
        };
        // The last moment to hand it back: past here the transaction begins.
        if self.stopping.is_set() {
            return self.stopped(job_ref).await;
        }
        let started = std::time::Instant::now();
        let sent = (self.mailer.send(slot, mail))
            .instrument(tracing::info_span!("smtp send", otel.kind = "client"))
            .await;
        telemetry::smtp_send(
            match &sent {
                Ok(()) => "ok",
                Err(MailError::Permanent(_) | MailError::Address(_)) => "permanent",
                Err(MailError::Unknown(_)) => "unknown",
                Err(_) => "transient",
            },
            started.elapsed(),
        );
        match sent {
            Ok(()) => Delivery::Sent,
            // A relay's reply may quote the mail, code and all.
            Err(e) => Delivery::Failed(e.hiding(&job.code)),
        }
    }

    /// Renders and composes the job's mail.
    fn compose(&self, job: &Job) -> Result<lettre::Message, String> {
        let _render = tracing::info_span!("render").entered();
        let r = self
            .templates
            .render(job, jiff::Timestamp::now())
            .map_err(|e| e.to_string())?;
        self.mailer
            .compose(&Outgoing {
                to: &job.email,
                subject: &r.subject,
                text: &r.text,
                html: r.html.as_deref(),
            })
            .map_err(|e| e.to_string())
    }

    /// Waits for a free SMTP connection (no longer than the lease leaves
    /// room for the send), then records that the send begins. If either
    /// fails the lease is given back; if the job expired meanwhile, it is
    /// not sent.
    async fn claim_slot(&self, job: &Job, job_ref: &JobRef<'_>) -> Result<Slot, Delivery> {
        let budget = self
            .settings
            .limits
            .send_lease
            .saturating_sub(self.settings.smtp.timeout + Duration::from_secs(1));
        let reserved = tokio::select! {
            slot = tokio::time::timeout(budget, self.mailer.reserve()) => slot,
            () = self.stopping.wait() => return Err(self.stopped(job_ref).await),
        };
        let Ok(slot) = reserved else {
            self.record(|| self.ledger.release(job_ref)).await;
            return Err(Delivery::NotNow);
        };
        // The wait may have outlasted the code: it is not sent then.
        if job
            .expires_at
            .is_some_and(|at| at <= jiff::Timestamp::now())
        {
            return Err(Delivery::Expired);
        }
        match self.ledger.sending(job_ref, Clock::Server).await {
            Ok(true) => Ok(slot),
            Ok(false) => Err(Delivery::NotNow),
            Err(e) => {
                self.record(|| self.ledger.release(job_ref)).await;
                Err(Delivery::LedgerDown(e))
            }
        }
    }

    /// Gives the job's lease back before its transaction began, the worker
    /// stopping: the next worker resumes the job at once.
    async fn stopped(&self, job_ref: &JobRef<'_>) -> Delivery {
        self.record(|| self.ledger.release(job_ref)).await;
        Delivery::Stopped
    }

    /// Settle: answers the delivery and records it in the ledger.
    async fn settle(
        &self,
        job: &Job,
        job_ref: &JobRef<'_>,
        msg: &Message<'_>,
        out: &impl Outbox,
        delivery: Delivery,
        admitted: Admitted,
    ) -> Action {
        let error = match delivery {
            Delivery::Sent => {
                // Recorded before the result goes out, so a copy of the job
                // seen after a crash is answered `sent` again, never
                // "delivery unknown". Whether the result was confirmed is
                // not recorded (it would cost a round trip per mail): a
                // crash between the confirm and the ack repeats `sent`.
                self.record(|| self.ledger.settle(job_ref, &Ending::Sent, false))
                    .await;
                let sent = Outcome::Sent {
                    decided_at_ms: admitted.at_ms,
                    shadow: admitted.shadow,
                    rooms: admitted.rooms,
                };
                let r = sent.result(job.id.as_str(), Some(job), msg, self.disclose);
                return self.publish(out, &r).await.err().unwrap_or(Action::Done);
            }
            Delivery::Stopped => return Action::HandBack,
            Delivery::NotNow => {
                return Action::Wait {
                    delay: Duration::from_secs(1),
                    why: Waiting::Lease,
                };
            }
            Delivery::Expired => {
                return self
                    .end(
                        job,
                        job_ref,
                        msg,
                        out,
                        Ending::Refund(Refund::Expired),
                        String::new(),
                    )
                    .await;
            }
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
            Delivery::Failed(e @ (MailError::Permanent(_) | MailError::Address(_))) => {
                let e = e.to_string();
                return self
                    .end(job, job_ref, msg, out, Ending::Refund(Refund::Failed), e)
                    .await;
            }
            // Nothing was handed over, and no relay takes mail now:
            // not the job's fault, so it waits without spending an attempt
            // (an `expires_at` still ends it).
            Delivery::Failed(MailError::Relay(e)) => {
                self.record(|| self.ledger.release(job_ref)).await;
                // A relay's refusal may quote the recipient.
                let error = telemetry::mask_emails(&e);
                tracing::info!(%error, "every SMTP relay fails whatever the mail; the job waits without spending an attempt");
                return Action::Wait {
                    delay: self.backoff(msg.attempt),
                    why: Waiting::Relay,
                };
            }
            Delivery::Failed(e) => e.to_string(),
            Delivery::LedgerDown(e) if e.is_outage() => return self.outage(msg, &e),
            Delivery::LedgerDown(e) => ledger_error(&e),
        };
        // A transient failure: nothing was handed over.
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
            Action::Done => Action::DeadLetter { error: gave_up },
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

    /// Publishes the result of `outcome` for `job`.
    async fn answer(
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
    async fn publish(&self, out: &impl Outbox, r: &JobResult) -> Result<(), Action> {
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
                error: format!("its result could not be delivered: {e}"),
            }),
        }
    }

    /// A transient failure before anything was sent: retry later.
    fn retry(&self, msg: &Message<'_>, error: String) -> Action {
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
    fn outage(&self, msg: &Message<'_>, e: &LedgerError) -> Action {
        // A lost or lagging replica shows on a dashboard.
        if matches!(e, LedgerError::Unreplicated(_)) {
            telemetry::send_mark_unreplicated();
        }
        tracing::debug!(error = %e, "Redis unavailable; the job waits without spending an attempt");
        Action::Wait {
            delay: self.backoff(msg.attempt),
            why: Waiting::Redis,
        }
    }

    /// The ledger could not be asked: retry later, or, out of attempts,
    /// answer `failed` and dead-letter the job (nothing can be recorded).
    async fn unavailable(
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
            Action::Done => Action::DeadLetter { error: gave_up },
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

    /// Runs a ledger write after the fact (the mail is out, or the result
    /// is), retried briefly: if it is lost, a later copy of the job is
    /// answered from what the ledger knew before.
    async fn record<Fut>(&self, write: impl FnMut() -> Fut)
    where
        Fut: Future<Output = Result<bool, LedgerError>>,
    {
        let retried = write.retry(
            backon::ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(50))
                .with_max_times(5),
        );
        // Stopping, a write Redis does not answer gets a moment, no more:
        // the job's answer (a `sent` result) must go out before the
        // shutdown deadline (found by review: a deploy during a Redis
        // partition spent the deadline retrying a settle, and the next
        // worker answered a delivered code "delivery unknown").
        let stopping = async {
            self.stopping.wait().await;
            tokio::time::sleep(STOPPING_WRITE).await;
        };
        let done = tokio::select! {
            done = retried => done.map(|_| ()).map_err(|e| e.to_string()),
            () = stopping => Err("Redis did not answer in time while the worker stops".into()),
        };
        if let Err(e) = done {
            tracing::warn!(error = %e, "could not record the job's progress in the ledger");
        }
    }
}

/// The limiter's view of a job.
fn request(job: &Job) -> Request<'_> {
    Request {
        id: &job.id,
        email: &job.email,
        ip: job.ip.as_ref(),
        purpose: Some(&job.purpose),
        session: job.session.as_ref(),
        known_mailbox: job.known_mailbox,
    }
}

/// How a lineage that ended without a mail is answered again.
fn refund_outcome(how: Refund) -> Outcome {
    let again = "this job was answered before with this status; its first result gave the reason";
    match how {
        Refund::Expired => Outcome::Expired,
        Refund::Failed => Outcome::Failed(again.into()),
        Refund::Invalid => Outcome::Invalid(again.into()),
        Refund::Superseded => Outcome::Superseded,
    }
}

/// A timestamp as ms since the epoch (0 before it).
fn ms_since_epoch(t: jiff::Timestamp) -> u64 {
    u64::try_from(t.as_millisecond()).unwrap_or(0)
}

/// Why a job could not go on for now, from the ledger's error on its
/// admission or send mark (other than an outage: [`LedgerError::is_outage`]).
fn ledger_error(e: &LedgerError) -> String {
    format!("rate limiter unavailable: {e}")
}
