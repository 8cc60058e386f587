//! AMQP properties and field tables as storable JSON, and the broker's
//! `x-death` header read into a typed list. Strings are lossy UTF-8 with
//! NUL characters replaced: PostgreSQL's `text` and `jsonb` hold neither
//! NULs nor invalid UTF-8.

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};

use serde_json::{Map, Value, json};

use crate::message;
use crate::store::dead_letter::Death;

/// Largest header JSON kept; larger tables are summarised.
const HEADERS_KEPT: usize = 64 * 1024;

/// NUL characters replaced (PostgreSQL text cannot hold them).
pub fn clean(s: &str) -> String {
    s.replace('\0', "\u{fffd}")
}

fn lossy(bytes: &[u8]) -> String {
    clean(&String::from_utf8_lossy(bytes))
}

/// The message's properties as JSON (only those it has).
pub fn properties_json(props: &BasicProperties) -> Value {
    let mut out = Map::new();
    let mut text = |name: &str, value: &Option<lapin::types::ShortString>| {
        if let Some(v) = value {
            out.insert(name.to_owned(), Value::String(clean(v.as_str())));
        }
    };
    text("message_id", props.message_id());
    text("content_type", props.content_type());
    text("content_encoding", props.content_encoding());
    text("correlation_id", props.correlation_id());
    text("reply_to", props.reply_to());
    text("expiration", props.expiration());
    text("type", props.kind());
    text("user_id", props.user_id());
    text("app_id", props.app_id());
    text("cluster_id", props.cluster_id());
    if let Some(mode) = props.delivery_mode() {
        out.insert("delivery_mode".into(), json!(mode));
    }
    if let Some(priority) = props.priority() {
        out.insert("priority".into(), json!(priority));
    }
    if let Some(ts) = props.timestamp() {
        out.insert("timestamp".into(), json!(ts));
    }
    Value::Object(out)
}

/// Deepest nesting of header tables and arrays kept in JSON; deeper ones
/// are replaced by [`TOO_DEEP`]. The same bound as the contract's
/// ([`message::MAX_HEADERS_DEPTH`]): a record always fits `jsonb`, and
/// the copy recurses at most this deep.
const DEPTH_KEPT: usize = message::MAX_HEADERS_DEPTH;

/// What stands in for a table or array nested deeper than `DEPTH_KEPT`.
pub const TOO_DEEP: &str = "x-urutan-truncated: nested too deep, not kept";

/// A header table as JSON; a table larger than `HEADERS_KEPT` once
/// converted is replaced by a summary (its size and names), and tables or
/// arrays nested deeper than `DEPTH_KEPT` by `TOO_DEEP`.
pub fn headers_json(table: &FieldTable) -> Value {
    let full = table_json(table, 1);
    let size = full.to_string().len();
    if size <= HEADERS_KEPT {
        return full;
    }
    let names: Vec<String> = table
        .inner()
        .keys()
        .take(100)
        .map(|k| clean(k.as_str()))
        .collect();
    json!({"x-urutan-truncated": format!("{size} bytes of headers, not kept"), "names": names})
}

/// `table` as a JSON object; `level` is its own nesting level (the header
/// table is level 1).
fn table_json(table: &FieldTable, level: usize) -> Value {
    Value::Object(
        table
            .inner()
            .iter()
            .map(|(k, v)| (clean(k.as_str()), value_json(v, level)))
            .collect(),
    )
}

/// An AMQP value as JSON: numbers and booleans as such, strings lossy
/// UTF-8, byte arrays as hex, timestamps as seconds, decimals as text;
/// `level` is the nesting level of the table or array holding it.
fn value_json(value: &AMQPValue, level: usize) -> Value {
    match value {
        AMQPValue::FieldArray(_) | AMQPValue::FieldTable(_) if level > DEPTH_KEPT => {
            Value::String(TOO_DEEP.to_owned())
        }
        AMQPValue::Boolean(b) => json!(b),
        AMQPValue::ShortShortInt(n) => json!(n),
        AMQPValue::ShortShortUInt(n) => json!(n),
        AMQPValue::ShortInt(n) => json!(n),
        AMQPValue::ShortUInt(n) => json!(n),
        AMQPValue::LongInt(n) => json!(n),
        AMQPValue::LongUInt(n) => json!(n),
        AMQPValue::LongLongInt(n) => json!(n),
        AMQPValue::Float(f) => json!(f),
        AMQPValue::Double(f) => json!(f),
        AMQPValue::DecimalValue(d) => {
            let scaled = f64::from(d.value) / 10f64.powi(i32::from(d.scale));
            Value::String(scaled.to_string())
        }
        AMQPValue::ShortString(s) => Value::String(clean(s.as_str())),
        AMQPValue::LongString(s) => Value::String(lossy(s.as_bytes())),
        AMQPValue::FieldArray(a) => Value::Array(
            a.as_slice()
                .iter()
                .map(|v| value_json(v, level + 1))
                .collect(),
        ),
        AMQPValue::Timestamp(t) => json!(t),
        AMQPValue::FieldTable(t) => table_json(t, level + 1),
        AMQPValue::ByteArray(b) => {
            let hex: String = b.as_slice().iter().map(|b| format!("{b:02x}")).collect();
            Value::String(format!("0x{hex}"))
        }
        AMQPValue::Void => Value::Null,
    }
}

/// The `x-death` entries of a message (empty without the header).
pub fn deaths(props: &BasicProperties) -> Vec<Death> {
    let Some(AMQPValue::FieldArray(entries)) = props
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get("x-death"))
    else {
        return Vec::new();
    };
    let text = |v: Option<&AMQPValue>| match v {
        Some(AMQPValue::LongString(s)) => lossy(s.as_bytes()),
        Some(AMQPValue::ShortString(s)) => clean(s.as_str()),
        _ => String::new(),
    };
    entries
        .as_slice()
        .iter()
        .filter_map(|entry| {
            let AMQPValue::FieldTable(t) = entry else {
                return None;
            };
            let t = t.inner();
            let count = match t.get("count") {
                Some(AMQPValue::LongLongInt(n)) => *n,
                Some(AMQPValue::LongInt(n)) => i64::from(*n),
                Some(AMQPValue::LongUInt(n)) => i64::from(*n),
                _ => 0,
            };
            let routing_keys = match t.get("routing-keys") {
                Some(AMQPValue::FieldArray(keys)) => {
                    keys.as_slice().iter().map(|k| text(Some(k))).collect()
                }
                _ => Vec::new(),
            };
            Some(Death {
                reason: text(t.get("reason")),
                queue: text(t.get("queue")),
                count,
                time: match t.get("time") {
                    Some(AMQPValue::Timestamp(ts)) => Some(*ts),
                    _ => None,
                },
                exchange: text(t.get("exchange")),
                routing_keys,
            })
        })
        .collect()
}
