//! The real `urutan run` / `urutan relay` processes of a run: spawned with
//! their environment, stderr in a log file, killed and reaped when dropped.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// The `urutan` binary as built: `URUTAN_BIN`, else the one cargo built with
/// this target (release under `cargo bench`, debug under `cargo test`).
fn built_binary() -> PathBuf {
    std::env::var_os("URUTAN_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_urutan")))
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

/// One child process. Dropping it sends SIGKILL (tokio's `kill_on_drop`).
pub struct Proc {
    /// `worker-3`, `relay-1`...: for logs and the report.
    pub name: String,
    pub http: SocketAddr,
    pub log: PathBuf,
    child: tokio::process::Child,
    pid: u32,
}

impl Proc {
    /// Starts `urutan <command>` with `env` on top of the inherited environment
    /// and `METRICS_ADDR` on a free port.
    pub fn spawn(
        name: &str,
        command: &str,
        env: &[(String, String)],
        log_dir: &Path,
    ) -> anyhow::Result<Self> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("find a free port")?
            .port();
        let http = SocketAddr::from(([127, 0, 0, 1], port));
        let log = log_dir.join(format!("{name}.log"));
        let stderr = std::fs::File::create(&log).context("create a process log")?;
        let child = tokio::process::Command::new(binary())
            .arg(command)
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env("METRICS_ADDR", http.to_string())
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(stderr))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("spawn {} {command}", binary().display()))?;
        let pid = child.id().context("the child has no pid")?;
        Ok(Self {
            name: name.to_owned(),
            http,
            log,
            child,
            pid,
        })
    }

    /// The exit status if it has exited (never blocks).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits until `/readyz` answers 200; fails if it exits or `limit` passes.
    pub async fn wait_ready(&mut self, limit: Duration) -> anyhow::Result<()> {
        let start = Instant::now();
        loop {
            if http_get(self.http, "/readyz").await.0 == 200 {
                return Ok(());
            }
            if let Some(status) = self.exited() {
                bail!(
                    "{} exited early ({status}); see {}",
                    self.name,
                    self.log.display()
                );
            }
            if start.elapsed() > limit {
                bail!(
                    "{} not ready after {limit:?}; see {}",
                    self.name,
                    self.log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Sends a signal by name (`TERM`, `USR1`, ...) with `kill`.
    pub fn signal(&self, name: &str) -> anyhow::Result<()> {
        let out = std::process::Command::new("kill")
            .args(["-s", name, &self.pid.to_string()])
            .output()
            .context("run kill")?;
        anyhow::ensure!(out.status.success(), "kill -s {name} {} failed", self.pid);
        Ok(())
    }

    /// SIGKILL, then reap.
    pub async fn kill(&mut self) {
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
    }

    /// Waits (at most `limit`) for it to exit.
    pub async fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        tokio::time::timeout(limit, self.child.wait())
            .await
            .ok()
            .and_then(Result::ok)
    }

    /// The sum of `urutan_messages_total` over every shard and outcome, if
    /// the process answers.
    pub async fn messages_total(&self) -> Option<f64> {
        let (status, body) = http_get(self.http, "/metrics").await;
        (status == 200).then(|| metric_sum(&body, "urutan_messages_total"))
    }
}

#[path = "../../tests/support/http.rs"]
mod http;

/// A tiny HTTP/1.0 GET, bounded by 3 s: (status, body); status 0 on failure.
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    http::get(addr, path, Duration::from_secs(3)).await
}

/// The sum of every sample of metric `name` in a Prometheus scrape.
fn metric_sum(scrape: &str, name: &str) -> f64 {
    scrape
        .lines()
        .filter(|l| l.split(['{', ' ']).next() == Some(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
