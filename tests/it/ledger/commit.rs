//! The ledger's compare-and-set admissions (`commit.lua`, op "commit"):
//! it writes an admission the worker decided from a snapshot only if
//! nothing that snapshot saw changed, and otherwise writes nothing and
//! answers `changed`, so the worker asks the script, which decides again.

use crate::common::*;
use mailgate::ledger::scope_log;
use mailgate::store::scripts::LEDGER;

/// `ledger.lua`'s codes a commit answers.
const ADMITTED: i64 = 1;
const EXPIRED: i64 = 2;
const UNMIGRATED: i64 = 12;
const CHANGED: i64 = 13;

const NOW: u64 = 1_790_000_000_000;

/// One commit of one item at `now`: job `id` (its call's id `call`) with suppression key `t:sup:m` and the logs `t:email:m` and
/// `t:ip:n`, each found empty (`None`) or with the head the snapshot read
/// at `seen`; the reply, or the error.
fn commit(
    conn: &mut redis::Connection,
    (now, seen): (u64, u64),
    (id, call): (&str, &str),
    heads: [Option<&str>; 2],
    expires: &str,
) -> Result<Vec<i64>, String> {
    let logs = [("t:email:m", 'A'), ("t:ip:n", 'B')];
    let empty: Vec<_> = (0..2).filter(|&i| heads[i].is_none()).collect();
    let read: Vec<_> = (0..2).filter(|&i| heads[i].is_some()).collect();
    let mut keys = vec![format!("t:job:{id}"), "t:sup:m".to_owned()];
    let mut shape = format!("1{}", empty.len());
    for &i in empty.iter().chain(&read) {
        keys.push(logs[i].0.to_owned());
        shape.push(logs[i].1);
    }
    let mut args: Vec<String> = ["commit", &now.to_string(), "86400000", "30000"]
        .map(str::to_owned)
        .into();
    args.push("90000000 7200000".into());
    let owner = format!("T1|1:ab|{call}");
    args.extend([id, "fp|x", &owner, expires, &seen.to_string()].map(str::to_owned));
    args.push(shape);
    args.extend(
        read.iter()
            .map(|&i| heads[i].unwrap_or_default().to_owned()),
    );
    redis::cmd("EVAL")
        .arg(LEDGER.source())
        .arg(keys.len())
        .arg(&keys)
        .arg(&args)
        .query(conn)
        .map_err(|e: redis::RedisError| e.to_string())
}

/// A log's head as a snapshot reads it: its count and every time.
fn head_of(log: &[u8]) -> String {
    let count = usize::from_str_radix(std::str::from_utf8(&log[..6]).unwrap(), 16).unwrap();
    String::from_utf8(log[..6 + 12 * count].to_vec()).unwrap()
}

fn get(conn: &mut redis::Connection, key: &str) -> Option<Vec<u8>> {
    redis::cmd("GET").arg(key).query(conn).unwrap()
}

/// Every key and its value, to see that a call wrote nothing.
fn everything(conn: &mut redis::Connection) -> Vec<(String, Option<Vec<u8>>)> {
    let mut keys: Vec<String> = redis::cmd("KEYS").arg("*").query(conn).unwrap();
    keys.sort();
    keys.into_iter()
        .map(|k| {
            let v = get(conn, &k);
            (k, v)
        })
        .collect()
}

/// A commit writes the record and every log, stamped with its own clock;
/// run again (its reply lost) it answers as the first time and writes
/// nothing more; every fact that changed since the snapshot (a log
/// written, a record, a suppression, a clock behind the snapshot's) and
/// every malformed value writes nothing.
#[test]
fn a_commit_writes_only_what_its_snapshot_saw() {
    let server = PrivateRedis::start();
    let mut conn = server.connection();
    const NONE: [Option<&str>; 2] = [None, None];
    // Admitted, at the call's instant (later than the snapshot's).
    let got = commit(&mut conn, (NOW + 5, NOW), ("j1", "c1"), NONE, "").unwrap();
    assert_eq!(got, vec![(NOW + 5) as i64, ADMITTED, (NOW + 5) as i64]);
    let record = String::from_utf8(get(&mut conn, "t:job:j1").unwrap()).unwrap();
    assert_eq!(
        record,
        format!("x0-|{}|T1|1:ab|c1|{}||fp|x", NOW + 5 + 30_000, NOW + 5)
    );
    for (key, keep) in [("t:email:m", 90_000_000), ("t:ip:n", 7_200_000)] {
        let log = scope_log::entries(&get(&mut conn, key).unwrap()).unwrap();
        assert_eq!(log, vec![(NOW + 5, "j1".to_owned())], "{key}");
        let ttl: i64 = redis::cmd("PTTL").arg(key).query(&mut conn).unwrap();
        assert!(
            ttl > keep - 60_000 && ttl <= keep,
            "{key} expires with its keep"
        );
    }
    let before = everything(&mut conn);
    // The same call again: admitted as it was, nothing written.
    let again = commit(&mut conn, (NOW + 9, NOW), ("j1", "c1"), NONE, "").unwrap();
    assert_eq!(again, vec![(NOW + 9) as i64, ADMITTED, (NOW + 5) as i64]);
    assert_eq!(everything(&mut conn), before);
    // Another job decided from the logs before j1 was written: changed.
    let stale = commit(&mut conn, (NOW + 9, NOW), ("j2", "c2"), NONE, "").unwrap();
    assert_eq!(stale[1..], [CHANGED, 0]);
    let email = head_of(&get(&mut conn, "t:email:m").unwrap());
    let one_stale = commit(
        &mut conn,
        (NOW + 9, NOW),
        ("j2", "c2"),
        [Some(&email), None],
        "",
    );
    assert_eq!(one_stale.unwrap()[1..], [CHANGED, 0]);
    let wrong = "00000101a0c4506c00";
    let bad_head = commit(
        &mut conn,
        (NOW + 9, NOW),
        ("j2", "c2"),
        [Some(&email), Some(wrong)],
        "",
    );
    assert_eq!(bad_head.unwrap()[1..], [CHANGED, 0]);
    // Another call for j1 (a copy the snapshot saw before j1's record).
    let copy = commit(
        &mut conn,
        (NOW + 9, NOW),
        ("j1", "c3"),
        [Some(&email); 2],
        "",
    );
    assert_eq!(copy.unwrap()[1..], [CHANGED, 0]);
    assert_eq!(everything(&mut conn), before);
    // Decided from the logs as they are now: admitted after j1.
    let fresh = commit(
        &mut conn,
        (NOW + 9, NOW),
        ("j2", "c2"),
        [Some(&email); 2],
        "",
    );
    assert_eq!(fresh.unwrap()[1..], [ADMITTED, (NOW + 9) as i64]);
    assert!(get(&mut conn, "t:job:j2").unwrap().starts_with(b"x0-|"));
    for key in ["t:email:m", "t:ip:n"] {
        let log = scope_log::entries(&get(&mut conn, key).unwrap()).unwrap();
        let ids: Vec<_> = log.iter().map(|(at, id)| (*at, id.as_str())).collect();
        assert_eq!(ids, vec![(NOW + 9, "j2"), (NOW + 5, "j1")], "{key}");
    }
    let before = everything(&mut conn);
    // A clock behind the snapshot's (it stepped back): changed.
    let head = head_of(&get(&mut conn, "t:email:m").unwrap());
    let heads = [Some(head.as_str()); 2];
    let back = commit(&mut conn, (NOW + 10, NOW + 11), ("j3", "c4"), heads, "");
    assert_eq!(back.unwrap()[1..], [CHANGED, 0]);
    assert_eq!(everything(&mut conn), before);
    // Expired by the call's instant: nothing written.
    let late = commit(
        &mut conn,
        (NOW + 20, NOW),
        ("j4", "c5"),
        heads,
        &(NOW + 20).to_string(),
    );
    assert_eq!(late.unwrap()[1..], [EXPIRED, 0]);
    assert_eq!(everything(&mut conn), before);
    // A suppression made since the snapshot: changed.
    let server2 = PrivateRedis::start();
    let mut fresh_conn = server2.connection();
    let _: () = redis::cmd("SET")
        .arg("t:sup:m")
        .arg("1 admin spam")
        .query(&mut fresh_conn)
        .unwrap();
    let sup = commit(&mut fresh_conn, (NOW, NOW), ("j5", "c6"), NONE, "").unwrap();
    assert_eq!(sup[1..], [CHANGED, 0]);
    // A log of an earlier build's form: nothing written.
    let _: () = redis::cmd("DEL")
        .arg("t:sup:m")
        .query(&mut fresh_conn)
        .unwrap();
    let _: () = redis::cmd("ZADD")
        .arg("t:ip:n")
        .arg(1)
        .arg("x")
        .query(&mut fresh_conn)
        .unwrap();
    let ip = Some("00000101a0c4506c00");
    let old = commit(&mut fresh_conn, (NOW, NOW), ("j5", "c6"), [None, ip], "").unwrap();
    assert_eq!(old[1..], [UNMIGRATED, 0]);
    assert_eq!(get(&mut fresh_conn, "t:job:j5"), None);
    assert_eq!(get(&mut fresh_conn, "t:email:m"), None);
    assert_eq!(everything(&mut conn), before);
    // Malformed values: refused, nothing written.
    for (id, call) in [("j6\n", "c7"), ("", "c7"), ("j6", ""), ("j6", "c|7")] {
        let bad = commit(&mut conn, (NOW + 30, NOW), (id, call), NONE, "");
        assert!(bad.is_err(), "{id} {call}: {bad:?}");
        assert_eq!(everything(&mut conn), before, "{id} {call}");
    }
    let bad = commit(&mut conn, (NOW + 30, NOW), ("j6", "c7"), NONE, "soon");
    assert!(bad.is_err(), "{bad:?}");
    assert_eq!(everything(&mut conn), before);
    // An admission no log judges (every scope allowed by an override):
    // its record alone, and no keeps.
    let (now, seen) = ((NOW + 40).to_string(), NOW.to_string());
    let record_alone: Vec<i64> = redis::cmd("EVAL")
        .arg(LEDGER.source())
        .arg(1)
        .arg("t:job:j7")
        .arg(&["commit", &now, "86400000", "30000", ""])
        .arg(&["j7", "fp", "T1|1:ab|c8", "", &seen, "00"])
        .query(&mut conn)
        .unwrap();
    assert_eq!(record_alone[1..], [ADMITTED, (NOW + 40) as i64]);
}

/// Two workers (two ledgers, each believing the network's log empty at
/// first) admit 200 jobs of distinct mailboxes from one network at once,
/// whose rule allows 7 an hour: exactly 7 are admitted, each in the log
/// once, each with its record; every other is rejected with a wait. The
/// commits that lost the race wrote nothing (the log holds exactly the
/// admitted ids).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_racing_for_one_network_admit_exactly_its_max() {
    use mailgate::domain::Ticket;
    use mailgate::ledger::{RedisLedger, Verdict};
    use mailgate::limiter::Clock;
    let prefix = unique_prefix("commit-race");
    let _cleanup = RedisCleanup {
        prefix: prefix.clone(),
    };
    let lim = limits(&[(HOUR, 5)], &[(HOUR, 7)]);
    let mut ledgers = Vec::new();
    for _ in 0..2 {
        let l = RedisLedger::connect(&redis_settings(&prefix), &lim).await;
        ledgers.push(l.unwrap());
    }
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..200 {
        let l = ledgers[n % 2].clone();
        tasks.spawn(async move {
            let job = TestJob::new(
                &format!("r{n}"),
                &format!("u{n}@example.com"),
                Some("198.51.100.9"),
            );
            let verdict = job.admit(&l, &Ticket::new(), Clock::Server).await;
            (n, verdict)
        });
    }
    let mut admitted = Vec::new();
    while let Some(done) = tasks.join_next().await {
        let (n, verdict) = done.unwrap();
        match verdict {
            Verdict::Admitted => admitted.push(format!("r{n}")),
            Verdict::Rejected { retry_after_ms, .. } => assert!(retry_after_ms > 0),
            other => panic!("r{n}: {other:?}"),
        }
    }
    assert_eq!(admitted.len(), 7, "{admitted:?}");
    let mut conn = redis::Client::open(redis_url())
        .unwrap()
        .get_connection()
        .unwrap();
    let log: Vec<u8> = redis::cmd("GET")
        .arg(format!("{prefix}ip:198.51.100.9/32"))
        .query(&mut conn)
        .unwrap();
    let mut ids: Vec<String> = scope_log::entries(&log)
        .unwrap()
        .into_iter()
        .map(|(_, id)| id)
        .collect();
    ids.sort();
    admitted.sort();
    assert_eq!(ids, admitted, "the log holds the admitted, once each");
    for id in &admitted {
        let record: Option<String> = redis::cmd("GET")
            .arg(format!("{prefix}job:{id}"))
            .query(&mut conn)
            .unwrap();
        assert!(record.is_some_and(|r| r.starts_with("x0-|")), "{id}");
    }
}

/// A job admitted by a commit (sending), then sent: its record is
/// written over whole as the script's settle would write it, and a copy
/// is answered `sent`. The same settle again changes nothing and says
/// so; a copy that found the lease lapsed (delivery unknown) is
/// overwritten by the truth; a record that is gone is not written back.
#[tokio::test]
async fn a_sent_settle_writes_the_record_the_script_would() {
    use mailgate::domain::Ticket;
    use mailgate::ledger::{Ending, Entry, Ledger, Verdict};
    use mailgate::limiter::Clock;
    let built = on_shared_redis("commit-settle", limits(&[(HOUR, 5)], &[])).await;
    let (l, prefix) = (&built.ledger, built.prefix().to_owned());
    let mut conn = redis::Client::open(redis_url())
        .unwrap()
        .get_connection()
        .unwrap();
    let record = |conn: &mut redis::Connection, id: &str| -> Option<String> {
        redis::cmd("GET")
            .arg(format!("{prefix}job:{id}"))
            .query(conn)
            .unwrap()
    };
    let entry = |job: &'static TestJob, ticket: &'static Ticket| Entry {
        job: job.by(ticket),
        expires_at_ms: None,
        made_at_ms: None,
    };
    let jobs: &'static [TestJob] = Box::leak(Box::new([
        TestJob::new("s1", "s1@example.com", None),
        TestJob::new("s2", "s2@example.com", None),
        TestJob::new("s3", "s3@example.com", None),
    ]));
    let ticket: &'static Ticket = Box::leak(Box::new(Ticket::new()));
    for job in jobs {
        let a = l.admit(&entry(job, ticket), Clock::Server).await.unwrap();
        assert_eq!(a.verdict, Verdict::Admitted);
    }
    // Sent: the record as the script writes it (st s, lease 0, the rest kept).
    let before = record(&mut conn, "s1").unwrap();
    assert!(before.starts_with("x0-|"), "{before}");
    let done = l.settle(&jobs[0].by(ticket), &Ending::Sent, false).await;
    assert!(done.unwrap());
    let after = record(&mut conn, "s1").unwrap();
    let (_, kept) = before[4..].split_once('|').unwrap();
    assert_eq!(after, format!("s0-|0|{kept}"));
    let copy = jobs[0].admit(l, &Ticket::new(), Clock::Server).await;
    assert!(
        matches!(
            copy,
            Verdict::Sent {
                by_owner: false,
                ..
            }
        ),
        "{copy:?}"
    );
    // Again (its reply lost): the script's settle, the same record.
    let again = l.settle(&jobs[0].by(ticket), &Ending::Sent, false).await;
    assert!(again.unwrap());
    assert_eq!(record(&mut conn, "s1").unwrap(), after);
    // A copy marked it unknown (its lease lapsed): the truth overwrites.
    let unknown = format!("u{}", &record(&mut conn, "s2").unwrap()[1..]);
    let _: () = redis::cmd("SET")
        .arg(format!("{prefix}job:s2"))
        .arg(&unknown)
        .query(&mut conn)
        .unwrap();
    assert!(
        l.settle(&jobs[1].by(ticket), &Ending::Sent, false)
            .await
            .unwrap()
    );
    assert!(record(&mut conn, "s2").unwrap().starts_with("s0-|0|"));
    // Gone (lapsed, or lost to a failover): not written back.
    let _: () = redis::cmd("DEL")
        .arg(format!("{prefix}job:s3"))
        .query(&mut conn)
        .unwrap();
    assert!(
        !l.settle(&jobs[2].by(ticket), &Ending::Sent, false)
            .await
            .unwrap()
    );
    assert_eq!(record(&mut conn, "s3"), None);
}

/// Where its one `EXISTS` finds something, a commit reads those keys as
/// the script does: a log a refund emptied (`''`) is empty, and an earlier
/// version's bounce under a mailbox's key suppresses nothing, so both are
/// admitted; the address's own bounce key suppresses. A log damaged past
/// its head fails its own item before anything of it is written, and the
/// call's other item is admitted and answered.
#[test]
fn a_commit_reads_what_exists_as_the_script_does() {
    let server = PrivateRedis::start();
    let mut conn = server.connection();
    let set = |conn: &mut redis::Connection, key: &str, value: &str| {
        let _: () = redis::cmd("SET").arg(key).arg(value).query(conn).unwrap();
    };
    // One item: job `id`, its bounce key and mailbox key, its one log
    // found empty.
    let item = |id: &str| {
        let keys = [
            format!("t:job:{id}"),
            format!("t:bounced:{id}"),
            format!("t:sup:{id}"),
            format!("t:email:{id}"),
        ];
        let args = [id, "fp", "T1|1:ab|c1", "", "0", "21A"].map(str::to_owned);
        (keys.to_vec(), args.to_vec())
    };
    let commit = |conn: &mut redis::Connection, items: &[(Vec<String>, Vec<String>)]| {
        let keys: Vec<&String> = items.iter().flat_map(|(k, _)| k).collect();
        let args: Vec<&String> = items.iter().flat_map(|(_, a)| a).collect();
        redis::cmd("EVAL")
            .arg(LEDGER.source())
            .arg(keys.len())
            .arg(keys)
            .arg(&["commit", &NOW.to_string(), "86400000", "30000", "90000000"])
            .arg(args)
            .query::<Vec<i64>>(conn)
            .unwrap()
    };
    set(&mut conn, "t:email:emptied", "");
    assert_eq!(
        commit(&mut conn, &[item("emptied")])[1..],
        [ADMITTED, NOW as i64]
    );
    set(&mut conn, "t:sup:old", &format!("{NOW} bounce 5.1.1"));
    assert_eq!(
        commit(&mut conn, &[item("old")])[1..],
        [ADMITTED, NOW as i64]
    );
    set(&mut conn, "t:sup:held", &format!("{NOW} manual spam"));
    assert_eq!(commit(&mut conn, &[item("held")])[1..], [CHANGED, 0]);
    set(&mut conn, "t:bounced:refused", "1");
    assert_eq!(commit(&mut conn, &[item("refused")])[1..], [CHANGED, 0]);
    for id in ["held", "refused"] {
        assert_eq!(get(&mut conn, &format!("t:job:{id}")), None, "{id}");
        assert_eq!(get(&mut conn, &format!("t:email:{id}")), None, "{id}");
    }
    // A log whose count says three entries, which holds two.
    let damaged = "00000301a0c4506fe801a0c4506c00\nx\ny\n";
    set(&mut conn, "t:email:bad", damaged);
    let (mut bad, good) = (item("bad"), item("good"));
    bad.1[5] = "20A".into();
    bad.1.push(damaged[..30].to_owned());
    assert_eq!(
        commit(&mut conn, &[good, bad])[1..],
        [ADMITTED, NOW as i64, UNMIGRATED, 0]
    );
    assert!(get(&mut conn, "t:job:good").is_some());
    assert_eq!(get(&mut conn, "t:job:bad"), None);
    assert_eq!(get(&mut conn, "t:email:bad").unwrap(), damaged.as_bytes());
    // A suppression key of another type, or a record that is not one,
    // behind a clean item: that item alone fails, nothing of it written.
    let _: () = redis::cmd("HSET")
        .arg("t:sup:hashed")
        .arg("f")
        .arg("v")
        .query(&mut conn)
        .unwrap();
    set(&mut conn, "t:job:garbled", "not a record");
    let got = commit(&mut conn, &[item("clean"), item("hashed"), item("garbled")]);
    assert_eq!(
        got[1..],
        [ADMITTED, NOW as i64, UNMIGRATED, 0, UNMIGRATED, 0]
    );
    assert!(get(&mut conn, "t:job:clean").is_some());
    assert_eq!(get(&mut conn, "t:job:hashed"), None);
    assert_eq!(get(&mut conn, "t:email:garbled"), None);
}
