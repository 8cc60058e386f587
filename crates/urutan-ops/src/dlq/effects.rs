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
use serde::Serialize;
use serde_json::json;

use super::{Ctx, ListArgs, ReplayArgs};
use urutan::effects::store::{self, DeadEffect};

/// `urutan dlq list --effects`.
pub(super) async fn list(ctx: &Ctx, args: &ListArgs) -> anyhow::Result<()> {
    if args.reason.is_some() {
        bail!(
            "--reason names why a message was dead-lettered; an effect's reason is its answer (see the list)"
        );
    }
    let rows = store::dead_effects(
        &ctx.db,
        args.order.as_deref(),
        args.since,
        i64::from(args.limit),
    )
    .await?;
    if args.json {
        println!("{}", json!({ "effects": rows }));
    } else {
        print!("{}", crate::terminal::Lines(&table(&rows)));
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
    let chosen = store::dead_effects_by_id(&ctx.db, args.all, &ids).await?;
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
    store::revive_dead(&ctx.db, &chosen_ids).await?;
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
        let states = store::states(&ctx.db, ids).await?;
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
        let line = format!(
            "effect {} ({} versi {} -> {}): {}",
            e.effect, e.order_id, e.versi, e.endpoint, r.result
        );
        println!("{}", crate::terminal::Clean(&line));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use chrono::DateTime;

    use super::*;

    #[test]
    fn a_dead_effect_prints_its_fields_in_order_and_its_time_in_rfc3339() {
        let mut effect = DeadEffect {
            effect: 8812,
            order_id: "A-1".into(),
            versi: 3,
            message_id: "m-3".into(),
            endpoint: "http://hook".into(),
            attempts: 5,
            http_status: Some(503),
            answer: None,
            dead_lettered_at: DateTime::from_timestamp(1_800_000_000, 0),
        };
        let text = serde_json::to_string(&effect).expect("json");
        assert_eq!(
            text,
            r#"{"effect":8812,"order_id":"A-1","versi":3,"message_id":"m-3","endpoint":"http://hook","attempts":5,"http_status":503,"answer":null,"dead_lettered_at":"2027-01-15T08:00:00.000Z"}"#
        );
        effect.dead_lettered_at = None;
        let replayed = Replayed {
            effect,
            result: "sent",
        };
        let value = serde_json::to_value(&replayed).expect("json");
        assert_eq!(value["dead_lettered_at"], serde_json::Value::Null);
        assert_eq!(value["result"], "sent");
        assert_eq!(value["effect"], 8812);
    }
}
