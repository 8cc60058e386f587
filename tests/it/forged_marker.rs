//! Issue 29, "markers only from urutan": a producer that puts the reserved
//! `x-urutan-epoch` header on its messages (any value, any type, through
//! the entry or the hash exchange) gets them dead-lettered as
//! `reserved_header` and moves no shard's position, so a later resharding
//! over a backlog still keeps every order's versions in order. A marker
//! through the default exchange for an epoch urutan never recorded is
//! refused the same way. `urutan status` flags a position no recorded epoch
//! explains, and old epochs are pruned so reconnects do not grow
//! `urutan_epoch` without bound.

use std::time::Duration;

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString};
use serde_json::Value;
use sqlx::PgPool;
use urutan::reshard::handoff::{self, MARKER_HEADER};

use crate::common::*;

/// Orders of the resharding part (`R-0000` ...).
const ORDERS: usize = 240;

/// One hostile message: where it is published, the marker header's value,
/// the order id it carries, and whether its body looks like a valid event.
struct Forged {
    exchange: &'static str,
    routing_key: &'static str,
    marker: AMQPValue,
    order: String,
    event_body: bool,
}

/// What a producer with write on `pesanan` (and the hash exchange) can send,
/// plus one marker through the default exchange (as only an administrator
/// could) for an epoch urutan never recorded.
fn forged_messages() -> Vec<Forged> {
    let mut all = Vec::new();
    let mut add = |exchange, routing_key, marker: AMQPValue, prefix: &str, n, event_body| {
        for i in 0..n {
            all.push(Forged {
                exchange,
                routing_key,
                marker: marker.clone(),
                order: format!("{prefix}-{i}"),
                event_body,
            });
        }
    };
    let max = AMQPValue::LongLongInt(i64::MAX);
    // Spread over every shard (the hash header decides).
    add("pesanan", "pesanan.forged", max.clone(), "FA", 8, true);
    add("pesanan", "pesanan.forged", max.clone(), "FB", 4, false);
    // Another integer type (urutan used to take it as a marker), a small
    // epoch that IS recorded (not through the default exchange), a string.
    add(
        "pesanan",
        "pesanan.forged",
        AMQPValue::LongUInt(u32::MAX),
        "FC",
        4,
        true,
    );
    add(
        "pesanan",
        "pesanan.forged",
        AMQPValue::LongLongInt(1),
        "FD",
        2,
        true,
    );
    add(
        "pesanan",
        "pesanan.forged",
        AMQPValue::ShortInt(3),
        "FE",
        2,
        true,
    );
    add(
        "pesanan",
        "pesanan.forged",
        AMQPValue::LongString(LongString::from("9223372036854775807")),
        "FF",
        2,
        true,
    );
    // Straight to the hash exchange.
    add("pesanan-hash", "", max.clone(), "FG", 4, true);
    // The default exchange, this shard's queue: the way urutan sends, but
    // an epoch never recorded.
    add("", "pesanan.shard-000", max.clone(), "FH", 1, false);
    add("", "pesanan.shard-001", max, "FI", 1, false);
    all
}

async fn publish_forged(publisher: &Publisher, forged: &[Forged]) {
    let raw = forged.iter().enumerate().map(|(n, f)| {
        let mut headers = FieldTable::default();
        headers.insert(
            "x-pesanan-id".into(),
            AMQPValue::LongString(LongString::from(f.order.as_bytes())),
        );
        headers.insert(MARKER_HEADER.into(), f.marker.clone());
        let body = if f.event_body {
            serde_json::json!({"id": f.order, "status": "dibuat", "versi": 1})
                .to_string()
                .into_bytes()
        } else {
            Vec::new()
        };
        Raw {
            exchange: f.exchange,
            routing_key: f.routing_key,
            props: BasicProperties::default()
                .with_headers(headers)
                .with_delivery_mode(2)
                .with_message_id(format!("forged-{n}").into()),
            body,
        }
    });
    publisher.send_raw(raw.collect()).await;
}

async fn positions(db: &PgPool) -> Vec<(i32, i64)> {
    sqlx::query_as("SELECT shard, epoch FROM urutan_shard ORDER BY shard")
        .fetch_all(db)
        .await
        .expect("positions")
}

async fn publish_round(publisher: &Publisher, versi: i64) {
    let msgs: Vec<Msg> = (0..ORDERS)
        .map(|o| Msg::event(&format!("R-{o:04}"), versi))
        .collect();
    publisher.send_all(&msgs).await;
}

async fn wait_until_at(db: &PgPool, versi: i64) {
    wait_for(
        &format!("every order at v{versi}, nothing parked"),
        Duration::from_secs(120),
        || {
            let db = db.clone();
            async move {
                let (at, parked): (i64, i64) = sqlx::query_as(
                    "SELECT (SELECT count(*) FROM pesanan WHERE id LIKE 'R-%' AND versi = $1),
                            (SELECT count(*) FROM urutan_parkir)",
                )
                .bind(versi)
                .fetch_one(&db)
                .await
                .expect("progress");
                at == ORDERS as i64 && parked == 0
            }
        },
    )
    .await;
}

/// `urutan status --json`: exit code and attention codes.
async fn status_codes(env: &TestEnv) -> (Option<i32>, Vec<String>) {
    let ran = urutan(env, &[], &["status", "--json"]).await;
    let json: Value = serde_json::from_str(&ran.stdout)
        .unwrap_or_else(|e| panic!("status --json is not JSON ({e}):\n{ran}"));
    let codes = json["attention"]
        .as_array()
        .expect("attention")
        .iter()
        .map(|a| a["code"].as_str().expect("code").to_owned())
        .collect();
    (ran.code, codes)
}

/// The whole story in one mode: forged markers dead-lettered without moving
/// a position, then a 2 -> 3 resharding over a backlog in order, then status
/// on a position written by hand.
async fn forged_markers_then_a_resharding(name: &str, prefetch: u16, batch_max: u16) {
    let env = TestEnv::new(name).await;
    let settings = |shards| {
        let mut s = env.settings(shards);
        s.prefetch = prefetch;
        s.batch_max = Some(batch_max);
        s
    };
    let db = env.db().await;
    let publisher = env.publisher().await;
    let pool = RunningPool::start(settings(2)).await;
    pool.wait_ready().await;
    publish_round(&publisher, 1).await;
    wait_until_at(&db, 1).await;
    let before = positions(&db).await;

    let forged = forged_messages();
    publish_forged(&publisher, &forged).await;
    let broker = env.broker().await;
    let dead = drain_dlq_expecting(&broker, forged.len(), Duration::from_secs(60)).await;
    assert_eq!(dead.len(), forged.len(), "every forged message, once");
    let reasons: Vec<(String, i64)> = sqlx::query_as(
        "SELECT reason, count(*) FROM urutan_dead_letter GROUP BY reason ORDER BY reason",
    )
    .fetch_all(&db)
    .await
    .expect("dead-letter records");
    assert_eq!(
        reasons,
        [("reserved_header".to_owned(), forged.len() as i64)],
        "each with its record and reason"
    );
    assert_eq!(positions(&db).await, before, "no shard's position moved");
    let applied = count(&db, "SELECT count(*) FROM pesanan WHERE id LIKE 'F%'").await;
    assert_eq!(applied, 0, "no forged message applied as an event");

    // A backlog on the 2-shard ring, the ring grown to 3 under it, the next
    // versions published into the new ring before any worker runs.
    pool.stop().await;
    publish_round(&publisher, 2).await;
    let grown = urutan(&env, &[("SHARD_COUNT", "3")], &["topology"]).await;
    assert!(grown.ok(), "urutan topology:\n{grown}");
    publish_round(&publisher, 3).await;
    let pool = RunningPool::start(settings(3)).await;
    pool.wait_ready().await;
    wait_until_at(&db, 3).await;
    let history = history(&db).await;
    assert_gapless_in_order(&history, ORDERS, 3);
    let stale = count(
        &db,
        "SELECT count(*) FROM pesan_diproses WHERE message_id LIKE 'R-%'",
    )
    .await;
    assert_eq!(stale, 3 * ORDERS as i64, "every version processed once");

    // Status: every position explained, until one is forged by hand.
    let (_, codes) = status_codes(&env).await;
    assert!(!codes.iter().any(|c| c == "epoch_unexplained"), "{codes:?}");
    sqlx::query("UPDATE urutan_shard SET epoch = $1 WHERE shard = 0")
        .bind(i64::MAX)
        .execute(&db)
        .await
        .expect("forge a position");
    let (code, codes) = status_codes(&env).await;
    assert!(codes.iter().any(|c| c == "epoch_unexplained"), "{codes:?}");
    assert_ne!(code, Some(0), "attention: non-zero exit");
    // A position that is not a recorded epoch (below the highest one).
    sqlx::query(
        "WITH gap AS (DELETE FROM urutan_epoch
                      WHERE epoch = (SELECT max(epoch) - 1 FROM urutan_epoch) RETURNING epoch)
         UPDATE urutan_shard SET epoch = (SELECT epoch FROM gap) WHERE shard IN (0, 1)",
    )
    .execute(&db)
    .await
    .expect("a gap");
    let (_, codes) = status_codes(&env).await;
    let flagged = codes.iter().filter(|c| *c == "epoch_unexplained").count();
    assert_eq!(flagged, 2, "shards 0 and 1: {codes:?}");
    pool.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_markers_are_dead_lettered_and_a_resharding_keeps_order() {
    forged_markers_then_a_resharding("forged_strict", 1, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_markers_are_dead_lettered_in_pipelined_strict_mode() {
    forged_markers_then_a_resharding("forged_pipelined", 16, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_markers_are_dead_lettered_in_batch_mode() {
    forged_markers_then_a_resharding("forged_batch", 32, 32).await;
}

/// The database half on its own: a recorded epoch passes, one above the
/// highest or never recorded does not and moves nothing, one at or below
/// the position (a redelivery, also of a pruned epoch) changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_recorded_epoch_moves_a_position() {
    let env = TestEnv::new("forged_rules").await;
    let db = env.db().await;
    let mut conn = db.acquire().await.expect("conn");
    handoff::register_shards(&mut conn, 2)
        .await
        .expect("register");
    let (e1, _) = handoff::record_epoch(&mut conn, "test").await.expect("e1");
    let (e2, _) = handoff::record_epoch(&mut conn, "test").await.expect("e2");
    drop(conn);
    let pass = |epoch| handoff::pass_recorded_marker(&db, 0, epoch);
    assert!(pass(e1).await.expect("pass"));
    assert!(!pass(i64::MAX).await.expect("pass"), "above the highest");
    assert!(!pass(e2 + 1).await.expect("pass"), "not recorded yet");
    sqlx::query("DELETE FROM urutan_epoch WHERE epoch = $1")
        .bind(e2)
        .execute(&db)
        .await
        .expect("delete");
    assert!(!pass(e2).await.expect("pass"), "not recorded");
    assert_eq!(positions(&db).await, [(0, e1), (1, 0)]);
    sqlx::query("DELETE FROM urutan_epoch WHERE epoch = $1")
        .bind(e1)
        .execute(&db)
        .await
        .expect("delete");
    assert!(
        pass(e1).await.expect("pass"),
        "a redelivery of a pruned one"
    );
    assert!(pass(0).await.expect("pass"), "below the position");
    assert_eq!(positions(&db).await, [(0, e1), (1, 0)]);
}

/// Every (re)connect opens an epoch; the oldest ones every shard has passed
/// are pruned, so the table stays bounded, and the pool still passes its
/// markers afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnects_do_not_grow_the_epoch_table_without_bound() {
    let env = TestEnv::new("forged_prune").await;
    let db = env.db().await;
    let pool = RunningPool::start(env.settings(2)).await;
    pool.wait_ready().await;
    pool.stop().await;
    // Many reconnects' worth of epochs, every shard past them.
    sqlx::query(
        "INSERT INTO urutan_epoch (alasan) SELECT 'relay connected' FROM generate_series(1, 1500)",
    )
    .execute(&db)
    .await
    .expect("epochs");
    sqlx::query("UPDATE urutan_shard SET epoch = (SELECT max(epoch) FROM urutan_epoch)")
        .execute(&db)
        .await
        .expect("passed");
    let kept = handoff::EPOCHS_KEPT as i64;
    for _ in 0..3 {
        let pool = RunningPool::start(env.settings(2)).await;
        pool.wait_ready().await;
        // Every shard passed the newest epoch.
        wait_count(
            &db,
            "SELECT count(*) FROM urutan_shard
                     WHERE epoch < (SELECT max(epoch) FROM urutan_epoch)",
            0,
            Duration::from_secs(30),
        )
        .await;
        pool.stop().await;
        let rows = count(&db, "SELECT count(*) FROM urutan_epoch").await;
        assert!(rows <= kept, "{rows} epochs kept (at most {kept})");
    }
    // An epoch some shard has not passed is never pruned.
    sqlx::query(
        "UPDATE urutan_shard SET epoch = (SELECT min(epoch) FROM urutan_epoch) WHERE shard = 1",
    )
    .execute(&db)
    .await
    .expect("behind");
    let oldest = count(&db, "SELECT min(epoch) FROM urutan_epoch").await;
    let mut conn = db.acquire().await.expect("conn");
    for _ in 0..5 {
        handoff::record_epoch(&mut conn, "test")
            .await
            .expect("epoch");
    }
    drop(conn);
    assert_eq!(
        count(&db, "SELECT min(epoch) FROM urutan_epoch").await,
        oldest
    );
    let (_, codes) = status_codes(&env).await;
    assert!(!codes.iter().any(|c| c == "epoch_unexplained"), "{codes:?}");
}
