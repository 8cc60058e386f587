//! One failing message set aside, and held orders (docs/contract.md
//! section 11): the owner of `urutan_tahan` (holds) and `urutan_lewati`
//! (skips), and of the first set-aside of a message (a parked row with a
//! due time, `urutan_sisihkan`; its later attempts are made by the shard's
//! release step, [`crate::reshard::handoff::release`], which a full DLQ
//! makes leave a refused one set aside: [`postpone`]). The SQL is in
//! `migrations/20261204000020_set_aside_and_holds.sql`.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::types::Json;
use sqlx::{PgExecutor, PgPool};

use super::{Applied, StoreError, parse_result};
use crate::config::{GapPolicy, OnRefused, Settings};
use crate::message::Event;

/// How a message set aside is tried again, and what refused and missing
/// versions do to their order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// `RETRY_BACKOFF_MIN`: the wait after the first failure (doubling).
    pub min: Duration,
    /// `RETRY_BACKOFF_MAX`: the longest wait.
    pub max: Duration,
    /// `RETRY_MAX_ATTEMPTS`: attempts before it is refused.
    pub max_attempts: u32,
    /// `ON_REFUSED=hold`: a refused version holds its order.
    pub hold_refused: bool,
    /// `GAP_POLICY=wait`: a version missing this long (`GAP_TIMEOUT`) holds
    /// its order; `None` with `GAP_POLICY=apply`.
    pub gap_timeout: Option<Duration>,
}

impl RetryPolicy {
    pub fn of(settings: &Settings) -> Self {
        Self {
            min: settings.retry_backoff_min,
            max: settings.retry_backoff_max,
            max_attempts: settings.retry_max_attempts,
            hold_refused: settings.on_refused == OnRefused::Hold,
            gap_timeout: (settings.gap_policy == GapPolicy::Wait).then_some(settings.gap_timeout),
        }
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::of(&Settings::default())
    }
}

/// Sets `event` (received on `shard`) aside after the transient failure
/// `error` of its own transaction: claimed and parked until due, its
/// order's later versions waiting behind it. [`Applied::Parked`]; or
/// `duplicate` if its (order, message id) was recorded meanwhile.
pub async fn set_aside<'c, E>(
    executor: E,
    event: &Event,
    shard: u16,
    error: &str,
    policy: &RetryPolicy,
) -> Result<Applied, StoreError>
where
    E: PgExecutor<'c>,
{
    // The event's apply span, kept on its parked row (migration 0032): the
    // effect of its later apply continues that trace.
    let result: String = sqlx::query_scalar(
        "SELECT urutan_sisihkan($1, $2, $3, $4, $5)
         FROM (SELECT set_config('urutan.apply_traces', $6, true)) traces",
    )
    .bind(Json(event))
    .bind(i32::from(shard))
    .bind(error)
    .bind(policy.min.as_secs_f64())
    .bind(policy.max.as_secs_f64())
    .bind(super::apply::apply_traceparents([event]))
    .fetch_one(executor)
    .await?;
    Ok(match result.as_str() {
        "set_aside" => Applied::Parked,
        other => parse_result(other),
    })
}

/// Leaves set aside, due again in `wait` with `why` as its last error, the
/// version `message_id` of `order` that the release step refused but whose
/// dead letter the DLQ would not take (it is full): its order waits behind
/// it, every other order goes on.
pub async fn postpone(
    db: &PgPool,
    message_id: &str,
    order: &str,
    wait: Duration,
    why: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE urutan_parkir SET jatuh_tempo = now() + make_interval(secs => $3), galat = $4
         WHERE message_id = $1 AND pesanan_id = $2",
    )
    .bind(message_id)
    .bind(order)
    .bind(wait.as_secs_f64())
    .bind(why)
    .execute(db)
    .await?;
    Ok(())
}

/// Holds `event`'s order because that version was refused (`error`: why),
/// unless the version is no longer ahead of the stored one. True if a new
/// hold was made (a hold already there stays as it is).
pub async fn hold_refused<'c, E>(
    executor: E,
    event: &Event,
    shard: u16,
    error: Option<&str>,
) -> Result<bool, StoreError>
where
    E: PgExecutor<'c>,
{
    let held = sqlx::query_scalar("SELECT urutan_tahan_tolak($1, $2, $3, $4, $5)")
        .bind(&event.entity_id)
        .bind(&event.message_id)
        .bind(event.versi)
        .bind(i32::from(shard))
        .bind(error)
        .fetch_one(executor)
        .await?;
    Ok(held)
}

/// An order held because a version of it was missing too long.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct GapHold {
    pub order: String,
    /// The missing version.
    pub versi: i64,
    /// Versions recorded behind it, waiting.
    pub waiting: i64,
}

/// Holds (reason `gap`) the orders of `shard` whose next version has been
/// missing for longer than `timeout` (`GAP_POLICY=wait`). Returns them.
pub async fn hold_gaps(
    db: &PgPool,
    shard: u16,
    timeout: Duration,
) -> Result<Vec<GapHold>, sqlx::Error> {
    sqlx::query_as(
        "SELECT pesanan_id AS \"order\", versi, menunggu AS waiting
         FROM urutan_tahan_celah($1, make_interval(secs => $2))",
    )
    .bind(i32::from(shard))
    .bind(timeout.as_secs_f64())
    .fetch_all(db)
    .await
}

/// One held order, as `urutan hold list` shows it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Hold {
    /// The order id.
    pub order: String,
    /// `refused`, `gap` or `effect`.
    pub reason: String,
    /// The message holding it (the refused one).
    pub message_id: Option<String>,
    /// The version holding it.
    pub versi: Option<i64>,
    pub shard: Option<i32>,
    pub since: DateTime<Utc>,
    /// The refused version's last error.
    pub error: Option<String>,
    /// Versions recorded behind it, waiting (for an `effect` hold: effects).
    pub waiting: i64,
    /// The dead-lettered effect holding it (`effect` holds only:
    /// [`crate::effects::hold`]; `urutan dlq replay --effects ID`).
    #[sqlx(default)]
    pub effect: Option<i64>,
}

/// Held orders, oldest hold first (at most `limit`), or only `order`'s:
/// the holds of `urutan_tahan` (versions wait) and the effect holds
/// ([`crate::effects::hold`]: only effects wait). An order may have one of
/// each.
pub async fn holds(db: &PgPool, order: Option<&str>, limit: i64) -> Result<Vec<Hold>, sqlx::Error> {
    let mut holds: Vec<Hold> = sqlx::query_as(
        "SELECT t.pesanan_id AS \"order\", t.alasan AS reason, t.message_id, t.versi, t.shard,
                t.sejak AS since, t.galat AS error,
                (SELECT count(*) FROM urutan_parkir u WHERE u.pesanan_id = t.pesanan_id) AS waiting
         FROM urutan_tahan t
         WHERE $1::text IS NULL OR t.pesanan_id = $1
         ORDER BY t.sejak, t.pesanan_id LIMIT $2",
    )
    .bind(order)
    .bind(limit)
    .fetch_all(db)
    .await?;
    holds.extend(crate::effects::hold::holds(db, order, limit).await?);
    holds.sort_by(|a, b| (a.since, &a.order).cmp(&(b.since, &b.order)));
    holds.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    Ok(holds)
}

/// A hold ended without its version (`urutan hold release`).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ReleasedHold {
    pub reason: String,
    /// The refused message, skipped.
    pub message_id: Option<String>,
    pub versi: Option<i64>,
    /// Versions that now go on, in order.
    pub waiting: i64,
}

/// Ends `order`'s hold without what holds it: recorded as a skip; its
/// waiting versions are then released in order by their shard's worker.
/// `None` if the order is not held.
pub async fn release_hold(db: &PgPool, order: &str) -> Result<Option<ReleasedHold>, sqlx::Error> {
    sqlx::query_as(
        "SELECT alasan AS reason, message_id, versi, menunggu AS waiting FROM urutan_lepaskan($1)",
    )
    .bind(order)
    .fetch_optional(db)
    .await
}

/// Held orders per reason (effect holds too), with when the oldest of them
/// was held.
pub async fn held_by_reason(db: &PgPool) -> Result<Vec<(String, i64, DateTime<Utc>)>, sqlx::Error> {
    let mut held: Vec<(String, i64, DateTime<Utc>)> = sqlx::query_as(
        "SELECT alasan, count(*), min(sejak) FROM urutan_tahan GROUP BY alasan ORDER BY alasan",
    )
    .fetch_all(db)
    .await?;
    if let Some((orders, since)) = crate::effects::hold::held(db).await? {
        held.push((crate::effects::hold::REASON.to_owned(), orders, since));
        held.sort_by(|a, b| a.0.cmp(&b.0));
    }
    Ok(held)
}

/// One message set aside after a transient failure, waiting for its next try.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Retrying {
    pub order: String,
    pub message_id: String,
    pub versi: i64,
    pub shard: i32,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub next_try: DateTime<Utc>,
}

/// Messages set aside (all orders, or only `order`'s), next try first.
pub async fn retrying(
    db: &PgPool,
    order: Option<&str>,
    limit: i64,
) -> Result<Vec<Retrying>, sqlx::Error> {
    sqlx::query_as(
        "SELECT pesanan_id AS \"order\", message_id, versi, shard, percobaan AS attempts,
                galat AS last_error, jatuh_tempo AS next_try
         FROM urutan_parkir
         WHERE jatuh_tempo IS NOT NULL AND ($1::text IS NULL OR pesanan_id = $1)
         ORDER BY jatuh_tempo LIMIT $2",
    )
    .bind(order)
    .bind(limit)
    .fetch_all(db)
    .await
}

/// Orders with a message set aside.
pub async fn retrying_orders(db: &PgPool) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT count(DISTINCT pesanan_id) FROM urutan_parkir WHERE jatuh_tempo IS NOT NULL",
    )
    .fetch_one(db)
    .await
}

/// One version an operator released its order without (`urutan_lewati`).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Skip {
    pub reason: String,
    pub message_id: Option<String>,
    pub versi: Option<i64>,
    pub error: Option<String>,
    pub held_since: DateTime<Utc>,
    pub skipped_at: DateTime<Utc>,
}

/// `order`'s skips, oldest first.
pub async fn skips(db: &PgPool, order: &str) -> Result<Vec<Skip>, sqlx::Error> {
    sqlx::query_as(
        "SELECT alasan AS reason, message_id, versi, galat AS error,
                ditahan_sejak AS held_since, dilewati_pada AS skipped_at
         FROM urutan_lewati WHERE pesanan_id = $1 ORDER BY seq",
    )
    .bind(order)
    .fetch_all(db)
    .await
}

/// Keeps `urutan_orders_held{reason}`, `urutan_orders_retrying`,
/// `urutan_hold_oldest_seconds` and `urutan_orders_overdue{kind}`
/// ([`super::overdue`], with the pipeline's `gap_timeout`) current (every
/// 5 s) until `stop`.
pub async fn watch(db: PgPool, gap_timeout: Duration, stop: tokio_util::sync::CancellationToken) {
    use crate::metrics as m;
    loop {
        if let Ok(overdue) = super::overdue::overdue(&db, gap_timeout).await {
            for kind in super::overdue::KINDS {
                let found = overdue.iter().find(|o| o.kind == kind);
                let orders = found.map_or(0, |o| o.orders);
                metrics::gauge!(m::ORDERS_OVERDUE, "kind" => kind).set(orders as f64);
            }
        }
        if let Ok(held) = held_by_reason(&db).await {
            for reason in m::HOLD_REASONS {
                let found = held.iter().find(|(r, _, _)| r == reason);
                let count = found.map_or(0, |(_, n, _)| *n);
                metrics::gauge!(m::ORDERS_HELD, "reason" => reason).set(count as f64);
            }
            let oldest = held.iter().map(|(_, _, since)| *since).min();
            let age = oldest.map_or(0.0, |since| (Utc::now() - since).as_seconds_f64());
            metrics::gauge!(m::HOLD_OLDEST_SECONDS).set(age.max(0.0));
        }
        if let Ok(retrying) = retrying_orders(&db).await {
            metrics::gauge!(m::ORDERS_RETRYING).set(retrying as f64);
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
    }
}
