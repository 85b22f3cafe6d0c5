//! Several SMTP relays with a circuit breaker (`[[smtp.relays]]`), against
//! real in-process SMTP servers: failover when the preferred relay dies
//! mid-load, no job taken while every relay's circuit is open, and the
//! settings that describe them.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::harness::{Harness, http_get};
use crate::common::smtp::{ProxyMode, SmtpProxy, SmtpSink};
use mailgate::settings::{CircuitSettings, RelaySettings, Settings};
use serde_json::{Value, json};

fn relay(url: String, name: &str) -> RelaySettings {
    RelaySettings {
        url: format!("{url}?tls=none").into(),
        name: Some(name.to_owned()),
        tls: Default::default(),
    }
}

/// A relay that can die and come back on the same port: a proxy (which
/// refuses new connections while dead) in front of a sink (which answers
/// 421 on the connections it already has).
struct Mortal {
    sink: SmtpSink,
    proxy: SmtpProxy,
}

impl Mortal {
    fn start() -> Self {
        let sink = SmtpSink::start();
        let proxy = SmtpProxy::start(sink.port);
        Self { sink, proxy }
    }

    fn url(&self) -> String {
        self.proxy.url()
    }

    fn die(&self) {
        self.proxy.set(ProxyMode::Refuse);
        self.sink.set_down(true);
    }

    fn revive(&self) {
        self.sink.set_down(false);
        self.proxy.set(ProxyMode::Forward);
    }
}

/// Every result for `ids` (all of them, within `timeout`), then any late
/// repeat within a second, by id.
async fn results_for(
    h: &Harness,
    ids: &[String],
    timeout: Duration,
) -> BTreeMap<String, Vec<Value>> {
    let deadline = Instant::now() + timeout;
    let mut by_id: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let q = h.settings.amqp.results_queue.clone();
    let mut quiet_until = None;
    loop {
        let missing = ids.iter().filter(|i| !by_id.contains_key(*i)).count();
        if missing == 0 {
            let until = *quiet_until.get_or_insert_with(|| Instant::now() + Duration::from_secs(1));
            if Instant::now() >= until {
                return by_id;
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            missing == 0 || !left.is_zero(),
            "results missing for {:?}",
            ids.iter()
                .filter(|i| !by_id.contains_key(*i))
                .collect::<Vec<_>>()
        );
        if let Some((body, _)) = h.next_on(&q, Duration::from_millis(200)).await {
            let r: Value = serde_json::from_slice(&body).unwrap();
            by_id
                .entry(r["id"].as_str().unwrap().to_owned())
                .or_default()
                .push(r);
        }
    }
}

/// The value of the sample `name` (labels included) on `/metrics`.
async fn metric(addr: std::net::SocketAddr, name: &str) -> Option<f64> {
    let (_, body) = http_get(addr, "/metrics").await;
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// Waits until `cond` holds, or panics with `what` after `timeout`.
async fn eventually<F: std::future::Future<Output = bool>>(
    what: &str,
    timeout: Duration,
    mut cond: impl FnMut() -> F,
) {
    let deadline = Instant::now() + timeout;
    while !cond().await {
        assert!(Instant::now() < deadline, "{what} within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn job(id: &str, n: usize) -> Value {
    // A domain per mailbox: the domain scope's 50 per 10 min stays out of it.
    json!({"id": id, "email": format!("u{n}@example{n}.com"), "code": "1"})
}

fn mailbox(n: usize) -> String {
    format!("u{n}@example{n}.com")
}

/// Two relays, the preferred one dies mid-load. Every job is answered
/// `sent` once and mailed once, by one of them; the first relay's circuit
/// opens and the second takes the load; the first comes back, a probe
/// closes its circuit, and it gets the traffic again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_relay_dies_mid_load_and_every_job_is_sent_once_by_one_of_them() {
    let first = Mortal::start();
    let second = SmtpSink::start();
    let (first_url, second_url) = (first.url(), second.url());
    let h = Harness::with("relays-failover", |s| {
        s.smtp.url = Default::default();
        s.smtp.relays = vec![relay(first_url, "first"), relay(second_url, "second")];
        s.smtp.circuit = CircuitSettings {
            failures: 3,
            cool_down: Duration::from_millis(500),
        };
        s.amqp.prefetch = 32;
    })
    .await;
    // Slow enough that the load is still running when the first dies.
    first.sink.set_delay(Duration::from_millis(10));
    second.set_delay(Duration::from_millis(10));
    let w = h.start_worker().await;
    let n = 200;
    let ids: Vec<String> = (0..n).map(|i| format!("f{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        h.publish(&job(id, i)).await;
    }
    first.sink.wait_for(40, Duration::from_secs(30));
    first.die();
    let died_with = first.sink.mails().len();
    let results = results_for(&h, &ids, Duration::from_secs(60)).await;
    let mut attempts = BTreeMap::new();
    for (id, rs) in &results {
        assert_eq!(rs.len(), 1, "{id}: one result, {rs:?}");
        assert_eq!(rs[0]["status"], "sent", "{id}: {rs:?}");
        *attempts
            .entry(rs[0]["attempts"].as_u64().unwrap())
            .or_insert(0) += 1;
    }
    for i in 0..n {
        let (a, b) = (
            first.sink.mails_to(&mailbox(i)).len(),
            second.mails_to(&mailbox(i)).len(),
        );
        assert_eq!(
            a + b,
            1,
            "{}: {a} mails by the first, {b} by the second",
            mailbox(i)
        );
    }
    let (by_first, by_second) = (first.sink.mails().len(), second.mails().len());
    assert!(by_first < n && by_second > 0, "{by_first} and {by_second}");
    let (_, metrics) = http_get(w.http, "/metrics").await;
    let m = |name: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
    };
    assert_eq!(
        m(r#"mailgate_smtp_relay_sends_total{relay="second"}"#),
        Some(by_second as f64),
        "{metrics}"
    );
    assert_eq!(
        m(r#"mailgate_smtp_relay_sends_total{relay="first"}"#),
        Some(by_first as f64)
    );
    assert!(m(r#"mailgate_smtp_relay_failures_total{relay="first"}"#) >= Some(3.0));
    assert_ne!(
        m(r#"mailgate_smtp_relay_circuit{relay="first"}"#),
        Some(0.0),
        "the first's circuit is open or half-open"
    );
    assert_eq!(
        m(r#"mailgate_smtp_relay_circuit{relay="second"}"#),
        Some(0.0)
    );
    assert_eq!(m("mailgate_smtp_relay_up"), Some(1.0));
    // Ready: the second takes mail.
    let (status, body) = http_get(w.http, "/readyz").await;
    assert_eq!(status, 200, "{body}");
    eprintln!(
        "RELAYS failover jobs={n} lost=0 mailed_twice=0 first={by_first} (died with \
         {died_with}) second={by_second} attempts={attempts:?}"
    );

    // The first comes back: a probe closes its circuit, and, preferred, it
    // takes the next jobs.
    first.revive();
    eventually(
        "the first relay's circuit closes",
        Duration::from_secs(10),
        || async {
            metric(w.http, r#"mailgate_smtp_relay_circuit{relay="first"}"#).await == Some(0.0)
        },
    )
    .await;
    let later: Vec<String> = (n..n + 20).map(|i| format!("f{i}")).collect();
    for (i, id) in later.iter().enumerate() {
        h.publish(&job(id, n + i)).await;
    }
    let results = results_for(&h, &later, Duration::from_secs(30)).await;
    assert!(
        results
            .values()
            .all(|rs| rs.len() == 1 && rs[0]["status"] == "sent"),
        "{results:?}"
    );
    for i in n..n + 20 {
        assert_eq!(
            first.sink.mails_to(&mailbox(i)).len(),
            1,
            "{} went to the first relay again",
            mailbox(i)
        );
        assert!(second.mails_to(&mailbox(i)).is_empty());
    }
    w.stop().await.unwrap();
}

/// Every relay down: the sends that find them failing open their circuits,
/// after which the worker takes no job: none is answered `failed`, only
/// the sends that found the relays failing used an attempt (one each),
/// and `/readyz` says why. One relay comes back, a probe closes its
/// circuit, and the worker resumes on its own: every job sent once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_every_relay_down_no_job_is_failed_and_the_worker_resumes_on_its_own() {
    let (a, b) = (Mortal::start(), Mortal::start());
    a.die();
    b.die();
    let (a_url, b_url) = (a.url(), b.url());
    let h = Harness::with("relays-alldown", |s| {
        s.smtp.url = Default::default();
        s.smtp.relays = vec![relay(a_url, "a"), relay(b_url, "b")];
        s.smtp.circuit = CircuitSettings {
            failures: 2,
            cool_down: Duration::from_millis(500),
        };
        // Three attempts: a job whose attempts were burned would be
        // answered `failed` within the outage.
        s.retry.max_attempts = 3;
    })
    .await;
    let w = h.start_worker().await;
    let n = 30;
    let ids: Vec<String> = (0..n).map(|i| format!("d{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        h.publish(&job(id, i)).await;
    }
    eventually("both circuits open", Duration::from_secs(10), || async {
        metric(w.http, r#"mailgate_smtp_relay_circuit{relay="a"}"#).await == Some(2.0)
            && metric(w.http, r#"mailgate_smtp_relay_circuit{relay="b"}"#).await == Some(2.0)
    })
    .await;
    let (status, body) = http_get(w.http, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("smtp: no SMTP relay takes mail")
            && body.contains("a (circuit open")
            && body.contains("b (circuit open"),
        "{body}"
    );
    assert_eq!(metric(w.http, "mailgate_smtp_relay_up").await, Some(0.0));
    // A few seconds of outage (several cool-downs, several failed probes):
    // nothing is answered.
    h.no_more_results(Duration::from_secs(3)).await;
    let probes = metric(w.http, r#"mailgate_smtp_relay_failures_total{relay="b"}"#)
        .await
        .unwrap();
    assert!(probes >= 3.0, "the probes keep trying: {probes}");

    b.revive();
    let back = Instant::now();
    let results = results_for(&h, &ids, Duration::from_secs(60)).await;
    let recovery = back.elapsed();
    let mut burned = 0;
    for (id, rs) in &results {
        assert_eq!(rs.len(), 1, "{id}: {rs:?}");
        assert_eq!(rs[0]["status"], "sent", "{id}: {rs:?}");
        let attempts = rs[0]["attempts"].as_u64().unwrap();
        assert!(attempts <= 2, "{id}: {attempts} attempts");
        burned += attempts - 1;
    }
    // Only the sends that found the relays failing burned an attempt: the
    // last relay's `failures` that opened its circuit, at most, and those
    // under way on the other connections of the pool then.
    let bound = h.settings.smtp.circuit.failures + h.settings.smtp.pool_size - 1;
    assert!(burned <= u64::from(bound), "{burned} attempts burned");
    for i in 0..n {
        assert_eq!(b.sink.mails_to(&mailbox(i)).len(), 1, "{}", mailbox(i));
    }
    assert!(a.sink.mails().is_empty());
    let (status, body) = http_get(w.http, "/readyz").await;
    assert_eq!(status, 200, "{body}");
    eprintln!(
        "RELAYS all-down jobs={n} lost=0 mailed_twice=0 failed=0 attempts_burned={burned} \
         recovery_ms={}",
        recovery.as_millis()
    );
    w.stop().await.unwrap();
}

/// A worker stopped while every relay's circuit is open returns at once
/// (not after `worker.shutdown_timeout`): the jobs waiting for a relay are
/// handed back unacknowledged, and the next worker sends each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_waiting_for_a_relay_stops_at_once_and_loses_no_job() {
    let a = Mortal::start();
    a.die();
    let url = a.url();
    let h = Harness::with("relays-stop", |s| {
        s.smtp.url = Default::default();
        s.smtp.relays = vec![relay(url, "a")];
        s.smtp.circuit = CircuitSettings {
            failures: 1,
            cool_down: Duration::from_secs(60),
        };
        s.worker.shutdown_timeout = Duration::from_secs(20);
        // Jobs admitted and handed back give their leases back; were one
        // kept, the next worker would take it over once it lapsed.
        s.limits.send_lease = Duration::from_secs(11);
    })
    .await;
    let w = h.start_worker().await;
    let n = 10;
    let ids: Vec<String> = (0..n).map(|i| format!("s{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        h.publish(&job(id, i)).await;
    }
    eventually("the circuit opens", Duration::from_secs(10), || async {
        metric(w.http, r#"mailgate_smtp_relay_circuit{relay="a"}"#).await == Some(2.0)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stopping = Instant::now();
    w.stop().await.unwrap();
    let took = stopping.elapsed();
    assert!(took < Duration::from_secs(5), "stopped in {took:?}");
    h.no_more_results(Duration::from_millis(500)).await;

    // The relay is back; a new worker (a fresh circuit) sends them all.
    a.revive();
    let w = h.start_worker().await;
    let results = results_for(&h, &ids, Duration::from_secs(60)).await;
    for (id, rs) in &results {
        assert_eq!(rs.len(), 1, "{id}: {rs:?}");
        assert_eq!(rs[0]["status"], "sent", "{id}: {rs:?}");
    }
    for i in 0..n {
        assert_eq!(a.sink.mails_to(&mailbox(i)).len(), 1, "{}", mailbox(i));
    }
    eprintln!(
        "RELAYS stop-while-open jobs={n} lost=0 mailed_twice=0 stopped_ms={}",
        took.as_millis()
    );
    w.stop().await.unwrap();
}

/// A config file under the system's temporary directory.
struct TempConfig(PathBuf);

impl TempConfig {
    fn new(name: &str, smtp: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "mailgate-relays-{name}-{}.toml",
            std::process::id()
        ));
        let text = format!(
            "[amqp]\nurl = \"amqp://guest:guest@127.0.0.1:5672/%2f\"\n\
             [redis]\nurl = \"memory://\"\n\
             [smtp]\nfrom = \"Example <no-reply@example.com>\"\n{smtp}\n"
        );
        std::fs::write(&path, text).unwrap();
        Self(path)
    }

    fn load(&self) -> Result<Settings, String> {
        Settings::load(&self.0).map_err(|e| mailgate::report::one_line(&e))
    }
}

impl Drop for TempConfig {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn load(name: &str, smtp: &str) -> Result<Settings, String> {
    TempConfig::new(name, smtp).load()
}

#[test]
fn relay_settings_are_checked_and_never_show_a_password() {
    // Two relays: names default to host:port, never the credentials.
    let s = load(
        "ok",
        "[[smtp.relays]]\nurl = \"smtp://user:Zq8pXk2m@mx1.example.com:2525?tls=required\"\n\
         [[smtp.relays]]\nurl = \"smtps://user:Zq8pXk2m@[2001:db8::1]\"\n\
         [[smtp.relays]]\nurl = \"smtp://mx3.example.com?tls=required\"\nname = \"backup\"\n\
         [smtp.circuit]\nfailures = 3\ncool_down = \"10s\"\n",
    )
    .expect("loads");
    let relays = s.smtp.relay_list().unwrap();
    let names: Vec<&str> = relays.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        names,
        ["mx1.example.com:2525", "[2001:db8::1]:465", "backup"]
    );
    assert_eq!(s.smtp.circuit.failures, 3);
    assert_eq!(s.smtp.circuit.cool_down, Duration::from_secs(10));
    let shown = format!("{s:?} {relays:?}");
    assert!(!shown.contains("Zq8pXk2m"), "{shown}");
    assert!(
        shown.contains("smtp://user:***@mx1.example.com:2525"),
        "{shown}"
    );

    // The one-relay shorthand still works, with default circuit settings.
    let s = load("short", "url = \"smtp://u:Zq8pXk2m@mail.example.com\"").unwrap();
    let relays = s.smtp.relay_list().unwrap();
    assert_eq!(relays.len(), 1);
    assert_eq!(relays[0].name, "mail.example.com:25");
    assert_eq!(
        (s.smtp.circuit.failures, s.smtp.circuit.cool_down),
        (5, Duration::from_secs(30))
    );

    // Several relays in smtp.url, separated by commas: so that every
    // relay's credentials can stay in MAILGATE__SMTP__URL.
    let s = load(
        "list",
        "url = \"smtp://u:Zq8pXk2m@mx1.example.com:587?tls=required,smtps://v:Zq8pXk2m@mx2.example.com\"",
    )
    .unwrap();
    let relays = s.smtp.relay_list().unwrap();
    let names: Vec<&str> = relays.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["mx1.example.com:587", "mx2.example.com:465"]);
    assert!(relays[1].url.starts_with("smtps://v:"));
    assert!(!format!("{s:?} {relays:?}").contains("Zq8pXk2m"));
    assert!(mailgate::mailer::Mailer::new(&s.smtp).is_ok());

    let refused = |name: &str, smtp: &str, says: &[&str]| {
        let e = load(name, smtp).expect_err(smtp);
        for s in says {
            assert!(e.contains(s), "{smtp}: {e}");
        }
        assert!(!e.contains("Zq8pXk2m"), "{e}");
    };
    refused(
        "both",
        "url = \"smtp://a.example.com\"\n[[smtp.relays]]\nurl = \"smtp://b.example.com\"",
        &["smtp.url and [[smtp.relays]] are both set"],
    );
    refused("neither", "", &["smtp.url", "[[smtp.relays]]"]);
    refused(
        "failures",
        "url = \"smtp://a.example.com\"\n[smtp.circuit]\nfailures = 0",
        &["smtp.circuit.failures is 0"],
    );
    refused(
        "cooldown",
        "url = \"smtp://a.example.com\"\n[smtp.circuit]\ncool_down = \"10ms\"",
        &["smtp.circuit.cool_down is 10ms"],
    );
    refused(
        "cooldown-unknown",
        "url = \"smtp://a.example.com\"\n[smtp.circuit]\nopen_for = \"1s\"",
        &["open_for"],
    );
    refused(
        "file",
        "[[smtp.relays]]\nurl = \"file://outbox\"",
        &["smtp.relays[0].url", "file://"],
    );
    refused(
        "scheme",
        "[[smtp.relays]]\nurl = \"http://u:Zq8pXk2m@a.example.com\"",
        &["smtp.relays[0].url", "http://"],
    );
    refused(
        "dup",
        "[[smtp.relays]]\nurl = \"smtp://u:Zq8pXk2m@a.example.com\"\n\
         [[smtp.relays]]\nurl = \"smtp://v:Zq8pXk2m@a.example.com:25\"",
        &["both named \"a.example.com:25\""],
    );
    refused(
        "list-twice",
        "url = \"smtp://u:Zq8pXk2m@a.example.com,smtp://a.example.com:25\"",
        &["smtp.url lists a.example.com:25 twice"],
    );
    // One URL is read as any of several: a scheme that is not SMTP is
    // refused at load, not when the worker builds its mailer.
    refused(
        "one-scheme",
        "url = \"http://u:Zq8pXk2m@a.example.com\"",
        &["smtp.url", "http://"],
    );
    refused(
        "list-file",
        "url = \"smtp://a.example.com,file://outbox\"",
        &["smtp.url", "file://"],
    );
    refused(
        "password-name",
        "[[smtp.relays]]\nurl = \"smtp://u:Zq8pXk2m@a.example.com\"\nname = \"a-Zq8pXk2m\"",
        &["smtp.relays[0].name holds the relay's password"],
    );
    refused(
        "bad-name",
        "[[smtp.relays]]\nurl = \"smtp://a.example.com\"\nname = \"a b\"",
        &["smtp.relays[0].name"],
    );
    refused(
        "userinfo",
        "[[smtp.relays]]\nurl = \"smtp://u:Zq8p/Xk2m@a.example.com\"",
        &["smtp.relays[0].url", "percent-encode"],
    );
    assert!(Path::new("config/default.toml").exists());
}

/// A relay URL is read once, at load, so that what loads is what the
/// mailer can use. `smtp://` hosts are opaque to the URL parser: almost any
/// text is a "host", and these typos load and then fail every send (a DNS
/// lookup of a name that cannot exist), with the relay's circuit opening
/// only once the worker runs: a trailing comma in `MAILGATE__SMTP__URL`, a
/// list separated by `;`, a list given as one `[[smtp.relays]]` url, a
/// comma percent-encoded into the host, port 0.
#[test]
fn relay_urls_that_name_no_reachable_host_are_refused_at_load() {
    for (name, smtp) in [
        (
            "trailing-comma",
            "url = \"smtp://a.example.com,smtp://b.example.com,\"",
        ),
        (
            "semicolons",
            "url = \"smtp://a.example.com;smtp://b.example.com\"",
        ),
        (
            "list-in-relays",
            "[[smtp.relays]]\nurl = \"smtp://a.example.com,smtp://b.example.com\"",
        ),
        ("encoded-comma", "url = \"smtp://a.example.com%2C\""),
        ("port-0", "url = \"smtp://a.example.com:0?tls=required\""),
    ] {
        if let Ok(s) = load(name, smtp) {
            let names: Vec<String> = (s.smtp.relay_list().unwrap().into_iter())
                .map(|r| r.name)
                .collect();
            panic!("{smtp}: loads, as relays {names:?}");
        }
    }
}

/// `tls=` takes `required`, `opportunistic` or `none`, whatever the scheme:
/// a misspelt value on an `smtps://` URL is refused at load as on an
/// `smtp://` one (the settings refused it before relay URLs were read once;
/// `SmtpServer::parse` now reads any `tls=` of `smtps://` as implicit TLS).
#[test]
fn an_unknown_tls_value_is_refused_on_smtps_too() {
    let e = load("smtps-tls", "url = \"smtps://a.example.com?tls=requierd\"")
        .map(|_| ())
        .expect_err("tls=requierd is no TLS mode");
    assert!(e.contains("tls=\"requierd\""), "{e}");
}

/// The README promises that a password holding '/' not percent-encoded is
/// refused at load *before* a parser can print part of it. In `smtp.url`
/// the list is split first (at a comma followed by `scheme://`), so such a
/// password is cut in two and its tail is printed as the next URL's user.
#[test]
fn a_password_cut_by_the_list_split_is_not_printed() {
    let e = load("cut", "url = \"smtp://u:25,smtp://Zq8pXk2m@a.example.com\"")
        .expect_err("the user's password holds '/'");
    assert!(!e.contains("Zq8pXk2m"), "{e}");
}

/// Only a failure before anything of the mail was handed over moves a
/// send to the next relay: a deferred (4xx) or refused (5xx) recipient is
/// the mail's answer, and a mail whose final dot got no reply is never
/// offered to another relay. A 421 mid-transaction is not failed over but
/// counts against the relay's circuit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_relay_level_failure_fails_over() {
    use mailgate::domain::EmailAddress;
    use mailgate::mailer::{MailError, Mailer, Outgoing};
    let (one, two) = (SmtpSink::start(), SmtpSink::start());
    let smtp = |failures| mailgate::settings::SmtpSettings {
        url: Default::default(),
        relays: vec![relay(one.url(), "one"), relay(two.url(), "two")],
        circuit: CircuitSettings {
            failures,
            cool_down: Duration::from_secs(60),
        },
        from: "Test <no-reply@example.com>".into(),
        pool_size: 2,
        timeout: Duration::from_secs(1),
        tls: Default::default(),
        canary: None,
    };
    let send = |m: Mailer, to: &'static str| async move {
        let to = EmailAddress::parse(to).unwrap();
        let out = Outgoing {
            to: &to,
            subject: "s",
            text: "t",
            html: None,
        };
        let mail = m.compose(&out).unwrap();
        let slot = m.reserve().await;
        m.send(slot, mail, &mailgate::domain::JobId::parse("t").unwrap())
            .await
    };
    let m = Mailer::new(&smtp(5)).unwrap();
    assert!(send(m.clone(), "a@example.com").await.is_ok());
    assert_eq!(
        (one.mails().len(), two.mails().len()),
        (1, 0),
        "the first is preferred"
    );

    // Deferred or refused at RCPT: the mail's answer, not the relay's.
    one.reply_with(&[451]);
    let r = send(m.clone(), "b@example.com").await;
    assert!(matches!(r, Err(MailError::Transient(_))), "{r:?}");
    one.refuse("c@", 550);
    let r = send(m.clone(), "c@example.com").await;
    assert!(matches!(r, Err(MailError::Permanent(_))), "{r:?}");
    assert!(two.mails().is_empty(), "nothing offered to the second");

    // The final dot written and no reply within the deadline: delivery
    // unknown, never sent again, by either relay.
    one.set_delay(Duration::from_millis(1_500));
    let r = send(m.clone(), "d@example.com").await;
    assert!(matches!(r, Err(MailError::Unknown(_))), "{r:?}");
    assert!(two.mails().is_empty());
    one.set_delay(Duration::ZERO);
    one.wait_for(2, Duration::from_secs(5));

    // The first refuses the session (421 to EHLO, and to MAIL FROM on its
    // parked connection): the same send goes on to the second.
    one.set_down(true);
    assert!(send(m.clone(), "e@example.com").await.is_ok());
    assert_eq!(two.mails_to("e@").len(), 1);
    assert!(one.mails_to("e@").is_empty());
    assert_eq!(m.relay_health(), Ok(()), "the second works");
    one.set_down(false);

    // A 421 to RCPT (the server closing the session mid-transaction): not
    // failed over, but it counts against the circuit (here 1 opens it), so
    // the next mail goes to the second.
    let m = Mailer::new(&smtp(1)).unwrap();
    one.reply_with(&[421]);
    let r = send(m.clone(), "f@example.com").await;
    assert!(matches!(r, Err(MailError::Transient(_))), "{r:?}");
    assert!(two.mails_to("f@").is_empty());
    assert!(send(m.clone(), "g@example.com").await.is_ok());
    assert_eq!(two.mails_to("g@").len(), 1);
    assert!(one.mails_to("g@").is_empty());
}

/// A relay that sets sessions up but refuses every sender (451 to MAIL
/// FROM: out of quota, suspended) must not pass the probe: a NOOP alone
/// would let its circuit flap closed after each cool-down, and every job
/// would burn its attempts to `failed`. The probe offers the sender (MAIL
/// FROM, then RSET): the circuit stays open, no job fails, and `/readyz`
/// says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_refusing_every_sender_keeps_its_circuit_open() {
    use common::script::{ScriptedSmtp, reply};
    let scripted = ScriptedSmtp::start().await;
    for _ in 0..10_000 {
        scripted.on("MAIL", None, reply(451));
    }
    let url = scripted.url();
    let h = Harness::with("relay-sender", |s| {
        s.smtp.url = Default::default();
        s.smtp.relays = vec![relay(url, "only")];
        s.smtp.circuit = CircuitSettings {
            failures: 2,
            cool_down: Duration::from_millis(300),
        };
        s.retry.max_attempts = 3;
        s.retry.initial = Duration::from_millis(200);
        s.retry.max = Duration::from_millis(400);
    })
    .await;
    let w = h.start_worker().await;
    for i in 0..20 {
        h.publish(
            &json!({"id": format!("s{i}"), "email": format!("u{i}@example{i}.com"),
            "code": "123456"}),
        )
        .await;
    }
    let q = h.settings.amqp.results_queue.clone();
    let started = Instant::now();
    let mut ready_after_open = 0;
    while started.elapsed() < Duration::from_secs(6) {
        if let Some((body, _)) = h.next_on(&q, Duration::from_millis(100)).await {
            let r: Value = serde_json::from_slice(&body).unwrap();
            panic!("a job was answered while its relay refuses every sender: {r}");
        }
        let (status, _) = http_get(w.http, "/readyz").await;
        if started.elapsed() > Duration::from_secs(2) && status == 200 {
            ready_after_open += 1;
        }
    }
    assert_eq!(
        ready_after_open, 0,
        "/readyz said ready while every sender was refused"
    );
    w.stop().await.unwrap();
}

/// With a non-ASCII sender and a relay that does not offer SMTPUTF8 (which
/// every send refuses), the probe refuses as a send does: once the send
/// opened the circuit, it stays open. A probe that offered the sender
/// without SMTPUTF8 would get 250 and keep closing the circuit onto sends
/// that all fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_judges_a_non_ascii_sender_as_a_send_does() {
    use common::script::ScriptedSmtp;
    use mailgate::domain::EmailAddress;
    use mailgate::mailer::{Mailer, Outgoing};
    use mailgate::settings::SmtpSettings;
    let scripted = ScriptedSmtp::start().await;
    let m = Mailer::new(&SmtpSettings {
        url: Default::default(),
        relays: vec![relay(scripted.url(), "only")],
        circuit: CircuitSettings {
            failures: 1,
            cool_down: Duration::from_millis(200),
        },
        from: "Tëst <nöreply@example.com>".into(),
        pool_size: 2,
        timeout: Duration::from_secs(1),
        tls: Default::default(),
        canary: None,
    })
    .unwrap();
    let to = EmailAddress::parse("u@example.com").unwrap();
    let out = Outgoing {
        to: &to,
        subject: "s",
        text: "t",
        html: None,
    };
    let slot = tokio::time::timeout(Duration::from_secs(5), m.reserve())
        .await
        .expect("the circuit starts closed");
    let job = mailgate::domain::JobId::parse("t").unwrap();
    let sent = m.send(slot, m.compose(&out).unwrap(), &job).await;
    assert!(
        matches!(&sent, Err(e) if e.to_string().contains("SMTPUTF8")),
        "{sent:?}"
    );
    // Five cool-downs: the probes all fail, the circuit never closes.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(m.relay_health().is_err());
    assert!(
        tokio::time::timeout(Duration::from_millis(300), m.until_can_send())
            .await
            .is_err(),
        "the circuit closed onto a relay no send can use"
    );
}

/// The probe heeds RSET's outcome: a relay that takes MAIL FROM and then
/// closes the session (421) fails it (a probe that ignored RSET would pass
/// it). A refusal of RSET alone (502: the relay does not know it) still
/// leaves a relay that takes mail; a 421 or silence past the deadline
/// there fails the check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_fails_when_the_relay_drops_the_session_at_rset() {
    use common::script::{ScriptedSmtp, reply};
    use mailgate::mailer::Mailer;
    use mailgate::settings::SmtpSettings;
    let scripted = ScriptedSmtp::start().await;
    let m = Mailer::new(&SmtpSettings {
        url: Default::default(),
        relays: vec![relay(scripted.url(), "only")],
        circuit: CircuitSettings {
            failures: 5,
            cool_down: Duration::from_secs(30),
        },
        from: "noreply@example.com".into(),
        pool_size: 2,
        timeout: Duration::from_secs(1),
        tls: Default::default(),
        canary: None,
    })
    .unwrap();
    scripted.on("RSET", None, reply(502));
    let refused = m.check().await;
    assert!(
        refused.is_ok(),
        "a 502 to RSET failed the check: {refused:?}"
    );
    scripted.on("RSET", None, reply(421).then_close());
    let closing = m.check().await;
    assert!(closing.is_err(), "a 421 to RSET passed the check");
    scripted.on("RSET", None, reply(250).after(Duration::from_secs(3)));
    let silent = m.check().await;
    assert!(silent.is_err(), "a relay silent at RSET passed the check");
    assert!(m.check().await.is_ok(), "a healthy relay failed the check");
}

/// Whether `mailgate_smtp_relay_circuit` says relay `name`'s circuit is
/// open (2).
fn circuit_is_open(name: &str) -> bool {
    let metrics = mailgate::telemetry::prometheus().render();
    let line = format!("mailgate_smtp_relay_circuit{{relay=\"{name}\"}} 2");
    metrics.lines().any(|l| l == line)
}

/// Evidence no recipient can fake: a burst of a stranger's refusals for
/// three domains (sub-domains of them too) right after the relay took a
/// mail opens no circuit (the relay takes mail); a recipient that stalls a
/// relay at RCPT past the send's deadline, or whose refusal arrives just
/// before it, is that mail's own when the canary, asked with a deadline of
/// its own, is taken (found by review: each opened the circuit, the second
/// even with a canary, which was asked with what the send had left).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strangers_burst_or_stall_amid_mail_opens_no_circuit() {
    mailgate::telemetry::prometheus();
    use common::script::{ScriptedSmtp, reply, send_code};
    let (primary, standby) = (ScriptedSmtp::start().await, SmtpSink::start());
    for _ in 0..12 {
        primary.on(
            "RCPT",
            Some("evil"),
            reply(451).saying("4.4.1 no answer from host"),
        );
    }
    let m = refusing_pair(&primary, &standby, 3);
    send_code(&m, "ordinary@fine.example").await.expect("taken");
    for n in 0..12 {
        let to = format!("x{n}@s{n}.evil{}.example", n % 3);
        let r = send_code(&m, &to).await;
        assert!(
            matches!(r, Err(mailgate::mailer::MailError::Transient(_))),
            "{to}: {r:?}"
        );
    }
    assert_eq!(standby.mails().len(), 0);
    assert!(!circuit_is_open("primary"));

    let (primary, standby) = (ScriptedSmtp::start().await, SmtpSink::start());
    for _ in 0..3 {
        primary.on(
            "RCPT",
            Some("stall@"),
            reply(250).after(Duration::from_millis(1_500)),
        );
        primary.on(
            "RCPT",
            Some("late@"),
            reply(451)
                .saying("4.4.1 no answer")
                .after(Duration::from_millis(950)),
        );
    }
    let m = mailgate::mailer::Mailer::new(&mailgate::settings::SmtpSettings {
        url: Default::default(),
        relays: vec![
            relay(primary.url(), "primary"),
            relay(standby.url(), "standby"),
        ],
        circuit: CircuitSettings {
            failures: 2,
            cool_down: Duration::from_secs(60),
        },
        from: "Test <no-reply@example.com>".into(),
        pool_size: 2,
        timeout: Duration::from_secs(1),
        tls: Default::default(),
        canary: Some("canary@acme.example".into()),
    })
    .expect("mailer");
    for n in 0..3 {
        for who in ["stall", "late"] {
            let r = send_code(&m, &format!("{who}@d{n}.example")).await;
            assert!(
                matches!(r, Err(mailgate::mailer::MailError::Transient(_))),
                "{who}: {r:?}"
            );
        }
    }
    assert_eq!(standby.mails().len(), 0);
    assert!(!circuit_is_open("primary"));
}

/// Two relays, `primary` a scripted one and `standby` a sink, with the
/// circuit opening after `failures` relay failures.
fn refusing_pair(
    primary: &common::script::ScriptedSmtp,
    standby: &SmtpSink,
    failures: u32,
) -> mailgate::mailer::Mailer {
    refusing_pair_with(primary, standby, failures, None)
}

/// [`refusing_pair`], with `smtp.canary`.
fn refusing_pair_with(
    primary: &common::script::ScriptedSmtp,
    standby: &SmtpSink,
    failures: u32,
    canary: Option<&str>,
) -> mailgate::mailer::Mailer {
    mailgate::mailer::Mailer::new(&mailgate::settings::SmtpSettings {
        url: Default::default(),
        relays: vec![
            relay(primary.url(), "primary"),
            relay(standby.url(), "standby"),
        ],
        circuit: CircuitSettings {
            failures,
            cool_down: Duration::from_secs(60),
        },
        from: "Test <no-reply@example.com>".into(),
        pool_size: 2,
        timeout: Duration::from_secs(5),
        tls: Default::default(),
        canary: canary.map(str::to_owned),
    })
    .expect("mailer")
}

/// A relay that refuses every mail, with an enhanced status code of the
/// mail system (`452 4.3.1`), SES's `454 Throttling failure`, or a 451 that
/// says it rate-limits, is failing as a relay once the evidence says so:
/// with `smtp.canary` set, it refuses the canary too, and each mail goes on
/// to the standby at once; without one, once its refusals came for three
/// recipient domains in a row (the first two get their own answer, as they
/// could be the mails'). After `failures` such mails the primary's circuit
/// opens (it failed every job while the standby got none). A mailbox that
/// is really full (`552 5.2.2`) fails alone, and the primary keeps taking
/// the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_that_refuses_every_mail_trips_its_circuit() {
    mailgate::telemetry::prometheus();
    use common::script::{ScriptedSmtp, reply, send_code};
    for (code, text) in [
        (452, "4.3.1 insufficient system storage"),
        (454, "Throttling failure: Maximum sending rate exceeded."),
        (451, "rate limit exceeded, try again later"),
    ] {
        // With a canary: the relay refuses it too, so at once.
        let (primary, standby) = (ScriptedSmtp::start().await, SmtpSink::start());
        for _ in 0..10 {
            primary.on("RCPT", None, reply(code).saying(text));
        }
        let m = refusing_pair_with(&primary, &standby, 3, Some("canary@acme.example"));
        for n in 0..6 {
            send_code(&m, &format!("user{n}@example.com"))
                .await
                .unwrap_or_else(|e| panic!("{code}: mail {n} not failed over: {e}"));
        }
        assert_eq!(
            standby.mails().len(),
            6,
            "{code}: every mail through the standby"
        );
        // Three refusals opened its circuit: no session after them but the
        // canary's one (its answer serves the next refusals).
        assert_eq!(primary.connections(), 4, "{code}");
        assert!(circuit_is_open("primary"), "{code}");
        assert_eq!(primary.mails().len(), 0);

        // Without one: refusals for three domains in a row.
        let (primary, standby) = (ScriptedSmtp::start().await, SmtpSink::start());
        for _ in 0..10 {
            primary.on("RCPT", None, reply(code).saying(text));
        }
        let m = refusing_pair(&primary, &standby, 3);
        for n in 0..2 {
            let r = send_code(&m, &format!("user@d{n}.example")).await;
            assert!(
                matches!(r, Err(mailgate::mailer::MailError::Transient(_))),
                "{code}: mail {n} keeps its own answer: {r:?}"
            );
        }
        for n in 2..6 {
            send_code(&m, &format!("user@d{n}.example"))
                .await
                .unwrap_or_else(|e| panic!("{code}: mail {n} not failed over: {e}"));
        }
        assert_eq!(standby.mails().len(), 4, "{code}");
        assert!(circuit_is_open("primary"), "{code}");
    }

    // A refusal that quotes the recipient is read without it:
    // `<throttle1@…>` is no relay that throttles, and a 5.4.1 is how some
    // relays refuse a recipient.
    let (primary, standby) = (ScriptedSmtp::start().await, SmtpSink::start());
    for n in 0..6 {
        let quoted = format!(
            "4.1.1 <throttle{n}@farm.example>: Recipient address rejected: unverified address"
        );
        let dead = "5.4.1 Recipient address rejected: Access denied";
        primary.on(
            "RCPT",
            Some(&format!("throttle{n}@")),
            reply(450).saying(&quoted),
        );
        primary.on("RCPT", Some(&format!("dead{n}@")), reply(550).saying(dead));
    }
    let m = refusing_pair(&primary, &standby, 3);
    for n in 0..6 {
        let r = send_code(&m, &format!("throttle{n}@farm.example")).await;
        assert!(
            matches!(r, Err(mailgate::mailer::MailError::Transient(_))),
            "{r:?}"
        );
        let r = send_code(&m, &format!("dead{n}@farm.example")).await;
        assert!(
            matches!(r, Err(mailgate::mailer::MailError::Permanent(_))),
            "{r:?}"
        );
    }
    assert_eq!(standby.mails().len(), 0);
    assert!(
        !circuit_is_open("primary"),
        "a farmer's recipients cannot open it"
    );

    let (primary, standby) = (ScriptedSmtp::start().await, SmtpSink::start());
    for _ in 0..6 {
        primary.on(
            "RCPT",
            Some("full@"),
            reply(552).saying("5.2.2 mailbox full"),
        );
    }
    let m = refusing_pair(&primary, &standby, 3);
    for n in 0..6 {
        let full = send_code(&m, "full@example.com").await;
        assert!(
            matches!(full, Err(mailgate::mailer::MailError::Permanent(_))),
            "{full:?}"
        );
        send_code(&m, &format!("ok{n}@example.com"))
            .await
            .expect("sent");
    }
    assert_eq!(primary.mails().len(), 6, "the primary keeps taking mail");
    assert_eq!(standby.mails().len(), 0);
    assert!(!circuit_is_open("primary"));
}

/// A refusal that might be the relay's at the end of the message (a
/// content filter's `554` to every message, which no canary recipient can
/// tell) is the relay's once it came for three recipient domains in a row
/// with no mail taken between: the first mails get their own answer (they
/// could be the mails'), the next ones go to the standby, and the circuit
/// opens. The same refusal for many recipients of one domain (a domain
/// whose mail the relay cannot deliver, a stranger's made-up mailboxes
/// there) builds no streak.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_refusal_for_other_recipients_in_a_row_is_the_relays() {
    mailgate::telemetry::prometheus();
    use common::script::{ScriptedSmtp, reply, send_code};
    for text in ["transaction failed", "5.7.1 rejected by the content filter"] {
        let (primary, standby) = (ScriptedSmtp::start().await, SmtpSink::start());
        for _ in 0..10 {
            primary.on(".", None, reply(554).saying(text));
        }
        // A canary changes nothing: it is no message.
        let m = refusing_pair_with(&primary, &standby, 3, Some("canary@acme.example"));
        // The first two keep their own answer (they could be the mails').
        for n in 0..2 {
            let r = send_code(&m, &format!("a{n}@d{n}.example")).await;
            assert!(
                matches!(r, Err(mailgate::mailer::MailError::Permanent(_))),
                "{r:?}"
            );
        }
        for n in 2..6 {
            send_code(&m, &format!("A{n}@D{n}.example"))
                .await
                .unwrap_or_else(|e| panic!("mail {n} not failed over: {e}"));
        }
        assert_eq!(standby.mails().len(), 4, "{text}");
        assert!(circuit_is_open("primary"), "{text}");
    }

    // A canary the relay takes says a refusal at RCPT was the recipient's
    // own, at once, whatever the domains: the standby gets nothing.
    let (primary, standby) = (ScriptedSmtp::start().await, SmtpSink::start());
    for n in 0..6 {
        primary.on(
            "RCPT",
            Some(&format!("made-up{n}@")),
            reply(452).saying("4.3.1 insufficient system storage"),
        );
    }
    let m = refusing_pair_with(&primary, &standby, 3, Some("canary@acme.example"));
    for n in 0..6 {
        let r = send_code(&m, &format!("made-up{n}@d{n}.example")).await;
        assert!(
            matches!(r, Err(mailgate::mailer::MailError::Transient(_))),
            "{r:?}"
        );
    }
    assert_eq!(standby.mails().len(), 0);
    assert!(!circuit_is_open("primary"));
    assert_eq!(primary.mails().len(), 0, "the canary is never mailed");

    // Many recipients of one domain: each its own answer.
    let (primary, standby) = (ScriptedSmtp::start().await, SmtpSink::start());
    for _ in 0..10 {
        primary.on("RCPT", None, reply(451).saying("4.4.1 no answer from host"));
    }
    let m = refusing_pair(&primary, &standby, 3);
    for n in 0..10 {
        let r = send_code(&m, &format!("made-up{n}@unreachable.example")).await;
        assert!(
            matches!(r, Err(mailgate::mailer::MailError::Transient(_))),
            "{r:?}"
        );
    }
    assert_eq!(standby.mails().len(), 0);
    assert!(!circuit_is_open("primary"));

    // Two full mailboxes whose retries take turns (452 with no enhanced
    // code) are two recipients, never a failing relay, however often they
    // alternate; nor is one spelled in other cases.
    let (primary, standby) = (ScriptedSmtp::start().await, SmtpSink::start());
    for _ in 0..12 {
        primary.on("RCPT", None, reply(452).saying("mailbox full"));
    }
    let m = refusing_pair(&primary, &standby, 3);
    for to in [
        "full@alpha.example",
        "full@beta.example",
        "FULL@Alpha.example",
    ]
    .repeat(4)
    {
        let r = send_code(&m, to).await;
        assert!(
            matches!(r, Err(mailgate::mailer::MailError::Transient(_))),
            "{to}: {r:?}"
        );
    }
    assert_eq!(standby.mails().len(), 0);
    assert!(!circuit_is_open("primary"));

    let (primary, standby) = (ScriptedSmtp::start().await, SmtpSink::start());
    for _ in 0..4 {
        primary.on(".", None, reply(554).saying("transaction failed"));
    }
    let m = refusing_pair(&primary, &standby, 3);
    for _ in 0..4 {
        let r = send_code(&m, "same@example.com").await;
        assert!(
            matches!(r, Err(mailgate::mailer::MailError::Permanent(_))),
            "{r:?}"
        );
    }
    assert_eq!(
        standby.mails().len(),
        0,
        "one recipient's refusals stay its own"
    );
    assert!(!circuit_is_open("primary"));
}

/// A relay that throttles at RCPT (451 to every recipient, as a relay over
/// its rate does) while its NOOP probe passes: once its refusals are the
/// relay's (the same one for 3 different recipients in a row), the jobs
/// wait without spending attempts, and every one is sent once it lets mail
/// through again (the fault it guards against: 20 of 20 fail after their
/// attempts and are dead-lettered, with "so it is the relay's" in their
/// error).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttling_relay_spends_no_attempt() {
    let sink = SmtpSink::start();
    let url = sink.url();
    let h = Harness::with("relays-throttle", |s| {
        s.smtp.url = Default::default();
        s.smtp.relays = vec![relay(url, "only")];
        s.smtp.circuit = CircuitSettings {
            failures: 5,
            cool_down: Duration::from_millis(200),
        };
        s.retry.max_attempts = 3;
        s.retry.initial = Duration::from_millis(50);
        s.retry.max = Duration::from_millis(200);
    })
    .await;
    // More refusals than 20 jobs' 3 attempts each could take.
    sink.reply_with(&[451; 100]);
    let w = h.start_worker().await;
    let ids: Vec<String> = (0..20).map(|n| format!("t{n}")).collect();
    for (n, id) in ids.iter().enumerate() {
        h.publish(&job(id, n)).await;
    }
    let results = results_for(&h, &ids, Duration::from_secs(60)).await;
    for (id, rs) in &results {
        assert_eq!(rs.len(), 1, "{id}: {rs:?}");
        assert_eq!(rs[0]["status"], "sent", "{id}: {rs:?}");
    }
    // The first refusals could be the mails' own (a full mailbox): at
    // most those spent an attempt, the 2 before the streak of 3 and the
    // sends already under way on the pool's other connections then.
    let retried = (results.values())
        .filter(|rs| rs[0]["attempts"].as_u64() > Some(1))
        .count();
    let bound = 2 + h.settings.smtp.pool_size as usize - 1;
    assert!(retried <= bound, "{retried} spent an attempt: {results:?}");
    assert!(retried < ids.len() / 2, "{retried} spent an attempt");
    for n in 0..ids.len() {
        assert_eq!(sink.mails_to(&mailbox(n)).len(), 1, "{}", mailbox(n));
    }
    let waited = metric(w.http, r#"mailgate_retries_total{reason="relay"}"#)
        .await
        .unwrap_or(0.0);
    assert!(waited >= 1.0, "{waited}");
    eprintln!(
        "RELAYS throttling jobs=20 failed=0 dead_lettered=0 retried={retried} waited={waited}"
    );
    w.stop().await.unwrap();
}

/// A stranger cannot open a healthy relay's circuit: codes asked for
/// made-up mailboxes at a domain the relay refuses at RCPT in words that
/// could be the relay's (`451 4.4.1`, a `4.3.x`, a bare `451`),
/// interleaved 1:1 with ordinary jobs, are those mails' own answers: they
/// spend their attempts and end `failed`, the circuit stays closed, the
/// relay stays up, and every ordinary code is sent (the fault: 9 to 11 of
/// 30 sent within 25 s, and the stranger's jobs never answered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_cannot_open_a_healthy_relays_circuit() {
    for (n, (code, text)) in [
        (451, "4.4.1 no answer from host"),
        (451, "4.3.0 temporary lookup failure"),
        (451, "local error in processing"),
    ]
    .into_iter()
    .enumerate()
    {
        let sink = SmtpSink::start();
        let url = sink.url();
        let h = Harness::with(&format!("relays-stranger{n}"), |s| {
            s.smtp.url = Default::default();
            s.smtp.relays = vec![relay(url, "only")];
            s.smtp.circuit = CircuitSettings {
                failures: 5,
                cool_down: Duration::from_secs(30),
            };
        })
        .await;
        sink.refuse_saying("@unreachable.example", code, text);
        let w = h.start_worker().await;
        let started = Instant::now();
        let mut ids = Vec::new();
        for i in 0..30 {
            // From a network of its own each (a botnet): no ip rule binds.
            let probe = json!({"id": format!("x{i}"), "email": format!("made-up{i}@unreachable.example"),
                               "ip": format!("198.18.{i}.1"), "code": "1"});
            h.publish(&probe).await;
            h.publish(&job(&format!("o{i}"), i)).await;
            ids.extend([format!("x{i}"), format!("o{i}")]);
        }
        let results = results_for(&h, &ids, Duration::from_secs(60)).await;
        let took = started.elapsed();
        for i in 0..30 {
            let ordinary = &results[&format!("o{i}")];
            assert_eq!(ordinary.len(), 1, "{text}: {ordinary:?}");
            assert_eq!(ordinary[0]["status"], "sent", "{text}: {ordinary:?}");
            let stranger = &results[&format!("x{i}")];
            assert_eq!(stranger.len(), 1, "{text}: {stranger:?}");
            assert_eq!(stranger[0]["status"], "failed", "{text}: {stranger:?}");
        }
        assert_eq!(
            metric(w.http, r#"mailgate_smtp_relay_circuit{relay="only"}"#).await,
            Some(0.0),
            "{text}"
        );
        assert_eq!(
            metric(w.http, "mailgate_smtp_relay_up").await,
            Some(1.0),
            "{text}"
        );
        let failures = metric(
            w.http,
            r#"mailgate_smtp_relay_failures_total{relay="only"}"#,
        )
        .await;
        assert_eq!(failures, Some(0.0), "{text}");
        eprintln!("RELAYS stranger {text:?}: 30 ordinary sent, 30 failed, in {took:?}");
        w.stop().await.unwrap();
    }
}
