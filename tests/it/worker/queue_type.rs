//! `amqp.queue_type`: what each type declares, what RabbitMQ does with a
//! message that is handed back again and again, and the start-up error when
//! the queues exist as another type. These tests set the type themselves;
//! the rest of the suite runs on either (`MAILGATE_TEST_QUEUE_TYPE`).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::harness::{Harness, http_get};
use futures_lite::StreamExt;
use lapin::BasicProperties;
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, BasicRejectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use mailgate::broker::{Broker, DELIVERY_LIMIT, Topology};
use mailgate::settings::QueueType;
use serde_json::{Value, json};

fn job(id: &str, email: &str) -> Value {
    json!({"id": id, "email": email, "ip": "203.0.113.9", "code": "271828"})
}

/// Job `i` of a test's many, each from a client address of its own.
fn nth(prefix: &str, i: usize) -> Value {
    json!({"id": format!("{prefix}{i}"), "email": format!("{prefix}{i}@example.com"),
           "ip": format!("198.51.100.{}", i + 1), "code": "271828"})
}

/// Each of the harness's queues with its type and arguments, as RabbitMQ
/// reports them.
fn declared(h: &Harness) -> BTreeMap<String, (String, Value)> {
    let out = std::process::Command::new("rabbitmqctl")
        .args(["-q", "list_queues", "name", "type", "arguments"])
        .args(["--formatter", "json"])
        .output()
        .expect("rabbitmqctl runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let all: Vec<Value> = serde_json::from_slice(&out.stdout).expect("json");
    let ours = Topology::new(&h.settings).all();
    all.into_iter()
        .filter(|q| ours.iter().any(|n| q["name"] == n.as_str()))
        .map(|q| {
            let name = q["name"].as_str().unwrap().to_owned();
            // Arguments come as [name, type, value] triples.
            let args: serde_json::Map<String, Value> = q["arguments"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| (a[0].as_str().unwrap().to_owned(), a[2].clone()))
                .collect();
            (name, (q["type"].as_str().unwrap().to_owned(), args.into()))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_queue_has_the_configured_type_and_quorum_ones_dead_letter_at_least_once() {
    for (name, kind) in [
        ("qtclassic", QueueType::Classic),
        ("qtquorum", QueueType::Quorum),
    ] {
        let h = Harness::with(name, |s| s.amqp.queue_type = kind).await;
        let w = h.start_worker().await;
        h.publish(&job("q1", "q1@example.com")).await;
        assert_eq!(h.result().await["status"], "sent");
        let queues = declared(&h);
        let topology = Topology::new(&h.settings);
        assert_eq!(queues.len(), topology.all().len(), "{queues:?}");
        for (queue, (ty, args)) in &queues {
            assert_eq!(ty, kind.as_str(), "{queue}");
            let waits = queue.contains(".wait.") || queue.contains(".retry.");
            let jobs = *queue == topology.jobs || *queue == topology.redelivered;
            let quorum = kind == QueueType::Quorum;
            let to = args["x-dead-letter-routing-key"].as_str();
            match (waits, jobs && quorum) {
                (true, _) => assert_eq!(to, Some(topology.jobs.as_str()), "{queue}"),
                (_, true) => {
                    assert_eq!(to, Some(topology.dead.as_str()), "{queue}");
                    assert_eq!(args["x-delivery-limit"], DELIVERY_LIMIT, "{queue}");
                }
                _ => assert_eq!(to, None, "{queue}: {args}"),
            }
            let strategy = args["x-dead-letter-strategy"].as_str();
            if quorum && to.is_some() {
                assert_eq!(strategy, Some("at-least-once"), "{queue}");
                assert_eq!(args["x-overflow"], "reject-publish", "{queue}");
            } else {
                assert_eq!(strategy, None, "{queue}");
            }
        }
        w.stop().await.unwrap();
    }
}

/// A message that every worker hands back (one that crashes the process
/// holding it, say) is dead-lettered by RabbitMQ after [`DELIVERY_LIMIT`]
/// deliveries, never dropped; one handed back fewer times is processed as
/// usual, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_jobs_handed_back_too_often_are_dead_lettered_and_others_still_sent() {
    let h = Harness::with("qtlimit", |s| s.amqp.queue_type = QueueType::Quorum).await;
    let w = h.start_worker().await;
    w.stop().await.unwrap();
    let jobs = h.settings.amqp.jobs_queue.clone();
    let hand_back = |queue: &str, times: u32| {
        let jobs = queue.to_owned();
        let ch = h.channel.clone();
        async move {
            let mut deliveries = 0;
            let mut empty = 0;
            while deliveries < times {
                let Some(m) = ch
                    .basic_get(jobs.as_str().into(), BasicGetOptions::default())
                    .await
                    .unwrap()
                else {
                    // A message just published or handed back may take a
                    // moment to be offered again.
                    empty += 1;
                    if empty == 50 {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                };
                deliveries += 1;
                m.delivery
                    .reject(BasicRejectOptions { requeue: true })
                    .await
                    .unwrap();
            }
            deliveries
        }
    };
    h.publish(&job("poison", "p@example.com")).await;
    let limit = u32::try_from(DELIVERY_LIMIT).unwrap();
    assert_eq!(hand_back(&jobs, limit + 5).await, limit + 1);
    // `mailgate dead` reads RabbitMQ's account of it.
    let listed = {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let out = h.run_tool(&["dead", "list", "--json"]).await;
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            if !text.is_empty() || std::time::Instant::now() > deadline {
                break text;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let listed: Value = serde_json::from_str(listed.trim()).expect("one dead letter");
    assert_eq!(listed["reason"], "delivery_limit", "{listed}");
    assert_eq!(listed["id"], "poison", "{listed}");
    assert!(listed["dead_at"].is_string(), "{listed}");
    let (body, props) = h.dead_letter().await;
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap()["id"],
        "poison"
    );
    let headers = props.headers().clone().unwrap_or_default();
    let Some(AMQPValue::FieldArray(deaths)) = headers.inner().get("x-death") else {
        panic!("x-death on the dead letter: {headers:?}");
    };
    let reason = match deaths.as_slice().first() {
        Some(AMQPValue::FieldTable(t)) => t.inner().get("reason").cloned(),
        _ => None,
    };
    assert_eq!(reason, Some(AMQPValue::LongString("delivery_limit".into())));

    // A message moved aside (as workers move a job handed back to them)
    // and handed back half the limit times there: sent once, and counted as
    // a job that keeps coming back (x-delivery-count).
    let lane = Topology::new(&h.settings).redelivered;
    publish_to(&h, &lane, &job("bounced", "b@example.com")).await;
    assert_eq!(hand_back(&lane, limit / 2).await, limit / 2);
    let w = h.start_worker().await;
    let r = h.result().await;
    assert_eq!(
        (r["id"].as_str(), r["status"].as_str()),
        (Some("bounced"), Some("sent"))
    );
    h.no_more_results(Duration::from_secs(1)).await;
    assert_eq!(h.sink.wait_for(1, Duration::from_secs(5)).len(), 1);
    let (_, metrics) = http_get(w.http, "/metrics").await;
    assert!(
        metrics.contains("mailgate_jobs_redelivered_often_total 1"),
        "{metrics}"
    );
    w.stop().await.unwrap();
}

/// Publishes `job` to `queue` (one of the harness's), confirmed.
async fn publish_to(h: &Harness, queue: &str, job: &Value) {
    h.channel
        .basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions::default(),
            job.to_string().as_bytes(),
            BasicProperties::default().with_delivery_mode(2),
        )
        .await
        .unwrap()
        .await
        .unwrap();
}

/// A worker that dies holding jobs (its deliveries unacknowledged): as
/// mailgate's own consumers take them, `Broker::consume` on a connection
/// that is then closed. Returns the ids it held.
async fn die_holding(h: &Harness, lane: bool, want: usize) -> Vec<String> {
    let broker = Broker::connect(&h.settings).await.expect("broker");
    let mut c = broker.consume("dies").await.expect("consume");
    let mut held = Vec::new();
    while held.len() < want {
        let next = match lane {
            false => c.jobs.next(),
            true => c.redelivered.next(),
        };
        match tokio::time::timeout(Duration::from_millis(500), next).await {
            Ok(Some(Ok(d))) => held.push(d),
            _ => break,
        }
    }
    broker.close(Duration::from_secs(5)).await;
    held.iter()
        .map(|d| serde_json::from_slice::<Value>(&d.data).unwrap()["id"].to_string())
        .collect()
}

/// A worker that dies (or loses its connection) holding a prefetch of jobs
/// hands them all back counted (RabbitMQ counts every unacknowledged
/// delivery of a closed channel). Once is what a dropped connection costs:
/// the next worker answers them as usual, nothing moved. Twice (they were
/// beside a job that killed two workers): the next worker moves them to
/// `J.redelivered`, taken one at a time, and answers each once. Nothing is
/// dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_handed_back_twice_by_dead_workers_are_moved_aside_and_answered() {
    for (deaths, moved) in [(1, 0), (2, 8)] {
        let h = Harness::with(&format!("qtmoved{deaths}"), |s| {
            s.amqp.queue_type = QueueType::Quorum;
            s.amqp.prefetch = 8;
        })
        .await;
        let w = h.start_worker().await;
        w.stop().await.unwrap();
        for i in 0..8 {
            h.publish(&nth("m", i)).await;
        }
        for _ in 0..deaths {
            assert_eq!(die_holding(&h, false, 8).await.len(), 8);
        }
        let w = h.start_worker().await;
        let results = h.results(8).await;
        assert!(
            results.values().all(|r| r["status"] == "sent"),
            "{results:?}"
        );
        h.no_more_results(Duration::from_secs(1)).await;
        assert_eq!(h.sink.wait_for(8, Duration::from_secs(5)).len(), 8);
        let (_, metrics) = http_get(w.http, "/metrics").await;
        let isolated = metrics
            .lines()
            .find_map(|l| l.strip_prefix("mailgate_jobs_isolated_total "))
            .unwrap_or("0");
        assert_eq!(isolated, moved.to_string(), "after {deaths} death(s)");
        let dead = format!("{}.dead", h.settings.amqp.jobs_queue);
        assert!(h.next_on(&dead, Duration::from_millis(300)).await.is_none());
        w.stop().await.unwrap();
    }
}

/// A job that kills every worker it reaches, among others that were in
/// flight beside it when it first did (all moved to `J.redelivered`): the
/// workers that die take it one at a time there, so only its deliveries
/// are counted, and RabbitMQ dead-letters it alone at the limit. The
/// others are answered, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_kills_its_workers_takes_no_other_job_to_the_dead_letter_queue() {
    let h = Harness::with("qtpoison", |s| {
        s.amqp.queue_type = QueueType::Quorum;
        s.amqp.prefetch = 8;
    })
    .await;
    let w = h.start_worker().await;
    w.stop().await.unwrap();
    let lane = Topology::new(&h.settings).redelivered;
    publish_to(&h, &lane, &job("poison", "p@example.com")).await;
    for i in 0..7 {
        publish_to(&h, &lane, &nth("n", i)).await;
    }
    // Each worker the poison reaches dies; mailgate's consumer of the lane
    // holds nothing else at the time, however many it may prefetch on `J`.
    let mut deaths = 0;
    loop {
        let held = die_holding(&h, true, 8).await;
        assert_eq!(held.len(), 1, "one job at a time: {held:?}");
        if held[0] != "\"poison\"" {
            break;
        }
        deaths += 1;
        assert!(deaths <= DELIVERY_LIMIT + 1, "the poison never left");
    }
    assert_eq!(deaths, DELIVERY_LIMIT + 1, "the limit, then dead-lettered");
    let (body, _) = h.dead_letter().await;
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap()["id"],
        "poison"
    );
    let dead = format!("{}.dead", h.settings.amqp.jobs_queue);
    assert!(h.next_on(&dead, Duration::from_millis(300)).await.is_none());
    let w = h.start_worker().await;
    let results = h.results(7).await;
    assert!(
        results.values().all(|r| r["status"] == "sent"),
        "{results:?}"
    );
    h.no_more_results(Duration::from_secs(1)).await;
    assert_eq!(h.sink.wait_for(7, Duration::from_secs(5)).len(), 7);
    w.stop().await.unwrap();
}

/// Queues that exist as the other type stop the worker at start-up, with
/// RabbitMQ's reason and what to do about it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_of_the_other_type_is_refused_at_start_with_what_to_do() {
    for (name, kind, other) in [
        ("qtmixq", QueueType::Quorum, QueueType::Classic),
        ("qtmixc", QueueType::Classic, QueueType::Quorum),
    ] {
        let h = Harness::with(name, |s| s.amqp.queue_type = kind).await;
        let mut args = FieldTable::default();
        args.insert(
            "x-queue-type".into(),
            AMQPValue::LongString(other.as_str().into()),
        );
        h.channel
            .queue_declare(
                h.settings.amqp.jobs_queue.as_str().into(),
                QueueDeclareOptions::durable(),
                args,
            )
            .await
            .unwrap();
        let out = h
            .command(env!("CARGO_BIN_EXE_mailgate"), &["worker"])
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        for says in [
            "PRECONDITION_FAILED - inequivalent arg",
            &format!("amqp.queue_type = \"{}\"", kind.as_str()),
            "Changing the queue type",
        ] {
            assert!(err.contains(says), "{says:?} missing from:\n{err}");
        }
    }
}
