//! Building the worker: each stage from its section of the settings, in
//! order.

use anyhow::Context as _;
use backon::Retryable;

use super::Worker;
use super::endpoint::{Endpoint, Starting};
use super::reconnect::{log_redis_retry, reconnect_backoff};
use crate::ledger::{Backend, LedgerError};
use crate::mailer::Mailer;
use crate::pipeline::{Pipeline, Stopping};
use crate::redact::redact_url;
use crate::settings::{LimitSettings, RedisSettings, Settings};
use crate::telemetry;
use crate::templates::Templates;

/// Builds the stages from settings: the HTTP endpoint (`http`), templates
/// (`templates`, checked), mailer (`smtp`), and the ledger (`redis` and
/// `limits`: Redis, retried with backoff until it answers; refused at once
/// if it cannot keep the ledger's promises, e.g. it evicts keys).
pub async fn build(settings: &Settings) -> anyhow::Result<Worker<Backend>> {
    // Install the metrics recorder before anything is counted.
    crate::telemetry::prometheus();
    crate::telemetry::register();
    for (rule, enforced) in crate::limiter::configured_rules(&settings.limits) {
        telemetry::rule_registered(rule.scope.as_str(), rule.window_ms, rule.max, enforced);
    }
    let endpoint = Endpoint::bind(&settings.http).await?;
    let templates = load_templates(settings)?;
    let mailer = Mailer::new(&settings.smtp)?;
    warn_of(settings, &mailer);
    for body in templates.without_code() {
        tracing::warn!(template = %body, "a mail body does not show the code ({{{{ code }}}})");
    }
    let ledger = open_ledger(&settings.redis, &settings.limits, &endpoint.starting).await?;
    let stopping = Stopping::default();
    let pipeline = Pipeline::new(
        ledger,
        templates,
        mailer,
        settings.clone(),
        stopping.clone(),
    );
    Ok(Worker::new(settings, pipeline, stopping, endpoint))
}

/// The templates, each checked, and every purpose with rules of its own
/// one of theirs.
fn load_templates(settings: &Settings) -> anyhow::Result<Templates> {
    let templates = Templates::load(&settings.templates).context("loading templates")?;
    templates.check_purposes(settings.limits.purpose.keys().map(String::as_str))?;
    Ok(templates)
}

/// Logs what the settings warn of, and the modes that keep mail or limits
/// from leaving this worker.
fn warn_of(settings: &Settings, mailer: &Mailer) {
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
}

/// Opens the ledger, retried with backoff until Redis answers; refused at
/// once if Redis cannot keep the ledger's promises. `starting` says why
/// `/readyz` waits meanwhile.
async fn open_ledger(
    redis: &RedisSettings,
    limits: &LimitSettings,
    starting: &Starting<Backend>,
) -> anyhow::Result<Backend> {
    let url = redact_url(&redis.url);
    starting.set("redis", format!("connecting to Redis at {url}"));
    (|| Backend::open(redis, limits))
        .retry(reconnect_backoff())
        .when(|e| !matches!(e, LedgerError::Unfit(_)))
        .notify(|e, wait| {
            log_redis_retry(redis, e, wait);
            // A connection that failed is a check that failed: the gauge
            // has a series, and its alert fires, for a fleet started into
            // an outage.
            telemetry::dependency_up("redis", false);
            let why = crate::report::without_repeats(&crate::report::one_line(e));
            starting.set(
                "redis",
                format!("Redis at {url} is not answering yet ({why}); retrying"),
            );
        })
        .await
        .context("connecting to redis")
}
