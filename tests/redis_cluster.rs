//! The worker on a Redis Cluster of the test's own (three primaries): jobs
//! are admitted, limited, de-duplicated and answered as on one server, and
//! `/readyz` checks the primary that holds mailgate's slot.

mod common;

use std::time::Duration;

use common::PrivateCluster;
use common::harness::{Harness, http_get};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_runs_on_a_cluster() {
    let cluster = PrivateCluster::start();
    let h = Harness::with("rcl", |s| {
        s.redis.url = cluster.url();
        // The hash tag puts every key of the deployment in one slot.
        s.redis.key_prefix = format!("{{{}}}", s.redis.key_prefix);
    })
    .await;
    let w = h.start_worker().await;
    let job = |id: &str, mailbox: &str| json!({"id": id, "email": mailbox, "code": "424242"});
    // One at a time, so the order of admissions is the test's.
    for (id, mailbox, status) in [
        ("k1", "k@example.com", "sent"),
        ("k2", "k@example.com", "rejected"), // a minute's quota is one
        ("o1", "o@example.com", "sent"),
        ("k1", "k@example.com", "duplicate"), // the same job again
    ] {
        h.publish(&job(id, mailbox)).await;
        let r = h.result().await;
        assert_eq!(
            (r["id"].as_str(), r["status"].as_str()),
            (Some(id), Some(status))
        );
    }
    assert_eq!(h.sink.wait_for(2, Duration::from_secs(5)).len(), 2);
    h.no_more_results(Duration::from_millis(500)).await;
    let (status, body) = http_get(w.http, "/readyz").await;
    assert_eq!(status, 200, "{body}");
    // Every key is on the one slot of the prefix's tag, on the cluster.
    let tag = h.settings.redis.key_prefix.clone();
    let keys: usize = cluster
        .ports
        .iter()
        .map(|port| {
            let out = std::process::Command::new("redis-cli")
                .args(["-p", &port.to_string(), "--scan", "--pattern"])
                .arg(format!("{}*", tag.replace('{', "\\{").replace('}', "\\}")))
                .output()
                .expect("redis-cli runs");
            String::from_utf8_lossy(&out.stdout).lines().count()
        })
        .sum();
    assert!(
        keys >= 3,
        "the job records and logs are in the cluster: {keys}"
    );
    w.stop().await.unwrap();
}
