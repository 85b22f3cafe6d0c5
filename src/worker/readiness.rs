//! What `/readyz` and the gauges say of RabbitMQ, Redis, SMTP and the
//! jobs waiting, once the worker runs.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::Worker;
use crate::broker::Broker;
use crate::ledger::Ledger;
use crate::redact::redact_url;
use crate::telemetry;

/// How often the dependency and backlog gauges are refreshed.
const GAUGES_EVERY: Duration = Duration::from_secs(15);

/// How long an SMTP readiness result is reused.
pub(super) const SMTP_CHECK_TTL: Duration = Duration::from_secs(10);

/// A readiness check's last result, reused for `ttl`. Concurrent probes
/// wait for the one check in progress instead of each running their own.
pub(super) struct Checked {
    ttl: Duration,
    last: tokio::sync::Mutex<Option<(Instant, Result<(), String>)>>,
}

impl Checked {
    pub(super) fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            last: tokio::sync::Mutex::new(None),
        }
    }

    /// The last result if it is fresh, else `check`'s.
    async fn get(&self, check: impl Future<Output = Result<(), String>>) -> Result<(), String> {
        let mut last = self.last.lock().await;
        match &*last {
            Some((at, r)) if at.elapsed() < self.ttl => r.clone(),
            _ => {
                let r = check.await;
                *last = Some((Instant::now(), r.clone()));
                r
            }
        }
    }
}

impl<L: Ledger + 'static> Worker<L> {
    /// Keeps the gauges of what `/readyz` checks and of the jobs waiting
    /// fresh for dashboards and alerts, whether or not anything asks
    /// `/readyz`. Runs until aborted.
    pub(super) async fn refresh_gauges(self: Arc<Self>) {
        let mut every = tokio::time::interval(GAUGES_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            self.refresh_dependency_gauges().await;
            let broker = self
                .broker
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone();
            if let Some(broker) = broker {
                match broker.jobs_waiting().await {
                    Ok(n) => telemetry::jobs_waiting(n),
                    Err(e) => {
                        tracing::debug!(error = %crate::report::one_line(&e), "cannot read the jobs queue's length");
                    }
                }
            }
        }
    }

    /// RabbitMQ as readiness sees it, without I/O: connected and consuming,
    /// and not blocked by an alarm.
    fn amqp_state(&self) -> Result<(), String> {
        let blocked = self
            .broker
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .is_some_and(Broker::blocked);
        if !self.amqp_up.load(Ordering::Relaxed) {
            let url = redact_url(&self.settings.amqp.url);
            let why = self
                .amqp_why
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone();
            Err(match why {
                Some(why) => format!("RabbitMQ at {url} is not answering ({why}); reconnecting"),
                None => format!("connecting to RabbitMQ at {url}"),
            })
        } else if blocked {
            Err(
                "blocked by RabbitMQ (a memory or disk alarm): no result can be published \
                 until it clears"
                    .to_owned(),
            )
        } else {
            Ok(())
        }
    }

    /// Redis as readiness sees it: as `watch_redis` last found it.
    fn redis_state(&self) -> Result<(), String> {
        match self.redis_hold.borrow().clone() {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }

    /// Refreshes the gauges of what readiness checks, for dashboards and
    /// alerts: SMTP as the sends and the circuits see it, without opening
    /// a connection (a probe every few seconds from every worker would
    /// load the relay; `/readyz` itself still opens one).
    pub(super) async fn refresh_dependency_gauges(&self) {
        telemetry::dependency_up("rabbitmq", self.amqp_state().is_ok());
        telemetry::dependency_up("redis", self.redis_state().is_ok());
        let relay = self.pipeline.mailer().relay_health();
        telemetry::dependency_up("smtp", relay.is_ok());
    }
}

impl<L: Ledger + 'static> crate::http::Readiness for Worker<L> {
    async fn check(&self) -> Vec<(&'static str, Result<(), String>)> {
        let amqp = self.amqp_state();
        let redis = self.redis_state();
        // The relay's health as the sends see it, at once; otherwise a probe
        // connection, at most every few seconds.
        let relay = self.pipeline.mailer().relay_health();
        let smtp = if relay.is_err() {
            relay
        } else {
            let mailer = self.pipeline.mailer();
            self.smtp_checked
                .get(async { mailer.check().await.map_err(|e| e.to_string()) })
                .await
        };
        let checks = vec![("rabbitmq", amqp), ("redis", redis), ("smtp", smtp)];
        for (dependency, r) in &checks {
            telemetry::dependency_up(dependency, r.is_ok());
        }
        checks
    }
}
