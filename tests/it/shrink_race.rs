//! RabbitMQ 3.10's dead-letter supervisor race (issue 12): deleting an
//! at-least-once quorum queue within milliseconds of its leader's election
//! orphans the queue's dead-letter worker, which crashes twice and takes
//! `rabbit_fifo_dlx_sup` down with it; from then on no at-least-once queue
//! can be declared on the node until `rabbitmqctl stop_app && start_app`.
//! Several replicas shrinking at once used to recreate a shard queue another
//! replica had just deleted and delete it again moments later. These tests
//! repeat the shrink with several replicas and then check that the broker
//! can still declare such a queue.
//!
//! `URUTAN_TEST_AMQP_BASE` (with `RABBITMQ_NODENAME` for `rabbitmqctl`)
//! points them at a private broker, to see the race without the fix there
//! instead of breaking the shared one; `URUTAN_SHRINK_CYCLES` repeats more.

use std::time::{Duration, Instant};

use lapin::options::{QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{Connection, ConnectionProperties};
use sqlx::PgPool;
use urutan::broker::{Names, topology};

use crate::common::*;

fn amqp_base() -> String {
    std::env::var("URUTAN_TEST_AMQP_BASE").unwrap_or_else(|_| AMQP_BASE.to_owned())
}

fn amqp_url(env: &TestEnv) -> String {
    format!("{}/{}", amqp_base(), env.vhost.replace('/', "%2f"))
}

fn cycles() -> usize {
    std::env::var("URUTAN_SHRINK_CYCLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4)
}

/// Declares a fresh quorum queue with at-least-once dead-lettering (what
/// the broken supervisor refuses), then deletes it once it had time to
/// settle. Err: the broker's answer.
pub async fn at_least_once_queue_can_be_declared(url: &str) -> Result<(), String> {
    let probe = async {
        let conn = Connection::connect(url, ConnectionProperties::default())
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let ch = conn
            .create_channel()
            .await
            .map_err(|e| format!("channel: {e}"))?;
        let s = |v: &str| AMQPValue::LongString(LongString::from(v.as_bytes()));
        let mut args = FieldTable::default();
        args.insert("x-queue-type".into(), s("quorum"));
        args.insert("x-dead-letter-exchange".into(), s("urutan-probe.dlx"));
        args.insert("x-dead-letter-strategy".into(), s("at-least-once"));
        args.insert("x-overflow".into(), s("reject-publish"));
        let queue = format!("urutan-dlx-probe-{:08x}", rand::random::<u32>());
        let durable = QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        let declared = ch
            .queue_declare(queue.as_str().into(), durable, args)
            .await
            .map_err(|e| format!("declaring an at-least-once quorum queue: {e}"));
        if declared.is_ok() {
            // Never delete a queue whose leader was elected moments ago.
            tokio::time::sleep(Duration::from_secs(1)).await;
            ch.queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                .await
                .map_err(|e| format!("deleting the probe queue: {e}"))?;
        }
        let _ =
            urutan::broker::call("connection.close", conn.close(200, "probe done".into())).await;
        declared.map(|_| ())
    };
    tokio::time::timeout(Duration::from_secs(60), probe)
        .await
        .unwrap_or_else(|_| Err("no answer within 60 s".to_owned()))
}

/// Records, in the test's own database, every shard that turns active
/// again while `urutan_test_fase` says a shrink is running: a replica
/// registered a removed shard after a retirer had deleted its queue (and
/// had usually declared the queue again, for a retirer to delete moments
/// after its leader started: the race).
async fn watch_reactivations(db: &PgPool) {
    for statement in [
        "CREATE TABLE urutan_test_fase (menyusut boolean NOT NULL)",
        "INSERT INTO urutan_test_fase VALUES (false)",
        "CREATE TABLE urutan_test_aktif_lagi (shard int NOT NULL, pada timestamptz DEFAULT now())",
        "CREATE FUNCTION urutan_test_aktif_lagi() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF (SELECT menyusut FROM urutan_test_fase) THEN
                 INSERT INTO urutan_test_aktif_lagi (shard) VALUES (NEW.shard);
             END IF;
             RETURN NEW;
         END $$",
        "CREATE TRIGGER urutan_test_aktif_lagi AFTER UPDATE OF aktif ON urutan_shard
         FOR EACH ROW WHEN (NOT OLD.aktif AND NEW.aktif)
         EXECUTE FUNCTION urutan_test_aktif_lagi()",
    ] {
        sqlx::query(statement).execute(db).await.expect(statement);
    }
}

async fn shrinking(db: &PgPool, yes: bool) {
    sqlx::query("UPDATE urutan_test_fase SET menyusut = $1")
        .bind(yes)
        .execute(db)
        .await
        .expect("phase");
}

async fn ring_history(db: &PgPool) -> Vec<(i32, bool)> {
    sqlx::query_as("SELECT shard_count, selesai IS NOT NULL FROM urutan_ring ORDER BY versi")
        .fetch_all(db)
        .await
        .expect("urutan_ring")
}

/// Runs `urutan topology` asking for `shards` (a shrink allowed).
fn reshard(env: &TestEnv, shards: u16) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_urutan"))
        .arg("topology")
        .envs(env.process_env(shards))
        .env("AMQP_URL", amqp_url(env))
        .env("ALLOW_SHRINK", "true")
        .output()
        .expect("run urutan topology");
    assert!(
        out.status.success(),
        "urutan topology {shards}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn wait_until_complete(env: &TestEnv, db: &PgPool, shards: u16) {
    let what = format!("the ring resharded to {shards} and complete");
    let url = amqp_url(env);
    wait_for(&what, Duration::from_secs(120), || {
        let (db, url) = (db.clone(), url.clone());
        async move {
            if ring_history(&db).await.last() != Some(&(i32::from(shards), true)) {
                return false;
            }
            let Ok(conn) = Connection::connect(&url, ConnectionProperties::default()).await else {
                return false;
            };
            let queues = topology::count_existing_shards(&conn, &Names::new("pesanan")).await;
            let _ =
                urutan::broker::call("connection.close", conn.close(200, "counted".into())).await;
            matches!(queues, Ok(n) if n == shards)
        }
    })
    .await;
}

/// Three replicas follow the ring through repeated grows (4 → 8) and
/// shrinks (8 → 4): each shrink has all three re-declaring the topology and
/// retiring the same four shards at once. Afterwards the broker must still
/// declare an at-least-once quorum queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_shrinks_by_several_replicas_leave_the_dead_letter_supervisor_alive() {
    let env = TestEnv::new("shrink_race").await;
    let db = env.db().await;
    let url = amqp_url(&env);
    at_least_once_queue_can_be_declared(&url)
        .await
        .unwrap_or_else(|e| panic!("{}", broken_broker_before(&e)));
    watch_reactivations(&db).await;
    let settings = || {
        let mut s = env.settings(4);
        s.amqp_url = url.parse().expect("amqp url");
        s.allow_shrink = true;
        s.database_pool_size = Some(3);
        s
    };
    let replicas = vec![
        RunningPool::start(settings()).await,
        RunningPool::start(settings()).await,
        RunningPool::start(settings()).await,
    ];
    wait_for("the first ring", Duration::from_secs(60), || {
        let db = db.clone();
        async move { ring_history(&db).await == [(4, true)] }
    })
    .await;
    let started = Instant::now();
    let cycles = cycles();
    for cycle in 0..cycles {
        shrinking(&db, false).await;
        reshard(&env, 8);
        wait_until_complete(&env, &db, 8).await;
        shrinking(&db, true).await;
        reshard(&env, 4);
        wait_until_complete(&env, &db, 4).await;
        let again: Vec<i32> = sqlx::query_scalar("SELECT shard FROM urutan_test_aktif_lagi")
            .fetch_all(&db)
            .await
            .expect("reactivations");
        assert!(
            again.is_empty(),
            "shrink {} of {cycles}: removed shards {again:?} were registered again after their \
             queue was deleted (a replica's declare raced a retirer's delete)",
            cycle + 1
        );
        if let Err(e) = at_least_once_queue_can_be_declared(&url).await {
            panic!(
                "after shrink {} of {cycles}: the broker no longer declares at-least-once \
                 quorum queues ({e}); its dead-letter supervisor broke (recover with \
                 `rabbitmqctl stop_app && rabbitmqctl start_app`)",
                cycle + 1
            );
        }
    }
    eprintln!(
        "{cycles} grow/shrink cycles with three replicas in {:.1} s; at-least-once queues \
         still declare",
        started.elapsed().as_secs_f64()
    );
    for replica in replicas {
        replica.stop().await;
    }
}

fn broken_broker_before(e: &str) -> String {
    format!(
        "the broker already refuses at-least-once quorum queues before this test ({e}): \
         its dead-letter supervisor is down (RabbitMQ 3.10 race, see deploy/rabbitmq/README.md); \
         recover with `rabbitmqctl stop_app && rabbitmqctl start_app`"
    )
}
