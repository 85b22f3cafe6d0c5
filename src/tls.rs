//! TLS for every link mailgate opens (RabbitMQ, Redis, the SMTP relays):
//! which certificate authorities a link trusts, and the client certificate
//! it shows.
//!
//! One rustls crypto provider is in the build, ring, installed once by
//! [`install_provider`]. A link trusts the PEM bundle of its own `ca_file`
//! and nothing else, or, without one, the roots its `roots` names:
//! Mozilla's, compiled in (`bundled`, the default), or the operating
//! system's store (`system`, read by rustls-native-certs, which honours
//! `SSL_CERT_FILE` and `SSL_CERT_DIR`). Server names are always verified;
//! no setting turns verification off.
//!
//! The files are read and checked when settings load ([`TlsSettings::load`]),
//! so a missing file, a PEM without a certificate or a key that does not
//! match its certificate stops the process at start-up with the key named.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;

/// Installs ring as the process's rustls crypto provider. Idempotent; the
/// first call wins. Every connection's TLS is built on it, so it must run
/// before the first one; the binary calls it first thing, and each link's
/// TLS setup calls it again, so a library user cannot forget it.
pub fn install_provider() {
    // Fails only when a provider is installed already: the same one, or
    // one a host program chose, which is then kept.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Whether `url` (RabbitMQ's or Redis's) names a TLS scheme: `amqps`,
/// `rediss` (and its `+sentinel`, `+cluster` forms), or `valkeys`.
pub fn is_tls_url(url: &str) -> bool {
    let scheme = url
        .trim_start()
        .split_once("://")
        .map_or(String::new(), |(s, _)| s.to_ascii_lowercase());
    scheme == "amqps" || scheme.starts_with("rediss") || scheme.starts_with("valkeys")
}

/// Whether `host` (as a URL holds it: a name, an IPv4 address, or an IPv6
/// address without brackets) is this machine: `localhost` or a loopback
/// address. Traffic to it never crosses a network. An IPv4-mapped IPv6
/// address is not counted, whatever it maps.
pub fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Which certificate authorities a link without `ca_file` trusts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TrustRoots {
    /// Mozilla's roots, compiled into the binary (webpki-roots): the same
    /// on every host, and present in an image without a CA store.
    #[default]
    Bundled,
    /// The operating system's store (`/etc/ssl/certs` on Debian), where a
    /// company CA is usually installed; `SSL_CERT_FILE` and `SSL_CERT_DIR`
    /// name other files.
    System,
}

/// One link's TLS settings: `[amqp.tls]`, `[redis.tls]`, `[smtp.tls]`, or
/// a relay's `tls`. All optional; files are read when settings load.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsSettings {
    /// The roots the link trusts when `ca_file` is not set.
    pub roots: TrustRoots,
    /// A PEM bundle of CA certificates: the link trusts these and no other
    /// (not the bundled or system roots).
    pub ca_file: Option<PathBuf>,
    /// A PEM certificate chain the link shows the server (mutual TLS),
    /// leaf first. Needs `client_key`.
    pub client_cert: Option<PathBuf>,
    /// The PEM private key (PKCS#8, PKCS#1 or SEC1) of `client_cert`.
    pub client_key: Option<PathBuf>,
}

/// Why a link's TLS files cannot be used. Each names the settings key.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("{key} {path}: cannot read it")]
    Read {
        /// The settings key that names the file.
        key: String,
        /// The file.
        path: String,
        /// The system's error.
        #[source]
        why: std::io::Error,
    },
    /// A file was read but does not hold what its key needs.
    #[error("{key} {path}: {why}")]
    Content {
        /// The settings key that names the file.
        key: String,
        /// The file.
        path: String,
        /// What is wrong with it.
        why: String,
    },
    /// The settings make no sense together (a key without its pair, a store
    /// without certificates).
    #[error("{0}")]
    Invalid(String),
}

/// What a link trusts and shows, read from its [`TlsSettings`].
/// Cheap to clone.
#[derive(Clone)]
pub struct LinkTls {
    roots: Roots,
    identity: Option<Arc<Identity>>,
    /// The settings table it was read from (`redis.tls`), for messages.
    table: Arc<str>,
}

/// Names the type only: it holds a private key.
impl std::fmt::Debug for LinkTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkTls").finish_non_exhaustive()
    }
}

#[derive(Clone)]
enum Roots {
    /// webpki-roots, compiled in.
    Bundled,
    /// Certificates from the system store or from `ca_file`.
    Listed(Arc<Vec<CertificateDer<'static>>>),
}

/// A client certificate chain and its key, in both the forms the clients
/// take.
struct Identity {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    chain_pem: Vec<u8>,
    key_pem: Vec<u8>,
}

impl TlsSettings {
    /// Whether anything is set: the link then needs an encrypted URL.
    pub fn is_set(&self) -> bool {
        *self != Self::default()
    }

    /// Reads and checks the files; `key` names this link's table in errors
    /// (`amqp.tls`). A client certificate and key must come together and
    /// match.
    pub fn load(&self, key: &str) -> Result<LinkTls, TlsError> {
        install_provider();
        if self.ca_file.is_some() && self.roots != TrustRoots::default() {
            return Err(TlsError::Invalid(format!(
                "{key}.ca_file and {key}.roots are both set; a link with a ca_file trusts \
                 that bundle alone: drop one"
            )));
        }
        let roots = match &self.ca_file {
            Some(path) => {
                let key = format!("{key}.ca_file");
                let pem = read(&key, path)?;
                let certs = certificates(&key, path, &pem)?;
                Roots::Listed(Arc::new(certs))
            }
            None => match self.roots {
                TrustRoots::Bundled => Roots::Bundled,
                TrustRoots::System => Roots::Listed(system_roots().map_err(|why| {
                    TlsError::Invalid(format!("{key}.roots = \"system\": {why}"))
                })?),
            },
        };
        let identity = match (&self.client_cert, &self.client_key) {
            (None, None) => None,
            (Some(cert), Some(private)) => Some(Arc::new(identity(key, cert, private)?)),
            (Some(_), None) | (None, Some(_)) => {
                return Err(TlsError::Invalid(format!(
                    "{key}.client_cert and {key}.client_key go together: set both (mutual TLS) \
                     or neither"
                )));
            }
        };
        Ok(LinkTls {
            roots,
            identity,
            table: key.into(),
        })
    }
}

impl LinkTls {
    /// The compiled-in roots and no client certificate: what a link gets
    /// with no TLS settings (`table` names them in messages).
    pub fn bundled(table: &str) -> Self {
        Self {
            roots: Roots::Bundled,
            identity: None,
            table: table.into(),
        }
    }

    /// The settings table it was read from (`smtp.relays[1].tls`).
    pub fn table(&self) -> &str {
        &self.table
    }

    /// A rustls client configuration for this link (TLS 1.2 and 1.3, the
    /// server's name verified against these roots).
    pub fn client_config(&self) -> Result<Arc<rustls::ClientConfig>, TlsError> {
        install_provider();
        let mut store = rustls::RootCertStore::empty();
        match &self.roots {
            Roots::Bundled => store.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
            Roots::Listed(certs) => {
                store.add_parsable_certificates(certs.iter().cloned());
            }
        }
        let builder = rustls::ClientConfig::builder().with_root_certificates(store);
        let config = match &self.identity {
            None => builder.with_no_client_auth(),
            Some(id) => builder
                .with_client_auth_cert(id.chain.clone(), id.key.clone_key())
                .map_err(|e| TlsError::Invalid(format!("client certificate: {e}")))?,
        };
        Ok(Arc::new(config))
    }

    /// The CA certificates this link trusts (DER), or `None` for the
    /// compiled-in roots (every client has them built in).
    pub fn roots_der(&self) -> Option<&[CertificateDer<'static>]> {
        match &self.roots {
            Roots::Bundled => None,
            Roots::Listed(certs) => Some(certs),
        }
    }

    /// [`Self::roots_der`] as one PEM bundle, for clients that take PEM.
    pub fn roots_pem(&self) -> Option<Vec<u8>> {
        self.roots_der().map(pem_bundle)
    }

    /// The client certificate chain and key, as PEM, if one is set.
    pub fn identity_pem(&self) -> Option<(&[u8], &[u8])> {
        self.identity
            .as_deref()
            .map(|id| (id.chain_pem.as_slice(), id.key_pem.as_slice()))
    }
}

/// The text of `error` and its sources, one per line: what [`explain`]
/// reads (the clients wrap rustls's errors in their own, and some repeat
/// them, so the text is read, not the types).
fn chain_text(error: &(dyn std::error::Error + 'static)) -> String {
    crate::report::causes(error)
        .map(|e| format!("{e}\n"))
        .collect()
}

/// Whether a link shows the server a client certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientCert {
    /// It could, and one is set.
    Shown,
    /// It could, and none is set.
    NotSet,
    /// The link takes none (SMTP relays authenticate with a password).
    NotTaken,
}

/// The alerts a server sends about the client's certificate.
const CERT_ALERTS: [&str; 8] = [
    "CertificateRequired",
    "BadCertificate",
    "UnknownCA",
    "CertificateUnknown",
    "UnsupportedCertificate",
    "CertificateRevoked",
    "CertificateExpired",
    "AccessDenied",
];

/// A TLS failure in `text` (an error's `chain_text`), said as one
/// sentence that names what failed and what to set (`table` is the link's
/// TLS table, e.g. `redis.tls`); `None` when the failure is not one of TLS.
pub fn explain(text: &str, table: &str, client_cert: ClientCert) -> Option<String> {
    let detail = |marker: &str| {
        let start = text.find(marker)?;
        let rest = &text[start..];
        Some(rest[..rest.find('\n').unwrap_or(rest.len())].to_owned())
    };
    if let Some(d) = detail("invalid peer certificate") {
        let lower = d.to_ascii_lowercase();
        let why = if d.contains("UnknownIssuer") || d.contains("BadSignature") {
            format!(
                "the server's certificate is not signed by a CA this link trusts ({d}); set \
                 {table}.ca_file to the PEM of the CA that signed it"
            )
        } else if d.contains("CaUsedAsEndEntity") {
            format!(
                "the server shows a CA certificate as its own ({d}), as a self-signed one made \
                 by `openssl req -x509` is; give the server a certificate signed by a CA, and \
                 that CA as {table}.ca_file"
            )
        } else if lower.contains("expired") {
            format!("the server's certificate has expired ({d}); it must be renewed")
        } else if lower.contains("not valid yet") || d.contains("NotValidYet") {
            format!("the server's certificate is not valid yet ({d}); check both clocks")
        } else if d.contains("NotValidForName") || lower.contains("not valid for name") {
            format!(
                "the server's certificate does not name the host it was reached at ({d}); \
                 reach it by a name the certificate holds"
            )
        } else {
            format!("the server's certificate is refused ({d})")
        };
        return Some(why);
    }
    if let Some(d) = detail("received fatal alert") {
        if !CERT_ALERTS.iter().any(|a| d.contains(a)) {
            return Some(format!(
                "the server refused the TLS handshake ({d}): no TLS version or cipher in \
                 common (mailgate speaks TLS 1.2 and 1.3 with current ciphers)"
            ));
        }
        return Some(match client_cert {
            ClientCert::NotSet => format!(
                "the server refused the TLS handshake ({d}); if it requires a client \
                 certificate, set {table}.client_cert and {table}.client_key to one its CA \
                 signed"
            ),
            ClientCert::Shown => format!(
                "the server refused the TLS handshake ({d}); check that it accepts \
                 {table}.client_cert: signed by a CA it trusts, and made for client \
                 authentication"
            ),
            ClientCert::NotTaken => format!(
                "the server refused the TLS handshake ({d}): it asks for a client \
                 certificate, and SMTP relays are sent none (they take user:pass@)"
            ),
        });
    }
    if let Some(d) = detail("received corrupt message of type InvalidContentType") {
        return Some(format!(
            "the server does not speak TLS on this port ({d}); use the server's TLS port, or \
             a URL without TLS"
        ));
    }
    detail("peer is incompatible").map(|d| format!("the TLS handshake failed ({d})"))
}

/// [`explain`] for a link to `url` with TLS settings `tls`. When the URL
/// uses TLS, two more failures are said with their likely causes: a
/// connection the server closed during the handshake (when the link shows
/// no client certificate: a server that requires one, as a TLS 1.3 server
/// may reset the connection rather than send its alert), and no answer at
/// all (a server that does not speak TLS on that port, or a cluster node
/// whose certificate is refused, which the Redis client reports as a
/// timeout).
pub fn explain_url(
    error: &(dyn std::error::Error + 'static),
    table: &str,
    url: &str,
    tls: &TlsSettings,
) -> Option<String> {
    let text = chain_text(error);
    let client_cert = match tls.client_cert {
        Some(_) => ClientCert::Shown,
        None => ClientCert::NotSet,
    };
    let encrypted = is_tls_url(url);
    explain(&text, table, client_cert).or_else(|| {
        if !encrypted {
            return None;
        }
        // The error as a log shows it: what failed and why.
        let said = crate::report::one_line(error);
        if text.contains("timed out") {
            return Some(format!(
                "no answer over TLS ({said}); a server that does not speak TLS on its port \
                 looks like this, and so does a cluster node whose certificate is refused \
                 (the log says which): check the port and each server's certificate"
            ));
        }
        let closed = [
            "Connection reset by peer",
            "UnexpectedEof",
            "unexpected end of file",
        ]
        .iter()
        .find(|m| text.contains(**m))?;
        (client_cert == ClientCert::NotSet).then(|| {
            format!(
                "the server closed the connection during the TLS handshake ({closed}); if it \
                 requires a client certificate, set {table}.client_cert and \
                 {table}.client_key to one its CA signed"
            )
        })
    })
}

fn read(key: &str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|why| TlsError::Read {
        key: key.to_owned(),
        path: path.display().to_string(),
        why,
    })
}

fn content(key: &str, path: &Path, why: impl Into<String>) -> TlsError {
    TlsError::Content {
        key: key.to_owned(),
        path: path.display().to_string(),
        why: why.into(),
    }
}

/// Every certificate in a PEM file; at least one, and each one parses.
fn certificates(
    key: &str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| content(key, path, format!("not a PEM file of certificates: {e}")))?;
    if certs.is_empty() {
        return Err(content(
            key,
            path,
            "no certificate in it (a PEM file with -----BEGIN CERTIFICATE----- blocks)",
        ));
    }
    // Each must parse as a trust anchor, or the link would fail later
    // with a vaguer error.
    let mut store = rustls::RootCertStore::empty();
    for cert in &certs {
        store
            .add(cert.clone())
            .map_err(|e| content(key, path, format!("a certificate does not parse: {e}")))?;
    }
    Ok(certs)
}

fn identity(key: &str, cert: &Path, private: &Path) -> Result<Identity, TlsError> {
    let cert_key = format!("{key}.client_cert");
    let key_key = format!("{key}.client_key");
    let chain_pem = read(&cert_key, cert)?;
    let chain = certificates(&cert_key, cert, &chain_pem)?;
    let key_pem = read(&key_key, private)?;
    let parsed = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
        content(
            &key_key,
            private,
            format!("no private key in it (PKCS#8, PKCS#1 or SEC1 PEM, unencrypted): {e}"),
        )
    })?;
    // rustls checks that the key is one it can sign with, and that it
    // belongs to the first certificate.
    rustls::ClientConfig::builder()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_client_auth_cert(chain.clone(), parsed.clone_key())
        .map_err(|e| {
            content(
                &key_key,
                private,
                format!("does not go with {}: {e}", cert.display()),
            )
        })?;
    Ok(Identity {
        chain,
        key: parsed,
        chain_pem,
        key_pem,
    })
}

/// The system store, read once per process; why not, if it cannot be used.
fn system_roots() -> Result<Arc<Vec<CertificateDer<'static>>>, String> {
    static ROOTS: OnceLock<Result<Arc<Vec<CertificateDer<'static>>>, String>> = OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let mut found = rustls_native_certs::load_native_certs();
            // A file named on purpose that cannot be read is a mistake to
            // say, not to skip: the directory's certificates would hide it,
            // and the CA it holds would show up later as an unknown issuer.
            if let (Some(file), Some(e)) = (std::env::var_os("SSL_CERT_FILE"), found.errors.first())
            {
                return Err(format!(
                    "SSL_CERT_FILE={} cannot be used: {e}",
                    Path::new(&file).display()
                ));
            }
            // One entry that does not parse would fail a client that adds
            // roots strictly (redis-rs): keep those that parse.
            found
                .certs
                .retain(|cert| rustls::RootCertStore::empty().add(cert.clone()).is_ok());
            if found.certs.is_empty() {
                let why = found
                    .errors
                    .first()
                    .map_or("none found".to_owned(), ToString::to_string);
                return Err(format!(
                    "no CA certificate in the system store ({why}); install the \
                     ca-certificates package, set SSL_CERT_FILE, or give the link a ca_file"
                ));
            }
            Ok(Arc::new(found.certs))
        })
        .clone()
}

fn pem_bundle(certs: &[CertificateDer<'static>]) -> Vec<u8> {
    use base64::Engine;
    let mut out = Vec::new();
    for cert in certs {
        out.extend_from_slice(b"-----BEGIN CERTIFICATE-----\n");
        let b64 = base64::engine::general_purpose::STANDARD.encode(cert.as_ref());
        for line in b64.as_bytes().chunks(64) {
            out.extend_from_slice(line);
            out.push(b'\n');
        }
        out.extend_from_slice(b"-----END CERTIFICATE-----\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_failures_are_said_with_what_to_set() {
        let said = |text: &str, cert: bool| {
            let cert = if cert {
                ClientCert::Shown
            } else {
                ClientCert::NotSet
            };
            explain(text, "redis.tls", cert).unwrap_or_default()
        };
        let unknown = "Connection error: Connection error: invalid peer certificate: UnknownIssuer";
        assert!(said(unknown, false).contains("set redis.tls.ca_file"));
        assert_eq!(
            said(unknown, false)
                .matches("invalid peer certificate")
                .count(),
            1
        );
        let ca = "invalid peer certificate: Other(OtherError(CaUsedAsEndEntity))";
        assert!(said(ca, false).contains("CA certificate as its own"));
        let expired = "invalid peer certificate: certificate expired: verification time 1 (UNIX), but certificate is not valid after 0 (1 seconds ago)";
        assert!(said(expired, false).contains("has expired"));
        let name = "invalid peer certificate: certificate not valid for name \"10.0.0.1\"";
        assert!(said(name, false).contains("does not name the host it was reached at"));
        let alert = "redis: received fatal alert: CertificateRequired";
        assert!(said(alert, false).contains("set redis.tls.client_cert"));
        let refused = said("received fatal alert: UnknownCA", true);
        assert!(
            refused.contains("accepts redis.tls.client_cert"),
            "{refused}"
        );
        let plain = "IO error: received corrupt message of type InvalidContentType";
        assert!(said(plain, false).contains("does not speak TLS"));
        let no_cipher = said("received fatal alert: HandshakeFailure", false);
        assert!(
            no_cipher.contains("no TLS version or cipher in common"),
            "{no_cipher}"
        );
        let smtp = explain(
            "received fatal alert: CertificateRequired",
            "smtp.tls",
            ClientCert::NotTaken,
        );
        assert!(!smtp.unwrap_or_default().contains("client_cert"));
        assert_eq!(
            explain("redis: timed out", "redis.tls", ClientCert::NotSet),
            None
        );
        let refused = "Connection refused (os error 111)";
        assert_eq!(explain(refused, "redis.tls", ClientCert::NotSet), None);
    }

    #[test]
    fn loopback_is_this_machine_by_name_or_address_only() {
        for host in [
            "localhost",
            "LOCALHOST",
            "127.0.0.1",
            "127.255.255.254",
            "::1",
            "[::1]",
        ] {
            assert!(is_loopback(host), "{host}");
        }
        for host in [
            "localhost.",
            "localhost.evil.com",
            "127.0.0.1.nip.io",
            "127.1",
            "2130706433",
            "0x7f000001",
            "0.0.0.0",
            "::ffff:127.0.0.1",
            "[::ffff:127.0.0.1]",
            "10.0.0.1",
        ] {
            assert!(!is_loopback(host), "{host}");
        }
    }

    #[test]
    fn a_pem_bundle_reads_back_as_the_same_certificates() {
        let ca = rcgen::generate_simple_self_signed(vec!["ca.test".into()]).unwrap();
        let der = ca.cert.der().clone();
        let pem = pem_bundle(&[der.clone(), der.clone()]);
        let back: Vec<_> = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(back, vec![der.clone(), der]);
    }
}
