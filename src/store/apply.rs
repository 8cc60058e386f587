//! The apply transaction: one call of `urutan_terapkan` (see
//! `migrations/`): dedup claim, then the versioned upsert and history row, or
//! parking while older messages of the entity may wait on another shard
//! (see [`crate::handoff`]). One statement: one transaction, one round trip.

use sqlx::PgPool;

use super::StoreError;
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

/// Applies `event`, received on `shard`, exactly once in effect. The caller
/// acks after it returns.
pub async fn apply(pool: &PgPool, event: &Event, shard: u16) -> Result<Applied, StoreError> {
    let result: String =
        sqlx::query_scalar("SELECT urutan_terapkan($1, $2, $3, $4, $5::jsonb, $6)")
            .bind(&event.message_id)
            .bind(&event.entity_id)
            .bind(&event.status)
            .bind(event.versi)
            .bind(event.data.as_deref().map(|raw| raw.get()))
            .bind(i32::from(shard))
            .fetch_one(pool)
            .await?;
    Ok(parse_result(&result))
}

/// Maps the SQL function's answer; anything unknown would be a migration bug.
pub fn parse_result(result: &str) -> Applied {
    match result {
        "applied" => Applied::Done(Outcome::Applied),
        "stale" => Applied::Done(Outcome::Stale),
        "duplicate" => Applied::Done(Outcome::Duplicate),
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

/// What the batch transaction did with one item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchResult {
    Marker,
    Event(Applied),
}

/// Applies `items` (one shard's deliveries, in arrival order) in ONE
/// transaction with exactly the outcomes they would have one by one.
pub async fn apply_batch(
    pool: &PgPool,
    items: &[BatchItem<'_>],
    shard: u16,
) -> Result<Vec<BatchResult>, StoreError> {
    let n = items.len();
    let (mut message_ids, mut ids, mut statuses) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let (mut versis, mut datas, mut markers) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    for item in items {
        match item {
            BatchItem::Marker(epoch) => {
                message_ids.push(None);
                ids.push(None);
                statuses.push(None);
                versis.push(None);
                datas.push(None);
                markers.push(Some(*epoch));
            }
            BatchItem::Event(e) => {
                message_ids.push(Some(e.message_id.as_str()));
                ids.push(Some(e.entity_id.as_str()));
                statuses.push(Some(e.status.as_str()));
                versis.push(Some(e.versi));
                datas.push(e.data.as_deref().map(|raw| raw.get()));
                markers.push(None);
            }
        }
    }
    let results: Vec<String> =
        sqlx::query_scalar("SELECT urutan_terapkan_batch($1, $2, $3, $4, $5, $6, $7)")
            .bind(&message_ids)
            .bind(&ids)
            .bind(&statuses)
            .bind(&versis)
            .bind(&datas)
            .bind(&markers)
            .bind(i32::from(shard))
            .fetch_one(pool)
            .await?;
    Ok(results
        .iter()
        .map(|r| match r.as_str() {
            "marker" => BatchResult::Marker,
            other => BatchResult::Event(parse_result(other)),
        })
        .collect())
}
