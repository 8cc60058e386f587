//! `urutan demo`: the whole pipeline on the local services. Orders move
//! through their statuses via the transactional outbox; the relay publishes
//! them; the worker pool applies them; duplicates, stale events and poison
//! messages are injected straight into the exchange; a live progress bar
//! shows the outcomes; a report and `verify` close it.
//!
//! The demo owns a throwaway topology (`<prefix>-demo`) and database
//! (`<database>_demo`), both reset at start, so it never touches real data.
//!
//! Its screen is for the person watching: the progress bar and the report.
//! Log lines go to a file (`--log-file`); only errors also show, above the
//! bar. Expected noise stays off the screen (the poison messages' dead-letter
//! warnings, the verification's long queries).
//!
//! A part of the binary, not of the library: it only drives the library's
//! public parts, as a team embedding urutan would.

mod effects;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel};
use rand::seq::IndexedRandom;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use urutan::broker::{self, Names, call, topology};
use urutan::config::Settings;
use urutan::outbox::relay::{Relay, RelaySettings};
use urutan::outbox::{self, NewEvent, SentRow};
use urutan::outcome::Outcome;
use urutan::reshard::ring;
use urutan::shard::{Hooks, Observed};
use urutan::store;
use urutan::supervisor::Supervisor;
use urutan_ops::verify;

/// `urutan demo --help`: what the screen shows, examples.
pub const HELP: &str = "\
The screen shows a progress bar and, at the end, the report and the invariant
check; log lines go to the log file (errors also show, above the bar). Exit 0
when the pipeline drained and everything verified.

Examples:
  urutan demo
  urutan demo --orders 10000 --rate 2000 --duration 30s
  SHARD_COUNT=8 PREFETCH=50 urutan demo --log-file demo.log";

/// The demo's knobs.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoOptions {
    /// Orders to create; each moves through 2-5 statuses.
    #[arg(long, default_value_t = 2_000)]
    pub orders: usize,
    /// Cap on events written to the outbox per second (0: as fast as possible).
    #[arg(long, default_value_t = 0)]
    pub rate: u32,
    /// Stop writing new events after this long (orders keep their last status).
    #[arg(long, value_parser = urutan::config::parse_duration)]
    pub duration: Option<Duration>,
    /// Copies of already-published messages to inject (same message id).
    #[arg(long, default_value_t = 100)]
    pub duplicates: usize,
    /// Old versions to inject under new message ids.
    #[arg(long, default_value_t = 100)]
    pub stale: usize,
    /// Malformed messages to inject (they must end in the dead-letter queue).
    #[arg(long, default_value_t = 6)]
    pub poison: usize,
    /// Give up waiting for the pipeline to drain after this long.
    #[arg(long, default_value = "5m", value_parser = urutan::config::parse_duration)]
    pub timeout: Duration,
    /// Where the log lines go (errors also show on screen); default
    /// `urutan-demo-<database>.log` in the temporary directory.
    #[arg(long)]
    pub log_file: Option<std::path::PathBuf>,
}

/// Status paths an order can take.
const PATHS: &[(&[&str], u32)] = &[
    (
        &["dibuat", "menunggu_bayar", "dibayar", "dikirim", "selesai"],
        75,
    ),
    (&["dibuat", "menunggu_bayar", "dibayar", "dibatalkan"], 10),
    (&["dibuat", "menunggu_bayar", "dibatalkan"], 10),
    (&["dibuat", "dibatalkan"], 5),
];
const CITIES: &[&str] = &[
    "jakarta", "bandung", "surabaya", "medan", "makassar", "denpasar",
];

/// Live counters fed by the worker pool's outcome hook.
#[derive(Default)]
struct Stats {
    applied: AtomicU64,
    stale: AtomicU64,
    duplicate: AtomicU64,
    dead: AtomicU64,
    per_shard: Mutex<HashMap<u16, u64>>,
    /// Outbox id → when it was written, and the measured publish-to-commit latencies.
    written: Mutex<HashMap<String, Instant>>,
    latencies: Mutex<Vec<Duration>>,
    dead_letters: Mutex<Vec<(String, &'static str)>>,
    /// Deliveries to expect: events committed to the outbox plus injected
    /// messages, growing while they are written.
    expected: AtomicU64,
    /// Everything is written: `expected` is final.
    written_all: std::sync::atomic::AtomicBool,
}

impl Stats {
    fn observe(&self, o: &Observed<'_>) {
        let counter = match o.outcome {
            Outcome::Applied => &self.applied,
            Outcome::Stale => &self.stale,
            Outcome::Duplicate => &self.duplicate,
            Outcome::DeadLettered(rejection) => {
                let id = o.message_id.unwrap_or("(no message id)").to_owned();
                lock(&self.dead_letters).push((id, rejection.reason()));
                &self.dead
            }
        };
        counter.fetch_add(1, Ordering::Relaxed);
        *lock(&self.per_shard).entry(o.shard).or_default() += 1;
        if matches!(o.outcome, Outcome::Applied | Outcome::Stale)
            && let Some(at) = o.message_id.and_then(|id| lock(&self.written).remove(id))
        {
            lock(&self.latencies).push(at.elapsed());
        }
    }

    fn total(&self) -> u64 {
        [&self.applied, &self.stale, &self.duplicate, &self.dead]
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }

    /// [`Self::line`] to fit beside the progress bar.
    fn short_line(&self) -> String {
        format!(
            "applied {} · stale {} · dup {} · dead {}",
            self.applied.load(Ordering::Relaxed),
            self.stale.load(Ordering::Relaxed),
            self.duplicate.load(Ordering::Relaxed),
            self.dead.load(Ordering::Relaxed)
        )
    }

    fn line(&self) -> String {
        format!(
            "applied {} · stale {} · duplicate {} · dead-lettered {}",
            self.applied.load(Ordering::Relaxed),
            self.stale.load(Ordering::Relaxed),
            self.duplicate.load(Ordering::Relaxed),
            self.dead.load(Ordering::Relaxed)
        )
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs the demo; `Ok(true)` if the pipeline drained and verification passed.
pub async fn run(settings: Settings, options: DemoOptions) -> anyhow::Result<bool> {
    use anyhow::Context;
    let (settings, demo_db) = apart(settings);
    let names = settings.names();

    println!(
        "urutan demo: {} shards, prefetch {}, topology `{}`, database `{demo_db}`",
        settings.shard_count, settings.prefetch, settings.topology_prefix
    );
    let log_path = options
        .log_file
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("urutan-demo-{demo_db}.log")));
    let log_file = std::fs::File::create(&log_path)
        .with_context(|| format!("cannot write the log file {}", log_path.display()))?;
    let _logs = urutan::telemetry::divert(log_file, tracing::Level::ERROR);
    println!("logs: {} (errors also show here)", log_path.display());
    reset(&settings, &names, &demo_db)
        .await
        .context("resetting the demo topology and database")?;
    // The demo's database is its own: created here, explicitly (nothing
    // else but `urutan migrate --create-database` creates one).
    store::ensure_database(&settings.database_url)
        .await
        .context("creating the demo database")?;
    let db = store::prepare(&settings.database_url, 4)
        .await
        .context("preparing the demo database")?;

    let stats = Arc::new(Stats::default());
    let pipeline = Pipeline::start(&settings, &db, &stats).await?;

    // Downstream effects (demo/effects.rs): `dibayar` → a local payment endpoint.
    let effects = effects::DemoEffects::start(&db).await?;

    let started = Instant::now();
    // The bar shows from the start; aborted if writing fails.
    let bar = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(watch(
        stats.clone(),
        options.timeout,
    )));
    let events = generate(&db, &stats, &options, &names).await?;
    let injected = inject(&settings, &names, &db, &options).await?;
    stats
        .expected
        .fetch_add(injected.total(), Ordering::Relaxed);
    stats.written_all.store(true, Ordering::Relaxed);
    let drained = bar.await.unwrap_or(false);
    let elapsed = started.elapsed();
    let effects = effects.finish(&db, options.timeout).await?;

    pipeline.stop().await;

    let dlq = dead_letter_depth(&settings, &names).await.ok();
    let verifier = verification_pool(&settings).await?;
    let report = verify::verify(&verifier, dlq).await?;
    verifier.close().await;
    print_report(&stats, events, &injected, elapsed, &settings);
    println!("{report}");
    println!("{effects}");
    let dlq_ok = dlq == Some(injected.poison as u32);
    if !dlq_ok {
        println!(
            "dead-letter queue: expected exactly {} poison message(s), found {dlq:?}",
            injected.poison
        );
    }
    if !drained {
        println!("the pipeline did not drain within {:?}", options.timeout);
    }
    let passed = drained && dlq_ok && report.passed();
    if !passed {
        println!("the log lines are in {}", log_path.display());
    }
    db.close().await;
    Ok(passed && effects.passed())
}

/// The demo's own topology (`<prefix>-demo`) and database (`<name>_demo`),
/// so that it never touches the real ones; returns the settings and the
/// database's name.
fn apart(mut settings: Settings) -> (Settings, String) {
    settings.topology_prefix = format!("{}-demo", settings.topology_prefix);
    let db_name = settings
        .database_url
        .parsed()
        .path()
        .trim_start_matches('/')
        .to_owned();
    let demo_db = format!(
        "{}_demo",
        if db_name.is_empty() {
            "urutan"
        } else {
            &db_name
        }
    );
    settings.database_url = settings.database_url.with(|u| u.set_path(&demo_db));
    (settings, demo_db)
}

/// The pool (counting each outcome into the demo's stats) and the relay,
/// running until [`Pipeline::stop`].
struct Pipeline {
    shutdown: CancellationToken,
    pool: tokio::task::JoinHandle<Result<(), urutan::supervisor::RunError>>,
    relay: tokio::task::JoinHandle<()>,
}

impl Pipeline {
    async fn start(settings: &Settings, db: &PgPool, stats: &Arc<Stats>) -> anyhow::Result<Self> {
        let observer = stats.clone();
        let hooks = Hooks {
            on_outcome: Some(Arc::new(move |o: &Observed<'_>| observer.observe(o))),
            ..Hooks::default()
        };
        let shutdown = CancellationToken::new();
        let supervisor = Supervisor::build_with_hooks(settings.clone(), hooks).await?;
        println!("metrics on http://{}/metrics", supervisor.http_addr());
        let pool = tokio::spawn(supervisor.run(shutdown.clone()));
        // The relay publishes into the topology the pool declares.
        topology_prepared(db, Duration::from_secs(60)).await;
        let relay = Relay {
            settings: settings.clone(),
            relay: RelaySettings::default(),
            after_publish: None,
            health: Default::default(),
        };
        let relay = tokio::spawn(relay.run(shutdown.clone()));
        Ok(Self {
            shutdown,
            pool,
            relay,
        })
    }

    /// Stops both, waiting at most 30 s for each.
    async fn stop(self) {
        self.shutdown.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(30), self.pool).await;
        let _ = tokio::time::timeout(Duration::from_secs(30), self.relay).await;
    }
}

/// Waits (at most `limit`) until the pool recorded the ring: the topology
/// is declared and the relay can publish into it.
async fn topology_prepared(db: &PgPool, limit: Duration) {
    let started = Instant::now();
    while started.elapsed() < limit {
        if matches!(ring::recorded(db).await, Ok(true)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The pool `verify` runs on. Its queries read whole tables and may take
/// seconds on a big demo: expected, so sqlx's slow-statement warning is
/// lowered to debug, and the tables, filled just now, are analyzed first
/// (without statistics PostgreSQL may pick a nested scan per order).
async fn verification_pool(settings: &Settings) -> anyhow::Result<PgPool> {
    use sqlx::ConnectOptions;
    let options: sqlx::postgres::PgConnectOptions = settings.database_url.expose().parse()?;
    let options = options
        .application_name("urutan demo verify")
        .log_slow_statements(log::LevelFilter::Debug, Duration::from_secs(1));
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await?;
    sqlx::query("ANALYZE").execute(&pool).await?;
    Ok(pool)
}

/// Drops the demo database and topology so every run starts empty.
async fn reset(settings: &Settings, names: &Names, demo_db: &str) -> anyhow::Result<()> {
    use sqlx::ConnectOptions;
    use sqlx::Connection;
    let admin_url = settings.database_url.with(|u| u.set_path("/postgres"));
    let admin: sqlx::postgres::PgConnectOptions = admin_url.expose().parse()?;
    // Dropping a database takes a while: no slow-statement warning for it.
    let mut admin = admin
        .log_slow_statements(log::LevelFilter::Debug, Duration::from_secs(1))
        .connect()
        .await?;
    let drop = format!("DROP DATABASE IF EXISTS \"{demo_db}\" WITH (FORCE)");
    sqlx::query(sqlx::AssertSqlSafe(drop))
        .execute(&mut admin)
        .await?;
    admin.close().await?;
    let conn = broker::connect(&settings.broker(), "urutan demo").await?;
    topology::delete_all(&conn, names).await?;
    let _ = urutan::broker::call("connection.close", conn.close(200, "reset".into())).await;
    Ok(())
}

/// Writes the orders' events through the outbox, interleaved, each producer
/// transaction holding a few events. Returns how many were written.
async fn generate(
    db: &PgPool,
    stats: &Stats,
    options: &DemoOptions,
    names: &Names,
) -> anyhow::Result<u64> {
    let weights: u32 = PATHS.iter().map(|p| p.1).sum();
    let mut orders: Vec<(String, &[&str], usize, &str)> = (0..options.orders)
        .map(|i| {
            let mut pick = rand::random_range(0..weights);
            let path = PATHS
                .iter()
                .find(|(_, w)| {
                    let hit = pick < *w;
                    pick = pick.saturating_sub(*w);
                    hit
                })
                .map_or(PATHS[0].0, |p| p.0);
            let city = CITIES
                .choose(&mut rand::rng())
                .copied()
                .unwrap_or("jakarta");
            (format!("PSN-{i:06}"), path, 0, city)
        })
        .collect();
    let started = Instant::now();
    let mut written = 0u64;
    while !orders.is_empty() {
        if options.duration.is_some_and(|d| started.elapsed() > d) {
            break;
        }
        let mut tx = db.begin().await?;
        let mut in_tx = 0u64;
        for _ in 0..20 {
            if orders.is_empty() {
                break;
            }
            let i = rand::random_range(0..orders.len());
            let (id, path, step, city) = &mut orders[i];
            let status = path[*step];
            let data =
                serde_json::json!({"kota": city, "total": rand::random_range(10_000..5_000_000)});
            let routing_key = format!("{}.{city}.{status}", names.entry_exchange());
            let outbox_id = outbox::enqueue(
                &mut tx,
                &NewEvent::new(id, status, *step as i64 + 1, &routing_key).with_data(&data),
            )
            .await?;
            lock(&stats.written).insert(outbox_id.to_string(), Instant::now());
            in_tx += 1;
            *step += 1;
            if *step == path.len() {
                orders.swap_remove(i);
            }
        }
        tx.commit().await?;
        written += in_tx;
        stats.expected.fetch_add(in_tx, Ordering::Relaxed);
        if options.rate > 0 {
            let due = Duration::from_secs_f64(written as f64 / f64::from(options.rate));
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                tokio::time::sleep(wait).await;
            }
        }
    }
    Ok(written)
}

/// What the injector put straight into the exchange.
struct Injected {
    duplicates: usize,
    stale: usize,
    poison: usize,
}

impl Injected {
    fn total(&self) -> u64 {
        (self.duplicates + self.stale + self.poison) as u64
    }
}

/// Publishes duplicates of sent rows, stale versions and poison messages.
/// Duplicates and stale copies are taken from rows the relay has already
/// confirmed, so the original is ahead of the copy in its shard queue.
async fn inject(
    settings: &Settings,
    names: &Names,
    db: &PgPool,
    options: &DemoOptions,
) -> anyhow::Result<Injected> {
    let dup_rows = sent_rows(db, options.duplicates, 1).await?;
    let stale_rows = sent_rows(db, options.stale, 2).await?;
    let conn = broker::connect(&settings.broker(), "urutan demo injector").await?;
    let ch = call("channel.open", conn.create_channel()).await?;
    call(
        "confirm.select",
        ch.confirm_select(ConfirmSelectOptions::default()),
    )
    .await?;
    let exchange = names.entry_exchange();
    let key = format!("{}.injected", names.entry_exchange());
    let mut duplicates = 0;
    for row in &dup_rows {
        send(
            &ch,
            &exchange,
            &key,
            Some(&row.id.to_string()),
            Some(text(&row.aggregate_id)),
            row.payload.as_bytes(),
        )
        .await?;
        duplicates += 1;
    }
    let mut stale = 0;
    for (n, row) in stale_rows.iter().enumerate() {
        let entity = &row.aggregate_id;
        let body = serde_json::json!({"id": entity, "status": "basi", "versi": row.versi - 1});
        let id = format!("stale-{n}");
        send(
            &ch,
            &exchange,
            &key,
            Some(&id),
            Some(text(entity)),
            body.to_string().as_bytes(),
        )
        .await?;
        stale += 1;
    }
    for n in 0..options.poison {
        let (id, header, body) = poison(n);
        send(&ch, &exchange, &key, id.as_deref(), Some(header), body).await?;
    }
    let _ = urutan::broker::call("connection.close", conn.close(200, "injected".into())).await;
    Ok(Injected {
        duplicates,
        stale,
        poison: options.poison,
    })
}

/// The `n`th poison message (its message id, entity header and body): in
/// turn a body that is not JSON, an entity header that is not a string, a
/// body `id` other than the header's, and no message id.
fn poison(n: usize) -> (Option<String>, AMQPValue, &'static [u8]) {
    let id = Some(format!("poison-{n}"));
    let good: &[u8] = br#"{"id":"PSN-X","status":"dibuat","versi":1}"#;
    match n % 4 {
        0 => (id, text("PSN-X"), b"{not json"),
        1 => (id, AMQPValue::LongLongInt(42), good),
        2 => (id, text("PSN-Y"), good),
        _ => (None, text("PSN-X"), good),
    }
}

/// Up to `n` random outbox rows the relay has confirmed, with `versi >=
/// min_versi` (waiting up to a minute for enough of them to be sent).
async fn sent_rows(db: &PgPool, n: usize, min_versi: i64) -> anyhow::Result<Vec<SentRow>> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let rows = outbox::sample_sent(db, n, min_versi).await?;
        if rows.len() >= n || Instant::now() > deadline {
            return Ok(rows);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn text(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s.as_bytes()))
}

async fn send(
    ch: &Channel,
    exchange: &str,
    key: &str,
    message_id: Option<&str>,
    entity: Option<AMQPValue>,
    body: &[u8],
) -> anyhow::Result<()> {
    let mut props = BasicProperties::default().with_delivery_mode(2);
    if let Some(id) = message_id {
        props = props.with_message_id(id.into());
    }
    if let Some(entity) = entity {
        let mut headers = FieldTable::default();
        headers.insert(broker::delivery::ENTITY_HEADER.into(), entity);
        props = props.with_headers(headers);
    }
    let confirm = call(
        "basic.publish",
        ch.basic_publish(
            exchange.into(),
            key.into(),
            BasicPublishOptions::default(),
            body,
            props,
        ),
    )
    .await?;
    anyhow::ensure!(
        call("confirm", confirm).await?.is_ack(),
        "the broker refused an injected message"
    );
    Ok(())
}

/// Shows the progress bar (log lines above it) until every expected
/// outcome was seen (true), or `timeout` after everything was written.
async fn watch(stats: Arc<Stats>, timeout: Duration) -> bool {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:20}] {pos}/{len} {wide_msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let _above = urutan::telemetry::print_above({
        let bar = bar.clone();
        move |write: &mut dyn FnMut()| bar.suspend(write)
    });
    let mut written_at = None;
    loop {
        let written_all = stats.written_all.load(Ordering::Relaxed);
        let expected = stats.expected.load(Ordering::Relaxed);
        let done = stats.total();
        bar.set_length(expected);
        bar.set_position(done);
        let writing = if written_all { "" } else { "writing · " };
        bar.set_message(format!("{writing}{}", stats.short_line()));
        if written_all && done >= expected {
            bar.finish();
            return true;
        }
        if written_all && written_at.is_none() {
            written_at = Some(Instant::now());
        }
        if written_at.is_some_and(|at: Instant| at.elapsed() > timeout) {
            bar.abandon();
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn dead_letter_depth(settings: &Settings, names: &Names) -> anyhow::Result<u32> {
    use lapin::options::QueueDeclareOptions;
    let conn = broker::connect(&settings.broker(), "urutan demo report").await?;
    let ch = call("channel.open", conn.create_channel()).await?;
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let q = call(
        "queue.declare",
        ch.queue_declare(
            names.dead_letter_queue().as_str().into(),
            passive,
            FieldTable::default(),
        ),
    )
    .await?;
    let _ = urutan::broker::call("connection.close", conn.close(200, "report".into())).await;
    Ok(q.message_count())
}

fn print_report(
    stats: &Stats,
    events: u64,
    injected: &Injected,
    elapsed: Duration,
    settings: &Settings,
) {
    let total = stats.total();
    println!("\n\n== urutan demo report ==");
    println!(
        "written through the outbox: {events} events; injected: {} duplicates, {} stale, {} poison",
        injected.duplicates, injected.stale, injected.poison
    );
    println!("outcomes: {}", stats.line());
    println!(
        "throughput: {total} deliveries in {:.1} s = {:.0} msg/s (SHARD_COUNT={}, PREFETCH={})",
        elapsed.as_secs_f64(),
        total as f64 / elapsed.as_secs_f64().max(1e-9),
        settings.shard_count,
        settings.prefetch
    );
    let per_shard = lock(&stats.per_shard);
    let mut shards: Vec<_> = per_shard.iter().collect();
    shards.sort();
    let line: Vec<String> = shards.iter().map(|(s, n)| format!("{s:03}: {n}")).collect();
    println!("per shard: {}", line.join(", "));
    let mut lat = lock(&stats.latencies).clone();
    lat.sort();
    if !lat.is_empty() {
        let pct = |p: f64| lat[((lat.len() - 1) as f64 * p) as usize].as_secs_f64() * 1000.0;
        println!(
            "outbox write → commit latency: p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            pct(0.5),
            pct(0.9),
            pct(0.99),
            pct(1.0)
        );
    }
    let dead = lock(&stats.dead_letters);
    println!("dead-lettered ({}):", dead.len());
    for (id, reason) in dead.iter() {
        println!("  {}: {reason}", urutan_ops::terminal::Clean(id));
    }
}
