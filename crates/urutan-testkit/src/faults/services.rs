//! The broker and database the fault suite runs against, how to control
//! them (stop, start, restart), and one run's own vhost and database.
//!
//! Everything defaults to the standard local services (what CI uses) and can
//! be pointed at a private RabbitMQ node and PostgreSQL cluster with:
//!
//! | variable | default |
//! |---|---|
//! | `FAULTS_AMQP_BASE` | `amqp://guest:guest@127.0.0.1:5672` |
//! | `FAULTS_PG_BASE` | `postgres://postgres@127.0.0.1:5432` |
//! | `FAULTS_RABBITMQCTL` | `rabbitmqctl` (e.g. `rabbitmqctl -n faults@localhost`) |
//! | `FAULTS_PG_CTL` | `pg_ctlcluster --skip-systemctl-redirect <first of /etc/postgresql> main` (`stop`/`start`/`restart` appended) |
//! | `FAULTS_CLUSTER` | unset; the path of `deploy/brokers/cluster.sh` for the three-node cluster |
//! | `FAULTS_PG_PAIR` | unset; the path of `deploy/postgres/pair.sh` for pair mode |
//!
//! With `FAULTS_CLUSTER` set the run is against the three-node cluster: the
//! processes get an `AMQP_URL` naming all three nodes (`cluster.sh urls`),
//! `rabbitmqctl` is `cluster.sh ctl` (the first node that answers), and the
//! cluster faults go through `cluster.sh` (`FAULTS_AMQP_BASE` and
//! `FAULTS_RABBITMQCTL` are then ignored).
//!
//! With `FAULTS_PG_PAIR` set the database is a primary with a synchronous
//! streaming standby (`pair.sh`, made by the run if it is not up): the run
//! reaches it through a proxy that plays the managed service's DNS name
//! (`links::DbName`, moved to the promoted standby by a failover), the
//! database faults act on the current primary (`pair.sh ctl`), and
//! `FAULTS_PG_BASE` and `FAULTS_PG_CTL` are ignored.

use std::process::Command;
use std::time::Duration;

use anyhow::Context;

use crate::scratch::{Keep, Place, Scratch, run_for};

/// Where the services are and the command lines that control them.
#[derive(Debug, Clone)]
pub struct Services {
    /// The broker nodes (one base URL each, no vhost), the database base URL
    /// and `rabbitmqctl` with its node arguments: where a run's scratch
    /// vhost and database are made.
    pub place: Place,
    /// The cluster control command, before `stop`/`start`/`restart`.
    pub pg_ctl: Vec<String>,
    /// `bash <cluster.sh>` in cluster mode (`FAULTS_CLUSTER`).
    pub cluster: Option<Vec<String>>,
    /// `bash <pair.sh>` in pair mode (`FAULTS_PG_PAIR`).
    pub pair: Option<Vec<String>>,
}

fn words(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_owned).collect()
}

impl Services {
    /// From the `FAULTS_*` variables, defaulting to the standard local services.
    pub fn from_env() -> anyhow::Result<Self> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let pair = var("FAULTS_PG_PAIR").map(|script| vec!["bash".to_owned(), script]);
        let pg_ctl = match (&pair, var("FAULTS_PG_CTL")) {
            (Some(pair), _) => [pair.as_slice(), &["ctl".to_owned()]].concat(),
            (None, Some(cmd)) => words(&cmd),
            (None, None) => {
                let version = std::fs::read_dir("/etc/postgresql")
                    .context("FAULTS_PG_CTL unset and /etc/postgresql unreadable")?
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .min()
                    .context("no PostgreSQL version under /etc/postgresql")?;
                words(&format!(
                    "pg_ctlcluster --skip-systemctl-redirect {version} main"
                ))
            }
        };
        let pg_base =
            var("FAULTS_PG_BASE").unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432".into());
        if let Some(script) = var("FAULTS_CLUSTER") {
            let cluster = vec!["bash".to_owned(), script];
            let urls = std::process::Command::new(&cluster[0])
                .args(&cluster[1..])
                .arg("urls")
                .output()
                .context("run cluster.sh urls")?;
            let urls = String::from_utf8_lossy(&urls.stdout);
            let amqp_bases: Vec<String> = urls.trim().split(',').map(str::to_owned).collect();
            anyhow::ensure!(
                amqp_bases.len() == 3 && amqp_bases.iter().all(|u| u.starts_with("amqp://")),
                "cluster.sh urls gave {urls:?}"
            );
            let mut rabbitmqctl = cluster.clone();
            rabbitmqctl.push("ctl".into());
            return Ok(Self {
                place: Place {
                    amqp_bases,
                    pg_base,
                    rabbitmqctl,
                    pg_socket_dir: None,
                },
                pg_ctl,
                cluster: Some(cluster),
                pair,
            });
        }
        Ok(Self {
            place: Place {
                amqp_bases: vec![
                    var("FAULTS_AMQP_BASE")
                        .unwrap_or_else(|| "amqp://guest:guest@127.0.0.1:5672".into()),
                ],
                pg_base,
                rabbitmqctl: words(
                    &var("FAULTS_RABBITMQCTL").unwrap_or_else(|| "rabbitmqctl".into()),
                ),
                pg_socket_dir: None,
            },
            pg_ctl,
            cluster: None,
            pair,
        })
    }

    /// `cluster.sh <args>` (cluster mode only), bounded by 10 min (a
    /// rolling restart waits for each node).
    pub async fn cluster(&self, args: &[&str]) -> anyhow::Result<String> {
        let script = self.cluster.as_ref().context("not in cluster mode")?;
        run_for(script, args, Duration::from_secs(600)).await
    }

    /// `pair.sh <args>` (pair mode only), bounded by 5 min (`up` makes
    /// two clusters, `rejoin` may copy the primary; each wait in the script
    /// is bounded by 60 s).
    pub async fn pair(&self, args: &[&str]) -> anyhow::Result<String> {
        let script = self.pair.as_ref().context("not in pair mode")?;
        run_for(script, args, Duration::from_secs(300)).await
    }

    /// `rabbitmqctl <args>`, bounded.
    pub async fn rabbitmqctl(&self, args: &[&str]) -> anyhow::Result<String> {
        run(&self.place.rabbitmqctl, args).await
    }

    /// The database cluster's control command with `action` (stop/start/restart).
    pub async fn pg_ctl(&self, action: &str) -> anyhow::Result<String> {
        run(&self.pg_ctl, &[action]).await
    }

    /// A guard that starts the broker application and the database cluster
    /// again when dropped, so a failing run never leaves them down.
    pub fn restarter(&self) -> Restarter {
        Restarter(self.clone())
    }
}

/// Runs `base + args`, bounded by 120 s; fails with its output.
pub async fn run(base: &[String], args: &[&str]) -> anyhow::Result<String> {
    run_for(base, args, Duration::from_secs(120)).await
}

/// See [`Services::restarter`].
pub struct Restarter(Services);

impl Drop for Restarter {
    fn drop(&mut self) {
        let blocking = |base: &[String], args: &[&str]| {
            if let Some((program, first)) = base.split_first() {
                let _ = Command::new(program).args(first).args(args).output();
            }
        };
        if let Some(cluster) = &self.0.cluster {
            // Starts the nodes that are down (killed, stopped or a full
            // restart cut short); the database is never stopped here.
            blocking(cluster, &["start"]);
            return;
        }
        blocking(&self.0.place.rabbitmqctl, &["-q", "start_app"]);
        blocking(
            &self.0.place.rabbitmqctl,
            &["-q", "--timeout", "120", "await_startup"],
        );
        blocking(&self.0.pg_ctl, &["start"]);
    }
}

impl Services {
    /// Creates the run's own vhost `urutan-faults-<tag>` (guest may do
    /// anything in it) and database `urutan_faults_<tag>` (migrated by the
    /// first worker): the shared scratch type (`urutan_testkit::scratch`),
    /// deleted when dropped unless `FAULTS_KEEP` is set (to look into a
    /// run's history; then dropped by hand).
    pub async fn scratch(&self, tag: &str) -> anyhow::Result<Scratch> {
        let keep = Keep {
            var: "FAULTS_KEEP",
            only_on_panic: false,
        };
        Scratch::create(self.place.clone(), "faults", tag, Some(keep))
            .await
            .context("create the run's vhost and database")
    }
}
