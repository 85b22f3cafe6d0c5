//! Every integration test, in one binary: one link instead of one per
//! suite (29 binaries each linking the whole dependency tree took most
//! of CI's time and filled a CI machine's disk). Each suite is a module
//! of its own file, named as before (`faults::…`, `worker::…`).

mod common;

#[path = "cli.rs"]
mod cli;
#[path = "clock.rs"]
mod clock;
#[path = "controls.rs"]
mod controls;
#[path = "decode_props.rs"]
mod decode_props;
#[path = "docs_configs.rs"]
mod docs_configs;
#[path = "example_producer.rs"]
mod example_producer;
#[path = "faults.rs"]
mod faults;
#[path = "hostile.rs"]
mod hostile;
#[path = "http.rs"]
mod http;
#[path = "hygiene.rs"]
mod hygiene;
#[path = "ledger_conformance.rs"]
mod ledger_conformance;
#[path = "ledger_redis.rs"]
mod ledger_redis;
#[path = "limiter_conformance.rs"]
mod limiter_conformance;
#[path = "limiter_props.rs"]
mod limiter_props;
#[path = "lost_replies.rs"]
mod lost_replies;
#[path = "mailer.rs"]
mod mailer;
#[path = "pipeline.rs"]
mod pipeline;
#[path = "promises.rs"]
mod promises;
#[path = "queue_type.rs"]
mod queue_type;
#[path = "rabbit_cluster.rs"]
mod rabbit_cluster;
#[path = "redelivery.rs"]
mod redelivery;
#[path = "redis_cluster.rs"]
mod redis_cluster;
#[path = "redis_failover.rs"]
mod redis_failover;
#[path = "redis_spread.rs"]
mod redis_spread;
#[path = "relays.rs"]
mod relays;
#[path = "reshard.rs"]
mod reshard;
#[path = "settings.rs"]
mod settings;
#[path = "templates.rs"]
mod templates;
#[path = "traces.rs"]
mod traces;
#[path = "transport.rs"]
mod transport;
#[path = "worker.rs"]
mod worker;
