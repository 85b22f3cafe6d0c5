//! The real worker against the shared RabbitMQ and Redis and an in-process
//! SMTP server, under names no other test uses, cleaned up afterwards.

use std::time::{Duration, Instant};

use lapin::options::{
    BasicAckOptions, BasicGetOptions, BasicPublishOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use mailgate::settings::{
    AmqpSettings, HttpSettings, LimitSettings, QueueType, RetrySettings, Settings, SmtpSettings,
    TemplateSettings, WorkerSettings,
};
use serde_json::Value;
use tokio::sync::oneshot;

use super::smtp::SmtpSink;
use super::{RedisCleanup, redis_settings, unique_prefix};

pub(crate) fn amqp_url() -> String {
    std::env::var("MAILGATE_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// The queue type tests declare: the product's default (quorum), or what
/// `MAILGATE_TEST_QUEUE_TYPE` (`classic` or `quorum`) says.
pub(crate) fn queue_type() -> QueueType {
    match std::env::var("MAILGATE_TEST_QUEUE_TYPE").as_deref() {
        Ok("classic") => QueueType::Classic,
        Ok("quorum") => QueueType::Quorum,
        Ok(other) => panic!("MAILGATE_TEST_QUEUE_TYPE={other}: classic or quorum"),
        Err(_) => QueueType::default(),
    }
}

pub(crate) struct Harness {
    pub settings: Settings,
    pub sink: SmtpSink,
    pub channel: Channel,
    _conn: Connection,
    _redis: RedisCleanup,
    /// Extra queues the test declared (reply queues), deleted at the end.
    extra_queues: std::sync::Mutex<Vec<String>>,
}

/// A worker running in this process.
pub(crate) struct WorkerHandle {
    /// Where its HTTP endpoint listens.
    pub http: std::net::SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    join: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl WorkerHandle {
    /// Asks the worker to stop (as SIGTERM does) and waits for it to return.
    pub(crate) async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        tokio::time::timeout(Duration::from_secs(30), &mut self.join)
            .await
            .expect("the worker stops within 30s")
            .expect("the worker task did not panic")
    }
}

impl Harness {
    pub(crate) async fn new(test: &str) -> Self {
        Self::with(test, |_| {}).await
    }

    /// A harness whose settings `tweak` adjusts.
    pub(crate) async fn with(test: &str, tweak: impl FnOnce(&mut Settings)) -> Self {
        // The worker's log, at info unless RUST_LOG says otherwise: the test
        // runner shows it when the test fails (a fault seen once under CI's
        // load leaves its evidence).
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("mailgate=info"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
        let prefix = unique_prefix(test);
        let queue_prefix = prefix.replace(':', ".");
        let sink = SmtpSink::start();
        let mut settings = Settings {
            amqp: AmqpSettings {
                url: amqp_url().into(),
                jobs_queue: format!("{queue_prefix}jobs"),
                results_queue: format!("{queue_prefix}results"),
                prefetch: 16,
                timeout: Duration::from_secs(10),
                queue_type: queue_type(),
                tls: Default::default(),
                results_ttl: std::time::Duration::from_secs(86_400),
            },
            redis: redis_settings(&prefix),
            smtp: SmtpSettings {
                url: sink.url().into(),
                relays: Vec::new(),
                circuit: Default::default(),
                from: "Acme <no-reply@acme.example>".into(),
                pool_size: 4,
                timeout: Duration::from_secs(5),
                tls: Default::default(),
                canary: None,
            },
            http: HttpSettings {
                listen: "127.0.0.1:0".parse().expect("an address"),
            },
            templates: TemplateSettings::default(),
            retry: RetrySettings {
                max_attempts: 5,
                initial: Duration::from_millis(100),
                max: Duration::from_millis(400),
            },
            worker: WorkerSettings {
                shutdown_timeout: Duration::from_secs(10),
            },
            limits: LimitSettings::default(),
            telemetry: Default::default(),
        };
        tweak(&mut settings);
        settings.validate().expect("test settings are valid");
        let conn = mailgate::broker::connect_node(&settings.amqp, ConnectionProperties::default())
            .await
            .expect("the shared RabbitMQ answers (see README: the test command starts it)");
        let channel = conn.create_channel().await.expect("channel");
        Self {
            _redis: RedisCleanup { prefix },
            settings,
            sink,
            channel,
            _conn: conn,
            extra_queues: std::sync::Mutex::new(Vec::new()),
        }
    }

    pub(crate) async fn start_worker(&self) -> WorkerHandle {
        let worker = mailgate::worker::build(&self.settings)
            .await
            .expect("the worker builds");
        let http = worker.http_addr();
        let (tx, rx) = oneshot::channel::<()>();
        let join = tokio::spawn(worker.run(async {
            let _ = rx.await;
        }));
        // The worker declares its queues before consuming; wait for that so
        // jobs published next are not routed to nowhere.
        self.wait_for_queue(&self.settings.amqp.jobs_queue).await;
        WorkerHandle {
            http,
            stop: Some(tx),
            join,
        }
    }

    /// Waits until `name` exists and has a consumer.
    pub(crate) async fn wait_for_queue(&self, name: &str) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let passive = QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            };
            // A failed passive declare closes the channel; use a fresh one.
            let ch = self._conn.create_channel().await.expect("channel");
            if let Ok(q) = ch
                .queue_declare(name.into(), passive, FieldTable::default())
                .await
                && q.consumer_count() > 0
            {
                let _ = ch.close(200, "ok".into()).await;
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the worker did not start consuming {name}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The `mailgate` binary at `exe` running `args`, with the environment
    /// pointed at this harness's queues, keys and SMTP server.
    pub(crate) fn command(&self, exe: &str, args: &[&str]) -> std::process::Command {
        let s = &self.settings;
        let mut c = std::process::Command::new(exe);
        c.args(args)
            .env("MAILGATE_CONFIG", self.config_file())
            .env("MAILGATE__AMQP__JOBS_QUEUE", &s.amqp.jobs_queue)
            .env("MAILGATE__AMQP__RESULTS_QUEUE", &s.amqp.results_queue)
            .env("MAILGATE__AMQP__URL", s.amqp.url.as_str())
            .env("MAILGATE__REDIS__KEY_PREFIX", &s.redis.key_prefix)
            .env("MAILGATE__REDIS__URL", s.redis.url.as_str())
            .env("MAILGATE__SMTP__URL", s.smtp.url.as_str())
            .env("MAILGATE__SMTP__POOL_SIZE", s.smtp.pool_size.to_string())
            .env("MAILGATE__AMQP__PREFETCH", s.amqp.prefetch.to_string())
            .env("MAILGATE__AMQP__QUEUE_TYPE", s.amqp.queue_type.as_str())
            .env(
                "MAILGATE__SMTP__TIMEOUT",
                humantime::format_duration(s.smtp.timeout).to_string(),
            )
            .env(
                "MAILGATE__LIMITS__SEND_LEASE",
                humantime::format_duration(s.limits.send_lease).to_string(),
            )
            .env(
                "MAILGATE__RETRY__MAX_ATTEMPTS",
                s.retry.max_attempts.to_string(),
            )
            .env(
                "MAILGATE__RETRY__INITIAL",
                humantime::format_duration(s.retry.initial).to_string(),
            )
            .env(
                "MAILGATE__RETRY__MAX",
                humantime::format_duration(s.retry.max).to_string(),
            )
            .env("MAILGATE__HTTP__LISTEN", "127.0.0.1:0")
            .env_remove("RUST_LOG");
        c
    }

    /// The shipped config with the harness's domain scope in place of the
    /// shipped one (none unless the test sets one): the binary runs the
    /// shipped limits otherwise, and most tests mail many mailboxes at
    /// example.com. Written once per harness; removed with it.
    fn config_file(&self) -> std::path::PathBuf {
        let path = self.config_path();
        let shipped = std::fs::read_to_string("config/default.toml").expect("the shipped config");
        let domain = &self.settings.limits.domain;
        let rules: Vec<String> = (domain.rules.iter())
            .map(|r| format!("{{ window = \"{}ms\", max = {} }}", r.window_ms(), r.max))
            .collect();
        let exempt: Vec<String> = (domain.exempt.iter()).map(|d| format!("\"{d}\"")).collect();
        let mut out = String::with_capacity(shipped.len());
        let mut skipping = false;
        for line in shipped.lines() {
            if line.starts_with('[') {
                skipping = line.starts_with("[limits.domain]");
                if skipping {
                    out.push_str(&format!(
                        "[limits.domain]\nrules = [{}]\nexempt = [{}]\n",
                        rules.join(", "),
                        exempt.join(", ")
                    ));
                }
            }
            if !skipping {
                out.push_str(line);
                out.push('\n');
            }
        }
        std::fs::write(&path, out).expect("the test's config file");
        path
    }

    fn config_path(&self) -> std::path::PathBuf {
        let name = self.settings.amqp.jobs_queue.replace(['.', ':'], "-");
        std::env::temp_dir().join(format!("{name}.toml"))
    }

    /// A fresh channel, for checks that may close it (a passive declare of
    /// a missing queue does).
    pub(crate) async fn channel_for_checks(&self) -> Channel {
        self._conn.create_channel().await.expect("channel")
    }

    /// How many messages `queue` holds (ready), or `None` if there is no
    /// such queue: a passive declare on a channel of its own (a miss
    /// closes that channel).
    pub(crate) async fn queue_depth(&self, queue: &str) -> Option<u32> {
        let channel = self.channel_for_checks().await;
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let n = channel
            .queue_declare(queue.into(), passive, FieldTable::default())
            .await
            .ok()
            .map(|q| q.message_count());
        let _ = channel.close(200, "ok".into()).await;
        n
    }

    /// Every Redis key under the test's prefix, but the clock watch's
    /// (`<prefix>{clock}…`: a few, whatever the jobs).
    pub(crate) fn redis_keys(&self) -> Vec<String> {
        self._redis
            .keys_with_ttl()
            .into_iter()
            .map(|(k, _)| k)
            .filter(|k| !k.contains("{clock}"))
            .collect()
    }

    /// Declares a queue of the test's own (e.g. a reply_to queue).
    pub(crate) async fn declare(&self, suffix: &str) -> String {
        self.declare_with(
            suffix,
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
    }

    /// Declares a queue of the test's own, durable, with `arguments`.
    pub(crate) async fn declare_with(
        &self,
        suffix: &str,
        options: QueueDeclareOptions,
        arguments: FieldTable,
    ) -> String {
        let name = format!(
            "{}{suffix}",
            self.settings.amqp.jobs_queue.trim_end_matches("jobs")
        );
        self.channel
            .queue_declare(name.as_str().into(), options, arguments)
            .await
            .expect("declare");
        self.extra_queues.lock().unwrap().push(name.clone());
        name
    }

    /// Publishes a raw job body with properties.
    pub(crate) async fn publish_raw(&self, body: &[u8], props: BasicProperties) {
        let jobs = self.settings.amqp.jobs_queue.clone();
        self.publish_to(&jobs, body, props).await;
    }

    /// Publishes `body` with `props` (persistent) to `queue`.
    pub(crate) async fn publish_to(&self, queue: &str, body: &[u8], props: BasicProperties) {
        self.channel
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                body,
                props.with_delivery_mode(2),
            )
            .await
            .expect("publish")
            .await
            .expect("confirm");
    }

    /// Runs the `mailgate` binary with `args` against this harness's
    /// queues and keys (off the async runtime's threads).
    pub(crate) async fn run_tool(&self, args: &[&str]) -> std::process::Output {
        let mut c = self.command(env!("CARGO_BIN_EXE_mailgate"), args);
        c.stdin(std::process::Stdio::null());
        tokio::task::spawn_blocking(move || c.output().expect("the binary runs"))
            .await
            .expect("the runner did not panic")
    }

    /// Publishes a job.
    pub(crate) async fn publish(&self, job: &Value) {
        self.publish_raw(job.to_string().as_bytes(), BasicProperties::default())
            .await;
    }

    /// The next message on `queue` (body and properties), within `timeout`.
    pub(crate) async fn next_on(
        &self,
        queue: &str,
        timeout: Duration,
    ) -> Option<(Vec<u8>, BasicProperties)> {
        let deadline = Instant::now() + timeout;
        loop {
            let got = self
                .channel
                .basic_get(queue.into(), BasicGetOptions::default())
                .await
                .expect("basic_get");
            if let Some(m) = got {
                m.delivery
                    .ack(BasicAckOptions::default())
                    .await
                    .expect("ack");
                return Some((m.delivery.data.clone(), m.delivery.properties.clone()));
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The next result on the results queue.
    pub(crate) async fn result(&self) -> Value {
        let q = self.settings.amqp.results_queue.clone();
        let (body, _) = self
            .next_on(&q, Duration::from_secs(20))
            .await
            .expect("a result within 20s");
        serde_json::from_slice(&body).expect("results are JSON")
    }

    /// `n` results, by job id.
    pub(crate) async fn results(&self, n: usize) -> std::collections::BTreeMap<String, Value> {
        let mut by_id = std::collections::BTreeMap::new();
        for _ in 0..n {
            let r = self.result().await;
            let id = r["id"].as_str().expect("id").to_owned();
            assert!(
                by_id.insert(id.clone(), r).is_none(),
                "a second result for {id}"
            );
        }
        by_id
    }

    /// Asserts no further result arrives within `wait`.
    pub(crate) async fn no_more_results(&self, wait: Duration) {
        let q = self.settings.amqp.results_queue.clone();
        if let Some((body, _)) = self.next_on(&q, wait).await {
            panic!("unexpected result: {}", String::from_utf8_lossy(&body));
        }
    }

    /// The next dead letter.
    pub(crate) async fn dead_letter(&self) -> (Vec<u8>, BasicProperties) {
        let q = format!("{}.dead", self.settings.amqp.jobs_queue);
        self.next_on(&q, Duration::from_secs(20))
            .await
            .expect("a dead letter within 20s")
    }

    fn all_queues(&self) -> Vec<String> {
        let t = mailgate::broker::Topology::new(&self.settings);
        let mut all = t.all();
        all.extend(self.extra_queues.lock().unwrap().iter().cloned());
        all
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.config_path());
        let queues = self.all_queues();
        // `amqp.url` may list several nodes: connect as the worker does.
        let amqp = self.settings.amqp.clone();
        // Drop cannot await: delete the queues from a thread of its own.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(async move {
                let conn = mailgate::broker::connect_node(&amqp, ConnectionProperties::default())
                    .await
                    .ok()?;
                let ch = conn.create_channel().await.ok()?;
                for q in queues {
                    let _ = ch
                        .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                        .await;
                }
                let _ = conn.close(200, "bye".into()).await;
                Some(())
            })
        })
        .join();
    }
}

/// A plain HTTP/1.1 GET: `(status, body)`.
pub(crate) async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    mailgate::cli::http_get(addr, path)
        .await
        .expect("an HTTP answer")
}

/// Waits until `/readyz` at `addr` answers 200: a worker says it is ready a
/// moment after its consumer is registered (what `start_worker` waits for).
pub(crate) async fn wait_ready(addr: std::net::SocketAddr) {
    let mut last = (0, String::new());
    for _ in 0..100 {
        last = http_get(addr, "/readyz").await;
        if last.0 == 200 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("not ready within 5 s: {} {}", last.0, last.1);
}
