//! Every job gets one true answer and none is lost: through a killed
//! worker, a closed connection, a deploy, a relay that is misconfigured or
//! fails every time, and a lost batch reply.

use super::*;

use std::time::{Duration, Instant};

use crate::common;
use crate::common::close_connections;
use crate::common::harness::{Harness, http_get};
use lapin::options::QueueDeclareOptions;
use lapin::types::{AMQPValue, FieldTable};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_connection_force_closed_mid_load() {
    let h = Harness::new("amqpclose").await;
    h.sink.set_delay(Duration::from_millis(20));
    let w = h.start_worker().await;
    let ids: Vec<String> = (0..60).map(|n| format!("c{n}")).collect();
    for (n, id) in ids.iter().enumerate() {
        h.publish(&json!({"id": id, "email": format!("u{n}@example.com"), "code": "1"}))
            .await;
    }
    h.sink.wait_for(5, Duration::from_secs(20));
    let closed = close_connections(&h.settings.amqp.jobs_queue);
    assert!(closed >= 1, "the worker's connection was found and closed");
    let t0 = Instant::now();

    let results = results_for(&h, &ids, Duration::from_secs(60)).await;
    let recovery = t0.elapsed();
    for (id, rs) in &results {
        assert!(rs.iter().all(|r| r["status"] == "sent"), "{id}: {rs:?}");
    }
    let repeats: usize = results.values().map(|rs| rs.len() - 1).sum();
    // Nothing lost, nothing mailed twice.
    for n in 0..ids.len() {
        let to = format!("u{n}@example.com");
        assert_eq!(h.sink.mails_to(&to).len(), 1, "{to} mailed exactly once");
    }
    eprintln!(
        "FAULT amqp-close jobs=60 lost=0 mailed_twice=0 repeated_results={repeats} recovery_ms={}",
        recovery.as_millis()
    );
    w.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_killed_under_load_then_restarted() {
    let h = Harness::with("sigkill", |s| {
        s.smtp.timeout = Duration::from_secs(2);
        s.limits.send_lease = Duration::from_secs(7);
    })
    .await;
    h.sink.set_delay(Duration::from_millis(30));
    let spawn = || {
        let log = std::env::var("FAULT_LOG").ok().and_then(|p| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .ok()
        });
        let mut c = h.command(env!("CARGO_BIN_EXE_mailgate"), &["worker"]);
        if let Some(f) = log {
            c.env("RUST_LOG", "mailgate=debug").stderr(f);
        } else {
            c.stderr(std::process::Stdio::null());
        }
        c.stdout(std::process::Stdio::null())
            .spawn()
            .expect("the worker starts")
    };
    let mut first = spawn();
    h.wait_for_queue(&h.settings.amqp.jobs_queue).await;
    let ids: Vec<String> = (0..80).map(|n| format!("k{n}")).collect();
    for (n, id) in ids.iter().enumerate() {
        h.publish(&json!({"id": id, "email": format!("u{n}@example.com"), "code": "1"}))
            .await;
    }
    h.sink.wait_for(10, Duration::from_secs(20));
    // SIGKILL: no chance to finish anything. SMTP transactions the sink has
    // begun but not yet accepted are the ones in flight.
    let in_flight_at_kill = h.sink.transactions() as usize - h.sink.mails().len();
    first.kill().expect("kill");
    first.wait().expect("reaped");
    let killed_at = Instant::now();
    let mut second = spawn();

    let results = results_for(&h, &ids, Duration::from_secs(90)).await;
    let recovery = killed_at.elapsed();
    second.kill().ok();
    second.wait().ok();
    let by_mailbox = |id: &str| format!("u{}@example.com", &id[1..]);
    let t = tally(&h, &results, by_mailbox);
    if t.mailed_twice > 0 {
        for id in &ids {
            let n = h.sink.mails_to(&by_mailbox(id)).len();
            if n > 1 {
                eprintln!("mailed {n} times: {id}");
            }
        }
    }
    // Every job is answered: sent, or, for a job whose SMTP transaction was
    // under way at the kill, failed with "delivery unknown" (its mail may
    // have arrived; it is never sent a second time).
    let mut unknown = 0;
    for (id, rs) in &results {
        match rs[0]["status"].as_str() {
            Some("sent") => {}
            Some("failed") => {
                let error = rs[0]["error"].as_str().unwrap_or("");
                assert!(error.contains("delivery unknown"), "{id}: {error}");
                unknown += 1;
            }
            other => panic!("{id}: unexpected status {other:?}"),
        }
    }
    assert!(
        unknown <= h.settings.smtp.pool_size as usize,
        "{unknown} jobs of unknown delivery: more than could have been mid-send"
    );
    assert_eq!(t.mailed_twice, 0, "no mailbox is mailed twice");
    eprintln!(
        "FAULT sigkill jobs={} lost=0 mailed_twice={} delivery_unknown={unknown} in_flight_at_kill={in_flight_at_kill} repeated_results={} recovery_ms={}",
        t.jobs,
        t.mailed_twice,
        t.repeated_results,
        recovery.as_millis()
    );
}

/// An id answered `rejected` (or `invalid`) and published again later is a
/// new job: its retry after a 4xx is not taken for "answered before", which
/// would drop the mail unsent; every message gets exactly one final result.
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

/// A dead letter moved back to the jobs queue (headers and all, as a shovel
/// or the management UI does) is processed afresh, as attempt 1, and not
/// taken for the lineage it left.
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

/// `mailgate publish --file` gives every line without an id an id of its
/// own, however fast they are read, so no two lines are taken for copies of
/// one job.
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

/// A misconfigured relay (`?tls=required` without STARTTLS) is the relay's
/// failure, not the job's: the job waits without spending attempts, the
/// quota kept meanwhile, and `/readyz` and `mailgate_smtp_relay_up` say the
/// relay is failing; once the relay is set right, the job is sent on its
/// first attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misconfigured_relay_is_retried_and_reported() {
    let mut h = Harness::with("relay", |s| {
        s.smtp.url = format!("{}?tls=required", s.smtp.url.as_str()).into();
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
    h.settings.smtp.url = h.sink.url().into();
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

/// No job waits without end: one without `expires_at` expires
/// `limits.max_age` (1 h) after a worker first took it (carried on
/// mailgate's copies), and is answered `expired`, not sent. Its
/// `created_at` or publish time, a producer's, play no part: two hours
/// old by them (an account's creation time, a clock off), or in the
/// future, it is sent as usual. With `"0s"` none expires so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_without_expires_at_expires_at_its_max_age() {
    use lapin::BasicProperties;
    let h = Harness::new("max-age").await;
    let w = h.start_worker().await;
    let now = mailgate::domain::now_ms();
    let two_hours_ago = now - 2 * 3_600_000;
    let at = |ms: u64| {
        jiff::Timestamp::from_millisecond(ms as i64)
            .unwrap()
            .to_string()
    };
    let body =
        |id: &str| json!({"id": id, "email": format!("{id}@example.com"), "code": "1"}).to_string();
    // One of mailgate's copies, first taken two hours ago.
    let copy = |seen: u64| {
        let mut headers = FieldTable::default();
        headers.insert(
            "x-mailgate-ticket".into(),
            AMQPValue::LongString(mailgate::domain::Ticket::new().as_str().into()),
        );
        headers.insert("x-mailgate-attempt".into(), AMQPValue::LongLongInt(2));
        headers.insert(
            "x-mailgate-seen-ms".into(),
            AMQPValue::LongLongInt(seen as i64),
        );
        BasicProperties::default().with_headers(headers)
    };
    h.publish_raw(body("s").as_bytes(), copy(two_hours_ago))
        .await;
    // A producer's times: none of them ages a job, nor keeps it young.
    h.publish(
        &json!({"id": "c", "email": "c@example.com", "code": "1", "created_at": at(two_hours_ago)}),
    )
    .await;
    h.publish(&json!({"id": "f", "email": "f@example.com", "code": "1", "created_at": "2099-01-01T00:00:00Z"}))
        .await;
    h.publish_raw(
        body("t").as_bytes(),
        BasicProperties::default().with_timestamp(two_hours_ago / 1000),
    )
    .await;
    // A seen time in the future counts as now.
    h.publish_raw(body("n").as_bytes(), copy(now + 10 * 3_600_000))
        .await;
    let results = h.results(5).await;
    assert_eq!(results["s"]["status"], "expired", "{}", results["s"]);
    assert!(h.sink.mails_to("s@example.com").is_empty());
    for id in ["c", "f", "t", "n"] {
        assert_eq!(results[id]["status"], "sent", "{id}: {}", results[id]);
    }
    w.stop().await.unwrap();

    let h = Harness::with("max-age-off", |s| s.limits.max_age = Duration::ZERO).await;
    let w = h.start_worker().await;
    h.publish_raw(body("s").as_bytes(), copy(two_hours_ago))
        .await;
    assert_eq!(h.result().await["status"], "sent");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_always_fails_is_answered_dead_lettered_and_never_loops() {
    let h = Harness::with("poison", |s| {
        s.retry.max_attempts = 3;
        s.retry.initial = Duration::from_millis(50);
    })
    .await;
    let w = h.start_worker().await;
    h.sink.refuse("poison@example.com", 451);
    h.publish(&json!({"id": "p1", "email": "poison@example.com", "code": "1"}))
        .await;
    let r = h.result().await;
    assert_eq!(r["status"], "failed", "{r}");
    assert_eq!(r["attempts"], 3);
    assert!(r["error"].as_str().unwrap().contains("451"), "{r}");
    let (body, props) = h.dead_letter().await;
    assert_eq!(serde_json::from_slice::<Value>(&body).unwrap()["id"], "p1");
    let headers = props.headers().clone().expect("headers");
    let get = |k: &str| headers.inner().get(k).cloned();
    // The attempt count is for people: a dead letter carries no attempt
    // header or ticket, so one moved back to the jobs queue starts afresh.
    assert_eq!(
        get("x-mailgate-attempts"),
        Some(lapin::types::AMQPValue::LongLongInt(3))
    );
    assert_eq!(get("x-mailgate-attempt"), None);
    assert_eq!(get("x-mailgate-ticket"), None);
    assert!(
        matches!(get("x-mailgate-error"), Some(lapin::types::AMQPValue::LongString(s)) if s.to_string().contains("451"))
    );
    // It does not come back.
    let before = h.sink.transactions();
    h.no_more_results(Duration::from_secs(1)).await;
    assert_eq!(h.sink.transactions(), before, "no further attempts");
    assert_eq!(h.sink.transactions(), 3);
    w.stop().await.unwrap();
}

/// A rolling deploy never reports a delivered code as failed. A relay that
/// takes 3 s per mail, a pool of 4, 12 jobs taken and `shutdown_timeout`
/// 5 s: once the worker is told to stop (SIGTERM), no SMTP transaction
/// begins; the 4 under way finish; the 8 waiting for a connection are
/// handed back at once with their leases released, so the next worker sends
/// them at once. 12 sent, each mailed once, none "delivery unknown" (the
/// fault it guards against: 4 of 12 cut off at the deadline come back
/// `failed` from the next worker 18 s later).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_reports_no_delivered_code_as_failed() {
    let h = Harness::with("deploy", |s| {
        s.smtp.pool_size = 4;
        s.amqp.prefetch = 12;
        s.worker.shutdown_timeout = Duration::from_secs(5);
    })
    .await;
    h.sink.set_delay(Duration::from_secs(3));
    let w = h.start_worker().await;
    let ids: Vec<String> = (0..12).map(|i| format!("deploy-{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        let mail = format!("u{i}@example.com");
        h.publish(&json!({"id": id, "email": mail, "code": "493817"}))
            .await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while h.sink.transactions() < 4 {
        assert!(Instant::now() < deadline, "the first 4 sends never began");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let began = h.sink.transactions();
    let stopping = Instant::now();
    w.stop().await.unwrap();
    let took = stopping.elapsed();
    assert_eq!(
        h.sink.transactions(),
        began,
        "no transaction began after the stop"
    );
    assert_eq!(began, 4, "one per pooled connection");
    assert!(took < Duration::from_secs(5), "stopped in {took:?}");
    assert_eq!(h.sink.mails().len(), 4, "the 4 under way finished");

    h.sink.set_delay(Duration::ZERO);
    let restarted = Instant::now();
    let w = h.start_worker().await;
    let results = results_for(&h, &ids, Duration::from_secs(20)).await;
    let all_in = restarted.elapsed();
    for (id, rs) in &results {
        for r in rs {
            assert_eq!(r["status"], "sent", "{id}: {rs:?}");
        }
    }
    for i in 0..12 {
        let mail = format!("u{i}@example.com");
        assert_eq!(h.sink.mails_to(&mail).len(), 1, "{mail} mailed once");
    }
    // Not after the send lease (30 s): the handed-back leases were released.
    assert!(all_in < Duration::from_secs(10), "the rest took {all_in:?}");
    eprintln!(
        "DEPLOY jobs=12 in_flight=4 handed_back=8 stop_ms={} rest_ms={} failed=0 mailed_twice=0",
        took.as_millis(),
        all_in.as_millis()
    );
    w.stop().await.unwrap();
}

/// A deploy during a Redis stall answers no unsent code "delivery unknown".
/// Redis freezes (SIGSTOP) for 4 s with 6 jobs' admissions
/// waiting in it, 4 of them with a pooled connection (their admission marks
/// the send begun); the worker is stopped meanwhile and gives up on them at
/// its deadline. When Redis thaws, those calls run seconds after they were
/// sent and are refused (`STALE`), writing nothing, so the next worker
/// admits and sends every job. Were the 4 marks set with no worker left to
/// send or release them, the next worker would answer those jobs `failed`,
/// "delivery unknown", with no mail sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_during_a_redis_stall_answers_no_unsent_code_unknown() {
    let redis = common::PrivateRedis::start();
    let url = redis.url();
    let h = Harness::with("stall-deploy", |s| {
        s.redis.url = url.clone().into();
        s.smtp.pool_size = 4;
        s.smtp.timeout = Duration::from_secs(2);
        s.limits.send_lease = Duration::from_secs(8);
        s.worker.shutdown_timeout = Duration::from_secs(3);
    })
    .await;
    let w = h.start_worker().await;
    common::harness::wait_ready(w.http).await;
    redis.pause();
    let ids: Vec<String> = (0..6).map(|n| format!("f{n}")).collect();
    for (n, id) in ids.iter().enumerate() {
        h.publish(&json!({"id": id, "email": format!("u{n}@example.com"), "code": "1"}))
            .await;
    }
    let published = tokio::time::Instant::now();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    w.stop().await.unwrap();
    // A 4 s stall, however fast the worker stopped: its calls then run
    // well past the 2 s after which a call is late.
    tokio::time::sleep_until(published + Duration::from_secs(4)).await;
    redis.resume();
    let w = h.start_worker().await;
    let results = results_for(&h, &ids, Duration::from_secs(40)).await;
    for (id, rs) in &results {
        for r in rs {
            assert_eq!(r["status"], "sent", "{id}: {rs:?}");
        }
    }
    for n in 0..ids.len() {
        let mail = format!("u{n}@example.com");
        assert_eq!(h.sink.mails_to(&mail).len(), 1, "{mail} mailed once");
    }
    eprintln!("FAULT stall-deploy jobs=6 lost=0 mailed_twice=0 unknown=0");
    w.stop().await.unwrap();
}

/// A deploy while Redis does not answer (frozen, as in a partition) with
/// sends under way: once the worker is stopping, a ledger write gets a
/// second, so the delivered codes are answered `sent` before the shutdown
/// deadline (if the settle's retries spent the deadline, the jobs would be
/// left unacknowledged, and the next worker would answer them "delivery
/// unknown" though they had been delivered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_while_redis_does_not_answer_answers_delivered_codes_sent() {
    let redis = common::PrivateRedis::start();
    let url = redis.url();
    let h = Harness::with("frozen-deploy", |s| {
        s.redis.url = url.clone().into();
        s.smtp.pool_size = 2;
        s.smtp.timeout = Duration::from_secs(4);
        s.worker.shutdown_timeout = Duration::from_secs(8);
    })
    .await;
    h.sink.set_delay(Duration::from_secs(2));
    let w = h.start_worker().await;
    common::harness::wait_ready(w.http).await;
    let ids: Vec<String> = (0..2).map(|n| format!("p{n}")).collect();
    for (n, id) in ids.iter().enumerate() {
        h.publish(&json!({"id": id, "email": format!("u{n}@example.com"), "code": "1"}))
            .await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while h.sink.transactions() < 2 {
        assert!(Instant::now() < deadline, "the sends never began");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    redis.pause();
    let stopping = Instant::now();
    w.stop().await.unwrap();
    let took = stopping.elapsed();
    redis.resume();
    let results = results_for(&h, &ids, Duration::from_secs(5)).await;
    for (id, rs) in &results {
        assert_eq!(rs.len(), 1, "{id}: {rs:?}");
        assert_eq!(rs[0]["status"], "sent", "{id}: {rs:?}");
    }
    assert_eq!(h.sink.mails().len(), 2);
    assert!(took < Duration::from_secs(8), "stopped in {took:?}");
    eprintln!(
        "FAULT frozen-deploy jobs=2 sent=2 unknown=0 stop_ms={}",
        took.as_millis()
    );
}

/// One slot of a cluster, 16 jobs at once (pool 16, so each admission sets
/// the send mark): the reply to one batch that holds several admissions is
/// lost. Without the guard, every job of that batch would be answered
/// "failed, delivery unknown" after the lease, with nothing sent (where on
/// one server each is given back and sent); the test checks that every job
/// of it is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_one_lost_batch_reply_fails_no_job_in_it() {
    let cluster = CutCluster::start();
    let h = Harness::with("lostclusterbatch", |s| {
        s.redis.url = cluster.url().into();
        s.redis.key_prefix = "{lost}:".into();
        s.retry.initial = Duration::from_millis(100);
        s.retry.max = Duration::from_millis(200);
        s.smtp.timeout = Duration::from_secs(2);
        s.smtp.pool_size = 16;
        s.limits.send_lease = Duration::from_secs(7);
    })
    .await;
    let w = h.start_worker().await;
    cluster.cut_reply_to_batch("$5\r\nadmit\r\n", 3);
    for i in 0..16 {
        h.publish(
            &json!({"id": format!("b{i}"), "email": format!("u{i}@example.com"), "code": "1"}),
        )
        .await;
    }
    let q = h.settings.amqp.results_queue.clone();
    let mut by_status = std::collections::BTreeMap::<String, usize>::new();
    let mut n = 0;
    while let Some((body, _)) = h.next_on(&q, Duration::from_secs(12)).await {
        let r: Value = serde_json::from_slice(&body).unwrap();
        *by_status.entry(r["status"].to_string()).or_default() += 1;
        n += 1;
        if n == 16 {
            break;
        }
    }
    let mails = h.sink.mails().len();
    eprintln!(
        "results by status {by_status:?}; mails: {mails}; replies cut: {}",
        cluster.cuts.load(std::sync::atomic::Ordering::SeqCst)
    );
    w.stop().await.unwrap();
    assert_eq!(mails, 16, "{by_status:?}");
}
