//! Reads of the epochs, the shards' positions and the windows
//! (`urutan_epoch`, `urutan_shard`, `urutan_jendela`, written by
//! [`handoff`](super::handoff)) for the operator commands (`urutan status`,
//! `urutan explain`). They change nothing. The field names of the structs
//! that derive `Serialize` are those of `urutan status --json`.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

/// The latest epoch opened, and how far every shard has come.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Epochs {
    pub latest: i64,
    pub latest_reason: String,
    #[serde(serialize_with = "crate::rfc3339::one")]
    pub latest_opened_at: DateTime<Utc>,
    /// The highest epoch every active shard has passed.
    pub passed_by_all: Option<i64>,
}

/// The latest epoch opened; `None` if none was.
pub async fn epochs(db: &PgPool) -> Result<Option<Epochs>, sqlx::Error> {
    sqlx::query_as(
        "SELECT epoch AS latest, alasan AS latest_reason, dibuka_pada AS latest_opened_at,
                urutan_epoch_selesai() AS passed_by_all
         FROM urutan_epoch ORDER BY epoch DESC LIMIT 1",
    )
    .fetch_optional(db)
    .await
}

/// The highest epoch every active shard has passed (`urutan_epoch_selesai`).
pub async fn passed_by_all(db: &PgPool) -> Result<Option<i64>, sqlx::Error> {
    sqlx::query_scalar("SELECT urutan_epoch_selesai()")
        .fetch_one(db)
        .await
}

/// A window still open: a ring change not yet behind every shard.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Window {
    pub id: i64,
    pub reason: String,
    /// The epoch that closes it (`None`: not opened yet).
    pub epoch: Option<i64>,
    #[serde(serialize_with = "crate::rfc3339::one")]
    pub opened_at: DateTime<Utc>,
}

/// The windows still open, oldest first: without their epoch yet, or with
/// one not every active shard has passed.
pub async fn open_windows(db: &PgPool) -> Result<Vec<Window>, sqlx::Error> {
    sqlx::query_as(
        "SELECT jendela AS id, sebab AS reason, epoch, dibuka_pada AS opened_at FROM urutan_jendela
         WHERE ditutup_pada IS NULL AND (epoch IS NULL OR epoch > coalesce(urutan_epoch_selesai(), 0))
         ORDER BY jendela",
    )
    .fetch_all(db)
    .await
}

/// One shard's position (`urutan_shard`).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Position {
    pub shard: i32,
    /// The highest epoch passed.
    pub epoch: i64,
    /// Registered as active (its position is awaited).
    pub active: bool,
    /// When the oldest epoch not passed yet was opened.
    pub waiting_since: Option<DateTime<Utc>>,
    /// No recorded epoch explains `epoch`: not moved by a marker urutan sent.
    pub unexplained: bool,
}

/// Every registered shard's position, by shard.
///
/// A position is explained by a recorded epoch, by 0 (no marker passed
/// yet), or by lying below the oldest epoch kept (older ones are pruned,
/// see [`record_epoch`](super::handoff::record_epoch)). Anything else was
/// written by no marker urutan sent.
pub async fn positions(db: &PgPool) -> Result<Vec<Position>, sqlx::Error> {
    sqlx::query_as(
        "SELECT s.shard, s.epoch, s.aktif AS active,
                (SELECT min(e.dibuka_pada) FROM urutan_epoch e WHERE e.epoch > s.epoch)
                    AS waiting_since,
                s.epoch <> 0
                AND (s.epoch > coalesce((SELECT max(epoch) FROM urutan_epoch), 0)
                     OR (s.epoch >= (SELECT min(epoch) FROM urutan_epoch)
                         AND NOT EXISTS (SELECT 1 FROM urutan_epoch e WHERE e.epoch = s.epoch)))
                IS TRUE AS unexplained
         FROM urutan_shard s ORDER BY s.shard",
    )
    .fetch_all(db)
    .await
}
