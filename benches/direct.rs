//! What keeping order for direct producers costs, and what it buys.
//!
//! `cargo bench --bench direct [-- --orders 300 --shards 12 --rounds 3]`
//!
//! **Restarts the local RabbitMQ app** (`rabbitmqctl stop_app/start_app`) in
//! the broker scenarios: run it on a machine of your own.
//!
//! A producer publishes straight to the exchange (confirms, no outbox, no
//! relay), each order's versions in increasing `versi`, to an in-process
//! `urutan run` pool (strict mode). Four scenarios, each in a fresh vhost and
//! database, each `--rounds` times:
//!
//! - `pool restart`: v1..v4 with the pool up; the pool stops; v5 for every
//!   order (a backlog); the pool starts; v6, v7. The broker did not restart,
//!   the ring did not change.
//! - `broker restart` (issue 13's scenario): v1..v5 with the pool up; the
//!   pool stops; v6; the broker restarts; v7 (the producer is back first);
//!   the pool starts; v8.
//!
//! each with consecutive versions (1, 2, 3, ...) and with gaps (2, 4, 6,
//! ...: a producer that skips versions). Measured from the database itself
//! (triggers on `urutan_parkir` in the scenario database, nothing in the
//! product): messages parked, how long they waited (parked → released), and
//! versions skipped (published but never applied: applied out of order and
//! found stale). Results: `benches/results/direct.{md,json}`.

use urutan_testkit::bench_env as env;

use std::time::Duration;

use anyhow::{Context, ensure};
use clap::Parser;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use serde::Serialize;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use urutan::config::Settings;
use urutan::supervisor::Supervisor;

use env::{BenchEnv, admin};

#[derive(Parser, Debug, Clone)]
struct Options {
    #[arg(long, default_value_t = 300)]
    orders: usize,
    #[arg(long, default_value_t = 12)]
    shards: u16,
    /// Runs of each scenario.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Passed by `cargo bench`.
    #[arg(long, hide = true)]
    bench: bool,
}

/// One run of one scenario.
#[derive(Debug, Clone, Serialize)]
struct Run {
    scenario: String,
    versions_published: i64,
    parked: i64,
    wait_p50_ms: f64,
    wait_max_ms: f64,
    skipped: i64,
    orders_moved: i64,
}

const PARK_LOG: &str = "
CREATE TABLE bench_park_log (pesanan_id TEXT, versi BIGINT, message_id TEXT PRIMARY KEY,
                             parked_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
                             released_at TIMESTAMPTZ);
CREATE FUNCTION bench_parked() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO bench_park_log (pesanan_id, versi, message_id)
        VALUES (NEW.pesanan_id, NEW.versi, NEW.message_id) ON CONFLICT DO NOTHING;
        RETURN NEW;
    END IF;
    UPDATE bench_park_log SET released_at = clock_timestamp() WHERE message_id = OLD.message_id;
    RETURN OLD;
END $$;
CREATE TRIGGER bench_parked AFTER INSERT OR DELETE ON urutan_parkir
    FOR EACH ROW EXECUTE FUNCTION bench_parked();
";

struct Producer {
    _conn: Connection,
    channel: lapin::Channel,
}

impl Producer {
    async fn connect(env: &BenchEnv) -> anyhow::Result<Self> {
        let conn = Connection::connect(env.amqp_url().expose(), ConnectionProperties::default())
            .await
            .context("producer connects")?;
        let channel = conn.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(Self {
            _conn: conn,
            channel,
        })
    }

    /// Version `versi` of every order, confirmed.
    async fn round(&self, orders: usize, versi: i64) -> anyhow::Result<()> {
        let mut confirms = Vec::with_capacity(orders);
        for o in 0..orders {
            let id = format!("B-{o:04}");
            let body = serde_json::json!({"id": id, "status": "s", "versi": versi}).to_string();
            let mut headers = FieldTable::default();
            headers.insert(
                "x-pesanan-id".into(),
                AMQPValue::LongString(LongString::from(id.as_bytes())),
            );
            let props = BasicProperties::default()
                .with_message_id(format!("{id}-v{versi}").into())
                .with_delivery_mode(2)
                .with_headers(headers);
            confirms.push(
                self.channel
                    .basic_publish(
                        "pesanan".into(),
                        "pesanan.bench".into(),
                        BasicPublishOptions::default(),
                        body.as_bytes(),
                        props,
                    )
                    .await?,
            );
        }
        for c in confirms {
            let c = tokio::time::timeout(Duration::from_secs(30), c)
                .await
                .context("confirm timed out")??;
            ensure!(c.is_ack(), "the broker nacked a publish");
        }
        Ok(())
    }
}

struct Pool {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), urutan::supervisor::RunError>>,
}

impl Pool {
    async fn start(settings: &Settings) -> anyhow::Result<Self> {
        let supervisor = Supervisor::build(settings.clone()).await?;
        let stop = CancellationToken::new();
        let task = tokio::spawn(supervisor.run(stop.clone()));
        Ok(Self { stop, task })
    }

    async fn stop(self) -> anyhow::Result<()> {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(60), self.task)
            .await
            .context("pool stop")???;
        Ok(())
    }
}

async fn scalar(db: &PgPool, sql: &'static str) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(sql).fetch_one(db).await?)
}

/// Waits until every order is at `versi` (or the applied rows stop moving
/// for 10 s: versions skipped as stale never arrive) and nothing is parked.
async fn settle(db: &PgPool, orders: usize, versi: i64) -> anyhow::Result<()> {
    let (mut last, mut still) = (-1, std::time::Instant::now());
    loop {
        let done: i64 = sqlx::query_scalar("SELECT count(*) FROM pesanan WHERE versi = $1")
            .bind(versi)
            .fetch_one(db)
            .await?;
        let parked = scalar(db, "SELECT count(*) FROM urutan_parkir").await?;
        let applied = scalar(db, "SELECT count(*) FROM pesanan_riwayat").await?;
        if done == orders as i64 && parked == 0 {
            return Ok(());
        }
        if applied != last {
            (last, still) = (applied, std::time::Instant::now());
        } else if still.elapsed() > Duration::from_secs(10) && parked == 0 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn restart_broker() -> anyhow::Result<()> {
    admin("rabbitmqctl", &["-q", "stop_app"]).await?;
    admin("rabbitmqctl", &["-q", "start_app"]).await?;
    admin("rabbitmqctl", &["-q", "await_startup"]).await?;
    Ok(())
}

async fn scenario(o: &Options, broker_restart: bool, step: i64) -> anyhow::Result<Run> {
    let name = format!(
        "{}, {}",
        if broker_restart {
            "broker restart"
        } else {
            "pool restart"
        },
        if step == 1 {
            "consecutive versions"
        } else {
            "versions with gaps"
        }
    );
    let env = BenchEnv::bench("direct").await?;
    let db = env.pool(4).await?;
    sqlx::raw_sql(PARK_LOG).execute(&db).await?;
    let settings = Settings {
        amqp_url: env.amqp_url().into(),
        database_url: env.database_url(),
        shard_count: o.shards,
        metrics_addr: "127.0.0.1:0".parse()?,
        database_pool_size: Some(6),
        ..Settings::default()
    };

    let (before, last) = if broker_restart { (5, 8) } else { (4, 7) };
    let pool = Pool::start(&settings).await?;
    // The topology is declared once the ring is recorded.
    while scalar(&db, "SELECT count(*) FROM urutan_ring").await? == 0 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut producer = Producer::connect(&env).await?;
    for round in 1..=before {
        producer.round(o.orders, round * step).await?;
    }
    settle(&db, o.orders, before * step).await?;
    pool.stop().await?;
    producer.round(o.orders, (before + 1) * step).await?;
    if broker_restart {
        drop(producer);
        restart_broker().await?;
        producer = Producer::connect(&env).await?;
        producer.round(o.orders, (before + 2) * step).await?;
    }
    let pool = Pool::start(&settings).await?;
    for round in (if broker_restart {
        before + 3
    } else {
        before + 2
    })..=last
    {
        producer.round(o.orders, round * step).await?;
    }
    settle(&db, o.orders, last * step).await?;
    pool.stop().await?;

    let published = o.orders as i64 * last;
    let applied = scalar(&db, "SELECT count(*) FROM pesanan_riwayat").await?;
    let (parked, p50, max): (i64, Option<f64>, Option<f64>) = sqlx::query_as(
        "SELECT count(*),
                percentile_cont(0.5) WITHIN GROUP (ORDER BY w),
                max(w)
         FROM (SELECT extract(epoch FROM released_at - parked_at)::float8 * 1000 AS w
               FROM bench_park_log) l",
    )
    .fetch_one(&db)
    .await?;
    let moved = scalar(
        &db,
        "SELECT count(*) FROM (SELECT pesanan_id FROM pesanan_riwayat
                               GROUP BY pesanan_id HAVING count(DISTINCT shard) > 1) m",
    )
    .await?;
    Ok(Run {
        scenario: name,
        versions_published: published,
        parked,
        wait_p50_ms: p50.unwrap_or(0.0),
        wait_max_ms: max.unwrap_or(0.0),
        skipped: published - applied,
        orders_moved: moved,
    })
}

fn write(o: &Options, runs: &[Run]) -> anyhow::Result<()> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/results");
    std::fs::create_dir_all(&dir)?;
    let commit = urutan_testkit::commit();
    let json = serde_json::json!({"commit": commit, "orders": o.orders, "shards": o.shards,
                                  "runs": runs});
    std::fs::write(
        dir.join("direct.json"),
        serde_json::to_string_pretty(&json)?,
    )?;
    let mut md = format!(
        "# Direct producer: parks, waits, skipped versions\n\n`cargo bench --bench direct -- \
         --orders {} --shards {} --rounds {}` at {commit}, strict mode, {} orders.\n\n\
         | scenario | versions | parked | wait p50 ms | wait max ms | skipped | orders moved |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
        o.orders, o.shards, o.rounds, o.orders
    );
    for r in runs {
        md += &format!(
            "| {} | {} | {} | {:.0} | {:.0} | {} | {} |\n",
            r.scenario,
            r.versions_published,
            r.parked,
            r.wait_p50_ms,
            r.wait_max_ms,
            r.skipped,
            r.orders_moved
        );
    }
    std::fs::write(dir.join("direct.md"), md)?;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // `cargo test --all-targets` runs benches as tests (with test flags).
    if !std::env::args().any(|a| a == "--bench") {
        println!("direct bench: skipped (run `cargo bench --bench direct`)");
        return Ok(());
    }
    let o = Options::parse();
    let _ = env::sweep_stale().await;
    let mut runs = Vec::new();
    let result: anyhow::Result<()> = async {
        for _ in 0..o.rounds {
            for (broker_restart, step) in [(false, 1), (false, 2), (true, 1), (true, 2)] {
                let run = scenario(&o, broker_restart, step).await?;
                eprintln!("{run:?}");
                runs.push(run);
            }
        }
        Ok(())
    }
    .await;
    let _ = admin("rabbitmqctl", &["-q", "start_app"]).await;
    env::cleanup_all();
    result?;
    write(&o, &runs)
}
