//! Reads on the contract tables for operator tools, in the module that owns
//! them (the SQL functions the apply statement calls write them): where a
//! message or an order stands (`pesan_diproses`, `pesanan`,
//! `pesanan_riwayat`), an order's state, history, parked messages
//! (`urutan_parkir`) and messages handed back (`urutan_dikembalikan`), and
//! per shard what is parked and when it last applied. They change nothing.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

/// When the message `message_id` was processed for order `order_id`
/// (`pesan_diproses`; an id recorded before orders were, `''`, counts for
/// every order); `None` if it was not (or its id has been purged by
/// retention, or it was processed for another order only: dedup is per
/// (order, message id)).
pub async fn processed_at(
    db: &PgPool,
    message_id: &str,
    order_id: &str,
) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT diproses_pada FROM pesan_diproses
         WHERE message_id = $1 AND pesanan_id IN ($2, '')
         ORDER BY diproses_pada LIMIT 1",
    )
    .bind(message_id)
    .bind(order_id)
    .fetch_optional(db)
    .await
}

/// The stored version (`versi`) of order `order_id`; `None` if it is not
/// stored.
pub async fn stored_version(db: &PgPool, order_id: &str) -> Result<Option<i64>, sqlx::Error> {
    sqlx::query_scalar("SELECT versi FROM pesanan WHERE id = $1")
        .bind(order_id)
        .fetch_optional(db)
        .await
}

/// Where message `message_id` stands when its dead-letter record holds no
/// version (its body was never read: too large, not JSON, ...): the order it
/// was processed for, and the version it applied or waits as, if any
/// (`None` when not processed yet). Dedup is per (order, message id): with
/// the order known (`order_id`, from the record's header) only its claim
/// counts (or one recorded before orders were, `''`); without it, the
/// newest claim of the id, whichever order made it.
pub async fn standing_by_id(
    db: &PgPool,
    message_id: &str,
    order_id: Option<&str>,
) -> Result<Option<(String, Option<i64>, Option<i64>)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT d.pesanan_id,
                (SELECT r.versi FROM pesanan_riwayat r
                 WHERE r.pesanan_id = d.pesanan_id AND r.message_id = $1),
                (SELECT u.versi FROM urutan_parkir u
                 WHERE u.pesanan_id = d.pesanan_id AND u.message_id = $1 LIMIT 1)
         FROM pesan_diproses d
         WHERE d.message_id = $1 AND ($2::text IS NULL OR d.pesanan_id IN ($2, ''))
         ORDER BY d.diproses_pada DESC LIMIT 1",
    )
    .bind(message_id)
    .bind(order_id)
    .fetch_optional(db)
    .await
}

/// Where one message (a version of an order) stands, see [`standing`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Standing {
    /// The message id that applied this version of the order
    /// (`pesanan_riwayat`), if one did.
    pub applied_by: Option<String>,
    /// The message is parked for the order (`urutan_parkir`).
    pub parked: bool,
    /// The message id is recorded as processed for this order (`pesan_diproses`).
    pub processed: bool,
    /// The order's stored version (`pesanan`), if it is stored.
    pub stored: Option<i64>,
}

/// Where message `message_id`, version `versi` of order `order_id`, stands
/// now, read in one statement.
pub async fn standing(
    db: &PgPool,
    message_id: &str,
    order_id: &str,
    versi: i64,
) -> Result<Standing, sqlx::Error> {
    let (applied_by, parked, processed, stored) = sqlx::query_as(
        "SELECT (SELECT message_id FROM pesanan_riwayat WHERE pesanan_id = $2 AND versi = $3),
                EXISTS (SELECT 1 FROM urutan_parkir WHERE pesanan_id = $2 AND message_id = $1),
                EXISTS (SELECT 1 FROM pesan_diproses
                        WHERE message_id = $1 AND pesanan_id IN ($2, '')),
                (SELECT versi FROM pesanan WHERE id = $2)",
    )
    .bind(message_id)
    .bind(order_id)
    .bind(versi)
    .fetch_one(db)
    .await?;
    Ok(Standing {
        applied_by,
        parked,
        processed,
        stored,
    })
}

/// An order's stored state (`pesanan`), as `urutan explain` shows it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct OrderState {
    pub status: String,
    pub versi: i64,
    /// The highest epoch of its applied messages.
    pub epoch: i64,
    pub updated_at: DateTime<Utc>,
    /// Its optional extra state, as JSON text.
    pub data: Option<String>,
}

/// The stored state of order `order_id`; `None` if it is not stored.
pub async fn order_state(db: &PgPool, order_id: &str) -> Result<Option<OrderState>, sqlx::Error> {
    sqlx::query_as(
        "SELECT status, versi, epoch, diperbarui_pada AS updated_at, data::text AS data
         FROM pesanan WHERE id = $1",
    )
    .bind(order_id)
    .fetch_optional(db)
    .await
}

/// One applied version of an order (`pesanan_riwayat`).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct AppliedVersion {
    pub versi: i64,
    pub status: String,
    /// The message that applied it.
    pub message_id: String,
    pub shard: i32,
    /// When it was applied.
    pub at: DateTime<Utc>,
    /// The latest epoch opened before it was applied: its epoch is at most
    /// this (the history does not record epochs).
    pub epoch_at_most: Option<i64>,
}

/// The versions of order `order_id` applied, in the order they were.
pub async fn applied_versions(
    db: &PgPool,
    order_id: &str,
) -> Result<Vec<AppliedVersion>, sqlx::Error> {
    sqlx::query_as(
        "SELECT r.versi, r.status, r.message_id, r.shard, r.diterapkan_pada AS at,
                (SELECT max(e.epoch) FROM urutan_epoch e WHERE e.dibuka_pada <= r.diterapkan_pada)
                    AS epoch_at_most
         FROM pesanan_riwayat r WHERE r.pesanan_id = $1 ORDER BY r.seq",
    )
    .bind(order_id)
    .fetch_all(db)
    .await
}

/// The newest time a version was applied on each shard, among the newest
/// `recent` history rows (so the read stays cheap on a large history):
/// `(shard, when)`.
pub async fn last_applied_by_shard(
    db: &PgPool,
    recent: i64,
) -> Result<Vec<(i32, DateTime<Utc>)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT shard, max(diterapkan_pada) FROM
             (SELECT shard, diterapkan_pada FROM pesanan_riwayat ORDER BY seq DESC LIMIT $1) r
         GROUP BY shard",
    )
    .bind(recent)
    .fetch_all(db)
    .await
}

/// A parked message of an order (`urutan_parkir`).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ParkedVersion {
    pub versi: i64,
    pub message_id: String,
    pub shard: i32,
    /// The epoch it waits for.
    pub epoch: i64,
    /// When it was parked.
    pub since: DateTime<Utc>,
}

/// The parked messages of order `order_id`, by version.
pub async fn parked_versions(
    db: &PgPool,
    order_id: &str,
) -> Result<Vec<ParkedVersion>, sqlx::Error> {
    sqlx::query_as(
        "SELECT versi, message_id, shard, epoch, diparkir_pada AS since FROM urutan_parkir
         WHERE pesanan_id = $1 ORDER BY versi, seq",
    )
    .bind(order_id)
    .fetch_all(db)
    .await
}

/// The parked messages of one shard (`urutan_parkir`).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ParkedOnShard {
    pub shard: i32,
    pub count: i64,
    /// When the oldest was parked.
    pub oldest_at: DateTime<Utc>,
    /// The order of the first one parked.
    pub oldest_order: String,
}

/// The parked messages counted by shard (shards without any left out).
pub async fn parked_by_shard(db: &PgPool) -> Result<Vec<ParkedOnShard>, sqlx::Error> {
    sqlx::query_as(
        "SELECT shard, count(*) AS count, min(diparkir_pada) AS oldest_at,
                (array_agg(pesanan_id ORDER BY seq))[1] AS oldest_order
         FROM urutan_parkir GROUP BY shard",
    )
    .fetch_all(db)
    .await
}

/// A version of an order handed back to its shard queue after a failure
/// and not back yet (`urutan_dikembalikan`).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ReturnedVersion {
    pub versi: i64,
    pub message_id: String,
    pub shard: i32,
    /// When it was handed back.
    pub since: DateTime<Utc>,
}

/// A version that arrived after a newer one was applied (`urutan_basi`).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct StaleArrival {
    pub versi: i64,
    pub message_id: String,
    pub shard: i32,
    pub at: DateTime<Utc>,
}

/// The stale arrivals of order `order_id` (at most 1,000), by version.
pub async fn stale_arrivals(db: &PgPool, order_id: &str) -> Result<Vec<StaleArrival>, sqlx::Error> {
    sqlx::query_as(
        "SELECT versi, message_id, shard, tiba_pada AS at FROM urutan_basi
         WHERE pesanan_id = $1 ORDER BY versi, seq LIMIT 1000",
    )
    .bind(order_id)
    .fetch_all(db)
    .await
}

/// The versions of order `order_id` handed back and not back yet, by version.
pub async fn returned_versions(
    db: &PgPool,
    order_id: &str,
) -> Result<Vec<ReturnedVersion>, sqlx::Error> {
    sqlx::query_as(
        "SELECT versi, message_id, shard, dikembalikan_pada AS since FROM urutan_dikembalikan
         WHERE pesanan_id = $1 ORDER BY versi",
    )
    .bind(order_id)
    .fetch_all(db)
    .await
}
