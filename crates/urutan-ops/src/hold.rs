//! `urutan hold list` and `urutan hold release`: orders on hold (docs/contract.md
//! section 11). A refused version holds its order (`ON_REFUSED=hold`): its
//! later versions are recorded and wait. `urutan dlq replay` of the refused
//! message applies it and lets the rest go; `urutan hold release` resumes
//! the order without it (recorded as a skip, shown by `urutan explain`).
//! A dead-lettered effect holds its order's later effects
//! (`EFFECTS_ON_DEAD=hold`, reason `effect`; its versions go on): `urutan
//! dlq replay --effects ID` sends it again, `urutan hold release --effects`
//! skips it. Each release ends only its own kind of hold.

use anyhow::Context;
use chrono::Utc;
use clap::Subcommand;
use serde::Serialize;
use urutan::config::Settings;
use urutan::effects::hold as effects_hold;
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
    /// Resume a held order without what holds it: the refused (or missing)
    /// version is recorded as skipped, the waiting versions are applied in order. With
    /// --effects: the dead-lettered effect holding the order's later effects
    /// is skipped instead (it stays dead-lettered), and they go on in order.
    #[command(after_help = "Examples:\n  urutan hold release order-17\n  \
        urutan hold release order-17 --effects\n\n\
        To apply the refused version instead, fix what refused it and replay it:\n  \
        urutan dlq replay MESSAGE_ID\n\
        To send the dead-lettered effect instead, fix the endpoint and replay it:\n  \
        urutan dlq replay --effects EFFECT_ID")]
    Release {
        /// The held order's id.
        order_id: String,
        /// Release the order's effect hold (a dead-lettered effect), not a
        /// version hold.
        #[arg(long)]
        effects: bool,
    },
}

/// Runs `urutan hold …`.
pub async fn run(settings: &Settings, command: HoldCommand) -> anyhow::Result<()> {
    let db = open_database(settings, "urutan hold")
        .await
        .map_err(anyhow::Error::msg)?;
    match command {
        HoldCommand::List { json } => list(&db, json).await,
        HoldCommand::Release {
            order_id,
            effects: false,
        } => release(&db, &order_id).await,
        HoldCommand::Release {
            order_id,
            effects: true,
        } => release_effects(&db, &order_id).await,
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
    /// Versions waiting; for an `effect` hold, effects.
    waiting: i64,
    error: Option<&'a str>,
    /// The dead-lettered effect holding it (`effect` holds).
    #[serde(skip_serializing_if = "Option::is_none")]
    effect: Option<i64>,
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
                effect: h.effect,
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
            (None, Some(v)) if h.reason == "gap" => format!("the missing v{v}"),
            (Some(id), Some(v)) => format!("v{v} (message {})", Clean(id)),
            (None, Some(v)) => format!("v{v}"),
            (Some(id), None) => format!("message {}", Clean(id)),
            (None, None) => "-".to_owned(),
        };
        let (holding, waiting) = match h.effect {
            Some(effect) => (format!("effect {effect} of {holding}"), "effect(s)"),
            None => (holding, "version(s)"),
        };
        println!(
            "  {}: {} since {} ({} ago), held by {holding}; {} {waiting} waiting",
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
    if holds.iter().any(|h| h.effect.is_none()) {
        println!(
            "\nreplay the refused version after the fix (`urutan dlq replay MESSAGE_ID`), \
             or resume an order without it (`urutan hold release ORDER_ID`)"
        );
    }
    if holds.iter().any(|h| h.effect.is_some()) {
        println!(
            "\nsend a dead-lettered effect again after the fix (`urutan dlq replay --effects \
             EFFECT_ID`), or let the order's later effects go without it (`urutan hold release \
             ORDER_ID --effects`)"
        );
    }
    Ok(())
}

async fn release(db: &sqlx::PgPool, order: &str) -> anyhow::Result<()> {
    let released = hold::release_hold(db, order)
        .await
        .context("cannot release the hold")?;
    let Some(released) = released else {
        let effect_held = !effects_hold::holds(db, Some(order), 1)
            .await
            .context("cannot read the effect holds")?
            .is_empty();
        if effect_held {
            eprintln!(
                "order {} has no version on hold, only its effects (a dead-lettered effect): \
                 use `urutan hold release {} --effects`",
                Clean(order),
                Clean(order)
            );
        } else {
            eprintln!("order {} is not on hold", Clean(order));
        }
        return Err(Exit(crate::EXIT_ATTENTION).into());
    };
    let skipped = match (&released.message_id, released.versi) {
        (Some(id), Some(v)) => format!("v{v} (message {})", Clean(id)),
        (None, Some(v)) => format!("v{v}"),
        _ => "what held it".to_owned(),
    };
    let result = format!(
        "released without {skipped} ({}; recorded as skipped); {} waiting version(s) now go on, \
         in order",
        released.reason, released.waiting
    );
    println!("order {}: {result}", Clean(order));
    if let Some(id) = &released.message_id {
        // Its dead letter is settled (`urutan status` no longer counts it);
        // the message itself stays in the DLQ until purged.
        println!(
            "its dead letter is settled; remove it from the DLQ with `urutan dlq purge {} \
             --order {}`",
            Clean(id),
            Clean(order)
        );
    }
    let version = released
        .versi
        .map_or_else(String::new, |v| format!(" v{v}"));
    crate::audit::record_cli(
        db,
        "hold_release",
        Some(order),
        &format!("{} hold{version}", released.reason),
        &result,
    )
    .await;
    Ok(())
}

/// `urutan hold release ORDER_ID --effects`: only the effect hold.
async fn release_effects(db: &sqlx::PgPool, order: &str) -> anyhow::Result<()> {
    let skipped = effects_hold::release(db, order)
        .await
        .context("cannot release the effect hold")?;
    if skipped.is_empty() {
        let holds = effects_hold::holds(db, Some(order), 1)
            .await
            .context("cannot read the effect holds")?;
        if let Some(effect) = holds.first().and_then(|h| h.effect) {
            eprintln!(
                "the effect holding order {} (effect {effect}) is being sent again after a \
                 replay: it is sent, or dead-lettered again and then can be released",
                Clean(order)
            );
        } else if !hold::holds(db, Some(order), 1)
            .await
            .context("cannot read the holds")?
            .is_empty()
        {
            eprintln!(
                "order {}'s effects are not on hold, its versions are: use `urutan hold \
                 release {}` (without --effects)",
                Clean(order),
                Clean(order)
            );
        } else {
            eprintln!("order {}'s effects are not on hold", Clean(order));
        }
        return Err(Exit(crate::EXIT_ATTENTION).into());
    }
    let waiting = skipped.last().map_or(0, |s| s.waiting);
    crate::audit::record_cli(
        db,
        "hold_release",
        Some(order),
        &format!(
            "effect hold: effect(s) {}",
            skipped
                .iter()
                .map(|s| s.effect.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        &format!(
            "effect hold released: {} effect(s) skipped, {waiting} go on",
            skipped.len()
        ),
    )
    .await;
    let list: Vec<String> = skipped
        .iter()
        .map(|s| {
            format!(
                "effect {} of v{} (message {})",
                s.effect,
                s.versi,
                Clean(&s.message_id)
            )
        })
        .collect();
    println!(
        "released order {}'s effects without {} (dead-lettered, recorded as skipped); {waiting} \
         waiting effect(s) now go on, in order",
        Clean(order),
        list.join(", ")
    );
    Ok(())
}
