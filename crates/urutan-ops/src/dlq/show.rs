//! `dlq show`: one message from its record (headers, body, reason, last
//! error, x-death). The queue is read only to record a message that has no
//! record yet, or once to fetch a message's x-death (see
//! [`walk`](super::walk)).

use std::fmt::Write as _;

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{Value, json};

use super::{Ctx, ShowArgs, walk};
use crate::terminal::{Clean, Lines};
use urutan::store::dead_letter::{self, Shown};

/// The newest record of `id` (a message id or a delivery key; of `order`,
/// if given), the one still in the DLQ first.
async fn find(ctx: &Ctx, id: &str, order: Option<&str>) -> Result<Option<Shown>, sqlx::Error> {
    let key = super::full_key(&ctx.db, id).await?;
    dead_letter::newest(&ctx.db, id, &key, order).await
}

/// `urutan dlq show`.
pub(super) async fn show(ctx: &Ctx, args: &ShowArgs) -> anyhow::Result<()> {
    let id = args.message_id.as_str();
    let order = args.order.as_deref();
    let mut found = find(ctx, id, order).await?;
    let mut note = None;
    let needs_queue = found
        .as_ref()
        .is_none_or(|r| r.resolved_at.is_none() && r.x_death.is_none());
    if needs_queue {
        let wanted = found
            .as_ref()
            .map(|r| (r.delivery_key.as_str(), r.pesanan_id.as_deref()));
        match read_queue(ctx, wanted).await {
            Ok(()) => found = find(ctx, id, order).await?,
            Err(e) if found.is_some() => note = Some(format!("x-death not read: {e:#}")),
            Err(e) => anyhow::bail!(
                "no record of a dead-lettered message {id:?}, and the DLQ cannot be read: {e:#}"
            ),
        }
    }
    let Some(shown) = found else {
        let of = order.map_or_else(String::new, |o| format!(" of order {o:?}"));
        anyhow::bail!("no dead-lettered message with id {id:?}{of} (`urutan dlq list` lists them)");
    };
    let others = other_orders(ctx, id, &shown).await?;
    if args.json {
        let mut value = serde_json::to_value(&shown)?;
        value["body"] = body_json(&shown.body);
        value["queue_note"] = json!(note);
        value["other_orders"] = json!(others);
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        let mut text = render(ctx, &shown, args.body_bytes, note.as_deref());
        for other in &others {
            let _ = writeln!(
                text,
                "also in the DLQ with this id: order {} (`urutan dlq show {} --order {}`)",
                Clean(other),
                Clean(id),
                Clean(other)
            );
        }
        print!("{}", Lines(&text));
    }
    Ok(())
}

/// The other orders with a message of id `id` in the DLQ besides the one
/// `shown` (dedup is per (order, message id): each is a message of its own).
async fn other_orders(ctx: &Ctx, id: &str, shown: &Shown) -> Result<Vec<String>, sqlx::Error> {
    let orders = dead_letter::unresolved_orders(&ctx.db, id).await?;
    Ok(orders
        .into_iter()
        .flatten()
        .filter(|o| Some(o) != shown.pesanan_id.as_ref())
        .collect())
}

/// Reads the DLQ so that the wanted message has a record and its x-death:
/// records what has no record, then (`wanted`: the key and order of a
/// message whose x-death is not read yet) walks the queue until that
/// message came by.
async fn read_queue(ctx: &Ctx, wanted: Option<(&str, Option<&str>)>) -> anyhow::Result<()> {
    let conn = ctx.broker().await?;
    ctx.record_unrecorded(&conn).await?;
    if let Some((key, order)) = wanted {
        let mut walker =
            walk::Walker::open(&conn, &ctx.db, &ctx.names, ctx.max_body_bytes()).await?;
        while let Some(taken) = walker.take().await? {
            let done = taken.key == key && taken.order.as_deref() == order;
            walker.keep(taken).await?;
            if done {
                break;
            }
        }
        walker.close().await?;
    }
    let _ = urutan::broker::call("connection.close", conn.close(200, "done".into())).await;
    Ok(())
}

/// The body as JSON: parsed if it is JSON, else text, else hex.
fn body_json(body: &[u8]) -> Value {
    match std::str::from_utf8(body) {
        Ok(text) => serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.into())),
        Err(_) => json!({ "hex": hex(body) }),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// The text `show` prints.
fn render(ctx: &Ctx, r: &Shown, body_bytes: usize, note: Option<&str>) -> String {
    let mut out = String::new();
    let mut line = |label: &str, value: String| {
        let _ = writeln!(out, "{label:<14}{}", Clean(&value));
    };
    let id = r
        .message_id
        .clone()
        .unwrap_or_else(|| format!("(none valid) key {}", r.delivery_key));
    line(
        "message",
        format!("{id}  (record #{}, by the {})", r.id, r.recorded_by),
    );
    let order = r.pesanan_id.clone().unwrap_or_else(|| "unknown".into());
    let versi = r.versi.map_or_else(|| "unknown".into(), |v| v.to_string());
    line("order", format!("{order}, versi {versi}"));
    line("reason", format!("{}: {}", r.reason, r.detail));
    if let Some(e) = &r.last_error {
        line("last error", e.clone());
    }
    let shard = if r.shard < 0 {
        "unknown".to_owned()
    } else {
        let index = u16::try_from(r.shard).unwrap_or(u16::MAX);
        format!("{} ({})", r.shard, ctx.names.shard_queue(index))
    };
    line("shard", shard);
    line("dead-lettered", time(r.dead_lettered_at));
    let state = match (&r.resolution, r.resolved_at) {
        (Some(how), Some(at)) => format!("{how} at {} (no longer in the DLQ)", time(at)),
        _ => format!("in {}", ctx.names.dead_letter_queue()),
    };
    line("state", state);
    let route = |v: &Option<String>| v.clone().unwrap_or_else(|| "?".into());
    line(
        "published to",
        format!(
            "exchange `{}`, routing key `{}`",
            route(&r.exchange),
            route(&r.routing_key)
        ),
    );
    line("properties", r.properties.0.to_string());
    let _ = writeln!(out, "headers");
    if let Value::Object(headers) = &r.headers.0 {
        // x-death below; the delivery count is the broker's, of one delivery.
        let shown = |name: &str| name != "x-death" && name != "x-delivery-count";
        for (name, value) in headers.iter().filter(|(n, _)| shown(n)) {
            let _ = writeln!(out, "  {}: {}", Clean(name), Clean(&value.to_string()));
        }
    }
    let _ = writeln!(out, "x-death");
    match (&r.x_death, note) {
        (Some(deaths), _) if !deaths.0.is_empty() => {
            for d in &deaths.0 {
                let at = d
                    .time
                    .and_then(|s| DateTime::from_timestamp(i64::try_from(s).ok()?, 0))
                    .map_or_else(|| "?".into(), time);
                let line = format!(
                    "{} from {} at {at}, count {} (exchange `{}`, routing keys {})",
                    d.reason,
                    d.queue,
                    d.count,
                    d.exchange,
                    d.routing_keys.join(", ")
                );
                let _ = writeln!(out, "  {}", Clean(&line));
            }
        }
        (_, Some(note)) => {
            let _ = writeln!(out, "  ({note})");
        }
        _ => {
            let _ = writeln!(out, "  (none: not read from the queue)");
        }
    }
    let kept = r.body.len();
    let total = usize::try_from(r.body_bytes).unwrap_or(0);
    let _ = writeln!(
        out,
        "body ({total} bytes{})",
        if kept < total {
            format!(", first {kept} kept")
        } else {
            String::new()
        }
    );
    let _ = writeln!(out, "{}", indent(&body_text(&r.body, body_bytes)));
    out
}

/// The body for people: pretty JSON, else text, else a hex dump; at most
/// `cap` bytes of it.
pub(crate) fn body_text(body: &[u8], cap: usize) -> String {
    let text = match std::str::from_utf8(body) {
        Ok(text) => match serde_json::from_str::<Value>(text) {
            Ok(json) => serde_json::to_string_pretty(&json).unwrap_or_else(|_| text.into()),
            Err(_) => text.to_owned(),
        },
        Err(_) => format!("(not UTF-8) {}", hex(body)),
    };
    if text.len() <= cap {
        return text;
    }
    let mut end = cap;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}\n… ({} more bytes; --body-bytes to see more)",
        &text[..end],
        text.len() - end
    )
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("  {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_pretty_and_capped() {
        let pretty = body_text(br#"{"id":"A","versi":2}"#, 4096);
        assert_eq!(pretty, "{\n  \"id\": \"A\",\n  \"versi\": 2\n}");
        let capped = body_text("é".repeat(100).as_bytes(), 11);
        assert!(capped.starts_with("ééééé\n… (190 more bytes"), "{capped}");
        assert_eq!(body_text(&[0xff, 0x00], 100), "(not UTF-8) ff00");
        assert_eq!(body_json(b"nope"), json!("nope"));
        assert_eq!(body_json(&[0xff]), json!({"hex": "ff"}));
    }
}
