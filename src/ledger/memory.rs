use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use super::{
    Admission, Ending, Entry, Fingerprint, Held, JobRef, JobState, Ledger, LedgerError, Refund,
    Standing, Verdict, standing,
};
use crate::domain::{EmailAddress, Name, Ticket};
use crate::limiter::{Applied, Clock, Keyspace, MemoryLogs, Quotas, RuleRef, Subject, Usage};
use crate::settings::LimitSettings;

/// How many admissions pass between sweeps of idle keys and records.
const SWEEP_EVERY: u64 = 1024;

/// The single-process ledger: the same semantics as [`super::RedisLedger`]
/// (one conformance suite checks both), with records and limiter logs in
/// this process. For one worker without Redis (`redis.url = "memory://"`)
/// and for tests; several workers with in-memory ledgers do **not** share
/// quotas, and nothing survives a restart.
///
/// Memory stays bounded: every `SWEEP_EVERY` (1024) admissions, records past
/// their dedup period and logs idle for their keep (longest window and a
/// minute) are dropped.
#[derive(Clone)]
pub struct MemoryLedger {
    inner: Arc<Mutex<State>>,
}

/// Names the type only: its state is every record and log.
impl std::fmt::Debug for MemoryLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryLedger").finish_non_exhaustive()
    }
}

struct State {
    logs: MemoryLogs,
    /// Job id → its record.
    records: HashMap<String, Record>,
    /// Latest key (a mailbox and a purpose that supersedes) → the newest
    /// 16 jobs admitted for it, each when it was made and its id, and
    /// until when they are kept (as `ledger.lua`'s latest keys).
    latest: HashMap<String, (Vec<(u64, String)>, u64)>,
    /// Bounce key ([`Keyspace::bounce_key`]) → until when a bounce
    /// suppresses that spelling (`ledger.lua`'s first suppression key).
    suppressed: HashMap<String, u64>,
    admissions: u64,
    /// The latest time any call was made at: the clock of the calls that
    /// take none (their records' lives are counted from it).
    clock: u64,
}

struct Record {
    fingerprint: Fingerprint,
    admitted_at: u64,
    state: JobState,
    owner: Ticket,
    /// The owner's attempt, and which handling of it holds the send.
    attempt: (u32, u64),
    lease_until: u64,
    answered: bool,
    /// When the record is forgotten.
    until: u64,
}

impl MemoryLedger {
    /// An empty ledger with `limits`. Keys carry no prefix: nothing else
    /// shares this process's memory.
    pub fn new(limits: &LimitSettings) -> Self {
        Self {
            inner: Arc::new(Mutex::new(State {
                logs: MemoryLogs::new(Keyspace::new("", limits)),
                records: HashMap::new(),
                latest: HashMap::new(),
                suppressed: HashMap::new(),
                admissions: 0,
                clock: 0,
            })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // No code path panics while holding the lock, and the state stays
        // consistent between statements; recover rather than poison forever.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn now(clock: Clock) -> u64 {
        match clock {
            Clock::At(ms) => ms,
            Clock::Server => crate::domain::now_ms(),
        }
    }

    /// How many limiter keys and job records are held, for memory-bound tests.
    pub fn len(&self) -> (usize, usize) {
        let s = self.lock();
        (s.logs.len(), s.records.len())
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == (0, 0)
    }

    /// Puts `overrides` in force (this process's own: the in-memory backend
    /// has no shared store for them).
    pub fn set_overrides(&self, overrides: Vec<crate::limiter::overrides::Override>) {
        self.lock().logs.keyspace().install(overrides, None);
    }

    /// Drops every key and record idle at `now` (ms) at once, rather than at
    /// the next periodic sweep. Lets tests check the memory bound.
    pub fn sweep(&self, now: u64) {
        self.lock().sweep(now);
    }
}

impl State {
    fn sweep(&mut self, now: u64) {
        self.logs.sweep(now);
        self.records.retain(|_, r| r.until > now);
        self.latest.retain(|_, (_, until)| *until > now);
        self.suppressed.retain(|_, until| *until > now);
    }

    /// Whether job `id`, made at `made`, is superseded: `latest` holds
    /// another job made more than `skew` later whose live record is not
    /// refunded (see `ledger.lua`'s "admit").
    fn superseded(&self, latest: &str, made: u64, skew: u64, id: &str, now: u64) -> bool {
        let Some((jobs, _)) = self.latest.get(latest).filter(|(_, until)| *until > now) else {
            return false;
        };
        jobs.iter().any(|(t, other)| {
            let rec = (self.records.get(other.as_str())).filter(|r| r.until > now);
            other != id
                && *t > made.saturating_add(skew)
                && rec.is_some_and(|r| !matches!(r.state, JobState::Refunded(_)))
        })
    }

    /// The live record of `id` at `now`, if any.
    fn record(&mut self, id: &str, now: u64) -> Option<&mut Record> {
        self.clock = self.clock.max(now);
        self.records.get_mut(id).filter(|r| r.until > now)
    }

    /// The record of `id` as of the latest call.
    fn latest(&mut self, id: &str) -> Option<&mut Record> {
        let now = self.clock;
        self.record(id, now)
    }

    /// `entry` as "admit" judges it at `now`; `found`'s override kind is
    /// set.
    fn asked<'a>(&self, entry: &Entry<'a>, now: u64, found: &mut Admission) -> Asked<'a> {
        let job = &entry.job;
        let keys = self.logs.keyspace();
        let (scopes, by_override) = keys.applicable_by(&job.request);
        found.by_override = by_override;
        Asked {
            id: job.request.id.as_str(),
            ticket: job.ticket,
            fingerprint: Fingerprint::of(&job.request),
            scopes,
            expired: entry.expires_at_ms.is_some_and(|at| at <= now),
            attempt: (job.attempt.max(1), job.holder),
            latest: keys.latest_key(&job.request),
            skew: keys.supersede_skew_ms(),
            lease: keys.lease_ms(),
            dedup: keys.dedup_ms(),
        }
    }

    /// `ledger.lua`'s "admit" for one request; on a fresh admission,
    /// `found`'s shadow rule and rooms are set (see [`Admission`]).
    fn admit(&mut self, entry: &Entry<'_>, now: u64, found: &mut Admission) -> Verdict {
        let asked = self.asked(entry, now, found);
        if let Some(verdict) = self.readmit(entry, &asked, now) {
            return verdict;
        }
        self.admit_afresh(entry, asked, now, found)
    }

    /// What "admit" would answer `entry` at `now` where it writes nothing,
    /// with no write ([`Ledger::peek`]); `None` where it would write.
    fn peek(&mut self, entry: &Entry<'_>, now: u64, found: &mut Admission) -> Option<Verdict> {
        let asked = self.asked(entry, now, found);
        if let Some(rec) = self.record(asked.id, now) {
            let mine = rec.owner == *asked.ticket;
            match standing(rec.held(&asked, mine), asked.expired, now) {
                Standing::Answered(verdict) => return Some(verdict),
                Standing::Vanished | Standing::Lapsed => return None,
                Standing::Afresh => {}
            }
        }
        self.judge_afresh(entry, &asked, now).err()
    }

    /// Whether a job `asked` for, made at `made`, is superseded at `now`.
    fn stale(&self, asked: &Asked<'_>, made: u64, now: u64) -> bool {
        (asked.latest.as_deref())
            .is_some_and(|l| self.superseded(l, made, asked.skew, asked.id, now))
    }

    /// "admit" for a job with a live record: its verdict, or `None` where
    /// the request is decided afresh (no live record, or another lineage's
    /// refunded admission).
    fn readmit(&mut self, entry: &Entry<'_>, asked: &Asked<'_>, now: u64) -> Option<Verdict> {
        let (id, dedup) = (asked.id, asked.dedup);
        let admitted_at = self.record(id, now).map(|rec| rec.admitted_at);
        // A time after the admission (a producer's clock ahead) counts as
        // the admission's.
        let stale_admission = admitted_at
            .is_some_and(|at| self.stale(asked, entry.made_at_ms.map_or(at, |m| m.min(at)), now));
        let rec = self.record(id, now)?;
        let mine = rec.owner == *asked.ticket;
        if let Some(verdict) = rec.settled(asked, mine, now) {
            return Some(verdict);
        }
        let admitted_at_ms = rec.admitted_at;
        match rec.state {
            JobState::Admitted if asked.expired => {
                rec.state = JobState::Refunded(Refund::Expired);
                rec.attempt = asked.attempt;
                rec.lease_until = 0;
                rec.answered = false;
                rec.until = now.saturating_add(dedup);
                self.logs.forget(&asked.scopes, admitted_at_ms, id);
                Some(Verdict::Expired)
            }
            JobState::Admitted if stale_admission => {
                rec.state = JobState::Refunded(Refund::Superseded);
                rec.owner = asked.ticket.clone();
                rec.attempt = asked.attempt;
                rec.lease_until = 0;
                rec.answered = false;
                rec.until = now.saturating_add(dedup);
                self.logs.forget(&asked.scopes, admitted_at_ms, id);
                Some(Verdict::Superseded { refunded: true })
            }
            JobState::Admitted => {
                rec.state = JobState::Sending;
                rec.owner = asked.ticket.clone();
                rec.attempt = asked.attempt;
                rec.lease_until = now.saturating_add(asked.lease);
                rec.answered = false;
                rec.until = now.saturating_add(dedup);
                Some(Verdict::Resumed { admitted_at_ms })
            }
            // Another lineage's refunded admission (every other state is
            // settled above): decide afresh.
            _ => None,
        }
    }

    /// How "admit" judges a job without a live record of its lineage, with
    /// no write: the shadow rule that would bind (and its wait) if it may
    /// be admitted, else its verdict (expired, suppressed, superseded or
    /// rejected).
    fn judge_afresh(
        &mut self,
        entry: &Entry<'_>,
        asked: &Asked<'_>,
        now: u64,
    ) -> Result<Option<(u64, RuleRef)>, Verdict> {
        if asked.expired {
            return Err(Verdict::Expired);
        }
        let keys = self.logs.keyspace();
        if keys.checks_suppression() {
            // Only bounces suppress here (no tool reaches this memory).
            let key = keys.bounce_key(entry.job.request.email);
            if self.suppressed.get(&key).is_some_and(|until| *until > now) {
                return Err(Verdict::Suppressed);
            }
        }
        let made = entry.made_at_ms.map_or(now, |m| m.min(now));
        if self.stale(asked, made, now) {
            return Err(Verdict::Superseded { refunded: false });
        }
        match self.logs.judge(&asked.scopes, now) {
            [Some((retry_after_ms, rule)), _] => Err(Verdict::Rejected {
                retry_after_ms,
                rule,
            }),
            [None, would_bind] => Ok(would_bind),
        }
    }

    /// "admit" for a job without a live record of its lineage: expired,
    /// superseded, rejected by a limit, or admitted (its logs, latest key
    /// and record written).
    fn admit_afresh(
        &mut self,
        entry: &Entry<'_>,
        asked: Asked<'_>,
        now: u64,
        found: &mut Admission,
    ) -> Verdict {
        let (id, scopes, dedup) = (asked.id, &asked.scopes, asked.dedup);
        let would_bind = match self.judge_afresh(entry, &asked, now) {
            Ok(would_bind) => would_bind,
            Err(verdict) => return verdict,
        };
        let made = entry.made_at_ms.map_or(now, |m| m.min(now));
        found.shadow = would_bind.map(|(_, rule)| rule);
        found.rooms = self.logs.rooms(scopes, now);
        self.logs.record(scopes, now, id);
        if let Some(latest) = asked.latest {
            let (jobs, until) = self.latest.entry(latest).or_default();
            jobs.retain(|(_, other)| other != id);
            jobs.push((made, id.to_owned()));
            // The newest 16 by when they were made, then by id (as a
            // sorted set trims them).
            jobs.sort_by(|a, b| b.cmp(a));
            jobs.truncate(16);
            *until = now.saturating_add(dedup);
        }
        self.records.insert(
            id.to_owned(),
            Record {
                fingerprint: asked.fingerprint,
                admitted_at: now,
                state: JobState::Sending,
                owner: asked.ticket.clone(),
                attempt: asked.attempt,
                lease_until: now.saturating_add(asked.lease),
                answered: false,
                until: now.saturating_add(dedup),
            },
        );
        Verdict::Admitted
    }
}

/// One request as "admit" judges it, worked out once before its record is
/// looked at.
struct Asked<'a> {
    id: &'a str,
    /// The asking lineage.
    ticket: &'a Ticket,
    fingerprint: Fingerprint,
    /// The limiter keys and rules that apply to it.
    scopes: Vec<Applied>,
    /// Its own expiry has passed.
    expired: bool,
    /// The lineage's attempt (at least 1) and this handling of it.
    attempt: (u32, u64),
    /// Its latest key, where its purpose supersedes.
    latest: Option<String>,
    skew: u64,
    lease: u64,
    dedup: u64,
}

impl Record {
    /// The record as a request `asked` for its id sees it (`mine`: the
    /// asking lineage owns it).
    fn held(&self, asked: &Asked<'_>, mine: bool) -> Held {
        Held {
            state: self.state,
            same_job: self.fingerprint == asked.fingerprint,
            mine,
            answered: self.answered,
            admitted_at: self.admitted_at,
            lease_until: self.lease_until,
        }
    }

    /// "admit"'s verdict on a live record that settles the request as it
    /// stands ([`standing`]), marking a send whose owner vanished unknown
    /// (never resent). `None` for an admitted record whose lease lapsed,
    /// or another lineage's refund.
    fn settled(&mut self, asked: &Asked<'_>, mine: bool, now: u64) -> Option<Verdict> {
        match standing(self.held(asked, mine), asked.expired, now) {
            Standing::Answered(verdict) => Some(verdict),
            Standing::Vanished => {
                self.state = JobState::Unknown;
                self.answered = false;
                self.until = now.saturating_add(asked.dedup);
                Some(Verdict::Unknown {
                    by_owner: mine,
                    answered: false,
                })
            }
            Standing::Lapsed | Standing::Afresh => None,
        }
    }
}

/// Whether `job`'s attempt of its lineage owns `rec`.
fn owns(rec: &Record, job: &JobRef<'_>) -> bool {
    rec.owner == *job.ticket && rec.attempt == (job.attempt.max(1), job.holder)
}

impl Ledger for MemoryLedger {
    async fn admit(&self, entry: &Entry<'_>, clock: Clock) -> Result<Admission, LedgerError> {
        let now = Self::now(clock);
        let mut state = self.lock();
        state.admissions += 1;
        if state.admissions.is_multiple_of(SWEEP_EVERY) {
            state.sweep(now);
        }
        let mut admission = Admission::at(now, Verdict::Admitted);
        admission.verdict = state.admit(entry, now, &mut admission);
        Ok(admission)
    }

    async fn peek(
        &self,
        entry: &Entry<'_>,
        clock: Clock,
    ) -> Result<Option<Admission>, LedgerError> {
        let now = Self::now(clock);
        let mut found = Admission::at(now, Verdict::Admitted);
        let verdict = self.lock().peek(entry, now, &mut found);
        Ok(verdict.map(|verdict| Admission { verdict, ..found }))
    }

    async fn release(&self, job: &JobRef<'_>) -> Result<bool, LedgerError> {
        let mut state = self.lock();
        let (now, dedup) = (state.clock, state.logs.keyspace().dedup_ms());
        Ok(match state.latest(job.request.id.as_str()) {
            Some(rec)
                if matches!(rec.state, JobState::Admitted | JobState::Sending)
                    && owns(rec, job) =>
            {
                rec.state = JobState::Admitted;
                rec.lease_until = 0;
                rec.until = now.saturating_add(dedup);
                true
            }
            _ => false,
        })
    }

    async fn settle(
        &self,
        job: &JobRef<'_>,
        ending: &Ending,
        answered: bool,
    ) -> Result<bool, LedgerError> {
        let mut state = self.lock();
        let (keys, now) = (state.logs.keyspace().clone(), state.clock);
        let id = job.request.id.as_str();
        let Some(rec) = state.latest(id) else {
            return Ok(false);
        };
        let mine = owns(rec, job);
        let admitted_at = rec.admitted_at;
        let unsent = matches!(rec.state, JobState::Admitted | JobState::Sending);
        let refund = match ending {
            Ending::Sent if !matches!(rec.state, JobState::Refunded(_)) => {
                rec.state = JobState::Sent;
                rec.owner = job.ticket.clone();
                rec.attempt = (job.attempt.max(1), job.holder);
                None
            }
            Ending::Unknown
                if mine && matches!(rec.state, JobState::Sending | JobState::Unknown) =>
            {
                rec.state = JobState::Unknown;
                None
            }
            Ending::Refund(how) if mine && unsent => {
                rec.state = JobState::Refunded(*how);
                Some(*how)
            }
            _ => return Ok(false),
        };
        rec.lease_until = 0;
        rec.answered = answered;
        rec.until = now.saturating_add(keys.dedup_ms());
        if let Some(how) = refund {
            let (back, kept): (Vec<_>, Vec<_>) = (keys.applicable(&job.request))
                .into_iter()
                .partition(|a| how.gives_back(a));
            state.logs.forget(&back, admitted_at, id);
            state.logs.keep(&kept, admitted_at, id);
        }
        Ok(true)
    }

    /// One process: its relays' own runs judge its bounces (no other
    /// worker's to count).
    async fn bounced(
        &self,
        email: &EmailAddress,
        _why: &str,
        _vouched: bool,
    ) -> Result<super::Bounced, LedgerError> {
        let mut state = self.lock();
        let keys = state.logs.keyspace();
        let Some(ms) = keys.bounce_suppression_ms() else {
            return Ok(super::Bounced::Off);
        };
        let key = keys.bounce_key(email);
        let until = state.clock.saturating_add(ms);
        // A longer one stands.
        let held = state.suppressed.entry(key).or_insert(until);
        *held = (*held).max(until);
        Ok(super::Bounced::Suppressed)
    }

    async fn answered(&self, job: &JobRef<'_>) -> Result<bool, LedgerError> {
        let mut state = self.lock();
        let (now, dedup) = (state.clock, state.logs.keyspace().dedup_ms());
        Ok(match state.latest(job.request.id.as_str()) {
            Some(rec) if rec.owner == *job.ticket => {
                rec.answered = true;
                rec.until = now.saturating_add(dedup);
                true
            }
            _ => false,
        })
    }

    async fn unbounced(&self, email: &EmailAddress) -> Result<bool, LedgerError> {
        let mut state = self.lock();
        let key = state.logs.keyspace().bounce_key(email);
        Ok(state.suppressed.remove(&key).is_some())
    }

    async fn unrecorded(&self, id: &crate::domain::JobId) -> Result<Option<u64>, LedgerError> {
        // The clock of its latest call: a moment before now, so a replay
        // judged from it errs towards "forgotten".
        let mut state = self.lock();
        let now = state.clock;
        Ok(state.latest(id.as_str()).is_none().then_some(now))
    }

    async fn health(&self) -> Result<(), LedgerError> {
        Ok(())
    }

    async fn clocks(&self) -> Result<Option<super::clock::Readings>, LedgerError> {
        Ok(None)
    }

    async fn watch_clock(
        &self,
        _: bool,
        _: Option<u64>,
    ) -> Result<Option<super::clock::Mark>, LedgerError> {
        Ok(None)
    }

    fn horizon_ms(&self) -> u64 {
        self.lock().logs.keyspace().horizon_ms()
    }
}

impl Quotas for MemoryLedger {
    type Error = LedgerError;

    async fn usage(
        &self,
        subject: Subject<'_>,
        purpose: Option<&Name>,
        clock: Clock,
    ) -> Result<Usage, LedgerError> {
        Ok(self.lock().logs.usage(subject, purpose, Self::now(clock)))
    }

    async fn reset(&self, subject: Subject<'_>) -> Result<(String, u64), LedgerError> {
        Ok(self.lock().logs.reset(subject))
    }
}
