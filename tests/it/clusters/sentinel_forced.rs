//! Forced Sentinel failovers (`SENTINEL FAILOVER`, routine in maintenance)
//! under traffic: a primary, two replicas at equal priority and three
//! Sentinels of the test's own; `redis.min_replicas_acked = 1`.
//!
//! A forced failover leaves the old primary up. The chosen replica leaves
//! it, and for a second or two its other replica still acknowledges the
//! writes it keeps taking, which the new primary never gets. A worker that
//! trusted `WAIT 1` then mailed jobs whose send marks were lost, and mailed
//! them again when they came back (dozens a failover, on this machine).
//! The worker now writes nothing while a Sentinel reports a failover, drops
//! the old primary as soon as they name another, and trusts a mark only
//! when every replica a Sentinel could promote acknowledged it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::common::harness::Harness;
use crate::common::{KillOnDrop, PrivateRedis, free_port};
use lapin::options::{BasicAckOptions, BasicGetOptions};
use serde_json::{Value, json};

const SERVICE: &str = "mgf";
/// Forced failovers, one after the other once the last has settled.
const FAILOVERS: usize = 2;
/// Jobs published a second while the failovers run.
const RATE: u64 = 40;

/// A primary, two replicas and three Sentinels, on free ports.
struct Group {
    servers: Vec<PrivateRedis>,
    sentinels: Vec<(u16, KillOnDrop)>,
    dir: PathBuf,
}

impl Group {
    fn start() -> Self {
        let dir = std::env::temp_dir().join(format!("mgtest-forced-{}", free_port()));
        std::fs::create_dir_all(&dir).unwrap();
        let d = dir.to_str().unwrap().to_owned();
        // Its sync files go to the test's directory too.
        let primary = PrivateRedis::start_with(&["--dir", &d]);
        let p = primary.port.to_string();
        let mut servers = vec![primary];
        for _ in 0..2 {
            servers.push(PrivateRedis::start_with(&[
                "--replicaof",
                "127.0.0.1",
                &p,
                "--dir",
                &d,
            ]));
        }
        let sentinels = (0..3)
            .map(|_| {
                let port = free_port();
                let conf = dir.join(format!("sentinel-{port}.conf"));
                std::fs::write(
                    &conf,
                    format!(
                        "port {port}\nbind 127.0.0.1\ndaemonize no\ndir {d}\n\
                         sentinel monitor {SERVICE} 127.0.0.1 {p} 2\n\
                         sentinel down-after-milliseconds {SERVICE} 1000\n\
                         sentinel failover-timeout {SERVICE} 20000\n\
                         sentinel parallel-syncs {SERVICE} 1\n",
                    ),
                )
                .unwrap();
                let child = std::process::Command::new("redis-server")
                    .arg(&conf)
                    .arg("--sentinel")
                    .stdout(std::process::Stdio::null())
                    .spawn()
                    .expect("redis-server is installed");
                (port, KillOnDrop(child))
            })
            .collect();
        let group = Self {
            servers,
            sentinels,
            dir,
        };
        group.until_settled();
        group
    }

    fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|(p, _)| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+sentinel://{}/{SERVICE}", hosts.join(","))
    }

    fn says(&self, i: usize, args: &[&str]) -> String {
        let out = std::process::Command::new("redis-cli")
            .args(["-p", &self.sentinels[i].0.to_string()])
            .args(args)
            .output()
            .expect("redis-cli runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn primary_named(&self, i: usize) -> Option<u16> {
        self.says(i, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE])
            .lines()
            .nth(1)
            .and_then(|p| p.trim().parse().ok())
    }

    /// Until every Sentinel names one primary, with no failover under way,
    /// and lists the two other servers as replicas of it, synced: what an
    /// operator waits for before the next maintenance step.
    fn until_settled(&self) {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let settled = (0..self.sentinels.len()).all(|i| {
                let master = self.says(i, &["SENTINEL", "MASTER", SERVICE]);
                let replicas = self.says(i, &["SENTINEL", "REPLICAS", SERVICE]);
                let Some(primary) = self.primary_named(i) else {
                    return false;
                };
                !master.contains("failover_in_progress")
                    && self
                        .servers
                        .iter()
                        .filter(|s| s.port != primary)
                        .all(|s| replicas.contains(&s.port.to_string()))
                    && replicas.matches("\nslave\n").count() >= 2
                    && replicas.matches("\nok\n").count() >= 2
                    && !replicas.contains("\nmaster\n")
            });
            if settled {
                return;
            }
            assert!(Instant::now() < deadline, "the Sentinels did not settle");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.sentinels.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn job(n: usize) -> Value {
    json!({"id": format!("j{n}"), "email": format!("j{n}@example.com"),
           "code": format!("{:06}", 100_000 + n), "ip": format!("10.2.{}.{}", n / 250, n % 250 + 1)})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_sentinel_failovers_under_traffic_mail_nothing_twice() {
    let group = Group::start();
    let h = Harness::with("forced", |s| {
        s.redis.url = group.url().into();
        s.redis.min_replicas_acked = 1;
        s.redis.replica_ack_timeout = Duration::from_millis(500);
        s.retry.max_attempts = 20;
        s.retry.initial = Duration::from_millis(500);
        s.retry.max = Duration::from_secs(2);
        s.limits.send_lease = Duration::from_secs(11);
        s.limits.dedup_for = Duration::from_secs(600);
    })
    .await;
    let worker = h.start_worker().await;
    let results_queue = h.settings.amqp.results_queue.clone();
    let mut results: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let collect = async |results: &mut BTreeMap<String, Vec<String>>| {
        while let Some(m) = h
            .channel
            .basic_get(results_queue.as_str().into(), BasicGetOptions::default())
            .await
            .expect("basic_get")
        {
            let r: Value = serde_json::from_slice(&m.delivery.data).unwrap();
            m.delivery.ack(BasicAckOptions::default()).await.unwrap();
            results
                .entry(r["id"].as_str().unwrap().to_owned())
                .or_default()
                .push(r["status"].as_str().unwrap().to_owned());
        }
    };

    // Traffic throughout; each failover forced a second into it, and the
    // next once the group has settled again.
    let mut published = 0;
    let tick = Duration::from_millis(1000 / RATE);
    for round in 0..FAILOVERS {
        let before = group.primary_named(0).expect("a primary");
        let mut forced = false;
        let started = Instant::now();
        loop {
            h.publish(&job(published)).await;
            published += 1;
            tokio::time::sleep(tick).await;
            if !forced && started.elapsed() > Duration::from_secs(1) {
                assert!(
                    group
                        .says(0, &["SENTINEL", "FAILOVER", SERVICE])
                        .contains("OK"),
                    "the failover was refused"
                );
                forced = true;
                eprintln!("failover {round} forced after {published} jobs");
            }
            let moved = (0..3).all(|i| group.primary_named(i).is_some_and(|p| p != before));
            if forced && moved && started.elapsed() > Duration::from_secs(6) {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(60), "no failover");
            collect(&mut results).await;
        }
        eprintln!("failover {round} done after {published} jobs");
        group.until_settled();
    }
    // Every job again, as a producer that missed its answers would send it.
    for n in 0..published {
        h.publish(&job(n)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while results.values().map(Vec::len).sum::<usize>() < 2 * published {
        assert!(Instant::now() < deadline, "not every job was answered");
        collect(&mut results).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    collect(&mut results).await;
    worker.stop().await.expect("the worker stops cleanly");

    let mails = h.sink.mails();
    let mut by_code: BTreeMap<String, usize> = BTreeMap::new();
    for m in &mails {
        let code = (0..published)
            .map(|n| format!("{:06}", 100_000 + n))
            .find(|c| m.data.contains(c.as_str()))
            .expect("every mail carries a job's code");
        *by_code.entry(code).or_default() += 1;
    }
    let twice: BTreeSet<_> = by_code.iter().filter(|(_, n)| **n > 1).collect();
    let mut statuses: BTreeMap<String, usize> = BTreeMap::new();
    for s in results.values().flatten() {
        *statuses.entry(s.clone()).or_default() += 1;
    }
    eprintln!(
        "{published} jobs, {} mails, {} mailed twice, statuses {statuses:?}",
        mails.len(),
        twice.len()
    );
    assert!(twice.is_empty(), "mailed twice: {twice:?}");
    // No wrong answer either: a write that waited out the failover was not
    // lost, so no copy finds a send it cannot vouch for.
    assert_eq!(
        statuses,
        BTreeMap::from([("duplicate".into(), published), ("sent".into(), published)]),
        "each job sent once and its copy answered from the ledger"
    );
    assert_eq!(mails.len(), published, "every job mailed once");
    assert!(
        results.values().all(|r| r.len() == 2),
        "one result per message"
    );
}
