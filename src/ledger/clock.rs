//! Redis's clock, watched.
//!
//! Limits, leases and record lifetimes run on Redis's clock, and Redis
//! expires keys by it. When that clock steps forward (a bad NTP source, a
//! resumed VM), windows see old admissions as older than they are, and
//! Redis deletes records and logs that still count: an id could be mailed
//! twice, a mailbox could get more than its rules allow. Three defences:
//!
//! - Every key lives `CLOCK_SLACK_MS` (an hour) longer than it is needed, so a step
//!   within that slack deletes nothing that counts.
//! - Every decision carries the worker's wall clock and
//!   `redis.max_clock_skew`; the script refuses to decide (`CLOCKSKEW`, an
//!   outage: the job waits, no attempt spent) when Redis's clock is further
//!   off. And each worker reads every primary's clock once a second and
//!   takes no job while one disagrees ([`Skew`]).
//! - A *canary* key, refreshed once a second by workers whose clocks agree
//!   with Redis's, lives a little less than the slack. If Redis deleted it
//!   before its time (the time of its last refresh is kept beside it),
//!   Redis's clock ran ahead by more than the slack since then, and may
//!   have deleted what still counts: the script records a [`Mark`], and no
//!   worker admits until whatever was lost would have expired anyway (by
//!   Redis's clock), or until an operator accepts the risk
//!   (`mailgate clock --accept`). Redis tells this by itself, so no
//!   worker's own clock (wrong, suspended, restarted) can raise or hide it.

use std::collections::HashMap;
use std::fmt;

use crate::limiter::CLOCK_SLACK_MS;

/// The clocks of a Redis deployment as one worker read them, at once.
#[derive(Debug, Clone)]
pub struct Readings {
    /// Each primary's time, ms since the epoch, by server.
    pub nodes: Vec<(String, u64)>,
    /// The worker's wall clock halfway through the round trip, ms since
    /// the epoch.
    pub wall_ms: u64,
    /// The round trip, ms: how far off a comparison may be.
    pub rtt_ms: u64,
    /// The worker's boot clock ([`boot_ms`]) at the same moment.
    pub boot_ms: u64,
}

pub use crate::domain::boot_ms;

/// How each primary's clock runs against this worker's boot clock. Redis's
/// clock running ahead of it by more than the canary's life means Redis may
/// have expired what still counts, even where the canary cannot tell: the
/// worker's wall clock stepped with Redis's (one bad NTP source for both),
/// or the step lasted longer than the canary's life (either could mail a
/// code twice). A worker's own wall clock plays no part, and its
/// boot clock counts a suspended host's sleep. What was there before the
/// worker started is its baseline.
#[derive(Debug, Default)]
pub struct Pace {
    /// Per server: Redis's time minus the boot clock, as followed (ms), and
    /// the boot clock when last read.
    baselines: HashMap<String, (i64, u64)>,
}

/// How fast a baseline follows a clock that drifts (NTP slews at most half
/// a millisecond a second): a step shows whole.
const DRIFT_PER_S: i64 = 1;

impl Pace {
    /// Follows `readings`; returns how far a primary's clock ran ahead
    /// (ms) if that is more than `life_ms`, and then starts afresh from it.
    pub fn observe(&mut self, readings: &Readings, life_ms: u64) -> Option<u64> {
        let boot = i64::try_from(readings.boot_ms).unwrap_or(i64::MAX);
        let life = i64::try_from(life_ms).unwrap_or(i64::MAX);
        let mut ahead = None;
        for (node, t) in &readings.nodes {
            let offset = i64::try_from(*t).unwrap_or(i64::MAX) - boot;
            let (base, at) = self
                .baselines
                .entry(node.clone())
                .or_insert((offset, readings.boot_ms));
            let allow = i64::try_from(readings.boot_ms.saturating_sub(*at) / 1000)
                .unwrap_or(i64::MAX)
                .saturating_mul(DRIFT_PER_S)
                .saturating_add(1);
            let delta = offset - *base;
            if delta > life {
                ahead = ahead.max(Some(delta.unsigned_abs()));
                *base = offset;
            } else {
                *base += delta.clamp(-allow, allow);
            }
            *at = readings.boot_ms;
        }
        ahead
    }
}

/// A primary whose clock disagrees with the worker's by more than
/// `redis.max_clock_skew`. One of them is wrong; this worker takes no job
/// until they agree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skew {
    /// The server.
    pub node: String,
    /// Redis's clock minus the worker's, ms (positive: Redis is ahead).
    pub skew_ms: i64,
    /// `redis.max_clock_skew`, ms.
    pub max_ms: u64,
}

impl Readings {
    /// The skew of the primary whose clock disagrees most with this
    /// worker's: Redis's clock minus the worker's, ms (0 with no primary).
    pub fn worst_skew_ms(&self) -> i64 {
        self.skews()
            .map(|(_, s)| s)
            .max_by_key(|s| s.unsigned_abs())
            .unwrap_or(0)
    }

    /// The primary that disagrees most with this worker past `max_ms`
    /// (allowing for half the round trip), if any.
    pub fn skewed(&self, max_ms: u64) -> Option<Skew> {
        let slop = i64::try_from(self.rtt_ms / 2 + 1).unwrap_or(i64::MAX);
        let max = i64::try_from(max_ms).unwrap_or(i64::MAX);
        (self.skews())
            .filter(|(_, s)| s.saturating_abs() > max.saturating_add(slop))
            .max_by_key(|(_, s)| s.unsigned_abs())
            .map(|(node, skew_ms)| Skew {
                node: node.to_owned(),
                skew_ms,
                max_ms,
            })
    }

    fn skews(&self) -> impl Iterator<Item = (&str, i64)> {
        let wall = i64::try_from(self.wall_ms).unwrap_or(i64::MAX);
        (self.nodes.iter())
            .map(move |(n, t)| (n.as_str(), i64::try_from(*t).unwrap_or(i64::MAX) - wall))
    }
}

/// How long the canary lives after a refresh, ms: the slack less
/// `redis.max_clock_skew`, so Redis deletes it before anything that still
/// counts (workers refresh it only while their clocks agree with Redis's
/// within that skew).
pub fn canary_ms(max_skew_ms: u64) -> u64 {
    CLOCK_SLACK_MS.saturating_sub(max_skew_ms).max(1)
}

/// A record, kept in Redis, that Redis deleted the canary before its time:
/// its clock ran more than the slack ahead since the canary's last refresh,
/// and may have deleted job records and admissions that still counted.
/// Every time is Redis's own. No worker admits until `until_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mark {
    /// Until when (Redis's clock, ms since the epoch) nothing is admitted:
    /// by then whatever was lost would have expired anyway.
    pub until_ms: u64,
    /// When the loss was found (Redis's clock).
    pub seen_ms: u64,
    /// When the canary was last refreshed before it (Redis's clock): the
    /// clock ran ahead at some moment between the two.
    pub since_ms: u64,
}

impl Mark {
    /// A stored mark, `<until> <seen> <since>`; `None` if it is not one.
    pub fn decode(s: &str) -> Option<Self> {
        let mut parts = s.split(' ');
        let mut number = || parts.next()?.parse().ok();
        Some(Mark {
            until_ms: number()?,
            seen_ms: number()?,
            since_ms: number()?,
        })
    }
}

/// Whether the worker may admit, as Redis's clocks say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every primary's clock agrees with the worker's, and no mark stands.
    Agrees,
    /// A primary's clock and the worker's disagree.
    Skewed(Skew),
    /// A mark stands: nothing is admitted until its time, or until an
    /// operator clears it.
    Marked(Mark),
}

impl Verdict {
    /// The verdict of `readings` and the mark that stands, if any.
    pub fn of(readings: &Readings, mark: Option<Mark>, max_skew_ms: u64) -> Self {
        match (mark, readings.skewed(max_skew_ms)) {
            (Some(mark), _) => Verdict::Marked(mark),
            (None, Some(skew)) => Verdict::Skewed(skew),
            (None, None) => Verdict::Agrees,
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Agrees => f.write_str("Redis's clock agrees with this worker's"),
            Verdict::Skewed(s) => write!(
                f,
                "the clock of Redis {} is {} {} this worker's (more than \
                 redis.max_clock_skew, {}): one of them is wrong (check NTP on both hosts); \
                 no job is taken until they agree, since limits, leases and the records \
                 that keep a code from being mailed twice run on Redis's clock",
                s.node,
                span(s.skew_ms.unsigned_abs()),
                if s.skew_ms > 0 { "ahead of" } else { "behind" },
                span(s.max_ms),
            ),
            Verdict::Marked(m) => write!(
                f,
                "Redis's clock ran more than an hour ahead between {} and {} (by Redis's clock): \
                 Redis expired a key before its time, so it may have expired job records that \
                 keep codes from being mailed twice, and admissions that count towards limits; \
                 no job is taken until {} by Redis's clock, when none of them would count any \
                 more, or until an operator runs `mailgate clock --accept` (codes admitted \
                 before may then be mailed again, and limits may let more through)",
                rfc3339(m.since_ms),
                rfc3339(m.seen_ms),
                rfc3339(m.until_ms),
            ),
        }
    }
}

/// A time in ms since the epoch, to the second, for people.
pub fn rfc3339(ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_seconds(t).to_string()
}

/// A span of ms, to the second, for people.
fn span(ms: u64) -> String {
    humantime::format_duration(std::time::Duration::from_secs(ms / 1000)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_800_000_000_000;

    fn at(redis: &[u64], wall: u64) -> Readings {
        Readings {
            nodes: (redis.iter())
                .enumerate()
                .map(|(i, t)| (format!("r{i}"), *t))
                .collect(),
            wall_ms: wall,
            rtt_ms: 2,
            boot_ms: wall - T0 + 5_000,
        }
    }

    #[test]
    fn the_primary_furthest_off_is_named() {
        let r = at(&[T0 + 3_000, T0 - 40_000, T0 + 20_000], T0);
        assert_eq!(r.worst_skew_ms(), -40_000);
        let s = r.skewed(10_000).expect("skewed");
        assert_eq!((s.node.as_str(), s.skew_ms), ("r1", -40_000));
        assert_eq!(
            at(&[T0 + 10_001], T0).skewed(10_000),
            None,
            "within the round trip"
        );
        assert_eq!(Verdict::of(&at(&[T0], T0), None, 10_000), Verdict::Agrees);
    }

    #[test]
    fn a_mark_outranks_a_skew() {
        let m = Mark {
            until_ms: 5,
            seen_ms: 4,
            since_ms: 3,
        };
        let r = at(&[T0 + 60_000], T0);
        assert_eq!(Verdict::of(&r, Some(m.clone()), 1_000), Verdict::Marked(m));
    }

    #[test]
    fn marks_decode_and_junk_is_none() {
        assert_eq!(
            Mark::decode("30 20 10"),
            Some(Mark {
                until_ms: 30,
                seen_ms: 20,
                since_ms: 10
            })
        );
        assert_eq!(Mark::decode("junk"), None);
        assert_eq!(Mark::decode("1 2"), None);
    }

    #[test]
    fn redis_running_ahead_of_the_boot_clock_past_the_canary_is_a_step() {
        let life = canary_ms(10_000);
        let mut pace = Pace::default();
        // A day of drift at 0.5 ms a second: never a step.
        for i in 0..86_400u64 {
            let r = at(&[T0 + i * 1000 + i / 2], T0 + i * 1000);
            assert_eq!(pace.observe(&r, life), None, "{i}");
        }
        // Redis and the wall clock step 25 h together: the boot clock tells.
        let t = T0 + 86_401_000;
        let mut r = at(&[t + 25 * 3_600_000], t + 25 * 3_600_000);
        r.boot_ms = t - T0 + 5_000;
        let ahead = pace.observe(&r, life).expect("a step");
        assert!(ahead > 25 * 3_600_000 - 60_000, "{ahead}");
        // Back again: no second step.
        let mut r = at(&[t + 1000], t + 1000);
        r.boot_ms = t - T0 + 6_000;
        assert_eq!(pace.observe(&r, life), None);
    }

    #[test]
    fn a_step_back_and_its_return_is_no_step() {
        let life = canary_ms(10_000);
        let mut pace = Pace::default();
        pace.observe(&at(&[T0], T0), life);
        let mut r = at(&[T0 + 1000 - 2 * 3_600_000], T0 + 1000);
        r.boot_ms = 6_000;
        assert_eq!(pace.observe(&r, life), None);
        let mut r = at(&[T0 + 2000], T0 + 2000);
        r.boot_ms = 7_000;
        assert_eq!(pace.observe(&r, life), None);
    }

    #[test]
    fn the_canary_dies_before_anything_that_counts() {
        assert_eq!(canary_ms(10_000), CLOCK_SLACK_MS - 10_000);
        assert!(canary_ms(30 * 60_000) >= 30 * 60_000);
    }
}
