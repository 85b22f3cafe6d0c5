//! The queues mailgate declares, their names and their arguments.

use std::time::Duration;

use lapin::types::{AMQPValue, FieldTable};

use super::DELIVERY_LIMIT;
use crate::settings::{Lane, QueueType, Settings};

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
    /// How long a result may wait to be read (`amqp.results_ttl`), as its
    /// AMQP `expiration`; `None`: forever.
    pub results_expiration: Option<String>,
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
            results_expiration: Some(settings.amqp.results_ttl.as_millis())
                .filter(|&ms| ms > 0)
                .map(|ms| ms.to_string()),
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

    /// `J.wait`, the one lease-wait queue of earlier versions: no longer
    /// declared, but a deployment that ran them may still have it.
    pub fn legacy_wait(&self) -> String {
        format!("{}.wait", self.jobs)
    }

    /// The `k`th queue (from 1) past the last of each numbered series, as
    /// earlier settings of this deployment may have declared them: the
    /// retry queue of attempt `retries + k` (a larger `retry.max_attempts`
    /// then), and the lease-wait band `k` doublings past the longest (a
    /// longer `limits.send_lease`). Each series is numbered without gaps,
    /// so the first missing one ends it.
    pub fn beyond(&self, k: u32) -> [String; 2] {
        let longest = self.wait_bands_ms.last().copied().unwrap_or(1);
        let band = longest.saturating_mul(1u64.checked_shl(k).unwrap_or(u64::MAX));
        [
            self.retry(self.retries.saturating_add(k)),
            self.wait_band(band),
        ]
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
        if self.is_waiting(queue) {
            return self.lane_arguments(self.queue_type);
        }
        let mut args = type_named(self.queue_type);
        if self.queue_type == QueueType::Quorum && (queue == self.jobs || queue == self.redelivered)
        {
            args.insert(
                "x-delivery-limit".into(),
                AMQPValue::LongLongInt(DELIVERY_LIMIT),
            );
            dead_letters_to(&mut args, &self.dead, self.queue_type);
        }
        args
    }

    /// The arguments of a queue where these jobs wait (a retry or a lease
    /// wait) of `queue_type`: expired messages dead-letter back to the jobs
    /// queue. RabbitMQ declares an existing queue again only with the
    /// arguments it has, so these prove a queue is one of this deployment's
    /// waiting queues, whatever its name says (`admin purge`).
    pub fn lane_arguments(&self, queue_type: QueueType) -> FieldTable {
        let mut args = type_named(queue_type);
        dead_letters_to(&mut args, &self.jobs, queue_type);
        args
    }

    /// Whether `queue` is one where these jobs wait: a lease-wait band or a
    /// retry queue these settings declare.
    pub fn is_waiting(&self, queue: &str) -> bool {
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
    pub(super) fn refusal(&self, why: &str) -> String {
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
    pub(super) fn owns(&self, queue: &str) -> bool {
        self.all().iter().any(|q| q == queue)
    }

    /// Whether `queue` is, or could be, one of mailgate's: never a place for
    /// a result. Beyond the queues this worker declares, that is any name of
    /// a waiting queue, of these jobs or of another deployment's
    /// (`<name>.wait.<n>`, `<name>.retry.<n>`, and `<name>.wait`, the one
    /// wait queue of earlier versions): a result parked there, with no
    /// expiry, would hold up every wait behind it.
    pub fn reserved(&self, queue: &str) -> bool {
        self.owns(queue) || Lane::of(queue).is_some_and(Lane::is_waiting)
    }
}

/// Arguments that name the queue's type.
fn type_named(queue_type: QueueType) -> FieldTable {
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString(queue_type.as_str().into()),
    );
    args
}

/// Adds to `args` that the queue dead-letters to `to` (at least once, on a
/// quorum queue).
fn dead_letters_to(args: &mut FieldTable, to: &str, queue_type: QueueType) {
    let text = |s: &str| AMQPValue::LongString(s.into());
    args.insert("x-dead-letter-exchange".into(), text(""));
    args.insert("x-dead-letter-routing-key".into(), text(to));
    if queue_type == QueueType::Quorum {
        args.insert("x-dead-letter-strategy".into(), text("at-least-once"));
        args.insert("x-overflow".into(), text("reject-publish"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::Settings;

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
    fn a_purge_also_looks_for_what_earlier_settings_declared() {
        let t = Topology::new(&settings());
        assert_eq!(t.legacy_wait(), "j.wait");
        assert_eq!(t.beyond(1), ["j.retry.3", "j.wait.64000"]);
        assert_eq!(t.beyond(2), ["j.retry.4", "j.wait.128000"]);
    }
}
