//! `mailgate suppress`: add, remove and list the mailboxes no code is
//! mailed to, e.g. the bounce and complaint lists a mail provider exports.

use std::io::BufRead as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Subcommand;
use serde_json::json;

use super::{letters, limiter, short_duration, time_left};
use crate::domain::EmailAddress;
use crate::ledger::{Backend, RedisLedger, Spelling};
use crate::settings::Settings;

/// How many suppressions `add` writes at once.
const WRITE_AT_ONCE: usize = 256;

/// `suppress`' actions.
#[derive(Subcommand, Debug)]
pub enum SuppressAction {
    /// Suppress mailboxes: their jobs are answered `suppressed`, with no
    /// SMTP and no quota used (every worker, at once).
    Add {
        /// Mailboxes: each with every spelling the limiter counts as it
        /// (`Jane+x@example.com` and `JANE@example.com` are
        /// `jane@example.com`, under the shipped limits.normalize).
        emails: Vec<String>,
        /// Also every mailbox in this file: one per line, or a CSV export
        /// (the first field that is a mailbox; quoted fields, `,`, `;` or
        /// tab separators); lines without a mailbox are skipped. A line
        /// that says it is a complaint ("complaint", "spam" or
        /// "unsubscribe" in a field) suppresses the mailbox in every
        /// spelling; any other (a bounce) only its own spelling, as a
        /// relay's bounce does: whoever asked for the code chose it.
        #[arg(long, value_name = "FILE")]
        file: Option<PathBuf>,
        /// How long (e.g. `30d`, `1y`).
        #[arg(long = "for", value_parser = period, default_value = "30d", conflicts_with = "forever")]
        period: Duration,
        /// Until removed.
        #[arg(long)]
        forever: bool,
        /// Why, for whoever finds it later (default: "added by hand", or
        /// "imported from FILE").
        #[arg(long)]
        reason: Option<String>,
    },
    /// Lift mailboxes' suppression (every spelling's, as `add` made it)
    /// and their own spelling's bounce.
    Remove {
        /// Mailboxes.
        #[arg(required = true)]
        emails: Vec<String>,
    },
    /// List the suppressions in force.
    List {
        /// Print JSON lines instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// Runs a `suppress` action, printing what it did.
pub async fn suppress(settings: &Settings, action: SuppressAction) -> anyhow::Result<bool> {
    let Backend::Redis(ledger) = limiter(settings).await? else {
        bail!("redis.url is memory://: there is no shared suppression list to change");
    };
    match action {
        SuppressAction::Add {
            emails,
            file,
            period,
            forever,
            reason,
        } => {
            let period = (!forever).then_some(period);
            add(&ledger, emails, file, period, reason).await
        }
        SuppressAction::Remove { emails } => {
            let mut ok = true;
            for e in emails {
                let email = EmailAddress::parse(&e).with_context(|| format!("{e:?}"))?;
                match ledger.unsuppress(&email).await? {
                    true => println!("removed {}", email.as_str()),
                    false => {
                        println!("{} was not suppressed", email.as_str());
                        ok = false;
                    }
                }
            }
            Ok(ok)
        }
        SuppressAction::List { json } => {
            let all = ledger.suppressions().await?;
            for s in &all {
                let left = s.left_ms.map_or_else(
                    || "until removed".into(),
                    |ms| format!("{} left", time_left(ms)),
                );
                if json {
                    let line = json!({
                        "mailbox": s.mailbox,
                        "spelling_only": s.exact,
                        "since": letters::time(s.since_ms),
                        "source": s.source,
                        "reason": s.why,
                        "left_ms": s.left_ms,
                    });
                    println!("{}", letters::printable_json(&line.to_string()));
                } else {
                    let since = letters::time(s.since_ms);
                    let spelling = if s.exact { " (this spelling)" } else { "" };
                    let line = format!(
                        "{}{spelling}  since {since}  {left}  {}: {}",
                        s.mailbox, s.source, s.why
                    );
                    println!("{}", letters::printable(&line));
                }
            }
            eprintln!("{} suppressed", all.len());
            Ok(true)
        }
    }
}

async fn add(
    ledger: &RedisLedger,
    emails: Vec<String>,
    file: Option<PathBuf>,
    period: Option<Duration>,
    reason: Option<String>,
) -> anyhow::Result<bool> {
    let mut given: Vec<(String, &str, Spelling)> = (emails.into_iter())
        .map(|e| (e, "manual", Spelling::Mailbox))
        .collect();
    let mut skipped = 0u64;
    if let Some(path) = &file {
        let f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
        for line in std::io::BufReader::new(f).lines() {
            let line = line.with_context(|| format!("reading {}", path.display()))?;
            // A spreadsheet's UTF-8 byte order mark is no part of a mailbox.
            let line = line.trim_start_matches('\u{feff}');
            let fields = csv_fields(line);
            let spelling = match fields.iter().any(|f| complaint(f)) {
                true => Spelling::Mailbox,
                false => Spelling::Exact,
            };
            match fields.iter().find(|f| EmailAddress::parse(f).is_ok()) {
                Some(mailbox) => given.push((mailbox.clone(), "import", spelling)),
                None if line.trim().is_empty() => {}
                // Something like a mailbox that is none: said, not skipped.
                None if fields.iter().any(|f| f.contains('@')) => {
                    given.push((line.to_owned(), "import", spelling));
                }
                None => skipped += 1,
            }
        }
    }
    if given.is_empty() {
        bail!("name mailboxes, or --file with one per line");
    }
    let (mut added, mut bad) = (0u64, Vec::new());
    let mut writes = tokio::task::JoinSet::new();
    for (text, source, spelling) in given {
        let Ok(email) = EmailAddress::parse(&text) else {
            bad.push(text);
            continue;
        };
        let why = match (&reason, &file, source) {
            (Some(r), _, _) => r.clone(),
            (None, Some(f), "import") => format!("imported from {}", f.display()),
            _ => "added by hand".to_owned(),
        };
        // Many at once: a provider's export may hold many thousands.
        if writes.len() >= WRITE_AT_ONCE
            && let Some(done) = writes.join_next().await
        {
            done??;
        }
        let ledger = ledger.clone();
        writes
            .spawn(async move { (ledger.suppress(&email, spelling, source, &why, period)).await });
        added += 1;
    }
    while let Some(done) = writes.join_next().await {
        done??;
    }
    let how_long = period.map_or_else(
        || "until removed".to_owned(),
        |p| {
            format!(
                "for {}",
                short_duration(u64::try_from(p.as_millis()).unwrap_or(u64::MAX))
            )
        },
    );
    let mailboxes = if added == 1 { "mailbox" } else { "mailboxes" };
    println!("suppressed {added} {mailboxes} {how_long}");
    if skipped > 0 {
        println!("skipped {skipped} lines without a mailbox");
    }
    if !bad.is_empty() {
        println!(
            "refused {} that are not mailboxes: {}",
            bad.len(),
            bad.join(", ")
        );
    }
    Ok(bad.is_empty())
}

/// Whether a field of an export's line says the line is a complaint (the
/// owner asked for no mail), not a bounce: Postmark's "SpamComplaint",
/// SES's "Complaint", an unsubscribe.
fn complaint(field: &str) -> bool {
    let f = field.to_ascii_lowercase();
    !f.contains('@')
        && ["complain", "spam", "unsubscri"]
            .iter()
            .any(|w| f.contains(w))
}

/// `--for`: at least a second, at most ten years.
fn period(text: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if d < Duration::from_secs(1) || d > Duration::from_secs(3650 * 86_400) {
        return Err("from 1s to 10 years (or --forever)".into());
    }
    Ok(d)
}

/// The fields of a line of a CSV export (RFC 4180 quoting: a quoted field
/// may hold separators and doubled quotes), separated by `,`, `;` or tabs,
/// each trimmed.
fn csv_fields(line: &str) -> Vec<String> {
    let (mut fields, mut field, mut quoted) = (Vec::new(), String::new(), false);
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            '"' => quoted = !quoted,
            ',' | ';' | '\t' if !quoted => fields.push(std::mem::take(&mut field)),
            c => field.push(c),
        }
    }
    fields.push(field);
    fields.into_iter().map(|f| f.trim().to_owned()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_fields_honour_quotes() {
        assert_eq!(
            csv_fields("\"Bounced: x, by postmaster@corp.example\",\"pm1@corp.example\",hard"),
            [
                "Bounced: x, by postmaster@corp.example",
                "pm1@corp.example",
                "hard"
            ]
        );
        assert_eq!(
            csv_fields("a@b.example; \"say \"\"hi\"\"\""),
            ["a@b.example", "say \"hi\""]
        );
        assert_eq!(csv_fields("plain@x.example"), ["plain@x.example"]);
    }
}
