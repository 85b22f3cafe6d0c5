//! `redis.min_replicas_acked`: how many replicas must hold a send mark
//! before its job is sent, and what happens when fewer do.

use backon::Retryable as _;

use super::RedisLedger;
use crate::ledger::{JobRef, Ledger, LedgerError};

/// `redis.min_replicas_acked` and its timeout: how a batch that sets a send
/// mark waits for replicas (`WAIT`) before its items are answered.
#[derive(Debug, Clone, Copy)]
pub(super) struct Replication {
    /// Replicas that must acknowledge; 0 waits for none.
    pub(super) replicas: u32,
    /// The longest wait, ms (at least 1: `WAIT n 0` would block forever).
    pub(super) timeout_ms: u64,
}

impl RedisLedger {
    /// After `job`'s send mark was set by a batch too few replicas
    /// acknowledged (`acked`): gives the mark back, so that a retry resumes
    /// the job rather than finding its delivery unknown, and fails.
    pub(super) async fn unreplicated(&self, job: &JobRef<'_>, acked: i64) -> LedgerError {
        // Retried while Redis is away: the failover that kept the replicas
        // from acknowledging also stops writes for a moment (behind
        // Sentinel, while it is under way), and a mark left standing would
        // answer the job "delivery unknown" though its send never began
        // (found by review: 29 of 3 000 jobs over six forced failovers).
        let given_back = (|| self.release(job))
            .retry(crate::ledger::outage_backoff())
            .when(LedgerError::is_outage)
            .await;
        if let Err(e) = given_back {
            tracing::warn!(error = %crate::report::one_line(&e), "could not give back a send mark the replicas did not acknowledge");
        }
        LedgerError::Unreplicated(format!(
            "{acked} of the {} or more Redis replicas asked for acknowledged the send mark \
             within {} ms (redis.min_replicas_acked, and behind Sentinel every replica it could \
             promote); it was given back, and the job is not sent now",
            self.replication.replicas, self.replication.timeout_ms
        ))
    }

    /// A sent settle too few replicas acknowledged (`acked`): written
    /// again (the same end again changes nothing) once the replicas
    /// answer, for the caller retries an outage.
    pub(super) fn settle_unreplicated(&self, acked: i64) -> LedgerError {
        LedgerError::Unreplicated(format!(
            "{acked} of the {} or more Redis replicas asked for acknowledged that the job was \
             sent within {} ms; it is written again",
            self.replication.replicas, self.replication.timeout_ms
        ))
    }

    /// With `redis.min_replicas_acked` set: whether the primary has that
    /// many replicas online now (connected and synced; if not, no job can
    /// be sent).
    pub(super) async fn replicas_connected(&self) -> Result<(), LedgerError> {
        if self.replication.replicas == 0 {
            return Ok(());
        }
        let (conn, wanted) = self
            .conn
            .pin(self.replication.replicas)
            .await
            .map_err(|e| self.unfit(e))?;
        let on = (!self.spread).then_some(self.keys.prefix.as_str());
        let infos = conn
            .info("replication", on)
            .await
            .map_err(|e| self.unfit(e))?;
        // `slave0:ip=…,port=…,state=online,offset=…,lag=…`: a replica still
        // in its first sync is connected but acknowledges nothing yet. Spread
        // over shards, the primary with the fewest counts.
        let online = infos
            .iter()
            .map(|info| {
                info.lines()
                    .filter(|l| l.starts_with("slave") && l.contains("state=online"))
                    .count()
            })
            .min()
            .unwrap_or(0);
        if online < wanted as usize {
            return Err(LedgerError::Unreplicated(format!(
                "the Redis primary has {online} replicas online and {wanted} must acknowledge \
                 each send mark (redis.min_replicas_acked is {}; behind Sentinel, every replica \
                 it could promote must): no job can be sent until enough are back",
                self.replication.replicas
            )));
        }
        Ok(())
    }
}
