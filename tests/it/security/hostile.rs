//! Hostile input, end to end: each kind has a defined outcome.

use std::time::Duration;

use crate::common::harness::Harness;
use lapin::BasicProperties;
use serde_json::{Value, json};

fn job(id: &str) -> Value {
    json!({"id": id, "email": format!("{id}@example.com"), "code": "493817"})
}

/// The text of a quoted-printable body, soft line breaks joined.
fn unqp(s: &str) -> String {
    let joined = s.replace("=\r\n", "");
    let bytes = joined.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'='
            && i + 2 < bytes.len()
            && let Ok(b) = u8::from_str_radix(&joined[i + 1..i + 3], 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_and_path_tricks_are_invalid() {
    let h = Harness::new("hostile-fields").await;
    let w = h.start_worker().await;
    let mut cases: Vec<(Value, &str)> = Vec::new();
    let mut with = |id: &str, field: &str, v: Value, why: &'static str| {
        let mut j = job(id);
        j[field] = v;
        cases.push((j, why));
    };
    with(
        "crlf-email",
        "email",
        json!("a@example.com\r\nBcc: victim@example.com"),
        "control character",
    );
    with(
        "lf-email",
        "email",
        json!("a@example.com\nBcc: victim@example.com"),
        "control character",
    );
    with(
        "crlf-locale",
        "locale",
        json!("en\r\nBcc: victim@example.com"),
        "locale",
    );
    with(
        "crlf-purpose",
        "purpose",
        json!("verify\r\nBcc: victim@example.com"),
        "purpose",
    );
    with(
        "crlf-var",
        "vars",
        json!({"app_name": "Acme\r\nBcc: victim@example.com"}),
        "control character",
    );
    with(
        "path-purpose",
        "purpose",
        json!("../../etc/passwd"),
        "purpose",
    );
    with(
        "path-purpose2",
        "purpose",
        json!("verify/../../../etc"),
        "purpose",
    );
    with(
        "path-locale",
        "locale",
        json!("../../../../etc/passwd"),
        "locale",
    );
    with("encoded-locale", "locale", json!("..%2F..%2Fetc"), "locale");
    with(
        "long-email",
        "email",
        json!(format!("{}@example.com", "a".repeat(300))),
        "email",
    );
    with("long-code", "code", json!("9".repeat(65)), "code");
    with(
        "long-var",
        "vars",
        json!({"app_name": "x".repeat(1025)}),
        "1024",
    );
    let many: serde_json::Map<String, Value> =
        (0..33).map(|i| (format!("v{i}"), json!("x"))).collect();
    with("many-vars", "vars", Value::Object(many), "at most 32");
    with(
        "nested-var",
        "vars",
        json!({"app_name": {"a": 1}}),
        "strings, numbers or booleans",
    );
    with("bad-expiry", "expires_at", json!("tomorrow"), "expires_at");
    for (j, _) in &cases {
        h.publish(j).await;
    }
    // A body one byte over the limit.
    let mut big = job("big-body");
    let pad = mailgate::wire::MAX_BODY_BYTES + 1 - big.to_string().len() - r#","pad":"""#.len();
    big["pad"] = json!("x".repeat(pad));
    assert_eq!(big.to_string().len(), mailgate::wire::MAX_BODY_BYTES + 1);
    h.publish(&big).await;

    let results = h.results(cases.len() + 1).await;
    for (j, why) in &cases {
        let r = &results[j["id"].as_str().unwrap()];
        assert_eq!(r["status"], "invalid", "{r}");
        assert!(
            r["error"].as_str().unwrap().contains(why),
            "{r}: should say {why}"
        );
    }
    assert_eq!(results["big-body"]["status"], "invalid");
    assert!(h.sink.mails().is_empty(), "nothing was mailed");

    // An id that cannot be used has no one to answer: dead-lettered.
    h.publish(&json!({"id": "i".repeat(129), "email": "a@example.com", "code": "1"}))
        .await;
    let (_, props) = h.dead_letter().await;
    assert!(props.headers().is_some());
    h.publish_raw(&[0xff, 0xfe, 0x00, b'{'], BasicProperties::default())
        .await;
    h.dead_letter().await;
    w.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn template_injection_is_printed_not_executed() {
    let h = Harness::new("hostile-template").await;
    let w = h.start_worker().await;
    let mut j = job("tpl");
    j["vars"] = json!({"app_name": "{{ code }}{% if true %}X{% endif %}<script>alert(1)</script>"});
    h.publish(&j).await;
    assert_eq!(h.result().await["status"], "sent");
    let mail = &h.sink.wait_for(1, Duration::from_secs(5))[0];
    let raw = unqp(&mail.data);
    let (text, html) = raw
        .split_once("Content-Type: text/html")
        .expect("an HTML part");
    assert!(!html.contains("<script>"), "HTML escaped:\n{html}");
    assert!(html.contains("&lt;script&gt;"), "{html}");
    assert!(
        text.contains("{{ code }}{% if true %}X{% endif %}"),
        "printed literally:\n{text}"
    );
    assert!(
        !text.contains("493817X"),
        "the variable's template code did not run"
    );
    w.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spellings_of_one_mailbox_share_one_limit() {
    let h = Harness::new("hostile-mailbox").await;
    let w = h.start_worker().await;
    let send = |id: &str, email: &str| json!({"id": id, "email": email, "code": "1"});
    // IDN: the unicode domain is mailed in its ASCII form…
    h.publish(&send("idn1", "User@Bücher.example")).await;
    let r = h.result().await;
    assert_eq!(r["status"], "sent", "{r}");
    assert_eq!(h.sink.mails()[0].to, ["User@xn--bcher-kva.example"]);
    // …and every other spelling is the same mailbox.
    for (i, spelling) in ["user@xn--bcher-kva.example", "USER+promo@BÜCHER.EXAMPLE"]
        .iter()
        .enumerate()
    {
        h.publish(&send(&format!("idn{}", i + 2), spelling)).await;
        let r = h.result().await;
        assert_eq!(r["status"], "rejected", "{spelling}: {r}");
    }
    h.publish(&send("q1", "\"john.doe\"@example.com")).await;
    assert_eq!(h.result().await["status"], "sent");
    for (i, spelling) in ["John.Doe@Example.com", "john.doe+x@example.com"]
        .iter()
        .enumerate()
    {
        h.publish(&send(&format!("q{}", i + 2), spelling)).await;
        assert_eq!(h.result().await["status"], "rejected", "{spelling}");
    }
    h.publish(&send("g1", "j.o.h.n@googlemail.com")).await;
    assert_eq!(h.result().await["status"], "sent");
    h.publish(&send("g2", "JOHN+x@gmail.com")).await;
    assert_eq!(h.result().await["status"], "rejected");
    assert_eq!(h.sink.mails().len(), 3);
    // A unicode local part needs SMTPUTF8; a server without it refuses the
    // envelope, and that is permanent: one attempt, `failed`, refunded.
    h.publish(&send("utf8", "Üser@example.com")).await;
    let r = h.result().await;
    assert_eq!(r["status"], "failed", "{r}");
    assert_eq!(r["attempts"], 1, "{r}");
    w.stop().await.unwrap();
}

/// Quoted local parts that pass the screen can be composed: they are never
/// admitted and then found `invalid` (which used quota before the refund).
/// What the SMTP server then says is its business: a mail, or a 5xx.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_passes_the_screen_can_be_composed() {
    let h = Harness::new("hostile-quoted").await;
    let w = h.start_worker().await;
    let odd = ["\"jane q doe\"@example.com", "\"a@b\"@example.com"];
    for (n, email) in odd.iter().enumerate() {
        h.publish(&json!({"id": format!("q{n}"), "email": email, "code": "1", "ip": ""}))
            .await;
    }
    // A control: a plain address in a BOM-prefixed body is read too.
    let mut body = b"\xEF\xBB\xBF".to_vec();
    body.extend_from_slice(
        json!({"id": "bom", "email": "bom@example.com", "code": "1"})
            .to_string()
            .as_bytes(),
    );
    h.publish_raw(&body, BasicProperties::default()).await;
    let results = h.results(3).await;
    for n in 0..odd.len() {
        let r = &results[&format!("q{n}")];
        let status = r["status"].as_str().unwrap();
        let error = r["error"].as_str().unwrap_or("");
        assert!(
            status == "sent" || (status == "failed" && error.contains("SMTP 5")),
            "{r}"
        );
    }
    assert_eq!(results["bom"]["status"], "sent");
    w.stop().await.unwrap();
}
