//! Replicas sharing the shards (issue 45, docs/contract.md section 13),
//! measured with `urutan run` processes against the broker and database
//! under test (`URUTAN_TEST_AMQP_BASE` and `URUTAN_TEST_RABBITMQCTL` aim it
//! at another broker, e.g. a deploy/brokers node).
//!
//! ```sh
//! cargo bench --bench replicas -- --soak --events 100      # benches/results/replicas-soak-<broker>.md
//! cargo bench --bench replicas -- --drain --messages 20000 # benches/results/replicas-cpu-drain.md
//! ```
//!
//! `--soak`: a steady stream (every 300 ms the next version of each of 48
//! orders, 12 shards) while replicas join (a new process), leave (SIGTERM,
//! which must exit 0) and die (SIGKILL) at random, 1 to 4 live, one event
//! at a time: after each, the bench waits (at most 60 s) until every shard
//! is applied by the replica the placement gives it. Each replica's
//! database connections carry its name (a setting, `urutan_soak.replika`,
//! in the URL's `options`), and a
//! `HANDLER_FUNCTION` records who applied what, so the bench knows which
//! replica applied each version. Per event kind: how long until every
//! moved shard was applied by its new owner (for a join: the new replica
//! took its share), and the longest pause of a moved shard and of an
//! unmoved one. At the end every version must have been applied once, in
//! order (the order violations are counted, not asserted, so the report
//! says how many), nothing dead-lettered, and `urutan verify` clean.
//!
//! `--drain`: a Rust handler that spends about `--cpu-us` (200) µs of CPU
//! per event (a calibrated loop, in each replica process: this bench
//! binary run as `urutan run` with the handler), a backlog drained by 1
//! replica pinned to core 0 (`taskset -c 0`), then by 2 pinned to cores 0
//! and 1, each on a fresh vhost and database; the rate from the first to
//! the last apply, and each replica process's CPU per message
//! (/proc/PID/stat). The machine's load (/proc/loadavg) is written beside
//! every figure.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use chrono::{DateTime, Utc};
use clap::Parser;
use sqlx::PgPool;
use urutan::handler::{Handler, HandlerError, HandlerEvent};
use urutan_testkit::fixtures::{Msg, Stream, TestEnv};
use urutan_testkit::markdown::row;
use urutan_testkit::process::Urutan;

#[derive(Parser, Debug, Clone)]
struct Options {
    /// The soak: random joins, leaves and kills under a steady stream.
    #[arg(long)]
    soak: bool,
    /// Joins, leaves and kills in the soak.
    #[arg(long, default_value_t = 100)]
    events: usize,
    /// The drain of a CPU-bound Rust handler by 1 and 2 pinned replicas.
    #[arg(long)]
    drain: bool,
    /// Messages of the drain's backlog.
    #[arg(long, default_value_t = 20_000)]
    messages: usize,
    /// CPU the drain's handler spends per event, in µs.
    #[arg(long, default_value_t = 200)]
    cpu_us: u64,
    /// PREFETCH of the drain's replicas.
    #[arg(long, default_value_t = 32)]
    prefetch: u16,
    /// Rounds of the drain (each: 1 replica, then 2).
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Where the results go.
    #[arg(long, default_value = "benches/results")]
    out: String,
    /// Passed by `cargo bench`.
    #[arg(long, hide = true)]
    bench: bool,
}

const SHARDS: u16 = 12;
/// The soak's stream: orders, and how often each gets its next version.
const ORDERS: usize = 48;
const EVERY: Duration = Duration::from_millis(300);
/// Most time one soak event may take to settle.
const SETTLE_LIMIT: Duration = Duration::from_secs(60);
/// Set on a replica process of the drain: this binary runs `urutan run`
/// with the spinning handler, spending this many µs per event.
const SPIN_VAR: &str = "URUTAN_BENCH_SPIN_US";

fn main() -> ExitCode {
    if let Ok(us) = std::env::var(SPIN_VAR) {
        let us: u64 = us.parse().unwrap_or(200);
        return urutan_cli::main_with(Spin::calibrated(us));
    }
    let args: Vec<String> = std::env::args().collect();
    // `cargo test --all-targets` runs benches as tests (without `--bench`).
    if !args.iter().any(|a| a == "--bench") {
        println!("replicas bench: skipped (run `cargo bench --bench replicas -- --soak|--drain`)");
        return ExitCode::SUCCESS;
    }
    let options = Options::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("replicas bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        ensure!(
            options.soak || options.drain,
            "say --soak or --drain (or both)"
        );
        if options.soak {
            soak(&options).await?;
        }
        if options.drain {
            drain(&options).await?;
        }
        Ok(())
    });
    urutan_testkit::process::kill_alive();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("replicas bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// A handler that spends about `us` µs of CPU per event: a loop of
/// arithmetic whose length was measured once, at its fastest of 50 tries
/// (the least disturbed by other processes on a shared machine).
struct Spin {
    rounds: u64,
}

impl Spin {
    fn calibrated(us: u64) -> Self {
        const PROBE: u64 = 200_000;
        let best = (0..50)
            .map(|_| {
                let start = Instant::now();
                std::hint::black_box(spin(PROBE));
                start.elapsed()
            })
            .min()
            .unwrap_or(Duration::from_micros(1));
        let per_us = PROBE as f64 / best.as_secs_f64().max(1e-9) / 1e6;
        Self {
            rounds: (per_us * us as f64) as u64,
        }
    }
}

fn spin(rounds: u64) -> u64 {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in 0..rounds {
        x = std::hint::black_box(x.rotate_left(7) ^ i).wrapping_mul(0x100_0000_01B3);
    }
    x
}

impl Handler for Spin {
    async fn handle(
        &self,
        _tx: &mut sqlx::PgConnection,
        _event: &HandlerEvent,
    ) -> Result<(), HandlerError> {
        std::hint::black_box(spin(self.rounds));
        Ok(())
    }
}

/// The machine's load averages, as `uptime` shows them.
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// The broker's version, for the results' name (`rabbitmqctl`, aimed at
/// the broker under test).
async fn broker_version() -> String {
    let out = urutan_testkit::fixtures::ctl(
        ["-q", "eval", "rabbit_misc:version()."]
            .map(str::to_owned)
            .to_vec(),
    )
    .await;
    out.trim().trim_matches('"').to_owned()
}

/// The database's clock.
async fn db_now(db: &PgPool) -> anyhow::Result<DateTime<Utc>> {
    Ok(sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(db)
        .await?)
}

/// Records who applied what: the applying connection's setting
/// `urutan_soak.replika` is its replica's name.
const RECORDER: &str = "
CREATE TABLE soak_terap (seq BIGSERIAL PRIMARY KEY, shard INT NOT NULL, replika TEXT NOT NULL,
                         pada TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp());
CREATE INDEX ON soak_terap (shard, pada);
CREATE FUNCTION soak_catat(event jsonb) RETURNS void LANGUAGE sql AS $$
    INSERT INTO soak_terap (shard, replika)
    VALUES ((event->>'shard')::int, current_setting('urutan_soak.replika'))
$$;";

/// One soak replica: `urutan run` named `name`, its connections named so.
fn start_replica(env: &TestEnv, name: &str, log_dir: &Path) -> anyhow::Result<Urutan> {
    let mut vars: Vec<(&str, String)> = env.process_env(SHARDS);
    for (k, v) in &mut vars {
        if *k == "DATABASE_URL" {
            let sep = if v.contains('?') { '&' } else { '?' };
            // A setting of its own: urutan names its connections `urutan`.
            *v = format!("{v}{sep}options=-c%20urutan_soak.replika%3D{name}");
        }
    }
    vars.push(("REPLICA_NAME", name.to_owned()));
    vars.push(("HANDLER_FUNCTION", "soak_catat".to_owned()));
    vars.push(("RUST_LOG", "warn,lapin::channel=off".to_owned()));
    Urutan::spawn(
        &urutan_testkit::binary(),
        name,
        &["run"],
        &vars,
        log_dir.join(format!("{name}.log")),
    )
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Join,
    Leave,
    Kill,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Join => "join",
            Kind::Leave => "graceful leave (SIGTERM)",
            Kind::Kill => "kill -9",
        }
    }
}

/// One soak event, measured.
struct Event {
    kind: Kind,
    /// Seconds from the event until every moved shard was applied by its
    /// new owner.
    settled: f64,
    moved: usize,
    /// Longest pause (s) of a moved shard, and of an unmoved one.
    moved_pause: f64,
    unmoved_pause: f64,
}

/// Shard → the replica placed on it.
async fn placement(db: &PgPool) -> anyhow::Result<BTreeMap<i32, String>> {
    let rows: Vec<(i32, String)> =
        sqlx::query_as("SELECT shard, replika FROM urutan_penempatan WHERE shard < $1")
            .bind(i32::from(SHARDS))
            .fetch_all(db)
            .await?;
    Ok(rows.into_iter().collect())
}

/// Waits until the placement gives every shard to one of `live`, each its
/// share, and every shard has been applied by its owner since `since`;
/// returns the placement and when the last moved shard was first applied
/// by its new owner (the database's clock).
async fn settle(
    db: &PgPool,
    live: &BTreeSet<String>,
    before: &BTreeMap<i32, String>,
    since: DateTime<Utc>,
) -> anyhow::Result<(BTreeMap<i32, String>, DateTime<Utc>)> {
    let start = Instant::now();
    let n = usize::from(SHARDS);
    let share = n / live.len()..=n.div_ceil(live.len());
    loop {
        let placed = placement(db).await?;
        let mut per: BTreeMap<&str, usize> = BTreeMap::new();
        for owner in placed.values() {
            *per.entry(owner.as_str()).or_default() += 1;
        }
        let shared = placed.len() == n
            && per.len() == live.len()
            && per
                .iter()
                .all(|(r, k)| live.contains(*r) && share.contains(k));
        if shared {
            // Per shard, the first apply by its owner since `since`.
            let firsts: Vec<(i32, String, DateTime<Utc>)> = sqlx::query_as(
                "SELECT shard, replika, min(pada) FROM soak_terap WHERE pada > $1
                 GROUP BY shard, replika",
            )
            .bind(since)
            .fetch_all(db)
            .await?;
            let first: BTreeMap<(i32, &str), DateTime<Utc>> = firsts
                .iter()
                .map(|(s, r, t)| ((*s, r.as_str()), *t))
                .collect();
            let by_owner: Option<Vec<(i32, DateTime<Utc>)>> = placed
                .iter()
                .map(|(s, r)| first.get(&(*s, r.as_str())).map(|t| (*s, *t)))
                .collect();
            if let Some(by_owner) = by_owner {
                let last_moved = by_owner
                    .iter()
                    .filter(|(s, _)| before.get(s) != placed.get(s))
                    .map(|(_, t)| *t)
                    .max()
                    .unwrap_or(since);
                return Ok((placed, last_moved));
            }
        }
        ensure!(
            start.elapsed() < SETTLE_LIMIT,
            "not settled within {SETTLE_LIMIT:?}: live {live:?}, placement {placed:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Per shard, its longest pause since `since`: the longest time between
/// two of its applies (or from its last apply to now) ending after it.
async fn pauses(db: &PgPool, since: DateTime<Utc>) -> anyhow::Result<BTreeMap<i32, f64>> {
    let rows: Vec<(i32, f64)> = sqlx::query_as(
        "WITH g AS (
            SELECT shard, pada AS at, lag(pada) OVER (PARTITION BY shard ORDER BY pada) AS prev
            FROM soak_terap WHERE pada > $1 - interval '10 seconds')
         SELECT shard, extract(epoch FROM max(gap))::float8 FROM (
             SELECT shard, at - coalesce(prev, at) AS gap FROM g WHERE at > $1
             UNION ALL
             SELECT shard, clock_timestamp() - max(at) FROM g GROUP BY shard) p
         GROUP BY shard",
    )
    .bind(since)
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().collect())
}

/// Order violations in the history: per order, the versions applied so
/// far must be 1, 2, 3... in apply order, each once; each position that
/// breaks it counts. Returns (violations, versions applied); a version
/// not applied yet is not a violation (the caller says how many).
async fn violations(db: &PgPool) -> anyhow::Result<(i64, i64)> {
    let (bad, applied): (i64, i64) = sqlx::query_as(
        "WITH h AS (
            SELECT pesanan_id, versi,
                   row_number() OVER (PARTITION BY pesanan_id ORDER BY seq) AS n
            FROM pesanan_riwayat)
         SELECT count(*) FILTER (WHERE versi <> n), count(*) FROM h",
    )
    .fetch_one(db)
    .await?;
    Ok((bad, applied))
}

async fn soak(options: &Options) -> anyhow::Result<()> {
    let env = TestEnv::new("replicas_soak").await;
    let broker = broker_version().await;
    let db = env.db().await;
    sqlx::raw_sql(RECORDER).execute(&db).await?;
    let log_dir =
        urutan_testkit::target_tmpdir().join(format!("replicas-soak-{}", std::process::id()));
    println!("soak on RabbitMQ {broker}: logs in {}", log_dir.display());
    let started_load = load();
    let started = Instant::now();

    let mut next = 0usize;
    let mut name = || {
        next += 1;
        format!("s{next}")
    };
    let mut replicas: BTreeMap<String, Urutan> = BTreeMap::new();
    for _ in 0..3 {
        let n = name();
        let mut r = start_replica(&env, &n, &log_dir)?;
        r.wait_ready(Duration::from_secs(60)).await?;
        replicas.insert(n, r);
    }
    let stream = Stream::start(&env, ORDERS, EVERY).await;
    let live: BTreeSet<String> = replicas.keys().cloned().collect();
    let (mut before, _) = settle(&db, &live, &BTreeMap::new(), db_now(&db).await?).await?;

    let mut events = Vec::new();
    for i in 0..options.events {
        let kind = match replicas.len() {
            0 | 1 => Kind::Join,
            4.. => {
                if rand::random_range(0..2) == 0 {
                    Kind::Leave
                } else {
                    Kind::Kill
                }
            }
            _ => match rand::random_range(0..3) {
                0 => Kind::Join,
                1 => Kind::Leave,
                _ => Kind::Kill,
            },
        };
        let at = db_now(&db).await?;
        match kind {
            Kind::Join => {
                let n = name();
                let r = start_replica(&env, &n, &log_dir)?;
                replicas.insert(n, r);
            }
            Kind::Leave | Kind::Kill => {
                let names: Vec<String> = replicas.keys().cloned().collect();
                let gone = names[rand::random_range(0..names.len())].clone();
                let mut r = replicas.remove(&gone).context("a live replica")?;
                if kind == Kind::Kill {
                    r.kill().await;
                } else {
                    r.signal("TERM")?;
                    let status = r.wait_exit(Duration::from_secs(30)).await;
                    ensure!(
                        status.is_some_and(|s| s.success()),
                        "{gone} did not exit 0 within 30 s of SIGTERM: {status:?}\n{}",
                        r.tail()
                    );
                }
            }
        }
        let live: BTreeSet<String> = replicas.keys().cloned().collect();
        let (after, last_moved) = settle(&db, &live, &before, at).await?;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let p = pauses(&db, at).await?;
        let moved: Vec<i32> = after
            .iter()
            .filter(|(s, r)| before.get(s) != Some(r))
            .map(|(s, _)| *s)
            .collect();
        let longest = |pick: &dyn Fn(&i32) -> bool| {
            p.iter()
                .filter(|(s, _)| pick(s))
                .map(|(_, g)| *g)
                .fold(0.0, f64::max)
        };
        let event = Event {
            kind,
            settled: (last_moved - at).as_seconds_f64().max(0.0),
            moved: moved.len(),
            moved_pause: longest(&|s| moved.contains(s)),
            unmoved_pause: longest(&|s| !moved.contains(s)),
        };
        println!(
            "#{:>3} {:<25} {} live, {:>2} moved, settled {:>5.2} s, longest pause moved {:>5.2} s, unmoved {:>5.2} s (load {})",
            i + 1,
            kind.label(),
            replicas.len(),
            event.moved,
            event.settled,
            event.moved_pause,
            event.unmoved_pause,
            load()
        );
        events.push(event);
        before = after;
        for (n, r) in &mut replicas {
            r.check_alive().with_context(|| format!("replica {n}"))?;
        }
    }

    let last = stream.stop().await;
    let total = ORDERS as i64 * last;
    // The backlog left is drained: wait while it moves (at most 60 s
    // without progress).
    let (mut seen, mut moved_at) = (-1i64, Instant::now());
    loop {
        let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM pesanan_riwayat")
            .fetch_one(&db)
            .await?;
        if applied > seen {
            (seen, moved_at) = (applied, Instant::now());
        }
        if applied >= total || moved_at.elapsed() > Duration::from_secs(60) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (bad, applied) = violations(&db).await?;
    let dead: i64 = sqlx::query_scalar("SELECT count(*) FROM urutan_dead_letter")
        .fetch_one(&db)
        .await?;
    let report = urutan_ops::verify::verify(&db, Some(0)).await?;
    let took = started.elapsed();
    for (_, mut r) in std::mem::take(&mut replicas) {
        let _ = r.stop(Duration::from_secs(30)).await;
    }

    let mut lines = vec![format!(
        "# Replicas soak on RabbitMQ {broker}\n\n`cargo bench --bench replicas -- --soak --events {}` \
         (commit {}; {} shards, {} orders each given its next version every {} ms; 1 to 4 replicas, \
         one random join, graceful leave or kill -9 at a time, each settled before the next; \
         {:.0} s in all; load at the start {started_load}, at the end {})\n\n",
        options.events,
        urutan_testkit::commit(),
        SHARDS,
        ORDERS,
        EVERY.as_millis(),
        took.as_secs_f64(),
        load()
    )];
    lines.push(format!(
        "**Order violations: {bad}** (every order's versions applied 1, 2, 3... once each, in \
         order, counted position by position over the {applied} versions applied of the {total} \
         published, 1..{last} per order; not applied when the drain stopped moving: {}); \
         dead-lettered: {dead}; `urutan verify`: {}.\n\n",
        total - applied,
        if report.passed() { "passed" } else { "FAILED" }
    ));
    lines.push(
        "Settled: from the event until every moved shard was applied by the replica the \
         placement gives it (for a join: the new process, from its start, took its share). \
         Pauses: per shard, the longest time between two applies (or from the last one) \
         ending after the event; the stream gives each shard an apply about every 75 ms.\n\n"
            .into(),
    );
    lines.push(row(&[
        &"event",
        &"count",
        &"shards moved (median)",
        &"settled s: median / p90 / max",
        &"longest pause of a moved shard s: median / max",
        &"longest pause of an unmoved shard s: median / max",
    ]));
    lines.push(row(&[&"---", &"---", &"---", &"---", &"---", &"---"]));
    for kind in [Kind::Join, Kind::Leave, Kind::Kill] {
        let of: Vec<&Event> = events.iter().filter(|e| e.kind == kind).collect();
        if of.is_empty() {
            continue;
        }
        let q = |f: &dyn Fn(&Event) -> f64, at: f64| {
            let mut v: Vec<f64> = of.iter().map(|e| f(e)).collect();
            v.sort_by(f64::total_cmp);
            v[((v.len() - 1) as f64 * at).round() as usize]
        };
        lines.push(row(&[
            &kind.label(),
            &of.len(),
            &format!("{:.0}", q(&|e| e.moved as f64, 0.5)),
            &format!(
                "{:.2} / {:.2} / {:.2}",
                q(&|e| e.settled, 0.5),
                q(&|e| e.settled, 0.9),
                q(&|e| e.settled, 1.0)
            ),
            &format!(
                "{:.2} / {:.2}",
                q(&|e| e.moved_pause, 0.5),
                q(&|e| e.moved_pause, 1.0)
            ),
            &format!(
                "{:.2} / {:.2}",
                q(&|e| e.unmoved_pause, 0.5),
                q(&|e| e.unmoved_pause, 1.0)
            ),
        ]));
    }
    let file = Path::new(&options.out).join(format!("replicas-soak-{broker}.md"));
    std::fs::write(&file, lines.concat())?;
    println!("{}", lines.concat());
    println!("wrote {}", file.display());
    ensure!(bad == 0, "{bad} order violations");
    ensure!(applied == total, "{} versions not applied", total - applied);
    ensure!(dead == 0, "{dead} dead-lettered");
    ensure!(report.passed(), "urutan verify: {report}");
    Ok(())
}

/// CPU time (user + system) of process `pid`, in seconds.
fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command's closing parenthesis; utime and stime are
    // the 14th and 15th of the whole line.
    let rest = stat.rsplit_once(')').context("a stat line")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>()? + fields[12].parse::<f64>()?;
    Ok(ticks / 100.0)
}

/// One drain: `cores.len()` replicas, each pinned to its core, drain a
/// backlog; (messages per second, CPU per message per replica in µs).
async fn drain_once(options: &Options, cores: &[u32]) -> anyhow::Result<(f64, Vec<f64>, String)> {
    let env = TestEnv::new("replicas_drain").await;
    let db = env.db().await;
    let log_dir =
        urutan_testkit::target_tmpdir().join(format!("replicas-drain-{}", std::process::id()));
    let exe = std::env::current_exe()?;
    let mut replicas = Vec::new();
    for (i, core) in cores.iter().enumerate() {
        let mut vars: Vec<(&str, String)> = env.process_env(SHARDS);
        vars.push(("REPLICA_NAME", format!("d{i}")));
        vars.push(("PREFETCH", options.prefetch.to_string()));
        vars.push((SPIN_VAR, options.cpu_us.to_string()));
        vars.push(("RUST_LOG", "warn,lapin::channel=off".to_owned()));
        let core = core.to_string();
        let exe = exe.to_string_lossy().into_owned();
        let mut r = Urutan::spawn(
            Path::new("taskset"),
            &format!("d{i}"),
            &["-c", &core, &exe, "run"],
            &vars,
            log_dir.join(format!("d{i}.log")),
        )?;
        r.wait_ready(Duration::from_secs(60)).await?;
        replicas.push(r);
    }
    // Shared before the backlog arrives, so the rate is that of R replicas.
    let want = usize::from(SHARDS).div_ceil(cores.len());
    let start = Instant::now();
    loop {
        let per: Vec<i64> = sqlx::query_scalar(
            "SELECT count(*) FROM urutan_penempatan p JOIN urutan_replika r ON r.nama = p.replika
             GROUP BY p.replika",
        )
        .fetch_all(&db)
        .await?;
        if per.len() == cores.len() && per.iter().all(|k| *k as usize == want) {
            break;
        }
        ensure!(
            start.elapsed() < Duration::from_secs(60),
            "not shared: {per:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let cpu_before: Vec<f64> = replicas
        .iter()
        .map(|r| cpu_seconds(r.pid))
        .collect::<anyhow::Result<_>>()?;
    let load_before = load();
    let versions = 10i64;
    let orders = options.messages / versions as usize;
    let msgs: Vec<Msg> = (1..=versions)
        .flat_map(|v| (0..orders).map(move |o| Msg::event(&format!("D-{o}"), v)))
        .collect();
    env.publisher().await.send_all(&msgs).await;
    let total = msgs.len() as i64;
    let limit = Instant::now() + Duration::from_secs(60 + total as u64 / 20);
    loop {
        let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM pesanan_riwayat")
            .fetch_one(&db)
            .await?;
        if applied >= total {
            break;
        }
        if Instant::now() > limit {
            bail!("{applied} of {total} applied in time");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let cpu_after: Vec<f64> = replicas
        .iter()
        .map(|r| cpu_seconds(r.pid))
        .collect::<anyhow::Result<_>>()?;
    let load_after = load();
    let span: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM max(diterapkan_pada) - min(diterapkan_pada))::float8 FROM pesanan_riwayat",
    )
    .fetch_one(&db)
    .await?;
    let per_replica: Vec<(String, i64)> = sqlx::query_as(
        "SELECT p.replika, count(*) FROM pesanan_riwayat h JOIN urutan_penempatan p ON p.shard = h.shard
         GROUP BY p.replika ORDER BY p.replika",
    )
    .fetch_all(&db)
    .await?;
    let cpu_per_message: Vec<f64> = cpu_before
        .iter()
        .zip(&cpu_after)
        .zip(&per_replica)
        .map(|((b, a), (_, n))| (a - b) / (*n).max(1) as f64 * 1e6)
        .collect();
    for mut r in replicas {
        let _ = r.stop(Duration::from_secs(30)).await;
    }
    let rate = total as f64 / span.max(1e-3);
    Ok((
        rate,
        cpu_per_message,
        format!("{load_before} -> {load_after}"),
    ))
}

async fn drain(options: &Options) -> anyhow::Result<()> {
    let mut lines = vec![
        format!(
            "# A CPU-bound Rust handler: 1 replica against 2, each pinned to its own core\n\n\
             `cargo bench --bench replicas -- --drain --messages {} --cpu-us {} --prefetch {} --rounds {}` \
             (commit {}; {} shards; the handler spends about {} µs of CPU per event in the \
             replica process; 1 replica under `taskset -c 0`, 2 under `taskset -c 0` and \
             `taskset -c 1`; PostgreSQL, RabbitMQ and the bench share the same 2 cores)\n\n",
            options.messages,
            options.cpu_us,
            options.prefetch,
            options.rounds,
            urutan_testkit::commit(),
            SHARDS,
            options.cpu_us
        ),
        row(&[
            &"round",
            &"replicas",
            &"msg/s",
            &"CPU per message per replica (µs)",
            &"load (1/5/15 min) before -> after",
        ]),
        row(&[&"---", &"---", &"---", &"---", &"---"]),
    ];
    let mut ratios = Vec::new();
    for round in 1..=options.rounds {
        let mut rates = Vec::new();
        for cores in [&[0u32][..], &[0, 1][..]] {
            let (rate, cpu, load) = drain_once(options, cores).await?;
            let cpu: Vec<String> = cpu.iter().map(|c| format!("{c:.0}")).collect();
            println!(
                "round {round}: {} replica(s): {rate:.0} msg/s, CPU per message {} µs (load {load})",
                cores.len(),
                cpu.join(" / ")
            );
            lines.push(row(&[
                &round,
                &cores.len(),
                &format!("{rate:.0}"),
                &cpu.join(" / "),
                &load,
            ]));
            rates.push(rate);
        }
        ratios.push(rates[1] / rates[0]);
    }
    let text: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
    lines.push(format!(
        "\nScaling factor (2 replicas ÷ 1), per round: **{}**.\n",
        text.join(", ")
    ));
    let file = Path::new(&options.out).join("replicas-cpu-drain.md");
    std::fs::write(&file, lines.concat())?;
    println!("{}", lines.concat());
    println!("wrote {}", file.display());
    Ok(())
}
