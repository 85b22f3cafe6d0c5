//! Property test: over random sequences of (time step, mailbox, IP, job id,
//! lineage) admissions and the lifecycle steps after them (sending, sent,
//! refund, release), each ledger backend agrees with the plain reference
//! model on every decision, every `retry_after_ms`, every binding rule and
//! every state the ledger reports, also when the clock steps back (by up to
//! a minute behind the newest time, the slack the backends keep). The model
//! judges a domain's client network's share as a key of its own.

use crate::common;

use std::time::Duration;

use crate::common::model::{Model, Scopes};
use crate::common::*;
use mailgate::domain::{Normalization, RegistrableDomain, Ticket};
use mailgate::ledger::{Ending, Ledger, MemoryLedger, RedisLedger, Refund};
use mailgate::limiter::{Clock, Scope};
use mailgate::settings::{DomainRules, LimitSettings, RedisSettings, Rule};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// Mailboxes: the first and third are one mailbox spelled two ways; the
/// first four share a registrable domain (example.com); gmail.com is exempt
/// from the domain scope.
const EMAILS: [&str; 6] = [
    "a@example.com",
    "b@example.com",
    "A+tag@Example.com",
    "c@mail.example.com",
    "d@gmail.com",
    "e@example.org",
];
const IPS: [&str; 3] = ["198.51.100.1", "2001:db8::1", "2001:db8::2"];

#[derive(Debug, Clone)]
enum Op {
    Check {
        dt: u64,
        email: usize,
        ip: Option<usize>,
        /// `None`: a fresh id; `Some(k)`: reuse the k-th id used so far.
        reuse: Option<usize>,
        /// Which of two lineages asks.
        lineage: u32,
        /// The clock steps back by `dt` instead of on (Redis's clock after
        /// an NTP correction), to at most a minute behind the newest time.
        back: bool,
    },
    Refund(usize, u32),
    Sent(usize, u32),
    Release(usize, u32),
}

fn ops(max_step: u64) -> impl Strategy<Value = Vec<Op>> {
    let step = prop_oneof![
        3 => Just(0u64),
        3 => 1..=max_step / 100,
        4 => 1..=max_step,
    ];
    let check = (
        step,
        0..EMAILS.len(),
        proptest::option::of(0..IPS.len()),
        proptest::option::weighted(0.2, 0usize..64),
        0u32..2,
        proptest::bool::weighted(0.1),
    )
        .prop_map(|(dt, email, ip, reuse, lineage, back)| Op::Check {
            dt,
            email,
            ip,
            reuse,
            lineage,
            back,
        });
    let step = || (0usize..64, 0u32..2);
    let op = prop_oneof![
        20 => check,
        1 => step().prop_map(|(k, l)| Op::Refund(k, l)),
        1 => step().prop_map(|(k, l)| Op::Sent(k, l)),
        1 => step().prop_map(|(k, l)| Op::Release(k, l)),
    ];
    proptest::collection::vec(op, 1..80)
}

/// Domain rules, with gmail.com exempt.
fn domain(rules: &[(u64, u32)]) -> DomainRules {
    DomainRules {
        rules: common::rules(rules).rules,
        exempt: vec![RegistrableDomain::parse_exact("gmail.com").unwrap()],
        ..Default::default()
    }
}

/// Small windows, so short sequences fill and drain them; shadow rules
/// (stricter ones, never rejecting) among them.
fn small_limits() -> LimitSettings {
    let mut l = LimitSettings {
        dedup_for: Duration::from_secs(1_000 * 3600),
        send_lease: Duration::from_millis(2_000),
        domain: domain(&[(2_000, 3), (20_000, 7), (20_000, 4)]),
        ..limits(
            &[(1_000, 1), (10_000, 3), (60_000, 5), (30_000, 2)],
            &[(1_000, 2), (5_000, 4), (30_000, 6), (5_000, 2)],
        )
    };
    for rules in [&mut l.email.rules, &mut l.ip.rules, &mut l.domain.rules] {
        if let Some(last) = rules.last_mut() {
            last.enforce = false;
        }
    }
    l
}

/// Larger N: a read of the newest 11 or 12 entries, and a domain rule
/// above the 16 one read fetches at most, so that set reads only its 17th
/// newest entry (the script's second read path).
fn large_n_limits() -> LimitSettings {
    let mut l = LimitSettings {
        dedup_for: Duration::from_secs(1_000 * 3600),
        domain: domain(&[(25_000, 17)]),
        ..limits(&[(500, 2), (20_000, 12)], &[(30_000, 11), (1_000, 3)])
    };
    // A shadow rule of the mailbox scope above the first read.
    let mut shadow = Rule::new(Duration::from_millis(30_000), 17);
    shadow.enforce = false;
    l.email.rules.push(shadow);
    l
}

/// The default policy, and the shipped config's domain rule, stepping
/// through hours.
fn default_limits() -> LimitSettings {
    LimitSettings {
        dedup_for: Duration::from_secs(1_000 * 3600),
        domain: domain(&[(10 * MIN, 50)]),
        ..LimitSettings::default()
    }
}

/// The first decision's time.
const START: u64 = 1_700_000_000_000;

async fn run_case<L: Ledger>(
    l: &L,
    limits: &LimitSettings,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let mut model = Model::new(limits.send_lease.as_millis() as u64);
    // Each domain rule's max cut to one network's share, rounded up; none
    // if that cuts nothing.
    let share = limits.domain.network_share;
    let shared: Vec<Rule> = (limits.domain.rules.iter())
        .map(|r| Rule {
            max: ((f64::from(r.max) * share).ceil() as u32).max(1),
            ..*r
        })
        .collect();
    let shared = (shared != limits.domain.rules).then_some(shared);
    // Each id with the mailbox and client it was first used for.
    let mut jobs: Vec<TestJob> = Vec::new();
    let tickets = [Ticket::new(), Ticket::new()];
    let mut t = START;
    let mut newest = START;
    let norm = Normalization::default();
    let fail = |e: mailgate::ledger::LedgerError| TestCaseError::fail(format!("{e} ({e:?})"));
    for op in ops {
        match *op {
            Op::Check {
                dt,
                email: e,
                ip: i,
                reuse,
                lineage,
                back,
            } => {
                if back {
                    // The backends keep an admission a minute longer than
                    // any window sees it, so a step back of up to a minute
                    // behind the newest time frees nothing; beyond that, by
                    // design, forgotten room may come back.
                    let floor = START.max(newest.saturating_sub(MIN));
                    t = t.saturating_sub(dt).max(floor);
                } else {
                    t += dt;
                    newest = newest.max(t);
                }
                let slot = match reuse.filter(|_| !jobs.is_empty()) {
                    Some(k) => k % jobs.len(),
                    None => jobs.len(),
                };
                let job = TestJob::new(&format!("job-{slot}"), EMAILS[e], i.map(|i| IPS[i]));
                let mut scopes: Scopes<'_> = vec![(
                    Scope::Email,
                    job.email.mailbox_key(&norm),
                    limits.email.rules.as_slice(),
                )];
                if let Some(a) = &job.ip {
                    scopes.push((Scope::Ip, a.network(32, 64), limits.ip.rules.as_slice()));
                }
                let registrable = RegistrableDomain::of(&job.email, &norm);
                if !limits.domain.exempt.contains(&registrable) {
                    let rules = limits.domain.rules.as_slice();
                    scopes.push((Scope::Domain, registrable.to_string(), rules));
                    // The client network's share of the domain's log: a
                    // /24 or a /48 (both IPv6 clients are one network).
                    if let (Some(a), Some(shared)) = (&job.ip, &shared) {
                        let key = format!("{registrable}:net:{}", a.network(24, 48));
                        scopes.push((Scope::Domain, key, shared.as_slice()));
                    }
                }
                let fp = format!("{e}/{i:?}");
                let want = model.admit(job.id.as_str(), &fp, lineage, &scopes, t);
                let admission = (job.admission(l, &tickets[lineage as usize], Clock::At(t))).await;
                let got = admission.verdict;
                prop_assert_eq!(&got, &want, "job {} at t={}", job.id.as_str(), t);
                prop_assert_eq!(admission.decided_at_ms, t);
                prop_assert_eq!(
                    admission.shadow,
                    model.shadow,
                    "shadow of job {} at t={}",
                    job.id.as_str(),
                    t
                );
                let rooms: Vec<_> = (admission.rooms.iter())
                    .map(|r| (r.rule, r.remaining, r.reset_ms))
                    .collect();
                prop_assert_eq!(
                    &rooms,
                    &model.rooms,
                    "rooms of job {} at t={}",
                    job.id.as_str(),
                    t
                );
                // Later steps act on the job as its id's record knows it.
                if slot == jobs.len() {
                    jobs.push(job);
                } else if got == mailgate::ledger::Verdict::Admitted {
                    jobs[slot] = job;
                }
            }
            Op::Sent(k, lineage) if !jobs.is_empty() => {
                let job = &jobs[k % jobs.len()];
                let got = l
                    .settle(&job.by(&tickets[lineage as usize]), &Ending::Sent, true)
                    .await
                    .map_err(fail)?;
                prop_assert_eq!(
                    got,
                    model.sent(job.id.as_str(), lineage),
                    "sent {}",
                    job.id.as_str()
                );
            }
            Op::Refund(k, lineage) if !jobs.is_empty() => {
                let job = &jobs[k % jobs.len()];
                let ending = Ending::Refund(Refund::Failed);
                let got = l
                    .settle(&job.by(&tickets[lineage as usize]), &ending, true)
                    .await
                    .map_err(fail)?;
                let want = model.refund(job.id.as_str(), lineage);
                prop_assert_eq!(got, want, "refund {}", job.id.as_str());
            }
            Op::Release(k, lineage) if !jobs.is_empty() => {
                let job = &jobs[k % jobs.len()];
                let got = l
                    .release(&job.by(&tickets[lineage as usize]))
                    .await
                    .map_err(fail)?;
                let want = model.release(job.id.as_str(), lineage);
                prop_assert_eq!(got, want, "release {}", job.id.as_str());
            }
            _ => {}
        }
    }
    Ok(())
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200)
}

fn runner() -> TestRunner {
    TestRunner::new(Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    })
}

fn redis_agrees(limits: LimitSettings, max_step: u64, name: &str) {
    let cleanup = RedisCleanup {
        prefix: unique_prefix(name),
    };
    agrees(&redis_settings(&cleanup.prefix), limits, max_step);
}

/// Each case on a fresh prefix under `base`'s.
fn agrees(base: &RedisSettings, limits: LimitSettings, max_step: u64) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let n = std::sync::atomic::AtomicU64::new(0);
    runner()
        .run(&ops(max_step), |ops| {
            let case = n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let settings =
                RedisSettings::new(base.url.clone(), format!("{}{case}:", base.key_prefix));
            rt.block_on(async {
                let l = RedisLedger::connect(&settings, &limits)
                    .await
                    .map_err(|e| TestCaseError::fail(format!("{e} ({e:?})")))?;
                run_case(&l, &limits, &ops).await
            })
        })
        .expect("the Redis backend agrees with the model");
}

/// The three policies on one Redis Cluster of the test's own (starting one
/// takes seconds), with every key in one slot, and spread over the shards.
#[test]
fn a_cluster_agrees_with_model() {
    let cluster = PrivateCluster::start();
    let prefix = unique_prefix("prop-cluster");
    for spread in [false, true] {
        for (policy, limits, max_step) in [
            ("small", small_limits(), 3_000),
            ("default", default_limits(), 2 * HOUR),
            ("large-n", large_n_limits(), 1_000),
        ] {
            let base = match spread {
                false => format!("{{{prefix}}}{policy}:"),
                true => format!("{prefix}spread:{policy}:"),
            };
            let base = RedisSettings::new(cluster.url(), base);
            assert_eq!(base.spreads_keys(), spread);
            agrees(&base, limits, max_step);
        }
    }
}

fn memory_agrees(limits: LimitSettings, max_step: u64) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    runner()
        .run(&ops(max_step), |ops| {
            rt.block_on(run_case(&MemoryLedger::new(&limits), &limits, &ops))
        })
        .expect("the in-memory backend agrees with the model");
}

#[test]
fn redis_agrees_with_model_small_windows() {
    redis_agrees(small_limits(), 3_000, "prop-small");
}

#[test]
fn redis_agrees_with_model_default_policy() {
    redis_agrees(default_limits(), 2 * HOUR, "prop-default");
}

#[test]
fn redis_agrees_with_model_large_n() {
    redis_agrees(large_n_limits(), 1_000, "prop-large-n");
}

#[test]
fn memory_agrees_with_model_large_n() {
    memory_agrees(large_n_limits(), 1_000);
}

#[test]
fn memory_agrees_with_model_small_windows() {
    memory_agrees(small_limits(), 3_000);
}

#[test]
fn memory_agrees_with_model_default_policy() {
    memory_agrees(default_limits(), 2 * HOUR);
}
