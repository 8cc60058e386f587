//! Deduplication per order (docs/security.md, "Deduplication per order"): a
//! message id is a `duplicate` only for the order that recorded it; the same
//! id for another order is dead-lettered (`message_id_reused`) with its
//! record, and neither order loses an event to the other.

use std::time::Duration;

use urutan::message::{Event, Rejection};
use urutan::outcome::Outcome;
use urutan::store::{self, Applied};

use crate::common::*;

/// Both orders of arrival on one shard (so the outcomes come in order):
/// the victim first (A recorded M1, then B reuses it) and the attacker
/// first (X records M2, then the victim V's v1 with M2 arrives).
fn streams() -> Vec<Msg> {
    vec![
        Msg::event_with("A", 1, "M1", "dibuat"),
        Msg::event_with("B", 1, "M1", "palsu"),
        Msg::event_with("A", 1, "M1", "dibuat"),
        Msg::event("A", 2),
        Msg::event("B", 1),
        Msg::event("B", 2),
        Msg::event_with("X", 1, "M2", "palsu"),
        Msg::event_with("V", 1, "M2", "dibuat"),
        Msg::event("V", 2),
        Msg::event_with("X", 1, "M2", "palsu"),
    ]
}

async fn reused_ids_are_dead_lettered_and_every_order_keeps_its_events(prefetch: u16) {
    let env = TestEnv::new(&format!("dedup_p{prefetch}")).await;
    let mut settings = env.settings(1);
    settings.prefetch = prefetch;
    let (seen, hooks) = outcome_recorder();
    // Queue everything first, so that batches really form.
    let conn = urutan::broker::connect(&settings.amqp_url, "t")
        .await
        .expect("connect");
    let names = urutan::broker::Names::new("pesanan");
    urutan::broker::topology::declare(&conn, &names, 1, 5, false)
        .await
        .expect("declare");
    let msgs = streams();
    env.publisher().await.send_all(&msgs).await;
    let pool = RunningPool::start_with(settings, hooks).await;
    let (waiting, total) = (seen.clone(), msgs.len());
    wait_for("every delivery settled", Duration::from_secs(60), || {
        let n = waiting.lock().map(|s| s.len()).unwrap_or(0);
        async move { n >= total }
    })
    .await;
    let (_, scrape) = http_get(pool.http, "/metrics").await;
    pool.stop().await;

    let reused = Outcome::DeadLettered(Rejection::MessageIdReused);
    let expected = [
        ("M1", Outcome::Applied),
        ("M1", reused),
        ("M1", Outcome::Duplicate),
        ("A-v2", Outcome::Applied),
        ("B-v1", Outcome::Applied),
        ("B-v2", Outcome::Applied),
        ("M2", Outcome::Applied),
        ("M2", reused),
        ("V-v2", Outcome::Applied),
        ("M2", Outcome::Duplicate),
    ];
    let got = seen.lock().map(|s| s.clone()).unwrap_or_default();
    let got: Vec<(&str, Outcome)> = got.iter().map(|(id, o)| (id.as_str(), *o)).collect();
    assert_eq!(got, expected, "outcomes in arrival order");
    // (At least: the recorder is shared by the pools of tests running at once.)
    let counted = metric_sum(
        &scrape,
        "urutan_dead_letters_total",
        &["reason=\"message_id_reused\""],
    );
    assert!(counted >= 2.0, "counted: {counted}");

    let db = env.db().await;
    let orders: Vec<(String, i64, String)> =
        sqlx::query_as("SELECT id, versi, status FROM pesanan ORDER BY id")
            .fetch_all(&db)
            .await
            .expect("pesanan");
    let order = |id: &str, versi: i64, status: &str| (id.to_owned(), versi, status.to_owned());
    assert_eq!(
        orders,
        [
            order("A", 2, "dibuat"),
            order("B", 2, "dibuat"),
            order("V", 2, "dibuat"),
            order("X", 1, "palsu"),
        ],
        "nothing of one order was written by the other's message"
    );
    let history: Vec<(String, i64, String)> = sqlx::query_as(
        "SELECT pesanan_id, versi, message_id FROM pesanan_riwayat ORDER BY pesanan_id, seq",
    )
    .fetch_all(&db)
    .await
    .expect("history");
    let row = |id: &str, versi: i64, m: &str| (id.to_owned(), versi, m.to_owned());
    assert_eq!(
        history,
        [
            row("A", 1, "M1"),
            row("A", 2, "A-v2"),
            row("B", 1, "B-v1"),
            row("B", 2, "B-v2"),
            row("V", 2, "V-v2"),
            row("X", 1, "M2"),
        ]
    );
    let recorded: Vec<(String, String)> = sqlx::query_as(
        "SELECT message_id, pesanan_id FROM pesan_diproses WHERE message_id IN ('M1', 'M2')
         ORDER BY 1",
    )
    .fetch_all(&db)
    .await
    .expect("diproses");
    let pair = |a: &str, b: &str| (a.to_owned(), b.to_owned());
    assert_eq!(recorded, [pair("M1", "A"), pair("M2", "X")]);
    let records: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT message_id, pesanan_id, reason FROM urutan_dead_letter
         WHERE resolved_at IS NULL ORDER BY message_id",
    )
    .fetch_all(&db)
    .await
    .expect("dead letters");
    let record = |m: &str, o: &str| (m.to_owned(), o.to_owned(), "message_id_reused".to_owned());
    assert_eq!(records, [record("M1", "B"), record("M2", "V")]);

    let dead = drain_dlq_expecting(&env.broker().await, 2, Duration::from_secs(30)).await;
    let mut in_dlq: Vec<(String, String)> = dead
        .iter()
        .map(|d| {
            let body: serde_json::Value =
                serde_json::from_slice(&d.delivery.data).expect("json body");
            let id = d.delivery.properties.message_id().as_ref();
            (
                id.map(|s| s.to_string()).unwrap_or_default(),
                body["id"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    in_dlq.sort();
    assert_eq!(in_dlq, [pair("M1", "B"), pair("M2", "V")], "in the DLQ");
}

/// Strict mode (PREFETCH=1): `urutan_terapkan`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_a_reused_message_id_is_dead_lettered_and_both_orders_keep_their_events() {
    reused_ids_are_dead_lettered_and_every_order_keeps_its_events(1).await;
}

/// Batch mode (PREFETCH=16): `urutan_terapkan_batch`, set-based.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_a_reused_message_id_is_dead_lettered_and_both_orders_keep_their_events() {
    reused_ids_are_dead_lettered_and_every_order_keeps_its_events(16).await;
}

fn event(order: &str, versi: i64, message_id: &str) -> Event {
    Event {
        message_id: message_id.to_owned(),
        entity_id: order.to_owned(),
        status: "s".to_owned(),
        versi,
        ..Default::default()
    }
}

/// A database filled by the previous schema, then migrated: no processed
/// id is lost, each gets the order the history, a parked message or the
/// outbox knows for it; one no order is known for stays a duplicate for
/// every order (as before) until retention purges it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processed_ids_get_their_order_when_migrated() {
    let env = TestEnv::new("dedup_migrate").await;
    let old = store::connect(&env.database_url(), 2)
        .await
        .expect("connect");
    store::MIGRATOR
        .run_to(20261201000011, &old)
        .await
        .expect("the previous schema");
    sqlx::raw_sql(
        "INSERT INTO pesan_diproses (message_id)
             SELECT 'h' || g FROM generate_series(1, 2000) g;
         INSERT INTO pesanan_riwayat (pesanan_id, versi, status, message_id, shard)
             SELECT 'H' || g, 1, 's', 'h' || g, 0 FROM generate_series(1, 2000) g;
         INSERT INTO pesan_diproses (message_id) VALUES ('p1'), ('7'), ('lost');
         INSERT INTO urutan_parkir (pesanan_id, message_id, status, versi, shard, epoch)
             VALUES ('P', 'p1', 's', 3, 0, 0);
         INSERT INTO outbox (id, agregat_tipe, agregat_id, routing_key, payload)
             VALUES (7, 'pesanan', 'O', 'pesanan.s', '{\"id\":\"O\",\"status\":\"s\",\"versi\":1}');",
    )
    .execute(&old)
    .await
    .expect("old rows");
    old.close().await;

    let db = env.db().await; // migrates to the current schema
    assert_eq!(
        count(&db, "SELECT count(*) FROM pesan_diproses").await,
        2003
    );
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM pesan_diproses d JOIN pesanan_riwayat r
                 ON r.message_id = d.message_id AND r.pesanan_id = d.pesanan_id"
        )
        .await,
        2000,
        "from the history"
    );
    let of = |id: &'static str| {
        let db = db.clone();
        async move {
            sqlx::query_scalar::<_, String>(
                "SELECT pesanan_id FROM pesan_diproses WHERE message_id = $1",
            )
            .bind(id)
            .fetch_one(&db)
            .await
            .expect(id)
        }
    };
    assert_eq!(of("p1").await, "P", "from a parked message");
    assert_eq!(of("7").await, "O", "from the outbox");
    assert_eq!(of("lost").await, "", "unknown");

    let reused = Applied::Done(Outcome::DeadLettered(Rejection::MessageIdReused));
    let apply = |order: &'static str, id: &'static str| {
        let db = db.clone();
        async move {
            store::apply(&db, &event(order, 1, id), 0)
                .await
                .expect("apply")
        }
    };
    assert_eq!(apply("H1", "h1").await, Applied::Done(Outcome::Duplicate));
    assert_eq!(apply("other", "h1").await, reused);
    assert_eq!(apply("O", "7").await, Applied::Done(Outcome::Duplicate));
    assert_eq!(apply("other", "7").await, reused);
    assert_eq!(
        apply("anyone", "lost").await,
        Applied::Done(Outcome::Duplicate)
    );
    assert_eq!(apply("N", "new").await, Applied::Done(Outcome::Applied));
    assert_eq!(of("new").await, "N", "a new claim names its order");
    let unnamed = sqlx::query("INSERT INTO pesan_diproses (message_id) VALUES ('x')")
        .execute(&db)
        .await;
    assert!(unnamed.is_err(), "no claim without its order");
}

/// A message handed back to its queue (`urutan_dikembalikan`) makes its
/// order's newer versions wait until it is back or dead-lettered. Another
/// order's message that carries the same id, applied or dead-lettered
/// (here: a contract violation, and a reused id), must not end that wait:
/// the newer version would overtake the returned one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_orders_message_with_the_same_id_does_not_end_a_returned_messages_wait() {
    let env = TestEnv::new("dedup_returned").await;
    let db = env.db().await;
    sqlx::raw_sql(
        "INSERT INTO urutan_dikembalikan (message_id, pesanan_id, versi, shard)
             VALUES ('M', 'A', 1, 0);
         INSERT INTO urutan_dead_letter (delivery_key, message_id, pesanan_id, shard, reason, detail)
             VALUES ('M', 'M', 'B', 0, 'id_mismatch', 'forged'),
                    ('sha256:x', 'M', NULL, 0, 'missing_entity_header', 'forged');",
    )
    .execute(&db)
    .await
    .expect("a returned message, forged dead letters");
    let apply = |order: &'static str, versi: i64, id: &'static str| {
        let db = db.clone();
        async move {
            store::apply(&db, &event(order, versi, id), 0)
                .await
                .expect("apply")
        }
    };
    assert_eq!(apply("B", 1, "M").await, Applied::Done(Outcome::Applied));
    let waiting = "SELECT count(*) FROM urutan_dikembalikan WHERE message_id = 'M'";
    assert_eq!(count(&db, waiting).await, 1, "A's v1 is still awaited");
    assert_eq!(
        apply("A", 2, "A-v2").await,
        Applied::Parked,
        "v2 waits for v1"
    );
    // A's v1 comes back: its id is B's now, so it is dead-lettered, and its
    // own record ends the wait (v2 is then released by the worker).
    assert_eq!(
        apply("A", 1, "M").await,
        Applied::Done(Outcome::DeadLettered(Rejection::MessageIdReused))
    );
    sqlx::query(
        "INSERT INTO urutan_dead_letter (delivery_key, message_id, pesanan_id, shard, reason, detail)
         VALUES ('M-again', 'M', 'A', 0, 'message_id_reused', 'reused')",
    )
    .execute(&db)
    .await
    .expect("A's record");
    assert_eq!(count(&db, waiting).await, 0, "A's own record ends the wait");
}
