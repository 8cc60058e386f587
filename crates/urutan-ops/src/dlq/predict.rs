//! `dlq replay --dry-run`: what a replay would take and what each message
//! would become, from the records and the database alone. Changes nothing,
//! takes nothing from the queue.

use serde::Serialize;
use serde_json::Value;

use super::{Ctx, ReplayArgs, Wanted, walk};
use urutan::dead_letter;
use urutan::message::{self, EntityHeader, Envelope};
use urutan::store;
use urutan::store::dead_letter::Candidate;

/// A record a replay would take, and the likely outcome.
#[derive(Debug, Serialize)]
pub(crate) struct Predicted {
    #[serde(flatten)]
    pub record: Candidate,
    /// What `dlq replay --dry-run` says of it, e.g. `would be applied (stored v1)`.
    pub prediction: String,
}

/// The unresolved records a replay would take (every one with `all`,
/// those dead-lettered for `reason`, those `wanted` names: message id or
/// delivery key, and order), oldest first, each with its predicted
/// outcome. Changes nothing.
pub(crate) async fn predictions(
    ctx: &Ctx,
    all: bool,
    reason: Option<&str>,
    wanted: &[Wanted],
) -> Result<Vec<Predicted>, sqlx::Error> {
    let records = store::dead_letter::candidates(&ctx.db, all, reason, wanted).await?;
    let mut candidates = Vec::with_capacity(records.len());
    for record in records {
        let prediction = predict(ctx, &record).await?;
        candidates.push(Predicted { record, prediction });
    }
    Ok(candidates)
}

/// `wanted`: the messages asked for, abbreviated keys completed.
pub(super) async fn dry_run(ctx: &Ctx, args: &ReplayArgs, wanted: &[Wanted]) -> anyhow::Result<()> {
    let candidates = predictions(ctx, args.all, args.reason.as_deref(), wanted).await?;
    let unrecorded = unrecorded(ctx).await;
    if args.json {
        let out = serde_json::json!({"dry_run": true, "messages": candidates, "unrecorded_in_queue": unrecorded});
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    let entry = ctx.names.entry_exchange();
    println!(
        "dry run (nothing changed): a replay would publish {} recorded message(s) to `{entry}`",
        candidates.len()
    );
    for Predicted { record, prediction } in &candidates {
        let who = record.message_id.as_deref().unwrap_or(&record.delivery_key);
        let line = format!("{who} [{}]: {prediction}", record.reason);
        println!("  {}", crate::terminal::Clean(&line));
    }
    for (id, order) in wanted {
        let found = candidates.iter().any(|p| {
            (p.record.delivery_key == *id || p.record.message_id.as_deref() == Some(id.as_str()))
                && (order.is_none() || p.record.pesanan_id == *order)
        });
        if !found {
            println!("  {}: no record in the DLQ", crate::terminal::Clean(id));
        }
    }
    if let Some(n) = unrecorded.filter(|n| *n > 0) {
        println!(
            "  and {n} message(s) in {} without a record yet (`urutan dlq list` records them)",
            ctx.names.dead_letter_queue()
        );
    }
    Ok(())
}

/// Messages in the DLQ beyond the records (`None`: the broker did not answer).
async fn unrecorded(ctx: &Ctx) -> Option<i64> {
    let conn = ctx.broker().await.ok()?;
    let depth = walk::depth(&conn, &ctx.names).await.ok();
    let _ = urutan::broker::call("connection.close", conn.close(200, "done".into())).await;
    Some(i64::from(depth?) - ctx.recorded().await.ok()?).map(|n| n.max(0))
}

/// The likely outcome of replaying `c`: the contract check run again on
/// the stored message, then the version fence against the stored state.
async fn predict(ctx: &Ctx, c: &Candidate) -> Result<String, sqlx::Error> {
    if usize::try_from(c.body_bytes).unwrap_or(0) > c.body.len() {
        return Ok("unknown: only the body's first bytes were kept".into());
    }
    let props = &c.properties.0;
    let header = c.headers.0.get(ctx.names.entity_header());
    let message_id = props.get("message_id").and_then(Value::as_str);
    let envelope = Envelope {
        message_id,
        entity_header: match header {
            None => EntityHeader::Missing,
            Some(Value::String(s)) => EntityHeader::Text(s.as_bytes()),
            Some(_) => EntityHeader::OtherType("not a string"),
        },
        delivery_mode: props
            .get("delivery_mode")
            .and_then(Value::as_u64)
            .and_then(|m| u8::try_from(m).ok()),
        timestamp: props.get("timestamp").and_then(Value::as_u64),
        body: &c.body,
        headers_bytes: if c.headers.0.get("x-urutan-truncated").is_some() {
            usize::MAX
        } else {
            0
        },
        // The record cut what nested deeper than the contract allows.
        headers_depth: if c.headers.0.to_string().contains(dead_letter::TOO_DEEP) {
            usize::MAX
        } else {
            0
        },
    };
    let event = match message::decode(&envelope, ctx.max_body_bytes()) {
        Ok(event) => event,
        Err(rejection) => {
            return Ok(format!(
                "would be dead-lettered again: {}: {}",
                rejection.reason(),
                rejection.describe(ctx.names.entity_header())
            ));
        }
    };
    // Dedup is per (order, message id): another order's claim of the id
    // does not matter.
    let processed = store::processed_at(&ctx.db, &event.message_id, &event.entity_id).await?;
    let stored = store::stored_version(&ctx.db, &event.entity_id).await?;
    let fence = if processed.is_some() {
        "duplicate: its message id was already processed for its order".to_owned()
    } else {
        match stored {
            Some(s) if s >= event.versi => format!("stale: v{s} is newer"),
            Some(s) if event.versi > s + 1 => {
                format!("applied over v{s}, or parked until an older version arrives")
            }
            Some(s) => format!("applied (stored v{s})"),
            None => "applied (a new order)".to_owned(),
        }
    };
    let handler = match (is_contract_reason(&c.reason), &c.last_error) {
        (true, _) => String::new(),
        (false, Some(e)) => format!("; it is valid, the handler failed on it before ({e})"),
        (false, None) => "; it is valid, why it was dead-lettered is not recorded".to_owned(),
    };
    let held = held_behind(ctx, &event).await?;
    Ok(format!("would be {fence}{handler}{held}"))
}

/// Most waiting versions a prediction names one by one.
const NAMED_WAITING: usize = 5;

/// What a replay of `event` means to its order's hold: the versions that
/// follow once it applies (it holds its order), or the hold it waits behind.
async fn held_behind(ctx: &Ctx, event: &message::Event) -> Result<String, sqlx::Error> {
    let holds = store::hold::holds(&ctx.db, Some(&event.entity_id), 10).await?;
    let Some(hold) = holds
        .iter()
        .find(|h| h.reason != urutan::effects::hold::REASON)
    else {
        return Ok(String::new());
    };
    if hold.message_id.as_deref() != Some(event.message_id.as_str()) {
        let by = hold
            .versi
            .map_or_else(|| "a missing version".to_owned(), |v| format!("v{v}"));
        return Ok(format!(
            "; its order is held ({}) by {by}: it waits behind that (`urutan hold list`)",
            hold.reason
        ));
    }
    let waiting: Vec<i64> = store::parked_versions(&ctx.db, &event.entity_id)
        .await?
        .into_iter()
        .map(|p| p.versi)
        .filter(|v| *v != event.versi)
        .collect();
    if waiting.is_empty() {
        return Ok("; it holds its order, and no later version waits behind it".into());
    }
    let mut named: Vec<String> = waiting
        .iter()
        .take(NAMED_WAITING)
        .map(|v| format!("v{v}"))
        .collect();
    if waiting.len() > NAMED_WAITING {
        named.push("...".into());
    }
    Ok(format!(
        "; it holds its order: once it applies, the {} waiting version(s) follow in order ({}) \
         and the hold ends",
        waiting.len(),
        named.join(", ")
    ))
}

/// A reason that is a contract rule (as opposed to the handler failing).
fn is_contract_reason(reason: &str) -> bool {
    !matches!(
        reason,
        "delivery_limit" | "database_refused" | "rejected" | "unknown"
    )
}
