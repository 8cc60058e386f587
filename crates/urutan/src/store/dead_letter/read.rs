//! The reads of `urutan_dead_letter`, for the operator commands: a
//! message's unresolved record and what a walk over the DLQ needs of it
//! (`urutan dlq`), the records `dlq list`, `show` and `replay --dry-run`
//! show, an order's records (`urutan explain`) and the count by reason
//! (`urutan status`). They change nothing. The field names of the structs
//! that derive `Serialize` are those of the commands' JSON output.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::PgPool;
use sqlx::types::Json;

use super::Death;
use super::Subject;

/// A message's unresolved record, with what a walk over the DLQ needs.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Unresolved {
    pub id: i64,
    pub message_id: Option<String>,
    pub pesanan_id: Option<String>,
    pub versi: Option<i64>,
    pub reason: String,
    /// Its x-death is stored.
    pub has_death: bool,
    /// The routing key the worker saw (`recorded_by = 'worker'`); a record
    /// written from the queue has only what the message's `x-death` says,
    /// which its producer may have written: `None` then.
    pub worker_routing_key: Option<String>,
}

/// The unresolved record of delivery key `key` for order `order` (the
/// message's [`crate::dead_letter::order_id`]), if there is one.
pub async fn find_unresolved(
    db: &PgPool,
    key: &str,
    order: Option<&str>,
) -> Result<Option<Unresolved>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, message_id, pesanan_id, versi, reason, x_death IS NOT NULL AS has_death,
                CASE WHEN recorded_by = 'worker' THEN routing_key END AS worker_routing_key
         FROM urutan_dead_letter
         WHERE delivery_key = $1 AND coalesce(pesanan_id, '') = coalesce($2, '')
           AND resolved_at IS NULL",
    )
    .bind(key)
    .bind(order)
    .fetch_optional(db)
    .await
}

/// The orders (`None`: a record without one) of the unresolved records
/// whose message id or delivery key is `id`: one per order (two orders may
/// dead-letter messages with one id).
pub async fn unresolved_orders(db: &PgPool, id: &str) -> Result<Vec<Option<String>>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT DISTINCT pesanan_id FROM urutan_dead_letter
         WHERE (message_id = $1 OR delivery_key = $1) AND resolved_at IS NULL
         ORDER BY 1",
    )
    .bind(id)
    .fetch_all(db)
    .await
}

/// Whether delivery key `key` has an unresolved record (of any order).
pub async fn is_unresolved(db: &PgPool, key: &str) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM urutan_dead_letter
                        WHERE delivery_key = $1 AND resolved_at IS NULL)",
    )
    .bind(key)
    .fetch_one(db)
    .await
}

/// The number of unresolved records: the messages recorded as in the DLQ now.
pub async fn unresolved_count(db: &PgPool) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT count(*) FROM urutan_dead_letter WHERE resolved_at IS NULL")
        .fetch_one(db)
        .await
}

/// The distinct delivery keys (resolved or not) that start with `prefix`,
/// at most two: one means `prefix` names that key.
pub async fn keys_with_prefix(db: &PgPool, prefix: &str) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT DISTINCT delivery_key FROM urutan_dead_letter
         WHERE starts_with(delivery_key, $1) LIMIT 2",
    )
    .bind(prefix)
    .fetch_all(db)
    .await
}

/// How an unresolved record's version was settled while its message sat in
/// the DLQ, as SQL over `urutan_dead_letter` (unaliased): `released` (its
/// version was skipped by `urutan hold release`), `applied` (that version
/// is the stored one: replayed, or sent again, by other means),
/// `superseded` (a later version is stored: replaying it would be stale);
/// NULL while it still needs an operator (or has no order and version).
macro_rules! settled_sql {
    () => {
        "CASE WHEN urutan_dead_letter.resolved_at IS NOT NULL
                   OR urutan_dead_letter.pesanan_id IS NULL
                   OR urutan_dead_letter.versi IS NULL THEN NULL
              WHEN EXISTS (SELECT 1 FROM urutan_lewati l
                           WHERE l.pesanan_id = urutan_dead_letter.pesanan_id
                             AND l.versi = urutan_dead_letter.versi) THEN 'released'
              ELSE (SELECT CASE WHEN p.versi = urutan_dead_letter.versi THEN 'applied'
                                ELSE 'superseded' END
                    FROM pesanan p
                    WHERE p.id = urutan_dead_letter.pesanan_id
                      AND p.versi >= urutan_dead_letter.versi) END"
    };
}

/// The columns of a [`Listed`] record, in its order.
macro_rules! listed_columns {
    () => {
        concat!(
            "id, delivery_key, message_id, pesanan_id, versi, shard, reason, detail, last_error,
             dead_lettered_at, recorded_by, ",
            settled_sql!(),
            " AS settled"
        )
    };
}

/// One record as `dlq list` shows it; the other reads of whole records
/// start with it.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Listed {
    pub id: i64,
    #[serde(flatten)]
    #[sqlx(flatten)]
    pub subject: Subject,
    #[serde(serialize_with = "crate::rfc3339::one")]
    pub dead_lettered_at: DateTime<Utc>,
    /// `worker` or `queue`.
    pub recorded_by: String,
    /// Unresolved, but nothing left to do: `released`, `applied` or
    /// `superseded` (see [`settled_count`]); `None` while it needs an
    /// operator.
    pub settled: Option<String>,
}

impl std::ops::Deref for Listed {
    type Target = Subject;

    fn deref(&self) -> &Subject {
        &self.subject
    }
}

/// The unresolved records, oldest first, at most `limit`: only those with
/// this `reason`, of this order (`pesanan_id`), dead-lettered at or after
/// `since`, for each filter given.
pub async fn list_unresolved(
    db: &PgPool,
    reason: Option<&str>,
    order: Option<&str>,
    since: Option<DateTime<Utc>>,
    limit: u32,
) -> Result<Vec<Listed>, sqlx::Error> {
    sqlx::query_as(concat!(
        "SELECT ",
        listed_columns!(),
        " FROM urutan_dead_letter
         WHERE resolved_at IS NULL
           AND ($1::text IS NULL OR reason = $1)
           AND ($2::text IS NULL OR pesanan_id = $2)
           AND ($3::timestamptz IS NULL OR dead_lettered_at >= $3)
         ORDER BY dead_lettered_at, id
         LIMIT $4"
    ))
    .bind(reason)
    .bind(order)
    .bind(since)
    .bind(i64::from(limit))
    .fetch_all(db)
    .await
}

/// A record with how it was resolved, if it was (`urutan explain`).
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Record {
    #[serde(flatten)]
    #[sqlx(flatten)]
    pub listed: Listed,
    #[serde(serialize_with = "crate::rfc3339::option")]
    pub resolved_at: Option<DateTime<Utc>>,
    /// `replayed` or `purged`.
    pub resolution: Option<String>,
}

impl Record {
    /// When and how (`replayed`, `purged`) it was resolved; `None` while
    /// its message is in the DLQ.
    pub fn resolved(&self) -> Option<(DateTime<Utc>, &str)> {
        let how = self.resolution.as_deref().unwrap_or_default();
        self.resolved_at.map(|at| (at, how))
    }
}

impl std::ops::Deref for Record {
    type Target = Listed;

    fn deref(&self) -> &Listed {
        &self.listed
    }
}

/// Every record of order `order_id`, resolved or not, in the order they
/// were written.
pub async fn of_order(db: &PgPool, order_id: &str) -> Result<Vec<Record>, sqlx::Error> {
    sqlx::query_as(concat!(
        "SELECT ",
        listed_columns!(),
        ", resolved_at, resolution
         FROM urutan_dead_letter WHERE pesanan_id = $1 ORDER BY id"
    ))
    .bind(order_id)
    .fetch_all(db)
    .await
}

/// A whole record, as `dlq show` prints it: the [`Record`] columns and the
/// message as it was kept.
#[derive(Debug, Serialize, sqlx::FromRow)]
pub struct Shown {
    #[serde(flatten)]
    #[sqlx(flatten)]
    pub record: Record,
    pub exchange: Option<String>,
    pub routing_key: Option<String>,
    pub properties: Json<Value>,
    pub headers: Json<Value>,
    /// At most [`crate::dead_letter::BODY_KEPT`] bytes (not serialized:
    /// the command shows it its own way).
    #[serde(skip)]
    pub body: Vec<u8>,
    /// The full body size.
    pub body_bytes: i32,
    pub x_death: Option<Json<Vec<Death>>>,
}

impl std::ops::Deref for Shown {
    type Target = Record;

    fn deref(&self) -> &Record {
        &self.record
    }
}

/// The newest record with message id `message_id` or delivery key `key`
/// (of order `order`, if given), an unresolved one (still in the DLQ)
/// first; `None` if there is none.
pub async fn newest(
    db: &PgPool,
    message_id: &str,
    key: &str,
    order: Option<&str>,
) -> Result<Option<Shown>, sqlx::Error> {
    sqlx::query_as(concat!(
        "SELECT ",
        listed_columns!(),
        ", resolved_at, resolution, exchange, routing_key, properties, headers, body,
                body_bytes, x_death
         FROM urutan_dead_letter
         WHERE (message_id = $1 OR delivery_key = $2) AND ($3::text IS NULL OR pesanan_id = $3)
         ORDER BY resolved_at IS NULL DESC, id DESC
         LIMIT 1"
    ))
    .bind(message_id)
    .bind(key)
    .bind(order)
    .fetch_optional(db)
    .await
}

/// Record `id` whole (the console's page of one dead letter); `None` if
/// there is none.
pub async fn shown_by_id(db: &PgPool, id: i64) -> Result<Option<Shown>, sqlx::Error> {
    sqlx::query_as(concat!(
        "SELECT ",
        listed_columns!(),
        ", resolved_at, resolution, exchange, routing_key, properties, headers, body,
                body_bytes, x_death
         FROM urutan_dead_letter WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(db)
    .await
}

/// A record a replay would take, with what predicting its outcome needs
/// (serialized: what `dlq replay --dry-run --json` says of it).
#[derive(Debug, Serialize, sqlx::FromRow)]
pub struct Candidate {
    pub delivery_key: String,
    pub message_id: Option<String>,
    pub pesanan_id: Option<String>,
    pub versi: Option<i64>,
    pub reason: String,
    pub last_error: Option<String>,
    #[serde(skip)]
    pub properties: Json<Value>,
    #[serde(skip)]
    pub headers: Json<Value>,
    #[serde(skip)]
    pub body: Vec<u8>,
    #[serde(skip)]
    pub body_bytes: i32,
}

/// The unresolved records a replay would take, oldest first: every one
/// (`all`), those dead-lettered for `reason`, and those `wanted` names: a
/// message id or delivery key, and the order (`None`: any order's).
pub async fn candidates(
    db: &PgPool,
    all: bool,
    reason: Option<&str>,
    wanted: &[(String, Option<String>)],
) -> Result<Vec<Candidate>, sqlx::Error> {
    let (ids, orders): (Vec<&str>, Vec<Option<&str>>) = wanted
        .iter()
        .map(|(id, order)| (id.as_str(), order.as_deref()))
        .unzip();
    sqlx::query_as(
        "SELECT delivery_key, message_id, pesanan_id, versi, reason, last_error, properties,
                headers, body, body_bytes
         FROM urutan_dead_letter d
         WHERE resolved_at IS NULL
           AND ($1 OR reason = $2
                OR EXISTS (SELECT 1 FROM unnest($3::text[], $4::text[]) w(id, pesanan_id)
                           WHERE w.id IN (d.message_id, d.delivery_key)
                             AND (w.pesanan_id IS NULL OR w.pesanan_id = d.pesanan_id)))
         ORDER BY dead_lettered_at, id",
    )
    .bind(all)
    .bind(reason)
    .bind(ids)
    .bind(orders)
    .fetch_all(db)
    .await
}

/// How a record was resolved.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Resolved {
    /// `replayed` or `purged`.
    pub resolution: String,
    pub resolved_at: DateTime<Utc>,
}

/// How the newest resolved record with message id or delivery key `id`
/// (of order `order`, if given) was resolved; `None` if no record of it is
/// resolved.
pub async fn last_resolution(
    db: &PgPool,
    id: &str,
    order: Option<&str>,
) -> Result<Option<Resolved>, sqlx::Error> {
    sqlx::query_as(
        "SELECT resolution, resolved_at FROM urutan_dead_letter
         WHERE (message_id = $1 OR delivery_key = $1) AND resolved_at IS NOT NULL
           AND ($2::text IS NULL OR pesanan_id = $2)
         ORDER BY id DESC LIMIT 1",
    )
    .bind(id)
    .bind(order)
    .fetch_optional(db)
    .await
}

/// Why a message was dead-lettered.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Reason {
    pub reason: String,
    pub detail: String,
}

/// Why the message with delivery key `key` of order `order` is in the DLQ
/// again: the reason of its unresolved record newer than record `after`
/// (its record before a replay); `None` if it has none.
pub async fn dead_lettered_again(
    db: &PgPool,
    key: &str,
    order: Option<&str>,
    after: i64,
) -> Result<Option<Reason>, sqlx::Error> {
    sqlx::query_as(
        "SELECT reason, detail FROM urutan_dead_letter
         WHERE delivery_key = $1 AND coalesce(pesanan_id, '') = coalesce($3, '')
           AND resolved_at IS NULL AND id > $2",
    )
    .bind(key)
    .bind(after)
    .bind(order)
    .fetch_optional(db)
    .await
}

/// The unresolved records of one reason (`urutan status`).
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct ReasonCount {
    pub reason: String,
    pub count: i64,
    /// When the newest of them was dead-lettered.
    #[serde(serialize_with = "crate::rfc3339::one")]
    pub last_at: DateTime<Utc>,
}

/// Unresolved records whose version needs nothing more (their message
/// may still sit in the DLQ): the version was skipped by `urutan hold
/// release`, or it (or a later one) is the stored state. `urutan status`
/// does not count their messages as needing attention; `urutan dlq purge
/// --settled` removes them.
pub async fn settled_count(db: &PgPool) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(concat!(
        "SELECT count(*) FROM urutan_dead_letter WHERE resolved_at IS NULL AND (",
        settled_sql!(),
        ") IS NOT NULL"
    ))
    .fetch_one(db)
    .await
}

/// The keys of the settled unresolved records (see [`settled_count`]),
/// at most `limit`.
pub async fn settled_keys(db: &PgPool, limit: i64) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar(concat!(
        "SELECT delivery_key FROM urutan_dead_letter WHERE resolved_at IS NULL AND (",
        settled_sql!(),
        ") IS NOT NULL ORDER BY id LIMIT $1"
    ))
    .bind(limit)
    .fetch_all(db)
    .await
}

/// The unresolved records counted by reason, most first (then by reason).
pub async fn unresolved_by_reason(db: &PgPool) -> Result<Vec<ReasonCount>, sqlx::Error> {
    sqlx::query_as(
        "SELECT reason, count(*) AS count, max(dead_lettered_at) AS last_at
         FROM urutan_dead_letter
         WHERE resolved_at IS NULL GROUP BY reason ORDER BY count(*) DESC, reason",
    )
    .fetch_all(db)
    .await
}
