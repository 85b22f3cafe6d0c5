//! The `mailgate` binary's start-up: logging, the runtime, the shutdown
//! signal, and the exit code. The commands live in [`mailgate::cli`].

use std::process::ExitCode;

use clap::Parser;
use mailgate::cli::{self, Cli, Command, LogFormat};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The stack every thread gets. A message's AMQP header table may nest
/// tables as deep as a frame allows (about 18 000 levels in RabbitMQ's
/// 128 KiB frames), and it is parsed (by lapin's I/O thread) and dropped
/// (by the job's task) recursively: on the default 2 MiB stack one such
/// message would abort the worker, and again after every restart. 256 MiB
/// covers the deepest with room to spare even in a debug build (which needs
/// over 128 MiB); it is address space, and only the pages used are ever
/// committed.
const THREAD_STACK: usize = 256 << 20;

fn main() -> ExitCode {
    // lapin starts its I/O thread without a stack size, so it takes the
    // standard library's default, which RUST_MIN_STACK sets. Setting it is
    // sound here: no other thread exists yet, so none can read the
    // environment meanwhile.
    if std::env::var_os("RUST_MIN_STACK").is_none() {
        unsafe { std::env::set_var("RUST_MIN_STACK", THREAD_STACK.to_string()) };
    }
    // One rustls crypto provider, chosen before any connection is made.
    mailgate::tls::install_provider();
    let cli = Cli::parse();
    let default_filter = match cli.command {
        Command::Worker => "info,lapin=warn",
        // A purge looks for queues that may not be there: RabbitMQ closes
        // the channel of each miss, which lapin logs as an error.
        Command::Admin { .. } => "warn,lapin=error,lapin::channel=off",
        // A tool reports a broker error itself, in one line.
        _ => "warn,lapin=off",
    };
    // The settings load once, before logging starts: the worker exports its
    // spans where they say. A command exports none; settings that do not
    // load export none either, and the command says why once it runs.
    let settings = cli::load_settings(&cli.config);
    let otlp = match (&cli.command, &settings) {
        (Command::Worker, Ok(s)) => s.telemetry.otlp_endpoint.clone(),
        _ => None,
    };
    // A tool's passive looks at queues that may not be there close their
    // channels, which lapin logs as errors whatever the level: with
    // RUST_LOG set for the worker (`info`), a clean purge would print one
    // per queue. Off for the tools unless RUST_LOG names lapin itself.
    let quiet_channels = !matches!(cli.command, Command::Worker)
        && std::env::var("RUST_LOG").is_ok_and(|f| !f.contains("lapin"));
    let traces = match init_telemetry(
        cli.log_format,
        default_filter,
        quiet_channels,
        otlp.as_deref(),
    ) {
        Ok(traces) => traces,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(THREAD_STACK)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Spawned, not run by `block_on` itself: the worker's consume loop is
    // woken for every message, and waking this (main) thread, outside the
    // runtime's own threads, costs a futex call and a context switch each
    // time (the e2e bench's profile, BENCHMARKS.md).
    let run = runtime.spawn(async move {
        let shutdown = shutdown_signal();
        cli::run(settings?, cli.command, cli.connect_timeout, shutdown).await
    });
    let outcome = runtime.block_on(run);
    // The last spans, before the process ends.
    if let Some(traces) = traces {
        mailgate::traces::shutdown(traces);
    }
    match outcome {
        Ok(Ok(exit)) => ExitCode::from(exit.0),
        Ok(Err(e)) => {
            // One line: the error and its causes, no backtrace.
            eprintln!("error: {}", cli::one_line(&e));
            ExitCode::FAILURE
        }
        // A panic was already printed by the panic hook.
        Err(_) => ExitCode::FAILURE,
    }
}

/// Completes on SIGTERM or SIGINT. The handlers are installed when this is
/// called, not when the future is first polled, so a signal during start-up
/// (settings, connecting) is a request to stop, not the default kill. Must be
/// called within the runtime.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let mut signals = {
        use tokio::signal::unix::{SignalKind, signal};
        [SignalKind::terminate(), SignalKind::interrupt()].map(|kind| signal(kind).ok())
    };
    async move {
        #[cfg(unix)]
        {
            let [term, int] = &mut signals;
            let recv = |s: &mut Option<tokio::signal::unix::Signal>| {
                let s = s.take();
                async move {
                    match s {
                        Some(mut s) => {
                            s.recv().await;
                        }
                        None => std::future::pending::<()>().await,
                    }
                }
            };
            tokio::select! {
                () = recv(term) => {},
                () = recv(int) => {},
            }
        }
        #[cfg(not(unix))]
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
        tracing::info!("shutdown requested");
    }
}

/// Logs to stderr (filtered by `RUST_LOG`), and, with `otlp`, mailgate's
/// spans to OpenTelemetry whatever `RUST_LOG` says (see `mailgate::traces`);
/// with `quiet_channels`, without lapin's channel errors.
/// Returns the span pipeline, to shut down at the end.
fn init_telemetry(
    format: LogFormat,
    default_filter: &str,
    quiet_channels: bool,
    otlp: Option<&str>,
) -> Result<Option<opentelemetry_sdk::trace::SdkTracerProvider>, mailgate::traces::TracesError> {
    use tracing_subscriber::filter::{EnvFilter, FilterExt, LevelFilter, Targets};
    use tracing_subscriber::prelude::*;
    let mut filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    // lapin logs every message RabbitMQ returns, body and all (a result
    // holds an address; a job, a code). mailgate handles returns and logs
    // them itself, without the body, so this target is off whatever RUST_LOG
    // says.
    // The HTTP client that exports spans logs the collector's URL, password
    // and all, at trace: off too.
    let channels = quiet_channels.then_some("lapin::channel=off");
    for quiet in [
        "lapin::returned_messages=off",
        "hyper_util=off",
        "reqwest=off",
    ]
    .into_iter()
    .chain(channels)
    {
        if let Ok(quiet) = quiet.parse() {
            filter = filter.add_directive(quiet);
        }
    }
    let provider = otlp.map(mailgate::traces::provider).transpose()?;
    let spans = (provider.as_ref()).map(|p| {
        mailgate::traces::layer(p)
            .with_filter(Targets::new().with_target("mailgate", LevelFilter::INFO))
    });
    // lapin's I/O loop logs every frame at trace: the connection's
    // StartOk (the broker password), jobs and results
    // (codes, addresses). Nothing of lapin's is shown at trace, whatever
    // RUST_LOG says; debug still shows its connection steps.
    // The cap is decided once per callsite (a FilterFn caches its answer),
    // and it keeps the EnvFilter's level hint: with none, every trace! and
    // log::trace! in the dependencies' hot paths would be evaluated at run
    // time (measured: +20 % worker CPU per admitted job).
    let hint = filter.max_level_hint().unwrap_or(LevelFilter::TRACE);
    let filter = filter.and(
        tracing_subscriber::filter::filter_fn(|meta| {
            let lapin =
                meta.target().starts_with("lapin") || meta.target().starts_with("amq_protocol");
            !(lapin && *meta.level() == tracing::Level::TRACE)
        })
        .with_max_level_hint(hint),
    );
    // Colours only on a terminal: a log file or a collector gets plain
    // text (NO_COLOR, https://no-color.org, turns them off there too).
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(colour);
    let registry = tracing_subscriber::registry().with(spans);
    match format {
        LogFormat::Pretty => registry.with(fmt.with_filter(filter)).init(),
        LogFormat::Json => registry
            .with(fmt.json().flatten_event(true).with_filter(filter))
            .init(),
    }
    Ok(provider)
}
