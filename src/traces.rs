//! Traces across the queue. A producer that publishes a job with a W3C
//! `traceparent` (and `tracestate`) header sees mailgate's work for it in
//! the same trace: the job's `process` span continues the producer's
//! context, its stages (limiter decision, render, SMTP send, result
//! publish) are its children, and the result carries a `traceparent` of
//! the same trace. A job without one starts a trace. Spans go out over
//! OTLP/HTTP (JSON) when `[telemetry] otlp_endpoint` is set; otherwise none
//! are made (they would cost every job CPU for nothing) and a result
//! carries its job's trace context as it came.
//!
//! Attribute names follow the OpenTelemetry messaging conventions for
//! RabbitMQ (`messaging.system`, `messaging.operation.type`,
//! `messaging.destination.name`); no span carries a mailbox address.

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator as _};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::broker::{TRACEPARENT_HEADER, TRACESTATE_HEADER, TraceHeaders};

/// Why the trace exporter could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TracesError {
    /// The OTLP exporter refused its configuration (the endpoint).
    #[error("the OTLP exporter for {endpoint}: {why}")]
    Exporter {
        /// The endpoint, as configured.
        endpoint: String,
        /// What the exporter said.
        why: String,
    },
}

/// The span pipeline: a tracer provider exporting to `endpoint` (the
/// collector's base URL, e.g. `http://otel-collector:4318`; spans go to
/// `<endpoint>/v1/traces`). Keep it for the life of the process and
/// [`shutdown`] it at the end, so the last spans are sent.
pub fn provider(endpoint: &str) -> Result<SdkTracerProvider, TracesError> {
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name("mailgate")
        .build();
    let builder = SdkTracerProvider::builder().with_resource(resource);
    use opentelemetry_otlp::WithExportConfig as _;
    let url = match endpoint.trim_end_matches('/') {
        e if e.ends_with("/v1/traces") => e.to_owned(),
        e => format!("{e}/v1/traces"),
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpJson)
        .with_endpoint(url.clone())
        // Short: the last export runs at shutdown, inside the grace period
        // (deploy/k8s gives 15 s beyond worker.shutdown_timeout).
        .with_timeout(std::time::Duration::from_secs(5))
        .build()
        .map_err(|e| TracesError::Exporter {
            endpoint: crate::redact::redact_url(endpoint),
            // Its text may quote the URL, password and all.
            why: e
                .to_string()
                .replace(&url, &crate::redact::redact_url(&url)),
        })?;
    Ok(builder.with_batch_exporter(exporter).build())
}

/// The `tracing` layer that turns mailgate's spans into OpenTelemetry
/// spans of `provider`.
pub fn layer<S>(provider: &SdkTracerProvider) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    tracing_opentelemetry::layer().with_tracer(provider.tracer("mailgate"))
}

/// Sends the spans not sent yet, within the exporter's timeout.
pub fn shutdown(provider: SdkTracerProvider) {
    if let Err(e) = provider.shutdown() {
        eprintln!("warning: the last spans could not be exported: {e}");
    }
}

/// Makes `span` continue the trace `headers` carry (a producer's
/// `traceparent`); without a valid one, `span` starts a trace of its own.
pub fn continue_trace(span: &tracing::Span, headers: &TraceHeaders) {
    if headers.traceparent.is_none() {
        return;
    }
    let cx = TraceContextPropagator::new().extract(headers);
    // Refused only when no OpenTelemetry layer is installed (tests that
    // run the worker in-process): there is no trace to continue then.
    let _ = span.set_parent(cx);
}

/// Names `span` a RabbitMQ messaging span (the OpenTelemetry messaging
/// conventions): `operation` (`process`, `send`) on `destination`. Set as
/// OpenTelemetry attributes, not `tracing` fields, so logs stay short.
pub fn messaging(span: &tracing::Span, operation: &'static str, destination: &str) {
    span.set_attribute("messaging.system", "rabbitmq");
    span.set_attribute("messaging.operation.type", operation);
    span.set_attribute("messaging.operation.name", operation);
    span.set_attribute("messaging.destination.name", destination.to_owned());
}

/// The trace context of `span`, as headers for a message it sends; none
/// when no spans are made (no exporter).
pub fn headers_of(span: &tracing::Span) -> Option<TraceHeaders> {
    use opentelemetry::trace::TraceContextExt as _;
    let cx = span.context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut headers = TraceHeaders::default();
    TraceContextPropagator::new().inject_context(&cx, &mut headers);
    Some(headers)
}

impl Extractor for TraceHeaders {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            TRACEPARENT_HEADER => self.traceparent.as_deref(),
            TRACESTATE_HEADER => self.tracestate.as_deref(),
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        vec![TRACEPARENT_HEADER, TRACESTATE_HEADER]
    }
}

impl Injector for TraceHeaders {
    fn set(&mut self, key: &str, value: String) {
        match key {
            TRACEPARENT_HEADER => self.traceparent = Some(value),
            TRACESTATE_HEADER if !value.is_empty() => self.tracestate = Some(value),
            _ => {}
        }
    }
}
