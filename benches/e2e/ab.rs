//! `--ab NAME=PATH` (twice or more): worker binaries compared in ONE run.
//!
//! On this noisy shared machine only ratios measured side by side mean
//! anything, so every round drains the same backlog with each variant, in a
//! rotating order (round r starts with variant r mod n), next to the broker
//! and database ceilings of that round. Each variant's ratio to the first
//! variant and to the ceilings is taken per round, then the median over
//! rounds is reported. Results: `ab-s<shards>-p<prefetch>.{md,json}`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use serde::Serialize;

use crate::ceilings::{self, DbMode};
use crate::load::Workload;
use crate::procfs::{self, Machine};
use crate::report::median;
use crate::runs::{self, WorkerRun};

/// A worker binary under comparison.
#[derive(Debug, Clone, Serialize)]
pub struct Variant {
    pub name: String,
    pub bin: PathBuf,
}

/// Parses `NAME=PATH`.
pub fn parse_variant(arg: &str) -> anyhow::Result<Variant> {
    let (name, path) = arg
        .split_once('=')
        .with_context(|| format!("--ab wants NAME=PATH, got `{arg}`"))?;
    let bin = PathBuf::from(path);
    if !bin.is_file() {
        bail!("--ab {name}: no file at {}", bin.display());
    }
    Ok(Variant {
        name: name.to_owned(),
        bin,
    })
}

/// What the comparison runs.
#[derive(Debug, Clone, Serialize)]
pub struct AbPlan {
    pub shards: u16,
    pub prefetch: u16,
    pub messages: usize,
    pub rounds: usize,
}

/// One round: the ceilings and every variant's drain.
#[derive(Debug, Clone, Serialize)]
struct Round {
    broker: Option<f64>,
    database: Option<f64>,
    /// In the order of the variants (not the order they ran in).
    runs: Vec<Option<WorkerRun>>,
    order: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
struct Summary {
    name: String,
    rate: Option<f64>,
    rate_min: Option<f64>,
    rate_max: Option<f64>,
    vs_first: Option<f64>,
    vs_broker: Option<f64>,
    vs_database: Option<f64>,
    cpu_us_per_msg: Option<f64>,
    /// PostgreSQL's CPU per message over the drain (all its processes).
    db_us_per_msg: Option<f64>,
    /// The broker's CPU per message over the drain.
    broker_us_per_msg: Option<f64>,
    /// Rate × (worker + broker + database CPU s per message) ÷ cores, per
    /// round, median: 1.0 means no core was ever idle during the drain.
    cpu_bound_fraction: Option<f64>,
    /// WAL bytes per message over the drain.
    wal_bytes_per_msg: Option<f64>,
    peak_rss_mib: Option<f64>,
    checks: Vec<String>,
}

#[derive(Serialize)]
struct AbReport<'a> {
    machine: &'a Machine,
    plan: &'a AbPlan,
    variants: &'a [Variant],
    rounds: &'a [Round],
    summary: &'a [Summary],
    minutes: f64,
}

/// Runs the comparison and writes its files to `out`. Returns false if a
/// drain failed or did not verify.
pub async fn run(
    variants: &[Variant],
    plan: &AbPlan,
    logs: &Path,
    out: &Path,
) -> anyhow::Result<bool> {
    if variants.len() < 2 {
        bail!("--ab needs at least two variants");
    }
    let began = Instant::now();
    let machine = procfs::describe_machine();
    let work = Workload::about(plan.messages);
    let db_mode = if plan.prefetch == 1 {
        DbMode::PerMessage
    } else {
        DbMode::Statement(usize::from(plan.prefetch))
    };
    let mut rounds = Vec::new();
    let mut ok = true;
    for r in 0..plan.rounds {
        let broker = ceilings::broker_only(work, plan.shards, plan.prefetch).await;
        let database = ceilings::db_only(work, plan.shards, db_mode, false).await;
        let broker = report_ceiling(r, "broker only", broker.map(|m| m.rate()));
        let database = report_ceiling(r, "database only", database.map(|(m, _)| m.rate()));
        let n = variants.len();
        let order: Vec<usize> = (0..n).map(|i| (i + r) % n).collect();
        let mut runs_of_round: Vec<Option<WorkerRun>> = vec![None; n];
        for &v in &order {
            let variant = &variants[v];
            let logs = logs.join(format!("ab-{}-r{r}", variant.name));
            let run = runs::throughput(
                &variant.bin,
                &logs,
                work,
                plan.shards,
                plan.prefetch,
                false,
                &[],
            )
            .await;
            match run {
                Ok(run) => {
                    eprintln!(
                        "e2e ab [round {}/{}] {}: {:.0} msg/s, {:.0} µs CPU/msg, peak RSS {:.1} MiB, check {}",
                        r + 1,
                        plan.rounds,
                        variant.name,
                        run.rate,
                        run.cpu_us_per_msg,
                        run.peak_rss_mib,
                        run.verified
                    );
                    ok &= run.verified == "ok" && run.clean_stop;
                    runs_of_round[v] = Some(run);
                }
                Err(e) => {
                    eprintln!("e2e ab [round {}] {} failed: {e:#}", r + 1, variant.name);
                    ok = false;
                }
            }
        }
        rounds.push(Round {
            broker,
            database,
            runs: runs_of_round,
            order: order.iter().map(|&v| variants[v].name.clone()).collect(),
        });
    }
    let summary = summarize(variants, &rounds, machine.nproc);
    let minutes = began.elapsed().as_secs_f64() / 60.0;
    let md = markdown(&machine, plan, variants, &rounds, &summary, minutes);
    print!("{md}");
    let stem = format!("ab-s{}-p{}", plan.shards, plan.prefetch);
    std::fs::write(out.join(format!("{stem}.md")), &md)?;
    let json = AbReport {
        machine: &machine,
        plan,
        variants,
        rounds: &rounds,
        summary: &summary,
        minutes,
    };
    std::fs::write(
        out.join(format!("{stem}.json")),
        serde_json::to_string_pretty(&json)?,
    )?;
    eprintln!("e2e ab: wrote {}", out.join(format!("{stem}.md")).display());
    Ok(ok)
}

fn report_ceiling(round: usize, what: &str, rate: anyhow::Result<f64>) -> Option<f64> {
    match rate {
        Ok(rate) => {
            eprintln!("e2e ab [round {}] {what}: {rate:.0} msg/s", round + 1);
            Some(rate)
        }
        Err(e) => {
            eprintln!("e2e ab [round {}] {what} failed: {e:#}", round + 1);
            None
        }
    }
}

fn summarize(variants: &[Variant], rounds: &[Round], cores: usize) -> Vec<Summary> {
    let rate = |r: &Round, v: usize| r.runs[v].as_ref().map(|w| w.rate);
    variants
        .iter()
        .enumerate()
        .map(|(v, variant)| {
            let rates: Vec<f64> = rounds.iter().filter_map(|r| rate(r, v)).collect();
            let per_round = |f: &dyn Fn(&Round) -> Option<f64>| {
                median(
                    rounds
                        .iter()
                        .filter_map(|r| Some(rate(r, v)? / f(r)?))
                        .collect(),
                )
            };
            // The median over rounds of one figure of this variant's drains.
            let of = |f: &dyn Fn(&WorkerRun) -> Option<f64>| {
                median(
                    rounds
                        .iter()
                        .filter_map(|r| f(r.runs[v].as_ref()?))
                        .collect(),
                )
            };
            Summary {
                name: variant.name.clone(),
                rate: median(rates.clone()),
                rate_min: rates.iter().copied().reduce(f64::min),
                rate_max: rates.iter().copied().reduce(f64::max),
                vs_first: per_round(&|r| rate(r, 0)),
                vs_broker: per_round(&|r| r.broker),
                vs_database: per_round(&|r| r.database),
                cpu_us_per_msg: of(&|w| Some(w.cpu_us_per_msg)),
                db_us_per_msg: of(&|w| w.cpu.map(|c| c.database_us)),
                broker_us_per_msg: of(&|w| w.cpu.map(|c| c.broker_us)),
                cpu_bound_fraction: of(&|w| w.cpu_bound_fraction(cores)),
                wal_bytes_per_msg: of(&|w| w.wal_bytes_per_msg),
                peak_rss_mib: of(&|w| Some(w.peak_rss_mib)),
                checks: rounds
                    .iter()
                    .filter_map(|r| r.runs[v].as_ref())
                    .map(|w| {
                        let stop = if w.clean_stop { "" } else { ", unclean stop" };
                        format!("{}{stop}", w.verified)
                    })
                    .collect(),
            }
        })
        .collect()
}

fn fmt(x: Option<f64>, digits: usize) -> String {
    x.map_or_else(|| "—".into(), |x| format!("{x:.digits$}"))
}

fn markdown(
    m: &Machine,
    plan: &AbPlan,
    variants: &[Variant],
    rounds: &[Round],
    summary: &[Summary],
    minutes: f64,
) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# urutan A/B: {} shards, PREFETCH={}\n",
        plan.shards, plan.prefetch
    );
    let _ = writeln!(
        md,
        "- {} rounds of {} messages per drain, variants in rotating order, took {minutes:.1} min",
        plan.rounds, plan.messages
    );
    let _ = writeln!(md, "{}", m.markdown_line());
    for v in variants {
        let _ = writeln!(md, "- variant `{}`: `{}`", v.name, v.bin.display());
    }
    let _ = writeln!(
        md,
        "\n| variant | msg/s (median) | range | × `{}` (median of per-round ratios) | × broker ceiling | × DB ceiling | worker CPU µs/msg | database CPU µs/msg | broker CPU µs/msg | fraction of the CPU bound | WAL B/msg | peak RSS MiB | checks |",
        variants[0].name
    );
    let _ = writeln!(
        md,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    );
    for s in summary {
        // (value, decimals) of each numeric column after the range.
        let columns = [
            (s.vs_first, 2),
            (s.vs_broker, 2),
            (s.vs_database, 2),
            (s.cpu_us_per_msg, 0),
            (s.db_us_per_msg, 1),
            (s.broker_us_per_msg, 1),
            (s.cpu_bound_fraction, 2),
            (s.wal_bytes_per_msg, 0),
            (s.peak_rss_mib, 1),
        ];
        let cells: Vec<String> = columns.iter().map(|&(x, d)| fmt(x, d)).collect();
        let _ = writeln!(
            md,
            "| {} | {} | {}–{} | {} | {} |",
            s.name,
            fmt(s.rate, 0),
            fmt(s.rate_min, 0),
            fmt(s.rate_max, 0),
            cells.join(" | "),
            s.checks.join("; ")
        );
    }
    let _ = writeln!(
        md,
        "\nPer round (msg/s; ceilings: broker alone with the same shards and prefetch, database alone with one task per shard):\n"
    );
    let names: Vec<&str> = variants.iter().map(|v| v.name.as_str()).collect();
    let _ = writeln!(
        md,
        "| round | order | broker ceiling | DB ceiling | {} |",
        names.join(" | ")
    );
    let _ = writeln!(md, "|---:|---|---:|---:|{}", "---:|".repeat(names.len()));
    for (i, r) in rounds.iter().enumerate() {
        let cells: Vec<String> = r
            .runs
            .iter()
            .map(|w| fmt(w.as_ref().map(|w| w.rate), 0))
            .collect();
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} |",
            i + 1,
            r.order.join(" → "),
            fmt(r.broker, 0),
            fmt(r.database, 0),
            cells.join(" | ")
        );
    }
    md
}
