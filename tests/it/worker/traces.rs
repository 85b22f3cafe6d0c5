//! Traces across the queue: a producer's W3C `traceparent` is continued by
//! the worker's spans, exported over OTLP/HTTP to a receiver this test
//! runs, and carried on the result.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::harness::Harness;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use serde_json::{Value, json};

/// An OTLP/HTTP receiver on a free port: every JSON body POSTed to
/// `/v1/traces`.
struct Receiver {
    port: u16,
    bodies: Arc<Mutex<Vec<Value>>>,
}

impl Receiver {
    async fn start() -> Self {
        let bodies: Arc<Mutex<Vec<Value>>> = Arc::default();
        let kept = bodies.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: axum::body::Bytes| {
                let kept = kept.clone();
                async move {
                    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    kept.lock().unwrap().push(v);
                    ([("content-type", "application/json")], "{}")
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { port, bodies }
    }

    /// Every span received: (trace id, span id, parent span id, name,
    /// attributes as `key=value` strings).
    fn spans(&self) -> Vec<(String, String, String, String, Vec<String>)> {
        let s = |v: &Value| v.as_str().unwrap_or_default().to_lowercase();
        let mut out = Vec::new();
        for body in self.bodies.lock().unwrap().iter() {
            for rs in body["resourceSpans"].as_array().into_iter().flatten() {
                for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
                    for span in ss["spans"].as_array().into_iter().flatten() {
                        let attrs = (span["attributes"].as_array().into_iter().flatten())
                            .map(|a| {
                                let v = &a["value"];
                                let v = v["stringValue"]
                                    .as_str()
                                    .map_or(v.to_string(), str::to_owned);
                                format!("{}={v}", s(&a["key"]))
                            })
                            .collect();
                        out.push((
                            s(&span["traceId"]),
                            s(&span["spanId"]),
                            s(&span["parentSpanId"]),
                            span["name"].as_str().unwrap_or_default().to_owned(),
                            attrs,
                        ));
                    }
                }
            }
        }
        out
    }
}

/// Publishes `job` with a `traceparent` (and a `tracestate`) header.
async fn publish_traced(h: &Harness, job: &Value, traceparent: &str, tracestate: Option<&str>) {
    let mut headers = FieldTable::default();
    let mut put = |name: &str, v: &str| {
        headers.insert(name.into(), AMQPValue::LongString(v.into()));
    };
    put("traceparent", traceparent);
    if let Some(state) = tracestate {
        put("tracestate", state);
    }
    h.publish_raw(
        job.to_string().as_bytes(),
        BasicProperties::default().with_headers(headers),
    )
    .await;
}

/// The `traceparent` header of a result's properties.
fn traceparent(props: &BasicProperties) -> Option<String> {
    props
        .headers()
        .as_ref()?
        .inner()
        .get("traceparent")
        .and_then(|v| match v {
            AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
            _ => None,
        })
}

/// With a producer's trace context, the job's spans (process, limiter
/// decision, render, SMTP send, publish) join that trace, the process span
/// a child of the producer's span, and the result carries a `traceparent`
/// of the same trace. Without one, the job starts a trace of its own, and
/// its result says which. No span carries the mailbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_spans_join_its_producers_trace_and_the_result_carries_it() {
    let h = Harness::new("traces").await;
    let receiver = Receiver::start().await;
    let mut c = h.command(env!("CARGO_BIN_EXE_mailgate"), &["worker"]);
    c.env(
        "MAILGATE__TELEMETRY__OTLP_ENDPOINT",
        format!("http://127.0.0.1:{}", receiver.port),
    )
    .stdin(std::process::Stdio::null())
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::piped());
    let child = c.spawn().expect("the worker starts");
    h.wait_for_queue(&h.settings.amqp.jobs_queue).await;

    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent = "00f067aa0ba902b7";
    let job = json!({"id": "traced", "email": "traced.user@example.com", "code": "123456"});
    let sent = format!("00-{trace}-{parent}-01");
    publish_traced(&h, &job, &sent, Some("vendor=opaque")).await;
    let results = h.settings.amqp.results_queue.clone();
    let (body, props) = h
        .next_on(&results, Duration::from_secs(30))
        .await
        .expect("a result");
    let result: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(result["status"], "sent", "{result}");
    let carried = traceparent(&props).expect("the result carries a traceparent");
    assert!(carried.starts_with(&format!("00-{trace}-")), "{carried}");

    // A job without one starts a trace.
    h.publish(&json!({"id": "untraced", "email": "other.user@example.com", "code": "1"}))
        .await;
    let (_, props) = h
        .next_on(&results, Duration::from_secs(30))
        .await
        .expect("a result");
    let fresh = traceparent(&props).expect("a result always carries a traceparent");
    let fresh_trace = fresh.split('-').nth(1).unwrap_or_default().to_owned();
    assert_eq!(fresh_trace.len(), 32, "{fresh}");
    assert_ne!(fresh_trace, trace);
    assert_ne!(fresh_trace, "0".repeat(32));

    // SIGTERM: the worker exports what it has not yet, then exits.
    let out = common::signal_and_wait(child, "-TERM", Duration::from_secs(30)).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let spans = receiver.spans();
    let of = |t: &str| -> Vec<_> { spans.iter().filter(|s| s.0 == t).collect() };
    let traced = of(trace);
    let names: Vec<&str> = traced.iter().map(|s| s.3.as_str()).collect();
    for name in [
        "process ",
        "limiter decision",
        "render",
        "smtp send",
        "send ",
    ] {
        assert!(
            names.iter().any(|n| n.starts_with(name)),
            "no {name:?} span in the producer's trace: {names:?}"
        );
    }
    let process = traced.iter().find(|s| s.3.starts_with("process ")).unwrap();
    assert_eq!(
        process.2, parent,
        "the process span is the producer's child"
    );
    assert!(
        process.4.iter().any(|a| a == "messaging.system=rabbitmq"),
        "{:?}",
        process.4
    );
    assert!(
        process
            .4
            .iter()
            .any(|a| a.starts_with("messaging.destination.name=")),
        "{:?}",
        process.4
    );
    // The result's traceparent names the publish span, of the same trace.
    let publish = traced.iter().find(|s| s.3.starts_with("send ")).unwrap();
    assert!(carried.contains(&publish.1), "{carried} vs {publish:?}");
    assert!(
        !of(&fresh_trace).is_empty(),
        "the fresh trace was exported too"
    );
    // Anywhere in what was exported: attributes, events (the log lines
    // inside the spans), resources.
    let all = Value::Array(receiver.bodies.lock().unwrap().clone()).to_string();
    for mailbox in ["traced.user", "other.user"] {
        assert!(!all.contains(mailbox), "a span shows {mailbox}: {all}");
    }
}

/// Without an exporter no spans are made (they would cost every job CPU
/// for nothing), and the result passes the job's trace context on as it
/// came, so the producer's trace still continues past mailgate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_exporter_the_result_passes_the_trace_context_on() {
    let h = Harness::new("traces-off").await;
    let w = h.start_worker().await;
    let sent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let job = json!({"id": "passed", "email": "a@example.com", "code": "1"});
    publish_traced(&h, &job, sent, None).await;
    let results = h.settings.amqp.results_queue.clone();
    let (_, props) = h
        .next_on(&results, Duration::from_secs(30))
        .await
        .expect("a result");
    assert_eq!(traceparent(&props).as_deref(), Some(sent));
    w.stop().await.unwrap();
}
