//! Settings: the TOML file given by `--config` (default `config/default.toml`),
//! overridden by environment variables `MAILGATE__SECTION__KEY`.
//!
//! Everything is checked while loading, so a typo or an impossible value stops
//! the process at start-up with a message naming the key, never later.

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use crate::domain::Normalization;

/// The whole configuration of a mailgate process.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Where the limiter keeps its state.
    pub redis: RedisSettings,
    /// The rate-limit policy.
    #[serde(default)]
    pub limits: LimitSettings,
}

/// Why settings could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// The file is missing, is not TOML, or a key is unknown or of the wrong type.
    #[error("cannot load settings: {0}")]
    Load(#[from] config::ConfigError),
    /// The values parse but make no sense together.
    #[error("invalid settings: {0}")]
    Invalid(String),
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
        settings.limits.validate()?;
        Ok(settings)
    }
}

/// Redis connection and key namespace.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSettings {
    /// `redis://host:port/db` (or `rediss://` for TLS).
    pub url: String,
    /// Prepended to every key mailgate writes, so several deployments (or
    /// tests) can share one Redis without seeing each other.
    #[serde(default = "default_key_prefix")]
    pub key_prefix: String,
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
}

impl Rule {
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
    /// The longest window, which is how long this scope must remember an admission.
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
    /// Which spellings of a mailbox count as one.
    pub normalize: Normalization,
    /// IPv4 addresses are grouped by this many leading bits (32: one address).
    pub ipv4_prefix: u8,
    /// IPv6 addresses are grouped by this many leading bits (64: one subnet).
    pub ipv6_prefix: u8,
    /// How long a job id is remembered for de-duplication. Defaults to, and
    /// may not be shorter than, the longest window of any rule.
    #[serde(deserialize_with = "opt_human_duration")]
    pub dedup_for: Option<Duration>,
    /// How long an admission owns its job's send. Another copy of the job
    /// (a redelivery after a crash, a producer's double publish) waits this
    /// long before it may send instead. Must exceed the SMTP send deadline,
    /// or a slow send and its retry could both deliver.
    #[serde(deserialize_with = "human_duration")]
    pub send_lease: Duration,
}

impl Default for LimitSettings {
    fn default() -> Self {
        let rules = |rs: &[(u64, u32)]| ScopeRules {
            rules: rs
                .iter()
                .map(|&(secs, max)| Rule {
                    window: Duration::from_secs(secs),
                    max,
                })
                .collect(),
        };
        Self {
            email: rules(&[(60, 1), (3600, 5), (86_400, 10)]),
            ip: rules(&[(60, 5), (600, 30), (3600, 50)]),
            normalize: Normalization::default(),
            ipv4_prefix: 32,
            ipv6_prefix: 64,
            dedup_for: None,
            send_lease: Duration::from_secs(30),
        }
    }
}

impl LimitSettings {
    /// The longest window of any rule in any scope (zero if there are none).
    pub fn longest_window(&self) -> Duration {
        [&self.email, &self.ip]
            .into_iter()
            .filter_map(ScopeRules::longest_window)
            .max()
            .unwrap_or_default()
    }

    /// How long job ids are remembered: `dedup_for`, or the longest window.
    pub fn dedup_period(&self) -> Duration {
        self.dedup_for.unwrap_or_else(|| self.longest_window())
    }

    /// Checks what serde cannot see key by key.
    pub fn validate(&self) -> Result<(), SettingsError> {
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
        if let Some(d) = self.dedup_for
            && d < self.longest_window()
        {
            return Err(SettingsError::Invalid(format!(
                "limits.dedup_for ({}) must be at least the longest window ({}), \
                     or a redelivered job could be counted twice",
                humantime::format_duration(d),
                humantime::format_duration(self.longest_window()),
            )));
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

fn opt_human_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    human_duration(d).map(Some)
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
    fn durations_are_human() {
        let l = limits(
            r#"email.rules = [{ window = "500ms", max = 1 }, { window = "10m", max = 2 }, { window = "24h", max = 3 }]"#,
        )
        .unwrap();
        let w: Vec<u64> = l.email.rules.iter().map(Rule::window_ms).collect();
        assert_eq!(w, [500, 600_000, 86_400_000]);
        assert_eq!(l.dedup_period(), Duration::from_secs(86_400));
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
    fn bad_values_are_refused() {
        assert!(limits(r#"email.rules = [{ window = "0s", max = 1 }]"#).is_err());
        assert!(limits(r#"email.rules = [{ window = "1s", max = 0 }]"#).is_err());
        assert!(limits(r#"email.rules = [{ window = "soon", max = 1 }]"#).is_err());
        assert!(limits(r#"email.rules = [{ window = "1s", max = 1, burst = 2 }]"#).is_err());
        assert!(limits(r#"ipv4_prefix = 33"#).is_err());
        assert!(limits(r#"dedup_for = "1h""#).is_err());
        assert!(limits(r#"dedup_for = "48h""#).is_ok());
    }
}
