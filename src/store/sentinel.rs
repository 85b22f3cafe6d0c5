//! The primary a group of Redis Sentinels names, followed as it changes,
//! and the replicas a write must reach before a promotion cannot lose it.
//!
//! Redis replicates asynchronously, and `WAIT n` counts the replicas that
//! hold a write. That is not enough under a forced failover
//! (`SENTINEL FAILOVER`): the chosen replica leaves the primary, which keeps
//! taking writes that its other replicas still acknowledge for a second or
//! two, and that the new primary never gets. So the worker watches the
//! Sentinels ([`watch`]): while any of them reports a failover under way, or
//! they do not agree on the primary, nothing is written (every call fails,
//! and its job is retried); when they name another primary, the connection
//! to the old one is dropped at once; and a write is trusted only when
//! every replica a Sentinel could promote acknowledged it ([`Followed::pin`]),
//! so whichever replica is promoted holds it.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::SentinelClient;
use redis::{AsyncConnectionConfig, ConnectionAddr, RedisResult};

use crate::settings::SentinelTarget;

/// How long connecting to the primary, or one request, may take.
const TIMEOUT: Duration = Duration::from_secs(5);
/// How often the Sentinels are asked.
const EVERY: Duration = Duration::from_millis(250);
/// How long one Sentinel may take to answer a round of questions.
const SENTINEL_TIMEOUT: Duration = Duration::from_secs(1);

/// A server's address as the Sentinels give it.
type Addr = (String, u16);

/// The primary a group of Sentinels names, followed: the connection to it
/// is dropped when a request fails in a way that says it is gone or no
/// longer primary, or when the Sentinels report a failover or name
/// another; the next request connects to the one they name then.
pub(crate) struct Followed {
    /// Asks the Sentinels for the primary and connects to it; held while
    /// (re)connecting, so one task connects and the others wait for its
    /// connection.
    sentinel: tokio::sync::Mutex<SentinelClient>,
    /// The connection in use, if any.
    current: Mutex<Current>,
    /// What the Sentinels said last ([`watch`] keeps it).
    seen: Mutex<Seen>,
}

/// [`Followed`]'s connection, numbered so that a failed request forgets
/// only the connection it ran on, never a newer one.
#[derive(Default)]
struct Current {
    /// How many connections were made before this one.
    generation: u64,
    /// The connection, and the primary it reaches.
    conn: Option<(MultiplexedConnection, Addr)>,
}

/// What the Sentinels said at their last answer.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    /// None has answered yet.
    Nothing,
    /// They agree on the primary, and no failover is under way.
    Settled(Roster),
    /// A failover is under way, or they disagree: nothing is written.
    InDoubt(String),
}

/// The primary the Sentinels agree on, and the replicas of it that one of
/// them could promote now.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Roster {
    primary: Addr,
    promotable: BTreeSet<Addr>,
}

/// A connection pinned to one primary, with how many replicas a write on
/// it must reach before it is trusted.
pub(crate) struct Pinned {
    /// The connection; its failures are reported to the [`Followed`] it
    /// came from.
    pub(crate) conn: MultiplexedConnection,
    /// Which of the [`Followed`]'s connections it is.
    pub(crate) generation: u64,
    /// At least the setting's count, and every replica of this primary a
    /// Sentinel could promote now.
    pub(crate) replicas: u32,
}

impl Followed {
    /// Follows the primary of `target`: asks the Sentinels once (so a bad
    /// URL, or Sentinels that name no primary, fail here) and keeps asking
    /// in the background while the returned value lives.
    pub(crate) async fn start(
        target: &SentinelTarget,
        client: SentinelClient,
        certs: Option<redis::TlsCertificates>,
    ) -> RedisResult<Arc<Self>> {
        let followed = Arc::new(Followed {
            sentinel: tokio::sync::Mutex::new(client),
            current: Mutex::default(),
            seen: Mutex::new(Seen::Nothing),
        });
        let mut sentinels = Sentinels::new(target, certs)?;
        if let Some(seen) = sentinels.ask().await {
            followed.saw(seen);
        }
        tokio::spawn(watch(Arc::downgrade(&followed), sentinels));
        followed.connection().await?;
        Ok(followed)
    }

    fn current(&self) -> std::sync::MutexGuard<'_, Current> {
        // Nothing panics while holding these locks; a poisoned one still
        // holds a consistent value.
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn seen(&self) -> Seen {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Records what the Sentinels said, and drops the connection if they
    /// report a failover or name another primary.
    fn saw(&self, seen: Seen) {
        {
            let mut last = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
            if *last != seen {
                match &seen {
                    Seen::InDoubt(why) => {
                        tracing::warn!(%why, "Redis Sentinel: no writes until it settles")
                    }
                    Seen::Settled(r) => tracing::info!(
                        primary = %show(&r.primary),
                        promotable = r.promotable.len(),
                        "Redis Sentinel: primary and promotable replicas"
                    ),
                    Seen::Nothing => {}
                }
            }
            *last = seen.clone();
        }
        let keep = |on: &Addr| match &seen {
            Seen::Settled(r) => r.primary == *on,
            Seen::InDoubt(_) => false,
            Seen::Nothing => true,
        };
        let mut current = self.current();
        if let Some((_, on)) = &current.conn
            && !keep(on)
        {
            tracing::warn!(primary = %show(on), "Redis Sentinel: dropping the connection to a primary it no longer names");
            current.conn = None;
        }
    }

    /// The connection in use, or a new one to the primary the Sentinels
    /// name now; fails while they report a failover or disagree.
    pub(crate) async fn connection(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        let pinned = |c: &Current| {
            c.conn
                .as_ref()
                .map(|(conn, _)| (c.generation, conn.clone()))
        };
        if let Some(c) = pinned(&self.current()) {
            return Ok(c);
        }
        let mut sentinel = self.sentinel.lock().await;
        if let Some(c) = pinned(&self.current()) {
            return Ok(c);
        }
        if let Seen::InDoubt(why) = self.seen() {
            return Err(doubt(&why));
        }
        let client = tokio::time::timeout(TIMEOUT, sentinel.async_get_client())
            .await
            .map_err(|_| {
                transient("the Sentinels did not name a primary that answered in time".into())
            })??;
        let at = match &client.get_connection_info().addr() {
            ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
                (host.clone(), *port)
            }
            other => return Err(transient(format!("a primary at {other:?}"))),
        };
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(TIMEOUT))
            .set_response_timeout(Some(TIMEOUT));
        let conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        // The Sentinels may have moved on while this one connected.
        match self.seen() {
            Seen::Settled(r) if r.primary != at => {
                return Err(transient(format!(
                    "the Sentinels now name {} as primary, not {}",
                    show(&r.primary),
                    show(&at)
                )));
            }
            Seen::InDoubt(why) => return Err(doubt(&why)),
            _ => {}
        }
        let generation = {
            let mut current = self.current();
            current.generation += 1;
            current.conn = Some((conn.clone(), at.clone()));
            current.generation
        };
        tracing::info!(primary = %show(&at), "connected to the primary Sentinel names");
        Ok((generation, conn))
    }

    /// A connection to the primary and the replicas a write on it must
    /// reach: `min`, or every replica of that primary a Sentinel could
    /// promote now if they are more (none when `min` is 0).
    pub(crate) async fn pin(&self, min: u32) -> RedisResult<Pinned> {
        let (generation, conn) = self.connection().await?;
        if min == 0 {
            return Ok(Pinned {
                conn,
                generation,
                replicas: 0,
            });
        }
        let on = self.current().conn.as_ref().map(|(_, at)| at.clone());
        let replicas = match (self.seen(), on) {
            (Seen::Settled(r), Some(on)) if r.primary == on => {
                u32::try_from(r.promotable.len()).unwrap_or(u32::MAX)
            }
            (Seen::InDoubt(why), _) => return Err(doubt(&why)),
            // Nothing heard yet (start-up succeeded without an answer),
            // or the connection was dropped a moment ago: the setting.
            (Seen::Nothing, _) => 0,
            _ => return Err(transient("the Sentinels name another primary".into())),
        };
        Ok(Pinned {
            conn,
            generation,
            replicas: replicas.max(min),
        })
    }

    /// After a request on connection `generation` failed with `e`: forgets
    /// that connection if `e` says the server is gone or is no longer the
    /// primary.
    pub(crate) fn check<T>(&self, generation: u64, result: &RedisResult<T>) {
        let Err(e) = result else { return };
        let lost = e.is_io_error()
            || e.is_connection_dropped()
            || e.is_unrecoverable_error()
            || e.is_timeout()
            || matches!(e.code(), Some("READONLY" | "MASTERDOWN" | "LOADING"));
        if !lost {
            return;
        }
        let mut current = self.current();
        if current.generation == generation && current.conn.take().is_some() {
            tracing::warn!(error = %e, "lost the Redis primary; asking Sentinel again");
        }
    }

    /// The database of the connection in use (0 with none).
    pub(crate) fn db(&self) -> i64 {
        self.current().conn.as_ref().map_or(0, |(c, _)| c.get_db())
    }
}

fn show((host, port): &Addr) -> String {
    match host.contains(':') {
        true => format!("[{host}]:{port}"),
        false => format!("{host}:{port}"),
    }
}

fn transient(why: String) -> redis::RedisError {
    redis::RedisError::from((redis::ErrorKind::Io, "no primary", why))
}

fn doubt(why: &str) -> redis::RedisError {
    transient(format!("no writes while {why}"))
}

/// Asks the Sentinels every [`EVERY`] while `followed` lives.
async fn watch(followed: Weak<Followed>, mut sentinels: Sentinels) {
    loop {
        tokio::time::sleep(EVERY).await;
        let seen = sentinels.ask().await;
        let Some(followed) = followed.upgrade() else {
            return;
        };
        // No Sentinel answered: keep what they said last (a promotion needs
        // Sentinels, and the replicas counted then are still waited for).
        if let Some(seen) = seen {
            followed.saw(seen);
        }
    }
}

/// Connections to each Sentinel, and what the watch remembers between
/// rounds.
struct Sentinels {
    service: String,
    each: Vec<(redis::Client, Option<MultiplexedConnection>)>,
    /// Primaries the Sentinels named before the current one that have not
    /// yet been seen reporting themselves replicas again: such a server,
    /// still in the list of replicas and reporting itself primary, is the
    /// old primary Sentinel has yet to turn into a replica.
    demoted: BTreeSet<Addr>,
    /// The primary of the last settled round.
    last: Option<Addr>,
}

impl Sentinels {
    fn new(target: &SentinelTarget, certs: Option<redis::TlsCertificates>) -> RedisResult<Self> {
        let mut redis = redis::RedisConnectionInfo::default();
        if let Some(user) = &target.sentinel_username {
            redis = redis.set_username(user);
        }
        if let Some(pass) = &target.sentinel_password {
            redis = redis.set_password(pass);
        }
        let each = target
            .sentinels
            .iter()
            .map(|(host, port)| {
                let addr = match target.tls {
                    true => ConnectionAddr::TcpTls {
                        host: host.clone(),
                        port: *port,
                        insecure: false,
                        tls_params: None,
                    },
                    false => ConnectionAddr::Tcp(host.clone(), *port),
                };
                let info = redis::IntoConnectionInfo::into_connection_info(addr)?
                    .set_redis_settings(redis.clone());
                let client = match &certs {
                    Some(certs) => redis::Client::build_with_tls(info, certs.clone())?,
                    None => redis::Client::open(info)?,
                };
                Ok((client, None))
            })
            .collect::<RedisResult<_>>()?;
        Ok(Self {
            service: target.service.clone(),
            each,
            demoted: BTreeSet::new(),
            last: None,
        })
    }

    /// One round: every Sentinel at once; what those that answered say
    /// (`None` if none did).
    async fn ask(&mut self) -> Option<Seen> {
        let mut asked = tokio::task::JoinSet::new();
        for (i, (client, conn)) in self.each.iter().enumerate() {
            let (client, conn, service) = (client.clone(), conn.clone(), self.service.clone());
            asked.spawn(async move {
                let answer = tokio::time::timeout(SENTINEL_TIMEOUT, view(client, conn, service))
                    .await
                    .unwrap_or_else(|_| Err(transient("a Sentinel did not answer in time".into())));
                (i, answer)
            });
        }
        let mut views = Vec::new();
        while let Some(Ok((i, answer))) = asked.join_next().await {
            match answer {
                Ok((conn, view)) => {
                    self.each[i].1 = Some(conn);
                    views.push(view);
                }
                Err(e) => {
                    self.each[i].1 = None;
                    tracing::debug!(error = %e, "a Sentinel did not answer");
                }
            }
        }
        if views.is_empty() {
            return None;
        }
        let seen = judge(&views, &self.demoted);
        if let Seen::Settled(r) = &seen {
            if let Some(last) = self.last.replace(r.primary.clone())
                && last != r.primary
            {
                self.demoted.insert(last);
            }
            self.demoted.remove(&r.primary);
            // A former primary seen reporting itself a replica again is an
            // ordinary replica.
            for v in &views {
                for rep in &v.replicas {
                    if rep.reports_replica {
                        self.demoted.remove(&rep.addr);
                    }
                }
            }
        }
        Some(seen)
    }
}

/// What one Sentinel says of the service.
#[derive(Debug)]
struct View {
    primary: Addr,
    failover: bool,
    replicas: Vec<Replica>,
}

/// One replica, as a Sentinel lists it.
#[derive(Debug)]
struct Replica {
    addr: Addr,
    /// Whether that Sentinel could choose it for promotion now (its own
    /// rules: not down, answering, recently heard from, a priority above
    /// 0, not too long cut off from its primary).
    eligible: bool,
    /// Whether it reports itself a replica (`role-reported`).
    reports_replica: bool,
}

async fn view(
    client: redis::Client,
    conn: Option<MultiplexedConnection>,
    service: String,
) -> RedisResult<(MultiplexedConnection, View)> {
    let mut conn = match conn {
        Some(conn) => conn,
        None => client.get_multiplexed_async_connection().await?,
    };
    let (master, replicas): (HashMap<String, String>, Vec<HashMap<String, String>>) = redis::pipe()
        .cmd("SENTINEL")
        .arg("MASTER")
        .arg(&service)
        .cmd("SENTINEL")
        .arg("REPLICAS")
        .arg(&service)
        .query_async(&mut conn)
        .await?;
    let field = |m: &HashMap<String, String>, k: &str| m.get(k).cloned().unwrap_or_default();
    let number =
        |m: &HashMap<String, String>, k: &str| m.get(k).and_then(|v| v.parse::<i64>().ok());
    let addr = |m: &HashMap<String, String>| -> RedisResult<Addr> {
        let port = number(m, "port")
            .and_then(|p| u16::try_from(p).ok())
            .ok_or_else(|| transient("a Sentinel's reply without a port".into()))?;
        Ok((field(m, "ip"), port))
    };
    let flags = |m: &HashMap<String, String>| -> Vec<String> {
        field(m, "flags").split(',').map(str::to_owned).collect()
    };
    let down_after_ms = number(&master, "down-after-milliseconds")
        .and_then(|n| u64::try_from(n).ok())
        .unwrap_or(30_000);
    let failover = flags(&master).iter().any(|f| f == "failover_in_progress");
    let replicas = replicas
        .iter()
        .map(|r| {
            let flags = flags(r);
            let ms = |k| number(r, k).unwrap_or(i64::MAX);
            // Sentinel's own choice (sentinelSelectSlave): the longer of
            // its two bounds where they depend on the primary's state, so
            // that a replica it could choose is always counted.
            let limit = i64::try_from(down_after_ms.saturating_mul(10)).unwrap_or(i64::MAX);
            let eligible = !flags
                .iter()
                .any(|f| matches!(f.as_str(), "s_down" | "o_down" | "disconnected"))
                && number(r, "slave-priority") != Some(0)
                && ms("last-ok-ping-reply") <= 5_000
                && ms("info-refresh") <= 30_000
                && number(r, "master-link-down-time").unwrap_or(0) <= limit;
            Ok(Replica {
                addr: addr(r)?,
                eligible,
                reports_replica: field(r, "role-reported") == "slave",
            })
        })
        .collect::<RedisResult<_>>()?;
    Ok((
        conn,
        View {
            primary: addr(&master)?,
            failover,
            replicas,
        },
    ))
}

/// What the Sentinels that answered say together: in doubt while any
/// reports a failover under way or no primary is named by more than half
/// of them; otherwise that primary, and every replica of it one of them
/// could promote. A replica that reports itself primary is counted
/// (during a failover it is the one being promoted, as a Sentinel that has
/// not heard of the failover lists it), unless it is a former primary that
/// Sentinel has not yet turned into a replica.
fn judge(views: &[View], demoted: &BTreeSet<Addr>) -> Seen {
    if views.iter().any(|v| v.failover) {
        return Seen::InDoubt("a Sentinel reports a failover under way".into());
    }
    let mut named: HashMap<&Addr, usize> = HashMap::new();
    for v in views {
        *named.entry(&v.primary).or_default() += 1;
    }
    let Some((primary, _)) = named.into_iter().find(|(_, n)| 2 * n > views.len()) else {
        return Seen::InDoubt("the Sentinels do not agree on the primary".into());
    };
    let promotable = views
        .iter()
        .filter(|v| v.primary == *primary)
        .flat_map(|v| &v.replicas)
        .filter(|r| r.eligible && r.addr != *primary)
        .filter(|r| r.reports_replica || !demoted.contains(&r.addr))
        .map(|r| r.addr.clone())
        .collect();
    Seen::Settled(Roster {
        primary: primary.clone(),
        promotable,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(port: u16) -> Addr {
        ("10.0.0.1".into(), port)
    }

    fn replica(port: u16, eligible: bool, reports_replica: bool) -> Replica {
        Replica {
            addr: at(port),
            eligible,
            reports_replica,
        }
    }

    fn view(primary: u16, failover: bool, replicas: Vec<Replica>) -> View {
        View {
            primary: at(primary),
            failover,
            replicas,
        }
    }

    fn promotable(seen: &Seen) -> Vec<u16> {
        match seen {
            Seen::Settled(r) => r.promotable.iter().map(|a| a.1).collect(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn every_replica_any_sentinel_could_promote_counts() {
        let views = [
            view(
                1,
                false,
                vec![replica(2, true, true), replica(3, false, true)],
            ),
            view(
                1,
                false,
                vec![replica(2, true, true), replica(3, true, true)],
            ),
            view(
                1,
                false,
                vec![replica(2, false, true), replica(4, false, true)],
            ),
        ];
        assert_eq!(promotable(&judge(&views, &BTreeSet::new())), [2, 3]);
    }

    #[test]
    fn a_failover_or_a_split_vote_stops_writes() {
        let views = [view(1, false, vec![]), view(1, true, vec![])];
        assert!(matches!(judge(&views, &BTreeSet::new()), Seen::InDoubt(_)));
        let views = [view(1, false, vec![]), view(2, false, vec![])];
        assert!(matches!(judge(&views, &BTreeSet::new()), Seen::InDoubt(_)));
        let views = [
            view(1, false, vec![]),
            view(2, false, vec![]),
            view(2, false, vec![]),
        ];
        assert_eq!(
            promotable(&judge(&views, &BTreeSet::new())),
            Vec::<u16>::new()
        );
    }

    #[test]
    fn a_replica_reporting_itself_primary_counts_unless_it_was_the_primary() {
        // During a failover, as a Sentinel that has not heard of it lists
        // the replica being promoted.
        let views = [view(
            1,
            false,
            vec![replica(2, true, false), replica(3, true, true)],
        )];
        assert_eq!(promotable(&judge(&views, &BTreeSet::new())), [2, 3]);
        // After it: the old primary, not yet turned into a replica.
        let demoted = BTreeSet::from([at(2)]);
        assert_eq!(promotable(&judge(&views, &demoted)), [3]);
    }
}
