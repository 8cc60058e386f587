//! The steps of handling one delivery: decide (marker, decode, apply with
//! held retries), record the outcome, requeue a failing message, release
//! parked messages.

use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBuilder};
use lapin::Channel;
use lapin::message::Delivery;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::decode::{self, Read};
use super::{Decision, Observed, SHUTDOWN_GRACE, Session, ShardWorker};
use crate::broker::{BrokerError, delivery};
use crate::dead_letter;
use crate::message::{self, Rejection};
use crate::metrics::{self as m, RetryReason};
use crate::outcome::{Outcome, Settle};
use crate::reshard::handoff;
use crate::store::{self, Applied, NewDeadLetter, StoreError};

/// Entities released per release call (one transaction).
const RELEASE_BATCH: i32 = 200;

/// Why a held database step stopped without a result.
pub(super) enum Held {
    /// The database refused this message's data (the error, for the record).
    Refused(String),
    /// The channel died, or shutdown's grace ran out: the message comes back.
    Abandon,
    /// The caller's `give_up` matched this transient error: the caller has
    /// a better answer than waiting (e.g. a smaller transaction).
    GaveUp,
}

impl ShardWorker {
    /// Marker or message; decodes, then applies with held retries.
    pub(super) async fn decide(
        &self,
        ch: &Channel,
        session: &Session,
        delivery: &Delivery,
        shutdown: &CancellationToken,
    ) -> Decision {
        let event = match decode::read(delivery, &self.queue, self.max_body_bytes) {
            Read::Event(event) => event,
            Read::Invalid(rejection) => return Decision::Done(Outcome::DeadLettered(rejection)),
            Read::Marker(epoch) => {
                // A step on the pool itself: never wait for a second
                // connection while keeping one (with a pool smaller than the
                // shard count, workers would wait on each other).
                session.give_back();
                let passed = self
                    .held(ch, shutdown, || async {
                        Ok(handoff::pass_recorded_marker(&self.pool, self.shard, epoch).await?)
                    })
                    .await;
                return match passed {
                    Ok(true) => {
                        debug!(epoch, "passed an epoch marker");
                        Decision::Ack
                    }
                    Ok(false) => {
                        warn!(epoch, "a marker for an epoch urutan never recorded");
                        Decision::Done(Outcome::DeadLettered(Rejection::ReservedHeader))
                    }
                    Err(Held::Abandon | Held::GaveUp) => Decision::Abandon,
                    Err(Held::Refused(error)) => Decision::Requeue {
                        reason: RetryReason::Refused,
                        error,
                    },
                };
            }
        };
        if let Some(hook) = &self.hooks.before_apply {
            hook(&event);
        }
        let applied = self
            .held(ch, shutdown, || session.apply(&event, self.shard))
            .await;
        match applied {
            Ok(Applied::Done(outcome)) => {
                session.record_lag(&event);
                Decision::Done(outcome)
            }
            Ok(Applied::Parked) => {
                session.metrics.parked.increment(1);
                debug!("parked until older messages of this entity are done");
                Decision::Ack
            }
            Err(Held::Refused(error)) => Decision::Requeue {
                reason: RetryReason::Refused,
                error,
            },
            Err(Held::Abandon | Held::GaveUp) => Decision::Abandon,
        }
    }

    /// Runs a database step for the delivery in hand, holding it through
    /// transient failures (capped, jittered backoff) so nothing behind it
    /// overtakes it.
    pub(super) async fn held<T, F, Fut>(
        &self,
        ch: &Channel,
        shutdown: &CancellationToken,
        step: F,
    ) -> Result<T, Held>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        self.held_unless(ch, shutdown, |_| false, step).await
    }

    /// [`Self::held`], but a transient error that `give_up` matches ends it
    /// at once with [`Held::GaveUp`].
    pub(super) async fn held_unless<T, F, Fut>(
        &self,
        ch: &Channel,
        shutdown: &CancellationToken,
        give_up: impl Fn(&StoreError) -> bool,
        mut step: F,
    ) -> Result<T, Held>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        let mut backoff = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(50))
            .with_max_delay(Duration::from_secs(5))
            .with_jitter()
            .without_max_times()
            .build();
        let mut shutdown_at: Option<Instant> = None;
        loop {
            let error = match step().await {
                Ok(value) => return Ok(value),
                Err(StoreError::Refused(e)) => {
                    warn!(error = %e, "the database refused this message");
                    return Err(Held::Refused(e.to_string()));
                }
                Err(e) if give_up(&e) => return Err(Held::GaveUp),
                Err(e) => e,
            };
            metrics::counter!(m::RETRIES_TOTAL, "shard" => self.shard.to_string(), "reason" => error.reason().label())
                .increment(1);
            self.health.set_database(false);
            if !ch.status().connected() {
                return Err(Held::Abandon);
            }
            if shutdown.is_cancelled()
                && shutdown_at.get_or_insert_with(Instant::now).elapsed() > SHUTDOWN_GRACE
            {
                warn!("giving up a held message at shutdown; it will be redelivered");
                return Err(Held::Abandon);
            }
            let delay = backoff.next().unwrap_or(Duration::from_secs(5));
            warn!(error = %error, retry_in = ?delay, "database unavailable; holding the message");
            tokio::time::sleep(delay).await;
        }
    }

    /// Counts, logs and reports an outcome; returns the broker action.
    pub(super) fn record(
        &self,
        session: &Session,
        outcome: Outcome,
        message_id: Option<&str>,
    ) -> Settle {
        if let Some(hook) = &self.hooks.on_outcome {
            hook(&Observed {
                shard: self.shard,
                outcome,
                message_id,
            });
        }
        session.metrics.outcome(outcome);
        match outcome {
            Outcome::DeadLettered(rejection) => {
                warn!(reason = rejection.reason(), detail = %rejection, "dead-lettering a message");
                let shard = session.metrics.shard.clone();
                metrics::counter!(m::DEAD_LETTERS_TOTAL, "shard" => shard, "reason" => rejection.reason())
                    .increment(1);
            }
            other => debug!(outcome = other.label(), "handled"),
        }
        outcome.settle()
    }

    /// A handler failure: requeue it, and if that return exhausts the queue's
    /// delivery limit (the queue then dead-letters it), record it (with
    /// `error`, the last failure) and count it as such. Otherwise record it
    /// as returned first: the broker may redeliver it behind later messages
    /// (RabbitMQ 3.10.8 after a delivery-limit dead letter), and a newer
    /// version of its order must wait for it.
    pub(super) async fn requeue(
        &self,
        ch: &Channel,
        session: &Session,
        delivery: &Delivery,
        reason: RetryReason,
        error: &str,
        shutdown: &CancellationToken,
    ) -> Result<Settle, BrokerError> {
        metrics::counter!(m::RETRIES_TOTAL, "shard" => self.shard.to_string(), "reason" => reason.label())
            .increment(1);
        let returns = delivery::previous_deliveries(delivery) + 1;
        if returns > u64::from(self.delivery_limit) {
            let rejection = Rejection::DeliveryLimit;
            let row = dead_letter::rejected(delivery, self.shard, rejection, Some(error));
            self.record_dead_letters(ch, session, vec![row], shutdown)
                .await?;
            let message_id = delivery.properties.message_id().as_ref();
            let outcome = Outcome::DeadLettered(rejection);
            self.record(session, outcome, message_id.map(|id| id.as_str()));
        } else if let Ok(event) =
            message::decode(&delivery::envelope(delivery), self.max_body_bytes)
        {
            let recorded = self
                .held(ch, shutdown, || session.record_returned(&event, self.shard))
                .await;
            match recorded {
                Ok(()) => {}
                Err(Held::Abandon | Held::GaveUp) => return Err(BrokerError::ChannelLost),
                // Cannot happen (nothing in the row is the producer's to
                // refuse); the message is requeued unrecorded, as before.
                Err(Held::Refused(e)) => {
                    error!(error = %e, "cannot record a returned message")
                }
            }
        }
        Ok(Settle::Requeue)
    }

    /// Commits the dead-letter records of deliveries about to go to the
    /// DLQ, BEFORE their reject: held through transient database failures
    /// like any other write, so no message reaches the DLQ without its row
    /// (while the database is down, a contract violation waits in its shard
    /// like every other message). A crash between commit and reject
    /// redelivers the message, whose second record is absorbed by the
    /// unique delivery key. Should PostgreSQL refuse a record's data (the
    /// record is sanitised so that it does not), the record is written
    /// without the message's content; refused again, the message is
    /// dead-lettered without a row, and `urutan dlq` records it from the queue.
    pub(super) async fn record_dead_letters(
        &self,
        ch: &Channel,
        session: &Session,
        rows: Vec<NewDeadLetter>,
        shutdown: &CancellationToken,
    ) -> Result<(), BrokerError> {
        if rows.is_empty() {
            return Ok(());
        }
        let full = self
            .held(ch, shutdown, || session.record_dead_letters(&rows))
            .await;
        let refused = match full {
            Ok(()) => return Ok(()),
            Err(Held::Abandon | Held::GaveUp) => return Err(BrokerError::ChannelLost),
            Err(Held::Refused(e)) => e,
        };
        warn!(error = %refused, "the database refused a dead-letter record; recording it without the message's content");
        let minimal: Vec<NewDeadLetter> = rows.iter().map(NewDeadLetter::minimal).collect();
        let bare = self
            .held(ch, shutdown, || session.record_dead_letters(&minimal))
            .await;
        match bare {
            Ok(()) => Ok(()),
            Err(Held::Abandon | Held::GaveUp) => Err(BrokerError::ChannelLost),
            Err(Held::Refused(e)) => {
                error!(error = %e, "cannot record the dead letter; dead-lettering it without a record (`urutan dlq list` records it from the queue)");
                Ok(())
            }
        }
    }

    /// Applies this shard's parked messages that may go now. Returns true
    /// while some remain parked. A database failure only delays it.
    pub(super) async fn release_parked(&self, session: &Session) -> bool {
        // On the pool itself: see the marker step in `decide`.
        session.give_back();
        let released = match handoff::release(&self.pool, self.shard, RELEASE_BATCH).await {
            Ok(released) => released,
            Err(e) => {
                warn!(shard = self.shard, error = %e, "cannot release parked messages yet");
                return true;
            }
        };
        let handoffs = released.iter().filter(|r| r.first_of_order).count();
        for r in &released {
            // A parked message's id was claimed for its own order when it
            // parked (a reused id is dead-lettered then, never parked), so a
            // release is `applied` or `stale`; it was acked long ago and
            // there is nothing left to dead-letter.
            match store::parse_result(&r.result) {
                Applied::Done(Outcome::DeadLettered(rejection)) => error!(
                    message_id = ?r.message_id,
                    reason = rejection.reason(),
                    "a released message cannot be dead-lettered (it was acked when it parked)"
                ),
                Applied::Done(outcome) => {
                    self.record(session, outcome, Some(&r.message_id));
                }
                Applied::Parked => {}
            }
            metrics::histogram!(m::HANDOFF_DURATION_SECONDS).record(r.waited_s);
        }
        if !released.is_empty() {
            metrics::counter!(m::HANDOFFS_TOTAL).increment(handoffs as u64);
            info!(
                shard = self.shard,
                messages = released.len(),
                entities = handoffs,
                "released parked messages (handoff complete)"
            );
        }
        match handoff::parked(&self.pool, self.shard).await {
            Ok(left) => {
                metrics::gauge!(m::PARKED_MESSAGES, "shard" => self.shard.to_string())
                    .set(left as f64);
                left > 0
            }
            Err(_) => true,
        }
    }
}
