//! Effects in `urutan demo`: a local payment endpoint (signature checked,
//! idempotency-key store, one charge per key) and an in-process dispatcher
//! with the route `dibayar=<endpoint>`; the report line says what was
//! recorded, sent and charged.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use urutan::effects::{self, Dispatcher, EffectsSettings, Secret, sign};
use urutan::store;

/// The status the demo's payment endpoint is routed for.
const PAID: &str = "dibayar";

/// What the demo's payment endpoint saw.
#[derive(Default)]
struct Ledger {
    requests: u64,
    bad_signatures: u64,
    /// Idempotency keys already charged.
    keys: HashSet<String>,
    /// Charges per (order, versi): more than one would be a double charge.
    charges: HashMap<(String, i64), u32>,
}

#[derive(Clone)]
struct Endpoint {
    secret: Secret,
    ledger: Arc<Mutex<Ledger>>,
}

/// The endpoint and dispatcher of one demo run.
pub struct DemoEffects {
    ledger: Arc<Mutex<Ledger>>,
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// The report line.
#[derive(Debug, Clone, Default)]
pub struct DemoReport {
    /// Applied `dibayar` versions: each should make one effect and one charge.
    pub paid_versions: i64,
    pub recorded: i64,
    pub sent: i64,
    pub dead_lettered: i64,
    pub pending: i64,
    pub requests: u64,
    pub charges: u64,
    pub double_charges: u64,
    pub bad_signatures: u64,
}

impl DemoReport {
    /// One effect and one charge per paid version, nothing left or refused.
    pub fn passed(&self) -> bool {
        self.recorded == self.paid_versions
            && self.sent == self.recorded
            && self.charges == u64::try_from(self.paid_versions).unwrap_or(0)
            && self.double_charges == 0
            && self.dead_lettered == 0
            && self.pending == 0
            && self.bad_signatures == 0
    }
}

impl fmt::Display for DemoReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "effects (dibayar → local payment endpoint): {} paid versions, {} effects recorded, \
             {} sent, {} dead-lettered, {} pending; endpoint: {} requests, {} charges, \
             {} double charges, {} bad signatures — {}",
            self.paid_versions,
            self.recorded,
            self.sent,
            self.dead_lettered,
            self.pending,
            self.requests,
            self.charges,
            self.double_charges,
            self.bad_signatures,
            if self.passed() { "OK" } else { "FAILED" }
        )
    }
}

impl DemoEffects {
    /// Starts the endpoint and a dispatcher, and routes `dibayar` to it
    /// (call before any event is applied).
    pub async fn start(db: &PgPool) -> anyhow::Result<Self> {
        let raw_secret = format!("demo-secret-{:032x}", rand::random::<u128>());
        let secret = Secret::parse(&raw_secret)?;
        let ledger = Arc::new(Mutex::new(Ledger::default()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/capture", listener.local_addr()?);
        let stop = CancellationToken::new();
        let app = Router::new()
            .route("/capture", post(capture))
            .with_state(Endpoint {
                secret: secret.clone(),
                ledger: ledger.clone(),
            });
        let server_stop = stop.clone();
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(server_stop.cancelled_owned())
                .await;
        });
        let settings = EffectsSettings {
            effects: Some(format!("{PAID}={url}")),
            effects_secret: Some(raw_secret),
            effects_poll: Duration::from_millis(50),
            ..EffectsSettings::default()
        };
        let config = settings.config()?;
        let dispatcher = Dispatcher::new(db.clone(), config, settings, None).await?;
        let dispatcher = tokio::spawn(dispatcher.run(stop.clone()));
        Ok(Self {
            ledger,
            stop,
            tasks: vec![dispatcher, server],
        })
    }

    /// Waits (at most `limit`) until no effect is pending, stops, and reports.
    pub async fn finish(self, db: &PgPool, limit: Duration) -> anyhow::Result<DemoReport> {
        let start = Instant::now();
        while start.elapsed() < limit && effects::store::pending(db).await? > 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.stop.cancel();
        for task in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(30), task).await;
        }
        let paid_versions = store::applied_with_status(db, PAID).await?;
        let effects::store::Tally {
            recorded,
            sent,
            dead_lettered,
            pending,
        } = effects::store::tally(db).await?;
        let ledger = self.ledger.lock().unwrap_or_else(|p| p.into_inner());
        Ok(DemoReport {
            paid_versions,
            recorded,
            sent,
            dead_lettered,
            pending,
            requests: ledger.requests,
            charges: ledger.charges.values().map(|n| u64::from(*n)).sum(),
            double_charges: ledger.charges.values().filter(|n| **n > 1).count() as u64,
            bad_signatures: ledger.bad_signatures,
        })
    }
}

/// The payment endpoint: checks the signature, charges once per key.
async fn capture(
    State(endpoint): State<Endpoint>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, &'static str) {
    let received = sign::Received::from_headers(&headers);
    let mut ledger = endpoint.ledger.lock().unwrap_or_else(|p| p.into_inner());
    ledger.requests += 1;
    if !received.signed_by(&endpoint.secret, &body) {
        ledger.bad_signatures += 1;
        return (StatusCode::UNAUTHORIZED, "bad signature");
    }
    if !ledger.keys.insert(received.id) {
        return (StatusCode::OK, "already captured"); // same key: the first result
    }
    let event: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let order = event["id"].as_str().unwrap_or("?").to_owned();
    let versi = event["versi"].as_i64().unwrap_or(0);
    *ledger.charges.entry((order, versi)).or_default() += 1;
    (StatusCode::OK, "captured")
}
