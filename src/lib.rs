//! mailgate: sends verification codes by mail without letting anyone abuse it.
//!
//! Producers publish "send code" jobs to RabbitMQ; a pool of workers runs each
//! through an exact multi-window rate limiter ([`limiter`]) keyed by mailbox,
//! client network and mail domain, renders and mails the code, and publishes
//! the outcome.
//!
//! # Layout
//!
//! A job goes decode → screen → admit → deliver → settle; each stage is a
//! module, [`pipeline`] alone combines them, [`worker`] runs the loop.
//! `docs/architecture.md` draws it and says where a change goes. Each
//! module may import only the modules listed beside it, so the arrows
//! point one way and a module never reaches up (`tests/it/tools/layout.rs`
//! reads this table and checks every `crate::` path against it):
//!
//! | module | what it is | may import |
//! |---|---|---|
//! | [`domain`] | parsed input types (mailbox, IP, job, scopes), clocks | nothing |
//! | [`redact`] | what logs may show of a URL, a password or a mailbox | nothing |
//! | [`report`] | how an error is shown: with its causes, on one line, said once | nothing |
//! | [`tls`] | rustls configuration for every link | report |
//! | [`wire`] | the job and result JSON of the contract | domain |
//! | [`settings`] | configuration, a file per large section, checked at load | domain, redact, report, tls |
//! | [`telemetry`] | metric names and recorders | domain, wire |
//! | [`limiter`] | stage: the rate limiter's decision, keys, overrides' matching | domain, settings |
//! | [`store`] | Redis: the connection, every Lua script, the overrides' storage | domain, settings, tls, redact, report, limiter |
//! | [`ledger`] | stage: each job's record and lifecycle (admit, send, settle) | domain, settings, report, limiter, store |
//! | [`templates`] | stage: rendering the mail | domain, settings, wire |
//! | [`mailer`] | stage: composing and sending over SMTP, relays, circuits | domain, settings, tls, redact, report, telemetry |
//! | [`broker`] | stage: RabbitMQ queues, confirms, retries, dead letters | domain, settings, tls, redact, report |
//! | [`pipeline`] | one job through the stages; answer, retry, wait or dead-letter | domain, settings, redact, report, wire, telemetry, limiter, ledger, templates, mailer |
//! | [`traces`] | W3C trace context across the queue, OTLP export | settings, redact, broker |
//! | [`http`] | `/metrics`, `/healthz`, `/readyz` | telemetry |
//! | [`worker`] | the consume loop: concurrency, reconnects, shutdown | all of the above |
//! | [`cli`] | the command line: an edge, like `main` | all of the above |
//!
//! The promises every module keeps are in `docs/contract.md`, the one
//! normative text; module docs point there rather than restate it.

pub mod broker;
pub mod cli;
pub mod domain;
pub mod http;
pub mod ledger;
pub mod limiter;
pub mod mailer;
pub mod pipeline;
pub mod redact;
pub mod report;
pub mod settings;
pub mod store;
pub mod telemetry;
pub mod templates;
pub mod tls;
pub mod traces;
pub mod wire;
pub mod worker;
