//! `dlq list`: the records of what is in the DLQ now, as a table or JSON;
//! the queue itself is only read to record messages that have no record
//! yet (see [`walk`](super::walk)).

use std::fmt::Write as _;

use serde_json::json;

use super::{Ctx, ListArgs};
use urutan::store::dead_letter::{self, Listed};

/// `urutan dlq list`.
pub(super) async fn list(ctx: &Ctx, args: &ListArgs) -> anyhow::Result<()> {
    let queue = ctx.names.dead_letter_queue();
    // The queue only adds what has no record yet; without the broker the
    // records still answer.
    let depth = match ctx.broker().await {
        Ok(conn) => {
            let depth = ctx.record_unrecorded(&conn).await;
            let _ = urutan::broker::call("connection.close", conn.close(200, "done".into())).await;
            match depth {
                Ok(depth) => Some(depth),
                Err(e) => {
                    eprintln!("warning: {e}: listing the records only");
                    None
                }
            }
        }
        Err(e) => {
            eprintln!("warning: {e:#}: listing the records only");
            None
        }
    };
    let rows = dead_letter::list_unresolved(
        &ctx.db,
        args.reason.as_deref(),
        args.order.as_deref(),
        args.since,
        args.limit,
    )
    .await?;
    let recorded = ctx.recorded().await?;
    if args.json {
        let out = json!({
            "queue": queue,
            "depth": depth,
            "recorded": recorded,
            "messages": rows,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    let depth_text = depth.map_or_else(|| "? (broker not read)".to_owned(), |d| d.to_string());
    println!("{queue}: {depth_text} message(s), {recorded} recorded");
    if rows.is_empty() {
        println!("no dead-lettered message matches");
        return Ok(());
    }
    print!("{}", crate::terminal::Lines(&table(&rows)));
    let settled = rows.iter().filter(|r| r.settled.is_some()).count();
    if settled > 0 {
        println!(
            "{settled} settled: nothing left to do for their versions; `urutan dlq purge \
             --settled` removes them from {queue}"
        );
    }
    if rows.len() as u32 == args.limit {
        println!("(first {} shown: --limit)", args.limit);
    }
    Ok(())
}

/// What a settled record's `settled` says, for people.
fn settled_words(how: &str) -> &str {
    match how {
        "released" => "version released past",
        "applied" => "version applied since",
        "superseded" => "a later version is stored",
        other => other,
    }
}

/// The people's table: one line per message, columns aligned.
fn table(rows: &[Listed]) -> String {
    let header = [
        "DEAD-LETTERED (UTC)",
        "SHARD",
        "REASON",
        "ORDER",
        "VERSI",
        "MESSAGE",
        "DETAIL",
    ];
    let lines: Vec<[String; 7]> = rows
        .iter()
        .map(|r| {
            [
                r.dead_lettered_at.format("%Y-%m-%d %H:%M:%S").to_string(),
                if r.shard < 0 {
                    "?".into()
                } else {
                    r.shard.to_string()
                },
                r.reason.clone(),
                r.pesanan_id.clone().unwrap_or_else(|| "-".into()),
                r.versi.map_or_else(|| "-".into(), |v| v.to_string()),
                r.message_id
                    .clone()
                    .unwrap_or_else(|| short_key(&r.delivery_key)),
                match &r.settled {
                    Some(how) => shorten(
                        &format!("(settled: {}) {}", settled_words(how), r.detail),
                        70,
                    ),
                    None => shorten(&r.detail, 70),
                },
            ]
            .map(|cell| crate::terminal::clean(&cell))
        })
        .collect();
    let mut widths = header.map(str::len);
    for line in &lines {
        for (w, cell) in widths.iter_mut().zip(line) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut row = |cells: &[&str]| {
        let mut line = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<w$}  ");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    };
    row(&header);
    for line in &lines {
        row(&line.each_ref().map(String::as_str));
    }
    out
}

/// A `sha256:` key cut to [`super::KEY_PREFIX`] characters (`show` and
/// `replay` take such a prefix).
fn short_key(key: &str) -> String {
    key.chars().take(super::KEY_PREFIX).collect()
}

fn shorten(s: &str, max: usize) -> String {
    let one_line = s.replace('\n', " ");
    if one_line.chars().count() <= max {
        return one_line;
    }
    let mut cut: String = one_line.chars().take(max - 1).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use chrono::DateTime;
    use urutan::store::dead_letter::Subject;

    use super::*;

    #[test]
    fn the_table_aligns_columns() {
        let row = |reason: &str, order: Option<&str>| Listed {
            id: 1,
            subject: Subject {
                delivery_key: "m-1".into(),
                message_id: Some("m-1".into()),
                pesanan_id: order.map(Into::into),
                versi: Some(3),
                shard: 2,
                reason: reason.into(),
                detail: "x".repeat(100),
                last_error: None,
            },
            dead_lettered_at: DateTime::from_timestamp(1_800_000_000, 0).expect("time"),
            recorded_by: "worker".into(),
            settled: None,
        };
        let text = table(&[row("invalid_json", Some("A")), row("delivery_limit", None)]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(
            lines[0].starts_with("DEAD-LETTERED (UTC)  SHARD  REASON          ORDER"),
            "{text}"
        );
        assert!(lines[2].contains("delivery_limit  -      3"), "{text}");
        assert!(lines[1].ends_with('…'), "{text}");
    }
}
