//! The effects' endpoint of a run: a payment API in miniature, served by
//! this process. Every applied version becomes one effect (`EFFECTS='*=…'`),
//! which `urutan effects` POSTs here. Like a payment API it keeps an
//! idempotency store: the first request with a key charges and its answer is
//! stored; a request with a key already answered gets the stored answer and
//! charges nothing (a resend). Each answer is held back 0-20 ms, so a
//! dispatcher killed at a random moment is often killed mid-request (the
//! charge made, the answer not yet read).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use rand::RngExt;
use tokio_util::sync::CancellationToken;
use urutan::effects::Secret;

/// The signing secret of the run's dispatchers (`EFFECTS_SECRET`).
pub const SECRET: &str = "faults-soak-webhook-secret-0123456789";

/// One charge, in the order the endpoint made them.
#[derive(Debug, Clone)]
pub struct Charge {
    pub key: String,
    pub order: String,
    pub versi: i64,
}

/// What the endpoint saw.
#[derive(Debug, Default, Clone)]
pub struct Book {
    pub charges: Vec<Charge>,
    /// Requests whose key was already answered (the dispatcher resent).
    pub resends: u64,
    /// Requests refused: a bad or missing signature, or no key.
    pub refused: u64,
    answered: HashMap<String, String>,
}

#[derive(Clone)]
struct Shared {
    book: Arc<Mutex<Book>>,
    secret: Arc<Secret>,
    in_flight: Arc<AtomicUsize>,
}

/// The running endpoint; stops when dropped.
pub struct Payee {
    /// The URL to route effects to.
    pub url: String,
    shared: Shared,
    stop: CancellationToken,
}

impl Payee {
    pub async fn start() -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/charge", listener.local_addr()?);
        let shared = Shared {
            book: Arc::default(),
            secret: Arc::new(Secret::parse(SECRET)?),
            in_flight: Arc::default(),
        };
        let app = Router::new()
            .route("/charge", post(charge))
            .with_state(shared.clone());
        let stop = crate::serve(listener, app);
        Ok(Self { url, shared, stop })
    }

    /// Requests being answered right now.
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::SeqCst)
    }

    pub fn book(&self) -> Book {
        self.shared
            .book
            .lock()
            .map(|b| b.clone())
            .unwrap_or_default()
    }
}

impl Drop for Payee {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn charge(State(s): State<Shared>, headers: HeaderMap, body: Bytes) -> (StatusCode, String) {
    s.in_flight.fetch_add(1, Ordering::SeqCst);
    let _in_flight = InFlight(s.in_flight.clone());
    let received = urutan::effects::sign::Received::from_headers(&headers);
    let signed = received.signed_by(&s.secret, &body);
    let key = received.id;
    let answer = {
        let Ok(mut book) = s.book.lock() else {
            return (StatusCode::INTERNAL_SERVER_ERROR, "book poisoned".into());
        };
        if !signed || key.is_empty() || received.idempotency_key != key {
            book.refused += 1;
            return (StatusCode::UNAUTHORIZED, "bad signature or key".into());
        }
        if let Some(first) = book.answered.get(&key) {
            let first = first.clone();
            book.resends += 1;
            first
        } else {
            let event: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            book.charges.push(Charge {
                key: key.clone(),
                order: event["id"].as_str().unwrap_or("?").to_owned(),
                versi: event["versi"].as_i64().unwrap_or(0),
            });
            let receipt = format!("receipt {}", book.charges.len());
            book.answered.insert(key, receipt.clone());
            receipt
        }
    };
    let hold = rand::rng().random_range(0..=20);
    tokio::time::sleep(Duration::from_millis(hold)).await;
    (StatusCode::OK, answer)
}
