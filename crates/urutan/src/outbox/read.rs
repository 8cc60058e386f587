//! Reads of the outbox for the operator commands: one order's rows
//! (`urutan explain`) and the backlog (`urutan status`). They change
//! nothing.

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{FromRow, PgExecutor, PgPool, Row};

/// One outbox row of an order, as `urutan explain` shows it.
#[derive(Debug, Clone)]
pub struct OrderRow {
    /// `outbox.id`, the message id it is published with.
    pub id: i64,
    /// The payload's `versi`, if it is an integer.
    pub versi: Option<i64>,
    pub written_at: DateTime<Utc>,
    /// When the broker confirmed it (`None`: not sent yet).
    pub sent_at: Option<DateTime<Utc>>,
    /// Its message id (the row id) is recorded as processed.
    pub processed: bool,
}

impl FromRow<'_, PgRow> for OrderRow {
    /// By column name; `versi` is the payload's text, parsed here so that a
    /// producer's non-integer `versi` reads as `None` instead of failing
    /// the read.
    fn from_row(row: &PgRow) -> Result<Self, sqlx::Error> {
        let versi: Option<String> = row.try_get("versi")?;
        Ok(Self {
            id: row.try_get("id")?,
            versi: versi.and_then(|v| v.parse().ok()),
            written_at: row.try_get("written_at")?,
            sent_at: row.try_get("sent_at")?,
            processed: row.try_get("processed")?,
        })
    }
}

/// The outbox rows of order `order_id` (`agregat_id`), oldest first. The
/// outbox has no index on the order id: on a large outbox this is a scan,
/// bounded by the caller's statement timeout.
pub async fn rows_of_order(db: &PgPool, order_id: &str) -> Result<Vec<OrderRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT o.id, o.payload->>'versi' AS versi, o.dibuat_pada AS written_at,
                o.dikirim_pada AS sent_at,
                EXISTS (SELECT 1 FROM pesan_diproses d WHERE d.message_id = o.id::text
                                AND d.pesanan_id IN (o.agregat_id, '')) AS processed
         FROM outbox o WHERE o.agregat_id = $1 ORDER BY o.id",
    )
    .bind(order_id)
    .fetch_all(db)
    .await
}

/// What waits in the outbox.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Backlog {
    /// Rows not sent yet, those set aside as unroutable left out.
    pub unsent: i64,
    /// When the oldest of them was written.
    pub oldest_unsent_at: Option<DateTime<Utc>>,
    /// Rows the relay set aside as unroutable (not sent).
    pub unroutable: i64,
}

/// The outbox's backlog now (`urutan status`, and the relay's gauges).
pub async fn backlog(db: impl PgExecutor<'_>) -> Result<Backlog, sqlx::Error> {
    sqlx::query_as(
        "SELECT count(*) FILTER (WHERE unroutable_at IS NULL) AS unsent,
                min(dibuat_pada) FILTER (WHERE unroutable_at IS NULL) AS oldest_unsent_at,
                count(*) FILTER (WHERE unroutable_at IS NOT NULL) AS unroutable
         FROM outbox WHERE dikirim_pada IS NULL",
    )
    .fetch_one(db)
    .await
}
