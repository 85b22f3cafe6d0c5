//! `amqp.queue_type`: what each type declares, what RabbitMQ does with a
//! message that is handed back again and again, and the start-up error when
//! the queues exist as another type. These tests set the type themselves;
//! the rest of the suite runs on either (`MAILGATE_TEST_QUEUE_TYPE`).

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::harness::{Harness, http_get};
use lapin::options::{BasicGetOptions, BasicRejectOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use mailgate::broker::{DELIVERY_LIMIT, Topology};
use mailgate::settings::QueueType;
use serde_json::{Value, json};

fn job(id: &str, email: &str) -> Value {
    json!({"id": id, "email": email, "ip": "203.0.113.9", "code": "271828"})
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
            let jobs = *queue == topology.jobs;
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
    let hand_back = |times: u32| {
        let jobs = jobs.clone();
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
    assert_eq!(hand_back(limit + 5).await, limit + 1);
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

    // Handed back half the limit times: sent once, and counted as a job
    // that keeps coming back (x-delivery-count).
    h.publish(&job("bounced", "b@example.com")).await;
    assert_eq!(hand_back(limit / 2).await, limit / 2);
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
