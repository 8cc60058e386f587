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
in the outbox or a queue, stale, or missing (and why, if urutan knows).

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
    /// Its messages set aside after a transient failure (attempts, last
    /// error, next try); they are among `parked` too.
    pub retrying: Vec<urutan::store::hold::Retrying>,
    /// Holds an operator released without their version.
    pub skips: Vec<urutan::store::hold::Skip>,
    /// Its dead-letter records. `None`: the dead-letter table does not
    /// exist (not migrated).
    pub dead_letters: Option<Vec<dead_letter::Record>>,
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
            retrying: Vec::new(),
            skips: Vec::new(),
            dead_letters: None,
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
}

/// Reads what the database and the broker know of `order_id`.
pub async fn gather(settings: &Settings, order_id: &str) -> Result<Explanation, ExplainError> {
    let db = crate::open_database(settings, "urutan explain")
        .await
        .map_err(ExplainError::Database)?;
    let read = read::read(&db, order_id).await;
    db.close().await;
    let mut found = read.map_err(|e| match e {
        read::ReadError::NotMigrated => ExplainError::NotMigrated,
        read::ReadError::Sql(e) => {
            ExplainError::Database(format!("reading the database failed: {e}"))
        }
    })?;
    if !found.is_unknown() {
        found.queues = queues(settings, found.positions.len()).await;
    }
    Ok(found)
}

async fn queues(
    settings: &Settings,
    shards: usize,
) -> Result<(Vec<Option<QueueInfo>>, Option<QueueInfo>), String> {
    let names = settings.names();
    let conn = crate::open_broker(settings, "urutan explain").await?;
    let mut queues: Vec<String> = (0..u16::try_from(shards).unwrap_or(u16::MAX))
        .map(|i| names.shard_queue(i))
        .collect();
    queues.push(names.dead_letter_queue());
    let mut infos = crate::queue_infos(&conn, &queues)
        .await
        .map_err(|e| format!("the broker failed a passive declare: {e}"))?;
    let _ = urutan::broker::call("connection.close", conn.close(200, "explained".into())).await;
    let dlq = infos.pop().flatten();
    Ok((infos, dlq))
}
