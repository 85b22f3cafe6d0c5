use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::{Clock, Decision, Keyspace, LimitError, RateLimiter, Request, RuleRef, Verdict};
use crate::domain::JobId;
use crate::settings::{LimitSettings, RedisSettings};

/// The one limiter script; its header documents KEYS and ARGV.
static SCRIPT: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("limiter.lua")));

/// The production limiter: state in Redis, shared by every worker.
///
/// Each call is one `EVALSHA` round trip (falling back to loading the script
/// on `NOSCRIPT`, e.g. after a Redis restart). The connection is multiplexed
/// and re-established automatically after Redis comes back; a call made while
/// Redis is away fails with [`LimitError::Redis`], which callers treat as
/// transient.
#[derive(Clone)]
pub struct RedisLimiter {
    conn: ConnectionManager,
    keys: std::sync::Arc<Keyspace>,
}

impl RedisLimiter {
    /// Connects to Redis (failing if it does not answer now) and loads the
    /// script, so a bad URL or an unusable server shows at start-up.
    pub async fn connect(
        redis: &RedisSettings,
        limits: &LimitSettings,
    ) -> Result<Self, LimitError> {
        let client = redis::Client::open(redis.url.as_str())?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(5)))
            .set_response_timeout(Some(Duration::from_secs(5)))
            .set_number_of_retries(2);
        let mut conn = ConnectionManager::new_with_config(client, config).await?;
        SCRIPT.prepare_invoke().load_async(&mut conn).await?;
        Ok(Self {
            conn,
            keys: std::sync::Arc::new(Keyspace::new(&redis.key_prefix, limits)),
        })
    }

    /// The connection, for callers that share it (health checks, tools).
    pub fn connection(&self) -> ConnectionManager {
        self.conn.clone()
    }

    fn invocation(
        &self,
        op: &str,
        job_key: &str,
        id: &JobId,
        clock: Clock,
    ) -> redis::ScriptInvocation<'static> {
        let mut inv = SCRIPT.prepare_invoke();
        inv.key(job_key)
            .arg(op)
            .arg(match clock {
                Clock::Server => String::new(),
                Clock::At(ms) => ms.to_string(),
            })
            .arg(id.as_str())
            .arg(self.keys.dedup_ms());
        inv
    }
}

impl RateLimiter for RedisLimiter {
    async fn check(&self, req: &Request<'_>, clock: Clock) -> Result<Decision, LimitError> {
        let app = self.keys.applicable(req);
        let mut inv = self.invocation("admit", &app.job_key, req.id, clock);
        for (_, key, rules) in &app.scopes {
            inv.key(key).arg(rules.len());
            for rule in *rules {
                inv.arg(rule.window_ms()).arg(rule.max);
            }
        }
        let reply: Vec<i64> = inv.invoke_async(&mut self.conn.clone()).await?;
        let bad = || LimitError::Protocol(format!("{reply:?}"));
        let at = |i: usize| -> Result<u64, LimitError> {
            reply
                .get(i)
                .and_then(|&v| u64::try_from(v).ok())
                .ok_or_else(bad)
        };
        let decided_at_ms = at(1)?;
        let verdict = match reply.first() {
            Some(1) => Verdict::Admitted,
            Some(0) => {
                let scope_i = usize::try_from(at(3)?).map_err(|_| bad())?;
                let rule_i = usize::try_from(at(4)?).map_err(|_| bad())?;
                let (scope, _, rules) = app.scopes.get(scope_i.wrapping_sub(1)).ok_or_else(bad)?;
                let rule = rules.get(rule_i.wrapping_sub(1)).ok_or_else(bad)?;
                Verdict::Rejected {
                    retry_after_ms: at(2)?,
                    rule: RuleRef {
                        scope: *scope,
                        window_ms: rule.window_ms(),
                        max: rule.max,
                    },
                }
            }
            Some(2) => Verdict::Duplicate {
                admitted_at_ms: at(2)?,
                sent: at(3)? == 1,
            },
            _ => return Err(bad()),
        };
        Ok(Decision {
            decided_at_ms,
            verdict,
        })
    }

    async fn refund(&self, id: &JobId) -> Result<bool, LimitError> {
        let key = self.keys.job_key(id);
        let removed: i64 = self
            .invocation("refund", &key, id, Clock::Server)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(removed == 1)
    }

    async fn mark_sent(&self, id: &JobId) -> Result<bool, LimitError> {
        let key = self.keys.job_key(id);
        let known: i64 = self
            .invocation("sent", &key, id, Clock::Server)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(known == 1)
    }
}
