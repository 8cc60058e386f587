//! The recorded ring: replicas with different `SHARD_COUNT`s agree through
//! PostgreSQL instead of binding and unbinding shards against each other; a
//! conflicting resharding is refused (`urutan topology`) or waits (`urutan
//! run`); per-entity order holds through rolling grows and shrinks with
//! several replicas and a SIGKILL in the middle of a resharding.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use lapin::types::AMQPValue;
use sqlx::PgPool;
use urutan::broker::{Names, topology};

use crate::common::*;
use crate::handoff::{drain_and_check, produce, start_relay, wait_until_all_applied};
use crate::topology::hash_bindings;

/// (shard_count, complete) of every recorded change, oldest first.
async fn ring_history(db: &PgPool) -> Vec<(i32, bool)> {
    sqlx::query_as("SELECT shard_count, selesai IS NOT NULL FROM urutan_ring ORDER BY versi")
        .fetch_all(db)
        .await
        .expect("urutan_ring")
}

async fn wait_for_ring(db: &PgPool, wanted: &[(i32, bool)], limit: Duration) {
    let what = format!("the recorded ring to become {wanted:?}");
    wait_for(&what, limit, || {
        let db = db.clone();
        async move { ring_history(&db).await == wanted }
    })
    .await;
}

/// Runs `urutan topology` with `shards`; (success, stderr).
fn topology_command(env: &TestEnv, shards: u16) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_urutan"))
        .arg("topology")
        .envs(env.process_env(shards))
        .output()
        .expect("run urutan topology");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topology_refuses_a_conflicting_resharding_and_a_replica_waits_for_it() {
    let env = TestEnv::new("ring_conflict").await;
    let db = env.db().await;
    assert!(topology_command(&env, 4).0, "first declare");
    // 4 → 6 with no worker running: in progress until the shards are drained.
    assert!(topology_command(&env, 6).0, "grow to 6");
    assert_eq!(ring_history(&db).await, [(4, true), (6, false)]);

    let (ok, stderr) = topology_command(&env, 8);
    assert!(!ok, "a conflicting resharding was granted");
    assert!(
        stderr.contains("SHARD_COUNT is 8 but a resharding 4 → 6 is in progress")
            && stderr.contains("`urutan topology` on"),
        "unclear refusal: {stderr}"
    );
    assert_eq!(ring_history(&db).await.len(), 2, "nothing recorded");

    // A replica asking for 8 waits: it follows 6 (draining it), then grows.
    let pool = RunningPool::start(env.settings(8)).await;
    wait_for_ring(
        &db,
        &[(4, true), (6, true), (8, true)],
        Duration::from_secs(60),
    )
    .await;
    let conn = env.broker().await;
    let names = Names::new("pesanan");
    let queues = topology::count_existing_shards(&conn, &names)
        .await
        .expect("count");
    assert_eq!(queues, 8);
    let scrape = http_get(pool.http, "/metrics").await.1;
    assert!(
        metric_sum(&scrape, "urutan_resharding_duration_seconds_count", &[]) >= 2.0,
        "both reshardings timed: {scrape}"
    );
    pool.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_with_different_shard_counts_follow_one_ring_through_grows_and_a_shrink() {
    let env = TestEnv::new("ring_replicas").await;
    let db = env.db().await;
    let settings = |shards: u16, allow_shrink: bool| {
        let mut s = env.settings(shards);
        s.database_pool_size = Some(3);
        s.allow_shrink = allow_shrink;
        s
    };
    let old_a = RunningPool::start(settings(4, false)).await;
    let old_b = RunningPool::start(settings(4, true)).await;
    old_a.wait_ready().await;
    let (relay_stop, relay) = start_relay(settings(4, false));
    let producer = tokio::spawn(produce(
        db.clone(),
        200,
        20,
        Duration::from_millis(700),
        Arc::new(AtomicBool::new(false)),
    ));
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Rolling deploy to 6: the new replica grows the ring; the old ones
    // (one even with --allow-shrink) follow it instead of shrinking it back,
    // also when restarted with their old setting.
    let new_6 = RunningPool::start(settings(6, false)).await;
    wait_for_ring(&db, &[(4, true), (6, true)], Duration::from_secs(60)).await;
    old_b.stop().await;
    let old_b = RunningPool::start(settings(4, true)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(ring_history(&db).await, [(4, true), (6, true)], "a fight");
    assert_eq!(hash_bindings(&env).len(), 6, "shards bound");

    // Rolling deploy to 9, then a shrink to 5 by a process killed (SIGKILL)
    // in the middle of it: the replicas left (4, 4, 6, 9: all counts the
    // ring had) follow 5 and finish the retirement.
    let new_9 = RunningPool::start(settings(9, false)).await;
    wait_for_ring(
        &db,
        &[(4, true), (6, true), (9, true)],
        Duration::from_secs(60),
    )
    .await;
    let mut vars = env.process_env(5);
    vars.extend([
        ("ALLOW_SHRINK", "true".to_owned()),
        ("DATABASE_POOL_SIZE", "3".to_owned()),
        ("RUST_LOG", "warn".to_owned()),
    ]);
    let shrinker = UrutanProcess::start("run", &vars);
    wait_for("the shrink recorded", Duration::from_secs(30), || {
        let db = db.clone();
        async move { ring_history(&db).await.len() == 4 }
    })
    .await;
    drop(shrinker);
    wait_for_ring(
        &db,
        &[(4, true), (6, true), (9, true), (5, true)],
        Duration::from_secs(120),
    )
    .await;
    wait_until_all_applied(&db, Duration::from_secs(120), true).await;
    let conn = env.broker().await;
    let names = Names::new("pesanan");
    let queues = topology::count_existing_shards(&conn, &names)
        .await
        .expect("count");
    assert_eq!(queues, 5, "the removed queues are deleted");
    assert_eq!(hash_bindings(&env).len(), 5, "shards bound");
    let pools = vec![old_a, old_b, new_6, new_9];
    let written = drain_and_check(&db, producer, (relay_stop, relay), pools, 200).await;
    assert_eq!(
        ring_history(&db).await,
        [(4, true), (6, true), (9, true), (5, true)],
        "one change per resharding: nobody fought"
    );
    assert!(drain_dlq(&conn).await.is_empty(), "nothing dead-lettered");
    eprintln!("{written} versions in order through 4 → 6 → 9 → 5 with four replicas");
}

/// A process that dies between changing the bindings and opening the epoch
/// after them leaves a window without an epoch (`urutan_jendela`); the relay's next batch opens
/// the epoch itself, so its markers precede every message it publishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ring_change_cut_short_is_marked_by_the_relay_before_it_publishes() {
    use futures::StreamExt;
    use lapin::options::{BasicAckOptions, BasicConsumeOptions};
    let env = TestEnv::new("ring_cut_short").await;
    let db = env.db().await;
    assert!(topology_command(&env, 2).0, "declare");
    let (relay_stop, relay) = start_relay(env.settings(2));
    wait_for("the relay connected", Duration::from_secs(30), || {
        let db = db.clone();
        async move {
            count(
                &db,
                "SELECT count(*) FROM urutan_epoch WHERE alasan = 'relay connected'",
            )
            .await
                == 1
        }
    })
    .await;
    // The crash, as the pool would leave it.
    sqlx::query("INSERT INTO urutan_jendela (sebab) VALUES ('a test cut it short')")
        .execute(&db)
        .await
        .expect("flag");
    let producer = tokio::spawn(produce(
        db.clone(),
        10,
        2,
        Duration::from_millis(10),
        Arc::new(AtomicBool::new(false)),
    ));
    assert_eq!(producer.await.expect("producer"), 20);
    wait_for("everything published", Duration::from_secs(30), || {
        let db = db.clone();
        async move {
            count(
                &db,
                "SELECT count(*) FROM outbox WHERE dikirim_pada IS NULL",
            )
            .await
                == 0
        }
    })
    .await;
    relay_stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), relay).await;
    let cut_short: i64 = sqlx::query_scalar(
        "SELECT epoch FROM urutan_epoch WHERE alasan = 'a ring change was cut short'",
    )
    .fetch_one(&db)
    .await
    .expect("the relay opened an epoch for the cut-short change");
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM urutan_jendela WHERE epoch IS NULL"
        )
        .await,
        0
    );

    // In each shard queue, that marker comes before every event.
    let conn = env.broker().await;
    let mut events = 0;
    for shard in ["pesanan.shard-000", "pesanan.shard-001"] {
        let ch = conn.create_channel().await.expect("channel");
        let mut consumer = ch
            .basic_consume(
                shard.into(),
                "check".into(),
                BasicConsumeOptions::default(),
                Default::default(),
            )
            .await
            .expect("consume");
        let mut marker_seen = false;
        while let Ok(Some(delivery)) =
            tokio::time::timeout(Duration::from_secs(2), consumer.next()).await
        {
            let delivery = delivery.expect("delivery");
            let headers = delivery.properties.headers().clone().unwrap_or_default();
            match headers.inner().get("x-urutan-epoch") {
                Some(AMQPValue::LongLongInt(e)) if *e == cut_short => marker_seen = true,
                Some(_) => {}
                None => {
                    assert!(marker_seen, "an event on {shard} ahead of the marker");
                    events += 1;
                }
            }
            delivery
                .acker
                .ack(BasicAckOptions::default())
                .await
                .expect("ack");
        }
        let _ = urutan::broker::call("channel.close", ch.close(200, "checked".into())).await;
    }
    assert_eq!(events, 20, "every event found behind the marker");
}
