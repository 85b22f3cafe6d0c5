//! The consume loop: jobs in, [`Pipeline`] actions out, with reconnection
//! and graceful shutdown.
//!
//! Up to `prefetch` jobs are processed at once (RabbitMQ delivers no more
//! unacknowledged ones). If the connection to RabbitMQ drops, the worker
//! reconnects with backoff and resumes; jobs that were unacknowledged come
//! back from RabbitMQ and are de-duplicated by id. When `shutdown` completes,
//! the worker stops consuming, lets jobs in flight finish for up to
//! `worker.shutdown_timeout`, hands the rest back, and returns.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use backon::{ExponentialBuilder, Retryable};
use futures_lite::{FutureExt as _, StreamExt};
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::broker::{Broker, Incoming};
use crate::limiter::{RateLimiter, RedisLimiter};
use crate::mailer::Mailer;
use crate::pipeline::{Action, Message, Pipeline};
use crate::settings::Settings;
use crate::telemetry;
use crate::templates::Templates;
use crate::wire::Status;

/// Everything a running worker shares between its jobs.
pub struct Worker<L> {
    pipeline: Pipeline<L>,
    settings: Settings,
    /// Whether the worker is connected to RabbitMQ and consuming.
    amqp_up: AtomicBool,
    /// The last SMTP check, reused for a few seconds so `/readyz` does not
    /// open a connection per probe.
    smtp_checked: tokio::sync::Mutex<Option<(Instant, Result<(), String>)>>,
    /// The HTTP listener, bound at build time so its address is known.
    http: std::sync::Mutex<Option<tokio::net::TcpListener>>,
    http_addr: std::net::SocketAddr,
}

/// How long an SMTP readiness result is reused.
const SMTP_CHECK_TTL: Duration = Duration::from_secs(10);

/// Builds the stages from settings: templates (checked), mailer, and the
/// Redis limiter (retried with backoff until Redis answers or `shutdown`).
pub async fn build(settings: &Settings) -> anyhow::Result<Worker<RedisLimiter>> {
    // Install the metrics recorder before anything is counted.
    crate::telemetry::prometheus();
    let http = tokio::net::TcpListener::bind(settings.http.listen)
        .await
        .with_context(|| {
            format!(
                "listening on {} (set MAILGATE__HTTP__LISTEN)",
                settings.http.listen
            )
        })?;
    let http_addr = http.local_addr()?;
    let templates = Templates::load(&settings.templates).with_context(|| {
        format!(
            "loading templates from {}",
            settings.templates.dir.display()
        )
    })?;
    let mailer = Mailer::new(&settings.smtp)?;
    if let Some(dir) = mailer.outbox() {
        tracing::warn!(outbox = %dir.display(), "mail is written to files, not sent (smtp.url is file://)");
    }
    let limiter = (|| RedisLimiter::connect(&settings.redis, &settings.limits))
        .retry(reconnect_backoff())
        .notify(|e, wait| {
            tracing::warn!(error = %e, ?wait, "redis is not answering; retrying (set MAILGATE__REDIS__URL)");
        })
        .await
        .context("connecting to redis")?;
    Ok(Worker {
        pipeline: Pipeline::new(limiter, templates, mailer, settings.retry.clone()),
        settings: settings.clone(),
        amqp_up: AtomicBool::new(false),
        smtp_checked: tokio::sync::Mutex::new(None),
        http: std::sync::Mutex::new(Some(http)),
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

impl<L: RateLimiter + 'static> Worker<L> {
    /// Where `/metrics`, `/healthz` and `/readyz` are served.
    pub fn http_addr(&self) -> std::net::SocketAddr {
        self.http_addr
    }

    /// Runs until `shutdown` completes; see the module docs.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
        let this = Arc::new(self);
        let http_stop = Arc::new(tokio::sync::Notify::new());
        let listener = this.http.lock().ok().and_then(|mut l| l.take());
        let http_task = listener.map(|listener| {
            let (ready, stop) = (this.clone(), http_stop.clone());
            tracing::info!(addr = %this.http_addr, "serving /metrics, /healthz, /readyz");
            tokio::spawn(async move {
                if let Err(e) =
                    crate::http::serve(listener, ready, async move { stop.notified().await }).await
                {
                    tracing::warn!(error = %e, "the HTTP endpoint stopped");
                }
            })
        });
        let result = this.clone().consume(shutdown).await;
        http_stop.notify_one();
        if let Some(t) = http_task {
            let _ = t.await;
        }
        result
    }

    async fn consume(self: Arc<Self>, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
        let this = self;
        let tag = format!("mailgate-{}-{}", hostname(), std::process::id());
        let mut tasks: JoinSet<()> = JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            let amqp = &this.settings.amqp;
            let connect = (|| Broker::connect(amqp, this.settings.retry.max_attempts))
                .retry(reconnect_backoff())
                .notify(|e, wait| {
                    tracing::warn!(error = %e, ?wait, "rabbitmq is not answering; retrying (set MAILGATE__AMQP__URL)");
                });
            let broker = tokio::select! {
                b = connect => b.context("connecting to rabbitmq")?,
                () = &mut shutdown => break,
            };
            let mut consumer = match broker.consume(&tag).await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot consume; reconnecting");
                    continue;
                }
            };
            tracing::info!(queue = %broker.topology().jobs, "consuming");
            this.amqp_up.store(true, Ordering::Relaxed);
            let stop = loop {
                tokio::select! {
                    () = &mut shutdown => break Stop::Requested,
                    next = consumer.next() => match next {
                        Some(Ok(delivery)) => {
                            let (this, broker) = (this.clone(), broker.clone());
                            tasks.spawn(async move { this.process(&broker, Incoming::new(delivery)).await });
                        }
                        Some(Err(e)) => {
                            tracing::warn!(error = %e, "lost rabbitmq; reconnecting");
                            break Stop::Lost;
                        }
                        None => {
                            tracing::warn!("rabbitmq closed the consumer; reconnecting");
                            break Stop::Lost;
                        }
                    },
                    Some(_) = tasks.join_next() => {}
                }
            };
            this.amqp_up.store(false, Ordering::Relaxed);
            match stop {
                // In-flight jobs of the lost connection finish on their own;
                // their acks fail and RabbitMQ redelivers them.
                Stop::Lost => continue,
                Stop::Requested => {
                    if let Err(e) = broker.stop_consuming(&tag).await {
                        tracing::warn!(error = %e, "could not cancel the consumer");
                    }
                    this.drain(&mut tasks).await;
                    broker.close().await;
                    return Ok(());
                }
            }
        }
        this.drain(&mut tasks).await;
        Ok(())
    }

    /// Waits for jobs in flight, up to the shutdown timeout. Jobs still
    /// running then are abandoned unacknowledged: closing the connection
    /// hands them back to RabbitMQ.
    async fn drain(&self, tasks: &mut JoinSet<()>) {
        let n = tasks.len();
        if n == 0 {
            return;
        }
        tracing::info!(in_flight = n, "finishing jobs in flight");
        let timeout = self.settings.worker.shutdown_timeout;
        let all = async { while tasks.join_next().await.is_some() {} };
        if tokio::time::timeout(timeout, all).await.is_err() {
            tracing::warn!(
                left = tasks.len(),
                ?timeout,
                "shutdown timeout: handing the rest back to rabbitmq"
            );
            tasks.abort_all();
        }
    }

    /// Runs one job through the pipeline and carries out the action.
    async fn process(&self, broker: &Broker, job: Incoming) {
        // The pipeline records the id once it has parsed the job.
        let span = tracing::info_span!("job", id = tracing::field::Empty, attempt = job.attempt);
        async {
            let msg = Message {
                body: job.body(),
                attempt: job.attempt,
                seen_before: job.redelivered || job.requeued,
                correlation_id: job.correlation_id.as_deref(),
            };
            let _in_flight = telemetry::InFlight::enter();
            // A panic is a bug, but it must not leave the job unacknowledged
            // to be redelivered, panic again, and loop: dead-letter it.
            let action = match std::panic::AssertUnwindSafe(self.pipeline.handle(&msg))
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
            let done = match &action {
                Action::Reply(result) => {
                    let since = job.published_at_ms.and_then(|p| now_ms().checked_sub(p));
                    telemetry::job_answered(result.status, since.map(Duration::from_millis));
                    match result.status {
                        Status::Sent | Status::Rejected | Status::Duplicate => {
                            tracing::info!(status = ?result.status, retry_after_ms = result.retry_after_ms, "answered");
                        }
                        _ => tracing::warn!(
                            status = ?result.status,
                            error = result.error.as_deref().map(telemetry::mask_emails),
                            "answered"
                        ),
                    }
                    let published = broker.publish_result(&job, &result.to_json()).await;
                    if published.is_ok() {
                        self.pipeline.mark_answered(result).await;
                    }
                    published
                }
                Action::AlreadyAnswered => {
                    tracing::info!("answered before (its ack was lost); acknowledging");
                    Ok(())
                }
                Action::Retry {
                    failed_attempt,
                    delay,
                    error,
                } => {
                    tracing::warn!(error = telemetry::mask_emails(error), ?delay, "transient failure; retrying later");
                    telemetry::retried("transient");
                    let queue = broker.topology().retry(*failed_attempt);
                    broker.delay(&job, &queue, failed_attempt + 1, *delay).await
                }
                Action::Wait { delay } => {
                    tracing::info!(?delay, "another attempt owns the send; waiting for its lease");
                    telemetry::retried("lease");
                    let queue = broker.topology().wait.clone();
                    broker.delay(&job, &queue, job.attempt, *delay).await
                }
                Action::GiveUp(result) => {
                    let error = result.error.clone().unwrap_or_default();
                    tracing::warn!(error = telemetry::mask_emails(&error), "failed on every attempt; answered and dead-lettered");
                    telemetry::job_answered(result.status, None);
                    telemetry::dead_lettered();
                    match broker.publish_result(&job, &result.to_json()).await {
                        Ok(()) => {
                            self.pipeline.mark_answered(result).await;
                            broker.dead_letter(&job, &error).await
                        }
                        Err(e) => Err(e),
                    }
                }
                Action::DeadLetter { error } => {
                    tracing::warn!(%error, "unusable message; dead-lettered");
                    telemetry::dead_lettered();
                    broker.dead_letter(&job, error).await
                }
            };
            let acked = match done {
                Ok(()) => job.ack().await,
                Err(e) => Err(e),
            };
            if let Err(e) = acked {
                // Unacknowledged: RabbitMQ redelivers it, and the limiter
                // de-duplicates what was already done.
                tracing::warn!(error = %e, "could not finish the job; it will be redelivered");
            }
        }
        .instrument(span)
        .await
    }
}

impl<L: RateLimiter + 'static> crate::http::Readiness for Worker<L> {
    async fn check(&self) -> Vec<(&'static str, Result<(), String>)> {
        let amqp = if self.amqp_up.load(Ordering::Relaxed) {
            Ok(())
        } else {
            Err("not connected (reconnecting)".to_owned())
        };
        let redis = self
            .pipeline
            .limiter()
            .ping()
            .await
            .map_err(|e| e.to_string());
        let smtp = {
            let mut cached = self.smtp_checked.lock().await;
            match &*cached {
                Some((at, r)) if at.elapsed() < SMTP_CHECK_TTL => r.clone(),
                _ => {
                    let r = self
                        .pipeline
                        .mailer()
                        .check()
                        .await
                        .map_err(|e| e.to_string());
                    *cached = Some((Instant::now(), r.clone()));
                    r
                }
            }
        };
        vec![("rabbitmq", amqp), ("redis", redis), ("smtp", smtp)]
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn hostname() -> String {
    std::fs::read_to_string("/etc/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "worker".to_owned())
}
