//! The apply transaction: one call of `urutan_terapkan` (see
//! `sql/schema.sql`): dedup claim (per (order, message id): the same id on
//! another order is another message), then the versioned upsert and history row, or
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
use crate::handler::DynHandler;
use crate::message::Event;
use crate::outcome::Outcome;

/// What the apply transaction did with a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// Finished: applied, stale or duplicate.
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
    let result: String = sqlx::query_scalar(
        "SELECT urutan_terapkan($1, $2)
         FROM (SELECT set_config('urutan.apply_traces', $3, true)) traces",
    )
    .bind(Json(event))
    .bind(i32::from(shard))
    .bind(apply_traceparents([event]))
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
         VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
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
        "parked" => Applied::Parked,
        "gap_limit" => Applied::Done(Outcome::DeadLettered(crate::message::Rejection::GapLimit)),
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
    let results: Vec<String> = sqlx::query_scalar(
        "SELECT urutan_terapkan_batch($1, $2)
         FROM (SELECT set_config('urutan.apply_traces', $3, true)) traces",
    )
    .bind(Json(items))
    .bind(i32::from(shard))
    .bind(apply_traceparents(events_of(items)))
    .fetch_one(executor)
    .await?;
    Ok(results.iter().map(|r| item_result(r)).collect())
}

/// One answer of `urutan_terapkan_batch`.
/// The events among `items`.
fn events_of<'a>(items: &'a [BatchItem<'a>]) -> impl Iterator<Item = &'a Event> {
    items.iter().filter_map(|item| match item {
        BatchItem::Event(event) => Some(*event),
        BatchItem::Marker(_) => None,
    })
}

/// The transaction-local setting `urutan.apply_traces` for `events`: a
/// line `\n<order id>\t<message id>\t<traceparent>` per event that has a
/// trace context, which the parking and effect triggers look a message up
/// in by its (order, message id), the dedup key (migration 0044,
/// `urutan_traceparent_applied(text, text)`): two orders' messages with one
/// id each keep their own. An id holding a line break or a tab (the
/// contract refuses control characters) would be ambiguous: left out.
pub(crate) fn apply_traceparents<'a>(events: impl IntoIterator<Item = &'a Event>) -> String {
    use std::fmt::Write;
    let mut lines = String::new();
    for event in events {
        let Some(traceparent) = event.traceparent else {
            continue;
        };
        if event.message_id.contains(['\n', '\t']) || event.entity_id.contains(['\n', '\t']) {
            continue;
        }
        let _ = write!(
            lines,
            "\n{}\t{}\t{traceparent}",
            event.entity_id, event.message_id
        );
    }
    lines
}

fn item_result(result: &str) -> BatchResult {
    match result {
        "marker" => BatchResult::Marker,
        // A marker for an epoch never recorded: forged, dead-lettered.
        "marker_forged" => BatchResult::Event(Applied::Done(Outcome::DeadLettered(
            crate::message::Rejection::ReservedHeader,
        ))),
        other => BatchResult::Event(parse_result(other)),
    }
}

/// [`apply_batch`] with a Rust handler ([`crate::handler`]): in ONE
/// transaction, item by item, each applied version's handler call right
/// after urutan's own rows for it (so it sees the state that version
/// wrote). A handler's failure rolls the whole transaction back and is
/// returned (a batch then goes one message at a time, so that only the
/// failing message is set aside or refused). `conn` must not be inside a
/// transaction.
pub async fn apply_with_handler(
    conn: &mut PgConnection,
    items: &[BatchItem<'_>],
    shard: u16,
    handler: &dyn DynHandler,
) -> Result<Vec<BatchResult>, StoreError> {
    let mut tx = conn.begin().await?;
    // urutan_tulis leaves each applied version's event for the handler.
    sqlx::query(
        "SELECT set_config('urutan.acara', 'on', true),
                set_config('urutan.apply_traces', $1, true)",
    )
    .bind(apply_traceparents(events_of(items)))
    .execute(&mut *tx)
    .await?;
    let mut results = Vec::with_capacity(items.len());
    for item in items {
        let (result, event): (String, Option<String>) = sqlx::query_as(
            "SELECT r, current_setting('urutan.acara_terakhir', true)
             FROM unnest(urutan_terapkan_batch($1, $2)) r",
        )
        .bind(Json(std::slice::from_ref(item)))
        .bind(i32::from(shard))
        .fetch_one(&mut *tx)
        .await?;
        let result = item_result(&result);
        if result == BatchResult::Event(Applied::Done(Outcome::Applied)) {
            crate::handler::call(handler, &mut tx, event.as_deref()).await?;
        }
        results.push(result);
    }
    tx.commit().await?;
    Ok(results)
}

/// The lock that puts a pipeline's apply transactions one at a time while
/// they lose to each other (`shard::contention`): transaction-level, in a
/// key space of its own (the two-key form), one per schema.
const ONE_AT_A_TIME: &str =
    "SELECT pg_advisory_xact_lock(hashtext('urutan-contention'), hashtext(current_schema()))";

/// Runs `work` on `conn` (not inside a transaction) in a transaction that
/// takes the lock of [`ONE_AT_A_TIME`] first, so that it holds nothing
/// while it waits for it. `work`'s own transactions become savepoints.
pub(crate) async fn one_at_a_time<T>(
    conn: &mut PgConnection,
    work: impl AsyncFnOnce(&mut PgConnection) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let mut tx = conn.begin().await?;
    take_one_at_a_time(&mut tx).await?;
    let done = work(&mut tx).await?;
    tx.commit().await?;
    Ok(done)
}

/// Takes the lock of [`ONE_AT_A_TIME`] in `tx`, an open transaction that
/// holds no other lock yet.
pub(crate) async fn take_one_at_a_time(tx: &mut PgConnection) -> Result<(), sqlx::Error> {
    sqlx::query(ONE_AT_A_TIME).execute(tx).await.map(drop)
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
    fn apply_traceparents_lists_each_traced_event() {
        let parent = crate::trace::TraceParent::parse(
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        );
        let event = |order: &str, id: &str, traceparent| Event {
            entity_id: order.into(),
            message_id: id.into(),
            traceparent,
            ..Default::default()
        };
        let events = [
            event("A", "m-1", parent),
            event("A", "m-2", None),
            event("A", "m\t3", parent),
            event("B", "m-1", parent),
            event("B\n", "m-5", parent),
        ];
        assert_eq!(
            apply_traceparents(&events),
            concat!(
                "\nA\tm-1\t00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                "\nB\tm-1\t00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
            )
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
