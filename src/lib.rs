//! The `urutan` command line as a library: parse settings, start logging,
//! run the command (`commands/`, `demo/`) on the core library (`urutan
//! run` is [`urutan::Pool`]). The `urutan` binary is [`main`]; a team
//! builds its own binary, with every command and its Rust handler in the
//! pool, with [`main_with`]:
//!
//! ```no_run
//! # struct Stock;
//! # impl urutan::Handler for Stock {
//! #     async fn handle(&self, _: &mut sqlx::PgConnection, _: &urutan::HandlerEvent)
//! #         -> Result<(), urutan::HandlerError> { Ok(()) }
//! # }
//! fn main() -> std::process::ExitCode {
//!     urutan_cli::main_with(Stock)
//! }
//! ```
//!
//! (`examples/stock` is such a binary.)

mod commands;
mod demo;
mod preflight;
mod settings;

use std::process::ExitCode;

use crate::demo::DemoOptions;
use crate::settings::{EffectsArgs, RelayArgs, SettingsArgs};
use clap::{Parser, Subcommand};
use urutan::handler::{Handler, SharedHandler};
use urutan::heal::Unhealable;
use urutan::telemetry;

/// Applies order events from RabbitMQ to PostgreSQL in order per entity,
/// exactly once in effect.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(flatten)]
    settings: SettingsArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The worker pool: declare the topology, then one worker per shard until SIGTERM/SIGINT/SIGHUP.
    #[command(after_help = commands::run::HELP)]
    Run,
    /// Apply the database migrations and exit.
    #[command(after_help = commands::migrate::HELP)]
    Migrate {
        /// Create the database of DATABASE_URL first if it does not exist
        /// (nothing else creates it).
        #[arg(long)]
        create_database: bool,
    },
    /// Declare the broker topology and exit.
    #[command(after_help = commands::topology::HELP)]
    Topology,
    /// The outbox relay: publish outbox rows with publisher confirms until SIGTERM/SIGINT/SIGHUP.
    #[command(after_help = commands::relay::HELP)]
    Relay {
        #[command(flatten)]
        relay: RelayArgs,
    },
    /// Check the invariants (order, exactly once, newest state) from the database; exit 1 on a violation.
    #[command(after_help = commands::verify::HELP)]
    Verify,
    /// The whole pipeline on the local services with a generated workload and a verified report.
    #[command(after_help = demo::HELP)]
    Demo {
        #[command(flatten)]
        options: DemoOptions,
    },
    /// The dead-letter queue: list, show, replay or purge dead-lettered messages.
    Dlq {
        #[command(subcommand)]
        command: urutan_ops::dlq::DlqCommand,
    },
    /// Orders on hold after a refused version: list them, or resume one without it.
    Hold {
        #[command(subcommand)]
        command: urutan_ops::hold::HoldCommand,
    },
    /// Is the pool healthy? Ring, windows, shards, dead letters, outbox, relay; a check by exit code.
    #[command(after_help = urutan_ops::status::HELP)]
    Status {
        #[command(flatten)]
        options: urutan_ops::status::StatusOptions,
    },
    /// Why is this order in this state? Its versions: applied, parked, dead-lettered, queued, missing.
    #[command(after_help = urutan_ops::explain::HELP)]
    Explain {
        #[command(flatten)]
        options: urutan_ops::explain::ExplainOptions,
    },
    /// The operator console in the browser (CONSOLE_LISTEN): overview, orders, dead letters, holds, effects.
    Console {
        #[command(flatten)]
        options: urutan_ops::console::ConsoleOptions,
    },
    /// The effects dispatcher: deliver webhooks for applied versions (EFFECTS) until SIGTERM/SIGINT/SIGHUP.
    #[command(after_help = commands::effects::HELP)]
    Effects {
        #[command(flatten)]
        effects: EffectsArgs,
    },
}

impl Cli {
    /// The subcommand's name, as typed.
    fn command_name(&self) -> &'static str {
        match self.command {
            Command::Run => "run",
            Command::Migrate { .. } => "migrate",
            Command::Topology => "topology",
            Command::Relay { .. } => "relay",
            Command::Verify => "verify",
            Command::Demo { .. } => "demo",
            Command::Dlq { .. } => "dlq",
            Command::Hold { .. } => "hold",
            Command::Status { .. } => "status",
            Command::Explain { .. } => "explain",
            Command::Effects { .. } => "effects",
            Command::Console { .. } => "console",
        }
    }
}

/// The `urutan` binary: every command, no Rust handler.
pub fn main() -> ExitCode {
    main_of(None)
}

/// Every `urutan` command, with `handler` called in the apply transaction
/// of every version `urutan run` applies (docs/contract.md section 10).
///
/// Exit codes: 0 done; 2 a setting is wrong or refused (a malformed value,
/// a refused login, an unknown vhost or database, a permission refusal:
/// one line naming the setting and the fix); 1 any other failure (one
/// line); a command's own codes (`status`, `explain`, `verify`).
pub fn main_with(handler: impl Handler) -> ExitCode {
    main_of(Some(std::sync::Arc::new(handler)))
}

/// [`main`] or [`main_with`].
fn main_of(handler: Option<SharedHandler>) -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Status { .. }
        | Command::Explain { .. }
        | Command::Dlq { .. }
        | Command::Hold { .. } => telemetry::init_for_reports(cli.settings.log_format),
        _ => telemetry::init(cli.settings.log_format),
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let database_url = cli.settings.database_url.clone();
    match runtime.block_on(execute(cli, handler)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // A refusal no retry can fix met mid-command (a missing grant):
            // one line naming the setting and the fix, exit 2.
            if let Some(refused) = database_refusal(&database_url, &e) {
                eprintln!("error: {refused}");
                return ExitCode::from(2);
            }
            let code = exit_code(&e);
            // Reported already (`urutan status`, `urutan explain`): only the code.
            if !e.is::<urutan_ops::Exit>() {
                eprintln!("error: {}", one_line(&e));
            }
            ExitCode::from(code)
        }
    }
}

/// The database's refusal in `e`'s causes that no retry can fix (a
/// permission refused to this role, say), as the one line to print.
fn database_refusal(
    url: &urutan::config::SecretUrl,
    e: &anyhow::Error,
) -> Option<urutan::heal::Unhealable> {
    e.chain().find_map(|cause| {
        let db = cause.downcast_ref::<sqlx::Error>()?;
        urutan::heal::Unhealable::database(url, db)
    })
}

/// The exit code for `e` (see [`main_with`]).
fn exit_code(e: &anyhow::Error) -> u8 {
    if let Some(exit) = e.downcast_ref::<urutan_ops::Exit>() {
        return exit.0;
    }
    let cannot_heal = e.chain().any(|cause| {
        cause.is::<Unhealable>()
            || cause.is::<urutan::heal::WrongSetting>()
            || cause.is::<urutan::reshard::prepare::Refused>()
            || matches!(
                cause.downcast_ref::<urutan::reshard::prepare::PrepareError>(),
                Some(urutan::reshard::prepare::PrepareError::Refused(_))
            )
            || matches!(
                cause.downcast_ref::<urutan::supervisor::RunError>(),
                Some(urutan::supervisor::RunError::Prepare(p)) if !p.is_retryable()
            )
            || matches!(
                cause.downcast_ref::<urutan_ops::dlq::DlqError>(),
                Some(urutan_ops::dlq::DlqError::Refused { .. })
            )
    });
    if cannot_heal { 2 } else { 1 }
}

/// `e` and its causes on one line, without what only adds noise: the
/// PostgreSQL source line a database error carries ("… at line 768") and
/// anything after a cause's first line.
fn one_line(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in e.chain() {
        let text = urutan::heal::without_source_line(&urutan::heal::one_line(&cause.to_string()));
        // A cause that repeats (transparent errors) is said once.
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
    }
    parts.join(": ")
}

/// What each command talks to, for the login check before it starts
/// (`None`: no check; the demo creates its own database and vhost objects).
fn needs(command: &Command) -> Option<preflight::Needs> {
    let (database, broker) = match command {
        Command::Demo { .. } => return None,
        Command::Migrate { .. }
        | Command::Effects { .. }
        | Command::Hold { .. }
        | Command::Console { .. } => (true, false),
        Command::Run
        | Command::Topology
        | Command::Relay { .. }
        | Command::Verify
        | Command::Dlq { .. }
        | Command::Status { .. }
        | Command::Explain { .. } => (true, true),
    };
    let pipeline = match command {
        Command::Run | Command::Relay { .. } => preflight::Pipeline::Whole,
        Command::Migrate { .. } => preflight::Pipeline::Entity,
        _ => preflight::Pipeline::Unchecked,
    };
    Some(preflight::Needs {
        database,
        broker,
        pipeline,
    })
}

async fn execute(cli: Cli, handler: Option<SharedHandler>) -> anyhow::Result<()> {
    let name = cli.command_name();
    let mut settings = urutan::config::Settings::from(cli.settings);
    if exports_traces(&cli.command) {
        settings.traces = urutan::trace::Traces::from_env().map_err(urutan::heal::WrongSetting)?;
    }
    let traces = settings.traces.clone();
    // `urutan run` (the pool) sends its last spans itself.
    let sends_its_spans = matches!(cli.command, Command::Run);
    let result = execute_with(cli.command, settings, name, handler).await;
    // The spans still queued are sent before the process ends (blocking:
    // off the async runtime's threads).
    if traces.is_on() && !sends_its_spans {
        let _ = tokio::task::spawn_blocking(move || traces.shutdown()).await;
    }
    result
}

/// The commands that make spans: the pool (apply), the relay (publish) and
/// `urutan effects` (webhook).
fn exports_traces(command: &Command) -> bool {
    matches!(
        command,
        Command::Run | Command::Relay { .. } | Command::Effects { .. }
    )
}

async fn execute_with(
    command: Command,
    settings: urutan::config::Settings,
    name: &'static str,
    handler: Option<SharedHandler>,
) -> anyhow::Result<()> {
    // The pool warns of them itself (`urutan::Pool::run`).
    if !matches!(command, Command::Run) {
        for contradiction in settings.contradictions() {
            tracing::warn!("{contradiction}");
        }
    }
    if let Command::Migrate {
        create_database: true,
    } = &command
    {
        commands::migrate::create_database(&settings).await?;
    }
    if let Some(needs) = needs(&command) {
        preflight::check(&settings, needs, name).await?;
    }
    match command {
        Command::Run => commands::run::run(settings, handler).await,
        Command::Migrate { .. } => commands::migrate::run(settings).await,
        Command::Topology => commands::topology::run(settings).await,
        Command::Relay { relay } => commands::relay::run(settings, relay.into()).await,
        Command::Verify => commands::verify::run(settings).await,
        Command::Demo { options } => {
            let passed = demo::run(settings, options).await?;
            anyhow::ensure!(passed, "the demo did not verify");
            Ok(())
        }
        Command::Dlq { command } => urutan_ops::dlq::run(settings, command).await,
        Command::Hold { command } => urutan_ops::hold::run(&settings, command).await,
        Command::Status { options } => Ok(urutan_ops::status(&settings, &options).await?),
        Command::Explain { options } => {
            Ok(urutan_ops::explain(&settings, &options.order_id).await?)
        }
        Command::Effects { effects } => commands::effects::run(settings, effects.into()).await,
        Command::Console { options } => {
            let shutdown = tokio_util::sync::CancellationToken::new();
            tokio::spawn(commands::stop_on_signal(shutdown.clone()));
            urutan_ops::console::run(settings, options, shutdown).await
        }
    }
}
