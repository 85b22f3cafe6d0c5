//! The ledger with its keys spread over a Redis Cluster's shards (a key
//! prefix without a hash tag), where its calls can fail between steps: a
//! failed "create", a lost refund reply, a failover that loses an
//! unacknowledged reservation, copies of one job admitted at once. Each
//! test fails against a ledger that mishandles its case.

use std::time::{Duration, Instant};

use crate::common::*;
use mailgate::domain::Ticket;
use mailgate::ledger::{Ending, Entry, Ledger, LedgerError, RedisLedger, Verdict};
use mailgate::limiter::{Clock, Quotas, Subject};
use mailgate::settings::RedisSettings;

fn signal(pid: &str, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, pid])
        .status()
        .expect("kill runs")
        .success();
    assert!(ok, "kill {sig} {pid}");
}

/// The replica of the primary on `port`.
fn replica_of(port: u16) -> u16 {
    let id = redis_cli(port, &["cluster", "myid"]);
    redis_cli(port, &["cluster", "nodes"])
        .lines()
        .find(|l| l.contains("slave") && l.contains(&id))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|a| a.split('@').next()?.rsplit(':').next()?.parse().ok())
        .expect("a replica")
}

fn pid_of(port: u16) -> String {
    redis_cli(port, &["info", "server"])
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .expect("process_id")
        .trim()
        .to_owned()
}

/// A job id whose record lives on a primary other than `not`.
fn id_not_on(cluster: &PrivateCluster, prefix: &str, tag: &str, not: u16) -> (String, u16) {
    (0..)
        .map(|n| format!("{tag}-{n}"))
        .find_map(|j| {
            let p = cluster.primary_of(&format!("{prefix}job:{j}"))?;
            (p != not).then_some((j, p))
        })
        .expect("an id")
}

/// Attempt 1's "create" fails (the record's primary refuses writes:
/// NOREPLICAS) after its reservations were made. Were they never given
/// back, the job's own retry would be rejected by them: never mailed, quota
/// burned. The test checks that they are given back and attempt 2 is
/// admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_create_gives_its_reservations_back_and_its_retry_is_admitted() {
    let cluster = PrivateCluster::start();
    let lim = limits(&[(HOUR, 1)], &[(HOUR, 5)]);
    let prefix = "rsp:a:";
    let settings = RedisSettings::new(cluster.url(), prefix);
    assert!(settings.spreads_keys());
    let l = RedisLedger::connect(&settings, &lim).await.unwrap();
    let mailbox = "victim@example.com";
    let ekey = l
        .usage(Subject::Email(&email(mailbox)), None, Clock::Server)
        .await
        .unwrap()
        .key;
    let eport = cluster.primary_of(&ekey).unwrap();
    let (jid, rport) = id_not_on(&cluster, prefix, "job", eport);
    println!("email key {ekey} on {eport}; record of {jid} on {rport}");

    // The record's primary refuses writes for a moment (a primary whose
    // replica is away, with min-replicas-to-write; a failover would do too).
    assert_eq!(
        redis_cli(rport, &["config", "set", "min-replicas-to-write", "1"]),
        "OK"
    );
    let job = TestJob::new(&jid, mailbox, None);
    let t = Ticket::new();
    let entry = Entry {
        job: job.attempt(&t, 1),
        expires_at_ms: None,
        made_at_ms: None,
    };
    let first = l.admit(&entry, Clock::Server).await;
    println!("attempt 1: {first:?}");
    assert!(first.is_err(), "the create failed");
    assert_eq!(
        redis_cli(rport, &["config", "set", "min-replicas-to-write", "0"]),
        "OK"
    );
    println!(
        "record exists: {}",
        redis_cli(rport, &["exists", &format!("{prefix}job:{jid}")])
    );
    println!(
        "email log after attempt 1: {:?}",
        redis_cli(eport, &["get", &ekey])
    );

    // The job is retried (a transient failure), the same lineage, attempt 2.
    let entry2 = Entry {
        job: job.attempt(&t, 2),
        ..entry
    };
    let second = l.admit(&entry2, Clock::Server).await.unwrap();
    println!("attempt 2: {second:?}");
    println!(
        "email log after attempt 2: {:?}",
        redis_cli(eport, &["get", &ekey])
    );
    assert_eq!(
        second.verdict,
        Verdict::Admitted,
        "the job, never admitted nor mailed, is rejected by its own leftover reservation"
    );
}

/// min_replicas_acked = 1: a job admitted while its mailbox shard's
/// replica gets nothing. Its send mark's WAIT goes to the record's shard
/// only, so the reservation waits for its own replica: it is given back
/// and the job not sent (it comes back later). The mailbox shard's primary dies, its replica is
/// promoted, and a second job for the mailbox gets the hour's one mail:
/// one mail in all, never two. (A reservation its replica never
/// acknowledged would be lost in the failover, and both jobs mailed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_waits_for_a_replica_so_a_failover_lets_nobody_past_a_rule() {
    let mut cluster = PrivateCluster::start_with(1);
    let lim = limits(&[(HOUR, 1)], &[]);
    let prefix = "rsp:b:";
    let mut settings = RedisSettings::new(cluster.url(), prefix);
    settings.min_replicas_acked = 1;
    assert!(settings.spreads_keys());
    let l = RedisLedger::connect(&settings, &lim).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Err(e) = l.health().await {
        assert!(
            Instant::now() < deadline,
            "ready: every primary has its replica: {e}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mailbox = "victim@example.com";
    let ekey = l
        .usage(Subject::Email(&email(mailbox)), None, Clock::Server)
        .await
        .unwrap()
        .key;
    let eport = cluster.primary_of(&ekey).unwrap();
    let erep = replica_of(eport);
    let (jid, rport) = id_not_on(&cluster, prefix, "first", eport);
    println!("email key on {eport} (replica {erep}); record of {jid} on {rport}");

    // The mailbox shard's replica falls behind (stopped: it gets nothing).
    let rpid = pid_of(erep);
    signal(&rpid, "-STOP");
    // (Its link is cut, as by a partition: nothing waits in its socket.)
    println!(
        "cut: {}",
        redis_cli(eport, &["client", "kill", "type", "replica"])
    );
    let job = TestJob::new(&jid, mailbox, None);
    let t = Ticket::new();
    let entry = Entry {
        job: job.by(&t),
        expires_at_ms: None,
        made_at_ms: None,
    };
    let a = l.admit(&entry, Clock::Server).await;
    println!("job 1 admit: {a:?}");
    let first_mailed = match a {
        // Not acknowledged: given back, nothing sent now.
        Err(LedgerError::Unreplicated(_)) => false,
        Ok(a) if a.verdict == Verdict::Admitted => {
            // ... the mail goes out.
            let settled = l.settle(&job.by(&t), &Ending::Sent, true).await;
            println!("job 1 settled sent: {settled:?}");
            true
        }
        other => panic!("job 1: {other:?}"),
    };

    // The mailbox shard's primary dies; its replica is promoted.
    cluster.kill(eport);
    signal(&rpid, "-CONT");
    tokio::time::sleep(Duration::from_millis(500)).await;
    println!(
        "takeover: {}",
        redis_cli(erep, &["cluster", "failover", "takeover"])
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while cluster.primary_of(&ekey) != Some(erep) {
        assert!(Instant::now() < deadline, "the replica was promoted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The dead node comes back (empty) as the new primary's replica, so
    // min_replicas_acked can be met again.
    cluster.restart(eport);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !redis_cli(erep, &["info", "replication"]).contains("state=online") {
        assert!(
            Instant::now() < deadline,
            "the old primary rejoined as a replica"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "email log on the promoted primary: {:?}",
        redis_cli(erep, &["get", &ekey])
    );

    // Another job for the mailbox, with an SMTP connection free.
    let job2 = TestJob::new("second", mailbox, None);
    let t2 = Ticket::new();
    let entry2 = Entry {
        job: job2.by(&t2),
        expires_at_ms: None,
        made_at_ms: None,
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let second = loop {
        match l.admit(&entry2, Clock::Server).await {
            Ok(a) => break a,
            Err(e) => {
                println!("job 2 (retrying): {e}");
                assert!(Instant::now() < deadline, "the ledger follows the failover");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    };
    println!("job 2 admit: {second:?}");
    let second_mailed = second.verdict == Verdict::Admitted;
    assert!(
        !(first_mailed && second_mailed),
        "a second mail within the hour for a 1-an-hour mailbox, with min_replicas_acked = 1"
    );
    assert!(
        !first_mailed,
        "job 1 waited for the replica it could not have"
    );
}

/// Two copies of one job (a producer's double publish) race: in one slot the
/// loser waits (busy) and ends `duplicate`; spread over shards, the loser
/// can be answered `rejected` (with a whole window to wait) while its
/// twin's mail goes out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_double_publish_is_answered_from_its_twins_record_not_rejected() {
    let cluster = PrivateCluster::start();
    for (name, spread) in [("one slot", false), ("spread", true)] {
        let lim = limits(&[(HOUR, 1)], &[]);
        let url = cluster.url();
        let prefix = if spread { "rsp:c:" } else { "{rsp}:c:" };
        let settings = RedisSettings::new(url, prefix);
        assert_eq!(settings.spreads_keys(), spread);
        let l = RedisLedger::connect(&settings, &lim).await.unwrap();
        let mut tasks = Vec::new();
        for n in 0..200 {
            let l = l.clone();
            tasks.push(tokio::spawn(async move {
                let job = TestJob::new(&format!("dup-{n}"), &format!("m{n}@example.com"), None);
                let (t1, t2) = (Ticket::new(), Ticket::new());
                let e1 = Entry {
                    job: job.by(&t1),
                    expires_at_ms: None,
                    made_at_ms: None,
                };
                let e2 = Entry {
                    job: job.by(&t2),
                    ..e1
                };
                let (a, b) = tokio::join!(l.admit(&e1, Clock::Server), l.admit(&e2, Clock::Server));
                (a.unwrap().verdict, b.unwrap().verdict)
            }));
        }
        let mut counts = std::collections::BTreeMap::<String, usize>::new();
        for t in tasks {
            let (a, b) = t.await.unwrap();
            let short = |v: &Verdict| {
                format!("{v:?}")
                    .split([' ', '{', '('])
                    .next()
                    .unwrap()
                    .to_owned()
            };
            let mut pair = [short(&a), short(&b)];
            pair.sort();
            *counts.entry(pair.join("+")).or_default() += 1;
        }
        println!("{name}: {counts:?}");
        if spread {
            let bad: usize = counts
                .iter()
                .filter(|(k, _)| k.contains("Admitted") && k.contains("Rejected"))
                .map(|(_, n)| n)
                .sum();
            assert_eq!(
                bad, 0,
                "{bad} of 200 double publishes: one copy admitted, its twin rejected"
            );
        }
    }
}

/// A refund (settle, failed) whose reply is lost after it ran (the record's
/// primary stalled past the 5 s response timeout): the pipeline retries the
/// settle, which answers 0 (already refunded). Were that answer to name no
/// reservations, they would never be given back and the quota would stay
/// taken; the settle asked again names them too, and the test checks that
/// the next job for the mailbox is admitted. In one slot the refund forgets
/// the admission in the same script, so the same stall leaks nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_whose_reply_is_lost_still_gives_the_quota_back() {
    let cluster = PrivateCluster::start();
    for (name, prefix) in [("one slot", "{rsp}:d:"), ("spread", "rsp:d:")] {
        let lim = limits(&[(HOUR, 1)], &[]);
        let settings = RedisSettings::new(cluster.url(), prefix);
        let l = RedisLedger::connect(&settings, &lim).await.unwrap();
        let mailbox = "refunded@example.com";
        let ekey = l
            .usage(Subject::Email(&email(mailbox)), None, Clock::Server)
            .await
            .unwrap()
            .key;
        let eport = cluster.primary_of(&ekey).unwrap();
        let (jid, rport) = if settings.spreads_keys() {
            id_not_on(&cluster, prefix, "refund", eport)
        } else {
            ("refund-0".to_owned(), eport)
        };
        let job = TestJob::new(&jid, mailbox, None);
        let t = Ticket::new();
        let entry = Entry {
            job: job.by(&t),
            expires_at_ms: None,
            made_at_ms: None,
        };
        assert_eq!(
            l.admit(&entry, Clock::Server).await.unwrap().verdict,
            Verdict::Admitted
        );
        // The relay refuses the mail (5xx): refund. The record's primary
        // stalls for 6 s meanwhile.
        assert_eq!(
            redis_cli(rport, &["client", "pause", "6000", "write"]),
            "OK"
        );
        let mut tries = Vec::new();
        for _ in 0..6 {
            let r = l
                .settle(
                    &job.by(&t),
                    &Ending::Refund(mailgate::ledger::Refund::Failed),
                    true,
                )
                .await;
            let done = r.is_ok();
            tries.push(format!("{r:?}"));
            if done {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        println!("{name}: settle tries: {tries:?}");
        tokio::time::sleep(Duration::from_secs(1)).await;
        println!("{name}: email log: {:?}", redis_cli(eport, &["get", &ekey]));
        let other = TestJob::new(&format!("{jid}-next"), mailbox, None);
        let v = other.admit(&l, &Ticket::new(), Clock::Server).await;
        println!("{name}: next job for the refunded mailbox: {v:?}");
        assert_eq!(v, Verdict::Admitted, "{name}: the refunded quota came back");
    }
}

/// With the keys spread, one admission has one time: every rejection's
/// wait is exactly what its own `decided_at_ms` and the admission's time
/// imply, in the email scope and in the IP scope (reserved second). Were
/// each scope's entry stamped by its own shard's clock while the admission
/// said the record's (later) time, a later rejection's wait would be 2-3 ms
/// shorter than they imply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejections_wait_follows_exactly_from_the_admissions_time() {
    let cluster = PrivateCluster::start();
    let window = 2_000;
    let settings = RedisSettings::new(cluster.url(), "rsp:w:");
    assert!(settings.spreads_keys());
    let lim = limits(&[(window, 1)], &[(window, 1)]);
    let l = RedisLedger::connect(&settings, &lim).await.unwrap();
    let mut off = Vec::new();
    for n in 0..30 {
        let (mailbox, ip) = (format!("m{n}@example.com"), format!("198.51.100.{n}"));
        let first = TestJob::new(&format!("a{n}"), &mailbox, Some(&ip))
            .admission(&l, &Ticket::new(), Clock::Server)
            .await;
        assert_eq!(first.verdict, Verdict::Admitted, "{first:?}");
        let other_ip = format!("203.0.113.{n}");
        let other_mailbox = format!("other{n}@example.com");
        let same_mailbox = TestJob::new(&format!("b{n}"), &mailbox, Some(&other_ip));
        let same_ip = TestJob::new(&format!("c{n}"), &other_mailbox, Some(&ip));
        for (scope, job) in [("email", same_mailbox), ("ip", same_ip)] {
            let a = job.admission(&l, &Ticket::new(), Clock::Server).await;
            let Verdict::Rejected { retry_after_ms, .. } = a.verdict else {
                panic!("{scope}: {a:?}");
            };
            let implied = first.decided_at_ms + window - a.decided_at_ms;
            if retry_after_ms != implied {
                off.push(format!("{scope} #{n}: {retry_after_ms} against {implied}"));
            }
        }
    }
    assert!(off.is_empty(), "waits off what the times imply: {off:?}");
}

/// With the keys spread, the suppression key lives on a shard of its own:
/// a suppressed mailbox's new job is answered `suppressed` with nothing
/// counted, and an id admitted before the suppression goes on as its record
/// says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suppressed_mailbox_is_heeded_where_the_limiter_would_decide() {
    let cluster = PrivateCluster::start();
    let settings = RedisSettings::new(cluster.url(), "rsp:s:");
    assert!(settings.spreads_keys());
    let lim = limits(&[(60_000, 5)], &[(60_000, 5)]);
    let l = RedisLedger::connect(&settings, &lim).await.unwrap();
    let mailbox = "gone@example.com";
    let before = TestJob::new("s-before", mailbox, Some("198.51.100.1"));
    let owner = Ticket::new();
    let first = before.admission(&l, &owner, Clock::Server).await;
    assert_eq!(first.verdict, Verdict::Admitted, "{first:?}");
    let email = mailgate::domain::EmailAddress::parse(mailbox).unwrap();
    l.suppress(
        &email,
        mailgate::ledger::Spelling::Mailbox,
        "manual",
        "test",
        None,
    )
    .await
    .unwrap();

    let new = TestJob::new("s-new", mailbox, Some("198.51.100.1"));
    let a = new.admission(&l, &Ticket::new(), Clock::Server).await;
    assert_eq!(a.verdict, Verdict::Suppressed, "{a:?}");
    let usage = l
        .usage(Subject::Email(&email), None, Clock::Server)
        .await
        .unwrap();
    assert_eq!(
        usage.rules[0].count, 1,
        "only the admission before it counts"
    );
    // Another copy of the job admitted before: its lease holds, as always.
    let copy = before.admission(&l, &Ticket::new(), Clock::Server).await;
    assert!(matches!(copy.verdict, Verdict::Busy { .. }), "{copy:?}");

    assert!(l.unsuppress(&email).await.unwrap());
    let after = new.admission(&l, &Ticket::new(), Clock::Server).await;
    assert_eq!(after.verdict, Verdict::Admitted, "{after:?}");
}

/// With the keys spread, the shard of a job's network log hangs while its
/// mailbox's answers: the network's rule (1 an hour) binds, the mailbox's
/// (1 a minute) is shorter. Neither a look (`peek`, the job with no SMTP
/// connection free) nor an admission may answer the minute: they fail, an
/// outage, and the job waits (found by review: both answered
/// `retry_after_ms` 59 960 for an hour's wait).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scope_whose_shard_hangs_never_shortens_a_rejection() {
    let cluster = PrivateCluster::start();
    let prefix = "rsp:h:";
    let settings = RedisSettings::new(cluster.url(), prefix);
    let mut lim = limits(&[(60_000, 1)], &[(HOUR, 1)]);
    // (The suppression keys' shard could hang too.)
    lim.suppress = false;
    let l = RedisLedger::connect(&settings, &lim).await.unwrap();
    let (mailbox, ip) = (0..50)
        .flat_map(|m| {
            (1..50).map(move |n| (format!("m{m}@example.com"), format!("198.51.100.{n}")))
        })
        .find(|(m, n)| {
            let (mk, nk) = (format!("{prefix}email:{m}"), format!("{prefix}ip:{n}/32"));
            cluster.primary_of(&mk) != cluster.primary_of(&nk)
        })
        .expect("a mailbox and a network on different shards");
    let first = TestJob::new("h0", &mailbox, Some(&ip));
    assert_eq!(
        first.admit(&l, &Ticket::new(), Clock::Server).await,
        Verdict::Admitted
    );
    let (job, t) = (TestJob::new("h1", &mailbox, Some(&ip)), Ticket::new());
    let entry = Entry {
        job: job.by(&t),
        expires_at_ms: None,
        made_at_ms: None,
    };
    let hour = |v: Option<Verdict>| matches!(v, Some(Verdict::Rejected { retry_after_ms, .. }) if retry_after_ms > 60_000);
    let healthy = l.peek(&entry, Clock::Server).await.unwrap();
    assert!(hour(healthy.map(|a| a.verdict)), "{healthy:?}");
    let port = cluster
        .primary_of(&format!("{prefix}ip:{ip}/32"))
        .expect("the network's shard");
    let pid = pid_of(port);
    signal(&pid, "-STOP");
    let looked = l.peek(&entry, Clock::Server).await;
    let admitted = l.admit(&entry, Clock::Server).await;
    signal(&pid, "-CONT");
    println!("while it hung: {looked:?}, then {admitted:?}");
    match looked {
        Err(e) => assert!(e.is_outage(), "{e}"),
        Ok(a) => assert!(hour(a.map(|a| a.verdict)), "the look: {a:?}"),
    }
    match admitted {
        Err(e) => assert!(e.is_outage(), "{e}"),
        Ok(a) => assert!(hour(Some(a.verdict)), "the admission: {a:?}"),
    }
}
