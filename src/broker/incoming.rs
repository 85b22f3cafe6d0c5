//! A job message as it arrived: what mailgate reads of its properties and
//! headers, settling it, and what its copies carry of it.

use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicRejectOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};

use super::{
    ATTEMPT_HEADER, BrokerError, CORRELATION_HEADER, DELIVERY_COUNT_HEADER, PUBLISHED_HEADER,
    REDELIVERED_HEADER, REPLY_TO_HEADER, SEEN_HEADER, TICKET_HEADER, TIMESTAMP_MS_HEADER,
    TRACEPARENT_HEADER, TRACESTATE_HEADER,
};
use crate::domain::{Ticket, now_ms};

/// The largest original header table kept on a dead letter, in bytes as
/// counted by [`encoded_len`]; a larger one is left out, so a dead letter's
/// header frame stays far below RabbitMQ's frame limit.
const MAX_ORIGINAL_BYTES: usize = 16 * 1024;
/// The deepest nesting of tables and arrays kept on a dead letter; a deeper
/// one is left out, so encoding it never recurses far.
const MAX_ORIGINAL_DEPTH: usize = 8;

/// A message's W3C trace context, as its headers carry it (checked by the
/// propagator that reads it, `crate::traces`, not here).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceHeaders {
    /// `traceparent`: version, trace id, parent span id, flags.
    pub traceparent: Option<String>,
    /// `tracestate`: vendors' entries.
    pub tracestate: Option<String>,
}

/// A job message as it arrived.
#[derive(Debug)]
pub struct Incoming {
    /// Where the producer wants the result, if not the results queue: the
    /// `reply_to` property, else (on mailgate's copies) [`REPLY_TO_HEADER`].
    pub reply_to: Option<String>,
    /// Copied onto the result: the `correlation_id` property, else (on
    /// copies) [`CORRELATION_HEADER`].
    pub correlation_id: Option<String>,
    /// The lineage this message continues, if it is one of mailgate's own
    /// copies (it carries a well-formed [`TICKET_HEADER`]).
    pub ticket: Option<Ticket>,
    /// 1 for the first attempt; from [`ATTEMPT_HEADER`] on mailgate's copies.
    pub attempt: u32,
    /// Whether this is a producer's message RabbitMQ delivered before (to a
    /// consumer that did not acknowledge it), or one of mailgate's copies of
    /// such a message (moved to `J.redelivered`, or waiting out a lease:
    /// [`REDELIVERED_HEADER`]). Its mail may have gone out under the first
    /// delivery's lineage, so a `sent` record answers it `sent`.
    pub redelivered: bool,
    /// How many times a quorum queue handed this message out before without
    /// its being settled (`x-delivery-count`; 0 on a first delivery and on
    /// classic queues, which do not count). At [`DELIVERY_LIMIT`](super::DELIVERY_LIMIT) the
    /// broker dead-letters it.
    pub deliveries_before: u32,
    /// When the producer published it, ms since the epoch.
    pub published_at_ms: Option<u64>,
    /// When a worker first took it (its lineage: carried on mailgate's
    /// copies, [`SEEN_HEADER`]), ms since the epoch; now, on a first
    /// delivery.
    pub seen_at_ms: u64,
    /// The producer's trace context, if it sent one.
    pub trace: TraceHeaders,
    delivery: Delivery,
}

impl Incoming {
    /// Wraps a delivery, reading what mailgate needs of its properties.
    pub fn new(delivery: Delivery) -> Self {
        let p = &delivery.properties;
        let header = |name: &str| p.headers().as_ref().and_then(|h| h.inner().get(name));
        // Header strings become AMQP short strings again on the result, so
        // only those that fit one are honoured.
        let short = |name: &str| {
            header(name)
                .and_then(as_string)
                .filter(|s| !s.is_empty() && s.len() <= 255)
        };
        let ticket = short(TICKET_HEADER).and_then(|t| Ticket::parse(&t));
        // A producer's message, not one of mailgate's copies.
        let producers = ticket.is_none();
        let attempt = match ticket {
            Some(_) => header(ATTEMPT_HEADER).and_then(as_u32).unwrap_or(1).max(1),
            None => 1,
        };
        Self {
            reply_to: p
                .reply_to()
                .as_ref()
                .map(|s| s.to_string())
                .filter(|s| !s.is_empty())
                .or_else(|| short(REPLY_TO_HEADER)),
            correlation_id: p
                .correlation_id()
                .as_ref()
                .map(|s| s.to_string())
                .or_else(|| short(CORRELATION_HEADER)),
            ticket,
            attempt,
            redelivered: header(REDELIVERED_HEADER).is_some()
                || (producers && delivery.redelivered),
            // Only on a message RabbitMQ says it delivered before: a
            // producer can write the header on a first delivery, and must
            // not push its jobs through the one-at-a-time lane so.
            deliveries_before: match delivery.redelivered {
                true => header(DELIVERY_COUNT_HEADER).and_then(as_u32).unwrap_or(0),
                false => 0,
            },
            published_at_ms: header(PUBLISHED_HEADER)
                .or_else(|| header(TIMESTAMP_MS_HEADER))
                .and_then(as_u64)
                .or_else(|| p.timestamp().map(|s| s.saturating_mul(1000))),
            // Never later than now: a header cannot make a job younger
            // than its delivery.
            seen_at_ms: (header(SEEN_HEADER).and_then(as_u64))
                .map_or_else(now_ms, |at| at.min(now_ms())),
            // Within the spec's lengths (55 and 512 characters), with room.
            trace: TraceHeaders {
                traceparent: header(TRACEPARENT_HEADER)
                    .and_then(as_string)
                    .filter(|s| s.len() <= 256),
                tracestate: header(TRACESTATE_HEADER)
                    .and_then(as_string)
                    .filter(|s| s.len() <= 1024),
            },
            delivery,
        }
    }

    /// The raw body (borrowed from the delivery: not copied).
    pub fn body(&self) -> &[u8] {
        &self.delivery.data
    }

    /// Acknowledges the message: it is done.
    pub async fn ack(&self) -> Result<(), BrokerError> {
        self.delivery.ack(BasicAckOptions::default()).await?;
        Ok(())
    }

    /// Hands the message back to RabbitMQ for another consumer (when even
    /// its dead letter could not be published).
    pub async fn requeue(&self) -> Result<(), BrokerError> {
        self.delivery
            .reject(BasicRejectOptions { requeue: true })
            .await?;
        Ok(())
    }

    /// The headers every copy of this message carries: what mailgate needs
    /// of the original.
    pub(super) fn copy_headers(&self) -> FieldTable {
        let mut h = FieldTable::default();
        let mut put = |name: &str, v: AMQPValue| {
            h.insert(name.into(), v);
        };
        if let Some(r) = &self.reply_to {
            put(REPLY_TO_HEADER, AMQPValue::LongString(r.as_str().into()));
        }
        if let Some(c) = &self.correlation_id {
            put(CORRELATION_HEADER, AMQPValue::LongString(c.as_str().into()));
        }
        put(
            SEEN_HEADER,
            AMQPValue::LongLongInt(i64::try_from(self.seen_at_ms).unwrap_or(i64::MAX)),
        );
        if let Some(ms) = self.published_at_ms {
            put(
                PUBLISHED_HEADER,
                AMQPValue::LongLongInt(i64::try_from(ms).unwrap_or(i64::MAX)),
            );
        }
        // A retry continues the producer's trace.
        put_trace(&mut h, &self.trace);
        h
    }

    /// The original properties, as a nested table for a dead letter.
    pub(super) fn original(&self) -> AMQPValue {
        let p = &self.delivery.properties;
        let mut t = FieldTable::default();
        let mut text = |name: &str, v: &Option<ShortString>| {
            if let Some(v) = v {
                t.insert(name.into(), AMQPValue::LongString(v.as_str().into()));
            }
        };
        text("content_type", p.content_type());
        text("content_encoding", p.content_encoding());
        text("correlation_id", p.correlation_id());
        text("reply_to", p.reply_to());
        text("expiration", p.expiration());
        text("message_id", p.message_id());
        text("type", p.kind());
        text("user_id", p.user_id());
        text("app_id", p.app_id());
        if let Some(ts) = p.timestamp() {
            t.insert("timestamp".into(), AMQPValue::Timestamp(*ts));
        }
        if let Some(h) = p.headers() {
            // mailgate's own headers (a ticket above all: a replay must start
            // a lineage of its own) and RabbitMQ's dead-letter history stay
            // behind. The size and depth are judged before anything is
            // copied, so a table nested thousands deep is never walked far.
            let theirs: Vec<_> = h
                .inner()
                .iter()
                .filter(|(k, _)| !k.as_str().starts_with("x-mailgate-") && k.as_str() != "x-death")
                .collect();
            let len = theirs.iter().try_fold(5, |n, (k, v)| {
                Some(n + 1 + k.as_str().len() + encoded_len(v, MAX_ORIGINAL_DEPTH - 1)?)
            });
            let kept = match len {
                Some(len) if len <= MAX_ORIGINAL_BYTES => AMQPValue::FieldTable(
                    theirs
                        .into_iter()
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect::<std::collections::BTreeMap<_, _>>()
                        .into(),
                ),
                Some(len) => AMQPValue::LongString(format!("left out: {len} bytes").into()),
                None => AMQPValue::LongString(
                    format!("left out: nested deeper than {MAX_ORIGINAL_DEPTH}").into(),
                ),
            };
            t.insert("headers".into(), kept);
        }
        AMQPValue::FieldTable(t)
    }
}

/// Roughly how many bytes an AMQP value takes on the wire (an upper bound
/// within a few bytes per entry), without encoding it; `None` if tables and
/// arrays nest deeper than `depth`.
fn encoded_len(v: &AMQPValue, depth: usize) -> Option<usize> {
    let inner = |v| depth.checked_sub(1).and_then(|d| encoded_len(v, d));
    Some(match v {
        AMQPValue::LongString(s) => 5 + s.as_bytes().len(),
        AMQPValue::ShortString(s) => 2 + s.as_str().len(),
        AMQPValue::ByteArray(b) => 5 + b.as_slice().len(),
        AMQPValue::FieldTable(t) => {
            let mut n = 5;
            for (k, v) in t.inner() {
                n += 1 + k.as_str().len() + inner(v)?;
            }
            n
        }
        AMQPValue::FieldArray(a) => {
            let mut n = 5;
            for v in a.as_slice() {
                n += inner(v)?;
            }
            n
        }
        _ => 9,
    })
}

pub(super) fn as_string(v: &AMQPValue) -> Option<String> {
    match v {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        _ => None,
    }
}

pub(super) fn as_u32(v: &AMQPValue) -> Option<u32> {
    as_u64(v).and_then(|n| u32::try_from(n).ok())
}

pub(super) fn as_u64(v: &AMQPValue) -> Option<u64> {
    let n: i64 = match v {
        AMQPValue::ShortShortInt(n) => (*n).into(),
        AMQPValue::ShortShortUInt(n) => (*n).into(),
        AMQPValue::ShortInt(n) => (*n).into(),
        AMQPValue::ShortUInt(n) => (*n).into(),
        AMQPValue::LongInt(n) => (*n).into(),
        AMQPValue::LongUInt(n) => (*n).into(),
        AMQPValue::LongLongInt(n) => *n,
        AMQPValue::Timestamp(n) => return Some(*n),
        _ => return None,
    };
    u64::try_from(n).ok()
}

/// Writes `trace`'s headers into `headers`.
pub(super) fn put_trace(headers: &mut FieldTable, trace: &TraceHeaders) {
    for (name, value) in [
        (TRACEPARENT_HEADER, &trace.traceparent),
        (TRACESTATE_HEADER, &trace.tracestate),
    ] {
        if let Some(v) = value {
            headers.insert(name.into(), AMQPValue::LongString(v.as_str().into()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoded_len_bounds_nested_tables() {
        let mut inner = FieldTable::default();
        inner.insert("CC".into(), AMQPValue::LongString("x".repeat(100).into()));
        let mut outer = FieldTable::default();
        outer.insert("h".into(), AMQPValue::FieldTable(inner));
        let outer = AMQPValue::FieldTable(outer);
        let n = encoded_len(&outer, 8).expect("two levels");
        assert!((110..130).contains(&n), "{n}");
        assert_eq!(encoded_len(&outer, 1), None, "deeper than allowed");
    }
}
