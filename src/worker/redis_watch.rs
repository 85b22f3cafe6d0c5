//! Watching Redis: the consume loop is held back while Redis cannot be
//! used or its clock cannot be trusted, so no job spends an attempt on an
//! outage; `/readyz` says why.

use std::sync::Arc;
use std::time::Duration;

use super::Worker;
use crate::ledger::clock::{Pace, Readings, Verdict, canary_ms};
use crate::ledger::{Ledger, LedgerError};
use crate::redact::redact_url;
use crate::telemetry;

/// How often Redis is checked and its clocks read (see
/// `Worker::watch_redis`): an outage or a step of its clock holds the
/// worker back this long after it at the latest.
const REDIS_EVERY: Duration = Duration::from_secs(1);

impl<L: Ledger + 'static> Worker<L> {
    /// Checks Redis every [`REDIS_EVERY`] as readiness does
    /// ([`Ledger::health`]: it answers, takes the script's writes, keeps
    /// its keys, has its replicas) and reads its clocks (`ledger::clock`);
    /// holds the consume loop back while Redis cannot be used or its clock
    /// cannot be trusted, so no job spends an attempt on an outage. Runs
    /// until aborted, or returns at once for a store without a clock of its
    /// own (in memory).
    pub(super) async fn watch_redis(self: Arc<Self>) {
        let ledger = self.pipeline.ledger();
        let mut pace = Pace::default();
        let mut every = tokio::time::interval(REDIS_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut was: Option<&'static str> = None;
        let url = redact_url(&self.settings.redis.url);
        loop {
            every.tick().await;
            let unusable = |e: LedgerError| {
                let e = crate::report::one_line(&e);
                let why = format!(
                    "Redis at {url} cannot be used ({e}); no job is taken until it can, so none \
                     spends an attempt on the outage"
                );
                Some(("unusable", why))
            };
            let held = match ledger.health().await {
                Err(e) => unusable(e),
                Ok(()) => match ledger.clocks().await {
                    Ok(None) => return,
                    Err(e) => unusable(e),
                    Ok(Some(readings)) => self.judge_clock(&mut pace, &readings).await,
                },
            };
            // Logged when it changes kind, not as a skew moves.
            let kind = held.as_ref().map(|(kind, _)| *kind);
            if kind != was {
                match &held {
                    None => tracing::info!("Redis can be used again; taking jobs"),
                    Some((_, why)) => tracing::warn!("taking no jobs: {why}"),
                }
            }
            was = kind;
            let hold = held.map(|(_, why)| why);
            self.redis_hold.send_if_modified(|h| {
                let changed = *h != hold;
                *h = hold;
                changed
            });
        }
    }

    /// What Redis's clocks say (see `ledger::clock`): `None` while they
    /// can be trusted, else the kind of hold and why. Refreshes the canary
    /// while this worker's clock agrees with every primary's.
    async fn judge_clock(
        &self,
        pace: &mut Pace,
        readings: &Readings,
    ) -> Option<(&'static str, String)> {
        let ledger = self.pipeline.ledger();
        telemetry::redis_clock_skew(readings.worst_skew_ms());
        let max_skew = self.settings.redis.max_clock_skew;
        let max_skew = u64::try_from(max_skew.as_millis()).unwrap_or(u64::MAX);
        let agrees = readings.skewed(max_skew).is_none();
        let stepped = pace.observe(readings, canary_ms(max_skew));
        if let Some(ahead) = stepped {
            tracing::error!(
                ahead_ms = ahead,
                "Redis's clock ran ahead of this host's boot clock by more than the slack"
            );
        }
        let mark = match ledger.watch_clock(agrees, stepped).await {
            Ok(mark) => mark,
            Err(e) => {
                let why = format!(
                    "cannot look after Redis's clock ({})",
                    crate::report::one_line(&e)
                );
                return Some(("unusable", why));
            }
        };
        match Verdict::of(readings, mark, max_skew) {
            Verdict::Agrees => None,
            v @ Verdict::Skewed(_) => Some(("skewed", v.to_string())),
            v @ Verdict::Marked(_) => Some(("marked", v.to_string())),
        }
    }
}
