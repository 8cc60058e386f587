//! The dead-letter record of one message: a delivery in, a row out (pure
//! code, shared by the shard workers, which record before they reject, and
//! by `urutan dlq`, which records what it finds in the DLQ without a row;
//! [`crate::store`] writes the row).
//!
//! Everything taken from the message is made storable: PostgreSQL's `text`
//! and `jsonb` cannot hold NUL characters or invalid UTF-8, and an index
//! entry cannot be huge, so strings are converted lossily, NULs replaced,
//! and sizes capped. A message is never refused its row for its content.

use lapin::BasicProperties;
use lapin::message::Delivery;
use lapin::types::AMQPValue;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

mod amqp;

use crate::broker::delivery;
use crate::message::{self, Rejection};
use crate::store::NewDeadLetter;
pub use crate::store::dead_letter::Death;
use crate::store::dead_letter::Subject;
pub use amqp::{TOO_DEEP, clean, deaths, headers_json, properties_json};

/// Body bytes kept in the record (`dlq show` shows a capped view of it).
pub const BODY_KEPT: usize = 64 * 1024;
/// Longest detail or error text kept.
const TEXT_KEPT: usize = 4 * 1024;
/// Longest order id kept (the contract allows 128 bytes).
const ORDER_ID_KEPT: usize = 128;
/// Bodies parsed for the order id and versi: larger ones are not looked into.
const BODY_PARSED: usize = 1024 * 1024;

/// Headers the broker adds on the way (dead-lettering, redelivery): not
/// part of a message's identity, and not sent again when it is replayed.
pub fn is_added_header(name: &str) -> bool {
    name == "x-death"
        || name == "x-delivery-count"
        || name.starts_with("x-first-death-")
        || name.starts_with("x-last-death-")
}

/// The contract's message id (1-255 bytes, no NUL, plain text: see
/// [`message::is_plain_id`]), if the message has one. An id the codec
/// decoded lossily is not one: two different ids may read the same.
pub fn valid_message_id(props: &BasicProperties) -> Option<&str> {
    let id = props.message_id().as_ref()?.as_str();
    let valid = !id.is_empty() && id.len() <= 255 && !id.contains('\0');
    (valid && message::is_plain_id(id)).then_some(id)
}

/// The key that identifies a dead-lettered delivery across redeliveries,
/// the DLQ and replays: its message id, or `sha256:<hex>` of its message id
/// property, producer headers and body when the id is missing or invalid.
pub fn delivery_key(props: &BasicProperties, body: &[u8]) -> String {
    match valid_message_id(props) {
        Some(id) => id.to_owned(),
        None => content_digest(props, body),
    }
}

/// `sha256:<hex>` of what the producer sent: the message id property, the
/// headers the broker did not add, the body. Equal for the copies that
/// at-least-once dead-lettering may make of one message.
pub fn content_digest(props: &BasicProperties, body: &[u8]) -> String {
    let mut hash = Sha256::new();
    match props.message_id() {
        Some(id) => feed(&mut hash, b'i', id.as_str().as_bytes()),
        None => hash.update([b'-']),
    }
    if let Some(headers) = props.headers() {
        for (name, value) in headers.inner() {
            if !is_added_header(name.as_str()) {
                feed(&mut hash, b'k', name.as_str().as_bytes());
                feed_value(&mut hash, value);
            }
        }
    }
    feed(&mut hash, b'b', body);
    let digest = hash.finalize();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// Length-prefixed, tagged: distinct inputs never feed the same bytes.
fn feed(hash: &mut Sha256, tag: u8, bytes: &[u8]) {
    hash.update([tag]);
    hash.update((bytes.len() as u64).to_be_bytes());
    hash.update(bytes);
}

fn feed_value(hash: &mut Sha256, value: &AMQPValue) {
    match value {
        AMQPValue::ShortString(s) => feed(hash, b's', s.as_str().as_bytes()),
        AMQPValue::LongString(s) => feed(hash, b'S', s.as_bytes()),
        AMQPValue::ByteArray(b) => feed(hash, b'x', b.as_slice()),
        AMQPValue::FieldArray(a) => {
            feed(hash, b'A', &(a.as_slice().len() as u64).to_be_bytes());
            a.as_slice().iter().for_each(|v| feed_value(hash, v));
        }
        AMQPValue::FieldTable(t) => {
            feed(hash, b'F', &(t.inner().len() as u64).to_be_bytes());
            for (k, v) in t.inner() {
                feed(hash, b'k', k.as_str().as_bytes());
                feed_value(hash, v);
            }
        }
        other => feed(hash, b'v', format!("{other:?}").as_bytes()),
    }
}

/// A worker's record of a delivery it is about to dead-letter.
pub fn rejected(
    delivery: &Delivery,
    entity_header: &str,
    shard: u16,
    rejection: Rejection,
    last_error: Option<&str>,
) -> NewDeadLetter {
    let mut row = from_delivery(
        delivery,
        entity_header,
        rejection.reason(),
        &rejection.describe(entity_header),
    );
    row.subject.shard = i32::from(shard);
    row.subject.last_error = last_error.map(capped_text);
    row
}

/// The record of a message found in the DLQ without one (dead-lettered by
/// the broker itself, or by a version of urutan before these records). Its
/// reason: the contract rule it breaks if it breaks one, else the broker's
/// own (`x-death`: `delivery_limit` when the worker kept failing without
/// rejecting, e.g. it crashed on each delivery).
pub fn found_in_queue(
    delivery: &Delivery,
    entity_header: &str,
    max_body_bytes: usize,
) -> NewDeadLetter {
    let deaths = deaths(&delivery.properties);
    let first = deaths.first();
    let broker_said = first.map_or_else(
        || "no x-death header".to_owned(),
        |d| format!("x-death: {} from {}", d.reason, d.queue),
    );
    let (reason, detail) =
        match message::decode(&delivery::envelope(delivery, entity_header), max_body_bytes) {
            Err(rejection) => (
                rejection.reason().to_owned(),
                rejection.describe(entity_header),
            ),
            Ok(_) => match first.map(|d| d.reason.as_str()) {
                Some("delivery_limit") => (
                    "delivery_limit".to_owned(),
                    Rejection::DeliveryLimit.describe(entity_header),
                ),
                Some(other) => (other.to_owned(), "the message itself is valid".to_owned()),
                None => (
                    "unknown".to_owned(),
                    "the message itself is valid".to_owned(),
                ),
            },
        };
    let detail = format!("{detail} (found in the DLQ without a record; {broker_said})");
    let mut row = from_delivery(delivery, entity_header, &reason, &detail);
    let (exchange, routing_key) = original_route(delivery);
    row.exchange = Some(exchange);
    row.routing_key = Some(routing_key);
    row.recorded_by = "queue";
    row.subject.shard = first.and_then(|d| shard_of(&d.queue)).unwrap_or(-1);
    row.dead_lettered_at = first
        .and_then(|d| d.time)
        .and_then(|secs| chrono::DateTime::from_timestamp(i64::try_from(secs).ok()?, 0));
    row.x_death = Some(json!(deaths));
    row
}

/// Where a message in the DLQ was first published: the exchange and first
/// routing key of its most recent `x-death` entry, else its delivery's
/// (a message put into the DLQ some other way).
pub fn original_route(delivery: &Delivery) -> (String, String) {
    let death = deaths(&delivery.properties).into_iter().next();
    match death {
        Some(mut d) if !d.routing_keys.is_empty() => (d.exchange, d.routing_keys.swap_remove(0)),
        _ => (
            clean(delivery.exchange.as_str()),
            clean(delivery.routing_key.as_str()),
        ),
    }
}

/// The shard index of a shard queue name (`<prefix>.shard-NNN`).
fn shard_of(queue: &str) -> Option<i32> {
    let (_, index) = queue.rsplit_once(".shard-")?;
    index
        .bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| index.parse().ok())?
}

/// A version refused after its delivery was acked (set aside, then refused
/// by its handler or out of attempts): urutan publishes this message to the
/// dead-letter exchange in its stead, as its producer sent it (message id,
/// entity header, body), with its record.
pub struct RefusedLater {
    pub props: BasicProperties,
    pub body: Vec<u8>,
    pub record: NewDeadLetter,
}

/// The message and record of `event` (the event urutan kept: `message_id`,
/// `id`, `status`, `versi`, `data`), refused on `shard` for `rejection`.
/// `entry`: the entry exchange, where a replay goes.
pub fn refused_later(
    event: &Value,
    entity_header: &str,
    entry: &str,
    shard: u16,
    rejection: Rejection,
    last_error: Option<&str>,
) -> RefusedLater {
    let text = |k: &str| event.get(k).and_then(Value::as_str).unwrap_or_default();
    let mut body = serde_json::Map::new();
    for key in ["id", "status", "versi", "data"] {
        if let Some(value) = event.get(key).filter(|v| !v.is_null()) {
            body.insert(key.to_owned(), value.clone());
        }
    }
    let body = Value::Object(body).to_string().into_bytes();
    let mut headers = lapin::types::FieldTable::default();
    headers.insert(
        entity_header.into(),
        AMQPValue::LongString(text("id").as_bytes().into()),
    );
    let props = BasicProperties::default()
        .with_message_id(text("message_id").into())
        .with_delivery_mode(2)
        .with_content_type("application/json".into())
        .with_headers(headers);
    let mut record = from_parts(
        (&props, &body),
        (entry, ""),
        entity_header,
        rejection.reason(),
        &rejection.describe(entity_header),
    );
    record.routing_key = None;
    record.subject.shard = i32::from(shard);
    record.subject.last_error = last_error.map(capped_text);
    RefusedLater {
        props,
        body,
        record,
    }
}

fn from_delivery(
    delivery: &Delivery,
    entity_header: &str,
    reason: &str,
    detail: &str,
) -> NewDeadLetter {
    let route = (delivery.exchange.as_str(), delivery.routing_key.as_str());
    let message = (&delivery.properties, delivery.data.as_slice());
    from_parts(message, route, entity_header, reason, detail)
}

/// The record of a message (`props`, `body`) seen on `route` (exchange,
/// routing key).
fn from_parts(
    (props, body): (&BasicProperties, &[u8]),
    (exchange, routing_key): (&str, &str),
    entity_header: &str,
    reason: &str,
    detail: &str,
) -> NewDeadLetter {
    let (_, versi) = body_fields(body);
    NewDeadLetter {
        subject: Subject {
            delivery_key: delivery_key(props, body),
            message_id: valid_message_id(props).map(str::to_owned),
            pesanan_id: order_id(props, body, entity_header),
            versi,
            shard: -1,
            reason: clean(reason),
            detail: capped_text(detail),
            last_error: None,
        },
        recorded_by: "worker",
        exchange: Some(clean(exchange)),
        routing_key: Some(clean(routing_key)),
        properties: properties_json(props),
        headers: props
            .headers()
            .as_ref()
            .map_or_else(|| json!({}), headers_json),
        body: body[..body.len().min(BODY_KEPT)].to_vec(),
        body_bytes: i32::try_from(body.len()).unwrap_or(i32::MAX),
        x_death: None,
        dead_lettered_at: None,
    }
}

/// The order id a message's record keeps, and with its delivery key the
/// record's key (one record per (key, order): dedup is per (order, message
/// id)): the entity header's if it is a storable string, else the body's
/// `id`; `None` if neither is. The same for every copy of a message, so
/// `urutan dlq` finds a message's record from the message alone.
pub fn order_id(props: &BasicProperties, body: &[u8], entity_header: &str) -> Option<String> {
    let header_id = match props
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get(entity_header))
    {
        Some(AMQPValue::LongString(s)) => std::str::from_utf8(s.as_bytes()).ok().map(str::to_owned),
        Some(AMQPValue::ShortString(s)) => Some(s.as_str().to_owned()),
        _ => None,
    };
    let order_ok = |id: &String| !id.is_empty() && id.len() <= ORDER_ID_KEPT && !id.contains('\0');
    header_id
        .filter(order_ok)
        .or_else(|| body_fields(body).0.filter(order_ok))
}

/// The body's `id` (a string) and `versi` (an integer), if it is a JSON
/// object small enough to look into.
fn body_fields(body: &[u8]) -> (Option<String>, Option<i64>) {
    if body.len() > BODY_PARSED {
        return (None, None);
    }
    let Ok(Value::Object(map)) = serde_json::from_slice::<Value>(body) else {
        return (None, None);
    };
    let id = map.get("id").and_then(Value::as_str).map(str::to_owned);
    (id, map.get("versi").and_then(Value::as_i64))
}

fn capped_text(s: &str) -> String {
    let mut s = clean(s);
    if s.len() > TEXT_KEPT {
        let mut end = TEXT_KEPT;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::{FieldArray, FieldTable, LongString, ShortString};

    fn props(id: Option<&str>, headers: &[(&str, AMQPValue)]) -> BasicProperties {
        let mut table = FieldTable::default();
        for (k, v) in headers {
            table.insert(ShortString::from(*k), v.clone());
        }
        let p = BasicProperties::default().with_headers(table);
        match id {
            Some(id) => p.with_message_id(id.into()),
            None => p,
        }
    }

    fn text(s: &str) -> AMQPValue {
        AMQPValue::LongString(LongString::from(s.as_bytes()))
    }

    #[test]
    fn the_key_is_the_message_id_when_it_is_valid() {
        assert_eq!(delivery_key(&props(Some("m-1"), &[]), b"{}"), "m-1");
        assert!(delivery_key(&props(Some(""), &[]), b"{}").starts_with("sha256:"));
        assert!(delivery_key(&props(Some("a\0b"), &[]), b"{}").starts_with("sha256:"));
        assert!(delivery_key(&props(Some("id-\u{fffd}"), &[]), b"{}").starts_with("sha256:"));
    }

    #[test]
    fn the_hashed_key_ignores_what_the_broker_adds_and_sees_the_rest() {
        let plain = props(None, &[("x-pesanan-id", text("A"))]);
        let dead = props(
            None,
            &[
                ("x-pesanan-id", text("A")),
                ("x-delivery-count", AMQPValue::LongLongInt(3)),
                ("x-death", AMQPValue::FieldArray(FieldArray::default())),
                ("x-first-death-queue", text("pesanan.shard-000")),
            ],
        );
        let key = delivery_key(&plain, b"body");
        assert_eq!(key.len(), "sha256:".len() + 64);
        assert_eq!(key, delivery_key(&dead, b"body"));
        assert_ne!(key, delivery_key(&plain, b"bodY"));
        let other = props(None, &[("x-pesanan-id", text("B"))]);
        assert_ne!(key, delivery_key(&other, b"body"));
        let as_number = props(None, &[("x-pesanan-id", AMQPValue::LongLongInt(7))]);
        let as_text = props(None, &[("x-pesanan-id", text("7"))]);
        assert_ne!(delivery_key(&as_number, b""), delivery_key(&as_text, b""));
    }

    #[test]
    fn stored_values_never_carry_nul_and_stay_capped() {
        let headers = props(None, &[("h\0", text("v\0"))]);
        let json = headers_json(headers.headers().as_ref().expect("headers"));
        assert!(!json.to_string().contains("\\u0000"), "{json}");
        assert_eq!(capped_text(&"é".repeat(5000)).chars().count(), 2049);
        let big = props(None, &[("big", text(&"x".repeat(70_000)))]);
        let json = headers_json(big.headers().as_ref().expect("headers"));
        assert!(json.get("x-urutan-truncated").is_some(), "{json}");
    }

    /// Nesting depth of arrays and objects (a scalar is 0).
    fn json_depth(v: &Value) -> usize {
        match v {
            Value::Array(a) => 1 + a.iter().map(json_depth).max().unwrap_or(0),
            Value::Object(o) => 1 + o.values().map(json_depth).max().unwrap_or(0),
            _ => 0,
        }
    }

    #[test]
    fn headers_nested_too_deep_are_cut_with_a_marker() {
        let nested = |levels: usize| {
            let mut value = text("leaf");
            for level in 0..levels {
                value = if level % 2 == 0 {
                    AMQPValue::FieldArray(FieldArray::from(vec![value]))
                } else {
                    let mut t = FieldTable::default();
                    t.insert("k".into(), value);
                    AMQPValue::FieldTable(t)
                };
            }
            props(None, &[("deep", value)])
        };
        // Within the contract's depth: kept whole.
        let kept = nested(message::MAX_HEADERS_DEPTH);
        let json = headers_json(kept.headers().as_ref().expect("headers"));
        assert_eq!(json_depth(&json), message::MAX_HEADERS_DEPTH + 1, "{json}");
        assert!(!json.to_string().contains(amqp::TOO_DEEP));
        // Deeper (up to what the patched codec parses): cut at that depth.
        let deep = nested(40);
        let json = headers_json(deep.headers().as_ref().expect("headers"));
        assert_eq!(json_depth(&json), message::MAX_HEADERS_DEPTH + 1, "{json}");
        assert!(json.to_string().contains(amqp::TOO_DEEP), "{json}");
    }

    #[test]
    fn x_death_is_read_most_recent_first() {
        let mut first = FieldTable::default();
        first.insert("reason".into(), text("delivery_limit"));
        first.insert("queue".into(), text("pesanan.shard-007"));
        first.insert("count".into(), AMQPValue::LongLongInt(1));
        first.insert("time".into(), AMQPValue::Timestamp(1_700_000_000));
        first.insert("exchange".into(), text("pesanan"));
        let keys = FieldArray::from(vec![text("pesanan.jakarta.dibuat")]);
        first.insert("routing-keys".into(), AMQPValue::FieldArray(keys));
        let array = FieldArray::from(vec![AMQPValue::FieldTable(first)]);
        let p = props(Some("m"), &[("x-death", AMQPValue::FieldArray(array))]);
        let deaths = deaths(&p);
        assert_eq!(deaths.len(), 1);
        assert_eq!(deaths[0].reason, "delivery_limit");
        assert_eq!(deaths[0].routing_keys, ["pesanan.jakarta.dibuat"]);
        assert_eq!(deaths[0].time, Some(1_700_000_000));
        assert_eq!(shard_of(&deaths[0].queue), Some(7));
        assert_eq!(shard_of("pesanan.dlq"), None);
        assert_eq!(shard_of("x.shard-"), None);
    }

    #[test]
    fn order_id_and_versi_come_from_the_header_or_the_body() {
        assert_eq!(
            body_fields(br#"{"id":"B","versi":4}"#),
            (Some("B".into()), Some(4))
        );
        assert_eq!(body_fields(b"[1]"), (None, None));
        assert_eq!(body_fields(b"not json"), (None, None));
    }
}
