//! The SMTP connections kept open between mails to one relay.
//!
//! How many connections exist is bounded by the caller: every send holds one
//! of the mailer's `pool_size` slots, opens a connection only when none is
//! idle, and parks at most the one connection it used. A connection is
//! parked only after the server accepted a mail on it; any other outcome,
//! including the send future being dropped, closes it.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use lettre::Address;
use lettre::address::Envelope;
use tokio::time::Instant;

use super::MailError;
use super::smtp::{self, Connection, Endpoint, Failed};

/// A parked connection idle for longer than this is closed instead of
/// reused: servers drop idle clients after a while (often 60 s–5 min), and
/// an old connection would likely cost a failed MAIL FROM and a retry.
const MAX_IDLE: Duration = Duration::from_secs(60);

/// Idle connections to one relay.
pub(super) struct SmtpPool {
    endpoint: Endpoint,
    /// The envelope sender, offered by checks and probes.
    from: Address,
    /// Parked connections, oldest first.
    idle: Mutex<Vec<Parked>>,
}

struct Parked {
    conn: Connection,
    since: Instant,
}

/// A send or probe that failed: the error for the caller, and whether it
/// says something about the relay rather than the mail (see
/// [`Failed::is_relay_fault`]), so it counts against the relay's circuit.
#[derive(Debug, Clone)]
pub(super) struct Failure {
    /// The error for the caller.
    pub(super) error: MailError,
    /// Whether it counts against the relay's circuit.
    pub(super) relay_fault: bool,
    /// A failure that might be the relay's ([`Failed::suspect`]: a
    /// refusal that could be the relay's, or silence at RCPT), and whether it came
    /// at RCPT (a canary can tell then); the relays judge it on evidence.
    pub(super) suspect: Option<Suspect>,
}

/// A refusal that might be the relay's rather than the mail's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Suspect {
    /// It came at RCPT, before anything of the message was offered.
    pub(super) at_rcpt: bool,
}

/// Poisoning cannot leave these values half-updated (each update is one
/// assignment or push/pop), so a poisoned lock is used as it is.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl SmtpPool {
    /// An empty pool.
    pub(super) fn new(endpoint: Endpoint, from: Address) -> Self {
        Self {
            endpoint,
            from,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Sends one mail within `deadline`, on a parked connection if there is
    /// one, else on a new one, whose session must be set up by `open_by`
    /// (at most `deadline`: a relay that is not the last one to try gets
    /// part of the time, so a silent one leaves time for the next). A
    /// parked connection found dead at MAIL FROM (nothing was accepted yet)
    /// is replaced once by a new connection.
    pub(super) async fn send(
        &self,
        envelope: &Envelope,
        message: &[u8],
        open_by: Instant,
        deadline: Instant,
    ) -> Result<(), Failure> {
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
                let conn = self.open(open_by.min(deadline)).await?;
                smtp::transaction(conn, envelope, message, deadline).await
            }
        };
        match done {
            Ok(conn) => {
                self.park(conn);
                Ok(())
            }
            Err(failed) => Err(self.failed(&failed)),
        }
    }

    /// Opens a new session (connect, greeting, EHLO, NOOP), offers the
    /// sender (MAIL FROM, then RSET: nothing is handed over), then QUIT.
    pub(super) async fn check(&self, deadline: Instant) -> Result<(), Failure> {
        let mut conn = self.open(deadline).await?;
        if let Err(failed) = smtp::noop(&mut conn, deadline).await {
            return Err(self.failed(&failed));
        }
        if let Err(failed) = smtp::sender_taken(&mut conn, &self.from, deadline).await {
            return Err(self.failed(&failed));
        }
        smtp::quit(conn, deadline).await;
        Ok(())
    }

    /// Opens a new session and offers `canary` as a recipient (MAIL FROM,
    /// RCPT TO, then RSET: nothing is handed over), then QUIT: whether the
    /// relay takes an address it should, within `deadline`.
    pub(super) async fn canary(&self, canary: &Address, deadline: Instant) -> Result<(), Failure> {
        let mut conn = self.open(deadline).await?;
        if let Err(failed) = smtp::recipient_taken(&mut conn, &self.from, canary, deadline).await {
            return Err(self.failed(&failed));
        }
        smtp::quit(conn, deadline).await;
        Ok(())
    }

    async fn open(&self, deadline: Instant) -> Result<Connection, Failure> {
        self.endpoint
            .open(deadline)
            .await
            .map_err(|failed| self.failed(&failed))
    }

    fn failed(&self, failed: &Failed) -> Failure {
        Failure {
            error: failed.classify(&self.endpoint),
            relay_fault: failed.is_relay_fault(),
            suspect: failed.suspect().then(|| Suspect {
                at_rcpt: failed.at_rcpt(),
            }),
        }
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

    /// Closes every parked connection (the relay's circuit opened: they
    /// are most likely dead, and would cost the next sends a failed MAIL
    /// FROM each once it closes).
    pub(super) fn clear_idle(&self) {
        lock(&self.idle).clear();
    }

    fn park(&self, conn: Connection) {
        let since = Instant::now();
        lock(&self.idle).push(Parked { conn, since });
    }
}
