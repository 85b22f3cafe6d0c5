//! `mailgate explain`: "why didn't I get my code?" answered for one mailbox
//! (and a client address) in one command: whether it is suppressed, the
//! limits in force and when the next send is allowed, the overrides that
//! apply, and the mailbox's recent admissions with what became of each. Reads only, and only what
//! concerns the mailbox and the address asked about.

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

use super::job::{record_json, state_words};
use super::limits::{render_usage, usage_json};
use super::{known_purpose, letters, limiter, short_duration, time_left};
use crate::domain::{EmailAddress, IpKey, Name, RegistrableDomain};
use crate::ledger::{Admitted, Backend, RedisLedger, Suppression};
use crate::limiter::{Clock, Quotas, Subject, Usage};
use crate::settings::Settings;

/// How many of the mailbox's admissions are shown, newest first.
const ADMISSIONS_SHOWN: usize = 20;

/// What `explain` found.
struct Findings {
    email: EmailAddress,
    ip: Option<IpKey>,
    purpose: Option<Name>,
    /// The scopes that have rules or an override, mailbox first.
    usages: Vec<Usage>,
    admissions: Vec<Admitted>,
    suppressed: Option<Suppression>,
}

impl Findings {
    /// The scope that holds the next send back longest, if one does.
    fn binding(&self) -> Option<&Usage> {
        (self.usages.iter())
            .filter(|u| !u.exempt)
            .max_by_key(|u| u.retry_after_ms)
            .filter(|u| u.retry_after_ms > 0)
    }
}

/// Prints the explanation for `email` (and `ip`) under `purpose`'s rules.
pub async fn explain(
    settings: &Settings,
    email: &str,
    ip: Option<&str>,
    purpose: Option<&str>,
    json: bool,
) -> anyhow::Result<bool> {
    let email = EmailAddress::parse(email).context("--email")?;
    let ip = ip.map(IpKey::parse).transpose().context("--ip")?;
    let purpose = purpose.map(|p| known_purpose(settings, p)).transpose()?;
    let Backend::Redis(ledger) = limiter(settings).await? else {
        bail!("redis.url is memory://: the limits live inside the worker process");
    };
    let usages = usages(settings, &ledger, &email, ip.as_ref(), purpose.as_ref()).await?;
    let admissions = ledger
        .admissions(Subject::Email(&email), ADMISSIONS_SHOWN)
        .await?;
    let suppressed = match settings.limits.suppress {
        true => ledger.suppression(&email).await?,
        false => None,
    };
    let found = Findings {
        email,
        ip,
        purpose,
        usages,
        admissions,
        suppressed,
    };
    match json {
        true => println!(
            "{}",
            letters::printable_json(&findings_json(&found).to_string())
        ),
        false => print_text(settings, &found),
    }
    Ok(true)
}

/// The usage of each scope a job for `email` from `ip` is judged in that
/// has rules or an override.
async fn usages(
    settings: &Settings,
    ledger: &RedisLedger,
    email: &EmailAddress,
    ip: Option<&IpKey>,
    purpose: Option<&Name>,
) -> anyhow::Result<Vec<Usage>> {
    let domain = RegistrableDomain::of(email, &settings.limits.normalize);
    // The domain's own log, and with a client address that network's
    // share of it: a job must fit both.
    let mut subjects = vec![Subject::Email(email)];
    if let Some(ip) = ip {
        subjects.push(Subject::Ip(ip));
    }
    subjects.push(Subject::Domain(&domain));
    if let Some(ip) = ip {
        subjects.push(Subject::Share(&domain, ip));
    }
    let mut usages = Vec::new();
    for subject in subjects {
        let usage = ledger.usage(subject, purpose, Clock::Server).await?;
        // A scope with no rules and no override says nothing.
        if !usage.rules.is_empty() || usage.by_override.is_some() {
            usages.push(usage);
        }
    }
    Ok(usages)
}

fn findings_json(f: &Findings) -> Value {
    let binding = f.binding();
    json!({
        "email": f.email.as_str(),
        "ip": f.ip.as_ref().map(|i| i.addr().to_string()),
        "purpose": f.purpose.as_ref().map(|p| p.as_str()),
        "next_send_in_ms": binding.map_or(0, |u| u.retry_after_ms),
        "bound_by": binding.map(|u| u.key.as_str()),
        "limits": f.usages.iter().map(usage_json).collect::<Vec<_>>(),
        "admissions": f.admissions.iter().map(admission_json).collect::<Vec<_>>(),
        "suppressed": f.suppressed.as_ref().map(|s| json!({
            "suppressed": s.mailbox,
            "spelling_only": s.exact,
            "since": letters::time(s.since_ms),
            "source": s.source,
            "reason": s.why,
            "left_ms": s.left_ms,
        })),
    })
}

fn admission_json(a: &Admitted) -> Value {
    json!({
        "id": a.id,
        "admitted_at": letters::time(a.at_ms),
        "record": a.record.as_ref().map(record_json),
    })
}

fn print_text(settings: &Settings, f: &Findings) {
    let email = f.email.as_str();
    if let Some(s) = &f.suppressed {
        let left = s.left_ms.map_or_else(
            || "until removed".into(),
            |ms| format!("for {}", time_left(ms)),
        );
        let what = match s.exact {
            true => format!(
                "the address {} as spelled (a relay said it does not exist)",
                s.mailbox
            ),
            false => format!("the mailbox {}, every spelling of it", s.mailbox),
        };
        let line = format!(
            "SUPPRESSED {left} (since {}, {}: {}): {what}; its jobs are answered `suppressed` \
             and no code is sent; `mailgate suppress remove {email}` lifts it",
            letters::time(s.since_ms),
            s.source,
            s.why,
        );
        println!("{}", letters::printable(&line));
    }
    let limits = match f.binding() {
        None => "allowed now".to_owned(),
        Some(u) => holding(u),
    };
    let next = match f.suppressed {
        Some(_) => {
            format!(
                "next send for {email}: none while it is suppressed (the limits alone: {limits})"
            )
        }
        None => format!("next send for {email}: {limits}"),
    };
    println!("{}", letters::printable(&next));
    println!();
    let share = settings.limits.domain.network_share;
    for u in &f.usages {
        print!("{}", letters::printable_lines(&render_usage(u, share)));
    }
    println!();
    if f.admissions.is_empty() {
        println!("no admission of this mailbox is counted now");
    } else {
        println!(
            "admissions of this mailbox counted now, newest first (a refunded one no longer \
             counts, and is not listed):"
        );
    }
    for a in &f.admissions {
        let what = a.record.as_ref().map_or_else(
            || "(its record is gone)".to_owned(),
            |r| {
                let attempt = r
                    .attempt
                    .map_or_else(String::new, |n| format!(", attempt {n}"));
                format!("{}{attempt}", state_words(r.state).2)
            },
        );
        let line = format!("  {}  {}  {what}", letters::time(a.at_ms), a.id);
        println!("{}", letters::printable(&line));
    }
}

/// When the next send is allowed, and what holds it back: an override's
/// deny, or a rule (its scope, max and window), with the key it reads.
fn holding(u: &Usage) -> String {
    if let Some(o) = u.by_override.as_ref().filter(|o| o.kind == "deny") {
        let until = o.expires_at_ms.map_or_else(
            || "until it is removed".to_owned(),
            |t| format!("for {}", time_left(t.saturating_sub(u.at_ms))),
        );
        return format!(
            "{until} (held back by an override, deny {}: {})",
            o.target, o.reason
        );
    }
    let rule = (u.rules.iter())
        .filter(|r| r.enforce && r.retry_after_ms == u.retry_after_ms)
        .map(|r| {
            let window = short_duration(r.rule.window_ms);
            format!(
                "the {} scope's {} per {window}, ",
                r.rule.scope.as_str(),
                r.rule.max
            )
        })
        .next()
        .unwrap_or_default();
    format!(
        "in {} (held back by {rule}{})",
        short_duration(u.retry_after_ms),
        u.key
    )
}
