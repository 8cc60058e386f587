//! The processes of a run: two `urutan run` replicas (single active consumer
//! makes one of them active per shard, the other a hot standby), one
//! `urutan relay` and one `urutan effects` (every applied version's webhook
//! to the run's payment endpoint). Every replica is armed for a crash
//! between commit and ack (it aborts n outcomes after a SIGUSR1) and runs
//! the slow handler.

use std::path::PathBuf;
use std::time::Duration;

use rand::RngExt;
use rand::rngs::StdRng;

use crate::faults::procs::Proc;

/// How one replica consumes: `PREFETCH`, and `BATCH_MAX` if set (`2/1` is
/// pipelined strict mode: one message applied at a time, the next on hand).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Consume {
    pub prefetch: u16,
    pub batch_max: Option<u16>,
}

impl Consume {
    pub const fn prefetch(prefetch: u16) -> Self {
        Self {
            prefetch,
            batch_max: None,
        }
    }

    /// The rotation of the fault runs: strict, batch, pipelined strict.
    pub const ROTATION: [Consume; 3] = [
        Consume::prefetch(1),
        Consume::prefetch(16),
        Consume {
            prefetch: 2,
            batch_max: Some(1),
        },
    ];
}

impl std::str::FromStr for Consume {
    type Err = std::num::ParseIntError;

    /// `16` or `2/1` (PREFETCH/BATCH_MAX).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s.split_once('/') {
            Some((p, b)) => Consume {
                prefetch: p.trim().parse()?,
                batch_max: Some(b.trim().parse()?),
            },
            None => Consume::prefetch(s.trim().parse()?),
        })
    }
}

impl std::fmt::Display for Consume {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.batch_max {
            Some(b) => write!(f, "p{}b{b}", self.prefetch),
            None => write!(f, "p{}", self.prefetch),
        }
    }
}

/// How the processes are started.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    pub amqp_url: String,
    pub database_url: String,
    pub shards: u16,
    /// How successive replicas consume, cycled (e.g. strict, batch and
    /// pipelined strict mode take turns being active).
    pub consume: Vec<Consume>,
    /// `URUTAN_FAULT_HANDLER_DELAY_MS` of every replica.
    pub handler_delay_ms: u64,
    /// Where every applied version's effect goes (`EFFECTS='*=<url>'`).
    pub effects_url: String,
    /// More settings of every replica (the holds soak's handler, retries,
    /// holds and gaps: [`crate::faults::holds::worker_env`]).
    pub worker_env: Vec<(String, String)>,
    pub log_dir: PathBuf,
}

/// The running processes.
pub struct Fleet {
    pub config: FleetConfig,
    pub workers: Vec<Proc>,
    pub relay: Option<Proc>,
    pub dispatcher: Option<Proc>,
    /// Processes started so far (names are `worker-<n>` / `relay-<n>` /
    /// `effects-<n>`).
    started: usize,
    /// Exits nobody asked for, with their status: each is a finding.
    pub unexpected: Vec<String>,
}

/// Replicas kept running.
pub const REPLICAS: usize = 2;
/// Bound of every wait for a process to become ready.
pub const READY_LIMIT: Duration = Duration::from_secs(60);

impl Fleet {
    pub fn new(config: FleetConfig) -> Self {
        Self {
            config,
            workers: Vec::new(),
            relay: None,
            dispatcher: None,
            started: 0,
            unexpected: Vec::new(),
        }
    }

    fn base_env(&self) -> Vec<(String, String)> {
        let c = &self.config;
        [
            ("AMQP_URL", c.amqp_url.clone()),
            ("DATABASE_URL", c.database_url.clone()),
            ("SHARD_COUNT", c.shards.to_string()),
            // `FAULTS_RUST_LOG` (e.g. `info,urutan::shard=debug`) to look closer.
            (
                "RUST_LOG",
                std::env::var("FAULTS_RUST_LOG").unwrap_or_else(|_| "info".to_owned()),
            ),
            // A silent link (the blackhole faults) is given up after about
            // two heartbeats, an apply on a silent database link after
            // DATABASE_TIMEOUT + 5 s.
            ("AMQP_HEARTBEAT", "5".to_owned()),
            ("DATABASE_TIMEOUT", "5s".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    /// Starts a replica: PREFETCH cycled, the slow handler, and armed to abort
    /// between commit and ack 1-50 outcomes after a SIGUSR1.
    pub fn spawn_worker(&mut self, rng: &mut StdRng) -> anyhow::Result<Proc> {
        self.started += 1;
        let consume = self.config.consume[self.started % self.config.consume.len()];
        let mut env = self.base_env();
        env.extend(self.config.worker_env.iter().cloned());
        if let Some(batch_max) = consume.batch_max {
            env.push(("BATCH_MAX".to_owned(), batch_max.to_string()));
        }
        env.extend(
            [
                ("PREFETCH", consume.prefetch.to_string()),
                (
                    "URUTAN_FAULT_HANDLER_DELAY_MS",
                    self.config.handler_delay_ms.to_string(),
                ),
                (
                    "URUTAN_FAULT_ABORT_AFTER_COMMIT",
                    rng.random_range(1..=50_u32).to_string(),
                ),
                ("URUTAN_FAULT_ARM_ON_SIGUSR1", "1".to_owned()),
            ]
            .map(|(k, v)| (k.to_owned(), v)),
        );
        let name = format!("worker-{}-{consume}", self.started);
        Proc::start(&name, "run", &env, &self.config.log_dir)
    }

    /// Starts a relay; `abort_batch: Some(n)` makes it publish one batch of
    /// at most n rows, get the confirms and abort before marking them sent.
    pub fn spawn_relay(&mut self, abort_batch: Option<u32>) -> anyhow::Result<Proc> {
        self.started += 1;
        let mut env = self.base_env();
        if let Some(batch) = abort_batch {
            env.push(("URUTAN_FAULT_ABORT_AFTER_PUBLISH".into(), "1".into()));
            env.push(("RELAY_BATCH".into(), batch.to_string()));
        }
        let name = format!(
            "relay-{}{}",
            self.started,
            if abort_batch.is_some() { "-abort" } else { "" }
        );
        Proc::start(&name, "relay", &env, &self.config.log_dir)
    }

    /// Starts an effects dispatcher routing every status to the run's
    /// endpoint. A 2 s attempt timeout makes the lease 9 s: an effect whose
    /// dispatcher died mid-request is sent again (same key) within ~10 s.
    pub fn spawn_dispatcher(&mut self) -> anyhow::Result<Proc> {
        self.started += 1;
        let mut env = self.base_env();
        env.extend(
            [
                ("EFFECTS", format!("*={}", self.config.effects_url)),
                ("EFFECTS_SECRET", crate::faults::payee::SECRET.to_owned()),
                ("EFFECTS_TIMEOUT", "2s".to_owned()),
                ("EFFECTS_BACKOFF_MIN", "200ms".to_owned()),
                ("EFFECTS_BACKOFF_MAX", "5s".to_owned()),
                // Never dead-lettered for a run's outages: a lost effect
                // would show as a missing charge, not hide as a dead letter.
                ("EFFECTS_MAX_ATTEMPTS", "1000".to_owned()),
            ]
            .map(|(k, v)| (k.to_owned(), v)),
        );
        let name = format!("effects-{}", self.started);
        Proc::start(&name, "effects", &env, &self.config.log_dir)
    }

    /// Indices of the replicas that applied messages in the last second
    /// (the active ones); all of them if none did.
    pub async fn active_workers(&self) -> Vec<usize> {
        let before = self.totals().await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let after = self.totals().await;
        let active: Vec<usize> = (0..self.workers.len())
            .filter(|i| matches!((before[*i], after[*i]), (Some(b), Some(a)) if a > b))
            .collect();
        if active.is_empty() {
            (0..self.workers.len()).collect()
        } else {
            active
        }
    }

    async fn totals(&self) -> Vec<Option<f64>> {
        let mut out = Vec::new();
        for w in &self.workers {
            out.push(w.messages_total().await);
        }
        out
    }

    /// Records and replaces any process that exited on its own, then makes
    /// sure there are [`REPLICAS`] replicas, a relay and a dispatcher, all
    /// ready (a ready dispatcher has written its routes: every version
    /// applied from then on has its effect).
    pub async fn heal(&mut self, rng: &mut StdRng) -> anyhow::Result<()> {
        let mut kept = Vec::new();
        for mut w in std::mem::take(&mut self.workers) {
            match w.exited() {
                Some(status) => self.unexpected.push(format!("{} exited: {status}", w.name)),
                None => kept.push(w),
            }
        }
        self.workers = kept;
        if let Some(relay) = &mut self.relay
            && let Some(status) = relay.exited()
        {
            self.unexpected
                .push(format!("{} exited: {status}", relay.name));
            self.relay = None;
        }
        while self.workers.len() < REPLICAS {
            let w = self.spawn_worker(rng)?;
            self.workers.push(w);
        }
        // Ready workers have migrated the database and declared the topology.
        for w in &mut self.workers {
            w.wait_ready(READY_LIMIT).await?;
        }
        if self.relay.is_none() {
            self.relay = Some(self.spawn_relay(None)?);
        }
        if let Some(relay) = &mut self.relay {
            relay.wait_ready(READY_LIMIT).await?;
        }
        if let Some(dispatcher) = &mut self.dispatcher
            && let Some(status) = dispatcher.exited()
        {
            self.unexpected
                .push(format!("{} exited: {status}", dispatcher.name));
            self.dispatcher = None;
        }
        if self.dispatcher.is_none() {
            self.dispatcher = Some(self.spawn_dispatcher()?);
        }
        if let Some(dispatcher) = &mut self.dispatcher {
            dispatcher.wait_ready(READY_LIMIT).await?;
        }
        Ok(())
    }

    /// SIGTERM to everything, then SIGKILL what is still running after 40 s.
    pub async fn stop_all(&mut self) {
        let mut all: Vec<Proc> = self
            .workers
            .drain(..)
            .chain(self.relay.take())
            .chain(self.dispatcher.take())
            .collect();
        for p in &all {
            let _ = p.signal("TERM");
        }
        for p in &mut all {
            if p.wait_exit(Duration::from_secs(40)).await.is_none() {
                p.kill().await;
            }
        }
    }
}
