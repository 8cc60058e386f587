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
