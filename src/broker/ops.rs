//! What a worker does with RabbitMQ once connected: consuming jobs, and
//! publishing results, retries, lease waits and dead letters, each
//! confirmed by the broker before the job it replaces is acknowledged;
//! and, for `mailgate admin purge`, looking at a queue and deleting it.

use std::time::Duration;

use lapin::options::{
    BasicCancelOptions, BasicConsumeOptions, BasicPublishOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, Consumer};

use super::incoming::put_trace;
use super::{
    ATTEMPT_HEADER, ATTEMPTS_HEADER, Broker, BrokerError, DEAD_AT_HEADER, ERROR_HEADER, Incoming,
    ORIGINAL_HEADER, REASON_HEADER, REDELIVERED_HEADER, TICKET_HEADER, TraceHeaders,
    UNRECORDED_HEADER, Unrecorded,
};
use crate::domain::{DeadReason, Ticket, now_ms};

/// The two streams of jobs a worker consumes.
#[derive(Debug)]
pub struct Consumers {
    /// `J`, up to `amqp.prefetch` at a time.
    pub jobs: Consumer,
    /// `J.redelivered`, one at a time.
    pub redelivered: Consumer,
}

/// Publishes `body` persistently to `queue` on `channel`, a channel in
/// confirm mode (mandatory), and waits for RabbitMQ's confirm: where it
/// went, or [`BrokerError::Refused`] on a negative confirm.
pub(super) async fn publish_confirmed(
    channel: &Channel,
    queue: &str,
    body: &[u8],
    props: BasicProperties,
) -> Result<Routed, BrokerError> {
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

/// What became of a publish that RabbitMQ confirmed.
pub(super) enum Routed {
    /// A queue took it.
    Queued,
    /// No queue by that name: it came back.
    NoQueue,
}

/// A queue as a passive declare finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueState {
    /// Its name.
    pub name: String,
    /// The messages ready in it (not those handed out and not yet settled).
    pub messages: u32,
    /// How many consumers are attached to it.
    pub consumers: u32,
}

/// `queue` as it is now, or `None` if there is no such queue: a passive
/// declare, on a channel of its own (a failed one closes its channel).
pub async fn queue_state(
    conn: &Connection,
    queue: &str,
) -> Result<Option<QueueState>, BrokerError> {
    let channel = conn.create_channel().await?;
    let passive = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    match channel
        .queue_declare(queue.into(), passive, FieldTable::default())
        .await
    {
        Ok(q) => {
            let _ = channel.close(200, "done".into()).await;
            Ok(Some(QueueState {
                name: queue.to_owned(),
                messages: q.message_count(),
                consumers: q.consumer_count(),
            }))
        }
        Err(e) if soft_error(&e) == Some(AMQPSoftError::NOTFOUND) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Deletes `queue`, on a channel of its own, and says how many messages it
/// held. With `if_unused` RabbitMQ refuses, at once and atomically, while a
/// consumer is attached ([`BrokerError::Refused`]): only classic queues
/// offer it (a quorum queue answers `not_implemented`, which closes the
/// connection).
pub async fn delete_queue(
    conn: &Connection,
    queue: &str,
    if_unused: bool,
) -> Result<u32, BrokerError> {
    let channel = conn.create_channel().await?;
    let options = QueueDeleteOptions {
        if_unused,
        ..QueueDeleteOptions::default()
    };
    match channel.queue_delete(queue.into(), options).await {
        Ok(messages) => {
            let _ = channel.close(200, "done".into()).await;
            Ok(messages)
        }
        Err(e) if soft_error(&e) == Some(AMQPSoftError::PRECONDITIONFAILED) => {
            Err(BrokerError::Refused {
                queue: queue.to_owned(),
                why: "a consumer is attached to it".into(),
            })
        }
        Err(e) => Err(e.into()),
    }
}

/// Whether `queue`, a durable queue that exists, has exactly `arguments`:
/// RabbitMQ declares an existing queue again only with arguments
/// equivalent to its own (else it answers `PRECONDITION_FAILED`, closing
/// the channel, its own here). A queue that does not exist is declared by
/// this, so the caller looks first ([`queue_state`]).
pub async fn declared_with(
    conn: &Connection,
    queue: &str,
    arguments: FieldTable,
) -> Result<bool, BrokerError> {
    let channel = conn.create_channel().await?;
    match (channel.queue_declare(queue.into(), QueueDeclareOptions::durable(), arguments)).await {
        Ok(_) => {
            let _ = channel.close(200, "done".into()).await;
            Ok(true)
        }
        Err(e) if soft_error(&e) == Some(AMQPSoftError::PRECONDITIONFAILED) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// The channel-level error RabbitMQ answered with, if `e` is one.
fn soft_error(e: &lapin::Error) -> Option<AMQPSoftError> {
    match e.kind() {
        lapin::ErrorKind::ProtocolError(amqp) => match amqp.kind() {
            AMQPErrorKind::Soft(soft) => Some(soft.clone()),
            AMQPErrorKind::Hard(_) => None,
        },
        _ => None,
    }
}

impl Broker {
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

    /// [`Broker::publish`] on `channel`, within `amqp.timeout`.
    async fn publish_on(
        &self,
        channel: &Channel,
        queue: &str,
        body: &[u8],
        props: BasicProperties,
    ) -> Result<Routed, BrokerError> {
        self.bounded(publish_confirmed(channel, queue, body, props))
            .await
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
        if let Some(ttl) = &self.topology.results_expiration {
            props = props.with_expiration(ttl.as_str().into());
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
        // mail went out under the first delivery: a copy waiting out the
        // lease of its own first delivery must be answered `sent`, never
        // `duplicate` (which would be the job's only result).
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

    /// Sends `job` to the dead-letter queue with why (`reason` and `error`),
    /// when, its attempt count, its original properties, and whether the
    /// ledger held no record of it (`unrecorded`), in the headers. It
    /// carries no ticket, so moved back to the jobs queue it is processed
    /// afresh, as attempt 1.
    pub async fn dead_letter(
        &self,
        job: &Incoming,
        reason: DeadReason,
        error: &str,
        unrecorded: Option<Unrecorded>,
    ) -> Result<(), BrokerError> {
        let mut headers = job.copy_headers();
        headers.insert(
            REASON_HEADER.into(),
            AMQPValue::LongString(reason.as_str().into()),
        );
        headers.insert(ERROR_HEADER.into(), AMQPValue::LongString(error.into()));
        headers.insert(
            DEAD_AT_HEADER.into(),
            AMQPValue::LongLongInt(i64::try_from(now_ms()).unwrap_or(i64::MAX)),
        );
        headers.insert(
            ATTEMPTS_HEADER.into(),
            AMQPValue::LongLongInt(job.attempt.into()),
        );
        headers.insert(ORIGINAL_HEADER.into(), job.original());
        if let Some(u) = unrecorded {
            headers.insert(
                UNRECORDED_HEADER.into(),
                AMQPValue::LongLongInt(i64::try_from(u.at_ms).unwrap_or(i64::MAX)),
            );
        }
        let props = BasicProperties::default().with_headers(headers);
        let dead = self.topology.dead.clone();
        self.publish_declared(&dead, job.body(), props).await
    }
}
