//! The one connection the ledger, its support tools and the overrides
//! share: to a fixed Redis server, to the primary that Redis Sentinel
//! names, or to a Redis Cluster.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{Cmd, ConnectionAddr, Pipeline, RedisFuture, RedisResult, Value};

use super::cluster::Clustered;
use super::sentinel::Followed;
use crate::settings::{ClusterTarget, RedisSettings, RedisTarget, SentinelTarget};
use crate::tls::LinkTls;

/// How long connecting, or one request, may take.
const TIMEOUT: Duration = Duration::from_secs(5);

/// A multiplexed connection to the Redis primary that holds the logs and
/// records. A request made while Redis is away (or while a failover is under
/// way) fails, and callers treat that as transient; the next request
/// connects again: to the same address for a fixed server, or, through
/// Sentinel, to whichever server is primary by then.
#[derive(Clone)]
pub(crate) enum Conn {
    /// `redis://`, `rediss://`, a Unix socket.
    Server(ConnectionManager),
    /// `redis+sentinel://`.
    Sentinel(Arc<Followed>),
    /// One connection of a [`Followed`] primary, for a write and its `WAIT`
    /// ([`Conn::pin`]).
    Pinned(Arc<Followed>, u64, MultiplexedConnection),
    /// `redis+cluster://`: the keys of each call share one slot (every key
    /// carries the key prefix's hash tag, or the call names one key), and
    /// the connection routes it to that slot's primary (following the
    /// cluster when slots move or a replica is promoted).
    Cluster(Arc<Clustered>),
}

/// Opens a [`Conn`]; fails if Redis (or no Sentinel, or the primary it
/// names) answers now, so a bad URL shows at start-up.
pub(crate) async fn connect(redis: &RedisSettings) -> RedisResult<Conn> {
    let invalid = |e: String| {
        redis::RedisError::from((redis::ErrorKind::InvalidClientConfig, "redis.url", e))
    };
    let tls = redis.link_tls();
    let certs = certificates(&tls.map_err(|e| invalid(crate::report::one_line(&e)))?);
    match redis.target().map_err(|e| invalid(e.to_owned()))? {
        RedisTarget::Memory => Err(invalid("memory:// has no connection".into())),
        RedisTarget::Server(url) => {
            // redis-rs leaves Nagle's algorithm on. Requests go out back to
            // back on the one multiplexed connection, and a batch of
            // admissions can span several segments on a real network: the
            // last, short segment would wait for the ACK of the ones before
            // it, which Redis may delay (it has no whole command to answer
            // yet) by up to its delayed-ACK timeout.
            let info = redis::IntoConnectionInfo::into_connection_info(url.as_str())?
                .set_tcp_settings(nodelay());
            let client = match certs {
                Some(certs) => redis::Client::build_with_tls(info, certs)?,
                None => redis::Client::open(info)?,
            };
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(TIMEOUT))
                .set_response_timeout(Some(TIMEOUT))
                .set_number_of_retries(2);
            Ok(Conn::Server(
                ConnectionManager::new_with_config(client, config).await?,
            ))
        }
        RedisTarget::Sentinel(target) => {
            let client = sentinel_client(target, certs.clone())?;
            Ok(Conn::Sentinel(
                Followed::start(target, client, certs).await?,
            ))
        }
        RedisTarget::Cluster(target) => Ok(Conn::Cluster(Arc::new(
            Clustered::connect(target, certs).await?,
        ))),
    }
}

/// Why Redis refuses mailgate for good, if `e` says it does: a refusal
/// that will not go away by itself (an ACL that forbids the scripts or the
/// keys under `prefix`, a read-only replica, credentials refused, a
/// database the server does not have); `None` for any other error.
pub(crate) fn refusal(e: &redis::RedisError, prefix: &str) -> Option<String> {
    // A command the script runs and the ACL forbids fails the script with
    // an ERR naming the script's user, not with NOPERM.
    let in_script = e.to_string().contains("executing the script can't run");
    Some(match e.code() {
        _ if in_script => format!(
            "the Redis user may not run a command of mailgate's script ({e}); it needs \
             EVALSHA, EVAL and SCRIPT LOAD (and FCALL and FUNCTION LOAD, where Redis has \
             functions), and write access to keys under {prefix:?}"
        ),
        Some("NOPERM") => format!(
            "the Redis user may not run a command mailgate needs ({e}); it needs EVALSHA, \
             EVAL and SCRIPT LOAD (and FCALL and FUNCTION LOAD, where Redis has functions), \
             HGETALL, HGET and HLEN for the overrides, and read and write access to keys under \
             {prefix:?}"
        ),
        Some("READONLY") => {
            format!("Redis is a read-only replica ({e}); point redis.url at the primary")
        }
        Some("WRONGPASS" | "NOAUTH") => {
            format!("Redis refused the credentials in redis.url ({e})")
        }
        _ if e.kind() == redis::ErrorKind::AuthenticationFailed => {
            format!("Redis refused the credentials in redis.url ({e})")
        }
        _ if e.to_string().contains("DB index is out of range") => {
            format!("redis.url names a database this Redis does not have ({e})")
        }
        _ => return None,
    })
}

impl Conn {
    /// The connection a write that must reach `min` replicas runs on, with
    /// the replicas its `WAIT` must count: `min` on a fixed server or a
    /// cluster; behind Sentinel, a connection pinned to the primary and
    /// `min` or, if more, every replica of it a Sentinel could promote now,
    /// so that a promotion cannot lose what was acknowledged ([`Followed`]).
    pub(crate) async fn pin(&self, min: u32) -> RedisResult<(Conn, u32)> {
        match self {
            Conn::Sentinel(f) => {
                let p = f.pin(min).await?;
                Ok((Conn::Pinned(f.clone(), p.generation, p.conn), p.replicas))
            }
            _ => Ok((self.clone(), min)),
        }
    }

    /// `INFO section` of the server that holds `key` (on a cluster, that
    /// key's primary; elsewhere, the one server), or with no key of every
    /// primary (of a cluster's shards; elsewhere, the one server).
    pub(crate) async fn info(&self, section: &str, key: Option<&str>) -> RedisResult<Vec<String>> {
        let mut cmd = redis::cmd("INFO");
        cmd.arg(section);
        self.each_server(cmd, key).await
    }

    /// `cmd`'s reply from the server that holds `key` (on a cluster, that
    /// key's primary; elsewhere, the one server), or with no key from
    /// every primary (of a cluster's shards; elsewhere, the one server).
    pub(crate) async fn each_server<T: redis::FromRedisValue>(
        &self,
        cmd: redis::Cmd,
        key: Option<&str>,
    ) -> RedisResult<Vec<T>> {
        let Conn::Cluster(c) = self else {
            return Ok(vec![cmd.query_async(&mut self.clone()).await?]);
        };
        let Some(key) = key else {
            let every = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
            // Without a response policy, the reply maps each node to its own.
            // A node's error comes back inside the map: raised here, with
            // its code (NOPERM, ERR …), not as a reply of the wrong shape.
            let replies = c.get().route_command(cmd, every).await?.extract_error()?;
            let replies: Vec<(String, T)> = redis::from_redis_value(replies)?;
            return Ok(replies.into_iter().map(|(_, reply)| reply).collect());
        };
        let node = Route::with_key(key, SlotAddr::Master);
        let v = c
            .get()
            .route_command(
                cmd,
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(node)),
            )
            .await?
            .extract_error()?;
        Ok(vec![redis::from_redis_value(v)?])
    }

    /// Each primary's clock (`TIME`, in ms since the epoch), by server: on
    /// a cluster every shard's primary, whose hosts may each keep their own
    /// time; elsewhere the one server, named `server`.
    pub(crate) async fn times(&self) -> RedisResult<Vec<(String, u64)>> {
        let time = redis::cmd("TIME");
        let replies: Vec<(String, (u64, u64))> = match self {
            Conn::Cluster(c) => {
                let every = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                redis::from_redis_value(c.get().route_command(time, every).await?.extract_error()?)?
            }
            _ => vec![(
                "server".to_owned(),
                time.query_async(&mut self.clone()).await?,
            )],
        };
        Ok(replies
            .into_iter()
            .map(|(node, (s, us))| (node, s.saturating_mul(1000).saturating_add(us / 1000)))
            .collect())
    }
}

/// A server a `SCAN` visits: the one server (or the primary Sentinel
/// names), or one of a cluster's primaries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ScanNode {
    /// The server the connection reaches.
    Server,
    /// A cluster's primary, at `host:port`.
    Primary(String, u16),
}

impl std::fmt::Display for ScanNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ScanNode::Server => f.write_str("server"),
            ScanNode::Primary(host, port) => write!(f, "{host}:{port}"),
        }
    }
}

impl Conn {
    /// The servers a `SCAN` must visit to see every key: on a cluster each
    /// shard's primary (a `SCAN` sees one node's keys); elsewhere the one
    /// server.
    pub(crate) async fn scan_nodes(&self) -> RedisResult<Vec<ScanNode>> {
        let Conn::Cluster(c) = self else {
            return Ok(vec![ScanNode::Server]);
        };
        let every = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
        let replies = c.get().route_command(redis::cmd("PING"), every).await?;
        let replies: Vec<(String, Value)> = redis::from_redis_value(replies)?;
        replies
            .into_iter()
            .map(|(addr, _)| {
                let port = addr
                    .rsplit_once(':')
                    .and_then(|(h, p)| Some((h, p.parse().ok()?)));
                port.map(|(host, port)| ScanNode::Primary(host.to_owned(), port))
                    .ok_or_else(|| {
                        redis::RedisError::from((
                            redis::ErrorKind::Client,
                            "a cluster node's address",
                            addr,
                        ))
                    })
            })
            .collect()
    }

    /// One page of `SCAN cursor MATCH pattern COUNT count` on `node`: the
    /// next cursor (0 when the scan is done) and the keys, as bytes (keys
    /// that are not mailgate's need not be UTF-8).
    pub(crate) async fn scan_page(
        &self,
        node: &ScanNode,
        cursor: u64,
        pattern: &str,
        count: usize,
    ) -> RedisResult<(u64, Vec<Vec<u8>>)> {
        let mut scan = redis::cmd("SCAN");
        scan.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(count);
        match (self, node) {
            (Conn::Cluster(c), ScanNode::Primary(host, port)) => {
                let at = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                });
                Ok(redis::from_redis_value(
                    c.get().route_command(scan, at).await?,
                )?)
            }
            _ => scan.query_async(&mut self.clone()).await,
        }
    }
}

/// Where a transaction every command of which was answered ASK should go
/// (`host`, `port`), if that is why `e` aborted it.
fn asked_to(e: &redis::RedisError) -> Option<(String, u16)> {
    let errors = e.clone().into_server_errors()?;
    let mut to = None;
    for (_, se) in errors.iter() {
        let (host, port) = se.details()?.split_whitespace().nth(1)?.rsplit_once(':')?;
        let at = (host.trim_matches(['[', ']']).to_owned(), port.parse().ok()?);
        if se.code() != "ASK" || to.as_ref().is_some_and(|t| *t != at) {
            return None;
        }
        to = Some(at);
    }
    to
}

/// What redis-rs needs of a link's TLS: the CA bundle it trusts instead of
/// the bundled roots, and the client certificate, as PEM. `None` when
/// neither is set (the bundled roots, no client certificate).
fn certificates(tls: &LinkTls) -> Option<redis::TlsCertificates> {
    crate::tls::install_provider();
    let root_cert = tls.roots_pem();
    let client_tls = tls
        .identity_pem()
        .map(|(cert, key)| redis::ClientTlsConfig {
            client_cert: cert.to_vec(),
            client_key: key.to_vec(),
        });
    (root_cert.is_some() || client_tls.is_some()).then_some(redis::TlsCertificates {
        client_tls,
        root_cert,
    })
}

/// A client for the cluster `target` names (its nodes, credentials, TLS).
pub(super) fn cluster_client(
    target: &ClusterTarget,
    certs: Option<redis::TlsCertificates>,
) -> RedisResult<redis::cluster::ClusterClient> {
    let scheme = if target.tls { "rediss" } else { "redis" };
    let nodes: Vec<String> = target
        .nodes
        .iter()
        .map(|(host, port)| match host.contains(':') {
            true => format!("{scheme}://[{host}]:{port}"),
            false => format!("{scheme}://{host}:{port}"),
        })
        .collect();
    // The client's own retries follow MOVED and ASK (a reshard) and ride
    // out a failover; they also send a call again after a dropped
    // connection or a response timeout, when the script may have run. So
    // every script call is safe to run again: a run again answers as the
    // first did (ledger.lua's batch, scope.lua's reserve: a create run twice
    // must not give its reservations back under its own record). Without
    // retries, a reshard would fail every job whose slot moved.
    let mut builder = ClusterClientBuilder::new(nodes)
        .connection_timeout(TIMEOUT)
        .response_timeout(TIMEOUT)
        .tcp_settings(nodelay());
    if let Some(user) = &target.username {
        builder = builder.username(user);
    }
    if let Some(pass) = &target.password {
        builder = builder.password(pass);
    }
    if let Some(certs) = certs {
        builder = builder.certs(certs);
    }
    builder.build()
}

fn nodelay() -> redis::io::tcp::TcpSettings {
    redis::io::tcp::TcpSettings::default().set_nodelay(true)
}

fn sentinel_client(
    target: &SentinelTarget,
    certs: Option<redis::TlsCertificates>,
) -> RedisResult<SentinelClient> {
    let sentinels = target.sentinels.iter().map(|(host, port)| {
        if target.tls {
            ConnectionAddr::TcpTls {
                host: host.clone(),
                port: *port,
                insecure: false,
                tls_params: None,
            }
        } else {
            ConnectionAddr::Tcp(host.clone(), *port)
        }
    });
    let mut builder =
        SentinelClientBuilder::new(sentinels, &target.service, SentinelServerType::Master)?
            .set_client_to_redis_db(target.db)
            .set_client_to_redis_tcp_settings(nodelay())
            .set_client_to_sentinel_tcp_settings(nodelay());
    if target.tls {
        builder = builder
            .set_client_to_redis_tls_mode(redis::TlsMode::Secure)
            .set_client_to_sentinel_tls_mode(redis::TlsMode::Secure);
    }
    // The Sentinels and the primary are one deployment: one CA, one
    // client certificate.
    if let Some(certs) = certs {
        builder = builder
            .set_client_to_redis_certificates(certs.clone())
            .set_client_to_sentinel_certificates(certs);
    }
    if let Some(user) = &target.username {
        builder = builder.set_client_to_redis_username(user);
    }
    if let Some(pass) = &target.password {
        builder = builder.set_client_to_redis_password(pass);
    }
    if let Some(user) = &target.sentinel_username {
        builder = builder.set_client_to_sentinel_username(user);
    }
    if let Some(pass) = &target.sentinel_password {
        builder = builder.set_client_to_sentinel_password(pass);
    }
    builder.build()
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Server(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => Box::pin(async move {
                let result = c.get().req_packed_command(cmd).await;
                c.check(&result).await;
                result
            }),
            Conn::Sentinel(f) => Box::pin(async move {
                let (generation, mut conn) = f.connection().await?;
                let result = conn.req_packed_command(cmd).await;
                f.check(generation, &result);
                result
            }),
            Conn::Pinned(f, generation, conn) => Box::pin(async move {
                let result = conn.req_packed_command(cmd).await;
                f.check(*generation, &result);
                result
            }),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Server(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(clustered) => Box::pin(async move {
                let mut c = clustered.get();
                let result = match c.req_packed_commands(cmd, offset, count).await {
                    // A slot being migrated: the cluster client follows the
                    // ASK with ASKING, which covers one command, so the
                    // pipeline's next command is refused again. Its
                    // commands one by one each follow it (a pipeline that is
                    // not a transaction is not atomic anyway; the ones
                    // mailgate sends are reads, or writes that are the same
                    // when run again).
                    Err(e) if e.code() == Some("ASK") && !cmd.is_transaction() => {
                        let mut values = Vec::with_capacity(cmd.len());
                        for one in cmd.cmd_iter() {
                            values.push(c.req_packed_command(one).await?);
                        }
                        Ok(values.into_iter().skip(offset).take(count).collect())
                    }
                    // A transaction refused with ASK (each queued command
                    // answered ASK, so EXEC aborted and nothing ran): the
                    // client does not follow it. Sent again to the node the
                    // slot is moving to, after ASKING, which covers the
                    // whole transaction there.
                    Err(e) if cmd.is_transaction() => match asked_to(&e) {
                        Some((host, port)) => {
                            let mut again = redis::pipe();
                            again.cmd("ASKING").cmd("MULTI");
                            for one in cmd.cmd_iter() {
                                again.add_command(one.clone());
                            }
                            again.cmd("EXEC");
                            let at = SingleNodeRoutingInfo::ByAddress { host, port };
                            let n = again.len();
                            let mut values = c.route_pipeline(again, 0, n, at).await?;
                            Ok(values.pop().into_iter().collect())
                        }
                        None => Err(e),
                    },
                    other => other,
                };
                clustered.check(&result).await;
                result
            }),
            Conn::Sentinel(f) => Box::pin(async move {
                let (generation, mut conn) = f.connection().await?;
                let result = conn.req_packed_commands(cmd, offset, count).await;
                f.check(generation, &result);
                result
            }),
            Conn::Pinned(f, generation, conn) => Box::pin(async move {
                let result = conn.req_packed_commands(cmd, offset, count).await;
                f.check(*generation, &result);
                result
            }),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Server(c) => c.get_db(),
            Conn::Cluster(c) => c.get().get_db(),
            Conn::Sentinel(f) => f.db(),
            Conn::Pinned(_, _, c) => c.get_db(),
        }
    }
}

/// The oldest Redis the ledger runs on: a refund rewrites a log with
/// `SET … KEEPTTL` (6.0).
pub(crate) const OLDEST_REDIS: (u32, u32) = (6, 0);

impl Conn {
    /// The version of a primary older than [`OLDEST_REDIS`], if one is;
    /// `None` too where `INFO` is refused (the scripts then say what
    /// fails).
    pub(crate) async fn too_old(&self) -> Option<String> {
        let infos = self.info("server", None).await.ok()?;
        infos.iter().find_map(|info| {
            let version = info
                .lines()
                .find_map(|l| l.strip_prefix("redis_version:"))?
                .trim();
            (version_of(version)? < OLDEST_REDIS).then(|| version.to_owned())
        })
    }
}

/// `major.minor` of a Redis version ("7.0.15" → (7, 0)).
fn version_of(text: &str) -> Option<(u32, u32)> {
    let mut parts = text.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redis_version_reads_as_major_and_minor() {
        assert_eq!(version_of("7.0.15"), Some((7, 0)));
        assert_eq!(version_of("6.2"), Some((6, 2)));
        assert!(version_of("5.0.14").unwrap() < OLDEST_REDIS);
        assert!(version_of("6.0.0").unwrap() >= OLDEST_REDIS);
        assert_eq!(version_of("seven"), None);
        assert_eq!(version_of("7"), None);
    }
}
