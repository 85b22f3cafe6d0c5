//! One mail transaction on an open session, step by step (MAIL FROM,
//! RCPT, DATA, the message and the final dot, pipelined when the server
//! offers it), and the commands of health checks and probes (NOOP, MAIL
//! FROM then RSET).

use std::sync::atomic::{AtomicBool, Ordering};

use lettre::Address;
use lettre::address::Envelope;
use lettre::transport::smtp::commands::{Data, Mail, Noop, Rcpt, Rset};
use lettre::transport::smtp::extension::{Extension, MailBodyParameter, MailParameter};
use lettre::transport::smtp::response::Severity;
use tokio::time::{Instant, timeout_at};

use super::{Connection, Failed, Fault, Phase, discard, step};

/// Runs one mail transaction (MAIL FROM, RCPT for each recipient, DATA,
/// the message) on `conn`, all within `deadline`. Hands the connection back
/// only after the server accepted the mail; on failure it is closed (with a
/// QUIT when the session is at a command boundary) and never returned.
pub(in crate::mailer) async fn transaction(
    mut conn: Connection,
    envelope: &Envelope,
    message: &[u8],
    deadline: Instant,
) -> Result<Connection, Failed> {
    let pipelined = conn.server_info().supports_feature(Extension::Pipelining);
    match transact(&mut conn, envelope, message, pipelined, deadline).await {
        Ok(()) => Ok(conn),
        // A pipelined envelope that failed may have replies still unread,
        // or (from a server that accepts DATA without a recipient) be in
        // the middle of a message: the session is not at a command boundary,
        // so it is dropped without a QUIT. No final dot was sent, so the
        // server has no mail.
        Err(failed) if pipelined && failed.phase < Phase::Message => {
            drop(conn);
            Err(failed)
        }
        Err(failed) => {
            discard(conn, &failed, deadline).await;
            Err(failed)
        }
    }
}

async fn transact(
    conn: &mut Connection,
    envelope: &Envelope,
    message: &[u8],
    pipelined: bool,
    deadline: Instant,
) -> Result<(), Failed> {
    let params = mail_parameters(conn, envelope, message)?;
    let from = Mail::new(envelope.from().cloned(), params);
    let rcpts = envelope.to().iter().map(|to| Rcpt::new(to.clone(), vec![]));
    if pipelined {
        pipeline_envelope(conn, from, rcpts, deadline).await?;
    } else {
        step(deadline, Phase::MailFrom, conn.command(from)).await?;
        for rcpt in rcpts {
            step(deadline, Phase::Rcpt, conn.command(rcpt)).await?;
        }
        step(deadline, Phase::Data, conn.command(Data)).await?;
    }
    write_message(conn, message, deadline).await
}

/// MAIL FROM, every RCPT and DATA in one write, as RFC 2920 allows a server
/// that offers PIPELINING, then their replies, in order: one round trip
/// instead of three. Each reply is judged by the phase of the command it
/// answers; the first failure is the transaction's, and the replies after
/// it are left unread (the connection is dropped).
async fn pipeline_envelope(
    conn: &mut Connection,
    from: Mail,
    rcpts: impl Iterator<Item = Rcpt>,
    deadline: Instant,
) -> Result<(), Failed> {
    use std::fmt::Write as _;
    let mut batch = from.to_string();
    let mut phases = vec![Phase::MailFrom];
    for rcpt in rcpts {
        // Writing to a String cannot fail.
        let _ = write!(batch, "{rcpt}");
        phases.push(Phase::Rcpt);
    }
    let _ = write!(batch, "{Data}");
    phases.push(Phase::Data);
    // `command` writes the batch and reads the first reply (MAIL FROM's).
    step(deadline, Phase::MailFrom, conn.command(batch)).await?;
    for &phase in &phases[1..] {
        step(deadline, phase, conn.read_response()).await?;
    }
    Ok(())
}

/// The MAIL FROM parameters the mail needs (as lettre's own `send` does:
/// SMTPUTF8 for non-ASCII addresses, 8BITMIME for a non-ASCII message), or
/// why this server cannot take it.
fn mail_parameters(
    conn: &Connection,
    envelope: &Envelope,
    message: &[u8],
) -> Result<Vec<MailParameter>, Failed> {
    let info = conn.server_info();
    let ascii = |a: &Address| AsRef::<str>::as_ref(a).is_ascii();
    let sender_ascii = envelope.from().is_none_or(ascii);
    let recipients_ascii = envelope.to().iter().all(ascii);
    let mut params = Vec::new();
    if !(sender_ascii && recipients_ascii) {
        if !info.supports_feature(Extension::SmtpUtfEight) {
            // The sender is the same for every mail: a relay problem. A
            // recipient is this mail's own problem.
            let (phase, whose) = if sender_ascii {
                (Phase::Rcpt, "recipient")
            } else {
                (Phase::MailFrom, "sender")
            };
            let why =
                format!("the {whose} address is not ASCII and the server does not offer SMTPUTF8");
            return Err(Failed::unsupported(phase, why));
        }
        params.push(MailParameter::SmtpUtfEight);
    }
    if !message.is_ascii() {
        if !info.supports_feature(Extension::EightBitMime) {
            let why = "the message is not ASCII and the server does not offer 8BITMIME";
            return Err(Failed::unsupported(Phase::Data, why.into()));
        }
        params.push(MailParameter::Body(MailBodyParameter::EightBitMime));
    }
    Ok(params)
}

/// Writes the message and the final dot, and reads the reply. Whether a
/// failure came before or after the final dot decides between "not
/// delivered" and "delivery unknown", so the dot is tracked exactly: lettre
/// writes it right after the message iterator runs dry, in the same poll.
async fn write_message(
    conn: &mut Connection,
    message: &[u8],
    deadline: Instant,
) -> Result<(), Failed> {
    let dot = AtomicBool::new(false);
    let parts = DotTracker {
        message: Some(message),
        dot: &dot,
    };
    let sent = timeout_at(deadline, conn.message_iter(parts)).await;
    let phase = if dot.load(Ordering::Relaxed) {
        Phase::EndOfData
    } else {
        Phase::Message
    };
    let fault = match sent {
        Ok(Ok(reply)) if reply.code().severity == Severity::PositiveCompletion => return Ok(()),
        Ok(Ok(reply)) => Fault::Broken(format!("unexpected reply {}", reply.code())),
        Ok(Err(e)) => Fault::from(&e),
        Err(_) => Fault::Deadline,
    };
    Err(Failed { phase, fault })
}

/// Yields the message once; when asked for more, records that the message
/// is written and the final dot is about to be.
struct DotTracker<'a> {
    message: Option<&'a [u8]>,
    dot: &'a AtomicBool,
}

impl<'a> Iterator for DotTracker<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let part = self.message.take();
        if part.is_none() {
            self.dot.store(true, Ordering::Relaxed);
        }
        part
    }
}

/// NOOP, for health checks.
pub(in crate::mailer) async fn noop(
    conn: &mut Connection,
    deadline: Instant,
) -> Result<(), Failed> {
    step(deadline, Phase::Noop, conn.command(Noop))
        .await
        .map(drop)
}

/// MAIL FROM `from` and RCPT TO `to`, then RSET, for a relay's canary: a
/// relay that refuses an address it should take (the operator's own)
/// refuses every recipient. Nothing is handed over (no DATA). Whether the
/// relay takes `to`; a reply refusing RSET still counts as taken.
pub(in crate::mailer) async fn recipient_taken(
    conn: &mut Connection,
    from: &Address,
    to: &Address,
    deadline: Instant,
) -> Result<(), Failed> {
    let mail = Mail::new(Some(from.clone()), Vec::new());
    step(deadline, Phase::MailFrom, conn.command(mail)).await?;
    step(
        deadline,
        Phase::Rcpt,
        conn.command(Rcpt::new(to.clone(), vec![])),
    )
    .await?;
    match step(deadline, Phase::Noop, conn.command(Rset)).await {
        Err(f) if matches!(f.fault, Fault::Reply(code, _) if code != 421) => Ok(()),
        done => done.map(drop),
    }
}

/// MAIL FROM `from` (with SMTPUTF8 for a non-ASCII sender, as a send
/// has, and refused as a send is where the server does not offer it),
/// then RSET, for probes: a relay that sets sessions up but refuses every
/// sender (out of quota, suspended) fails its probe, so its circuit does
/// not close only to fail sends. The transaction is reset at once:
/// nothing is handed over. A reply refusing RSET still
/// leaves a relay that takes mail; a 421, a broken session or the deadline
/// there fail the probe, as they would fail a send.
pub(in crate::mailer) async fn sender_taken(
    conn: &mut Connection,
    from: &Address,
    deadline: Instant,
) -> Result<(), Failed> {
    let mut params = Vec::new();
    if !AsRef::<str>::as_ref(from).is_ascii() {
        if !conn.server_info().supports_feature(Extension::SmtpUtfEight) {
            let why = "the sender address is not ASCII and the server does not offer SMTPUTF8";
            return Err(Failed::unsupported(Phase::MailFrom, why.to_owned()));
        }
        params.push(MailParameter::SmtpUtfEight);
    }
    let mail = Mail::new(Some(from.clone()), params);
    step(deadline, Phase::MailFrom, conn.command(mail)).await?;
    match step(deadline, Phase::Noop, conn.command(Rset)).await {
        Err(f) if matches!(f.fault, Fault::Reply(code, _) if code != 421) => Ok(()),
        done => done.map(drop),
    }
}
