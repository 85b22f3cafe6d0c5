//! Opening a session: where the relay is and how to reach it, as the
//! settings read its URL ([`Endpoint::new`]), then connect, TLS, the greeting,
//! EHLO, STARTTLS and AUTH ([`Endpoint::open`]).

use std::time::Duration;

use lettre::transport::smtp::authentication::{Credentials, DEFAULT_MECHANISMS};
use lettre::transport::smtp::client::{
    AsyncSmtpConnection, Certificate, CertificateStore, Tls, TlsParameters,
};
use lettre::transport::smtp::extension::ClientId;
use tokio::time::Instant;

use super::{Connection, Failed, Phase, discard, step};
use crate::mailer::MailError;
use crate::settings::{SmtpServer, TlsMode};
use crate::tls::LinkTls;

/// Where and how to reach the relay, as the settings read its URL.
pub(in crate::mailer) struct Endpoint {
    host: String,
    port: u16,
    tls: Tls,
    credentials: Option<Credentials>,
    /// The relay is this machine (`localhost`, a loopback address): the
    /// only one credentials may go to unencrypted (`tls=none`).
    local: bool,
    /// The settings table of its TLS (`smtp.tls`, `smtp.relays[1].tls`),
    /// named by a TLS failure's message.
    pub(super) tls_table: String,
    hello: ClientId,
    /// The send deadline, only to name it in error messages.
    pub(super) timeout: Duration,
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
    /// The endpoint of `server`, as its URL was read by the settings.
    /// Certificates are verified against `trust`.
    pub(in crate::mailer) fn new(
        server: &SmtpServer,
        timeout: Duration,
        trust: &LinkTls,
    ) -> Result<Self, MailError> {
        let credentials = server
            .credentials
            .as_ref()
            .map(|c| Credentials::new(c.user.clone(), c.password.to_string()));
        Ok(Self {
            tls: tls(server, trust)?,
            credentials,
            port: server.port,
            host: server.host.clone(),
            local: server.is_local(),
            tls_table: trust.table().to_owned(),
            hello: ClientId::default(),
            timeout,
        })
    }

    /// Opens a session ready for MAIL FROM: connects (implicit TLS for
    /// `smtps://`), reads the greeting, says EHLO, upgrades with STARTTLS
    /// when offered (or fails when required and not offered), and
    /// authenticates when credentials are set. All within `deadline`.
    pub(in crate::mailer) async fn open(&self, deadline: Instant) -> Result<Connection, Failed> {
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

/// lettre's TLS mode for `server`. With credentials, TLS is required
/// unless `tls=none` says otherwise (which settings allow only for this
/// machine): opportunistic STARTTLS would hand the password to whoever
/// strips STARTTLS from the relay's EHLO reply.
fn tls(server: &SmtpServer, trust: &LinkTls) -> Result<Tls, MailError> {
    let params = || tls_parameters(&server.host, trust);
    let credentials = server.credentials.is_some();
    Ok(match server.tls {
        TlsMode::Implicit => Tls::Wrapper(params()?),
        TlsMode::Unset | TlsMode::Opportunistic if credentials => Tls::Required(params()?),
        TlsMode::Unset | TlsMode::Opportunistic => Tls::Opportunistic(params()?),
        TlsMode::Required => Tls::Required(params()?),
        TlsMode::Off => Tls::None,
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

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// An endpoint from `url`, bundled roots, a 1 s timeout.
    pub(in crate::mailer) fn endpoint(url: &str) -> Endpoint {
        let url = crate::settings::RelayUrl::from(url);
        let Ok(crate::settings::Destination::Smtp(server)) = url.destination() else {
            panic!("not an SMTP relay: {url}");
        };
        Endpoint::new(
            server,
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
}
