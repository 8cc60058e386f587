//! Per-entity order across hash-ring changes, for every producer.
//!
//! The consistent-hash ring can change under us (a broker restart rebuilds it
//! in another order up to RabbitMQ 4.1; a new `SHARD_COUNT` appends or
//! removes buckets), so an entity can move to another shard while its older
//! messages still wait on the old one. urutan keeps per-entity order anyway:
//!
//! - *The next version never waits.* A message whose version is the stored
//!   one + 1 (1 for a new entity), or older (stale), is applied at once:
//!   nothing it could overtake exists.
//! - *Epochs.* Whoever may have seen the ring change opens an epoch: it
//!   records epoch `n` in PostgreSQL and puts a marker carrying `n` into
//!   every shard queue (through the default exchange). The worker pool does
//!   it on every (re)connect before consuming, the relay on every (re)connect
//!   before publishing. A shard worker that reaches marker `n` records that
//!   its shard *passed* epoch `n`: everything queued on it before is done.
//!   A message carries the epoch its shard has passed when it arrives; if
//!   its entity was last applied in another epoch, older messages may still
//!   wait elsewhere, so unless it is the next version it is *parked* (in the
//!   transaction that records its id, then acked; the shard goes on) until
//!   every shard has passed its epoch.
//! - *Windows.* A producer that publishes straight to the exchange does not
//!   wait for markers: after a ring change its messages can sit *ahead* of
//!   them, among the old ring's. So the pool opens a window ([`open_window`])
//!   before anything a changed ring routes can be consumed (under the pause,
//!   before a resharding changes the bindings; after a broker restart, seen
//!   by `broker::restart`, before consuming) and closes it with the epoch it
//!   opens after the change ([`close_windows`]). While a window is open for
//!   its position, a message that is not the next version waits for that
//!   epoch too.
//!
//! Parked messages are released in version order, each as soon as it is its
//! entity's next version, or once every shard has passed its epoch and no
//! window is open. The decisions run inside PostgreSQL (`urutan_terapkan`,
//! `urutan_lepas`; the rules are spelled out in
//! `migrations/20261130000007_windows.sql`), under a per-entity advisory
//! lock, so replicas and shards agree and a crash at any step leaves a
//! consistent state: a marker seen twice or late only moves a shard's
//! position forward, a parked message's id is already recorded, a release
//! is one transaction, a window whose opener died is closed by the next
//! epoch opened under the pause.

use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection};
use sqlx::{PgConnection, PgPool};
use tracing::info;

use crate::broker::{BrokerError, Names, call};
use crate::handler::DynHandler;

pub use crate::broker::delivery::MARKER_HEADER;

/// A parked (or set-aside) message that was tried.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Released {
    pub message_id: String,
    /// `applied` or `stale`; with [`release_with`] also `retry` (set aside
    /// again) or `refused` (out of its order's sequence: dead-letter it)
    /// (`urutan_lepas`'s `hasil`).
    pub result: String,
    /// Seconds it waited (`tunggu`).
    pub waited_s: f64,
    /// The first released message of its entity in this call: one handoff
    /// (`pertama`).
    pub first_of_order: bool,
    /// `retry`: the retry reason (`handler_retry`, `lock_timeout`, ...);
    /// `refused`: the dead-letter reason (`handler_refused`,
    /// `database_refused`, `retries_exhausted`).
    pub reason: Option<String>,
    /// `retry`, `refused`: the error.
    pub error: Option<String>,
    /// `refused`: the event, to dead-letter.
    pub event: Option<sqlx::types::Json<serde_json::Value>>,
}

/// Why opening an epoch failed (retried by the caller).
#[derive(Debug, thiserror::Error)]
pub enum EpochError {
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("broker: {0}")]
    Broker(#[from] BrokerError),
    #[error("the marker for shard {0} was not confirmed")]
    NotConfirmed(i32),
}

/// Makes sure shards `0..count` (the shard queues on the broker) are
/// registered as active, and no other. A new shard starts as having passed
/// every epoch so far (its queue is new: nothing old in it). A shard at or
/// above `count` has no queue (a retirement deleted it and stopped short of
/// recording that): nothing can wait on it, so it is not awaited.
pub async fn register_shards(db: &mut PgConnection, count: u16) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO urutan_shard (shard, epoch)
         SELECT s, coalesce((SELECT max(epoch) FROM urutan_epoch), 0)
         FROM generate_series(0, $1 - 1) AS s
         ON CONFLICT (shard) DO UPDATE SET aktif = true",
    )
    .bind(i32::from(count))
    .execute(&mut *db)
    .await?;
    sqlx::query("UPDATE urutan_shard SET aktif = false WHERE shard >= $1 AND aktif")
        .bind(i32::from(count))
        .execute(db)
        .await?;
    Ok(())
}

/// Records a new epoch and returns it with the active shards, whose queues
/// must each get its marker (the database half of [`open_epoch`]); prunes
/// the oldest epochs every active shard has passed. `db` must commit the
/// epoch before its markers are published (not inside a transaction): a
/// worker passes only a marker of a recorded epoch.
pub async fn record_epoch(
    db: &mut PgConnection,
    reason: &str,
) -> Result<(i64, Vec<i32>), sqlx::Error> {
    let epoch: i64 =
        sqlx::query_scalar("INSERT INTO urutan_epoch (alasan) VALUES ($1) RETURNING epoch")
            .bind(reason)
            .fetch_one(&mut *db)
            .await?;
    sqlx::query("SELECT urutan_epoch_pangkas($1)")
        .bind(EPOCHS_KEPT)
        .execute(&mut *db)
        .await?;
    let shards: Vec<i32> =
        sqlx::query_scalar("SELECT shard FROM urutan_shard WHERE aktif ORDER BY shard")
            .fetch_all(&mut *db)
            .await?;
    Ok((epoch, shards))
}

/// How many of the newest epochs [`record_epoch`] keeps when it prunes
/// older ones (every (re)connect opens one; epochs some active shard has
/// not passed are kept whatever their number: see
/// `migrations/20261204000013_markers.sql`).
pub const EPOCHS_KEPT: i32 = 1000;

/// Opens a new epoch: records it, then puts its marker into every active
/// shard queue and waits for the broker's confirms. Returns the epoch.
pub async fn open_epoch(
    db: &mut PgConnection,
    conn: &Connection,
    names: &Names,
    reason: &str,
) -> Result<i64, EpochError> {
    let (epoch, shards) = record_epoch(db, reason).await?;
    let ch = call("channel.open", conn.create_channel()).await?;
    call(
        "confirm.select",
        ch.confirm_select(ConfirmSelectOptions::default()),
    )
    .await?;
    let mut pending = Vec::with_capacity(shards.len());
    for &shard in &shards {
        let mut headers = FieldTable::default();
        headers.insert(MARKER_HEADER.into(), AMQPValue::LongLongInt(epoch));
        let props = BasicProperties::default()
            .with_headers(headers)
            .with_delivery_mode(2)
            .with_message_id(format!("urutan-epoch-{epoch}").into());
        let queue = names.shard_queue(u16::try_from(shard).unwrap_or(u16::MAX));
        let options = BasicPublishOptions {
            mandatory: true,
            ..Default::default()
        };
        let publish = ch.basic_publish("".into(), queue.as_str().into(), options, b"", props);
        pending.push((shard, call("basic.publish", publish).await?));
    }
    for (shard, confirm) in pending {
        match call("publisher confirm", confirm).await? {
            lapin::Confirmation::Ack(None) => {}
            _ => return Err(EpochError::NotConfirmed(shard)),
        }
    }
    let _ = call("channel.close", ch.close(200, "epoch opened".into())).await;
    info!(
        epoch,
        shards = shards.len(),
        reason,
        "opened an epoch (markers in every shard)"
    );
    metrics::counter!(crate::metrics::EPOCHS_TOTAL).increment(1);
    Ok(epoch)
}

/// The advisory lock that relay batches hold shared and a ring change holds
/// exclusively.
fn publish_lock(names: &Names) -> String {
    format!("urutan-publish:{}", names.entry_exchange())
}

/// Waits for the relay's batch in flight to finish and keeps new batches
/// from starting, until [`resume_publishing`] (or this session ends).
pub async fn pause_publishing(db: &mut PgConnection, names: &Names) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_advisory_lock(hashtext($1))")
        .bind(publish_lock(names))
        .execute(db)
        .await?;
    Ok(())
}

/// Lets relay batches run again, by ending the session that paused them
/// (the lock dies with it, even if this future is dropped half-way: pause
/// on a connection of its own, never on a pooled one).
pub async fn resume_publishing(db: PgConnection) {
    use sqlx::Connection;
    if let Err(e) = db.close().await {
        tracing::warn!(error = %e, "closing the pausing session failed; it ends with the socket");
    }
}

/// Opens a *window* (see `migrations/…_windows.sql`): from now until every
/// shard has passed the epoch opened after the ring change, a message that
/// is not its order's next version waits for its order's older messages
/// wherever they are queued. Called before a ring change can route anything
/// past the markers: under the pause, before a resharding touches the
/// bindings, and after a broker restart, before anything is consumed. Until
/// [`close_windows`], whoever publishes next through the relay must open an
/// epoch first.
pub async fn open_window(db: &mut PgConnection, reason: &str) -> Result<(), sqlx::Error> {
    open_window_quietly(db, reason).await?;
    info!(reason, "ring may change: window opened");
    Ok(())
}

/// [`open_window`] without the log line (logged at debug): for a window
/// that is no news to an operator (a first start).
pub async fn open_window_quietly(db: &mut PgConnection, reason: &str) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO urutan_jendela (sebab) VALUES ($1)")
        .bind(reason)
        .execute(db)
        .await?;
    tracing::debug!(reason, "window opened");
    Ok(())
}

/// The epoch after the last ring change is open: every window still without
/// an epoch (this one's, or one whose process died before it got this far)
/// closes once every shard has passed `epoch`. Only called under the pause
/// (a ring change in progress holds it), so no window of a change still
/// under way is closed by an epoch opened before that change.
pub async fn close_windows(db: &mut PgConnection, epoch: i64) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE urutan_jendela SET epoch = $1 WHERE epoch IS NULL")
        .bind(epoch)
        .execute(db)
        .await?;
    Ok(())
}

/// Whether a ring change was cut short: a window whose epoch is not open,
/// seen by someone holding the pause shared (so its opener is gone).
pub async fn ring_change_unfinished(db: &mut PgConnection) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM urutan_jendela WHERE epoch IS NULL)")
        .fetch_one(db)
        .await
}

/// Whether a window has been waiting for its epoch longer than any prepare
/// takes: its opener (`urutan topology`, or a replica) died half-way. A
/// pool then prepares again, which opens the epoch after it and closes it,
/// so a deployment without a relay does not keep it open forever.
pub async fn window_abandoned(db: &PgPool) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM urutan_jendela
                        WHERE epoch IS NULL AND dibuka_pada < now() - interval '30 seconds')",
    )
    .fetch_one(db)
    .await
}

/// The relay's part in a ring change cut short (a window whose epoch is
/// not open: its opener is gone): opens the epoch after it and closes the
/// windows, holding the pause shared on `db`'s session (a ring change in
/// progress holds it exclusively), not in a transaction, so the epoch is
/// committed before its markers are published.
pub async fn finish_cut_short(
    db: &mut PgConnection,
    conn: &Connection,
    names: &Names,
) -> Result<(), EpochError> {
    sqlx::query("SELECT pg_advisory_lock_shared(hashtext($1))")
        .bind(publish_lock(names))
        .execute(&mut *db)
        .await?;
    let finished = async {
        if ring_change_unfinished(db).await? {
            let epoch = open_epoch(db, conn, names, "a ring change was cut short").await?;
            close_windows(db, epoch).await?;
        }
        Ok::<(), EpochError>(())
    }
    .await;
    let unlocked = sqlx::query("SELECT pg_advisory_unlock_shared(hashtext($1))")
        .bind(publish_lock(names))
        .execute(&mut *db)
        .await;
    finished?;
    unlocked?;
    Ok(())
}

/// Called by a relay batch inside its transaction: waits while a ring change
/// is in progress (the lock is shared between batches, released at commit).
pub async fn hold_publishing(tx: &mut PgConnection, names: &Names) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_advisory_xact_lock_shared(hashtext($1))")
        .bind(publish_lock(names))
        .execute(tx)
        .await?;
    Ok(())
}

/// Records that `shard` reached the marker of `epoch` (idempotent; a late
/// or repeated marker never moves the position back), unchecked: for
/// tests and tools that move positions by hand. A worker uses
/// [`pass_recorded_marker`].
pub async fn pass_marker(db: &sqlx::PgPool, shard: u16, epoch: i64) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO urutan_shard (shard, epoch) VALUES ($1, $2)
         ON CONFLICT (shard) DO UPDATE SET epoch = greatest(urutan_shard.epoch, EXCLUDED.epoch)",
    )
    .bind(i32::from(shard))
    .bind(epoch)
    .execute(db)
    .await?;
    Ok(())
}

/// Records that `shard` reached a marker of `epoch` that a worker received
/// the way urutan sends markers (`urutan_lewati_penanda`). False, and the
/// position untouched: `epoch` was never recorded (above the highest epoch,
/// or one that does not exist) and is not already behind the shard: a
/// forged marker, to be dead-lettered.
pub async fn pass_recorded_marker(
    db: &sqlx::PgPool,
    shard: u16,
    epoch: i64,
) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT urutan_lewati_penanda($1, $2)")
        .bind(i32::from(shard))
        .bind(epoch)
        .fetch_one(db)
        .await
}

/// Applies the parked messages of `shard` that no longer need to wait (at
/// most `entities` entities per call, one transaction).
pub async fn release(
    db: &sqlx::PgPool,
    shard: u16,
    entities: i32,
) -> Result<Vec<Released>, sqlx::Error> {
    sqlx::query_as(
        "SELECT message_id, hasil AS result, tunggu AS waited_s, pertama AS first_of_order,
                NULL::text AS reason, NULL::text AS error, NULL::jsonb AS event
         FROM urutan_lepas($1, $2)",
    )
    .bind(i32::from(shard))
    .bind(entities)
    .fetch_all(db)
    .await
}

/// [`release`], also of set-aside messages that are due, each version in
/// a subtransaction of its own: one that fails transiently again is set
/// aside again (`retry`), one refused (or out of attempts) is returned as
/// `refused`, its order held if `policy` says so. `conn` is inside the
/// caller's transaction: the caller dead-letters the refused ones before
/// it commits. With a Rust `handler`, see `release_one_by_one`.
pub async fn release_with(
    conn: &mut sqlx::PgConnection,
    shard: u16,
    entities: i32,
    policy: &crate::store::hold::RetryPolicy,
    handler: Option<&dyn DynHandler>,
) -> Result<Vec<Released>, sqlx::Error> {
    if let Some(handler) = handler {
        return release_one_by_one(conn, shard, entities, policy, handler).await;
    }
    sqlx::query_as(
        "SELECT message_id, hasil AS result, tunggu AS waited_s, pertama AS first_of_order,
                alasan AS reason, galat AS error, pesan AS event
         FROM urutan_lepas($1, $2, $3, $4, $5, $6)",
    )
    .bind(i32::from(shard))
    .bind(entities)
    .bind(policy.min.as_secs_f64())
    .bind(policy.max.as_secs_f64())
    .bind(i32::try_from(policy.max_attempts).unwrap_or(i32::MAX))
    .bind(policy.hold_refused)
    .fetch_all(conn)
    .await
}

/// [`release_with`] for a worker with a Rust handler: one version per call
/// of `urutan_lepas` (at most `versions` of them), each in a savepoint with
/// its handler call. A handler's failure rolls back to the savepoint and is
/// recorded by `urutan_lepas_gagal` (set aside again, or refused); a
/// failure that is the database's own fails the whole release (it waits).
async fn release_one_by_one(
    conn: &mut sqlx::PgConnection,
    shard: u16,
    versions: i32,
    policy: &crate::store::hold::RetryPolicy,
    handler: &dyn DynHandler,
) -> Result<Vec<Released>, sqlx::Error> {
    use sqlx::Connection;

    sqlx::query("SELECT set_config('urutan.acara', 'on', true)")
        .execute(&mut *conn)
        .await?;
    let max_attempts = i32::try_from(policy.max_attempts).unwrap_or(i32::MAX);
    let mut released: Vec<Released> = Vec::new();
    let mut last_order: Option<String> = None;
    for _ in 0..versions {
        let mut savepoint = conn.begin().await?;
        let next: Option<(Released, Option<String>, Option<String>)> = sqlx::query_as(
            "SELECT l.message_id, l.hasil, l.tunggu, l.pertama, l.alasan, l.galat, l.pesan,
                    l.pesanan_id,
                    current_setting('urutan.acara_terakhir', true)
             FROM urutan_lepas($1, 1, $2, $3, $4, $5, true) l",
        )
        .bind(i32::from(shard))
        .bind(policy.min.as_secs_f64())
        .bind(policy.max.as_secs_f64())
        .bind(max_attempts)
        .bind(policy.hold_refused)
        .fetch_optional(&mut *savepoint)
        .await?
        .map(|row: ReleasedRow| (row.released, row.order, row.event));
        let Some((mut one, order, event)) = next else {
            savepoint.commit().await?;
            break;
        };
        let failed = if one.result == "applied" {
            crate::handler::call(handler, &mut savepoint, event.as_deref())
                .await
                .err()
        } else {
            None
        };
        match failed {
            None => savepoint.commit().await?,
            Some(failure) => {
                savepoint.rollback().await?;
                let Some(state) = failure.sqlstate() else {
                    return Err(sqlx::Error::Protocol(format!(
                        "the handler's database failed: {failure}"
                    )));
                };
                let order = order.clone().unwrap_or_default();
                let (result, reason, error, dead): (String, Option<String>, Option<String>, _) =
                    sqlx::query_as(
                        "SELECT hasil, alasan, galat, pesan
                         FROM urutan_lepas_gagal($1, $2, $3, $4, $5, $6, $7, $8)",
                    )
                    .bind(&one.message_id)
                    .bind(&order)
                    .bind(&state)
                    .bind(failure.to_string())
                    .bind(failure.retry_after().unwrap_or(policy.min).as_secs_f64())
                    .bind(failure.retry_after().unwrap_or(policy.max).as_secs_f64())
                    .bind(max_attempts)
                    .bind(policy.hold_refused)
                    .fetch_one(&mut *conn)
                    .await?;
                (one.result, one.reason, one.error, one.event) = (result, reason, error, dead);
            }
        }
        one.first_of_order = order.is_none() || order != last_order;
        last_order = order;
        released.push(one);
    }
    Ok(released)
}

/// A row of [`release_one_by_one`]'s query.
struct ReleasedRow {
    released: Released,
    order: Option<String>,
    event: Option<String>,
}

impl<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> for ReleasedRow {
    fn from_row(row: &'r sqlx::postgres::PgRow) -> Result<Self, sqlx::Error> {
        use sqlx::Row;
        Ok(Self {
            released: Released {
                message_id: row.try_get(0)?,
                result: row.try_get(1)?,
                waited_s: row.try_get(2)?,
                first_of_order: row.try_get(3)?,
                reason: row.try_get(4)?,
                error: row.try_get(5)?,
                event: row.try_get(6)?,
            },
            order: row.try_get(7)?,
            event: row.try_get(8)?,
        })
    }
}

/// Messages parked by `shard` (a held order's do not count: they wait for
/// an operator, not for the release step).
pub async fn parked(db: &sqlx::PgPool, shard: u16) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT count(*) FROM urutan_parkir u WHERE u.shard = $1
           AND NOT EXISTS (SELECT 1 FROM urutan_tahan t WHERE t.pesanan_id = u.pesanan_id)",
    )
    .bind(i32::from(shard))
    .fetch_one(db)
    .await
}

/// Whether `shard` keeps any parked message that is not a held order's
/// (what [`parked`] counts, without reading every row).
pub async fn any_parked(db: &sqlx::PgPool, shard: u16) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM urutan_parkir u WHERE u.shard = $1
           AND NOT EXISTS (SELECT 1 FROM urutan_tahan t WHERE t.pesanan_id = u.pesanan_id))",
    )
    .bind(i32::from(shard))
    .fetch_one(db)
    .await
}

/// How often a worker with parked messages counts them (the gauge
/// `urutan_parked_messages`): [`parked`] reads each one.
pub const PARKED_COUNT_EVERY: Duration = Duration::from_secs(2);

/// How often a worker with parked messages checks whether they can go.
pub const RELEASE_EVERY: Duration = Duration::from_millis(200);
