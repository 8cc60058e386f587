//! One worker per shard queue: deliveries in, outcomes out, and the one place
//! that acks or rejects.
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
//!   pushed to this worker while a standby takes over.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use backon::{BackoffBuilder, ExponentialBuilder};
use futures::{FutureExt, StreamExt};
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicQosOptions, BasicRejectOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, Connection};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, error, field, info_span, warn};

use crate::broker::{BrokerError, call, delivery};
use crate::health::Health;
use crate::message::{self, Event, Rejection};
use crate::metrics as m;
use crate::outcome::{Outcome, Settle};
use crate::store::{self, StoreError};

/// How long a held message may keep retrying after shutdown was requested.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);

/// A fault-injection callback, given each valid event before it is applied.
pub type EventHook = Arc<dyn Fn(&Event) + Send + Sync>;

/// What an observer learns about each finished delivery.
#[derive(Debug, Clone, Copy)]
pub struct Observed<'a> {
    pub shard: u16,
    pub outcome: Outcome,
    pub message_id: Option<&'a str>,
}

/// An observer of outcomes (the demo's live counters and latency report).
pub type OutcomeHook = Arc<dyn Fn(&Observed<'_>) + Send + Sync>;

/// Fault-injection and observation points for tests, drills and the demo;
/// empty in production.
#[derive(Clone, Default)]
pub struct Hooks {
    /// Called with each valid event just before it is applied (may panic or sleep).
    pub before_apply: Option<EventHook>,
    /// Called once per outcome, after it is durable and before the ack.
    pub on_outcome: Option<OutcomeHook>,
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks")
            .field("before_apply", &self.before_apply.is_some())
            .field("on_outcome", &self.on_outcome.is_some())
            .finish()
    }
}

/// Everything one shard worker needs.
#[derive(Clone)]
pub struct ShardWorker {
    pub shard: u16,
    pub queue: String,
    pub prefetch: u16,
    pub delivery_limit: u32,
    pub max_body_bytes: usize,
    pub pool: PgPool,
    pub health: Arc<Health>,
    pub hooks: Hooks,
}

/// What handling one delivery decided.
enum Decision {
    /// Durable (or refused by contract): settle as the outcome says.
    Done(Outcome),
    /// The handler failed on this message: reject with requeue.
    Requeue(&'static str),
    /// The channel died while the message was held: say nothing, it comes back.
    Abandon,
}

impl ShardWorker {
    /// Consumes the shard on `conn` until `shutdown`, or until the connection
    /// is lost (the supervisor then reconnects and starts a new worker). A
    /// channel-level failure on a live connection reopens the channel.
    pub async fn run(self, conn: Arc<Connection>, shutdown: CancellationToken) {
        loop {
            let result = self.consume(&conn, &shutdown).await;
            self.health.set_consumer(self.shard, false);
            let Err(e) = result else { return };
            if !conn.status().connected() {
                debug!(shard = self.shard, error = %e, "connection lost");
                return;
            }
            warn!(shard = self.shard, error = %e, "shard channel failed; reopening it");
            tokio::select! {
                () = shutdown.cancelled() => return,
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
        loop {
            let next = tokio::select! {
                biased;
                () = shutdown.cancelled() => None,
                next = consumer.next() => Some(next),
            };
            let delivery = match next {
                // Idle at shutdown: closing the channel returns anything pushed
                // meanwhile to the front of the queue before a standby starts.
                None => break,
                Some(Some(Ok(delivery))) => delivery,
                Some(Some(Err(e))) => return Err(e.into()),
                Some(None) => return Err(BrokerError::ConsumerCancelled),
            };
            self.handle(&ch, &tag, delivery, shutdown).await?;
            if shutdown.is_cancelled() {
                break;
            }
        }
        let _ = call("channel.close", ch.close(200, "shutting down".into())).await;
        Ok(())
    }

    /// Handles one delivery from receipt to ack/reject, inside its span.
    async fn handle(
        &self,
        ch: &Channel,
        tag: &str,
        delivery: Delivery,
        shutdown: &CancellationToken,
    ) -> Result<(), BrokerError> {
        let received = Instant::now();
        let span = info_span!(
            "message",
            shard = self.shard,
            message_id = field::Empty,
            entity_id = field::Empty,
            redelivered = delivery.redelivered,
        );
        async {
            let decided = AssertUnwindSafe(self.decide(ch, &delivery, shutdown))
                .catch_unwind()
                .await;
            let decision = decided.unwrap_or_else(|_| {
                error!("the handler panicked on this message; requeueing it");
                Decision::Requeue("panic")
            });
            let settle = match decision {
                Decision::Abandon => return Err(BrokerError::ChannelLost),
                Decision::Done(outcome) => self.record(outcome, &delivery),
                Decision::Requeue(reason) => self.requeue(&delivery, reason),
            };
            if shutdown.is_cancelled() {
                // Stop deliveries before this ack frees the prefetch slot.
                let cancel = ch.basic_cancel(tag.into(), BasicCancelOptions::default());
                call("basic.cancel", cancel).await?;
            }
            settle_delivery(&delivery, settle).await?;
            let shard = self.shard.to_string();
            metrics::histogram!(m::HANDLE_DURATION_SECONDS, "shard" => shard)
                .record(received.elapsed().as_secs_f64());
            Ok(())
        }
        .instrument(span)
        .await
    }

    /// Decodes, then applies with held retries. Pure decisions, effects only in `store`.
    async fn decide(
        &self,
        ch: &Channel,
        delivery: &Delivery,
        shutdown: &CancellationToken,
    ) -> Decision {
        let envelope = delivery::envelope(delivery);
        let span = tracing::Span::current();
        if let Some(id) = envelope.message_id {
            span.record("message_id", id);
        }
        let event = match message::decode(&envelope, self.max_body_bytes) {
            Ok(event) => event,
            Err(rejection) => return Decision::Done(Outcome::DeadLettered(rejection)),
        };
        span.record("entity_id", event.entity_id.as_str());
        if let Some(hook) = &self.hooks.before_apply {
            hook(&event);
        }
        let mut backoff = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(50))
            .with_max_delay(Duration::from_secs(5))
            .with_jitter()
            .without_max_times()
            .build();
        let mut shutdown_at: Option<Instant> = None;
        loop {
            let error = match store::apply(&self.pool, &event, self.shard).await {
                Ok(outcome) => {
                    self.record_lag(&event);
                    return Decision::Done(outcome);
                }
                Err(StoreError::Refused(e)) => {
                    warn!(error = %e, "the database refused this message");
                    return Decision::Requeue("refused");
                }
                Err(e) => e,
            };
            metrics::counter!(m::RETRIES_TOTAL, "shard" => self.shard.to_string(), "reason" => error.reason())
                .increment(1);
            self.health.set_database(false);
            if !ch.status().connected() {
                return Decision::Abandon;
            }
            if shutdown.is_cancelled()
                && shutdown_at.get_or_insert_with(Instant::now).elapsed() > SHUTDOWN_GRACE
            {
                warn!("giving up a held message at shutdown; it will be redelivered");
                return Decision::Abandon;
            }
            let delay = backoff.next().unwrap_or(Duration::from_secs(5));
            warn!(error = %error, retry_in = ?delay, "database unavailable; holding the message");
            tokio::time::sleep(delay).await;
        }
    }

    /// Counts, logs and reports an outcome; returns the broker action.
    fn record(&self, outcome: Outcome, delivery: &Delivery) -> Settle {
        if let Some(hook) = &self.hooks.on_outcome {
            let message_id = delivery.properties.message_id().as_ref();
            hook(&Observed {
                shard: self.shard,
                outcome,
                message_id: message_id.map(|id| id.as_str()),
            });
        }
        let shard = self.shard.to_string();
        metrics::counter!(m::MESSAGES_TOTAL, "shard" => shard.clone(), "outcome" => outcome.label())
            .increment(1);
        match outcome {
            Outcome::DeadLettered(rejection) => {
                warn!(reason = rejection.reason(), detail = %rejection, "dead-lettering a message");
                metrics::counter!(m::DEAD_LETTERS_TOTAL, "shard" => shard, "reason" => rejection.reason())
                    .increment(1);
            }
            other => debug!(outcome = other.label(), "handled"),
        }
        outcome.settle()
    }

    /// A handler failure: requeue it, and if that return exhausts the queue's
    /// delivery limit (the queue then dead-letters it), count it as such.
    fn requeue(&self, delivery: &Delivery, reason: &'static str) -> Settle {
        metrics::counter!(m::RETRIES_TOTAL, "shard" => self.shard.to_string(), "reason" => reason)
            .increment(1);
        let returns = delivery::previous_deliveries(delivery) + 1;
        if returns > u64::from(self.delivery_limit) {
            self.record(Outcome::DeadLettered(Rejection::DeliveryLimit), delivery);
        }
        Settle::Requeue
    }

    fn record_lag(&self, event: &Event) {
        let lag = event
            .published_at
            .and_then(|t| SystemTime::now().duration_since(t).ok());
        if let Some(lag) = lag {
            metrics::histogram!(m::END_TO_END_LAG_SECONDS, "shard" => self.shard.to_string())
                .record(lag.as_secs_f64());
        }
    }
}

/// The one function that turns a [`Settle`] into a broker call.
async fn settle_delivery(delivery: &Delivery, settle: Settle) -> Result<(), BrokerError> {
    let acker = &delivery.acker;
    let done = match settle {
        Settle::Ack => call("basic.ack", acker.ack(BasicAckOptions::default())).await?,
        Settle::DeadLetter => {
            let reject = acker.reject(BasicRejectOptions { requeue: false });
            call("basic.reject", reject).await?
        }
        Settle::Requeue => {
            let reject = acker.reject(BasicRejectOptions { requeue: true });
            call("basic.reject", reject).await?
        }
    };
    // `false`: the acker belongs to a dead channel; the message will be redelivered.
    if done {
        Ok(())
    } else {
        Err(BrokerError::ChannelLost)
    }
}
