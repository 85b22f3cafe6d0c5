use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::{Clock, Keyspace, LimitError, Subject, Usage, usage_of};
use crate::domain::Name;
use crate::settings::RedisSettings;

/// The tools' script; its header documents KEYS and ARGV.
static TOOLS: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("tools.lua")));

/// Opens a multiplexed connection to Redis that reconnects by itself after
/// Redis comes back (a call made while it is away fails, and the caller
/// treats that as transient). Fails if Redis does not answer now, so a bad
/// URL shows at start-up.
pub(crate) async fn connect(redis: &RedisSettings) -> Result<ConnectionManager, redis::RedisError> {
    // redis-rs leaves Nagle's algorithm on. Requests go out back to back on
    // the one multiplexed connection, and a batch of admissions can span
    // several segments on a real network: the last, short segment would
    // wait for the ACK of the ones before it, which Redis may delay (it has
    // no whole command to answer yet) by up to its delayed-ACK timeout.
    let info = redis::IntoConnectionInfo::into_connection_info(redis.url.as_str())?
        .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
    let client = redis::Client::open(info)?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(5)))
        .set_response_timeout(Some(Duration::from_secs(5)))
        .set_number_of_retries(2);
    ConnectionManager::new_with_config(client, config).await
}

/// See [`super::Quotas::usage`]: one scope key's log, read by the tools' script.
pub(crate) async fn usage(
    conn: &ConnectionManager,
    keys: &Keyspace,
    subject: Subject<'_>,
    purpose: Option<&Name>,
    clock: Clock,
) -> Result<Usage, LimitError> {
    let (key, set) = keys.lookup(subject, purpose);
    let reply: Vec<i64> = TOOLS
        .key(&key)
        .arg("peek")
        .arg(match clock {
            Clock::Server => String::new(),
            Clock::At(ms) => ms.to_string(),
        })
        .invoke_async(&mut conn.clone())
        .await?;
    let mut values = reply.into_iter().map(|v| u64::try_from(v).unwrap_or(0));
    let now = values
        .next()
        .ok_or_else(|| LimitError::Protocol("empty peek reply".into()))?;
    let times: Vec<u64> = values.collect();
    Ok(usage_of(key, subject.scope(), &set.rules, &times, now))
}

/// See [`super::Quotas::reset`].
pub(crate) async fn reset(
    conn: &ConnectionManager,
    keys: &Keyspace,
    subject: Subject<'_>,
) -> Result<(String, u64), LimitError> {
    let key = keys.key_of(subject);
    let removed: i64 = TOOLS
        .key(&key)
        .arg("reset")
        .invoke_async(&mut conn.clone())
        .await?;
    Ok((key, u64::try_from(removed).unwrap_or(0)))
}
