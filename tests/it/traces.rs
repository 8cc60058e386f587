//! Traces (issue 34, docs/contract.md section 12) against a real OTLP/HTTP
//! receiver started here, which decodes the exported protobuf: one trace
//! per event from the outbox row to the webhook (publish -> apply ->
//! webhook, parents unbroken, the webhook's `traceparent` header naming the
//! webhook span), a direct producer's context continued, a hostile one
//! ignored (a new trace, the message still applied), a redelivery in the
//! same trace, and the `urutan` binary: exporting with
//! OTEL_EXPORTER_OTLP_ENDPOINT, a wrong value refused at start, no
//! request at all without it, and a proxy only when
//! OTEL_EXPORTER_OTLP_PROXY names one (never HTTP_PROXY's, never for a
//! NO_PROXY host), against a stand-in proxy that records who reached it.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message as _;
use tokio_util::sync::CancellationToken;
use urutan::effects::{Dispatcher, EffectsSettings};
use urutan::health::Health;
use urutan::message::Event;
use urutan::outbox::relay::{Relay, RelaySettings};
use urutan::shard::Hooks;
use urutan::trace::Traces;
use urutan_testkit::fixtures::Raw;

use crate::common::{RunningPool, TestEnv, UrutanProcess, wait_for, wait_stored};

/// A producer's context (the W3C specification's example).
const GIVEN: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const GIVEN_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const GIVEN_SPAN: &str = "00f067aa0ba902b7";
/// Another producer's (the specification's second example).
const GIVEN_RUST: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

/// The proto's span kinds.
const CLIENT: i32 = 3;
const PRODUCER: i32 = 4;
const CONSUMER: i32 = 5;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

// ------------------------------------------------------------ the receivers

/// One exported span, decoded.
#[derive(Debug, Clone)]
struct Exported {
    service: String,
    name: String,
    kind: i32,
    trace_id: String,
    span_id: String,
    /// Empty for a trace's root.
    parent: String,
    attributes: BTreeMap<String, String>,
    events: Vec<String>,
}

impl Exported {
    fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

/// An OTLP/HTTP receiver: POST /v1/traces with a protobuf
/// `ExportTraceServiceRequest`, decoded into [`Exported`] spans.
struct Collector {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<Exported>>>,
    requests: Arc<AtomicUsize>,
    stop: CancellationToken,
}

#[derive(Clone)]
struct CollectorState {
    spans: Arc<Mutex<Vec<Exported>>>,
    requests: Arc<AtomicUsize>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn text(value: Option<&Value>) -> String {
    match value {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::IntValue(n)) => n.to_string(),
        Some(Value::DoubleValue(x)) => x.to_string(),
        other => format!("{other:?}"),
    }
}

async fn receive(State(state): State<CollectorState>, body: Bytes) -> (StatusCode, Vec<u8>) {
    state.requests.fetch_add(1, Ordering::SeqCst);
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        return (StatusCode::BAD_REQUEST, Vec::new());
    };
    let mut spans = state.spans.lock().expect("spans");
    for resource_spans in request.resource_spans {
        let service = resource_spans
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|kv| kv.key == "service.name")
            .map(|kv| text(kv.value.as_ref().and_then(|v| v.value.as_ref())))
            .unwrap_or_default();
        for span in resource_spans.scope_spans.into_iter().flat_map(|s| s.spans) {
            spans.push(Exported {
                service: service.clone(),
                name: span.name,
                kind: span.kind,
                trace_id: hex(&span.trace_id),
                span_id: hex(&span.span_id),
                parent: hex(&span.parent_span_id),
                attributes: span
                    .attributes
                    .iter()
                    .map(|kv| {
                        let value = kv.value.as_ref().and_then(|v| v.value.as_ref());
                        (kv.key.clone(), text(value))
                    })
                    .collect(),
                events: span.events.into_iter().map(|e| e.name).collect(),
            });
        }
    }
    // An empty ExportTraceServiceResponse.
    (StatusCode::OK, Vec::new())
}

impl Collector {
    async fn start() -> Self {
        Self::start_on("127.0.0.1:0")
            .await
            .expect("bind the collector")
    }

    async fn start_on(addr: &str) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let state = CollectorState {
            spans: Arc::default(),
            requests: Arc::default(),
        };
        let (spans, requests) = (state.spans.clone(), state.requests.clone());
        let app = Router::new()
            .route("/v1/traces", post(receive))
            .with_state(state);
        let stop = urutan_testkit::serve(listener, app);
        Ok(Self {
            addr,
            spans,
            requests,
            stop,
        })
    }

    fn traces_url(&self) -> String {
        format!("http://{}/v1/traces", self.addr)
    }

    fn spans(&self) -> Vec<Exported> {
        self.spans.lock().expect("spans").clone()
    }

    /// The spans whose `urutan.order_id` is `order`.
    fn of_order(&self, order: &str) -> Vec<Exported> {
        let spans = self.spans();
        spans
            .into_iter()
            .filter(|s| s.attribute("urutan.order_id") == Some(order))
            .collect()
    }

    /// Flushes `traces` until every order of `expected` has the spans named.
    async fn wait_spans(&self, traces: &Traces, expected: &[(&str, &[&str])]) {
        wait_for("the exported spans", Duration::from_secs(30), || async {
            flush(traces).await;
            expected.iter().all(|(order, names)| {
                let spans = self.of_order(order);
                names
                    .iter()
                    .all(|name| spans.iter().filter(|s| s.name == *name).count() >= 1)
            })
        })
        .await;
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Exports what has ended (the SDK's flush blocks: off the runtime).
async fn flush(traces: &Traces) {
    let traces = traces.clone();
    tokio::task::spawn_blocking(move || traces.flush())
        .await
        .expect("flush");
}

async fn shutdown(traces: Traces) {
    tokio::task::spawn_blocking(move || traces.shutdown())
        .await
        .expect("shutdown");
}

/// Each webhook request's order and `traceparent` header.
type Seen = Arc<Mutex<Vec<(String, Option<String>)>>>;

/// A webhook endpoint that answers 200 and keeps each request's order and
/// `traceparent` header.
struct Webhook {
    addr: SocketAddr,
    seen: Seen,
    stop: CancellationToken,
}

async fn hook(State(seen): State<Seen>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let event: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let order = event["id"].as_str().unwrap_or("?").to_owned();
    let traceparent = headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    seen.lock().expect("seen").push((order, traceparent));
    StatusCode::OK
}

impl Webhook {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the webhook");
        let addr = listener.local_addr().expect("addr");
        let seen: Seen = Arc::default();
        let app = Router::new()
            .route("/hook", post(hook))
            .with_state(seen.clone());
        let stop = urutan_testkit::serve(listener, app);
        Self { addr, seen, stop }
    }

    fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    /// The `traceparent` header of `order`'s request (the first one).
    fn traceparent_of(&self, order: &str) -> Option<String> {
        let seen = self.seen.lock().expect("seen");
        seen.iter()
            .find(|(o, _)| o == order)
            .and_then(|(_, t)| t.clone())
    }

    /// Every request's order and `traceparent` header, in arrival order.
    fn traceparents(&self) -> Vec<(String, Option<String>)> {
        self.seen.lock().expect("seen").clone()
    }

    fn orders(&self) -> HashSet<String> {
        let seen = self.seen.lock().expect("seen");
        seen.iter().map(|(o, _)| o.clone()).collect()
    }
}

impl Drop for Webhook {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The effects dispatcher, traced, sending every version's effect to
/// `webhook`.
struct Dispatching {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Dispatching {
    async fn start(db: &sqlx::PgPool, webhook: &Webhook, traces: &Traces) -> Self {
        let effects = EffectsSettings {
            effects: Some(format!("*={}", webhook.url())),
            effects_secret: Some(SECRET.into()),
            effects_poll: Duration::from_millis(50),
            ..EffectsSettings::default()
        };
        let config = effects.config().expect("effects config");
        let dispatcher = Dispatcher::new(db.clone(), config, effects, None)
            .await
            .expect("dispatcher")
            .with_traces(traces.clone());
        let stop = CancellationToken::new();
        let until = stop.clone();
        let task = tokio::spawn(async move {
            let _ = dispatcher.run(until).await;
        });
        Self { stop, task }
    }

    /// Stops it, waiting at most 30 s.
    async fn stop(self) {
        self.stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(30), self.task).await;
    }
}

// ---------------------------------------------------------------- helpers

/// `order`'s version `versi` (status `dibayar`) as a direct producer
/// publishes it, message id `<order>-v<versi>`, with `traceparent` (any
/// AMQP value) as its header when given.
fn event(order: &str, versi: i64, traceparent: Option<AMQPValue>) -> Raw<'static> {
    let mut headers = FieldTable::default();
    headers.insert(
        "x-pesanan-id".into(),
        AMQPValue::LongString(LongString::from(order)),
    );
    if let Some(value) = traceparent {
        headers.insert("traceparent".into(), value);
    }
    let body = serde_json::json!({"id": order, "status": "dibayar", "versi": versi});
    Raw {
        exchange: "pesanan",
        routing_key: "pesanan.dibayar",
        props: BasicProperties::default()
            .with_message_id(format!("{order}-v{versi}").into())
            .with_delivery_mode(2)
            .with_headers(headers),
        body: body.to_string().into_bytes(),
    }
}

/// The one span named `name` among `spans`.
fn one<'a>(spans: &'a [Exported], name: &str) -> &'a Exported {
    let named: Vec<&Exported> = spans.iter().filter(|s| s.name == name).collect();
    assert_eq!(named.len(), 1, "one {name} span: {spans:#?}");
    named[0]
}

/// Asserts `order`'s publish -> apply -> webhook chain in one trace, with
/// the webhook request's header naming the webhook span; returns the
/// publish span.
fn assert_chain(collector: &Collector, webhook: &Webhook, order: &str) -> Exported {
    let spans = collector.of_order(order);
    let (publish, apply, request) = (
        one(&spans, "publish"),
        one(&spans, "apply"),
        one(&spans, "webhook"),
    );
    let trace = &publish.trace_id;
    let traces: HashSet<&str> = spans.iter().map(|s| s.trace_id.as_str()).collect();
    assert_eq!(
        traces,
        HashSet::from([trace.as_str()]),
        "one trace: {spans:#?}"
    );
    assert_eq!(
        apply.parent, publish.span_id,
        "apply under publish: {spans:#?}"
    );
    assert_eq!(
        request.parent, apply.span_id,
        "webhook under apply: {spans:#?}"
    );
    assert_eq!(
        (publish.kind, apply.kind, request.kind),
        (PRODUCER, CONSUMER, CLIENT)
    );
    assert_eq!(
        webhook.traceparent_of(order),
        Some(format!("00-{trace}-{}-01", request.span_id)),
        "the webhook request carries the webhook span"
    );
    for span in &spans {
        assert_eq!(span.service, "urutan", "{span:#?}");
    }
    assert_eq!(apply.attribute("urutan.versi"), Some("1"));
    assert_eq!(apply.attribute("urutan.outcome"), Some("applied"));
    assert!(apply.attribute("urutan.shard").is_some(), "{apply:#?}");
    assert!(
        apply.attribute("urutan.handler.duration_ms").is_some(),
        "{apply:#?}"
    );
    assert!(
        apply.attribute("messaging.message.id").is_some(),
        "{apply:#?}"
    );
    assert_eq!(request.attribute("http.response.status_code"), Some("200"));
    assert_eq!(request.attribute("urutan.outcome"), Some("sent"));
    publish.clone()
}

/// A producer transaction: `urutan.traceparent` set to `traceparent` (if
/// any), then `urutan_enqueue(order, 'dibayar', 1)`.
async fn enqueue(db: &sqlx::PgPool, order: &str, traceparent: Option<&str>) {
    let mut tx = db.begin().await.expect("begin");
    if let Some(traceparent) = traceparent {
        sqlx::query("SELECT set_config('urutan.traceparent', $1, true)")
            .bind(traceparent)
            .execute(&mut *tx)
            .await
            .expect("set urutan.traceparent");
    }
    sqlx::query("SELECT urutan_enqueue($1, 'dibayar', 1)")
        .bind(order)
        .execute(&mut *tx)
        .await
        .expect("urutan_enqueue");
    tx.commit().await.expect("commit");
}

/// A producer that writes its outbox row itself, `traceparent` as given.
async fn insert_row(db: &sqlx::PgPool, order: &str, traceparent: &str) {
    sqlx::query(
        "INSERT INTO outbox (agregat_tipe, agregat_id, routing_key, payload, traceparent)
         VALUES ('pesanan', $1, 'pesanan.dibayar',
                 jsonb_build_object('id', $1::text, 'status', 'dibayar', 'versi', 1), $2)",
    )
    .bind(order)
    .bind(traceparent)
    .execute(db)
    .await
    .expect("insert an outbox row");
}

// ------------------------------------------------------------------ tests

/// Outbox rows (with a producer's context, without one, with hostile ones)
/// through the relay, the pool and `urutan effects`' dispatcher: one trace
/// per event, parents unbroken, the webhook request naming its span.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_per_event_from_the_outbox_to_the_webhook() {
    let env = TestEnv::new("traces_outbox").await;
    let collector = Collector::start().await;
    let webhook = Webhook::start().await;
    let traces = Traces::otlp_http(&collector.traces_url()).expect("exporter");
    let mut settings = env.settings(2);
    settings.traces = traces.clone();
    let pool = RunningPool::ready(settings.clone()).await;
    let db = env.db().await;

    let dispatching = Dispatching::start(&db, &webhook, &traces).await;

    enqueue(&db, "T-given", Some(GIVEN)).await;
    enqueue(&db, "T-new", None).await;
    // The Rust producer API.
    let mut tx = db.begin().await.expect("begin");
    urutan::outbox::enqueue(
        &mut tx,
        &urutan::outbox::NewEvent::new("T-rust", "dibayar", 1, "pesanan.dibayar")
            .with_traceparent(GIVEN_RUST),
    )
    .await
    .expect("enqueue");
    tx.commit().await.expect("commit");
    // urutan_enqueue keeps only a valid setting; a row written directly
    // keeps what the producer wrote, and the relay checks it.
    enqueue(&db, "T-bad-setting", Some("not a traceparent")).await;
    let hostile = [
        ("T-garbage", "garbage".to_owned()),
        ("T-upper", GIVEN.to_uppercase()),
        ("T-long", format!("{GIVEN}-{}", "0".repeat(100_000))),
        ("T-zero", format!("00-{}-{GIVEN_SPAN}-01", "0".repeat(32))),
    ];
    for (order, value) in &hostile {
        insert_row(&db, order, value).await;
    }
    let stored: Option<String> =
        sqlx::query_scalar("SELECT traceparent FROM outbox WHERE agregat_id = 'T-bad-setting'")
            .fetch_one(&db)
            .await
            .expect("read the row");
    assert_eq!(stored, None, "urutan_enqueue keeps only a valid setting");

    let relay_stop = CancellationToken::new();
    let relay = tokio::spawn(
        Relay {
            settings: settings.clone(),
            relay: RelaySettings::default(),
            after_publish: None,
            health: Arc::new(Health::default()),
        }
        .run(relay_stop.clone()),
    );

    let mut orders = vec!["T-given", "T-rust", "T-new", "T-bad-setting"];
    orders.extend(hostile.iter().map(|(o, _)| *o));
    wait_for(
        "a webhook request per order",
        Duration::from_secs(60),
        || {
            let seen = webhook.orders();
            let all = orders.iter().all(|o| seen.contains(*o));
            async move { all }
        },
    )
    .await;
    let chain: &[&str] = &["publish", "apply", "webhook"];
    let expected: Vec<(&str, &[&str])> = orders.iter().map(|o| (*o, chain)).collect();
    collector.wait_spans(&traces, &expected).await;

    // The producer's context is continued.
    let given = assert_chain(&collector, &webhook, "T-given");
    assert_eq!(given.trace_id, GIVEN_TRACE);
    assert_eq!(
        given.parent, GIVEN_SPAN,
        "publish under the producer's span"
    );
    assert_eq!(given.attribute("urutan.traceparent.invalid"), None);
    let rust = assert_chain(&collector, &webhook, "T-rust");
    assert_eq!(
        format!("00-{}-{}-01", rust.trace_id, rust.parent),
        GIVEN_RUST
    );
    // Without one, or with a hostile one: a new trace, and the event
    // still goes all the way.
    let mut new_traces = HashSet::new();
    for order in orders
        .iter()
        .filter(|o| !["T-given", "T-rust"].contains(*o))
    {
        let publish = assert_chain(&collector, &webhook, order);
        assert_eq!(publish.parent, "", "{order}: a new trace");
        assert_ne!(publish.trace_id, GIVEN_TRACE, "{order}");
        assert!(
            new_traces.insert(publish.trace_id.clone()),
            "{order}: a trace of its own"
        );
        let flagged = publish.attribute("urutan.traceparent.invalid") == Some("true");
        assert_eq!(flagged, hostile.iter().any(|(o, _)| o == order), "{order}");
    }

    relay_stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), relay).await;
    dispatching.stop().await;
    pool.stop().await;
    shutdown(traces).await;
}

/// A producer publishing to the broker itself: its `traceparent` header is
/// continued; a hostile one (another AMQP type, a wrong length, not hex, a
/// huge value) is ignored, a new trace is started and the message is still
/// applied. A delivery that fails and comes back continues the same trace
/// under the same parent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_producers_are_continued_and_hostile_headers_ignored() {
    let env = TestEnv::new("traces_direct").await;
    let collector = Collector::start().await;
    let traces = Traces::otlp_http(&collector.traces_url()).expect("exporter");
    let mut settings = env.settings(2);
    settings.traces = traces.clone();
    // The first delivery of D-retried fails (a crash in the handler): the
    // broker redelivers it.
    let failed_once = Arc::new(AtomicBool::new(false));
    let fail = failed_once.clone();
    let hooks = Hooks {
        before_apply: Some(Arc::new(move |event: &Event| {
            if event.entity_id == "D-retried" && !fail.swap(true, Ordering::SeqCst) {
                panic!("a crash before the apply");
            }
        })),
        ..Hooks::default()
    };
    let pool = RunningPool::ready_with(settings, hooks).await;
    let db = env.db().await;

    let given = || AMQPValue::LongString(LongString::from(GIVEN));
    let cases: Vec<(&str, Option<AMQPValue>, bool)> = vec![
        ("D-given", Some(given()), true),
        ("D-retried", Some(given()), true),
        ("D-none", None, false),
        ("D-integer", Some(AMQPValue::LongLongInt(42)), false),
        (
            "D-table",
            Some(AMQPValue::FieldTable(FieldTable::default())),
            false,
        ),
        (
            "D-length",
            Some(AMQPValue::LongString(format!("{GIVEN}0").into())),
            false,
        ),
        (
            "D-hex",
            Some(AMQPValue::LongString(GIVEN.replace('4', "g").into())),
            false,
        ),
        (
            "D-version",
            Some(AMQPValue::LongString(GIVEN.replacen("00", "ff", 1).into())),
            false,
        ),
        (
            "D-huge",
            Some(AMQPValue::LongString(LongString::from(vec![b'0'; 60_000]))),
            false,
        ),
    ];
    let publisher = env.publisher().await;
    let raw = cases
        .iter()
        .map(|(order, traceparent, _)| event(order, 1, traceparent.clone()))
        .collect();
    publisher.send_raw(raw).await;
    for (order, _, _) in &cases {
        wait_stored(&db, order, 1).await;
    }
    let expected: Vec<(&str, &[&str])> = cases
        .iter()
        .map(|(o, _, _)| (*o, &["apply"] as &[&str]))
        .collect();
    collector.wait_spans(&traces, &expected).await;
    // The retried one: both deliveries' spans.
    wait_for(
        "both deliveries of D-retried",
        Duration::from_secs(30),
        || async {
            flush(&traces).await;
            collector.of_order("D-retried").len() >= 2
        },
    )
    .await;

    let mut new_traces = HashSet::new();
    for (order, _, continued) in &cases {
        let spans = collector.of_order(order);
        for apply in &spans {
            assert_eq!(apply.name, "apply");
            assert_eq!(apply.kind, CONSUMER);
            assert_eq!(apply.attribute("urutan.order_id"), Some(*order));
            if *continued {
                assert_eq!(apply.trace_id, GIVEN_TRACE, "{order}: {apply:#?}");
                assert_eq!(apply.parent, GIVEN_SPAN, "{order}: {apply:#?}");
            } else {
                assert_eq!(apply.parent, "", "{order}: a new trace: {apply:#?}");
                assert!(new_traces.insert(apply.trace_id.clone()), "{order}");
            }
        }
    }
    let retried = collector.of_order("D-retried");
    let outcomes: HashSet<&str> = retried
        .iter()
        .filter_map(|s| s.attribute("urutan.outcome"))
        .collect();
    assert_eq!(
        outcomes,
        HashSet::from(["requeued", "applied"]),
        "{retried:#?}"
    );
    let redelivered = retried
        .iter()
        .find(|s| s.attribute("urutan.outcome") == Some("applied"))
        .expect("the applied delivery");
    assert_eq!(redelivered.attribute("urutan.redelivered"), Some("true"));
    let requeued = retried
        .iter()
        .find(|s| s.attribute("urutan.outcome") == Some("requeued"))
        .expect("the failed delivery");
    assert_eq!(requeued.events, ["requeued"], "{requeued:#?}");

    pool.stop().await;
    shutdown(traces).await;
}

/// The `urutan` binary reads the OTEL_* variables: with
/// OTEL_EXPORTER_OTLP_ENDPOINT its spans reach the collector (service
/// `urutan`); a value that is not a URL stops it at start with one line
/// naming the variable (exit 2); without it nothing is ever sent, not even
/// to the SDK's default endpoint (127.0.0.1:4318, listened on here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_exports_only_when_told_where() {
    let env = TestEnv::new("traces_binary").await;
    let db = env.db().await;
    let publisher = env.publisher().await;
    let publish = |order: &'static str| event(order, 1, None);
    let base: Vec<(String, String)> = env
        .process_env(2)
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .chain([("OTEL_BSP_SCHEDULE_DELAY".to_owned(), "100".to_owned())])
        .collect();

    // A wrong value: one line, exit 2, the value not echoed.
    let mut wrong = base.clone();
    wrong.push((
        "OTEL_EXPORTER_OTLP_ENDPOINT".into(),
        "collector:4318?token=hunter2".into(),
    ));
    let mut refused = UrutanProcess::start("run", &wrong);
    let status = refused.wait_exit(Duration::from_secs(30)).await;
    let log = refused.log();
    assert_eq!(status.code(), Some(2), "{log}");
    let errors: Vec<&str> = log.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(errors.len(), 1, "one line: {log}");
    assert!(errors[0].contains("OTEL_EXPORTER_OTLP_ENDPOINT"), "{log}");
    assert!(!log.contains("hunter2"), "{log}");

    // Set: exported.
    let collector = Collector::start().await;
    let mut on = base.clone();
    on.push((
        "OTEL_EXPORTER_OTLP_ENDPOINT".into(),
        format!("http://{}", collector.addr),
    ));
    let mut run = UrutanProcess::start("run", &on);
    run.wait_ready().await;
    publisher.send_raw(vec![publish("B-on")]).await;
    wait_stored(&db, "B-on", 1).await;
    wait_for(
        "the binary's apply span",
        Duration::from_secs(30),
        || async { !collector.of_order("B-on").is_empty() },
    )
    .await;
    let apply = collector.of_order("B-on");
    assert_eq!(apply[0].name, "apply");
    assert_eq!(apply[0].service, "urutan");
    run.stop().await;

    // Unset (empty counts as unset): no exporter, not even to the default.
    let Ok(default) = Collector::start_on("127.0.0.1:4318").await else {
        panic!("127.0.0.1:4318 (OTLP/HTTP's default port) is taken: this test listens there");
    };
    let mut off = base.clone();
    off.push(("OTEL_EXPORTER_OTLP_ENDPOINT".into(), String::new()));
    off.push(("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT".into(), String::new()));
    let mut run = UrutanProcess::start("run", &off);
    run.wait_ready().await;
    publisher.send_raw(vec![publish("B-off")]).await;
    wait_stored(&db, "B-off", 1).await;
    // Ten times the batch delay it was given, then a clean stop (which
    // would export what is left).
    tokio::time::sleep(Duration::from_secs(1)).await;
    run.stop().await;
    assert_eq!(
        default.requests.load(Ordering::SeqCst),
        0,
        "no request at all"
    );
    assert_eq!(collector.of_order("B-off").len(), 0);
}

/// A stand-in for a forward proxy: keeps the request line of each request
/// it gets (`POST http://collector/v1/traces HTTP/1.1` for a proxied
/// export) and answers it 200 with nothing, so what it got never reaches
/// the collector.
struct StandInProxy {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl StandInProxy {
    async fn start() -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the stand-in proxy");
        let addr = listener.local_addr().expect("its address");
        let requests: Arc<Mutex<Vec<String>>> = Arc::default();
        let seen = requests.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") && head.len() < 64 * 1024 {
                        match tokio::time::timeout(Duration::from_secs(5), stream.read(&mut byte))
                            .await
                        {
                            Ok(Ok(1)) => head.push(byte[0]),
                            _ => break,
                        }
                    }
                    let text = String::from_utf8_lossy(&head);
                    let line = text.lines().next().unwrap_or_default().to_owned();
                    seen.lock().expect("requests").push(line);
                    let _ = stream
                        .write_all(
                            b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                        )
                        .await;
                });
            }
        });
        Self {
            addr,
            requests,
            task,
        }
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().expect("requests").clone()
    }
}

impl Drop for StandInProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Where the binary's spans go (issue 43): the standard proxy variables
/// (`HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY`, set for other programs) are
/// ignored: the spans reach the collector directly and the proxy is never
/// contacted. `OTEL_EXPORTER_OTLP_PROXY` sends them through the proxy it
/// names, except to a host `NO_PROXY` lists. The proxy's password is never
/// logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_go_through_a_proxy_only_when_told_and_never_to_no_proxy_hosts() {
    let env = TestEnv::new("traces_proxy").await;
    let db = env.db().await;
    let publisher = env.publisher().await;
    let collector = Collector::start().await;
    let proxy = StandInProxy::start().await;
    let proxy_url = format!("http://u:pw-proxy-93@{}", proxy.addr);
    let proxy_variables = [
        "HTTP_PROXY",
        "http_proxy",
        "HTTPS_PROXY",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
        "NO_PROXY",
        "no_proxy",
        "OTEL_EXPORTER_OTLP_PROXY",
    ];
    let base: Vec<(String, String)> = env
        .process_env(1)
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .chain([
            ("OTEL_BSP_SCHEDULE_DELAY".to_owned(), "100".to_owned()),
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(),
                format!("http://{}", collector.addr),
            ),
        ])
        .chain(proxy_variables.map(|k| (k.to_owned(), String::new())))
        .collect();
    // Runs the binary with `vars` over `base` and applies `order`'s event.
    let run = |vars: Vec<(&str, String)>, order: &'static str| {
        let mut all = base.clone();
        all.extend(vars.into_iter().map(|(k, v)| (k.to_owned(), v)));
        let (publisher, db) = (&publisher, &db);
        async move {
            let mut run = UrutanProcess::start("run", &all);
            run.wait_ready().await;
            publisher.send_raw(vec![event(order, 1, None)]).await;
            wait_stored(db, order, 1).await;
            run
        }
    };

    // The standard variables: ignored.
    let standard: Vec<(&str, String)> = ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy"]
        .into_iter()
        .map(|k| (k, proxy_url.clone()))
        .collect();
    let pool = run(standard, "P-env").await;
    wait_for("the spans, directly", Duration::from_secs(30), || async {
        !collector.of_order("P-env").is_empty()
    })
    .await;
    let log = pool.stop().await;
    assert_eq!(
        proxy.requests(),
        Vec::<String>::new(),
        "HTTP_PROXY was used"
    );
    assert!(!log.contains("pw-proxy-93"), "{log}");

    // OTEL_EXPORTER_OTLP_PROXY: through it.
    let pool = run(
        vec![("OTEL_EXPORTER_OTLP_PROXY", proxy_url.clone())],
        "P-told",
    )
    .await;
    let expected = format!("POST http://{}/v1/traces HTTP/1.1", collector.addr);
    wait_for(
        "an export through the proxy",
        Duration::from_secs(30),
        || async { proxy.requests().contains(&expected) },
    )
    .await;
    let log = pool.stop().await;
    assert!(!log.contains("pw-proxy-93"), "{log}");
    assert!(
        collector.of_order("P-told").is_empty(),
        "the proxy kept them"
    );
    let through = proxy.requests().len();

    // ... unless NO_PROXY lists the collector's host.
    let bypass = vec![
        ("OTEL_EXPORTER_OTLP_PROXY", proxy_url.clone()),
        ("NO_PROXY", "localhost, 127.0.0.1".to_owned()),
    ];
    let pool = run(bypass, "P-bypass").await;
    wait_for(
        "the spans, past the proxy",
        Duration::from_secs(30),
        || async { !collector.of_order("P-bypass").is_empty() },
    )
    .await;
    pool.stop().await;
    assert_eq!(proxy.requests().len(), through, "NO_PROXY was not honoured");
}

/// A version applied later from PostgreSQL, not from its delivery, keeps
/// its event's trace to the webhook: one parked by `GAP_POLICY=wait` until
/// the version before it arrives, and one set aside after a transient
/// failure of the handler (SQLSTATE URTRY) and tried again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_applied_later_from_postgresql_keep_their_trace_to_the_webhook() {
    // One trace per event, each its own.
    const V1: &str = "00-11111111111111111111111111111111-1111111111111111-01";
    const V2: &str = "00-22222222222222222222222222222222-2222222222222222-01";
    const V3: &str = "00-33333333333333333333333333333333-3333333333333333-01";
    const RETRIED: &str = "00-44444444444444444444444444444444-4444444444444444-01";
    let env = TestEnv::new("traces_later").await;
    let collector = Collector::start().await;
    let webhook = Webhook::start().await;
    let traces = Traces::otlp_http(&collector.traces_url()).expect("exporter");
    let db = env.db().await;
    // The handler fails S-1 once, transiently: set aside, tried again.
    sqlx::raw_sql(
        "CREATE SEQUENCE coba;
         CREATE FUNCTION tangani(event jsonb) RETURNS void LANGUAGE plpgsql AS $$
         BEGIN
             IF event->>'id' = 'S-1' AND nextval('coba') = 1 THEN
                 RAISE EXCEPTION 'not yet' USING ERRCODE = 'URTRY';
             END IF;
         END $$;",
    )
    .execute(&db)
    .await
    .expect("the handler");
    let mut settings = env.settings(1);
    settings.traces = traces.clone();
    settings.gap_policy = urutan::config::GapPolicy::Wait;
    settings.gap_timeout = Duration::from_secs(120);
    settings.handler_function = Some("tangani".into());
    let pool = RunningPool::ready(settings).await;

    let dispatching = Dispatching::start(&db, &webhook, &traces).await;

    let raw = |order: &str, versi: i64, traceparent: &str| {
        event(
            order,
            versi,
            Some(AMQPValue::LongString(traceparent.into())),
        )
    };
    let publisher = env.publisher().await;
    // G-1 v3 comes before v2: parked until v2 is applied.
    publisher
        .send_raw(vec![
            raw("G-1", 1, V1),
            raw("G-1", 3, V3),
            raw("S-1", 1, RETRIED),
        ])
        .await;
    wait_stored(&db, "G-1", 1).await;
    wait_for("G-1 v3 parked", Duration::from_secs(30), || {
        let db = db.clone();
        async move {
            urutan_testkit::fixtures::count(
                &db,
                "SELECT count(*) FROM urutan_parkir WHERE message_id = 'G-1-v3'",
            )
            .await
                == 1
        }
    })
    .await;
    publisher.send_raw(vec![raw("G-1", 2, V2)]).await;
    wait_stored(&db, "G-1", 3).await;
    wait_stored(&db, "S-1", 1).await;

    let trace_of = |traceparent: &str| traceparent[3..35].to_owned();
    wait_for(
        "a webhook request per version",
        Duration::from_secs(60),
        || {
            let seen = webhook.traceparents();
            async move { seen.len() >= 4 }
        },
    )
    .await;
    let seen: HashSet<(String, String)> = webhook
        .traceparents()
        .into_iter()
        .map(|(order, traceparent)| (order, trace_of(&traceparent.expect("a traceparent"))))
        .collect();
    let want: HashSet<(String, String)> = [("G-1", V1), ("G-1", V2), ("G-1", V3), ("S-1", RETRIED)]
        .into_iter()
        .map(|(order, traceparent)| (order.to_owned(), trace_of(traceparent)))
        .collect();
    assert_eq!(seen, want, "each webhook request in its event's trace");
    // They did go through PostgreSQL: parked, and set aside.
    wait_for("the apply spans", Duration::from_secs(30), || async {
        flush(&traces).await;
        let with = |order: &str, event: &str| {
            collector
                .of_order(order)
                .iter()
                .any(|s| s.events.iter().any(|e| e == event))
        };
        with("G-1", "parked") && with("S-1", "set_aside")
    })
    .await;

    dispatching.stop().await;
    pool.stop().await;
    shutdown(traces).await;
}
