//! A relay's URL, read once when it is set: where mail goes (a directory
//! of `.eml` files, or an SMTP relay's address, encryption and
//! credentials), so neither the checks nor the mailer parse it again.

use std::path::PathBuf;

use serde::Deserialize;

use crate::redact::{Secret, SecretUrl, url_list};

/// One relay's URL (`[[smtp.relays]]`'s `url`, or one of `smtp.url`'s):
/// the URL, shown only redacted, and what it names (or why it names
/// nothing), read when it is set. Deserialized as a string.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(from = "SecretUrl")]
pub struct RelayUrl {
    url: SecretUrl,
    to: Result<Destination, String>,
}

/// `smtp.url`: empty, one relay URL, or several separated by commas (in
/// order of preference), each read when it is set.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(from = "SecretUrl")]
pub struct RelayUrls {
    url: SecretUrl,
    each: Vec<RelayUrl>,
}

/// Where a relay URL sends mail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// `file://DIR`: each mail is written to `DIR` as an `.eml` file
    /// (`file://outbox` is `./outbox`, `file:///var/mail` an absolute path).
    Outbox(PathBuf),
    /// `smtp://` or `smtps://`: an SMTP relay.
    Smtp(SmtpServer),
}

/// An SMTP relay as its URL names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmtpServer {
    /// The host name or address (an IPv6 address without brackets).
    pub host: String,
    /// The URL's port, or the default of its encryption (25; 587 with
    /// `tls=required`; 465 for `smtps://`).
    pub port: u16,
    /// What the URL says about encryption.
    pub tls: TlsMode,
    /// `user:pass@`, percent-decoded; `None` without a password (a user
    /// without one is refused when the URL is read).
    pub credentials: Option<Credentials>,
}

/// How a relay URL asks for encryption (`smtps://`, or `smtp://` and its
/// first `tls=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// `smtps://`: TLS from the first byte.
    Implicit,
    /// `smtp://` with no `tls=`: STARTTLS when offered, required with
    /// credentials.
    Unset,
    /// `smtp://…?tls=opportunistic`: STARTTLS when offered.
    Opportunistic,
    /// `smtp://…?tls=required`: STARTTLS or no session.
    Required,
    /// `smtp://…?tls=none`: never encrypted.
    Off,
}

/// A relay's user and password, percent-decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The user name.
    pub user: String,
    /// The password: `Debug` never shows it.
    pub password: Secret,
}

impl RelayUrl {
    /// What the URL names, or what is wrong with it (never quoting the
    /// password).
    pub fn destination(&self) -> Result<&Destination, &str> {
        self.to.as_ref().map_err(String::as_str)
    }
}

impl RelayUrls {
    /// Each URL of the list, in order; none when `smtp.url` is empty.
    pub fn each(&self) -> &[RelayUrl] {
        &self.each
    }
}

impl SmtpServer {
    /// `host:port` (`[v6]:port`): the relay's default name, never holding
    /// the credentials.
    pub fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// Whether the relay is this machine (`localhost`, a loopback
    /// address): the only one credentials may go to unencrypted.
    pub fn is_local(&self) -> bool {
        crate::tls::is_loopback(&self.host)
    }

    /// Reads an `smtp://` or `smtps://` URL.
    fn parse(url: &url::Url) -> Result<Self, String> {
        let host = match url.host() {
            Some(url::Host::Domain(d)) if is_host_name(d) => d.to_owned(),
            // The URL parser takes almost any text as an smtp:// host: a
            // list's separator or a stray comma would load and then fail
            // every send.
            Some(url::Host::Domain(d)) => {
                return Err(format!(
                    "host {d:?} is not a host name (letters, digits, '-' and '_' between \
                     dots); several relays are separated by commas, each with its scheme"
                ));
            }
            Some(url::Host::Ipv4(ip)) => ip.to_string(),
            Some(url::Host::Ipv6(ip)) => ip.to_string(),
            None => return Err("no host".into()),
        };
        // The first tls= counts.
        let tls_param = url
            .query_pairs()
            .find(|(k, _)| k == "tls")
            .map(|(_, v)| v.into_owned());
        let tls = match (url.scheme(), tls_param.as_deref()) {
            // smtps:// is encrypted whatever its tls= says.
            ("smtps", None | Some("opportunistic" | "required" | "none")) => TlsMode::Implicit,
            ("smtp", None) => TlsMode::Unset,
            ("smtp", Some("opportunistic")) => TlsMode::Opportunistic,
            ("smtp", Some("required")) => TlsMode::Required,
            ("smtp", Some("none")) => TlsMode::Off,
            (_, Some(other)) => {
                return Err(format!(
                    "tls={other:?}; use tls=required, opportunistic or none"
                ));
            }
            (other, None) => return Err(format!("{other}:// is not smtp:// or smtps://")),
        };
        let port = url.port().unwrap_or(match tls {
            TlsMode::Implicit => 465,
            TlsMode::Required => 587,
            _ => 25,
        });
        if port == 0 {
            return Err("port 0 is no relay's port".into());
        }
        Ok(Self {
            host,
            port,
            tls,
            credentials: Credentials::of(url)?,
        })
    }
}

/// Whether `host` is a host name: labels of letters, digits, `-` and `_`
/// between dots (a trailing dot allowed).
fn is_host_name(host: &str) -> bool {
    let labels = host.strip_suffix('.').unwrap_or(host);
    !labels.is_empty()
        && labels.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        })
}

/// A relay URL for a message about what is wrong with it: its whole
/// userinfo hidden, user and all (in a list split at `,scheme://`, a
/// password that holds such a run shows its tail as the next URL's user),
/// and the rest redacted as everywhere.
pub(super) fn shown(url: &str) -> String {
    let hidden = match url.split_once("://") {
        Some((scheme, rest)) => match rest.rsplit_once('@') {
            Some((_, after)) => format!("{scheme}://***@{after}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    };
    crate::redact::redact_url(&hidden)
}

impl Credentials {
    /// The URL's `user:pass@`, percent-decoded (a `+` is a plus, as in
    /// any URL's userinfo).
    fn of(url: &url::Url) -> Result<Option<Self>, String> {
        let Some(password) = url.password() else {
            if url.username().is_empty() {
                return Ok(None);
            }
            return Err(
                "a user without a password; give both (user:pass@) or neither \
                        (no AUTH is done without a password)"
                    .into(),
            );
        };
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8()
                .map(|s| s.into_owned())
                .map_err(|_| "the user or password is not UTF-8 once percent-decoded".to_owned())
        };
        Ok(Some(Self {
            user: decode(url.username())?,
            password: decode(password)?.into(),
        }))
    }
}

impl Destination {
    /// Reads a relay URL: `file://DIR`, `smtp://` or `smtps://`.
    fn parse(url: &str) -> Result<Self, String> {
        let parsed = url::Url::parse(url).map_err(|e| e.to_string())?;
        match parsed.scheme() {
            "file" => Ok(Destination::Outbox(PathBuf::from(format!(
                "{}{}",
                parsed.host_str().unwrap_or(""),
                parsed.path()
            )))),
            "smtp" | "smtps" => SmtpServer::parse(&parsed).map(Destination::Smtp),
            other => Err(format!("{other}:// is not smtp:// or smtps://")),
        }
    }
}

impl From<SecretUrl> for RelayUrl {
    fn from(url: SecretUrl) -> Self {
        let to = Destination::parse(&url);
        Self { url, to }
    }
}

impl From<SecretUrl> for RelayUrls {
    fn from(url: SecretUrl) -> Self {
        let each = if url.is_empty() {
            Vec::new()
        } else {
            url_list(&url)
                .into_iter()
                .map(|one| RelayUrl::from(SecretUrl::from(one)))
                .collect()
        };
        Self { url, each }
    }
}

url_type!(RelayUrl);
url_type!(RelayUrls);

#[cfg(test)]
mod tests {
    use super::*;

    fn smtp(url: &str) -> SmtpServer {
        match RelayUrl::from(url).destination() {
            Ok(Destination::Smtp(s)) => s.clone(),
            other => panic!("{url}: {other:?}"),
        }
    }

    #[test]
    fn ports_follow_the_encryption() {
        assert_eq!(smtp("smtp://a.example").port, 25);
        assert_eq!(smtp("smtp://a.example?tls=required").port, 587);
        assert_eq!(smtp("smtps://a.example").port, 465);
        assert_eq!(smtp("smtps://a.example:2465").port, 2465);
        assert_eq!(smtp("smtp://[::1]:2525").address(), "[::1]:2525");
        assert!(smtp("smtp://[::1]:2525").is_local());
        // The first tls= counts.
        let s = smtp("smtp://a.example?tls=none&tls=required");
        assert_eq!((s.tls, s.port), (TlsMode::Off, 25));
    }

    #[test]
    fn credentials_are_percent_decoded_and_a_plus_is_a_plus() {
        let s = smtp("smtp://us%40er:p%2Fa+ss%20w@a.example?tls=required");
        let c = s.credentials.expect("credentials");
        assert_eq!(c.user, "us@er");
        assert_eq!(&*c.password, "p/a+ss w");
        assert!(!format!("{c:?}").contains("a+ss"));
    }

    #[test]
    fn what_is_not_a_relay_is_said_without_the_password() {
        for (url, says) in [
            ("http://u:Zq8pXk2m@a.example", "http:// is not smtp://"),
            ("smtp://u@a.example", "a user without a password"),
            ("smtp://a.example?tls=NONE", "tls=\"NONE\""),
            ("smtp://u:%FF@a.example", "not UTF-8"),
            ("smtp:///nohost", "no host"),
            ("smtp://a.example;smtp://b.example", "not a host name"),
            ("smtp://a.example%2C", "not a host name"),
            ("smtp://a.example,", "not a host name"),
            ("smtp://a.example:0", "port 0"),
            ("smtps://a.example?tls=requierd", "tls=\"requierd\""),
        ] {
            let parsed = RelayUrl::from(url);
            let why = parsed.destination().expect_err(url);
            assert!(why.contains(says), "{url}: {why}");
            assert!(!why.contains("Zq8pXk2m"));
            assert!(!format!("{parsed:?}").contains("Zq8pXk2m"));
        }
        assert_eq!(
            RelayUrl::from("file://outbox").destination(),
            Ok(&Destination::Outbox(PathBuf::from("outbox")))
        );
        assert_eq!(
            RelayUrl::from("file:///var/mail").destination(),
            Ok(&Destination::Outbox(PathBuf::from("/var/mail")))
        );
    }

    #[test]
    fn a_list_is_read_url_by_url() {
        let list = RelayUrls::from("smtp://a.example, smtps://u:p@b.example");
        let names: Vec<_> = list
            .each()
            .iter()
            .map(|u| match u.destination() {
                Ok(Destination::Smtp(s)) => s.address(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(names, ["a.example:25", "b.example:465"]);
        assert!(RelayUrls::default().each().is_empty());
    }
}
