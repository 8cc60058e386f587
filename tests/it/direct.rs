//! Per-order order for a producer that publishes straight to the exchange
//! (no outbox, no relay, no pause lock), through everything that moves keys
//! between shards: a broker restart over a backlog while the pool is down, a
//! remap of every key, growing and shrinking `SHARD_COUNT` while it publishes.
//! The only assumption about the producer is the seeds' one: it publishes an
//! order's versions in increasing `versi` (here consecutive, v1, v2, ...).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lapin::options::{ExchangeDeleteOptions, QueueBindOptions};
use lapin::types::FieldTable;
use sqlx::PgPool;

use crate::common::*;
use crate::handoff::BrokerStarter;

/// Publishes version `versi` of orders `D-0000 .. D-{orders-1}`, with
/// confirms, straight to the entry exchange.
async fn publish_round(publisher: &Publisher, orders: usize, versi: i64) {
    let msgs: Vec<Msg> = (0..orders)
        .map(|o| Msg::event(&format!("D-{o:04}"), versi))
        .collect();
    publisher.send_all(&msgs).await;
}

/// Waits until every order reached `versi` and nothing is parked.
async fn wait_until_applied(db: &PgPool, orders: usize, versi: i64) {
    let orders = orders as i64;
    wait_for(
        "every version applied, nothing parked",
        Duration::from_secs(180),
        || {
            let db = db.clone();
            async move {
                let done: i64 = sqlx::query_scalar("SELECT count(*) FROM pesanan WHERE versi = $1")
                    .bind(versi)
                    .fetch_one(&db)
                    .await
                    .expect("count");
                done == orders && count(&db, "SELECT count(*) FROM urutan_parkir").await == 0
            }
        },
    )
    .await;
}

/// Orders whose history spans more than one shard.
async fn moved(db: &PgPool) -> i64 {
    count(
        db,
        "SELECT count(*) FROM (SELECT pesanan_id FROM pesanan_riwayat
                               GROUP BY pesanan_id HAVING count(DISTINCT shard) > 1) m",
    )
    .await
}

/// Every version once, in order, nothing dead-lettered, `urutan verify`'s
/// own check clean.
async fn check(env: &TestEnv, db: &PgPool, orders: usize, versions: i64) {
    assert_gapless_in_order(&history(db).await, orders, versions);
    let conn = env.broker().await;
    assert!(drain_dlq(&conn).await.is_empty(), "nothing dead-lettered");
    let report = urutan_ops::verify::verify(db, Some(0))
        .await
        .expect("verify");
    assert!(report.passed(), "urutan verify: {report:?}");
}

/// The scenario of issue 13, with the pool stopped over a broker restart:
/// v6..v10 of every order wait on the old ring's shards, the producer
/// reconnects first and publishes v11 into the rebuilt ring, then the pool
/// starts and the producer publishes v12. The broker restarts until its
/// ring really changed (on Khepri, 4.2+, once: the ring is kept and nothing
/// may move).
async fn restart_with_a_direct_producer(prefetch: u16) {
    const ORDERS: usize = 300;
    let env = TestEnv::new(&format!("direct_restart_p{prefetch}")).await;
    let _broker = BrokerStarter;
    let mut settings = env.settings(12);
    settings.prefetch = prefetch;
    settings.database_pool_size = Some(6);
    let db = env.db().await;

    let pool = RunningPool::ready(settings.clone()).await;
    let publisher = env.publisher().await;
    for versi in 1..=5 {
        publish_round(&publisher, ORDERS, versi).await;
    }
    wait_until_applied(&db, ORDERS, 5).await;
    // A deploy: the pool is down; v6..v10 of every order wait in the old
    // ring (several versions: the old shards' backlogs differ in length, so
    // a short one reaches an order's new-ring version before a long one
    // reaches its older versions).
    pool.stop().await;
    for versi in 6..=10 {
        publish_round(&publisher, ORDERS, versi).await;
    }
    drop(publisher);
    let ring_changed = restart_broker_until_the_ring_changes(&env);
    // The producer is back first: v11 goes through the rebuilt ring.
    let publisher = env.publisher().await;
    publish_round(&publisher, ORDERS, 11).await;
    let pool = RunningPool::start(settings).await;
    publish_round(&publisher, ORDERS, 12).await;
    wait_until_applied(&db, ORDERS, 12).await;
    pool.stop().await;
    check(&env, &db, ORDERS, 12).await;
    let moved = moved(&db).await;
    eprintln!(
        "{} versions, {moved} of {ORDERS} orders changed shard, all in order",
        ORDERS * 12
    );
    assert_orders_moved_as_the_ring_did(ring_changed, moved);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serial_a_direct_producer_across_a_broker_restart_keeps_order() {
    restart_with_a_direct_producer(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serial_a_direct_producer_across_a_broker_restart_keeps_order_in_batch_mode() {
    restart_with_a_direct_producer(32).await;
}

/// A restart that remaps every key, made without restarting the shared
/// broker: the shard queues are unbound and bound again in reverse order
/// (every key moves), and the sentinel a restart would have dropped is
/// deleted. The pool is down meanwhile, with a backlog on the old ring.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remap_of_every_key_over_a_backlog_keeps_order_for_a_direct_producer() {
    const ORDERS: usize = 200;
    const SHARDS: u16 = 6;
    let env = TestEnv::new("direct_remap").await;
    let mut settings = env.settings(SHARDS);
    settings.database_pool_size = Some(4);
    let db = env.db().await;
    let pool = RunningPool::ready(settings.clone()).await;
    let publisher = env.publisher().await;
    for versi in 1..=4 {
        publish_round(&publisher, ORDERS, versi).await;
    }
    wait_until_applied(&db, ORDERS, 4).await;
    pool.stop().await;
    for versi in 5..=8 {
        publish_round(&publisher, ORDERS, versi).await;
    }

    let conn = env.broker().await;
    let ch = conn.create_channel().await.expect("channel");
    for shard in 0..SHARDS {
        let queue = format!("pesanan.shard-{shard:03}");
        ch.queue_unbind(
            queue.as_str().into(),
            "pesanan-hash".into(),
            "1".into(),
            FieldTable::default(),
        )
        .await
        .expect("unbind");
    }
    for shard in (0..SHARDS).rev() {
        let queue = format!("pesanan.shard-{shard:03}");
        ch.queue_bind(
            queue.as_str().into(),
            "pesanan-hash".into(),
            "1".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("bind");
    }
    ch.exchange_delete("pesanan.alive".into(), ExchangeDeleteOptions::default())
        .await
        .expect("delete the sentinel");

    publish_round(&publisher, ORDERS, 9).await;
    let pool = RunningPool::start(settings).await;
    publish_round(&publisher, ORDERS, 10).await;
    wait_until_applied(&db, ORDERS, 10).await;
    pool.stop().await;
    check(&env, &db, ORDERS, 10).await;
    let moved = moved(&db).await;
    assert!(
        moved > ORDERS as i64 / 2,
        "the remap moved only {moved} orders"
    );
    let windows = count(
        &db,
        "SELECT count(*) FROM urutan_jendela WHERE sebab = 'broker restarted'",
    )
    .await;
    assert!(windows >= 1, "the missing sentinel opened a window");
    eprintln!(
        "{} versions, {moved} of {ORDERS} orders changed shard, all in order",
        ORDERS * 10
    );
}

/// A direct producer publishes without pause while the pool takes the ring
/// 4 → 6 → 9 and then 9 → 5 (restarted with each `SHARD_COUNT`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resharding_under_a_continuous_direct_producer_keeps_order() {
    const ORDERS: usize = 150;
    let env = TestEnv::new("direct_reshard").await;
    let settings = |shards: u16| {
        let mut s = env.settings(shards);
        s.database_pool_size = Some(4);
        s.allow_shrink = true;
        s
    };
    let db = env.db().await;
    let pool = RunningPool::ready(settings(4)).await;
    let stop = Arc::new(AtomicBool::new(false));
    let producer = {
        let publisher = env.publisher().await;
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut versi = 0;
            while !stop.load(Ordering::Relaxed) {
                versi += 1;
                publish_round(&publisher, ORDERS, versi).await;
                // About 250 events a second: under the debug build's
                // capacity even with another test beside it, so each
                // resharding can drain (a producer faster than the pool
                // grows the backlog without end and no ring change ever
                // completes; that is a capacity question, not this test's).
                tokio::time::sleep(Duration::from_millis(600)).await;
            }
            versi
        })
    };
    let mut pool = pool;
    for shards in [6, 9, 5] {
        tokio::time::sleep(Duration::from_secs(2)).await;
        pool.stop().await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        pool = RunningPool::start(settings(shards)).await;
        let started = std::time::Instant::now();
        wait_for("the resharding completed", Duration::from_secs(120), || {
            let db = db.clone();
            async move {
                let done: Option<i64> = sqlx::query_scalar(
                    "SELECT shard_count::bigint FROM urutan_ring
                     WHERE selesai IS NOT NULL ORDER BY versi DESC LIMIT 1",
                )
                .fetch_optional(&db)
                .await
                .expect("ring");
                done == Some(i64::from(shards))
            }
        })
        .await;
        eprintln!(
            "resharding to {shards} completed in {:?}",
            started.elapsed()
        );
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    let versions = tokio::time::timeout(Duration::from_secs(30), producer)
        .await
        .expect("the producer stopped in time")
        .expect("producer task");
    wait_until_applied(&db, ORDERS, versions).await;
    pool.stop().await;
    check(&env, &db, ORDERS, versions).await;
    let moved = moved(&db).await;
    assert!(moved > 0, "no order changed shard: the test proved nothing");
    let windows = count(
        &db,
        "SELECT count(*) FROM urutan_jendela WHERE sebab LIKE 'resharding%'",
    )
    .await;
    assert_eq!(windows, 3, "one window per resharding");
    eprintln!(
        "{} versions through 4 → 6 → 9 → 5, {moved} of {ORDERS} orders changed shard, all in order",
        ORDERS as i64 * versions
    );
}

/// A worker user that may not declare the restart sentinel (configure `^$`,
/// `TOPOLOGY_MODE=check`) still becomes ready and keeps order: it cannot
/// tell a reconnect from a restart, so every connection opens a window,
/// closed by the epoch it opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_refused_the_sentinel_treats_each_connection_as_a_restart() {
    let env = TestEnv::new("direct_nosentinel").await;
    let user = format!("nosentinel-{}", env.name);
    let mut users = BrokerUsers::default();
    users.add(&env, &user, "pw-nosentinel", WORKER_PERMISSIONS);
    let conn = env.broker().await;
    urutan::broker::topology::declare(&conn, &urutan::broker::Names::new("pesanan"), 3, 5, false)
        .await
        .expect("declare");
    conn.create_channel()
        .await
        .expect("channel")
        .exchange_delete("pesanan.alive".into(), ExchangeDeleteOptions::default())
        .await
        .expect("delete the sentinel");
    let mut settings = env.settings(3);
    settings.topology_mode = urutan::config::TopologyMode::Check;
    settings.amqp_url = amqp_url_as(&user, "pw-nosentinel", &env.vhost)
        .parse()
        .expect("url");
    let db = env.db().await;
    for connection in 1..=2 {
        let pool = RunningPool::ready(settings.clone()).await;
        let publisher = env.publisher().await;
        publish_round(&publisher, 20, connection).await;
        wait_until_applied(&db, 20, connection).await;
        pool.stop().await;
        let (windows, open): (i64, i64) = sqlx::query_as(
            "SELECT count(*), count(*) FILTER (WHERE epoch IS NULL)
             FROM urutan_jendela WHERE sebab = 'broker restarted'",
        )
        .fetch_one(&db)
        .await
        .expect("windows");
        assert_eq!(
            (windows, open),
            (connection, 0),
            "one window per connection, each closed by its epoch"
        );
    }
    check(&env, &db, 20, 2).await;
}

/// A window whose opener died before opening the epoch after it (say a
/// `urutan topology` killed half-way, with no relay running to close it) is
/// closed by a running pool within about a minute: it prepares again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_pool_closes_a_window_its_opener_abandoned() {
    let env = TestEnv::new("direct_abandoned").await;
    let db = env.db().await;
    let pool = RunningPool::ready(env.settings(2)).await;
    sqlx::query(
        "INSERT INTO urutan_jendela (sebab, dibuka_pada)
         VALUES ('a test abandoned it', now() - interval '1 minute')",
    )
    .execute(&db)
    .await
    .expect("window");
    wait_for("the pool closed the window", Duration::from_secs(60), || {
        let db = db.clone();
        async move {
            count(
                &db,
                "SELECT count(*) FROM urutan_jendela WHERE sebab = 'a test abandoned it' AND epoch IS NOT NULL",
            )
            .await
                == 1
        }
    })
    .await;
    pool.wait_ready().await;
    let publisher = env.publisher().await;
    publish_round(&publisher, 10, 1).await;
    wait_until_applied(&db, 10, 1).await;
    pool.stop().await;
}
