//! A database failover under load: a PostgreSQL primary with a streaming
//! standby (`deploy/postgres/pair.sh`), the worker pool and the outbox relay
//! reaching it through a proxy (the managed service's host name), a direct
//! publisher and an outbox producer writing all along. The primary is killed
//! (immediate stop), the standby promoted and the proxy moved to it, as the
//! service's DNS would; workers, relay and producers carry on.
//!
//! - Synchronous replication: nothing the broker saw acked is lost.
//! - Asynchronous replication, with the replication link held silent for a
//!   moment (a proxy on it), so the standby is behind when the primary dies:
//!   the commits of that moment are gone, together with their dedup rows,
//!   while their messages were acked. The test measures how many and what
//!   `urutan verify` sees of it.
//!
//! `serial_*`: they need root (the script creates PostgreSQL clusters) and
//! the ports 5445/5446; deploy/local/test.sh runs them alone, as root.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use urutan::health::Health;
use urutan::outbox::relay::{Relay, RelaySettings};
use urutan::outbox::{NewEvent, enqueue};

use crate::common::*;
use crate::proxy::{Mode, Proxy};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/postgres/pair.sh");
const PRIMARY: u16 = 5445;
const STANDBY: u16 = 5446;
/// Entities per producer (direct `d-NN`, outbox `o-NN`); one round writes
/// the next version of each.
const ENTITIES: usize = 16;
const ROUND_PAUSE: Duration = Duration::from_millis(100);

/// The pair's ports are fixed: one failover test at a time in this process.
static PAIR: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serial_a_database_failover_with_synchronous_replication_loses_nothing() {
    let _one = PAIR.lock().await;
    let run = failover(Replication::Sync).await;
    assert_eq!(
        run.lost_at_promotion, 0,
        "history rows lost at the failover"
    );
    assert_eq!(run.lost_direct.len(), 0, "acked direct events lost");
    assert_eq!(run.lost_outbox, 0, "committed outbox rows lost");
    assert!(run.report.passed(), "urutan verify:\n{}", run.report);
    let (direct, outbox) = run.split_history();
    assert_gapless_in_order(&direct, ENTITIES, run.direct_rounds);
    assert_gapless_in_order(&outbox, ENTITIES, run.outbox_rounds);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serial_an_asynchronous_failover_can_lose_acked_commits_and_says_how_many() {
    let _one = PAIR.lock().await;
    let run = failover(Replication::Async).await;
    // The standby missed the silent moment's commits: some are gone, and
    // with them acked direct events (never redelivered).
    assert!(run.lost_at_promotion > 0, "the standby was behind");
    assert!(!run.lost_direct.is_empty(), "acked direct events were lost");
    // What remains is still applied once each, in order, state = last applied.
    for name in [
        "history strictly increases per entity in apply order",
        "no version applied twice",
        "stored state is the last applied version (no stale overwrite)",
    ] {
        let check = run.report.checks.iter().find(|c| c.name == name);
        assert_eq!(
            check.map(|c| c.violations),
            Some(0),
            "{name}:\n{}",
            run.report
        );
    }
    let (direct, outbox) = run.split_history();
    assert_increasing(&direct);
    assert_increasing(&outbox);
    // A new outbox row given an id the old primary had already handed out
    // (to a row lost at the promotion) is another message when its order is
    // another: dedup is per (entity id, message id), so it is applied, and
    // an asynchronous failover dead-letters nothing (it used to dead-letter
    // such rows as `message_id_reused`).
    assert_eq!(
        run.dead_letter_records.len() as u32,
        run.dead_letters,
        "every dead letter has its record: {:?}",
        run.dead_letter_records
    );
    assert!(
        run.dead_letter_records.is_empty(),
        "no dead letter after a failover (outbox ids given again above the standby's {}): {:?}",
        run.top_id_on_standby,
        run.dead_letter_records
    );
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Replication {
    Sync,
    Async,
}

/// Rows of `pesanan_riwayat` in apply order: (entity, versi, shard).
type History = Vec<(String, i64, i32)>;

/// What one failover run measured (on the promoted standby at the end).
struct Run {
    history: History,
    direct_rounds: i64,
    outbox_rounds: i64,
    /// History rows the old primary had (at least) that the new one lacks.
    lost_at_promotion: i64,
    /// Direct events the broker confirmed that were never applied for good.
    lost_direct: Vec<(String, i64)>,
    /// Outbox rows whose producer commit succeeded and which are gone.
    lost_outbox: usize,
    report: urutan_ops::verify::Report,
    dead_letters: u32,
    /// Each dead letter recorded on the new primary: its message id, order,
    /// reason, and the order of the outbox row that holds its id now.
    dead_letter_records: Vec<String>,
    /// The highest outbox id the promoted standby had.
    top_id_on_standby: i64,
}

impl Run {
    /// The history of the direct publisher's entities, then the outbox's.
    fn split_history(&self) -> (History, History) {
        self.history
            .iter()
            .cloned()
            .partition(|(e, _, _)| e.starts_with("d-"))
    }
}

async fn failover(mode: Replication) -> Run {
    require_root();
    // The replication link and the application's link, each through a proxy.
    let repl_link = Proxy::start(local(PRIMARY)).await;
    let db_link = Proxy::start(local(PRIMARY)).await;
    let _pair = PairGuard;
    let flag = if mode == Replication::Sync {
        "--sync"
    } else {
        "--async"
    };
    let port = repl_link.addr.port().to_string();
    pair(&["up", flag, "--replication-port", &port]).await;

    let env = TestEnv::new("failover").await;
    let mut settings = env.settings(4);
    settings.database_url = format!("postgres://postgres@{}/{}", db_link.addr, env.database)
        .parse()
        .expect("db url");
    settings.database_timeout = Duration::from_secs(5);
    // The pair's primary is a cluster of its own: the test's database is
    // created there (`urutan run` never creates one).
    urutan::store::ensure_database(&settings.database_url)
        .await
        .expect("the test's database on the primary");
    let pool = RunningPool::start(settings.clone()).await;
    pool.wait_ready().await;
    let relay = RunningRelay::start(settings.clone());
    let old = direct_db(PRIMARY, &env.database).await;

    let stop = CancellationToken::new();
    let publisher = env.publisher().await;
    let direct = tokio::spawn(publish_rounds(publisher, stop.clone()));
    // The producer's pool is urutan's own (bounded acquire and release).
    let app_db = urutan::store::connect(&settings.database(), 2)
        .await
        .expect("producer pool");
    let committed = Arc::new(Mutex::new(Vec::new()));
    let outbox = tokio::spawn(enqueue_rounds(app_db, committed.clone(), stop.clone()));
    wait_for("100 versions applied", Duration::from_secs(60), || async {
        history_rows(&old).await >= 100
    })
    .await;

    // The moment before the failover: with async replication the standby's
    // link goes silent while the worker keeps committing and acking.
    let window = Instant::now();
    let before = history_rows(&old).await;
    if mode == Replication::Async {
        repl_link.set(Mode::Blackhole);
        wait_for(
            "100 versions applied past the standby",
            Duration::from_secs(30),
            || async { history_rows(&old).await >= before + 100 },
        )
        .await;
    }
    tokio::time::sleep(Duration::from_millis(1500).saturating_sub(window.elapsed())).await;
    let lag = standby_lag_bytes(&old).await;
    let on_primary = history_rows(&old).await;
    let top_id_on_primary = top_outbox_id(&old).await;
    old.close().await;

    let killed = Instant::now();
    pair(&["kill-primary"]).await;
    pair(&["promote"]).await;
    db_link.retarget(local(STANDBY));
    let promoted = Instant::now();
    let new = direct_db(STANDBY, &env.database).await;
    let on_standby = history_rows(&new).await;
    let top_id_on_standby = top_outbox_id(&new).await;
    wait_for(
        "the first apply on the new primary",
        Duration::from_secs(60),
        || async { history_rows(&new).await > on_standby },
    )
    .await;
    let first_apply = promoted.elapsed();
    pool.wait_ready().await;
    let ready = promoted.elapsed();

    // The load carries on for a while, then every entity's last version
    // (written after the failover, so never lost) must arrive.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.cancel();
    let direct_rounds = join(direct, "the direct publisher").await;
    let outbox_rounds = join(outbox, "the outbox producer").await;
    wait_for(
        "every entity at its last version",
        Duration::from_secs(90),
        || async {
            let at_top: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pesanan
             WHERE (id LIKE 'd-%' AND versi = $1) OR (id LIKE 'o-%' AND versi = $2)",
            )
            .bind(direct_rounds)
            .bind(outbox_rounds)
            .fetch_one(&new)
            .await
            .expect("at top");
            let unsent = count(
                &new,
                "SELECT count(*) FROM outbox WHERE dikirim_pada IS NULL",
            )
            .await;
            at_top == 2 * ENTITIES as i64 && unsent == 0
        },
    )
    .await;
    relay.stop().await;
    pool.stop().await;

    let history = history(&new).await;
    let applied: HashSet<(String, i64)> = history.iter().map(|(e, v, _)| (e.clone(), *v)).collect();
    let lost_direct: Vec<(String, i64)> = (1..=direct_rounds)
        .flat_map(|v| (0..ENTITIES).map(move |e| (format!("d-{e:02}"), v)))
        .filter(|ev| !applied.contains(ev))
        .collect();
    let in_outbox: HashSet<(String, i64)> =
        sqlx::query_as("SELECT agregat_id, (payload->>'versi')::bigint FROM outbox")
            .fetch_all(&new)
            .await
            .expect("outbox rows")
            .into_iter()
            .collect();
    let committed = committed.lock().expect("lock").clone();
    let lost_outbox = committed
        .iter()
        .filter(|ev| !in_outbox.contains(*ev))
        .count();
    let conn = env.broker().await;
    let dead_letters = queue_len(&conn, "pesanan.dlq").await;
    let _ = urutan::broker::call("connection.close", conn.close(200, "".into())).await;
    let dead_letter_records: Vec<String> = sqlx::query_scalar(
        "SELECT format('%s (order %s): %s; outbox row for %s',
                       coalesce(d.message_id, d.delivery_key), d.pesanan_id, d.reason,
                       (SELECT o.agregat_id FROM outbox o WHERE o.id::text = d.message_id))
           FROM urutan_dead_letter d WHERE d.resolved_at IS NULL ORDER BY d.id",
    )
    .fetch_all(&new)
    .await
    .expect("dead-letter records");
    let report = urutan_ops::verify::verify(&new, Some(dead_letters))
        .await
        .expect("verify");
    let lost_at_promotion = (on_primary - on_standby).max(0);
    // Outbox ids the old primary had given to rows that are gone, given
    // again by the new one (its sequence resumes from the last replicated
    // value): a queued message of a lost row holds the same message id.
    let reused_ids: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox WHERE id > $1 AND id <= $2")
            .bind(top_id_on_standby)
            .bind(top_id_on_primary)
            .fetch_one(&new)
            .await
            .expect("reused ids");
    // Versions applied from outbox rows that no longer exist (relayed before
    // the kill, applied after it): verify cannot see them.
    let orphans = count(
        &new,
        "SELECT count(*) FROM pesanan_riwayat r WHERE r.pesanan_id LIKE 'o-%'
           AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.agregat_id = r.pesanan_id
                             AND (o.payload->>'versi')::bigint = r.versi)",
    )
    .await;

    let sent = direct_rounds * ENTITIES as i64;
    eprintln!(
        "failover ({mode:?}): standby {lag} WAL bytes behind at the kill; \
         old primary had >= {on_primary} history rows, the promoted standby {on_standby} \
         (lost at promotion: {lost_at_promotion}); promoted {:?} after the kill; \
         first apply on the new primary {first_apply:?} after promotion, /readyz 200 after {ready:?}",
        promoted - killed
    );
    eprintln!(
        "failover ({mode:?}): direct: {} of {sent} broker-confirmed events lost (acked, never applied) {:?}; \
         outbox: {lost_outbox} of {} producer commits lost; {} history rows; DLQ {dead_letters}",
        lost_direct.len(),
        lost_direct.iter().take(8).collect::<Vec<_>>(),
        committed.len(),
        history.len(),
    );
    eprintln!(
        "failover ({mode:?}): outbox ids given again after the promotion: {reused_ids} \
         (the old primary had reached {top_id_on_primary}, the standby {top_id_on_standby}); \
         versions applied from outbox rows that are gone: {orphans}"
    );
    eprintln!("failover ({mode:?}): urutan verify on the new primary:\n{report}");
    drop(env);
    Run {
        history,
        direct_rounds,
        outbox_rounds,
        lost_at_promotion,
        lost_direct,
        lost_outbox,
        report,
        dead_letters,
        dead_letter_records,
        top_id_on_standby,
    }
}

fn local(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Fails at once, in one line, where the pair cannot be made.
fn require_root() {
    let uid = std::process::Command::new("id").arg("-u").output();
    let uid = uid.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    assert!(
        uid.as_deref().is_ok_and(|u| u == "0"),
        "the failover tests need root ({SCRIPT} creates PostgreSQL clusters): run them as root, e.g. through deploy/local/test.sh"
    );
}

/// Runs `pair.sh ARGS` (at most 120 s); its stderr in the panic if it fails.
async fn pair(args: &[&str]) {
    let run = tokio::process::Command::new("bash")
        .arg(SCRIPT)
        .args(args)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .unwrap_or_else(|_| panic!("{SCRIPT} {} took longer than 120 s", args.join(" ")))
        .unwrap_or_else(|e| panic!("cannot run {SCRIPT}: {e}"));
    assert!(
        out.status.success(),
        "{SCRIPT} {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// Drops both clusters when the test ends, also on a panic.
struct PairGuard;

impl Drop for PairGuard {
    fn drop(&mut self) {
        let _ = std::process::Command::new("timeout")
            .args(["120", "bash", SCRIPT, "down"])
            .output();
    }
}

/// A small pool straight to one cluster (not through the application's link).
async fn direct_db(port: u16, database: &str) -> PgPool {
    let url = format!("postgres://postgres@127.0.0.1:{port}/{database}");
    PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&url)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"))
}

async fn history_rows(db: &PgPool) -> i64 {
    count(db, "SELECT count(*) FROM pesanan_riwayat").await
}

async fn top_outbox_id(db: &PgPool) -> i64 {
    count(db, "SELECT coalesce(max(id), 0) FROM outbox").await
}

/// How far the standby's replay is behind the primary's WAL, in bytes.
async fn standby_lag_bytes(primary: &PgPool) -> i64 {
    let standby = direct_db(STANDBY, "postgres").await;
    let (lsn,): (String,) = sqlx::query_as("SELECT pg_current_wal_lsn()::text")
        .fetch_one(primary)
        .await
        .expect("primary lsn");
    let lag: Option<i64> =
        sqlx::query_scalar("SELECT pg_wal_lsn_diff($1::pg_lsn, pg_last_wal_replay_lsn())::bigint")
            .bind(lsn)
            .fetch_one(&standby)
            .await
            .expect("standby lsn");
    standby.close().await;
    // Negative while caught up: the standby replays on after the first read.
    lag.unwrap_or(-1).max(0)
}

/// Publishes round after round (round r = version r of every `d-NN`), each
/// confirmed by the broker, until `stop`; returns the rounds published.
async fn publish_rounds(publisher: Publisher, stop: CancellationToken) -> i64 {
    let mut round = 0;
    while !stop.is_cancelled() {
        round += 1;
        let events: Vec<Msg> = (0..ENTITIES)
            .map(|e| Msg::event(&format!("d-{e:02}"), round))
            .collect();
        publisher.send_all(&events).await;
        tokio::time::sleep(ROUND_PAUSE).await;
    }
    round
}

/// Writes round after round of `o-NN` versions through the outbox, four
/// events per transaction, retrying a transaction that failed (a failover:
/// its outcome is unknown, so a retry may write a version twice, which the
/// worker absorbs as stale) for at most 60 s; records each commit that
/// succeeded in `committed`. Returns the rounds written.
async fn enqueue_rounds(
    db: PgPool,
    committed: Arc<Mutex<Vec<(String, i64)>>>,
    stop: CancellationToken,
) -> i64 {
    let mut round = 0;
    while !stop.is_cancelled() {
        round += 1;
        let events: Vec<(String, i64)> = (0..ENTITIES)
            .map(|e| (format!("o-{e:02}"), round))
            .collect();
        for chunk in events.chunks(4) {
            let failing = Instant::now();
            let mut last_error = String::new();
            while let Err(e) = enqueue_once(&db, chunk, Duration::from_secs(10)).await {
                if e != last_error {
                    eprintln!("failover: outbox producer: {e} (retrying)");
                    last_error = e.clone();
                }
                assert!(
                    failing.elapsed() < Duration::from_secs(60),
                    "outbox writes failing for 60 s: {e}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            committed.lock().expect("lock").extend_from_slice(chunk);
        }
        tokio::time::sleep(ROUND_PAUSE).await;
    }
    round
}

/// One producer transaction, abandoned after `limit`.
async fn enqueue_once(
    db: &PgPool,
    events: &[(String, i64)],
    limit: Duration,
) -> Result<(), String> {
    tokio::time::timeout(limit, enqueue_tx_once(db, events))
        .await
        .unwrap_or_else(|_| Err(format!("no commit within {limit:?}")))
}

async fn enqueue_tx_once(db: &PgPool, events: &[(String, i64)]) -> Result<(), String> {
    let mut tx = db.begin().await.map_err(|e| e.to_string())?;
    for (entity, versi) in events {
        let status = status_of(*versi);
        let event = NewEvent {
            agregat_id: entity,
            status: &status,
            versi: *versi,
            routing_key: "pesanan.jakarta.diperbarui",
            ..Default::default()
        };
        enqueue(&mut tx, &event).await.map_err(|e| e.to_string())?;
    }
    tx.commit().await.map_err(|e| e.to_string())
}

async fn join(task: JoinHandle<i64>, what: &str) -> i64 {
    tokio::time::timeout(Duration::from_secs(90), task)
        .await
        .unwrap_or_else(|_| panic!("{what} did not stop within 90 s"))
        .unwrap_or_else(|e| panic!("{what} failed: {e}"))
}

/// Versions strictly increase per entity in apply order (gaps allowed).
fn assert_increasing(history: &[(String, i64, i32)]) {
    let mut last: HashMap<&str, i64> = HashMap::new();
    for (entity, versi, _) in history {
        let prev = last.insert(entity, *versi).unwrap_or(0);
        assert!(
            *versi > prev,
            "entity {entity}: {versi} applied after {prev}"
        );
    }
}

/// An in-process outbox relay.
struct RunningRelay {
    token: CancellationToken,
    task: JoinHandle<()>,
}

impl RunningRelay {
    fn start(settings: urutan::config::Settings) -> Self {
        let token = CancellationToken::new();
        let relay = Relay {
            settings,
            relay: RelaySettings::default(),
            after_publish: None,
            health: Arc::new(Health::default()),
        };
        let task = tokio::spawn(relay.run(token.clone()));
        Self { token, task }
    }

    async fn stop(self) {
        self.token.cancel();
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .expect("relay did not stop within 30 s")
            .expect("relay task panicked");
    }
}
