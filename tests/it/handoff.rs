//! Per-entity order across hash-ring changes: the apply / park / release
//! rules on the real database (deterministic: shard positions are moved by
//! hand), then the real thing: a broker restart with a backlog on 12 shards.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use urutan::config::Settings;
use urutan::message::Event;
use urutan::outcome::Outcome;
use urutan::reshard::handoff;
use urutan::store::{self, Applied};

use crate::common::*;

fn event(entity: &str, versi: i64) -> Event {
    Event {
        message_id: format!("{entity}-v{versi}"),
        entity_id: entity.to_owned(),
        status: format!("s{versi}"),
        versi,
        ..Default::default()
    }
}

async fn apply(db: &PgPool, entity: &str, versi: i64, shard: u16) -> Applied {
    store::apply(db, &event(entity, versi), shard)
        .await
        .expect("apply")
}

async fn versions(db: &PgPool, entity: &str) -> Vec<i64> {
    sqlx::query_scalar("SELECT versi FROM pesanan_riwayat WHERE pesanan_id = $1 ORDER BY seq")
        .bind(entity)
        .fetch_all(db)
        .await
        .expect("history")
}

const APPLIED: Applied = Applied::Done(Outcome::Applied);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_entity_waits_for_its_old_shard_and_keeps_order() {
    let env = TestEnv::new("handoff_rules").await;
    let db = env.db().await;
    let mut conn = db.acquire().await.expect("conn");
    handoff::register_shards(&mut conn, 2)
        .await
        .expect("register");
    drop(conn);

    // Epoch 0: K lives on shard 0.
    assert_eq!(apply(&db, "K", 1, 0).await, APPLIED);
    // The ring changes (epoch 1). Shard 1 passes the marker first; shard 0
    // still has K's v2 and v3 queued before its marker.
    handoff::pass_marker(&db, 1, 1).await.expect("marker");
    assert_eq!(
        apply(&db, "K", 4, 1).await,
        Applied::Parked,
        "K moved: wait"
    );
    assert_eq!(apply(&db, "K", 5, 1).await, Applied::Parked, "behind v4");
    // A first version has nothing to wait for, whatever the epoch.
    assert_eq!(apply(&db, "N", 1, 1).await, APPLIED, "a new order's v1");
    assert_eq!(
        apply(&db, "M", 2, 1).await,
        Applied::Parked,
        "M's v1 may be on its way"
    );
    // Not releasable yet: shard 0 has not passed epoch 1.
    assert!(
        handoff::release(&db, 1, 100)
            .await
            .expect("release")
            .is_empty()
    );
    // The old shard drains: older messages go first, despite parked newer
    // ones; once K's v3 is in, its parked v4 is the next version and goes
    // with v5 behind it, before shard 0 has passed the marker.
    assert_eq!(apply(&db, "K", 2, 0).await, APPLIED);
    assert_eq!(apply(&db, "K", 3, 0).await, APPLIED);
    // A redelivery of a parked message is a duplicate.
    assert_eq!(
        apply(&db, "K", 4, 1).await,
        Applied::Done(Outcome::Duplicate)
    );
    let released = handoff::release(&db, 1, 100).await.expect("release");
    let ids: Vec<_> = released.iter().map(|r| r.message_id.as_str()).collect();
    assert_eq!(ids, ["K-v4", "K-v5"], "K's next versions, in version order");
    assert!(released.iter().all(|r| r.result == "applied"));
    assert_eq!(versions(&db, "K").await, vec![1, 2, 3, 4, 5]);
    // M's v2 waits for every shard to pass the epoch.
    handoff::pass_marker(&db, 0, 1).await.expect("marker");
    handoff::pass_marker(&db, 0, 0)
        .await
        .expect("a late marker never moves back");
    let released = handoff::release(&db, 1, 100).await.expect("release");
    assert_eq!(released.len(), 1);
    assert!(released[0].first_of_order && released[0].result == "applied");
    assert_eq!(versions(&db, "M").await, vec![2]);
    assert_eq!(versions(&db, "N").await, vec![1]);
    assert_eq!(handoff::parked(&db, 1).await.expect("parked"), 0);
    // Now in epoch 1 on shard 1: no more waiting.
    assert_eq!(apply(&db, "K", 6, 1).await, APPLIED);
    assert_eq!(apply(&db, "N", 2, 1).await, APPLIED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_message_arriving_after_parked_newer_ones_is_released_first() {
    let env = TestEnv::new("handoff_epochorder").await;
    let db = env.db().await;
    let mut conn = db.acquire().await.expect("conn");
    handoff::register_shards(&mut conn, 3)
        .await
        .expect("register");
    drop(conn);
    assert_eq!(apply(&db, "K", 1, 0).await, APPLIED);
    // Epoch 1 moves K to shard 1; epoch 2 moves it to shard 2. Shard 2 is
    // fastest, shard 1 next; shard 0 lags behind both markers.
    handoff::pass_marker(&db, 2, 2).await.expect("marker");
    assert_eq!(apply(&db, "K", 4, 2).await, Applied::Parked);
    handoff::pass_marker(&db, 1, 1).await.expect("marker");
    assert_eq!(
        apply(&db, "K", 3, 1).await,
        Applied::Parked,
        "older than v4: parked apart"
    );
    assert_eq!(
        apply(&db, "K", 2, 0).await,
        APPLIED,
        "oldest: straight through"
    );
    handoff::pass_marker(&db, 0, 2).await.expect("marker");
    handoff::pass_marker(&db, 1, 2).await.expect("marker");
    let released = handoff::release(&db, 2, 100).await.expect("release");
    assert_eq!(released.len(), 2);
    assert_eq!(
        versions(&db, "K").await,
        vec![1, 2, 3, 4],
        "epoch order, not park order"
    );
}

/// Enqueues `versions` versions for each of `entities` orders through the
/// outbox, round by round (v1 of all, then v2 ...), in small transactions,
/// pausing between rounds, until done or `stop`.
pub(crate) async fn produce(
    db: PgPool,
    entities: usize,
    versions: i64,
    pause: Duration,
    stop: Arc<AtomicBool>,
) -> i64 {
    let mut written = 0;
    for versi in 1..=versions {
        for chunk in (0..entities).collect::<Vec<_>>().chunks(20) {
            if stop.load(Ordering::Relaxed) {
                return written;
            }
            let mut tx = db.begin().await.expect("begin");
            for e in chunk {
                let id = format!("P-{e:04}");
                urutan::outbox::enqueue(
                    &mut tx,
                    &urutan::outbox::NewEvent {
                        agregat_id: &id,
                        status: "s",
                        versi,
                        routing_key: "pesanan.uji",
                        ..Default::default()
                    },
                )
                .await
                .expect("enqueue");
                written += 1;
            }
            tx.commit().await.expect("commit");
        }
        tokio::time::sleep(pause).await;
    }
    written
}

/// Runs a relay in the background until the returned token is cancelled.
pub(crate) fn start_relay(
    settings: urutan::config::Settings,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let stop = CancellationToken::new();
    let relay = urutan::outbox::relay::Relay {
        settings,
        relay: Default::default(),
        after_publish: None,
        health: Default::default(),
    };
    (stop.clone(), tokio::spawn(relay.run(stop)))
}

/// Waits until every outbox row is sent and processed and nothing is
/// parked (and, with `retired`, no shard above 4 is still active).
pub(crate) async fn wait_until_all_applied(db: &PgPool, limit: Duration, retired: bool) {
    let sql = if retired {
        "SELECT (SELECT count(*) FROM outbox WHERE dikirim_pada IS NULL)
              + (SELECT count(*) FROM outbox o WHERE NOT EXISTS
                    (SELECT 1 FROM pesan_diproses d
                     WHERE d.message_id = o.id::text AND d.pesanan_id = o.agregat_id))
              + (SELECT count(*) FROM urutan_parkir)
              + (SELECT count(*) FROM urutan_shard WHERE aktif AND shard >= 5)"
    } else {
        "SELECT (SELECT count(*) FROM outbox WHERE dikirim_pada IS NULL)
              + (SELECT count(*) FROM outbox o WHERE NOT EXISTS
                    (SELECT 1 FROM pesan_diproses d
                     WHERE d.message_id = o.id::text AND d.pesanan_id = o.agregat_id))
              + (SELECT count(*) FROM urutan_parkir)"
    };
    wait_for("every outbox row applied", limit, || {
        let db = db.clone();
        async move { count(&db, sql).await == 0 }
    })
    .await;
}

/// Lets the producer finish, waits until everything is applied, stops the
/// relay and the pools, then checks the promises: every version exactly once,
/// gapless and in order per entity, `verify` clean. Returns the versions written.
pub(crate) async fn drain_and_check(
    db: &PgPool,
    producer: tokio::task::JoinHandle<i64>,
    (relay_stop, relay): (CancellationToken, tokio::task::JoinHandle<()>),
    pools: Vec<RunningPool>,
    entities: usize,
) -> i64 {
    let written = tokio::time::timeout(Duration::from_secs(120), producer)
        .await
        .expect("producer finished")
        .expect("producer");
    wait_until_all_applied(db, Duration::from_secs(180), false).await;
    relay_stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), relay).await;
    for pool in pools {
        pool.stop().await;
    }
    let history = history(db).await;
    assert_eq!(
        history.len() as i64,
        written,
        "every version applied exactly once"
    );
    assert_eq!(assert_every_entity_gapless(&history), entities);
    let report = urutan_ops::verify::verify(db, None).await.expect("verify");
    assert!(report.passed(), "{report}");
    written
}

/// Every entity's history is 1..n in apply order (n may differ per entity).
pub(crate) fn assert_every_entity_gapless(history: &[(String, i64, i32)]) -> usize {
    let mut last: HashMap<&str, i64> = HashMap::new();
    for (entity, versi, _) in history {
        let prev = last.entry(entity).or_insert(0);
        assert_eq!(
            *versi,
            *prev + 1,
            "entity {entity}: {versi} applied after {prev}"
        );
        *prev = *versi;
    }
    last.len()
}

/// A resharding scenario under way: a pool, a relay publishing the outbox,
/// and a producer writing it.
struct UnderLoad {
    pool: RunningPool,
    relay: (CancellationToken, tokio::task::JoinHandle<()>),
    /// Returns the versions written.
    producer: tokio::task::JoinHandle<i64>,
    /// Set, it ends the producer before all its versions.
    stop: Arc<AtomicBool>,
}

/// Starts a pool on `settings` and waits until it is ready (the topology
/// and the shard registry exist), then a relay, then a producer of
/// `versions` versions of `orders` orders, a round every `pause` (see
/// [`produce`]).
async fn under_load(
    db: &PgPool,
    settings: &Settings,
    orders: usize,
    versions: i64,
    pause: Duration,
) -> UnderLoad {
    let pool = RunningPool::start(settings.clone()).await;
    pool.wait_ready().await;
    let relay = start_relay(settings.clone());
    let stop = Arc::new(AtomicBool::new(false));
    let producer = tokio::spawn(produce(db.clone(), orders, versions, pause, stop.clone()));
    UnderLoad {
        pool,
        relay,
        producer,
        stop,
    }
}

/// Orders of the resharding tests under load.
const ORDERS: usize = 200;

/// `env`'s settings for `shards` shards and a database pool of 4 (the
/// pools, the relay and the producer share the test database), shrinking
/// allowed if `allow_shrink`.
fn pool_of_4(env: &TestEnv, shards: u16, allow_shrink: bool) -> Settings {
    let mut s = env.settings(shards);
    s.database_pool_size = Some(4);
    s.allow_shrink = allow_shrink;
    s
}

/// Lets `pool` work for 2 s, stops it, and lets a backlog build for 1.5 s
/// (the relay keeps publishing).
async fn stop_over_a_backlog(pool: RunningPool) {
    tokio::time::sleep(Duration::from_secs(2)).await;
    pool.stop().await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serial_broker_restart_with_a_backlog_keeps_per_entity_order_on_12_shards() {
    broker_restart_with_a_backlog(1, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serial_broker_restart_with_a_backlog_keeps_order_in_batch_mode() {
    broker_restart_with_a_backlog(32, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serial_broker_restart_with_a_backlog_and_two_replicas_keeps_order() {
    broker_restart_with_a_backlog(1, 2).await;
}

/// 300 orders, 16 versions each, published by the relay through a broker
/// restart while the pool is down (a backlog on the old ring), then drained
/// by `replicas` pools. The broker restarts until its ring really changed
/// (on Khepri, 4.2+, once: the ring is kept and nothing may move).
async fn broker_restart_with_a_backlog(prefetch: u16, replicas: usize) {
    let env = TestEnv::new(&format!("handoff_restart_p{prefetch}_r{replicas}")).await;
    let _broker = BrokerStarter;
    let mut settings = env.settings(12);
    settings.prefetch = prefetch;
    settings.database_pool_size = Some(6);
    let db = env.db().await;

    // Topology, shard registry; then the relay publishes a continuous stream:
    // a round a second before, during and after the restarts, until 5 s
    // after the pools are back: however many restarts it takes, every order
    // gets versions on the old ring and on the new one (a fixed 16 rounds
    // ran out during a run of restarts that rebuilt the same ring, and the
    // changed ring then saw no event: "no order moved").
    let load = under_load(&db, &settings, 300, i64::MAX, Duration::from_secs(1)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Build a backlog: no consumers, the relay keeps publishing.
    load.pool.stop().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let ring_changed = restart_broker_until_the_ring_changes(&env);
    // The ring is rebuilt in another order; the relay reconnects (opening an
    // epoch) and goes on publishing into the new ring over the backlog.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let mut pools = Vec::new();
    for _ in 0..replicas {
        pools.push(RunningPool::start(settings.clone()).await);
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    load.stop.store(true, Ordering::Relaxed);
    let written = drain_and_check(&db, load.producer, load.relay, pools, 300).await;
    let moved: i64 = count(
        &db,
        "SELECT count(*) FROM (SELECT pesanan_id FROM pesanan_riwayat
                               GROUP BY pesanan_id HAVING count(DISTINCT shard) > 1) m",
    )
    .await;
    let conn = env.broker().await;
    assert!(drain_dlq(&conn).await.is_empty(), "nothing dead-lettered");
    eprintln!("{written} versions, {moved} of 300 entities changed shard, all in order");
    assert_orders_moved_as_the_ring_did(ring_changed, moved);
}

/// Starts the broker app again if a test stopped it and then failed.
pub(crate) struct BrokerStarter;

impl Drop for BrokerStarter {
    fn drop(&mut self) {
        let _ = command("rabbitmqctl").args(["-q", "start_app"]).output();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn growing_4_to_6_to_9_shards_under_load_keeps_per_entity_order() {
    let env = TestEnv::new("handoff_grow").await;
    let db = env.db().await;
    let settings = |shards| pool_of_4(&env, shards, false);
    let load = under_load(&db, &settings(4), ORDERS, 14, Duration::from_millis(700)).await;
    // Each step: a backlog builds up, then the pool restarts with more
    // shards (appended to the ring) while the relay keeps publishing.
    let mut pool = load.pool;
    for shards in [6, 9] {
        stop_over_a_backlog(pool).await;
        pool = RunningPool::start(settings(shards)).await;
    }
    let written = drain_and_check(&db, load.producer, load.relay, vec![pool], ORDERS).await;
    let on_new_shards = count(
        &db,
        "SELECT count(DISTINCT pesanan_id) FROM pesanan_riwayat WHERE shard >= 4",
    )
    .await;
    assert!(
        on_new_shards > 0,
        "no entity moved to a new shard: the test proved nothing"
    );
    eprintln!(
        "{written} versions; {on_new_shards} of {ORDERS} entities moved to new shards; in order"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shrinking_9_to_5_shards_under_load_drains_and_deletes_the_removed_ones() {
    let env = TestEnv::new("handoff_shrink").await;
    let db = env.db().await;
    let settings = |shards| pool_of_4(&env, shards, true);
    let load = under_load(&db, &settings(9), ORDERS, 12, Duration::from_millis(600)).await;
    stop_over_a_backlog(load.pool).await; // a backlog on all 9
    let pool = RunningPool::start(settings(5)).await;
    wait_until_all_applied(&db, Duration::from_secs(120), true).await;
    // The removed queues are gone (nothing can be left in them) and /readyz
    // does not wait for them.
    let conn = env.broker().await;
    for shard in 5..9 {
        let ch = conn.create_channel().await.expect("channel");
        let probe = ch
            .queue_declare(
                format!("pesanan.shard-{shard:03}").as_str().into(),
                lapin::options::QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                Default::default(),
            )
            .await;
        assert!(probe.is_err(), "shard {shard} was not deleted");
    }
    pool.wait_ready().await;
    let written = drain_and_check(&db, load.producer, load.relay, vec![pool], ORDERS).await;
    let moved_off = count(
        &db,
        "SELECT count(*) FROM (SELECT pesanan_id FROM pesanan_riwayat GROUP BY pesanan_id
                               HAVING max(shard) >= 5 AND min(shard) < 5) m",
    )
    .await;
    assert!(moved_off > 0, "no entity moved off a removed shard");
    assert!(drain_dlq(&conn).await.is_empty(), "nothing dead-lettered");
    eprintln!(
        "{written} versions; {moved_off} of {ORDERS} entities moved off removed shards; in order"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_in_the_middle_of_a_handoff_loses_no_order() {
    let env = TestEnv::new("handoff_kill").await;
    let db = env.db().await;
    let settings = |shards| pool_of_4(&env, shards, false);
    // A stream that goes on until the kill is done: a fixed number of rounds
    // could end before a slow start of the process changed the ring, and then
    // no version of a moved order reaches a new shard and nothing is parked
    // (CI saw "timed out waiting for a handoff in progress").
    let load = under_load(
        &db,
        &settings(4),
        ORDERS,
        i64::MAX,
        Duration::from_millis(700),
    )
    .await;
    stop_over_a_backlog(load.pool).await;
    // Two replicas grow the ring to 6: a process (first, so it is the active
    // consumer) and an in-process standby.
    let mut vars = env.process_env(6);
    vars.push(("RUST_LOG", "warn".to_owned()));
    let process = UrutanProcess::start("run", &vars);
    wait_for("a handoff in progress", Duration::from_secs(90), || {
        let db = db.clone();
        async move { count(&db, "SELECT count(*) FROM urutan_parkir").await > 0 }
    })
    .await;
    let standby = RunningPool::start(settings(6)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(process); // SIGKILL mid-handoff: unacked deliveries come back to the standby
    // A few more rounds reach the standby, then the stream ends.
    tokio::time::sleep(Duration::from_secs(3)).await;
    load.stop.store(true, Ordering::Relaxed);
    let written = drain_and_check(&db, load.producer, load.relay, vec![standby], ORDERS).await;
    eprintln!("{written} versions in order across a SIGKILL during a handoff");
}
