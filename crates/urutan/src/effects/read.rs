//! What operators read of the effects: the summary `urutan status` shows,
//! and one order's effects for `urutan explain`. Read only; endpoints leave
//! this module redacted ([`super::routes::redact`]).

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

use super::routes::redact_str;

/// The effects as a whole, for `urutan status`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// Effects still to be sent (`menunggu`).
    pub pending: i64,
    /// When the oldest pending effect was recorded.
    #[serde(serialize_with = "crate::rfc3339::option")]
    pub oldest_pending_at: Option<DateTime<Utc>>,
    /// Dead-lettered effects (`gagal`), as `urutan dlq list --effects` lists them.
    pub dead_lettered: i64,
    /// Of those, the ones no operator has dealt with: not released since
    /// their last dead letter (`urutan hold release --effects` records a
    /// skip). These need attention.
    pub unresolved: i64,
}

/// Reads the [`Summary`]: the pending ones through their partial index;
/// the dead-lettered ones are few, but have no index of their own (a scan
/// of `urutan_efek`, as the dispatcher's gauges do).
pub async fn summary(db: &PgPool) -> Result<Summary, sqlx::Error> {
    let (pending, oldest_pending_at): (i64, Option<DateTime<Utc>>) = sqlx::query_as(
        "SELECT count(*), min(dibuat_pada) FROM urutan_efek WHERE keadaan = 'menunggu'",
    )
    .fetch_one(db)
    .await?;
    // A release writes `urutan_lewati` (alasan `effect`, galat `effect <id>: …`,
    // migration 0022): a skip after the last dead letter resolves it.
    let (dead_lettered, unresolved): (i64, i64) = sqlx::query_as(
        "SELECT count(*),
                count(*) FILTER (WHERE NOT EXISTS (
                    SELECT 1 FROM urutan_lewati l
                    WHERE l.pesanan_id = e.pesanan_id AND l.alasan = 'effect'
                      AND l.galat LIKE 'effect ' || e.efek || ':%'
                      AND l.dilewati_pada >= e.selesai_pada))
         FROM urutan_efek e WHERE e.keadaan = 'gagal'",
    )
    .fetch_one(db)
    .await?;
    Ok(Summary {
        pending,
        oldest_pending_at,
        dead_lettered,
        unresolved,
    })
}

/// The effects of one endpoint that were not sent, for the console.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct Endpoint {
    /// The URL, redacted ([`super::routes::redact`]).
    pub endpoint: String,
    /// To be sent (`menunggu`).
    pub pending: i64,
    /// Of those, the ones whose last attempt failed (retrying).
    pub failing: i64,
    /// When the oldest pending effect was recorded.
    #[serde(serialize_with = "crate::rfc3339::option")]
    pub oldest_pending_at: Option<DateTime<Utc>>,
    /// Given up on (`gagal`), as `urutan dlq list --effects` lists them.
    pub dead_lettered: i64,
    /// The last failed answer of a pending or dead-lettered effect, if any.
    pub last_failure: Option<String>,
}

/// Every endpoint with its effects not sent, through the index of the
/// effects not sent (the sent ones are never read), by redacted URL.
pub async fn by_endpoint(db: &PgPool) -> Result<Vec<Endpoint>, sqlx::Error> {
    let mut rows: Vec<Endpoint> = sqlx::query_as(
        "SELECT t.url AS endpoint,
                count(e.efek) FILTER (WHERE e.keadaan = 'menunggu') AS pending,
                count(e.efek) FILTER (WHERE e.keadaan = 'menunggu' AND e.percobaan > 0) AS failing,
                min(e.dibuat_pada) FILTER (WHERE e.keadaan = 'menunggu') AS oldest_pending_at,
                count(e.efek) FILTER (WHERE e.keadaan = 'gagal') AS dead_lettered,
                (array_agg(e.jawaban ORDER BY e.coba_pada DESC)
                    FILTER (WHERE e.percobaan > 0 AND e.jawaban IS NOT NULL))[1] AS last_failure
         FROM urutan_efek_tujuan t
         LEFT JOIN urutan_efek e
             ON e.tujuan = t.tujuan AND e.keadaan <> 'terkirim'
         GROUP BY t.tujuan, t.url",
    )
    .fetch_all(db)
    .await?;
    for row in &mut rows {
        row.endpoint = redact_str(&row.endpoint);
    }
    rows.sort_by(|a, b| a.endpoint.cmp(&b.endpoint));
    Ok(rows)
}

/// Where one effect of an order stands.
#[derive(Debug, Clone, PartialEq)]
pub enum State {
    /// Answered 2xx.
    Sent {
        at: Option<DateTime<Utc>>,
        code: Option<i32>,
    },
    /// To be sent: attempts so far, seconds until the next try (0: due),
    /// and the last answer of a failed attempt.
    Pending {
        attempts: i32,
        next_try_secs: f64,
        last: Option<String>,
    },
    /// Waits behind the order's dead-lettered effect `behind` (an effect hold).
    Held { behind: i64 },
    /// Given up on, with the last answer; `holding`: it holds the order's
    /// later effects.
    DeadLettered { answer: String, holding: bool },
}

/// One effect of an order, as `urutan explain` lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct OrderEffect {
    pub effect: i64,
    pub versi: i64,
    /// Redacted.
    pub endpoint: String,
    pub state: State,
}

#[derive(sqlx::FromRow)]
struct Row {
    efek: i64,
    versi: i64,
    url: String,
    keadaan: String,
    percobaan: i32,
    kode: Option<i32>,
    jawaban: Option<String>,
    next_try_secs: f64,
    selesai_pada: Option<DateTime<Utc>>,
    ditahan: bool,
}

/// The effects of `order`, by version then endpoint (the order they go
/// in), at most `limit`.
pub async fn of_order(
    db: &PgPool,
    order: &str,
    limit: i64,
) -> Result<Vec<OrderEffect>, sqlx::Error> {
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT e.efek, e.versi, t.url, e.keadaan, e.percobaan, e.kode, e.jawaban,
                greatest(extract(epoch FROM greatest(e.coba_pada, e.sewa_sampai) - now()), 0)::float8
                    AS next_try_secs,
                e.selesai_pada, e.ditahan_sejak IS NOT NULL AS ditahan
         FROM urutan_efek e JOIN urutan_efek_tujuan t USING (tujuan)
         WHERE e.pesanan_id = $1
         ORDER BY e.versi, e.tujuan LIMIT $2",
    )
    .bind(order)
    .bind(limit)
    .fetch_all(db)
    .await?;
    let mut holding: Option<i64> = None;
    Ok(rows
        .into_iter()
        .map(|r| {
            let state = state(&r, holding);
            if r.ditahan && holding.is_none() {
                holding = Some(r.efek);
            }
            OrderEffect {
                effect: r.efek,
                versi: r.versi,
                endpoint: redact_str(&r.url),
                state,
            }
        })
        .collect())
}

/// `r`'s state, `holding` the order's earlier effect that holds it, if any.
fn state(r: &Row, holding: Option<i64>) -> State {
    match (r.keadaan.as_str(), holding) {
        ("terkirim", _) => State::Sent {
            at: r.selesai_pada,
            code: r.kode,
        },
        ("gagal", _) => State::DeadLettered {
            answer: answer(r.kode, r.jawaban.as_deref()),
            holding: r.ditahan,
        },
        (_, Some(behind)) => State::Held { behind },
        _ => State::Pending {
            attempts: r.percobaan,
            next_try_secs: r.next_try_secs,
            last: (r.percobaan > 0).then(|| answer(r.kode, r.jawaban.as_deref())),
        },
    }
}

/// `HTTP 422: card declined` (cut short, one line), or the error.
pub fn answer(code: Option<i32>, text: Option<&str>) -> String {
    let text: String = text
        .unwrap_or("")
        .chars()
        .take(80)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let text = text.trim();
    match (code, text.is_empty()) {
        (Some(code), true) => format!("HTTP {code}"),
        (Some(code), false) => format!("HTTP {code}: {text}"),
        (None, true) => "no answer".to_owned(),
        (None, false) => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(efek: i64, keadaan: &str, ditahan: bool) -> Row {
        Row {
            efek,
            versi: efek,
            url: "https://pay.internal/capture/tok".into(),
            keadaan: keadaan.into(),
            percobaan: 2,
            kode: Some(503),
            jawaban: Some("busy\nnow".into()),
            next_try_secs: 4.0,
            selesai_pada: None,
            ditahan,
        }
    }

    #[test]
    fn states_read_in_order_with_a_hold() {
        assert!(matches!(
            state(&row(1, "terkirim", false), None),
            State::Sent { .. }
        ));
        assert_eq!(
            state(&row(2, "menunggu", false), None),
            State::Pending {
                attempts: 2,
                next_try_secs: 4.0,
                last: Some("HTTP 503: busy now".into())
            }
        );
        assert_eq!(
            state(&row(3, "gagal", true), None),
            State::DeadLettered {
                answer: "HTTP 503: busy now".into(),
                holding: true
            }
        );
        assert_eq!(
            state(&row(4, "menunggu", false), Some(3)),
            State::Held { behind: 3 }
        );
        assert_eq!(answer(None, None), "no answer");
        assert_eq!(answer(Some(422), None), "HTTP 422");
    }
}
