//! `urutan hold list` and `urutan hold release`: orders on hold (docs/contract.md
//! section 11). A refused version holds its order (`ON_REFUSED=hold`): its
//! later versions are recorded and wait. `urutan dlq replay` of the refused
//! message applies it and lets the rest go; `urutan hold release` resumes
//! the order without it (recorded as a skip, shown by `urutan explain`).

use anyhow::Context;
use chrono::Utc;
use clap::Subcommand;
use serde::Serialize;
use urutan::config::Settings;
use urutan::store::hold;

use crate::terminal::Clean;
use crate::{Exit, clock, open_database};

/// Most holds listed.
const LISTED: i64 = 1000;

#[derive(Subcommand)]
pub enum HoldCommand {
    /// Orders on hold: the order, why (refused, gap, effect), since when, the
    /// message and version holding it, how many versions wait behind it.
    #[command(after_help = "Examples:\n  urutan hold list\n  urutan hold list --json")]
    List {
        /// JSON instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Resume a held order without what holds it: the refused version is
    /// recorded as skipped, the waiting versions are applied in order.
    #[command(after_help = "Examples:\n  urutan hold release order-17\n\n\
        To apply the refused version instead, fix what refused it and replay it:\n  \
        urutan dlq replay MESSAGE_ID")]
    Release {
        /// The held order's id.
        order_id: String,
    },
}

/// Runs `urutan hold …`.
pub async fn run(settings: &Settings, command: HoldCommand) -> anyhow::Result<()> {
    let db = open_database(settings, "urutan hold")
        .await
        .map_err(anyhow::Error::msg)?;
    match command {
        HoldCommand::List { json } => list(&db, json).await,
        HoldCommand::Release { order_id } => release(&db, &order_id).await,
    }
}

/// One hold as `--json` prints it.
#[derive(Serialize)]
struct Listed<'a> {
    order: &'a str,
    reason: &'a str,
    #[serde(serialize_with = "urutan::rfc3339::one")]
    since: chrono::DateTime<Utc>,
    message_id: Option<&'a str>,
    versi: Option<i64>,
    shard: Option<i32>,
    waiting: i64,
    error: Option<&'a str>,
}

async fn list(db: &sqlx::PgPool, json: bool) -> anyhow::Result<()> {
    let holds = hold::holds(db, None, LISTED)
        .await
        .context("cannot read the holds")?;
    if json {
        let listed: Vec<Listed<'_>> = holds
            .iter()
            .map(|h| Listed {
                order: &h.order,
                reason: &h.reason,
                since: h.since,
                message_id: h.message_id.as_deref(),
                versi: h.versi,
                shard: h.shard,
                waiting: h.waiting,
                error: h.error.as_deref(),
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&listed)?);
        return Ok(());
    }
    if holds.is_empty() {
        println!("no order is on hold");
        return Ok(());
    }
    let now = Utc::now();
    println!("{} order(s) on hold, oldest first:", holds.len());
    for h in &holds {
        let holding = match (&h.message_id, h.versi) {
            (Some(id), Some(v)) => format!("v{v} (message {})", Clean(id)),
            (None, Some(v)) => format!("v{v}"),
            (Some(id), None) => format!("message {}", Clean(id)),
            (None, None) => "-".to_owned(),
        };
        println!(
            "  {}: {} since {} ({} ago), held by {holding}; {} version(s) waiting",
            Clean(&h.order),
            h.reason,
            clock::when(h.since),
            clock::age(now, h.since),
            h.waiting,
        );
        if let Some(error) = &h.error {
            println!("      {}", Clean(error));
        }
    }
    println!(
        "\nreplay the refused version after the fix (`urutan dlq replay MESSAGE_ID`), \
         or resume an order without it (`urutan hold release ORDER_ID`)"
    );
    Ok(())
}

async fn release(db: &sqlx::PgPool, order: &str) -> anyhow::Result<()> {
    let released = hold::release_hold(db, order)
        .await
        .context("cannot release the hold")?;
    let Some(released) = released else {
        eprintln!("order {} is not on hold", Clean(order));
        return Err(Exit(crate::EXIT_ATTENTION).into());
    };
    let skipped = match (&released.message_id, released.versi) {
        (Some(id), Some(v)) => format!("v{v} (message {})", Clean(id)),
        (None, Some(v)) => format!("v{v}"),
        _ => "what held it".to_owned(),
    };
    println!(
        "released order {} without {skipped} ({}; recorded as skipped); {} waiting version(s) \
         now go on, in order",
        Clean(order),
        released.reason,
        released.waiting
    );
    Ok(())
}
