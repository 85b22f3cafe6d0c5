//! The `mailgate` command line: the clap tree, and the tools around the
//! worker, one file each (`publish`, `results`, `dead`, `job`, `explain`,
//! `suppress`, `limits`,
//! `overrides`, `clock`, `probe`, `check_config`, `admin`; `worker` runs
//! [`crate::worker`]).
//! Each is an edge like `main`: it may use any stage, and it reports errors
//! as one line with the cause and a hint. This file holds the clap tree,
//! the dispatch, and what several tools share: reaching RabbitMQ and Redis
//! with a hint on failure, and writing a duration as the settings do.

mod admin;
mod check_config;
mod clock;
mod dead;
mod explain;
mod job;
mod letters;
mod limits;
mod overrides;
mod probe;
mod publish;
mod results;
mod suppress;

use std::path::PathBuf;

use anyhow::{Context as _, anyhow, bail};
use clap::{Parser, Subcommand, ValueEnum};
use lapin::{Channel, Connection, ConnectionProperties};

use crate::broker;
use crate::domain::Name;
use crate::ledger::Backend;
use crate::redact::redact_url;
use crate::settings::Settings;
use crate::templates::Templates;

pub use admin::{AdminAction, admin};
pub use check_config::check_config;
pub use clock::clock;
pub use dead::{DeadAction, Filter as DeadFilter, Which as DeadWhich, dead};
pub use explain::explain;
pub use job::job;
pub use limits::{
    LimitsAction, Named, limits, limits_reset, limits_show, render_usage, usage_json,
};
pub use overrides::{AddOverride, OverridesAction, overrides};
pub use probe::{http_get, probe};
pub use publish::{PublishArgs, jobs_from, publish, status_exit};
pub use results::{Reading, results};
pub use suppress::{SuppressAction, suppress};

/// Sends verification codes by mail, behind an exact rate limiter.
#[derive(Parser)]
#[command(name = "mailgate", version, about)]
#[derive(Debug)]
pub struct Cli {
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Pretty, global = true, env = "MAILGATE_LOG_FORMAT")]
    pub log_format: LogFormat,
    /// The settings file; MAILGATE__SECTION__KEY variables override it.
    #[arg(
        long,
        global = true,
        default_value = "config/default.toml",
        env = "MAILGATE_CONFIG"
    )]
    pub config: PathBuf,
    /// How long a command other than `worker` waits for RabbitMQ to answer
    /// (connecting, and each publish's confirm): a one-shot tool fails fast
    /// and says why, where the worker would keep trying (`amqp.timeout`).
    #[arg(
        long,
        global = true,
        default_value = "5s",
        value_parser = humantime::parse_duration,
        env = "MAILGATE_CONNECT_TIMEOUT"
    )]
    pub connect_timeout: std::time::Duration,
    #[command(subcommand)]
    /// What to do.
    pub command: Command,
}

/// How log lines are written.
#[derive(Clone, Copy, ValueEnum, Debug)]
pub enum LogFormat {
    /// For people.
    Pretty,
    /// One JSON object per line, for log collectors.
    Json,
}

/// What to do.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Consume jobs and mail codes until SIGTERM or SIGINT.
    Worker,
    /// Publish jobs (one from flags, or JSON lines) with publisher confirms.
    Publish(PublishArgs),
    /// Print the results queue's results as JSON lines, oldest first. It
    /// looks and takes nothing unless told to (--consume): the application
    /// that reads the results still gets every one.
    Results {
        /// Take the results printed: they leave the queue (for a results
        /// queue no application reads).
        #[arg(long)]
        consume: bool,
        /// Keep printing, and taking, new results until Ctrl-C; needs
        /// --consume (a look cannot wait for results without taking them).
        #[arg(long, requires = "consume")]
        follow: bool,
        /// Print at most this many (without --follow).
        #[arg(long, conflicts_with = "follow")]
        limit: Option<u64>,
        /// Read this queue instead of `[amqp]`'s `results_queue`.
        #[arg(long)]
        queue: Option<String>,
    },
    /// List, show, replay or purge dead letters (`<jobs_queue>.dead`),
    /// taking only those acted on; safe while workers run.
    Dead {
        #[command(subcommand)]
        /// List, show, replay or purge.
        action: DeadAction,
    },
    /// What became of one job: its ledger record (state, attempt, times)
    /// and its dead letters. Reads only; exits 1 if nothing is known of it.
    Job {
        /// The job's id.
        id: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Why a mailbox gets no code, in one answer: the limits in force and
    /// when the next send is allowed, the overrides that apply, and its
    /// recent admissions with what became of each. Reads only.
    Explain {
        /// The mailbox (normalized as the limiter does).
        #[arg(long)]
        email: String,
        /// The client IP the user sends from, if known.
        #[arg(long)]
        ip: Option<String>,
        /// Judge by this purpose's rules.
        #[arg(long)]
        purpose: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Add, remove or list suppressed mailboxes: their jobs are answered
    /// `suppressed`, with no SMTP and no quota used.
    Suppress {
        #[command(subcommand)]
        /// Add, remove or list.
        action: SuppressAction,
    },
    /// Look at or reset a mailbox's or an IP's quota.
    Limits {
        #[command(subcommand)]
        /// Show or reset.
        action: LimitsAction,
    },
    /// Add, list or remove overrides: a mailbox, domain or IP network
    /// allowed, denied, or given rules of its own, without a redeploy
    /// (every worker applies a change within a few seconds).
    Overrides {
        #[command(subcommand)]
        /// Add, list or remove.
        action: OverridesAction,
    },
    /// Show how far each Redis primary's clock is from this host's, and any
    /// mark of a step that holds every worker back; exit 0 if none would.
    Clock {
        /// Remove the mark of a step of Redis's clock, so workers take jobs
        /// again before its time: codes admitted before the step may then be
        /// mailed a second time, and limits may let more through.
        #[arg(long)]
        accept: bool,
    },
    /// Ask the local worker's /readyz; exit 0 if it is ready (container health checks).
    Probe,
    /// Operate on the deployment as a whole: `purge` removes its queues
    /// and Redis keys.
    Admin {
        #[command(subcommand)]
        /// Purge.
        action: AdminAction,
    },
    /// Validate the settings and render every template with sample data.
    CheckConfig {
        /// Also reach RabbitMQ, Redis and SMTP.
        #[arg(long)]
        connect: bool,
    },
}

/// Loads the settings from `config` (and `MAILGATE__*` variables), once
/// for the whole run: `main` reads the worker's span export from them
/// before logging starts, and hands them to [`run`].
pub fn load_settings(config: &std::path::Path) -> anyhow::Result<Settings> {
    Settings::load(config).map_err(|e| {
        let list = crate::report::one_line(&e).contains("expected a sequence");
        let source = match e.env_source() {
            Some(var) if list => format!(
                "from {var}: a list (rules, exempt, relays) cannot be set from the environment; \
                 set it in the settings file, {}",
                config.display()
            ),
            Some(var) => format!(
                "from {var} (an environment variable, applied over {})",
                config.display()
            ),
            None => format!(
                "{} (choose another with --config or MAILGATE_CONFIG)",
                config.display()
            ),
        };
        anyhow::Error::new(e).context(source)
    })
}

/// Runs a command with `settings` ([`load_settings`]); `Ok(false)` means it
/// ran but something it checked failed.
pub async fn run(
    mut settings: Settings,
    command: Command,
    connect_timeout: std::time::Duration,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<Exit> {
    // A one-shot command fails fast: it waits `--connect-timeout` for
    // RabbitMQ, never the worker's `amqp.timeout`.
    if !matches!(command, Command::Worker) {
        anyhow::ensure!(
            !connect_timeout.is_zero(),
            "--connect-timeout must be more than 0"
        );
        settings.amqp.timeout = connect_timeout;
    }
    match command {
        Command::Worker => {
            // Every phase honours the shutdown signal, start-up included.
            let mut shutdown = std::pin::pin!(shutdown);
            let worker = tokio::select! {
                w = crate::worker::build(&settings) => w?,
                () = &mut shutdown => return Ok(Exit::OK),
            };
            worker.run(shutdown).await?;
            Ok(Exit::OK)
        }
        // These stop between two messages on Ctrl-C or SIGTERM.
        Command::Results {
            consume,
            follow,
            limit,
            queue,
        } => {
            let how = match (consume, follow) {
                (_, true) => Reading::Follow,
                (true, false) => Reading::Take(limit),
                (false, false) => Reading::Look(limit),
            };
            results(&settings, queue.as_deref(), how, shutdown).await?;
            Ok(Exit::OK)
        }
        Command::Dead { action } => dead(&settings, action, shutdown).await.map(Exit::from),
        // The other tools stop at once on Ctrl-C or SIGTERM: the handlers
        // are installed for every command, so nothing else would stop them.
        tool => tokio::select! {
            r = run_tool(&settings, tool) => r,
            () = shutdown => anyhow::bail!("interrupted"),
        },
    }
}

/// How a command ended: the process's exit status. 0 is success and 1 a
/// failure the command reported; `publish --wait` says more
/// ([`publish`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Exit(pub u8);

impl Exit {
    /// Done as asked.
    pub const OK: Exit = Exit(0);
    /// The command said what failed.
    pub const FAILED: Exit = Exit(1);
}

impl From<bool> for Exit {
    fn from(ok: bool) -> Self {
        if ok { Exit::OK } else { Exit::FAILED }
    }
}

/// Runs a command other than `worker`, `results` and `dead`.
async fn run_tool(settings: &Settings, command: Command) -> anyhow::Result<Exit> {
    let done = match command {
        // `run` takes these two itself and passes every other command here.
        Command::Worker | Command::Results { .. } | Command::Dead { .. } => {
            unreachable!("run handles worker, results and dead itself")
        }
        Command::Publish(args) => return publish(settings, &args).await,
        Command::Limits { action } => limits(settings, action).await,
        Command::Job { id, json } => job(settings, &id, json).await,
        Command::Suppress { action } => suppress(settings, action).await,
        Command::Explain {
            email,
            ip,
            purpose,
            json,
        } => explain(settings, &email, ip.as_deref(), purpose.as_deref(), json).await,
        Command::Overrides { action } => overrides(settings, action).await,
        Command::CheckConfig { connect } => check_config(settings, connect).await,
        Command::Clock { accept } => clock(settings, accept).await,
        Command::Probe => probe(settings).await,
        Command::Admin { action } => admin(settings, action).await,
    };
    done.map(Exit::from)
}

/// The error and its causes on one line ([`crate::report::one_line`]),
/// without a run of parts said twice in a row
/// ([`crate::report::without_repeats`]).
pub fn one_line(e: &anyhow::Error) -> String {
    crate::report::without_repeats(&crate::report::one_line(e.as_ref()))
}

/// Connects to RabbitMQ with a hint on failure.
async fn amqp(settings: &Settings) -> anyhow::Result<(Connection, Channel)> {
    let url = redact_url(&settings.amqp.url);
    let conn = broker::connect_node(&settings.amqp, ConnectionProperties::default())
        .await
        .map_err(|e| {
            let refused = crate::report::one_line(&e).contains("ACCESS_REFUSED");
            match crate::tls::explain_url(&e, "amqp.tls", &settings.amqp.url, &settings.amqp.tls) {
                Some(why) => anyhow!("cannot reach RabbitMQ at {url}: {why}"),
                // Reached, and the login refused: not a network problem.
                None if refused => anyhow::Error::new(e).context(format!(
                    "RabbitMQ at {url} refused the login: check the user, the password and \
                     the vhost's permissions in [amqp] url or MAILGATE__AMQP__URL"
                )),
                None => anyhow::Error::new(e).context(format!(
                    "cannot reach RabbitMQ at {url} (set [amqp] url or MAILGATE__AMQP__URL)"
                )),
            }
        })?;
    let channel = conn
        .create_channel()
        .await
        .context("opening a RabbitMQ channel")?;
    Ok((conn, channel))
}

/// Connects the limiter with a hint on failure (one attempt: a tool should
/// fail fast, unlike the worker).
/// `purpose` parsed, once a template set of this deployment is found to
/// have it: the rules of a misspelt purpose would be shown as the
/// defaults, as if they were its own.
fn known_purpose(settings: &Settings, purpose: &str) -> anyhow::Result<Name> {
    let name = Name::parse("purpose", purpose)?;
    let dir = settings.templates.dir.display();
    let templates = Templates::load(&settings.templates).with_context(|| {
        format!(
            "--purpose is checked against the template sets, and templates in {dir} do not load"
        )
    })?;
    if !templates.has_purpose(&name) {
        let known: Vec<&str> = templates.purposes().collect();
        bail!(
            "unknown purpose {purpose:?}: no template set in {dir} has that name (purposes: {})",
            known.join(", ")
        );
    }
    Ok(name)
}

async fn limiter(settings: &Settings) -> anyhow::Result<Backend> {
    in_redis(settings, Backend::open(&settings.redis, &settings.limits)).await
}

/// Opens what `open` opens in Redis, with [`limiter`]'s hints on failure.
async fn in_redis<T, E>(
    settings: &Settings,
    open: impl Future<Output = Result<T, E>>,
) -> anyhow::Result<T>
where
    E: std::error::Error + Send + Sync + 'static,
{
    if Backend::is_memory(&settings.redis) {
        bail!(
            "redis.url is memory://: the limits live inside the worker process, where no tool \
             can reach them (use Redis to share them)"
        );
    }
    let url = redact_url(&settings.redis.url);
    open.await.map_err(|e| {
        match crate::tls::explain_url(&e, "redis.tls", &settings.redis.url, &settings.redis.tls) {
            Some(why) => anyhow!("cannot reach Redis at {url}: {why}"),
            None => anyhow::Error::new(e).context(format!(
                "cannot reach Redis at {url} (set [redis] url or MAILGATE__REDIS__URL)"
            )),
        }
    })
}

/// A time left, rounded up to the unit that reads best: `30d`, `5h`,
/// `12m`, or to the second ([`short_duration`]).
fn time_left(ms: u64) -> String {
    let up = |unit: u64| ms.div_ceil(unit) * unit;
    match ms {
        _ if ms >= 2 * 86_400_000 => short_duration(up(86_400_000)),
        _ if ms >= 2 * 3_600_000 => short_duration(up(3_600_000)),
        _ if ms >= 2 * 60_000 => short_duration(up(60_000)),
        _ => short_duration(up(1000)),
    }
}

/// `30d`, `24h`, `10m`, `60s`, `1500ms`: as a rule is written in the
/// settings (whole days from two days on).
fn short_duration(ms: u64) -> String {
    const DAY: u64 = 86_400_000;
    match ms {
        0 => "0s".into(),
        _ if ms >= 2 * DAY && ms.is_multiple_of(DAY) => format!("{}d", ms / DAY),
        _ if ms.is_multiple_of(3_600_000) => format!("{}h", ms / 3_600_000),
        _ if ms.is_multiple_of(60_000) => format!("{}m", ms / 60_000),
        _ if ms.is_multiple_of(1000) => format!("{}s", ms / 1000),
        _ if ms > 60_000 => {
            let secs = ms.div_ceil(1000);
            format!("{}m{}s", secs / 60, secs % 60)
        }
        _ => format!("{:.1}s", ms as f64 / 1000.0),
    }
}
