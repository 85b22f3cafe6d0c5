//! A Redis primary, its replica and three Sentinels of the test's own; the
//! worker finds the primary through `redis+sentinel://`. The replication
//! link stops carrying writes (a proxy holds them, as a congested network
//! would) while jobs are sent, the primary is killed (SIGKILL), and the
//! Sentinels promote the replica, which never saw those writes. A new
//! replica joins the new primary. The producer then sends every job again
//! (as one that missed its answers would), and more jobs to the mailboxes
//! that were at their limit.
//!
//! With `redis.min_replicas_acked = 1` nothing is mailed twice and nobody
//! gets past a limit: no send began before its mark reached the replica.
//! With 0 the test measures what a failover costs: the figures go to
//! FAULTS.md. Either way the worker follows the new primary without a
//! restart and no job goes unanswered.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use crate::common::harness::{Harness, http_get};
use crate::common::{KillOnDrop, PrivateRedis, free_port};
use lapin::options::{BasicAckOptions, BasicGetOptions};
use serde_json::{Value, json};

/// Jobs to mailboxes of their own.
const FREE: usize = 150;
/// Mailboxes at their limit (1 mail a minute): each gets one job before
/// the failover and `AFTER` more after it.
const LIMITED: usize = 12;
const AFTER: usize = 3;
/// The name the Sentinels monitor the primary under.
const SERVICE: &str = "mg";
/// The Sentinels ask for a password of their own (`requirepass`), given in
/// the URL's query.
const SENTINEL_PASSWORD: &str = "s3ntinel&pw";

/// The replication link, through a proxy that forwards, then holds what the
/// primary sends (it never arrives), then cuts the link for good.
struct Link {
    port: u16,
    state: Arc<AtomicU8>,
}

const FORWARD: u8 = 0;
const HOLD: u8 = 1;
const CUT: u8 = 2;

impl Link {
    fn start(upstream: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(AtomicU8::new(FORWARD));
        let st = state.clone();
        std::thread::spawn(move || {
            for replica in listener.incoming() {
                let Ok(replica) = replica else { continue };
                if st.load(Ordering::SeqCst) == CUT {
                    continue;
                }
                let Ok(primary) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                let (mut r, mut p) = (replica.try_clone().unwrap(), primary.try_clone().unwrap());
                // The replica's acknowledgements go through as they are.
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut r, &mut p);
                });
                let st = st.clone();
                std::thread::spawn(move || {
                    let (mut from, mut to) = (primary, replica);
                    let mut buf = [0u8; 16 * 1024];
                    loop {
                        let n = match from.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        match st.load(Ordering::SeqCst) {
                            FORWARD => {
                                if to.write_all(&buf[..n]).is_err() {
                                    break;
                                }
                            }
                            HOLD => {}
                            _ => break,
                        }
                    }
                    let _ = to.shutdown(Shutdown::Both);
                });
            }
        });
        Self { port, state }
    }

    fn set(&self, state: u8) {
        self.state.store(state, Ordering::SeqCst);
    }
}

/// A primary, a replica (behind a [`Link`]) and three Sentinels, on free
/// ports.
struct Group {
    primary: PrivateRedis,
    link: Link,
    replica: PrivateRedis,
    sentinels: Vec<(u16, KillOnDrop)>,
    dir: PathBuf,
}

impl Group {
    fn start() -> Self {
        let primary = PrivateRedis::start();
        let dir = std::env::temp_dir().join(format!("mgtest-sentinel-{}", primary.port));
        std::fs::create_dir_all(&dir).unwrap();
        let link = Link::start(primary.port);
        let replica = replica_of(link.port, &dir);
        let sentinels = (0..3)
            .map(|_| {
                let port = free_port();
                let conf = dir.join(format!("sentinel-{port}.conf"));
                std::fs::write(
                    &conf,
                    format!(
                        "port {port}\nbind 127.0.0.1\ndaemonize no\ndir {dir}\n\
                         sentinel monitor {SERVICE} 127.0.0.1 {primary} 2\n\
                         sentinel down-after-milliseconds {SERVICE} 1000\n\
                         sentinel failover-timeout {SERVICE} 60000\n\
                         sentinel parallel-syncs {SERVICE} 1\n\
                         requirepass {SENTINEL_PASSWORD}\n",
                        dir = dir.display(),
                        primary = primary.port,
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
            primary,
            link,
            replica,
            sentinels,
            dir,
        };
        // Every Sentinel knows the replica, so it can be promoted.
        group.until("the Sentinels see the replica", |g| {
            g.sentinels.iter().all(|(port, _)| {
                sentinel_says(*port, &["SENTINEL", "REPLICAS", SERVICE])
                    .contains(&g.replica.port.to_string())
            })
        });
        group
    }

    fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|(p, _)| format!("127.0.0.1:{p}"))
            .collect();
        format!(
            "redis+sentinel://{}/{SERVICE}?sentinel_password=s3ntinel%26pw",
            hosts.join(",")
        )
    }

    /// The primary's port, as the first Sentinel names it.
    fn primary_named(&self) -> Option<u16> {
        sentinel_says(
            self.sentinels[0].0,
            &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE],
        )
        .lines()
        .nth(1)
        .and_then(|p| p.trim().parse().ok())
    }

    fn until(&self, what: &str, done: impl Fn(&Self) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !done(self) {
            assert!(Instant::now() < deadline, "{what}: not within 60s");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.sentinels.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A replica of the server on `port`, writing its synced data under `dir`.
fn replica_of(port: u16, dir: &std::path::Path) -> PrivateRedis {
    let dir = dir.to_str().expect("a UTF-8 temp dir");
    PrivateRedis::start_with(&["--replicaof", "127.0.0.1", &port.to_string(), "--dir", dir])
}

fn sentinel_says(port: u16, args: &[&str]) -> String {
    let out = std::process::Command::new("redis-cli")
        .args(["-p", &port.to_string(), "--no-auth-warning"])
        .args(["-a", SENTINEL_PASSWORD])
        .args(args)
        .output()
        .expect("redis-cli runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What a run saw.
struct Figures {
    /// Messages published, and results read.
    messages: usize,
    results: usize,
    /// Jobs (ids) with fewer results than messages: lost.
    lost: usize,
    /// Jobs mailed more than once.
    mailed_twice: usize,
    /// Mails to limited mailboxes past their one a minute.
    over_admitted: usize,
    /// Jobs mailed before the kill, and in all.
    mailed_before_kill: usize,
    mailed: usize,
    /// From the kill until every message was answered.
    answered_after_kill: Duration,
    /// Sends held back because the replica did not acknowledge their marks
    /// (`mailgate_send_marks_unreplicated_total`).
    held_back: u64,
    statuses: BTreeMap<String, usize>,
}

impl Figures {
    /// One line for FAULTS.md.
    fn report(&self, min_replicas_acked: u32) -> String {
        format!(
            "min_replicas_acked = {min_replicas_acked}: {} messages, {} results, {} lost; \
             {} mails ({} before the kill), {} jobs mailed twice, {} over-admitted, \
             {} sends held back; all answered {:.1?} after the kill; statuses {:?}",
            self.messages,
            self.results,
            self.lost,
            self.mailed,
            self.mailed_before_kill,
            self.mailed_twice,
            self.over_admitted,
            self.held_back,
            self.answered_after_kill,
            self.statuses,
        )
    }
}

fn job(id: &str, mailbox: &str, n: usize) -> Value {
    json!({"id": id, "email": mailbox, "code": format!("{:06}", 100_000 + n),
           "ip": format!("10.1.{}.{}", n / 250, n % 250 + 1)})
}

async fn run(test: &str, min_replicas_acked: u32) -> Figures {
    let group = Group::start();
    let h = Harness::with(test, |s| {
        s.redis.url = group.url().into();
        s.redis.min_replicas_acked = min_replicas_acked;
        s.redis.replica_ack_timeout = Duration::from_millis(500);
        // Room to retry through the failover, the promotion and the old
        // primary's return as a replica.
        s.retry.max_attempts = 10;
        s.retry.initial = Duration::from_millis(500);
        s.retry.max = Duration::from_secs(3);
        // A copy of a job whose send another attempt owns waits out that
        // attempt's lease: the shortest lease settings allow.
        s.limits.send_lease = Duration::from_secs(11);
        s.limits.dedup_for = Duration::from_secs(600);
    })
    .await;
    let worker = h.start_worker().await;

    // Phase 1, while the link carries no writes.
    group.link.set(HOLD);
    let mut messages: BTreeMap<String, usize> = BTreeMap::new();
    let mut phase1 = Vec::new();
    for i in 0..FREE {
        phase1.push(job(&format!("f{i}"), &format!("f{i}@example.com"), i));
    }
    for l in 0..LIMITED {
        let n = FREE + l;
        phase1.push(job(&format!("l{l}-0"), &format!("l{l}@example.com"), n));
    }
    for j in &phase1 {
        h.publish(j).await;
        *messages
            .entry(j["id"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    let mut results: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let results_queue = h.settings.amqp.results_queue.clone();
    let collect = async |results: &mut BTreeMap<String, Vec<String>>, until: Instant| loop {
        match h
            .channel
            .basic_get(results_queue.as_str().into(), BasicGetOptions::default())
            .await
            .expect("basic_get")
        {
            Some(m) => {
                let r: Value = serde_json::from_slice(&m.delivery.data).unwrap();
                m.delivery.ack(BasicAckOptions::default()).await.unwrap();
                results
                    .entry(r["id"].as_str().unwrap().to_owned())
                    .or_default()
                    .push(r["status"].as_str().unwrap().to_owned());
            }
            None if Instant::now() >= until => return,
            None => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    // Up to 3 s of sending (or waiting for the replica, with
    // min_replicas_acked) before the primary dies.
    collect(&mut results, Instant::now() + Duration::from_secs(3)).await;
    let mailed_before_kill = h.sink.mails().len();
    let mut group = group;
    group.primary.kill();
    let killed = Instant::now();
    group.link.set(CUT);
    eprintln!("killed the primary after {mailed_before_kill} mails");
    while group.primary_named() != Some(group.replica.port) {
        collect(&mut results, Instant::now() + Duration::from_millis(200)).await;
        assert!(killed.elapsed() < Duration::from_secs(60), "no failover");
    }
    eprintln!("the replica was promoted in {:.1?}", killed.elapsed());
    // A new replica joins the new primary, as an operator's (or an
    // orchestrator's) replacement would.
    let _spare = replica_of(group.replica.port, &group.dir);

    // Phase 2: every job again, and more to the limited mailboxes.
    let mut phase2 = phase1.clone();
    for l in 0..LIMITED {
        for k in 1..=AFTER {
            let n = FREE + LIMITED + l * AFTER + k;
            phase2.push(job(&format!("l{l}-{k}"), &format!("l{l}@example.com"), n));
        }
    }
    for j in &phase2 {
        h.publish(j).await;
        *messages
            .entry(j["id"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    let total: usize = messages.values().sum();
    let deadline = Instant::now() + Duration::from_secs(90);
    while results.values().map(Vec::len).sum::<usize>() < total && Instant::now() < deadline {
        collect(&mut results, Instant::now() + Duration::from_millis(500)).await;
    }
    let answered_after_kill = killed.elapsed();
    // Anything late would show as a mail or a result here.
    collect(&mut results, Instant::now() + Duration::from_secs(2)).await;
    let (_, metrics) = http_get(worker.http, "/metrics").await;
    let held_back = metrics
        .lines()
        .find_map(|l| l.strip_prefix("mailgate_send_marks_unreplicated_total "))
        .map_or(0, |n| n.trim().parse().unwrap_or(0));
    worker.stop().await.expect("the worker stops cleanly");

    let mails = h.sink.mails();
    let mut by_code: BTreeMap<String, usize> = BTreeMap::new();
    let mut by_limited: BTreeMap<String, usize> = BTreeMap::new();
    for m in &mails {
        let code = phase2
            .iter()
            .find_map(|j| {
                let code = j["code"].as_str().unwrap();
                m.data.contains(code).then(|| code.to_owned())
            })
            .expect("every mail carries a job's code");
        *by_code.entry(code).or_default() += 1;
        if m.to[0].starts_with('l') {
            *by_limited.entry(m.to[0].clone()).or_default() += 1;
        }
    }
    let mut statuses = BTreeMap::new();
    for s in results.values().flatten() {
        *statuses.entry(s.clone()).or_default() += 1;
    }
    Figures {
        messages: total,
        results: results.values().map(Vec::len).sum(),
        lost: messages
            .iter()
            .filter(|(id, n)| results.get(*id).map_or(0, Vec::len) < **n)
            .count(),
        mailed_twice: by_code.values().filter(|n| **n > 1).count(),
        over_admitted: by_limited.values().map(|n| n.saturating_sub(1)).sum(),
        mailed_before_kill,
        mailed: mails.len(),
        answered_after_kill,
        held_back,
        statuses,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_replica_acknowledging_every_send_mark_a_failover_mails_nothing_twice() {
    let f = run("sentinel1", 1).await;
    eprintln!("{}", f.report(1));
    assert_eq!(f.lost, 0, "every message answered");
    assert_eq!(f.mailed_twice, 0, "no job mailed twice");
    assert_eq!(f.over_admitted, 0, "nobody past a limit");
    assert_eq!(f.mailed, FREE + LIMITED, "every job mailed once");
    assert!(
        f.held_back > 0,
        "the sends the replica did not acknowledge are counted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_waiting_for_replicas_a_failover_is_measured() {
    let f = run("sentinel0", 0).await;
    eprintln!("{}", f.report(0));
    // What is kept without waiting: nothing is lost, and the worker follows.
    assert_eq!(f.lost, 0, "every message answered");
    // The control: this failover does lose writes, so the other test's
    // zeros are the setting's doing.
    assert!(f.mailed_twice > 0, "the failover lost no send mark");
    assert_eq!(f.held_back, 0, "nothing waits for replicas");
    assert!(f.mailed >= FREE + LIMITED, "every job mailed");
}
