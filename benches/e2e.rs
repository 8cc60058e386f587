//! End-to-end benchmark of urutan against the local RabbitMQ and PostgreSQL.
//!
//! `cargo bench --bench e2e -- [--quick]` measures, side by side in one run:
//! the ceilings (broker alone: drain with ack-only consumers; database alone:
//! the apply statement per message and batched), the real worker pool
//! (`urutan run`, release build) draining a backlog at several shard counts
//! and prefetch settings, open-loop latency at 25/50/80 % of the measured
//! maximum, and the worker's CPU per message and peak RSS. Each scenario runs
//! in its own vhost and database, deleted afterwards (also on error and on
//! Ctrl-C). `--backlog-1m` instead drains 1,000,000 messages and samples the
//! worker's RSS every second. `--sustained` instead steps an open-loop load
//! up to and past saturation for the broker alone, strict, pipelined strict
//! and batch mode, and finds each one's knee (p99 under 50 / 250 ms).
//! `--scale LEVELS` instead drains the same backlog on databases prefilled
//! with LEVEL processed messages, with and without a partition drop
//! (`scale.rs`).
//! Results: `benches/results/` (see its README).
//!
//! Without `--bench` (as under `cargo test --all-targets`) it does nothing.

// The bench's own modules, in `benches/e2e/`.
mod e2e {
    pub mod ab;
    pub mod ceilings;
    pub mod chart;
    pub mod load;
    pub mod procfs;
    pub mod report;
    pub mod runs;
    pub mod scale;
    pub mod sustained;
}

use e2e::{ab, ceilings, chart, load, procfs, report, runs, scale, sustained};
use urutan_testkit::{bench_env as env, http, process};

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use ceilings::DbMode;
use load::Workload;
use report::{DbKind, Key, LatencySet, Plan, Report, Sample, Scenario};

const USAGE: &str = "usage: cargo bench --bench e2e -- [--quick] [--rounds N] [--messages N] \
[--latency-secs S] [--only LABEL-PART]... [--out DIR]\n       cargo bench --bench e2e -- --backlog-1m [--messages N] \
[--shards N] [--prefetch N] [--scrape-secs S] [--out DIR]\n       cargo bench --bench e2e -- --sustained [--quick] [--step-secs S] [--rounds N] [--out DIR]\n       cargo bench --bench e2e -- --ab NAME=BIN --ab NAME=BIN... [--shards N] [--prefetch N] \
[--messages N] [--rounds N] [--out DIR]\n       cargo bench --bench e2e -- --scale LEVELS [--messages N] [--shards N] [--rounds N] [--out DIR]\n       cargo bench --bench e2e -- --replot [--out DIR]";

#[derive(Debug, Default)]
struct Options {
    quick: bool,
    backlog_1m: bool,
    /// Open-loop steps up to saturation per configuration (`sustained.rs`).
    sustained: bool,
    step_secs: Option<f64>,
    rounds: Option<usize>,
    messages: Option<usize>,
    latency_secs: Option<f64>,
    shards: Option<u16>,
    prefetch: Option<u16>,
    out: Option<PathBuf>,
    /// Only scenarios whose label contains one of these (for a partial rerun).
    only: Vec<String>,
    /// Rewrite latest.md and latest.png from latest.json, measuring nothing.
    replot: bool,
    /// Backlog mode: the scrape interval of its second drain.
    scrape_secs: Option<u64>,
    /// A/B mode: worker binaries compared side by side (`NAME=PATH`).
    ab: Vec<ab::Variant>,
    /// Scale mode: drains on databases prefilled with these many messages.
    scale: Option<Vec<i64>>,
}

fn parse_options(args: &[String]) -> anyhow::Result<Options> {
    let mut o = Options::default();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .cloned()
                .with_context(|| format!("{name} needs a value"))
        };
        match arg.as_str() {
            "--bench" => {}
            "--quick" => o.quick = true,
            "--backlog-1m" => o.backlog_1m = true,
            "--sustained" => o.sustained = true,
            "--step-secs" => o.step_secs = Some(value(arg)?.parse()?),
            "--rounds" => o.rounds = Some(value(arg)?.parse()?),
            "--messages" => o.messages = Some(value(arg)?.parse()?),
            "--latency-secs" => o.latency_secs = Some(value(arg)?.parse()?),
            "--shards" => o.shards = Some(value(arg)?.parse()?),
            "--prefetch" => o.prefetch = Some(value(arg)?.parse()?),
            "--out" => o.out = Some(value(arg)?.into()),
            "--only" => o.only.push(value(arg)?),
            "--replot" => o.replot = true,
            "--scrape-secs" => o.scrape_secs = Some(value(arg)?.parse()?),
            "--ab" => o.ab.push(ab::parse_variant(&value(arg)?)?),
            "--scale" => o.scale = Some(scale::parse_levels(&value(arg)?)?),
            other => bail!("unknown argument `{other}`\n{USAGE}"),
        }
    }
    Ok(o)
}

fn plan(o: &Options) -> Plan {
    let (messages, db_messages, rounds, latency_secs) = if o.quick {
        (3_000, 2_000, 1, 5.0)
    } else {
        (10_000, 5_000, 3, 15.0)
    };
    let messages = o.messages.unwrap_or(messages);
    let db_messages = o.messages.map_or(db_messages, |m| m.min(db_messages));
    Plan {
        mode: if o.quick { "quick" } else { "full" }.into(),
        messages,
        db_messages,
        batch_scale: BATCH_SCALE,
        rounds: o.rounds.unwrap_or(rounds).max(1),
        shard_counts: vec![1, 2, 4, 8, 16],
        prefetches: vec![16, 64, 256],
        db_loop_batch: 100,
        latency_shards: 4,
        latency_loads: vec![0.25, 0.5, 0.8],
        latency_secs: o.latency_secs.unwrap_or(latency_secs),
    }
}

/// Batch rows drain this many times more messages (they are ~10× faster),
/// so that every drain lasts seconds, not a few polls.
const BATCH_SCALE: usize = 4;

/// A worker row at `shards` and `prefetch`, after its two ceilings: the
/// broker alone at the same shards and prefetch, and the database alone
/// with as many tasks, `prefetch` messages per transaction (`db`).
fn with_ceilings(shards: u16, prefetch: u16, db: DbKind) -> [Key; 3] {
    [
        Key::BrokerOnly { shards, prefetch },
        Key::DbOnly {
            tasks: shards,
            batch: usize::from(prefetch),
            mode: db,
        },
        Key::Worker { shards, prefetch },
    ]
}

/// The scenarios of one round, grouped so that a worker row runs next to
/// its ceilings (drift on a noisy machine hits them alike).
fn round_order(p: &Plan) -> Vec<Key> {
    let mut keys = Vec::new();
    for &s in &p.shard_counts {
        keys.extend(with_ceilings(s, 1, DbKind::PerMessage));
        if s == p.latency_shards {
            keys.push(Key::WorkerPipelined { shards: s });
        }
    }
    for &f in &p.prefetches {
        keys.extend(with_ceilings(4, f, DbKind::Statement));
        keys.push(Key::WorkerPipelinedBatch {
            shards: 4,
            batch: f,
        });
        // The same over PostgreSQL's Unix socket: sqlx leaves Nagle on for
        // TCP, which can stall a large batch statement (see the README).
        keys.push(Key::DbOnlyUnix {
            tasks: 4,
            batch: usize::from(f),
        });
        keys.push(Key::WorkerUnix {
            shards: 4,
            prefetch: f,
        });
    }
    keys.push(Key::DbOnly {
        tasks: 4,
        batch: p.db_loop_batch,
        mode: DbKind::Loop,
    });
    keys
}

/// Runs one scenario once.
async fn run_once(key: Key, p: &Plan, bin: &Path, logs: &Path) -> anyhow::Result<Sample> {
    let work = Workload::about(p.messages_for(key));
    Ok(match key {
        Key::BrokerOnly { shards, prefetch } => {
            let m = ceilings::broker_only(work, shards, prefetch).await?;
            Sample::measured(&m, String::new())
        }
        Key::DbOnly { tasks, batch, mode } => {
            let mode = match mode {
                DbKind::PerMessage => DbMode::PerMessage,
                DbKind::Loop => DbMode::Loop(batch),
                DbKind::Statement => DbMode::Statement(batch),
            };
            let (m, note) = ceilings::db_only(work, tasks, mode, false).await?;
            Sample::measured(&m, note)
        }
        Key::DbOnlyUnix { tasks, batch } => {
            let mode = DbMode::Statement(batch);
            let (m, note) = ceilings::db_only(work, tasks, mode, true).await?;
            Sample::measured(&m, note)
        }
        Key::Worker { shards, prefetch } => {
            let r = runs::throughput(bin, logs, work, shards, prefetch, false, &[]).await?;
            Sample::worker(r)
        }
        Key::WorkerUnix { shards, prefetch } => {
            let r = runs::throughput(bin, logs, work, shards, prefetch, true, &[]).await?;
            Sample::worker(r)
        }
        Key::WorkerPipelined { shards } => {
            let extra = [("BATCH_MAX", "1".to_owned())];
            let r = runs::throughput(bin, logs, work, shards, 2, false, &extra).await?;
            Sample::worker(r)
        }
        Key::WorkerPipelinedBatch { shards, batch } => {
            let extra = [("BATCH_MAX", batch.to_string())];
            let r = runs::throughput(bin, logs, work, shards, 2 * batch, false, &extra).await?;
            Sample::worker(r)
        }
    })
}

async fn run_matrix(p: &Plan, only: &[String], bin: &Path, logs: &Path) -> Vec<Scenario> {
    let mut order = round_order(p);
    if !only.is_empty() {
        order.retain(|k| only.iter().any(|o| k.label().contains(o.as_str())));
    }
    let mut scenarios: Vec<Scenario> = order.iter().map(|k| Scenario::new(*k)).collect();
    let steps = order.len() * p.rounds;
    let mut step = 0;
    for round in 0..p.rounds {
        let mut keys = order.clone();
        if round % 2 == 1 {
            keys.reverse();
        }
        for key in keys {
            step += 1;
            let Some(scenario) = scenarios.iter_mut().find(|s| s.key == key) else {
                continue;
            };
            // A second attempt absorbs a disturbance (e.g. a broker restart by a test).
            for attempt in 1..=2 {
                let began = Instant::now();
                match run_once(key, p, bin, logs).await {
                    Ok(mut sample) => {
                        sample.round = round;
                        eprintln!(
                            "e2e [{step}/{steps}] {}: {:.0} msg/s{} ({:.0} s)",
                            key.label(),
                            sample.rate,
                            sample.detail(),
                            began.elapsed().as_secs_f64()
                        );
                        scenario.samples.push(sample);
                        break;
                    }
                    Err(e) => {
                        eprintln!(
                            "e2e [{step}/{steps}] {} attempt {attempt} failed: {e:#}",
                            key.label()
                        );
                        scenario
                            .errors
                            .push(format!("round {round} attempt {attempt}: {e:#}"));
                    }
                }
            }
        }
    }
    scenarios
}

async fn default_run(o: &Options, out: &Path, bin: &Path, logs: &Path) -> anyhow::Result<bool> {
    let began = Instant::now();
    let p = plan(o);
    let machine = procfs::describe_machine();
    eprintln!(
        "e2e: {} run, {} messages per drain, {} round(s); worker {}",
        p.mode,
        p.messages,
        p.rounds,
        bin.display()
    );
    let scenarios = run_matrix(&p, &o.only, bin, logs).await;
    let largest = p.prefetches.iter().copied().max().unwrap_or(1);
    let mut latency = Vec::new();
    let wanted = |prefetch: u16| {
        let label = format!("latency, prefetch {prefetch}");
        o.only.is_empty() || o.only.iter().any(|x| label.contains(x.as_str()))
    };
    for prefetch in [1, largest].into_iter().filter(|p| wanted(*p)) {
        let key = Key::Worker {
            shards: p.latency_shards,
            prefetch,
        };
        let max = scenarios
            .iter()
            .find(|s| s.key == key)
            .and_then(Scenario::median_rate);
        latency.push(latency_set(&p, bin, logs, prefetch, max).await);
    }
    let report = Report::new(machine, p, scenarios, latency, began.elapsed());
    let failed = report.failed();
    report.write(out)?;
    if let Err(e) = chart::draw(&report, &out.join("latest.png")) {
        eprintln!("e2e: no chart: {e:#}");
    }
    Ok(!failed)
}

/// Latency of one configuration at the plan's shares of its measured maximum
/// (two attempts).
async fn latency_set(
    p: &Plan,
    bin: &Path,
    logs: &Path,
    prefetch: u16,
    max: Option<f64>,
) -> LatencySet {
    let mut set = LatencySet {
        shards: p.latency_shards,
        prefetch,
        max_rate: max,
        rows: Vec::new(),
        error: None,
    };
    let Some(max) = max else {
        set.error = Some("no throughput measured for this configuration".into());
        return set;
    };
    eprintln!(
        "e2e: latency, PREFETCH={prefetch}, at {:?} of {max:.0} msg/s",
        p.latency_loads
    );
    for attempt in 1..=2 {
        let result = runs::latency(
            bin,
            logs,
            p.latency_shards,
            prefetch,
            max,
            &p.latency_loads,
            p.latency_secs,
        )
        .await;
        match result {
            Ok(rows) => {
                for r in &rows {
                    eprintln!(
                        "e2e: latency PREFETCH={prefetch} at {:.0} % ({:.0} msg/s): p50 {:.1} ms, p99 {:.1} ms, p99.9 {:.1} ms",
                        r.load * 100.0,
                        r.offered_rate,
                        r.p50_ms,
                        r.p99_ms,
                        r.p999_ms
                    );
                }
                set.rows = rows;
                set.error = None;
                break;
            }
            Err(e) => {
                eprintln!("e2e: latency PREFETCH={prefetch} attempt {attempt} failed: {e:#}");
                set.error = Some(format!("{e:#}"));
            }
        }
    }
    set
}

async fn backlog_run(o: &Options, out: &Path, bin: &Path, logs: &Path) -> anyhow::Result<bool> {
    let began = Instant::now();
    let machine = procfs::describe_machine();
    let work = Workload::about(o.messages.unwrap_or(1_000_000));
    let (shards, prefetch) = (o.shards.unwrap_or(4), o.prefetch.unwrap_or(256));
    eprintln!(
        "e2e: backlog drain of {} messages, {shards} shards, prefetch {prefetch}",
        work.len()
    );
    // Twice: nobody reading /metrics, then a Prometheus-like scrape every
    // 15 s (the exporter keeps histogram samples until a scrape drains them).
    let mut drains = Vec::new();
    for scrape in [None, Some(Duration::from_secs(o.scrape_secs.unwrap_or(15)))] {
        let limit = Duration::from_secs(3600);
        drains.push(runs::backlog(bin, logs, work, (shards, prefetch), scrape, limit).await?);
    }
    report::write_backlog(out, &machine, &drains, began.elapsed())?;
    if let Err(e) = chart::draw_backlog(&drains, &out.join("backlog-1m.png")) {
        eprintln!("e2e: no chart: {e:#}");
    }
    Ok(drains.iter().all(|d| d.verified == "ok"))
}

async fn run(o: Options) -> anyhow::Result<bool> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = o
        .out
        .clone()
        .unwrap_or_else(|| root.join("benches/results"));
    std::fs::create_dir_all(&out)?;
    let bin = std::env::var_os("URUTAN_BIN").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_urutan")),
        PathBuf::from,
    );
    let logs = root.join(format!("target/bench-logs/e2e-{}", std::process::id()));
    for removed in env::sweep_stale().await {
        eprintln!("e2e: removed leftover {removed}");
    }
    tokio::spawn(async {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(mut term) = signal(SignalKind::terminate()) else {
            return;
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        eprintln!("e2e: interrupted; cleaning up");
        env::cleanup_all();
        std::process::exit(130);
    });
    if o.replot {
        let report = report::Report::load(&out.join("latest.json"))?;
        report.write(&out)?;
        chart::draw(&report, &out.join("latest.png"))?;
        return Ok(true);
    }
    let ok = if let Some(levels) = &o.scale {
        let plan = scale::ScalePlan::new(levels.clone(), o.messages, o.shards, o.rounds);
        scale::run(&plan, &bin, &logs, &out).await?
    } else if !o.ab.is_empty() {
        let plan = ab::AbPlan {
            shards: o.shards.unwrap_or(4),
            prefetch: o.prefetch.unwrap_or(1),
            messages: o.messages.unwrap_or(10_000),
            rounds: o.rounds.unwrap_or(3).max(1),
        };
        ab::run(&o.ab, &plan, &logs, &out).await?
    } else if o.backlog_1m {
        backlog_run(&o, &out, &bin, &logs).await?
    } else if o.sustained {
        sustained_run(&o, &out, &bin, &logs).await?
    } else {
        default_run(&o, &out, &bin, &logs).await?
    };
    eprintln!("e2e: worker logs in {}", logs.display());
    Ok(ok)
}

/// `--sustained`: every curve, then `sustained.{md,json,png}`.
async fn sustained_run(o: &Options, out: &Path, bin: &Path, logs: &Path) -> anyhow::Result<bool> {
    let began = Instant::now();
    let plan = sustained::SustainedPlan::new(o.quick, o.step_secs, o.rounds);
    let machine = procfs::describe_machine();
    let rounds = sustained::run(&plan, bin, logs).await;
    let curves = sustained::medians(&plan, &rounds);
    let describe = format!(
        "{} × {} ({:.0} GiB), RabbitMQ {}, PostgreSQL {}, commit {}{}",
        machine.nproc,
        machine.cpu_model,
        machine.memory_gib,
        machine.rabbitmq,
        machine.postgresql,
        machine.git_commit,
        if machine.git_dirty_files > 0 {
            " (dirty)"
        } else {
            ""
        }
    );
    let md = sustained::markdown(&plan, &curves, &rounds, &describe, began.elapsed());
    println!("{md}");
    std::fs::write(out.join("sustained.md"), &md)?;
    let json =
        serde_json::json!({ "plan": plan, "machine": machine, "curves": curves, "rounds": rounds });
    std::fs::write(
        out.join("sustained.json"),
        serde_json::to_string_pretty(&json)?,
    )?;
    if let Err(e) = chart::draw_sustained(&curves, &out.join("sustained.png")) {
        eprintln!("e2e: no chart: {e:#}");
    }
    eprintln!("e2e: wrote {}/sustained.{{md,json,png}}", out.display());
    Ok(curves.iter().all(|c| c.error.is_none()))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !args.iter().any(|a| a == "--bench") {
        println!(
            "e2e bench: skipped (needs the local services; run `cargo bench --bench e2e -- --quick`)"
        );
        return ExitCode::SUCCESS;
    }
    let options = match parse_options(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("e2e: {e:#}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("e2e: no runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(run(options));
    drop(runtime);
    env::cleanup_all();
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!(
                "e2e: finished, but some scenarios failed or did not verify (see the results)"
            );
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("e2e: {e:#}");
            ExitCode::FAILURE
        }
    }
}
