//! The producer side: the transactional outbox, the relay (in-process and the
//! `urutan relay` binary, with a crash between confirm and marking), two
//! relays at once, a broker restart while relaying, the demo, and `verify`
//! itself.
//!
//! `serial_*` tests restart the shared broker; deploy/local/test.sh runs them
//! alone. They start it again from a `Drop` guard, also on panic.

use std::collections::BTreeSet;
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use urutan::config::Settings;
use urutan::health::Health;
use urutan::outbox::relay::{Relay, RelaySettings};
use urutan::outbox::{NewEvent, enqueue};
use urutan::outcome::Outcome;
use urutan::shard::{Hooks, Observed};
use urutan_testkit::scenarios::{BrokerGuard, sh_blocking};

use crate::common::*;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// Keeps this file's broker restart away from this file's other tests when
/// they run in one process (`cargo test --test it relay`): every test holds
/// it shared, the `serial_*` one exclusively. Taken before `TestEnv::new`
/// (which needs the broker) and released after its drop.
static BROKER_IN_USE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

async fn broker_shared() -> tokio::sync::RwLockReadGuard<'static, ()> {
    BROKER_IN_USE.read().await
}

async fn broker_exclusive() -> tokio::sync::RwLockWriteGuard<'static, ()> {
    BROKER_IN_USE.write().await
}

/// An in-process relay (`Relay::run` spawned with its own token).
struct RunningRelay {
    health: Arc<Health>,
    token: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl RunningRelay {
    fn start(settings: Settings) -> Self {
        Self::start_with(settings, RelaySettings::default())
    }

    fn start_with(settings: Settings, relay: RelaySettings) -> Self {
        let health = Arc::new(Health::default());
        let token = CancellationToken::new();
        let task = tokio::spawn(
            Relay {
                settings,
                relay,
                after_publish: None,
                health: health.clone(),
            }
            .run(token.clone()),
        );
        Self {
            health,
            token,
            task: Some(task),
        }
    }

    /// Holding the lock and connected to the broker (a standby is not ready).
    fn is_active(&self) -> bool {
        self.health.is_ready()
    }

    async fn wait_active(&self, limit: Duration) {
        self.wait_until_active_is(true, "the relay to become active", limit)
            .await;
    }

    /// Waits (at most `limit`) until it reports itself not ready: `what`.
    async fn wait_inactive(&self, what: &str, limit: Duration) {
        self.wait_until_active_is(false, what, limit).await;
    }

    async fn wait_until_active_is(&self, active: bool, what: &str, limit: Duration) {
        let health = self.health.clone();
        wait_for(what, limit, || {
            let health = health.clone();
            async move { health.is_ready() == active }
        })
        .await;
    }

    /// Cancels and waits (bounded) for `run` to return.
    async fn stop(mut self) {
        self.token.cancel();
        let task = self.task.take().expect("relay task");
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("relay did not stop within 30 s")
            .expect("relay task panicked");
    }
}

impl Drop for RunningRelay {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

/// `entities` × `versions` events, randomly interleaved across entities but
/// in version order per entity (as one sequential producer would write them).
fn interleaved_plan(prefix: &str, entities: usize, versions: i64) -> Vec<(String, i64)> {
    let mut next: Vec<(String, i64)> = (0..entities)
        .map(|e| (format!("{prefix}-{e:03}"), 1))
        .collect();
    let mut plan = Vec::with_capacity(entities * versions as usize);
    while !next.is_empty() {
        let i = rand::random_range(0..next.len());
        plan.push((next[i].0.clone(), next[i].1));
        next[i].1 += 1;
        if next[i].1 > versions {
            next.swap_remove(i);
        }
    }
    plan
}

/// Writes `plan` in order, 1..=`max_per_tx` events per transaction, pausing
/// `pause` between transactions; bumps `progress` by the events committed.
async fn produce(
    db: &PgPool,
    plan: &[(String, i64)],
    max_per_tx: usize,
    pause: Duration,
    progress: &AtomicUsize,
) -> Vec<i64> {
    let mut ids = Vec::with_capacity(plan.len());
    let mut rest = plan;
    while !rest.is_empty() {
        let n = rand::random_range(1..=max_per_tx).min(rest.len());
        let (now, later) = rest.split_at(n);
        ids.extend(enqueue_tx(db, now).await);
        progress.fetch_add(n, Ordering::SeqCst);
        rest = later;
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
    }
    ids
}

/// Writes rounds (round r = version r of every entity, entities shuffled,
/// `per_tx` events per transaction) until `stop`, always finishing the round
/// in progress. Returns the number of rounds (= versions per entity).
async fn produce_rounds(
    db: PgPool,
    entities: usize,
    per_tx: usize,
    pause: Duration,
    stop: CancellationToken,
) -> i64 {
    let mut round = 0;
    while !stop.is_cancelled() {
        round += 1;
        let mut order: Vec<usize> = (0..entities).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rand::random_range(0..=i));
        }
        let events: Vec<(String, i64)> = order
            .into_iter()
            .map(|e| (format!("R-{e:03}"), round))
            .collect();
        for chunk in events.chunks(per_tx) {
            enqueue_tx(&db, chunk).await;
            tokio::time::sleep(pause).await;
        }
    }
    round
}

async fn unsent(db: &PgPool) -> i64 {
    count(db, "SELECT count(*) FROM outbox WHERE dikirim_pada IS NULL").await
}

/// The versions applied (a count).
const APPLIED: &str = "SELECT count(*) FROM pesanan_riwayat";

async fn applied(db: &PgPool) -> i64 {
    count(db, APPLIED).await
}

/// Waits until `total` versions are applied and no outbox row is unsent.
async fn wait_drained(db: &PgPool, total: i64, limit: Duration) {
    let start = Instant::now();
    loop {
        let (applied, unsent) = (applied(db).await, unsent(db).await);
        if applied == total && unsent == 0 {
            return;
        }
        assert!(
            applied <= total,
            "{applied} versions applied, more than the {total} written"
        );
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?}: {applied} of {total} versions applied, {unsent} outbox rows unsent"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The end state every outbox test wants: every outbox row sent and
/// processed once, each applied version is the outbox row that carried it,
/// nothing dead-lettered, and `verify` passes.
async fn assert_outbox_fully_applied(env: &TestEnv, db: &PgPool, total: i64) {
    assert_eq!(count(db, "SELECT count(*) FROM outbox").await, total);
    assert_eq!(unsent(db).await, 0, "every outbox row has dikirim_pada");
    assert_eq!(
        count(
            db,
            "SELECT count(*) FROM outbox o JOIN pesan_diproses d ON d.message_id = o.id::text"
        )
        .await,
        total,
        "every outbox id was processed"
    );
    assert_eq!(
        count(db, "SELECT count(*) FROM pesan_diproses").await,
        total,
        "no message id other than the outbox ids was processed"
    );
    // message_id = outbox.id and x-pesanan-id = agregat_id (docs/contract.md section 4): the
    // history row of each version names the outbox row that carried it.
    assert_eq!(
        count(
            db,
            "SELECT count(*) FROM pesanan_riwayat r JOIN outbox o
               ON r.message_id = o.id::text AND r.pesanan_id = o.agregat_id
              AND r.versi = (o.payload->>'versi')::bigint
              AND r.status = o.payload->>'status'"
        )
        .await,
        total,
        "each applied version came from its own outbox row"
    );
    assert_eq!(
        count(
            db,
            "SELECT count(*) FROM pesanan
             WHERE status = 'status-' || versi AND (data->>'versi')::bigint = versi"
        )
        .await,
        count(db, "SELECT count(*) FROM pesanan").await,
        "stored state (status and data) is the newest version's"
    );
    let conn = env.broker().await;
    let dead = drain_dlq(&conn).await;
    assert!(dead.is_empty(), "{} message(s) dead-lettered", dead.len());
    let _ = urutan::broker::call("connection.close", conn.close(200, "".into())).await;
    let report = urutan_ops::verify::verify(db, None).await.expect("verify");
    assert!(report.passed(), "{report}");
    assert_eq!(report.sent_outbox_rows, total);
    assert_eq!(report.unsent_outbox_rows, 0);
}

/// Outcomes seen by the pool's hook.
#[derive(Default)]
struct Seen {
    applied: AtomicU64,
    stale: AtomicU64,
    dead: AtomicU64,
    duplicate_ids: Mutex<Vec<String>>,
}

impl Seen {
    fn hooks(self: &Arc<Self>) -> Hooks {
        let seen = self.clone();
        Hooks {
            on_outcome: Some(Arc::new(move |o: &Observed<'_>| match o.outcome {
                Outcome::Applied => {
                    seen.applied.fetch_add(1, Ordering::SeqCst);
                }
                Outcome::Stale => {
                    seen.stale.fetch_add(1, Ordering::SeqCst);
                }
                Outcome::Duplicate => seen
                    .duplicate_ids
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(o.message_id.unwrap_or("").to_owned()),
                Outcome::DeadLettered(_) => {
                    seen.dead.fetch_add(1, Ordering::SeqCst);
                }
            })),
            ..Hooks::default()
        }
    }

    fn duplicates(&self) -> Vec<String> {
        self.duplicate_ids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Drops a database when dropped (the demo's `<db>_demo`), also on panic.
struct DropDatabase(String);

impl Drop for DropDatabase {
    fn drop(&mut self) {
        crate::scratch::drop_database(crate::common::PG_BASE, &self.0);
    }
}

/// Runs `urutan <args>` against `env` for `shards` shards, `vars` on top,
/// stdin closed and its output captured; panics with `late` (`<late> within
/// <limit> s`) if it runs longer than `limit`.
async fn run_urutan(
    env: &TestEnv,
    shards: u16,
    args: &[&str],
    vars: &[(&str, &str)],
    limit: Duration,
    late: &str,
) -> std::process::Output {
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_urutan"))
        .args(args)
        .envs(env.process_env(shards))
        .envs(vars.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(limit, run)
        .await
        .unwrap_or_else(|_| panic!("{late} within {} s", limit.as_secs()))
        .unwrap_or_else(|e| panic!("run urutan {}: {e:?}", args[0]))
}

/// Runs `urutan demo` against `env` for `shards` shards (warnings only, no
/// colour) with `orders` orders, `duplicates`, `stale` and `poison` events
/// injected, and `--timeout` `timeout`; at most a minute more than that.
async fn run_demo(
    env: &TestEnv,
    shards: u16,
    orders: u32,
    duplicates: u32,
    stale: u32,
    poison: u32,
    timeout: Duration,
) -> std::process::Output {
    let knobs = [orders, duplicates, stale, poison].map(|n| n.to_string());
    let timeout_arg = format!("{}s", timeout.as_secs());
    let args = [
        "demo",
        "--orders",
        &knobs[0],
        "--duplicates",
        &knobs[1],
        "--stale",
        &knobs[2],
        "--poison",
        &knobs[3],
        "--timeout",
        &timeout_arg,
    ];
    let vars = [("RUST_LOG", "warn"), ("NO_COLOR", "1")];
    let limit = timeout + Duration::from_secs(60);
    run_urutan(
        env,
        shards,
        &args,
        &vars,
        limit,
        "urutan demo did not finish",
    )
    .await
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_rows_reach_the_worker_and_are_applied() {
    let _shared = broker_shared().await;
    let env = TestEnv::new("outbox").await;
    let pool = RunningPool::start(env.settings(4)).await;
    pool.wait_ready().await;
    let relay = RunningRelay::start(env.settings(4));
    let db = env.db().await;
    let (entities, versions) = (100, 5);
    let total = entities as i64 * versions;
    let plan = interleaved_plan("O", entities, versions);
    let (first, second) = plan.split_at(plan.len() / 2);
    let progress = AtomicUsize::new(0);
    produce(&db, first, 6, Duration::ZERO, &progress).await;

    // A producer transaction that is rolled back: its event never existed.
    let rolled_back_id = {
        let mut tx = db.begin().await.expect("begin");
        let id = enqueue(
            &mut tx,
            &NewEvent {
                agregat_id: "ROLLED-BACK",
                status: "dibuat",
                versi: 1,
                routing_key: "pesanan.jakarta.dibuat",
                ..Default::default()
            },
        )
        .await
        .expect("enqueue");
        tx.rollback().await.expect("rollback");
        id
    };
    // Ids after the rolled-back one (a hole in the sequence) still flow.
    produce(&db, second, 6, Duration::ZERO, &progress).await;

    wait_drained(&db, total, Duration::from_secs(90)).await;
    assert_gapless_in_order(&history(&db).await, entities, versions);
    assert_outbox_fully_applied(&env, &db, total).await;
    assert_eq!(
        count(
            &db,
            "SELECT (SELECT count(*) FROM pesanan WHERE id = 'ROLLED-BACK')
                  + (SELECT count(*) FROM pesanan_riwayat WHERE pesanan_id = 'ROLLED-BACK')
                  + (SELECT count(*) FROM outbox WHERE agregat_id = 'ROLLED-BACK')"
        )
        .await,
        0,
        "the rolled-back event left no trace"
    );
    let processed: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pesan_diproses WHERE message_id = $1)")
            .bind(rolled_back_id.to_string())
            .fetch_one(&db)
            .await
            .expect("query");
    assert!(!processed, "the rolled-back outbox id was never published");
    // The recorder is global to the test process: other tests only add to it.
    let scrape = http_get(pool.http, "/metrics").await.1;
    assert!(
        metric_sum(&scrape, "urutan_outbox_published_total", &[]) >= total as f64,
        "the relay counts what it published"
    );
    relay.stop().await;
    pool.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_killed_between_publish_and_marking_causes_only_a_duplicate() {
    const BATCH: usize = 100;
    let _shared = broker_shared().await;
    let env = TestEnv::new("relaycrash").await;
    let seen = Arc::new(Seen::default());
    let pool = RunningPool::start_with(env.settings(4), seen.hooks()).await;
    pool.wait_ready().await; // the topology exists before anything is published
    let db = env.db().await;
    let (entities, versions) = (100, 5);
    let total = entities as i64 * versions;
    let plan = interleaved_plan("C", entities, versions);
    let ids = produce(&db, &plan, 5, Duration::ZERO, &AtomicUsize::new(0)).await;
    let first_batch: BTreeSet<String> = ids[..BATCH].iter().map(i64::to_string).collect();

    // The binary publishes its first batch, gets every confirm, and aborts
    // before marking the rows sent.
    let batch = BATCH.to_string();
    let out = run_urutan(
        &env,
        4,
        &["relay"],
        &[
            ("URUTAN_FAULT_ABORT_AFTER_PUBLISH", "1"),
            ("RELAY_BATCH", &batch),
            ("NO_COLOR", "1"),
        ],
        Duration::from_secs(60),
        "the faulty relay did not abort",
    )
    .await;
    assert_eq!(
        out.status.signal(),
        Some(6),
        "urutan relay should die of SIGABRT after its first batch, got {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(unsent(&db).await, total, "nothing was marked sent");

    // The broker had confirmed the whole first batch: the pool applies it.
    wait_for(
        "the first batch applied",
        Duration::from_secs(60),
        || async { count(&db, "SELECT count(*) FROM pesan_diproses").await >= BATCH as i64 },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let processed: BTreeSet<String> =
        sqlx::query_scalar::<_, String>("SELECT message_id FROM pesan_diproses")
            .fetch_all(&db)
            .await
            .expect("processed ids")
            .into_iter()
            .collect();
    assert_eq!(
        processed, first_batch,
        "exactly the first batch was published"
    );
    assert!(seen.duplicates().is_empty());

    // A healthy relay takes over (the dead one's lock went with its session).
    let relay = RunningRelay::start(env.settings(4));
    wait_drained(&db, total, Duration::from_secs(90)).await;
    wait_for(
        "the republished first batch seen as duplicates",
        Duration::from_secs(30),
        || async { seen.duplicates().len() >= BATCH },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let duplicates = seen.duplicates();
    let unique: BTreeSet<String> = duplicates.iter().cloned().collect();
    assert_eq!(
        duplicates.len(),
        unique.len(),
        "each republished row is a duplicate once"
    );
    assert_eq!(
        unique, first_batch,
        "the duplicates are exactly the first batch"
    );
    assert_eq!(seen.applied.load(Ordering::SeqCst), total as u64);
    assert_eq!(seen.stale.load(Ordering::SeqCst), 0, "nothing went stale");
    assert_eq!(seen.dead.load(Ordering::SeqCst), 0, "nothing dead-lettered");
    assert_gapless_in_order(&history(&db).await, entities, versions);
    assert_outbox_fully_applied(&env, &db, total).await;
    relay.stop().await;
    pool.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relays_at_once_keep_per_aggregate_order() {
    let _shared = broker_shared().await;
    let env = TestEnv::new("tworelays").await;
    let seen = Arc::new(Seen::default());
    let pool = RunningPool::start_with(env.settings(4), seen.hooks()).await;
    pool.wait_ready().await;
    let db = env.db().await;
    let (entities, versions) = (50, 20);
    let total = entities as i64 * versions;

    let relays = [
        RunningRelay::start(env.settings(4)),
        RunningRelay::start(env.settings(4)),
    ];
    wait_for("one relay active", Duration::from_secs(30), || async {
        relays.iter().any(RunningRelay::is_active)
    })
    .await;
    // Never two active relays: sample both throughout.
    let both_active = Arc::new(AtomicU64::new(0));
    let watch_stop = CancellationToken::new();
    let watcher = {
        let healths = [relays[0].health.clone(), relays[1].health.clone()];
        let (both_active, stop) = (both_active.clone(), watch_stop.clone());
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                if healths.iter().all(|h| h.is_ready()) {
                    both_active.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };

    let progress = Arc::new(AtomicUsize::new(0));
    let producer = {
        let (db, progress) = (db.clone(), progress.clone());
        tokio::spawn(async move {
            let plan = interleaved_plan("T", entities, versions);
            produce(&db, &plan, 4, Duration::from_millis(10), &progress).await
        })
    };
    let half = total as usize / 2;
    wait_for(
        "half of the events written",
        Duration::from_secs(60),
        || async { progress.load(Ordering::SeqCst) >= half },
    )
    .await;
    let [a, b] = relays;
    assert!(
        a.is_active() != b.is_active(),
        "exactly one relay is active"
    );
    let (active, standby) = if a.is_active() { (a, b) } else { (b, a) };
    let sent_before = count(
        &db,
        "SELECT count(*) FROM outbox WHERE dikirim_pada IS NOT NULL",
    )
    .await;
    assert!(sent_before > 0, "the active relay was relaying");
    active.stop().await;
    standby.wait_active(Duration::from_secs(15)).await;
    let written_at_handover = progress.load(Ordering::SeqCst);
    assert!(
        written_at_handover < total as usize,
        "the handover happened while the producer was still writing"
    );

    tokio::time::timeout(Duration::from_secs(120), producer)
        .await
        .expect("producer did not finish within 120 s")
        .expect("producer panicked");
    wait_drained(&db, total, Duration::from_secs(90)).await;
    watch_stop.cancel();
    watcher.await.expect("watcher");
    assert_eq!(
        both_active.load(Ordering::SeqCst),
        0,
        "two relays were active at the same moment"
    );
    assert_gapless_in_order(&history(&db).await, entities, versions);
    assert_eq!(
        seen.stale.load(Ordering::SeqCst),
        0,
        "no version was skipped as stale"
    );
    assert_outbox_fully_applied(&env, &db, total).await;
    standby.stop().await;
    pool.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serial_broker_restart_during_relaying_loses_nothing() {
    let _exclusive = broker_exclusive().await;
    let env = TestEnv::new("relayrestart").await;
    // One shard: a restart reshuffles the hash ring between several shards.
    let seen = Arc::new(Seen::default());
    let pool = RunningPool::start_with(env.settings(1), seen.hooks()).await;
    pool.wait_ready().await;
    let relay = RunningRelay::start(env.settings(1));
    relay.wait_active(Duration::from_secs(30)).await;
    let db = env.db().await;
    let entities = 40;

    let stop_producing = CancellationToken::new();
    let producer = tokio::spawn(produce_rounds(
        db.clone(),
        entities,
        3,
        Duration::from_millis(10),
        stop_producing.clone(),
    ));
    wait_for("relaying under way", Duration::from_secs(60), || async {
        applied(&db).await >= 300
    })
    .await;

    // Declared after `env`, so dropped (broker started) before `env` deletes its vhost.
    let _broker = BrokerGuard;
    let restart = Instant::now();
    sh_blocking("rabbitmqctl", &["-q", "stop_app"]).await;
    relay
        .wait_inactive(
            "the relay not ready with the broker stopped",
            Duration::from_secs(20),
        )
        .await;
    let unsent_during_outage = unsent(&db).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        unsent(&db).await > unsent_during_outage,
        "the producer kept writing while the broker was down"
    );
    sh_blocking("rabbitmqctl", &["-q", "start_app"]).await;
    sh_blocking("rabbitmqctl", &["-q", "--timeout", "120", "await_startup"]).await;
    relay.wait_active(Duration::from_secs(60)).await;
    let back_after = restart.elapsed();
    let applied_after_restart = applied(&db).await;
    wait_for(
        "relaying again after the restart",
        Duration::from_secs(60),
        || async { applied(&db).await >= applied_after_restart + 200 },
    )
    .await;
    stop_producing.cancel();
    let rounds = tokio::time::timeout(Duration::from_secs(60), producer)
        .await
        .expect("producer did not stop within 60 s")
        .expect("producer panicked");

    let total = entities as i64 * rounds;
    wait_drained(&db, total, Duration::from_secs(120)).await;
    assert_gapless_in_order(&history(&db).await, entities, rounds);
    assert_eq!(
        seen.stale.load(Ordering::SeqCst),
        0,
        "no version was skipped as stale"
    );
    assert_outbox_fully_applied(&env, &db, total).await;
    relay.stop().await;
    pool.stop().await;
    eprintln!(
        "broker restart while relaying: {total} events over {rounds} rounds, relay active again \
         {back_after:?} after stop_app, {} duplicate(s)",
        seen.duplicates().len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_runs_end_to_end_and_verifies() {
    let _shared = broker_shared().await;
    let env = TestEnv::new("demo").await;
    let demo_db = format!("{}_demo", env.database);
    let _demo_db = DropDatabase(demo_db.clone());
    let out = run_demo(&env, 4, 150, 20, 20, 4, Duration::from_secs(120)).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "urutan demo failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    for expected in [
        "verification PASSED",
        "== urutan demo report ==",
        "per shard:",
        "dead-lettered (4)",
        "injected: 20 duplicates, ",
        " 4 poison",
        "dead-letter queue holds 4 message(s)",
    ] {
        assert!(
            stdout.contains(expected),
            "no `{expected}` in the demo's output:\n{stdout}"
        );
    }
    // The demo worked in its own database, and every order got there.
    let demo = urutan::store::connect(&env.database_url().with(|u| u.set_path(&demo_db)), 1)
        .await
        .expect("connect the demo database");
    assert_eq!(count(&demo, "SELECT count(*) FROM pesanan").await, 150);
    assert_eq!(
        count(
            &demo,
            "SELECT count(*) FROM outbox WHERE dikirim_pada IS NULL"
        )
        .await,
        0
    );
    demo.close().await;
    assert_eq!(
        count(&env.db().await, "SELECT count(*) FROM pesanan").await,
        0,
        "the demo left the given database alone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_reports_violations() {
    let _shared = broker_shared().await;
    let env = TestEnv::new("verify").await;
    let db = env.db().await;
    let clean = urutan_ops::verify::verify(&db, None).await.expect("verify");
    assert!(clean.passed(), "an empty database passes:\n{clean}");

    // A version applied twice needs the unique constraint out of the way
    // (today's rows are in the default partition: migration 0026).
    sqlx::query(
        "ALTER TABLE pesanan_riwayat_awal DROP CONSTRAINT pesanan_riwayat_pesanan_id_versi_key",
    )
    .execute(&db)
    .await
    .expect("drop constraint");
    let mut sql = String::new();
    let mut outbox = |id: i64, entity: &str, versi: i64, sent: bool| {
        sql.push_str(&format!(
            "INSERT INTO outbox (id, agregat_tipe, agregat_id, routing_key, payload, dikirim_pada)
             VALUES ({id}, 'pesanan', '{entity}', 'pesanan.x',
                     '{{\"id\":\"{entity}\",\"status\":\"s\",\"versi\":{versi}}}', {});\n",
            if sent { "now()" } else { "NULL" }
        ));
    };
    // N: a sent row never processed. P: published up to v2, stored and
    // applied only v1. G: all good (and an unsent v2 that counts for nothing).
    outbox(1, "N", 1, true);
    outbox(2, "P", 1, true);
    outbox(3, "P", 2, true);
    outbox(4, "G", 1, true);
    outbox(5, "G", 2, false);
    sql.push_str(
        "INSERT INTO pesan_diproses (message_id, pesanan_id) VALUES ('2', 'P'), ('3', 'P'), ('4', 'G');
         INSERT INTO pesanan_riwayat (pesanan_id, versi, status, message_id, shard) VALUES
             ('H', 1, 's', 'h1', 0), ('H', 3, 's', 'h3', 0), ('H', 2, 's', 'h2', 0),
             ('N', 1, 's', '1', 0),
             ('P', 1, 's', '2', 0),
             ('X', 1, 'a', 'x1', 0), ('X', 2, 'b', 'x2', 0),
             ('G', 1, 's', '4', 0),
             ('D', 1, 's', 'd1', 0), ('D', 1, 's', 'd1b', 0);
         INSERT INTO pesanan (id, status, versi) VALUES
             ('H', 's', 2), ('N', 's', 1), ('P', 's', 1), ('X', 'b', 1), ('G', 's', 1), ('D', 's', 1);",
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(&db)
        .await
        .expect("insert the broken state");

    let report = urutan_ops::verify::verify(&db, Some(0))
        .await
        .expect("verify");
    assert!(!report.passed(), "violations must fail:\n{report}");
    let violations = |fragment: &str| -> i64 {
        let matching: Vec<_> = report
            .checks
            .iter()
            .filter(|c| c.name.contains(fragment))
            .collect();
        assert_eq!(matching.len(), 1, "one check named like `{fragment}`");
        matching[0].violations
    };
    // P is stored at v1 but was published up to v2.
    assert_eq!(violations("highest version published"), 1, "{report}");
    // H applied 2 after 3; D applied 1 after 1.
    assert_eq!(violations("strictly increases"), 2, "{report}");
    assert_eq!(violations("applied twice"), 1, "{report}");
    // X is stored at v1 although v2 was applied last.
    assert_eq!(violations("last applied version"), 1, "{report}");
    // Outbox row 1 (N) was sent but never processed.
    assert_eq!(violations("sent outbox row was processed"), 1, "{report}");
    // P's v2 was published and never applied.
    assert_eq!(violations("was skipped"), 1, "{report}");
    assert_eq!(report.checks.len(), 6, "every check was run");
    assert_eq!(
        (
            report.entities,
            report.history_rows,
            report.sent_outbox_rows,
            report.unsent_outbox_rows
        ),
        (6, 10, 4, 1)
    );
    let text = report.to_string();
    assert!(text.contains("verification FAILED"), "{text}");
    for offender in [
        "H: versi 2 applied after 3",
        "outbox 1 (N)",
        "P: versi 2 never applied",
    ] {
        assert!(text.contains(offender), "no `{offender}` in:\n{text}");
    }
}

/// `--stale N` should inject N stale events. src/demo/mod.rs `inject` draws one
/// random sample of max(duplicates, stale) sent rows and keeps only those
/// with versi >= 2 for the stale copies, so it usually injects fewer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_injects_as_many_stale_events_as_asked() {
    let _shared = broker_shared().await;
    let env = TestEnv::new("demostale").await;
    let demo_db = format!("{}_demo", env.database);
    let _demo_db = DropDatabase(demo_db);
    let out = run_demo(&env, 2, 30, 0, 20, 0, Duration::from_secs(60)).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "urutan demo failed:\n{stdout}");
    assert!(
        stdout.contains("injected: 0 duplicates, 20 stale, 0 poison"),
        "asked for 20 stale events:\n{stdout}"
    );
    assert!(stdout.contains("stale 20 "), "20 stale outcomes:\n{stdout}");
}

/// Contract §7: `/readyz` (the relay's health) is 200 only while the broker is
/// reachable. An idle relay never touches its channel (src/outbox/relay.rs
/// `session`: the idle loop only SELECTs and waits for NOTIFY), so it keeps
/// reporting ready on a dead connection until the next row must be sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_relay_notices_a_lost_broker_connection() {
    let _shared = broker_shared().await;
    let env = TestEnv::new("relayidle").await;
    let pool = RunningPool::start(env.settings(1)).await;
    pool.wait_ready().await;
    let relay = RunningRelay::start(env.settings(1));
    relay.wait_active(Duration::from_secs(30)).await;
    // Only this test's vhost: other tests' connections are left alone.
    sh_blocking(
        "rabbitmqctl",
        &[
            "-q",
            "close_all_connections",
            "--vhost",
            &env.vhost,
            "relay test",
        ],
    )
    .await;
    relay
        .wait_inactive(
            "the idle relay to report the lost broker connection",
            Duration::from_secs(10),
        )
        .await;
    relay.wait_active(Duration::from_secs(30)).await;
    let db = env.db().await;
    enqueue_tx(&db, &[("IDLE-1".to_owned(), 1)]).await;
    pool.wait_ready().await;
    wait_drained(&db, 1, Duration::from_secs(30)).await;
    relay.stop().await;
    pool.stop().await;
}

/// Issue 29: a row whose routing key no binding matches (written with a plain
/// INSERT, as any producer may) is returned by the broker. It is set aside
/// with its reason, flagged by `status`, and the rows around it (its own
/// order's later one included) are published and applied; the relay keeps
/// running, and clearing the mark retries it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unroutable_outbox_row_is_set_aside_and_blocks_nothing() {
    let _shared = broker_shared().await;
    let env = TestEnv::new("outbox_unroutable").await;
    let pool = RunningPool::start(env.settings(2)).await;
    pool.wait_ready().await;
    let db = env.db().await;
    let insert = |agg: &'static str, versi: i64, key: &'static str| {
        let db = db.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "INSERT INTO outbox (agregat_tipe, agregat_id, routing_key, payload)
                 VALUES ('pesanan', $1, $2,
                         jsonb_build_object('id', $1::text, 'status', 'status-' || $3, 'versi', $3))
                 RETURNING id",
            )
            .bind(agg)
            .bind(key)
            .bind(versi)
            .fetch_one(&db)
            .await
            .expect("insert outbox row")
        }
    };
    insert("U-A", 1, "pesanan.x").await;
    insert("U-B", 1, "pesanan.x").await;
    let bad = insert("U-A", 2, "nowhere.x").await;
    insert("U-A", 3, "pesanan.x").await;
    insert("U-B", 2, "pesanan.x").await;
    let relay = RunningRelay::start(env.settings(2));

    // The good rows applied, the bad one set aside.
    wait_count(&db, APPLIED, 4, Duration::from_secs(60)).await;
    wait_count(
        &db,
        "SELECT count(*) FROM outbox WHERE unroutable_at IS NOT NULL
                   AND unroutable_reason LIKE '%outside `pesanan.#`%'",
        1,
        Duration::from_secs(30),
    )
    .await;
    let (aside, sent): (Option<String>, Option<chrono::DateTime<chrono::Utc>>) =
        sqlx::query_as("SELECT unroutable_reason, dikirim_pada FROM outbox WHERE id = $1")
            .bind(bad)
            .fetch_one(&db)
            .await
            .expect("bad row");
    assert!(aside.is_some() && sent.is_none(), "{aside:?} {sent:?}");
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM outbox WHERE dikirim_pada IS NULL AND unroutable_at IS NULL"
        )
        .await,
        0,
        "every other row was sent"
    );
    let stored: i64 = sqlx::query_scalar("SELECT versi FROM pesanan WHERE id = 'U-A'")
        .fetch_one(&db)
        .await
        .expect("U-A");
    assert_eq!(
        stored, 3,
        "the order's later row overtook the set-aside one"
    );

    let ran = urutan(&env, &[], &["status", "--json"]).await;
    let json: serde_json::Value = serde_json::from_str(&ran.stdout)
        .unwrap_or_else(|e| panic!("status --json is not JSON ({e}):\n{ran}"));
    let codes: Vec<&str> = json["attention"]
        .as_array()
        .expect("attention")
        .iter()
        .filter_map(|a| a["code"].as_str())
        .collect();
    assert!(codes.contains(&"outbox_unroutable"), "{ran}");
    assert_ne!(ran.code, Some(0), "{ran}");
    assert_eq!(json["outbox"]["unroutable"].as_i64(), Some(1), "{ran}");
    assert_eq!(json["outbox"]["unsent"].as_i64(), Some(0), "{ran}");
    let scrape = http_get(pool.http, "/metrics").await.1;
    assert!(metric_sum(&scrape, "urutan_outbox_unroutable_total", &[]) >= 1.0);

    // Still relaying: a new row goes out.
    assert!(relay.is_active(), "the relay is still active");
    insert("U-C", 1, "pesanan.x").await;
    // A later row is applied.
    wait_count(&db, APPLIED, 5, Duration::from_secs(30)).await;

    // The operator fixes the key and clears the mark: it is published (and
    // is stale for its order, whose v3 is stored).
    sqlx::query(
        "UPDATE outbox SET routing_key = 'pesanan.x', unroutable_at = NULL,
                unroutable_reason = NULL WHERE id = $1",
    )
    .bind(bad)
    .execute(&db)
    .await
    .expect("retry");
    wait_for(
        "the retried row to be processed",
        Duration::from_secs(30),
        || {
            let db = db.clone();
            async move {
                sqlx::query_scalar::<_, bool>(
                    "SELECT EXISTS (SELECT 1 FROM pesan_diproses WHERE message_id = $1)",
                )
                .bind(bad.to_string())
                .fetch_one(&db)
                .await
                .expect("processed")
            }
        },
    )
    .await;
    assert_eq!(unsent(&db).await, 0);
    assert_eq!(applied(&db).await, 5, "the retried v2 was stale");
    relay.stop().await;
    pool.stop().await;
}

// ---------------------------------------------------------------------------
// Issue 43: the relay survives any row
// ---------------------------------------------------------------------------

/// Drops the outbox's CHECK constraints (migration 0038) in this test's
/// database, as its owner: a plain INSERT then writes any row, as every
/// producer could before them (and as a database whose constraints were
/// never validated still holds). `IF EXISTS`: the code before them runs the
/// same scenario.
async fn without_outbox_checks(db: &PgPool) {
    sqlx::query(
        "ALTER TABLE outbox DROP CONSTRAINT IF EXISTS outbox_agregat_id_sah,
                            DROP CONSTRAINT IF EXISTS outbox_routing_key_sah,
                            DROP CONSTRAINT IF EXISTS outbox_payload_sah",
    )
    .execute(db)
    .await
    .expect("drop the outbox checks");
}

/// A plain `INSERT INTO outbox` of any row; its id.
async fn insert_raw(db: &PgPool, agregat_id: &str, routing_key: &str, payload: &str) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO outbox (agregat_tipe, agregat_id, routing_key, payload)
         VALUES ('pesanan', $1, $2, $3::jsonb) RETURNING id",
    )
    .bind(agregat_id)
    .bind(routing_key)
    .bind(payload)
    .fetch_one(db)
    .await
    .expect("insert outbox row")
}

fn contract_body(id: &str, versi: i64) -> String {
    serde_json::json!({"id": id, "status": status_of(versi), "versi": versi}).to_string()
}

/// A relay facing `bad` rows (agregat_id, routing key, payload) written
/// between valid ones: it sets each aside with its reason and publishes the
/// five valid rows around them (those of its own order after it included),
/// which are applied; it connected once (one epoch: no reconnect storm) and
/// stays active. Returns the bad rows' ids, in order.
struct Aside {
    env: TestEnv,
    db: PgPool,
    pool: RunningPool,
    relay: RunningRelay,
    bad: Vec<i64>,
}

async fn rows_set_aside_between_valid_ones(name: &str, bad: &[(&str, &str, &str)]) -> Aside {
    let env = TestEnv::new(name).await;
    let pool = RunningPool::start(env.settings(2)).await;
    pool.wait_ready().await;
    let db = env.db().await;
    without_outbox_checks(&db).await;
    insert_raw(&db, "S-A", "pesanan.x", &contract_body("S-A", 1)).await;
    insert_raw(&db, "S-B", "pesanan.x", &contract_body("S-B", 1)).await;
    let mut ids = Vec::new();
    for (agregat_id, key, payload) in bad {
        ids.push(insert_raw(&db, agregat_id, key, payload).await);
    }
    insert_raw(&db, "S-A", "pesanan.x", &contract_body("S-A", 2)).await;
    insert_raw(&db, "S-B", "pesanan.x", &contract_body("S-B", 2)).await;
    insert_raw(&db, "S-C", "pesanan.x", &contract_body("S-C", 1)).await;
    let relay = RunningRelay::start(env.settings(2));

    wait_count(&db, APPLIED, 5, Duration::from_secs(60)).await;
    wait_count(
        &db,
        "SELECT count(*) FROM outbox WHERE dikirim_pada IS NULL AND unroutable_at IS NULL",
        0,
        Duration::from_secs(30),
    )
    .await;
    // A few seconds more: a relay that reconnects would open epochs.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(relay.is_active(), "the relay is still active");
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM urutan_epoch WHERE alasan = 'relay connected'"
        )
        .await,
        1,
        "the relay connected once"
    );
    assert_eq!(
        count(&db, "SELECT count(*) FROM urutan_dead_letter").await,
        0,
        "nothing set aside reached the worker"
    );
    Aside {
        env,
        db,
        pool,
        relay,
        bad: ids,
    }
}

/// The reason code and words of set-aside row `id` (panics if it was sent).
async fn set_aside_reason(db: &PgPool, id: i64) -> (String, String) {
    let (reason, words, sent): (Option<String>, Option<String>, bool) = sqlx::query_as(
        "SELECT alasan_sisih, unroutable_reason, dikirim_pada IS NOT NULL
         FROM outbox WHERE id = $1 AND unroutable_at IS NOT NULL",
    )
    .bind(id)
    .fetch_optional(db)
    .await
    .expect("read the row")
    .unwrap_or_else(|| panic!("outbox row {id} was not set aside"));
    assert!(!sent, "outbox row {id} was sent");
    (reason.unwrap_or_default(), words.unwrap_or_default())
}

/// Issue 43: a 300-byte routing key panicked the relay (a panicking
/// `ShortString` conversion), on every restart. It is set aside as
/// `routing_key_too_long`, and `status`, `explain` and the metrics say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routing_key_over_255_bytes_is_set_aside_and_the_relay_goes_on() {
    let _shared = broker_shared().await;
    let key = format!("pesanan.{}", "k".repeat(292));
    let body = contract_body("S-A", 3);
    let aside = rows_set_aside_between_valid_ones("outbox_long_key", &[("S-A", &key, &body)]).await;
    let (reason, words) = set_aside_reason(&aside.db, aside.bad[0]).await;
    assert_eq!(reason, "routing_key_too_long", "{words}");
    assert!(words.contains("300 bytes"), "{words}");

    let ran = urutan(&aside.env, &[], &["status", "--json"]).await;
    let json: serde_json::Value = serde_json::from_str(&ran.stdout)
        .unwrap_or_else(|e| panic!("status --json is not JSON ({e}):\n{ran}"));
    let codes: Vec<&str> = json["attention"]
        .as_array()
        .expect("attention")
        .iter()
        .filter_map(|a| a["code"].as_str())
        .collect();
    assert!(codes.contains(&"outbox_set_aside"), "{ran}");
    assert_ne!(ran.code, Some(0), "{ran}");
    assert_eq!(json["outbox"]["set_aside"].as_i64(), Some(1), "{ran}");
    assert_eq!(
        json["outbox"]["set_aside_by_reason"][0]["reason"].as_str(),
        Some("routing_key_too_long"),
        "{ran}"
    );
    assert_eq!(json["outbox"]["unsent"].as_i64(), Some(0), "{ran}");

    let ran = urutan(&aside.env, &[], &["explain", "S-A"]).await;
    let line = ran
        .stdout
        .lines()
        .find(|l| l.contains("set-aside"))
        .unwrap_or_else(|| panic!("no set-aside line:\n{ran}"));
    assert!(
        line.starts_with('3')
            && line.contains(&aside.bad[0].to_string())
            && line.contains("routing_key_too_long"),
        "{line}"
    );

    let scrape = http_get(aside.pool.http, "/metrics").await.1;
    assert!(
        metric_sum(
            &scrape,
            "urutan_outbox_set_aside_total",
            &["reason=\"routing_key_too_long\""]
        ) >= 1.0,
        "{scrape}"
    );
    assert!(
        scrape.contains("urutan_outbox_set_aside{reason=\"routing_key_too_long\"}"),
        "the gauge is exported"
    );
    aside.relay.stop().await;
    aside.pool.stop().await;
}

/// Issue 43: a 200 KB `agregat_id` made the broker close the relay's
/// connection (`frame_too_large`); the relay called it "broker unreachable"
/// and reconnected three times a second, an epoch each time. It is set
/// aside as `entity_id_too_long` before anything is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entity_id_of_200_kb_is_set_aside_without_a_reconnect() {
    let _shared = broker_shared().await;
    let id = "X".repeat(200 * 1024);
    let body = contract_body(&id, 1);
    let aside =
        rows_set_aside_between_valid_ones("outbox_huge_id", &[(&id, "pesanan.x", &body)]).await;
    let (reason, words) = set_aside_reason(&aside.db, aside.bad[0]).await;
    assert_eq!(reason, "entity_id_too_long", "{words}");
    assert!(
        words.len() < 200,
        "the reason does not repeat the id: {words}"
    );
    aside.relay.stop().await;
    aside.pool.stop().await;
}

/// Issue 43: a payload that is not a contract body went to the broker and
/// was dead-lettered by the worker; the relay now sets it aside as
/// `payload_invalid` (the worker's own decoder says why).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payload_that_is_not_a_contract_body_is_set_aside() {
    let _shared = broker_shared().await;
    let aside = rows_set_aside_between_valid_ones(
        "outbox_bad_payload",
        &[
            (
                "S-D",
                "pesanan.x",
                r#"{"id": "S-D", "status": "dibuat", "versi": "1"}"#,
            ),
            ("S-E", "pesanan.x", r#"["S-E", "dibuat", 1]"#),
            (
                "S-F",
                "pesanan.x",
                r#"{"id": "someone-else", "status": "dibuat", "versi": 1}"#,
            ),
        ],
    )
    .await;
    for (id, said) in aside.bad.iter().zip(["versi", "JSON object", "differs"]) {
        let (reason, words) = set_aside_reason(&aside.db, *id).await;
        assert_eq!(reason, "payload_invalid", "{words}");
        assert!(words.contains(said), "{words}");
    }
    assert_eq!(
        count(
            &aside.db,
            "SELECT count(*) FROM pesanan WHERE id IN ('S-D', 'S-E', 'S-F')"
        )
        .await,
        0
    );
    aside.relay.stop().await;
    aside.pool.stop().await;
}

/// Issue 43, a filled database: migration 0038 sets aside the unsent rows
/// that break its constraints (so neither the relay nor the validation trips
/// on them), adds the constraints NOT VALID, and `urutan_outbox_sahkan`
/// validates each one no old row breaks; an old sent row keeps its
/// constraint NOT VALID (enforced for new rows all the same) until it goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filled_outbox_survives_the_constraints() {
    let env = TestEnv::new("outbox_checks_filled").await;
    let db = env.db().await;
    without_outbox_checks(&db).await;
    let long_key = format!("pesanan.{}", "k".repeat(292));
    let unsent_bad = insert_raw(&db, "F-A", &long_key, &contract_body("F-A", 1)).await;
    let unsent_bad_body = insert_raw(&db, "F-B", "pesanan.x", r#"{"id": "F-B"}"#).await;
    let sent_bad = insert_raw(&db, &"F".repeat(129), "pesanan.x", "{}").await;
    let good = insert_raw(&db, "F-C", "pesanan.x", &contract_body("F-C", 1)).await;
    sqlx::query("UPDATE outbox SET dikirim_pada = now() WHERE id = $1")
        .bind(sent_bad)
        .execute(&db)
        .await
        .expect("sent");

    // The migration again (it is re-runnable), on this filled outbox.
    sqlx::raw_sql(include_str!(
        "../../migrations/20261207000038_outbox_set_aside.sql"
    ))
    .execute(&db)
    .await
    .expect("migration 0038 on a filled outbox");
    assert_eq!(
        set_aside_reason(&db, unsent_bad).await.0,
        "routing_key_too_long"
    );
    assert_eq!(
        set_aside_reason(&db, unsent_bad_body).await.0,
        "payload_invalid"
    );
    let good_aside: bool =
        sqlx::query_scalar("SELECT unroutable_at IS NOT NULL FROM outbox WHERE id = $1")
            .bind(good)
            .fetch_one(&db)
            .await
            .expect("good row");
    assert!(!good_aside, "a valid row is not set aside");

    let left: Option<i32> = sqlx::query_scalar("SELECT urutan_outbox_sahkan()")
        .fetch_one(&db)
        .await
        .expect("validate");
    assert_eq!(
        left,
        Some(2),
        "the old sent row breaks the id and payload rules"
    );
    let valid = "SELECT count(*) FROM pg_constraint
                 WHERE conrelid = 'outbox'::regclass AND conname LIKE 'outbox\\_%\\_sah' AND convalidated";
    assert_eq!(
        count(&db, valid).await,
        2,
        "routing key and reason validated"
    );
    // New rows are checked all the same.
    let refused = sqlx::query(
        "INSERT INTO outbox (agregat_tipe, agregat_id, routing_key, payload)
         VALUES ('pesanan', repeat('i', 129), 'pesanan.x', '{}')",
    )
    .execute(&db)
    .await
    .expect_err("a NOT VALID constraint still checks new rows");
    assert!(
        refused.to_string().contains("outbox_agregat_id_sah"),
        "{refused}"
    );

    sqlx::query("DELETE FROM outbox WHERE id = $1")
        .bind(sent_bad)
        .execute(&db)
        .await
        .expect("the old row goes");
    let left: Option<i32> = sqlx::query_scalar("SELECT urutan_outbox_sahkan()")
        .fetch_one(&db)
        .await
        .expect("validate");
    assert_eq!(left, Some(0));
    assert_eq!(count(&db, valid).await, 4, "every constraint validated");
}
