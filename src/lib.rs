//! mailgate: sends verification codes by mail without letting anyone abuse it.
//!
//! Producers publish "send code" jobs to RabbitMQ; a pool of workers runs each
//! through an exact multi-window rate limiter ([`limiter`]) keyed by mailbox and
//! client IP, renders and mails the code, and publishes the outcome.
//!
//! Layout: [`domain`] holds parsed input types and depends on nothing;
//! [`limiter`] is a stage depending only on `domain` and [`settings`].

#![warn(missing_docs)]

pub mod broker;
pub mod cli;
pub mod domain;
pub mod http;
pub mod ledger;
pub mod limiter;
pub mod mailer;
pub mod pipeline;
pub mod redact;
pub mod settings;
pub mod store;
pub mod telemetry;
pub mod templates;
pub mod tls;
pub mod traces;
pub mod wire;
pub mod worker;
