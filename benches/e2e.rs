//! End-to-end load generator: the real `mailgate worker` process against the
//! local RabbitMQ and Redis and a fast SMTP sink, next to the ceilings
//! measured in the same run.
//!
//!     cargo bench --bench e2e                 # the full run (BENCHMARKS.md)
//!     cargo bench --bench e2e -- --jobs 5000  # another size
//!     cargo test --bench e2e                  # a smoke run of a few hundred jobs (CI)
//!
//! Scenarios: all admitted (distinct mailboxes), all rejected (one mailbox),
//! a realistic mix (10 000 mailboxes, 1 000 IPs, 20 % repeats within a
//! minute); at maximum rate and at a fixed offered rate (50 % of the
//! measured maximum); 1 and 2 worker processes. Ceilings: (a) a bare broker
//! loop (consume → publish a result with confirm → ack, same prefetch and
//! message size), (b) the limiter's decisions/s at the same concurrency, (c)
//! the SMTP sink with the same pool size. Then a load sweep: admitted jobs
//! at 10 % to 100 % of the measured maximum, tabled and drawn (latency
//! against offered load, throughput against the ceilings) to
//! `docs/e2e-load.svg`, which BENCHMARKS.md embeds (the smoke run draws to
//! a scratch file). Queues and keys are the run's own and are deleted at
//! the end.

// A benchmark's scenario reads top to bottom; the house's 80-line limit
// is for the code under test.
#![allow(clippy::too_many_lines)]

use std::collections::HashMap;
use std::io::Write as _;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_lite::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use mailgate::broker::Topology;
use mailgate::domain::{EmailAddress, JobId, Ticket};
use mailgate::ledger::{Entry, JobRef, Ledger, RedisLedger};
use mailgate::limiter::{Clock, Request};
use mailgate::settings::{QueueType, RedisSettings, Settings};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const PREFETCH: u16 = 64;
const POOL: u32 = 16;

fn amqp_url() -> String {
    std::env::var("BENCH_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}
fn redis_url() -> String {
    std::env::var("BENCH_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
}

/// The type of the run's queues, the bare loop's and the worker's alike:
/// `BENCH_QUEUE_TYPE` (`classic` or `quorum`), else mailgate's default.
fn queue_type() -> QueueType {
    match std::env::var("BENCH_QUEUE_TYPE").as_deref() {
        Ok("classic") => QueueType::Classic,
        Ok("quorum") => QueueType::Quorum,
        Ok(other) => panic!("BENCH_QUEUE_TYPE={other}: classic or quorum"),
        Err(_) => QueueType::default(),
    }
}

// ---------------------------------------------------------------- SMTP sink

/// A minimal, fast SMTP server: accepts every mail, keeps a count.
struct Sink {
    port: u16,
    accepted: Arc<AtomicU64>,
}

async fn start_sink() -> Sink {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let accepted = Arc::new(AtomicU64::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let count = count.clone();
            tokio::spawn(async move {
                let _ = sink_session(stream, count).await;
            });
        }
    });
    Sink { port, accepted }
}

async fn sink_session(stream: tokio::net::TcpStream, count: Arc<AtomicU64>) -> std::io::Result<()> {
    // Replies to pipelined commands go out at once, as from a server that
    // flushes its replies when its input runs dry (RFC 2920): without this,
    // Nagle would hold the second reply for the client's delayed ACK.
    stream.set_nodelay(true)?;
    let (r, mut w) = stream.into_split();
    let mut r = BufReader::new(r);
    w.write_all(b"220 sink ESMTP\r\n").await?;
    let mut line = String::new();
    let mut in_data = false;
    loop {
        line.clear();
        if r.read_line(&mut line).await? == 0 {
            return Ok(());
        }
        if in_data {
            if line == ".\r\n" {
                in_data = false;
                count.fetch_add(1, Ordering::Relaxed);
                w.write_all(b"250 queued\r\n").await?;
            }
            continue;
        }
        let verb = line.get(..4).unwrap_or("").to_ascii_uppercase();
        let reply: &[u8] = match verb.as_str() {
            "EHLO" => b"250-sink\r\n250-PIPELINING\r\n250 8BITMIME\r\n",
            "HELO" | "MAIL" | "RCPT" | "RSET" | "NOOP" => b"250 ok\r\n",
            "DATA" => {
                in_data = true;
                b"354 go on\r\n"
            }
            "QUIT" => {
                w.write_all(b"221 bye\r\n").await?;
                return Ok(());
            }
            _ => b"502 no\r\n",
        };
        w.write_all(reply).await?;
    }
}

// ------------------------------------------------------------ worker process

/// The pids of processes whose command name is `comm` (e.g. the broker's
/// `beam.smp`), for the saturation columns.
fn pids_named(comm: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == comm)
        })
        .collect()
}

/// CPU seconds (user + system) of processes named `comm`, together.
fn cpu_of(comm: &str) -> f64 {
    pids_named(comm).into_iter().map(|p| proc_usage(p).0).sum()
}

/// CPU seconds (user + system) and peak RSS (kB) of a process.
fn proc_usage(pid: u32) -> (f64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may contain spaces) start at ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let cpu = (ticks(11) + ticks(12)) / 100.0; // utime, stime; USER_HZ is 100 on Linux
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let hwm = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    (cpu, hwm)
}

struct Run {
    queues: String,
    prefix: String,
    sink_port: u16,
    conn: Connection,
    /// With publisher confirms.
    ch: Channel,
}

impl Run {
    fn jobs(&self) -> String {
        format!("{}jobs", self.queues)
    }
    fn results(&self) -> String {
        format!("{}results", self.queues)
    }

    fn spawn_worker(&self) -> Child {
        // BENCH_WORKER_BIN runs another build (e.g. main before a change)
        // against the same generator and ceilings.
        let bin = std::env::var("BENCH_WORKER_BIN")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_mailgate").to_owned());
        Command::new(bin)
            .arg("worker")
            .env("MAILGATE__AMQP__URL", amqp_url())
            .env("MAILGATE__AMQP__JOBS_QUEUE", self.jobs())
            .env("MAILGATE__AMQP__RESULTS_QUEUE", self.results())
            .env("MAILGATE__AMQP__QUEUE_TYPE", queue_type().as_str())
            .envs(std::env::var("BENCH_PREFETCH").map(|p| ("MAILGATE__AMQP__PREFETCH", p)))
            .env("MAILGATE__REDIS__URL", redis_url())
            .env("MAILGATE__REDIS__KEY_PREFIX", &self.prefix)
            .env(
                "MAILGATE__SMTP__URL",
                format!("smtp://127.0.0.1:{}?tls=none", self.sink_port),
            )
            .envs(std::env::var("BENCH_POOL").map(|p| ("MAILGATE__SMTP__POOL_SIZE", p)))
            .env("MAILGATE__HTTP__LISTEN", "127.0.0.1:0")
            .env("RUST_LOG", "error")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the mailgate binary starts")
    }
}

async fn wait_for_consumers(conn: &Connection, queue: &str, n: u32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        // A failed passive declare closes its channel: use a fresh one.
        let ch = conn.create_channel().await.expect("channel");
        let found = ch
            .queue_declare(queue.into(), passive, FieldTable::default())
            .await;
        let _ = ch.close(200, "ok".into()).await;
        if found.is_ok_and(|q| q.consumer_count() >= n) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "workers did not start consuming {queue}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// --------------------------------------------------------------- scenarios

#[derive(Clone, Copy, PartialEq)]
enum Mix {
    Admitted,
    Rejected,
    Realistic,
}

impl Mix {
    fn name(self) -> &'static str {
        match self {
            Mix::Admitted => "all admitted",
            Mix::Rejected => "all rejected",
            Mix::Realistic => "realistic mix",
        }
    }

    /// The `n`-th job of run `tag`.
    fn job(self, tag: &str, n: u64, rng: &mut u64) -> Value {
        let mut next = || {
            *rng ^= *rng << 13;
            *rng ^= *rng >> 7;
            *rng ^= *rng << 17;
            *rng
        };
        let (email, ip) = match self {
            // Each at a domain of its own, as sign-ups spread over many
            // (the shipped config's domain scope counts each).
            Mix::Admitted => (format!("u{n}@d{n}-{tag}.example"), None),
            Mix::Rejected => (format!("victim.{tag}@example.com"), None),
            Mix::Realistic => {
                // 20 % repeat one of the last 50 mailboxes (within a minute).
                let m = if next() % 5 == 0 {
                    n.saturating_sub(1 + next() % 50)
                } else {
                    next() % 10_000
                };
                (
                    format!("m{m}@d{m}-{tag}.example"),
                    Some(format!("10.{}.{}.1", (next() % 1000) / 250, next() % 250)),
                )
            }
        };
        let mut job = json!({"id": format!("{tag}-{n}"), "email": email, "code": "493817",
                             "vars": {"app_name": "Bench"}});
        if let Some(ip) = ip {
            job["ip"] = json!(ip);
        }
        job
    }
}

#[derive(Default)]
struct Outcome {
    jobs: u64,
    seconds: f64,
    /// CPU share of one core used by RabbitMQ and by Redis while it ran.
    rabbit_cpu: f64,
    redis_cpu: f64,
    by_status: HashMap<String, u64>,
    latencies_ms: Vec<f64>,
    worker_cpu: f64,
    worker_rss_kb: u64,
    /// Redis commands mailgate sent (not those run inside its scripts), and
    /// the bytes in and out, while it ran.
    redis: RedisTraffic,
    /// Keys under the run's prefix added while it ran.
    redis_keys: i64,
    /// Redis's time for one call of the article's script, µs, measured
    /// right before and right after the scenario (the mean).
    article_us: f64,
}

/// Commands clients sent to Redis, read from `INFO commandstats` (commands
/// that scripts run are counted apart: a script cannot call `EVALSHA`,
/// `EVAL`, `FCALL`, `SET`, `PING` or `INFO`), and bytes from `INFO stats`.
#[derive(Default, Clone, Copy)]
struct RedisTraffic {
    /// `EVALSHA`, `EVAL` and `FCALL`: one per script or function call.
    scripts: u64,
    /// Microseconds Redis spent running them (`usec`, the commands they
    /// call included).
    script_usec: u64,
    /// Other commands mailgate sends itself (`PING`, `SCRIPT`, `FUNCTION`,
    /// and `EXEC`: one a snapshot; not `SET`: `INFO` counts the ones
    /// scripts run, and the job records are written with `SET`).
    others: u64,
    bytes_in: u64,
    bytes_out: u64,
}

impl RedisTraffic {
    fn read() -> Self {
        let Ok(mut c) = redis::Client::open(redis_url()).and_then(|c| c.get_connection()) else {
            return Self::default();
        };
        let info: String = redis::cmd("INFO")
            .arg("all")
            .query(&mut c)
            .unwrap_or_default();
        let field = |cmd: &str, name: &str| -> u64 {
            info.lines()
                .find_map(|l| l.strip_prefix(&format!("cmdstat_{cmd}:")))
                .and_then(|r| {
                    r.split(',')
                        .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
                })
                .and_then(|n| n.parse().ok())
                .unwrap_or(0)
        };
        let calls = |cmd: &str| field(cmd, "calls");
        let stat = |name: &str| -> u64 {
            info.lines()
                .find_map(|l| l.strip_prefix(&format!("{name}:")))
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or(0)
        };
        Self {
            scripts: calls("evalsha") + calls("eval") + calls("fcall"),
            script_usec: field("evalsha", "usec") + field("eval", "usec") + field("fcall", "usec"),
            // INFO itself is this reader's; it is not counted.
            others: calls("ping") + calls("script|load") + calls("function|load") + calls("exec"),
            bytes_in: stat("total_net_input_bytes"),
            bytes_out: stat("total_net_output_bytes"),
        }
    }

    fn since(self, before: Self) -> Self {
        Self {
            scripts: self.scripts - before.scripts,
            script_usec: self.script_usec - before.script_usec,
            others: self.others - before.others,
            bytes_in: self.bytes_in - before.bytes_in,
            bytes_out: self.bytes_out - before.bytes_out,
        }
    }
}

/// Article 003's script (benches/article.lua): the yardstick of Redis's
/// cost per job.
const ARTICLE_SCRIPT: &str = include_str!("article.lua");

/// Redis's own time for one call of the article's script, µs (`INFO
/// commandstats`): 8 clients, 250 calls each, over 1 000 mailboxes under
/// `prefix`, while nothing else runs, so that a scenario's script time
/// per job can be quoted against it, measured on the same Redis under the
/// same conditions.
fn article_call_us(prefix: &str) -> f64 {
    let script = redis::Script::new(ARTICLE_SCRIPT);
    let before = RedisTraffic::read();
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let script = &script;
            s.spawn(move || {
                let Ok(mut c) = redis::Client::open(redis_url()).and_then(|c| c.get_connection())
                else {
                    return;
                };
                for i in 0..250u64 {
                    let now = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis() as u64);
                    let key = format!("{prefix}article:user{}", (t * 7919 + i * 104_729) % 1000);
                    let _: redis::RedisResult<i64> = script
                        .key(key)
                        .arg(5)
                        .arg(10)
                        .arg(now - 86_400_000)
                        .arg(now)
                        .invoke(&mut c);
                }
            });
        }
    });
    let d = RedisTraffic::read().since(before);
    d.script_usec as f64 / d.scripts.max(1) as f64
}

/// How many keys lie under `prefix`.
fn keys_under(prefix: &str) -> i64 {
    let Ok(mut c) = redis::Client::open(redis_url()).and_then(|c| c.get_connection()) else {
        return 0;
    };
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query(&mut c)
        .unwrap_or_default();
    keys.len() as i64
}

impl Outcome {
    fn rate(&self) -> f64 {
        self.jobs as f64 / self.seconds
    }
    fn pct(&self, p: f64) -> f64 {
        if self.latencies_ms.is_empty() {
            return 0.0;
        }
        let i = ((self.latencies_ms.len() as f64 - 1.0) * p).round() as usize;
        self.latencies_ms[i]
    }
}

/// Publishes `n` jobs of `mix` (at `rate` jobs/s, or flat out) to workers
/// already consuming, and collects every result.
async fn drive(
    run: &Run,
    mix: Mix,
    n: u64,
    rate: Option<f64>,
    tag: &str,
    workers: &[u32],
) -> Outcome {
    let ch = &run.ch;
    let article0 = tokio::task::block_in_place(|| article_call_us(&run.prefix));
    let usage0: Vec<_> = workers.iter().map(|&p| proc_usage(p)).collect();
    let (rabbit0, redis0) = (cpu_of("beam.smp"), cpu_of("redis-server"));
    let (traffic0, keys0) = (RedisTraffic::read(), keys_under(&run.prefix));
    let published: Arc<std::sync::Mutex<HashMap<String, Instant>>> = Arc::default();
    // Results are read on their own channel while jobs are published.
    let conn = Connection::connect(&amqp_url(), ConnectionProperties::default())
        .await
        .expect("amqp");
    let rch = conn.create_channel().await.expect("channel");
    rch.basic_qos(1000, BasicQosOptions::default())
        .await
        .expect("qos");
    let mut results = rch
        .basic_consume(
            run.results().as_str().into(),
            "bench".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume results");
    let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let collector = {
        let published = published.clone();
        tokio::spawn(async move {
            let mut out = Outcome::default();
            let mut got = 0;
            while got < n {
                let Ok(Some(Ok(d))) =
                    tokio::time::timeout(Duration::from_secs(60), results.next()).await
                else {
                    eprintln!("\nresults stopped after {got} of {n}");
                    break;
                };
                let now = Instant::now();
                let _ = d.ack(BasicAckOptions { multiple: false }).await;
                let r: Value = serde_json::from_slice(&d.data).unwrap_or(Value::Null);
                let id = r["id"].as_str().unwrap_or("").to_owned();
                if let Some(t) = published.lock().unwrap().remove(&id) {
                    out.latencies_ms
                        .push(now.duration_since(t).as_secs_f64() * 1000.0);
                }
                *out.by_status
                    .entry(r["status"].as_str().unwrap_or("?").to_owned())
                    .or_default() += 1;
                got += 1;
                if progress && got % 500 == 0 {
                    eprint!("\r  {got}/{n} results");
                }
            }
            if progress {
                eprint!("\r{:40}\r", "");
            }
            out
        })
    };
    let start = Instant::now();
    let mut rng = 0x2545_F491_4F6C_DD1D_u64;
    // Confirms are awaited by a task of their own, so a paced publisher is
    // not slowed to one broker round trip per job.
    let (confirms, mut confirm_rx) =
        tokio::sync::mpsc::unbounded_channel::<lapin::PublisherConfirm>();
    let confirmer = tokio::spawn(async move {
        while let Some(c) = confirm_rx.recv().await {
            c.await.expect("confirm");
        }
    });
    for i in 0..n {
        if let Some(rate) = rate {
            let due = start + Duration::from_secs_f64(i as f64 / rate);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                tokio::time::sleep(wait).await;
            }
        }
        let job = mix.job(tag, i, &mut rng);
        let id = job["id"].as_str().unwrap_or("").to_owned();
        published.lock().unwrap().insert(id, Instant::now());
        let body = job.to_string();
        let confirm = ch
            .basic_publish(
                "".into(),
                run.jobs().as_str().into(),
                BasicPublishOptions::default(),
                body.as_bytes(),
                BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .expect("publish");
        let _ = confirms.send(confirm);
    }
    drop(confirms);
    confirmer.await.expect("confirmer");
    let mut out = collector.await.expect("collector");
    out.seconds = start.elapsed().as_secs_f64();
    out.jobs = out.by_status.values().sum();
    out.latencies_ms.sort_by(|a, b| a.total_cmp(b));
    out.rabbit_cpu = (cpu_of("beam.smp") - rabbit0) / out.seconds;
    out.redis_cpu = (cpu_of("redis-server") - redis0) / out.seconds;
    out.redis = RedisTraffic::read().since(traffic0);
    out.redis_keys = keys_under(&run.prefix) - keys0;
    for (&pid, (cpu0, _)) in workers.iter().zip(usage0) {
        let (cpu1, hwm) = proc_usage(pid);
        out.worker_cpu += cpu1 - cpu0;
        out.worker_rss_kb = out.worker_rss_kb.max(hwm);
    }
    let _ = conn.close(200, "bye".into()).await;
    let article1 = tokio::task::block_in_place(|| article_call_us(&run.prefix));
    out.article_us = (article0 + article1) / 2.0;
    out
}

// ---------------------------------------------------------------- ceilings

/// (a) The bare broker loop: in place of a worker, a consumer of the jobs
/// queue with the worker's prefetch that, for each job, publishes a
/// result-sized answer to the results queue with a confirm and acks, doing
/// nothing else. It runs in a process of its own (this bench binary with
/// `--bare-loop`), so its CPU per message is measured like the worker's, and
/// it is driven and measured exactly like a scenario (the same publisher,
/// the same result collector), so the ratio compares like with like.
/// Offered at `rate`, it shows the latency the broker and this bench add on
/// their own (the "bare broker loop, offered" row).
async fn ceiling_broker(run: &Run, n: u64, rate: Option<f64>) -> Outcome {
    // Declared as the worker declares them: the loop and the worker run on
    // the same queues.
    let topology = Topology {
        jobs: run.jobs(),
        results: run.results(),
        dead: format!("{}.dead", run.jobs()),
        redelivered: format!("{}.redelivered", run.jobs()),
        wait_bands_ms: vec![250],
        retries: 0,
        queue_type: queue_type(),
        results_expiration: None,
    };
    for q in [run.jobs(), run.results()] {
        run.ch
            .queue_declare(
                q.as_str().into(),
                QueueDeclareOptions::durable(),
                topology.arguments(&q),
            )
            .await
            .expect("declare");
    }
    let exe = std::env::current_exe().expect("the bench binary");
    let child = Workers(vec![
        Command::new(exe)
            .args(["--bare-loop", &run.jobs(), &run.results()])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the bare loop starts"),
    ]);
    wait_for_consumers(&run.conn, &run.jobs(), 1).await;
    let tag = if rate.is_some() { "ceilp" } else { "ceil" };
    let out = drive(run, Mix::Rejected, n, rate, tag, &[child.0[0].id()]).await;
    drop(child);
    out
}

/// The bare loop's process: consume `jobs`, answer to `results` with a
/// confirm, ack; until killed.
fn bare_loop(jobs: String, results: String) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let conn = Connection::connect(&amqp_url(), ConnectionProperties::default())
            .await
            .expect("amqp");
        let wch = conn.create_channel().await.expect("channel");
        wch.basic_qos(PREFETCH, BasicQosOptions::default())
            .await
            .expect("qos");
        wch.confirm_select(ConfirmSelectOptions::default())
            .await
            .expect("confirms");
        let mut consumer = wch
            .basic_consume(
                jobs.as_str().into(),
                "ceiling".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("consume");
        while let Some(Ok(d)) = consumer.next().await {
            let (wch, results) = (wch.clone(), results.clone());
            tokio::spawn(async move {
                let id = serde_json::from_slice::<Value>(&d.data)
                    .ok()
                    .and_then(|j| j["id"].as_str().map(str::to_owned))
                    .unwrap_or_default();
                let result = json!({"id": id, "status": "rejected", "email": "victim@example.com",
                    "decided_at_ms": 1_795_000_000_000_u64, "retry_after_ms": 41_234, "rule": {"scope": "email", "window_ms": 60_000, "max": 1},
                    "attempts": 1, "error": null, "correlation_id": null});
                wch.basic_publish(
                    "".into(),
                    results.as_str().into(),
                    BasicPublishOptions::default(),
                    result.to_string().as_bytes(),
                    BasicProperties::default().with_delivery_mode(2),
                )
                .await
                .expect("publish")
                .await
                .expect("confirm");
                d.ack(BasicAckOptions::default()).await.expect("ack");
            });
        }
    });
}

/// (b) admissions/s (the ledger's script with the limiter's decision) with
/// `PREFETCH` concurrent callers, all admitted.
async fn ceiling_redis(prefix: &str, n: u64) -> f64 {
    let settings = RedisSettings {
        allow_eviction: true,
        ..RedisSettings::new(redis_url(), format!("{prefix}ceil:"))
    };
    // The shipped limits, as the workers run them.
    let limits = Settings::load(std::path::Path::new("config/default.toml"))
        .expect("the shipped config")
        .limits;
    let l = RedisLedger::connect(&settings, &limits)
        .await
        .expect("redis");
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..PREFETCH {
        let (l, next) = (l.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let id = JobId::parse(&format!("c{i}")).expect("id");
                let email = EmailAddress::parse(&format!("c{i}@d{i}.example")).expect("email");
                let req = Request {
                    id: &id,
                    email: &email,
                    ip: None,
                    purpose: None,
                    session: None,
                    known_mailbox: false,
                };
                let ticket = Ticket::new();
                let entry = Entry {
                    job: JobRef {
                        request: req,
                        ticket: &ticket,
                        attempt: 1,
                        holder: 1,
                    },
                    expires_at_ms: None,
                    made_at_ms: None,
                };
                l.admit(&entry, Clock::Server).await.expect("decision");
            }
        }));
    }
    for t in tasks {
        t.await.expect("caller");
    }
    n as f64 / start.elapsed().as_secs_f64()
}

/// (c) the SMTP sink through mailgate's own `Mailer` with a pool of `POOL`
/// connections: the same code, TLS mode and slots the worker uses.
async fn ceiling_smtp(port: u16, n: u64) -> f64 {
    use mailgate::mailer::{Mailer, Outgoing};
    let mailer = Mailer::new(&mailgate::settings::SmtpSettings {
        url: format!("smtp://127.0.0.1:{port}?tls=none").into(),
        relays: Vec::new(),
        circuit: Default::default(),
        from: "Bench <no-reply@example.com>".into(),
        pool_size: POOL,
        timeout: Duration::from_secs(30),
        tls: Default::default(),
        canary: None,
    })
    .expect("mailer");
    let to = EmailAddress::parse("user@example.com").expect("to");
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..PREFETCH {
        let (mailer, next, to) = (mailer.clone(), next.clone(), to.clone());
        tasks.push(tokio::spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < n {
                let m = mailer
                    .compose(&Outgoing {
                        to: &to,
                        subject: "493817 is your Bench code",
                        text: "Your code is 493817",
                        html: None,
                    })
                    .expect("message");
                let slot = mailer.reserve().await;
                let job = mailgate::domain::JobId::parse("bench").expect("an id");
                mailer.send(slot, m, &job).await.expect("send");
            }
        }));
    }
    for task in tasks {
        task.await.expect("sender");
    }
    n as f64 / start.elapsed().as_secs_f64()
}

// -------------------------------------------------------------------- main

struct Row {
    /// Which scenario (the same in every round).
    key: &'static str,
    what: String,
    out: Outcome,
    workers: usize,
}

/// The ceilings of one round.
#[derive(Clone, Copy)]
struct Ceilings {
    /// (a) messages/s, and the bare loop's CPU seconds per message.
    broker: f64,
    broker_cpu_per_msg: f64,
    /// (b) decisions/s.
    redis: f64,
    /// (c) mails/s.
    smtp: f64,
}

impl Ceilings {
    /// What scenario `row` is compared with: (a) for the rejected ones,
    /// min((a), (c)) for the others; none for a paced one.
    fn of(&self, row: &Row) -> Option<f64> {
        if row.what.contains("offered") {
            None
        } else if row.key.starts_with("rej") {
            Some(self.broker)
        } else {
            Some(self.broker.min(self.smtp))
        }
    }
}

/// Worker processes, stopped (SIGTERM, then waited for) when dropped, even
/// if the bench panics.
struct Workers(Vec<Child>);

impl Drop for Workers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            let _ = c.wait();
        }
    }
}

async fn scenario(
    run: &Run,
    key: &'static str,
    mix: Mix,
    n: u64,
    rate: Option<f64>,
    workers: usize,
    round: usize,
) -> Row {
    let children = Workers((0..workers).map(|_| run.spawn_worker()).collect());
    wait_for_consumers(&run.conn, &run.jobs(), workers as u32).await;
    let pids: Vec<u32> = children.0.iter().map(Child::id).collect();
    // Job ids are the run's own in every round: a reused id would be a
    // duplicate.
    let out = drive(run, mix, n, rate, &format!("{key}{round}"), &pids).await;
    drop(children);
    let what = match rate {
        Some(r) => format!("{}, offered {:.0}/s", mix.name(), r),
        None => format!("{}, max rate", mix.name()),
    };
    eprintln!("  {what}, {workers} worker(s): {:.0} jobs/s", out.rate());
    Row {
        key,
        what,
        out,
        workers,
    }
}

/// The value after `flag` on the command line.
fn arg(flag: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--bare-loop") {
        let queue = |k: usize| args.get(i + k).cloned().expect("--bare-loop JOBS RESULTS");
        return bare_loop(queue(1), queue(2));
    }
    let benching = args.iter().any(|a| a == "--bench");
    let jobs: u64 = arg("--jobs")
        .and_then(|v| v.parse().ok())
        .unwrap_or(if benching { 20_000 } else { 300 });
    let rounds: usize = arg("--rounds")
        .and_then(|v| v.parse().ok())
        .unwrap_or(if benching { 3 } else { 1 });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let pid = std::process::id();
        let sink = start_sink().await;
        let conn = Connection::connect(&amqp_url(), ConnectionProperties::default())
            .await
            .expect("RabbitMQ must answer (BENCH_AMQP_URL)");
        let ch = conn.create_channel().await.expect("channel");
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .expect("confirms");
        let run = Run {
            queues: format!("mgbench.{pid}."),
            prefix: format!("mgbench:{pid}:"),
            sink_port: sink.port,
            conn,
            ch,
        };

        // `--only TAG` (rej, adm, mix, adm2, rej2, or bare: the bare loop) runs one scenario and no
        // ceilings, e.g. under a profiler; `--rate R` paces it.
        let only = arg("--only");
        let paced_rate: Option<f64> = arg("--rate").and_then(|r| r.parse().ok());
        let mut rounds_out: Vec<(Option<Ceilings>, Vec<Row>)> = Vec::new();
        if only.as_deref() == Some("bare") {
            let out = ceiling_broker(&run, jobs, paced_rate).await;
            let what = "bare broker loop (a)".to_owned();
            let row = Row {
                key: "bare",
                what,
                out,
                workers: 1,
            };
            rounds_out.push((None, vec![row]));
        } else if let Some(tag) = only.as_deref() {
            let (key, mix, workers) = match tag {
                "rej" => ("rej", Mix::Rejected, 1),
                "adm" => ("adm", Mix::Admitted, 1),
                "mix" => ("mix", Mix::Realistic, 1),
                "adm2" => ("adm2", Mix::Admitted, 2),
                "rej2" => ("rej2", Mix::Rejected, 2),
                other => panic!("--only {other}: one of rej, adm, mix, adm2, rej2, bare"),
            };
            let row = scenario(&run, key, mix, jobs, paced_rate, workers, 0).await;
            rounds_out.push((None, vec![row]));
        } else {
            for round in 1..=rounds {
                eprintln!("round {round} of {rounds}: ceilings ({jobs} each)");
                let bare = ceiling_broker(&run, jobs, None).await;
                let (broker, broker_cpu) = (bare.rate(), bare.worker_cpu);
                eprintln!("  (a) bare broker loop: {broker:.0}/s");
                let redis = ceiling_redis(&format!("{}r{round}:", run.prefix), jobs).await;
                eprintln!("  (b) limiter decisions: {redis:.0}/s");
                let smtp = ceiling_smtp(sink.port, jobs).await;
                eprintln!("  (c) SMTP sink: {smtp:.0}/s");
                let ceilings = Ceilings {
                    broker,
                    broker_cpu_per_msg: broker_cpu / jobs as f64,
                    redis,
                    smtp,
                };
                eprintln!("round {round} of {rounds}: scenarios ({jobs} jobs each)");
                let mut rows = Vec::new();
                rows.push(scenario(&run, "rej", Mix::Rejected, jobs, None, 1, round).await);
                rows.push(scenario(&run, "adm", Mix::Admitted, jobs, None, 1, round).await);
                rows.push(scenario(&run, "mix", Mix::Realistic, jobs, None, 1, round).await);
                let half = rows[1].out.rate() / 2.0;
                let paced = (jobs / 4).max(100);
                rows.push(scenario(&run, "half", Mix::Admitted, paced, Some(half), 1, round).await);
                // The same offered load through the bare loop: the latency
                // the broker, the machine and this bench add by themselves.
                let out = ceiling_broker(&run, paced, Some(half)).await;
                eprintln!(
                    "  bare broker loop, offered {half:.0}/s: p99 {:.1} ms",
                    out.pct(0.99)
                );
                rows.push(Row {
                    key: "bare-half",
                    what: format!("bare broker loop (a), offered {half:.0}/s"),
                    out,
                    workers: 1,
                });
                rows.push(scenario(&run, "adm2", Mix::Admitted, jobs, None, 2, round).await);
                rows.push(scenario(&run, "rej2", Mix::Rejected, jobs, None, 2, round).await);
                rounds_out.push((Some(ceilings), rows));
            }
        }
        // The load sweep and its chart, after the rounds: admitted jobs at
        // 10 % to 100 % of the median measured maximum.
        let sweep_points = match rounds_out.first() {
            Some((Some(_), _)) => Some(sweep(&run, &rounds_out, jobs).await),
            _ => None,
        };
        cleanup(&run).await;
        report(jobs, sink.accepted.load(Ordering::Relaxed), &rounds_out);
        if let Some(points) = sweep_points {
            report_sweep(&points, &rounds_out, benching);
        }
    });
}

/// One step of the load sweep: what was offered, and what came of it.
struct Point {
    /// Offered, as a share of the measured maximum, and in jobs/s.
    share: f64,
    offered: f64,
    out: Outcome,
}

/// Admitted jobs (mailed), paced at 10 %, 20 % … 100 % of the median of
/// the rounds' maximum admitted rate ("adm"), one worker, a quarter of the
/// jobs each.
async fn sweep(run: &Run, rounds: &[(Option<Ceilings>, Vec<Row>)], jobs: u64) -> Vec<Point> {
    let mut max: Vec<f64> = (rounds.iter())
        .flat_map(|(_, rows)| rows.iter().filter(|r| r.key == "adm"))
        .map(|r| r.out.rate())
        .collect();
    max.sort_by(f64::total_cmp);
    let max = max.get(max.len() / 2).copied().unwrap_or(100.0);
    let n = (jobs / 4).max(100);
    eprintln!("load sweep: admitted jobs at 10-100 % of {max:.0}/s, {n} each");
    let mut points = Vec::new();
    for step in 1..=10 {
        let share = f64::from(step) / 10.0;
        let offered = max * share;
        let row = scenario(
            run,
            "sweep",
            Mix::Admitted,
            n,
            Some(offered),
            1,
            100 + step as usize,
        )
        .await;
        points.push(Point {
            share,
            offered,
            out: row.out,
        });
    }
    points
}

/// Where the chart goes: `docs/e2e-load.svg` for a real run (BENCHMARKS.md
/// embeds it), a scratch file for the smoke run, so tests never rewrite it.
fn chart_path(benching: bool) -> std::path::PathBuf {
    if benching {
        std::path::PathBuf::from("docs/e2e-load.svg")
    } else {
        std::env::temp_dir().join(format!("mailgate-e2e-load-{}.svg", std::process::id()))
    }
}

/// The sweep as a table, and as a chart: latency against offered load,
/// and throughput against the same run's ceilings.
fn report_sweep(points: &[Point], rounds: &[(Option<Ceilings>, Vec<Row>)], benching: bool) {
    let mut o = std::io::stdout().lock();
    let _ = writeln!(
        o,
        "\nload sweep, admitted jobs, one worker:\n| offered | offered jobs/s | jobs/s | p50 ms | p99 ms |\n|---:|---:|---:|---:|---:|"
    );
    for p in points {
        let _ = writeln!(
            o,
            "| {:.0} % | {:.0} | {:.0} | {:.1} | {:.1} |",
            p.share * 100.0,
            p.offered,
            p.out.rate(),
            p.out.pct(0.5),
            p.out.pct(0.99)
        );
    }
    let median = |f: fn(&Ceilings) -> f64| {
        let mut v: Vec<f64> = rounds
            .iter()
            .filter_map(|(c, _)| c.map(|c| f(&c)))
            .collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    let ceilings = [
        ("(a) bare broker loop", median(|c| c.broker)),
        ("(c) SMTP sink", median(|c| c.smtp)),
    ];
    let path = chart_path(benching);
    match draw_sweep(&path, points, &ceilings) {
        Ok(()) => {
            let _ = writeln!(o, "\nchart: {}", path.display());
        }
        Err(e) => panic!("drawing {}: {e}", path.display()),
    }
    if !benching {
        let _ = std::fs::remove_file(&path);
    }
}

fn draw_sweep(
    path: &std::path::Path,
    points: &[Point],
    ceilings: &[(&str, f64)],
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (1100, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(550);
    let pct = |p: &Point| p.share * 100.0;

    let top = points.iter().map(|p| p.out.pct(0.99)).fold(1.0, f64::max) * 1.1;
    let mut chart = ChartBuilder::on(&left)
        .caption(
            "publish → result latency, admitted jobs",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(52)
        .build_cartesian_2d(0.0..105.0, 0.0..top)?;
    chart
        .configure_mesh()
        .x_desc("offered load, % of the measured maximum")
        .y_desc("ms")
        .draw()?;
    for (name, q, color) in [("p50", 0.5, BLUE), ("p99", 0.99, RED)] {
        chart
            .draw_series(LineSeries::new(
                points.iter().map(|p| (pct(p), p.out.pct(q))),
                color.stroke_width(2),
            ))?
            .label(name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2)));
        chart.draw_series(
            points
                .iter()
                .map(|p| Circle::new((pct(p), p.out.pct(q)), 3, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()?;

    let top = ceilings.iter().map(|c| c.1).fold(
        points.iter().map(|p| p.out.rate()).fold(1.0, f64::max),
        f64::max,
    ) * 1.1;
    let mut chart = ChartBuilder::on(&right)
        .caption("throughput against this run's ceilings", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..105.0, 0.0..top)?;
    chart
        .configure_mesh()
        .x_desc("offered load, % of the measured maximum")
        .y_desc("jobs/s")
        .draw()?;
    chart
        .draw_series(LineSeries::new(
            points.iter().map(|p| (pct(p), p.out.rate())),
            BLUE.stroke_width(2),
        ))?
        .label("jobs/s answered")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], BLUE.stroke_width(2)));
    chart
        .draw_series(LineSeries::new(
            points.iter().map(|p| (pct(p), p.offered)),
            BLACK.mix(0.4).stroke_width(1),
        ))?
        .label("offered")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], BLACK.mix(0.4)));
    for ((name, value), color) in ceilings.iter().zip([GREEN, MAGENTA]) {
        chart
            .draw_series(LineSeries::new(
                [(0.0, *value), (105.0, *value)],
                color.stroke_width(1),
            ))?
            .label(format!("{name}: {value:.0}/s"))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color));
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()?;
    root.present()?;
    Ok(())
}

/// Deletes every queue and key of the run.
async fn cleanup(run: &Run) {
    // The worker's defaults: 4 retry queues, lease waits in bands of
    // 250 ms doubling (a missing queue deletes fine), and the lane of
    // redelivered jobs (it was left behind by every run).
    let topo_queues = ["jobs", "results", "jobs.dead", "jobs.redelivered"]
        .into_iter()
        .map(str::to_owned)
        .chain((1..5).map(|n| format!("jobs.retry.{n}")))
        .chain((0..12).map(|k| format!("jobs.wait.{}", 250_u64 << k)));
    for q in topo_queues {
        let _ = run
            .ch
            .queue_delete(
                format!("{}{q}", run.queues).as_str().into(),
                QueueDeleteOptions::default(),
            )
            .await;
    }
    if let Ok(mut r) = redis::Client::open(redis_url()).and_then(|c| c.get_connection()) {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}*", run.prefix))
            .query(&mut r)
            .unwrap_or_default();
        for chunk in keys.chunks(1000) {
            let _ = redis::cmd("UNLINK").arg(chunk).query::<()>(&mut r);
        }
    }
    let _ = run.conn.close(200, "bye".into()).await;
}

/// `values`' median, min and max, formatted with `fmt`: "m (lo–hi)", or just
/// "m" for one value.
fn spread(mut values: Vec<f64>, fmt: impl Fn(f64) -> String) -> String {
    values.retain(|v| v.is_finite());
    if values.is_empty() {
        return "–".into();
    }
    values.sort_by(f64::total_cmp);
    let median = values[values.len() / 2];
    if values.len() == 1 {
        return fmt(median);
    }
    format!(
        "{} ({}–{})",
        fmt(median),
        fmt(values[0]),
        fmt(values[values.len() - 1])
    )
}

fn report(jobs: u64, mails: u64, rounds: &[(Option<Ceilings>, Vec<Row>)]) {
    let mut o = std::io::stdout().lock();
    let n = rounds.len();
    let ceilings: Vec<Ceilings> = rounds.iter().filter_map(|(c, _)| *c).collect();
    let f0 = |v: f64| format!("{v:.0}");
    let f1 = |v: f64| format!("{v:.1}");
    let f2 = |v: f64| format!("{v:.2}");
    if !ceilings.is_empty() {
        let col = |f: fn(&Ceilings) -> f64| ceilings.iter().map(f).collect::<Vec<_>>();
        let _ = writeln!(
            o,
            "\nceilings ({jobs} messages each; median (min–max) of {} rounds):",
            ceilings.len()
        );
        let _ = writeln!(o, "| ceiling | per second |\n|---|---:|");
        let _ = writeln!(
            o,
            "| (a) bare broker loop (consume → confirmed publish → ack, prefetch {PREFETCH}) | {} |",
            spread(col(|c| c.broker), f0)
        );
        let _ = writeln!(
            o,
            "| (b) limiter decisions, {PREFETCH} concurrent callers | {} |",
            spread(col(|c| c.redis), f0)
        );
        let _ = writeln!(
            o,
            "| (c) SMTP sink through a pool of {POOL} | {} |",
            spread(col(|c| c.smtp), f0)
        );
    }
    let _ = writeln!(
        o,
        "\n| scenario | workers | jobs | jobs/s | vs ceiling | p99 ms | worker CPU µs/job | bare loop CPU µs/msg | by status | p50 ms | worker peak RSS MB | RabbitMQ CPU | Redis CPU | Redis calls/job | Redis bytes/job | Redis keys/job | Redis script µs/job | vs article |"
    );
    let _ = writeln!(
        o,
        "|---|---:|---:|---|---|---|---|---|---|---|---:|---|---|---|---:|---:|---|---|"
    );
    let Some((_, first)) = rounds.first() else {
        return;
    };
    for (i, r0) in first.iter().enumerate() {
        // The same scenario in every round, with that round's ceilings.
        let same: Vec<(Option<Ceilings>, &Row)> = rounds
            .iter()
            .filter_map(|(c, rows)| rows.get(i).map(|r| (*c, r)))
            .collect();
        let per = |f: &dyn Fn(&Row) -> f64| same.iter().map(|(_, r)| f(r)).collect::<Vec<_>>();
        let vs: Vec<f64> = same
            .iter()
            .filter_map(|(c, r)| c.and_then(|c| c.of(r)).map(|ceil| r.out.rate() / ceil))
            .collect();
        let loop_cpu: Vec<f64> = same
            .iter()
            .filter_map(|(c, _)| c.map(|c| c.broker_cpu_per_msg * 1e6))
            .collect();
        let mut statuses: Vec<_> = r0.out.by_status.iter().collect();
        statuses.sort();
        let statuses: Vec<String> = statuses.iter().map(|(s, n)| format!("{s} {n}")).collect();
        let jobs_of = |r: &Row| r.out.jobs.max(1) as f64;
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} | {} | {} | {} | {:.0} | {:.2} | {} | {} |",
            r0.what,
            r0.workers,
            r0.out.jobs,
            spread(per(&|r| r.out.rate()), f0),
            spread(vs, f2),
            spread(per(&|r| r.out.pct(0.99)), f1),
            spread(per(&|r| r.out.worker_cpu * 1e6 / jobs_of(r)), f0),
            spread(loop_cpu, f0),
            statuses.join(", "),
            spread(per(&|r| r.out.pct(0.5)), f1),
            same.iter()
                .map(|(_, r)| r.out.worker_rss_kb)
                .max()
                .unwrap_or(0) as f64
                / 1024.0,
            spread(per(&|r| r.out.rabbit_cpu * 100.0), |v| format!("{v:.0} %")),
            spread(per(&|r| r.out.redis_cpu * 100.0), |v| format!("{v:.0} %")),
            spread(
                per(&|r| (r.out.redis.scripts + r.out.redis.others) as f64 / jobs_of(r)),
                f2
            ),
            r0.out.redis.bytes_in.saturating_add(r0.out.redis.bytes_out) as f64 / jobs_of(r0),
            r0.out.redis_keys as f64 / jobs_of(r0),
            spread(per(&|r| r.out.redis.script_usec as f64 / jobs_of(r)), f1),
            spread(
                per(&|r| r.out.redis.script_usec as f64 / jobs_of(r) / r.out.article_us.max(0.001)),
                f2
            ),
        );
    }
    let _ = writeln!(
        o,
        "\n({n} round(s); figures are median (min–max) over the rounds; by status, bytes and keys are the first round's. \
         vs ceiling: each round's figure against that round's ceiling: rejected scenarios against (a), others against \
         min((a), (c)). CPU per job: user + system seconds of the worker processes (of the bare loop's process for \
         (a)) over the jobs. RabbitMQ and Redis CPU: share of one core while the scenario ran, on {} cores in all. \
         Redis calls: commands clients sent (EVALSHA, EVAL, FCALL, PING, SCRIPT LOAD, FUNCTION LOAD, and EXEC: a snapshot's read; not those run inside scripts or transactions), \
         per job; bytes: in + out; keys: added under the run's prefix, per job. Redis script µs/job: the time Redis \
         spent in mailgate's script and function calls (INFO commandstats usec), per job; vs article: that against one call of \
         article 003's script, timed on the same Redis by 8 clients right before and after the scenario. \
         Peak RSS: the highest of the rounds.) \
         Mails accepted by the sink: {mails}.",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );
}
