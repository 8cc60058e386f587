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
