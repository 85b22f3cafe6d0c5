//! One conformance suite for the job ledger's lifecycle (admission, lease,
//! sending, release, settle, answered, conflicts, expiry) in both backends,
//! with an explicit clock wherever an operation takes one. The Redis backend
//! runs against the real shared Redis, under a per-test key prefix; its
//! records live by real TTL (`limits.dedup_for`), the memory backend's by the
//! latest time it was called with. The limiter's decisions have their own
//! suite (`limiter_conformance`).

use std::time::Duration;

use crate::common::*;
use mailgate::domain::Ticket;
use mailgate::ledger::{Ending, Entry, Ledger, Refund, Verdict};
use mailgate::limiter::{Clock, Quotas, RuleRef, Scope, Subject};
use mailgate::settings::LimitSettings;

/// `LimitSettings::default().send_lease`.
const LEASE: u64 = 30 * SEC;
/// An arbitrary start, far from 0.
const T0: u64 = 1_000_000;
const MAIL: &str = "a@example.com";
const IP: &str = "198.51.100.1";

/// At most `email` admissions per mailbox and `ip` per client in an hour.
fn per_hour(email: u32, ip: u32) -> LimitSettings {
    limits(&[(HOUR, email)], &[(HOUR, ip)])
}

/// Job `id` to [`MAIL`] from [`IP`].
fn job(id: &str) -> TestJob {
    TestJob::new(id, MAIL, Some(IP))
}

/// Job `id` to a mailbox and from a client of its own (numbered `n`).
fn own_job(id: &str, n: u8) -> TestJob {
    TestJob::new(
        id,
        &format!("m{n}@example.com"),
        Some(&format!("198.51.100.{}", 100 + n)),
    )
}

/// A message of lineage `t` about `job` at `at` ms (no expiry).
async fn ask<L: Ledger>(l: &L, job: &TestJob, t: &Ticket, at: u64) -> Verdict {
    job.admit(l, t, Clock::At(at)).await
}

/// What lineage `t` asks about `job`, whose `expires_at` is
/// `expires_at_ms`.
fn entry<'a>(job: &'a TestJob, t: &'a Ticket, expires_at_ms: Option<u64>) -> Entry<'a> {
    Entry {
        job: job.by(t),
        expires_at_ms,
        made_at_ms: None,
    }
}

/// [`ask`] with `expires_at_ms`.
async fn ask_with<L: Ledger>(
    l: &L,
    job: &TestJob,
    t: &Ticket,
    at: u64,
    expires_at_ms: Option<u64>,
) -> Verdict {
    let a = l
        .admit(&entry(job, t, expires_at_ms), Clock::At(at))
        .await
        .expect("the ledger answers");
    assert_eq!(a.decided_at_ms, at, "decided_at_ms is the decision time");
    a.verdict
}

/// `limits` with every purpose's older jobs superseded by newer ones.
fn superseding(limits: LimitSettings) -> LimitSettings {
    LimitSettings {
        supersede: true,
        ..limits
    }
}

/// A message of lineage `t` about `job`, made at `made_at_ms`.
async fn made<L: Ledger>(
    l: &L,
    job: &TestJob,
    t: &Ticket,
    at: u64,
    made_at_ms: Option<u64>,
) -> Verdict {
    let entry = Entry {
        job: job.by(t),
        expires_at_ms: None,
        made_at_ms,
    };
    l.admit(&entry, Clock::At(at))
        .await
        .expect("the ledger answers")
        .verdict
}

/// A message of lineage `t` about `job` whose `expires_at` is `expired_at`.
async fn ask_expired<L: Ledger>(
    l: &L,
    job: &TestJob,
    t: &Ticket,
    at: u64,
    expired_at: u64,
) -> Verdict {
    ask_with(l, job, t, at, Some(expired_at)).await
}

/// What [`Ledger::peek`] answers lineage `t` about `job` at `at` ms
/// (`expires_at_ms`), checked to be decided at `at`.
async fn peek<L: Ledger>(
    l: &L,
    job: &TestJob,
    t: &Ticket,
    at: u64,
    expires_at_ms: Option<u64>,
) -> Option<Verdict> {
    let a = l
        .peek(&entry(job, t, expires_at_ms), Clock::At(at))
        .await
        .expect("the ledger answers");
    let a = a?;
    assert_eq!(a.decided_at_ms, at, "decided_at_ms is the decision time");
    Some(a.verdict)
}

async fn release<L: Ledger>(l: &L, job: &TestJob, t: &Ticket) -> bool {
    l.release(&job.by(t)).await.expect("release")
}

async fn settle<L: Ledger>(l: &L, job: &TestJob, t: &Ticket, end: Ending, answered: bool) -> bool {
    l.settle(&job.by(t), &end, answered).await.expect("settle")
}

async fn answered<L: Ledger>(l: &L, job: &TestJob, t: &Ticket) -> bool {
    l.answered(&job.by(t)).await.expect("answered")
}

/// Admissions counted at `at` for `job`'s mailbox and for its client, by
/// the first rule of each scope (the hour of [`per_hour`]).
async fn used<L: Quotas>(l: &L, job: &TestJob, at: u64) -> (u32, u32) {
    let e = l
        .usage(Subject::Email(&job.email), None, Clock::At(at))
        .await
        .expect("usage");
    let i = match &job.ip {
        Some(ip) => {
            l.usage(Subject::Ip(ip), None, Clock::At(at))
                .await
                .expect("usage")
                .rules[0]
                .count
        }
        None => 0,
    };
    (e.rules[0].count, i)
}

fn sent(admitted_at_ms: u64, by_owner: bool, answered: bool) -> Verdict {
    Verdict::Sent {
        admitted_at_ms,
        by_owner,
        answered,
    }
}

fn unknown(by_owner: bool, answered: bool) -> Verdict {
    Verdict::Unknown { by_owner, answered }
}

fn finished(how: Refund, answered: bool) -> Verdict {
    Verdict::Finished { how, answered }
}

fn busy(lease_left_ms: u64) -> Verdict {
    Verdict::Busy { lease_left_ms }
}

mod cases {
    use super::*;

    pub(super) async fn a_second_message_is_busy_for_the_rest_of_the_lease<M: Make>(m: M) {
        let b = m.make("busy", per_hour(2, 2)).await;
        let l = &b.ledger;
        let j = job("j1");
        let a = Ticket::new();
        assert_eq!(ask(l, &j, &a, T0).await, Verdict::Admitted);
        assert_eq!(
            ask(l, &j, &Ticket::new(), T0 + 12 * SEC).await,
            busy(LEASE - 12 * SEC)
        );
        assert_eq!(ask(l, &j, &Ticket::new(), T0 + LEASE - 1).await, busy(1));
        // Counted once in each scope: a second job still fits a limit of two.
        assert_eq!(used(l, &j, T0 + LEASE - 1).await, (1, 1));
        assert_eq!(
            ask(l, &job("j2"), &Ticket::new(), T0 + LEASE - 1).await,
            Verdict::Admitted
        );
    }

    pub(super) async fn a_released_send_passes_to_another_lineage_sending<M: Make>(m: M) {
        let b = m.make("lapse", per_hour(1, 1)).await;
        let l = &b.ledger;
        let j = job("j1");
        let (a, n) = (Ticket::new(), Ticket::new());
        assert_eq!(ask(l, &j, &a, T0).await, Verdict::Admitted);
        assert!(release(l, &j, &a).await);
        assert_eq!(
            ask(l, &j, &n, T0 + 1).await,
            Verdict::Resumed { admitted_at_ms: T0 }
        );
        assert!(!release(l, &j, &a).await, "the old owner");
        // The resumption took a lease of its own, sending.
        assert_eq!(ask(l, &j, &Ticket::new(), T0 + 2).await, busy(LEASE - 1));
        assert_eq!(used(l, &j, T0 + 2).await, (1, 1));
        assert_eq!(ask(l, &j, &a, T0 + 1 + LEASE).await, unknown(false, false));
        assert_eq!(ask(l, &j, &n, T0 + 2 + LEASE).await, unknown(true, false));
    }

    pub(super) async fn release_by_the_owner_lets_the_next_message_resume_at_once<M: Make>(m: M) {
        let b = m.make("release", per_hour(1, 1)).await;
        let l = &b.ledger;
        let j = job("j1");
        let (a, n, o) = (Ticket::new(), Ticket::new(), Ticket::new());
        assert_eq!(ask(l, &j, &a, T0).await, Verdict::Admitted);
        assert!(release(l, &j, &a).await);
        assert_eq!(
            ask(l, &j, &n, T0 + 1).await,
            Verdict::Resumed { admitted_at_ms: T0 }
        );
        // Released again (another failure before the mail was handed over).
        assert!(release(l, &j, &n).await);
        assert_eq!(
            ask(l, &j, &o, T0 + 3).await,
            Verdict::Resumed { admitted_at_ms: T0 }
        );
        assert_eq!(used(l, &j, T0 + 3).await, (1, 1));
    }

    pub(super) async fn release_by_another_lineage_or_of_an_unknown_id_is_refused<M: Make>(m: M) {
        let b = m.make("release-no", per_hour(1, 1)).await;
        let l = &b.ledger;
        let j = job("j1");
        let a = Ticket::new();
        assert_eq!(ask(l, &j, &a, T0).await, Verdict::Admitted);
        assert!(!release(l, &j, &Ticket::new()).await, "not the owner");
        assert!(!release(l, &job("j9"), &a).await, "no such id");
        // Nothing changed: the owner still holds its lease.
        assert_eq!(ask(l, &j, &Ticket::new(), T0 + 1).await, busy(LEASE - 1));
    }

    pub(super) async fn a_send_whose_lease_lapses_is_unknown_and_never_resent<M: Make>(m: M) {
        let b = m.make("unknown", per_hour(1, 1)).await;
        let l = &b.ledger;
        let j = job("j1");
        let (a, n) = (Ticket::new(), Ticket::new());
        assert_eq!(ask(l, &j, &a, T0).await, Verdict::Admitted);
        assert_eq!(ask(l, &j, &n, T0 + LEASE - 1).await, busy(1));
        assert_eq!(ask(l, &j, &n, T0 + LEASE).await, unknown(false, false));
        assert_eq!(
            ask(l, &j, &Ticket::new(), T0 + 2 * LEASE).await,
            unknown(false, false),
            "stays unknown"
        );
        assert_eq!(ask(l, &j, &a, T0 + 2 * LEASE).await, unknown(true, false));
        assert!(!release(l, &j, &a).await, "never resent");
        assert!(!release(l, &j, &n).await);
        assert_eq!(ask(l, &j, &n, T0 + 3 * LEASE).await, unknown(false, false));
        assert_eq!(used(l, &j, T0 + 3 * LEASE).await, (1, 1));
    }

    pub(super) async fn an_admission_is_its_send_and_a_lapse_is_unknown<M: Make>(m: M) {
        let b = m.make("send-now", per_hour(5, 5)).await;
        let l = &b.ledger;
        let (j, a) = (job("j1"), Ticket::new());
        assert_eq!(ask_with(l, &j, &a, T0, None).await, Verdict::Admitted);
        assert_eq!(
            ask(l, &j, &Ticket::new(), T0 + LEASE).await,
            unknown(false, false),
            "a lapse is unknown, not resumed"
        );
        // A resumption (after a release) is sending too.
        let (j2, o) = (job("j2"), Ticket::new());
        assert_eq!(ask(l, &j2, &o, T0).await, Verdict::Admitted);
        assert!(release(l, &j2, &o).await);
        let n = Ticket::new();
        assert_eq!(
            ask_with(l, &j2, &n, T0 + LEASE, None).await,
            Verdict::Resumed { admitted_at_ms: T0 }
        );
        assert_eq!(
            ask(l, &j2, &Ticket::new(), T0 + 2 * LEASE).await,
            unknown(false, false)
        );
    }

    pub(super) async fn sent_is_reported_to_every_later_message<M: Make>(m: M) {
        let b = m.make("sent", per_hour(5, 5)).await;
        let l = &b.ledger;
        for (i, ans) in [false, true].into_iter().enumerate() {
            let (j, a) = (job(&format!("j{i}")), Ticket::new());
            assert_eq!(ask(l, &j, &a, T0).await, Verdict::Admitted);
            assert!(settle(l, &j, &a, Ending::Sent, ans).await);
            assert_eq!(ask(l, &j, &a, T0 + 2).await, sent(T0, true, ans));
            assert_eq!(
                ask(l, &j, &Ticket::new(), T0 + 3).await,
                sent(T0, false, ans)
            );
            assert_eq!(
                ask(l, &j, &Ticket::new(), T0 + 3 * LEASE).await,
                sent(T0, false, ans)
            );
        }
        assert_eq!(used(l, &job("j0"), T0 + 3 * LEASE).await, (2, 2));
    }

    pub(super) async fn a_late_sent_overrides_unknown<M: Make>(m: M) {
        let b = m.make("sent-late", per_hour(1, 1)).await;
        let l = &b.ledger;
        let (j, a, n) = (job("j1"), Ticket::new(), Ticket::new());
        assert_eq!(ask(l, &j, &a, T0).await, Verdict::Admitted);
        assert_eq!(ask(l, &j, &n, T0 + LEASE).await, unknown(false, false));
        assert!(settle(l, &j, &a, Ending::Sent, true).await);
        assert_eq!(ask(l, &j, &n, T0 + LEASE + 1).await, sent(T0, false, true));
        assert_eq!(ask(l, &j, &a, T0 + LEASE + 1).await, sent(T0, true, true));
        assert_eq!(used(l, &j, T0 + LEASE + 1).await, (1, 1));
    }

    /// A job that failed stays counted against its requester (its client
    /// network), and only there: failures, probes of made-up mailboxes
    /// above all, are not free to whoever asks; its mailbox gets its quota
    /// back (a stranger's failures must not lock the owner out).
    pub(super) async fn a_failure_stays_counted_against_its_requester_only<M: Make>(m: M) {
        let b = m.make("refund-failed", per_hour(1, 1)).await;
        let l = &b.ledger;
        let (j, a) = (own_job("j0", 0), Ticket::new());
        assert_eq!(ask(l, &j, &a, T0).await, Verdict::Admitted);
        let failed = Ending::Refund(Refund::Failed);
        assert!(settle(l, &j, &a, failed, true).await);
        assert_eq!(used(l, &j, T0 + 1).await, (0, 1));
        assert_eq!(ask(l, &j, &a, T0 + 1).await, finished(Refund::Failed, true));
        // The mailbox, asked from another client: admitted.
        let other_client = TestJob {
            id: id("k0"),
            ..own_job("k0", 1)
        };
        let same_mailbox = TestJob {
            email: j.email.clone(),
            ..other_client
        };
        assert_eq!(
            ask(l, &same_mailbox, &Ticket::new(), T0 + 2).await,
            Verdict::Admitted
        );
        // Another mailbox from the same client: its failure counts.
        let same_client = TestJob {
            id: id("k1"),
            ip: j.ip,
            ..own_job("k1", 2)
        };
        assert!(
            matches!(
                ask(l, &same_client, &Ticket::new(), T0 + 3).await,
                Verdict::Rejected { retry_after_ms, rule } if retry_after_ms == HOUR - 3
                    && rule.scope == Scope::Ip
            ),
            "the client's failure still counts"
        );
        // Asked again after a lost reply, the refund takes nothing more.
        assert!(!settle(l, &j, &a, failed, true).await);
        assert_eq!(used(l, &j, T0 + 4).await, (1, 1));
    }

    pub(super) async fn an_owners_refund_gives_the_quota_back_in_every_scope<M: Make>(m: M) {
        let b = m.make("refund", per_hour(1, 1)).await;
        let l = &b.ledger;
        // (A failure gives back all but its requester's:
        // a_failure_stays_counted_against_its_requester_only.)
        let hows = [Refund::Invalid, Refund::Expired];
        for (n, how) in (0u8..).zip(hows) {
            let (j, a) = (own_job(&format!("j{n}"), n), Ticket::new());
            let ans = n == 1;
            assert_eq!(ask(l, &j, &a, T0).await, Verdict::Admitted);
            if n == 0 {
                // A released admission (a retry's) is refunded, too.
                assert!(release(l, &j, &a).await);
            }
            assert!(settle(l, &j, &a, Ending::Refund(how), ans).await, "{how:?}");
            assert_eq!(used(l, &j, T0 + 1).await, (0, 0), "{how:?}");
            assert_eq!(ask(l, &j, &a, T0 + 1).await, finished(how, ans));
            // A new job for the same mailbox and client fits both limits of one.
            let k = TestJob {
                id: id(&format!("k{n}")),
                ..j.clone()
            };
            assert_eq!(ask(l, &k, &Ticket::new(), T0 + 2).await, Verdict::Admitted);
            // Another lineage of the refunded job is decided afresh: rejected
            // now (k holds the quota), admitted once the window has passed.
            let o = Ticket::new();
            assert!(
                matches!(
                    ask(l, &j, &o, T0 + 3).await,
                    Verdict::Rejected { retry_after_ms, .. } if retry_after_ms == HOUR - 1
                ),
                "{how:?}"
            );
            assert_eq!(ask(l, &j, &o, T0 + 2 + HOUR).await, Verdict::Admitted);
            assert_eq!(ask(l, &j, &a, T0 + 3 + HOUR).await, busy(LEASE - 1));
        }
    }

    pub(super) async fn a_refund_by_another_lineage_or_after_a_send_is_refused<M: Make>(m: M) {
        let b = m.make("refund-no", per_hour(1, 1)).await;
        let l = &b.ledger;
        let failed = Ending::Refund(Refund::Failed);
        // Not the owner's, or no such id.
        let (j, a) = (own_job("j1", 1), Ticket::new());
        assert_eq!(ask(l, &j, &a, T0).await, Verdict::Admitted);
        assert!(!settle(l, &j, &Ticket::new(), failed, false).await);
        assert!(!settle(l, &own_job("j9", 9), &a, failed, false).await);
        assert_eq!(used(l, &j, T0 + 1).await, (1, 1));
        assert_eq!(
            ask(l, &j, &Ticket::new(), T0 + 1).await,
            busy(LEASE - 1),
            "the owner still owns it"
        );
        // Sent.
        assert!(settle(l, &j, &a, Ending::Sent, false).await);
        assert!(!settle(l, &j, &a, failed, false).await);
        assert_eq!(ask(l, &j, &a, T0 + 2).await, sent(T0, true, false));
        assert_eq!(used(l, &j, T0 + 2).await, (1, 1));
        // Unknown, as marked by another copy or as settled by the owner.
        let (j2, a2) = (own_job("j2", 2), Ticket::new());
        assert_eq!(ask(l, &j2, &a2, T0).await, Verdict::Admitted);
        assert_eq!(
            ask(l, &j2, &Ticket::new(), T0 + LEASE).await,
            unknown(false, false)
        );
        assert!(!settle(l, &j2, &a2, failed, false).await);
        assert!(settle(l, &j2, &a2, Ending::Unknown, false).await);
        assert!(!settle(l, &j2, &a2, Ending::Refund(Refund::Expired), false).await);
        assert_eq!(ask(l, &j2, &a2, T0 + LEASE).await, unknown(true, false));
        assert_eq!(used(l, &j2, T0 + LEASE).await, (1, 1));
        // Already refunded: not twice.
        let (j3, a3) = (own_job("j3", 3), Ticket::new());
        assert_eq!(ask(l, &j3, &a3, T0).await, Verdict::Admitted);
        assert!(settle(l, &j3, &a3, failed, false).await);
        assert!(!settle(l, &j3, &a3, failed, true).await);
        assert!(!settle(l, &j3, &a3, Ending::Sent, true).await);
        assert_eq!(
            ask(l, &j3, &a3, T0 + 1).await,
            finished(Refund::Failed, false)
        );
    }

    pub(super) async fn answered_is_recorded_for_the_owner_only<M: Make>(m: M) {
        let b = m.make("answered", per_hour(5, 5)).await;
        let l = &b.ledger;
        // Sent.
        let (j, a, o) = (job("j1"), Ticket::new(), Ticket::new());
        assert_eq!(ask(l, &j, &a, T0).await, Verdict::Admitted);
        assert!(settle(l, &j, &a, Ending::Sent, false).await);
        assert!(!answered(l, &j, &o).await);
        assert_eq!(ask(l, &j, &o, T0 + 1).await, sent(T0, false, false));
        assert!(answered(l, &j, &a).await);
        assert_eq!(ask(l, &j, &o, T0 + 2).await, sent(T0, false, true));
        assert_eq!(ask(l, &j, &a, T0 + 2).await, sent(T0, true, true));
        // Unknown.
        let (j, a, o) = (job("j2"), Ticket::new(), Ticket::new());
        assert_eq!(ask(l, &j, &a, T0).await, Verdict::Admitted);
        assert!(settle(l, &j, &a, Ending::Unknown, false).await);
        assert_eq!(ask(l, &j, &a, T0 + 1).await, unknown(true, false));
        assert!(!answered(l, &j, &o).await);
        assert_eq!(ask(l, &j, &o, T0 + 1).await, unknown(false, false));
        assert!(answered(l, &j, &a).await);
        assert_eq!(ask(l, &j, &a, T0 + 2).await, unknown(true, true));
        assert_eq!(ask(l, &j, &o, T0 + 2).await, unknown(false, true));
        // Finished.
        let (j, a) = (job("j3"), Ticket::new());
        assert_eq!(ask(l, &j, &a, T0).await, Verdict::Admitted);
        assert!(settle(l, &j, &a, Ending::Refund(Refund::Invalid), false).await);
        assert_eq!(
            ask(l, &j, &a, T0 + 1).await,
            finished(Refund::Invalid, false)
        );
        assert!(!answered(l, &j, &Ticket::new()).await);
        assert!(answered(l, &j, &a).await);
        assert_eq!(
            ask(l, &j, &a, T0 + 2).await,
            finished(Refund::Invalid, true)
        );
        // No such id.
        assert!(!answered(l, &job("j9"), &a).await);
    }

    pub(super) async fn another_job_under_the_same_id_is_a_conflict_that_touches_nothing<
        M: Make,
    >(
        m: M,
    ) {
        let b = m.make("conflict", per_hour(1, 5)).await;
        let l = &b.ledger;
        let (j, a) = (job("j1"), Ticket::new());
        assert_eq!(ask(l, &j, &a, T0).await, Verdict::Admitted);
        // The victim's mailbox is at its limit.
        let victim = TestJob::new("v1", "victim@example.com", Some("198.51.100.7"));
        assert_eq!(ask(l, &victim, &Ticket::new(), T0).await, Verdict::Admitted);
        let others = [
            TestJob::new("j1", "victim@example.com", Some(IP)),
            TestJob::new("j1", MAIL, Some("198.51.100.2")),
            job("j1").purpose(Some("reset_password")),
        ];
        for other in &others {
            for t in [&Ticket::new(), &a] {
                assert_eq!(ask(l, other, t, T0 + 1).await, Verdict::Conflict);
                // Not even an expired message refunds the first job.
                assert_eq!(
                    ask_expired(l, other, t, T0 + 1, T0).await,
                    Verdict::Conflict
                );
                assert_eq!(ask_with(l, other, t, T0 + 1, None).await, Verdict::Conflict);
            }
        }
        assert_eq!(used(l, &j, T0 + 2).await, (1, 1));
        assert_eq!(used(l, &victim, T0 + 2).await, (1, 1));
        assert_eq!(used(l, &others[1], T0 + 2).await, (1, 0));
        // The first job is as it was: leased by its owner, who may send it.
        assert_eq!(ask(l, &j, &Ticket::new(), T0 + 2).await, busy(LEASE - 2));
        assert!(settle(l, &j, &a, Ending::Sent, true).await);
        for other in &others {
            assert_eq!(
                ask(l, other, &Ticket::new(), T0 + 3).await,
                Verdict::Conflict
            );
        }
        assert_eq!(ask(l, &j, &a, T0 + 3).await, sent(T0, true, true));
    }

    pub(super) async fn the_fingerprint_is_the_parsed_address_client_and_purpose<M: Make>(m: M) {
        let b = m.make("fingerprint", per_hour(5, 5)).await;
        let l = &b.ledger;
        let j = TestJob::new("j1", "Anna@Example.COM", Some("203.0.113.9"));
        assert_eq!(ask(l, &j, &Ticket::new(), T0).await, Verdict::Admitted);
        // Spellings that parse to the same address and client: the same job.
        for (mail, from) in [
            (" Anna@example.com ", "203.0.113.9"),
            ("Anna@EXAMPLE.com", "::ffff:203.0.113.9"),
        ] {
            let same = TestJob::new("j1", mail, Some(from));
            assert_eq!(
                ask(l, &same, &Ticket::new(), T0 + 1).await,
                busy(LEASE - 1),
                "{mail} {from}"
            );
        }
        // Another address string (though the same mailbox for the limiter),
        // another client address, or no client: a conflict.
        for (mail, from) in [
            ("anna@example.com", Some("203.0.113.9")),
            ("Anna+x@example.com", Some("203.0.113.9")),
            ("Anna@Example.COM", Some("203.0.113.10")),
            ("Anna@Example.COM", None),
        ] {
            let other = TestJob::new("j1", mail, from);
            assert_eq!(
                ask(l, &other, &Ticket::new(), T0 + 1).await,
                Verdict::Conflict,
                "{mail} {from:?}"
            );
        }
        // IDN spellings of a domain are one address; a job without a client
        // conflicts with the same one from a client.
        let k = TestJob::new("k1", "anna@bücher.example", None);
        assert_eq!(ask(l, &k, &Ticket::new(), T0).await, Verdict::Admitted);
        let idn = TestJob::new("k1", "anna@XN--BCHER-KVA.example", None);
        assert_eq!(ask(l, &idn, &Ticket::new(), T0 + 1).await, busy(LEASE - 1));
        let with_ip = TestJob::new("k1", "anna@bücher.example", Some("203.0.113.9"));
        assert_eq!(
            ask(l, &with_ip, &Ticket::new(), T0 + 1).await,
            Verdict::Conflict
        );
        // A purpose, or none.
        let p = job("p1").purpose(Some("verify"));
        assert_eq!(ask(l, &p, &Ticket::new(), T0).await, Verdict::Admitted);
        assert_eq!(
            ask(l, &job("p1"), &Ticket::new(), T0 + 1).await,
            Verdict::Conflict
        );
    }

    pub(super) async fn an_expired_job_without_a_record_writes_nothing<M: Make>(m: M) {
        let b = m.make("expired-none", per_hour(1, 1)).await;
        let l = &b.ledger;
        let (j, a) = (job("j1"), Ticket::new());
        assert_eq!(ask_expired(l, &j, &a, T0, T0).await, Verdict::Expired);
        assert_eq!(ask_expired(l, &j, &a, T0, 1).await, Verdict::Expired);
        assert_eq!(
            ask_with(l, &j, &a, T0, Some(T0 - 1)).await,
            Verdict::Expired
        );
        assert_eq!(used(l, &j, T0).await, (0, 0));
        // No record: the same id is a fresh job (not Finished), one ms before
        // its expiry, with the quota untouched.
        assert_eq!(
            ask_with(l, &j, &a, T0 + 1, Some(T0 + 2)).await,
            Verdict::Admitted
        );
    }

    pub(super) async fn an_expired_unsent_admission_is_refunded<M: Make>(m: M) {
        let b = m.make("expired-unsent", per_hour(1, 1)).await;
        let l = &b.ledger;
        // Another lineage, after the owner released it (a transient
        // failure): too late for it, but the admission is the owner's to
        // judge by its own expiry.
        let (j, a, n) = (own_job("j1", 1), Ticket::new(), Ticket::new());
        assert_eq!(ask(l, &j, &a, T0).await, Verdict::Admitted);
        assert!(release(l, &j, &a).await);
        assert_eq!(
            ask_expired(l, &j, &n, T0 + LEASE, T0 + LEASE).await,
            Verdict::Expired
        );
        assert_eq!(
            used(l, &j, T0 + LEASE).await,
            (1, 1),
            "not refunded by another"
        );
        // The owner's copy, expired too, refunds it.
        assert_eq!(
            ask_expired(l, &j, &a, T0 + LEASE + 1, T0 + LEASE).await,
            Verdict::Expired
        );
        assert_eq!(used(l, &j, T0 + LEASE + 1).await, (0, 0));
        assert_eq!(
            ask(l, &j, &a, T0 + LEASE + 1).await,
            finished(Refund::Expired, false)
        );
        let k = TestJob {
            id: id("k1"),
            ..j.clone()
        };
        assert_eq!(
            ask(l, &k, &Ticket::new(), T0 + LEASE + 2).await,
            Verdict::Admitted
        );
        // The owner's own lineage, after a release.
        let (j2, a2) = (own_job("j2", 2), Ticket::new());
        assert_eq!(ask(l, &j2, &a2, T0).await, Verdict::Admitted);
        assert!(release(l, &j2, &a2).await);
        assert_eq!(
            ask_expired(l, &j2, &a2, T0 + 1, T0 + 1).await,
            Verdict::Expired
        );
        assert_eq!(used(l, &j2, T0 + 1).await, (0, 0));
        assert_eq!(
            ask(l, &j2, &a2, T0 + 2).await,
            finished(Refund::Expired, false)
        );
        // A lease still held: busy, not refunded.
        let (j3, a3) = (own_job("j3", 3), Ticket::new());
        assert_eq!(ask(l, &j3, &a3, T0).await, Verdict::Admitted);
        assert_eq!(
            ask_expired(l, &j3, &Ticket::new(), T0 + 1, T0).await,
            busy(LEASE - 1)
        );
        assert_eq!(used(l, &j3, T0 + 1).await, (1, 1));
        assert!(settle(l, &j3, &a3, Ending::Sent, true).await);
    }

    pub(super) async fn expiry_never_refunds_a_send_begun_or_done<M: Make>(m: M) {
        let b = m.make("expired-sent", per_hour(1, 1)).await;
        let l = &b.ledger;
        // Sending: admitted, or resumed after a release.
        for (n, resumed) in [(1, false), (2, true)] {
            let (j, a) = (own_job(&format!("j{n}"), n), Ticket::new());
            assert_eq!(ask_with(l, &j, &a, T0, None).await, Verdict::Admitted);
            if resumed {
                assert!(release(l, &j, &a).await);
                assert_eq!(
                    ask(l, &j, &a, T0).await,
                    Verdict::Resumed { admitted_at_ms: T0 }
                );
            }
            assert_eq!(
                ask_expired(l, &j, &Ticket::new(), T0 + 1, T0).await,
                busy(LEASE - 1)
            );
            assert_eq!(
                ask_expired(l, &j, &Ticket::new(), T0 + LEASE, T0).await,
                unknown(false, false)
            );
            assert_eq!(
                ask_expired(l, &j, &a, T0 + LEASE + 1, T0).await,
                unknown(true, false)
            );
            assert_eq!(used(l, &j, T0 + LEASE + 1).await, (1, 1), "{resumed}");
        }
        // Sent, and settled unknown.
        for (n, end) in [(3, Ending::Sent), (4, Ending::Unknown)] {
            let (j, a) = (own_job(&format!("j{n}"), n), Ticket::new());
            assert_eq!(ask(l, &j, &a, T0).await, Verdict::Admitted);
            assert!(settle(l, &j, &a, end, true).await);
            let expect = match end {
                Ending::Sent => sent(T0, false, true),
                _ => unknown(false, true),
            };
            assert_eq!(ask_expired(l, &j, &Ticket::new(), T0 + 1, T0).await, expect);
            assert_eq!(
                ask_expired(l, &j, &Ticket::new(), T0 + 2 * LEASE, T0).await,
                expect
            );
            assert_eq!(used(l, &j, T0 + 2 * LEASE).await, (1, 1), "{end:?}");
        }
    }

    // A refund removes only this record's admission from the scope logs.
    // When `dedup_for` is shorter than a window, an id can be admitted again
    // after its record lapsed; refunding the new admission must leave the
    // earlier one, whose mail went out, counted.
    pub(super) async fn a_refund_removes_only_its_own_admission<M: Make>(m: M) {
        let mut lim = per_hour(5, 5);
        lim.dedup_for = Duration::from_secs(1);
        let b = m.make("refund-own", lim).await;
        let l = &b.ledger;
        let (j, a) = (job("j1"), Ticket::new());
        assert_eq!(ask(l, &j, &a, T0).await, Verdict::Admitted);
        assert!(settle(l, &j, &a, Ending::Sent, true).await);
        // The record lapses.
        b.lapse_record("j1").await;
        let n = Ticket::new();
        assert_eq!(ask(l, &j, &n, T0 + 10 * SEC).await, Verdict::Admitted);
        assert_eq!(used(l, &j, T0 + 10 * SEC).await, (2, 2));
        assert!(release(l, &j, &n).await);
        assert_eq!(
            ask_expired(l, &j, &n, T0 + 10 * SEC + 1, T0).await,
            Verdict::Expired
        );
        assert_eq!(
            used(l, &j, T0 + 10 * SEC + 1).await,
            (1, 1),
            "the first admission's mail went out: it still counts"
        );
    }

    // A record lives `dedup_for` after its *last change*, a resumption and
    // a release included; otherwise it would lapse while its job is still
    // being retried, and the id be admitted (counted, and mailed) again.
    pub(super) async fn resuming_and_release_renew_the_records_life<M: Make>(m: M) {
        let mut lim = per_hour(5, 5);
        lim.dedup_for = Duration::from_secs(1);
        let b = m.make("renew", lim).await;
        let l = &b.ledger;
        let (j1, a1, j2, a2) = (job("j1"), Ticket::new(), job("j2"), Ticket::new());
        assert_eq!(ask(l, &j1, &a1, T0).await, Verdict::Admitted);
        assert_eq!(ask(l, &j2, &a2, T0).await, Verdict::Admitted);
        assert!(release(l, &j1, &a1).await);
        // Real time moves with the explicit clock (Redis TTLs are real).
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert_eq!(
            ask(l, &j1, &a1, T0 + 700).await,
            Verdict::Resumed { admitted_at_ms: T0 }
        );
        assert!(release(l, &j2, &a2).await);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            ask(l, &j1, &Ticket::new(), T0 + 1200).await,
            busy(LEASE - 500),
            "renewed by the resumption"
        );
        assert_eq!(
            ask(l, &j2, &Ticket::new(), T0 + 1200).await,
            Verdict::Resumed { admitted_at_ms: T0 },
            "renewed by release"
        );
        assert_eq!(used(l, &j1, T0 + 1200).await, (2, 2));
    }

    // `expires_at_ms: Some(0)` (the epoch, long past) is expired; only
    // `None` means no expiry.
    pub(super) async fn an_expires_at_of_zero_is_in_the_past<M: Make>(m: M) {
        let b = m.make("expired-zero", per_hour(1, 1)).await;
        let l = &b.ledger;
        let j = job("j1");
        assert_eq!(
            ask_expired(l, &j, &Ticket::new(), T0, 0).await,
            Verdict::Expired
        );
        assert_eq!(used(l, &j, T0).await, (0, 0));
    }

    /// `peek` (the look of a job with no SMTP connection free) answers
    /// what `admit` would at the same instant where that answer writes
    /// nothing, or nothing (a backend may not know with one read); a
    /// rejection it always answers. It writes nothing itself; where
    /// `admit` would write (admit, resume, mark unknown), it answers
    /// nothing.
    pub(super) async fn a_look_answers_what_an_admission_would_and_writes_nothing<M: Make>(m: M) {
        let b = m.make("peek", per_hour(1, 5)).await;
        let l = &b.ledger;
        // A look that answers must answer as `admit` then does.
        async fn same<L: Ledger>(l: &L, j: &TestJob, t: &Ticket, at: u64) -> Option<Verdict> {
            let looked = peek(l, j, t, at, None).await;
            if let Some(v) = looked {
                assert_eq!(ask(l, j, t, at).await, v, "{}", j.id.as_str());
            }
            looked
        }
        let (j1, a) = (job("j1"), Ticket::new());
        // A new job: only an admission says; nothing written.
        assert_eq!(peek(l, &j1, &a, T0, None).await, None);
        assert_eq!(used(l, &j1, T0).await, (0, 0));
        assert_eq!(ask(l, &j1, &a, T0).await, Verdict::Admitted);
        // Another job for the full mailbox: rejected, nothing written.
        let j2 = job("j2");
        let rejected = Verdict::Rejected {
            retry_after_ms: HOUR - 2,
            rule: RuleRef {
                scope: Scope::Email,
                window_ms: HOUR,
                max: 1,
            },
        };
        let t2 = Ticket::new();
        assert_eq!(peek(l, &j2, &t2, T0 + 2, None).await, Some(rejected));
        assert_eq!(peek(l, &j2, &t2, T0 + 2, None).await, Some(rejected));
        assert_eq!(used(l, &j2, T0 + 2).await, (1, 1), "nothing counted");
        assert_eq!(ask(l, &j2, &t2, T0 + 2).await, rejected);
        // A copy while the send is under way, another job under the id.
        let other = TestJob::new("j1", "someone.else@example.com", Some(IP));
        for (j, want) in [(&j1, busy(LEASE - 3)), (&other, Verdict::Conflict)] {
            let got = same(l, j, &Ticket::new(), T0 + 3).await;
            assert!(got.is_none_or(|v| v == want), "{got:?}");
        }
        // A send whose lease lapsed: the admission marks it unknown, the
        // look does not.
        assert_eq!(peek(l, &j1, &Ticket::new(), T0 + LEASE, None).await, None);
        assert_eq!(peek(l, &j1, &a, T0 + LEASE, None).await, None);
        assert_eq!(
            ask(l, &j1, &Ticket::new(), T0 + LEASE).await,
            unknown(false, false)
        );
        let got = same(l, &j1, &a, T0 + LEASE + 1).await;
        assert!(got.is_none_or(|v| v == unknown(true, false)), "{got:?}");
        // A released admission: the admission resumes it, the look does not.
        let (j3, a3) = (own_job("j3", 3), Ticket::new());
        assert_eq!(ask(l, &j3, &a3, T0).await, Verdict::Admitted);
        assert!(release(l, &j3, &a3).await);
        assert_eq!(peek(l, &j3, &Ticket::new(), T0 + 1, None).await, None);
        assert_eq!(peek(l, &j3, &a3, T0 + 1, None).await, None);
        assert_eq!(
            ask(l, &j3, &a3, T0 + 1).await,
            Verdict::Resumed { admitted_at_ms: T0 }
        );
        // Sent: every later copy is answered from the record.
        assert!(settle(l, &j3, &a3, Ending::Sent, true).await);
        let got = same(l, &j3, &Ticket::new(), T0 + 2).await;
        assert!(got.is_none_or(|v| v == sent(T0, false, true)), "{got:?}");
        // Expired with no record: nothing is written either way.
        let j4 = own_job("j4", 4);
        let got = peek(l, &j4, &Ticket::new(), T0, Some(T0)).await;
        assert!(got.is_none_or(|v| v == Verdict::Expired), "{got:?}");
        assert_eq!(used(l, &j4, T0).await, (0, 0));
    }

    pub(super) async fn a_rejected_request_leaves_no_record<M: Make>(m: M) {
        let b = m.make("rejected", per_hour(1, 5)).await;
        let l = &b.ledger;
        assert_eq!(
            ask(l, &job("j0"), &Ticket::new(), T0).await,
            Verdict::Admitted
        );
        let (j, a) = (job("j1"), Ticket::new());
        let rejected = Verdict::Rejected {
            retry_after_ms: HOUR - 1,
            rule: RuleRef {
                scope: Scope::Email,
                window_ms: HOUR,
                max: 1,
            },
        };
        assert_eq!(ask(l, &j, &a, T0 + 1).await, rejected);
        assert_eq!(ask_with(l, &j, &a, T0 + 1, None).await, rejected);
        // No record binds a rejected id: another job under it is no conflict...
        assert_eq!(ask(l, &job("k1"), &a, T0 + 1).await, rejected);
        let k = TestJob::new("k1", "b@example.com", Some(IP));
        assert_eq!(ask(l, &k, &Ticket::new(), T0 + 2).await, Verdict::Admitted);
        // ...and after the window the same job is admitted afresh (not
        // resumed), even for the lineage that was rejected.
        assert_eq!(ask(l, &j, &a, T0 + HOUR).await, Verdict::Admitted);
        assert_eq!(ask(l, &j, &Ticket::new(), T0 + HOUR).await, busy(LEASE));
    }

    /// An attempt number never takes a send over: a later attempt of the
    /// owner's own lineage still waits for the lease, and after a send began
    /// it is unknown (the same attempt can be delivered twice, and producers
    /// can write any ticket and attempt). Late writes of an earlier attempt
    /// cannot change what a later attempt owns.
    pub(super) async fn attempts_fence_late_writes_but_never_take_a_send_over<M: Make>(m: M) {
        let b = m.make("fence", per_hour(5, 5)).await;
        let l = &b.ledger;
        let (j, a) = (job("j1"), Ticket::new());
        let entry = |attempt| Entry {
            job: j.attempt(&a, attempt),
            expires_at_ms: None,
            made_at_ms: None,
        };
        // Attempt 1 is sending.
        assert_eq!(ask_with(l, &j, &a, T0, None).await, Verdict::Admitted);
        // Attempt 2 of the same lineage waits for the lease like anyone.
        let v = l.admit(&entry(2), Clock::At(T0 + 1)).await.unwrap().verdict;
        assert_eq!(v, busy(LEASE - 1));
        // Attempt 1's transient failure releases; attempt 2 resumes it.
        assert!(l.release(&j.attempt(&a, 1)).await.unwrap());
        let v = l.admit(&entry(2), Clock::At(T0 + 2)).await.unwrap().verdict;
        assert_eq!(v, Verdict::Resumed { admitted_at_ms: T0 });
        // Late writes of attempt 1 are refused and change nothing.
        assert!(!l.release(&j.attempt(&a, 1)).await.unwrap());
        let refund = Ending::Refund(Refund::Failed);
        assert!(!l.settle(&j.attempt(&a, 1), &refund, true).await.unwrap());
        assert_eq!(
            used(l, &j, T0 + 3).await,
            (1, 1),
            "not refunded by attempt 1"
        );
        // Attempt 2 owns it, sending since it resumed it. Attempt 3 (or a
        // forged one) neither takes it over while it runs...
        let v = l.admit(&entry(3), Clock::At(T0 + 5)).await.unwrap().verdict;
        assert_eq!(v, busy(LEASE - 3));
        // ...nor after its lease lapsed: its send began, so it is unknown.
        let v = l
            .admit(&entry(3), Clock::At(T0 + 2 + LEASE))
            .await
            .unwrap()
            .verdict;
        assert_eq!(v, unknown(true, false));
    }

    pub(super) async fn health_is_ok<M: Make>(m: M) {
        let b = m.make("health", LimitSettings::default()).await;
        b.ledger.health().await.expect("healthy");
    }

    /// A newer job of another requester (another client network, or, with
    /// sessions, another attempt) supersedes nothing; the same requester's
    /// does, from any network when its session says so.
    pub(super) async fn only_the_same_requester_supersedes<M: Make>(m: M) {
        let b = m.make("supersede-who", superseding(per_hour(5, 5))).await;
        let l = &b.ledger;
        let owner = TestJob::new("owner", MAIL, Some("198.51.100.1"));
        let stranger = TestJob::new("stranger", MAIL, Some("203.0.113.1"));
        let (a, s) = (Ticket::new(), Ticket::new());
        assert_eq!(
            made(l, &owner, &a, T0, Some(T0 - 5)).await,
            Verdict::Admitted
        );
        assert!(release(l, &owner, &a).await, "a 451: retried later");
        assert_eq!(
            made(l, &stranger, &s, T0 + MIN, Some(T0 + MIN - 5)).await,
            Verdict::Admitted
        );
        assert!(matches!(
            made(l, &owner, &a, T0 + 2 * MIN, Some(T0 - 5)).await,
            Verdict::Resumed { .. }
        ));
        let session = |n: &str| mailgate::domain::Session::of(n).unwrap();
        let (s1, s2) = (session("signup-1"), session("signup-2"));
        let in_session = |id: &str, ip: &str, s: &mailgate::domain::Session| {
            let mut j = TestJob::new(id, "other@example.com", Some(ip));
            j.session = Some(s.clone());
            j
        };
        let (first, behind_nat) = (
            in_session("s1", "198.51.100.2", &s1),
            in_session("s2", "198.51.100.2", &s2),
        );
        let (t1, t2) = (Ticket::new(), Ticket::new());
        assert_eq!(
            made(l, &first, &t1, T0, Some(T0 - 5)).await,
            Verdict::Admitted
        );
        assert!(release(l, &first, &t1).await);
        assert_eq!(
            made(l, &behind_nat, &t2, T0 + MIN, Some(T0 + MIN - 5)).await,
            Verdict::Admitted
        );
        assert!(matches!(
            made(l, &first, &t1, T0 + 2 * MIN, Some(T0 - 5)).await,
            Verdict::Resumed { .. }
        ));
        let again = in_session("s1-again", "203.0.113.2", &s1);
        let t3 = Ticket::new();
        assert!(release(l, &first, &t1).await);
        assert_eq!(
            made(l, &again, &t3, T0 + 3 * MIN, Some(T0 + 3 * MIN)).await,
            Verdict::Admitted
        );
        assert_eq!(
            made(l, &first, &t1, T0 + 4 * MIN, Some(T0 - 5)).await,
            Verdict::Superseded { refunded: true }
        );
    }

    /// The user asked again while the first code waited for its retry
    /// (greylisted): the newer job is admitted, and the older one's retry
    /// is superseded, its quota refunded; a copy of it later is answered
    /// the same. Another purpose, or the newer job itself, is untouched.
    pub(super) async fn a_newer_job_supersedes_an_older_one_waiting_for_its_retry<M: Make>(m: M) {
        let b = m.make("supersede", superseding(per_hour(5, 5))).await;
        let l = &b.ledger;
        let (old, new) = (job("old"), job("new"));
        let (a, n) = (Ticket::new(), Ticket::new());
        assert_eq!(made(l, &old, &a, T0, Some(T0 - 5)).await, Verdict::Admitted);
        assert!(release(l, &old, &a).await, "a 451: retried later");
        assert_eq!(
            made(l, &new, &n, T0 + MIN, Some(T0 + MIN - 5)).await,
            Verdict::Admitted
        );
        assert_eq!(used(l, &old, T0 + MIN).await, (2, 2));
        assert_eq!(
            made(l, &old, &a, T0 + 2 * MIN, Some(T0 - 5)).await,
            Verdict::Superseded { refunded: true }
        );
        assert_eq!(used(l, &old, T0 + 2 * MIN).await, (1, 1), "refunded");
        assert_eq!(
            made(l, &old, &a, T0 + 2 * MIN + 1, Some(T0 - 5)).await,
            finished(Refund::Superseded, false)
        );
        assert!(answered(l, &old, &a).await);
        assert_eq!(
            made(l, &old, &a, T0 + 2 * MIN + 2, Some(T0 - 5)).await,
            finished(Refund::Superseded, true)
        );
        // The newer one goes on.
        assert!(settle(l, &new, &n, Ending::Sent, true).await);
        // A job of a purpose that does not supersede is left alone.
        let mut lim = superseding(per_hour(5, 5));
        lim.purpose.insert(
            "login".into(),
            mailgate::settings::PurposeLimits {
                supersede: Some(false),
                ..Default::default()
            },
        );
        let b = m.make("supersede-off", lim).await;
        let l = &b.ledger;
        let (old, new) = (
            job("old").purpose(Some("login")),
            job("new").purpose(Some("login")),
        );
        assert_eq!(made(l, &old, &a, T0, Some(T0)).await, Verdict::Admitted);
        assert!(release(l, &old, &a).await);
        assert_eq!(
            made(l, &new, &n, T0 + 1, Some(T0 + 1)).await,
            Verdict::Admitted
        );
        assert_eq!(
            made(l, &old, &a, T0 + 2, Some(T0)).await,
            Verdict::Resumed { admitted_at_ms: T0 }
        );
    }

    /// A job made before the newest admitted one (by more than
    /// `supersede_skew`), but arriving after it (it waited in a queue), is
    /// superseded without counting anything; one made within the skew is
    /// the newer by its later admission.
    pub(super) async fn an_older_job_coming_after_a_newer_one_is_superseded_uncounted<M: Make>(
        m: M,
    ) {
        let b = m.make("supersede-late", superseding(per_hour(5, 5))).await;
        let l = &b.ledger;
        let t = Ticket::new();
        assert_eq!(
            made(l, &job("new"), &t, T0, Some(T0)).await,
            Verdict::Admitted
        );
        assert_eq!(
            made(l, &job("old"), &t, T0 + 1, Some(T0 - 5 * SEC)).await,
            Verdict::Superseded { refunded: false }
        );
        assert_eq!(
            used(l, &job("old"), T0 + 1).await,
            (1, 1),
            "nothing counted"
        );
        assert_eq!(
            made(l, &job("twin"), &t, T0 + 2, Some(T0)).await,
            Verdict::Admitted
        );
        // Another mailbox is another story.
        let other = own_job("other", 1);
        assert_eq!(
            made(l, &other, &t, T0 + 3, Some(T0 - 9)).await,
            Verdict::Admitted
        );
        // A job "made" in the future (a producer's clock ahead) counts as
        // made when admitted: the next job, made after that, supersedes it
        // rather than being superseded for as long as the clock is ahead.
        let ahead = own_job("ahead", 2);
        let (a, n) = (Ticket::new(), Ticket::new());
        assert_eq!(
            made(l, &ahead, &a, T0 + 4, Some(T0 + HOUR)).await,
            Verdict::Admitted
        );
        assert!(release(l, &ahead, &a).await);
        // The same requester (a job is superseded only by its own's).
        let next = TestJob::new("next", &ahead.email.to_string(), Some("198.51.100.102"));
        assert_eq!(
            made(l, &next, &n, T0 + 10 * SEC, Some(T0 + 10 * SEC)).await,
            Verdict::Admitted
        );
        assert_eq!(
            made(l, &ahead, &a, T0 + 11 * SEC, Some(T0 + HOUR)).await,
            Verdict::Superseded { refunded: true }
        );
    }

    /// The newest job refunded, a newer job than the older one between
    /// them still supersedes it (otherwise the stale code is mailed after
    /// the newer one).
    pub(super) async fn a_refunded_newest_job_leaves_the_one_before_it_superseding<M: Make>(m: M) {
        let b = m
            .make("supersede-middle", superseding(per_hour(5, 5)))
            .await;
        let l = &b.ledger;
        let (o, n, newest) = (job("o"), job("n"), job("m"));
        let (a, b2, c) = (Ticket::new(), Ticket::new(), Ticket::new());
        assert_eq!(made(l, &o, &a, T0, Some(T0)).await, Verdict::Admitted);
        assert!(release(l, &o, &a).await);
        assert_eq!(
            made(l, &n, &b2, T0 + MIN, Some(T0 + MIN)).await,
            Verdict::Admitted
        );
        assert!(settle(l, &n, &b2, Ending::Sent, true).await);
        assert_eq!(
            made(l, &newest, &c, T0 + 2 * MIN, Some(T0 + 2 * MIN)).await,
            Verdict::Admitted
        );
        assert!(settle(l, &newest, &c, Ending::Refund(Refund::Failed), true).await);
        assert_eq!(
            made(l, &o, &a, T0 + 3 * MIN, Some(T0)).await,
            Verdict::Superseded { refunded: true }
        );
    }

    /// Two jobs made within `supersede_skew` of each other supersede
    /// neither (which was made first cannot be told: producers' clocks
    /// disagree, the AMQP timestamp has whole seconds), whichever is
    /// admitted first, so the newest code is never dropped; made further
    /// apart, the later one supersedes.
    pub(super) async fn jobs_made_within_the_skew_supersede_neither<M: Make>(m: M) {
        let b = m.make("supersede-skew", superseding(per_hour(9, 9))).await;
        let l = &b.ledger;
        let (o, n) = (job("o"), job("n"));
        let (a, b2) = (Ticket::new(), Ticket::new());
        // A slow producer: the newer job says it was made before the older.
        assert_eq!(
            made(l, &o, &a, T0 + 900, Some(T0 + 900)).await,
            Verdict::Admitted
        );
        assert!(release(l, &o, &a).await);
        assert_eq!(
            made(l, &n, &b2, T0 + 1500, Some(T0)).await,
            Verdict::Admitted
        );
        assert_eq!(
            made(l, &o, &a, T0 + 2000, Some(T0 + 900)).await,
            Verdict::Resumed {
                admitted_at_ms: T0 + 900
            }
        );
        // A double click admitted out of order: both mailed.
        let (x, y) = (job("x"), job("y"));
        assert_eq!(
            made(l, &x, &a, T0 + 5 * SEC, Some(T0 + 4 * SEC + 500)).await,
            Verdict::Admitted
        );
        assert!(release(l, &x, &a).await);
        assert_eq!(
            made(l, &y, &b2, T0 + 5 * SEC + 100, Some(T0 + 4 * SEC)).await,
            Verdict::Admitted
        );
        assert_eq!(
            made(l, &x, &a, T0 + 6 * SEC, Some(T0 + 4 * SEC + 500)).await,
            Verdict::Resumed {
                admitted_at_ms: T0 + 5 * SEC
            }
        );
        // Exactly the skew apart: neither; a millisecond more: the later.
        let (p, q) = (own_job("p", 7), own_job("q", 7));
        assert_eq!(
            made(l, &p, &a, T0 + 10 * SEC, Some(T0 + 10 * SEC)).await,
            Verdict::Admitted
        );
        assert!(release(l, &p, &a).await);
        let q_made = T0 + 12 * SEC;
        assert_eq!(
            made(l, &q, &b2, q_made, Some(q_made)).await,
            Verdict::Admitted
        );
        let at_p = T0 + 10 * SEC;
        assert_eq!(
            made(l, &p, &a, q_made + 1, Some(at_p)).await,
            Verdict::Resumed {
                admitted_at_ms: at_p
            }
        );
        assert!(release(l, &p, &a).await);
        let r = own_job("r", 7);
        assert_eq!(
            made(l, &r, &b2, q_made + 2, Some(at_p + 2001)).await,
            Verdict::Admitted
        );
        assert_eq!(
            made(l, &p, &a, q_made + 3, Some(at_p)).await,
            Verdict::Superseded { refunded: true }
        );
    }

    /// A newer job refunded (its mail failed) mails nothing: the older one
    /// is not superseded by it.
    pub(super) async fn a_refunded_newer_job_supersedes_nothing<M: Make>(m: M) {
        let b = m
            .make("supersede-refunded", superseding(per_hour(5, 5)))
            .await;
        let l = &b.ledger;
        let (old, new) = (job("old"), job("new"));
        let (a, n) = (Ticket::new(), Ticket::new());
        assert_eq!(made(l, &old, &a, T0, Some(T0)).await, Verdict::Admitted);
        assert!(release(l, &old, &a).await);
        assert_eq!(
            made(l, &new, &n, T0 + 1, Some(T0 + 1)).await,
            Verdict::Admitted
        );
        assert!(settle(l, &new, &n, Ending::Refund(Refund::Failed), true).await);
        assert_eq!(
            made(l, &old, &a, T0 + 2, Some(T0)).await,
            Verdict::Resumed { admitted_at_ms: T0 }
        );
    }

    /// Without `created_at` or a publish time, a job counts as made when
    /// admitted: admitted more than the skew later, it is the newer.
    pub(super) async fn without_made_at_the_order_of_admissions_decides<M: Make>(m: M) {
        let b = m.make("supersede-order", superseding(per_hour(5, 5))).await;
        let l = &b.ledger;
        let (old, new) = (job("old"), job("new"));
        let (a, n) = (Ticket::new(), Ticket::new());
        assert_eq!(made(l, &old, &a, T0, None).await, Verdict::Admitted);
        assert!(release(l, &old, &a).await);
        assert_eq!(
            made(l, &new, &n, T0 + 10 * SEC, None).await,
            Verdict::Admitted
        );
        assert_eq!(
            made(l, &old, &a, T0 + 20 * SEC, None).await,
            Verdict::Superseded { refunded: true }
        );
        // The newer job's own retry is not superseded by itself.
        assert!(release(l, &new, &n).await);
        assert_eq!(
            made(l, &new, &n, T0 + 30 * SEC, None).await,
            Verdict::Resumed {
                admitted_at_ms: T0 + 10 * SEC
            }
        );
    }

    /// A job whose SMTP transaction began may have been mailed: it is never
    /// answered `superseded`; a lapsed lease makes it unknown, as always.
    pub(super) async fn a_send_begun_is_never_superseded<M: Make>(m: M) {
        let b = m
            .make("supersede-sending", superseding(per_hour(5, 5)))
            .await;
        let l = &b.ledger;
        let (old, new) = (job("old"), job("new"));
        let (a, n) = (Ticket::new(), Ticket::new());
        assert_eq!(made(l, &old, &a, T0, Some(T0)).await, Verdict::Admitted);
        assert_eq!(
            made(l, &new, &n, T0 + 2, Some(T0 + 2)).await,
            Verdict::Admitted
        );
        assert_eq!(
            made(l, &old, &Ticket::new(), T0 + 2 * LEASE, Some(T0)).await,
            unknown(false, false)
        );
    }
}

macro_rules! conformance {
    ($($case:ident,)* ; one slot: $($one:ident,)*) => {
        mod redis {
            use super::*;
            $(
                #[tokio::test]
                async fn $case() {
                    cases::$case(RedisBackend).await;
                }
            )*
            $(
                #[tokio::test]
                async fn $one() {
                    cases::$one(RedisBackend).await;
                }
            )*
        }
        mod memory {
            use super::*;
            $(
                #[tokio::test]
                async fn $case() {
                    cases::$case(MemoryBackend).await;
                }
            )*
            $(
                #[tokio::test]
                async fn $one() {
                    cases::$one(MemoryBackend).await;
                }
            )*
        }
        /// Every case again, on a Redis Cluster of the test's own (one
        /// cluster for all of them: starting one takes seconds): with every
        /// key in one slot, then spread over the shards (but for those
        /// that need one slot: superseding).
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn every_case_on_a_cluster_in_one_slot_and_spread() {
            let _cluster = PrivateCluster::start();
            $(
                cases::$case(ClusterBackend).await;
            )*
            $(
                cases::$one(ClusterBackend).await;
            )*
            $(
                cases::$case(SpreadBackend).await;
            )*
        }
    };
}

conformance!(
    a_second_message_is_busy_for_the_rest_of_the_lease,
    a_released_send_passes_to_another_lineage_sending,
    release_by_the_owner_lets_the_next_message_resume_at_once,
    release_by_another_lineage_or_of_an_unknown_id_is_refused,
    a_send_whose_lease_lapses_is_unknown_and_never_resent,
    an_admission_is_its_send_and_a_lapse_is_unknown,
    sent_is_reported_to_every_later_message,
    a_late_sent_overrides_unknown,
    an_owners_refund_gives_the_quota_back_in_every_scope,
    a_failure_stays_counted_against_its_requester_only,
    a_refund_by_another_lineage_or_after_a_send_is_refused,
    answered_is_recorded_for_the_owner_only,
    another_job_under_the_same_id_is_a_conflict_that_touches_nothing,
    the_fingerprint_is_the_parsed_address_client_and_purpose,
    an_expired_job_without_a_record_writes_nothing,
    an_expired_unsent_admission_is_refunded,
    expiry_never_refunds_a_send_begun_or_done,
    a_refund_removes_only_its_own_admission,
    resuming_and_release_renew_the_records_life,
    an_expires_at_of_zero_is_in_the_past,
    a_rejected_request_leaves_no_record,
    a_look_answers_what_an_admission_would_and_writes_nothing,
    attempts_fence_late_writes_but_never_take_a_send_over,
    health_is_ok,
    ; one slot:
    a_newer_job_supersedes_an_older_one_waiting_for_its_retry,
    only_the_same_requester_supersedes,
    an_older_job_coming_after_a_newer_one_is_superseded_uncounted,
    a_refunded_newer_job_supersedes_nothing,
    without_made_at_the_order_of_admissions_decides,
    a_send_begun_is_never_superseded,
    a_refunded_newest_job_leaves_the_one_before_it_superseding,
    jobs_made_within_the_skew_supersede_neither,
);

/// Tickets come from headers: only a ticket's shape is accepted.
#[test]
fn tickets_are_32_lowercase_hex_digits() {
    let t = Ticket::new();
    assert_eq!(Ticket::parse(t.as_str()), Some(t));
    let ok = "0123456789abcdef0123456789abcdef";
    assert_eq!(
        Ticket::parse(ok).map(|t| t.as_str().to_owned()),
        Some(ok.into())
    );
    for bad in [
        "",
        "0",
        &ok[..31],
        &format!("{ok}0"),
        "0123456789ABCDEF0123456789abcdef",
        "0123456789abcdef0123456789abcdeg",
        " 123456789abcdef0123456789abcdef",
        "0123456789abcdef0123456789abcde\n",
        "0123456789abcdef-123456789abcdef",
        "0123456789abcdef0123456789abcdé",
        "01234567-89ab-cdef-0123-456789abcdef",
    ] {
        assert_eq!(Ticket::parse(bad), None, "{bad:?}");
    }
}
