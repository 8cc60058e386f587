//! A vhost and a database of one's own, deleted when dropped: the one
//! environment type of the integration tests (`TestEnv` in
//! [`crate::fixtures`]), the benchmarks (`BenchEnv` in [`crate::bench_env`])
//! and the fault engine ([`crate::faults::services`]), each adding its
//! conveniences in an `impl Scratch` block.
//!
//! Every scratch that is alive is also listed, so a signal handler or an
//! exit hook can delete what a run leaves when it is cut short
//! ([`delete_alive`]).

use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{Context, bail};
use urutan::config::SecretUrl;

/// Where the broker and the database are, and how to administer them.
#[derive(Debug, Clone)]
pub struct Place {
    /// `amqp://user:password@host:port` (no vhost), one per broker node.
    pub amqp_bases: Vec<String>,
    /// `postgres://user@host:port` (no database).
    pub pg_base: String,
    /// `rabbitmqctl` and its node arguments (e.g. `bash cluster.sh ctl`).
    pub rabbitmqctl: Vec<String>,
    /// Reach the database through the Unix socket in this directory
    /// instead of TCP (the URLs only; set-up and clean-up use `pg_base`).
    pub pg_socket_dir: Option<String>,
}

impl Place {
    /// The standard local services (what CI runs).
    pub fn local() -> Self {
        Self {
            amqp_bases: vec!["amqp://guest:guest@127.0.0.1:5672".to_owned()],
            pg_base: "postgres://postgres@127.0.0.1:5432".to_owned(),
            rabbitmqctl: vec!["rabbitmqctl".to_owned()],
            pg_socket_dir: None,
        }
    }
}

/// When a scratch is kept instead of deleted (to look into it afterwards;
/// then deleted by hand).
#[derive(Debug, Clone, Copy)]
pub struct Keep {
    /// The environment variable that asks for it.
    pub var: &'static str,
    /// Only when the thread is panicking (a failed test), else always.
    pub only_on_panic: bool,
}

/// One vhost and one database of one's own.
pub struct Scratch {
    /// What the vhost and the database are named after.
    pub name: String,
    /// `urutan-<kind>-<name>`; guest may do anything in it.
    pub vhost: String,
    /// `urutan_<kind>_<name>`: created, not migrated.
    pub database: String,
    pub place: Place,
    keep: Option<Keep>,
}

/// The scratches alive: (place, vhost, database).
static ALIVE: Mutex<Vec<(Place, String, String)>> = Mutex::new(Vec::new());

impl Scratch {
    /// Creates vhost `urutan-<kind>-<name>` and database
    /// `urutan_<kind>_<name>` at `place` (each step bounded).
    pub async fn create(
        place: Place,
        kind: &str,
        name: &str,
        keep: Option<Keep>,
    ) -> anyhow::Result<Self> {
        let scratch = Self {
            name: name.to_owned(),
            vhost: format!("urutan-{kind}-{name}"),
            database: format!("urutan_{kind}_{name}"),
            place,
            keep,
        };
        if let Ok(mut alive) = ALIVE.lock() {
            alive.push(scratch.key());
        }
        let ctl = &scratch.place.rabbitmqctl;
        admin(ctl, &["-q", "add_vhost", &scratch.vhost]).await?;
        let vhost = scratch.vhost.as_str();
        let everything = [
            "-q",
            "set_permissions",
            "-p",
            vhost,
            "guest",
            ".*",
            ".*",
            ".*",
        ];
        admin(ctl, &everything).await?;
        let admin_url: SecretUrl = format!("{}/{}", scratch.place.pg_base, scratch.database)
            .parse()
            .map_err(|e| anyhow::anyhow!("not a database URL: {e}"))?;
        urutan::store::ensure_database(&admin_url)
            .await
            .with_context(|| format!("create database {}", scratch.database))?;
        Ok(scratch)
    }

    /// The vhost on the first (or only) broker node.
    pub fn amqp_url(&self) -> SecretUrl {
        let base = self.place.amqp_bases.first().map_or("", String::as_str);
        format!("{base}/{}", self.vhost.replace('/', "%2f"))
            .parse()
            .expect("a valid AMQP URL")
    }

    /// The vhost on every node, comma-separated: `AMQP_URL` as `urutan`
    /// takes it. Plain text: a list is not one URL, and the suites'
    /// brokers have no secret password.
    pub fn amqp_urls(&self) -> String {
        let vhost = self.vhost.replace('/', "%2f");
        let urls: Vec<String> = (self.place.amqp_bases.iter())
            .map(|base| format!("{base}/{vhost}"))
            .collect();
        urls.join(",")
    }

    pub fn database_url(&self) -> SecretUrl {
        let url = match &self.place.pg_socket_dir {
            Some(dir) => {
                let user = (self.place.pg_base.split_once("://"))
                    .and_then(|(_, rest)| rest.split_once('@'))
                    .map_or("postgres", |(user, _)| user);
                format!("postgres://{user}@localhost/{}?host={dir}", self.database)
            }
            None => format!("{}/{}", self.place.pg_base, self.database),
        };
        url.parse().expect("a valid database URL")
    }

    fn key(&self) -> (Place, String, String) {
        (
            self.place.clone(),
            self.vhost.clone(),
            self.database.clone(),
        )
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Ok(mut alive) = ALIVE.lock() {
            alive.retain(|(_, vhost, _)| *vhost != self.vhost);
        }
        if let Some(keep) = self.keep
            && std::env::var_os(keep.var).is_some()
            && (!keep.only_on_panic || std::thread::panicking())
        {
            eprintln!(
                "{}: kept vhost {} and database {}",
                keep.var, self.vhost, self.database
            );
            return;
        }
        delete_vhost(&self.place.rabbitmqctl, &self.vhost);
        drop_database(&self.place.pg_base, &self.database);
    }
}

/// Deletes every scratch still alive (a run cut short by a signal).
pub fn delete_alive() {
    let alive = ALIVE.lock().map(|a| a.clone()).unwrap_or_default();
    for (place, vhost, database) in alive {
        delete_vhost(&place.rabbitmqctl, &vhost);
        drop_database(&place.pg_base, &database);
    }
    if let Ok(mut a) = ALIVE.lock() {
        a.clear();
    }
}

/// `rabbitmqctl delete_vhost`, bounded by 60 s; a vhost already gone is fine.
pub fn delete_vhost(rabbitmqctl: &[String], vhost: &str) {
    if let Some((program, first)) = rabbitmqctl.split_first() {
        let _ = Command::new(program)
            .args(first)
            .args(["-q", "-t", "60", "delete_vhost", vhost])
            .output();
    }
}

/// `DROP DATABASE … WITH (FORCE)` through psql on the server of `pg_base`
/// (`postgres://user@host:port`); its sessions are ended first. Tried three
/// times, a second apart: a session that connects while the drop ends the
/// others (a pool reconnecting) makes it fail.
pub fn drop_database(pg_base: &str, name: &str) {
    for attempt in 0..3 {
        if attempt > 0 {
            std::thread::sleep(Duration::from_secs(1));
        }
        let dropped = Command::new("psql")
            .env("PGCONNECT_TIMEOUT", "10")
            .arg(format!("{pg_base}/postgres"))
            .args(["-q", "-v", "ON_ERROR_STOP=1", "-c"])
            .arg(format!(
                "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
                name.replace('"', "")
            ))
            .output();
        if dropped.is_ok_and(|out| out.status.success()) {
            return;
        }
    }
}

/// Runs `base + args`, bounded by 90 s; fails with its output.
pub async fn admin(base: &[String], args: &[&str]) -> anyhow::Result<String> {
    run_for(base, args, Duration::from_secs(90)).await
}

/// Runs `base + args` (a command line and its arguments), bounded by
/// `limit`; fails with its output.
pub async fn run_for(base: &[String], args: &[&str], limit: Duration) -> anyhow::Result<String> {
    let (program, first) = base.split_first().context("empty command")?;
    let run = tokio::process::Command::new(program)
        .args(first)
        .args(args)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(limit, run)
        .await
        .with_context(|| format!("{base:?} {args:?} took over {limit:?}"))?
        .with_context(|| format!("cannot run {program}"))?;
    if !out.status.success() {
        bail!(
            "{base:?} {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
