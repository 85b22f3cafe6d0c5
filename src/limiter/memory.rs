use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use super::{
    Clock, Decision, Keyspace, LimitError, RateLimiter, Request, RuleRef, Subject, Usage, Verdict,
    binding_rule, usage_of,
};
use crate::domain::{JobId, Name};
use crate::settings::LimitSettings;

/// How many calls pass between sweeps of idle keys.
const SWEEP_EVERY: u64 = 1024;

/// The single-process limiter: the same semantics as [`super::RedisLimiter`]
/// (one conformance suite checks both), with state in this process.
///
/// For one worker, for tests, or where Redis is not wanted. Several workers
/// with in-memory limiters do **not** share quotas.
///
/// Memory stays bounded: a key's log never holds more than its largest rule
/// `max` entries within its longest window (older ones are dropped when the key
/// is touched), and every [`SWEEP_EVERY`] calls keys and job records that have
/// been idle for their longest window / the dedup period are removed.
#[derive(Clone)]
pub struct MemoryLimiter {
    inner: Arc<Mutex<State>>,
    keys: Arc<Keyspace>,
}

#[derive(Default)]
struct State {
    /// Scope key → admissions `(time, job id)`, ascending by time.
    logs: HashMap<String, Log>,
    /// Job record key → its admission.
    jobs: HashMap<String, JobRecord>,
    /// Answered job key → when the mark is forgotten.
    answered: HashMap<String, u64>,
    calls: u64,
}

struct Log {
    entries: VecDeque<(u64, Arc<str>)>,
    /// The key's longest window: after that long without an admission it is empty.
    longest_ms: u64,
}

struct JobRecord {
    at: u64,
    sent: bool,
    /// An SMTP transaction began and its outcome is not recorded.
    sending: bool,
    /// Its sender vanished mid-send: never sent again.
    unknown: bool,
    /// Until when (ms) an attempt owns the send.
    lease_until: u64,
    keys: Vec<String>,
    /// When the record is forgotten.
    expires_at: u64,
}

impl MemoryLimiter {
    /// A limiter with `limits`, empty.
    ///
    /// Keys carry no prefix: nothing else shares this process's memory.
    pub fn new(limits: &LimitSettings) -> Self {
        Self {
            inner: Arc::default(),
            keys: Arc::new(Keyspace::new("", limits)),
        }
    }

    /// How many keys and job records are held, for memory-bound tests.
    pub fn len(&self) -> (usize, usize) {
        let s = self.lock();
        (s.logs.len(), s.jobs.len())
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == (0, 0)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // No code path panics while holding the lock, and the state stays
        // consistent between statements; recover rather than poison forever.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn now(clock: Clock) -> u64 {
        match clock {
            Clock::At(ms) => ms,
            Clock::Server => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
                .unwrap_or(0),
        }
    }

    fn decide(&self, req: &Request<'_>, now: u64) -> Decision {
        let scopes = self.keys.applicable(req);
        let job_key = self.keys.job_key(req.id);
        let mut guard = self.lock();
        let state = &mut *guard;
        state.calls += 1;
        if state.calls.is_multiple_of(SWEEP_EVERY) {
            state.sweep(now);
        }
        let decision = |verdict| Decision {
            decided_at_ms: now,
            verdict,
        };

        let lease_ms = self.keys.lease_ms();
        if let Some(rec) = state.jobs.get_mut(&job_key).filter(|r| r.expires_at > now) {
            let admitted_at_ms = rec.at;
            return decision(if rec.sent {
                Verdict::Duplicate { admitted_at_ms }
            } else if rec.lease_until > now {
                Verdict::InProgress {
                    admitted_at_ms,
                    lease_left_ms: rec.lease_until - now,
                }
            } else if rec.sending || rec.unknown {
                rec.sending = false;
                rec.unknown = true;
                Verdict::Interrupted { admitted_at_ms }
            } else {
                rec.lease_until = now.saturating_add(lease_ms);
                Verdict::Resume { admitted_at_ms }
            });
        }

        let mut best: Option<(u64, RuleRef)> = None;
        let mut times = Vec::new();
        for (scope, key, set) in &scopes {
            let set = &self.keys.sets[*set];
            let rules = set.rules.as_slice();
            times.clear();
            if let Some(log) = state.logs.get_mut(key) {
                log.longest_ms = set.keep_ms;
                log.prune(now);
                times.extend(log.entries.iter().map(|(t, _)| *t));
            }
            if let Some((d, i)) = binding_rule(rules, &times, now)
                && best.is_none_or(|(bd, _)| d > bd)
            {
                let r = &rules[i];
                best = Some((
                    d,
                    RuleRef {
                        scope: *scope,
                        window_ms: r.window_ms(),
                        max: r.max,
                    },
                ));
            }
        }
        if let Some((retry_after_ms, rule)) = best {
            return decision(Verdict::Rejected {
                retry_after_ms,
                rule,
            });
        }

        let id: Arc<str> = Arc::from(req.id.as_str());
        let mut keys = Vec::with_capacity(scopes.len());
        for (_, key, set) in scopes {
            let longest_ms = self.keys.sets[set].keep_ms;
            let log = state.logs.entry(key.clone()).or_insert_with(|| Log {
                entries: VecDeque::new(),
                longest_ms,
            });
            // Keep the log sorted even if an explicit clock steps backwards.
            let at = log.entries.partition_point(|(t, _)| *t <= now);
            log.entries.insert(at, (now, id.clone()));
            keys.push(key);
        }
        state.jobs.insert(
            job_key,
            JobRecord {
                at: now,
                sent: false,
                sending: false,
                unknown: false,
                lease_until: now.saturating_add(lease_ms),
                keys,
                expires_at: now.saturating_add(self.keys.dedup_ms()),
            },
        );
        decision(Verdict::Admitted)
    }
}

impl Log {
    fn prune(&mut self, now: u64) {
        while self
            .entries
            .front()
            .is_some_and(|(t, _)| t.saturating_add(self.longest_ms) <= now)
        {
            self.entries.pop_front();
        }
    }
}

impl State {
    fn sweep(&mut self, now: u64) {
        self.logs.retain(|_, log| {
            log.prune(now);
            !log.entries.is_empty()
        });
        self.jobs.retain(|_, rec| rec.expires_at > now);
        self.answered.retain(|_, until| *until > now);
    }
}

impl RateLimiter for MemoryLimiter {
    async fn check(&self, req: &Request<'_>, clock: Clock) -> Result<Decision, LimitError> {
        Ok(self.decide(req, Self::now(clock)))
    }

    async fn refund(&self, id: &JobId) -> Result<bool, LimitError> {
        let job_key = self.keys.job_key(id);
        let mut state = self.lock();
        let Some(rec) = state.jobs.remove(&job_key) else {
            return Ok(false);
        };
        for key in rec.keys {
            if let Some(log) = state.logs.get_mut(&key) {
                log.entries.retain(|(_, member)| **member != *id.as_str());
                if log.entries.is_empty() {
                    state.logs.remove(&key);
                }
            }
        }
        Ok(true)
    }

    async fn mark_sent(&self, id: &JobId) -> Result<bool, LimitError> {
        let job_key = self.keys.job_key(id);
        let mut state = self.lock();
        Ok(match state.jobs.get_mut(&job_key) {
            Some(rec) => {
                rec.sent = true;
                rec.sending = false;
                rec.lease_until = 0;
                true
            }
            None => false,
        })
    }

    async fn usage(
        &self,
        subject: Subject<'_>,
        purpose: Option<&Name>,
        clock: Clock,
    ) -> Result<Usage, LimitError> {
        let now = Self::now(clock);
        let (key, set) = self.keys.lookup(subject, purpose);
        let times: Vec<u64> = self
            .lock()
            .logs
            .get(&key)
            .map(|log| log.entries.iter().map(|(t, _)| *t).collect())
            .unwrap_or_default();
        Ok(usage_of(key, subject.scope(), &set.rules, &times, now))
    }

    async fn mark_answered(&self, id: &JobId) -> Result<(), LimitError> {
        let until = Self::now(Clock::Server).saturating_add(self.keys.dedup_ms());
        let key = self.keys.answered_key(id);
        self.lock().answered.insert(key, until);
        Ok(())
    }

    async fn answered(&self, id: &JobId) -> Result<bool, LimitError> {
        let now = Self::now(Clock::Server);
        let key = self.keys.answered_key(id);
        Ok(self
            .lock()
            .answered
            .get(&key)
            .is_some_and(|&until| until > now))
    }

    async fn ping(&self) -> Result<(), LimitError> {
        Ok(())
    }

    async fn reset(&self, subject: Subject<'_>) -> Result<(String, u64), LimitError> {
        let key = self.keys.key_of(subject);
        let removed = self
            .lock()
            .logs
            .remove(&key)
            .map_or(0, |log| log.entries.len() as u64);
        Ok((key, removed))
    }

    async fn release(&self, id: &JobId) -> Result<bool, LimitError> {
        let job_key = self.keys.job_key(id);
        let mut state = self.lock();
        Ok(match state.jobs.get_mut(&job_key) {
            Some(rec) if !rec.sent && !rec.unknown => {
                rec.lease_until = 0;
                rec.sending = false;
                true
            }
            _ => false,
        })
    }

    async fn mark_sending(&self, id: &JobId) -> Result<bool, LimitError> {
        let now = Self::now(Clock::Server);
        let lease_ms = self.keys.lease_ms();
        let job_key = self.keys.job_key(id);
        let mut state = self.lock();
        Ok(match state.jobs.get_mut(&job_key) {
            Some(rec) if !rec.sent && !rec.sending && !rec.unknown => {
                rec.sending = true;
                rec.lease_until = now.saturating_add(lease_ms);
                true
            }
            _ => false,
        })
    }
}

impl MemoryLimiter {
    /// Drops every key and job record idle at `now` (ms) at once, rather than
    /// at the next periodic sweep. Lets tests check the memory bound.
    pub fn sweep(&self, now: u64) {
        self.lock().sweep(now);
    }
}
