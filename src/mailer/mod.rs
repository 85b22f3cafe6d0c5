//! Building and sending mail over SMTP (pooled, TLS via rustls), or into a
//! folder of `.eml` files for development.
//!
//! Addresses are parsed by lettre and headers are written by lettre, never
//! spliced as text, so no field can add a header. Every send has one deadline
//! for the whole SMTP transaction. Failures are classified for the pipeline:
//! [`MailError::Transient`] is worth retrying, [`MailError::Permanent`] is not.

use std::path::PathBuf;
use std::time::Duration;

use lettre::message::header::ContentType;
use lettre::message::{Mailbox, MultiPart};
use lettre::transport::smtp::PoolConfig;
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Tls, TlsParameters};
use lettre::{
    Address, AsyncFileTransport, AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor,
};

use crate::domain::EmailAddress;
use crate::settings::SmtpSettings;

/// Why a mail could not be built or sent.
#[derive(Debug, Clone, thiserror::Error)]
pub enum MailError {
    /// `smtp.url` or `smtp.from` is unusable (a start-up error).
    #[error("smtp settings: {0}")]
    Config(String),
    /// The recipient cannot be written as a mail address (the job is invalid).
    #[error("the address cannot be mailed: {0}")]
    Address(String),
    /// Worth retrying: a 4xx reply, a connection or TLS failure, the deadline.
    #[error("{0}")]
    Transient(String),
    /// Not worth retrying: a 5xx reply (e.g. the server refuses the address).
    #[error("{0}")]
    Permanent(String),
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
    Smtp(AsyncSmtpTransport<Tokio1Executor>),
    File(AsyncFileTransport<Tokio1Executor>, PathBuf),
}

/// Composes and sends mail. Cheap to clone; clones share the connection pool.
#[derive(Clone)]
pub struct Mailer {
    transport: Transport,
    from: Mailbox,
    deadline: Duration,
    /// One permit per pooled connection: holding one means a send can start
    /// at once (see [`Mailer::reserve`]).
    slots: std::sync::Arc<tokio::sync::Semaphore>,
}

/// The right to send one mail now; see [`Mailer::reserve`].
pub struct Slot(#[allow(dead_code)] tokio::sync::OwnedSemaphorePermit);

impl Mailer {
    /// Builds the transport from settings. Does not connect: connections are
    /// opened on demand and kept in a pool of `pool_size`. Must be called
    /// within a Tokio runtime (the pool starts a task).
    pub fn new(settings: &SmtpSettings) -> Result<Self, MailError> {
        let from: Mailbox = settings
            .from
            .parse()
            .map_err(|e| MailError::Config(format!("smtp.from {:?}: {e}", settings.from)))?;
        let url = url::Url::parse(&settings.url)
            .map_err(|e| MailError::Config(format!("smtp.url: {e}")))?;
        let transport = match url.scheme() {
            "file" => {
                // `file://outbox` names ./outbox; `file:///var/mail` an absolute path.
                let dir = PathBuf::from(format!("{}{}", url.host_str().unwrap_or(""), url.path()));
                std::fs::create_dir_all(&dir).map_err(|e| {
                    MailError::Config(format!("smtp.url: cannot create {}: {e}", dir.display()))
                })?;
                Transport::File(AsyncFileTransport::new(&dir), dir)
            }
            "smtp" | "smtps" => Transport::Smtp(smtp_transport(&url, settings)?),
            other => {
                return Err(MailError::Config(format!(
                    "smtp.url: unknown scheme {other:?} (smtp://, smtps:// or file://)"
                )));
            }
        };
        Ok(Self {
            transport,
            from,
            deadline: settings.timeout,
            slots: std::sync::Arc::new(tokio::sync::Semaphore::new(settings.pool_size as usize)),
        })
    }

    /// Waits until one of the `pool_size` connections is free. The caller
    /// then records that its send begins and calls [`Mailer::send`], which
    /// starts the SMTP transaction at once instead of queueing for the pool.
    pub async fn reserve(&self) -> Slot {
        let permit = self.slots.clone().acquire_owned().await;
        // Acquiring fails only on a closed semaphore, and this one is never
        // closed (no code calls `close`).
        Slot(permit.expect("the slot semaphore is never closed"))
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
        let builder = Message::builder()
            .from(self.from.clone())
            .to(Mailbox::new(None, to))
            .subject(out.subject)
            .message_id(None)
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

    /// Sends one message within the deadline, on a reserved slot.
    pub async fn send(&self, _slot: Slot, message: Message) -> Result<(), MailError> {
        let deadline = self.deadline;
        let expired = || MailError::Transient(format!("send deadline of {deadline:?} passed"));
        match &self.transport {
            Transport::Smtp(t) => match tokio::time::timeout(deadline, t.send(message)).await {
                Err(_) => Err(expired()),
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(classify(&e)),
            },
            Transport::File(t, _) => match tokio::time::timeout(deadline, t.send(message)).await {
                Err(_) => Err(expired()),
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(MailError::Transient(format!("writing the mail file: {e}"))),
            },
        }
    }

    /// Whether the SMTP server answers (or the outbox is writable), for
    /// readiness checks.
    pub async fn check(&self) -> Result<(), MailError> {
        match &self.transport {
            Transport::Smtp(t) => {
                match tokio::time::timeout(self.deadline, t.test_connection()).await {
                    Ok(Ok(true)) => Ok(()),
                    Ok(Ok(false)) => Err(MailError::Transient(
                        "the SMTP server did not answer NOOP".into(),
                    )),
                    Ok(Err(e)) => Err(classify(&e)),
                    Err(_) => Err(MailError::Transient(
                        "the SMTP server did not answer in time".into(),
                    )),
                }
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
}

fn smtp_transport(
    url: &url::Url,
    settings: &SmtpSettings,
) -> Result<AsyncSmtpTransport<Tokio1Executor>, MailError> {
    let host = url
        .host_str()
        .ok_or_else(|| MailError::Config("smtp.url has no host".into()))?
        .to_owned();
    let tls_param = url
        .query_pairs()
        .find(|(k, _)| k == "tls")
        .map(|(_, v)| v.into_owned());
    let params = || {
        TlsParameters::new(host.clone()).map_err(|e| MailError::Config(format!("smtp TLS: {e}")))
    };
    let (tls, default_port) = match (url.scheme(), tls_param.as_deref()) {
        ("smtps", _) => (Tls::Wrapper(params()?), 465),
        ("smtp", None | Some("opportunistic")) => (Tls::Opportunistic(params()?), 25),
        ("smtp", Some("required")) => (Tls::Required(params()?), 587),
        ("smtp", Some("none")) => (Tls::None, 25),
        (_, Some(other)) => {
            return Err(MailError::Config(format!(
                "smtp.url: tls={other:?} (use required, opportunistic or none)"
            )));
        }
        _ => unreachable!("the caller matched the scheme"),
    };
    let mut builder = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(host)
        .port(url.port().unwrap_or(default_port))
        .tls(tls)
        // Each step gets the whole deadline; `send` enforces it overall.
        .timeout(Some(settings.timeout))
        .pool_config(PoolConfig::new().max_size(settings.pool_size));
    if let Some(password) = url.password() {
        let decode = |s: &str| {
            percent_encoding_decode(s)
                .ok_or_else(|| MailError::Config("smtp.url: credentials are not UTF-8".into()))
        };
        builder = builder.credentials(Credentials::new(decode(url.username())?, decode(password)?));
    }
    Ok(builder.build())
}

fn percent_encoding_decode(s: &str) -> Option<String> {
    let bytes: Vec<u8> = url::form_urlencoded::parse(format!("x={s}").as_bytes())
        .next()
        .map(|(_, v)| v.into_owned().into_bytes())?;
    String::from_utf8(bytes).ok()
}

fn classify(e: &lettre::transport::smtp::Error) -> MailError {
    let text = match e.status() {
        Some(code) => format!("SMTP {code}: {e}"),
        None => e.to_string(),
    };
    if e.is_permanent() || e.is_client() {
        // 5xx, or something this client cannot send to this server (e.g. a
        // unicode mailbox to a server without SMTPUTF8): retrying won't help.
        MailError::Permanent(text)
    } else {
        // 4xx, timeouts, refused or dropped connections, TLS trouble: the
        // next attempt may well succeed.
        MailError::Transient(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(url: &str) -> SmtpSettings {
        SmtpSettings {
            url: url.into(),
            from: "Example <no-reply@example.com>".into(),
            pool_size: 2,
            timeout: Duration::from_secs(5),
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
