use std::sync::LazyLock;

use super::conn::Conn;

use super::{Clock, Keyspace, LimitError, Subject, Usage, usage_of};
use crate::domain::Name;

/// The tools' script; its header documents KEYS and ARGV.
static TOOLS: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("tools.lua")));

/// See [`super::Quotas::usage`]: one scope key's log, read by the tools' script.
pub(crate) async fn usage(
    conn: &Conn,
    keys: &Keyspace,
    subject: Subject<'_>,
    purpose: Option<&Name>,
    clock: Clock,
) -> Result<Usage, LimitError> {
    let (key, set, hit) = keys.lookup(subject, purpose);
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
    let exempt = keys.exempts(subject);
    Ok(usage_of(
        key,
        subject.scope(),
        &set,
        hit.as_ref(),
        &times,
        now,
        exempt,
    ))
}

/// See [`super::Quotas::reset`].
pub(crate) async fn reset(
    conn: &Conn,
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
