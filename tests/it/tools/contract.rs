//! The published contract for producers in any language
//! (`docs/asyncapi.yaml`, `docs/schema/job.json`, `docs/schema/result.json`)
//! holds against the product: a real result of every status validates
//! against the result schema; every example job and result in the docs
//! validates; and the contract's tables, the schemas, the AsyncAPI document
//! and the code list the same statuses, fields and headers.
//! (`scripts/test` also runs the AsyncAPI CLI's own validation.)

use std::collections::BTreeSet;
use std::time::Duration;

use lapin::BasicProperties;
use mailgate::domain::DeadReason;
use mailgate::settings::Rule;
use mailgate::wire::{JobResult, Status};
use serde_json::{Value, json};

use crate::common::harness::Harness;

/// One of the published schemas.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Schema {
    /// `docs/schema/job.json`.
    Job,
    /// `docs/schema/result.json`.
    Result,
}

impl Schema {
    fn path(self) -> &'static str {
        match self {
            Schema::Job => "docs/schema/job.json",
            Schema::Result => "docs/schema/result.json",
        }
    }

    fn json(self) -> Value {
        let text = std::fs::read_to_string(self.path()).expect("the schema is there");
        serde_json::from_str(&text).expect("the schema is JSON")
    }
}

/// Asserts `instance` is valid against `schema` (formats checked too),
/// naming every error and `what` it is.
pub(crate) fn check(schema: Schema, what: &str, instance: &Value) {
    let validator = jsonschema::options()
        .should_validate_formats(true)
        .build(&schema.json())
        .unwrap_or_else(|e| panic!("{} is not a valid schema: {e}", schema.path()));
    let errors: Vec<String> = validator
        .iter_errors(instance)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "{what} does not match {}: {errors:#?}\n{instance:#}",
        schema.path()
    );
}

/// Whether `instance` is valid against `schema`.
fn valid(schema: Schema, instance: &Value) -> bool {
    jsonschema::options()
        .should_validate_formats(true)
        .build(&schema.json())
        .expect("a valid schema")
        .is_valid(instance)
}

fn job(id: &str, email: &str) -> Value {
    json!({"id": id, "email": email, "code": "493817", "ip": "203.0.113.7"})
}

/// One real result of every status, from a worker, each valid against the
/// result schema, and together naming every status the schema lists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_result_of_every_status_matches_the_schema() {
    let h = Harness::with("schemaall", |s| {
        s.limits.supersede = true;
        s.limits.email.rules = vec![Rule::new(Duration::from_secs(3600), 2)];
    })
    .await;
    h.sink.refuse("refused@", 550);
    let w = h.start_worker().await;
    let suppressed = h
        .run_tool(&["suppress", "add", "gone@example.com", "--reason", "test"])
        .await;
    assert!(suppressed.status.success(), "{suppressed:?}");
    let made = |ago_ms: i64| {
        (jiff::Timestamp::now() - jiff::SignedDuration::from_millis(ago_ms)).to_string()
    };
    let past = made(60_000);
    let jobs = [
        ("sent", job("sent", "a@example.com")),
        ("duplicate", job("sent", "a@example.com")),
        ("sent", job("b1", "b@example.com")),
        ("sent", job("b2", "b@example.com")),
        ("rejected", job("rejected", "b@example.com")),
        (
            "invalid",
            json!({"id": "invalid", "email": "no-at-sign", "code": "1"}),
        ),
        (
            "expired",
            json!({"id": "expired", "email": "c@example.com", "code": "1", "expires_at": past}),
        ),
        ("failed", job("failed", "refused@example.com")),
        ("suppressed", job("suppressed", "gone@example.com")),
        (
            "sent",
            json!({"id": "newer", "email": "d@example.com", "code": "2", "created_at": made(0)}),
        ),
        (
            "superseded",
            json!({"id": "superseded", "email": "d@example.com", "code": "1", "created_at": made(5_000)}),
        ),
    ];
    let mut seen = BTreeSet::new();
    for (status, job) in jobs {
        let props = BasicProperties::default().with_correlation_id(format!("c-{status}").into());
        h.publish_raw(job.to_string().as_bytes(), props).await;
        let r = h.result().await;
        assert_eq!(r["status"], status, "{job}: {r}");
        check(Schema::Result, &format!("a real `{status}` result"), &r);
        seen.insert(status.to_owned());
    }
    w.stop().await.unwrap();
    let listed: BTreeSet<String> = schema_statuses().into_iter().collect();
    assert_eq!(
        seen, listed,
        "a real result of every status the schema lists"
    );
}

/// A result's AMQP properties are those the AsyncAPI document gives: JSON,
/// persistent, the job's correlation id, and an expiration of
/// `amqp.results_ttl` (none with `"0s"`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_results_properties_are_the_documented_ones() {
    for (ttl, expiration) in [(86_400, Some("86400000")), (0, None)] {
        let h = Harness::with("resultprops", |s| {
            s.amqp.results_ttl = Duration::from_secs(ttl);
        })
        .await;
        let w = h.start_worker().await;
        let props = BasicProperties::default().with_correlation_id("c-1".into());
        h.publish_raw(job("p1", "a@example.com").to_string().as_bytes(), props)
            .await;
        let results = h.settings.amqp.results_queue.clone();
        let (body, props) = h.next_on(&results, Duration::from_secs(20)).await.unwrap();
        w.stop().await.unwrap();
        let r: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(r["status"], "sent", "{r}");
        assert_eq!(
            props.content_type().as_ref().map(|c| c.as_str()),
            Some("application/json")
        );
        assert_eq!(props.delivery_mode(), &Some(2));
        assert_eq!(
            props.correlation_id().as_ref().map(|c| c.as_str()),
            Some("c-1")
        );
        assert_eq!(props.expiration().as_ref().map(|e| e.as_str()), expiration);
        assert!(props.kind().is_none() && props.content_encoding().is_none());
    }
}

/// The result schema's statuses.
fn schema_statuses() -> Vec<String> {
    let schema = Schema::Result.json();
    (schema["properties"]["status"]["enum"].as_array())
        .expect("the status enum")
        .iter()
        .map(|s| s.as_str().expect("a name").to_owned())
        .collect()
}

/// The code's statuses and result fields are the schema's, and the schema's
/// statuses and fields are the contract's.
#[test]
fn the_contract_the_schemas_and_the_code_agree() {
    let code: Vec<String> = (Status::ALL.iter())
        .map(|s| serde_json::to_value(s).expect("a name"))
        .map(|v| v.as_str().expect("a string").to_owned())
        .collect();
    assert_eq!(schema_statuses(), code, "schema's enum vs Status::ALL");
    let contract = std::fs::read_to_string("docs/contract.md").expect("the contract");
    let in_contract = table_names(section(&contract, "## Result", "## Dead letters"));
    assert_eq!(
        in_contract.into_iter().collect::<BTreeSet<_>>(),
        code.iter().cloned().collect(),
        "the contract's status table vs the schema"
    );

    // The producers' guide says what the UI says for every status.
    let guide = std::fs::read_to_string("docs/producers.md").expect("the guide");
    let in_guide = table_names(section(&guide, "## What your UI says", "## Waiting"));
    assert_eq!(
        in_guide.into_iter().collect::<BTreeSet<_>>(),
        code.iter().cloned().collect(),
        "docs/producers.md's status table vs the schema"
    );

    // Result fields: what the code writes, the schema's properties and
    // required keys, and the contract's example results.
    let written = keys(&serde_json::to_value(JobResult::new("j", Status::Sent, 1)).unwrap());
    let schema = Schema::Result.json();
    assert_eq!(
        keys(&schema["properties"]),
        written,
        "result fields vs schema"
    );
    let required: BTreeSet<String> = (schema["required"].as_array().unwrap().iter())
        .map(|s| s.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(required, written, "every result key is required");
    for (_, block) in json_blocks(&contract).filter(|(_, v)| v.get("status").is_some()) {
        assert_eq!(keys(&block), written, "a contract example result: {block}");
    }

    // Job fields: the contract's table and the schema's properties.
    let fields = table_names(section(&contract, "## Job", "## Result"));
    let schema = Schema::Job.json();
    assert_eq!(
        fields.into_iter().collect::<BTreeSet<_>>(),
        keys(&schema["properties"]),
        "the contract's job fields vs the schema"
    );
    let required: BTreeSet<String> = (schema["required"].as_array().unwrap().iter())
        .map(|s| s.as_str().unwrap().to_owned())
        .collect();
    let required_in_contract: BTreeSet<String> = section(&contract, "## Job", "## Result")
        .lines()
        .filter(|l| l.contains("| yes |"))
        .flat_map(table_names)
        .collect();
    assert_eq!(required, required_in_contract, "required job fields");
}

/// `docs/asyncapi.yaml`, as JSON.
fn asyncapi() -> Value {
    let text = std::fs::read_to_string("docs/asyncapi.yaml").expect("the AsyncAPI document");
    serde_saphyr::from_str(&text).expect("docs/asyncapi.yaml is YAML")
}

/// The AsyncAPI document's messages carry the published schemas, its
/// examples match them (the AsyncAPI CLI does not check a 3.0 document's
/// examples), and its queues are the shipped config's.
#[test]
fn the_asyncapi_document_uses_the_schemas_and_its_examples_match() {
    let doc = asyncapi();
    let messages = &doc["components"]["messages"];
    for (name, schema) in [("job", Schema::Job), ("result", Schema::Result)] {
        let message = &messages[name];
        let path = schema.path().trim_start_matches("docs/");
        assert_eq!(message["payload"]["$ref"], format!("./{path}"), "{name}");
        let examples = message["examples"].as_array().expect("examples");
        assert!(!examples.is_empty(), "{name} has examples");
        for example in examples {
            let what = format!("the {name} example {}", example["name"]);
            check(schema, &what, &example["payload"]);
        }
    }
    let config = std::fs::read_to_string("config/default.toml").expect("the shipped config");
    let (jobs, results) = (&doc["channels"]["jobs"], &doc["channels"]["results"]);
    for (key, channel) in [("jobs_queue", jobs), ("results_queue", results)] {
        let address = channel["address"].as_str().expect("an address");
        assert!(
            config.contains(&format!("{key} = \"{address}\"")),
            "docs/asyncapi.yaml's {address} is config/default.toml's {key}"
        );
        assert_eq!(channel["bindings"]["amqp"]["queue"]["name"], address);
    }
    let dead = doc["channels"]["dead"]["address"].as_str().expect("dead");
    assert_eq!(dead, format!("{}.dead", jobs["address"].as_str().unwrap()));
}

/// The dead-letter headers and reasons in the contract are the AsyncAPI
/// document's, and the reasons are those mailgate writes.
#[test]
fn the_dead_letter_headers_agree() {
    let contract = std::fs::read_to_string("docs/contract.md").expect("the contract");
    let table = section(&contract, "## Dead letters", "It is never requeued");
    let in_contract: BTreeSet<String> = table
        .lines()
        .filter(|l| l.starts_with("| `x-"))
        .flat_map(|l| l.split('|').nth(1).unwrap_or("").split('`'))
        .filter(|h| h.starts_with("x-mailgate-"))
        .map(str::to_owned)
        .collect();
    let doc = asyncapi();
    let headers = &doc["components"]["messages"]["deadLetter"]["headers"]["properties"];
    assert_eq!(
        keys(headers),
        in_contract,
        "docs/asyncapi.yaml vs the contract"
    );
    let written: Vec<Value> = (DeadReason::ALL.iter())
        .filter(|r| !matches!(r, DeadReason::DeliveryLimit | DeadReason::Other))
        .map(|r| Value::from(r.as_str()))
        .collect();
    assert_eq!(headers["x-mailgate-reason"]["enum"], Value::from(written));
}

/// Every ```json block in the README and the contract is JSON, and each
/// job or result among them matches its schema; and a job the schema
/// refuses is one mailgate answers `invalid`, for a few the schema can tell.
#[test]
fn the_docs_examples_match_the_schemas() {
    let mut jobs = 0;
    let mut results = 0;
    for file in ["README.md", "docs/contract.md"] {
        let text = std::fs::read_to_string(file).expect("the doc");
        for (line, block) in json_blocks(&text) {
            let what = format!("the example at {file}:{line}");
            if block.get("status").is_some() {
                check(Schema::Result, &what, &block);
                results += 1;
            } else if block.get("code").is_some() {
                check(Schema::Job, &what, &block);
                jobs += 1;
            }
        }
    }
    assert!(jobs >= 2 && results >= 3, "{jobs} jobs, {results} results");

    // The schema refuses only jobs mailgate refuses, and accepts those it
    // mails, for the spellings each side might read differently.
    let decodes = |job: &Value| mailgate::wire::decode(job.to_string().as_bytes()).is_ok();
    for bad in [
        json!({"email": "a@example.com", "code": "1"}),
        json!({"id": "", "email": "a@example.com", "code": "1"}),
        json!({"id": " padded", "email": "a@example.com", "code": "1"}),
        json!({"id": "j", "email": "a@example.com", "code": "12 34"}),
        json!({"id": "j", "email": "a@example.com\r\nBcc: x@y.z", "code": "1"}),
        json!({"id": "j", "email": "a@example.com", "code": "1", "ip": "1.2.3"}),
        json!({"id": "j", "email": "a@example.com", "code": "1", "purpose": "../x"}),
        json!({"id": "j", "email": "a@example.com", "code": "1", "expires_at": "soon"}),
        json!({"id": "j", "email": "a@example.com", "code": "1", "vars": {"a": [1]}}),
    ]
    .into_iter()
    // What a general ISO 8601 parser takes and RFC 3339 does not.
    .chain(
        [
            "2099-11-21T16:00:00+0800",
            "2099-11-21T16:00Z",
            "20991121T160000Z",
            "2099-11-21T16:00:00,5Z",
            "2099-11-21T16:00:00Z[UTC]",
            "+002099-11-21T16:00:00Z",
            "2099-11-21T16:00:00+08",
            "2099-11-21T16:00:00+08:00:00",
        ]
        .map(|at| json!({"id": "j", "email": "a@example.com", "code": "1", "expires_at": at})),
    ) {
        assert!(!valid(Schema::Job, &bad), "the schema refuses {bad}");
        assert!(!decodes(&bad), "mailgate refuses {bad}");
    }
    let mut vars: serde_json::Map<String, Value> =
        (0..32).map(|n| (format!("v{n}"), Value::from(n))).collect();
    vars.insert("dropped".into(), Value::Null);
    for good in [
        json!({"id": "j", "email": " User@Example.com ", "code": "1", "ip": "", "locale": null,
               "vars": {"n": 1, "b": true, "x": null}, "known_mailbox": "yes", "future": 1}),
        json!({"id": "日本語", "email": "\"a b\"@example.com", "code": "493817", "ip": "2001:db8::1"}),
        json!({"id": "j", "email": "a@example.com", "code": "1", "ip": " 203.0.113.9 "}),
        json!({"id": "j", "email": "a@example.com", "code": "1", "vars": vars}),
        json!({"id": "j", "email": "a@example.com", "code": "1", "expires_at": "2030-01-01 00:00:00Z"}),
        json!({"id": "j", "email": "a@example.com", "code": "1", "expires_at": "2030-06-30T23:59:60+02:00"}),
        json!({"id": "j", "email": "a@example.com", "code": "1", "expires_at": "2030-01-01T00:00:00.123456789Z"}),
        json!({"id": "j", "email": "a@example.com", "code": "1", "expires_at": "2030-01-01T00:00:00.123456789012Z"}),
    ] {
        assert!(valid(Schema::Job, &good), "the schema accepts {good}");
        assert!(decodes(&good), "mailgate accepts {good}");
    }
}

/// The text of `doc` from the line starting `from` to the next line
/// starting `to`.
fn section<'a>(doc: &'a str, from: &str, to: &str) -> &'a str {
    let start = doc.find(&format!("\n{from}")).expect("the section") + 1;
    let len = doc[start + 1..]
        .find(&format!("\n{to}"))
        .map_or(doc.len() - start, |n| n + 1);
    &doc[start..start + len]
}

/// The names in the first cell of a Markdown table's rows (`` | `name` | ``).
fn table_names(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once('`'))
        .map(|(name, _)| name.to_owned())
        .collect()
}

/// The keys of a JSON object.
fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object().expect("an object").keys().cloned().collect()
}

/// Every ```json block of `doc`, with its line; a block that is not JSON
/// fails the test.
fn json_blocks(doc: &str) -> impl Iterator<Item = (usize, Value)> + '_ {
    let mut lines = doc.lines().enumerate();
    std::iter::from_fn(move || {
        let (start, _) = lines.find(|(_, l)| l.trim() == "```json")?;
        let body: Vec<&str> = lines
            .by_ref()
            .take_while(|(_, l)| l.trim() != "```")
            .map(|(_, l)| l)
            .collect();
        let text = body.join("\n");
        let v = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("the ```json block at line {} is not JSON: {e}", start + 1));
        Some((start + 1, v))
    })
}
