//! Property test: over random sequences of (time step, mailbox, IP, job id,
//! refund), each backend agrees with the plain reference model on every
//! decision, every `retry_after_ms` and every binding rule.

mod common;

use std::time::Duration;

use common::model::{Model, Scopes};
use common::*;
use mailgate::domain::Normalization;
use mailgate::limiter::{Clock, MemoryLimiter, RateLimiter, RedisLimiter, Request, Scope};
use mailgate::settings::LimitSettings;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// Mailboxes: the first and last are one mailbox spelled two ways.
const EMAILS: [&str; 3] = ["a@example.com", "b@example.com", "A+tag@Example.com"];
const IPS: [&str; 3] = ["198.51.100.1", "2001:db8::1", "2001:db8::2"];

#[derive(Debug, Clone)]
enum Op {
    Check {
        dt: u64,
        email: usize,
        ip: Option<usize>,
        /// `None`: a fresh id; `Some(k)`: reuse the k-th id used so far.
        reuse: Option<usize>,
    },
    Refund(usize),
    MarkSent(usize),
    Release(usize),
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
        proptest::option::weighted(0.1, 0usize..64),
    )
        .prop_map(|(dt, email, ip, reuse)| Op::Check {
            dt,
            email,
            ip,
            reuse,
        });
    let op = prop_oneof![
        20 => check,
        1 => (0usize..64).prop_map(Op::Refund),
        1 => (0usize..64).prop_map(Op::MarkSent),
        1 => (0usize..64).prop_map(Op::Release),
    ];
    proptest::collection::vec(op, 1..80)
}

/// Small windows, so short sequences fill and drain them.
fn small_limits() -> LimitSettings {
    LimitSettings {
        dedup_for: Some(Duration::from_secs(1_000 * 3600)),
        send_lease: Duration::from_millis(2_000),
        ..limits(
            &[(1_000, 1), (10_000, 3), (60_000, 5)],
            &[(1_000, 2), (5_000, 4), (30_000, 6)],
        )
    }
}

/// Rules with N above what one read fetches (10), so the script's second
/// read path is exercised too.
fn large_n_limits() -> LimitSettings {
    LimitSettings {
        dedup_for: Some(Duration::from_secs(1_000 * 3600)),
        ..limits(&[(500, 2), (20_000, 12)], &[(30_000, 11), (1_000, 3)])
    }
}

/// The default policy, stepping through hours.
fn default_limits() -> LimitSettings {
    LimitSettings {
        dedup_for: Some(Duration::from_secs(1_000 * 3600)),
        ..LimitSettings::default()
    }
}

async fn run_case<L: RateLimiter>(
    l: &L,
    limits: &LimitSettings,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let mut model = Model::new(limits.send_lease.as_millis() as u64);
    let mut ids: Vec<String> = Vec::new();
    let mut t = 1_700_000_000_000u64;
    let norm = Normalization::default();
    for op in ops {
        match *op {
            Op::Check {
                dt,
                email: e,
                ip: i,
                reuse,
            } => {
                t += dt;
                let job = match reuse.filter(|_| !ids.is_empty()) {
                    Some(k) => ids[k % ids.len()].clone(),
                    None => {
                        ids.push(format!("job-{}", ids.len()));
                        ids.last().cloned().unwrap_or_default()
                    }
                };
                let (jid, mail) = (id(&job), email(EMAILS[e]));
                let addr = i.map(|i| ip(IPS[i]));
                let mut scopes: Scopes<'_> = vec![(
                    Scope::Email,
                    mail.mailbox_key(&norm),
                    limits.email.rules.as_slice(),
                )];
                if let Some(a) = &addr {
                    scopes.push((Scope::Ip, a.network(32, 64), limits.ip.rules.as_slice()));
                }
                let want = model.check(&job, &scopes, t);
                let req = Request {
                    id: &jid,
                    email: &mail,
                    ip: addr.as_ref(),
                    purpose: None,
                };
                let got = l
                    .check(&req, Clock::At(t))
                    .await
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(got.decided_at_ms, t);
                prop_assert_eq!(got.verdict, want, "job {} at t={}", job, t);
            }
            Op::Refund(k) if !ids.is_empty() => {
                let job = &ids[k % ids.len()];
                let got = l
                    .refund(&id(job))
                    .await
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(got, model.refund(job), "refund {}", job);
            }
            Op::MarkSent(k) if !ids.is_empty() => {
                let job = &ids[k % ids.len()];
                let got = l
                    .mark_sent(&id(job))
                    .await
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(got, model.mark_sent(job), "mark_sent {}", job);
            }
            Op::Release(k) if !ids.is_empty() => {
                let job = &ids[k % ids.len()];
                let got = l
                    .release(&id(job))
                    .await
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(got, model.release(job), "release {}", job);
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
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let cleanup = RedisCleanup {
        prefix: unique_prefix(name),
    };
    let n = std::sync::atomic::AtomicU64::new(0);
    runner()
        .run(&ops(max_step), |ops| {
            let case = n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let prefix = format!("{}{case}:", cleanup.prefix);
            rt.block_on(async {
                let l = RedisLimiter::connect(&redis_settings(&prefix), &limits)
                    .await
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                run_case(&l, &limits, &ops).await
            })
        })
        .expect("the Redis backend agrees with the model");
}

fn memory_agrees(limits: LimitSettings, max_step: u64) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    runner()
        .run(&ops(max_step), |ops| {
            rt.block_on(run_case(&MemoryLimiter::new(&limits), &limits, &ops))
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
