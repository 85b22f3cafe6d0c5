//! An id is mailed at most once, and only to the mailbox it was first
//! published for: not after a lost reply, a lost connection, a stall, an
//! expired copy or a made-up lineage.

use super::*;

use std::time::{Duration, Instant};

use crate::common;
use crate::common::harness::{Harness, http_get};
use crate::common::{ReplyCutter, close_connections};
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use mailgate::settings::QueueType;
use serde_json::{Value, json};

/// An id is never mailed twice within `dedup_for`, whatever the rules. None
/// here: a record of the id kept only as long as the rules need would last
/// 1 ms, and the copy published 500 ms later would be mailed again.
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

/// An id being retried for mailbox A, reused for victim B (at their limit),
/// is `invalid` naming the id: B gets no mail from it, and A's retry is
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

/// A copy of a job seen after its `expires_at` never refunds an admission
/// whose send began: one mail, and no `expired` beside `sent`.
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
    // The quota the mail used is kept (the backlog's results may come
    // first: whichever job gets the one connection first is sent first).
    h.publish(&job("x2", "x@example.com")).await;
    let x2 = loop {
        let r = h.result().await;
        if r["id"] == "x2" {
            break r;
        }
    };
    assert_eq!(x2["status"], "rejected");
    w.stop().await.unwrap();
}

/// A producer may write any ticket and attempt into its headers. A burst of
/// copies of one id with one made-up ticket and rising attempt numbers is
/// still one admission and one mail.
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
        s.redis.url = url.into();
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

/// The reply to an admission that marked its job sending (an SMTP
/// connection was free) is lost: Redis ran it, the connection dropped
/// before the answer came. The worker gives the mark back, so the job's
/// retry resumes it and it is sent once, not answered "delivery unknown".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_to_an_admission_is_resumed_and_sent_once() {
    let redis = common::PrivateRedis::start();
    let cutter = ReplyCutter::start(redis.port);
    let h = Harness::with("lostreply", |s| {
        s.redis.url = format!("redis://127.0.0.1:{}/0", cutter.port).into();
        s.retry.initial = Duration::from_millis(100);
        s.retry.max = Duration::from_millis(200);
        s.smtp.timeout = Duration::from_secs(2);
        s.limits.send_lease = Duration::from_secs(30);
    })
    .await;
    let w = h.start_worker().await;
    cutter
        .cut_next
        .store(true, std::sync::atomic::Ordering::SeqCst);
    h.publish(&json!({"id": "lost", "email": "lost@example.com", "code": "1"}))
        .await;
    let r = h.result().await;
    assert_eq!(r["status"], "sent", "{r}");
    assert_eq!(h.sink.mails_to("lost@example.com").len(), 1);
    h.no_more_results(Duration::from_millis(500)).await;
    w.stop().await.unwrap();
}

/// One slot (a prefix with a hash tag): the reply to an admission that
/// marked its job sending is lost. The cluster client runs the script
/// again, which finds the job's own mark and answers "busy"; taken as it
/// stands, that leaves the job to wait out the lease and be answered
/// "delivery unknown", although nothing was sent. The test checks that the
/// worker, as on one server, gets the error, gives the mark back (retrying
/// while the client reconnects), and the retry sends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_a_lost_admission_reply_is_resumed_and_sent() {
    let cluster = CutCluster::start();
    let h = Harness::with("lostclusterlost", |s| {
        s.redis.url = cluster.url().into();
        s.redis.key_prefix = "{lost}:".into();
        s.retry.initial = Duration::from_millis(100);
        s.retry.max = Duration::from_millis(200);
        s.smtp.timeout = Duration::from_secs(2);
        s.limits.send_lease = Duration::from_secs(7);
    })
    .await;
    let w = h.start_worker().await;
    cluster.cut_reply_to("$5\r\nadmit\r\n");
    let start = Instant::now();
    h.publish(&json!({"id": "lost", "email": "lost@example.com", "code": "1"}))
        .await;
    let q = h.settings.amqp.results_queue.clone();
    let r = h.next_on(&q, Duration::from_secs(20)).await;
    let r: Option<Value> = r.map(|(b, _)| serde_json::from_slice(&b).unwrap());
    eprintln!(
        "after {:?}: {r:?}; mails: {}; replies cut: {}",
        start.elapsed(),
        h.sink.mails_to("lost@example.com").len(),
        cluster.cuts.load(std::sync::atomic::Ordering::SeqCst)
    );
    w.stop().await.unwrap();
    let r = r.expect("a result");
    assert_eq!(r["status"], "sent", "{r}");
    assert_eq!(h.sink.mails_to("lost@example.com").len(), 1);
}

/// A connection lost while mails are in flight (a relay at 4 s a mail): the
/// jobs come back, find their sends under way, and wait out the lease as
/// mailgate's copies. Each job's mail went out once, under its first
/// delivery, so each is answered `sent` (the fault it guards against:
/// `duplicate`, the only result of a single publish, 4 of 4, as the copies
/// forget that they came from a message delivered before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_lost_mid_send_is_answered_sent_not_duplicate() {
    let h = Harness::with("midsend", |s| {
        s.limits.send_lease = Duration::from_secs(12);
        s.smtp.timeout = Duration::from_secs(6);
    })
    .await;
    h.sink.set_delay(Duration::from_millis(4000));
    let w = h.start_worker().await;
    let ids: Vec<String> = (0..4).map(|i| format!("ms{i}")).collect();
    for i in 0..4 {
        h.publish(&nth("ms", i)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let closed = close_connections(&h.settings.amqp.jobs_queue);
    assert!(closed >= 1);
    let results = results_within(&h, &ids, Duration::from_secs(60), Duration::from_secs(2)).await;
    let mails: usize = (0..4)
        .map(|i| h.sink.mails_to(&format!("ms{i}@example.com")).len())
        .sum();
    eprintln!(
        "midsend: statuses {:?}, {mails} mails for 4 jobs; {results:?}",
        statuses(&results)
    );
    let (_, metrics) = http_get(w.http, "/metrics").await;
    eprintln!(
        "midsend isolated: {:?}",
        metrics
            .lines()
            .filter(|l| l.starts_with("mailgate_jobs_isolated_total"))
            .collect::<Vec<_>>()
    );
    for (id, rs) in &results {
        assert!(
            rs.iter().all(|r| r["status"] == "sent"),
            "{id} was mailed but answered: {rs:?}"
        );
    }
    w.stop().await.unwrap();
}

/// A producer that writes `x-delivery-count` itself on a first delivery
/// (RabbitMQ 3.10 keeps it): no job is moved to the one-at-a-time lane, on
/// either queue type. Only RabbitMQ's own redelivered flag counts (the
/// fault it guards against: all 24 moved, answered in 6.5 s instead of
/// about 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producers_delivery_count_header_moves_no_job() {
    for (name, kind) in [("hdrq", QueueType::Quorum), ("hdrc", QueueType::Classic)] {
        let n = 24;
        let h = Harness::with(name, |s| {
            s.amqp.queue_type = kind;
            s.amqp.prefetch = 24;
            s.smtp.pool_size = 8;
        })
        .await;
        h.sink.set_delay(Duration::from_millis(250));
        let w = h.start_worker().await;
        let ids: Vec<String> = (0..n).map(|i| format!("hd{i}")).collect();
        let t0 = Instant::now();
        for i in 0..n {
            let mut headers = FieldTable::default();
            headers.insert("x-delivery-count".into(), AMQPValue::LongLongInt(1));
            h.publish_raw(
                nth("hd", i).to_string().as_bytes(),
                BasicProperties::default().with_headers(headers),
            )
            .await;
        }
        let r = results_within(
            &h,
            &ids,
            Duration::from_secs(120),
            Duration::from_millis(300),
        )
        .await;
        let took = t0.elapsed();
        let (_, metrics) = http_get(w.http, "/metrics").await;
        eprintln!(
            "header {}: {n} jobs with a producer's x-delivery-count answered in {took:?} ({:?}); {:?}",
            kind.as_str(),
            statuses(&r),
            metrics
                .lines()
                .filter(|l| l.starts_with("mailgate_jobs_isolated_total"))
                .collect::<Vec<_>>()
        );
        assert!(
            r.values()
                .all(|rs| rs.len() == 1 && rs[0]["status"] == "sent"),
            "{r:?}"
        );
        // Registered at zero from the start: it must still be 0.
        let isolated = metrics
            .lines()
            .find_map(|l| l.strip_prefix("mailgate_jobs_isolated_total "))
            .unwrap_or("0");
        assert_eq!(isolated, "0", "a producer's header moved jobs: {metrics}");
        w.stop().await.unwrap();
    }
}

/// Two messages of one lineage and attempt (a producer that writes
/// mailgate's headers, or one of mailgate's copies delivered twice). Worker
/// B holds the send mark and is mid-SMTP; worker A's admission of the second
/// message finds the lease busy, but its reply is lost. A lost-reply
/// release fenced only to (ticket, attempt) would give back B's mark, and
/// A's retry would then resume the job and mail it a second time while B's
/// mail is still under way. The release is fenced to the handling that set
/// the mark (`JobRef::holder`); the test checks that one mail is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_release_gives_back_only_a_mark_it_set() {
    let redis = common::PrivateRedis::start();
    let cutter = ReplyCutter::start(redis.port);
    let h = Harness::with("lostrelease", |s| {
        s.redis.url = redis.url().into();
        s.retry.initial = Duration::from_millis(100);
        s.retry.max = Duration::from_millis(200);
        s.smtp.timeout = Duration::from_secs(5);
        s.limits.send_lease = Duration::from_secs(30);
        s.amqp.prefetch = 1;
    })
    .await;
    h.sink.set_delay(Duration::from_millis(3_000));
    // Worker B: straight to Redis, one message at a time.
    let b = h.start_worker().await;
    let body = json!({"id": "twice", "email": "victim@example.com", "code": "493817"}).to_string();
    let ticket = "0123456789abcdef0123456789abcdef";
    h.publish_raw(body.as_bytes(), forged(ticket, 1)).await;
    // Wait until B's SMTP transaction is under way.
    let deadline = Instant::now() + Duration::from_secs(10);
    while h.sink.transactions() == 0 {
        assert!(Instant::now() < deadline, "B never began its send");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Worker A: through the reply cutter.
    let mut sa = h.settings.clone();
    sa.redis.url = format!("redis://127.0.0.1:{}/0", cutter.port).into();
    let a = mailgate::worker::build(&sa).await.expect("A builds");
    let (stop_a, rx) = tokio::sync::oneshot::channel::<()>();
    let join_a = tokio::spawn(a.run(async {
        let _ = rx.await;
    }));
    tokio::time::sleep(Duration::from_millis(300)).await;
    cutter
        .cut_next
        .store(true, std::sync::atomic::Ordering::SeqCst);
    h.publish_raw(body.as_bytes(), forged(ticket, 1)).await;

    // Collect results for 12 s.
    let q = h.settings.amqp.results_queue.clone();
    let mut statuses = Vec::new();
    while let Some((body, _)) = h.next_on(&q, Duration::from_secs(8)).await {
        let r: Value = serde_json::from_slice(&body).unwrap();
        statuses.push(format!("{}/{}", r["status"], r["attempts"]));
    }
    let mails = h.sink.mails_to("victim@example.com").len();
    eprintln!("results: {statuses:?}; mails to the victim: {mails}");
    let _ = stop_a.send(());
    let _ = join_a.await;
    b.stop().await.unwrap();
    assert_eq!(
        mails, 1,
        "one id mailed {mails} times; results {statuses:?}"
    );
}
