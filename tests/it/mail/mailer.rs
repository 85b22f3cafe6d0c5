//! The real `Mailer` against real in-process SMTP servers (the scripted
//! server in `common/script.rs`): connections that failed or timed out are
//! never reused, replies are attributed to the right mail, and failures are
//! classified by the SMTP phase they happened in.

use crate::common;

use std::time::{Duration, Instant};

use crate::common::script::{ScriptedSmtp, base64, reply};
use mailgate::mailer::{MailError, Mailer};
use mailgate::settings::SmtpSettings;

fn mailer(url: &str, pool_size: u32, timeout: Duration) -> Mailer {
    Mailer::new(&SmtpSettings {
        url: url.into(),
        relays: Vec::new(),
        circuit: Default::default(),
        from: "Test <no-reply@example.com>".into(),
        pool_size,
        timeout,
        tls: Default::default(),
        canary: None,
    })
    .expect("mailer")
}

async fn send(m: &Mailer, to: &str) -> Result<(), MailError> {
    common::script::send_code(m, to).await
}

fn verbs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[track_caller]
fn assert_kind(r: &Result<(), MailError>, kind: &str, contains: &str) {
    let ok = match (r, kind) {
        (Err(MailError::Relay(t)), "relay")
        | (Err(MailError::Transient(t)), "transient")
        | (Err(MailError::Permanent(t)), "permanent")
        | (Err(MailError::Unknown(t)), "unknown") => t.contains(contains),
        _ => false,
    };
    assert!(ok, "expected {kind} containing {contains:?}, got {r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_rcpt_closes_the_connection_and_the_next_mail_uses_a_new_one() {
    let server = ScriptedSmtp::start().await;
    let m = mailer(&server.url(), 1, Duration::from_secs(1));
    send(&m, "a@example.com").await.expect("a is sent");
    server.on(
        "RCPT",
        Some("slow@"),
        reply(250).after(Duration::from_secs(2)),
    );

    let t0 = Instant::now();
    let slow = send(&m, "slow@example.com").await;
    assert_kind(&slow, "transient", "RCPT: the send deadline of 1s passed");
    assert!(
        t0.elapsed() < Duration::from_millis(1800),
        "{:?}",
        t0.elapsed()
    );

    // Attributed correctly: b is refused at RCPT, so a stale 250 (the late
    // answer to slow@) cannot be taken for b's.
    server.on("RCPT", Some("b@"), reply(550));
    assert_kind(
        &send(&m, "b@example.com").await,
        "permanent",
        "SMTP 550 to RCPT",
    );
    send(&m, "c@example.com").await.expect("c is sent");
    tokio::time::sleep(Duration::from_millis(1500)).await; // the late reply went out

    assert_eq!(
        server.connections(),
        3,
        "a new connection after each failure"
    );
    assert_eq!(
        server.verbs(0),
        verbs(&["EHLO", "MAIL", "RCPT", "DATA", "MAIL", "RCPT"]),
        "nothing more on the timed-out connection"
    );
    assert_eq!(server.verbs(1), verbs(&["EHLO", "MAIL", "RCPT", "QUIT"]));
    assert_eq!(server.verbs(2), verbs(&["EHLO", "MAIL", "RCPT", "DATA"]));
    let mails = server.mails();
    assert_eq!(mails.len(), 2, "{mails:?}");
    assert_eq!(server.accepted_to("a@").len(), 1);
    assert_eq!(server.accepted_to("c@")[0].conn, 2);
    assert!(m.relay_health().is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_end_of_data_is_unknown_and_the_connection_is_not_reused() {
    let server = ScriptedSmtp::start().await;
    let m = mailer(&server.url(), 1, Duration::from_secs(1));
    send(&m, "a@example.com").await.expect("a is sent");
    server.on(".", Some("slow@"), reply(250).after(Duration::from_secs(2)));

    let slow = send(&m, "slow@example.com").await;
    assert_kind(&slow, "unknown", "delivery unknown: end of data");

    server.on("RCPT", Some("b@"), reply(550));
    assert_kind(
        &send(&m, "b@example.com").await,
        "permanent",
        "SMTP 550 to RCPT",
    );
    send(&m, "c@example.com").await.expect("c is sent");
    tokio::time::sleep(Duration::from_millis(1500)).await;

    assert_eq!(server.connections(), 3);
    assert_eq!(
        server.verbs(0),
        verbs(&["EHLO", "MAIL", "RCPT", "DATA", "MAIL", "RCPT", "DATA"]),
        "nothing more on the connection whose end of data timed out"
    );
    assert_eq!(server.verbs(2), verbs(&["EHLO", "MAIL", "RCPT", "DATA"]));
    // The server did get slow@'s mail (hence "unknown"); each mail once.
    for (who, conn) in [("a@", 0), ("slow@", 0), ("c@", 2)] {
        let got = server.accepted_to(who);
        assert_eq!(got.len(), 1, "{who}: {got:?}");
        assert_eq!(got[0].conn, conn, "{who}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_send_closes_its_connection() {
    let server = ScriptedSmtp::start().await;
    let m = mailer(&server.url(), 1, Duration::from_secs(10));
    send(&m, "a@example.com").await.expect("a is sent");
    server.on(
        "RCPT",
        Some("slow@"),
        reply(250).after(Duration::from_secs(1)),
    );
    let cancelled =
        tokio::time::timeout(Duration::from_millis(300), send(&m, "slow@example.com")).await;
    assert!(cancelled.is_err(), "the caller gave up first");
    send(&m, "b@example.com").await.expect("b is sent");
    assert_eq!(server.connections(), 2);
    assert_eq!(
        server.verbs(0),
        verbs(&["EHLO", "MAIL", "RCPT", "DATA", "MAIL", "RCPT"])
    );
    assert_eq!(server.accepted_to("b@")[0].conn, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_are_classified_by_phase_and_a_failed_connection_is_not_reused() {
    replies_are_classified(false).await;
}

/// The same, with MAIL FROM, RCPT and DATA sent in one write (RFC 2920).
/// The scripted server answers a pipelined DATA after a refused RCPT with
/// 354, as a careless server might: the mail must still not go out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_replies_are_classified_by_phase_and_a_failed_connection_is_not_reused() {
    replies_are_classified(true).await;
}

async fn replies_are_classified(pipelining: bool) {
    let server = ScriptedSmtp::start().await;
    if pipelining {
        server.advertise(&["PIPELINING"]);
    }
    let m = mailer(&server.url(), 1, Duration::from_secs(5));
    send(&m, "a@example.com").await.expect("a is sent");

    server.on(".", Some("eod554@"), reply(554));
    let r = send(&m, "eod554@example.com").await;
    assert_kind(&r, "permanent", "SMTP 554 to end of data");
    send(&m, "b@example.com").await.expect("b is sent");
    assert_eq!(server.connections(), 2, "not reused after the 554");
    assert_eq!(server.verbs(0).last().map(String::as_str), Some("QUIT"));
    assert_eq!(server.accepted_to("b@")[0].conn, 1);

    let cases = [
        ("RCPT", "rcpt550@", 550, "permanent", "SMTP 550 to RCPT"),
        ("RCPT", "rcpt451@", 451, "transient", "SMTP 451 to RCPT"),
        ("DATA", "", 554, "permanent", "SMTP 554 to DATA"),
        ("DATA", "", 451, "transient", "SMTP 451 to DATA"),
        (".", "eod452@", 452, "transient", "SMTP 452 to end of data"),
        ("MAIL", "", 550, "relay", "relay: SMTP 550 to MAIL FROM"),
        ("MAIL", "", 451, "relay", "relay: SMTP 451 to MAIL FROM"),
    ];
    for (verb, needle, code, kind, text) in cases {
        let to = if needle.is_empty() {
            format!("{verb}{code}@example.com").to_lowercase()
        } else {
            format!("{needle}example.com")
        };
        let needle = (!needle.is_empty()).then_some(needle);
        server.on(verb, needle, reply(code));
        let before = server.connections();
        assert_kind(&send(&m, &to).await, kind, text);
        send(&m, "ok@example.com")
            .await
            .expect("the next one is sent");
        assert_eq!(server.connections(), before + 1, "{verb} {code}");
    }
    // MAIL FROM refused marked the relay down; the next send brought it back.
    assert!(m.relay_health().is_ok());
    assert_eq!(server.accepted_to("ok@").len(), cases.len());
    // a, eod554, b, eod452 (refused), and one ok@ per case.
    assert_eq!(server.mails().len(), 4 + cases.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_failures_are_relay_errors_and_health_recovers() {
    let metrics = mailgate::telemetry::prometheus();
    let gauge = || {
        metrics
            .render()
            .lines()
            .find(|l| l.starts_with("mailgate_smtp_relay_up"))
            .map(str::to_owned)
    };
    let server = ScriptedSmtp::start().await;
    let timeout = Duration::from_secs(2);

    let m = mailer(&format!("{}?tls=required", server.url()), 1, timeout);
    let r = send(&m, "a@example.com").await;
    assert_kind(
        &r,
        "relay",
        "STARTTLS required but not offered by 127.0.0.1:",
    );
    assert!(m.relay_health().unwrap_err().contains("STARTTLS"));
    assert_eq!(gauge().as_deref(), Some("mailgate_smtp_relay_up 0"));

    let url = format!("smtp://user:p%40ss@127.0.0.1:{}?tls=none", server.port);
    let m = mailer(&url, 1, timeout);
    let r = send(&m, "a@example.com").await;
    assert_kind(&r, "relay", "AUTH (PLAIN or LOGIN) required");
    assert!(m.relay_health().unwrap_err().contains("AUTH"));
    let mail_from_sent =
        (0..server.connections()).any(|c| server.verbs(c).contains(&"MAIL".into()));
    assert!(!mail_from_sent, "no mail without the required TLS or AUTH");

    let refused = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = refused.local_addr().unwrap().port();
    drop(refused);
    let m = mailer(&format!("smtp://127.0.0.1:{port}"), 1, timeout);
    assert_kind(
        &send(&m, "a@example.com").await,
        "relay",
        "connecting to 127.0.0.1:",
    );
    assert_kind(&m.check().await, "relay", "connecting to 127.0.0.1:");

    let m = mailer(&server.url(), 1, timeout);
    server.greet_with(421);
    let r = send(&m, "a@example.com").await;
    assert_kind(&r, "relay", "SMTP 421 to the greeting or EHLO");
    assert!(m.relay_health().unwrap_err().contains("421"));
    assert_kind(&m.check().await, "relay", "421");
    assert_eq!(gauge().as_deref(), Some("mailgate_smtp_relay_up 0"));
    server.greet_with(220);
    send(&m, "a@example.com")
        .await
        .expect("the relay works again");
    assert_eq!(m.relay_health(), Ok(()));
    assert_eq!(gauge().as_deref(), Some("mailgate_smtp_relay_up 1"));
    let before = server.connections();
    m.check().await.expect("check");
    // The check offers the sender too, then resets: nothing is handed over.
    assert_eq!(
        server.verbs(before),
        verbs(&["EHLO", "NOOP", "MAIL", "RSET", "QUIT"])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_are_percent_decoded_and_sent_with_auth() {
    let server = ScriptedSmtp::start().await;
    server.advertise(&["AUTH PLAIN LOGIN"]);
    // tls=none: a relay on this machine may take credentials in clear
    // (the scripted server has no TLS).
    // A `+` in a URL's userinfo is a plus, not a space (as it would be in
    // a form): the relay gets the password as written.
    let url = format!("smtp://user:p%40s+s@127.0.0.1:{}?tls=none", server.port);
    let m = mailer(&url, 1, Duration::from_secs(2));
    send(&m, "a@example.com").await.expect("sent");
    let auth = format!("AUTH PLAIN {}", base64(b"\0user\0p@s+s"));
    assert_eq!(server.commands(0)[1], auth);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_connection_the_server_closed_is_replaced_once() {
    let server = ScriptedSmtp::start().await;
    server.close_after_mail(true);
    let m = mailer(&server.url(), 1, Duration::from_secs(2));
    for to in ["a@example.com", "b@example.com", "c@example.com"] {
        send(&m, to).await.expect("sent");
    }
    assert_eq!(server.connections(), 3);
    for (n, who) in ["a@", "b@", "c@"].iter().enumerate() {
        let got = server.accepted_to(who);
        assert_eq!(got.len(), 1, "{who}");
        assert_eq!(got[0].conn, n, "{who}");
    }
    assert_eq!(server.mails().len(), 3);
    assert!(m.relay_health().is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_421_to_mail_from_on_a_parked_connection_is_retried_once_on_a_new_one() {
    let server = ScriptedSmtp::start().await;
    let m = mailer(&server.url(), 1, Duration::from_secs(2));
    send(&m, "a@example.com").await.expect("a is sent");
    server.on("MAIL", None, reply(421).then_close());
    send(&m, "b@example.com")
        .await
        .expect("b is sent on a new connection");
    assert_eq!(server.connections(), 2);
    assert_eq!(server.accepted_to("b@")[0].conn, 1);

    // The retry is made once: a second 421 is the relay's answer.
    server.on("MAIL", None, reply(421).then_close());
    server.on("MAIL", None, reply(421).then_close());
    let r = send(&m, "c@example.com").await;
    assert_kind(&r, "relay", "SMTP 421 to MAIL FROM");
    assert_eq!(server.connections(), 3);
    assert!(m.relay_health().is_err());

    // On a new connection a 421 to MAIL FROM is not retried.
    let fresh = mailer(&server.url(), 1, Duration::from_secs(2));
    server.on("MAIL", None, reply(421).then_close());
    assert_kind(&send(&fresh, "d@example.com").await, "relay", "421");
    assert_eq!(server.connections(), 4);
    assert!(server.accepted_to("c@").is_empty() && server.accepted_to("d@").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_sends_never_open_more_connections_than_the_pool() {
    let server = ScriptedSmtp::start().await;
    server.slow_end_of_data(Duration::from_millis(20));
    let m = mailer(&server.url(), 4, Duration::from_secs(10));
    let tasks: Vec<_> = (0..60)
        .map(|n| {
            let m = m.clone();
            tokio::spawn(async move { send(&m, &format!("u{n}@example.com")).await })
        })
        .collect();
    for t in tasks {
        t.await.expect("task").expect("sent");
    }
    assert!(server.max_open() <= 4, "{} open at once", server.max_open());
    assert!(server.connections() <= 4, "{} opened", server.connections());
    assert_eq!(server.mails().len(), 60);
    for n in 0..60 {
        assert_eq!(server.accepted_to(&format!("<u{n}@")).len(), 1, "u{n}");
    }
}

#[tokio::test]
async fn try_reserve_says_whether_a_connection_is_free() {
    let m = mailer("smtp://127.0.0.1:1", 1, Duration::from_secs(1));
    let slot = m.try_reserve().expect("one free");
    assert!(m.try_reserve().is_none());
    drop(slot);
    assert!(m.try_reserve().is_some());
}
