//! Retention: processed message ids older than `DEDUP_RETENTION`,
//! dead-letter records resolved longer than `DEAD_LETTER_RETENTION` ago, and
//! unresolved ones recorded longer than `DEAD_LETTER_UNRESOLVED_RETENTION`
//! ago, are deleted in bounded batches ([`purge_in_batches`]), so the
//! workers never wait on a long delete.

use std::time::Duration;

use sqlx::{PgConnection, PgPool};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Rows deleted per statement.
const BATCH: i64 = 5_000;
/// Pause between two purge passes.
const EVERY: Duration = Duration::from_secs(300);

/// Rows of one table that expire, deleted [`BATCH`] at a time by the one
/// purge loop ([`purge_batches_on`]).
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

/// Processed message ids (`DEDUP_RETENTION`).
const PROCESSED_IDS: Expiring = Expiring::new(
    "pesan_diproses",
    "message_id",
    "diproses_pada < now() - make_interval(secs => $1)",
);

/// Deletes every `pesan_diproses` row older than `retention`, `BATCH` rows
/// per transaction. Returns how many rows went.
pub async fn purge_expired(pool: &PgPool, retention: Duration) -> Result<u64, sqlx::Error> {
    purge_in_batches(pool, &PROCESSED_IDS, retention).await
}

/// Pause between two batches of a store purge, to leave room for the
/// workers.
const PAUSE: Duration = Duration::from_millis(50);

/// Deletes the `rows` expired under `retention` on the pool until fewer than
/// `BATCH` go, pausing between batches; every retention of the store goes
/// through here. Returns how many rows went.
pub(super) async fn purge_in_batches(
    pool: &PgPool,
    rows: &Expiring,
    retention: Duration,
) -> Result<u64, sqlx::Error> {
    purge_batches_on(pool, rows, retention, PAUSE).await
}

/// Where a purge runs its batches: a pool (a connection per batch) or one
/// connection of its own (the outbox relay's).
pub(crate) trait PurgeOn {
    /// Runs one batch of `rows`; how many rows went.
    async fn delete_batch(&mut self, rows: &Expiring, secs: f64) -> Result<u64, sqlx::Error>;
}

impl PurgeOn for &PgPool {
    async fn delete_batch(&mut self, rows: &Expiring, secs: f64) -> Result<u64, sqlx::Error> {
        let done = sqlx::query(rows.delete_batch())
            .bind(secs)
            .bind(BATCH)
            .execute(*self)
            .await?;
        Ok(done.rows_affected())
    }
}

impl PurgeOn for &mut PgConnection {
    async fn delete_batch(&mut self, rows: &Expiring, secs: f64) -> Result<u64, sqlx::Error> {
        let done = sqlx::query(rows.delete_batch())
            .bind(secs)
            .bind(BATCH)
            .execute(&mut **self)
            .await?;
        Ok(done.rows_affected())
    }
}

/// The one purge loop: deletes the `rows` expired under `retention` on
/// `db`, [`BATCH`] at a time, until fewer than `BATCH` go, sleeping `pause`
/// between batches (none if zero). Returns how many rows went.
pub(crate) async fn purge_batches_on(
    mut db: impl PurgeOn,
    rows: &Expiring,
    retention: Duration,
    pause: Duration,
) -> Result<u64, sqlx::Error> {
    let mut total = 0;
    loop {
        let deleted = db.delete_batch(rows, retention.as_secs_f64()).await?;
        total += deleted;
        if deleted < BATCH as u64 {
            return Ok(total);
        }
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
    }
}

/// How long each kind of row is kept.
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    /// Processed message ids (`DEDUP_RETENTION`).
    pub dedup: Duration,
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
            dead_letters: settings.dead_letter_retention,
            unresolved_dead_letters: settings.dead_letter_unresolved_retention,
        }
    }
}

/// Purges now and then every few minutes until `shutdown`.
pub async fn run_retention(pool: PgPool, retention: Retention, shutdown: CancellationToken) {
    loop {
        // Cancellable: on a silent database link the purge may never answer.
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
