//! `urutan status`: one look at the whole pool, for a person or (`--json`)
//! a machine, and a check: the exit code says whether something needs
//! attention ([`assess`] is the one place that decides what does).
//!
//! Read from PostgreSQL: the recorded ring and any resharding in progress
//! (`urutan_ring`), open windows (`urutan_jendela`), epochs and each shard's
//! position (`urutan_epoch`, `urutan_shard`), parked messages, the last apply
//! per shard (among the newest [`RECENT_HISTORY`] history rows, so the
//! query stays cheap on a large history), dead-letter records by reason,
//! the outbox backlog, and which session holds the relay's advisory lock.
//! From the broker (passive declares): each shard queue's ready messages and
//! consumers, and the dead-letter queue's depth.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

mod assess;
mod read;

pub use assess::assess;
use read::{FromBroker, FromDatabase};

use urutan::broker::Names;
use urutan::config::Settings;
pub use urutan::reshard::read::{Epochs, Window};
pub use urutan::store::dead_letter::ReasonCount;

/// `urutan status --help`: exit codes, what needs attention, examples.
pub const HELP: &str = "\
Exit codes:
  0  healthy: nothing needs attention
  1  something needs attention (each item is listed, with a stable code in --json)
  2  bad command line
  3  the database or the broker cannot be reached (what could be read is still shown)

Needs attention: the database or the broker unreachable; urutan's tables missing
(not migrated); no ring recorded; a shard queue missing, or without a consumer;
a shard that has not passed an epoch opened longer than --stuck-after ago, or
whose position no recorded epoch explains (a forged marker); a window or a resharding open longer than that; a message parked longer than that;
any message in the dead-letter queue; an unsent outbox row older than that;
an order on hold or retrying; a version waiting longer than it should (not
held, and set aside past its due time, or missing a predecessor longer than
GAP_TIMEOUT, or free to go but not released, each by more than 30 s: is its
shard's worker running?); a dead-lettered effect (webhook) not yet replayed
or released.

Reads only: passive declares on the broker (no permission beyond the vhost),
SELECTs on urutan's tables, pg_locks and pg_stat_activity (the active relay).

Examples:
  urutan status
  urutan status --json | jq '.attention[].code'
  urutan status --stuck-after 15m || echo 'urutan needs attention'
  DATABASE_URL=postgres://ops@db/urutan AMQP_URL=amqp://ops:pw@rabbit/%2f urutan status";

/// History rows looked at for each shard's last apply.
pub const RECENT_HISTORY: i64 = 100_000;

/// `urutan status` options.
#[derive(Debug, Clone, clap::Args)]
pub struct StatusOptions {
    /// Print JSON (one object) instead of the screen for people.
    #[arg(long)]
    pub json: bool,
    /// How long a window, a resharding, an epoch marker, a parked message
    /// or an unsent outbox row may wait before status calls it stuck.
    #[arg(long, default_value = "5m", value_parser = urutan::config::parse_duration)]
    pub stuck_after: Duration,
    /// The broker's Prometheus endpoints (plugin rabbitmq_prometheus), comma
    /// separated, for the standby consumers AMQP cannot see (default: each
    /// AMQP_URL node's host, port 15692).
    #[arg(long, env = "BROKER_METRICS_URL", hide_env_values = true)]
    pub broker_metrics_url: Option<String>,
}

/// Everything `urutan status` found. Field names are the JSON output's.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    #[serde(serialize_with = "urutan::rfc3339::one")]
    pub checked_at: DateTime<Utc>,
    /// 0 healthy, 1 needs attention, 3 database or broker unreachable.
    pub exit_code: u8,
    /// What needs attention; empty when healthy.
    pub attention: Vec<Attention>,
    pub database: Reach,
    pub broker: Reach,
    /// The recorded ring (`None`: none recorded, or the database unread).
    pub ring: Option<Ring>,
    pub epochs: Option<Epochs>,
    /// Windows still open (a ring change not yet behind every shard).
    pub windows: Vec<Window>,
    pub shards: Vec<Shard>,
    /// The live replicas of `urutan run` (lease not expired), each with
    /// the shards the placement gives it (docs/contract.md section 13).
    pub replicas: Vec<Replica>,
    /// Most consumers (standbys included) on one shard queue: 1, or 2 while
    /// a shard moves between replicas. From the broker's Prometheus
    /// endpoint (`None`: unknown).
    pub replicas_seen: Option<u32>,
    /// Why `replicas_seen` is unknown.
    pub replicas_unknown: Option<String>,
    pub dead_letters: DeadLetters,
    pub outbox: Option<Outbox>,
    /// Orders on hold and orders with a message set aside (`None`: unread).
    pub orders: Option<Orders>,
    /// The webhooks (`urutan effects`): pending, dead-lettered, of those
    /// unresolved (`None`: unread, or no effect tables).
    pub effects: Option<urutan::effects::read::Summary>,
    /// Orders with a version waiting longer than it should, per kind
    /// (`set_aside`, `gap`, `parked`; a kind with none is left out; `None`:
    /// unread). See [`urutan::store::overdue`].
    pub overdue: Option<Vec<urutan::store::overdue::Overdue>>,
}

/// Orders that wait: held after a refused version, or retrying a message
/// set aside after a transient failure (docs/contract.md section 11).
#[derive(Debug, Clone, Serialize)]
pub struct Orders {
    /// Orders on hold.
    pub held: i64,
    /// Per reason (`refused`, `gap`, `effect`).
    pub held_by_reason: Vec<HeldReason>,
    /// When the oldest hold began.
    #[serde(serialize_with = "urutan::rfc3339::option")]
    pub oldest_held_since: Option<DateTime<Utc>>,
    /// Orders with a message set aside.
    pub retrying: i64,
}

#[derive(Debug, Clone, Serialize)]
pub struct HeldReason {
    pub reason: String,
    pub orders: i64,
}

/// Whether a service answered.
#[derive(Debug, Clone, Serialize)]
pub struct Reach {
    /// The URL, password redacted.
    pub url: String,
    pub reachable: bool,
    pub error: Option<String>,
}

/// One thing that needs attention.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Attention {
    /// Stable: `database_unreachable`, `broker_unreachable`, `not_migrated`,
    /// `no_ring`, `resharding_stuck`, `window_stuck`, `shard_queue_missing`,
    /// `shard_without_consumer`, `epoch_not_passed`, `epoch_unexplained`, `parked_too_long`,
    /// `dead_letter_queue_missing`, `dead_letters`, `outbox_backlog`,
    /// `outbox_unroutable`, `outbox_set_aside`, `orders_held`, `orders_retrying`,
    /// `set_aside_overdue`, `gap_overdue`, `parked_overdue`, `effects_dead_lettered`.
    pub code: &'static str,
    pub message: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Ring {
    pub versi: i64,
    pub shard_count: u16,
    /// The count before this change (`None`: the first record).
    pub from: Option<u16>,
    /// The epoch opened right after the bindings changed.
    pub epoch: i64,
    pub by: String,
    #[serde(serialize_with = "urutan::rfc3339::one")]
    pub since: DateTime<Utc>,
    #[serde(serialize_with = "urutan::rfc3339::option")]
    pub completed_at: Option<DateTime<Utc>>,
    /// A resharding is in progress (old-ring messages may still be queued).
    pub resharding: bool,
}

/// One live replica of `urutan run`.
#[derive(Debug, Clone, Serialize)]
pub struct Replica {
    /// Its `REPLICA_NAME`.
    pub name: String,
    /// How many shards the placement gives it, and which.
    pub shard_count: usize,
    pub shards: Vec<u16>,
    /// The shards it last reported a registered consumer on.
    pub consumers: Vec<u16>,
    #[serde(serialize_with = "urutan::rfc3339::one")]
    pub joined_at: DateTime<Utc>,
    #[serde(serialize_with = "urutan::rfc3339::one")]
    pub lease_until: DateTime<Utc>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Shard {
    pub shard: u16,
    pub queue: String,
    /// Bound to the hash exchange by the recorded ring (gets new messages).
    pub bound: bool,
    /// Registered as active (its epoch position is awaited).
    pub active: bool,
    /// Whether the queue exists (`None`: the broker was not reached).
    pub exists: Option<bool>,
    pub ready: Option<u32>,
    /// The replica placed on this shard, if it is live: the one consuming
    /// it, or about to once the previous one has handed it over.
    pub replica: Option<String>,
    /// Active consumers (0 or 1: a passive declare counts no standby).
    pub consumers: Option<u32>,
    /// Every consumer, standbys included (from the broker's Prometheus
    /// endpoint; `None`: unknown).
    pub consumers_registered: Option<u32>,
    /// The highest epoch whose marker this shard's worker has passed.
    pub epoch_passed: Option<i64>,
    /// When the oldest epoch this shard has not passed yet was opened.
    #[serde(serialize_with = "urutan::rfc3339::option")]
    pub epoch_waiting_since: Option<DateTime<Utc>>,
    /// No recorded epoch explains `epoch_passed` (above the highest epoch,
    /// or one never recorded): it was not moved by a marker urutan sent.
    pub epoch_unexplained: bool,
    pub parked: i64,
    #[serde(serialize_with = "urutan::rfc3339::option")]
    pub oldest_parked_at: Option<DateTime<Utc>>,
    /// The order of the oldest parked message (for `urutan explain`).
    pub oldest_parked_order: Option<String>,
    #[serde(serialize_with = "urutan::rfc3339::option")]
    pub last_applied_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DeadLetters {
    pub queue: String,
    /// Messages in the dead-letter queue (`None`: unknown).
    pub depth: Option<u32>,
    /// Whether `urutan_dead_letter` exists (run `urutan migrate` if not).
    pub records_available: bool,
    /// Records of messages still in the DLQ, by reason (most first).
    pub by_reason: Vec<ReasonCount>,
    /// Of those, the settled ones: their versions were released past
    /// (`urutan hold release`) or applied since; their messages need no
    /// attention (`urutan dlq purge --settled` removes them).
    pub settled: i64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Outbox {
    pub unsent: i64,
    #[serde(serialize_with = "urutan::rfc3339::option")]
    pub oldest_unsent_at: Option<DateTime<Utc>>,
    /// Rows set aside by the relay as unroutable (not in `unsent`): they
    /// wait for an operator (migration 0017 says how to retry one).
    pub unroutable: i64,
    /// Every row the relay set aside (not in `unsent`, `unroutable`
    /// included): it breaks the contract's section 2, the broker returned
    /// or refused it (migration 0038).
    pub set_aside: i64,
    /// The same by reason (`unroutable`, `routing_key_too_long`,
    /// `entity_id_too_long`, `payload_invalid`, `body_too_large`,
    /// `broker_refused`, ...), most first.
    pub set_aside_by_reason: Vec<urutan::outbox::SetAsideCount>,
    /// The session holding the relay's lock (`None`: no relay is active).
    pub relay: Option<Session>,
}

/// A PostgreSQL session (what `pg_stat_activity` shows of it).
#[derive(Debug, Clone, Serialize)]
pub struct Session {
    pub pid: i32,
    #[serde(serialize_with = "urutan::rfc3339::option")]
    pub since: Option<DateTime<Utc>>,
    pub client: Option<String>,
}

/// Looks at everything; never fails (what cannot be read is reported).
pub async fn gather(settings: &Settings, options: &StatusOptions) -> Status {
    gather_on(settings, options, super::Open::default()).await
}

/// [`gather`] through connections already open (the console's).
pub async fn gather_on(
    settings: &Settings,
    options: &StatusOptions,
    open: super::Open<'_>,
) -> Status {
    let names = settings.names();
    let mut status = Status {
        checked_at: Utc::now(),
        exit_code: super::EXIT_OK,
        attention: Vec::new(),
        database: reach(&settings.database_url.to_string(), Ok(())),
        broker: reach(&settings.amqp_url.to_string(), Ok(())),
        ring: None,
        epochs: None,
        windows: Vec::new(),
        shards: Vec::new(),
        replicas: Vec::new(),
        replicas_seen: None,
        replicas_unknown: None,
        dead_letters: DeadLetters {
            queue: names.dead_letter_queue(),
            depth: None,
            records_available: false,
            by_reason: Vec::new(),
            settled: 0,
        },
        outbox: None,
        orders: None,
        effects: None,
        overdue: None,
    };
    let mut notes = Vec::new();
    let owned_db = match open.db {
        Some(_) => None,
        None => match super::open_database(settings, "urutan status").await {
            Ok(db) => Some(db),
            Err(e) => {
                status.database = reach(&settings.database_url.to_string(), Err(e));
                None
            }
        },
    };
    let db = open.db.or(owned_db.as_ref());
    let mut from_db = FromDatabase::default();
    let mut advice = None;
    if let Some(db) = &db {
        match read::read_database(db, &names).await {
            Ok(read) => from_db = read,
            Err(e) => {
                let e = format!("reading the database failed: {e}");
                status.database = reach(&settings.database_url.to_string(), Err(e));
            }
        }
        status.orders = read::orders(db).await.ok();
        status.effects = urutan::effects::read::summary(db).await.ok();
        status.overdue = urutan::store::overdue::overdue(db, settings.gap_timeout)
            .await
            .ok();
        advice = super::pipeline_advice(db, settings).await;
    }
    if let Some(db) = owned_db {
        db.close().await;
    }
    match advice {
        // Never "run migrate" where that would start a second pipeline.
        Some(advice) if !from_db.tables.core => notes.push(attention("not_migrated", advice)),
        Some(advice) => notes.push(attention("wrong_pipeline", advice)),
        None if !from_db.tables.core && status.database.reachable => notes.push(attention(
            "not_migrated",
            "the database has no urutan tables (or old ones): run `urutan migrate`".into(),
        )),
        None => {}
    }
    let broker = read::read_broker(settings, &names, &from_db, open).await;
    if let Err(e) = &broker {
        status.broker = reach(&settings.amqp_url.to_string(), Err(e.clone()));
    }
    let endpoints = match &options.broker_metrics_url {
        Some(urls) => urls.split(',').map(|u| u.trim().to_owned()).collect(),
        None => super::replicas::default_endpoints(&settings.amqp_url),
    };
    let registered =
        super::replicas::consumers(&endpoints, &super::replicas::vhost(&settings.amqp_url)).await;
    combine(&mut status, &names, from_db, broker.ok());
    match registered {
        Ok(registered) => {
            for s in &mut status.shards {
                s.consumers_registered = registered.get(&s.queue).copied();
            }
            status.replicas_seen = status
                .shards
                .iter()
                .filter(|s| s.bound || s.active)
                .filter_map(|s| s.consumers_registered)
                .max();
        }
        Err(e) => {
            status.replicas_unknown = Some(format!(
                "a passive declare counts no standby consumer, and the broker's Prometheus \
                 endpoint cannot be read ({e}; set --broker-metrics-url)"
            ));
        }
    }
    status.attention = notes;
    status
        .attention
        .extend(assess(&status, Utc::now(), options.stuck_after));
    status.exit_code = exit_code(&status);
    status
}

fn reach(url: &str, result: Result<(), String>) -> Reach {
    Reach {
        url: url.to_owned(),
        reachable: result.is_ok(),
        error: result.err(),
    }
}

fn attention(code: &'static str, message: String) -> Attention {
    Attention { code, message }
}

fn exit_code(status: &Status) -> u8 {
    if !status.database.reachable || !status.broker.reachable {
        super::EXIT_UNREACHABLE
    } else if status.attention.is_empty() {
        super::EXIT_OK
    } else {
        super::EXIT_ATTENTION
    }
}

/// Puts the two sources together, one row per shard either knows of.
fn combine(status: &mut Status, names: &Names, db: FromDatabase, broker: Option<FromBroker>) {
    let bound = db.ring.as_ref().map_or(0, |r| r.shard_count);
    let on_broker = broker.as_ref().map_or(0, |b| b.shards.len());
    let last = [
        usize::from(bound),
        on_broker,
        db.positions
            .keys()
            .next_back()
            .map_or(0, |s| usize::from(*s) + 1),
    ]
    .into_iter()
    .max()
    .unwrap_or(0);
    for index in 0..u16::try_from(last).unwrap_or(u16::MAX) {
        let position = db.positions.get(&index);
        let queue = broker
            .as_ref()
            .map(|b| b.shards.get(usize::from(index)).copied().flatten());
        let parked = db.parked.get(&index);
        let row = Shard {
            shard: index,
            queue: names.shard_queue(index),
            bound: index < bound,
            active: position.is_some_and(|p| p.active),
            exists: queue.map(|q| q.is_some()),
            ready: queue.flatten().map(|q| q.ready),
            replica: db.placement.get(&index).cloned(),
            consumers: queue.flatten().map(|q| q.consumers),
            consumers_registered: None,
            epoch_passed: position.map(|p| p.epoch),
            epoch_waiting_since: position.and_then(|p| p.waiting_since),
            epoch_unexplained: position.is_some_and(|p| p.unexplained),
            parked: parked.map_or(0, |p| p.0),
            oldest_parked_at: parked.map(|p| p.1),
            oldest_parked_order: parked.map(|p| p.2.clone()),
            last_applied_at: db.last_applied.get(&index).copied(),
        };
        // A retired shard (inactive, unbound, no queue) is history.
        if row.bound || row.active || row.exists != Some(false) || row.parked > 0 {
            status.shards.push(row);
        }
    }
    if let Some(b) = &broker {
        status.dead_letters.depth = b.dead_letter_queue.map(|q| q.ready);
    }
    status.dead_letters.records_available = db.tables.dead_letters;
    status.dead_letters.by_reason = db.by_reason;
    status.dead_letters.settled = db.settled;
    status.ring = db.ring;
    status.epochs = db.epochs;
    status.windows = db.windows;
    status.outbox = db.outbox;
    status.replicas = db.replicas;
}
