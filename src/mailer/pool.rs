//! The SMTP connections kept open between mails, and what the latest
//! session setups said about the relay's health.
//!
//! How many connections exist is bounded by the caller: every send holds one
//! of the mailer's `pool_size` slots, opens a connection only when none is
//! idle, and parks at most the one connection it used. A connection is
//! parked only after the server accepted a mail on it; any other outcome,
//! including the send future being dropped, closes it.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use lettre::address::Envelope;
use tokio::time::Instant;

use super::MailError;
use super::smtp::{self, Connection, Endpoint, Failed};
use crate::telemetry;

/// A parked connection idle for longer than this is closed instead of
/// reused: servers drop idle clients after a while (often 60 s–5 min), and
/// an old connection would likely cost a failed MAIL FROM and a retry.
const MAX_IDLE: Duration = Duration::from_secs(60);

/// Idle connections to one relay, and its health.
pub(super) struct SmtpPool {
    endpoint: Endpoint,
    /// Parked connections, oldest first.
    idle: Mutex<Vec<Parked>>,
    /// `Err(why)` after a relay failure, `Ok` after a successful setup or send.
    health: Mutex<Result<(), String>>,
}

struct Parked {
    conn: Connection,
    since: Instant,
}

/// Poisoning cannot leave these values half-updated (each update is one
/// assignment or push/pop), so a poisoned lock is used as it is.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl SmtpPool {
    /// An empty pool; the relay counts as up until a failure says otherwise.
    pub(super) fn new(endpoint: Endpoint) -> Self {
        telemetry::smtp_relay_up(true);
        Self {
            endpoint,
            idle: Mutex::new(Vec::new()),
            health: Mutex::new(Ok(())),
        }
    }

    /// Sends one mail within `deadline`, on a parked connection if there is
    /// one, else on a new one. A parked connection found dead at MAIL FROM
    /// (nothing was accepted yet) is replaced once by a new connection.
    pub(super) async fn send(
        &self,
        envelope: &Envelope,
        message: &[u8],
        deadline: Instant,
    ) -> Result<(), MailError> {
        let reused = match self.take_idle() {
            Some(conn) => match smtp::transaction(conn, envelope, message, deadline).await {
                Err(failed) if failed.is_stale_connection() => {
                    tracing::debug!(error = ?failed, "a parked SMTP connection was dead; retrying on a new one");
                    None
                }
                done => Some(done),
            },
            None => None,
        };
        let done = match reused {
            Some(done) => done,
            None => {
                let conn = self.open(deadline).await?;
                smtp::transaction(conn, envelope, message, deadline).await
            }
        };
        match done {
            Ok(conn) => {
                self.set_health(Ok(()));
                self.park(conn);
                Ok(())
            }
            Err(failed) => Err(self.failed(&failed)),
        }
    }

    /// Opens a new session (connect, greeting, EHLO, NOOP), then QUIT.
    pub(super) async fn check(&self, deadline: Instant) -> Result<(), MailError> {
        let mut conn = self.open(deadline).await?;
        if let Err(failed) = smtp::noop(&mut conn, deadline).await {
            return Err(self.failed(&failed));
        }
        smtp::quit(conn, deadline).await;
        Ok(())
    }

    /// The relay's health: `Err(why)` if the latest session setup (or a
    /// later relay-level step such as MAIL FROM) failed.
    pub(super) fn health(&self) -> Result<(), String> {
        lock(&self.health).clone()
    }

    async fn open(&self, deadline: Instant) -> Result<Connection, MailError> {
        match self.endpoint.open(deadline).await {
            Ok(conn) => {
                self.set_health(Ok(()));
                Ok(conn)
            }
            Err(failed) => Err(self.failed(&failed)),
        }
    }

    /// Classifies a failure; a relay failure also marks the relay down.
    fn failed(&self, failed: &Failed) -> MailError {
        let error = failed.classify(&self.endpoint);
        if let MailError::Relay(why) = &error {
            self.set_health(Err(why.clone()));
        }
        error
    }

    fn set_health(&self, now: Result<(), String>) {
        let mut health = lock(&self.health);
        if *health == now {
            return;
        }
        match &now {
            Ok(()) => tracing::info!("the SMTP relay works again"),
            Err(why) => {
                tracing::warn!(error = %telemetry::mask_emails(why), "the SMTP relay is failing")
            }
        }
        telemetry::smtp_relay_up(now.is_ok());
        *health = now;
    }

    /// The most recently parked connection, closing those idle too long.
    fn take_idle(&self) -> Option<Connection> {
        let now = Instant::now();
        let mut idle = lock(&self.idle);
        let fresh = idle
            .iter()
            .position(|p| now.duration_since(p.since) < MAX_IDLE)
            .unwrap_or(idle.len());
        // Dropping closes them; they are not worth a QUIT round trip.
        idle.drain(..fresh);
        idle.pop().map(|p| p.conn)
    }

    fn park(&self, conn: Connection) {
        let since = Instant::now();
        lock(&self.idle).push(Parked { conn, since });
    }
}
