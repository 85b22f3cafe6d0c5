//! `mailgate admin purge`: removes one deployment's queues and Redis keys,
//! and nothing else. (`mailgate admin migrate`, at the end, converts what
//! earlier builds left in Redis.)
//!
//! The queues are those mailgate declares for these settings
//! ([`Topology::all`]), by name, and those earlier settings may have
//! declared (the old lease-wait queue, numbered ones past each series:
//! [`Topology::beyond`]) where their arguments prove them this deployment's
//! waiting queues, not another's named alike; the keys are those of
//! mailgate's families under `redis.key_prefix`
//! ([`families`](crate::limiter::families)), found by `SCAN` on every
//! primary, so the application's own keys under the same prefix stay.
//! Left alone: the Redis Function libraries (`mailgate_ledger_*`, which
//! other deployments on the same Redis may call), the queues jobs name in
//! `reply_to` (the producers'), and, with `--keep-results`, the results
//! queue.
//!
//! It refuses while anything consumes one of the queues (a worker, or the
//! application reading results), and then removes nothing: every queue is
//! looked at before any is deleted, and a classic queue is deleted with
//! `if-unused`, which RabbitMQ refuses atomically should a consumer have
//! attached since. (A quorum queue has no `if-unused`: it is looked at
//! again just before it is deleted.) A worker that starts during the purge
//! declares its queues again (empty) and writes keys again: the purge
//! looks for the queues once done, and says so.

use anyhow::{Context as _, bail};
use clap::Subcommand;
use serde_json::json;

use super::{amqp, in_redis};
use crate::broker::{self, BrokerError, QueueState, Topology};
use crate::ledger::Backend;
use crate::limiter::families::{self, FAMILIES, Tail, family_of, match_under};
use crate::settings::{QueueType, Settings};
use crate::store::scripts::MIGRATE;
use crate::store::{self, Conn};

/// How many keys one `SCAN` call looks at, and so at most how many one
/// `UNLINK` removes.
const SCAN_COUNT: usize = 1000;

/// How far past the last numbered queue of a series a purge looks: a
/// series has no gaps, so the first missing one ends it well before.
const MAX_BEYOND: u32 = 64;

/// `admin`'s actions.
#[derive(Subcommand, Debug)]
pub enum AdminAction {
    /// Remove this deployment's queues and Redis keys: say what would go
    /// and remove nothing, unless told to (--yes). Refuses while a worker,
    /// or any other consumer, is attached to one of the queues.
    Purge {
        /// Remove them.
        #[arg(long)]
        yes: bool,
        /// Leave the results queue (one the application, or another
        /// deployment, still uses).
        #[arg(long)]
        keep_results: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Convert what earlier builds left in Redis into this build's forms
    /// (scope logs kept as sorted sets, which this build refuses to read),
    /// with the workers stopped: say what would change and change nothing,
    /// unless told to (--yes). Refuses while a worker consumes the jobs.
    Migrate {
        /// Convert them.
        #[arg(long)]
        yes: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// Runs an `admin` action, printing what it found or did.
pub async fn admin(settings: &Settings, action: AdminAction) -> anyhow::Result<bool> {
    match action {
        AdminAction::Purge {
            yes,
            keep_results,
            json,
        } => purge(settings, yes, keep_results, json).await,
        AdminAction::Migrate { yes, json } => migrate(settings, yes, json).await,
    }
}

/// What a purge finds, or removed.
#[derive(Debug, Default)]
struct Found {
    /// The deployment's queues, with the messages each holds (held, once
    /// deleted).
    queues: Vec<QueueState>,
    /// How many keys of each of [`FAMILIES`] (`None`: no Redis to look in,
    /// `memory://`).
    keys: Option<[u64; FAMILIES.len()]>,
    /// Keys under the prefix of no family: not mailgate's, left alone.
    others: u64,
    /// Queues named like this deployment's from earlier settings whose
    /// arguments say they are not (another deployment's): left alone.
    foreign: Vec<String>,
}

impl Found {
    fn is_empty(&self) -> bool {
        self.queues.is_empty() && self.keys.is_none_or(|k| k.iter().all(|&n| n == 0))
    }
}

async fn purge(
    settings: &Settings,
    yes: bool,
    keep_results: bool,
    json: bool,
) -> anyhow::Result<bool> {
    if settings.redis.key_prefix.is_empty() && !Backend::is_memory(&settings.redis) {
        // Every family would then be matched across the whole database:
        // another application's `job:…`, `email:…` or `overrides`.
        bail!(
            "redis.key_prefix is empty, so this deployment's keys cannot be told from those of \
             anything else in the database; nothing was removed (set the prefix the workers \
             use; an empty MAILGATE__REDIS__KEY_PREFIX replaces the default)"
        );
    }
    let topology = Topology::new(settings);
    let (conn, _channel) = amqp(settings).await?;
    let redis = match Backend::is_memory(&settings.redis) {
        true => None,
        false => Some(in_redis(settings, store::connect(&settings.redis)).await?),
    };
    let (queues, foreign) = find_queues(&conn, &topology, keep_results).await?;
    let mut found = Found {
        queues,
        foreign,
        ..Found::default()
    };
    // With --yes, nothing is looked at further while a queue is in use;
    // without, what would go is shown all the same, and the refusal after.
    let consumed = match refuse_if_consumed(&found.queues, &topology) {
        Err(busy) if yes => return Err(busy),
        other => other,
    };
    let prefix = &settings.redis.key_prefix;
    if let Some(redis) = &redis {
        sweep(redis, prefix, false, &mut found).await?;
    }
    if !yes || found.is_empty() {
        report(settings, &found, Done::Looked, json);
        if let Err(busy) = consumed {
            eprintln!("{}; --yes would refuse now", super::one_line(&busy));
        }
        return Ok(found.is_empty());
    }
    let classic = settings.amqp.queue_type == QueueType::Classic;
    let mut removed = Found {
        foreign: found.foreign.clone(),
        ..Found::default()
    };
    for q in &found.queues {
        let messages = delete(&conn, q, classic).await.map_err(|e| {
            let done = removed.queues.len();
            e.context(format!(
                "{done} queues were removed before it, no keys; stop every consumer and run again"
            ))
        })?;
        removed.queues.push(QueueState {
            messages,
            ..q.clone()
        });
    }
    if let Some(redis) = &redis {
        sweep(redis, prefix, true, &mut removed).await?;
    }
    // A worker that started meanwhile declares every queue again.
    let mut back = Vec::new();
    for q in &removed.queues {
        if broker::queue_state(&conn, &q.name).await?.is_some() {
            back.push(q.name.clone());
        }
    }
    let _ = conn.close(200, "bye".into()).await;
    report(settings, &removed, Done::Removed, json);
    if !back.is_empty() {
        eprintln!(
            "{} exist again: a worker started during the purge and declared them (and may \
             have written keys); stop every worker and run the purge again",
            back.join(", ")
        );
    }
    Ok(back.is_empty())
}

/// The deployment's queues that exist: those these settings declare
/// ([`Topology::all`], but the results queue with `keep_results`), by
/// name, but its waiting queues; these, and those earlier settings of it
/// may have declared (the one lease-wait queue of earlier versions, and
/// numbered ones past each series, [`Topology::beyond`]), only where their
/// arguments prove they are its waiting queues ([`is_lane`]): a name alone
/// could be another deployment's queue. Those found by name and left are
/// returned apart.
async fn find_queues(
    conn: &lapin::Connection,
    topology: &Topology,
    keep_results: bool,
) -> anyhow::Result<(Vec<QueueState>, Vec<String>)> {
    let look = |name: String| async move {
        broker::queue_state(conn, &name)
            .await
            .with_context(|| format!("looking at queue {name:?}"))
    };
    let mut queues = Vec::new();
    // The waiting queues are looked at with the earlier ones: their names
    // are another deployment's jobs queue's that earlier versions took.
    let mut earlier = vec![topology.legacy_wait()];
    for name in topology.all() {
        if keep_results && name == topology.results {
            continue;
        }
        match topology.is_waiting(&name) {
            true => earlier.push(name),
            false => queues.extend(look(name).await?),
        }
    }
    for series in 0..2 {
        for k in 1..=MAX_BEYOND {
            let name = topology.beyond(k)[series].clone();
            if look(name.clone()).await?.is_none() {
                break;
            }
            earlier.push(name);
        }
    }
    let mut foreign = Vec::new();
    for name in earlier {
        let Some(q) = look(name.clone()).await? else {
            continue;
        };
        match is_lane(conn, topology, &name).await? {
            true => queues.push(q),
            false => foreign.push(name),
        }
    }
    Ok((queues, foreign))
}

/// Whether `queue`, which exists, is a waiting queue of this deployment's
/// jobs: declared with the arguments of one, of either type (RabbitMQ
/// declares an existing queue again only with its own arguments). Another
/// deployment's queue that its name makes look like one (its jobs queue
/// named `J.wait` or `J.retry.5`) has other arguments.
async fn is_lane(
    conn: &lapin::Connection,
    topology: &Topology,
    queue: &str,
) -> anyhow::Result<bool> {
    for kind in [topology.queue_type, other(topology.queue_type)] {
        let args = topology.lane_arguments(kind);
        if (broker::declared_with(conn, queue, args).await)
            .with_context(|| format!("looking at queue {queue:?}'s arguments"))?
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The queue type that is not `kind`.
fn other(kind: QueueType) -> QueueType {
    match kind {
        QueueType::Classic => QueueType::Quorum,
        QueueType::Quorum => QueueType::Classic,
    }
}

/// Refuses, naming each queue with consumers and how many, if any has
/// one.
fn refuse_if_consumed(queues: &[QueueState], topology: &Topology) -> anyhow::Result<()> {
    let busy: Vec<String> = (queues.iter())
        .filter(|q| q.consumers > 0)
        .map(|q| format!("{} has {} consumers", q.name, q.consumers))
        .collect();
    if busy.is_empty() {
        return Ok(());
    }
    let results = (queues.iter()).any(|q| q.consumers > 0 && q.name == topology.results);
    let hint = match results {
        true => {
            "; the results queue's may be the application reading results: stop it, or pass \
             --keep-results to leave that queue"
        }
        false => "",
    };
    bail!(
        "refusing to purge while the queues are in use: {} (stop every worker{hint}); nothing \
         was removed",
        busy.join(", ")
    )
}

/// Deletes `q`: with `if-unused` where RabbitMQ offers it (a classic
/// queue), else once a last look finds no consumer on it.
async fn delete(conn: &lapin::Connection, q: &QueueState, classic: bool) -> anyhow::Result<u32> {
    let in_use = |consumers: u32| {
        anyhow::anyhow!(
            "refusing to delete {}: {consumers} consumers attached to it during the purge \
             (a worker started?)",
            q.name
        )
    };
    if !classic {
        match broker::queue_state(conn, &q.name).await? {
            None => return Ok(0),
            Some(now) if now.consumers > 0 => return Err(in_use(now.consumers)),
            Some(_) => {}
        }
    }
    match broker::delete_queue(conn, &q.name, classic).await {
        Ok(messages) => Ok(messages),
        Err(BrokerError::Refused { .. }) => Err(in_use(1)),
        Err(e) => Err(anyhow::Error::new(e).context(format!("deleting queue {:?}", q.name))),
    }
}

/// Scans every primary for keys under `prefix`, counting those of each
/// family (and the others) into `found`, and with `remove` unlinking
/// mailgate's, a page at a time.
async fn sweep(redis: &Conn, prefix: &str, remove: bool, found: &mut Found) -> anyhow::Result<()> {
    let pattern = match_under(prefix);
    let mut counts = [0u64; FAMILIES.len()];
    let scanning =
        |node: &store::ScanNode| format!("scanning Redis ({node}) for keys under {prefix:?}");
    for node in redis
        .scan_nodes()
        .await
        .context("listing Redis's primaries")?
    {
        let mut cursor = 0;
        loop {
            let (next, keys) = redis
                .scan_page(&node, cursor, &pattern, SCAN_COUNT)
                .await
                .with_context(|| scanning(&node))?;
            let mut ours = Vec::with_capacity(keys.len());
            for key in keys {
                match family_of(prefix, &key) {
                    Some(f) => {
                        counts[f] += 1;
                        ours.push(key);
                    }
                    None => found.others += 1,
                }
            }
            if remove && !ours.is_empty() {
                redis::cmd("UNLINK")
                    .arg(&ours)
                    .query_async::<u64>(&mut redis.clone())
                    .await
                    .context("removing keys (UNLINK)")?;
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
    }
    found.keys = Some(counts);
    Ok(())
}

/// Whether a report is of what would be removed, or what was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Done {
    Looked,
    Removed,
}

/// Prints `found`: what would be removed (and that nothing was), or what
/// was; and what is left alone.
fn report(settings: &Settings, found: &Found, done: Done, json: bool) {
    let prefix = &settings.redis.key_prefix;
    let families = |keys: &[u64; FAMILIES.len()]| -> Vec<(&str, u64)> {
        (FAMILIES.iter().zip(keys))
            .filter(|(_, n)| **n > 0)
            .map(|(f, n)| (f.name, *n))
            .collect()
    };
    let keys = found.keys.as_ref().map(families).unwrap_or_default();
    if json {
        let line = json!({
            "removed": done == Done::Removed,
            "queues": found.queues.iter().map(|q| json!({"name": q.name, "messages": q.messages})).collect::<Vec<_>>(),
            "keys": keys.iter().map(|(f, n)| json!({"family": f, "keys": n})).collect::<Vec<_>>(),
            "key_prefix": prefix,
            "other_keys_left": found.others,
            "queues_left": found.foreign,
        });
        println!("{line}");
    } else {
        let verb = match done {
            Done::Looked => "would remove",
            Done::Removed => "removed",
        };
        for q in &found.queues {
            println!("{verb} queue {}  ({} messages)", q.name, q.messages);
        }
        for (family, n) in &keys {
            println!("{verb} {n} keys: {family} under {prefix:?}");
        }
    }
    eprintln!("{}", left_alone(settings, found));
    match (done, found.is_empty()) {
        (Done::Looked, true) | (Done::Removed, true) => eprintln!("nothing to remove"),
        (Done::Looked, false) => eprintln!("nothing removed; run again with --yes"),
        (Done::Removed, false) => {}
    }
}

/// What a purge leaves alone, for people.
fn left_alone(settings: &Settings, found: &Found) -> String {
    let keys = match found.keys {
        None => "redis.url is memory://: no keys to remove".to_owned(),
        Some(_) => format!(
            "{} other keys under {:?} (not mailgate's), the Redis Function libraries \
             mailgate_ledger_* (other deployments on this Redis may use them)",
            found.others, settings.redis.key_prefix
        ),
    };
    let queues = match &found.foreign[..] {
        [] => String::new(),
        names => format!(
            ", the queues {} (named like this deployment's, but their arguments are not those \
             of its waiting queues: another deployment's? delete them by hand if they are \
             this one's)",
            names.join(", ")
        ),
    };
    format!("left alone: {keys}{queues}, and the queues jobs name in reply_to (the producers')")
}

/// The families whose keys are scope logs: what `migrate` converts.
const LOG_FAMILIES: [&str; 3] = [families::EMAIL, families::IP, families::DOMAIN];

/// What `migrate` found (or did): the scope logs looked at, those of an
/// earlier build (converted, with `--yes`), and those it could not
/// convert, each with why.
#[derive(Debug, Default)]
struct Migrated {
    logs: u64,
    old: u64,
    failed: Vec<String>,
}

/// Converts the scope logs earlier builds kept as sorted sets (each in
/// one step, by `migrate.lua`, keeping its entries and its expiry), or
/// with `yes` false counts them. Ok(true) when none is left to convert.
async fn migrate(settings: &Settings, yes: bool, json: bool) -> anyhow::Result<bool> {
    if Backend::is_memory(&settings.redis) {
        bail!("redis.url is memory://: nothing is kept between runs, so nothing to migrate");
    }
    if settings.redis.key_prefix.is_empty() {
        // Another application's `email:…` sorted set is not a log.
        bail!(
            "redis.key_prefix is empty, so this deployment's keys cannot be told from those of \
             anything else in the database; nothing was converted"
        );
    }
    let topology = Topology::new(settings);
    let (conn, _channel) = amqp(settings).await?;
    let (queues, _) = find_queues(&conn, &topology, true).await?;
    if yes {
        refuse_if_consumed(&queues, &topology)?;
    }
    let redis = in_redis(settings, store::connect(&settings.redis)).await?;
    let prefix = &settings.redis.key_prefix;
    let how = if yes { "convert" } else { "look" };
    let mut found = Migrated::default();
    for node in redis
        .scan_nodes()
        .await
        .context("listing Redis's primaries")?
    {
        let mut cursor = 0;
        loop {
            let (next, keys) = redis
                .scan_page(&node, cursor, &match_under(prefix), SCAN_COUNT)
                .await
                .with_context(|| format!("scanning Redis ({node}) for keys under {prefix:?}"))?;
            for key in keys {
                let is_log = family_of(prefix, &key).is_some_and(|f| {
                    (LOG_FAMILIES.iter()).any(|l| FAMILIES[f].tail == Tail::Under(l))
                });
                if is_log {
                    convert(&redis, &key, how, &mut found).await?;
                }
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
    }
    say_migrated(&found, yes, json);
    Ok((yes || found.old == 0) && found.failed.is_empty())
}

/// Runs `migrate.lua`'s `how` on one scope log, counting it in `found`.
/// One it cannot convert (a member that is no admission) stops none of
/// the others; an outage, or an ACL that refuses the script, stops them
/// all.
async fn convert(redis: &Conn, key: &[u8], how: &str, found: &mut Migrated) -> anyhow::Result<()> {
    found.logs += 1;
    let converted: Result<i64, redis::RedisError> = MIGRATE
        .key(key)
        .arg(how)
        .invoke_async(&mut redis.clone())
        .await;
    let name = || String::from_utf8_lossy(key).into_owned();
    match converted {
        Ok(n) => found.old += u64::try_from(n).unwrap_or(0),
        // (A user the ACL refuses the script is refused for every key.)
        Err(e)
            if e.code().is_some_and(|c| c != "NOPERM")
                && !store::StoreError::from(e.clone()).is_outage() =>
        {
            let why = format!("{}: {}", name(), crate::report::one_line(&e));
            found.failed.push(why);
        }
        Err(e) => return Err(e).with_context(|| format!("{how}: {}", name())),
    }
    Ok(())
}

/// Prints what `migrate` found or did.
fn say_migrated(found: &Migrated, yes: bool, json: bool) {
    let Migrated { logs, old, failed } = found;
    if json {
        let done = if yes { "converted" } else { "to_convert" };
        println!(
            "{}",
            json!({ "scope_logs": logs, done: old, "not_converted": failed })
        );
        return;
    }
    let verb = if yes {
        "converted"
    } else {
        "would be converted (--yes converts them)"
    };
    println!(
        "{old} of {logs} scope logs were of an earlier build (sorted sets): {verb}; the others \
         are in this build's form"
    );
    for why in failed {
        println!("not converted (left as it is): {why}");
    }
}
