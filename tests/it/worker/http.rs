//! The operator's endpoint: metrics move with the work, health and
//! readiness answer.

use crate::common;

use crate::common::harness::{Harness, http_get};
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use serde_json::json;

fn value(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// Publishes a job to each of `emails` (ids `<prefix><n>`), stamped with
/// a `timestamp_in_ms` header, so their results feed the latency histogram.
async fn publish_timed(h: &Harness, prefix: &str, emails: &[&str]) {
    let now_ms = mailgate::domain::now_ms() as i64;
    let mut headers = FieldTable::default();
    headers.insert("timestamp_in_ms".into(), AMQPValue::LongLongInt(now_ms));
    for (n, email) in emails.iter().enumerate() {
        let job = json!({"id": format!("{prefix}{n}"), "email": email, "code": "1"});
        h.publish_raw(
            job.to_string().as_bytes(),
            BasicProperties::default().with_headers(headers.clone()),
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_the_jobs_and_health_answers() {
    let h = Harness::new("metrics").await;
    let w = h.start_worker().await;
    assert_eq!(http_get(w.http, "/healthz").await.0, 200);
    let (status, body) = http_get(w.http, "/readyz").await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("rabbitmq: ok") && body.contains("redis: ok") && body.contains("smtp: ok"),
        "{body}"
    );

    publish_timed(
        &h,
        "m",
        &["a@example.com", "a@example.com", "b@example.com"],
    )
    .await;
    h.publish(&json!({"id": "bad", "code": "1"})).await;
    h.results(4).await;

    let (status, m) = http_get(w.http, "/metrics").await;
    assert_eq!(status, 200);
    assert_eq!(
        value(&m, "mailgate_jobs_total{status=\"sent\"}"),
        2.0,
        "{m}"
    );
    assert_eq!(
        value(&m, "mailgate_jobs_total{status=\"rejected\"}"),
        1.0,
        "{m}"
    );
    assert_eq!(
        value(&m, "mailgate_jobs_total{status=\"invalid\"}"),
        1.0,
        "{m}"
    );
    assert_eq!(
        value(&m, "mailgate_limiter_decisions_total{verdict=\"admitted\"}"),
        2.0,
        "{m}"
    );
    assert!(m.contains("mailgate_limiter_decisions_total{verdict=\"rejected\",scope=\"email\",window_ms=\"60000\",max=\"1\"} 1"), "{m}");
    assert_eq!(
        value(&m, "mailgate_smtp_send_seconds_count{outcome=\"ok\"}"),
        2.0,
        "{m}"
    );
    assert_eq!(
        value(
            &m,
            "mailgate_publish_to_result_seconds_count{status=\"sent\"}"
        ),
        2.0,
        "{m}"
    );
    assert_eq!(value(&m, "mailgate_jobs_in_flight"), 0.0, "{m}");

    // `mailgate probe` is the container health check: ready means exit 0.
    let addr = w.http.to_string();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_mailgate"))
            .args(["probe"])
            .env("MAILGATE__HTTP__LISTEN", addr)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("redis: ok"));
    w.stop().await.unwrap();
}

/// Whether the server closed `stream` (EOF or reset) within `wait`.
async fn closed_within(stream: &mut tokio::net::TcpStream, wait: std::time::Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 256];
    loop {
        match tokio::time::timeout(wait, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

/// A client that never finishes its request neither keeps a connection
/// past the header timeout nor holds the worker's shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_sent_request_holds_nothing() {
    use tokio::io::AsyncWriteExt;
    let h = Harness::with("http-half", |s| {
        s.worker.shutdown_timeout = std::time::Duration::from_secs(3);
    })
    .await;
    let w = h.start_worker().await;
    let mut slow = tokio::net::TcpStream::connect(w.http).await.unwrap();
    slow.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    assert!(
        closed_within(
            &mut slow,
            mailgate::http::HEADER_TIMEOUT + std::time::Duration::from_secs(2)
        )
        .await,
        "the header timeout closes it"
    );
    let mut held = tokio::net::TcpStream::connect(w.http).await.unwrap();
    held.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let started = std::time::Instant::now();
    w.stop().await.unwrap();
    assert!(
        started.elapsed() < std::time::Duration::from_secs(2),
        "shutdown took {:?} with a client half-way through a request",
        started.elapsed()
    );
    assert!(closed_within(&mut held, std::time::Duration::from_secs(1)).await);
}

/// Idle connections beyond the cap are closed at once; the worker keeps
/// working; once the idle ones time out, the endpoint answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_capped() {
    let h = Harness::new("http-cap").await;
    let w = h.start_worker().await;
    let mut idle = Vec::new();
    for _ in 0..100 {
        idle.push(tokio::net::TcpStream::connect(w.http).await.unwrap());
    }
    let mut closed = 0;
    for s in &mut idle {
        if closed_within(s, std::time::Duration::from_millis(200)).await {
            closed += 1;
        }
    }
    assert!(
        closed >= 100 - mailgate::http::MAX_CONNECTIONS,
        "{closed} of 100 closed"
    );
    h.publish(&json!({"id": "busy", "email": "b@example.com", "code": "1"}))
        .await;
    assert_eq!(h.result().await["status"], "sent");
    tokio::time::sleep(mailgate::http::HEADER_TIMEOUT + std::time::Duration::from_secs(1)).await;
    assert_eq!(http_get(w.http, "/healthz").await.0, 200);
    drop(idle);
    w.stop().await.unwrap();
}

/// `/readyz` checks what the worker needs of Redis, not only that it
/// answers: a primary demoted to a replica, or a policy that evicts keys,
/// is named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_names_a_redis_the_worker_cannot_use() {
    let redis = common::PrivateRedis::start();
    let other = common::PrivateRedis::start();
    let url = redis.url();
    let h = Harness::with("http-redis", |s| s.redis.url = url.into()).await;
    let w = h.start_worker().await;
    common::harness::wait_ready(w.http).await;
    let mut conn = redis.connection();
    // A flood of probes costs Redis one check a second, not one each.
    let scripts = |conn: &mut redis::Connection| -> u64 {
        let info: String = redis::cmd("INFO").arg("commandstats").query(conn).unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
            .and_then(|r| r.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let before = scripts(&mut conn);
    let started = std::time::Instant::now();
    for _ in 0..100 {
        assert_eq!(http_get(w.http, "/readyz").await.0, 200);
    }
    let seconds = started.elapsed().as_secs();
    let calls = scripts(&mut conn) - before;
    assert!(calls <= seconds + 2, "{calls} script calls in {seconds} s");
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "maxmemory-policy", "allkeys-lru"])
        .query(&mut conn)
        .unwrap();
    // Readiness sees it within its cache's second.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let (status, body) = http_get(w.http, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("maxmemory-policy allkeys-lru"), "{body}");
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "maxmemory-policy", "noeviction"])
        .query(&mut conn)
        .unwrap();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(other.port)
        .query(&mut conn)
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let (status, body) = http_get(w.http, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("read-only replica"), "{body}");
    w.stop().await.unwrap();
}

/// While the worker is still starting (here: Redis does not answer yet),
/// `/healthz` answers, so a liveness probe does not restart it, and
/// `/readyz` says it is starting; SIGTERM still stops it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_answers_while_the_worker_starts() {
    let h = Harness::new("http-starting").await;
    let free = |()| {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
    };
    let (http, no_redis) = (free(()), free(()));
    let mut worker = common::KillOnDrop(
        h.command(env!("CARGO_BIN_EXE_mailgate"), &["worker"])
            .env("MAILGATE__HTTP__LISTEN", http.to_string())
            .env(
                "MAILGATE__REDIS__URL",
                format!("redis://127.0.0.1:{}/0", no_redis.port()),
            )
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while tokio::net::TcpStream::connect(http).await.is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "no endpoint at {http}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // Redis keeps refusing: the worker is still starting, and says so,
    // naming Redis, its address and the cause; the dependencies not yet
    // checked are unknown, not down (read as down, every one would page an
    // alert about a dependency that is fine).
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let ready = http_get(http, "/readyz").await;
    assert_eq!(ready.0, 503, "{}", ready.1);
    let at = format!("127.0.0.1:{}", no_redis.port());
    assert!(
        ready.1.contains("redis: starting") && ready.1.contains(&at) && ready.1.contains("refused"),
        "{}",
        ready.1
    );
    assert!(
        !ready.1.contains("rabbitmq") && !ready.1.contains("smtp"),
        "{}",
        ready.1
    );
    let metrics = http_get(http, "/metrics").await.1;
    assert!(
        !metrics.contains("mailgate_dependency_up{dependency=\"rabbitmq\"} 0")
            && !metrics.contains("mailgate_dependency_up{dependency=\"smtp\"} 0"),
        "{metrics}"
    );
    // The Redis it cannot reach is down, so an alert on the gauge fires
    // for a fleet started into an outage.
    assert!(
        metrics.contains("mailgate_dependency_up{dependency=\"redis\"} 0"),
        "{metrics}"
    );
    assert_eq!(http_get(http, "/healthz").await.0, 200);
    let started = std::time::Instant::now();
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &worker.0.id().to_string()])
        .status();
    let status = tokio::task::spawn_blocking(move || worker.0.wait().unwrap())
        .await
        .unwrap();
    assert!(status.success(), "{status:?}");
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
}

/// The metric names an expression or text uses: `mailgate_…` words.
fn metric_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("mailgate_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        // A word that merely contains it (e.g. `x_mailgate_y`) is not one.
        let word_start =
            at == 0 || !rest[..at].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_');
        if word_start {
            names.insert(tail[..end].to_owned());
        }
        rest = &tail[end..];
    }
    names
}

/// Every metric `deploy/grafana/mailgate.json` and
/// `deploy/prometheus/alerts.yml` read is one a real worker exports, once
/// it has answered a sent, a rejected and an invalid job: a renamed metric
/// breaks CI, not an on-call's night. (`promtool check rules` and `promtool
/// test rules` run from scripts/test.) The gauges of what `/readyz` checks
/// and of the backlog are there from the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_and_alerts_read_is_exported() {
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string("deploy/grafana/mailgate.json").unwrap())
            .expect("the dashboard is JSON");
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(str::to_owned))
        .collect();
    assert!(exprs.len() >= 7, "{exprs:?}");
    let mut used = metric_names(&exprs.join("\n"));
    used.extend(metric_names(
        &std::fs::read_to_string("deploy/prometheus/alerts.yml").unwrap(),
    ));
    assert!(used.len() >= 10, "{used:?}");

    let h = Harness::new("metric-names").await;
    let w = h.start_worker().await;
    let (_, before) = http_get(w.http, "/metrics").await;
    for gauge in [
        "mailgate_dependency_up{dependency=\"redis\"}",
        "mailgate_jobs_queue_messages",
        "mailgate_dead_letters_total",
        "mailgate_jobs_total{status=\"failed\"}",
    ] {
        assert!(
            before.contains(gauge),
            "{gauge} is not there from the start:\n{before}"
        );
    }
    common::harness::wait_ready(w.http).await;
    publish_timed(&h, "n", &["a@example.com", "a@example.com"]).await;
    h.publish(&json!({"id": "bad", "code": "1"})).await;
    h.results(3).await;
    let (_, m) = http_get(w.http, "/metrics").await;
    let exported: std::collections::BTreeSet<String> = m
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect();
    // A histogram named in prose is its series' base name.
    let missing: Vec<&String> = (used.iter())
        .filter(|n| !exported.contains(*n) && !exported.contains(&format!("{n}_bucket")))
        .collect();
    assert!(missing.is_empty(), "not exported: {missing:?}\n{m}");
    for dependency in ["rabbitmq", "redis", "smtp"] {
        let series = format!("mailgate_dependency_up{{dependency=\"{dependency}\"}}");
        assert_eq!(value(&m, &series), 1.0, "{series} after /readyz:\n{m}");
    }
    w.stop().await.unwrap();
}

/// The backlog gauge's source: the jobs waiting in the jobs queue, read
/// without taking them (a passive declare on a channel of its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_jobs_waiting_are_counted_without_taking_them() {
    let h = Harness::new("jobs-waiting").await;
    let broker = mailgate::broker::Broker::connect(&h.settings)
        .await
        .expect("broker");
    assert_eq!(broker.jobs_waiting().await.unwrap(), 0);
    for n in 0..3 {
        h.publish(&json!({"id": format!("w{n}"), "email": "a@example.com", "code": "1"}))
            .await;
    }
    let mut seen = 0;
    for _ in 0..50 {
        seen = broker.jobs_waiting().await.unwrap();
        if seen == 3 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(seen, 3);
    assert_eq!(broker.jobs_waiting().await.unwrap(), 3, "still there");
    broker.close(std::time::Duration::from_secs(5)).await;
}

/// While the worker cannot reach RabbitMQ, `/readyz` names RabbitMQ, its
/// address (without the password) and why, not only "not connected".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_names_the_broker_it_cannot_reach() {
    let port = common::free_port();
    let h = Harness::new("http-nobroker").await;
    let mut settings = h.settings.clone();
    settings.amqp.url = format!("amqp://guest:secret-pw@127.0.0.1:{port}/%2f").into();
    let worker = mailgate::worker::build(&settings)
        .await
        .expect("the worker builds");
    let http = worker.http_addr();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(worker.run(async {
        let _ = rx.await;
    }));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let body = loop {
        let (status, body) = http_get(http, "/readyz").await;
        if status == 503 && body.contains("refused") {
            break body;
        }
        assert!(std::time::Instant::now() < deadline, "{status} {body}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert!(
        body.contains(&format!(
            "rabbitmq: RabbitMQ at amqp://guest:***@127.0.0.1:{port}"
        )),
        "{body}"
    );
    assert!(!body.contains("secret-pw"), "{body}");
    let _ = tx.send(());
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), run).await;
}

/// `promtool check metrics` finds nothing to say of a live `/metrics`, once
/// a job was sent: every family has its HELP text (issue 42: "no help
/// text" for all 15), and the names follow Prometheus's conventions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promtool_finds_a_live_metrics_page_clean() {
    use std::io::Write as _;
    let h = Harness::new("promtool-metrics").await;
    let w = h.start_worker().await;
    h.publish(&serde_json::json!({"id": "p1", "email": "p1@example.com", "code": "1"}))
        .await;
    assert_eq!(h.result().await["status"], "sent");
    let (_, body) = http_get(w.http, "/metrics").await;
    w.stop().await.unwrap();
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool is installed (scripts/test installs it)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && said.trim().is_empty(), "{said}");
}

/// The families a `/metrics` page has series of: a histogram's
/// `_bucket`/`_sum`/`_count` series count as its own name.
fn families(page: &str) -> std::collections::BTreeSet<String> {
    let histograms: Vec<&str> = page
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" histogram"))
        .collect();
    page.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(|name| {
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .filter(|base| histograms.contains(base));
            base.unwrap_or(name).to_owned()
        })
        .collect()
}

/// The README's list of metrics is `/metrics`, both ways: every family it
/// names is there from start-up, before any job, so a `rate()` or an
/// alert has a series to read from the first scrape; and every family a
/// worker exports once it has answered jobs of each kind is in the list
/// (issue 42: `mailgate_bounces_total` was missing from it, four counters
/// appeared only after their first event).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_lists_every_metric_and_each_is_there_from_start_up() {
    let readme = std::fs::read_to_string("README.md").unwrap();
    let start = readme
        .find("- **Metrics** on `/metrics`")
        .expect("the README's Metrics bullet");
    let end = start + 1 + readme[start + 1..].find("\n- **").expect("a next bullet");
    let listed = metric_names(&readme[start..end]);
    assert!(listed.len() >= 20, "{listed:?}");

    // Shadow rules, so that their family has series to show: the domain's
    // with its network share (10 × 0.2: a series of max 2).
    let h = Harness::with("readme-metrics", |s| {
        let shadow = |secs, max| mailgate::settings::Rule {
            window: std::time::Duration::from_secs(secs),
            max,
            enforce: false,
        };
        s.limits.email.rules.push(shadow(3600, 3));
        s.limits.domain.rules = vec![shadow(600, 10)];
        s.limits.domain.network_share = 0.2;
    })
    .await;
    let w = h.start_worker().await;
    let (_, at_start) = http_get(w.http, "/metrics").await;
    // Each configured rule's series starts at zero, so that `increase`
    // sees its first rejection (found by review: a share's was born at 2).
    let email_minute = h.settings.limits.email.rules[0];
    for series in [
        r#"mailgate_limiter_shadow_rejections_total{scope="domain",window_ms="600000",max="2"} 0"#
            .to_owned(),
        r#"mailgate_limiter_shadow_rejections_total{scope="domain",window_ms="600000",max="10"} 0"#
            .to_owned(),
        format!(
            r#"mailgate_limiter_decisions_total{{verdict="rejected",scope="email",window_ms="{}",max="{}"}} 0"#,
            email_minute.window_ms(),
            email_minute.max
        ),
    ] {
        assert!(
            at_start.contains(&series),
            "{series} at start-up:\n{at_start}"
        );
    }
    let there = families(&at_start);
    let absent: Vec<&String> = listed.difference(&there).collect();
    assert!(
        absent.is_empty(),
        "listed in the README, not on /metrics at start-up: {absent:?}\n{at_start}"
    );

    common::harness::wait_ready(w.http).await;
    publish_timed(&h, "r", &["a@example.com", "a@example.com"]).await;
    h.publish(&json!({"id": "bad", "code": "1"})).await;
    h.results(3).await;
    let (_, after) = http_get(w.http, "/metrics").await;
    w.stop().await.unwrap();
    let unlisted: Vec<String> = families(&after).difference(&listed).cloned().collect();
    assert!(
        unlisted.is_empty(),
        "on /metrics, not in the README's list: {unlisted:?}"
    );
}
