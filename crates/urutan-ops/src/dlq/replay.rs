//! `dlq replay` and `dlq purge`: the commands that take messages out of the
//! DLQ, through a [`Walker`] (publish or drop, with the record resolved in
//! step; never a message handed back to the queue).
//!
//! The work itself ([`replay_messages`], [`purge_messages`]) prints
//! nothing and returns each message's outcome: the commands print it, the
//! console (`urutan console`) shows it.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, IsTerminal, Write};
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::{DateTime, Utc};
use serde::Serialize;

use super::walk::{self, Published, Taken, Walker};
use super::{Ctx, PurgeArgs, ReplayArgs};
use urutan::store::dead_letter::{self, Reason, Resolved};
use urutan::store::{self, Standing};

/// How often the database is asked what became of replayed messages.
const POLL: Duration = Duration::from_millis(200);

/// What a replayed message became.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub(crate) enum Became {
    Applied {
        versi: i64,
    },
    /// Recorded as processed, not written: `stored` is as new or newer.
    Stale {
        versi: i64,
        stored: i64,
    },
    /// Its message id was processed before the replay.
    Duplicate {
        #[serde(serialize_with = "urutan::rfc3339::one")]
        processed_at: DateTime<Utc>,
    },
    /// Dead-lettered again, with a new record.
    DeadLettered {
        reason: String,
        detail: String,
    },
    /// Waiting for older versions of its order (see the README, handoff).
    Parked,
    /// Processed, not written (stale), for a message whose record holds
    /// no version (its body was never read when it was dead-lettered).
    Processed {
        order: String,
    },
    /// Not processed within `--wait` (is a pool running?).
    Pending,
    /// Not published: still in the DLQ.
    Kept {
        why: String,
    },
    /// No such message in the DLQ.
    NotFound {
        note: String,
    },
}

impl Became {
    /// It left the DLQ and was processed (or waits in order to be).
    pub(crate) fn got_through(&self) -> bool {
        matches!(
            self,
            Self::Applied { .. }
                | Self::Stale { .. }
                | Self::Duplicate { .. }
                | Self::Parked
                | Self::Processed { .. }
        )
    }

    /// One line for the operator, e.g. `applied (v2 is now the stored state)`.
    pub(crate) fn describe(&self) -> String {
        match self {
            Self::Applied { versi } => format!("applied (v{versi} is now the stored state)"),
            Self::Stale { versi, stored } => {
                format!("stale: v{stored} is newer (v{versi} not written)")
            }
            Self::Duplicate { processed_at } => {
                let at = urutan::rfc3339::text(processed_at);
                format!("duplicate: its message id was already processed at {at}")
            }
            Self::DeadLettered { reason, detail } => {
                format!("dead-lettered again: {reason}: {detail}")
            }
            Self::Parked => "parked: waiting for an older version of its order".into(),
            Self::Processed { order } => {
                format!(
                    "processed for order {order}, not written: a newer version is stored (stale)"
                )
            }
            Self::Pending => "not processed yet (is `urutan run` running?)".into(),
            Self::Kept { why } => format!("not replayed, still in the DLQ: {why}"),
            Self::NotFound { note } => note.clone(),
        }
    }
}

/// One replayed (or selected) message.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Replayed {
    pub key: String,
    pub message_id: Option<String>,
    pub pesanan_id: Option<String>,
    pub versi: Option<i64>,
    pub routing_key: Option<String>,
    #[serde(flatten)]
    pub became: Became,
    /// Its record before the replay (a new record with the key is a new dead letter).
    #[serde(skip)]
    old_row: i64,
}

/// A message asked for: its message id (or delivery key), and its order
/// (`None`: the message with that id of every order: dedup is per (order,
/// message id), so two orders may dead-letter messages with one id).
pub(crate) type Wanted = (String, Option<String>);

/// The (key, order) and (message id, order) of each message a walk took:
/// what [`Selection`]'s wanted messages are compared with.
type Met = HashSet<(String, Option<String>)>;

/// Which messages a replay (or a purge) takes.
pub(crate) struct Selection {
    wanted: Vec<Wanted>,
    /// For each id wanted of every order: the orders of its unresolved
    /// records ([`Selection::prepare`]), so a walk stops once it met them all.
    expected: HashMap<String, Vec<Option<String>>>,
    reason: Option<String>,
    all: bool,
    /// Only the messages of this order (`dlq purge --order`); with no id
    /// and no reason: every message of the order.
    order: Option<String>,
}

impl Selection {
    /// The messages `wanted` names.
    pub(crate) fn messages(wanted: Vec<Wanted>) -> Self {
        Self {
            wanted,
            expected: HashMap::new(),
            reason: None,
            all: false,
            order: None,
        }
    }

    /// Reads which orders have a message with each id wanted of every
    /// order (before a walk).
    async fn prepare(&mut self, db: &sqlx::PgPool) -> Result<(), sqlx::Error> {
        for (id, order) in &self.wanted {
            if order.is_none() && !self.expected.contains_key(id) {
                let orders = dead_letter::unresolved_orders(db, id).await?;
                self.expected.insert(id.clone(), orders);
            }
        }
        Ok(())
    }

    /// Whether `met` holds the wanted message `(id, order)`: of an order
    /// asked for, that one; of every order, every one recorded (at least one).
    fn met(&self, (id, order): &Wanted, met: &Met) -> bool {
        match order {
            Some(_) => met.contains(&(id.clone(), order.clone())),
            None => match self.expected.get(id).filter(|orders| !orders.is_empty()) {
                Some(orders) => orders
                    .iter()
                    .all(|o| met.contains(&(id.clone(), o.clone()))),
                None => met.iter().any(|(i, _)| i == id),
            },
        }
    }

    /// Only ids were asked for, and every one was met.
    fn found_all(&self, met: &Met) -> bool {
        !self.all
            && self.reason.is_none()
            && !self.wanted.is_empty()
            && self.wanted.iter().all(|w| self.met(w, met))
    }

    /// The messages asked for that the walk met none of.
    fn missing<'s>(&'s self, met: &'s Met) -> impl Iterator<Item = &'s Wanted> + 's {
        self.wanted.iter().filter(|(id, order)| {
            !met.iter()
                .any(|(i, o)| i == id && (order.is_none() || o == order))
        })
    }

    fn matches(&self, taken: &Taken) -> bool {
        if let Some(order) = &self.order {
            if taken.order.as_ref() != Some(order) {
                return false;
            }
            if self.wanted.is_empty() && self.reason.is_none() {
                return true; // every message of the order
            }
        }
        let row = taken.row.as_ref();
        let message_id = row.and_then(|r| r.message_id.as_deref());
        let wanted = |(id, order): &Wanted| {
            (*id == taken.key || Some(id.as_str()) == message_id)
                && (order.is_none() || *order == taken.order)
        };
        self.all
            || self.wanted.iter().any(wanted)
            || (self.reason.is_some() && row.map(|r| r.reason.as_str()) == self.reason.as_deref())
    }
}

/// `urutan dlq replay`.
pub(super) async fn replay(ctx: &Ctx, args: &ReplayArgs) -> anyhow::Result<()> {
    let mut wanted = Vec::with_capacity(args.message_ids.len());
    for id in &args.message_ids {
        wanted.push((super::full_key(&ctx.db, id).await?, args.order.clone()));
    }
    if args.dry_run {
        return super::predict::dry_run(ctx, args, &wanted).await;
    }
    let selection = Selection {
        reason: args.reason.clone(),
        all: args.all,
        ..Selection::messages(wanted)
    };
    let replayed = replay_messages(ctx, selection, args.wait).await?;
    for r in &replayed {
        let who = r.message_id.as_deref().unwrap_or(&r.key);
        let version = r.versi.map_or_else(String::new, |v| format!(", v{v}"));
        crate::audit::record_cli(
            &ctx.db,
            "dlq_replay",
            r.pesanan_id.as_deref(),
            &format!("message {}{version}", crate::terminal::clean(who)),
            &r.became.describe(),
        )
        .await;
    }
    report(ctx, &replayed, args.json)
}

/// What a walk took, in `met`.
fn meet(met: &mut Met, taken: &Taken) {
    met.insert((taken.key.clone(), taken.order.clone()));
    if let Some(id) = taken.row.as_ref().and_then(|r| r.message_id.clone()) {
        met.insert((id, taken.order.clone()));
    }
}

/// Replays the messages `selection` takes: each is published back to the
/// entry exchange and then removed from the DLQ (see [`Walker::replay`]);
/// then waits up to `wait` for what each became. A message asked for that
/// is not in the DLQ is reported [`Became::NotFound`]. Prints nothing.
pub(crate) async fn replay_messages(
    ctx: &Ctx,
    mut selection: Selection,
    wait: Duration,
) -> anyhow::Result<Vec<Replayed>> {
    selection.prepare(&ctx.db).await?;
    let conn = ctx.broker().await?;
    let mut walker = Walker::open(&conn, &ctx.db, &ctx.names, ctx.max_body_bytes()).await?;
    let mut replayed = Vec::new();
    let mut met = Met::new();
    while let Some(taken) = walker.take().await? {
        if !selection.matches(&taken) {
            walker.keep(taken).await?;
            continue;
        }
        meet(&mut met, &taken);
        replayed.push(replay_one(ctx, &walker, taken).await?);
        if selection.found_all(&met) {
            break; // the rest of the queue need not move
        }
    }
    walker.close().await?;
    let _ = urutan::broker::call("connection.close", conn.close(200, "done".into())).await;
    for wanted in selection.missing(&met) {
        replayed.push(not_found(ctx, wanted).await?);
    }
    wait_for_outcomes(ctx, &mut replayed, wait).await?;
    Ok(replayed)
}

/// Publishes one message back; its outcome is filled in later.
async fn replay_one(ctx: &Ctx, walker: &Walker<'_>, taken: Taken) -> anyhow::Result<Replayed> {
    let row = taken.row.clone();
    let message_id = row.as_ref().and_then(|r| r.message_id.clone());
    let pesanan_id = taken.order.clone();
    // A message whose id is already processed for its order ends
    // `duplicate`: nothing in the database would show it afterwards, so ask
    // before. (Dedup is per (order, message id): the id processed for
    // another order does not count.)
    let processed_at = match (&message_id, pesanan_id.as_deref()) {
        (Some(id), Some(order)) => store::processed_at(&ctx.db, id, order).await?,
        _ => None,
    };
    let key = taken.key.clone();
    let published = walker.replay(taken).await?;
    let (routing_key, became) = match (published, processed_at) {
        (Published::Kept(why), _) => (None, Became::Kept { why }),
        (Published::Confirmed { routing_key }, Some(at)) => {
            (Some(routing_key), Became::Duplicate { processed_at: at })
        }
        (Published::Confirmed { routing_key }, None) => (Some(routing_key), Became::Pending),
    };
    Ok(Replayed {
        key,
        message_id,
        pesanan_id,
        versi: row.as_ref().and_then(|r| r.versi),
        routing_key,
        became,
        old_row: row.map_or(0, |r| r.id),
    })
}

/// Why `id` (of `order`), asked for, is not in the DLQ: how its record
/// was resolved.
async fn not_in_queue(ctx: &Ctx, id: &str, order: Option<&str>) -> Result<String, sqlx::Error> {
    let queue = ctx.names.dead_letter_queue();
    Ok(
        match dead_letter::last_resolution(&ctx.db, id, order).await? {
            Some(Resolved {
                resolution,
                resolved_at,
            }) => {
                let at = urutan::rfc3339::text(&resolved_at);
                format!("not in {queue}: {resolution} at {at}")
            }
            None => format!("not in {queue}: no dead-lettered message has this id"),
        },
    )
}

/// A message asked for that the walk did not meet.
async fn not_found(ctx: &Ctx, (id, order): &Wanted) -> anyhow::Result<Replayed> {
    let note = not_in_queue(ctx, id, order.as_deref()).await?;
    Ok(Replayed {
        key: id.clone(),
        message_id: None,
        pesanan_id: order.clone(),
        versi: None,
        routing_key: None,
        became: Became::NotFound { note },
        old_row: 0,
    })
}

/// Polls the database until every published message has an outcome (or
/// is parked), or `wait` has passed.
async fn wait_for_outcomes(
    ctx: &Ctx,
    replayed: &mut [Replayed],
    wait: Duration,
) -> anyhow::Result<()> {
    let start = Instant::now();
    loop {
        let mut waiting = false;
        for r in replayed.iter_mut() {
            if matches!(r.became, Became::Pending | Became::Parked) {
                r.became = outcome(ctx, r).await?;
                waiting |= matches!(r.became, Became::Pending | Became::Parked);
            }
        }
        if !waiting || start.elapsed() >= wait {
            return Ok(());
        }
        tokio::time::sleep(POLL).await;
    }
}

/// What the database says about one replayed message now.
async fn outcome(ctx: &Ctx, r: &Replayed) -> Result<Became, sqlx::Error> {
    let dead =
        dead_letter::dead_lettered_again(&ctx.db, &r.key, r.pesanan_id.as_deref(), r.old_row)
            .await?;
    if let Some(Reason { reason, detail }) = dead {
        return Ok(Became::DeadLettered { reason, detail });
    }
    let (Some(id), Some(order), Some(versi)) = (&r.message_id, &r.pesanan_id, r.versi) else {
        // The record holds no version (its body was never read): what the
        // message id was processed as, if it was.
        let Some(id) = &r.message_id else {
            return Ok(Became::Pending);
        };
        return Ok(
            match store::standing_by_id(&ctx.db, id, r.pesanan_id.as_deref()).await? {
                None => Became::Pending,
                Some((_, Some(versi), _)) => Became::Applied { versi },
                Some((_, None, Some(_))) => Became::Parked,
                Some((order, None, None)) => Became::Processed { order },
            },
        );
    };
    let Standing {
        applied_by,
        parked,
        processed,
        stored,
    } = store::standing(&ctx.db, id, order, versi).await?;
    Ok(if applied_by.as_deref() == Some(id.as_str()) {
        Became::Applied { versi }
    } else if parked {
        Became::Parked
    } else if processed {
        Became::Stale {
            versi,
            stored: stored.unwrap_or(versi),
        }
    } else {
        Became::Pending
    })
}

fn report(ctx: &Ctx, replayed: &[Replayed], json: bool) -> anyhow::Result<()> {
    let failed = replayed.iter().filter(|r| !r.became.got_through()).count();
    if json {
        println!("{}", serde_json::to_string_pretty(replayed)?);
    } else if replayed.is_empty() {
        println!(
            "nothing to replay: no message in {} matches",
            ctx.names.dead_letter_queue()
        );
    } else {
        let entry = ctx.names.entry_exchange();
        println!("replayed to `{entry}`:");
        for r in replayed {
            let who = r.message_id.as_deref().unwrap_or(&r.key);
            let order = match (&r.pesanan_id, r.versi) {
                (Some(o), Some(v)) => format!(" (order {o}, v{v})"),
                (Some(o), None) => format!(" (order {o})"),
                _ => String::new(),
            };
            let line = format!("{who}{order}: {}", r.became.describe());
            println!("  {}", crate::terminal::Clean(&line));
        }
    }
    anyhow::ensure!(
        failed == 0,
        "{failed} of {} message(s) did not get through (see above)",
        replayed.len()
    );
    Ok(())
}

/// `urutan dlq purge`: the chosen messages, or the whole DLQ.
pub(super) async fn purge(ctx: &Ctx, args: &PurgeArgs) -> anyhow::Result<()> {
    if args.whole() {
        return purge_all(ctx, args).await;
    }
    let mut wanted = Vec::with_capacity(args.message_ids.len());
    for id in &args.message_ids {
        wanted.push((super::full_key(&ctx.db, id).await?, args.order.clone()));
    }
    if args.settled {
        let settled = dead_letter::settled_keys(&ctx.db, 10_000).await?;
        if settled.is_empty() && wanted.is_empty() && args.reason.is_none() {
            println!("no settled message in {}", ctx.names.dead_letter_queue());
            return Ok(());
        }
        wanted.extend(settled.into_iter().map(|key| (key, args.order.clone())));
    }
    let selection = Selection {
        reason: args.reason.clone(),
        order: args.order.clone(),
        ..Selection::messages(wanted)
    };
    if args.dry_run {
        return dry_purge(ctx, &selection).await;
    }
    // Messages named one by one are chosen already; a reason or "settled"
    // may take more than the operator thinks.
    if !args.yes && (args.reason.is_some() || args.settled) {
        confirm(&format!(
            "Remove the chosen messages from {} for good? [y/N] ",
            ctx.names.dead_letter_queue()
        ))?;
    }
    let purged = purge_messages(ctx, selection).await?;
    let queue = ctx.names.dead_letter_queue();
    if purged.is_empty() {
        println!("nothing to purge: no message in {queue} matches");
    } else {
        println!("purged from {queue}:");
    }
    for p in &purged {
        let line = format!("{}: {}", p.key, p.gone.describe());
        println!("  {}", crate::terminal::Clean(&line));
        crate::audit::record_cli(
            &ctx.db,
            "dlq_purge",
            p.order.as_deref(),
            &format!("message {}", crate::terminal::clean(&p.key)),
            &p.gone.describe(),
        )
        .await;
    }
    let failed = purged
        .iter()
        .filter(|p| matches!(p.gone, Gone::NotFound(_)))
        .count();
    anyhow::ensure!(
        failed == 0,
        "{failed} of {} message(s) asked for were not purged (see above)",
        purged.len()
    );
    Ok(())
}

/// `dlq purge --dry-run` of chosen messages: their records, from the
/// database (nothing is taken from the queue).
async fn dry_purge(ctx: &Ctx, selection: &Selection) -> anyhow::Result<()> {
    let rows = dead_letter::list_unresolved(
        &ctx.db,
        selection.reason.as_deref(),
        selection.order.as_deref(),
        None,
        u32::MAX / 2,
    )
    .await?;
    let chosen: Vec<_> = rows
        .iter()
        .filter(|r| {
            selection.wanted.is_empty()
                || selection.wanted.iter().any(|(id, order)| {
                    (*id == r.delivery_key || r.message_id.as_deref() == Some(id.as_str()))
                        && (order.is_none() || *order == r.pesanan_id)
                })
        })
        .collect();
    let queue = ctx.names.dead_letter_queue();
    if chosen.is_empty() {
        println!("dry run: no recorded message in {queue} matches; nothing would be purged");
        return Ok(());
    }
    println!(
        "dry run: would purge {} message(s) from {queue}:",
        chosen.len()
    );
    for r in chosen {
        let who = r.message_id.as_deref().unwrap_or(&r.delivery_key);
        let order = match (&r.pesanan_id, r.versi) {
            (Some(o), Some(v)) => format!(" (order {o}, v{v})"),
            (Some(o), None) => format!(" (order {o})"),
            _ => String::new(),
        };
        let settled = r
            .settled
            .as_deref()
            .map_or_else(String::new, |how| format!(", settled: {how}"));
        let line = format!("{who}{order}: {}{settled}", r.reason);
        println!("  {}", crate::terminal::Clean(&line));
    }
    Ok(())
}

/// `urutan dlq purge [--yes]`: the whole DLQ.
async fn purge_all(ctx: &Ctx, args: &PurgeArgs) -> anyhow::Result<()> {
    let queue = ctx.names.dead_letter_queue();
    let conn = ctx.broker().await?;
    let depth = walk::depth(&conn, &ctx.names).await?;
    let recorded = ctx.recorded().await?;
    if depth == 0 && recorded == 0 {
        println!("{queue} is empty: nothing to purge");
        return Ok(());
    }
    if args.dry_run {
        println!("dry run: would remove the {depth} message(s) in {queue} ({recorded} recorded)");
        return Ok(());
    }
    if !args.yes {
        confirm(&format!(
            "Remove the {depth} message(s) in {queue} for good ({recorded} recorded)? [y/N] "
        ))?;
    }
    let started = database_now(&ctx.db).await?;
    let all = Selection {
        all: true,
        ..Selection::messages(Vec::new())
    };
    let (removed, _) = remove_chosen(ctx, &conn, &all).await?;
    let _ = urutan::broker::call("connection.close", conn.close(200, "done".into())).await;
    // Records whose message is no longer in the queue (e.g. a worker that
    // crashed between its record and its reject, and then got the message
    // through): resolved too, once old enough that their message cannot
    // still be on its way into the DLQ (dead-lettering is asynchronous).
    let ghosts = urutan::store::purge_dead_letters_before(&ctx.db, started).await?;
    let removed = removed.len();
    println!("purged {removed} message(s) from {queue}; their records are marked purged");
    if ghosts > 0 {
        println!("{ghosts} record(s) whose message was no longer in {queue} marked purged too");
    }
    crate::audit::record_cli(
        &ctx.db,
        "dlq_purge",
        None,
        &format!("the whole DLQ ({queue})"),
        &format!("purged {removed} message(s) and {ghosts} record(s) without one"),
    )
    .await;
    Ok(())
}

/// What a purge of chosen messages did to one of them.
#[derive(Debug, Clone)]
pub(crate) struct Purged {
    /// Its delivery key, or the id asked for when it was not found.
    pub key: String,
    /// Its order id (the one asked for, when it was not found).
    pub order: Option<String>,
    pub gone: Gone,
}

/// How a chosen message left the DLQ, or why it did not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Gone {
    /// Taken from the DLQ and dropped; its record is marked purged.
    Removed,
    /// Not in the DLQ any more (its record outlived it, as `dlq purge`
    /// finds some): the record is marked purged.
    RecordOnly,
    /// Not in the DLQ, nothing done: why.
    NotFound(String),
}

impl Gone {
    /// One line for the operator.
    pub(crate) fn describe(&self) -> String {
        match self {
            Self::Removed => "purged: removed from the DLQ, its record marked purged".into(),
            Self::RecordOnly => "purged: no longer in the DLQ, its record marked purged".into(),
            Self::NotFound(note) => format!("nothing done: {note}"),
        }
    }
}

/// Walks the DLQ and removes the messages `selection` takes (their
/// records marked purged before each ack); every other message is kept.
/// Returns what was removed, and the keys and message ids met.
async fn remove_chosen(
    ctx: &Ctx,
    conn: &lapin::Connection,
    selection: &Selection,
) -> anyhow::Result<(Vec<Purged>, Met)> {
    let mut walker = Walker::open(conn, &ctx.db, &ctx.names, ctx.max_body_bytes()).await?;
    let mut removed = Vec::new();
    let mut met = Met::new();
    while let Some(taken) = walker.take().await? {
        if !selection.matches(&taken) {
            walker.keep(taken).await?;
            continue;
        }
        meet(&mut met, &taken);
        let (key, order) = (taken.key.clone(), taken.order.clone());
        walker.remove(taken).await?;
        removed.push(Purged {
            key,
            order,
            gone: Gone::Removed,
        });
        if selection.found_all(&met) {
            break; // the rest of the queue need not move
        }
    }
    walker.close().await?;
    Ok((removed, met))
}

/// Purges only the messages `selection` names, the way `dlq purge` purges
/// them all: each is taken from the DLQ and dropped, never handed back,
/// its record marked purged; a chosen delivery key whose message is no
/// longer in the DLQ has its record marked purged too, once old enough
/// that its message cannot still be on its way in.
/// Prints nothing.
pub(crate) async fn purge_messages(
    ctx: &Ctx,
    mut selection: Selection,
) -> anyhow::Result<Vec<Purged>> {
    selection.prepare(&ctx.db).await?;
    let conn = ctx.broker().await?;
    let started = database_now(&ctx.db).await?;
    let removed = remove_chosen(ctx, &conn, &selection).await;
    let _ = urutan::broker::call("connection.close", conn.close(200, "done".into())).await;
    let (mut purged, met) = removed?;
    for (id, order) in selection.missing(&met) {
        let order_ = order.as_deref();
        let gone = if urutan::store::purge_dead_letter_before(&ctx.db, id, order_, started).await? {
            Gone::RecordOnly
        } else {
            Gone::NotFound(not_in_queue(ctx, id, order_).await?)
        };
        purged.push(Purged {
            key: id.clone(),
            order: order.clone(),
            gone,
        });
    }
    Ok(purged)
}

/// The database's clock now: where a purge starts (see
/// [`urutan::store::purge_dead_letters_before`]).
async fn database_now(db: &sqlx::PgPool) -> Result<DateTime<Utc>, sqlx::Error> {
    sqlx::query_scalar("SELECT now()").fetch_one(db).await
}

/// Asks on the terminal; anything but `y`/`yes` stops.
fn confirm(question: &str) -> anyhow::Result<()> {
    let stdin = std::io::stdin();
    anyhow::ensure!(
        stdin.is_terminal(),
        "refusing to purge without --yes (not asked: stdin is not a terminal)"
    );
    eprint!("{question}");
    std::io::stderr().flush()?;
    let mut answer = String::new();
    stdin
        .lock()
        .read_line(&mut answer)
        .context("reading the answer")?;
    let yes = matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes");
    anyhow::ensure!(yes, "not purged");
    Ok(())
}
