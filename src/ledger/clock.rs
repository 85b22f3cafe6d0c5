//! Redis's clock, watched.
//!
//! Limits, leases and record lifetimes run on Redis's clock, and Redis
//! expires keys by it. When that clock steps forward (a bad NTP source, a
//! resumed VM), windows see old admissions as older than they are, and
//! Redis deletes records and logs that still count: an id could be mailed
//! twice, a mailbox could get more than its rules allow. Every key lives
//! [`CLOCK_SLACK_MS`] longer than it is needed, so a step within that
//! slack deletes nothing that counts. Each worker reads every primary's
//! clock once a second ([`Watch`]) and stops taking jobs while one
//! disagrees with its own by more than `redis.max_clock_skew`. A step
//! forward beyond the slack may already have deleted what counts: the
//! worker that sees it leaves a [`Mark`] in Redis, and no worker admits
//! while it stands, until everything lost would have expired anyway, or
//! until an operator accepts the risk (`mailgate clock --accept`).
//!
//! Steps are told from a worker's own wrong clock by the worker's monotonic
//! clock: a worker whose wall clock is off sees Redis's at a steady offset
//! and only holds itself back; it never marks the store.

use std::collections::HashMap;
use std::fmt;
use std::time::Instant;

use crate::limiter::CLOCK_SLACK_MS;

/// The clocks of a Redis deployment as one worker read them, at once.
#[derive(Debug, Clone)]
pub struct Readings {
    /// Each primary's time, ms since the epoch, by server.
    pub nodes: Vec<(String, u64)>,
    /// The worker's wall clock halfway through the round trip, ms since
    /// the epoch.
    pub wall_ms: u64,
    /// The worker's monotonic clock at the same moment.
    pub mono: Instant,
    /// The round trip, ms: how far off a comparison may be.
    pub rtt_ms: u64,
    /// The mark stored in Redis, if any.
    pub mark: Option<Mark>,
}

/// A record, kept in Redis, that a primary's clock stepped forward by more
/// than [`CLOCK_SLACK_MS`]: Redis may have expired job records and limiter
/// logs that still counted. No worker admits until `until_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mark {
    /// Until when (a worker's wall clock, ms since the epoch) nothing is
    /// admitted: by then whatever was lost would have expired anyway.
    pub until_ms: u64,
    /// How far ahead the clock was, ms.
    pub ahead_ms: u64,
    /// When the step was seen (a worker's wall clock, ms since the epoch).
    pub seen_ms: u64,
    /// The server whose clock stepped.
    pub node: String,
}

impl Readings {
    /// The skew of the primary whose clock disagrees most with this
    /// worker's: Redis's clock minus the worker's, ms (0 with no primary).
    pub fn worst_skew_ms(&self) -> i64 {
        let wall = i64::try_from(self.wall_ms).unwrap_or(i64::MAX);
        (self.nodes.iter())
            .map(|(_, t)| i64::try_from(*t).unwrap_or(i64::MAX).saturating_sub(wall))
            .max_by_key(|skew| skew.unsigned_abs())
            .unwrap_or(0)
    }
}

impl Mark {
    /// The mark as stored: `<until> <ahead> <seen> <node>`.
    pub fn encode(&self) -> String {
        format!(
            "{} {} {} {}",
            self.until_ms, self.ahead_ms, self.seen_ms, self.node
        )
    }

    /// A stored mark; `None` if it is not one (it is then ignored, and the
    /// next mark replaces it).
    pub fn decode(s: &str) -> Option<Self> {
        let mut parts = s.splitn(4, ' ');
        let mut number = || parts.next()?.parse().ok();
        let (until_ms, ahead_ms, seen_ms) = (number()?, number()?, number()?);
        let node = parts.next()?.to_owned();
        Some(Mark {
            until_ms,
            ahead_ms,
            seen_ms,
            node,
        })
    }
}

/// Whether the worker may admit, as its last readings say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every primary's clock agrees with the worker's, and no mark stands.
    Agrees,
    /// A primary's clock and the worker's disagree by more than
    /// `redis.max_clock_skew` (positive: Redis is ahead). One of them is
    /// wrong; nothing is admitted until they agree.
    Skewed {
        /// The server.
        node: String,
        /// Redis's clock minus the worker's, ms.
        skew_ms: i64,
        /// `redis.max_clock_skew`, ms.
        max_ms: u64,
    },
    /// A step beyond the slack was seen; nothing is admitted until the
    /// mark's time, or until an operator clears it.
    Marked(Mark),
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Agrees => f.write_str("Redis's clock agrees with this worker's"),
            Verdict::Skewed {
                node,
                skew_ms,
                max_ms,
            } => write!(
                f,
                "the clock of Redis {node} is {} {} this worker's (more than \
                 redis.max_clock_skew, {}): one of them is wrong (check NTP on both hosts); \
                 no job is taken until they agree, since limits, leases and the records \
                 that keep a code from being mailed twice run on Redis's clock",
                span(skew_ms.unsigned_abs()),
                if *skew_ms > 0 { "ahead of" } else { "behind" },
                span(*max_ms),
            ),
            Verdict::Marked(m) => write!(
                f,
                "the clock of Redis {} stepped {} ahead (seen at {}), more \
                 than the hour mailgate's keys outlive their use: Redis may have expired job \
                 records that keep codes from being mailed twice, and admissions that count \
                 towards limits; no job is taken until {}, when none of them \
                 would count any more, or until an operator runs `mailgate clock --accept` \
                 (codes admitted before may then be mailed again, and limits may let more \
                 through)",
                m.node,
                span(m.ahead_ms),
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

/// What one worker has seen of each primary's clock.
#[derive(Debug)]
pub struct Watch {
    /// `redis.max_clock_skew`, ms.
    max_skew_ms: u64,
    /// Each primary's clock when it last agreed with itself.
    baselines: HashMap<String, Baseline>,
    /// The monotonic clock's origin: the first readings' moment.
    origin: Option<Instant>,
}

/// A primary's clock as last seen without a step.
#[derive(Debug, Clone, Copy)]
struct Baseline {
    /// Redis's time minus the worker's monotonic clock then, ms.
    offset_ms: i64,
    /// Redis's time minus the worker's wall clock then, ms.
    skew_ms: i64,
}

impl Watch {
    /// A watch for `redis.max_clock_skew` (`max_skew_ms`).
    pub fn new(max_skew_ms: u64) -> Self {
        Watch {
            max_skew_ms,
            baselines: HashMap::new(),
            origin: None,
        }
    }

    /// Judges a set of readings; returns the verdict and the mark to
    /// store, if these readings show a step beyond the slack. A mark holds
    /// for `horizon_ms`: how long after a step whatever it deleted could
    /// still have counted (the longest of `limits.dedup_for` and the rules'
    /// windows).
    pub fn observe(&mut self, r: &Readings, horizon_ms: u64) -> (Verdict, Option<Mark>) {
        let origin = *self.origin.get_or_insert(r.mono);
        let mono_ms =
            i64::try_from(r.mono.saturating_duration_since(origin).as_millis()).unwrap_or(i64::MAX);
        let (max, slack, slop) = (
            i64::try_from(self.max_skew_ms).unwrap_or(i64::MAX),
            i64::try_from(CLOCK_SLACK_MS).unwrap_or(i64::MAX),
            i64::try_from(r.rtt_ms / 2 + 1).unwrap_or(i64::MAX),
        );
        let mut new_mark: Option<Mark> = None;
        let mut worst: Option<(&str, i64)> = None;
        for (node, redis_ms) in &r.nodes {
            let redis_ms = i64::try_from(*redis_ms).unwrap_or(i64::MAX);
            let now = Baseline {
                offset_ms: redis_ms - mono_ms,
                skew_ms: redis_ms - i64::try_from(r.wall_ms).unwrap_or(i64::MAX),
            };
            let agrees = now.skew_ms.abs() <= max + slop;
            if !agrees && worst.is_none_or(|(_, w)| now.skew_ms.abs() > w.abs()) {
                worst = Some((node, now.skew_ms));
            }
            let Some(base) = self.baselines.get_mut(node) else {
                self.baselines.insert(node.clone(), now);
                continue;
            };
            let jump = now.offset_ms - base.offset_ms;
            // Forward past the slack: keys that counted may be gone. Back
            // past it, from far ahead to agreeing: the step forward came
            // before this worker looked, and may have cost the same.
            let ahead = if jump > slack + slop {
                Some(jump)
            } else if jump < -(slack + slop) && base.skew_ms > slack && agrees {
                Some(base.skew_ms)
            } else {
                None
            };
            if let Some(ahead) = ahead {
                let mark = Mark {
                    until_ms: r.wall_ms.saturating_add(horizon_ms),
                    ahead_ms: ahead.unsigned_abs(),
                    seen_ms: r.wall_ms,
                    node: node.clone(),
                };
                if new_mark.as_ref().is_none_or(|m| m.ahead_ms < mark.ahead_ms) {
                    new_mark = Some(mark);
                }
            }
            // Drift (NTP slewing either clock) moves the baseline along; a
            // step leaves it until the clock comes back, or until it agrees
            // with the wall clock again (the step corrected it).
            if jump.abs() <= max + slop || agrees {
                *base = now;
            }
        }
        let standing = [new_mark.as_ref(), r.mark.as_ref()]
            .into_iter()
            .flatten()
            .filter(|m| m.until_ms > r.wall_ms)
            .max_by_key(|m| m.until_ms);
        let verdict = match (standing, worst) {
            (Some(m), _) => Verdict::Marked(m.clone()),
            (None, Some((node, skew_ms))) => Verdict::Skewed {
                node: node.to_owned(),
                skew_ms,
                max_ms: self.max_skew_ms,
            },
            (None, None) => Verdict::Agrees,
        };
        (verdict, new_mark)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const H: u64 = 3_600_000;
    const T0: u64 = 1_800_000_000_000;
    /// The horizon: `limits.dedup_for` by default.
    const DAY: u64 = 24 * H;

    /// Readings `after` ms into the watch, Redis at `redis` and the worker's
    /// wall clock at `wall`.
    fn at(since: Instant, after: u64, redis: u64, wall: u64, mark: Option<Mark>) -> Readings {
        Readings {
            nodes: vec![("r1".to_owned(), redis)],
            wall_ms: wall,
            mono: since + Duration::from_millis(after),
            rtt_ms: 1,
            mark,
        }
    }

    #[test]
    fn a_clock_that_agrees_admits_and_drift_is_followed() {
        let since = Instant::now();
        let mut w = Watch::new(10_000);
        for i in 0..100u64 {
            // 5 ms of drift a second, 500 ms in all: never a step.
            let r = at(since, i * 1000, T0 + i * 1005, T0 + i * 1000, None);
            assert_eq!(w.observe(&r, DAY), (Verdict::Agrees, None));
        }
    }

    #[test]
    fn a_small_step_holds_until_the_clock_comes_back_and_marks_nothing() {
        let since = Instant::now();
        let mut w = Watch::new(10_000);
        w.observe(&at(since, 0, T0, T0, None), DAY);
        let (v, mark) = w.observe(
            &at(since, 1000, T0 + 1000 + 30 * 60_000, T0 + 1000, None),
            DAY,
        );
        assert!(
            matches!(v, Verdict::Skewed { skew_ms, .. } if skew_ms == 30 * 60_000),
            "{v:?}"
        );
        assert_eq!(mark, None, "within the slack nothing that counts was lost");
        let (v, _) = w.observe(&at(since, 2000, T0 + 2000, T0 + 2000, None), DAY);
        assert_eq!(v, Verdict::Agrees);
    }

    #[test]
    fn a_step_past_the_slack_marks_the_store_until_the_horizon() {
        let since = Instant::now();
        let mut w = Watch::new(10_000);
        w.observe(&at(since, 0, T0, T0, None), DAY);
        let (v, mark) = w.observe(&at(since, 1000, T0 + 1000 + 25 * H, T0 + 1000, None), DAY);
        let mark = mark.expect("a mark");
        assert_eq!((mark.ahead_ms, mark.until_ms), (25 * H, T0 + 1000 + 24 * H));
        assert_eq!(v, Verdict::Marked(mark.clone()));
        // Back again: the mark, stored, still holds every worker back...
        let r = at(since, 2000, T0 + 2000, T0 + 2000, Some(mark.clone()));
        assert_eq!(w.observe(&r, DAY), (Verdict::Marked(mark.clone()), None));
        // ...until its time.
        let later = T0 + 25 * H;
        let r = at(since, 25 * H, later, later, Some(mark));
        assert_eq!(w.observe(&r, DAY), (Verdict::Agrees, None));
    }

    #[test]
    fn a_step_that_came_before_the_worker_is_marked_when_it_comes_back() {
        let since = Instant::now();
        let mut w = Watch::new(10_000);
        let (v, mark) = w.observe(&at(since, 0, T0 + 25 * H, T0, None), DAY);
        assert!(matches!(v, Verdict::Skewed { .. }), "{v:?}");
        assert_eq!(mark, None, "a worker's own wrong clock looks the same");
        let (v, mark) = w.observe(&at(since, 1000, T0 + 1000, T0 + 1000, None), DAY);
        assert_eq!(mark.as_ref().map(|m| m.ahead_ms), Some(25 * H));
        assert!(matches!(v, Verdict::Marked(_)), "{v:?}");
    }

    #[test]
    fn a_worker_whose_own_clock_is_wrong_holds_only_itself_back() {
        let since = Instant::now();
        let mut w = Watch::new(10_000);
        for i in 0..5u64 {
            // The worker's wall clock 2 h behind; Redis steady.
            let r = at(since, i * 1000, T0 + i * 1000, T0 - 2 * H + i * 1000, None);
            let (v, mark) = w.observe(&r, DAY);
            assert!(matches!(v, Verdict::Skewed { skew_ms, .. } if skew_ms == 2 * H as i64));
            assert_eq!(mark, None);
        }
        // Its clock is corrected: it agrees, and nothing was marked.
        let r = at(since, 5000, T0 + 5000, T0 + 5000, None);
        assert_eq!(w.observe(&r, DAY), (Verdict::Agrees, None));
    }

    #[test]
    fn a_corrected_redis_clock_past_the_slack_marks() {
        let since = Instant::now();
        let mut w = Watch::new(10_000);
        // Redis 2 h behind (the worker is held back), then corrected: its
        // keys were set to expire by the slow clock, and now expire 2 h
        // early.
        w.observe(&at(since, 0, T0 - 2 * H, T0, None), DAY);
        let (v, mark) = w.observe(&at(since, 1000, T0 + 1000, T0 + 1000, None), DAY);
        assert_eq!(mark.map(|m| m.ahead_ms), Some(2 * H));
        assert!(matches!(v, Verdict::Marked(_)));
    }

    #[test]
    fn marks_round_trip_and_junk_is_ignored() {
        let m = Mark {
            until_ms: 5,
            ahead_ms: 6,
            seen_ms: 7,
            node: "10.0.0.1:6379 x".to_owned(),
        };
        assert_eq!(Mark::decode(&m.encode()), Some(m));
        assert_eq!(Mark::decode("junk"), None);
        assert_eq!(Mark::decode("1 2"), None);
    }
}
