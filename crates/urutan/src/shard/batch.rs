//! Ordered batch mode (PREFETCH > 1): the deliveries already buffered, in
//! arrival order, up to BATCH_MAX, applied in ONE transaction with exactly
//! the outcomes they would have one by one, then acked with one
//! `multiple = true` ack.
//!
//! Failures never cost an innocent message:
//! - a contract violation is dead-lettered alone; the rest goes on in order;
//! - a transient database error holds the whole batch and retries it, in order;
//! - a handler that fails on one message (a panic) is retried in place up to
//!   the delivery limit, then only that message is dead-lettered
//!   (`basic.reject` without requeue, reason `delivery_limit`): requeueing it
//!   would put it behind the rest of the batch and break order;
//! - if the database refuses the batch because of one message's data, the
//!   batch is applied one message per transaction and only the refused one is
//!   dead-lettered (reason `database_refused`).

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;

use futures::StreamExt;
use lapin::message::Delivery;
use lapin::{Channel, Consumer};
use tokio_util::sync::CancellationToken;
use tracing::{error, info_span, warn};

use super::decode::{self, Read};
use super::hooks;
use super::{Held, Session, ShardWorker};
use crate::broker::{BrokerError, delivery};
use crate::message::{Event, Rejection};
use crate::metrics::{self as m, RetryReason};
use crate::outcome::{Outcome, Settle};
use crate::store::{Applied, BatchItem, BatchResult, StoreError};

/// One delivery of a batch after the pure steps.
enum Checked {
    Marker(i64),
    Event(Event),
    /// Refused, with the handler's last error (a delivery limit reached in place).
    Dead(Rejection, Option<String>),
}

/// What the batch transaction(s) did with one item, and the database's
/// error if it refused that item alone.
type ItemResult = (BatchResult, Option<String>);

/// How one delivery of a batch ends.
enum Step {
    /// Parked, or a marker passed: ack (its outcome, if any, comes later).
    Ack,
    /// An outcome, with the last error for a dead letter that has one.
    Done(Outcome, Option<String>),
}

/// Most body bytes one batch takes in. Decoding and the batch's statement
/// copy each body several times: with PREFETCH=256 and bodies of up to the
/// broker's `max_message_size` (2 MiB in the shipped configurations) an
/// unbounded batch would multiply that by 256. A single larger delivery
/// still makes a batch of one (and is dead-lettered if over MAX_BODY_BYTES).
const BATCH_MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

/// Whether a batch of `len` deliveries holding `bytes` of bodies takes no more.
fn batch_full(len: usize, bytes: usize, size: u16) -> bool {
    len >= usize::from(size) || bytes >= BATCH_MAX_BODY_BYTES
}

impl ShardWorker {
    /// Adds to `batch` the deliveries that arrive within BATCH_LINGER_MS of
    /// the first one, up to the batch size or [`BATCH_MAX_BODY_BYTES`].
    pub(super) async fn fill(
        &self,
        consumer: &mut Consumer,
        batch: &mut Vec<Delivery>,
    ) -> Result<(), BrokerError> {
        let deadline = tokio::time::Instant::now() + self.batch_linger;
        let mut bytes: usize = batch.iter().map(|d| d.data.len()).sum();
        while !batch_full(batch.len(), bytes, self.batch_size) {
            match tokio::time::timeout_at(deadline, consumer.next()).await {
                Ok(Some(next)) => {
                    let next = next?;
                    bytes = bytes.saturating_add(next.data.len());
                    batch.push(next);
                }
                Ok(None) => return Err(BrokerError::ConsumerCancelled),
                Err(_) => break,
            }
        }
        Ok(())
    }

    /// Applies a batch; returns each delivery's broker action and whether
    /// parked messages may now be releasable. Dead letters are recorded
    /// (committed) before any of them is settled.
    pub(super) async fn process_batch(
        &self,
        ch: &Channel,
        session: &Session,
        deliveries: &[Delivery],
        shutdown: &CancellationToken,
    ) -> Result<(Vec<Settle>, bool), BrokerError> {
        let span = info_span!("batch", shard = self.shard, size = deliveries.len());
        let _enter = span.enter();
        let prepared: Vec<Checked> = deliveries.iter().map(|d| self.prepare(d)).collect();
        let items: Vec<BatchItem<'_>> = prepared
            .iter()
            .filter_map(|p| match p {
                Checked::Marker(epoch) => Some(BatchItem::Marker(*epoch)),
                Checked::Event(event) => Some(BatchItem::Event(event)),
                Checked::Dead(..) => None,
            })
            .collect();
        let results = self.apply_in_order(ch, session, &items, shutdown).await?;
        let mut results = results.into_iter();
        let mut may_release = false;
        let steps: Vec<Step> = prepared
            .iter()
            .map(|prepared| match prepared {
                Checked::Dead(rejection, error) => {
                    Step::Done(Outcome::DeadLettered(*rejection), error.clone())
                }
                Checked::Marker(_) | Checked::Event(_) => match results.next() {
                    Some((BatchResult::Event(Applied::Done(outcome)), error)) => {
                        Step::Done(outcome, error)
                    }
                    Some((BatchResult::Event(Applied::Parked), _)) => {
                        session.metrics.parked.increment(1);
                        may_release = true;
                        Step::Ack
                    }
                    // A passed marker (the function answers every item).
                    Some((BatchResult::Marker, _)) | None => {
                        may_release = true;
                        Step::Ack
                    }
                },
            })
            .collect();
        let dead_letters = deliveries
            .iter()
            .zip(&steps)
            .filter_map(|(delivery, step)| match step {
                Step::Done(Outcome::DeadLettered(rejection), error) => {
                    Some(crate::dead_letter::rejected(
                        delivery,
                        self.shard,
                        *rejection,
                        error.as_deref(),
                    ))
                }
                _ => None,
            })
            .collect();
        self.record_dead_letters(ch, session, dead_letters, shutdown)
            .await?;
        let mut settles = Vec::with_capacity(deliveries.len());
        for ((delivery, prepared), step) in deliveries.iter().zip(&prepared).zip(steps) {
            let Step::Done(outcome, _) = step else {
                settles.push(Settle::Ack);
                continue;
            };
            if let Checked::Event(event) = prepared {
                session.record_lag(event);
            }
            let message_id = delivery.properties.message_id().as_ref();
            settles.push(self.record(session, outcome, message_id.map(|id| id.as_str())));
        }
        Ok((settles, may_release))
    }

    /// The pure part of one delivery: marker, contract check, fault hook.
    fn prepare(&self, delivery: &Delivery) -> Checked {
        let event = match decode::read(delivery, &self.queue, self.max_body_bytes) {
            Read::Event(event) => event,
            Read::Marker(epoch) => return Checked::Marker(epoch),
            Read::Invalid(rejection) => {
                let id = delivery.properties.message_id().as_ref();
                warn!(
                    message_id = id.map_or("", |id| id.as_str()),
                    reason = rejection.reason(),
                    "contract violation in a batch"
                );
                return Checked::Dead(rejection, None);
            }
        };
        let Some(hook) = &self.hooks.before_apply else {
            return Checked::Event(event);
        };
        let attempts = u64::from(self.delivery_limit) + 1;
        let left = attempts
            .saturating_sub(delivery::previous_deliveries(delivery))
            .max(1);
        let mut last_error = None;
        for attempt in 1..=left {
            let run = std::panic::catch_unwind(AssertUnwindSafe(|| hook(&event)));
            let Err(panic) = run else {
                return Checked::Event(event);
            };
            last_error = Some(hooks::panic_message(panic.as_ref()));
            error!(message_id = ?event.message_id, attempt, "the handler panicked on this message");
            metrics::counter!(m::RETRIES_TOTAL, "shard" => self.shard.to_string(), "reason" => RetryReason::Panic.label())
                .increment(1);
        }
        Checked::Dead(Rejection::DeliveryLimit, last_error)
    }

    /// Applies `items` in arrival order: in ONE transaction, unless the
    /// database's lock table cannot hold that transaction's per-entity locks
    /// (SQLSTATE 53200, "out of shared memory"; about one lock per distinct
    /// entity, held until commit). Then the group is split in halves, applied
    /// in order, each in its own transaction, down to single messages (for
    /// which 53200 is transient again: held and retried). Smaller
    /// transactions in the same order have the same outcomes, and nothing is
    /// acked before all of them committed. Later batches start from the
    /// size that fit (see [`Session::group_limit`]).
    async fn apply_in_order(
        &self,
        ch: &Channel,
        session: &Session,
        items: &[BatchItem<'_>],
        shutdown: &CancellationToken,
    ) -> Result<Vec<ItemResult>, BrokerError> {
        let mut results = Vec::with_capacity(items.len());
        let mut groups: VecDeque<&[BatchItem<'_>]> =
            items.chunks(session.group_limit().max(1)).collect();
        while let Some(group) = groups.pop_front() {
            let splittable = group.len() > 1;
            let applied = self
                .held_unless(
                    ch,
                    shutdown,
                    |e| splittable && lock_table_full(e),
                    || session.apply_batch(group, self.shard),
                )
                .await;
            match applied {
                Ok(done) => results.extend(done.into_iter().map(|r| (r, None))),
                Err(Held::GaveUp) => {
                    let (first, second) = group.split_at(group.len() / 2);
                    warn!(
                        messages = group.len(),
                        "PostgreSQL's lock table cannot hold this batch's per-entity locks \
                         (out of shared memory); applying it in halves (raise \
                         max_locks_per_transaction or lower BATCH_MAX)"
                    );
                    metrics::counter!(m::RETRIES_TOTAL, "shard" => session.metrics.shard.clone(), "reason" => RetryReason::LockTableFull.label())
                        .increment(1);
                    session.lower_group_limit(first.len());
                    groups.push_front(second);
                    groups.push_front(first);
                }
                Err(Held::Abandon) => return Err(BrokerError::ChannelLost),
                Err(Held::Refused(_)) => {
                    results.extend(self.one_by_one(ch, session, group, shutdown).await?)
                }
            }
        }
        Ok(results)
    }

    /// After the database refused the batch: each item in its own
    /// transaction, in order; a refused message is dead-lettered alone.
    async fn one_by_one(
        &self,
        ch: &Channel,
        session: &Session,
        items: &[BatchItem<'_>],
        shutdown: &CancellationToken,
    ) -> Result<Vec<ItemResult>, BrokerError> {
        warn!("the database refused a batch; applying it one message at a time");
        let mut results = Vec::with_capacity(items.len());
        for item in items {
            let single = std::slice::from_ref(item);
            let applied = self
                .held(ch, shutdown, || session.apply_batch(single, self.shard))
                .await;
            match applied {
                Ok(mut one) => results.push((one.pop().unwrap_or(BatchResult::Marker), None)),
                Err(Held::Abandon | Held::GaveUp) => return Err(BrokerError::ChannelLost),
                Err(Held::Refused(error)) => {
                    let outcome = Outcome::DeadLettered(Rejection::DatabaseRefused);
                    results.push((BatchResult::Event(Applied::Done(outcome)), Some(error)));
                }
            }
        }
        Ok(results)
    }
}

/// SQLSTATE 53200 (`out_of_memory`): PostgreSQL says "out of shared memory"
/// when its lock table is full.
fn lock_table_full(error: &StoreError) -> bool {
    match error {
        StoreError::Transient {
            source: sqlx::Error::Database(db),
            ..
        } => db.code().as_deref() == Some("53200"),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::{BATCH_MAX_BODY_BYTES, batch_full};

    #[test]
    fn a_batch_is_bounded_by_count_and_by_body_bytes() {
        assert!(!batch_full(1, 100, 256));
        assert!(batch_full(256, 100, 256));
        assert!(batch_full(4, 4 * 2 * 1024 * 1024, 256), "four 2 MiB bodies");
        assert!(!batch_full(3, BATCH_MAX_BODY_BYTES - 1, 256));
    }
}
