//! Retention. The two tables that grow by a row per message are partitioned
//! by UTC day (migration 0026): processed message ids older than
//! `DEDUP_RETENTION` and history rows older than `HISTORY_RETENTION` go by
//! whole day partitions, detached then dropped ([`expire_days`]): no worker
//! waits on a lock while a day's files are removed, whatever the day holds;
//! their default partitions (rows from before partitioning) are trimmed in
//! bounded batches. Dead-letter records
//! resolved longer than `DEAD_LETTER_RETENTION` ago, unresolved ones
//! recorded longer than `DEAD_LETTER_UNRESOLVED_RETENTION` ago and stale
//! arrivals are deleted in bounded batches ([`purge_in_batches`]), so the
//! workers never wait on a long delete. Every pass first creates the day
//! partitions of the coming week ([`prepare_partitions`]). The outbox and
//! the effects are partitioned by id range (migration 0033): the relay and
//! the dispatcher detach, then drop, their settled partitions
//! ([`expire_id_ranges`]).

use std::time::Duration;

use sqlx::{PgConnection, PgPool};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Rows deleted per statement.
const BATCH: i64 = 5_000;
/// Pause between two purge passes.
const EVERY: Duration = Duration::from_secs(300);

/// Rows of one table that expire, deleted [`BATCH`] at a time by the one
/// purge loop ([`purge_in_batches`]).
pub(crate) struct Expiring {
    table: &'static str,
    /// The key the batch's rows are picked by.
    key: &'static str,
    /// When a row has expired; `$1` is the retention in seconds.
    expired: &'static str,
}

impl Expiring {
    pub(crate) const fn new(table: &'static str, key: &'static str, expired: &'static str) -> Self {
        Self {
            table,
            key,
            expired,
        }
    }

    /// One batch: up to `$2` expired rows, skipping rows another purger
    /// holds. Built from the constants above only, never from input.
    fn delete_batch(&self) -> sqlx::AssertSqlSafe<String> {
        let Self {
            table,
            key,
            expired,
        } = self;
        sqlx::AssertSqlSafe(format!(
            "DELETE FROM {table} WHERE {key} IN (
                 SELECT {key} FROM {table} WHERE {expired}
                 LIMIT $2 FOR UPDATE SKIP LOCKED)"
        ))
    }
}

/// Day partitions created ahead of today: a pool (or its retention task)
/// that stops for less than this finds them there when it comes back.
pub const DAYS_AHEAD: i32 = 7;

/// Both preparations below take one lock per pipeline (held to the end of
/// the caller's transaction) before they look at what exists: a relay and
/// a worker that start together would otherwise both create the next
/// partition, and one fail with `relation "outbox_p…" already exists`.
///
/// Creates the day partitions of `pesan_diproses` and `pesanan_riwayat`
/// from today to [`DAYS_AHEAD`] days ahead (and validates the default
/// partitions' bound the first time, without blocking writes). Returns how
/// many were created.
///
/// It also creates the id-range partitions of the outbox and the effects
/// ahead ([`prepare_id_partitions`]).
pub async fn prepare_partitions<'c>(db: impl sqlx::PgExecutor<'c>) -> Result<i32, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT urutan_partisi_siapkan($1) + urutan_partisi_id_siapkan()
         FROM (SELECT pg_advisory_xact_lock(hashtext('urutan-partitions'), hashtext(current_schema()))) l",
    )
        .bind(DAYS_AHEAD)
        .fetch_one(db)
        .await
}

/// Creates the id-range partitions of `outbox` and `urutan_efek` until
/// about a day of ids lies ahead (migration 0033; the first time, it
/// validates the default partition's bound without blocking writes).
/// Returns how many were created. The relay and the effects dispatcher
/// call it before they expire rows, so they keep their table ready where
/// no pool runs.
pub async fn prepare_id_partitions<'c>(db: impl sqlx::PgExecutor<'c>) -> Result<i32, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT urutan_partisi_id_siapkan()
         FROM (SELECT pg_advisory_xact_lock(hashtext('urutan-partitions'), hashtext(current_schema()))) l",
    )
        .fetch_one(db)
        .await
}

/// A table partitioned by id range (migration 0033).
#[derive(Debug, Clone, Copy)]
pub enum IdPartitioned {
    /// `outbox` (`OUTBOX_RETENTION`): a partition goes once every row is sent.
    Outbox,
    /// `urutan_efek` (`EFFECTS_RETENTION`): a partition goes once every
    /// effect is sent (none pending nor dead-lettered).
    Effects,
}

impl IdPartitioned {
    fn table(self) -> &'static str {
        match self {
            Self::Outbox => "outbox",
            Self::Effects => "urutan_efek",
        }
    }
}

/// Expires the settled rows of `table` older than `retention`: creates the
/// partitions ahead, detaches every partition whose ids are all handed out,
/// whose newest row is older and that holds nothing waiting, then drops it
/// in a transaction of its own (each logged with its estimated rows), then
/// trims the default partition (rows from before partitioning) `BATCH`
/// rows at a time, without a pause. Returns the rows deleted plus the
/// estimated rows of the partitions dropped.
pub async fn expire_id_ranges(
    db: &mut PgConnection,
    table: IdPartitioned,
    retention: Duration,
) -> Result<u64, sqlx::Error> {
    let created = prepare_id_partitions(&mut *db).await?;
    if created > 0 {
        info!(partitions = created, "created id-range partitions ahead");
    }
    let secs = retention.as_secs_f64();
    let detached: Vec<(String, i64)> = sqlx::query_as(
        "SELECT partisi, baris FROM urutan_partisi_id_lepas($1, make_interval(secs => $2))",
    )
    .bind(table.table())
    .bind(secs)
    .fetch_all(&mut *db)
    .await?;
    for (partition, rows) in &detached {
        info!(%partition, rows, "detached a settled id-range partition");
    }
    // Dropped in a transaction of its own (see `expire_days`), with what an
    // earlier pass detached and could not drop.
    let dropped: Vec<(String, i64)> =
        sqlx::query_as("SELECT partisi, baris FROM urutan_partisi_hapus($1)")
            .bind(table.table())
            .fetch_all(&mut *db)
            .await?;
    let mut total = 0;
    for (partition, rows) in dropped {
        info!(%partition, rows, "dropped an expired id-range partition");
        total += u64::try_from(rows).unwrap_or(0);
    }
    loop {
        let deleted: i64 =
            sqlx::query_scalar("SELECT urutan_awal_id_pangkas($1, make_interval(secs => $2), $3)")
                .bind(table.table())
                .bind(secs)
                .bind(BATCH as i32)
                .fetch_one(&mut *db)
                .await?;
        total += u64::try_from(deleted).unwrap_or(0);
        if deleted < BATCH {
            return Ok(total);
        }
    }
}

/// A table partitioned by UTC day (migration 0026).
#[derive(Debug, Clone, Copy)]
enum DayPartitioned {
    /// `pesan_diproses` (`DEDUP_RETENTION`).
    ProcessedIds,
    /// `pesanan_riwayat` (`HISTORY_RETENTION`).
    History,
}

impl DayPartitioned {
    fn table(self) -> &'static str {
        match self {
            Self::ProcessedIds => "pesan_diproses",
            Self::History => "pesanan_riwayat",
        }
    }
}

/// Expires the rows of `table` older than `retention`: detaches every day
/// partition whose whole UTC day is older (a catalog change; the parent's
/// lock is held for milliseconds), then drops the detached tables in a
/// transaction of their own (removing their files, which can take seconds
/// for a busy day, locks nothing the workers use; migration 0036), each
/// logged with its estimated rows; then trims the default partition
/// [`BATCH`] rows at a time. Returns the rows deleted plus the estimated
/// rows of the partitions dropped.
async fn expire_days(
    pool: &PgPool,
    table: DayPartitioned,
    retention: Duration,
) -> Result<u64, sqlx::Error> {
    let secs = retention.as_secs_f64();
    let detached: Vec<(String, i64)> = sqlx::query_as(
        "SELECT partisi, baris FROM urutan_partisi_lepas($1, make_interval(secs => $2))",
    )
    .bind(table.table())
    .bind(secs)
    .fetch_all(pool)
    .await?;
    for (partition, rows) in &detached {
        info!(%partition, rows, "detached an expired day partition");
    }
    // Also what an earlier pass detached and could not drop (a crash).
    let dropped: Vec<(String, i64)> =
        sqlx::query_as("SELECT partisi, baris FROM urutan_partisi_hapus($1)")
            .bind(table.table())
            .fetch_all(pool)
            .await?;
    let mut total = 0;
    for (partition, rows) in dropped {
        info!(%partition, rows, "dropped an expired day partition");
        total += u64::try_from(rows).unwrap_or(0);
    }
    loop {
        let deleted: i64 =
            sqlx::query_scalar("SELECT urutan_awal_pangkas($1, make_interval(secs => $2), $3)")
                .bind(table.table())
                .bind(secs)
                .bind(BATCH as i32)
                .fetch_one(pool)
                .await?;
        total += u64::try_from(deleted).unwrap_or(0);
        if deleted < BATCH {
            return Ok(total);
        }
        tokio::time::sleep(PAUSE).await;
    }
}

/// Stale arrivals (`urutan_basi`), kept as long as the message ids they describe.
const STALE_ARRIVALS: Expiring = Expiring::new(
    "urutan_basi",
    "seq",
    "tiba_pada < now() - make_interval(secs => $1)",
);

/// Expires every processed message id (`pesan_diproses`) and stale arrival
/// (`urutan_basi`) older than `retention`: whole day partitions dropped, the
/// rest deleted `BATCH` rows per transaction. Returns how many rows went
/// (for a dropped partition, its estimated rows).
pub async fn purge_expired(pool: &PgPool, retention: Duration) -> Result<u64, sqlx::Error> {
    let ids = expire_days(pool, DayPartitioned::ProcessedIds, retention).await?;
    Ok(ids + purge_in_batches(pool, &STALE_ARRIVALS, retention).await?)
}

/// Expires every history row (`pesanan_riwayat`) older than `retention`
/// (`HISTORY_RETENTION`), as [`purge_expired`] does the message ids.
pub async fn purge_expired_history(pool: &PgPool, retention: Duration) -> Result<u64, sqlx::Error> {
    expire_days(pool, DayPartitioned::History, retention).await
}

/// Pause between two batches of a store purge, to leave room for the
/// workers.
const PAUSE: Duration = Duration::from_millis(50);

/// The one purge loop of the store: deletes the `rows` expired under
/// `retention` on the pool, [`BATCH`] at a time, until fewer than `BATCH`
/// go, pausing [`PAUSE`] between batches. Returns how many rows went.
pub(super) async fn purge_in_batches(
    pool: &PgPool,
    rows: &Expiring,
    retention: Duration,
) -> Result<u64, sqlx::Error> {
    let mut total = 0;
    loop {
        let deleted = sqlx::query(rows.delete_batch())
            .bind(retention.as_secs_f64())
            .bind(BATCH)
            .execute(pool)
            .await?
            .rows_affected();
        total += deleted;
        if deleted < BATCH as u64 {
            return Ok(total);
        }
        tokio::time::sleep(PAUSE).await;
    }
}

/// How long each kind of row is kept.
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    /// Processed message ids (`DEDUP_RETENTION`).
    pub dedup: Duration,
    /// History rows (`HISTORY_RETENTION`); `None`: kept forever.
    pub history: Option<Duration>,
    /// Resolved dead-letter records (`DEAD_LETTER_RETENTION`).
    pub dead_letters: Duration,
    /// Unresolved dead-letter records (`DEAD_LETTER_UNRESOLVED_RETENTION`).
    pub unresolved_dead_letters: Duration,
}

impl Retention {
    /// What the settings keep (`DEDUP_RETENTION`, `DEAD_LETTER_RETENTION`,
    /// `DEAD_LETTER_UNRESOLVED_RETENTION`).
    pub fn of(settings: &crate::config::Settings) -> Self {
        Self {
            dedup: settings.dedup_retention,
            history: settings.history_retention,
            dead_letters: settings.dead_letter_retention,
            unresolved_dead_letters: settings.dead_letter_unresolved_retention,
        }
    }
}

/// Purges now and then every few minutes until `shutdown`.
pub async fn run_retention(pool: PgPool, retention: Retention, shutdown: CancellationToken) {
    loop {
        // Cancellable: on a silent database link the purge may never answer.
        let Some(prepared) = shutdown
            .run_until_cancelled(prepare_partitions(&pool))
            .await
        else {
            return;
        };
        match prepared {
            Ok(0) => {}
            Ok(n) => info!(partitions = n, "created the day partitions ahead"),
            Err(e) => warn!(error = %e, "creating the day partitions ahead failed; will try again"),
        }
        if let Some(history) = retention.history {
            let Some(purged) = shutdown
                .run_until_cancelled(purge_expired_history(&pool, history))
                .await
            else {
                return;
            };
            match purged {
                Ok(0) => {}
                Ok(n) => info!(rows = n, "expired history rows"),
                Err(e) => warn!(error = %e, "history retention pass failed; will try again"),
            }
        }
        let Some(purged) = shutdown
            .run_until_cancelled(purge_expired(&pool, retention.dedup))
            .await
        else {
            return;
        };
        match purged {
            Ok(0) => {}
            Ok(n) => info!(rows = n, "purged expired message ids"),
            Err(e) => warn!(error = %e, "dedup retention pass failed; will try again"),
        }
        let Some(purged) = shutdown
            .run_until_cancelled(super::purge_resolved_dead_letters(
                &pool,
                retention.dead_letters,
            ))
            .await
        else {
            return;
        };
        match purged {
            Ok(0) => {}
            Ok(n) => info!(rows = n, "purged resolved dead-letter records"),
            Err(e) => warn!(error = %e, "dead-letter retention pass failed; will try again"),
        }
        let Some(purged) = shutdown
            .run_until_cancelled(super::purge_unresolved_dead_letters(
                &pool,
                retention.unresolved_dead_letters,
            ))
            .await
        else {
            return;
        };
        match purged {
            Ok(0) => {}
            Ok(n) => info!(
                rows = n,
                "purged unresolved dead-letter records past their retention"
            ),
            Err(e) => warn!(error = %e, "dead-letter retention pass failed; will try again"),
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(EVERY) => {}
        }
    }
}
