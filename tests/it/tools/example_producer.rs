//! The README's Python producer snippet works against a real worker.

use crate::common::harness::Harness;
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_producer_gets_a_sent_result() {
    let h = Harness::new("pyexample").await;
    let w = h.start_worker().await;
    let (url, queue) = (
        h.settings.amqp.url.as_str().to_owned(),
        h.settings.amqp.jobs_queue.clone(),
    );
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .args(["examples/producer.py", "py@example.com"])
            .env("AMQP_URL", url)
            .env("JOBS_QUEUE", queue)
            .output()
            .expect("python3 runs")
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the example failed (is pika installed? scripts/test installs it): {stderr}"
    );
    let r: Value = serde_json::from_slice(&out.stdout).expect("a JSON result");
    assert_eq!(r["status"], "sent", "{r}");
    assert_eq!(h.sink.mails_to("py@example.com").len(), 1);
    w.stop().await.unwrap();
}
