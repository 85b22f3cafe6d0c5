//! `mailgate explain`: one answer to "why didn't I get my code?", from what
//! Redis holds, against the real services.

use std::process::{Output, Stdio};

use serde_json::{Value, json};

use crate::common::harness::Harness;

async fn mailgate(h: &Harness, args: &[&str]) -> Output {
    let mut c = h.command(env!("CARGO_BIN_EXE_mailgate"), args);
    c.stdin(Stdio::null());
    tokio::task::spawn_blocking(move || c.output().expect("the binary runs"))
        .await
        .expect("the runner did not panic")
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_answers_why_a_mailbox_gets_no_code() {
    let h = Harness::new("explain").await;
    let w = h.start_worker().await;
    let job = |id: &str, email: &str| json!({"id": id, "email": email, "ip": "203.0.113.7", "code": "553311"});
    h.publish(&job("e1", "who@example.com")).await;
    assert_eq!(h.result().await["status"], "sent");
    h.publish(&job("e2", "who@example.com")).await;
    assert_eq!(h.result().await["status"], "rejected");
    h.publish(&job("e3", "someone-else@example.com")).await;
    assert_eq!(h.result().await["status"], "sent");
    let added = mailgate(
        &h,
        &[
            "overrides",
            "add",
            "ip:203.0.113.7",
            "--rule",
            "1h=100",
            "--reason",
            "office NAT",
        ],
    )
    .await;
    stdout(&added);

    let out = stdout(
        &mailgate(
            &h,
            &[
                "explain",
                "--email",
                "Who@Example.com",
                "--ip",
                "203.0.113.7",
                "--json",
            ],
        )
        .await,
    );
    let e: Value = serde_json::from_str(out.trim()).unwrap();
    assert!(e["next_send_in_ms"].as_u64().unwrap() > 0, "{e}");
    assert!(e["bound_by"].as_str().unwrap().contains("email:"), "{e}");
    let admissions = e["admissions"].as_array().unwrap();
    assert_eq!(admissions.len(), 1, "only this mailbox's: {e}");
    assert_eq!(admissions[0]["id"], "e1");
    assert_eq!(admissions[0]["record"]["state"], "sent");
    let ip = e["limits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["key"].as_str().unwrap().contains(":ip:"))
        .expect("the IP scope");
    assert_eq!(ip["override"]["reason"], "office NAT", "{e}");
    assert!(!out.contains("553311"), "no code: {out}");
    assert!(!out.contains("someone-else"), "no other mailbox: {out}");

    let text = stdout(&mailgate(&h, &["explain", "--email", "who@example.com"]).await);
    assert!(text.contains("next send for who@example.com: in"), "{text}");
    assert!(text.contains("e1") && text.contains("sent"), "{text}");
    let fresh = stdout(&mailgate(&h, &["explain", "--email", "new@example.com"]).await);
    assert!(fresh.contains("allowed now"), "{fresh}");
    assert!(fresh.contains("no admission"), "{fresh}");
    w.stop().await.unwrap();
}
