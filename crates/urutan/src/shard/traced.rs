//! The apply span of each delivery ([`crate::trace`]): a child of the
//! message's `traceparent` header (the relay's publish span, or a direct
//! producer's context; a new trace without a valid one), with the order,
//! version, shard and outcome, the apply's duration, and its parking,
//! setting aside and retries as events. A redelivery carries the same
//! header, so it continues the same trace under the same publish span.

use std::time::Duration;

use lapin::message::Delivery;
use opentelemetry::trace::SpanKind;

use super::Context;
use super::steps::{Step, message_id};
use crate::message::Event;
use crate::outcome::Outcome;
use crate::trace::{Span, TraceParent};

impl Context<'_> {
    /// Starts the apply span of `delivery`.
    pub(super) fn start_apply_span(&self, delivery: &Delivery) -> Span {
        let parent = TraceParent::from_headers(delivery.properties.headers().as_ref());
        let mut span = self
            .worker
            .traces
            .start("apply", SpanKind::Consumer, parent);
        if span.is_recording() {
            span.set("messaging.system", "rabbitmq");
            span.set("messaging.destination.name", self.worker.queue.clone());
            span.set("urutan.shard", i64::from(self.worker.shard));
            span.set("urutan.redelivered", delivery.redelivered);
            if let Some(id) = message_id(delivery) {
                span.set("messaging.message.id", id.to_owned());
            }
        }
        span
    }
}

/// Names `event` on its span, and gives the event the span's context (its
/// effects are recorded with it).
pub(super) fn describe(span: &mut Span, event: &mut Event) {
    event.traceparent = Some(span.traceparent());
    if span.is_recording() {
        span.set("urutan.order_id", event.entity_id.clone());
        span.set("urutan.versi", event.versi);
    }
}

/// Records how long the apply (the handler inside it) took, and how many
/// attempts it needed; each retry is an event.
pub(super) fn applied_in(span: &mut Span, took: Duration, attempts: u32) {
    if !span.is_recording() {
        return;
    }
    span.set("urutan.handler.duration_ms", took.as_secs_f64() * 1000.0);
    span.set("urutan.apply.attempts", i64::from(attempts));
    for _ in 1..attempts {
        span.event("retry");
    }
}

/// Records the outcome `step` says.
pub(super) fn outcome(span: &mut Span, step: &Step) {
    match step {
        Step::Done(outcome, _) => {
            span.set("urutan.outcome", outcome.label());
            if let Outcome::DeadLettered(rejection) = outcome {
                span.set("urutan.dead_letter.reason", rejection.reason());
                span.fail(rejection.reason());
            }
        }
        // Parked, set aside or a marker passed: its event says which.
        Step::Ack => span.set("urutan.outcome", "acked"),
        Step::Requeue { reason, .. } => {
            span.set("urutan.outcome", "requeued");
            span.set("urutan.retry.reason", reason.label());
            span.event("requeued");
        }
    }
}
