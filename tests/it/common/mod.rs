//! Helpers shared by the integration tests: per-test names, connections to the
//! real services, and clean-up that runs even when a test fails.

pub(crate) mod harness;
pub(crate) mod model;
pub(crate) mod script;
pub(crate) mod smtp;
pub(crate) mod tls;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mailgate::domain::{EmailAddress, IpKey, JobId, Name, Ticket};
use mailgate::ledger::{Admission, Entry, JobRef, Ledger, MemoryLedger, RedisLedger, Verdict};
use mailgate::limiter::overrides::Override;
use mailgate::limiter::{Clock, Quotas, Request};
use mailgate::settings::{LimitSettings, RedisSettings, Rule, ScopeRules};

/// The Redis the tests share (the development machine's, or CI's).
pub(crate) fn redis_url() -> String {
    std::env::var("MAILGATE_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
}

/// A name no other test, run or process uses: `mgtest:<test>:<pid>-<n>-<nanos>:`.
pub(crate) fn unique_prefix(test: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "mgtest:{test}:{}-{}-{nanos}:",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Redis settings with a fresh key prefix.
pub(crate) fn redis_settings(prefix: &str) -> RedisSettings {
    RedisSettings::new(redis_url(), prefix.to_owned())
}

/// A ledger plus whatever must be cleaned up after it.
pub(crate) struct Built<L> {
    pub ledger: L,
    _cleanup: Option<RedisCleanup>,
    /// The Redis (URL) and key prefix the ledger writes to; `None` in memory.
    store: Option<(String, String)>,
}

impl<L> Built<L> {
    /// The key prefix the ledger writes under (a Redis ledger's).
    pub(crate) fn prefix(&self) -> &str {
        self.store.as_ref().map_or("", |(_, prefix)| prefix)
    }

    /// Deletes job `id`'s record, as Redis does once it lapses (records
    /// outlive `dedup_for` by an hour, longer than a test waits). In
    /// memory, a record lapses as the test's clock moves on.
    pub(crate) async fn lapse_record(&self, id: &str) {
        let Some((url, prefix)) = &self.store else {
            return;
        };
        let key = format!("{prefix}job:{id}");
        let deleted: i64 = if let Some(nodes) = url.strip_prefix("redis+cluster://") {
            let nodes = nodes
                .split(',')
                .map(|n| format!("redis://{n}"))
                .collect::<Vec<_>>();
            let mut c = redis::cluster::ClusterClient::new(nodes)
                .expect("a cluster client")
                .get_async_connection()
                .await
                .expect("the test's cluster");
            redis::cmd("DEL").arg(&key).query_async(&mut c).await
        } else {
            let mut c = redis::Client::open(url.as_str())
                .and_then(|c| c.get_connection())
                .expect("the shared Redis");
            redis::cmd("DEL").arg(&key).query(&mut c)
        }
        .expect("DEL");
        assert_eq!(deleted, 1, "{key} existed");
    }
}

/// A ledger whose overrides a test sets.
pub(crate) trait Overridable {
    /// Puts exactly `ovs` in force.
    async fn put_overrides(&self, ovs: Vec<Override>);
}

impl Overridable for RedisLedger {
    async fn put_overrides(&self, ovs: Vec<Override>) {
        for old in self.overrides().list().await.expect("list") {
            self.overrides().remove(&old.target).await.expect("remove");
        }
        for ov in &ovs {
            self.overrides().add(ov).await.expect("add");
        }
        self.overrides().reload().await.expect("reload");
    }
}

impl Overridable for MemoryLedger {
    async fn put_overrides(&self, ovs: Vec<Override>) {
        self.set_overrides(ovs);
    }
}

/// Builds a fresh, empty ledger of one backend.
pub(crate) trait Make {
    type L: Ledger + Quotas + Overridable + Clone + 'static;
    async fn make(&self, test: &str, limits: LimitSettings) -> Built<Self::L>;
}

/// The Redis ledger on the shared Redis, under a fresh prefix.
pub(crate) struct RedisBackend;
impl Make for RedisBackend {
    type L = RedisLedger;
    async fn make(&self, test: &str, limits: LimitSettings) -> Built<RedisLedger> {
        on_shared_redis(test, limits).await
    }
}

/// A Redis ledger on the shared Redis under a fresh prefix (named for
/// `test`).
pub(crate) async fn on_shared_redis(test: &str, limits: LimitSettings) -> Built<RedisLedger> {
    let prefix = unique_prefix(test);
    let cleanup = RedisCleanup {
        prefix: prefix.clone(),
    };
    let settings = redis_settings(&prefix);
    let ledger = RedisLedger::connect(&settings, &limits)
        .await
        .expect("connect to the shared Redis");
    Built {
        ledger,
        _cleanup: Some(cleanup),
        store: Some((redis_url(), prefix)),
    }
}

/// The Redis ledger on a [`PrivateCluster`] (the one [`PrivateCluster::url`]
/// the running test started), under a fresh prefix whose hash tag puts all
/// of a ledger's keys in one slot.
pub(crate) struct ClusterBackend;
impl Make for ClusterBackend {
    type L = RedisLedger;
    async fn make(&self, test: &str, limits: LimitSettings) -> Built<RedisLedger> {
        let url = CLUSTER_URL
            .get()
            .expect("a cluster test starts its PrivateCluster first");
        // The cluster is the test's own and goes with it: nothing to clean.
        let prefix = format!("{{{}}}", unique_prefix(test));
        let ledger =
            RedisLedger::connect(&RedisSettings::new(url.clone(), prefix.clone()), &limits)
                .await
                .expect("connect to the test's cluster");
        Built {
            ledger,
            _cleanup: None,
            store: Some((url.clone(), prefix)),
        }
    }
}

/// The Redis ledger on a [`PrivateCluster`] (as [`ClusterBackend`]), under a
/// fresh prefix without a hash tag: its keys spread over the shards, and
/// every admission reserves in each scope (`redis.spreads_keys`).
pub(crate) struct SpreadBackend;
impl Make for SpreadBackend {
    type L = RedisLedger;
    async fn make(&self, test: &str, limits: LimitSettings) -> Built<RedisLedger> {
        let url = CLUSTER_URL
            .get()
            .expect("a cluster test starts its PrivateCluster first");
        let settings = RedisSettings::new(url.clone(), unique_prefix(test));
        assert!(settings.spreads_keys());
        let ledger = RedisLedger::connect(&settings, &limits)
            .await
            .expect("connect to the test's cluster");
        Built {
            ledger,
            _cleanup: None,
            store: Some((url.clone(), settings.key_prefix)),
        }
    }
}

/// The URL of the cluster this test process started, for [`ClusterBackend`]
/// and [`SpreadBackend`].
static CLUSTER_URL: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// A Redis Cluster of the test's own: three primaries on free ports, their
/// slots assigned by `redis-cli --cluster create`. Killed, and its files
/// removed, when dropped.
pub(crate) struct PrivateCluster {
    nodes: Vec<KillOnDrop>,
    pub ports: Vec<u16>,
    dir: std::path::PathBuf,
    /// Each node's extra `redis-server` arguments.
    args: Vec<String>,
}

impl PrivateCluster {
    pub(crate) fn start() -> Self {
        Self::start_with(0)
    }

    /// Three primaries with `replicas` replicas each; a primary that stops
    /// answering is failed over after a second (`cluster-node-timeout`).
    pub(crate) fn start_with(replicas: usize) -> Self {
        Self::start_configured(replicas, &[])
    }

    /// As [`PrivateCluster::start_with`], each node started with these
    /// extra arguments (e.g. a command renamed, as managed services do).
    pub(crate) fn start_configured(replicas: usize, args: &[&str]) -> Self {
        let ports: Vec<u16> = (0..3 * (1 + replicas))
            .map(|_| free_cluster_port())
            .collect();
        let dir = std::env::temp_dir().join(format!("mgtest-cluster-{}", ports[0]));
        std::fs::create_dir_all(&dir).expect("a temp dir");
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        let nodes = (ports.iter())
            .map(|port| Self::node(*port, &dir, &args))
            .collect();
        let me = Self {
            nodes,
            ports,
            dir,
            args,
        };
        for port in &me.ports {
            me.until(|| {
                redis::Client::open(format!("redis://127.0.0.1:{port}/"))
                    .and_then(|c| c.get_connection())
                    .is_ok()
            });
        }
        let addrs: Vec<String> = me.ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let created = std::process::Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdout(std::process::Stdio::null())
            .status()
            .expect("redis-cli runs");
        assert!(created.success(), "redis-cli --cluster create");
        for port in &me.ports {
            me.until(|| {
                std::process::Command::new("redis-cli")
                    .args(["-p", &port.to_string(), "cluster", "info"])
                    .output()
                    .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("cluster_state:ok"))
            });
        }
        let _ = CLUSTER_URL.set(me.url());
        me
    }

    fn until(&self, ready: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !ready() {
            assert!(
                std::time::Instant::now() < deadline,
                "the private cluster did not come up"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The port of the primary that holds `key`'s slot now, if one does (not
    /// while a failover is under way).
    pub(crate) fn primary_of(&self, key: &str) -> Option<u16> {
        // Asked of the first node that answers (one may have been killed).
        let cli = |args: &[&str]| {
            self.ports
                .iter()
                .map(|port| {
                    let out = std::process::Command::new("redis-cli")
                        .args(["-p", &port.to_string()])
                        .args(args)
                        .output()
                        .expect("redis-cli runs");
                    String::from_utf8_lossy(&out.stdout).into_owned()
                })
                .find(|out| !out.trim().is_empty())
                .unwrap_or_default()
        };
        let slot: u16 = cli(&["cluster", "keyslot", key])
            .trim()
            .parse()
            .expect("a slot");
        // CLUSTER NODES: id addr@bus flags master ping pong epoch state slots…
        cli(&["cluster", "nodes"])
            .lines()
            .filter(|l| l.contains("master") && !l.contains("fail"))
            .find(|l| {
                l.split_whitespace().skip(8).any(|range| {
                    let (a, b) = range.split_once('-').unwrap_or((range, range));
                    matches!((a.parse::<u16>(), b.parse::<u16>()), (Ok(a), Ok(b)) if (a..=b).contains(&slot))
                })
            })
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|addr| addr.split('@').next()?.rsplit(':').next()?.parse().ok())
    }

    /// A node on `port`, keeping its cluster file (and nothing else) in
    /// `dir`.
    fn node(port: u16, dir: &std::path::Path, args: &[String]) -> KillOnDrop {
        let child = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--cluster-enabled", "yes", "--cluster-node-timeout", "1000"])
            .args(["--cluster-config-file", &format!("nodes-{port}.conf")])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--dbfilename", &format!("dump-{port}.rdb")])
            .arg("--dir")
            .arg(dir)
            .args(args)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server is installed");
        KillOnDrop(child)
    }

    /// Starts the node on `port` again, empty: it rejoins the cluster (its
    /// cluster file remembers it), as a replica if another took its place.
    pub(crate) fn restart(&mut self, port: u16) {
        let i = self
            .ports
            .iter()
            .position(|p| *p == port)
            .expect("a node's port");
        self.nodes[i] = Self::node(port, &self.dir, &self.args);
    }

    /// A new primary, with no slots, joined to the cluster (and named by
    /// [`PrivateCluster::url`] from now on); its port.
    pub(crate) fn add_node(&mut self) -> u16 {
        let port = free_cluster_port();
        self.nodes.push(Self::node(port, &self.dir, &self.args));
        self.until(|| {
            redis::Client::open(format!("redis://127.0.0.1:{port}/"))
                .and_then(|c| c.get_connection())
                .is_ok()
        });
        let added = std::process::Command::new("redis-cli")
            .args(["--cluster", "add-node"])
            .arg(format!("127.0.0.1:{port}"))
            .arg(format!("127.0.0.1:{}", self.ports[0]))
            .stdout(std::process::Stdio::null())
            .status()
            .expect("redis-cli runs");
        assert!(added.success(), "redis-cli --cluster add-node");
        self.ports.push(port);
        // Every node knows every other (the new one learns the others by
        // gossip, after they learn it), and the cluster is whole.
        let ids: Vec<String> = self
            .ports
            .iter()
            .map(|p| redis_cli(*p, &["cluster", "myid"]))
            .collect();
        self.until(|| {
            self.ports.iter().all(|p| {
                let nodes = redis_cli(*p, &["cluster", "nodes"]);
                ids.iter().all(|id| nodes.contains(id.as_str()))
                    && redis_cli(*p, &["cluster", "info"]).contains("cluster_state:ok")
            })
        });
        port
    }

    /// Kills (SIGKILL) the node on `port`.
    pub(crate) fn kill(&mut self, port: u16) {
        let i = self
            .ports
            .iter()
            .position(|p| *p == port)
            .expect("a node's port");
        let _ = self.nodes[i].0.kill();
        let _ = self.nodes[i].0.wait();
    }

    /// `redis+cluster://` naming every node.
    pub(crate) fn url(&self) -> String {
        let nodes: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+cluster://{}", nodes.join(","))
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        self.nodes.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The in-memory ledger.
pub(crate) struct MemoryBackend;
impl Make for MemoryBackend {
    type L = MemoryLedger;
    async fn make(&self, _test: &str, limits: LimitSettings) -> Built<MemoryLedger> {
        Built {
            ledger: MemoryLedger::new(&limits),
            _cleanup: None,
            store: None,
        }
    }
}

/// One job as the tests name it: id, mailbox, client, purpose.
#[derive(Clone)]
pub(crate) struct TestJob {
    pub id: JobId,
    pub email: EmailAddress,
    pub ip: Option<IpKey>,
    pub purpose: Option<Name>,
    pub session: Option<mailgate::domain::Session>,
}

impl TestJob {
    pub(crate) fn new(job: &str, mail: &str, from: Option<&str>) -> Self {
        Self {
            id: id(job),
            email: email(mail),
            ip: from.map(ip),
            purpose: None,
            session: None,
        }
    }

    pub(crate) fn purpose(mut self, purpose: Option<&str>) -> Self {
        self.purpose = purpose.map(|p| Name::parse("purpose", p).expect("test purpose"));
        self
    }

    pub(crate) fn request(&self) -> Request<'_> {
        Request {
            id: &self.id,
            email: &self.email,
            ip: self.ip.as_ref(),
            purpose: self.purpose.as_ref(),
            session: self.session.as_ref(),
            known_mailbox: false,
        }
    }

    pub(crate) fn by<'a>(&'a self, ticket: &'a Ticket) -> JobRef<'a> {
        self.attempt(ticket, 1)
    }

    /// Attempt `attempt` of lineage `ticket`.
    pub(crate) fn attempt<'a>(&'a self, ticket: &'a Ticket, attempt: u32) -> JobRef<'a> {
        JobRef {
            request: self.request(),
            ticket,
            attempt,
            holder: holder(ticket, attempt),
        }
    }

    /// The whole admission for lineage `ticket` at `clock`.
    pub(crate) async fn admission<L: Ledger>(
        &self,
        l: &L,
        ticket: &Ticket,
        clock: Clock,
    ) -> Admission {
        let entry = Entry {
            job: self.by(ticket),
            expires_at_ms: None,
            made_at_ms: None,
        };
        l.admit(&entry, clock).await.expect("the ledger answers")
    }

    /// Admission for lineage `ticket` at `clock`.
    pub(crate) async fn admit<L: Ledger>(&self, l: &L, ticket: &Ticket, clock: Clock) -> Verdict {
        let a = self.admission(l, ticket, clock).await;
        if let Clock::At(t) = clock {
            assert_eq!(a.decided_at_ms, t, "decided_at_ms is the decision time");
        }
        a.verdict
    }
}

/// The holder of attempt `attempt` of lineage `ticket` in the tests: one
/// per lineage and attempt, as if each were handled once. A test of two
/// handlings of one attempt sets `JobRef::holder` itself.
pub(crate) fn holder(ticket: &Ticket, attempt: u32) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (ticket.as_str(), attempt).hash(&mut h);
    h.finish()
}

/// Deletes every Redis key under a prefix when dropped, pass or fail.
pub(crate) struct RedisCleanup {
    pub prefix: String,
}

impl RedisCleanup {
    /// Every key under the prefix, with its remaining TTL in ms (-1: none).
    pub(crate) fn keys_with_ttl(&self) -> Vec<(String, i64)> {
        let mut conn = sync_redis();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}*", self.prefix))
            .query(&mut conn)
            .expect("KEYS");
        keys.into_iter()
            .map(|k| {
                let ttl: i64 = redis::cmd("PTTL").arg(&k).query(&mut conn).expect("PTTL");
                (k, ttl)
            })
            .collect()
    }
}

impl Drop for RedisCleanup {
    fn drop(&mut self) {
        let mut conn = sync_redis();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}*", self.prefix))
            .query(&mut conn)
            .unwrap_or_default();
        for chunk in keys.chunks(500) {
            let _: Result<(), _> = redis::cmd("DEL").arg(chunk).query(&mut conn);
        }
    }
}

pub(crate) fn sync_redis() -> redis::Connection {
    redis::Client::open(redis_url())
        .and_then(|c| c.get_connection())
        .expect("the shared Redis must answer (see README: the test command starts it)")
}

/// Rules from `(window_ms, max)` pairs.
pub(crate) fn rules(rs: &[(u64, u32)]) -> ScopeRules {
    ScopeRules {
        rules: rs
            .iter()
            .map(|&(ms, max)| Rule::new(Duration::from_millis(ms), max))
            .collect(),
    }
}

/// `lim` with 30 more purposes, `p00` to `p29`, each with rules of its own
/// (an hour's `email`, `ip` and `domain` max): calls then name rule sets
/// numbered past 64.
pub(crate) fn with_30_purposes(
    mut lim: LimitSettings,
    (email, ip, domain): (u32, u32, u32),
) -> LimitSettings {
    for i in 0..30 {
        lim.purpose.insert(
            format!("p{i:02}"),
            mailgate::settings::PurposeLimits {
                email: Some(rules(&[(HOUR, email)])),
                ip: Some(rules(&[(HOUR, ip)])),
                domain: Some(rules(&[(HOUR, domain)])),
                supersede: None,
            },
        );
    }
    lim
}

/// The default policy with other rules.
pub(crate) fn limits(email: &[(u64, u32)], ip: &[(u64, u32)]) -> LimitSettings {
    LimitSettings {
        email: rules(email),
        ip: rules(ip),
        ..LimitSettings::default()
    }
}

pub(crate) fn email(s: &str) -> EmailAddress {
    EmailAddress::parse(s).expect("test email")
}

pub(crate) fn ip(s: &str) -> IpKey {
    IpKey::parse(s).expect("test ip")
}

pub(crate) fn id(s: &str) -> JobId {
    JobId::parse(s).expect("test id")
}

pub(crate) const SEC: u64 = 1000;
pub(crate) const MIN: u64 = 60 * SEC;
pub(crate) const HOUR: u64 = 60 * MIN;

/// A `redis-server` of the test's own on a free port, for tests that break
/// or flush a server. Killed when dropped.
pub(crate) struct PrivateRedis {
    child: std::process::Child,
    pub port: u16,
    args: Vec<String>,
    /// The file whose offset (ms) moves the server's wall clock, for a
    /// server started with [`PrivateRedis::start_shiftable`].
    shift: Option<std::path::PathBuf>,
}

impl PrivateRedis {
    pub(crate) fn start() -> Self {
        Self::start_with(&[])
    }

    /// A server started with these extra arguments (e.g. a memory policy).
    pub(crate) fn start_with(args: &[&str]) -> Self {
        let port = free_port();
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        let child = Self::spawn(port, &args, None);
        let me = Self {
            child,
            port,
            args,
            shift: None,
        };
        me.wait_until_up();
        me
    }

    /// A server whose wall clock [`PrivateRedis::shift_clock`] moves (as an
    /// NTP step on its host would), through `tests/clockshift.c`, built
    /// here with `cc` and preloaded.
    pub(crate) fn start_shiftable() -> Self {
        let port = free_port();
        let file =
            std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("clockshift-{port}"));
        std::fs::write(&file, format!("{:<24}", 0)).expect("the offset file");
        let child = Self::spawn(port, &[], Some(&file));
        let me = Self {
            child,
            port,
            args: Vec::new(),
            shift: Some(file),
        };
        me.wait_until_up();
        me
    }

    /// Moves the server's wall clock to `offset_ms` from the real time
    /// (its monotonic clock keeps going).
    pub(crate) fn shift_clock(&self, offset_ms: i64) {
        use std::os::unix::fs::FileExt as _;
        let file = self.shift.as_ref().expect("a shiftable server");
        // Overwritten in place, at a fixed width, never truncated: the
        // server reads the file on every clock call and must never see it
        // empty.
        std::fs::OpenOptions::new()
            .write(true)
            .open(file)
            .and_then(|f| f.write_all_at(format!("{offset_ms:<24}").as_bytes(), 0))
            .expect("the offset file");
    }

    /// The environment that moves another process's wall clock with this
    /// server's (as one bad NTP source would both hosts').
    pub(crate) fn clock_env(&self) -> [(&'static str, std::path::PathBuf); 2] {
        let file = self.shift.clone().expect("a shiftable server");
        [
            ("LD_PRELOAD", clockshift().to_path_buf()),
            ("CLOCKSHIFT_FILE", file),
        ]
    }

    fn spawn(port: u16, args: &[String], shift: Option<&std::path::Path>) -> std::process::Child {
        let mut c = std::process::Command::new("redis-server");
        c.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .args(args)
            .stdout(std::process::Stdio::null());
        if let Some(file) = shift {
            c.env("LD_PRELOAD", clockshift())
                .env("CLOCKSHIFT_FILE", file);
        }
        c.spawn().expect("redis-server is installed")
    }

    fn wait_until_up(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while redis::Client::open(self.url())
            .and_then(|c| c.get_connection())
            .is_err()
        {
            assert!(
                std::time::Instant::now() < deadline,
                "private redis did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the server (SIGKILL): everything in it is gone.
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Stops the server in its tracks (SIGSTOP): connections stay open and
    /// nothing is answered, as in a long stall; `resume` lets it go on.
    pub(crate) fn pause(&self) {
        self.signal("-STOP");
    }

    /// See [`PrivateRedis::pause`].
    pub(crate) fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        let ok = std::process::Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig}");
    }

    /// Starts a fresh server on the same port.
    pub(crate) fn restart(&mut self) {
        self.kill();
        self.child = Self::spawn(self.port, &self.args, self.shift.as_deref());
        self.wait_until_up();
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// A plain connection to it, for a test to set up or read keys.
    pub(crate) fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection())
            .expect("the private Redis answers")
    }
}

/// `tests/clockshift.c` built as a shared library (once per test binary).
fn clockshift() -> &'static std::path::Path {
    static LIB: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    LIB.get_or_init(|| {
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
        let lib = dir.join(format!("clockshift-{}.so", std::process::id()));
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clockshift.c");
        let ok = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&lib)
            .arg(&src)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "cc builds tests/clockshift.c");
        lib
    })
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(file) = &self.shift {
            let _ = std::fs::remove_file(file);
        }
    }
}

/// A TCP port nobody listens on right now.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A free port for a Redis Cluster node: at most 55 535, whose cluster bus
/// port (10 000 higher) is free too. redis-server refuses a higher port
/// ("Redis port number too high"). [`free_port`]'s listener (SO_REUSEADDR)
/// is given the lower half of the ephemeral range first, so this was rare;
/// but under load the kernel hands out the upper half, and a CI run's
/// cluster "did not come up".
pub(crate) fn free_cluster_port() -> u16 {
    loop {
        let port = free_port();
        if port <= 55_535 && std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

/// A RabbitMQ node of the test's own (name, ports and data dir of its own),
/// for tests that break a broker (an alarm) without touching the shared one.
/// Stopped, and its files removed, when dropped.
pub(crate) struct PrivateRabbit {
    pub node: String,
    pub port: u16,
    dir: std::path::PathBuf,
}

impl PrivateRabbit {
    pub(crate) fn start() -> Self {
        Self::start_with("")
    }

    /// A node with these lines in its `rabbitmq.conf` (e.g. a TLS listener).
    pub(crate) fn start_with(conf: &str) -> Self {
        let port = free_port();
        let dist = free_port();
        let node = format!("mgtest{}x{port}@localhost", std::process::id());
        let dir = std::env::temp_dir().join(format!("mgtest-rabbit-{port}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("mnesia")).expect("a data dir");
        std::fs::create_dir_all(dir.join("log")).expect("a log dir");
        std::fs::write(dir.join("enabled_plugins"), "[].\n").expect("no plugins");
        std::fs::write(dir.join("rabbitmq.conf"), conf).expect("a config file");
        // rabbitmq-server drops to the rabbitmq user when started as root.
        let _ = std::process::Command::new("chown")
            .args(["-R", "rabbitmq:rabbitmq"])
            .arg(&dir)
            .status();
        let path = |p: &str| dir.join(p).display().to_string();
        let ok = std::process::Command::new("rabbitmq-server")
            .arg("-detached")
            .env("RABBITMQ_NODENAME", &node)
            .env("RABBITMQ_NODE_PORT", port.to_string())
            .env("RABBITMQ_DIST_PORT", dist.to_string())
            .env("RABBITMQ_MNESIA_BASE", path("mnesia"))
            .env("RABBITMQ_LOG_BASE", path("log"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", path("enabled_plugins"))
            .env("RABBITMQ_CONFIG_FILE", path("rabbitmq.conf"))
            .env("RABBITMQ_PID_FILE", path("pid"))
            .env("RABBITMQ_FEATURE_FLAGS_FILE", path("feature_flags"))
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "rabbitmq-server -detached");
        let me = Self { node, port, dir };
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        while !me.ctl(&["await_startup", "--timeout", "5"]) {
            assert!(
                std::time::Instant::now() < deadline,
                "the private RabbitMQ node did not start; see {}",
                me.dir.join("log").display()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        me
    }

    pub(crate) fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    /// `rabbitmqctl -n <node> args…`; whether it succeeded.
    pub(crate) fn ctl(&self, args: &[&str]) -> bool {
        std::process::Command::new("rabbitmqctl")
            .args(["-q", "-n", &self.node])
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Raises a memory alarm (every publisher is blocked), or clears it.
    pub(crate) fn memory_alarm(&self, on: bool) {
        let watermark = if on { "0.000001" } else { "0.4" };
        assert!(self.ctl(&["set_vm_memory_high_watermark", watermark]));
    }
}

impl Drop for PrivateRabbit {
    fn drop(&mut self) {
        let _ = self.ctl(&["stop"]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A child process (a worker binary) killed when the test ends, failed
/// assertions included, so a failing test leaves nothing running.
pub(crate) struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A worker binary's log, kept in a file and printed when the test fails,
/// so a fault seen once (under CI's load) leaves its evidence in CI's
/// output. Declare it before the [`KillOnDrop`] of its worker, so the
/// worker is gone, its log complete, when this prints it.
pub(crate) struct LogOnFailure(pub std::path::PathBuf);

impl LogOnFailure {
    /// A fresh file for `test`'s worker log.
    pub(crate) fn new(test: &str) -> Self {
        let name = unique_prefix(test).replace(':', "-");
        Self(std::env::temp_dir().join(format!("{name}log")))
    }

    /// Where the worker writes its log (its stderr).
    pub(crate) fn stderr(&self) -> std::process::Stdio {
        std::fs::File::create(&self.0)
            .map_or_else(|_| std::process::Stdio::null(), std::process::Stdio::from)
    }
}

impl Drop for LogOnFailure {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.0).unwrap_or_default();
            eprintln!("--- the worker's log ---\n{log}");
        }
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A TCP proxy in front of Redis that can drop the next reply: it cuts the
/// connection when Redis answers, after Redis has run the command.
pub(crate) struct ReplyCutter {
    pub port: u16,
    pub cut_next: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl ReplyCutter {
    pub(crate) fn start(upstream: u16) -> Self {
        use std::io::{Read, Write};
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut_next = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let cut = cut_next.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                let (mut c, mut s) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut c, &mut s);
                });
                let cut = cut.clone();
                std::thread::spawn(move || {
                    let (mut from, mut to) = (server, client);
                    let mut buf = [0u8; 16 * 1024];
                    while let Ok(n) = from.read(&mut buf) {
                        if n == 0 || cut.swap(false, Ordering::SeqCst) {
                            break;
                        }
                        if to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = to.shutdown(std::net::Shutdown::Both);
                    let _ = from.shutdown(std::net::Shutdown::Both);
                });
            }
        });
        Self { port, cut_next }
    }
}

/// Force-closes every RabbitMQ connection whose name contains `needle`
/// (as an operator would with `rabbitmqctl close_connection`). Returns how
/// many were closed.
pub(crate) fn close_connections(needle: &str) -> usize {
    let out = std::process::Command::new("rabbitmqctl")
        .args(["-q", "list_connections", "pid", "client_properties"])
        .output()
        .expect("rabbitmqctl runs");
    let listing = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut closed = 0;
    for line in listing.lines().filter(|l| l.contains(needle)) {
        let pid = line.split_whitespace().next().expect("a pid column");
        let ok = std::process::Command::new("rabbitmqctl")
            .args(["-q", "close_connection", pid, "closed by a mailgate test"])
            .status()
            .expect("rabbitmqctl runs")
            .success();
        closed += usize::from(ok);
    }
    closed
}

/// Rewrites string job record `key` as a hash of the same fields, as
/// builds before 2026-12-03 could write it (`redis.record_form = "hash"`,
/// their default), with the same TTL.
pub(crate) fn to_hash(conn: &mut impl redis::ConnectionLike, key: &str) {
    let ttl: i64 = redis::cmd("PTTL").arg(key).query(conn).unwrap();
    let text: String = redis::cmd("GET").arg(key).query(conn).unwrap();
    let f: Vec<&str> = text.splitn(8, '|').collect();
    let head = f[0].as_bytes();
    let (st, ans, fin) = (head[0] as char, head[1] as char, head[2] as char);
    let mut fields: Vec<String> = vec!["st".into(), st.into(), "ans".into(), ans.into()];
    for (name, value) in [
        ("lease", f[1]),
        ("own", f[2]),
        ("n", f[3]),
        ("c", f[4]),
        ("at", f[5]),
        ("fp", f[7]),
    ] {
        fields.extend([name.to_owned(), value.to_owned()]);
    }
    if fin != '-' {
        fields.extend(["fin".to_owned(), fin.to_string()]);
    }
    if !f[6].is_empty() {
        fields.extend(["rv".to_owned(), f[6].to_owned()]);
    }
    let () = redis::cmd("DEL").arg(key).query(conn).unwrap();
    let () = redis::cmd("HSET")
        .arg(key)
        .arg(&fields)
        .query(conn)
        .unwrap();
    let () = redis::cmd("PEXPIRE").arg(key).arg(ttl).query(conn).unwrap();
}

/// `redis-cli -p port args…`, its output trimmed (for tests that drive a
/// private server or cluster node).
pub(crate) fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = std::process::Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli runs");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Sends `signal` (e.g. "-TERM") to `child` and waits for it to exit within
/// `within`, returning its output (stderr piped by the caller). A child
/// that outlives the wait is killed and the test fails.
pub(crate) async fn signal_and_wait(
    child: std::process::Child,
    signal: &str,
    within: Duration,
) -> std::process::Output {
    let pid = child.id().to_string();
    let sent = std::process::Command::new("kill")
        .args([signal, &pid])
        .status()
        .unwrap();
    assert!(sent.success(), "kill {signal} {pid}");
    let waited = tokio::time::timeout(
        within,
        tokio::task::spawn_blocking(move || child.wait_with_output()),
    )
    .await;
    match waited {
        Ok(out) => out.unwrap().unwrap(),
        Err(_) => {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid])
                .status();
            panic!("the process did not exit within {within:?} of {signal}");
        }
    }
}
