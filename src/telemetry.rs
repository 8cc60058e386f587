//! Logs: text for people, JSON for machines; level from `RUST_LOG` (default `info`).
//! Spans carry shard, message id, entity id and redelivered; never a payload or secret.

use tracing::Metadata;
use tracing::level_filters::LevelFilter;
use tracing_subscriber::filter::{EnvFilter, FilterExt, filter_fn};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, fmt};

use crate::config::LogFormat;

/// Without `RUST_LOG`: info, minus lapin's channel-closed errors (the
/// topology probe closes a channel on purpose; real failures are logged by us).
const DEFAULT_FILTER: &str = "info,lapin::channel=off";

/// Logs that would print a payload or a password whatever `RUST_LOG` asks:
/// lapin's returned messages (the whole message) and lapin's TRACE frame
/// dumps (bodies, and the SASL response that holds the broker password).
fn may_leak(meta: &Metadata<'_>) -> bool {
    let target = meta.target();
    target.starts_with("lapin::returned_messages")
        || (target.starts_with("lapin") && *meta.level() == tracing::Level::TRACE)
}

/// Installs the global subscriber (once; later calls are ignored).
pub fn init(format: LogFormat) {
    let env = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    // The hint keeps the combined filter from disabling every level.
    let safe = filter_fn(|meta| !may_leak(meta)).with_max_level_hint(LevelFilter::TRACE);
    let filter = env.and(safe);
    let layer = match format {
        LogFormat::Text => fmt::layer().with_writer(std::io::stderr).boxed(),
        LogFormat::Json => fmt::layer()
            .json()
            .flatten_event(true)
            .with_writer(std::io::stderr)
            .boxed(),
    };
    let _ = tracing_subscriber::registry()
        .with(layer.with_filter(filter))
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lapin_payload_logs_are_always_filtered() {
        use tracing::callsite::Identifier;
        struct Cs;
        impl tracing::Callsite for Cs {
            fn set_interest(&self, _: tracing::subscriber::Interest) {}
            fn metadata(&self) -> &Metadata<'_> {
                unreachable!()
            }
        }
        static CS: Cs = Cs;
        let meta = |target: &'static str, level| {
            Metadata::new(
                "e",
                target,
                level,
                None,
                None,
                None,
                tracing::field::FieldSet::new(&[], Identifier(&CS)),
                tracing::metadata::Kind::EVENT,
            )
        };
        assert!(may_leak(&meta(
            "lapin::returned_messages",
            tracing::Level::WARN
        )));
        assert!(may_leak(&meta("lapin::io_loop", tracing::Level::TRACE)));
        assert!(!may_leak(&meta("lapin::io_loop", tracing::Level::DEBUG)));
        assert!(!may_leak(&meta("urutan::shard", tracing::Level::TRACE)));
    }
}
