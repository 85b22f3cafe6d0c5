//! `mailgate dead`: list, show, replay and purge the dead-letter queue's
//! messages. Each command looks at the messages the queue held when it
//! began, one at a time, and takes only those it acts on: the rest stay,
//! in their order ([`Browse`]). Safe while workers run: they never read
//! the dead-letter queue, and two commands never act on the same message.

use std::io::Write as _;
use std::time::Instant;

use anyhow::{Context as _, bail};
use clap::{ArgGroup, Args, Subcommand};
use lapin::message::Delivery;
use serde_json::json;

use super::letters::{Entry, printable, printable_json};
use super::{amqp, limiter};
use crate::broker::{Browse, DeadLetter};
use crate::domain::{DeadReason, JobId, now_ms};
use crate::ledger::{Backend, Ledger as _, RedisLedger};
use crate::limiter::CLOCK_SLACK_MS;
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

impl Entry {
    fn matches(&self, f: &Filter) -> bool {
        (f.ids.is_empty() || self.id.as_ref().is_some_and(|id| f.ids.contains(id)))
            && (f.reason.is_empty() || f.reason.contains(&self.dead.reason))
            && f.since
                .is_none_or(|since| self.dead.dead_at_ms.is_some_and(|at| at >= since))
    }
}

/// Runs a `dead` action, printing what it found or did; stops taking
/// messages once `stop` completes (Ctrl-C), never between a replay's
/// publish and the removal of its dead letter.
pub async fn dead(
    settings: &Settings,
    action: DeadAction,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<bool> {
    let queue = format!("{}.dead", settings.amqp.jobs_queue);
    // A replay asks the ledger whether each job's mail may have gone out.
    let recall = match &action {
        DeadAction::Replay { .. } => Some(Recall::open(settings).await?),
        _ => None,
    };
    let (conn, _channel) = amqp(settings).await?;
    let mut browse = Browse::open(&conn, &queue).await.with_context(|| {
        format!("opening {queue:?} (has a worker ever run with these settings?)")
    })?;
    let mut look = Look {
        browse: &mut browse,
        stop: std::pin::pin!(stop),
        stopped: false,
    };
    let outcome = match action {
        DeadAction::List { filter, json } => list(&mut look, &filter, json).await,
        DeadAction::Show { id, json } => show(&mut look, &id, json).await,
        DeadAction::Replay { which, dry_run } => {
            let act = Act::Replay {
                to: settings.amqp.jobs_queue.as_str(),
                recall: recall.as_ref(),
            };
            act_on(&mut look, &which, act, dry_run).await
        }
        DeadAction::Purge { which, dry_run } => {
            act_on(&mut look, &which, Act::Purge, dry_run).await
        }
    };
    let stopped = look.stopped;
    let (depth, unseen) = (browse.depth(), browse.unseen());
    let closed = browse.close().await;
    let _ = conn.close(200, "bye".into()).await;
    let found = outcome?;
    closed.with_context(|| format!("closing the look at {queue:?}"))?;
    eprintln!("({depth} dead letters in {queue} when this began)");
    if unseen > 0 && !stopped {
        eprintln!(
            "{unseen} of them were held by another reader meanwhile (another `mailgate dead` \
             or `mailgate job`, or a consumer) and were not looked at: run it again"
        );
    }
    if stopped {
        bail!("interrupted: the dead letters not looked at are as they were");
    }
    Ok(found)
}

/// A look at the dead-letter queue that a stop signal ends between two
/// messages.
struct Look<'a, S> {
    browse: &'a mut Browse,
    stop: std::pin::Pin<&'a mut S>,
    stopped: bool,
}

impl<S: std::future::Future<Output = ()>> Look<'_, S> {
    /// The next dead letter, or `None` at the end or once stopped.
    async fn next(&mut self) -> anyhow::Result<Option<Delivery>> {
        if self.stopped {
            return Ok(None);
        }
        tokio::select! {
            biased;
            () = &mut self.stop => {
                self.stopped = true;
                Ok(None)
            }
            next = self.browse.next() => Ok(next?),
        }
    }
}

async fn list<S: std::future::Future<Output = ()>>(
    look: &mut Look<'_, S>,
    filter: &Filter,
    json: bool,
) -> anyhow::Result<bool> {
    let mut out = std::io::stdout();
    if !json {
        writeln!(
            out,
            "{:<20}  {:<14} {:>3}  id  mailbox  error",
            "dead-lettered at", "reason", "tries"
        )?;
    }
    let mut n = 0u64;
    while let Some(d) = look.next().await? {
        let e = Entry::read(&d);
        look.browse.keep(&d).await?;
        if !e.matches(filter) {
            continue;
        }
        n += 1;
        match json {
            true => writeln!(out, "{}", printable_json(&e.summary().to_string()))?,
            false => writeln!(out, "{}", e.line())?,
        }
    }
    eprintln!("{n} listed");
    Ok(true)
}

async fn show<S: std::future::Future<Output = ()>>(
    look: &mut Look<'_, S>,
    id: &str,
    json: bool,
) -> anyhow::Result<bool> {
    let mut found = false;
    let mut out = std::io::stdout();
    while let Some(d) = look.next().await? {
        let e = Entry::read(&d);
        look.browse.keep(&d).await?;
        if e.id.as_deref() != Some(id) {
            continue;
        }
        found = true;
        let p = &d.properties;
        let header = |name: &str| {
            (p.headers().as_ref())
                .and_then(|h| h.inner().get(name))
                .and_then(|v| match v {
                    lapin::types::AMQPValue::LongString(s) => {
                        Some(String::from_utf8_lossy(s.as_bytes()).into_owned())
                    }
                    _ => None,
                })
        };
        let reply_to = (p.reply_to().as_ref().map(|s| s.to_string()))
            .or_else(|| header(crate::broker::REPLY_TO_HEADER));
        let correlation_id = (p.correlation_id().as_ref().map(|s| s.to_string()))
            .or_else(|| header(crate::broker::CORRELATION_HEADER));
        let mut all = e.summary();
        all["reply_to"] = json!(reply_to);
        all["correlation_id"] = json!(correlation_id);
        all["job"] = e.job_shown();
        // JSON escapes every control character.
        match json {
            true => writeln!(out, "{}", printable_json(&all.to_string()))?,
            // Line by line: serde_json breaks lines only between values,
            // never in a string, so the layout stays.
            false => {
                for line in serde_json::to_string_pretty(&all)?.lines() {
                    writeln!(out, "{}", printable_json(line))?;
                }
            }
        }
    }
    if !found {
        eprintln!("no dead letter of {}", printable(id));
    }
    Ok(found)
}

/// What `replay` and `purge` do with each dead letter they choose.
enum Act<'a> {
    /// Publish it to `to` as a fresh job, then take it, unless `recall`
    /// says a job's mail may have gone out (`None`: replay nothing that
    /// needs it).
    Replay {
        to: &'a str,
        recall: Option<&'a Recall>,
    },
    /// Take it.
    Purge,
}

/// What became of the dead letters a `replay` or `purge` chose.
#[derive(Default)]
struct Tally {
    done: u64,
    unreadable: u64,
    forgotten: u64,
    /// Left because the ledger's clock could not be trusted, and why.
    untimed: u64,
    untimed_why: String,
}

async fn act_on<S: std::future::Future<Output = ()>>(
    look: &mut Look<'_, S>,
    which: &Which,
    act: Act<'_>,
    dry_run: bool,
) -> anyhow::Result<bool> {
    let verb = match (&act, dry_run) {
        (Act::Replay { .. }, false) => "replayed",
        (Act::Replay { .. }, true) => "would replay",
        (Act::Purge, false) => "purged",
        (Act::Purge, true) => "would purge",
    };
    let mut tally = Tally::default();
    let mut out = std::io::stdout();
    while let Some(d) = look.next().await? {
        let e = Entry::read(&d);
        let acts = e.matches(&which.filter) && eligible(&act, &e, &mut tally).await?;
        match acts && !dry_run {
            true => act_one(look.browse, &act, &e, &d).await?,
            false => look.browse.keep(&d).await?,
        }
        if acts {
            tally.done += 1;
            writeln!(out, "{verb}  {}", e.line())?;
        }
    }
    writeln!(out, "{verb} {} dead letters", tally.done)?;
    if tally.unreadable > 0 {
        writeln!(
            out,
            "left {} unreadable dead letters (no job in their body to replay: fix and publish \
             them again, then purge them with --reason unreadable)",
            tally.unreadable
        )?;
    }
    if tally.forgotten > 0 {
        writeln!(
            out,
            "left {} dead letters whose id the ledger no longer remembers (its record lapsed, \
             or RabbitMQ dead-lettered them, or a version that did not note it did): their id \
             may have been mailed, and a replay could mail it a second time; publish them \
             again under a new id if they must go out, or purge them",
            tally.forgotten
        )?;
    }
    if tally.untimed > 0 {
        writeln!(
            out,
            "left {} dead letters that only the ledger's clock can tell were never mailed, \
             which cannot be trusted now: {}; run the replay again once `mailgate clock` says \
             the clocks agree",
            tally.untimed, tally.untimed_why
        )?;
    }
    Ok(true)
}

/// Whether `act` may be done to `e`, a chosen dead letter: a purge always;
/// a replay unless its body is no job (it would come straight back), or
/// it could mail a job twice ([`Recall::safe`]). Counts those left.
async fn eligible(act: &Act<'_>, e: &Entry, tally: &mut Tally) -> anyhow::Result<bool> {
    let Act::Replay { recall, .. } = act else {
        return Ok(true);
    };
    let Some(id) =
        e.id.as_deref()
            .filter(|_| e.dead.reason != DeadReason::Unreadable)
    else {
        tally.unreadable += 1;
        return Ok(false);
    };
    let Some(recall) = recall else {
        tally.forgotten += 1;
        return Ok(false);
    };
    match recall.safe(e, id).await? {
        Safe::Yes => Ok(true),
        Safe::Forgotten => {
            tally.forgotten += 1;
            Ok(false)
        }
        Safe::Untimed(why) => {
            tally.untimed += 1;
            tally.untimed_why = why;
            Ok(false)
        }
    }
}

/// Replays or purges `d` (read as `e`): it leaves the dead-letter queue.
async fn act_one(browse: &Browse, act: &Act<'_>, e: &Entry, d: &Delivery) -> anyhow::Result<()> {
    if let Act::Replay { to, .. } = act {
        let mut props = DeadLetter::replay_properties(d);
        if e.dead.reason == DeadReason::Unanswerable {
            // Its mail went out and its `sent` was lost: the replay is the
            // original asking again, and is answered `sent`.
            let mut headers = props.headers().clone().unwrap_or_default();
            headers.insert(
                crate::broker::REDELIVERED_HEADER.into(),
                lapin::types::AMQPValue::Boolean(true),
            );
            props = props.with_headers(headers);
        }
        (browse.publish(to, &d.data, props).await)
            .with_context(|| format!("replaying to {to:?}"))?;
    }
    browse.take(d).await?;
    Ok(())
}

/// What a replay asks of the ledger: whether a job may have been mailed.
struct Recall {
    /// The ledger's records (`None` with `memory://`: the worker's memory,
    /// which no tool reaches).
    ledger: Option<RedisLedger>,
    /// The ledger's clock (ms) when read, and this host's monotonic clock
    /// then; or why it cannot be trusted (it and this host's disagree by
    /// more than `redis.max_clock_skew`, or a mark of a step stands).
    clock: Result<(u64, Instant), String>,
    /// How long a record that lets a letter be replayed is kept from now,
    /// ms: `limits.dedup_for` and the clock's slack, as a write keeps it.
    hold_ms: u64,
}

/// Whether replaying a dead letter can mail nothing twice.
enum Safe {
    /// Yes: the ledger decides it as any message of its id.
    Yes,
    /// The ledger may have forgotten a mail of its id.
    Forgotten,
    /// Only the ledger's clock could tell, and it cannot be trusted now.
    Untimed(String),
}

impl Recall {
    /// The ledger of `settings`, with its clock read now.
    async fn open(settings: &Settings) -> anyhow::Result<Self> {
        let dedup_ms = u64::try_from(settings.limits.dedup_for.as_millis()).unwrap_or(u64::MAX);
        let hold_ms = dedup_ms.saturating_add(CLOCK_SLACK_MS);
        let ledger = match limiter(settings).await? {
            Backend::Redis(l) => l,
            // The worker's own clock, on this host (a trial's one worker).
            Backend::Memory(_) => {
                return Ok(Recall {
                    ledger: None,
                    clock: Ok((now_ms(), Instant::now())),
                    hold_ms,
                });
            }
        };
        let clock = Self::read_clock(&ledger, settings).await?;
        Ok(Recall {
            ledger: Some(ledger),
            clock,
            hold_ms,
        })
    }

    /// Redis's clock (the latest of its primaries'), if it agrees with this
    /// host's and no mark stands (a step may have expired records early).
    async fn read_clock(
        ledger: &RedisLedger,
        settings: &Settings,
    ) -> anyhow::Result<Result<(u64, Instant), String>> {
        use crate::ledger::clock::Verdict;
        let Some(readings) = ledger.clocks().await? else {
            return Ok(Err("this store keeps no clock".into()));
        };
        let taken = Instant::now();
        let mark = ledger.watch_clock(false, None).await?;
        let max_ms = u64::try_from(settings.redis.max_clock_skew.as_millis()).unwrap_or(u64::MAX);
        Ok(match Verdict::of(&readings, mark, max_ms) {
            Verdict::Agrees => {
                let latest = readings.nodes.iter().map(|(_, t)| *t).max();
                latest
                    .map(|t| (t, taken))
                    .ok_or_else(|| "no Redis clock read".into())
            }
            untrusted => Err(untrusted.to_string()),
        })
    }

    /// Whether replaying `e` (job `id`) can mail nothing twice. Yes when
    /// the ledger holds the job's record (it decides the replay as any
    /// message of the id; the record is kept `hold_ms` more, so it is
    /// still there when a worker takes the job), or when the worker that
    /// dead-lettered it found no record ([`Unrecorded`](crate::broker::Unrecorded))
    /// less than the records' floor ago by the ledger's own clock (any
    /// admission of the id since, by any worker, would still be recorded).
    /// Never from the dead letter's age by this host's clock, nor from any
    /// `dedup_for`: a record lapses by the ledger's clock and the setting
    /// of the worker that wrote it, and a missing one may be the job's own
    /// mail (one whose result was lost) or another message's of the id.
    async fn safe(&self, e: &Entry, id: &str) -> anyhow::Result<Safe> {
        if let (Some(ledger), Ok(id)) = (&self.ledger, JobId::parse(id))
            && ledger.hold_record(&id, self.hold_ms).await?
        {
            return Ok(Safe::Yes);
        }
        let Some(unrecorded) = e.dead.unrecorded.filter(|_| !e.dead.by_rabbitmq) else {
            return Ok(Safe::Forgotten);
        };
        let (at, taken) = match &self.clock {
            Ok(clock) => *clock,
            Err(why) => return Ok(Safe::Untimed(why.clone())),
        };
        let elapsed = u64::try_from(taken.elapsed().as_millis()).unwrap_or(u64::MAX);
        let now = at.saturating_add(elapsed);
        Ok(match now < unrecorded.proves_until(CLOCK_SLACK_MS) {
            true => Safe::Yes,
            false => Safe::Forgotten,
        })
    }
}
