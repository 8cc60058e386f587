//! urutan's dev-only test kit, shared by the integration tests (`tests/`)
//! and the benchmarks (`benches/`) of the root package:
//!
//! - environments: [`scratch`] (a vhost and a database of one's own),
//!   [`fixtures`] (the integration tests' `TestEnv`, publishers, workers),
//!   [`bench_env`] (the benchmarks' `BenchEnv`), [`scenarios`] (steps
//!   several integration-test files share);
//! - processes: [`process`] (one `urutan` child), [`http`] (a tiny GET)
//!   and [`psql`] (`psql` as the local superuser);
//! - reports: [`markdown`] (the rows of the Markdown tables);
//! - the AMQP wire: [`wire`] (hand-built frames of a hostile producer) and
//!   [`proxy`] (a TCP proxy that can cut, stall or delay a link);
//! - models and engines: [`interleave`] (the interleaving model) and
//!   [`faults`] (the fault-injection engine of `tests/faults.rs`,
//!   `tests/cluster.rs` and `benches/faults.rs`).

use std::path::PathBuf;

pub mod bench_env;
pub mod faults;
pub mod fixtures;
pub mod http;
pub mod interleave;
pub mod markdown;
pub mod process;
pub mod proxy;
pub mod psql;
pub mod scenarios;
pub mod scratch;
pub mod wire;

/// The running test or bench executable's profile directory
/// (`target/<profile>`; cargo puts them in `target/<profile>/deps`).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the current executable");
    let deps = exe.parent().expect("the executable's directory");
    deps.parent().unwrap_or(deps).to_path_buf()
}

/// The `urutan` binary cargo built next to the running test or bench (what
/// `CARGO_BIN_EXE_urutan` names there: cargo builds the package's binaries
/// before its integration tests and benchmarks).
pub fn cargo_binary() -> PathBuf {
    profile_dir().join("urutan")
}

/// `URUTAN_BIN`, else [`cargo_binary`].
pub fn binary() -> PathBuf {
    std::env::var_os("URUTAN_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(cargo_binary)
}

/// Scratch space for a run's files, as `CARGO_TARGET_TMPDIR` (`target/tmp`).
pub fn target_tmpdir() -> PathBuf {
    let profile = profile_dir();
    let target = profile.parent().unwrap_or(&profile).to_path_buf();
    let dir = target.join("tmp");
    std::fs::create_dir_all(&dir).expect("create target/tmp");
    dir
}

/// The repository's HEAD commit, short (`git rev-parse --short HEAD`), for a
/// report to say what it measured; empty when git cannot tell.
pub fn commit() -> String {
    std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// Serves `app` on `listener` (a test's HTTP endpoint) in a task of its own
/// until the returned token is cancelled.
pub fn serve(
    listener: tokio::net::TcpListener,
    app: axum::Router,
) -> tokio_util::sync::CancellationToken {
    let stop = tokio_util::sync::CancellationToken::new();
    let until = stop.clone();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(until.cancelled_owned())
            .await;
    });
    stop
}
