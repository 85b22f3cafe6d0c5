//! The operator's HTTP endpoint: `/metrics` (Prometheus text), `/healthz`
//! (the process is alive) and `/readyz` (RabbitMQ, Redis and SMTP answer).

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;

/// What `/readyz` asks: each dependency by name, and whether it answers.
pub trait Readiness: Send + Sync + 'static {
    /// `(name, Ok(()) or Err(why))` per dependency.
    fn check(&self) -> impl Future<Output = Vec<(&'static str, Result<(), String>)>> + Send;
}

/// Serves the endpoints on `listener` until `shutdown` completes.
pub async fn serve<R: Readiness>(
    listener: TcpListener,
    ready: Arc<R>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz::<R>))
        .with_state(ready);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

async fn metrics() -> impl IntoResponse {
    (
        [("content-type", "text/plain; version=0.0.4")],
        crate::telemetry::prometheus().render(),
    )
}

async fn readyz<R: Readiness>(State(ready): State<Arc<R>>) -> impl IntoResponse {
    let checks = ready.check().await;
    let ok = checks.iter().all(|(_, r)| r.is_ok());
    let body: String = checks
        .iter()
        .map(|(name, r)| match r {
            Ok(()) => format!("{name}: ok\n"),
            Err(e) => format!("{name}: {e}\n"),
        })
        .collect();
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, body)
}
