//! Effect holds (`EFFECTS_ON_DEAD=hold`, docs/contract.md section 11): a
//! dead-lettered effect holds its order's later effects, never its
//! versions. The hold is recorded on the effect (`urutan_efek.ditahan_sejak`,
//! migration `20261205000022_effect_holds.sql`) by the dispatcher that
//! dead-lettered it, so these readers need no setting.
//!
//! Invariants: an order is effect-held while one of its effects with
//! `ditahan_sejak` set is dead-lettered, or pending again after a replay
//! (the hold stays until it is sent); the hold ends when that effect is sent
//! or released ([`release`]: recorded as a skip in `urutan_lewati`, reason
//! `effect`; the effect stays dead-lettered).

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use crate::store::hold::Hold;

/// The `reason` of an effect hold (`urutan hold list`, metrics).
pub const REASON: &str = "effect";

/// Most characters of an endpoint's answer shown with a hold.
const ANSWER_CHARS: usize = 200;

/// One order's first holding effect, as read.
#[derive(Debug, sqlx::FromRow)]
struct Row {
    order: String,
    effect: i64,
    message_id: String,
    versi: i64,
    since: DateTime<Utc>,
    keadaan: String,
    code: Option<i32>,
    answer: Option<String>,
    waiting: i64,
}

/// Orders held by an effect (all, or only `order`'s), oldest hold first,
/// at most `limit`: the order, the effect holding it (its id, version and
/// message id), since when it holds, its last answer, and how many effects
/// wait behind it. `shard` is none: an effect belongs to no shard.
pub async fn holds(db: &PgPool, order: Option<&str>, limit: i64) -> Result<Vec<Hold>, sqlx::Error> {
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT * FROM (
             SELECT DISTINCT ON (e.pesanan_id)
                    e.pesanan_id AS \"order\", e.efek AS effect, e.message_id, e.versi,
                    e.ditahan_sejak AS since, e.keadaan, e.kode AS code, e.jawaban AS answer,
                    (SELECT count(*) FROM urutan_efek w
                     WHERE w.pesanan_id = e.pesanan_id AND w.keadaan = 'menunggu'
                       AND (w.versi, w.tujuan) > (e.versi, e.tujuan)) AS waiting
             FROM urutan_efek e
             WHERE e.ditahan_sejak IS NOT NULL AND e.keadaan IN ('gagal', 'menunggu')
               AND ($1::text IS NULL OR e.pesanan_id = $1)
             ORDER BY e.pesanan_id, e.versi, e.tujuan) h
         ORDER BY since, \"order\" LIMIT $2",
    )
    .bind(order)
    .bind(limit)
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| Hold {
            error: Some(error_text(
                r.effect,
                &r.keadaan,
                r.code,
                r.answer.as_deref(),
            )),
            order: r.order,
            reason: REASON.to_owned(),
            message_id: Some(r.message_id),
            versi: Some(r.versi),
            shard: None,
            since: r.since,
            waiting: r.waiting,
            effect: Some(r.effect),
        })
        .collect())
}

/// Orders held by an effect, and when the oldest of those holds began
/// (`None`: no effect hold).
pub async fn held(db: &PgPool) -> Result<Option<(i64, DateTime<Utc>)>, sqlx::Error> {
    let (count, oldest): (i64, Option<DateTime<Utc>>) = sqlx::query_as(
        "SELECT count(DISTINCT pesanan_id), min(ditahan_sejak) FROM urutan_efek
         WHERE ditahan_sejak IS NOT NULL AND keadaan IN ('gagal', 'menunggu')",
    )
    .fetch_one(db)
    .await?;
    Ok(oldest.filter(|_| count > 0).map(|since| (count, since)))
}

/// A dead-lettered effect released from holding its order (recorded as a skip).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Skipped {
    pub effect: i64,
    pub versi: i64,
    /// The applied message's id (the effect's idempotency key).
    pub message_id: String,
    /// As recorded with the skip: the effect and its last answer.
    pub error: String,
    pub held_since: DateTime<Utc>,
    /// The order's effects still to be sent, which now go on in order.
    pub waiting: i64,
}

/// Ends `order`'s effect hold without its dead-lettered effect(s): each
/// stays dead-lettered (`urutan dlq list --effects`), no longer holds, and
/// is recorded as a skip; the order's later effects go on in order. Empty
/// if no dead-lettered effect holds the order (one being replayed is not
/// released: it is sent, or dead-lettered again).
pub async fn release(db: &PgPool, order: &str) -> Result<Vec<Skipped>, sqlx::Error> {
    sqlx::query_as(
        "SELECT efek AS effect, versi, message_id, galat AS error, ditahan_sejak AS held_since,
                menunggu AS waiting
         FROM urutan_efek_lepaskan($1)",
    )
    .bind(order)
    .fetch_all(db)
    .await
}

/// What holds, as `urutan hold list` and `urutan explain` show it: the
/// effect, its last answer (cut short), or that its replay is under way.
fn error_text(effect: i64, keadaan: &str, code: Option<i32>, answer: Option<&str>) -> String {
    let answer: String = answer
        .unwrap_or("")
        .chars()
        .take(ANSWER_CHARS)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let last = match code {
        Some(code) => format!("HTTP {code}: {answer}"),
        None if answer.is_empty() => "no answer".to_owned(),
        None => answer,
    };
    let last = last.trim_end();
    if keadaan == "menunggu" {
        format!("effect {effect}: replayed, being sent again (last: {last})")
    } else {
        format!("effect {effect}: {last}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hold_names_the_effect_and_its_last_answer() {
        assert_eq!(
            error_text(7, "gagal", Some(422), Some("card declined\nagain")),
            "effect 7: HTTP 422: card declined again"
        );
        assert_eq!(
            error_text(7, "gagal", None, Some("connection refused")),
            "effect 7: connection refused"
        );
        assert_eq!(error_text(7, "gagal", None, None), "effect 7: no answer");
        assert_eq!(
            error_text(8, "menunggu", Some(404), None),
            "effect 8: replayed, being sent again (last: HTTP 404:)"
        );
        let long = "x".repeat(1000);
        assert!(error_text(1, "gagal", Some(400), Some(&long)).len() < 250);
    }
}
