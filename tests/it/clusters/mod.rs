//! Redis and RabbitMQ deployed as clusters of the tests' own: Redis
//! Cluster (one slot, or keys spread over the shards, and resharding),
//! Sentinel failover, and a three-node RabbitMQ.

mod rabbitmq;
mod redis;
mod redis_failover;
mod redis_migrating;
mod redis_reshard;
mod redis_spread;
mod sentinel_forced;
