//! `urutan explain ORDER_ID`: why an order is in the state it is in.
//!
//! Everything urutan knows of the order, version by version: applied (the
//! history row: shard, message id, when), parked (shard, epoch, and what it
//! waits for), dead-lettered (reason, detail, replayed or not), in the
//! outbox (unsent, or published and not processed yet: queued), processed
//! but not applied (stale), and, for a version none of these know, "never
//! seen". Versions between the lowest and highest one known are listed,
//! runs of the same story collapsed into ranges.
//!
//! What cannot be known cheaply is said, not guessed: a message still queued
//! cannot be looked at without taking it (single-active-consumer queues
//! refuse `basic.get`), so only the shard queues' depths are given; the
//! epoch of each applied version is not recorded (`pesanan_riwayat` has no
//! epoch column), so an upper bound is shown (the latest epoch opened before
//! it was applied), and the exact epoch only for the order as a whole.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::{QueueInfo, Tables};
use crate::broker::Names;
use crate::config::Settings;

/// `urutan explain --help`: exit codes and examples.
pub const HELP: &str = "\
Each version of the order, from the lowest to the highest known: applied (shard,
message id, when), parked (and what it waits for), dead-lettered (reason), still
in the outbox or a queue, stale, or missing (and why, if urutan knows).

Exit codes:
  0  the order was explained
  1  the order is unknown (nothing of it in the database)
  2  bad command line
  3  the database or the broker cannot be reached

Examples:
  urutan explain PSN-000123
  DATABASE_URL=postgres://ops@db/urutan urutan explain PSN-000123";

/// `urutan explain` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct ExplainOptions {
    /// The order id (`x-pesanan-id`, the body's `id`, `pesanan.id`).
    #[arg(value_parser = parse_order_id)]
    pub order_id: String,
}

fn parse_order_id(s: &str) -> Result<String, String> {
    if s.is_empty() || s.len() > 128 {
        return Err("an order id is 1-128 bytes".into());
    }
    Ok(s.to_owned())
}

/// Everything found about one order.
#[derive(Debug, Clone)]
pub struct Explanation {
    pub order_id: String,
    pub state: Option<State>,
    pub applied: Vec<Applied>,
    pub parked: Vec<Parked>,
    /// Versions handed back to their shard queue after a failure, not back yet.
    pub returned: Vec<Returned>,
    /// `None`: the dead-letter table does not exist (not migrated).
    pub dead_letters: Option<Vec<DeadLetter>>,
    /// `Err`: the outbox could not be searched (why).
    pub outbox: Result<Vec<OutboxRow>, String>,
    /// The highest epoch every active shard has passed.
    pub passed_by_all: Option<i64>,
    /// Active shards and the epoch each has passed.
    pub positions: Vec<(u16, i64)>,
    /// Open windows: (reason, closing epoch).
    pub windows: Vec<(String, Option<i64>)>,
    /// Shard queues (index = shard; `None`: missing) and the DLQ, or why
    /// the broker could not be asked.
    pub queues: Result<(Vec<Option<QueueInfo>>, Option<QueueInfo>), String>,
}

#[derive(Debug, Clone)]
pub struct State {
    pub status: String,
    pub versi: i64,
    /// The highest epoch of its applied messages.
    pub epoch: i64,
    pub updated_at: DateTime<Utc>,
    pub data: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Applied {
    pub versi: i64,
    pub status: String,
    pub message_id: String,
    pub shard: i32,
    pub at: DateTime<Utc>,
    /// The latest epoch opened before it was applied: its epoch is at most this.
    pub epoch_at_most: Option<i64>,
}

#[derive(Debug, Clone)]
pub struct Parked {
    pub versi: i64,
    pub message_id: String,
    pub shard: i32,
    pub epoch: i64,
    pub since: DateTime<Utc>,
}

#[derive(Debug, Clone)]
pub struct Returned {
    pub versi: i64,
    pub message_id: String,
    pub shard: i32,
    pub since: DateTime<Utc>,
}

#[derive(Debug, Clone)]
pub struct DeadLetter {
    pub versi: Option<i64>,
    pub message_id: Option<String>,
    pub shard: i32,
    pub reason: String,
    pub detail: String,
    pub last_error: Option<String>,
    pub at: DateTime<Utc>,
    pub resolved: Option<(DateTime<Utc>, String)>,
}

#[derive(Debug, Clone)]
pub struct OutboxRow {
    pub id: i64,
    pub versi: Option<i64>,
    pub written_at: DateTime<Utc>,
    pub sent_at: Option<DateTime<Utc>>,
    /// Its message id (the row id) is recorded as processed.
    pub processed: bool,
}

impl Explanation {
    /// Nothing found yet.
    pub fn new(order_id: &str) -> Self {
        Self {
            order_id: order_id.to_owned(),
            state: None,
            applied: Vec::new(),
            parked: Vec::new(),
            returned: Vec::new(),
            dead_letters: None,
            outbox: Ok(Vec::new()),
            passed_by_all: None,
            positions: Vec::new(),
            windows: Vec::new(),
            queues: Err("the broker was not asked".into()),
        }
    }

    /// Nothing at all is known of the order.
    pub fn is_unknown(&self) -> bool {
        self.state.is_none()
            && self.applied.is_empty()
            && self.parked.is_empty()
            && self.dead_letters.as_ref().is_none_or(Vec::is_empty)
            && self.outbox.as_ref().is_ok_and(Vec::is_empty)
    }
}

/// Why nothing could be explained.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    #[error("{0}")]
    Database(String),
    #[error("the database has no urutan tables: run `urutan migrate` (or check DATABASE_URL)")]
    NotMigrated,
}

/// Reads what the database and the broker know of `order_id`.
pub async fn gather(settings: &Settings, order_id: &str) -> Result<Explanation, ExplainError> {
    let db = super::open_database(settings, "urutan explain")
        .await
        .map_err(ExplainError::Database)?;
    let read = read(&db, order_id).await;
    db.close().await;
    let mut found = read.map_err(|e| match e {
        ReadError::NotMigrated => ExplainError::NotMigrated,
        ReadError::Sql(e) => ExplainError::Database(format!("reading the database failed: {e}")),
    })?;
    if !found.is_unknown() {
        found.queues = queues(settings, found.positions.len()).await;
    }
    Ok(found)
}

enum ReadError {
    NotMigrated,
    Sql(sqlx::Error),
}

impl From<sqlx::Error> for ReadError {
    fn from(e: sqlx::Error) -> Self {
        Self::Sql(e)
    }
}

async fn read(db: &PgPool, id: &str) -> Result<Explanation, ReadError> {
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
        found.dead_letters = Some(dead_letters(db, id).await?);
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

type DeadLetterRow = (
    Option<i64>,
    Option<String>,
    i32,
    String,
    String,
    Option<String>,
    DateTime<Utc>,
    Option<DateTime<Utc>>,
    Option<String>,
);

async fn dead_letters(db: &PgPool, id: &str) -> Result<Vec<DeadLetter>, sqlx::Error> {
    let rows: Vec<DeadLetterRow> = sqlx::query_as(
        "SELECT versi, message_id, shard, reason, detail, last_error, dead_lettered_at,
                resolved_at, resolution
         FROM urutan_dead_letter WHERE pesanan_id = $1 ORDER BY id",
    )
    .bind(id)
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(
                versi,
                message_id,
                shard,
                reason,
                detail,
                last_error,
                at,
                resolved_at,
                resolution,
            )| {
                DeadLetter {
                    versi,
                    message_id,
                    shard,
                    reason,
                    detail,
                    last_error,
                    at,
                    resolved: resolved_at.map(|t| (t, resolution.unwrap_or_default())),
                }
            },
        )
        .collect())
}

/// The order's outbox rows. The outbox has no index on the order id: on a
/// large outbox this scan is what [`super::STATEMENT_TIMEOUT`] bounds, and
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
                    EXISTS (SELECT 1 FROM pesan_diproses d WHERE d.message_id = o.id::text)
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

async fn queues(
    settings: &Settings,
    shards: usize,
) -> Result<(Vec<Option<QueueInfo>>, Option<QueueInfo>), String> {
    let names = Names::new(&settings.topology_prefix);
    let conn = super::open_broker(settings, "urutan explain").await?;
    let mut queues: Vec<String> = (0..u16::try_from(shards).unwrap_or(u16::MAX))
        .map(|i| names.shard_queue(i))
        .collect();
    queues.push(names.dead_letter_queue());
    let mut infos = super::queue_infos(&conn, &queues)
        .await
        .map_err(|e| format!("the broker failed a passive declare: {e}"))?;
    let _ = crate::broker::call("connection.close", conn.close(200, "explained".into())).await;
    let dlq = infos.pop().flatten();
    Ok((infos, dlq))
}
