//! `urutan effects`: checks `EFFECTS`, serves the HTTP endpoints and
//! dispatches webhooks until a signal.

use anyhow::Context;
use tokio_util::sync::CancellationToken;
use tracing::info;
use urutan::config::Settings;
use urutan::effects::{Dispatcher, EffectsSettings, after_send_from_env};
use urutan::heal::WrongSetting;
use urutan::store;

pub const HELP: &str = "\
Several dispatchers may run; none sends an effect twice at the same time. The
dispatcher started last writes its EFFECTS as the routes in force.

Examples:
  EFFECTS='dibayar=https://pay.internal/capture;*=https://search.internal/index' \\
  EFFECTS_SECRET=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw urutan effects
  urutan dlq list --effects                   # dead-lettered effects
  urutan dlq replay --effects --all           # send them again, same keys";

pub async fn run(settings: Settings, effects: EffectsSettings) -> anyhow::Result<()> {
    // A bad setting is one line and exit 2.
    let config = effects.config().map_err(|e| WrongSetting(e.to_string()))?;
    let after_send = after_send_from_env()?;
    let listener = tokio::net::TcpListener::bind(settings.metrics_addr)
        .await
        .with_context(|| format!("cannot listen on METRICS_ADDR {}", settings.metrics_addr))?;
    let size = effects.effects_concurrency.min(16) + 2;
    let pool = store::prepare(&settings.schema_url(), size)
        .await
        .with_context(|| format!("cannot open {}", settings.database_url))?;
    info!(http = %listener.local_addr()?, "urutan effects starting");
    let metrics = urutan::metrics::install();
    let dispatcher = Dispatcher::new(pool.clone(), config, effects, after_send)
        .await?
        .with_traces(settings.traces.clone());
    let shutdown = CancellationToken::new();
    tokio::spawn(super::stop_on_signal(shutdown.clone()));
    let http = tokio::spawn(urutan::effects::http::serve(
        listener,
        metrics,
        dispatcher.ready.clone(),
        shutdown.clone(),
    ));
    dispatcher.run(shutdown).await;
    let _ = http.await;
    pool.close().await;
    info!("effects dispatcher stopped cleanly");
    Ok(())
}
