//! Limiter throughput: admissions decided per second with 64 concurrent
//! callers against a local Redis (the production path: the ledger's script,
//! which looks up the job's record, runs the limiter's decision and writes
//! the record), next to the baseline measured in the same run: the
//! single-key ZSET script of article 003 (its nil crash minimally fixed).
//!
//!     cargo bench --bench limiter
//!
//! Environment: `BENCH_REDIS_URL` (default `redis://127.0.0.1:6379/0`),
//! `BENCH_SECS` per round (default 3), `BENCH_ROUNDS` (default 5). Rounds
//! alternate between the two scripts and the median is reported, so a noisy
//! neighbour hurts both alike. Keys live under a unique prefix and are
//! deleted at the end.
//!
//! Then the cost of `redis.min_replicas_acked = 1`: admissions that set the
//! send mark (as when an SMTP connection is free), one caller at a time
//! (latency) and 64 at once (throughput), with and without the `WAIT`, on a
//! primary and a replica the bench starts on free ports (`redis-server`
//! must be installed), rounds alternating.
//!
//! And mailgate's decisions on a three-primary Redis Cluster the bench
//! starts, with every key in one slot and with the keys spread over the
//! shards, against a standalone server it starts, rounds alternating.

// A benchmark's scenario reads top to bottom; the house's 80-line limit
// is for the code under test.
#![allow(clippy::too_many_lines)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mailgate::domain::{EmailAddress, IpKey, JobId, Ticket};
use mailgate::ledger::{Entry, JobRef, Ledger, RedisLedger, Verdict};
use mailgate::limiter::overrides::{Action, Override, Target};
use mailgate::limiter::{Clock, Request};
use mailgate::settings::{LimitSettings, RedisSettings};
use redis::aio::ConnectionManager;

/// The allocator the mailgate binary uses, so the client side costs what it
/// costs in production.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const CALLERS: usize = 64;
const MAILBOXES: u64 = 10_000;
const NETWORKS: u64 = 1_000;
/// The mailboxes' registrable domains (`d<n>.example`), for the domain
/// scope.
const DOMAINS: u64 = 1_000;

/// The default rules and the shipped config's domain scope (50 per 10
/// minutes, a network's share a fifth of that), as deployed.
fn with_domain_scope() -> LimitSettings {
    LimitSettings {
        domain: mailgate::settings::DomainRules {
            rules: vec![mailgate::settings::Rule::new(Duration::from_secs(600), 50)],
            exempt: Vec::new(),
            ..Default::default()
        },
        ..LimitSettings::default()
    }
}

/// 1 000 overrides, as a busy support team might hold: 400 QA mailboxes
/// allowed, 300 networks and 200 domains with rules of their own, none of
/// which the workload sends to; and 100 of the workload's networks (one
/// in ten) with rules of their own, the defaults again, so the decisions
/// stay those of the plain arm while batches carry override sets.
fn thousand_overrides() -> Vec<Override> {
    let now = mailgate::domain::now_ms();
    let ov = |target: String, action: Action| Override {
        target: Target::parse(&target).expect("target"),
        action,
        reason: "bench".into(),
        expires_at_ms: None,
        added_at_ms: now,
    };
    let rules = |rs: &[(u64, u32)]| {
        Action::Rules(
            rs.iter()
                .map(|&(s, n)| mailgate::settings::Rule::new(Duration::from_secs(s), n))
                .collect(),
        )
    };
    let mut all = Vec::with_capacity(1000);
    all.extend((0..400).map(|i| ov(format!("email:qa{i}@qa.example"), Action::Allow)));
    all.extend((0..300).map(|i| {
        ov(
            format!("ip:172.{}.{}.0/24", 16 + i / 250, i % 250),
            rules(&[(3600, 500)]),
        )
    }));
    all.extend((0..200).map(|i| ov(format!("domain:o{i}.example"), rules(&[(600, 5)]))));
    // The workload's networks 10.<i/250>.<i%250>.1: one in ten.
    all.extend((0..100).map(|k| {
        let i = k * 10;
        let net = format!("ip:10.{}.{}.0/24", i / 250, i % 250);
        ov(net, rules(&[(60, 5), (600, 30), (3600, 50)]))
    }));
    all
}

/// Article 003's script as published, except `oldestTimestamp` is checked for
/// nil (the published version fails on a key's first request).
const ARTICLE_SCRIPT: &str = include_str!("article.lua");

/// A tiny deterministic generator, so both contenders see the same key mix.
struct XorShift(u64);
impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[derive(Default)]
struct Tally {
    decisions: AtomicU64,
    admitted: AtomicU64,
}

/// Mailboxes and networks, parsed once: the worker parses a job at the edge,
/// so parsing is not part of a limiter decision.
struct Pool {
    emails: Vec<EmailAddress>,
    ips: Vec<IpKey>,
}

impl Pool {
    fn new() -> Self {
        Self {
            emails: (0..MAILBOXES)
                .map(|i| {
                    EmailAddress::parse(&format!("user{i}@d{}.example", i % DOMAINS))
                        .expect("email")
                })
                .collect(),
            ips: (0..NETWORKS)
                .map(|i| IpKey::parse(&format!("10.{}.{}.1", i / 250, i % 250)).expect("ip"))
                .collect(),
        }
    }
}

async fn round_mailgate(
    l: &RedisLedger,
    pool: &Arc<Pool>,
    run: u64,
    secs: f64,
    conns: &[ConnectionManager],
) -> Round {
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for caller in 0..CALLERS as u64 {
        let (l, tally, stop, pool) = (l.clone(), tally.clone(), stop.clone(), pool.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = XorShift(0x9E37_79B9_7F4A_7C15 ^ (caller + 1));
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let id = JobId::parse(&format!("r{run}-c{caller}-{n}")).expect("id");
                let email = &pool.emails[(rng.next() % MAILBOXES) as usize];
                let ip = &pool.ips[(rng.next() % NETWORKS) as usize];
                let req = Request {
                    id: &id,
                    email,
                    ip: Some(ip),
                    purpose: None,
                    session: None,
                    known_mailbox: false,
                };
                // A new message each time: its own lineage.
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
                let d = l.admit(&entry, Clock::Server).await.expect("decision");
                tally.decisions.fetch_add(1, Ordering::Relaxed);
                if d.verdict == Verdict::Admitted {
                    tally.admitted.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    finish(tasks, stop, &tally, secs, conns).await
}

async fn round_article(conn: &ConnectionManager, prefix: &str, secs: f64) -> Round {
    let script = Arc::new(redis::Script::new(ARTICLE_SCRIPT));
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for caller in 0..CALLERS as u64 {
        let (mut conn, script, tally, stop) =
            (conn.clone(), script.clone(), tally.clone(), stop.clone());
        let prefix = prefix.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut rng = XorShift(0x9E37_79B9_7F4A_7C15 ^ (caller + 1));
            while !stop.load(Ordering::Relaxed) {
                let key = format!("{prefix}article:user{}@example.com", rng.next() % MAILBOXES);
                let _ip = rng.next(); // same draws as the mailgate round
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .expect("clock")
                    .as_millis() as u64;
                let ok: i64 = script
                    .key(key)
                    .arg(5)
                    .arg(10)
                    .arg(now - 86_400_000)
                    .arg(now)
                    .invoke_async(&mut conn)
                    .await
                    .expect("article script");
                tally.decisions.fetch_add(1, Ordering::Relaxed);
                if ok == 1 {
                    tally.admitted.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    finish(tasks, stop, &tally, secs, std::slice::from_ref(conn)).await
}

/// One contender's round: decisions/s, the admitted share, Redis CPU
/// microseconds per decision (from `INFO cpu`, user + system), and Redis
/// commands per decision (`INFO stats`; a script call is one).
struct Round {
    rate: f64,
    admitted: f64,
    redis_us: f64,
    calls: f64,
}

/// The CPU seconds the Redis servers behind `conns` used so far, and the
/// commands they processed.
async fn redis_cpu(conns: &[ConnectionManager]) -> (f64, f64) {
    let (mut cpu, mut commands) = (0.0, 0.0);
    for conn in conns {
        let info: String = redis::cmd("INFO")
            .arg("all")
            .query_async(&mut conn.clone())
            .await
            .expect("INFO");
        let field = |names: &[&str]| -> f64 {
            info.lines()
                .filter_map(|l| l.split_once(':'))
                .filter(|(k, _)| names.contains(k))
                .filter_map(|(_, v)| v.trim().parse::<f64>().ok())
                .sum()
        };
        cpu += field(&["used_cpu_user", "used_cpu_sys"]);
        commands += field(&["total_commands_processed"]);
    }
    (cpu, commands)
}

async fn finish(
    tasks: Vec<tokio::task::JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    tally: &Tally,
    secs: f64,
    conns: &[ConnectionManager],
) -> Round {
    let (cpu0, commands0) = redis_cpu(conns).await;
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("caller");
    }
    let elapsed = start.elapsed().as_secs_f64();
    let (cpu1, commands1) = redis_cpu(conns).await;
    let d = tally.decisions.load(Ordering::Relaxed) as f64;
    let a = tally.admitted.load(Ordering::Relaxed) as f64;
    Round {
        rate: d / elapsed,
        admitted: a / d.max(1.0),
        redis_us: (cpu1 - cpu0) * 1e6 / d.max(1.0),
        calls: (commands1 - commands0) / d.max(1.0),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn cleanup(url: &str, prefix: &str) {
    let Ok(mut conn) = redis::Client::open(url).and_then(|c| c.get_connection()) else {
        return;
    };
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query(&mut conn)
            .unwrap_or((0, Vec::new()));
        if !keys.is_empty() {
            let _: Result<(), _> = redis::cmd("UNLINK").arg(&keys).query(&mut conn);
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
}

fn main() {
    // `cargo test --benches` runs bench targets with no `--bench` flag: do a
    // token run then, so the target stays compiled and working.
    let benching = std::env::args().any(|a| a == "--bench");
    let url: String = env_or("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0".to_owned());
    let secs: f64 = if benching {
        env_or("BENCH_SECS", 3.0)
    } else {
        0.2
    };
    let rounds: usize = if benching {
        env_or("BENCH_ROUNDS", 5)
    } else {
        1
    };
    let prefix = format!("mgbench:{}:", std::process::id());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (ours, with_domain, with_overrides, theirs) = rt.block_on(async {
        let pool = Arc::new(Pool::new());
        let (mut ours, mut with_domain, mut with_overrides, mut theirs) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for run in 0..rounds {
            // Each round starts from empty key spaces, so every round sees the same mix.
            let round_prefix = format!("{prefix}{run}:");
            let settings = RedisSettings {
                allow_eviction: true,
                ..RedisSettings::new(url.clone(), round_prefix.clone())
            };
            let ledger = RedisLedger::connect(&settings, &LimitSettings::default())
                .await
                .expect("Redis must answer at BENCH_REDIS_URL");
            let conn = ConnectionManager::new(redis::Client::open(url.as_str()).expect("url"))
                .await
                .expect("Redis must answer at BENCH_REDIS_URL");
            let ours_round = round_mailgate(
                &ledger,
                &pool,
                run as u64,
                secs,
                std::slice::from_ref(&conn),
            )
            .await;
            let theirs_round = round_article(&conn, &round_prefix, secs).await;
            let domain_settings = RedisSettings::new(url.clone(), format!("{round_prefix}d:"));
            let domain_ledger = RedisLedger::connect(&domain_settings, &with_domain_scope())
                .await
                .expect("Redis must answer at BENCH_REDIS_URL");
            let domain_round = round_mailgate(
                &domain_ledger,
                &pool,
                run as u64,
                secs,
                std::slice::from_ref(&conn),
            )
            .await;
            let ov_settings = RedisSettings::new(url.clone(), format!("{round_prefix}o:"));
            let ov_ledger = RedisLedger::connect(&ov_settings, &LimitSettings::default())
                .await
                .expect("Redis must answer at BENCH_REDIS_URL");
            (ov_ledger.overrides().add_all(&thousand_overrides()))
                .await
                .expect("overrides");
            ov_ledger.overrides().reload().await.expect("overrides");
            let ov_round = round_mailgate(
                &ov_ledger,
                &pool,
                run as u64,
                secs,
                std::slice::from_ref(&conn),
            )
            .await;
            eprintln!(
                "round {}: mailgate {:.0}/s ({:.1} us Redis CPU each), with the domain scope \
                 {:.0}/s ({:.1} us), with 1000 overrides {:.0}/s ({:.1} us), article {:.0}/s \
                 ({:.1} us)",
                run + 1,
                ours_round.rate,
                ours_round.redis_us,
                domain_round.rate,
                domain_round.redis_us,
                ov_round.rate,
                ov_round.redis_us,
                theirs_round.rate,
                theirs_round.redis_us
            );
            ours.push(ours_round);
            with_domain.push(domain_round);
            with_overrides.push(ov_round);
            theirs.push(theirs_round);
        }
        (ours, with_domain, with_overrides, theirs)
    });
    cleanup(&url, &prefix);
    let med = |rs: &[Round], f: fn(&Round) -> f64| median(rs.iter().map(f).collect());
    // Each round's ratio is taken against the baseline measured right after
    // it, so slow phases of a noisy machine cancel out.
    let ratio_of = |rs: &[Round]| {
        median(
            rs.iter()
                .zip(&theirs)
                .map(|(o, t)| o.rate / t.rate)
                .collect(),
        )
    };
    let (ratio, domain_ratio) = (ratio_of(&ours), ratio_of(&with_domain));
    let overrides_ratio = ratio_of(&with_overrides);
    println!();
    println!(
        "limiter decisions/s, {CALLERS} concurrent callers, {rounds} rounds of {secs}s, medians"
    );
    println!("| script | checks | decisions/s | Redis CPU per decision | admitted | ratio |");
    println!("|---|---|---:|---:|---:|---:|");
    println!(
        "| article 003 (nil fixed) | 1 key × 3 rules, no dedup | {:.0} | {:.1} µs | {:.1} % | 1.00 |",
        med(&theirs, |r| r.rate),
        med(&theirs, |r| r.redis_us),
        med(&theirs, |r| r.admitted) * 100.0,
    );
    println!(
        "| mailgate admission (ledger.lua) | job record + 2 scopes × 3 rules | {:.0} | {:.1} µs | {:.1} % | {ratio:.2} |",
        med(&ours, |r| r.rate),
        med(&ours, |r| r.redis_us),
        med(&ours, |r| r.admitted) * 100.0,
    );
    println!(
        "| mailgate admission, with the domain scope (shipped config) | job record + 2 scopes × 3 rules + domain × 1 | {:.0} | {:.1} µs | {:.1} % | {domain_ratio:.2} |",
        med(&with_domain, |r| r.rate),
        med(&with_domain, |r| r.redis_us),
        med(&with_domain, |r| r.admitted) * 100.0,
    );
    println!(
        "| mailgate admission, 1 000 overrides loaded | as the first mailgate row; one network in ten judged by an override's rules | {:.0} | {:.1} µs | {:.1} % | {overrides_ratio:.2} |",
        med(&with_overrides, |r| r.rate),
        med(&with_overrides, |r| r.redis_us),
        med(&with_overrides, |r| r.admitted) * 100.0,
    );
    println!("(ratio: median over rounds of mailgate / article decisions/s in the same round)");
    rt.block_on(replica_rounds(secs, rounds));
    rt.block_on(cluster_rounds(secs, rounds));
}

/// mailgate's decisions on a three-primary Redis Cluster the bench starts
/// (every key in the one slot of the prefix's hash tag, then spread over the
/// shards) against a standalone server it starts too, rounds alternating.
async fn cluster_rounds(secs: f64, rounds: usize) {
    let standalone = Server::start(&[]);
    let nodes: Vec<Server> = (0..3)
        .map(|_| {
            Server::start(&[
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "mgbench-nodes-{port}.conf",
            ])
        })
        .collect();
    let addrs: Vec<String> = nodes.iter().map(|n| format!("127.0.0.1:{}", n.1)).collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    let manager = |url: String| async move {
        loop {
            match redis::Client::open(url.as_str()) {
                Ok(c) => match ConnectionManager::new(c).await {
                    Ok(m) => return m,
                    Err(_) if Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(50)).await
                    }
                    Err(e) => panic!("the bench's server at {url}: {e}"),
                },
                Err(e) => panic!("{url}: {e}"),
            }
        }
    };
    let mut node_conns = Vec::new();
    for n in &nodes {
        node_conns.push(manager(n.url()).await);
    }
    let single = [manager(standalone.url()).await];
    let created = std::process::Command::new("redis-cli")
        .args(["--cluster", "create"])
        .args(&addrs)
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .stdout(std::process::Stdio::null())
        .status()
        .expect("redis-cli runs");
    assert!(created.success(), "redis-cli --cluster create");
    let cluster_url = format!("redis+cluster://{}", addrs.join(","));
    let pool = Arc::new(Pool::new());
    let (mut on_one, mut on_cluster, mut spread) = (Vec::new(), Vec::new(), Vec::new());
    for run in 0..rounds {
        for (url, conns, prefix, out) in [
            (standalone.url(), &single[..], "{mgbench}", &mut on_one),
            (
                cluster_url.clone(),
                &node_conns[..],
                "{mgbench}",
                &mut on_cluster,
            ),
            // No hash tag: the keys spread over the shards.
            (cluster_url.clone(), &node_conns[..], "mgbench", &mut spread),
        ] {
            let settings = RedisSettings {
                allow_eviction: true,
                ..RedisSettings::new(url, format!("{prefix}:{run}:"))
            };
            // The cluster may take a moment to agree on its slots.
            let ledger = loop {
                match RedisLedger::connect(&settings, &LimitSettings::default()).await {
                    Ok(l) if l.health().await.is_ok() => break l,
                    _ if Instant::now() < deadline + Duration::from_secs(20) => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Err(e) => panic!("{e}"),
                    Ok(l) => panic!("{:?}", l.health().await),
                }
            };
            out.push(round_mailgate(&ledger, &pool, 1000 + run as u64, secs, conns).await);
        }
        eprintln!(
            "round {}: standalone {:.0}/s, cluster {:.0}/s, spread {:.0}/s",
            run + 1,
            on_one[run].rate,
            on_cluster[run].rate,
            spread[run].rate
        );
    }
    let ratio = |of: &[Round]| {
        median(
            of.iter()
                .zip(&on_one)
                .map(|(c, o)| c.rate / o.rate)
                .collect(),
        )
    };
    let med = |rs: &[Round], f: fn(&Round) -> f64| median(rs.iter().map(f).collect());
    println!();
    println!(
        "mailgate admissions, {CALLERS} concurrent callers, on servers the bench starts, {rounds} rounds of {secs}s, medians"
    );
    println!(
        "| Redis | decisions/s | admitted | Redis commands per decision | Redis CPU per decision | ratio |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, rs, ratio) in [
        ("standalone", &on_one, 1.0),
        (
            "cluster of 3 primaries, one slot",
            &on_cluster,
            ratio(&on_cluster),
        ),
        (
            "cluster of 3 primaries, keys spread",
            &spread,
            ratio(&spread),
        ),
    ] {
        println!(
            "| {name} | {:.0} | {:.1} % | {:.2} | {:.1} µs | {ratio:.2} |",
            med(rs, |r| r.rate),
            med(rs, |r| r.admitted) * 100.0,
            med(rs, |r| r.calls),
            med(rs, |r| r.redis_us)
        );
    }
}

/// A `redis-server` of the bench's own (`{port}` in an argument becomes its
/// port), killed, and its files removed, when dropped.
struct Server(std::process::Child, u16);

impl Server {
    fn start(args: &[&str]) -> Self {
        // At most 55 535: a cluster node's bus port is 10 000 higher, and
        // redis-server refuses a port that leaves it none.
        let port = std::iter::repeat_with(|| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port()
        })
        .find(|port| *port <= 55_535)
        .expect("the draws never end");
        let child = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(std::env::temp_dir())
            // A replica's synced data goes to a file of its own, which no
            // later server loads.
            .args(["--dbfilename", &format!("mgbench-{port}.rdb")])
            .args(args.iter().map(|a| a.replace("{port}", &port.to_string())))
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server is installed");
        Self(child, port)
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.1)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        for file in [
            format!("mgbench-nodes-{}.conf", self.1),
            format!("mgbench-{}.rdb", self.1),
        ] {
            let _ = std::fs::remove_file(std::env::temp_dir().join(file));
        }
    }
}

/// One send-mark round: per-call latencies of one caller (µs, sorted), and
/// the rate of 64 callers.
struct MarkRound {
    latencies: Vec<f64>,
    rate: f64,
}

async fn send_marks(l: &RedisLedger, pool: &Arc<Pool>, tag: &str, secs: f64) -> MarkRound {
    let admit = |l: RedisLedger, pool: Arc<Pool>, id: String, i: u64| async move {
        let id = JobId::parse(&id).expect("id");
        let ticket = Ticket::new();
        let entry = Entry {
            job: JobRef {
                request: Request {
                    id: &id,
                    email: &pool.emails[(i % MAILBOXES) as usize],
                    ip: Some(&pool.ips[(i % NETWORKS) as usize]),
                    purpose: None,
                    session: None,
                    known_mailbox: false,
                },
                ticket: &ticket,
                attempt: 1,
                holder: 1,
            },
            expires_at_ms: None,
            made_at_ms: None,
        };
        l.admit(&entry, Clock::Server).await.expect("admission");
    };
    let mut latencies = Vec::new();
    let until = Instant::now() + Duration::from_secs_f64(secs);
    while Instant::now() < until {
        let n = latencies.len() as u64;
        let t = Instant::now();
        admit(l.clone(), pool.clone(), format!("{tag}-s{n}"), n).await;
        latencies.push(t.elapsed().as_secs_f64() * 1e6);
    }
    latencies.sort_by(|a, b| a.total_cmp(b));
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..CALLERS as u64)
        .map(|c| {
            let (l, pool, done, stop) = (l.clone(), pool.clone(), done.clone(), stop.clone());
            let tag = tag.to_owned();
            tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    admit(
                        l.clone(),
                        pool.clone(),
                        format!("{tag}-c{c}-{n}"),
                        c * 7919 + n,
                    )
                    .await;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("caller");
    }
    MarkRound {
        latencies,
        rate: done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64(),
    }
}

async fn replica_rounds(secs: f64, rounds: usize) {
    let primary = Server::start(&[]);
    let _replica = Server::start(&["--replicaof", "127.0.0.1", &primary.1.to_string()]);
    let pool = Arc::new(Pool::new());
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut results: [Vec<MarkRound>; 2] = [Vec::new(), Vec::new()];
    for run in 0..rounds {
        for wait in [0u32, 1] {
            let settings = RedisSettings {
                allow_eviction: true,
                min_replicas_acked: wait,
                ..RedisSettings::new(primary.url(), format!("mgbench:{run}:{wait}:"))
            };
            // The primary, then its replica's first sync, may take a moment.
            let ledger = loop {
                match RedisLedger::connect(&settings, &LimitSettings::default()).await {
                    Ok(l) if l.health().await.is_ok() => break l,
                    _ if Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Err(e) => panic!("the bench's primary: {e}"),
                    Ok(l) => panic!("the bench's replica: {:?}", l.health().await),
                }
            };
            let round = send_marks(&ledger, &pool, &format!("r{run}w{wait}"), secs).await;
            eprintln!(
                "round {}: min_replicas_acked = {wait}: one caller p50 {:.0} us, 64 callers {:.0}/s",
                run + 1,
                round.latencies[round.latencies.len() / 2],
                round.rate
            );
            results[wait as usize].push(round);
        }
    }
    let pct = |r: &MarkRound, p: f64| r.latencies[((r.latencies.len() - 1) as f64 * p) as usize];
    println!();
    println!(
        "admissions that set the send mark, a primary and one replica on this machine, {rounds} rounds of {secs}s each, medians"
    );
    println!("| redis.min_replicas_acked | one caller p50 | one caller p99 | 64 callers |");
    println!("|---|---:|---:|---:|");
    for (wait, rs) in results.iter().enumerate() {
        println!(
            "| {wait} | {:.0} µs | {:.0} µs | {:.0}/s |",
            median(rs.iter().map(|r| pct(r, 0.5)).collect()),
            median(rs.iter().map(|r| pct(r, 0.99)).collect()),
            median(rs.iter().map(|r| r.rate).collect()),
        );
    }
}
