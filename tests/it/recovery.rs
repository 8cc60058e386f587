//! Crashes, signals and outages: nothing is lost, nothing is applied twice,
//! and the pool recovers by itself.
//!
//! Tests named `serial_*` stop the shared broker or database for a few
//! seconds; deploy/local/test.sh runs them alone. Each of them restarts the
//! service from a `Drop` guard, so a failing assertion never leaves it down.

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use sqlx::PgPool;
use urutan_testkit::scenarios::{BrokerGuard, sh_blocking};

use crate::common::*;

/// `entities` × `versions`, interleaved: every entity's `from`, then every
/// entity's `from + 1`, ... up to `versions`.
fn interleaved(entities: usize, from: i64, versions: i64) -> Vec<Msg> {
    (from..=versions)
        .flat_map(|v| (0..entities).map(move |e| Msg::event(&format!("K-{e}"), v)))
        .collect()
}

async fn applied(db: &PgPool) -> i64 {
    count(db, "SELECT count(*) FROM pesanan_riwayat").await
}

/// Polls (every 10 ms, at most `limit`) until at least `n` versions are applied.
async fn wait_applied_at_least(db: &PgPool, n: i64, limit: Duration) -> i64 {
    let start = Instant::now();
    loop {
        let now = applied(db).await;
        if now >= n {
            return now;
        }
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?}: {now} of {n} versions applied"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The end state every test wants: every version exactly once, in order,
/// every message id recorded once, nothing dead-lettered.
async fn assert_all_applied_once(env: &TestEnv, db: &PgPool, entities: usize, versions: i64) {
    let total = entities as i64 * versions;
    assert_gapless_in_order(&history(db).await, entities, versions);
    assert_eq!(
        count(db, "SELECT count(*) FROM pesan_diproses").await,
        total,
        "every message id recorded exactly once"
    );
    let conn = env.broker().await;
    let dead = drain_dlq(&conn).await;
    assert!(dead.is_empty(), "{} message(s) dead-lettered", dead.len());
    let _ = urutan::broker::call("connection.close", conn.close(200, "".into())).await;
}

async fn scrape(http: SocketAddr) -> String {
    let (status, body) = http_get(http, "/metrics").await;
    assert_eq!(status, 200, "GET /metrics");
    body
}

/// Declares the topology with the binary itself (`urutan topology`), so a
/// backlog can be queued before any worker runs.
fn declare_topology(env: &TestEnv, shards: u16) {
    let out = Command::new(env!("CARGO_BIN_EXE_urutan"))
        .arg("topology")
        .envs(env.process_env(shards))
        .output()
        .expect("run urutan topology");
    assert!(
        out.status.success(),
        "urutan topology failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The `x-delivery-count` of the message at the head of each shard queue
/// (None: the queue is empty). Peeking returns the message, which on 3.10
/// itself adds one to its count.
async fn head_delivery_counts(env: &TestEnv, shards: u16) -> Vec<Option<u64>> {
    use futures::StreamExt;
    use lapin::options::{BasicConsumeOptions, BasicQosOptions};
    use lapin::types::FieldTable;
    let conn = env.broker().await;
    let mut counts = Vec::new();
    for shard in 0..shards {
        let queue = format!("pesanan.shard-{shard:03}");
        let ch = conn.create_channel().await.expect("channel");
        ch.basic_qos(1, BasicQosOptions::default())
            .await
            .expect("qos");
        let mut consumer = ch
            .basic_consume(
                queue.as_str().into(),
                "peek".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("consume");
        let head = tokio::time::timeout(Duration::from_secs(1), consumer.next()).await;
        counts.push(match head {
            Ok(Some(Ok(d))) => Some(urutan::broker::delivery::previous_deliveries(&d)),
            _ => None,
        });
        let _ = urutan::broker::call("channel.close", ch.close(200, "".into())).await;
    }
    let _ = urutan::broker::call("connection.close", conn.close(200, "".into())).await;
    counts
}

/// Queues `entities` × `versions` on 4 shards before any worker runs (the
/// binary declares the topology); returns the test database.
async fn queued_backlog(env: &TestEnv, entities: usize, versions: i64) -> PgPool {
    declare_topology(env, 4);
    env.publisher()
        .await
        .send_all(&interleaved(entities, 1, versions))
        .await;
    env.db().await
}

/// How [`stopped_mid_backlog`] stops its first worker.
enum Stop {
    /// SIGKILL.
    Kill,
    /// SIGTERM, which must end in a clean exit (status 0, "stopped cleanly"
    /// logged) within 30 s.
    Term,
}

/// What [`stopped_mid_backlog`] leaves.
struct Resumed {
    /// Versions applied once the first worker had stopped.
    at_stop: i64,
    /// How long the first worker took to exit once told to.
    stop_took: Duration,
    /// The second worker, still running.
    second: UrutanProcess,
}

/// `entities` × `versions` queued on 4 shards; a first `urutan run`
/// stopped by `stop` once it applied 100 of them (and not all: else
/// nothing was tested); a second one gets ready and applies the rest within
/// `limit`: every version exactly once, in order, nothing dead-lettered.
async fn stopped_mid_backlog(
    env: &TestEnv,
    (entities, versions): (usize, i64),
    stop: Stop,
    limit: Duration,
) -> Resumed {
    let total = entities as i64 * versions;
    let db = queued_backlog(env, entities, versions).await;

    let mut first = UrutanProcess::start("run", &env.process_env(4));
    let seen = wait_applied_at_least(&db, 100, Duration::from_secs(60)).await;
    let stop_took = match stop {
        Stop::Kill => {
            let kill = Instant::now();
            first.kill().await;
            kill.elapsed()
        }
        Stop::Term => {
            first.sigterm();
            let term = Instant::now();
            let status = first.wait_exit(Duration::from_secs(30)).await;
            let stop_took = term.elapsed();
            let log = first.log();
            assert_eq!(status.code(), Some(0), "exit status {status}:\n{log}");
            assert!(
                log.contains("stopped cleanly"),
                "no clean stop logged:\n{log}"
            );
            stop_took
        }
    };
    let at_stop = applied(&db).await;
    let (too_late, when) = match stop {
        Stop::Kill => (
            format!("the kill ({seen} seen, {at_stop} after)"),
            "after the restart",
        ),
        // A message committed but not acked would come back to the second
        // worker as a duplicate.
        Stop::Term => ("SIGTERM took effect".to_owned(), "by the second worker"),
    };
    assert!(
        at_stop < total,
        "the worker finished before {too_late}; nothing was tested"
    );

    let mut second = UrutanProcess::start("run", &env.process_env(4));
    second.wait_ready().await;
    wait_for(
        &format!("{total} versions applied {when}"),
        limit,
        || async { applied(&db).await == total },
    )
    .await;
    assert_all_applied_once(env, &db, entities, versions).await;
    Resumed {
        at_stop,
        stop_took,
        second,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_killed_with_sigkill_mid_stream_loses_nothing_and_applies_nothing_twice() {
    let env = TestEnv::new("sigkill").await;
    let (entities, versions) = (100, 10);
    let total = entities as i64 * versions;
    let stop = Stop::Kill;
    let mut resumed =
        stopped_mid_backlog(&env, (entities, versions), stop, Duration::from_secs(90)).await;
    resumed.second.kill().await;
    let at_kill = resumed.at_stop;
    eprintln!("sigkill: killed at {at_kill} of {total} applied");
}

/// How [`reconnects_after`] cuts the pool off the broker between its halves.
enum Cut {
    /// `close_all_connections` of this test's vhost only: the pool's
    /// connection and the publisher's.
    CloseConnections,
    /// The shared broker's application stopped (`/readyz` 503) and started
    /// again (`/readyz` 200).
    RestartBroker,
}

/// Starts a pool of `shards` shards on `env` and publishes v1..=`half` of
/// `entities` orders; returns the pool, ready, once it applied them all,
/// and the test database.
async fn half_applied(
    env: &TestEnv,
    shards: u16,
    entities: usize,
    half: i64,
) -> (RunningPool, PgPool) {
    let pool = RunningPool::start(env.settings(shards)).await;
    pool.wait_ready().await;
    let db = env.db().await;
    env.publisher()
        .await
        .send_all(&interleaved(entities, 1, half))
        .await;
    wait_applied(&db, entities as i64 * half, Duration::from_secs(60)).await;
    (pool, db)
}

/// A pool of 4 shards applies `half` of `entities` × `versions`, `cut`
/// takes the broker from under it, and a new publisher sends the rest:
/// every version is applied exactly once, in order, nothing dead-lettered,
/// and the pool counted a broker reconnect.
async fn reconnects_after(cut: Cut, name: &str, entities: usize, half: i64, versions: i64) {
    let env = TestEnv::new(name).await;
    let (pool, db) = half_applied(&env, 4, entities, half).await;
    let reconnects_before = metric_sum(
        &scrape(pool.http).await,
        "urutan_broker_reconnects_total",
        &[],
    );

    let back_after = match cut {
        Cut::CloseConnections => {
            sh_blocking(
                "rabbitmqctl",
                &["-q", "close_all_connections", "-p", &env.vhost, "test"],
            )
            .await;
            None
        }
        Cut::RestartBroker => {
            // Declared after `env`, so dropped (broker started) before `env` deletes its vhost.
            let _broker = BrokerGuard;
            let restart = Instant::now();
            sh_blocking("rabbitmqctl", &["-q", "stop_app"]).await;
            wait_for(
                "/readyz 503 with the broker stopped",
                Duration::from_secs(10),
                || async { http_get(pool.http, "/readyz").await.0 == 503 },
            )
            .await;
            sh_blocking("rabbitmqctl", &["-q", "start_app"]).await;
            sh_blocking("rabbitmqctl", &["-q", "--timeout", "120", "await_startup"]).await;
            wait_for(
                "the pool ready again after the broker restart",
                Duration::from_secs(60),
                || async { http_get(pool.http, "/readyz").await.0 == 200 },
            )
            .await;
            Some(restart.elapsed())
        }
    };

    // The old publisher's connection is gone: a new one. No backlog crossed
    // a restart (the hash ring may have changed).
    env.publisher()
        .await
        .send_all(&interleaved(entities, half + 1, versions))
        .await;
    wait_applied(&db, entities as i64 * versions, Duration::from_secs(60)).await;
    assert_all_applied_once(&env, &db, entities, versions).await;
    if matches!(cut, Cut::CloseConnections) {
        // A restart waited for the pool to be ready again; a close did not.
        pool.wait_ready().await;
    }
    let reconnects = metric_sum(
        &scrape(pool.http).await,
        "urutan_broker_reconnects_total",
        &[],
    );
    assert!(
        reconnects >= reconnects_before + 1.0,
        "urutan_broker_reconnects_total {reconnects_before} -> {reconnects}"
    );
    pool.stop().await;
    if let Some(back_after) = back_after {
        eprintln!("broker restart: pool ready again {back_after:?} after stop_app");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_connection_close_is_recovered() {
    reconnects_after(Cut::CloseConnections, "forceclose", 50, 5, 10).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serial_broker_restart_is_recovered() {
    reconnects_after(Cut::RestartBroker, "brokerrestart", 50, 3, 6).await;
}

/// The PostgreSQL cluster serving port 5432, stopped and started with
/// pg_ctlcluster; started again (and awaited) when dropped, also on panic.
struct Postgres {
    version: String,
    cluster: String,
}

impl Postgres {
    fn find() -> Self {
        let clusters = sh("pg_lsclusters", &["-h"]);
        let (version, cluster) = clusters
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|f| f.get(2) == Some(&"5432"))
            .map(|f| (f[0].to_owned(), f[1].to_owned()))
            .unwrap_or_else(|| panic!("no PostgreSQL cluster on port 5432:\n{clusters}"));
        Self { version, cluster }
    }

    async fn ctl(&self, args: &[&str]) {
        let mut all = vec![
            "--skip-systemctl-redirect",
            self.version.as_str(),
            self.cluster.as_str(),
        ];
        all.extend_from_slice(args);
        sh_blocking("pg_ctlcluster", &all).await;
    }

    fn is_ready() -> bool {
        Command::new("pg_isready")
            .args(["-q", "-h", "127.0.0.1", "-p", "5432", "-t", "2"])
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if Self::is_ready() {
            return;
        }
        let _ = Command::new("pg_ctlcluster")
            .args([
                "--skip-systemctl-redirect",
                &self.version,
                &self.cluster,
                "start",
            ])
            .output();
        let start = Instant::now();
        while !Self::is_ready() && start.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serial_database_outage_dead_letters_nothing_and_processing_resumes() {
    let env = TestEnv::new("dboutage").await;
    let (entities, half, versions) = (20, 3, 6);
    let (pool, db) = half_applied(&env, 2, entities, half).await;
    // Its connections would not survive the restart.
    db.close().await;
    let retries_before = metric_sum(&scrape(pool.http).await, "urutan_retries_total", &[]);

    // Declared after `env`, so dropped (database started) before `env` drops its database.
    let pg = Postgres::find();
    pg.ctl(&["stop", "-m", "fast"]).await;
    let stopped = Instant::now();
    env.publisher()
        .await
        .send_all(&interleaved(entities, half + 1, versions))
        .await;
    wait_for(
        "/readyz 503 with the database down",
        Duration::from_secs(6),
        || async { http_get(pool.http, "/readyz").await.0 == 503 },
    )
    .await;
    let unready_after = stopped.elapsed();
    assert_eq!(
        http_get(pool.http, "/healthz").await.0,
        200,
        "alive while unready"
    );
    // Unready for as long as the database is down (~5 s in all).
    let hold_until = stopped + Duration::from_secs(5);
    while Instant::now() < hold_until {
        assert_eq!(
            http_get(pool.http, "/readyz").await.0,
            503,
            "/readyz with the database down"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Held, not dead-lettered: the outage is transient.
    let conn = env.broker().await;
    let dead = drain_dlq(&conn).await;
    assert!(
        dead.is_empty(),
        "{} dead-lettered in the outage",
        dead.len()
    );

    pg.ctl(&["start"]).await;
    let started = Instant::now();
    wait_for(
        "/readyz 200 after the database is back",
        Duration::from_secs(15),
        || async { http_get(pool.http, "/readyz").await.0 == 200 },
    )
    .await;
    let ready_after = started.elapsed();

    let db = env.db().await;
    wait_applied(&db, entities as i64 * versions, Duration::from_secs(60)).await;
    let caught_up = started.elapsed();
    assert_all_applied_once(&env, &db, entities, versions).await;
    let retries = metric_sum(&scrape(pool.http).await, "urutan_retries_total", &[]);
    assert!(
        retries > retries_before,
        "urutan_retries_total {retries_before} -> {retries}: no held retry counted"
    );
    pool.stop().await;
    eprintln!(
        "db outage: unready after {unready_after:?}, ready {ready_after:?} and caught up \
         {caught_up:?} after the restart"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_exits_zero_and_leaves_nothing_unacked() {
    let env = TestEnv::new("sigterm").await;
    let (entities, versions) = (200, 10);
    let total = entities as i64 * versions;
    let stop = Stop::Term;
    let Resumed {
        at_stop: at_exit,
        stop_took,
        mut second,
    } = stopped_mid_backlog(&env, (entities, versions), stop, Duration::from_secs(120)).await;
    let metrics = scrape(second.process.http).await;
    let outcome = |o: &str| {
        metric_sum(
            &metrics,
            "urutan_messages_total",
            &[&format!("outcome=\"{o}\"")],
        )
    };
    assert_eq!(
        outcome("duplicate"),
        0.0,
        "redelivered after a clean stop:\n{metrics}"
    );
    assert_eq!(outcome("stale"), 0.0, "stale versions:\n{metrics}");
    assert_eq!(
        outcome("applied"),
        (total - at_exit) as f64,
        "the second worker applies exactly the rest"
    );
    second.kill().await;
    eprintln!("sigterm: stopped in {stop_took:?} with {at_exit} of {total} applied");
}

/// A clean stop must not hand back a message it was already sent: on 3.10,
/// closing a channel with an unacked delivery adds one to its
/// `x-delivery-count`, so every rolling restart would spend one of the
/// `DELIVERY_LIMIT` attempts of a valid message (and enough of them
/// dead-letter it). With `PREFETCH` 2 the next message is always pushed
/// while one is handled, which makes the case deterministic; with the
/// default of 1 the same happens whenever the stop lands between an ack and
/// the next delivery (see the next test).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_stop_spends_no_delivery_of_a_prefetched_message() {
    use std::sync::{Arc, OnceLock};
    use tokio_util::sync::CancellationToken;
    use urutan::message::Event;
    use urutan::shard::Hooks;

    let env = TestEnv::new("prefetchstop").await;
    let mut settings = env.settings(1);
    settings.prefetch = 2;
    // Stop the pool while K-0 v2 is being handled (v3 is prefetched then).
    let stop: Arc<OnceLock<CancellationToken>> = Arc::default();
    let mut hooks = Hooks::default();
    let trigger = stop.clone();
    hooks.before_apply = Some(Arc::new(move |event: &Event| {
        if event.entity_id == "K-0" && event.versi == 2 {
            if let Some(token) = trigger.get() {
                token.cancel();
            }
            // Let v3 (pushed when v1 was acked) reach the client's buffer.
            std::thread::sleep(Duration::from_millis(200));
        }
    }));
    let pool = RunningPool::start_with(settings.clone(), hooks).await;
    pool.wait_ready().await;
    stop.set(pool.shutdown.clone()).expect("set once");
    let versions = 5;
    env.publisher()
        .await
        .send_all(&interleaved(1, 1, versions))
        .await;
    // The hook stops the pool; stopping it here instead could land before
    // v2 is delivered (a loaded machine), which is the idle case.
    tokio::time::timeout(Duration::from_secs(30), pool.shutdown.cancelled())
        .await
        .expect("K-0 v2 reached the handler within 30 s");
    pool.stop().await;

    let db = env.db().await;
    let done = applied(&db).await;
    assert!(
        (2..versions).contains(&done),
        "{done} applied before the stop"
    );
    let head = head_delivery_counts(&env, 1).await;
    assert_eq!(
        head,
        vec![Some(0)],
        "after a clean stop with {done} of {versions} applied, the next message \
         came back with a delivery spent (x-delivery-count)"
    );

    let pool = RunningPool::start(settings).await;
    wait_applied(&db, versions, Duration::from_secs(30)).await;
    assert_all_applied_once(&env, &db, 1, versions).await;
    pool.stop().await;
}

/// The same with the default `PREFETCH` 1, under load: the stop lands
/// either while a message is handled (fine: the consumer is cancelled before
/// its ack) or while the worker waits for the next one, which the queue may
/// already have handed to this consumer. Three stops, four shards each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_stop_under_load_spends_no_delivery() {
    let env = TestEnv::new("stopunderload").await;
    let (entities, versions) = (100, 20);
    let total = entities as i64 * versions;
    let db = queued_backlog(&env, entities, versions).await;
    let settings = env.settings(4);
    let mut heads = Vec::new();
    for _ in 0..3 {
        let pool = RunningPool::start(settings.clone()).await;
        let before = applied(&db).await;
        wait_applied_at_least(&db, before + 100, Duration::from_secs(60)).await;
        pool.stop().await;
        heads.push(head_delivery_counts(&env, 4).await);
    }
    let done = applied(&db).await;
    assert!(done < total, "the backlog ran out; nothing was tested");

    let pool = RunningPool::start(settings).await;
    wait_applied(&db, total, Duration::from_secs(120)).await;
    assert_all_applied_once(&env, &db, entities, versions).await;
    pool.stop().await;
    assert!(
        heads.iter().flatten().all(|h| *h == Some(0)),
        "x-delivery-count of each shard's next message after each clean stop \
         (anything but 0 is a delivery spent by the stop): {heads:?}"
    );
}
