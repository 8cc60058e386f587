//! `urutan dlq`: the dead-letter queue for operators. What is in it and why
//! (`list`, `show`), sending messages back once their cause is fixed
//! (`replay`), and emptying it (`purge`).
//!
//! Sources of truth: the DLQ holds the messages; `urutan_dead_letter` holds
//! why each is there (a worker records it before it rejects, see
//! [`urutan::dead_letter`]). `list` and `show` read the records, so looking never puts a
//! message at risk. Only a `walk` takes messages out of the DLQ, and it
//! never hands one back (why: see its module doc); it also records any
//! message it finds without a record (dead-lettered by the broker itself)
//! and the broker's `x-death` header.
//!
//! Broker permissions, least first (see README "Dead letters"):
//! - `list`, `show`, `replay --dry-run`: none (a passive declare of the
//!   DLQ); a walk, when one is needed (messages without a record, an
//!   `x-death` not read yet): read on the DLQ, write on `amq.default`;
//! - `purge`: read on the DLQ;
//! - `replay`: read on the DLQ, write on the entry exchange and `amq.default`.

mod effects;
mod list;
mod predict;
mod replay;
pub(crate) mod show;
mod unreadable;
mod walk;

// What the console's dead-letter actions use (the commands' own code).
pub(crate) use predict::predictions;
pub(crate) use replay::{Selection, Wanted, purge_messages, replay_messages};

use std::time::Duration;

use anyhow::Context;
use chrono::{DateTime, Utc};
use clap::{ArgGroup, Args, Subcommand};
use sqlx::PgPool;

use urutan::broker::{self, BrokerError, Names};
use urutan::config::{Settings, parse_duration};
use urutan::store::dead_letter;

/// The `urutan dlq` subcommands.
#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// Dead-lettered messages now in the DLQ, oldest first, with their reasons.
    #[command(after_help = LIST_HELP)]
    List(ListArgs),
    /// One dead-lettered message: reason, headers, body, x-death.
    #[command(after_help = SHOW_HELP)]
    Show(ShowArgs),
    /// Publish dead-lettered messages back to the entry exchange and report what each became.
    #[command(after_help = REPLAY_HELP)]
    Replay(ReplayArgs),
    /// Remove dead-lettered messages for good: those named, of a reason, the
    /// settled ones, or the whole DLQ (asks first on a terminal).
    #[command(after_help = PURGE_HELP)]
    Purge(PurgeArgs),
}

const LIST_HELP: &str = "\
Examples:
  urutan dlq list
  urutan dlq list --reason invalid_json --since 2h
  urutan dlq list --order A-1042 --json | jq '.messages[].message_id'

  urutan dlq list --effects        (webhooks `urutan effects` dead-lettered)

Reads the records in PostgreSQL. Messages in the DLQ without a record (dead-lettered by the
broker itself, e.g. its delivery limit during a crash loop) are first recorded by walking the
queue, which needs read on pesanan.dlq and write on amq.default; nothing else needs a
broker permission.";

const SHOW_HELP: &str = "\
Examples:
  urutan dlq show order-17-v3
  urutan dlq show sha256:9f2c…   (a message without a valid message id: its key, from `dlq list`)
  urutan dlq show order-17-v3 --json
  urutan dlq show 42 --order A-1042   (two orders' messages with id 42: A-1042's)

Exits 1 if no dead-lettered message has that id. Two orders may dead-letter messages with one
id (dedup is per order and message id): without --order the newest is shown, and the others
are named. The first show of a message reads its x-death
from the queue (a walk: read on pesanan.dlq, write on amq.default); later ones only read the
database.";

const REPLAY_HELP: &str = "\
Examples:
  urutan dlq replay order-17-v3 order-17-v4
  urutan dlq replay 42 --order A-1042   (only A-1042's message with id 42)
  urutan dlq replay --reason database_refused --dry-run
  urutan dlq replay --all --wait 2m
  urutan dlq replay --effects 8812 8813   (effect ids from `dlq list --effects`)

Each message is published to the entry exchange (publisher confirms, mandatory) with its
original routing key, and only then removed from the DLQ; then the command waits (--wait) for
the pool to process it and reports: applied, stale (a newer version is stored), duplicate,
parked, or dead-lettered again. Exits 1 if one did not get through. An old version can never
overwrite newer state: replaying is safe. Needs read on pesanan.dlq and write on pesanan and
amq.default. --dry-run changes nothing and predicts each outcome from the database.";

const PURGE_HELP: &str = "\
Examples:
  urutan dlq purge order-17-v3 order-17-v4
  urutan dlq purge order-17-v3 --order order-17   (only that order's message with this id)
  urutan dlq purge --reason invalid_json --dry-run
  urutan dlq purge --settled       (versions released past or applied since: nothing left to do)
  urutan dlq purge --yes           (the whole DLQ)

Removes the chosen messages from the DLQ (each taken and dropped, the others kept in order)
and marks their records purged (kept for DEAD_LETTER_RETENTION); a message id names every
unresolved message with that id, --order narrows it to one order. Without a choice it removes
every message the DLQ holds when it starts. Asks for confirmation on a terminal unless the
messages are named by id; elsewhere --reason, --settled and the whole DLQ need --yes.
--dry-run changes nothing and lists what would be removed. Each purge leaves an audit row.
Needs read on the DLQ and write on amq.default.";

/// `urutan dlq list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only this reason (e.g. `invalid_json`, `id_mismatch`, `delivery_limit`, `database_refused`).
    #[arg(long)]
    pub reason: Option<String>,
    /// Only this order id.
    #[arg(long = "order", value_name = "ORDER_ID")]
    pub order: Option<String>,
    /// Only those dead-lettered since: a time ago (`2h`, `3d`) or an RFC 3339 time.
    #[arg(long, value_parser = parse_since, value_name = "WHEN")]
    pub since: Option<DateTime<Utc>>,
    /// JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// At most this many messages.
    #[arg(long, default_value_t = 1000)]
    pub limit: u32,
    /// Dead-lettered effects (webhooks `urutan effects` gave up on) instead of messages.
    #[arg(long)]
    pub effects: bool,
}

/// `urutan dlq show`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The message id (or, for a message without a valid one, its `sha256:` key).
    pub message_id: String,
    /// Only this order's message with that id (two orders may dead-letter
    /// messages with one id: dedup is per order and message id).
    #[arg(long = "order", value_name = "ORDER_ID")]
    pub order: Option<String>,
    /// Most bytes of the body shown (pretty-printed when it is JSON).
    #[arg(long, default_value_t = 4096)]
    pub body_bytes: usize,
    /// JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `urutan dlq replay`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("which").required(true).args(["message_ids", "reason", "all"])))]
pub struct ReplayArgs {
    /// The messages to replay (ids or `sha256:` keys).
    pub message_ids: Vec<String>,
    /// Only these orders' messages with those ids (without it, each order's
    /// message with one of the ids is replayed).
    #[arg(long = "order", value_name = "ORDER_ID", requires = "message_ids")]
    pub order: Option<String>,
    /// Every message dead-lettered for this reason.
    #[arg(long)]
    pub reason: Option<String>,
    /// Every message in the DLQ.
    #[arg(long)]
    pub all: bool,
    /// Change nothing: list what would be replayed and predict each outcome.
    #[arg(long)]
    pub dry_run: bool,
    /// How long to wait for the pool to process the replayed messages.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub wait: Duration,
    /// JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Dead-lettered effects instead of messages: the ids are effect ids
    /// (`dlq list --effects`); each is set pending again and sent by the
    /// running dispatchers with its original idempotency key.
    #[arg(long)]
    pub effects: bool,
}

/// `urutan dlq purge`.
#[derive(Debug, Args)]
pub struct PurgeArgs {
    /// Only these messages (ids or `sha256:` keys); with no choice at all,
    /// the whole DLQ.
    pub message_ids: Vec<String>,
    /// Only the messages dead-lettered for this reason.
    #[arg(long)]
    pub reason: Option<String>,
    /// Only the settled messages: their versions were released past
    /// (`urutan hold release`) or applied since.
    #[arg(long)]
    pub settled: bool,
    /// Only the messages of this order (its entity id: a message id is
    /// unique per order only).
    #[arg(long = "order", value_name = "ORDER_ID")]
    pub order: Option<String>,
    /// Change nothing: list what would be removed.
    #[arg(long)]
    pub dry_run: bool,
    /// Do not ask for confirmation.
    #[arg(long)]
    pub yes: bool,
}

impl PurgeArgs {
    /// Nothing chosen: the whole DLQ (the contract's `dlq purge [--yes]`).
    fn whole(&self) -> bool {
        self.message_ids.is_empty()
            && self.reason.is_none()
            && !self.settled
            && self.order.is_none()
    }
}

/// A failure of a DLQ operation, worded for the operator.
#[derive(Debug, thiserror::Error)]
pub enum DlqError {
    #[error(
        "the broker user may not {action} ({refusal}); `urutan dlq <command> --help` says which \
         permissions each command needs (deploy/rabbitmq/least-privilege.sh: OPERATOR_USER)"
    )]
    Refused { action: String, refusal: String },
    #[error("cannot {action}: {cause}")]
    Broker { action: String, cause: BrokerError },
    #[error(
        "the dead-letter queue `{0}` does not exist in this vhost: declare the topology first \
         (`urutan topology`, same TOPOLOGY_PREFIX)"
    )]
    NoQueue(String),
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error(
        "a message in {0} cannot be read by urutan's AMQP client (lapin cannot parse its \
         properties, e.g. a message_id that is not UTF-8) and stays there; remove it with the \
         management UI (Get messages, ack mode \"Reject requeue false\"), then run `urutan dlq \
         purge` or `replay` again"
    )]
    Unreadable(String),
    #[error(
        "the broker did not confirm a message put back at the end of the DLQ ({0}); the original \
         stays in the DLQ"
    )]
    NotKept(String),
}

impl DlqError {
    /// A broker failure while trying to `action`.
    pub(crate) fn broker(cause: BrokerError, action: &str) -> Self {
        let action = action.to_owned();
        match &cause {
            BrokerError::Amqp(e) if broker::topology::is_access_refused(e) => {
                // The broker's own words name the object and the user.
                let refusal = match e.kind() {
                    lapin::ErrorKind::ProtocolError(amqp) => amqp.get_message().to_string(),
                    _ => e.to_string(),
                };
                Self::Refused { action, refusal }
            }
            _ => Self::Broker { action, cause },
        }
    }
}

impl From<BrokerError> for DlqError {
    fn from(cause: BrokerError) -> Self {
        Self::broker(cause, "talk to the broker")
    }
}

/// Runs one `urutan dlq` subcommand.
pub async fn run(settings: Settings, command: DlqCommand) -> anyhow::Result<()> {
    let db = urutan::store::prepare(&settings.database(), 2)
        .await
        .with_context(|| format!("cannot open the database {}", settings.database_url))?;
    let ctx = Ctx::new(settings, db);
    let result = match command {
        DlqCommand::List(args) if args.effects => effects::list(&ctx, &args).await,
        DlqCommand::List(args) => list::list(&ctx, &args).await,
        DlqCommand::Show(args) => show::show(&ctx, &args).await,
        DlqCommand::Replay(args) if args.effects => effects::replay(&ctx, &args).await,
        DlqCommand::Replay(args) => replay::replay(&ctx, &args).await,
        DlqCommand::Purge(args) => replay::purge(&ctx, &args).await,
    };
    ctx.db.close().await;
    result
}

/// What every subcommand works with (and the console, acting on dead
/// letters).
pub(crate) struct Ctx {
    settings: Settings,
    names: Names,
    db: PgPool,
}

impl Ctx {
    pub(crate) fn new(settings: Settings, db: PgPool) -> Self {
        Self {
            names: settings.names(),
            settings,
            db,
        }
    }

    fn max_body_bytes(&self) -> usize {
        usize::try_from(self.settings.max_body_bytes).unwrap_or(usize::MAX)
    }

    /// A broker connection, or one line that says which broker cannot be reached.
    async fn broker(&self) -> anyhow::Result<lapin::Connection> {
        broker::connect(&self.settings.broker(), "urutan dlq")
            .await
            .with_context(|| format!("cannot reach the broker at {}", self.settings.amqp_url))
    }

    /// Records in the DLQ now (unresolved rows).
    async fn recorded(&self) -> Result<i64, sqlx::Error> {
        dead_letter::unresolved_count(&self.db).await
    }

    /// If the DLQ holds more messages than there are records, walks it once
    /// so that every message has one. Returns the DLQ's depth.
    ///
    /// Not while an unreadable message is recorded (see [`unreadable`]):
    /// each attempt would hand it back, which counts a delivery. `replay` and
    /// `purge`, asked for explicitly, still try.
    async fn record_unrecorded(&self, conn: &lapin::Connection) -> Result<u32, DlqError> {
        let depth = walk::depth(conn, &self.names).await?;
        if i64::from(depth) <= self.recorded().await? {
            return Ok(depth);
        }
        if unreadable::known(&self.db, &self.names).await? {
            return Err(DlqError::Unreadable(self.names.dead_letter_queue()));
        }
        let mut walker =
            walk::Walker::open(conn, &self.db, &self.names, self.max_body_bytes()).await?;
        while let Some(taken) = walker.take().await? {
            walker.keep(taken).await?;
        }
        let queue = self.names.dead_letter_queue();
        if walker.recorded > 0 {
            eprintln!(
                "recorded {} message(s) found in {queue} without a record",
                walker.recorded
            );
        }
        if walker.duplicates > 0 {
            eprintln!(
                "removed {} identical copies from {queue} (at-least-once dead-lettering can make them)",
                walker.duplicates
            );
        }
        let depth = walker.depth - u32::try_from(walker.duplicates).unwrap_or(0);
        walker.close().await?;
        Ok(depth)
    }
}

/// Characters of a `sha256:` key that the table shows (`sha256:` and 16
/// hex digits); `show` and `replay` accept any prefix of a key this long.
const KEY_PREFIX: usize = 23;

/// The full delivery key that `id` names: itself, or the one key of a
/// message in the DLQ that starts with it (an abbreviated `sha256:` key).
async fn full_key(db: &PgPool, id: &str) -> Result<String, sqlx::Error> {
    if !id.starts_with("sha256:") || id.len() < KEY_PREFIX || id.len() >= 71 {
        return Ok(id.to_owned());
    }
    let keys = dead_letter::keys_with_prefix(db, id).await?;
    Ok(match keys.as_slice() {
        [one] => one.clone(),
        _ => id.to_owned(),
    })
}

/// `2h` (that long ago) or an RFC 3339 time.
fn parse_since(s: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Ok(t.with_timezone(&Utc));
    }
    let ago = parse_duration(s).map_err(|e| format!("{e}, or an RFC 3339 time"))?;
    let ago = chrono::Duration::from_std(ago).map_err(|e| e.to_string())?;
    Ok(Utc::now() - ago)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_takes_a_duration_or_a_time() {
        let t = parse_since("2026-11-30T08:00:00Z").expect("time");
        assert_eq!(t.to_rfc3339(), "2026-11-30T08:00:00+00:00");
        let ago = Utc::now() - parse_since("2h").expect("duration");
        assert!((ago.num_seconds() - 7200).abs() < 5, "{ago}");
        assert!(parse_since("yesterday-ish").is_err());
    }
}
