//! Fault-injection and observation points of a shard worker.

use std::sync::Arc;

use crate::message::Event;
use crate::outcome::Outcome;

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
    /// Called once per outcome, after it is durable and before the ack (for
    /// a parked message: when it is released).
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
