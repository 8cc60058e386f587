//! The first, pure phase of every delivery, in strict and batch mode alike:
//! an epoch marker, a valid event, or a contract violation.

use lapin::message::Delivery;

use crate::broker::delivery;
use crate::message::{self, Event, Rejection};

/// What a delivery is.
pub(super) enum Read {
    /// An epoch marker (see [`crate::reshard::handoff`]).
    Marker(i64),
    Event(Event),
    /// It breaks the message contract.
    Invalid(Rejection),
}

/// Reads one delivery from `queue`. The current span (a strict-mode
/// message span) gets the message id and, for a valid event, the entity id.
/// The marker header counts only on a marker urutan sent (see
/// [`delivery::marker`]); on anything else it is a contract violation.
pub(super) fn read(
    delivery: &Delivery,
    queue: &str,
    entity_header: &str,
    max_body_bytes: usize,
) -> Read {
    let marker = delivery::marker(delivery, queue);
    if let delivery::Marker::Epoch(epoch) = marker {
        return Read::Marker(epoch);
    }
    let envelope = delivery::envelope(delivery, entity_header);
    let span = tracing::Span::current();
    if let Some(id) = envelope.message_id {
        span.record("message_id", id);
    }
    if marker == delivery::Marker::Forged {
        return Read::Invalid(Rejection::ReservedHeader);
    }
    match message::decode(&envelope, max_body_bytes) {
        Ok(event) => {
            span.record("entity_id", event.entity_id.as_str());
            Read::Event(event)
        }
        Err(rejection) => Read::Invalid(rejection),
    }
}
