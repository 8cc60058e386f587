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
    /// Set aside by the relay, never published (`None`: not set aside).
    pub set_aside: Option<SetAsideRow>,
}

/// Why and when the relay set an outbox row aside (migration 0038).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetAsideRow {
    pub at: DateTime<Utc>,
    /// The code (`super::check::SetAside::reason`; `unroutable` for a row
    /// set aside before the codes existed).
    pub reason: String,
    /// Why, in words.
    pub detail: String,
}

impl FromRow<'_, PgRow> for OrderRow {
    /// By column name; `versi` is the payload's text, parsed here so that a
    /// producer's non-integer `versi` reads as `None` instead of failing
    /// the read.
    fn from_row(row: &PgRow) -> Result<Self, sqlx::Error> {
        let versi: Option<String> = row.try_get("versi")?;
        let aside_at: Option<DateTime<Utc>> = row.try_get("set_aside_at")?;
        Ok(Self {
            set_aside: match aside_at {
                Some(at) => Some(SetAsideRow {
                    at,
                    reason: row.try_get("set_aside_reason")?,
                    detail: row
                        .try_get::<Option<String>, _>("set_aside_detail")?
                        .unwrap_or_default(),
                }),
                None => None,
            },
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
                o.dikirim_pada AS sent_at, o.unroutable_at AS set_aside_at,
                coalesce(o.alasan_sisih, 'unroutable') AS set_aside_reason,
                o.unroutable_reason AS set_aside_detail,
                EXISTS (SELECT 1 FROM pesan_diproses d WHERE d.message_id = o.id::text
                                AND d.pesanan_id IN (o.agregat_id, '')) AS processed
         FROM outbox o WHERE o.agregat_id = $1 ORDER BY o.id",
    )
    .bind(order_id)
    .fetch_all(db)
    .await
}

/// What waits in the outbox.
#[derive(Debug, Clone, Default)]
pub struct Backlog {
    /// Rows not sent yet, those set aside left out.
    pub unsent: i64,
    /// When the oldest of them was written.
    pub oldest_unsent_at: Option<DateTime<Utc>>,
    /// Rows the relay set aside as unroutable (not sent): the `unroutable`
    /// count of `set_aside`.
    pub unroutable: i64,
    /// Rows the relay set aside (not sent), by reason, most first.
    pub set_aside: Vec<SetAsideCount>,
}

/// How many unsent rows are set aside for one reason, and since when.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SetAsideCount {
    pub reason: String,
    pub count: i64,
    /// When the oldest of them was written.
    #[serde(serialize_with = "crate::rfc3339::option")]
    pub oldest_at: Option<DateTime<Utc>>,
}

/// The outbox's backlog now (`urutan status`, and the relay's gauges): one
/// pass over the unsent rows (the partial index), grouped by reason.
pub async fn backlog(db: impl PgExecutor<'_>) -> Result<Backlog, sqlx::Error> {
    let groups: Vec<(Option<String>, i64, Option<DateTime<Utc>>)> = sqlx::query_as(
        "SELECT CASE WHEN unroutable_at IS NOT NULL THEN coalesce(alasan_sisih, 'unroutable') END,
                count(*), min(dibuat_pada)
         FROM outbox WHERE dikirim_pada IS NULL GROUP BY 1",
    )
    .fetch_all(db)
    .await?;
    let mut backlog = Backlog::default();
    for (reason, count, oldest_at) in groups {
        match reason {
            None => (backlog.unsent, backlog.oldest_unsent_at) = (count, oldest_at),
            Some(reason) => {
                if reason == super::check::SetAside::Unroutable.reason() {
                    backlog.unroutable = count;
                }
                backlog.set_aside.push(SetAsideCount {
                    reason,
                    count,
                    oldest_at,
                });
            }
        }
    }
    backlog
        .set_aside
        .sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.reason.cmp(&b.reason)));
    Ok(backlog)
}
