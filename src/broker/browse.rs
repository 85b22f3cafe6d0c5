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
//!
//! A copy keeps the original's properties and headers but three: it has no
//! `user_id` (RabbitMQ refuses a publish whose `user_id` is not the
//! publisher's own user, so a producer's message that RabbitMQ
//! dead-lettered itself would stop every look at its queue, and come back
//! to its head each time, a delivery counted), it carries [`LOOK_HEADER`],
//! naming the look that made it, and its `expiration` is what is left of
//! the original's (from the original's `timestamp`, which results carry):
//! a result looked at again and again still expires when it would have.
//! A queue's own TTL (`x-message-ttl`, a policy's `message-ttl`) starts
//! again for each copy: give results their time per message
//! (`amqp.results_ttl`).

use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicGetOptions, BasicNackOptions, ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection};

use super::incoming::as_string;
use super::ops::{Routed, publish_confirmed};
use super::{BrokerError, LOOK_HEADER};

/// A look at one queue's messages, in order, each at most once.
///
/// Invariants: only as many messages as the queue held when the look
/// began are taken off it (its depth then), so messages published
/// meanwhile, and those it publishes again, are not seen (should another
/// reader take the rest of the queue meanwhile, the look comes round to
/// its own copies: it knows them by [`LOOK_HEADER`], hands that one back
/// and ends, the one delivery it counts); each message
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
    /// This look's name, on the copies it publishes.
    look: String,
    /// Whether it came round to its own copies.
    wrapped: bool,
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
            look: uuid::Uuid::new_v4().simple().to_string(),
            wrapped: false,
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
        if self.seen >= self.depth || self.wrapped {
            return Ok(None);
        }
        let got = self
            .channel
            .basic_get(
                self.queue.as_str().into(),
                BasicGetOptions { no_ack: false },
            )
            .await?;
        let Some(m) = got else {
            return Ok(None);
        };
        if self.made(&m.delivery.properties) {
            // Come round to its own copies: the rest were taken by another
            // reader. Handed back to where it was, and the look ends.
            self.wrapped = true;
            let back = BasicNackOptions {
                requeue: true,
                multiple: false,
            };
            m.delivery.nack(back).await?;
            return Ok(None);
        }
        self.seen += 1;
        Ok(Some(m.delivery))
    }

    /// Whether this look published the message with `props`.
    fn made(&self, props: &BasicProperties) -> bool {
        let header = props
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get(LOOK_HEADER));
        header.and_then(as_string).is_some_and(|v| v == self.look)
    }

    /// Removes `delivery`, a message this look holds, from the queue.
    pub async fn take(&self, delivery: &Delivery) -> Result<(), BrokerError> {
        delivery.ack(BasicAckOptions::default()).await?;
        Ok(())
    }

    /// Leaves `delivery`, a message this look holds, in the queue: a copy
    /// at its tail (confirmed), then the original removed.
    pub async fn keep(&self, delivery: &Delivery) -> Result<(), BrokerError> {
        let props = kept(&delivery.properties, &self.look, crate::domain::now_ms());
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

/// The properties of a look's copy, at `now_ms` by this host's clock, of
/// a message with `p`: the original's, less its `user_id` (see the
/// module's doc), with [`LOOK_HEADER`] set to `look`, and with an
/// `expiration` what is left of the original's since its `timestamp`
/// (whole seconds: counted from the end of that second, so a copy outlives
/// the original by less than a second); at its end, a millisecond.
/// RabbitMQ hands out no message whose time is up, so one that looks a
/// minute or more past it is this host's clock being ahead: the copy then
/// keeps the whole of the original's time, as before looks counted it,
/// rather than vanish (a clock ahead by less than that still shortens it
/// by as much: keep the hosts' clocks right).
fn kept(p: &BasicProperties, look: &str, now_ms: u64) -> BasicProperties {
    /// How far past its time a message handed out must look to be taken
    /// for this host's clock being ahead, rather than for the moment
    /// between its end and RabbitMQ's dropping it.
    const CLOCK_AHEAD_MS: u64 = 60_000;
    let mut expiration = p.expiration().clone();
    if let (Some(ttl), Some(ts)) = (
        (p.expiration().as_ref()).and_then(|e| e.as_str().parse::<u64>().ok()),
        p.timestamp(),
    ) {
        let age = now_ms.saturating_sub(ts.saturating_mul(1000).saturating_add(999));
        let left = match ttl.checked_sub(age).filter(|&left| left > 0) {
            Some(left) => Some(left),
            // At its end (RabbitMQ's clock ran a little behind): gone soon.
            None if age - ttl < CLOCK_AHEAD_MS => Some(1),
            // Far past it: this host's clock is ahead; the whole of it.
            None => None,
        };
        if let Some(left) = left {
            expiration = Some(left.to_string().as_str().into());
        }
    }
    let mut headers = p.headers().clone().unwrap_or_default();
    headers.insert(
        LOOK_HEADER.into(),
        AMQPValue::LongString(LongString::from(look)),
    );
    let mut props = BasicProperties::default().with_headers(headers);
    let text = [
        (
            p.content_type(),
            BasicProperties::with_content_type as fn(_, _) -> _,
        ),
        (p.content_encoding(), BasicProperties::with_content_encoding),
        (p.correlation_id(), BasicProperties::with_correlation_id),
        (p.reply_to(), BasicProperties::with_reply_to),
        (&expiration, BasicProperties::with_expiration),
        (p.message_id(), BasicProperties::with_message_id),
        (p.kind(), BasicProperties::with_type),
        (p.app_id(), BasicProperties::with_app_id),
        (p.cluster_id(), BasicProperties::with_cluster_id),
    ];
    for (value, with) in text {
        if let Some(v) = value {
            props = with(props, v.clone());
        }
    }
    if let Some(v) = p.delivery_mode() {
        props = props.with_delivery_mode(*v);
    }
    if let Some(v) = p.priority() {
        props = props.with_priority(*v);
    }
    if let Some(v) = p.timestamp() {
        props = props.with_timestamp(*v);
    }
    props
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Properties with every field set, `look` as the look header and
    /// `user_id` if given.
    fn every(look: &str, user_id: Option<&str>) -> BasicProperties {
        let mut headers = FieldTable::default();
        headers.insert("tenant".into(), AMQPValue::LongString("acme".into()));
        headers.insert(LOOK_HEADER.into(), AMQPValue::LongString(look.into()));
        let p = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_content_encoding("utf-8".into())
            .with_headers(headers)
            .with_delivery_mode(2)
            .with_priority(3)
            .with_correlation_id("c".into())
            .with_reply_to("r".into())
            .with_expiration("60000".into())
            .with_message_id("m".into())
            .with_timestamp(7)
            .with_type("t".into())
            .with_app_id("a".into())
            .with_cluster_id("k".into());
        match user_id {
            Some(u) => p.with_user_id(u.into()),
            None => p,
        }
    }

    #[test]
    fn a_copy_keeps_all_but_the_user_id_and_names_its_look() {
        // Its timestamp (7 s) ends at 7.999 s: nothing of the minute gone.
        let copy = kept(
            &every("an earlier look", Some("producer")),
            "this look",
            7_999,
        );
        assert_eq!(copy, every("this look", None));
    }

    #[test]
    fn a_copy_gets_what_is_left_of_its_time() {
        let p = every("l", None);
        let at = |now_ms| kept(&p, "l", now_ms).expiration().clone();
        assert_eq!(at(37_999), Some("30000".into()));
        assert_eq!(at(67_998), Some("1".into()));
        assert_eq!(at(67_999), Some("1".into()), "at its end: gone soon");
        assert_eq!(at(127_998), Some("1".into()));
        // A minute past its time, though RabbitMQ handed it out: this
        // host's clock is ahead, and the copy keeps the whole of it.
        assert_eq!(at(127_999), Some("60000".into()));
        assert_eq!(at(1_000_000), Some("60000".into()));
        // No timestamp to count from: kept as it is.
        let untimed = BasicProperties::default().with_expiration("60000".into());
        assert_eq!(
            kept(&untimed, "l", 1_000_000).expiration().clone(),
            Some("60000".into())
        );
    }
}
