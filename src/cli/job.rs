//! `mailgate job <id>`: what became of one job, from its ledger record and
//! the dead-letter queue. Reads only.

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

use super::letters::{self, printable};
use super::{amqp, limiter, short_duration, time_left};
use crate::domain::JobId;
use crate::ledger::{Backend, JobRecord, JobState, Refund};
use crate::settings::Settings;

/// Prints what the ledger and the dead-letter queue hold of job `id`;
/// `Ok(false)` if they hold nothing.
pub async fn job(settings: &Settings, id: &str, json: bool) -> anyhow::Result<bool> {
    let parsed = JobId::parse(id).with_context(|| format!("{:?} is no job id", printable(id)))?;
    let Backend::Redis(ledger) = limiter(settings).await? else {
        bail!("redis.url is memory://: the ledger lives inside the worker process");
    };
    let record = (ledger.record(&parsed).await).context("reading the job's record")?;
    let (conn, _channel) = amqp(settings).await?;
    let queue = format!("{}.dead", settings.amqp.jobs_queue);
    let dead = letters::of_job(&conn, &queue, id).await;
    let _ = conn.close(200, "bye".into()).await;
    let (dead, unseen) = dead?.map_or((None, 0), |(d, u)| (Some(d), u));
    let found = record.is_some() || dead.as_ref().is_some_and(|d| !d.is_empty());
    if json {
        let record = record.as_ref().map(record_json);
        let shown = json!({"id": id, "record": record, "dead_letters": dead});
        println!("{}", letters::printable_json(&shown.to_string()));
        return Ok(found);
    }
    println!("job {}", printable(id));
    match &record {
        Some(r) => print_record(r),
        None => println!(
            "  ledger: no record. It was never admitted (rejected, invalid, expired and \
             suppressed jobs leave none), or it changed last more than limits.dedup_for ({}) ago",
            short_duration(u64::try_from(settings.limits.dedup_for.as_millis()).unwrap_or(0))
        ),
    }
    match dead.as_deref() {
        None => println!("  dead letters: {queue} does not exist"),
        Some([]) => println!("  dead letters: none in {queue}"),
        Some(dead) => {
            println!(
                "  dead letters: {} in {queue} (mailgate dead show {})",
                dead.len(),
                printable(id)
            );
            for d in dead {
                let line = format!(
                    "    {}  {}  {}",
                    d["dead_at"].as_str().unwrap_or("(time unknown)"),
                    d["reason"].as_str().unwrap_or_default(),
                    d["error"].as_str().unwrap_or_default()
                );
                println!("{}", printable(&line));
            }
        }
    }
    if unseen > 0 {
        println!(
            "  ({unseen} dead letters were held by another reader and not looked at: ask again)"
        );
    }
    Ok(found)
}

/// What a state means, in a few words.
pub(super) fn state_words(state: JobState) -> (&'static str, Option<&'static str>, &'static str) {
    match state {
        JobState::Admitted => ("admitted", None, "admitted; its send has not begun"),
        JobState::Sending => (
            "sending",
            None,
            "sending: an SMTP transaction began and its outcome is not recorded yet",
        ),
        JobState::Sent => ("sent", None, "sent: the SMTP server accepted the mail"),
        JobState::Unknown => (
            "unknown",
            None,
            "delivery unknown: the mail may have arrived; it is never sent again",
        ),
        JobState::Refunded(how) => {
            let (word, says) = match how {
                Refund::Expired => ("expired", "ended without a mail: expired"),
                Refund::Failed => ("failed", "ended without a mail: failed"),
                Refund::Invalid => ("invalid", "ended without a mail: invalid"),
                Refund::Superseded => ("superseded", "ended without a mail: superseded"),
            };
            ("refunded", Some(word), says)
        }
    }
}

pub(super) fn record_json(r: &JobRecord) -> Value {
    let (state, ended, _) = state_words(r.state);
    let now = crate::domain::now_ms();
    json!({
        "state": state,
        "ended": ended,
        // Recorded for a job that ended without a mail, not for a sent one.
        "answered": matches!(r.state, JobState::Refunded(_)).then_some(r.answered),
        "admitted_at": r.admitted_at_ms.map(letters::time),
        "attempt": r.attempt,
        "lease_until": (r.lease_until_ms > now).then(|| letters::time(r.lease_until_ms)),
        "kept_for_ms": r.kept_for_ms,
    })
}

fn print_record(r: &JobRecord) {
    let (_, _, says) = state_words(r.state);
    let answered = match (r.state, r.answered) {
        (JobState::Refunded(_), true) => "; its result was delivered",
        _ => "",
    };
    println!(
        "  ledger: {says}{answered}; its quota {}",
        match r.state {
            JobState::Refunded(_) => "was given back",
            _ => "is counted",
        }
    );
    if let Some(at) = r.admitted_at_ms {
        let attempt = r
            .attempt
            .map_or_else(String::new, |a| format!(", attempt {a}"));
        println!("  admitted: {}{attempt}", letters::time(at));
    }
    let now = crate::domain::now_ms();
    if r.lease_until_ms > now {
        println!(
            "  send lease: held until {} ({} from now)",
            letters::time(r.lease_until_ms),
            short_duration(r.lease_until_ms - now)
        );
    }
    if let Some(ms) = r.kept_for_ms {
        println!("  record kept: {} more", time_left(ms));
    }
}
