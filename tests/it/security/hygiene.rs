//! Security hygiene, against the real binary and the real services: no
//! secret (AMQP, Redis or SMTP password) shows in logs, `/metrics`,
//! `/readyz`, `check-config` output or error messages; the HTTP listener is
//! on loopback unless told otherwise; the Docker image runs as a user other
//! than root. (Templates reached through a symlink out of `templates/` are
//! refused: `mail::templates::tests` and
//! `tools::cli::check_config_refuses_ambiguous_or_escaping_templates`.)

use crate::common;

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::common::harness::{Harness, http_get};
use crate::common::smtp::SmtpSink;

/// One password per service, each unlike anything else in the output.
const AMQP_SECRET: &str = "AmqpS3cret7q";
const REDIS_SECRET: &str = "RedisS3cret4k";
const SMTP_SECRET: &str = "SmtpS3cret9x";

/// `url` (`scheme://host…`) with `user:secret@` put in front of its host.
fn with_password(url: &str, user: &str, secret: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let rest = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    format!("{scheme}://{user}:{secret}@{rest}")
}

/// Panics, naming where, if `text` holds any of the secrets.
fn assert_no_secret(text: &str, what: &str) {
    for secret in [AMQP_SECRET, REDIS_SECRET, SMTP_SECRET] {
        assert!(
            !text.contains(secret),
            "{what} shows the password {secret}:\n{text}"
        );
    }
}

/// A free loopback port (closed again; the binary binds it next).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

fn output(mut c: Command) -> Output {
    c.stdin(Stdio::null()).output().expect("the binary runs")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A worker whose RabbitMQ refuses its password keeps retrying, and
/// serves `/metrics` and `/readyz` meanwhile; with every URL carrying a
/// password, none shows in its log (at debug, so the libraries' own lines
/// are in it too), its metrics, its readiness answer or its errors. A
/// Redis that refuses the password stops it, with an error that does not
/// show it either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_password_shows_in_logs_metrics_readiness_or_errors() {
    let h = Harness::new("hygiene-run").await;
    let smtp = SmtpSink::start();
    let port = free_port();
    let amqp = with_password(&h.settings.amqp.url, "guest", AMQP_SECRET);
    let smtp_url = with_password(&smtp.url(), "mailer", SMTP_SECRET);
    let mut c = h.command(env!("CARGO_BIN_EXE_mailgate"), &["worker"]);
    c.env("MAILGATE__AMQP__URL", &amqp)
        .env("MAILGATE__SMTP__URL", &smtp_url)
        .env("MAILGATE__HTTP__LISTEN", format!("127.0.0.1:{port}"))
        .env("RUST_LOG", "debug")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = c.spawn().expect("the worker starts");
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    // It serves while it retries RabbitMQ.
    let mut served = None;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Ok(r) = mailgate::cli::http_get(addr, "/readyz").await {
            served = Some(r);
            break;
        }
    }
    let (status, readiness) = served.expect("the worker serves /readyz");
    assert_eq!(status, 503, "{readiness}");
    assert_no_secret(&readiness, "/readyz");
    let (_, metrics) = http_get(addr, "/metrics").await;
    assert_no_secret(&metrics, "/metrics");
    // A few reconnection attempts, each logged.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let out = common::signal_and_wait(child, "-TERM", Duration::from_secs(30)).await;
    let log = text(&out);
    assert!(
        log.contains("rabbitmq"),
        "the refused connection is logged:\n{log}"
    );
    assert_no_secret(&log, "the worker's log");

    // A Redis that refuses the password (it has none set) stops the worker
    // at start, saying why.
    let redis = with_password(&h.settings.redis.url, "", REDIS_SECRET);
    let mut c = h.command(env!("CARGO_BIN_EXE_mailgate"), &["worker"]);
    c.env("MAILGATE__REDIS__URL", &redis)
        .env("MAILGATE__HTTP__LISTEN", "127.0.0.1:0")
        .env("RUST_LOG", "debug");
    let out = tokio::task::spawn_blocking(move || output(c))
        .await
        .unwrap();
    assert!(!out.status.success());
    let log = text(&out);
    assert!(log.to_lowercase().contains("redis"), "{log}");
    assert_no_secret(&log, "the worker's start-up error");
}

/// `check-config`, and `check-config --connect` (which connects to each
/// service with the password and reports what failed), show the URLs
/// redacted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_config_never_shows_a_password() {
    let h = Harness::new("hygiene-check").await;
    let smtp = SmtpSink::start();
    let urls = [
        (
            "MAILGATE__AMQP__URL",
            with_password(&h.settings.amqp.url, "guest", AMQP_SECRET),
        ),
        (
            "MAILGATE__REDIS__URL",
            with_password(&h.settings.redis.url, "", REDIS_SECRET),
        ),
        (
            "MAILGATE__SMTP__URL",
            with_password(&smtp.url(), "mailer", SMTP_SECRET),
        ),
    ];
    for args in [&["check-config"][..], &["check-config", "--connect"]] {
        let mut c = h.command(env!("CARGO_BIN_EXE_mailgate"), args);
        for (k, v) in &urls {
            c.env(k, v);
        }
        let out = tokio::task::spawn_blocking(move || output(c))
            .await
            .unwrap();
        let said = text(&out);
        if args.len() == 2 {
            // It names each service it connects to, redacted.
            assert!(said.contains(":***@"), "{said}");
        }
        assert_no_secret(&said, &format!("{args:?}"));
    }
}

/// The metrics and health endpoint listens on loopback unless an operator
/// says otherwise: in the settings' default and in the shipped config.
#[test]
fn the_http_listener_is_on_loopback_by_default() {
    let default = mailgate::settings::HttpSettings::default();
    assert!(default.listen.ip().is_loopback(), "{}", default.listen);
    let shipped = mailgate::settings::Settings::load(std::path::Path::new("config/default.toml"))
        .expect("the shipped config loads");
    assert!(
        shipped.http.listen.ip().is_loopback(),
        "{}",
        shipped.http.listen
    );
}

/// The image's last `USER` is a numeric id other than 0 (a name could map
/// to root; Kubernetes' `runAsNonRoot` needs a number), set in the final
/// stage.
#[test]
fn the_docker_image_runs_as_a_user_other_than_root() {
    let dockerfile = std::fs::read_to_string("Dockerfile").expect("Dockerfile");
    let last_stage = dockerfile
        .rsplit_once("\nFROM ")
        .map(|(_, stage)| stage)
        .expect("a final stage");
    let user = last_stage
        .lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix("USER "))
        .expect("the final stage sets USER");
    let uid: u32 = user
        .split(':')
        .next()
        .unwrap_or_default()
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("USER {user:?} is not a numeric id"));
    assert_ne!(uid, 0, "the image runs as root");
}

/// An OTLP endpoint the exporter cannot parse is refused when settings
/// load, `check-config` included, and named redacted (the exporter's own
/// error would quote it whole, password and all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_otlp_endpoint_is_refused_without_its_password() {
    let h = Harness::new("hygiene-otlp").await;
    for endpoint in [
        "http://user:OtlpS3cret@[::1",
        "http://user:Otlp S3cret@collector:4318",
    ] {
        for args in [&["check-config"][..], &["worker"]] {
            let mut c = h.command(env!("CARGO_BIN_EXE_mailgate"), args);
            c.env("MAILGATE__TELEMETRY__OTLP_ENDPOINT", endpoint);
            let out = tokio::task::spawn_blocking(move || output(c))
                .await
                .unwrap();
            let said = text(&out);
            assert!(
                !out.status.success(),
                "{args:?} accepted {endpoint}: {said}"
            );
            assert!(said.contains("otlp_endpoint"), "{said}");
            assert!(
                !said.contains("S3cret"),
                "{args:?} shows the password: {said}"
            );
        }
    }
}

/// A relay that quotes the mail back in its refusal, in the forms the mail
/// carries the code in (quoted-printable, HTML-escaped, an encoded subject,
/// a base64 body line), some cut over the reply's lines: none of them
/// reaches the result, nor the suppression list where a `5.1.1` keeps its
/// reason for 30 days; the reason's status and address stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_quoting_the_code_in_any_encoding_shows_it_nowhere() {
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let h = Harness::new("quotedcode").await;
    let cases = [
        (
            "q1",
            "policy1@example.com",
            "5.7.1",
            "Zx=9Qp12",
            "Zx=3D9Qp12",
        ),
        (
            "q2",
            "policy2@example.com",
            "5.7.1",
            "12<34>&56",
            "12&lt;34&gt;&amp;56",
        ),
        (
            "q3",
            "gone@example.com",
            "5.1.1",
            "Zx=9Qp12",
            "Zx=3D9Qp= 12",
        ),
    ];
    let quoted = |code: &str, form: &str| {
        let subject = format!("=?utf-8?b?{}?=", b64(&format!("Your code {code}")));
        let body = b64(&format!(
            "Hello,\r\nyour code is {code}; it expires in 10 minutes."
        ));
        let (head, tail) = body.split_at(24);
        format!("> {form} | {subject} | {head} {tail} |")
    };
    for (_, email, enhanced, code, form) in cases {
        let text = format!("{enhanced} refused {}", quoted(code, form));
        h.sink.refuse_saying(email, 550, &text);
    }
    let w = h.start_worker().await;
    for (id, email, enhanced, code, form) in cases {
        h.publish(&serde_json::json!({"id": id, "email": email, "code": code}))
            .await;
        let r = h.result().await;
        assert_eq!(r["status"], "failed", "{r}");
        let error = r["error"].as_str().unwrap();
        let expected = format!("{enhanced} refused > *** | *** | *** |");
        assert!(error.contains(&expected), "{error}");
        assert!(!error.contains(code) && !error.contains(form), "{error}");
    }
    let listed = h.run_tool(&["suppress", "list", "--json"]).await;
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.contains("gone@example.com"), "{listed}");
    assert!(
        listed.contains("5.1.1 refused > *** | *** | *** |"),
        "{listed}"
    );
    w.stop().await.unwrap();
}

/// A job's variables are hidden as its code is: a relay that quotes the
/// refused mail (a link with a token, as written, HTML-escaped, or in a
/// base64 body line) shows the value in no result, dead letter, `job` or
/// `dead show` output (which already hide the job's own variables).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_quoting_a_jobs_variables_shows_them_nowhere() {
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let h = Harness::with("quotedvars", |s| s.retry.max_attempts = 1).await;
    let link = "https://app.example/v?t=tok_live_5ecret&u=1";
    // As the HTML part carries it (minijinja's escaping).
    let html = link.replace('&', "&amp;").replace('/', "&#x2f;");
    let text = format!(
        "4.7.1 deferred > {link} | {html} | {} |",
        b64(&format!("click {link} to verify"))
    );
    h.sink.refuse_saying("linked@", 451, &text);
    let w = h.start_worker().await;
    h.publish(
        &serde_json::json!({"id": "v1", "email": "linked@example.com", "code": "482913",
                                   "vars": {"link": link, "app_name": "Acme"}}),
    )
    .await;
    let r = h.result().await;
    assert_eq!(r["status"], "failed", "{r}");
    let error = r["error"].as_str().unwrap();
    assert!(
        error.contains("4.7.1 deferred > *** | *** | *** |"),
        "{error}"
    );
    let dead = format!("{}.dead", h.settings.amqp.jobs_queue);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while h.queue_depth(&dead).await != Some(1) {
        assert!(std::time::Instant::now() < deadline, "dead-lettered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for args in [
        &["dead", "show", "v1"][..],
        &["dead", "list"],
        &["job", "v1"],
    ] {
        let out = h.run_tool(args).await;
        let out = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(!out.contains("5ecret"), "{args:?}: {out}");
    }
    w.stop().await.unwrap();
}
