//! The recorded ring: which shard count the hash ring is meant to have, and
//! whether a resharding is still in progress, kept in PostgreSQL
//! (`urutan_ring`, one row per change) so that replicas agree.
//!
//! Every ring change happens while holding the publish pause (an exclusive
//! advisory lock, see `handoff`), so changes are serialized. Under it, each
//! replica [`resolve`]s its `SHARD_COUNT` against the record:
//!
//! - no record yet: its count becomes the first record;
//! - the same count: nothing to do;
//! - a count the ring had *before* the current record (a replica started
//!   before a rolling deploy changed it): the replica **follows** the record
//!   and warns; it never turns the ring back. `urutan topology` is the
//!   explicit way to go back to an earlier count;
//! - any other count is a resharding request: granted (grow; shrink only
//!   with `--allow-shrink`) unless another resharding is still in progress.
//!   Then `urutan topology` is refused with a message naming that
//!   resharding, and `urutan run` waits: it follows the recorded ring (and
//!   helps drain it) until that resharding completes, then asks again.
//!
//! A resharding is in progress from the change until nothing routed by the
//! old ring is left: every active shard has passed the epoch opened right
//! after the bindings changed and, for a shrink, every removed shard has
//! been retired (queue deleted). [`watch`] finishes it and notices when
//! another replica or `urutan topology` changed the record, so that this one
//! re-prepares and consumes the new shards.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::metrics as m;

/// The current row of `urutan_ring`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub version: i64,
    pub shard_count: u16,
    /// The count before this change (`None`: the first record).
    pub from: Option<u16>,
    /// Epoch opened right after the bindings changed.
    pub epoch: i64,
    pub by: String,
    pub started: DateTime<Utc>,
    /// `None` while the resharding is in progress.
    pub completed: Option<DateTime<Utc>>,
}

/// What a replica asks for.
#[derive(Debug, Clone, Copy)]
pub struct Request {
    /// Its `SHARD_COUNT`.
    pub wanted: u16,
    /// `--allow-shrink`.
    pub allow_shrink: bool,
    /// `urutan topology` (an operator's explicit act) rather than `urutan run`.
    pub explicit: bool,
}

/// The outcome of [`resolve`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Record `to` (after the bindings changed): a first record or a resharding.
    Change { from: Option<u16>, to: u16 },
    /// The record (its `version`) already says what this replica wants.
    Keep { count: u16, version: i64 },
    /// This replica's count is one the ring had before the current record
    /// (`version`): it predates the change, so it follows the record.
    Follow {
        recorded: u16,
        configured: u16,
        version: i64,
    },
}

impl Plan {
    /// The number of shards to bind.
    pub fn target(self) -> u16 {
        match self {
            Plan::Change { to, .. } => to,
            Plan::Keep { count, .. } => count,
            Plan::Follow { recorded, .. } => recorded,
        }
    }

    /// Whether binding [`Self::target`] may leave extra shard queues to
    /// drain: asked for with `--allow-shrink`, or already granted to whoever
    /// recorded the current ring.
    pub fn allows_shrink(self, requested: bool) -> bool {
        match self {
            Plan::Change { from: None, .. } => requested,
            _ => true,
        }
    }
}

/// A resharding request that cannot be granted now.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum RingError {
    #[error(
        "SHARD_COUNT is {wanted} but a resharding {from} → {to} is in progress (started \
         {since} by {by}); wait until it completes (urutan_resharding back to 0) and start \
         again, or set SHARD_COUNT={to}"
    )]
    InProgress {
        wanted: u16,
        from: u16,
        to: u16,
        since: String,
        by: String,
    },
    #[error(
        "the ring has {recorded} shards (recorded {since} by {by}) but SHARD_COUNT is {wanted}: \
         shrinking moves keys between shards; set SHARD_COUNT={recorded}, or pass \
         --allow-shrink to unbind the extra shards and drain them"
    )]
    Shrink {
        recorded: u16,
        wanted: u16,
        since: String,
        by: String,
    },
}

/// Decides what `request` does to the ring recorded as `current`, given the
/// counts it had before (`earlier`). Pure: see the module doc for the rules.
pub fn resolve(
    current: Option<&Record>,
    earlier: &[u16],
    request: Request,
) -> Result<Plan, RingError> {
    let Some(current) = current else {
        return Ok(Plan::Change {
            from: None,
            to: request.wanted,
        });
    };
    let recorded = current.shard_count;
    let version = current.version;
    if request.wanted == recorded {
        return Ok(Plan::Keep {
            count: recorded,
            version,
        });
    }
    if !request.explicit && earlier.contains(&request.wanted) {
        return Ok(Plan::Follow {
            recorded,
            configured: request.wanted,
            version,
        });
    }
    let since = current.started.format("%Y-%m-%d %H:%M:%S UTC").to_string();
    if current.completed.is_none() {
        return Err(RingError::InProgress {
            wanted: request.wanted,
            from: current.from.unwrap_or(recorded),
            to: recorded,
            since,
            by: current.by.clone(),
        });
    }
    if request.wanted < recorded && !request.allow_shrink {
        return Err(RingError::Shrink {
            recorded,
            wanted: request.wanted,
            since,
            by: current.by.clone(),
        });
    }
    Ok(Plan::Change {
        from: Some(recorded),
        to: request.wanted,
    })
}

type Row = (
    i64,
    i32,
    Option<i32>,
    i64,
    String,
    DateTime<Utc>,
    Option<DateTime<Utc>>,
);

fn from_row((version, count, from, epoch, by, started, completed): Row) -> Record {
    let shards = |n: i32| u16::try_from(n).unwrap_or(u16::MAX);
    Record {
        version,
        shard_count: shards(count),
        from: from.map(shards),
        epoch,
        by,
        started,
        completed,
    }
}

/// The current record, if any.
pub async fn current(db: &mut PgConnection) -> Result<Option<Record>, sqlx::Error> {
    let row: Option<Row> = sqlx::query_as(
        "SELECT versi, shard_count, dari, epoch, oleh, mulai, selesai
         FROM urutan_ring ORDER BY versi DESC LIMIT 1",
    )
    .fetch_optional(db)
    .await?;
    Ok(row.map(from_row))
}

/// Whether any ring is recorded yet: the topology was prepared once.
pub async fn recorded(db: &PgPool) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM urutan_ring)")
        .fetch_one(db)
        .await
}

/// The counts the ring had before the current record.
pub async fn earlier_counts(db: &mut PgConnection) -> Result<Vec<u16>, sqlx::Error> {
    let counts: Vec<i32> = sqlx::query_scalar(
        "SELECT DISTINCT shard_count FROM urutan_ring
         WHERE versi < (SELECT max(versi) FROM urutan_ring)",
    )
    .fetch_all(db)
    .await?;
    Ok(counts
        .into_iter()
        .filter_map(|n| u16::try_from(n).ok())
        .collect())
}

/// Records a change whose bindings are in place and whose epoch is open;
/// returns its version (`urutan_ring.versi`). A first record is complete at once (there is no old
/// ring to drain).
pub async fn record_change(
    db: &mut PgConnection,
    (from, to): (Option<u16>, u16),
    epoch: i64,
    by: &str,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "INSERT INTO urutan_ring (shard_count, dari, epoch, oleh, selesai)
         VALUES ($1, $2, $3, $4, CASE WHEN $2 IS NULL THEN now() END)
         RETURNING versi",
    )
    .bind(i32::from(to))
    .bind(from.map(i32::from))
    .bind(epoch)
    .bind(by)
    .fetch_one(db)
    .await
}

/// Who is asking, for the record and the messages of other replicas.
pub fn requester(command: &str) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown host".to_owned());
    format!("`urutan {command}` on {host} (pid {})", std::process::id())
}

/// True once nothing routed by the ring before `record` is left: every
/// active shard passed its epoch and no shard at or above its count is
/// active any more.
async fn drained(pool: &PgPool, record: &Record) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT coalesce(min(epoch) FILTER (WHERE aktif), 0) >= $1
                AND NOT coalesce(bool_or(aktif AND shard >= $2), false)
         FROM urutan_shard",
    )
    .bind(record.epoch)
    .bind(i32::from(record.shard_count))
    .fetch_one(pool)
    .await
}

/// Marks `record` complete (once, whoever sees it first); the seconds it
/// took if this call completed it.
async fn complete(pool: &PgPool, record: &Record) -> Result<Option<f64>, sqlx::Error> {
    sqlx::query_scalar(
        "UPDATE urutan_ring SET selesai = now() WHERE versi = $1 AND selesai IS NULL
         RETURNING extract(epoch FROM selesai - mulai)::float8",
    )
    .bind(record.version)
    .fetch_optional(pool)
    .await
}

/// Runs beside the workers of one connection prepared with ring `versi`,
/// until `stop`: completes an in-progress resharding once drained and keeps
/// the resharding gauge. When the record moves past `versi` (another replica
/// or `urutan topology` resharded), or when `waiting` (this replica wants
/// another count) and the resharding in progress completed, it cancels
/// `stop` and returns true: the supervisor then stops the workers and
/// prepares again.
pub async fn watch(pool: PgPool, (version, waiting): (i64, bool), stop: CancellationToken) -> bool {
    loop {
        // Cancellable: on a silent database link the query may never answer.
        let Some(looked) = stop
            .run_until_cancelled(watch_once(&pool, version, waiting))
            .await
        else {
            return false;
        };
        match looked {
            Ok(true) => {
                stop.cancel();
                return true;
            }
            Ok(false) => {}
            Err(e) => warn!(error = %e, "cannot read the recorded ring"),
        }
        tokio::select! {
            () = stop.cancelled() => return false,
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// One look at the record; true if this replica should prepare again.
async fn watch_once(pool: &PgPool, version: i64, waiting: bool) -> Result<bool, sqlx::Error> {
    let Some(record) = current(&mut *pool.acquire().await?).await? else {
        return Ok(false);
    };
    if record.version != version {
        info!(
            shards = record.shard_count,
            by = %record.by,
            "the recorded ring changed; re-preparing the topology"
        );
        return Ok(true);
    }
    if crate::reshard::handoff::window_abandoned(pool).await? {
        warn!(
            "a ring change was cut short (a window without its epoch for over 30 s); \
             re-preparing the topology to open the epoch after it"
        );
        return Ok(true);
    }
    if record.completed.is_some() {
        metrics::gauge!(m::RESHARDING).set(0.0);
        return Ok(waiting);
    }
    metrics::gauge!(m::RESHARDING).set(1.0);
    if drained(pool, &record).await? {
        if let Some(seconds) = complete(pool, &record).await? {
            metrics::histogram!(m::RESHARDING_DURATION_SECONDS).record(seconds);
            info!(
                from = record.from,
                to = record.shard_count,
                seconds,
                "resharding complete: nothing routed by the old ring is left"
            );
        }
        metrics::gauge!(m::RESHARDING).set(0.0);
        return Ok(waiting);
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(count: u16, from: Option<u16>, done: bool) -> Record {
        Record {
            version: 3,
            shard_count: count,
            from,
            epoch: 7,
            by: "`urutan run` on a (pid 1)".into(),
            started: DateTime::UNIX_EPOCH,
            completed: done.then_some(DateTime::UNIX_EPOCH),
        }
    }

    fn run(wanted: u16, allow_shrink: bool) -> Request {
        Request {
            wanted,
            allow_shrink,
            explicit: false,
        }
    }

    #[test]
    fn the_first_replica_records_its_count() {
        let decision = resolve(None, &[], run(4, false));
        assert_eq!(decision, Ok(Plan::Change { from: None, to: 4 }));
    }

    #[test]
    fn the_recorded_count_is_kept() {
        let current = record(6, Some(4), true);
        assert_eq!(
            resolve(Some(&current), &[4], run(6, false)),
            Ok(Plan::Keep {
                count: 6,
                version: 3
            })
        );
    }

    #[test]
    fn a_replica_from_before_a_grow_follows_instead_of_shrinking_back() {
        let current = record(6, Some(4), false);
        let decision = resolve(Some(&current), &[4], run(4, true));
        assert_eq!(
            decision,
            Ok(Plan::Follow {
                recorded: 6,
                configured: 4,
                version: 3
            })
        );
    }

    #[test]
    fn a_replica_from_before_a_shrink_follows_instead_of_growing_back() {
        let current = record(5, Some(9), true);
        let decision = resolve(Some(&current), &[4, 9], run(9, false));
        assert_eq!(decision.map(Plan::target), Ok(5));
    }

    #[test]
    fn a_new_count_reshards_once_the_previous_resharding_is_done() {
        let current = record(6, Some(4), true);
        let decision = resolve(Some(&current), &[4], run(9, false));
        assert_eq!(
            decision,
            Ok(Plan::Change {
                from: Some(6),
                to: 9
            })
        );
    }

    #[test]
    fn a_conflicting_resharding_is_refused_while_one_is_in_progress() {
        let current = record(5, Some(9), false);
        let refused = resolve(Some(&current), &[9], run(12, false)).expect_err("refused");
        let text = refused.to_string();
        assert!(text.contains("resharding 9 → 5 is in progress"), "{text}");
        assert!(text.contains("`urutan run` on a (pid 1)"), "{text}");
    }

    #[test]
    fn shrinking_needs_allow_shrink() {
        let current = record(9, Some(6), true);
        assert!(matches!(
            resolve(Some(&current), &[6], run(5, false)),
            Err(RingError::Shrink { .. })
        ));
        assert_eq!(
            resolve(Some(&current), &[6], run(5, true)),
            Ok(Plan::Change {
                from: Some(9),
                to: 5
            })
        );
    }

    #[test]
    fn the_topology_command_may_go_back_to_an_earlier_count() {
        let current = record(6, Some(4), true);
        let explicit = Request {
            wanted: 4,
            allow_shrink: true,
            explicit: true,
        };
        assert_eq!(
            resolve(Some(&current), &[4], explicit),
            Ok(Plan::Change {
                from: Some(6),
                to: 4
            })
        );
    }

    #[test]
    fn only_a_first_record_needs_the_replicas_own_allow_shrink() {
        assert!(!Plan::Change { from: None, to: 4 }.allows_shrink(false));
        assert!(
            Plan::Keep {
                count: 4,
                version: 1
            }
            .allows_shrink(false)
        );
        assert!(
            Plan::Follow {
                recorded: 4,
                configured: 9,
                version: 1
            }
            .allows_shrink(false)
        );
    }
}
