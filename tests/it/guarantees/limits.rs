//! Nobody gets past a limit, and a rejection leaves nothing behind, even
//! when Redis's replies are lost between the steps of a spread ledger or
//! across a batch.

use super::*;

use std::time::{Duration, Instant};

use crate::common;
use crate::common::harness::Harness;
use serde_json::{Value, json};

/// Rejected and invalid jobs leave nothing in Redis, so a flood of them
/// cannot fill it: 100 rejections and an invalid job write no key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejections_leave_nothing_in_redis() {
    let h = Harness::new("nokeys").await;
    let w = h.start_worker().await;
    h.publish(&job("sent", "victim@example.com")).await;
    assert_eq!(h.result().await["status"], "sent");
    let keys = || h.redis_keys().len();
    let before = keys();
    assert_eq!(before, 2, "one job record and one mailbox log");
    for n in 0..100 {
        h.publish(&job(&format!("flood-{n}"), "victim@example.com"))
            .await;
    }
    h.publish(&json!({"id": "bad", "email": "not an address", "code": "1"}))
        .await;
    let results = h.results(101).await;
    assert_eq!(
        results
            .values()
            .filter(|r| r["status"] == "rejected")
            .count(),
        100
    );
    assert_eq!(
        keys(),
        before,
        "100 rejections and an invalid job wrote no key"
    );
    w.stop().await.unwrap();
}

/// Keys spread over the shards (a prefix without a hash tag), one rule of 1
/// mail an hour per mailbox. Job 1's "create" runs and its reply is lost,
/// so the cluster client sends the script again, which finds the record the
/// first run made. Read as "another copy won", that would give job 1's
/// reservation back although its record stands: job 2 (another id, the
/// same mailbox) would then be admitted, and job 1's next copy resume its
/// admission, two sends under a 1-an-hour rule. A create run again answers
/// as the first did, and a failed create whose record Redis then shows
/// keeps its reservations; the test checks that job 2 and job 1's next copy
/// do not both own a send.
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
    let record = cluster.cli(&["get", "lost:sp:job:j1"]);
    let log = cluster.cli(&["get", "lost:sp:email:victim@example.com"]);
    eprintln!("job 1's record: {record:?}; the mailbox's log: {log:?}");

    let v2 = j2.admit(&l, &t2, Clock::Server).await;
    eprintln!("job 2 (same mailbox, 1 an hour): {v2:?}");
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    // Job 1's next copy (its lease wait comes back): same lineage and attempt.
    let v1b = j1.admit(&l, &t1, Clock::Server).await;
    eprintln!("job 1's copy after the lease: {v1b:?}");
    let log = cluster.cli(&["get", "lost:sp:email:victim@example.com"]);
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

/// The same as `spread_a_lost_create_reply_keeps_the_reservations_of_its_record`,
/// end to end: a worker on a spread cluster, 1 mail an hour per mailbox, one
/// SMTP connection (busy with another job, so the victim's job is admitted
/// without a send mark), the reply to its "create" lost once. Without the
/// guard the victim gets two mails within the hour; the test checks that it
/// gets at most one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spread_worker_mails_nobody_past_a_limit_after_a_lost_create_reply() {
    let cluster = CutCluster::start();
    let h = Harness::with("lostspreadlost", |s| {
        s.redis.url = cluster.url().into();
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

/// Spread: the reply to a "reserve" is lost and the cluster client sends it
/// again. Were the first run's reservation never given back (the ledger
/// knowing only the second's time), with a rule of 1 an hour the second run
/// would find it: the job would wait for "its twin", then be rejected by its
/// own phantom reservation for the whole hour, with nothing ever sent. A
/// reserve whose reply was lost is given back by the job's suffix; the test
/// checks that the job's later copies are not rejected by its own
/// reservation.
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
        cluster.cli(&["get", "lost:sr:email:victim@example.com"]),
        cluster.cli(&["get", "lost:sr:job:j1"])
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
/// allow 100). A shape that named a rule set in one character would put an
/// index past 78 past U+007F, two bytes in the script's ARGV, so the script
/// would find that item malformed and fail the whole batch: a job of such a
/// purpose could never be admitted, and every other job whose item shares
/// its batch would fail with it. A shape names each set in two characters;
/// the test checks that a job of purpose p29 is admitted, and that no job of
/// the default purpose fails in a batch it shares with p29's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purpose_past_the_78th_rule_set_is_admitted_in_any_batch() {
    use common::*;
    use mailgate::domain::Ticket;
    use mailgate::ledger::{Entry, Ledger, RedisLedger};
    use mailgate::limiter::Clock;
    use mailgate::settings::RedisSettings;

    let mut lim = limits(&[(HOUR, 5)], &[(HOUR, 50)]);
    lim.domain.rules = rules(&[(HOUR, 500)]).rules;
    let lim = with_30_purposes(lim, (3, 30, 300));
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

/// Failures are not free: one client under the shipped ip rule (5 a
/// minute) probing made-up mailboxes, each refused by the relay, gets 5
/// SMTP transactions, then is rejected by its own scope; the mailboxes
/// (and the domain) get their quota back, so a stranger's failures lock
/// nobody out: the owner of a refused mailbox, asking from elsewhere, is
/// mailed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_count_against_the_client_that_asked() {
    let h = Harness::new("probe-fail").await;
    h.sink
        .refuse_saying("@probe.example", 550, "5.1.1 no such user");
    h.sink
        .refuse_saying("policy@corp.example", 550, "5.7.1 refused by policy");
    let w = h.start_worker().await;
    let probe = |n: usize| {
        json!({"id": format!("p{n}"), "email": format!("made-up{n}@probe.example"),
               "ip": "203.0.113.66", "code": "1234"})
    };
    let started = Instant::now();
    for n in 0..30 {
        h.publish(&probe(n)).await;
    }
    let results = h.results(30).await;
    let count = |status: &str| results.values().filter(|r| r["status"] == status).count();
    assert_eq!((count("failed"), count("rejected")), (5, 25), "{results:?}");
    assert!(
        results
            .values()
            .filter(|r| r["status"] == "rejected")
            .all(|r| r["rule"]["scope"] == "ip"),
        "{results:?}"
    );
    assert_eq!(h.sink.transactions(), 5, "5 probes reached the relay");
    assert!(started.elapsed() < Duration::from_secs(60));
    // A refused mailbox gets its own quota back: its owner, from another
    // network, is judged as if the stranger had never asked.
    h.publish(
        &json!({"id": "s1", "email": "policy@corp.example", "ip": "198.51.100.9", "code": "1"}),
    )
    .await;
    assert_eq!(h.result().await["status"], "failed");
    h.publish(
        &json!({"id": "s2", "email": "Policy@corp.example", "ip": "198.51.100.10", "code": "1"}),
    )
    .await;
    let r = h.result().await;
    assert_eq!(r["status"], "sent", "the mailbox's quota came back: {r}");
    w.stop().await.unwrap();
}
