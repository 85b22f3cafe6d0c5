//! The ledger's batches as a Redis Function (FCALL of `LEDGER_LIBRARY`)
//! against the same code as a script (EVALSHA of `LEDGER`): the function
//! keeps state between calls (rule sets by their text, the member memo),
//! which must never change an answer; and what a worker in function mode
//! relies on (the user may call the function; malformed calls write
//! nothing there too).

use std::collections::BTreeMap;

use crate::common::*;
use mailgate::domain::Ticket;
use mailgate::ledger::{Entry, Ledger, RedisLedger};
use mailgate::limiter::Clock;
use mailgate::settings::RedisSettings;
use mailgate::store::scripts::{LEDGER, LEDGER_LIBRARY};

/// A small deterministic generator (xorshift64*).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick<'a, T>(&mut self, of: &'a [T]) -> &'a T {
        &of[self.below(of.len() as u64) as usize]
    }
}

/// One call's reply, errors without the line they came from (a script
/// and a function number their lines differently).
fn run(conn: &mut redis::Connection, cmd: &mut redis::Cmd) -> Result<redis::Value, String> {
    cmd.query(conn).map_err(|e: redis::RedisError| {
        let e = e.to_string().replace("user_function:", "user_script:");
        let e = e.split(" script:").next().unwrap_or_default();
        match e.split_once("user_script:") {
            Some((head, rest)) => format!(
                "{head}{}",
                rest.trim_start_matches(|c: char| c.is_ascii_digit())
            ),
            None => e.to_owned(),
        }
    })
}

/// Every key's type, content and whether it expires.
fn dump(conn: &mut redis::Connection) -> BTreeMap<String, (String, redis::Value, bool)> {
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(conn).unwrap();
    keys.into_iter()
        .map(|k| {
            let t: String = redis::cmd("TYPE").arg(&k).query(conn).unwrap();
            let mut read = redis::cmd(match t.as_str() {
                "zset" => "ZRANGE",
                "hash" => "HGETALL",
                _ => "GET",
            });
            read.arg(&k);
            if t == "zset" {
                read.arg(0).arg(-1).arg("WITHSCORES");
            }
            let v: redis::Value = read.query(conn).unwrap();
            let ttl: i64 = redis::cmd("PTTL").arg(&k).query(conn).unwrap();
            (k, (t, v, ttl > 0))
        })
        .collect()
}

/// Random batches (rule sets reused across calls at other places, deny,
/// shadow and large-N rules, more distinct sets than the function keeps,
/// a clock that steps back, now and then a malformed value) answer and
/// write the same through the function as through the script.
#[test]
fn the_function_answers_and_writes_as_the_script_does() {
    let (a, b) = (PrivateRedis::start(), PrivateRedis::start());
    let (mut ca, mut cb) = (a.connection(), b.connection());
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(LEDGER.source())
        .query(&mut ca)
        .unwrap();
    let _: redis::Value = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(LEDGER_LIBRARY.source())
        .query(&mut cb)
        .unwrap();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut pool: Vec<Vec<String>> = Vec::new();
    let mut now: i64 = 1_790_000_000_000;
    // Ids may hold `|` and spaces (a record's fields go by `|`: only its key
    // and its fingerprint hold them, and here the fingerprint is the id).
    let ids = ["a", "b|c", "d e", "|", "e|"];
    let scopes = ["t:s:1", "t:s:2", "t:s:3"];
    let digit = |i: u64| char::from(48 + u8::try_from(i).unwrap());
    for call in 0..2500 {
        now += *rng.pick(&[0, 1, 10, 500, 1000, 3000, 20_000, -2000]);
        let mut set = |rng: &mut Rng, now: i64| -> Vec<String> {
            if !pool.is_empty() && rng.below(10) < 8 {
                return rng.pick(&pool).clone();
            }
            let mut s = if rng.below(8) == 0 {
                let until = if rng.below(2) == 0 {
                    0
                } else {
                    now + 5000 - rng.below(8000) as i64
                };
                vec!["1".into(), "3660000".into(), until.to_string(), "0".into()]
            } else {
                let n = rng.below(4);
                let mut s = vec![n.to_string(), "3660000".into()];
                for _ in 0..n {
                    s.push(rng.pick(&["1000", "5000", "60000"]).to_string());
                    s.push(
                        rng.pick(&["1", "2", "3", "17", "18", "-1", "-2", "-17"])
                            .to_string(),
                    );
                }
                s
            };
            s.shrink_to_fit();
            pool.push(s.clone());
            if pool.len() > 1500 {
                pool.remove(0);
            }
            s
        };
        let r = 1 + rng.below(3);
        // The settings: each an argument of the script's, words of one
        // argument of the function's.
        let mut settings: Vec<String> = vec!["86400000".into(), "30000".into()];
        settings.push(r.to_string());
        for _ in 0..r {
            settings.extend(set(&mut rng, now));
        }
        let extra = rng.below(3);
        settings.push(extra.to_string());
        let mut named: Vec<u64> = (1..=r).collect();
        for e in 0..extra {
            let at = r + 1 + 2 * e + rng.below(2);
            named.push(at);
            settings.push(at.to_string());
            settings.extend(set(&mut rng, now));
        }
        let mut args: Vec<String> = Vec::new();
        let mut keys: Vec<String> = Vec::new();
        for _ in 0..1 + rng.below(5) {
            let id = *rng.pick(&ids);
            let (ticket, attempt) = (*rng.pick(&["tk1", "tk2"]), *rng.pick(&["1:a", "2:b"]));
            keys.push(format!("t:job:{id}"));
            let call_id = format!("c{:x}", rng.below(8));
            match rng.below(7) {
                0..=3 => {
                    let mut shape = String::new();
                    for s in scopes.iter().take(rng.below(4) as usize) {
                        let set = *rng.pick(&named);
                        shape.push(digit(set / 64));
                        shape.push(digit(set % 64));
                        keys.push((*s).to_owned());
                    }
                    let expires = match rng.below(4) {
                        0 => (now + 5000).to_string(),
                        1 => (now - 1).to_string(),
                        _ => String::new(),
                    };
                    let flag = call_id.clone();
                    let fp = if rng.below(20) == 0 { "o|ther" } else { id };
                    args.extend(
                        [
                            "admit", id, fp, ticket, attempt, &flag, &expires, &shape, "",
                        ]
                        .map(String::from),
                    );
                }
                4 => args.extend(["release", ticket, attempt].map(String::from)),
                5 => {
                    let n = rng.below(3) as usize;
                    keys.extend(scopes.iter().take(n).map(|s| (*s).to_owned()));
                    let how = rng.pick(&["s", "u", "e", "f", "i", "p"]).to_string();
                    let answered = rng.pick(&["0", "1"]).to_string();
                    args.extend([
                        "settle".to_owned(),
                        ticket.to_owned(),
                        attempt.to_owned(),
                        id.to_owned(),
                        how,
                        answered,
                        n.to_string(),
                    ]);
                }
                _ => args.extend(["answered", ticket].map(String::from)),
            }
        }
        // Now and then a malformed value, among the settings or the items.
        let mut bad_settings = false;
        if rng.below(20) == 0 {
            let bad = rng.pick(&["", "x", "nan", "1.5", "-1"]).to_string();
            let at = rng.below((settings.len() + args.len()) as u64) as usize;
            match settings.get_mut(at) {
                Some(s) => (*s, bad_settings) = (bad, true),
                None => args[at - settings.len()] = bad,
            }
        }
        let head = ["batch".to_owned(), now.to_string()];
        let by_script = run(
            &mut ca,
            redis::cmd("EVALSHA")
                .arg(&sha)
                .arg(keys.len())
                .arg(&keys)
                .arg(&head)
                .arg(&settings)
                .arg(&args),
        );
        let by_function = run(
            &mut cb,
            redis::cmd("FCALL")
                .arg(LEDGER_LIBRARY.function())
                .arg(keys.len())
                .arg(&keys)
                .arg(&head)
                .arg(settings.join(" "))
                .arg(&args),
        );
        match (&by_script, &by_function) {
            // Malformed settings: both refuse, each saying why in its own
            // words, and write nothing.
            (Err(_), Err(_)) if bad_settings => {}
            _ => assert_eq!(by_script, by_function, "call {call}: {settings:?} {args:?}"),
        }
        assert_eq!(
            dump(&mut ca),
            dump(&mut cb),
            "call {call}: {keys:?} {args:?}"
        );
    }
}

/// Whole numbers spelled as Redis's commands do not take them ("60000.0",
/// "6e4", hex): a set's keep and the record's keep pass the checks as
/// whole, and PEXPIRE refuses them after ZADD or HSET wrote, leaving a log
/// entry or a record that never expires. Refused before the first write,
/// through the script and the function alike.
#[test]
fn whole_numbers_spelled_otherwise_write_nothing() {
    let server = PrivateRedis::start();
    let mut conn = server.connection();
    let _: redis::Value = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(LEDGER_LIBRARY.source())
        .query(&mut conn)
        .unwrap();
    let item = ["admit", "a", "fp", "tk", "1:a", "c1", "", "01", ""];
    // What is spelled otherwise, the record's keep and the set's keep.
    let calls = [
        ("a set's keep 60000.0", "86400000", "60000.0"),
        ("a set's keep 6e4", "86400000", "6e4"),
        ("a set's keep 0x1D4C0", "86400000", "0x1D4C0"),
        ("the record's keep 86400000.0", "86400000.0", "60000"),
        ("the record's keep 8.64e7", "8.64e7", "60000"),
    ];
    for (what, record_keep, set_keep) in calls {
        let settings = [record_keep, "30000", "1", "1", set_keep, "60000", "1", "0"];
        for how in ["EVAL", "FCALL"] {
            let _: () = redis::cmd("FLUSHDB").query(&mut conn).unwrap();
            let mut cmd = redis::cmd(how);
            match how {
                "EVAL" => cmd.arg(LEDGER.source()),
                _ => cmd.arg(LEDGER_LIBRARY.function()),
            };
            cmd.arg(2)
                .arg(&["t:job:a", "t:email:a"])
                .arg(&["batch", ""]);
            match how {
                "EVAL" => cmd.arg(&settings),
                _ => cmd.arg(settings.join(" ")),
            };
            let r: redis::RedisResult<redis::Value> = cmd.arg(&item).query(&mut conn);
            let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
            assert!(r.is_err(), "{how}, {what}: must be refused");
            assert!(keys.is_empty(), "{how}, {what}: {r:?} left {keys:?}");
        }
    }
}

/// A user that may load the function library but not call it (an ACL
/// without FCALL) is served by the script: the worker probes a call at
/// start, and readiness probes what the batches run, so it is never ready
/// while every job's admission fails.
#[tokio::test]
async fn a_user_that_may_load_functions_but_not_call_them_is_served_by_the_script() {
    let server = PrivateRedis::start();
    let mut conn = server.connection();
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "nofcall", "on", ">pw", "~*", "+@all", "-fcall"])
        .query(&mut conn)
        .unwrap();
    let url = format!("redis://nofcall:pw@127.0.0.1:{}/0", server.port);
    let limits = limits(&[(MIN, 1)], &[]);
    let settings = RedisSettings::new(url, "t:");
    let l = RedisLedger::connect(&settings, &limits)
        .await
        .expect("a user that may load functions but not call them is served by the script");
    l.health()
        .await
        .expect("ready: readiness calls what the batches call");
    let job = TestJob::new("j1", "a@example.com", None);
    let ticket = Ticket::new();
    let entry = Entry {
        job: job.by(&ticket),
        expires_at_ms: None,
        made_at_ms: None,
    };
    let admitted = l.admit(&entry, Clock::At(0)).await;
    assert!(
        admitted.is_ok(),
        "ready, so the admission works: {:?}",
        admitted.err()
    );
}

/// A batch whose second admission meets a scope log of an earlier build's
/// form (a sorted set, before `mailgate admin migrate`): that item answers
/// `unmigrated` and writes nothing, while the first item is admitted as
/// usual and answered (the call does not fail after the first item wrote,
/// which would leave its admission without its reply: "delivery unknown",
/// never sent). Through the script and the function alike; and the
/// ledger takes `unmigrated` for an outage (the job waits).
#[tokio::test]
async fn an_unmigrated_log_fails_its_item_alone() {
    let server = PrivateRedis::start();
    let mut conn = server.connection();
    let _: redis::Value = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(LEDGER_LIBRARY.source())
        .query(&mut conn)
        .unwrap();
    let settings = ["86400000", "30000", "1", "1", "3660000", "60000", "1", "0"];
    let items = [
        ["admit", "a", "fpa", "tk", "1:a", "c1", "", "01", ""],
        ["admit", "b", "fpb", "tk", "1:a", "c2", "", "01", ""],
    ];
    for how in ["EVAL", "FCALL"] {
        let _: () = redis::cmd("FLUSHDB").query(&mut conn).unwrap();
        let _: i64 = redis::cmd("ZADD")
            .arg(&["t:email:b", "1", "000000000001:old"])
            .query(&mut conn)
            .unwrap();
        let mut cmd = redis::cmd(how);
        match how {
            "EVAL" => cmd.arg(LEDGER.source()),
            _ => cmd.arg(LEDGER_LIBRARY.function()),
        };
        cmd.arg(4)
            .arg(&["t:job:a", "t:email:a", "t:job:b", "t:email:b"])
            .arg(&["batch", "1790000000000"]);
        match how {
            "EVAL" => cmd.arg(&settings),
            _ => cmd.arg(settings.join(" ")),
        };
        for item in &items {
            cmd.arg(item);
        }
        let reply: Vec<i64> = cmd.query(&mut conn).expect("the call answers every item");
        // now; item 1: admitted (code 1, 4 values) then item 2:
        // unmigrated (code 12, no value); then item 1's room (3 values).
        assert_eq!(reply[1], 8 + 4, "{how}: {reply:?}");
        assert_eq!(reply[6], 12 * 8, "{how}: {reply:?}");
        let exists: i64 = redis::cmd("EXISTS")
            .arg(&["t:job:a", "t:email:a", "t:job:b"])
            .query(&mut conn)
            .unwrap();
        assert_eq!(exists, 2, "{how}: item 1 wrote, item 2 nothing");
        let kind: String = redis::cmd("TYPE")
            .arg("t:email:b")
            .query(&mut conn)
            .unwrap();
        assert_eq!(kind, "zset", "{how}");
    }
    // Through the ledger: an outage, the job waits.
    let l = RedisLedger::connect(
        &RedisSettings::new(server.url(), "t:"),
        &limits(&[(MIN, 1)], &[]),
    )
    .await
    .unwrap();
    let job = TestJob::new("b", "b@example.com", None);
    let _: i64 = redis::cmd("ZADD")
        .arg(&["t:email:b@example.com", "1", "000000000001:old"])
        .query(&mut conn)
        .unwrap();
    let ticket = Ticket::new();
    let entry = Entry {
        job: job.by(&ticket),
        expires_at_ms: None,
        made_at_ms: None,
    };
    let err = l
        .admit(&entry, Clock::At(1_790_000_000_000))
        .await
        .unwrap_err();
    assert!(err.is_outage(), "{err:?}");
    assert!(err.to_string().contains("mailgate admin migrate"), "{err}");
}
