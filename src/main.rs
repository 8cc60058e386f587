//! The `urutan` binary: parse settings, start logging, call the library.

mod demo;

use std::process::ExitCode;

use crate::demo::DemoOptions;
use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;
use tracing::{error, info};
use urutan::broker::{self, Names};
use urutan::config::Settings;
use urutan::outbox::relay::{Relay, RelaySettings};
use urutan::shard::Hooks;
use urutan::supervisor::Supervisor;
use urutan::{store, telemetry};

/// Applies order events from RabbitMQ to PostgreSQL in order per entity,
/// exactly once in effect.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(flatten)]
    settings: Settings,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The worker pool: declare the topology, then one worker per shard until SIGTERM/SIGINT.
    #[command(after_help = RUN_HELP)]
    Run,
    /// Apply the database migrations and exit.
    #[command(after_help = MIGRATE_HELP)]
    Migrate,
    /// Declare the broker topology and exit.
    #[command(after_help = TOPOLOGY_HELP)]
    Topology,
    /// The outbox relay: publish outbox rows with publisher confirms until SIGTERM/SIGINT.
    #[command(after_help = RELAY_HELP)]
    Relay {
        #[command(flatten)]
        relay: RelaySettings,
    },
    /// Check the invariants (order, exactly once, newest state) from the database; exit 1 on a violation.
    #[command(after_help = VERIFY_HELP)]
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
        command: urutan::dlq::DlqCommand,
    },
    /// Is the pool healthy? Ring, windows, shards, dead letters, outbox, relay; a check by exit code.
    #[command(after_help = urutan::ops::status::HELP)]
    Status {
        #[command(flatten)]
        options: urutan::ops::status::StatusOptions,
    },
    /// Why is this order in this state? Its versions: applied, parked, dead-lettered, queued, missing.
    #[command(after_help = urutan::ops::explain::HELP)]
    Explain {
        #[command(flatten)]
        options: urutan::ops::explain::ExplainOptions,
    },
    /// The effects dispatcher: deliver webhooks for applied versions (EFFECTS) until SIGTERM/SIGINT.
    #[command(after_help = EFFECTS_HELP)]
    Effects {
        #[command(flatten)]
        effects: urutan::effects::EffectsSettings,
    },
}

const RUN_HELP: &str = "\
Examples:
  SHARD_COUNT=8 urutan run
  PREFETCH=32 urutan run                      # ordered batch mode
  AMQP_URL=amqp://u:p@n1:5672/%2f,amqp://u:p@n2:5672/%2f urutan run   # a cluster's nodes
  TOPOLOGY_MODE=check urutan run              # a worker user that may not declare

Health: GET /healthz (alive) and /readyz (consuming) on METRICS_ADDR; metrics on /metrics.";

const MIGRATE_HELP: &str = "\
Run it as the database owner; least-privilege roles (deploy/postgres/) may not.

Examples:
  urutan migrate
  DATABASE_URL=postgres://owner@db:5432/urutan urutan migrate";

const TOPOLOGY_HELP: &str = "\
Declares the exchanges, the SHARD_COUNT shard queues and the DLQ, and records the
ring; a changed SHARD_COUNT is an online resharding (ALLOW_SHRINK for fewer).

Examples:
  urutan topology
  SHARD_COUNT=12 urutan topology
  SHARD_COUNT=4 ALLOW_SHRINK=true urutan topology";

const RELAY_HELP: &str = "\
Several relays may run: one publishes (it holds a database lock), the others stand by.

Examples:
  urutan relay
  RELAY_BATCH=500 urutan relay";

const VERIFY_HELP: &str = "\
Exit codes: 0 every check passed, 1 a violation (the offenders are listed).

Examples:
  urutan verify
  urutan verify || echo 'an invariant is broken'";

const EFFECTS_HELP: &str = "\
Several dispatchers may run; none sends an effect twice at the same time. The
dispatcher started last writes its EFFECTS as the routes in force.

Examples:
  EFFECTS='dibayar=https://pay.internal/capture;*=https://search.internal/index' \\
  EFFECTS_SECRET=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw urutan effects
  urutan dlq list --effects                   # dead-lettered effects
  urutan dlq replay --effects --all           # send them again, same keys";

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Status { .. } | Command::Explain { .. } | Command::Dlq { .. } => {
            telemetry::init_for_reports(cli.settings.log_format)
        }
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
        Err(e) if e.is::<urutan::ops::Exit>() => ExitCode::from(
            e.downcast_ref::<urutan::ops::Exit>()
                .map_or(1, |exit| exit.0),
        ),
        Err(e) => {
            error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn execute(cli: Cli) -> anyhow::Result<()> {
    use anyhow::Context;
    let settings = cli.settings;
    match cli.command {
        Command::Run => {
            let hooks = Hooks::from_env()?;
            let supervisor = Supervisor::build(settings.clone(), hooks)
                .await
                .with_context(|| {
                    format!("cannot listen on METRICS_ADDR {}", settings.metrics_addr)
                })?;
            info!(http = %supervisor.http_addr(), "urutan run starting");
            let shutdown = CancellationToken::new();
            tokio::spawn(stop_on_signal(shutdown.clone()));
            supervisor.run(shutdown).await?;
            info!("stopped cleanly");
        }
        Command::Migrate => {
            let pool = store::prepare(&settings.database(), 1)
                .await
                .with_context(|| format!("cannot migrate {}", settings.database_url))?;
            pool.close().await;
            info!(database = %settings.database_url, "migrations applied");
        }
        Command::Topology => {
            // Declares the topology and, since bindings may change the ring,
            // opens an epoch with relay publishing paused (see `handoff`).
            let pool = store::prepare(&settings.database(), 2)
                .await
                .with_context(|| format!("cannot open {}", settings.database_url))?;
            let conn = broker::connect(&settings.broker(), "urutan topology")
                .await
                .with_context(|| format!("cannot connect to {}", settings.amqp_url))?;
            let names = Names::new(&settings.topology_prefix);
            let mut declare = settings.clone();
            declare.topology_mode = urutan::config::TopologyMode::Declare;
            let urutan::reshard::prepare::Prepared { plan, epoch, .. } =
                urutan::reshard::prepare::prepare_topology(&declare, &names, &pool, &conn, true)
                    .await?;
            let _ = urutan::broker::call("connection.close", conn.close(200, "done".into())).await;
            pool.close().await;
            info!(
                shards = plan.consumed,
                bound = plan.bound,
                epoch,
                "topology declared"
            );
        }
        Command::Relay { relay } => run_relay(settings, relay).await?,
        Command::Verify => {
            let pool = store::prepare(&settings.database(), 2)
                .await
                .with_context(|| format!("cannot open {}", settings.database_url))?;
            let dlq = dead_letter_depth(&settings).await;
            let report = urutan::verify::verify(&pool, dlq).await?;
            println!("{report}");
            anyhow::ensure!(report.passed(), "verification failed");
        }
        Command::Demo { options } => {
            let passed = demo::run(settings, options).await?;
            anyhow::ensure!(passed, "the demo did not verify");
        }
        Command::Dlq { command } => urutan::dlq::run(settings, command).await?,
        Command::Status { options } => urutan::ops::status(&settings, &options).await?,
        Command::Explain { options } => urutan::ops::explain(&settings, &options.order_id).await?,
        Command::Effects { effects } => run_effects(settings, effects).await?,
    }
    Ok(())
}

/// `urutan effects`: checks EFFECTS, serves the HTTP endpoints and
/// dispatches until a signal.
async fn run_effects(
    settings: Settings,
    effects: urutan::effects::EffectsSettings,
) -> anyhow::Result<()> {
    use anyhow::Context;
    // First, before any connection: a bad setting is one line and exit 1.
    let config = effects.config()?;
    let listener = tokio::net::TcpListener::bind(settings.metrics_addr)
        .await
        .with_context(|| format!("cannot listen on METRICS_ADDR {}", settings.metrics_addr))?;
    let size = effects.effects_concurrency.min(16) + 2;
    let pool = store::prepare(&settings.database_url, size)
        .await
        .with_context(|| format!("cannot open {}", settings.database_url))?;
    info!(http = %listener.local_addr()?, "urutan effects starting");
    // Fault injection for crash drills: die after an answer, before recording it.
    let after_send = match std::env::var_os("URUTAN_FAULT_ABORT_AFTER_EFFECT_SENT") {
        None => None,
        Some(n) => {
            let n: u64 = n.to_string_lossy().trim().parse().map_err(|_| {
                anyhow::anyhow!("URUTAN_FAULT_ABORT_AFTER_EFFECT_SENT must be a whole number")
            })?;
            let answers = std::sync::atomic::AtomicU64::new(0);
            Some(std::sync::Arc::new(move || {
                if answers.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1 >= n {
                    abort_now();
                }
            }) as urutan::effects::AfterSend)
        }
    };
    let metrics = urutan::metrics::install();
    let dispatcher =
        urutan::effects::Dispatcher::new(pool.clone(), config, effects, after_send).await?;
    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone()));
    let http = tokio::spawn(urutan::effects::http::serve(
        listener,
        metrics,
        dispatcher.ready.clone(),
        shutdown.clone(),
    ));
    dispatcher.run(shutdown).await;
    let _ = http.await;
    pool.close().await;
    info!("effects dispatcher stopped cleanly");
    Ok(())
}

/// `urutan relay`: serves the HTTP endpoints and relays until a signal.
async fn run_relay(settings: Settings, relay: RelaySettings) -> anyhow::Result<()> {
    use anyhow::Context;
    let listener = tokio::net::TcpListener::bind(settings.metrics_addr)
        .await
        .with_context(|| format!("cannot listen on METRICS_ADDR {}", settings.metrics_addr))?;
    info!(http = %listener.local_addr()?, "urutan relay starting");
    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone()));
    let health = std::sync::Arc::new(urutan::health::Health::new(urutan::health::Role::Relay));
    let metrics = urutan::metrics::install();
    urutan::metrics::register_relay();
    let http = tokio::spawn(urutan::http::serve(
        listener,
        metrics,
        health.clone(),
        shutdown.clone(),
    ));
    // Fault injection for crash drills: die between confirm and marking sent.
    let after_publish = std::env::var_os("URUTAN_FAULT_ABORT_AFTER_PUBLISH")
        .map(|_| std::sync::Arc::new(abort_now) as urutan::outbox::relay::AfterPublish);
    Relay {
        settings,
        relay,
        after_publish,
        health,
    }
    .run(shutdown)
    .await;
    let _ = http.await;
    info!("relay stopped cleanly");
    Ok(())
}

fn abort_now() {
    std::process::abort()
}

/// Messages in the dead-letter queue, if the broker answers.
async fn dead_letter_depth(settings: &Settings) -> Option<u32> {
    use lapin::options::QueueDeclareOptions;
    let conn = broker::connect(&settings.broker(), "urutan verify")
        .await
        .ok()?;
    let ch = conn.create_channel().await.ok()?;
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let queue = Names::new(&settings.topology_prefix).dead_letter_queue();
    let q = ch
        .queue_declare(queue.as_str().into(), passive, Default::default())
        .await
        .ok()?;
    let _ = urutan::broker::call("connection.close", conn.close(200, "done".into())).await;
    Some(q.message_count())
}

/// Cancels `shutdown` on the first SIGTERM or SIGINT.
async fn stop_on_signal(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        error!("cannot listen for signals; stop with SIGKILL");
        return;
    };
    tokio::select! {
        _ = term.recv() => info!("SIGTERM: finishing in-flight messages"),
        _ = int.recv() => info!("SIGINT: finishing in-flight messages"),
    }
    shutdown.cancel();
}
