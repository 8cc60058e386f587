//! `urutan run`: the worker pool (topology, one worker per shard) until a
//! signal.

use anyhow::Context;
use tokio_util::sync::CancellationToken;
use tracing::info;
use urutan::config::Settings;
use urutan::handler::SharedHandler;
use urutan::shard::Hooks;
use urutan::supervisor::Supervisor;

pub const HELP: &str = "\
Examples:
  SHARD_COUNT=8 urutan run
  PREFETCH=32 urutan run                      # ordered batch mode
  AMQP_URL=amqp://u:p@n1:5672/%2f,amqp://u:p@n2:5672/%2f urutan run   # a cluster's nodes
  TOPOLOGY_MODE=check urutan run              # a worker user that may not declare

Health: GET /healthz (alive) and /readyz (consuming) on METRICS_ADDR; metrics on /metrics.";

pub async fn run(settings: Settings, handler: Option<SharedHandler>) -> anyhow::Result<()> {
    let hooks = Hooks::from_env()?;
    let mut supervisor = Supervisor::build(settings.clone(), hooks)
        .await
        .with_context(|| format!("cannot listen on METRICS_ADDR {}", settings.metrics_addr))?;
    if let Some(handler) = handler {
        supervisor = supervisor.with_handler(handler);
    }
    info!(http = %supervisor.http_addr(), "urutan run starting");
    let shutdown = CancellationToken::new();
    tokio::spawn(super::stop_on_signal(shutdown.clone()));
    match supervisor.run(shutdown).await {
        Err(urutan::supervisor::RunError::Setting(wrong)) => {
            return Err(urutan::heal::WrongSetting(wrong).into());
        }
        other => other?,
    }
    info!("stopped cleanly");
    Ok(())
}
