//! The job ledger: one conformance suite for its lifecycle in both
//! backends, and what only the Redis ledger promises.

mod commit;
mod conformance;
mod functions;
mod race;
mod redis;
