//! The Redis ledger beyond the shared semantics: concurrency against the
//! real server, Redis time, TTLs on every key, nothing left by rejections,
//! bytes per admission, a Redis that evicts, malformed calls, and the
//! NOSCRIPT fallback. Also the in-memory ledger's memory bound.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::common::*;
use mailgate::domain::{RegistrableDomain, Ticket};
use mailgate::ledger::{
    Admission, Backend, Ending, Entry, Ledger, LedgerError, MemoryLedger, RedisLedger, Refund,
    Verdict,
};
use mailgate::limiter::{Clock, Quotas, Scope, Subject};
use mailgate::settings::{LimitSettings, RedisSettings};

/// Two mailboxes at each of two registrable domains (`DOMAINS[e / 2]`).
const EMAILS: [&str; 4] = [
    "a@example.com",
    "b@mail.example.com",
    "c@example.org",
    "d@example.org",
];
const DOMAINS: [&str; 2] = ["example.com", "example.org"];
const IPS: [&str; 2] = ["198.51.100.1", "2001:db8::1"];

/// One decision of [`hammer`]'s: the admission, and the indexes of its
/// mailbox and address.
type Decided = (Admission, usize, usize);

/// 64 tasks hammer a few keys with real Redis time: every decision.
async fn hammer<L: Ledger + Clone + 'static>(l: &L, tag: &str) -> Vec<Decided> {
    let decided = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for task in 0..64 {
        let (l, decided, tag) = (l.clone(), decided.clone(), tag.to_owned());
        tasks.push(tokio::spawn(async move {
            for i in 0..60 {
                let n = task * 1000 + i;
                let (e, a) = (n % EMAILS.len(), (n / 7) % IPS.len());
                let job = TestJob::new(&format!("{tag}-{n}"), EMAILS[e], Some(IPS[a]));
                let d = job.admission(&l, &Ticket::new(), Clock::Server).await;
                decided.lock().unwrap().push((d, e, a));
                if i % 5 == 0 {
                    tokio::time::sleep(Duration::from_millis(3)).await;
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    std::mem::take(&mut *decided.lock().unwrap())
}

/// No window of `rules` holds more than its max of the admission `times`
/// (ascending or not) of one key.
fn within(rules: &[mailgate::settings::Rule], times: &[u64]) {
    for &t in times {
        for r in rules {
            let w = r.window_ms();
            let n = times.iter().filter(|&&x| x + w > t && x <= t).count();
            assert!(
                n <= r.max as usize,
                "{n} admissions in a {w}ms window (max {})",
                r.max
            );
        }
    }
}

/// After [`hammer`], no window of any rule holds more admissions than the
/// rule allows (by the times the ledger answered).
async fn never_over_limit<L: Ledger + Clone + 'static>(l: L, limits: LimitSettings, tag: &str) {
    let admitted: Vec<Decided> = hammer(&l, tag)
        .await
        .into_iter()
        .filter(|(d, ..)| d.verdict == Verdict::Admitted)
        .collect();
    assert!(
        admitted.len() >= 2,
        "some requests were admitted: {}",
        admitted.len()
    );
    for key in 0..EMAILS.len() {
        let times = |of: &dyn Fn(&Decided) -> usize| -> Vec<u64> {
            admitted
                .iter()
                .filter(|x| of(x) == key)
                .map(|x| x.0.decided_at_ms)
                .collect()
        };
        within(&limits.email.rules, &times(&|x| x.1));
        within(&limits.ip.rules, &times(&|x| x.2));
        within(&limits.domain.rules, &times(&|x| x.1 / 2));
    }
}

fn tight_limits() -> LimitSettings {
    LimitSettings {
        domain: mailgate::settings::DomainRules {
            rules: rules(&[(100, 3), (400, 7)]).rules,
            exempt: Vec::new(),
            ..Default::default()
        },
        ..limits(&[(50, 1), (300, 3)], &[(40, 2), (250, 6)])
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_never_exceed_a_rule() {
    let prefix = unique_prefix("concurrency");
    let _cleanup = RedisCleanup {
        prefix: prefix.clone(),
    };
    let l = RedisLedger::connect(&redis_settings(&prefix), &tight_limits())
        .await
        .unwrap();
    never_over_limit(l, tight_limits(), "r").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_on_a_cluster_never_exceed_a_rule() {
    let _cluster = PrivateCluster::start();
    let l = ClusterBackend.make("concurrency", tight_limits()).await;
    never_over_limit(l.ledger, tight_limits(), "c").await;
}

/// The 64 tasks on a cluster with the keys spread over its shards: each
/// admission reserves in both scopes, and a scope that rejects makes the
/// other give its reservation back. Read from the scope logs themselves: no
/// window holds more than its rule allows, every admission is in its logs
/// once and nothing else is (no reservation left behind). Prints how many
/// rejections were spurious: the logs as they ended had room for them (a
/// reservation later given back was counted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_on_a_spread_cluster_never_exceed_a_rule() {
    let cluster = PrivateCluster::start();
    let lim = tight_limits();
    let l = SpreadBackend.make("concurrency-spread", lim.clone()).await;
    let decided = hammer(&l.ledger, "s").await;
    let node = format!("redis://127.0.0.1:{}/", cluster.ports[0]);
    let mut conn = redis::cluster::ClusterClient::new(vec![node])
        .and_then(|c| c.get_connection())
        .expect("a connection to the cluster");
    // Each scope key's log: its admission times.
    let mut log = |subject: Subject<'_>| -> Vec<u64> {
        let key = futures_lite::future::block_on(l.ledger.usage(subject, None, Clock::Server))
            .expect("the key's name")
            .key;
        let text: Option<Vec<u8>> = redis::cmd("GET")
            .arg(&key)
            .query(&mut conn)
            .expect("the log");
        times_of(&text.unwrap_or_default())
    };
    let emails: Vec<Vec<u64>> = EMAILS
        .iter()
        .map(|e| log(Subject::Email(&email(e))))
        .collect();
    let ips: Vec<Vec<u64>> = IPS.iter().map(|a| log(Subject::Ip(&ip(a)))).collect();
    let domains: Vec<Vec<u64>> = DOMAINS
        .iter()
        .map(|d| log(Subject::Domain(&RegistrableDomain::parse(d).unwrap())))
        .collect();
    let admitted = |of: &dyn Fn(&Decided) -> bool| {
        decided
            .iter()
            .filter(|x| x.0.verdict == Verdict::Admitted && of(x))
            .count()
    };
    for (e, times) in emails.iter().enumerate() {
        assert_eq!(times.len(), admitted(&|x| x.1 == e), "{}'s log", EMAILS[e]);
        within(&lim.email.rules, times);
    }
    for (a, times) in ips.iter().enumerate() {
        assert_eq!(times.len(), admitted(&|x| x.2 == a), "{}'s log", IPS[a]);
        within(&lim.ip.rules, times);
    }
    for (d, times) in domains.iter().enumerate() {
        assert_eq!(
            times.len(),
            admitted(&|x| x.1 / 2 == d),
            "{}'s log",
            DOMAINS[d]
        );
        within(&lim.domain.rules, times);
    }
    let (mut rejected, mut spurious) = (0, 0);
    for (d, e, a) in &decided {
        let Verdict::Rejected { rule, .. } = d.verdict else {
            continue;
        };
        rejected += 1;
        let times = match rule.scope {
            Scope::Email => &emails[*e],
            Scope::Ip => &ips[*a],
            Scope::Domain => &domains[*e / 2],
        };
        let t = d.decided_at_ms;
        let kept = times
            .iter()
            .filter(|&&x| x + rule.window_ms > t && x <= t)
            .count();
        if kept < rule.max as usize {
            spurious += 1;
        }
    }
    println!(
        "spread over shards: {} decisions, {} admitted, {rejected} rejected, of which \
         {spurious} spurious ({:.1} %)",
        decided.len(),
        admitted(&|_| true),
        100.0 * f64::from(spurious) / f64::from(rejected.max(1))
    );
    assert!(admitted(&|_| true) >= 2, "some requests were admitted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_backend_concurrent_callers_never_exceed_a_rule() {
    never_over_limit(MemoryLedger::new(&tight_limits()), tight_limits(), "m").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_in_one_instant_admits_exactly_max() {
    let prefix = unique_prefix("burst");
    let _cleanup = RedisCleanup {
        prefix: prefix.clone(),
    };
    let lim = limits(&[(MIN, 3)], &[]);
    let l = RedisLedger::connect(&redis_settings(&prefix), &lim)
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for n in 0..64 {
        let l = l.clone();
        tasks.push(tokio::spawn(async move {
            TestJob::new(&format!("b{n}"), "victim@example.com", None)
                .admit(&l, &Ticket::new(), Clock::At(5_000))
                .await
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        match t.await.unwrap() {
            Verdict::Admitted => admitted += 1,
            Verdict::Rejected { retry_after_ms, .. } => assert_eq!(retry_after_ms, MIN),
            v => panic!("{v:?}"),
        }
    }
    assert_eq!(admitted, 3);
}

#[tokio::test]
async fn time_comes_from_redis() {
    let prefix = unique_prefix("time");
    let _cleanup = RedisCleanup {
        prefix: prefix.clone(),
    };
    let l = RedisLedger::connect(&redis_settings(&prefix), &LimitSettings::default())
        .await
        .unwrap();
    let d = TestJob::new("t1", "a@example.com", None)
        .admission(&l, &Ticket::new(), Clock::Server)
        .await;
    let mut conn = redis::Client::open(redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let redis_now = secs * 1000 + micros / 1000;
    assert!(d.decided_at_ms <= redis_now && redis_now - d.decided_at_ms < 5_000);
    // Same machine here, so the clocks agree too; on a pool they need not.
    let local = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(local.abs_diff(d.decided_at_ms) < 5_000);
}

#[tokio::test]
async fn every_key_has_a_ttl() {
    let prefix = unique_prefix("ttl");
    let cleanup = RedisCleanup {
        prefix: prefix.clone(),
    };
    let lim = LimitSettings::default();
    let l = RedisLedger::connect(&redis_settings(&prefix), &lim)
        .await
        .unwrap();
    for n in 0..200u64 {
        let job = TestJob::new(
            &format!("j{n}"),
            &format!("u{}@example.com", n % 17),
            Some(&format!("2001:db8:{}::1", n % 5)),
        );
        let ticket = Ticket::new();
        let v = job.admit(&l, &ticket, Clock::At(n * 7 * SEC)).await;
        if v == Verdict::Admitted {
            match n % 4 {
                0 => assert!(
                    l.settle(&job.by(&ticket), &Ending::Sent, true)
                        .await
                        .unwrap()
                ),
                1 => assert!(l.release(&job.by(&ticket)).await.unwrap()),
                2 => {
                    let refund = Ending::Refund(Refund::Failed);
                    assert!(l.settle(&job.by(&ticket), &refund, false).await.unwrap());
                    assert!(l.answered(&job.by(&ticket)).await.unwrap());
                }
                // Left sending, as admitted.
                _ => {}
            }
        }
    }
    let keys = cleanup.keys_with_ttl();
    assert!(keys.len() > 20, "the run wrote keys: {}", keys.len());
    // The longest window (and dedup_for), plus an hour of slack for a clock
    // that steps.
    let longest = (24 * HOUR + HOUR) as i64;
    for (key, ttl) in keys {
        assert!(key.starts_with(&prefix), "{key} is under the prefix");
        assert!(ttl > 0 && ttl <= longest, "{key} has TTL {ttl}");
        if key.contains(":ip:") {
            assert!(
                ttl <= (HOUR + HOUR) as i64,
                "ip keys live for the ip scope's longest window: {key} {ttl}"
            );
        }
    }
}

/// A rejected, expired or conflicting job leaves nothing in Redis: memory is
/// proportional to admissions. Prints the bytes one admission costs.
#[tokio::test]
async fn only_admissions_use_memory() {
    let prefix = unique_prefix("bytes");
    let cleanup = RedisCleanup {
        prefix: prefix.clone(),
    };
    let l = RedisLedger::connect(&redis_settings(&prefix), &LimitSettings::default())
        .await
        .unwrap();
    let victim = TestJob::new("first", "victim@example.com", Some("203.0.113.7"));
    assert_eq!(
        victim.admit(&l, &Ticket::new(), Clock::Server).await,
        Verdict::Admitted
    );
    let before = cleanup.keys_with_ttl().len();
    assert_eq!(before, 3, "one record and two scope logs");
    for n in 0..1_000 {
        let v = TestJob::new(
            &format!("flood-{n}"),
            "victim@example.com",
            Some("203.0.113.7"),
        )
        .admit(&l, &Ticket::new(), Clock::Server)
        .await;
        assert!(matches!(v, Verdict::Rejected { .. }), "{v:?}");
    }
    let (late, ticket) = (
        TestJob::new("late", "other@example.com", None),
        Ticket::new(),
    );
    let expired = mailgate::ledger::Entry {
        job: late.by(&ticket),
        expires_at_ms: Some(1),
        made_at_ms: None,
    };
    assert_eq!(
        l.admit(&expired, Clock::Server).await.unwrap().verdict,
        Verdict::Expired
    );
    let conflict = TestJob::new("first", "someone.else@example.com", None);
    assert_eq!(
        conflict.admit(&l, &Ticket::new(), Clock::Server).await,
        Verdict::Conflict
    );
    let keys = cleanup.keys_with_ttl();
    assert_eq!(
        keys.len(),
        before,
        "1 000 rejections, an expiry and a conflict wrote no key"
    );

    // Bytes per admission: the record plus one log entry per scope.
    let mut conn = redis::Client::open(redis_url())
        .unwrap()
        .get_connection()
        .unwrap();
    let mut bytes = 0;
    let n = 200;
    let mut total_before = 0i64;
    for (k, _) in &keys {
        let used: i64 = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(k)
            .query(&mut conn)
            .unwrap();
        total_before += used;
    }
    for i in 0..n {
        let job = TestJob::new(
            &format!("b3c1f0e2-{i:04}-4b1a-9d2c-6a8f2e7d1c0b"),
            &format!("user{i}@example.com"),
            Some(&format!("2001:db8:{i:x}::1")),
        );
        assert_eq!(
            job.admit(&l, &Ticket::new(), Clock::Server).await,
            Verdict::Admitted
        );
    }
    let mut record_bytes = 0;
    for (k, _) in cleanup.keys_with_ttl() {
        let used: i64 = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(&k)
            .query(&mut conn)
            .unwrap();
        bytes += used;
        if k.contains(":job:b3c1f0e2-") {
            record_bytes += used;
        }
    }
    let per = (bytes - total_before) as f64 / n as f64;
    println!(
        "bytes per admission (36-char id; a new mailbox and a new IPv6 network each): {per:.0}, \
         of which the job record {:.0}",
        record_bytes as f64 / n as f64
    );
    assert!(per < 1024.0, "{per} bytes per admission");
}

/// A Redis that evicts keys is refused, naming the setting, unless the
/// operator allows it.
#[tokio::test]
async fn a_redis_that_evicts_is_refused() {
    let server =
        PrivateRedis::start_with(&["--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"]);
    let mut settings = RedisSettings::new(server.url(), "t:");
    let l = RedisLedger::connect(&settings, &LimitSettings::default())
        .await
        .unwrap();
    let Err(LedgerError::Unfit(why)) = l.health().await else {
        panic!("an evicting Redis must be unfit");
    };
    assert!(
        why.contains("maxmemory-policy allkeys-lru") && why.contains("allow_eviction"),
        "{why}"
    );
    let open = mailgate::ledger::Backend::open(&settings, &LimitSettings::default()).await;
    assert!(matches!(open, Err(LedgerError::Unfit(_))));
    settings.allow_eviction = true;
    let l = RedisLedger::connect(&settings, &LimitSettings::default())
        .await
        .unwrap();
    l.health().await.expect("allowed explicitly");
}

/// Where CONFIG is out of reach (a managed service renames or disables
/// it), the policy is read from `INFO memory`, and an evicting Redis is
/// refused all the same.
#[tokio::test]
async fn an_evicting_redis_without_config_is_refused() {
    let server = PrivateRedis::start_with(&[
        "--maxmemory-policy",
        "volatile-lru",
        "--rename-command",
        "CONFIG",
        "",
    ]);
    let settings = RedisSettings::new(server.url(), "t:");
    let l = RedisLedger::connect(&settings, &LimitSettings::default())
        .await
        .unwrap();
    for _ in 0..2 {
        let Err(LedgerError::Unfit(why)) = l.health().await else {
            panic!("an evicting Redis must be unfit");
        };
        assert!(why.contains("maxmemory-policy volatile-lru"), "{why}");
    }
}

/// On a cluster whose nodes refuse CONFIG (managed services in cluster
/// mode), each node's refusal comes back inside the reply of every primary
/// and is read as a refusal, not as a reply of the wrong shape: both the
/// one-slot and the spread ledger are ready while Redis never evicts, and
/// refused once its nodes do, naming the policy.
#[tokio::test]
async fn a_cluster_without_config_is_checked_through_info() {
    let cluster = PrivateCluster::start_configured(0, &["--rename-command", "CONFIG", "mgcfg"]);
    let one_slot = ClusterBackend
        .make("no-config", LimitSettings::default())
        .await;
    let spread = SpreadBackend
        .make("no-config", LimitSettings::default())
        .await;
    for l in [&one_slot.ledger, &spread.ledger] {
        for _ in 0..2 {
            l.health()
                .await
                .expect("a cluster that never evicts is ready");
        }
    }
    for port in &cluster.ports {
        let out = std::process::Command::new("redis-cli")
            .args(["-p", &port.to_string(), "mgcfg", "set"])
            .args(["maxmemory-policy", "allkeys-lru"])
            .output()
            .expect("redis-cli runs");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "OK");
    }
    for l in [&one_slot.ledger, &spread.ledger] {
        let Err(LedgerError::Unfit(why)) = l.health().await else {
            panic!("an evicting cluster must be unfit");
        };
        assert!(why.contains("maxmemory-policy allkeys-lru"), "{why}");
    }
}

/// A server busy with a script (`BUSY`) is an outage, not CONFIG refused:
/// while it lasts the ledger is unfit, naming it; once it ends the ledger
/// is ready again, through CONFIG GET, for a user that may not run INFO.
/// Taken for a refusal (found by review), it switched the check to INFO
/// for good, and such a user stayed unfit with Redis healthy. Spread over
/// a cluster's shards, the busy node is one that does not hold the
/// readiness probe's key, so only CONFIG GET meets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_server_is_an_outage_and_config_is_read_again_after() {
    let cluster = PrivateCluster::start_configured(0, &["--busy-reply-threshold", "100"]);
    let spread = SpreadBackend.make("busy", LimitSettings::default()).await;
    let l = &spread.ledger;
    for port in &cluster.ports {
        assert_eq!(
            redis_cli(*port, &["ACL", "SETUSER", "default", "-info"]),
            "OK"
        );
    }
    l.health()
        .await
        .expect("ready through CONFIG GET, without INFO");
    let probe = format!("{}probe", spread.prefix());
    let busy = (cluster.ports.iter())
        .copied()
        .find(|p| redis_cli(*p, &["GET", &probe]).contains("MOVED"))
        .expect("a node without the probe's key");
    let script = "local t0 = redis.call('TIME')[1] \
        while tonumber(redis.call('TIME')[1]) - t0 < 2 do end return 1";
    let running = std::thread::spawn(move || redis_cli(busy, &["EVAL", script, "0"]));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let Err(during) = l.health().await else {
        panic!("a node busy with a script is not ready");
    };
    let during = mailgate::report::one_line(&during);
    assert!(
        during.contains("BUSY") && !during.contains("INFO"),
        "{during}"
    );
    assert_eq!(running.join().unwrap(), "1");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while let Err(e) = l.health().await {
        assert!(std::time::Instant::now() < deadline, "still unfit: {e}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A user that may run neither CONFIG GET nor INFO is unfit, told what to
/// grant; granted CONFIG GET, it is ready at the next check. (CONFIG's
/// refusal is asked again every ten minutes, but at once where INFO is
/// refused too: a passing error taken for a refusal held such a user
/// unfit for those ten minutes, found by review.)
#[tokio::test]
async fn a_user_without_config_or_info_is_told_what_to_grant_and_ready_once_granted() {
    let server = PrivateRedis::start();
    let settings = RedisSettings::new(server.url(), "t:");
    let l = RedisLedger::connect(&settings, &LimitSettings::default())
        .await
        .unwrap();
    l.health().await.expect("ready");
    let mut conn = server.connection();
    let acl = |conn: &mut redis::Connection, rules: &[&str]| {
        let () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg("default")
            .arg(rules)
            .query(conn)
            .unwrap();
    };
    acl(&mut conn, &["-config", "-info"]);
    for _ in 0..2 {
        let Err(LedgerError::Unfit(why)) = l.health().await else {
            panic!("a user that may read no eviction policy is unfit");
        };
        assert!(why.contains("grant it +info or +config|get"), "{why}");
    }
    acl(&mut conn, &["+config|get"]);
    l.health().await.expect("ready at the next check");
}

/// A malformed call is refused before its first write: nothing is left.
#[tokio::test]
async fn malformed_calls_write_nothing() {
    let server = PrivateRedis::start();
    let mut conn = server.connection();
    let script = mailgate::store::scripts::LEDGER.source();
    let sets = ["2", "1", "60000", "60000", "1", "0", "1", "0"];
    let head = ["batch", "", "86400000", "30000"];
    let batch = |items: &[&'static str]| [&head[..], &sets[..], items].concat();
    let calls: Vec<(Vec<&str>, Vec<&str>)> = vec![
        // A good request, then one with a bad flag: the first is not written.
        (
            vec!["t:job:a", "t:email:a", "t:job:b", "t:email:b"],
            batch(&[
                "admit", "a", "fp", "tk", "1:a", "c1", "", "01", "", "admit", "b", "fp", "tk",
                "1:a", "?", "", "01",
            ]),
        ),
        // A good request, then a settle with a bad end.
        (
            vec!["t:job:a", "t:email:a", "t:job:b"],
            batch(&[
                "admit", "a", "fp", "tk", "1:a", "c1", "", "01", "", "settle", "tk", "1:a", "b",
                "z", "1", "0",
            ]),
        ),
        // A flag that says suppression keys follow but not how many (it
        // was read as ten, the call's id short of a digit, and admitted).
        (
            [
                &["t:job:a", "t:email:a"][..],
                &["t:s0", "t:s1", "t:s2", "t:s3", "t:s4"],
                &["t:s5", "t:s6", "t:s7", "t:s8", "t:s9"],
            ]
            .concat(),
            batch(&["admit", "a", "fp", "tk", "1:a", "s:c1", "", "01", ""]),
        ),
        // A shape naming a rule set that does not exist.
        (
            vec!["t:job:a", "t:email:a"],
            batch(&["admit", "a", "fp", "tk", "1:a", "c1", "", "09", ""]),
        ),
        // Keys that do not match the requests.
        (
            vec!["t:job:a"],
            batch(&["admit", "a", "fp", "tk", "1:a", "c1", "", "01", ""]),
        ),
        // A word where the rule sets' count belongs.
        (
            vec!["t:job:a", "t:email:a"],
            [
                &["batch", "", "86400000", "30000", "json"][..],
                &sets[..],
                &["admit", "a", "fp", "tk", "1:a", "c1", "", "01", ""],
            ]
            .concat(),
        ),
        // A good request whose record would outlive what Redis accepts.
        (
            vec!["t:job:a", "t:email:a"],
            [
                &["batch", "", "99999999999999999", "30000"][..],
                &sets[..],
                &["admit", "a", "fp", "tk", "1:a", "c1", "", "01", ""],
            ]
            .concat(),
        ),
        // A window of a billion years: ZADD must not run before PEXPIRE fails.
        (
            vec!["t:job:a", "t:email:a"],
            vec![
                "batch",
                "",
                "86400000",
                "30000",
                "1",
                "1",
                "31536000000000000000",
                "31536000000000000000",
                "1",
                "admit",
                "a",
                "fp",
                "tk",
                "1:a",
                "c1",
                "",
                "01",
            ],
        ),
        // Attempt 0.
        (
            vec!["t:job:a", "t:email:a"],
            batch(&["admit", "a", "fp", "tk", "0:a", "c1", "", "01"]),
        ),
        // Fractions where commands take whole ms: a set's keep, the
        // record's keep, the lease (PEXPIRE would fail after ZADD and
        // HSET wrote), and a settle's key count (KEYS[1.5]).
        (
            vec!["t:job:a", "t:email:a"],
            [
                &head[..],
                &["1", "1", "60000.5", "60000", "1", "0"],
                &["admit", "a", "fp", "tk", "1:a", "c1", "", "01", ""],
            ]
            .concat(),
        ),
        (
            vec!["t:job:a", "t:email:a"],
            [
                &["batch", "", "86400000.5", "30000"][..],
                &sets[..],
                &["admit", "a", "fp", "tk", "1:a", "c1", "", "01", ""],
            ]
            .concat(),
        ),
        (
            vec!["t:job:a", "t:email:a"],
            [
                &["batch", "", "86400000", "30000.5"][..],
                &sets[..],
                &["admit", "a", "fp", "tk", "1:a", "c1", "", "01", ""],
            ]
            .concat(),
        ),
        (
            vec!["t:job:a", "t:email:a", "t:job:b", "t:job:c", "t:email:x"],
            batch(&[
                "admit", "a", "fp", "tk", "1:a", "c1", "", "01", "", "settle", "tk", "1:a", "b",
                "f", "1", "0.5", "settle", "tk", "1:a", "c", "f", "1", "0.5",
            ]),
        ),
        // A rule with a zero window.
        (
            vec!["t:job:a", "t:email:a"],
            vec![
                "batch", "", "86400000", "30000", "1", "1", "1", "0", "1", "admit", "a", "fp",
                "tk", "1:a", "c1", "", "01",
            ],
        ),
        (
            vec!["t:job:a"],
            batch(&["settle", "tk", "1:a", "a", "z", "1", "0"]),
        ),
        // A settle naming more scope keys than there are.
        (
            vec!["t:job:a"],
            batch(&["settle", "tk", "1:a", "a", "e", "1", "2"]),
        ),
        (vec!["t:job:a"], batch(&["release", "tk", "0:a"])),
        (
            vec!["t:job:a"],
            [
                &["batch", "", "99999999999999999", "30000"][..],
                &sets[..],
                &["release", "tk", "1:a"],
            ]
            .concat(),
        ),
        (vec!["t:job:a"], batch(&["release", "", "1:a"])),
        // An item cut short.
        (vec!["t:job:a"], batch(&["release", "tk"])),
        (vec!["t:job:a"], batch(&["answered", ""])),
        (vec!["t:job:a"], batch(&["nope", "tk"])),
        (vec!["t:job:a"], vec!["nope"]),
        // No count of extra rule sets.
        (
            vec!["t:job:a", "t:email:a"],
            [
                &head[..],
                &["2", "1", "60000", "60000", "1", "0", "1"],
                &["admit", "a", "fp", "tk", "1:a", "c1", "", "01", ""],
            ]
            .concat(),
        ),
        // An extra rule set numbered as a configured one.
        (
            vec!["t:job:a", "t:email:a"],
            [
                &head[..],
                &[
                    "2", "1", "60000", "60000", "1", "0", "1", "1", "2", "1", "1", "5", "0",
                ],
                &["admit", "a", "fp", "tk", "1:a", "c1", "", "01", ""],
            ]
            .concat(),
        ),
        // A malformed rule set no item names (parsing sets only when first
        // named would let it through, and the item would be written).
        (
            vec!["t:job:a", "t:email:a"],
            [
                &head[..],
                &["2", "1", "60000", "60000", "1", "1", "0", "60000", "1", "0"],
                &["admit", "a", "fp", "tk", "1:a", "c1", "", "01", ""],
            ]
            .concat(),
        ),
        // Numbers that are not ("nan" and "inf" pass checks written as
        // what must not hold), in a set only the second item names, after
        // a first that would be written.
        (
            vec!["t:job:a", "t:email:a", "t:job:b", "t:email:b"],
            [
                &head[..],
                &[
                    "2", "1", "60000", "60000", "1", "1", "nan", "60000", "1", "0",
                ],
                &["admit", "a", "fp", "tk", "1:a", "c1", "", "01", ""],
                &["admit", "b", "fp", "tk", "1:a", "c2", "", "02", ""],
            ]
            .concat(),
        ),
        (
            vec!["t:job:a", "t:email:a", "t:job:b", "t:email:b"],
            [
                &head[..],
                &[
                    "2", "1", "60000", "60000", "1", "1", "60000", "60000", "inf", "0",
                ],
                &["admit", "a", "fp", "tk", "1:a", "c1", "", "01", ""],
                &["admit", "b", "fp", "tk", "1:a", "c2", "", "02", ""],
            ]
            .concat(),
        ),
        (
            vec!["t:job:a", "t:email:a"],
            [
                &head[..],
                &["1", "1", "60000", "nan", "1", "0"],
                &["admit", "a", "fp", "tk", "1:a", "c1", "", "01", ""],
            ]
            .concat(),
        ),
        // A deny (max 0) among other rules.
        (
            vec!["t:job:a", "t:email:a"],
            [
                &head[..],
                &["1", "2", "60000", "60000", "1", "5", "0", "0"],
                &["admit", "a", "fp", "tk", "1:a", "c1", "", "01", ""],
            ]
            .concat(),
        ),
        // A made time where the purpose does not supersede... on a look.
        (
            vec!["t:job:a"],
            batch(&["look", "a", "fp", "tk", "1:a", "c1", "", "", "5"]),
        ),
    ];
    for (keys, args) in calls {
        let r: redis::RedisResult<redis::Value> = redis::cmd("EVAL")
            .arg(script)
            .arg(keys.len())
            .arg(&keys)
            .arg(&args)
            .query(&mut conn);
        let e = r.expect_err(&format!("{args:?} must be refused"));
        assert!(e.to_string().contains("ledger"), "{e}");
        let n: i64 = redis::cmd("DBSIZE").query(&mut conn).unwrap();
        assert_eq!(n, 0, "{args:?} wrote nothing");
    }
    // The same shape, well formed, is accepted and written.
    let good = batch(&["admit", "a", "fp", "tk", "1:a", "c1", "", "01", ""]);
    let _: redis::Value = redis::cmd("EVAL")
        .arg(script)
        .arg(2)
        .arg(&["t:job:a", "t:email:a"])
        .arg(&good)
        .query(&mut conn)
        .expect("a well-formed admission");
    let n: i64 = redis::cmd("DBSIZE").query(&mut conn).unwrap();
    assert_eq!(n, 2, "the record and the mailbox log");
}

#[tokio::test]
async fn script_is_reloaded_after_a_flush() {
    let server = PrivateRedis::start();
    let settings = RedisSettings::new(server.url(), "t:");
    let l = RedisLedger::connect(&settings, &LimitSettings::default())
        .await
        .unwrap();
    let mut conn = server.connection();
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut conn).unwrap();
    let v = TestJob::new("j1", "a@example.com", None)
        .admit(&l, &Ticket::new(), Clock::At(0))
        .await;
    assert_eq!(
        v,
        Verdict::Admitted,
        "EVALSHA falls back to loading the script"
    );
    // The batches' function library, likewise.
    let _: () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query(&mut conn)
        .unwrap();
    let v = TestJob::new("j2", "b@example.com", None)
        .admit(&l, &Ticket::new(), Clock::At(0))
        .await;
    assert_eq!(
        v,
        Verdict::Admitted,
        "FCALL falls back to loading the library"
    );
    let libraries: Vec<redis::Value> = redis::cmd("FUNCTION").arg("LIST").query(&mut conn).unwrap();
    assert_eq!(libraries.len(), 1, "the library is back");
}

/// A user that may run scripts but not load functions (or a Redis before
/// 7) is served by the ledger's script, with the same answers.
#[tokio::test]
async fn a_user_that_may_not_load_functions_is_served_by_the_script() {
    let server = PrivateRedis::start();
    let mut conn = server.connection();
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "nofunctions",
            "on",
            ">pw",
            "~*",
            "+@all",
            "-function",
        ])
        .query(&mut conn)
        .unwrap();
    let url = format!("redis://nofunctions:pw@127.0.0.1:{}/0", server.port);
    let limits = limits(&[(MIN, 1)], &[]);
    let l = RedisLedger::connect(&RedisSettings::new(url, "t:"), &limits)
        .await
        .expect("a user without FUNCTION is fit");
    let job = |id: &str| TestJob::new(id, "a@example.com", None);
    let first = job("j1").admit(&l, &Ticket::new(), Clock::At(0)).await;
    let second = job("j2").admit(&l, &Ticket::new(), Clock::At(1)).await;
    assert_eq!(first, Verdict::Admitted);
    assert!(matches!(second, Verdict::Rejected { .. }), "{second:?}");
    let libraries: Vec<redis::Value> = redis::cmd("FUNCTION").arg("LIST").query(&mut conn).unwrap();
    assert!(libraries.is_empty(), "nothing was loaded");
}

#[test]
fn memory_backend_forgets_idle_keys() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let l = MemoryLedger::new(&LimitSettings::default());
    rt.block_on(async {
        for n in 0..5_000u64 {
            TestJob::new(
                &format!("j{n}"),
                &format!("u{n}@example.com"),
                Some(&format!("10.0.{}.{}", n / 250, n % 250)),
            )
            .admit(&l, &Ticket::new(), Clock::At(n))
            .await;
        }
    });
    let (keys, jobs) = l.len();
    assert!(keys > 1000 && jobs > 1000);
    l.sweep(5_000 + 24 * HOUR + HOUR);
    assert!(
        l.is_empty(),
        "everything idle for its longest window is gone: {:?}",
        l.len()
    );
    // The periodic sweep does the same without being asked.
    rt.block_on(async {
        for n in 0..2_048u64 {
            TestJob::new(&format!("k{n}"), &format!("v{n}@example.com"), None)
                .admit(&l, &Ticket::new(), Clock::At(n * 2 * 24 * HOUR))
                .await;
        }
    });
    let (keys, jobs) = l.len();
    assert!(
        keys < 1100 && jobs < 1100,
        "idle keys were swept: {keys} {jobs}"
    );
}

/// A Redis the worker cannot use is named for what it is: a user whose ACL
/// forbids the script, or a read-only replica. Not "not answering".
#[tokio::test]
async fn an_unusable_redis_names_its_cause() {
    let primary = PrivateRedis::start();
    let mut conn = primary.connection();
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "noscript",
            "on",
            ">pw",
            "~*",
            "+@all",
            "-@scripting",
        ])
        .query(&mut conn)
        .unwrap();
    let settings = |url: String| RedisSettings::new(url, "t:");
    let no_script = format!("redis://noscript:pw@127.0.0.1:{}/0", primary.port);
    let Err(LedgerError::Unfit(why)) =
        RedisLedger::connect(&settings(no_script), &LimitSettings::default()).await
    else {
        panic!("a user without the script permission is unfit");
    };
    assert!(
        why.contains("may not run") && why.contains("EVALSHA"),
        "{why}"
    );

    let replica =
        PrivateRedis::start_with(&["--replicaof", "127.0.0.1", &primary.port.to_string()]);
    let l = RedisLedger::connect(&settings(replica.url()), &LimitSettings::default())
        .await
        .expect("a replica loads scripts");
    let Err(LedgerError::Unfit(why)) = l.health().await else {
        panic!("a replica is unfit");
    };
    assert!(why.contains("read-only replica"), "{why}");

    // A hardened user (no @dangerous, so no INFO), a wrong password, a
    // database that does not exist: each named, none "not answering".
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "hardened",
            "on",
            ">pw",
            "~*",
            "+@all",
            "-@dangerous",
        ])
        .query(&mut conn)
        .unwrap();
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "nowrite", "on", ">pw", "~*", "+@all", "-@write"])
        .query(&mut conn)
        .unwrap();
    let port = primary.port;
    for (url, says) in [
        (format!("redis://hardened:pw@127.0.0.1:{port}/0"), "+info"),
        (
            format!("redis://hardened:wrong@127.0.0.1:{port}/0"),
            "credentials",
        ),
        (format!("redis://127.0.0.1:{port}/99"), "database"),
        (
            format!("redis://nowrite:pw@127.0.0.1:{port}/0"),
            "may not run",
        ),
    ] {
        let opened = Backend::open(&settings(url.clone()), &LimitSettings::default()).await;
        let Err(LedgerError::Unfit(why)) = opened else {
            panic!("{url} is unfit");
        };
        assert!(why.contains(says), "{url}: {why}");
    }
    RedisLedger::connect(&settings(primary.url()), &LimitSettings::default())
        .await
        .unwrap()
        .health()
        .await
        .expect("the primary is fine");
}

/// Reading the overrides at start: a refusal that does not go away by
/// waiting stops start-up, named, as it did before start-up learnt to wait
/// out an outage there. The worker retries every `LedgerError` but
/// `Unfit` for ever (`worker::start::open_ledger`), so anything else here
/// is a worker that never starts and says "redis is not answering".
/// Here: the overrides hash's key holds a string (a key prefix shared with
/// another application, or a key written by hand), so every read of it is
/// `WRONGTYPE`, on every try.
#[tokio::test]
async fn an_overrides_key_of_another_type_stops_start_up() {
    let server = PrivateRedis::start();
    let mut conn = server.connection();
    let _: () = redis::cmd("SET")
        .arg("t:overrides")
        .arg("not a hash")
        .query(&mut conn)
        .unwrap();
    let settings = RedisSettings::new(server.url(), "t:");
    let opened = Backend::open(&settings, &LimitSettings::default()).await;
    let e = match opened {
        Ok(_) => panic!("a WRONGTYPE overrides key cannot be read"),
        Err(e) => e,
    };
    assert!(!e.is_outage(), "{e:?}");
    let LedgerError::Unfit(why) = &e else {
        panic!(
            "a lasting WRONGTYPE must stop start-up (Unfit), not be retried for ever as if \
             Redis were not answering: {}",
            mailgate::report::one_line(&e)
        );
    };
    assert!(
        why.contains("reading the overrides") && why.contains("WRONGTYPE"),
        "{why}"
    );
}

/// A user whose ACL forbids the command that reads the overrides (HGETALL)
/// is refused at start, named: a refusal is not waited out.
#[tokio::test]
async fn a_user_who_may_not_read_the_overrides_stops_start_up() {
    let server = PrivateRedis::start();
    let mut conn = server.connection();
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "nohgetall",
            "on",
            ">pw",
            "~*",
            "+@all",
            "-hgetall",
        ])
        .query(&mut conn)
        .unwrap();
    let url = format!("redis://nohgetall:pw@127.0.0.1:{}/0", server.port);
    let opened = Backend::open(&RedisSettings::new(url, "t:"), &LimitSettings::default()).await;
    let Err(LedgerError::Unfit(why)) = opened else {
        panic!("a user without HGETALL is unfit");
    };
    assert!(
        why.contains("reading the overrides") && why.contains("'hgetall'"),
        "{why}"
    );
}

/// With `redis.min_replicas_acked = 1`: a primary without an online replica
/// is reported, a send mark the replica acknowledges stands, and one it does
/// not (the replica stopped) is given back, so the job's next attempt
/// resumes it instead of finding its delivery unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_mark_stands_only_once_a_replica_acknowledged_it() {
    let primary = PrivateRedis::start();
    let settings = RedisSettings {
        min_replicas_acked: 1,
        replica_ack_timeout: Duration::from_millis(200),
        ..RedisSettings::new(primary.url(), "t:")
    };
    let l = RedisLedger::connect(&settings, &LimitSettings::default())
        .await
        .unwrap();
    let Err(LedgerError::Unreplicated(why)) = l.health().await else {
        panic!("a primary without a replica is unfit to send");
    };
    assert!(why.contains("0 replicas online"), "{why}");

    let (replica, dir) = replica_of(&primary, "mgtest-replica");
    until_synced(&l).await;
    let (a, b) = (
        TestJob::new("ra", "ra@example.com", None),
        TestJob::new("rb", "rb@example.com", None),
    );
    let ticket = Ticket::new();
    let ok = admit_now(&l, &a, &ticket, 1).await.expect("acknowledged");
    assert_eq!(ok.verdict, Verdict::Admitted);

    replica.pause();
    let Err(LedgerError::Unreplicated(why)) = admit_now(&l, &b, &ticket, 1).await else {
        panic!("a mark the replica did not acknowledge must not stand");
    };
    assert!(why.contains("0 of the 1"), "{why}");
    replica.resume();
    // The replica online again (a busy machine may take longer than the
    // ack timeout to wake it): given back, the next attempt resumes the
    // job (its admission kept).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while l.health().await.is_err() {
        assert!(std::time::Instant::now() < deadline, "the replica is back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let again = admit_now(&l, &b, &ticket, 2)
        .await
        .expect("acknowledged now");
    assert!(
        matches!(again.verdict, Verdict::Resumed { .. }),
        "{again:?}"
    );
    drop(replica);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A send mark the replica did not acknowledge, whose give-back Redis
/// refuses for a moment (here `min-replicas-to-write`, NOREPLICAS; behind
/// Sentinel, the write stop of the failover that kept the replicas from
/// acknowledging): the give-back is retried, and the job's next attempt
/// resumes it. Given back once only, the mark stood, and the job was
/// answered "delivery unknown" though its send never began (found by
/// review: 29 of 3 000 jobs over six forced failovers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mark_the_replicas_did_not_acknowledge_is_given_back_after_an_outage() {
    let primary = PrivateRedis::start();
    let (replica, dir) = replica_of(&primary, "mgtest-giveback");
    let settings = RedisSettings {
        min_replicas_acked: 1,
        replica_ack_timeout: Duration::from_secs(3),
        ..RedisSettings::new(primary.url(), "g:")
    };
    let l = RedisLedger::connect(&settings, &LimitSettings::default())
        .await
        .unwrap();
    until_synced(&l).await;
    let mut conn = primary.connection();
    for (k, v) in [
        ("min-replicas-max-lag", "1"),
        ("min-replicas-to-write", "1"),
    ] {
        let () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(k)
            .arg(v)
            .query(&mut conn)
            .unwrap();
    }
    let (job, ticket) = (TestJob::new("gb", "gb@example.com", None), Ticket::new());
    // The replica stops: the mark's WAIT runs out after 3 s, by when the
    // primary refuses writes (its replica more than a second behind); the
    // replica is back 3 s later.
    replica.pause();
    let back = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(6));
        replica.resume();
        replica
    });
    let Err(LedgerError::Unreplicated(why)) = admit_now(&l, &job, &ticket, 1).await else {
        panic!("a mark the replica did not acknowledge must not stand");
    };
    assert!(why.contains("0 of the 1"), "{why}");
    let replica = back.join().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while l.health().await.is_err() {
        assert!(std::time::Instant::now() < deadline, "the replica is back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let again = admit_now(&l, &job, &ticket, 2)
        .await
        .expect("acknowledged now");
    assert!(
        matches!(again.verdict, Verdict::Resumed { .. }),
        "given back, so resumed: {again:?}"
    );
    drop(replica);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A settle waits for the replicas as a send mark does: one they did not
/// acknowledge is an outage (the caller writes it again), and written
/// again once they answer, it stands. Unwaited, a settle the old primary
/// of a forced failover alone took was lost, and the copy of a sent job
/// was answered "delivery unknown" (1 of 251 jobs in a full test run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_the_replicas_did_not_acknowledge_is_an_outage_and_written_again() {
    let primary = PrivateRedis::start();
    let (replica, dir) = replica_of(&primary, "mgtest-settlewait");
    let settings = RedisSettings {
        min_replicas_acked: 1,
        replica_ack_timeout: Duration::from_millis(300),
        ..RedisSettings::new(primary.url(), "sw:")
    };
    let l = RedisLedger::connect(&settings, &LimitSettings::default())
        .await
        .unwrap();
    until_synced(&l).await;
    let (job, ticket) = (TestJob::new("sw", "sw@example.com", None), Ticket::new());
    // (A replica slow to acknowledge on a loaded machine: the mark is
    // given back, and the same attempt resumes it.)
    let mut sent = admit_now(&l, &job, &ticket, 1).await;
    for _ in 0..20 {
        match sent {
            Err(LedgerError::Unreplicated(_)) => sent = admit_now(&l, &job, &ticket, 1).await,
            _ => break,
        }
    }
    let sent = sent.expect("acknowledged");
    assert!(
        matches!(sent.verdict, Verdict::Admitted | Verdict::Resumed { .. }),
        "{:?}",
        sent.verdict
    );
    replica.pause();
    let Err(e) = l.settle(&job.by(&ticket), &Ending::Sent, false).await else {
        panic!("a settle the replica did not acknowledge must not count as written");
    };
    assert!(
        matches!(e, LedgerError::Unreplicated(ref why) if why.contains("0 of the 1")),
        "{e}"
    );
    assert!(e.is_outage(), "written again by the caller: {e}");
    replica.resume();
    let done = l.settle(&job.by(&ticket), &Ending::Sent, false).await;
    assert!(
        done.expect("acknowledged now"),
        "the same end, written again"
    );
    assert!(
        matches!(
            job.admit(&l, &Ticket::new(), Clock::Server).await,
            Verdict::Sent { .. }
        ),
        "a copy is answered sent"
    );
    drop(replica);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A replica of `primary` with its files in a folder of its own (named
/// `tag` and the primary's port), which the caller removes.
fn replica_of(primary: &PrivateRedis, tag: &str) -> (PrivateRedis, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("{tag}-{}", primary.port));
    std::fs::create_dir_all(&dir).unwrap();
    let replica = PrivateRedis::start_with(&[
        "--replicaof",
        "127.0.0.1",
        &primary.port.to_string(),
        "--dir",
        dir.to_str().unwrap(),
    ]);
    (replica, dir)
}

/// Waits (up to 10 s) until `l` is ready: its replicas synced.
async fn until_synced(l: &RedisLedger) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while l.health().await.is_err() {
        assert!(std::time::Instant::now() < deadline, "the replica syncs");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Attempt `attempt` of lineage `ticket` of `job`, admitted straight into
/// sending (an SMTP connection free).
async fn admit_now(
    l: &RedisLedger,
    job: &TestJob,
    ticket: &Ticket,
    attempt: u32,
) -> Result<mailgate::ledger::Admission, LedgerError> {
    let entry = Entry {
        job: job.attempt(ticket, attempt),
        expires_at_ms: None,
        made_at_ms: None,
    };
    l.admit(&entry, Clock::Server).await
}

/// An expired override is no longer in force at once, and the next change
/// drops it from Redis; removing one takes it out of force at the next
/// reload.
#[tokio::test]
async fn expired_overrides_stop_at_once_and_are_dropped_by_the_next_change() {
    use mailgate::limiter::overrides::{Action, Override, Target};
    let prefix = unique_prefix("ov-expiry");
    let _cleanup = RedisCleanup {
        prefix: prefix.clone(),
    };
    let l = RedisLedger::connect(&redis_settings(&prefix), &limits(&[(HOUR, 1)], &[]))
        .await
        .unwrap();
    let now = mailgate::domain::now_ms();
    let ov = |t: &str, lasts: Option<u64>| Override {
        target: Target::parse(t).unwrap(),
        action: Action::Deny,
        reason: "r".into(),
        expires_at_ms: lasts.map(|ms| now + ms),
        added_at_ms: now,
    };
    l.overrides()
        .add(&ov("email:a@example.com", Some(300)))
        .await
        .unwrap();
    l.overrides().reload().await.unwrap();
    let denied = TestJob::new("j1", "a@example.com", None)
        .admit(&l, &Ticket::new(), Clock::Server)
        .await;
    assert!(
        matches!(denied, Verdict::Rejected { rule, .. } if rule.max == 0),
        "{denied:?}"
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let v = TestJob::new("j2", "a@example.com", None)
        .admit(&l, &Ticket::new(), Clock::Server)
        .await;
    assert_eq!(v, Verdict::Admitted, "expired: no longer in force");
    assert_eq!(l.overrides().list().await.unwrap().len(), 1);
    l.overrides()
        .add(&ov("email:b@example.com", None))
        .await
        .unwrap();
    let left: Vec<String> = (l.overrides().list().await.unwrap().iter())
        .map(|o| o.target.to_string())
        .collect();
    assert_eq!(left, ["email:b@example.com"]);
    let done = l
        .overrides()
        .remove(&Target::parse("email:b@example.com").unwrap())
        .await
        .unwrap();
    assert_eq!(done.removed.len(), 1);
    assert!(l.overrides().reload().await.unwrap());
    assert_eq!(
        TestJob::new("j3", "b@example.com", None)
            .admit(&l, &Ticket::new(), Clock::Server)
            .await,
        Verdict::Admitted
    );
}

/// An override written by hand that the CLI would refuse (a window under a
/// millisecond, no rules, no reason) is ignored, never sent to the script,
/// where it would fail every batch it rode in; and a version number is
/// never reused, so a hash deleted and written again is reloaded (a
/// counter that started over would hide the change).
#[tokio::test]
async fn bad_overrides_are_ignored_and_a_recreated_hash_is_reloaded() {
    use mailgate::limiter::overrides::{Action, Override, Target};
    let prefix = unique_prefix("ov-bad");
    let _cleanup = RedisCleanup {
        prefix: prefix.clone(),
    };
    let l = RedisLedger::connect(&redis_settings(&prefix), &limits(&[(HOUR, 5)], &[]))
        .await
        .unwrap();
    let mut conn = sync_redis();
    let key = format!("{prefix}overrides");
    for (field, json) in [
        (
            "ip:203.0.113.9/32",
            r#"{"target":"ip:203.0.113.9","action":"rules","rules":[{"window_ms":0,"max":5}],"reason":"r","expires_at_ms":null,"added_at_ms":0}"#,
        ),
        (
            "ip:203.0.113.8/32",
            r#"{"target":"ip:203.0.113.8","action":"rules","rules":[],"reason":"r","expires_at_ms":null,"added_at_ms":0}"#,
        ),
        (
            "email:c@example.com",
            r#"{"target":"email:c@example.com","action":"deny","reason":"","expires_at_ms":null,"added_at_ms":0}"#,
        ),
        ("~version", "7"),
    ] {
        let () = redis::cmd("HSET")
            .arg(&key)
            .arg(field)
            .arg(json)
            .query(&mut conn)
            .unwrap();
    }
    l.overrides().reload().await.unwrap();
    for (n, (mail, ip)) in [
        ("a@example.com", "203.0.113.9"),
        ("b@example.com", "203.0.113.8"),
        ("c@example.com", "192.0.2.1"),
    ]
    .into_iter()
    .enumerate()
    {
        let v = TestJob::new(&format!("j{n}"), mail, Some(ip))
            .admit(&l, &Ticket::new(), Clock::Server)
            .await;
        assert_eq!(v, Verdict::Admitted, "{mail}");
    }
    // The CLI's own check refuses a sub-millisecond window.
    let now = mailgate::domain::now_ms();
    let sub_ms = Override {
        target: Target::parse("ip:203.0.113.7").unwrap(),
        action: Action::Rules(vec![mailgate::settings::Rule::new(
            Duration::from_micros(500),
            5,
        )]),
        reason: "r".into(),
        expires_at_ms: None,
        added_at_ms: now,
    };
    assert!(l.overrides().add(&sub_ms).await.is_err());
    // A deny, then the hash deleted and written again: reloaded.
    let deny = |t: &str| Override {
        target: Target::parse(t).unwrap(),
        action: Action::Deny,
        reason: "r".into(),
        expires_at_ms: None,
        added_at_ms: now,
    };
    l.overrides()
        .add(&deny("email:d@example.com"))
        .await
        .unwrap();
    assert!(l.overrides().reload().await.unwrap());
    let () = redis::cmd("DEL").arg(&key).query(&mut conn).unwrap();
    l.overrides()
        .add(&deny("email:e@example.com"))
        .await
        .unwrap();
    assert!(l.overrides().reload().await.unwrap(), "a new version");
    let v = TestJob::new("j8", "d@example.com", None)
        .admit(&l, &Ticket::new(), Clock::Server)
        .await;
    assert_eq!(v, Verdict::Admitted, "the old deny is gone");
    let v = TestJob::new("j9", "e@example.com", None)
        .admit(&l, &Ticket::new(), Clock::Server)
        .await;
    assert!(
        matches!(v, Verdict::Rejected { .. }),
        "the new deny holds: {v:?}"
    );
}

/// Overrides changing while requests are in flight (an override added and
/// removed in a loop, so each table numbers the others' rule sets
/// differently) never let a denied client through, nor deny a mailbox
/// judged by its own rules: each batch numbers the sets it sends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overrides_changing_mid_batch_keep_each_request_its_own_rules() {
    use mailgate::limiter::overrides::{Action, Override, Target};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let prefix = unique_prefix("ov-swap");
    let _cleanup = RedisCleanup {
        prefix: prefix.clone(),
    };
    let l = RedisLedger::connect(
        &redis_settings(&prefix),
        &limits(&[(MIN, 1), (HOUR, 5)], &[(MIN, 5), (HOUR, 50)]),
    )
    .await
    .unwrap();
    let l = Arc::new(l);
    let ov = |t: &str, action: Action| Override {
        target: Target::parse(t).unwrap(),
        action,
        reason: "swap".into(),
        expires_at_ms: None,
        added_at_ms: mailgate::domain::now_ms(),
    };
    l.overrides()
        .add(&ov("ip:198.51.100.66", Action::Deny))
        .await
        .unwrap();
    l.overrides().reload().await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let (l, stop) = (l.clone(), stop.clone());
        let rules = ov(
            "email:aaa@example.com",
            Action::Rules(vec![mailgate::settings::Rule::new(
                Duration::from_secs(60),
                1000,
            )]),
        );
        tokio::spawn(async move {
            let mut swaps = 0;
            while !stop.load(Ordering::Relaxed) {
                l.overrides().add(&rules).await.unwrap();
                l.overrides().reload().await.unwrap();
                tokio::task::yield_now().await;
                l.overrides().remove(&rules.target).await.unwrap();
                l.overrides().reload().await.unwrap();
                swaps += 1;
            }
            swaps
        })
    };
    let (through, wrongly_denied) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut tasks = Vec::new();
    for w in 0..32 {
        let (l, through, wrongly_denied) = (l.clone(), through.clone(), wrongly_denied.clone());
        tasks.push(tokio::spawn(async move {
            for k in 0..100 {
                let i = w * 1000 + k;
                let denied = i % 2 == 0;
                let j = match denied {
                    true => TestJob::new(&format!("d{i}"), &format!("m{i}@ex{i}.com"), Some("198.51.100.66")),
                    false => TestJob::new(
                        &format!("r{i}"),
                        "aaa@example.com",
                        Some(&format!("203.0.113.{}", i % 200)),
                    ),
                };
                let v = j.admit(&*l, &Ticket::new(), Clock::Server).await;
                if denied && v == Verdict::Admitted {
                    through.fetch_add(1, Ordering::Relaxed);
                }
                if !denied && matches!(v, Verdict::Rejected { retry_after_ms, .. } if retry_after_ms > HOUR) {
                    wrongly_denied.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = swapper.await.unwrap();
    assert!(swaps > 0);
    assert_eq!(
        through.load(Ordering::Relaxed),
        0,
        "a denied client was admitted"
    );
    assert_eq!(
        wrongly_denied.load(Ordering::Relaxed),
        0,
        "a mailbox was judged by a deny"
    );
}

/// Two stored overrides that widen to one subject (a deny of one address
/// and an allow of its network, read by a worker that groups clients by
/// /24) resolve to the stronger, the deny, whatever their order; and
/// `remove` deletes the entry stored for exactly what it is given and names
/// the others still in force, or, with none stored exactly, every one its
/// subject widens to.
#[tokio::test]
async fn overrides_widened_to_one_subject_keep_the_deny_and_remove_exactly() {
    use mailgate::limiter::overrides::Target;
    let prefix = unique_prefix("ov-widen");
    let _cleanup = RedisCleanup {
        prefix: prefix.clone(),
    };
    let lim = LimitSettings {
        ipv4_prefix: 24,
        ..limits(&[(HOUR, 50)], &[(HOUR, 50)])
    };
    let l = RedisLedger::connect(&redis_settings(&prefix), &lim)
        .await
        .unwrap();
    let mut conn = sync_redis();
    let key = format!("{prefix}overrides");
    for (field, json) in [
        (
            "ip:10.1.2.7/32",
            r#"{"target":"ip:10.1.2.7/32","action":"deny","reason":"r","expires_at_ms":null,"added_at_ms":0}"#,
        ),
        (
            "ip:10.1.2.0/24",
            r#"{"target":"ip:10.1.2.0/24","action":"allow","reason":"r","expires_at_ms":null,"added_at_ms":0}"#,
        ),
        ("~version", "x"),
    ] {
        let () = redis::cmd("HSET")
            .arg(&key)
            .arg(field)
            .arg(json)
            .query(&mut conn)
            .unwrap();
    }
    l.overrides().reload().await.unwrap();
    for (n, ip) in ["10.1.2.7", "10.1.2.99"].into_iter().enumerate() {
        let v = TestJob::new(&format!("w{n}"), &format!("u{n}@example.com"), Some(ip))
            .admit(&l, &Ticket::new(), Clock::Server)
            .await;
        assert!(
            matches!(v, Verdict::Rejected { rule, .. } if rule.max == 0),
            "{ip}: {v:?}"
        );
    }
    let done = l
        .overrides()
        .remove(&Target::parse("ip:10.1.2.7").unwrap())
        .await
        .unwrap();
    let names = |ts: &[Target]| ts.iter().map(|t| t.to_string()).collect::<Vec<_>>();
    assert_eq!(names(&done.removed), ["ip:10.1.2.7/32"]);
    assert_eq!(
        names(&done.still),
        ["ip:10.1.2.0/24"],
        "named as still in force"
    );
    l.overrides().reload().await.unwrap();
    let v = TestJob::new("w9", "u9@example.com", Some("10.1.2.7"))
        .admit(&l, &Ticket::new(), Clock::Server)
        .await;
    assert_eq!(v, Verdict::Admitted, "the allow is left");
    // An address with no override of its own reaches the one its group
    // has (it said "no override" and left it in force).
    let done = l
        .overrides()
        .remove(&Target::parse("ip:10.1.2.99").unwrap())
        .await
        .unwrap();
    assert_eq!(names(&done.removed), ["ip:10.1.2.0/24"]);
    assert!(done.still.is_empty());
    assert!(l.overrides().list().await.unwrap().is_empty());
}

/// Adding an override that widens or normalizes to the subject of one in
/// force never replaces it silently (else an allow of one address would
/// lift the deny of its network, and an allow of
/// `V.I.C.T.I.M+qa@googlemail.com` the deny of `victim@gmail.com`): a
/// loosening is refused unless asked for, and what is replaced is said.
/// `remove` of a target with no entry of its own takes the one entry its
/// subject counts as, refuses to guess among several, and always deletes
/// an exact entry, even one it cannot read.
#[tokio::test]
async fn loosening_an_override_in_force_is_refused_and_remove_does_not_guess() {
    use mailgate::limiter::overrides::{Action, Override, Target};
    let prefix = unique_prefix("ov-loosen");
    let _cleanup = RedisCleanup {
        prefix: prefix.clone(),
    };
    let lim = LimitSettings {
        ipv4_prefix: 24,
        ..limits(&[(HOUR, 50)], &[(HOUR, 50)])
    };
    let l = RedisLedger::connect(&redis_settings(&prefix), &lim)
        .await
        .unwrap();
    let ov = |target: &str, action: Action| Override {
        target: Target::parse(target).unwrap(),
        action,
        reason: "r".into(),
        expires_at_ms: None,
        added_at_ms: mailgate::domain::now_ms(),
    };
    for (deny, allow) in [
        ("ip:198.51.100.0/24", "ip:198.51.100.9"),
        (
            "email:victim@gmail.com",
            "email:V.I.C.T.I.M+qa@googlemail.com",
        ),
    ] {
        l.overrides().add(&ov(deny, Action::Deny)).await.unwrap();
        let refused = l.overrides().add(&ov(allow, Action::Allow)).await;
        assert!(
            matches!(&refused, Err(e) if e.to_string().contains("--replace")),
            "{refused:?}"
        );
        let kinds: Vec<&str> = (l.overrides().list().await.unwrap().iter())
            .filter(|o| o.target.scope() == Target::parse(deny).unwrap().scope())
            .map(|o| o.action.kind())
            .collect();
        assert_eq!(kinds, ["deny"], "{deny} is still denied");
        // Asked for: replaced, and said so.
        let (_, replaced) = l
            .overrides()
            .store(&[ov(allow, Action::Allow)], true)
            .await
            .unwrap();
        assert_eq!(replaced.len(), 1);
        assert_eq!(replaced[0].action, Action::Deny);
        // A stronger one needs no asking.
        let (_, replaced) = l
            .overrides()
            .store(&[ov(deny, Action::Deny)], false)
            .await
            .unwrap();
        assert_eq!(replaced[0].action, Action::Allow);
    }

    // A deny of an alias that ends sooner is a loosening too: it must not
    // replace a permanent one unasked.
    l.overrides()
        .add(&ov("email:victim2@gmail.com", Action::Deny))
        .await
        .unwrap();
    let shorter = Override {
        expires_at_ms: Some(mailgate::domain::now_ms() + 2_000),
        ..ov("email:V.I.C.T.I.M.2+qa@googlemail.com", Action::Deny)
    };
    let refused = l.overrides().add(&shorter).await;
    assert!(
        matches!(&refused, Err(e) if e.to_string().contains("--replace")),
        "{refused:?}"
    );

    // An entry a later version wrote, which this one cannot read: removed
    // by its exact target all the same.
    let mut conn = sync_redis();
    let key = format!("{prefix}overrides");
    let () = redis::cmd("HSET")
        .arg(&key)
        .arg("ip:10.9.9.0/24")
        .arg(r#"{"target":"ip:10.9.9.0/24","action":"throttle","reason":"r","added_at_ms":0}"#)
        .query(&mut conn)
        .unwrap();
    let done = l
        .overrides()
        .remove(&Target::parse("ip:10.9.9.0/24").unwrap())
        .await
        .unwrap();
    assert_eq!(done.removed.len(), 1);
    let left: bool = redis::cmd("HEXISTS")
        .arg(&key)
        .arg("ip:10.9.9.0/24")
        .query(&mut conn)
        .unwrap();
    assert!(!left, "the unreadable entry is gone");

    // Two stored addresses a /24 grouping counts as one subject (written
    // as a worker grouping by /32 would): removing a third address of
    // that group names both and removes neither.
    for field in ["ip:10.7.7.7/32", "ip:10.7.7.8/32"] {
        let json = format!(
            r#"{{"target":"{field}","action":"deny","reason":"r","expires_at_ms":null,"added_at_ms":0}}"#
        );
        let () = redis::cmd("HSET")
            .arg(&key)
            .arg(field)
            .arg(json)
            .query(&mut conn)
            .unwrap();
    }
    let refused = l
        .overrides()
        .remove(&Target::parse("ip:10.7.7.9").unwrap())
        .await;
    assert!(
        matches!(&refused, Err(e) if e.to_string().contains("10.7.7.7") && e.to_string().contains("10.7.7.8")),
        "{refused:?}"
    );
    let n: usize = redis::cmd("HLEN").arg(&key).query(&mut conn).unwrap();
    assert!(n >= 3, "nothing was removed");
}

/// With no override stored, a worker's poll is one cheap round trip (HGET
/// and HLEN) and reads the hash again only when it changes (were a missing
/// version counted as changed, it would read the whole hash, and log it,
/// every 2 s). A change, even one written by hand without a version, is
/// still read within a poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overrides_are_read_again_only_when_they_change() {
    use mailgate::limiter::overrides::{Action, Override, Target};
    let server = PrivateRedis::start();
    let settings = RedisSettings::new(server.url(), "poll:");
    let reads = || {
        let stats = redis_cli(server.port, &["info", "commandstats"]);
        stats
            .lines()
            .find(|l| l.starts_with("cmdstat_hgetall:"))
            .and_then(|l| {
                l.split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .unwrap_or(0)
    };
    let l = RedisLedger::connect(&settings, &limits(&[(HOUR, 5)], &[]))
        .await
        .unwrap();
    l.overrides().start().await.unwrap();
    let poll = mailgate::store::overrides::POLL;
    tokio::time::sleep(poll * 2 + Duration::from_millis(500)).await;
    assert_eq!(reads(), 1, "read once at start, then only stamps");
    l.overrides()
        .add(&Override {
            target: Target::parse("email:a@example.com").unwrap(),
            action: Action::Deny,
            reason: "r".into(),
            expires_at_ms: None,
            added_at_ms: mailgate::domain::now_ms(),
        })
        .await
        .unwrap();
    let before = reads();
    tokio::time::sleep(poll + Duration::from_millis(500)).await;
    let denied = TestJob::new("p1", "a@example.com", None)
        .admit(&l, &Ticket::new(), Clock::Server)
        .await;
    assert!(matches!(denied, Verdict::Rejected { .. }), "{denied:?}");
    // A field removed by hand, the version left alone: read again too.
    redis_cli(
        server.port,
        &["hdel", "poll:overrides", "email:a@example.com"],
    );
    tokio::time::sleep(poll + Duration::from_millis(500)).await;
    let v = TestJob::new("p2", "a@example.com", None)
        .admit(&l, &Ticket::new(), Clock::Server)
        .await;
    assert_eq!(v, Verdict::Admitted);
    let changed = reads() - before;
    tokio::time::sleep(poll * 2).await;
    assert_eq!(reads() - before, changed, "no read while nothing changes");
    assert!(changed <= 3, "{changed} reads for two changes");
}

/// A request that waited in the worker's own queue behind calls a frozen
/// Redis held is as late as those calls, and writes nothing either. Redis
/// freezes (SIGSTOP) for 3 s while 6 admissions that would mark their
/// send begun are asked for: two calls are in flight, the rest wait for a
/// free call. When Redis thaws, the calls in flight run 3 s late and are
/// refused (`STALE`); were the waiting ones sent then as a fresh call, they
/// would set send marks that a worker which gave up on them meanwhile (a
/// deploy) never sends nor gives back, and the next worker would answer
/// those jobs "delivery unknown" with nothing sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_queued_behind_a_frozen_redis_writes_nothing() {
    let server = PrivateRedis::start();
    let settings = RedisSettings::new(server.url(), "t:");
    let l = RedisLedger::connect(&settings, &LimitSettings::default())
        .await
        .unwrap();
    server.pause();
    let mut asked = Vec::new();
    for n in 0..6 {
        let l = l.clone();
        asked.push(tokio::spawn(async move {
            let job = TestJob::new(&format!("q{n}"), &format!("u{n}@example.com"), None);
            let ticket = Ticket::new();
            let entry = Entry {
                job: job.by(&ticket),
                expires_at_ms: None,
                made_at_ms: None,
            };
            l.admit(&entry, Clock::Server).await.map(|a| a.verdict)
        }));
        // Asked one after another, as jobs arrive.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    server.resume();
    for (n, a) in asked.into_iter().enumerate() {
        match a.await.unwrap() {
            Err(e) => assert!(e.is_outage(), "q{n}: {e:?}"),
            Ok(v) => panic!("q{n} was decided 3 s after it was asked: {v:?}"),
        }
    }
    let mut conn = server.connection();
    let keys: Vec<String> = redis::cmd("KEYS").arg("t:job:*").query(&mut conn).unwrap();
    assert!(keys.is_empty(), "records written late: {keys:?}");
}

/// Batches that carry only the rule sets their admissions' shapes name:
/// one instant's admissions of 30 purposes (sets past the 64th, so shapes
/// use both digits), a denied network, a mailbox under a rules override and
/// plain jobs, all at once so they share batches, each item's shape naming
/// different sets. Nobody gets past a limit, the deny holds, and no batch
/// fails for a set it lacks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_batches_carry_every_set_their_shapes_name() {
    use mailgate::limiter::overrides::{Action, Override, Target};
    let prefix = unique_prefix("rev2-named");
    let _cleanup = RedisCleanup {
        prefix: prefix.clone(),
    };
    let mut lim = limits(&[(HOUR, 5)], &[(HOUR, 500)]);
    lim.domain.rules = rules(&[(HOUR, 5000)]).rules;
    let mut lim = with_30_purposes(lim, (3, 300, 3000));
    // p05's mailboxes also carry a shadow rule (1 an hour): judged, never
    // rejecting.
    if let Some(p05) = lim.purpose.get_mut("p05")
        && let Some(email) = p05.email.as_mut()
    {
        email.rules.push(mailgate::settings::Rule {
            enforce: false,
            ..mailgate::settings::Rule::new(Duration::from_millis(HOUR), 1)
        });
    }
    lim.validate().expect("settings accept 30 purposes");
    let l = Arc::new(
        RedisLedger::connect(&redis_settings(&prefix), &lim)
            .await
            .unwrap(),
    );
    let ov = |t: &str, action: Action| Override {
        target: Target::parse(t).unwrap(),
        action,
        reason: "rev2".into(),
        expires_at_ms: None,
        added_at_ms: mailgate::domain::now_ms(),
    };
    l.overrides()
        .add(&ov("ip:198.51.100.77", Action::Deny))
        .await
        .unwrap();
    l.overrides()
        .add(&ov(
            "email:capped@example.com",
            Action::Rules(vec![mailgate::settings::Rule::new(
                Duration::from_secs(3600),
                2,
            )]),
        ))
        .await
        .unwrap();
    l.overrides().reload().await.unwrap();
    // kind 0: denied network; 1: capped mailbox (2); 2: p29's mailbox (3);
    // 3: p05's mailbox (3); 4: plain mailbox (5).
    let mut set = tokio::task::JoinSet::new();
    for n in 0..200usize {
        let l = l.clone();
        set.spawn(async move {
            let kind = n % 5;
            let j = match kind {
                0 => TestJob::new(
                    &format!("x{n}"),
                    &format!("x{n}@deny.example"),
                    Some("198.51.100.77"),
                ),
                1 => TestJob::new(&format!("c{n}"), "capped@example.com", Some("203.0.113.1")),
                2 => TestJob::new(&format!("q{n}"), "late@example.com", Some("203.0.113.2"))
                    .purpose(Some("p29")),
                3 => TestJob::new(&format!("e{n}"), "early@example.com", Some("203.0.113.3"))
                    .purpose(Some("p05")),
                _ => TestJob::new(&format!("d{n}"), "plain@example.com", Some("203.0.113.4")),
            };
            let t = Ticket::new();
            let e = Entry {
                job: j.by(&t),
                expires_at_ms: None,
                made_at_ms: None,
            };
            (
                kind,
                l.admit(&e, Clock::At(7_000_000)).await.map(|a| a.verdict),
            )
        });
    }
    let mut admitted = [0usize; 5];
    let mut failed = Vec::new();
    while let Some(r) = set.join_next().await {
        match r.unwrap() {
            (k, Ok(Verdict::Admitted)) => admitted[k] += 1,
            (_, Ok(Verdict::Rejected { .. })) => {}
            (k, other) => failed.push((k, format!("{other:?}"))),
        }
    }
    assert!(failed.is_empty(), "items failed: {failed:?}");
    assert_eq!(admitted, [0, 2, 3, 3, 5], "admitted per kind");
}

/// The admission times in `mailbox`'s log, oldest first.
async fn logged(l: &RedisLedger, conn: &mut redis::Connection, mailbox: &str) -> Vec<u64> {
    let key = l
        .usage(Subject::Email(&email(mailbox)), None, Clock::Server)
        .await
        .expect("the key's name")
        .key;
    let text: Option<Vec<u8>> = redis::cmd("GET").arg(&key).query(conn).expect("the log");
    times_of(&text.unwrap_or_default())
}

/// A scope log's admission times, oldest first.
fn times_of(text: &[u8]) -> Vec<u64> {
    let entries = mailgate::ledger::scope_log::entries(text).expect("a log");
    entries.iter().rev().map(|(at, _)| *at).collect()
}

/// A scope log forgets what no window can see, and nothing a window can:
/// each write drops the admissions older than the key's keep (its longest
/// window and an hour of slack), however long the log. Every admission
/// younger than the keep stays.
#[tokio::test]
async fn scope_logs_forget_only_what_no_window_sees() {
    let prefix = unique_prefix("trim");
    let _cleanup = RedisCleanup {
        prefix: prefix.clone(),
    };
    let l = RedisLedger::connect(&redis_settings(&prefix), &limits(&[(MIN, 2)], &[]))
        .await
        .unwrap();
    let keep = MIN + HOUR;
    let mut conn = sync_redis();
    let admit = |id: String, mailbox: &'static str, at: u64| {
        let l = l.clone();
        async move {
            let v = TestJob::new(&id, mailbox, None)
                .admit(&l, &Ticket::new(), Clock::At(at))
                .await;
            assert_eq!(v, Verdict::Admitted, "{id} at {at}");
        }
    };
    // Gone once older than keep.
    admit("s1".into(), "short@example.com", 0).await;
    admit("s2".into(), "short@example.com", keep + 1).await;
    assert_eq!(logged(&l, &mut conn, "short@example.com").await, [keep + 1]);
    // A long log: one admission every 2 minutes for 4 hours.
    let mut made = Vec::new();
    for n in 0..120u64 {
        let now = n * 2 * MIN;
        admit(format!("l{n}"), "long@example.com", now).await;
        made.push(now);
        let log = logged(&l, &mut conn, "long@example.com").await;
        assert!(
            log.iter().all(|&t| t + keep > now),
            "at {now} the log holds an admission older than its keep: {log:?}"
        );
        let seen: Vec<u64> = made.iter().copied().filter(|&t| t + keep > now).collect();
        assert!(
            seen.iter().all(|t| log.contains(t)),
            "at {now} an admission younger than the keep is gone: {log:?}"
        );
    }
}

/// A long log under a clock that steps back by less than an hour across an
/// hour boundary (admissions "after now" in the log, each new one placed
/// among them by its time). Each verdict
/// is the exact one (a rule (W, N) has room iff fewer than N admissions,
/// those after now included, are later than now - W); no admission a
/// window can see while the clock is at most an hour behind leaves the
/// log; the log never holds one more than an hour past its keep behind
/// its newest.
#[tokio::test]
async fn scope_logs_survive_a_clock_stepping_back() {
    let prefix = unique_prefix("trimback");
    let _cleanup = RedisCleanup {
        prefix: prefix.clone(),
    };
    let l = RedisLedger::connect(&redis_settings(&prefix), &limits(&[(MIN, 3)], &[]))
        .await
        .unwrap();
    let keep = MIN + HOUR;
    let mut conn = sync_redis();
    let mailbox = "back@example.com";
    // Every 40 s for 4 h 10 min; back 50 min (4:10 -> 3:20); every 40 s
    // for 3 h more.
    let mut times: Vec<u64> = (0..375u64).map(|n| n * 40_000).collect();
    let back = *times.last().unwrap() - 50 * MIN;
    times.extend((0..270u64).map(|n| back + n * 40_000));
    let mut admitted: Vec<u64> = Vec::new();
    for (n, &now) in times.iter().enumerate() {
        let v = TestJob::new(&format!("b{n}"), mailbox, None)
            .admit(&l, &Ticket::new(), Clock::At(now))
            .await;
        let later = admitted.iter().filter(|&&t| t + MIN > now).count();
        match v {
            Verdict::Admitted => {
                assert!(
                    later < 3,
                    "admitted at {now} past (1 min, 3): {later} in the window"
                );
                admitted.push(now);
            }
            Verdict::Rejected { .. } => {
                assert!(later >= 3, "rejected at {now} with {later} in the window")
            }
            other => panic!("{other:?} at {now}"),
        }
        let log = logged(&l, &mut conn, mailbox).await;
        let kept: Vec<u64> = (admitted.iter().copied())
            .filter(|&t| t + keep > now + HOUR)
            .collect();
        assert!(
            kept.iter().all(|t| log.contains(t)),
            "at {now} an admission a window can still see is gone: {log:?}"
        );
        let newest = log.iter().copied().max().unwrap_or(0);
        assert!(
            log.iter().all(|&t| t + keep + HOUR > newest),
            "at {now} the log holds an admission more than an hour past its keep: {log:?}"
        );
    }
    assert!(admitted.len() > 300, "{} admitted", admitted.len());
}

/// What type Redis holds at `key`.
fn type_of(conn: &mut redis::Connection, key: &str) -> String {
    redis::cmd("TYPE").arg(key).query(conn).unwrap()
}

/// Hashes an earlier build wrote: every step of a job's life reads them as
/// before, and the step's write (a send mark, a settle, "answered", a
/// lease lapsed mid-send, a refund that gives the quota back) leaves the
/// record a string, with its expiry.
#[tokio::test]
async fn hashes_of_an_earlier_build_are_read_and_rewritten_as_strings() {
    let built = on_shared_redis("oldrec", LimitSettings::default()).await;
    let (l, prefix) = (built.ledger.clone(), built.prefix().to_owned());
    let mut conn = sync_redis();
    let t0 = 1_790_000_000_000;
    let record = |id: &str| format!("{prefix}job:{id}");

    // Admitted (sending), settled sent, answered: each on a hash.
    let (j1, a) = (TestJob::new("j1", "a@example.com", None), Ticket::new());
    assert_eq!(j1.admit(&l, &a, Clock::At(t0)).await, Verdict::Admitted);
    assert_eq!(type_of(&mut conn, &record("j1")), "string");
    to_hash(&mut conn, &record("j1"));
    assert!(l.settle(&j1.by(&a), &Ending::Sent, false).await.unwrap());
    assert_eq!(type_of(&mut conn, &record("j1")), "string");
    to_hash(&mut conn, &record("j1"));
    assert!(l.answered(&j1.by(&a)).await.unwrap());
    assert_eq!(type_of(&mut conn, &record("j1")), "string");
    to_hash(&mut conn, &record("j1"));
    assert_eq!(
        j1.admit(&l, &Ticket::new(), Clock::At(t0 + 2)).await,
        Verdict::Sent {
            admitted_at_ms: t0,
            by_owner: false,
            answered: true
        }
    );
    // Another job under the same id: a conflict, read from a hash.
    let other = TestJob::new("j1", "someone.else@example.com", None);
    assert_eq!(
        other.admit(&l, &Ticket::new(), Clock::At(t0 + 3)).await,
        Verdict::Conflict
    );

    // Sending when its owner vanished: delivery unknown, never resent.
    let (j2, b) = (TestJob::new("j2", "b@example.com", None), Ticket::new());
    let now = Entry {
        job: j2.by(&b),
        expires_at_ms: None,
        made_at_ms: None,
    };
    let admitted = l.admit(&now, Clock::At(t0)).await.unwrap();
    assert_eq!(admitted.verdict, Verdict::Admitted);
    to_hash(&mut conn, &record("j2"));
    // Well past its lease.
    let late = t0 + 2 * HOUR;
    assert_eq!(
        j2.admit(&l, &Ticket::new(), Clock::At(late)).await,
        Verdict::Unknown {
            by_owner: false,
            answered: false
        }
    );
    assert_eq!(type_of(&mut conn, &record("j2")), "string");

    // A refund on a hash gives the quota back: the mailbox (1 a
    // minute) takes another job at once.
    let (j3, c) = (TestJob::new("j3", "c@example.com", None), Ticket::new());
    assert_eq!(j3.admit(&l, &c, Clock::At(t0)).await, Verdict::Admitted);
    to_hash(&mut conn, &record("j3"));
    let refund = Ending::Refund(Refund::Failed);
    assert!(l.settle(&j3.by(&c), &refund, false).await.unwrap());
    let next = TestJob::new("j4", "c@example.com", None);
    assert_eq!(
        next.admit(&l, &Ticket::new(), Clock::At(t0 + SEC)).await,
        Verdict::Admitted
    );
    to_hash(&mut conn, &record("j3"));
    assert_eq!(
        j3.admit(&l, &c, Clock::At(t0 + 2 * SEC)).await,
        Verdict::Finished {
            how: Refund::Failed,
            answered: false
        }
    );
    // Every record written since it was made a hash is a string; each
    // keeps its expiry (j1 and j3 were only read since).
    for id in ["j1", "j3"] {
        assert_eq!(type_of(&mut conn, &record(id)), "hash", "{id}");
    }
    for id in ["j2", "j4"] {
        assert_eq!(type_of(&mut conn, &record(id)), "string", "{id}");
    }
    for id in ["j1", "j2", "j3", "j4"] {
        let ttl: i64 = redis::cmd("PTTL").arg(record(id)).query(&mut conn).unwrap();
        assert!(ttl > 0, "{id} expires");
    }
}

/// Job ids are the producer's (up to 128 printable characters, `|` and
/// spaces included) and name the record's key, never its fields: ids that
/// look like a record's separators, or like a whole record, go through a
/// job's life apart from each other. A copy of each is answered from its
/// own record, another job under the id is a conflict, and a refund gives
/// back that job's quota and no other's.
#[tokio::test]
async fn ids_that_look_like_records_keep_their_records_apart() {
    let built = on_shared_redis("barids", LimitSettings::default()).await;
    let (l, prefix) = (built.ledger.clone(), built.prefix().to_owned());
    let mut conn = sync_redis();
    let t0 = 1_790_000_000_000;
    let ids = [
        "|",
        "a|b",
        "a|b|",
        "a b",
        "|x| |",
        "ax-|0|t|1:a|c|1|0 1 2 3|fp",
    ];
    let jobs: Vec<(TestJob, Ticket)> = (ids.iter().enumerate())
        .map(|(i, id)| {
            let mail = format!("m{i}@example.com");
            (TestJob::new(id, &mail, None), Ticket::new())
        })
        .collect();
    for (i, (job, ticket)) in jobs.iter().enumerate() {
        let at = t0 + i as u64;
        assert_eq!(
            job.admit(&l, ticket, Clock::At(at)).await,
            Verdict::Admitted
        );
        let record: String = redis::cmd("TYPE")
            .arg(format!("{prefix}job:{}", ids[i]))
            .query(&mut conn)
            .unwrap();
        assert_eq!(record, "string", "{:?}'s record", ids[i]);
    }
    // Every other job sent and answered; the rest refunded.
    for (i, (job, ticket)) in jobs.iter().enumerate() {
        if i % 2 == 0 {
            assert!(
                l.settle(&job.by(ticket), &Ending::Sent, false)
                    .await
                    .unwrap()
            );
            assert!(l.answered(&job.by(ticket)).await.unwrap());
        } else {
            let failed = Ending::Refund(Refund::Failed);
            assert!(l.settle(&job.by(ticket), &failed, false).await.unwrap());
        }
    }
    for (i, (job, ticket)) in jobs.iter().enumerate() {
        let at = t0 + 200 + i as u64;
        let copy = job.admit(&l, &Ticket::new(), Clock::At(at)).await;
        let own = job.admit(&l, ticket, Clock::At(at)).await;
        if i % 2 == 0 {
            let sent = |by_owner| Verdict::Sent {
                admitted_at_ms: t0 + i as u64,
                by_owner,
                answered: true,
            };
            assert_eq!(copy, sent(false), "a copy of {:?}", ids[i]);
            assert_eq!(own, sent(true), "{:?}'s own lineage", ids[i]);
        } else {
            // The refund gave the mailbox's quota back: a copy is admitted
            // anew (the lineage that ended is answered from its record
            // only while it owns it).
            assert_eq!(copy, Verdict::Admitted, "a copy of refunded {:?}", ids[i]);
            assert_ne!(own, Verdict::Admitted, "{:?}'s own lineage", ids[i]);
        }
        let other = TestJob::new(ids[i], "someone.else@example.com", None);
        assert_eq!(
            other.admit(&l, &Ticket::new(), Clock::At(at + 1)).await,
            Verdict::Conflict,
            "another job under {:?}",
            ids[i]
        );
    }
}

/// A bounce suppresses the address exactly as it was spelled to the relay,
/// and never shortens a suppression someone made or one that lasts longer.
#[tokio::test]
async fn a_bounce_keeps_a_longer_or_manual_suppression() {
    let l = on_shared_redis("bounce-keeps", LimitSettings::default()).await;
    let l = &l.ledger;
    let email = |a: &str| mailgate::domain::EmailAddress::parse(a).unwrap();
    l.suppress(
        &email("cc@corp.example"),
        mailgate::ledger::Spelling::Mailbox,
        "manual",
        "complaint",
        None,
    )
    .await
    .unwrap();
    assert_eq!(
        l.bounced(&email("cc@corp.example"), "550 5.1.1", false)
            .await
            .unwrap(),
        mailgate::ledger::Bounced::Suppressed
    );
    let s = l
        .suppression(&email("cc@corp.example"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((s.source.as_str(), s.left_ms), ("manual", None), "{s:?}");

    // A bounce of one spelling is not another's (a +tag an attacker
    // chose, Unicode case, ASCII case: a server may look mailboxes up as
    // written).
    assert_eq!(
        l.bounced(&email("victim+x@corp.example"), "550 5.1.1", false)
            .await
            .unwrap(),
        mailgate::ledger::Bounced::Suppressed
    );
    assert_eq!(
        l.bounced(&email("\u{212a}im@corp.example"), "550 5.1.1", false)
            .await
            .unwrap(),
        mailgate::ledger::Bounced::Suppressed
    );
    assert!(
        l.suppression(&email("victim@corp.example"))
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        l.suppression(&email("kim@corp.example"))
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        l.suppression(&email("VICTIM+X@corp.example"))
            .await
            .unwrap()
            .is_none()
    );
    let tagged = l
        .suppression(&email("victim+x@corp.example"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((tagged.source.as_str(), tagged.exact), ("bounce", true));
    assert!(tagged.left_ms.unwrap() > 29 * 86_400_000);
}

/// Suppressions of versions before 2026-12-02, under `sup:` and the
/// address folded in ASCII case only: one someone made still holds, a
/// bounce (of a spelling a stranger may have chosen) no longer does.
#[tokio::test]
async fn suppressions_of_earlier_versions_hold_but_their_bounces_do_not() {
    let built = on_shared_redis("sup-legacy", LimitSettings::default()).await;
    let (l, prefix) = (built.ledger.clone(), built.prefix().to_owned());
    let mut conn = sync_redis();
    let set = |conn: &mut redis::Connection, key: &str, value: &str| {
        let () = redis::cmd("SET").arg(key).arg(value).query(conn).unwrap();
    };
    // A tagged address (its legacy key is not its mailbox's), by hand.
    set(
        &mut conn,
        &format!("{prefix}sup:pat+x@corp.example"),
        "1 manual by hand",
    );
    // The owner's mailbox, by a stranger's bounce of JANE@.
    set(
        &mut conn,
        &format!("{prefix}sup:jane@corp.example"),
        "1 bounce 5.1.1 no such user",
    );
    let t0: u64 = 1_790_000_000_000;
    let pat = TestJob::new("p1", "Pat+X@corp.example", None);
    assert_eq!(
        pat.admit(&l, &Ticket::new(), Clock::At(t0)).await,
        Verdict::Suppressed
    );
    let jane = TestJob::new("j1", "jane@corp.example", None);
    assert_eq!(
        jane.admit(&l, &Ticket::new(), Clock::At(t0)).await,
        Verdict::Admitted
    );
    let email = |a: &str| mailgate::domain::EmailAddress::parse(a).unwrap();
    assert!(
        l.suppression(&email("jane@corp.example"))
            .await
            .unwrap()
            .is_none()
    );
    let s = l
        .suppression(&email("pat+x@corp.example"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((s.source.as_str(), s.exact), ("manual", false));
}

/// How many times `port`'s Redis ran a script or a function.
fn script_calls(port: u16) -> u64 {
    let stats = redis_cli(port, &["info", "commandstats"]);
    (stats.lines())
        .filter(|l| {
            ["cmdstat_fcall:", "cmdstat_evalsha:", "cmdstat_eval:"]
                .iter()
                .any(|c| l.starts_with(c))
        })
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// What writes nothing is answered from one read of Redis, with no script,
/// once the worker has seen the key full, suppressed or settled (before
/// that, an admission goes straight to the script: most are admitted): a
/// rejection (with its exact wait), a flood of them, a suppression, an
/// expiry, a copy of a job that was sent, one the sender still holds, the
/// owner's own refund and an id taken by another job. A private server
/// counts the script calls. The answers are those of the memory ledger
/// (the conformance suites hold both to them too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_writes_nothing_is_answered_without_a_script() {
    let server = PrivateRedis::start();
    let lim = limits(&[(MIN, 1), (HOUR, 5)], &[(MIN, 5)]);
    let settings = RedisSettings::new(server.url(), "t:");
    let l = RedisLedger::connect(&settings, &lim).await.unwrap();
    let memory = MemoryLedger::new(&lim);
    let t0 = 1_800_000_000_000;
    let (owner, other) = (Ticket::new(), Ticket::new());
    let sent = TestJob::new("s1", "ann@example.com", Some("10.0.0.1"));
    let held = TestJob::new("h1", "bob@example.com", Some("10.0.0.2"));
    let refunded = TestJob::new("r1", "cat@example.com", None);
    for backend in [Backend::Redis(l.clone()), Backend::Memory(memory.clone())] {
        for job in [&sent, &held, &refunded] {
            assert_eq!(
                job.admit(&backend, &owner, Clock::At(t0)).await,
                Verdict::Admitted
            );
        }
        assert!(
            backend
                .settle(&sent.by(&owner), &Ending::Sent, true)
                .await
                .unwrap()
        );
        let failed = Ending::Refund(Refund::Failed);
        assert!(
            backend
                .settle(&refunded.by(&owner), &failed, true)
                .await
                .unwrap()
        );
    }
    let dan = email("dan@example.com");
    l.suppress(
        &dan,
        mailgate::ledger::Spelling::Mailbox,
        "manual",
        "asked",
        None,
    )
    .await
    .unwrap();
    let at = Clock::At(t0 + 20 * SEC);
    let redis = Backend::Redis(l.clone());
    let conflict = TestJob::new("s1", "eve@example.com", None);
    let suppressed = TestJob::new("d1", "dan@example.com", None);
    let late = TestJob::new("e1", "fay@example.com", None);
    let entry = Entry {
        job: late.by(&other),
        expires_at_ms: Some(t0),
        made_at_ms: None,
    };
    let mut before = 0;
    // The first round learns what the keys hold (the conflict, the
    // suppression and the expiry through the script); the second reads.
    for round in 0..2 {
        if round == 1 {
            before = script_calls(server.port);
        }
        let again = sent.admission(&redis, &other, at).await.verdict;
        assert!(
            matches!(
                again,
                Verdict::Sent {
                    by_owner: false,
                    answered: true,
                    ..
                }
            ),
            "{again:?}"
        );
        let busy = held.admission(&redis, &other, at).await.verdict;
        assert!(
            matches!(busy, Verdict::Busy { lease_left_ms } if lease_left_ms > 0),
            "{busy:?}"
        );
        let finished = refunded.admission(&redis, &owner, at).await.verdict;
        let how = Refund::Failed;
        assert_eq!(
            finished,
            Verdict::Finished {
                how,
                answered: true
            }
        );
        assert_eq!(conflict.admit(&redis, &other, at).await, Verdict::Conflict);
        assert_eq!(
            suppressed.admit(&redis, &other, at).await,
            Verdict::Suppressed
        );
        assert_eq!(l.admit(&entry, at).await.unwrap().verdict, Verdict::Expired);
    }
    // Ann's minute: 40 s more, exactly; a flood of ids for her mailbox.
    for n in 0..50 {
        let flood = TestJob::new(&format!("f{n}"), "Ann+flood@example.com", Some("10.9.0.1"));
        let want = Verdict::Rejected {
            retry_after_ms: 40 * SEC,
            rule: mailgate::limiter::RuleRef {
                scope: Scope::Email,
                window_ms: MIN,
                max: 1,
            },
        };
        assert_eq!(flood.admit(&redis, &other, at).await, want, "f{n}");
        assert_eq!(
            flood.admit(&memory, &other, at).await,
            want,
            "f{n} in memory"
        );
    }
    assert_eq!(
        script_calls(server.port),
        before,
        "a script ran for an answer that writes nothing"
    );
    // A new mailbox is written by one call (a commit, with no read
    // first); so is Ann's next admission, read first (her minute was full).
    let new = TestJob::new("n0", "gus@example.com", None);
    assert_eq!(new.admit(&redis, &other, at).await, Verdict::Admitted);
    assert_eq!(script_calls(server.port), before + 1);
    let next = TestJob::new("n1", "ann@example.com", None);
    let then = Clock::At(t0 + MIN);
    assert_eq!(next.admit(&redis, &other, then).await, Verdict::Admitted);
    assert_eq!(script_calls(server.port), before + 2);
}

/// A flood for one new mailbox, 200 jobs at once (a worker takes 256
/// before the first is answered): one of them goes on to be written (a
/// commit: one call), the others wait for its answer at the mailbox's
/// gate (`snapshot::Gates`) and are answered by a snapshot. Exactly 1 is
/// admitted, 199 rejected with a wait within the minute; one call ran,
/// where without the gate every job taken before the first answer did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_for_one_mailbox_sends_one_job_to_the_script() {
    let server = PrivateRedis::start();
    let settings = RedisSettings::new(server.url(), "t:");
    let l = RedisLedger::connect(&settings, &limits(&[(MIN, 1)], &[]))
        .await
        .unwrap();
    let before = script_calls(server.port);
    let mut asked = tokio::task::JoinSet::new();
    for n in 0..200 {
        let l = l.clone();
        asked.spawn(async move {
            let job = TestJob::new(&format!("f{n}"), "victim@example.com", Some("10.9.0.1"));
            job.admit(&l, &Ticket::new(), Clock::Server).await
        });
    }
    let (mut admitted, mut rejected) = (0, 0);
    while let Some(v) = asked.join_next().await {
        match v.unwrap() {
            Verdict::Admitted => admitted += 1,
            Verdict::Rejected {
                retry_after_ms,
                rule,
            } => {
                assert!(
                    retry_after_ms > 0 && retry_after_ms <= MIN,
                    "{retry_after_ms}"
                );
                assert_eq!(rule.scope, Scope::Email);
                rejected += 1;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!((admitted, rejected), (1, 199));
    assert_eq!(
        script_calls(server.port) - before,
        1,
        "one job was written by a call"
    );
}

/// A hot key under 200 concurrent admissions, each read by a snapshot and
/// then the script: one client network's 200 jobs for 200 mailboxes at
/// once, under 5 a minute. Exactly 5 are admitted, every other one is
/// rejected with a wait within the minute, and the log holds 5 entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_key_under_200_concurrent_admissions_admits_exactly_its_max() {
    let built = on_shared_redis("snapshot-hot", limits(&[(MIN, 1)], &[(MIN, 5)])).await;
    let mut asked = tokio::task::JoinSet::new();
    for n in 0..200 {
        let l = built.ledger.clone();
        asked.spawn(async move {
            let job = TestJob::new(
                &format!("j{n}"),
                &format!("u{n}@example.com"),
                Some("10.7.0.1"),
            );
            job.admit(&l, &Ticket::new(), Clock::Server).await
        });
    }
    let (mut admitted, mut rejected) = (0, 0);
    while let Some(v) = asked.join_next().await {
        match v.unwrap() {
            Verdict::Admitted => admitted += 1,
            Verdict::Rejected {
                retry_after_ms,
                rule,
            } => {
                assert!(
                    retry_after_ms > 0 && retry_after_ms <= MIN,
                    "{retry_after_ms}"
                );
                assert_eq!(rule.scope, Scope::Ip);
                rejected += 1;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!((admitted, rejected), (5, 195));
    let log = format!("{}ip:10.7.0.1/32", built.prefix());
    let text: Vec<u8> = redis::cmd("GET")
        .arg(&log)
        .query(&mut sync_redis())
        .unwrap();
    assert_eq!(times_of(&text).len(), 5);
}

/// A Redis frozen (SIGSTOP) as an admission is read first (its mailbox
/// was found full): the job waits (an outage) once the read has taken the
/// time a call may (2 s), not after the read's response timeout and then
/// the script's (found by review: 10 s; before the snapshot, 5 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_redis_does_not_answer_is_an_outage_within_the_time_a_call_may_take() {
    let server = PrivateRedis::start();
    let lim = limits(&[(MIN, 1)], &[(MIN, 5)]);
    let l = RedisLedger::connect(&RedisSettings::new(server.url(), "q:"), &lim)
        .await
        .unwrap();
    let first = TestJob::new("a1", "u@frozen.example", None);
    assert_eq!(
        first.admit(&l, &Ticket::new(), Clock::Server).await,
        Verdict::Admitted
    );
    server.pause();
    let asked = std::time::Instant::now();
    let job = TestJob::new("a2", "u@frozen.example", None);
    let ticket = Ticket::new();
    let entry = Entry {
        job: job.by(&ticket),
        expires_at_ms: None,
        made_at_ms: None,
    };
    let r = l.admit(&entry, Clock::Server).await;
    let took = asked.elapsed();
    server.resume();
    assert!(r.is_err_and(|e| e.is_outage()));
    assert!(
        took < Duration::from_secs(4),
        "an outage took {took:?} to tell"
    );
    // Once Redis answers again, the rejection is read as before.
    let v = job.admit(&l, &ticket, Clock::Server).await;
    assert!(matches!(v, Verdict::Rejected { .. }), "{v:?}");
}
