//! `redis.url`, read once when it is set: which kind of Redis it names
//! (one server, a Sentinel-watched primary, a cluster, or the worker's own
//! memory), and where.

use serde::Deserialize;

use crate::redact::{Secret, SecretUrl, redact_url};

/// `redis.url`: the URL as written (its credentials kept out of `Debug`
/// and `Display`, as [`SecretUrl`] does) and, parsed once when it is set,
/// the [`RedisTarget`] it names or why it names none (refused when the
/// settings are checked). Deserialized as a string; set from one with
/// `.into()`.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(from = "SecretUrl")]
pub struct RedisUrl {
    url: SecretUrl,
    target: Result<RedisTarget, String>,
}

impl RedisUrl {
    /// What the URL names, or what is wrong with it.
    pub fn target(&self) -> Result<&RedisTarget, &str> {
        self.target.as_ref().map_err(String::as_str)
    }
}

impl From<SecretUrl> for RedisUrl {
    fn from(url: SecretUrl) -> Self {
        let target = RedisTarget::parse(&url);
        Self { url, target }
    }
}

url_type!(RedisUrl);

/// Where `redis.url` points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// The worker's own memory (`memory://`).
    Memory,
    /// One server, reached at a fixed address: the URL as the redis crate
    /// reads it (`redis://`, `rediss://`, `redis+unix://`, `unix://`).
    Server(SecretUrl),
    /// The primary that a group of Redis Sentinels names.
    Sentinel(SentinelTarget),
    /// A Redis Cluster, found from any of its nodes.
    Cluster(ClusterTarget),
}

/// A `redis+cluster://` URL's parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterTarget {
    /// Nodes to learn the cluster's layout from (at least one; the port
    /// defaults to 6379).
    pub nodes: Vec<(String, u16)>,
    /// The nodes' user (ACL), percent-decoded.
    pub username: Option<String>,
    /// The nodes' password, percent-decoded.
    pub password: Option<Secret>,
    /// TLS to every node (`rediss+cluster://`).
    pub tls: bool,
}

/// A `redis+sentinel://` URL's parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentinelTarget {
    /// The Sentinels, in the order they are asked (at least one; the port
    /// defaults to 26379).
    pub sentinels: Vec<(String, u16)>,
    /// The name the Sentinels monitor the primary under.
    pub service: String,
    /// The database on the primary.
    pub db: i64,
    /// The primary's user (ACL), percent-decoded.
    pub username: Option<String>,
    /// The primary's password, percent-decoded.
    pub password: Option<Secret>,
    /// The Sentinels' own user (`?sentinel_username=`), if they have ACLs.
    pub sentinel_username: Option<String>,
    /// The Sentinels' own password (`?sentinel_password=`), if they ask for
    /// one (`requirepass` in sentinel.conf); none by default.
    pub sentinel_password: Option<Secret>,
    /// TLS to the Sentinels and the primary (`rediss+sentinel://`).
    pub tls: bool,
}

/// The port a Sentinel listens on unless the URL names another.
const SENTINEL_PORT: u16 = 26379;

impl RedisTarget {
    /// Reads `redis.url`. Errors name what is wrong, never the password.
    pub(super) fn parse(url: &str) -> Result<Self, String> {
        if is_memory(url) {
            return Ok(RedisTarget::Memory);
        }
        let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
        let (sentinel, tls) = match scheme {
            "redis+sentinel" => (true, false),
            "rediss+sentinel" => (true, true),
            "redis+cluster" => (false, false),
            "rediss+cluster" => (false, true),
            _ => {
                return redis::Client::open(url)
                    .map(|_| RedisTarget::Server(url.into()))
                    .map_err(|e| e.to_string().replace(url, &redact_url(url)));
            }
        };
        let parts = ListUrl::split(scheme, rest, sentinel)?;
        if sentinel {
            parts.sentinel(tls)
        } else {
            parts.cluster(tls)
        }
    }
}

/// Whether `url` names the worker's own memory (`memory://`).
pub(super) fn is_memory(url: &str) -> bool {
    url.starts_with("memory:")
}

/// A sentinel or cluster URL's parts, before they are read as one or the
/// other: `scheme://[user:pass@]host:port,host:port,…[/path][?query]`.
struct ListUrl<'a> {
    /// The servers' user, percent-decoded.
    username: Option<String>,
    /// The servers' password, percent-decoded.
    password: Option<Secret>,
    /// `?sentinel_username=` (only a Sentinel URL takes it).
    sentinel_username: Option<String>,
    /// `?sentinel_password=` (only a Sentinel URL takes it).
    sentinel_password: Option<Secret>,
    /// The listed hosts, each with its port or the default one.
    hosts: Vec<(String, u16)>,
    /// What follows the hosts' `/`.
    path: &'a str,
}

impl<'a> ListUrl<'a> {
    /// Takes `rest` (what follows `scheme://`) apart.
    fn split(scheme: &str, rest: &'a str, sentinel: bool) -> Result<Self, String> {
        // Everything up to the last '@' is userinfo, as in redact_url.
        let (userinfo, rest) = match rest.rsplit_once('@') {
            Some((u, r)) => (Some(u), r),
            None => (None, rest),
        };
        let (username, password) = match userinfo.map(|u| u.split_once(':').unwrap_or((u, ""))) {
            None => (None, None),
            Some((user, pass)) => (
                Some(decode(user, "user")?).filter(|u| !u.is_empty()),
                Some(decode(pass, "password")?).filter(|p| !p.is_empty()),
            ),
        };
        if rest.contains('#') {
            return Err(format!("a {scheme} URL takes no fragment"));
        }
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (sentinel_username, sentinel_password) = sentinel_query(scheme, query, sentinel)?;
        let (hosts, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (what, port) = if sentinel {
            ("sentinel", SENTINEL_PORT)
        } else {
            ("cluster node", 6379)
        };
        let hosts = hosts
            .split(',')
            .map(|h| list_address(h, port, what))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            username,
            password: password.map(Secret::from),
            sentinel_username,
            sentinel_password,
            hosts,
            path,
        })
    }

    /// The parts as a cluster's: it has no path (only database 0).
    fn cluster(self, tls: bool) -> Result<RedisTarget, String> {
        if !self.path.is_empty() {
            return Err(
                "a cluster has only database 0: redis+cluster://host:port,host:port".into(),
            );
        }
        Ok(RedisTarget::Cluster(ClusterTarget {
            nodes: self.hosts,
            username: self.username,
            password: self.password,
            tls,
        }))
    }

    /// The parts as a Sentinel group's: the path is `/service[/db]`.
    fn sentinel(self, tls: bool) -> Result<RedisTarget, String> {
        let mut path = self.path.split('/');
        let service = path.next().unwrap_or("");
        if service.is_empty() {
            return Err("it names no service: redis+sentinel://host:port,…/service[/db]".into());
        }
        let service = decode(service, "service name")?;
        let db = match path.next() {
            None | Some("") => 0,
            Some(db) => db
                .parse()
                .map_err(|_| format!("its database {db:?} is not a number"))?,
        };
        if path.next().is_some() {
            return Err("its path is /service or /service/db, nothing after".into());
        }
        Ok(RedisTarget::Sentinel(SentinelTarget {
            sentinels: self.hosts,
            service,
            db,
            username: self.username,
            password: self.password,
            sentinel_username: self.sentinel_username,
            sentinel_password: self.sentinel_password,
            tls,
        }))
    }
}

/// `s`, percent-decoded; an error names `what` it is, never the value.
fn decode(s: &str, what: &str) -> Result<String, String> {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| format!("its {what} is not UTF-8 once percent-decoded"))
}

/// The Sentinels' own credentials from a Sentinel URL's query; any other
/// parameter (or any at all in a cluster URL) is refused.
fn sentinel_query(
    scheme: &str,
    query: &str,
    sentinel: bool,
) -> Result<(Option<String>, Option<Secret>), String> {
    let (mut sentinel_username, mut sentinel_password) = (None, None);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("sentinel_username", v)) if sentinel => {
                sentinel_username = Some(decode(v, "sentinel_username")?);
            }
            Some(("sentinel_password", v)) if sentinel => {
                sentinel_password = Some(decode(v, "sentinel_password")?.into());
            }
            _ => {
                let name = pair.split('=').next().unwrap_or(pair);
                return Err(format!(
                    "a {scheme} URL takes no query parameter {name:?}{}",
                    if sentinel {
                        " (only sentinel_username and sentinel_password)"
                    } else {
                        ""
                    }
                ));
            }
        }
    }
    Ok((sentinel_username, sentinel_password))
}

/// One `host[:port]` (`[v6]:port` for IPv6) of a sentinel or cluster URL
/// (`what` names which, `default_port` is used when it names none).
fn list_address(item: &str, default_port: u16, what: &str) -> Result<(String, u16), String> {
    let item = item.trim();
    let (host, port) = match item.strip_prefix('[') {
        Some(v6) => {
            let (host, after) = v6
                .split_once(']')
                .ok_or_else(|| format!("{what} {item:?} has no closing ']'"))?;
            (host, after.strip_prefix(':'))
        }
        None => match item.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (item, None),
        },
    };
    if host.is_empty() {
        return Err(format!(
            "a {what}'s host is empty ({item:?}); list them as host:port,host:port"
        ));
    }
    let v6 = item.starts_with('[');
    if !host
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-._".contains(c) || (v6 && ":%".contains(c)))
    {
        return Err(format!(
            "{what} {item:?} is not a host name or address; list them as host:port,host:port"
        ));
    }
    let port = match port {
        None => default_port,
        Some(p) => p
            .parse()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("{what} {item:?} has no valid port"))?,
    };
    Ok((host.to_owned(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sentinel_url_names_its_sentinels_service_db_and_credentials() {
        let target = |url: &str| RedisTarget::parse(url);
        assert_eq!(
            target("redis+sentinel://u:p%40ss@s1:26380,[::1],s3/mymaster/2"),
            Ok(RedisTarget::Sentinel(SentinelTarget {
                sentinels: vec![
                    ("s1".into(), 26380),
                    ("::1".into(), 26379),
                    ("s3".into(), 26379)
                ],
                service: "mymaster".into(),
                db: 2,
                username: Some("u".into()),
                password: Some("p@ss".into()),
                sentinel_username: None,
                sentinel_password: None,
                tls: false,
            }))
        );
        let Ok(RedisTarget::Sentinel(t)) =
            target("redis+sentinel://s1/m?sentinel_username=sv&sentinel_password=Zq%26x81Lm")
        else {
            panic!("Sentinel credentials");
        };
        assert_eq!(
            (
                t.sentinel_username.as_deref(),
                t.sentinel_password.as_deref()
            ),
            (Some("sv"), Some("Zq&x81Lm"))
        );
        assert!(!format!("{t:?}").contains("Zq&x81Lm"));
        assert_eq!(
            redact_url("redis+sentinel://s1/m?sentinel_password=Zq%26x81Lm"),
            "redis+sentinel://s1/m?sentinel_password=***"
        );
        let Ok(RedisTarget::Sentinel(t)) = target("rediss+sentinel://:pw@s1/main") else {
            panic!("a TLS sentinel URL");
        };
        assert!(t.tls && t.db == 0 && t.username.is_none());
        assert_eq!(t.password.as_deref(), Some("pw"));
        assert!(!format!("{t:?}").contains("pw"));
        assert_eq!(
            target("redis://127.0.0.1:6379/0"),
            Ok(RedisTarget::Server("redis://127.0.0.1:6379/0".into()))
        );
        let server = target("redis://:Xk9p7sLm2@127.0.0.1:6379/0");
        assert!(!format!("{server:?}").contains("Xk9p7sLm2"));
        assert_eq!(target("memory://"), Ok(RedisTarget::Memory));
        for (url, says) in [
            ("redis+sentinel://s1:26379", "no service"),
            ("redis+sentinel://s1:26379/", "no service"),
            ("redis+sentinel://s1:x/m", "no valid port"),
            ("redis+sentinel://s1,,s2/m", "host is empty"),
            ("redis+sentinel://s1/m/zero", "not a number"),
            ("redis+sentinel://s1/m/0/x", "nothing after"),
            ("redis+sentinel://s1/m?db=1", "no query parameter \"db\""),
            (
                "redis+cluster://n1?sentinel_password=x",
                "no query parameter",
            ),
            ("redis+sentinel://s1/m#x", "no fragment"),
        ] {
            let e = target(url).expect_err(url);
            assert!(e.contains(says), "{url}: {e}");
        }
        // Redacted with its hosts shown.
        assert_eq!(
            redact_url("redis+sentinel://u:Xk9p7sLm2@s1:26379,s2:26379/mymaster"),
            "redis+sentinel://u:***@s1:26379,s2:26379/mymaster"
        );
    }

    #[test]
    fn a_cluster_url_names_its_nodes() {
        assert_eq!(
            RedisTarget::parse("redis+cluster://:p%2Cw@n1:7000,n2,[::1]:7002"),
            Ok(RedisTarget::Cluster(ClusterTarget {
                nodes: vec![
                    ("n1".into(), 7000),
                    ("n2".into(), 6379),
                    ("::1".into(), 7002)
                ],
                username: None,
                password: Some("p,w".into()),
                tls: false,
            }))
        );
        let e = RedisTarget::parse("redis+cluster://n1:7000/1").unwrap_err();
        assert!(e.contains("only database 0"), "{e}");
        assert_eq!(
            redact_url("rediss+cluster://u:Xk9p7sLm2@n1:7000,n2:7001"),
            "rediss+cluster://u:***@n1:7000,n2:7001"
        );
    }
}
