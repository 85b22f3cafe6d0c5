//! The worker end to end: the real worker against the shared RabbitMQ and
//! Redis and an SMTP server inside the test.

use crate::common;

use std::time::Duration;

use crate::common::harness::Harness;
use lapin::BasicProperties;
use lapin::types::AMQPValue;
use serde_json::{Value, json};

fn job(id: &str, email: &str) -> Value {
    json!({"id": id, "email": email, "ip": "203.0.113.7", "code": "493817",
           "vars": {"app_name": "Acme", "support_email": "help@acme.example"}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sent_mail_has_headers_both_parts_and_the_code() {
    let h = Harness::new("sent").await;
    let w = h.start_worker().await;
    h.publish(&job("s1", "User@Example.com")).await;
    let r = h.result().await;
    assert_eq!(r["status"], "sent", "{r}");
    assert_eq!(r["id"], "s1");
    assert_eq!(r["email"], "User@example.com");
    assert_eq!(r["attempts"], 1);
    assert!(r["error"].is_null() && r["retry_after_ms"].is_null());
    let decided = r["decided_at_ms"].as_u64().expect("decided_at_ms on sent");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(now.abs_diff(decided) < 60_000);

    let mails = h.sink.wait_for(1, Duration::from_secs(5));
    let m = &mails[0];
    assert_eq!(m.to, ["User@example.com"]);
    assert_eq!(m.from, "no-reply@acme.example");
    let d = &m.data;
    for header in [
        "From: Acme <no-reply@acme.example>",
        "To: User@example.com",
        "Subject: 493817 is your Acme code",
        "Date: ",
        "Message-ID: <",
    ] {
        assert!(d.contains(header), "{header:?} missing from\n{d}");
    }
    assert!(d.contains("multipart/alternative"), "{d}");
    assert!(d.contains("text/plain") && d.contains("text/html"), "{d}");
    assert!(
        d.matches("493817").count() >= 3,
        "the code is in the subject and both parts:\n{d}"
    );
    w.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_carries_retry_after_and_rule_and_sends_nothing() {
    let h = Harness::new("rejected").await;
    let w = h.start_worker().await;
    h.publish(&job("r1", "victim@example.com")).await;
    assert_eq!(h.result().await["status"], "sent");
    h.publish(&job("r2", "Victim+x@Example.com")).await;
    let r = h.result().await;
    assert_eq!(r["status"], "rejected", "{r}");
    assert_eq!(
        r["rule"],
        json!({"scope": "email", "window_ms": 60000, "max": 1})
    );
    // Rounded up to end on a whole second (limits.result_granularity): at
    // most a second past the exact wait, never before it.
    let retry = r["retry_after_ms"].as_u64().unwrap();
    assert!(retry > 50_000 && retry < 61_000, "{retry}");
    let ends = r["decided_at_ms"].as_u64().unwrap() + retry;
    assert_eq!(ends % 1000, 0, "{r}");
    assert!(r["decided_at_ms"].as_u64().is_some());
    h.no_more_results(Duration::from_millis(300)).await;
    assert_eq!(h.sink.mails().len(), 1, "the rejected job sent nothing");
    w.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_id_is_a_duplicate_and_mailed_once() {
    let h = Harness::new("dup").await;
    let w = h.start_worker().await;
    h.publish(&job("d1", "a@example.com")).await;
    assert_eq!(h.result().await["status"], "sent");
    h.publish(&job("d1", "a@example.com")).await;
    let r = h.result().await;
    assert_eq!(r["status"], "duplicate", "{r}");
    assert_eq!(h.sink.mails().len(), 1);
    w.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_answered_while_the_worker_keeps_going() {
    let h = Harness::new("invalid").await;
    let w = h.start_worker().await;

    // Not JSON: nobody to answer; dead-lettered with the reason.
    h.publish_raw(b"this is not json", BasicProperties::default())
        .await;
    let (body, props) = h.dead_letter().await;
    assert_eq!(body, b"this is not json");
    let headers = props.headers().clone().expect("headers");
    let error = headers
        .inner()
        .get("x-mailgate-error")
        .expect("error header");
    assert!(
        matches!(error, AMQPValue::LongString(s) if s.to_string().contains("JSON")),
        "{error:?}"
    );

    let cases = [
        (json!({"id": "i1", "code": "1"}), "email is required"),
        (
            json!({"id": "i2", "email": "a@example.com"}),
            "code is required",
        ),
        (
            json!({"id": "i3", "email": "a@example.com\r\nBcc: victim@example.com", "code": "1"}),
            "control character",
        ),
        (
            json!({"id": "i4", "email": "a@example.com", "code": "1", "ip": "300.1.2.3"}),
            "ip",
        ),
        (
            json!({"id": "i5", "email": "a@example.com", "code": "1", "purpose": "nope"}),
            "unknown purpose",
        ),
        (
            json!({"id": "i6", "email": "a@example.com", "code": "1", "locale": "../../etc"}),
            "locale",
        ),
    ];
    for (j, _) in &cases {
        h.publish(j).await;
    }
    let big =
        json!({"id": "i7", "email": "a@example.com", "code": "1", "pad": "x".repeat(1 << 20)});
    h.publish(&big).await;
    h.publish(&job("ok", "fine@example.com")).await;

    let results = h.results(cases.len() + 2).await;
    for (j, why) in &cases {
        let r = &results[j["id"].as_str().unwrap()];
        assert_eq!(r["status"], "invalid", "{r}");
        assert!(
            r["error"].as_str().unwrap().contains(why),
            "{r} should say {why}"
        );
    }
    assert_eq!(results["i7"]["status"], "invalid");
    assert!(results["i7"]["error"].as_str().unwrap().contains("bytes"));
    assert_eq!(results["ok"]["status"], "sent");
    assert_eq!(h.sink.mails().len(), 1, "only the valid job was mailed");
    w.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smtp_451_twice_then_250_is_sent_on_the_third_attempt() {
    let h = Harness::new("retry").await;
    let w = h.start_worker().await;
    h.sink.reply_with(&[451, 451]);
    h.publish(&job("t1", "a@example.com")).await;
    let r = h.result().await;
    assert_eq!(r["status"], "sent", "{r}");
    assert_eq!(r["attempts"], 3);
    assert_eq!(h.sink.mails().len(), 1);
    assert_eq!(h.sink.transactions(), 3);
    w.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smtp_550_fails_and_refunds_the_quota() {
    let h = Harness::new("perm").await;
    let w = h.start_worker().await;
    h.sink.refuse("gone@example.com", 550);
    h.publish(&job("p1", "gone@example.com")).await;
    let r = h.result().await;
    assert_eq!(r["status"], "failed", "{r}");
    assert_eq!(r["attempts"], 1, "a permanent error is not retried");
    assert!(r["error"].as_str().unwrap().contains("550"), "{r}");
    // The quota was refunded: the mailbox's next job is admitted at once
    // (and fails the same way, but is not rejected by the 1/60 s rule).
    h.publish(&job("p2", "gone@example.com")).await;
    let r = h.result().await;
    assert_eq!(r["status"], "failed", "admitted, not rejected: {r}");
    assert!(h.sink.mails().is_empty());
    w.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_run_out_into_failed_with_the_last_error() {
    let h = Harness::with("exhaust", |s| s.retry.max_attempts = 3).await;
    let w = h.start_worker().await;
    h.sink.reply_with(&[451, 452, 421]);
    h.publish(&job("x1", "a@example.com")).await;
    let r = h.result().await;
    assert_eq!(r["status"], "failed", "{r}");
    assert_eq!(r["attempts"], 3);
    assert!(
        r["error"].as_str().unwrap().contains("421"),
        "the last error: {r}"
    );
    // Refunded: the mailbox may be mailed again at once.
    h.publish(&job("x2", "a@example.com")).await;
    assert_eq!(h.result().await["status"], "sent");
    w.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_code_is_not_sent() {
    let h = Harness::new("expired").await;
    let w = h.start_worker().await;
    let mut j = job("e1", "a@example.com");
    j["expires_at"] = json!("2020-01-01T00:00:00Z");
    h.publish(&j).await;
    let r = h.result().await;
    assert_eq!(r["status"], "expired", "{r}");
    // No quota used: a fresh code for the mailbox goes out.
    h.publish(&job("e2", "a@example.com")).await;
    assert_eq!(h.result().await["status"], "sent");
    assert_eq!(h.sink.mails().len(), 1);
    w.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reply_to_and_correlation_id_are_honoured() {
    let h = Harness::new("replyto").await;
    let w = h.start_worker().await;
    let reply = h.declare("reply").await;
    let props = BasicProperties::default()
        .with_reply_to(reply.as_str().into())
        .with_correlation_id("corr-42".into());
    h.publish_raw(job("c1", "a@example.com").to_string().as_bytes(), props)
        .await;
    let (body, props) = h
        .next_on(&reply, Duration::from_secs(20))
        .await
        .expect("a reply");
    let r: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(r["status"], "sent");
    assert_eq!(r["correlation_id"], "corr-42");
    assert_eq!(
        props.correlation_id().as_ref().map(|s| s.to_string()),
        Some("corr-42".into())
    );
    h.no_more_results(Duration::from_millis(200)).await;
    w.stop().await.unwrap();
}

/// A `reply_to` naming a waiting queue this worker does not declare
/// (another worker's, with a longer lease or more attempts, or another
/// deployment's) is refused like this worker's own: a result parked there, with
/// no expiry, would hold up every wait behind it. The result goes to the
/// results queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_is_never_parked_in_another_workers_waiting_queue() {
    let h = Harness::new("replywait").await;
    let w = h.start_worker().await;
    for (id, suffix) in [
        ("w1", "jobs.wait.1024000"),
        ("w2", "jobs.retry.77"),
        // Another deployment's, on the same broker.
        ("w3", "other.wait.250"),
    ] {
        let queue = h.declare(suffix).await;
        let props = BasicProperties::default().with_reply_to(queue.as_str().into());
        let email = format!("{id}@example.com");
        h.publish_raw(job(id, &email).to_string().as_bytes(), props)
            .await;
        let r = h.result().await;
        assert_eq!(
            (r["id"].as_str(), r["status"].as_str()),
            (Some(id), Some("sent"))
        );
        assert!(
            h.next_on(&queue, Duration::from_millis(200))
                .await
                .is_none()
        );
    }
    w.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_share_the_queue_and_never_exceed_a_limit() {
    let h = Harness::new("pool").await;
    let (w1, w2) = (h.start_worker().await, h.start_worker().await);
    // 60 jobs for 6 mailboxes from 2 IPs: 1 per mailbox per minute passes,
    // and at most 5 per IP per minute.
    for n in 0..60 {
        let mut j = job(&format!("p{n}"), &format!("user{}@example.com", n % 6));
        j["ip"] = json!(format!("198.51.100.{}", n % 2));
        h.publish(&j).await;
    }
    let results = h.results(60).await;
    let sent: Vec<_> = results.values().filter(|r| r["status"] == "sent").collect();
    let rejected = results
        .values()
        .filter(|r| r["status"] == "rejected")
        .count();
    assert_eq!(sent.len() + rejected, 60);
    // user0, 2, 4 use IP .0 and user1, 3, 5 IP .1: 3 mailboxes per IP, so
    // the mailbox rule binds: exactly one mail per mailbox.
    assert_eq!(sent.len(), 6, "one per mailbox");
    let mails = h.sink.wait_for(6, Duration::from_secs(5));
    for n in 0..6 {
        let to = format!("user{n}@example.com");
        assert_eq!(
            mails.iter().filter(|m| m.to == [to.clone()]).count(),
            1,
            "{to}"
        );
    }
    w1.stop().await.unwrap();
    w2.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_stop_finishes_in_flight_jobs() {
    let h = Harness::new("stop").await;
    h.sink.set_delay(Duration::from_millis(150));
    let w = h.start_worker().await;
    for n in 0..30 {
        let mut j = job(&format!("g{n}"), &format!("u{n}@example.com"));
        j["ip"] = Value::Null;
        h.publish(&j).await;
    }
    // Stop while mails are in flight.
    h.sink.wait_for(2, Duration::from_secs(10));
    w.stop().await.expect("exits cleanly");
    // A second worker takes whatever the first handed back.
    let w2 = h.start_worker().await;
    let results = h.results(30).await;
    assert!(
        results.values().all(|r| r["status"] == "sent"),
        "{results:?}"
    );
    h.no_more_results(Duration::from_millis(500)).await;
    let mails = h.sink.mails();
    assert_eq!(mails.len(), 30, "each job mailed exactly once");
    w2.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_template_stops_the_worker_before_it_consumes() {
    let dir = std::env::temp_dir().join(format!("mailgate-broken-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for (path, body) in [
        ("verify/en/subject.txt", "{{ code }"),
        ("verify/en/body.txt", "{{ code }}"),
    ] {
        let p = dir.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, body).unwrap();
    }
    let h = Harness::with("broken", |s| s.templates.dir = dir.clone()).await;
    let err = mailgate::worker::build(&h.settings)
        .await
        .expect_err("a broken template is a start-up error");
    let text = format!("{err:#}");
    assert!(text.contains("verify/en/subject.txt"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A lease wait comes back after its own delay, not after a longer wait
/// queued before it: RabbitMQ expires messages only at a queue's head, so
/// waits go to queues by band (`J.wait.<ms>`). With one wait queue the short
/// wait below would come back only after the long one's 20 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_lease_wait_is_not_held_behind_a_long_one() {
    use futures_lite::StreamExt;
    use mailgate::broker::{Broker, Incoming};
    use mailgate::domain::Ticket;

    let h = Harness::new("waitband").await;
    let broker = Broker::connect(&h.settings).await.expect("broker");
    for id in ["long", "short"] {
        h.publish(&job(id, &format!("{id}@example.com"))).await;
    }
    let mut consumer = broker.consume("waitband").await.expect("consume");
    let mut next = async || {
        let d = tokio::time::timeout(Duration::from_secs(5), consumer.jobs.next())
            .await
            .expect("a delivery within 5 s")
            .expect("the consumer is open")
            .expect("a delivery");
        Incoming::new(d)
    };
    let ticket = Ticket::new();
    for (id, delay) in [("long", 20_000), ("short", 300)] {
        let m = next().await;
        let body: Value = serde_json::from_slice(m.body()).unwrap();
        assert_eq!(body["id"], id);
        let delay = Duration::from_millis(delay);
        let (queue, delay) = broker.topology().wait(delay);
        broker
            .delay(&m, &queue, &ticket, 1, delay)
            .await
            .expect("moved to wait");
        m.ack().await.expect("ack");
    }
    assert_ne!(
        broker.topology().wait(Duration::from_millis(300)).0,
        broker.topology().wait(Duration::from_secs(20)).0
    );
    let back = next().await;
    let body: Value = serde_json::from_slice(back.body()).unwrap();
    assert_eq!(body["id"], "short", "the short wait came back first");
    broker.close(Duration::from_secs(5)).await;
}

/// `amqp.url` listing several nodes, some of them down: the worker connects
/// to one that answers, and works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_given_several_nodes_uses_one_that_answers() {
    let down = |port: u16| format!("amqp://guest:guest@127.0.0.1:{port}/%2f");
    let (a, b) = (common::free_port(), common::free_port());
    let url = format!("{}, {},{}", down(a), common::harness::amqp_url(), down(b));
    let h = Harness::with("nodes", |s| s.amqp.url = url.into()).await;
    let w = h.start_worker().await;
    h.publish(&job("n1", "n1@example.com")).await;
    assert_eq!(h.result().await["status"], "sent");
    w.stop().await.unwrap();
}

/// A node that accepts connections and never speaks AMQP (a load balancer
/// without a backend), listed before one that works: every connection ends
/// on the working node, and the silent one costs no lasting thread or
/// socket per attempt (lapin keeps an attempt's thread while its peer
/// stays silent, so after one timeout the node is only probed). Without
/// that, 30 connections leave 30 threads and 30 open sockets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_never_speaks_costs_no_thread_per_attempt() {
    use mailgate::broker::connect_node;
    use std::io::Read;

    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let open = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = open.clone();
    std::thread::spawn(move || {
        for stream in silent.incoming().flatten() {
            let counter = counter.clone();
            std::thread::spawn(move || {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut stream = stream;
                let mut buf = [0u8; 64];
                while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
                counter.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            });
        }
    });
    let threads = || {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .flatten()
            .filter(|t| {
                std::fs::read_to_string(t.path().join("comm"))
                    .is_ok_and(|c| c.trim() == "lapin-io-loop")
            })
            .count()
    };
    let h = Harness::with("silentnode", |s| {
        s.amqp.url = format!(
            "amqp://guest:guest@127.0.0.1:{port}/%2f,{}",
            common::harness::amqp_url()
        )
        .into();
        s.amqp.timeout = Duration::from_millis(200);
    })
    .await;
    let before = threads();
    for _ in 0..30 {
        let conn = connect_node(&h.settings.amqp, lapin::ConnectionProperties::default())
            .await
            .expect("the working node");
        let _ = conn.close(200, "bye".into()).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (left, sockets) = (
        threads().saturating_sub(before),
        open.load(std::sync::atomic::Ordering::SeqCst),
    );
    assert!(left <= 2, "{left} lapin threads left by 30 connections");
    assert!(
        sockets <= 2,
        "{sockets} sockets to the silent node still open"
    );
}

/// A node that answers the probe (one byte; or, with STALL_WITH_START=1,
/// a real node's whole connection.start, as a node whose login backend
/// hangs would) and then stalls lapin: after the second stall it rests
/// between attempts, so 30 connections leave at most 2 lapin threads and
/// sockets to it (without the rest between attempts: 30 and 31).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_answers_the_probe_then_stalls_costs_a_few_threads() {
    use mailgate::broker::connect_node;
    use std::io::{Read, Write};

    // STALL_WITH_START=1: answer with the real node's whole connection.start (as
    // a node whose authentication backend hangs would), else one byte.
    let answer: Vec<u8> = if std::env::var("STALL_WITH_START").is_ok() {
        let mut real = std::net::TcpStream::connect("127.0.0.1:5672").unwrap();
        real.write_all(b"AMQP\x00\x00\x09\x01").unwrap();
        real.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut start = vec![0u8; 4096];
        let n = real.read(&mut start).unwrap();
        start.truncate(n);
        eprintln!("captured a connection.start of {n} bytes");
        start
    } else {
        vec![1u8]
    };
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let open = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (counter, acc) = (open.clone(), accepted.clone());
    std::thread::spawn(move || {
        for stream in silent.incoming().flatten() {
            let counter = counter.clone();
            let answer = answer.clone();
            acc.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::thread::spawn(move || {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut stream = stream;
                let mut buf = [0u8; 64];
                // Read the protocol header, answer one byte ('\x01': the
                // start of a method frame), then say nothing more.
                if matches!(stream.read(&mut buf), Ok(n) if n > 0) {
                    let _ = stream.write_all(&answer);
                }
                while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
                counter.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            });
        }
    });
    let threads = || {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .flatten()
            .filter(|t| {
                std::fs::read_to_string(t.path().join("comm"))
                    .is_ok_and(|c| c.trim() == "lapin-io-loop")
            })
            .count()
    };
    let h = Harness::with("stalls", |s| {
        s.amqp.url = format!(
            "amqp://guest:guest@127.0.0.1:{port}/%2f,{}",
            common::harness::amqp_url()
        )
        .into();
        s.amqp.timeout = Duration::from_millis(200);
    })
    .await;
    let before = threads();
    let t0 = std::time::Instant::now();
    for _ in 0..30 {
        let conn = connect_node(&h.settings.amqp, lapin::ConnectionProperties::default())
            .await
            .expect("the working node");
        let _ = conn.close(200, "bye".into()).await;
    }
    let took = t0.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (left, sockets) = (
        threads().saturating_sub(before),
        open.load(std::sync::atomic::Ordering::SeqCst),
    );
    eprintln!(
        "stalling node: 30 connects took {took:?}; accepted {} connections; {left} lapin threads \
         and {sockets} sockets to the stalling node left",
        accepted.load(std::sync::atomic::Ordering::SeqCst)
    );
    assert!(left <= 2, "{left} lapin threads left by 30 connections");
    assert!(
        sockets <= 2,
        "{sockets} sockets to the stalling node still open"
    );
}
