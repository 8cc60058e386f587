//! Many more cases of the interleaving model of `tests/it/interleave.rs`
//! (same code, included below); needs only the local PostgreSQL.
//!
//! ```sh
//! cargo bench --bench interleave -- --cases 20000            # the fixed protocol
//! cargo bench --bench interleave -- --seed 0x1ec1fd4d4f3ccc9e # replay one case, with its trace
//! cargo bench --bench interleave -- --legacy --cases 500      # the protocol before the fix
//! cargo bench --bench interleave -- --strand --cases 500      # a dying shard worker of before 33fcef8
//! ```
//!
//! Flags: `--cases N` (default 20000), `--base B` (first seed; default: drawn,
//! printed), `--seed S`, `--workers N` (default 4), `--legacy`, `--strand`
//! (a shard's worker that dies keeps its channel open, as before commit
//! 33fcef8: issue 44 item 1), `--open-gap-defects` (GAP_TIMEOUT may expire
//! mid-stream, refused versions skipped early: finds the two open gap
//! defects, `interleave::Mode`),
//! `--max-failures N` (stop after N failing cases; default 0: never),
//! `--minutes M` (stop after M minutes; default 60). Exits non-zero if a
//! case failed.

use urutan_testkit::interleave;

use std::time::Duration;

use anyhow::{Context, bail};

fn flag_value(args: &[String], name: &str) -> anyhow::Result<Option<u64>> {
    match args.iter().position(|a| a == name) {
        Some(i) => {
            let v = args
                .get(i + 1)
                .with_context(|| format!("{name} needs a value"))?;
            Ok(Some(
                interleave::parse_seed(v).with_context(|| format!("{name} {v}"))?,
            ))
        }
        None => Ok(None),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    // `cargo test --all-targets` runs benches as tests (without `--bench`).
    if !args.iter().any(|a| a == "--bench") {
        println!("interleave bench: skipped (run `cargo bench --bench interleave`)");
        return Ok(());
    }
    let legacy = args.iter().any(|a| a == "--legacy");
    let seed = flag_value(&args, "--seed")?;
    let base = match flag_value(&args, "--base")? {
        Some(base) => base,
        None => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(interleave::DEFAULT_BASE, |d| d.as_nanos() as u64),
    };
    let config = interleave::RunConfig {
        cases: flag_value(&args, "--cases")?.unwrap_or(20_000),
        base,
        seed,
        workers: flag_value(&args, "--workers")?.unwrap_or(4) as usize,
        legacy,
        mode: interleave::Mode {
            worker_death: if args.iter().any(|a| a == "--strand") {
                interleave::WorkerDeath::Strand
            } else {
                interleave::WorkerDeath::Reopen
            },
            open_gap_defects: args.iter().any(|a| a == "--open-gap-defects"),
        },
        max_failures: flag_value(&args, "--max-failures")?.unwrap_or(0) as usize,
        time_limit: Duration::from_secs(60 * flag_value(&args, "--minutes")?.unwrap_or(60)),
    };
    if seed.is_none() {
        println!(
            "interleave: {} cases from base {base:#x} on {} databases{}",
            config.cases,
            config.workers,
            if legacy {
                " (legacy protocol, migrations 0001-0006)"
            } else {
                ""
            }
        );
    }
    let summary = interleave::run(config).await?;
    if seed.is_some() {
        for f in &summary.failures {
            println!("{}", f.trace.join("\n"));
        }
    }
    println!("{}", summary.report(legacy));
    if !summary.failures.is_empty() {
        bail!("{} failing case(s)", summary.failures.len());
    }
    Ok(())
}
