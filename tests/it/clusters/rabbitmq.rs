//! A three-node RabbitMQ cluster on this machine, with quorum queues: the
//! node that leads the jobs queue, and holds the worker's connection, stops
//! mid-load. Nothing is lost, nothing is mailed twice, and the worker goes
//! on through another node of `amqp.url` without a restart.
//!
//! The nodes are the test's own (names, ports, data dirs); the shared
//! RabbitMQ is not touched.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::common::harness::Harness;
use crate::common::{KillOnDrop, LogOnFailure, PrivateRabbit};
use lapin::options::{BasicAckOptions, BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use mailgate::settings::QueueType;
use serde_json::{Value, json};

const JOBS: usize = 1500;

/// Three private nodes, the second and third joined to the first.
fn cluster() -> Vec<PrivateRabbit> {
    let nodes: Vec<PrivateRabbit> = std::thread::scope(|s| {
        let starting: Vec<_> = (0..3).map(|_| s.spawn(PrivateRabbit::start)).collect();
        starting.into_iter().map(|n| n.join().unwrap()).collect()
    });
    for n in &nodes[1..] {
        for step in [
            vec!["stop_app"],
            vec!["reset"],
            vec!["join_cluster", nodes[0].node.as_str()],
            vec!["start_app"],
        ] {
            assert!(n.ctl(&step), "{} {step:?}", n.node);
        }
    }
    nodes
}

/// The node that leads `queue`, as the cluster reports it.
fn leader(via: &PrivateRabbit, queue: &str) -> String {
    let out = std::process::Command::new("rabbitmqctl")
        .args(["-q", "-n", &via.node, "list_queues", "name", "leader"])
        .args(["--formatter", "json"])
        .output()
        .expect("rabbitmqctl runs");
    let queues: Vec<Value> = serde_json::from_slice(&out.stdout).expect("json");
    queues
        .iter()
        .find(|q| q["name"] == queue)
        .and_then(|q| q["leader"].as_str())
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leading_node_stops_mid_load_and_nothing_is_lost_or_mailed_twice() {
    let started = Instant::now();
    let nodes = cluster();
    eprintln!("cluster up in {:.1?}", started.elapsed());
    // The test publishes and reads results through the third node, which
    // stays up; the worker is given all three and connects to the first.
    let h = Harness::with("rcluster", |s| {
        s.amqp.url = nodes[2].url().into();
        s.amqp.queue_type = QueueType::Quorum;
        s.amqp.prefetch = 16;
        s.smtp.pool_size = 2;
    })
    .await;
    let all: Vec<String> = nodes.iter().map(PrivateRabbit::url).collect();
    let log = LogOnFailure::new("rcluster");
    let mut worker = KillOnDrop(
        h.command(env!("CARGO_BIN_EXE_mailgate"), &["worker"])
            .env("MAILGATE__AMQP__URL", all.join(","))
            .stdout(std::process::Stdio::null())
            .stderr(log.stderr())
            .spawn()
            .unwrap(),
    );
    let jobs = h.settings.amqp.jobs_queue.clone();
    h.wait_for_queue(&jobs).await;
    assert_eq!(
        leader(&nodes[2], &jobs),
        nodes[0].node,
        "the first node leads"
    );

    let publisher = h.channel_for_checks().await;
    publisher
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let mut confirms = Vec::with_capacity(JOBS);
    for i in 0..JOBS {
        // A client address per job: only the failover is under test.
        let job = json!({"id": format!("c{i}"), "email": format!("c{i}@example.com"),
                         "ip": format!("10.0.{}.{}", i / 250, i % 250 + 1), "code": "1"});
        let confirm = publisher
            .basic_publish(
                "".into(),
                jobs.as_str().into(),
                BasicPublishOptions::default(),
                job.to_string().as_bytes(),
                BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .expect("publish");
        confirms.push(confirm);
    }
    for c in confirms {
        assert!(c.await.expect("confirm").is_ack());
    }

    // Results, read through the third node; a read that fails while the
    // cluster elects new leaders is tried again on a fresh connection.
    let results_queue = h.settings.amqp.results_queue.clone();
    let mut results: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut conn: Option<Connection> = None;
    let mut stopped_at = None;
    let deadline = Instant::now() + Duration::from_secs(180);
    while results.len() < JOBS && Instant::now() < deadline {
        if stopped_at.is_none() && results.len() >= JOBS / 5 {
            stopped_at = Some((results.len(), Instant::now()));
            eprintln!("stopping {} at {} results", nodes[0].node, results.len());
            assert!(nodes[0].ctl(&["stop"]), "the first node stops");
        }
        if conn.as_ref().is_none_or(|c| !c.status().connected()) {
            conn = Connection::connect(&nodes[2].url(), ConnectionProperties::default())
                .await
                .ok();
        }
        let Some(ch) = (match &conn {
            Some(c) => c.create_channel().await.ok(),
            None => None,
        }) else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        loop {
            match ch
                .basic_get(results_queue.as_str().into(), BasicGetOptions::default())
                .await
            {
                Ok(Some(m)) => {
                    let r: Value = serde_json::from_slice(&m.delivery.data).unwrap();
                    let id = r["id"].as_str().unwrap().to_owned();
                    results
                        .entry(id)
                        .or_default()
                        .push(r["status"].as_str().unwrap().to_owned());
                    if m.delivery.ack(BasicAckOptions::default()).await.is_err() {
                        break;
                    }
                    if stopped_at.is_none() && results.len() >= JOBS / 5 {
                        break;
                    }
                }
                Ok(None) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    if results.len() >= JOBS || Instant::now() >= deadline {
                        break;
                    }
                }
                Err(_) => break,
            }
        }
    }
    let (at, when) = stopped_at.expect("the node was stopped");
    eprintln!(
        "{} results ({} after the stop, in {:.1?}); worker alive: {}",
        results.len(),
        results.len() - at,
        when.elapsed(),
        worker.0.try_wait().unwrap().is_none()
    );
    assert_eq!(results.len(), JOBS, "every job answered");
    let repeated: Vec<_> = results.iter().filter(|(_, s)| s.len() > 1).collect();
    eprintln!(
        "results repeated (the contract allows it): {}",
        repeated.len()
    );
    assert!(
        results
            .values()
            .all(|statuses| statuses.iter().all(|s| s == "sent")),
        "{:?}",
        results
            .iter()
            .filter(|(_, s)| s.iter().any(|s| s != "sent"))
            .take(10)
            .collect::<Vec<_>>()
    );
    assert!(worker.0.try_wait().unwrap().is_none(), "no restart");
    let mails = h.sink.wait_for(JOBS, Duration::from_secs(10));
    let mailboxes: BTreeSet<&str> = mails.iter().map(|m| m.to[0].as_str()).collect();
    assert_eq!(mails.len(), JOBS, "no mail twice");
    assert_eq!(mailboxes.len(), JOBS);
    assert_ne!(
        leader(&nodes[2], &jobs),
        nodes[0].node,
        "another node leads"
    );
    eprintln!("whole test {:.1?}", started.elapsed());
    // The nodes go first, taking the queues with them: deleting quorum
    // queues one of whose members is down takes minutes.
    drop(worker);
    drop(nodes);
    drop(h);
}
