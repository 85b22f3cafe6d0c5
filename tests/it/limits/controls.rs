//! Operators' controls, end to end with the real worker against the shared
//! RabbitMQ and Redis and an SMTP server inside the test: the domain scope
//! against catch-all code farming, shadow rules, the quota left on a sent
//! result, and superseded codes.

use crate::common;

use std::time::Duration;

use crate::common::harness::Harness;
use mailgate::domain::RegistrableDomain;
use mailgate::ledger::RedisLedger;
use mailgate::limiter::{Clock, Quotas, Subject};
use mailgate::settings::{DomainRules, Rule};
use serde_json::{Value, json};

/// The shipped config's domain rule (50 per 10 minutes) with gmail.com
/// exempt.
fn shipped_domain_scope() -> DomainRules {
    DomainRules {
        rules: vec![Rule::new(Duration::from_secs(600), 50)],
        exempt: vec![RegistrableDomain::parse_exact("gmail.com").unwrap()],
        ..Default::default()
    }
}

/// Job `id` to `email` from `ip`.
fn job(id: &str, email: &str, ip: &str) -> Value {
    json!({"id": id, "email": email, "ip": ip, "code": "493817"})
}

/// A farmer who owns a catch-all domain asks for codes to 200 mailboxes
/// at it (and its sub-domains), from 200 networks: neither the mailbox
/// nor the IP rule binds, the domain rule does, after 50, with the exact
/// wait. The same shape of traffic to gmail.com (exempt) is all sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catch_all_domain_is_limited_and_an_exempt_provider_is_not() {
    let h = Harness::with("catchall", |s| {
        // Exact waits, to check the limiter's exactness (results round
        // them up to whole seconds by default: see
        // `rejections_tell_strangers_whole_seconds`).
        s.limits.result_granularity = Duration::ZERO;
        s.limits.domain = shipped_domain_scope();
        s.amqp.prefetch = 64;
    })
    .await;
    let w = h.start_worker().await;
    for i in 0..200 {
        let mail = format!("u{i}@mx{}.farm-example.co.uk", i % 7);
        // Each from a network of its own (a /24: a network may use only
        // a fifth of the domain's quota; see
        // `a_flood_of_sign_ups_cannot_lock_a_companys_people_out`).
        let from = format!("198.18.{i}.1");
        h.publish(&job(&format!("farm-{i}"), &mail, &from)).await;
    }
    let farm = h.results(200).await;
    let sent: Vec<&Value> = farm.values().filter(|r| r["status"] == "sent").collect();
    assert_eq!(sent.len(), 50, "the domain rule admits 50 per 10 minutes");
    assert_eq!(h.sink.wait_for(50, Duration::from_secs(10)).len(), 50);
    // The rule frees up 10 minutes after the oldest of the 50.
    let oldest = sent
        .iter()
        .map(|r| r["decided_at_ms"].as_u64().unwrap())
        .min()
        .unwrap();
    for r in farm.values().filter(|r| r["status"] != "sent") {
        assert_eq!(r["status"], "rejected", "{r}");
        assert_eq!(
            r["rule"],
            json!({"scope": "domain", "window_ms": 600_000, "max": 50}),
            "{r}"
        );
        let decided = r["decided_at_ms"].as_u64().unwrap();
        assert_eq!(
            r["retry_after_ms"].as_u64(),
            Some(oldest + 600_000 - decided),
            "{r}"
        );
    }
    for i in 0..200 {
        let from = format!("198.19.{}.{}", i / 100, i % 100);
        h.publish(&job(
            &format!("gmail-{i}"),
            &format!("u{i}@gmail.com"),
            &from,
        ))
        .await;
    }
    let gmail = h.results(200).await;
    assert!(
        gmail.values().all(|r| r["status"] == "sent"),
        "{:?}",
        gmail.values().find(|r| r["status"] != "sent")
    );
    assert_eq!(h.sink.wait_for(250, Duration::from_secs(20)).len(), 250);
    let (_, metrics) = common::harness::http_get(w.http, "/metrics").await;
    let by_domain = r#"mailgate_limiter_decisions_total{verdict="rejected",scope="domain",window_ms="600000",max="50"} 150"#;
    assert!(metrics.contains(by_domain), "{metrics}");
    w.stop().await.unwrap();
}

/// An operator tries a stricter rule in shadow first: 2 per hour per
/// mailbox, `enforce = false`. Every job is sent; the one it would have
/// rejected says so in its result and in the metric. Switched to enforce
/// (a restart with the same logs), the rule rejects the next one, with the
/// exact wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_rule_is_counted_then_enforced() {
    let stricter = Rule {
        enforce: false,
        ..Rule::new(Duration::from_secs(3600), 2)
    };
    let mut h = Harness::with("shadow", |s| {
        // Exact waits, to check the limiter's exactness (results round
        // them up to whole seconds by default: see
        // `rejections_tell_strangers_whole_seconds`).
        s.limits.result_granularity = Duration::ZERO;
        s.limits.email.rules = vec![Rule::new(Duration::from_secs(60), 5), stricter];
    })
    .await;
    let w = h.start_worker().await;
    let mut sent = Vec::new();
    for n in 1..=3 {
        h.publish(&job(&format!("s{n}"), "a@example.com", "198.51.100.7"))
            .await;
        let r = h.result().await;
        assert_eq!(r["status"], "sent", "{r}");
        sent.push(r);
    }
    assert_eq!(sent[0]["shadow_rule"], Value::Null);
    assert_eq!(sent[1]["shadow_rule"], Value::Null);
    let rule = json!({"scope": "email", "window_ms": 3_600_000, "max": 2});
    assert_eq!(sent[2]["shadow_rule"], rule, "{}", sent[2]);
    let (_, metrics) = common::harness::http_get(w.http, "/metrics").await;
    let counted =
        r#"mailgate_limiter_shadow_rejections_total{scope="email",window_ms="3600000",max="2"} 1"#;
    assert!(metrics.contains(counted), "{metrics}");
    w.stop().await.unwrap();

    h.settings.limits.email.rules[1].enforce = true;
    let w = h.start_worker().await;
    h.publish(&job("s4", "a@example.com", "198.51.100.7")).await;
    let r = h.result().await;
    assert_eq!(r["status"], "rejected", "{r}");
    assert_eq!(r["rule"], rule, "{r}");
    // The rule frees up an hour after the second newest of the three.
    let second_newest = sent[1]["decided_at_ms"].as_u64().unwrap();
    let decided = r["decided_at_ms"].as_u64().unwrap();
    assert_eq!(
        r["retry_after_ms"].as_u64(),
        Some(second_newest + 3_600_000 - decided)
    );
    assert_eq!(h.sink.wait_for(3, Duration::from_secs(5)).len(), 3);
    w.stop().await.unwrap();
}

/// A `sent` result tells the producer what is left of each scope's quota:
/// the tightest rule, how many more sends it allows, and when its next
/// slot frees (so a sign-up page can say "2 more codes this hour"). A
/// rejection names its rule instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sent_result_says_what_is_left_of_the_quota() {
    let h = Harness::with("quota", |s| {
        // Exact waits, to check the limiter's exactness (results round
        // them up to whole seconds by default: see
        // `rejections_tell_strangers_whole_seconds`).
        s.limits.result_granularity = Duration::ZERO;
        s.limits.email.rules = vec![Rule::new(Duration::from_secs(3600), 3)];
        s.limits.ip.rules = vec![Rule::new(Duration::from_secs(60), 10)];
    })
    .await;
    let w = h.start_worker().await;
    let mut first = None;
    for (n, left) in [(1, 2), (2, 1), (3, 0)] {
        h.publish(&job(&format!("q{n}"), "a@example.com", "198.51.100.9"))
            .await;
        let r = h.result().await;
        assert_eq!(r["status"], "sent", "{r}");
        let decided = r["decided_at_ms"].as_u64().unwrap();
        let since = decided - *first.get_or_insert(decided);
        assert_eq!(
            r["quota"],
            json!([
                {"scope": "email", "window_ms": 3_600_000, "max": 3,
                 "remaining": left, "reset_ms": 3_600_000 - since},
                {"scope": "ip", "window_ms": 60_000, "max": 10,
                 "remaining": left + 7, "reset_ms": 60_000 - since},
            ]),
            "{r}"
        );
    }
    h.publish(&job("q4", "a@example.com", "198.51.100.9")).await;
    let r = h.result().await;
    assert_eq!(r["status"], "rejected", "{r}");
    assert_eq!(r["quota"], Value::Null, "{r}");
    w.stop().await.unwrap();
}

/// The user asks again while the first code waits for its retry: the
/// relay greylisted it (451). With `supersede = true` the newer job is
/// sent, and the older one's retry ends `superseded`, never mailed, its
/// quota refunded: the user holds one code, the right one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_code_waiting_for_its_retry_is_superseded_by_a_newer_one() {
    let h = Harness::with("supersede", |s| {
        s.limits.supersede = true;
        s.limits.email.rules = vec![Rule::new(Duration::from_secs(3600), 5)];
        s.retry.initial = Duration::from_millis(1500);
        s.retry.max = Duration::from_millis(1500);
    })
    .await;
    let w = h.start_worker().await;
    let made = |ago_ms: i64| {
        let t = jiff::Timestamp::now() - jiff::SignedDuration::from_millis(ago_ms);
        t.to_string()
    };
    h.sink.reply_with(&[451]);
    h.publish(
        &json!({"id": "older", "email": "a@example.com", "code": "111111",
        "created_at": made(5_000)}),
    )
    .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while h.sink.transactions() == 0 {
        assert!(std::time::Instant::now() < deadline, "the 451 never came");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    h.publish(
        &json!({"id": "newer", "email": "a@example.com", "code": "222222",
        "created_at": made(0)}),
    )
    .await;
    let results = h.results(2).await;
    assert_eq!(results["newer"]["status"], "sent", "{results:?}");
    let older = &results["older"];
    assert_eq!(
        (older["status"].as_str(), older["attempts"].as_u64()),
        (Some("superseded"), Some(2)),
        "{older}"
    );
    h.no_more_results(Duration::from_millis(500)).await;
    let mails = h.sink.mails_to("a@example.com");
    assert_eq!(mails.len(), 1, "one mail, the newer code");
    assert!(mails[0].data.contains("222222"), "{}", mails[0].data);
    let mailbox = mailgate::domain::EmailAddress::parse("a@example.com").unwrap();
    let ledger = RedisLedger::connect(&h.settings.redis, &h.settings.limits)
        .await
        .unwrap();
    let used = (ledger.usage(Subject::Email(&mailbox), None, Clock::Server))
        .await
        .unwrap();
    assert_eq!(used.rules[0].count, 1, "the older one's quota was refunded");
    let (_, metrics) = common::harness::http_get(w.http, "/metrics").await;
    assert!(
        metrics.contains(r#"mailgate_jobs_total{status="superseded"} 1"#),
        "{metrics}"
    );
    w.stop().await.unwrap();
}

/// A stranger cannot cancel the owner's code. The owner's job waits behind
/// a greylisting relay; another client, from another network, asks for a
/// code for the same mailbox 3 s later. Both codes are mailed: a job is
/// superseded only by a newer job of the same requester (its `session`,
/// else its client network). With sessions, two attempts behind one NAT
/// supersede nothing of each other, and one attempt's own newer job
/// supersedes its older one from wherever it comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_same_requester_supersedes_a_waiting_code() {
    let h = Harness::with("supersede-requester", |s| {
        s.limits.supersede = true;
        s.limits.email.rules = vec![Rule::new(Duration::from_secs(3600), 10)];
        s.retry.initial = Duration::from_millis(1500);
        s.retry.max = Duration::from_millis(1500);
    })
    .await;
    let w = h.start_worker().await;
    let made = |ago_ms: i64| {
        (jiff::Timestamp::now() - jiff::SignedDuration::from_millis(ago_ms)).to_string()
    };
    let greylisted = |n: u64| {
        let h = &h;
        async move {
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while h.sink.transactions() < n {
                assert!(std::time::Instant::now() < deadline, "the 451 never came");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    // Owner and stranger from different networks, no sessions.
    h.sink.reply_with(&[451]);
    h.publish(
        &json!({"id": "owner", "email": "a@example.com", "ip": "198.51.100.7",
                      "code": "111111", "created_at": made(3_000)}),
    )
    .await;
    greylisted(1).await;
    h.publish(
        &json!({"id": "stranger", "email": "a@example.com", "ip": "203.0.113.9",
                      "code": "222222", "created_at": made(0)}),
    )
    .await;
    let r = h.results(2).await;
    assert_eq!(r["stranger"]["status"], "sent", "{r:?}");
    assert_eq!(
        (
            r["owner"]["status"].as_str(),
            r["owner"]["attempts"].as_u64()
        ),
        (Some("sent"), Some(2)),
        "the owner's code is mailed after its retry: {r:?}"
    );
    assert_eq!(h.sink.mails_to("a@example.com").len(), 2);

    // Two attempts behind one NAT: sessions tell them apart.
    let before = h.sink.transactions();
    h.sink.reply_with(&[451]);
    h.publish(
        &json!({"id": "nat-1", "email": "b@example.com", "ip": "198.51.100.8",
                      "session": "signup-1", "code": "333333", "created_at": made(3_000)}),
    )
    .await;
    greylisted(before + 1).await;
    h.publish(
        &json!({"id": "nat-2", "email": "b@example.com", "ip": "198.51.100.8",
                      "session": "signup-2", "code": "444444", "created_at": made(0)}),
    )
    .await;
    let r = h.results(2).await;
    assert_eq!(
        (r["nat-1"]["status"].as_str(), r["nat-2"]["status"].as_str()),
        (Some("sent"), Some("sent")),
        "{r:?}"
    );

    // One attempt's newer job supersedes its older one, from another network.
    let before = h.sink.transactions();
    h.sink.reply_with(&[451]);
    h.publish(
        &json!({"id": "same-1", "email": "c@example.com", "ip": "198.51.100.9",
                      "session": "login-7", "code": "555555", "created_at": made(3_000)}),
    )
    .await;
    greylisted(before + 1).await;
    h.publish(
        &json!({"id": "same-2", "email": "c@example.com", "ip": "203.0.113.10",
                      "session": "login-7", "code": "666666", "created_at": made(0)}),
    )
    .await;
    let r = h.results(2).await;
    assert_eq!(r["same-2"]["status"], "sent", "{r:?}");
    assert_eq!(r["same-1"]["status"], "superseded", "{r:?}");
    w.stop().await.unwrap();
}

/// A result tells a requester no more than whole seconds about the scopes
/// it does not own. A stranger asking for the owner's mailbox is told the
/// wait rounded up to a second, not when the owner asked to the
/// millisecond; the requester's own network is told exactly; `quota` leaves
/// the domain out (how many codes others at the domain got); the worker's
/// log keeps the exact wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejections_tell_strangers_whole_seconds() {
    let h = Harness::with("disclose", |s| {
        s.limits.email.rules = vec![Rule::new(Duration::from_secs(60), 1)];
        s.limits.ip.rules = vec![Rule::new(Duration::from_secs(60), 2)];
    })
    .await;
    let w = h.start_worker().await;
    let job = |id: &str, email: &str, ip: &str| json!({"id": id, "email": email, "ip": ip, "code": "493817"});
    h.publish(&job("owner", "a@example.com", "198.51.100.1"))
        .await;
    let sent = h.result().await;
    assert_eq!(sent["status"], "sent", "{sent}");
    let scopes: Vec<&str> = (sent["quota"].as_array().unwrap().iter())
        .map(|q| q["scope"].as_str().unwrap())
        .collect();
    assert_eq!(scopes, ["email", "ip"], "no domain figures: {sent}");
    let decided = sent["decided_at_ms"].as_u64().unwrap();
    for q in sent["quota"].as_array().unwrap() {
        if q["scope"] == "email" {
            let ends = decided + q["reset_ms"].as_u64().unwrap();
            assert_eq!(ends % 1000, 0, "ends on a whole second: {q}");
        }
    }
    h.publish(&job("stranger", "a@example.com", "203.0.113.5"))
        .await;
    let r = h.result().await;
    assert_eq!(
        (r["status"].as_str(), r["rule"]["scope"].as_str()),
        (Some("rejected"), Some("email")),
        "{r}"
    );
    let ends =
        |r: &Value| r["decided_at_ms"].as_u64().unwrap() + r["retry_after_ms"].as_u64().unwrap();
    let wait = r["retry_after_ms"].as_u64().unwrap();
    assert_eq!(ends(&r) % 1000, 0, "the wait ends on a whole second: {r}");
    assert!((59_000..61_000).contains(&wait), "{r}");
    // Asked again later, the same moment: probes cannot narrow it down.
    tokio::time::sleep(Duration::from_millis(137)).await;
    h.publish(&job("stranger-2", "a@example.com", "203.0.113.6"))
        .await;
    let again = h.result().await;
    assert_eq!(ends(&again), ends(&r), "{again} against {r}");
    // The requester's own network: exact.
    // (The rejection counted nowhere: two more from that network pass.)
    for (id, email) in [("own-1", "b@example.com"), ("own-2", "c@example.com")] {
        h.publish(&job(id, email, "203.0.113.5")).await;
        assert_eq!(h.result().await["status"], "sent");
    }
    h.publish(&job("own-3", "d@example.com", "203.0.113.5"))
        .await;
    let r = h.result().await;
    assert_eq!(r["rule"]["scope"], "ip", "{r}");
    let own = r["retry_after_ms"].as_u64().unwrap();
    assert!(own < 60_000 && own > 50_000, "{r}");
    w.stop().await.unwrap();
}

/// A third party cannot lock a company out. 50 sign-up requests to made-up
/// mailboxes at `smallco.example`, from 10 addresses of one network, take a
/// fifth of the domain's quota (the network's share) and no more, so a new
/// employee signing up from elsewhere gets a code. Whoever floods from
/// enough networks does lock the domain for new sign-ups (the farming
/// defence still cuts at the domain's rule), but not its people: a job the
/// producer marks as going to a known mailbox, and a password reset (the
/// shipped configuration applies the domain scope to sign-ups only), still
/// get through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_sign_ups_cannot_lock_a_companys_people_out() {
    let shipped = mailgate::settings::Settings::load(std::path::Path::new("config/default.toml"))
        .expect("the shipped config");
    let h = Harness::with("lockout", |s| {
        s.limits = shipped.limits.clone();
        s.amqp.prefetch = 64;
    })
    .await;
    let w = h.start_worker().await;
    let sign_up = |id: &str, ip: &str| job(id, &format!("{id}@smallco.example"), ip);
    for n in 0..50 {
        let ip = format!("203.0.113.{}", n / 5);
        h.publish(&sign_up(&format!("flood-{n}"), &ip)).await;
    }
    let flood = h.results(50).await;
    let sent = flood.values().filter(|r| r["status"] == "sent").count();
    assert_eq!(sent, 10, "one network takes its share, a fifth of 50");
    for r in flood.values().filter(|r| r["status"] != "sent") {
        assert_eq!(
            (&r["status"], &r["rule"]),
            (
                &json!("rejected"),
                &json!({"scope": "domain", "window_ms": 600_000, "max": 10})
            ),
            "{r}"
        );
    }
    h.publish(&sign_up("carol", "198.51.100.30")).await;
    let r = h.result().await;
    assert_eq!(
        r["status"], "sent",
        "a new employee elsewhere signs up: {r}"
    );

    // From 39 more networks the domain's own rule fills (10 + 1 + 39).
    for n in 0..45 {
        let ip = format!("198.18.{n}.1");
        h.publish(&sign_up(&format!("farm-{n}"), &ip)).await;
    }
    let farmed = h.results(45).await;
    let sent = farmed.values().filter(|r| r["status"] == "sent").count();
    assert_eq!(sent, 39, "farming is cut at the domain's rule");
    for r in farmed.values().filter(|r| r["status"] != "sent") {
        assert_eq!(
            r["rule"],
            json!({"scope": "domain", "window_ms": 600_000, "max": 50}),
            "{r}"
        );
    }
    // Locked for new sign-ups, not for the company's people.
    h.publish(&sign_up("dave", "198.51.100.31")).await;
    assert_eq!(h.result().await["rule"]["scope"], "domain");
    let mut known = job("known", "alice@smallco.example", "198.51.100.20");
    known["known_mailbox"] = json!(true);
    h.publish(&known).await;
    let r = h.result().await;
    assert_eq!(r["status"], "sent", "a known mailbox gets its code: {r}");
    let mut reset = job("reset", "bob@smallco.example", "198.51.100.21");
    reset["purpose"] = json!("reset_password");
    h.publish(&reset).await;
    let r = h.result().await;
    assert_eq!(r["status"], "sent", "a password reset gets its code: {r}");
    w.stop().await.unwrap();
}
