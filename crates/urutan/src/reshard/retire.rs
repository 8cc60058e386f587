//! Retiring the shards a shrink removed (`SHARD_COUNT` lowered with
//! `--allow-shrink`).
//!
//! Topology preparation ([`super::prepare`]) unbinds the removed shards
//! from the hash exchange and opens an epoch while relay publishing is
//! paused, so every message routed to a removed shard is queued before that
//! epoch's marker and nothing but
//! markers can arrive after it. A removed shard keeps its worker until it has
//! passed that marker; then it holds no message any more: its queue is
//! deleted, highest shard first so the remaining queues stay contiguous, and
//! it is marked inactive (no longer awaited by handoffs or marked by new
//! epochs). Every step is idempotent: after a crash the next start
//! re-registers what is left and retires it again (a shard whose queue is
//! gone is made inactive by `handoff::register_shards`). Whether the whole
//! resharding is complete is `ring`'s call.
//!
//! The delete and the mark run under the lock a ring change holds
//! (`handoff::pause_publishing`), so they never interleave with another
//! replica's `topology::declare`. Without it, a replica that counted the
//! shard queues just before a delete declared the deleted queue again, and
//! a second retirer deleted that new queue milliseconds later, before its
//! leader had started its dead-letter worker: on RabbitMQ 3.10 the orphaned
//! worker crashes twice and takes `rabbit_fifo_dlx_sup` down, after which
//! the node declares no at-least-once queue until `rabbitmqctl stop_app &&
//! rabbitmqctl start_app` (deploy/rabbitmq/README.md). Under the lock a
//! queue is only deleted after its leader carried this connection's marker
//! to a consumer (so it has long been up), and a shard another replica
//! already retired is left alone.

use std::sync::Arc;
use std::time::Duration;

use lapin::Connection;
use lapin::options::QueueDeleteOptions;
use sqlx::{PgConnection, PgPool};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::broker::{Names, call};
use crate::health::Health;
use crate::reshard::handoff;

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
            let attempt = retire_when_drained(&pool, &conn, &names, shard, epoch);
            let Some(attempt) = stop.run_until_cancelled(attempt).await else {
                return;
            };
            match attempt {
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
    match progress(pool, shard, epoch).await? {
        Progress::Draining => return Ok(false),
        Progress::Retired => return Ok(true),
        Progress::Drained => {}
    }
    // A session of its own for the lock (see `handoff::resume_publishing`).
    let mut db = pool.acquire().await?.detach();
    handoff::pause_publishing(&mut db, names).await?;
    let retired = retire_locked(&mut db, conn, names, shard, epoch).await;
    handoff::resume_publishing(db).await;
    retired
}

/// Deletes the queue and marks the shard inactive, under the ring-change
/// lock (checking again under it).
async fn retire_locked(
    db: &mut PgConnection,
    conn: &Connection,
    names: &Names,
    shard: u16,
    epoch: i64,
) -> Result<bool, Box<dyn std::error::Error + Send + Sync>> {
    match progress(&mut *db, shard, epoch).await? {
        Progress::Draining => return Ok(false),
        Progress::Retired => return Ok(true),
        Progress::Drained => {}
    }
    // Deleting an already deleted queue is ok.
    let ch = call("channel.open", conn.create_channel()).await?;
    let queue = names.shard_queue(shard);
    call(
        "queue.delete",
        ch.queue_delete(queue.as_str().into(), QueueDeleteOptions::default()),
    )
    .await?;
    let _ = call("channel.close", ch.close(200, "retired".into())).await;
    sqlx::query("UPDATE urutan_shard SET aktif = false WHERE shard = $1")
        .bind(i32::from(shard))
        .execute(&mut *db)
        .await?;
    Ok(true)
}

/// Where a removed shard is on its way out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Not past the epoch marker yet, or messages it parked still wait (its
    /// worker keeps releasing them; once it stops, nobody would).
    Draining,
    /// Past it: the queue holds no message any more.
    Drained,
    /// Already inactive (retired by another replica, or before a crash):
    /// its queue is gone, and only a ring change declares it again, marking
    /// the shard active under the same lock.
    Retired,
}

/// Whether removed `shard` may be retired now (it passed the marker of
/// `epoch` and nothing it parked still waits).
pub async fn progress(
    db: impl sqlx::PgExecutor<'_>,
    shard: u16,
    epoch: i64,
) -> Result<Progress, sqlx::Error> {
    let state: Option<(bool, bool)> = sqlx::query_as(
        "SELECT epoch >= $2 AND NOT EXISTS (SELECT 1 FROM urutan_parkir WHERE shard = $1),
                aktif
         FROM urutan_shard WHERE shard = $1",
    )
    .bind(i32::from(shard))
    .bind(epoch)
    .fetch_optional(db)
    .await?;
    Ok(match state {
        Some((_, false)) => Progress::Retired,
        Some((false, true)) => Progress::Draining,
        Some((true, true)) | None => Progress::Drained,
    })
}

/// True once `shard` was retired (its worker then stops for good); false while it is active, unknown or unreadable.
pub async fn is_retired(pool: &PgPool, shard: u16) -> bool {
    let active: Result<Option<bool>, _> =
        sqlx::query_scalar("SELECT aktif FROM urutan_shard WHERE shard = $1")
            .bind(i32::from(shard))
            .fetch_optional(pool)
            .await;
    matches!(active, Ok(Some(false)))
}
