//! Deliver: the admitted job's mail is rendered (only now, so a flood of
//! rejections costs no rendering) and sent on the SMTP connection its
//! admission came with. Past the last check of [`Stopping`](super::Stopping)
//! the SMTP transaction begins and always finishes.

use tracing::Instrument as _;

use crate::domain::Job;
use crate::ledger::{JobRef, Ledger};
use crate::mailer::{MailError, Outgoing, Slot};
use crate::telemetry;

use super::Pipeline;

/// What delivering an admitted job came to.
pub(super) enum Delivery {
    /// The SMTP server accepted the mail.
    Sent,
    /// The mail could not be built (its variables break a template).
    Unbuildable(String),
    /// The worker is stopping ([`Stopping`](super::Stopping)) and the transaction had not
    /// begun. The lease was given back.
    Stopped,
    /// The SMTP send failed.
    Failed(MailError),
}

impl<L: Ledger> Pipeline<L> {
    /// Deliver: renders, and sends on `slot`, the SMTP connection the
    /// admission came with.
    pub(super) async fn deliver(&self, job: &Job, job_ref: &JobRef<'_>, slot: Slot) -> Delivery {
        let mail = match self.compose(job) {
            Ok(mail) => mail,
            Err(e) => return Delivery::Unbuildable(e),
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

    /// Gives the job's lease back before its transaction began, the worker
    /// stopping: the next worker resumes the job at once.
    async fn stopped(&self, job_ref: &JobRef<'_>) -> Delivery {
        self.record(|| self.ledger.release(job_ref)).await;
        Delivery::Stopped
    }
}
