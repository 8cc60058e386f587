//! The `urutan` binary: parse settings, start logging, run the command
//! (`commands/`, `demo/`) on the library.

mod commands;
mod demo;
mod settings;

use std::process::ExitCode;

use crate::demo::DemoOptions;
use crate::settings::{EffectsArgs, RelayArgs, SettingsArgs};
use clap::{Parser, Subcommand};
use tracing::error;
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
    /// The worker pool: declare the topology, then one worker per shard until SIGTERM/SIGINT.
    #[command(after_help = commands::run::HELP)]
    Run,
    /// Apply the database migrations and exit.
    #[command(after_help = commands::migrate::HELP)]
    Migrate,
    /// Declare the broker topology and exit.
    #[command(after_help = commands::topology::HELP)]
    Topology,
    /// The outbox relay: publish outbox rows with publisher confirms until SIGTERM/SIGINT.
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
    /// The effects dispatcher: deliver webhooks for applied versions (EFFECTS) until SIGTERM/SIGINT.
    #[command(after_help = commands::effects::HELP)]
    Effects {
        #[command(flatten)]
        effects: EffectsArgs,
    },
}

fn main() -> ExitCode {
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
            error!(error = %e, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(execute(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        // Reported already (`urutan status`, `urutan explain`): only the code.
        Err(e) if e.is::<urutan_ops::Exit>() => ExitCode::from(
            e.downcast_ref::<urutan_ops::Exit>()
                .map_or(1, |exit| exit.0),
        ),
        Err(e) => {
            error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn execute(cli: Cli) -> anyhow::Result<()> {
    let settings = urutan::config::Settings::from(cli.settings);
    match cli.command {
        Command::Run => commands::run::run(settings).await,
        Command::Migrate => commands::migrate::run(settings).await,
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
    }
}
