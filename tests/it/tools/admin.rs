//! `mailgate admin purge` against the real RabbitMQ and Redis: it removes
//! one deployment's queues and keys, and nothing of a neighbour whose names
//! begin like its own, nor the application's keys under its prefix; it
//! refuses while anything consumes the queues; it says what it would do
//! without `--yes`; and a second run finds nothing.

use std::collections::BTreeSet;
use std::process::Output;

use lapin::options::{BasicCancelOptions, BasicConsumeOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection};
use mailgate::broker::Topology;
use mailgate::settings::QueueType;
use serde_json::{Value, json};

use crate::common::harness::Harness;
use crate::common::{PrivateCluster, sync_redis};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn succeeded(out: &Output) -> String {
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
}

/// Whether `queue` exists.
async fn exists(h: &Harness, queue: &str) -> bool {
    h.queue_depth(queue).await.is_some()
}

/// Every key that begins with `start` (its glob characters escaped), but
/// the clock watch's canary (it lapses by itself).
fn keys_under(start: &str) -> BTreeSet<String> {
    let mut pattern = String::new();
    for c in start.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{pattern}*"))
        .query(&mut sync_redis())
        .expect("KEYS");
    keys.into_iter()
        .filter(|k| !k.ends_with("{clock}:canary"))
        .collect()
}

/// One job through a worker of `h`'s, answered `sent`; and a suppression.
async fn run_a_job(h: &Harness, id: &str) {
    let w = h.start_worker().await;
    let job = json!({"id": id, "email": "who@example.com", "ip": "203.0.113.7", "code": "424242"});
    h.publish(&job).await;
    assert_eq!(h.result().await["status"], "sent");
    w.stop().await.unwrap();
    succeeded(&h.run_tool(&["suppress", "add", "gone@example.com"]).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_removes_one_deployment_and_nothing_of_its_neighbours() {
    // A prefix with glob characters, and a neighbour whose queue names and
    // prefix begin with this deployment's.
    let mut base = String::new();
    let a = Harness::with("purge", |s| {
        base = s.redis.key_prefix.clone();
        s.redis.key_prefix = format!("{base}a*[1]:");
    })
    .await;
    let b = Harness::with("purge2", |s| {
        s.amqp.jobs_queue = format!("{}2", a.settings.amqp.jobs_queue);
        s.amqp.results_queue = format!("{}2", a.settings.amqp.results_queue);
        s.redis.key_prefix = format!("{}x:", a.settings.redis.key_prefix);
    })
    .await;
    run_a_job(&a, "p1").await;
    succeeded(
        &a.run_tool(&[
            "overrides",
            "add",
            "ip:203.0.113.7",
            "--rule",
            "1h=100",
            "--reason",
            "office",
        ])
        .await,
    );
    run_a_job(&b, "p1").await;
    let jobs = a.settings.amqp.jobs_queue.clone();
    let dead = format!("{jobs}.dead");
    a.publish_to(&dead, b"{}", BasicProperties::default()).await;
    // Queues of earlier settings: one more retry, and the old wait queue,
    // as a worker declared them (waiting queues of these jobs).
    let topology = Topology::new(&a.settings);
    let lane = || topology.lane_arguments(a.settings.amqp.queue_type);
    let durable = QueueDeclareOptions::durable;
    let old = [
        a.declare_with("jobs.retry.5", durable(), lane()).await,
        a.declare_with("jobs.wait", durable(), lane()).await,
    ];
    // The application's keys under the prefix, and one an unescaped glob
    // of it would match.
    let prefix = a.settings.redis.key_prefix.clone();
    let apps = [
        format!("{prefix}app:1"),
        format!("{prefix}jobs"),
        format!("{base}ab1:job:1"),
    ];
    for key in &apps {
        let () = redis::cmd("SET")
            .arg(key)
            .arg("x")
            .query(&mut sync_redis())
            .unwrap();
    }
    let neighbour = keys_under(&b.settings.redis.key_prefix);
    assert!(neighbour.len() >= 4, "{neighbour:?}");
    let mine: BTreeSet<String> = keys_under(&base)
        .difference(&neighbour)
        .filter(|k| !apps.contains(k))
        .cloned()
        .collect();
    for family in ["job:p1", "email:", "ip:", "sup:", "suppressed", "overrides"] {
        let key = format!("{prefix}{family}");
        assert!(
            mine.iter().any(|k| k.starts_with(&key)),
            "{key} in {mine:?}"
        );
    }
    let mut queues = topology.all();
    queues.extend(old);

    // Without --yes: what it would remove, and nothing removed.
    let looked = a.run_tool(&["admin", "purge"]).await;
    assert!(!looked.status.success());
    let (out, err) = (text(&looked.stdout), text(&looked.stderr));
    assert!(
        err.contains("nothing removed; run again with --yes"),
        "{err}"
    );
    assert!(
        out.contains(&format!("would remove queue {dead}  (1 messages)")),
        "{out}"
    );
    assert!(
        out.contains(&format!("would remove queue {jobs}.retry.5 ")),
        "{out}"
    );
    assert!(out.contains("keys: job records"), "{out}");
    assert!(err.contains("other keys under"), "{err}");
    for q in &queues {
        assert!(exists(&a, q).await, "{q} is still there");
    }
    assert!(
        mine.iter().all(|k| keys_under(k).contains(k)),
        "no key removed"
    );

    // With --yes: all of this deployment's, and nothing else.
    let out = succeeded(&a.run_tool(&["admin", "purge", "--yes"]).await);
    assert!(
        out.contains(&format!("removed queue {dead}  (1 messages)")),
        "{out}"
    );
    assert!(
        out.contains(&format!("removed queue {jobs}  (0 messages)")),
        "{out}"
    );
    for q in &queues {
        assert!(!exists(&a, q).await, "{q} is gone");
    }
    for q in Topology::new(&b.settings).all() {
        assert!(exists(&b, &q).await, "the neighbour's {q} stays");
    }
    let left = keys_under(&base);
    let expected: BTreeSet<String> = neighbour
        .union(&apps.iter().cloned().collect())
        .cloned()
        .collect();
    assert_eq!(
        left, expected,
        "only the neighbour's and the application's keys are left"
    );

    // Again: nothing to remove.
    let again = a.run_tool(&["admin", "purge", "--yes", "--json"]).await;
    let report: Value = serde_json::from_str(succeeded(&again).trim()).unwrap();
    assert_eq!(report["queues"], json!([]), "{report}");
    assert_eq!(report["keys"], json!([]), "{report}");
    assert!(text(&again.stderr).contains("nothing to remove"));
}

/// Queues of other deployments whose names look like this one's lanes
/// from earlier settings (their jobs queues named `J.wait` and
/// `J.retry.5`, which settings now refuse, but an earlier version took)
/// are left, with their jobs: only their arguments could prove them this
/// deployment's. And a purge run with the worker's `RUST_LOG` prints no
/// lapin errors for the queues it looks for in vain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_leaves_neighbours_named_like_its_lanes() {
    let a = Harness::new("purgelane").await;
    run_a_job(&a, "n1").await;
    let jobs = a.settings.amqp.jobs_queue.clone();
    let mut neighbours = Vec::new();
    for (suffix, kind) in [
        ("jobs.wait", QueueType::Quorum),
        ("jobs.retry.5", QueueType::Classic),
        ("jobs.wait.64000", QueueType::Quorum),
    ] {
        // As that deployment's worker declared its jobs queue.
        let mut theirs = a.settings.clone();
        theirs.amqp.jobs_queue = format!("{jobs}{}", suffix.trim_start_matches("jobs"));
        theirs.amqp.queue_type = kind;
        let t = Topology::new(&theirs);
        let name =
            (a.declare_with(suffix, QueueDeclareOptions::durable(), t.arguments(&t.jobs))).await;
        assert_eq!(name, t.jobs);
        for i in 0..3 {
            let job = json!({"id": format!("theirs{i}"), "email": "x@example.com", "code": "1"});
            a.publish_to(
                &name,
                job.to_string().as_bytes(),
                BasicProperties::default(),
            )
            .await;
        }
        neighbours.push(name);
    }
    let mut purge = a.command(env!("CARGO_BIN_EXE_mailgate"), &["admin", "purge", "--yes"]);
    purge.env("RUST_LOG", "info");
    let out = tokio::task::spawn_blocking(move || purge.output().unwrap())
        .await
        .unwrap();
    let (stdout, stderr) = (succeeded(&out), text(&out.stderr));
    assert!(
        stdout.contains(&format!("removed queue {jobs}  ")),
        "{stdout}"
    );
    for q in &neighbours {
        assert!(!stdout.contains(&format!("queue {q} ")), "{q}: {stdout}");
        assert!(
            stderr.contains(q.as_str()),
            "{q} named as left alone: {stderr}"
        );
        assert_eq!(a.queue_depth(q).await, Some(3), "{q} keeps its jobs");
    }
    assert!(!stderr.contains("ERROR"), "{stderr}");
    // Settings refuse such names now.
    let mut refused = a.command(env!("CARGO_BIN_EXE_mailgate"), &["check-config"]);
    refused.env("MAILGATE__AMQP__JOBS_QUEUE", &neighbours[1]);
    let out = tokio::task::spawn_blocking(move || refused.output().unwrap())
        .await
        .unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("is named like a retry queue of another jobs queue"),
        "{}",
        text(&out.stderr)
    );
}

/// The same where the neighbours' queues hold the names of this
/// deployment's current waiting queues (`J.retry.1`, `J.wait.250`): they
/// too are removed only where their arguments prove them this
/// deployment's (found by review: both removed, with their jobs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_leaves_neighbours_named_like_its_current_lanes() {
    let a = Harness::new("purgecur").await;
    let jobs = a.settings.amqp.jobs_queue.clone();
    let mut neighbours = Vec::new();
    for suffix in ["jobs.retry.1", "jobs.wait.250"] {
        let mut theirs = a.settings.clone();
        theirs.amqp.jobs_queue = format!("{jobs}{}", suffix.trim_start_matches("jobs"));
        let t = Topology::new(&theirs);
        let name =
            (a.declare_with(suffix, QueueDeclareOptions::durable(), t.arguments(&t.jobs))).await;
        let job = json!({"id": "theirs", "email": "x@example.com", "code": "1"});
        a.publish_to(
            &name,
            job.to_string().as_bytes(),
            BasicProperties::default(),
        )
        .await;
        neighbours.push(name);
    }
    let out = a.run_tool(&["admin", "purge", "--yes"]).await;
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    for q in &neighbours {
        assert!(!stdout.contains(q.as_str()), "{q}: {stdout}");
        assert!(
            stderr.contains(q.as_str()),
            "{q} named as left alone: {stderr}"
        );
        assert_eq!(a.queue_depth(q).await, Some(1), "{q} keeps its job");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_refuses_while_the_queues_are_consumed() {
    let h = Harness::new("purgebusy").await;
    let w = h.start_worker().await;
    let job = json!({"id": "b1", "email": "who@example.com", "code": "424242"});
    h.publish(&job).await;
    assert_eq!(h.result().await["status"], "sent");
    let (jobs, results) = (&h.settings.amqp.jobs_queue, &h.settings.amqp.results_queue);
    let record = format!("{}job:b1", h.settings.redis.key_prefix);

    let refused = h.run_tool(&["admin", "purge", "--yes"]).await;
    assert!(!refused.status.success());
    let err = text(&refused.stderr);
    assert!(err.contains(&format!("{jobs} has 1 consumers")), "{err}");
    // An empty prefix would match every family across the database.
    let mut unprefixed = h.command(env!("CARGO_BIN_EXE_mailgate"), &["admin", "purge", "--yes"]);
    unprefixed.env("MAILGATE__REDIS__KEY_PREFIX", "");
    let refused = tokio::task::spawn_blocking(move || unprefixed.output().unwrap())
        .await
        .unwrap();
    let why = text(&refused.stderr);
    assert!(
        !refused.status.success() && why.contains("key_prefix is empty"),
        "{why}"
    );
    assert!(err.contains("nothing was removed"), "{err}");
    // Without --yes it shows what would go, and that --yes would refuse.
    let looked = h.run_tool(&["admin", "purge"]).await;
    let (out, err) = (text(&looked.stdout), text(&looked.stderr));
    assert!(!looked.status.success());
    assert!(
        out.contains(&format!("would remove queue {jobs} ")),
        "{out}"
    );
    assert!(err.contains("--yes would refuse now"), "{err}");
    assert!(exists(&h, jobs).await && exists(&h, results).await);
    assert!(keys_under(&record).contains(&record), "the record stays");
    w.stop().await.unwrap();

    // The application reads the results queue: refused, unless it is left.
    let reader = Connection::connect(&crate::common::harness::amqp_url(), Default::default())
        .await
        .unwrap();
    let channel = reader.create_channel().await.unwrap();
    let _consumer = channel
        .basic_consume(
            results.as_str().into(),
            "app".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let refused = h.run_tool(&["admin", "purge", "--yes"]).await;
    let err = text(&refused.stderr);
    assert!(
        !refused.status.success() && err.contains(&format!("{results} has 1 consumers")),
        "{err}"
    );
    assert!(err.contains("--keep-results"), "{err}");
    let out = succeeded(
        &h.run_tool(&["admin", "purge", "--yes", "--keep-results"])
            .await,
    );
    assert!(!out.contains(&format!("queue {results} ")), "{out}");
    assert!(!exists(&h, jobs).await && exists(&h, results).await);
    assert!(!keys_under(&record).contains(&record), "the record is gone");
    channel
        .basic_cancel("app".into(), BasicCancelOptions::default())
        .await
        .unwrap();
    let _ = reader.close(200, "bye".into()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_finds_keys_on_every_primary_of_a_cluster() {
    let cluster = PrivateCluster::start();
    let h = Harness::with("purgecl", |s| s.redis.url = cluster.url().into()).await;
    let prefix = h.settings.redis.key_prefix.clone();
    let client =
        redis::cluster::ClusterClient::new(vec![format!("redis://127.0.0.1:{}", cluster.ports[0])])
            .unwrap();
    let mut conn = client.get_async_connection().await.unwrap();
    let ours: Vec<String> = (0..30)
        .map(|n| format!("{prefix}job:{n}"))
        .chain((0..10).map(|n| format!("{prefix}email:m{n}@example.com")))
        .chain([format!("{prefix}{{clock}}"), format!("{prefix}overrides")])
        .collect();
    let theirs = [format!("{prefix}app:1"), format!("{prefix}xjob:1")];
    for key in ours.iter().chain(&theirs) {
        let () = redis::cmd("SET")
            .arg(key)
            .arg("x")
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let on_each = |port: u16| -> BTreeSet<String> {
        let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
            .and_then(|c| c.get_connection())
            .unwrap();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{prefix}*"))
            .query(&mut c)
            .unwrap();
        keys.into_iter().collect()
    };
    let spread = cluster
        .ports
        .iter()
        .filter(|p| !on_each(**p).is_empty())
        .count();
    assert!(spread >= 2, "the keys are on {spread} primaries");

    let out = succeeded(&h.run_tool(&["admin", "purge", "--yes"]).await);
    assert!(out.contains("removed 30 keys: job records"), "{out}");
    assert!(out.contains("removed 10 keys: mailbox logs"), "{out}");
    let left: BTreeSet<String> = cluster.ports.iter().flat_map(|p| on_each(*p)).collect();
    assert_eq!(left, theirs.iter().cloned().collect());
}

/// `admin migrate`: the scope logs an earlier build kept as sorted sets
/// become this build's log strings, with their entries (a failure's kept
/// one too) and their expiry, and a worker then decides by them exactly;
/// without `--yes` nothing changes; it refuses while a worker consumes
/// the jobs; other sorted sets (the newest jobs, the application's) stay;
/// a second run finds nothing to convert.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_converts_an_earlier_builds_logs_and_nothing_else() {
    let h = Harness::new("migrate").await;
    let prefix = h.settings.redis.key_prefix.clone();
    let mut conn = sync_redis();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    // The earlier build's form: score the ms, member "<12 hex ms>:<id>".
    let zadd = |conn: &mut redis::Connection, key: &str, at: u64, member: &str| {
        let _: i64 = redis::cmd("ZADD")
            .arg(key)
            .arg(at)
            .arg(member)
            .query(conn)
            .unwrap();
    };
    let mailbox = format!("{prefix}email:who@example.com");
    let network = format!("{prefix}ip:203.0.113.0/24");
    zadd(
        &mut conn,
        &mailbox,
        now - 30_000,
        &format!("{:012x}:old1", now - 30_000),
    );
    let _: i64 = redis::cmd("PEXPIRE")
        .arg(&mailbox)
        .arg(90_000_000)
        .query(&mut conn)
        .unwrap();
    zadd(
        &mut conn,
        &network,
        now - 50_000,
        &format!("{:012x}:old2\u{1}", now - 50_000),
    );
    zadd(
        &mut conn,
        &network,
        now - 40_000,
        &format!("{:012x}:old3", now - 40_000),
    );
    // A sorted set among the logs that holds no admission: left as it is,
    // said, and no reason to leave the others.
    let odd = format!("{prefix}email:odd@example.com");
    zadd(&mut conn, &odd, 1, "no admission");
    let others = [
        format!("{prefix}newest:login:who@example.com"),
        format!("{prefix}app:z"),
    ];
    for key in &others {
        zadd(&mut conn, key, 1, "j");
    }
    let type_of = |conn: &mut redis::Connection, key: &str| -> String {
        redis::cmd("TYPE").arg(key).query(conn).unwrap()
    };

    // Without --yes: what would change, and nothing changed.
    let looked = h.run_tool(&["admin", "migrate", "--json"]).await;
    assert!(!looked.status.success(), "{}", text(&looked.stderr));
    let said: Value = serde_json::from_str(text(&looked.stdout).trim()).unwrap();
    assert_eq!(said["to_convert"], 3, "{said}");
    assert_eq!(type_of(&mut conn, &mailbox), "zset");

    // Refused while a worker consumes the jobs.
    let w = h.start_worker().await;
    let busy = h.run_tool(&["admin", "migrate", "--yes"]).await;
    assert!(!busy.status.success());
    assert!(
        text(&busy.stderr).contains("consumers"),
        "{}",
        text(&busy.stderr)
    );
    w.stop().await.unwrap();
    assert_eq!(type_of(&mut conn, &mailbox), "zset");

    let done = h.run_tool(&["admin", "migrate", "--yes", "--json"]).await;
    assert!(!done.status.success(), "one was not converted");
    let said: Value = serde_json::from_str(text(&done.stdout).trim()).unwrap();
    assert_eq!(said["converted"], 2, "{said}");
    let not = said["not_converted"].as_array().unwrap();
    assert!(
        not.len() == 1 && not[0].as_str().unwrap().contains(&odd),
        "{said}"
    );
    assert_eq!(type_of(&mut conn, &odd), "zset");
    let _: i64 = redis::cmd("DEL").arg(&odd).query(&mut conn).unwrap();
    let log = |conn: &mut redis::Connection, key: &str| {
        let bytes: Vec<u8> = redis::cmd("GET").arg(key).query(conn).unwrap();
        mailgate::ledger::scope_log::entries(&bytes).expect("a log")
    };
    assert_eq!(
        log(&mut conn, &mailbox),
        [(now - 30_000, "old1".to_owned())]
    );
    assert_eq!(
        log(&mut conn, &network),
        [
            (now - 40_000, "old3".to_owned()),
            (now - 50_000, "old2\u{1}".to_owned())
        ]
    );
    let left: i64 = redis::cmd("PTTL").arg(&mailbox).query(&mut conn).unwrap();
    assert!(left > 89_000_000 && left <= 90_000_000, "{left}");
    for key in &others {
        assert_eq!(type_of(&mut conn, key), "zset", "{key}");
    }

    // A worker decides by the converted log: the mailbox's minute is full.
    let w = h.start_worker().await;
    let job =
        json!({"id": "m1", "email": "who@example.com", "ip": "198.51.100.7", "code": "424242"});
    h.publish(&job).await;
    let r = h.result().await;
    assert_eq!(r["status"], "rejected", "{r}");
    // Exactly the converted entry's minute: it ends 60 s after the entry,
    // told rounded up to the whole second (limits.result_granularity, for
    // the mailbox's scope), from the moment it was decided.
    let wait = r["retry_after_ms"].as_u64().unwrap();
    let decided = r["decided_at_ms"].as_u64().unwrap();
    let ends = (now - 30_000 + 60_000).div_ceil(1_000) * 1_000;
    assert_eq!(wait, ends - decided, "{r}");
    assert_eq!(r["rule"]["scope"], "email", "{r}");
    w.stop().await.unwrap();

    let again = succeeded(&h.run_tool(&["admin", "migrate", "--json"]).await);
    let said: Value = serde_json::from_str(again.trim()).unwrap();
    assert_eq!(said["to_convert"], 0, "{said}");
    let _: i64 = redis::cmd("DEL").arg(&others[1]).query(&mut conn).unwrap();
}
