//! Downstream effects (issue 18) against a real HTTP server started here: a
//! payment-like API that verifies the Standard Webhooks signature, keeps an
//! idempotency-key store (the same key gets the first answer back and never
//! charges twice), and can be told to fail, hang past the timeout, answer
//! slowly, answer 4xx, or go down. Events go through the real broker and
//! worker pool; the dispatcher is the real `urutan effects` binary.
//!
//! The invariant every test checks: each applied version that matches a
//! route is charged exactly once at its endpoint, in version order per order,
//! and nothing is lost.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::os::unix::process::ExitStatusExt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::routing::post;
use lapin::types::{AMQPValue, LongString};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use urutan::effects::Secret;

use crate::common::{
    Msg, PgRoles, RunningPool, TestEnv, UrutanProcess, metric_sum, urutan as run_urutan, wait_for,
};

/// The Standard Webhooks specification's example secret.
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

// ---------------------------------------------------------------- the server

/// How the server answers an order's requests.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Behaviour {
    /// Charge once per key, answer 200.
    Pay,
    /// 503, no charge.
    Fail,
    /// 422 for the order's version 1 (stored for the key, like a payment
    /// API stores errors); later versions are paid.
    Reject,
    /// Charge, then answer only after this long (past the client's timeout).
    Hang(Duration),
    /// Charge, then answer after this long (within the timeout).
    Slow(Duration),
}

#[derive(Debug, Clone)]
struct Charge {
    path: String,
    key: String,
    order: String,
    versi: i64,
}

/// Everything the server saw.
#[derive(Default)]
struct Book {
    /// (path, idempotency key) -> the first answer.
    answers: HashMap<(String, String), (u16, String)>,
    charges: Vec<Charge>,
    /// Every request with a valid signature: (path, order, versi, key).
    requests: Vec<(String, String, i64, String)>,
    in_flight: HashMap<String, u32>,
    /// Orders that had two requests in flight at once.
    overlapped: HashSet<String>,
    bad_signatures: u32,
    /// Bodies whose data did not belong to their version.
    wrong_data: u32,
    behaviour: HashMap<String, Behaviour>,
}

impl Book {
    fn behaviour(&self, order: &str) -> Behaviour {
        self.behaviour.get(order).copied().unwrap_or(Behaviour::Pay)
    }
}

#[derive(Clone)]
struct ServerState {
    book: Arc<Mutex<Book>>,
    secret: Secret,
}

/// Decrements the order's in-flight count however the handler ends.
struct InFlight(Arc<Mutex<Book>>, String);

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut book = self.0.lock().expect("book");
        if let Some(n) = book.in_flight.get_mut(&self.1) {
            *n -= 1;
        }
    }
}

async fn webhook(
    State(state): State<ServerState>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, String) {
    let received = urutan::effects::sign::Received::from_headers(&headers);
    let fresh = (chrono::Utc::now().timestamp() - received.timestamp).abs() < 300;
    let signed = received.signed_by(&state.secret, &body);
    let id = received.id;
    if !signed || !fresh || received.idempotency_key != id || id.is_empty() {
        state.book.lock().expect("book").bad_signatures += 1;
        return (StatusCode::UNAUTHORIZED, "bad signature".into());
    }
    let event: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let order = event["id"].as_str().unwrap_or("?").to_owned();
    let versi = event["versi"].as_i64().unwrap_or(0);
    let path = uri.path().to_owned();
    let behaviour = {
        let mut book = state.book.lock().expect("book");
        if event["data"]["amount"].as_i64() != Some(versi * 100)
            || event["status"].as_str() != Some(status_of(versi))
        {
            book.wrong_data += 1;
        }
        book.requests
            .push((path.clone(), order.clone(), versi, id.clone()));
        let n = book.in_flight.entry(order.clone()).or_default();
        *n += 1;
        if *n > 1 {
            book.overlapped.insert(order.clone());
        }
        book.behaviour(&order)
    };
    let _in_flight = InFlight(state.book.clone(), order.clone());
    if behaviour == Behaviour::Fail {
        return (StatusCode::SERVICE_UNAVAILABLE, "try later".into());
    }
    let (code, answer, fresh) = {
        let mut book = state.book.lock().expect("book");
        let key = (path.clone(), id.clone());
        if let Some(first) = book.answers.get(&key) {
            let (code, answer) = first.clone(); // a replay: the first answer, no new charge
            (code, answer, false)
        } else if behaviour == Behaviour::Reject && versi == 1 {
            let first = (422, format!("card declined for {order}"));
            book.answers.insert(key, first.clone());
            (first.0, first.1, true)
        } else {
            book.charges.push(Charge {
                path,
                key: id.clone(),
                order,
                versi,
            });
            let first = (200, format!("receipt {}", book.charges.len()));
            book.answers.insert(key, first.clone());
            (first.0, first.1, true)
        }
    };
    match behaviour {
        // A hang happens once per key, after the charge: the retry finds it.
        Behaviour::Hang(d) if fresh => tokio::time::sleep(d).await,
        Behaviour::Slow(d) => tokio::time::sleep(d).await,
        _ => {}
    }
    (StatusCode::from_u16(code).expect("status"), answer)
}

/// The payment-like API on a local port.
struct PayServer {
    addr: SocketAddr,
    state: ServerState,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl PayServer {
    async fn start() -> Self {
        Self::start_verifying(SECRET).await
    }

    /// A server that accepts only signatures made with `secret`.
    async fn start_verifying(secret: &str) -> Self {
        let state = ServerState {
            book: Arc::default(),
            secret: Secret::parse(secret).expect("secret"),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let mut server = Self {
            addr,
            state,
            stop: CancellationToken::new(),
            task: None,
        };
        server.serve(listener);
        server
    }

    fn serve(&mut self, listener: tokio::net::TcpListener) {
        let app = Router::new()
            .route("/charge", post(webhook))
            .route("/index", post(webhook))
            // A path with a token in it (never printed).
            .route("/charge/tok-S3CRET", post(webhook))
            .with_state(self.state.clone());
        let stop = self.stop.clone();
        self.task = Some(tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(stop.cancelled_owned())
                .await;
        }));
    }

    /// Closes the port (connections refused) until [`Self::restart`].
    async fn stop(&mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
        }
    }

    /// Listens again on the same port, with the same book.
    async fn restart(&mut self) {
        self.stop = CancellationToken::new();
        let listener = tokio::net::TcpListener::bind(self.addr)
            .await
            .expect("rebind the same port");
        self.serve(listener);
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn set(&self, order: &str, behaviour: Behaviour) {
        let mut book = self.state.book.lock().expect("book");
        book.behaviour.insert(order.to_owned(), behaviour);
    }

    fn book<T>(&self, read: impl FnOnce(&Book) -> T) -> T {
        read(&self.state.book.lock().expect("book"))
    }

    /// Requests for `order` (any path, replays included), by version.
    fn requests_for(&self, order: &str) -> Vec<i64> {
        self.book(|b| {
            b.requests
                .iter()
                .filter(|r| r.1 == order)
                .map(|r| r.2)
                .collect()
        })
    }

    /// Every expected (order, versi) at `path` charged exactly once, in
    /// version order per order; nothing else charged; every signature good;
    /// every body carried its own version's data.
    fn assert_exactly_once_in_order(&self, path: &str, expected: &BTreeMap<String, Vec<i64>>) {
        self.book(|b| {
            let mut charged: BTreeMap<String, Vec<i64>> = BTreeMap::new();
            for c in b.charges.iter().filter(|c| c.path == path) {
                charged.entry(c.order.clone()).or_default().push(c.versi);
            }
            for (order, versions) in expected {
                assert_eq!(
                    charged.get(order),
                    Some(versions),
                    "order {order}: charges at {path} (exactly once each, in version order)"
                );
            }
            assert_eq!(charged.len(), expected.len(), "no other order charged");
            let keys: HashSet<(&str, &str)> = b
                .charges
                .iter()
                .map(|c| (c.path.as_str(), c.key.as_str()))
                .collect();
            assert_eq!(keys.len(), b.charges.len(), "one charge per key and path");
            let mut last: HashMap<(&str, &str), i64> = HashMap::new();
            for (p, order, versi, _) in &b.requests {
                let prev = last.entry((p, order)).or_insert(0);
                assert!(
                    *versi >= *prev,
                    "order {order}: version {versi} requested after {prev} at {p}"
                );
                *prev = *versi;
            }
            assert_eq!(b.bad_signatures, 0, "every signature verified");
            assert_eq!(b.wrong_data, 0, "every body carried its version's data");
        });
    }
}

// ------------------------------------------------------------ the dispatcher

/// Settings that keep the tests short: 1 s timeout (lease 7 s), fast retries.
const FAST: &[(&str, &str)] = &[
    ("EFFECTS_TIMEOUT", "1s"),
    ("EFFECTS_BACKOFF_MIN", "100ms"),
    ("EFFECTS_BACKOFF_MAX", "1s"),
    ("EFFECTS_MAX_ATTEMPTS", "1000"),
    ("EFFECTS_POLL", "50ms"),
];

/// The behaviour before effect holds: a dead-lettered effect lets its
/// order's next effect go (`tests/it/effect_holds.rs` tests the default, `hold`).
const SKIP_DEAD: (&str, &str) = ("EFFECTS_ON_DEAD", "skip");

/// `urutan effects` on `env`, sending to `effects` (`EFFECTS`) with the
/// tests' secret, [`FAST`] and `extra`: the shared child process (killed
/// when dropped).
fn dispatcher(env: &TestEnv, effects: &str, extra: &[(&str, &str)]) -> UrutanProcess {
    let mut vars: Vec<(String, String)> = (env.process_env(2).into_iter())
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    vars.push(("EFFECTS".into(), effects.into()));
    vars.push(("EFFECTS_SECRET".into(), SECRET.into()));
    vars.extend((FAST.iter().chain(extra)).map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    UrutanProcess::start("effects", &vars)
}

// -------------------------------------------------------------- the workload

fn status_of(versi: i64) -> &'static str {
    if versi % 2 == 0 { "dibayar" } else { "dibuat" }
}

/// Version `versi` of `order`, with data that names its version.
fn event(order: &str, versi: i64) -> Msg {
    let body = serde_json::json!({
        "id": order, "status": status_of(versi), "versi": versi,
        "data": {"amount": versi * 100},
    });
    Msg {
        message_id: Some(format!("{order}-v{versi}")),
        header: Some(AMQPValue::LongString(LongString::from(order.as_bytes()))),
        delivery_mode: Some(2),
        body: body.to_string().into_bytes(),
    }
}

/// `orders` orders named `{prefix}{i}`, versions `from..=to`, interleaved.
fn workload(prefix: &str, orders: usize, from: i64, to: i64) -> (Vec<Msg>, Vec<String>) {
    let names: Vec<String> = (0..orders).map(|i| format!("{prefix}{i}")).collect();
    let msgs = (from..=to)
        .flat_map(|v| names.iter().map(move |o| event(o, v)))
        .collect();
    (msgs, names)
}

fn expect_all(names: &[String], to: i64, keep: impl Fn(i64) -> bool) -> BTreeMap<String, Vec<i64>> {
    names
        .iter()
        .map(|o| (o.clone(), (1..=to).filter(|v| keep(*v)).collect()))
        .collect()
}

async fn effects_in(db: &PgPool, keadaan: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM urutan_efek WHERE keadaan = $1")
        .bind(keadaan)
        .fetch_one(db)
        .await
        .expect("count effects")
}

/// Waits until `n` effects exist and none is pending.
async fn wait_settled(db: &PgPool, n: i64, limit: Duration) {
    wait_for("every effect settled", limit, || async {
        let total: i64 = sqlx::query_scalar("SELECT count(*) FROM urutan_efek")
            .fetch_one(db)
            .await
            .expect("count");
        total == n && effects_in(db, "menunggu").await == 0
    })
    .await;
}

/// A dead-lettered effect: order, versi, HTTP status, answer, attempts.
type DeadLetter = (String, i64, Option<i32>, Option<String>, i32);

/// A pool applying through the real broker (strict mode unless `prefetch`).
async fn pipeline(env: &TestEnv, prefetch: u16) -> RunningPool {
    let mut settings = env.settings(4);
    settings.prefetch = prefetch;
    let pool = RunningPool::start(settings).await;
    pool.wait_ready().await;
    pool
}

// ------------------------------------------------------------------ the tests

/// Every apply path records one effect per matching endpoint for an applied
/// version, with that version's data, and none for stale, duplicate or
/// parked deliveries: strict mode, the set-based batch (an order once), the
/// batch loop (an order twice in one batch), and a parked message released
/// later by `urutan_lepas`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_apply_path_records_effects_in_its_transaction() {
    let env = TestEnv::new("effects_paths").await;
    let db = env.db().await;
    let routes = urutan::effects::Routes::parse(
        "dibayar=http://pay.test/capture;*=http://search.test/index;dibayar=http://search.test/index",
    )
    .expect("routes");
    urutan::effects::store::sync_routes(&db, &routes)
        .await
        .expect("routes written");
    let apply = |id: &str, order: &str, versi: i64| {
        let (db, id, order) = (db.clone(), id.to_owned(), order.to_owned());
        async move {
            let event = serde_json::json!({
                "message_id": id, "id": order, "status": status_of(versi), "versi": versi,
                "data": {"amount": versi * 100},
            });
            sqlx::query_scalar::<_, String>("SELECT urutan_terapkan($1, 0)")
                .bind(sqlx::types::Json(event))
                .fetch_one(&db)
                .await
                .expect("urutan_terapkan")
        }
    };
    let effects = || async {
        sqlx::query_as::<_, (String, i64, String, String)>(
            "SELECT e.pesanan_id, e.versi, t.url, e.isi::text FROM urutan_efek e
             JOIN urutan_efek_tujuan t USING (tujuan) ORDER BY e.pesanan_id, e.versi, t.url",
        )
        .fetch_all(&db)
        .await
        .expect("effects")
    };

    // Strict mode: applied, then a duplicate and a stale delivery.
    assert_eq!(apply("A-v1", "A", 1).await, "applied");
    assert_eq!(apply("A-v2", "A", 2).await, "applied");
    assert_eq!(apply("A-v2", "A", 2).await, "duplicate");
    assert_eq!(apply("A-v1-again", "A", 1).await, "stale");
    let rows = effects().await;
    assert_eq!(
        rows.iter()
            .map(|r| (r.0.as_str(), r.1, r.2.as_str()))
            .collect::<Vec<_>>(),
        [
            ("A", 1, "http://search.test/index"),
            ("A", 2, "http://pay.test/capture"),
            ("A", 2, "http://search.test/index"),
        ],
        "one effect per applied version and distinct matching endpoint"
    );
    let body: serde_json::Value = serde_json::from_str(&rows[1].3).expect("json body");
    assert_eq!(
        body,
        serde_json::json!({"id": "A", "status": "dibayar", "versi": 2, "data": {"amount": 200}}),
        "the body is the applied event"
    );

    // Ordered batches: B once (set-based), C twice (the loop), a stale A.
    let batch = |items: Vec<(&str, &str, i64)>| {
        let db = db.clone();
        let items: Vec<(String, String, i64)> = items
            .into_iter()
            .map(|(id, o, v)| (id.to_owned(), o.to_owned(), v))
            .collect();
        async move {
            let events: Vec<serde_json::Value> = items
                .iter()
                .map(|(id, order, versi)| {
                    serde_json::json!({
                        "message_id": id, "id": order, "status": status_of(*versi),
                        "versi": versi, "data": {"amount": versi * 100},
                    })
                })
                .collect();
            sqlx::query_scalar::<_, Vec<String>>("SELECT urutan_terapkan_batch($1, 0)")
                .bind(sqlx::types::Json(events))
                .fetch_one(&db)
                .await
                .expect("urutan_terapkan_batch")
        }
    };
    assert_eq!(
        batch(vec![("B-v1", "B", 1), ("A-v1-b", "A", 1)]).await,
        ["applied", "stale"]
    );
    assert_eq!(
        batch(vec![
            ("C-v1", "C", 1),
            ("B-v2", "B", 2),
            ("C-v2", "C", 2),
            ("C-v3", "C", 3),
            ("C-v2", "C", 2),
        ])
        .await,
        ["applied", "applied", "applied", "applied", "duplicate"]
    );

    // Parked while a window is open, released by urutan_lepas once its
    // previous version is applied.
    sqlx::query("INSERT INTO urutan_shard (shard, epoch) VALUES (0, 0) ON CONFLICT DO NOTHING")
        .execute(&db)
        .await
        .expect("shard");
    sqlx::query("INSERT INTO urutan_jendela (sebab) VALUES ('test window')")
        .execute(&db)
        .await
        .expect("window");
    assert_eq!(apply("D-v1", "D", 1).await, "applied");
    assert_eq!(apply("D-v3", "D", 3).await, "parked");
    let parked: i64 = sqlx::query_scalar("SELECT count(*) FROM urutan_efek WHERE pesanan_id = 'D'")
        .fetch_one(&db)
        .await
        .expect("count");
    assert_eq!(parked, 1, "a parked version has no effect yet");
    assert_eq!(apply("D-v2", "D", 2).await, "applied");
    let released: Vec<(String, String)> =
        sqlx::query_as("SELECT message_id, hasil FROM urutan_lepas(0, 100)")
            .fetch_all(&db)
            .await
            .expect("urutan_lepas");
    assert_eq!(released, [("D-v3".to_owned(), "applied".to_owned())]);

    // Every applied version: its effects, with its own data.
    let rows = effects().await;
    let history: Vec<(String, i64, String)> =
        sqlx::query_as("SELECT pesanan_id, versi, status FROM pesanan_riwayat ORDER BY seq")
            .fetch_all(&db)
            .await
            .expect("history");
    let expected: usize = history
        .iter()
        .map(|h| if h.2 == "dibayar" { 2 } else { 1 })
        .sum();
    assert_eq!(rows.len(), expected, "effects of {history:?}: {rows:?}");
    for (order, versi, _url, isi) in &rows {
        let body: serde_json::Value = serde_json::from_str(isi).expect("json");
        assert_eq!(body["id"], order.as_str());
        assert_eq!(body["versi"], *versi);
        assert_eq!(body["status"], status_of(*versi));
        assert_eq!(
            body["data"]["amount"],
            versi * 100,
            "{order} v{versi}: own data"
        );
    }
    for (order, versi) in [("B", 1), ("B", 2), ("C", 1), ("C", 2), ("C", 3), ("D", 3)] {
        assert!(
            rows.iter().any(|r| r.0 == order && r.1 == versi),
            "{order} v{versi} has its effect"
        );
    }

    // EFFECTS unset: the routes are cleared and new versions record nothing.
    let cleared = urutan::effects::store::sync_routes(&db, &urutan::effects::Routes::default())
        .await
        .expect("routes cleared");
    assert!(matches!(
        cleared,
        urutan::effects::store::Sync::Replaced { .. }
    ));
    assert_eq!(apply("A-v3", "A", 3).await, "applied");
    assert_eq!(
        effects().await.len(),
        rows.len(),
        "no effect without routes"
    );
}

/// A dispatcher killed after the endpoint answered and before the result
/// was recorded: the next one sends the same effect again with the same key,
/// the endpoint answers from its idempotency store, nothing is charged twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatcher_killed_before_recording_only_resends_with_the_same_key() {
    let env = TestEnv::new("effects_kill").await;
    let server = PayServer::start().await;
    let effects = format!("*={}", server.url("/charge"));
    let pool = pipeline(&env, 1).await;
    let db = env.db().await;
    let mut first = dispatcher(
        &env,
        &effects,
        &[("URUTAN_FAULT_ABORT_AFTER_EFFECT_SENT", "7")],
    );
    first.wait_ready().await;

    let (msgs, names) = workload("K", 5, 1, 4);
    env.publisher().await.send_all(&msgs).await;
    let died = first.wait_exit(Duration::from_secs(60)).await;
    assert_eq!(died.signal(), Some(6), "SIGABRT: {}", first.log());
    let answered = server.book(|b| b.requests.len());
    assert!(
        answered >= 7,
        "it died right after its 7th answer ({answered} requests)"
    );
    let pending_with_attempt: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM urutan_efek WHERE keadaan = 'menunggu' AND percobaan > 0",
    )
    .fetch_one(&db)
    .await
    .expect("count");
    assert!(
        pending_with_attempt >= 1,
        "its last answer was never recorded"
    );

    // A new dispatcher takes over once the dead one's leases expire.
    let mut second = dispatcher(&env, &effects, &[]);
    second.wait_ready().await;
    wait_settled(&db, 20, Duration::from_secs(60)).await;
    server.assert_exactly_once_in_order("/charge", &expect_all(&names, 4, |_| true));
    let (requests, keys) = server.book(|b| {
        let keys: HashSet<&String> = b.requests.iter().map(|r| &r.3).collect();
        (b.requests.len(), keys.len())
    });
    assert_eq!(keys, 20, "every effect's key");
    assert!(
        requests > keys,
        "the unrecorded effect(s) were sent again ({requests} requests for {keys} keys)"
    );
    assert_eq!(effects_in(&db, "terkirim").await, 20);
    second.stop().await;
    pool.stop().await;
}

/// The endpoint down for 30 s: effects wait and retry with backoff, nothing
/// is dead-lettered or lost, and every one is charged once when it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoint_down_for_30_s_loses_nothing() {
    let env = TestEnv::new("effects_down").await;
    let mut server = PayServer::start().await;
    let effects = format!("dibayar={}", server.url("/charge"));
    let pool = pipeline(&env, 1).await;
    let db = env.db().await;
    let mut dispatcher = dispatcher(&env, &effects, &[("EFFECTS_BACKOFF_MAX", "3s")]);
    dispatcher.wait_ready().await;
    let publisher = env.publisher().await;

    let (before, names) = workload("D", 6, 1, 2);
    publisher.send_all(&before).await;
    wait_settled(&db, 6, Duration::from_secs(30)).await;

    server.stop().await;
    let down = Instant::now();
    let (during, _) = workload("D", 6, 3, 6);
    publisher.send_all(&during).await;
    wait_for(
        "effects retried against the closed port",
        Duration::from_secs(20),
        || async {
            metric_sum(
                &dispatcher.scrape().await,
                "urutan_effects_retries_total",
                &["reason=\"connection\""],
            ) >= 6.0
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(30).saturating_sub(down.elapsed())).await;
    assert_eq!(effects_in(&db, "gagal").await, 0, "nothing dead-lettered");
    assert_eq!(
        effects_in(&db, "menunggu").await,
        12,
        "the outage's effects wait"
    );
    server.restart().await;

    wait_settled(&db, 18, Duration::from_secs(30)).await;
    server.assert_exactly_once_in_order("/charge", &expect_all(&names, 6, |v| v % 2 == 0));
    let scrape = dispatcher.scrape().await;
    assert_eq!(metric_sum(&scrape, "urutan_effects_sent_total", &[]), 18.0);
    assert_eq!(
        metric_sum(&scrape, "urutan_effects_dead_letters_total", &[]),
        0.0
    );
    dispatcher.stop().await;
    pool.stop().await;
}

/// One order's endpoint fails (503) while the others flow; its next version
/// waits until it is through. A 422 is dead-lettered at once with the
/// answer and, with `EFFECTS_ON_DEAD=skip`, lets the order's next version go. An answer that comes after
/// the timeout (the charge made) is retried with the same key and charged
/// once; slow answers within the timeout are simply sent. An effect that
/// cannot be sent at all (its message id is no valid header value) is
/// dead-lettered at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_order_waits_while_others_flow() {
    let env = TestEnv::new("effects_hol").await;
    let server = PayServer::start().await;
    let effects = format!("*={}", server.url("/charge"));
    let pool = pipeline(&env, 1).await;
    let db = env.db().await;
    server.set("F0", Behaviour::Fail);
    server.set("R0", Behaviour::Reject);
    server.set("H0", Behaviour::Hang(Duration::from_secs(2)));
    server.set("S0", Behaviour::Slow(Duration::from_millis(300)));
    let mut dispatcher = dispatcher(&env, &effects, &[SKIP_DEAD]);
    dispatcher.wait_ready().await;

    let (flowing, names) = workload("N", 10, 1, 3);
    let mut msgs = flowing;
    for order in ["F0", "R0", "H0", "S0", "X0"] {
        msgs.extend((1..=3).map(|v| event(order, v)));
    }
    // X0's first message id holds a newline: once an effect that could not
    // be sent (not a valid HTTP header value), it is now refused by the
    // worker (`invalid_message_id`, docs/security.md), so X0 v1 has no
    // effect at all and X0's later versions flow.
    let x0_v1 = msgs.len() - 3;
    msgs[x0_v1].message_id = Some("X0-v1\nbad".into());
    env.publisher().await.send_all(&msgs).await;

    // Everyone else is through while F0 is still failing its first version.
    wait_for(
        "the other orders' effects sent",
        Duration::from_secs(60),
        || async { effects_in(&db, "terkirim").await >= 30 + 3 + 3 + 2 + 2 },
    )
    .await;
    let f0 = server.requests_for("F0");
    assert!(f0.len() >= 2, "F0 v1 was retried: {f0:?}");
    assert!(
        f0.iter().all(|v| *v == 1),
        "F0 v2 never went before v1: {f0:?}"
    );
    server.assert_exactly_once_in_order(
        "/charge",
        &names
            .iter()
            .map(|o| (o.clone(), vec![1, 2, 3]))
            .chain([
                ("R0".to_owned(), vec![2, 3]),
                ("X0".to_owned(), vec![2, 3]),
                ("H0".to_owned(), vec![1, 2, 3]),
                ("S0".to_owned(), vec![1, 2, 3]),
            ])
            .collect(),
    );
    let dead: Vec<DeadLetter> = sqlx::query_as(
        "SELECT pesanan_id, versi, kode, jawaban, percobaan FROM urutan_efek
         WHERE keadaan = 'gagal' ORDER BY pesanan_id",
    )
    .fetch_all(&db)
    .await
    .expect("dead letters");
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert!(
        server.requests_for("X0").iter().all(|v| *v > 1),
        "X0 v1 never sent"
    );
    let (order, versi, code, answer, attempts) = &dead[0];
    assert_eq!(
        (order.as_str(), *versi, *code, *attempts),
        ("R0", 1, Some(422), 1)
    );
    assert_eq!(
        answer.as_deref(),
        Some("card declined for R0"),
        "the answer is kept"
    );
    let h0 = server.requests_for("H0");
    assert!(h0.len() > 3, "H0 v1's late answer made a retry: {h0:?}");

    // F0's endpoint recovers: its versions go, in order.
    server.set("F0", Behaviour::Pay);
    wait_settled(&db, 44, Duration::from_secs(30)).await;
    let charged_f0: Vec<i64> = server.book(|b| {
        b.charges
            .iter()
            .filter(|c| c.order == "F0")
            .map(|c| c.versi)
            .collect()
    });
    assert_eq!(charged_f0, [1, 2, 3]);
    let overlapped = server.book(|b| b.overlapped.clone());
    assert!(
        overlapped.iter().all(|o| o == "H0"),
        "no order had two requests in flight (H0's hang outlives its timeout): {overlapped:?}"
    );
    let scrape = dispatcher.scrape().await;
    assert_eq!(
        metric_sum(
            &scrape,
            "urutan_effects_dead_letters_total",
            &["reason=\"http_4xx\""]
        ),
        1.0
    );
    assert_eq!(
        metric_sum(
            &scrape,
            "urutan_effects_dead_letters_total",
            &["reason=\"invalid_request\""]
        ),
        0.0
    );
    assert!(
        metric_sum(
            &scrape,
            "urutan_effects_retries_total",
            &["reason=\"http_5xx\""]
        ) >= 2.0
    );
    assert!(
        metric_sum(
            &scrape,
            "urutan_effects_retries_total",
            &["reason=\"timeout\""]
        ) >= 1.0
    );
    dispatcher.stop().await;
    pool.stop().await;
}

/// Two dispatchers at once, batch mode, two endpoints per paid version: no
/// effect is sent twice, no order has two requests in flight, both share
/// the work, and everything is charged once in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_dispatchers_never_send_an_effect_twice() {
    let env = TestEnv::new("effects_two").await;
    let server = PayServer::start().await;
    let effects = format!(
        "dibayar={};*={}",
        server.url("/charge"),
        server.url("/index")
    );
    let pool = pipeline(&env, 16).await;
    let db = env.db().await;
    let (msgs, names) = workload("T", 40, 1, 6);
    for name in &names {
        server.set(name, Behaviour::Slow(Duration::from_millis(20)));
    }
    let slow = [("EFFECTS_CONCURRENCY", "8")];
    let mut a = dispatcher(&env, &effects, &slow);
    let mut b = dispatcher(&env, &effects, &slow);
    a.wait_ready().await;
    b.wait_ready().await;
    env.publisher().await.send_all(&msgs).await;

    let total = 40 * 6 + 40 * 3;
    wait_settled(&db, total, Duration::from_secs(120)).await;
    server.assert_exactly_once_in_order("/charge", &expect_all(&names, 6, |v| v % 2 == 0));
    server.assert_exactly_once_in_order("/index", &expect_all(&names, 6, |_| true));
    server.book(|book| {
        assert_eq!(
            book.requests.len(),
            usize::try_from(total).expect("usize"),
            "no effect was sent twice"
        );
        assert!(
            book.overlapped.is_empty(),
            "orders with two requests in flight: {:?}",
            book.overlapped
        );
    });
    let sent_a = metric_sum(&a.scrape().await, "urutan_effects_sent_total", &[]);
    let sent_b = metric_sum(&b.scrape().await, "urutan_effects_sent_total", &[]);
    assert_eq!(sent_a + sent_b, total as f64);
    assert!(
        sent_a > 0.0 && sent_b > 0.0,
        "both worked: {sent_a} + {sent_b}"
    );
    a.stop().await;
    b.stop().await;
    pool.stop().await;
}

/// The server checks every signature: a dispatcher with another secret gets
/// 401s, which are dead-lettered at once, and nothing is charged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_signature_is_refused_by_the_server_and_dead_lettered() {
    let env = TestEnv::new("effects_sig").await;
    let server = PayServer::start().await;
    let effects = format!("*={}", server.url("/charge"));
    let pool = pipeline(&env, 1).await;
    let db = env.db().await;
    // Skip: every version's effect is tried (and refused), none held.
    let mut dispatcher = dispatcher(
        &env,
        &effects,
        &[
            (
                "EFFECTS_SECRET",
                "whsec_c29tZSBvdGhlciBzZWNyZXQgb2YgZW5vdWdo",
            ),
            SKIP_DEAD,
        ],
    );
    dispatcher.wait_ready().await;
    let (msgs, _) = workload("W", 3, 1, 2);
    env.publisher().await.send_all(&msgs).await;
    wait_settled(&db, 6, Duration::from_secs(30)).await;
    assert_eq!(effects_in(&db, "gagal").await, 6);
    server.book(|b| {
        assert_eq!(b.bad_signatures, 6, "each refused once");
        assert!(b.charges.is_empty(), "nothing charged");
    });
    let codes: Vec<Option<i32>> = sqlx::query_scalar("SELECT DISTINCT kode FROM urutan_efek")
        .fetch_all(&db)
        .await
        .expect("codes");
    assert_eq!(codes, [Some(401)]);
    dispatcher.stop().await;
    pool.stop().await;
}

/// A bad EFFECTS (or a missing secret) stops `urutan effects` at start with
/// exit 2 (a wrong setting) and one line that names the problem and shows no secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_effects_setting_is_refused_at_start_with_one_line() {
    let cases = [
        (
            "dibayar=https://pay.internal/capture;dikirim",
            Some(SECRET),
            "EFFECTS entry 2 (`dikirim`): no `=`",
        ),
        (
            "dibayar=ftp://user:hunter2@pay.internal/capture",
            Some(SECRET),
            "EFFECTS entry 1 (`dibayar=ftp://pay.internal/…`): unsupported scheme `ftp`",
        ),
        (
            "*=https://search.internal/index",
            None,
            "EFFECTS is set but EFFECTS_SECRET is not",
        ),
    ];
    for (effects, secret, line) in cases {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_urutan"));
        cmd.arg("effects")
            .env("EFFECTS", effects)
            .env("DATABASE_URL", "postgres://postgres@127.0.0.1:1/never")
            .env("METRICS_ADDR", "127.0.0.1:0")
            .env("NO_COLOR", "1")
            .env_remove("EFFECTS_SECRET")
            .kill_on_drop(true);
        if let Some(secret) = secret {
            cmd.env("EFFECTS_SECRET", secret);
        }
        let out = tokio::time::timeout(Duration::from_secs(30), cmd.output())
            .await
            .expect("urutan effects did not exit within 30 s")
            .expect("run urutan effects");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{effects}: {stderr}");
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "one line: {stderr}");
        assert!(lines[0].contains(line), "{effects}: {stderr}");
        assert!(
            !stderr.contains("hunter2") && !stderr.contains("MfKQ9r8"),
            "{stderr}"
        );
    }
}

/// The least-privilege roles: the worker role applies with effects on (the
/// trigger records them without any grant of the worker's), and the
/// dispatcher role of `deploy/postgres/least-privilege.sql` runs `urutan
/// effects` with nothing more than its grants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_privilege_roles_apply_and_dispatch_effects() {
    let env = TestEnv::new("effects_leastpriv").await;
    let db = env.db().await; // the owner migrates
    let roles = PgRoles::create(&env, &["dispatcher"]);
    let server = PayServer::start().await;
    let effects = format!("dibayar={}", server.url("/charge"));
    let dispatcher_url = roles.url("dispatcher");
    let mut dispatcher = dispatcher(&env, &effects, &[("DATABASE_URL", &dispatcher_url)]);
    dispatcher.wait_ready().await;
    let mut settings = env.settings(2);
    settings.database_url = roles.secret_url("worker");
    settings.database_pool_size = Some(4);
    let pool = RunningPool::start(settings).await;
    pool.wait_ready().await;

    let (msgs, names) = workload("P", 5, 1, 4);
    env.publisher().await.send_all(&msgs).await;
    wait_settled(&db, 5 * 2, Duration::from_secs(60)).await;
    server.assert_exactly_once_in_order("/charge", &expect_all(&names, 4, |v| v % 2 == 0));

    // Nothing more: the dispatcher may not read orders or write history.
    let as_dispatcher = urutan::store::connect(&roles.secret_url("dispatcher"), 1)
        .await
        .expect("the dispatcher role connects");
    for sql in [
        "SELECT count(*) FROM pesanan",
        "INSERT INTO pesanan_riwayat (pesanan_id, versi, status, message_id, shard) VALUES ('x', 1, 'dibuat', 'x', 0)",
        "DELETE FROM urutan_efek_tujuan",
    ] {
        let refused = sqlx::query(sql).execute(&as_dispatcher).await;
        let code = match refused {
            Err(sqlx::Error::Database(e)) => e.code().map(|c| c.into_owned()),
            other => panic!("the dispatcher role may {sql}: {other:?}"),
        };
        assert_eq!(code.as_deref(), Some("42501"), "{sql}");
    }
    as_dispatcher.close().await;
    dispatcher.stop().await;
    pool.stop().await;
}

/// Dead-lettered effects with the same tooling as dead-lettered messages,
/// run as the operator role: `urutan dlq list --effects` shows them with
/// their last answer, `replay --effects` sends them again with their
/// original key once the endpoint is fixed (charged once, in version order),
/// and an endpoint that stored its 4xx for the key answers it again: the
/// replay says so and exits 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_lettered_effects_are_listed_and_replayed_with_urutan_dlq() {
    let env = TestEnv::new("effects_dlq").await;
    let db = env.db().await;
    let roles = PgRoles::create(&env, &["operator"]);
    let operator_db = roles.url("operator");
    let as_operator = [("DATABASE_URL", operator_db.as_str())];
    let server = PayServer::start().await;
    // A token in the path: never printed (only `/charge/…`).
    let effects = format!("*={}", server.url("/charge/tok-S3CRET"));
    let pool = pipeline(&env, 1).await;
    server.set("F0", Behaviour::Fail);
    server.set("R0", Behaviour::Reject);
    // Skip: F0 v2 is tried (and dead-lettered) after F0 v1.
    let mut dispatcher = dispatcher(&env, &effects, &[("EFFECTS_MAX_ATTEMPTS", "2"), SKIP_DEAD]);
    dispatcher.wait_ready().await;
    let msgs: Vec<Msg> = [("F0", 1), ("F0", 2), ("R0", 1), ("R0", 2), ("N0", 1)]
        .into_iter()
        .map(|(o, v)| event(o, v))
        .collect();
    env.publisher().await.send_all(&msgs).await;
    wait_for(
        "F0 v1, v2 and R0 v1 dead-lettered",
        Duration::from_secs(60),
        || async { effects_in(&db, "gagal").await == 3 && effects_in(&db, "terkirim").await == 2 },
    )
    .await;

    let listed = run_urutan(&env, &as_operator, &["dlq", "list", "--effects", "--json"]).await;
    assert!(listed.ok(), "{listed}");
    let listed: serde_json::Value = serde_json::from_str(&listed.stdout).expect("JSON");
    let dead = listed["effects"].as_array().expect("effects");
    let seen: Vec<(String, i64, i64)> = dead
        .iter()
        .map(|e| {
            let order = e["order_id"].as_str().expect("order").to_owned();
            (
                order,
                e["versi"].as_i64().expect("versi"),
                e["http_status"].as_i64().unwrap_or(0),
            )
        })
        .collect();
    let mut sorted = seen.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        [
            ("F0".into(), 1, 503),
            ("F0".into(), 2, 503),
            ("R0".into(), 1, 422)
        ],
        "{listed}"
    );
    let id_of = |order: &str| -> Vec<String> {
        dead.iter()
            .filter(|e| e["order_id"] == order)
            .map(|e| e["effect"].as_i64().expect("id").to_string())
            .collect()
    };
    let table = run_urutan(&env, &as_operator, &["dlq", "list", "--effects"]).await;
    assert!(
        table.ok() && table.stdout.contains("3 dead-lettered effect(s)"),
        "{table}"
    );
    let redacted = format!("{}/charge/…", server.url("").trim_end_matches('/'));
    for shown in [&table.stdout, &listed.to_string()] {
        assert!(
            !shown.contains("tok-S3CRET") && shown.contains(&redacted),
            "endpoints redacted to {redacted}: {shown}"
        );
    }

    // A dry run changes nothing; an unknown id is one clear line.
    let mut args = vec!["dlq", "replay", "--effects", "--dry-run"];
    let f0 = id_of("F0");
    args.extend(f0.iter().map(String::as_str));
    let dry = run_urutan(&env, &as_operator, &args).await;
    assert!(
        dry.ok() && dry.stdout.matches("would be replayed").count() == 2,
        "{dry}"
    );
    assert_eq!(effects_in(&db, "gagal").await, 3);
    let unknown = run_urutan(
        &env,
        &as_operator,
        &["dlq", "replay", "--effects", "999999"],
    )
    .await;
    assert!(
        unknown.code == Some(1)
            && unknown
                .stderr
                .contains("no dead-lettered effect with id 999999"),
        "{unknown}"
    );

    // The endpoint is fixed: F0's effects go out, once each, v1 first.
    server.set("F0", Behaviour::Pay);
    let mut args = vec!["dlq", "replay", "--effects", "--wait", "30s"];
    args.extend(f0.iter().map(String::as_str));
    let replayed = run_urutan(&env, &as_operator, &args).await;
    assert!(
        replayed.ok() && replayed.stdout.matches(": sent").count() == 2,
        "{replayed}"
    );
    // R0's endpoint stored its 422 for that key: the same answer again.
    let r0 = id_of("R0");
    let mut args = vec!["dlq", "replay", "--effects", "--wait", "30s"];
    args.extend(r0.iter().map(String::as_str));
    let again = run_urutan(&env, &as_operator, &args).await;
    assert!(
        again.code == Some(1)
            && again
                .stdout
                .contains("dead-lettered again (HTTP 422: card declined for R0)")
            && again.stderr.contains("1 dead-lettered again")
            && !again.stderr.contains("is `urutan effects` running"),
        "the real outcome, with its answer, and no hint about a stopped dispatcher: {again}"
    );
    assert!(!again.stdout.contains("tok-S3CRET"), "{again}");
    // Charged once each, in version order (the requests were not: F0's
    // v1 was asked again after its v2 had failed).
    let charged = server.book(|b| {
        let mut charged: BTreeMap<String, Vec<i64>> = BTreeMap::new();
        for c in &b.charges {
            charged.entry(c.order.clone()).or_default().push(c.versi);
        }
        assert_eq!(b.bad_signatures, 0, "every signature verified");
        charged
    });
    let expected: BTreeMap<String, Vec<i64>> =
        [("F0", vec![1, 2]), ("R0", vec![2]), ("N0", vec![1])]
            .into_iter()
            .map(|(o, v)| (o.to_owned(), v))
            .collect();
    assert_eq!(charged, expected);
    let log = dispatcher.stop().await;
    assert!(!log.contains("tok-S3CRET"), "URLs redacted in logs:\n{log}");
    // No dispatcher: the replayed effect stays pending, and that is said.
    let mut args = vec!["dlq", "replay", "--effects", "--wait", "1s"];
    args.extend(r0.iter().map(String::as_str));
    let waiting = run_urutan(&env, &as_operator, &args).await;
    assert!(
        waiting.code == Some(1)
            && waiting.stdout.contains(": pending")
            && waiting.stderr.contains("1 still pending")
            && waiting.stderr.contains("is `urutan effects` running"),
        "{waiting}"
    );
    pool.stop().await;
}

/// Two endpoints of one version get two idempotency keys, each the same on
/// every resend: a receiver deduplicating keys across endpoints (one
/// gateway in front of both) takes both effects. Each key is signed as sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_endpoint_gets_its_own_idempotency_key() {
    let env = TestEnv::new("effects_keys").await;
    let db = env.db().await;
    let server = PayServer::start().await;
    let (pay, index) = (server.url("/charge"), server.url("/index"));
    let effects = format!("*={pay};*={index}");
    let pool = pipeline(&env, 1).await;
    let mut dispatcher = dispatcher(&env, &effects, &[]);
    dispatcher.wait_ready().await;
    let (msgs, names) = workload("G", 2, 1, 2);
    env.publisher().await.send_all(&msgs).await;
    wait_settled(&db, 8, Duration::from_secs(60)).await;
    let expected = expect_all(&names, 2, |_| true);
    server.assert_exactly_once_in_order("/charge", &expected);
    server.assert_exactly_once_in_order("/index", &expected);
    server.book(|b| {
        let keys: HashSet<&str> = b.requests.iter().map(|r| r.3.as_str()).collect();
        assert_eq!(
            keys.len(),
            8,
            "one key per version and endpoint: {:?}",
            b.requests
        );
        for (path, order, versi, key) in &b.requests {
            let url = if path == "/charge" { &pay } else { &index };
            let want = urutan::effects::sign::idempotency_key(&format!("{order}-v{versi}"), url);
            assert_eq!(key, &want, "{path} {order} v{versi}");
        }
        assert_eq!(b.bad_signatures, 0, "signed with the key sent");
    });
    dispatcher.stop().await;
    pool.stop().await;
}

/// A deep backlog (300 orders × 200 pending effects in the first id-range
/// partition, the statistics taken while the tables were empty, as when a backlog builds up faster than
/// autovacuum analyzes): each claim takes the heads of the orders due
/// soonest (version 1 of orders no other claim holds, in due order), and
/// reads only what it needs. Once every head is held, a claim finds nothing
/// at once: the old claim walked all 60,000 pending effects to prove it
/// (1.4 s per claim; about 2 s at 37,000 pending in a cluster fault run,
/// where each finished send wakes a claim for one slot).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deep_backlog_is_claimed_head_first_without_reading_all_of_it() {
    const ORDERS: i64 = 300;
    const VERSIONS: i64 = 200;
    let env = TestEnv::new("effects_claim_backlog").await;
    let db = env.db().await;
    sqlx::raw_sql(
        "ALTER TABLE urutan_efek_p1 SET (autovacuum_enabled = false);
         ALTER TABLE urutan_efek_kepala SET (autovacuum_enabled = false);
         ANALYZE urutan_efek; ANALYZE urutan_efek_kepala;",
    )
    .execute(&db)
    .await
    .expect("stale statistics");
    let tujuan = endpoint_row(&db).await;
    // Version-major, as a worker pool applying 300 orders round-robin writes them.
    sqlx::query(
        "INSERT INTO urutan_efek (pesanan_id, versi, tujuan, message_id, isi)
         SELECT 'B-' || lpad(o::text, 4, '0'), v, $1, 'B-' || o || '/' || v, '{}'
         FROM generate_series(1, $2) v, generate_series(1, $3) o
         ORDER BY v, o",
    )
    .bind(tujuan)
    .bind(VERSIONS)
    .bind(ORDERS)
    .execute(&db)
    .await
    .expect("backlog");
    // Order B-0001 due first, B-0300 last.
    sqlx::query(
        "UPDATE urutan_efek_kepala
         SET siap_pada = now() - make_interval(secs => $1 - substr(pesanan_id, 3)::int)",
    )
    .bind(ORDERS as f64)
    .execute(&db)
    .await
    .expect("due times");

    let mut took = Vec::new();
    let mut next = 1;
    for round in 0..(ORDERS / 32) {
        let started = Instant::now();
        let mut claimed = urutan::effects::store::claim(&db, 32, Duration::from_secs(600), "test")
            .await
            .expect("claim");
        took.push(started.elapsed());
        claimed.sort_by(|a, b| a.pesanan_id.cmp(&b.pesanan_id));
        let orders: Vec<&str> = claimed.iter().map(|c| c.pesanan_id.as_str()).collect();
        let due: Vec<String> = (next..next + 32).map(|o| format!("B-{o:04}")).collect();
        assert_eq!(orders, due, "round {round}: the 32 orders due soonest");
        assert!(
            claimed.iter().all(|c| c.versi == 1 && c.percobaan == 1),
            "round {round}: only heads, first attempts: {claimed:?}"
        );
        next += 32;
    }
    // The heads still free, then nothing: every order's head is held.
    let rest = urutan::effects::store::claim(&db, 32, Duration::from_secs(600), "test")
        .await
        .expect("claim");
    assert_eq!(rest.len(), (ORDERS - ORDERS / 32 * 32) as usize);
    assert!(rest.iter().all(|c| c.versi == 1));
    let mut idle = Vec::new();
    for _ in 0..9 {
        let started = Instant::now();
        let none = urutan::effects::store::claim(&db, 32, Duration::from_secs(600), "test")
            .await
            .expect("claim");
        idle.push(started.elapsed());
        assert!(none.is_empty(), "a second effect of a held order: {none:?}");
    }
    // Medians, so that a loaded machine's outlier does not decide.
    let median = |mut t: Vec<Duration>| {
        t.sort_unstable();
        t[t.len() / 2]
    };
    let (busy, idle) = (median(took), median(idle));
    eprintln!(
        "{} pending: median claim of 32 {busy:?}, with every head held {idle:?}",
        ORDERS * VERSIONS
    );
    assert!(
        busy < Duration::from_millis(300) && idle < Duration::from_millis(100),
        "claims read the backlog: median {busy:?} (32 taken), {idle:?} (none free)"
    );
}

/// An endpoint row for the store-level tests (nothing listens on it).
async fn endpoint_row(db: &PgPool) -> i32 {
    sqlx::query_scalar(
        "INSERT INTO urutan_efek_tujuan (url) VALUES ('http://127.0.0.1:9/pay') RETURNING tujuan",
    )
    .fetch_one(db)
    .await
    .expect("endpoint")
}

/// Inserts pending effects v1..=`versions` of `order` (as the apply
/// transaction's trigger does).
async fn pending(db: &PgPool, tujuan: i32, order: &str, versions: std::ops::RangeInclusive<i64>) {
    sqlx::query(
        "INSERT INTO urutan_efek (pesanan_id, versi, tujuan, message_id, isi)
         SELECT $2, v, $1, $2 || '/' || v, '{}' FROM generate_series($3::bigint, $4) v",
    )
    .bind(tujuan)
    .bind(order)
    .bind(*versions.start())
    .bind(*versions.end())
    .execute(db)
    .await
    .expect("pending effects");
}

/// What a claim of up to 8 takes now, as (order, versi, attempt).
async fn claimed_now(db: &PgPool, lease: Duration) -> Vec<(String, i64, i32)> {
    urutan::effects::store::claim(db, 8, lease, "test")
        .await
        .expect("claim")
        .into_iter()
        .map(|c| (c.pesanan_id, c.versi, c.percobaan))
        .collect()
}

/// The schedule moves with every result: a sent effect makes its order's
/// next one due at once (not when the lease ends), a retry when its backoff
/// ends, a lost lease when it expires, and a result from a lost claim is
/// refused and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_result_makes_the_orders_next_effect_due_when_it_may_go() {
    use urutan::effects::OnDead::Skip;
    use urutan::effects::store::{Recorded, Settled, claim, record};
    let env = TestEnv::new("effects_schedule").await;
    let db = env.db().await;
    let tujuan = endpoint_row(&db).await;
    pending(&db, tujuan, "S-1", 1..=3).await;
    let long = Duration::from_secs(600);

    let first = claim(&db, 8, long, "test").await.expect("claim");
    assert_eq!(first.len(), 1);
    assert_eq!((first[0].versi, first[0].percobaan), (1, 1));
    assert!(claimed_now(&db, long).await.is_empty(), "v2 waits for v1");
    let sent = Recorded::Sent { code: 200 };
    assert_eq!(
        record(&db, first[0].efek, 1, &sent, Skip)
            .await
            .expect("record"),
        Settled::Recorded
    );
    // Sent: v2 is due now, though v1's lease has ten minutes to go.
    let second = claim(&db, 8, long, "test").await.expect("claim");
    assert_eq!((second[0].versi, second[0].percobaan), (2, 1));

    // A retry in a second: not before, then the same effect, second attempt.
    let retry = Recorded::Retry {
        code: Some(503),
        answer: "busy".into(),
        after: Duration::from_secs(1),
    };
    assert_eq!(
        record(&db, second[0].efek, 1, &retry, Skip)
            .await
            .expect("record"),
        Settled::Recorded
    );
    assert!(claimed_now(&db, long).await.is_empty(), "v2 in backoff");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    // A short lease this time, left to expire (a dispatcher that died).
    assert_eq!(
        claimed_now(&db, Duration::from_secs(1)).await,
        vec![("S-1".to_owned(), 2, 2)]
    );
    assert!(claimed_now(&db, long).await.is_empty(), "v2 leased");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let again = claim(&db, 8, long, "test").await.expect("claim");
    assert_eq!((again[0].versi, again[0].percobaan), (2, 3));
    // The dead dispatcher's late result (attempt 2) is refused.
    assert_eq!(
        record(&db, again[0].efek, 2, &sent, Skip)
            .await
            .expect("record"),
        Settled::Lost
    );
    assert!(
        claimed_now(&db, long).await.is_empty(),
        "v2 still held by attempt 3"
    );
    let dead = Recorded::Dead {
        code: Some(422),
        answer: "no".into(),
    };
    // EFFECTS_ON_DEAD=skip: a dead letter lets the order's next effect go.
    assert_eq!(
        record(&db, again[0].efek, 3, &dead, Skip)
            .await
            .expect("record"),
        Settled::Recorded
    );
    let third = claim(&db, 8, long, "test").await.expect("claim");
    assert_eq!((third[0].versi, third[0].percobaan), (3, 1));
    assert_eq!(
        record(&db, third[0].efek, 1, &sent, Skip)
            .await
            .expect("record"),
        Settled::Recorded
    );
    // Nothing pending: the next claim finds nothing and drops the order's row.
    assert!(claimed_now(&db, long).await.is_empty());
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM urutan_efek_kepala")
        .fetch_one(&db)
        .await
        .expect("schedule");
    assert_eq!(rows, 0, "a finished order leaves the schedule");
}

/// The race the schedule's row locks close: a claim finds no pending effect
/// for an order and deletes its row while an apply transaction is
/// committing the order's next effect. The insert waits for the claim and
/// puts the row back, so the new effect is never left unscheduled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_effect_committed_while_its_order_leaves_the_schedule_stays_scheduled() {
    let env = TestEnv::new("effects_schedule_race").await;
    let db = env.db().await;
    let tujuan = endpoint_row(&db).await;
    // The order's row, as a finished effect leaves it (nothing pending).
    sqlx::query("INSERT INTO urutan_efek_kepala VALUES ('R-1', now())")
        .execute(&db)
        .await
        .expect("row");
    // A claim mid-way: the row locked, nothing pending seen.
    let mut claim = db.begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM urutan_efek_kepala WHERE pesanan_id = 'R-1' FOR UPDATE")
        .execute(&mut *claim)
        .await
        .expect("lock");
    // The apply transaction inserts v1 meanwhile: it must wait.
    let insert = tokio::spawn({
        let db = db.clone();
        async move { pending(&db, tujuan, "R-1", 1..=1).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!insert.is_finished(), "the insert waits for the claim");
    sqlx::query("DELETE FROM urutan_efek_kepala WHERE pesanan_id = 'R-1'")
        .execute(&mut *claim)
        .await
        .expect("delete");
    claim.commit().await.expect("commit");
    tokio::time::timeout(Duration::from_secs(10), insert)
        .await
        .expect("the insert goes on")
        .expect("insert");
    let claimed = claimed_now(&db, Duration::from_secs(600)).await;
    assert_eq!(claimed, vec![("R-1".to_owned(), 1, 1)], "v1 is scheduled");
}

/// Each endpoint with its own secret (`EFFECTS_SECRETS`) verifies only its
/// own signatures: a receiver cannot forge events for another. An endpoint
/// not named signs with `EFFECTS_SECRET`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_endpoint_verifies_only_its_own_secret() {
    const PAY: &str = "pay-endpoint-secret-0123456789";
    const SEARCH: &str = "search-endpoint-secret-0123456789";
    let env = TestEnv::new("effects_own_secret").await;
    let pay = PayServer::start_verifying(PAY).await;
    let search = PayServer::start_verifying(SEARCH).await;
    let default = PayServer::start().await;
    let effects = format!(
        "*={};*={};*={}",
        pay.url("/charge"),
        search.url("/index"),
        default.url("/charge")
    );
    let secrets = serde_json::json!({
        pay.url("/charge"): PAY,
        search.url("/index"): SEARCH,
    })
    .to_string();
    let pool = pipeline(&env, 1).await;
    let db = env.db().await;
    let mut dispatcher = dispatcher(&env, &effects, &[("EFFECTS_SECRETS", &secrets)]);
    dispatcher.wait_ready().await;
    let (msgs, _) = workload("S", 2, 1, 2);
    env.publisher().await.send_all(&msgs).await;
    wait_settled(&db, 12, Duration::from_secs(30)).await;
    assert_eq!(
        effects_in(&db, "gagal").await,
        0,
        "every signature verified"
    );
    for server in [&pay, &search, &default] {
        server.book(|b| {
            assert_eq!(b.bad_signatures, 0);
            assert_eq!(b.charges.len(), 4);
        });
    }
    // A receiver's key does not sign for another endpoint.
    let theirs = Secret::parse(PAY).expect("secret");
    let body = br#"{"id":"S0","status":"dibayar","versi":9}"#;
    let forged = urutan::effects::sign::signature(&theirs, "forged-1", 1_700_000_000, body);
    let search_key = Secret::parse(SEARCH).expect("secret");
    let default_key = Secret::parse(SECRET).expect("secret");
    for key in [&search_key, &default_key] {
        assert!(!urutan::effects::sign::verify(
            key,
            &forged,
            "forged-1",
            1_700_000_000,
            body
        ));
    }
    dispatcher.stop().await;
    pool.stop().await;
}

/// `HTTP_PROXY`, `HTTPS_PROXY` and `ALL_PROXY` in the dispatcher's
/// environment are ignored: webhooks go direct unless `EFFECTS_PROXY` is set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_ignore_proxies_from_the_environment() {
    let env = TestEnv::new("effects_no_proxy").await;
    let server = PayServer::start().await;
    let proxy = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let proxy_url = format!("http://{}", proxy.local_addr().expect("addr"));
    let seen = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counter = seen.clone();
    let recorder = tokio::spawn(async move {
        while let Ok((conn, _)) = proxy.accept().await {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            drop(conn);
        }
    });
    let pool = pipeline(&env, 1).await;
    let db = env.db().await;
    let mut dispatcher = dispatcher(
        &env,
        &format!("*={}", server.url("/charge")),
        &[
            ("HTTP_PROXY", &proxy_url),
            ("http_proxy", &proxy_url),
            ("HTTPS_PROXY", &proxy_url),
            ("ALL_PROXY", &proxy_url),
            ("all_proxy", &proxy_url),
            ("NO_PROXY", ""),
            ("no_proxy", ""),
        ],
    );
    dispatcher.wait_ready().await;
    let (msgs, _) = workload("P", 2, 1, 2);
    env.publisher().await.send_all(&msgs).await;
    wait_settled(&db, 4, Duration::from_secs(30)).await;
    assert_eq!(effects_in(&db, "gagal").await, 0);
    server.book(|b| assert_eq!(b.charges.len(), 4, "sent direct"));
    assert_eq!(
        seen.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the proxy saw nothing"
    );
    recorder.abort();
    dispatcher.stop().await;
    pool.stop().await;
}

/// What a producer's newline would start: a fake line of urutan's own.
const FORGED: &str = "2026-12-04T00:00:00Z  INFO urutan: forged";

/// Lines of `log` that a producer's newline started.
fn forged_lines(log: &str) -> Vec<&str> {
    log.lines().filter(|l| l.starts_with(FORGED)).collect()
}

/// No producer string forges a log line (issue 29): with LOG_FORMAT=text,
/// the pool dead-letters messages whose message_id, x-pesanan-id or body id
/// carry a newline and a fake line, and the dispatcher retries, gives up on
/// and sends effects whose order and message id carry one (rows recorded
/// before ids were checked: today's worker dead-letters such ids). Every
/// id is logged escaped, the newline as `\n`, never raw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_newlines_never_forge_log_lines() {
    let env = TestEnv::new("effects_logforge").await;
    let db = env.db().await;
    let server = PayServer::start().await;
    let effects = format!("*={}", server.url("/charge"));
    let text_logs = [("LOG_FORMAT", "text"), ("RUST_LOG", "urutan=debug")];
    let mut vars = env.process_env(2);
    vars.extend(text_logs.iter().map(|(k, v)| (*k, (*v).to_owned())));
    let mut pool = UrutanProcess::start("run", &vars);
    pool.wait_ready().await;
    let mut dispatcher_vars = text_logs.to_vec();
    dispatcher_vars.push(("EFFECTS_MAX_ATTEMPTS", "2"));
    let mut dispatcher = dispatcher(&env, &effects, &dispatcher_vars);
    dispatcher.wait_ready().await;

    let forge = |id: &str| format!("{id}\n{FORGED}");
    let with = |message_id: String, header: String, body_id: String| {
        let mut msg = Msg::event_with(&header, 1, &message_id, status_of(1));
        let body = serde_json::json!({"id": body_id, "status": status_of(1), "versi": 1});
        msg.body = body.to_string().into_bytes();
        msg
    };
    let msgs = [
        with(forge("m1"), "P1".into(), "P1".into()),
        with("m2".into(), forge("P2"), forge("P2")),
        with("m3".into(), "P3".into(), forge("P3")),
        with(forge("m4"), forge("P4"), "P4".into()),
    ];
    env.publisher().await.send_all(&msgs).await;
    wait_for("4 dead-letter records", Duration::from_secs(30), || async {
        let sql = "SELECT count(*) FROM urutan_dead_letter";
        crate::common::count(&db, sql).await == 4
    })
    .await;

    wait_for("the routes in force", Duration::from_secs(30), || async {
        crate::common::count(&db, "SELECT count(*) FROM urutan_efek_tujuan").await == 1
    })
    .await;
    // E1's endpoint answers 503 (a retry, then dead-lettered); E2's 200.
    server.set(&forge("E1"), Behaviour::Fail);
    // A message id with a newline cannot be a header: E3 is dead-lettered
    // before any request.
    for (order, message_id) in [
        ("E1", "E1-v1".to_owned()),
        ("E2", "E2-v1".to_owned()),
        ("E3", forge("E3-v1")),
    ] {
        let inserted = sqlx::query(
            "INSERT INTO urutan_efek (pesanan_id, versi, tujuan, message_id, isi)
             SELECT $1, 1, tujuan, $2,
                    jsonb_build_object('id', $1::text, 'status', 'dibuat', 'versi', 1,
                                       'data', jsonb_build_object('amount', 100))
             FROM urutan_efek_tujuan",
        )
        .bind(forge(order))
        .bind(message_id)
        .execute(&db)
        .await
        .expect("an effect recorded before ids were checked");
        assert_eq!(inserted.rows_affected(), 1, "one endpoint");
    }
    let settled = tokio::time::timeout(Duration::from_secs(30), async {
        while effects_in(&db, "gagal").await != 2 || effects_in(&db, "terkirim").await != 1 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    if settled.await.is_err() {
        panic!(
            "E1 and E3 not dead-lettered or E2 not sent:\n{}",
            dispatcher.log()
        );
    }

    let escaped = format!("\\n{FORGED}");
    for (name, log) in [
        ("run", pool.stop().await),
        ("effects", dispatcher.stop().await),
    ] {
        assert!(
            forged_lines(&log).is_empty(),
            "urutan {name}: forged lines {:#?}\n{log}",
            forged_lines(&log)
        );
        assert!(
            log.contains(&escaped),
            "urutan {name} never logged a producer id:\n{log}"
        );
    }
    db.close().await;
}
