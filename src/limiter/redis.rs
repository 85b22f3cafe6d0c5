use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::{Semaphore, mpsc, oneshot};

use super::{
    Clock, Decision, Keyspace, LimitError, RateLimiter, Request, RuleRef, Scope, Subject, Usage,
    Verdict, usage_of,
};
use crate::domain::{JobId, Name};
use crate::settings::{LimitSettings, RedisSettings, Rule};

/// The one limiter script; its header documents KEYS and ARGV.
static SCRIPT: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("limiter.lua")));

/// Most requests decided in one script call.
const MAX_BATCH: usize = 64;
/// Script calls in flight at once; while they run, new requests gather into
/// the next batch.
const MAX_IN_FLIGHT: usize = 2;

/// The production limiter: state in Redis, shared by every worker.
///
/// Requests made while earlier ones are in flight are decided together in one
/// `EVALSHA` (in arrival order, all at one Redis instant, atomically), so
/// under load the fixed cost of a script call is shared; an idle limiter sends
/// each request at once. The script is loaded again on `NOSCRIPT` (e.g. after
/// a Redis restart). The connection is multiplexed and re-established after
/// Redis comes back; a call made while Redis is away fails with
/// [`LimitError::Redis`], which callers treat as transient.
#[derive(Clone)]
pub struct RedisLimiter {
    conn: ConnectionManager,
    keys: Arc<Keyspace>,
    queue: mpsc::Sender<Pending>,
}

/// A request waiting for its batch.
struct Pending {
    clock: Clock,
    id: String,
    /// `(scope, key)`, in decision order.
    scopes: Vec<(Scope, String)>,
    /// One byte per scope key: `b'0'` + the 1-based index of its rule set.
    shape: [u8; 2],
    reply: oneshot::Sender<Result<Decision, LimitError>>,
}

impl RedisLimiter {
    /// Connects to Redis (failing if it does not answer now) and loads the
    /// script, so a bad URL or an unusable server shows at start-up. Must be
    /// called within a Tokio runtime: it starts the batching task, which ends
    /// when the last clone of the limiter is dropped.
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
        let keys = Arc::new(Keyspace::new(&redis.key_prefix, limits));
        let (queue, rx) = mpsc::channel(4 * MAX_BATCH);
        tokio::spawn(dispatch(rx, conn.clone(), keys.clone()));
        Ok(Self { conn, keys, queue })
    }

    /// The connection, for callers that share it (health checks, tools).
    pub fn connection(&self) -> ConnectionManager {
        self.conn.clone()
    }

    async fn single(&self, op: &str, id: &JobId) -> Result<bool, LimitError> {
        let reply: i64 = SCRIPT
            .key(self.keys.job_key(id))
            .arg(op)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(reply == 1)
    }
}

/// Gathers queued requests into batches and runs up to [`MAX_IN_FLIGHT`]
/// script calls at once.
async fn dispatch(mut rx: mpsc::Receiver<Pending>, conn: ConnectionManager, keys: Arc<Keyspace>) {
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let mut carried: Option<Pending> = None;
    loop {
        // Wait for a free slot first: requests arriving meanwhile join the batch.
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        let first = match carried.take() {
            Some(p) => p,
            None => match rx.recv().await {
                Some(p) => p,
                None => return,
            },
        };
        // Callers whose answers just arrived are about to ask again: let them
        // run before the batch closes (no timer, so an idle limiter adds no
        // latency).
        tokio::task::yield_now().await;
        let clock = first.clock;
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                // One batch is one instant: an explicit clock ends the batch.
                Ok(p) if p.clock == clock => batch.push(p),
                Ok(p) => {
                    carried = Some(p);
                    break;
                }
                Err(_) => break,
            }
        }
        let (mut conn, keys) = (conn.clone(), keys.clone());
        tokio::spawn(async move {
            let result = run_batch(&mut conn, &keys, clock, &batch).await;
            match result {
                Ok(decisions) => {
                    for (p, d) in batch.into_iter().zip(decisions) {
                        let _ = p.reply.send(Ok(d));
                    }
                }
                Err(e) => {
                    for p in batch {
                        let _ = p.reply.send(Err(e.clone()));
                    }
                }
            }
            drop(permit);
        });
    }
}

async fn run_batch(
    conn: &mut ConnectionManager,
    keys: &Keyspace,
    clock: Clock,
    batch: &[Pending],
) -> Result<Vec<Decision>, LimitError> {
    let sets = &keys.sets;
    let mut inv = SCRIPT.prepare_invoke();
    inv.arg("admit")
        .arg(match clock {
            Clock::Server => String::new(),
            Clock::At(ms) => ms.to_string(),
        })
        .arg(keys.dedup_ms())
        .arg(keys.job_key_prefix())
        .arg(keys.lease_ms())
        .arg(sets.len());
    for set in sets {
        inv.arg(set.rules.len()).arg(set.keep_ms);
        for rule in &set.rules {
            inv.arg(rule.window_ms()).arg(rule.max);
        }
    }
    for p in batch {
        inv.arg(&p.id).arg(&p.shape[..p.scopes.len()]);
        for (_, key) in &p.scopes {
            inv.key(key);
        }
    }
    let reply: Vec<i64> = inv.invoke_async(conn).await?;
    let bad = || {
        LimitError::Protocol(format!(
            "{} values for {} requests",
            reply.len(),
            batch.len()
        ))
    };
    if reply.len() != 1 + 4 * batch.len() {
        return Err(bad());
    }
    let num = |v: i64| u64::try_from(v).map_err(|_| bad());
    let decided_at_ms = num(reply[0])?;
    batch
        .iter()
        .zip(reply[1..].chunks_exact(4))
        .map(|(p, r)| {
            let verdict = match r[0] {
                1 => Verdict::Admitted,
                0 => {
                    let rule_of = |s: i64, i: i64| -> Option<RuleRef> {
                        let s = usize::try_from(s - 1).ok()?;
                        let (scope, _) = p.scopes.get(s)?;
                        let set = usize::from(p.shape.get(s)?.checked_sub(b'1')?);
                        let rule: &Rule = sets.get(set)?.rules.get(usize::try_from(i - 1).ok()?)?;
                        Some(RuleRef {
                            scope: *scope,
                            window_ms: rule.window_ms(),
                            max: rule.max,
                        })
                    };
                    Verdict::Rejected {
                        retry_after_ms: num(r[1])?,
                        rule: rule_of(r[2], r[3]).ok_or_else(bad)?,
                    }
                }
                2 => Verdict::Duplicate {
                    admitted_at_ms: num(r[1])?,
                },
                3 => Verdict::InProgress {
                    admitted_at_ms: num(r[1])?,
                    lease_left_ms: num(r[2])?,
                },
                4 => Verdict::Resume {
                    admitted_at_ms: num(r[1])?,
                },
                5 => Verdict::Interrupted {
                    admitted_at_ms: num(r[1])?,
                },
                _ => return Err(bad()),
            };
            Ok(Decision {
                decided_at_ms,
                verdict,
            })
        })
        .collect()
}

impl RateLimiter for RedisLimiter {
    async fn check(&self, req: &Request<'_>, clock: Clock) -> Result<Decision, LimitError> {
        let app = self.keys.applicable(req);
        let (reply, rx) = oneshot::channel();
        let mut shape = [0u8; 2];
        for (byte, (_, _, set)) in shape.iter_mut().zip(&app) {
            // Settings allow at most 100 purposes, so 2 + 200 sets: the
            // character stays within a byte.
            *byte = b'1' + u8::try_from(*set).unwrap_or(u8::MAX - b'1');
        }
        let pending = Pending {
            clock,
            id: req.id.as_str().to_owned(),
            scopes: app
                .into_iter()
                .map(|(scope, key, _)| (scope, key))
                .collect(),
            shape,
            reply,
        };
        let gone = || LimitError::Protocol("the limiter's batching task stopped".into());
        self.queue.send(pending).await.map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?
    }

    async fn refund(&self, id: &JobId) -> Result<bool, LimitError> {
        self.single("refund", id).await
    }

    async fn mark_sending(&self, id: &JobId) -> Result<bool, LimitError> {
        let reply: i64 = SCRIPT
            .key(self.keys.job_key(id))
            .arg("sending")
            .arg("")
            .arg(self.keys.lease_ms())
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(reply == 1)
    }

    async fn mark_sent(&self, id: &JobId) -> Result<bool, LimitError> {
        self.single("sent", id).await
    }

    async fn release(&self, id: &JobId) -> Result<bool, LimitError> {
        self.single("release", id).await
    }

    async fn usage(
        &self,
        subject: Subject<'_>,
        purpose: Option<&Name>,
        clock: Clock,
    ) -> Result<Usage, LimitError> {
        let (key, set) = self.keys.lookup(subject, purpose);
        let reply: Vec<i64> = SCRIPT
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
            .ok_or_else(|| LimitError::Protocol("empty peek reply".into()))?;
        let times: Vec<u64> = values.collect();
        Ok(usage_of(key, subject.scope(), &set.rules, &times, now))
    }

    async fn mark_answered(&self, id: &JobId) -> Result<(), LimitError> {
        let _: () = redis::cmd("SET")
            .arg(self.keys.answered_key(id))
            .arg(1)
            .arg("PX")
            .arg(self.keys.dedup_ms())
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    async fn answered(&self, id: &JobId) -> Result<bool, LimitError> {
        let n: i64 = redis::cmd("EXISTS")
            .arg(self.keys.answered_key(id))
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(n == 1)
    }

    async fn ping(&self) -> Result<(), LimitError> {
        let _: String = redis::cmd("PING")
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    async fn reset(&self, subject: Subject<'_>) -> Result<(String, u64), LimitError> {
        let key = self.keys.key_of(subject);
        let removed: i64 = SCRIPT
            .key(&key)
            .arg("reset")
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok((key, u64::try_from(removed).unwrap_or(0)))
    }
}
