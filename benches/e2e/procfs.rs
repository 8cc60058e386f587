//! The worker as a measured process: start `urutan run` with a scenario's
//! settings, read its CPU time and memory from `/proc`, stop it with SIGTERM
//! (bounded), and describe the machine.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use urutan_testkit::psql;

use crate::env::{BenchEnv, OWNER_VAR};

/// One reading of a process's counters.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcSample {
    /// utime + stime of all its threads, in clock ticks.
    pub cpu_ticks: u64,
    pub rss_kib: u64,
    /// Peak resident set size so far (`VmHWM`).
    pub hwm_kib: u64,
}

/// Reads `/proc/<pid>/stat` and `/proc/<pid>/status`; `None` once it is gone.
pub fn sample(pid: u32) -> Option<ProcSample> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, cpu_ticks, _) = stat_ticks(&stat)?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = |key: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    Some(ProcSample {
        cpu_ticks,
        rss_kib: kib("VmRSS:"),
        hwm_kib: kib("VmHWM:"),
    })
}

/// CPU time used so far by the services the drains share the machine with,
/// in clock ticks: the broker (every `beam.smp`) and the database (every
/// `postgres` process, plus what the postmaster's exited children used).
#[derive(Debug, Clone, Copy, Default)]
pub struct ServiceCpu {
    pub broker: u64,
    pub database: u64,
    /// This process (the bench: the ceilings' consumers and apply tasks).
    pub bench: u64,
}

/// The command name, utime + stime, and cutime + cstime (exited, waited-for
/// children) from a `/proc/<pid>/stat` line (the name may hold spaces and
/// parentheses, so the fields are read after its last `)`).
fn stat_ticks(stat: &str) -> Option<(String, u64, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat[open + 1..close].to_owned();
    let fields: Vec<u64> = stat[close + 2..]
        .split_whitespace()
        .skip(11)
        .take(4)
        .filter_map(|f| f.parse().ok())
        .collect();
    let [utime, stime, cutime, cstime] = fields[..] else {
        return None;
    };
    Some((comm, utime + stime, cutime + cstime))
}

/// Reads every process's `/proc/<pid>/stat` once (a few milliseconds):
/// call it at the edges of a drain, not in a poll loop.
pub fn service_cpu() -> ServiceCpu {
    let mut cpu = ServiceCpu::default();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return cpu;
    };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Some((comm, own, children)) = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| stat_ticks(&s))
        else {
            continue;
        };
        if pid == std::process::id() {
            cpu.bench += own;
        } else if comm == "beam.smp" {
            cpu.broker += own;
        } else if comm == "postgres" {
            // The postmaster's children are the backends: count the ones
            // that exited during the drain through its cumulative fields.
            cpu.database += own + children;
        }
    }
    cpu
}

/// CPU per message drained, in µs, split by process: the consumer (the
/// worker, or the bench itself for a ceiling), the broker and the database.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct CpuSplit {
    pub consumer_us: f64,
    pub broker_us: f64,
    pub database_us: f64,
}

impl CpuSplit {
    /// Between two readings, over `messages`; `consumer` ticks come from
    /// the worker process (`Some`) or else from the bench's own.
    pub fn between(
        a: ServiceCpu,
        b: ServiceCpu,
        consumer: Option<(u64, u64)>,
        messages: usize,
    ) -> Self {
        let hz = clock_ticks();
        let per =
            |t0: u64, t1: u64| t1.saturating_sub(t0) as f64 / hz * 1e6 / messages.max(1) as f64;
        let (c0, c1) = consumer.unwrap_or((a.bench, b.bench));
        Self {
            consumer_us: per(c0, c1),
            broker_us: per(a.broker, b.broker),
            database_us: per(a.database, b.database),
        }
    }

    pub fn total_us(&self) -> f64 {
        self.consumer_us + self.broker_us + self.database_us
    }
}

/// Clock ticks per second (`getconf CLK_TCK`, 100 on Linux).
pub fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// Whole-machine CPU counters from `/proc/stat`: (busy, total) jiffies.
pub fn host_cpu() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3)? + v.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

/// Share of the machine's CPU that was busy between two `host_cpu` readings.
pub fn busy_share(a: Option<(u64, u64)>, b: Option<(u64, u64)>) -> Option<f64> {
    let ((b0, t0), (b1, t1)) = (a?, b?);
    (t1 > t0).then(|| (b1 - b0) as f64 / (t1 - t0) as f64)
}

/// A running `urutan run` process (killed if dropped while running): the
/// shared child-process type (`urutan_testkit::process`).
pub use crate::process::Urutan as Worker;

/// Starts `bin run` on `env` with `SHARD_COUNT`/`PREFETCH`, logging (at
/// warn) to `log`.
pub fn start_worker(
    bin: &Path,
    env: &BenchEnv,
    shards: u16,
    prefetch: u16,
    log: PathBuf,
) -> anyhow::Result<Worker> {
    start_worker_with(bin, env, shards, prefetch, &[], log)
}

/// [`start_worker`] with more environment variables (e.g. `BATCH_MAX`).
pub fn start_worker_with(
    bin: &Path,
    env: &BenchEnv,
    shards: u16,
    prefetch: u16,
    extra: &[(&str, String)],
    log: PathBuf,
) -> anyhow::Result<Worker> {
    let mut vars = vec![
        ("AMQP_URL", env.amqp_url().expose().to_owned()),
        ("DATABASE_URL", env.database_url().expose().to_owned()),
        ("SHARD_COUNT", shards.to_string()),
        ("PREFETCH", prefetch.to_string()),
        ("RUST_LOG", "warn".to_owned()),
        ("LOG_FORMAT", "text".to_owned()),
        (OWNER_VAR, std::process::id().to_string()),
    ];
    vars.extend(extra.iter().cloned());
    Worker::spawn(bin, "worker", &["run"], &vars, log)
}

/// The status code of a GET (bounded to 2 s), `None` if there was no answer.
pub async fn http_status(addr: SocketAddr, path: &str) -> Option<u16> {
    let (status, _) = crate::http::get(addr, path, Duration::from_secs(2)).await;
    (status != 0).then_some(status)
}

/// What the numbers were measured on.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Machine {
    pub nproc: usize,
    pub cpu_model: String,
    pub memory_gib: f64,
    pub kernel: String,
    pub rabbitmq: String,
    pub postgresql: String,
    pub rustc: String,
    pub git_commit: String,
    /// Files changed in the work tree against the commit (e.g. work in progress).
    pub git_dirty_files: usize,
    pub started_at: String,
}

impl Machine {
    /// The report line "- Machine: …" (cores, memory, versions, the commit
    /// and any uncommitted changes, when the run started).
    pub fn markdown_line(&self) -> String {
        format!(
            "- Machine: {} cores ({}), {:.1} GiB RAM, Linux {}; RabbitMQ {}; PostgreSQL {}; {}; bench at commit {}{}; started {}",
            self.nproc,
            self.cpu_model,
            self.memory_gib,
            self.kernel,
            self.rabbitmq,
            self.postgresql,
            self.rustc,
            self.git_commit,
            if self.git_dirty_files > 0 {
                format!(" + {} uncommitted file change(s)", self.git_dirty_files)
            } else {
                String::new()
            },
            self.started_at
        )
    }
}

fn first_line(program: &str, args: &[&str]) -> String {
    std::process::Command::new(program)
        .args(args)
        .output()
        .ok()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .trim()
                .lines()
                .next()
                .unwrap_or("")
                .to_owned()
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

pub fn describe_machine() -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_owned())
        .unwrap_or_else(|| "unknown".into());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kib: f64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    let dirty = std::process::Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).lines().count())
        .unwrap_or(0);
    Machine {
        nproc: std::thread::available_parallelism().map_or(0, |n| n.get()),
        cpu_model,
        memory_gib: mem_kib / 1024.0 / 1024.0,
        kernel: first_line("uname", &["-r"]),
        rabbitmq: first_line("rabbitmqctl", &["-q", "version"]),
        postgresql: first_line(
            "psql",
            &psql::superuser_args("postgres", "SHOW server_version"),
        ),
        rustc: first_line("rustc", &["-V"]),
        git_commit: first_line(
            "git",
            &[
                "-C",
                env!("CARGO_MANIFEST_DIR"),
                "rev-parse",
                "--short=12",
                "HEAD",
            ],
        ),
        git_dirty_files: dirty,
        started_at: first_line("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]),
    }
}
