//! The HTTP endpoint, served from the start of [`super::build`], and what
//! `/readyz` says until the worker runs.

use std::sync::Arc;

use anyhow::Context as _;

use super::Worker;
use crate::ledger::Ledger;
use crate::settings::HttpSettings;

/// The HTTP endpoint, served from the start of [`super::build`], so
/// `/healthz` answers (and `/readyz` says "starting") while the worker still
/// loads its templates and connects to Redis, however long that takes.
/// Dropping it stops it.
pub(super) struct Endpoint<L> {
    /// Where `/metrics`, `/healthz` and `/readyz` are served.
    pub(super) addr: std::net::SocketAddr,
    pub(super) starting: Arc<Starting<L>>,
    stop: Arc<tokio::sync::Notify>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl<L: Ledger + 'static> Endpoint<L> {
    /// Listens on `http.listen` and serves from now on.
    pub(super) async fn bind(http: &HttpSettings) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind(http.listen)
            .await
            .with_context(|| {
                format!("listening on {} (set MAILGATE__HTTP__LISTEN)", http.listen)
            })?;
        let addr = listener.local_addr()?;
        tracing::info!(addr = %addr, "serving /metrics, /healthz, /readyz");
        Ok(Self::serve(listener, addr))
    }

    fn serve(listener: tokio::net::TcpListener, addr: std::net::SocketAddr) -> Self {
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
            addr,
            starting,
            stop,
            task: Some(task),
        }
    }

    /// From now on `/readyz` asks `worker`.
    pub(super) fn hand_over(&self, worker: Arc<Worker<L>>) {
        let _ = self.starting.worker.set(worker);
    }

    /// Stops serving and waits until every connection is closed.
    pub(super) async fn stop(mut self) {
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
pub(super) struct Starting<L> {
    worker: std::sync::OnceLock<Arc<Worker<L>>>,
    /// What start-up waits on: the dependency (or "worker") and why, as
    /// `/readyz` says it until the worker runs.
    status: std::sync::Mutex<(&'static str, String)>,
}

impl<L> Starting<L> {
    /// Says what start-up waits on: `what` (a dependency), and why.
    pub(super) fn set(&self, what: &'static str, why: String) {
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
            // so they are reported neither up nor down.
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
