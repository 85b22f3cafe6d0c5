//! The operator's HTTP endpoint: `/metrics` (Prometheus text), `/healthz`
//! (the process is alive) and `/readyz` (RabbitMQ, Redis and SMTP answer).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// What `/readyz` asks: each dependency by name, and whether it answers.
pub trait Readiness: Send + Sync + 'static {
    /// `(name, Ok(()) or Err(why))` per dependency.
    fn check(&self) -> impl Future<Output = Vec<(&'static str, Result<(), String>)>> + Send;
}

/// Most connections served at once; one more is closed as soon as it is
/// accepted, so idle clients cannot use up the worker's file descriptors.
pub const MAX_CONNECTIONS: usize = 32;
/// How long a client may take to send a request's headers.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest a connection is kept, requests and idle keep-alive included.
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(30);

/// Serves the endpoints on `listener` until `shutdown` completes. Every
/// connection is bounded ([`MAX_CONNECTIONS`], [`HEADER_TIMEOUT`],
/// [`CONNECTION_LIFETIME`]), and shutdown closes every connection at once:
/// it never waits on a client.
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
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Out of file descriptors, most likely: let some close.
                        tracing::warn!(error = %e, "the HTTP endpoint cannot accept");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    continue; // over the cap: dropped, so closed at once
                };
                let service = TowerToHyperService::new(app.clone());
                connections.spawn(async move {
                    let connection = http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(HEADER_TIMEOUT)
                        .serve_connection(TokioIo::new(stream), service);
                    let _ = tokio::time::timeout(CONNECTION_LIFETIME, connection).await;
                    drop(slot);
                });
            }
            Some(_) = connections.join_next() => {}
        }
    }
    connections.abort_all();
    Ok(())
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
