//! The promises, each against a way it was once broken (issue 9's eleven
//! reproduced defects), with the real worker, RabbitMQ, Redis and an SMTP
//! server: a hostile or unlucky message never loops or stalls the pool, an id
//! is never mailed twice or bound to another mailbox, every message gets an
//! answer, and rejections leave nothing behind.
//!
//! Defect 3 (a timed-out SMTP connection reused) is reproduced at the
//! mailer in `tests/mailer.rs`; defect 11's CLI ids here.

use crate::common;

use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::harness::{Harness, http_get};
use lapin::options::{BasicPublishOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldArray, FieldTable};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use serde_json::{Value, json};

fn job(id: &str, email: &str) -> Value {
    json!({"id": id, "email": email, "code": "493817"})
}

/// How many messages `queue` holds now.
async fn depth(h: &Harness, queue: &str) -> u32 {
    let ch = h.channel_for_checks().await;
    let passive = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    let n = ch
        .queue_declare(queue.into(), passive, FieldTable::default())
        .await
        .map(|q| q.message_count())
        .unwrap_or(0);
    let _ = ch.close(200, "ok".into()).await;
    n
}

/// A RabbitMQ user of the test's own, deleted when dropped.
struct OtherUser(String);

impl OtherUser {
    fn create(name: &str) -> Self {
        let ctl = |args: &[&str]| {
            let ok = Command::new("rabbitmqctl")
                .arg("-q")
                .args(args)
                .status()
                .expect("rabbitmqctl runs")
                .success();
            assert!(ok, "rabbitmqctl {args:?}");
        };
        ctl(&["add_user", name, "pw"]);
        ctl(&["set_permissions", "-p", "/", name, ".*", ".*", ".*"]);
        Self(name.to_owned())
    }

    fn url(&self) -> String {
        format!("amqp://{}:pw@127.0.0.1:5672/%2f", self.0)
    }
}

impl Drop for OtherUser {
    fn drop(&mut self) {
        let _ = Command::new("rabbitmqctl")
            .args(["-q", "delete_user", &self.0])
            .status();
    }
}

/// Defect 1: a message whose properties RabbitMQ refuses on a republish
/// (`user_id` of another user) or acts on (`CC`, `BCC` naming the jobs
/// queue) ends in `.dead` once; the other jobs are answered; nothing loops.
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

/// Defect 2: a copy of a job seen after its `expires_at` never refunds an
/// admission whose send began: one mail, and no `expired` beside `sent`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_copy_never_refunds_a_sent_admission() {
    let h = Harness::with("expirecopy", |s| {
        s.smtp.pool_size = 1;
        s.smtp.timeout = Duration::from_secs(2);
        s.limits.send_lease = Duration::from_secs(7);
    })
    .await;
    h.sink.set_delay(Duration::from_millis(1_200));
    let w = h.start_worker().await;
    for n in 0..2 {
        h.publish(&job(&format!("backlog-{n}"), &format!("b{n}@example.com")))
            .await;
    }
    let expires = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(3);
    let x = json!({"id": "x", "email": "x@example.com", "code": "1", "expires_at": expires.to_string()});
    h.publish(&x).await;
    h.publish(&x).await;
    let mut statuses = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while statuses.len() < 2 {
        assert!(
            Instant::now() < deadline,
            "both copies of x are answered: {statuses:?}"
        );
        let r = h.result().await;
        if r["id"] == "x" {
            statuses.push(r["status"].as_str().unwrap().to_owned());
        }
    }
    statuses.sort();
    assert_eq!(statuses, ["duplicate", "sent"]);
    assert_eq!(h.sink.mails_to("x@example.com").len(), 1);
    // The quota the mail used is kept.
    h.publish(&job("x2", "x@example.com")).await;
    assert_eq!(h.result().await["status"], "rejected");
    w.stop().await.unwrap();
}

/// Defect 4: an id answered `rejected` (or `invalid`) and published again
/// later is a new job: its retry after a 4xx is not taken for "answered
/// before"; every message gets exactly one final result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_answered_rejected_or_invalid_can_be_published_again() {
    let h = Harness::with("republish", |s| {
        s.limits.email = common::rules(&[(1_500, 1)]);
        s.limits.ip = common::rules(&[]);
    })
    .await;
    let w = h.start_worker().await;
    h.publish(&job("first", "a@example.com")).await;
    assert_eq!(h.result().await["status"], "sent");
    h.publish(&job("s", "a@example.com")).await;
    let r = h.result().await;
    assert_eq!(r["status"], "rejected", "{r}");
    tokio::time::sleep(Duration::from_millis(
        r["retry_after_ms"].as_u64().unwrap() + 50,
    ))
    .await;
    h.sink.reply_with(&[451]);
    h.publish(&job("s", "a@example.com")).await;
    let r = h.result().await;
    assert_eq!(
        (r["status"].as_str(), r["attempts"].as_u64()),
        (Some("sent"), Some(2)),
        "{r}"
    );

    let bad = json!({"id": "t", "email": "t@example.com", "code": "1", "purpose": "nope"});
    h.publish(&bad).await;
    assert_eq!(h.result().await["status"], "invalid");
    h.sink.reply_with(&[451]);
    h.publish(&job("t", "t@example.com")).await;
    assert_eq!(h.result().await["status"], "sent");
    h.no_more_results(Duration::from_millis(500)).await;
    assert_eq!(h.sink.mails_to("a@example.com").len(), 2);
    assert_eq!(h.sink.mails_to("t@example.com").len(), 1);
    w.stop().await.unwrap();
}

/// Defect 5: an id being retried for mailbox A, reused for victim B (at
/// their limit), is `invalid` naming the id; B gets no mail; A's retry is
/// sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_reused_for_another_mailbox_is_invalid_and_mails_nobody() {
    let h = Harness::with("idreuse", |s| {
        s.retry.initial = Duration::from_millis(800);
        s.retry.max = Duration::from_millis(800);
    })
    .await;
    let w = h.start_worker().await;
    h.publish(&job("b-1", "victim@example.com")).await;
    assert_eq!(h.result().await["status"], "sent");
    h.sink.reply_with(&[451]);
    h.publish(&job("S-1", "a@example.com")).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    h.publish(&job("S-1", "victim@example.com")).await;
    let results: Vec<Value> = vec![h.result().await, h.result().await];
    let b = results
        .iter()
        .find(|r| r["email"] == "victim@example.com")
        .expect("B answered");
    let a = results
        .iter()
        .find(|r| r["email"] == "a@example.com")
        .expect("A answered");
    assert_eq!(b["status"], "invalid", "{b}");
    assert!(b["error"].as_str().unwrap().contains("S-1"), "{b}");
    assert_eq!(a["status"], "sent", "{a}");
    assert_eq!(
        h.sink.mails_to("victim@example.com").len(),
        1,
        "B got one mail, not two"
    );
    assert_eq!(h.sink.mails_to("a@example.com").len(), 1);
    w.stop().await.unwrap();
}

/// Defect 6: a result its `reply_to` queue refuses goes to the results
/// queue; a deleted results or retry queue is declared again. Every
/// delivery is settled and the pool keeps flowing.
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

/// Defect 7: an id is never mailed twice within `dedup_for`, whatever the
/// rules (none here: the old record lived 1 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_is_mailed_once_even_without_rules() {
    let h = Harness::with("norules", |s| {
        s.limits.email = common::rules(&[]);
        s.limits.ip = common::rules(&[]);
    })
    .await;
    let w = h.start_worker().await;
    h.publish(&job("once", "a@example.com")).await;
    assert_eq!(h.result().await["status"], "sent");
    tokio::time::sleep(Duration::from_millis(500)).await;
    h.publish(&job("once", "a@example.com")).await;
    assert_eq!(h.result().await["status"], "duplicate");
    assert_eq!(h.sink.mails().len(), 1);
    w.stop().await.unwrap();
}

/// Defect 8: rejected and invalid jobs leave nothing in Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejections_leave_nothing_in_redis() {
    let h = Harness::new("nokeys").await;
    let w = h.start_worker().await;
    h.publish(&job("sent", "victim@example.com")).await;
    assert_eq!(h.result().await["status"], "sent");
    let keys = || h.redis_keys().len();
    let before = keys();
    assert_eq!(before, 2, "one job record and one mailbox log");
    for n in 0..100 {
        h.publish(&job(&format!("flood-{n}"), "victim@example.com"))
            .await;
    }
    h.publish(&json!({"id": "bad", "email": "not an address", "code": "1"}))
        .await;
    let results = h.results(101).await;
    assert_eq!(
        results
            .values()
            .filter(|r| r["status"] == "rejected")
            .count(),
        100
    );
    assert_eq!(
        keys(),
        before,
        "100 rejections and an invalid job wrote no key"
    );
    w.stop().await.unwrap();
}

/// Defect 9: a dead letter moved back to the jobs queue (headers and all,
/// as a shovel or the management UI does) is processed afresh, as attempt 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_dead_letter_is_processed_afresh() {
    let h = Harness::with("replay", |s| {
        s.retry.max_attempts = 2;
        s.retry.initial = Duration::from_millis(50);
    })
    .await;
    let w = h.start_worker().await;
    h.sink.reply_with(&[451, 451]);
    h.publish(&job("poison", "p@example.com")).await;
    let r = h.result().await;
    assert_eq!(
        (r["status"].as_str(), r["attempts"].as_u64()),
        (Some("failed"), Some(2))
    );
    let (body, props) = h.dead_letter().await;
    // Neither the dead letter nor the original headers it keeps carry the
    // lineage's ticket: a replay, however it restores headers, starts afresh.
    let headers = props.headers().clone().expect("headers");
    assert!(headers.inner().get("x-mailgate-ticket").is_none());
    let Some(AMQPValue::FieldTable(original)) = headers.inner().get("x-mailgate-original") else {
        panic!("{headers:?}");
    };
    if let Some(AMQPValue::FieldTable(theirs)) = original.inner().get("headers") {
        assert!(
            theirs
                .inner()
                .keys()
                .all(|k| !k.as_str().starts_with("x-mailgate-")),
            "{theirs:?}"
        );
    }
    // The operator fixed the cause (the relay answers 250 now) and moves it back.
    h.publish_raw(&body, props).await;
    let r = h.result().await;
    assert_eq!(
        (r["status"].as_str(), r["attempts"].as_u64()),
        (Some("sent"), Some(1)),
        "{r}"
    );
    assert_eq!(h.sink.mails_to("p@example.com").len(), 1);
    w.stop().await.unwrap();
}

/// Defect 10: a misconfigured relay (`?tls=required` without STARTTLS) is
/// the relay's failure, not the job's: the job waits without spending
/// attempts (issue 26's review), the quota kept meanwhile, and `/readyz`
/// and `mailgate_smtp_relay_up` say the relay is failing; once the relay
/// is set right, the job is sent on its first attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misconfigured_relay_is_retried_and_reported() {
    let mut h = Harness::with("relay", |s| {
        s.smtp.url = format!("{}?tls=required", s.smtp.url);
        s.retry.max_attempts = 3;
        s.retry.initial = Duration::from_millis(300);
    })
    .await;
    let w = h.start_worker().await;
    h.publish(&job("r1", "r@example.com")).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (status, body) = http_get(w.http, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("smtp:") && body.contains("STARTTLS"),
        "{body}"
    );
    let (_, metrics) = http_get(w.http, "/metrics").await;
    assert!(
        metrics.lines().any(|l| l == "mailgate_smtp_relay_up 0"),
        "{metrics}"
    );
    // Meanwhile the admission holds the quota: another job for r@ waits.
    h.publish(&job("r2", "r@example.com")).await;
    let r2 = h.result().await;
    assert_eq!(r2["status"], "rejected", "{r2}");
    // Past its 3 attempts' backoff, r1 is still waiting, not failed.
    h.no_more_results(Duration::from_secs(3)).await;
    let (_, metrics) = http_get(w.http, "/metrics").await;
    assert!(
        !metrics.contains("mailgate_retries_total{reason=\"relay\"} 0"),
        "{metrics}"
    );
    w.stop().await.unwrap();
    // The operator sets the relay right: r1 is sent, on its first attempt.
    h.settings.smtp.url = h.sink.url();
    let w = h.start_worker().await;
    let r = h.result().await;
    assert_eq!(
        (
            r["id"].as_str(),
            r["status"].as_str(),
            r["attempts"].as_u64()
        ),
        (Some("r1"), Some("sent"), Some(1)),
        "{r}"
    );
    assert_eq!(h.sink.mails_to("r@example.com").len(), 1);
    w.stop().await.unwrap();
}

/// Defect 11: `mailgate publish --file` gives every line without an id an
/// id of its own, however fast they are read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_gives_every_line_its_own_id() {
    let h = Harness::new("cliids").await;
    // The queue must exist for the mandatory publish; no worker consumes it.
    h.channel
        .queue_declare(
            h.settings.amqp.jobs_queue.as_str().into(),
            QueueDeclareOptions::durable(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let lines: String = (0..1_000)
        .map(|n| format!("{{\"email\":\"u{n}@example.com\",\"code\":\"1\"}}\n"))
        .collect();
    let path = std::env::temp_dir().join(format!("mgtest-ids-{}.jsonl", std::process::id()));
    std::fs::write(&path, lines).unwrap();
    let out = h
        .command(
            env!("CARGO_BIN_EXE_mailgate"),
            &["publish", "--file", path.to_str().unwrap()],
        )
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: std::collections::BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(printed.len(), 1_000, "1 000 distinct ids printed");
    let mut queued = std::collections::BTreeSet::new();
    let jobs = h.settings.amqp.jobs_queue.clone();
    while let Some((body, _)) = h.next_on(&jobs, Duration::from_millis(200)).await {
        let v: Value = serde_json::from_slice(&body).unwrap();
        queued.insert(v["id"].as_str().unwrap().to_owned());
    }
    assert_eq!(queued, printed, "each queued job carries its printed id");
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

/// Redis unavailable for longer than a job's every attempt: the outage is
/// not the job's fault, so it spends no attempt. It waits in RabbitMQ (the
/// worker takes no job meanwhile) and is sent, on its first attempt, once
/// Redis is back. Before (issue 26): answered `failed` after its 2
/// attempts and dead-lettered, unsent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_through_every_attempt_spends_none() {
    let mut redis = common::PrivateRedis::start();
    let url = redis.url();
    let h = Harness::with("redislast", |s| {
        s.redis.url = url;
        s.retry.max_attempts = 2;
        s.retry.initial = Duration::from_millis(100);
    })
    .await;
    let w = h.start_worker().await;
    redis.kill();
    h.publish(&job("lost-redis", "r@example.com")).await;
    h.no_more_results(Duration::from_secs(3)).await;
    redis.restart();
    let r = h.result().await;
    assert_eq!(
        (r["status"].as_str(), r["attempts"].as_u64()),
        (Some("sent"), Some(1)),
        "{r}"
    );
    assert_eq!(h.sink.mails_to("r@example.com").len(), 1);
    w.stop().await.unwrap();
}

/// A job admitted while every SMTP connection is busy, whose code expires
/// before one comes free, is not sent: `expired`, and its quota refunded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_code_that_expires_while_waiting_for_a_connection_is_not_sent() {
    let h = Harness::with("slotexpiry", |s| {
        s.smtp.pool_size = 1;
        s.smtp.timeout = Duration::from_secs(3);
        s.limits.send_lease = Duration::from_secs(10);
    })
    .await;
    h.sink.set_delay(Duration::from_millis(2_000));
    let w = h.start_worker().await;
    h.publish(&job("slow", "slow@example.com")).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let expires = jiff::Timestamp::now() + jiff::SignedDuration::from_millis(800);
    h.publish(&json!({"id": "x", "email": "x@example.com", "code": "1", "expires_at": expires.to_string()}))
        .await;
    let results = h.results(2).await;
    assert_eq!(results["slow"]["status"], "sent");
    assert_eq!(results["x"]["status"], "expired", "{}", results["x"]);
    assert!(h.sink.mails_to("x@example.com").is_empty());
    h.sink.set_delay(Duration::ZERO);
    h.publish(&job("x2", "x@example.com")).await;
    assert_eq!(h.result().await["status"], "sent", "the quota was refunded");
    w.stop().await.unwrap();
}

/// A Redis stall longer than the client's 5 s timeout: the stalled
/// admission still runs when Redis resumes, after its worker gave up on it.
/// Whatever that leaves, the job is answered once and mailed at most once.
/// (It is answered "delivery unknown" although nothing was sent: the ledger
/// cannot tell a write nobody waited for from a send that began; see
/// FAULTS.md.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_stall_never_mails_twice() {
    let redis = common::PrivateRedis::start();
    let url = redis.url();
    let h = Harness::with("redisstall", |s| {
        s.redis.url = url;
        s.retry.initial = Duration::from_millis(100);
        s.retry.max = Duration::from_millis(200);
        s.smtp.timeout = Duration::from_secs(2);
        s.limits.send_lease = Duration::from_secs(7);
    })
    .await;
    let w = h.start_worker().await;
    redis.pause();
    h.publish(&job("stalled", "s@example.com")).await;
    tokio::time::sleep(Duration::from_secs(7)).await;
    redis.resume();
    let r = h.result().await;
    let mails = h.sink.mails_to("s@example.com").len();
    match r["status"].as_str() {
        Some("sent") => assert_eq!(mails, 1, "{r}"),
        Some("failed") => {
            assert!(
                r["error"].as_str().unwrap().contains("delivery unknown"),
                "{r}"
            );
            assert_eq!(mails, 0, "{r}");
        }
        _ => panic!("{r}"),
    }
    h.no_more_results(Duration::from_millis(500)).await;
    w.stop().await.unwrap();
}

/// Second review finding: a producer may write any ticket and attempt into
/// its headers. A burst of copies of one id with one made-up ticket and
/// rising attempt numbers is still one admission and one mail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_made_up_lineage_cannot_multiply_a_mail() {
    let h = Harness::with("forged", |s| {
        s.smtp.timeout = Duration::from_secs(3);
        s.limits.send_lease = Duration::from_secs(8);
    })
    .await;
    h.sink.set_delay(Duration::from_millis(1_000));
    let w = h.start_worker().await;
    let body = job("forged", "victim@example.com").to_string();
    for attempt in 2..12 {
        let mut headers = FieldTable::default();
        headers.insert(
            "x-mailgate-ticket".into(),
            AMQPValue::LongString("0123456789abcdef0123456789abcdef".into()),
        );
        headers.insert("x-mailgate-attempt".into(), AMQPValue::LongLongInt(attempt));
        h.publish_raw(
            body.as_bytes(),
            BasicProperties::default().with_headers(headers),
        )
        .await;
    }
    // The copies name one lineage, so they are answered as its redeliveries
    // (those after its `sent` was confirmed get no second result: a producer
    // that writes mailgate's headers gets the answers of the lineage it
    // names). Wait until no copy is left waiting for the lease.
    let q = h.settings.amqp.results_queue.clone();
    let mut answers = 0;
    while let Some((body, _)) = h.next_on(&q, Duration::from_secs(10)).await {
        let r: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(r["status"], "sent", "{r}");
        answers += 1;
    }
    assert!(answers >= 1);
    let topology = mailgate::broker::Topology::new(&h.settings);
    let waits = topology
        .wait_bands_ms
        .iter()
        .map(|ms| format!(".wait.{ms}"));
    for queue in std::iter::once(String::new()).chain(waits) {
        let name = format!("{}{queue}", h.settings.amqp.jobs_queue);
        assert_eq!(depth(&h, &name).await, 0, "{name} is drained");
    }
    assert_eq!(h.sink.mails_to("victim@example.com").len(), 1);
    w.stop().await.unwrap();
}
