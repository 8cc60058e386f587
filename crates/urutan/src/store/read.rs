//! Reads on the contract tables for operator tools: where a message or an
//! order stands (`pesan_diproses`, `pesanan`, `pesanan_riwayat`, and the
//! parked messages of `urutan_parkir`). They change nothing.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

/// When the message `message_id` was processed for order `order_id`
/// (`pesan_diproses`; an id recorded before orders were, `''`, counts for
/// every order); `None` if it was not (or its id has been purged by
/// retention, or it was processed for another order).
pub async fn processed_at(
    db: &PgPool,
    message_id: &str,
    order_id: &str,
) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT diproses_pada FROM pesan_diproses
         WHERE message_id = $1 AND pesanan_id IN ($2, '')",
    )
    .bind(message_id)
    .bind(order_id)
    .fetch_optional(db)
    .await
}

/// The order that recorded the message id `message_id` (`Some("")`: one
/// recorded before orders were); `None` if it is not recorded.
pub async fn processed_for(db: &PgPool, message_id: &str) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar("SELECT pesanan_id FROM pesan_diproses WHERE message_id = $1")
        .bind(message_id)
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
