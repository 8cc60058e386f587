//! Retiring the shards a shrink removed (`SHARD_COUNT` lowered with
//! `--allow-shrink`).
//!
//! The supervisor unbinds the removed shards from the hash exchange and opens
//! an epoch while relay publishing is paused, so every message routed to a
//! removed shard is queued before that epoch's marker and nothing but
//! markers can arrive after it. A removed shard keeps its worker until it has
//! passed that marker; then it holds no message any more: its queue is
//! deleted, highest shard first so the remaining queues stay contiguous, and
//! it is marked inactive (no longer awaited by handoffs or marked by new
//! epochs). Every step is idempotent: after a crash the next start
//! re-registers what is left and retires it again (a shard whose queue is
//! gone is made inactive by `handoff::register_shards`). Whether the whole
//! resharding is complete is `ring`'s call.

use std::sync::Arc;
use std::time::Duration;

use lapin::Connection;
use lapin::options::QueueDeleteOptions;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::broker::{Names, call};
use crate::health::Health;

/// Retires shards `from..to` (top first) once each has passed `epoch`.
pub async fn retire_shards(
    pool: PgPool,
    conn: Arc<Connection>,
    names: Names,
    (from, to): (u16, u16),
    epoch: i64,
    health: Arc<Health>,
    stop: CancellationToken,
) {
    let started = std::time::Instant::now();
    for shard in (from..to).rev() {
        loop {
            match retire_when_drained(&pool, &conn, &names, shard, epoch).await {
                Ok(true) => {
                    health.retire(shard);
                    info!(shard, "retired a removed shard (drained, queue deleted)");
                    break;
                }
                Ok(false) => {}
                Err(e) => warn!(shard, error = %e, "cannot retire the shard yet"),
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
            if !conn.status().connected() {
                return; // the next connection starts over
            }
        }
    }
    info!(
        shards = from,
        seconds = started.elapsed().as_secs_f64(),
        "every removed shard retired"
    );
}

/// One attempt: true once the shard is retired.
async fn retire_when_drained(
    pool: &PgPool,
    conn: &Connection,
    names: &Names,
    shard: u16,
    epoch: i64,
) -> Result<bool, Box<dyn std::error::Error + Send + Sync>> {
    let passed: Option<bool> =
        sqlx::query_scalar("SELECT epoch >= $2 FROM urutan_shard WHERE shard = $1")
            .bind(i32::from(shard))
            .bind(epoch)
            .fetch_optional(pool)
            .await?;
    if passed == Some(false) {
        return Ok(false);
    }
    // Deleting an already deleted queue (another replica was faster) is ok.
    let ch = call("channel.open", conn.create_channel()).await?;
    let queue = names.shard_queue(shard);
    call(
        "queue.delete",
        ch.queue_delete(queue.as_str().into(), QueueDeleteOptions::default()),
    )
    .await?;
    let _ = ch.close(200, "retired".into()).await;
    sqlx::query("UPDATE urutan_shard SET aktif = false WHERE shard = $1")
        .bind(i32::from(shard))
        .execute(pool)
        .await?;
    Ok(true)
}

/// False once `shard` was retired (its worker then stops for good).
pub async fn is_retired(pool: &PgPool, shard: u16) -> bool {
    let active: Result<Option<bool>, _> =
        sqlx::query_scalar("SELECT aktif FROM urutan_shard WHERE shard = $1")
            .bind(i32::from(shard))
            .fetch_optional(pool)
            .await;
    matches!(active, Ok(Some(false)))
}
