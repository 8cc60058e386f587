//! The effect tables (migrations 0009 and 0011): the routes the apply
//! transaction reads, and the dispatcher's claims and results.
//!
//! Invariants the queries keep:
//! - an effect is claimed only when it is the first pending effect of its
//!   order (in `(versi, tujuan)` order), no dead-lettered effect before it
//!   holds the order (migration 0022), and its lease is free; claims take
//!   the order's row in the schedule `urutan_efek_kepala` with
//!   `FOR UPDATE SKIP LOCKED`: two dispatchers never hold the same effect,
//!   and an order never has two effects in flight;
//! - a claim bumps `percobaan`; a result is recorded only under the claim
//!   that made it (same `percobaan`, still pending), so a dispatcher whose
//!   lease expired cannot overwrite a later attempt;
//! - a pending effect stays pending until a 2xx or a dead letter is
//!   recorded: a crash anywhere leaves it to be claimed again once its lease
//!   expires (its order is due again then), and sent again with the same key.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{Acquire, PgPool};

use super::OnDead;
use super::routes::Routes;

/// One claimed effect, ready to send.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Claimed {
    pub efek: i64,
    pub pesanan_id: String,
    pub versi: i64,
    /// The applied message's id; with the URL, the idempotency key
    /// (`webhook-id`, `Idempotency-Key`: [`super::sign::idempotency_key`]).
    pub message_id: String,
    /// The body, exactly as signed and sent.
    pub isi: String,
    pub url: String,
    /// This attempt's number (1 for the first); the claim's fencing token.
    pub percobaan: i32,
    /// The apply span of its version (`urutan_efek.traceparent`), which
    /// the webhook request continues; checked before use. Not a column of
    /// the claim: read after it ([`claim`]).
    #[sqlx(default)]
    pub traceparent: Option<String>,
}

/// What to record for an attempt.
#[derive(Debug, Clone)]
pub enum Recorded {
    /// Answered 2xx.
    Sent { code: u16 },
    /// Try again after `after` (lease released).
    Retry {
        code: Option<u16>,
        answer: String,
        after: Duration,
    },
    /// Given up: dead-lettered with the last answer or error.
    Dead { code: Option<u16>, answer: String },
}

/// What changed when a dispatcher wrote its routes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sync {
    Unchanged,
    /// The previous routes (as `status=host` lines, secrets left out).
    Replaced {
        before: Vec<String>,
    },
}

/// Makes `routes` the routes in force (one transaction; concurrent writers
/// are serialised by a table lock that apply transactions, which only
/// read the table, do not wait for).
pub async fn sync_routes(pool: &PgPool, routes: &Routes) -> Result<Sync, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    let mut tx = conn.begin().await?;
    sqlx::query("LOCK TABLE urutan_efek_rute IN EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await?;
    let wanted: Vec<(String, String)> = routes
        .0
        .iter()
        .map(|r| (r.status.as_sql().to_owned(), r.url.as_str().to_owned()))
        .collect();
    let mut current: Vec<(String, String)> = sqlx::query_as(
        "SELECT r.status, t.url FROM urutan_efek_rute r JOIN urutan_efek_tujuan t USING (tujuan)",
    )
    .fetch_all(&mut *tx)
    .await?;
    let mut sorted = wanted.clone();
    sorted.sort();
    current.sort();
    if sorted == current {
        tx.commit().await?;
        return Ok(Sync::Unchanged);
    }
    let (statuses, urls): (Vec<String>, Vec<String>) = wanted.into_iter().unzip();
    sqlx::query(
        "INSERT INTO urutan_efek_tujuan (url) SELECT DISTINCT u FROM unnest($1::text[]) u \
         ON CONFLICT (url) DO NOTHING",
    )
    .bind(&urls)
    .execute(&mut *tx)
    .await?;
    sqlx::query("DELETE FROM urutan_efek_rute")
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "INSERT INTO urutan_efek_rute (status, tujuan) \
         SELECT DISTINCT w.status, t.tujuan FROM unnest($1::text[], $2::text[]) w(status, url) \
         JOIN urutan_efek_tujuan t ON t.url = w.url",
    )
    .bind(&statuses)
    .bind(&urls)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    let before = current
        .iter()
        .map(|(status, url)| match url::Url::parse(url) {
            Ok(u) => format!("{status}={}", super::routes::redact(&u)),
            Err(_) => format!("{status}=?"),
        })
        .collect();
    Ok(Sync::Replaced { before })
}

/// The routes in force, as `(status, url)` pairs (sorted).
pub async fn current_routes(pool: &PgPool) -> Result<Vec<(String, String)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT r.status, t.url FROM urutan_efek_rute r JOIN urutan_efek_tujuan t USING (tujuan) \
         ORDER BY 1, 2",
    )
    .fetch_all(pool)
    .await
}

/// Claims at most `limit` effects that may go now (see the module doc) for
/// `lease`, on behalf of `owner`: `urutan_efek_klaim` (migration 0011)
/// reads the orders that are due from the schedule `urutan_efek_kepala`,
/// soonest first, and takes each one's first pending effect. Its work is
/// O(`limit`), whatever the backlog: the claim it replaced walked the
/// pending effects oldest first until it had `limit` heads, which with
/// fewer heads free than asked for (the common case: each finished send
/// wakes a claim for one slot) meant the whole backlog, about 2 s per claim
/// at 37,000 pending, and a dispatcher that never caught up.
pub async fn claim(
    pool: &PgPool,
    limit: i64,
    lease: Duration,
    owner: &str,
) -> Result<Vec<Claimed>, sqlx::Error> {
    let limit = i32::try_from(limit).unwrap_or(i32::MAX);
    let mut claimed: Vec<Claimed> = sqlx::query_as("SELECT * FROM urutan_efek_klaim($1, $2, $3)")
        .bind(limit)
        .bind(lease.as_secs_f64())
        .bind(owner)
        .fetch_all(pool)
        .await?;
    if !claimed.is_empty()
        && let Err(e) = read_traceparents(pool, &mut claimed).await
    {
        // The claim stands: their webhooks start new traces.
        tracing::warn!(error = %e, "cannot read the claimed effects' trace context");
    }
    Ok(claimed)
}

/// Fills in the trace context of `claimed` (`urutan_efek.traceparent`), in
/// a statement of its own after the claim (whose function's result type
/// stays as it is). At most 56 bytes are read: a valid one is 55.
async fn read_traceparents(pool: &PgPool, claimed: &mut [Claimed]) -> Result<(), sqlx::Error> {
    let ids: Vec<i64> = claimed.iter().map(|c| c.efek).collect();
    let found: Vec<(i64, Option<String>)> =
        sqlx::query_as("SELECT efek, left(traceparent, 56) FROM urutan_efek WHERE efek = ANY($1)")
            .bind(&ids)
            .fetch_all(pool)
            .await?;
    let found: BTreeMap<i64, Option<String>> = found.into_iter().collect();
    for effect in claimed {
        effect.traceparent = found.get(&effect.efek).cloned().flatten();
    }
    Ok(())
}

/// What recording a result did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// The claim was lost meanwhile (lease expired and claimed again, or
    /// settled): nothing recorded.
    Lost,
    Recorded,
    /// Recorded, and the dead letter made a new effect hold on its order
    /// (`EFFECTS_ON_DEAD=hold`; the order had none).
    Held,
}

/// Records the result of attempt `percobaan` of effect `efek`; with
/// [`OnDead::Hold`] a dead letter holds the order's later effects
/// (migration 0022: the hold is recorded on the effect, so every reader
/// and every dispatcher's claim sees it without the setting).
pub async fn record(
    pool: &PgPool,
    efek: i64,
    percobaan: i32,
    result: &Recorded,
    on_dead: OnDead,
) -> Result<Settled, sqlx::Error> {
    let (keadaan, code, answer, after) = match result {
        Recorded::Sent { code } => ("terkirim", Some(*code), None, Duration::ZERO),
        Recorded::Retry {
            code,
            answer,
            after,
        } => ("menunggu", *code, Some(answer.as_str()), *after),
        Recorded::Dead { code, answer } => ("gagal", *code, Some(answer.as_str()), Duration::ZERO),
    };
    let settled: String =
        sqlx::query_scalar("SELECT urutan_efek_hasil($1, $2, $3, $4, $5, $6, $7)")
            .bind(efek)
            .bind(percobaan)
            .bind(keadaan)
            .bind(code.map(i32::from))
            .bind(answer)
            .bind(after.as_secs_f64())
            .bind(on_dead == OnDead::Hold)
            .fetch_one(pool)
            .await?;
    Ok(match settled.as_str() {
        "held" => Settled::Held,
        "recorded" => Settled::Recorded,
        _ => Settled::Lost,
    })
}

/// Every effect recorded so far, by state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    pub recorded: i64,
    /// `terkirim`: the endpoint answered 2xx.
    pub sent: i64,
    /// `gagal`: dead-lettered after its attempts.
    pub dead_lettered: i64,
    /// `menunggu`: still to be sent.
    pub pending: i64,
}

/// Counts every effect by state (a full scan: for demos and checks).
pub async fn tally(pool: &PgPool) -> Result<Tally, sqlx::Error> {
    let (recorded, sent, dead_lettered, pending) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE keadaan = 'terkirim'),
                count(*) FILTER (WHERE keadaan = 'gagal'),
                count(*) FILTER (WHERE keadaan = 'menunggu')
         FROM urutan_efek",
    )
    .fetch_one(pool)
    .await?;
    Ok(Tally {
        recorded,
        sent,
        dead_lettered,
        pending,
    })
}

/// How many effects are still to be sent.
pub async fn pending(pool: &PgPool) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT count(*) FROM urutan_efek WHERE keadaan = 'menunggu'")
        .fetch_one(pool)
        .await
}

/// Per endpoint URL: (pending effects, age of the oldest pending in
/// seconds, dead-lettered effects held).
pub async fn backlog(pool: &PgPool) -> Result<Vec<(String, i64, f64, i64)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT t.url,
                count(*) FILTER (WHERE e.keadaan = 'menunggu'),
                coalesce(extract(epoch FROM now() - min(e.dibuat_pada)
                                 FILTER (WHERE e.keadaan = 'menunggu'))::float8, 0),
                count(*) FILTER (WHERE e.keadaan = 'gagal')
         FROM urutan_efek_tujuan t
         LEFT JOIN urutan_efek e ON e.tujuan = t.tujuan AND e.keadaan <> 'terkirim'
         GROUP BY t.url",
    )
    .fetch_all(pool)
    .await
}

/// Expires sent effects older than `retention`: whole id-range partitions
/// once every effect in them is sent (created ahead here too), and the
/// effects from before partitioning in bounded batches
/// ([`crate::store::expire_id_ranges`]). Returns how many went (estimated
/// for a dropped partition).
pub async fn purge_sent(pool: &PgPool, retention: Duration) -> Result<u64, sqlx::Error> {
    let mut db = pool.acquire().await?;
    crate::store::expire_id_ranges(&mut db, crate::store::IdPartitioned::Effects, retention).await
}

/// One dead-lettered effect (`keadaan = 'gagal'`: the dispatcher gave up
/// on it), as `urutan dlq list --effects` and `replay --effects` show it.
#[derive(Debug, Clone, serde::Serialize, sqlx::FromRow)]
pub struct DeadEffect {
    /// The effect's id (`replay --effects ID`).
    pub effect: i64,
    pub order_id: String,
    pub versi: i64,
    /// The applied message's id (the idempotency key is it and a hash of
    /// the endpoint: [`super::sign::idempotency_key`]).
    pub message_id: String,
    /// The endpoint, redacted ([`super::routes::redact`]): a path or query
    /// may hold a token, so the whole URL is never printed.
    pub endpoint: String,
    pub attempts: i32,
    /// The endpoint's last HTTP status (None: no answer).
    pub http_status: Option<i32>,
    /// The endpoint's last answer, or the error.
    pub answer: Option<String>,
    #[serde(serialize_with = "crate::rfc3339::option")]
    pub dead_lettered_at: Option<DateTime<Utc>>,
}

/// The columns of a [`DeadEffect`], before a `WHERE` clause.
const DEAD_EFFECT: &str =
    "SELECT e.efek AS effect, e.pesanan_id AS order_id, e.versi, e.message_id,
        t.url AS endpoint, e.percobaan AS attempts, e.kode AS http_status,
        e.jawaban AS answer, e.selesai_pada AS dead_lettered_at
    FROM urutan_efek e JOIN urutan_efek_tujuan t USING (tujuan)";

/// The dead-lettered effects, oldest dead letter first, at most `limit`:
/// only those of order `order_id`, and dead-lettered at or after `since`,
/// for each filter given.
pub async fn dead_effects(
    pool: &PgPool,
    order_id: Option<&str>,
    since: Option<DateTime<Utc>>,
    limit: i64,
) -> Result<Vec<DeadEffect>, sqlx::Error> {
    // DEAD_EFFECT is a constant: nothing of the caller's is in the text.
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "{DEAD_EFFECT} WHERE e.keadaan = 'gagal'
           AND ($1::text IS NULL OR e.pesanan_id = $1)
           AND ($2::timestamptz IS NULL OR e.selesai_pada >= $2)
         ORDER BY e.selesai_pada, e.efek LIMIT $3"
    )))
    .bind(order_id)
    .bind(since)
    .bind(limit)
    .fetch_all(pool)
    .await
    .map(redacted)
}

/// Every row's endpoint redacted (the only form that leaves this module).
fn redacted(mut rows: Vec<DeadEffect>) -> Vec<DeadEffect> {
    for row in &mut rows {
        row.endpoint = super::routes::redact_str(&row.endpoint);
    }
    rows
}

/// The dead-lettered effects whose id is in `ids` (every one with `all`),
/// in the order a replay sends them: by order, version, effect.
pub async fn dead_effects_by_id(
    pool: &PgPool,
    all: bool,
    ids: &[i64],
) -> Result<Vec<DeadEffect>, sqlx::Error> {
    // DEAD_EFFECT is a constant: nothing of the caller's is in the text.
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "{DEAD_EFFECT} WHERE e.keadaan = 'gagal' AND ($1 OR e.efek = ANY($2))
         ORDER BY e.pesanan_id, e.versi, e.efek"
    )))
    .bind(all)
    .bind(ids)
    .fetch_all(pool)
    .await
    .map(redacted)
}

/// Sets the dead-lettered effects among `ids` pending again, as if new: a
/// fresh attempt budget, due now, no lease (effects not dead-lettered are
/// left as they are).
pub async fn revive_dead(pool: &PgPool, ids: &[i64]) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE urutan_efek
         SET keadaan = 'menunggu', percobaan = 0, coba_pada = now(),
             sewa_sampai = NULL, sewa_oleh = NULL, selesai_pada = NULL
         WHERE keadaan = 'gagal' AND efek = ANY($1)",
    )
    .bind(ids)
    .execute(pool)
    .await?;
    Ok(())
}

/// Where an effect stands now, as a replay reports it.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct Outcome {
    pub efek: i64,
    /// `menunggu`, `terkirim` or `gagal`.
    pub keadaan: String,
    /// Attempts since it was (re)set pending.
    pub percobaan: i32,
    /// The last HTTP status (None: no answer, or none yet).
    pub kode: Option<i32>,
    /// The last answer or error.
    pub jawaban: Option<String>,
    /// Pending: seconds until its next try (0: due now).
    pub next_try_secs: Option<f64>,
}

/// The [`Outcome`] of each effect in `ids`, by effect id; an id without an
/// effect is left out.
pub async fn outcomes(pool: &PgPool, ids: &[i64]) -> Result<BTreeMap<i64, Outcome>, sqlx::Error> {
    let rows: Vec<Outcome> = sqlx::query_as(
        "SELECT efek, keadaan, percobaan, kode, jawaban,
                CASE WHEN keadaan = 'menunggu'
                     THEN greatest(extract(epoch FROM coba_pada - now())::float8, 0) END
                    AS next_try_secs
         FROM urutan_efek WHERE efek = ANY($1)",
    )
    .bind(ids)
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|o| (o.efek, o)).collect())
}
