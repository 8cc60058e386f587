//! The fault-injection soak (issue 5): `cargo bench --bench faults -- --faults 100`.
//!
//! Runs 2 `urutan run` replicas (12 shards, PREFETCH 1 and 16 taking turns,
//! a slow handler) and `urutan relay` against the real RabbitMQ and
//! PostgreSQL under a continuous outbox workload mixed with poison,
//! duplicate and stale messages, injects the faults one after another at
//! random moments (seeded; the seed is printed for a replay), measures the
//! recovery after each, drains and checks every invariant. Writes
//! `benches/results/faults.{md,json}`; exits 1 if anything failed.
//! It restarts the broker and the database it is pointed at: see
//! `urutan_testkit::faults::services` for running it against private ones.
//!
//! With `--cluster` it runs against the three-node cluster named by
//! `FAULTS_CLUSTER` (the path of `deploy/brokers/cluster.sh`): the cluster
//! faults (node SIGKILL, rolling restart, node freeze, node partition, full
//! restart with a backlog), a direct producer besides the relay, and writes
//! `benches/results/faults-cluster.{md,json}`.
//!
//! With `--pair` the database is a PostgreSQL primary with a synchronous
//! streaming standby (`FAULTS_PG_PAIR`, the path of
//! `deploy/postgres/pair.sh`; `benches/faults/private-services.sh --pair`
//! sets it up): every kind above plus the database failover (drawn three
//! times as often), writing `benches/results/faults-pair.{md,json}`.
//!
//! With `--holds` (issue 44 item 4) the workers run a handler that asks to
//! retry or refuses, `ON_REFUSED=hold`, `GAP_POLICY=wait` with versions
//! written out of order, an operator deals with every hold, and the run ends
//! with the "nothing waits" checks (`urutan_testkit::faults::holds`),
//! writing `benches/results/faults-holds.{md,json}`.
//!
//! Without `--bench` (as under `cargo test --all-targets`) it does nothing.

use urutan_testkit::faults::{engine, fleet, inject, report, services};

// The test proxy, shared with the integration tests (not every mode is used here).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};

const USAGE: &str =
    "usage: cargo bench --bench faults -- [--cluster | --pair] [--faults N] [--seed S] \
[--shards N] [--prefetch 1,16,2/1] [--entities N] [--rate EVENTS_PER_S] [--delay-ms MS] [--out DIR]

  --faults N   faults to inject (100): every kind once, then random kinds
  --cluster    against the three-node cluster of FAULTS_CLUSTER=/path/to/deploy/brokers/cluster.sh,
               with the cluster faults, 100 events/s through the outbox (--rate after it
               changes that) and a direct producer at 50 versions/s; writes
               faults-cluster.{md,json}
  --pair       the database is a primary with a synchronous streaming standby
               (FAULTS_PG_PAIR=/path/to/deploy/postgres/pair.sh), reached through a proxy
               playing its DNS name; adds the kind \"database failover\" (primary killed,
               standby promoted, name moved, goal 10 s; the old primary then rejoins as
               standby), drawn 3 times as often as the others (a run of 16 faults or more
               has at least 3); writes faults-pair.{md,json}
  --kinds a,b  only these kinds (snake_case names as in the JSON report, e.g.
               db_failover,db_stop), after --cluster / --pair
  --holds      the holds soak (issue 44): a handler that asks to retry (~2 %) or refuses
               (~0.5 %), ON_REFUSED=hold, GAP_POLICY=wait with a third of the outbox writes
               two versions the later first, effects on, an operator replaying or releasing
               every hold; checks that nothing waits; writes faults-holds.{md,json}.
               With --faults 1300 (100 per kind) and --kinds unset: every kind 100 times
  --out DIR    where the report goes (benches/results)

The broker and database: FAULTS_AMQP_BASE, FAULTS_PG_BASE, FAULTS_RABBITMQCTL, FAULTS_PG_CTL
(urutan_testkit::faults::services); private ones, pair included, from
  eval \"$(bash benches/faults/private-services.sh [--pair])\"
and gone again with `bash benches/faults/private-services.sh --down`.
FAULTS_BUDGET_MIN=M: no fault starts after M minutes (the run then drains and checks as usual).";

/// How many times [`inject::Kind::PAIR`] is listed in pair mode.
const PAIR_WEIGHT: usize = 3;

fn parse(args: &[String]) -> anyhow::Result<(engine::Options, PathBuf, &'static str)> {
    let mut o = engine::Options {
        faults: 100,
        kinds: inject::Kind::ALL.to_vec(),
        direct_rate: 0,
        direct_entities: 0,
        seed: rand::random::<u32>() as u64,
        shards: 12,
        consume: fleet::Consume::ROTATION.to_vec(),
        entities: 300,
        rate: 200,
        handler_delay_ms: 2,
        gap_ms: (1000, 4000),
        db_stop_secs: (10, 30),
        recovery_limit: Duration::from_secs(60),
        log_dir: PathBuf::new(),
        holds: false,
    };
    let mut out = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/benches/results"));
    let mut name = "faults";
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .with_context(|| format!("{arg} needs a value"))
        };
        match arg.as_str() {
            "--bench" => {}
            "--cluster" => {
                anyhow::ensure!(name == "faults", "--cluster and --pair do not go together");
                anyhow::ensure!(
                    std::env::var_os("FAULTS_CLUSTER").is_some(),
                    "--cluster needs FAULTS_CLUSTER=/path/to/deploy/brokers/cluster.sh"
                );
                o.kinds = inject::Kind::CLUSTER.to_vec();
                // The load of tests/cluster.rs (the CI check): three nodes,
                // PostgreSQL and the fleet share the cores, and a full
                // restart's backlog must drain within its goal.
                o.rate = 100;
                o.direct_rate = 50;
                o.direct_entities = 100;
                // A SIGKILLed node's consumers hold their shards for 60 s
                // (consumer_disconnected_timeout): see Kind::goal.
                o.recovery_limit = Duration::from_secs(150);
                name = "faults-cluster";
            }
            "--pair" => {
                anyhow::ensure!(name == "faults", "--cluster and --pair do not go together");
                anyhow::ensure!(
                    std::env::var_os("FAULTS_PG_PAIR").is_some(),
                    "--pair needs FAULTS_PG_PAIR=/path/to/deploy/postgres/pair.sh \
                     (see benches/faults/private-services.sh --pair)"
                );
                for _ in 0..PAIR_WEIGHT {
                    o.kinds.extend(inject::Kind::PAIR);
                }
                name = "faults-pair";
            }
            "--holds" => {
                anyhow::ensure!(name == "faults", "--holds goes with one broker only");
                o.holds = true;
                name = "faults-holds";
            }
            "--faults" => o.faults = value()?.parse()?,
            "--seed" => o.seed = value()?.parse()?,
            "--shards" => o.shards = value()?.parse()?,
            "--prefetch" => {
                o.consume = value()?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()?
            }
            "--entities" => o.entities = value()?.parse()?,
            "--rate" => o.rate = value()?.parse()?,
            "--delay-ms" => o.handler_delay_ms = value()?.parse()?,
            "--kinds" => o.kinds = kinds(&value()?)?,
            "--out" => out = value()?.into(),
            other => bail!("unknown argument `{other}`\n{USAGE}"),
        }
    }
    anyhow::ensure!(!o.consume.is_empty() && o.entities > 0, "{USAGE}");
    o.log_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("faults-{}", o.seed));
    Ok((o, out, name))
}

/// The kinds named in `list` (comma-separated, as serialized).
fn kinds(list: &str) -> anyhow::Result<Vec<inject::Kind>> {
    let every = inject::Kind::ALL
        .iter()
        .chain(&inject::Kind::CLUSTER)
        .chain(&inject::Kind::PAIR);
    let named: Vec<(String, inject::Kind)> = every
        .map(|k| {
            Ok((
                serde_json::to_value(k)?.as_str().unwrap_or("").to_owned(),
                *k,
            ))
        })
        .collect::<anyhow::Result<_>>()?;
    list.split(',')
        .map(|name| {
            named
                .iter()
                .find(|(n, _)| n == name.trim())
                .map(|(_, k)| *k)
                .with_context(|| {
                    let names: Vec<&str> = named.iter().map(|(n, _)| n.as_str()).collect();
                    format!("no fault kind `{name}` (kinds: {})", names.join(", "))
                })
        })
        .collect()
}

async fn soak(opts: engine::Options, out: PathBuf, name: &str) -> anyhow::Result<bool> {
    let services = services::Services::from_env()?;
    eprintln!(
        "faults: seed {} ({} faults; replay with --seed {}), process logs in {}",
        opts.seed,
        opts.faults,
        opts.seed,
        opts.log_dir.display()
    );
    let report = engine::run(&services, &opts).await?;
    let md = report::markdown(&report);
    println!("{md}");
    std::fs::create_dir_all(&out)?;
    std::fs::write(out.join(format!("{name}.md")), &md)?;
    std::fs::write(
        out.join(format!("{name}.json")),
        serde_json::to_string_pretty(&report)?,
    )?;
    eprintln!("faults: wrote {}/{name}.{{md,json}}", out.display());
    Ok(report.passed())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    if !args.iter().any(|a| a == "--bench") {
        println!(
            "faults bench: skipped (restarts the broker and database; run `cargo bench --bench faults`)"
        );
        return ExitCode::SUCCESS;
    }
    let (opts, out, name) = match parse(&args) {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("faults: {e:#}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("faults: no runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(soak(opts, out, name)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("faults: FAILED (see the report)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("faults: {e:#}");
            ExitCode::FAILURE
        }
    }
}
