//! RabbitMQ: the queues mailgate uses, consuming jobs, and publishing
//! results, retries and dead letters with publisher confirms.
//!
//! Queues (all durable, messages persistent), for `jobs_queue = J`:
//! - `J`: jobs from producers.
//! - `J.retry.<n>`: jobs whose attempt `n` failed transiently, waiting out
//!   their backoff (per-message TTL), then dead-lettered back to `J`. One
//!   queue per attempt, so messages in a queue have similar TTLs and none
//!   waits behind a much longer one.
//! - `J.wait`: jobs waiting for another attempt's send lease to lapse; back
//!   to `J` likewise.
//! - `J.dead`: messages that cannot be answered (not JSON, no id), with the
//!   reason in their headers. Never consumed by mailgate.
//! - `results_queue`: results, unless a job names its own `reply_to`.
//!
//! A job is acknowledged only after whatever replaced it (its result, its
//! retry, its dead letter) was confirmed by the broker, so a crash at any
//! point loses nothing: the job comes back and is de-duplicated by id.

use std::time::Duration;

use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    BasicRejectOptions, ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, Consumer};

use crate::settings::AmqpSettings;

/// The header carrying a job's attempt number (1 for the first).
pub const ATTEMPT_HEADER: &str = "x-mailgate-attempt";
/// Publish time in ms (the header RabbitMQ's timestamp plugin uses); the
/// AMQP `timestamp` property has only whole seconds.
pub const TIMESTAMP_MS_HEADER: &str = "timestamp_in_ms";
/// On dead letters: why the message could not be processed.
pub const ERROR_HEADER: &str = "x-mailgate-error";

/// Why a broker operation failed. All are transient for the job: it stays
/// unacknowledged and comes back.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// The connection, a channel, or an operation on them failed.
    #[error("rabbitmq: {0}")]
    Amqp(#[from] lapin::Error),
    /// The broker refused to take responsibility for a published message.
    #[error("rabbitmq did not confirm the publish to {0}")]
    NotConfirmed(String),
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
    /// Where jobs wait for a lease.
    pub wait: String,
    /// How many retry queues there are (`max_attempts - 1`).
    pub retries: u32,
}

impl Topology {
    /// The names for `settings`, with retry queues for `max_attempts`.
    pub fn new(settings: &AmqpSettings, max_attempts: u32) -> Self {
        let jobs = settings.jobs_queue.clone();
        Self {
            dead: format!("{jobs}.dead"),
            wait: format!("{jobs}.wait"),
            results: settings.results_queue.clone(),
            retries: max_attempts.saturating_sub(1),
            jobs,
        }
    }

    /// The queue where jobs whose attempt `n` failed wait.
    pub fn retry(&self, n: u32) -> String {
        format!("{}.retry.{n}", self.jobs)
    }

    /// Every queue mailgate declares.
    pub fn all(&self) -> Vec<String> {
        let mut all = vec![
            self.jobs.clone(),
            self.results.clone(),
            self.dead.clone(),
            self.wait.clone(),
        ];
        all.extend((1..=self.retries).map(|n| self.retry(n)));
        all
    }
}

/// One connection and channel to RabbitMQ, with publisher confirms on.
/// Cheap to clone; clones share the connection and channel.
#[derive(Clone)]
pub struct Broker {
    conn: std::sync::Arc<Connection>,
    channel: Channel,
    topology: Topology,
}

/// A job message as it arrived.
pub struct Incoming {
    /// Where the producer wants the result, if not the results queue.
    pub reply_to: Option<String>,
    /// Copied onto the result.
    pub correlation_id: Option<String>,
    /// 1 for the first attempt.
    pub attempt: u32,
    /// Whether mailgate sent this message back through a waiting queue
    /// (a retry or a lease wait): it carries the attempt header.
    pub requeued: bool,
    /// Whether RabbitMQ delivered this message before (to a consumer that
    /// did not acknowledge it).
    pub redelivered: bool,
    /// When the producer published it, ms since the epoch: its
    /// `timestamp_in_ms` header, else its AMQP timestamp (seconds).
    pub published_at_ms: Option<u64>,
    delivery: Delivery,
}

impl Incoming {
    /// Wraps a delivery.
    pub fn new(delivery: Delivery) -> Self {
        let p = &delivery.properties;
        let attempt_header = p
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get(ATTEMPT_HEADER))
            .and_then(as_u32);
        let attempt = attempt_header.unwrap_or(1).max(1);
        Self {
            requeued: attempt_header.is_some(),
            reply_to: p
                .reply_to()
                .as_ref()
                .map(|s| s.to_string())
                .filter(|s| !s.is_empty()),
            correlation_id: p.correlation_id().as_ref().map(|s| s.to_string()),
            attempt,
            redelivered: delivery.redelivered,
            published_at_ms: p
                .headers()
                .as_ref()
                .and_then(|h| h.inner().get(TIMESTAMP_MS_HEADER))
                .and_then(as_u64)
                .or_else(|| p.timestamp().map(|s| s.saturating_mul(1000))),
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

    /// Hands the message back to RabbitMQ for another consumer (used at
    /// shutdown for jobs that did not finish in time).
    pub async fn requeue(&self) -> Result<(), BrokerError> {
        self.delivery
            .reject(BasicRejectOptions { requeue: true })
            .await?;
        Ok(())
    }

    /// The message's headers with the attempt number (and an error) set.
    fn headers_with(&self, attempt: u32, error: Option<&str>) -> FieldTable {
        let mut headers = self
            .delivery
            .properties
            .headers()
            .clone()
            .unwrap_or_default();
        headers.insert(
            ATTEMPT_HEADER.into(),
            AMQPValue::LongLongInt(attempt.into()),
        );
        if let Some(error) = error {
            headers.insert(ERROR_HEADER.into(), AMQPValue::LongString(error.into()));
        }
        headers
    }

    /// The message's properties with `headers` replaced, for republishing.
    fn properties_with(&self, headers: FieldTable) -> BasicProperties {
        let mut p = self.delivery.properties.clone().with_headers(headers);
        p = p.with_delivery_mode(2);
        p
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

impl Broker {
    /// Connects, opens a channel with publisher confirms and `prefetch`, and
    /// declares the queues.
    pub async fn connect(settings: &AmqpSettings, max_attempts: u32) -> Result<Self, BrokerError> {
        // Named after the queue it serves, so operators (and tests) can
        // find a pool's connections in `rabbitmqctl list_connections`.
        let name = format!(
            "mailgate worker {} pid {}",
            settings.jobs_queue,
            std::process::id()
        );
        let props = ConnectionProperties::default().with_connection_name(name.as_str().into());
        let conn = Connection::connect(&settings.url, props).await?;
        let channel = conn.create_channel().await?;
        channel
            .basic_qos(settings.prefetch, BasicQosOptions::default())
            .await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        let broker = Self {
            conn: std::sync::Arc::new(conn),
            channel,
            topology: Topology::new(settings, max_attempts),
        };
        broker.declare().await?;
        Ok(broker)
    }

    /// The queue names.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Whether the connection is still up.
    pub fn is_connected(&self) -> bool {
        self.conn.status().connected()
    }

    async fn declare(&self) -> Result<(), BrokerError> {
        let t = &self.topology;
        let durable = QueueDeclareOptions::durable();
        for q in [&t.jobs, &t.results, &t.dead] {
            self.channel
                .queue_declare(q.as_str().into(), durable, FieldTable::default())
                .await?;
        }
        // Waiting queues dead-letter expired messages back to the jobs queue.
        let mut back = FieldTable::default();
        back.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString("".into()),
        );
        back.insert(
            "x-dead-letter-routing-key".into(),
            AMQPValue::LongString(t.jobs.as_str().into()),
        );
        for q in std::iter::once(t.wait.clone()).chain((1..=t.retries).map(|n| t.retry(n))) {
            self.channel
                .queue_declare(q.as_str().into(), durable, back.clone())
                .await?;
        }
        Ok(())
    }

    /// Starts consuming jobs, with manual acknowledgements.
    pub async fn consume(&self, tag: &str) -> Result<Consumer, BrokerError> {
        Ok(self
            .channel
            .basic_consume(
                self.topology.jobs.as_str().into(),
                tag.into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?)
    }

    /// Stops the consumer `tag`: no new jobs arrive; those in flight may
    /// still be acknowledged.
    pub async fn stop_consuming(&self, tag: &str) -> Result<(), BrokerError> {
        self.channel
            .basic_cancel(tag.into(), BasicCancelOptions::default())
            .await?;
        Ok(())
    }

    /// Closes the connection; unacknowledged jobs go back to the queue.
    pub async fn close(&self) {
        let _ = self.channel.close(200, "bye".into()).await;
        let _ = self.conn.close(200, "bye".into()).await;
    }

    /// Publishes `body` persistently to `queue` and waits for the broker's
    /// confirm. Returns `false` if the queue does not exist (the message came
    /// back unroutable).
    async fn publish(
        &self,
        queue: &str,
        body: &[u8],
        props: BasicProperties,
    ) -> Result<bool, BrokerError> {
        let confirm = self
            .channel
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
        match confirm {
            Confirmation::Ack(None) => Ok(true),
            Confirmation::Ack(Some(_returned)) => Ok(false),
            Confirmation::Nack(_) | Confirmation::NotRequested => {
                Err(BrokerError::NotConfirmed(queue.to_owned()))
            }
        }
    }

    /// Publishes a result for `job`: to its `reply_to` queue if it named one
    /// that exists, else to the results queue. Confirmed before returning.
    pub async fn publish_result(&self, job: &Incoming, body: &[u8]) -> Result<(), BrokerError> {
        let mut props = BasicProperties::default()
            .with_content_type(ShortString::from("application/json"))
            .with_timestamp(now_secs());
        if let Some(c) = &job.correlation_id {
            props = props.with_correlation_id(c.as_str().into());
        }
        if let Some(reply_to) = &job.reply_to {
            if self.publish(reply_to, body, props.clone()).await? {
                return Ok(());
            }
            tracing::warn!(
                reply_to,
                "reply_to queue does not exist; result goes to the results queue"
            );
        }
        let results = self.topology.results.clone();
        if self.publish(&results, body, props).await? {
            Ok(())
        } else {
            Err(BrokerError::NotConfirmed(results))
        }
    }

    /// Sends `job` to wait `delay` in `queue` (a retry or the wait queue),
    /// then come back to the jobs queue as attempt `attempt`.
    pub async fn delay(
        &self,
        job: &Incoming,
        queue: &str,
        attempt: u32,
        delay: Duration,
    ) -> Result<(), BrokerError> {
        let headers = job.headers_with(attempt, None);
        let ms = delay.as_millis().max(1).to_string();
        let props = job
            .properties_with(headers)
            .with_expiration(ms.as_str().into());
        if self.publish(queue, job.body(), props).await? {
            Ok(())
        } else {
            Err(BrokerError::NotConfirmed(queue.to_owned()))
        }
    }

    /// Sends `job` to the dead-letter queue with `error` and its attempt
    /// count in the headers.
    pub async fn dead_letter(&self, job: &Incoming, error: &str) -> Result<(), BrokerError> {
        let headers = job.headers_with(job.attempt, Some(error));
        let dead = self.topology.dead.clone();
        if self
            .publish(&dead, job.body(), job.properties_with(headers))
            .await?
        {
            Ok(())
        } else {
            Err(BrokerError::NotConfirmed(dead))
        }
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
