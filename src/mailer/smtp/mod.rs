//! One SMTP connection's life, on lettre's client API: opening a session
//! (connect, TLS, greeting, EHLO, STARTTLS, AUTH) and running one mail
//! transaction on it step by step, so that every failure is known by the
//! phase it happened in and classified by that phase (see [`Failed::classify`]).
//!
//! With a server that offers PIPELINING, the envelope (MAIL FROM, RCPT,
//! DATA) goes out in one write and its replies are read in order.
//!
//! A transaction takes its connection by value and hands it back only when
//! the server accepted the mail (a 2xx after the final dot). On any error,
//! deadline or cancellation the connection is dropped, never reused: a late
//! reply can then never be read as the answer to another mail's command.
//!
//! Opening a session is `session.rs`, a transaction and the probe
//! commands `transaction.rs`, and what a failure means (for the caller and
//! for the relay's circuit) `failure.rs`.

mod failure;
mod session;
mod transaction;

use std::future::Future;

use lettre::transport::smtp::client::AsyncSmtpConnection;
use tokio::time::{Instant, timeout_at};

pub(super) use failure::Failed;
use failure::{Fault, Phase};
pub(super) use session::Endpoint;
#[cfg(test)]
pub(super) use session::tests::endpoint as test_endpoint;
pub(super) use transaction::{noop, recipient_taken, sender_taken, transaction};

/// An open SMTP session.
pub(super) type Connection = AsyncSmtpConnection;

/// QUIT within `deadline`, ignoring the outcome: the connection is done.
pub(super) async fn quit(mut conn: Connection, deadline: Instant) {
    let _ = timeout_at(deadline, conn.quit()).await;
}

/// Closes a connection after a failure. After a reply (or before any
/// command was sent) the session is at a command boundary and gets a QUIT;
/// after an I/O error or the deadline it is in an unknown state and is just
/// dropped, which closes the socket.
async fn discard(conn: Connection, failed: &Failed, deadline: Instant) {
    match failed.fault {
        Fault::Reply(..) | Fault::Unsupported(_) => quit(conn, deadline).await,
        Fault::Broken(_) | Fault::Deadline => drop(conn),
    }
}

/// One step of the session, within the deadline; a failure is tagged with
/// the step's phase.
async fn step<T>(
    deadline: Instant,
    phase: Phase,
    fut: impl Future<Output = Result<T, lettre::transport::smtp::Error>>,
) -> Result<T, Failed> {
    match timeout_at(deadline, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(Failed {
            phase,
            fault: Fault::from(&e),
        }),
        Err(_) => Err(Failed {
            phase,
            fault: Fault::Deadline,
        }),
    }
}
