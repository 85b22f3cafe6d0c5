//! `[smtp]`: the relays mail goes to, in order of preference, and the
//! circuit breaker that skips one that fails.

use std::time::Duration;

use serde::Deserialize;

use super::{SettingsError, check_bounds, check_userinfo, human_duration, load_tls};
use crate::redact::{SecretUrl, redact_url, url_list};
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
    /// the relays are listed there (setting both is refused).
    #[serde(default)]
    pub url: SecretUrl,
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
}

/// One `[[smtp.relays]]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelaySettings {
    /// `smtp://` or `smtps://`, as `smtp.url` (not `file://`).
    pub url: SecretUrl,
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

/// A relay as the mailer uses it: its name and URL, checked.
#[derive(Debug, Clone)]
pub struct Relay {
    /// Unique among the relays; safe to show (no credentials).
    pub name: String,
    /// The URL, credentials and all: shown only redacted (see [`SecretUrl`]).
    pub url: SecretUrl,
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
        let Ok(url) = url::Url::parse(&self.url) else {
            return Ok(None);
        };
        let shown = redact_url(&self.url);
        let key = &self.tls_key;
        // A relay's own `tls` must be used; `[smtp.tls]` may be shared by
        // relays of which some do not use TLS (Settings checks that one does).
        let own = key != "smtp.tls";
        if url.scheme() == "file" {
            return Ok(None);
        }
        if self.tls.client_cert.is_some() || self.tls.client_key.is_some() {
            return invalid(format!(
                "{key}.client_cert: SMTP relays take no client certificate; authenticate with \
                 user:pass@ in the URL (over TLS)"
            ));
        }
        let tls = url
            .query_pairs()
            .find(|(k, _)| k == "tls")
            .map(|(_, v)| v.into_owned());
        let local = url.host_str().is_some_and(crate::tls::is_loopback);
        let credentials = url.password().is_some();
        if !url.username().is_empty() && !credentials {
            return invalid(format!(
                "{shown}: a user without a password; give both (user:pass@) or neither \
                 (no AUTH is done without a password)"
            ));
        }
        if let Some(other) = tls
            .as_deref()
            .filter(|t| !["required", "opportunistic", "none"].contains(t))
        {
            return invalid(format!(
                "{shown}: tls={other:?}; use tls=required, opportunistic or none"
            ));
        }
        match (url.scheme(), tls.as_deref()) {
            ("smtp", Some("none")) if credentials && !local => invalid(format!(
                "{shown}: tls=none with credentials would send the password unencrypted; use \
                 ?tls=required (STARTTLS) or smtps://, or drop the credentials (tls=none with \
                 credentials is allowed only for a relay on a loopback address)"
            )),
            ("smtp", Some("none")) if own => invalid(format!(
                "{key} is set but {shown} says tls=none; use ?tls=required or smtps://"
            )),
            ("smtp", Some("opportunistic")) if credentials => invalid(format!(
                "{shown}: tls=opportunistic with credentials would send the password in clear \
                 to anyone who strips STARTTLS from the relay's reply; credentials imply \
                 tls=required: drop ?tls=opportunistic, or use smtps://"
            )),
            ("smtp", Some("none")) if !local => Ok(Some(format!(
                "smtp relay {}: mail (and the codes in it) travels unencrypted: {shown} says \
                 tls=none; set ?tls=required or use smtps://",
                self.name
            ))),
            ("smtp", None | Some("opportunistic")) if !credentials && !local => Ok(Some(format!(
                "smtp relay {}: mail (and the codes in it) may travel unencrypted: \
                     {shown} encrypts only when the relay offers STARTTLS, which anyone on \
                     the path can strip; set ?tls=required or use smtps://",
                self.name
            ))),
            _ => Ok(None),
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

    /// The relays of `smtp.url`: one URL, or several separated by commas.
    fn url_relays(&self) -> Result<Vec<Relay>, SettingsError> {
        let invalid = |m: String| Err(SettingsError::Invalid(m));
        let urls = url_list(&self.url);
        if let [url] = urls[..] {
            check_userinfo("smtp.url", url)?;
            let name = if url.starts_with("file:") {
                "outbox".to_owned()
            } else {
                relay_address(url).unwrap_or_else(|_| "smtp".to_owned())
            };
            return Ok(vec![self.shared_tls_relay(name, url)]);
        }
        // Several URLs separated by commas: relays in order of preference,
        // named host:port (the way to keep every relay's credentials in
        // MAILGATE__SMTP__URL).
        if urls.len() > MAX_RELAYS {
            return invalid(format!(
                "smtp.url lists {} relays; at most {MAX_RELAYS}",
                urls.len()
            ));
        }
        let mut out: Vec<Relay> = Vec::with_capacity(urls.len());
        for url in urls {
            check_userinfo("smtp.url", url)?;
            let name = relay_address(url).map_err(|why| {
                SettingsError::Invalid(format!("smtp.url {}: {why}", redact_url(url)))
            })?;
            if out.iter().any(|o| o.name == name) {
                return invalid(format!(
                    "smtp.url lists {name} twice; to reach one host:port two ways, \
                     name each under [[smtp.relays]]"
                ));
            }
            out.push(self.shared_tls_relay(name, url));
        }
        Ok(out)
    }

    /// A relay of `smtp.url`: it uses `[smtp.tls]`.
    fn shared_tls_relay(&self, name: String, url: &str) -> Relay {
        Relay {
            name,
            url: url.into(),
            tls: self.tls.clone(),
            tls_key: "smtp.tls".into(),
        }
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
            check_userinfo(&key, &r.url)?;
            let address = relay_address(&r.url).map_err(|why| {
                SettingsError::Invalid(format!("{key} {}: {why}", redact_url(&r.url)))
            })?;
            let name = match &r.name {
                None => address,
                Some(name) => r.checked_name(i, name)?,
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
                url: r.url.clone(),
                tls,
                tls_key,
            });
        }
        Ok(out)
    }

    /// Checks the section on its own: the relays, a bounded timeout, the
    /// circuit settings, TLS settings that go with the URLs, and the pool.
    pub(super) fn validate(&self) -> Result<(), SettingsError> {
        for url in url_list(&self.url) {
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
        let plain = |r: &Relay| {
            url::Url::parse(&r.url).is_ok_and(|u| {
                u.scheme() == "file"
                    || u.query_pairs()
                        .find(|(k, _)| k == "tls")
                        .is_some_and(|(_, v)| v == "none")
            })
        };
        let shared_unused = relays.iter().all(|r| r.tls_key != "smtp.tls" || plain(r));
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
    fn checked_name(&self, i: usize, name: &str) -> Result<String, SettingsError> {
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
        let password = url::Url::parse(&self.url)
            .ok()
            .and_then(|u| u.password().map(str::to_owned))
            .filter(|p| p.len() >= 3);
        if password.is_some_and(|p| name.contains(&p)) {
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

/// A relay URL's `host:port` (`[v6]:port`), with the scheme's default
/// port (25, 587 with `?tls=required`, 465 for `smtps://`), or why it is
/// not an SMTP relay URL. Never holds the credentials.
fn relay_address(url: &str) -> Result<String, String> {
    let parsed = url::Url::parse(url).map_err(|e| e.to_string())?;
    // The first tls= counts, as the mailer reads it.
    let required = parsed
        .query_pairs()
        .find(|(k, _)| k == "tls")
        .is_some_and(|(_, v)| v == "required");
    let default_port = match parsed.scheme() {
        "smtps" => 465,
        "smtp" if required => 587,
        "smtp" => 25,
        "file" => {
            return Err(
                "file:// cannot be one of several relays; use smtp.url = \"file://DIR\" alone"
                    .into(),
            );
        }
        other => return Err(format!("{other}:// is not smtp:// or smtps://")),
    };
    let port = parsed.port().unwrap_or(default_port);
    match parsed.host() {
        Some(url::Host::Ipv6(ip)) => Ok(format!("[{ip}]:{port}")),
        Some(host) => Ok(format!("{host}:{port}")),
        None => Err("no host".into()),
    }
}

fn default_pool_size() -> u32 {
    16
}
fn default_smtp_timeout() -> Duration {
    Duration::from_secs(10)
}
