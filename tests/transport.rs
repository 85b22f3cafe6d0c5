//! Transport security on every link, against real servers the tests start
//! with certificates the tests make (`common/tls.rs`): no SMTP password in
//! cleartext (a man in the middle who strips STARTTLS gets none, and bytes
//! he appends to the STARTTLS reply are not read as replies), private CAs
//! and client certificates for SMTP, Redis (a server, Sentinel, a cluster)
//! and RabbitMQ, and errors that name the link and what to set.

mod common;

use std::path::Path;
use std::time::Duration;

use common::script::ScriptedSmtp;
use common::tls::{Pki, RelayMode, TlsRelay, Validity, server_config};
use mailgate::domain::EmailAddress;
use mailgate::mailer::{MailError, Mailer, Outgoing};
use mailgate::settings::{Settings, SmtpSettings};
use mailgate::tls::TlsSettings;

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
    })
    .expect("mailer")
}

async fn send(m: &Mailer) -> Result<(), MailError> {
    let to = EmailAddress::parse("user@example.com").expect("address");
    let mail = m
        .compose(&Outgoing {
            to: &to,
            subject: "Your code",
            text: "Your code is 493817",
            html: None,
        })
        .expect("compose");
    let slot = m.reserve().await;
    m.send(slot, mail).await
}

/// Settings from the shipped file with `smtp.url` (and `[smtp.tls]`) as given.
fn settings_with_smtp(url: &str) -> Result<Settings, String> {
    let mut s = Settings::load(Path::new("config/default.toml")).expect("the shipped config");
    s.smtp.url = url.into();
    s.validate().map(|()| s).map_err(|e| e.to_string())
}

// ---- SMTP: credentials never in cleartext --------------------------------

/// Defect 1: a man in the middle removes STARTTLS from the EHLO reply.
/// With credentials in the URL (default mode, or `tls=opportunistic` as a
/// mailer built without the settings' checks would have it), the password
/// is never sent: the send fails as a relay failure that names STARTTLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stripped_starttls_never_gets_the_password() {
    let stripped = ScriptedSmtp::start().await;
    stripped.advertise(&["AUTH PLAIN LOGIN"]);
    for query in ["", "?tls=opportunistic"] {
        let url = format!("smtp://user:s3cret@127.0.0.1:{}{query}", stripped.port);
        let r = send(&mailer(&url, TlsSettings::default())).await;
        match &r {
            Err(MailError::Relay(t)) => assert!(t.contains("STARTTLS required"), "{t}"),
            other => panic!("{url}: expected a relay failure, got {other:?}"),
        }
    }
    let sent: Vec<String> = (0..stripped.connections())
        .flat_map(|c| stripped.verbs(c))
        .collect();
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
    let r = send(&mailer(&url, TlsSettings::default())).await;
    match &r {
        Err(MailError::Relay(t)) => assert!(t.contains("not encrypted"), "{t}"),
        other => panic!("expected a relay failure, got {other:?}"),
    }
    let sent: Vec<String> = (0..relay.connections())
        .flat_map(|c| relay.verbs(c))
        .collect();
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
        assert!(s.transport_warnings().is_empty(), "{url}");
    }
    for url in [
        "smtp://relay.example.com",
        "smtp://relay.example.com?tls=opportunistic",
        "smtp://relay.example.com?tls=none",
    ] {
        let s = settings_with_smtp(url).expect(url);
        let w = s.transport_warnings();
        assert!(
            w.len() == 1 && w[0].contains("unencrypted") && w[0].contains("tls=required"),
            "{url}: {w:?}"
        );
    }
    let local = settings_with_smtp("smtp://127.0.0.1:1025").expect("local");
    assert!(local.transport_warnings().is_empty());
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

/// Defect 1, the injection: a man in the middle appends `250 fake` to the
/// relay's `220` for STARTTLS. Read inside TLS as the reply to EHLO it
/// would hide the real one (AUTH not offered, replies off by one); the
/// client drops it, and the mail goes through with the real replies.
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

/// Defect 3 for SMTP: a relay whose certificate only a private CA signs is
/// reached with that CA as `ca_file` (STARTTLS and implicit TLS), and
/// refused without it, with another CA, when its certificate expired or
/// names another host. Each refusal is one line naming the relay and what
/// to set.
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
