//! `/metrics`, `/healthz` and `/readyz` of `urutan effects` (ready: the
//! database answered the dispatcher's last claim; no broker is involved).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Serves the endpoints on `listener` until `stop`.
pub async fn serve(
    listener: TcpListener,
    metrics: PrometheusHandle,
    ready: Arc<AtomicBool>,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let app = Router::new()
        .route(
            "/metrics",
            get({
                let ready = ready.clone();
                move || {
                    report(&ready);
                    let metrics = metrics.clone();
                    async move { crate::metrics::render(&metrics) }
                }
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || {
                let up = report(&ready);
                async move {
                    if up {
                        (StatusCode::OK, "ready\n")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
                    }
                }
            }),
        );
    crate::http::serve_router(listener, app, crate::http::Limits::default(), stop).await
}

/// Whether the dispatcher is ready, also set as `urutan_ready{role="effects"}`.
fn report(ready: &AtomicBool) -> bool {
    let up = ready.load(Ordering::Relaxed);
    metrics::gauge!(crate::metrics::READY, "role" => "effects").set(if up { 1.0 } else { 0.0 });
    up
}
