//! `mailgate dead`: list, show, replay and purge the dead-letter queue's
//! messages. Each command looks at the messages the queue held when it
//! began, one at a time, and takes only those it acts on: the rest go back
//! in their order ([`Browse`]). Safe while workers run: they never read
//! the dead-letter queue, and two commands never see the same message at
//! once.

use std::io::Write as _;

use anyhow::Context as _;
use clap::{ArgGroup, Args, Subcommand};
use lapin::message::Delivery;
use serde_json::{Value, json};

use super::amqp;
use crate::broker::{Browse, DeadLetter};
use crate::domain::DeadReason;
use crate::redact::mask_emails;
use crate::settings::Settings;

/// `dead`'s actions.
#[derive(Subcommand, Debug)]
pub enum DeadAction {
    /// List dead letters (id, masked mailbox, reason, attempts, when);
    /// takes nothing and leaves their order as it was.
    List {
        #[command(flatten)]
        /// Which to list (all, without options).
        filter: Filter,
        /// Print JSON lines instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Show one job's dead letters in full (its code hidden, its mailbox
    /// masked); takes nothing. Exits 1 if it has none.
    Show {
        /// The job's id.
        id: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Move dead letters back to the jobs queue as fresh jobs (attempt 1,
    /// answered where the original would have been). The ledger keeps its
    /// promise: an id whose mail went out is answered, never mailed again.
    Replay {
        #[command(flatten)]
        /// Which to replay.
        which: Which,
        /// Say what would be replayed, and replay nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Delete dead letters for good.
    Purge {
        #[command(flatten)]
        /// Which to delete.
        which: Which,
        /// Say what would be deleted, and delete nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

/// Which dead letters a command looks at; every option narrows the choice.
#[derive(Args, Debug, Default)]
pub struct Filter {
    /// Only those of this job id (repeat for several).
    #[arg(long = "id", value_name = "ID")]
    pub ids: Vec<String>,
    /// Only those dead-lettered for this reason (repeat for several):
    /// unreadable, failed, unanswerable, refused, panic, delivery_limit,
    /// other.
    #[arg(long, value_parser = reason_of, value_name = "REASON")]
    pub reason: Vec<DeadReason>,
    /// Only those dead-lettered since a time (2026-11-27T10:00:00Z) or
    /// within an age (2h: the last two hours). A dead letter of a version
    /// that recorded no time never matches.
    #[arg(long, value_parser = since_ms, value_name = "WHEN")]
    pub since: Option<u64>,
}

/// [`Filter`], where one choice must be made: the options, or `--all`.
#[derive(Args, Debug)]
#[command(group(ArgGroup::new("which").required(true).multiple(true).args(["ids", "reason", "since", "all"])))]
pub struct Which {
    #[command(flatten)]
    /// The options.
    pub filter: Filter,
    /// Every dead letter (the options still narrow it).
    #[arg(long)]
    pub all: bool,
}

fn reason_of(word: &str) -> Result<DeadReason, String> {
    DeadReason::parse(word).ok_or_else(|| {
        let words: Vec<_> = DeadReason::ALL.iter().map(|r| r.as_str()).collect();
        format!("one of {}", words.join(", "))
    })
}

fn since_ms(text: &str) -> Result<u64, String> {
    if let Ok(age) = humantime::parse_duration(text) {
        let age = u64::try_from(age.as_millis()).unwrap_or(u64::MAX);
        return Ok(crate::domain::now_ms().saturating_sub(age));
    }
    text.parse::<jiff::Timestamp>()
        .map(|t| u64::try_from(t.as_millisecond()).unwrap_or(0))
        .map_err(|_| "a time (2026-11-27T10:00:00Z) or an age (2h, 30m)".into())
}

/// One dead letter as the commands see it.
struct Entry {
    /// The body's `id`, if it is a JSON object with a string id.
    id: Option<String>,
    /// The body as JSON, if it is.
    job: Option<Value>,
    dead: DeadLetter,
}

impl Entry {
    fn read(delivery: &Delivery) -> Entry {
        let job: Option<Value> = serde_json::from_slice(&delivery.data).ok();
        let id = job
            .as_ref()
            .and_then(|j| j.get("id"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        Entry {
            id,
            job,
            dead: DeadLetter::read(delivery),
        }
    }

    fn field(&self, name: &str) -> Option<&str> {
        self.job.as_ref()?.get(name)?.as_str()
    }

    /// The body's mailbox, masked as the logs mask it.
    fn mailbox(&self) -> Option<String> {
        self.field("email").map(mask_emails)
    }

    fn matches(&self, f: &Filter) -> bool {
        (f.ids.is_empty() || self.id.as_ref().is_some_and(|id| f.ids.contains(id)))
            && (f.reason.is_empty() || f.reason.contains(&self.dead.reason))
            && f.since
                .is_none_or(|since| self.dead.dead_at_ms.is_some_and(|at| at >= since))
    }

    /// A line of JSON for `list`.
    fn summary(&self) -> Value {
        json!({
            "id": self.id,
            "email": self.mailbox(),
            "purpose": self.field("purpose"),
            "reason": self.dead.reason.as_str(),
            "error": self.dead.error.as_deref().map(mask_emails),
            "attempts": self.dead.attempts,
            "dead_at": self.dead.dead_at_ms.map(time),
        })
    }

    /// A line of text for `list`, `replay` and `purge`.
    fn line(&self) -> String {
        format!(
            "{:<20}  {:<14} {:>3}  {}  {}  {}",
            self.dead
                .dead_at_ms
                .map_or_else(|| "(time unknown)".into(), time),
            self.dead.reason.as_str(),
            self.dead
                .attempts
                .map_or_else(|| "-".into(), |n| n.to_string()),
            self.id.as_deref().unwrap_or("(no id)"),
            self.mailbox().unwrap_or_else(|| "-".into()),
            self.dead
                .error
                .as_deref()
                .map(mask_emails)
                .unwrap_or_default(),
        )
    }
}

/// ms since the epoch as RFC 3339, to the second.
pub(super) fn time(ms: u64) -> String {
    i64::try_from(ms)
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        .map_or_else(|| ms.to_string(), |t| format!("{t:.0}"))
}

/// Runs a `dead` action, printing what it found or did.
pub async fn dead(settings: &Settings, action: DeadAction) -> anyhow::Result<bool> {
    let queue = format!("{}.dead", settings.amqp.jobs_queue);
    let (conn, _channel) = amqp(settings).await?;
    let mut browse = Browse::open(&conn, &queue).await.with_context(|| {
        format!("opening {queue:?} (has a worker ever run with these settings?)")
    })?;
    let held = browse.left();
    let outcome = match action {
        DeadAction::List { filter, json } => list(&mut browse, &filter, json).await,
        DeadAction::Show { id, json } => show(&mut browse, &id, json).await,
        DeadAction::Replay { which, dry_run } => {
            let to = settings.amqp.jobs_queue.as_str();
            act(&mut browse, &which, Act::Replay { to }, dry_run).await
        }
        DeadAction::Purge { which, dry_run } => act(&mut browse, &which, Act::Purge, dry_run).await,
    };
    // Whatever happened, what was not taken goes back.
    let closed = browse.close().await;
    let _ = conn.close(200, "bye".into()).await;
    let found = outcome?;
    closed.with_context(|| format!("putting back what was not taken from {queue:?}"))?;
    eprintln!("({held} dead letters in {queue} when this began)");
    Ok(found)
}

async fn list(browse: &mut Browse, filter: &Filter, json: bool) -> anyhow::Result<bool> {
    let mut out = std::io::stdout();
    if !json {
        writeln!(
            out,
            "{:<20}  {:<14} {:>3}  id  mailbox  error",
            "dead-lettered at", "reason", "tries"
        )?;
    }
    let mut n = 0u64;
    while let Some(d) = browse.next().await? {
        let e = Entry::read(&d);
        if !e.matches(filter) {
            continue;
        }
        n += 1;
        match json {
            true => writeln!(out, "{}", e.summary())?,
            false => writeln!(out, "{}", e.line())?,
        }
    }
    eprintln!("{n} listed");
    Ok(true)
}

async fn show(browse: &mut Browse, id: &str, json: bool) -> anyhow::Result<bool> {
    let mut found = false;
    let mut out = std::io::stdout();
    while let Some(d) = browse.next().await? {
        let e = Entry::read(&d);
        if e.id.as_deref() != Some(id) {
            continue;
        }
        found = true;
        let mut job = e.job.clone().unwrap_or(Value::Null);
        if let Some(fields) = job.as_object_mut() {
            if fields.contains_key("code") {
                fields.insert("code".into(), json!("(hidden)"));
            }
            if let Some(mailbox) = e.mailbox() {
                fields.insert("email".into(), json!(mailbox));
            }
        }
        let p = &d.properties;
        let header = |name: &str| {
            p.headers()
                .as_ref()
                .and_then(|h| h.inner().get(name))
                .and_then(|v| match v {
                    lapin::types::AMQPValue::LongString(s) => {
                        Some(String::from_utf8_lossy(s.as_bytes()).into_owned())
                    }
                    _ => None,
                })
        };
        let reply_to = p
            .reply_to()
            .as_ref()
            .map(|s| s.to_string())
            .or_else(|| header(crate::broker::REPLY_TO_HEADER));
        let correlation_id = p
            .correlation_id()
            .as_ref()
            .map(|s| s.to_string())
            .or_else(|| header(crate::broker::CORRELATION_HEADER));
        let mut all = e.summary();
        all["reply_to"] = json!(reply_to);
        all["correlation_id"] = json!(correlation_id);
        all["job"] = job;
        if json {
            writeln!(out, "{all}")?;
        } else {
            writeln!(out, "{}", serde_json::to_string_pretty(&all)?)?;
        }
    }
    if !found {
        eprintln!("no dead letter of {id:?}");
    }
    Ok(found)
}

/// What `replay` and `purge` do with each dead letter they choose.
enum Act<'a> {
    /// Publish it to this queue as a fresh job, then take it.
    Replay { to: &'a str },
    /// Take it.
    Purge,
}

async fn act(
    browse: &mut Browse,
    which: &Which,
    act: Act<'_>,
    dry_run: bool,
) -> anyhow::Result<bool> {
    let (verb, done) = match (&act, dry_run) {
        (Act::Replay { .. }, false) => ("replayed", "replayed"),
        (Act::Replay { .. }, true) => ("would replay", "would replay"),
        (Act::Purge, false) => ("purged", "purged"),
        (Act::Purge, true) => ("would purge", "would purge"),
    };
    let (mut n, mut skipped) = (0u64, 0u64);
    let mut out = std::io::stdout();
    while let Some(d) = browse.next().await? {
        let e = Entry::read(&d);
        if !e.matches(&which.filter) {
            continue;
        }
        if let Act::Replay { to } = act {
            // Its body is no job: it would come straight back.
            if e.dead.reason == DeadReason::Unreadable || e.id.is_none() {
                skipped += 1;
                continue;
            }
            if !dry_run {
                browse
                    .publish(to, &d.data, DeadLetter::replay_properties(&d))
                    .await
                    .with_context(|| format!("replaying to {to:?}"))?;
            }
        }
        if !dry_run {
            browse.take(&d).await?;
        }
        n += 1;
        writeln!(out, "{verb}  {}", e.line())?;
    }
    writeln!(out, "{done} {n} dead letters")?;
    if skipped > 0 {
        writeln!(
            out,
            "left {skipped} unreadable dead letters (no job in their body to replay: \
             fix and publish them again, then purge them with --reason unreadable)"
        )?;
    }
    Ok(true)
}

/// The dead letters of job `id` in `queue`, as `dead list --json` prints
/// them; looks, and takes nothing.
pub(super) async fn of_job(
    conn: &lapin::Connection,
    queue: &str,
    id: &str,
) -> anyhow::Result<Vec<Value>> {
    let mut browse = Browse::open(conn, queue)
        .await
        .with_context(|| format!("opening {queue:?}"))?;
    let mut found = Vec::new();
    let mut looked = Ok(());
    loop {
        match browse.next().await {
            Ok(Some(d)) => {
                let e = Entry::read(&d);
                if e.id.as_deref() == Some(id) {
                    found.push(e.summary());
                }
            }
            Ok(None) => break,
            Err(e) => {
                looked = Err(e);
                break;
            }
        }
    }
    browse.close().await?;
    looked?;
    Ok(found)
}
