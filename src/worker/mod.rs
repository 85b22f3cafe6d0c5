//! The consume loop: jobs in, [`Pipeline`] actions out, with reconnection
//! and graceful shutdown.
//!
//! Up to `prefetch` jobs are processed at once (RabbitMQ delivers no more
//! unacknowledged ones). If the connection to RabbitMQ drops, the worker
//! reconnects with backoff and resumes; jobs that were unacknowledged come
//! back from RabbitMQ and are de-duplicated by id. When `shutdown` completes,
//! no SMTP transaction begins any more ([`Stopping`]): the worker stops
//! consuming, hands every job whose transaction had not begun back to
//! RabbitMQ at once (its lease released, so the next worker sends it at
//! once), lets the transactions under way finish for up to
//! `worker.shutdown_timeout`, hands back what is left then, and returns.
//!
//! Layout: `start` builds the stages from the settings ([`build`]);
//! `endpoint` serves `/metrics`, `/healthz` and `/readyz` from the start;
//! this module holds the [`Worker`] and its consume loop; `job` takes one
//! job through the pipeline; `reconnect` reaches RabbitMQ and Redis again;
//! `redis_watch` holds the loop back while Redis cannot be used;
//! `readiness` says what `/readyz` and the gauges report; `shutdown`
//! stops.

mod endpoint;
mod job;
mod readiness;
mod reconnect;
mod redis_watch;
mod shutdown;
mod start;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use backon::BackoffBuilder;
use futures_lite::StreamExt;
use tokio::task::JoinSet;

use self::endpoint::Endpoint;
use self::readiness::{Checked, SMTP_CHECK_TTL};
use self::reconnect::{after_loss, closed, lost, reconnect_backoff};
pub use self::start::build;
use crate::broker::{Broker, Consumers, Incoming};
use crate::ledger::Ledger;
use crate::pipeline::{Pipeline, Stopping};
use crate::settings::Settings;

/// How often a worker that RabbitMQ blocks looks whether it still does.
const BLOCKED_EVERY: Duration = Duration::from_millis(200);

/// Everything a running worker shares between its jobs.
pub struct Worker<L> {
    pipeline: Pipeline<L>,
    settings: Settings,
    /// Whether the worker is connected to RabbitMQ and consuming.
    amqp_up: AtomicBool,
    /// Why the last attempt to reach RabbitMQ failed, for readiness.
    amqp_why: std::sync::Mutex<Option<String>>,
    /// The connection in use, for readiness (is RabbitMQ blocking it?).
    broker: std::sync::Mutex<Option<Broker>>,
    /// The last SMTP check, reused for a few seconds so `/readyz` does not
    /// open a connection per probe.
    smtp_checked: Checked,
    /// Why no job is taken because of Redis (it cannot be used, or its
    /// clock cannot be trusted), or `None` while it can; kept by
    /// `Worker::watch_redis`, and what `/readyz` says of Redis, so a flood
    /// of `/readyz` cannot load Redis.
    redis_hold: tokio::sync::watch::Sender<Option<String>>,
    /// Set when `shutdown` completes: no SMTP transaction begins after it
    /// (shared with the pipeline).
    stopping: Stopping,
    /// When stopping, whether RabbitMQ confirmed that this worker's
    /// consumers are cancelled (`None` until it is known): only then can a
    /// job be handed back without RabbitMQ handing it straight back to this
    /// worker (each return counts towards a quorum queue's delivery limit,
    /// and twice moves a job to the one-at-a-time lane). Unconfirmed,
    /// jobs stay unacknowledged and closing the connection returns them.
    cancelled: tokio::sync::watch::Sender<Option<bool>>,
    /// The HTTP endpoint, served from the start of [`build`]; taken and
    /// stopped when the worker stops.
    http: std::sync::Mutex<Option<Endpoint<L>>>,
    http_addr: std::net::SocketAddr,
}

/// Names the type only: it holds connections and the stages.
impl<L> std::fmt::Debug for Worker<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker").finish_non_exhaustive()
    }
}

/// Why the worker stopped taking jobs from a connection.
enum Stop {
    /// `shutdown` completed.
    Requested,
    /// The connection or channel to RabbitMQ is gone.
    Lost,
}

impl<L: Ledger + 'static> Worker<L> {
    /// A worker for `pipeline`, not yet connected to RabbitMQ, its HTTP
    /// endpoint already serving; `stopping` is the pipeline's.
    fn new(
        settings: &Settings,
        pipeline: Pipeline<L>,
        stopping: Stopping,
        endpoint: Endpoint<L>,
    ) -> Self {
        Self {
            pipeline,
            stopping,
            cancelled: tokio::sync::watch::Sender::new(None),
            settings: settings.clone(),
            amqp_up: AtomicBool::new(false),
            amqp_why: std::sync::Mutex::new(None),
            broker: std::sync::Mutex::new(None),
            smtp_checked: Checked::new(SMTP_CHECK_TTL),
            redis_hold: tokio::sync::watch::Sender::new(None),
            http_addr: endpoint.addr,
            http: std::sync::Mutex::new(Some(endpoint)),
        }
    }

    /// Where `/metrics`, `/healthz` and `/readyz` are served.
    pub fn http_addr(&self) -> std::net::SocketAddr {
        self.http_addr
    }

    /// Runs until `shutdown` completes; see the module docs.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
        let this = Arc::new(self);
        let endpoint = this
            .http
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(e) = &endpoint {
            e.hand_over(this.clone());
        }
        // Once before anything consumes, so the gauges are on /metrics
        // from the start; then every GAUGES_EVERY.
        this.refresh_dependency_gauges().await;
        let gauges = tokio::spawn(this.clone().refresh_gauges());
        let redis = tokio::spawn(this.clone().watch_redis());
        let result = this.clone().consume(shutdown).await;
        gauges.abort();
        redis.abort();
        if let Some(e) = endpoint {
            e.stop().await;
        }
        result
    }

    /// Consumes until `shutdown` completes: connects, takes jobs until the
    /// connection is lost (then waits, and connects again) or `shutdown`
    /// completes, and stops.
    async fn consume(self: Arc<Self>, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
        let this = self;
        let tag = format!("mailgate-{}-{}", hostname(), std::process::id());
        let mut tasks: JoinSet<()> = JoinSet::new();
        tokio::pin!(shutdown);
        // After a lost connection or channel, wait before connecting again,
        // longer each time, so a fault that recurs cannot spin.
        let mut losses = reconnect_backoff().build();
        let mut started = false;
        loop {
            let broker = tokio::select! {
                b = this.connect(started) => b.context("connecting to rabbitmq")?,
                () = &mut shutdown => break,
            };
            started = true;
            let mut consumers = match broker.consume(&tag).await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %crate::report::one_line(&e), "cannot consume; reconnecting");
                    continue;
                }
            };
            tracing::info!(queue = %broker.topology().jobs, "consuming");
            this.consuming(&broker);
            let up_since = Instant::now();
            let stop =
                (this.take_jobs(&broker, &mut consumers, &mut tasks, shutdown.as_mut())).await;
            this.amqp_up.store(false, Ordering::Relaxed);
            crate::telemetry::dependency_up("rabbitmq", false);
            this.set_broker(None);
            match stop {
                // In-flight jobs of the lost connection finish on their own;
                // their acks fail and RabbitMQ redelivers them.
                Stop::Lost => {
                    let wait = after_loss(&mut losses, up_since);
                    tokio::select! {
                        () = tokio::time::sleep(wait) => continue,
                        () = &mut shutdown => break,
                    }
                }
                Stop::Requested => {
                    this.stop(&broker, &tag, &mut tasks, &mut consumers).await;
                    return Ok(());
                }
            }
        }
        this.stop_unconnected(&mut tasks).await;
        Ok(())
    }

    /// Takes jobs from `consumers`, each in a task of its own in `tasks`,
    /// until `shutdown` completes or the connection is lost.
    async fn take_jobs(
        self: &Arc<Self>,
        broker: &Broker,
        consumers: &mut Consumers,
        tasks: &mut JoinSet<()>,
        mut shutdown: Pin<&mut impl Future<Output = ()>>,
    ) -> Stop {
        let mailer = self.pipeline.mailer();
        let mut redis = self.redis_hold.subscribe();
        loop {
            // While every SMTP relay's circuit is open no job is taken
            // (they wait in RabbitMQ, or unacknowledged in this
            // consumer's prefetch): taking them would only burn their
            // attempts. A probe that closes a circuit resumes. Nor while
            // Redis cannot be used or its clock trusted (`watch_redis`).
            // Nor while RabbitMQ blocks publishing (an alarm): no
            // result could go out. Looked at again every
            // `BLOCKED_EVERY` (lapin does not announce the unblock).
            let can_send = mailer.can_send();
            let blocked = broker.blocked();
            let can_take = can_send && !blocked && redis.borrow_and_update().is_none();
            tokio::select! {
                () = &mut shutdown => break Stop::Requested,
                () = mailer.until_can_send(), if !can_send => {}
                () = tokio::time::sleep(BLOCKED_EVERY), if blocked => {}
                // The sender lives as long as the worker.
                _ = redis.changed() => {}
                next = consumers.jobs.next(), if can_take => match next {
                    Some(Ok(delivery)) => {
                        // Finished tasks are reaped here, not as each
                        // finishes: waiting on the set would wake this
                        // loop once more per job.
                        while tasks.try_join_next().is_some() {}
                        let (this, broker) = (self.clone(), broker.clone());
                        tasks.spawn(async move { this.take(&broker, Incoming::new(delivery)).await });
                    }
                    Some(Err(e)) => break lost(&e),
                    None => break closed(),
                },
                next = consumers.redelivered.next(), if can_take => match next {
                    Some(Ok(delivery)) => {
                        while tasks.try_join_next().is_some() {}
                        let (this, broker) = (self.clone(), broker.clone());
                        tasks.spawn(async move { this.process(&broker, Incoming::new(delivery)).await });
                    }
                    Some(Err(e)) => break lost(&e),
                    None => break closed(),
                },
            }
        }
    }

    /// Marks the worker connected to `broker` and consuming, for readiness.
    fn consuming(&self, broker: &Broker) {
        self.amqp_up.store(true, Ordering::Relaxed);
        // At once, not at the gauges' next refresh: a start or a reconnect
        // would read as RabbitMQ down for up to 15 s.
        crate::telemetry::dependency_up("rabbitmq", true);
        *self
            .amqp_why
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        self.set_broker(Some(broker.clone()));
    }

    fn set_broker(&self, broker: Option<Broker>) {
        // Nothing panics while holding it; a poisoned lock still holds a value.
        *self
            .broker
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = broker;
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/etc/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "worker".to_owned())
}
