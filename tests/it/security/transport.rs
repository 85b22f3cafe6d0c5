//! Transport security on every link, against real servers the tests start
//! with certificates the tests make (`common/tls.rs`): no SMTP password in
//! cleartext (a man in the middle who strips STARTTLS gets none, and bytes
//! he appends to the STARTTLS reply are not read as replies), private CAs
//! and client certificates for SMTP, Redis (a server, Sentinel, a cluster)
//! and RabbitMQ, and errors that name the link and what to set.

use crate::common;

use std::path::Path;
use std::time::Duration;

use crate::common::PrivateRabbit;
use crate::common::harness::Harness;
use crate::common::script::{ScriptedSmtp, all_verbs};
use crate::common::tls::{
    ClientCerts, Pki, RelayMode, TlsRedis, TlsRelay, Validity, server_config,
};
use mailgate::mailer::{MailError, Mailer};
use mailgate::settings::{Settings, SmtpSettings};
use mailgate::tls::TlsSettings;
use serde_json::{Value, json};

fn trusting(ca: Option<&Path>) -> TlsSettings {
    TlsSettings {
        ca_file: ca.map(Path::to_path_buf),
        ..TlsSettings::default()
    }
}

fn mailer(url: &str, tls: TlsSettings) -> Mailer {
    Mailer::new(&SmtpSettings {
        url: url.into(),
        relays: Vec::new(),
        circuit: Default::default(),
        from: "Test <no-reply@example.com>".into(),
        pool_size: 1,
        timeout: Duration::from_secs(5),
        tls,
        canary: None,
    })
    .expect("mailer")
}

async fn send(m: &Mailer) -> Result<(), MailError> {
    common::script::send_code(m, "user@example.com").await
}

/// The text of a relay failure; any other outcome fails the test.
#[track_caller]
fn relay_failure(r: Result<(), MailError>) -> String {
    match r {
        Err(MailError::Relay(t)) => t,
        other => panic!("expected a relay failure, got {other:?}"),
    }
}

/// The shipped settings as `tweak` changes them are refused at load, with
/// `says` in the error and no password.
#[track_caller]
fn refused_at_load(tweak: impl FnOnce(&mut Settings), says: &str) {
    let mut s = Settings::load(Path::new("config/default.toml")).expect("the shipped config");
    tweak(&mut s);
    let e = s.validate().expect_err(says).to_string();
    assert!(e.contains(says), "expected {says:?} in: {e}");
    assert!(!e.contains("guest:guest"), "{e}");
}

/// Settings from the shipped file with `smtp.url` (and `[smtp.tls]`) as given.
fn settings_with_smtp(url: &str) -> Result<Settings, String> {
    let mut s = Settings::load(Path::new("config/default.toml")).expect("the shipped config");
    s.smtp.url = url.into();
    s.validate().map(|()| s).map_err(|e| e.to_string())
}

// ---- SMTP: credentials never in cleartext --------------------------------

/// A man in the middle who removes STARTTLS from the EHLO reply gets no
/// password. With credentials in the URL (default mode, or
/// `tls=opportunistic` as a mailer built without the settings' checks
/// would have it), a client that fell back to cleartext would send AUTH in
/// clear; the test checks that neither AUTH nor the mail is sent and that
/// the send fails as a relay failure that names STARTTLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stripped_starttls_never_gets_the_password() {
    let stripped = ScriptedSmtp::start().await;
    stripped.advertise(&["AUTH PLAIN LOGIN"]);
    for query in ["", "?tls=opportunistic"] {
        let url = format!("smtp://user:s3cret@127.0.0.1:{}{query}", stripped.port);
        let t = relay_failure(send(&mailer(&url, TlsSettings::default())).await);
        assert!(t.contains("STARTTLS required"), "{url}: {t}");
    }
    let sent = all_verbs(&stripped);
    assert!(
        !sent.iter().any(|v| v == "AUTH" || v == "MAIL"),
        "no AUTH and no mail in cleartext: {sent:?}"
    );
}

/// The last line: a mailer whose relay is on another host and says
/// `tls=none` (which settings refuse) still never sends the password in
/// clear. `[::ffff:127.0.0.1]` reaches this machine but is not a loopback
/// address by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_goes_to_another_host_only_inside_tls() {
    let relay = ScriptedSmtp::start().await;
    relay.advertise(&["AUTH PLAIN LOGIN"]);
    let url = format!(
        "smtp://user:s3cret@[::ffff:127.0.0.1]:{}?tls=none",
        relay.port
    );
    let t = relay_failure(send(&mailer(&url, TlsSettings::default())).await);
    assert!(t.contains("not encrypted"), "{t}");
    let sent = all_verbs(&relay);
    assert!(!sent.iter().any(|v| v == "AUTH"), "{sent:?}");
}

/// Settings refuse every URL that could send a password unencrypted to
/// another host, allow `tls=none` with credentials on this machine, and
/// say when mail without credentials may travel in clear.
#[test]
fn settings_refuse_cleartext_credentials_and_warn_of_cleartext_mail() {
    for url in [
        "smtp://user:pass@relay.example.com?tls=none",
        "smtp://user:pass@relay.example.com:587?tls=opportunistic",
        "smtp://user:pass@127.0.0.1:2525?tls=opportunistic",
        "smtp://user:pass@[::ffff:127.0.0.1]:2525?tls=none",
    ] {
        let e = settings_with_smtp(url).expect_err(url);
        assert!(e.contains("password"), "{url}: {e}");
        assert!(!e.contains("pass@"), "{url}: the password is shown: {e}");
    }
    for url in [
        "smtp://user:pass@127.0.0.1:2525?tls=none",
        "smtp://user:pass@localhost:2525?tls=none",
        "smtp://user:pass@relay.example.com",
        "smtp://user:pass@relay.example.com?tls=required",
        "smtps://user:pass@relay.example.com",
    ] {
        let s = settings_with_smtp(url).unwrap_or_else(|e| panic!("{url}: {e}"));
        assert!(s.warnings().is_empty(), "{url}");
    }
    for url in [
        "smtp://relay.example.com",
        "smtp://relay.example.com?tls=opportunistic",
        "smtp://relay.example.com?tls=none",
    ] {
        let s = settings_with_smtp(url).expect(url);
        let w = s.warnings();
        assert!(
            w.len() == 1 && w[0].contains("unencrypted") && w[0].contains("tls=required"),
            "{url}: {w:?}"
        );
    }
    let local = settings_with_smtp("smtp://127.0.0.1:1025").expect("local");
    assert!(local.warnings().is_empty());
}

/// `check-config` says so too, and so does the worker's start-up log.
#[test]
fn check_config_warns_of_a_relay_whose_mail_may_travel_in_clear() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mailgate"))
        .arg("check-config")
        .env("MAILGATE__SMTP__URL", "smtp://relay.example.com:25")
        .output()
        .expect("check-config runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("warning: smtp relay relay.example.com:25: mail (and the codes in it) may travel unencrypted"),
        "{stdout}"
    );
}

// ---- SMTP: STARTTLS injection and private CAs ----------------------------

/// Bytes a man in the middle appends to the relay's `220` for STARTTLS
/// (here `250 fake`) are not read inside TLS. Read there as the reply to
/// EHLO they would hide the real one (AUTH not offered, replies off by
/// one); the test checks that the client drops them, the mail goes through
/// with the real replies, and nothing but EHLO and STARTTLS is sent in
/// clear.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_appended_to_the_starttls_reply_are_not_read_inside_tls() {
    let pki = Pki::new("inject");
    let relay = TlsRelay::start(
        RelayMode::StartTls {
            inject: b"250 fake\r\n".to_vec(),
        },
        server_config(&pki.server("relay")),
    )
    .await;
    let url = format!("smtp://user:s3cret@127.0.0.1:{}?tls=required", relay.port);
    send(&mailer(&url, trusting(Some(&pki.ca_file()))))
        .await
        .expect("sent, with the real replies");
    let inside: Vec<String> = relay
        .commands()
        .into_iter()
        .filter(|(tls, _)| *tls)
        .map(|(_, c)| c.split(' ').next().unwrap_or("").to_owned())
        .collect();
    assert_eq!(
        inside[..5],
        ["EHLO", "AUTH", "MAIL", "RCPT", "DATA"],
        "{inside:?}"
    );
    let outside: Vec<(bool, String)> = relay.commands().into_iter().filter(|(t, _)| !*t).collect();
    assert!(
        outside
            .iter()
            .all(|(_, c)| c.starts_with("EHLO") || c == "STARTTLS"),
        "nothing but EHLO and STARTTLS in clear: {outside:?}"
    );
}

/// A relay whose certificate only a private CA signs is reached with that
/// CA as `ca_file` (STARTTLS and implicit TLS), and refused without it,
/// with another CA, when its certificate expired or names another host.
/// Each refusal is one line naming the relay and what to set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smtp_trusts_its_private_ca_and_nothing_else() {
    let pki = Pki::new("smtp");
    let other = Pki::new("smtp-other");
    let good = server_config(&pki.server("relay"));
    let implicit = TlsRelay::start(RelayMode::Implicit, good.clone()).await;
    let starttls = TlsRelay::start(RelayMode::StartTls { inject: vec![] }, good).await;
    let smtps = format!("smtps://127.0.0.1:{}", implicit.port);
    let required = format!("smtp://127.0.0.1:{}?tls=required", starttls.port);
    for url in [&smtps, &required] {
        send(&mailer(url, trusting(Some(&pki.ca_file()))))
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        for (tls, why) in [
            (trusting(None), "UnknownIssuer"),
            (trusting(Some(&other.ca_file())), "UnknownIssuer"),
        ] {
            let e = send(&mailer(url, tls)).await.expect_err(url);
            let text = e.to_string();
            assert!(matches!(e, MailError::Relay(_)), "{text}");
            assert!(text.contains(why), "{url}: {text}");
            assert!(text.contains("smtp.tls"), "{url}: says what to set: {text}");
            assert!(
                text.contains("127.0.0.1:"),
                "{url}: names the relay: {text}"
            );
            assert_eq!(
                text.matches("invalid peer certificate").count(),
                1,
                "{text}"
            );
            assert!(!text.contains("error: Connection error"), "{text}");
        }
    }
    let expired = pki.issue("expired", &["127.0.0.1"], Validity::Expired, false);
    let wrong_host = pki.issue(
        "elsewhere",
        &["elsewhere.example"],
        Validity::Current,
        false,
    );
    for (issued, why) in [
        (expired, "has expired"),
        (wrong_host, "does not name the host"),
    ] {
        let relay = TlsRelay::start(RelayMode::Implicit, server_config(&issued)).await;
        let url = format!("smtps://127.0.0.1:{}", relay.port);
        let e = send(&mailer(&url, trusting(Some(&pki.ca_file()))))
            .await
            .expect_err(why);
        assert!(e.to_string().contains(why), "{e}");
        assert!(
            relay.commands().is_empty(),
            "no command to a bad certificate"
        );
    }
}

// ---- Redis: a server, Sentinel, a cluster --------------------------------

fn job(id: &str) -> Value {
    json!({"id": id, "email": format!("{id}@example.com"), "ip": "203.0.113.7", "code": "493817",
           "vars": {"app_name": "Acme"}})
}

/// `mailgate check-config --connect` with the shipped config and `env`:
/// its exit status and what it printed (both streams).
fn check_config(env: &[(&str, String)]) -> (bool, String) {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_mailgate"));
    c.args(["check-config", "--connect"]);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().expect("check-config runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The line check-config printed about `link`.
fn line<'a>(text: &'a str, link: &str) -> &'a str {
    text.lines()
        .find(|l| l.starts_with(&format!("{link}:")))
        .unwrap_or_else(|| panic!("no {link} line in {text}"))
}

fn mutual(pki: &Pki, who: &str) -> TlsSettings {
    let client = pki.client(who);
    TlsSettings {
        ca_file: Some(pki.ca_file()),
        client_cert: Some(client.cert),
        client_key: Some(client.key),
        ..TlsSettings::default()
    }
}

/// The worker, with Redis at `url` reached as `tls` says, mails a job.
async fn worker_mails_over(test: &str, url: &str, tls: &TlsSettings) {
    let h = Harness::with(test, |s| {
        s.redis.url = url.into();
        s.redis.tls = tls.clone();
    })
    .await;
    let w = h.start_worker().await;
    h.publish(&job(&format!("{test}-1"))).await;
    let r = h.result().await;
    assert_eq!(r["status"], "sent", "{r}");
    w.stop().await.expect("the worker stops");
}

/// `rediss://` works and never panics the worker or check-config at
/// start-up. Against a TLS-only Redis that requires client certificates,
/// with its private CA and a client certificate, the worker mails a job;
/// without the CA, or without the client certificate, check-config says
/// in one line what to set, and nothing panics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_with_a_private_ca_and_a_client_certificate() {
    let pki = Pki::new("rediss");
    let redis = TlsRedis::start(&pki, ClientCerts::Required, &[]);
    let url = format!("rediss://127.0.0.1:{}/0", redis.port);
    let tls = mutual(&pki, "worker");
    worker_mails_over("rediss", &url, &tls).await;

    let path = |p: &Option<std::path::PathBuf>| p.as_ref().unwrap().display().to_string();
    let ca = ("MAILGATE__REDIS__TLS__CA_FILE", path(&tls.ca_file));
    let cert = ("MAILGATE__REDIS__TLS__CLIENT_CERT", path(&tls.client_cert));
    let key = ("MAILGATE__REDIS__TLS__CLIENT_KEY", path(&tls.client_key));
    let at = ("MAILGATE__REDIS__URL", url.clone());
    let (ok, out) = check_config(&[at.clone(), ca.clone(), cert.clone(), key.clone()]);
    assert!(ok && line(&out, "redis") == "redis: ok", "{out}");
    for (env, says) in [
        (vec![at.clone(), cert, key], "redis.tls.ca_file"),
        (vec![at.clone(), ca], "redis.tls.client_cert"),
    ] {
        let (ok, out) = check_config(&env);
        let redis = line(&out, "redis");
        assert!(!ok && !out.contains("panicked"), "{out}");
        assert!(redis.contains(says), "says what to set: {redis}");
        assert!(redis.contains(&url), "names the server: {redis}");
    }
}

/// Sentinel over TLS (`rediss+sentinel://`): the Sentinel and the primary
/// it names both speak only TLS, with the private CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_sentinel_follows_a_tls_primary() {
    let pki = Pki::new("rediss-sentinel");
    let primary = TlsRedis::start(&pki, ClientCerts::Optional, &[]);
    let sentinel = TlsRedis::sentinel(&pki, &primary);
    let url = format!("rediss+sentinel://127.0.0.1:{}/mymaster/0", sentinel.port);
    worker_mails_over("rediss-sentinel", &url, &mutual(&pki, "worker")).await;
}

/// A Redis Cluster over TLS (`rediss+cluster://`; one node holding every
/// slot, which starts in a second where three take seven).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_cluster_over_tls() {
    let pki = Pki::new("rediss-cluster");
    let node = TlsRedis::cluster(&pki);
    let url = format!("rediss+cluster://127.0.0.1:{}", node.port);
    worker_mails_over("rediss-cluster", &url, &mutual(&pki, "worker")).await;
}

// ---- RabbitMQ ------------------------------------------------------------

/// AMQP over TLS, against a private RabbitMQ node whose TLS listener
/// requires a client certificate its private CA signed. The whole job path
/// runs over it: a job is consumed and answered, one whose relay says 451
/// is retried through its retry queue and then sent, and a job that is not
/// JSON is dead-lettered. Without the client certificate, or with another
/// CA, check-config says in one line what to set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqps_with_a_private_ca_and_a_client_certificate_runs_the_job_path() {
    let pki = Pki::new("amqps");
    let server = pki.server("rabbit");
    let tls_port = common::free_port();
    let rabbit = PrivateRabbit::start_with(&format!(
        "listeners.ssl.default = {tls_port}\n\
         ssl_options.cacertfile = {}\n\
         ssl_options.certfile = {}\n\
         ssl_options.keyfile = {}\n\
         ssl_options.verify = verify_peer\n\
         ssl_options.fail_if_no_peer_cert = true\n",
        pki.ca_file().display(),
        server.cert.display(),
        server.key.display(),
    ));
    let url = format!("amqps://guest:guest@127.0.0.1:{tls_port}/%2f");
    let tls = mutual(&pki, "worker");
    let h = Harness::with("amqps", |s| {
        s.amqp.url = url.clone().into();
        s.amqp.tls = tls.clone();
    })
    .await;
    let w = h.start_worker().await;
    h.publish(&job("amqps-sent")).await;
    let r = h.result().await;
    assert_eq!(
        (r["id"].as_str(), r["status"].as_str()),
        (Some("amqps-sent"), Some("sent")),
        "{r}"
    );
    h.sink.reply_with(&[451]);
    h.publish(&job("amqps-retried")).await;
    let r = h.result().await;
    assert_eq!(
        (r["id"].as_str(), r["status"].as_str()),
        (Some("amqps-retried"), Some("sent")),
        "{r}"
    );
    assert_eq!(
        r["attempts"], 2,
        "sent on its second attempt, after its retry queue: {r}"
    );
    h.publish_raw(b"not json", Default::default()).await;
    let (body, _) = h.dead_letter().await;
    assert_eq!(body, b"not json");
    w.stop().await.expect("the worker stops");

    let path = |p: &Option<std::path::PathBuf>| p.as_ref().unwrap().display().to_string();
    let other = Pki::new("amqps-other");
    let at = ("MAILGATE__AMQP__URL", url.clone());
    let ca = ("MAILGATE__AMQP__TLS__CA_FILE", path(&tls.ca_file));
    let cert = ("MAILGATE__AMQP__TLS__CLIENT_CERT", path(&tls.client_cert));
    let key = ("MAILGATE__AMQP__TLS__CLIENT_KEY", path(&tls.client_key));
    let (ok, out) = check_config(&[at.clone(), ca.clone(), cert.clone(), key.clone()]);
    assert!(ok && line(&out, "rabbitmq") == "rabbitmq: ok", "{out}");
    let wrong_ca = (
        "MAILGATE__AMQP__TLS__CA_FILE",
        other.ca_file().display().to_string(),
    );
    for (env, says) in [
        (vec![at.clone(), ca], "amqp.tls.client_cert"),
        (vec![at.clone(), wrong_ca, cert, key], "amqp.tls.ca_file"),
    ] {
        let (ok, out) = check_config(&env);
        let rabbitmq = line(&out, "rabbitmq");
        assert!(!ok, "{out}");
        assert!(rabbitmq.contains(says), "says what to set: {rabbitmq}");
        assert!(
            rabbitmq.contains(&format!("127.0.0.1:{tls_port}")),
            "names the node: {rabbitmq}"
        );
        assert!(!rabbitmq.contains("guest:guest"), "{rabbitmq}");
    }
    drop(h);
    drop(rabbit);
}

/// `roots = "system"` trusts the host's store, which `SSL_CERT_FILE` names
/// here: the private CA is trusted with no `ca_file`; without it in the
/// store the same server is refused.
#[test]
fn system_roots_honour_ssl_cert_file() {
    let pki = Pki::new("system-roots");
    let redis = TlsRedis::start(&pki, ClientCerts::Optional, &[]);
    let env = vec![
        (
            "MAILGATE__REDIS__URL",
            format!("rediss://127.0.0.1:{}/0", redis.port),
        ),
        ("MAILGATE__REDIS__TLS__ROOTS", "system".to_owned()),
    ];
    // The store holds the CA and an entry that does not parse (that one
    // entry must not fail Redis, which adds roots strictly).
    let store = std::fs::read_to_string(pki.ca_file()).expect("ca")
        + "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
    let store = common::tls::write(&pki.dir, "store.pem", &store);
    let mut with_ca = env.clone();
    with_ca.push(("SSL_CERT_FILE", store.display().to_string()));
    let (ok, out) = check_config(&with_ca);
    assert!(ok && line(&out, "redis") == "redis: ok", "{out}");
    let (ok, out) = check_config(&env);
    assert!(!ok, "{out}");
    assert!(
        line(&out, "redis").contains("FAILED") || out.contains("system store"),
        "{out}"
    );
    // A store file named on purpose that cannot be read is said, even where
    // SSL_CERT_DIR holds certificates that would hide it.
    let mut missing = env.clone();
    missing.push(("SSL_CERT_FILE", "/nonexistent/ca.pem".to_owned()));
    missing.push(("SSL_CERT_DIR", "/etc/ssl/certs".to_owned()));
    let (ok, out) = check_config(&missing);
    let says = "redis.tls.roots = \"system\": SSL_CERT_FILE=/nonexistent/ca.pem";
    assert!(!ok && out.contains(says), "{out}");
}

/// A TLS table on a link that does not use TLS, TLS files that cannot be
/// used, and a verification switch are refused when settings load, each
/// naming its key; `[smtp.tls]` shared by relays of which one is local and
/// unencrypted is fine.
#[test]
fn tls_settings_that_cannot_hold_are_refused_at_load() {
    let pki = Pki::new("settings");
    let client = pki.client("client");
    let not_pem = common::tls::write(&pki.dir, "not.pem", "hello\n");
    let shipped = || Settings::load(Path::new("config/default.toml")).expect("shipped");
    let ca = |path: &Path| trusting(Some(path));
    refused_at_load(
        |s| s.amqp.tls = ca(&pki.ca_file()),
        "[amqp.tls] is set but amqp.url",
    );
    refused_at_load(
        |s| s.redis.tls = ca(&pki.ca_file()),
        "[redis.tls] is set but redis.url",
    );
    refused_at_load(
        |s| s.redis.url = "rediss://127.0.0.1:6380/0#insecure".into(),
        "#insecure",
    );
    refused_at_load(
        |s| s.smtp.tls = ca(&pki.ca_file()),
        "[smtp.tls] is set but no relay",
    );
    refused_at_load(
        |s| {
            s.redis.url = "rediss://127.0.0.1:6380/0".into();
            s.redis.tls = TlsSettings {
                client_cert: Some(client.cert.clone()),
                ..TlsSettings::default()
            };
        },
        "redis.tls.client_cert and redis.tls.client_key go together",
    );
    refused_at_load(
        |s| {
            s.redis.url = "rediss://127.0.0.1:6380/0".into();
            s.redis.tls = TlsSettings {
                client_cert: Some(client.cert.clone()),
                client_key: Some(pki.server("other").key),
                ..TlsSettings::default()
            };
        },
        "redis.tls.client_key",
    );
    refused_at_load(
        |s| {
            s.amqp.url = "amqps://guest:guest@127.0.0.1:5671/%2f".into();
            s.amqp.tls = ca(&not_pem);
        },
        "amqp.tls.ca_file",
    );
    refused_at_load(
        |s| {
            s.amqp.url = "amqps://guest:guest@127.0.0.1:5671/%2f".into();
            s.amqp.tls = TlsSettings {
                roots: mailgate::tls::TrustRoots::System,
                ca_file: Some(pki.ca_file()),
                ..TlsSettings::default()
            };
        },
        "both set",
    );
    refused_at_load(
        |s| {
            s.smtp.url = "smtps://relay.example.com".into();
            s.smtp.tls = TlsSettings {
                client_cert: Some(client.cert.clone()),
                client_key: Some(client.key.clone()),
                ..TlsSettings::default()
            };
        },
        "SMTP relays take no client certificate",
    );
    let mut s = shipped();
    s.smtp.url = "smtp://127.0.0.1:1025?tls=none,smtp://relay.example.com:587?tls=required".into();
    s.smtp.tls = ca(&pki.ca_file());
    s.validate()
        .expect("[smtp.tls] shared by a local relay without TLS");
}

/// URLs that hide or blur what they mean are refused when settings load: a
/// control character (a tab a URL parser drops, hiding `#insecure` or
/// `amqps` from a check of the raw text), any fragment on a Redis URL, a
/// user without a password, `tls=` values otherwise only the mailer
/// refuses, and RabbitMQ nodes of both schemes (a reset of the TLS one
/// would move the worker onto the cleartext one). `valkeys://` counts as
/// TLS, and of two `tls=` the first counts, for the settings as for the
/// mailer.
#[test]
fn hidden_or_ambiguous_urls_are_refused_at_load() {
    refused_at_load(
        |s| s.redis.url = "rediss://127.0.0.1:6380/0#insec\ture".into(),
        "control character",
    );
    refused_at_load(
        |s| s.redis.url = "rediss://127.0.0.1:6380/0#anything".into(),
        "fragment",
    );
    for (url, says) in [
        (
            "smtp://user@relay.example.com?tls=required",
            "a user without a password",
        ),
        ("smtp://relay.example.com?tls=NONE", "tls=\"NONE\""),
        ("smtp://relay.example.com?tls=", "tls=\"\""),
    ] {
        let e = settings_with_smtp(url).expect_err(url);
        assert!(e.contains(says), "{url}: {e}");
    }
    refused_at_load(
        |s| {
            s.amqp.url =
                "amqps://guest:guest@a.example:5671/%2f,amqp://guest:guest@b.example/%2f".into()
        },
        "amqps:// and amqp://",
    );
    // A URL parser drops a tab, so a check of the raw text would read this
    // as plaintext where the client uses TLS.
    refused_at_load(
        |s| {
            s.amqp.url =
                "am\tqps://guest:guest@a.example:5671/%2f,amqp://guest:guest@b.example/%2f".into()
        },
        "control character",
    );
    refused_at_load(
        |s| s.smtp.url = "smtp://user:pw@relay.example.com?tls=no\nne".into(),
        "control character",
    );
    // valkeys:// is TLS to redis-rs, and to the settings.
    let pki = Pki::new("valkeys");
    let mut s = Settings::load(Path::new("config/default.toml")).expect("shipped");
    s.redis.url = "valkeys://127.0.0.1:6380/0".into();
    s.redis.tls = trusting(Some(&pki.ca_file()));
    s.validate().expect("valkeys:// with [redis.tls]");
    // The first tls= counts, for the relay's name as for the mailer.
    let s = settings_with_smtp("smtp://relay.example.com?tls=none&tls=required").expect("valid");
    let w = s.warnings();
    assert!(
        w.len() == 1 && w[0].contains("relay.example.com:25") && w[0].contains("says tls=none"),
        "{w:?}"
    );
}

/// A relay's own `tls = {}` means the bundled roots for that relay, even
/// where `[smtp.tls]` names a private CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relays_own_tls_table_replaces_the_shared_one() {
    use mailgate::settings::RelaySettings;
    let pki = Pki::new("own-tls");
    let relay = TlsRelay::start(RelayMode::Implicit, server_config(&pki.server("relay"))).await;
    let smtp = |own: Option<TlsSettings>| SmtpSettings {
        url: Default::default(),
        relays: vec![RelaySettings {
            url: format!("smtps://127.0.0.1:{}", relay.port).into(),
            name: None,
            tls: own,
        }],
        circuit: Default::default(),
        from: "Test <no-reply@example.com>".into(),
        pool_size: 1,
        timeout: Duration::from_secs(5),
        tls: trusting(Some(&pki.ca_file())),
        canary: None,
    };
    let shared = Mailer::new(&smtp(None)).expect("mailer");
    send(&shared).await.expect("trusted through [smtp.tls]");
    let own = Mailer::new(&smtp(Some(TlsSettings::default()))).expect("mailer");
    let e = send(&own)
        .await
        .expect_err("the bundled roots do not hold the private CA");
    assert!(
        e.to_string().contains("set smtp.relays[0].tls.ca_file"),
        "{e}"
    );
}

/// Nothing of lapin's shows at trace: lapin logs the connection's StartOk
/// (the broker's password) there.
#[test]
fn no_broker_password_in_the_log_at_trace() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mailgate"))
        .args(["check-config", "--connect"])
        .env("RUST_LOG", "trace")
        .output()
        .expect("check-config runs");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    // guest:guest in AMQP PLAIN, as lapin's Debug prints it.
    assert!(
        !log.contains("StartOk") && !log.contains("103, 117, 101, 115, 116"),
        "{log}"
    );
}

/// A relay that agrees to STARTTLS, then sends plaintext where the
/// handshake should be, fails the send with a message that names the
/// tampering and never suggests dropping TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_after_starttls_is_called_tampering() {
    let pki = Pki::new("late-plaintext");
    let relay = TlsRelay::start(
        RelayMode::StartTlsThenPlaintext,
        server_config(&pki.server("relay")),
    )
    .await;
    let url = format!("smtp://user:s3cret@127.0.0.1:{}?tls=required", relay.port);
    let e = send(&mailer(&url, trusting(Some(&pki.ca_file()))))
        .await
        .expect_err("refused");
    let text = e.to_string();
    assert!(matches!(e, MailError::Relay(_)), "{text}");
    assert!(
        text.contains("tampering") && !text.contains("without TLS"),
        "{text}"
    );
    assert!(
        !relay.commands().iter().any(|(_, c)| c.starts_with("AUTH")),
        "no AUTH"
    );
}
