//! Several SMTP relays in order of preference, each with its own
//! connection pool and a circuit breaker.
//!
//! A send goes to the first relay whose circuit is closed; a relay-level
//! failure ([`MailError::Relay`]: nothing of the mail was handed over) moves
//! it on to the next one, within the same deadline. Any other outcome ends
//! the send where it happened: a mail refused or deferred by a relay is not
//! offered to another (unless the refusal is the relay's, whatever the
//! mail: [`super::smtp::Refusal`], and a suspect refusal that repeats for
//! other recipients in a row, [`Relays::judge_suspect`]), and one whose
//! final dot was written is never sent again anywhere.
//!
//! Each relay's [`Circuit`] counts its relay-level failures in a row
//! ([`super::smtp::Failed::is_relay_fault`]); at `smtp.circuit.failures` it
//! opens: the relay takes no mail for `smtp.circuit.cool_down`. Then it is
//! half-open and one probe runs, a session set up and a NOOP, as `/readyz`
//! does: success closes the circuit, failure opens it for another
//! cool-down. The probe is a NOOP rather than a real mail because when
//! every circuit is open the worker takes no jobs, so there is no mail to
//! probe with, and a probe that fails then costs no job an attempt.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use lettre::address::Envelope;
use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;

use super::MailError;
use super::pool::{Failure, SmtpPool};
use crate::telemetry;

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
    fn as_str(self) -> &'static str {
        match self {
            State::Closed => "closed",
            State::Open => "open",
            State::HalfOpen => "half-open",
        }
    }

    /// The gauge `mailgate_smtp_relay_circuit`: 0 closed, 1 half-open, 2 open.
    fn gauge(self) -> f64 {
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
    pub(super) fn new(threshold: u32, cool_down: Duration) -> Self {
        Self {
            state: State::Closed,
            failures: 0,
            threshold: threshold.max(1),
            cool_down,
            probe_at: None,
        }
    }

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
}

/// One relay: its name, connections, circuit and latest health.
struct Relay {
    name: String,
    pool: SmtpPool,
    status: Mutex<Status>,
}

struct Status {
    circuit: Circuit,
    /// `Err(why)` after a relay-level failure, `Ok` after a send or a
    /// session setup that worked.
    health: Result<(), String>,
    /// The latest run of one suspect refusal ([`Failure::suspect`]) to
    /// different recipients in a row; ended by a mail it took (not by a
    /// probe: a relay that refuses every RCPT passes one).
    streak: Option<Streak>,
}

/// A run of one refusal code to different recipients in a row.
#[derive(Debug, Clone)]
struct Streak {
    code: u16,
    /// The different recipients it came for (hashes of their lower-cased
    /// addresses), at most [`STREAK`].
    recipients: Vec<u64>,
}

/// How many different recipients one suspect refusal must come for in a
/// row to be the relay's: enough that two full mailboxes and their own
/// retries (taking turns) are never taken for a failing relay.
const STREAK: usize = 3;

impl Streak {
    /// The streak after a refusal `code` to `recipient`: it grows by a
    /// recipient it has not seen (a recipient refused again, a full mailbox
    /// retried, adds nothing), else a new one starts.
    fn after(old: Option<Streak>, code: u16, recipient: u64) -> Streak {
        match old {
            Some(mut s) if s.code == code => {
                if !s.recipients.contains(&recipient) && s.recipients.len() < STREAK {
                    s.recipients.push(recipient);
                }
                s
            }
            _ => Streak {
                code,
                recipients: vec![recipient],
            },
        }
    }
}

/// Poisoning cannot leave these values half-updated (each update is a few
/// assignments with no panic between them), so a poisoned lock is used as
/// it is.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The relays, in order of preference.
pub(super) struct Relays {
    list: Vec<Relay>,
    /// `smtp.timeout`, for probes.
    timeout: Duration,
    /// The mailer's `pool_size` slots: a probe takes one, so connections
    /// never exceed `pool_size`.
    slots: Arc<Semaphore>,
    /// Whether some circuit is closed; watched by [`Relays::until_available`].
    available: watch::Sender<bool>,
    /// Callers of [`Relays::until_available`] waiting right now.
    waiting: AtomicUsize,
    /// Itself, for the probe tasks (which hold it weakly, so they end with
    /// the mailer).
    this: Weak<Relays>,
}

impl Relays {
    pub(super) fn new(
        relays: Vec<(String, SmtpPool)>,
        circuit: &crate::settings::CircuitSettings,
        timeout: Duration,
        slots: Arc<Semaphore>,
    ) -> Arc<Self> {
        let (available, _) = watch::channel(true);
        let list = relays
            .into_iter()
            .map(|(name, pool)| {
                telemetry::smtp_relay_registered(&name);
                Relay {
                    name,
                    pool,
                    status: Mutex::new(Status {
                        circuit: Circuit::new(circuit.failures, circuit.cool_down),
                        health: Ok(()),
                        streak: None,
                    }),
                }
            })
            .collect();
        let relays = Arc::new_cyclic(|this| Self {
            list,
            timeout,
            slots,
            available,
            waiting: AtomicUsize::new(0),
            this: this.clone(),
        });
        telemetry::smtp_relay_up(true);
        relays
    }

    /// Sends one mail by the first relay that takes mail, going on to the
    /// next after a relay-level failure, all within `deadline`. With no
    /// relay taking mail, a [`MailError::Relay`] naming each one's state.
    pub(super) async fn send(
        &self,
        envelope: &Envelope,
        message: &[u8],
        deadline: Instant,
    ) -> Result<(), MailError> {
        let mut tried: Vec<String> = Vec::new();
        for (i, relay) in self.list.iter().enumerate() {
            if !lock(&relay.status).circuit.takes_mail() {
                continue;
            }
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            // A relay that is not the last to try gets half the time left
            // to set a session up, so a silent one leaves time for the next.
            let later = self.list[i + 1..]
                .iter()
                .any(|r| lock(&r.status).circuit.takes_mail());
            let open_by = if later {
                now + (deadline - now) / 2
            } else {
                deadline
            };
            match relay.pool.send(envelope, message, open_by, deadline).await {
                Ok(()) => {
                    telemetry::smtp_relay_sent(&relay.name);
                    lock(&relay.status).streak = None;
                    self.worked(i);
                    return Ok(());
                }
                Err(failure) => {
                    let failure = self.judge_suspect(i, failure, envelope);
                    self.record(i, &failure);
                    match failure.error {
                        // Nothing of the mail was handed over: the next relay.
                        MailError::Relay(why) => tried.push(self.named(i, &why)),
                        // Deferred, refused, or maybe delivered: this mail's
                        // answer, never offered to another relay.
                        other => return Err(other),
                    }
                }
            }
        }
        if tried.is_empty() {
            return Err(MailError::Relay(format!(
                "relay: no SMTP relay takes mail now: {}",
                self.states()
            )));
        }
        Err(MailError::Relay(tried.join("; ")))
    }

    /// A suspect refusal ([`Failure::suspect`]) that has come for
    /// [`STREAK`] different recipients in a row is the relay's: a relay
    /// failure (counted against its circuit, and the mail goes on to the
    /// next relay; nothing was delivered). Before that each keeps its own
    /// class: a full mailbox, or two, and their retries fail alone.
    fn judge_suspect(&self, i: usize, failure: Failure, envelope: &Envelope) -> Failure {
        let Some(code) = failure.suspect else {
            return failure;
        };
        let recipient = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            for to in envelope.to() {
                to.to_string().to_ascii_lowercase().hash(&mut h);
            }
            h.finish()
        };
        let mut s = lock(&self.list[i].status);
        let streak = Streak::after(s.streak.take(), code, recipient);
        let seen = streak.recipients.len();
        s.streak = Some(streak);
        drop(s);
        if seen < STREAK {
            return failure;
        }
        Failure {
            error: MailError::Relay(format!(
                "relay: {} refused {seen} different recipients in a row with {code}, so it \
                 is the relay's: {}",
                self.list[i].name, failure.error
            )),
            relay_fault: true,
            suspect: None,
        }
    }

    /// For readiness: a session and NOOP on the first relay that takes
    /// mail, then the next if it fails. Each outcome counts as a send's.
    pub(super) async fn check(&self, deadline: Instant) -> Result<(), MailError> {
        let mut errors: Vec<String> = Vec::new();
        for (i, relay) in self.list.iter().enumerate() {
            if !lock(&relay.status).circuit.takes_mail() {
                continue;
            }
            match relay.pool.check(deadline).await {
                Ok(()) => {
                    self.worked(i);
                    return Ok(());
                }
                Err(failure) => {
                    self.record(i, &failure);
                    errors.push(self.named(i, &failure.error.to_string()));
                }
            }
        }
        match self.health() {
            Err(why) => Err(MailError::Relay(why)),
            Ok(()) if errors.is_empty() => Ok(()),
            Ok(()) => Err(MailError::Relay(errors.join("; "))),
        }
    }

    /// Each relay checked on its own (for `check-config --connect`), even
    /// those whose circuit is open.
    pub(super) async fn check_each(&self) -> Vec<(String, Result<(), MailError>)> {
        let mut out = Vec::new();
        for relay in &self.list {
            let r = relay
                .pool
                .check(Instant::now() + self.timeout)
                .await
                .map_err(|f| f.error);
            out.push((relay.name.clone(), r));
        }
        out
    }

    /// `Ok` while some relay takes mail and its latest send or session
    /// setup worked; else `Err` with each relay's state and why.
    pub(super) fn health(&self) -> Result<(), String> {
        let healthy = self.list.iter().any(|r| {
            let s = lock(&r.status);
            s.circuit.takes_mail() && s.health.is_ok()
        });
        if healthy {
            return Ok(());
        }
        if let [relay] = &self.list[..] {
            // One relay: its own words, as before relays were listed.
            let s = lock(&relay.status);
            let why = s.health.clone().err().unwrap_or_default();
            return Err(match s.circuit.state() {
                State::Closed => why,
                state => format!("{why} (circuit {}{})", state.as_str(), self.next_probe(&s)),
            });
        }
        Err(format!("no SMTP relay takes mail: {}", self.states()))
    }

    /// Whether some relay's circuit is closed.
    pub(super) fn available(&self) -> bool {
        *self.available.borrow()
    }

    /// Waits until some relay's circuit is closed.
    pub(super) async fn until_available(&self) {
        struct Waiting<'a>(&'a AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::Relaxed);
            }
        }
        let mut rx = self.available.subscribe();
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let _waiting = Waiting(&self.waiting);
        // The sender lives as long as `self`, so this cannot fail.
        let _ = rx.wait_for(|up| *up).await;
    }

    /// How many callers wait in [`Relays::until_available`] now.
    pub(super) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Every relay's name, circuit state and latest failure.
    fn states(&self) -> String {
        self.list
            .iter()
            .map(|r| {
                let s = lock(&r.status);
                let state = match (s.circuit.state(), &s.health) {
                    (State::Closed, Ok(())) => "ok".to_owned(),
                    (State::Closed, Err(_)) => format!(
                        "failing, {} failure(s) in a row, circuit closed",
                        s.circuit.failures()
                    ),
                    (state, _) => format!("circuit {}{}", state.as_str(), self.next_probe(&s)),
                };
                match &s.health {
                    Err(why) => format!("{} ({state}): {why}", r.name),
                    Ok(()) => format!("{} ({state})", r.name),
                }
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    fn next_probe(&self, s: &Status) -> String {
        match s.circuit.probe_at() {
            Some(at) => format!(
                ", next probe in {}",
                humantime::format_duration(Duration::from_secs(
                    at.saturating_duration_since(Instant::now()).as_secs()
                ))
            ),
            None => String::new(),
        }
    }

    fn named(&self, i: usize, why: &str) -> String {
        if self.list.len() == 1 {
            why.to_owned()
        } else {
            format!("{}: {why}", self.list[i].name)
        }
    }

    /// A send or check on relay `i` worked.
    fn worked(&self, i: usize) {
        let relay = &self.list[i];
        let mut s = lock(&relay.status);
        s.circuit.success();
        if s.health.is_err() {
            tracing::info!(relay = %relay.name, "the SMTP relay works again");
            s.health = Ok(());
        }
        drop(s);
        self.publish();
    }

    /// Records a failed send or check on relay `i`: a relay-level failure
    /// counts against its circuit (and may open it); any other shows the
    /// session worked.
    fn record(&self, i: usize, failure: &Failure) {
        if !failure.relay_fault {
            return self.worked(i);
        }
        let relay = &self.list[i];
        let why = failure.error.to_string();
        telemetry::smtp_relay_failed(&relay.name);
        let mut s = lock(&relay.status);
        if s.health.is_ok() {
            tracing::warn!(
                relay = %relay.name,
                error = %telemetry::mask_emails(&why),
                "the SMTP relay is failing"
            );
        }
        s.health = Err(why.clone());
        let change = s.circuit.failure(Instant::now());
        let state = s.circuit.state();
        drop(s);
        if change == Some(Change::Opened) {
            tracing::warn!(
                relay = %relay.name,
                failures = self.threshold(i),
                cool_down = ?self.cool_down(i),
                error = %telemetry::mask_emails(&why),
                "the SMTP relay's circuit opens: no mail goes to it until a probe succeeds"
            );
            telemetry::smtp_relay_circuit(&relay.name, state.gauge());
            relay.pool.clear_idle();
            self.spawn_probe(i);
        }
        self.publish();
    }

    fn threshold(&self, i: usize) -> u32 {
        lock(&self.list[i].status).circuit.threshold
    }

    fn cool_down(&self, i: usize) -> Duration {
        lock(&self.list[i].status).circuit.cool_down
    }

    /// Updates whether some relay takes mail, and `mailgate_smtp_relay_up`.
    fn publish(&self) {
        let (mut open, mut up) = (false, false);
        for r in &self.list {
            let s = lock(&r.status);
            open |= s.circuit.takes_mail();
            up |= s.circuit.takes_mail() && s.health.is_ok();
        }
        telemetry::smtp_relay_up(up);
        self.available.send_if_modified(|was| {
            if *was == open {
                return false;
            }
            if open {
                tracing::info!("an SMTP relay takes mail again");
            } else {
                tracing::warn!(
                    relays = %telemetry::mask_emails(&self.states()),
                    "every SMTP relay's circuit is open: no job is taken until a probe succeeds"
                );
            }
            *was = open;
            true
        });
    }

    /// Runs relay `i`'s probes until one succeeds: after each cool-down,
    /// half-open, a session and NOOP on a slot of the pool, then closed or
    /// open again. Ends with the mailer.
    fn spawn_probe(&self, i: usize) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let this = self.this.clone();
        runtime.spawn(async move {
            loop {
                let at = {
                    let Some(relays) = this.upgrade() else { return };
                    let Some(at) = lock(&relays.list[i].status).circuit.probe_at() else {
                        return;
                    };
                    at
                };
                tokio::time::sleep_until(at).await;
                let Some(relays) = this.upgrade() else { return };
                if relays.probe(i).await {
                    return;
                }
            }
        });
    }

    /// One probe of relay `i`; whether it closed the circuit.
    async fn probe(&self, i: usize) -> bool {
        let relay = &self.list[i];
        let started = lock(&relay.status).circuit.start_probe(Instant::now());
        if started.is_none() {
            return false;
        }
        tracing::info!(relay = %relay.name, "the SMTP relay's circuit is half-open: probing it");
        telemetry::smtp_relay_circuit(&relay.name, State::HalfOpen.gauge());
        let result = {
            // The semaphore is never closed.
            let _slot = self.slots.acquire().await;
            relay.pool.check(Instant::now() + self.timeout).await
        };
        let mut s = lock(&relay.status);
        let change = s.circuit.probe_done(result.is_ok(), Instant::now());
        let state = s.circuit.state();
        match &result {
            Ok(()) => s.health = Ok(()),
            Err(f) => s.health = Err(f.error.to_string()),
        }
        drop(s);
        telemetry::smtp_relay_circuit(&relay.name, state.gauge());
        match (&result, change) {
            (Ok(()), _) => tracing::info!(
                relay = %relay.name,
                "the SMTP relay's probe succeeded: its circuit closes and it takes mail again"
            ),
            (Err(f), _) => {
                telemetry::smtp_relay_failed(&relay.name);
                tracing::warn!(
                    relay = %relay.name,
                    cool_down = ?self.cool_down(i),
                    error = %telemetry::mask_emails(&f.error.to_string()),
                    "the SMTP relay's probe failed: its circuit opens again"
                );
            }
        }
        self.publish();
        state == State::Closed
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

    /// A minimal SMTP server for probes: greeting, EHLO, NOOP, QUIT.
    async fn serve_probes(listener: tokio::net::TcpListener) {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut lines = BufReader::new(read).lines();
                let _ = write.write_all(b"220 probe.test\r\n").await;
                while let Ok(Some(line)) = lines.next_line().await {
                    let reply: &[u8] = match line.get(..4).map(str::to_ascii_uppercase).as_deref() {
                        Some("EHLO") => b"250 probe.test\r\n",
                        Some("NOOP") | Some("MAIL") | Some("RSET") => b"250 ok\r\n",
                        Some("QUIT") => b"221 bye\r\n",
                        _ => b"502 no\r\n",
                    };
                    let _ = write.write_all(reply).await;
                }
            });
        }
    }

    #[tokio::test]
    async fn a_probe_closes_the_circuit_and_wakes_the_waiters() {
        // A relay that refuses connections (a port nobody listens on yet).
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let url = url::Url::parse(&format!("smtp://127.0.0.1:{port}?tls=none")).unwrap();
        let endpoint = super::super::smtp::Endpoint::from_url(
            &url,
            Duration::from_secs(1),
            &crate::tls::LinkTls::bundled("smtp.tls"),
        )
        .unwrap();
        let settings = crate::settings::CircuitSettings {
            failures: 2,
            cool_down: Duration::from_millis(300),
        };
        let relays = Relays::new(
            vec![(
                "a".into(),
                SmtpPool::new(endpoint, "probe@example.com".parse().unwrap()),
            )],
            &settings,
            Duration::from_secs(1),
            Arc::new(Semaphore::new(1)),
        );
        let soon = || Instant::now() + Duration::from_secs(1);
        assert!(relays.available());
        assert!(relays.check(soon()).await.is_err());
        assert!(relays.available(), "one failure of two");
        assert!(relays.check(soon()).await.is_err());
        assert!(!relays.available());
        let e = relays.health().unwrap_err();
        assert!(
            e.contains("circuit open") && e.contains("connecting to"),
            "{e}"
        );
        // A send now tries no relay.
        let envelope = Envelope::new(
            Some("a@example.com".parse().unwrap()),
            vec!["b@example.com".parse().unwrap()],
        )
        .unwrap();
        let sent = relays.send(&envelope, b"x", soon()).await;
        assert!(
            matches!(&sent, Err(MailError::Relay(t)) if t.contains("no SMTP relay takes mail")),
            "{sent:?}"
        );
        let waiter = {
            let r = relays.clone();
            tokio::spawn(async move { r.until_available().await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(relays.waiting(), 1);
        // The first probe (after 300 ms) still finds the port shut.
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(!relays.available());
        assert!(!waiter.is_finished());
        // The relay comes back: the next probe closes the circuit.
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        tokio::spawn(serve_probes(listener));
        tokio::time::timeout(Duration::from_secs(3), waiter)
            .await
            .expect("the probe closes the circuit within two cool-downs")
            .unwrap();
        assert!(relays.available());
        assert_eq!(relays.health(), Ok(()));
        assert_eq!(relays.waiting(), 0);
    }
}
