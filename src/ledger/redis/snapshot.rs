//! The snapshot: what an admission's facts answer before any script runs.
//! Per batch of admissions, one atomic read (`MULTI`, each job's record,
//! `TIME`, their suppression keys in one `MGET`, the head of each scope
//! log they name (its count and newest entries: a `GETRANGE`, once per
//! key however many jobs name it), `EXEC`); from that snapshot Rust answers every request the ledger would
//! answer without a write: a rejection, a suppression, an expiry, a
//! conflict, and a copy of a job that was sent, is being sent or ended.
//! Those cost Redis a read, not a script (a tenth of it, by
//! `benches/redis_cost.py`), which is what an attack costs it: a flood is
//! all rejections.
//!
//! Where it finds room (no record, no suppression, room in every scope),
//! the admission is written by compare-and-set (`commit`: the record and
//! the logs, if nothing read changed since). What it cannot answer goes on
//! to the ledger's script, which decides again, atomically, and writes: a
//! resumption, a send whose owner vanished, a superseding purpose. The
//! snapshot never writes, so a snapshot that is stale by the time its
//! answer arrives answered exactly what Redis held at its instant (a
//! rejection then was one; room only grows with time on a log nobody
//! writes, and a write that came after it is another request's). Anything
//! unexpected (an error, a key of another type, a Redis clock the worker
//! does not trust) leaves every request of the batch to the script, which
//! answers it as before.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;
use tokio::sync::{mpsc, oneshot};

use super::batch::{BATCHED, Queued, gather, guard, oldest_asked};
use super::log;
use crate::ledger::{Admission, Fingerprint, Held, JobState, Refund, Standing, Verdict, standing};
use crate::limiter::{self, Clock, Keyspace, Newest, RuleSet, Scope, judge_scope, suppressed_by};
use crate::store::Conn;

/// How late after the worker asked for it a call may run (ms), as
/// `decide.lua`'s `LATE_MS`: a snapshot read later than this (a frozen or
/// partitioned Redis) answers nothing; the script then refuses the call
/// (`STALE`), and the caller waits without spending an attempt.
pub(super) const LATE_MS: i64 = 2000;

/// The most entries of a log its head's read fetches (12 bytes each): a
/// rule of a larger max reads its own entry.
const FETCH_MAX: usize = 64;

/// The largest max of a log read whole (`Plan::whole`).
const WHOLE_MAX: usize = 16;

/// One admission as the snapshot reads it.
pub(super) struct Question {
    /// The clock it is judged by.
    pub(super) clock: Clock,
    /// When it was asked for (a snapshot read late answers nothing).
    pub(super) asked: Instant,
    /// Its record key.
    pub(super) record: String,
    /// What its id must have been admitted for.
    pub(super) fingerprint: Fingerprint,
    /// The asking lineage's ticket.
    pub(super) ticket: String,
    /// Its own expiry, ms.
    pub(super) expires_at_ms: Option<u64>,
    /// Its suppression keys (`Keyspace::suppression_keys`), if admissions
    /// check them.
    pub(super) suppression: Vec<String>,
    /// Each scope that judges it: the scope, its key, its rule set.
    pub(super) scopes: Vec<(Scope, String, Arc<RuleSet>)>,
    /// Its purpose supersedes older jobs: whether a newer job supersedes
    /// it reads other jobs' records, which the script does.
    pub(super) supersedes: bool,
    /// Where its answer goes.
    pub(super) reply: oneshot::Sender<Result<Found, Late>>,
}

/// What the snapshot found for one admission.
pub(super) enum Found {
    /// Its answer, which writes nothing (a rejection, a copy of a job…).
    Answered(Admission),
    /// No record of its id, no suppression, and room in every scope: the
    /// worker writes the admission by compare-and-set (`commit`).
    Fits(Fits),
    /// The script decides (a write this read cannot make, or a snapshot
    /// that could not be read).
    Script,
}

/// What an admission the snapshot found room for was decided from: what
/// the compare-and-set checks is unchanged, and what its rooms and shadow
/// rule are worked out from.
pub(super) struct Fits {
    /// The snapshot's instant (ms): the write's may not be earlier.
    pub(super) seen: u64,
    /// Each scope's log as read, in the order of the admission's scopes.
    pub(super) logs: Vec<Seen>,
}

impl Fits {
    /// `n` logs believed empty, with no read (`RedisLedger::fresh`): room
    /// in each at any instant.
    pub(super) fn empty(n: usize) -> Self {
        let seen = || Seen {
            head: Some(log::head_of(0, &[])),
            read: LogRead::default(),
        };
        Fits {
            seen: 0,
            logs: (0..n).map(|_| seen()).collect(),
        }
    }
}

/// One scope's log as the snapshot read it.
pub(super) struct Seen {
    /// Its head as the compare-and-set checks it: its count (6 hex
    /// digits) and its newest times as read (12 each); `None` for a deny,
    /// which reads no log and writes none.
    pub(super) head: Option<String>,
    /// What was read.
    pub(super) read: LogRead,
}

/// A snapshot Redis did not answer within the time a call may take
/// (`LATE_MS` from the job's asking): the job waits (an outage), since the
/// script would now be refused as late.
#[derive(Debug, Clone, Copy)]
pub(super) struct Late;

impl Queued for Question {
    fn clock(&self) -> Option<Clock> {
        Some(self.clock)
    }

    fn asked(&self) -> Instant {
        self.asked
    }
}

/// Answers the queued admissions, one snapshot per batch, until every
/// sender is gone.
pub(super) async fn answering(rx: mpsc::Receiver<Question>, conn: Conn, keys: Arc<Keyspace>) {
    gather(rx, BATCHED, move |batch, clock| {
        let (mut conn, keys) = (conn.clone(), keys.clone());
        async move {
            // A read the script could no longer follow in time (it would be
            // refused as late) is given up on when that time comes: the
            // jobs wait at once, not after the connection's own timeout
            // and then the script's (found by review: 10 s, not 5).
            let budget = match (clock, keys.clock_guard_ms) {
                (Clock::Server, Some(_)) => {
                    let spent = oldest_asked(&batch).elapsed();
                    Some(Duration::from_millis(LATE_MS as u64).saturating_sub(spent))
                }
                _ => None,
            };
            let read = snapshot(&mut conn, &keys, clock, &batch);
            let answers = match budget {
                Some(budget) => tokio::time::timeout(budget, read).await.map_err(|_| Late),
                None => Ok(read.await),
            };
            let mut answers = answers.map(|a| a.into_iter().flatten());
            for item in batch {
                let answer = match &mut answers {
                    Ok(answers) => Ok(answers.next().unwrap_or(Found::Script)),
                    Err(Late) => Err(Late),
                };
                let _ = item.reply.send(answer);
            }
        }
    })
    .await;
}

/// What the snapshot finds for each of `batch`; `None` (the script
/// decides each) if the read failed or its clock is not trusted.
async fn snapshot(
    conn: &mut Conn,
    keys: &Keyspace,
    clock: Clock,
    batch: &[Question],
) -> Option<Vec<Found>> {
    let logs = Logs::of(batch);
    let values: Vec<Value> = read_of(batch, &logs).query_async(conn).await.ok()?;
    let mut values = values.into_iter();
    // The MGET: each record, each suppression key, each small log whole.
    let got: Vec<Option<Vec<u8>>> = redis::from_redis_value(values.next()?).ok()?;
    let (s, us): (u64, u64) = redis::from_redis_value(values.next()?).ok()?;
    let now = match clock {
        Clock::At(ms) => ms,
        Clock::Server => {
            let server = s.saturating_mul(1000).saturating_add(us / 1000);
            trusted(server, guard(keys, oldest_asked(batch)))?
        }
    };
    let mut ranged = Vec::new();
    for (_, plan) in logs.reads.iter().filter(|(_, p)| !p.whole()) {
        ranged.push(plan.read(&mut values)?);
    }
    // MGET reads a key of another type (an earlier build's hash record or
    // sorted-set log) as nothing: EXISTS counts the records and the logs,
    // and the script decides.
    let exists: usize = redis::from_redis_value(values.next()?).ok()?;
    let sups = batch.iter().map(|i| i.suppression.len()).sum::<usize>();
    let (records, rest) = got.split_at(batch.len().min(got.len()));
    let read = records.iter().chain(rest.get(sups..)?);
    if exists != read.filter(|v| v.is_some()).count() {
        return None;
    }
    let mut got = got.into_iter();
    let mut text = || got.next()?.map(String::from_utf8).transpose().ok();
    let records: Vec<Option<String>> = batch.iter().map(|_| text()).collect::<Option<_>>()?;
    let mut sups: Vec<Option<String>> = (0..sups).map(|_| text()).collect::<Option<_>>()?;
    let mut ranged = ranged.into_iter();
    let mut read = Vec::with_capacity(logs.reads.len());
    for (_, plan) in &logs.reads {
        read.push(match plan.whole() {
            true => LogRead::of_head(&got.next()?.unwrap_or_default())?,
            false => ranged.next()?,
        });
    }
    let mut answers = Vec::with_capacity(batch.len());
    for ((item, slots), record) in batch.iter().zip(&logs.slots).zip(records) {
        let item_sups: Vec<_> = sups
            .drain(..item.suppression.len().min(sups.len()))
            .collect();
        let item_logs: Vec<&LogRead> = slots.iter().map(|&i| &read[i]).collect();
        answers.push(
            match answer(item, record.as_deref(), &item_sups, &item_logs, now) {
                Judged::Answer(verdict) => Found::Answered(Admission::at(now, verdict)),
                Judged::Room => fits(item, slots, &logs, &read, now),
                Judged::Script => Found::Script,
            },
        );
    }
    Some(answers)
}

/// What an admission with room was decided from (`slots`: its scopes'
/// places in `logs` and `read`), if the compare-and-set can check it: a
/// log whose read took ranks of its own (a rule of a max above
/// `FETCH_MAX`) is left to the script.
fn fits(item: &Question, slots: &[usize], logs: &Logs<'_>, read: &[LogRead], now: u64) -> Found {
    let mut seen = Vec::with_capacity(slots.len());
    for ((_, _, set), &i) in item.scopes.iter().zip(slots) {
        if !logs.reads[i].1.ranks.is_empty() {
            return Found::Script;
        }
        let read = read[i].clone();
        let head = set.deny_until_ms.is_none().then(|| read.head());
        seen.push(Seen { head, read });
    }
    Found::Fits(Fits {
        seen: now,
        logs: seen,
    })
}

/// What [`answer`] found.
enum Judged {
    /// The answer, which writes nothing.
    Answer(Verdict),
    /// No record, no suppression, room in every scope.
    Room,
    /// The script decides.
    Script,
}

/// The scope logs a batch reads: each key once (a flood names the same
/// mailbox and network in every job), with what every job that names it
/// needs of it.
struct Logs<'a> {
    /// Each key, and its read.
    reads: Vec<(&'a str, Plan)>,
    /// For each job, for each of its scopes, its key's place in `reads`.
    slots: Vec<Vec<usize>>,
}

impl<'a> Logs<'a> {
    fn of(batch: &'a [Question]) -> Self {
        let mut reads: Vec<(&str, Plan)> = Vec::new();
        let mut at: HashMap<&str, usize> = HashMap::new();
        let mut slots = Vec::with_capacity(batch.len());
        for item in batch {
            let mut mine = Vec::with_capacity(item.scopes.len());
            for (_, key, set) in &item.scopes {
                let plan = Plan::of(set);
                let i = *at.entry(key.as_str()).or_insert_with(|| {
                    reads.push((key.as_str(), Plan::none()));
                    reads.len() - 1
                });
                reads[i].1.merge(plan);
                mine.push(i);
            }
            slots.push(mine);
        }
        Logs { reads, slots }
    }
}

/// The one atomic read of `batch` (`logs`: its scope logs' reads): one
/// `MGET` of each record, each suppression key and each small log whole
/// (first: a cluster routes the call by its first key), `TIME`, the heads
/// of the larger logs, then `EXISTS` of the records and logs the `MGET` read (it reads a
/// key of another type as nothing). Commands, not bytes, are most of what
/// a read costs Redis: one `MGET` of 20 keys costs less than four reads.
fn read_of(batch: &[Question], logs: &Logs<'_>) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.atomic();
    let mut got: Vec<&str> = batch.iter().map(|i| i.record.as_str()).collect();
    got.extend(
        batch
            .iter()
            .flat_map(|i| &i.suppression)
            .map(String::as_str),
    );
    got.extend(
        (logs.reads.iter())
            .filter(|(_, p)| p.whole())
            .map(|(key, _)| *key),
    );
    pipe.cmd("MGET").arg(&got);
    pipe.cmd("TIME");
    for (key, plan) in logs.reads.iter().filter(|(_, p)| !p.whole()) {
        plan.ask(&mut pipe, key);
    }
    // The records and the logs: a suppression key of another type (which
    // no build writes) is left to the commit, which reads it one by one.
    let sups = batch.iter().map(|i| i.suppression.len()).sum::<usize>();
    let (records, rest) = got.split_at(batch.len());
    pipe.cmd("EXISTS").arg(records).arg(&rest[sups..]);
    pipe
}

/// Redis's clock `now`, if the worker trusts it (`guard`: where it
/// reckoned the clock was, and how far off it may be): within the guard,
/// and not late. The script answers a clock it does not trust.
fn trusted(now: u64, guard: Option<(u64, u64)>) -> Option<u64> {
    let Some((expected, max)) = guard else {
        return Some(now);
    };
    let off = i128::from(now) - i128::from(expected);
    (off.unsigned_abs() <= u128::from(max) && off <= i128::from(LATE_MS)).then_some(now)
}

/// What the snapshot answers `item` at `now` (`record`: its record's
/// text; `sups`: its suppression keys' values; `logs`: each scope's read),
/// in `ledger.lua`'s order: the record, the expiry, the suppression, then
/// the limiter. The script decides a write other than a new admission, a
/// superseding purpose, and a record this build does not read.
fn answer(
    item: &Question,
    record: Option<&str>,
    sups: &[Option<String>],
    logs: &[&LogRead],
    now: u64,
) -> Judged {
    let expired = item.expires_at_ms.is_some_and(|at| at <= now);
    if let Some(text) = record {
        let Some(held) = held(text, item) else {
            return Judged::Script;
        };
        match standing(held, expired, now) {
            Standing::Answered(verdict) => return Judged::Answer(verdict),
            Standing::Afresh => {}
            Standing::Vanished | Standing::Lapsed => return Judged::Script,
        }
    }
    if expired {
        return Judged::Answer(Verdict::Expired);
    }
    if suppressed_by(sups) {
        return Judged::Answer(Verdict::Suppressed);
    }
    if item.supersedes {
        return Judged::Script;
    }
    let mut best: limiter::Judged = [None, None];
    for ((scope, _, set), log) in item.scopes.iter().zip(logs) {
        judge_scope(&mut best, *scope, set, *log, now);
    }
    match best[0] {
        Some((retry_after_ms, rule)) => Judged::Answer(Verdict::Rejected {
            retry_after_ms,
            rule,
        }),
        // A refunded record of another lineage's is written over by the
        // script, not by the compare-and-set, which finds no record.
        None if record.is_some() => Judged::Script,
        None => Judged::Room,
    }
}

/// A string record (`records.lua`:
/// `<st><ans><fin>|<lease>|<own>|<n>|<c>|<at>|<rv>|<fp>`) as `item` sees
/// it; `None` if it is not one.
fn held(text: &str, item: &Question) -> Option<Held> {
    let mut fields = text.splitn(8, '|');
    let &[st, ans, fin] = fields.next()?.as_bytes() else {
        return None;
    };
    let lease = fields.next()?;
    let own = fields.next()?;
    let (_attempt, _call) = (fields.next()?, fields.next()?);
    let at = fields.next()?;
    let (_reserved, fp) = (fields.next()?, fields.next()?);
    let state = match st {
        b'a' => JobState::Admitted,
        b'x' => JobState::Sending,
        b's' => JobState::Sent,
        b'u' => JobState::Unknown,
        // A refund without its end: failed (as `ledger.lua` answers it).
        b'r' => JobState::Refunded(Refund::from_code(if fin == b'-' { b'f' } else { fin })?),
        _ => return None,
    };
    // A number a record lacks reads as 0, as `ledger.lua` reads it.
    let number = |v: &str| v.parse::<u64>().unwrap_or(0);
    Some(Held {
        state,
        same_job: fp == item.fingerprint.as_str(),
        mine: own == item.ticket,
        answered: ans == b'1',
        admitted_at: number(at.split('|').next().unwrap_or_default()),
        lease_until: number(lease),
    })
}

/// What the snapshot reads of one scope's log to judge it (`log.rs`):
/// its head, the count and newest `fetch` entries (one `GETRANGE`), and
/// the `n`-th newest alone for each rule of a larger `n`. A deny reads
/// nothing.
struct Plan {
    /// Whether the log is read at all (a deny's is not).
    reads: bool,
    fetch: usize,
    ranks: Vec<usize>,
}

impl Plan {
    /// The read `set` needs.
    fn of(set: &RuleSet) -> Self {
        let maxes = || set.rules.iter().map(|r| r.max as usize);
        let (Some(top), None) = (maxes().max(), set.deny_until_ms) else {
            return Plan::none();
        };
        let fetch = top.min(FETCH_MAX);
        let mut ranks: Vec<usize> = maxes().filter(|&n| n > fetch).collect();
        ranks.sort_unstable();
        ranks.dedup();
        Plan {
            reads: true,
            fetch,
            ranks,
        }
    }

    /// No read (what `merge` starts from).
    fn none() -> Self {
        Plan {
            reads: false,
            fetch: 0,
            ranks: Vec::new(),
        }
    }

    /// Widens this read to cover `other`'s too (two jobs judge one key by
    /// different rule sets: purposes of their own).
    fn merge(&mut self, other: Plan) {
        if !other.reads {
            return;
        }
        self.reads = true;
        self.fetch = self.fetch.max(other.fetch);
        self.ranks.extend(other.ranks);
        let fetch = self.fetch;
        self.ranks.retain(|&n| n > fetch);
        self.ranks.sort_unstable();
        self.ranks.dedup();
    }

    /// Whether the log is read whole, in the batch's `MGET`: one a rule
    /// fills in a few entries (a mailbox's), whose whole text is a few
    /// hundred bytes with the shipped rules; a larger one (a network's, a
    /// domain's) is read by its head alone. (A log keeps its entries for
    /// the longest window of its scope's every purpose: a purpose of one
    /// a minute beside one of ten a day can hold a day of its admissions,
    /// 70 KB at 1 500, read whole by each snapshot that names it.)
    fn whole(&self) -> bool {
        self.reads && self.ranks.is_empty() && self.fetch <= WHOLE_MAX
    }

    /// Adds the reads to `pipe`.
    fn ask(&self, pipe: &mut redis::Pipeline, key: &str) {
        if !self.reads {
            return;
        }
        pipe.cmd("GETRANGE")
            .arg(key)
            .arg(0)
            .arg(log::head_len(self.fetch) - 1);
        for &n in &self.ranks {
            let (start, end) = log::nth_range(n);
            pipe.cmd("GETRANGE").arg(key).arg(start).arg(end);
        }
    }

    /// What the reads answered, taken from `values`; `None` if one is not
    /// a log's.
    fn read(&self, values: &mut impl Iterator<Item = Value>) -> Option<LogRead> {
        if !self.reads {
            return Some(LogRead::default());
        }
        let LogRead { count, newest, .. } = LogRead::of_head(&bytes(values.next()?)?)?;
        let mut ranks = Vec::with_capacity(self.ranks.len());
        for &n in &self.ranks {
            let value = bytes(values.next()?)?;
            // Past the log's end, the bytes are not an entry's.
            if n <= count {
                ranks.push((n, log::time(&value)?));
            }
        }
        Some(LogRead {
            count,
            newest,
            ranks,
        })
    }
}

/// A scope log as the snapshot read it: its count, its newest entries'
/// times (newest first), and the `n`-th newest's for larger `n`.
#[derive(Default, Clone)]
pub(super) struct LogRead {
    count: usize,
    newest: Vec<u64>,
    ranks: Vec<(usize, u64)>,
}

impl LogRead {
    /// A log's head, or the whole log (`log::head`), as read; `None` if
    /// the bytes are not a log's.
    fn of_head(bytes: &[u8]) -> Option<Self> {
        let (count, newest) = log::head(bytes)?;
        Some(LogRead {
            count,
            newest,
            ranks: Vec::new(),
        })
    }

    /// The head as it was read (`log::head_of`): what a compare-and-set
    /// finds at the front of the log if nothing wrote it since.
    fn head(&self) -> String {
        log::head_of(self.count, &self.newest)
    }

    /// How many entries the log holds.
    pub(super) fn count(&self) -> usize {
        self.count
    }

    /// The times read, oldest first.
    pub(super) fn ascending(&self) -> Vec<u64> {
        self.newest.iter().rev().copied().collect()
    }
}

impl Newest for LogRead {
    fn newest(&self, n: usize) -> Option<u64> {
        match n.checked_sub(1).and_then(|i| self.newest.get(i)) {
            Some(&t) => Some(t),
            None => (self.ranks.iter()).find_map(|&(m, t)| (m == n).then_some(t)),
        }
    }
}

/// A read's bytes (a key that does not exist reads as none).
fn bytes(value: Value) -> Option<Vec<u8>> {
    match value {
        Value::BulkString(b) => Some(b),
        Value::Nil => Some(Vec::new()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::Rule;

    fn set(rules: &[(u64, u32)]) -> RuleSet {
        RuleSet {
            rules: (rules.iter())
                .map(|&(ms, max)| Rule::new(std::time::Duration::from_millis(ms), max))
                .collect(),
            keep_ms: 1,
            deny_until_ms: None,
        }
    }

    #[test]
    fn it_is_late_when_the_script_is() {
        let lua = include_str!("../../store/scripts/decide.lua");
        assert!(lua.contains(&format!("local LATE_MS = {LATE_MS}\n")));
        assert_eq!(trusted(10_000, Some((10_000, 500))), Some(10_000));
        assert_eq!(trusted(10_501, Some((10_000, 500))), None, "skewed");
        assert_eq!(trusted(9_499, Some((10_000, 500))), None, "skewed back");
        assert_eq!(trusted(12_001, Some((10_000, 5_000))), None, "late");
        assert_eq!(trusted(7, None), Some(7));
    }

    #[test]
    fn a_read_fetches_what_the_rules_need_and_no_more() {
        let plan = Plan::of(&set(&[(60_000, 1), (3_600_000, 5), (86_400_000, 10)]));
        assert_eq!((plan.fetch, plan.ranks), (10, vec![]));
        let plan = Plan::of(&set(&[(60_000, 5), (600_000, 30), (3_600_000, 50)]));
        assert_eq!((plan.fetch, plan.ranks), (50, vec![]));
        let plan = Plan::of(&set(&[(60_000, 5), (600_000, 100), (3_600_000, 500)]));
        assert_eq!((plan.fetch, plan.ranks), (64, vec![100, 500]));
        let deny = RuleSet {
            deny_until_ms: Some(0),
            ..set(&[])
        };
        assert!(!Plan::of(&deny).reads);
        // The n-th newest: from the head read, else from its rank's.
        let read = LogRead {
            count: 60,
            newest: vec![30, 20, 10],
            ranks: vec![(50, 1)],
        };
        let got: Vec<_> = [0, 1, 3, 4, 50].map(|n| read.newest(n)).into();
        assert_eq!(got, vec![None, Some(30), Some(10), None, Some(1)]);
        // Two jobs judge one key by different sets: one read covers both.
        let mut plan = Plan::of(&set(&[(60_000, 10)]));
        plan.merge(Plan::of(&set(&[(60_000, 5), (600_000, 100)])));
        plan.merge(Plan::of(&deny));
        assert_eq!((plan.reads, plan.fetch, plan.ranks), (true, 64, vec![100]));
        let mut plan = Plan::none();
        plan.merge(Plan::of(&deny));
        assert!(!plan.reads);
        // A rank past the log's end is no entry, whatever its bytes.
        let plan = Plan::of(&set(&[(60_000, 100)]));
        let mut values = vec![
            Value::BulkString(b"00000101a0c4506fe8".to_vec()),
            Value::BulkString(b"\nj1\n".to_vec()),
        ]
        .into_iter();
        let read = plan.read(&mut values).unwrap();
        assert_eq!(
            (read.newest(1), read.newest(100)),
            (Some(1_790_000_001_000), None)
        );
    }

    #[test]
    fn records_read_as_the_script_reads_them() {
        let (reply, _) = oneshot::channel();
        let item = Question {
            clock: Clock::Server,
            asked: Instant::now(),
            record: "p:job:j".into(),
            fingerprint: Fingerprint("f|p".into()),
            ticket: "T1".into(),
            expires_at_ms: None,
            suppression: Vec::new(),
            scopes: Vec::new(),
            supersedes: false,
            reply,
        };
        let h = held("r1-|0|T1|2:h|c9|1800000000000||f|p", &item).unwrap();
        assert_eq!(h.state, JobState::Refunded(Refund::Failed));
        assert!(h.same_job && h.mine && h.answered);
        assert_eq!((h.admitted_at, h.lease_until), (1_800_000_000_000, 0));
        let h = held(
            "x0-|1800000030000|T2|1:h|c9|1800000000000|n 1 2 3|other",
            &item,
        )
        .unwrap();
        assert_eq!(h.state, JobState::Sending);
        assert!(!h.same_job && !h.mine && !h.answered);
        assert_eq!(h.lease_until, 1_800_000_030_000);
        for bad in [
            "",
            "zz-|0|T|1:h|c|1||f|p",
            "s0-|0|T",
            "rr?|0|T1|1:h|c|1||f|p",
        ] {
            assert!(held(bad, &item).is_none(), "{bad:?}");
        }
    }
}
