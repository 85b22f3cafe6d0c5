//! Reading a dead letter's headers, and what its replay carries: for
//! `mailgate dead`.

use lapin::BasicProperties;
use lapin::message::Delivery;
use lapin::types::{AMQPValue, FieldTable};

use super::incoming::{as_string, as_u32, as_u64};
use super::{
    ATTEMPT_HEADER, ATTEMPTS_HEADER, DEAD_AT_HEADER, ERROR_HEADER, LOOK_HEADER, ORIGINAL_HEADER,
    REASON_HEADER, SEEN_HEADER, TICKET_HEADER, UNRECORDED_HEADER,
};
use crate::domain::DeadReason;

/// RabbitMQ's own dead-letter history on a message (a quorum jobs queue's
/// delivery limit writes it).
const DEATH_HEADER: &str = "x-death";

/// What a worker found of a job's record as it dead-lettered the job: none,
/// at `at_ms` by the ledger's clock. Every record the ledger writes lives
/// at least a floor after its last write, whatever any worker's
/// `limits.dedup_for` (an hour: `dedup_for` and the clock's slack), so
/// until `at_ms` and that floor, by the ledger's clock, a missing record
/// means the id was never admitted since, and a replay cannot mail it
/// twice. Without it (the worker found a record, or could not ask), a
/// missing record may be one forgotten: the job's own mail, or another
/// message's of the same id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unrecorded {
    /// When the ledger held no record of the id, ms since the epoch, on the
    /// ledger's clock.
    pub at_ms: u64,
}

impl Unrecorded {
    /// Until when, by the ledger's clock, a missing record still means the
    /// id was never admitted since `at_ms`, with every record kept at
    /// least `floor_ms` after its last write. Not from any `dedup_for`: a
    /// worker whose setting is smaller may have admitted the id since.
    pub fn proves_until(&self, floor_ms: u64) -> u64 {
        self.at_ms.saturating_add(floor_ms)
    }
}

/// What a dead letter's headers say of why and when it died.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// Why: RabbitMQ's `x-death` reason if it dead-lettered it, else
    /// mailgate's `x-mailgate-reason`, else what the error text of an
    /// earlier version says.
    pub reason: DeadReason,
    /// Why, for people (`x-mailgate-error`, or RabbitMQ's reason and queue).
    pub error: Option<String>,
    /// Attempts made (`x-mailgate-attempts`), if mailgate wrote it.
    pub attempts: Option<u32>,
    /// When it died, ms since the epoch: mailgate's `x-mailgate-dead-ms`,
    /// or RabbitMQ's `x-death` time (whole seconds); `None` for dead
    /// letters of versions that wrote neither.
    pub dead_at_ms: Option<u64>,
    /// Whether RabbitMQ dead-lettered it (its `x-death`): then its time
    /// is RabbitMQ's record, which keeps a time a producer wrote.
    pub by_rabbitmq: bool,
    /// The worker found no record of its id as it dead-lettered it
    /// (mailgate's headers; never on one RabbitMQ dead-lettered, whose
    /// headers a producer may have written).
    pub unrecorded: Option<Unrecorded>,
}

impl DeadLetter {
    /// Reads `delivery`'s headers.
    pub fn read(delivery: &Delivery) -> DeadLetter {
        DeadLetter::from_headers(delivery.properties.headers().as_ref())
    }

    /// Reads a dead letter's headers.
    fn from_headers(headers: Option<&FieldTable>) -> DeadLetter {
        let header = |name: &str| headers.and_then(|h| h.inner().get(name));
        let error = header(ERROR_HEADER).and_then(as_string);
        let attempts = header(ATTEMPTS_HEADER).and_then(as_u32);
        // RabbitMQ's history first: a producer could write mailgate's
        // headers on a job, never RabbitMQ's on its dead letter.
        if let Some(death) = header(DEATH_HEADER).and_then(latest_death) {
            let why = death
                .inner()
                .get("reason")
                .and_then(as_string)
                .unwrap_or_default();
            let queue = death
                .inner()
                .get("queue")
                .and_then(as_string)
                .unwrap_or_default();
            return DeadLetter {
                reason: match why.as_str() {
                    "delivery_limit" => DeadReason::DeliveryLimit,
                    _ => DeadReason::Other,
                },
                error: Some(format!("rabbitmq dead-lettered it from {queue:?}: {why}")),
                attempts,
                dead_at_ms: death
                    .inner()
                    .get("time")
                    .and_then(as_u64)
                    .map(|s| s.saturating_mul(1000)),
                by_rabbitmq: true,
                unrecorded: None,
            };
        }
        let reason = header(REASON_HEADER)
            .and_then(as_string)
            .and_then(|w| DeadReason::parse(&w))
            .or_else(|| error.as_deref().map(DeadReason::from_error_text))
            .unwrap_or(DeadReason::Other);
        DeadLetter {
            reason,
            error,
            attempts,
            dead_at_ms: header(DEAD_AT_HEADER).and_then(as_u64),
            by_rabbitmq: false,
            unrecorded: header(UNRECORDED_HEADER)
                .and_then(as_u64)
                .map(|at_ms| Unrecorded { at_ms }),
        }
    }

    /// The properties `delivery`, a dead letter, is replayed with: a fresh
    /// job, attempt 1 of a lineage of its own (no ticket, no attempt), with
    /// what mailgate needs of the original (`reply_to`, `correlation_id`,
    /// the publish time, in its properties or `x-mailgate-*` headers) and
    /// the producer's properties and headers, but neither the dead
    /// letter's own headers nor RabbitMQ's history. `expiration` (it ran
    /// out once already) and `user_id` (RabbitMQ refuses one that is not
    /// the publisher's user) are left out.
    pub fn replay_properties(delivery: &Delivery) -> BasicProperties {
        let p = &delivery.properties;
        let mut props = BasicProperties::default();
        if let Some(v) = p.content_type() {
            props = props.with_content_type(v.clone());
        }
        if let Some(v) = p.content_encoding() {
            props = props.with_content_encoding(v.clone());
        }
        if let Some(v) = p.correlation_id() {
            props = props.with_correlation_id(v.clone());
        }
        if let Some(v) = p.reply_to() {
            props = props.with_reply_to(v.clone());
        }
        if let Some(v) = p.message_id() {
            props = props.with_message_id(v.clone());
        }
        if let Some(v) = p.kind() {
            props = props.with_type(v.clone());
        }
        if let Some(v) = p.app_id() {
            props = props.with_app_id(v.clone());
        }
        if let Some(v) = p.timestamp() {
            props = props.with_timestamp(*v);
        }
        if let Some(v) = p.priority() {
            props = props.with_priority(*v);
        }
        let headers: FieldTable = p
            .headers()
            .as_ref()
            .map(|h| {
                h.inner()
                    .iter()
                    .filter(|(k, _)| !dead_letters_own(k.as_str()))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect::<std::collections::BTreeMap<_, _>>()
                    .into()
            })
            .unwrap_or_default();
        props.with_headers(headers)
    }
}

/// Whether `header` belongs to the dead letter rather than to the job: its
/// lineage, mailgate's account of its death, or RabbitMQ's bookkeeping
/// (its dead-letter history, a quorum queue's delivery count).
fn dead_letters_own(header: &str) -> bool {
    [
        TICKET_HEADER,
        ATTEMPT_HEADER,
        ERROR_HEADER,
        ATTEMPTS_HEADER,
        ORIGINAL_HEADER,
        REASON_HEADER,
        DEAD_AT_HEADER,
        UNRECORDED_HEADER,
        SEEN_HEADER,
        DEATH_HEADER,
        LOOK_HEADER,
        "x-delivery-count",
    ]
    .contains(&header)
        || header.starts_with("x-first-death-")
        || header.starts_with("x-last-death-")
}

/// The most recent entry of an `x-death` header (RabbitMQ puts it first).
fn latest_death(v: &AMQPValue) -> Option<&FieldTable> {
    match v {
        AMQPValue::FieldArray(a) => a.as_slice().iter().find_map(|e| match e {
            AMQPValue::FieldTable(t) => Some(t),
            _ => None,
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> AMQPValue {
        AMQPValue::LongString(s.into())
    }

    #[test]
    fn rabbitmqs_history_comes_before_mailgates_headers() {
        let mut death = FieldTable::default();
        death.insert("reason".into(), text("delivery_limit"));
        death.insert("queue".into(), text("mailgate.jobs"));
        death.insert("time".into(), AMQPValue::Timestamp(1_800_000_000));
        let mut h = FieldTable::default();
        h.insert(
            DEATH_HEADER.into(),
            AMQPValue::FieldArray(vec![AMQPValue::FieldTable(death)].into()),
        );
        // A producer may write mailgate's header on its job.
        h.insert(REASON_HEADER.into(), text("failed"));
        let d = DeadLetter::from_headers(Some(&h));
        assert_eq!(d.reason, DeadReason::DeliveryLimit);
        assert_eq!(d.dead_at_ms, Some(1_800_000_000_000));
        assert!(d.error.unwrap().contains("mailgate.jobs"));
    }

    #[test]
    fn a_reason_comes_from_the_header_else_from_the_error_text() {
        let mut h = FieldTable::default();
        h.insert(ERROR_HEADER.into(), text("gave up after 5 attempts: 451"));
        assert_eq!(
            DeadLetter::from_headers(Some(&h)).reason,
            DeadReason::Failed,
            "a version before the reason header"
        );
        h.insert(REASON_HEADER.into(), text("panic"));
        h.insert(DEAD_AT_HEADER.into(), AMQPValue::LongLongInt(5));
        let d = DeadLetter::from_headers(Some(&h));
        assert_eq!((d.reason, d.dead_at_ms), (DeadReason::Panic, Some(5)));
        assert_eq!(DeadLetter::from_headers(None).reason, DeadReason::Other);
    }

    #[test]
    fn a_replay_keeps_the_jobs_headers_and_drops_the_dead_letters() {
        for own in [
            "x-mailgate-ticket",
            "x-mailgate-attempt",
            "x-mailgate-error",
            "x-mailgate-reason",
            "x-mailgate-look",
            "x-mailgate-unrecorded-ms",
            "x-death",
            "x-delivery-count",
            "x-first-death-reason",
        ] {
            assert!(dead_letters_own(own), "{own}");
        }
        for theirs in [
            "x-mailgate-reply-to",
            "x-mailgate-correlation-id",
            "x-mailgate-published-ms",
            "x-mailgate-redelivered",
            "traceparent",
            "tenant",
        ] {
            assert!(!dead_letters_own(theirs), "{theirs}");
        }
    }
}
