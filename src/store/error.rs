//! The store's one error.

/// Why Redis (or the in-memory store) could not answer the ledger, the
/// limiter's tools or the overrides. Transient from a job's point of view:
/// the job is retried or waits, never answered with it. One error for the
/// whole store, so every caller judges an outage alike ([`Self::is_outage`]).
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// Redis could not be reached or returned an error. Shared, because one
    /// failed script call fails every request batched into it.
    #[error("redis: {0}")]
    Redis(std::sync::Arc<::redis::RedisError>),
    /// Redis answered something this build does not understand.
    #[error("unexpected reply from Redis: {0}")]
    Protocol(String),
    /// The store cannot keep the ledger's promises (e.g. it evicts keys).
    #[error("{0}")]
    Unfit(String),
    /// Fewer Redis replicas than `redis.min_replicas_acked` acknowledged a
    /// send mark in time (or are online now): the mark was given back and
    /// the job is not sent now. Transient.
    #[error("{0}")]
    Unreplicated(String),
}

impl From<::redis::RedisError> for StoreError {
    fn from(e: ::redis::RedisError) -> Self {
        StoreError::Redis(std::sync::Arc::new(e))
    }
}

impl StoreError {
    /// Whether this says the store is out of reach or not serving for now
    /// (no connection, a timeout, a server loading its data, busy with a
    /// script, out of memory, failing to persist, or between primaries, a
    /// cluster without a slot's owner, replicas that did not acknowledge, a
    /// clock too far from the worker's: `CLOCKSKEW`, a call that ran too
    /// late after it was sent: `STALE`), rather than anything
    /// about the job: the job waits
    /// without spending an attempt, and workers take no jobs until it
    /// passes.
    pub fn is_outage(&self) -> bool {
        match self {
            StoreError::Redis(e) => {
                use ::redis::ErrorKind;
                // BUSY (a script running past its limit) is the server's
                // state, not the job's: it must not spend attempts.
                const OUTAGES: [&str; 11] = [
                    "LOADING",
                    "MASTERDOWN",
                    "READONLY",
                    "CLUSTERDOWN",
                    "TRYAGAIN",
                    "CLOCKSKEW",
                    "STALE",
                    "BUSY",
                    "OOM",
                    "NOREPLICAS",
                    "MISCONF",
                ];
                // A script call sent with WAIT fails as a pipeline: each
                // failed command's code counts.
                let in_pipeline = ((**e).clone().into_server_errors()).is_some_and(|errors| {
                    errors.iter().any(|(_, se)| OUTAGES.contains(&se.code()))
                });
                matches!(
                    e.kind(),
                    ErrorKind::Io
                        | ErrorKind::ClusterConnectionNotFound
                        | ErrorKind::MasterNameNotFoundBySentinel
                        | ErrorKind::NoValidReplicasFoundBySentinel
                ) || e.is_connection_dropped()
                    || e.is_timeout()
                    || e.code().is_some_and(|code| OUTAGES.contains(&code))
                    || in_pipeline
            }
            StoreError::Unreplicated(_) => true,
            StoreError::Protocol(_) | StoreError::Unfit(_) => false,
        }
    }
}
