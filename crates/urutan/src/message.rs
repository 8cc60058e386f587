//! The contract's message (docs/contract.md, section 2): a delivery's envelope in,
//! a typed [`Event`] or a [`Rejection`] out. Pure code: no broker, no database.

use std::time::{Duration, SystemTime};

use serde::Deserialize;
use serde_json::value::RawValue;

mod jsonb;

/// The parts of a delivery the contract talks about, already lifted out of the
/// broker client's types (see `broker::delivery`).
#[derive(Debug, Clone, Copy)]
pub struct Envelope<'a> {
    /// `message_id` property.
    pub message_id: Option<&'a str>,
    /// Header `x-<ENTITY>-id` (`x-pesanan-id` by default).
    pub entity_header: EntityHeader<'a>,
    /// `delivery_mode` property (2 = persistent).
    pub delivery_mode: Option<u8>,
    /// `timestamp` property, seconds since the epoch.
    pub timestamp: Option<u64>,
    /// The raw body.
    pub body: &'a [u8],
    /// Size of the whole header table as encoded on the wire, nested tables
    /// and arrays included (exact for strings, 8 bytes per number: an upper
    /// bound), see [`MAX_HEADERS_BYTES`].
    pub headers_bytes: usize,
    /// Deepest nesting of tables and arrays inside the header table (0: only
    /// plain values; `x-death` is 3), see [`MAX_HEADERS_DEPTH`].
    pub headers_depth: usize,
}

/// Largest header table accepted. The broker's frame size (128 KiB by
/// default) already bounds it; a table this large is not a producer
/// following the contract.
pub const MAX_HEADERS_BYTES: usize = 64 * 1024;

/// Deepest nesting of tables and arrays accepted inside the header table.
/// The broker's own `x-death` nests 3 levels; the patched codec keeps
/// anything deeper than 32 levels as bytes (patches/amq-protocol-types), so
/// every over-deep table it let through is still refused here, before any
/// copy of the headers is made.
pub const MAX_HEADERS_DEPTH: usize = 16;

/// Largest `versi` accepted: 2^53 - 1, the largest integer every JSON
/// producer represents exactly (contract section 2).
pub const MAX_VERSI: i64 = (1 << 53) - 1;

/// What the entity header (`x-<ENTITY>-id`) held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntityHeader<'a> {
    Missing,
    /// An AMQP string (longstr or shortstr), as raw bytes.
    Text(&'a [u8]),
    /// Any other AMQP type, named for the log.
    OtherType(&'static str),
}

/// A valid event: the entity's whole state at version `versi`.
///
/// Serialized, it is the jsonb the apply functions take (`store::apply`):
/// the contract's body plus `message_id`; a new optional field added here
/// reaches the SQL functions without changing their signatures, and (with
/// `..Default::default()` at every literal) no call site.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Event {
    pub message_id: String,
    #[serde(rename = "id")]
    pub entity_id: String,
    pub status: String,
    /// Always >= 1.
    pub versi: i64,
    /// The optional `data` member, kept as raw JSON text (`None` when absent or null).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<Box<RawValue>>,
    /// When the producer published it, if it said (and the time is representable).
    #[serde(skip)]
    pub published_at: Option<SystemTime>,
    /// The apply span's trace context, recorded with the version's effects
    /// (`store::apply` passes it to the database beside the jsonb).
    #[serde(skip)]
    pub traceparent: Option<crate::trace::TraceParent>,
}

/// Why a delivery breaks the contract. Each maps to a bounded metric label.
///
/// Its `Display` says "the entity header"; [`Rejection::describe`] names
/// the pipeline's own (`x-<ENTITY>-id`), as every record and log line does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error("the header table is larger than {MAX_HEADERS_BYTES} bytes")]
    HeadersTooLarge,
    #[error("the message_id property is missing")]
    MissingMessageId,
    #[error("the message_id must be 1-255 bytes of text, without control characters or U+FFFD")]
    InvalidMessageId,
    #[error("the entity header is missing")]
    MissingEntityHeader,
    #[error("the entity header is not an AMQP string")]
    EntityHeaderNotString,
    #[error("the entity header must be 1-128 bytes of UTF-8, without control characters or U+FFFD")]
    InvalidEntityHeader,
    #[error("delivery_mode is not 2 (persistent)")]
    NotPersistent,
    #[error("the body is larger than the limit")]
    BodyTooLarge,
    #[error("the body is not UTF-8")]
    BodyNotUtf8,
    #[error("the body is not a JSON object with the contract's fields")]
    InvalidJson,
    #[error("`status` must be a string of 1-64 characters")]
    InvalidStatus,
    #[error("`versi` must be an integer from 1 to 2^53 - 1")]
    InvalidVersi,
    #[error("the body `id` differs from the entity header")]
    IdMismatch,
    #[error("a text value contains a NUL character, which PostgreSQL cannot store")]
    NulCharacter,
    #[error("`data` nests deeper than {MAX_DEPTH} levels")]
    TooDeep,
    #[error("the queue's delivery limit was reached (the handler kept failing)")]
    DeliveryLimit,
    #[error("the database refuses this message's data (a data or integrity error)")]
    DatabaseRefused,
    #[error("the x-urutan-epoch header is reserved for urutan's own epoch markers")]
    ReservedHeader,
    #[error("the header table nests deeper than {MAX_HEADERS_DEPTH} levels")]
    HeadersTooDeep,
    #[error("the handler (HANDLER_FUNCTION) refused this version")]
    HandlerRefused,
    #[error("set aside after a transient failure, it failed RETRY_MAX_ATTEMPTS times")]
    RetriesExhausted,
    #[error(
        "it would wait for a missing version while its shard already keeps GAP_WAITING_MAX parked versions"
    )]
    GapLimit,
}

impl Rejection {
    /// Every rejection (a new variant belongs here too): the bounded label
    /// set `urutan_dead_letters_total{reason}` is registered with at startup.
    /// (`message_id_reused` is retired: dedup is per (entity id, message
    /// id), migration 0037. Dead-letter records keep their reason as text,
    /// so an old record with it still lists, shows and replays.)
    pub const ALL: [Rejection; 22] = [
        Rejection::HeadersTooLarge,
        Rejection::MissingMessageId,
        Rejection::InvalidMessageId,
        Rejection::MissingEntityHeader,
        Rejection::EntityHeaderNotString,
        Rejection::InvalidEntityHeader,
        Rejection::NotPersistent,
        Rejection::BodyTooLarge,
        Rejection::BodyNotUtf8,
        Rejection::InvalidJson,
        Rejection::InvalidStatus,
        Rejection::InvalidVersi,
        Rejection::IdMismatch,
        Rejection::NulCharacter,
        Rejection::TooDeep,
        Rejection::DeliveryLimit,
        Rejection::DatabaseRefused,
        Rejection::ReservedHeader,
        Rejection::HeadersTooDeep,
        Rejection::HandlerRefused,
        Rejection::RetriesExhausted,
        Rejection::GapLimit,
    ];

    /// The rejection in the pipeline's own words: "the entity header"
    /// named as `entity_header` (`x-<ENTITY>-id`, e.g. `x-tagihan-id`).
    pub fn describe(self, entity_header: &str) -> String {
        self.to_string()
            .replace("the entity header", &format!("the {entity_header} header"))
    }

    /// The `reason` label of `urutan_dead_letters_total`.
    pub fn reason(self) -> &'static str {
        match self {
            Self::HeadersTooLarge => "headers_too_large",
            Self::MissingMessageId => "missing_message_id",
            Self::InvalidMessageId => "invalid_message_id",
            Self::MissingEntityHeader => "missing_entity_header",
            Self::EntityHeaderNotString => "entity_header_not_string",
            Self::InvalidEntityHeader => "invalid_entity_header",
            Self::NotPersistent => "not_persistent",
            Self::BodyTooLarge => "body_too_large",
            Self::BodyNotUtf8 => "body_not_utf8",
            Self::InvalidJson => "invalid_json",
            Self::InvalidStatus => "invalid_status",
            Self::InvalidVersi => "invalid_versi",
            Self::IdMismatch => "id_mismatch",
            Self::NulCharacter => "nul_character",
            Self::TooDeep => "too_deep",
            Self::DeliveryLimit => "delivery_limit",
            Self::DatabaseRefused => "database_refused",
            Self::ReservedHeader => "reserved_header",
            Self::HeadersTooDeep => "headers_too_deep",
            Self::HandlerRefused => "handler_refused",
            Self::RetriesExhausted => "retries_exhausted",
            Self::GapLimit => "gap_limit",
        }
    }
}

/// The body as the contract defines it; unknown members are ignored.
#[derive(Deserialize)]
struct Body<'a> {
    #[serde(borrow)]
    id: std::borrow::Cow<'a, str>,
    status: serde_json::Value,
    versi: serde_json::Value,
    #[serde(default)]
    data: Option<Box<RawValue>>,
}

/// Checks every rule of docs/contract.md section 2, cheapest first.
pub fn decode(env: &Envelope<'_>, max_body_bytes: usize) -> Result<Event, Rejection> {
    if env.headers_depth > MAX_HEADERS_DEPTH {
        return Err(Rejection::HeadersTooDeep);
    }
    if env.headers_bytes > MAX_HEADERS_BYTES {
        return Err(Rejection::HeadersTooLarge);
    }
    let (message_id, entity_id) = ids(env)?;
    if env.delivery_mode != Some(2) {
        return Err(Rejection::NotPersistent);
    }
    if env.body.len() > max_body_bytes {
        return Err(Rejection::BodyTooLarge);
    }
    let text = std::str::from_utf8(env.body).map_err(|_| Rejection::BodyNotUtf8)?;
    if !text.trim_start().starts_with('{') {
        return Err(Rejection::InvalidJson);
    }
    let body: Body<'_> = serde_json::from_str(text).map_err(|_| Rejection::InvalidJson)?;
    let status = match body.status {
        serde_json::Value::String(s) if (1..=64).contains(&s.chars().count()) => s,
        _ => return Err(Rejection::InvalidStatus),
    };
    let versi = body
        .versi
        .as_i64()
        .filter(|v| (1..=MAX_VERSI).contains(v))
        .ok_or(Rejection::InvalidVersi)?;
    if body.id != entity_id {
        return Err(Rejection::IdMismatch);
    }
    let data = body.data.filter(|raw| raw.get() != "null");
    if status.contains('\0') {
        return Err(Rejection::NulCharacter);
    }
    if let Some(data) = &data {
        jsonb::check(data.get())?;
    }
    Ok(Event {
        message_id: message_id.to_owned(),
        entity_id: entity_id.to_owned(),
        status,
        versi,
        data,
        // A producer's timestamp can be any u64; one the clock type cannot
        // hold (from 2^63 s on Linux) is dropped, not added with a panic.
        published_at: env
            .timestamp
            .and_then(|secs| SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(secs))),
        // Given by the worker's apply span (`shard::traced`).
        traceparent: None,
    })
}

/// The message id and the entity id, checked (contract section 2).
fn ids<'a>(env: &Envelope<'a>) -> Result<(&'a str, &'a str), Rejection> {
    let message_id = env.message_id.ok_or(Rejection::MissingMessageId)?;
    if message_id.is_empty() || message_id.len() > 255 {
        return Err(Rejection::InvalidMessageId);
    }
    let entity_id = match env.entity_header {
        EntityHeader::Missing => return Err(Rejection::MissingEntityHeader),
        EntityHeader::OtherType(_) => return Err(Rejection::EntityHeaderNotString),
        EntityHeader::Text(raw) if raw.is_empty() || raw.len() > 128 => {
            return Err(Rejection::InvalidEntityHeader);
        }
        EntityHeader::Text(raw) => {
            std::str::from_utf8(raw).map_err(|_| Rejection::InvalidEntityHeader)?
        }
    };
    if message_id.contains('\0') || entity_id.contains('\0') {
        return Err(Rejection::NulCharacter);
    }
    if !is_plain_id(message_id) {
        return Err(Rejection::InvalidMessageId);
    }
    if !is_plain_id(entity_id) {
        return Err(Rejection::InvalidEntityHeader);
    }
    Ok((message_id, entity_id))
}

/// Whether an id is plain text as the contract means it: no control
/// characters (a newline forges log lines, an escape sequence drives the
/// operator's terminal) and no U+FFFD, which is what the AMQP codec makes
/// of short-string bytes that are not UTF-8 (patches/amq-protocol-types):
/// the broker routed, and the producer meant, bytes urutan no longer has,
/// so two different ids could otherwise collide.
pub fn is_plain_id(id: &str) -> bool {
    !id.chars()
        .any(|c| c.is_control() || c == char::REPLACEMENT_CHARACTER)
}

/// Deepest nesting of arrays and objects accepted in `data` (PostgreSQL's
/// `jsonb` would fail on very deep input with an error that is not the
/// message's fault to retry).
pub const MAX_DEPTH: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: usize = 1024 * 1024;

    fn envelope<'a>(id: &'a [u8], body: &'a [u8]) -> Envelope<'a> {
        Envelope {
            message_id: Some("m-1"),
            entity_header: EntityHeader::Text(id),
            delivery_mode: Some(2),
            timestamp: Some(1_700_000_000),
            body,
            headers_bytes: 40,
            headers_depth: 3,
        }
    }

    fn reject(env: Envelope<'_>) -> Rejection {
        decode(&env, LIMIT).expect_err("should be rejected")
    }

    #[test]
    fn a_header_table_over_the_limit_is_refused_first() {
        let mut env = envelope(b"P-1", br#"{"id":"P-1","status":"s","versi":1}"#);
        env.headers_bytes = MAX_HEADERS_BYTES;
        assert!(decode(&env, LIMIT).is_ok());
        env.headers_bytes = MAX_HEADERS_BYTES + 1;
        env.message_id = None;
        assert_eq!(reject(env), Rejection::HeadersTooLarge);
    }

    #[test]
    fn a_valid_message_decodes() {
        let body = br#"{"id":"P-1","status":"dibuat","versi":3,"data":{"total":5},"extra":1}"#;
        let ev = decode(&envelope(b"P-1", body), LIMIT).expect("valid");
        assert_eq!(ev.message_id, "m-1");
        assert_eq!(ev.entity_id, "P-1");
        assert_eq!(ev.status, "dibuat");
        assert_eq!(ev.versi, 3);
        assert_eq!(
            ev.data.as_deref().map(RawValue::get),
            Some(r#"{"total":5}"#)
        );
        assert!(ev.published_at.is_some());
    }

    #[test]
    fn data_is_optional_and_null_means_absent() {
        let ev = decode(
            &envelope(b"P", br#"{"id":"P","status":"s","versi":1}"#),
            LIMIT,
        )
        .expect("valid");
        assert!(ev.data.is_none());
        let ev = decode(
            &envelope(b"P", br#"{"id":"P","status":"s","versi":1,"data":null}"#),
            LIMIT,
        )
        .expect("valid");
        assert!(ev.data.is_none());
    }

    #[test]
    fn message_id_rules() {
        let body = br#"{"id":"P","status":"s","versi":1}"#;
        let mut env = envelope(b"P", body);
        env.message_id = None;
        assert_eq!(reject(env), Rejection::MissingMessageId);
        env.message_id = Some("");
        assert_eq!(reject(env), Rejection::InvalidMessageId);
        let long = "x".repeat(256);
        env.message_id = Some(&long);
        assert_eq!(reject(env), Rejection::InvalidMessageId);
        let max = "x".repeat(255);
        env.message_id = Some(&max);
        assert!(decode(&env, LIMIT).is_ok());
    }

    #[test]
    fn headers_nested_too_deep_are_refused_first() {
        let mut env = envelope(b"P", br#"{"id":"P","status":"s","versi":1}"#);
        env.headers_depth = MAX_HEADERS_DEPTH;
        assert!(decode(&env, LIMIT).is_ok());
        env.headers_depth = MAX_HEADERS_DEPTH + 1;
        env.message_id = None;
        assert_eq!(reject(env), Rejection::HeadersTooDeep);
    }

    #[test]
    fn ids_with_control_characters_or_replacements_are_refused() {
        let body = br#"{"id":"P","status":"s","versi":1}"#;
        for bad in ["id-\u{fffd}", "a\nb", "\u{1b}[2J", "x\u{7f}", "\u{9b}"] {
            let mut env = envelope(b"P", body);
            env.message_id = Some(bad);
            assert_eq!(reject(env), Rejection::InvalidMessageId, "{bad:?}");
            let id_body = format!(
                r#"{{"id":{},"status":"s","versi":1}}"#,
                serde_json::json!(bad)
            );
            assert_eq!(
                reject(envelope(bad.as_bytes(), id_body.as_bytes())),
                Rejection::InvalidEntityHeader,
                "{bad:?}"
            );
        }
        // NUL keeps its own reason; other text is fine.
        let mut env = envelope(b"P", body);
        env.message_id = Some("a\0b");
        assert_eq!(reject(env), Rejection::NulCharacter);
        let id_body = r#"{"id":"pesanan é 漢 ✓","status":"s","versi":1}"#;
        let env = envelope("pesanan é 漢 ✓".as_bytes(), id_body.as_bytes());
        assert!(decode(&env, LIMIT).is_ok());
    }

    #[test]
    fn what_jsonb_refuses_is_a_contract_violation() {
        for data in [
            r#""\ud800""#,
            r#"{"k":"\udc00"}"#,
            "1e1000000",
            "[1e-1000000]",
        ] {
            let body = format!(r#"{{"id":"P","status":"s","versi":1,"data":{data}}}"#);
            assert_eq!(
                reject(envelope(b"P", body.as_bytes())),
                Rejection::InvalidJson,
                "{data}"
            );
        }
        // Surrogates in `id` and `status` are refused by the JSON parser.
        for body in [
            r#"{"id":"P\ud800","status":"s","versi":1}"#,
            r#"{"id":"P","status":"\udfff","versi":1}"#,
        ] {
            assert_eq!(
                reject(envelope(b"P", body.as_bytes())),
                Rejection::InvalidJson
            );
        }
        let body = r#"{"id":"P","status":"s","versi":1,"data":["\ud83d\ude00",1e300]}"#;
        assert!(decode(&envelope(b"P", body.as_bytes()), LIMIT).is_ok());
    }

    #[test]
    fn entity_header_rules() {
        let body = br#"{"id":"P","status":"s","versi":1}"#;
        let mut env = envelope(b"P", body);
        env.entity_header = EntityHeader::Missing;
        assert_eq!(reject(env), Rejection::MissingEntityHeader);
        env.entity_header = EntityHeader::OtherType("long-int");
        assert_eq!(reject(env), Rejection::EntityHeaderNotString);
        env.entity_header = EntityHeader::Text(b"");
        assert_eq!(reject(env), Rejection::InvalidEntityHeader);
        let long = vec![b'a'; 129];
        env.entity_header = EntityHeader::Text(&long);
        assert_eq!(reject(env), Rejection::InvalidEntityHeader);
        env.entity_header = EntityHeader::Text(b"\xff\xfe");
        assert_eq!(reject(env), Rejection::InvalidEntityHeader);
    }

    #[test]
    fn delivery_mode_must_be_persistent() {
        let mut env = envelope(b"P", br#"{"id":"P","status":"s","versi":1}"#);
        env.delivery_mode = Some(1);
        assert_eq!(reject(env), Rejection::NotPersistent);
        env.delivery_mode = None;
        assert_eq!(reject(env), Rejection::NotPersistent);
    }

    #[test]
    fn body_size_and_encoding() {
        let body = br#"{"id":"P","status":"s","versi":1}"#;
        assert_eq!(
            decode(&envelope(b"P", body), body.len() - 1).expect_err("too big"),
            Rejection::BodyTooLarge
        );
        assert!(decode(&envelope(b"P", body), body.len()).is_ok());
        assert_eq!(
            reject(envelope(b"P", b"{\"id\":\"\xff\"}")),
            Rejection::BodyNotUtf8
        );
    }

    #[test]
    fn body_must_be_a_contract_object() {
        for body in [
            &b"not json"[..],
            b"[\"P\",\"s\",1]",
            b"{\"status\":\"s\",\"versi\":1}",
            b"{\"id\":\"P\",\"versi\":1}",
            b"{\"id\":\"P\",\"status\":\"s\"}",
            b"{\"id\":\"P\",\"id\":\"P\",\"status\":\"s\",\"versi\":1}",
            b"{\"id\":7,\"status\":\"s\",\"versi\":1}",
        ] {
            let rejection = decode(&envelope(b"P", body), LIMIT).expect_err("invalid");
            assert!(
                matches!(
                    rejection,
                    Rejection::InvalidJson | Rejection::InvalidStatus | Rejection::InvalidVersi
                ),
                "{rejection:?} for {}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn deep_nesting_is_refused() {
        let nest = |n: usize| {
            let deep = format!("{}{}", "[".repeat(n), "]".repeat(n));
            format!(r#"{{"id":"P","status":"s","versi":1,"data":{deep}}}"#)
        };
        assert_eq!(
            reject(envelope(b"P", nest(10_000).as_bytes())),
            Rejection::TooDeep
        );
        assert_eq!(
            reject(envelope(b"P", nest(MAX_DEPTH + 1).as_bytes())),
            Rejection::TooDeep
        );
        assert!(decode(&envelope(b"P", nest(MAX_DEPTH).as_bytes()), LIMIT).is_ok());
        // Brackets inside strings do not count.
        let body = format!(
            r#"{{"id":"P","status":"s","versi":1,"data":"{}"}}"#,
            "[".repeat(100)
        );
        assert!(decode(&envelope(b"P", body.as_bytes()), LIMIT).is_ok());
    }

    #[test]
    fn status_rules() {
        for body in [
            r#"{"id":"P","status":"","versi":1}"#.to_owned(),
            r#"{"id":"P","status":3,"versi":1}"#.to_owned(),
            format!(r#"{{"id":"P","status":"{}","versi":1}}"#, "é".repeat(65)),
        ] {
            assert_eq!(
                reject(envelope(b"P", body.as_bytes())),
                Rejection::InvalidStatus
            );
        }
        let ok = format!(r#"{{"id":"P","status":"{}","versi":1}}"#, "é".repeat(64));
        assert!(decode(&envelope(b"P", ok.as_bytes()), LIMIT).is_ok());
    }

    #[test]
    fn versi_rules() {
        for versi in [
            "0",
            "-1",
            "1.5",
            "1.0",
            "\"2\"",
            "null",
            "9223372036854775808",
            "9223372036854775807",
            "9007199254740992",
        ] {
            let body = format!(r#"{{"id":"P","status":"s","versi":{versi}}}"#);
            assert_eq!(
                reject(envelope(b"P", body.as_bytes())),
                Rejection::InvalidVersi,
                "versi {versi}"
            );
        }
        let body = r#"{"id":"P","status":"s","versi":9007199254740991}"#;
        assert_eq!(
            decode(&envelope(b"P", body.as_bytes()), LIMIT)
                .expect("max")
                .versi,
            MAX_VERSI
        );
    }

    #[test]
    fn body_id_must_match_the_header() {
        let body = br#"{"id":"P-2","status":"s","versi":1}"#;
        assert_eq!(reject(envelope(b"P-1", body)), Rejection::IdMismatch);
        // Escapes are compared after decoding.
        let body = br#"{"id":"P\u002d1","status":"s","versi":1}"#;
        assert!(decode(&envelope(b"P-1", body), LIMIT).is_ok());
    }

    #[test]
    fn nul_characters_are_refused() {
        let body = br#"{"id":"P","status":"a\u0000b","versi":1}"#;
        assert_eq!(reject(envelope(b"P", body)), Rejection::NulCharacter);
        let body = br#"{"id":"P","status":"s","versi":1,"data":{"k":"\u0000"}}"#;
        assert_eq!(reject(envelope(b"P", body)), Rejection::NulCharacter);
        // An escaped backslash followed by `u0000` is plain text.
        let body = br#"{"id":"P","status":"s","versi":1,"data":"\\u0000"}"#;
        assert!(decode(&envelope(b"P", body), LIMIT).is_ok());
    }

    #[test]
    fn the_words_name_the_pipelines_header() {
        let said = Rejection::MissingEntityHeader.describe("x-tagihan-id");
        assert_eq!(said, "the x-tagihan-id header is missing");
        let said = Rejection::IdMismatch.describe("x-tagihan-id");
        assert_eq!(said, "the body `id` differs from the x-tagihan-id header");
        for rejection in Rejection::ALL {
            let said = rejection.describe("x-tagihan-id");
            assert!(
                !said.contains("pesanan") && !said.contains("entity header"),
                "{said}"
            );
        }
    }

    #[test]
    fn every_reason_label_is_distinct() {
        use std::collections::HashSet;
        let all = Rejection::ALL;
        let labels: HashSet<_> = all.iter().map(|r| r.reason()).collect();
        assert_eq!(labels.len(), all.len());
    }
}
