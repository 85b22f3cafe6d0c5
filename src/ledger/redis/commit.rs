//! Admissions the worker decided, written by compare-and-set: where the
//! snapshot found no record of the id, no suppression and room in every
//! scope (`snapshot::Found::Fits`), one small call per batch
//! (`commit.lua`, the ledger's op "commit") writes the record and the logs
//! if none of those facts changed since, stamped with Redis's own clock.
//! The decision is Rust's (the snapshot's `judge_scope`, the one both
//! ledgers run); Lua only checks and writes. A fact that changed (another
//! admission in a log, a record, a suppression, a clock that stepped back)
//! answers `changed`, and the admission goes on to the script's "admit",
//! which decides again atomically: the compare-and-set only ever admits
//! what the script would have.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use tokio::sync::{mpsc, oneshot};

use super::batch::{
    BATCHED, Callee, Queued, answer_each, clock_arg, eval_waiting, gather, oldest_asked,
};
use super::replicas::Replication;
use super::reply::Code;
use super::snapshot::Fits;
use super::{RedisLedger, attempt, call_id};
use crate::ledger::{Admission, Entry, Fingerprint, JobRef, LedgerError, Verdict};
use crate::limiter::{Applied, Clock, Judged, Keyspace, judge_scope, room_of};
use crate::store::Conn;
use crate::store::scripts::Calls;

/// One admission on its way to a "commit".
pub(super) struct Put {
    clock: Clock,
    asked: Instant,
    /// Its record key, then its suppression keys.
    keys: Vec<String>,
    /// Its values but the shape and the heads (`commit.lua`'s first 5).
    values: [String; 5],
    /// Each of its logs: its key, the head the snapshot read (`None`:
    /// found empty), its keep (ms).
    logs: Vec<(String, Option<String>, u64)>,
    reply: oneshot::Sender<Result<Committed, LedgerError>>,
}

/// The most keeps one call names: an item names each of its logs' by one
/// letter from 'A' (`commit.lua`).
const KEEPS_MAX: usize = 58;

impl Queued for Put {
    fn clock(&self) -> Option<Clock> {
        Some(self.clock)
    }

    fn asked(&self) -> Instant {
        self.asked
    }
}

/// What a "commit" answered for one admission.
#[derive(Debug, Clone, Copy)]
pub(super) struct Committed {
    /// The call's instant (ms).
    now_ms: u64,
    /// `ledger.lua`'s code: admitted, changed, expired or unmigrated.
    code: i64,
    /// On admitted: its admission time.
    at: i64,
    /// Replicas that acknowledged the call, if it waited and too few did.
    unreplicated: Option<i64>,
}

/// Runs the queued admissions' commits, one call per batch, until every
/// sender is gone.
pub(super) async fn committing(
    rx: mpsc::Receiver<Put>,
    conn: Conn,
    keys: Arc<Keyspace>,
    replication: Replication,
    calls: Calls,
) {
    gather(rx, BATCHED, move |batch, clock| {
        let (mut conn, keys) = (conn.clone(), keys.clone());
        async move {
            let answers = run(&mut conn, &keys, (replication, calls), clock, &batch).await;
            answer_each(batch, answers, |p| p.reply);
        }
    })
    .await;
}

/// One "commit" of `batch`.
async fn run(
    conn: &mut Conn,
    keys: &Keyspace,
    (replication, calls): (Replication, Calls),
    clock: Clock,
    batch: &[Put],
) -> Result<Vec<Committed>, LedgerError> {
    let mut keeps: Vec<u64> = Vec::new();
    let mut item_keys: Vec<&str> = Vec::new();
    let mut args: Vec<std::borrow::Cow<'_, str>> = Vec::new();
    for p in batch {
        // Its record and suppression keys, then its logs found empty.
        let (empty, read): (Vec<_>, Vec<_>) = p.logs.iter().partition(|(_, h, _)| h.is_none());
        let mut shape = format!("{}{}", p.keys.len() - 1, empty.len());
        item_keys.extend(p.keys.iter().map(String::as_str));
        for (key, _, keep) in empty.iter().chain(&read) {
            let at = keeps.iter().position(|k| k == keep).unwrap_or_else(|| {
                keeps.push(*keep);
                keeps.len() - 1
            });
            // ('A' + at: at most KEEPS_MAX, checked below.)
            shape.push(char::from(b'A' + (at as u8).min(KEEPS_MAX as u8)));
            item_keys.push(key.as_str());
        }
        args.extend(p.values.iter().map(|v| v.as_str().into()));
        args.push(shape.into());
        args.extend(
            read.iter()
                .filter_map(|(_, h, _)| h.as_deref())
                .map(Into::into),
        );
    }
    if keeps.len() > KEEPS_MAX {
        // Never with settings as they can be (a keep per scope); the
        // script decides each.
        return Ok(batch.iter().map(|_| Committed::changed()).collect());
    }
    let code = Callee::ledger(calls);
    let mut eval = redis::cmd(code.command());
    eval.arg(code.name())
        .arg(item_keys.len())
        .arg(item_keys)
        .arg("commit")
        .arg(clock_arg(clock, keys, oldest_asked(batch)))
        .arg(keys.record_keep_ms())
        .arg(keys.lease_ms())
        .arg(
            keeps
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(" "),
        )
        .arg(args.iter().map(AsRef::as_ref).collect::<Vec<&str>>());
    // Every admission sends at once: the replicas must have its record
    // before the mail goes out.
    let (reply, unreplicated) = eval_waiting(conn, Some(code), eval, replication, true).await?;
    let reply: Vec<i64> = redis::from_redis_value(reply)
        .map_err(|e| LedgerError::Protocol(format!("a commit's reply: {e}")))?;
    let bad = || {
        LedgerError::Protocol(format!(
            "{} values for {} commits",
            reply.len(),
            batch.len()
        ))
    };
    let (&now, items) = reply.split_first().ok_or_else(bad)?;
    if items.len() != 2 * batch.len() {
        return Err(bad());
    }
    let now_ms = u64::try_from(now).map_err(|_| bad())?;
    Ok((items.chunks_exact(2))
        .map(|two| Committed {
            now_ms,
            code: two[0],
            at: two[1],
            unreplicated,
        })
        .collect())
}

impl Committed {
    /// Left to the script, as if a fact had changed.
    fn changed() -> Self {
        Committed {
            now_ms: 0,
            code: Code::Changed as i64,
            at: 0,
            unreplicated: None,
        }
    }
}

impl RedisLedger {
    /// Writes `entry`'s admission, which the snapshot found room for
    /// (`fits`; `applicable`: its scopes, in the order the snapshot read
    /// them), if nothing it was decided from changed: the admission, or
    /// `None` if something did (the script decides).
    pub(super) async fn commit(
        &self,
        entry: &Entry<'_>,
        (clock, asked): (Clock, Instant),
        applicable: &[Applied],
        fits: Fits,
    ) -> Result<Option<Admission>, LedgerError> {
        let Some(commits) = self.commits.as_ref() else {
            return Ok(None);
        };
        let (job, request) = (&entry.job, &entry.job.request);
        let sups = match self.keys.checks_suppression() {
            true => self.keys.suppression_keys(request.email),
            false => Vec::new(),
        };
        let mut keys = vec![self.keys.record_key(request.id)];
        keys.extend(sups);
        // Each log but a deny's (which reads none and writes none): found
        // empty, or its head as read.
        let logs = (applicable.iter().zip(&fits.logs))
            .filter_map(|(a, seen)| {
                let head = seen.head.as_ref()?;
                let head = (seen.read.count() > 0).then(|| head.clone());
                Some((a.key.clone(), head, a.set.keep_ms))
            })
            .collect();
        let (fingerprint, call) = (Fingerprint::of(request), call_id());
        let values = [
            request.id.as_str().to_owned(),
            fingerprint.as_str().to_owned(),
            format!("{}|{}|{call}", job.ticket.as_str(), attempt(job)),
            (entry.expires_at_ms.map(|ms| ms.to_string())).unwrap_or_default(),
            fits.seen.to_string(),
        ];
        let (reply, answer) = oneshot::channel();
        let put = Put {
            clock,
            asked,
            keys,
            values,
            logs,
            reply,
        };
        commits
            .send(put)
            .await
            .map_err(|_| super::batch::stopped())?;
        let c = answer.await.map_err(|_| super::batch::stopped())??;
        match c.code {
            code if code == Code::Admitted as i64 => {
                if let Some(acked) = c.unreplicated {
                    return Err(self.unreplicated(job, acked).await);
                }
                let at = u64::try_from(c.at).unwrap_or(c.now_ms);
                // What the record holds after its st, ans, fin and lease.
                let tail = format!(
                    "{}|{}|{call}|{at}||{}",
                    job.ticket.as_str(),
                    attempt(job),
                    fingerprint.as_str()
                );
                (self.sends).note(self.keys.record_key(request.id), job.holder, tail);
                Ok(Some(admitted(c.now_ms, at, applicable, &fits)))
            }
            code if code == Code::Changed as i64 => Ok(None),
            code if code == Code::Expired as i64 => {
                Ok(Some(Admission::at(c.now_ms, Verdict::Expired)))
            }
            code if code == Code::Unmigrated as i64 => Err(super::reply::unmigrated(entry)),
            _ => Err(LedgerError::Protocol(format!("a commit answered {c:?}"))),
        }
    }
}

impl RedisLedger {
    /// What an admission of `entry` (judged by `applicable`) is decided
    /// from with no read, if this worker believes its logs empty: none of
    /// them is one it wrote or found written (`busy`), and nothing but a
    /// log judges it (a deny in force would reject it; a superseding
    /// purpose reads other jobs' records). An empty log has room in every
    /// rule at any instant (so its `seen` is 0), and the commit checks
    /// that each is still empty, with no record and no suppression; if one
    /// is not, it writes nothing, and the admission reads first.
    pub(super) fn fresh(&self, entry: &Entry<'_>, applicable: &[Applied]) -> Option<Fits> {
        let plain = self.commits.is_some()
            && self.keys.latest_key(&entry.job.request).is_none()
            && applicable.iter().all(|a| a.set.deny_until_ms.is_none());
        if !plain || self.busy.any(applicable.iter().map(|a| a.key.as_str())) {
            return None;
        }
        Some(Fits::empty(applicable.len()))
    }

    /// Notes `applicable`'s logs written (a commit of them, or one found
    /// them written): their next admissions read first.
    pub(super) fn note_busy(&self, applicable: &[Applied]) {
        for a in applicable {
            self.busy.note(&a.key, a.set.keep_ms);
        }
    }
}

/// The admission a commit made at `at` (the call ran at `now_ms`): its
/// rooms and shadow rule worked out from the logs the snapshot read
/// (`fits`), which held nothing newer (the commit checked it), as the
/// script works them out from the same logs.
fn admitted(now_ms: u64, at: u64, applicable: &[Applied], fits: &Fits) -> Admission {
    let mut admission = Admission::at(now_ms, Verdict::Admitted);
    let mut best: Judged = [None, None];
    for (a, seen) in applicable.iter().zip(&fits.logs) {
        judge_scope(&mut best, a.scope, &a.set, &seen.read, at);
        if let Some(room) = room_of(a.scope, &a.set.rules, &seen.read.ascending(), at) {
            admission.rooms.set(room);
        }
    }
    admission.shadow = best[1].map(|(_, rule)| rule);
    admission
}

/// The records this worker's commits wrote (state x, sending), by record
/// key and holder (the one handling of the message that holds the send):
/// a sent job's settle writes its record over whole,
/// `SET … XX PX`, with no script, where the script's "settle" would read
/// it and write the same. While the job sends, nothing but its own
/// handling refunds or releases its record (those come from the owning
/// attempt and holder only), and a copy that finds its lease lapsed marks
/// it unknown, which a sent settle overwrites in the script too; a record
/// that is gone (it expired, or a failover lost it) is not written
/// (`XX`), as the script writes none.
#[derive(Default)]
pub(super) struct Sends {
    /// (Record key, holder) → the record after `<st><ans><fin>|<lease>|`.
    written: Mutex<HashMap<(String, u64), String>>,
}

impl Sends {
    /// The most held: past it (settles lost to crashes leave theirs), all
    /// are forgotten, and their settles go to the script, as exact.
    const MAX: usize = 100_000;

    /// Notes the record the commit of `holder`'s admission wrote at `key`.
    fn note(&self, key: String, holder: u64, tail: String) {
        let mut written = self.written.lock().unwrap_or_else(PoisonError::into_inner);
        if written.len() >= Self::MAX {
            written.clear();
        }
        written.insert((key, holder), tail);
    }

    /// Takes what `holder`'s commit wrote at `key`, if it is noted.
    fn take(&self, key: &str, holder: u64) -> Option<String> {
        let mut written = self.written.lock().unwrap_or_else(PoisonError::into_inner);
        written.remove(&(key.to_owned(), holder))
    }

    /// Forgets what `holder`'s commit wrote at `key` (its send ended
    /// otherwise, or was given back).
    pub(super) fn forget(&self, key: &str, holder: u64) {
        drop(self.take(key, holder));
    }
}

impl RedisLedger {
    /// A sent settle (`answered` false) of an admission this worker's
    /// commit wrote (`Sends`): the record written over whole, waiting for
    /// the replicas as the script's settle does. `None` if no commit of
    /// this worker's is noted for `job` (the script settles it).
    pub(super) async fn settle_sent(&self, job: &JobRef<'_>) -> Result<Option<bool>, LedgerError> {
        let key = self.keys.record_key(job.request.id);
        let Some(tail) = self.sends.take(&key, job.holder) else {
            return Ok(None);
        };
        // The same lineage's same attempt (the holder is drawn per handling).
        if !tail.starts_with(&format!("{}|{}|", job.ticket.as_str(), attempt(job))) {
            return Ok(None);
        }
        let mut set = redis::cmd("SET");
        set.arg(&key)
            .arg(format!("s0-|0|{tail}"))
            .arg("XX")
            .arg("PX")
            .arg(self.keys.record_keep_ms());
        let mut conn = self.conn.clone();
        match eval_waiting(&mut conn, None, set, self.replication, true).await {
            Ok((_, Some(acked))) => Err(self.settle_unreplicated(acked)),
            Ok((reply, None)) => Ok(Some(reply == redis::Value::Okay)),
            Err(e) => {
                // Asked again while Redis is away: the same write.
                self.sends.note(key, job.holder, tail);
                Err(e)
            }
        }
    }
}
