//! Throwaway broker vhosts and databases, one per scenario, deleted when the
//! scenario ends (guard `Drop`), at exit, on Ctrl-C, and — for a run that was
//! killed — by the sweep at the start of the next run (names carry the pid
//! of the bench process that made them).

use anyhow::Context;
use sqlx::PgPool;

use crate::scratch::{Place, Scratch};

pub const PG_BASE: &str = "postgres://postgres@127.0.0.1:5432";
pub const PG_SOCKET_DIR: &str = "/var/run/postgresql";
const VHOST_PREFIX: &str = "urutan-bench-";
const DB_PREFIX: &str = "urutan_bench_";
/// Environment variable set on every worker process the bench starts.
pub const OWNER_VAR: &str = "URUTAN_BENCH_OWNER";

/// Stops every worker process still running, then deletes every
/// scenario's vhost and database still alive (called at exit and on a
/// signal).
pub fn cleanup_all() {
    // Workers first, so none holds a database that is being dropped.
    crate::process::kill_alive();
    crate::scratch::delete_alive();
}

/// Runs a short admin command, bounded, and fails with its output.
pub async fn admin(program: &str, args: &[&str]) -> anyhow::Result<String> {
    crate::scratch::admin(&[program.to_owned()], args).await
}

/// A scenario's own vhost and database: the shared scratch type
/// (`urutan_testkit::scratch`), named `urutan-bench-<pid>_<tag>_<random>`
/// so that [`sweep_stale`] can tell whose it is.
pub use crate::scratch::Scratch as BenchEnv;

impl BenchEnv {
    /// Creates the scenario's vhost and database (not migrated: see
    /// [`Self::pool`]) on the local services.
    pub async fn bench(tag: &str) -> anyhow::Result<Self> {
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
        let name = format!(
            "{}_{tag}_{:06x}",
            std::process::id(),
            rand::random::<u32>() & 0xff_ffff
        );
        Scratch::create(Place::local(), "bench", &name, None).await
    }

    /// Reach the scenario database through PostgreSQL's Unix socket (no
    /// TCP, so no Nagle) instead of TCP 127.0.0.1.
    pub fn use_unix_socket(&mut self, yes: bool) {
        self.place.pg_socket_dir = yes.then(|| PG_SOCKET_DIR.to_owned());
    }

    /// A pool on the scenario database, migrations applied.
    pub async fn pool(&self, size: u32) -> anyhow::Result<PgPool> {
        urutan::store::prepare(&self.database_url(), size)
            .await
            .context("migrate the scenario database")
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
            crate::process::sigkill(pid);
            removed.push(format!("orphan worker pid {pid}"));
        }
    }
    if let Ok(list) = admin("rabbitmqctl", &["-q", "list_vhosts", "name"]).await {
        for vhost in list.lines().map(str::trim) {
            if owner_of(vhost, VHOST_PREFIX).is_some_and(|p| !pid_alive(p)) {
                crate::scratch::delete_vhost(&["rabbitmqctl".to_owned()], vhost);
                removed.push(format!("vhost {vhost}"));
            }
        }
    }
    let query = "SELECT datname FROM pg_database WHERE datname LIKE 'urutan\\_bench\\_%'";
    if let Ok(list) = admin("psql", &crate::psql::superuser_args("postgres", query)).await {
        for db in list.lines().map(str::trim) {
            if owner_of(db, DB_PREFIX).is_some_and(|p| !pid_alive(p)) {
                crate::scratch::drop_database(PG_BASE, db);
                removed.push(format!("database {db}"));
            }
        }
    }
    removed
}
