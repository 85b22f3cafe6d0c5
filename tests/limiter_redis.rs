//! The Redis backend beyond the shared semantics: concurrency against the
//! real server, Redis time, TTLs on every key, and the NOSCRIPT fallback.

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use mailgate::limiter::{Clock, MemoryLimiter, RateLimiter, RedisLimiter, Request, Verdict};
use mailgate::settings::{LimitSettings, RedisSettings};

const EMAILS: [&str; 4] = [
    "a@example.com",
    "b@example.com",
    "c@example.com",
    "d@example.com",
];
const IPS: [&str; 2] = ["198.51.100.1", "2001:db8::1"];

/// 64 tasks hammer a few keys with real Redis time; afterwards no window of
/// any rule holds more admissions than the rule allows.
async fn never_over_limit<L: RateLimiter + Clone + 'static>(
    l: L,
    limits: LimitSettings,
    tag: &str,
) {
    let admitted = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for task in 0..64 {
        let (l, admitted, tag) = (l.clone(), admitted.clone(), tag.to_owned());
        tasks.push(tokio::spawn(async move {
            for i in 0..60 {
                let n = task * 1000 + i;
                let (e, a) = (n % EMAILS.len(), (n / 7) % IPS.len());
                let (jid, mail, addr) = (id(&format!("{tag}-{n}")), email(EMAILS[e]), ip(IPS[a]));
                let req = Request {
                    id: &jid,
                    email: &mail,
                    ip: Some(&addr),
                    purpose: None,
                };
                let d = l.check(&req, Clock::Server).await.expect("decision");
                if d.verdict == Verdict::Admitted {
                    admitted.lock().unwrap().push((d.decided_at_ms, e, a));
                }
                if i % 5 == 0 {
                    tokio::time::sleep(Duration::from_millis(3)).await;
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let admitted = admitted.lock().unwrap().clone();
    assert!(
        admitted.len() >= 2,
        "some requests were admitted: {}",
        admitted.len()
    );
    let windows_ok = |rules: &[mailgate::settings::Rule],
                      key_of: &dyn Fn(&(u64, usize, usize)) -> usize| {
        for &(t, ..) in &admitted {
            for r in rules {
                let w = r.window_ms();
                for key in 0..EMAILS.len() {
                    let n = admitted
                        .iter()
                        .filter(|x| key_of(x) == key && x.0 + w > t && x.0 <= t)
                        .count();
                    assert!(
                        n <= r.max as usize,
                        "{n} admissions in a {w}ms window (max {})",
                        r.max
                    );
                }
            }
        }
    };
    windows_ok(&limits.email.rules, &|x| x.1);
    windows_ok(&limits.ip.rules, &|x| x.2);
}

fn tight_limits() -> LimitSettings {
    limits(&[(50, 1), (300, 3)], &[(40, 2), (250, 6)])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_never_exceed_a_rule() {
    let prefix = unique_prefix("concurrency");
    let _cleanup = RedisCleanup {
        prefix: prefix.clone(),
    };
    let l = RedisLimiter::connect(&redis_settings(&prefix), &tight_limits())
        .await
        .unwrap();
    never_over_limit(l, tight_limits(), "r").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_backend_concurrent_callers_never_exceed_a_rule() {
    never_over_limit(MemoryLimiter::new(&tight_limits()), tight_limits(), "m").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_in_one_instant_admits_exactly_max() {
    let prefix = unique_prefix("burst");
    let _cleanup = RedisCleanup {
        prefix: prefix.clone(),
    };
    let lim = limits(&[(MIN, 3)], &[]);
    let l = RedisLimiter::connect(&redis_settings(&prefix), &lim)
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for n in 0..64 {
        let l = l.clone();
        tasks.push(tokio::spawn(async move {
            let (jid, mail) = (id(&format!("b{n}")), email("victim@example.com"));
            let req = Request {
                id: &jid,
                email: &mail,
                ip: None,
                purpose: None,
            };
            l.check(&req, Clock::At(5_000)).await.unwrap().verdict
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
    let l = RedisLimiter::connect(&redis_settings(&prefix), &LimitSettings::default())
        .await
        .unwrap();
    let (jid, mail) = (id("t1"), email("a@example.com"));
    let req = Request {
        id: &jid,
        email: &mail,
        ip: None,
        purpose: None,
    };
    let d = l.check(&req, Clock::Server).await.unwrap();
    let mut conn = l.connection();
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
    let l = RedisLimiter::connect(&redis_settings(&prefix), &lim)
        .await
        .unwrap();
    for n in 0..200u64 {
        let (jid, mail, addr) = (
            id(&format!("j{n}")),
            email(&format!("u{}@example.com", n % 17)),
            ip(&format!("2001:db8:{}::1", n % 5)),
        );
        let req = Request {
            id: &jid,
            email: &mail,
            ip: Some(&addr),
            purpose: None,
        };
        let d = l.check(&req, Clock::At(n * 7 * SEC)).await.unwrap();
        if n % 3 == 0 && d.verdict == Verdict::Admitted {
            l.mark_sent(&jid).await.unwrap();
        }
        if n % 11 == 0 {
            l.refund(&jid).await.unwrap();
        }
    }
    let keys = cleanup.keys_with_ttl();
    assert!(keys.len() > 20, "the run wrote keys: {}", keys.len());
    let longest = 24 * HOUR as i64;
    for (key, ttl) in keys {
        assert!(key.starts_with(&prefix), "{key} is under the prefix");
        assert!(ttl > 0 && ttl <= longest, "{key} has TTL {ttl}");
        if key.contains(":ip:") {
            assert!(
                ttl <= HOUR as i64,
                "ip keys live for the ip scope's longest window: {key} {ttl}"
            );
        }
    }
}

#[tokio::test]
async fn script_is_reloaded_after_a_flush() {
    let server = PrivateRedis::start();
    let settings = RedisSettings {
        url: server.url(),
        key_prefix: "t:".into(),
    };
    let l = RedisLimiter::connect(&settings, &LimitSettings::default())
        .await
        .unwrap();
    let mut conn = l.connection();
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    let (jid, mail) = (id("j1"), email("a@example.com"));
    let req = Request {
        id: &jid,
        email: &mail,
        ip: None,
        purpose: None,
    };
    let d = l
        .check(&req, Clock::At(0))
        .await
        .expect("EVALSHA falls back to loading the script");
    assert_eq!(d.verdict, Verdict::Admitted);
}

#[test]
fn memory_backend_forgets_idle_keys() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let l = MemoryLimiter::new(&LimitSettings::default());
    rt.block_on(async {
        for n in 0..5_000u64 {
            let (jid, mail, addr) = (
                id(&format!("j{n}")),
                email(&format!("u{n}@example.com")),
                ip(&format!("10.0.{}.{}", n / 250, n % 250)),
            );
            let req = Request {
                id: &jid,
                email: &mail,
                ip: Some(&addr),
                purpose: None,
            };
            l.check(&req, Clock::At(n)).await.unwrap();
        }
    });
    let (keys, jobs) = l.len();
    assert!(keys > 1000 && jobs > 1000);
    l.sweep(5_000 + 24 * HOUR);
    assert!(
        l.is_empty(),
        "everything idle for its longest window is gone: {:?}",
        l.len()
    );
    // The periodic sweep does the same without being asked.
    rt.block_on(async {
        for n in 0..2_048u64 {
            let (jid, mail) = (id(&format!("k{n}")), email(&format!("v{n}@example.com")));
            let req = Request {
                id: &jid,
                email: &mail,
                ip: None,
                purpose: None,
            };
            l.check(&req, Clock::At(n * 2 * 24 * HOUR)).await.unwrap();
        }
    });
    let (keys, jobs) = l.len();
    assert!(
        keys < 1100 && jobs < 1100,
        "idle keys were swept: {keys} {jobs}"
    );
}
