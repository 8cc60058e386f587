//! Logs: text for people, JSON for machines; level from `RUST_LOG` (default `info`).
//! Spans carry shard, message id, entity id and redelivered; never a payload or secret.

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Without `RUST_LOG`: info, minus two lapin logs: channel-closed errors
/// (the topology probe closes a channel on purpose; real failures are logged
/// by us) and returned messages (they print the payload; the relay logs the
/// outbox id instead).
const DEFAULT_FILTER: &str = "info,lapin::channel=off,lapin::returned_messages=off";

/// Installs the global subscriber (once; later calls are ignored).
pub fn init(format: LogFormat) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}
