//! The store's one error.

/// Why Redis (or the in-memory store) could not answer the ledger, the
/// limiter's tools or the overrides. Transient from a job's point of view:
/// the job is retried or waits, never answered with it. One error for the
/// whole store, so every caller judges an outage alike ([`Self::is_outage`]).
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// Redis could not be reached or returned an error (the source).
    /// Shared, because one failed script call fails every request batched
    /// into it.
    #[error("redis")]
    Redis(#[source] std::sync::Arc<::redis::RedisError>),
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
    /// A key holds an earlier build's form, which this build does not read
    /// (`mailgate admin migrate` converts it): nothing was written, and the
    /// job waits, as in an outage, until it is converted.
    #[error("{0}")]
    Unmigrated(String),
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
    /// late after it was sent: `STALE`, a key of an earlier build's form
    /// not yet migrated: `UNMIGRATED`), rather than anything
    /// about the job: the job waits
    /// without spending an attempt, and workers take no jobs until it
    /// passes.
    pub fn is_outage(&self) -> bool {
        match self {
            StoreError::Redis(e) => {
                use ::redis::ErrorKind;
                // BUSY (a script running past its limit) is the server's
                // state, not the job's: it must not spend attempts.
                const OUTAGES: [&str; 12] = [
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
                    // A key of an earlier build's form (scope.lua).
                    "UNMIGRATED",
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
            StoreError::Unreplicated(_) | StoreError::Unmigrated(_) => true,
            StoreError::Protocol(_) | StoreError::Unfit(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::StoreError;

    /// Guards the split between what failed and why: the Redis error is
    /// the store error's source (not only text in its message), and what
    /// logs and results show of it still names both.
    #[test]
    fn a_redis_error_is_the_source_and_the_line_shows_both() {
        let redis = ::redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "connection refused",
        ));
        let cause = redis.to_string();
        let e = StoreError::from(redis);
        assert_eq!(e.to_string(), "redis");
        let source = e.source().expect("the redis error is the source");
        // Shared (`Arc`), as the variant holds it.
        let source = (source.downcast_ref::<std::sync::Arc<::redis::RedisError>>())
            .expect("the source is the redis error");
        assert_eq!(source.kind(), ::redis::ErrorKind::Io);
        assert_eq!(source.to_string(), cause);
        assert_eq!(crate::report::one_line(&e), format!("redis: {cause}"));
        assert!(e.is_outage(), "an I/O error is still judged an outage");
    }
}
