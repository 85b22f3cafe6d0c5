//! RabbitMQ: the queues mailgate uses, consuming jobs, and publishing
//! results, retries and dead letters with publisher confirms.
//!
//! Queues (all durable, messages persistent), for `jobs_queue = J`:
//! - `J`: jobs from producers.
//! - `J.retry.<n>`: jobs whose attempt `n` failed transiently, waiting out
//!   their backoff (per-message TTL), then dead-lettered back to `J`. One
//!   queue per attempt, so messages in a queue have similar TTLs and none
//!   waits behind a much longer one.
//! - `J.wait.<ms>`: jobs waiting for another attempt's send lease to lapse,
//!   back to `J` likewise; one queue per band of delays up to `<ms>`
//!   (`Settings::wait_bands_ms`), so a short wait never sits behind a wait
//!   of the whole lease. (`J.wait`, the one wait queue of earlier versions,
//!   is no longer declared; it empties itself.)
//! - `J.redelivered`: messages `J` handed out before without their being
//!   settled (a quorum queue's `x-delivery-count`): their worker died or
//!   lost its connection holding them. Moved here as they come back, and
//!   consumed one at a time per worker, so that a message that kills
//!   every worker it reaches is the only one in flight when it does: only
//!   its deliveries are counted, and the broker's delivery limit
//!   dead-letters it alone, never the jobs that were in flight beside it.
//! - `J.dead`: messages that cannot be answered, or whose answer cannot be
//!   delivered, with the reason in their headers. Never consumed by the
//!   worker; `mailgate dead` lists, replays and purges them.
//! - `results_queue`: results, unless a job names its own `reply_to`.
//!
//! **Only mailgate's own properties and headers are republished.** A copy
//! (retry, wait, dead letter) is a new message whose properties mailgate
//! writes from scratch: a producer's `user_id`, `expiration`, or `CC`/`BCC`
//! headers (which RabbitMQ interprets) never travel on. What mailgate needs
//! of the original (`reply_to`, `correlation_id`, the publish time) travels
//! in `x-mailgate-*` headers, and a dead letter keeps the original
//! properties, for people, under `x-mailgate-original`, a nested table
//! RabbitMQ does not interpret.
//!
//! A job is acknowledged only after whatever replaced it (its result, its
//! retry, its dead letter) was confirmed by the broker, so a crash at any
//! point loses nothing: the job comes back and is de-duplicated by id.
//!
//! Files: `connect` (choosing a node that answers; the [`Broker`]'s
//! connection and channels), `topology` (the queues' names and arguments),
//! `incoming` (what a delivered job's properties and headers say, and what
//! its copies carry of it), `ops` (consuming, and the confirmed publishes
//! of results, retries, waits and dead letters), `browse` (looking at a
//! queue without taking what it does not act on: the tools'), `dead` (what
//! a dead letter's headers say, and what its replay carries).

mod browse;
mod connect;
mod dead;
mod incoming;
mod ops;
mod topology;

use std::time::Duration;

pub use browse::Browse;
pub use connect::{Broker, connect_node};
pub use dead::{DeadLetter, Unrecorded};
pub use incoming::{Incoming, TraceHeaders};
pub use ops::{Consumers, QueueState, declared_with, delete_queue, queue_state};
pub use topology::Topology;

/// How many times a quorum jobs queue delivers a message before RabbitMQ
/// dead-letters it: RabbitMQ 4's default. mailgate's own attempts never
/// count towards it (each retry and each lease wait is a new message), so
/// only a message handed back again and again, by workers that crash or
/// shut down holding it, reaches it.
pub const DELIVERY_LIMIT: i64 = 20;

/// The header a quorum queue sets on a message it hands out again: how many
/// deliveries of it ended without an ack.
const DELIVERY_COUNT_HEADER: &str = "x-delivery-count";

/// The header on mailgate's copies of a producer's message that was
/// delivered before (moved to `J.redelivered`, or waiting out a lease): a
/// copy is a new message, delivered for the first time, and would
/// otherwise forget it.
pub const REDELIVERED_HEADER: &str = "x-mailgate-redelivered";

/// The header carrying a copy's attempt number (1 for the first). Read only
/// on messages that also carry a [`TICKET_HEADER`]: mailgate's own copies.
pub const ATTEMPT_HEADER: &str = "x-mailgate-attempt";
/// The header carrying a copy's lineage ([`Ticket`](crate::domain::Ticket)).
pub const TICKET_HEADER: &str = "x-mailgate-ticket";
/// The original `reply_to`, on copies.
pub const REPLY_TO_HEADER: &str = "x-mailgate-reply-to";
/// The original `correlation_id`, on copies.
pub const CORRELATION_HEADER: &str = "x-mailgate-correlation-id";
/// When the producer published the job, ms since the epoch, on copies.
pub const PUBLISHED_HEADER: &str = "x-mailgate-published-ms";
/// When a worker first took the job (this lineage), ms since the epoch, on
/// mailgate's copies: what `limits.max_age` counts from. A replayed dead
/// letter does not carry it: a replay is taken afresh.
pub const SEEN_HEADER: &str = "x-mailgate-seen-ms";
/// Publish time in ms as producers may set it (the header RabbitMQ's
/// timestamp plugin uses); the AMQP `timestamp` property has whole seconds.
pub const TIMESTAMP_MS_HEADER: &str = "timestamp_in_ms";
/// On dead letters: why the message could not be processed or answered.
pub const ERROR_HEADER: &str = "x-mailgate-error";
/// On dead letters: why, as one word ([`DeadReason`](crate::domain::DeadReason)).
pub const REASON_HEADER: &str = "x-mailgate-reason";
/// On dead letters: when mailgate dead-lettered it, ms since the epoch.
pub const DEAD_AT_HEADER: &str = "x-mailgate-dead-ms";
/// On dead letters: how many attempts were made (for people; a dead letter
/// moved back to the jobs queue starts again at attempt 1).
pub const ATTEMPTS_HEADER: &str = "x-mailgate-attempts";
/// On dead letters: when the worker found the ledger held no record of
/// the job's id, ms on the ledger's clock (Redis's `TIME`); absent where it
/// held one, or could not say: until when a missing record still means
/// "never admitted since" ([`Unrecorded`]).
pub const UNRECORDED_HEADER: &str = "x-mailgate-unrecorded-ms";
/// On dead letters: the original message's properties and headers, nested
/// so RabbitMQ interprets none of them.
pub const ORIGINAL_HEADER: &str = "x-mailgate-original";

/// On a message a look ([`Browse`]) published again: which look did, so
/// that it knows its own copies should it come round to them (another
/// reader took the rest of the queue meanwhile). Overwritten by each look;
/// read by nothing else.
pub const LOOK_HEADER: &str = "x-mailgate-look";

/// The W3C trace context headers (<https://www.w3.org/TR/trace-context/>):
/// read from a producer's job, carried on mailgate's copies of it, and
/// written on its result.
pub const TRACEPARENT_HEADER: &str = "traceparent";
/// See [`TRACEPARENT_HEADER`].
pub const TRACESTATE_HEADER: &str = "tracestate";

/// Why a broker operation failed.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// The connection, the channel, or an operation on them failed (the
    /// source). The job stays unacknowledged and RabbitMQ delivers it again.
    #[error("rabbitmq")]
    Amqp(#[from] lapin::Error),
    /// RabbitMQ did not complete an operation within `amqp.timeout` (a
    /// memory or disk alarm blocks publishing). The connection is being
    /// closed, so the job goes back to the queue.
    #[error("rabbitmq did not answer within {0:?}")]
    Timeout(Duration),
    /// RabbitMQ refused the message (a negative confirm, or no queue to take
    /// it even after declaring it again). Retrying the same publish would
    /// fail the same way.
    #[error("rabbitmq refused {queue}: {why}")]
    Refused {
        /// Where it was published.
        queue: String,
        /// What RabbitMQ said.
        why: String,
    },
    /// `[amqp.tls]` cannot be used (a file went missing after start-up).
    #[error("{0}")]
    Tls(String),
}
