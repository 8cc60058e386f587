//! The cost of online resharding under load, measured end to end.
//!
//! `cargo bench --bench reshard [-- --rate 800 --entities 2000 --prefetch 1]`
//!
//! A producer writes events into the outbox at a fixed rate (strictly
//! increasing versions per order), a real `urutan relay` publishes them and
//! real `urutan run` processes apply them. The ring goes through two rolling
//! deploys while the load runs: grow 4 → 8 (a replica with `SHARD_COUNT=8`
//! starts; the old one follows the recorded ring, then gets SIGTERM) and
//! shrink 8 → 6 (`SHARD_COUNT=6 ALLOW_SHRINK=true`). Sampled every 250 ms:
//! versions applied, parked messages. Reported per resharding: time to
//! reshard (recorded start → completion in `urutan_ring`), throughput before
//! and its lowest 1-second window during, parked peak, publish→apply delay
//! p50/p99 before and during. Afterwards every version must have been
//! applied exactly once and gapless in order, and `urutan verify` must pass.
//! Results: `benches/results/reshard.{md,json}`.

use urutan_testkit::{bench_env as env, markdown::row, process};

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure};
use clap::Parser;
use serde::Serialize;
use sqlx::PgPool;

use env::BenchEnv;
use process::Urutan;

#[derive(Parser, Debug, Clone)]
struct Options {
    /// Events per second written to the outbox.
    #[arg(long, default_value_t = 800)]
    rate: u32,
    /// Distinct orders.
    #[arg(long, default_value_t = 2000)]
    entities: usize,
    /// PREFETCH of the workers.
    #[arg(long, default_value_t = 1)]
    prefetch: u16,
    /// Seconds of steady load before, between and after the reshardings.
    #[arg(long, default_value_t = 15)]
    steady: u64,
    /// Passed by `cargo bench`.
    #[arg(long, hide = true)]
    bench: bool,
}

/// One sample of the timeline (DB clock, seconds since the epoch).
#[derive(Debug, Clone, Copy, Serialize)]
struct Sample {
    t: f64,
    applied: i64,
    parked: i64,
}

#[derive(Debug, Serialize)]
struct Resharding {
    change: String,
    seconds_to_reshard: f64,
    throughput_before: f64,
    lowest_1s_during: f64,
    parked_peak: i64,
    delay_p50_ms_before: f64,
    delay_p99_ms_before: f64,
    delay_p50_ms_during: f64,
    delay_p99_ms_during: f64,
}

#[derive(Debug, Serialize)]
struct Report {
    options: String,
    commit: String,
    versions: i64,
    reshardings: Vec<Resharding>,
    timeline: Vec<Sample>,
}

/// Starts `urutan <args>` on the scenario as `name` (the shared
/// child-process type, `urutan_testkit::process`: SIGKILLed if still
/// running when dropped), logging to `target/bench-logs/reshard-<pid>/`.
fn start(
    env: &BenchEnv,
    name: &str,
    args: &[&str],
    extra: &[(&str, String)],
) -> anyhow::Result<Urutan> {
    let mut vars = vec![
        ("AMQP_URL", env.amqp_url().expose().to_owned()),
        ("DATABASE_URL", env.database_url().expose().to_owned()),
        // lapin logs the passive probes' expected channel closes as errors.
        ("RUST_LOG", "warn,lapin::channel=off".to_owned()),
        (env::OWNER_VAR, std::process::id().to_string()),
    ];
    vars.extend(extra.iter().cloned());
    let log = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("target/bench-logs/reshard-{}", std::process::id()))
        .join(format!("{name}.log"));
    Urutan::spawn(
        Path::new(env!("CARGO_BIN_EXE_urutan")),
        name,
        args,
        &vars,
        log,
    )
}

/// SIGTERM, then a clean exit within 40 s.
async fn terminate(mut process: Urutan) -> anyhow::Result<()> {
    let status = process.stop(Duration::from_secs(40)).await?;
    ensure!(
        status.success(),
        "{} exited with {status}; log tail:\n{}",
        process.name,
        process.tail()
    );
    Ok(())
}

fn worker(env: &BenchEnv, o: &Options, shards: u16, shrink: bool) -> anyhow::Result<Urutan> {
    let mut vars = vec![
        ("SHARD_COUNT", shards.to_string()),
        ("PREFETCH", o.prefetch.to_string()),
    ];
    if shrink {
        vars.push(("ALLOW_SHRINK", "true".into()));
    }
    start(env, &format!("worker-{shards}"), &["run"], &vars)
}

/// Writes `rate` events per second into the outbox until `stop`; returns
/// how many it wrote. Versions rise by one per order, round robin.
async fn produce(db: PgPool, o: Options, stop: Arc<AtomicBool>, written: Arc<AtomicI64>) {
    let per_tick = (o.rate as usize / 100).max(1);
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    let mut next = 0usize;
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let Ok(mut tx) = db.begin().await else {
            continue;
        };
        for _ in 0..per_tick {
            let (entity, round) = (next % o.entities, next / o.entities);
            let id = format!("R-{entity:05}");
            let event = urutan::outbox::NewEvent {
                agregat_id: &id,
                status: "s",
                versi: i64::try_from(round).unwrap_or(i64::MAX) + 1,
                routing_key: "pesanan.bench",
                ..Default::default()
            };
            if urutan::outbox::enqueue(&mut tx, &event).await.is_err() {
                break;
            }
            next += 1;
        }
        if tx.commit().await.is_ok() {
            written.store(next as i64, Ordering::Relaxed);
        }
    }
}

async fn sample(db: &PgPool) -> anyhow::Result<Sample> {
    let (t, applied, parked): (f64, i64, i64) = sqlx::query_as(
        "SELECT extract(epoch FROM clock_timestamp())::float8,
                coalesce((SELECT max(seq) FROM pesanan_riwayat), 0),
                (SELECT count(*) FROM urutan_parkir)",
    )
    .fetch_one(db)
    .await?;
    Ok(Sample { t, applied, parked })
}

/// (count, complete, start, end) of the recorded ring's changes.
async fn ring(db: &PgPool) -> anyhow::Result<Vec<(i32, Option<f64>, Option<f64>)>> {
    Ok(sqlx::query_as(
        "SELECT shard_count, extract(epoch FROM mulai)::float8, extract(epoch FROM selesai)::float8
         FROM urutan_ring ORDER BY versi",
    )
    .fetch_all(db)
    .await?)
}

async fn wait_until(
    what: &str,
    limit: Duration,
    mut cond: impl AsyncFnMut() -> bool,
) -> anyhow::Result<()> {
    let start = Instant::now();
    while !cond().await {
        ensure!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// Waits until change number `n` (1-based) of the ring is recorded complete.
async fn wait_resharded(db: &PgPool, n: usize) -> anyhow::Result<()> {
    wait_until(
        "the resharding to complete",
        Duration::from_secs(180),
        async || {
            ring(db)
                .await
                .map(|r| r.len() >= n && r[n - 1].2.is_some())
                .unwrap_or(false)
        },
    )
    .await
}

/// Publish→apply delay percentiles (ms) of versions applied in [from, to).
async fn delays(db: &PgPool, (from, to): (f64, f64)) -> anyhow::Result<(f64, f64)> {
    let row: (Option<f64>, Option<f64>) = sqlx::query_as(
        "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY d), percentile_cont(0.99) WITHIN GROUP (ORDER BY d)
         FROM (SELECT extract(epoch FROM r.diterapkan_pada - o.dibuat_pada) * 1000 AS d
               FROM pesanan_riwayat r JOIN outbox o ON o.id::text = r.message_id
               WHERE r.diterapkan_pada >= to_timestamp($1) AND r.diterapkan_pada < to_timestamp($2)) x",
    )
    .bind(from)
    .bind(to)
    .fetch_one(db)
    .await?;
    Ok((row.0.unwrap_or(f64::NAN), row.1.unwrap_or(f64::NAN)))
}

/// Applied per second over [from, to), from the samples.
fn rate(samples: &[Sample], (from, to): (f64, f64)) -> f64 {
    let inside: Vec<&Sample> = samples.iter().filter(|s| s.t >= from && s.t < to).collect();
    match (inside.first(), inside.last()) {
        (Some(a), Some(b)) if b.t > a.t => (b.applied - a.applied) as f64 / (b.t - a.t),
        _ => f64::NAN,
    }
}

/// The lowest applied-per-second over any 1 s window inside [from, to).
fn lowest_1s(samples: &[Sample], (from, to): (f64, f64)) -> f64 {
    let inside: Vec<&Sample> = samples.iter().filter(|s| s.t >= from && s.t < to).collect();
    let mut lowest = f64::NAN;
    for (i, a) in inside.iter().enumerate() {
        if let Some(b) = inside[i..].iter().find(|b| b.t - a.t >= 1.0) {
            let r = (b.applied - a.applied) as f64 / (b.t - a.t);
            lowest = if lowest.is_nan() { r } else { lowest.min(r) };
        }
    }
    lowest
}

async fn measure(
    db: &PgPool,
    samples: &[Sample],
    change: &str,
    (start, end): (f64, f64),
    steady: f64,
) -> anyhow::Result<Resharding> {
    let before = (start - steady, start);
    let during = (start, end + 1.0);
    let (p50b, p99b) = delays(db, before).await?;
    let (p50d, p99d) = delays(db, during).await?;
    Ok(Resharding {
        change: change.into(),
        seconds_to_reshard: end - start,
        throughput_before: rate(samples, before),
        lowest_1s_during: lowest_1s(samples, during),
        parked_peak: samples
            .iter()
            .filter(|s| s.t >= during.0 && s.t < during.1)
            .map(|s| s.parked)
            .max()
            .unwrap_or(0),
        delay_p50_ms_before: p50b,
        delay_p99_ms_before: p99b,
        delay_p50_ms_during: p50d,
        delay_p99_ms_during: p99d,
    })
}

/// Every outbox row applied once, gapless and in order per order, verify clean.
async fn check(db: &PgPool, written: i64) -> anyhow::Result<()> {
    let (applied, gaps): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE prev IS NOT NULL AND versi <> prev + 1)
                + count(*) FILTER (WHERE prev IS NULL AND versi <> 1)
         FROM (SELECT versi, lag(versi) OVER (PARTITION BY pesanan_id ORDER BY seq) AS prev
               FROM pesanan_riwayat) h",
    )
    .fetch_one(db)
    .await?;
    ensure!(
        applied == written,
        "{applied} versions applied, {written} written"
    );
    ensure!(gaps == 0, "{gaps} versions out of order or skipped");
    let report = urutan_ops::verify::verify(db, None).await?;
    ensure!(report.passed(), "verify failed:\n{report}");
    Ok(())
}

fn write(report: &Report) -> anyhow::Result<()> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/results");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join("reshard.json"),
        serde_json::to_string_pretty(report)?,
    )?;
    let mut md = format!(
        "# Online resharding under load\n\n`cargo bench --bench reshard -- {}` at {} \
         ({} versions, all applied exactly once, gapless, in order; `urutan verify` clean).\n\n\
         | change | time to reshard | throughput before | lowest 1 s during | parked peak | \
         delay p50/p99 before | delay p50/p99 during |\n|---|---|---|---|---|---|---|\n",
        report.options, report.commit, report.versions
    );
    let delays = |p50: f64, p99: f64| format!("{p50:.0} / {p99:.0} ms");
    for r in &report.reshardings {
        md += &row(&[
            &r.change,
            &format!("{:.1} s", r.seconds_to_reshard),
            &format!("{:.0} msg/s", r.throughput_before),
            &format!("{:.0} msg/s", r.lowest_1s_during),
            &r.parked_peak,
            &delays(r.delay_p50_ms_before, r.delay_p99_ms_before),
            &delays(r.delay_p50_ms_during, r.delay_p99_ms_during),
        ]);
    }
    md += "\nTime to reshard: from the recorded change (bindings switched, epoch opened) to \
           its completion (every shard past the epoch, removed queues deleted). Throughput: \
           versions applied per second, from `pesanan_riwayat`. Delay: outbox row written → \
           version applied.\n";
    std::fs::write(dir.join("reshard.md"), md)?;
    Ok(())
}

async fn run(o: Options) -> anyhow::Result<Report> {
    let env = BenchEnv::bench("reshard").await?;
    let db = env.pool(4).await?;
    let relay = start(&env, "relay", &["relay"], &[])?;
    let first = worker(&env, &o, 4, false)?;
    wait_resharded(&db, 1).await?;

    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicI64::new(0));
    let producer = tokio::spawn(produce(
        db.clone(),
        o.clone(),
        stop.clone(),
        written.clone(),
    ));
    let samples = Arc::new(std::sync::Mutex::new(Vec::<Sample>::new()));
    let sampler = {
        let (db, samples, stop) = (db.clone(), samples.clone(), stop.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(250));
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                if let (Ok(s), Ok(mut v)) = (sample(&db).await, samples.lock()) {
                    v.push(s);
                }
            }
        })
    };
    let steady = Duration::from_secs(o.steady);
    tokio::time::sleep(steady).await;
    eprintln!("reshard: growing 4 → 8 (rolling deploy)");
    let grown = worker(&env, &o, 8, false)?;
    wait_resharded(&db, 2).await?;
    terminate(first).await?;
    tokio::time::sleep(steady).await;
    eprintln!("reshard: shrinking 8 → 6 (rolling deploy)");
    let shrunk = worker(&env, &o, 6, true)?;
    wait_resharded(&db, 3).await?;
    terminate(grown).await?;
    tokio::time::sleep(steady).await;

    stop.store(true, Ordering::Relaxed);
    producer.await?;
    let total = written.load(Ordering::Relaxed);
    wait_until(
        "every version applied",
        Duration::from_secs(300),
        async || {
            sample(&db)
                .await
                .map(|s| s.applied >= total)
                .unwrap_or(false)
        },
    )
    .await?;
    let _ = sampler.await;
    terminate(shrunk).await?;
    terminate(relay).await?;
    check(&db, total).await?;

    let samples = samples.lock().map(|v| v.clone()).unwrap_or_default();
    let changes = ring(&db).await?;
    let mut reshardings = Vec::new();
    for (i, label) in [(1, "grow 4 → 8"), (2, "shrink 8 → 6")] {
        let (_, Some(start), Some(end)) = changes[i] else {
            bail!("change {i} not complete");
        };
        reshardings.push(measure(&db, &samples, label, (start, end), o.steady as f64).await?);
    }
    Ok(Report {
        options: format!(
            "--rate {} --entities {} --prefetch {} --steady {}",
            o.rate, o.entities, o.prefetch, o.steady
        ),
        commit: urutan_testkit::commit(),
        versions: total,
        reshardings,
        timeline: samples,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // `cargo test --all-targets` runs benches as tests (with test flags).
    if !std::env::args().any(|a| a == "--bench") {
        println!("reshard bench: skipped (run `cargo bench --bench reshard`)");
        return Ok(());
    }
    let o = Options::parse();
    let _ = env::sweep_stale().await;
    let result = run(o).await;
    env::cleanup_all();
    let report = result?;
    write(&report)?;
    for r in &report.reshardings {
        eprintln!("{r:?}");
    }
    Ok(())
}
