//! The job decoder against arbitrary input: it never panics or hangs, and
//! every outcome is one of its two typed errors or a job. (A cargo-fuzz
//! target over the same function lives in `fuzz/`.)

use mailgate::wire::{DecodeError, decode};
use proptest::prelude::*;

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3000)
}

/// JSON-shaped input: objects with the job's field names and odd values.
fn jobish() -> impl Strategy<Value = String> {
    let value = prop_oneof![
        Just("null".to_owned()),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<bool>().prop_map(|b| b.to_string()),
        ".{0,40}".prop_map(|s| serde_json::to_string(&s).unwrap()),
        Just("[1,{}]".to_owned()),
        Just(r#"{"app_name":"x"}"#.to_owned()),
    ];
    let field = prop_oneof![
        Just("id"),
        Just("email"),
        Just("ip"),
        Just("code"),
        Just("purpose"),
        Just("locale"),
        Just("vars"),
        Just("expires_at"),
        Just("other"),
    ];
    proptest::collection::vec((field, value), 0..10).prop_map(|fields| {
        let body: Vec<String> = fields.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
        format!("{{{}}}", body.join(","))
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode(&body);
    }

    #[test]
    fn job_shaped_json_never_panics(body in jobish()) {
        match decode(body.as_bytes()) {
            Ok(job) => prop_assert!(!job.id.as_str().is_empty()),
            Err(DecodeError::Invalid { id, error }) => {
                prop_assert!(!id.as_str().is_empty());
                prop_assert!(!error.is_empty());
            }
            Err(DecodeError::Unusable(why)) => prop_assert!(!why.is_empty()),
        }
    }
}
