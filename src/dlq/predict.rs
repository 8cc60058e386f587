//! `dlq replay --dry-run`: what a replay would take and what each message
//! would become, from the records and the database alone. Changes nothing,
//! takes nothing from the queue.

use serde::Serialize;
use serde_json::Value;

use super::{Ctx, ReplayArgs, walk};
use crate::message::{self, EntityHeader, Envelope};

/// A record a replay would take, and the likely outcome.
#[derive(Debug, Serialize, sqlx::FromRow)]
struct Candidate {
    delivery_key: String,
    message_id: Option<String>,
    pesanan_id: Option<String>,
    versi: Option<i64>,
    reason: String,
    last_error: Option<String>,
    #[serde(skip)]
    properties: sqlx::types::Json<Value>,
    #[serde(skip)]
    headers: sqlx::types::Json<Value>,
    #[serde(skip)]
    body: Vec<u8>,
    #[serde(skip)]
    body_bytes: i32,
    #[sqlx(skip)]
    prediction: String,
}

/// `ids`: the message ids asked for, abbreviated keys completed.
pub(super) async fn dry_run(ctx: &Ctx, args: &ReplayArgs, ids: &[String]) -> anyhow::Result<()> {
    let mut candidates: Vec<Candidate> = sqlx::query_as(
        "SELECT delivery_key, message_id, pesanan_id, versi, reason, last_error, properties,
                headers, body, body_bytes
         FROM urutan_dead_letter
         WHERE resolved_at IS NULL
           AND ($1 OR reason = $2 OR message_id = ANY($3) OR delivery_key = ANY($3))
         ORDER BY dead_lettered_at, id",
    )
    .bind(args.all)
    .bind(&args.reason)
    .bind(ids)
    .fetch_all(&ctx.db)
    .await?;
    for c in &mut candidates {
        c.prediction = predict(ctx, c).await?;
    }
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
    for c in &candidates {
        let who = c.message_id.as_deref().unwrap_or(&c.delivery_key);
        println!("  {who} [{}]: {}", c.reason, c.prediction);
    }
    for id in ids {
        let found = candidates
            .iter()
            .any(|c| c.delivery_key == *id || c.message_id.as_deref() == Some(id.as_str()));
        if !found {
            println!("  {id}: no record in the DLQ");
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
    let _ = crate::broker::call("connection.close", conn.close(200, "done".into())).await;
    Some(i64::from(depth?) - ctx.recorded().await.ok()?).map(|n| n.max(0))
}

/// The likely outcome of replaying `c`: the contract check run again on
/// the stored message, then the version fence against the stored state.
async fn predict(ctx: &Ctx, c: &Candidate) -> Result<String, sqlx::Error> {
    if usize::try_from(c.body_bytes).unwrap_or(0) > c.body.len() {
        return Ok("unknown: only the body's first bytes were kept".into());
    }
    let props = &c.properties.0;
    let header = c.headers.0.get("x-pesanan-id");
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
    };
    let event = match message::decode(&envelope, ctx.max_body_bytes()) {
        Ok(event) => event,
        Err(rejection) => {
            return Ok(format!(
                "would be dead-lettered again: {}: {rejection}",
                rejection.reason()
            ));
        }
    };
    let processed: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pesan_diproses WHERE message_id = $1)")
            .bind(&event.message_id)
            .fetch_one(&ctx.db)
            .await?;
    let stored: Option<i64> = sqlx::query_scalar("SELECT versi FROM pesanan WHERE id = $1")
        .bind(&event.entity_id)
        .fetch_optional(&ctx.db)
        .await?;
    let fence = if processed {
        "duplicate: its message id was already processed".to_owned()
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
    Ok(format!("would be {fence}{handler}"))
}

/// A reason that is a contract rule (as opposed to the handler failing).
fn is_contract_reason(reason: &str) -> bool {
    !matches!(
        reason,
        "delivery_limit" | "database_refused" | "rejected" | "unknown"
    )
}
