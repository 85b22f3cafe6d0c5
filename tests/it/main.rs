//! Every integration test, in one binary (one link for all of them), with a
//! folder per concern:
//!
//! - `guarantees/`: the promises end to end, one file per promise (mailed
//!   once, always answered, the pool flows, outages waited out, limits hold);
//! - `limits/`: the limiter's decisions (conformance in every backend, a
//!   property model, operators' controls, Redis's clock);
//! - `ledger/`: the job ledger's lifecycle, and the Redis ledger's own
//!   properties;
//! - `clusters/`: Redis Cluster, Sentinel failover, spread keys, resharding,
//!   a RabbitMQ cluster;
//! - `mail/`: the mailer against real SMTP servers, several relays, the
//!   templates;
//! - `security/`: TLS on every link, hostile input, secrets kept out of
//!   every output;
//! - `worker/`: the job path end to end, the pipeline's decisions, queue
//!   types, the decoder, the HTTP endpoint, traces;
//! - `tools/`: the command line, the README's producer, the shipped
//!   configs, settings from the environment.
//!
//! One folder alone: `cargo nextest run --test it -E 'test(/^guarantees::/)'`.

// A scenario against the real services reads top to bottom, set-up to
// checks: the house's 80-line limit is for the code under test.
#![allow(clippy::too_many_lines)]

mod common;

mod clusters;
mod guarantees;
mod ledger;
mod limits;
mod mail;
mod security;
mod tools;
mod worker;
