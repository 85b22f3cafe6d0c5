//! The worker on a Redis Cluster of the test's own: jobs are admitted,
//! limited, de-duplicated and answered as on one server, `/readyz` checks
//! the primary that holds mailgate's slot, and when that primary dies
//! mid-load the worker follows the replica the cluster promotes.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::common::PrivateCluster;
use crate::common::harness::{Harness, http_get};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_runs_on_a_cluster() {
    let cluster = PrivateCluster::start();
    // The hash tag puts every key of the deployment in one slot.
    let nodes = runs_on(&cluster, "rcl", |prefix| format!("{{{prefix}}}")).await;
    assert_eq!(nodes, 1, "every key in one slot, on one primary");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_runs_on_a_cluster_with_its_keys_spread_over_the_shards() {
    let cluster = PrivateCluster::start();
    // Without a hash tag, each key lives where its own name puts it.
    let nodes = runs_on(&cluster, "rcs", str::to_owned).await;
    assert!(nodes >= 2, "the keys are spread over {nodes} primaries");
}

/// Jobs through a worker on `cluster` with the key prefix `prefix` makes of
/// the harness's: admitted, limited by mailbox and by address,
/// de-duplicated, answered; `/readyz` is ready. Returns on how many nodes
/// the deployment's keys are.
async fn runs_on(cluster: &PrivateCluster, name: &str, prefix: fn(&str) -> String) -> usize {
    let h = Harness::with(name, |s| {
        s.redis.url = cluster.url().into();
        s.redis.key_prefix = prefix(&s.redis.key_prefix);
    })
    .await;
    let w = h.start_worker().await;
    let job = |id: &str, mailbox: &str, ip: &str| json!({"id": id, "email": mailbox, "code": "424242", "ip": ip});
    // One at a time, so the order of admissions is the test's.
    for (id, mailbox, ip, status) in [
        ("k1", "k@example.com", "192.0.2.1", "sent"),
        ("k2", "k@example.com", "192.0.2.2", "rejected"), // a minute's quota is one
        ("o1", "o@example.com", "192.0.2.1", "sent"),
        ("k1", "k@example.com", "192.0.2.1", "duplicate"), // the same job again
    ] {
        h.publish(&job(id, mailbox, ip)).await;
        let r = h.result().await;
        assert_eq!(
            (r["id"].as_str(), r["status"].as_str()),
            (Some(id), Some(status))
        );
    }
    // The address's quota (5 a minute) binds across mailboxes.
    for n in 0..6 {
        h.publish(&job(
            &format!("ip{n}"),
            &format!("m{n}@example.com"),
            "198.51.100.7",
        ))
        .await;
        let r = h.result().await;
        match n {
            0..5 => assert_eq!(r["status"], "sent", "{r}"),
            _ => {
                assert_eq!(r["status"], "rejected", "{r}");
                assert_eq!(r["rule"]["scope"], "ip", "{r}");
            }
        }
    }
    assert_eq!(h.sink.wait_for(7, Duration::from_secs(5)).len(), 7);
    h.no_more_results(Duration::from_millis(500)).await;
    let (status, body) = http_get(w.http, "/readyz").await;
    assert_eq!(status, 200, "{body}");
    let prefix = h.settings.redis.key_prefix.clone();
    let pattern = format!("{}*", prefix.replace('{', "\\{").replace('}', "\\}"));
    let keys: Vec<usize> = cluster
        .ports
        .iter()
        .map(|port| {
            let out = std::process::Command::new("redis-cli")
                .args(["-p", &port.to_string(), "--scan", "--pattern", &pattern])
                .output()
                .expect("redis-cli runs");
            String::from_utf8_lossy(&out.stdout).lines().count()
        })
        .collect();
    assert!(
        keys.iter().sum::<usize>() >= 3,
        "the job records and logs are in the cluster: {keys:?}"
    );
    w.stop().await.unwrap();
    keys.iter().filter(|n| **n > 0).count()
}

/// 200 jobs to mailboxes of their own and 3 to each of 10 mailboxes at
/// their limit (1 a minute); the primary holding mailgate's slot is killed
/// (SIGKILL) after 60 results, its replica takes over, the old primary
/// comes back as its replica, and every job is then sent again by the
/// producer. With `min_replicas_acked = 1` nothing is
/// lost, nothing is mailed twice, and no mailbox gets past its limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_primary_of_the_slot_dies_mid_load_and_nothing_is_lost_or_mailed_twice() {
    dies_mid_load(
        "rclf",
        |prefix| format!("{{{prefix}}}"),
        |tag| tag.to_owned(),
    )
    .await;
}

/// The same with the keys spread over the shards: the primary killed holds
/// a limited mailbox's log (and a third of the rest).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_dies_mid_load_with_the_keys_spread_and_nothing_is_lost_or_mailed_twice() {
    dies_mid_load("rcsf", str::to_owned, |prefix| {
        format!("{prefix}email:l0@example.com")
    })
    .await;
}

/// The load of the tests above; the primary killed is the one holding the
/// key `victim` names (given the key prefix).
async fn dies_mid_load(name: &str, prefix: fn(&str) -> String, victim: fn(&str) -> String) {
    let mut cluster = PrivateCluster::start_with(1);
    let h = Harness::with(name, |s| {
        s.redis.url = cluster.url().into();
        s.redis.key_prefix = prefix(&s.redis.key_prefix);
        s.redis.min_replicas_acked = 1;
        s.limits.send_lease = Duration::from_secs(11);
        s.limits.dedup_for = Duration::from_secs(600);
        s.retry.max_attempts = 10;
        s.retry.initial = Duration::from_millis(500);
        s.retry.max = Duration::from_secs(3);
    })
    .await;
    let tag = victim(&h.settings.redis.key_prefix);
    let w = h.start_worker().await;
    let mut jobs: Vec<Value> = (0..200)
        .map(|i| {
            json!({"id": format!("f{i}"), "email": format!("f{i}@example.com"),
                        "code": format!("{:06}", 100_000 + i),
                        "ip": format!("10.2.{}.{}", i / 250, i % 250 + 1)})
        })
        .collect();
    for l in 0..10 {
        for k in 0..3 {
            let n = 200 + l * 3 + k;
            jobs.push(
                json!({"id": format!("l{l}-{k}"), "email": format!("l{l}@example.com"),
                             "code": format!("{:06}", 100_000 + n),
                             "ip": format!("10.3.0.{}", n % 250 + 1)}),
            );
        }
    }
    for j in &jobs {
        h.publish(j).await;
    }
    let mut results: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut killed = None;
    let deadline = Instant::now() + Duration::from_secs(120);
    let want = 2 * jobs.len();
    let mut republished = false;
    let mut restarted = false;
    while results.values().map(Vec::len).sum::<usize>() < want {
        assert!(Instant::now() < deadline, "answered: {}", results.len());
        let answered: usize = results.values().map(Vec::len).sum();
        if killed.is_none() && answered >= 60 {
            let primary = cluster.primary_of(&tag).expect("a primary holds the slot");
            cluster.kill(primary);
            killed = Some((primary, Instant::now()));
            eprintln!("killed the slot's primary ({primary}) after {answered} results");
        }
        // Once its replica took over, the old primary comes back, empty,
        // and becomes the new one's replica (as an orchestrator would
        // restart it), so sends can be acknowledged again.
        if let Some((old, at)) = killed
            && !restarted
            && cluster.primary_of(&tag).is_some_and(|p| p != old)
        {
            restarted = true;
            eprintln!("the replica took over in {:.1?}", at.elapsed());
            cluster.restart(old);
        }
        if !republished && answered == jobs.len() {
            // The producer sends every job again.
            republished = true;
            for j in &jobs {
                h.publish(j).await;
            }
        }
        let q = h.settings.amqp.results_queue.clone();
        if let Some((body, _)) = h.next_on(&q, Duration::from_millis(200)).await {
            let r: Value = serde_json::from_slice(&body).unwrap();
            results
                .entry(r["id"].as_str().unwrap().to_owned())
                .or_default()
                .push(r["status"].as_str().unwrap().to_owned());
        }
    }
    let (old, at) = killed.expect("the primary was killed");
    assert_ne!(
        cluster.primary_of(&tag),
        Some(old),
        "another node holds the slot"
    );
    eprintln!("all answered {:.1?} after the kill", at.elapsed());
    assert!(restarted, "the replica took over");
    h.no_more_results(Duration::from_secs(1)).await;
    let mails = h.sink.mails();
    let codes: BTreeSet<&str> = jobs.iter().map(|j| j["code"].as_str().unwrap()).collect();
    let mut per_code: BTreeMap<&str, usize> = BTreeMap::new();
    let mut per_limited: BTreeMap<String, usize> = BTreeMap::new();
    for m in &mails {
        let code = codes
            .iter()
            .find(|c| m.data.contains(*c))
            .expect("a job's code");
        *per_code.entry(code).or_default() += 1;
        if m.to[0].starts_with('l') {
            *per_limited.entry(m.to[0].clone()).or_default() += 1;
        }
    }
    assert!(per_code.values().all(|n| *n == 1), "no job mailed twice");
    assert!(
        per_limited.values().all(|n| *n == 1),
        "nobody past a limit: {per_limited:?}"
    );
    // (What the jobs that were not mailed were answered, if any.)
    let unmailed: Vec<(&String, &Vec<String>)> = results
        .iter()
        .filter(|(id, statuses)| id.starts_with('f') && !statuses.iter().any(|s| s == "sent"))
        .collect();
    assert_eq!(
        mails.len(),
        210,
        "every free job and one per limited mailbox; not sent: {unmailed:?}"
    );
    let (status, body) = http_get(w.http, "/readyz").await;
    assert_eq!(status, 200, "{body}");
    w.stop().await.unwrap();
}
