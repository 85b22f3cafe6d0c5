//! One relay's circuit breaker as a state machine: closed, open after
//! `threshold` relay-level failures in a row, half-open while its probe
//! runs, then closed or open again. No I/O; the caller gives the clock.

use std::time::Duration;

use tokio::time::Instant;

/// Where a relay's circuit is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    /// The relay takes mail.
    Closed,
    /// The relay takes no mail until its probe.
    Open,
    /// The probe is running; the relay takes no mail meanwhile.
    HalfOpen,
}

impl State {
    /// Its name in messages.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            State::Closed => "closed",
            State::Open => "open",
            State::HalfOpen => "half-open",
        }
    }

    /// The gauge `mailgate_smtp_relay_circuit`: 0 closed, 1 half-open, 2 open.
    pub(super) fn gauge(self) -> f64 {
        match self {
            State::Closed => 0.0,
            State::HalfOpen => 1.0,
            State::Open => 2.0,
        }
    }
}

/// A change of a circuit's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Change {
    /// Closed → open: `failures` relay-level failures in a row.
    Opened,
    /// Open → half-open: the cool-down passed; the probe runs.
    HalfOpened,
    /// Half-open → closed: the probe succeeded.
    Closed,
    /// Half-open → open: the probe failed.
    Reopened,
}

/// One relay's circuit breaker: the state machine alone, no I/O, its
/// clock given by the caller.
#[derive(Debug, Clone)]
pub(super) struct Circuit {
    state: State,
    /// Relay-level failures in a row while closed.
    failures: u32,
    threshold: u32,
    cool_down: Duration,
    /// While open: when the probe is due.
    probe_at: Option<Instant>,
}

impl Circuit {
    /// A closed circuit that opens after `threshold` (at least 1)
    /// relay-level failures in a row, for `cool_down`.
    pub(super) fn new(threshold: u32, cool_down: Duration) -> Self {
        Self {
            state: State::Closed,
            failures: 0,
            threshold: threshold.max(1),
            cool_down,
            probe_at: None,
        }
    }

    /// Where it is.
    pub(super) fn state(&self) -> State {
        self.state
    }

    /// Whether sends may go to this relay.
    pub(super) fn takes_mail(&self) -> bool {
        self.state == State::Closed
    }

    /// A send or check on the relay failed at relay level. Only counted
    /// while closed: an open circuit is closed or reopened by its probe.
    pub(super) fn failure(&mut self, now: Instant) -> Option<Change> {
        if self.state != State::Closed {
            return None;
        }
        self.failures = self.failures.saturating_add(1);
        if self.failures < self.threshold {
            return None;
        }
        self.state = State::Open;
        self.probe_at = Some(now + self.cool_down);
        Some(Change::Opened)
    }

    /// A send or check on the relay worked: the count starts again.
    pub(super) fn success(&mut self) {
        if self.state == State::Closed {
            self.failures = 0;
        }
    }

    /// When the probe of an open circuit is due.
    pub(super) fn probe_at(&self) -> Option<Instant> {
        self.probe_at.filter(|_| self.state == State::Open)
    }

    /// Open and the cool-down passed: half-open now, and the caller probes.
    pub(super) fn start_probe(&mut self, now: Instant) -> Option<Change> {
        match self.probe_at() {
            Some(at) if at <= now => {
                self.state = State::HalfOpen;
                self.probe_at = None;
                Some(Change::HalfOpened)
            }
            _ => None,
        }
    }

    /// The probe's outcome: closed, or open for another cool-down.
    pub(super) fn probe_done(&mut self, ok: bool, now: Instant) -> Option<Change> {
        if self.state != State::HalfOpen {
            return None;
        }
        if ok {
            self.state = State::Closed;
            self.failures = 0;
            Some(Change::Closed)
        } else {
            self.state = State::Open;
            self.probe_at = Some(now + self.cool_down);
            Some(Change::Reopened)
        }
    }

    /// Relay-level failures in a row.
    pub(super) fn failures(&self) -> u32 {
        self.failures
    }

    /// How many relay-level failures in a row open it.
    pub(super) fn threshold(&self) -> u32 {
        self.threshold
    }

    /// How long it stays open before its probe.
    pub(super) fn cool_down(&self) -> Duration {
        self.cool_down
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    #[test]
    fn n_failures_in_a_row_open_the_circuit() {
        let t = Instant::now();
        let mut c = Circuit::new(3, Duration::from_secs(10));
        assert_eq!(c.failure(t), None);
        assert_eq!(c.failure(t), None);
        assert!(c.takes_mail());
        assert_eq!(c.failure(at(t, 5)), Some(Change::Opened));
        assert_eq!(c.state(), State::Open);
        assert!(!c.takes_mail());
        assert_eq!(c.probe_at(), Some(at(t, 10_005)));
        // Failures of sends that were under way do not push the probe back.
        assert_eq!(c.failure(at(t, 100)), None);
        assert_eq!(c.probe_at(), Some(at(t, 10_005)));
    }

    #[test]
    fn a_success_starts_the_count_again() {
        let t = Instant::now();
        let mut c = Circuit::new(3, Duration::from_secs(10));
        c.failure(t);
        c.failure(t);
        c.success();
        assert_eq!(c.failures(), 0);
        assert_eq!(c.failure(t), None);
        assert_eq!(c.failure(t), None);
        assert_eq!(c.failure(t), Some(Change::Opened));
        // Open: only the probe closes it, not a late success of a send
        // that began before it opened.
        c.success();
        assert_eq!(c.state(), State::Open);
    }

    #[test]
    fn the_probe_runs_after_the_cool_down_and_decides() {
        let t = Instant::now();
        let mut c = Circuit::new(1, Duration::from_secs(10));
        assert_eq!(c.failure(t), Some(Change::Opened));
        assert_eq!(c.start_probe(at(t, 9_999)), None, "still cooling down");
        assert_eq!(c.start_probe(at(t, 10_000)), Some(Change::HalfOpened));
        assert_eq!(c.state(), State::HalfOpen);
        assert!(!c.takes_mail(), "only the probe goes to a half-open relay");
        assert_eq!(c.start_probe(at(t, 10_001)), None, "one probe at a time");
        assert_eq!(c.failure(at(t, 10_001)), None);
        // The probe fails: open for another cool-down.
        assert_eq!(c.probe_done(false, at(t, 10_500)), Some(Change::Reopened));
        assert_eq!(c.probe_at(), Some(at(t, 20_500)));
        assert_eq!(c.start_probe(at(t, 20_500)), Some(Change::HalfOpened));
        assert_eq!(c.probe_done(true, at(t, 20_600)), Some(Change::Closed));
        assert!(c.takes_mail());
        assert_eq!((c.failures(), c.probe_at()), (0, None));
        // Closed again: it takes `threshold` failures to open again.
        assert_eq!(c.probe_done(true, at(t, 20_700)), None);
        assert_eq!(c.failure(at(t, 30_000)), Some(Change::Opened));
    }
}
