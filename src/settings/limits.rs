//! `[limits]`: the rate-limit policy, its rules per scope and purpose,
//! and how long a job is remembered.

use std::time::Duration;

use serde::{Deserialize, Deserializer};

use super::{MAX_PERIOD, SettingsError, human_duration};
use crate::domain::{Normalization, Scope, ScopeMap};

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
    /// time) must be for the times to say which is the newer; closer,
    /// neither supersedes the other and both are mailed. Producers' clocks
    /// disagree, and the AMQP timestamp has whole seconds. Default 2 s, at
    /// most an hour.
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
    /// Whether a job to a suppressed mailbox (`mailgate suppress add`: an
    /// address known not to exist, or that complained) is answered
    /// `suppressed`, with no SMTP and no quota used. One key read per
    /// admission, in the same script call. Default true; false skips the
    /// read and mails suppressed addresses too.
    pub suppress: bool,
    /// How long a mailbox is suppressed once a relay answered, for its
    /// mail, that it does not exist (enhanced status code 5.1.1). Default
    /// 30 days; "0s": such an answer suppresses nothing. At most 10 years.
    #[serde(deserialize_with = "human_duration")]
    pub suppress_bounces_for: Duration,
    /// How old a job without `expires_at` may get before it is answered
    /// `expired` (and refunded) instead of sent: counted from when a worker
    /// first took it (its `created_at` and publish time are a producer's,
    /// and may mean something else). No job waits without end (a relay
    /// that defers it, an outage). Default 1 h;
    /// "0s": never (such jobs may wait as long as the cause lasts). One
    /// longer than `dedup_for` counts as `dedup_for` ([`Self::job_max_age`]).
    #[serde(deserialize_with = "human_duration")]
    pub max_age: Duration,
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
            suppress: true,
            suppress_bounces_for: Duration::from_secs(30 * 86_400),
            max_age: Duration::from_secs(3600),
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
    /// The purpose's own rules of each scope.
    fn scopes(&self) -> ScopeMap<Option<&ScopeRules>> {
        ScopeMap::from_fn(|scope| match scope {
            Scope::Email => self.email.as_ref(),
            Scope::Ip => self.ip.as_ref(),
            Scope::Domain => self.domain.as_ref(),
        })
    }
}

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
    /// IPv4 /24, an IPv6 /48: see `limiter` and its keyspace's `share_key`) may use: a
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
    /// How old a job without `expires_at` may get ([`Self::max_age`]), at
    /// most `dedup_for`: a copy of a job older than its record (an ack
    /// lost, the job redelivered a day later) is answered `expired`
    /// rather than judged afresh; `None` for "0s", never.
    pub fn job_max_age(&self) -> Option<Duration> {
        (!self.max_age.is_zero()).then(|| self.max_age.min(self.dedup_for))
    }

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

    /// The default rules of each scope (`limits.<scope>`).
    pub fn scope_rules(&self) -> ScopeMap<&[Rule]> {
        ScopeMap::from_fn(|scope| match scope {
            Scope::Email => self.email.rules.as_slice(),
            Scope::Ip => self.ip.rules.as_slice(),
            Scope::Domain => self.domain.rules.as_slice(),
        })
    }

    /// Purpose `purpose`'s own rules of `scope`
    /// (`limits.purpose.<name>.<scope>`), if it has them.
    pub fn purpose_rules(&self, purpose: &str, scope: Scope) -> Option<&[Rule]> {
        let own = self.purpose.get(purpose)?.scopes()[scope];
        own.map(|s| s.rules.as_slice())
    }

    /// Every rule list of `scope`: the default, then each purpose's own.
    pub fn rule_lists(&self, scope: Scope) -> impl Iterator<Item = &[Rule]> {
        std::iter::once(self.scope_rules()[scope]).chain(
            (self.purpose.values())
                .filter_map(move |p| p.scopes()[scope].map(|s| s.rules.as_slice())),
        )
    }

    /// The longest window of any rule in any scope or purpose (zero if there
    /// are none).
    pub fn longest_window(&self) -> Duration {
        (Scope::ALL.into_iter())
            .flat_map(|scope| self.rule_lists(scope))
            .flatten()
            .map(|r| r.window)
            .max()
            .unwrap_or_default()
    }

    /// Checks the section on its own, what serde cannot see key by key:
    /// names, periods within [`MAX_PERIOD`], shares and prefixes in range.
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
                (Scope::ALL.into_iter())
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
        if self.supersede_skew > Duration::from_secs(3600) {
            return Err(SettingsError::Invalid(
                "limits.supersede_skew must be at most 1h".into(),
            ));
        }
        if self.result_granularity > Duration::from_secs(3600) {
            return Err(SettingsError::Invalid(
                "limits.result_granularity must be at most 1h".into(),
            ));
        }
        if self.suppress_bounces_for > Duration::from_secs(10 * 365 * 86_400) {
            return Err(SettingsError::Invalid(
                "limits.suppress_bounces_for must be at most 10 years (\"0s\": bounces \
                 suppress nothing)"
                    .into(),
            ));
        }
        Ok(())
    }
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
        assert_eq!(
            l.purpose_rules("login", Scope::Domain).map(<[Rule]>::len),
            Some(1)
        );
        assert_eq!(
            l.rule_lists(Scope::Domain).count(),
            2,
            "the default and the purpose's"
        );
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
}
