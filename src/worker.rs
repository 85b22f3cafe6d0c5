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

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use backon::{BackoffBuilder, ExponentialBuilder, Retryable};
use futures_lite::{FutureExt as _, StreamExt};
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::broker::{Broker, BrokerError, DELIVERY_LIMIT, Incoming};
use crate::domain::{Ticket, now_ms};
use crate::ledger::clock::{Pace, Readings, Verdict, canary_ms};
use crate::ledger::{Backend, Ledger, LedgerError};
use crate::mailer::Mailer;
use crate::pipeline::{Action, Message, Outbox, Pipeline, Stopping, Unpublished, Waiting};
use crate::settings::{Settings, redact_url};
use crate::telemetry;
use crate::templates::Templates;
use crate::wire::{JobResult, Status};

/// How many times `J` must have handed a message out before without its
/// being settled for a worker to move it to `J.redelivered` (see
/// `Worker::take`): a job that kills its workers gets there on its second
/// victim, the jobs beside it only if they were beside it twice.
const ISOLATE_FROM: u32 = 2;

/// How often the dependency and backlog gauges are refreshed.
const GAUGES_EVERY: Duration = Duration::from_secs(15);

/// How often Redis is checked and its clocks read (see
/// `Worker::watch_redis`): an outage or a step of its clock holds the
/// worker back this long after it at the latest.
const REDIS_EVERY: Duration = Duration::from_secs(1);

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

/// The HTTP endpoint, served from the start of [`build`], so `/healthz`
/// answers (and `/readyz` says "starting") while the worker still loads its
/// templates and connects to Redis, however long that takes. Dropping it
/// stops it.
struct Endpoint<L> {
    starting: Arc<Starting<L>>,
    stop: Arc<tokio::sync::Notify>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl<L: Ledger + 'static> Endpoint<L> {
    fn serve(listener: tokio::net::TcpListener) -> Self {
        let starting = Arc::new(Starting {
            worker: std::sync::OnceLock::new(),
            status: std::sync::Mutex::new(("worker", "loading templates".to_owned())),
        });
        let stop = Arc::new(tokio::sync::Notify::new());
        let (ready, stopped) = (starting.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let stopped = async move { stopped.notified().await };
            if let Err(e) = crate::http::serve(listener, ready, stopped).await {
                tracing::warn!(error = %e, "the HTTP endpoint stopped");
            }
        });
        Self {
            starting,
            stop,
            task: Some(task),
        }
    }

    /// Stops serving and waits until every connection is closed.
    async fn stop(mut self) {
        self.stop.notify_one();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl<L> Drop for Endpoint<L> {
    fn drop(&mut self) {
        // A build that failed or was cancelled: stop serving.
        self.stop.notify_one();
    }
}

/// Readiness before and after the worker runs.
struct Starting<L> {
    worker: std::sync::OnceLock<Arc<Worker<L>>>,
    /// What start-up waits on: the dependency (or "worker") and why, as
    /// `/readyz` says it until the worker runs.
    status: std::sync::Mutex<(&'static str, String)>,
}

impl<L> Starting<L> {
    fn set(&self, what: &'static str, why: String) {
        *self
            .status
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = (what, why);
    }
}

impl<L: Ledger + 'static> crate::http::Readiness for Starting<L> {
    async fn check(&self) -> Vec<(&'static str, Result<(), String>)> {
        match self.worker.get() {
            Some(worker) => worker.check().await,
            // Only what start-up waits on: the others are not checked yet,
            // so neither up nor down (found by review: every dependency
            // read as down while Redis alone was missing).
            None => {
                let (what, why) = self
                    .status
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .clone();
                vec![(what, Err(format!("starting: {why}")))]
            }
        }
    }
}

/// A connection that lasted this long was healthy: the next loss starts the
/// reconnect backoff afresh.
const STABLE: Duration = Duration::from_secs(30);

/// How long an SMTP readiness result is reused.
const SMTP_CHECK_TTL: Duration = Duration::from_secs(10);

/// A readiness check's last result, reused for `ttl`. Concurrent probes
/// wait for the one check in progress instead of each running their own.
struct Checked {
    ttl: Duration,
    last: tokio::sync::Mutex<Option<(Instant, Result<(), String>)>>,
}

impl Checked {
    fn new(ttl: Duration) -> Self {
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

/// Logs a failed attempt to reach Redis.
fn log_redis_retry(settings: &Settings, e: &LedgerError, wait: Duration) {
    let r = &settings.redis;
    log_retry("redis", "redis.tls", &r.url, &r.tls, e, wait);
}

/// Logs a failed attempt to reach RabbitMQ.
fn log_amqp_retry(settings: &Settings, e: &BrokerError, wait: Duration) {
    let a = &settings.amqp;
    match e {
        BrokerError::Refused { .. } => {
            tracing::error!(error = %e, ?wait, "rabbitmq refuses mailgate's queues; retrying");
        }
        BrokerError::Tls(why) => {
            let url = redact_url(&a.url);
            tracing::warn!(%url, error = why, ?wait, "[amqp.tls] cannot be used; retrying");
        }
        _ => log_retry("rabbitmq", "amqp.tls", &a.url, &a.tls, e, wait),
    }
}

/// Logs a failed attempt to reach `link` at `url`: a TLS failure with what
/// to set in `table`, anything else with the variable that sets the URL;
/// both name the server.
fn log_retry(
    link: &str,
    table: &str,
    url: &str,
    tls: &crate::tls::TlsSettings,
    e: &(dyn std::error::Error + 'static),
    wait: Duration,
) {
    let shown = redact_url(url);
    match crate::tls::explain_url(e, table, url, tls) {
        Some(why) => {
            tracing::warn!(
                url = shown,
                error = why,
                ?wait,
                "cannot reach {link} over TLS; retrying"
            );
        }
        None => tracing::warn!(
            url = shown,
            error = crate::telemetry::without_repeats(&e.to_string()),
            ?wait,
            "{link} is not answering; retrying (set MAILGATE__{}__URL)",
            link.replace("rabbitmq", "amqp").to_ascii_uppercase()
        ),
    }
}

/// Builds the stages from settings: templates (checked), mailer, and the
/// ledger (Redis, retried with backoff until it answers; refused at once if
/// it cannot keep the ledger's promises, e.g. it evicts keys).
pub async fn build(settings: &Settings) -> anyhow::Result<Worker<Backend>> {
    // Install the metrics recorder before anything is counted.
    crate::telemetry::prometheus();
    crate::telemetry::register();
    let http = tokio::net::TcpListener::bind(settings.http.listen)
        .await
        .with_context(|| {
            format!(
                "listening on {} (set MAILGATE__HTTP__LISTEN)",
                settings.http.listen
            )
        })?;
    let http_addr = http.local_addr()?;
    tracing::info!(addr = %http_addr, "serving /metrics, /healthz, /readyz");
    let endpoint = Endpoint::serve(http);
    let templates = Templates::load(&settings.templates).with_context(|| {
        format!(
            "loading templates from {}",
            settings.templates.dir.display()
        )
    })?;
    let mailer = Mailer::new(&settings.smtp)?;
    for warning in settings.warnings() {
        tracing::warn!("{warning}");
    }
    if let Some(dir) = mailer.outbox() {
        tracing::warn!(outbox = %dir.display(), "mail is written to files, not sent (smtp.url is file://)");
    }
    if Backend::is_memory(&settings.redis) {
        tracing::warn!(
            "redis.url is memory://: limits and job records live in this worker only; \
             they are not shared with other workers and do not survive a restart"
        );
    }
    let url = redact_url(&settings.redis.url);
    endpoint
        .starting
        .set("redis", format!("connecting to Redis at {url}"));
    let ledger = (|| Backend::open(&settings.redis, &settings.limits))
        .retry(reconnect_backoff())
        .when(|e| !matches!(e, LedgerError::Unfit(_)))
        .notify(|e, wait| {
            log_redis_retry(settings, e, wait);
            // A connection that failed is a check that failed: an alert
            // on the gauge fires for a fleet started into an outage (found
            // by review: no series, so none did).
            telemetry::dependency_up("redis", false);
            let why = crate::telemetry::without_repeats(&e.to_string());
            endpoint.starting.set(
                "redis",
                format!("Redis at {url} is not answering yet ({why}); retrying"),
            );
        })
        .await
        .context("connecting to redis")?;
    let stopping = Stopping::default();
    Ok(Worker {
        pipeline: Pipeline::new(
            ledger,
            templates,
            mailer,
            settings.clone(),
            stopping.clone(),
        ),
        stopping,
        cancelled: tokio::sync::watch::Sender::new(None),
        settings: settings.clone(),
        amqp_up: AtomicBool::new(false),
        amqp_why: std::sync::Mutex::new(None),
        broker: std::sync::Mutex::new(None),
        smtp_checked: Checked::new(SMTP_CHECK_TTL),
        redis_hold: tokio::sync::watch::Sender::new(None),
        http: std::sync::Mutex::new(Some(endpoint)),
        http_addr,
    })
}

fn reconnect_backoff() -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_secs(10))
        .with_jitter()
        .with_max_times(usize::MAX)
}

enum Stop {
    /// `shutdown` completed.
    Requested,
    /// The connection or channel to RabbitMQ is gone.
    Lost,
}

impl<L: Ledger + 'static> Worker<L> {
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
            // From now on `/readyz` asks the worker.
            let _ = e.starting.worker.set(this.clone());
        }
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

    /// Keeps the gauges of what `/readyz` checks and of the jobs waiting
    /// fresh for dashboards and alerts, whether or not anything asks
    /// `/readyz`. Runs until aborted.
    async fn refresh_gauges(self: Arc<Self>) {
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
                    Err(e) => tracing::debug!(error = %e, "cannot read the jobs queue's length"),
                }
            }
        }
    }

    /// Checks Redis every [`REDIS_EVERY`] as readiness does
    /// ([`Ledger::health`]: it answers, takes the script's writes, keeps
    /// its keys, has its replicas) and reads its clocks (`ledger::clock`);
    /// holds the consume loop back while Redis cannot be used or its clock
    /// cannot be trusted, so no job spends an attempt on an outage. Runs
    /// until aborted, or returns at once for a store without a clock of its
    /// own (in memory).
    async fn watch_redis(self: Arc<Self>) {
        let ledger = self.pipeline.ledger();
        let mut pace = Pace::default();
        let mut every = tokio::time::interval(REDIS_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut was: Option<&'static str> = None;
        let url = redact_url(&self.settings.redis.url);
        loop {
            every.tick().await;
            let unusable = |e: LedgerError| {
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
                let why = format!("cannot look after Redis's clock ({e})");
                return Some(("unusable", why));
            }
        };
        match Verdict::of(readings, mark, max_skew) {
            Verdict::Agrees => None,
            v @ Verdict::Skewed(_) => Some(("skewed", v.to_string())),
            v @ Verdict::Marked(_) => Some(("marked", v.to_string())),
        }
    }

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
            // RabbitMQ refusing the queues (other arguments, no permission)
            // is not an outage: at start, it stops the worker with the
            // broker's reason; later it is retried, with that reason logged.
            let connect = (|| Broker::connect(&this.settings))
                .retry(reconnect_backoff())
                .when(|e| started || !matches!(e, BrokerError::Refused { .. }))
                .notify(|e, wait| {
                    log_amqp_retry(&this.settings, e, wait);
                    let why = crate::telemetry::without_repeats(&e.to_string());
                    *this
                        .amqp_why
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(why);
                });
            let broker = tokio::select! {
                b = connect => b.context("connecting to rabbitmq")?,
                () = &mut shutdown => break,
            };
            started = true;
            let mut consumers = match broker.consume(&tag).await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot consume; reconnecting");
                    continue;
                }
            };
            tracing::info!(queue = %broker.topology().jobs, "consuming");
            this.amqp_up.store(true, Ordering::Relaxed);
            *this
                .amqp_why
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
            this.set_broker(Some(broker.clone()));
            let up_since = Instant::now();
            let mailer = this.pipeline.mailer();
            let mut redis = this.redis_hold.subscribe();
            let stop = loop {
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
                            let (this, broker) = (this.clone(), broker.clone());
                            tasks.spawn(async move { this.take(&broker, Incoming::new(delivery)).await });
                        }
                        Some(Err(e)) => break lost(&e),
                        None => break closed(),
                    },
                    next = consumers.redelivered.next(), if can_take => match next {
                        Some(Ok(delivery)) => {
                            while tasks.try_join_next().is_some() {}
                            let (this, broker) = (this.clone(), broker.clone());
                            tasks.spawn(async move { this.process(&broker, Incoming::new(delivery)).await });
                        }
                        Some(Err(e)) => break lost(&e),
                        None => break closed(),
                    },
                }
            };
            this.amqp_up.store(false, Ordering::Relaxed);
            this.set_broker(None);
            match stop {
                // In-flight jobs of the lost connection finish on their own;
                // their acks fail and RabbitMQ redelivers them.
                Stop::Lost => {
                    if up_since.elapsed() > STABLE {
                        losses = reconnect_backoff().build();
                    }
                    let wait = losses.next().unwrap_or(Duration::from_secs(10));
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
        // Stopped while not connected: nothing can be handed back but by
        // the lost connection's end.
        this.stopping.begin();
        this.cancelled.send_replace(Some(false));
        let deadline = tokio::time::Instant::now() + this.settings.worker.shutdown_timeout;
        this.drain(&mut tasks, deadline).await;
        Ok(())
    }

    fn set_broker(&self, broker: Option<Broker>) {
        // Nothing panics while holding it; a poisoned lock still holds a value.
        *self
            .broker
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = broker;
    }

    /// Stops within `worker.shutdown_timeout` whatever the broker does (a
    /// memory alarm can hold a cancel, a publish or a close indefinitely):
    /// no SMTP transaction begins any more; cancel the consumers; hand back
    /// every job whose transaction had not begun, those still in the
    /// consumers' buffers too; let the transactions under way finish;
    /// close the connection. Each step is bounded by what is left of the
    /// timeout. What is unfinished then stays unacknowledged and RabbitMQ
    /// hands it to another worker.
    async fn stop(
        &self,
        broker: &Broker,
        tag: &str,
        tasks: &mut JoinSet<()>,
        consumers: &mut crate::broker::Consumers,
    ) {
        self.stopping.begin();
        let timeout = self.settings.worker.shutdown_timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        // Keep a tenth of the timeout for closing the connection.
        let close_reserve = timeout / 10;
        let cancel = tokio::time::timeout_at(deadline - close_reserve, broker.stop_consuming(tag));
        let cancelled = match cancel.await {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "could not cancel the consumer");
                false
            }
            Err(_) => {
                tracing::warn!("rabbitmq did not confirm the cancel in time");
                false
            }
        };
        self.cancelled.send_replace(Some(cancelled));
        if cancelled {
            // Delivered before the cancel, never taken: back at once.
            let buffered = async {
                let mut n = 0;
                for consumer in [&mut consumers.jobs, &mut consumers.redelivered] {
                    while let Some(Ok(delivery)) = consumer.next().await {
                        finished(Incoming::new(delivery).requeue().await);
                        n += 1;
                    }
                }
                n
            };
            if let Ok(n) = tokio::time::timeout_at(deadline - close_reserve, buffered).await
                && n > 0
            {
                tracing::info!(handed_back = n, "handed back the jobs not yet taken");
            }
        }
        self.drain(tasks, deadline - close_reserve).await;
        broker
            .close(deadline.saturating_duration_since(tokio::time::Instant::now()))
            .await;
    }

    /// Waits for jobs in flight until `deadline`. Jobs still running then
    /// are abandoned unacknowledged: closing the connection hands them back
    /// to RabbitMQ. So are they at once when every job left is waiting for
    /// an SMTP relay to take mail (every circuit open): none of them is
    /// sending, and none would finish before a probe closes a circuit.
    async fn drain(&self, tasks: &mut JoinSet<()>, deadline: tokio::time::Instant) {
        let n = tasks.len();
        if n == 0 {
            return;
        }
        tracing::info!(in_flight = n, "finishing jobs in flight");
        let mailer = self.pipeline.mailer();
        let all = async {
            loop {
                tokio::select! {
                    next = tasks.join_next() => if next.is_none() { return true },
                    () = tokio::time::sleep(Duration::from_millis(50)) => {
                        if !mailer.can_send() && tasks.len() <= mailer.waiting_for_relay() {
                            return false;
                        }
                    }
                }
            }
        };
        let finished = tokio::time::timeout_at(deadline, all).await;
        if finished == Ok(false) {
            tracing::info!(
                left = tasks.len(),
                "every job left waits for an SMTP relay: handing them back to rabbitmq"
            );
            tasks.abort_all();
        } else if finished.is_err() {
            tracing::warn!(
                left = tasks.len(),
                timeout = ?self.settings.worker.shutdown_timeout,
                "shutdown timeout: handing the rest back to rabbitmq"
            );
            tasks.abort_all();
        }
    }

    /// A job from `J`: one handed out twice before without being settled
    /// (workers died, or lost their connection, holding it) is moved to
    /// `J.redelivered`, which is taken one message at a time, so a message
    /// that kills its workers takes no other job's deliveries with it to the
    /// delivery limit. The rest, and any that cannot be moved, are
    /// processed. Once is what a dropped connection or one dead worker
    /// costs every job it held: those are processed as usual (found by
    /// review: moving them all made one lost connection's prefetch wait in
    /// line, and 142 of 256 codes expired).
    async fn take(&self, broker: &Broker, job: Incoming) {
        if job.deliveries_before < ISOLATE_FROM {
            return self.process(broker, job).await;
        }
        match broker.isolate(&job).await {
            Ok(()) => {
                telemetry::isolated();
                finished(job.ack().await);
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not move a redelivered job aside; processing it here");
                self.process(broker, job).await;
            }
        }
    }

    /// Runs one job through the pipeline and carries out the action.
    async fn process(&self, broker: &Broker, job: Incoming) {
        // The pipeline records the id once it has parsed the job.
        let queue = broker.topology().jobs.as_str();
        let span = tracing::info_span!(
            "job",
            id = tracing::field::Empty,
            attempt = job.attempt,
            otel.name = format!("process {queue}"),
            otel.kind = "consumer",
        );
        crate::traces::messaging(&span, "process", queue);
        // The producer's trace, if it sent one (a retry's copy carries it).
        crate::traces::continue_trace(&span, &job.trace);
        async {
            // One redelivery is a worker that died or lost its connection;
            // many are a job that takes every worker down with it.
            if i64::from(job.deliveries_before) >= DELIVERY_LIMIT / 2 {
                tracing::warn!(
                    deliveries = job.deliveries_before,
                    limit = DELIVERY_LIMIT,
                    "this message was handed out again and again without being settled; \
                     RabbitMQ dead-letters it at the limit"
                );
                telemetry::redelivered_often();
            }
            let ticket = job.ticket.clone().unwrap_or_default();
            let msg = Message {
                body: job.body(),
                attempt: job.attempt,
                ticket: &ticket,
                continuation: job.ticket.is_some(),
                redelivered: job.redelivered,
                correlation_id: job.correlation_id.as_deref(),
                published_at_ms: job.published_at_ms,
            };
            let _in_flight = telemetry::InFlight::enter();
            let out = Replies { broker, job: &job };
            // A panic is a bug, but it must not leave the job unacknowledged
            // to be redelivered, panic again, and loop: dead-letter it.
            let action = match std::panic::AssertUnwindSafe(self.pipeline.handle(&msg, &out))
                .catch_unwind()
                .await
            {
                Ok(action) => action,
                Err(panic) => {
                    let why = panic
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_owned())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    tracing::error!(panic = %why, "the pipeline panicked on this job");
                    Action::DeadLetter {
                        error: format!("mailgate panicked processing this job: {why}"),
                    }
                }
            };
            // An answered job is only acknowledged. Moving one elsewhere
            // (retry, wait, dead letter) is boxed: its publish state would
            // otherwise be most of every job's task.
            match action {
                Action::Done => finished(job.ack().await),
                Action::HandBack => self.hand_back(&job).await,
                action => Box::pin(carry_out(broker, &job, &ticket, action)).await,
            }
        }
        .instrument(span)
        .await
    }
}

impl<L: Ledger + 'static> Worker<L> {
    /// Gives a job that had not begun its SMTP transaction back to
    /// RabbitMQ, the worker stopping: once RabbitMQ confirmed that this
    /// worker's consumers are cancelled (before, it could hand the job
    /// straight back here). Unconfirmed, the job stays unacknowledged and
    /// closing the connection returns it.
    async fn hand_back(&self, job: &Incoming) {
        let mut cancelled = self.cancelled.subscribe();
        // The sender lives in `self`, so the channel cannot close.
        let confirmed = match cancelled.wait_for(Option::is_some).await {
            Ok(c) => *c == Some(true),
            Err(_) => false,
        };
        if confirmed {
            finished(job.requeue().await);
        }
    }
}

/// Moves the message as `action` says, then acknowledges it. A copy that
/// RabbitMQ refuses becomes a dead letter; a dead letter it refuses too is
/// handed back after a pause, so the pool keeps flowing and nothing is lost.
async fn carry_out(broker: &Broker, job: &Incoming, ticket: &Ticket, action: Action) {
    let moved = match action {
        Action::Done => Ok(()),
        Action::Abandon | Action::HandBack => return,
        Action::Retry {
            failed_attempt,
            delay,
            error,
        } => {
            tracing::warn!(
                error = telemetry::mask_emails(&error),
                ?delay,
                "transient failure; retrying later"
            );
            telemetry::retried("transient");
            let queue = broker.topology().retry(failed_attempt);
            broker
                .delay(job, &queue, ticket, failed_attempt + 1, delay)
                .await
        }
        Action::Wait { delay, why } => {
            match why {
                Waiting::Redis => tracing::info!(
                    ?delay,
                    "Redis is unavailable; the job waits, spending no attempt"
                ),
                Waiting::Relay => tracing::info!(
                    ?delay,
                    "no SMTP relay takes mail; the job waits, spending no attempt"
                ),
                Waiting::Lease => tracing::info!(
                    ?delay,
                    "another attempt owns the send; waiting for its lease"
                ),
            }
            telemetry::retried(why.label());
            let (queue, delay) = broker.topology().wait(delay);
            broker.delay(job, &queue, ticket, job.attempt, delay).await
        }
        Action::DeadLetter { error } => Err(BrokerError::Refused {
            queue: String::new(),
            why: error,
        }),
    };
    let moved = match moved {
        Err(BrokerError::Refused { queue, why }) => {
            let error = if queue.is_empty() {
                why
            } else {
                format!("rabbitmq refused its copy to {queue}: {why}")
            };
            tracing::warn!(error = telemetry::mask_emails(&error), "dead-lettered");
            telemetry::dead_lettered();
            broker.dead_letter(job, &error).await
        }
        other => other,
    };
    let done = match moved {
        Ok(()) => job.ack().await,
        Err(BrokerError::Refused { queue, why }) => {
            tracing::error!(queue, %why, "rabbitmq refuses even the dead letter; handing the job back in a while");
            tokio::time::sleep(Duration::from_secs(5)).await;
            job.requeue().await
        }
        Err(e) => Err(e),
    };
    finished(done);
}

/// The consumer failed: the connection or channel is gone.
fn lost(e: &lapin::Error) -> Stop {
    tracing::warn!(error = %e, "lost rabbitmq; reconnecting");
    Stop::Lost
}

/// RabbitMQ cancelled a consumer (its queue was deleted, or the node that
/// led it went away).
fn closed() -> Stop {
    tracing::warn!("rabbitmq closed the consumer; reconnecting");
    Stop::Lost
}

/// Logs a job that could not be acknowledged (or handed back).
fn finished(done: Result<(), BrokerError>) {
    if let Err(e) = done {
        // Unacknowledged: RabbitMQ redelivers it, and the ledger answers
        // that copy from what it recorded.
        tracing::warn!(error = %e, "could not finish the job; it will be redelivered");
    }
}

/// Results of one job, published through the worker's broker.
struct Replies<'a> {
    broker: &'a Broker,
    job: &'a Incoming,
}

impl Outbox for Replies<'_> {
    async fn publish(&self, result: &JobResult) -> Result<(), Unpublished> {
        let queue = (self.job.reply_to.as_deref()).unwrap_or(&self.broker.topology().results);
        let span = tracing::info_span!(
            "publish",
            otel.name = format!("send {queue}"),
            otel.kind = "producer",
        );
        crate::traces::messaging(&span, "send", queue);
        // The result continues the job's trace (passes its context on,
        // when no spans are made).
        let trace = crate::traces::headers_of(&span).unwrap_or_else(|| self.job.trace.clone());
        let published = self
            .broker
            .publish_result(self.job, &result.to_json(), &trace)
            .instrument(span)
            .await;
        match published {
            Ok(()) => {
                let since = self
                    .job
                    .published_at_ms
                    .and_then(|p| now_ms().checked_sub(p));
                telemetry::job_answered(result.status, since.map(Duration::from_millis));
                match result.status {
                    Status::Sent | Status::Rejected | Status::Duplicate => {
                        tracing::info!(status = ?result.status, retry_after_ms = result.exact_retry_after_ms.or(result.retry_after_ms), "answered");
                    }
                    _ => tracing::warn!(
                        status = ?result.status,
                        error = result.error.as_deref().map(telemetry::mask_emails),
                        "answered"
                    ),
                }
                Ok(())
            }
            Err(BrokerError::Refused { queue, why }) => {
                Err(Unpublished::Refused(format!("{queue}: {why}")))
            }
            Err(e) => Err(Unpublished::Lost(e.to_string())),
        }
    }
}

impl<L: Ledger + 'static> Worker<L> {
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
    async fn refresh_dependency_gauges(&self) {
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

fn hostname() -> String {
    std::fs::read_to_string("/etc/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "worker".to_owned())
}
