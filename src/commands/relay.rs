//! `urutan relay`: serves the HTTP endpoints and publishes the outbox with
//! publisher confirms until a signal.

use std::sync::Arc;

use anyhow::Context;
use tokio_util::sync::CancellationToken;
use tracing::info;
use urutan::config::Settings;
use urutan::health::{Health, Role};
use urutan::outbox::relay::{Relay, RelaySettings, after_publish_from_env};

pub const HELP: &str = "\
Several relays may run: one publishes (it holds a database lock), the others stand by.

Examples:
  urutan relay
  RELAY_BATCH=500 urutan relay";

pub async fn run(settings: Settings, relay: RelaySettings) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(settings.metrics_addr)
        .await
        .with_context(|| format!("cannot listen on METRICS_ADDR {}", settings.metrics_addr))?;
    info!(http = %listener.local_addr()?, "urutan relay starting");
    let shutdown = CancellationToken::new();
    tokio::spawn(super::stop_on_signal(shutdown.clone()));
    let health = Arc::new(Health::new(Role::Relay));
    let metrics = urutan::metrics::install();
    urutan::metrics::register_relay();
    let http = tokio::spawn(urutan::http::serve(
        listener,
        metrics,
        health.clone(),
        shutdown.clone(),
    ));
    let relayed = Relay {
        settings,
        relay,
        after_publish: after_publish_from_env(),
        health,
    }
    .run_checked(shutdown.clone())
    .await;
    shutdown.cancel();
    let _ = http.await;
    relayed?;
    info!("relay stopped cleanly");
    Ok(())
}
