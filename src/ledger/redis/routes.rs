//! How an admission reaches Redis, routes only (never an answer): which
//! keys this worker found full, suppressed, settled or written
//! ([`Hints`]), one admission per mailbox at a time while nothing says it
//! is full ([`Gates`]), and the order the ledger tries: a commit with no
//! read, a snapshot and the commit of what it read, then the script
//! (`RedisLedger::without_script`). Every route is exact, so a route that
//! guesses wrong costs a call, never a wrong answer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use super::snapshot::{self, LATE_MS};
use super::{Admission, Entry, Fingerprint, LedgerError, RedisLedger, Verdict};
use crate::limiter::Clock;

/// How long a suppressed mailbox or a settled job's id asks the snapshot
/// first (`routes::Hints`): its copies and retries come within seconds.
const SETTLED_HINT_MS: u64 = 60_000;

/// Keys this worker found in some state lately, for routes only: those
/// it found full, suppressed or settled (a mailbox flooded, a network at
/// its limit, copies of a job), whose admissions skip the gate (their
/// snapshot answers them); and, in a set of their own, the logs it wrote
/// or found written, whose admissions read before they commit (every
/// other admission, a new mailbox from a new network, commits with no
/// read: `RedisLedger::fresh`). Never an answer depends on them: every
/// route is exact, so a hint that is wrong or missing (another worker's
/// write, a refund, a reset) costs a read or a call, never a wrong
/// answer.
#[derive(Default)]
pub(super) struct Hints {
    /// Key → until when it is worth a snapshot.
    until: Mutex<HashMap<String, Instant>>,
}

impl Hints {
    /// The most keys held: past it, lapsed ones are dropped, then all.
    const MAX: usize = 50_000;
    /// The longest a key is held.
    const LONGEST: Duration = Duration::from_secs(3600);

    /// Whether any of `keys` is worth a snapshot now.
    pub(super) fn any<'a>(&self, keys: impl IntoIterator<Item = &'a str>) -> bool {
        let until = self.until.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        keys.into_iter()
            .any(|k| until.get(k).is_some_and(|t| *t > now))
    }

    /// Marks `key` worth a snapshot for `ms`.
    pub(super) fn note(&self, key: &str, ms: u64) {
        let mut until = self.until.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        if until.len() >= Self::MAX {
            until.retain(|_, t| *t > now);
            if until.len() >= Self::MAX {
                until.clear();
            }
        }
        let end = now + Duration::from_millis(ms).min(Self::LONGEST);
        until.insert(key.to_owned(), end);
    }
}

/// One admission per key on its way to the script while no hint says the
/// key is full, and those that come meanwhile wait for its answer: a
/// flood's jobs for one mailbox (the worker takes 256 at once) wait for
/// the first one's answer, which notes the mailbox full (`Hints`), and
/// then ask a snapshot, instead of all going to the script. Routes only,
/// never answers: a job that waited goes on to the script at once if
/// nothing says the key is full (a mailbox with room, whose jobs then go
/// together, as before: each waits one answer at most, never in a line),
/// and another mailbox's jobs never wait on it.
#[derive(Default)]
pub(super) struct Gates {
    /// Each key with an admission on its way: closed when it is answered.
    open: Mutex<HashMap<String, Arc<Semaphore>>>,
}

/// What `Gates::enter` found.
pub(super) enum Entered<'a> {
    /// Nothing of the key was on its way: this admission is, until the
    /// gate is dropped.
    First(Gate<'a>),
    /// Another was, and has been answered.
    Waited,
    /// Another was, and Redis has not answered it within the time a call
    /// may take (`LATE_MS`: a frozen Redis): an outage for this one too,
    /// at once, not after a call of its own.
    Late,
}

impl Gates {
    /// The longest an admission waits for another's answer.
    const WAIT: Duration = Duration::from_millis(LATE_MS as u64);

    /// Enters the gate of `key`, or waits for the admission that did.
    pub(super) async fn enter(&self, key: &str) -> Entered<'_> {
        let answered = {
            let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
            match open.get(key) {
                Some(answered) => answered.clone(),
                None => {
                    let answered = Arc::new(Semaphore::new(0));
                    open.insert(key.to_owned(), answered.clone());
                    return Entered::First(Gate {
                        gates: self,
                        key: key.to_owned(),
                        answered,
                    });
                }
            }
        };
        // No permit is ever given: the gate's drop closes it.
        match tokio::time::timeout(Self::WAIT, answered.acquire()).await {
            Ok(_) => Entered::Waited,
            Err(_) => Entered::Late,
        }
    }
}

/// The first admission of a key on its way (`Gates::enter`): when it is
/// dropped (answered, failed or cancelled), those that waited go on.
pub(super) struct Gate<'a> {
    gates: &'a Gates,
    key: String,
    answered: Arc<Semaphore>,
}

impl Drop for Gate<'_> {
    fn drop(&mut self) {
        let mut open = (self.gates.open)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if open
            .get(&self.key)
            .is_some_and(|a| Arc::ptr_eq(a, &self.answered))
        {
            open.remove(&self.key);
        }
        self.answered.close();
    }
}

/// Redis did not answer an admission's read, or the admission of the same
/// mailbox before it, within the 2 s a call may take: an outage (the job
/// waits), at once rather than after a call of its own.
pub(super) fn late() -> LedgerError {
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "Redis did not answer the admission's read, or the one before it for the same mailbox, \
         within 2 s; the job waits",
    ))
    .into()
}

impl RedisLedger {
    /// Whether `entry` names a key this worker last found full,
    /// suppressed or settled (`routes::Hints`): then a snapshot is asked
    /// first.
    pub(super) fn hinted(&self, entry: &Entry<'_>, applicable: &[crate::limiter::Applied]) -> bool {
        let request = &entry.job.request;
        let record = self.keys.record_key(request.id);
        let mailbox = self.keys.suppression_key(request.email);
        let named = [record.as_str(), mailbox.as_str()];
        (self.hints).any(
            named
                .into_iter()
                .chain(applicable.iter().map(|a| a.key.as_str())),
        )
    }

    /// What a snapshot finds for `entry` at `clock` (asked for at the
    /// instant with it; `applicable`: the scopes that judge it): an answer
    /// that writes nothing, room for an admission that the worker writes by
    /// compare-and-set, or a write the script decides (or a snapshot that
    /// could not be read); an outage if Redis did not answer the read in
    /// the time the script would still be taken in.
    pub(super) async fn snapshot_answer(
        &self,
        entry: &Entry<'_>,
        (clock, asked): (Clock, std::time::Instant),
        applicable: &[crate::limiter::Applied],
    ) -> Result<snapshot::Found, LedgerError> {
        let Some(snapshot) = self.snapshot.as_ref() else {
            return Ok(snapshot::Found::Script);
        };
        let request = &entry.job.request;
        let record = self.keys.record_key(request.id);
        let (reply, answer) = tokio::sync::oneshot::channel();
        let item = snapshot::Question {
            clock,
            asked,
            record,
            fingerprint: Fingerprint::of(request),
            ticket: entry.job.ticket.as_str().to_owned(),
            expires_at_ms: entry.expires_at_ms,
            suppression: match self.keys.checks_suppression() {
                true => self.keys.suppression_keys(request.email),
                false => Vec::new(),
            },
            scopes: (applicable.iter())
                .map(|a| (a.scope, a.key.clone(), a.set.clone()))
                .collect(),
            supersedes: self.keys.latest_key(request).is_some(),
            reply,
        };
        if snapshot.send(item).await.is_err() {
            return Ok(snapshot::Found::Script);
        }
        match answer.await {
            Ok(Ok(found)) => Ok(found),
            Ok(Err(snapshot::Late)) => Err(late()),
            Err(_) => Ok(snapshot::Found::Script),
        }
    }

    /// What `entry` (judged by `applicable`; `hinted`: a key of it was
    /// found full, suppressed or settled) is answered with no script: by
    /// a commit of logs this worker believes empty (`Fits::fresh`: no
    /// read first), else by a snapshot and a commit of what it read.
    /// `None`: the script decides.
    pub(super) async fn without_script(
        &self,
        entry: &Entry<'_>,
        (clock, asked): (Clock, std::time::Instant),
        applicable: &[crate::limiter::Applied],
        hinted: bool,
    ) -> Result<Option<Admission>, LedgerError> {
        if !hinted && let Some(fits) = self.fresh(entry, applicable) {
            let committed = (self.commit(entry, (clock, asked), applicable, fits)).await?;
            if committed.is_some() {
                return Ok(committed);
            }
            // Not empty after all (another worker's admission, a key this
            // worker forgot): read first from now on.
            self.note_busy(applicable);
        }
        match (self.snapshot_answer(entry, (clock, asked), applicable)).await? {
            snapshot::Found::Answered(answered) => Ok(Some(answered)),
            snapshot::Found::Fits(fits) => {
                (self.commit(entry, (clock, asked), applicable, fits)).await
            }
            snapshot::Found::Script => Ok(None),
        }
    }

    /// Notes what `admission` of `entry` (judged by `applicable`) says of
    /// its keys for the next admissions' route (`routes::Hints`): a
    /// scope full until it frees up (a rejection's, or the last room an
    /// admission took), a suppressed mailbox, a job settled or held.
    pub(super) fn learn(
        &self,
        entry: &Entry<'_>,
        applicable: &[crate::limiter::Applied],
        admission: &Admission,
    ) {
        let request = &entry.job.request;
        let full = |scope, ms| {
            for a in applicable.iter().filter(|a| a.scope == scope) {
                self.hints.note(&a.key, ms);
            }
        };
        match admission.verdict {
            Verdict::Rejected {
                retry_after_ms,
                rule,
            } => full(rule.scope, retry_after_ms),
            Verdict::Admitted => {
                for room in admission.rooms.iter().filter(|r| r.remaining == 0) {
                    full(room.rule.scope, room.reset_ms);
                }
                self.note_busy(applicable);
            }
            Verdict::Suppressed => {
                (self.hints).note(&self.keys.suppression_key(request.email), SETTLED_HINT_MS)
            }
            Verdict::Sent { .. }
            | Verdict::Unknown { .. }
            | Verdict::Finished { .. }
            | Verdict::Busy { .. }
            | Verdict::Conflict
            | Verdict::Expired => {
                (self.hints).note(&self.keys.record_key(request.id), SETTLED_HINT_MS)
            }
            Verdict::Resumed { .. } | Verdict::Superseded { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_gate_lets_one_admission_of_a_key_on_and_the_others_wait_for_its_answer() {
        let gates = Arc::new(Gates::default());
        let Entered::First(first) = gates.enter("m").await else {
            panic!("the first enters");
        };
        // Another key's admission does not wait.
        assert!(matches!(gates.enter("n").await, Entered::First(_)));
        // The same key's wait for the first one's answer, all of them.
        let short = Duration::from_millis(50);
        let mut waiting = tokio::task::JoinSet::new();
        for _ in 0..3 {
            let gates = gates.clone();
            waiting.spawn(async move { matches!(gates.enter("m").await, Entered::Waited) });
        }
        tokio::time::sleep(short).await;
        assert_eq!(waiting.len(), 3, "they wait");
        drop(first);
        let mut waited = 0;
        while let Some(w) = waiting.join_next().await {
            waited += usize::from(w.unwrap());
        }
        assert_eq!(waited, 3, "all go on together");
        assert!(gates.open.lock().unwrap().is_empty(), "forgotten");
        // One that is never answered (a frozen Redis): late, at WAIT.
        let Entered::First(stuck) = gates.enter("m").await else {
            panic!("the first enters");
        };
        let started = Instant::now();
        assert!(matches!(gates.enter("m").await, Entered::Late));
        assert!(started.elapsed() >= Gates::WAIT);
        // Cancelled while it waits: nothing is left behind.
        let cancelled = tokio::time::timeout(short, gates.enter("m")).await;
        assert!(cancelled.is_err());
        drop(stuck);
        assert!(gates.open.lock().unwrap().is_empty(), "forgotten");
    }
}
