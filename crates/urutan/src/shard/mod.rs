//! One worker per shard queue: deliveries in, outcomes out.
//!
//! Invariants:
//! - one consumer per shard queue (single active consumer across replicas),
//!   `basic_qos(PREFETCH)` and manual acks;
//! - deliveries are handled one at a time, in arrival order; a message is
//!   acked only after its transaction committed;
//! - a transient database failure holds the message (retried with capped,
//!   jittered backoff) so nothing behind it overtakes it;
//! - on shutdown the in-flight message is finished and acked, and the
//!   consumer is cancelled *before* that ack, so no further delivery is
//!   pushed to this worker while a standby takes over;
//! - epoch markers move the shard's position (see [`crate::reshard::handoff`]); a
//!   message whose entity is being handed over is parked, and the worker
//!   releases its parked messages as soon as they may go.
//!
//! A delivery goes through `decode` (marker, event or contract violation:
//! one path for both modes), then `steps` (strict mode: apply with held
//! retries, record the outcome) or `batch` (several in one transaction),
//! then `settle` (the one place that acks or rejects). This file runs the
//! consume loop and the clean stop.

mod batch;
mod decode;
mod hooks;
mod lease;
mod link;
mod settle;
mod steps;

use lease::Session;
use settle::InHand;
use steps::Held;

pub(crate) use hooks::env_number;
pub use hooks::{EventHook, HookError, Hooks, Observed, OutcomeHook};
pub use link::Link;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt};
use lapin::message::Delivery;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, error, field, info_span, warn};

use crate::broker::{BrokerError, call};
use crate::health::Health;
use crate::metrics::RetryReason;
use crate::reshard::handoff;

use crate::outcome::{Outcome, Settle};

/// How long a held message may keep retrying after shutdown was requested.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);

/// At shutdown, how long to wait for a delivery the broker may already have
/// sent (after an ack, the next message is on its way within a millisecond).
const SHUTDOWN_LINGER: Duration = Duration::from_millis(250);

/// Everything one shard worker needs.
#[derive(Clone)]
pub struct ShardWorker {
    pub shard: u16,
    pub queue: String,
    pub prefetch: u16,
    /// Deliveries per transaction (1: strict mode).
    pub batch_size: u16,
    /// How long a batch waits for more deliveries after its first.
    pub batch_linger: Duration,
    pub delivery_limit: u32,
    pub max_body_bytes: usize,
    /// The longest one database step (a transaction) may take before it is
    /// abandoned and retried: a silent link must not hold a message forever.
    pub database_timeout: Duration,
    pub pool: PgPool,
    pub health: Arc<Health>,
    pub hooks: Hooks,
}

/// What handling one delivery decided.
enum Decision {
    /// Durable (or refused by contract): settle as the outcome says.
    Done(Outcome),
    /// Recorded and parked (its outcome comes at release), or an epoch
    /// marker passed: ack, and look for parked messages to release.
    Ack,
    /// The handler failed on this message (`reason`: the retry label,
    /// `error`: what failed): reject with requeue.
    Requeue { reason: RetryReason, error: String },
    /// The channel died while the message was held: say nothing, it comes back.
    Abandon,
}

/// Why [`ShardWorker::run`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// `shutdown` was cancelled: stopped cleanly.
    Stopped,
    /// The shard was retired (a shrink drained and deleted its queue).
    Retired,
    /// The connection was lost: connect again to go on.
    ConnectionLost,
}

impl ShardWorker {
    /// Consumes the shard on `conn` until `shutdown`, or until the connection
    /// is lost (the caller then reconnects and runs it again). A
    /// channel-level failure on a live connection reopens the channel.
    pub async fn run(self, conn: Arc<Connection>, shutdown: CancellationToken) -> Ended {
        loop {
            let result = self.consume(&conn, &shutdown).await;
            self.health.set_consumer(self.shard, false);
            let Err(e) = result else {
                return Ended::Stopped;
            };
            if crate::reshard::retire::is_retired(&self.pool, self.shard).await {
                debug!(shard = self.shard, "shard retired; its worker stops");
                self.health.retire(self.shard);
                return Ended::Retired;
            }
            if !conn.status().connected() {
                debug!(shard = self.shard, error = %e, "connection lost");
                return Ended::ConnectionLost;
            }
            warn!(shard = self.shard, error = %e, "shard channel failed; reopening it");
            tokio::select! {
                () = shutdown.cancelled() => return Ended::Stopped,
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    /// One channel's life: register the consumer, handle deliveries in order.
    async fn consume(
        &self,
        conn: &Connection,
        shutdown: &CancellationToken,
    ) -> Result<(), BrokerError> {
        let ch = call("channel.open", conn.create_channel()).await?;
        call(
            "basic.qos",
            ch.basic_qos(self.prefetch, BasicQosOptions::default()),
        )
        .await?;
        let tag = format!("urutan-{}-{}", std::process::id(), self.queue);
        let mut consumer = call(
            "basic.consume",
            ch.basic_consume(
                self.queue.as_str().into(),
                tag.as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            ),
        )
        .await?;
        self.health.set_consumer(self.shard, true);
        let session = Session::new(self.pool.clone(), self.shard, self.database_timeout);
        let mut release_tick = tokio::time::interval(handoff::RELEASE_EVERY);
        release_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Parked messages may be left from an earlier life: look once.
        let mut parked = true;
        loop {
            let due = session.due();
            let next = tokio::select! {
                biased;
                () = shutdown.cancelled() => None,
                _ = release_tick.tick(), if parked => {
                    parked = self.release_parked(&session).await;
                    continue;
                }
                next = consumer.next() => Some(next),
                // Idle: the kept database connection goes back to the pool.
                () = tokio::time::sleep_until(due.unwrap_or_else(tokio::time::Instant::now)),
                    if due.is_some() => {
                    session.give_back();
                    continue;
                }
            };
            let delivery = match next {
                None => {
                    let finished = self.finish(&ch, &tag, &mut consumer, &session, Vec::new());
                    return finished.await;
                }
                Some(Some(Ok(delivery))) => delivery,
                Some(Some(Err(e))) => return Err(e.into()),
                Some(None) => return Err(BrokerError::ConsumerCancelled),
            };
            let received = Instant::now();
            let mut deliveries = vec![delivery];
            if self.batch_size > 1 {
                self.fill(&mut consumer, &mut deliveries).await?;
            }
            let (settles, may_release) = if deliveries.len() == 1 {
                let (settle, may_release) = self
                    .process(&ch, &session, &deliveries[0], shutdown)
                    .await?;
                (vec![settle], may_release)
            } else {
                self.process_batch(&ch, &session, &deliveries, shutdown)
                    .await?
            };
            parked |= may_release;
            let in_hand: Vec<InHand> = deliveries
                .into_iter()
                .zip(settles)
                .map(|(delivery, settle)| InHand {
                    delivery,
                    settle,
                    received,
                })
                .collect();
            if shutdown.is_cancelled() {
                return self
                    .finish(&ch, &tag, &mut consumer, &session, in_hand)
                    .await;
            }
            settle::settle_all(&in_hand, &session.metrics).await?;
        }
    }

    /// Shutdown without spending a delivery or breaking order. Acks are held
    /// back, so the prefetch window cannot grow: every delivery the broker
    /// already pushed is processed (waiting `SHUTDOWN_LINGER` for one still
    /// in flight); then the consumer is cancelled — a standby may start now,
    /// everything of ours is committed — and only then is everything acked.
    /// Idle, the channel is just closed: a delivery racing in is returned to
    /// the front of the queue before any standby starts.
    async fn finish(
        &self,
        ch: &Channel,
        tag: &str,
        consumer: &mut lapin::Consumer,
        session: &Session,
        mut unsettled: Vec<InHand>,
    ) -> Result<(), BrokerError> {
        let stopping = CancellationToken::new();
        stopping.cancel();
        while let Ok(Some(next)) = tokio::time::timeout(SHUTDOWN_LINGER, consumer.next()).await {
            let delivery = next?;
            let received = Instant::now();
            let (settle, _) = self.process(ch, session, &delivery, &stopping).await?;
            unsettled.push(InHand {
                delivery,
                settle,
                received,
            });
        }
        if !unsettled.is_empty() {
            let cancel = ch.basic_cancel(tag.into(), BasicCancelOptions::default());
            call("basic.cancel", cancel).await?;
            settle::settle_all(&unsettled, &session.metrics).await?;
        }
        let _ = call("channel.close", ch.close(200, "shutting down".into())).await;
        Ok(())
    }

    /// Decides one delivery inside its span (a panic becomes a requeue).
    /// Returns the broker action and whether parked messages may now be
    /// releasable.
    async fn process(
        &self,
        ch: &Channel,
        session: &Session,
        delivery: &Delivery,
        shutdown: &CancellationToken,
    ) -> Result<(Settle, bool), BrokerError> {
        let span = info_span!(
            "message",
            shard = self.shard,
            message_id = field::Empty,
            entity_id = field::Empty,
            redelivered = delivery.redelivered,
        );
        async {
            let decided = AssertUnwindSafe(self.decide(ch, session, delivery, shutdown))
                .catch_unwind()
                .await;
            let decision = decided.unwrap_or_else(|panic| {
                error!("the handler panicked on this message; requeueing it");
                Decision::Requeue {
                    reason: RetryReason::Panic,
                    error: hooks::panic_message(panic.as_ref()),
                }
            });
            let message_id = delivery.properties.message_id().as_ref();
            let message_id = message_id.map(|id| id.as_str());
            Ok(match decision {
                Decision::Abandon => return Err(BrokerError::ChannelLost),
                Decision::Done(outcome) => {
                    if let Outcome::DeadLettered(rejection) = outcome {
                        let row =
                            crate::dead_letter::rejected(delivery, self.shard, rejection, None);
                        self.record_dead_letters(ch, session, vec![row], shutdown)
                            .await?;
                    }
                    (self.record(session, outcome, message_id), false)
                }
                Decision::Ack => (Settle::Ack, true),
                Decision::Requeue { reason, error } => {
                    let requeue = self.requeue(ch, session, delivery, reason, &error, shutdown);
                    (requeue.await?, false)
                }
            })
        }
        .instrument(span)
        .await
    }
}
