//! One worker per shard queue: deliveries in, outcomes out.
//!
//! Invariants:
//! - one consumer per shard queue (single active consumer across replicas),
//!   `basic_qos(PREFETCH)` and manual acks;
//! - deliveries are handled one at a time, in arrival order; a message is
//!   acked only after its transaction committed;
//! - a transient database failure holds the message (retried with capped,
//!   jittered backoff) so nothing behind it overtakes it;
//! - a panic anywhere in the worker reopens its channel (what it held comes
//!   back from the queue): it never ends the worker, whose shard nothing
//!   else would consume;
//! - on shutdown the in-flight message is finished and acked, and the
//!   consumer is cancelled *before* that ack, so no further delivery is
//!   pushed to this worker while a standby takes over; the standby applies
//!   nothing until this worker has also handled what the broker sent it
//!   before the cancel (`handover`);
//! - epoch markers move the shard's position (see [`crate::reshard::handoff`]); a
//!   message whose entity is being handed over is parked, and the worker
//!   releases its parked messages as soon as they may go.
//!
//! # Layout
//!
//! [`ShardWorker`] is the shard's settings; it keeps a broker connection
//! (`link`) and reopens a failed channel. Each channel life is one
//! `Context` (as mini-redis's per-connection `Handler`): it owns the
//! channel and its consumer, the kept database connection (`lease`), the
//! shutdown token and the shard's metrics, runs the consume loop, and its
//! methods take only a delivery or a batch of them. A delivery goes through
//! `decode` (marker, event or contract violation: one path for both modes),
//! then `steps` (strict and pipelined mode: apply with held retries) or
//! `batch` (several in one transaction); both end in `steps`' one
//! conclusion (dead-letter records, then each outcome recorded and counted
//! in one place), then `settle` (the one place that acks or rejects). The
//! before-apply hook is called only through `Hooks::run_before_apply`.
//! This file runs the consume loop and the clean stop.

mod batch;
mod contention;
mod decode;
mod handover;
mod hooks;
mod lease;
mod link;
mod settle;
mod steps;
mod traced;

use lease::Session;
use settle::InHand;

pub use contention::Contention;
pub(crate) use hooks::env_number;
pub(crate) use hooks::panic_message;
pub use hooks::{EventHook, HookError, Hooks, Observed, OutcomeHook};
pub use link::Link;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt};
use lapin::message::Delivery;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, Consumer};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, error, field, info_span, warn};

use crate::broker::{BrokerError, call};
use crate::health::Health;
use crate::metrics::ShardMetrics;
use crate::outcome::Settle;
use crate::reshard::handoff;

/// How often a worker with nothing to release looks again (a hold an
/// operator ended lets its order's waiting versions go).
const RECHECK_PARKED: Duration = Duration::from_secs(2);

/// With `GAP_POLICY=wait`, how often a worker with parked messages looks
/// for orders whose missing version is overdue (`GAP_TIMEOUT`).
const GAP_CHECK_EVERY: Duration = Duration::from_secs(1);

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
    /// The header holding the entity id (`x-<ENTITY>-id`).
    pub entity_header: String,
    /// The entry exchange (where a replay of a dead letter goes) and the
    /// dead-letter exchange (where a version refused after its ack is
    /// published).
    pub entry_exchange: String,
    pub dead_letter_exchange: String,
    /// How a message set aside is tried again, and whether a refused
    /// version holds its order.
    pub retry: crate::store::hold::RetryPolicy,
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
    /// The team's Rust handler, if the binary was built with one
    /// ([`crate::handler`]).
    pub handler: Option<crate::handler::SharedHandler>,
    /// Where apply spans go ([`crate::trace`]; off: contexts only).
    pub traces: crate::trace::Traces,
    /// Shared by the pool's workers: whether their apply transactions go
    /// one at a time, because they lost to each other ([`Contention`]).
    pub contention: Arc<Contention>,
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
            let consumed = AssertUnwindSafe(self.consume(&conn, &shutdown))
                .catch_unwind()
                .await;
            self.health.set_consumer(self.shard, false);
            let result = consumed.unwrap_or_else(|panic| {
                // A panic outside a message's own guards (urutan's, a
                // hook's, the tracing subscriber's) must not end the
                // shard's worker: nothing would consume the shard again
                // and its versions would wait forever. Its channel is
                // gone with it: what it held comes back from the queue.
                let panic = hooks::panic_message(panic.as_ref());
                error!(
                    shard = self.shard,
                    panic, "the shard's worker panicked; opening its channel again"
                );
                Err(BrokerError::ChannelLost)
            });
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

    /// One channel's life.
    async fn consume(
        &self,
        conn: &Connection,
        shutdown: &CancellationToken,
    ) -> Result<(), BrokerError> {
        let mut context = Context::open(self, conn, shutdown.clone()).await?;
        context.run().await
    }
}

/// One channel life of a shard worker: it owns the consume loop and
/// everything the handling of a delivery needs, so that its methods take
/// only the delivery (or the batch).
struct Context<'w> {
    /// The shard's settings, pool and hooks.
    worker: &'w ShardWorker,
    /// The channel the consumer lives on: a held message is given up when
    /// it dies (the broker then redelivers it).
    ch: Channel,
    /// The consumer's tag: cancelled at shutdown before the last acks.
    tag: String,
    /// The shard queue's deliveries, in arrival order.
    consumer: Consumer,
    /// The database connection kept between deliveries.
    session: Session,
    /// Cancelled at shutdown: what is in hand is finished, then acked.
    shutdown: CancellationToken,
    /// The shard's metric handles (registered once per channel life).
    metrics: ShardMetrics,
    /// When `urutan_parked_messages` was last counted: a count reads every
    /// parked row of the shard, so the release step (every 200 ms) counts
    /// at most every [`handoff::PARKED_COUNT_EVERY`].
    parked_counted: std::sync::Mutex<Option<tokio::time::Instant>>,
}

impl<'w> Context<'w> {
    /// Opens a channel on `conn` and registers the shard's consumer.
    async fn open(
        worker: &'w ShardWorker,
        conn: &Connection,
        shutdown: CancellationToken,
    ) -> Result<Self, BrokerError> {
        let ch = call("channel.open", conn.create_channel()).await?;
        // Confirms: a version refused after its ack is published to the
        // dead-letter exchange on this channel (deliveries are unaffected).
        let confirms = ch.confirm_select(lapin::options::ConfirmSelectOptions::default());
        call("confirm.select", confirms).await?;
        let qos = ch.basic_qos(worker.prefetch, BasicQosOptions::default());
        call("basic.qos", qos).await?;
        let tag = format!("urutan-{}-{}", std::process::id(), worker.queue);
        let consumer = call(
            "basic.consume",
            ch.basic_consume(
                worker.queue.as_str().into(),
                tag.as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            ),
        )
        .await?;
        worker.health.set_consumer(worker.shard, true);
        let session = Session::new(
            worker.pool.clone(),
            worker.shard,
            worker.database_timeout,
            worker.handler.clone(),
            worker.contention.clone(),
        );
        Ok(Self {
            worker,
            ch,
            tag,
            consumer,
            session,
            shutdown,
            metrics: ShardMetrics::new(worker.shard),
            parked_counted: std::sync::Mutex::new(None),
        })
    }

    /// Handles deliveries in order until shutdown (then [`Self::finish`])
    /// or a broker failure; releases parked messages and gives the kept
    /// database connection back while idle.
    async fn run(&mut self) -> Result<(), BrokerError> {
        let mut release_tick = tokio::time::interval(handoff::RELEASE_EVERY);
        release_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Parked messages may be left from an earlier life: look once. And
        // look again now and then: a hold released by an operator, or by a
        // replay of its refused version, lets its order's versions go.
        let mut parked = true;
        let mut recheck = tokio::time::interval(RECHECK_PARKED);
        recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // GAP_POLICY=wait: orders whose next version is missing too long are held.
        let gap_timeout = self.worker.retry.gap_timeout;
        let mut gap_check = tokio::time::interval(GAP_CHECK_EVERY);
        gap_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first delivery comes once this consumer is active: a replica
        // that stopped may still be handing the shard over (`handover`).
        let mut first = true;
        loop {
            let due = self.session.due();
            let next = tokio::select! {
                biased;
                () = self.shutdown.cancelled() => None,
                _ = release_tick.tick(), if parked => {
                    parked = self.release_parked().await;
                    continue;
                }
                _ = recheck.tick(), if !parked => {
                    parked = true;
                    continue;
                }
                _ = gap_check.tick(), if parked && gap_timeout.is_some() => {
                    self.hold_gaps(gap_timeout.unwrap_or_default()).await;
                    continue;
                }
                next = self.consumer.next() => Some(next),
                // Idle: the kept database connection goes back to the pool.
                () = tokio::time::sleep_until(due.unwrap_or_else(tokio::time::Instant::now)),
                    if due.is_some() => {
                    self.session.give_back();
                    continue;
                }
            };
            let delivery = match next {
                None => return self.finish(Vec::new()).await,
                Some(Some(Ok(delivery))) => delivery,
                Some(Some(Err(e))) => return Err(e.into()),
                Some(None) => return Err(BrokerError::ConsumerCancelled),
            };
            if std::mem::take(&mut first) {
                self.session.give_back();
                handover::wait(&self.worker.pool, self.worker.shard).await;
            }
            let (in_hand, may_release) = self.handle(delivery).await?;
            parked |= may_release;
            if self.shutdown.is_cancelled() {
                return self.finish(in_hand).await;
            }
            settle::settle_all(&in_hand, &self.metrics).await?;
        }
    }

    /// Handles `first` and, in batch mode, the deliveries that follow it
    /// within the linger. Returns them with their broker actions, not sent
    /// yet, and whether parked messages may now be releasable.
    async fn handle(&mut self, first: Delivery) -> Result<(Vec<InHand>, bool), BrokerError> {
        let received = Instant::now();
        let mut deliveries = vec![first];
        if self.worker.batch_size > 1 {
            self.fill(&mut deliveries).await?;
        }
        let (settles, may_release) = if deliveries.len() == 1 {
            self.process(&deliveries[0]).await?
        } else {
            self.process_batch(&deliveries).await?
        };
        Ok((in_hand(deliveries, settles, received), may_release))
    }

    /// Shutdown without spending a delivery or breaking order. Acks are held
    /// back, so the prefetch window cannot grow: every delivery the broker
    /// already pushed is processed (waiting `SHUTDOWN_LINGER` for one still
    /// in flight). Then, holding the shard's handover lock, the consumer is
    /// cancelled — a standby may start now, and waits for the lock — and
    /// whatever the broker had sent before the cancel-ok is processed too;
    /// only then is everything acked and the lock let go (see `handover`).
    /// Idle, the channel is just closed: a delivery racing in is returned
    /// to the front of the queue before any standby starts.
    async fn finish(&mut self, mut unsettled: Vec<InHand>) -> Result<(), BrokerError> {
        // `shutdown` is cancelled here: a held message gets the shutdown grace.
        self.process_until_quiet(&mut unsettled).await?;
        if !unsettled.is_empty() {
            self.session.give_back();
            let limit = self.worker.database_timeout;
            match handover::Held::take(&self.worker.pool, self.worker.shard, limit).await {
                Some(lock) => {
                    let tag = self.tag.as_str().into();
                    let cancel = self.ch.basic_cancel(tag, BasicCancelOptions::default());
                    call("basic.cancel", cancel).await?;
                    // Everything sent before the cancel-ok is in hand now.
                    self.process_until_quiet(&mut unsettled).await?;
                    settle::settle_all(&unsettled, &self.metrics).await?;
                    lock.release().await;
                }
                // No cancel: acked and closed at once, so a delivery racing
                // in goes back to the front before any standby starts.
                None => settle::settle_all(&unsettled, &self.metrics).await?,
            }
        }
        let _ = call("channel.close", self.ch.close(200, "shutting down".into())).await;
        Ok(())
    }

    /// Processes deliveries until none arrives for `SHUTDOWN_LINGER`,
    /// adding them to `unsettled`.
    async fn process_until_quiet(
        &mut self,
        unsettled: &mut Vec<InHand>,
    ) -> Result<(), BrokerError> {
        while let Ok(Some(next)) = tokio::time::timeout(SHUTDOWN_LINGER, self.consumer.next()).await
        {
            let delivery = next?;
            let received = Instant::now();
            let (settles, _) = self.process(&delivery).await?;
            unsettled.extend(in_hand(vec![delivery], settles, received));
        }
        Ok(())
    }

    /// Strict (and pipelined) mode: decides one delivery inside its span (a
    /// panic becomes a requeue). Returns its broker action and whether
    /// parked messages may now be releasable.
    async fn process(&self, delivery: &Delivery) -> Result<(Vec<Settle>, bool), BrokerError> {
        let span = info_span!(
            "message",
            shard = self.worker.shard,
            message_id = field::Empty,
            entity_id = field::Empty,
            redelivered = delivery.redelivered,
        );
        let mut trace = self.start_apply_span(delivery);
        async {
            let decided = AssertUnwindSafe(self.decide(delivery, &mut trace))
                .catch_unwind()
                .await;
            let step = decided.unwrap_or_else(|panic| {
                Ok(steps::panicked(hooks::panic_message(panic.as_ref())))
            })?;
            traced::outcome(&mut trace, &step);
            self.conclude(std::slice::from_ref(delivery), vec![step])
                .await
        }
        .instrument(span)
        .await
    }
}

/// Pairs deliveries with their broker actions, to settle later.
fn in_hand(deliveries: Vec<Delivery>, settles: Vec<Settle>, received: Instant) -> Vec<InHand> {
    deliveries
        .into_iter()
        .zip(settles)
        .map(|(delivery, settle)| InHand {
            delivery,
            settle,
            received,
        })
        .collect()
}
