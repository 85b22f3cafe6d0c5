//! Looking at a queue without taking what it holds: `mailgate results`,
//! `mailgate dead`, `mailgate job`. Each message is taken off the queue
//! one at a time; one the command does not act on is published again at
//! the queue's tail (confirmed) before the original is acknowledged, so a
//! look that goes through the whole queue leaves it as it was, in order.
//!
//! Why not hand messages back (`basic.nack` with requeue): a quorum queue
//! counts every message handed back as a delivery, and at its delivery
//! limit (RabbitMQ 4.0 to 4.2 set 20 on every quorum queue; a policy can
//! set one on any) drops it; and it puts what it is handed back at its
//! tail, each batch of returns in its own order. Publishing again counts
//! nothing, on either queue type, and keeps the order.

use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicGetOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection};

use super::BrokerError;
use super::ops::{Routed, publish_confirmed};

/// A look at one queue's messages, in order, each at most once.
///
/// Invariants: only as many messages as the queue held when the look
/// began are taken off it (its depth then), so messages published
/// meanwhile, and those it publishes again, are not seen; each message
/// seen is held until [`Browse::take`] removes it or [`Browse::keep`]
/// publishes it again at the tail, one at a time (so other readers are
/// held back by at most one message). A copy published again is a new
/// message: not marked redelivered, no delivery counted; its properties,
/// headers and body are the original's. Should the command die while it
/// holds one, RabbitMQ hands that one back when the channel closes; should
/// it die between a copy's confirm and the original's acknowledgement, the
/// message is there twice.
#[derive(Debug)]
pub struct Browse {
    channel: Channel,
    queue: String,
    /// How many messages the queue held when the look began.
    depth: u32,
    /// How many were seen.
    seen: u32,
}

impl Browse {
    /// Begins a look at `queue` on a channel of its own, with publisher
    /// confirms. Fails if the queue does not exist.
    pub async fn open(conn: &Connection, queue: &str) -> Result<Browse, BrokerError> {
        let channel = conn.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let declared = channel
            .queue_declare(queue.into(), passive, FieldTable::default())
            .await?;
        Ok(Browse {
            channel,
            queue: queue.to_owned(),
            depth: declared.message_count(),
            seen: 0,
        })
    }

    /// How many messages the queue held (ready) when the look began.
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// How many of those were not seen: another reader (a consumer, or
    /// another command) held them while this one looked.
    pub fn unseen(&self) -> u32 {
        self.depth.saturating_sub(self.seen)
    }

    /// The next message, held until it is taken or kept; `None` once as
    /// many as the queue held at the start were seen, or the queue has no
    /// more to give.
    pub async fn next(&mut self) -> Result<Option<Delivery>, BrokerError> {
        if self.seen >= self.depth {
            return Ok(None);
        }
        let got = self
            .channel
            .basic_get(
                self.queue.as_str().into(),
                BasicGetOptions { no_ack: false },
            )
            .await?;
        Ok(got.map(|m| {
            self.seen += 1;
            m.delivery
        }))
    }

    /// Removes `delivery`, a message this look holds, from the queue.
    pub async fn take(&self, delivery: &Delivery) -> Result<(), BrokerError> {
        delivery.ack(BasicAckOptions::default()).await?;
        Ok(())
    }

    /// Leaves `delivery`, a message this look holds, in the queue: a copy
    /// at its tail (confirmed), then the original removed.
    pub async fn keep(&self, delivery: &Delivery) -> Result<(), BrokerError> {
        let props = delivery.properties.clone();
        self.publish(&self.queue, &delivery.data, props).await?;
        self.take(delivery).await
    }

    /// Publishes `body` persistently to `queue` (mandatory) and waits for
    /// RabbitMQ's confirm: [`BrokerError::Refused`] if no queue took it.
    pub async fn publish(
        &self,
        queue: &str,
        body: &[u8],
        props: BasicProperties,
    ) -> Result<(), BrokerError> {
        match publish_confirmed(&self.channel, queue, body, props).await? {
            Routed::Queued => Ok(()),
            Routed::NoQueue => Err(BrokerError::Refused {
                queue: queue.to_owned(),
                why: "no such queue".into(),
            }),
        }
    }

    /// Ends the look.
    pub async fn close(self) -> Result<(), BrokerError> {
        self.channel.close(200, "done".into()).await?;
        Ok(())
    }
}
