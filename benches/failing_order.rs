//! One failing order must not stall its shard (issue 31, docs/handlers.md
//! "When it fails"): the rate at which every OTHER order on the same shard
//! completes, with one order whose handler keeps asking to retry, against
//! the same run where that order's handler succeeds.
//!
//! ```sh
//! cargo bench --bench failing_order -- --orders 200 --versions 20 --rounds 3 --prefetch 1
//! ```
//!
//! Each run: a fresh vhost and database, one shard, a `HANDLER_FUNCTION`
//! that writes a side row per version (and, in the `failing` variant, raises
//! SQLSTATE URTRY for order `F` until the end); every version of every order
//! is queued first (F's versions interleaved with the others'), then the
//! in-process pool starts and the clock runs until every other order's
//! versions are applied. Rounds alternate healthy / failing; the report is
//! each round's ratio (failing rate ÷ healthy rate) and their median.
//! Results: `benches/results/failing-order-p<PREFETCH>.md`.

use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use clap::Parser;
use urutan_testkit::fixtures::{Msg, RunningPool, TestEnv, count};
use urutan_testkit::markdown::row;

#[derive(Parser, Debug, Clone)]
struct Options {
    /// Orders besides the failing one.
    #[arg(long, default_value_t = 200)]
    orders: usize,
    /// Versions per order.
    #[arg(long, default_value_t = 20)]
    versions: i64,
    /// Rounds (each a healthy and a failing run).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// PREFETCH of the worker (1: strict mode).
    #[arg(long, default_value_t = 1)]
    prefetch: u16,
    /// Passed by `cargo bench`.
    #[arg(long, hide = true)]
    bench: bool,
}

const HANDLER: &str = "
CREATE TABLE gagal (pesanan_id TEXT PRIMARY KEY);
CREATE TABLE langkah (pesanan_id TEXT, versi BIGINT);
CREATE FUNCTION tangani(event jsonb) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM gagal WHERE pesanan_id = event->>'id') THEN
        RAISE EXCEPTION 'not yet' USING ERRCODE = 'URTRY';
    END IF;
    INSERT INTO langkah VALUES (event->>'id', (event->>'versi')::bigint);
END
$$;";

/// One run: messages per second at which the other orders completed.
async fn run(options: &Options, failing: bool) -> anyhow::Result<f64> {
    let env = TestEnv::bench(if failing { "failing" } else { "healthy" }).await?;
    let db = env.pool(4).await?;
    sqlx::raw_sql(HANDLER).execute(&db).await?;
    if failing {
        sqlx::query("INSERT INTO gagal VALUES ('F')")
            .execute(&db)
            .await?;
    }
    let mut settings = env.settings(1);
    settings.prefetch = options.prefetch;
    settings.handler_function = Some("tangani".into());
    let others: Vec<String> = (0..options.orders).map(|i| format!("O-{i}")).collect();
    let mut msgs = Vec::new();
    for v in 1..=options.versions {
        for (i, order) in others.iter().enumerate() {
            if i == others.len() / 2 {
                msgs.push(Msg::event("F", v));
            }
            msgs.push(Msg::event(order, v));
        }
    }
    let conn = urutan::broker::connect(&settings.amqp_url, "bench").await?;
    let names = urutan::broker::Names::new("pesanan");
    urutan::broker::topology::declare(&conn, &names, 1, 5, false).await?;
    env.publisher().await.send_all(&msgs).await;
    let expected = (options.orders as i64) * options.versions;
    let started = Instant::now();
    let pool = RunningPool::start(settings).await;
    let limit = Duration::from_secs(600);
    loop {
        let done = count(
            &db,
            "SELECT count(*) FROM pesanan_riwayat WHERE pesanan_id LIKE 'O-%'",
        )
        .await;
        if done >= expected {
            break;
        }
        ensure!(
            started.elapsed() < limit,
            "{done} of {expected} after {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = started.elapsed().as_secs_f64();
    let f_applied = count(
        &db,
        "SELECT count(*) FROM pesanan_riwayat WHERE pesanan_id = 'F'",
    )
    .await;
    pool.stop().await;
    if failing {
        ensure!(
            f_applied == 0,
            "the failing order applied {f_applied} versions"
        );
    }
    Ok(expected as f64 / took)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    // `cargo test --all-targets` runs benches as tests (without `--bench`).
    if !args.iter().any(|a| a == "--bench") {
        println!("failing_order bench: skipped (run `cargo bench --bench failing_order`)");
        return Ok(());
    }
    let options = Options::parse();
    let mut lines = vec![
        format!(
            "# One failing order on a shard: the other orders' rate\n\n`cargo bench --bench \
             failing_order -- --orders {} --versions {} --rounds {} --prefetch {}` (commit {}, \
             one shard, handler in the transaction; the failing order's handler asks to retry \
             throughout)\n\n",
            options.orders,
            options.versions,
            options.rounds,
            options.prefetch,
            urutan_testkit::commit()
        ),
        row(&[&"round", &"healthy msg/s", &"failing msg/s", &"ratio"]),
        row(&[&"---", &"---", &"---", &"---"]),
    ];
    let mut ratios = Vec::new();
    for round in 1..=options.rounds {
        let healthy = run(&options, false).await.context("healthy run")?;
        let failing = run(&options, true).await.context("failing run")?;
        let ratio = failing / healthy;
        println!(
            "round {round}: healthy {healthy:.0} msg/s, failing {failing:.0} msg/s, ratio {ratio:.3}"
        );
        lines.push(row(&[
            &round,
            &format!("{healthy:.0}"),
            &format!("{failing:.0}"),
            &format!("{ratio:.3}"),
        ]));
        ratios.push(ratio);
    }
    ratios.sort_by(f64::total_cmp);
    let median = ratios[ratios.len() / 2];
    println!("median ratio {median:.3} (goal >= 0.9)");
    lines.push(format!("\nMedian ratio: **{median:.3}** (goal ≥ 0.9).\n"));
    let path = format!("benches/results/failing-order-p{}.md", options.prefetch);
    std::fs::write(&path, lines.concat())?;
    println!("wrote {path}");
    Ok(())
}
