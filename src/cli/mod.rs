//! The `mailgate` command line: the clap tree, and the tools around the
//! worker (`publish`, `results`, `limits`, `check-config`, `probe`). Each is
//! an edge like `main`: it may use any stage, and it reports errors as one
//! line with the cause and a hint.

mod tools;

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};

use crate::settings::Settings;
pub use tools::*;

/// Sends verification codes by mail, behind an exact rate limiter.
#[derive(Parser)]
#[command(name = "mailgate", version, about)]
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
#[derive(Clone, Copy, ValueEnum)]
pub enum LogFormat {
    /// For people.
    Pretty,
    /// One JSON object per line, for log collectors.
    Json,
}

/// What to do.
#[derive(Subcommand)]
pub enum Command {
    /// Consume jobs and mail codes until SIGTERM or SIGINT.
    Worker,
    /// Publish jobs (one from flags, or JSON lines) with publisher confirms.
    Publish(PublishFlags),
    /// Print results as JSON lines.
    Results {
        /// Keep printing new results until Ctrl-C.
        #[arg(long)]
        follow: bool,
        /// Read this queue instead of [amqp] results_queue.
        #[arg(long)]
        queue: Option<String>,
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
    /// Validate the settings and render every template with sample data.
    CheckConfig {
        /// Also reach RabbitMQ, Redis and SMTP.
        #[arg(long)]
        connect: bool,
    },
}

/// `publish`'s flags.
#[derive(clap::Args)]
pub struct PublishFlags {
    /// The mailbox to send a code to.
    #[arg(long)]
    email: Option<String>,
    /// The client IP that asked for it.
    #[arg(long)]
    ip: Option<String>,
    /// The code (default: a random 6-digit code).
    #[arg(long)]
    code: Option<String>,
    /// The template set (default: verify).
    #[arg(long)]
    purpose: Option<String>,
    /// The locale, e.g. zh-CN.
    #[arg(long)]
    locale: Option<String>,
    /// The attempt it is for (a sign-up or login session): only a newer
    /// job of the same session supersedes it.
    #[arg(long)]
    session: Option<String>,
    /// The job id (default: generated).
    #[arg(long)]
    id: Option<String>,
    /// A template variable, `name=value`; repeatable.
    #[arg(long = "var", value_parser = parse_var)]
    vars: Vec<(String, String)>,
    /// The code expires this long from now, e.g. 10m.
    #[arg(long, value_parser = humantime::parse_duration)]
    expires_in: Option<std::time::Duration>,
    /// Publish the JSON lines (one job object each) of this file; `-` for stdin.
    #[arg(long, conflicts_with_all = ["email", "ip", "code", "purpose", "locale", "session", "id", "vars", "expires_in"])]
    file: Option<PathBuf>,
    /// Ask for results on this queue.
    #[arg(long)]
    reply_to: Option<String>,
    /// Wait for each job's result (on a private queue) and print it.
    #[arg(long)]
    wait: bool,
    /// With --wait: how long to wait for all results.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    timeout: std::time::Duration,
}

/// `limits`' actions.
#[derive(Subcommand)]
pub enum LimitsAction {
    /// Show each rule's use and when the next send is allowed; consumes nothing.
    Show {
        /// A mailbox (normalized as the limiter does).
        #[arg(long)]
        email: Option<String>,
        /// A client IP (grouped as the limiter does).
        #[arg(long)]
        ip: Option<String>,
        /// A mail domain (counted by its registrable domain, as the limiter
        /// does: `mail.example.co.uk` is `example.co.uk`); with `--ip`,
        /// that client network's share of the domain's quota.
        #[arg(long)]
        domain: Option<String>,
        /// Judge by this purpose's rules.
        #[arg(long)]
        purpose: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Forget a mailbox's, IP's or domain's admissions (for support staff).
    Reset {
        /// A mailbox.
        #[arg(long)]
        email: Option<String>,
        /// A client IP.
        #[arg(long)]
        ip: Option<String>,
        /// A mail domain (its registrable domain); with `--ip`, that client
        /// network's share of the domain's quota.
        #[arg(long)]
        domain: Option<String>,
    },
}

/// `overrides`' actions.
#[derive(Subcommand)]
pub enum OverridesAction {
    /// Add an override (replacing any of the same subject).
    Add {
        /// What it matches: `email:<mailbox>`, `domain:<registrable
        /// domain>` or `ip:<address or network>` (e.g. `ip:10.0.0.0/8`).
        target: String,
        /// Not limited: a mailbox by any scope, a domain or a network by
        /// its own scope.
        #[arg(long, conflicts_with_all = ["deny", "rule"])]
        allow: bool,
        /// Always rejected while it lasts.
        #[arg(long, conflicts_with = "rule")]
        deny: bool,
        /// Its own rules instead of the scope's: `<window>=<max>`, e.g.
        /// `--rule 1h=500 --rule 24h=2000`.
        #[arg(long, value_parser = parse_rule)]
        rule: Vec<crate::settings::Rule>,
        /// Why (required: whoever finds it later must know).
        #[arg(long)]
        reason: String,
        /// How long it lasts (e.g. `2h`, `30d`); without it, until removed.
        #[arg(long, value_parser = humantime::parse_duration)]
        expires_in: Option<std::time::Duration>,
        /// Replace an override in force that this one loosens (a weaker
        /// action, or other rules), for the same subject as the limiter
        /// counts it; without it that is refused.
        #[arg(long)]
        replace: bool,
        /// Accept an IP network wider than /8 (IPv4) or /32 (IPv6), which
        /// takes that many clients out of (or into) the IP scope at once,
        /// or a deny of a domain in `limits.domain.exempt` (a big
        /// provider's: every user there).
        #[arg(long)]
        force: bool,
    },
    /// List the overrides stored (expired ones marked).
    List {
        /// Print JSON lines instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Remove the override of a subject.
    Remove {
        /// As `add` names it.
        target: String,
    },
}

fn parse_rule(s: &str) -> Result<crate::settings::Rule, String> {
    let (window, max) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not <window>=<max>, e.g. 1h=500"))?;
    let window = humantime::parse_duration(window).map_err(|e| format!("{window:?}: {e}"))?;
    let max: u32 = max
        .parse()
        .map_err(|_| format!("{max:?} is not a whole number"))?;
    Ok(crate::settings::Rule::new(window, max))
}

fn parse_var(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("{s:?} is not name=value"))
}

/// Runs a command; `Ok(false)` means it ran but something it checked failed.
pub async fn run(
    config: &std::path::Path,
    command: Command,
    connect_timeout: std::time::Duration,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<bool> {
    let mut settings = Settings::load(config).with_context(|| {
        format!(
            "{} (choose another with --config or MAILGATE_CONFIG)",
            config.display()
        )
    })?;
    // A one-shot command fails fast (found by review: `check-config
    // --connect` waited 30 s on a broker that never finished the handshake,
    // then said it was reconnecting).
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
                () = &mut shutdown => return Ok(true),
            };
            worker.run(shutdown).await?;
            Ok(true)
        }
        Command::Results { follow, queue } => {
            results(&settings, queue.as_deref(), follow, shutdown).await?;
            Ok(true)
        }
        // The other tools stop at once on Ctrl-C or SIGTERM: the handlers
        // are installed for every command, so nothing else would stop them.
        tool => tokio::select! {
            r = run_tool(&settings, tool) => r,
            () = shutdown => anyhow::bail!("interrupted"),
        },
    }
}

/// Runs a command other than `worker` and `results`.
async fn run_tool(settings: &Settings, command: Command) -> anyhow::Result<bool> {
    match command {
        // `run` takes these two itself and passes every other command here.
        Command::Worker | Command::Results { .. } => {
            unreachable!("run handles worker and results itself")
        }
        Command::Publish(f) => {
            let args = PublishArgs {
                email: f.email,
                ip: f.ip,
                code: f.code,
                purpose: f.purpose,
                locale: f.locale,
                session: f.session,
                id: f.id,
                vars: f.vars,
                expires_in: f.expires_in,
                file: f.file,
                reply_to: f.reply_to,
                wait: f.wait,
                timeout: f.timeout,
            };
            publish(settings, &args).await
        }
        Command::Limits { action } => match action {
            LimitsAction::Show {
                email,
                ip,
                domain,
                purpose,
                json,
            } => {
                let who = Who::parse(email.as_deref(), ip.as_deref(), domain.as_deref())?;
                let usage = limits_show(settings, &who, purpose.as_deref()).await?;
                if json {
                    println!("{}", usage_json(&usage));
                } else {
                    let share = settings.limits.domain.network_share;
                    print!("{}", render_usage(&usage, share));
                }
                Ok(true)
            }
            LimitsAction::Reset { email, ip, domain } => {
                let who = Who::parse(email.as_deref(), ip.as_deref(), domain.as_deref())?;
                println!("{}", limits_reset(settings, &who).await?);
                Ok(true)
            }
        },
        Command::Overrides { action } => overrides(settings, action).await,
        Command::CheckConfig { connect } => check_config(settings, connect).await,
        Command::Clock { accept } => clock(settings, accept).await,
        Command::Probe => probe(settings).await,
    }
}

/// The error and its causes on one line, skipping a cause whose text the
/// line already holds (some libraries repeat their source in their message).
pub fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    crate::telemetry::without_repeats(&line)
}
