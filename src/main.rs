//! The `mailgate` binary: telemetry, settings, build, run until stopped.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};
use mailgate::cli;
use mailgate::settings::Settings;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Sends verification codes by mail, behind an exact rate limiter.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Pretty, global = true, env = "MAILGATE_LOG_FORMAT")]
    log_format: LogFormat,
    /// The settings file; MAILGATE__SECTION__KEY variables override it.
    #[arg(
        long,
        global = true,
        default_value = "config/default.toml",
        env = "MAILGATE_CONFIG"
    )]
    config: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Pretty,
    Json,
}

#[derive(Subcommand)]
enum Command {
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
        action: LimitsAction,
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

#[derive(clap::Args)]
struct PublishFlags {
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
    #[arg(long, conflicts_with_all = ["email", "ip", "code", "purpose", "locale", "id", "vars", "expires_in"])]
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

#[derive(Subcommand)]
enum LimitsAction {
    /// Show each rule's use and when the next send is allowed; consumes nothing.
    Show {
        /// A mailbox (normalized as the limiter does).
        #[arg(long)]
        email: Option<String>,
        /// A client IP (grouped as the limiter does).
        #[arg(long)]
        ip: Option<String>,
        /// Judge by this purpose's rules.
        #[arg(long)]
        purpose: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Forget a mailbox's or IP's admissions (for support staff).
    Reset {
        /// A mailbox.
        #[arg(long)]
        email: Option<String>,
        /// A client IP.
        #[arg(long)]
        ip: Option<String>,
    },
}

fn parse_var(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("{s:?} is not name=value"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let default_filter = if matches!(cli.command, Command::Worker) {
        "info,lapin=warn"
    } else {
        "warn,lapin=error"
    };
    init_telemetry(cli.log_format, default_filter);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(&cli.config, cli.command)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            // One line: the error and its causes, no backtrace.
            eprintln!("error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// Runs a command; `Ok(false)` means it ran but something it checked failed.
async fn run(config: &std::path::Path, command: Command) -> anyhow::Result<bool> {
    let settings = Settings::load(config).with_context(|| {
        format!(
            "{} (choose another with --config or MAILGATE_CONFIG)",
            config.display()
        )
    })?;
    match command {
        Command::Worker => {
            let worker = mailgate::worker::build(&settings).await?;
            worker.run(shutdown_signal()).await?;
            Ok(true)
        }
        Command::Publish(f) => {
            let args = cli::PublishArgs {
                email: f.email,
                ip: f.ip,
                code: f.code,
                purpose: f.purpose,
                locale: f.locale,
                id: f.id,
                vars: f.vars,
                expires_in: f.expires_in,
                file: f.file,
                reply_to: f.reply_to,
                wait: f.wait,
                timeout: f.timeout,
            };
            cli::publish(&settings, &args).await
        }
        Command::Results { follow, queue } => {
            cli::results(&settings, queue.as_deref(), follow, shutdown_signal()).await?;
            Ok(true)
        }
        Command::Limits { action } => match action {
            LimitsAction::Show {
                email,
                ip,
                purpose,
                json,
            } => {
                let who = cli::Who::parse(email.as_deref(), ip.as_deref())?;
                let usage = cli::limits_show(&settings, &who, purpose.as_deref()).await?;
                if json {
                    println!("{}", cli::usage_json(&usage));
                } else {
                    print!("{}", cli::render_usage(&usage));
                }
                Ok(true)
            }
            LimitsAction::Reset { email, ip } => {
                let who = cli::Who::parse(email.as_deref(), ip.as_deref())?;
                println!("{}", cli::limits_reset(&settings, &who).await?);
                Ok(true)
            }
        },
        Command::CheckConfig { connect } => cli::check_config(&settings, connect).await,
        Command::Probe => cli::probe(&settings).await,
    }
}

/// The error and its causes on one line, skipping a cause whose text the
/// line already holds (some libraries repeat their source in their message).
fn one_line(e: &anyhow::Error) -> String {
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
    line
}

/// Completes on SIGTERM or SIGINT.
async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    tracing::info!("shutdown requested");
}

fn init_telemetry(format: LogFormat, default_filter: &str) {
    use tracing_subscriber::EnvFilter;
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Pretty => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}
