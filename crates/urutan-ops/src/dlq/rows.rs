//! The SQL of `urutan dlq` on `urutan_dead_letter`: a message's unresolved
//! record and the record of an unreadable message; the records `list`,
//! `show` and `replay --dry-run` read. Every write to the table is the
//! core's (`urutan::store`, beside the worker's own).

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{Value, json};
use sqlx::PgPool;

use urutan::broker::Names;
use urutan::dead_letter::Death;
use urutan::store::NewDeadLetter;

/// The record a taken message belongs to.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct Row {
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

/// The unresolved record of `key`.
pub(crate) async fn find_row(db: &PgPool, key: &str) -> Result<Option<Row>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, message_id, pesanan_id, versi, reason, x_death IS NOT NULL AS has_death,
                CASE WHEN recorded_by = 'worker' THEN routing_key END AS worker_routing_key
         FROM urutan_dead_letter WHERE delivery_key = $1 AND resolved_at IS NULL",
    )
    .bind(key)
    .fetch_optional(db)
    .await
}

/// The delivery key of the record that stands for a message at the head of
/// the DLQ that lapin cannot parse (it drops the connection on such a
/// delivery, e.g. a `message_id` that is not UTF-8): nothing of it can be
/// read, so it is one record per queue, reason `unreadable`. While it is
/// unresolved, `list` and `show` do not walk the queue by themselves.
pub(crate) const UNREADABLE: &str = "unreadable:";

/// The delivery key of the unreadable message's record for `names`' DLQ.
pub(crate) fn unreadable_key(names: &Names) -> String {
    format!("{UNREADABLE}{}", names.dead_letter_queue())
}

/// The record of an unreadable message in `names`' DLQ, to insert.
pub(crate) fn unreadable_record(names: &Names) -> NewDeadLetter {
    NewDeadLetter {
        delivery_key: unreadable_key(names),
        message_id: None,
        pesanan_id: None,
        versi: None,
        shard: -1,
        reason: "unreadable".to_owned(),
        detail: "a message in the DLQ that urutan's AMQP client cannot parse (e.g. a \
                 message_id that is not UTF-8); remove it with the management UI"
            .to_owned(),
        last_error: None,
        recorded_by: "queue",
        exchange: None,
        routing_key: None,
        properties: json!({}),
        headers: json!({}),
        body: Vec::new(),
        body_bytes: 0,
        x_death: None,
        dead_lettered_at: None,
    }
}

/// Whether an unreadable message is recorded in the DLQ.
pub(crate) async fn unreadable_known(db: &PgPool, names: &Names) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM urutan_dead_letter
                        WHERE delivery_key = $1 AND resolved_at IS NULL)",
    )
    .bind(unreadable_key(names))
    .fetch_one(db)
    .await
}

/// The number of unresolved records: the messages recorded as in the DLQ now.
pub(crate) async fn unresolved_count(db: &PgPool) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT count(*) FROM urutan_dead_letter WHERE resolved_at IS NULL")
        .fetch_one(db)
        .await
}

/// The distinct delivery keys (resolved or not) that start with `prefix`,
/// at most two: one means `prefix` names that key.
pub(crate) async fn keys_with_prefix(
    db: &PgPool,
    prefix: &str,
) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT DISTINCT delivery_key FROM urutan_dead_letter
         WHERE starts_with(delivery_key, $1) LIMIT 2",
    )
    .bind(prefix)
    .fetch_all(db)
    .await
}

/// The columns of a [`Listed`] record, in its order.
macro_rules! listed_columns {
    () => {
        "id, delivery_key, message_id, pesanan_id, versi, shard, reason, detail, last_error,
         dead_lettered_at, recorded_by"
    };
}

/// One record as `list` shows it; what `show` prints of it starts with it.
#[derive(Debug, Serialize, sqlx::FromRow)]
pub(crate) struct Listed {
    pub id: i64,
    pub delivery_key: String,
    pub message_id: Option<String>,
    pub pesanan_id: Option<String>,
    pub versi: Option<i64>,
    pub shard: i32,
    pub reason: String,
    pub detail: String,
    pub last_error: Option<String>,
    #[serde(serialize_with = "urutan::rfc3339::one")]
    pub dead_lettered_at: DateTime<Utc>,
    pub recorded_by: String,
}

/// The unresolved records, oldest first, at most `limit`: only those with
/// this `reason`, of this order (`pesanan_id`), dead-lettered at or after
/// `since`, for each filter given.
pub(crate) async fn list_unresolved(
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

/// A whole record, as `show` prints it: the [`Listed`] columns and the rest.
#[derive(Debug, Serialize, sqlx::FromRow)]
pub(crate) struct Shown {
    #[serde(flatten)]
    #[sqlx(flatten)]
    pub listed: Listed,
    #[serde(serialize_with = "urutan::rfc3339::option")]
    pub resolved_at: Option<DateTime<Utc>>,
    pub resolution: Option<String>,
    pub exchange: Option<String>,
    pub routing_key: Option<String>,
    pub properties: sqlx::types::Json<Value>,
    pub headers: sqlx::types::Json<Value>,
    #[serde(skip)]
    pub body: Vec<u8>,
    pub body_bytes: i32,
    pub x_death: Option<sqlx::types::Json<Vec<Death>>>,
}

impl std::ops::Deref for Shown {
    type Target = Listed;

    fn deref(&self) -> &Listed {
        &self.listed
    }
}

/// The newest record with message id `message_id` or delivery key `key`,
/// an unresolved one (still in the DLQ) first; `None` if there is none.
pub(crate) async fn newest(
    db: &PgPool,
    message_id: &str,
    key: &str,
) -> Result<Option<Shown>, sqlx::Error> {
    sqlx::query_as(concat!(
        "SELECT ",
        listed_columns!(),
        ", resolved_at, resolution, exchange, routing_key, properties, headers, body,
                body_bytes, x_death
         FROM urutan_dead_letter
         WHERE message_id = $1 OR delivery_key = $2
         ORDER BY resolved_at IS NULL DESC, id DESC
         LIMIT 1"
    ))
    .bind(message_id)
    .bind(key)
    .fetch_optional(db)
    .await
}

/// A record a replay would take, with what predicting its outcome needs.
#[derive(Debug, Serialize, sqlx::FromRow)]
pub(crate) struct Candidate {
    pub delivery_key: String,
    pub message_id: Option<String>,
    pub pesanan_id: Option<String>,
    pub versi: Option<i64>,
    pub reason: String,
    pub last_error: Option<String>,
    #[serde(skip)]
    pub properties: sqlx::types::Json<Value>,
    #[serde(skip)]
    pub headers: sqlx::types::Json<Value>,
    #[serde(skip)]
    pub body: Vec<u8>,
    #[serde(skip)]
    pub body_bytes: i32,
}

/// The unresolved records a replay would take, oldest first: every one
/// (`all`), those dead-lettered for `reason`, and those whose message id or
/// delivery key is in `ids`.
pub(crate) async fn candidates(
    db: &PgPool,
    all: bool,
    reason: Option<&str>,
    ids: &[String],
) -> Result<Vec<Candidate>, sqlx::Error> {
    sqlx::query_as(
        "SELECT delivery_key, message_id, pesanan_id, versi, reason, last_error, properties,
                headers, body, body_bytes
         FROM urutan_dead_letter
         WHERE resolved_at IS NULL
           AND ($1 OR reason = $2 OR message_id = ANY($3) OR delivery_key = ANY($3))
         ORDER BY dead_lettered_at, id",
    )
    .bind(all)
    .bind(reason)
    .bind(ids)
    .fetch_all(db)
    .await
}

/// How a record was resolved.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct Resolved {
    /// `replayed` or `purged`.
    pub resolution: String,
    pub resolved_at: DateTime<Utc>,
}

/// How the newest resolved record with message id or delivery key `id` was
/// resolved; `None` if no record of it is resolved.
pub(crate) async fn last_resolution(
    db: &PgPool,
    id: &str,
) -> Result<Option<Resolved>, sqlx::Error> {
    sqlx::query_as(
        "SELECT resolution, resolved_at FROM urutan_dead_letter
         WHERE (message_id = $1 OR delivery_key = $1) AND resolved_at IS NOT NULL
         ORDER BY id DESC LIMIT 1",
    )
    .bind(id)
    .fetch_optional(db)
    .await
}

/// Why a message was dead-lettered.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct Reason {
    pub reason: String,
    pub detail: String,
}

/// Why the message with delivery key `key` is in the DLQ again: the reason
/// of its unresolved record newer than record `after` (its record before a
/// replay); `None` if it has none.
pub(crate) async fn dead_lettered_again(
    db: &PgPool,
    key: &str,
    after: i64,
) -> Result<Option<Reason>, sqlx::Error> {
    sqlx::query_as(
        "SELECT reason, detail FROM urutan_dead_letter
         WHERE delivery_key = $1 AND resolved_at IS NULL AND id > $2",
    )
    .bind(key)
    .bind(after)
    .fetch_optional(db)
    .await
}

/// The database's clock now: where a purge starts (see
/// [`urutan::store::purge_dead_letters_before`]).
pub(crate) async fn now(db: &PgPool) -> Result<DateTime<Utc>, sqlx::Error> {
    sqlx::query_scalar("SELECT now()").fetch_one(db).await
}
