//! The ledger's side of the clock watch ([`crate::ledger::clock`]): each
//! primary's clock, and `clock.lua` (the canary and the mark of
//! a lost key).

use super::RedisLedger;
use crate::ledger::LedgerError;
use crate::ledger::clock::{self, Mark, Readings};
use crate::store::scripts::CLOCK;

impl RedisLedger {
    /// The clock watch's keys (`clock.lua`): the mark, the
    /// canary and when it was last refreshed, under the prefix and in one
    /// slot (the prefix's hash tag, or without one `{clock}`).
    fn clock_keys(&self) -> [String; 3] {
        crate::limiter::families::clock_keys(&self.keys.prefix)
    }

    /// Runs `clock.lua` as `how`: whether it found a loss (or,
    /// on "accept", removed a mark), and the standing mark's until (0:
    /// none).
    async fn clock_op(&self, how: &str) -> Result<(bool, u64), LedgerError> {
        let life = clock::canary_ms(self.keys.clock_guard_ms.unwrap_or(0));
        let hold = self.keys.horizon_ms();
        let mut script = CLOCK.prepare_invoke();
        for key in self.clock_keys() {
            script.key(key);
        }
        let reply: Vec<u64> = script
            .arg(how)
            .arg(life)
            .arg(hold)
            .invoke_async(&mut self.conn.clone())
            .await?;
        match reply[..] {
            [_, until, found] => Ok((found == 1, until)),
            _ => Err(LedgerError::Protocol(format!("a clock reply: {reply:?}"))),
        }
    }

    /// Removes a [`Mark`] (an operator accepts that codes admitted before
    /// Redis's clock ran ahead may be mailed again) and re-arms the canary;
    /// whether there was one.
    pub async fn clear_clock_mark(&self) -> Result<bool, LedgerError> {
        Ok(self.clock_op("accept").await?.0)
    }

    /// See [`crate::ledger::Ledger::clocks`].
    pub(super) async fn read_clocks(&self) -> Result<Option<Readings>, LedgerError> {
        let (wall, boot) = (crate::domain::now_ms(), clock::boot_ms());
        let nodes = self.conn.times().await?;
        let rtt_ms = clock::boot_ms().saturating_sub(boot);
        if let Some((_, t)) = nodes.first() {
            *self
                .keys
                .redis_clock
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) =
                Some((*t, boot.saturating_add(rtt_ms / 2)));
        }
        Ok(Some(Readings {
            nodes,
            wall_ms: wall.saturating_add(rtt_ms / 2),
            rtt_ms,
            boot_ms: boot.saturating_add(rtt_ms / 2),
        }))
    }

    /// See [`crate::ledger::Ledger::watch_clock`].
    pub(super) async fn watch(
        &self,
        agrees: bool,
        stepped: Option<u64>,
    ) -> Result<Option<Mark>, LedgerError> {
        let how = match (stepped, agrees) {
            (Some(ahead), _) => format!("step:{ahead}"),
            (None, true) => "1".to_owned(),
            (None, false) => "0".to_owned(),
        };
        let (found, until) = self.clock_op(&how).await?;
        if found {
            tracing::error!(
                "Redis expired a key before its time: its clock ran more than an hour ahead; \
                 every worker stops admitting"
            );
        }
        if until == 0 {
            return Ok(None);
        }
        let mark: Option<String> = redis::cmd("GET")
            .arg(self.clock_keys()[0].as_str())
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(Some(mark.as_deref().and_then(Mark::decode).unwrap_or(
            Mark {
                until_ms: until,
                seen_ms: 0,
                since_ms: 0,
            },
        )))
    }
}
