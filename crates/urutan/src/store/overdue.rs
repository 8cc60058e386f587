//! Versions that have waited longer than they should (issue 44): a wait
//! that nothing explains any more, such as a shard whose worker stopped
//! releasing. Each kind names what should already have moved it:
//!
//! - `set_aside`: a message set aside after a transient failure whose due
//!   time (`jatuh_tempo`) passed more than [`MARGIN`] ago: its shard's
//!   release step tries a due message within [`crate::reshard::handoff::RELEASE_EVERY`];
//! - `gap`: an order whose next version has been missing longer than
//!   `GAP_TIMEOUT` + [`MARGIN`] and that is not held: with `GAP_POLICY=wait`
//!   its shard's worker holds such an order within a second;
//! - `parked`: a parked version that may go at once (the version after the
//!   stored one, or an older one: no epoch, gap or return can hold it back),
//!   not released [`MARGIN`] after it could have been.
//!
//! A held order is explained (its hold is listed with its reason), so none
//! of its versions counts, except the message holding it once replayed and
//! set aside (that one is tried when due). Read by `urutan status` (attention
//! codes `set_aside_overdue`, `gap_overdue`, `parked_overdue`) and kept in
//! the gauge `urutan_orders_overdue{kind}` by every `urutan run`
//! ([`crate::store::hold::watch`]).

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

/// How long past the moment something should have moved it a wait may last
/// before it is overdue: 30 s, 15 times the slowest of the worker's own
/// looks (a release every 0.2 s while anything is parked, a look for
/// released holds every 2 s, for overdue gaps every 1 s) plus room for a
/// busy release (at most a few hundred versions per call) and a slow
/// transaction.
pub const MARGIN: Duration = Duration::from_secs(30);

/// The kinds, as the gauge's `kind` label and `status --json` name them.
pub const KINDS: [&str; 3] = ["set_aside", "gap", "parked"];

/// Orders with a version overdue, of one kind.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct Overdue {
    /// `set_aside`, `gap` or `parked` ([`KINDS`]).
    pub kind: String,
    /// Orders with a version overdue of this kind.
    pub orders: i64,
    /// When the longest overdue of them should have moved (its due time,
    /// its gap's `GAP_TIMEOUT`, or when it could first be released).
    #[serde(serialize_with = "crate::rfc3339::one")]
    pub since: DateTime<Utc>,
    /// That order's id (for `urutan explain`).
    pub example: String,
}

/// Every kind with at least one order overdue, in [`KINDS`] order;
/// `gap_timeout` is the pipeline's `GAP_TIMEOUT`.
pub async fn overdue(db: &PgPool, gap_timeout: Duration) -> Result<Vec<Overdue>, sqlx::Error> {
    sqlx::query_as(
        "WITH menunggu AS (
             SELECT u.pesanan_id, u.versi, u.diparkir_pada, u.jatuh_tempo,
                    p.versi AS tersimpan, p.diperbarui_pada
             FROM urutan_parkir u LEFT JOIN pesanan p ON p.id = u.pesanan_id
             WHERE NOT EXISTS (SELECT 1 FROM urutan_tahan t
                               WHERE t.pesanan_id = u.pesanan_id
                                 AND t.message_id IS DISTINCT FROM u.message_id)
         ), terlambat (kind, pesanan_id, sejak) AS (
             SELECT 'set_aside', pesanan_id, jatuh_tempo FROM menunggu
             WHERE jatuh_tempo < now() - make_interval(secs => $1)
           UNION ALL
             SELECT 'gap', pesanan_id, min(diparkir_pada) + make_interval(secs => $2)
             FROM menunggu
             GROUP BY pesanan_id, tersimpan
             HAVING min(versi) > coalesce(tersimpan, 0) + 1
                AND min(diparkir_pada) < now() - make_interval(secs => $1 + $2)
                AND NOT urutan_celah_dilewati(pesanan_id, min(diparkir_pada))
           UNION ALL
             SELECT 'parked', pesanan_id, sejak
             FROM (SELECT m.pesanan_id,
                          greatest(m.diparkir_pada, m.diperbarui_pada,
                                   (SELECT max(l.dilewati_pada) FROM urutan_lewati l
                                    WHERE l.pesanan_id = m.pesanan_id)) AS sejak
                   FROM menunggu m
                   WHERE m.jatuh_tempo IS NULL AND m.versi <= coalesce(m.tersimpan, 0) + 1
                     AND NOT EXISTS (SELECT 1 FROM urutan_parkir w
                                     WHERE w.pesanan_id = m.pesanan_id
                                       AND w.jatuh_tempo IS NOT NULL)) siap
             WHERE sejak < now() - make_interval(secs => $1)
         )
         SELECT kind, count(DISTINCT pesanan_id) AS orders, min(sejak) AS since,
                (array_agg(pesanan_id ORDER BY sejak, pesanan_id))[1] AS example
         FROM terlambat GROUP BY kind
         ORDER BY array_position(ARRAY['set_aside', 'gap', 'parked'], kind)",
    )
    .bind(MARGIN.as_secs_f64())
    .bind(gap_timeout.as_secs_f64())
    .fetch_all(db)
    .await
}
