//! `dlq list --effects` and `dlq replay --effects`: dead-lettered effects
//! (webhooks the dispatcher gave up on, `urutan_efek.keadaan = 'gagal'`),
//! with the same tooling as dead-lettered messages.
//!
//! An effect is not a message: it lives only in PostgreSQL, so listing and
//! replaying it never touch the broker. Replaying sets it pending again with
//! a fresh attempt budget; the running dispatchers (`urutan effects`) send it
//! with its original idempotency key (its message id and a hash of its
//! endpoint: `urutan::effects::sign::idempotency_key`), so an endpoint that
//! had in fact processed it answers with its first result and charges
//! nothing twice. Order per order: the replayed effect goes out before any
//! later effect of its order that no dispatcher has claimed yet; later ones
//! already sent stay sent (a replay is the operator's explicit act). The
//! report says what became of each: sent, dead-lettered again (with the
//! answer) or still pending; endpoints are printed redacted.

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
    /// The effect as it is now: with its latest answer once replayed.
    #[serde(flatten)]
    effect: DeadEffect,
    /// `sent`, `dead-lettered again`, `pending` (not settled within
    /// --wait) or, with --dry-run, `would be replayed`.
    result: &'static str,
    /// Pending: seconds until its next try.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_try_secs: Option<f64>,
}

impl Replayed {
    /// What `effect` became, from its `outcome` after the wait (None: the
    /// row is gone, e.g. purged: reported pending, as nothing is known).
    fn settled(mut effect: DeadEffect, outcome: Option<&store::Outcome>) -> Self {
        let Some(o) = outcome else {
            return Self {
                effect,
                result: "pending",
                next_try_secs: None,
            };
        };
        let result = match o.keadaan.as_str() {
            "terkirim" => "sent",
            "gagal" => "dead-lettered again",
            _ => "pending",
        };
        effect.attempts = o.percobaan;
        effect.http_status = o.kode;
        effect.answer.clone_from(&o.jawaban);
        Self {
            effect,
            result,
            next_try_secs: o.next_try_secs,
        }
    }

    /// The result as a line shows it: with the answer of a dead letter,
    /// the attempts and next try of a pending one.
    fn shown(&self) -> String {
        let e = &self.effect;
        match self.result {
            "dead-lettered again" => format!("dead-lettered again ({})", answer(e)),
            "pending" if e.attempts > 0 => format!(
                "pending ({} attempt(s), last {}; next try in {:.0}s)",
                e.attempts,
                answer(e),
                self.next_try_secs.unwrap_or(0.0)
            ),
            "pending" => "pending (not tried yet)".to_owned(),
            other => other.to_owned(),
        }
    }
}

/// `HTTP 422: card declined`, or the error when there was no answer.
fn answer(e: &DeadEffect) -> String {
    urutan::effects::read::answer(e.http_status, e.answer.as_deref())
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
                next_try_secs: None,
            })
            .collect();
        return print_report(&report, args.json);
    }
    let chosen_ids: Vec<i64> = chosen.iter().map(|c| c.effect).collect();
    // Pending again, as if new: a fresh attempt budget, due now.
    store::revive_dead(&ctx.db, &chosen_ids).await?;
    let outcomes = wait_settled(ctx, &chosen_ids, args.wait).await?;
    let report: Vec<Replayed> = chosen
        .into_iter()
        .map(|effect| {
            let outcome = outcomes.get(&effect.effect);
            Replayed::settled(effect, outcome)
        })
        .collect();
    for r in &report {
        crate::audit::record_cli(
            &ctx.db,
            "dlq_replay_effect",
            Some(&r.effect.order_id),
            &format!("effect {} of v{}", r.effect.effect, r.effect.versi),
            r.result,
        )
        .await;
    }
    print_report(&report, args.json)?;
    if let Some(problem) = not_sent(&report, args.wait) {
        bail!("{problem}");
    }
    Ok(())
}

/// The error line when some replayed effect was not sent: the dead
/// letters and the pending ones, each with what to do (None: all sent).
fn not_sent(report: &[Replayed], wait: Duration) -> Option<String> {
    let count = |result: &str| report.iter().filter(|r| r.result == result).count();
    let (dead, pending) = (count("dead-lettered again"), count("pending"));
    let mut parts = Vec::new();
    if dead > 0 {
        parts.push(format!(
            "{dead} dead-lettered again (the endpoint refused it: fix the cause there, \
             then replay, or `urutan hold release ORDER_ID --effects` to go on without it)"
        ));
    }
    if pending > 0 {
        parts.push(format!(
            "{pending} still pending after {wait:?} (is `urutan effects` running? \
             `urutan explain ORDER_ID` shows its next try)"
        ));
    }
    if parts.is_empty() {
        return None;
    }
    Some(format!(
        "{} of {} replayed effect(s) not sent: {}",
        dead + pending,
        report.len(),
        parts.join("; ")
    ))
}

/// Waits up to `wait` until none of `ids` is pending; where each stands.
async fn wait_settled(
    ctx: &Ctx,
    ids: &[i64],
    wait: Duration,
) -> Result<BTreeMap<i64, store::Outcome>, sqlx::Error> {
    let start = Instant::now();
    loop {
        let outcomes = store::outcomes(&ctx.db, ids).await?;
        let pending = outcomes.values().any(|o| o.keadaan == "menunggu");
        if !pending || start.elapsed() >= wait {
            return Ok(outcomes);
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
            e.effect,
            e.order_id,
            e.versi,
            e.endpoint,
            r.shown()
        );
        println!("{}", crate::terminal::Clean(&line));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use chrono::DateTime;

    use super::*;

    fn replayed(result: &'static str, code: Option<i32>) -> Replayed {
        Replayed {
            effect: DeadEffect {
                effect: 1,
                order_id: "A-1".into(),
                versi: 1,
                message_id: "m-1".into(),
                endpoint: "https://pay.internal/capture/…".into(),
                attempts: 1,
                http_status: code,
                answer: Some("card declined".into()),
                dead_lettered_at: None,
            },
            result,
            next_try_secs: Some(3.0),
        }
    }

    #[test]
    fn a_replay_reports_each_real_outcome_and_hints_only_at_pending_ones() {
        let wait = Duration::from_secs(30);
        let all_sent = [replayed("sent", Some(200))];
        assert_eq!(not_sent(&all_sent, wait), None);
        let dead = [
            replayed("dead-lettered again", Some(422)),
            replayed("sent", Some(200)),
        ];
        assert_eq!(
            dead[0].shown(),
            "dead-lettered again (HTTP 422: card declined)"
        );
        let problem = not_sent(&dead, wait).expect("not all sent");
        assert!(problem.starts_with("1 of 2 replayed effect(s) not sent: 1 dead-lettered again"));
        assert!(
            !problem.contains("is `urutan effects` running"),
            "{problem}"
        );
        let pending = [replayed("pending", Some(503))];
        assert_eq!(
            pending[0].shown(),
            "pending (1 attempt(s), last HTTP 503: card declined; next try in 3s)"
        );
        let problem = not_sent(&pending, wait).expect("pending");
        assert!(problem.contains("1 still pending after 30s (is `urutan effects` running?"));
    }

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
            next_try_secs: None,
        };
        let value = serde_json::to_value(&replayed).expect("json");
        assert_eq!(value["dead_lettered_at"], serde_json::Value::Null);
        assert_eq!(value["result"], "sent");
        assert_eq!(value["effect"], 8812);
    }
}
