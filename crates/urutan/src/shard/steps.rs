//! The steps of handling a delivery: decide one (marker, decode, apply with
//! held retries), conclude any (dead-letter records, then each outcome
//! recorded, or a failing message requeued), release parked messages.

use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBuilder};
use lapin::message::Delivery;
use tracing::{debug, error, info, warn};

use super::decode::{self, Read};
use super::{Context, Observed, SHUTDOWN_GRACE, traced};
use crate::broker::{BrokerError, delivery};
use crate::dead_letter;
use crate::message::{self, Event, Rejection};
use crate::metrics::{self as m, RetryReason};
use crate::outcome::{Outcome, Settle};
use crate::reshard::handoff;
use crate::store::{self, Applied, NewDeadLetter, StoreError};
use crate::trace;

/// Entities released per release call (one transaction).
const RELEASE_BATCH: i32 = 200;

/// How many more times a message whose transaction lost to another one (a
/// serialization failure, a deadlock) is tried at once, each in a fresh
/// transaction, before it is set aside with a backoff.
pub(super) const CONTENDED_AGAIN: u32 = 3;

/// The longest pause before such a try (jittered from 1 ms), so that two
/// shards that deadlocked do not meet again in step.
const CONTENDED_JITTER_MS: u64 = 20;

/// How one delivery ends, in strict and batch mode alike.
pub(super) enum Step {
    /// Recorded and parked (its outcome comes at release), or an epoch
    /// marker passed: ack, and look for parked messages to release.
    Ack,
    /// Durable (or refused by contract): settle as the outcome says (with
    /// the last error, for a dead letter that has one).
    Done(Outcome, Option<String>),
    /// The handler failed on this message (`reason`: the retry label,
    /// `error`: what failed): reject with requeue (strict mode only).
    Requeue { reason: RetryReason, error: String },
}

/// Why a held database step stopped without a result.
pub(super) enum Held {
    /// The database, or the handler, refused this message.
    Refused(Refusal),
    /// The channel died, or shutdown's grace ran out: the message comes back.
    Abandon,
    /// The caller's `give_up` matched this transient error: the caller has
    /// a better answer than waiting (a smaller transaction, or setting the
    /// message aside).
    GaveUp(StoreError),
}

/// A held database step's answer: `Err` when the channel is lost (the
/// message comes back), else its result or the refusal of the message.
pub(super) type HeldResult<T> = Result<Result<T, Refusal>, BrokerError>;

/// Who refused a message, and what they said (for its dead-letter record).
pub(super) struct Refusal {
    /// `DatabaseRefused` (its data broke a rule of urutan's tables) or
    /// `HandlerRefused` (the team's handler raised an error that is not a
    /// request to retry).
    pub rejection: Rejection,
    pub error: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.error)
    }
}

/// The id of a delivery, as its producer set it.
pub(super) fn message_id(delivery: &Delivery) -> Option<&str> {
    let id = delivery.properties.message_id().as_ref();
    id.map(|id| id.as_str())
}

impl Context<'_> {
    /// Marker or message; decodes, then applies with held retries. `span`
    /// is the delivery's apply span: it gets the event, the apply's time
    /// and attempts, and what happened to it as events.
    pub(super) async fn decide(
        &self,
        delivery: &Delivery,
        span: &mut trace::Span,
    ) -> Result<Step, BrokerError> {
        let worker = self.worker;
        let mut event = match decode::read(
            delivery,
            &worker.queue,
            &worker.entity_header,
            worker.max_body_bytes,
        ) {
            Read::Event(event) => event,
            Read::Invalid(rejection) => {
                return Ok(Step::Done(Outcome::DeadLettered(rejection), None));
            }
            Read::Marker(epoch) => {
                span.event("marker");
                return self.pass_marker(epoch).await;
            }
        };
        traced::describe(span, &mut event);
        if let Err(error) = worker.hooks.run_before_apply(&event) {
            return Ok(panicked(error));
        }
        let (started, mut attempts) = (Instant::now(), 0);
        let applied = self
            .held_unless(StoreError::sets_aside, || {
                attempts += 1;
                self.again_if_contended(|| self.session.apply(&event))
            })
            .await;
        traced::applied_in(span, started.elapsed(), attempts);
        Ok(match applied {
            Ok(applied) => {
                if applied == Applied::Parked {
                    span.event("parked");
                }
                self.applied(Some(&event), applied, None)
            }
            Err(Held::Refused(refusal)) => {
                span.event("refused");
                self.refused(&event, refusal).await?
            }
            Err(Held::GaveUp(error)) => {
                span.event("set_aside");
                self.set_aside(&event, &error).await?
            }
            Err(Held::Abandon) => return Err(BrokerError::ChannelLost),
        })
    }

    /// A version the database or the handler refused. The handler's
    /// refusal is dead-lettered at once as `handler_refused` (its order
    /// held first, with ON_REFUSED=hold); a refusal of its data is
    /// requeued, so that the delivery limit dead-letters it if it keeps
    /// failing.
    pub(super) async fn refused(
        &self,
        event: &Event,
        refusal: Refusal,
    ) -> Result<Step, BrokerError> {
        if refusal.rejection != Rejection::HandlerRefused {
            return Ok(requeued(refusal));
        }
        self.hold_order(event, Some(&refusal.error)).await?;
        let outcome = Outcome::DeadLettered(Rejection::HandlerRefused);
        Ok(Step::Done(outcome, Some(refusal.error)))
    }

    /// With `ON_REFUSED=hold`, holds `event`'s order because that version is
    /// refused (before it is dead-lettered): its later versions are
    /// recorded and wait until it is replayed or `urutan hold release`.
    pub(super) async fn hold_order(
        &self,
        event: &Event,
        error: Option<&str>,
    ) -> Result<(), BrokerError> {
        if !self.worker.retry.hold_refused {
            return Ok(());
        }
        match self
            .held(|| self.session.hold_refused(event, error))
            .await?
        {
            Ok(true) => {
                metrics::counter!(m::HOLDS_TOTAL, "reason" => "refused").increment(1);
                warn!(
                    versi = event.versi,
                    "order held: its later versions wait until the refused one is replayed \
                     (`urutan dlq replay`) or the order released (`urutan hold release`)"
                );
            }
            Ok(false) => {}
            Err(e) => error!(error = %e, "cannot hold the order of a refused version"),
        }
        Ok(())
    }

    /// [`Self::hold_order`] for a delivery refused at the delivery limit
    /// (nothing for one that breaks the contract: it is no version).
    pub(super) async fn hold_delivery(
        &self,
        delivery: &Delivery,
        error: Option<&str>,
    ) -> Result<(), BrokerError> {
        let envelope = delivery::envelope(delivery, &self.worker.entity_header);
        match message::decode(&envelope, self.worker.max_body_bytes) {
            Ok(event) => self.hold_order(&event, error).await,
            Err(_) => Ok(()),
        }
    }

    /// A transient failure of this message's own transaction (`error`):
    /// the message is set aside in PostgreSQL with a due time and acked;
    /// the shard goes on, and its order's later versions wait behind it.
    pub(super) async fn set_aside(
        &self,
        event: &Event,
        error: &StoreError,
    ) -> Result<Step, BrokerError> {
        let reason = error.reason();
        self.retried(reason);
        warn!(reason = reason.label(), error = %error, "set aside for a later try; the shard goes on");
        let text = error.to_string();
        // A handler that said when to try again is taken at its word.
        let policy = &match error.retry_after() {
            Some(after) => store::hold::RetryPolicy {
                min: after,
                max: after,
                ..self.worker.retry
            },
            None => self.worker.retry,
        };
        Ok(
            match self
                .held(|| self.session.set_aside(event, &text, policy))
                .await?
            {
                Ok(Applied::Parked) => {
                    self.metrics.set_aside(reason);
                    Step::Ack
                }
                Ok(applied) => self.applied(Some(event), applied, None),
                Err(refusal) => requeued(refusal),
            },
        )
    }

    /// An epoch marker in strict mode: passes it, or dead-letters one for
    /// an epoch urutan never recorded.
    async fn pass_marker(&self, epoch: i64) -> Result<Step, BrokerError> {
        // A step on the pool itself: never wait for a second connection
        // while keeping one (with a pool smaller than the shard count,
        // workers would wait on each other).
        self.session.give_back();
        let (pool, shard) = (&self.worker.pool, self.worker.shard);
        let passed = self
            .held(|| async { Ok(handoff::pass_recorded_marker(pool, shard, epoch).await?) })
            .await?;
        Ok(match passed {
            Ok(true) => {
                debug!(epoch, "passed an epoch marker");
                Step::Ack
            }
            Ok(false) => {
                warn!(epoch, "a marker for an epoch urutan never recorded");
                Step::Done(Outcome::DeadLettered(Rejection::ReservedHeader), None)
            }
            Err(refusal) => requeued(refusal),
        })
    }

    /// What a committed apply means for its delivery (`event`: the
    /// delivery's, `None` for a marker; `error`: the database's, for a
    /// message it refused alone). Counts the publish-to-commit lag and
    /// parked messages.
    pub(super) fn applied(
        &self,
        event: Option<&Event>,
        applied: Applied,
        error: Option<String>,
    ) -> Step {
        match applied {
            Applied::Done(outcome) => {
                let published = event.and_then(|event| event.published_at);
                let lag =
                    published.and_then(|t| std::time::SystemTime::now().duration_since(t).ok());
                if let Some(lag) = lag {
                    self.metrics.lag.record(lag.as_secs_f64());
                }
                Step::Done(outcome, error)
            }
            Applied::Parked => {
                self.metrics.parked.increment(1);
                debug!("parked until older messages of this entity are done");
                Step::Ack
            }
        }
    }

    /// The end of every decided delivery: the dead-letter records of all of
    /// them are committed first (one write), then each outcome is recorded,
    /// or a failing message requeued. Returns each delivery's broker action,
    /// and whether parked messages may now be releasable.
    pub(super) async fn conclude(
        &self,
        deliveries: &[Delivery],
        steps: Vec<Step>,
    ) -> Result<(Vec<Settle>, bool), BrokerError> {
        let may_release = steps.iter().any(|step| matches!(step, Step::Ack));
        let shard = self.worker.shard;
        let rows = deliveries
            .iter()
            .zip(&steps)
            .filter_map(|(delivery, step)| {
                let Step::Done(Outcome::DeadLettered(rejection), error) = step else {
                    return None;
                };
                let error = error.as_deref();
                let header = &self.worker.entity_header;
                Some(dead_letter::rejected(
                    delivery, header, shard, *rejection, error,
                ))
            })
            .collect();
        self.record_dead_letters(rows).await?;
        let mut settles = Vec::with_capacity(deliveries.len());
        for (delivery, step) in deliveries.iter().zip(steps) {
            settles.push(match step {
                Step::Ack => Settle::Ack,
                Step::Done(outcome, _) => self.record(outcome, message_id(delivery)),
                Step::Requeue { reason, error } => self.requeue(delivery, reason, &error).await?,
            });
        }
        Ok((settles, may_release))
    }

    /// Runs a database step for the delivery in hand, holding it through
    /// transient failures (capped, jittered backoff) so nothing behind it
    /// overtakes it.
    pub(super) async fn held<T, F, Fut>(&self, step: F) -> HeldResult<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        match self.held_unless(|_| false, step).await {
            Ok(value) => Ok(Ok(value)),
            Err(Held::Refused(error)) => Ok(Err(error)),
            Err(Held::Abandon | Held::GaveUp(_)) => Err(BrokerError::ChannelLost),
        }
    }

    /// [`Self::held`], but a transient error that `give_up` matches ends it
    /// at once with [`Held::GaveUp`].
    pub(super) async fn held_unless<T, F, Fut>(
        &self,
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
                    return Err(Held::Refused(Refusal {
                        rejection: Rejection::DatabaseRefused,
                        error: e.to_string(),
                    }));
                }
                Err(StoreError::HandlerRefused(error)) => {
                    warn!(error = %error, "the handler refused this message");
                    return Err(Held::Refused(Refusal {
                        rejection: Rejection::HandlerRefused,
                        error,
                    }));
                }
                Err(e) if give_up(&e) => return Err(Held::GaveUp(e)),
                Err(e) => e,
            };
            self.retried(error.reason());
            self.worker.health.set_database(false);
            if !self.ch.status().connected() {
                return Err(Held::Abandon);
            }
            if self.shutdown.is_cancelled()
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

    /// Runs `step`, one message's transaction, and runs it again at once
    /// (after a pause of a few milliseconds) while it loses to another
    /// transaction (serialization failure, deadlock: [`StoreError::contended`]),
    /// at most [`CONTENDED_AGAIN`] more times. Each try is a transaction of
    /// its own, so nothing of a lost one remains. Its last answer is returned:
    /// still contended, the caller sets the message aside.
    pub(super) async fn again_if_contended<T, F, Fut>(&self, mut step: F) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        let mut again = 0;
        loop {
            match step().await {
                Err(e) if e.contended() && again < CONTENDED_AGAIN => {
                    again += 1;
                    self.session.lost_to_another();
                    self.retried(e.reason());
                    debug!(error = %e, again, "lost to another transaction; trying again at once");
                    let pause = rand::random_range(1..=CONTENDED_JITTER_MS);
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
                done => return done,
            }
        }
    }

    /// Counts one retry (`urutan_retries_total`), whatever its reason.
    pub(super) fn retried(&self, reason: RetryReason) {
        let shard = self.metrics.shard.clone();
        metrics::counter!(m::RETRIES_TOTAL, "shard" => shard, "reason" => reason.label())
            .increment(1);
    }

    /// The one place an outcome is counted, logged and reported; returns the
    /// broker action.
    pub(super) fn record(&self, outcome: Outcome, message_id: Option<&str>) -> Settle {
        if let Some(hook) = &self.worker.hooks.on_outcome {
            hook(&Observed {
                shard: self.worker.shard,
                outcome,
                message_id,
            });
        }
        self.metrics.outcome(outcome);
        match outcome {
            Outcome::DeadLettered(rejection) => {
                let detail = rejection.describe(&self.worker.entity_header);
                warn!(reason = rejection.reason(), %detail, "dead-lettering a message");
                let shard = self.metrics.shard.clone();
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
    async fn requeue(
        &self,
        delivery: &Delivery,
        reason: RetryReason,
        error: &str,
    ) -> Result<Settle, BrokerError> {
        self.retried(reason);
        let worker = self.worker;
        let returns = delivery::previous_deliveries(delivery) + 1;
        if returns > u64::from(worker.delivery_limit) {
            self.hold_delivery(delivery, Some(error)).await?;
            let rejection = Rejection::DeliveryLimit;
            let row = dead_letter::rejected(
                delivery,
                &worker.entity_header,
                worker.shard,
                rejection,
                Some(error),
            );
            self.record_dead_letters(vec![row]).await?;
            self.record(Outcome::DeadLettered(rejection), message_id(delivery));
        } else if let Ok(event) = message::decode(
            &delivery::envelope(delivery, &worker.entity_header),
            worker.max_body_bytes,
        ) {
            let recorded = self.held(|| self.session.record_returned(&event));
            // Cannot be refused (nothing in the row is the producer's to
            // refuse); if it were, the message is requeued unrecorded, as before.
            if let Err(e) = recorded.await? {
                error!(error = %e, "cannot record a returned message");
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
    async fn record_dead_letters(&self, rows: Vec<NewDeadLetter>) -> Result<(), BrokerError> {
        if rows.is_empty() {
            return Ok(());
        }
        let full = self.held(|| self.session.record_dead_letters(&rows));
        let Err(refused) = full.await? else {
            return Ok(());
        };
        warn!(error = %refused, "the database refused a dead-letter record; recording it without the message's content");
        let minimal: Vec<NewDeadLetter> = rows.iter().map(NewDeadLetter::minimal).collect();
        let bare = self.held(|| self.session.record_dead_letters(&minimal));
        if let Err(e) = bare.await? {
            error!(error = %e, "cannot record the dead letter; dead-lettering it without a record (`urutan dlq list` records it from the queue)");
        }
        Ok(())
    }

    /// Applies this shard's parked messages that may go now, and tries the
    /// set-aside ones that are due. Returns true while some remain parked
    /// (a held order's do not count). A database failure only delays it.
    pub(super) async fn release_parked(&self) -> bool {
        let (pool, shard) = (&self.worker.pool, self.worker.shard);
        // On the pool itself: see the marker step in `pass_marker`.
        self.session.give_back();
        let released = match self.release_in_transaction().await {
            Ok(released) => released,
            Err(e) => {
                warn!(shard, error = %e, "cannot release parked messages yet");
                return true;
            }
        };
        let handoffs = released
            .iter()
            .filter(|r| r.first_of_order && matches!(r.result.as_str(), "applied" | "stale"))
            .count();
        for r in &released {
            match r.result.as_str() {
                "retry" => {
                    let reason = r.reason.as_deref().unwrap_or_default();
                    let reason = RetryReason::ALL.into_iter().find(|x| x.label() == reason);
                    if matches!(
                        reason,
                        Some(RetryReason::Deadlock | RetryReason::Serialization)
                    ) {
                        self.session.lost_to_another();
                    }
                    self.retried(reason.unwrap_or(RetryReason::Database));
                    warn!(message_id = ?r.message_id, error = ?r.error, "set aside again after another transient failure");
                    continue;
                }
                "refused" => {
                    let rejection = refusal_named(r.reason.as_deref());
                    self.record(Outcome::DeadLettered(rejection), Some(&r.message_id));
                    continue;
                }
                _ => {}
            }
            // A parked message's id was claimed for its own order when it
            // parked, so a release is `applied` or `stale`; it was acked long
            // ago and there is nothing left to dead-letter.
            match store::parse_result(&r.result) {
                Applied::Done(Outcome::DeadLettered(rejection)) => error!(
                    message_id = ?r.message_id,
                    reason = rejection.reason(),
                    "a released message cannot be dead-lettered (it was acked when it parked)"
                ),
                Applied::Done(outcome) => {
                    self.record(outcome, Some(&r.message_id));
                }
                Applied::Parked => {}
            }
            metrics::histogram!(m::HANDOFF_DURATION_SECONDS).record(r.waited_s);
        }
        let released: Vec<_> = released
            .into_iter()
            .filter(|r| matches!(r.result.as_str(), "applied" | "stale"))
            .collect();
        if !released.is_empty() {
            metrics::counter!(m::HANDOFFS_TOTAL).increment(handoffs as u64);
            let messages = released.len();
            info!(
                shard,
                messages,
                entities = handoffs,
                "released parked messages (handoff complete)"
            );
        }
        let left = handoff::any_parked(pool, shard).await.unwrap_or(true);
        let gauge = metrics::gauge!(m::PARKED_MESSAGES, "shard" => self.metrics.shard.clone());
        if !left {
            gauge.set(0.0);
        } else if self.parked_count_due()
            && let Ok(count) = handoff::parked(pool, shard).await
        {
            gauge.set(count as f64);
        }
        left
    }

    /// Whether `urutan_parked_messages` is due to be counted again (see
    /// `parked_counted`); if so, it counts as counted now.
    fn parked_count_due(&self) -> bool {
        let now = tokio::time::Instant::now();
        let Ok(mut last) = self.parked_counted.lock() else {
            return true;
        };
        let due = last.is_none_or(|at| now.duration_since(at) >= handoff::PARKED_COUNT_EVERY);
        if due {
            *last = Some(now);
        }
        due
    }
}

impl Context<'_> {
    /// `GAP_POLICY=wait`: holds (reason `gap`) this shard's orders whose next
    /// version has been missing longer than `timeout`. A database failure
    /// only delays it.
    pub(super) async fn hold_gaps(&self, timeout: Duration) {
        self.session.give_back();
        let worker = self.worker;
        match store::hold::hold_gaps(&worker.pool, worker.shard, timeout).await {
            Ok(held) => {
                for hold in held {
                    metrics::counter!(m::HOLDS_TOTAL, "reason" => "gap").increment(1);
                    warn!(
                        order = %hold.order,
                        missing = hold.versi,
                        waiting = hold.waiting,
                        timeout = ?timeout,
                        "order held: a version never arrived within GAP_TIMEOUT; `urutan hold \
                         release` applies the versions that wait without it"
                    );
                }
            }
            Err(e) => warn!(error = %e, "cannot look for overdue gaps yet"),
        }
    }

    /// One release call in a transaction of its own: the versions refused
    /// in it (set aside, then refused or out of attempts; acked long ago)
    /// are published to the dead-letter exchange, confirmed, and recorded
    /// before it commits. A publish that is not confirmed rolls everything
    /// back: nothing is lost, the release is tried again.
    async fn release_in_transaction(&self) -> Result<Vec<handoff::Released>, String> {
        let worker = self.worker;
        let mut tx = worker.pool.begin().await.map_err(|e| e.to_string())?;
        if self.session.one_at_a_time() {
            store::take_one_at_a_time(&mut tx)
                .await
                .map_err(|e| e.to_string())?;
        }
        let handler = worker.handler.as_deref();
        let released =
            handoff::release_with(&mut tx, worker.shard, RELEASE_BATCH, &worker.retry, handler)
                .await
                .map_err(|e| e.to_string())?;
        for r in released.iter().filter(|r| r.result == "refused") {
            let event = r.event.as_ref().map(|e| &e.0);
            let event = event.ok_or("a refused version without its event")?;
            let rejection = refusal_named(r.reason.as_deref());
            let later = dead_letter::refused_later(
                event,
                &worker.entity_header,
                &worker.entry_exchange,
                worker.shard,
                rejection,
                r.error.as_deref(),
            );
            let publish = self.ch.basic_publish(
                worker.dead_letter_exchange.as_str().into(),
                "".into(),
                lapin::options::BasicPublishOptions::default(),
                &later.body,
                later.props.clone(),
            );
            let confirm = crate::broker::call("basic.publish", publish)
                .await
                .map_err(|e| e.to_string())?;
            let confirmed = crate::broker::call("publisher confirm", confirm)
                .await
                .map_err(|e| e.to_string())?;
            if !confirmed.is_ack() {
                // The DLQ refused it (full: `x-overflow = reject-publish`).
                // Only this order waits: everything else of this release
                // goes on in the next one (issue 43).
                tx.rollback().await.map_err(|e| e.to_string())?;
                let order = event
                    .get("id")
                    .and_then(|id| id.as_str())
                    .unwrap_or_default();
                return Err(self.postpone_refusal(&r.message_id, order).await);
            }
            store::insert_dead_letter(&mut *tx, &later.record)
                .await
                .map_err(|e| e.to_string())?;
            if worker.retry.hold_refused {
                metrics::counter!(m::HOLDS_TOTAL, "reason" => "refused").increment(1);
            }
            warn!(
                message_id = ?r.message_id,
                reason = rejection.reason(),
                error = ?r.error,
                "a set-aside version is refused: dead-lettered"
            );
        }
        tx.commit().await.map_err(|e| e.to_string())?;
        Ok(released)
    }
}

impl Context<'_> {
    /// A refused set-aside version whose dead letter the DLQ would not take
    /// (it is full): it stays set aside, due again in [`DLQ_FULL_RETRY`],
    /// with the reason as its last error (`urutan explain`, `status`'s
    /// retrying orders). Its order's later versions wait behind it as behind
    /// any set-aside version; every other order is released meanwhile. Once
    /// the DLQ has room the refusal is dead-lettered as usual. Returns what
    /// to log.
    async fn postpone_refusal(&self, message_id: &str, order: &str) -> String {
        let why = "the dead-letter queue is full: the refused version waits, set aside, until \
                   it has room (`urutan dlq list`, then replay or purge)";
        let postponed =
            store::hold::postpone(&self.worker.pool, message_id, order, DLQ_FULL_RETRY, why).await;
        metrics::counter!(m::DEAD_LETTERS_REFUSED_TOTAL, "shard" => self.metrics.shard.clone())
            .increment(1);
        match postponed {
            Ok(_) => {
                warn!(message_id, order, retry_in = ?DLQ_FULL_RETRY, "{why}");
                format!("the DLQ refused the dead letter of {message_id}; only its order waits")
            }
            Err(e) => format!(
                "the DLQ refused the dead letter of {message_id}, and it cannot be set aside again: {e}"
            ),
        }
    }
}

/// How long a refused version whose dead letter the full DLQ refused waits
/// before it is tried again.
pub(super) const DLQ_FULL_RETRY: Duration = Duration::from_secs(5);

/// The rejection a release reported (`urutan_lepas`'s `alasan`).
fn refusal_named(reason: Option<&str>) -> Rejection {
    let named = Rejection::ALL
        .into_iter()
        .find(|r| Some(r.reason()) == reason);
    named.unwrap_or(Rejection::DatabaseRefused)
}

/// The handler panicked on this message (`error`: the panic's text):
/// requeued (strict mode; a batch retries it in place).
pub(super) fn panicked(error: String) -> Step {
    error!("the handler panicked on this message; requeueing it");
    Step::Requeue {
        reason: RetryReason::Panic,
        error,
    }
}

/// A message refused where no hold applies: requeued (the delivery limit
/// dead-letters it if it keeps failing).
fn requeued(refusal: Refusal) -> Step {
    Step::Requeue {
        reason: RetryReason::Refused,
        error: refusal.error,
    }
}
