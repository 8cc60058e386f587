//! `--scale LEVELS`: the same backlog drained on databases that already hold
//! LEVEL processed messages (issue 33, "a scale benchmark").
//!
//! Per level: a scenario vhost and database (`urutan migrate` by the release
//! binary), prefilled in bulk (`INSERT … SELECT … generate_series`, chunks of
//! at most `CHUNK` rows) with what urutan would have left after LEVEL
//! messages spread evenly over the `DAYS` UTC days before today: LEVEL
//! history and LEVEL dedup rows in those days' partitions, LEVEL/10 orders
//! at their last version (10 versions each), and the sent outbox rows that
//! `OUTBOX_RETENTION` (7 days by default) would still keep; then `VACUUM
//! ANALYZE` and `CHECKPOINT`. No effect rows: the drains configure no
//! effect route, so urutan writes none (`urutan_efek` stays empty; it is
//! still measured).
//!
//! Then drains of the same backlog (new orders each time, 4 versions each,
//! published like every other drain): `--rounds` rounds of a strict
//! (PREFETCH=1) and a batch (PREFETCH=128) drain, then one batch drain with
//! a retention purge half-way (the oldest prefilled day dropped from both
//! partitioned tables as the pool does it, detached by `urutan_partisi_lepas`
//! then dropped by `urutan_partisi_hapus`, both calls timed together). A
//! mode's figure per level is its median over the rounds, so "× level 0"
//! compares medians, not one noisy drain with another. Results:
//! `scale.{md,json}`.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Serialize;
use sqlx::{Connection, PgConnection, PgPool};

use crate::ceilings::prepare_backlog;
use crate::env::BenchEnv;
use crate::load::Workload;
use crate::procfs::{self, CpuSplit, Machine};
use crate::report;
use crate::runs::{self, Drain, WorkerRun};

/// Days before today that the prefill spreads its messages over.
const DAYS: i64 = 20;
/// Sent outbox rows are deleted after this many days (`OUTBOX_RETENTION`,
/// default 7d): the prefill writes only the last days' rows.
const OUTBOX_DAYS: i64 = 7;
/// Rows per prefill statement at most.
const CHUNK: i64 = 1_500_000;
/// Versions per prefilled order (orders = LEVEL / 10).
const VERSIONS: i64 = 10;
/// Bound on one prefill statement (and on VACUUM, CHECKPOINT).
const STATEMENT_LIMIT: Duration = Duration::from_secs(1800);
/// The tables whose size is reported.
const TABLES: [&str; 5] = [
    "pesan_diproses",
    "pesanan_riwayat",
    "pesanan",
    "outbox",
    "urutan_efek",
];

#[derive(Debug, Clone, Serialize)]
pub struct ScalePlan {
    pub levels: Vec<i64>,
    pub messages: usize,
    /// Strict and batch drains per level (the purge drain runs once).
    pub rounds: usize,
    pub shards: u16,
    pub batch_prefetch: u16,
    pub days: i64,
    pub outbox_days: i64,
}

impl ScalePlan {
    pub fn new(
        levels: Vec<i64>,
        messages: Option<usize>,
        shards: Option<u16>,
        rounds: Option<usize>,
    ) -> Self {
        Self {
            levels,
            messages: messages.unwrap_or(40_000),
            rounds: rounds.unwrap_or(1).max(1),
            shards: shards.unwrap_or(4),
            batch_prefetch: 128,
            days: DAYS,
            outbox_days: OUTBOX_DAYS,
        }
    }
}

/// Parses `0,10000000` (underscores allowed).
pub fn parse_levels(arg: &str) -> anyhow::Result<Vec<i64>> {
    arg.split(',')
        .map(|l| {
            let l = l.trim().replace('_', "");
            l.parse::<i64>()
                .ok()
                .filter(|n| *n >= 0)
                .with_context(|| format!("--scale wants levels like 0,10000000, got `{l}`"))
        })
        .collect()
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct Prefill {
    pub history_rows: i64,
    pub dedup_rows: i64,
    pub orders: i64,
    pub outbox_rows: i64,
    pub migrate_secs: f64,
    pub insert_secs: f64,
    pub vacuum_analyze_secs: f64,
    pub checkpoint_secs: f64,
}

/// One table's size: every partition's heap, indexes and TOAST
/// (`pg_total_relation_size` over `pg_partition_tree`).
#[derive(Debug, Clone, Serialize)]
pub struct TableSize {
    pub table: String,
    pub rows: i64,
    pub bytes: i64,
    pub bytes_per_row: Option<f64>,
    /// bytes ÷ messages processed (the rows of `pesan_diproses`).
    pub bytes_per_message: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct Purge {
    /// Messages of the drain applied when it started (about half).
    pub started_at_applied: Option<usize>,
    /// Per table: the call's wall time (ms) and what it dropped.
    pub calls: Vec<PurgeCall>,
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PurgeCall {
    pub table: String,
    pub ms: f64,
    pub dropped: Vec<(String, i64)>,
}

impl Purge {
    pub fn total_ms(&self) -> f64 {
        self.calls.iter().map(|c| c.ms).sum()
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct DrainResult {
    pub mode: String,
    pub prefetch: u16,
    /// 1-based round of this mode at its level.
    pub round: usize,
    pub run: Option<WorkerRun>,
    pub cpu: Option<CpuSplit>,
    /// rate × (broker + database + worker CPU s per message) ÷ cores.
    pub cpu_bound_fraction: Option<f64>,
    /// Per shard, the time between one apply transaction's start and the
    /// next one's (from `pesanan_riwayat.diterapkan_pada`): p99 and max, ms.
    pub apply_gap_p99_ms: Option<f64>,
    pub apply_gap_max_ms: Option<f64>,
    /// Growth of each table during the drain ÷ messages drained.
    pub growth_bytes_per_message: Vec<(String, f64)>,
    pub purge: Option<Purge>,
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct LevelResult {
    pub level: i64,
    pub prefill: Option<Prefill>,
    /// After the prefill's VACUUM ANALYZE.
    pub sizes_prefilled: Vec<TableSize>,
    /// After the three drains.
    pub sizes_end: Vec<TableSize>,
    pub drains: Vec<DrainResult>,
    pub error: Option<String>,
}

#[derive(Serialize)]
struct ScaleReport<'a> {
    machine: &'a Machine,
    plan: &'a ScalePlan,
    levels: &'a [LevelResult],
    minutes: f64,
}

/// Runs every level and writes `scale.{md,json}` to `out`. False if a
/// level or a drain failed or did not verify.
pub async fn run(plan: &ScalePlan, bin: &Path, logs: &Path, out: &Path) -> anyhow::Result<bool> {
    let began = Instant::now();
    let machine = procfs::describe_machine();
    let mut levels = Vec::new();
    for &level in &plan.levels {
        let result = run_level(plan, level, bin, logs, machine.nproc).await;
        levels.push(result);
    }
    let minutes = began.elapsed().as_secs_f64() / 60.0;
    let md = markdown(&machine, plan, &levels, minutes);
    print!("{md}");
    std::fs::write(out.join("scale.md"), &md)?;
    let json = ScaleReport {
        machine: &machine,
        plan,
        levels: &levels,
        minutes,
    };
    std::fs::write(out.join("scale.json"), serde_json::to_string_pretty(&json)?)?;
    eprintln!("e2e scale: wrote {}", out.join("scale.md").display());
    Ok(levels.iter().all(|l| {
        l.error.is_none()
            && l.drains.iter().all(|d| {
                d.error.is_none()
                    && d.run
                        .as_ref()
                        .is_some_and(|r| r.verified == "ok" && r.clean_stop)
            })
    }))
}

async fn run_level(
    plan: &ScalePlan,
    level: i64,
    bin: &Path,
    logs: &Path,
    cores: usize,
) -> LevelResult {
    let mut result = LevelResult {
        level,
        prefill: None,
        sizes_prefilled: Vec::new(),
        sizes_end: Vec::new(),
        drains: Vec::new(),
        error: None,
    };
    if let Err(e) = level_inner(plan, level, bin, logs, cores, &mut result).await {
        eprintln!("e2e scale [{level}] failed: {e:#}");
        result.error = Some(format!("{e:#}"));
    }
    result
}

async fn level_inner(
    plan: &ScalePlan,
    level: i64,
    bin: &Path,
    logs: &Path,
    cores: usize,
    result: &mut LevelResult,
) -> anyhow::Result<()> {
    // The env (vhost + database) is dropped, hence deleted, when this returns.
    let env = BenchEnv::bench(&format!("scale_{level}")).await?;
    let t = Instant::now();
    migrate(bin, &env, logs).await?;
    let migrate_secs = t.elapsed().as_secs_f64();
    let mut prefill = prefill(&env, level).await?;
    prefill.migrate_secs = migrate_secs;
    result.prefill = Some(prefill);
    let pool = env.pool(4).await?;
    result.sizes_prefilled = sizes(&pool).await?;
    let work = Workload::about(plan.messages);
    // Strict and batch alternate round by round (the machine's noise hits
    // both alike); the purge drops a day once, last.
    let mut modes: Vec<(&str, u16, bool, usize)> = Vec::new();
    for round in 1..=plan.rounds {
        modes.push(("strict", 1, false, round));
        modes.push(("batch", plan.batch_prefetch, false, round));
    }
    modes.push(("batch + purge", plan.batch_prefetch, true, 1));
    for (k, (mode, prefetch, purge, round)) in modes.into_iter().enumerate() {
        let work = work.starting_at(k * work.entities);
        eprintln!(
            "e2e scale [{level}] {mode} (round {round}): publishing {} messages",
            work.len()
        );
        let d = drain(
            &env,
            &pool,
            bin,
            logs,
            work,
            plan.shards,
            prefetch,
            purge,
            cores,
        )
        .await;
        let d = DrainResult {
            mode: mode.into(),
            prefetch,
            round,
            ..d
        };
        match (&d.run, &d.error) {
            (Some(r), _) => eprintln!(
                "e2e scale [{level}] {mode}: {:.0} msg/s, CPU µs/msg worker {} broker {} database {}, fraction of the CPU bound {}, apply gap p99 {} ms, check {}{}",
                r.rate,
                fmt(d.cpu.map(|c| c.consumer_us), 0),
                fmt(d.cpu.map(|c| c.broker_us), 0),
                fmt(d.cpu.map(|c| c.database_us), 0),
                fmt(d.cpu_bound_fraction, 2),
                fmt(d.apply_gap_p99_ms, 1),
                r.verified,
                d.purge
                    .as_ref()
                    .map_or(String::new(), |p| format!(", purge {:.1} ms", p.total_ms()))
            ),
            (None, e) => eprintln!("e2e scale [{level}] {mode} failed: {e:?}"),
        }
        result.drains.push(d);
    }
    result.sizes_end = sizes(&pool).await?;
    pool.close().await;
    Ok(())
}

/// `urutan migrate` on the scenario database (bounded: 120 s).
async fn migrate(bin: &Path, env: &BenchEnv, logs: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(logs)?;
    let mut cmd = tokio::process::Command::new(bin);
    cmd.arg("migrate")
        .env("DATABASE_URL", env.database_url().expose())
        .env("RUST_LOG", "warn")
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .context("urutan migrate took over 120 s")??;
    if !out.status.success() {
        bail!(
            "urutan migrate failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

async fn bounded<T>(
    what: &str,
    f: impl std::future::Future<Output = Result<T, sqlx::Error>>,
) -> anyhow::Result<T> {
    tokio::time::timeout(STATEMENT_LIMIT, f)
        .await
        .with_context(|| format!("{what}: over {STATEMENT_LIMIT:?}"))?
        .with_context(|| what.to_owned())
}

/// The order of row `i` (0-based): `H-<i mod orders>`, version `i div
/// orders + 1`, so version v of every order precedes version v + 1 in time.
const ROW: &str = "
    SELECT i, 'H-' || lpad((i % $3)::text, 9, '0') AS pesanan_id, i / $3 + 1 AS versi,
           to_timestamp($4::float8) + make_interval(secs => i * $5::float8) AS pada
    FROM generate_series($1::bigint, $2::bigint - 1) i";

/// Fills the freshly migrated database with `level` processed messages.
async fn prefill(env: &BenchEnv, level: i64) -> anyhow::Result<Prefill> {
    let mut p = Prefill::default();
    if level == 0 {
        return Ok(p);
    }
    let mut c = PgConnection::connect(env.database_url().expose()).await?;
    // No trigger (the history's effect trigger finds no route anyway) and
    // no per-row commit wait: a bulk load.
    sqlx::raw_sql(
        "SET session_replication_role = replica; SET synchronous_commit = off;
         SET maintenance_work_mem = '512MB'; SET statement_timeout = 0",
    )
    .execute(&mut c)
    .await?;
    let start: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM ((now() AT TIME ZONE 'UTC')::date - $1::int)::timestamp AT TIME ZONE 'UTC')::float8",
    )
    .bind(i32::try_from(DAYS)?)
    .fetch_one(&mut c)
    .await?;
    let step = (DAYS * 86_400) as f64 / level as f64;
    let orders = (level / VERSIONS).max(1);
    // Every prefilled day's partitions first, for both tables.
    for table in ["pesan_diproses", "pesanan_riwayat"] {
        sqlx::query(
            "SELECT urutan_partisi_buat($1, (now() AT TIME ZONE 'UTC')::date - d)
             FROM generate_series(1, $2::int) d",
        )
        .bind(table)
        .bind(i32::try_from(DAYS)?)
        .execute(&mut c)
        .await?;
    }
    let began = Instant::now();
    let statuses = "(ARRAY['dibuat','dibayar','dikirim','selesai'])[(r.versi - 1) % 4 + 1]";
    let data = "jsonb_build_object('t_ns', (extract(epoch FROM r.pada) * 1e9)::int8,
        'pelanggan', 'C-' || lpad((r.i % 10000)::text, 7, '0'), 'kota', 'jakarta',
        'mata_uang', 'IDR', 'total', 62500 * (r.i % 5 + 1),
        'items', jsonb_build_array(
            jsonb_build_object('sku', 'SKU-' || lpad((r.i % 30000)::text, 5, '0'), 'qty', r.i % 3 + 1, 'harga', 62500),
            jsonb_build_object('sku', 'SKU-20417', 'qty', 1, 'harga', 12500)),
        'catatan', 'kirim sebelum jam 17.00')";
    let history = format!(
        "INSERT INTO pesanan_riwayat (seq, pesanan_id, versi, status, message_id, shard, diterapkan_pada)
         SELECT r.i + 1, r.pesanan_id, r.versi, {statuses}, r.pesanan_id || '-v' || r.versi,
                (r.i % $3) % 4, r.pada FROM ({ROW}) r"
    );
    let dedup = format!(
        "INSERT INTO pesan_diproses (message_id, diproses_pada, pesanan_id)
         SELECT r.pesanan_id || '-v' || r.versi, r.pada, r.pesanan_id FROM ({ROW}) r"
    );
    let outbox = format!(
        "INSERT INTO outbox (agregat_tipe, agregat_id, routing_key, payload, dibuat_pada, dikirim_pada)
         SELECT 'pesanan', r.pesanan_id, 'pesanan.jakarta.bench',
                jsonb_build_object('id', r.pesanan_id, 'status', {statuses}, 'versi', r.versi, 'data', {data}),
                r.pada - interval '20 milliseconds', r.pada - interval '10 milliseconds'
         FROM ({ROW}) r"
    );
    let orders_sql = format!(
        "INSERT INTO pesanan (id, status, versi, data, diperbarui_pada, epoch)
         SELECT r.pesanan_id, {statuses}, r.versi, {data}, r.pada, 0 FROM ({ROW}) r"
    );
    // The outbox keeps the sent rows of the last OUTBOX_DAYS days only.
    let outbox_from = level * (DAYS - OUTBOX_DAYS) / DAYS;
    let jobs: [(&str, String, i64, i64); 4] = [
        ("history", history, 0, level),
        ("dedup", dedup, 0, level),
        ("orders", orders_sql, level - orders, level),
        ("outbox", outbox, outbox_from, level),
    ];
    for (what, sql, from, to) in jobs {
        let mut a = from;
        while a < to {
            let b = (a + CHUNK).min(to);
            if what == "outbox" {
                // The outbox is partitioned by id range (migration 0033):
                // the partitions ahead, as the relay would keep them.
                sqlx::query("SELECT urutan_partisi_id_siapkan()")
                    .execute(&mut c)
                    .await?;
            }
            let t = Instant::now();
            let q = sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
                .bind(a)
                .bind(b)
                .bind(orders)
                .bind(start)
                .bind(step)
                .execute(&mut c);
            let n = bounded(what, q).await?.rows_affected();
            eprintln!(
                "e2e scale [{level}] prefill {what}: rows {a}..{b} ({n}) in {:.1} s, {:.0} s so far",
                t.elapsed().as_secs_f64(),
                began.elapsed().as_secs_f64()
            );
            a = b;
        }
    }
    p.history_rows = level;
    p.dedup_rows = level;
    p.orders = orders;
    p.outbox_rows = level - outbox_from;
    sqlx::query("SELECT setval('pesanan_riwayat_seq_seq', $1)")
        .bind(level)
        .execute(&mut c)
        .await?;
    p.insert_secs = began.elapsed().as_secs_f64();
    let t = Instant::now();
    bounded(
        "VACUUM ANALYZE",
        sqlx::raw_sql("VACUUM ANALYZE").execute(&mut c),
    )
    .await?;
    p.vacuum_analyze_secs = t.elapsed().as_secs_f64();
    let t = Instant::now();
    bounded("CHECKPOINT", sqlx::raw_sql("CHECKPOINT").execute(&mut c)).await?;
    p.checkpoint_secs = t.elapsed().as_secs_f64();
    eprintln!(
        "e2e scale [{level}] prefilled in {:.0} s (inserts {:.0} s, VACUUM ANALYZE {:.0} s, CHECKPOINT {:.0} s)",
        p.insert_secs + p.vacuum_analyze_secs + p.checkpoint_secs,
        p.insert_secs,
        p.vacuum_analyze_secs,
        p.checkpoint_secs
    );
    let _ = c.close().await;
    Ok(p)
}

/// Bytes of every table (all partitions, indexes, TOAST).
async fn bytes(pool: &PgPool) -> anyhow::Result<Vec<(String, i64)>> {
    Ok(sqlx::query_as(
        "SELECT t, coalesce((SELECT sum(pg_total_relation_size(relid))
                             FROM pg_partition_tree(t::regclass)),
                            pg_total_relation_size(t::regclass))::int8
         FROM unnest($1::text[]) t",
    )
    .bind(TABLES.map(str::to_owned).to_vec())
    .fetch_all(pool)
    .await?)
}

/// Sizes with exact row counts (a count of each table: seconds at 10 M).
async fn sizes(pool: &PgPool) -> anyhow::Result<Vec<TableSize>> {
    let mut rows = Vec::new();
    for t in TABLES {
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {t}")))
            .fetch_one(pool)
            .await?;
        rows.push(n);
    }
    let messages = rows[0];
    Ok(bytes(pool)
        .await?
        .into_iter()
        .zip(rows)
        .map(|((table, bytes), rows)| TableSize {
            table,
            rows,
            bytes,
            bytes_per_row: (rows > 0).then(|| bytes as f64 / rows as f64),
            bytes_per_message: (messages > 0).then(|| bytes as f64 / messages as f64),
        })
        .collect())
}

#[allow(clippy::too_many_arguments)]
async fn drain(
    env: &BenchEnv,
    pool: &PgPool,
    bin: &Path,
    logs: &Path,
    work: Workload,
    shards: u16,
    prefetch: u16,
    purge: bool,
    cores: usize,
) -> DrainResult {
    let mut d = DrainResult {
        mode: String::new(),
        prefetch,
        round: 1,
        run: None,
        cpu: None,
        cpu_bound_fraction: None,
        apply_gap_p99_ms: None,
        apply_gap_max_ms: None,
        growth_bytes_per_message: Vec::new(),
        purge: None,
        error: None,
    };
    if let Err(e) = drain_inner(
        env,
        pool,
        bin,
        logs,
        work,
        (shards, prefetch),
        purge,
        cores,
        &mut d,
    )
    .await
    {
        d.error = Some(format!("{e:#}"));
    }
    d
}

#[allow(clippy::too_many_arguments)]
async fn drain_inner(
    env: &BenchEnv,
    pool: &PgPool,
    bin: &Path,
    logs: &Path,
    work: Workload,
    (shards, prefetch): (u16, u16),
    purge: bool,
    cores: usize,
    d: &mut DrainResult,
) -> anyhow::Result<()> {
    let publish_rate = prepare_backlog(env, shards, work).await?;
    let before = bytes(pool).await?;
    let seq_before: i64 = sqlx::query_scalar(
        "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM pesanan_riwayat_seq_seq",
    )
    .fetch_one(pool)
    .await?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    let purger = purge.then(|| {
        let url = env.database_url();
        let seq_pool = pool.clone();
        tokio::spawn(async move {
            let mut p = Purge::default();
            if rx.await.is_err() {
                p.error = Some("the drain ended before half of it was applied".into());
                return p;
            }
            p.started_at_applied =
                sqlx::query_scalar::<_, i64>("SELECT last_value FROM pesanan_riwayat_seq_seq")
                    .fetch_one(&seq_pool)
                    .await
                    .ok()
                    .and_then(|v| usize::try_from(v - seq_before).ok());
            let work = async {
                let mut c = PgConnection::connect(url.expose()).await?;
                for table in ["pesan_diproses", "pesanan_riwayat"] {
                    // Keep everything but the oldest prefilled day: now() −
                    // retention = 1 minute past the end of that day.
                    // The pool's two steps (migration 0036): detach, then
                    // drop what was detached; timed together.
                    let t = Instant::now();
                    sqlx::query(
                        "SELECT partisi FROM urutan_partisi_lepas($1,
                           now() - ((((now() AT TIME ZONE 'UTC')::date - $2::int + 1)::timestamp
                                     AT TIME ZONE 'UTC') + interval '1 minute'))",
                    )
                    .bind(table)
                    .bind(i32::try_from(DAYS).unwrap_or(20))
                    .fetch_all(&mut c)
                    .await?;
                    let dropped: Vec<(String, i64)> =
                        sqlx::query_as("SELECT partisi, baris FROM urutan_partisi_hapus($1)")
                            .bind(table)
                            .fetch_all(&mut c)
                            .await?;
                    p.calls.push(PurgeCall {
                        table: table.into(),
                        ms: t.elapsed().as_secs_f64() * 1e3,
                        dropped,
                    });
                }
                let _ = c.close().await;
                anyhow::Ok(())
            };
            match tokio::time::timeout(Duration::from_secs(60), work).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => p.error = Some(format!("{e:#}")),
                Err(_) => p.error = Some("the purge took over 60 s".into()),
            }
            p
        })
    });
    let tag = format!(
        "scale_s{shards}_p{prefetch}{}",
        if purge { "_purge" } else { "" }
    );
    let drain = Drain {
        bin,
        log: logs.join(format!("{tag}_{}.log", work.first)),
        env,
        pool,
        work,
        shards,
        prefetch,
        extra: &[],
    };
    let run = runs::drain_published(drain, purge.then_some(tx)).await;
    if let Some(purger) = purger {
        d.purge = Some(
            tokio::time::timeout(Duration::from_secs(90), purger)
                .await
                .context("waiting for the purge")?
                .context("the purge task panicked")?,
        );
    }
    let mut run = run?;
    run.publish_rate = publish_rate;
    let after = bytes(pool).await?;
    d.growth_bytes_per_message = before
        .iter()
        .zip(&after)
        .map(|((t, b0), (_, b1))| (t.clone(), (b1 - b0) as f64 / run.messages as f64))
        .collect();
    let gaps: (Option<f64>, Option<f64>) = sqlx::query_as(
        "WITH t AS (SELECT DISTINCT shard, diterapkan_pada AS t FROM pesanan_riwayat
                    WHERE diterapkan_pada >= to_timestamp($1)),
              g AS (SELECT extract(epoch FROM t - lag(t) OVER (PARTITION BY shard ORDER BY t)) * 1e3 AS ms FROM t)
         SELECT (percentile_cont(0.99) WITHIN GROUP (ORDER BY ms))::float8, max(ms)::float8
         FROM g WHERE ms IS NOT NULL",
    )
    .bind(run.since_epoch)
    .fetch_one(pool)
    .await?;
    (d.apply_gap_p99_ms, d.apply_gap_max_ms) = gaps;
    d.cpu = run.cpu;
    d.cpu_bound_fraction = run.cpu_bound_fraction(cores);
    d.run = Some(run);
    Ok(())
}

fn fmt(x: Option<f64>, digits: usize) -> String {
    x.map_or_else(|| "—".into(), |x| format!("{x:.digits$}"))
}

/// One mode's medians at one level, over the drains that ran.
struct ModeMedians {
    drains: usize,
    rate: Option<f64>,
    worker_us: Option<f64>,
    broker_us: Option<f64>,
    database_us: Option<f64>,
    fraction: Option<f64>,
}

impl ModeMedians {
    fn of(level: &LevelResult, mode: &str) -> Self {
        let drains: Vec<&DrainResult> = level
            .drains
            .iter()
            .filter(|d| d.mode == mode && d.run.is_some())
            .collect();
        let of = |f: &dyn Fn(&DrainResult) -> Option<f64>| {
            report::median(drains.iter().filter_map(|d| f(d)).collect())
        };
        Self {
            drains: drains.len(),
            rate: of(&|d| d.run.as_ref().map(|r| r.rate)),
            worker_us: of(&|d| d.cpu.map(|c| c.consumer_us)),
            broker_us: of(&|d| d.cpu.map(|c| c.broker_us)),
            database_us: of(&|d| d.cpu.map(|c| c.database_us)),
            fraction: of(&|d| d.cpu_bound_fraction),
        }
    }
}

fn gib(bytes: f64) -> f64 {
    bytes / 1024.0 / 1024.0 / 1024.0
}

fn markdown(m: &Machine, plan: &ScalePlan, levels: &[LevelResult], minutes: f64) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# urutan at scale: drains on prefilled databases\n");
    let _ = writeln!(
        md,
        "- Levels {:?} processed messages prefilled (spread over the {} UTC days before today); each level: {} round(s) of a strict drain (PREFETCH=1) and a batch drain (PREFETCH={}), then one batch drain with a retention purge half-way, {} messages each (new orders, 4 versions), {} shards; took {minutes:.1} min",
        plan.levels, plan.days, plan.rounds, plan.batch_prefetch, plan.messages, plan.shards
    );
    let _ = writeln!(md, "{}", m.markdown_line());
    let _ = writeln!(
        md,
        "- Prefill per level N: N history and N dedup rows in their day partitions, N/10 orders at version 10, and the sent outbox rows of the last {} days only (OUTBOX_RETENTION=7d deletes older ones: 0.35 N rows); no effect rows (no route configured, as in every drain). Then VACUUM ANALYZE, CHECKPOINT.",
        plan.outbox_days
    );
    let _ = writeln!(
        md,
        "- **fraction of the CPU bound** = rate × (worker + broker + database CPU s per message in that drain) ÷ {} cores. **apply gap**: per shard, the time between the starts of consecutive apply transactions (p99, max); a backlog drain has no meaningful publish→apply latency (every message waits in the queue), so the stall a purge could cause is read from these gaps.\n",
        m.nproc
    );
    let _ = writeln!(md, "## Medians per level and mode\n");
    let _ = writeln!(
        md,
        "Each mode's median over its rounds; × level 0 = this median ÷ the level-0 median of the same mode.\n"
    );
    let _ = writeln!(
        md,
        "| prefilled | mode | drains | median msg/s | × level 0 | median worker / broker / database µs/msg | median fraction of CPU bound |"
    );
    let _ = writeln!(md, "|---:|---|---:|---:|---:|---:|---:|");
    let modes = ["strict", "batch", "batch + purge"];
    for l in levels {
        for mode in modes {
            let m = ModeMedians::of(l, mode);
            if m.drains == 0 {
                continue;
            }
            let base = levels
                .iter()
                .find(|b| b.level == 0)
                .and_then(|b| ModeMedians::of(b, mode).rate);
            let _ = writeln!(
                md,
                "| {} | {mode} | {} | {} | {} | {} / {} / {} | {} |",
                l.level,
                m.drains,
                fmt(m.rate, 0),
                fmt(m.rate.zip(base).map(|(r, b)| r / b), 2),
                fmt(m.worker_us, 0),
                fmt(m.broker_us, 0),
                fmt(m.database_us, 0),
                fmt(m.fraction, 2),
            );
        }
    }
    let _ = writeln!(md, "\n## Drains\n");
    let _ = writeln!(
        md,
        "| prefilled | mode | round | msg/s | × level 0 median | worker µs/msg | broker µs/msg | database µs/msg | total µs/msg | fraction of CPU bound | apply gap p99 / max ms | batch | WAL B/msg | purge (drop calls) | check |"
    );
    let _ = writeln!(
        md,
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"
    );
    let base_rate = |mode: &str| {
        levels
            .iter()
            .find(|l| l.level == 0)
            .and_then(|l| ModeMedians::of(l, mode).rate)
    };
    for l in levels {
        for d in &l.drains {
            let rate = d.run.as_ref().map(|r| r.rate);
            let purge = d.purge.as_ref().map_or("—".to_owned(), |p| {
                let dropped: i64 = p.calls.iter().flat_map(|c| &c.dropped).map(|x| x.1).sum();
                let parts: usize = p.calls.iter().map(|c| c.dropped.len()).sum();
                let mut s = format!(
                    "{:.1} ms ({}), {parts} partitions, {dropped} rows",
                    p.total_ms(),
                    p.calls
                        .iter()
                        .map(|c| format!("{} {:.1}", c.table, c.ms))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                if let Some(e) = &p.error {
                    let _ = write!(s, "; error: {e}");
                }
                s
            });
            let check = match (&d.run, &d.error) {
                (Some(r), _) => format!(
                    "{}{}",
                    r.verified,
                    if r.clean_stop { "" } else { ", unclean stop" }
                ),
                (None, Some(e)) => format!("failed: {e}"),
                (None, None) => "—".into(),
            };
            let _ = writeln!(
                md,
                "| {} | {} (PREFETCH={}) | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} | {} | {} | {} | {} |",
                l.level,
                d.mode,
                d.prefetch,
                d.round,
                fmt(rate, 0),
                fmt(rate.zip(base_rate(&d.mode)).map(|(r, b)| r / b), 2),
                fmt(d.cpu.map(|c| c.consumer_us), 0),
                fmt(d.cpu.map(|c| c.broker_us), 0),
                fmt(d.cpu.map(|c| c.database_us), 0),
                fmt(d.cpu.map(|c| c.total_us()), 0),
                fmt(d.cpu_bound_fraction, 2),
                fmt(d.apply_gap_p99_ms, 1),
                fmt(d.apply_gap_max_ms, 1),
                fmt(d.run.as_ref().and_then(|r| r.mean_batch), 1),
                fmt(d.run.as_ref().and_then(|r| r.wal_bytes_per_msg), 0),
                purge,
                check
            );
        }
        if let Some(e) = &l.error {
            let _ = writeln!(
                md,
                "| {} | level failed: {e} | | | | | | | | | | | | | |",
                l.level
            );
        }
    }
    let _ = writeln!(md, "\n## Prefill\n");
    let _ = writeln!(
        md,
        "| prefilled | history rows | dedup rows | orders | outbox rows | migrate s | inserts s | VACUUM ANALYZE s | CHECKPOINT s |"
    );
    let _ = writeln!(md, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for l in levels {
        if let Some(p) = &l.prefill {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {:.1} | {:.0} | {:.0} | {:.0} |",
                l.level,
                p.history_rows,
                p.dedup_rows,
                p.orders,
                p.outbox_rows,
                p.migrate_secs,
                p.insert_secs,
                p.vacuum_analyze_secs,
                p.checkpoint_secs
            );
        }
    }
    let _ = writeln!(md, "\n## Table and index bytes\n");
    let _ = writeln!(
        md,
        "At the end of each level (prefill + the drains, one day dropped by the purge). bytes/row = `pg_total_relation_size` summed over the table's partitions ÷ its rows; bytes/message = the same ÷ messages processed (rows of `pesan_diproses`). *Drain growth* = what each table grew during the first strict and the first batch drain (no purge) ÷ messages drained: the worker's own writes, index pages split by random inserts included (bulk-loaded rows pack tighter).\n"
    );
    let _ = writeln!(
        md,
        "| prefilled | table | rows | MiB | bytes/row | bytes/message | drain growth bytes/message (strict / batch) |"
    );
    let _ = writeln!(md, "|---:|---|---:|---:|---:|---:|---:|");
    for l in levels {
        for s in &l.sizes_end {
            let growth = |mode: &str| {
                l.drains.iter().find(|d| d.mode == mode).and_then(|d| {
                    d.growth_bytes_per_message
                        .iter()
                        .find(|(t, _)| *t == s.table)
                        .map(|g| g.1)
                })
            };
            let _ = writeln!(
                md,
                "| {} | {} | {} | {:.1} | {} | {} | {} / {} |",
                l.level,
                s.table,
                s.rows,
                s.bytes as f64 / 1024.0 / 1024.0,
                fmt(s.bytes_per_row, 0),
                fmt(s.bytes_per_message, 0),
                fmt(growth("strict"), 0),
                fmt(growth("batch"), 0)
            );
        }
    }
    // The extrapolation to 100 M, from the largest level with rows (when
    // no level reached 100 M).
    if let Some(l) = levels
        .iter()
        .filter(|l| l.level > 0 && !l.sizes_end.is_empty())
        .max_by_key(|l| l.level)
        .filter(|l| l.level < 100_000_000)
    {
        let per_msg: f64 = l.sizes_end.iter().filter_map(|s| s.bytes_per_message).sum();
        let _ = writeln!(
            md,
            "\n**Extrapolation (not measured):** at {} messages the tables above hold {:.0} bytes per message processed (the outbox holding its last {} of {} days). Linearly, 100 million messages kept the same way would need about {:.0} GiB of table and index space (before WAL, free-space headroom and backups).",
            l.level,
            per_msg,
            plan.outbox_days,
            plan.days,
            gib(per_msg * 1e8),
        );
    }
    md
}
