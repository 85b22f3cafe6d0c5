//! Settings: the TOML file given by `--config` (default `config/default.toml`),
//! overridden by environment variables `MAILGATE__SECTION__KEY`.
//!
//! Everything is checked while loading, so a typo or an impossible value stops
//! the process at start-up with a message naming the key, never later. Each
//! section lives in a file of its own and checks itself; [`Settings::validate`]
//! adds only the rules that cross sections.

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use crate::redact::redact_url;
use crate::tls::{LinkTls, TlsSettings};

/// `as_str`, `From<String>` and `From<&str>` (through [`SecretUrl`]),
/// `Deref` and `AsRef` to the URL itself, and a redacted `Debug` and
/// `Display`: the parts every URL setting parsed when it is set shares
/// (its `url: SecretUrl` field, and a `From<SecretUrl>` of its own).
macro_rules! url_type {
    ($ty:ty) => {
        impl $ty {
            /// The URL itself, credentials and all: never for showing
            /// (its `Display` is redacted).
            pub fn as_str(&self) -> &str {
                self.url.as_str()
            }
        }

        impl From<String> for $ty {
            fn from(url: String) -> Self {
                crate::redact::SecretUrl::from(url).into()
            }
        }

        impl From<&str> for $ty {
            fn from(url: &str) -> Self {
                crate::redact::SecretUrl::from(url).into()
            }
        }

        impl std::ops::Deref for $ty {
            type Target = str;

            fn deref(&self) -> &str {
                self.url.as_str()
            }
        }

        impl AsRef<str> for $ty {
            fn as_ref(&self) -> &str {
                self.url.as_str()
            }
        }

        impl std::fmt::Debug for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                std::fmt::Debug::fmt(&self.url, f)
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                std::fmt::Display::fmt(&self.url, f)
            }
        }
    };
}

mod amqp;
mod limits;
mod redis;
mod redis_url;
mod relay;
mod smtp;
#[cfg(test)]
mod tests;
mod worker;

pub use self::amqp::{AmqpSettings, Lane, QueueType};
pub use self::limits::{DomainRules, LimitSettings, PurposeLimits, Rule, ScopeRules};
pub use self::redis::RedisSettings;
pub use self::redis_url::{ClusterTarget, RedisTarget, RedisUrl, SentinelTarget};
pub use self::relay::{Credentials, Destination, RelayUrl, RelayUrls, SmtpServer, TlsMode};
pub use self::smtp::{CircuitSettings, MAX_RELAYS, Relay, RelaySettings, SmtpSettings};
pub use self::worker::{
    HttpSettings, RetrySettings, TelemetrySettings, TemplateSettings, WorkerSettings,
};

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

/// Why settings could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// The file is missing, is not TOML, or a key is unknown or of the
    /// wrong type (the source says which).
    #[error("cannot load settings")]
    Load(#[from] config::ConfigError),
    /// The values parse but make no sense together.
    #[error("invalid settings: {0}")]
    Invalid(String),
}

impl SettingsError {
    /// The environment variable whose value this error is about, if one
    /// set it: the key an error names (`for key `limits.dedup_for``, or
    /// `redis.url …` at the start of a check's message) whose
    /// `MAILGATE__SECTION__KEY` is set, or the variable of an unknown key
    /// (`unknown field `pasword``) that only the environment holds. So the
    /// error is blamed on its source, not on the settings file.
    pub fn env_source(&self) -> Option<String> {
        let text = crate::report::one_line(self);
        let quoted = |after: &str| {
            let (_, rest) = text.split_once(after)?;
            rest.split_once('`').map(|(name, _)| name.to_owned())
        };
        if let Some(field) = quoted("unknown field `") {
            // The variable that names it, as its key or as a section.
            let field = field.to_ascii_uppercase();
            return std::env::vars_os()
                .filter_map(|(k, _)| k.into_string().ok())
                .find(|k| {
                    k.strip_prefix("MAILGATE__")
                        .is_some_and(|rest| rest.split("__").any(|part| part == field))
                });
        }
        let is_key = |w: &&str| {
            w.contains('.')
                && w.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._".contains(&b))
        };
        let key = quoted("for key `").or_else(|| {
            let message = text.strip_prefix("invalid settings: ")?;
            let first = message.split([' ', ':']).next()?;
            Some(first).filter(is_key).map(str::to_owned)
        })?;
        let var = format!("MAILGATE__{}", key.replace('.', "__").to_ascii_uppercase());
        std::env::var_os(&var).map(|_| var)
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
    /// answered "delivery unknown". Shown by `check-config` and logged at
    /// start-up.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = self.smtp.warnings();
        warnings.extend(unread_variables());
        let replicated = matches!(
            self.redis.target(),
            Ok(RedisTarget::Sentinel(_) | RedisTarget::Cluster(_))
        );
        if replicated && self.redis.min_replicas_acked == 0 {
            warnings.push(
                "redis.min_replicas_acked is 0 with replicas that can be promoted (Sentinel or \
                 Cluster): a failover can lose send marks and admissions, so a job sent just \
                 before it can be mailed again and a mailbox get more mail than its rules \
                 allow; set it to 1 (behind Sentinel, every replica it could promote is then \
                 waited for)"
                    .to_owned(),
            );
        }
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

    /// Checks what serde cannot see key by key: each section on its own,
    /// then the rules that cross sections. Every section's bounds are
    /// checked before the cross-section sums, so those cannot overflow.
    pub fn validate(&self) -> Result<(), SettingsError> {
        self.limits.validate()?;
        self.telemetry.validate()?;
        self.retry.validate()?;
        self.amqp.validate()?;
        // The queue names derive from the retries and the lease.
        self.amqp
            .check_queues(self.retry.max_attempts, self.wait_bands_ms())?;
        self.redis.validate()?;
        self.smtp.validate()?;
        self.worker.validate()?;
        self.check_across()
    }

    /// The rules that cross sections: superseding needs one Redis slot, and
    /// job records and send leases outlast what they guard.
    fn check_across(&self) -> Result<(), SettingsError> {
        let invalid = |m: String| Err(SettingsError::Invalid(m));
        if self.limits.any_supersede() && self.redis.spreads_keys() {
            return invalid(
                "limits.supersede needs every key of mailgate's in one slot of the Redis \
                 Cluster: give redis.key_prefix a hash tag (e.g. \"{mailgate}:\"); with the \
                 keys spread over the shards a job and the newer job that supersedes it are \
                 judged on different shards"
                    .into(),
            );
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

/// The longest `amqp.timeout`, `smtp.timeout` or `worker.shutdown_timeout`.
/// Upper bounds keep every deadline computable (an `Instant` plus a
/// timeout that overflows panics) and meaningful.
const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// Refuses a duration of `key` outside `min..=max`.
fn check_bounds(
    key: &str,
    value: Duration,
    min: Duration,
    max: Duration,
) -> Result<(), SettingsError> {
    if (min..=max).contains(&value) {
        return Ok(());
    }
    Err(SettingsError::Invalid(format!(
        "{key} is {}; it must be {} to {}",
        humantime::format_duration(value),
        humantime::format_duration(min),
        humantime::format_duration(max),
    )))
}

/// Refuses a URL whose user or password holds a character that ends the
/// authority (`/`, `?`, `#`) or an `@` before the last one: URL parsers then
/// read part of the password as the host, port or path, and print it.
/// They must be percent-encoded. Refuses a control character anywhere: URL
/// parsers drop tabs and newlines, so what settings check (the scheme, a
/// fragment) and what a client uses would differ (`am\tqps://` would pass
/// as plaintext and be used as TLS).
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

/// A link's TLS settings, loaded; an error names the settings `key`.
fn load_tls(tls: &TlsSettings, key: &str) -> Result<LinkTls, SettingsError> {
    tls.load(key)
        .map_err(|e| SettingsError::Invalid(crate::report::one_line(&e)))
}

/// A warning for each environment variable that looks meant to set a key
/// but is not read: `MAILGATE_AMQP__URL`, with one underscore after
/// `MAILGATE` (settings are `MAILGATE__SECTION__KEY`).
fn unread_variables() -> Vec<String> {
    std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .filter(|k| !k.starts_with("MAILGATE__"))
        .filter_map(|k| Some((k.strip_prefix("MAILGATE_")?.to_owned(), k)))
        .filter(|(rest, _)| rest.contains("__"))
        .map(|(rest, k)| {
            format!("{k} is not read: a setting is MAILGATE__SECTION__KEY (two underscores after MAILGATE, as in MAILGATE__{rest})")
        })
        .collect()
}

/// Deserializes `"500ms"`, `"60s"`, `"10m"`, `"24h"`, `"1h 30m"`.
pub fn human_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    humantime::parse_duration(&s)
        .map_err(|e| serde::de::Error::custom(format!("bad duration {s:?}: {e}")))
}
