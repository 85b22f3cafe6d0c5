//! `[amqp]`: the broker, its nodes and mailgate's queues.

use std::time::Duration;

use serde::Deserialize;

use super::{SettingsError, check_bounds, check_userinfo, human_duration, load_tls};
use crate::redact::{SecretUrl, redact_url, url_list};
use crate::tls::{LinkTls, TlsSettings};

/// RabbitMQ connection and queue names.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AmqpSettings {
    /// `amqp://user:pass@host:port/vhost` (`amqps://` for TLS), or the
    /// nodes of a cluster as several such URLs separated by commas: the
    /// worker connects to the first that answers (see [`Self::urls`]).
    pub url: SecretUrl,
    /// Durable queue the jobs arrive on. Dead letters go to `<jobs_queue>.dead`,
    /// retries wait in `<jobs_queue>.retry.<attempt>`, lease waits in
    /// `<jobs_queue>.wait.<ms>`.
    #[serde(default = "default_jobs_queue")]
    pub jobs_queue: String,
    /// Durable queue results go to, unless a job names its own `reply_to`.
    #[serde(default = "default_results_queue")]
    pub results_queue: String,
    /// Unacknowledged jobs per worker, which is also how many are processed at once.
    #[serde(default = "default_prefetch")]
    pub prefetch: u16,
    /// The deadline for one broker operation (a publish and its confirm, a
    /// declare, a cancel). One that RabbitMQ does not complete in time (a
    /// memory or disk alarm blocks publishers) closes the connection, so its
    /// unacknowledged jobs go back to the queue instead of waiting forever.
    #[serde(default = "default_amqp_timeout", deserialize_with = "human_duration")]
    pub timeout: Duration,
    /// The type every one of mailgate's queues is declared with. RabbitMQ
    /// refuses to declare an existing queue as another type, so changing
    /// it means moving to new queues (see the README).
    #[serde(default)]
    pub queue_type: QueueType,
    /// `[amqp.tls]`: the CA bundle and client certificate of `amqps://`
    /// connections. Refused with an `amqp://` URL.
    #[serde(default)]
    pub tls: TlsSettings,
    /// How long a result waits to be read before RabbitMQ drops it (the
    /// AMQP `expiration` of every result, on the results queue and on a
    /// `reply_to` queue alike): a results queue nobody drains does not
    /// grow without end. A verification code's result is of no use after
    /// its code expired. Default 1 day; `"0s"`: results never expire. At
    /// most 30 days.
    #[serde(default = "default_results_ttl", deserialize_with = "human_duration")]
    pub results_ttl: Duration,
}

/// How mailgate's queues are replicated. New deployments get quorum queues;
/// one whose queues are classic says so (RabbitMQ cannot change a queue's
/// type, see the README).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueType {
    /// Classic durable queues: each lives on one node, unreplicated.
    Classic,
    /// Quorum queues: replicated over the cluster's nodes (Raft), so a
    /// queue survives the loss of a minority of them; dead-lettering is at
    /// least once, and a message handed back too often is dead-lettered
    /// (RabbitMQ 3.10 or later).
    #[default]
    Quorum,
}

impl QueueType {
    /// The name RabbitMQ gives the type (`x-queue-type`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Classic => "classic",
            Self::Quorum => "quorum",
        }
    }
}

impl AmqpSettings {
    /// `[amqp.tls]`, loaded: what `amqps://` connections trust and show.
    pub fn link_tls(&self) -> Result<LinkTls, SettingsError> {
        load_tls(&self.tls, "amqp.tls")
    }

    /// The URLs `url` lists, in order (one, or a cluster's nodes).
    pub fn urls(&self) -> Vec<&str> {
        url_list(&self.url)
    }

    /// Checks the section on its own: at least one job at a time, every
    /// node's URL readable by the AMQP client, a bounded timeout, and TLS
    /// settings that go with the URLs' schemes.
    pub(super) fn validate(&self) -> Result<(), SettingsError> {
        if self.prefetch == 0 {
            return Err(SettingsError::Invalid(
                "amqp.prefetch must be at least 1".into(),
            ));
        }
        let urls = self.urls();
        for url in &urls {
            check_userinfo("amqp.url", url)?;
        }
        for url in urls {
            check_url(url)?;
        }
        check_bounds(
            "amqp.timeout",
            self.timeout,
            Duration::from_millis(100),
            super::MAX_TIMEOUT,
        )?;
        if self.results_ttl > Duration::from_secs(30 * 86_400) {
            return Err(SettingsError::Invalid(
                "amqp.results_ttl must be at most 30d (or \"0s\": results never expire)".into(),
            ));
        }
        if !self.results_ttl.is_zero() && self.results_ttl < Duration::from_secs(1) {
            return Err(SettingsError::Invalid(
                "amqp.results_ttl must be at least 1s, or \"0s\" (results never expire)".into(),
            ));
        }
        self.check_transport()
    }

    /// Every node uses one scheme, and `[amqp.tls]` goes with `amqps://`
    /// and loads.
    fn check_transport(&self) -> Result<(), SettingsError> {
        let amqps = |u: &&str| {
            u.trim_start()
                .get(..8)
                .is_some_and(|s| s.eq_ignore_ascii_case("amqps://"))
        };
        let urls = self.urls();
        if urls.iter().any(amqps) && !urls.iter().all(amqps) {
            return Err(SettingsError::Invalid(
                "amqp.url lists amqps:// and amqp:// nodes: whoever can reset the TLS ones \
                 would move the worker, its password and the jobs onto an unencrypted \
                 connection; give every node the same scheme"
                    .into(),
            ));
        }
        if self.tls.is_set() {
            let plain = urls.iter().find(|u| !amqps(u));
            if let Some(url) = plain {
                return Err(SettingsError::Invalid(format!(
                    "[amqp.tls] is set but amqp.url {} does not use TLS; use amqps:// \
                     (or remove [amqp.tls])",
                    redact_url(url)
                )));
            }
            self.link_tls()?;
        }
        Ok(())
    }

    /// Checks the queue names, and those derived from `jobs_queue` for
    /// `max_attempts`: each must be a name RabbitMQ accepts (1 to 255 bytes,
    /// not starting with the reserved `amq.`), and the results queue must
    /// be none of mailgate's other queues.
    pub(super) fn check_queues(
        &self,
        max_attempts: u32,
        wait_bands: Vec<u64>,
    ) -> Result<(), SettingsError> {
        let jobs = &self.jobs_queue;
        let longest = [
            format!("{jobs}.retry.{}", max_attempts.saturating_sub(1).max(1)),
            format!("{jobs}.wait.{}", wait_bands.last().copied().unwrap_or(0)),
        ]
        .into_iter()
        .max_by_key(String::len)
        .unwrap_or_default();
        for (key, name) in [
            ("amqp.jobs_queue", jobs.as_str()),
            ("amqp.results_queue", self.results_queue.as_str()),
        ] {
            if name.is_empty() {
                return Err(SettingsError::Invalid(format!("{key} must be named")));
            }
            if let Some(lane) = Lane::of(name) {
                return Err(SettingsError::Invalid(format!(
                    "{key} {name:?} is named like {} of another jobs queue: that \
                     deployment's `mailgate admin purge` could take it for its own; choose a \
                     name that does not end in .dead, .redelivered, .wait, .wait.<number> or \
                     .retry.<number>",
                    lane.describe()
                )));
            }
            if name.starts_with("amq.") {
                return Err(SettingsError::Invalid(format!(
                    "{key} {name:?}: names starting with \"amq.\" are reserved by RabbitMQ"
                )));
            }
            if name.len() > 255 {
                return Err(SettingsError::Invalid(format!(
                    "{key} is {} bytes; RabbitMQ queue names are at most 255",
                    name.len()
                )));
            }
        }
        if longest.len() > 255 {
            return Err(SettingsError::Invalid(format!(
                "amqp.jobs_queue is {} bytes: the queues derived from it ({longest:?}) \
                 would exceed RabbitMQ's 255; use at most {} bytes with these retry and lease \
                 settings",
                jobs.len(),
                255 - (longest.len() - jobs.len()),
            )));
        }
        // `<jobs>.wait` was the one lease-wait queue before the bands.
        let derived = [jobs.clone(), format!("{jobs}.dead"), format!("{jobs}.wait")];
        let numbered = |kind: &str| {
            self.results_queue
                .strip_prefix(&format!("{jobs}.{kind}."))
                .is_some_and(|n| n.parse::<u64>().is_ok())
        };
        let is_waiting = numbered("retry") || numbered("wait");
        if derived.contains(&self.results_queue) || is_waiting {
            return Err(SettingsError::Invalid(format!(
                "amqp.results_queue {:?} is one of the queues mailgate derives from \
                 amqp.jobs_queue; results would be taken for jobs",
                self.results_queue
            )));
        }
        Ok(())
    }
}

/// One of the queues mailgate derives from a jobs queue `J`, as its name
/// shows it ([`Lane::of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// `J.dead`.
    Dead,
    /// `J.redelivered`.
    Redelivered,
    /// `J.wait`, the one lease-wait queue of earlier versions.
    OldWait,
    /// `J.wait.<ms>`.
    Wait,
    /// `J.retry.<n>`.
    Retry,
}

impl Lane {
    /// The lane `name` is named like, whatever its jobs queue (a name
    /// before the suffix): no deployment's own jobs or results queue may be
    /// named so (another deployment's `admin purge`, which looks for its
    /// lanes by name, would meet it), and no job's `reply_to` may name a
    /// waiting one ([`Lane::is_waiting`]: a result parked there would hold
    /// up every wait behind it).
    pub fn of(name: &str) -> Option<Lane> {
        let (head, tail) = name.rsplit_once('.')?;
        let numbered = !tail.is_empty() && tail.bytes().all(|b| b.is_ascii_digit());
        let (jobs, lane) = match tail {
            "dead" => (head, Lane::Dead),
            "redelivered" => (head, Lane::Redelivered),
            "wait" => (head, Lane::OldWait),
            _ if numbered => match head.rsplit_once('.') {
                Some((jobs, "wait")) => (jobs, Lane::Wait),
                Some((jobs, "retry")) => (jobs, Lane::Retry),
                _ => return None,
            },
            _ => return None,
        };
        (!jobs.is_empty()).then_some(lane)
    }

    /// Whether jobs wait in it for a while (a lease wait or a retry).
    pub fn is_waiting(self) -> bool {
        matches!(self, Lane::OldWait | Lane::Wait | Lane::Retry)
    }

    /// What it is, for people.
    pub fn describe(self) -> &'static str {
        match self {
            Lane::Dead => "the dead-letter queue",
            Lane::Redelivered => "the queue of jobs handed out twice",
            Lane::OldWait => "the lease-wait queue of earlier versions",
            Lane::Wait => "a lease-wait queue",
            Lane::Retry => "a retry queue",
        }
    }
}

/// Checks that the AMQP client reads one node's URL as written. Its
/// errors may quote the URL: it is shown redacted.
fn check_url(url: &str) -> Result<(), SettingsError> {
    let parsed = url.parse::<lapin::uri::AMQPUri>();
    // The AMQP client reads a bracketed IPv6 host as "localhost": a worker
    // would quietly use a local broker.
    let ipv6 = parsed
        .as_ref()
        .is_ok_and(|u| url.contains('[') && !u.authority.host.contains(':'));
    let why = match parsed {
        Err(e) => e.to_string().replace(url, &redact_url(url)),
        Ok(_) if ipv6 => "an IPv6 address as the host is not read correctly by the \
                          AMQP client; give a host name that resolves to it"
            .to_owned(),
        Ok(_) => return Ok(()),
    };
    Err(SettingsError::Invalid(format!(
        "amqp.url {}: {why} (amqp://user:pass@host:port/vhost, or amqps://; a \
         cluster's nodes as such URLs separated by commas)",
        redact_url(url),
    )))
}

fn default_jobs_queue() -> String {
    "mailgate.jobs".into()
}
fn default_results_queue() -> String {
    "mailgate.results".into()
}
/// Measured (BENCHMARKS.md, issue 11): a job is in flight for a broker
/// round trip plus its Redis call (and its SMTP transaction), so 64 capped
/// throughput by latency; 256 raised the rejected path by about a fifth and
/// the admitted path by about a tenth on the bench machine.
fn default_prefetch() -> u16 {
    256
}
fn default_amqp_timeout() -> Duration {
    Duration::from_secs(30)
}
fn default_results_ttl() -> Duration {
    Duration::from_secs(86_400)
}
