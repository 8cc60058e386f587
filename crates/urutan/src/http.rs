//! HTTP endpoints (docs/contract.md, section 7): `/metrics`, `/healthz`, `/readyz`,
//! served by [`serve_router`] with bounded connections (the worker pool, the
//! relay, the effects dispatcher and `urutan console` all serve through it).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, State};
use axum::http::StatusCode;
use axum::routing::get;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, warn};

use crate::health::Health;

/// What one client may hold of the endpoints. The probes and the scraper
/// need a few connections; anyone else who can reach the port must not be
/// able to starve them of descriptors or keep a connection forever.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Time to send a request's headers, counted from the connection being
    /// ready for the next request: a half-sent request, and an idle
    /// keep-alive connection, are closed after it.
    pub header_timeout: Duration,
    /// Longest any connection lives, requests included.
    pub max_lifetime: Duration,
    /// Connections open at once; the oldest is closed to admit a new one,
    /// so a flood of idle connections never locks out a probe.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(5),
            max_lifetime: Duration::from_secs(60),
            max_connections: 64,
        }
    }
}

#[derive(Clone)]
struct AppState {
    metrics: PrometheusHandle,
    health: Arc<Health>,
}

/// Serves the endpoints on `listener` until `stop`.
pub async fn serve(
    listener: TcpListener,
    metrics: PrometheusHandle,
    health: Arc<Health>,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(render_metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .with_state(AppState { metrics, health });
    serve_router(listener, app, Limits::default(), stop).await
}

/// The open connections, oldest first, so the oldest can be closed.
type Open = Arc<Mutex<VecDeque<(u64, AbortHandle)>>>;

/// Serves `app` on `listener` within `limits` until `stop`, then waits at
/// most `limits.header_timeout` for the connections still open. The accept
/// loop never waits for a connection: at the cap it closes the oldest.
/// Each request carries its peer's address as axum's
/// `ConnectInfo<SocketAddr>` (the console audits and rate-limits by it).
pub async fn serve_router(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let open: Open = Arc::default();
    let tracker = TaskTracker::new();
    let mut next_id = 0u64;
    loop {
        let (stream, peer) = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // EMFILE and the like: pause instead of spinning.
                    warn!(error = %e, "cannot accept an HTTP connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        next_id += 1;
        let id = next_id;
        let with_peer = axum::Extension(ConnectInfo::<SocketAddr>(peer));
        let service = TowerToHyperService::new(tower_layer::Layer::layer(&with_peer, app.clone()));
        let conn_open = open.clone();
        let conn_stop = stop.clone();
        // Held across the spawn, so the task's own removal comes after its insertion.
        let mut open = open.lock().unwrap_or_else(PoisonError::into_inner);
        while open.len() >= limits.max_connections.max(1) {
            if let Some((_, oldest)) = open.pop_front() {
                oldest.abort();
            }
        }
        let task = tracker.spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            let ended = tokio::select! {
                r = conn.as_mut() => r,
                () = tokio::time::sleep(limits.max_lifetime) => Ok(()),
                () = conn_stop.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    tokio::time::timeout(limits.header_timeout, conn).await.unwrap_or(Ok(()))
                }
            };
            if let Err(e) = ended {
                debug!(error = %e, "HTTP connection ended");
            }
            let mut open = conn_open.lock().unwrap_or_else(PoisonError::into_inner);
            open.retain(|(other, _)| *other != id);
        });
        open.push_back((id, task.abort_handle()));
    }
    tracker.close();
    tracker.wait().await;
    Ok(())
}

async fn render_metrics(State(state): State<AppState>) -> String {
    state.health.report();
    crate::metrics::render(&state.metrics)
}

async fn ready(State(state): State<AppState>) -> (StatusCode, &'static str) {
    if state.health.report() {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}
