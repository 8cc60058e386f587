//! `dlq list --effects` and `dlq replay --effects`: dead-lettered effects
//! (webhooks the dispatcher gave up on, `urutan_efek.keadaan = 'gagal'`),
//! with the same tooling as dead-lettered messages.
//!
//! An effect is not a message: it lives only in PostgreSQL, so listing and
//! replaying it never touch the broker. Replaying sets it pending again with
//! a fresh attempt budget; the running dispatchers (`urutan effects`) send it
//! with its original idempotency key (its message id), so an endpoint that
//! had in fact processed it answers with its first result and charges
//! nothing twice. Order per order: the replayed effect goes out before any
//! later effect of its order that no dispatcher has claimed yet; later ones
//! already sent stay sent (a replay is the operator's explicit act).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::bail;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::json;

use super::{Ctx, ListArgs, ReplayArgs};

/// One dead-lettered effect as `list --effects` shows it.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub(super) struct DeadEffect {
    /// The effect's id (`replay --effects ID`).
    pub effect: i64,
    pub order_id: String,
    pub versi: i64,
    /// The applied message's id: the effect's idempotency key.
    pub message_id: String,
    pub endpoint: String,
    pub attempts: i32,
    /// The endpoint's last HTTP status (None: no answer).
    pub http_status: Option<i32>,
    /// The endpoint's last answer, or the error.
    pub answer: Option<String>,
    #[serde(serialize_with = "super::rfc3339::option")]
    pub dead_lettered_at: Option<DateTime<Utc>>,
}

const SELECT: &str = "SELECT e.efek AS effect, e.pesanan_id AS order_id, e.versi, e.message_id,
        t.url AS endpoint, e.percobaan AS attempts, e.kode AS http_status,
        e.jawaban AS answer, e.selesai_pada AS dead_lettered_at
    FROM urutan_efek e JOIN urutan_efek_tujuan t USING (tujuan)";

/// `urutan dlq list --effects`.
pub(super) async fn list(ctx: &Ctx, args: &ListArgs) -> anyhow::Result<()> {
    if args.reason.is_some() {
        bail!(
            "--reason names why a message was dead-lettered; an effect's reason is its answer (see the list)"
        );
    }
    // SELECT is a constant: nothing of the caller's is in the text.
    let rows: Vec<DeadEffect> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "{SELECT} WHERE e.keadaan = 'gagal'
           AND ($1::text IS NULL OR e.pesanan_id = $1)
           AND ($2::timestamptz IS NULL OR e.selesai_pada >= $2)
         ORDER BY e.selesai_pada, e.efek LIMIT $3"
    )))
    .bind(&args.order)
    .bind(args.since)
    .bind(i64::from(args.limit))
    .fetch_all(&ctx.db)
    .await?;
    if args.json {
        println!("{}", json!({ "effects": rows }));
    } else {
        print!("{}", table(&rows));
    }
    Ok(())
}

/// The text table of `list --effects`.
fn table(rows: &[DeadEffect]) -> String {
    let mut out = String::new();
    if rows.is_empty() {
        out.push_str("no dead-lettered effects\n");
        return out;
    }
    let _ = writeln!(
        out,
        "{:>8}  {:<20} {:>6}  {:<40} {:>8}  {:>4}  answer",
        "effect", "order", "versi", "endpoint", "attempts", "http"
    );
    for r in rows {
        let http = r.http_status.map_or("-".into(), |c| c.to_string());
        let answer: String = r.answer.as_deref().unwrap_or("").chars().take(60).collect();
        let answer = answer.replace('\n', " ");
        let _ = writeln!(
            out,
            "{:>8}  {:<20} {:>6}  {:<40} {:>8}  {http:>4}  {answer}",
            r.effect, r.order_id, r.versi, r.endpoint, r.attempts
        );
    }
    let _ = writeln!(
        out,
        "{} dead-lettered effect(s); `urutan dlq replay --effects ID...` (or --all) sends them again with the same idempotency key",
        rows.len()
    );
    out
}

/// What a replayed effect became.
#[derive(Debug, Serialize)]
struct Replayed {
    #[serde(flatten)]
    effect: DeadEffect,
    /// `sent`, `dead-lettered again`, `pending` (not answered within
    /// --wait) or, with --dry-run, `would be replayed`.
    result: &'static str,
}

/// `urutan dlq replay --effects`.
pub(super) async fn replay(ctx: &Ctx, args: &ReplayArgs) -> anyhow::Result<()> {
    if args.reason.is_some() {
        bail!("--reason selects dead-lettered messages; select effects by id or with --all");
    }
    let ids: Vec<i64> = args
        .message_ids
        .iter()
        .map(|id| {
            id.parse().map_err(|_| {
                anyhow::anyhow!(
                    "{id:?} is not an effect id (the number `urutan dlq list --effects` shows)"
                )
            })
        })
        .collect::<anyhow::Result<_>>()?;
    let chosen: Vec<DeadEffect> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "{SELECT} WHERE e.keadaan = 'gagal' AND ($1 OR e.efek = ANY($2))
         ORDER BY e.pesanan_id, e.versi, e.efek"
    )))
    .bind(args.all)
    .bind(&ids)
    .fetch_all(&ctx.db)
    .await?;
    let missing: Vec<String> = ids
        .iter()
        .filter(|id| !chosen.iter().any(|c| c.effect == **id))
        .map(i64::to_string)
        .collect();
    if !missing.is_empty() {
        bail!(
            "no dead-lettered effect with id {} (`urutan dlq list --effects` lists them)",
            missing.join(", ")
        );
    }
    if args.dry_run {
        let report: Vec<Replayed> = chosen
            .into_iter()
            .map(|effect| Replayed {
                effect,
                result: "would be replayed",
            })
            .collect();
        return print_report(&report, args.json);
    }
    let chosen_ids: Vec<i64> = chosen.iter().map(|c| c.effect).collect();
    // Pending again, as if new: a fresh attempt budget, due now.
    sqlx::query(
        "UPDATE urutan_efek
         SET keadaan = 'menunggu', percobaan = 0, coba_pada = now(),
             sewa_sampai = NULL, sewa_oleh = NULL, selesai_pada = NULL
         WHERE keadaan = 'gagal' AND efek = ANY($1)",
    )
    .bind(&chosen_ids)
    .execute(&ctx.db)
    .await?;
    let states = wait_settled(ctx, &chosen_ids, args.wait).await?;
    let report: Vec<Replayed> = chosen
        .into_iter()
        .map(|effect| {
            let result = match states.get(&effect.effect).map(String::as_str) {
                Some("terkirim") => "sent",
                Some("gagal") => "dead-lettered again",
                _ => "pending",
            };
            Replayed { effect, result }
        })
        .collect();
    print_report(&report, args.json)?;
    let not_sent = report.iter().filter(|r| r.result != "sent").count();
    if not_sent > 0 {
        bail!(
            "{not_sent} of {} replayed effect(s) not sent within {:?} (is `urutan effects` running? see `urutan dlq list --effects`)",
            report.len(),
            args.wait
        );
    }
    Ok(())
}

/// Waits up to `wait` until none of `ids` is pending; their states.
async fn wait_settled(
    ctx: &Ctx,
    ids: &[i64],
    wait: Duration,
) -> Result<BTreeMap<i64, String>, sqlx::Error> {
    let start = Instant::now();
    loop {
        let rows: Vec<(i64, String)> =
            sqlx::query_as("SELECT efek, keadaan FROM urutan_efek WHERE efek = ANY($1)")
                .bind(ids)
                .fetch_all(&ctx.db)
                .await?;
        let states: BTreeMap<i64, String> = rows.into_iter().collect();
        let pending = states.values().any(|s| s == "menunggu");
        if !pending || start.elapsed() >= wait {
            return Ok(states);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn print_report(report: &[Replayed], json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", json!({ "effects": report }));
        return Ok(());
    }
    if report.is_empty() {
        println!("no dead-lettered effects to replay");
    }
    for r in report {
        let e = &r.effect;
        println!(
            "effect {} ({} versi {} -> {}): {}",
            e.effect, e.order_id, e.versi, e.endpoint, r.result
        );
    }
    Ok(())
}
