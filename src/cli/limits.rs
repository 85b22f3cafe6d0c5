//! `mailgate limits`: show or reset a mailbox's, an IP's or a domain's
//! quota.

use anyhow::{Context as _, bail};
use clap::Subcommand;
use serde_json::{Value, json};

use super::letters::{self, printable};
use super::{in_redis, known_purpose, limiter, short_duration, time_left};
use crate::domain::{EmailAddress, IpKey, RegistrableDomain};
use crate::limiter::{Clock, Quotas, Scope, Subject, Usage};
use crate::settings::Settings;
use crate::store::overrides::{OverrideStore, ResetNote};

/// `limits`' actions.
#[derive(Subcommand, Debug)]
pub enum LimitsAction {
    /// Show each rule's use and when the next send is allowed; consumes nothing.
    Show {
        /// A mailbox (normalized as the limiter does).
        #[arg(long)]
        email: Option<String>,
        /// A client IP (grouped as the limiter does).
        #[arg(long)]
        ip: Option<String>,
        /// A mail domain (counted by its registrable domain, as the limiter
        /// does: `mail.example.co.uk` is `example.co.uk`); with `--ip`,
        /// that client network's share of the domain's quota.
        #[arg(long)]
        domain: Option<String>,
        /// Judge by this purpose's rules.
        #[arg(long)]
        purpose: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Forget a mailbox's, IP's or domain's admissions (for support staff);
    /// noted, with its reason, in the log of resets that `limits show`
    /// and `limits resets` read.
    Reset {
        /// A mailbox.
        #[arg(long)]
        email: Option<String>,
        /// A client IP.
        #[arg(long)]
        ip: Option<String>,
        /// A mail domain (its registrable domain); with `--ip`, that client
        /// network's share of the domain's quota.
        #[arg(long)]
        domain: Option<String>,
        /// Why (required: whoever finds it later must know).
        #[arg(long)]
        reason: String,
    },
    /// The resets noted (the newest 1 000), newest first.
    Resets {
        /// Print JSON lines instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// Runs a `limits` action, printing what it found or did.
pub async fn limits(settings: &Settings, action: LimitsAction) -> anyhow::Result<bool> {
    match action {
        LimitsAction::Show {
            email,
            ip,
            domain,
            purpose,
            json,
        } => {
            let who = Named::parse(email.as_deref(), ip.as_deref(), domain.as_deref())?;
            let usage = limits_show(settings, &who, purpose.as_deref()).await?;
            let resets: Vec<ResetNote> = (reset_log(settings).await?.resets().await?)
                .into_iter()
                .filter(|n| n.key == usage.key)
                .take(3)
                .collect();
            if json {
                let mut shown = usage_json(&usage);
                shown["resets"] = serde_json::to_value(&resets)?;
                println!("{}", letters::printable_json(&shown.to_string()));
            } else {
                let share = settings.limits.domain.network_share;
                print!("{}", letters::printable_lines(&render_usage(&usage, share)));
                let now = crate::domain::now_ms();
                for note in &resets {
                    println!("reset {}", render_reset(note, now));
                }
            }
            Ok(true)
        }
        LimitsAction::Reset {
            email,
            ip,
            domain,
            reason,
        } => {
            let who = Named::parse(email.as_deref(), ip.as_deref(), domain.as_deref())?;
            println!("{}", limits_reset(settings, &who, &reason).await?);
            Ok(true)
        }
        LimitsAction::Resets { json } => {
            let now = crate::domain::now_ms();
            let notes = reset_log(settings).await?.resets().await?;
            if notes.is_empty() && !json {
                eprintln!("no resets noted");
            }
            for note in notes {
                match json {
                    true => println!(
                        "{}",
                        letters::printable_json(&serde_json::to_string(&note)?)
                    ),
                    false => println!("{}", render_reset(&note, now)),
                }
            }
            Ok(true)
        }
    }
}

/// What `--email`, `--ip` and `--domain` name, parsed once: the values a
/// [`Subject`] borrows.
#[derive(Debug)]
pub struct Named {
    email: Option<EmailAddress>,
    ip: Option<IpKey>,
    domain: Option<RegistrableDomain>,
}

impl Named {
    /// From the flags: exactly one of them, or `--domain` with `--ip`.
    pub fn parse(
        email: Option<&str>,
        ip: Option<&str>,
        domain: Option<&str>,
    ) -> anyhow::Result<Self> {
        let named = Self {
            email: email
                .map(EmailAddress::parse)
                .transpose()
                .context("--email")?,
            ip: ip.map(IpKey::parse).transpose().context("--ip")?,
            domain: (domain.map(RegistrableDomain::parse).transpose()).context("--domain")?,
        };
        if named.subject_or_none().is_none() {
            bail!(
                "give exactly one of --email, --ip or --domain (or --domain with --ip: that \
                 client network's share of the domain)"
            );
        }
        Ok(named)
    }

    fn subject_or_none(&self) -> Option<Subject<'_>> {
        Subject::of(self.email.as_ref(), self.ip.as_ref(), self.domain.as_ref())
    }

    /// The subject the flags name.
    fn subject(&self) -> Subject<'_> {
        // `parse` refused flags that name no subject.
        (self.subject_or_none()).unwrap_or_else(|| unreachable!("Named::parse checked the flags"))
    }
}

/// The usage of `who`'s quota under `purpose`'s rules, consuming nothing.
pub async fn limits_show(
    settings: &Settings,
    who: &Named,
    purpose: Option<&str>,
) -> anyhow::Result<Usage> {
    let purpose = purpose.map(|p| known_purpose(settings, p)).transpose()?;
    let limiter = limiter(settings).await?;
    Ok(limiter
        .usage(who.subject(), purpose.as_ref(), Clock::Server)
        .await?)
}

/// Removes `who`'s admissions; says what it removed.
pub async fn limits_reset(
    settings: &Settings,
    who: &Named,
    reason: &str,
) -> anyhow::Result<String> {
    anyhow::ensure!(!reason.trim().is_empty(), "--reason must say why");
    let log = reset_log(settings).await?;
    let limiter = limiter(settings).await?;
    let (key, removed) = limiter.reset(who.subject()).await?;
    let note = ResetNote {
        key: key.clone(),
        reason: reason.to_owned(),
        removed,
        at_ms: crate::domain::now_ms(),
    };
    log.note_reset(&note)
        .await
        .context("the reset was done, but could not be noted in the log of resets")?;
    Ok(format!(
        "removed {removed} admission(s) from {key}; noted in the log of resets (limits resets)"
    ))
}

/// The store the log of resets is in (the overrides').
async fn reset_log(settings: &Settings) -> anyhow::Result<OverrideStore> {
    in_redis(
        settings,
        OverrideStore::open(&settings.redis, &settings.limits),
    )
    .await
}

/// A reset noted, for people: when, which log, how many, why.
fn render_reset(note: &ResetNote, now: u64) -> String {
    let at = letters::time(note.at_ms);
    let ago = time_left(now.saturating_sub(note.at_ms));
    format!(
        "{at} ({ago} ago): {} admission(s) removed from {}: {}",
        note.removed,
        note.key,
        printable(&note.reason)
    )
}

/// A JSON rendering of a [`Usage`], for scripts.
pub fn usage_json(u: &Usage) -> Value {
    json!({
        "key": u.key,
        "at_ms": u.at_ms,
        "retry_after_ms": u.retry_after_ms,
        "exempt": u.exempt,
        "override": u.by_override.as_ref().map(|o| json!({
            "target": o.target,
            "action": o.kind,
            "reason": o.reason,
            "expires_at_ms": o.expires_at_ms,
        })),
        "rules": u.rules.iter().map(|r| json!({
            "scope": r.rule.scope.as_str(),
            "window_ms": r.rule.window_ms,
            "max": r.rule.max,
            "enforce": r.enforce,
            "count": r.count,
            "retry_after_ms": r.retry_after_ms,
        })).collect::<Vec<_>>(),
    })
}

/// A human rendering of a [`Usage`]; a domain's says that each client
/// network may use only its `share` (`limits.domain.network_share`) of it.
pub fn render_usage(u: &Usage, share: f64) -> String {
    let mut out = format!("{}\n", u.key);
    for r in &u.rules {
        let window = short_duration(r.rule.window_ms);
        out.push_str(&format!("  {} per {window}: {} used", r.rule.max, r.count));
        if r.retry_after_ms > 0 {
            out.push_str(&format!(", full for {}", short_duration(r.retry_after_ms)));
        }
        if !r.enforce {
            out.push_str(" (shadow: counted, never rejects)");
        }
        out.push('\n');
    }
    if let Some(o) = &u.by_override {
        let until = o.expires_at_ms.map_or_else(
            || "until removed".to_owned(),
            |t| format!("for {}", short_duration(t.saturating_sub(u.at_ms))),
        );
        out.push_str(&format!(
            "override in force: {} {} {until}: {}\n",
            o.target, o.kind, o.reason
        ));
    }
    let domain = u
        .rules
        .first()
        .is_some_and(|r| r.rule.scope == Scope::Domain);
    if domain && share < 1.0 && !u.exempt && !u.key.contains(":net:") {
        out.push_str(&format!(
            "each client network may use only {share} of this (limits.domain.network_share); \
             --domain with --ip shows, and resets, one network's share\n"
        ));
    }
    if u.exempt {
        let why = match u.by_override {
            Some(_) => "the override allows it",
            None => "limits.domain.exempt",
        };
        out.push_str(&format!("exempt ({why}): this scope does not count it\n"));
    } else if u.retry_after_ms == 0 {
        out.push_str("next send: allowed now\n");
    } else {
        let at = jiff::Timestamp::from_millisecond(
            i64::try_from(u.at_ms + u.retry_after_ms).unwrap_or(0),
        )
        .map(|t| t.to_string())
        .unwrap_or_default();
        out.push_str(&format!(
            "next send: in {} ({at})\n",
            short_duration(u.retry_after_ms)
        ));
    }
    out
}
