//! The `urutan` commands that do more than call one library function, one
//! module each: they open what the command needs, run it, and say how it
//! ended. The others (`dlq`, `status`, `explain`) are a call into the
//! library; `demo` has its own module beside this one.

pub mod effects;
pub mod migrate;
pub mod relay;
pub mod run;
pub mod topology;
pub mod verify;

use tokio_util::sync::CancellationToken;
use tracing::{error, info};

/// Cancels `shutdown` on the first SIGTERM or SIGINT.
pub async fn stop_on_signal(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        error!("cannot listen for signals; stop with SIGKILL");
        return;
    };
    tokio::select! {
        _ = term.recv() => info!("SIGTERM: finishing in-flight messages"),
        _ = int.recv() => info!("SIGINT: finishing in-flight messages"),
    }
    shutdown.cancel();
}
