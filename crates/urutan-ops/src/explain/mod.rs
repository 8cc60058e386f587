//! `urutan explain ORDER_ID`: why an order is in the state it is in.
//!
//! Everything urutan knows of the order, version by version: applied (the
//! history row: shard, message id, when), parked (shard, epoch, and what it
//! waits for), dead-lettered (reason, detail, replayed or not), in the
//! outbox (unsent, or published and not processed yet: queued), processed
//! but not applied (stale), and, for a version none of these know, "never
//! seen". Versions between the lowest and highest one known are listed,
//! runs of the same story collapsed into ranges.
//!
//! What cannot be known cheaply is said, not guessed: a message still queued
//! cannot be looked at without taking it (single-active-consumer queues
//! refuse `basic.get`), so only the shard queues' depths are given; the
//! epoch of each applied version is not recorded (`pesanan_riwayat` has no
//! epoch column), so an upper bound is shown (the latest epoch opened before
//! it was applied), and the exact epoch only for the order as a whole.

mod read;

use crate::QueueInfo;
use urutan::config::Settings;
use urutan::outbox::OrderRow;
use urutan::store::dead_letter;
use urutan::store::{AppliedVersion, OrderState, ParkedVersion, ReturnedVersion};

/// `urutan explain --help`: exit codes and examples.
pub const HELP: &str = "\
Each version of the order, from the lowest to the highest known: applied (shard,
message id, when), parked (and what it waits for), dead-lettered (reason), still
in the outbox or a queue, stale, or missing (and why, if urutan knows); then its
effects (webhooks): sent, pending (attempts, next try), held or dead-lettered
(the answer).

Exit codes:
  0  the order was explained
  1  the order is unknown (nothing of it in the database)
  2  bad command line
  3  the database or the broker cannot be reached

Examples:
  urutan explain PSN-000123
  DATABASE_URL=postgres://ops@db/urutan urutan explain PSN-000123";

/// `urutan explain` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct ExplainOptions {
    /// The order id (`x-pesanan-id`, the body's `id`, `pesanan.id`).
    #[arg(value_parser = parse_order_id)]
    pub order_id: String,
}

fn parse_order_id(s: &str) -> Result<String, String> {
    if s.is_empty() || s.len() > 128 {
        return Err("an order id is 1-128 bytes".into());
    }
    Ok(s.to_owned())
}

/// Everything found about one order.
#[derive(Debug, Clone)]
pub struct Explanation {
    pub order_id: String,
    pub state: Option<OrderState>,
    pub applied: Vec<AppliedVersion>,
    pub parked: Vec<ParkedVersion>,
    /// Versions handed back to their shard queue after a failure, not back yet.
    pub returned: Vec<ReturnedVersion>,
    /// Its hold, if it is on hold (a refused version; its later versions wait).
    pub hold: Option<urutan::store::hold::Hold>,
    /// Its effect hold, if a dead-lettered effect holds its later effects
    /// (`EFFECTS_ON_DEAD=hold`; its versions are not held by it).
    pub effect_hold: Option<urutan::store::hold::Hold>,
    /// Its messages set aside after a transient failure (attempts, last
    /// error, next try); they are among `parked` too.
    pub retrying: Vec<urutan::store::hold::Retrying>,
    /// Holds an operator released without their version.
    pub skips: Vec<urutan::store::hold::Skip>,
    /// Versions that arrived after a newer one was applied.
    pub stale: Vec<urutan::store::StaleArrival>,
    /// Its effects (webhooks), in the order they go. `None`: no effect
    /// tables (not migrated).
    pub effects: Option<Vec<urutan::effects::read::OrderEffect>>,
    /// Its dead-letter records. `None`: the dead-letter table does not
    /// exist (not migrated).
    pub dead_letters: Option<Vec<dead_letter::Record>>,
    /// Operator actions taken on it in the console (`None`: unread, or no
    /// audit table).
    pub audit: Option<Vec<crate::audit::AuditRow>>,
    /// `Err`: the outbox could not be searched (why).
    pub outbox: Result<Vec<OrderRow>, String>,
    /// The highest epoch every active shard has passed.
    pub passed_by_all: Option<i64>,
    /// Active shards and the epoch each has passed.
    pub positions: Vec<(u16, i64)>,
    /// Open windows: (reason, closing epoch).
    pub windows: Vec<(String, Option<i64>)>,
    /// Shard queues (index = shard; `None`: missing) and the DLQ, or why
    /// the broker could not be asked.
    pub queues: Result<(Vec<Option<QueueInfo>>, Option<QueueInfo>), String>,
}

impl Explanation {
    /// Nothing found yet.
    pub fn new(order_id: &str) -> Self {
        Self {
            order_id: order_id.to_owned(),
            state: None,
            applied: Vec::new(),
            parked: Vec::new(),
            returned: Vec::new(),
            hold: None,
            effect_hold: None,
            retrying: Vec::new(),
            skips: Vec::new(),
            stale: Vec::new(),
            effects: None,
            dead_letters: None,
            audit: None,
            outbox: Ok(Vec::new()),
            passed_by_all: None,
            positions: Vec::new(),
            windows: Vec::new(),
            queues: Err("the broker was not asked".into()),
        }
    }

    /// Nothing at all is known of the order.
    pub fn is_unknown(&self) -> bool {
        self.state.is_none()
            && self.applied.is_empty()
            && self.parked.is_empty()
            && self.dead_letters.as_ref().is_none_or(Vec::is_empty)
            && self.outbox.as_ref().is_ok_and(Vec::is_empty)
    }
}

/// Why nothing could be explained.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    #[error("{0}")]
    Database(String),
    #[error("the database has no urutan tables: run `urutan migrate` (or check DATABASE_URL)")]
    NotMigrated,
    /// No urutan tables in the configured schema, but the database holds a
    /// pipeline elsewhere (or another entity's here): which setting to set.
    #[error("{0}")]
    WrongPipeline(String),
}

/// Reads what the database and the broker know of `order_id`.
pub async fn gather(settings: &Settings, order_id: &str) -> Result<Explanation, ExplainError> {
    gather_on(settings, order_id, crate::Open::default()).await
}

/// [`gather`] through connections already open (the console's).
pub async fn gather_on(
    settings: &Settings,
    order_id: &str,
    open: crate::Open<'_>,
) -> Result<Explanation, ExplainError> {
    let owned = match open.db {
        Some(_) => None,
        None => Some(
            crate::open_database(settings, "urutan explain")
                .await
                .map_err(ExplainError::Database)?,
        ),
    };
    let Some(db) = open.db.or(owned.as_ref()) else {
        return Err(ExplainError::Database("no database connection".into()));
    };
    let mut read = read::read(db, order_id).await;
    if let Err(read::ReadError::NotMigrated) = &read
        && let Some(advice) = crate::pipeline_advice(db, settings).await
    {
        read = Err(read::ReadError::WrongPipeline(advice));
    }
    if let Some(db) = owned {
        db.close().await;
    }
    let mut found = read.map_err(|e| match e {
        read::ReadError::NotMigrated => ExplainError::NotMigrated,
        read::ReadError::WrongPipeline(advice) => ExplainError::WrongPipeline(advice),
        read::ReadError::Sql(e) => {
            ExplainError::Database(format!("reading the database failed: {e}"))
        }
    })?;
    if !found.is_unknown() {
        found.queues = queues(settings, found.positions.len(), open).await;
    }
    Ok(found)
}

async fn queues(
    settings: &Settings,
    shards: usize,
    open: crate::Open<'_>,
) -> Result<(Vec<Option<QueueInfo>>, Option<QueueInfo>), String> {
    let names = settings.names();
    let broker = crate::Broker::get(open, settings, "urutan explain").await?;
    let mut queues: Vec<String> = (0..u16::try_from(shards).unwrap_or(u16::MAX))
        .map(|i| names.shard_queue(i))
        .collect();
    queues.push(names.dead_letter_queue());
    let infos = crate::queue_infos(broker.conn(), &queues).await;
    broker.done().await;
    let mut infos = infos.map_err(|e| format!("the broker failed a passive declare: {e}"))?;
    let dlq = infos.pop().flatten();
    Ok((infos, dlq))
}
