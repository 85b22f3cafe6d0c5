//! The suppression list: mailboxes no code is mailed to (their owners asked
//! for no mail), and addresses relays said do not exist. The two
//! directions differ. Someone suppresses a mailbox, every spelling the
//! limiter counts as it: `<prefix>sup:<mailbox>`
//! ([`Keyspace::suppression_key`]). A bounce suppresses exactly the
//! spelling the relay refused, which whoever asked for the code chose:
//! `<prefix>bounced:<address>` ([`Keyspace::bounce_key`]). An admission
//! reads both (and the key of earlier versions) in the same script call
//! ([`RedisLedger::admit`]; [`Keyspace::suppression_keys`]). Each is also
//! an entry in the index `<prefix>suppressed` (a sorted set: the key,
//! scored by when it ends, ms; `+inf` for never), which `mailgate suppress
//! list` reads, so listing never scans the keyspace.

use super::RedisLedger;
use crate::domain::EmailAddress;
use crate::ledger::{BOUNCE_RUN, BOUNCE_RUN_WINDOW, Bounced, LedgerError};
use crate::limiter::families;
use crate::store::scripts::SUPPRESS;

/// How many suppressions `list` reads at once.
const READ_AT_ONCE: usize = 256;

/// What a suppression someone makes covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spelling {
    /// The mailbox, in every spelling the limiter counts as it: the
    /// owner asked for no mail (by hand, a complaint).
    Mailbox,
    /// This spelling only, as a relay's bounce: the address may be one a
    /// stranger chose (a provider's bounce export).
    Exact,
}

/// Why a mailbox or an address is suppressed, and since when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Suppression {
    /// The mailbox as the limiter counts it (normalized), or with
    /// `exact`, the address as it was sent.
    pub mailbox: String,
    /// Only this spelling is suppressed: a relay said it does not exist.
    pub exact: bool,
    /// When it was suppressed, ms since the epoch.
    pub since_ms: u64,
    /// Who suppressed it: `bounce` (a relay said the mailbox does not
    /// exist), `manual` (`mailgate suppress add`) or `import` (`--file`).
    pub source: String,
    /// Why, for people.
    pub why: String,
    /// How much longer it lasts, ms; `None`: until removed.
    pub left_ms: Option<u64>,
}

impl RedisLedger {
    /// Suppresses `email`'s mailbox, every spelling the limiter counts as
    /// it (`Spelling::Mailbox`), or only that spelling, as a bounce does
    /// (`Spelling::Exact`: a provider's bounce export, whose spellings
    /// whoever asked for the codes chose), for `period` (`None`: until
    /// removed), replacing any suppression of it.
    pub async fn suppress(
        &self,
        email: &EmailAddress,
        spelling: Spelling,
        source: &str,
        why: &str,
        period: Option<std::time::Duration>,
    ) -> Result<(), LedgerError> {
        let key = match spelling {
            Spelling::Mailbox => self.keys.suppression_key(email),
            Spelling::Exact => self.keys.bounce_key(email),
        };
        let now = crate::domain::now_ms();
        let value = format!("{now} {source} {why}");
        let mut set = redis::cmd("SET");
        set.arg(&key).arg(value);
        let ends = match period {
            Some(p) => {
                let ms = u64::try_from(p.as_millis()).unwrap_or(u64::MAX).max(1);
                set.arg("PX").arg(ms);
                now.saturating_add(ms).to_string()
            }
            None => "+inf".to_owned(),
        };
        let mut conn = self.conn.clone();
        // The key first: should the index write fail, the mailbox is
        // suppressed all the same, and only `list` misses it.
        let () = set.query_async(&mut conn).await?;
        let _: i64 = redis::cmd("ZADD")
            .arg(self.suppression_index())
            .arg(ends)
            .arg(&key)
            .query_async(&mut conn)
            .await?;
        Ok(())
    }

    /// Suppresses `email`, exactly as it was sent, for `ms` after a bounce
    /// (`why`), unless a suppression of that spelling in force lasts
    /// longer, in one step (`suppress.lua`); unless more than
    /// [`BOUNCE_RUN`] different addresses of its domain bounced within
    /// [`BOUNCE_RUN_WINDOW`] (its run, `<prefix>bounceruns:<domain>`, kept
    /// by every worker) and the relay took no mail for it lately
    /// (`vouched`): then nothing is suppressed, and the suppressions the
    /// run's bounces made are lifted.
    pub(super) async fn bounce(
        &self,
        email: &EmailAddress,
        why: &str,
        ms: u64,
        vouched: bool,
    ) -> Result<Bounced, LedgerError> {
        let key = self.keys.bounce_key(email);
        let now = crate::domain::now_ms();
        let window = u64::try_from(BOUNCE_RUN_WINDOW.as_millis()).unwrap_or(u64::MAX);
        let run: Vec<String> = SUPPRESS
            .key(self.keys.bounce_run_key(email.domain()))
            .arg("run")
            .arg(now)
            .arg(window)
            .arg(email.as_str())
            .invoke_async(&mut self.conn.clone())
            .await?;
        if run.len() > BOUNCE_RUN && !vouched {
            let mut lifted = 0;
            for address in run.iter().filter_map(|a| EmailAddress::parse(a).ok()) {
                let bounce = self.keys.bounce_key(&address);
                if (self.read_suppression(&bounce).await?).is_some_and(|s| s.source == "bounce")
                    && self.unbounce(&address).await?
                {
                    lifted += 1;
                }
            }
            return Ok(Bounced::Doubted { lifted });
        }
        let set: i64 = SUPPRESS
            .key(&key)
            .arg("bounce")
            .arg(format!("{now} bounce {why}"))
            .arg(ms.max(1))
            .invoke_async(&mut self.conn.clone())
            .await?;
        if set == 1 {
            // GT: a suppression until removed that someone made meanwhile
            // keeps its place in the index.
            let _: i64 = redis::cmd("ZADD")
                .arg(self.suppression_index())
                .arg("GT")
                .arg(now.saturating_add(ms))
                .arg(&key)
                .query_async(&mut self.conn.clone())
                .await?;
        }
        Ok(Bounced::Suppressed)
    }

    /// Lifts the suppression a bounce made of `email`, as it was sent;
    /// whether there was one.
    pub(super) async fn unbounce(&self, email: &EmailAddress) -> Result<bool, LedgerError> {
        let key = self.keys.bounce_key(email);
        let mut conn = self.conn.clone();
        let removed: i64 = redis::cmd("DEL").arg(&key).query_async(&mut conn).await?;
        let _: i64 = redis::cmd("ZREM")
            .arg(self.suppression_index())
            .arg(&key)
            .query_async(&mut conn)
            .await?;
        Ok(removed > 0)
    }

    /// Lifts `email`'s suppressions: its mailbox's (as the limiter counts
    /// it, and under the key of earlier versions) and its own spelling's
    /// bounce; whether there was one.
    pub async fn unsuppress(&self, email: &EmailAddress) -> Result<bool, LedgerError> {
        let mut conn = self.conn.clone();
        let mut removed = 0;
        for key in self.keys.suppression_keys(email) {
            let n: i64 = redis::cmd("DEL").arg(&key).query_async(&mut conn).await?;
            removed += n;
            let _: i64 = redis::cmd("ZREM")
                .arg(self.suppression_index())
                .arg(&key)
                .query_async(&mut conn)
                .await?;
        }
        Ok(removed > 0)
    }

    /// The suppression that keeps a code from `email`, if one does (an
    /// admission reads the same keys): its mailbox's, which someone made,
    /// else its own spelling's bounce.
    pub async fn suppression(
        &self,
        email: &EmailAddress,
    ) -> Result<Option<Suppression>, LedgerError> {
        let mut bounce = None;
        for (i, key) in self.keys.suppression_keys(email).iter().enumerate() {
            match self.read_suppression(key).await? {
                Some(s) if i == 0 => bounce = Some(s),
                // An earlier version's bounce under the mailbox's key.
                Some(s) if s.source == "bounce" => {}
                Some(s) => return Ok(Some(s)),
                None => {}
            }
        }
        Ok(bounce)
    }

    /// Every suppression in force, oldest end first; entries of the index
    /// whose key is gone (it expired) are dropped from it on the way.
    pub async fn suppressions(&self) -> Result<Vec<Suppression>, LedgerError> {
        let index = self.suppression_index();
        let mut conn = self.conn.clone();
        let _: i64 = redis::cmd("ZREMRANGEBYSCORE")
            .arg(&index)
            .arg("-inf")
            .arg(format!("({}", crate::domain::now_ms()))
            .query_async(&mut conn)
            .await?;
        let keys: Vec<String> = redis::cmd("ZRANGE")
            .arg(&index)
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await?;
        let mut found = Vec::with_capacity(keys.len());
        // Many at once (each a round trip of its own: the keys may live on
        // different shards), in the index's order.
        for chunk in keys.chunks(READ_AT_ONCE) {
            let mut reads = tokio::task::JoinSet::new();
            for (i, key) in chunk.iter().enumerate() {
                let (ledger, key) = (self.clone(), key.clone());
                reads.spawn(async move { (i, ledger.read_suppression(&key).await) });
            }
            let mut read: Vec<Option<Suppression>> = vec![None; chunk.len()];
            while let Some(done) = reads.join_next().await {
                let (i, s) = done.map_err(|e| LedgerError::Protocol(e.to_string()))?;
                read[i] = s?;
            }
            for (key, s) in chunk.iter().zip(read) {
                match s {
                    Some(s) => found.push(s),
                    None => {
                        let _: i64 = redis::cmd("ZREM")
                            .arg(&index)
                            .arg(key)
                            .query_async(&mut conn)
                            .await?;
                    }
                }
            }
        }
        Ok(found)
    }

    fn suppression_index(&self) -> String {
        families::suppression_index_key(&self.keys.prefix)
    }

    async fn read_suppression(&self, key: &str) -> Result<Option<Suppression>, LedgerError> {
        let mut conn = self.conn.clone();
        let (value, ttl): (Option<String>, i64) = redis::pipe()
            .cmd("GET")
            .arg(key)
            .cmd("PTTL")
            .arg(key)
            .query_async(&mut conn)
            .await?;
        let Some(value) = value else {
            return Ok(None);
        };
        let mut words = value.splitn(3, ' ');
        let since_ms = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
        let source = words.next().unwrap_or_default().to_owned();
        let why = words.next().unwrap_or_default().to_owned();
        let family = |f: &str| {
            key.strip_prefix(&format!("{}{f}", self.keys.prefix))
                .map(str::to_owned)
        };
        let (mailbox, exact) = match family(families::BOUNCED) {
            Some(address) => (address, true),
            None => (
                family(families::SUPPRESSION).unwrap_or_else(|| key.to_owned()),
                false,
            ),
        };
        Ok(Some(Suppression {
            mailbox,
            exact,
            since_ms,
            source,
            why,
            left_ms: u64::try_from(ttl).ok(),
        }))
    }
}
