//! Nothing stalls the pool: hostile message properties, refused result
//! queues, a stalled or vanished relay and a broker alarm each cost one job
//! at most, and the other jobs flow.

use super::*;

use std::process::Command;
use std::time::{Duration, Instant};

use crate::common;
use crate::common::harness::Harness;
use lapin::options::{BasicPublishOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldArray, FieldTable};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use serde_json::json;

/// A message whose properties RabbitMQ refuses on a republish (`user_id` of
/// another user) or acts on (`CC`, `BCC` naming the jobs queue) ends in
/// `.dead` once; the other jobs are answered; nothing loops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_properties_are_dead_lettered_once_and_the_pool_flows() {
    let h = Harness::new("hostileprops").await;
    let w = h.start_worker().await;
    let jobs = h.settings.amqp.jobs_queue.clone();
    let user = OtherUser::create(&format!("mgtest-{}", std::process::id()));
    let conn = Connection::connect(&user.url(), ConnectionProperties::default())
        .await
        .expect("the other user connects");
    let ch = conn.create_channel().await.unwrap();
    ch.basic_publish(
        "".into(),
        jobs.as_str().into(),
        BasicPublishOptions::default(),
        b"not json",
        BasicProperties::default().with_user_id(user.0.as_str().into()),
    )
    .await
    .unwrap();
    for header in ["CC", "BCC"] {
        let mut headers = FieldTable::default();
        headers.insert(
            header.into(),
            AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::LongString(
                jobs.as_str().into(),
            )])),
        );
        h.publish_raw(
            format!("not json either ({header})").as_bytes(),
            BasicProperties::default().with_headers(headers),
        )
        .await;
    }
    let ids: Vec<String> = (0..5).map(|n| format!("good-{n}")).collect();
    for (n, id) in ids.iter().enumerate() {
        h.publish(&job(id, &format!("u{n}@example.com"))).await;
    }
    let results = h.results(5).await;
    for id in &ids {
        assert_eq!(results[id]["status"], "sent", "{}", results[id]);
    }
    let dead = format!("{jobs}.dead");
    let deadline = Instant::now() + Duration::from_secs(10);
    while depth(&h, &dead).await < 3 {
        assert!(
            Instant::now() < deadline,
            "the three hostile messages reach .dead"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(depth(&h, &dead).await, 3, "each is dead-lettered once");
    assert_eq!(
        depth(&h, &jobs).await,
        0,
        "no copy routed back to the jobs queue"
    );
    // The dead letter keeps the original properties for people, nested.
    let (_, props) = h.dead_letter().await;
    let headers = props.headers().clone().expect("headers");
    assert!(headers.inner().get("CC").is_none() && headers.inner().get("BCC").is_none());
    assert!(props.user_id().is_none());
    assert!(
        matches!(
            headers.inner().get("x-mailgate-original"),
            Some(AMQPValue::FieldTable(_))
        ),
        "{headers:?}"
    );
    h.no_more_results(Duration::from_millis(300)).await;
    let _ = conn.close(200, "bye".into()).await;
    w.stop().await.unwrap();
}

/// A result its `reply_to` queue refuses goes to the results queue; a
/// deleted results or retry queue is declared again. Every delivery is
/// settled and the pool keeps flowing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_or_missing_result_queues_never_stall_the_pool() {
    let h = Harness::with("nacked", |s| s.amqp.prefetch = 2).await;
    let w = h.start_worker().await;
    let full = h.declare("full").await;
    // Make `full` refuse every message: recreate it with max-length 0.
    h.channel
        .queue_delete(full.as_str().into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    let mut args = FieldTable::default();
    args.insert("x-max-length".into(), AMQPValue::LongInt(0));
    args.insert(
        "x-overflow".into(),
        AMQPValue::LongString("reject-publish".into()),
    );
    h.channel
        .queue_declare(full.as_str().into(), QueueDeclareOptions::default(), args)
        .await
        .unwrap();
    for n in 0..2 {
        let body = job(&format!("r{n}"), &format!("r{n}@example.com")).to_string();
        h.publish_raw(
            body.as_bytes(),
            BasicProperties::default().with_reply_to(full.as_str().into()),
        )
        .await;
    }
    for n in 0..3 {
        h.publish(&job(&format!("n{n}"), &format!("n{n}@example.com")))
            .await;
    }
    let results = h.results(5).await;
    assert!(
        results.values().all(|r| r["status"] == "sent"),
        "{results:?}"
    );

    // An operator deletes the results queue and a retry queue meanwhile.
    let results_q = h.settings.amqp.results_queue.clone();
    let retry_q = format!("{}.retry.1", h.settings.amqp.jobs_queue);
    for q in [&results_q, &retry_q] {
        h.channel
            .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await
            .unwrap();
    }
    h.sink.reply_with(&[451]);
    h.publish(&job("after", "after@example.com")).await;
    // (Polled through a channel of its own: reading a missing queue closes it.)
    let deadline = Instant::now() + Duration::from_secs(15);
    while depth(&h, &results_q).await == 0 {
        assert!(
            Instant::now() < deadline,
            "the job is answered into a declared-again queue"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = h.result().await;
    assert_eq!(
        (r["status"].as_str(), r["attempts"].as_u64()),
        (Some("sent"), Some(2)),
        "{r}"
    );
    assert_eq!(depth(&h, &h.settings.amqp.jobs_queue).await, 0);
    w.stop().await.unwrap();
}

/// Messages RabbitMQ forwards but a strict AMQP parser refuses or recurses
/// on: a header table nested as deep as a frame allows, and short strings
/// (`reply_to`, `correlation_id`, a header name) that are not UTF-8. The
/// worker process (its real binary, with its thread stacks) answers them and
/// the jobs behind them; it never aborts or reconnects in a loop. Published
/// with Python's pika, which sends such bytes as they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unparseable_or_deep_properties_never_stop_the_worker() {
    let h = Harness::with("deepprops", |s| {
        s.smtp.timeout = Duration::from_secs(2);
        s.limits.send_lease = Duration::from_secs(7);
    })
    .await;
    let log = common::LogOnFailure::new("deepprops");
    let mut worker = common::KillOnDrop(
        h.command(env!("CARGO_BIN_EXE_mailgate"), &["worker"])
            .stdout(std::process::Stdio::null())
            .stderr(log.stderr())
            .spawn()
            .unwrap(),
    );
    h.wait_for_queue(&h.settings.amqp.jobs_queue).await;
    let jobs = h.settings.amqp.jobs_queue.clone();
    let script = format!(
        r#"
import json, sys, threading, pika
sys.setrecursionlimit(10**6)
threading.stack_size(512 * 1024 * 1024)
def nested(depth):
    d = {{"z": 1}}
    for _ in range(depth):
        d = {{"a": d}}
    return d
def job(i):
    return json.dumps({{"id": "h%d" % i, "email": "h%d@example.com" % i, "code": "1"}})
def run():
    c = pika.BlockingConnection(pika.URLParameters("{url}"))
    ch = c.channel()
    ch.confirm_delivery()
    P = pika.BasicProperties
    for i, p in enumerate([P(headers=nested(17000)), P(reply_to=b"\xff\xfeq"),
                           P(correlation_id=b"\xc3\x28"), P(headers={{b"\xff": "v"}}),
                           P(reply_to="{jobs}.wait"), P(reply_to="{jobs}.retry.1"),
                           P(reply_to="{jobs}.wait.250")]):
        p.delivery_mode = 2
        ch.basic_publish("", "{jobs}", job(i), p)
    c.close()
t = threading.Thread(target=run)
t.start()
t.join()
"#,
        url = common::harness::amqp_url(),
    );
    let out = Command::new("python3")
        .arg("-c")
        .arg(&script)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for n in 0..3 {
        h.publish(&job(&format!("after-{n}"), &format!("a{n}@example.com")))
            .await;
    }
    let results = h.results(10).await;
    assert!(
        results.values().all(|r| r["status"] == "sent"),
        "{results:?}"
    );
    assert_eq!(results["h2"]["correlation_id"], "\u{fffd}(");
    assert!(
        worker.0.try_wait().unwrap().is_none(),
        "the worker is still running"
    );
    // The wait and retry queues still flow: nothing was parked in them.
    h.publish(&job("twice", "t@example.com")).await;
    h.publish(&job("twice", "t@example.com")).await;
    let mut statuses = vec![
        h.result().await["status"].as_str().unwrap().to_owned(),
        h.result().await["status"].as_str().unwrap().to_owned(),
    ];
    statuses.sort();
    assert_eq!(statuses, ["duplicate", "sent"]);
    assert_eq!(depth(&h, &format!("{jobs}.wait")).await, 0);
    drop(worker);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smtp_stalls_the_deadline_fires_and_other_jobs_flow() {
    use common::smtp::{ProxyMode, SmtpProxy};
    let proxy_for = common::smtp::SmtpSink::start();
    let proxy = SmtpProxy::start(proxy_for.port);
    let url = proxy.url();
    let h = Harness::with("stall", |s| {
        s.smtp.url = url.clone().into();
        s.smtp.timeout = Duration::from_secs(1);
        s.retry.initial = Duration::from_millis(50);
    })
    .await;
    // The first two connections the worker opens are accepted and never answered.
    proxy.set(ProxyMode::Stall(2));
    let w = h.start_worker().await;
    let t0 = Instant::now();
    let ids: Vec<String> = (0..30).map(|n| format!("s{n}")).collect();
    for (n, id) in ids.iter().enumerate() {
        h.publish(&json!({"id": id, "email": format!("u{n}@example.com"), "code": "1"}))
            .await;
    }
    let results = results_for(&h, &ids, Duration::from_secs(30)).await;
    let took = t0.elapsed();
    assert_eq!(proxy.stalled(), 2, "two connections were held");
    // The stalled sends hit the deadline before RCPT (the relay's fault,
    // nothing handed over) and waited, spending no attempt.
    assert!(
        results.values().all(|rs| rs[0]["attempts"] == 1),
        "{results:?}"
    );
    let waited = metric(w.http, r#"mailgate_retries_total{reason="relay"}"#).await;
    assert!(
        (1.0..=2.0).contains(&waited),
        "the stalled sends hit the deadline and waited: {waited}"
    );
    assert!(
        results
            .values()
            .all(|rs| rs.len() == 1 && rs[0]["status"] == "sent"),
        "{results:?}"
    );
    for n in 0..ids.len() {
        assert_eq!(proxy_for.mails_to(&format!("u{n}@example.com")).len(), 1);
    }
    eprintln!(
        "FAULT smtp-stall jobs=30 lost=0 mailed_twice=0 waited={waited} all_done_ms={}",
        took.as_millis()
    );
    w.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smtp_gone_then_back() {
    use common::smtp::{ProxyMode, SmtpProxy};
    let sink = common::smtp::SmtpSink::start();
    let proxy = SmtpProxy::start(sink.port);
    let url = proxy.url();
    let h = Harness::with("smtpgone", |s| {
        s.smtp.url = url.clone().into();
        s.retry.max_attempts = 8;
        s.retry.initial = Duration::from_millis(200);
        s.retry.max = Duration::from_secs(1);
        // The relay's circuit opens after 5 failures; a probe every 300 ms.
        s.smtp.circuit.cool_down = Duration::from_millis(300);
    })
    .await;
    proxy.set(ProxyMode::Refuse);
    let w = h.start_worker().await;
    let ids: Vec<String> = (0..20).map(|n| format!("g{n}")).collect();
    for (n, id) in ids.iter().enumerate() {
        h.publish(&json!({"id": id, "email": format!("u{n}@example.com"), "code": "1"}))
            .await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let back = Instant::now();
    proxy.set(ProxyMode::Forward);
    let results = results_for(&h, &ids, Duration::from_secs(30)).await;
    let recovery = back.elapsed();
    assert!(
        results
            .values()
            .all(|rs| rs.len() == 1 && rs[0]["status"] == "sent"),
        "{results:?}"
    );
    // No send used an attempt: those that found the server gone (until
    // its circuit opened, and those under way then) waited, as the others
    // waited for the circuit to close.
    assert!(
        results.values().all(|rs| rs[0]["attempts"] == 1),
        "{results:?}"
    );
    let retried = metric(w.http, r#"mailgate_retries_total{reason="relay"}"#).await as u32;
    assert!(
        retried >= 1 && retried <= h.settings.smtp.circuit.failures + h.settings.smtp.pool_size,
        "{retried} jobs waited"
    );
    for n in 0..ids.len() {
        assert_eq!(sink.mails_to(&format!("u{n}@example.com")).len(), 1);
    }
    eprintln!(
        "FAULT smtp-down jobs=20 lost=0 mailed_twice=0 waited={retried} recovery_ms={}",
        recovery.as_millis()
    );
    w.stop().await.unwrap();
}

/// A RabbitMQ memory alarm (on a node of the test's own): `/readyz` says
/// the connection is blocked, SIGTERM still returns within
/// `worker.shutdown_timeout`, and once the alarm clears the job is answered
/// by the next worker, mailed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_alarm_is_reported_and_never_holds_shutdown() {
    let rabbit = common::PrivateRabbit::start();
    let url = rabbit.url();
    let h = Harness::with("alarm", |s| {
        s.amqp.url = url.into();
        s.worker.shutdown_timeout = Duration::from_secs(3);
    })
    .await;
    // Long enough for the alarm to be raised before the result goes out:
    // `rabbitmqctl` alone took over 1.5 s under the suite's load (the
    // result then went out before the alarm, twice in CI-like runs).
    h.sink.set_delay(Duration::from_millis(4_000));
    let w = h.start_worker().await;
    h.publish(&json!({"id": "alarmed", "email": "a@example.com", "code": "1"}))
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    rabbit.memory_alarm(true);
    // The mail goes out; its result cannot.
    h.sink.wait_for(1, Duration::from_secs(10));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = common::harness::http_get(w.http, "/readyz").await;
        if status == 503 && body.contains("blocked") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "readyz never said blocked: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let started = Instant::now();
    w.stop().await.unwrap();
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(3_500),
        "shutdown took {took:?} with shutdown_timeout 3s during an alarm"
    );
    rabbit.memory_alarm(false);
    h.sink.set_delay(Duration::ZERO);
    let w = h.start_worker().await;
    let r = h.result().await;
    assert_eq!(
        (r["id"].as_str(), r["status"].as_str()),
        (Some("alarmed"), Some("sent")),
        "{r}"
    );
    assert_eq!(h.sink.mails().len(), 1, "mailed once");
    eprintln!(
        "FAULT alarm shutdown_ms={} (timeout 3000)",
        took.as_millis()
    );
    w.stop().await.unwrap();
}
