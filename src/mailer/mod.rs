//! Building and sending mail over SMTP (pooled connections, TLS via
//! rustls), or into a folder of `.eml` files for development.
//!
//! Mail goes to one relay (`smtp.url`) or to several in order of
//! preference (`[[smtp.relays]]`), each with its own connections and a
//! circuit breaker (`relays/`): a send fails over to the next relay only
//! while nothing of the mail was handed over.
//!
//! Addresses are parsed by lettre and headers are written by lettre, never
//! spliced as text, so no field can add a header. Every send has one deadline
//! for the whole SMTP transaction. Failures are classified by the SMTP phase
//! they happened in ([`MailError`]); a connection is reused only after a
//! fully successful transaction (`pool.rs`; `smtp/` runs a session and
//! classifies its failures).

mod pool;
mod relays;
mod smtp;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use lettre::message::header::ContentType;
use lettre::message::{Mailbox, MultiPart};
use lettre::{Address, AsyncFileTransport, AsyncTransport, Message, Tokio1Executor};
use tokio::time::Instant;

use crate::domain::{EmailAddress, JobId};
use crate::settings::{Destination, SmtpSettings};

/// Why a mail could not be built or sent. What the caller should do
/// depends on the variant: [`MailError::Relay`] and [`MailError::Transient`]
/// are worth retrying, [`MailError::Permanent`] is not, and
/// [`MailError::Unknown`] must never be sent again.
#[derive(Debug, Clone, thiserror::Error)]
pub enum MailError {
    /// `smtp.url` or `smtp.from` is unusable (a start-up error).
    #[error("smtp settings: {0}")]
    Config(String),
    /// The recipient cannot be written as a mail address (the job is invalid).
    #[error("the address cannot be mailed: {0}")]
    Address(String),
    /// The relay or the session is failing, whatever the mail: the
    /// connection, TLS, STARTTLS, AUTH, the greeting or EHLO (incl. 421),
    /// MAIL FROM refused, or the deadline or an I/O error before RCPT; or
    /// no relay's circuit is closed. Nothing of the mail was handed over.
    /// Retry later; [`Mailer::relay_health`] reports it too.
    #[error("{0}")]
    Relay(String),
    /// This mail was not delivered but may be later: a 4xx to RCPT, DATA or
    /// the message, or an I/O error or the deadline after MAIL FROM was
    /// accepted and before the final dot was written.
    #[error("{0}")]
    Transient(String),
    /// This mail will never be accepted: a 5xx to RCPT, DATA or the message,
    /// or something this server cannot take for this mail (e.g. a non-ASCII
    /// address to a server without SMTPUTF8).
    #[error("{0}")]
    Permanent(String),
    /// The recipient's mailbox does not exist: a 5xx to RCPT, DATA or the
    /// message whose enhanced status code is `5.1.1` (bad destination
    /// mailbox). Permanent, and grounds to suppress the address as it was
    /// sent (`limits.suppress_bounces_for`) — unless the relay has said so
    /// of too many mailboxes lately ([`MailError::Untrusted`]), or every
    /// worker's bounces of its domain say so (the ledger's count, unless
    /// `vouched`).
    #[error("{text}")]
    NoMailbox {
        /// What the relay said.
        text: String,
        /// The relay's name (for `mailgate_bounces_doubted_total`).
        relay: String,
        /// The relay took a mail for the recipient's domain lately: the
        /// domain takes mail, whatever other workers saw of it.
        vouched: bool,
    },
    /// A 5.1.1, as [`MailError::NoMailbox`], from a relay that has said so
    /// of more than a few mailboxes in a row of this recipient's domain, or
    /// of any domain, without taking a mail for it in between (a broken
    /// recipient table): permanent, but no grounds to suppress anyone.
    #[error("{text}")]
    Untrusted {
        /// What the relay said, and why it is not taken at its word.
        text: String,
        /// The addresses (as sent) whose 5.1.1s before this one made the
        /// run, now that it is too long: their suppressions are as
        /// groundless, and are lifted. Empty but for the refusal that
        /// ended the trust.
        lift: Vec<String>,
    },
    /// The final dot was written and no reply came (the deadline, EOF, an
    /// I/O error): the server may have the mail. Never send it again.
    #[error("{0}")]
    Unknown(String),
}

impl MailError {
    /// The same error with its text passed through `hide` (a job's code
    /// and variables hidden: `domain::Job::hide_in`): a relay that rejects
    /// a mail may quote it back, and the text reaches logs and results.
    pub fn hiding(self, hide: impl Fn(&str) -> String) -> Self {
        use MailError::*;
        match self {
            Config(t) => Config(hide(&t)),
            Address(t) => Address(hide(&t)),
            Relay(t) => Relay(hide(&t)),
            Transient(t) => Transient(hide(&t)),
            Permanent(t) => Permanent(hide(&t)),
            NoMailbox {
                text,
                relay,
                vouched,
            } => NoMailbox {
                text: hide(&text),
                relay,
                vouched,
            },
            Untrusted { text, lift } => Untrusted {
                text: hide(&text),
                lift,
            },
            Unknown(t) => Unknown(hide(&t)),
        }
    }
}

/// One mail's parts, ready to be composed.
#[derive(Debug, Clone, Copy)]
pub struct Outgoing<'a> {
    /// The recipient.
    pub to: &'a EmailAddress,
    /// One line.
    pub subject: &'a str,
    /// The plain-text part.
    pub text: &'a str,
    /// The HTML part; with it the mail is multipart/alternative.
    pub html: Option<&'a str>,
}

#[derive(Clone)]
enum Transport {
    Smtp(Arc<relays::Relays>),
    File(AsyncFileTransport<Tokio1Executor>, PathBuf),
}

/// Composes and sends mail. Cheap to clone; clones share the connections
/// and the slots.
#[derive(Clone)]
pub struct Mailer {
    transport: Transport,
    from: Mailbox,
    deadline: Duration,
    /// One permit per connection (`pool_size`): a send holds one for its
    /// whole duration, so at most `pool_size` connections are in use or
    /// idle, and holding one means a send can start at once.
    slots: Arc<tokio::sync::Semaphore>,
    /// Makes each mail's `Message-ID`.
    ids: Arc<MessageIds>,
}

/// Names the type only: it holds connections and relays' credentials.
impl std::fmt::Debug for Mailer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mailer").finish_non_exhaustive()
    }
}

/// `Message-ID`s without a system call per mail (lettre's own asks the
/// host name and the OS random source for each one): a random 64-bit
/// prefix drawn once per process, a counter, and the sender's domain, so
/// ids are unique across workers and restarts.
struct MessageIds {
    prefix: u64,
    next: std::sync::atomic::AtomicU64,
    domain: String,
}

impl MessageIds {
    fn new(from: &Mailbox) -> Self {
        Self {
            prefix: uuid::Uuid::new_v4().as_u64_pair().0,
            next: std::sync::atomic::AtomicU64::new(0),
            domain: from.email.domain().to_owned(),
        }
    }

    fn next(&self) -> String {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("<{:016x}.{n}@{}>", self.prefix, self.domain)
    }
}

/// The right to send one mail now; see [`Mailer::reserve`]. Dropping it
/// gives the slot back.
#[derive(Debug)]
pub struct Slot {
    /// Held, never read: the slot is given back when it drops.
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Mailer {
    /// Builds the transport from settings. Does not connect: connections are
    /// opened on demand and at most `pool_size` exist at once.
    pub fn new(settings: &SmtpSettings) -> Result<Self, MailError> {
        let from: Mailbox = settings.from.parse().map_err(|e| {
            MailError::Config(format!(
                "smtp.from {:?}: {e} (expected a mailbox, e.g. \"Acme <no-reply@acme.example>\" \
                     or \"no-reply@acme.example\")",
                settings.from
            ))
        })?;
        let relays = settings
            .relay_list()
            .map_err(|e| MailError::Config(crate::report::one_line(&e)))?;
        let canary = (settings.canary.as_deref())
            .map(|c| {
                c.parse::<lettre::Address>()
                    .map_err(|e| MailError::Config(format!("smtp.canary {c:?}: {e}")))
            })
            .transpose()?;
        let slots = Arc::new(tokio::sync::Semaphore::new(settings.pool_size as usize));
        let mut pools = Vec::with_capacity(relays.len());
        let mut file = None;
        for relay in relays {
            match &relay.to {
                // Only as the one relay (settings refuse it in a list).
                Destination::Outbox(dir) => {
                    std::fs::create_dir_all(dir).map_err(|e| {
                        MailError::Config(format!(
                            "{}: cannot create {}: {e}",
                            relay.key,
                            dir.display()
                        ))
                    })?;
                    file = Some(Transport::File(AsyncFileTransport::new(dir), dir.clone()));
                }
                Destination::Smtp(server) => {
                    let trust = relay
                        .link_tls()
                        .map_err(|e| MailError::Config(crate::report::one_line(&e)))?;
                    let endpoint = smtp::Endpoint::new(server, settings.timeout, &trust)?;
                    let sender = from.email.clone();
                    pools.push((relay.name, pool::SmtpPool::new(endpoint, sender)));
                }
            }
        }
        let transport = match file {
            Some(file) => file,
            None => Transport::Smtp(relays::Relays::new(
                pools,
                &settings.circuit,
                settings.timeout,
                slots.clone(),
                canary,
            )),
        };
        Ok(Self {
            transport,
            deadline: settings.timeout,
            slots,
            ids: Arc::new(MessageIds::new(&from)),
            from,
        })
    }

    /// Waits until one of the `pool_size` connections is free and some
    /// relay takes mail (its circuit is closed). The caller then records
    /// that its send begins and calls [`Mailer::send`], which starts the
    /// SMTP transaction at once instead of queueing for the pool.
    pub async fn reserve(&self) -> Slot {
        loop {
            let permit = self.slots.clone().acquire_owned().await;
            // Acquiring fails only on a closed semaphore, and this one is
            // never closed (no code calls `close`).
            let permit = permit.expect("cannot fail: the slot semaphore is never closed");
            if self.can_send() {
                return Slot { _permit: permit };
            }
            // Every circuit is open: wait without holding a slot (a probe
            // needs one).
            drop(permit);
            self.until_can_send().await;
        }
    }

    /// A slot if one is free right now and some relay takes mail, without
    /// waiting: whether a send could start at this moment.
    pub fn try_reserve(&self) -> Option<Slot> {
        if !self.can_send() {
            return None;
        }
        self.slots
            .clone()
            .try_acquire_owned()
            .ok()
            .map(|permit| Slot { _permit: permit })
    }

    /// Whether some relay takes mail: `false` while every relay's circuit
    /// is open (always `true` for `file://`).
    pub fn can_send(&self) -> bool {
        match &self.transport {
            Transport::Smtp(relays) => relays.available(),
            Transport::File(..) => true,
        }
    }

    /// Waits until [`Mailer::can_send`]: a probe closed a circuit.
    pub async fn until_can_send(&self) {
        if let Transport::Smtp(relays) = &self.transport {
            relays.until_available().await;
        }
    }

    /// How many [`Mailer::reserve`] calls (or others) are waiting for a
    /// relay to take mail right now, as opposed to sending.
    pub fn waiting_for_relay(&self) -> usize {
        match &self.transport {
            Transport::Smtp(relays) => relays.waiting(),
            Transport::File(..) => 0,
        }
    }

    /// Where mail goes when it is written to files instead of sent.
    pub fn outbox(&self) -> Option<&std::path::Path> {
        match &self.transport {
            Transport::File(_, dir) => Some(dir),
            Transport::Smtp(_) => None,
        }
    }

    /// Checks that `to` can be written as a mail recipient, without building
    /// a message (cheap; done before the limiter so a job that could never
    /// be mailed uses no quota).
    pub fn check_recipient(&self, to: &EmailAddress) -> Result<(), MailError> {
        to.as_str()
            .parse::<Address>()
            .map(drop)
            .map_err(|e| MailError::Address(e.to_string()))
    }

    /// Builds the message: `From`, `To`, `Subject`, `Date`, a fresh
    /// `Message-ID`, and a text part or text + HTML alternatives.
    pub fn compose(&self, out: &Outgoing<'_>) -> Result<Message, MailError> {
        let to: Address = out
            .to
            .as_str()
            .parse()
            .map_err(|e| MailError::Address(format!("{e}")))?;
        // The envelope is given, not derived from the headers: lettre derives
        // it by parsing the written `To` back, which fails for some quoted
        // local parts (`"jane q doe"@…`) that `check_recipient` accepts. So
        // what passes the check can always be composed.
        let envelope =
            lettre::address::Envelope::new(Some(self.from.email.clone()), vec![to.clone()])
                .map_err(|e| MailError::Address(e.to_string()))?;
        let builder = Message::builder()
            .envelope(envelope)
            .from(self.from.clone())
            .to(Mailbox::new(None, to))
            .subject(out.subject)
            .message_id(Some(self.ids.next()))
            .date_now();
        let built = match out.html {
            Some(html) => builder.multipart(MultiPart::alternative_plain_html(
                out.text.to_owned(),
                html.to_owned(),
            )),
            None => builder
                .header(ContentType::TEXT_PLAIN)
                .body(out.text.to_owned()),
        };
        built.map_err(|e| MailError::Address(e.to_string()))
    }

    /// Sends one message on a reserved slot, within `smtp.timeout` for the
    /// whole send (connect included, every relay tried included): by the
    /// first relay whose circuit is closed, then the next after a
    /// relay-level failure ([`MailError::Relay`]), never after any other.
    /// Dropping the returned future closes the connection it was using.
    /// Written to files (`file://`), the mail is named after `job`:
    /// `<job id>.<uuid>.eml`, the id's characters other than letters,
    /// digits, `-` and `_` written `_`.
    pub async fn send(&self, _slot: Slot, message: Message, job: &JobId) -> Result<(), MailError> {
        let deadline = Instant::now() + self.deadline;
        match &self.transport {
            Transport::Smtp(relays) => {
                let bytes = message.formatted();
                relays.send(message.envelope(), &bytes, deadline).await
            }
            Transport::File(t, dir) => {
                let written = async {
                    let uuid = t.send(message).await.map_err(|e| e.to_string())?;
                    let named = dir.join(format!("{}.{uuid}.eml", file_safe(job.as_str())));
                    let from = dir.join(format!("{uuid}.eml"));
                    tokio::fs::rename(from, named)
                        .await
                        .map_err(|e| e.to_string())
                };
                match tokio::time::timeout_at(deadline, written).await {
                    Err(_) => Err(MailError::Transient(format!(
                        "writing the mail file: the send deadline of {} passed",
                        humantime::format_duration(self.deadline)
                    ))),
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(e)) => Err(MailError::Transient(format!("writing the mail file: {e}"))),
                }
            }
        }
    }

    /// Whether an SMTP relay answers (or the outbox is writable), for
    /// readiness checks: opens a new connection (the whole session setup)
    /// to the first relay whose circuit is closed (the next if it fails),
    /// sends NOOP and quits; every SMTP failure is [`MailError::Relay`]. The
    /// connection takes a slot, so it never exceeds `pool_size`; when every
    /// slot is busy sending, or no circuit is closed, the answer is
    /// [`Mailer::relay_health`] instead.
    pub async fn check(&self) -> Result<(), MailError> {
        match &self.transport {
            Transport::Smtp(relays) => {
                let Some(_slot) = self.try_reserve() else {
                    return self.relay_health().map_err(MailError::Relay);
                };
                relays.check(Instant::now() + self.deadline).await
            }
            Transport::File(_, dir) => {
                let meta = std::fs::metadata(dir)
                    .map_err(|e| MailError::Transient(format!("{}: {e}", dir.display())))?;
                if meta.permissions().readonly() {
                    return Err(MailError::Transient(format!(
                        "{} is read-only",
                        dir.display()
                    )));
                }
                Ok(())
            }
        }
    }

    /// Each relay checked on its own (a session and NOOP), whatever its
    /// circuit, by name: for `check-config --connect`. Empty for `file://`.
    pub async fn check_each(&self) -> Vec<(String, Result<(), MailError>)> {
        match &self.transport {
            Transport::Smtp(relays) => relays.check_each().await,
            Transport::File(..) => Vec::new(),
        }
    }

    /// Whether mail can go out, without any I/O: `Ok` while some relay's
    /// circuit is closed and its latest send or session setup worked (from
    /// the start, and again after a successful one); else `Err` with why
    /// (one relay: its failure; several: each one's state and failure).
    /// Always `Ok` for `file://`. Also exported as the gauge
    /// `mailgate_smtp_relay_up`.
    pub fn relay_health(&self) -> Result<(), String> {
        match &self.transport {
            Transport::Smtp(relays) => relays.health(),
            Transport::File(..) => Ok(()),
        }
    }
}

/// `id` as a file name's part: letters, digits, `-` and `_` as they are,
/// anything else `_`, at most 100 characters (a job id may hold `/`).
fn file_safe(id: &str) -> String {
    id.chars()
        .take(100)
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '-' | '_' => c,
            _ => '_',
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(url: &str) -> SmtpSettings {
        SmtpSettings {
            url: url.into(),
            relays: Vec::new(),
            circuit: Default::default(),
            from: "Example <no-reply@example.com>".into(),
            pool_size: 2,
            timeout: Duration::from_secs(5),
            tls: Default::default(),
            canary: None,
        }
    }

    #[tokio::test]
    async fn urls() {
        assert!(Mailer::new(&settings("smtp://127.0.0.1:1025")).is_ok());
        assert!(Mailer::new(&settings("smtp://u:p%40ss@127.0.0.1:1025?tls=required")).is_ok());
        assert!(Mailer::new(&settings("smtps://mail.example.com")).is_ok());
        assert!(Mailer::new(&settings("smtp://x?tls=maybe")).is_err());
        assert!(Mailer::new(&settings("http://x")).is_err());
        let mut bad_from = settings("smtp://127.0.0.1");
        bad_from.from = "not an address".into();
        assert!(Mailer::new(&bad_from).is_err());
    }

    #[test]
    fn a_relay_quoting_the_code_does_not_carry_it_on() {
        let code = crate::domain::Code::parse("CODEGG7").unwrap();
        let e = MailError::Permanent(
            "SMTP 554 to end of data: content rejected: Subject: CODEGG7 is your code".into(),
        )
        .hiding(|t| code.hide_in(t));
        assert_eq!(
            e.to_string(),
            "SMTP 554 to end of data: content rejected: Subject: *** is your code"
        );
        // Too short to hide without hiding other text.
        let short = crate::domain::Code::parse("12").unwrap();
        assert_eq!(
            MailError::Transient("SMTP 451 12 later".into())
                .hiding(|t| short.hide_in(t))
                .to_string(),
            "SMTP 451 12 later"
        );
    }

    /// RFC 5322: no line over 998 characters (and none over 78 where it
    /// can be helped), whatever the subject: a variable of 1 024 characters
    /// without a space is folded into encoded words.
    #[test]
    fn a_subject_of_one_long_word_is_folded() {
        let m = Mailer::new(&settings("smtp://127.0.0.1:1025")).unwrap();
        let to = crate::domain::EmailAddress::parse("user@example.com").unwrap();
        let word = "x".repeat(1024);
        for subject in [format!("Code {word}"), word.clone(), "word ".repeat(250)] {
            let out = Outgoing {
                to: &to,
                subject: &subject,
                text: "t",
                html: None,
            };
            let mail = String::from_utf8(m.compose(&out).unwrap().formatted()).unwrap();
            let longest = mail.split("\r\n").map(str::len).max().unwrap();
            assert!(longest <= 78, "{longest}: {mail}");
        }
    }

    #[tokio::test]
    async fn each_mail_has_its_own_message_id_at_the_senders_domain() {
        let ids = |m: &Mailer| {
            let to = crate::domain::EmailAddress::parse("a@example.org").unwrap();
            let out = Outgoing {
                to: &to,
                subject: "s",
                text: "t",
                html: None,
            };
            let mail = String::from_utf8(m.compose(&out).unwrap().formatted()).unwrap();
            mail.lines()
                .find_map(|l| l.strip_prefix("Message-ID: "))
                .unwrap()
                .to_owned()
        };
        let (a, b) = (
            Mailer::new(&settings("smtp://127.0.0.1")).unwrap(),
            Mailer::new(&settings("smtp://127.0.0.1")).unwrap(),
        );
        let all = [ids(&a), ids(&a), ids(&b)];
        for id in &all {
            assert!(id.starts_with('<') && id.ends_with("@example.com>"), "{id}");
        }
        assert!(
            all[0] != all[1] && all[1] != all[2] && all[0] != all[2],
            "{all:?}"
        );
    }

    #[tokio::test]
    async fn composed_mail_has_the_headers_and_parts() {
        let m = Mailer::new(&settings("smtp://127.0.0.1:1025")).unwrap();
        let to = EmailAddress::parse("user@example.com").unwrap();
        let msg = m
            .compose(&Outgoing {
                to: &to,
                subject: "Your code",
                text: "code 493817",
                html: Some("<b>493817</b>"),
            })
            .unwrap();
        let raw = String::from_utf8(msg.formatted()).unwrap();
        for h in [
            "From: ",
            "To: ",
            "Subject: Your code",
            "Date: ",
            "Message-ID: <",
            "multipart/alternative",
        ] {
            assert!(raw.contains(h), "{h} missing in:\n{raw}");
        }
    }
}
