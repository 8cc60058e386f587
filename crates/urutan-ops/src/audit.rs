//! The audit of operator actions (`urutan_audit`, migration 0027): the
//! console writes a row for every action it takes (who, when, what, on
//! which order, the result); the console and `urutan explain` read them.
//! This module is the table's one owner.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

/// One action taken.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct AuditRow {
    pub seq: i64,
    pub at: DateTime<Utc>,
    /// Who: the console's client and how it was admitted.
    pub by: String,
    /// What, e.g. `hold_release`.
    pub action: String,
    pub order: Option<String>,
    /// What exactly was acted on.
    pub target: String,
    pub result: String,
}

/// Records one action.
pub async fn record(
    db: &PgPool,
    by: &str,
    action: &str,
    order: Option<&str>,
    target: &str,
    result: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO urutan_audit (oleh, tindakan, pesanan_id, sasaran, hasil)
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(by)
    .bind(action)
    .bind(order)
    .bind(target)
    .bind(result)
    .execute(db)
    .await
    .map(drop)
}

const COLUMNS: &str = "SELECT seq, pada AS at, oleh AS by, tindakan AS action, \
                       pesanan_id AS \"order\", sasaran AS target, hasil AS result FROM urutan_audit";

/// The newest `limit` actions, newest first.
pub async fn recent(db: &PgPool, limit: i64) -> Result<Vec<AuditRow>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "{COLUMNS} ORDER BY seq DESC LIMIT $1"
    )))
    .bind(limit)
    .fetch_all(db)
    .await
}

/// The actions taken on `order`, oldest first (at most `limit`, the newest).
pub async fn of_order(db: &PgPool, order: &str, limit: i64) -> Result<Vec<AuditRow>, sqlx::Error> {
    let mut rows: Vec<AuditRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "{COLUMNS} WHERE pesanan_id = $1 ORDER BY seq DESC LIMIT $2"
    )))
    .bind(order)
    .bind(limit)
    .fetch_all(db)
    .await?;
    rows.reverse();
    Ok(rows)
}
