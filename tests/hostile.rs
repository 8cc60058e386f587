//! Hostile input: whatever a producer (or a broken client) puts in a delivery,
//! lifting it into an envelope and decoding it never panics, never recurses
//! without bound, and stays cheap; and every valid message decodes to exactly
//! what was sent. Pure code only: no broker, no database.
//!
//! Property cases are kept moderate so this binary runs in seconds in debug;
//! `PROPTEST_CASES` does not override them (they are set explicitly), edit
//! `cases()` for a longer soak.

use urutan_testkit::wire;

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use lapin::BasicProperties;
use lapin::message::Delivery;
use lapin::types::{
    AMQPValue, ByteArray, DecimalValue, FieldArray, FieldTable, LongString, ShortString,
};
use proptest::prelude::*;
use proptest::test_runner::Config;
use serde_json::Value;
use urutan::broker::delivery::{ENTITY_HEADER, envelope, epoch_marker, previous_deliveries};
use urutan::message::{
    EntityHeader, Envelope, Event, MAX_DEPTH, MAX_HEADERS_DEPTH, MAX_VERSI, Rejection, decode,
};

/// The contract's default body limit.
const MIB: usize = 1024 * 1024;

/// A proptest configuration with `n` cases that writes no regression files
/// into the source tree (a failure prints its minimal input instead).
fn cases(n: u32) -> Config {
    Config {
        cases: n,
        failure_persistence: None,
        ..Config::default()
    }
}

/// Runs `f` on a thread with a deliberately small stack (smaller than the
/// 2 MiB of tokio's workers), so unbounded recursion shows up as a crash here
/// rather than in production, and fails if it takes longer than `limit`.
fn bounded<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let start = Instant::now();
    let out = std::thread::Builder::new()
        .name("small-stack".into())
        .stack_size(512 * 1024)
        .spawn(f)
        .expect("spawn a small-stack thread")
        .join()
        .expect("the decoder panicked");
    let took = start.elapsed();
    assert!(took < limit, "took {took:?}, limit {limit:?}");
    out
}

// ---------------------------------------------------------------------------
// Generators
// ---------------------------------------------------------------------------

/// Any character but NUL (PostgreSQL text cannot hold NUL; the decoder
/// refuses it, tested on its own below).
fn non_nul_char() -> impl Strategy<Value = char> {
    any::<char>().prop_filter("no NUL", |c| *c != '\0')
}

/// A non-NUL string of 1..=`max_bytes` UTF-8 bytes (cut at a char boundary).
fn text_of_bytes(max_bytes: usize) -> impl Strategy<Value = String> {
    proptest::collection::vec(non_nul_char(), 1..=max_bytes).prop_map(move |chars| {
        let mut s = String::new();
        for c in chars {
            if s.len() + c.len_utf8() > max_bytes {
                break;
            }
            s.push(c);
        }
        s
    })
}

/// A character an id may hold: no control character, no U+FFFD (see
/// `urutan::message::is_plain_id`).
fn id_char() -> impl Strategy<Value = char> {
    any::<char>().prop_filter("plain", |c| {
        !c.is_control() && *c != char::REPLACEMENT_CHARACTER
    })
}

/// A plain id of 1..=`max_bytes` UTF-8 bytes (cut at a char boundary).
fn id_of_bytes(max_bytes: usize) -> impl Strategy<Value = String> {
    proptest::collection::vec(id_char(), 1..=max_bytes).prop_map(move |chars| {
        let mut s = String::new();
        for c in chars {
            if s.len() + c.len_utf8() > max_bytes {
                break;
            }
            s.push(c);
        }
        s
    })
}

/// 1..=64 non-NUL characters (the contract counts characters, not bytes).
fn status() -> impl Strategy<Value = String> {
    proptest::collection::vec(non_nul_char(), 1..=64).prop_map(String::from_iter)
}

fn json_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        proptest::collection::vec(non_nul_char(), 0..24)
            .prop_map(|c| Value::String(c.into_iter().collect())),
    ]
}

/// Arbitrary JSON up to a few levels deep, with NUL-free strings and keys.
fn json_value() -> impl Strategy<Value = Value> {
    json_leaf().prop_recursive(6, 64, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::btree_map(
                proptest::collection::vec(non_nul_char(), 0..12).prop_map(String::from_iter),
                inner,
                0..6
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Nesting depth of arrays and objects, counted as the decoder counts it.
fn depth(v: &Value) -> usize {
    match v {
        Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
        Value::Object(o) => 1 + o.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// Arbitrary JSON within [`MAX_DEPTH`]: a random value wrapped in up to
/// `MAX_DEPTH - depth` further arrays and objects, so deep-but-legal
/// values (right at the limit) are exercised too.
fn data_within_limit() -> impl Strategy<Value = Value> {
    (
        json_value(),
        proptest::collection::vec(any::<bool>(), 0..=MAX_DEPTH),
    )
        .prop_map(|(mut v, wraps)| {
            let room = MAX_DEPTH - depth(&v);
            for as_array in wraps.into_iter().take(room) {
                v = if as_array {
                    Value::Array(vec![v])
                } else {
                    Value::Object([("k".to_owned(), v)].into_iter().collect())
                };
            }
            v
        })
}

/// A JSON string literal for `s`; with `escape_all`, every character is a
/// `\uXXXX` escape (surrogate pairs beyond the BMP), which the decoder must
/// read as the same text.
fn json_string(s: &str, escape_all: bool) -> String {
    if !escape_all {
        return serde_json::to_string(s).expect("a string serializes");
    }
    let mut out = String::from("\"");
    for unit in s.encode_utf16() {
        out.push_str(&format!("\\u{unit:04x}"));
    }
    out.push('"');
    out
}

/// A valid contract message, plus how its body is spelled.
#[derive(Debug, Clone)]
struct Valid {
    message_id: String,
    entity_id: String,
    status: String,
    versi: i64,
    /// `None`: no `data` member; `Some(Value::Null)`: `"data": null`.
    data: Option<Value>,
    pretty_data: bool,
    escape_all: bool,
    /// Unknown members, which the decoder ignores.
    extra: Vec<(String, Value)>,
    /// Order of the members in the body (a permutation seed).
    order: Vec<usize>,
    timestamp: Option<u64>,
    short_header: bool,
}

impl Valid {
    /// The body text, and the exact text of `data` inside it.
    fn body(&self) -> (String, Option<String>) {
        let data = self.data.as_ref().map(|d| {
            if self.pretty_data {
                serde_json::to_string_pretty(d).expect("data serializes")
            } else {
                serde_json::to_string(d).expect("data serializes")
            }
        });
        let mut members = vec![
            format!("\"id\":{}", json_string(&self.entity_id, self.escape_all)),
            format!(
                "\"status\" : {}",
                json_string(&self.status, self.escape_all)
            ),
            format!("\"versi\":\t{}", self.versi),
        ];
        if let Some(d) = &data {
            members.push(format!("\"data\": {d}"));
        }
        for (k, v) in &self.extra {
            members.push(format!("\"x-{}\":{v}", k.len()));
        }
        // A deterministic shuffle driven by the generated seed.
        let mut keyed: Vec<_> = members
            .into_iter()
            .enumerate()
            .map(|(i, m)| (self.order.get(i).copied().unwrap_or(i), m))
            .collect();
        keyed.sort_by_key(|(k, _)| *k);
        let inner: Vec<_> = keyed.into_iter().map(|(_, m)| m).collect();
        (format!(" \n{{{}}}\n", inner.join(" , ")), data)
    }
}

fn valid() -> impl Strategy<Value = Valid> {
    (
        (id_of_bytes(255), id_of_bytes(128), status(), 1..=MAX_VERSI),
        proptest::option::of(prop_oneof![Just(Value::Null), data_within_limit()]),
        (any::<bool>(), any::<bool>(), any::<bool>()),
        proptest::collection::vec((text_of_bytes(8), json_value()), 0..3),
        proptest::collection::vec(any::<usize>(), 8),
        proptest::option::of(any::<u64>()),
    )
        .prop_map(
            |(
                (message_id, entity_id, status, versi),
                data,
                (pretty_data, escape_all, short_header),
                extra,
                order,
                timestamp,
            )| Valid {
                message_id,
                entity_id,
                status,
                versi,
                data,
                pretty_data,
                escape_all,
                extra,
                order,
                timestamp,
                short_header,
            },
        )
}

/// The valid envelope parts around a `body`.
fn envelope_for<'a>(v: &'a Valid, body: &'a [u8]) -> Envelope<'a> {
    Envelope {
        message_id: Some(&v.message_id),
        entity_header: EntityHeader::Text(v.entity_id.as_bytes()),
        delivery_mode: Some(2),
        timestamp: v.timestamp,
        body,
        headers_bytes: 0,
        headers_depth: 0,
    }
}

/// What `timestamp` should become: the instant, if the platform can hold it.
fn expected_published_at(timestamp: Option<u64>) -> Option<SystemTime> {
    timestamp.and_then(|s| SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(s)))
}

/// Bodies that reach the JSON parser in interesting states: random bytes,
/// JSON-ish token soup, and valid bodies with a few bytes broken.
fn hostile_body() -> impl Strategy<Value = Vec<u8>> {
    let tokens = prop_oneof![
        Just(&b"{"[..]),
        Just(&b"}"[..]),
        Just(&b"["[..]),
        Just(&b"]"[..]),
        Just(&b"\""[..]),
        Just(&b":"[..]),
        Just(&b","[..]),
        Just(&b"\\"[..]),
        Just(&b"\\u0000"[..]),
        Just(&b"\\ud800"[..]),
        Just(&b"\"id\""[..]),
        Just(&b"\"status\""[..]),
        Just(&b"\"versi\""[..]),
        Just(&b"\"data\""[..]),
        Just(&b"\"P\""[..]),
        Just(&b"1"[..]),
        Just(&b"-0"[..]),
        Just(&b"1e999"[..]),
        Just(&b"9223372036854775808"[..]),
        Just(&b"null"[..]),
        Just(&b" "[..]),
        Just(&b"\xff"[..]),
        Just(&b"\xc3"[..]),
    ];
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..512),
        proptest::collection::vec(tokens, 0..64).prop_map(|t| {
            let mut body = b"{".to_vec();
            body.extend(t.concat());
            body
        }),
        (
            proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
            any::<bool>()
        )
            .prop_map(|(edits, truncate)| {
                let mut body =
                    br#"{"id":"P","status":"dibuat","versi":1,"data":{"a":[1,"x",null]}}"#.to_vec();
                for (at, byte) in edits {
                    let i = at.index(body.len());
                    body[i] = byte;
                }
                if truncate {
                    body.truncate(body.len() / 2);
                }
                body
            }),
    ]
}

fn entity_header() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..200),
        Just(b"P".to_vec()),
    ]
}

/// Arbitrary envelope parts (owned; borrowed into an [`Envelope`] per case).
#[derive(Debug, Clone)]
struct Parts {
    message_id: Option<String>,
    header_kind: u8,
    header: Vec<u8>,
    other_type: &'static str,
    delivery_mode: Option<u8>,
    timestamp: Option<u64>,
    body: Vec<u8>,
    max: usize,
    headers_bytes: usize,
    headers_depth: usize,
}

impl Parts {
    fn envelope(&self) -> Envelope<'_> {
        Envelope {
            message_id: self.message_id.as_deref(),
            entity_header: match self.header_kind % 3 {
                0 => EntityHeader::Missing,
                1 => EntityHeader::Text(&self.header),
                _ => EntityHeader::OtherType(self.other_type),
            },
            delivery_mode: self.delivery_mode,
            timestamp: self.timestamp,
            body: &self.body,
            headers_bytes: self.headers_bytes,
            headers_depth: self.headers_depth,
        }
    }
}

fn parts() -> impl Strategy<Value = Parts> {
    (
        proptest::option::of(prop_oneof![
            Just(String::new()),
            Just("m-1".to_owned()),
            proptest::collection::vec(any::<char>(), 0..300).prop_map(String::from_iter),
            (250..=260usize).prop_map(|n| "x".repeat(n)),
        ]),
        (any::<u8>(), entity_header()),
        prop::sample::select(vec!["integer", "table", "void", ""]),
        proptest::option::of(prop_oneof![Just(2u8), any::<u8>()]),
        proptest::option::of(any::<u64>()),
        hostile_body(),
        (
            prop_oneof![Just(MIB), 0..600usize],
            prop_oneof![0..100usize, 65_000..70_000usize],
            prop_oneof![0..=MAX_HEADERS_DEPTH, 0..40usize],
        ),
    )
        .prop_map(
            |(
                message_id,
                (header_kind, header),
                other_type,
                delivery_mode,
                timestamp,
                body,
                (max, headers_bytes, headers_depth),
            )| {
                Parts {
                    message_id,
                    header_kind,
                    header,
                    other_type,
                    delivery_mode,
                    timestamp,
                    body,
                    max,
                    headers_bytes,
                    headers_depth,
                }
            },
        )
}

/// What any successful decode must satisfy, whatever the input was.
fn assert_sound(env: &Envelope<'_>, max: usize, event: &Event) {
    assert!(env.headers_bytes <= urutan::message::MAX_HEADERS_BYTES);
    assert!(env.headers_depth <= MAX_HEADERS_DEPTH);
    assert_eq!(Some(event.message_id.as_str()), env.message_id);
    assert!((1..=255).contains(&event.message_id.len()));
    assert_eq!(
        env.entity_header,
        EntityHeader::Text(event.entity_id.as_bytes())
    );
    assert!((1..=128).contains(&event.entity_id.len()));
    assert!((1..=64).contains(&event.status.chars().count()));
    assert!((1..=MAX_VERSI).contains(&event.versi));
    assert_eq!(env.delivery_mode, Some(2));
    assert!(env.body.len() <= max);
    for text in [&event.message_id, &event.entity_id, &event.status] {
        assert!(!text.contains('\0'));
    }
    for id in [&event.message_id, &event.entity_id] {
        assert!(urutan::message::is_plain_id(id), "{id:?}");
    }
    if let Some(data) = &event.data {
        let parsed: Value = serde_json::from_str(data.get()).expect("data is valid JSON");
        assert!(!parsed.is_null(), "null data is reported as absent");
    }
}

// ---------------------------------------------------------------------------
// decode: properties
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(cases(1024))]

    /// Anything at all: no panic, and a success is always sound.
    #[test]
    fn decode_never_panics_and_successes_are_sound(p in parts()) {
        let env = p.envelope();
        match decode(&env, p.max) {
            Ok(event) => assert_sound(&env, p.max, &event),
            Err(rejection) => {
                prop_assert_ne!(rejection, Rejection::DeliveryLimit, "decode never says delivery_limit");
                if p.headers_depth > MAX_HEADERS_DEPTH {
                    prop_assert_eq!(rejection, Rejection::HeadersTooDeep);
                } else if p.headers_bytes > urutan::message::MAX_HEADERS_BYTES {
                    prop_assert_eq!(rejection, Rejection::HeadersTooLarge);
                } else if p.message_id.is_none() {
                    prop_assert_eq!(rejection, Rejection::MissingMessageId);
                }
                prop_assert!(!rejection.reason().is_empty());
            }
        }
    }
}

proptest! {
    #![proptest_config(cases(256))]

    /// A valid message decodes to exactly its fields, however the body spells them.
    #[test]
    fn a_valid_message_decodes_to_exactly_its_fields(v in valid()) {
        let (body, data_text) = v.body();
        let mut env = envelope_for(&v, body.as_bytes());
        let header_copy;
        if v.short_header {
            // The same bytes as a shortstr would give (lapin lifts both alike).
            header_copy = v.entity_id.clone().into_bytes();
            env.entity_header = EntityHeader::Text(&header_copy);
        }
        let event = decode(&env, MIB).map_err(|r| {
            TestCaseError::fail(format!("{r:?} for body {body}"))
        })?;
        prop_assert_eq!(&event.message_id, &v.message_id);
        prop_assert_eq!(&event.entity_id, &v.entity_id);
        prop_assert_eq!(&event.status, &v.status);
        prop_assert_eq!(event.versi, v.versi);
        let got = event.data.as_deref().map(|raw| raw.get().to_owned());
        let want = data_text.filter(|d| d != "null");
        prop_assert_eq!(got, want);
        prop_assert_eq!(event.published_at, expected_published_at(v.timestamp));
    }

    /// Any body over the limit is refused for its size alone (before UTF-8
    /// or JSON are looked at), whatever it holds.
    #[test]
    fn any_body_over_the_limit_is_too_large(
        v in valid(),
        max in 0..2048usize,
        extra in 1..512usize,
        fill in any::<u8>(),
    ) {
        let body = vec![fill; max + extra];
        prop_assert_eq!(decode(&envelope_for(&v, &body), max).err(), Some(Rejection::BodyTooLarge));
    }

    /// A header id that is not UTF-8 is an invalid entity header (whatever the body).
    #[test]
    fn a_header_that_is_not_utf8_is_an_invalid_entity_header(
        v in valid(),
        header in proptest::collection::vec(any::<u8>(), 1..=128)
            .prop_filter("not UTF-8", |b| std::str::from_utf8(b).is_err()),
    ) {
        let (body, _) = v.body();
        let mut env = envelope_for(&v, body.as_bytes());
        env.entity_header = EntityHeader::Text(&header);
        prop_assert_eq!(decode(&env, MIB).err(), Some(Rejection::InvalidEntityHeader));
    }

    /// Ids outside 1-128 bytes, message ids outside 1-255 bytes.
    #[test]
    fn lengths_outside_the_contract_are_refused(
        v in valid(),
        long_id in "[a-z]{129,400}",
        long_mid in "[a-z]{256,600}",
    ) {
        let (body, _) = v.body();
        let mut env = envelope_for(&v, body.as_bytes());
        env.entity_header = EntityHeader::Text(long_id.as_bytes());
        prop_assert_eq!(decode(&env, MIB).err(), Some(Rejection::InvalidEntityHeader));
        env.entity_header = EntityHeader::Text(b"");
        prop_assert_eq!(decode(&env, MIB).err(), Some(Rejection::InvalidEntityHeader));
        let mut env = envelope_for(&v, body.as_bytes());
        env.message_id = Some(&long_mid);
        prop_assert_eq!(decode(&env, MIB).err(), Some(Rejection::InvalidMessageId));
        env.message_id = Some("");
        prop_assert_eq!(decode(&env, MIB).err(), Some(Rejection::InvalidMessageId));
    }

    /// A body id that differs from the header is an id mismatch.
    #[test]
    fn a_different_body_id_is_a_mismatch(v in valid(), other in id_of_bytes(128)) {
        prop_assume!(other != v.entity_id);
        let (body, _) = v.body();
        let mut env = envelope_for(&v, body.as_bytes());
        env.entity_header = EntityHeader::Text(other.as_bytes());
        prop_assert_eq!(decode(&env, MIB).err(), Some(Rejection::IdMismatch));
    }

    /// A NUL anywhere in a stored text (status, or a string in `data`) is refused.
    #[test]
    fn a_nul_in_stored_text_is_refused(
        mut v in valid(),
        at in any::<prop::sample::Index>(),
        in_data in any::<bool>(),
    ) {
        let mut chars: Vec<char> = v.status.chars().take(63).collect();
        chars.insert(at.index(chars.len() + 1), '\0');
        let with_nul: String = chars.into_iter().collect();
        if in_data {
            v.data = Some(serde_json::json!({ "nested": [with_nul] }));
        } else {
            v.status = with_nul;
        }
        let (body, _) = v.body();
        prop_assert_eq!(
            decode(&envelope_for(&v, body.as_bytes()), MIB).err(),
            Some(Rejection::NulCharacter),
            "{}", body
        );
    }

    /// Nesting beyond the limit in `data`, at any depth and shape.
    #[test]
    fn data_deeper_than_the_limit_is_too_deep(
        v in valid(),
        shape in proptest::collection::vec(any::<bool>(), MAX_DEPTH + 1..MAX_DEPTH + 400),
    ) {
        let mut data = Value::from(1);
        for as_array in shape {
            data = if as_array {
                Value::Array(vec![data])
            } else {
                Value::Object([("k".to_owned(), data)].into_iter().collect())
            };
        }
        let mut v = v;
        v.data = Some(data);
        let (body, _) = v.body();
        prop_assert_eq!(
            decode(&envelope_for(&v, body.as_bytes()), MIB).err(),
            Some(Rejection::TooDeep)
        );
    }
}

// ---------------------------------------------------------------------------
// decode: size, depth and time bounds
// ---------------------------------------------------------------------------

fn plain_envelope(body: &[u8]) -> Envelope<'_> {
    Envelope {
        message_id: Some("m-1"),
        entity_header: EntityHeader::Text(b"P"),
        delivery_mode: Some(2),
        timestamp: None,
        body,
        headers_bytes: 0,
        headers_depth: 0,
    }
}

/// One byte over the default limit is refused before any parsing: the body
/// below is neither UTF-8 nor JSON, and the answer is still the size.
#[test]
fn one_mib_plus_one_is_refused_before_parsing() {
    let mut body = vec![b'['; MIB + 1];
    body[0] = 0xff;
    let rejection = bounded(Duration::from_millis(500), move || {
        decode(&plain_envelope(&body), MIB).err()
    });
    assert_eq!(rejection, Some(Rejection::BodyTooLarge));
    // Exactly at the limit it is looked at (and is not UTF-8).
    let mut body = vec![b'['; MIB];
    body[0] = 0xff;
    assert_eq!(
        decode(&plain_envelope(&body), MIB).err(),
        Some(Rejection::BodyNotUtf8)
    );
}

/// Wraps `inner` in a contract body as the member `key` (other members valid).
fn body_with(key: &str, inner: &str) -> String {
    let mut members = vec![
        r#""id":"P""#.to_owned(),
        r#""status":"s""#.to_owned(),
        r#""versi":1"#.to_owned(),
    ];
    let at = match key {
        "id" => Some(0),
        "status" => Some(1),
        "versi" => Some(2),
        _ => None,
    };
    match at {
        Some(i) => members[i] = format!("\"{key}\":{inner}"),
        None => members.push(format!("\"{key}\":{inner}")),
    }
    format!("{{{}}}", members.join(","))
}

/// A 1 MiB body of `[` and friends: refused quickly, without deep recursion
/// (a 512 KiB stack is enough), wherever the nesting sits.
#[test]
fn deep_nesting_is_refused_quickly_and_without_recursion() {
    let limit = Duration::from_secs(5);
    let open = "[".repeat(MIB);
    let cases: Vec<(String, String, &[Rejection])> = vec![
        // The whole body.
        ("1 MiB of [".into(), open.clone(), &[Rejection::InvalidJson]),
        // Unterminated inside `data`.
        (
            "data: 1 MiB of [".into(),
            body_with("data", &"[".repeat(MIB - 64)),
            &[Rejection::InvalidJson, Rejection::TooDeep],
        ),
        // Balanced, 100k deep, inside `data`.
        (
            "data: 100k balanced".into(),
            body_with(
                "data",
                &format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)),
            ),
            &[Rejection::TooDeep],
        ),
        // Objects, 60k deep, inside `data`.
        (
            "data: 60k objects".into(),
            body_with(
                "data",
                &format!("{}1{}", r#"{"a":"#.repeat(60_000), "}".repeat(60_000)),
            ),
            &[Rejection::TooDeep],
        ),
        // Inside members parsed into a JSON tree: serde_json's own
        // recursion limit (128) refuses them.
        (
            "status: 100k balanced".into(),
            body_with(
                "status",
                &format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)),
            ),
            &[Rejection::InvalidJson],
        ),
        (
            "versi: 100k balanced".into(),
            body_with(
                "versi",
                &format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)),
            ),
            &[Rejection::InvalidJson],
        ),
        (
            "id: 1 MiB of [".into(),
            body_with("id", &"[".repeat(MIB - 64)),
            &[Rejection::InvalidJson],
        ),
    ];
    for (what, body, expected) in cases {
        assert!(body.len() <= MIB, "{what}: {} bytes", body.len());
        let got = bounded(limit, move || decode(&plain_envelope(body.as_bytes()), MIB));
        let rejection = got.as_ref().err().copied();
        assert!(
            rejection.is_some_and(|r| expected.contains(&r)),
            "{what}: {:?}, expected one of {expected:?}",
            got.map(|e| e.message_id)
        );
    }
}

/// Nesting in an unknown member is skipped without recursion and without a
/// limit: the contract ignores unknown members and they are never stored.
#[test]
fn deep_nesting_in_an_unknown_member_is_ignored_without_recursion() {
    let deep = format!("{}{}", "[".repeat(200_000), "]".repeat(200_000));
    let body = body_with("ignored", &deep);
    let event = bounded(Duration::from_secs(5), move || {
        decode(&plain_envelope(body.as_bytes()), MIB).map(|e| e.versi)
    });
    assert_eq!(event, Ok(1));
    let unterminated = body_with("ignored", &"{\"a\":".repeat(150_000));
    let rejection = bounded(Duration::from_secs(5), move || {
        decode(&plain_envelope(unterminated.as_bytes()), MIB).err()
    });
    assert_eq!(rejection, Some(Rejection::InvalidJson));
}

/// The worst legal `data` (exactly at the depth limit, close to 1 MiB)
/// decodes quickly and whole.
#[test]
fn a_large_legal_body_decodes_quickly() {
    // Items MAX_DEPTH - 1 deep inside one outer array: exactly MAX_DEPTH.
    let item = format!("{}{}", "[".repeat(MAX_DEPTH - 1), "]".repeat(MAX_DEPTH - 1));
    let items = vec![item; (MIB - 1024) / (2 * MAX_DEPTH)];
    let data = format!("[{}]", items.join(","));
    let body = body_with("data", &data);
    assert!(body.len() <= MIB, "{} bytes", body.len());
    let got = bounded(Duration::from_secs(5), move || {
        decode(&plain_envelope(body.as_bytes()), MIB).map(|e| e.data.map(|d| d.get().to_owned()))
    });
    assert_eq!(got, Ok(Some(data)));
}

/// A timestamp beyond what the platform's clock type can hold must not
/// panic; the message is still applied, only without a lag sample.
#[test]
fn an_absurd_timestamp_is_ignored_not_fatal() {
    let body = br#"{"id":"P","status":"s","versi":1}"#;
    for secs in [
        u64::MAX,
        i64::MAX as u64,
        (i64::MAX as u64) + 1,
        0,
        1_700_000_000,
    ] {
        let mut env = plain_envelope(body);
        env.timestamp = Some(secs);
        let event = decode(&env, MIB).expect("valid apart from the timestamp");
        assert_eq!(
            event.published_at,
            expected_published_at(Some(secs)),
            "{secs}"
        );
    }
}

// ---------------------------------------------------------------------------
// broker::delivery::envelope on lapin deliveries
// ---------------------------------------------------------------------------

fn delivery(props: BasicProperties, body: &[u8]) -> Delivery {
    let mut d = Delivery::mock(
        1,
        "pesanan".into(),
        "pesanan.test".into(),
        false,
        body.to_vec(),
    );
    d.properties = props;
    d
}

fn headers(entries: impl IntoIterator<Item = (String, AMQPValue)>) -> FieldTable {
    let map: BTreeMap<ShortString, AMQPValue> = entries
        .into_iter()
        .map(|(k, v)| (ShortString::from(k), v))
        .collect();
    FieldTable::from(map)
}

fn with_header(value: AMQPValue) -> BasicProperties {
    BasicProperties::default()
        .with_message_id("m-1".into())
        .with_delivery_mode(2)
        .with_headers(headers([(ENTITY_HEADER.to_owned(), value)]))
}

/// Every AMQP value type for `x-pesanan-id`: strings become text (bytes as
/// sent), everything else is named and refused as not a string.
#[test]
fn every_amqp_value_type_maps_to_the_right_entity_header() {
    let body = br#"{"id":"P","status":"s","versi":1}"#;
    let strings = [
        AMQPValue::LongString(LongString::from(&b"P"[..])),
        AMQPValue::ShortString(ShortString::from("P")),
    ];
    for value in strings {
        let d = delivery(with_header(value.clone()), body);
        let env = envelope(&d, ENTITY_HEADER);
        assert_eq!(env.entity_header, EntityHeader::Text(b"P"), "{value:?}");
        assert_eq!(decode(&env, MIB).expect("valid").entity_id, "P");
    }
    let others = [
        (AMQPValue::Boolean(true), "boolean"),
        (AMQPValue::ShortShortInt(-1), "integer"),
        (AMQPValue::ShortShortUInt(1), "integer"),
        (AMQPValue::ShortInt(-1), "integer"),
        (AMQPValue::ShortUInt(1), "integer"),
        (AMQPValue::LongInt(-1), "integer"),
        (AMQPValue::LongUInt(1), "integer"),
        (AMQPValue::LongLongInt(-1), "integer"),
        (AMQPValue::Float(1.5), "number"),
        (AMQPValue::Double(f64::NAN), "number"),
        (
            AMQPValue::DecimalValue(DecimalValue { scale: 2, value: 1 }),
            "number",
        ),
        (
            AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::LongString(
                LongString::from(&b"P"[..]),
            )])),
            "array",
        ),
        (AMQPValue::Timestamp(1_700_000_000), "timestamp"),
        (
            AMQPValue::FieldTable(headers([(
                ENTITY_HEADER.to_owned(),
                AMQPValue::LongString(LongString::from(&b"P"[..])),
            )])),
            "table",
        ),
        (AMQPValue::ByteArray(ByteArray::from(&b"P"[..])), "bytes"),
        (AMQPValue::Void, "void"),
    ];
    for (value, name) in others {
        let d = delivery(with_header(value.clone()), body);
        let env = envelope(&d, ENTITY_HEADER);
        assert_eq!(
            env.entity_header,
            EntityHeader::OtherType(name),
            "{value:?}"
        );
        assert_eq!(
            decode(&env, MIB).err(),
            Some(Rejection::EntityHeaderNotString),
            "{value:?}"
        );
    }
    // A longstr that is not UTF-8 is lifted as is and refused by decode.
    let d = delivery(
        with_header(AMQPValue::LongString(LongString::from(&b"P\xff"[..]))),
        body,
    );
    let env = envelope(&d, ENTITY_HEADER);
    assert_eq!(env.entity_header, EntityHeader::Text(b"P\xff"));
    assert_eq!(
        decode(&env, MIB).err(),
        Some(Rejection::InvalidEntityHeader)
    );
    // No headers at all, and an empty table.
    for props in [
        BasicProperties::default().with_message_id("m-1".into()),
        BasicProperties::default().with_headers(FieldTable::default()),
    ] {
        let d = delivery(props, body);
        assert_eq!(
            envelope(&d, ENTITY_HEADER).entity_header,
            EntityHeader::Missing
        );
    }
}

/// 10k other headers around it (or without it), near misses of the name,
/// and the id only inside nested tables or arrays: only an exact top-level
/// key counts.
#[test]
fn huge_and_nested_header_tables() {
    let body = br#"{"id":"P-7","status":"s","versi":1}"#;
    let noise = |n: usize| {
        (0..n).map(|i| {
            let v = match i % 4 {
                0 => AMQPValue::LongString(LongString::from(format!("v{i}").into_bytes())),
                1 => AMQPValue::LongLongInt(i as i64),
                2 => AMQPValue::FieldTable(headers([(
                    ENTITY_HEADER.to_owned(),
                    AMQPValue::LongString(LongString::from(&b"WRONG"[..])),
                )])),
                _ => AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::Void; 3])),
            };
            (format!("x-noise-{i:05}"), v)
        })
    };
    let props = |table: FieldTable| {
        BasicProperties::default()
            .with_message_id("m-1".into())
            .with_delivery_mode(2)
            .with_headers(table)
    };
    let started = Instant::now();

    let mut table: Vec<_> = noise(10_000).collect();
    table.push((
        ENTITY_HEADER.to_owned(),
        AMQPValue::LongString(LongString::from(&b"P-7"[..])),
    ));
    let d = delivery(props(headers(table)), body);
    let env = envelope(&d, ENTITY_HEADER);
    assert_eq!(env.entity_header, EntityHeader::Text(b"P-7"));
    assert!(env.headers_bytes > urutan::message::MAX_HEADERS_BYTES);
    assert_eq!(
        decode(&env, MIB).expect_err("too large"),
        Rejection::HeadersTooLarge
    );
    // The same shape within the limit decodes.
    let mut table: Vec<_> = noise(1_000).collect();
    table.push((
        ENTITY_HEADER.to_owned(),
        AMQPValue::LongString(LongString::from(&b"P-7"[..])),
    ));
    let d = delivery(props(headers(table)), body);
    assert_eq!(
        decode(&envelope(&d, ENTITY_HEADER), MIB)
            .expect("valid")
            .entity_id,
        "P-7"
    );

    let d = delivery(props(headers(noise(10_000))), body);
    assert_eq!(
        envelope(&d, ENTITY_HEADER).entity_header,
        EntityHeader::Missing
    );

    let near_misses = [
        "X-Pesanan-Id",
        "x-pesanan-id ",
        " x-pesanan-id",
        "x_pesanan_id",
        "x-pesanan",
        "x-pesanan-id\u{0}",
    ]
    .map(|k| {
        (
            k.to_owned(),
            AMQPValue::LongString(LongString::from(&b"P-7"[..])),
        )
    });
    let d = delivery(props(headers(near_misses)), body);
    assert_eq!(
        envelope(&d, ENTITY_HEADER).entity_header,
        EntityHeader::Missing
    );

    // The id only inside 64 levels of nested tables and arrays.
    let mut nested = AMQPValue::LongString(LongString::from(&b"P-7"[..]));
    for level in 0..64 {
        nested = if level % 2 == 0 {
            AMQPValue::FieldTable(headers([(ENTITY_HEADER.to_owned(), nested)]))
        } else {
            AMQPValue::FieldArray(FieldArray::from(vec![nested]))
        };
    }
    let d = delivery(props(headers([("x-wrapper".to_owned(), nested)])), body);
    assert_eq!(
        envelope(&d, ENTITY_HEADER).entity_header,
        EntityHeader::Missing
    );
    assert_eq!(envelope(&d, ENTITY_HEADER).headers_depth, 64);
    assert_eq!(
        decode(&envelope(&d, ENTITY_HEADER), MIB).err(),
        Some(Rejection::HeadersTooDeep)
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "10k-entry tables took {:?}",
        started.elapsed()
    );
}

/// Any AMQP value, nested a few levels.
fn amqp_value() -> impl Strategy<Value = AMQPValue> {
    let short = || {
        proptest::collection::vec(any::<char>(), 0..40).prop_map(|c| {
            let s: String = c.into_iter().collect();
            let mut end = s.len().min(255);
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            ShortString::from(&s[..end])
        })
    };
    let leaf = prop_oneof![
        any::<bool>().prop_map(AMQPValue::Boolean),
        any::<i8>().prop_map(AMQPValue::ShortShortInt),
        any::<u8>().prop_map(AMQPValue::ShortShortUInt),
        any::<i16>().prop_map(AMQPValue::ShortInt),
        any::<u16>().prop_map(AMQPValue::ShortUInt),
        any::<i32>().prop_map(AMQPValue::LongInt),
        any::<u32>().prop_map(AMQPValue::LongUInt),
        any::<i64>().prop_map(AMQPValue::LongLongInt),
        any::<f32>().prop_map(AMQPValue::Float),
        any::<f64>().prop_map(AMQPValue::Double),
        (any::<u8>(), any::<u32>())
            .prop_map(|(scale, value)| AMQPValue::DecimalValue(DecimalValue { scale, value })),
        short().prop_map(AMQPValue::ShortString),
        proptest::collection::vec(any::<u8>(), 0..200)
            .prop_map(|b| AMQPValue::LongString(LongString::from(b))),
        any::<u64>().prop_map(AMQPValue::Timestamp),
        proptest::collection::vec(any::<u8>(), 0..64)
            .prop_map(|b| AMQPValue::ByteArray(ByteArray::from(b))),
        Just(AMQPValue::Void),
    ];
    leaf.prop_recursive(4, 48, 8, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..8)
                .prop_map(|v| AMQPValue::FieldArray(FieldArray::from(v))),
            proptest::collection::btree_map(short(), inner, 0..8)
                .prop_map(|m| AMQPValue::FieldTable(FieldTable::from(m))),
        ]
    })
}

/// Keys a producer might use, the contract's among them.
fn header_key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(ENTITY_HEADER.to_owned()),
        Just("x-delivery-count".to_owned()),
        Just(urutan::reshard::handoff::MARKER_HEADER.to_owned()),
        Just("x-death".to_owned()),
        "[a-z-]{0,20}",
    ]
}

proptest! {
    #![proptest_config(cases(512))]

    /// Arbitrary header tables, properties and bodies: lifting and decoding
    /// never panic, and the entity header is exactly the top-level value.
    #[test]
    fn envelope_and_decode_never_panic_on_arbitrary_headers(
        table in proptest::collection::btree_map(header_key(), amqp_value(), 0..12),
        message_id in proptest::option::of(
            proptest::collection::vec(any::<char>(), 0..60).prop_map(String::from_iter)
        ),
        delivery_mode in proptest::option::of(any::<u8>()),
        timestamp in proptest::option::of(any::<u64>()),
        with_headers in any::<bool>(),
        body in hostile_body(),
    ) {
        let mut props = BasicProperties::default();
        if let Some(id) = &message_id {
            props = props.with_message_id(ShortString::from(id.as_str()));
        }
        if let Some(mode) = delivery_mode {
            props = props.with_delivery_mode(mode);
        }
        if let Some(ts) = timestamp {
            props = props.with_timestamp(ts);
        }
        if with_headers {
            props = props.with_headers(headers(table.clone()));
        }
        let d = delivery(props, &body);
        let env = envelope(&d, ENTITY_HEADER);
        let expected = match table.get(ENTITY_HEADER).filter(|_| with_headers) {
            None => EntityHeader::Missing,
            Some(AMQPValue::LongString(s)) => EntityHeader::Text(s.as_bytes()),
            Some(AMQPValue::ShortString(s)) => EntityHeader::Text(s.as_str().as_bytes()),
            Some(_) => match env.entity_header {
                EntityHeader::OtherType(name) => EntityHeader::OtherType(name),
                other => return Err(TestCaseError::fail(format!("{other:?} for a non-string"))),
            },
        };
        prop_assert_eq!(env.entity_header, expected);
        prop_assert_eq!(env.message_id, message_id.as_deref());
        prop_assert_eq!(env.delivery_mode, delivery_mode);
        prop_assert_eq!(env.timestamp, timestamp);
        prop_assert_eq!(env.body, &body[..]);
        if let Ok(event) = decode(&env, MIB) {
            assert_sound(&env, MIB, &event);
        }
        // The other header readers are total too.
        let _ = previous_deliveries(&d);
        let _ = epoch_marker(&d);
    }
}

// ---------------------------------------------------------------------------
// Encoded headers through the patched codec (patches/amq-protocol-types):
// the bytes a producer sends, parsed as lapin parses them, then lifted,
// decoded and turned into a dead-letter record, as the worker does
// ---------------------------------------------------------------------------

/// What the worker makes of one content header's encoded properties.
#[derive(Debug)]
struct Read {
    /// The `message_id` as the codec decoded it (lossily).
    message_id: Option<String>,
    headers_depth: usize,
    /// The decoded `versi`, or why the message was refused.
    outcome: Result<i64, Rejection>,
    /// Nesting depth of the dead-letter record's header JSON.
    record_depth: usize,
}

/// Parses `properties` (see `urutan_testkit::wire`) with the codec, lifts,
/// decodes and records them: all of it, drops included, on a 512 KiB stack
/// within 5 s. `None`: the codec refused the bytes (lapin then closes the
/// connection: only malformed frames, never a producer's content).
fn read_encoded(properties: Vec<u8>, body: Vec<u8>) -> Option<Read> {
    bounded(Duration::from_secs(5), move || {
        let (_, props) = lapin::protocol::basic::parse_properties(properties.as_slice()).ok()?;
        let d = delivery(props, &body);
        let env = envelope(&d, ENTITY_HEADER);
        let headers_depth = env.headers_depth;
        let outcome = decode(&env, MIB).map(|e| e.versi);
        let rejection = outcome.err().unwrap_or(Rejection::DeliveryLimit);
        let record = urutan::dead_letter::rejected(&d, ENTITY_HEADER, 0, rejection, None);
        let found = urutan::dead_letter::found_in_queue(&d, ENTITY_HEADER, MIB);
        assert_eq!(found.headers, record.headers);
        Some(Read {
            message_id: d.properties.message_id().as_ref().map(|s| s.to_string()),
            headers_depth,
            outcome,
            record_depth: depth(&record.headers),
        })
    })
}

const BODY: &[u8] = br#"{"id":"P","status":"s","versi":1}"#;

/// Encoded properties: `x-pesanan-id = P`, `extra` under the key `x-extra`
/// (an encoded value), message id `m-1`.
fn with_extra(extra: Vec<u8>) -> Vec<u8> {
    let table = wire::table(&[
        (b"x-pesanan-id".as_slice(), wire::text(b"P")),
        (b"x-extra".as_slice(), extra),
    ]);
    wire::properties(&table, b"m-1")
}

/// Whether nesting level `i` is an array (else a table).
type ArrayAt = fn(usize) -> bool;

/// Header tables nested from 0 to 25,000 levels (125 KB), arrays, tables
/// or both: parsed without deep recursion, refused beyond the contract's
/// depth (the codec keeps levels beyond 32 as bytes), and the record's
/// copy is cut at that depth.
#[test]
fn deep_encoded_headers_are_parsed_and_refused_as_too_deep() {
    let shapes: [(&str, ArrayAt); 3] = [
        ("arrays", |_| true),
        ("tables", |_| false),
        ("alternating", |i| i % 2 == 0),
    ];
    for levels in [0, 1, 3, 15, 16, 17, 31, 32, 33, 64, 1_000, 20_000, 25_000] {
        for (shape, array_at) in shapes {
            let value = wire::nested(levels, array_at, &wire::text(b"leaf"));
            let read = read_encoded(with_extra(value), BODY.to_vec())
                .unwrap_or_else(|| panic!("{levels} levels of {shape}: the codec refused it"));
            // The header table is the codec's first level of 32.
            assert_eq!(read.headers_depth, levels.min(31), "{levels} {shape}");
            let want = if levels <= MAX_HEADERS_DEPTH {
                Ok(1)
            } else {
                Err(Rejection::HeadersTooDeep)
            };
            assert_eq!(read.outcome, want, "{levels} levels of {shape}");
            assert!(
                read.record_depth <= MAX_HEADERS_DEPTH + 1,
                "{levels} {shape}: record {} deep",
                read.record_depth
            );
        }
    }
}

/// One encoded value: a leaf of any type, bytes that may be anything.
fn encoded_leaf() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..40).prop_map(|b| wire::text(&b)),
        any::<i64>().prop_map(|n| [&[b'l'][..], &n.to_be_bytes()].concat()),
        any::<bool>().prop_map(|b| vec![b't', u8::from(b)]),
        Just(vec![b'V']),
        proptest::collection::vec(any::<u8>(), 0..16).prop_map(|b| {
            let mut out = vec![b'x'];
            wire::longstr(&mut out, &b);
            out
        }),
    ]
}

/// Field tables as a hostile producer may encode them: deep, wide, and
/// valid ones with bytes flipped, cut or inserted (wrong lengths, unknown
/// type octets, keys that are not UTF-8), and plain noise.
fn encoded_table() -> impl Strategy<Value = Vec<u8>> {
    let deep = (0..300usize, any::<u64>(), encoded_leaf()).prop_map(|(levels, seed, leaf)| {
        let value = wire::nested(levels, |i| (seed >> (i % 64)) & 1 == 1, &leaf);
        wire::table(&[
            (b"x-pesanan-id".as_slice(), wire::text(b"P")),
            (b"d", value),
        ])
    });
    let wide = proptest::collection::vec(
        (
            proptest::collection::vec(any::<u8>(), 0..12),
            encoded_leaf(),
        ),
        0..400,
    )
    .prop_map(|entries| {
        let mut all: Vec<(&[u8], Vec<u8>)> = entries
            .iter()
            .map(|(k, v)| (k.as_slice(), v.clone()))
            .collect();
        all.push((b"x-pesanan-id", wire::text(b"P")));
        wire::table(&all)
    });
    let valid = prop_oneof![deep, wide];
    let mutated = (
        valid.clone(),
        proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0..3u8), 1..6),
    )
        .prop_map(|(mut bytes, edits)| {
            for (at, byte, kind) in edits {
                let i = at.index(bytes.len().max(1));
                match kind {
                    0 if i < bytes.len() => bytes[i] = byte,
                    1 => bytes.truncate(i),
                    _ => bytes.insert(i.min(bytes.len()), byte),
                }
            }
            bytes
        });
    let noise = proptest::collection::vec(any::<u8>(), 0..200).prop_map(|b| {
        let mut out = Vec::new();
        wire::longstr(&mut out, &b);
        out
    });
    prop_oneof![valid, mutated, noise]
}

proptest! {
    #![proptest_config(cases(256))]

    /// Whatever table bytes and message id bytes arrive: the codec parses
    /// or refuses them without a panic or deep recursion, and what it
    /// parses ends in a contract outcome with a record that fits `jsonb`.
    #[test]
    fn encoded_tables_of_any_shape_end_in_a_contract_outcome(
        table in encoded_table(),
        message_id in proptest::collection::vec(any::<u8>(), 0..=255),
    ) {
        let properties = wire::properties(&table, &message_id);
        if let Some(read) = read_encoded(properties, BODY.to_vec()) {
            prop_assert_ne!(read.outcome, Err(Rejection::DeliveryLimit));
            prop_assert!(read.headers_depth <= 31, "the codec bounds parsed depth");
            if read.headers_depth > MAX_HEADERS_DEPTH {
                prop_assert_eq!(read.outcome, Err(Rejection::HeadersTooDeep));
            }
            prop_assert!(read.record_depth <= MAX_HEADERS_DEPTH + 1);
            let id = read.message_id.unwrap_or_default();
            prop_assert!(id.len() <= 255);
            if read.outcome.is_ok() {
                prop_assert_eq!(id.as_bytes(), &message_id[..], "a decoded id is the bytes sent");
            }
        }
    }

    /// A short string (the message id, a header name) that is not UTF-8 is
    /// read lossily, never longer than 255 bytes, and an id read so is
    /// refused: the producer meant bytes urutan no longer has.
    #[test]
    fn lossy_short_strings_are_read_and_refused(
        message_id in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..=255),
            proptest::collection::vec(prop_oneof![Just(0xffu8), 0x80..0xc0u8], 1..=255),
        ],
        key in proptest::collection::vec(any::<u8>(), 0..=255),
    ) {
        let table = wire::table(&[
            (b"x-pesanan-id".as_slice(), wire::text(b"P")),
            (key.as_slice(), wire::text(b"v")),
        ]);
        let read = read_encoded(wire::properties(&table, &message_id), BODY.to_vec());
        let read = read.ok_or_else(|| TestCaseError::fail("the codec refused a short string"))?;
        let id = read.message_id.unwrap_or_default();
        prop_assert!(id.len() <= 255);
        let want = match std::str::from_utf8(&message_id) {
            _ if message_id.is_empty() => Err(Rejection::InvalidMessageId),
            _ if id.contains('\0') => Err(Rejection::NulCharacter),
            Ok(text) if urutan::message::is_plain_id(text) => Ok(1),
            _ => Err(Rejection::InvalidMessageId),
        };
        prop_assert_eq!(read.outcome, want);
    }
}
