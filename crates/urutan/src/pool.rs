//! The entry point of an embedded pool: what `urutan run` does, with the
//! team's [`Handler`] in every worker, from the team's own `main`.
//!
//! ```no_run
//! # struct Stock;
//! # impl urutan::Handler for Stock {
//! #     async fn handle(&self, _: &mut sqlx::PgConnection, _: &urutan::HandlerEvent)
//! #         -> Result<(), urutan::HandlerError> { Ok(()) }
//! # }
//! # async fn start() -> Result<(), Box<dyn std::error::Error>> {
//! urutan::Pool::from_env()?.handler(Stock).run().await?;
//! # Ok(()) }
//! ```

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::config::Settings;
use crate::handler::{Handler, SharedHandler};
use crate::heal::WrongSetting;
use crate::shard::Hooks;
use crate::supervisor::{RunError, Supervisor};

/// A worker pool to run: its settings, the team's handler, and what stops
/// it (SIGTERM, SIGINT or SIGHUP unless [`Self::shutdown_on`] says).
#[must_use = "a pool does nothing until `run` is awaited"]
pub struct Pool {
    settings: Settings,
    handler: Option<SharedHandler>,
    hooks: Hooks,
    shutdown: Option<CancellationToken>,
}

impl Pool {
    /// A pool with `settings` (start from `Settings::default()` or
    /// [`Settings::from_env`]).
    pub fn new(settings: Settings) -> Self {
        Self {
            settings,
            handler: None,
            hooks: Hooks::default(),
            shutdown: None,
        }
    }

    /// A pool with the settings `urutan run` reads from the environment
    /// ([`Settings::from_env`]); `Err` is one line naming the variable.
    pub fn from_env() -> Result<Self, WrongSetting> {
        Ok(Self::new(Settings::from_env()?))
    }

    /// Calls `handler` in the apply transaction of every applied version
    /// (docs/contract.md section 10), besides any `HANDLER_FUNCTION`.
    pub fn handler(self, handler: impl Handler) -> Self {
        self.shared_handler(Arc::new(handler))
    }

    /// [`Self::handler`] with a handler shared with other code (an
    /// `Arc<YourHandler>` is one).
    pub fn shared_handler(mut self, handler: SharedHandler) -> Self {
        self.handler = Some(handler);
        self
    }

    /// Stops when `shutdown` is cancelled instead of on a signal.
    pub fn shutdown_on(mut self, shutdown: CancellationToken) -> Self {
        self.shutdown = Some(shutdown);
        self
    }

    /// Fault-injection and observation hooks in every worker: for tests,
    /// crash drills and the demo, never for production.
    #[doc(hidden)]
    pub fn with_hooks(mut self, hooks: Hooks) -> Self {
        self.hooks = hooks;
        self
    }

    /// The settings it runs with.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Runs the pool (migrations, topology, one worker per shard this
    /// replica is placed on, `/metrics`, `/healthz`, `/readyz` on
    /// `METRICS_ADDR`) until shutdown, then finishes and acks the in-flight
    /// messages and returns. Outages of the broker or the database are
    /// waited out; `Err` is only what a restart cannot fix (a setting, a
    /// refused login, a port in use). Logs go through `tracing`: install a
    /// subscriber first (`urutan::telemetry::init` is the command line's).
    pub async fn run(self) -> Result<(), RunError> {
        let Self {
            settings,
            handler,
            hooks,
            shutdown,
        } = self;
        for contradiction in settings.contradictions() {
            warn!("{contradiction}");
        }
        let traces = settings.traces.clone();
        let mut supervisor = Supervisor::build_with_hooks(settings, hooks).await?;
        if let Some(handler) = handler {
            supervisor = supervisor.with_handler(handler);
        }
        info!(http = %supervisor.http_addr(), "urutan run starting");
        let shutdown = shutdown.unwrap_or_else(|| {
            let shutdown = CancellationToken::new();
            tokio::spawn(stop_on_signal(shutdown.clone()));
            shutdown
        });
        let result = supervisor.run(shutdown).await;
        // The spans still queued are sent before returning (blocking: off
        // the async runtime's threads).
        if traces.is_on() {
            let _ = tokio::task::spawn_blocking(move || traces.shutdown()).await;
        }
        if result.is_ok() {
            info!("stopped cleanly");
        }
        result
    }
}

/// Runs a pool with `settings` and `handler` until SIGTERM, SIGINT or
/// SIGHUP: [`Pool::run`].
pub async fn run(settings: Settings, handler: impl Handler) -> Result<(), RunError> {
    Pool::new(settings).handler(handler).run().await
}

/// Cancels `shutdown` on the first SIGTERM, SIGINT or SIGHUP (each a
/// clean stop, docs/contract.md section 6), and logs which came.
pub async fn stop_on_signal(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    ) else {
        error!("cannot listen for signals; stop with SIGKILL");
        return;
    };
    let name = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
        _ = hup.recv() => "SIGHUP",
    };
    info!("{name}: stopping; finishing in-flight messages");
    shutdown.cancel();
}
