//! The audit of operator actions (`urutan_audit`, migration 0027): the
//! console and the state-changing commands (`urutan dlq replay`, `dlq
//! purge`, `hold release`) write a row for every action they take (who,
//! when, what, on which order, the result); the console and `urutan
//! explain` read them. This module is the table's one owner.

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

/// Who acts from the command line, for the audit: how (`cli`: the OS
/// user, no login of urutan's own), the OS user and the host, e.g.
/// `cli (os user) alice@db-1` (the console's is `console (token, bearer)
/// 127.0.0.1:5555`).
pub fn cli_actor() -> String {
    let user = ["USER", "LOGNAME"]
        .iter()
        .filter_map(|var| std::env::var(var).ok())
        .find(|u| !u.trim().is_empty())
        .or_else(uid)
        .unwrap_or_else(|| "unknown user".to_owned());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown host".to_owned());
    format!("cli (os user) {}@{}", user.trim(), host)
}

/// `uid N` of this process (Linux), when no user name is in the environment.
fn uid() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    let uid = line.split_whitespace().nth(1)?;
    Some(format!("uid {uid}"))
}

/// Records one action of a command (`by`: [`cli_actor`]); a row that
/// cannot be written is said on standard error, never fails the action
/// (it is done already).
pub async fn record_cli(
    db: &PgPool,
    action: &str,
    order: Option<&str>,
    target: &str,
    result: &str,
) {
    let by = cli_actor();
    if let Err(e) = record(db, &by, action, order, target, result).await {
        eprintln!("warning: cannot write the audit row of {action} ({target}): {e}");
    }
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
