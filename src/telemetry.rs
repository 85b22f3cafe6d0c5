//! Metrics: every name mailgate exports, in one place, and the Prometheus
//! recorder that renders them for `/metrics`.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `mailgate_jobs_total` | counter | `status`: the final status of each answered job |
//! | `mailgate_limiter_decisions_total` | counter | `verdict` (what admission found: `admitted`, `resumed`, `rejected`, `expired`, `busy`, `sent`, `unknown`, `finished`, `conflict`, `superseded`, `suppressed`); on rejections `scope`, `window_ms`, `max` of the binding rule (`window_ms="deny"`, `max="0"` for an override's deny) |
//! | `mailgate_limiter_shadow_rejections_total` | counter | `scope`, `window_ms`, `max` of the shadow rule (`enforce = false`) that would have rejected an admitted job; each configured shadow rule's series (and its domain network shares') starts at zero, and without one the family is absent |
//! | `mailgate_limiter_override_decisions_total` | counter | `kind` (`allow`, `deny`, `rules`): admissions and rejections an override (`mailgate overrides`) changed: a deny that rejected, an allow that lifted a scope, rules that replaced a scope's |
//! | `mailgate_retries_total` | counter | `reason`: `transient` (a retry), `lease` (waiting for another attempt), `outage` (waiting for Redis, no attempt spent), `connection` (no SMTP connection came free within `limits.send_lease`, not admitted, no attempt spent) or `relay` (every SMTP relay fails whatever the mail, no attempt spent) |
//! | `mailgate_dead_letters_total` | counter | |
//! | `mailgate_bounces_total` | counter | none; counts addresses a relay said do not exist (5.1.1), each suppressed, as spelled, for `limits.suppress_bounces_for`: a sudden rise is a relay refusing many (past 5 in a row of one domain, or of any, without a mail taken for it, the refusals stop suppressing: `mailgate_bounces_doubted_total`) or a code farmer probing addresses |
//! | `mailgate_bounces_doubted_total` | counter | `relay`: 5.1.1s not taken as grounds to suppress, because the relay said so of more than 5 mailboxes in a row of the recipient's domain, or of any, without taking a mail for it, of more than 30 % of its latest mails, or every worker's bounces of the domain passed 5 in 10 minutes (a broken recipient table); the first of each run also lifts the run's earlier suppressions |
//! | `mailgate_jobs_redelivered_often_total` | counter | messages handed out a third time, moved to `<jobs_queue>.redelivered` |
//! | `mailgate_jobs_isolated_total` | counter | jobs taken one at a time from `<jobs_queue>.redelivered` |
//! | `mailgate_send_marks_unreplicated_total` | counter | send marks fewer replicas acknowledged than `redis.min_replicas_acked` (behind Sentinel, every replica it could promote) asks for: given back, the job retried |
//! | `mailgate_jobs_in_flight` | gauge | |
//! | `mailgate_smtp_send_seconds` | histogram | `outcome`: `ok`, `transient`, `permanent` (a mailbox that does not exist too), `unknown` |
//! | `mailgate_publish_to_result_seconds` | histogram | `status`; from the job's `timestamp_in_ms` header, else its AMQP timestamp |
//! | `mailgate_smtp_relay_up` | gauge | 1 while some relay's circuit is closed and its latest send or session setup worked; 0 after a relay failure (connect, TLS, AUTH, greeting, MAIL FROM) on every relay, until the next successful session setup or send |
//! | `mailgate_smtp_relay_sends_total` | counter | `relay` (its name): mails the relay accepted |
//! | `mailgate_smtp_relay_failures_total` | counter | `relay`: relay-level failures (of sends, readiness checks and probes), the ones that count against its circuit |
//! | `mailgate_smtp_relay_circuit` | gauge | `relay`: its circuit, 0 closed, 1 half-open (probing), 2 open |
//! | `mailgate_dependency_up` | gauge | `dependency` (`rabbitmq`, `redis`, `smtp`): 1 while it answers as `/readyz` checks it, else 0; refreshed on each `/readyz` and every 15 s (SMTP then as the sends and circuits see it, without a probe connection); first checked as the worker starts running (before it consumes; while it builds, only Redis is there, 0 from its first failed connection) |
//! | `mailgate_redis_clock_skew_seconds` | gauge | how far the Redis primary whose clock disagrees most with this worker's is ahead (negative: behind), read every second; past `redis.max_clock_skew` the worker takes no jobs |
//! | `mailgate_jobs_queue_messages` | gauge | jobs waiting in the jobs queue (ready, not yet handed to a worker), read every 15 s; every worker reports it, so take the `max` |
//!
//! Every label comes from a bounded set (the statuses, verdicts and scopes;
//! the configured relays; the windows and maxima of the configured rules,
//! their network shares and the stored overrides), never from a job's
//! content: an attack adds no series (`tools::cli::a_flood_of_hostile_jobs_adds_no_metric_series`).
//!
//! Every family is on `/metrics` from start-up, with its HELP text: the
//! counters and histograms at zero for each label value known then
//! ([`register`], [`rule_registered`], [`smtp_relay_registered`]),
//! the gauges as the worker first reads them (the README's list is held
//! to this by `worker::http::the_readme_lists_every_metric_and_each_is_there_from_start_up`).

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use crate::wire::Status;

/// The process-wide Prometheus recorder, installed on first use. Metrics
/// recorded before it is installed are dropped, so the worker installs it
/// before it consumes.
pub fn prometheus() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let buckets = [
            0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            60.0,
        ];
        let builder = PrometheusBuilder::new();
        let builder = match builder.set_buckets(&buckets) {
            Ok(b) => b,
            // Only an empty bucket list is refused; this one is not empty.
            Err(_) => PrometheusBuilder::new(),
        };
        match builder.install_recorder() {
            Ok(handle) => handle,
            // Another recorder is installed (an embedding program chose its
            // own): render an empty, private one rather than fail.
            Err(_) => PrometheusBuilder::new().build_recorder().handle(),
        }
    })
}

fn status_label(status: Status) -> &'static str {
    match status {
        Status::Sent => "sent",
        Status::Rejected => "rejected",
        Status::Duplicate => "duplicate",
        Status::Invalid => "invalid",
        Status::Expired => "expired",
        Status::Failed => "failed",
        Status::Superseded => "superseded",
        Status::Suppressed => "suppressed",
    }
}

/// A job was answered with `status`; `since_publish` is how long ago its
/// producer published it, if known.
pub fn job_answered(status: Status, since_publish: Option<Duration>) {
    let s = status_label(status);
    metrics::counter!("mailgate_jobs_total", "status" => s).increment(1);
    if let Some(d) = since_publish {
        metrics::histogram!("mailgate_publish_to_result_seconds", "status" => s)
            .record(d.as_secs_f64());
    }
}

/// Every counter and histogram series whose labels are known before any
/// job, and the gauges of the jobs in flight and waiting, registered at
/// zero, so queries have data from the first scrape: a
/// rate over a series that does not exist yet is no data, and the first
/// increment of a series born at 1 is lost to `increase` (an alert on dead
/// letters would miss the first). Called once the recorder is installed.
pub fn register() {
    for status in Status::ALL {
        let status = status_label(status);
        metrics::counter!("mailgate_jobs_total", "status" => status).increment(0);
        // Registered, a histogram renders its buckets at zero.
        let _ = metrics::histogram!("mailgate_publish_to_result_seconds", "status" => status);
    }
    for outcome in ["ok", "transient", "permanent", "unknown"] {
        let _ = metrics::histogram!("mailgate_smtp_send_seconds", "outcome" => outcome);
    }
    for reason in ["transient", "lease", "outage", "relay", "connection"] {
        metrics::counter!("mailgate_retries_total", "reason" => reason).increment(0);
    }
    metrics::counter!("mailgate_dead_letters_total").increment(0);
    metrics::counter!("mailgate_bounces_total").increment(0);
    metrics::counter!("mailgate_limiter_decisions_total", "verdict" => "admitted").increment(0);
    for kind in ["allow", "deny", "rules"] {
        metrics::counter!("mailgate_limiter_override_decisions_total", "kind" => kind).increment(0);
    }
    metrics::counter!("mailgate_jobs_redelivered_often_total").increment(0);
    metrics::counter!("mailgate_jobs_isolated_total").increment(0);
    metrics::counter!("mailgate_send_marks_unreplicated_total").increment(0);
    metrics::gauge!("mailgate_jobs_in_flight").increment(0.0);
    metrics::gauge!("mailgate_jobs_queue_messages").set(0.0);
    describe();
}

/// What a metric family is, for its HELP line.
#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
    /// A gauge or histogram in seconds.
    GaugeSeconds,
    HistogramSeconds,
}

/// The HELP text of every metric family (`promtool check metrics` wants
/// one for each).
const HELP: [(&str, Kind, &str); 21] = [
    (
        "mailgate_jobs_total",
        Kind::Counter,
        "Jobs answered, by the status of their result.",
    ),
    (
        "mailgate_retries_total",
        Kind::Counter,
        "Jobs sent back to wait for another try, by why.",
    ),
    (
        "mailgate_dead_letters_total",
        Kind::Counter,
        "Messages moved to the dead-letter queue.",
    ),
    (
        "mailgate_bounces_total",
        Kind::Counter,
        "Recipients a relay refused as unknown (5.1.1), suppressed.",
    ),
    (
        "mailgate_bounces_doubted_total",
        Kind::Counter,
        "Unknown-recipient refusals not trusted to suppress, by relay.",
    ),
    (
        "mailgate_limiter_decisions_total",
        Kind::Counter,
        "Admissions: admitted, or rejected by scope and window.",
    ),
    (
        "mailgate_limiter_override_decisions_total",
        Kind::Counter,
        "Decisions an override made, by kind.",
    ),
    (
        "mailgate_limiter_shadow_rejections_total",
        Kind::Counter,
        "Admissions a shadow rule would have rejected.",
    ),
    (
        "mailgate_jobs_redelivered_often_total",
        Kind::Counter,
        "Messages handed out a third time, moved aside.",
    ),
    (
        "mailgate_jobs_isolated_total",
        Kind::Counter,
        "Jobs taken one at a time from the redelivered lane.",
    ),
    (
        "mailgate_send_marks_unreplicated_total",
        Kind::Counter,
        "Send marks too few replicas acknowledged: given back.",
    ),
    (
        "mailgate_smtp_relay_sends_total",
        Kind::Counter,
        "Mails a relay accepted, by relay.",
    ),
    (
        "mailgate_smtp_relay_failures_total",
        Kind::Counter,
        "Sends a relay failed, by relay.",
    ),
    (
        "mailgate_jobs_in_flight",
        Kind::Gauge,
        "Jobs this worker holds now.",
    ),
    (
        "mailgate_jobs_queue_messages",
        Kind::Gauge,
        "Messages ready in the jobs queue, as last seen.",
    ),
    (
        "mailgate_dependency_up",
        Kind::Gauge,
        "Whether a dependency answers as /readyz checks it.",
    ),
    (
        "mailgate_smtp_relay_up",
        Kind::Gauge,
        "1 while some relay's circuit is closed and it worked.",
    ),
    (
        "mailgate_smtp_relay_circuit",
        Kind::Gauge,
        "Each relay's circuit: 0 closed, 1 half open, 2 open.",
    ),
    (
        "mailgate_redis_clock_skew_seconds",
        Kind::GaugeSeconds,
        "How far Redis's clock is ahead.",
    ),
    (
        "mailgate_publish_to_result_seconds",
        Kind::HistogramSeconds,
        "From a job's publish to its result.",
    ),
    (
        "mailgate_smtp_send_seconds",
        Kind::HistogramSeconds,
        "How long an SMTP transaction took.",
    ),
];

/// Gives every family in [`HELP`] its text.
fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    for (name, kind, help) in HELP {
        match kind {
            Kind::Counter => describe_counter!(name, help),
            Kind::Gauge => describe_gauge!(name, help),
            Kind::GaugeSeconds => describe_gauge!(name, Unit::Seconds, help),
            Kind::HistogramSeconds => describe_histogram!(name, Unit::Seconds, help),
        }
    }
}

/// Whether `dependency` answers, as `/readyz` checks it.
pub fn dependency_up(dependency: &'static str, up: bool) {
    metrics::gauge!("mailgate_dependency_up", "dependency" => dependency).set(if up {
        1.0
    } else {
        0.0
    });
}

/// How far Redis's clock is ahead of this worker's (see `ledger::clock`).
pub fn redis_clock_skew(ms: i64) {
    metrics::gauge!("mailgate_redis_clock_skew_seconds").set(ms as f64 / 1000.0);
}

/// How many jobs wait in the jobs queue.
pub fn jobs_waiting(n: u32) {
    metrics::gauge!("mailgate_jobs_queue_messages").set(f64::from(n));
}

/// A job goes to wait in RabbitMQ: `transient` for a retry, `lease` for
/// another attempt's send, `outage`, `relay` or `connection` (see
/// [`crate::pipeline::Waiting`]).
pub fn retried(reason: &'static str) {
    metrics::counter!("mailgate_retries_total", "reason" => reason).increment(1);
}

/// A job came back to a worker after half the broker's delivery limit or
/// more of unsettled deliveries: one that takes workers down with it.
pub fn redelivered_often() {
    metrics::counter!("mailgate_jobs_redelivered_often_total").increment(1);
}

/// A job handed out before without being settled was moved to
/// `J.redelivered`, to be taken one at a time.
pub fn isolated() {
    metrics::counter!("mailgate_jobs_isolated_total").increment(1);
}

/// A job's send mark was given back because fewer Redis replicas than
/// `redis.min_replicas_acked` acknowledged it in time: the job waits.
pub fn send_mark_unreplicated() {
    metrics::counter!("mailgate_send_marks_unreplicated_total").increment(1);
}

/// A relay said a job's mailbox does not exist.
pub fn bounced() {
    metrics::counter!("mailgate_bounces_total").increment(1);
}

/// A message went to the dead-letter queue.
pub fn dead_lettered() {
    metrics::counter!("mailgate_dead_letters_total").increment(1);
}

/// One SMTP send took `took`.
pub fn smtp_send(outcome: &'static str, took: Duration) {
    metrics::histogram!("mailgate_smtp_send_seconds", "outcome" => outcome)
        .record(took.as_secs_f64());
}

/// Counts one job in flight for as long as it lives, even if its task is
/// aborted.
#[derive(Debug)]
pub struct InFlight(());

impl InFlight {
    /// A job starts.
    pub fn enter() -> Self {
        metrics::gauge!("mailgate_jobs_in_flight").increment(1.0);
        Self(())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        metrics::gauge!("mailgate_jobs_in_flight").decrement(1.0);
    }
}

/// Whether some SMTP relay works, as [`crate::mailer::Mailer::relay_health`]
/// says: `mailgate_smtp_relay_up` is 1 or 0.
pub fn smtp_relay_up(up: bool) {
    metrics::gauge!("mailgate_smtp_relay_up").set(if up { 1.0 } else { 0.0 });
}

/// A rule of `scope` is configured (or a domain's network share of one):
/// its series start at zero, so that the first job it rejects, or would
/// have rejected (a shadow rule), shows in `increase`:
/// `mailgate_limiter_decisions_total{verdict="rejected"}` for an enforced
/// rule, `mailgate_limiter_shadow_rejections_total` for a shadow one.
pub fn rule_registered(scope: &'static str, window_ms: u64, max: u32, enforced: bool) {
    let (window_ms, max) = (window_ms.to_string(), max.to_string());
    if enforced {
        metrics::counter!(
            "mailgate_limiter_decisions_total",
            "verdict" => "rejected",
            "scope" => scope,
            "window_ms" => window_ms,
            "max" => max,
        )
        .increment(0);
    } else {
        metrics::counter!(
            "mailgate_limiter_shadow_rejections_total",
            "scope" => scope,
            "window_ms" => window_ms,
            "max" => max,
        )
        .increment(0);
    }
}

/// A relay is set up: its counters and circuit gauge start at 0 (closed),
/// so they show before its first mail.
pub fn smtp_relay_registered(relay: &str) {
    let r = relay.to_owned();
    metrics::counter!("mailgate_smtp_relay_sends_total", "relay" => r.clone()).increment(0);
    metrics::counter!("mailgate_smtp_relay_failures_total", "relay" => r.clone()).increment(0);
    metrics::counter!("mailgate_bounces_doubted_total", "relay" => r.clone()).increment(0);
    metrics::gauge!("mailgate_smtp_relay_circuit", "relay" => r).set(0.0);
}

/// `relay` said a mailbox does not exist (5.1.1) past the run of them it
/// is believed for, of the recipient's domain or of any
/// (`mailer::relays`'s bounce runs): not taken as grounds to suppress it.
pub fn bounce_doubted(relay: &str) {
    metrics::counter!("mailgate_bounces_doubted_total", "relay" => relay.to_owned()).increment(1);
}

/// `relay` accepted a mail.
pub fn smtp_relay_sent(relay: &str) {
    metrics::counter!("mailgate_smtp_relay_sends_total", "relay" => relay.to_owned()).increment(1);
}

/// `relay` failed at relay level (counted against its circuit).
pub fn smtp_relay_failed(relay: &str) {
    metrics::counter!("mailgate_smtp_relay_failures_total", "relay" => relay.to_owned())
        .increment(1);
}

/// `relay`'s circuit: 0 closed, 1 half-open, 2 open.
pub fn smtp_relay_circuit(relay: &str, state: f64) {
    metrics::gauge!("mailgate_smtp_relay_circuit", "relay" => relay.to_owned()).set(state);
}
