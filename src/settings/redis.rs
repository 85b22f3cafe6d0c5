//! `[redis]`: where the limiter and the ledger keep their state (the URL
//! itself is read in `redis_url.rs`).

use std::time::Duration;

use serde::Deserialize;

use super::redis_url::{RedisTarget, RedisUrl, is_memory};
use super::{SettingsError, check_bounds, check_userinfo, human_duration, load_tls};
use crate::redact::redact_url;
use crate::tls::{LinkTls, TlsSettings};

/// Redis connection and key namespace.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSettings {
    /// `redis://host:port/db` (or `rediss://` for TLS); the primary that
    /// Redis Sentinel names, followed across failovers, as
    /// `redis+sentinel://[user:pass@]host:port,host:port,…/service[/db]`
    /// (or `rediss+sentinel://`); `memory://` keeps the limiter and the
    /// ledger in the worker's own memory (one worker, for trials: limits
    /// are not shared and nothing survives a restart). See [`RedisTarget`].
    /// Parsed once, when it is set ([`RedisUrl`]).
    pub url: RedisUrl,
    /// Prepended to every key mailgate writes, so several deployments (or
    /// tests) can share one Redis without seeing each other.
    #[serde(default = "default_key_prefix")]
    pub key_prefix: String,
    /// Accept a Redis whose `maxmemory-policy` evicts keys. Off by default:
    /// an evicted log or job record means admissions over the limits and
    /// second mails, so the worker refuses such a Redis.
    #[serde(default)]
    pub allow_eviction: bool,
    /// How many replicas must acknowledge (Redis `WAIT`) a job's send mark,
    /// and with it its admission, before its SMTP transaction begins. 0 (the
    /// default) does not wait: a failover that loses the mark can mail the
    /// job a second time. With 1 or more, a mark that is not acknowledged
    /// within `replica_ack_timeout` is given back and the job retried later.
    #[serde(default)]
    pub min_replicas_acked: u32,
    /// The longest `WAIT` for `min_replicas_acked` replicas.
    #[serde(
        default = "default_replica_ack_timeout",
        deserialize_with = "human_duration"
    )]
    pub replica_ack_timeout: Duration,
    /// How far a Redis primary's clock and a worker's may disagree before
    /// the worker stops taking jobs (limits, leases and the records that
    /// keep a code from being mailed twice run on Redis's clock; see
    /// `ledger::clock`). A step of Redis's clock within it is not held back,
    /// so windows may be off by up to this much. 1 s to 5 min; 10 s by
    /// default.
    #[serde(
        default = "default_max_clock_skew",
        deserialize_with = "human_duration"
    )]
    pub max_clock_skew: Duration,
    /// `[redis.tls]`: the CA bundle and client certificate of `rediss://`
    /// connections (to the servers, and to the Sentinels). Refused with a
    /// URL without TLS.
    #[serde(default)]
    pub tls: TlsSettings,
}

impl RedisSettings {
    /// Settings for the Redis at `url`, keys under `key_prefix`, the rest
    /// as a config file that names only these two gets them.
    pub fn new(url: impl Into<RedisUrl>, key_prefix: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            key_prefix: key_prefix.into(),
            allow_eviction: false,
            min_replicas_acked: 0,
            replica_ack_timeout: default_replica_ack_timeout(),
            max_clock_skew: default_max_clock_skew(),
            tls: TlsSettings::default(),
        }
    }

    /// `[redis.tls]`, loaded: what TLS connections trust and show.
    pub fn link_tls(&self) -> Result<LinkTls, SettingsError> {
        load_tls(&self.tls, "redis.tls")
    }

    /// Which kind of Redis `url` names, as parsed when it was set. Errors
    /// name what is wrong (never the password); checked settings have none.
    pub fn target(&self) -> Result<&RedisTarget, &str> {
        self.url.target()
    }

    /// Whether `url` names the worker's own memory (`memory://`) rather
    /// than a Redis: the ledger then lives in this process.
    pub fn is_memory(&self) -> bool {
        is_memory(&self.url)
    }

    /// Checks the section on its own: a URL the client reads, bounded
    /// timeouts, TLS settings that go with the URL, and replicas to wait
    /// for only where there are some.
    pub(super) fn validate(&self) -> Result<(), SettingsError> {
        check_userinfo("redis.url", &self.url)?;
        if let Err(e) = self.target().map_err(str::to_owned) {
            // The parsers' errors may quote the URL: it is shown redacted.
            return Err(SettingsError::Invalid(format!(
                "redis.url {}: {} (redis://host:port/db, rediss:// for TLS, \
                 redis+sentinel://host:port,host:port/service[/db] to follow a primary through \
                 Sentinel, or memory://)",
                redact_url(&self.url),
                e.replace(self.url.as_str(), &redact_url(&self.url)),
            )));
        }
        check_bounds(
            "redis.replica_ack_timeout",
            self.replica_ack_timeout,
            Duration::from_millis(10),
            Duration::from_secs(60),
        )?;
        // A step within it shifts windows by as much: kept small.
        check_bounds(
            "redis.max_clock_skew",
            self.max_clock_skew,
            Duration::from_secs(1),
            Duration::from_secs(5 * 60),
        )?;
        self.check_transport()?;
        if self.is_memory() && self.min_replicas_acked > 0 {
            return Err(SettingsError::Invalid(
                "redis.min_replicas_acked needs a Redis with replicas; memory:// has none".into(),
            ));
        }
        Ok(())
    }

    /// No `#fragment` (redis-rs reads `#insecure` as "do not verify the
    /// certificate"), and `[redis.tls]` goes with a URL that uses TLS and
    /// loads.
    fn check_transport(&self) -> Result<(), SettingsError> {
        // A copied example with `#insecure` would quietly accept a man in
        // the middle. A URL parser drops tabs and newlines ("#insec\ture"),
        // so every fragment is refused (a password's '#' is
        // percent-encoded).
        if self.url.contains('#') {
            return Err(SettingsError::Invalid(format!(
                "redis.url {}: a #fragment is not allowed (#insecure would turn off \
                 certificate verification, which mailgate does not allow; give the server's \
                 CA as [redis.tls] ca_file instead)",
                redact_url(&self.url)
            )));
        }
        if self.tls.is_set() {
            let tls = match self.target() {
                Ok(RedisTarget::Server(url)) => crate::tls::is_tls_url(url),
                Ok(RedisTarget::Sentinel(t)) => t.tls,
                Ok(RedisTarget::Cluster(t)) => t.tls,
                _ => false,
            };
            if !tls {
                return Err(SettingsError::Invalid(format!(
                    "[redis.tls] is set but redis.url {} does not use TLS; use rediss://, \
                     rediss+sentinel:// or rediss+cluster:// (or remove [redis.tls])",
                    redact_url(&self.url)
                )));
            }
            self.link_tls()?;
        }
        Ok(())
    }

    /// Whether mailgate's keys spread over a Redis Cluster's shards: a
    /// cluster URL, and a key prefix without a hash tag. Each scope's log
    /// and each job's record then live in the slot their own names place
    /// them in, so every shard takes a share of the work, and an admission
    /// reserves in each scope and gives every reservation back if one
    /// rejects (see `ledger.lua`'s "look"). With a hash tag (`{mailgate}:`)
    /// every key lives in the tag's one slot, and one script decides.
    pub fn spreads_keys(&self) -> bool {
        matches!(self.target(), Ok(RedisTarget::Cluster(_))) && hash_tag(&self.key_prefix).is_none()
    }
}

/// The hash tag of a Redis key (or key prefix): what lies between its first
/// `{` and the next `}`, if not empty. Redis Cluster places a key by its tag,
/// so keys with one tag share a slot.
fn hash_tag(key: &str) -> Option<&str> {
    let (_, after) = key.split_once('{')?;
    let (tag, _) = after.split_once('}')?;
    (!tag.is_empty()).then_some(tag)
}

fn default_replica_ack_timeout() -> Duration {
    Duration::from_secs(1)
}

fn default_max_clock_skew() -> Duration {
    Duration::from_secs(10)
}

fn default_key_prefix() -> String {
    "mailgate:".to_owned()
}
