//! The promises end to end, one file per promise, with the real worker,
//! RabbitMQ, Redis (a private server or cluster for anything cut) and an
//! SMTP server inside the test. The helpers they share are here.

mod answered;
mod flowing;
mod limits;
mod once;
mod outages;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common;
use crate::common::harness::Harness;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use serde_json::{Value, json};

fn job(id: &str, email: &str) -> Value {
    json!({"id": id, "email": email, "code": "493817"})
}

/// How many messages `queue` holds now (0 if there is none).
async fn depth(h: &Harness, queue: &str) -> u32 {
    h.queue_depth(queue).await.unwrap_or(0)
}

/// A RabbitMQ user of the test's own, deleted when dropped.
struct OtherUser(String);

impl OtherUser {
    fn create(name: &str) -> Self {
        let ctl = |args: &[&str]| {
            let ok = Command::new("rabbitmqctl")
                .arg("-q")
                .args(args)
                .status()
                .expect("rabbitmqctl runs")
                .success();
            assert!(ok, "rabbitmqctl {args:?}");
        };
        ctl(&["add_user", name, "pw"]);
        ctl(&["set_permissions", "-p", "/", name, ".*", ".*", ".*"]);
        Self(name.to_owned())
    }

    fn url(&self) -> String {
        format!("amqp://{}:pw@127.0.0.1:5672/%2f", self.0)
    }
}

impl Drop for OtherUser {
    fn drop(&mut self) {
        let _ = Command::new("rabbitmqctl")
            .args(["-q", "delete_user", &self.0])
            .status();
    }
}

/// Collects results until every id in `ids` has one, allowing repeats
/// (a result confirmed just before a connection dropped is published again
/// when its job comes back). Returns every result per id.
async fn results_for(
    h: &Harness,
    ids: &[String],
    timeout: Duration,
) -> BTreeMap<String, Vec<Value>> {
    let deadline = Instant::now() + timeout;
    let mut by_id: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let q = h.settings.amqp.results_queue.clone();
    while ids.iter().any(|id| !by_id.contains_key(id)) {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "results missing for {:?}",
            ids.iter()
                .filter(|i| !by_id.contains_key(*i))
                .collect::<Vec<_>>()
        );
        if let Some((body, _)) = h.next_on(&q, left.min(Duration::from_secs(1))).await {
            let r: Value = serde_json::from_slice(&body).unwrap();
            by_id
                .entry(r["id"].as_str().unwrap().to_owned())
                .or_default()
                .push(r);
        }
    }
    // Late repeats.
    while let Some((body, _)) = h.next_on(&q, Duration::from_millis(500)).await {
        let r: Value = serde_json::from_slice(&body).unwrap();
        by_id
            .entry(r["id"].as_str().unwrap().to_owned())
            .or_default()
            .push(r);
    }
    by_id
}

/// Every id's results, the mails per mailbox, and whether any job was lost.
struct Tally {
    jobs: usize,
    repeated_results: usize,
    mailed_twice: usize,
}

fn tally(
    h: &Harness,
    results: &BTreeMap<String, Vec<Value>>,
    mailbox_of: impl Fn(&str) -> String,
) -> Tally {
    let mut t = Tally {
        jobs: results.len(),
        repeated_results: 0,
        mailed_twice: 0,
    };
    for (id, rs) in results {
        t.repeated_results += rs.len() - 1;
        assert!(
            rs.iter().all(|r| r["status"] == rs[0]["status"]),
            "{id}: results disagree: {rs:?}"
        );
        let mails = h.sink.mails_to(&mailbox_of(id)).len();
        if rs[0]["status"] == "sent" {
            assert!(mails >= 1, "{id} answered sent but not mailed");
        }
        t.mailed_twice += mails.saturating_sub(1);
    }
    t
}

/// The value of the series `series` on the worker's `/metrics` (0 if absent).
async fn metric(http: std::net::SocketAddr, series: &str) -> f64 {
    let text = common::harness::http_get(http, "/metrics").await.1;
    (text.lines())
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

fn forged(ticket: &str, attempt: i64) -> BasicProperties {
    let mut headers = FieldTable::default();
    headers.insert(
        "x-mailgate-ticket".into(),
        AMQPValue::LongString(ticket.into()),
    );
    headers.insert("x-mailgate-attempt".into(), AMQPValue::LongLongInt(attempt));
    BasicProperties::default().with_headers(headers)
}

// ---------------------------------------------------------------------------
// Redis Cluster: the cluster client re-runs a script whose reply was lost.

/// What the proxy cuts the next reply to: a request holding these bytes,
/// and how many such replies it has still to cut.
type Armed = std::sync::Arc<std::sync::Mutex<Option<(Vec<u8>, usize)>>>;

/// A one-node Redis Cluster that announces a proxy's port, so that every
/// client connection goes through the proxy; the proxy can cut the reply to
/// the next request that contains `needle` (after Redis ran it).
struct CutCluster {
    node: common::KillOnDrop,
    port: u16,
    proxy: u16,
    armed: Armed,
    cuts: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    dir: std::path::PathBuf,
}

impl CutCluster {
    fn start() -> Self {
        use std::io::{Read, Write};
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        use std::sync::{Arc, Mutex};
        let port = common::free_cluster_port();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let proxy = listener.local_addr().unwrap().port();
        let dir = std::env::temp_dir().join(format!("lost-cluster-{port}"));
        std::fs::create_dir_all(&dir).unwrap();
        let child = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--cluster-enabled", "yes", "--cluster-node-timeout", "1000"])
            .args(["--cluster-announce-port", &proxy.to_string()])
            .args(["--cluster-announce-bus-port", &(port + 10000).to_string()])
            .args(["--cluster-config-file", &format!("nodes-{port}.conf")])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server");
        let node = common::KillOnDrop(child);
        let cli = |args: &[&str]| {
            let out = std::process::Command::new("redis-cli")
                .args(["-p", &port.to_string()])
                .args(args)
                .output()
                .expect("redis-cli");
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !cli(&["ping"]).contains("PONG") {
            assert!(Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(50));
        }
        cli(&["cluster", "addslotsrange", "0", "16383"]);
        while !cli(&["cluster", "info"]).contains("cluster_state:ok") {
            assert!(Instant::now() < deadline, "cluster up");
            std::thread::sleep(Duration::from_millis(50));
        }
        let armed: Armed = Arc::new(Mutex::new(None));
        let cuts = Arc::new(AtomicUsize::new(0));
        let (a2, c2) = (armed.clone(), cuts.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
                    continue;
                };
                let cut_here = Arc::new(AtomicBool::new(false));
                let (mut c, mut s) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let (armed, flag) = (a2.clone(), cut_here.clone());
                std::thread::spawn(move || {
                    let mut buf = [0u8; 64 * 1024];
                    while let Ok(n) = c.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        {
                            let mut armed = armed.lock().unwrap();
                            if let Some((needle, times)) = armed.as_ref()
                                && buf[..n]
                                    .windows(needle.len())
                                    .filter(|w| *w == &needle[..])
                                    .count()
                                    >= *times
                            {
                                *armed = None;
                                flag.store(true, Ordering::SeqCst);
                            }
                        }
                        if s.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = s.shutdown(std::net::Shutdown::Both);
                });
                let (flag, cuts) = (cut_here, c2.clone());
                std::thread::spawn(move || {
                    let (mut from, mut to) = (server, client);
                    let mut buf = [0u8; 64 * 1024];
                    while let Ok(n) = from.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        if flag.load(Ordering::SeqCst) {
                            cuts.fetch_add(1, Ordering::SeqCst);
                            break;
                        }
                        if to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = to.shutdown(std::net::Shutdown::Both);
                    let _ = from.shutdown(std::net::Shutdown::Both);
                });
            }
        });
        Self {
            node,
            port,
            proxy,
            armed,
            cuts,
            dir,
        }
    }

    fn url(&self) -> String {
        format!("redis+cluster://127.0.0.1:{}", self.proxy)
    }

    /// Cuts the reply to the next request containing `needle`.
    fn cut_reply_to(&self, needle: &str) {
        self.cut_reply_to_batch(needle, 1);
    }

    /// Cuts the reply to the next request containing `needle` `times` times.
    fn cut_reply_to_batch(&self, needle: &str, times: usize) {
        *self.armed.lock().unwrap() = Some((needle.as_bytes().to_vec(), times));
    }

    fn cli(&self, args: &[&str]) -> String {
        let out = std::process::Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }
}

impl Drop for CutCluster {
    fn drop(&mut self) {
        let _ = self.node.0.kill();
        let _ = self.node.0.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn nth(prefix: &str, i: usize) -> Value {
    json!({"id": format!("{prefix}{i}"), "email": format!("{prefix}{i}@example.com"),
           "ip": format!("198.51.100.{}", i % 250 + 1), "code": "271828"})
}

/// Collects results until every id in `ids` has one or `timeout` passes
/// (missing ids are printed, for the caller to judge), then repeats that
/// arrive within `late` of each other. Returns every result per id.
async fn results_within(
    h: &Harness,
    ids: &[String],
    timeout: Duration,
    late: Duration,
) -> BTreeMap<String, Vec<Value>> {
    let deadline = Instant::now() + timeout;
    let mut by_id: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let q = h.settings.amqp.results_queue.clone();
    while ids.iter().any(|id| !by_id.contains_key(id)) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            eprintln!(
                "results missing for {:?}",
                ids.iter()
                    .filter(|i| !by_id.contains_key(*i))
                    .collect::<Vec<_>>()
            );
            break;
        }
        if let Some((body, _)) = h.next_on(&q, left.min(Duration::from_secs(1))).await {
            let r: Value = serde_json::from_slice(&body).unwrap();
            by_id
                .entry(r["id"].as_str().unwrap().to_owned())
                .or_default()
                .push(r);
        }
    }
    while let Some((body, _)) = h.next_on(&q, late).await {
        let r: Value = serde_json::from_slice(&body).unwrap();
        by_id
            .entry(r["id"].as_str().unwrap().to_owned())
            .or_default()
            .push(r);
    }
    by_id
}

/// Each status combination and how many jobs had it.
fn statuses(results: &BTreeMap<String, Vec<Value>>) -> BTreeMap<String, usize> {
    let mut tally = BTreeMap::new();
    for rs in results.values() {
        let key = rs
            .iter()
            .map(|r| r["status"].as_str().unwrap_or("?").to_owned())
            .collect::<Vec<_>>()
            .join("+");
        *tally.entry(key).or_default() += 1;
    }
    tally
}
