//! Reaching the brokers again: the backoff between attempts, how a failed
//! attempt is logged, and how a lost consumer ends the consume loop.

use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder, Retryable};

use super::{Stop, Worker};
use crate::broker::{Broker, BrokerError};
use crate::ledger::{Ledger, LedgerError};
use crate::redact::redact_url;
use crate::settings::RedisSettings;

/// A connection that lasted this long was healthy: the next loss starts the
/// reconnect backoff afresh.
const STABLE: Duration = Duration::from_secs(30);

/// The backoff between attempts to reach a broker, and after losses.
pub(super) fn reconnect_backoff() -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_secs(10))
        .with_jitter()
        .with_max_times(usize::MAX)
}

/// How long to wait before connecting again after a loss of a connection
/// that was up since `up_since`: longer each time, so a fault that recurs
/// cannot spin, afresh after a connection that was [`STABLE`].
pub(super) fn after_loss(losses: &mut ExponentialBackoff, up_since: Instant) -> Duration {
    if up_since.elapsed() > STABLE {
        *losses = reconnect_backoff().build();
    }
    losses.next().unwrap_or(Duration::from_secs(10))
}

impl<L: Ledger + 'static> Worker<L> {
    /// Connects to RabbitMQ, retried with backoff; each failure is logged
    /// and kept for readiness. RabbitMQ refusing the queues (other
    /// arguments, no permission) is not an outage: before the worker
    /// `started`, it stops the worker with the broker's reason; later it is
    /// retried, with that reason logged.
    pub(super) async fn connect(&self, started: bool) -> Result<Broker, BrokerError> {
        (|| Broker::connect(&self.settings))
            .retry(reconnect_backoff())
            .when(|e| started || !matches!(e, BrokerError::Refused { .. }))
            .notify(|e, wait| {
                log_amqp_retry(&self.settings.amqp, e, wait);
                let why = crate::report::without_repeats(&crate::report::one_line(e));
                *self
                    .amqp_why
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(why);
            })
            .await
    }
}

/// The consumer failed: the connection or channel is gone.
pub(super) fn lost(e: &lapin::Error) -> Stop {
    tracing::warn!(error = %e, "lost rabbitmq; reconnecting");
    Stop::Lost
}

/// RabbitMQ cancelled a consumer (its queue was deleted, or the node that
/// led it went away).
pub(super) fn closed() -> Stop {
    tracing::warn!("rabbitmq closed the consumer; reconnecting");
    Stop::Lost
}

/// Logs a failed attempt to reach Redis.
pub(super) fn log_redis_retry(r: &RedisSettings, e: &LedgerError, wait: Duration) {
    log_retry("redis", "redis.tls", &r.url, &r.tls, e, wait);
}

/// Logs a failed attempt to reach RabbitMQ.
fn log_amqp_retry(a: &crate::settings::AmqpSettings, e: &BrokerError, wait: Duration) {
    match e {
        BrokerError::Refused { .. } => {
            tracing::error!(error = %crate::report::one_line(e), ?wait, "rabbitmq refuses mailgate's queues; retrying");
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
            error = crate::report::without_repeats(&crate::report::one_line(e)),
            ?wait,
            "{link} is not answering; retrying (set MAILGATE__{}__URL)",
            link.replace("rabbitmq", "amqp").to_ascii_uppercase()
        ),
    }
}
