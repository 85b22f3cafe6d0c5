//! Stopping: no SMTP transaction begins any more, the consumers are
//! cancelled, jobs whose transaction had not begun are handed back, and the
//! transactions under way finish, all within `worker.shutdown_timeout`.

use std::time::Duration;

use futures_lite::StreamExt;
use tokio::task::JoinSet;

use super::Worker;
use super::job::finished;
use crate::broker::{Broker, Consumers, Incoming};
use crate::ledger::Ledger;

impl<L: Ledger + 'static> Worker<L> {
    /// Stops within `worker.shutdown_timeout` whatever the broker does (a
    /// memory alarm can hold a cancel, a publish or a close indefinitely):
    /// no SMTP transaction begins any more; cancel the consumers; hand back
    /// every job whose transaction had not begun, those still in the
    /// consumers' buffers too; let the transactions under way finish;
    /// close the connection. Each step is bounded by what is left of the
    /// timeout. What is unfinished then stays unacknowledged and RabbitMQ
    /// hands it to another worker.
    pub(super) async fn stop(
        &self,
        broker: &Broker,
        tag: &str,
        tasks: &mut JoinSet<()>,
        consumers: &mut Consumers,
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
                tracing::warn!(error = %crate::report::one_line(&e), "could not cancel the consumer");
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
        // Jobs that ended are still in the set until joined: not in flight.
        while tasks.try_join_next().is_some() {}
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

    /// Stops while not connected: nothing can be handed back but by the
    /// lost connection's end, so jobs in flight finish or are abandoned
    /// unacknowledged.
    pub(super) async fn stop_unconnected(&self, tasks: &mut JoinSet<()>) {
        self.stopping.begin();
        self.cancelled.send_replace(Some(false));
        let deadline = tokio::time::Instant::now() + self.settings.worker.shutdown_timeout;
        self.drain(tasks, deadline).await;
    }

    /// Gives a job that had not begun its SMTP transaction back to
    /// RabbitMQ, the worker stopping: once RabbitMQ confirmed that this
    /// worker's consumers are cancelled (before, it could hand the job
    /// straight back here). Unconfirmed, the job stays unacknowledged and
    /// closing the connection returns it.
    pub(super) async fn hand_back(&self, job: &Incoming) {
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
