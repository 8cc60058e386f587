//! HTTP endpoints (docs/contract.md, section 7): `/metrics`, `/healthz`, `/readyz`.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::health::Health;

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
    axum::serve(listener, app)
        .with_graceful_shutdown(stop.cancelled_owned())
        .await
}

async fn render_metrics(State(state): State<AppState>) -> String {
    state.health.report();
    state.metrics.run_upkeep();
    state.metrics.render()
}

async fn ready(State(state): State<AppState>) -> (StatusCode, &'static str) {
    if state.health.report() {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}
