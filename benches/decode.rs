//! Criterion micro-benchmarks of the in-process hot path of one delivery:
//! lifting the envelope out of a lapin delivery, then decoding and
//! validating it against the contract (`urutan::message::decode`).
//!
//! Beside them, the trace context's share with export off (the default):
//! reading a `traceparent` header and starting a span under it (the
//! apply), and reading an outbox row's value and writing the header (the
//! publish).
//!
//! `cargo bench --bench decode` measures. Under `cargo test --all-targets`
//! (which passes libtest flags such as `--skip` that criterion's parser
//! refuses) each benchmarked function runs once as a smoke test instead.

use std::hint::black_box;

use criterion::{Criterion, Throughput};
use lapin::BasicProperties;
use lapin::message::Delivery;
use lapin::types::{AMQPValue, FieldTable, LongString};
use urutan::broker::delivery::{ENTITY_HEADER, envelope};
use urutan::message::{EntityHeader, Envelope, decode};
use urutan::trace::{SpanKind, TraceParent, Traces};

/// The worker's default body limit (`MAX_BODY_BYTES`).
const LIMIT: usize = 1024 * 1024;
const ENTITY: &str = "P-0004217";
const MESSAGE_ID: &str = "pesanan-P-0004217-v3";

/// A typical event: ~300 bytes with a small `data` object.
fn typical_body() -> Vec<u8> {
    let body = serde_json::json!({
        "id": ENTITY,
        "status": "dibayar",
        "versi": 3,
        "data": {
            "pelanggan": "C-0088812",
            "kota": "jakarta",
            "mata_uang": "IDR",
            "total": 187_500,
            "items": [
                {"sku": "SKU-10021", "qty": 2, "harga": 62_500},
                {"sku": "SKU-20417", "qty": 1, "harga": 62_500}
            ],
            "catatan": "kirim sebelum jam 17.00"
        }
    });
    body.to_string().into_bytes()
}

/// An event whose `data` is a 64 KiB array of line items.
fn large_body() -> Vec<u8> {
    let mut items = Vec::new();
    let mut size = 0;
    let mut i = 0u32;
    while size < 64 * 1024 {
        let item = serde_json::json!({"sku": format!("SKU-{i:05}"), "qty": i % 7 + 1,
                                      "harga": 1_000 + i, "nama": "barang contoh"});
        size += item.to_string().len() + 1;
        items.push(item);
        i += 1;
    }
    let body = serde_json::json!({"id": ENTITY, "status": "dikirim", "versi": 9,
                                  "data": {"items": items}});
    body.to_string().into_bytes()
}

fn envelope_of(body: &[u8]) -> Envelope<'_> {
    Envelope {
        message_id: Some(MESSAGE_ID),
        entity_header: EntityHeader::Text(ENTITY.as_bytes()),
        delivery_mode: Some(2),
        timestamp: Some(1_780_000_000),
        body,
        headers_bytes: 0,
        headers_depth: 0,
    }
}

/// A delivery as the broker would hand it to a shard worker.
fn mock_delivery(body: Vec<u8>) -> Delivery {
    let mut delivery = Delivery::mock(
        42,
        "pesanan-hash".into(),
        "pesanan.jakarta.dibayar".into(),
        false,
        body,
    );
    let mut headers = FieldTable::default();
    headers.insert(
        ENTITY_HEADER.into(),
        AMQPValue::LongString(LongString::from(ENTITY.as_bytes())),
    );
    headers.insert("x-delivery-count".into(), AMQPValue::LongLongInt(0));
    delivery.properties = BasicProperties::default()
        .with_message_id(MESSAGE_ID.into())
        .with_delivery_mode(2)
        .with_timestamp(1_780_000_000)
        .with_content_type("application/json".into())
        .with_headers(headers);
    delivery
}

fn benches(c: &mut Criterion) {
    let typical = typical_body();
    let large = large_body();

    let mut group = c.benchmark_group("message::decode");
    for (name, body) in [("typical", &typical), ("data_64KiB", &large)] {
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_function(format!("{name}_{}B", body.len()), |b| {
            let env = envelope_of(body);
            b.iter(|| decode(black_box(&env), LIMIT).expect("valid"));
        });
    }
    group.finish();

    let delivery = mock_delivery(typical.clone());
    c.bench_function("delivery::envelope/mock", |b| {
        b.iter(|| envelope(black_box(&delivery), ENTITY_HEADER));
    });
    c.bench_function("delivery::envelope+decode/typical", |b| {
        b.iter(|| decode(&envelope(black_box(&delivery), ENTITY_HEADER), LIMIT).expect("valid"));
    });

    let (off, headers) = (Traces::off(), traced_headers());
    c.bench_function("trace::off/apply_span", |b| {
        b.iter(|| apply_span(&off, black_box(&headers)));
    });
    c.bench_function("trace::off/publish_header", |b| {
        b.iter(|| publish_header(&off, black_box(Some(TRACEPARENT))));
    });
}

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn traced_headers() -> FieldTable {
    let mut headers = FieldTable::default();
    headers.insert(
        ENTITY_HEADER.into(),
        AMQPValue::LongString(LongString::from(ENTITY.as_bytes())),
    );
    headers.insert(
        "traceparent".into(),
        AMQPValue::LongString(LongString::from(TRACEPARENT)),
    );
    headers
}

/// The worker's share: the header read, a span under it, its context as
/// the effect trigger gets it.
fn apply_span(traces: &Traces, headers: &FieldTable) -> String {
    let parent = TraceParent::from_headers(Some(headers));
    let span = traces.start("apply", SpanKind::Consumer, parent);
    span.traceparent().to_string()
}

/// The relay's share: the row's value checked, a span under it, the header value.
fn publish_header(traces: &Traces, row: Option<&str>) -> String {
    let parent = row.and_then(|t| TraceParent::parse(t.as_bytes()));
    let span = traces.start("publish", SpanKind::Producer, parent);
    span.traceparent().to_string()
}

/// Every benchmarked call once, checked: what `cargo test` runs.
fn smoke() {
    let typical = typical_body();
    let large = large_body();
    assert!((250..=400).contains(&typical.len()), "{}", typical.len());
    assert!(large.len() >= 64 * 1024);
    for body in [&typical, &large] {
        let event = decode(&envelope_of(body), LIMIT).expect("valid");
        assert_eq!(event.entity_id, ENTITY);
    }
    let delivery = mock_delivery(typical);
    let event = decode(&envelope(&delivery, ENTITY_HEADER), LIMIT).expect("valid");
    assert_eq!(event.message_id, MESSAGE_ID);
    let off = Traces::off();
    let child = apply_span(&off, &traced_headers());
    assert_eq!(&child[..36], &TRACEPARENT[..36], "same trace");
    assert_ne!(child, TRACEPARENT, "a span of its own");
    assert_eq!(publish_header(&off, None).len(), TRACEPARENT.len());
    println!("decode bench: smoke run ok (measure with `cargo bench --bench decode`)");
}

fn main() {
    if std::env::args().any(|a| a == "--bench") {
        let mut c = Criterion::default().configure_from_args();
        benches(&mut c);
        c.final_summary();
    } else {
        smoke();
    }
}
