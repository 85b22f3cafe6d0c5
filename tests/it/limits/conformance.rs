//! One conformance suite for the limiter's decisions in both ledger
//! backends, with an explicit clock so hour- and day-long windows are checked
//! without waiting. Each check is a new message (a fresh ticket). The Redis
//! backend runs against the real shared Redis, under a per-test key prefix.
//! The job lifecycle has its own suite (`ledger_conformance`).

use crate::common::*;
use mailgate::domain::Ticket;
use mailgate::domain::now_ms;
use mailgate::domain::{IpKey, RegistrableDomain};
use mailgate::ledger::{Ledger, Verdict};
use mailgate::limiter::overrides::{Action, Override, Target};
use mailgate::limiter::{Clock, Quotas, Room, RuleRef, RuleUsage, Scope, Subject};
use mailgate::settings::{DomainRules, LimitSettings, PurposeLimits, Rule};

/// No mailbox or IP rules; `domain` for the registrable domain, with
/// gmail.com and qq.com exempt.
fn domain_limits(domain: &[(u64, u32)]) -> LimitSettings {
    LimitSettings {
        domain: DomainRules {
            rules: rules(domain).rules,
            exempt: ["gmail.com", "qq.com"]
                .map(|d| RegistrableDomain::parse_exact(d).unwrap())
                .to_vec(),
            ..Default::default()
        },
        ..limits(&[], &[])
    }
}

/// The whole admission of a new message for job `job` to a@example.com
/// from 198.51.100.1 at `t` ms.
async fn admission<L: Ledger>(l: &L, job: &str, t: u64) -> mailgate::ledger::Admission {
    TestJob::new(job, "a@example.com", Some("198.51.100.1"))
        .admission(l, &Ticket::new(), Clock::At(t))
        .await
}

/// Asks `l` about a new message for job `job` to `mail` from `from` at `t` ms.
async fn check<L: Ledger>(l: &L, job: &str, mail: &str, from: Option<&str>, t: u64) -> Verdict {
    check_for(l, job, mail, from, None, t).await
}

/// [`check`] for a job of `purpose`.
async fn check_for<L: Ledger>(
    l: &L,
    job: &str,
    mail: &str,
    from: Option<&str>,
    purpose: Option<&str>,
    t: u64,
) -> Verdict {
    TestJob::new(job, mail, from)
        .purpose(purpose)
        .admit(l, &Ticket::new(), Clock::At(t))
        .await
}

fn rejected(retry_after_ms: u64, scope: Scope, window_ms: u64, max: u32) -> Verdict {
    Verdict::Rejected {
        retry_after_ms,
        rule: rule_ref(scope, window_ms, max),
    }
}

fn rule_ref(scope: Scope, window_ms: u64, max: u32) -> RuleRef {
    RuleRef {
        scope,
        window_ms,
        max,
    }
}

/// `retry_after_ms` is exact: one ms earlier is still rejected, at it the
/// request is admitted.
async fn assert_exact<L: Ledger>(l: &L, job: &str, mail: &str, from: Option<&str>, t: u64) {
    let v = check(l, job, mail, from, t).await;
    let Verdict::Rejected { retry_after_ms, .. } = v else {
        panic!("expected a rejection at {t}, got {v:?}");
    };
    assert!(
        matches!(
            check(l, job, mail, from, t + retry_after_ms - 1).await,
            Verdict::Rejected { .. }
        ),
        "one ms before retry_after the request must still be rejected"
    );
    assert_eq!(
        check(l, job, mail, from, t + retry_after_ms).await,
        Verdict::Admitted,
        "at retry_after the request must be admitted"
    );
}

mod cases {
    use super::*;

    pub(super) async fn first_request_then_30s_later<M: Make>(m: M) {
        let b = m.make("first", LimitSettings::default()).await;
        let l = &b.ledger;
        // A brand-new key: the article's script crashed here on a nil timestamp.
        assert_eq!(
            check(l, "j1", "a@example.com", None, 0).await,
            Verdict::Admitted
        );
        assert_eq!(
            check(l, "j2", "a@example.com", None, 30 * SEC).await,
            rejected(30_000, Scope::Email, 60_000, 1)
        );
        assert_exact(l, "j3", "a@example.com", None, 30 * SEC).await;
    }

    pub(super) async fn sixth_in_an_hour<M: Make>(m: M) {
        let b = m.make("hour", LimitSettings::default()).await;
        let l = &b.ledger;
        for i in 0..5 {
            let t = i * 61 * SEC;
            let v = check(l, &format!("j{i}"), "a@example.com", None, t).await;
            assert_eq!(v, Verdict::Admitted, "send {i} at {t}");
        }
        let t = 5 * 61 * SEC;
        assert_eq!(
            check(l, "j5", "a@example.com", None, t).await,
            rejected(HOUR - t, Scope::Email, HOUR, 5)
        );
        assert_exact(l, "j6", "a@example.com", None, t).await;
    }

    pub(super) async fn eleventh_in_a_day<M: Make>(m: M) {
        let b = m.make("day", LimitSettings::default()).await;
        let l = &b.ledger;
        for i in 0..10 {
            let v = check(l, &format!("j{i}"), "a@example.com", None, i * 2 * HOUR).await;
            assert_eq!(v, Verdict::Admitted, "send {i}");
        }
        assert_eq!(
            check(l, "j10", "a@example.com", None, 20 * HOUR).await,
            rejected(4 * HOUR, Scope::Email, 24 * HOUR, 10)
        );
        // The window is (t − 24h, t]: the send at 0 leaves it at exactly 24h.
        assert!(matches!(
            check(l, "j11", "a@example.com", None, 24 * HOUR - 1).await,
            Verdict::Rejected { .. }
        ));
        assert_eq!(
            check(l, "j12", "a@example.com", None, 24 * HOUR).await,
            Verdict::Admitted
        );
    }

    pub(super) async fn ip_rejection_uses_no_mailbox_quota<M: Make>(m: M) {
        let b = m.make("ipnomail", limits(&[(MIN, 1)], &[(MIN, 5)])).await;
        let l = &b.ledger;
        let x = Some("198.51.100.1");
        for i in 0..5 {
            let v = check(l, &format!("j{i}"), &format!("u{i}@example.com"), x, i).await;
            assert_eq!(v, Verdict::Admitted);
        }
        assert_eq!(
            check(l, "victim-1", "victim@example.com", x, 10).await,
            rejected(MIN - 10, Scope::Ip, MIN, 5)
        );
        // The mailbox quota is intact: the same mailbox from elsewhere goes through.
        assert_eq!(
            check(
                l,
                "victim-2",
                "victim@example.com",
                Some("198.51.100.2"),
                11
            )
            .await,
            Verdict::Admitted
        );
    }

    pub(super) async fn mailbox_rejection_uses_no_ip_quota<M: Make>(m: M) {
        let b = m.make("mailnoip", limits(&[(MIN, 1)], &[(MIN, 5)])).await;
        let l = &b.ledger;
        assert_eq!(
            check(l, "j0", "a@example.com", Some("198.51.100.1"), 0).await,
            Verdict::Admitted
        );
        // Rejected by the mailbox rule, from another IP, many times...
        for i in 0..10 {
            let v = check(
                l,
                &format!("r{i}"),
                "a@example.com",
                Some("198.51.100.2"),
                1 + i,
            )
            .await;
            assert_eq!(v, rejected(MIN - 1 - i, Scope::Email, MIN, 1));
        }
        // ...and that IP still has all five of its sends.
        for i in 0..5 {
            let v = check(
                l,
                &format!("k{i}"),
                &format!("u{i}@example.com"),
                Some("198.51.100.2"),
                20,
            )
            .await;
            assert_eq!(v, Verdict::Admitted, "send {i}");
        }
    }

    pub(super) async fn same_millisecond_both_count<M: Make>(m: M) {
        let b = m.make("samems", limits(&[(MIN, 2)], &[(MIN, 3)])).await;
        let l = &b.ledger;
        let x = Some("198.51.100.1");
        assert_eq!(
            check(l, "j1", "a@example.com", x, 1000).await,
            Verdict::Admitted
        );
        assert_eq!(
            check(l, "j2", "a@example.com", x, 1000).await,
            Verdict::Admitted
        );
        assert_eq!(
            check(l, "j3", "a@example.com", x, 1000).await,
            rejected(MIN, Scope::Email, MIN, 2)
        );
        assert_eq!(
            check(l, "j4", "b@example.com", x, 1000).await,
            Verdict::Admitted
        );
        assert_eq!(
            check(l, "j5", "c@example.com", x, 1000).await,
            rejected(MIN, Scope::Ip, MIN, 3)
        );
    }

    pub(super) async fn ipv6_groups_by_64<M: Make>(m: M) {
        let b = m.make("v6", limits(&[(MIN, 1)], &[(MIN, 1)])).await;
        let l = &b.ledger;
        assert_eq!(
            check(l, "j1", "a@example.com", Some("2001:db8:1:2::1"), 0).await,
            Verdict::Admitted
        );
        assert_eq!(
            check(
                l,
                "j2",
                "b@example.com",
                Some("2001:db8:1:2:ffff:ffff:ffff:ffff"),
                1
            )
            .await,
            rejected(MIN - 1, Scope::Ip, MIN, 1)
        );
        assert_eq!(
            check(l, "j3", "c@example.com", Some("2001:db8:1:3::1"), 2).await,
            Verdict::Admitted
        );
        // IPv4-mapped IPv6 is the IPv4 address.
        assert_eq!(
            check(l, "j4", "d@example.com", Some("203.0.113.9"), 3).await,
            Verdict::Admitted
        );
        assert_eq!(
            check(l, "j5", "e@example.com", Some("::ffff:203.0.113.9"), 4).await,
            rejected(MIN - 1, Scope::Ip, MIN, 1)
        );
    }

    pub(super) async fn spellings_of_a_mailbox_share_quota<M: Make>(m: M) {
        let b = m.make("norm", LimitSettings::default()).await;
        let l = &b.ledger;
        assert_eq!(
            check(l, "j0", "John.Smith@gmail.com", None, 0).await,
            Verdict::Admitted
        );
        for (i, spelling) in [
            "johnsmith@gmail.com",
            " JOHN.SMITH+promo@googlemail.com ",
            "j.o.h.n.s.m.i.t.h+x@GMAIL.COM",
            "\"john.smith\"@gmail.com",
        ]
        .into_iter()
        .enumerate()
        {
            let v = check(l, &format!("j{}", i + 1), spelling, None, 1).await;
            assert_eq!(v, rejected(MIN - 1, Scope::Email, MIN, 1), "{spelling}");
        }
        // Outside gmail, dots are significant; tags and case are not.
        assert_eq!(
            check(l, "k0", "J.Doe+a@Example.com", None, 0).await,
            Verdict::Admitted
        );
        assert!(matches!(
            check(l, "k1", "j.doe@example.com", None, 1).await,
            Verdict::Rejected { .. }
        ));
        assert_eq!(
            check(l, "k2", "jdoe@example.com", None, 2).await,
            Verdict::Admitted
        );
        // IDN: the unicode and punycode spellings of a domain are one domain.
        assert_eq!(
            check(l, "m0", "anna@bücher.example", None, 0).await,
            Verdict::Admitted
        );
        assert!(matches!(
            check(l, "m1", "Anna@XN--BCHER-KVA.example", None, 1).await,
            Verdict::Rejected { .. }
        ));
    }

    pub(super) async fn no_ip_means_mailbox_only<M: Make>(m: M) {
        let b = m.make("noip", limits(&[(MIN, 5)], &[(MIN, 1)])).await;
        let l = &b.ledger;
        for i in 0..5 {
            let v = check(l, &format!("j{i}"), "a@example.com", None, i).await;
            assert_eq!(v, Verdict::Admitted);
        }
        // Jobs without an IP did not touch any IP key.
        assert_eq!(
            check(l, "k", "b@example.com", Some("198.51.100.1"), 10).await,
            Verdict::Admitted
        );
    }

    pub(super) async fn longest_wait_binds<M: Make>(m: M) {
        let b = m.make("binds", limits(&[(MIN, 1)], &[(10 * MIN, 2)])).await;
        let l = &b.ledger;
        let x = Some("198.51.100.1");
        assert_eq!(
            check(l, "j1", "a@example.com", x, 0).await,
            Verdict::Admitted
        );
        assert_eq!(
            check(l, "j2", "b@example.com", x, 1).await,
            Verdict::Admitted
        );
        // Both the mailbox rule (wait 59.99 s) and the IP rule (wait ~10 min)
        // are full; the IP rule decides the wait.
        assert_eq!(
            check(l, "j3", "a@example.com", x, 10).await,
            rejected(10 * MIN - 10, Scope::Ip, 10 * MIN, 2)
        );
        assert_exact(l, "j4", "a@example.com", x, 20).await;
    }

    pub(super) async fn a_clock_that_steps_back_frees_no_quota<M: Make>(m: M) {
        // A Redis clock that stepped back (an NTP correction on the Redis
        // host) decides before admissions it recorded: they still count, in
        // every window, and the wait is at most the window plus the step.
        let b = m.make("future", limits(&[(MIN, 1)], &[(MIN, 20)])).await;
        let l = &b.ledger;
        let x = Some("198.51.100.1");
        assert_eq!(
            check(l, "j1", "a@example.com", x, 10 * SEC).await,
            Verdict::Admitted
        );
        // 5 s back: the admission at 10 s is "in the future" and counts.
        assert_eq!(
            check(l, "j2", "a@example.com", x, 5 * SEC).await,
            rejected(65 * SEC, Scope::Email, MIN, 1)
        );
        for i in 0..18 {
            let v = check(
                l,
                &format!("k{i}"),
                &format!("u{i}@example.com"),
                x,
                20 * SEC,
            )
            .await;
            assert_eq!(v, Verdict::Admitted, "send {i}");
        }
        // 19 admissions after 20 s − 1 min: one more fits, then the oldest
        // (10 s) binds.
        assert_eq!(
            check(l, "k18", "v@example.com", x, 20 * SEC).await,
            Verdict::Admitted
        );
        assert_eq!(
            check(l, "k19", "w@example.com", x, 20 * SEC).await,
            rejected(50 * SEC, Scope::Ip, MIN, 20)
        );
        // Stepped back further, below the first admission: still counted.
        assert_eq!(
            check(l, "k20", "z@example.com", x, 9 * SEC).await,
            rejected(61 * SEC, Scope::Ip, MIN, 20)
        );
        // The wait stays exact at the stepped clock.
        assert_exact(l, "j3", "a@example.com", None, 5 * SEC).await;
    }

    pub(super) async fn a_clock_a_moment_behind_its_newest_time_frees_no_quota<M: Make>(m: M) {
        // An admission that has just left the longest window is kept a
        // minute more: a clock that steps back a moment later still counts
        // it. Also for a window of MAX_PERIOD, the longest allowed.
        let max_ms = mailgate::settings::MAX_PERIOD.as_millis() as u64;
        for (name, w) in [("slack-min", MIN), ("slack-max", max_ms)] {
            let b = m.make(name, limits(&[(w, 2)], &[])).await;
            let l = &b.ledger;
            assert_eq!(
                check(l, "j1", "a@example.com", None, 0).await,
                Verdict::Admitted
            );
            // j1 has just left the window: room for one more.
            assert_eq!(
                check(l, "j2", "a@example.com", None, w).await,
                Verdict::Admitted
            );
            // 1 ms back, j1 is inside the window again and j2 counts too.
            assert_eq!(
                check(l, "j3", "a@example.com", None, w - 1).await,
                rejected(1, Scope::Email, w, 2),
                "window {w}"
            );
        }
    }

    pub(super) async fn a_purpose_has_its_own_rules_over_the_shared_log<M: Make>(m: M) {
        let mut lim = limits(&[(MIN, 3)], &[]);
        lim.purpose.insert(
            "reset_password".into(),
            PurposeLimits {
                email: Some(rules(&[(MIN, 1), (HOUR, 2)])),
                ip: None,
                domain: None,
                supersede: None,
            },
        );
        let b = m.make("purpose", lim).await;
        let l = &b.ledger;
        let reset = Some("reset_password");
        assert_eq!(
            check(l, "v1", "a@example.com", None, 0).await,
            Verdict::Admitted
        );
        // The reset rules count the verify code too: the inbox is one inbox.
        assert_eq!(
            check_for(l, "r1", "a@example.com", None, reset, 1).await,
            rejected(MIN - 1, Scope::Email, MIN, 1)
        );
        assert_eq!(
            check(l, "v2", "a@example.com", None, 2).await,
            Verdict::Admitted
        );
        // Two minutes on, the 1-minute default window is empty, but the reset
        // purpose's 1-hour window still holds both: admissions are kept for
        // the longest window of any purpose.
        assert_eq!(
            check_for(l, "r2", "a@example.com", None, reset, 2 * MIN).await,
            rejected(HOUR - 2 * MIN, Scope::Email, HOUR, 2)
        );
        assert_eq!(
            check_for(l, "r3", "a@example.com", None, Some("verify"), 2 * MIN).await,
            Verdict::Admitted,
            "a purpose without overrides uses the defaults"
        );
    }

    pub(super) async fn usage_shows_each_rule_and_uses_nothing<M: Make>(m: M) {
        let b = m.make("usage", LimitSettings::default()).await;
        let l = &b.ledger;
        assert_eq!(
            check(l, "j1", "a@example.com", None, 0).await,
            Verdict::Admitted
        );
        assert_eq!(
            check(l, "j2", "a@example.com", None, 61 * SEC).await,
            Verdict::Admitted
        );
        let a = email("A+x@Example.com");
        for _ in 0..2 {
            let u = l
                .usage(Subject::Email(&a), None, Clock::At(90 * SEC))
                .await
                .unwrap();
            assert!(u.key.ends_with("email:a@example.com"), "{}", u.key);
            assert_eq!(u.at_ms, 90 * SEC);
            let per_rule: Vec<(u64, u32, u32, u64)> = u
                .rules
                .iter()
                .map(|r: &RuleUsage| (r.rule.window_ms, r.rule.max, r.count, r.retry_after_ms))
                .collect();
            assert_eq!(
                per_rule,
                [
                    (MIN, 1, 1, 31 * SEC),
                    (HOUR, 5, 2, 0),
                    (24 * HOUR, 10, 2, 0)
                ]
            );
            assert_eq!(u.retry_after_ms, 31 * SEC);
        }
        // It matches what the limiter decides.
        assert_eq!(
            check(l, "j3", "a@example.com", None, 90 * SEC).await,
            rejected(31 * SEC, Scope::Email, MIN, 1)
        );
        let fresh = ip("198.51.100.9");
        let u = l
            .usage(Subject::Ip(&fresh), None, Clock::At(0))
            .await
            .unwrap();
        assert!(
            u.rules
                .iter()
                .all(|r| r.count == 0 && r.retry_after_ms == 0)
        );
    }

    pub(super) async fn reset_forgets_a_mailbox<M: Make>(m: M) {
        let b = m.make("reset", LimitSettings::default()).await;
        let l = &b.ledger;
        assert_eq!(
            check(l, "j1", "a@example.com", None, 0).await,
            Verdict::Admitted
        );
        assert!(matches!(
            check(l, "j2", "a@example.com", None, 1).await,
            Verdict::Rejected { .. }
        ));
        let a = email("a@example.com");
        let (key, removed) = l.reset(Subject::Email(&a)).await.unwrap();
        assert!(key.ends_with("email:a@example.com"));
        assert_eq!(removed, 1);
        assert_eq!(l.reset(Subject::Email(&a)).await.unwrap().1, 0);
        assert_eq!(
            check(l, "j3", "a@example.com", None, 2).await,
            Verdict::Admitted
        );
        // The job record stays: j1 is still owned by its first message.
        assert!(matches!(
            check(l, "j1", "a@example.com", None, 3).await,
            Verdict::Busy { .. }
        ));
    }

    pub(super) async fn disabled_scope_is_not_limited<M: Make>(m: M) {
        let b = m.make("noscope", limits(&[], &[(MIN, 2)])).await;
        let l = &b.ledger;
        let x = Some("198.51.100.1");
        assert_eq!(
            check(l, "j1", "a@example.com", x, 0).await,
            Verdict::Admitted
        );
        assert_eq!(
            check(l, "j2", "a@example.com", x, 0).await,
            Verdict::Admitted
        );
        assert_eq!(
            check(l, "j3", "a@example.com", x, 0).await,
            rejected(MIN, Scope::Ip, MIN, 2)
        );
    }

    /// Catch-all farming: a new mailbox and a new client address each time,
    /// at sub-domains of one registrable domain. The domain rule binds,
    /// exactly; exempt providers and other domains pass.
    pub(super) async fn the_domain_scope_binds_across_mailboxes_and_clients<M: Make>(m: M) {
        let b = m.make("domain", domain_limits(&[(10 * MIN, 3)])).await;
        let l = &b.ledger;
        for (n, mail) in [
            "a@example.co.uk",
            "b@mx.example.co.uk",
            "c@a.b.Example.co.uk",
        ]
        .iter()
        .enumerate()
        {
            // A network each (one network may use a fifth of the quota).
            let from = format!("198.51.{}.9", 100 + n);
            assert_eq!(
                check(l, &format!("f{n}"), mail, Some(&from), n as u64 * SEC).await,
                Verdict::Admitted
            );
        }
        assert_eq!(
            check(l, "f3", "d@example.co.uk", Some("203.0.113.7"), 5 * SEC).await,
            rejected(10 * MIN - 5 * SEC, Scope::Domain, 10 * MIN, 3)
        );
        assert_exact(
            l,
            "f4",
            "e@farm.example.co.uk",
            Some("203.0.113.8"),
            6 * SEC,
        )
        .await;
        // Exempt providers and other domains are not counted by it.
        for n in 0..5 {
            for mail in [format!("u{n}@gmail.com"), format!("u{n}@googlemail.com")] {
                assert_eq!(
                    check(l, &format!("g{n}-{mail}"), &mail, None, 7 * SEC).await,
                    Verdict::Admitted,
                    "{mail}"
                );
            }
            assert_eq!(
                check(
                    l,
                    &format!("q{n}"),
                    &format!("u{n}@vip.qq.com"),
                    None,
                    7 * SEC
                )
                .await,
                Verdict::Admitted
            );
        }
        assert_eq!(
            check(l, "o1", "a@example.org", None, 7 * SEC).await,
            Verdict::Admitted
        );
        // Usage names the domain's key; an exempt one says so.
        let farm = RegistrableDomain::parse("x.example.co.uk").unwrap();
        let u = l
            .usage(Subject::Domain(&farm), None, Clock::At(8 * SEC))
            .await
            .unwrap();
        assert!(u.key.ends_with("domain:example.co.uk"), "{}", u.key);
        assert_eq!((u.rules[0].count, u.exempt), (4, false));
        let gmail = RegistrableDomain::parse("gmail.com").unwrap();
        let u = l
            .usage(Subject::Domain(&gmail), None, Clock::At(8 * SEC))
            .await
            .unwrap();
        assert_eq!((u.rules[0].count, u.retry_after_ms, u.exempt), (0, 0, true));
        // Support staff can forget a domain's admissions.
        let (key, removed) = l.reset(Subject::Domain(&farm)).await.unwrap();
        assert!(key.ends_with("domain:example.co.uk"));
        assert_eq!(removed, 4);
    }

    /// The domain is judged with the mailbox and the client, all or
    /// nothing: a rejection by one scope takes no quota in the others, and
    /// on a tie the earlier scope (email, ip, domain) binds.
    pub(super) async fn the_domain_scope_is_all_or_nothing_with_the_others<M: Make>(m: M) {
        let lim = LimitSettings {
            domain: DomainRules {
                rules: rules(&[(MIN, 2)]).rules,
                exempt: Vec::new(),
                // One client throughout: the domain's own rule, not the
                // network's share of it (see
                // `one_network_uses_its_share_of_a_domain`).
                network_share: 1.0,
            },
            ..limits(&[(MIN, 1)], &[(MIN, 5)])
        };
        let b = m.make("domain-all", lim).await;
        let l = &b.ledger;
        let x = Some("198.51.100.1");
        assert_eq!(
            check(l, "j1", "a@example.com", x, 0).await,
            Verdict::Admitted
        );
        // The mailbox rejects: the domain keeps its room.
        assert_eq!(
            check(l, "j2", "a@example.com", x, 10).await,
            rejected(MIN - 10, Scope::Email, MIN, 1)
        );
        assert_eq!(
            check(l, "j3", "b@example.com", x, 20).await,
            Verdict::Admitted
        );
        // The domain rejects: the mailbox and the client keep theirs.
        assert_eq!(
            check(l, "j4", "c@example.com", x, 30).await,
            rejected(MIN - 30, Scope::Domain, MIN, 2)
        );
        assert_eq!(
            check(l, "j5", "c@example.org", x, 40).await,
            Verdict::Admitted
        );
        // Mailbox and domain full until the same moment (j1 leaves both
        // windows): the mailbox binds.
        assert_eq!(
            check(l, "j6", "a@example.com", x, 50).await,
            rejected(MIN - 50, Scope::Email, MIN, 1)
        );
    }

    /// A purpose's own domain rules, over the shared log.
    pub(super) async fn a_purpose_has_its_own_domain_rules<M: Make>(m: M) {
        let mut lim = domain_limits(&[(MIN, 3)]);
        lim.purpose.insert(
            "reset_password".into(),
            PurposeLimits {
                email: None,
                ip: None,
                domain: Some(rules(&[(MIN, 1)])),
                supersede: None,
            },
        );
        let b = m.make("domain-purpose", lim).await;
        let l = &b.ledger;
        let reset = Some("reset_password");
        assert_eq!(
            check(l, "v1", "a@example.com", None, 0).await,
            Verdict::Admitted
        );
        assert_eq!(
            check_for(l, "r1", "b@example.com", None, reset, 1).await,
            rejected(MIN - 1, Scope::Domain, MIN, 1)
        );
        assert_eq!(
            check(l, "v2", "c@example.com", None, 2).await,
            Verdict::Admitted
        );
    }

    /// A shadow rule is judged over the same log and never rejects: an
    /// admission it would have rejected names it (the one with the longest
    /// wait); the enforced rules alone decide, and set the wait a usage
    /// shows.
    pub(super) async fn a_shadow_rule_never_rejects_and_names_itself<M: Make>(m: M) {
        let shadow = |ms: u64, max: u32| Rule {
            enforce: false,
            ..Rule::new(std::time::Duration::from_millis(ms), max)
        };
        let mut lim = limits(&[(MIN, 5)], &[(MIN, 9)]);
        lim.email.rules.push(shadow(HOUR, 2));
        lim.ip.rules.push(shadow(HOUR, 3));
        let b = m.make("shadow", lim).await;
        let l = &b.ledger;
        for (job, t) in [("j1", 0), ("j2", 1)] {
            let a = admission(l, job, t).await;
            assert_eq!((a.verdict, a.shadow), (Verdict::Admitted, None), "{job}");
        }
        // The mailbox's shadow rule would reject the third (free at 0 + 1 h).
        let a = admission(l, "j3", 2).await;
        assert_eq!(a.verdict, Verdict::Admitted);
        assert_eq!(a.shadow, Some(rule_ref(Scope::Email, HOUR, 2)));
        // The fourth: both shadow rules are full, the mailbox's until 1 h + 1,
        // the client's until 1 h: the longer wait is named.
        let a = admission(l, "j4", 3).await;
        assert_eq!(a.shadow, Some(rule_ref(Scope::Email, HOUR, 2)));
        let a = admission(l, "j5", 4).await;
        assert_eq!(a.verdict, Verdict::Admitted);
        // The sixth in a minute: the enforced rule rejects; no shadow named.
        let a = admission(l, "j6", 5).await;
        assert_eq!(
            (a.verdict, a.shadow),
            (rejected(MIN - 5, Scope::Email, MIN, 5), None)
        );
        let mailbox = email("a@example.com");
        let u = l
            .usage(Subject::Email(&mailbox), None, Clock::At(2 * MIN))
            .await
            .unwrap();
        let per_rule: Vec<(bool, u32, u64)> = (u.rules.iter())
            .map(|r| (r.enforce, r.count, r.retry_after_ms))
            .collect();
        assert_eq!(per_rule, [(true, 0, 0), (false, 5, HOUR - 2 * MIN + 3)]);
        assert_eq!(u.retry_after_ms, 0, "a shadow rule holds nothing up");
    }

    /// An admission says, per scope, what its tightest enforced rule still
    /// allows and when its next slot frees: the fewest remaining, on a tie
    /// the later reset; exact also where a rule's N is larger than what
    /// one read of the log holds (the IP's 18 per hour after 17 sends,
    /// the domain's rules whose every N is above 16). Shadow rules are
    /// never the tightest; a rejection says nothing of it.
    pub(super) async fn an_admission_says_what_is_left_of_each_scope<M: Make>(m: M) {
        let mut lim = limits(&[(MIN, 1), (HOUR, 5)], &[(SEC, 2), (HOUR, 18)]);
        lim.email.rules.push(Rule {
            enforce: false,
            ..Rule::new(std::time::Duration::from_millis(HOUR), 2)
        });
        lim.domain.rules = rules(&[(MIN, 40), (HOUR, 50)]).rules;
        // One client: the domain's rules themselves (their N above 16),
        // not the network's share of them.
        lim.domain.network_share = 1.0;
        let b = m.make("rooms", lim).await;
        let l = &b.ledger;
        let room = |scope, window_ms, max, remaining, reset_ms| {
            Some(Room {
                rule: rule_ref(scope, window_ms, max),
                remaining,
                reset_ms,
            })
        };
        // One mailbox, no client: the minute binds until the hour is as
        // full (the fifth), then the hour, which frees later.
        for (n, t) in [0, 2 * MIN, 4 * MIN, 6 * MIN].into_iter().enumerate() {
            let a = TestJob::new(&format!("e{n}"), "a@example.com", None)
                .admission(l, &Ticket::new(), Clock::At(t))
                .await;
            assert_eq!(a.verdict, Verdict::Admitted);
            assert_eq!(
                a.rooms.get(Scope::Email),
                room(Scope::Email, MIN, 1, 0, MIN)
            );
            assert_eq!(a.rooms.get(Scope::Ip), None);
        }
        let a = TestJob::new("e4", "a@example.com", None)
            .admission(l, &Ticket::new(), Clock::At(8 * MIN))
            .await;
        let email_room = room(Scope::Email, HOUR, 5, 0, HOUR - 8 * MIN);
        assert_eq!(a.rooms.get(Scope::Email), email_room);
        // The domain counted all five, 8 minutes apart at most: its minute
        // rule holds the fifth alone.
        assert_eq!(
            a.rooms.get(Scope::Domain),
            room(Scope::Domain, MIN, 40, 39, MIN)
        );
        let a = TestJob::new("e5", "a@example.com", None)
            .admission(l, &Ticket::new(), Clock::At(9 * MIN))
            .await;
        assert!(matches!(a.verdict, Verdict::Rejected { .. }));
        assert_eq!(a.rooms.iter().count(), 0, "a rejection has no room");

        // One client, many mailboxes of one domain, 600 ms apart.
        let base = 2 * HOUR;
        for i in 0..18u64 {
            let mail = format!("u{i}@farm.example");
            let t = base + 600 * i;
            let a = TestJob::new(&format!("f{i}"), &mail, Some("198.51.100.7"))
                .admission(l, &Ticket::new(), Clock::At(t))
                .await;
            assert_eq!(a.verdict, Verdict::Admitted, "f{i}");
            let n = u32::try_from(i).unwrap();
            let ip = match i {
                0 => room(Scope::Ip, SEC, 2, 1, SEC),
                // 17 before it: more than one read of 16 holds.
                17 => room(Scope::Ip, HOUR, 18, 0, HOUR - 600 * i),
                _ => room(Scope::Ip, SEC, 2, 0, 400),
            };
            assert_eq!(a.rooms.get(Scope::Ip), ip, "f{i}");
            let oldest = if i == 0 { MIN } else { MIN - 600 * i };
            assert_eq!(
                a.rooms.get(Scope::Domain),
                room(Scope::Domain, MIN, 40, 39 - n, oldest),
                "f{i}"
            );
            assert_eq!(
                a.rooms.get(Scope::Email),
                room(Scope::Email, MIN, 1, 0, MIN),
                "f{i}"
            );
        }
    }

    /// An override, added now, for `target`, doing `action`, lasting `ms`
    /// from now (or for good).
    fn ov(target: &str, action: Action, lasts: Option<u64>) -> Override {
        let now = now_ms();
        Override {
            target: Target::parse(target).unwrap(),
            action,
            reason: "test".into(),
            expires_at_ms: lasts.map(|ms| now + ms),
            added_at_ms: now,
        }
    }

    /// A mailbox's allow lifts its own scope's limit (nothing is counted
    /// there); the client's limit still applies (without it, one client
    /// could spend the relay's quota through a QA mailbox); removed, the
    /// mailbox's rules apply again.
    pub(super) async fn a_mailbox_allow_lifts_its_own_limit<M: Make>(m: M) {
        let b = m.make("ov-allow", limits(&[(MIN, 1)], &[(MIN, 2)])).await;
        let l = &b.ledger;
        l.put_overrides(vec![ov("email:qa@example.com", Action::Allow, None)])
            .await;
        let t = now_ms();
        for n in 0..3 {
            let a = TestJob::new(&format!("qa{n}"), "QA@example.com", None)
                .admission(l, &Ticket::new(), Clock::At(t + n))
                .await;
            assert_eq!(
                (a.verdict, a.by_override),
                (Verdict::Admitted, Some("allow"))
            );
        }
        let from = Some("198.51.100.1");
        for n in 0..2 {
            assert_eq!(
                check(l, &format!("c{n}"), "qa@example.com", from, t + 3 + n).await,
                Verdict::Admitted
            );
        }
        assert!(matches!(
            check(l, "c9", "qa@example.com", from, t + 5).await,
            Verdict::Rejected {
                rule: RuleRef {
                    scope: Scope::Ip,
                    ..
                },
                ..
            }
        ));
        let mailbox = email("qa@example.com");
        let u = l
            .usage(Subject::Email(&mailbox), None, Clock::At(t + 7))
            .await
            .unwrap();
        assert!(u.exempt, "{u:?}");
        assert_eq!(u.by_override.as_ref().map(|o| o.kind), Some("allow"));
        l.put_overrides(Vec::new()).await;
        assert_eq!(
            check(l, "qa9", "qa@example.com", None, t + 8).await,
            Verdict::Admitted,
            "nothing was counted while allowed"
        );
        assert!(matches!(
            check(l, "qa10", "qa@example.com", None, t + 9).await,
            Verdict::Rejected { .. }
        ));
    }

    /// An address override narrower than the IP scope's grouping covers
    /// its whole group, whose clients share one log (otherwise a deny of
    /// one IPv6 address is passed from another address of the same /64).
    pub(super) async fn an_address_override_covers_its_clients_group<M: Make>(m: M) {
        let b = m.make("ov-group", limits(&[(MIN, 5)], &[(MIN, 5)])).await;
        let l = &b.ledger;
        l.put_overrides(vec![ov("ip:2001:db8:1:2::1", Action::Deny, Some(HOUR))])
            .await;
        let t = now_ms();
        for (n, from) in [
            "2001:db8:1:2::1",
            "2001:db8:1:2::99",
            "2001:db8:1:2:ffff::5",
        ]
        .into_iter()
        .enumerate()
        {
            let mail = format!("u{n}@example.com");
            assert!(
                matches!(
                    check(l, &format!("g{n}"), &mail, Some(from), t).await,
                    Verdict::Rejected {
                        rule: RuleRef { max: 0, .. },
                        ..
                    }
                ),
                "{from}"
            );
        }
        assert_eq!(
            check(l, "g9", "u9@example.com", Some("2001:db8:1:3::1"), t).await,
            Verdict::Admitted
        );
    }

    /// A network's deny rejects every client in it, with the deny's
    /// remaining lifetime, and counts nothing; a network's allow lifts only
    /// the client limit (the mailbox is still protected).
    pub(super) async fn a_network_deny_rejects_and_an_allow_lifts_only_the_client_limit<M: Make>(
        m: M,
    ) {
        let b = m.make("ov-net", limits(&[(MIN, 1)], &[(MIN, 1)])).await;
        let l = &b.ledger;
        l.put_overrides(vec![
            ov("ip:198.51.100.0/24", Action::Deny, Some(10 * MIN)),
            ov("ip:203.0.113.0/24", Action::Allow, None),
        ])
        .await;
        let t = now_ms();
        let a = TestJob::new("d1", "a@example.com", Some("198.51.100.77"))
            .admission(l, &Ticket::new(), Clock::At(t))
            .await;
        let Verdict::Rejected {
            retry_after_ms,
            rule,
        } = a.verdict
        else {
            panic!("{a:?}");
        };
        assert!(
            retry_after_ms > 9 * MIN && retry_after_ms <= 10 * MIN,
            "{retry_after_ms}"
        );
        assert_eq!(
            (rule.scope, rule.max, rule.window_ms),
            (Scope::Ip, 0, retry_after_ms)
        );
        assert_eq!(a.by_override, Some("deny"));
        // Nothing was counted: the same mailbox from elsewhere is admitted.
        assert_eq!(
            check(l, "d2", "a@example.com", Some("192.0.2.1"), t + 1).await,
            Verdict::Admitted
        );
        // The allowed network: many mailboxes, one client, all admitted...
        for n in 0..3 {
            let mail = format!("u{n}@example.com");
            assert_eq!(
                check(l, &format!("n{n}"), &mail, Some("203.0.113.9"), t + 2 + n).await,
                Verdict::Admitted
            );
        }
        // ...but each mailbox keeps its own limit.
        assert!(matches!(
            check(l, "n9", "u0@example.com", Some("203.0.113.9"), t + 9).await,
            Verdict::Rejected {
                rule: RuleRef {
                    scope: Scope::Email,
                    ..
                },
                ..
            }
        ));
    }

    /// A domain's own rules replace the domain scope's, even where the
    /// configuration has none; an allow of a domain lifts only that scope.
    pub(super) async fn a_domain_override_brings_its_own_rules<M: Make>(m: M) {
        let b = m.make("ov-domain", domain_limits(&[(MIN, 100)])).await;
        let l = &b.ledger;
        let rules = vec![Rule::new(std::time::Duration::from_millis(HOUR), 2)];
        l.put_overrides(vec![
            ov("domain:farm.example", Action::Rules(rules), None),
            ov("domain:big.example", Action::Allow, None),
        ])
        .await;
        let t = now_ms();
        for n in 0..2 {
            let mail = format!("u{n}@x.farm.example");
            let a = TestJob::new(&format!("f{n}"), &mail, None)
                .admission(l, &Ticket::new(), Clock::At(t + n))
                .await;
            assert_eq!(
                (a.verdict, a.by_override),
                (Verdict::Admitted, Some("rules"))
            );
            let room = a.rooms.get(Scope::Domain).expect("the override's room");
            assert_eq!((room.rule.window_ms, room.rule.max), (HOUR, 2));
        }
        assert_eq!(
            check(l, "f9", "u9@farm.example", None, t + 5).await,
            rejected(HOUR - 5, Scope::Domain, HOUR, 2)
        );
        let farm = RegistrableDomain::parse_exact("farm.example").unwrap();
        let u = l
            .usage(Subject::Domain(&farm), None, Clock::At(t + 6))
            .await
            .unwrap();
        assert_eq!(u.rules.len(), 1);
        assert_eq!((u.rules[0].count, u.rules[0].rule.max), (2, 2));
        assert_eq!(u.by_override.as_ref().map(|o| o.kind), Some("rules"));
        assert!(
            u.by_override
                .as_ref()
                .unwrap()
                .target
                .contains("farm.example")
        );
        for n in 0..150 {
            let mail = format!("u{n}@big.example");
            assert_eq!(
                check(l, &format!("b{n}"), &mail, None, t + 10).await,
                Verdict::Admitted
            );
        }
    }

    /// A client network may use its share of a domain's quota
    /// (`limits.domain.network_share`, a fifth by default, rounded up):
    /// the clients of an IPv4 /24 or an IPv6 /48 together. The domain's
    /// own rule still counts every network, so farming is cut there; a
    /// rejection by the share takes no quota; a request without a client
    /// IP is judged by the domain's rule alone; an admission's room is the
    /// tighter of the two; a domain's override rules are shared likewise,
    /// and its allow lifts both.
    pub(super) async fn one_network_uses_its_share_of_a_domain<M: Make>(m: M) {
        let b = m.make("share", domain_limits(&[(MIN, 10)])).await;
        let l = &b.ledger;
        // Two from one /24 (a fifth of 10); the share's room is the tighter.
        for (n, from) in ["198.51.100.7", "198.51.100.200"].into_iter().enumerate() {
            let at = n as u64;
            let a = TestJob::new(&format!("n{n}"), &format!("u{n}@farm.example"), Some(from))
                .admission(l, &Ticket::new(), Clock::At(at))
                .await;
            assert_eq!(a.verdict, Verdict::Admitted, "{from}");
            let room = a
                .rooms
                .get(Scope::Domain)
                .map(|r| (r.rule.max, r.remaining));
            assert_eq!(room, Some((2, 1 - n as u32)), "{from}");
        }
        assert_eq!(
            check(l, "n2", "u2@farm.example", Some("198.51.100.9"), 2).await,
            rejected(MIN - 2, Scope::Domain, MIN, 2)
        );
        // Two /64s of one /48 are one network; another /48 is another.
        for (n, from) in ["2001:db8:1:1::1", "2001:db8:1:2::1"]
            .into_iter()
            .enumerate()
        {
            let mail = format!("v{n}@farm.example");
            assert_eq!(
                check(l, &format!("v{n}"), &mail, Some(from), 3 + n as u64).await,
                Verdict::Admitted
            );
        }
        assert_eq!(
            check(l, "v2", "v2@farm.example", Some("2001:db8:1:3::1"), 5).await,
            rejected(MIN - 2, Scope::Domain, MIN, 2)
        );
        assert_eq!(
            check(l, "v3", "v3@farm.example", Some("2001:db8:2::1"), 6).await,
            Verdict::Admitted
        );
        // The share's rejections took nothing: the domain counted 5.
        let farm = RegistrableDomain::parse_exact("farm.example").unwrap();
        let u = l.usage(Subject::Domain(&farm), None, Clock::At(6)).await;
        assert_eq!(u.unwrap().rules[0].count, 5);
        // Without a client IP the domain's rule alone judges.
        for n in 0..2 {
            let mail = format!("w{n}@farm.example");
            assert_eq!(
                check(l, &format!("w{n}"), &mail, None, 7 + n).await,
                Verdict::Admitted
            );
        }
        // Farming from new networks is cut at the domain's rule.
        for n in 0..3u64 {
            let from = format!("203.0.{}.1", 113 + n);
            let mail = format!("x{n}@farm.example");
            assert_eq!(
                check(l, &format!("x{n}"), &mail, Some(&from), 9 + n).await,
                Verdict::Admitted
            );
        }
        assert_eq!(
            check(l, "x3", "x3@farm.example", Some("192.0.2.1"), 12).await,
            rejected(MIN - 12, Scope::Domain, MIN, 10)
        );
        let u = l.usage(Subject::Domain(&farm), None, Clock::At(12)).await;
        assert_eq!(u.unwrap().rules[0].count, 10);

        // A domain's own rules are shared too (a fifth of 5: 1 per hour);
        // its allow lifts the share with the rule.
        let rules = vec![Rule::new(std::time::Duration::from_millis(HOUR), 5)];
        l.put_overrides(vec![
            ov("domain:ov.example", Action::Rules(rules), None),
            ov("domain:big.example", Action::Allow, None),
        ])
        .await;
        let t = now_ms();
        assert_eq!(
            check(l, "o1", "o1@ov.example", Some("192.0.2.1"), t).await,
            Verdict::Admitted
        );
        assert_eq!(
            check(l, "o2", "o2@ov.example", Some("192.0.2.2"), t + 1).await,
            rejected(HOUR - 1, Scope::Domain, HOUR, 1)
        );
        assert_eq!(
            check(l, "o3", "o3@ov.example", Some("192.0.3.1"), t + 2).await,
            Verdict::Admitted
        );
        for n in 0..20 {
            let mail = format!("b{n}@big.example");
            assert_eq!(
                check(l, &format!("b{n}"), &mail, Some("192.0.2.1"), t + 3).await,
                Verdict::Admitted
            );
        }
    }

    /// Overrides leave owners and trusted networks their room: a purpose
    /// whose own domain rules are none stays out of the domain scope under
    /// a domain's override rules (otherwise an onboarding day's override
    /// puts password resets back under the domain's rule); a network an
    /// override allows may use the whole domain's quota, which still counts
    /// it; support tools read and reset one network's share.
    pub(super) async fn overrides_leave_owners_and_trusted_networks_their_room<M: Make>(m: M) {
        let mut lim = domain_limits(&[(MIN, 10)]);
        lim.purpose.insert(
            "reset_password".into(),
            PurposeLimits {
                email: None,
                ip: None,
                domain: Some(rules(&[])),
                supersede: None,
            },
        );
        let b = m.make("share-ov", lim).await;
        let l = &b.ledger;
        let rules = vec![Rule::new(std::time::Duration::from_millis(HOUR), 5)];
        l.put_overrides(vec![
            ov("domain:onboard.example", Action::Rules(rules), None),
            ov("ip:192.0.2.0/24", Action::Allow, None),
        ])
        .await;
        let t = now_ms();
        // Five sign-ups from five networks fill the override's rule.
        for n in 0..5u64 {
            let from = format!("203.0.{n}.1");
            let mail = format!("u{n}@onboard.example");
            assert_eq!(
                check(l, &format!("n{n}"), &mail, Some(&from), t + n).await,
                Verdict::Admitted
            );
        }
        let from = Some("203.0.9.1");
        assert_eq!(
            check(l, "n5", "u5@onboard.example", from, t + 5).await,
            rejected(HOUR - 5, Scope::Domain, HOUR, 5)
        );
        // A password reset there still passes.
        let reset = Some("reset_password");
        assert_eq!(
            check_for(l, "r1", "boss@onboard.example", from, reset, t + 6).await,
            Verdict::Admitted
        );
        let onboard = RegistrableDomain::parse_exact("onboard.example").unwrap();
        let reset_name = mailgate::domain::Name::parse("purpose", "reset_password").unwrap();
        let u = (l.usage(
            Subject::Domain(&onboard),
            Some(&reset_name),
            Clock::At(t + 6),
        ))
        .await
        .unwrap();
        assert!(u.rules.is_empty(), "{u:?}");
        // A trusted network uses more than its share (a fifth of 10 is 2).
        for n in 0..4u64 {
            let from = format!("192.0.2.{n}");
            let mail = format!("o{n}@trusted.example");
            assert_eq!(
                check(l, &format!("o{n}"), &mail, Some(&from), t + 10 + n).await,
                Verdict::Admitted
            );
        }
        // Another network gets its share.
        for n in 0..2u64 {
            let from = format!("198.51.100.{n}");
            let mail = format!("p{n}@trusted.example");
            assert_eq!(
                check(l, &format!("p{n}"), &mail, Some(&from), t + 14 + n).await,
                Verdict::Admitted
            );
        }
        let other = Some("198.51.100.9");
        assert_eq!(
            check(l, "p2", "p2@trusted.example", other, t + 16).await,
            rejected(MIN - 2, Scope::Domain, MIN, 2)
        );
        // Support staff read and reset that network's share.
        let trusted = RegistrableDomain::parse_exact("trusted.example").unwrap();
        let net = IpKey::parse("198.51.100.9").unwrap();
        let u = (l.usage(Subject::Share(&trusted, &net), None, Clock::At(t + 17)))
            .await
            .unwrap();
        assert!(
            u.key
                .ends_with("domain:trusted.example:net:198.51.100.0/24"),
            "{}",
            u.key
        );
        assert_eq!((u.rules[0].rule.max, u.rules[0].count), (2, 2));
        assert_eq!(u.retry_after_ms, MIN - 3);
        let (_, removed) = l.reset(Subject::Share(&trusted, &net)).await.unwrap();
        assert_eq!(removed, 2);
        assert_eq!(
            check(l, "p3", "p3@trusted.example", other, t + 18).await,
            Verdict::Admitted
        );
    }

    /// A deny for good answers the longest wait there is.
    pub(super) async fn a_deny_for_good_waits_the_longest<M: Make>(m: M) {
        let b = m.make("ov-forever", limits(&[(MIN, 1)], &[])).await;
        let l = &b.ledger;
        l.put_overrides(vec![ov("email:victim@example.com", Action::Deny, None)])
            .await;
        let v = check(l, "v1", "victim@example.com", None, now_ms()).await;
        let year = mailgate::settings::MAX_PERIOD.as_millis() as u64;
        assert_eq!(
            v,
            Verdict::Rejected {
                retry_after_ms: year,
                rule: RuleRef {
                    scope: Scope::Email,
                    window_ms: year,
                    max: 0
                }
            }
        );
    }
}

macro_rules! conformance {
    ($($case:ident,)*) => {
        mod redis {
            use super::*;
            $(
                #[tokio::test]
                async fn $case() {
                    cases::$case(RedisBackend).await;
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
        }
        /// Every case again, on a Redis Cluster of the test's own (one
        /// cluster for all of them: starting one takes seconds): with every
        /// key in one slot, then spread over the shards.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn every_case_on_a_cluster_in_one_slot_and_spread() {
            let _cluster = PrivateCluster::start();
            $(
                cases::$case(ClusterBackend).await;
            )*
            $(
                cases::$case(SpreadBackend).await;
            )*
        }
    };
}

conformance!(
    first_request_then_30s_later,
    sixth_in_an_hour,
    eleventh_in_a_day,
    ip_rejection_uses_no_mailbox_quota,
    mailbox_rejection_uses_no_ip_quota,
    same_millisecond_both_count,
    ipv6_groups_by_64,
    spellings_of_a_mailbox_share_quota,
    no_ip_means_mailbox_only,
    longest_wait_binds,
    disabled_scope_is_not_limited,
    a_clock_that_steps_back_frees_no_quota,
    a_clock_a_moment_behind_its_newest_time_frees_no_quota,
    a_purpose_has_its_own_rules_over_the_shared_log,
    usage_shows_each_rule_and_uses_nothing,
    reset_forgets_a_mailbox,
    the_domain_scope_binds_across_mailboxes_and_clients,
    the_domain_scope_is_all_or_nothing_with_the_others,
    a_purpose_has_its_own_domain_rules,
    a_shadow_rule_never_rejects_and_names_itself,
    an_admission_says_what_is_left_of_each_scope,
    a_mailbox_allow_lifts_its_own_limit,
    an_address_override_covers_its_clients_group,
    a_network_deny_rejects_and_an_allow_lifts_only_the_client_limit,
    a_domain_override_brings_its_own_rules,
    one_network_uses_its_share_of_a_domain,
    overrides_leave_owners_and_trusted_networks_their_room,
    a_deny_for_good_waits_the_longest,
);
