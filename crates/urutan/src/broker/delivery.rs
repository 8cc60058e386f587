//! Lifting a lapin delivery into the contract's envelope (no copies).

use lapin::message::Delivery;
use lapin::types::{AMQPType, AMQPValue, FieldTable};

use crate::message::{EntityHeader, Envelope};

/// Header carrying the entity id (and the hash key) of the default entity;
/// a pipeline's own is [`crate::broker::Names::entity_header`].
pub const ENTITY_HEADER: &str = "x-pesanan-id";

/// The contract's view of `delivery`, whose entity id is in header
/// `entity_header` (`x-<ENTITY>-id`).
pub fn envelope<'a>(delivery: &'a Delivery, entity_header: &str) -> Envelope<'a> {
    let props = &delivery.properties;
    let header = props
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get(entity_header));
    let entity_header = match header {
        None => EntityHeader::Missing,
        Some(AMQPValue::LongString(s)) => EntityHeader::Text(s.as_bytes()),
        Some(AMQPValue::ShortString(s)) => EntityHeader::Text(s.as_str().as_bytes()),
        Some(other) => EntityHeader::OtherType(type_name(other.get_type())),
    };
    let (headers_bytes, headers_depth) = props.headers().as_ref().map_or((0, 0), table_shape);
    Envelope {
        message_id: props.message_id().as_ref().map(|s| s.as_str()),
        entity_header,
        delivery_mode: *props.delivery_mode(),
        timestamp: *props.timestamp(),
        body: &delivery.data,
        headers_bytes,
        headers_depth,
    }
}

/// Encoded size (AMQP 0-9-1: key as short string, type octet, value) and
/// nesting depth of a header table, see [`Envelope::headers_bytes`] and
/// [`Envelope::headers_depth`]. Iterative, with a stack of the tables and
/// arrays still to visit: no recursion, whatever the producer nested.
fn table_shape(table: &FieldTable) -> (usize, usize) {
    let (mut bytes, mut depth) = (4, 0);
    let mut todo: Vec<(&AMQPValue, usize)> = Vec::new();
    for (key, value) in table.inner() {
        bytes += 1 + key.as_str().len();
        todo.push((value, 1));
    }
    while let Some((value, level)) = todo.pop() {
        bytes += 1 + match value {
            AMQPValue::ShortString(s) => 1 + s.as_str().len(),
            AMQPValue::LongString(s) => 4 + s.as_bytes().len(),
            AMQPValue::ByteArray(b) => 4 + b.as_slice().len(),
            AMQPValue::FieldTable(t) => {
                depth = depth.max(level);
                for (key, value) in t.inner() {
                    bytes += 1 + key.as_str().len();
                    todo.push((value, level + 1));
                }
                4
            }
            AMQPValue::FieldArray(a) => {
                depth = depth.max(level);
                todo.extend(a.as_slice().iter().map(|v| (v, level + 1)));
                4
            }
            _ => 8, // numbers, booleans, timestamps, decimals, void: at most 8
        };
    }
    (bytes, depth)
}

/// How many times the queue has handed this message out before (quorum
/// queues set `x-delivery-count` on redeliveries).
pub fn previous_deliveries(delivery: &Delivery) -> u64 {
    let value = delivery
        .properties
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get("x-delivery-count"));
    match value {
        Some(AMQPValue::LongLongInt(n)) => u64::try_from(*n).unwrap_or(0),
        Some(AMQPValue::LongInt(n)) => u64::try_from(*n).unwrap_or(0),
        Some(AMQPValue::LongUInt(n)) => u64::from(*n),
        Some(AMQPValue::ShortInt(n)) => u64::try_from(*n).unwrap_or(0),
        _ => 0,
    }
}

fn type_name(t: AMQPType) -> &'static str {
    match t {
        AMQPType::Boolean => "boolean",
        AMQPType::ShortShortInt
        | AMQPType::ShortShortUInt
        | AMQPType::ShortInt
        | AMQPType::ShortUInt
        | AMQPType::LongInt
        | AMQPType::LongUInt
        | AMQPType::LongLongInt
        | AMQPType::LongLongUInt => "integer",
        AMQPType::Float | AMQPType::Double | AMQPType::DecimalValue => "number",
        AMQPType::ShortString | AMQPType::LongString => "string",
        AMQPType::FieldArray => "array",
        AMQPType::Timestamp => "timestamp",
        AMQPType::FieldTable => "table",
        AMQPType::ByteArray => "bytes",
        AMQPType::Void => "void",
    }
}

/// Header of an epoch marker; its value is the epoch number (markers are
/// put into every shard queue by [`crate::reshard::handoff`]).
pub const MARKER_HEADER: &str = "x-urutan-epoch";

/// What the reserved marker header says about a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marker {
    /// No `x-urutan-epoch` header: a message like any other.
    None,
    /// It arrived the way urutan sends markers (the default exchange, this
    /// queue's name as routing key, an integer epoch). Whether that epoch
    /// was recorded is the database's to check (`urutan_lewati_penanda`).
    Epoch(i64),
    /// It carries the reserved header but did not come the way urutan
    /// sends markers (through an exchange, to another routing key, or a
    /// value of another type): a contract violation, never a position.
    Forged,
}

/// Reads the reserved header of a delivery from `queue`. Only urutan
/// publishes to the default exchange (a producer with write on the entry
/// exchange alone cannot: it needs write on `amq.default`), so a header that
/// came through any other exchange is someone else's.
pub fn marker(delivery: &Delivery, queue: &str) -> Marker {
    let carries = delivery
        .properties
        .headers()
        .as_ref()
        .is_some_and(|h| h.inner().contains_key(MARKER_HEADER));
    if !carries {
        return Marker::None;
    }
    let authentic = delivery.exchange.as_str().is_empty() && delivery.routing_key.as_str() == queue;
    match epoch_marker(delivery) {
        Some(epoch) if authentic => Marker::Epoch(epoch),
        _ => Marker::Forged,
    }
}

/// The value of the marker header when it is an integer (see [`marker`]
/// for whether it counts), or `None`.
pub fn epoch_marker(delivery: &Delivery) -> Option<i64> {
    let value = delivery
        .properties
        .headers()
        .as_ref()?
        .inner()
        .get(MARKER_HEADER)?;
    match value {
        AMQPValue::LongLongInt(n) => Some(*n),
        AMQPValue::LongInt(n) => Some(i64::from(*n)),
        AMQPValue::LongUInt(n) => Some(i64::from(*n)),
        _ => None,
    }
}
