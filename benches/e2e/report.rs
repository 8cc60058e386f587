//! Results: the scenarios and their samples, medians and ratios to the
//! ceilings, written as Markdown (`latest.md`, also printed) and JSON
//! (`latest.json`).

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::ceilings::Measured;
use crate::procfs::{CpuSplit, Machine};
use crate::runs::{LatencyRow, WorkerRun};

mod markdown;
pub use markdown::write_backlog;

/// How a database-only variant groups messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DbKind {
    PerMessage,
    Loop,
    Statement,
}

/// What a scenario measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Key {
    BrokerOnly {
        shards: u16,
        prefetch: u16,
    },
    DbOnly {
        tasks: u16,
        batch: usize,
        mode: DbKind,
    },
    Worker {
        shards: u16,
        prefetch: u16,
    },
    /// The batch statement with PostgreSQL reached over its Unix socket.
    DbOnlyUnix {
        tasks: u16,
        batch: usize,
    },
    /// The worker with `DATABASE_URL` on PostgreSQL's Unix socket.
    WorkerUnix {
        shards: u16,
        prefetch: u16,
    },
    /// Pipelined strict mode: `PREFETCH=2`, `BATCH_MAX=1` (one message
    /// applied at a time, the next delivery on hand).
    WorkerPipelined {
        shards: u16,
    },
    /// Pipelined batches: `PREFETCH` = 2 × `BATCH_MAX` = 2 × `batch` (the
    /// next batch on hand while the current one commits).
    WorkerPipelinedBatch {
        shards: u16,
        batch: u16,
    },
}

impl Key {
    pub fn label(&self) -> String {
        match self {
            Key::BrokerOnly { shards, prefetch } => {
                format!("broker only, {shards} shard(s), prefetch {prefetch}")
            }
            Key::DbOnly { tasks, batch, mode } => match mode {
                DbKind::PerMessage => format!("database only, {tasks} task(s), 1 msg/tx"),
                DbKind::Loop => format!("database only, {tasks} task(s), {batch} msg/tx (loop)"),
                DbKind::Statement => {
                    format!("database only, {tasks} task(s), {batch} msg/tx (one statement)")
                }
            },
            Key::Worker { shards, prefetch } => {
                format!("worker, {shards} shard(s), prefetch {prefetch}")
            }
            Key::DbOnlyUnix { tasks, batch } => format!(
                "database only, {tasks} task(s), {batch} msg/tx (one statement), Unix socket"
            ),
            Key::WorkerUnix { shards, prefetch } => {
                format!("worker, {shards} shard(s), prefetch {prefetch}, database via Unix socket")
            }
            Key::WorkerPipelined { shards } => {
                format!("worker, {shards} shard(s), pipelined strict (prefetch 2, batch max 1)")
            }
            Key::WorkerPipelinedBatch { shards, batch } => format!(
                "worker, {shards} shard(s), pipelined batches (prefetch {}, batch max {batch})",
                2 * batch
            ),
        }
    }
}

/// The run's parameters.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Plan {
    pub mode: String,
    /// Messages per backlog drain at PREFETCH=1 (broker-only and worker rows).
    pub messages: usize,
    /// Messages per database-only drain at 1 msg/tx.
    pub db_messages: usize,
    /// Batch rows (PREFETCH > 1, database batches) drain this many times more.
    pub batch_scale: usize,
    pub rounds: usize,
    pub shard_counts: Vec<u16>,
    pub prefetches: Vec<u16>,
    pub db_loop_batch: usize,
    pub latency_shards: u16,
    pub latency_loads: Vec<f64>,
    pub latency_secs: f64,
}

impl Plan {
    /// How many messages the scenario `key` drains.
    pub fn messages_for(&self, key: Key) -> usize {
        match key {
            Key::BrokerOnly { prefetch: 1, .. }
            | Key::Worker { prefetch: 1, .. }
            | Key::WorkerPipelined { .. } => self.messages,
            Key::BrokerOnly { .. }
            | Key::Worker { .. }
            | Key::WorkerUnix { .. }
            | Key::WorkerPipelinedBatch { .. } => self.messages * self.batch_scale,
            Key::DbOnly { batch: 1, .. } => self.db_messages,
            Key::DbOnly { .. } | Key::DbOnlyUnix { .. } => self.db_messages * self.batch_scale,
        }
    }
}

/// Latency of one worker configuration at several offered loads.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LatencySet {
    pub shards: u16,
    pub prefetch: u16,
    /// The configuration's median drain rate: what the loads are shares of.
    pub max_rate: Option<f64>,
    pub rows: Vec<LatencyRow>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One measurement of one scenario.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sample {
    pub round: usize,
    pub messages: usize,
    pub secs: f64,
    pub rate: f64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub note: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker: Option<WorkerRun>,
    /// A ceiling's CPU per message (a worker row's is in `worker`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuSplit>,
}

impl Sample {
    /// A ceiling's drain.
    pub fn measured(m: &Measured, note: String) -> Self {
        Self {
            round: 0,
            messages: m.messages,
            secs: m.secs,
            rate: m.rate(),
            note,
            worker: None,
            cpu: Some(m.cpu),
        }
    }

    pub fn worker(run: WorkerRun) -> Self {
        Self {
            round: 0,
            messages: run.messages,
            secs: run.secs,
            rate: run.rate,
            note: String::new(),
            cpu: run.cpu,
            worker: Some(run),
        }
    }

    /// Extra detail for the progress line.
    pub fn detail(&self) -> String {
        match &self.worker {
            Some(w) => format!(
                ", {:.0} µs CPU/msg, peak RSS {:.1} MiB, check {}",
                w.cpu_us_per_msg, w.peak_rss_mib, w.verified
            ),
            None if !self.note.is_empty() => format!(" [{}]", self.note),
            None => String::new(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Scenario {
    pub key: Key,
    pub label: String,
    pub samples: Vec<Sample>,
    pub errors: Vec<String>,
    pub median_rate: Option<f64>,
}

pub fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

impl Scenario {
    pub fn new(key: Key) -> Self {
        Self {
            key,
            label: key.label(),
            samples: Vec::new(),
            errors: Vec::new(),
            median_rate: None,
        }
    }

    pub fn median_rate(&self) -> Option<f64> {
        median(self.samples.iter().map(|s| s.rate).collect())
    }

    fn workers(&self) -> impl Iterator<Item = &WorkerRun> {
        self.samples.iter().filter_map(|s| s.worker.as_ref())
    }

    fn median_of(&self, f: impl Fn(&WorkerRun) -> Option<f64>) -> Option<f64> {
        median(self.workers().filter_map(f).collect())
    }

    fn peak_rss(&self) -> Option<f64> {
        self.workers().map(|w| w.peak_rss_mib).reduce(f64::max)
    }

    /// "ok" if every run verified and stopped cleanly, else what went
    /// wrong; attempts lost to a disturbance (and retried) are noted.
    fn check(&self) -> String {
        let mut bad: Vec<String> = self
            .workers()
            .filter(|w| w.verified != "ok")
            .map(|w| w.verified.clone())
            .collect();
        if self.workers().any(|w| !w.clean_stop) {
            bad.push("unclean stop".into());
        }
        let mut check = if bad.is_empty() {
            "ok".to_owned()
        } else {
            bad.join("; ")
        };
        if !self.errors.is_empty() {
            let _ = write!(
                check,
                " ({} failed attempt(s), see below)",
                self.errors.len()
            );
        }
        check
    }

    fn spread(&self) -> String {
        let rates: Vec<f64> = self.samples.iter().map(|s| s.rate).collect();
        match (
            rates.iter().copied().reduce(f64::min),
            rates.iter().copied().reduce(f64::max),
        ) {
            (Some(lo), Some(hi)) if rates.len() > 1 => format!("{lo:.0}–{hi:.0}"),
            _ => "—".into(),
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Report {
    pub machine: Machine,
    pub plan: Plan,
    pub duration_s: f64,
    pub headline: Vec<String>,
    pub scenarios: Vec<Scenario>,
    pub latency: Vec<LatencySet>,
}

fn fmt_rate(r: Option<f64>) -> String {
    r.map_or("—".into(), |r| format!("{r:.0}"))
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    Some(a? / b?).filter(|r| r.is_finite())
}

fn fmt_ratio(r: Option<f64>) -> String {
    r.map_or("—".into(), |r| format!("{r:.2}×"))
}

impl Report {
    pub fn new(
        machine: Machine,
        plan: Plan,
        mut scenarios: Vec<Scenario>,
        latency: Vec<LatencySet>,
        took: Duration,
    ) -> Self {
        for s in &mut scenarios {
            s.median_rate = s.median_rate();
        }
        let mut report = Self {
            machine,
            plan,
            duration_s: took.as_secs_f64(),
            headline: Vec::new(),
            scenarios,
            latency,
        };
        report.headline = report.headlines();
        report
    }

    /// Reads a `latest.json` written earlier (for `--replot`) and recomputes
    /// the headline with the current wording.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)?;
        let mut report: Self = serde_json::from_str(&text)?;
        report.headline = report.headlines();
        Ok(report)
    }

    pub fn rate(&self, key: Key) -> Option<f64> {
        self.scenarios.iter().find(|s| s.key == key)?.median_rate
    }

    fn scenario(&self, key: Key) -> Option<&Scenario> {
        self.scenarios.iter().find(|s| s.key == key)
    }

    /// True if a scenario never produced a sample, a run did not verify, or
    /// a latency set failed.
    pub fn failed(&self) -> bool {
        self.scenarios.iter().any(|s| s.samples.is_empty())
            || self
                .scenarios
                .iter()
                .flat_map(Scenario::workers)
                .any(|w| w.verified != "ok")
            || self.latency.iter().any(|l| l.error.is_some())
    }

    fn worker(&self, shards: u16, prefetch: u16) -> Option<f64> {
        self.rate(Key::Worker { shards, prefetch })
    }

    /// Broker-only ceiling of the same shard count and prefetch.
    fn broker_ceiling(&self, shards: u16, prefetch: u16) -> Option<f64> {
        self.rate(Key::BrokerOnly { shards, prefetch })
    }

    /// Database-only ceiling of the same concurrency and transaction size:
    /// 1 msg/tx for PREFETCH=1, the batch statement with PREFETCH per tx else.
    pub fn db_ceiling(&self, tasks: u16, prefetch: u16) -> Option<f64> {
        if prefetch == 1 {
            self.rate(Key::DbOnly {
                tasks,
                batch: 1,
                mode: DbKind::PerMessage,
            })
        } else {
            let batch = usize::from(prefetch);
            self.rate(Key::DbOnly {
                tasks,
                batch,
                mode: DbKind::Statement,
            })
        }
    }

    fn cost(&self, prefetch: u16) -> Option<String> {
        let s = self.scenario(Key::Worker {
            shards: 4,
            prefetch,
        })?;
        Some(format!(
            "Cost, PREFETCH={prefetch}, 4 shards: {} µs worker CPU per message, peak RSS {} MiB",
            s.median_of(|w| Some(w.cpu_us_per_msg))
                .map_or("—".into(), |v| format!("{v:.0}")),
            s.peak_rss().map_or("—".into(), |v| format!("{v:.1}")),
        ))
    }

    fn headlines(&self) -> Vec<String> {
        let mut out = Vec::new();
        let base = self.worker(1, 1);
        let w41 = self.worker(4, 1);
        out.push(format!(
            "PREFETCH=1, 4 shards: {} msg/s = {} broker-only prefetch-1 ceiling ({} msg/s), {} database-only 1-msg/tx ceiling at 4 tasks ({} msg/s)",
            fmt_rate(w41),
            fmt_ratio(ratio(w41, self.broker_ceiling(4, 1))),
            fmt_rate(self.broker_ceiling(4, 1)),
            fmt_ratio(ratio(w41, self.db_ceiling(4, 1))),
            fmt_rate(self.db_ceiling(4, 1)),
        ));
        // Strict mode cannot overlap the two: the next delivery comes only
        // after the ack, the ack only after the commit. Each shard's message
        // costs one broker turn plus one commit, so the pool is bounded by
        // 1 / (1/broker + 1/database) at the same shards and concurrency.
        let serial = self
            .broker_ceiling(4, 1)
            .zip(self.db_ceiling(4, 1))
            .map(|(b, d)| 1.0 / (1.0 / b + 1.0 / d));
        out.push(format!(
            "PREFETCH=1, 4 shards, serial bound (one broker turn then one commit per message, never overlapped: 1 / (1/broker + 1/database)): {} msg/s = {} the broker-only ceiling; the worker reaches {} of it",
            fmt_rate(serial),
            fmt_ratio(ratio(serial, self.broker_ceiling(4, 1))),
            fmt_ratio(ratio(w41, serial)),
        ));
        let piped = self.rate(Key::WorkerPipelined { shards: 4 });
        if piped.is_some() {
            let lower = self
                .broker_ceiling(4, 1)
                .zip(self.db_ceiling(4, 1))
                .map(|(b, d)| b.min(d));
            out.push(format!(
                "Pipelined strict (PREFETCH=2, BATCH_MAX=1), 4 shards: {} msg/s = {} PREFETCH=1, {} the serial bound, {} min(broker-only prefetch-1 ceiling, database-only 1-msg/tx ceiling) ({} msg/s)",
                fmt_rate(piped),
                fmt_ratio(ratio(piped, w41)),
                fmt_ratio(ratio(piped, serial)),
                fmt_ratio(ratio(piped, lower)),
                fmt_rate(lower),
            ));
        }
        let best = self
            .plan
            .shard_counts
            .iter()
            .filter_map(|&s| Some((s, self.worker(s, 1)?)))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        if let Some((s, r)) = best {
            out.push(format!(
                "Baseline anti-pattern (one queue, one consumer, prefetch 1): {} msg/s = {} broker-only 1-shard ceiling; 4 shards at prefetch 1 = {} the baseline; best at prefetch 1: {s} shards, {r:.0} msg/s = {}",
                fmt_rate(base),
                fmt_ratio(ratio(base, self.broker_ceiling(1, 1))),
                fmt_ratio(ratio(w41, base)),
                fmt_ratio(ratio(Some(r), base)),
            ));
        }
        for &p in &self.plan.prefetches {
            let wp = self.worker(4, p);
            out.push(format!(
                "PREFETCH={p} (ordered batches), 4 shards: {} msg/s = {} broker-only prefetch-{p} ceiling ({} msg/s), {} database-only batch ceiling ({p}/tx, 4 tasks: {} msg/s); {} PREFETCH=1, {} the baseline",
                fmt_rate(wp),
                fmt_ratio(ratio(wp, self.broker_ceiling(4, p))),
                fmt_rate(self.broker_ceiling(4, p)),
                fmt_ratio(ratio(wp, self.db_ceiling(4, p))),
                fmt_rate(self.db_ceiling(4, p)),
                fmt_ratio(ratio(wp, w41)),
                fmt_ratio(ratio(wp, base)),
            ));
            let piped = self.rate(Key::WorkerPipelinedBatch {
                shards: 4,
                batch: p,
            });
            if piped.is_some() {
                out.push(format!(
                    "Pipelined batches (PREFETCH={}, BATCH_MAX={p}), 4 shards: {} msg/s = {} database-only batch ceiling ({p}/tx), {} PREFETCH={p}",
                    2 * p,
                    fmt_rate(piped),
                    fmt_ratio(ratio(piped, self.db_ceiling(4, p))),
                    fmt_ratio(ratio(piped, wp)),
                ));
            }
            let wu = self.rate(Key::WorkerUnix {
                shards: 4,
                prefetch: p,
            });
            let du = self.rate(Key::DbOnlyUnix {
                tasks: 4,
                batch: usize::from(p),
            });
            if wu.is_some() {
                out.push(format!(
                    "PREFETCH={p}, 4 shards, database via Unix socket (no TCP Nagle): {} msg/s = {} the TCP row; database-only batch ceiling via Unix socket {} msg/s ({} the TCP one)",
                    fmt_rate(wu),
                    fmt_ratio(ratio(wu, wp)),
                    fmt_rate(du),
                    fmt_ratio(ratio(du, self.db_ceiling(4, p))),
                ));
            }
        }
        let largest = self.plan.prefetches.iter().copied().max().unwrap_or(1);
        out.extend(self.cost(1));
        out.extend(self.cost(largest));
        for set in &self.latency {
            for l in &set.rows {
                out.push(format!(
                    "Latency, PREFETCH={}, {} shards, at {:.0} % of max ({:.0} msg/s offered): p50 {:.1} ms, p99 {:.1} ms, p99.9 {:.1} ms",
                    set.prefetch,
                    set.shards,
                    l.load * 100.0,
                    l.offered_rate,
                    l.p50_ms,
                    l.p99_ms,
                    l.p999_ms
                ));
            }
        }
        out
    }
}
