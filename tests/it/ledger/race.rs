//! Property test: admissions asked at once, by two workers (two Redis
//! ledgers on one prefix), some while no SMTP connection is free (a look
//! first), never let a job past a limit and never reject one that had
//! room: each round's admitted jobs, replayed one by one into the memory
//! ledger at the same instant, are admitted there too (the set fits every
//! rule), and each rejected job is then rejected there, with a wait no
//! shorter than the one it got (within a round every request is at one
//! instant, so room only shrinks and a wait only grows as jobs are
//! admitted: a job rejected in the race was rejected by a state the
//! round's end contains). A look that rejects is followed by an
//! admission that rejects.

use std::sync::Arc;

use crate::common::*;
use mailgate::domain::Ticket;
use mailgate::ledger::{Entry, Ledger, MemoryLedger, RedisLedger, Verdict};
use mailgate::limiter::Clock;
use mailgate::settings::LimitSettings;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

const MAILBOXES: [&str; 4] = [
    "a@example.com",
    "b@example.com",
    "c@example.org",
    "d@example.org",
];
const NETWORKS: [&str; 3] = ["198.51.100.1", "198.51.100.2", "2001:db8::1"];

/// One request: its mailbox, its network, whether it looks first.
type Ask = (usize, usize, bool);

/// Rounds of requests asked at once, each round `dt` ms after the last.
fn rounds() -> impl Strategy<Value = Vec<(u64, Vec<Ask>)>> {
    let ask = (0..MAILBOXES.len(), 0..NETWORKS.len(), proptest::bool::ANY);
    let round = (
        prop_oneof![Just(0u64), 1..=2_000u64, 1..=120_000u64],
        proptest::collection::vec(ask, 1..24),
    );
    proptest::collection::vec(round, 1..6)
}

fn limits_for_race() -> LimitSettings {
    limits(&[(60_000, 2), (3_600_000, 4)], &[(60_000, 5), (600_000, 7)])
}

async fn run_case(
    workers: &[Arc<RedisLedger>; 2],
    serial: &MemoryLedger,
    rounds: &[(u64, Vec<Ask>)],
) -> Result<(), TestCaseError> {
    let mut t = 1_790_000_000_000u64;
    let mut n = 0;
    for (dt, asks) in rounds {
        t += dt;
        let jobs: Vec<(TestJob, bool)> = (asks.iter())
            .map(|&(m, ip, look)| {
                n += 1;
                (
                    TestJob::new(&format!("j{n}"), MAILBOXES[m], Some(NETWORKS[ip])),
                    look,
                )
            })
            .collect();
        let mut tasks = tokio::task::JoinSet::new();
        for (i, (job, look)) in jobs.iter().cloned().enumerate() {
            let l = workers[i % 2].clone();
            tasks.spawn(async move {
                let ticket = Ticket::new();
                let entry = Entry {
                    job: job.by(&ticket),
                    expires_at_ms: None,
                    made_at_ms: None,
                };
                let looked = match look {
                    true => l
                        .peek(&entry, Clock::At(t))
                        .await
                        .map_err(|e| e.to_string())?,
                    false => None,
                };
                let admitted = l
                    .admit(&entry, Clock::At(t))
                    .await
                    .map_err(|e| e.to_string())?;
                Ok::<_, String>((i, looked.map(|a| a.verdict), admitted.verdict))
            });
        }
        let mut got = vec![None; jobs.len()];
        while let Some(done) = tasks.join_next().await {
            let (i, looked, verdict) = done
                .map_err(|e| TestCaseError::fail(e.to_string()))?
                .map_err(TestCaseError::fail)?;
            // A look is of an earlier point of the race: a rejection it
            // answers stands (room only shrinks within a round).
            if let Some(v) = looked {
                prop_assert!(
                    matches!(v, Verdict::Rejected { .. }),
                    "a look answered {v:?}"
                );
                prop_assert!(
                    matches!(verdict, Verdict::Rejected { .. }),
                    "a look rejected, its admission answered {verdict:?}"
                );
            }
            got[i] = Some(verdict);
        }
        // The admitted, then the rejected, one by one, at the same instant.
        let (admitted, rejected): (Vec<_>, Vec<_>) =
            (jobs.iter().zip(&got)).partition(|(_, v)| **v == Some(Verdict::Admitted));
        for ((job, _), _) in &admitted {
            let v = job.admit(serial, &Ticket::new(), Clock::At(t)).await;
            prop_assert_eq!(
                v,
                Verdict::Admitted,
                "{} admitted in the race",
                job.id.as_str()
            );
        }
        for ((job, _), raced) in &rejected {
            let v = job.admit(serial, &Ticket::new(), Clock::At(t)).await;
            let (
                Verdict::Rejected {
                    retry_after_ms: end,
                    ..
                },
                Some(Verdict::Rejected {
                    retry_after_ms: got,
                    ..
                }),
            ) = (v, raced)
            else {
                return Err(TestCaseError::fail(format!(
                    "{}: {raced:?} in the race, {v:?} at the round's end",
                    job.id.as_str()
                )));
            };
            prop_assert!(
                0 < *got && *got <= end,
                "{}: waits {got} in the race, {end} at the end",
                job.id.as_str()
            );
        }
    }
    Ok(())
}

#[test]
fn admissions_at_once_by_two_workers_come_to_one_serial_order() {
    let cleanup = RedisCleanup {
        prefix: unique_prefix("race-prop"),
    };
    let limits = limits_for_race();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let n = std::sync::atomic::AtomicU64::new(0);
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(48);
    TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    })
    .run(&rounds(), |rounds| {
        let case = n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let settings = redis_settings(&format!("{}{case}:", cleanup.prefix));
        rt.block_on(async {
            let connect = || RedisLedger::connect(&settings, &limits);
            let (a, b) = tokio::try_join!(connect(), connect())
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let serial = MemoryLedger::new(&limits);
            run_case(&[Arc::new(a), Arc::new(b)], &serial, &rounds).await
        })
    })
    .expect("the race comes to a serial order");
}
