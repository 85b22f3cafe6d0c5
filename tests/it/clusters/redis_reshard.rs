//! Redis Cluster resharding: a slot being moved (MIGRATING on its owner,
//! IMPORTING on the receiver: what `redis-cli --cluster reshard` sets while
//! it moves keys, and what a stopped reshard leaves behind) answers ASK for
//! keys the owner does not hold. The cluster client follows it (with the
//! client's retries turned off, every attempt of such a job fails until it
//! is answered `failed`, 2 of 2 runs).

use std::time::{Duration, Instant};

use crate::common::harness::Harness;
use crate::common::{PrivateCluster, redis_cli as cli};
use serde_json::{Value, json};

async fn run(hash_tag: bool) {
    let cluster = PrivateCluster::start();
    let h = Harness::with("reshard", |s| {
        let tag = format!("mgtest-reshard-{}", std::process::id());
        s.redis.url = cluster.url().into();
        s.redis.key_prefix = if hash_tag {
            format!("{{{tag}}}:")
        } else {
            format!("{tag}:")
        };
        s.amqp.jobs_queue = format!("{tag}.jobs");
        s.amqp.results_queue = format!("{tag}.results");
        // Production defaults (config/default.toml).
        s.retry.max_attempts = 5;
        s.retry.initial = Duration::from_secs(1);
        s.retry.max = Duration::from_secs(300);
    })
    .await;
    let w = h.start_worker().await;
    let q = h.settings.amqp.results_queue.clone();
    let job = |id: &str| json!({"id": id, "email": format!("{id}@example.com"), "code": "424242"});
    h.publish(&job("warm")).await;
    let (b, _) = h
        .next_on(&q, Duration::from_secs(20))
        .await
        .expect("a result");
    let r: Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(r["status"], "sent", "{r}");

    // The slot of the next job's record is being resharded: no key moved.
    let key = format!("{}job:a1", h.settings.redis.key_prefix);
    let slot = cli(cluster.ports[0], &["cluster", "keyslot", &key]);
    let src = cluster.primary_of(&key).expect("a primary");
    let dst = *cluster.ports.iter().find(|p| **p != src).unwrap();
    let (src_id, dst_id) = (
        cli(src, &["cluster", "myid"]),
        cli(dst, &["cluster", "myid"]),
    );
    assert_eq!(
        cli(dst, &["cluster", "setslot", &slot, "importing", &src_id]),
        "OK"
    );
    assert_eq!(
        cli(src, &["cluster", "setslot", &slot, "migrating", &dst_id]),
        "OK"
    );
    eprintln!("slot {slot} of {key}: migrating {src} -> {dst}");

    let t = Instant::now();
    h.publish(&job("a1")).await;
    let (b, _) = h
        .next_on(&q, Duration::from_secs(90))
        .await
        .expect("a result");
    let r: Value = serde_json::from_slice(&b).unwrap();
    eprintln!("after {:.1?}: {r}", t.elapsed());
    let mails = h.sink.mails().len();
    eprintln!("mails: {mails}");
    // The reshard of that slot completes (no key to move): the slot is the
    // receiver's; the client learns it from a MOVED reply.
    for p in &cluster.ports {
        cli(*p, &["cluster", "setslot", &slot, "node", &dst_id]);
    }
    let t2 = Instant::now();
    h.publish(&job("a1")).await;
    let (b, _) = h
        .next_on(&q, Duration::from_secs(90))
        .await
        .expect("a result");
    let r2: Value = serde_json::from_slice(&b).unwrap();
    eprintln!("after the move, in {:.1?}: {r2}", t2.elapsed());
    w.stop().await.unwrap();
    assert_eq!(r["status"], "sent", "a job during a reshard: {r}");
}

/// Keys spread over the shards, production retry settings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_keys_are_in_a_slot_being_resharded_is_sent() {
    run(false).await;
}
