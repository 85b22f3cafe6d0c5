//! Redis's clock steps: nothing is decided while a primary's clock
//! disagrees with the worker's, and once Redis's clock ran more than the
//! hour keys outlive their use ahead (Redis expired the canary early),
//! every worker is held back until whatever Redis deleted would have
//! expired anyway (or an operator accepts it).
//! Against a private `redis-server` whose wall clock `tests/clockshift.c`
//! moves, the shared RabbitMQ and an in-process SMTP server.

use crate::common;

use std::time::{Duration, Instant};

use crate::common::harness::{Harness, WorkerHandle, http_get};
use serde_json::json;

const HOUR_MS: i64 = 3_600_000;

/// Waits until `/readyz` answers `status` with `words` in its body.
async fn readyz_until(w: &WorkerHandle, status: u16, words: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (s, body) = http_get(w.http, "/readyz").await;
        if s == status && body.contains(words) {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "readyz never said {status} {words:?}: {s} {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A worker within the slack: while Redis's clock is 30 minutes ahead no job
/// is taken, `/readyz` says why, and once it is back the job waiting is
/// mailed and the first job, published again, is a duplicate (its record
/// outlived the step).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_within_the_slack_holds_the_worker_and_loses_no_record() {
    let redis = common::PrivateRedis::start_shiftable();
    let url = redis.url();
    let h = Harness::with("clockstep", |s| s.redis.url = url.clone().into()).await;
    let w = h.start_worker().await;
    let first = json!({"id": "c1", "email": "owner@example.com", "code": "1"});
    h.publish(&first).await;
    assert_eq!(h.result().await["status"], "sent");

    redis.shift_clock(30 * 60 * 1000);
    let body = readyz_until(&w, 503, "ahead of this worker").await;
    assert!(body.contains("redis.max_clock_skew"), "{body}");
    h.publish(&json!({"id": "c2", "email": "other@example.com", "code": "2"}))
        .await;
    h.no_more_results(Duration::from_secs(3)).await;
    assert!(
        h.sink.mails_to("other@example.com").is_empty(),
        "nothing is taken while the clocks disagree"
    );

    redis.shift_clock(0);
    readyz_until(&w, 200, "").await;
    let r = h.result().await;
    assert_eq!((&r["id"], &r["status"]), (&json!("c2"), &json!("sent")));
    h.publish(&first).await;
    assert_eq!(h.result().await["status"], "duplicate");
    assert_eq!(h.sink.mails_to("owner@example.com").len(), 1);
    w.stop().await.unwrap();
}

/// Redis's clock jumps 25 h ahead and comes back. Redis expires the job's
/// record meanwhile (checked), yet the same job published again is not
/// mailed: the worker that saw the step marked it, and neither it nor a
/// worker started afterwards takes a job until the mark's time or an
/// operator's `mailgate clock --accept`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_past_the_slack_and_back_mails_no_id_twice() {
    let redis = common::PrivateRedis::start_shiftable();
    let url = redis.url();
    let h = Harness::with("clockjump", |s| s.redis.url = url.clone().into()).await;
    let w = h.start_worker().await;
    let job = json!({"id": "j1", "email": "owner@example.com", "code": "1"});
    h.publish(&job).await;
    assert_eq!(h.result().await["status"], "sent");
    let record = format!("{}job:j1", h.settings.redis.key_prefix);
    assert_eq!(common::redis_cli(redis.port, &["EXISTS", &record]), "1");

    redis.shift_clock(25 * HOUR_MS);
    // At once, before the worker's next reading: Redis refuses to decide.
    h.publish(&job).await;
    readyz_until(&w, 503, "mailgate clock --accept").await;
    // Redis deletes the record by its own clock, whatever mailgate does.
    let deadline = Instant::now() + Duration::from_secs(10);
    while common::redis_cli(redis.port, &["EXISTS", &record]) != "0" {
        assert!(Instant::now() < deadline, "Redis never expired the record");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    redis.shift_clock(0);
    let body = readyz_until(&w, 503, "mailgate clock --accept").await;
    assert!(body.contains("ran more than an hour ahead"), "{body}");

    h.publish(&job).await;
    h.no_more_results(Duration::from_secs(3)).await;
    // A worker started now is held back by the mark too.
    w.stop().await.unwrap();
    let w = h.start_worker().await;
    readyz_until(&w, 503, "mailgate clock --accept").await;
    h.no_more_results(Duration::from_secs(2)).await;
    assert_eq!(h.sink.mails_to("owner@example.com").len(), 1, "mailed once");

    let show = h
        .command(env!("CARGO_BIN_EXE_mailgate"), &["clock"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&show.stdout);
    assert!(!show.status.success(), "{out}");
    assert!(
        out.contains("marked: Redis's clock ran") && out.contains("agrees"),
        "{out}"
    );

    // The operator accepts: the jobs waiting are taken (and, the record
    // gone, the id mailed again: the risk `--accept` names).
    let accept = h
        .command(env!("CARGO_BIN_EXE_mailgate"), &["clock", "--accept"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&accept.stdout);
    assert!(accept.status.success(), "{out}");
    assert!(out.contains("removed the mark"), "{out}");
    readyz_until(&w, 200, "").await;
    let r = h.result().await;
    assert_eq!((&r["id"], &r["status"]), (&json!("j1"), &json!("sent")));
    w.stop().await.unwrap();
}

/// Two steps under the hour each, with the workers restarted between them:
/// Redis still tells that it ran ahead long enough to expire its canary,
/// and every worker is held (a worker that judged steps only against what
/// it had seen would take, once restarted, +100 min for its normal).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_a_restarted_worker_did_not_see_are_still_marked() {
    let redis = common::PrivateRedis::start_shiftable();
    let url = redis.url();
    let h = Harness::with("clockrestart", |s| s.redis.url = url.clone().into()).await;
    let w = h.start_worker().await;
    h.publish(&json!({"id": "r1", "email": "owner@example.com", "code": "1"}))
        .await;
    assert_eq!(h.result().await["status"], "sent");
    redis.shift_clock(50 * 60 * 1000);
    readyz_until(&w, 503, "ahead of this worker").await;
    w.stop().await.unwrap();
    let w = h.start_worker().await;
    redis.shift_clock(100 * 60 * 1000);
    tokio::time::sleep(Duration::from_secs(2)).await;
    redis.shift_clock(0);
    readyz_until(&w, 503, "mailgate clock --accept").await;
    w.stop().await.unwrap();
}

/// Redis's clock and the worker's step together (one bad NTP source for
/// both hosts): the worker's boot clock, which no one steps, tells, and the
/// step is marked (otherwise the worker sees no skew, refreshes the canary
/// through the step, and the job published again is mailed twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_the_worker_shares_is_marked() {
    let redis = common::PrivateRedis::start_shiftable();
    let url = redis.url();
    let h = Harness::with("clockshared", |s| s.redis.url = url.clone().into()).await;
    let mut worker = h.command(env!("CARGO_BIN_EXE_mailgate"), &["worker"]);
    for (k, v) in redis.clock_env() {
        worker.env(k, v);
    }
    // Killed when the test ends, however it ends.
    let _worker = common::KillOnDrop(
        worker
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("the worker starts"),
    );
    h.wait_for_queue(&h.settings.amqp.jobs_queue).await;
    let job = json!({"id": "s1", "email": "owner@example.com", "code": "1"});
    h.publish(&job).await;
    assert_eq!(h.result().await["status"], "sent");

    redis.shift_clock(25 * HOUR_MS);
    let mark = format!("{}{{clock}}", h.settings.redis.key_prefix);
    let deadline = Instant::now() + Duration::from_secs(15);
    while common::redis_cli(redis.port, &["EXISTS", &mark]) != "1" {
        assert!(Instant::now() < deadline, "the step was never marked");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    redis.shift_clock(0);
    h.publish(&job).await;
    h.no_more_results(Duration::from_secs(3)).await;
    assert_eq!(h.sink.mails_to("owner@example.com").len(), 1, "mailed once");
}
