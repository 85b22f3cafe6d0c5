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
//!   delivered, with the reason in their headers. Never consumed by mailgate.
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

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    BasicRejectOptions, ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, Consumer};

use crate::domain::Ticket;
use crate::settings::{AmqpSettings, QueueType, Settings, redact_url};
use crate::tls::LinkTls;

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
/// The header carrying a copy's lineage ([`Ticket`]).
pub const TICKET_HEADER: &str = "x-mailgate-ticket";
/// The original `reply_to`, on copies.
pub const REPLY_TO_HEADER: &str = "x-mailgate-reply-to";
/// The original `correlation_id`, on copies.
pub const CORRELATION_HEADER: &str = "x-mailgate-correlation-id";
/// When the producer published the job, ms since the epoch, on copies.
pub const PUBLISHED_HEADER: &str = "x-mailgate-published-ms";
/// Publish time in ms as producers may set it (the header RabbitMQ's
/// timestamp plugin uses); the AMQP `timestamp` property has whole seconds.
pub const TIMESTAMP_MS_HEADER: &str = "timestamp_in_ms";
/// On dead letters: why the message could not be processed or answered.
pub const ERROR_HEADER: &str = "x-mailgate-error";
/// On dead letters: how many attempts were made (for people; a dead letter
/// moved back to the jobs queue starts again at attempt 1).
pub const ATTEMPTS_HEADER: &str = "x-mailgate-attempts";
/// On dead letters: the original message's properties and headers, nested
/// so RabbitMQ interprets none of them.
pub const ORIGINAL_HEADER: &str = "x-mailgate-original";

/// The largest original header table kept on a dead letter, in bytes as
/// counted by [`encoded_len`]; a larger one is left out, so a dead letter's
/// header frame stays far below RabbitMQ's frame limit.
const MAX_ORIGINAL_BYTES: usize = 16 * 1024;
/// The deepest nesting of tables and arrays kept on a dead letter; a deeper
/// one is left out, so encoding it never recurses far.
const MAX_ORIGINAL_DEPTH: usize = 8;

/// Why a broker operation failed.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// The connection, the channel, or an operation on them failed. The job
    /// stays unacknowledged and RabbitMQ delivers it again.
    #[error("rabbitmq: {0}")]
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

/// Connects to one of `amqp.url`'s nodes: the first that answers, each
/// within `amqp.timeout`, in the order listed. The first connection starts
/// at the first node; each later one at the node after the one used last,
/// so a node that went away (taking the connection with it) costs no
/// attempt, even one that never answers. With every node down, the error
/// is the last node's.
pub async fn connect_node(
    settings: &AmqpSettings,
    props: ConnectionProperties,
) -> Result<Connection, BrokerError> {
    /// The node to try first.
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let urls = settings.urls();
    let n = urls.len();
    let tls = settings
        .link_tls()
        .map_err(|e| BrokerError::Tls(e.to_string()))?;
    let first = NEXT.load(Ordering::Relaxed);
    let mut last = None;
    for i in (first..first + n).map(|i| i % n) {
        let url = urls[i];
        let quiet = match silence(url) {
            Some(Silence::Resting) => true,
            Some(Silence::Silent) => !speaks(url, settings.timeout).await,
            None => false,
        };
        if quiet {
            last = Some(BrokerError::Timeout(settings.timeout));
            continue;
        }
        let connect = open(url, props.clone(), &tls);
        match tokio::time::timeout(settings.timeout, connect).await {
            Ok(Ok(conn)) => {
                NEXT.store((i + 1) % n, Ordering::Relaxed);
                mark_silent(url, false);
                if n > 1 {
                    tracing::info!(node = redact_url(url), "connected to rabbitmq");
                }
                return Ok(conn);
            }
            Ok(Err(e)) => last = Some(e),
            Err(_) => {
                mark_silent(url, true);
                last = Some(BrokerError::Timeout(settings.timeout));
            }
        }
    }
    Err(last.unwrap_or(BrokerError::Timeout(settings.timeout)))
}

/// Connects to the node at `url`: over TLS for `amqps://`, verified against
/// `tls`'s roots (lapin's own TLS would add the bundled roots to a
/// `ca_file`, and could not use the system store), with its client
/// certificate if one is set.
async fn open(
    url: &str,
    props: ConnectionProperties,
    tls: &LinkTls,
) -> Result<Connection, BrokerError> {
    use lapin::tcp::{AsyncTcpStream, RustlsConnector};
    use lapin::uri::{AMQPScheme, AMQPUri};
    let uri: AMQPUri = url
        .parse()
        .map_err(|e: String| lapin::Error::from(std::io::Error::other(e)))?;
    let config = match uri.scheme {
        AMQPScheme::AMQPS => Some(
            tls.client_config()
                .map_err(|e| BrokerError::Tls(format!("amqp.tls: {e}")))?,
        ),
        AMQPScheme::AMQP => None,
    };
    let runtime = lapin::runtime::default_runtime()?;
    let connection = Connection::connector(
        uri,
        runtime,
        async move |uri, runtime| {
            let host = uri.authority.host.clone();
            let addr = runtime.to_socket_addrs((host.clone(), uri.authority.port));
            let plain = AsyncTcpStream::connect(&runtime, addr).await?;
            Ok(match &config {
                None => plain,
                Some(config) => {
                    plain
                        .into_rustls(&RustlsConnector::from(config.clone()), &host)
                        .await?
                }
            })
        },
        props,
    );
    Ok(connection.await?)
}

/// Nodes whose last connection attempt ran out of time: the URL, how many
/// times in a row lapin ran out of time on it after it answered the probe,
/// and until when it rests. lapin starts a thread for each attempt that
/// lives, with its socket, until the peer answers or closes; a peer that
/// accepts connections and never speaks (a load balancer without a
/// backend) would keep every attempt's. So such a node is asked first,
/// cheaply, whether it answers at all ([`speaks`]), and lapin tries it
/// again only once it does. A node that answers the probe and then stalls
/// lapin again (a login backend that hangs) rests, 10 s doubling up to
/// 10 min, between attempts: each still costs a thread, a few an hour at
/// most (found by review: one thread and socket per attempt, ~360 an hour).
static SILENT: std::sync::Mutex<Vec<(String, u32, Option<std::time::Instant>)>> =
    std::sync::Mutex::new(Vec::new());

/// What is known of a node whose last attempt ran out of time.
enum Silence {
    /// Probe it before lapin tries it.
    Silent,
    /// It stalled lapin after answering the probe: skip it for now.
    Resting,
}

fn silence(url: &str) -> Option<Silence> {
    // Nothing panics while holding it; a poisoned lock still holds a value.
    let silent = SILENT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let (_, _, until) = silent.iter().find(|(u, ..)| u == url)?;
    Some(match until {
        Some(t) if std::time::Instant::now() < *t => Silence::Resting,
        _ => Silence::Silent,
    })
}

/// Records that lapin ran out of time on `url` (`silent`), or connected.
fn mark_silent(url: &str, silent: bool) {
    let mut all = SILENT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let before = all
        .iter()
        .position(|(u, ..)| u == url)
        .map(|i| all.remove(i));
    if !silent {
        return;
    }
    // Silent before this attempt: it answered the probe, then stalled.
    let stalls = before.map_or(0, |(_, n, _)| n + 1);
    let until = (stalls > 0).then(|| {
        let rest = Duration::from_secs(10).saturating_mul(1 << (stalls - 1).min(6));
        std::time::Instant::now() + rest.min(Duration::from_secs(600))
    });
    all.push((url.to_owned(), stalls, until));
}

/// Whether the node at `url` answers an AMQP protocol header within
/// `timeout` (any byte, or closing the connection: a peer that is there).
/// The probe's socket is closed when it returns.
async fn speaks(url: &str, timeout: Duration) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(uri) = url.parse::<lapin::uri::AMQPUri>() else {
        return true;
    };
    let (host, port) = (uri.authority.host, uri.authority.port);
    let probe = async {
        let mut tcp = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
        tcp.write_all(b"AMQP\x00\x00\x09\x01").await?;
        let mut byte = [0u8; 1];
        tcp.read(&mut byte).await
    };
    let answered = matches!(tokio::time::timeout(timeout, probe).await, Ok(Ok(_)));
    if !answered {
        tracing::warn!(
            node = redact_url(url),
            ?timeout,
            "a rabbitmq node accepts connections and does not answer"
        );
    }
    answered
}

/// Queue names derived from the settings.
#[derive(Debug, Clone)]
pub struct Topology {
    /// Where jobs arrive.
    pub jobs: String,
    /// Where results go by default.
    pub results: String,
    /// Where unanswerable messages go.
    pub dead: String,
    /// Where messages handed out before without being settled are moved,
    /// to be taken one at a time.
    pub redelivered: String,
    /// The lease-wait bands, ms, shortest first (never empty).
    pub wait_bands_ms: Vec<u64>,
    /// How many retry queues there are (`max_attempts - 1`).
    pub retries: u32,
    /// The type every queue is declared with.
    pub queue_type: QueueType,
}

impl Topology {
    /// The names for `settings`: retry queues for `retry.max_attempts`, and
    /// lease-wait queues for waits up to `limits.send_lease`.
    pub fn new(settings: &Settings) -> Self {
        let jobs = settings.amqp.jobs_queue.clone();
        Self {
            dead: format!("{jobs}.dead"),
            redelivered: format!("{jobs}.redelivered"),
            results: settings.amqp.results_queue.clone(),
            wait_bands_ms: settings.wait_bands_ms(),
            retries: settings.retry.max_attempts.saturating_sub(1),
            queue_type: settings.amqp.queue_type,
            jobs,
        }
    }

    /// Where a job waits `delay` for a lease, and for how long: the first
    /// band that covers `delay`, for `delay`. A delay past the longest band
    /// (another worker's longer lease, a clock that stepped back) waits the
    /// longest band only, and the job comes back and waits again: a message
    /// that outlasted its band would hold up every shorter wait behind it.
    pub fn wait(&self, delay: Duration) -> (String, Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        let longest = self.wait_bands_ms.last().copied().unwrap_or_default();
        let band = self
            .wait_bands_ms
            .iter()
            .copied()
            .find(|&b| b >= ms)
            .unwrap_or(longest);
        (self.wait_band(band), delay.min(Duration::from_millis(band)))
    }

    fn wait_band(&self, ms: u64) -> String {
        format!("{}.wait.{ms}", self.jobs)
    }

    /// The queue where jobs whose attempt `n` failed wait.
    pub fn retry(&self, n: u32) -> String {
        format!("{}.retry.{n}", self.jobs)
    }

    /// Every queue mailgate declares.
    pub fn all(&self) -> Vec<String> {
        let mut all = vec![
            self.jobs.clone(),
            self.redelivered.clone(),
            self.results.clone(),
            self.dead.clone(),
        ];
        all.extend(self.wait_bands_ms.iter().map(|&ms| self.wait_band(ms)));
        all.extend((1..=self.retries).map(|n| self.retry(n)));
        all
    }

    /// The arguments `queue` is declared with:
    /// - its type, always named, so a vhost whose default type is another
    ///   never picks it (RabbitMQ takes `classic` as equal to no type, so
    ///   queues declared before the setting existed are still accepted);
    /// - waiting queues dead-letter expired messages back to the jobs queue;
    /// - a quorum jobs queue (and its `.redelivered`) dead-letters a message
    ///   delivered [`DELIVERY_LIMIT`] times (one that crashes every worker
    ///   it reaches) to the dead-letter queue, where RabbitMQ 4 would
    ///   otherwise drop it;
    /// - quorum queues dead-letter at least once (their default is at most
    ///   once, which could lose a job; at least once needs `reject-publish`
    ///   overflow, which without a length limit rejects nothing).
    pub fn arguments(&self, queue: &str) -> FieldTable {
        let quorum = self.queue_type == QueueType::Quorum;
        let text = |s: &str| AMQPValue::LongString(s.into());
        let mut args = FieldTable::default();
        args.insert("x-queue-type".into(), text(self.queue_type.as_str()));
        let dead_letters_to = if self.is_waiting(queue) {
            Some(&self.jobs)
        } else if quorum && (queue == self.jobs || queue == self.redelivered) {
            args.insert(
                "x-delivery-limit".into(),
                AMQPValue::LongLongInt(DELIVERY_LIMIT),
            );
            Some(&self.dead)
        } else {
            None
        };
        if let Some(to) = dead_letters_to {
            args.insert("x-dead-letter-exchange".into(), text(""));
            args.insert("x-dead-letter-routing-key".into(), text(to));
            if quorum {
                args.insert("x-dead-letter-strategy".into(), text("at-least-once"));
                args.insert("x-overflow".into(), text("reject-publish"));
            }
        }
        args
    }

    /// Whether `queue` is one where jobs wait: a lease-wait band or a retry.
    fn is_waiting(&self, queue: &str) -> bool {
        self.wait_bands_ms
            .iter()
            .any(|&ms| queue == self.wait_band(ms))
            || queue
                .strip_prefix(&format!("{}.retry.", self.jobs))
                .is_some_and(|n| {
                    n.parse::<u32>()
                        .is_ok_and(|n| (1..=self.retries).contains(&n))
                })
    }

    /// RabbitMQ's reason for refusing to declare a queue, and, when the
    /// queue exists with other arguments (another type, above all), what
    /// to do about it.
    fn refusal(&self, why: &str) -> String {
        if !why.contains("inequivalent arg") {
            return why.to_owned();
        }
        format!(
            "{why}. The queue exists with other arguments than mailgate declares for \
             amqp.queue_type = \"{}\", and RabbitMQ cannot change a queue's type or \
             arguments: set amqp.queue_type to the type the queues have, or move to new \
             queues (new amqp.jobs_queue and amqp.results_queue names; see the README, \
             \"Changing the queue type\")",
            self.queue_type.as_str()
        )
    }

    /// Whether mailgate declares `queue` (and so may declare it again).
    fn owns(&self, queue: &str) -> bool {
        self.all().iter().any(|q| q == queue)
    }

    /// Whether `queue` is, or could be, one of mailgate's: never a place for
    /// a result. Beyond the queues this worker declares, that is any name of
    /// a waiting queue, of these jobs or of another deployment's
    /// (`<name>.wait.<n>`, `<name>.retry.<n>`, and `<name>.wait`, the one
    /// wait queue of earlier versions): a result parked there, with no
    /// expiry, would hold up every wait behind it.
    fn reserved(&self, queue: &str) -> bool {
        let waiting = match queue.rsplit_once('.') {
            Some((head, "wait")) => !head.is_empty(),
            Some((head, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
                head.ends_with(".wait") || head.ends_with(".retry")
            }
            _ => false,
        };
        self.owns(queue) || waiting
    }
}

/// One connection and channel to RabbitMQ, with publisher confirms on.
/// Cheap to clone; clones share the connection and channel.
#[derive(Clone)]
pub struct Broker {
    conn: std::sync::Arc<Connection>,
    channel: Channel,
    /// Consumes `J.redelivered`, one message at a time.
    one_by_one: Channel,
    /// Publishes to producer-named `reply_to` queues, one at a time (the
    /// lock): such a queue may not exist, and lapin gives a `basic.return`
    /// to whichever confirm completes next, so on a channel with several
    /// publishes in flight one job's return was taken for another's (one
    /// result published twice, one lost). Alone, a return is its publish's.
    replies: (Channel, std::sync::Arc<tokio::sync::Mutex<()>>),
    topology: Topology,
    timeout: Duration,
}

/// The two streams of jobs a worker consumes.
pub struct Consumers {
    /// `J`, up to `amqp.prefetch` at a time.
    pub jobs: Consumer,
    /// `J.redelivered`, one at a time.
    pub redelivered: Consumer,
}

/// The W3C trace context headers (<https://www.w3.org/TR/trace-context/>):
/// read from a producer's job, carried on mailgate's copies of it, and
/// written on its result.
pub const TRACEPARENT_HEADER: &str = "traceparent";
/// See [`TRACEPARENT_HEADER`].
pub const TRACESTATE_HEADER: &str = "tracestate";

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
    /// classic queues, which do not count). At [`DELIVERY_LIMIT`] the
    /// broker dead-letters it.
    pub deliveries_before: u32,
    /// When the producer published it, ms since the epoch.
    pub published_at_ms: Option<u64>,
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
            // producer can write the header on a first delivery (found by
            // review: it pushed jobs through the one-at-a-time lane).
            deliveries_before: match delivery.redelivered {
                true => header(DELIVERY_COUNT_HEADER).and_then(as_u32).unwrap_or(0),
                false => 0,
            },
            published_at_ms: header(PUBLISHED_HEADER)
                .or_else(|| header(TIMESTAMP_MS_HEADER))
                .and_then(as_u64)
                .or_else(|| p.timestamp().map(|s| s.saturating_mul(1000))),
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
    fn copy_headers(&self) -> FieldTable {
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
    fn original(&self) -> AMQPValue {
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

fn as_string(v: &AMQPValue) -> Option<String> {
    match v {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        _ => None,
    }
}

fn as_u32(v: &AMQPValue) -> Option<u32> {
    as_u64(v).and_then(|n| u32::try_from(n).ok())
}

fn as_u64(v: &AMQPValue) -> Option<u64> {
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
fn put_trace(headers: &mut FieldTable, trace: &TraceHeaders) {
    for (name, value) in [
        (TRACEPARENT_HEADER, &trace.traceparent),
        (TRACESTATE_HEADER, &trace.tracestate),
    ] {
        if let Some(v) = value {
            headers.insert(name.into(), AMQPValue::LongString(v.as_str().into()));
        }
    }
}

/// What became of a publish that RabbitMQ confirmed.
enum Routed {
    /// A queue took it.
    Queued,
    /// No queue by that name: it came back.
    NoQueue,
}

impl Broker {
    /// Connects, opens a channel with publisher confirms and `prefetch`, and
    /// declares the queues, all within `amqp.timeout` (a peer that accepts
    /// the TCP connection and never finishes the handshake, such as a load
    /// balancer without a backend, is an outage to retry, not a wait).
    pub async fn connect(settings: &Settings) -> Result<Self, BrokerError> {
        let amqp = &settings.amqp;
        // Named after the queue it serves, so operators (and tests) can
        // find a pool's connections in `rabbitmqctl list_connections`.
        let name = format!(
            "mailgate worker {} pid {}",
            amqp.jobs_queue,
            std::process::id()
        );
        let props = ConnectionProperties::default().with_connection_name(name.as_str().into());
        let conn = connect_node(amqp, props).await?;
        let timeout = amqp.timeout;
        tokio::time::timeout(timeout, Self::open(conn, amqp, Topology::new(settings)))
            .await
            .unwrap_or(Err(BrokerError::Timeout(timeout)))
    }

    async fn open(
        conn: Connection,
        settings: &AmqpSettings,
        topology: Topology,
    ) -> Result<Self, BrokerError> {
        let channel = conn.create_channel().await?;
        channel
            .basic_qos(settings.prefetch, BasicQosOptions::default())
            .await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        let one_by_one = conn.create_channel().await?;
        one_by_one.basic_qos(1, BasicQosOptions::default()).await?;
        let replies = conn.create_channel().await?;
        replies
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        let broker = Self {
            conn: std::sync::Arc::new(conn),
            channel,
            one_by_one,
            replies: (replies, std::sync::Arc::new(tokio::sync::Mutex::new(()))),
            topology,
            timeout: settings.timeout,
        };
        for q in broker.topology.all() {
            broker.declare(&q).await?;
        }
        Ok(broker)
    }

    /// The queue names.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Whether RabbitMQ has blocked this connection from publishing (a
    /// memory or disk alarm): no result can go out until it clears.
    pub fn blocked(&self) -> bool {
        self.conn.status().blocked()
    }

    /// How many jobs wait in the jobs queue, ready and not yet handed to a
    /// consumer (the backlog gauge). A passive declare, on a channel of its
    /// own (a passive declare that fails closes its channel), within
    /// `amqp.timeout`; it leaves the connection alone if it runs out.
    pub async fn jobs_waiting(&self) -> Result<u32, BrokerError> {
        let ask = async {
            let channel = self.conn.create_channel().await?;
            let passive = QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            };
            let queue = channel
                .queue_declare(
                    self.topology.jobs.as_str().into(),
                    passive,
                    FieldTable::default(),
                )
                .await?;
            let _ = channel.close(200, "done".into()).await;
            Ok(queue.message_count())
        };
        tokio::time::timeout(self.timeout, ask)
            .await
            .unwrap_or(Err(BrokerError::Timeout(self.timeout)))
    }

    /// Runs one broker operation within `amqp.timeout`. One that runs out
    /// closes the connection (in the background, itself bounded), so the
    /// deliveries it holds go back to the queue and the consumer ends.
    async fn bounded<T>(
        &self,
        op: impl std::future::Future<Output = Result<T, BrokerError>>,
    ) -> Result<T, BrokerError> {
        match tokio::time::timeout(self.timeout, op).await {
            Ok(r) => r,
            Err(_) => {
                let conn = self.conn.clone();
                let timeout = self.timeout;
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(timeout, conn.close(320, "deadline".into())).await;
                });
                Err(BrokerError::Timeout(self.timeout))
            }
        }
    }

    /// Declares one of mailgate's queues. A queue that exists with other
    /// arguments, or a user without permission, is [`BrokerError::Refused`]
    /// with RabbitMQ's own reason; one of another type also says what to do.
    async fn declare(&self, queue: &str) -> Result<(), BrokerError> {
        self.channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions::durable(),
                self.topology.arguments(queue),
            )
            .await
            .map_err(|e| match e.kind() {
                lapin::ErrorKind::ProtocolError(amqp) => BrokerError::Refused {
                    queue: queue.to_owned(),
                    why: self.topology.refusal(amqp.get_message().as_str()),
                },
                _ => BrokerError::Amqp(e),
            })?;
        Ok(())
    }

    /// Starts consuming jobs, with manual acknowledgements: `J` as `tag`,
    /// and `J.redelivered` one at a time as `tag.redelivered`.
    pub async fn consume(&self, tag: &str) -> Result<Consumers, BrokerError> {
        let one = |channel: &Channel, queue: &str, tag: String| {
            let channel = channel.clone();
            let queue = queue.to_owned();
            self.bounded(async move {
                Ok(channel
                    .basic_consume(
                        queue.as_str().into(),
                        tag.as_str().into(),
                        BasicConsumeOptions::default(),
                        FieldTable::default(),
                    )
                    .await?)
            })
        };
        Ok(Consumers {
            jobs: one(&self.channel, &self.topology.jobs, tag.to_owned()).await?,
            redelivered: one(
                &self.one_by_one,
                &self.topology.redelivered,
                format!("{tag}.redelivered"),
            )
            .await?,
        })
    }

    /// Stops the consumers of [`Broker::consume`]: no new jobs arrive;
    /// those in flight may still be acknowledged.
    pub async fn stop_consuming(&self, tag: &str) -> Result<(), BrokerError> {
        self.bounded(async {
            self.channel
                .basic_cancel(tag.into(), BasicCancelOptions::default())
                .await?;
            self.one_by_one
                .basic_cancel(
                    format!("{tag}.redelivered").as_str().into(),
                    BasicCancelOptions::default(),
                )
                .await?;
            Ok(())
        })
        .await
    }

    /// Closes the connection, waiting at most `within`; unacknowledged jobs
    /// go back to the queue (when the socket closes, if not before).
    pub async fn close(&self, within: Duration) {
        let close = async {
            let _ = self.one_by_one.close(200, "bye".into()).await;
            let _ = self.replies.0.close(200, "bye".into()).await;
            let _ = self.channel.close(200, "bye".into()).await;
            let _ = self.conn.close(200, "bye".into()).await;
        };
        let _ = tokio::time::timeout(within, close).await;
    }

    /// Publishes `body` persistently to `queue` (mandatory) and waits for the
    /// broker's confirm.
    async fn publish(
        &self,
        queue: &str,
        body: &[u8],
        props: BasicProperties,
    ) -> Result<Routed, BrokerError> {
        self.publish_on(&self.channel, queue, body, props).await
    }

    /// [`Broker::publish`] on `channel`.
    async fn publish_on(
        &self,
        channel: &Channel,
        queue: &str,
        body: &[u8],
        props: BasicProperties,
    ) -> Result<Routed, BrokerError> {
        let confirm = self
            .bounded(async {
                let confirm = channel
                    .basic_publish(
                        "".into(),
                        queue.into(),
                        BasicPublishOptions {
                            mandatory: true,
                            ..BasicPublishOptions::default()
                        },
                        body,
                        props.with_delivery_mode(2),
                    )
                    .await?
                    .await?;
                Ok(confirm)
            })
            .await?;
        match confirm {
            Confirmation::Ack(None) => Ok(Routed::Queued),
            Confirmation::Ack(Some(_returned)) => Ok(Routed::NoQueue),
            Confirmation::Nack(_) => Err(BrokerError::Refused {
                queue: queue.to_owned(),
                why: "negative confirm (the queue refuses messages: full, or a policy)".into(),
            }),
            Confirmation::NotRequested => Err(BrokerError::Refused {
                queue: queue.to_owned(),
                why: "no confirm on a channel in confirm mode".into(),
            }),
        }
    }

    /// Publishes to one of mailgate's own queues, declaring it again if it
    /// is gone (an operator deleted it while workers ran).
    async fn publish_declared(
        &self,
        queue: &str,
        body: &[u8],
        props: BasicProperties,
    ) -> Result<(), BrokerError> {
        if let Routed::Queued = self.publish(queue, body, props.clone()).await? {
            return Ok(());
        }
        if self.topology.owns(queue) {
            tracing::warn!(queue, "a queue of mailgate's is gone; declaring it again");
            self.bounded(self.declare(queue)).await?;
            if let Routed::Queued = self.publish(queue, body, props).await? {
                return Ok(());
            }
        }
        Err(BrokerError::Refused {
            queue: queue.to_owned(),
            why: "no such queue".into(),
        })
    }

    /// Publishes a result for `job`: to its `reply_to` queue if it named one
    /// that takes it (and is not one of mailgate's other queues), else to the
    /// results queue (declared again if it is gone). Confirmed before returning. [`BrokerError::Refused`] means no
    /// queue would take it.
    pub async fn publish_result(
        &self,
        job: &Incoming,
        body: &[u8],
        trace: &TraceHeaders,
    ) -> Result<(), BrokerError> {
        let mut headers = FieldTable::default();
        put_trace(&mut headers, trace);
        let mut props = BasicProperties::default()
            .with_content_type(ShortString::from("application/json"))
            .with_timestamp(crate::domain::now_ms() / 1000)
            .with_headers(headers);
        if let Some(c) = &job.correlation_id {
            props = props.with_correlation_id(c.as_str().into());
        }
        // mailgate's own queues are never a reply target: a result parked
        // in a waiting queue (no TTL) would hold up every retry behind it.
        let reply_to = job.reply_to.as_deref().filter(|q| {
            let ours = self.topology.reserved(q) && *q != self.topology.results;
            if ours {
                tracing::warn!(
                    reply_to = q,
                    "reply_to names one of mailgate's queues; the result goes to the results queue"
                );
            }
            !ours
        });
        if let Some(reply_to) = reply_to {
            let (channel, one_at_a_time) = &self.replies;
            let published = {
                let _alone = one_at_a_time.lock().await;
                self.publish_on(channel, reply_to, body, props.clone())
                    .await
            };
            match published {
                Ok(Routed::Queued) => return Ok(()),
                Ok(Routed::NoQueue) => {
                    tracing::warn!(
                        reply_to,
                        "reply_to queue does not exist; result goes to the results queue"
                    );
                }
                Err(BrokerError::Refused { why, .. }) => {
                    tracing::warn!(reply_to, %why, "reply_to queue refused the result; it goes to the results queue");
                }
                Err(e) => return Err(e),
            }
        }
        let results = self.topology.results.clone();
        self.publish_declared(&results, body, props).await
    }

    /// Sends `job` to wait `delay` in `queue` (a retry or a wait queue),
    /// then come back to the jobs queue as attempt `attempt` of lineage
    /// `ticket`.
    pub async fn delay(
        &self,
        job: &Incoming,
        queue: &str,
        ticket: &Ticket,
        attempt: u32,
        delay: Duration,
    ) -> Result<(), BrokerError> {
        let mut headers = job.copy_headers();
        headers.insert(
            TICKET_HEADER.into(),
            AMQPValue::LongString(ticket.as_str().into()),
        );
        headers.insert(
            ATTEMPT_HEADER.into(),
            AMQPValue::LongLongInt(attempt.into()),
        );
        // A copy of a message delivered before may be answering a job whose
        // mail went out under the first delivery (found by review: a copy
        // waiting out the lease of its own first delivery was answered
        // `duplicate`, the job's only result).
        if job.redelivered {
            headers.insert(REDELIVERED_HEADER.into(), AMQPValue::Boolean(true));
        }
        let ms = delay.as_millis().max(1).to_string();
        let props = BasicProperties::default()
            .with_headers(headers)
            .with_expiration(ms.as_str().into());
        self.publish_declared(queue, job.body(), props).await
    }

    /// Moves `job`, a message `J` handed out before without its being
    /// settled, to `J.redelivered` as it is (its lineage and attempt, if it
    /// is one of mailgate's copies; [`REDELIVERED_HEADER`]); confirmed
    /// before returning. The caller then acknowledges the original.
    pub async fn isolate(&self, job: &Incoming) -> Result<(), BrokerError> {
        let mut headers = job.copy_headers();
        if let Some(ticket) = &job.ticket {
            headers.insert(
                TICKET_HEADER.into(),
                AMQPValue::LongString(ticket.as_str().into()),
            );
            headers.insert(
                ATTEMPT_HEADER.into(),
                AMQPValue::LongLongInt(job.attempt.into()),
            );
        }
        if job.redelivered {
            headers.insert(REDELIVERED_HEADER.into(), AMQPValue::Boolean(true));
        }
        let props = BasicProperties::default().with_headers(headers);
        let queue = self.topology.redelivered.clone();
        self.publish_declared(&queue, job.body(), props).await
    }

    /// Sends `job` to the dead-letter queue with `error`, its attempt count
    /// and its original properties in the headers. It carries no ticket, so
    /// moved back to the jobs queue it is processed afresh, as attempt 1.
    pub async fn dead_letter(&self, job: &Incoming, error: &str) -> Result<(), BrokerError> {
        let mut headers = job.copy_headers();
        headers.insert(ERROR_HEADER.into(), AMQPValue::LongString(error.into()));
        headers.insert(
            ATTEMPTS_HEADER.into(),
            AMQPValue::LongLongInt(job.attempt.into()),
        );
        headers.insert(ORIGINAL_HEADER.into(), job.original());
        let props = BasicProperties::default().with_headers(headers);
        let dead = self.topology.dead.clone();
        self.publish_declared(&dead, job.body(), props).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        let mut s: Settings = config::Config::builder()
            .add_source(config::File::from(std::path::Path::new(
                "config/default.toml",
            )))
            .build()
            .and_then(|c| c.try_deserialize())
            .expect("the shipped config");
        s.amqp.jobs_queue = "j".into();
        s.amqp.results_queue = "r".into();
        s.retry.max_attempts = 3;
        s.limits.send_lease = Duration::from_secs(30);
        s
    }

    #[test]
    fn only_waiting_queues_dead_letter_back() {
        let dead_letters_to = |t: &Topology, q: &str| {
            let args = t.arguments(q);
            assert_eq!(
                args.inner().get("x-queue-type"),
                Some(&AMQPValue::LongString(t.queue_type.as_str().into())),
                "{q}"
            );
            args.inner()
                .get("x-dead-letter-routing-key")
                .and_then(|to| to.as_long_string())
                .map(|to| to.to_string())
        };
        for kind in [QueueType::Classic, QueueType::Quorum] {
            let mut t = Topology::new(&settings());
            t.queue_type = kind;
            for q in ["j.wait.250", "j.wait.32000", "j.retry.1", "j.retry.2"] {
                assert_eq!(dead_letters_to(&t, q), Some("j".into()), "{q}");
            }
            // A quorum jobs queue dead-letters what reaches its delivery limit.
            let jobs = (kind == QueueType::Quorum).then(|| "j.dead".into());
            assert_eq!(dead_letters_to(&t, "j"), jobs);
            for q in [
                "r",
                "j.dead",
                "j.wait",
                "j.wait.64000",
                "j.retry.3",
                "j.retry.x",
            ] {
                assert_eq!(dead_letters_to(&t, q), None, "{q}");
            }
        }
        let t = Topology::new(&settings());
        assert!(t.owns("j.retry.2") && !t.owns("j.retry.3") && !t.owns("other"));
        assert!(
            t.reserved("j.wait") && !t.owns("j.wait"),
            "the old wait queue"
        );
        // Any waiting queue's name, this deployment's or another's.
        for q in [
            "j.wait.64000",
            "j.wait.7",
            "j.retry.9",
            "j.dead",
            "j",
            "k.wait.250",
            "k.retry.1",
            "k.wait",
        ] {
            assert!(t.reserved(q), "{q}");
        }
        for q in [
            "j.wait.",
            "j.wait.x",
            "j.waiting",
            "j.retry.",
            "r2",
            "wait",
            "k.waits.1",
        ] {
            assert!(!t.reserved(q), "{q}");
        }
    }

    #[test]
    fn a_wait_goes_to_the_first_band_that_covers_it() {
        let t = Topology::new(&settings());
        // 250 ms doubling up to the first band past the lease + 100 ms.
        assert_eq!(
            t.wait_bands_ms,
            [250, 500, 1000, 2000, 4000, 8000, 16_000, 32_000]
        );
        let ms = Duration::from_millis;
        for (delay, queue, wait) in [
            (ms(0), "j.wait.250", ms(0)),
            (ms(100), "j.wait.250", ms(100)),
            (ms(250), "j.wait.250", ms(250)),
            (ms(251), "j.wait.500", ms(251)),
            (ms(1000), "j.wait.1000", ms(1000)),
            (ms(30_100), "j.wait.32000", ms(30_100)),
            // Past the longest band: it waits that band, then again.
            (ms(90_000), "j.wait.32000", ms(32_000)),
        ] {
            assert_eq!(t.wait(delay), (queue.to_owned(), wait), "{delay:?}");
        }
        // Every band is declared, as a waiting queue.
        let all = t.all();
        assert!(
            t.wait_bands_ms
                .iter()
                .all(|b| all.contains(&format!("j.wait.{b}")))
        );
    }

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
