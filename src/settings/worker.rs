//! The small sections about the worker process itself: `[http]`,
//! `[templates]`, `[retry]`, `[worker]` and `[telemetry]`.

use std::time::Duration;

use serde::Deserialize;

use super::{MAX_ATTEMPTS, MAX_TIMEOUT, SettingsError, check_bounds, human_duration};
use crate::redact::redact_url;

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

impl RetrySettings {
    /// Checks the section on its own: 1 to [`MAX_ATTEMPTS`] attempts, and
    /// a longest wait no shorter than the first.
    pub(super) fn validate(&self) -> Result<(), SettingsError> {
        if self.max_attempts == 0 || self.max_attempts > MAX_ATTEMPTS {
            return Err(SettingsError::Invalid(format!(
                "retry.max_attempts is {}; it must be 1 to {MAX_ATTEMPTS} (each attempt after \
                 the first has a retry queue of its own)",
                self.max_attempts
            )));
        }
        if self.max < self.initial {
            return Err(SettingsError::Invalid(
                "retry.max must be at least retry.initial".into(),
            ));
        }
        Ok(())
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

impl WorkerSettings {
    /// Checks the section on its own: a bounded shutdown timeout.
    pub(super) fn validate(&self) -> Result<(), SettingsError> {
        check_bounds(
            "worker.shutdown_timeout",
            self.shutdown_timeout,
            Duration::from_millis(100),
            MAX_TIMEOUT,
        )
    }
}

impl Default for WorkerSettings {
    fn default() -> Self {
        Self {
            shutdown_timeout: Duration::from_secs(30),
        }
    }
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

impl TelemetrySettings {
    /// Checks the section on its own: the endpoint is parsed here, so a bad
    /// one is refused by `check-config` too, and named redacted (the
    /// exporter's own error would quote the password).
    pub(super) fn validate(&self) -> Result<(), SettingsError> {
        if let Some(url) = &self.otlp_endpoint
            && (!(url.starts_with("http://") || url.starts_with("https://"))
                || format!("{}/v1/traces", url.trim_end_matches('/'))
                    .parse::<hyper::Uri>()
                    .is_err())
        {
            return Err(SettingsError::Invalid(format!(
                "telemetry.otlp_endpoint {}: not an http:// or https:// URL (the collector's OTLP/HTTP port, 4318)",
                redact_url(url)
            )));
        }
        Ok(())
    }
}
