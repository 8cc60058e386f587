//! The real worker pool (`urutan run`, release build) under load: drain a
//! pre-published backlog (throughput, CPU, RSS), open-loop fixed-rate load
//! (latency), and the long backlog drain with RSS sampled every second.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use urutan::broker::{Names, topology};

use crate::ceilings::{drain_limit, prepare_backlog};
use crate::env::BenchEnv;
use crate::load::{self, Cursor, Workload};
use crate::procfs::{
    self, CpuSplit, ProcSample, ServiceCpu, Worker, busy_share, clock_ticks, host_cpu, service_cpu,
};

/// One drain of a backlog by the worker pool.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerRun {
    pub messages: usize,
    /// Seconds from the first poll that saw progress to the one that saw all.
    pub secs: f64,
    /// Messages after the first progress poll ÷ `secs`: the drain rate.
    pub rate: f64,
    /// (n − 1) ÷ (last − first `pesan_diproses.diproses_pada`): the same
    /// rate from the database's own timestamps (transaction start times).
    pub db_span_rate: Option<f64>,
    /// Worker process utime + stime over the drain ÷ messages drained.
    pub cpu_us_per_msg: f64,
    /// Worker `VmHWM` at the end of the drain.
    pub peak_rss_mib: f64,
    /// Share of the whole machine's CPU that was busy during the drain.
    pub host_cpu_busy: Option<f64>,
    /// Messages per apply transaction (a transaction's messages share its
    /// start time, `pesan_diproses.diproses_pada`).
    #[serde(default)]
    pub mean_batch: Option<f64>,
    /// WAL written per message over the drain (the whole server's
    /// `pg_current_wal_lsn()` at the first and the last mark; nothing else
    /// writes during a drain but the bench's polls, which write none).
    #[serde(default)]
    pub wal_bytes_per_msg: Option<f64>,
    /// CPU per message over the drain: the worker, the broker, the database
    /// (in the JSON through the sample, `Sample::cpu`).
    #[serde(skip)]
    pub cpu: Option<CpuSplit>,
    pub publish_rate: f64,
    /// "ok", or what the check of the database found wrong.
    pub verified: String,
    /// The worker exited 0 after SIGTERM within 30 s.
    pub clean_stop: bool,
    /// When the drain began (epoch seconds, the database's clock): its rows
    /// are the ones applied since.
    #[serde(default)]
    pub since_epoch: f64,
}

impl WorkerRun {
    /// The **fraction of the CPU bound**: rate × (worker + broker +
    /// database CPU s per message) ÷ `cores`; 1.0 = no core was ever idle
    /// during the drain. `None` without the CPU split.
    pub fn cpu_bound_fraction(&self, cores: usize) -> Option<f64> {
        self.cpu
            .map(|c| self.rate * c.total_us() * 1e-6 / cores.max(1) as f64)
    }
}

struct Mark {
    at: Instant,
    count: usize,
    proc: ProcSample,
    host: Option<(u64, u64)>,
    /// Read only for the first and the last mark (it scans `/proc`).
    services: ServiceCpu,
    /// The WAL position, read with `services`.
    wal: Option<i64>,
}

/// The server's WAL position in bytes.
async fn wal_position(pool: &PgPool) -> Option<i64> {
    sqlx::query_scalar("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::int8")
        .fetch_one(pool)
        .await
        .ok()
}

async fn count(pool: &PgPool, sql: &'static str) -> anyhow::Result<usize> {
    let n: i64 = sqlx::query_scalar(sql).fetch_one(pool).await?;
    Ok(usize::try_from(n).unwrap_or(0))
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Checks the end state of the drain that began at `since` (epoch seconds,
/// the database's clock): every message applied once, versions in order per
/// order, nothing parked, nothing dead-lettered. Rows from before `since`
/// (a prefilled database, an earlier drain) are not looked at.
async fn verify(
    pool: &PgPool,
    env: &BenchEnv,
    expected: usize,
    since: f64,
) -> anyhow::Result<String> {
    let applied: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pesanan_riwayat WHERE diterapkan_pada >= to_timestamp($1)",
    )
    .bind(since)
    .fetch_one(pool)
    .await?;
    let applied = usize::try_from(applied).unwrap_or(0);
    let disorder: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT versi - lag(versi) OVER (PARTITION BY pesanan_id ORDER BY seq)
         AS step FROM pesanan_riwayat WHERE diterapkan_pada >= to_timestamp($1)) s
         WHERE step IS NOT NULL AND step <> 1",
    )
    .bind(since)
    .fetch_one(pool)
    .await?;
    let parked = count(pool, "SELECT count(*) FROM urutan_parkir").await?;
    let conn = load::connect(&env.amqp_url(), "urutan-bench verify").await?;
    let ch = conn.create_channel().await?;
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let dlq = ch
        .queue_declare("pesanan.dlq".into(), passive, FieldTable::default())
        .await?
        .message_count();
    let _ = urutan::broker::call("connection.close", conn.close(200, "verified".into())).await;
    let mut problems = Vec::new();
    if applied != expected {
        problems.push(format!("{applied}/{expected} applied"));
    }
    if disorder > 0 {
        problems.push(format!("{disorder} out of order"));
    }
    if parked > 0 {
        problems.push(format!("{parked} parked"));
    }
    if dlq > 0 {
        problems.push(format!("{dlq} dead-lettered"));
    }
    Ok(if problems.is_empty() {
        "ok".into()
    } else {
        problems.join(", ")
    })
}

/// Messages per apply transaction since `since`: a transaction's messages
/// share its start time (`pesan_diproses.diproses_pada`).
async fn mean_batch(pool: &PgPool, since: f64) -> anyhow::Result<Option<f64>> {
    Ok(sqlx::query_scalar(
        "SELECT count(*)::float8 / nullif(count(DISTINCT diproses_pada), 0) FROM pesan_diproses
         WHERE diproses_pada >= to_timestamp($1)",
    )
    .bind(since)
    .fetch_one(pool)
    .await?)
}

/// The history sequence's position (0 before its first use).
async fn seq_now(pool: &PgPool) -> anyhow::Result<usize> {
    count(
        pool,
        "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM pesanan_riwayat_seq_seq",
    )
    .await
}

/// Messages processed so far, read cheaply: the history's sequence moves
/// once per applied message (every message of these workloads is applied),
/// so polling it costs nothing, where `count(*)` scans the growing table 20
/// times a second (≈ 3 ms each at 40,000 rows, CPU the drain then lacks). The
/// sequence moves before commit, so the end is confirmed by a count (of the
/// rows since the drain began: today's partition, whatever is prefilled).
async fn progress(pool: &PgPool, total: usize, base: usize, since: f64) -> anyhow::Result<usize> {
    let applied = seq_now(pool).await?.saturating_sub(base);
    if applied < total {
        return Ok(applied);
    }
    let n: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pesan_diproses WHERE diproses_pada >= to_timestamp($1)",
    )
    .bind(since)
    .fetch_one(pool)
    .await?;
    Ok(usize::try_from(n).unwrap_or(0))
}

/// Drains a pre-published backlog of `work` with `urutan run` at
/// `SHARD_COUNT=shards`, `PREFETCH=prefetch`, polling its progress every
/// 50 ms.
pub async fn throughput(
    bin: &Path,
    logs: &Path,
    work: Workload,
    shards: u16,
    prefetch: u16,
    unix_db: bool,
    extra: &[(&str, String)],
) -> anyhow::Result<WorkerRun> {
    let suffix = if unix_db { "_unix" } else { "" };
    let batch = if extra.is_empty() { "" } else { "_b1" };
    let tag = format!("worker_s{shards}_p{prefetch}{batch}{suffix}");
    let mut env = BenchEnv::bench(&tag).await?;
    env.use_unix_socket(unix_db);
    // The schema of the binary under test (`urutan migrate`), not the
    // bench's own: under --ab, each variant drains on its own migrations.
    migrate_with(bin, &env).await?;
    let pool = urutan::store::connect(&env.database_url(), 2).await?;
    let publish_rate = prepare_backlog(&env, shards, work).await?;
    let log = logs.join(format!("{tag}.log"));
    let drain = Drain {
        bin,
        log,
        env: &env,
        pool: &pool,
        work,
        shards,
        prefetch,
        extra,
    };
    let mut run = drain_published(drain, None).await?;
    pool.close().await;
    run.publish_rate = publish_rate;
    Ok(run)
}

/// Runs `bin migrate` on `env`'s database (bounded to 5 minutes).
async fn migrate_with(bin: &Path, env: &BenchEnv) -> anyhow::Result<()> {
    let mut cmd = tokio::process::Command::new(bin);
    cmd.arg("migrate")
        .env("DATABASE_URL", env.database_url().expose())
        .env("AMQP_URL", env.amqp_url().expose())
        .env("RUST_LOG", "warn")
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(300), cmd.output())
        .await
        .context("`urutan migrate` took over 5 minutes")??;
    anyhow::ensure!(
        out.status.success(),
        "`{} migrate` failed: {}",
        bin.display(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// A drain of a backlog already published into `env`'s vhost, by
/// `urutan run` on `env`'s database (which may hold earlier rows).
pub struct Drain<'a> {
    pub bin: &'a Path,
    pub log: PathBuf,
    pub env: &'a BenchEnv,
    pub pool: &'a PgPool,
    pub work: Workload,
    pub shards: u16,
    pub prefetch: u16,
    pub extra: &'a [(&'a str, String)],
}

/// Runs [`Drain`]: starts the worker, polls every 50 ms until the backlog
/// is applied (bounded by [`drain_limit`]), stops it and checks the rows the
/// drain wrote. `midway` is sent once half of the backlog is applied (e.g.
/// to start a retention purge during the drain). `publish_rate` is left 0.
pub async fn drain_published(
    d: Drain<'_>,
    mut midway: Option<tokio::sync::oneshot::Sender<()>>,
) -> anyhow::Result<WorkerRun> {
    let pool = d.pool;
    let total = d.work.len();
    let since: f64 = sqlx::query_scalar("SELECT extract(epoch FROM now())::float8")
        .fetch_one(pool)
        .await?;
    let base = seq_now(pool).await?;
    let mut worker =
        crate::procfs::start_worker_with(d.bin, d.env, d.shards, d.prefetch, d.extra, d.log)?;
    let limit = drain_limit(total);
    let started = Instant::now();
    let mut first: Option<Mark> = None;
    let last = loop {
        worker.check_alive()?;
        let n = progress(pool, total, base, since).await?;
        let mut mark = Mark {
            at: Instant::now(),
            count: n,
            proc: procfs::sample(worker.pid).unwrap_or_default(),
            host: host_cpu(),
            services: ServiceCpu::default(),
            wal: None,
        };
        if n >= total {
            mark.services = service_cpu();
            mark.wal = wal_position(pool).await;
            break mark;
        }
        if first.is_none() && n > 0 {
            mark.services = service_cpu();
            mark.wal = wal_position(pool).await;
            first = Some(mark);
        }
        if n >= total / 2
            && let Some(tx) = midway.take()
        {
            let _ = tx.send(());
        }
        if started.elapsed() > limit {
            bail!(
                "worker drain: {n} of {total} after {limit:?}; log tail:\n{}",
                worker.tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let first = first.unwrap_or(Mark {
        at: started,
        count: 0,
        proc: ProcSample::default(),
        host: None,
        services: ServiceCpu::default(),
        wal: None,
    });
    let stopped = worker.stop(Duration::from_secs(30)).await;
    let span: Option<f64> = sqlx::query_scalar(
        "SELECT extract(epoch FROM max(diproses_pada) - min(diproses_pada))::float8 FROM pesan_diproses
         WHERE diproses_pada >= to_timestamp($1)",
    )
    .bind(since)
    .fetch_one(pool)
    .await?;
    let mean_batch = mean_batch(pool, since).await?;
    let verified = verify(pool, d.env, total, since).await?;
    let drained = (total - first.count).max(1);
    let secs = (last.at - first.at).as_secs_f64();
    let cpu_s = (last.proc.cpu_ticks.saturating_sub(first.proc.cpu_ticks)) as f64 / clock_ticks();
    Ok(WorkerRun {
        messages: total,
        secs,
        rate: drained as f64 / secs.max(1e-9),
        db_span_rate: span.filter(|s| *s > 0.0).map(|s| (total - 1) as f64 / s),
        cpu_us_per_msg: cpu_s * 1e6 / drained as f64,
        peak_rss_mib: mib(last.proc.hwm_kib),
        host_cpu_busy: busy_share(first.host, last.host),
        mean_batch,
        wal_bytes_per_msg: first
            .wal
            .zip(last.wal)
            .map(|(a, b)| (b - a) as f64 / drained as f64),
        cpu: (first.count > 0).then(|| {
            let worker = Some((first.proc.cpu_ticks, last.proc.cpu_ticks));
            CpuSplit::between(first.services, last.services, worker, drained)
        }),
        publish_rate: 0.0,
        verified,
        clean_stop: stopped.map(|s| s.success()).unwrap_or(false),
        since_epoch: since,
    })
}

/// Latency under one fixed offered load.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LatencyRow {
    /// Offered load as a share of the measured maximum.
    pub load: f64,
    pub offered_rate: f64,
    pub achieved_publish_rate: f64,
    pub messages: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
    pub mean_ms: f64,
}

pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Waits until every message with id prefix `prefix` is applied, then
/// returns each one's apply time (µs since the epoch) by id.
async fn applied_times(
    pool: &PgPool,
    worker: &mut Worker,
    prefix: &str,
    expected: usize,
) -> anyhow::Result<HashMap<String, i64>> {
    let pattern = format!("{prefix}-%");
    let start = Instant::now();
    loop {
        worker.check_alive()?;
        let n: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pesanan_riwayat WHERE message_id LIKE $1")
                .bind(&pattern)
                .fetch_one(pool)
                .await?;
        if usize::try_from(n).unwrap_or(0) >= expected {
            break;
        }
        if start.elapsed() > Duration::from_secs(180) {
            bail!("latency step {prefix}: {n} of {expected} applied after 180 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT message_id, (extract(epoch FROM diterapkan_pada) * 1000000)::int8
         FROM pesanan_riwayat WHERE message_id LIKE $1",
    )
    .bind(&pattern)
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().collect())
}

/// Open-loop latency of `urutan run` (`shards`, `prefetch`): for each share
/// of `max_rate` in `loads`, publish at that fixed rate for `secs` and
/// measure publish → apply (`pesanan_riwayat.diterapkan_pada`, the apply
/// transaction's start time) per message.
pub async fn latency(
    bin: &Path,
    logs: &Path,
    shards: u16,
    prefetch: u16,
    max_rate: f64,
    loads: &[f64],
    secs: f64,
) -> anyhow::Result<Vec<LatencyRow>> {
    let tag = format!("latency_s{shards}_p{prefetch}");
    let env = BenchEnv::bench(&tag).await?;
    let pool = env.pool(2).await?;
    let conn = load::connect(&env.amqp_url(), "urutan-bench latency").await?;
    topology::declare(&conn, &Names::new("pesanan"), shards, 5, false).await?;
    let log = logs.join(format!("{tag}.log"));
    let mut worker = start_consuming(bin, &env, &pool, shards, prefetch, &[], log).await?;
    let ch = load::confirm_channel(&conn).await?;
    let mut cursor = Cursor::new(2_000);
    let warm_rate = loads.first().copied().unwrap_or(0.25) * max_rate;
    let warm =
        load::publish_paced(&ch, &mut cursor, "warm", warm_rate, Duration::from_secs(2)).await?;
    applied_times(&pool, &mut worker, "warm", warm.len()).await?;
    let mut rows = Vec::new();
    for (step, &share) in loads.iter().enumerate() {
        let rate = share * max_rate;
        let prefix = format!("lat{step}");
        let (sent, published) = publish_step(&ch, &mut cursor, &prefix, rate, secs).await?;
        let applied = applied_times(&pool, &mut worker, &prefix, sent.len()).await?;
        let mut lat: Vec<f64> = sent
            .iter()
            .filter_map(|(id, t)| applied.get(id).map(|a| (a - t) as f64 / 1000.0))
            .collect();
        lat.sort_by(f64::total_cmp);
        rows.push(LatencyRow {
            load: share,
            offered_rate: rate,
            achieved_publish_rate: published,
            messages: lat.len(),
            p50_ms: percentile(&lat, 0.50),
            p99_ms: percentile(&lat, 0.99),
            p999_ms: percentile(&lat, 0.999),
            max_ms: lat.last().copied().unwrap_or(f64::NAN),
            mean_ms: lat.iter().sum::<f64>() / lat.len().max(1) as f64,
        });
    }
    let _ = urutan::broker::call("connection.close", conn.close(200, "done".into())).await;
    let _ = worker.stop(Duration::from_secs(30)).await;
    pool.close().await;
    Ok(rows)
}

/// One open-loop step: publishes at `rate` msg/s for `secs` seconds
/// ([`load::publish_paced`]) and returns what it sent (each message id with
/// its publish time, µs since the epoch) and the publish rate it achieved
/// (msg/s over the step's wall time).
pub async fn publish_step(
    ch: &lapin::Channel,
    cursor: &mut Cursor,
    prefix: &str,
    rate: f64,
    secs: f64,
) -> anyhow::Result<(Vec<(String, i64)>, f64)> {
    let began = Instant::now();
    let sent = load::publish_paced(ch, cursor, prefix, rate, Duration::from_secs_f64(secs)).await?;
    let achieved = sent.len() as f64 / began.elapsed().as_secs_f64().max(1e-9);
    Ok((sent, achieved))
}

/// Starts `urutan run` (`shards`, `prefetch`, `extra` environment) on a
/// declared topology and returns once it consumes: ready, and every shard
/// past the epoch marker put in at connect (or new orders would be parked
/// while the others catch up).
pub async fn start_consuming(
    bin: &Path,
    env: &BenchEnv,
    pool: &PgPool,
    shards: u16,
    prefetch: u16,
    extra: &[(&str, String)],
    log: PathBuf,
) -> anyhow::Result<Worker> {
    let mut worker = crate::procfs::start_worker_with(bin, env, shards, prefetch, extra, log)?;
    worker.wait_ready(Duration::from_secs(60)).await?;
    let start = Instant::now();
    loop {
        let passed: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM urutan_epoch) AND
                    coalesce((SELECT min(epoch) FROM urutan_shard WHERE aktif), 0)
                    >= (SELECT max(epoch) FROM urutan_epoch)",
        )
        .fetch_one(pool)
        .await?;
        if passed {
            return Ok(worker);
        }
        if start.elapsed() > Duration::from_secs(30) {
            bail!("the worker's shards did not pass the epoch marker within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One sample of the long drain.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RssSample {
    pub t_s: f64,
    pub applied: usize,
    pub rss_mib: f64,
    pub hwm_mib: f64,
    pub cpu_s: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BacklogRun {
    pub messages: usize,
    pub shards: u16,
    pub prefetch: u16,
    pub publish_rate: f64,
    pub drain_secs: f64,
    pub rate: f64,
    pub cpu_us_per_msg: f64,
    pub peak_rss_mib: f64,
    pub verified: String,
    pub clean_stop: bool,
    /// `GET /metrics` every this many seconds during the drain (as a
    /// Prometheus server would), or never.
    #[serde(default)]
    pub scrape_every_s: Option<f64>,
    #[serde(default)]
    pub scrapes: usize,
    pub samples: Vec<RssSample>,
}

/// Drains a backlog of `work` (1,000,000 by default), sampling the worker's
/// RSS, peak RSS, CPU and progress every second, and scraping its
/// `/metrics` every `scrape` if given.
pub async fn backlog(
    bin: &Path,
    logs: &Path,
    work: Workload,
    (shards, prefetch): (u16, u16),
    scrape: Option<Duration>,
    limit: Duration,
) -> anyhow::Result<BacklogRun> {
    let scraped = scrape.map_or(String::new(), |d| format!("_scrape{}s", d.as_secs()));
    let tag = format!("backlog_s{shards}_p{prefetch}{scraped}");
    let env = BenchEnv::bench(&tag).await?;
    let pool = env.pool(2).await?;
    eprintln!("e2e: publishing {} messages", work.len());
    let publish_rate = prepare_backlog(&env, shards, work).await?;
    eprintln!("e2e: published at {publish_rate:.0} msg/s; starting the worker");
    let log: PathBuf = logs.join(format!("{tag}.log"));
    let mut worker = crate::procfs::start_worker(bin, &env, shards, prefetch, log)?;
    let started = Instant::now();
    let ticks = clock_ticks();
    let total = work.len();
    let mut samples = Vec::new();
    let mut first_progress: Option<(Instant, usize, u64)> = None;
    let (mut scrapes, mut last_scrape) = (0, Instant::now());
    loop {
        worker.check_alive()?;
        if let Some(every) = scrape
            && last_scrape.elapsed() >= every
        {
            last_scrape = Instant::now();
            if procfs::http_status(worker.http, "/metrics").await == Some(200) {
                scrapes += 1;
            }
        }
        let n = progress(&pool, total, 0, 0.0).await?;
        let s = procfs::sample(worker.pid).unwrap_or_default();
        samples.push(RssSample {
            t_s: started.elapsed().as_secs_f64(),
            applied: n,
            rss_mib: mib(s.rss_kib),
            hwm_mib: mib(s.hwm_kib),
            cpu_s: s.cpu_ticks as f64 / ticks,
        });
        if first_progress.is_none() && n > 0 {
            first_progress = Some((Instant::now(), n, s.cpu_ticks));
        }
        if samples.len() % 30 == 0 {
            eprintln!("e2e: {n}/{total} applied, RSS {:.1} MiB", mib(s.rss_kib));
        }
        if n >= total {
            break;
        }
        if started.elapsed() > limit {
            bail!("backlog drain: {n} of {total} after {limit:?}");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let end = samples.last().cloned().context("no sample")?;
    let (t0, c0, cpu0) = first_progress.unwrap_or((started, 0, 0));
    let drain_secs = t0.elapsed().as_secs_f64();
    let stopped = worker.stop(Duration::from_secs(30)).await;
    let verified = verify(&pool, &env, total, 0.0).await?;
    pool.close().await;
    let drained = (total - c0).max(1) as f64;
    Ok(BacklogRun {
        messages: total,
        shards,
        prefetch,
        publish_rate,
        drain_secs,
        rate: drained / drain_secs.max(1e-9),
        cpu_us_per_msg: (end.cpu_s - cpu0 as f64 / ticks) * 1e6 / drained,
        peak_rss_mib: end.hwm_mib,
        verified,
        clean_stop: stopped.map(|s| s.success()).unwrap_or(false),
        scrape_every_s: scrape.map(|d| d.as_secs_f64()),
        scrapes,
        samples,
    })
}
