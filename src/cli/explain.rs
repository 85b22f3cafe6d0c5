//! `mailgate explain`: "why didn't I get my code?" answered for one mailbox
//! (and a client address) in one command: the limits in force and when the
//! next send is allowed, the overrides that apply, and the mailbox's
//! recent admissions with what became of each. Reads only, and only what
//! concerns the mailbox and the address asked about.

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

use super::job::{record_json, state_words};
use super::limits::{render_usage, usage_json};
use super::{dead, limiter, short_duration};
use crate::domain::{EmailAddress, IpKey, Name, RegistrableDomain};
use crate::ledger::{Admitted, Backend};
use crate::limiter::{Clock, Quotas, Subject, Usage};
use crate::settings::Settings;

/// How many of the mailbox's admissions are shown, newest first.
const ADMISSIONS_SHOWN: usize = 20;

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
    let purpose = purpose.map(|p| Name::parse("purpose", p)).transpose()?;
    let domain = RegistrableDomain::of(&email, &settings.limits.normalize);
    let Backend::Redis(ledger) = limiter(settings).await? else {
        bail!("redis.url is memory://: the limits live inside the worker process");
    };
    let mut subjects = vec![Subject::Email(&email)];
    if let Some(ip) = &ip {
        subjects.push(Subject::Ip(ip));
    }
    subjects.push(match &ip {
        Some(ip) => Subject::Share(&domain, ip),
        None => Subject::Domain(&domain),
    });
    let mut usages = Vec::new();
    for subject in subjects {
        let usage = ledger
            .usage(subject, purpose.as_ref(), Clock::Server)
            .await?;
        // A scope with no rules and no override says nothing.
        if !usage.rules.is_empty() || usage.by_override.is_some() {
            usages.push(usage);
        }
    }
    let admissions = ledger
        .admissions(Subject::Email(&email), ADMISSIONS_SHOWN)
        .await?;
    let binding = usages
        .iter()
        .filter(|u| !u.exempt)
        .max_by_key(|u| u.retry_after_ms)
        .filter(|u| u.retry_after_ms > 0);
    if json {
        println!(
            "{}",
            json!({
                "email": email.as_str(),
                "ip": ip.as_ref().map(|i| i.addr().to_string()),
                "purpose": purpose.as_ref().map(|p| p.as_str()),
                "next_send_in_ms": binding.map_or(0, |u| u.retry_after_ms),
                "bound_by": binding.map(|u| u.key.as_str()),
                "limits": usages.iter().map(usage_json).collect::<Vec<_>>(),
                "admissions": admissions.iter().map(admission_json).collect::<Vec<_>>(),
            })
        );
        return Ok(true);
    }
    print_text(settings, &email, &usages, binding, &admissions);
    Ok(true)
}

fn admission_json(a: &Admitted) -> Value {
    json!({
        "id": a.id,
        "admitted_at": dead::time(a.at_ms),
        "record": a.record.as_ref().map(record_json),
    })
}

fn print_text(
    settings: &Settings,
    email: &EmailAddress,
    usages: &[Usage],
    binding: Option<&Usage>,
    admissions: &[Admitted],
) {
    match binding {
        None => println!("next send for {}: allowed now", email.as_str()),
        Some(u) => println!(
            "next send for {}: in {} (held back by {})",
            email.as_str(),
            short_duration(u.retry_after_ms),
            u.key
        ),
    }
    println!();
    let share = settings.limits.domain.network_share;
    for u in usages {
        print!("{}", render_usage(u, share));
    }
    println!();
    if admissions.is_empty() {
        println!("no admission of this mailbox is counted now");
    } else {
        println!(
            "admissions of this mailbox counted now, newest first (a refunded one no longer \
             counts, and is not listed):"
        );
    }
    for a in admissions {
        let what = a.record.as_ref().map_or_else(
            || "(its record is gone)".to_owned(),
            |r| {
                let attempt = r
                    .attempt
                    .map_or_else(String::new, |n| format!(", attempt {n}"));
                format!("{}{attempt}", state_words(r.state).2)
            },
        );
        println!("  {}  {}  {what}", dead::time(a.at_ms), a.id);
    }
}
