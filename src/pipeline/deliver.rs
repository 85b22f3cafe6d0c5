//! Deliver: the admitted job's mail is rendered (only now, so a flood of
//! rejections costs no rendering), an SMTP connection is taken if the
//! admission did not come with one, and the mail is sent. Past the last
//! check of [`Stopping`](super::Stopping) the SMTP transaction begins and
//! always finishes.

use std::time::Duration;

use tracing::Instrument as _;

use crate::domain::Job;
use crate::ledger::{JobRef, Ledger, LedgerError};
use crate::limiter::Clock;
use crate::mailer::{MailError, Outgoing, Slot};
use crate::telemetry;

use super::Pipeline;

/// What delivering an admitted job came to.
pub(super) enum Delivery {
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
    /// The worker is stopping ([`Stopping`](super::Stopping)) and the transaction had not
    /// begun. The lease was given back.
    Stopped,
    /// The SMTP send failed.
    Failed(MailError),
}

impl<L: Ledger> Pipeline<L> {
    /// Deliver: renders, takes an SMTP connection if the admission did not
    /// come with one, and sends.
    pub(super) async fn deliver(
        &self,
        job: &Job,
        job_ref: &JobRef<'_>,
        slot: Option<Slot>,
        expires_ms: Option<u64>,
    ) -> Delivery {
        let mail = match self.compose(job) {
            Ok(mail) => mail,
            Err(e) => return Delivery::Unbuildable(e),
        };
        let slot = match slot {
            // Admitted as sending: the transaction begins now.
            Some(slot) => slot,
            None => match self.claim_slot(job_ref, expires_ms).await {
                Ok(slot) => slot,
                Err(delivery) => return delivery,
            },
        };
        // The last moment to hand it back: past here the transaction begins.
        if self.stopping.is_set() {
            return self.stopped(job_ref).await;
        }
        let started = std::time::Instant::now();
        let sent = (self.mailer.send(slot, mail, &job.id))
            .instrument(tracing::info_span!("smtp send", otel.kind = "client"))
            .await;
        telemetry::smtp_send(
            match &sent {
                Ok(()) => "ok",
                Err(
                    MailError::Permanent(_)
                    | MailError::NoMailbox { .. }
                    | MailError::Untrusted { .. }
                    | MailError::Address(_),
                ) => "permanent",
                Err(MailError::Unknown(_)) => "unknown",
                Err(_) => "transient",
            },
            started.elapsed(),
        );
        match sent {
            Ok(()) => Delivery::Sent,
            // A relay's reply may quote the mail, code, links and all.
            Err(e) => Delivery::Failed(e.hiding(|t| job.hide_in(t))),
        }
    }

    /// Renders and composes the job's mail.
    fn compose(&self, job: &Job) -> Result<lettre::Message, String> {
        let _render = tracing::info_span!("render").entered();
        let r = self
            .templates
            .render(job, jiff::Timestamp::now())
            .map_err(|e| crate::report::one_line(&e))?;
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
    async fn claim_slot(
        &self,
        job_ref: &JobRef<'_>,
        expires_ms: Option<u64>,
    ) -> Result<Slot, Delivery> {
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
        if expires_ms.is_some_and(|at| at <= crate::domain::now_ms()) {
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
}
