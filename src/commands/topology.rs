//! `urutan topology`: declares the broker topology, records the ring (a
//! changed `SHARD_COUNT` is an online resharding) and exits.

use anyhow::Context;
use tracing::info;
use urutan::broker;
use urutan::config::{Settings, TopologyMode};
use urutan::reshard::prepare::{Prepared, prepare_topology};
use urutan::store;

pub const HELP: &str = "\
Declares the exchanges, the SHARD_COUNT shard queues and the DLQ, and records the
ring; a changed SHARD_COUNT is an online resharding (ALLOW_SHRINK for fewer).

Examples:
  urutan topology
  SHARD_COUNT=12 urutan topology
  SHARD_COUNT=4 ALLOW_SHRINK=true urutan topology";

pub async fn run(settings: Settings) -> anyhow::Result<()> {
    // Since bindings may change the ring, the preparation opens an epoch
    // with relay publishing paused (see `reshard::handoff`).
    let pool = store::prepare(&settings.database(), 2)
        .await
        .with_context(|| format!("cannot open {}", settings.database_url))?;
    let conn = broker::connect(&settings.broker(), "urutan topology")
        .await
        .with_context(|| format!("cannot connect to {}", settings.amqp_url))?;
    let names = settings.names();
    let mut declare = settings.clone();
    declare.topology_mode = TopologyMode::Declare;
    let Prepared { plan, epoch, .. } =
        prepare_topology(&declare, &names, &pool, &conn, true).await?;
    let _ = broker::call("connection.close", conn.close(200, "done".into())).await;
    pool.close().await;
    info!(
        shards = plan.consumed,
        bound = plan.bound,
        epoch,
        "topology declared"
    );
    Ok(())
}
