//! Reading what `urutan explain` shows from PostgreSQL: the order's state,
//! history, parked and returned messages, dead-letter records, outbox rows,
//! and the shards' positions (one statement per part, each bounded by the
//! statement timeout).

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::{Applied, Explanation, OutboxRow, Parked, Returned, State};
use crate::Tables;
use urutan::store::dead_letter;

pub(super) enum ReadError {
    NotMigrated,
    Sql(sqlx::Error),
}

impl From<sqlx::Error> for ReadError {
    fn from(e: sqlx::Error) -> Self {
        Self::Sql(e)
    }
}

pub(super) async fn read(db: &PgPool, id: &str) -> Result<Explanation, ReadError> {
    let tables = Tables::look(db).await?;
    if !tables.core {
        return Err(ReadError::NotMigrated);
    }
    let mut found = Explanation::new(id);
    found.state = sqlx::query_as::<_, (String, i64, i64, DateTime<Utc>, Option<String>)>(
        "SELECT status, versi, epoch, diperbarui_pada, data::text FROM pesanan WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(db)
    .await?
    .map(|(status, versi, epoch, updated_at, data)| State {
        status,
        versi,
        epoch,
        updated_at,
        data,
    });
    found.applied = sqlx::query_as::<_, (i64, String, String, i32, DateTime<Utc>, Option<i64>)>(
        "SELECT r.versi, r.status, r.message_id, r.shard, r.diterapkan_pada,
                (SELECT max(e.epoch) FROM urutan_epoch e WHERE e.dibuka_pada <= r.diterapkan_pada)
         FROM pesanan_riwayat r WHERE r.pesanan_id = $1 ORDER BY r.seq",
    )
    .bind(id)
    .fetch_all(db)
    .await?
    .into_iter()
    .map(
        |(versi, status, message_id, shard, at, epoch_at_most)| Applied {
            versi,
            status,
            message_id,
            shard,
            at,
            epoch_at_most,
        },
    )
    .collect();
    found.parked = sqlx::query_as::<_, (i64, String, i32, i64, DateTime<Utc>)>(
        "SELECT versi, message_id, shard, epoch, diparkir_pada FROM urutan_parkir
         WHERE pesanan_id = $1 ORDER BY versi, seq",
    )
    .bind(id)
    .fetch_all(db)
    .await?
    .into_iter()
    .map(|(versi, message_id, shard, epoch, since)| Parked {
        versi,
        message_id,
        shard,
        epoch,
        since,
    })
    .collect();
    if tables.returned {
        found.returned = sqlx::query_as::<_, (i64, String, i32, DateTime<Utc>)>(
            "SELECT versi, message_id, shard, dikembalikan_pada FROM urutan_dikembalikan
             WHERE pesanan_id = $1 ORDER BY versi",
        )
        .bind(id)
        .fetch_all(db)
        .await?
        .into_iter()
        .map(|(versi, message_id, shard, since)| Returned {
            versi,
            message_id,
            shard,
            since,
        })
        .collect();
    }
    if tables.dead_letters {
        found.dead_letters = Some(dead_letter::of_order(db, id).await?);
    }
    found.outbox = outbox(db, id).await;
    found.passed_by_all = sqlx::query_scalar("SELECT urutan_epoch_selesai()")
        .fetch_one(db)
        .await?;
    let positions: Vec<(i32, i64)> =
        sqlx::query_as("SELECT shard, epoch FROM urutan_shard WHERE aktif ORDER BY shard")
            .fetch_all(db)
            .await?;
    found.positions = positions
        .into_iter()
        .filter_map(|(s, e)| Some((u16::try_from(s).ok()?, e)))
        .collect();
    found.windows = sqlx::query_as(
        "SELECT sebab, epoch FROM urutan_jendela
         WHERE ditutup_pada IS NULL AND (epoch IS NULL OR epoch > coalesce(urutan_epoch_selesai(), 0))
         ORDER BY jendela",
    )
    .fetch_all(db)
    .await?;
    Ok(found)
}

/// The order's outbox rows. The outbox has no index on the order id: on a
/// large outbox this scan is what [`crate::STATEMENT_TIMEOUT`] bounds, and
/// a timeout is reported rather than fatal.
async fn outbox(db: &PgPool, id: &str) -> Result<Vec<OutboxRow>, String> {
    type Row = (
        i64,
        Option<String>,
        DateTime<Utc>,
        Option<DateTime<Utc>>,
        bool,
    );
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT o.id, o.payload->>'versi', o.dibuat_pada, o.dikirim_pada,
                    EXISTS (SELECT 1 FROM pesan_diproses d WHERE d.message_id = o.id::text
                                    AND d.pesanan_id IN (o.agregat_id, ''))
             FROM outbox o WHERE o.agregat_id = $1 ORDER BY o.id",
    )
    .bind(id)
    .fetch_all(db)
    .await
    .map_err(|e| format!("the outbox could not be searched: {e}"))?;
    Ok(rows
        .into_iter()
        .map(|(id, versi, written_at, sent_at, processed)| OutboxRow {
            id,
            versi: versi.and_then(|v| v.parse().ok()),
            written_at,
            sent_at,
            processed,
        })
        .collect())
}
