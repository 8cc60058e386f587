//! Ordered batch mode (PREFETCH > 1): the deliveries already buffered, in
//! arrival order, up to BATCH_MAX, applied in ONE transaction with exactly
//! the outcomes they would have one by one, then acked with one
//! `multiple = true` ack.
//!
//! Failures never cost an innocent message:
//! - a contract violation is dead-lettered alone; the rest goes on in order;
//! - a transient database error holds the whole batch and retries it, in order;
//! - a batch that loses to another transaction (a deadlock, a serialization
//!   failure) is applied in halves, in order, down to single messages, so
//!   that the rest of it commits; a single message is tried again at once a
//!   few times, then set aside with a backoff (`steps::again_if_contended`);
//! - a handler that fails on one message (a panic) is retried in place up to
//!   the delivery limit, then only that message is dead-lettered
//!   (`basic.reject` without requeue, reason `delivery_limit`): requeueing it
//!   would put it behind the rest of the batch and break order;
//! - if the database refuses the batch because of one message's data, the
//!   batch is applied one message per transaction and only the refused one is
//!   dead-lettered (reason `database_refused`).

use std::collections::VecDeque;
use std::time::Instant;

use futures::StreamExt;
use lapin::message::Delivery;
use tracing::{Instrument, debug, error, info_span, warn};

use super::decode::{self, Read};
use super::steps::{Held, Step, message_id};
use super::{Context, traced};
use crate::broker::{BrokerError, delivery};
use crate::message::{Event, Rejection};
use crate::metrics::RetryReason;
use crate::outcome::{Outcome, Settle};
use crate::store::{Applied, BatchItem, BatchResult, StoreError};
use crate::trace;

/// One delivery of a batch after the pure steps.
enum Checked {
    Marker(i64),
    Event(Event),
    /// Refused, with the handler's last error (a delivery limit reached in place).
    Dead(Rejection, Option<String>),
}

impl Checked {
    /// The delivery's event, if it is one (a marker's outcome has no lag).
    fn event(&self) -> Option<&Event> {
        match self {
            Checked::Event(event) => Some(event),
            Checked::Marker(_) | Checked::Dead(..) => None,
        }
    }
}

/// What the batch transaction(s) did with one item, and the database's
/// error if it refused that item alone.
type ItemResult = (BatchResult, Option<String>);

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

impl Context<'_> {
    /// Adds to `batch` the deliveries that arrive within BATCH_LINGER_MS of
    /// the first one, up to the batch size or [`BATCH_MAX_BODY_BYTES`].
    pub(super) async fn fill(&mut self, batch: &mut Vec<Delivery>) -> Result<(), BrokerError> {
        let deadline = tokio::time::Instant::now() + self.worker.batch_linger;
        let mut bytes: usize = batch.iter().map(|d| d.data.len()).sum();
        while !batch_full(batch.len(), bytes, self.worker.batch_size) {
            match tokio::time::timeout_at(deadline, self.consumer.next()).await {
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
        deliveries: &[Delivery],
    ) -> Result<(Vec<Settle>, bool), BrokerError> {
        // Instrumented, never entered: a guard held across an await stays
        // entered on the thread while the task is parked (another shard's
        // work then runs inside it) and is left on another thread after the
        // task moved, which corrupts the subscriber's span stack; its
        // `assert` then panicked a shard's worker task and stranded the
        // shard (issue 44; clippy.toml forbids holding one across an await).
        let span = info_span!("batch", shard = self.worker.shard, size = deliveries.len());
        self.decide_batch(deliveries).instrument(span).await
    }

    /// [`Self::process_batch`] inside its span.
    async fn decide_batch(
        &self,
        deliveries: &[Delivery],
    ) -> Result<(Vec<Settle>, bool), BrokerError> {
        let mut traces: Vec<trace::Span> = deliveries
            .iter()
            .map(|d| self.start_apply_span(d))
            .collect();
        let prepared: Vec<Checked> = deliveries
            .iter()
            .zip(&mut traces)
            .map(|(d, trace)| self.prepare(d, trace))
            .collect();
        // A version refused at the delivery limit holds its order before
        // anything of this batch is applied (its later versions here wait).
        for (delivery, checked) in deliveries.iter().zip(&prepared) {
            if let Checked::Dead(Rejection::DeliveryLimit, error) = checked {
                self.hold_delivery(delivery, error.as_deref()).await?;
            }
        }
        let items: Vec<BatchItem<'_>> = prepared
            .iter()
            .filter_map(|p| match p {
                Checked::Marker(epoch) => Some(BatchItem::Marker(*epoch)),
                Checked::Event(event) => Some(BatchItem::Event(event)),
                Checked::Dead(..) => None,
            })
            .collect();
        let started = Instant::now();
        let mut results = self.apply_in_order(&items).await?.into_iter();
        let took = started.elapsed();
        let steps: Vec<Step> = prepared
            .iter()
            .map(|prepared| match prepared {
                Checked::Dead(rejection, error) => {
                    Step::Done(Outcome::DeadLettered(*rejection), error.clone())
                }
                Checked::Marker(_) | Checked::Event(_) => match results.next() {
                    Some((BatchResult::Event(applied), error)) => {
                        self.applied(prepared.event(), applied, error)
                    }
                    // A passed marker (the function answers every item).
                    Some((BatchResult::Marker, _)) | None => Step::Ack,
                },
            })
            .collect();
        for ((trace, step), prepared) in traces.iter_mut().zip(&steps).zip(&prepared) {
            if let Checked::Event(_) = prepared {
                traced::applied_in(trace, took, 1);
                trace.set("urutan.batch.size", deliveries.len() as i64);
            }
            if let Step::Ack = step
                && let Checked::Event(_) = prepared
            {
                trace.event("parked_or_set_aside");
            }
            traced::outcome(trace, step);
        }
        self.conclude(deliveries, steps).await
    }

    /// The pure part of one delivery: marker, contract check, and the
    /// before-apply hook, retried in place up to the delivery limit.
    fn prepare(&self, delivery: &Delivery, trace: &mut trace::Span) -> Checked {
        let mut event = match decode::read(
            delivery,
            &self.worker.queue,
            &self.worker.entity_header,
            self.worker.max_body_bytes,
        ) {
            Read::Event(event) => event,
            Read::Marker(epoch) => return Checked::Marker(epoch),
            Read::Invalid(rejection) => {
                warn!(
                    message_id = message_id(delivery).unwrap_or(""),
                    reason = rejection.reason(),
                    "contract violation in a batch"
                );
                return Checked::Dead(rejection, None);
            }
        };
        traced::describe(trace, &mut event);
        let attempts = u64::from(self.worker.delivery_limit) + 1;
        let left = attempts
            .saturating_sub(delivery::previous_deliveries(delivery))
            .max(1);
        let mut last_error = None;
        for attempt in 1..=left {
            let Err(panic) = self.worker.hooks.run_before_apply(&event) else {
                return Checked::Event(event);
            };
            last_error = Some(panic);
            error!(message_id = ?event.message_id, attempt, "the handler panicked on this message");
            self.retried(RetryReason::Panic);
        }
        Checked::Dead(Rejection::DeliveryLimit, last_error)
    }

    /// Applies `items` in arrival order: in ONE transaction, unless the
    /// database's lock table cannot hold that transaction's per-entity locks
    /// (SQLSTATE 53200, "out of shared memory"; about one lock per distinct
    /// entity, held until commit). Then the group is split in halves, applied
    /// in order, each in its own transaction, down to single messages (for
    /// which 53200 is transient again: held and retried). A group that
    /// loses to another transaction (class 40) is split the same way, and a
    /// single message is tried again at once before it is set aside. Smaller
    /// transactions in the same order have the same outcomes, and nothing is
    /// acked before all of them committed. Later batches start from the
    /// size that fit (see [`super::Session::group_limit`]).
    async fn apply_in_order(
        &self,
        items: &[BatchItem<'_>],
    ) -> Result<Vec<ItemResult>, BrokerError> {
        let mut results = Vec::with_capacity(items.len());
        let mut groups: VecDeque<&[BatchItem<'_>]> =
            items.chunks(self.session.group_limit().max(1)).collect();
        while let Some(group) = groups.pop_front() {
            let splittable = group.len() > 1;
            // A transient failure of one message's own (the handler asked
            // to retry, a lock timeout, ...): one by one, so that only that
            // message is set aside. A single message that lost to another
            // transaction is tried again at once first.
            let give_up = |e: &StoreError| (splittable && lock_table_full(e)) || e.sets_aside();
            let applied = self
                .held_unless(give_up, || async move {
                    if splittable {
                        self.session.apply_batch(group).await
                    } else {
                        self.again_if_contended(|| self.session.apply_batch(group))
                            .await
                    }
                })
                .await;
            match applied {
                Ok(done) => results.extend(done.into_iter().map(|r| (r, None))),
                // Lost to another transaction (a deadlock, a serialization
                // failure): in halves, in order, so that the rest commits
                // while only the message that keeps losing is set aside.
                Err(Held::GaveUp(e)) if splittable && e.contended() => {
                    self.retried(e.reason());
                    self.session.lost_to_another();
                    let (first, second) = group.split_at(group.len() / 2);
                    debug!(messages = group.len(), error = %e, "a batch lost to another transaction; applying it in halves");
                    groups.push_front(second);
                    groups.push_front(first);
                }
                Err(Held::GaveUp(e)) if e.sets_aside() => {
                    results.extend(self.one_by_one(group).await?);
                }
                Err(Held::GaveUp(_)) => {
                    let (first, second) = group.split_at(group.len() / 2);
                    warn!(
                        messages = group.len(),
                        "PostgreSQL's lock table cannot hold this batch's per-entity locks \
                         (out of shared memory); applying it in halves (raise \
                         max_locks_per_transaction or lower BATCH_MAX)"
                    );
                    self.retried(RetryReason::LockTableFull);
                    self.session.lower_group_limit(first.len());
                    groups.push_front(second);
                    groups.push_front(first);
                }
                Err(Held::Abandon) => return Err(BrokerError::ChannelLost),
                Err(Held::Refused(_)) => results.extend(self.one_by_one(group).await?),
            }
        }
        Ok(results)
    }

    /// After the batch failed for one of its messages: each item in its own
    /// transaction, in order. A message refused is dead-lettered alone (the
    /// handler's refusal holds its order first, with ON_REFUSED=hold, so
    /// that its later versions in this batch wait); one that fails
    /// transiently is set aside.
    async fn one_by_one(&self, items: &[BatchItem<'_>]) -> Result<Vec<ItemResult>, BrokerError> {
        warn!("a batch failed on one of its messages; applying it one message at a time");
        let mut results = Vec::with_capacity(items.len());
        for item in items {
            let single = std::slice::from_ref(item);
            let give_up = |e: &StoreError| e.sets_aside() && matches!(item, BatchItem::Event(_));
            let applied = self
                .held_unless(give_up, || {
                    self.again_if_contended(|| self.session.apply_batch(single))
                })
                .await;
            results.push(match (applied, item) {
                (Ok(mut one), _) => (one.pop().unwrap_or(BatchResult::Marker), None),
                (Err(Held::Abandon), _) | (Err(Held::GaveUp(_)), BatchItem::Marker(_)) => {
                    return Err(BrokerError::ChannelLost);
                }
                (Err(Held::GaveUp(error)), BatchItem::Event(event)) => {
                    match self.set_aside(event, &error).await? {
                        Step::Done(outcome, _) => {
                            (BatchResult::Event(Applied::Done(outcome)), None)
                        }
                        Step::Ack => (BatchResult::Event(Applied::Parked), None),
                        Step::Requeue { error, .. } => {
                            let outcome = Outcome::DeadLettered(Rejection::DatabaseRefused);
                            (BatchResult::Event(Applied::Done(outcome)), Some(error))
                        }
                    }
                }
                (Err(Held::Refused(refusal)), item) => {
                    if let (Rejection::HandlerRefused, BatchItem::Event(event)) =
                        (refusal.rejection, item)
                    {
                        self.hold_order(event, Some(&refusal.error)).await?;
                    }
                    let outcome = Outcome::DeadLettered(refusal.rejection);
                    (
                        BatchResult::Event(Applied::Done(outcome)),
                        Some(refusal.error),
                    )
                }
            });
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
