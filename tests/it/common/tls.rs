//! TLS for the tests, made by the tests: a private certificate authority
//! ([`Pki`]) whose certificates only these tests trust, and an SMTP relay
//! that speaks TLS ([`TlsRelay`]: implicit, or STARTTLS with bytes a man in
//! the middle appends to its reply).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

use super::{KillOnDrop, free_cluster_port, free_port};

/// A certificate authority of the test's own, and the files it issues, in
/// a directory removed with it. Files are world-readable (a RabbitMQ node
/// runs as its own user).
pub(crate) struct Pki {
    pub dir: PathBuf,
    ca: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its key, as PEM files.
#[derive(Clone)]
pub(crate) struct Issued {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// How long an issued certificate is valid.
pub(crate) enum Validity {
    /// From yesterday to next year.
    Current,
    /// It expired yesterday.
    Expired,
}

impl Pki {
    /// A new CA named `name`, its files under a fresh temporary directory.
    pub(crate) fn new(name: &str) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = std::env::temp_dir().join(format!("mgtest-pki-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a PKI dir");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("mailgate test CA {name}"));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().expect("a CA key");
        let ca = CertifiedIssuer::self_signed(params, key).expect("a CA certificate");
        let pki = Self { dir, ca };
        std::fs::write(pki.ca_file(), pki.ca.pem()).expect("ca.pem");
        pki
    }

    /// The CA's certificate, PEM.
    pub(crate) fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// A server certificate for `localhost` and `127.0.0.1`.
    pub(crate) fn server(&self, stem: &str) -> Issued {
        self.issue(stem, &["localhost", "127.0.0.1"], Validity::Current, false)
    }

    /// A client certificate (for mutual TLS) named `stem`.
    pub(crate) fn client(&self, stem: &str) -> Issued {
        self.issue(stem, &[], Validity::Current, true)
    }

    /// A certificate for `names`, valid as `validity` says; a client's
    /// (clientAuth) or a server's (serverAuth).
    pub(crate) fn issue(
        &self,
        stem: &str,
        names: &[&str],
        validity: Validity,
        client: bool,
    ) -> Issued {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).expect("params");
        params.distinguished_name.push(DnType::CommonName, stem);
        let epoch = rcgen::date_time_ymd(1970, 1, 1);
        let day = rcgen::date_time_ymd(1970, 1, 2) - epoch;
        let days = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs()
            / 86_400;
        let now = epoch + day * i32::try_from(days).expect("days fit");
        (params.not_before, params.not_after) = match validity {
            Validity::Current => (now - day, now + day * 365),
            Validity::Expired => (now - day * 30, now - day),
        };
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        // A server's certificate serves as its client certificate too (a
        // Sentinel connecting to its primary).
        params.extended_key_usages = if client {
            vec![ExtendedKeyUsagePurpose::ClientAuth]
        } else {
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ]
        };
        let key = KeyPair::generate().expect("a key");
        let cert = params.signed_by(&key, &*self.ca).expect("a certificate");
        let issued = Issued {
            cert: self.dir.join(format!("{stem}.pem")),
            key: self.dir.join(format!("{stem}.key")),
        };
        std::fs::write(&issued.cert, cert.pem()).expect("cert file");
        std::fs::write(&issued.key, key.serialize_pem()).expect("key file");
        issued
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A rustls server configuration presenting `issued`.
pub(crate) fn server_config(issued: &Issued) -> Arc<rustls::ServerConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain = CertificateDer::pem_file_iter(&issued.cert)
        .expect("cert")
        .collect::<Result<Vec<_>, _>>()
        .expect("certs");
    let key = PrivateKeyDer::from_pem_file(&issued.key).expect("key");
    Arc::new(
        rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("a server config"),
    )
}

/// How a [`TlsRelay`] speaks TLS.
#[derive(Clone)]
pub(crate) enum RelayMode {
    /// TLS from the first byte (`smtps://`).
    Implicit,
    /// STARTTLS offered; after its `220`, these bytes in the same write
    /// (what a man in the middle appends), then the handshake.
    StartTls { inject: Vec<u8> },
    /// STARTTLS offered and agreed to, then plaintext a moment later where
    /// the handshake should be.
    StartTlsThenPlaintext,
}

/// An SMTP relay with TLS on a free port: it answers EHLO (with AUTH PLAIN
/// inside TLS), AUTH, MAIL, RCPT, DATA, the message and QUIT, and records
/// each command with whether it came inside TLS.
#[derive(Clone)]
pub(crate) struct TlsRelay {
    pub port: u16,
    commands: Arc<Mutex<Vec<(bool, String)>>>,
}

impl TlsRelay {
    pub(crate) async fn start(mode: RelayMode, config: Arc<rustls::ServerConfig>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let relay = Self {
            port,
            commands: Arc::default(),
        };
        let r = relay.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (r, mode, config) = (r.clone(), mode.clone(), config.clone());
                tokio::spawn(async move { r.session(tcp, mode, config).await });
            }
        });
        relay
    }

    /// Every command received: `(inside TLS, the line)`.
    pub(crate) fn commands(&self) -> Vec<(bool, String)> {
        self.commands.lock().unwrap().clone()
    }

    async fn session(
        &self,
        tcp: tokio::net::TcpStream,
        mode: RelayMode,
        config: Arc<rustls::ServerConfig>,
    ) -> std::io::Result<()> {
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        match mode {
            RelayMode::Implicit => {
                let tls = acceptor.accept(tcp).await?;
                self.converse(&mut BufReader::new(tls), true, None).await
            }
            RelayMode::StartTls { inject } => {
                let mut plain = BufReader::new(tcp);
                self.converse(&mut plain, true, Some(&inject)).await?;
                let tls = acceptor.accept(plain.into_inner()).await?;
                self.converse(&mut BufReader::new(tls), false, None).await
            }
            RelayMode::StartTlsThenPlaintext => {
                let mut plain = BufReader::new(tcp);
                self.converse(&mut plain, true, Some(b"")).await?;
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                plain.write_all(b"250 fake\r\n").await
            }
        }
    }

    /// One part of a session, greeting first if `greet`. In plaintext
    /// (`inject` set) it returns `Ok` once it answered STARTTLS, so the
    /// caller upgrades; inside TLS it runs to QUIT.
    async fn converse<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        s: &mut BufReader<S>,
        greet: bool,
        inject: Option<&[u8]>,
    ) -> std::io::Result<()> {
        let tls = inject.is_none();
        if greet {
            s.write_all(b"220 relay.test ESMTP\r\n").await?;
        }
        let mut in_data = false;
        let mut line = String::new();
        loop {
            line.clear();
            if s.read_line(&mut line).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            if in_data {
                if line == ".\r\n" {
                    in_data = false;
                    s.write_all(b"250 queued\r\n").await?;
                }
                continue;
            }
            let command = line.trim_end().to_owned();
            self.commands.lock().unwrap().push((tls, command.clone()));
            let verb = command.split(' ').next().unwrap_or("").to_ascii_uppercase();
            let reply: &[u8] = match (verb.as_str(), tls) {
                ("EHLO", false) => b"250-relay.test\r\n250-STARTTLS\r\n250 8BITMIME\r\n",
                ("EHLO", true) => b"250-relay.test\r\n250-AUTH PLAIN LOGIN\r\n250 8BITMIME\r\n",
                ("STARTTLS", false) => {
                    let mut out = b"220 go ahead\r\n".to_vec();
                    out.extend_from_slice(inject.unwrap_or_default());
                    s.write_all(&out).await?;
                    return Ok(());
                }
                ("AUTH", true) => b"235 authenticated\r\n",
                ("MAIL" | "RCPT" | "RSET" | "NOOP", _) => b"250 ok\r\n",
                ("DATA", _) => {
                    in_data = true;
                    b"354 go on\r\n"
                }
                ("QUIT", _) => {
                    s.write_all(b"221 bye\r\n").await?;
                    return Ok(());
                }
                _ => b"502 not here\r\n",
            };
            s.write_all(reply).await?;
        }
    }
}

/// Writes `text` to a file in `dir` (a configuration for a server).
pub(crate) fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("a file");
    path
}

/// What a TLS Redis asks of its clients.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClientCerts {
    /// None.
    Optional,
    /// A certificate its CA signed (mutual TLS).
    Required,
}

/// A `redis-server` of the test's own that speaks only TLS (no plaintext
/// port), with a certificate `pki` signed for 127.0.0.1. Killed, and its
/// files removed, when dropped.
pub(crate) struct TlsRedis {
    _child: KillOnDrop,
    pub port: u16,
    dir: PathBuf,
}

/// The TLS arguments of a redis-server (or Sentinel) with `pki`'s
/// certificate, asking clients for certificates as `certs` says.
fn tls_args(pki: &Pki, port: u16, certs: ClientCerts) -> Vec<String> {
    let server = pki.server(&format!("redis-{port}"));
    let auth = match certs {
        ClientCerts::Optional => "no",
        ClientCerts::Required => "yes",
    };
    [
        "--port",
        "0",
        "--tls-port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--tls-cert-file",
        &server.cert.display().to_string(),
        "--tls-key-file",
        &server.key.display().to_string(),
        "--tls-ca-cert-file",
        &pki.ca_file().display().to_string(),
        "--tls-auth-clients",
        auth,
        "--tls-replication",
        "yes",
        "--tls-cluster",
        "yes",
    ]
    .iter()
    .map(|a| (*a).to_owned())
    .collect()
}

impl TlsRedis {
    /// A server on a free port (one a cluster node can take: see
    /// [`free_cluster_port`]), with these extra arguments.
    pub(crate) fn start(pki: &Pki, certs: ClientCerts, extra: &[&str]) -> Self {
        let port = free_cluster_port();
        let dir = pki.dir.join(format!("redis-{port}"));
        std::fs::create_dir_all(&dir).expect("a data dir");
        let child = std::process::Command::new("redis-server")
            .args(tls_args(pki, port, certs))
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(&dir)
            .args(extra)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server is installed (with TLS)");
        let me = Self {
            _child: KillOnDrop(child),
            port,
            dir,
        };
        me.until(|| me.cli(pki, &["ping"]) == "PONG");
        me
    }

    /// A one-node Redis Cluster over TLS: every slot on this node.
    pub(crate) fn cluster(pki: &Pki) -> Self {
        let port = free_port();
        let conf = format!("nodes-{port}.conf");
        let me = Self::start(
            pki,
            ClientCerts::Optional,
            &["--cluster-enabled", "yes", "--cluster-config-file", &conf],
        );
        assert_eq!(
            me.cli(pki, &["cluster", "addslotsrange", "0", "16383"]),
            "OK"
        );
        me.until(|| {
            me.cli(pki, &["cluster", "info"])
                .contains("cluster_state:ok")
        });
        me
    }

    /// A Sentinel over TLS that monitors `primary` as `mymaster`.
    pub(crate) fn sentinel(pki: &Pki, primary: &TlsRedis) -> Self {
        let port = free_port();
        let dir = pki.dir.join(format!("sentinel-{port}"));
        std::fs::create_dir_all(&dir).expect("a sentinel dir");
        let mut conf = String::new();
        for pair in tls_args(pki, port, ClientCerts::Optional).chunks(2) {
            conf.push_str(&format!(
                "{} {}\n",
                pair[0].trim_start_matches("--"),
                pair[1]
            ));
        }
        conf.push_str(&format!(
            "sentinel monitor mymaster 127.0.0.1 {} 1\nsentinel down-after-milliseconds mymaster 5000\n",
            primary.port
        ));
        let file = write(&dir, "sentinel.conf", &conf);
        let child = std::process::Command::new("redis-server")
            .arg(&file)
            .arg("--sentinel")
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server --sentinel");
        let me = Self {
            _child: KillOnDrop(child),
            port,
            dir,
        };
        me.until(|| {
            me.cli(pki, &["sentinel", "get-master-addr-by-name", "mymaster"])
                .contains(&primary.port.to_string())
        });
        me
    }

    /// `redis-cli` over TLS (as `pki`'s client) on this server.
    pub(crate) fn cli(&self, pki: &Pki, args: &[&str]) -> String {
        let client = pki.client("redis-cli");
        let out = std::process::Command::new("redis-cli")
            .args(["--tls", "-h", "127.0.0.1", "-p", &self.port.to_string()])
            .arg("--cacert")
            .arg(pki.ca_file())
            .arg("--cert")
            .arg(&client.cert)
            .arg("--key")
            .arg(&client.key)
            .args(args)
            .output()
            .expect("redis-cli runs");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    fn until(&self, ready: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !ready() {
            assert!(
                std::time::Instant::now() < deadline,
                "the TLS redis on {} did not come up (logs in {})",
                self.port,
                self.dir.display()
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}
