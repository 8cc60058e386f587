//! The apply transaction: dedup claim, versioned upsert and history row, as
//! one statement (hence one transaction and one round trip).

use sqlx::PgPool;

use super::StoreError;
use crate::message::Event;
use crate::outcome::Outcome;

/// Data-modifying CTEs run in one snapshot and commit together:
/// 1. `claim` records the message id; no row back means it was seen before.
/// 2. `upsert` runs only for a claimed id and moves the state forward only
///    (`WHERE pesanan.versi < EXCLUDED.versi`); no row back means stale.
/// 3. `riwayat` writes the history row for an applied version.
const APPLY_SQL: &str = r#"
WITH claim AS (
    INSERT INTO pesan_diproses (message_id) VALUES ($1)
    ON CONFLICT (message_id) DO NOTHING
    RETURNING message_id
), upsert AS (
    INSERT INTO pesanan AS p (id, status, versi, data)
    SELECT $2, $3, $4, $5::jsonb FROM claim
    ON CONFLICT (id) DO UPDATE
        SET status = EXCLUDED.status, versi = EXCLUDED.versi,
            data = EXCLUDED.data, diperbarui_pada = now()
        WHERE p.versi < EXCLUDED.versi
    RETURNING p.id, p.versi, p.status
), riwayat AS (
    INSERT INTO pesanan_riwayat (pesanan_id, versi, status, message_id, shard)
    SELECT id, versi, status, $1, $6 FROM upsert
    RETURNING seq
)
SELECT EXISTS (SELECT 1 FROM claim) AS claimed,
       EXISTS (SELECT 1 FROM riwayat) AS applied
"#;

/// Applies `event`, received on `shard`, exactly once in effect.
/// Returns `Applied`, `Stale` or `Duplicate`; the caller acks after it returns.
pub async fn apply(pool: &PgPool, event: &Event, shard: u16) -> Result<Outcome, StoreError> {
    let (claimed, applied): (bool, bool) = sqlx::query_as(APPLY_SQL)
        .bind(&event.message_id)
        .bind(&event.entity_id)
        .bind(&event.status)
        .bind(event.versi)
        .bind(event.data.as_deref().map(|raw| raw.get()))
        .bind(i32::from(shard))
        .fetch_one(pool)
        .await?;
    Ok(match (claimed, applied) {
        (false, _) => Outcome::Duplicate,
        (true, true) => Outcome::Applied,
        (true, false) => Outcome::Stale,
    })
}
