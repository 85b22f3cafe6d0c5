//! A Redis Cluster connection that learns the cluster's layout again when
//! a node it still sends a slot to answers `CLUSTERDOWN` for it.
//!
//! A node removed with `redis-cli --cluster del-node` and left running is
//! reset: it knows no slot and answers `CLUSTERDOWN` for every key. The
//! cluster client retries `CLUSTERDOWN` on the same node without asking
//! the cluster where the slot is now, and when it does ask, it asks any
//! node it knows, the removed one included (whose empty answer would
//! leave it with no slot at all). So after a `CLUSTERDOWN` the connection
//! is built afresh from the primaries that report a healthy cluster, and a
//! job whose slot moved reaches its owner on its next try.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use redis::RedisResult;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo, SingleNodeRoutingInfo};

use crate::settings::ClusterTarget;

/// How often the layout may be learned afresh.
const AGAIN_AFTER: Duration = Duration::from_secs(2);

/// A cluster connection that can be replaced by a fresh one.
pub(crate) struct Clustered {
    target: ClusterTarget,
    certs: Option<redis::TlsCertificates>,
    conn: Mutex<ClusterConnection>,
    /// Held while learning the layout, with when that was last done.
    relearned: tokio::sync::Mutex<Option<Instant>>,
}

impl Clustered {
    /// Connects to the cluster `target` names.
    pub(crate) async fn connect(
        target: &ClusterTarget,
        certs: Option<redis::TlsCertificates>,
    ) -> RedisResult<Self> {
        let conn = super::conn::cluster_client(target, certs.clone())?
            .get_async_connection()
            .await?;
        Ok(Self {
            target: target.clone(),
            certs,
            conn: Mutex::new(conn),
            relearned: tokio::sync::Mutex::new(None),
        })
    }

    /// The connection in use (a cheap handle).
    pub(crate) fn get(&self) -> ClusterConnection {
        // Nothing panics while holding the lock.
        self.conn
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// After a call failed with `e`: if a node answered `CLUSTERDOWN` (or
    /// the call timed out), builds the connection afresh from the primaries that report the
    /// cluster healthy (at most every [`AGAIN_AFTER`]; a cluster that is
    /// down everywhere changes nothing).
    pub(crate) async fn check<T>(&self, result: &RedisResult<T>) {
        let Err(e) = result else { return };
        // The client retries CLUSTERDOWN for longer than a request may
        // take: what reaches here is then a timeout.
        if !cluster_down(e) && !e.is_timeout() {
            return;
        }
        let mut last = self.relearned.lock().await;
        if last.is_some_and(|t| t.elapsed() < AGAIN_AFTER) {
            return;
        }
        *last = Some(Instant::now());
        match self.healthy_primaries().await {
            Ok(nodes) if !nodes.is_empty() => {
                let target = ClusterTarget {
                    nodes: nodes.clone(),
                    ..self.target.clone()
                };
                let fresh = match super::conn::cluster_client(&target, self.certs.clone()) {
                    Ok(client) => client.get_async_connection().await,
                    Err(e) => Err(e),
                };
                match fresh {
                    Ok(conn) => {
                        tracing::warn!(error = %e, nodes = ?nodes, "a Redis Cluster node answered CLUSTERDOWN: learned the layout again from the healthy primaries");
                        *self.conn.lock().unwrap_or_else(PoisonError::into_inner) = conn;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "could not connect to the Redis Cluster afresh")
                    }
                }
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "could not ask the Redis Cluster's primaries"),
        }
    }

    /// The primaries the connection knows that report `cluster_state:ok`
    /// and serve slots.
    async fn healthy_primaries(&self) -> RedisResult<Vec<(String, u16)>> {
        let mut conn = self.get();
        let every = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
        let pings = conn.route_command(redis::cmd("PING"), every).await;
        // A fan-out fails as a whole if one node fails: then the nodes the
        // settings name are asked instead.
        let known: Vec<(String, u16)> = match pings.and_then(|v| {
            redis::from_redis_value::<Vec<(String, redis::Value)>>(v).map_err(Into::into)
        }) {
            Ok(replies) => replies
                .into_iter()
                .filter_map(|(addr, _)| {
                    let (host, port) = addr.rsplit_once(':')?;
                    Some((host.trim_matches(['[', ']']).to_owned(), port.parse().ok()?))
                })
                .collect(),
            Err(_) => self.target.nodes.clone(),
        };
        let mut healthy = Vec::new();
        for (host, port) in known {
            let at = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                host: host.clone(),
                port,
            });
            let info = tokio::time::timeout(
                Duration::from_secs(1),
                conn.route_command(cluster_info(), at),
            )
            .await;
            let Ok(Ok(info)) = info else { continue };
            let Ok(info) = redis::from_redis_value::<String>(info) else {
                continue;
            };
            let serves = info.lines().any(|l| {
                l.strip_prefix("cluster_slots_assigned:")
                    .and_then(|n| n.trim().parse::<u32>().ok())
                    .is_some_and(|n| n > 0)
            });
            if info.contains("cluster_state:ok") && serves {
                healthy.push((host, port));
            }
        }
        Ok(healthy)
    }
}

fn cluster_info() -> redis::Cmd {
    let mut cmd = redis::cmd("CLUSTER");
    cmd.arg("INFO");
    cmd
}

/// Whether `e` is, or holds (a pipeline's), a `CLUSTERDOWN`.
fn cluster_down(e: &redis::RedisError) -> bool {
    e.code() == Some("CLUSTERDOWN")
        || e.clone()
            .into_server_errors()
            .is_some_and(|errors| errors.iter().any(|(_, se)| se.code() == "CLUSTERDOWN"))
}
