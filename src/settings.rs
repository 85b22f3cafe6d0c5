//! Settings: the TOML file given by `--config` (default `config/default.toml`),
//! overridden by environment variables `MAILGATE__SECTION__KEY`.
//!
//! Everything is checked while loading, so a typo or an impossible value stops
//! the process at start-up with a message naming the key, never later.

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use crate::domain::Normalization;
use crate::tls::{LinkTls, TlsSettings};

/// The whole configuration of a mailgate process.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// The broker: where jobs come from and results go.
    pub amqp: AmqpSettings,
    /// Where the limiter keeps its state.
    pub redis: RedisSettings,
    /// How mail is sent.
    pub smtp: SmtpSettings,
    /// The metrics and health endpoint.
    #[serde(default)]
    pub http: HttpSettings,
    /// Where the mail templates are.
    #[serde(default)]
    pub templates: TemplateSettings,
    /// How transient failures are retried.
    #[serde(default)]
    pub retry: RetrySettings,
    /// The worker's own behaviour.
    #[serde(default)]
    pub worker: WorkerSettings,
    /// The rate-limit policy.
    #[serde(default)]
    pub limits: LimitSettings,
    /// Where traces go.
    #[serde(default)]
    pub telemetry: TelemetrySettings,
}

/// Where traces go (`crate::traces`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetrySettings {
    /// An OpenTelemetry collector's OTLP/HTTP base URL (`http://…:4318`):
    /// spans are exported to `<url>/v1/traces` (JSON). None: nothing is
    /// exported (results still carry a `traceparent`).
    pub otlp_endpoint: Option<String>,
}

/// Why settings could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// The file is missing, is not TOML, or a key is unknown or of the wrong type.
    #[error("cannot load settings: {0}")]
    Load(config::ConfigError),
    /// The values parse but make no sense together.
    #[error("invalid settings: {0}")]
    Invalid(String),
}

impl From<config::ConfigError> for SettingsError {
    fn from(e: config::ConfigError) -> Self {
        SettingsError::Load(e)
    }
}

impl Settings {
    /// Loads `path`, then applies `MAILGATE__SECTION__KEY` environment
    /// overrides, then checks the result.
    pub fn load(path: &Path) -> Result<Self, SettingsError> {
        let settings: Settings = config::Config::builder()
            .add_source(config::File::from(path).required(true))
            .add_source(
                config::Environment::with_prefix("MAILGATE")
                    .prefix_separator("__")
                    .separator("__"),
            )
            .build()?
            .try_deserialize()?;
        settings.validate()?;
        Ok(settings)
    }

    /// The delay bands of the lease-wait queues (`<jobs_queue>.wait.<ms>`),
    /// ms, shortest first: 250 ms doubling until one covers the longest lease
    /// wait (`limits.send_lease` + 100 ms). A wait of `d` goes to the first
    /// band `>= d`. RabbitMQ expires messages only at a queue's head, so a
    /// short wait queued behind a longer one waits for it: within a band
    /// that costs at most the band (under twice the wait), where one queue
    /// for every wait could hold a 100 ms wait for the whole lease.
    pub fn wait_bands_ms(&self) -> Vec<u64> {
        let longest = u64::try_from(self.limits.send_lease.as_millis())
            .unwrap_or(u64::MAX)
            .saturating_add(100);
        let mut bands = vec![WAIT_BAND_MIN_MS];
        while let Some(&last) = bands.last()
            && last < longest
        {
            bands.push(last.saturating_mul(2));
        }
        bands
    }

    /// What the settings allow that an operator should know of, one line
    /// each: an SMTP relay on another host whose mail may travel in clear;
    /// a `worker.shutdown_timeout` that leaves a send under way less than
    /// `smtp.timeout` to finish (the worker keeps a tenth of it to close
    /// its connection), so a deploy can cut the send off and its code be
    /// answered "delivery unknown" (found by review). Shown by
    /// `check-config` and logged at start-up.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings: Vec<String> = (self.smtp.relay_list().unwrap_or_default().iter())
            .filter_map(|r| r.check_transport().ok().flatten())
            .collect();
        let (drain, send) = (self.worker.shutdown_timeout, self.smtp.timeout);
        if drain.mul_f64(0.9) < send {
            warnings.push(format!(
                "worker.shutdown_timeout ({}) leaves a send under way less than smtp.timeout ({}) \
                 to finish when the worker stops: a deploy can cut it off, and its code is then \
                 answered \"delivery unknown\"; make it at least {}",
                humantime::format_duration(drain),
                humantime::format_duration(send),
                humantime::format_duration(send.mul_f64(1.2)),
            ));
        }
        warnings
    }

    /// Every link's TLS settings load and go with a URL that uses TLS, and
    /// no SMTP password can go out unencrypted.
    fn check_transport(&self) -> Result<(), SettingsError> {
        let invalid = |m: String| Err(SettingsError::Invalid(m));
        let amqps = |u: &&str| {
            u.trim_start()
                .get(..8)
                .is_some_and(|s| s.eq_ignore_ascii_case("amqps://"))
        };
        let urls = self.amqp.urls();
        if urls.iter().any(amqps) && !urls.iter().all(amqps) {
            return invalid(
                "amqp.url lists amqps:// and amqp:// nodes: whoever can reset the TLS ones \
                 would move the worker, its password and the jobs onto an unencrypted \
                 connection; give every node the same scheme"
                    .into(),
            );
        }
        if self.amqp.tls.is_set() {
            let plain = urls.iter().find(|u| !amqps(u));
            if let Some(url) = plain {
                return invalid(format!(
                    "[amqp.tls] is set but amqp.url {} does not use TLS; use amqps:// \
                     (or remove [amqp.tls])",
                    redact_url(url)
                ));
            }
            self.amqp.link_tls()?;
        }
        // redis-rs reads a `#insecure` fragment as "do not verify the
        // certificate": a copied example would quietly accept a man in the
        // middle. A URL parser drops tabs and newlines ("#insec\ture"), so
        // every fragment is refused (a password's '#' is percent-encoded).
        if self.redis.url.contains('#') {
            return invalid(format!(
                "redis.url {}: a #fragment is not allowed (#insecure would turn off \
                 certificate verification, which mailgate does not allow; give the server's \
                 CA as [redis.tls] ca_file instead)",
                redact_url(&self.redis.url)
            ));
        }
        if self.redis.tls.is_set() {
            let tls = match self.redis.target() {
                Ok(RedisTarget::Server(url)) => crate::tls::is_tls_url(&url),
                Ok(RedisTarget::Sentinel(t)) => t.tls,
                Ok(RedisTarget::Cluster(t)) => t.tls,
                _ => false,
            };
            if !tls {
                return invalid(format!(
                    "[redis.tls] is set but redis.url {} does not use TLS; use rediss://, \
                     rediss+sentinel:// or rediss+cluster:// (or remove [redis.tls])",
                    redact_url(&self.redis.url)
                ));
            }
            self.redis.link_tls()?;
        }
        let relays = self.smtp.relay_list()?;
        for relay in &relays {
            relay.check_transport()?;
            if relay.tls.is_set() {
                relay.link_tls()?;
            }
        }
        let plain = |r: &Relay| {
            url::Url::parse(&r.url).is_ok_and(|u| {
                u.scheme() == "file"
                    || u.query_pairs()
                        .find(|(k, _)| k == "tls")
                        .is_some_and(|(_, v)| v == "none")
            })
        };
        let shared_unused = relays.iter().all(|r| r.tls_key != "smtp.tls" || plain(r));
        if self.smtp.tls.is_set() && shared_unused {
            return invalid(
                "[smtp.tls] is set but no relay that uses it encrypts (file://, tls=none, or \
                 relays with a tls of their own); remove [smtp.tls], or use ?tls=required or \
                 smtps://"
                    .into(),
            );
        }
        Ok(())
    }

    /// Checks what serde cannot see key by key, across sections.
    pub fn validate(&self) -> Result<(), SettingsError> {
        self.limits.validate()?;
        let invalid = |m: String| Err(SettingsError::Invalid(m));
        // Parsed here, so a bad one is refused by check-config too, and
        // named redacted (found by review: the exporter's own error quoted
        // the password).
        if let Some(url) = &self.telemetry.otlp_endpoint
            && (!(url.starts_with("http://") || url.starts_with("https://"))
                || format!("{}/v1/traces", url.trim_end_matches('/'))
                    .parse::<hyper::Uri>()
                    .is_err())
        {
            return invalid(format!(
                "telemetry.otlp_endpoint {}: not an http:// or https:// URL (the collector's OTLP/HTTP port, 4318)",
                redact_url(url)
            ));
        }
        if self.limits.any_supersede() && self.redis.spreads_keys() {
            return invalid(
                "limits.supersede needs every key of mailgate's in one slot of the Redis \
                 Cluster: give redis.key_prefix a hash tag (e.g. \"{mailgate}:\"); with the \
                 keys spread over the shards a job and the newer job that supersedes it are \
                 judged on different shards"
                    .into(),
            );
        }
        if self.limits.supersede_skew > Duration::from_secs(3600) {
            return invalid("limits.supersede_skew must be at most 1h".into());
        }
        if self.limits.result_granularity > Duration::from_secs(3600) {
            return invalid("limits.result_granularity must be at most 1h".into());
        }
        if self.amqp.prefetch == 0 {
            return invalid("amqp.prefetch must be at least 1".into());
        }
        if self.retry.max_attempts == 0 || self.retry.max_attempts > MAX_ATTEMPTS {
            return invalid(format!(
                "retry.max_attempts is {}; it must be 1 to {MAX_ATTEMPTS} (each attempt after \
                 the first has a retry queue of its own)",
                self.retry.max_attempts
            ));
        }
        self.amqp
            .check_queues(self.retry.max_attempts, self.wait_bands_ms())?;
        let amqp_urls = self.amqp.urls();
        for (key, url) in amqp_urls
            .iter()
            .map(|u| ("amqp.url", *u))
            .chain([("redis.url", self.redis.url.as_str())])
            .chain(
                url_list(&self.smtp.url)
                    .into_iter()
                    .map(|u| ("smtp.url", u)),
            )
        {
            check_userinfo(key, url)?;
        }
        // The parsers' errors may quote the URL: it is shown redacted.
        let quoted = |e: String, url: &str| e.replace(url, &redact_url(url));
        for url in amqp_urls {
            let parsed = url.parse::<lapin::uri::AMQPUri>();
            // The AMQP client reads a bracketed IPv6 host as "localhost"
            // (found by review): a worker would quietly use a local broker.
            let ipv6 = parsed
                .as_ref()
                .is_ok_and(|u| url.contains('[') && !u.authority.host.contains(':'));
            let why = match parsed {
                Err(e) => quoted(e.to_string(), url),
                Ok(_) if ipv6 => "an IPv6 address as the host is not read correctly by the \
                                  AMQP client; give a host name that resolves to it"
                    .to_owned(),
                Ok(_) => continue,
            };
            return invalid(format!(
                "amqp.url {}: {why} (amqp://user:pass@host:port/vhost, or amqps://; a \
                 cluster's nodes as such URLs separated by commas)",
                redact_url(url),
            ));
        }
        if let Err(e) = self.redis.target() {
            return invalid(format!(
                "redis.url {}: {} (redis://host:port/db, rediss:// for TLS, \
                 redis+sentinel://host:port,host:port/service[/db] to follow a primary through \
                 Sentinel, or memory://)",
                redact_url(&self.redis.url),
                quoted(e, &self.redis.url),
            ));
        }
        // Upper bounds keep every deadline computable (an `Instant` plus a
        // timeout that overflows panics) and meaningful.
        for (key, value, min, max) in [
            (
                "amqp.timeout",
                self.amqp.timeout,
                Duration::from_millis(100),
                MAX_TIMEOUT,
            ),
            (
                "smtp.timeout",
                self.smtp.timeout,
                Duration::from_secs(1),
                MAX_TIMEOUT,
            ),
            (
                "redis.replica_ack_timeout",
                self.redis.replica_ack_timeout,
                Duration::from_millis(10),
                Duration::from_secs(60),
            ),
            (
                // A step within it shifts windows by as much: kept small.
                "redis.max_clock_skew",
                self.redis.max_clock_skew,
                Duration::from_secs(1),
                Duration::from_secs(5 * 60),
            ),
            (
                "worker.shutdown_timeout",
                self.worker.shutdown_timeout,
                Duration::from_millis(100),
                MAX_TIMEOUT,
            ),
        ] {
            if !(min..=max).contains(&value) {
                return invalid(format!(
                    "{key} is {}; it must be {} to {}",
                    humantime::format_duration(value),
                    humantime::format_duration(min),
                    humantime::format_duration(max),
                ));
            }
        }
        self.smtp.validate()?;
        self.check_transport()?;
        if self.smtp.pool_size == 0 || self.smtp.pool_size > 1_000 {
            return invalid("smtp.pool_size must be 1 to 1000".into());
        }
        if self.retry.max < self.retry.initial {
            return invalid("retry.max must be at least retry.initial".into());
        }
        let horizon = self.limits.send_lease + self.retry.horizon();
        if self.limits.dedup_for < horizon {
            return invalid(format!(
                "limits.dedup_for ({}) must cover limits.send_lease plus the longest wait of \
                 every retry ({} in all with these retry settings), or a job still being \
                 retried could be forgotten and mailed twice",
                humantime::format_duration(self.limits.dedup_for),
                humantime::format_duration(horizon),
            ));
        }
        if self.limits.send_lease < self.smtp.timeout + Duration::from_secs(5) {
            return invalid(format!(
                "limits.send_lease ({}) must exceed smtp.timeout ({}) by at least 5s, \
                 or a slow send and another copy of its job could both deliver",
                humantime::format_duration(self.limits.send_lease),
                humantime::format_duration(self.smtp.timeout),
            ));
        }
        // The lease starts with the send mark, before its replicas' WAIT.
        if self.redis.min_replicas_acked > 0
            && self.limits.send_lease
                < self.smtp.timeout + self.redis.replica_ack_timeout + Duration::from_secs(5)
        {
            return invalid(format!(
                "limits.send_lease ({}) must exceed smtp.timeout ({}) plus \
                 redis.replica_ack_timeout ({}) by at least 5s when redis.min_replicas_acked \
                 is set, or a slow send and another copy of its job could both deliver",
                humantime::format_duration(self.limits.send_lease),
                humantime::format_duration(self.smtp.timeout),
                humantime::format_duration(self.redis.replica_ack_timeout),
            ));
        }
        if let Ok(RedisTarget::Memory) = self.redis.target()
            && self.redis.min_replicas_acked > 0
        {
            return invalid(
                "redis.min_replicas_acked needs a Redis with replicas; memory:// has none".into(),
            );
        }
        Ok(())
    }
}

/// Most attempts a job may have: each attempt after the first waits in a
/// queue of its own.
pub const MAX_ATTEMPTS: u32 = 50;

/// The longest rule window, send lease or dedup period: a year. Longer ones
/// overflow what Redis accepts as an expiry once added to the clock.
pub const MAX_PERIOD: Duration = Duration::from_secs(366 * 24 * 3600);

/// The shortest lease-wait band, ms (see [`Settings::wait_bands_ms`]).
const WAIT_BAND_MIN_MS: u64 = 250;

/// RabbitMQ connection and queue names.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AmqpSettings {
    /// `amqp://user:pass@host:port/vhost` (`amqps://` for TLS), or the
    /// nodes of a cluster as several such URLs separated by commas: the
    /// worker connects to the first that answers (see [`Self::urls`]).
    pub url: String,
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

    /// Checks the queue names, and those derived from `jobs_queue` for
    /// `max_attempts`: each must be a name RabbitMQ accepts (1 to 255 bytes,
    /// not starting with the reserved `amq.`), and the results queue must
    /// be none of mailgate's other queues.
    fn check_queues(&self, max_attempts: u32, wait_bands: Vec<u64>) -> Result<(), SettingsError> {
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

impl std::fmt::Debug for AmqpSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpSettings")
            .field("url", &redact_url(&self.url))
            .field("jobs_queue", &self.jobs_queue)
            .field("results_queue", &self.results_queue)
            .field("prefetch", &self.prefetch)
            .field("timeout", &self.timeout)
            .field("queue_type", &self.queue_type)
            .field("tls", &self.tls)
            .finish()
    }
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

/// How mail is sent.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SmtpSettings {
    /// `smtp://host:port` (STARTTLS when offered; `?tls=required` insists),
    /// `smtps://host:port` (implicit TLS), optional `user:pass@`; or
    /// `file://DIR` to write `.eml` files instead of sending. The shorthand
    /// for `[[smtp.relays]]`: one relay, or several SMTP URLs separated by
    /// commas, in order of preference, each named `host:port`; empty when
    /// the relays are listed there (setting both is refused).
    #[serde(default)]
    pub url: String,
    /// `[[smtp.relays]]`: several relays, in order of preference, each with
    /// a circuit breaker (see [`CircuitSettings`]). Empty when `url` is set.
    #[serde(default)]
    pub relays: Vec<RelaySettings>,
    /// When a relay's circuit opens, and for how long.
    #[serde(default)]
    pub circuit: CircuitSettings,
    /// The `From` of every mail, e.g. `Example <no-reply@example.com>`.
    pub from: String,
    /// Most SMTP connections kept open and used at once.
    #[serde(default = "default_pool_size")]
    pub pool_size: u32,
    /// Deadline for one whole send (connect, TLS, the SMTP dialogue).
    #[serde(default = "default_smtp_timeout", deserialize_with = "human_duration")]
    pub timeout: Duration,
    /// `[smtp.tls]`: the CA bundle every relay without a `tls` of its own
    /// trusts (`ca_file` only: no client certificates for SMTP).
    #[serde(default)]
    pub tls: TlsSettings,
}

impl std::fmt::Debug for SmtpSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmtpSettings")
            .field("url", &redact_url(&self.url))
            .field("relays", &self.relays)
            .field("circuit", &self.circuit)
            .field("from", &self.from)
            .field("pool_size", &self.pool_size)
            .field("timeout", &self.timeout)
            .field("tls", &self.tls)
            .finish()
    }
}

/// One `[[smtp.relays]]` entry.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelaySettings {
    /// `smtp://` or `smtps://`, as `smtp.url` (not `file://`).
    pub url: String,
    /// The relay's name in metrics (label `relay`), logs and `/readyz`;
    /// `host:port` by default (never the credentials).
    #[serde(default)]
    pub name: Option<String>,
    /// This relay's TLS (`tls = { ca_file = "…" }`), instead of
    /// `[smtp.tls]`'s; `tls = {}` is the defaults (the bundled roots).
    #[serde(default)]
    pub tls: Option<TlsSettings>,
}

impl std::fmt::Debug for RelaySettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelaySettings")
            .field("url", &redact_url(&self.url))
            .field("name", &self.name)
            .field("tls", &self.tls)
            .finish()
    }
}

/// `[smtp.circuit]`: after `failures` relay-level failures in a row a
/// relay's circuit opens for `cool_down`; then one probe (a session and
/// NOOP) closes it again, or opens it for another `cool_down`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CircuitSettings {
    /// Consecutive relay-level failures that open a relay's circuit.
    pub failures: u32,
    /// How long an open circuit waits before its probe.
    #[serde(deserialize_with = "human_duration")]
    pub cool_down: Duration,
}

impl Default for CircuitSettings {
    fn default() -> Self {
        Self {
            failures: 5,
            cool_down: Duration::from_secs(30),
        }
    }
}

/// A relay as the mailer uses it: its name and URL, checked.
#[derive(Clone)]
pub struct Relay {
    /// Unique among the relays; safe to show (no credentials).
    pub name: String,
    /// The URL, credentials and all: never show it without [`redact_url`].
    pub url: String,
    /// Its TLS settings: its own, or `[smtp.tls]`'s.
    pub tls: TlsSettings,
    /// The settings key of [`Self::tls`] (`smtp.tls`, `smtp.relays[1].tls`),
    /// for messages.
    pub tls_key: String,
}

impl Relay {
    /// [`Self::tls`], loaded: what its TLS trusts.
    pub fn link_tls(&self) -> Result<LinkTls, SettingsError> {
        load_tls(&self.tls, &self.tls_key)
    }

    /// Checks that credentials can never go out unencrypted and that TLS
    /// files go with a URL that uses TLS; `Ok(Some(warning))` when mail
    /// to it may travel in clear (a relay on another host that is not
    /// required to encrypt).
    fn check_transport(&self) -> Result<Option<String>, SettingsError> {
        let invalid = |m: String| Err(SettingsError::Invalid(m));
        let Ok(url) = url::Url::parse(&self.url) else {
            return Ok(None);
        };
        let shown = redact_url(&self.url);
        let key = &self.tls_key;
        // A relay's own `tls` must be used; `[smtp.tls]` may be shared by
        // relays of which some do not use TLS (Settings checks that one does).
        let own = key != "smtp.tls";
        if url.scheme() == "file" {
            return Ok(None);
        }
        if self.tls.client_cert.is_some() || self.tls.client_key.is_some() {
            return invalid(format!(
                "{key}.client_cert: SMTP relays take no client certificate; authenticate with \
                 user:pass@ in the URL (over TLS)"
            ));
        }
        let tls = url
            .query_pairs()
            .find(|(k, _)| k == "tls")
            .map(|(_, v)| v.into_owned());
        let local = url.host_str().is_some_and(crate::tls::is_loopback);
        let credentials = url.password().is_some();
        if !url.username().is_empty() && !credentials {
            return invalid(format!(
                "{shown}: a user without a password; give both (user:pass@) or neither \
                 (no AUTH is done without a password)"
            ));
        }
        if let Some(other) = tls
            .as_deref()
            .filter(|t| !["required", "opportunistic", "none"].contains(t))
        {
            return invalid(format!(
                "{shown}: tls={other:?}; use tls=required, opportunistic or none"
            ));
        }
        match (url.scheme(), tls.as_deref()) {
            ("smtp", Some("none")) if credentials && !local => invalid(format!(
                "{shown}: tls=none with credentials would send the password unencrypted; use \
                 ?tls=required (STARTTLS) or smtps://, or drop the credentials (tls=none with \
                 credentials is allowed only for a relay on a loopback address)"
            )),
            ("smtp", Some("none")) if own => invalid(format!(
                "{key} is set but {shown} says tls=none; use ?tls=required or smtps://"
            )),
            ("smtp", Some("opportunistic")) if credentials => invalid(format!(
                "{shown}: tls=opportunistic with credentials would send the password in clear \
                 to anyone who strips STARTTLS from the relay's reply; credentials imply \
                 tls=required: drop ?tls=opportunistic, or use smtps://"
            )),
            ("smtp", Some("none")) if !local => Ok(Some(format!(
                "smtp relay {}: mail (and the codes in it) travels unencrypted: {shown} says \
                 tls=none; set ?tls=required or use smtps://",
                self.name
            ))),
            ("smtp", None | Some("opportunistic")) if !credentials && !local => Ok(Some(format!(
                "smtp relay {}: mail (and the codes in it) may travel unencrypted: \
                     {shown} encrypts only when the relay offers STARTTLS, which anyone on \
                     the path can strip; set ?tls=required or use smtps://",
                self.name
            ))),
            _ => Ok(None),
        }
    }
}

fn load_tls(tls: &TlsSettings, key: &str) -> Result<LinkTls, SettingsError> {
    tls.load(key)
        .map_err(|e| SettingsError::Invalid(e.to_string()))
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("name", &self.name)
            .field("url", &redact_url(&self.url))
            .field("tls", &self.tls)
            .finish()
    }
}

/// Most `[[smtp.relays]]`.
pub const MAX_RELAYS: usize = 16;

impl SmtpSettings {
    /// The relays in order of preference: `[[smtp.relays]]`, or those of
    /// `smtp.url` (named `host:port`; a `file://` URL, alone, is named
    /// `outbox`). Checks what [`Settings::validate`] checks for them.
    pub fn relay_list(&self) -> Result<Vec<Relay>, SettingsError> {
        let invalid = |m: String| Err(SettingsError::Invalid(m));
        match (self.url.is_empty(), self.relays.is_empty()) {
            (false, false) => {
                return invalid(
                    "smtp.url and [[smtp.relays]] are both set; smtp.url is the shorthand for \
                     one relay: list every relay under [[smtp.relays]] and remove smtp.url \
                     (and MAILGATE__SMTP__URL), or keep only smtp.url"
                        .into(),
                );
            }
            (true, true) => {
                return invalid(
                    "no SMTP relay: set smtp.url (MAILGATE__SMTP__URL) or list relays under \
                     [[smtp.relays]]"
                        .into(),
                );
            }
            (false, true) => {
                let urls = url_list(&self.url);
                if let [url] = urls[..] {
                    check_userinfo("smtp.url", url)?;
                    let name = if url.starts_with("file:") {
                        "outbox".to_owned()
                    } else {
                        relay_address(url).unwrap_or_else(|_| "smtp".to_owned())
                    };
                    return Ok(vec![Relay {
                        name,
                        url: url.to_owned(),
                        tls: self.tls.clone(),
                        tls_key: "smtp.tls".into(),
                    }]);
                }
                // Several URLs separated by commas: relays in order of
                // preference, named host:port (the way to keep every
                // relay's credentials in MAILGATE__SMTP__URL).
                if urls.len() > MAX_RELAYS {
                    return invalid(format!(
                        "smtp.url lists {} relays; at most {MAX_RELAYS}",
                        urls.len()
                    ));
                }
                let mut out: Vec<Relay> = Vec::with_capacity(urls.len());
                for url in urls {
                    check_userinfo("smtp.url", url)?;
                    let name = relay_address(url).map_err(|why| {
                        SettingsError::Invalid(format!("smtp.url {}: {why}", redact_url(url)))
                    })?;
                    if out.iter().any(|o| o.name == name) {
                        return invalid(format!(
                            "smtp.url lists {name} twice; to reach one host:port two ways, \
                             name each under [[smtp.relays]]"
                        ));
                    }
                    out.push(Relay {
                        name,
                        url: url.to_owned(),
                        tls: self.tls.clone(),
                        tls_key: "smtp.tls".into(),
                    });
                }
                return Ok(out);
            }
            (true, false) => {}
        }
        if self.relays.len() > MAX_RELAYS {
            return invalid(format!(
                "[[smtp.relays]] lists {} relays; at most {MAX_RELAYS}",
                self.relays.len()
            ));
        }
        let mut out: Vec<Relay> = Vec::with_capacity(self.relays.len());
        for (i, r) in self.relays.iter().enumerate() {
            let key = format!("smtp.relays[{i}].url");
            check_userinfo(&key, &r.url)?;
            let address = relay_address(&r.url).map_err(|why| {
                SettingsError::Invalid(format!("{key} {}: {why}", redact_url(&r.url)))
            })?;
            let name = match &r.name {
                None => address,
                Some(name) => {
                    let fit = !name.is_empty()
                        && name.len() <= 64
                        && name
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || "._-:[]".contains(c));
                    if !fit {
                        return invalid(format!(
                            "smtp.relays[{i}].name {name:?}: 1 to 64 characters of letters, \
                             digits and . _ - : [ ] (it is a metric label)"
                        ));
                    }
                    // A name is shown everywhere: never the relay's password.
                    let password = url::Url::parse(&r.url)
                        .ok()
                        .and_then(|u| u.password().map(str::to_owned))
                        .filter(|p| p.len() >= 3);
                    if password.is_some_and(|p| name.contains(&p)) {
                        return invalid(format!(
                            "smtp.relays[{i}].name holds the relay's password; names are \
                             shown in metrics, logs and /readyz"
                        ));
                    }
                    name.clone()
                }
            };
            if let Some(j) = out.iter().position(|o| o.name == name) {
                return invalid(format!(
                    "smtp.relays[{j}] and smtp.relays[{i}] are both named {name:?}; give each \
                     relay a name of its own (name = \"...\")"
                ));
            }
            let (tls, tls_key) = match &r.tls {
                Some(own) => (own.clone(), format!("smtp.relays[{i}].tls")),
                None => (self.tls.clone(), "smtp.tls".to_owned()),
            };
            out.push(Relay {
                name,
                url: r.url.clone(),
                tls,
                tls_key,
            });
        }
        Ok(out)
    }

    /// Checks the relays and the circuit settings.
    fn validate(&self) -> Result<(), SettingsError> {
        self.relay_list()?;
        let c = &self.circuit;
        if !(1..=1_000).contains(&c.failures) {
            return Err(SettingsError::Invalid(format!(
                "smtp.circuit.failures is {}; it must be 1 to 1000 (relay-level failures in a \
                 row that open a relay's circuit)",
                c.failures
            )));
        }
        let (min, max) = (Duration::from_millis(100), Duration::from_secs(3600));
        if !(min..=max).contains(&c.cool_down) {
            return Err(SettingsError::Invalid(format!(
                "smtp.circuit.cool_down is {}; it must be {} to {}",
                humantime::format_duration(c.cool_down),
                humantime::format_duration(min),
                humantime::format_duration(max),
            )));
        }
        Ok(())
    }
}

/// A relay URL's `host:port` (`[v6]:port`), with the scheme's default
/// port (25, 587 with `?tls=required`, 465 for `smtps://`), or why it is
/// not an SMTP relay URL. Never holds the credentials.
fn relay_address(url: &str) -> Result<String, String> {
    let parsed = url::Url::parse(url).map_err(|e| e.to_string())?;
    // The first tls= counts, as the mailer reads it.
    let required = parsed
        .query_pairs()
        .find(|(k, _)| k == "tls")
        .is_some_and(|(_, v)| v == "required");
    let default_port = match parsed.scheme() {
        "smtps" => 465,
        "smtp" if required => 587,
        "smtp" => 25,
        "file" => {
            return Err(
                "file:// cannot be one of several relays; use smtp.url = \"file://DIR\" alone"
                    .into(),
            );
        }
        other => return Err(format!("{other}:// is not smtp:// or smtps://")),
    };
    let port = parsed.port().unwrap_or(default_port);
    match parsed.host() {
        Some(url::Host::Ipv6(ip)) => Ok(format!("[{ip}]:{port}")),
        Some(host) => Ok(format!("{host}:{port}")),
        None => Err("no host".into()),
    }
}

fn default_pool_size() -> u32 {
    16
}
fn default_smtp_timeout() -> Duration {
    Duration::from_secs(10)
}

/// The HTTP endpoint for `/metrics`, `/healthz` and `/readyz`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpSettings {
    /// Address to listen on.
    pub listen: std::net::SocketAddr,
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            listen: std::net::SocketAddr::from(([127, 0, 0, 1], 9090)),
        }
    }
}

/// Where templates are and which locale is the last fallback.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TemplateSettings {
    /// `<dir>/<purpose>/<locale>/{subject.txt, body.txt, body.html}`.
    pub dir: std::path::PathBuf,
    /// Used when a job's locale (and its language) has no templates.
    pub default_locale: String,
}

impl Default for TemplateSettings {
    fn default() -> Self {
        Self {
            dir: "templates".into(),
            default_locale: "en".into(),
        }
    }
}

/// Retries of transient failures: exponential backoff with jitter, waiting
/// in RabbitMQ, up to `max_attempts` attempts in all.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetrySettings {
    /// Attempts in all, the first included.
    pub max_attempts: u32,
    /// The wait before the second attempt; it doubles each time.
    #[serde(deserialize_with = "human_duration")]
    pub initial: Duration,
    /// The longest wait.
    #[serde(deserialize_with = "human_duration")]
    pub max: Duration,
}

impl RetrySettings {
    /// The longest a job can spend waiting between its first and its last
    /// attempt: each retry waits at most twice its backoff (`initial`
    /// doubling, capped at `max`, plus up to as much again of jitter).
    pub fn horizon(&self) -> Duration {
        let mut wait = self.initial;
        let mut total = Duration::ZERO;
        for _ in 1..self.max_attempts {
            total = total.saturating_add(wait.min(self.max).saturating_mul(2));
            wait = wait.saturating_mul(2);
        }
        total
    }
}

impl Default for RetrySettings {
    fn default() -> Self {
        Self {
            max_attempts: 5,
            initial: Duration::from_secs(1),
            max: Duration::from_secs(300),
        }
    }
}

/// The worker's own behaviour.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkerSettings {
    /// On SIGTERM/SIGINT, how long jobs in flight may take to finish before
    /// the rest are handed back to RabbitMQ.
    #[serde(deserialize_with = "human_duration")]
    pub shutdown_timeout: Duration,
}

impl Default for WorkerSettings {
    fn default() -> Self {
        Self {
            shutdown_timeout: Duration::from_secs(30),
        }
    }
}

/// The longest `amqp.timeout`, `smtp.timeout` or `worker.shutdown_timeout`.
const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// Refuses a URL whose user or password holds a character that ends the
/// authority (`/`, `?`, `#`) or an `@` before the last one: URL parsers then
/// read part of the password as the host, port or path, and print it.
/// They must be percent-encoded. Refuses a control character anywhere: URL
/// parsers drop tabs and newlines, so what settings check (the scheme, a
/// fragment) and what a client uses would differ (found by review:
/// `am\tqps://` passed as plaintext and was used as TLS).
fn check_userinfo(key: &str, url: &str) -> Result<(), SettingsError> {
    if url.chars().any(char::is_control) {
        return Err(SettingsError::Invalid(format!(
            "{key} holds a control character (a tab, a newline…); write the URL on one line \
             without them"
        )));
    }
    let Some((_, rest)) = url.split_once("://") else {
        return Ok(());
    };
    let Some((userinfo, _)) = rest.rsplit_once('@') else {
        return Ok(());
    };
    if userinfo.contains(['/', '?', '#', '@']) {
        return Err(SettingsError::Invalid(format!(
            "{key} {}: its user or password holds '/', '?', '#' or '@'; percent-encode them \
             (%2F, %3F, %23, %40)",
            redact_url(url)
        )));
    }
    Ok(())
}

/// A URL with its password hidden, for logs and messages:
/// `scheme://user:***@host...`. Where a password cannot be told apart from
/// the rest (the URL does not parse, or its authority has no `@` but a `:`
/// followed by something that is not a port, as in a mistyped
/// `amqp://guest:secret127.0.0.1:5672`), the whole authority is hidden:
/// `scheme://***/...`.
/// A list of URLs (several nodes, separated by commas) is redacted URL by
/// URL.
pub fn redact_url(url: &str) -> String {
    url_list(url)
        .into_iter()
        .map(|url| hide_query_secrets(&redact_userinfo(url)))
        .collect::<Vec<_>>()
        .join(",")
}

/// The URLs of a comma-separated list, trimmed: it is split only at a comma
/// followed by another `scheme://`, so a comma inside a URL (in a password,
/// or between a cluster URL's hosts) stays where it is.
fn url_list(urls: &str) -> Vec<&str> {
    let starts_url = |s: &str| {
        s.trim_start().split_once("://").is_some_and(|(scheme, _)| {
            !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
        })
    };
    let mut list = Vec::new();
    let mut start = 0;
    for (i, _) in urls.match_indices(',') {
        if starts_url(&urls[i + 1..]) {
            list.push(urls[start..i].trim());
            start = i + 1;
        }
    }
    list.push(urls[start..].trim());
    list
}

/// The values of query parameters that carry credentials (`pass`,
/// `password`, `user`, `username`, as the redis crate reads them for socket
/// URLs), hidden.
fn hide_query_secrets(url: &str) -> String {
    let Some((head, query)) = url.split_once('?') else {
        return url.to_owned();
    };
    let (query, fragment) = match query.split_once('#') {
        Some((q, f)) => (q, Some(f)),
        None => (query, None),
    };
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((k, _))
                if [
                    "pass",
                    "password",
                    "user",
                    "username",
                    "sentinel_password",
                    "sentinel_username",
                ]
                .iter()
                .any(|s| k.eq_ignore_ascii_case(s)) =>
            {
                format!("{k}=***")
            }
            _ => pair.to_owned(),
        })
        .collect();
    let mut out = format!("{head}?{}", pairs.join("&"));
    if let Some(f) = fragment {
        out.push('#');
        out.push_str(f);
    }
    out
}

/// [`redact_url`]'s first step: the password in the userinfo.
fn redact_userinfo(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "***".to_owned();
    };
    // Everything up to the last '@' may be userinfo, even past a '/', '?'
    // or '#' (a password that holds one, not percent-encoded).
    let (userinfo, rest) = match rest.rsplit_once('@') {
        Some((userinfo, rest)) => (Some(userinfo), rest),
        None => (None, rest),
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let list = scheme.ends_with("+sentinel") || scheme.ends_with("+cluster");
    let hidden = || format!("{scheme}://***{tail}");
    if let Some(userinfo) = userinfo {
        // user[:password]@host: keep the user and the host.
        let user = userinfo.split(':').next().unwrap_or("");
        if !plain_host(authority, list) || user.contains(['/', '?', '#']) {
            return hidden();
        }
        return format!("{scheme}://{user}:***@{authority}{tail}");
    }
    if plain_host(authority, list) {
        url.to_owned()
    } else {
        hidden()
    }
}

/// Whether an authority without userinfo is just `host` or `host:port`
/// (an IPv6 host in brackets), or, with `list`, a comma-separated list of
/// them (a sentinel URL's), so it cannot hold a password.
fn plain_host(authority: &str, list: bool) -> bool {
    if list {
        authority.split(',').all(plain_host_one)
    } else {
        plain_host_one(authority)
    }
}

/// [`plain_host`] for one `host[:port]`.
fn plain_host_one(authority: &str) -> bool {
    let after_v6 = match authority.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((_, after)) => after,
            None => return false,
        },
        None => authority,
    };
    let host_end = if authority.starts_with('[') {
        authority.len() - after_v6.len()
    } else {
        0
    };
    let rest = &authority[host_end..];
    match rest.split_once(':') {
        None => true,
        Some((_, port)) => port.bytes().all(|b| b.is_ascii_digit()),
    }
}

/// Redis connection and key namespace.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSettings {
    /// `redis://host:port/db` (or `rediss://` for TLS); the primary that
    /// Redis Sentinel names, followed across failovers, as
    /// `redis+sentinel://[user:pass@]host:port,host:port,…/service[/db]`
    /// (or `rediss+sentinel://`); `memory://` keeps the limiter and the
    /// ledger in the worker's own memory (one worker, for trials: limits
    /// are not shared and nothing survives a restart). See [`RedisTarget`].
    pub url: String,
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

impl std::fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSettings")
            .field("url", &redact_url(&self.url))
            .field("key_prefix", &self.key_prefix)
            .field("allow_eviction", &self.allow_eviction)
            .field("min_replicas_acked", &self.min_replicas_acked)
            .field("replica_ack_timeout", &self.replica_ack_timeout)
            .field("max_clock_skew", &self.max_clock_skew)
            .field("tls", &self.tls)
            .finish()
    }
}

impl RedisSettings {
    /// Settings for the Redis at `url`, keys under `key_prefix`, the rest
    /// as a config file that names only these two gets them.
    pub fn new(url: impl Into<String>, key_prefix: impl Into<String>) -> Self {
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

    /// `url`, parsed: which kind of Redis it names. Errors name what is
    /// wrong (never the password).
    pub fn target(&self) -> Result<RedisTarget, String> {
        RedisTarget::parse(&self.url)
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

/// Where `redis.url` points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// The worker's own memory (`memory://`).
    Memory,
    /// One server, reached at a fixed address: the URL as the redis crate
    /// reads it (`redis://`, `rediss://`, `redis+unix://`, `unix://`).
    Server(String),
    /// The primary that a group of Redis Sentinels names.
    Sentinel(SentinelTarget),
    /// A Redis Cluster, found from any of its nodes.
    Cluster(ClusterTarget),
}

/// A `redis+cluster://` URL's parts.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterTarget {
    /// Nodes to learn the cluster's layout from (at least one; the port
    /// defaults to 6379).
    pub nodes: Vec<(String, u16)>,
    /// The nodes' user (ACL), percent-decoded.
    pub username: Option<String>,
    /// The nodes' password, percent-decoded.
    pub password: Option<String>,
    /// TLS to every node (`rediss+cluster://`).
    pub tls: bool,
}

impl std::fmt::Debug for ClusterTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterTarget")
            .field("nodes", &self.nodes)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("tls", &self.tls)
            .finish()
    }
}

/// A `redis+sentinel://` URL's parts.
#[derive(Clone, PartialEq, Eq)]
pub struct SentinelTarget {
    /// The Sentinels, in the order they are asked (at least one; the port
    /// defaults to 26379).
    pub sentinels: Vec<(String, u16)>,
    /// The name the Sentinels monitor the primary under.
    pub service: String,
    /// The database on the primary.
    pub db: i64,
    /// The primary's user (ACL), percent-decoded.
    pub username: Option<String>,
    /// The primary's password, percent-decoded.
    pub password: Option<String>,
    /// The Sentinels' own user (`?sentinel_username=`), if they have ACLs.
    pub sentinel_username: Option<String>,
    /// The Sentinels' own password (`?sentinel_password=`), if they ask for
    /// one (`requirepass` in sentinel.conf); none by default.
    pub sentinel_password: Option<String>,
    /// TLS to the Sentinels and the primary (`rediss+sentinel://`).
    pub tls: bool,
}

impl std::fmt::Debug for SentinelTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelTarget")
            .field("sentinels", &self.sentinels)
            .field("service", &self.service)
            .field("db", &self.db)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("sentinel_username", &self.sentinel_username)
            .field(
                "sentinel_password",
                &self.sentinel_password.as_ref().map(|_| "***"),
            )
            .field("tls", &self.tls)
            .finish()
    }
}

/// The port a Sentinel listens on unless the URL names another.
const SENTINEL_PORT: u16 = 26379;

impl RedisTarget {
    fn parse(url: &str) -> Result<Self, String> {
        if url.starts_with("memory:") {
            return Ok(RedisTarget::Memory);
        }
        let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
        let (sentinel, tls) = match scheme {
            "redis+sentinel" => (true, false),
            "rediss+sentinel" => (true, true),
            "redis+cluster" => (false, false),
            "rediss+cluster" => (false, true),
            _ => {
                return redis::Client::open(url)
                    .map(|_| RedisTarget::Server(url.to_owned()))
                    .map_err(|e| e.to_string().replace(url, &redact_url(url)));
            }
        };
        let decode = |s: &str, what: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8()
                .map(|s| s.into_owned())
                .map_err(|_| format!("its {what} is not UTF-8 once percent-decoded"))
        };
        // Everything up to the last '@' is userinfo, as in redact_url.
        let (userinfo, rest) = match rest.rsplit_once('@') {
            Some((u, r)) => (Some(u), r),
            None => (None, rest),
        };
        let (username, password) = match userinfo.map(|u| u.split_once(':').unwrap_or((u, ""))) {
            None => (None, None),
            Some((user, pass)) => (
                Some(decode(user, "user")?).filter(|u| !u.is_empty()),
                Some(decode(pass, "password")?).filter(|p| !p.is_empty()),
            ),
        };
        if rest.contains('#') {
            return Err(format!("a {scheme} URL takes no fragment"));
        }
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        // A Sentinel URL's query may give the Sentinels' own credentials.
        let (mut sentinel_username, mut sentinel_password) = (None, None);
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("sentinel_username", v)) if sentinel => {
                    sentinel_username = Some(decode(v, "sentinel_username")?);
                }
                Some(("sentinel_password", v)) if sentinel => {
                    sentinel_password = Some(decode(v, "sentinel_password")?);
                }
                _ => {
                    let name = pair.split('=').next().unwrap_or(pair);
                    return Err(format!(
                        "a {scheme} URL takes no query parameter {name:?}{}",
                        if sentinel {
                            " (only sentinel_username and sentinel_password)"
                        } else {
                            ""
                        }
                    ));
                }
            }
        }
        let (hosts, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (what, port) = if sentinel {
            ("sentinel", SENTINEL_PORT)
        } else {
            ("cluster node", 6379)
        };
        let hosts = hosts
            .split(',')
            .map(|h| list_address(h, port, what))
            .collect::<Result<Vec<_>, _>>()?;
        if !sentinel {
            if !path.is_empty() {
                return Err(
                    "a cluster has only database 0: redis+cluster://host:port,host:port".into(),
                );
            }
            return Ok(RedisTarget::Cluster(ClusterTarget {
                nodes: hosts,
                username,
                password,
                tls,
            }));
        }
        let mut path = path.split('/');
        let service = path.next().unwrap_or("");
        if service.is_empty() {
            return Err("it names no service: redis+sentinel://host:port,…/service[/db]".into());
        }
        let service = decode(service, "service name")?;
        let db = match path.next() {
            None | Some("") => 0,
            Some(db) => db
                .parse()
                .map_err(|_| format!("its database {db:?} is not a number"))?,
        };
        if path.next().is_some() {
            return Err("its path is /service or /service/db, nothing after".into());
        }
        Ok(RedisTarget::Sentinel(SentinelTarget {
            sentinels: hosts,
            service,
            db,
            username,
            password,
            sentinel_username,
            sentinel_password,
            tls,
        }))
    }
}

/// One `host[:port]` (`[v6]:port` for IPv6) of a sentinel or cluster URL
/// (`what` names which, `default_port` is used when it names none).
fn list_address(item: &str, default_port: u16, what: &str) -> Result<(String, u16), String> {
    let item = item.trim();
    let (host, port) = match item.strip_prefix('[') {
        Some(v6) => {
            let (host, after) = v6
                .split_once(']')
                .ok_or_else(|| format!("{what} {item:?} has no closing ']'"))?;
            (host, after.strip_prefix(':'))
        }
        None => match item.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (item, None),
        },
    };
    if host.is_empty() {
        return Err(format!(
            "a {what}'s host is empty ({item:?}); list them as host:port,host:port"
        ));
    }
    let v6 = item.starts_with('[');
    if !host
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-._".contains(c) || (v6 && ":%".contains(c)))
    {
        return Err(format!(
            "{what} {item:?} is not a host name or address; list them as host:port,host:port"
        ));
    }
    let port = match port {
        None => default_port,
        Some(p) => p
            .parse()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("{what} {item:?} has no valid port"))?,
    };
    Ok((host.to_owned(), port))
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

/// One sliding-window rule: at most `max` admissions in any window of length
/// `window`. Both are positive (checked when parsed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// The window length, at least 1 ms.
    pub window: Duration,
    /// How many admissions the window holds, at least 1.
    pub max: u32,
    /// Whether the rule rejects. A *shadow* rule (`enforce = false`) is
    /// judged over the same logs and never rejects: a request it would have
    /// rejected is counted (`mailgate_limiter_shadow_rejections_total`) and
    /// its result names the rule, so an operator can try a stricter limit
    /// before enforcing it.
    pub enforce: bool,
}

impl Rule {
    /// An enforced rule.
    pub fn new(window: Duration, max: u32) -> Self {
        Self {
            window,
            max,
            enforce: true,
        }
    }

    /// The window in whole milliseconds, as the limiter counts time.
    pub fn window_ms(&self) -> u64 {
        u64::try_from(self.window.as_millis()).unwrap_or(u64::MAX)
    }
}

impl<'de> Deserialize<'de> for Rule {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Wire {
            #[serde(deserialize_with = "human_duration")]
            window: Duration,
            max: u32,
            #[serde(default = "enforced")]
            enforce: bool,
        }
        fn enforced() -> bool {
            true
        }
        let w = Wire::deserialize(d)?;
        if w.window.as_millis() == 0 {
            return Err(serde::de::Error::custom("rule window must be at least 1ms"));
        }
        if w.max == 0 {
            return Err(serde::de::Error::custom(
                "rule max must be at least 1 (remove the scope's rules to disable it)",
            ));
        }
        Ok(Rule {
            window: w.window,
            max: w.max,
            enforce: w.enforce,
        })
    }
}

/// The rules of one scope; an empty list means the scope is not limited.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScopeRules {
    /// Checked together: a request must fit every rule.
    pub rules: Vec<Rule>,
}

impl ScopeRules {
    /// The longest window: a scope remembers an admission this long, and a
    /// minute more for a clock that steps back (`limiter::CLOCK_SLACK_MS`).
    pub fn longest_window(&self) -> Option<Duration> {
        self.rules.iter().map(|r| r.window).max()
    }
}

/// The rate-limit policy: rules per scope, how keys are formed, how long job
/// ids are remembered.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitSettings {
    /// Rules per normalized mailbox.
    pub email: ScopeRules,
    /// Rules per client network (see `ipv4_prefix`, `ipv6_prefix`).
    pub ip: ScopeRules,
    /// Rules per registrable domain of the mailbox (`example.co.uk` for
    /// `x@a.b.example.co.uk`): stops code farming through a catch-all
    /// domain, one mailbox per request. None by default here; the shipped
    /// `config/default.toml` turns it on.
    pub domain: DomainRules,
    /// Which spellings of a mailbox count as one.
    pub normalize: Normalization,
    /// IPv4 addresses are grouped by this many leading bits (32: one address).
    pub ipv4_prefix: u8,
    /// IPv6 addresses are grouped by this many leading bits (64: one subnet).
    pub ipv6_prefix: u8,
    /// How long a job id is remembered after its last change: within it an
    /// id is never mailed twice and is bound to what it was admitted for.
    /// Default 24 h; it must cover the send lease plus every retry's
    /// longest wait (checked at load).
    #[serde(deserialize_with = "human_duration")]
    pub dedup_for: Duration,
    /// Stricter (or looser) rules for some purposes, e.g.
    /// `[limits.purpose.reset_password.email]`. A purpose's requests are
    /// counted in the same logs as every other purpose's (a victim's inbox is
    /// one inbox), but judged by its own rules.
    pub purpose: std::collections::BTreeMap<String, PurposeLimits>,
    /// How long an admission owns its job's send. Another copy of the job
    /// (a redelivery after a crash, a producer's double publish) waits this
    /// long before it may send instead. Must exceed the SMTP send deadline,
    /// or a slow send and its retry could both deliver.
    #[serde(deserialize_with = "human_duration")]
    pub send_lease: Duration,
    /// Whether an older job for a mailbox is dropped once a newer one of
    /// the same purpose was admitted: the older, waiting to be retried,
    /// carries a stale code. It is answered `superseded` when it comes up
    /// for sending, never mailed, its quota refunded. For purposes without
    /// a `supersede` of their own; default false.
    pub supersede: bool,
    /// How far apart two jobs' made times (`created_at`, else the publish
    /// time) must be for the times to say which is the newer; closer, the
    /// later admission is. Producers' clocks disagree, and the AMQP
    /// timestamp has whole seconds. Default 2 s, at most an hour.
    #[serde(deserialize_with = "human_duration")]
    pub supersede_skew: Duration,
    /// What a result tells about the scopes its requester does not own
    /// (the mailbox's, the domain's): a rejection's `retry_after_ms` and a
    /// quota's `reset_ms` are rounded up to a multiple of this, so whoever
    /// asks cannot read to the millisecond when the mailbox's owner last
    /// did. Default 1 s; "0s" for exact; at most 1 h. The IP scope's (the
    /// requester's own network) stay exact, and so do the logs and `limits
    /// show`.
    #[serde(deserialize_with = "human_duration")]
    pub result_granularity: Duration,
    /// Whether a `sent` result's `quota` names the domain scope (how many
    /// more codes that domain's mailboxes may get now): off by default,
    /// since it tells a requester about other people's codes. `limits show
    /// --domain` always does.
    pub quota_domain: bool,
}

impl Default for LimitSettings {
    fn default() -> Self {
        let rules = |rs: &[(u64, u32)]| ScopeRules {
            rules: rs
                .iter()
                .map(|&(secs, max)| Rule::new(Duration::from_secs(secs), max))
                .collect(),
        };
        Self {
            email: rules(&[(60, 1), (3600, 5), (86_400, 10)]),
            ip: rules(&[(60, 5), (600, 30), (3600, 50)]),
            domain: DomainRules::default(),
            normalize: Normalization::default(),
            ipv4_prefix: 32,
            ipv6_prefix: 64,
            dedup_for: Duration::from_secs(24 * 3600),
            send_lease: Duration::from_secs(30),
            purpose: std::collections::BTreeMap::new(),
            supersede: false,
            supersede_skew: Duration::from_secs(2),
            result_granularity: Duration::from_secs(1),
            quota_domain: false,
        }
    }
}

/// One purpose's own rules; a scope left out keeps the defaults.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PurposeLimits {
    /// Rules per mailbox for this purpose.
    pub email: Option<ScopeRules>,
    /// Rules per client network for this purpose.
    pub ip: Option<ScopeRules>,
    /// Rules per registrable domain for this purpose.
    pub domain: Option<ScopeRules>,
    /// Whether this purpose's older jobs are superseded by newer ones
    /// (see [`LimitSettings::supersede`]); unset, the default's.
    pub supersede: Option<bool>,
}

impl PurposeLimits {
    /// The purpose's own rules of each scope, in [`SCOPES`] order.
    fn scopes(&self) -> [Option<&ScopeRules>; 3] {
        [self.email.as_ref(), self.ip.as_ref(), self.domain.as_ref()]
    }
}

/// The scopes, in the order they are judged, as the settings name them:
/// `limits.<scope>` and `limits.purpose.<name>.<scope>`.
pub const SCOPES: [&str; 3] = ["email", "ip", "domain"];

/// The domain scope's rules, the domains it does not count, and how much
/// of a domain's quota one client network may use.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DomainRules {
    /// Checked together: a request must fit every rule.
    pub rules: Vec<Rule>,
    /// Registrable domains the scope does not count: big mailbox providers
    /// (gmail.com, outlook.com, qq.com, …) legitimately carry more sign-ups
    /// than any one domain's rule allows. Their mailboxes and clients are
    /// still limited by the other scopes. Each entry must be a registrable
    /// domain itself (`gmail.com`, not `mail.gmail.com`).
    pub exempt: Vec<crate::domain::RegistrableDomain>,
    /// The share of each domain rule's max that one client network (an
    /// IPv4 /24, an IPv6 /48: see `limiter::share_network`) may use: a
    /// rule (W, N) also holds each network to `ceil(N × share)` per W.
    /// Whoever floods a domain with requests from one network can then use
    /// only that share of its quota, and needs `1 / share` networks to
    /// lock the domain's new sign-ups out. It never lets more through: the
    /// domain's own rule still counts every network. Default 0.2; 1 turns
    /// it off; greater than 0, at most 1.
    pub network_share: f64,
}

impl Default for DomainRules {
    fn default() -> Self {
        Self {
            rules: Vec::new(),
            exempt: Vec::new(),
            network_share: 0.2,
        }
    }
}

impl LimitSettings {
    /// Whether jobs of `purpose` are superseded by newer ones for the same
    /// mailbox (its own `supersede`, else `limits.supersede`).
    pub fn supersedes(&self, purpose: &str) -> bool {
        (self.purpose.get(purpose))
            .and_then(|p| p.supersede)
            .unwrap_or(self.supersede)
    }

    /// Whether any purpose's jobs are superseded.
    pub fn any_supersede(&self) -> bool {
        self.supersede || self.purpose.values().any(|p| p.supersede == Some(true))
    }

    /// The default rules of each scope, in [`SCOPES`] order.
    pub fn scope_rules(&self) -> [&[Rule]; 3] {
        [&self.email.rules, &self.ip.rules, &self.domain.rules]
    }

    /// Purpose `purpose`'s own rules of scope `scope` (an index into
    /// [`SCOPES`]), if it has them.
    pub fn purpose_rules(&self, purpose: &str, scope: usize) -> Option<&[Rule]> {
        let own = self.purpose.get(purpose)?.scopes();
        own.get(scope)
            .copied()
            .flatten()
            .map(|s| s.rules.as_slice())
    }

    /// Every rule list of scope `scope` (an index into [`SCOPES`]): the
    /// default, then each purpose's own.
    pub fn rule_lists(&self, scope: usize) -> impl Iterator<Item = &[Rule]> {
        let default = self.scope_rules().get(scope).copied().unwrap_or_default();
        std::iter::once(default).chain(self.purpose.values().filter_map(move |p| {
            p.scopes()
                .get(scope)
                .copied()
                .flatten()
                .map(|s| s.rules.as_slice())
        }))
    }

    /// The longest window of any rule in any scope or purpose (zero if there
    /// are none).
    pub fn longest_window(&self) -> Duration {
        (0..SCOPES.len())
            .flat_map(|scope| self.rule_lists(scope))
            .flatten()
            .map(|r| r.window)
            .max()
            .unwrap_or_default()
    }

    /// Checks what serde cannot see key by key.
    pub fn validate(&self) -> Result<(), SettingsError> {
        if self.purpose.len() > 100 {
            return Err(SettingsError::Invalid(
                "limits.purpose: at most 100 purposes may have rules of their own".into(),
            ));
        }
        for name in self.purpose.keys() {
            if crate::domain::Name::parse("purpose", name).is_err() {
                return Err(SettingsError::Invalid(format!(
                    "limits.purpose.{name}: purpose names hold only letters, digits, '-' and '_'"
                )));
            }
        }
        for (what, d) in std::iter::once(("limits.dedup_for", self.dedup_for))
            .chain(std::iter::once(("limits.send_lease", self.send_lease)))
            .chain(
                (0..SCOPES.len())
                    .flat_map(|scope| self.rule_lists(scope))
                    .flatten()
                    .map(|r| ("a rule window in limits", r.window)),
            )
        {
            if d > MAX_PERIOD {
                return Err(SettingsError::Invalid(format!(
                    "{what} is {}; the longest accepted is {}",
                    humantime::format_duration(d),
                    humantime::format_duration(MAX_PERIOD),
                )));
            }
        }
        let share = self.domain.network_share;
        if !(share > 0.0 && share <= 1.0) {
            return Err(SettingsError::Invalid(format!(
                "limits.domain.network_share is {share}; it must be greater than 0 and at most 1 (1: off)"
            )));
        }
        if self.ipv4_prefix > 32 {
            return Err(SettingsError::Invalid(
                "limits.ipv4_prefix must be at most 32".into(),
            ));
        }
        if self.ipv6_prefix > 128 {
            return Err(SettingsError::Invalid(
                "limits.ipv6_prefix must be at most 128".into(),
            ));
        }
        Ok(())
    }
}

/// Deserializes `"500ms"`, `"60s"`, `"10m"`, `"24h"`, `"1h 30m"`.
pub fn human_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    humantime::parse_duration(&s)
        .map_err(|e| serde::de::Error::custom(format!("bad duration {s:?}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(toml: &str) -> Result<LimitSettings, String> {
        let s: Result<LimitSettings, _> = config::Config::builder()
            .add_source(config::File::from_str(toml, config::FileFormat::Toml))
            .build()
            .and_then(|c| c.try_deserialize());
        let s = s.map_err(|e| e.to_string())?;
        s.validate().map_err(|e| e.to_string())?;
        Ok(s)
    }

    #[test]
    fn the_domain_scope_exempts_registrable_domains_only() {
        let l = limits(
            r#"domain.rules = [{ window = "10m", max = 50 }]
               domain.exempt = ["Gmail.com", "qq.com"]
               purpose.login.domain.rules = [{ window = "1m", max = 5 }]"#,
        )
        .unwrap();
        let exempt: Vec<&str> = l.domain.exempt.iter().map(|d| d.as_str()).collect();
        assert_eq!(exempt, ["gmail.com", "qq.com"]);
        assert_eq!(l.purpose_rules("login", 2).map(<[Rule]>::len), Some(1));
        assert_eq!(l.rule_lists(2).count(), 2, "the default and the purpose's");
        let err = limits(r#"domain.exempt = ["mail.gmail.com"]"#).unwrap_err();
        assert!(
            err.contains(r#""mail.gmail.com" is not a registrable domain"#)
                && err.contains(r#"counted as "gmail.com""#),
            "{err}"
        );
        assert_eq!(l.domain.network_share, 0.2, "the default share");
        for bad in ["0", "-0.5", "1.5", "nan"] {
            let err = limits(&format!("domain.network_share = {bad}")).unwrap_err();
            assert!(err.contains("limits.domain.network_share"), "{bad}: {err}");
        }
        let off = limits("domain.network_share = 1").expect("1 turns it off");
        assert_eq!(off.domain.network_share, 1.0);
    }

    #[test]
    fn durations_are_human() {
        let l = limits(
            r#"email.rules = [{ window = "500ms", max = 1 }, { window = "10m", max = 2 }, { window = "24h", max = 3 }]"#,
        )
        .unwrap();
        let w: Vec<u64> = l.email.rules.iter().map(Rule::window_ms).collect();
        assert_eq!(w, [500, 600_000, 86_400_000]);
        assert_eq!(l.dedup_for, Duration::from_secs(86_400), "24 h by default");
    }

    #[test]
    fn defaults_are_the_documented_policy() {
        let l = LimitSettings::default();
        let r = |s: &ScopeRules| -> Vec<(u64, u32)> {
            s.rules.iter().map(|r| (r.window_ms(), r.max)).collect()
        };
        assert_eq!(r(&l.email), [(60_000, 1), (3_600_000, 5), (86_400_000, 10)]);
        assert_eq!(r(&l.ip), [(60_000, 5), (600_000, 30), (3_600_000, 50)]);
    }

    #[test]
    fn a_list_of_urls_is_split_at_each_next_url_and_redacted_url_by_url() {
        let amqp = |url: &str| AmqpSettings {
            url: url.into(),
            ..shipped().amqp
        };
        let list = "amqp://u:p1@n1:5672/%2f, amqp://u:p,2@n2:5673/%2f,amqps://n3/v";
        assert_eq!(
            amqp(list).urls(),
            [
                "amqp://u:p1@n1:5672/%2f",
                "amqp://u:p,2@n2:5673/%2f",
                "amqps://n3/v"
            ]
        );
        assert_eq!(
            redact_url(list),
            "amqp://u:***@n1:5672/%2f,amqp://u:***@n2:5673/%2f,amqps://n3/v"
        );
        assert_eq!(amqp("amqp://n1/%2f").urls(), ["amqp://n1/%2f"]);
        // A comma not followed by a URL stays: one URL, which does not parse.
        assert_eq!(amqp("amqp://n1,n2/%2f").urls(), ["amqp://n1,n2/%2f"]);
        let mut s = shipped();
        s.amqp.url = "amqp://u:SEKRET@n1/%2f,amqp://u:SEKRET@n2:x/%2f".into();
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("amqp.url") && !e.contains("SEKRET"), "{e}");
        s.amqp.url = list.replace("amqps://", "amqp://");
        s.validate().expect("a list of nodes");
        // Both schemes: a reset of the TLS node would move the worker onto
        // an unencrypted one.
        s.amqp.url = list.into();
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("amqps:// and amqp://"), "{e}");
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact_url("amqp://guest:secret@mq:5672/%2f"),
            "amqp://guest:***@mq:5672/%2f"
        );
        assert_eq!(
            redact_url("redis://127.0.0.1:6379/0"),
            "redis://127.0.0.1:6379/0"
        );
        // No '@': the password runs into the host; the authority is hidden.
        assert_eq!(
            redact_url("amqp://guest:S3cretPw127.0.0.1:5672/%2f"),
            "amqp://***/%2f"
        );
        assert_eq!(redact_url("S3cret"), "***");
        assert_eq!(redact_url("redis://[::1]:6379/0"), "redis://[::1]:6379/0");
        assert_eq!(
            redact_url("smtp://u:p%40ss@mail.example.com?tls=required"),
            "smtp://u:***@mail.example.com?tls=required"
        );
        // A password holding '/', '?', '#' or '@' (not percent-encoded).
        for (url, shown) in [
            (
                "amqp://guest:Xk9p/Qr7sLm2@127.0.0.1:5672/%2f",
                "amqp://guest:***@127.0.0.1:5672/%2f",
            ),
            (
                "redis://:Xk9p?Qr7sLm2@127.0.0.1:6379/0",
                "redis://:***@127.0.0.1:6379/0",
            ),
            (
                "smtp://user:8462/Qr#7@s@127.0.0.1:2525",
                "smtp://user:***@127.0.0.1:2525",
            ),
        ] {
            assert_eq!(redact_url(url), shown);
        }
        // Credentials in the query, as the redis crate reads them for sockets.
        assert_eq!(
            redact_url("redis+unix:///tmp/x.sock?db=1&user=u&pass=SEKRET1"),
            "redis+unix:///tmp/x.sock?db=1&user=***&pass=***"
        );
        // A URL without a scheme is hidden whole, and so is its parse error.
        let mut s = shipped();
        s.amqp.url = "guest:SEKRET@127.0.0.1:5672".into();
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("amqp.url") && !e.contains("SEKRET"), "{e}");
    }

    #[test]
    fn a_password_that_breaks_its_url_is_refused_without_showing_it() {
        let mut s = shipped();
        s.smtp.url = "smtp://user:8462/Qr7sLm2@127.0.0.1:2525".into();
        let e = s.validate().unwrap_err().to_string();
        assert!(
            e.contains("smtp.url") && e.contains("percent-encode"),
            "{e}"
        );
        assert!(!e.contains("Qr7sLm2") && !e.contains("8462"), "{e}");
        s.smtp.url = "smtp://user:8462%2FQr7sLm2@127.0.0.1:2525".into();
        s.validate().expect("percent-encoded");
    }

    #[test]
    fn a_sentinel_url_names_its_sentinels_service_db_and_credentials() {
        let target = |url: &str| RedisTarget::parse(url);
        assert_eq!(
            target("redis+sentinel://u:p%40ss@s1:26380,[::1],s3/mymaster/2"),
            Ok(RedisTarget::Sentinel(SentinelTarget {
                sentinels: vec![
                    ("s1".into(), 26380),
                    ("::1".into(), 26379),
                    ("s3".into(), 26379)
                ],
                service: "mymaster".into(),
                db: 2,
                username: Some("u".into()),
                password: Some("p@ss".into()),
                sentinel_username: None,
                sentinel_password: None,
                tls: false,
            }))
        );
        let Ok(RedisTarget::Sentinel(t)) =
            target("redis+sentinel://s1/m?sentinel_username=sv&sentinel_password=Zq%26x81Lm")
        else {
            panic!("Sentinel credentials");
        };
        assert_eq!(
            (
                t.sentinel_username.as_deref(),
                t.sentinel_password.as_deref()
            ),
            (Some("sv"), Some("Zq&x81Lm"))
        );
        assert!(!format!("{t:?}").contains("Zq&x81Lm"));
        assert_eq!(
            redact_url("redis+sentinel://s1/m?sentinel_password=Zq%26x81Lm"),
            "redis+sentinel://s1/m?sentinel_password=***"
        );
        let Ok(RedisTarget::Sentinel(t)) = target("rediss+sentinel://:pw@s1/main") else {
            panic!("a TLS sentinel URL");
        };
        assert!(t.tls && t.db == 0 && t.username.is_none());
        assert_eq!(t.password.as_deref(), Some("pw"));
        assert!(!format!("{t:?}").contains("pw"));
        assert_eq!(
            target("redis://127.0.0.1:6379/0"),
            Ok(RedisTarget::Server("redis://127.0.0.1:6379/0".into()))
        );
        assert_eq!(target("memory://"), Ok(RedisTarget::Memory));
        for (url, says) in [
            ("redis+sentinel://s1:26379", "no service"),
            ("redis+sentinel://s1:26379/", "no service"),
            ("redis+sentinel://s1:x/m", "no valid port"),
            ("redis+sentinel://s1,,s2/m", "host is empty"),
            ("redis+sentinel://s1/m/zero", "not a number"),
            ("redis+sentinel://s1/m/0/x", "nothing after"),
            ("redis+sentinel://s1/m?db=1", "no query parameter \"db\""),
            (
                "redis+cluster://n1?sentinel_password=x",
                "no query parameter",
            ),
            ("redis+sentinel://s1/m#x", "no fragment"),
        ] {
            let e = target(url).expect_err(url);
            assert!(e.contains(says), "{url}: {e}");
        }
        // Redacted with its hosts shown.
        assert_eq!(
            redact_url("redis+sentinel://u:Xk9p7sLm2@s1:26379,s2:26379/mymaster"),
            "redis+sentinel://u:***@s1:26379,s2:26379/mymaster"
        );
        let mut s = shipped();
        s.redis.url = "redis+sentinel://:Xk9p7sLm2@s1:x/m".into();
        let e = s.validate().unwrap_err().to_string();
        assert!(
            e.contains("redis.url") && e.contains("no valid port"),
            "{e}"
        );
        assert!(!e.contains("Xk9p7sLm2"), "{e}");
    }

    #[test]
    fn a_cluster_url_names_its_nodes_and_its_prefix_chooses_one_slot_or_every_shard() {
        assert_eq!(
            RedisTarget::parse("redis+cluster://:p%2Cw@n1:7000,n2,[::1]:7002"),
            Ok(RedisTarget::Cluster(ClusterTarget {
                nodes: vec![
                    ("n1".into(), 7000),
                    ("n2".into(), 6379),
                    ("::1".into(), 7002)
                ],
                username: None,
                password: Some("p,w".into()),
                tls: false,
            }))
        );
        let e = RedisTarget::parse("redis+cluster://n1:7000/1").unwrap_err();
        assert!(e.contains("only database 0"), "{e}");
        assert_eq!(
            redact_url("rediss+cluster://u:Xk9p7sLm2@n1:7000,n2:7001"),
            "rediss+cluster://u:***@n1:7000,n2:7001"
        );
        let mut s = shipped();
        s.redis.url = "redis+cluster://n1:7000,n2:7001".into();
        for tagged in ["{mailgate}:", "mg:{a}:"] {
            s.redis.key_prefix = tagged.into();
            s.validate().expect(tagged);
            assert!(
                !s.redis.spreads_keys(),
                "{tagged} keeps every key in one slot"
            );
        }
        for untagged in ["mailgate:", "mg:{}:", "mg:{:", "mg:}{"] {
            s.redis.key_prefix = untagged.into();
            s.validate().expect(untagged);
            assert!(s.redis.spreads_keys(), "{untagged} spreads the keys");
        }
        s.redis.url = "redis://n1:7000".into();
        assert!(
            !s.redis.spreads_keys(),
            "one server has nothing to spread over"
        );
        s.redis.url = "redis+cluster://n1:7000,n2:7001".into();
        s.redis.min_replicas_acked = 1;
        s.validate()
            .expect("a cluster's primaries have replicas too");
        // Superseding judges a job and its newer one in one call: one slot.
        s.limits.purpose.insert(
            "login".into(),
            PurposeLimits {
                supersede: Some(true),
                ..PurposeLimits::default()
            },
        );
        let e = s.validate().unwrap_err().to_string();
        assert!(
            e.contains("limits.supersede") && e.contains("hash tag"),
            "{e}"
        );
        s.redis.key_prefix = "{mailgate}:".into();
        s.validate().expect("one slot supersedes");
    }

    #[test]
    fn waiting_for_replicas_needs_replicas_and_room_in_the_lease() {
        let mut s = shipped();
        s.redis.min_replicas_acked = 1;
        s.validate().expect("30s lease, 10s SMTP, 1s WAIT");
        s.redis.replica_ack_timeout = Duration::from_secs(16);
        let e = s.validate().unwrap_err().to_string();
        assert!(
            e.contains("redis.replica_ack_timeout") && e.contains("send_lease"),
            "{e}"
        );
        s.redis.replica_ack_timeout = Duration::from_secs(1);
        s.redis.url = "memory://".into();
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("min_replicas_acked"), "{e}");
    }

    /// A shutdown that cannot wait for a send under way says so (found by
    /// review: 1 s against the shipped 10 s passed as "settings: ok").
    #[test]
    fn a_shutdown_shorter_than_a_send_is_warned_of() {
        let mut s = shipped();
        assert!(s.warnings().is_empty(), "{:?}", s.warnings());
        s.worker.shutdown_timeout = Duration::from_secs(1);
        let w = s.warnings();
        assert!(
            w.len() == 1 && w[0].contains("worker.shutdown_timeout (1s)") && w[0].contains("12s"),
            "{w:?}"
        );
    }

    #[test]
    fn timeouts_are_bounded() {
        for (set, key) in [
            (
                (|s: &mut Settings, d| s.worker.shutdown_timeout = d)
                    as fn(&mut Settings, Duration),
                "worker.shutdown_timeout",
            ),
            (|s, d| s.amqp.timeout = d, "amqp.timeout"),
            (|s, d| s.smtp.timeout = d, "smtp.timeout"),
            (
                |s, d| s.redis.replica_ack_timeout = d,
                "redis.replica_ack_timeout",
            ),
            (|s, d| s.redis.max_clock_skew = d, "redis.max_clock_skew"),
        ] {
            let mut s = shipped();
            set(&mut s, Duration::from_secs(u64::MAX / 4));
            let e = s.validate().unwrap_err().to_string();
            assert!(e.contains(key) && e.contains("must be"), "{e}");
            let mut s = shipped();
            set(&mut s, Duration::ZERO);
            assert!(s.validate().unwrap_err().to_string().contains(key));
        }
    }

    proptest::proptest! {
        /// However a URL is shaped, its printed form never shows the password.
        #[test]
        fn no_printed_url_shows_its_password(
            scheme in "(amqp|amqps|redis|rediss|redis\\+sentinel|redis\\+cluster|smtp|smtps|x)",
            user in "[a-zA-Z0-9._~%!$&'()*+,;=-]{0,12}",
            password in "[a-zA-Z0-9._~%!$&'()*+,;=:/?#@-]{5,24}[a-zA-Z._~%!$&'()*+,;=/?#-]",
            host in "[a-z0-9.-]{0,12}",
            port in proptest::option::of(0u32..70000),
            tail in "[a-zA-Z0-9/%?=&#@:._-]{0,20}",
            at in proptest::bool::ANY,
        ) {
            let port = port.map(|p| format!(":{p}")).unwrap_or_default();
            let sep = if at { "@" } else { "" };
            let url = format!("{scheme}://{user}:{password}{sep}{host}{port}{tail}");
            let shown = redact_url(&url);
            // A password is a secret only where it could be one: at least
            // six characters not all found elsewhere in the URL by chance.
            let elsewhere = format!("{scheme}://{user}:{sep}{host}{port}{tail}");
            proptest::prop_assume!(!elsewhere.contains(&password));
            // Without an '@', a "password" holding '/', '?' or '#' is a
            // host, port and path by the URL's own syntax (`amqp://guest:5/x`
            // is host guest, port 5, vhost x): nothing marks it secret.
            proptest::prop_assume!(at || !password.contains(['/', '?', '#', '@']));
            // Nor is one holding ',' in a Sentinel or cluster URL: the next
            // host.
            proptest::prop_assume!(at || !scheme.contains('+') || !password.contains(','));
            proptest::prop_assert!(!shown.contains(&password), "{url} -> {shown}");
        }
    }

    /// `config/default.toml`, without environment overrides.
    fn shipped() -> Settings {
        config::Config::builder()
            .add_source(config::File::from(std::path::Path::new(
                "config/default.toml",
            )))
            .build()
            .and_then(|c| c.try_deserialize())
            .expect("the shipped config")
    }

    #[test]
    fn dedup_for_must_outlast_a_job_being_retried() {
        let mut s = shipped();
        s.validate().expect("the shipped config is valid");
        // 5 attempts: waits of at most 2 × (1 + 2 + 4 + 8) s, plus a 30 s lease.
        assert_eq!(s.retry.horizon(), Duration::from_secs(30));
        s.limits.dedup_for = Duration::from_secs(59);
        let err = s
            .validate()
            .expect_err("shorter than the lease plus the retries");
        assert!(err.to_string().contains("limits.dedup_for"), "{err}");
        s.limits.dedup_for = Duration::from_secs(60);
        s.validate().expect("exactly enough");
    }

    #[test]
    fn queue_names_that_would_crash_or_loop_are_refused() {
        let refused = |tweak: &dyn Fn(&mut Settings), says: &str| {
            let mut s = shipped();
            tweak(&mut s);
            let err = s.validate().expect_err(says).to_string();
            assert!(err.contains(says), "{err}");
        };
        refused(
            &|s| s.amqp.jobs_queue = "j".repeat(249),
            "amqp.jobs_queue is 249 bytes",
        );
        refused(&|s| s.amqp.jobs_queue = "amq.jobs".into(), "reserved");
        refused(&|s| s.amqp.results_queue = "r".repeat(256), "at most 255");
        refused(
            &|s| s.retry.max_attempts = 1_000_000,
            "retry.max_attempts is 1000000",
        );
        refused(
            &|s| s.amqp.results_queue = s.amqp.jobs_queue.clone(),
            "amqp.results_queue",
        );
        refused(
            &|s| s.amqp.results_queue = format!("{}.retry.2", s.amqp.jobs_queue),
            "amqp.results_queue",
        );
        refused(
            &|s| s.amqp.results_queue = format!("{}.wait", s.amqp.jobs_queue),
            "amqp.results_queue",
        );
        refused(
            &|s| s.amqp.results_queue = format!("{}.wait.250", s.amqp.jobs_queue),
            "amqp.results_queue",
        );
        // The lease decides the longest wait queue's name.
        refused(
            &|s| {
                s.amqp.jobs_queue = "j".repeat(244);
                s.limits.send_lease = Duration::from_secs(3600);
                s.limits.dedup_for = Duration::from_secs(86_400);
            },
            "j.wait.4096000",
        );
        let mut s = shipped();
        s.amqp.jobs_queue = "j".repeat(240);
        s.validate().expect("240 bytes leave room for '.retry.4'");
    }

    #[test]
    fn periods_longer_than_a_year_are_refused() {
        assert!(limits(r#"email.rules = [{ window = "1000000000years", max = 1 }]"#).is_err());
        let err = limits(r#"email.rules = [{ window = "400days", max = 1 }]"#).unwrap_err();
        assert!(
            err.contains("rule window") && err.contains("longest accepted"),
            "{err}"
        );
        assert!(limits(r#"dedup_for = "2years""#).is_err());
        assert!(
            limits(
                r#"email.rules = [{ window = "365days", max = 1 }]
            dedup_for = "366days""#
            )
            .is_ok()
        );
    }

    #[test]
    fn bad_values_are_refused() {
        assert!(limits(r#"email.rules = [{ window = "0s", max = 1 }]"#).is_err());
        assert!(limits(r#"email.rules = [{ window = "1s", max = 0 }]"#).is_err());
        assert!(limits(r#"email.rules = [{ window = "soon", max = 1 }]"#).is_err());
        assert!(limits(r#"email.rules = [{ window = "1s", max = 1, burst = 2 }]"#).is_err());
        assert!(limits(r#"ipv4_prefix = 33"#).is_err());
        assert!(limits(r#"dedup_for = "48h""#).is_ok());
    }

    #[test]
    fn an_ipv6_amqp_host_is_refused_not_read_as_localhost() {
        let mut s = Settings::load(std::path::Path::new("config/default.toml")).unwrap();
        s.amqp.url = "amqp://u:SEKRET@[2001:db8::7]:5673/%2f".into();
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("IPv6") && !e.contains("SEKRET"), "{e}");
        s.amqp.url = "amqp://u:p@rabbit.internal:5673/%2f".into();
        s.validate().unwrap();
    }
}
