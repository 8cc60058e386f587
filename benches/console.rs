//! The console's pages with a large backlog to show (issue 34): how long
//! each page takes to render with 100,000 dead letters and 10,000 held
//! orders, and which tables each page read sequentially (a page that reads a
//! large table row by row gets slower with every dead letter).
//!
//! ```sh
//! cargo bench --bench console -- --dead-letters 100000 --held 10000 --loads 30
//! ```
//!
//! One database and vhost of its own: migrated, its topology declared by a
//! pool that is then stopped, and filled in bulk (`generate_series`) as
//! urutan would have filled it: unresolved dead letters (and half as many
//! resolved ones) over four reasons, held orders each with two parked
//! versions, retrying orders, applied orders with their history and dedup
//! ids, their effects to three endpoints (sent, pending, failing,
//! dead-lettered), and audit rows; then `VACUUM ANALYZE`, as autovacuum
//! would have.
//!
//! Render time: `urutan console` (the release binary) serves each page
//! `--loads` times after two warm-up loads; the client's time to the last
//! byte of the body, p50, p99 and max.
//!
//! Plans: for each page alone, a fresh console process loads the page once
//! and stops; PostgreSQL's per-table counters (`pg_stat_user_tables`,
//! flushed when the console's sessions end) then say which tables were read
//! sequentially and how many rows that read. A table that keeps history
//! (dead letters, resolved ones included; applied versions, dedup ids,
//! outbox, effects, audit, skips) read that way fails the check: such a
//! page would slow down with every day of traffic. The tables of what is
//! held or set aside NOW hold only current rows; a page that counts all of
//! them reads them all either way (sequentially or through an index), so
//! their sequential reads are shown, not failed.
//! Results: `benches/results/console.md`.

use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use clap::Parser;
use sqlx::PgPool;
use urutan_testkit::fixtures::{RunningPool, TestEnv, UrutanProcess};
use urutan_testkit::markdown::row;

#[derive(Parser, Debug, Clone)]
struct Options {
    /// Unresolved dead letters (and twice as many resolved ones).
    #[arg(long, default_value_t = 100_000)]
    dead_letters: i64,
    /// Held orders (each with two parked versions waiting).
    #[arg(long, default_value_t = 10_000)]
    held: i64,
    /// Retrying orders (a parked message with a next try).
    #[arg(long, default_value_t = 1_000)]
    retrying: i64,
    /// Applied orders (three versions each, history and dedup ids).
    #[arg(long, default_value_t = 100_000)]
    orders: i64,
    /// Timed loads of each page.
    #[arg(long, default_value_t = 30)]
    loads: usize,
    /// Goal for a page's p99 render time, in milliseconds.
    #[arg(long, default_value_t = 200)]
    goal_ms: u64,
    /// Passed by `cargo bench`.
    #[arg(long, hide = true)]
    bench: bool,
}

/// The bulk fill, as urutan would have written these rows. `$1` stands for
/// the dead letters, `$2` the held orders, `$3` the retrying orders, `$4`
/// the applied orders.
const FILL: &[&str] = &[
    // Unresolved dead letters over four reasons and 20,000 orders, one a
    // second back from now; twice as many resolved ones, older (records
    // resolved by replays and purges, kept for DEAD_LETTER_RETENTION).
    "INSERT INTO urutan_dead_letter (delivery_key, message_id, pesanan_id, versi, shard, reason,
         detail, dead_lettered_at, recorded_at, headers, body, body_bytes)
     SELECT 'bench-' || g, 'm-' || g, 'DL-' || (g % 20000), 1 + g / 20000, g % 4,
            (ARRAY['invalid_body', 'missing_header', 'message_id_reused', 'delivery_limit'])[1 + g % 4],
            'filled by the console bench', now() - make_interval(secs => g), now() - make_interval(secs => g),
            jsonb_build_object('x-pesanan-id', 'DL-' || (g % 20000)),
            convert_to('{\"id\":\"DL-' || (g % 20000) || '\",\"status\":\"dibuat\"}', 'UTF8'), 40
     FROM generate_series(1, $1::bigint) g",
    "INSERT INTO urutan_dead_letter (delivery_key, message_id, pesanan_id, versi, shard, reason,
         detail, dead_lettered_at, resolved_at, resolution, body_bytes)
     SELECT 'bench-old-' || g, 'old-' || g, 'DL-' || (g % 20000), 1, g % 4, 'invalid_body',
            'filled by the console bench', now() - interval '30 days' - make_interval(secs => g),
            now() - interval '29 days', 'replayed', 0
     FROM generate_series(1, 2 * $1::bigint) g",
    // Held orders (a refused version), each with two later versions parked.
    "INSERT INTO urutan_tahan (pesanan_id, alasan, message_id, versi, shard, sejak, galat)
     SELECT 'H-' || g, 'refused', 'H-' || g || '-v3', 3, g % 4, now() - make_interval(secs => g),
            'the handler refused it (bench)'
     FROM generate_series(1, $2::bigint) g",
    "INSERT INTO urutan_parkir (pesanan_id, message_id, status, versi, data, shard, epoch, pesan)
     SELECT 'H-' || g, 'H-' || g || '-v' || v, 'dibayar', v, '{}'::jsonb, g % 4, 1, NULL
     FROM generate_series(1, $2::bigint) g, generate_series(4, 5) v",
    // Retrying orders: one message set aside each, with a next try.
    "INSERT INTO urutan_parkir (pesanan_id, message_id, status, versi, data, shard, epoch,
         percobaan, jatuh_tempo, galat)
     SELECT 'R-' || g, 'R-' || g || '-v2', 'dibayar', 2, '{}'::jsonb, g % 4, 1, 3,
            now() + make_interval(secs => g), 'could not serialize access (bench)'
     FROM generate_series(1, $3::bigint) g",
    // Applied orders ($4 of them, three versions each, with their dedup
    // ids), the ones the bench opens among them: the order page reads these
    // tables by key, and their size shows whether it does.
    "INSERT INTO pesanan (id, status, versi, data)
     SELECT 'P-' || g, 'dikirim', 3, '{}'::jsonb FROM generate_series(1, $4::bigint) g
     UNION ALL VALUES ('DL-7', 'dibuat', 1, '{}'::jsonb), ('H-7', 'menunggu_bayar', 2, '{}'::jsonb)",
    "INSERT INTO pesanan_riwayat (pesanan_id, versi, status, message_id, shard)
     SELECT 'P-' || g, v, 'dibuat', 'P-' || g || '-v' || v, g % 4
     FROM generate_series(1, $4::bigint) g, generate_series(1, 3) v
     UNION ALL
     SELECT o, v, 'dibuat', o || '-v' || v, 3 FROM unnest(ARRAY['DL-7', 'H-7']) o, generate_series(1, 2) v
     WHERE o = 'H-7' OR v = 1",
    "INSERT INTO pesan_diproses (message_id, pesanan_id)
     SELECT message_id, pesanan_id FROM pesanan_riwayat",
    // Effects to three endpoints (one with a token in its path): one per
    // applied order and endpoint sent, kept for EFFECTS_RETENTION; a few
    // hundred pending, some of them failing, and some dead-lettered.
    "INSERT INTO urutan_efek_tujuan (tujuan, url) VALUES
         (1, 'https://pay.internal:8443/capture/secret-token'),
         (2, 'https://ship.internal/notify'),
         (3, 'http://crm.internal/hooks?key=abc')",
    "INSERT INTO urutan_efek (pesanan_id, versi, tujuan, message_id, isi, keadaan, percobaan,
         dibuat_pada, selesai_pada, kode)
     SELECT 'P-' || g, 3, t, 'P-' || g || '-v3', '{}'::jsonb, 'terkirim', 1,
            now() - interval '1 day', now() - interval '1 day', 200
     FROM generate_series(1, $4::bigint) g, generate_series(1, 3) t",
    "INSERT INTO urutan_efek (pesanan_id, versi, tujuan, message_id, isi, keadaan, percobaan,
         dibuat_pada, coba_pada, kode, jawaban)
     SELECT 'E-' || g, 1, 1 + g % 3, 'E-' || g || '-v1', '{}'::jsonb, 'menunggu',
            CASE WHEN g % 5 = 0 THEN 3 ELSE 0 END, now() - make_interval(secs => g), now(),
            CASE WHEN g % 5 = 0 THEN 503 END,
            CASE WHEN g % 5 = 0 THEN 'HTTP 503: upstream unavailable' END
     FROM generate_series(1, 500) g",
    "INSERT INTO urutan_efek (pesanan_id, versi, tujuan, message_id, isi, keadaan, percobaan,
         dibuat_pada, selesai_pada, kode, jawaban)
     SELECT 'X-' || g, 1, 1, 'X-' || g || '-v1', '{}'::jsonb, 'gagal', 10,
            now() - interval '2 hours', now() - make_interval(secs => g), 400, 'HTTP 400: bad request'
     FROM generate_series(1, 50) g",
    // Audit rows of earlier releases.
    "INSERT INTO urutan_audit (pada, oleh, tindakan, pesanan_id, sasaran, hasil)
     SELECT now() - make_interval(secs => g), 'console', 'hold release', 'H-old-' || g,
            'H-old-' || g, 'released' FROM generate_series(1, $2::bigint) g",
];

/// Tables that keep history: they grow with traffic and time (with their
/// day partitions, `<table>_hYYYYMMDD` and `<table>_awal`).
const HISTORY_TABLES: &[&str] = &[
    "urutan_dead_letter",
    "pesanan_riwayat",
    "pesan_diproses",
    "outbox",
    "urutan_efek",
    "urutan_audit",
    "urutan_lewati",
    "pesanan",
];

fn keeps_history(table: &str) -> bool {
    HISTORY_TABLES.iter().any(|t| {
        table.strip_prefix(t).is_some_and(|rest| {
            // The table itself, or one of its day partitions.
            rest.is_empty()
                || rest == "_awal"
                || rest
                    .strip_prefix("_h")
                    .is_some_and(|d| d.bytes().all(|b| b.is_ascii_digit()))
        })
    })
}

/// The pages measured: (name, path). `{dl}` is a dead letter's record id.
const PAGES: &[(&str, &str)] = &[
    ("overview", "/"),
    ("order with dead letters", "/orders/DL-7"),
    ("held order", "/orders/H-7"),
    ("dead letters", "/dead-letters"),
    (
        "dead letters by reason",
        "/dead-letters?reason=delivery_limit",
    ),
    ("dead letters by order", "/dead-letters?order=DL-7"),
    (
        "dead letters since",
        "/dead-letters?since=2026-01-01T00:00:00Z",
    ),
    ("a dead letter", "/dead-letters/{dl}"),
    ("holds and retries", "/holds"),
    ("effects", "/effects"),
    ("audit", "/audit"),
];

async fn fill(db: &PgPool, options: &Options) -> anyhow::Result<()> {
    for sql in FILL {
        // The counts are numbers from the command line, written in.
        let sql = sql
            .replace("$1", &options.dead_letters.to_string())
            .replace("$2", &options.held.to_string())
            .replace("$3", &options.retrying.to_string())
            .replace("$4", &options.orders.to_string());
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.clone()))
            .execute(db)
            .await
            .with_context(|| format!("fill: {}", sql.lines().next().unwrap_or(&sql)))?;
    }
    sqlx::raw_sql("VACUUM ANALYZE").execute(db).await?;
    Ok(())
}

/// Rows read sequentially so far, by table (partitions included).
async fn seq_reads(db: &PgPool) -> anyhow::Result<Vec<(String, i64)>> {
    Ok(sqlx::query_as(
        "SELECT relname::text, seq_tup_read FROM pg_stat_user_tables ORDER BY relname",
    )
    .fetch_all(db)
    .await?)
}

/// Rows in each table now (estimates after the ANALYZE).
async fn table_rows(db: &PgPool) -> anyhow::Result<Vec<(String, i64)>> {
    Ok(sqlx::query_as(
        "SELECT c.relname::text, greatest(c.reltuples, 0)::bigint
         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = 'public' AND c.relkind = 'r'",
    )
    .fetch_all(db)
    .await?)
}

fn console_vars(env: &TestEnv, addr: &str) -> Vec<(&'static str, String)> {
    let mut vars = env.process_env(4);
    vars.retain(|(k, _)| *k != "RUST_LOG");
    vars.push(("RUST_LOG", "warn".into()));
    vars.push(("CONSOLE_LISTEN", addr.into()));
    vars
}

fn free_addr() -> anyhow::Result<String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.to_string())
}

async fn start_console(
    env: &TestEnv,
    client: &reqwest::Client,
) -> anyhow::Result<(UrutanProcess, String)> {
    let addr = free_addr()?;
    let console = UrutanProcess::start("console", &console_vars(env, &addr));
    let base = format!("http://{addr}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(r) = client.get(format!("{base}/console.css")).send().await
            && r.status().is_success()
        {
            return Ok((console, base));
        }
        ensure!(
            Instant::now() < deadline,
            "the console did not answer within 30 s:\n{}",
            console.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One load: status and milliseconds to the end of the body.
async fn load(client: &reqwest::Client, url: &str) -> anyhow::Result<(u16, f64)> {
    let t = Instant::now();
    let response = client.get(url).send().await?;
    let status = response.status().as_u16();
    let body = response.bytes().await?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    ensure!(!body.is_empty(), "{url}: an empty page");
    Ok((status, ms))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

struct PageResult {
    name: &'static str,
    status: u16,
    p50: f64,
    p99: f64,
    max: f64,
    /// Tables read sequentially: (table, rows read, rows in the table).
    seq: Vec<(String, i64, i64)>,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    // `cargo test --all-targets` runs benches as tests (without `--bench`).
    if !args.iter().any(|a| a == "--bench") {
        println!("console bench: skipped (run `cargo bench --bench console`)");
        return Ok(());
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let options = Options::parse();
    let env = TestEnv::bench("console").await?;
    let db = env.pool(4).await?;
    // The topology, declared by a pool as it starts; stopped before the
    // fill, so its own periodic reads neither wait on it nor count below.
    RunningPool::ready(env.settings(4)).await.stop().await;
    let t = Instant::now();
    fill(&db, &options).await?;
    println!("filled and analyzed in {:.1}s", t.elapsed().as_secs_f64());
    let dl: i64 = sqlx::query_scalar(
        "SELECT id FROM urutan_dead_letter WHERE resolved_at IS NULL ORDER BY id LIMIT 1",
    )
    .fetch_one(&db)
    .await?;
    let rows = table_rows(&db).await?;
    let rows_of = |table: &str| rows.iter().find(|(t, _)| t == table).map_or(0, |(_, n)| *n);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;

    // Render times, every page from one console process.
    let (mut console, base) = start_console(&env, &client).await?;
    let mut results = Vec::new();
    for (name, path) in PAGES {
        let url = format!("{base}{}", path.replace("{dl}", &dl.to_string()));
        for _ in 0..2 {
            load(&client, &url).await?;
        }
        let mut times = Vec::with_capacity(options.loads);
        let mut status = 0;
        for _ in 0..options.loads {
            let (s, ms) = load(&client, &url).await?;
            status = s;
            times.push(ms);
        }
        times.sort_by(f64::total_cmp);
        results.push(PageResult {
            name,
            status,
            p50: percentile(&times, 0.5),
            p99: percentile(&times, 0.99),
            max: *times.last().expect("loads"),
            seq: Vec::new(),
        });
    }
    console.process.stop(Duration::from_secs(10)).await?;

    // Plans: each page alone, read from the per-table counters.
    for (result, (_, path)) in results.iter_mut().zip(PAGES) {
        let url = path.replace("{dl}", &dl.to_string());
        let before = seq_reads(&db).await?;
        let (mut console, base) = start_console(&env, &client).await?;
        load(&client, &format!("{base}{url}")).await?;
        console.process.stop(Duration::from_secs(10)).await?;
        // The console's sessions flush their counters as they end.
        tokio::time::sleep(Duration::from_millis(700)).await;
        let after = seq_reads(&db).await?;
        for (table, read) in &after {
            let was = before
                .iter()
                .find(|(t, _)| t == table)
                .map_or(0, |(_, n)| *n);
            if read - was > 0 {
                result.seq.push((table.clone(), read - was, rows_of(table)));
            }
        }
    }

    let mut lines = vec![
        format!(
            "# The console's pages with a large backlog\n\n`cargo bench --bench console -- \
             --dead-letters {} --held {} --retrying {} --loads {}` (commit {}; release build; \
             {} unresolved and {} resolved dead letters, {} held orders with {} parked versions, \
             {} retrying orders, {} applied orders with {} history rows and dedup ids, \
             {} sent effects and 550 not sent, {} audit rows)\n\n",
            options.dead_letters,
            options.held,
            options.retrying,
            options.loads,
            urutan_testkit::commit(),
            options.dead_letters,
            options.dead_letters * 2,
            options.held,
            options.held * 2,
            options.retrying,
            options.orders,
            options.orders * 3,
            options.orders * 3,
            options.held,
        ),
        row(&[
            &"page",
            &"status",
            &"p50 ms",
            &"p99 ms",
            &"max ms",
            &"tables read sequentially (rows read of rows)",
        ]),
        row(&[&"---", &"---", &"---", &"---", &"---", &"---"]),
    ];
    let mut failures = Vec::new();
    for r in &results {
        let seq = if r.seq.is_empty() {
            "none".to_owned()
        } else {
            r.seq
                .iter()
                .map(|(t, n, of)| {
                    let history = if keeps_history(t) { ", HISTORY" } else { "" };
                    format!("{t} ({n} of {of}{history})")
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        println!(
            "{:<26} {} p50 {:7.1} ms  p99 {:7.1} ms  max {:7.1} ms  seq: {seq}",
            r.name, r.status, r.p50, r.p99, r.max
        );
        lines.push(row(&[
            &r.name,
            &r.status,
            &format!("{:.1}", r.p50),
            &format!("{:.1}", r.p99),
            &format!("{:.1}", r.max),
            &seq,
        ]));
        if r.status != 200 {
            failures.push(format!("{}: status {}", r.name, r.status));
        }
        if r.p99 > options.goal_ms as f64 {
            failures.push(format!("{}: p99 {:.1} ms", r.name, r.p99));
        }
        for (table, read, _) in r.seq.iter().filter(|(t, ..)| keeps_history(t)) {
            failures.push(format!(
                "{}: reads {table} sequentially ({read} rows)",
                r.name
            ));
        }
    }
    let verdict = if failures.is_empty() {
        format!(
            "Every page: status 200, p99 under {} ms, no table that keeps history read \
             sequentially.",
            options.goal_ms
        )
    } else {
        format!("Missed: {}.", failures.join("; "))
    };
    println!("{verdict}");
    lines.push(format!("\n{verdict}\n"));
    let path = "benches/results/console.md";
    std::fs::write(path, lines.concat())?;
    println!("wrote {path}");
    if !failures.is_empty() {
        bail!("{verdict}");
    }
    Ok(())
}
