//! Several SMTP relays in order of preference, each with its own
//! connection pool and a circuit breaker.
//!
//! A send goes to the first relay whose circuit is closed; a relay-level
//! failure ([`MailError::Relay`]: nothing of the mail was handed over) moves
//! it on to the next one, within the same deadline. Any other outcome ends
//! the send where it happened: a mail refused or deferred by a relay is not
//! offered to another (unless the refusal is found to be the relay's,
//! whatever the mail, on evidence no recipient can fake:
//! [`Relays::judge_suspect`]), and one whose final dot was written is
//! never sent again anywhere.
//!
//! Each relay's [`Circuit`] counts its relay-level failures in a row
//! ([`super::smtp::Failed::is_relay_fault`]); at `smtp.circuit.failures` it
//! opens: the relay takes no mail for `smtp.circuit.cool_down`. Then it is
//! half-open and one probe runs, a session set up and a NOOP, as `/readyz`
//! does: success closes the circuit, failure opens it for another
//! cool-down. The probe is a NOOP rather than a real mail because when
//! every circuit is open the worker takes no jobs, so there is no mail to
//! probe with, and a probe that fails then costs no job an attempt.
//!
//! Here: choosing a relay and failing over (`send`, `check`) and reporting
//! health; in `circuit.rs` the state machine; in `breaker.rs` how outcomes
//! drive it (recording, publishing availability, probing).

mod bounces;
mod breaker;
mod circuit;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use lettre::Address;
use lettre::address::Envelope;
use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;

use super::MailError;
use super::pool::{Failure, SmtpPool};
use crate::telemetry;
use circuit::{Circuit, State};

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
    /// The suspect failures ([`Failure::suspect`]) in a row, by what they
    /// came for (a recipient's registrable domain at RCPT, a recipient
    /// after it), different ones, at most [`STREAK`], each with when;
    /// ended by a mail it took (not by a probe: a relay that refuses every
    /// RCPT passes one).
    streak: Vec<(u64, Instant)>,
    /// When it last took a mail.
    last_taken: Option<Instant>,
    /// The canary's latest answer ([`Relays::canary_says`]) and when.
    canary: Option<(Instant, Result<(), String>)>,
    /// Its runs of 5.1.1s since it last took a mail, per domain and in
    /// all ([`Relays::judge_no_mailbox`]).
    no_mailbox: bounces::Runs,
}

/// How many different recipient domains (at RCPT) or recipients (later)
/// suspect failures must come for in a row, with no mail taken between, to
/// be the relay's (without a canary to ask): enough that one domain the
/// relay cannot reach, or two, never open a healthy relay's circuit, and
/// that any mail taken between (a stranger's refusals interleaved with
/// ordinary codes) ends the run.
const STREAK: usize = 3;

/// How long before a run ends a relay must have taken no mail for the run
/// to be the relay's: a relay that took any mail this recently takes mail,
/// and a burst of a stranger's refusals between two ordinary codes (sent
/// at once, on the pool's other connections) proves nothing.
const QUIET: Duration = Duration::from_secs(10);

/// How long a suspect failure counts towards a run.
const STREAK_FOR: Duration = Duration::from_secs(300);

/// How long a canary's answer is taken for the relay's state: a burst of
/// suspect refusals asks it once.
const CANARY_FRESH: Duration = Duration::from_secs(5);

/// What a suspect failure came for, hashed: at RCPT, `address`'s
/// registrable domain (`a.evil.example` and `b.evil.example` are one: a
/// domain's owner makes as many sub-domains as he likes); later, the
/// address itself, lower-case.
fn streak_key(address: &str, at_rcpt: bool) -> u64 {
    use std::hash::{Hash, Hasher};
    let domain = address.rsplit_once('@').map_or(address, |(_, d)| d);
    let key = match at_rcpt {
        true => (crate::domain::RegistrableDomain::parse(domain))
            .map_or_else(|_| domain.to_ascii_lowercase(), |d| d.as_str().to_owned()),
        false => address.to_ascii_lowercase(),
    };
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    h.finish()
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
    /// `smtp.canary`: an address every relay should take.
    canary: Option<Address>,
    /// One canary session at a time (per worker): the others wait for its
    /// answer.
    asking: tokio::sync::Mutex<()>,
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
    /// The named relays, in order of preference, every circuit closed
    /// (opening as `circuit` says); a probe takes one of `slots` and has
    /// `timeout`.
    pub(super) fn new(
        relays: Vec<(String, SmtpPool)>,
        circuit: &crate::settings::CircuitSettings,
        timeout: Duration,
        slots: Arc<Semaphore>,
        canary: Option<Address>,
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
                        streak: Vec::new(),
                        last_taken: None,
                        canary: None,
                        no_mailbox: bounces::Runs::default(),
                    }),
                }
            })
            .collect();
        let relays = Arc::new_cyclic(|this| Self {
            list,
            canary,
            asking: tokio::sync::Mutex::new(()),
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
                    {
                        let mut s = lock(&relay.status);
                        s.streak.clear();
                        s.last_taken = Some(Instant::now());
                        for to in envelope.to() {
                            s.no_mailbox.took(to.as_ref());
                        }
                    }
                    self.worked(i);
                    return Ok(());
                }
                Err(failure) => {
                    let failure = self.judge_suspect(i, failure, envelope).await;
                    let failure = self.judge_no_mailbox(i, failure, envelope);
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

    /// A suspect failure ([`Failure::suspect`]: it might be the relay's,
    /// whatever the mail) is the relay's only on evidence no recipient can
    /// fake, and then a relay failure (counted against its circuit, and
    /// the mail goes on to the next relay; nothing was delivered):
    /// - at RCPT, with `smtp.canary` set, the relay refuses the canary too
    ///   ([`Relays::canary_says`]); taking it, the refusal was this
    ///   recipient's own;
    /// - else, suspect failures have come for [`STREAK`] different
    ///   recipient registrable domains (at RCPT) or recipients (later: a
    ///   content filter refusing every message, a relay out of storage) in
    ///   a row, within [`STREAK_FOR`], with no mail taken between nor in
    ///   the [`QUIET`] before.
    ///
    /// Otherwise it is this mail's answer, as its code says (a 4xx retried,
    /// spending an attempt; a 5xx failed): a stranger who asks codes for a
    /// domain the relay cannot reach, or that stalls it, while the relay
    /// takes other mail, opens no circuit and delays nobody's code.
    async fn judge_suspect(&self, i: usize, failure: Failure, envelope: &Envelope) -> Failure {
        let Some(suspect) = failure.suspect else {
            return failure;
        };
        let relay = &self.list[i].name;
        let evidence = match (&self.canary, suspect.at_rcpt) {
            (Some(canary), true) => match self.canary_says(i, canary).await {
                Ok(()) => return failure,
                Err(why) => format!("it refused the canary {canary} too: {why}"),
            },
            _ => {
                let key = (envelope.to().first())
                    .map_or(0, |to| streak_key(to.as_ref(), suspect.at_rcpt));
                let now = Instant::now();
                let mut s = lock(&self.list[i].status);
                s.streak
                    .retain(|(_, at)| now.duration_since(*at) < STREAK_FOR);
                if !s.streak.iter().any(|(k, _)| *k == key) && s.streak.len() < STREAK {
                    s.streak.push((key, now));
                }
                let seen = s.streak.len();
                let quiet = s
                    .last_taken
                    .is_none_or(|at| now.duration_since(at) >= QUIET);
                drop(s);
                if seen < STREAK || !quiet {
                    return failure;
                }
                let what = match suspect.at_rcpt {
                    true => "recipients of different domains",
                    false => "different recipients",
                };
                format!(
                    "it refused {seen} {what} in a row so, taking no mail for {}s",
                    QUIET.as_secs()
                )
            }
        };
        Failure {
            error: MailError::Relay(format!(
                "relay: {relay} refuses mail whatever the recipient ({evidence}): {}",
                failure.error
            )),
            relay_fault: true,
            suspect: None,
        }
    }

    /// Whether relay `i` takes `canary` at RCPT (a session of its own,
    /// nothing handed over), as it answered within [`CANARY_FRESH`], or
    /// asked now, one session at a time, with a whole `smtp.timeout` of its
    /// own (not what the failed send left: a relay that merely took long
    /// to refuse a recipient must not look silent to the canary).
    async fn canary_says(&self, i: usize, canary: &Address) -> Result<(), String> {
        let fresh = |s: &Status| {
            (s.canary.as_ref())
                .filter(|(at, _)| at.elapsed() < CANARY_FRESH)
                .map(|(_, said)| said.clone())
        };
        if let Some(said) = fresh(&lock(&self.list[i].status)) {
            return said;
        }
        let _asking = self.asking.lock().await;
        if let Some(said) = fresh(&lock(&self.list[i].status)) {
            return said;
        }
        let deadline = Instant::now() + self.timeout;
        let said =
            (self.list[i].pool.canary(canary, deadline).await).map_err(|f| f.error.to_string());
        lock(&self.list[i].status).canary = Some((Instant::now(), said.clone()));
        said
    }

    /// A relay's word that a mailbox does not exist ([`MailError::NoMailbox`])
    /// is taken only while it has not said so of [`bounces::RUN`] other
    /// mailboxes of the recipient's domain, or of any, without taking a
    /// mail for it in between, nor of too many of its latest mails
    /// ([`bounces::Runs`]): past that, the refusal is
    /// [`MailError::Untrusted`] (the job fails all the same; nothing is
    /// suppressed, and the run's earlier suppressions are lifted), until
    /// the relay takes mail again. A refusal taken names the relay, and
    /// whether it took mail for the domain lately (the ledger judges it
    /// again with every worker's bounces).
    fn judge_no_mailbox(&self, i: usize, failure: Failure, envelope: &Envelope) -> Failure {
        let MailError::NoMailbox { text, .. } = &failure.error else {
            return failure;
        };
        let Some(to) = envelope.to().first() else {
            return failure;
        };
        let word = lock(&self.list[i].status).no_mailbox.refused(to.as_ref());
        let relay = &self.list[i].name;
        let (of, lift) = match word {
            bounces::Word::Taken { vouched } => {
                return Failure {
                    error: MailError::NoMailbox {
                        text: text.clone(),
                        relay: relay.clone(),
                        vouched,
                    },
                    ..failure
                };
            }
            bounces::Word::Doubted { of, lift } => (of, lift),
        };
        telemetry::bounce_doubted(relay);
        if !lift.is_empty() {
            tracing::warn!(
                relay,
                "this relay said {of} do not exist without taking a mail for them (a broken \
                 recipient table?): its word no longer suppresses them, and the {} it suppressed \
                 are lifted, until it takes mail again",
                lift.len()
            );
        }
        Failure {
            error: MailError::Untrusted {
                text: format!(
                    "{text} (not taken as grounds to suppress the mailbox: {relay} said {of} do \
                     not exist)"
                ),
                lift,
            },
            ..failure
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
            // One relay: its failure in its own words.
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
}
