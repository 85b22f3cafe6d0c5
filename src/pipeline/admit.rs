//! Admit: the ledger looks the job's id up and, if it has no live
//! admission, asks the limiter, atomically. A job is admitted only with a
//! free SMTP connection in hand, since its admission is its send mark: its
//! lease runs from then. Where none is free, the ledger's read-only
//! [`Ledger::peek`] answers at once what needs no mail (a rejection, a
//! suppression, a copy of a job), and only a job it cannot answer waits
//! for a connection. The job goes on to delivery only when this lineage
//! now owns its send ([`Admitted`]); every other verdict is answered (or
//! waited on) here, and needs no mail.

use std::time::Duration;

use tracing::Instrument as _;

use crate::domain::Job;
use crate::ledger::{Admission, Entry, JobRef, Ledger, LedgerError, Verdict};
use crate::limiter::{Clock, Request, Rooms, RuleRef};
use crate::mailer::Slot;

use super::outcome::{DELIVERY_UNKNOWN, Outcome, refund_outcome};
use super::retry::ledger_error;
use super::{Action, Message, Outbox, Pipeline, Waiting};

/// What the admit stage hands on: when the job was admitted (its first
/// admission, for a resumed one), the shadow rule that would have
/// rejected this admission, if any, and what it left of each scope's
/// quota (nothing for a resumed one).
pub(super) struct Admitted {
    /// When the job was admitted: every `sent` of a job carries it.
    pub(super) at_ms: u64,
    /// The shadow rule that would have rejected this admission.
    pub(super) shadow: Option<RuleRef>,
    /// What this admission left of each scope's quota.
    pub(super) rooms: Rooms,
}

/// What a verdict comes to for this message.
enum Ruling {
    /// This lineage owns the job's send now: deliver it.
    Deliver(Admitted),
    /// Answer `outcome`; if `by_owner`, this lineage owns the job's record,
    /// and records that its answer went out.
    Answer {
        /// The answer.
        outcome: Outcome,
        /// Whether to record in the ledger that it was answered.
        by_owner: bool,
    },
    /// Neither: do this with the message.
    Act(Action),
}

impl<L: Ledger> Pipeline<L> {
    /// Admit: the decision time and the SMTP connection to send on if this
    /// lineage now owns the job's send, else what to do with the message
    /// (answered here if it needs no mail).
    pub(super) async fn admit(
        &self,
        job: &Job,
        job_ref: &JobRef<'_>,
        msg: &Message<'_>,
        out: &impl Outbox,
        expires_ms: Option<u64>,
    ) -> Result<(Admitted, Slot), Action> {
        let entry = Entry {
            job: *job_ref,
            expires_at_ms: expires_ms,
            made_at_ms: job.created_at.map(ms_since_epoch).or(msg.published_at_ms),
        };
        let slot = match self.mailer.try_reserve() {
            Some(slot) => slot,
            None => self.connection(job, &entry, msg, out).await?,
        };
        let admission = match (self.ledger.admit(&entry, Clock::Server))
            .instrument(tracing::info_span!(
                "limiter decision",
                otel.kind = "client"
            ))
            .await
        {
            Ok(a) => a,
            Err(e) => {
                // Free for another job while the mark is given back.
                drop(slot);
                return Err(self.not_admitted(job, job_ref, msg, out, &e).await);
            }
        };
        let admitted = self.ruled(job, job_ref, msg, out, admission).await?;
        Ok((admitted, slot))
    }

    /// No SMTP connection is free for `entry`'s job: what needs no mail is
    /// answered at once, from the ledger's read-only look
    /// ([`Ledger::peek`]); anything else waits for a connection, so that
    /// the job is admitted with one in hand. It waits no longer than
    /// `limits.send_lease` (then in RabbitMQ, spending no attempt: the
    /// relays take mail too slowly, or not at all), and not once the
    /// worker stops (the next worker takes the job as it came: nothing of
    /// it was written).
    async fn connection(
        &self,
        job: &Job,
        entry: &Entry<'_>,
        msg: &Message<'_>,
        out: &impl Outbox,
    ) -> Result<Slot, Action> {
        let peeked = (self.ledger.peek(entry, Clock::Server))
            .instrument(tracing::info_span!(
                "limiter decision",
                otel.kind = "client"
            ))
            .await;
        match peeked {
            // (A look never admits; were it to, the job waits for a
            // connection and asks `admit`.)
            Ok(Some(answer)) if !delivers(&answer.verdict) => {
                self.ruled(job, &entry.job, msg, out, answer).await?;
            }
            Ok(_) => {}
            Err(e) => return Err(self.unadmitted(job, msg, out, &e).await),
        }
        let budget = self.settings.limits.send_lease;
        tokio::select! {
            slot = tokio::time::timeout(budget, self.mailer.reserve()) => slot.map_err(|_| {
                Action::Wait {
                    delay: Duration::from_secs(1),
                    why: Waiting::Connection,
                }
            }),
            () = self.stopping.wait() => Err(Action::HandBack),
        }
    }

    /// What `admission`, the ledger's answer to `job` (asked by
    /// `job_ref`), comes to: the admission this lineage now owns, or
    /// what to do with the message (answered here if it needs no mail).
    async fn ruled(
        &self,
        job: &Job,
        job_ref: &JobRef<'_>,
        msg: &Message<'_>,
        out: &impl Outbox,
        admission: Admission,
    ) -> Result<Admitted, Action> {
        record(
            &admission.verdict,
            admission.shadow.as_ref(),
            admission.by_override,
        );
        if answered_before(&admission.verdict) {
            tracing::info!("answered before (its ack was lost); acknowledging");
            return Err(Action::Done);
        }
        let (outcome, by_owner) = match rule(job, msg, admission) {
            Ruling::Deliver(admitted) => return Ok(admitted),
            Ruling::Act(action) => return Err(action),
            Ruling::Answer { outcome, by_owner } => (outcome, by_owner),
        };
        let action = self.answer(out, msg, job, outcome).await;
        if by_owner && action == Action::Done {
            self.record(|| self.ledger.answered(job_ref)).await;
        }
        Err(action)
    }

    /// The admission failed with `e`: what to do with the message.
    ///
    /// The admission may have run and its reply been lost (a dropped
    /// connection, a failover): if it admitted the job, which marks it
    /// sending, the mark is given back, so the retry resumes the job
    /// instead of finding its delivery unknown. Safe: no SMTP transaction
    /// began, and the release is fenced to this handling of the message
    /// (`JobRef::holder`), so it gives back only a mark this admission set.
    async fn not_admitted(
        &self,
        job: &Job,
        job_ref: &JobRef<'_>,
        msg: &Message<'_>,
        out: &impl Outbox,
        e: &LedgerError,
    ) -> Action {
        self.release_lost_mark(job_ref).await;
        self.unadmitted(job, msg, out, e).await
    }

    /// The ledger could not answer (`e`), and nothing of the job is held:
    /// it waits out an outage without spending an attempt, or is retried.
    async fn unadmitted(
        &self,
        job: &Job,
        msg: &Message<'_>,
        out: &impl Outbox,
        e: &LedgerError,
    ) -> Action {
        if e.is_outage() {
            return self.outage(msg, e);
        }
        self.unavailable(job, msg, out, ledger_error(e)).await
    }

    /// Gives back the send mark an admission whose reply was lost may have
    /// set (see `not_admitted`); tries a few times over a second while
    /// Redis does not answer (a cluster client reconnects before it
    /// answers).
    async fn release_lost_mark(&self, job_ref: &JobRef<'_>) {
        for pause in [0, 100, 300, 600] {
            tokio::time::sleep(Duration::from_millis(pause)).await;
            match self.ledger.release(job_ref).await {
                Ok(_) => return,
                Err(e) => {
                    tracing::debug!(error = %crate::report::one_line(&e), "could not give back a possible send mark");
                }
            }
        }
    }
}

/// Whether `verdict` gives this lineage the job's send.
fn delivers(verdict: &Verdict) -> bool {
    matches!(verdict, Verdict::Admitted | Verdict::Resumed { .. })
}

/// Whether this lineage answered the job before (its ack was lost): then
/// the message is acknowledged and nothing else happens.
fn answered_before(verdict: &Verdict) -> bool {
    match *verdict {
        Verdict::Sent {
            by_owner, answered, ..
        }
        | Verdict::Unknown { by_owner, answered } => by_owner && answered,
        Verdict::Finished { answered, .. } => answered,
        _ => false,
    }
}

/// What an admission's verdict comes to for `msg`, a job not answered
/// before.
fn rule(job: &Job, msg: &Message<'_>, admission: Admission) -> Ruling {
    let Admission {
        decided_at_ms,
        verdict,
        shadow,
        rooms,
        by_override: _,
    } = admission;
    let answer = |outcome, by_owner| Ruling::Answer { outcome, by_owner };
    match verdict {
        Verdict::Admitted => Ruling::Deliver(Admitted {
            at_ms: decided_at_ms,
            shadow,
            rooms,
        }),
        // Every `sent` of a job carries the time it was admitted.
        Verdict::Resumed { admitted_at_ms } => Ruling::Deliver(Admitted {
            at_ms: admitted_at_ms,
            shadow: None,
            rooms: Rooms::default(),
        }),
        Verdict::Rejected {
            retry_after_ms,
            rule,
        } => answer(
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
        Verdict::Expired => answer(Outcome::Expired, msg.continuation),
        Verdict::Busy { lease_left_ms } => Ruling::Act(Action::Wait {
            delay: Duration::from_millis(lease_left_ms.saturating_add(100)),
            why: Waiting::Lease,
        }),
        Verdict::Conflict => answer(
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
            answer(outcome, by_owner)
        }
        Verdict::Unknown { by_owner, .. } => {
            answer(Outcome::Failed(DELIVERY_UNKNOWN.into()), by_owner)
        }
        Verdict::Finished { how, .. } => answer(refund_outcome(how), true),
        // Refunded into a record this lineage owns, which records that
        // its answer went out; nothing was counted otherwise.
        Verdict::Superseded { refunded } => answer(Outcome::Superseded, refunded),
        // Nothing was counted or recorded.
        Verdict::Suppressed => answer(Outcome::Suppressed, false),
    }
}

/// The limiter's view of a job.
pub(super) fn request(job: &Job) -> Request<'_> {
    Request {
        id: &job.id,
        email: &job.email,
        ip: job.ip.as_ref(),
        purpose: Some(&job.purpose),
        session: job.session.as_ref(),
        known_mailbox: job.known_mailbox,
    }
}

/// A timestamp as ms since the epoch (0 before it).
fn ms_since_epoch(t: jiff::Timestamp) -> u64 {
    u64::try_from(t.as_millisecond()).unwrap_or(0)
}

/// Counts the ledger's answer to an admission in the limiter's metrics
/// (`mailgate_limiter_*`; [`crate::telemetry::register`] lists them):
/// `verdict` is what it found or did, with the binding rule of a
/// rejection; `shadow` the shadow rule that would have rejected an
/// admitted job; `by_override` the kind of the override that changed how
/// it was judged.
fn record(verdict: &Verdict, shadow: Option<&RuleRef>, by_override: Option<&'static str>) {
    if let (Some(kind), Verdict::Admitted | Verdict::Rejected { .. }) = (by_override, verdict) {
        metrics::counter!("mailgate_limiter_override_decisions_total", "kind" => kind).increment(1);
    }
    if let Some(rule) = shadow {
        metrics::counter!(
            "mailgate_limiter_shadow_rejections_total",
            "scope" => rule.scope.as_str(),
            "window_ms" => rule.window_ms.to_string(),
            "max" => rule.max.to_string(),
        )
        .increment(1);
    }
    let v = match verdict {
        Verdict::Rejected { rule, .. } => {
            // A deny's "window" is the time it has left, different on every
            // rejection: labelled so, each would be a series of its own.
            // Every deny is one series per scope.
            let window = match rule.max {
                0 => "deny".to_owned(),
                _ => rule.window_ms.to_string(),
            };
            metrics::counter!(
                "mailgate_limiter_decisions_total",
                "verdict" => "rejected",
                "scope" => rule.scope.as_str(),
                "window_ms" => window,
                "max" => rule.max.to_string(),
            )
            .increment(1);
            return;
        }
        Verdict::Admitted => "admitted",
        Verdict::Resumed { .. } => "resumed",
        Verdict::Expired => "expired",
        Verdict::Busy { .. } => "busy",
        Verdict::Sent { .. } => "sent",
        Verdict::Unknown { .. } => "unknown",
        Verdict::Finished { .. } => "finished",
        Verdict::Conflict => "conflict",
        Verdict::Superseded { .. } => "superseded",
        Verdict::Suppressed => "suppressed",
    };
    metrics::counter!("mailgate_limiter_decisions_total", "verdict" => v).increment(1);
}
