//! Looking at a queue without taking what it holds: `mailgate results`,
//! `mailgate dead`. Each message is held (unacknowledged) while it is
//! looked at; those not taken go back to the queue when the browse ends,
//! and, should the tool die first, when RabbitMQ closes its channel.

use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicGetOptions, BasicNackOptions, BasicPublishOptions, ConfirmSelectOptions,
    QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Confirmation, Connection};

use super::BrokerError;

/// A look at one queue's messages, in order, each at most once.
///
/// Invariants: only the messages the queue held when the browse began are
/// seen (its depth then), so messages published meanwhile, and those a
/// browse itself publishes to the queue, are not; a message is removed only
/// by [`Browse::take`]; every other message goes back to the queue at
/// [`Browse::close`], which first looks through the rest of them, so all
/// go back together, in their order. (A classic queue puts each back in its
/// place; a quorum queue puts what it is handed back at its tail, so only
/// holding them all keeps their order. Messages published to a quorum
/// queue during a browse end up ahead of them.) A message put back is
/// marked redelivered, and a quorum queue counts one more delivery of it
/// (`x-delivery-count`).
#[derive(Debug)]
pub struct Browse {
    channel: Channel,
    queue: String,
    /// Messages still to look at.
    left: u32,
    /// Whether any message was seen.
    seen: bool,
}

impl Browse {
    /// Begins a browse of `queue` on a channel of its own (with publisher
    /// confirms, for [`Browse::publish`]). Fails if the queue does not exist.
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
            left: declared.message_count(),
            seen: false,
        })
    }

    /// How many messages the queue held when the browse began, less those
    /// seen since.
    pub fn left(&self) -> u32 {
        self.left
    }

    /// The next message, held until it is taken or the browse ends; `None`
    /// once every message the queue held at the start was seen (or the
    /// queue has no more to give: another consumer holds the rest).
    pub async fn next(&mut self) -> Result<Option<Delivery>, BrokerError> {
        if self.left == 0 {
            return Ok(None);
        }
        let got = self
            .channel
            .basic_get(
                self.queue.as_str().into(),
                BasicGetOptions { no_ack: false },
            )
            .await?;
        match got {
            Some(m) => {
                self.left -= 1;
                self.seen = true;
                Ok(Some(m.delivery))
            }
            None => {
                self.left = 0;
                Ok(None)
            }
        }
    }

    /// Removes `delivery`, a message this browse holds, from the queue.
    pub async fn take(&self, delivery: &Delivery) -> Result<(), BrokerError> {
        delivery.ack(BasicAckOptions::default()).await?;
        Ok(())
    }

    /// Publishes `body` persistently to `queue` (mandatory) and waits for
    /// RabbitMQ's confirm: [`BrokerError::Refused`] if no queue took it.
    pub async fn publish(
        &self,
        queue: &str,
        body: &[u8],
        props: BasicProperties,
    ) -> Result<(), BrokerError> {
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
        let why = match confirm {
            Confirmation::Ack(None) => return Ok(()),
            Confirmation::Ack(Some(_)) => "no such queue",
            Confirmation::Nack(_) => "negative confirm (the queue refuses messages)",
            Confirmation::NotRequested => "no confirm on a channel in confirm mode",
        };
        Err(BrokerError::Refused {
            queue: queue.to_owned(),
            why: why.into(),
        })
    }

    /// Ends the browse: every message not taken goes back to the queue, in
    /// its order.
    pub async fn close(mut self) -> Result<(), BrokerError> {
        while self.next().await?.is_some() {}
        if self.seen {
            // Tag 0 with `multiple`: every message still held (AMQP 0-9-1).
            self.channel
                .basic_nack(
                    0,
                    BasicNackOptions {
                        multiple: true,
                        requeue: true,
                    },
                )
                .await?;
        }
        self.channel.close(200, "done".into()).await?;
        Ok(())
    }
}
