//! One `urutan` child process, as the fault engine (`benches/faults/`) and
//! the benchmarks (`benches/e2e/`) run it: its own HTTP port (`/readyz`,
//! `/metrics`), its log in a file, signals by name, a bounded stop.
//! Dropping it SIGKILLs it. The fault engine adds its methods in an
//! `impl Urutan` block (`faults::procs`).
//!
//! Every process still running is listed, so a signal handler can stop
//! what a run leaves when it is cut short ([`kill_alive`]).

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// The pids of the processes started and not yet dropped.
static ALIVE: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// One `urutan <command>` child process.
pub struct Urutan {
    /// `worker-3`, `relay-1`...: for logs and reports.
    pub name: String,
    pub pid: u32,
    /// Where its `/metrics`, `/healthz` and `/readyz` are (`METRICS_ADDR`).
    pub http: SocketAddr,
    /// Its stdout and stderr.
    pub log: PathBuf,
    child: tokio::process::Child,
}

impl Urutan {
    /// Starts `bin args…` with `env` on top of the inherited environment,
    /// `METRICS_ADDR` on a free port and `NO_COLOR`, writing its output to
    /// `log` (its directory is made).
    pub fn spawn<K: AsRef<str>, V: AsRef<str>>(
        bin: &Path,
        name: &str,
        args: &[&str],
        env: &[(K, V)],
        log: PathBuf,
    ) -> anyhow::Result<Self> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("find a free port")?
            .port();
        let http = SocketAddr::from(([127, 0, 0, 1], port));
        if let Some(dir) = log.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        }
        let out = std::fs::File::create(&log).with_context(|| format!("{}", log.display()))?;
        let child = tokio::process::Command::new(bin)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k.as_ref(), v.as_ref())))
            .env("METRICS_ADDR", http.to_string())
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::from(out.try_clone()?))
            .stderr(Stdio::from(out))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("spawn {} {args:?}", bin.display()))?;
        let pid = child.id().context("the child exited at once")?;
        if let Ok(mut alive) = ALIVE.lock() {
            alive.push(pid);
        }
        Ok(Self {
            name: name.to_owned(),
            pid,
            http,
            log,
            child,
        })
    }

    /// The exit status if it has exited (never blocks).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Fails if it has exited, with the tail of its log.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        match self.exited() {
            Some(status) => bail!(
                "{} exited early ({status}); log tail:\n{}",
                self.name,
                self.tail()
            ),
            None => Ok(()),
        }
    }

    /// Waits until `/readyz` answers 200; fails if it exits or `limit` passes.
    pub async fn wait_ready(&mut self, limit: Duration) -> anyhow::Result<()> {
        let start = Instant::now();
        loop {
            if crate::http::get(self.http, "/readyz", Duration::from_secs(2))
                .await
                .0
                == 200
            {
                return Ok(());
            }
            self.check_alive()?;
            if start.elapsed() > limit {
                bail!(
                    "{} not ready after {limit:?}; log tail:\n{}",
                    self.name,
                    self.tail()
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

    /// SIGTERM, then waits (at most `limit`) for it to exit; SIGKILL and
    /// an error after that.
    pub async fn stop(&mut self, limit: Duration) -> anyhow::Result<ExitStatus> {
        if let Some(status) = self.exited() {
            return Ok(status);
        }
        self.signal("TERM")?;
        match self.wait_exit(limit).await {
            Some(status) => Ok(status),
            None => {
                self.kill().await;
                bail!(
                    "{} did not stop within {limit:?} of SIGTERM (killed)",
                    self.name
                )
            }
        }
    }

    /// The last lines of its log.
    pub fn tail(&self) -> String {
        tail(&self.log)
    }
}

impl Drop for Urutan {
    fn drop(&mut self) {
        // `kill_on_drop` ends a still-running child right after this.
        if let Ok(mut alive) = ALIVE.lock() {
            alive.retain(|p| *p != self.pid);
        }
    }
}

/// SIGKILLs every process still running (a run cut short by a signal).
pub fn kill_alive() {
    let alive = ALIVE.lock().map(|a| a.clone()).unwrap_or_default();
    for pid in alive {
        sigkill(pid);
    }
}

/// SIGKILL to `pid` (with `kill`; a process already gone is fine).
pub fn sigkill(pid: u32) {
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .output();
}

/// The last 15 lines of a log file, for error messages.
pub fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}
