//! Rendering: the Markdown tables (`latest.md`, also printed), the JSON
//! (`latest.json`), and the backlog report (`backlog-1m.*`).

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use super::{DbKind, Key, LatencySet, Report, fmt_rate, fmt_ratio, median, ratio};
use crate::procfs::{CpuSplit, Machine};
use crate::runs::BacklogRun;

impl Report {
    pub fn markdown(&self) -> String {
        let m = &self.machine;
        let p = &self.plan;
        let mut s = String::new();
        let _ = writeln!(s, "# urutan end-to-end benchmark\n");
        let _ = writeln!(
            s,
            "- Run: {} mode, {} round(s) (medians shown, range = min–max over rounds), took {:.1} min, started {}",
            p.mode,
            p.rounds,
            self.duration_s / 60.0,
            m.started_at
        );
        let _ = writeln!(
            s,
            "- Messages per drain: {} at PREFETCH=1, {} for batch rows (PREFETCH > 1); database-only {} at 1 msg/tx, {} batched",
            p.messages,
            p.messages * p.batch_scale,
            p.db_messages,
            p.db_messages * p.batch_scale
        );
        let _ = writeln!(
            s,
            "- Machine: {} cores ({}), {:.1} GiB RAM, Linux {}; RabbitMQ {}; PostgreSQL {}; {}",
            m.nproc, m.cpu_model, m.memory_gib, m.kernel, m.rabbitmq, m.postgresql, m.rustc
        );
        let _ = writeln!(
            s,
            "- Code: commit {}{}; worker = `urutan run` (release build, `RUST_LOG=warn`, default `BATCH_MAX` = PREFETCH, `BATCH_LINGER_MS` = 5)",
            m.git_commit,
            if m.git_dirty_files > 0 {
                format!(" + {} uncommitted file change(s)", m.git_dirty_files)
            } else {
                String::new()
            }
        );
        let _ = writeln!(
            s,
            "- Workload: orders × 4 versions each, published version-major, ~300-byte bodies, string `x-pesanan-id`, persistent, confirmed; `pesanan` → `pesanan-hash` → quorum shard queues; each scenario in a fresh vhost and database\n"
        );
        let _ = writeln!(s, "## Headline\n");
        for h in &self.headline {
            let _ = writeln!(s, "- {h}");
        }
        self.worker_table(&mut s);
        self.ceiling_table(&mut s);
        self.cpu_table(&mut s);
        for set in &self.latency {
            latency_table(&mut s, set, p.latency_secs);
        }
        let errors: Vec<String> = self
            .scenarios
            .iter()
            .flat_map(|sc| sc.errors.iter().map(move |e| format!("{}: {e}", sc.label)))
            .chain(self.latency.iter().filter_map(|l| {
                Some(format!(
                    "latency PREFETCH={}: {}",
                    l.prefetch,
                    l.error.as_ref()?
                ))
            }))
            .collect();
        if !errors.is_empty() {
            let _ = writeln!(s, "\n## Failed attempts\n");
            for e in errors {
                let first = e.lines().next().unwrap_or("");
                let _ = writeln!(s, "- {first}");
            }
        }
        s
    }

    fn ceiling_table(&self, s: &mut String) {
        let _ = writeln!(s, "\n## Ceilings (no worker)\n");
        let _ = writeln!(
            s,
            "| ceiling | concurrency | messages | msg/s (median) | range | how |"
        );
        let _ = writeln!(s, "|---|---|---:|---:|---:|---|");
        for sc in &self.scenarios {
            let (what, conc) = match sc.key {
                Key::BrokerOnly { shards, prefetch } => (
                    if prefetch == 1 {
                        "broker only, prefetch 1: drain, ack per message".to_owned()
                    } else {
                        format!(
                            "broker only, prefetch {prefetch}: drain, one multiple-ack per batch (≤ {prefetch}, 5 ms linger)"
                        )
                    },
                    format!("{shards} shard consumer(s)"),
                ),
                Key::DbOnly { tasks, batch, mode } => (
                    match mode {
                        DbKind::PerMessage => "database only, 1 msg/tx".to_owned(),
                        DbKind::Loop => format!("database only, {batch} msg/tx, statement loop"),
                        DbKind::Statement => {
                            format!("database only, {batch} msg/tx, one statement")
                        }
                    },
                    format!("{tasks} task(s)"),
                ),
                Key::DbOnlyUnix { tasks, batch } => (
                    format!("database only, {batch} msg/tx, one statement, via Unix socket"),
                    format!("{tasks} task(s)"),
                ),
                Key::Worker { .. }
                | Key::WorkerUnix { .. }
                | Key::WorkerPipelined { .. }
                | Key::WorkerPipelinedBatch { .. } => {
                    continue;
                }
            };
            let note = sc
                .samples
                .iter()
                .map(|x| x.note.as_str())
                .find(|n| !n.is_empty())
                .unwrap_or("");
            let note = if note.is_empty() {
                String::new()
            } else {
                format!("`{note}`")
            };
            let _ = writeln!(
                s,
                "| {what} | {conc} | {} | {} | {} | {note} |",
                self.plan.messages_for(sc.key),
                fmt_rate(sc.median_rate),
                sc.spread()
            );
        }
    }

    /// Where each drain's CPU went, and the rate the machine's cores would
    /// allow at that cost: what separates a worker row from its ceilings
    /// when both are measured on the same few cores.
    fn cpu_table(&self, s: &mut String) {
        let rows: Vec<_> = self
            .scenarios
            .iter()
            .filter(|sc| sc.samples.iter().any(|x| x.cpu.is_some()))
            .collect();
        if rows.is_empty() {
            return;
        }
        let _ = writeln!(s, "\n## CPU per message (µs, medians)\n");
        let _ = writeln!(
            s,
            "| scenario | msg/s | consumer | broker | database | total | {} cores ÷ total (msg/s) | × msg/s |",
            self.machine.nproc
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|");
        for sc in rows {
            let of = |f: fn(&CpuSplit) -> f64| {
                median(
                    sc.samples
                        .iter()
                        .filter_map(|x| x.cpu.as_ref())
                        .map(f)
                        .collect(),
                )
            };
            let total = of(CpuSplit::total_us);
            let bound = total.map(|t| self.machine.nproc as f64 * 1e6 / t);
            let us = |v: Option<f64>| v.map_or("—".into(), |v| format!("{v:.0}"));
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                sc.label,
                fmt_rate(sc.median_rate),
                us(of(|c| c.consumer_us)),
                us(of(|c| c.broker_us)),
                us(of(|c| c.database_us)),
                us(total),
                fmt_rate(bound),
                fmt_ratio(ratio(bound, sc.median_rate)),
            );
        }
        let _ = writeln!(
            s,
            "\n- Process CPU (utime + stime from `/proc`) between the drain's first and last progress, ÷ messages. Consumer: the worker process for `urutan run` rows; the bench itself (its ack-only consumers or apply tasks) for a ceiling. Broker: every `beam.smp`. Database: every `postgres` process, plus exited backends (the postmaster's children time).\n- {} cores ÷ total: the rate at which this drain's processes alone would keep every core busy; × msg/s: how far the drain was from that (1.00× = CPU-bound).",
            self.machine.nproc
        );
    }

    fn worker_table(&self, s: &mut String) {
        let _ = writeln!(s, "\n## Worker pool: backlog drain (`urutan run`)\n");
        let _ = writeln!(
            s,
            "| shards | PREFETCH | msg/s | range | × broker ceiling | × DB ceiling | × baseline | batch | worker CPU µs/msg | peak RSS MiB | host CPU busy | check |"
        );
        let _ = writeln!(
            s,
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
        );
        let base = self.worker(1, 1);
        for sc in &self.scenarios {
            let (shards, prefetch, unix) = match sc.key {
                Key::Worker { shards, prefetch } => (shards, prefetch, false),
                Key::WorkerUnix { shards, prefetch } => (shards, prefetch, true),
                // Its ceilings are strict mode's: one message per transaction.
                Key::WorkerPipelined { shards } => (shards, 1, false),
                // Compared with the ceilings of its batch size.
                Key::WorkerPipelinedBatch { shards, batch } => (shards, batch, false),
                _ => continue,
            };
            let r = sc.median_rate;
            let name = if matches!(sc.key, Key::WorkerPipelined { .. }) {
                format!("{shards} (pipelined strict: PREFETCH=2, BATCH_MAX=1)")
            } else if matches!(sc.key, Key::WorkerPipelinedBatch { .. }) {
                format!(
                    "{shards} (pipelined batches: PREFETCH={}, BATCH_MAX={prefetch})",
                    2 * prefetch
                )
            } else if shards == 1 && prefetch == 1 {
                "1 (baseline: one queue, one consumer)".to_owned()
            } else if unix {
                format!("{shards} (database via Unix socket)")
            } else {
                shards.to_string()
            };
            let db_ceiling = if unix {
                let batch = usize::from(prefetch);
                self.rate(Key::DbOnlyUnix {
                    tasks: shards,
                    batch,
                })
            } else {
                self.db_ceiling(shards, prefetch)
            };
            let _ = writeln!(
                s,
                "| {name} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                match sc.key {
                    Key::WorkerPipelined { .. } => 2,
                    Key::WorkerPipelinedBatch { batch, .. } => 2 * batch,
                    _ => prefetch,
                },
                fmt_rate(r),
                sc.spread(),
                fmt_ratio(ratio(r, self.broker_ceiling(shards, prefetch))),
                fmt_ratio(ratio(r, db_ceiling)),
                fmt_ratio(ratio(r, base)),
                sc.median_of(|w| w.mean_batch)
                    .map_or("—".into(), |v| format!("{v:.1}")),
                sc.median_of(|w| Some(w.cpu_us_per_msg))
                    .map_or("—".into(), |v| format!("{v:.0}")),
                sc.peak_rss().map_or("—".into(), |v| format!("{v:.1}")),
                sc.median_of(|w| w.host_cpu_busy)
                    .map_or("—".into(), |v| format!("{:.0} %", v * 100.0)),
                sc.check(),
            );
        }
        let _ = writeln!(
            s,
            "\n- msg/s: messages drained after the first progress poll ÷ time to the poll that saw them all (50 ms polls of the history's sequence, the end confirmed by `count(*) FROM pesan_diproses`). Batch: mean messages per apply transaction.\n- × broker ceiling: ÷ broker-only drain with the same shards and prefetch. × DB ceiling: ÷ database-only drain with one task per shard and the same transaction size (1 msg/tx at PREFETCH=1; the batch statement `urutan_terapkan_batch` with PREFETCH msgs/tx otherwise). × baseline: ÷ the 1-shard PREFETCH=1 row.\n- CPU: worker utime+stime over the drain ÷ messages. Peak RSS: worker `VmHWM`. Host CPU busy: whole machine; worker, RabbitMQ and PostgreSQL share its {} cores.\n- Check: every message applied once, versions in order per order, nothing parked or dead-lettered, clean exit on SIGTERM.",
            self.machine.nproc
        );
    }

    /// Writes `latest.md` and `latest.json` into `dir` and prints the Markdown.
    pub fn write(&self, dir: &Path) -> anyhow::Result<()> {
        let md = self.markdown();
        println!("{md}");
        std::fs::write(dir.join("latest.md"), &md)?;
        std::fs::write(
            dir.join("latest.json"),
            serde_json::to_string_pretty(self)? + "\n",
        )?;
        Ok(())
    }
}

fn latency_table(s: &mut String, set: &LatencySet, secs: f64) {
    let _ = writeln!(
        s,
        "\n## Latency: open-loop fixed rate, PREFETCH={}, {} shards\n",
        set.prefetch, set.shards
    );
    let _ = writeln!(
        s,
        "Offered load as a share of this configuration's measured drain rate ({} msg/s), {secs:.0} s per step after a 2 s warm-up. Latency = publish (client clock, just before `basic.publish`) → `pesanan_riwayat.diterapkan_pada` (the apply transaction's `now()`), same host clock.\n",
        fmt_rate(set.max_rate)
    );
    let _ = writeln!(
        s,
        "| load | offered msg/s | published msg/s | messages | p50 ms | p99 ms | p99.9 ms | max ms | mean ms |"
    );
    let _ = writeln!(s, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for l in &set.rows {
        let _ = writeln!(
            s,
            "| {:.0} % | {:.0} | {:.0} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
            l.load * 100.0,
            l.offered_rate,
            l.achieved_publish_rate,
            l.messages,
            l.p50_ms,
            l.p99_ms,
            l.p999_ms,
            l.max_ms,
            l.mean_ms
        );
    }
    if let Some(e) = &set.error {
        let _ = writeln!(s, "\nnot measured: {}", e.lines().next().unwrap_or(""));
    }
}

#[derive(Serialize)]
struct BacklogReport<'a> {
    machine: &'a Machine,
    duration_s: f64,
    drains: &'a [BacklogRun],
}

/// Median RSS over the first and the last third of a drain's samples.
fn rss_thirds(run: &BacklogRun) -> (Option<f64>, Option<f64>) {
    let rss: Vec<f64> = run
        .samples
        .iter()
        .filter(|x| x.applied > 0)
        .map(|x| x.rss_mib)
        .collect();
    let third = rss.len() / 3;
    (
        median(rss[..third].to_vec()),
        median(rss[rss.len() - third..].to_vec()),
    )
}

/// Writes `backlog-1m.md` and `backlog-1m.json` (with every RSS sample).
pub fn write_backlog(
    dir: &Path,
    m: &Machine,
    drains: &[BacklogRun],
    took: Duration,
) -> anyhow::Result<()> {
    let mut s = String::new();
    let first = drains.first();
    let _ = writeln!(
        s,
        "# urutan backlog drain: {} messages\n",
        first.map_or(0, |r| r.messages)
    );
    let _ = writeln!(
        s,
        "- Machine: {} cores ({}), {:.1} GiB RAM; RabbitMQ {}; PostgreSQL {}; commit {}{}; took {:.1} min, started {}",
        m.nproc,
        m.cpu_model,
        m.memory_gib,
        m.rabbitmq,
        m.postgresql,
        m.git_commit,
        if m.git_dirty_files > 0 {
            " + uncommitted changes"
        } else {
            ""
        },
        took.as_secs_f64() / 60.0,
        m.started_at
    );
    if let Some(r) = first {
        let _ = writeln!(
            s,
            "- Worker: `urutan run`, SHARD_COUNT={}, PREFETCH={}; the backlog is published first, then the worker drains it; RSS sampled every second\n",
            r.shards, r.prefetch
        );
    }
    let _ = writeln!(
        s,
        "| `/metrics` scraped | messages | publish msg/s | drain s | drain msg/s | worker CPU µs/msg | peak RSS MiB | RSS median, first third MiB | RSS median, last third MiB | check |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    for run in drains {
        let (early, late) = rss_thirds(run);
        let scraped = run.scrape_every_s.map_or("never".into(), |e| {
            format!("every {e:.0} s ({} scrapes)", run.scrapes)
        });
        let _ = writeln!(
            s,
            "| {scraped} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.1} | {} | {} | {}{} |",
            run.messages,
            run.publish_rate,
            run.drain_secs,
            run.rate,
            run.cpu_us_per_msg,
            run.peak_rss_mib,
            early.map_or("—".into(), |v| format!("{v:.1}")),
            late.map_or("—".into(), |v| format!("{v:.1}")),
            run.verified,
            if run.clean_stop { "" } else { ", unclean stop" }
        );
    }
    let _ = writeln!(
        s,
        "\nWhy two drains: the Prometheus exporter keeps every histogram sample (two per message) until a scrape of `/metrics` drains them, so with nobody scraping the worker's RSS grows with the messages handled; under a scrape it should stay flat. Every sample is in `backlog-1m.json`; `backlog-1m.png` plots them."
    );
    println!("{s}");
    std::fs::write(dir.join("backlog-1m.md"), &s)?;
    let json = BacklogReport {
        machine: m,
        duration_s: took.as_secs_f64(),
        drains,
    };
    std::fs::write(
        dir.join("backlog-1m.json"),
        serde_json::to_string_pretty(&json)? + "\n",
    )?;
    Ok(())
}
