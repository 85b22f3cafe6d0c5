//! Replies Redis sent that never arrived, and batches review A broke: each
//! test reproduces a fault found by an adversarial review (its doc says
//! what went wrong before the fix) and checks that the promise now holds,
//! against real services (a private Redis or cluster for anything cut).

use crate::common;

use std::time::{Duration, Instant};

use crate::common::ReplyCutter;
use crate::common::harness::Harness;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use serde_json::{Value, json};

fn forged(ticket: &str, attempt: i64) -> BasicProperties {
    let mut headers = FieldTable::default();
    headers.insert(
        "x-mailgate-ticket".into(),
        AMQPValue::LongString(ticket.into()),
    );
    headers.insert("x-mailgate-attempt".into(), AMQPValue::LongLongInt(attempt));
    BasicProperties::default().with_headers(headers)
}

/// Two messages of one lineage and attempt (a producer that writes
/// mailgate's headers, or one of mailgate's copies delivered twice). Worker
/// B holds the send mark and is mid-SMTP; worker A's admission of the second
/// message finds the lease busy, but its reply is lost. A's lost-reply
/// release, fenced only to (ticket, attempt), gives back B's mark; A's retry
/// then resumes the job and mails it a second time while B's mail is still
/// under way. Now the release is fenced to the handling that set the mark
/// (`JobRef::holder`): one mail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_release_gives_back_only_a_mark_it_set() {
    let redis = common::PrivateRedis::start();
    let cutter = ReplyCutter::start(redis.port);
    let h = Harness::with("lostrelease", |s| {
        s.redis.url = redis.url();
        s.retry.initial = Duration::from_millis(100);
        s.retry.max = Duration::from_millis(200);
        s.smtp.timeout = Duration::from_secs(5);
        s.limits.send_lease = Duration::from_secs(30);
        s.amqp.prefetch = 1;
    })
    .await;
    h.sink.set_delay(Duration::from_millis(3_000));
    // Worker B: straight to Redis, one message at a time.
    let b = h.start_worker().await;
    let body = json!({"id": "twice", "email": "victim@example.com", "code": "493817"}).to_string();
    let ticket = "0123456789abcdef0123456789abcdef";
    h.publish_raw(body.as_bytes(), forged(ticket, 1)).await;
    // Wait until B's SMTP transaction is under way.
    let deadline = Instant::now() + Duration::from_secs(10);
    while h.sink.transactions() == 0 {
        assert!(Instant::now() < deadline, "B never began its send");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Worker A: through the reply cutter.
    let mut sa = h.settings.clone();
    sa.redis.url = format!("redis://127.0.0.1:{}/0", cutter.port);
    let a = mailgate::worker::build(&sa).await.expect("A builds");
    let (stop_a, rx) = tokio::sync::oneshot::channel::<()>();
    let join_a = tokio::spawn(a.run(async {
        let _ = rx.await;
    }));
    tokio::time::sleep(Duration::from_millis(300)).await;
    cutter
        .cut_next
        .store(true, std::sync::atomic::Ordering::SeqCst);
    h.publish_raw(body.as_bytes(), forged(ticket, 1)).await;

    // Collect results for 12 s.
    let q = h.settings.amqp.results_queue.clone();
    let mut statuses = Vec::new();
    while let Some((body, _)) = h.next_on(&q, Duration::from_secs(8)).await {
        let r: Value = serde_json::from_slice(&body).unwrap();
        statuses.push(format!("{}/{}", r["status"], r["attempts"]));
    }
    let mails = h.sink.mails_to("victim@example.com").len();
    eprintln!("results: {statuses:?}; mails to the victim: {mails}");
    let _ = stop_a.send(());
    let _ = join_a.await;
    b.stop().await.unwrap();
    assert_eq!(
        mails, 1,
        "one id mailed {mails} times; results {statuses:?}"
    );
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
        let port = common::free_port();
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

/// Keys spread over the shards (a prefix without a hash tag), one rule of 1
/// mail an hour per mailbox. Job 1's "create" ran, and its reply was lost:
/// the cluster client sends the script again, which now finds the record it
/// made and answers "busy"; the ledger reads that as "another copy won" and
/// gives job 1's reservation back although its record stands. Job 2 (another
/// id, the same mailbox) is then admitted, and job 1's next copy resumes its
/// admission: two sends under a 1-an-hour rule. Now the cluster client never
/// sends a script again (`retries(0)`), and a failed create whose record
/// Redis then shows keeps its reservations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spread_a_lost_create_reply_keeps_the_reservations_of_its_record() {
    use common::*;
    use mailgate::domain::Ticket;
    use mailgate::ledger::{Entry, Ledger, RedisLedger, Verdict};
    use mailgate::limiter::Clock;
    use mailgate::settings::RedisSettings;

    let cluster = CutCluster::start();
    let mut lim = limits(&[(HOUR, 1)], &[]);
    lim.send_lease = Duration::from_secs(2);
    let settings = RedisSettings::new(cluster.url(), "lost:sp:");
    assert!(settings.spreads_keys());
    let l = RedisLedger::connect(&settings, &lim).await.unwrap();
    let mailbox = "victim@example.com";
    let j1 = TestJob::new("j1", mailbox, None);
    let j2 = TestJob::new("j2", mailbox, None);
    let (t1, t2) = (Ticket::new(), Ticket::new());

    cluster.cut_reply_to("$6\r\ncreate\r\n");
    let v1 = l
        .admit(
            &Entry {
                job: j1.by(&t1),
                send_now: false,
                expires_at_ms: None,
                made_at_ms: None,
            },
            Clock::Server,
        )
        .await;
    eprintln!(
        "job 1's admission: {v1:?}; replies cut: {}",
        cluster.cuts.load(std::sync::atomic::Ordering::SeqCst)
    );
    let record = cluster.cli(&["hgetall", "lost:sp:job:j1"]);
    let log = cluster.cli(&["zrange", "lost:sp:email:victim@example.com", "0", "-1"]);
    eprintln!("job 1's record: {record:?}; the mailbox's log: {log:?}");

    let v2 = j2.admit(&l, &t2, Clock::Server).await;
    eprintln!("job 2 (same mailbox, 1 an hour): {v2:?}");
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    // Job 1's next copy (its lease wait comes back): same lineage and attempt.
    let v1b = j1.admit(&l, &t1, Clock::Server).await;
    eprintln!("job 1's copy after the lease: {v1b:?}");
    let log = cluster.cli(&["zrange", "lost:sp:email:victim@example.com", "0", "-1"]);
    eprintln!("the mailbox's log now: {log:?}");
    let sends = [&v2, &v1b]
        .iter()
        .filter(|v| matches!(v, Verdict::Admitted | Verdict::Resumed { .. }))
        .count();
    assert!(
        sends < 2,
        "two jobs own a send to one mailbox under a 1-an-hour rule: {v2:?}, {v1b:?}"
    );
}

/// One slot (a prefix with a hash tag): the reply to an admission that
/// marked its job sending is lost. On one server the worker gets an error
/// and gives the mark back (28acecd); through the cluster client the script
/// runs again, finds its own mark and answers "busy", so the job waits out
/// the lease and is then "delivery unknown", although nothing was sent. Now
/// the worker gets the error, gives the mark back (retrying while the
/// client reconnects), and the retry sends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_a_lost_admission_reply_is_resumed_and_sent() {
    let cluster = CutCluster::start();
    let h = Harness::with("lostclusterlost", |s| {
        s.redis.url = cluster.url();
        s.redis.key_prefix = "{lost}:".into();
        s.retry.initial = Duration::from_millis(100);
        s.retry.max = Duration::from_millis(200);
        s.smtp.timeout = Duration::from_secs(2);
        s.limits.send_lease = Duration::from_secs(7);
    })
    .await;
    let w = h.start_worker().await;
    cluster.cut_reply_to("$5\r\nadmit\r\n");
    let start = Instant::now();
    h.publish(&json!({"id": "lost", "email": "lost@example.com", "code": "1"}))
        .await;
    let q = h.settings.amqp.results_queue.clone();
    let r = h.next_on(&q, Duration::from_secs(20)).await;
    let r: Option<Value> = r.map(|(b, _)| serde_json::from_slice(&b).unwrap());
    eprintln!(
        "after {:?}: {r:?}; mails: {}; replies cut: {}",
        start.elapsed(),
        h.sink.mails_to("lost@example.com").len(),
        cluster.cuts.load(std::sync::atomic::Ordering::SeqCst)
    );
    w.stop().await.unwrap();
    let r = r.expect("a result");
    assert_eq!(r["status"], "sent", "{r}");
    assert_eq!(h.sink.mails_to("lost@example.com").len(), 1);
}

/// The same as `spread_a_lost_create_reply_gives_back_a_standing_reservation`,
/// end to end: a worker on a spread cluster, 1 mail an hour per mailbox, one
/// SMTP connection (busy with another job, so the victim's job is admitted
/// without a send mark), the reply to its "create" lost once. The victim
/// gets two mails within the hour. Now one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spread_worker_mails_nobody_past_a_limit_after_a_lost_create_reply() {
    let cluster = CutCluster::start();
    let h = Harness::with("lostspreadlost", |s| {
        s.redis.url = cluster.url();
        s.redis.key_prefix = "lost:spw:".into();
        s.retry.initial = Duration::from_millis(100);
        s.retry.max = Duration::from_millis(200);
        s.smtp.timeout = Duration::from_secs(3);
        s.smtp.pool_size = 1;
        s.limits.send_lease = Duration::from_secs(8);
        s.limits.email = common::rules(&[(common::HOUR, 1)]);
    })
    .await;
    assert!(h.settings.redis.spreads_keys());
    h.sink.set_delay(Duration::from_millis(1_000));
    let w = h.start_worker().await;
    h.publish(&json!({"id": "other", "email": "other@example.com", "code": "1"}))
        .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while h.sink.transactions() == 0 {
        assert!(
            Instant::now() < deadline,
            "the other job never began its send"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cluster.cut_reply_to("$6\r\ncreate\r\n");
    h.publish(&json!({"id": "v1", "email": "victim@example.com", "code": "1"}))
        .await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    h.publish(&json!({"id": "v2", "email": "victim@example.com", "code": "2"}))
        .await;
    let q = h.settings.amqp.results_queue.clone();
    let mut statuses = Vec::new();
    while let Some((body, _)) = h.next_on(&q, Duration::from_secs(12)).await {
        let r: Value = serde_json::from_slice(&body).unwrap();
        statuses.push(format!("{}:{}", r["id"], r["status"]));
    }
    let mails = h.sink.mails_to("victim@example.com").len();
    eprintln!(
        "results {statuses:?}; mails to the victim (1 an hour): {mails}; replies cut: {}",
        cluster.cuts.load(std::sync::atomic::Ordering::SeqCst)
    );
    w.stop().await.unwrap();
    assert!(
        mails <= 1,
        "{mails} mails under a 1-an-hour rule; {statuses:?}"
    );
}

/// One slot of a cluster, 16 jobs at once (pool 16, so each admission sets
/// the send mark): the reply to one batch that holds several admissions is
/// lost. Every job of that batch is answered "failed, delivery unknown" after
/// the lease, with nothing sent (on one server each would be given back and
/// sent). Now every job of it is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_one_lost_batch_reply_fails_no_job_in_it() {
    let cluster = CutCluster::start();
    let h = Harness::with("lostclusterbatch", |s| {
        s.redis.url = cluster.url();
        s.redis.key_prefix = "{lost}:".into();
        s.retry.initial = Duration::from_millis(100);
        s.retry.max = Duration::from_millis(200);
        s.smtp.timeout = Duration::from_secs(2);
        s.smtp.pool_size = 16;
        s.limits.send_lease = Duration::from_secs(7);
    })
    .await;
    let w = h.start_worker().await;
    cluster.cut_reply_to_batch("$5\r\nadmit\r\n", 3);
    for i in 0..16 {
        h.publish(
            &json!({"id": format!("b{i}"), "email": format!("u{i}@example.com"), "code": "1"}),
        )
        .await;
    }
    let q = h.settings.amqp.results_queue.clone();
    let mut by_status = std::collections::BTreeMap::<String, usize>::new();
    let mut n = 0;
    while let Some((body, _)) = h.next_on(&q, Duration::from_secs(12)).await {
        let r: Value = serde_json::from_slice(&body).unwrap();
        *by_status.entry(r["status"].to_string()).or_default() += 1;
        n += 1;
        if n == 16 {
            break;
        }
    }
    let mails = h.sink.mails().len();
    eprintln!(
        "results by status {by_status:?}; mails: {mails}; replies cut: {}",
        cluster.cuts.load(std::sync::atomic::Ordering::SeqCst)
    );
    w.stop().await.unwrap();
    assert_eq!(mails, 16, "{by_status:?}");
}

/// Spread: the reply to a "reserve" is lost and the cluster client sends it
/// again. The first run's reservation is never given back (the ledger only
/// knows the second's time), and with a rule of 1 an hour the second run
/// finds it: the job waits for "its twin", then is rejected by its own
/// phantom reservation for the whole hour; nothing was ever sent. Now a
/// reserve whose reply was lost is given back by the job's suffix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spread_a_lost_reserve_reply_leaves_no_phantom_reservation() {
    use common::*;
    use mailgate::domain::Ticket;
    use mailgate::ledger::{Entry, Ledger, RedisLedger};
    use mailgate::limiter::Clock;
    use mailgate::settings::RedisSettings;

    let cluster = CutCluster::start();
    let mut lim = limits(&[(HOUR, 1)], &[]);
    lim.send_lease = Duration::from_secs(2);
    let settings = RedisSettings::new(cluster.url(), "lost:sr:");
    let l = RedisLedger::connect(&settings, &lim).await.unwrap();
    let j1 = TestJob::new("j1", "victim@example.com", None);
    let t1 = Ticket::new();
    // Load the scope script first (its source would match the needle too).
    let warm = TestJob::new("warm", "warm@example.com", None);
    let _ = warm.admit(&l, &Ticket::new(), Clock::Server).await;
    cluster.cut_reply_to("$7\r\nreserve\r\n");
    let v1 = l
        .admit(
            &Entry {
                job: j1.by(&t1),
                send_now: false,
                expires_at_ms: None,
                made_at_ms: None,
            },
            Clock::Server,
        )
        .await;
    eprintln!(
        "job 1: {v1:?}; cut {}",
        cluster.cuts.load(std::sync::atomic::Ordering::SeqCst)
    );
    eprintln!(
        "log: {:?}; record: {:?}",
        cluster.cli(&["zrange", "lost:sr:email:victim@example.com", "0", "-1"]),
        cluster.cli(&["hgetall", "lost:sr:job:j1"])
    );
    let mut last = None;
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(600)).await;
        last = Some(j1.admit(&l, &t1, Clock::Server).await);
        eprintln!("job 1 again: {last:?}");
    }
    assert!(
        !matches!(last, Some(mailgate::ledger::Verdict::Rejected { .. })),
        "the job was rejected by its own reservation, never sent: {last:?}"
    );
}

/// Batching: 30 purposes with rules of their own in every scope (settings
/// allow 100). A rule set's index past 78 made the shape's one character
/// past U+007F, two bytes in the script's ARGV, so the script finds that
/// item malformed and fails the whole batch: a job of such a purpose can
/// never be admitted, and every other job whose item shares its batch fails
/// with it. Now a shape names each set in two characters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purpose_past_the_78th_rule_set_is_admitted_in_any_batch() {
    use common::*;
    use mailgate::domain::Ticket;
    use mailgate::ledger::{Entry, Ledger, RedisLedger};
    use mailgate::limiter::Clock;
    use mailgate::settings::{PurposeLimits, RedisSettings};

    let mut lim = limits(&[(HOUR, 5)], &[(HOUR, 50)]);
    lim.domain.rules = rules(&[(HOUR, 500)]).rules;
    for i in 0..30 {
        lim.purpose.insert(
            format!("p{i:02}"),
            PurposeLimits {
                email: Some(rules(&[(HOUR, 3)])),
                ip: Some(rules(&[(HOUR, 30)])),
                domain: Some(rules(&[(HOUR, 300)])),
                supersede: None,
            },
        );
    }
    lim.validate().expect("settings accept 30 purposes");
    let prefix = unique_prefix("lostpurposes");
    let _cleanup = RedisCleanup {
        prefix: prefix.clone(),
    };
    let l = RedisLedger::connect(&RedisSettings::new(redis_url(), prefix), &lim)
        .await
        .unwrap();
    let early = TestJob::new("a", "a@example.com", Some("192.0.2.1")).purpose(Some("p01"));
    let late = TestJob::new("b", "b@example.com", Some("192.0.2.2")).purpose(Some("p29"));
    let plain = TestJob::new("c", "c@example.com", Some("192.0.2.3"));
    let (t1, t2, t3) = (Ticket::new(), Ticket::new(), Ticket::new());
    let entry = |j, t| Entry {
        job: TestJob::by(j, t),
        send_now: false,
        expires_at_ms: None,
        made_at_ms: None,
    };
    let alone_early = l.admit(&entry(&early, &t1), Clock::Server).await;
    eprintln!("purpose p01 alone: {alone_early:?}");
    let alone_late = l.admit(&entry(&late, &t2), Clock::Server).await;
    eprintln!("purpose p29 alone: {alone_late:?}");
    let _ = (&plain, &t3);
    // Under load: 60 jobs of the default purpose at once, and 3 of p29
    // among them (batches form while earlier calls are in flight).
    let mut set = tokio::task::JoinSet::new();
    for i in 0..63usize {
        let l = l.clone();
        set.spawn(async move {
            let late = i % 21 == 10;
            let j = if late {
                TestJob::new(
                    &format!("l{i}"),
                    &format!("l{i}@example.com"),
                    Some("192.0.2.8"),
                )
                .purpose(Some("p29"))
            } else {
                TestJob::new(
                    &format!("d{i}"),
                    &format!("d{i}@example.com"),
                    Some("192.0.2.9"),
                )
            };
            let t = Ticket::new();
            let e = Entry {
                job: j.by(&t),
                send_now: false,
                expires_at_ms: None,
                made_at_ms: None,
            };
            (late, l.admit(&e, Clock::Server).await.is_err())
        });
    }
    let mut failed_default = 0;
    while let Some(Ok((late, failed))) = set.join_next().await {
        if !late && failed {
            failed_default += 1;
        }
    }
    eprintln!(
        "under load: {failed_default} of 60 default-purpose admissions failed with the p29 items in their batch"
    );
    assert!(
        alone_late.is_ok(),
        "a job of purpose p29 is never admitted: {alone_late:?}"
    );
    assert_eq!(failed_default, 0, "default-purpose jobs fail with it");
}
