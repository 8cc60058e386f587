//! The database connection a shard worker keeps between consecutive
//! messages.
//!
//! sqlx pings every connection that goes back to the pool (a Sync and its
//! ReadyForQuery: one more round trip, and a spawned task), so taking a
//! pooled connection per message costs two round trips where the apply
//! statement needs one. A worker instead keeps the connection it took for at
//! most [`HOLD`], then gives it back (the ping then still checks it), so
//! other shards and the pool's own users get their turn even when the pool
//! is smaller than the number of shards.
//!
//! Invariants: a worker never waits for a pooled connection while keeping
//! one (steps that use the pool directly give the kept one back first), so
//! workers cannot wait on each other when the pool is smaller than the
//! number of shards; a connection is only kept after a statement that succeeded
//! (after any error it goes back to the pool, whose ping closes it if it is
//! broken); it is never kept across a transaction boundary (every statement
//! run on it commits or rolls back before it is put back).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use sqlx::pool::PoolConnection;
use sqlx::{PgPool, Postgres};

use super::contention::Contention;
use crate::handler::SharedHandler;
use crate::message::Event;
use crate::store::{self, Applied, BatchItem, BatchResult, NewDeadLetter, StoreError};

/// Longest time a worker keeps a pooled connection before giving it back.
pub(super) const HOLD: std::time::Duration = std::time::Duration::from_millis(100);

/// A connection taken from the pool, and when.
struct Leased {
    conn: PoolConnection<Postgres>,
    since: Instant,
}

/// How long a lowered batch group limit lasts (the lock table may have
/// been full because of other sessions for a while).
const GROUP_LIMIT_FOR: std::time::Duration = std::time::Duration::from_secs(60);

/// What one channel life of a shard worker keeps between deliveries.
pub(super) struct Session {
    pool: PgPool,
    /// The shard every statement is for.
    shard: u16,
    /// The longest one apply transaction may take (see [`store::bounded`]).
    limit: std::time::Duration,
    kept: Mutex<Option<Leased>>,
    /// The team's Rust handler, called in each apply transaction.
    handler: Option<SharedHandler>,
    /// Whether the pool's apply transactions go one at a time now.
    contention: Arc<Contention>,
    /// Batch mode: most messages per transaction since PostgreSQL's lock
    /// table last overflowed, and when that was.
    group_limit: Mutex<Option<(usize, Instant)>>,
}

impl Session {
    pub fn new(
        pool: PgPool,
        shard: u16,
        limit: std::time::Duration,
        handler: Option<SharedHandler>,
        contention: Arc<Contention>,
    ) -> Self {
        Self {
            pool,
            shard,
            limit,
            kept: Mutex::new(None),
            handler,
            contention,
            group_limit: Mutex::new(None),
        }
    }

    /// Most messages a batch transaction should hold: unlimited, or the
    /// size that fit PostgreSQL's lock table after an overflow in the last
    /// [`GROUP_LIMIT_FOR`].
    pub fn group_limit(&self) -> usize {
        let mut limit = self.group_limit.lock().unwrap_or_else(|e| e.into_inner());
        match *limit {
            Some((n, since)) if since.elapsed() < GROUP_LIMIT_FOR => n,
            _ => {
                *limit = None;
                usize::MAX
            }
        }
    }

    /// After an overflow: batches hold at most `n` messages per
    /// transaction for a while.
    pub fn lower_group_limit(&self, n: usize) {
        let mut limit = self.group_limit.lock().unwrap_or_else(|e| e.into_inner());
        let n = limit.map_or(n, |(old, _)| old.min(n)).max(1);
        *limit = Some((n, Instant::now()));
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Leased>> {
        // Nothing panics while holding the lock; a poisoned one is still consistent.
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The kept connection if it is younger than [`HOLD`], else a fresh one
    /// from the pool (waiting at most the pool's acquire timeout).
    async fn take(&self) -> Result<Leased, StoreError> {
        let kept = self.slot().take();
        if let Some(leased) = kept
            && leased.since.elapsed() < HOLD
        {
            return Ok(leased);
        }
        let conn = self.pool.acquire().await?;
        Ok(Leased {
            conn,
            since: Instant::now(),
        })
    }

    /// Keeps `leased` for the next statement if `ok` (its statement
    /// succeeded) and it is younger than [`HOLD`]; otherwise it goes back to
    /// the pool.
    fn put(&self, leased: Leased, ok: bool) {
        if ok && leased.since.elapsed() < HOLD {
            *self.slot() = Some(leased);
        }
    }

    /// Runs `work` (one statement, one transaction) on the kept connection,
    /// bounded by the database timeout; keeps the connection only if it succeeded.
    async fn on_kept<T, E>(
        &self,
        work: impl AsyncFnOnce(&mut sqlx::PgConnection) -> Result<T, E>,
    ) -> Result<T, StoreError>
    where
        StoreError: From<E>,
    {
        let mut leased = self.take().await?;
        let done = store::bounded(&mut leased.conn, self.limit, work).await;
        self.put(leased, done.is_ok());
        done
    }

    /// [`store::apply`] on the kept connection (with the Rust handler:
    /// [`store::apply_with_handler`]).
    pub async fn apply(&self, event: &Event) -> Result<Applied, StoreError> {
        if self.handler.is_some() {
            let results = self.apply_batch(&[BatchItem::Event(event)]).await?;
            return match results.first() {
                Some(BatchResult::Event(applied)) => Ok(*applied),
                _ => Err(StoreError::Refused(sqlx::Error::Protocol(
                    "urutan_terapkan_batch gave no result for an event".into(),
                ))),
            };
        }
        self.on_kept(async |conn| {
            if self.contention.serialized() {
                let apply =
                    async |tx: &mut sqlx::PgConnection| store::apply(tx, event, self.shard).await;
                return store::one_at_a_time(conn, apply).await;
            }
            store::apply(conn, event, self.shard).await
        })
        .await
    }

    /// [`store::apply_batch`] on the kept connection (with the Rust
    /// handler: [`store::apply_with_handler`]); one transaction at a time
    /// across the pool's shards while they lose to each other
    /// ([`Contention`]).
    pub async fn apply_batch(
        &self,
        items: &[BatchItem<'_>],
    ) -> Result<Vec<BatchResult>, StoreError> {
        let apply = async |conn: &mut sqlx::PgConnection| match &self.handler {
            Some(handler) => {
                store::apply_with_handler(conn, items, self.shard, handler.as_ref()).await
            }
            None => store::apply_batch(conn, items, self.shard).await,
        };
        self.on_kept(async |conn| {
            if self.contention.serialized() {
                return store::one_at_a_time(conn, apply).await;
            }
            apply(conn).await
        })
        .await
    }

    /// The pool's apply transactions lost to each other: one at a time for
    /// a while ([`Contention`]).
    pub fn lost_to_another(&self) {
        self.contention.lost();
    }

    /// Whether the pool's apply transactions go one at a time now.
    pub fn one_at_a_time(&self) -> bool {
        self.contention.serialized()
    }

    /// [`store::hold::set_aside`] on the kept connection.
    pub async fn set_aside(
        &self,
        event: &Event,
        error: &str,
        policy: &store::hold::RetryPolicy,
    ) -> Result<Applied, StoreError> {
        self.on_kept(async |conn| {
            store::hold::set_aside(conn, event, self.shard, error, policy).await
        })
        .await
    }

    /// [`store::hold::hold_refused`] on the kept connection.
    pub async fn hold_refused(
        &self,
        event: &Event,
        error: Option<&str>,
    ) -> Result<bool, StoreError> {
        self.on_kept(async |conn| store::hold::hold_refused(conn, event, self.shard, error).await)
            .await
    }

    /// [`store::record_returned`] on the kept connection.
    pub async fn record_returned(&self, event: &Event) -> Result<(), StoreError> {
        self.on_kept(async |conn| store::record_returned(conn, event, self.shard).await)
            .await
    }

    /// [`store::record_dead_letters`] on the kept connection.
    pub async fn record_dead_letters(&self, rows: &[NewDeadLetter]) -> Result<(), StoreError> {
        self.on_kept(async |conn| store::record_dead_letters(conn, rows).await)
            .await
    }

    /// When the kept connection is due back to the pool (`None`: none kept).
    pub fn due(&self) -> Option<tokio::time::Instant> {
        let since = self.slot().as_ref()?.since;
        Some(tokio::time::Instant::from_std(since + HOLD))
    }

    /// Gives the kept connection back to the pool.
    pub fn give_back(&self) {
        drop(self.slot().take());
    }
}
