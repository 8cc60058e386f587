//! Dead-letter records (`urutan_dead_letter`, migration 0008), the one owner
//! of the table: written by a worker before it rejects a delivery into the
//! DLQ, read (`read.rs`: `urutan dlq`, `status`, `explain`) and resolved by
//! `urutan dlq`, purged after `DEAD_LETTER_RETENTION` once resolved and after
//! `DEAD_LETTER_UNRESOLVED_RETENTION` if never resolved.
//!
//! Invariant: at most one unresolved row per (delivery key, order id), the
//! dedup key of contract section 3 (a partial unique index, migration 0044;
//! a record without an order id counts as order `''`): two orders'
//! messages with one message id are two records. Recording is `ON CONFLICT
//! DO NOTHING`, so a redelivery of a message whose row committed before a
//! crash (and before its reject) records nothing new. Every read of a
//! message's record names its order too ([`crate::dead_letter::order_id`]
//! of the message), or reads every order's.

use std::time::Duration;

use sqlx::types::Json;
use sqlx::{Connection, PgConnection, PgExecutor, PgPool};

use super::StoreError;
use super::retention::{Expiring, purge_in_batches};

mod read;

pub use read::{
    Candidate, Listed, Reason, ReasonCount, Record, Resolved, Shown, Unresolved, candidates,
    dead_lettered_again, find_unresolved, is_unresolved, keys_with_prefix, last_resolution,
    list_unresolved, newest, of_order, settled_count, settled_keys, shown_by_id,
    unresolved_by_reason, unresolved_count, unresolved_orders,
};

/// Which message a dead-letter record is about, and why it is there: the
/// columns every record is written with ([`NewDeadLetter`]) and read back
/// with ([`Listed`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct Subject {
    /// What identifies the delivery across redeliveries, the DLQ and
    /// replays (see [`crate::dead_letter::delivery_key`]).
    pub delivery_key: String,
    pub message_id: Option<String>,
    pub pesanan_id: Option<String>,
    pub versi: Option<i64>,
    /// -1 when unknown (recorded from the queue without a shard in x-death).
    pub shard: i32,
    pub reason: String,
    pub detail: String,
    pub last_error: Option<String>,
}

/// One entry of the broker's `x-death` header (most recent first), as
/// `urutan_dead_letter.x_death` keeps it (read from a message by
/// [`crate::dead_letter::deaths`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Death {
    /// `rejected`, `delivery_limit`, `expired`, `maxlen`.
    pub reason: String,
    /// The queue the message was dead-lettered from.
    pub queue: String,
    pub count: i64,
    /// Seconds since the epoch.
    pub time: Option<u64>,
    /// Where it had been published.
    pub exchange: String,
    #[serde(rename = "routing-keys")]
    pub routing_keys: Vec<String>,
}

/// One dead-letter row to record (see the migration for each column).
#[derive(Debug, Clone, PartialEq)]
pub struct NewDeadLetter {
    /// Which message, and why.
    pub subject: Subject,
    /// `worker` or `queue`.
    pub recorded_by: &'static str,
    pub exchange: Option<String>,
    pub routing_key: Option<String>,
    pub properties: serde_json::Value,
    pub headers: serde_json::Value,
    /// At most [`crate::dead_letter::BODY_KEPT`] bytes.
    pub body: Vec<u8>,
    /// The full body size.
    pub body_bytes: i32,
    pub x_death: Option<serde_json::Value>,
    /// When it was dead-lettered, if not now (the broker's x-death time of
    /// a message recorded from the queue).
    pub dead_lettered_at: Option<chrono::DateTime<chrono::Utc>>,
}

impl NewDeadLetter {
    /// The same record without the message's content (headers,
    /// properties, body): the fallback if PostgreSQL refuses the full row,
    /// so the delivery still has a row. The order id stays: it is part of
    /// the record's key, and storable (checked when it was taken).
    pub fn minimal(&self) -> Self {
        Self {
            properties: serde_json::json!({}),
            headers: serde_json::json!({}),
            body: Vec::new(),
            x_death: None,
            ..self.clone()
        }
    }
}

/// Inserts `row` unless its (key, order) already has an unresolved row;
/// returns the new row's id (`None`: one was there).
pub async fn insert_dead_letter<'c>(
    executor: impl PgExecutor<'c>,
    row: &NewDeadLetter,
) -> Result<Option<i64>, sqlx::Error> {
    sqlx::query_scalar(
        "INSERT INTO urutan_dead_letter (delivery_key, message_id, pesanan_id, versi, shard,
             reason, detail, last_error, recorded_by, exchange, routing_key, properties,
             headers, body, body_bytes, x_death, dead_lettered_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,
                 coalesce($17, now()))
         ON CONFLICT (delivery_key, (coalesce(pesanan_id, ''))) WHERE resolved_at IS NULL
         DO NOTHING
         RETURNING id",
    )
    .bind(&row.subject.delivery_key)
    .bind(&row.subject.message_id)
    .bind(&row.subject.pesanan_id)
    .bind(row.subject.versi)
    .bind(row.subject.shard)
    .bind(&row.subject.reason)
    .bind(&row.subject.detail)
    .bind(&row.subject.last_error)
    .bind(row.recorded_by)
    .bind(&row.exchange)
    .bind(&row.routing_key)
    .bind(Json(&row.properties))
    .bind(Json(&row.headers))
    .bind(&row.body)
    .bind(row.body_bytes)
    .bind(row.x_death.as_ref().map(Json))
    .bind(row.dead_lettered_at)
    .fetch_optional(executor)
    .await
}

/// Records `rows` in one transaction (a worker, before it rejects the
/// deliveries): committed when this returns `Ok`.
pub async fn record_dead_letters(
    conn: &mut PgConnection,
    rows: &[NewDeadLetter],
) -> Result<(), StoreError> {
    let mut tx = conn.begin().await?;
    for row in rows {
        insert_dead_letter(&mut *tx, row).await?;
    }
    tx.commit().await?;
    Ok(())
}

/// Marks record `id` resolved as `resolution` (`replayed` or `purged`), once:
/// a resolved row stays as it was (`urutan dlq replay` and `purge`).
pub async fn resolve_dead_letter<'c>(
    executor: impl PgExecutor<'c>,
    id: i64,
    resolution: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE urutan_dead_letter SET resolved_at = now(), resolution = $2
         WHERE id = $1 AND resolved_at IS NULL",
    )
    .bind(id)
    .bind(resolution)
    .execute(executor)
    .await?;
    Ok(())
}

/// Marks the unresolved record of delivery key `key` `purged`; nothing if
/// there is none (`urutan dlq`: an unreadable message someone removed).
pub async fn purge_dead_letter_by_key(pool: &PgPool, key: &str) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE urutan_dead_letter SET resolved_at = now(), resolution = 'purged'
         WHERE delivery_key = $1 AND resolved_at IS NULL",
    )
    .bind(key)
    .execute(pool)
    .await?;
    Ok(())
}

/// Stores the broker's `x-death` entries in record `id`, unless it has some
/// already (`urutan dlq` meeting the message in the queue).
pub async fn store_dead_letter_x_death(
    pool: &PgPool,
    id: i64,
    deaths: &[Death],
) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE urutan_dead_letter SET x_death = $2 WHERE id = $1 AND x_death IS NULL")
        .bind(id)
        .bind(Json(serde_json::json!(deaths)))
        .execute(pool)
        .await?;
    Ok(())
}

/// Marks `purged` the unresolved records dead-lettered more than a minute
/// before `started` (the start of a `urutan dlq purge` that removed every
/// message it met). Returns how many were marked.
pub async fn purge_dead_letters_before(
    pool: &PgPool,
    started: chrono::DateTime<chrono::Utc>,
) -> Result<u64, sqlx::Error> {
    Ok(sqlx::query(
        "UPDATE urutan_dead_letter SET resolved_at = now(), resolution = 'purged'
         WHERE resolved_at IS NULL AND dead_lettered_at < $1 - interval '1 minute'",
    )
    .bind(started)
    .execute(pool)
    .await?
    .rows_affected())
}

/// Marks `purged` the unresolved records of delivery key `key` (only
/// `order`'s, if given) dead-lettered more than a minute before `started`:
/// what [`purge_dead_letters_before`] does, for one chosen message that a
/// walk started at `started` did not meet in the DLQ. Returns whether one
/// was marked.
pub async fn purge_dead_letter_before(
    pool: &PgPool,
    key: &str,
    order: Option<&str>,
    started: chrono::DateTime<chrono::Utc>,
) -> Result<bool, sqlx::Error> {
    Ok(sqlx::query(
        "UPDATE urutan_dead_letter SET resolved_at = now(), resolution = 'purged'
         WHERE delivery_key = $1 AND resolved_at IS NULL
           AND ($3::text IS NULL OR pesanan_id = $3)
           AND dead_lettered_at < $2 - interval '1 minute'",
    )
    .bind(key)
    .bind(started)
    .bind(order)
    .execute(pool)
    .await?
    .rows_affected()
        > 0)
}

/// Deletes resolved dead-letter rows resolved longer than `retention` ago,
/// in batches. Returns how many rows went.
pub async fn purge_resolved_dead_letters(
    pool: &PgPool,
    retention: Duration,
) -> Result<u64, sqlx::Error> {
    const RESOLVED: Expiring = Expiring::new(
        "urutan_dead_letter",
        "id",
        "resolved_at < now() - make_interval(secs => $1)",
    );
    purge_in_batches(pool, &RESOLVED, retention).await
}

/// Deletes unresolved dead-letter rows recorded longer than `retention` ago
/// (`recorded_at`: urutan's clock, not a producer-influenced x-death time),
/// in batches, so a flood of poison cannot grow the table without bound. A
/// message still in the DLQ is recorded again (`recorded_by = 'queue'`) the
/// next time `urutan dlq` walks the queue. Returns how many rows went.
pub async fn purge_unresolved_dead_letters(
    pool: &PgPool,
    retention: Duration,
) -> Result<u64, sqlx::Error> {
    const UNRESOLVED: Expiring = Expiring::new(
        "urutan_dead_letter",
        "id",
        "resolved_at IS NULL AND recorded_at < now() - make_interval(secs => $1)",
    );
    purge_in_batches(pool, &UNRESOLVED, retention).await
}
