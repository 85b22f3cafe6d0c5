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

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lettre::Address;
use lettre::address::Envelope;
use lettre::transport::smtp::authentication::{Credentials, DEFAULT_MECHANISMS};
use lettre::transport::smtp::client::{
    AsyncSmtpConnection, Certificate, CertificateStore, Tls, TlsParameters,
};
use lettre::transport::smtp::commands::{Data, Mail, Noop, Rcpt, Rset};
use lettre::transport::smtp::extension::{ClientId, Extension, MailBodyParameter, MailParameter};
use lettre::transport::smtp::response::Severity;
use tokio::time::{Instant, timeout_at};

use super::MailError;
use crate::tls::LinkTls;

/// An open SMTP session.
pub(super) type Connection = AsyncSmtpConnection;

/// Where and how to reach the relay, parsed once from `smtp.url`.
pub(super) struct Endpoint {
    host: String,
    port: u16,
    tls: Tls,
    credentials: Option<Credentials>,
    /// The relay is this machine (`localhost`, a loopback address): the
    /// only one credentials may go to unencrypted (`tls=none`).
    local: bool,
    /// The settings table of its TLS (`smtp.tls`, `smtp.relays[1].tls`),
    /// named by a TLS failure's message.
    tls_table: String,
    hello: ClientId,
    /// The send deadline, only to name it in error messages.
    timeout: Duration,
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

impl Endpoint {
    /// Reads an `smtp://` or `smtps://` URL: `?tls=opportunistic` (the
    /// default for `smtp://` without credentials; with them, it means
    /// `required`), `required` or `none`; `user:pass@` credentials, percent-decoded.
    /// Default ports: 25, 587 with `tls=required`, 465. Certificates are
    /// verified against `trust`.
    pub(super) fn from_url(
        url: &url::Url,
        timeout: Duration,
        trust: &LinkTls,
    ) -> Result<Self, MailError> {
        let host = match url.host() {
            Some(url::Host::Domain(d)) => d.to_owned(),
            Some(url::Host::Ipv4(ip)) => ip.to_string(),
            Some(url::Host::Ipv6(ip)) => ip.to_string(),
            None => return Err(MailError::Config("smtp.url has no host".into())),
        };
        let local = crate::tls::is_loopback(&host);
        let credentials = credentials(url)?;
        let (tls, default_port) = tls_mode(url, &host, credentials.is_some(), trust)?;
        Ok(Self {
            port: url.port().unwrap_or(default_port),
            host,
            tls,
            credentials,
            local,
            tls_table: trust.table().to_owned(),
            hello: ClientId::default(),
            timeout,
        })
    }

    /// Opens a session ready for MAIL FROM: connects (implicit TLS for
    /// `smtps://`), reads the greeting, says EHLO, upgrades with STARTTLS
    /// when offered (or fails when required and not offered), and
    /// authenticates when credentials are set. All within `deadline`.
    pub(super) async fn open(&self, deadline: Instant) -> Result<Connection, Failed> {
        let mut conn = self.connect(deadline).await?;
        let setup = async {
            self.starttls(&mut conn, deadline).await?;
            self.authenticate(&mut conn, deadline).await
        };
        match setup.await {
            Ok(()) => Ok(conn),
            Err(failed) => {
                discard(conn, &failed, deadline).await;
                Err(failed)
            }
        }
    }

    async fn connect(&self, deadline: Instant) -> Result<Connection, Failed> {
        let implicit = match &self.tls {
            Tls::Wrapper(params) => Some(params.clone()),
            _ => None,
        };
        let left = deadline.saturating_duration_since(Instant::now());
        let connecting = AsyncSmtpConnection::connect_tokio1(
            (self.host.as_str(), self.port),
            Some(left),
            &self.hello,
            implicit,
            None,
        );
        step(deadline, Phase::Connect, connecting).await
    }

    async fn starttls(&self, conn: &mut Connection, deadline: Instant) -> Result<(), Failed> {
        let params = match &self.tls {
            Tls::Required(_) if !conn.can_starttls() => {
                return Err(Failed::unsupported(
                    Phase::StartTls,
                    format!("STARTTLS required but not offered by {self}"),
                ));
            }
            Tls::Required(params) => params,
            Tls::Opportunistic(params) if conn.can_starttls() => params,
            _ => return Ok(()),
        };
        let upgrade = conn.starttls(params.clone(), &self.hello);
        step(deadline, Phase::StartTls, upgrade).await
    }

    async fn authenticate(&self, conn: &mut Connection, deadline: Instant) -> Result<(), Failed> {
        let Some(credentials) = &self.credentials else {
            return Ok(());
        };
        // Settings refuse every way to this, and `tls_mode` requires TLS
        // with credentials; this is the last line: a password goes to a
        // relay on another host only inside TLS.
        if !conn.is_encrypted() && !self.local {
            return Err(Failed::unsupported(
                Phase::Auth,
                format!("{self}: the session is not encrypted; the password is not sent"),
            ));
        }
        let offered = conn.server_info().get_auth_mechanism(DEFAULT_MECHANISMS);
        if offered.is_none() {
            return Err(Failed::unsupported(
                Phase::Auth,
                format!(
                    "AUTH (PLAIN or LOGIN) required by the credentials in smtp.url but not offered by {self}"
                ),
            ));
        }
        let auth = conn.auth(DEFAULT_MECHANISMS, credentials);
        step(deadline, Phase::Auth, auth).await.map(drop)
    }
}

/// The TLS mode and default port. With credentials, TLS is required unless
/// `tls=none` says otherwise (which settings allow only for this machine):
/// opportunistic STARTTLS would hand the password to whoever strips
/// STARTTLS from the relay's EHLO reply.
fn tls_mode(
    url: &url::Url,
    host: &str,
    credentials: bool,
    trust: &LinkTls,
) -> Result<(Tls, u16), MailError> {
    let tls_param = url
        .query_pairs()
        .find(|(k, _)| k == "tls")
        .map(|(_, v)| v.into_owned());
    let params = || tls_parameters(host, trust);
    Ok(match (url.scheme(), tls_param.as_deref()) {
        ("smtps", _) => (Tls::Wrapper(params()?), 465),
        ("smtp", None | Some("opportunistic")) if credentials => (Tls::Required(params()?), 25),
        ("smtp", None | Some("opportunistic")) => (Tls::Opportunistic(params()?), 25),
        ("smtp", Some("required")) => (Tls::Required(params()?), 587),
        ("smtp", Some("none")) => (Tls::None, 25),
        ("smtp", Some(other)) => {
            return Err(MailError::Config(format!(
                "smtp.url: tls={other:?} (use required, opportunistic or none)"
            )));
        }
        (other, _) => {
            return Err(MailError::Config(format!(
                "smtp.url: {other}:// is not an SMTP scheme"
            )));
        }
    })
}

/// lettre's TLS parameters for `host`: its certificate must name `host`
/// and chain to `trust`'s roots.
fn tls_parameters(host: &str, trust: &LinkTls) -> Result<TlsParameters, MailError> {
    let failed = |e: lettre::transport::smtp::Error| MailError::Config(format!("smtp TLS: {e}"));
    crate::tls::install_provider();
    let builder = TlsParameters::builder(host.to_owned());
    let builder = match trust.roots_der() {
        None => builder.certificate_store(CertificateStore::WebpkiRoots),
        Some(roots) => {
            let mut builder = builder.certificate_store(CertificateStore::None);
            for root in roots {
                builder = builder.add_root_certificate(
                    Certificate::from_der(root.as_ref().to_vec()).map_err(failed)?,
                );
            }
            builder
        }
    };
    builder.build_rustls().map_err(failed)
}

fn credentials(url: &url::Url) -> Result<Option<Credentials>, MailError> {
    let Some(password) = url.password() else {
        return Ok(None);
    };
    let decode = |s: &str| {
        percent_decode(s)
            .ok_or_else(|| MailError::Config("smtp.url: credentials are not UTF-8".into()))
    };
    Ok(Some(Credentials::new(
        decode(url.username())?,
        decode(password)?,
    )))
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes: Vec<u8> = url::form_urlencoded::parse(format!("x={s}").as_bytes())
        .next()
        .map(|(_, v)| v.into_owned().into_bytes())?;
    String::from_utf8(bytes).ok()
}

/// Runs one mail transaction (MAIL FROM, RCPT for each recipient, DATA,
/// the message) on `conn`, all within `deadline`. Hands the connection back
/// only after the server accepted the mail; on failure it is closed (with a
/// QUIT when the session is at a command boundary) and never returned.
pub(super) async fn transaction(
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
pub(super) async fn noop(conn: &mut Connection, deadline: Instant) -> Result<(), Failed> {
    step(deadline, Phase::Noop, conn.command(Noop))
        .await
        .map(drop)
}

/// MAIL FROM `from` (with SMTPUTF8 for a non-ASCII sender, as a send
/// has, and refused as a send is where the server does not offer it),
/// then RSET, for probes (found by review: a relay that sets sessions up
/// but refuses every sender, out of quota or suspended, passed a NOOP
/// probe, and its circuit flapped closed, failing sends). The transaction
/// is reset at once: nothing is handed over. A reply refusing RSET still
/// leaves a relay that takes mail; a 421, a broken session or the deadline
/// there fail the probe, as they would fail a send.
pub(super) async fn sender_taken(
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

/// Where a session was when it failed, in the order a session goes
/// through them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Phase {
    /// TCP connect, implicit TLS, the greeting, EHLO.
    Connect,
    /// STARTTLS and the EHLO after it.
    StartTls,
    /// AUTH.
    Auth,
    /// NOOP (health checks only).
    Noop,
    /// MAIL FROM.
    MailFrom,
    /// RCPT TO.
    Rcpt,
    /// The DATA command.
    Data,
    /// Writing the message, before the final dot.
    Message,
    /// The final dot was written (or was being written); waiting for the reply.
    EndOfData,
}

/// What went wrong in one step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Fault {
    /// A 4xx or 5xx reply: the code and the server's text.
    Reply(u16, String),
    /// An I/O error, the connection closed (EOF), or a reply that cannot be
    /// read: the session is unusable.
    Broken(String),
    /// The send deadline passed during the step.
    Deadline,
    /// Found before sending anything: this server cannot do what is needed
    /// (STARTTLS, AUTH, SMTPUTF8, 8BITMIME). The text says what.
    Unsupported(String),
}

impl From<&lettre::transport::smtp::Error> for Fault {
    fn from(e: &lettre::transport::smtp::Error) -> Self {
        match e.status() {
            Some(code) => {
                let text = std::error::Error::source(e).map_or(String::new(), |s| s.to_string());
                Fault::Reply(code.into(), text)
            }
            None if e.is_client() => Fault::Unsupported(e.to_string()),
            None => Fault::Broken(e.to_string()),
        }
    }
}

/// What a 4xx or 5xx reply to RCPT, DATA or the message says it is about.
/// The contract's rule ("a refusal is about the mail") is right for one
/// mail and wrong for a relay that turns every mail away (found by review:
/// a relay answering `452 4.3.1` to every RCPT failed every job while the
/// standby got none). A refusal is read so that no recipient can make a
/// healthy relay's refusal of it look like the relay's (found by re-review:
/// a reply quoting `<throttle1@farm.example>` read as throttling).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refusal {
    /// The mail or its mailbox (an unknown user, a full mailbox, a policy
    /// refusal, greylisting): this mail's answer.
    Mail,
    /// The relay, whatever the mail: a 4xx or 5xx whose enhanced status
    /// code names the mail system (`X.3.x` but `X.3.4`, message too big),
    /// a 4xx whose code names the network and routing (`4.4.x`; a 5.4.x
    /// is how some relays refuse a recipient), a 4xx `4.7.x` policy reply
    /// that says it throttles; without an enhanced code, `454` (SES's
    /// "Throttling failure") or a 4xx that says it throttles. Words are
    /// read with the addresses the reply quotes taken out.
    Relay,
    /// Either, with this code and no enhanced status code to tell (`451`,
    /// `452`, `554`): the relay's when it repeats for several other
    /// recipients ([`super::relays`] keeps them).
    Suspect(u16),
}

impl Refusal {
    /// Reads a refusal's code and text (which starts with the enhanced
    /// status code, if the relay sends one: `4.3.1 insufficient system
    /// storage`).
    pub(super) fn of(code: u16, text: &str) -> Self {
        let enhanced = text
            .split_whitespace()
            .next()
            .map(|c| c.split('.').collect::<Vec<_>>())
            .filter(|p| {
                p.len() == 3
                    && p.iter()
                        .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            })
            .filter(|p| p[0] == "4" || p[0] == "5");
        // The reply's words without the addresses it quotes: a recipient
        // named "throttle" must not read as a relay that throttles.
        let words: String = text
            .split_whitespace()
            .filter(|w| !w.contains('@') && !w.contains('<') && !w.contains('>'))
            .collect::<Vec<_>>()
            .join(" ")
            .to_ascii_lowercase();
        let throttles = ["rate limit", "rate-limit", "throttl", "too many"]
            .iter()
            .any(|w| words.contains(w));
        let transient = (400..500).contains(&code);
        match enhanced {
            Some(p) if p[1] == "3" && p[2] != "4" => Refusal::Relay,
            Some(p) if p[1] == "4" && transient => Refusal::Relay,
            Some(p) if p[1] == "7" && transient && throttles => Refusal::Relay,
            Some(_) => Refusal::Mail,
            None if code == 454 || (transient && throttles) => Refusal::Relay,
            None if matches!(code, 451 | 452 | 554) => Refusal::Suspect(code),
            None => Refusal::Mail,
        }
    }
}

/// A failed session step: where, and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Failed {
    pub(super) phase: Phase,
    pub(super) fault: Fault,
}

impl Failed {
    fn unsupported(phase: Phase, why: String) -> Self {
        Self {
            phase,
            fault: Fault::Unsupported(why),
        }
    }

    /// Whether this is how a parked connection that died while idle fails:
    /// MAIL FROM met a closed or broken connection, or a 421 (the server is
    /// closing it). Nothing of the mail was accepted yet, so a transaction
    /// on a reused connection that fails this way may be tried once more on
    /// a fresh connection.
    pub(super) fn is_stale_connection(&self) -> bool {
        self.phase == Phase::MailFrom
            && matches!(self.fault, Fault::Broken(_) | Fault::Reply(421, _))
    }

    /// Whether this failure is the relay's rather than the mail's, so it
    /// counts against the relay's circuit: every [`MailError::Relay`]
    /// (session setup, MAIL FROM), and, later in the transaction, a 421
    /// (the server is closing the session: it is going down, whatever the
    /// mail), a refusal that names the relay ([`Refusal::Relay`]), or a
    /// connection that broke or went silent (I/O error, EOF, the deadline),
    /// before or after the final dot. Any other 4xx or 5xx reply to RCPT,
    /// DATA or the message is about the mail and does not count (the relay
    /// judges a repeated [`Refusal::Suspect`]); nor does a mail this server
    /// cannot take (SMTPUTF8, 8BITMIME).
    pub(super) fn is_relay_fault(&self) -> bool {
        self.phase <= Phase::MailFrom
            || self.refusal() == Some(Refusal::Relay)
            || matches!(
                self.fault,
                Fault::Broken(_) | Fault::Deadline | Fault::Reply(421, _)
            )
    }

    /// How a 4xx or 5xx reply to RCPT, DATA or the message reads; `None`
    /// for any other failure. See [`Refusal`].
    pub(super) fn refusal(&self) -> Option<Refusal> {
        let Fault::Reply(code, text) = &self.fault else {
            return None;
        };
        if self.phase < Phase::Rcpt || *code == 421 {
            return None;
        }
        Some(Refusal::of(*code, text))
    }

    /// The error for the caller, by phase:
    ///
    /// | phase | 4xx | 5xx | I/O, EOF, deadline | unsupported |
    /// |---|---|---|---|---|
    /// | connect, STARTTLS, AUTH, NOOP, MAIL FROM | Relay | Relay | Relay | Relay |
    /// | RCPT, DATA | Transient | Permanent | Transient | Permanent |
    /// | the message, before the final dot | – | – | Transient | – |
    /// | end of data (the dot was written) | Transient | Permanent | **Unknown** | – |
    ///
    /// A refusal that names the relay ([`Refusal::Relay`]) is a relay
    /// failure whatever the phase: nothing was delivered, so the mail may
    /// go to the next relay.
    pub(super) fn classify(&self, endpoint: &Endpoint) -> MailError {
        let text = self.describe(endpoint);
        if self.refusal() == Some(Refusal::Relay) {
            return MailError::Relay(format!("relay: {text}"));
        }
        match (self.phase, &self.fault) {
            (Phase::Connect | Phase::StartTls | Phase::Auth | Phase::Noop | Phase::MailFrom, _) => {
                MailError::Relay(format!("relay: {text}"))
            }
            (_, Fault::Reply(code, _)) if *code >= 500 => MailError::Permanent(text),
            (_, Fault::Reply(..)) => MailError::Transient(text),
            (Phase::EndOfData, _) => MailError::Unknown(format!(
                "delivery unknown: {text}; the server may have the mail"
            )),
            (_, Fault::Unsupported(_)) => MailError::Permanent(text),
            (_, Fault::Broken(_) | Fault::Deadline) => MailError::Transient(text),
        }
    }

    fn describe(&self, endpoint: &Endpoint) -> String {
        let phase = match (self.phase, &self.fault) {
            (Phase::Connect, Fault::Reply(..)) => format!("the greeting or EHLO of {endpoint}"),
            (Phase::Connect, _) => format!("connecting to {endpoint}"),
            (Phase::StartTls, _) => format!("STARTTLS with {endpoint}"),
            (Phase::Auth, _) => format!("AUTH with {endpoint}"),
            (Phase::Noop, _) => format!("NOOP to {endpoint}"),
            (Phase::MailFrom, _) => "MAIL FROM".into(),
            (Phase::Rcpt, _) => "RCPT".into(),
            (Phase::Data, _) => "DATA".into(),
            (Phase::Message, _) => "writing the message".into(),
            (Phase::EndOfData, _) => "end of data".into(),
        };
        match &self.fault {
            Fault::Reply(code, text) => format!("SMTP {code} to {phase}: {text}"),
            // Plaintext where the TLS handshake should be, after the relay
            // agreed to STARTTLS: the port is right, so never advise a URL
            // without TLS (the session fails; nothing was sent).
            Fault::Broken(text)
                if self.phase == Phase::StartTls && text.contains("InvalidContentType") =>
            {
                format!(
                    "{phase}: the relay agreed to STARTTLS, then sent plaintext instead of \
                     the TLS handshake: something on the path is tampering with the session, \
                     or the relay is broken"
                )
            }
            Fault::Broken(text) => {
                // lettre repeats its sources ("Connection error: Connection
                // error: …"); a TLS failure is said with what to set.
                let table = &endpoint.tls_table;
                let text = crate::tls::explain(text, table, crate::tls::ClientCert::NotTaken)
                    .unwrap_or_else(|| crate::telemetry::without_repeats(text));
                format!("{phase}: {text}")
            }
            Fault::Deadline => format!(
                "{phase}: the send deadline of {} passed",
                humantime::format_duration(endpoint.timeout)
            ),
            Fault::Unsupported(text) => text.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(url: &str) -> Endpoint {
        Endpoint::from_url(
            &url::Url::parse(url).unwrap(),
            Duration::from_secs(1),
            &LinkTls::bundled("smtp.tls"),
        )
        .unwrap()
    }

    #[test]
    fn urls_choose_tls_port_and_credentials() {
        let e = endpoint("smtp://u%20x:p%40ss@mail.example.com?tls=required");
        assert!(matches!(e.tls, Tls::Required(_)));
        assert_eq!(e.port, 587);
        let c = e.credentials.as_ref().unwrap();
        assert_eq!(c, &Credentials::new("u x".into(), "p@ss".into()));
        assert!(matches!(endpoint("smtp://h").tls, Tls::Opportunistic(_)));
        // Credentials without tls= require TLS (never opportunistic).
        let with_password = endpoint("smtp://u:p@h");
        assert!(matches!(with_password.tls, Tls::Required(_)));
        assert_eq!(with_password.port, 25);
        assert!(matches!(endpoint("smtp://h:2525?tls=none").tls, Tls::None));
        let s = endpoint("smtps://h");
        assert!(matches!(s.tls, Tls::Wrapper(_)));
        assert_eq!((s.port, s.credentials.is_none()), (465, true));
        let v6 = endpoint("smtp://[::1]:2525");
        assert_eq!(
            (v6.host.as_str(), v6.to_string()),
            ("::1", "[::1]:2525".into())
        );
    }

    #[test]
    fn refusals_that_name_the_relay_are_the_relays() {
        use Refusal::*;
        for (code, text, want) in [
            (452, "4.3.1 insufficient system storage", Relay),
            (451, "4.3.0 other or undefined mail system status", Relay),
            (554, "5.3.0 other mail system problem", Relay),
            (451, "4.4.1 no answer from host", Relay),
            (
                454,
                "Throttling failure: Maximum sending rate exceeded.",
                Relay,
            ),
            (451, "4.7.1 rate limit exceeded", Relay),
            (450, "too many messages, slow down", Relay),
            (421, "4.7.28 rate limited, try later", Relay),
            (
                450,
                "4.1.1 <throttle1@farm.example>: Recipient address rejected",
                Mail,
            ),
            (
                451,
                "<too.many@x.example> temporarily deferred",
                Suspect(451),
            ),
            (550, "5.4.1 Recipient address rejected: Access denied", Mail),
            (552, "5.3.4 message too big for system", Mail),
            (552, "5.2.2 mailbox full", Mail),
            (550, "5.1.1 no such user", Mail),
            (451, "4.7.1 greylisted, try again later", Mail),
            (550, "no such user", Mail),
            (451, "local error", Suspect(451)),
            (452, "insufficient storage", Suspect(452)),
            (554, "transaction failed", Suspect(554)),
            (554, "5.x.y not a code", Suspect(554)),
        ] {
            assert_eq!(Refusal::of(code, text), want, "{code} {text}");
        }
    }

    fn class(phase: Phase, fault: Fault) -> &'static str {
        match (Failed { phase, fault }).classify(&endpoint("smtp://h")) {
            MailError::Relay(_) => "relay",
            MailError::Transient(_) => "transient",
            MailError::Permanent(_) => "permanent",
            MailError::Unknown(_) => "unknown",
            MailError::Config(_) | MailError::Address(_) => "other",
        }
    }

    #[test]
    fn failures_are_classified_by_phase() {
        use Phase::*;
        let reply = |c| Fault::Reply(c, "x".into());
        let broken = || Fault::Broken("network error".into());
        let unsupported = || Fault::Unsupported("x".into());
        for phase in [Connect, StartTls, Auth, Noop, MailFrom] {
            for fault in [
                reply(421),
                reply(550),
                broken(),
                Fault::Deadline,
                unsupported(),
            ] {
                assert_eq!(class(phase, fault.clone()), "relay", "{phase:?} {fault:?}");
            }
        }
        for phase in [Rcpt, Data, EndOfData] {
            assert_eq!(class(phase, reply(451)), "transient", "{phase:?}");
            assert_eq!(class(phase, reply(550)), "permanent", "{phase:?}");
        }
        for phase in [Rcpt, Data, Message] {
            assert_eq!(class(phase, broken()), "transient", "{phase:?}");
            assert_eq!(class(phase, Fault::Deadline), "transient", "{phase:?}");
        }
        assert_eq!(class(Rcpt, unsupported()), "permanent");
        assert_eq!(class(Data, unsupported()), "permanent");
        assert_eq!(class(EndOfData, broken()), "unknown");
        assert_eq!(class(EndOfData, Fault::Deadline), "unknown");
    }

    #[test]
    fn texts_name_the_code_and_the_phase() {
        let e = endpoint("smtp://mail.example.com:587");
        let rcpt = Failed {
            phase: Phase::Rcpt,
            fault: Fault::Reply(550, "5.1.1 no such user".into()),
        };
        assert_eq!(
            rcpt.classify(&e).to_string(),
            "SMTP 550 to RCPT: 5.1.1 no such user"
        );
        let late = Failed {
            phase: Phase::EndOfData,
            fault: Fault::Deadline,
        };
        assert_eq!(
            late.classify(&e).to_string(),
            "delivery unknown: end of data: the send deadline of 1s passed; the server may have the mail"
        );
        let tls = Failed::unsupported(
            Phase::StartTls,
            format!("STARTTLS required but not offered by {e}"),
        );
        assert_eq!(
            tls.classify(&e).to_string(),
            "relay: STARTTLS required but not offered by mail.example.com:587"
        );
    }

    #[test]
    fn relay_faults_are_the_sessions_never_the_mails() {
        use Phase::*;
        let f = |phase, fault| Failed { phase, fault }.is_relay_fault();
        for phase in [Connect, StartTls, Auth, Noop, MailFrom] {
            assert!(f(phase, Fault::Reply(550, "x".into())), "{phase:?}");
            assert!(f(phase, Fault::Unsupported("x".into())), "{phase:?}");
        }
        for phase in [Rcpt, Data, EndOfData] {
            assert!(!f(phase, Fault::Reply(451, "x".into())), "{phase:?}");
            assert!(!f(phase, Fault::Reply(550, "x".into())), "{phase:?}");
            assert!(f(phase, Fault::Reply(421, "x".into())), "{phase:?}");
        }
        for phase in [Rcpt, Data, Message, EndOfData] {
            assert!(f(phase, Fault::Broken("eof".into())), "{phase:?}");
            assert!(f(phase, Fault::Deadline), "{phase:?}");
        }
        assert!(!f(Rcpt, Fault::Unsupported("SMTPUTF8".into())));
        assert!(!f(Data, Fault::Unsupported("8BITMIME".into())));
    }

    #[test]
    fn only_a_dead_connection_at_mail_from_is_stale() {
        let f = |phase, fault| Failed { phase, fault }.is_stale_connection();
        assert!(f(Phase::MailFrom, Fault::Broken("eof".into())));
        assert!(f(Phase::MailFrom, Fault::Reply(421, "bye".into())));
        assert!(!f(Phase::MailFrom, Fault::Reply(451, "later".into())));
        assert!(!f(Phase::MailFrom, Fault::Deadline));
        assert!(!f(Phase::Rcpt, Fault::Broken("eof".into())));
    }
}
