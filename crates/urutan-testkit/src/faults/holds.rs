//! The holds soak (issue 44 item 4, `cargo bench --bench faults -- --holds`):
//! the fault soak with a handler that sometimes asks to retry and sometimes
//! refuses ([`HANDLER`]), `ON_REFUSED=hold`, `GAP_POLICY=wait` with every
//! other pair of an order's versions written to the outbox in reverse
//! order, effects on, and an operator ([`operate`]) that deals with every
//! hold as `urutan hold list` shows it: a refused version is fixed and
//! replayed (`urutan dlq replay`), or the order released without it (`urutan
//! hold release`, recorded as a skip) once none of its later versions is
//! still on its way; a gap hold is released once its missing version is
//! not on its way. At the end, after the drain, [`nothing_waits`]: nothing
//! is held, parked or set aside without `urutan hold list` or `urutan status`
//! listing it with its reason, and no version is unapplied while the one
//! before it is applied (or skipped).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::faults::check::Check;
use crate::scratch::Scratch;

/// The soak's handler (`HANDLER_FUNCTION=soak_handler`): for about 2 % of
/// the messages it asks to retry (SQLSTATE `URTRY`) except in one second of
/// four, so most are applied on a later attempt and some run out of
/// attempts (refused: held, then dealt with by the operator); for about
/// 0.5 % it refuses until the operator "fixes" it (`soak_fixed`). Probes
/// (the recovery measurement) and direct versions are never refused.
pub const HANDLER: &str = "
CREATE TABLE IF NOT EXISTS soak_fixed (message_id TEXT PRIMARY KEY);
CREATE OR REPLACE FUNCTION soak_handler(event jsonb) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    h INT := abs(hashtext(event->>'message_id')) % 1000;
BEGIN
    IF event->>'id' LIKE 'probe-%' OR event->>'id' LIKE 'D-%' THEN
        RETURN;
    END IF;
    IF h < 20 AND extract(epoch FROM clock_timestamp())::bigint % 4 <> 0 THEN
        RAISE EXCEPTION 'soak: % not yet', event->>'message_id' USING ERRCODE = 'URTRY';
    END IF;
    IF h >= 20 AND h < 25
       AND NOT EXISTS (SELECT 1 FROM soak_fixed WHERE message_id = event->>'message_id') THEN
        RAISE EXCEPTION 'soak: % refused', event->>'message_id';
    END IF;
END
$$;";

/// The workers' settings in the holds soak.
pub fn worker_env() -> Vec<(String, String)> {
    [
        ("HANDLER_FUNCTION", "soak_handler"),
        ("ON_REFUSED", "hold"),
        ("GAP_POLICY", "wait"),
        ("GAP_TIMEOUT", "2m"),
        ("RETRY_BACKOFF_MIN", "200ms"),
        ("RETRY_BACKOFF_MAX", "3s"),
        ("RETRY_MAX_ATTEMPTS", "6"),
    ]
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .into()
}

/// What the operator did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Operator {
    /// Refused versions fixed and replayed.
    pub replays: u64,
    /// Orders released without their refused version.
    pub releases: u64,
    /// Gap holds released.
    pub gap_releases: u64,
    /// Effect holds replayed.
    pub effect_replays: u64,
    /// Holds left for later (a later version still on its way).
    pub deferred: u64,
    /// Commands that failed (each retried at the next pass).
    pub failed_commands: Vec<String>,
}

/// One hold as `urutan hold list --json` prints it.
#[derive(Debug, Clone, Deserialize)]
struct Listed {
    order: String,
    reason: String,
    message_id: Option<String>,
    versi: Option<i64>,
    effect: Option<i64>,
}

/// Where the operator's commands go: the run's broker and database.
#[derive(Debug, Clone)]
pub struct Urls {
    pub amqp: String,
    pub database: String,
    /// `SHARD_COUNT` of the run.
    pub shards: u16,
}

impl Urls {
    pub fn of(env: &Scratch, shards: u16) -> Self {
        Self {
            amqp: env.amqp_urls(),
            database: env.database_url().expose().to_owned(),
            shards,
        }
    }
}

/// Runs `urutan ARGS` against the run's broker and database.
async fn cli(env: &Urls, args: &[&str]) -> anyhow::Result<(bool, String)> {
    let out = tokio::process::Command::new(crate::faults::procs::binary())
        .args(args)
        .env("AMQP_URL", &env.amqp)
        .env("DATABASE_URL", &env.database)
        .env("SHARD_COUNT", env.shards.to_string())
        .env("NO_COLOR", "1")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), out).await??;
    Ok((
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    ))
}

/// `urutan hold list --json`.
async fn holds(env: &Urls) -> anyhow::Result<Vec<Listed>> {
    let (ok, out) = cli(env, &["hold", "list", "--json"]).await?;
    anyhow::ensure!(ok, "urutan hold list: {out}");
    let start = out.find('[').unwrap_or(0);
    Ok(serde_json::from_str(&out[start..])?)
}

/// True when no version of `order` above `versi` is still on its way: every
/// outbox row of it above `versi` was received (claimed, parked or applied).
async fn nothing_on_its_way(db: &PgPool, order: &str, versi: i64) -> anyhow::Result<bool> {
    let on_its_way: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox o
         WHERE o.agregat_id = $1 AND (o.payload->>'versi')::bigint > $2
           AND NOT EXISTS (SELECT 1 FROM pesan_diproses d
                           WHERE d.message_id = o.id::text AND d.pesanan_id = o.agregat_id)",
    )
    .bind(order)
    .bind(versi)
    .fetch_one(db)
    .await?;
    Ok(on_its_way == 0)
}

/// One pass of the operator over `urutan hold list`. `release_percent`:
/// how often a refused version is released rather than replayed (when no
/// later version is on its way).
async fn pass(
    env: &Urls,
    db: &PgPool,
    release_percent: u64,
    tally: &Mutex<Operator>,
) -> anyhow::Result<()> {
    // Fixed refused versions are replayed together at the end of the pass
    // (`urutan dlq replay` waits for their outcome: one wait, not one each).
    let mut replay: Vec<String> = Vec::new();
    for h in holds(env).await? {
        let versi = h.versi.unwrap_or(0);
        let done = match (h.reason.as_str(), &h.message_id, h.effect) {
            ("refused", Some(mid), _) => {
                let release = rand::random::<u64>() % 100 < release_percent
                    && nothing_on_its_way(db, &h.order, versi).await?;
                if release {
                    let (ok, out) = cli(env, &["hold", "release", &h.order]).await?;
                    if ok {
                        lock(tally).releases += 1;
                    }
                    (ok, out)
                } else {
                    sqlx::query("INSERT INTO soak_fixed VALUES ($1) ON CONFLICT DO NOTHING")
                        .bind(mid)
                        .execute(db)
                        .await?;
                    replay.push(mid.clone());
                    continue;
                }
            }
            ("gap", _, _) => {
                let missing_on_its_way =
                    !nothing_on_its_way(db, &h.order, versi.saturating_sub(1)).await?;
                if missing_on_its_way {
                    lock(tally).deferred += 1;
                    continue;
                }
                let (ok, out) = cli(env, &["hold", "release", &h.order]).await?;
                if ok {
                    lock(tally).gap_releases += 1;
                }
                (ok, out)
            }
            ("effect", _, Some(effect)) => {
                let id = effect.to_string();
                let (ok, out) = cli(env, &["dlq", "replay", "--effects", &id]).await?;
                if ok {
                    lock(tally).effect_replays += 1;
                }
                (ok, out)
            }
            _ => (false, format!("a hold the operator cannot read: {h:?}")),
        };
        if !done.0 {
            let mut t = lock(tally);
            if t.failed_commands.len() < 20 {
                t.failed_commands
                    .push(format!("{} ({}): {}", h.order, h.reason, done.1.trim()));
            }
        }
    }
    if !replay.is_empty() {
        let mut args = vec!["dlq", "replay", "--wait", "2s"];
        args.extend(replay.iter().map(String::as_str));
        let (ok, out) = cli(env, &args).await?;
        let mut t = lock(tally);
        if ok {
            t.replays += replay.len() as u64;
        } else if t.failed_commands.len() < 20 {
            // Replayed again at the next pass if still held.
            t.failed_commands
                .push(format!("dlq replay of {}: {}", replay.len(), out.trim()));
        }
    }
    Ok(())
}

fn lock(tally: &Mutex<Operator>) -> std::sync::MutexGuard<'_, Operator> {
    tally.lock().unwrap_or_else(|p| p.into_inner())
}

/// The operator: a pass over the holds every 2 s until `stop` (a pass that
/// fails, the database or broker away, is tried again at the next).
pub async fn operate(
    env: Urls,
    db: PgPool,
    release_percent: u64,
    tally: Arc<Mutex<Operator>>,
    stop: CancellationToken,
) {
    while !stop.is_cancelled() {
        if let Err(e) = pass(&env, &db, release_percent, &tally).await {
            let mut t = lock(&tally);
            if t.failed_commands.len() < 20 {
                t.failed_commands.push(format!("pass: {e:#}"));
            }
        }
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
        }
    }
}

/// Nothing waits, after the drain: every hold left is listed by `urutan
/// hold list` with its reason (and there should be none: the operator
/// dealt with each); every parked or set-aside row belongs to an order
/// `urutan hold list` lists, or is set aside with a due time and counted by
/// `urutan status` as retrying (none should be left either); no outbox
/// version is unapplied (nor skipped) while the one before it is applied or
/// skipped.
pub async fn nothing_waits(env: &Urls, db: &PgPool) -> anyhow::Result<(Vec<Check>, String)> {
    let listed = holds(env).await?;
    let (_, status) = cli(env, &["status"]).await?;
    let held: Vec<String> = listed
        .iter()
        .map(|h| format!("{} held ({}, v{:?})", h.order, h.reason, h.versi))
        .collect();
    let parked: Vec<(String, String, i64, bool)> = sqlx::query_as(
        "SELECT message_id, pesanan_id, versi, jatuh_tempo IS NOT NULL FROM urutan_parkir
         ORDER BY pesanan_id, versi",
    )
    .fetch_all(db)
    .await?;
    let unexplained: Vec<String> = parked
        .iter()
        .filter(|(_, order, _, set_aside)| {
            let held = listed.iter().any(|h| &h.order == order);
            let retrying = *set_aside && status.contains("retrying");
            !(held || retrying)
        })
        .map(|(mid, order, versi, set_aside)| {
            format!("{order} v{versi} ({mid}) parked, set aside: {set_aside}, listed by nothing")
        })
        .collect();
    let stuck: Vec<String> = sqlx::query_scalar(
        "WITH v AS (
             SELECT o.agregat_id AS id, (o.payload->>'versi')::bigint AS versi, o.id AS mid
             FROM outbox o),
         done AS (
             SELECT pesanan_id AS id, versi FROM pesanan_riwayat
             UNION SELECT pesanan_id, versi FROM urutan_lewati
             WHERE alasan IN ('refused', 'gap') AND versi IS NOT NULL)
         SELECT v.id || ' v' || v.versi || ' (outbox ' || v.mid || ') not applied, v'
                || (v.versi - 1) || ' is'
         FROM v
         WHERE NOT EXISTS (SELECT 1 FROM done d WHERE d.id = v.id AND d.versi = v.versi)
           AND (v.versi = 1 OR EXISTS (SELECT 1 FROM done d
                                        WHERE d.id = v.id AND d.versi = v.versi - 1))
         ORDER BY 1 LIMIT 100",
    )
    .fetch_all(db)
    .await?;
    let check = |name: &str, rows: Vec<String>| Check {
        name: name.to_owned(),
        violations: rows.len() as i64,
        examples: rows.into_iter().take(10).collect(),
    };
    Ok((
        vec![
            check(
                "nothing held at the end (each hold left is listed by `urutan hold list`)",
                held,
            ),
            check(
                "no parked or set-aside row that `urutan hold list` or `urutan status` does not explain",
                unexplained,
            ),
            check(
                "no unapplied version whose predecessor is applied or skipped",
                stuck,
            ),
        ],
        status,
    ))
}

/// Message ids the operator released without replaying them (their dead
/// letters stay in the DLQ, as `urutan hold release` leaves them).
pub async fn released_messages(db: &PgPool) -> anyhow::Result<Vec<String>> {
    Ok(sqlx::query_scalar(
        "SELECT message_id FROM urutan_lewati WHERE alasan = 'refused' AND message_id IS NOT NULL",
    )
    .fetch_all(db)
    .await?)
}
