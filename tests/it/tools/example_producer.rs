//! The README's producers, Python (pika) and Node.js (amqplib), work
//! against a real worker, and what they publish is a job as
//! `docs/schema/job.json` describes it: each example runs, its job is taken
//! off the queue and checked before a worker answers it.

use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use super::contract::{Schema, check};
use crate::common::harness::Harness;

/// Runs `example` (a command line) against `h`: the job it publishes is
/// checked against the job schema, then a worker answers it, and the result
/// the example prints is returned, checked against the result schema.
async fn run_example(h: &Harness, mut example: Command, hint: &str) -> Value {
    // The queues exist, with no worker to take the job before it is read.
    h.start_worker().await.stop().await.unwrap();
    let jobs = h.settings.amqp.jobs_queue.clone();
    example
        .env("AMQP_URL", h.settings.amqp.url.as_str())
        .env("JOBS_QUEUE", &jobs);
    let run = tokio::task::spawn_blocking(move || example.output());
    let (body, props) = h
        .next_on(&jobs, Duration::from_secs(20))
        .await
        .unwrap_or_else(|| panic!("the example published no job ({hint})"));
    let job: Value = serde_json::from_slice(&body).expect("the example's job is JSON");
    check(Schema::Job, "the example's job", &job);
    assert!(props.reply_to().is_some(), "it asks for a reply");
    assert_eq!(
        props.correlation_id().as_ref().map(|c| c.as_str()),
        job["id"].as_str(),
        "its correlation_id is its id"
    );
    h.publish_raw(&body, props).await;
    let w = h.start_worker().await;
    let out = run.await.unwrap().expect("the example runs");
    w.stop().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the example failed ({hint}): {stderr}"
    );
    let r: Value = serde_json::from_slice(&out.stdout).expect("a JSON result");
    check(Schema::Result, "the example's result", &r);
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_producer_gets_a_sent_result() {
    let h = Harness::new("pyexample").await;
    let mut py = Command::new("python3");
    py.args(["examples/producer.py", "py@example.com"]);
    let r = run_example(&h, py, "is pika installed? scripts/test installs it").await;
    assert_eq!(r["status"], "sent", "{r}");
    assert_eq!(h.sink.mails_to("py@example.com").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_producer_gets_a_sent_result() {
    let h = Harness::new("nodeexample").await;
    let mut node = Command::new("node");
    node.args([
        "examples/node/producer.mjs",
        "node@example.com",
        "203.0.113.9",
    ]);
    let hint = "is amqplib installed? scripts/test runs npm ci in examples/node";
    let r = run_example(&h, node, hint).await;
    assert_eq!(r["status"], "sent", "{r}");
    assert_eq!(r["quota"].as_array().map(Vec::len), Some(2), "{r}");
    let mails = h.sink.mails_to("node@example.com");
    assert_eq!(mails.len(), 1);
    assert!(mails[0].data.contains("Acme"), "the example's vars");
}
