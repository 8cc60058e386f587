//! The real `urutan run` / `urutan relay` / `urutan effects` processes of a
//! run (the shared child-process type, `urutan_testkit::process`), all
//! spawned from one pinned binary.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;

/// The `urutan` binary as built: `URUTAN_BIN`, else the one cargo built with
/// this target (release under `cargo bench`, debug under `cargo test`).
fn built_binary() -> PathBuf {
    crate::binary()
}

static FROZEN: std::sync::Mutex<Option<PathBuf>> = std::sync::Mutex::new(None);

/// The binary every process of the run is spawned from: the frozen one
/// while a [`Frozen`] lives, else the built one.
pub fn binary() -> PathBuf {
    FROZEN
        .lock()
        .ok()
        .and_then(|f| f.clone())
        .unwrap_or_else(built_binary)
}

/// Pins the run to the binary as it is now: every restart spawns it again,
/// and a build during a long soak must not swap the code (and its
/// migrations) under the fleet half-way. A hard link keeps the old file when
/// cargo replaces the built one; removed when dropped.
pub struct Frozen(PathBuf);

pub fn freeze_binary() -> anyhow::Result<Frozen> {
    let built = built_binary();
    let frozen = std::env::temp_dir().join(format!("urutan-faults-{}", std::process::id()));
    let _ = std::fs::remove_file(&frozen);
    std::fs::hard_link(&built, &frozen)
        .or_else(|_| std::fs::copy(&built, &frozen).map(drop))
        .with_context(|| format!("pin {} as {}", built.display(), frozen.display()))?;
    if let Ok(mut f) = FROZEN.lock() {
        *f = Some(frozen.clone());
    }
    Ok(Frozen(frozen))
}

impl Drop for Frozen {
    fn drop(&mut self) {
        if let Ok(mut f) = FROZEN.lock() {
            *f = None;
        }
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A process of the run's fleet.
pub use crate::process::Urutan as Proc;

impl Proc {
    /// Starts `urutan <command>` (the run's binary) as `name`, with `env` on
    /// top of the inherited environment, logging to `<log_dir>/<name>.log`.
    pub fn start(
        name: &str,
        command: &str,
        env: &[(String, String)],
        log_dir: &Path,
    ) -> anyhow::Result<Self> {
        let log = log_dir.join(format!("{name}.log"));
        Self::spawn(&binary(), name, &[command], env, log)
    }

    /// The sum of `urutan_messages_total` over every shard and outcome, if
    /// the process answers.
    pub async fn messages_total(&self) -> Option<f64> {
        let (status, body) = crate::http::get(self.http, "/metrics", Duration::from_secs(3)).await;
        (status == 200).then(|| metric_sum(&body, "urutan_messages_total"))
    }
}

/// The sum of every sample of metric `name` in a Prometheus scrape.
fn metric_sum(scrape: &str, name: &str) -> f64 {
    scrape
        .lines()
        .filter(|l| l.split(['{', ' ']).next() == Some(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
