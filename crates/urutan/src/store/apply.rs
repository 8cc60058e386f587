//! The apply transaction: one call of `urutan_terapkan` (see
//! `sql/schema.sql`): dedup claim (per order: an id recorded for another order
//! is `message_id_reused`), then the versioned upsert and history row, or
//! parking while older messages of the entity may wait on another shard
//! (see [`crate::reshard::handoff`]). One statement: one transaction, one round trip.
//!
//! The event goes as ONE jsonb value, [`Event`]'s serialization
//! (`{"message_id", "id", "status", "versi", "data"}`), and a batch as one
//! jsonb array of them (a marker: `{"marker": epoch}`), so a new optional
//! field of the message changes no SQL signature.

use serde::ser::{Serialize, SerializeMap, Serializer};
use sqlx::types::Json;
use sqlx::{Connection, PgConnection, PgPool};

use super::StoreError;
use crate::message::{Event, Rejection};
use crate::outcome::Outcome;

/// What the apply transaction did with a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// Finished: applied, stale, duplicate, or dead-lettered because its
    /// message id was recorded for another order (`message_id_reused`).
    Done(Outcome),
    /// Recorded and parked until its entity's older messages are done; its
    /// outcome comes when it is released.
    Parked,
}

/// Applies `event`, received on `shard`, exactly once in effect, in one
/// statement that is its own transaction (`executor`: a pool, or a
/// connection outside any transaction). The caller acks after it returns.
pub async fn apply<'c, E>(executor: E, event: &Event, shard: u16) -> Result<Applied, StoreError>
where
    E: sqlx::PgExecutor<'c>,
{
    let result: String = sqlx::query_scalar("SELECT urutan_terapkan($1, $2)")
        .bind(Json(event))
        .bind(i32::from(shard))
        .fetch_one(executor)
        .await?;
    Ok(parse_result(&result))
}

/// Records that `event` (received on `shard`) is being handed back to its
/// queue after a failure, so that a newer version of its order waits for it
/// even if the broker redelivers it behind later messages (see
/// `migrations/20261130000010_returned.sql`). Its next apply, or its
/// dead-letter record, ends the wait.
pub async fn record_returned<'c, E>(
    executor: E,
    event: &Event,
    shard: u16,
) -> Result<(), StoreError>
where
    E: sqlx::PgExecutor<'c>,
{
    sqlx::query(
        "INSERT INTO urutan_dikembalikan (message_id, pesanan_id, versi, shard)
         VALUES ($1, $2, $3, $4) ON CONFLICT (message_id) DO NOTHING",
    )
    .bind(&event.message_id)
    .bind(&event.entity_id)
    .bind(event.versi)
    .bind(i32::from(shard))
    .execute(executor)
    .await?;
    Ok(())
}

/// Maps the SQL function's answer; anything unknown would be a migration bug.
pub fn parse_result(result: &str) -> Applied {
    match result {
        "applied" => Applied::Done(Outcome::Applied),
        "stale" => Applied::Done(Outcome::Stale),
        "duplicate" => Applied::Done(Outcome::Duplicate),
        "message_id_reused" => Applied::Done(Outcome::DeadLettered(Rejection::MessageIdReused)),
        "parked" => Applied::Parked,
        other => unreachable!("urutan_terapkan returned {other:?}"),
    }
}

/// One item of an ordered batch.
#[derive(Debug, Clone, Copy)]
pub enum BatchItem<'a> {
    /// An epoch marker: the shard passed this epoch.
    Marker(i64),
    /// A valid event to apply.
    Event(&'a Event),
}

/// An item as `urutan_terapkan_batch` reads it: the event's jsonb, or
/// `{"marker": epoch}`.
impl Serialize for BatchItem<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            BatchItem::Marker(epoch) => {
                let mut map = serializer.serialize_map(Some(1))?;
                map.serialize_entry("marker", epoch)?;
                map.end()
            }
            BatchItem::Event(event) => event.serialize(serializer),
        }
    }
}

/// What the batch transaction did with one item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchResult {
    Marker,
    Event(Applied),
}

/// The most event bytes one batch statement carries (512 KiB): with Nagle's
/// algorithm off (sqlx 0.9.1 sets `TCP_NODELAY`) a batch of that size is one
/// round trip; a larger one is cut into several statements.
const MAX_STATEMENT_BYTES: usize = 512 * 1024;

/// Applies `items` (one shard's deliveries, in arrival order) in ONE
/// transaction with exactly the outcomes they would have one by one.
/// `conn` must not be inside a transaction (a pooled connection: `&mut *pool.acquire().await?`).
pub async fn apply_batch(
    conn: &mut PgConnection,
    items: &[BatchItem<'_>],
    shard: u16,
) -> Result<Vec<BatchResult>, StoreError> {
    // Larger batches go as several statements in one transaction, so one
    // statement's parameters stay bounded.
    let chunks = chunk_by_size(items, MAX_STATEMENT_BYTES);
    if chunks.len() == 1 {
        return apply_chunk(&mut *conn, items, shard).await;
    }
    let mut tx = conn.begin().await?;
    let mut results = Vec::with_capacity(items.len());
    for chunk in chunks {
        results.extend(apply_chunk(&mut *tx, chunk, shard).await?);
    }
    tx.commit().await?;
    Ok(results)
}

/// Consecutive runs of `items` whose parameters stay under `limit` bytes
/// (a single larger item gets a run of its own).
fn chunk_by_size<'i, 'e>(items: &'i [BatchItem<'e>], limit: usize) -> Vec<&'i [BatchItem<'e>]> {
    let size = |item: &BatchItem<'_>| match item {
        BatchItem::Marker(_) => 32,
        BatchItem::Event(e) => {
            64 + e.message_id.len()
                + e.entity_id.len()
                + e.status.len()
                + e.data.as_deref().map_or(0, |d| d.get().len())
        }
    };
    let mut chunks = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, item) in items.iter().enumerate() {
        let n = size(item);
        if i > start && bytes + n > limit {
            chunks.push(&items[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += n;
    }
    if start < items.len() || items.is_empty() {
        chunks.push(&items[start..]);
    }
    chunks
}

/// One `urutan_terapkan_batch` statement.
async fn apply_chunk<'c, E>(
    executor: E,
    items: &[BatchItem<'_>],
    shard: u16,
) -> Result<Vec<BatchResult>, StoreError>
where
    E: sqlx::PgExecutor<'c>,
{
    let results: Vec<String> = sqlx::query_scalar("SELECT urutan_terapkan_batch($1, $2)")
        .bind(Json(items))
        .bind(i32::from(shard))
        .fetch_one(executor)
        .await?;
    Ok(results
        .iter()
        .map(|r| match r.as_str() {
            "marker" => BatchResult::Marker,
            // A marker for an epoch never recorded: forged, dead-lettered.
            "marker_forged" => BatchResult::Event(Applied::Done(Outcome::DeadLettered(
                crate::message::Rejection::ReservedHeader,
            ))),
            other => BatchResult::Event(parse_result(other)),
        })
        .collect())
}

/// How many applied versions had `status` (history rows; a full scan, for
/// demos and checks).
pub async fn applied_with_status(db: &PgPool, status: &str) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT count(*) FROM pesanan_riwayat WHERE status = $1")
        .bind(status)
        .fetch_one(db)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_are_sent_as_the_jsonb_the_functions_read() {
        let event = |data: Option<&str>| Event {
            message_id: "m-1".into(),
            entity_id: "P-1".into(),
            status: "dibayar".into(),
            versi: 3,
            data: data.map(|d| serde_json::value::RawValue::from_string(d.into()).expect("raw")),
            ..Default::default()
        };
        let (with, without) = (event(Some(r#"{"total": 5}"#)), event(None));
        let items = [
            BatchItem::Event(&with),
            BatchItem::Marker(7),
            BatchItem::Event(&without),
        ];
        assert_eq!(
            serde_json::to_string(&items).expect("json"),
            concat!(
                r#"[{"message_id":"m-1","id":"P-1","status":"dibayar","versi":3,"data":{"total": 5}},"#,
                r#"{"marker":7},"#,
                r#"{"message_id":"m-1","id":"P-1","status":"dibayar","versi":3}]"#
            ),
            "data as sent, absent when None; no publish time"
        );
    }

    #[test]
    fn batches_are_cut_by_size_in_order() {
        let markers: Vec<BatchItem<'_>> = (0..10).map(BatchItem::Marker).collect();
        let chunks = chunk_by_size(&markers, 100);
        assert_eq!(
            chunks.iter().map(|c| c.len()).collect::<Vec<_>>(),
            [3, 3, 3, 1]
        );
        assert_eq!(chunk_by_size(&markers, 10_000).len(), 1);
        assert_eq!(
            chunk_by_size(&markers, 1).len(),
            10,
            "an oversized item alone"
        );
        assert_eq!(chunk_by_size(&[], 100).len(), 1);
    }
}
