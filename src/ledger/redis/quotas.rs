//! The support tools' questions ([`Quotas`]) of the ledger in Redis: one
//! scope key's log, read or cleared by the tools' script.

use super::RedisLedger;
use crate::domain::Name;
use crate::ledger::LedgerError;
use crate::limiter::{Clock, Quotas, Subject, Usage, usage_of};
use crate::store::scripts::TOOLS;

impl Quotas for RedisLedger {
    type Error = LedgerError;

    async fn usage(
        &self,
        subject: Subject<'_>,
        purpose: Option<&Name>,
        clock: Clock,
    ) -> Result<Usage, LedgerError> {
        let keys = &self.keys;
        let (key, set, hit) = keys.lookup(subject, purpose);
        let reply: Vec<i64> = TOOLS
            .key(&key)
            .arg("peek")
            .arg(match clock {
                Clock::Server => String::new(),
                Clock::At(ms) => ms.to_string(),
            })
            .invoke_async(&mut self.conn.clone())
            .await?;
        let mut values = reply.into_iter().map(|v| u64::try_from(v).unwrap_or(0));
        let now = values
            .next()
            .ok_or_else(|| LedgerError::Protocol("empty peek reply".into()))?;
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

    async fn reset(&self, subject: Subject<'_>) -> Result<(String, u64), LedgerError> {
        let key = self.keys.key_of(subject);
        let removed: i64 = TOOLS
            .key(&key)
            .arg("reset")
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok((key, u64::try_from(removed).unwrap_or(0)))
    }
}
