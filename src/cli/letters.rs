//! A dead letter as the tools show it: its job's id and masked mailbox,
//! why and when it died; written for a terminal without anything a
//! producer put in the message reaching it raw.

use lapin::message::Delivery;
use serde_json::{Value, json};

use crate::broker::{Browse, DeadLetter};
use crate::redact::mask_emails;

/// One dead letter as the commands see it.
pub(super) struct Entry {
    /// The body's `id`, if it is a JSON object with a string id.
    pub(super) id: Option<String>,
    /// The body as JSON, if it is.
    pub(super) job: Option<Value>,
    /// What its headers say.
    pub(super) dead: DeadLetter,
}

impl Entry {
    /// Reads a dead letter (its body as the worker reads one: a UTF-8 byte
    /// order mark skipped, its id found as the worker finds it, even where
    /// the rest holds what a JSON value here cannot: a number past a
    /// float's range, which the worker reads as written).
    pub(super) fn read(delivery: &Delivery) -> Entry {
        let body = &delivery.data;
        let body = body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body);
        let job: Option<Value> = serde_json::from_slice(body).ok();
        let id = (crate::wire::id_of(body).ok())
            .map(|id| id.as_str().to_owned())
            .or_else(|| {
                (job.as_ref())
                    .and_then(|j| j.get("id"))
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            });
        Entry {
            id,
            job,
            dead: DeadLetter::read(delivery),
        }
    }

    pub(super) fn field(&self, name: &str) -> Option<&str> {
        self.job.as_ref()?.get(name)?.as_str()
    }

    /// The body's mailbox, masked as the logs mask it.
    pub(super) fn mailbox(&self) -> Option<String> {
        self.field("email").map(mask_emails)
    }

    /// A line of JSON for `list` (and `job`).
    pub(super) fn summary(&self) -> Value {
        json!({
            "id": self.id,
            "email": self.mailbox(),
            "purpose": self.field("purpose"),
            "reason": self.dead.reason.as_str(),
            "error": self.dead.error.as_deref().map(mask_emails),
            "attempts": self.dead.attempts,
            "dead_at": self.dead.dead_at_ms.map(time),
        })
    }

    /// The job as `show` prints it: its code and session hidden, its
    /// variables' values hidden (a link may carry a token), its mailbox
    /// masked.
    pub(super) fn job_shown(&self) -> Value {
        let mut job = self.job.clone().unwrap_or(Value::Null);
        if let Some(fields) = job.as_object_mut() {
            for secret in ["code", "session"] {
                if fields.contains_key(secret) {
                    fields.insert(secret.into(), json!("(hidden)"));
                }
            }
            if let Some(Value::Object(vars)) = fields.get_mut("vars") {
                for v in vars.values_mut() {
                    *v = json!("(hidden)");
                }
            }
            if let Some(mailbox) = self.mailbox() {
                fields.insert("email".into(), json!(mailbox));
            }
        }
        job
    }

    /// A line of text for `list`, `replay` and `purge`.
    pub(super) fn line(&self) -> String {
        printable(&format!(
            "{:<20}  {:<14} {:>3}  {}  {}  {}",
            self.dead
                .dead_at_ms
                .map_or_else(|| "(time unknown)".into(), time),
            self.dead.reason.as_str(),
            self.dead
                .attempts
                .map_or_else(|| "-".into(), |n| n.to_string()),
            self.id.as_deref().unwrap_or("(no id)"),
            self.mailbox().unwrap_or_else(|| "-".into()),
            self.dead
                .error
                .as_deref()
                .map(mask_emails)
                .unwrap_or_default(),
        ))
    }
}

/// `text` with every control (`Cc`: C0, DEL, C1 such as the 8-bit CSI
/// U+009B) and format character (`Cf`: the bidirectional overrides such as
/// U+202E, zero-width characters) written as an escape (`\u{1b}`), so
/// that nothing a producer or a relay put in a message moves a terminal's
/// cursor, rewrites its lines, sets its title, or shows an operator
/// another id than the one acted on.
/// A backslash is written twice, so that an escape it writes is never
/// confused with the same text written by a producer (`E5\u{202e}X`).
pub(super) fn printable(text: &str) -> String {
    text.chars()
        .map(|c| match (c, unprintable(c)) {
            ('\\', _) => "\\\\".to_owned(),
            (_, true) => c.escape_unicode().to_string(),
            (_, false) => c.to_string(),
        })
        .collect()
}

/// [`printable`] line by line: text of several lines for people, each
/// made printable, the line breaks kept.
pub(super) fn printable_lines(text: &str) -> String {
    let mut out: String = text.lines().map(printable).collect::<Vec<_>>().join("\n");
    if text.ends_with('\n') {
        out.push('\n');
    }
    out
}

/// `json`, a serialized JSON text for people, with every control and
/// format character escaped as JSON escapes it (`\u009b`): serde_json
/// escapes C0 only. Such characters can stand only inside JSON strings, so
/// the text stays the same JSON.
pub(super) fn printable_json(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if unprintable(c) {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Whether `c` is a control (`Cc`) or format (`Cf`) character: the
/// Unicode 15 list of `Cf`, which no terminal should be handed raw.
fn unprintable(c: char) -> bool {
    const FORMAT: &[(u32, u32)] = &[
        (0x00AD, 0x00AD),
        (0x0600, 0x0605),
        (0x061C, 0x061C),
        (0x06DD, 0x06DD),
        (0x070F, 0x070F),
        (0x0890, 0x0891),
        (0x08E2, 0x08E2),
        (0x180E, 0x180E),
        (0x200B, 0x200F),
        (0x202A, 0x202E),
        (0x2060, 0x2064),
        (0x2066, 0x206F),
        (0xFEFF, 0xFEFF),
        (0xFFF9, 0xFFFB),
        (0x110BD, 0x110BD),
        (0x110CD, 0x110CD),
        (0x13430, 0x1343F),
        (0x1BCA0, 0x1BCA3),
        (0x1D173, 0x1D17A),
        (0xE0001, 0xE0001),
        (0xE0020, 0xE007F),
    ];
    let u = u32::from(c);
    c.is_control() || FORMAT.iter().any(|&(lo, hi)| (lo..=hi).contains(&u))
}

/// ms since the epoch as RFC 3339, to the second.
pub(super) fn time(ms: u64) -> String {
    i64::try_from(ms)
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        .map_or_else(|| ms.to_string(), |t| format!("{t:.0}"))
}

/// The dead letters of job `id` in `queue`, as `dead list --json` prints
/// them, and how many were held by another reader meanwhile; takes
/// nothing. `None` if there is no such queue.
pub(super) async fn of_job(
    conn: &lapin::Connection,
    queue: &str,
    id: &str,
) -> anyhow::Result<Option<(Vec<Value>, u32)>> {
    let Ok(mut browse) = Browse::open(conn, queue).await else {
        return Ok(None);
    };
    let mut found = Vec::new();
    while let Some(d) = browse.next().await? {
        let e = Entry::read(&d);
        if e.id.as_deref() == Some(id) {
            found.push(e.summary());
        }
        browse.keep(&d).await?;
    }
    let unseen = browse.unseen();
    browse.close().await?;
    Ok(Some((found, unseen)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_formats_and_backslashes_are_written_so_no_terminal_reads_them() {
        assert_eq!(
            printable("a\u{202e}b\u{9b}c\u{1b}"),
            "a\\u{202e}b\\u{9b}c\\u{1b}"
        );
        // A producer's own backslashes are doubled: its text never reads
        // as an escape.
        assert_eq!(printable("E5\\u{202e}X"), "E5\\\\u{202e}X");
        assert_eq!(printable_lines("a\u{7}\nb\n"), "a\\u{7}\nb\n");
        let json = serde_json::json!({"id": "x\u{202e}\u{9b}\u{e0041}"}).to_string();
        let shown = printable_json(&json);
        assert_eq!(shown, r#"{"id":"x\u202e\u009b\udb40\udc41"}"#);
        let back: serde_json::Value = serde_json::from_str(&shown).unwrap();
        assert_eq!(back["id"], "x\u{202e}\u{9b}\u{e0041}");
    }
}
