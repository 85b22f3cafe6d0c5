//! `[smtp]`: the relays mail goes to, in order of preference, and the
//! circuit breaker that skips one that fails.

use std::time::Duration;

use serde::Deserialize;

use super::relay::{Destination, RelayUrl, RelayUrls, SmtpServer, TlsMode};
use super::{SettingsError, check_bounds, check_userinfo, human_duration, load_tls};
use crate::tls::{LinkTls, TlsSettings};

/// How mail is sent.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SmtpSettings {
    /// `smtp://host:port` (STARTTLS when offered; `?tls=required` insists),
    /// `smtps://host:port` (implicit TLS), optional `user:pass@`; or
    /// `file://DIR` to write `.eml` files instead of sending. The shorthand
    /// for `[[smtp.relays]]`: one relay, or several SMTP URLs separated by
    /// commas, in order of preference, each named `host:port`; empty when
    /// the relays are listed there (setting both is refused). Read once,
    /// when it is set ([`RelayUrls`]).
    #[serde(default)]
    pub url: RelayUrls,
    /// `[[smtp.relays]]`: several relays, in order of preference, each with
    /// a circuit breaker (see [`CircuitSettings`]). Empty when `url` is set.
    #[serde(default)]
    pub relays: Vec<RelaySettings>,
    /// When a relay's circuit opens, and for how long.
    #[serde(default)]
    pub circuit: CircuitSettings,
    /// The `From` of every mail, e.g. `Example <no-reply@example.com>`.
    pub from: String,
    /// Most SMTP connections kept open and used at once.
    #[serde(default = "default_pool_size")]
    pub pool_size: u32,
    /// Deadline for one whole send (connect, TLS, the SMTP dialogue).
    #[serde(default = "default_smtp_timeout", deserialize_with = "human_duration")]
    pub timeout: Duration,
    /// `[smtp.tls]`: the CA bundle every relay without a `tls` of its own
    /// trusts (`ca_file` only: no client certificates for SMTP).
    #[serde(default)]
    pub tls: TlsSettings,
    /// An address every relay takes (the operator's own mailbox), offered
    /// at RCPT in a session of its own, then reset and never mailed, when
    /// a relay refuses a recipient in a way that might be the relay's
    /// (throttling, its mail system, a domain it cannot reach): refused
    /// too, the refusal is the relay's (the mail goes to the next relay,
    /// and counts against the circuit); taken, it was the recipient's own.
    /// Without it, such refusals are the relay's only once they came for
    /// several recipient domains in a row with no mail taken between.
    #[serde(default)]
    pub canary: Option<String>,
}

/// One `[[smtp.relays]]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelaySettings {
    /// `smtp://` or `smtps://`, as `smtp.url` (not `file://`); read once,
    /// when it is set ([`RelayUrl`]).
    pub url: RelayUrl,
    /// The relay's name in metrics (label `relay`), logs and `/readyz`;
    /// `host:port` by default (never the credentials).
    #[serde(default)]
    pub name: Option<String>,
    /// This relay's TLS (`tls = { ca_file = "…" }`), instead of
    /// `[smtp.tls]`'s; `tls = {}` is the defaults (the bundled roots).
    #[serde(default)]
    pub tls: Option<TlsSettings>,
}

/// `[smtp.circuit]`: after `failures` relay-level failures in a row a
/// relay's circuit opens for `cool_down`; then one probe (a session and
/// NOOP) closes it again, or opens it for another `cool_down`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CircuitSettings {
    /// Consecutive relay-level failures that open a relay's circuit.
    pub failures: u32,
    /// How long an open circuit waits before its probe.
    #[serde(deserialize_with = "human_duration")]
    pub cool_down: Duration,
}

impl Default for CircuitSettings {
    fn default() -> Self {
        Self {
            failures: 5,
            cool_down: Duration::from_secs(30),
        }
    }
}

/// A relay as the mailer uses it: its name, where it sends and how,
/// checked.
#[derive(Debug, Clone)]
pub struct Relay {
    /// Unique among the relays; safe to show (no credentials).
    pub name: String,
    /// The settings key of its URL (`smtp.url`, `smtp.relays[1].url`), for
    /// messages.
    pub key: String,
    /// The URL: shown only redacted.
    pub url: RelayUrl,
    /// What the URL names.
    pub to: Destination,
    /// Its TLS settings: its own, or `[smtp.tls]`'s.
    pub tls: TlsSettings,
    /// The settings key of [`Self::tls`] (`smtp.tls`, `smtp.relays[1].tls`),
    /// for messages.
    pub tls_key: String,
}

impl Relay {
    /// [`Self::tls`], loaded: what its TLS trusts.
    pub fn link_tls(&self) -> Result<LinkTls, SettingsError> {
        load_tls(&self.tls, &self.tls_key)
    }

    /// Checks that credentials can never go out unencrypted and that TLS
    /// files go with a URL that uses TLS; `Ok(Some(warning))` when mail
    /// to it may travel in clear (a relay on another host that is not
    /// required to encrypt).
    pub(super) fn check_transport(&self) -> Result<Option<String>, SettingsError> {
        let invalid = |m: String| Err(SettingsError::Invalid(m));
        let Destination::Smtp(server) = &self.to else {
            return Ok(None);
        };
        let (shown, key) = (&self.url, &self.tls_key);
        // A relay's own `tls` must be used; `[smtp.tls]` may be shared by
        // relays of which some do not use TLS (Settings checks that one does).
        let own = key != "smtp.tls";
        if self.tls.client_cert.is_some() || self.tls.client_key.is_some() {
            return invalid(format!(
                "{key}.client_cert: SMTP relays take no client certificate; authenticate with \
                 user:pass@ in the URL (over TLS)"
            ));
        }
        let local = server.is_local();
        let credentials = server.credentials.is_some();
        match server.tls {
            TlsMode::Off if credentials && !local => invalid(format!(
                "{shown}: tls=none with credentials would send the password unencrypted; use \
                 ?tls=required (STARTTLS) or smtps://, or drop the credentials (tls=none with \
                 credentials is allowed only for a relay on a loopback address)"
            )),
            TlsMode::Off if own => invalid(format!(
                "{key} is set but {shown} says tls=none; use ?tls=required or smtps://"
            )),
            TlsMode::Opportunistic if credentials => invalid(format!(
                "{shown}: tls=opportunistic with credentials would send the password in clear \
                 to anyone who strips STARTTLS from the relay's reply; credentials imply \
                 tls=required: drop ?tls=opportunistic, or use smtps://"
            )),
            TlsMode::Off if !local => Ok(Some(format!(
                "smtp relay {}: mail (and the codes in it) travels unencrypted: {shown} says \
                 tls=none; set ?tls=required or use smtps://",
                self.name
            ))),
            TlsMode::Unset | TlsMode::Opportunistic if !credentials && !local => Ok(Some(format!(
                "smtp relay {}: mail (and the codes in it) may travel unencrypted: \
                     {shown} encrypts only when the relay offers STARTTLS, which anyone on \
                     the path can strip; set ?tls=required or use smtps://",
                self.name
            ))),
            _ => Ok(None),
        }
    }

    /// Whether mail to it is never encrypted: `file://`, or `tls=none`.
    fn is_plain(&self) -> bool {
        match &self.to {
            Destination::Outbox(_) => true,
            Destination::Smtp(server) => server.tls == TlsMode::Off,
        }
    }
}

/// Most `[[smtp.relays]]`.
pub const MAX_RELAYS: usize = 16;

impl SmtpSettings {
    /// The relays in order of preference: `[[smtp.relays]]`, or those of
    /// `smtp.url` (named `host:port`; a `file://` URL, alone, is named
    /// `outbox`). Checks what [`Settings::validate`] checks for them.
    ///
    /// [`Settings::validate`]: super::Settings::validate
    pub fn relay_list(&self) -> Result<Vec<Relay>, SettingsError> {
        match (self.url.is_empty(), self.relays.is_empty()) {
            (false, false) => Err(SettingsError::Invalid(
                "smtp.url and [[smtp.relays]] are both set; smtp.url is the shorthand for \
                 one relay: list every relay under [[smtp.relays]] and remove smtp.url \
                 (and MAILGATE__SMTP__URL), or keep only smtp.url"
                    .into(),
            )),
            (true, true) => Err(SettingsError::Invalid(
                "no SMTP relay: set smtp.url (MAILGATE__SMTP__URL) or list relays under \
                 [[smtp.relays]]"
                    .into(),
            )),
            (false, true) => self.url_relays(),
            (true, false) => self.listed_relays(),
        }
    }

    /// The relays of `smtp.url`: one URL, or several separated by commas
    /// (the way to keep every relay's credentials in MAILGATE__SMTP__URL),
    /// named `host:port`.
    fn url_relays(&self) -> Result<Vec<Relay>, SettingsError> {
        let invalid = |m: String| Err(SettingsError::Invalid(m));
        let urls = self.url.each();
        if urls.len() > MAX_RELAYS {
            return invalid(format!(
                "smtp.url lists {} relays; at most {MAX_RELAYS}",
                urls.len()
            ));
        }
        let mut out: Vec<Relay> = Vec::with_capacity(urls.len());
        for url in urls {
            let to = destination("smtp.url", url)?;
            let name = match to {
                Destination::Outbox(_) if urls.len() > 1 => return invalid(alone("smtp.url", url)),
                Destination::Outbox(_) => "outbox".to_owned(),
                Destination::Smtp(server) => server.address(),
            };
            if out.iter().any(|o| o.name == name) {
                return invalid(format!(
                    "smtp.url lists {name} twice; to reach one host:port two ways, \
                     name each under [[smtp.relays]]"
                ));
            }
            out.push(Relay {
                name,
                key: "smtp.url".into(),
                url: url.clone(),
                to: to.clone(),
                tls: self.tls.clone(),
                tls_key: "smtp.tls".into(),
            });
        }
        Ok(out)
    }

    /// The relays of `[[smtp.relays]]`, each with a unique name and its TLS
    /// (its own, or `[smtp.tls]`).
    fn listed_relays(&self) -> Result<Vec<Relay>, SettingsError> {
        let invalid = |m: String| Err(SettingsError::Invalid(m));
        if self.relays.len() > MAX_RELAYS {
            return invalid(format!(
                "[[smtp.relays]] lists {} relays; at most {MAX_RELAYS}",
                self.relays.len()
            ));
        }
        let mut out: Vec<Relay> = Vec::with_capacity(self.relays.len());
        for (i, r) in self.relays.iter().enumerate() {
            let key = format!("smtp.relays[{i}].url");
            let server = match destination(&key, &r.url)? {
                Destination::Smtp(server) => server,
                Destination::Outbox(_) => return invalid(alone(&key, &r.url)),
            };
            let name = match &r.name {
                None => server.address(),
                Some(name) => r.checked_name(i, name, server)?,
            };
            if let Some(j) = out.iter().position(|o| o.name == name) {
                return invalid(format!(
                    "smtp.relays[{j}] and smtp.relays[{i}] are both named {name:?}; give each \
                     relay a name of its own (name = \"...\")"
                ));
            }
            let (tls, tls_key) = match &r.tls {
                Some(own) => (own.clone(), format!("smtp.relays[{i}].tls")),
                None => (self.tls.clone(), "smtp.tls".to_owned()),
            };
            out.push(Relay {
                name,
                key,
                url: r.url.clone(),
                to: Destination::Smtp(server.clone()),
                tls,
                tls_key,
            });
        }
        Ok(out)
    }

    /// Checks the section on its own: the relays, a bounded timeout, the
    /// circuit settings, TLS settings that go with the URLs, and the pool.
    pub(super) fn validate(&self) -> Result<(), SettingsError> {
        for url in self.url.each() {
            check_userinfo("smtp.url", url)?;
        }
        check_bounds(
            "smtp.timeout",
            self.timeout,
            Duration::from_secs(1),
            super::MAX_TIMEOUT,
        )?;
        let relays = self.relay_list()?;
        self.circuit.validate()?;
        self.check_transport(&relays)?;
        if self.pool_size == 0 || self.pool_size > 1_000 {
            return Err(SettingsError::Invalid(
                "smtp.pool_size must be 1 to 1000".into(),
            ));
        }
        if let Some(canary) = &self.canary
            && let Err(e) = crate::domain::EmailAddress::parse(canary)
        {
            return Err(SettingsError::Invalid(format!(
                "smtp.canary {canary:?}: {e} (an address every relay takes, e.g. \
                 \"postmaster@your-domain.example\")"
            )));
        }
        Ok(())
    }

    /// No relay's credentials can go out unencrypted, every relay's TLS
    /// settings load and go with a URL that uses TLS, and `[smtp.tls]`, if
    /// set, is used by a relay that encrypts.
    fn check_transport(&self, relays: &[Relay]) -> Result<(), SettingsError> {
        for relay in relays {
            relay.check_transport()?;
            if relay.tls.is_set() {
                relay.link_tls()?;
            }
        }
        let shared_unused = relays
            .iter()
            .all(|r| r.tls_key != "smtp.tls" || r.is_plain());
        if self.tls.is_set() && shared_unused {
            return Err(SettingsError::Invalid(
                "[smtp.tls] is set but no relay that uses it encrypts (file://, tls=none, or \
                 relays with a tls of their own); remove [smtp.tls], or use ?tls=required or \
                 smtps://"
                    .into(),
            ));
        }
        Ok(())
    }

    /// What the relays allow that an operator should know of: one line for
    /// each relay to which mail may travel in clear.
    pub(super) fn warnings(&self) -> Vec<String> {
        (self.relay_list().unwrap_or_default().iter())
            .filter_map(|r| r.check_transport().ok().flatten())
            .collect()
    }
}

impl RelaySettings {
    /// `name`, the `i`th relay's own name, if it is fit to show: a metric
    /// label that does not hold the relay's password.
    fn checked_name(
        &self,
        i: usize,
        name: &str,
        server: &SmtpServer,
    ) -> Result<String, SettingsError> {
        let fit = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-:[]".contains(c));
        if !fit {
            return Err(SettingsError::Invalid(format!(
                "smtp.relays[{i}].name {name:?}: 1 to 64 characters of letters, \
                 digits and . _ - : [ ] (it is a metric label)"
            )));
        }
        // A name is shown everywhere: never the relay's password.
        let password = (server.credentials.as_ref())
            .map(|c| &*c.password)
            .filter(|p| p.len() >= 3);
        if password.is_some_and(|p| name.contains(p)) {
            return Err(SettingsError::Invalid(format!(
                "smtp.relays[{i}].name holds the relay's password; names are \
                 shown in metrics, logs and /readyz"
            )));
        }
        Ok(name.to_owned())
    }
}

impl CircuitSettings {
    /// Both bounded: a circuit opens after 1 to 1000 failures and cools
    /// down for 100 ms to an hour.
    fn validate(&self) -> Result<(), SettingsError> {
        if !(1..=1_000).contains(&self.failures) {
            return Err(SettingsError::Invalid(format!(
                "smtp.circuit.failures is {}; it must be 1 to 1000 (relay-level failures in a \
                 row that open a relay's circuit)",
                self.failures
            )));
        }
        check_bounds(
            "smtp.circuit.cool_down",
            self.cool_down,
            Duration::from_millis(100),
            Duration::from_secs(3600),
        )
    }
}

/// What relay `url` (at settings `key`) names, or why it names nothing,
/// said with the key and the URL redacted.
fn destination<'u>(key: &str, url: &'u RelayUrl) -> Result<&'u Destination, SettingsError> {
    check_userinfo(key, url)?;
    url.destination()
        .map_err(|why| SettingsError::Invalid(format!("{key} {}: {why}", super::relay::shown(url))))
}

/// Why a `file://` URL at `key` is refused: it is never one relay of several.
fn alone(key: &str, url: &RelayUrl) -> String {
    format!(
        "{key} {url}: file:// cannot be one of several relays; use smtp.url = \"file://DIR\" alone"
    )
}

fn default_pool_size() -> u32 {
    16
}
fn default_smtp_timeout() -> Duration {
    Duration::from_secs(10)
}
