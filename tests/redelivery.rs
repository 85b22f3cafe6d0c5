//! Messages RabbitMQ hands out again (a worker died, or lost its
//! connection, holding them): what they are answered, and what a producer
//! cannot fake. Found by review B; each test's doc says what went wrong.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::common::close_connections;
use crate::common::harness::{Harness, http_get};
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use mailgate::settings::QueueType;
use serde_json::{Value, json};

fn nth(prefix: &str, i: usize) -> Value {
    json!({"id": format!("{prefix}{i}"), "email": format!("{prefix}{i}@example.com"),
           "ip": format!("198.51.100.{}", i % 250 + 1), "code": "271828"})
}

async fn results_for(
    h: &Harness,
    ids: &[String],
    timeout: Duration,
    late: Duration,
) -> BTreeMap<String, Vec<Value>> {
    let deadline = Instant::now() + timeout;
    let mut by_id: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let q = h.settings.amqp.results_queue.clone();
    while ids.iter().any(|id| !by_id.contains_key(id)) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            eprintln!(
                "results missing for {:?}",
                ids.iter()
                    .filter(|i| !by_id.contains_key(*i))
                    .collect::<Vec<_>>()
            );
            break;
        }
        if let Some((body, _)) = h.next_on(&q, left.min(Duration::from_secs(1))).await {
            let r: Value = serde_json::from_slice(&body).unwrap();
            by_id
                .entry(r["id"].as_str().unwrap().to_owned())
                .or_default()
                .push(r);
        }
    }
    while let Some((body, _)) = h.next_on(&q, late).await {
        let r: Value = serde_json::from_slice(&body).unwrap();
        by_id
            .entry(r["id"].as_str().unwrap().to_owned())
            .or_default()
            .push(r);
    }
    by_id
}

/// Each status combination and how many jobs had it.
fn statuses(results: &BTreeMap<String, Vec<Value>>) -> BTreeMap<String, usize> {
    let mut tally = BTreeMap::new();
    for rs in results.values() {
        let key = rs
            .iter()
            .map(|r| r["status"].as_str().unwrap_or("?").to_owned())
            .collect::<Vec<_>>()
            .join("+");
        *tally.entry(key).or_default() += 1;
    }
    tally
}

/// A connection lost while mails are in flight (a relay at 4 s a mail): the
/// jobs come back, find their sends under way, and wait out the lease as
/// mailgate's copies. Each job's mail went out once, under its first
/// delivery, so each is answered `sent`. Before: `duplicate`, the only
/// result of a single publish (4 of 4), as the copies forgot that they came
/// from a message delivered before.
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
    let results = results_for(&h, &ids, Duration::from_secs(60), Duration::from_secs(2)).await;
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
/// either queue type. Only RabbitMQ's own redelivered flag counts. Before:
/// all 24 moved, answered in 6.5 s instead of about 1.
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
        let r = results_for(
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
        assert!(
            !metrics.contains("mailgate_jobs_isolated_total"),
            "a producer's header moved jobs: {metrics}"
        );
        w.stop().await.unwrap();
    }
}
