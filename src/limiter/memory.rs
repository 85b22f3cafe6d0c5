use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use super::{Applied, Judged, Keyspace, Rooms, Subject, Usage, judge_scope, room_of, usage_of};
use crate::domain::Name;

/// The limiter's logs in this process: the same semantics as the Redis logs
/// of `decide.lua` (one conformance suite checks both), for the in-memory
/// ledger. Not shared between processes, and not locked: its owner locks it.
///
/// Memory stays bounded: a key's log never holds entries older than its
/// keep (its longest window and a minute, see [`super::CLOCK_SLACK_MS`])
/// once the key is touched, and [`MemoryLogs::sweep`] drops keys idle for
/// their keep.
pub(crate) struct MemoryLogs {
    keys: Keyspace,
    /// Scope key → admissions `(time, job id)`, ascending by time.
    logs: HashMap<String, Log>,
}

struct Log {
    entries: VecDeque<(u64, Arc<str>)>,
    /// The key's keep: after that long without an admission it is empty.
    keep_ms: u64,
}

impl Log {
    fn prune(&mut self, now: u64) {
        while self
            .entries
            .front()
            .is_some_and(|(t, _)| t.saturating_add(self.keep_ms) <= now)
        {
            self.entries.pop_front();
        }
    }
}

impl MemoryLogs {
    /// Empty logs for `keys`' policy.
    pub(crate) fn new(keys: Keyspace) -> Self {
        Self {
            keys,
            logs: HashMap::new(),
        }
    }

    /// The policy and key names.
    pub(crate) fn keyspace(&self) -> &Keyspace {
        &self.keys
    }

    /// Which enforced rule binds `scopes` (as [`Keyspace::applicable`]
    /// lists them) at `now`, and after how long; then the same of the
    /// shadow rules (see [`Judged`]).
    pub(crate) fn judge(&mut self, scopes: &[Applied], now: u64) -> Judged {
        let mut best: Judged = [None, None];
        let mut times = Vec::new();
        for Applied {
            scope, key, set, ..
        } in scopes
        {
            times.clear();
            if let Some(log) = self.logs.get_mut(key) {
                log.keep_ms = set.keep_ms;
                log.prune(now);
                times.extend(log.entries.iter().map(|(t, _)| *t));
            }
            judge_scope(&mut best, *scope, set, times.as_slice(), now);
        }
        best
    }

    /// What is left of each of `scopes`' quota once an admission at `now`
    /// is recorded (asked before [`MemoryLogs::record`]).
    pub(crate) fn rooms(&self, scopes: &[Applied], now: u64) -> Rooms {
        let mut rooms = Rooms::default();
        let mut times = Vec::new();
        for Applied {
            scope, key, set, ..
        } in scopes
        {
            times.clear();
            if let Some(log) = self.logs.get(key) {
                times.extend(log.entries.iter().map(|(t, _)| *t));
            }
            if let Some(room) = room_of(*scope, &set.rules, &times, now) {
                rooms.set(room);
            }
        }
        rooms
    }

    /// Records job `id`'s admission at `now` in each of `scopes`.
    pub(crate) fn record(&mut self, scopes: &[Applied], now: u64, id: &str) {
        let id: Arc<str> = Arc::from(id);
        // A deny's entry records nothing: its scope's own entry does.
        for Applied { key, set, .. } in scopes.iter().filter(|a| a.set.deny_until_ms.is_none()) {
            let keep_ms = set.keep_ms;
            let log = self.logs.entry(key.clone()).or_insert_with(|| Log {
                entries: VecDeque::new(),
                keep_ms,
            });
            // Keep the log sorted even if an explicit clock steps backwards.
            let at = log.entries.partition_point(|(t, _)| *t <= now);
            log.entries.insert(at, (now, id.clone()));
        }
    }

    /// Removes job `id`'s admission made at `at` from `scopes` (a refund).
    /// An admission of the same id at another time (made after an earlier
    /// record of the id was forgotten) stays.
    pub(crate) fn forget(&mut self, scopes: &[Applied], at: u64, id: &str) {
        for Applied { key, .. } in scopes {
            if let Some(log) = self.logs.get_mut(key) {
                log.entries
                    .retain(|(t, member)| *t != at || **member != *id);
                if log.entries.is_empty() {
                    self.logs.remove(key);
                }
            }
        }
    }

    /// A failed job's admission at `at` stays counted in `scopes` (its
    /// requester's), under a name no job's id has (`id` and a `\u{1}`: ids
    /// hold no control character), as `decide.lua`'s `keep`: the id
    /// admitted again is a new entry, and its refund never takes this one.
    pub(crate) fn keep(&mut self, scopes: &[Applied], at: u64, id: &str) {
        let kept: Arc<str> = format!("{id}\u{1}").into();
        for Applied { key, .. } in scopes {
            if let Some(log) = self.logs.get_mut(key) {
                for (t, member) in log.entries.iter_mut() {
                    if *t == at && **member == *id {
                        *member = kept.clone();
                    }
                }
            }
        }
    }

    /// See [`super::Quotas::usage`].
    pub(crate) fn usage(&self, subject: Subject<'_>, purpose: Option<&Name>, now: u64) -> Usage {
        let (key, set, hit) = self.keys.lookup(subject, purpose);
        let times: Vec<u64> = self
            .logs
            .get(&key)
            .map(|log| log.entries.iter().map(|(t, _)| *t).collect())
            .unwrap_or_default();
        let exempt = self.keys.exempts(subject);
        usage_of(
            key,
            subject.scope(),
            &set,
            hit.as_ref(),
            &times,
            now,
            exempt,
        )
    }

    /// See [`super::Quotas::reset`].
    pub(crate) fn reset(&mut self, subject: Subject<'_>) -> (String, u64) {
        let key = self.keys.key_of(subject);
        let removed = self
            .logs
            .remove(&key)
            .map_or(0, |log| log.entries.len() as u64);
        (key, removed)
    }

    /// Drops every key idle at `now` for its keep.
    pub(crate) fn sweep(&mut self, now: u64) {
        self.logs.retain(|_, log| {
            log.prune(now);
            !log.entries.is_empty()
        });
    }

    /// How many keys are held, for memory-bound tests.
    pub(crate) fn len(&self) -> usize {
        self.logs.len()
    }
}
