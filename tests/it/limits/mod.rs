//! The limiter's decisions: one conformance suite for every backend, a
//! property model, the operators' controls end to end, and Redis's clock.

mod clock;
mod conformance;
mod controls;
mod props;
