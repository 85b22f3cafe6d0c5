//! The wire formats producers rely on (see `docs/contract.md`): the job JSON
//! that arrives, the result JSON that goes back. Wire structs stay here; the
//! rest of mailgate sees only the parsed [`Job`].

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::domain::{
    Code, EmailAddress, InvalidInput, IpKey, Job, JobId, Name, Session, VarValue, Vars,
};

/// The largest job body accepted, in bytes. A larger one is answered `invalid`.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// Why a message could not become a [`Job`].
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// Not JSON, or no usable `id`: there is no one to answer, so the message
    /// goes to the dead-letter queue.
    #[error("{0}")]
    Unusable(String),
    /// The message has an id but is otherwise malformed: answered `invalid`,
    /// never retried.
    #[error("{error}")]
    Invalid {
        /// The job's id, to answer to.
        id: JobId,
        /// What is wrong, for the producer.
        error: String,
    },
}

/// Just enough to find the id of any JSON object, whatever its other fields.
#[derive(Deserialize)]
struct IdOnly {
    id: Option<Value>,
}

/// The job as it travels. Unknown fields are ignored, so producers may add
/// fields before workers know them.
#[derive(Deserialize)]
struct JobWire {
    email: Option<String>,
    ip: Option<String>,
    code: Option<String>,
    purpose: Option<String>,
    locale: Option<String>,
    /// Raw, so numbers keep the text the producer wrote (a `Value` would
    /// turn big or exotic ones into floats).
    vars: Option<std::collections::BTreeMap<String, Box<serde_json::value::RawValue>>>,
    expires_at: Option<String>,
    /// Read leniently: producers may already send a `created_at` of their
    /// own making (a number, a local time), which must not make their jobs
    /// invalid; only an RFC 3339 timestamp is used.
    created_at: Option<Value>,
    /// Read leniently, as `created_at`: a producer may already send
    /// fields of these names; a value of another type is ignored, never a
    /// reason to refuse the job.
    session: Option<Value>,
    known_mailbox: Option<Value>,
}

/// Parses a message body into a job. The id is found first, so that every
/// later problem can be answered to it.
pub fn decode(body: &[u8]) -> Result<Job, DecodeError> {
    // A UTF-8 byte order mark is not JSON, but editors and some producers'
    // libraries write one: skip it.
    let body = body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body);
    let id = id_of(body).map_err(DecodeError::Unusable)?;
    let invalid = |error: String| DecodeError::Invalid {
        id: id.clone(),
        error,
    };
    if body.len() > MAX_BODY_BYTES {
        return Err(invalid(format!(
            "the job is {} bytes; at most {MAX_BODY_BYTES} are accepted",
            body.len()
        )));
    }
    let wire: JobWire = serde_json::from_slice(body).map_err(|e| invalid(e.to_string()))?;
    parse(id.clone(), wire).map_err(|e| invalid(e.to_string()))
}

/// A message body's job id, read as [`decode`] reads it (a byte order mark
/// skipped), or why it has none that can be answered.
pub fn id_of(body: &[u8]) -> Result<JobId, String> {
    let body = body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body);
    let IdOnly { id } =
        serde_json::from_slice(body).map_err(|e| format!("not a JSON object: {e}"))?;
    match id {
        Some(Value::String(s)) => JobId::parse(&s).map_err(|e| format!("unusable id: {e}")),
        Some(_) => Err("id must be a string".into()),
        None => Err("id is required".into()),
    }
}

/// An RFC 3339 `date-time`, exactly as the job schema's pattern reads it,
/// and nothing else that a general ISO 8601 parser takes (`+0800`, no
/// seconds, the basic format, `,5`, `Z[UTC]`, a six-digit year, `+08`,
/// `+08:00:00`): `YYYY-MM-DD`, `T` (or `t`, or a space, as RFC 3339's note
/// allows), `hh:mm:ss`, any number of fraction digits (beyond nanoseconds
/// they are dropped), then `Z`, `z` or `±hh:mm`; a leap second (`:60`)
/// reads as the last instant of its minute.
fn rfc3339(text: &str) -> Option<jiff::Timestamp> {
    let b = text.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| b.get(r).is_some_and(|d| d.iter().all(u8::is_ascii_digit));
    let shape = b.len() >= 20
        && digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && matches!(b[10], b'T' | b't' | b' ')
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19);
    if !shape {
        return None;
    }
    let mut at = 19;
    let mut fraction = "";
    if b[at] == b'.' {
        let n = b[at + 1..]
            .iter()
            .take_while(|d| d.is_ascii_digit())
            .count();
        if n == 0 {
            return None;
        }
        fraction = &text[at + 1..at + 1 + n.min(9)];
        at += 1 + n;
    }
    let offset = &text[at..];
    let offset_ok = matches!(offset, "Z" | "z")
        || (offset.len() == 6
            && matches!(offset.as_bytes()[0], b'+' | b'-')
            && digits(at + 1..at + 3)
            && offset.as_bytes()[3] == b':'
            && digits(at + 4..at + 6));
    if !offset_ok {
        return None;
    }
    // A leap second is the last instant of its minute.
    let (second, fraction) = match &text[17..19] {
        "60" => ("59", "999999999"),
        s => (s, fraction),
    };
    let fraction = match fraction {
        "" => String::new(),
        f => format!(".{f}"),
    };
    let offset = match offset {
        "Z" | "z" => "Z",
        o => o,
    };
    let normal = format!(
        "{}T{}:{second}{fraction}{offset}",
        &text[..10],
        &text[11..16]
    );
    normal.parse::<jiff::Timestamp>().ok()
}

fn parse(id: JobId, w: JobWire) -> Result<Job, InvalidInput> {
    let email = EmailAddress::parse(&w.email.ok_or(InvalidInput::Missing("email"))?)?;
    let code = Code::parse(&w.code.ok_or(InvalidInput::Missing("code"))?)?;
    let ip =
        w.ip.filter(|s| !s.is_empty())
            .map(|s| IpKey::parse(&s))
            .transpose()?;
    let purpose = Name::parse(
        "purpose",
        w.purpose.as_deref().unwrap_or(Job::DEFAULT_PURPOSE),
    )?;
    let locale = w
        .locale
        .filter(|s| !s.is_empty())
        .map(|s| Name::parse("locale", &s))
        .transpose()?;
    let vars = Vars::parse(
        w.vars
            .unwrap_or_default()
            .into_iter()
            .filter(|(_, v)| v.get() != "null")
            .map(|(k, v)| {
                let wrong = || InvalidInput::Field {
                    field: "vars",
                    reason: "values must be strings, numbers or booleans",
                };
                // The text is valid JSON (serde checked it); its first byte
                // says what it is.
                let text = v.get();
                let v = match text.as_bytes().first() {
                    Some(b'"') => VarValue::Text(serde_json::from_str(text).map_err(|_| wrong())?),
                    Some(b't') => VarValue::Bool(true),
                    Some(b'f') => VarValue::Bool(false),
                    Some(b'-' | b'0'..=b'9') => VarValue::number(text),
                    _ => return Err(wrong()),
                };
                Ok((k, v))
            })
            .collect::<Result<Vec<_>, _>>()?,
    )?;
    let timestamp = |field: &'static str, value: Option<String>| {
        value
            .map(|s| {
                rfc3339(&s).ok_or_else(|| InvalidInput::Timestamp {
                    field,
                    value: s.chars().take(64).collect(),
                })
            })
            .transpose()
    };
    let expires_at = timestamp("expires_at", w.expires_at)?;
    let created_at = match w.created_at {
        Some(Value::String(s)) => rfc3339(&s),
        _ => None,
    };
    let session = match w.session {
        Some(Value::String(s)) => Session::of(&s),
        _ => None,
    };
    Ok(Job {
        id,
        email,
        ip,
        code,
        purpose,
        locale,
        vars,
        expires_at,
        created_at,
        session,
        known_mailbox: matches!(w.known_mailbox, Some(Value::Bool(true))),
    })
}

/// What happened to a job, as producers read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// The SMTP server accepted the mail.
    Sent,
    /// A limit applied; `retry_after_ms` says when the same request would pass.
    Rejected,
    /// This id was already admitted and its mail sent; nothing was sent again.
    Duplicate,
    /// The job is malformed; `error` says why. Never retried.
    Invalid,
    /// `expires_at` passed before the mail could go out; quota refunded.
    Expired,
    /// A permanent SMTP error, or too many transient ones; quota refunded.
    Failed,
    /// A newer job for the same mailbox and purpose was admitted after
    /// this one (`supersede = true`): its code is stale, so it was not
    /// sent; quota refunded.
    Superseded,
    /// The mailbox is on the suppression list: nothing was sent or
    /// counted; `error` says so.
    Suppressed,
}

impl Status {
    /// Every status (a new one must be listed here: metrics register each
    /// at zero, and a test checks the list against the JSON names).
    pub const ALL: [Status; 8] = [
        Status::Sent,
        Status::Rejected,
        Status::Duplicate,
        Status::Invalid,
        Status::Expired,
        Status::Failed,
        Status::Superseded,
        Status::Suppressed,
    ];
}

/// The rule that rejected a job (or, as `shadow_rule`, would have).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RuleWire {
    /// `email`, `ip` or `domain`.
    pub scope: &'static str,
    /// The rule's window.
    pub window_ms: u64,
    /// The rule's maximum per window.
    pub max: u32,
}

/// What an admission left of one scope's quota (on `sent`): the scope's
/// tightest enforced rule, how many more sends it allows now, and how long
/// until its next slot frees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct QuotaWire {
    /// The rule (`scope`, `window_ms`, `max`).
    #[serde(flatten)]
    pub rule: RuleWire,
    /// How many more sends the rule allows now.
    pub remaining: u32,
    /// How long until the rule's oldest send in its window leaves it.
    pub reset_ms: u64,
}

/// The result message. Every key is always present (null when it does not
/// apply), so consumers can rely on the shape.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobResult {
    /// The job's id.
    pub id: String,
    /// What happened.
    pub status: Status,
    /// The mailbox as the job gave it (parsed), if it could be parsed.
    pub email: Option<String>,
    /// The limiter's (Redis) time of the decision; on `sent` and `rejected`.
    pub decided_at_ms: Option<u64>,
    /// On `rejected`: exactly how long until the same request would pass.
    pub retry_after_ms: Option<u64>,
    /// The exact wait where `retry_after_ms` was rounded up for the
    /// requester (`limits.result_granularity`): for the worker's log only,
    /// never published.
    #[serde(skip)]
    pub exact_retry_after_ms: Option<u64>,
    /// On `rejected`: the rule that sets `retry_after_ms`.
    pub rule: Option<RuleWire>,
    /// On `sent`: the shadow rule (`enforce = false`) that would have
    /// rejected the job had it been enforced, if one would have.
    pub shadow_rule: Option<RuleWire>,
    /// On `sent`, when this delivery's admission counted the job: per
    /// scope that counted it, what is left of its quota.
    pub quota: Option<Vec<QuotaWire>>,
    /// Attempts made, this one included.
    pub attempts: u32,
    /// On `invalid` and `failed`: why.
    pub error: Option<String>,
    /// The job message's AMQP `correlation_id`, if it had one.
    pub correlation_id: Option<String>,
}

impl JobResult {
    /// A result with only id, status and attempts set.
    pub fn new(id: &str, status: Status, attempts: u32) -> Self {
        Self {
            id: id.to_owned(),
            status,
            email: None,
            decided_at_ms: None,
            retry_after_ms: None,
            exact_retry_after_ms: None,
            rule: None,
            shadow_rule: None,
            quota: None,
            attempts,
            error: None,
            correlation_id: None,
        }
    }

    /// The JSON body.
    pub fn to_json(&self) -> Vec<u8> {
        // Serializing plain strings, numbers and options cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::rfc3339;

    /// Exactly RFC 3339, as the job schema's pattern: what a general ISO
    /// 8601 parser also takes is refused, and every fraction is read.
    #[test]
    fn timestamps_are_exactly_rfc_3339() {
        for bad in [
            "2099-11-21T16:00:00+0800",
            "2099-11-21T16:00Z",
            "20991121T160000Z",
            "2099-11-21T16:00:00,5Z",
            "2099-11-21T16:00:00Z[UTC]",
            "+002099-11-21T16:00:00Z",
            "2099-11-21T16:00:00+08",
            "2099-11-21T16:00:00+08:00:00",
            "2099-11-21T16:00:00.Z",
            "2099-11-21T16:00:00",
            "2099-11-21_16:00:00Z",
            "2099-13-21T16:00:00Z",
            "2099-11-21T16:00:00Z ",
        ] {
            assert_eq!(rfc3339(bad), None, "{bad}");
        }
        for (good, second) in [
            ("2099-11-21T16:00:00Z", 4_098_960_000),
            ("2099-11-21t16:00:00z", 4_098_960_000),
            ("2099-11-21 16:00:00Z", 4_098_960_000),
            ("2099-11-22T00:00:00+08:00", 4_098_960_000),
            ("2099-11-21T16:00:00.123456789012Z", 4_098_960_000),
            ("2099-11-21T15:59:60Z", 4_098_959_999),
        ] {
            let t = rfc3339(good).unwrap_or_else(|| panic!("{good}"));
            assert_eq!(t.as_second(), second, "{good}");
        }
        assert_eq!(
            rfc3339("2099-11-21T16:00:00.123456789012Z").map(|t| t.subsec_nanosecond()),
            Some(123_456_789)
        );
    }

    use super::*;

    #[test]
    fn status_all_lists_every_status_once() {
        // Exhaustive: a new status stops the build here, a reminder to list
        // it in `Status::ALL` (in order, once) and in the contract.
        let place = |s: Status| match s {
            Status::Sent => 0,
            Status::Rejected => 1,
            Status::Duplicate => 2,
            Status::Invalid => 3,
            Status::Expired => 4,
            Status::Failed => 5,
            Status::Superseded => 6,
            Status::Suppressed => 7,
        };
        for (i, s) in Status::ALL.into_iter().enumerate() {
            assert_eq!(place(s), i, "{s:?}");
        }
        assert_eq!(Status::ALL.len(), place(Status::Suppressed) + 1);
    }

    fn invalid(body: &str) -> String {
        match decode(body.as_bytes()) {
            Err(DecodeError::Invalid { id, error }) => {
                assert_eq!(id.as_str(), "j1");
                error
            }
            other => panic!("expected invalid, got {other:?}"),
        }
    }

    fn mailgate_session(text: &str) -> Option<crate::domain::Session> {
        crate::domain::Session::of(text)
    }

    #[test]
    fn a_full_job() {
        let job = decode(
            br#"{"id":"j1","email":"User@Example.com","ip":"203.0.113.7","code":"493817",
                "purpose":"verify","locale":"zh-CN","vars":{"app_name":"Acme","n":3,"x":null},
                "expires_at":"2026-11-21T16:00:00+08:00","future_field":1}"#,
        )
        .unwrap();
        assert_eq!(job.id.as_str(), "j1");
        assert_eq!(job.email.as_str(), "User@example.com");
        assert_eq!(job.locale.unwrap().as_str(), "zh-CN");
        assert_eq!(job.vars.iter().count(), 2);
        assert_eq!(job.expires_at.unwrap().as_second(), 1_795_248_000);
    }

    #[test]
    fn defaults() {
        let job = decode(br#"{"id":"j1","email":"a@example.com","code":"1","ip":""}"#).unwrap();
        assert_eq!(job.purpose.as_str(), "verify");
        assert!(job.ip.is_none() && job.locale.is_none() && job.expires_at.is_none());
    }

    #[test]
    fn unusable_messages() {
        for body in [
            &b"not json"[..],
            b"[1,2]",
            br#"{"email":"a@example.com"}"#,
            br#"{"id":42}"#,
            br#"{"id":""}"#,
            br#"{"id":"a\nb"}"#,
        ] {
            assert!(
                matches!(decode(body), Err(DecodeError::Unusable(_))),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn invalid_jobs_say_why() {
        assert!(invalid(r#"{"id":"j1","code":"1"}"#).contains("email is required"));
        assert!(invalid(r#"{"id":"j1","email":"a@example.com"}"#).contains("code is required"));
        assert!(
            invalid(r#"{"id":"j1","email":"a@example.com\r\nBcc: x@y.z","code":"1"}"#)
                .contains("control character")
        );
        assert!(
            invalid(r#"{"id":"j1","email":"a@example.com","code":"1","ip":"1.2.3"}"#)
                .contains("ip")
        );
        assert!(
            invalid(r#"{"id":"j1","email":"a@example.com","code":"1","purpose":"../x"}"#)
                .contains("purpose")
        );
        assert!(invalid(r#"{"id":"j1","email":5,"code":"1"}"#).contains("invalid type"));
        assert!(
            invalid(r#"{"id":"j1","email":"a@example.com","code":"1","expires_at":"soon"}"#)
                .contains("expires_at")
        );
        // known_mailbox: only `true` marks a job; any other value is ignored.
        let job_with = |field: &str| {
            let body = format!(r#"{{"id":"j1","email":"a@example.com","code":"1",{field}}}"#);
            decode(body.as_bytes()).expect("a job")
        };
        assert!(job_with(r#""known_mailbox":true"#).known_mailbox);
        for other in [
            r#""known_mailbox":"true""#,
            r#""known_mailbox":1"#,
            r#""known_mailbox":false"#,
        ] {
            assert!(!job_with(other).known_mailbox, "{other}");
        }
        // A session: any non-empty string, kept as a digest, never shown;
        // another type is ignored.
        let long = format!(r#""session":"{}""#, "t".repeat(150));
        let s1 = job_with(r#""session":"signup-42""#).session;
        assert_eq!(s1, mailgate_session("signup-42"));
        assert_eq!(format!("{s1:?}"), "Some(Session(…))");
        assert!(job_with(&long).session.is_some());
        assert!(job_with(r#""session":"tab\there""#).session.is_some());
        for ignored in [
            r#""session":"""#,
            r#""session":12345"#,
            r#""session":{"id":"abc"}"#,
        ] {
            assert_eq!(job_with(ignored).session, None, "{ignored}");
        }
        // A producer's own `created_at` that is not RFC 3339 is ignored,
        // never a reason to refuse the job.
        for created in [
            r#""1 May""#,
            "1764064800",
            r#""2026-11-25 10:00:00""#,
            "null",
            "{}",
        ] {
            let body = format!(
                r#"{{"id":"j1","email":"a@example.com","code":"1","created_at":{created}}}"#
            );
            let job = decode(body.as_bytes()).expect(&body);
            assert_eq!(job.created_at, None, "{body}");
        }
        let body = r#"{"id":"j1","email":"a@example.com","code":"1","created_at":"2026-11-25T10:00:00.5Z"}"#;
        let job = decode(body.as_bytes()).unwrap();
        assert_eq!(
            job.created_at.map(|t| t.as_millisecond()),
            Some(1_795_600_800_500)
        );
        let big = format!(
            r#"{{"id":"j1","email":"a@example.com","code":"1","pad":"{}"}}"#,
            "x".repeat(1 << 20)
        );
        assert!(invalid(&big).contains("bytes"));
    }

    #[test]
    fn numbers_stay_as_written_and_a_bom_is_skipped() {
        let mut body = b"\xEF\xBB\xBF".to_vec();
        body.extend_from_slice(
            br#"{"id":"j1","email":"a@example.com","code":"1","vars":{"n":10,"big":12345678901234567890,"neg":-3,"f":1.5,
                 "z":-0,"e":1e3,"huge":-12345678901234567890123456789012345678901234567890,"tiny":1e-400}}"#,
        );
        let job = decode(&body).expect("a BOM before JSON is skipped");
        let vars: std::collections::BTreeMap<&str, VarValue> =
            job.vars.iter().map(|(k, v)| (k, v.clone())).collect();
        assert_eq!(vars["n"], VarValue::Integer(10));
        assert_eq!(vars["big"], VarValue::Integer(12_345_678_901_234_567_890));
        assert_eq!(vars["neg"], VarValue::Integer(-3));
        assert_eq!(vars["f"], VarValue::Float(1.5));
        for (name, written) in [
            ("z", "-0"),
            ("e", "1e3"),
            (
                "huge",
                "-12345678901234567890123456789012345678901234567890",
            ),
            ("tiny", "1e-400"),
        ] {
            assert_eq!(vars[name], VarValue::Number(written.into()), "{name}");
        }
    }

    #[test]
    fn results_keep_their_shape() {
        let r = JobResult::new("j1", Status::Sent, 1);
        let v: Value = serde_json::from_slice(&r.to_json()).unwrap();
        assert_eq!(v["status"], "sent");
        assert!(v["error"].is_null() && v["rule"].is_null());
    }
}
