//! `urutan run`: the worker pool (topology, one worker per shard) until a
//! signal: the core library's [`urutan::Pool`], with the crash drills'
//! fault hooks (`URUTAN_FAULT_*`, [`Hooks::from_env`]).

use urutan::config::Settings;
use urutan::handler::SharedHandler;
use urutan::shard::Hooks;
use urutan::{Pool, RunError};

pub const HELP: &str = "\
Examples:
  SHARD_COUNT=8 urutan run
  PREFETCH=32 urutan run                      # ordered batch mode
  AMQP_URL=amqp://u:p@n1:5672/%2f,amqp://u:p@n2:5672/%2f urutan run   # a cluster's nodes
  TOPOLOGY_MODE=check urutan run              # a worker user that may not declare

Health: GET /healthz (alive) and /readyz (consuming) on METRICS_ADDR; metrics on /metrics.";

pub async fn run(settings: Settings, handler: Option<SharedHandler>) -> anyhow::Result<()> {
    let mut pool = Pool::new(settings).with_hooks(Hooks::from_env()?);
    if let Some(handler) = handler {
        pool = pool.shared_handler(handler);
    }
    match pool.run().await {
        Err(RunError::Setting(wrong)) => Err(urutan::heal::WrongSetting(wrong).into()),
        other => Ok(other?),
    }
}
