//! The SQL of `urutan dlq` on `urutan_dead_letter`: a message's unresolved
//! record, resolving one, and the record of an unreadable message.

use serde_json::json;
use sqlx::PgPool;

use crate::broker::Names;
use crate::store::NewDeadLetter;

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
}

/// The unresolved record of `key`.
pub(crate) async fn find_row(db: &PgPool, key: &str) -> Result<Option<Row>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, message_id, pesanan_id, versi, reason, x_death IS NOT NULL AS has_death
         FROM urutan_dead_letter WHERE delivery_key = $1 AND resolved_at IS NULL",
    )
    .bind(key)
    .fetch_optional(db)
    .await
}

/// Marks a record resolved (once: a resolved row stays as it was).
pub(crate) async fn resolve<'c>(
    db: impl sqlx::PgExecutor<'c>,
    id: i64,
    resolution: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE urutan_dead_letter SET resolved_at = now(), resolution = $2
         WHERE id = $1 AND resolved_at IS NULL",
    )
    .bind(id)
    .bind(resolution)
    .execute(db)
    .await?;
    Ok(())
}

/// The delivery key of the record that stands for a message at the head of
/// the DLQ that lapin cannot parse (it drops the connection on such a
/// delivery, e.g. a `message_id` that is not UTF-8): nothing of it can be
/// read, so it is one record per queue, reason `unreadable`. While it is
/// unresolved, `list` and `show` do not walk the queue by themselves.
pub(crate) const UNREADABLE: &str = "unreadable:";

pub(crate) fn unreadable_key(names: &Names) -> String {
    format!("{UNREADABLE}{}", names.dead_letter_queue())
}

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
