//! Throwaway broker vhosts and databases, one per scenario, deleted when the
//! scenario ends (guard `Drop`), at exit, on Ctrl-C, and — for a run that was
//! killed — by the sweep at the start of the next run (names carry the pid
//! of the bench process that made them).

use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{Context, bail};
use sqlx::PgPool;
use urutan::config::SecretUrl;

pub const AMQP_BASE: &str = "amqp://guest:guest@127.0.0.1:5672";
pub const PG_BASE: &str = "postgres://postgres@127.0.0.1:5432";
/// The same server through its Unix socket (no TCP, so no Nagle).
const PG_UNIX: &str = "postgres://postgres@localhost";
pub const PG_SOCKET_DIR: &str = "/var/run/postgresql";
const VHOST_PREFIX: &str = "urutan-bench-";
const DB_PREFIX: &str = "urutan_bench_";
/// Environment variable set on every worker process the bench starts.
pub const OWNER_VAR: &str = "URUTAN_BENCH_OWNER";

#[derive(Debug, Clone, PartialEq, Eq)]
enum Resource {
    Vhost(String),
    Database(String),
    /// A worker process the bench started.
    Process(u32),
}

/// Everything created and not yet deleted, for cleanup on exit or signal.
static LIVE: Mutex<Vec<Resource>> = Mutex::new(Vec::new());

fn track(r: Resource) {
    if let Ok(mut live) = LIVE.lock() {
        live.push(r);
    }
}

fn untrack(r: &Resource) {
    if let Ok(mut live) = LIVE.lock() {
        live.retain(|x| x != r);
    }
}

fn delete(r: &Resource) {
    match r {
        Resource::Vhost(v) => {
            let _ = Command::new("rabbitmqctl")
                .args(["-q", "-t", "60", "delete_vhost", v])
                .output();
        }
        Resource::Database(d) => drop_database(d),
        Resource::Process(pid) => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .output();
        }
    }
    untrack(r);
}

/// Remembers a started worker process, so a signal can still stop it.
pub fn track_process(pid: u32) {
    track(Resource::Process(pid));
}

/// Forgets a worker process that has exited (or is being killed by its guard).
pub fn untrack_process(pid: u32) {
    untrack(&Resource::Process(pid));
}

fn drop_database(name: &str) {
    let _ = Command::new("psql")
        .env("PGCONNECT_TIMEOUT", "5")
        .args([
            "-q",
            "-h",
            "127.0.0.1",
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-c",
        ])
        .arg(format!(
            "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
            name.replace('"', "")
        ))
        .output();
}

/// Stops every tracked worker and deletes every tracked vhost and database
/// (called at exit and on a signal).
pub fn cleanup_all() {
    let mut live: Vec<Resource> = LIVE.lock().map(|l| l.clone()).unwrap_or_default();
    // Workers first, so none holds a database that is being dropped.
    live.sort_by_key(|r| !matches!(r, Resource::Process(_)));
    for r in &live {
        delete(r);
    }
}

/// Runs a short admin command, bounded, and fails with its output.
pub async fn admin(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let run = tokio::process::Command::new(program)
        .args(args)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(90), run)
        .await
        .with_context(|| format!("{program} {args:?} took over 90 s"))?
        .with_context(|| format!("cannot run {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A scenario's own vhost and/or database.
pub struct BenchEnv {
    pub vhost: Option<String>,
    pub database: Option<String>,
    /// Reach PostgreSQL through its Unix socket instead of TCP 127.0.0.1.
    pub unix_db: bool,
}

impl BenchEnv {
    /// Creates a vhost (if `broker`) and a migrated database (if `db`).
    pub async fn new(tag: &str, broker: bool, db: bool) -> anyhow::Result<Self> {
        let pid = std::process::id();
        let tag: String = tag
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .collect();
        let suffix = format!("{pid}_{tag}_{:06x}", rand::random::<u32>() & 0xff_ffff);
        let mut env = Self {
            vhost: None,
            database: None,
            unix_db: false,
        };
        if broker {
            let vhost = format!("{VHOST_PREFIX}{suffix}");
            track(Resource::Vhost(vhost.clone()));
            env.vhost = Some(vhost.clone());
            admin("rabbitmqctl", &["-q", "add_vhost", &vhost]).await?;
            admin(
                "rabbitmqctl",
                &[
                    "-q",
                    "set_permissions",
                    "-p",
                    &vhost,
                    "guest",
                    ".*",
                    ".*",
                    ".*",
                ],
            )
            .await?;
        }
        if db {
            let database = format!("{DB_PREFIX}{suffix}");
            track(Resource::Database(database.clone()));
            env.database = Some(database);
            urutan::store::ensure_database(&env.database_url())
                .await
                .context("create the scenario database")?;
        }
        Ok(env)
    }

    pub fn amqp_url(&self) -> SecretUrl {
        let vhost = self.vhost.as_deref().unwrap_or("/").replace('/', "%2f");
        format!("{AMQP_BASE}/{vhost}")
            .parse()
            .expect("a valid AMQP URL")
    }

    pub fn database_url(&self) -> SecretUrl {
        let db = self.database.as_deref().unwrap_or("postgres");
        let url = if self.unix_db {
            format!("{PG_UNIX}/{db}?host={PG_SOCKET_DIR}")
        } else {
            format!("{PG_BASE}/{db}")
        };
        url.parse().expect("a valid database URL")
    }

    /// A pool on the scenario database, migrations applied.
    pub async fn pool(&self, size: u32) -> anyhow::Result<PgPool> {
        urutan::store::prepare(&self.database_url(), size)
            .await
            .context("migrate the scenario database")
    }
}

impl Drop for BenchEnv {
    fn drop(&mut self) {
        if let Some(v) = self.vhost.take() {
            delete(&Resource::Vhost(v));
        }
        if let Some(d) = self.database.take() {
            delete(&Resource::Database(d));
        }
    }
}

fn pid_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// The pid embedded in a bench resource name, if the name is one of ours.
fn owner_of(name: &str, prefix: &str) -> Option<u32> {
    name.strip_prefix(prefix)?
        .split(['_', '-'])
        .next()?
        .parse()
        .ok()
}

/// Deletes vhosts and databases, and stops worker processes, left behind by
/// bench runs that no longer exist (killed before they could clean up).
/// Returns what it removed.
pub async fn sweep_stale() -> Vec<String> {
    let mut removed = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        let owner = environ
            .split(|b| *b == 0)
            .filter_map(|kv| std::str::from_utf8(kv).ok())
            .find_map(|kv| kv.strip_prefix(&format!("{OWNER_VAR}=")).map(str::to_owned))
            .and_then(|o| o.parse::<u32>().ok());
        if let Some(owner) = owner
            && !pid_alive(owner)
        {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .output();
            removed.push(format!("orphan worker pid {pid}"));
        }
    }
    if let Ok(list) = admin("rabbitmqctl", &["-q", "list_vhosts", "name"]).await {
        for vhost in list.lines().map(str::trim) {
            if owner_of(vhost, VHOST_PREFIX).is_some_and(|p| !pid_alive(p)) {
                delete(&Resource::Vhost(vhost.to_owned()));
                removed.push(format!("vhost {vhost}"));
            }
        }
    }
    let query = "SELECT datname FROM pg_database WHERE datname LIKE 'urutan\\_bench\\_%'";
    if let Ok(list) = admin(
        "psql",
        &[
            "-Atq",
            "-h",
            "127.0.0.1",
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-c",
            query,
        ],
    )
    .await
    {
        for db in list.lines().map(str::trim) {
            if owner_of(db, DB_PREFIX).is_some_and(|p| !pid_alive(p)) {
                drop_database(db);
                removed.push(format!("database {db}"));
            }
        }
    }
    removed
}
