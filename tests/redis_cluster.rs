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
    h.publish(&job("k1", "k@example.com")).await;
    h.publish(&job("k2", "k@example.com")).await; // a minute's quota is one
    h.publish(&job("o1", "o@example.com")).await;
    let mut statuses: Vec<(String, String)> = Vec::new();
    for n in 0..4 {
        if n == 3 {
            h.publish(&job("k1", "k@example.com")).await; // the same job again
        }
        let r = h.result().await;
        statuses.push((
            r["id"].as_str().unwrap().to_owned(),
            r["status"].as_str().unwrap().to_owned(),
        ));
    }
    statuses.sort();
    assert_eq!(
        statuses,
        [
            ("k1".into(), "duplicate".into()),
            ("k1".into(), "sent".into()),
            ("k2".into(), "rejected".into()),
            ("o1".into(), "sent".into()),
        ]
    );
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
