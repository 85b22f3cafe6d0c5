//! Reading one job's record as it is, and a mailbox's recent admissions,
//! for `mailgate job` and `mailgate explain` (support staff asking what
//! became of an id, or of a user's codes). Reads only; either record form.

use std::collections::HashMap;

use super::RedisLedger;
use crate::domain::JobId;
use crate::ledger::{JobState, LedgerError, Refund};
use crate::limiter::Subject;

/// One admission a scope's log counts: when, and which job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admitted {
    /// When it was admitted, ms since the epoch (Redis's clock).
    pub at_ms: u64,
    /// The job's id.
    pub id: String,
    /// Its record, if the ledger still holds one.
    pub record: Option<JobRecord>,
}

/// What the ledger holds of one job id (see `ledger.lua`'s header for the
/// fields). Only admitted ids have one, for `limits.dedup_for` after their
/// last change: rejected, invalid and expired jobs leave nothing behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRecord {
    /// Where the job's send stands.
    pub state: JobState,
    /// Whether the owning lineage's last result was confirmed by RabbitMQ.
    pub answered: bool,
    /// When it was admitted, ms since the epoch (Redis's clock).
    pub admitted_at_ms: Option<u64>,
    /// Until when its owner holds the send, ms since the epoch; 0 when no
    /// one does.
    pub lease_until_ms: u64,
    /// The owning lineage's attempt (1 for the first).
    pub attempt: Option<u32>,
    /// How much longer Redis keeps the record, ms.
    pub kept_for_ms: Option<u64>,
}

impl RedisLedger {
    /// Whether the ledger holds a record of job `id`; if so, it is kept at
    /// least `ms` more (as a write would keep it), in the same step: a
    /// replay decided by a record must find it when a worker takes the
    /// job, however long that takes.
    pub async fn hold_record(&self, id: &JobId, ms: u64) -> Result<bool, LedgerError> {
        let held: i64 = crate::store::scripts::TOOLS
            .key(self.keys.record_key(id))
            .arg("hold")
            .arg(ms.max(1))
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(held == 1)
    }

    /// The record of job `id`, if the ledger holds one.
    pub async fn record(&self, id: &JobId) -> Result<Option<JobRecord>, LedgerError> {
        let key = self.keys.record_key(id);
        let mut conn = self.conn.clone();
        let (kind, ttl): (String, i64) = redis::pipe()
            .cmd("TYPE")
            .arg(&key)
            .cmd("PTTL")
            .arg(&key)
            .query_async(&mut conn)
            .await?;
        let fields: HashMap<String, String> = match kind.as_str() {
            "none" => return Ok(None),
            "hash" => {
                redis::cmd("HGETALL")
                    .arg(&key)
                    .query_async(&mut conn)
                    .await?
            }
            "string" => {
                let text: String = redis::cmd("GET").arg(&key).query_async(&mut conn).await?;
                from_string(&text)
            }
            other => {
                return Err(LedgerError::Protocol(format!(
                    "{key} is a {other}, not a job record"
                )));
            }
        };
        let mut record = from_fields(&fields)
            .ok_or_else(|| LedgerError::Protocol(format!("{key} is not a job record")))?;
        record.kept_for_ms = u64::try_from(ttl).ok();
        Ok(Some(record))
    }
}

impl RedisLedger {
    /// The admissions `subject`'s log counts, newest first, at most `max`,
    /// each with its job's record. Reads only.
    pub async fn admissions(
        &self,
        subject: Subject<'_>,
        max: usize,
    ) -> Result<Vec<Admitted>, LedgerError> {
        let key = self.keys.key_of(subject);
        let text: Option<Vec<u8>> = redis::cmd("GET")
            .arg(&key)
            .query_async(&mut self.conn.clone())
            .await?;
        let entries = super::log::entries(&text.unwrap_or_default())
            .ok_or_else(|| LedgerError::Protocol(format!("{key} holds no log")))?;
        let mut found = Vec::with_capacity(entries.len().min(max));
        for (at_ms, logged) in entries.into_iter().take(max.max(1)) {
            // The id (a failure's stays counted with \u{1} appended; with
            // keys spread over a cluster's shards, ':' and the
            // reservation's nonce follow it).
            let rest = logged.strip_suffix('\u{1}').unwrap_or(&logged);
            let mut id = rest.to_owned();
            let mut record = self.record_of(&id).await?;
            if record.is_none()
                && let Some((without_nonce, _)) = rest.rsplit_once(':')
                && let Some(r) = self.record_of(without_nonce).await?
            {
                (id, record) = (without_nonce.to_owned(), Some(r));
            }
            found.push(Admitted { at_ms, id, record });
        }
        Ok(found)
    }

    async fn record_of(&self, id: &str) -> Result<Option<JobRecord>, LedgerError> {
        match JobId::parse(id) {
            Ok(id) => self.record(&id).await,
            Err(_) => Ok(None),
        }
    }
}

/// A string record's fields by their hash names:
/// `<st><ans><fin>|<lease>|<own>|<n>|<c>|<at>|<rv>|<fp>` (records.lua).
fn from_string(text: &str) -> HashMap<String, String> {
    let mut parts = text.splitn(8, '|');
    let head = parts.next().unwrap_or_default();
    let mut fields = HashMap::new();
    for (name, range) in [("st", 0..1), ("ans", 1..2), ("fin", 2..3)] {
        if let Some(c) = head.get(range) {
            fields.insert(name.to_owned(), c.to_owned());
        }
    }
    for (name, value) in ["lease", "own", "n", "c", "at", "rv", "fp"]
        .into_iter()
        .zip(parts)
    {
        fields.insert(name.to_owned(), value.to_owned());
    }
    fields
}

/// The record its fields describe; `None` without a known state.
fn from_fields(f: &HashMap<String, String>) -> Option<JobRecord> {
    let byte = |name: &str| f.get(name).and_then(|v| v.bytes().next());
    let number = |name: &str| f.get(name).and_then(|v| v.parse::<u64>().ok());
    let state = match byte("st")? {
        b'a' => JobState::Admitted,
        b'x' => JobState::Sending,
        b's' => JobState::Sent,
        b'u' => JobState::Unknown,
        b'r' => JobState::Refunded(byte("fin").and_then(Refund::from_code)?),
        _ => return None,
    };
    Some(JobRecord {
        state,
        answered: byte("ans") == Some(b'1'),
        admitted_at_ms: number("at"),
        lease_until_ms: number("lease").unwrap_or(0),
        attempt: f
            .get("n")
            .and_then(|n| n.split(':').next())
            .and_then(|a| a.parse().ok()),
        kept_for_ms: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_forms_read_alike() {
        let string = from_string("r1f|0|T1|2:h|c9|1800000000000||0123abcd");
        let hash: HashMap<String, String> = [
            ("st", "r"),
            ("ans", "1"),
            ("fin", "f"),
            ("lease", "0"),
            ("own", "T1"),
            ("n", "2:h"),
            ("c", "c9"),
            ("at", "1800000000000"),
            ("fp", "0123abcd"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let want = JobRecord {
            state: JobState::Refunded(Refund::Failed),
            answered: true,
            admitted_at_ms: Some(1_800_000_000_000),
            lease_until_ms: 0,
            attempt: Some(2),
            kept_for_ms: None,
        };
        assert_eq!(from_fields(&string), Some(want.clone()));
        assert_eq!(from_fields(&hash), Some(want));
        assert_eq!(from_fields(&from_string("zzz|")), None);
    }
}
