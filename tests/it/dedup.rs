//! Deduplication per (entity id, message id) (contract sections 2-4,
//! docs/security.md "Deduplication per order"): a message id is a
//! `duplicate` only for the order that recorded it; the same id on another
//! order is another message, applied on its own (strict, batch, parked,
//! released, across day partitions), so no producer can pre-empt or
//! suppress another order's event by taking its id. `message_id_reused` is
//! retired (migration 0037).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::PgPool;
use urutan::config::GapPolicy;
use urutan::handler::{Handler, HandlerError, HandlerEvent, SharedHandler};
use urutan::message::Event;
use urutan::outcome::Outcome;
use urutan::store::{self, Applied};

use crate::common::*;
use crate::handoff::start_relay;

/// The previous schema of the filled-database test (before dedup per order).
const BEFORE_PER_ENTITY: i64 = 20261205000036;

/// Both orders of arrival on one shard (so the outcomes come in order): A
/// takes M1 first, then B uses it; X takes M2 first, then V's v1 uses it.
/// A redelivery of one (order, id) stays a duplicate, even as a newer
/// version.
fn streams() -> Vec<Msg> {
    vec![
        Msg::event_with("A", 1, "M1", "dibuat"),
        Msg::event_with("B", 1, "M1", "dibuat"),
        Msg::event_with("A", 1, "M1", "dibuat"),
        Msg::event_with("B", 1, "M1", "dibuat"),
        Msg::event("A", 2),
        Msg::event_with("B", 2, "M1", "dikirim"),
        Msg::event("B", 2),
        Msg::event_with("X", 1, "M2", "palsu"),
        Msg::event_with("V", 1, "M2", "dibuat"),
        Msg::event("V", 2),
        Msg::event_with("X", 1, "M2", "palsu"),
    ]
}

/// The topology of `shards` shards, declared before the pool starts (so
/// nothing published first is unroutable).
async fn declared(settings: &urutan::config::Settings, shards: u16) {
    let conn = urutan::broker::connect(&settings.amqp_url, "t")
        .await
        .expect("connect");
    let names = urutan::broker::Names::new("pesanan");
    urutan::broker::topology::declare(&conn, &names, shards, 5, false)
        .await
        .expect("declare");
}

async fn settled(seen: &Outcomes, total: usize) {
    let seen = seen.clone();
    wait_for("every delivery settled", Duration::from_secs(60), || {
        let n = seen.lock().map(|s| s.len()).unwrap_or(0);
        async move { n >= total }
    })
    .await;
}

/// No dead letter: no record, nothing in the DLQ.
async fn assert_nothing_dead_lettered(env: &TestEnv, db: &PgPool) {
    assert_eq!(
        count(db, "SELECT count(*) FROM urutan_dead_letter").await,
        0,
        "dead-letter records"
    );
    let conn = env.broker().await;
    assert_eq!(queue_len(&conn, "pesanan.dlq").await, 0, "pesanan.dlq");
}

async fn shared_ids_are_applied_for_each_order(prefetch: u16) {
    let env = TestEnv::new(&format!("dedup_p{prefetch}")).await;
    let mut settings = env.settings(1);
    settings.prefetch = prefetch;
    let (seen, hooks) = outcome_recorder();
    // Queue everything first, so that batches really form.
    declared(&settings, 1).await;
    let msgs = streams();
    env.publisher().await.send_all(&msgs).await;
    let pool = RunningPool::start_with(settings, hooks).await;
    settled(&seen, msgs.len()).await;
    pool.stop().await;

    let expected = [
        ("M1", Outcome::Applied),
        ("M1", Outcome::Applied),
        ("M1", Outcome::Duplicate),
        ("M1", Outcome::Duplicate),
        ("A-v2", Outcome::Applied),
        ("M1", Outcome::Duplicate),
        ("B-v2", Outcome::Applied),
        ("M2", Outcome::Applied),
        ("M2", Outcome::Applied),
        ("V-v2", Outcome::Applied),
        ("M2", Outcome::Duplicate),
    ];
    let got = seen.lock().map(|s| s.clone()).unwrap_or_default();
    let got: Vec<(&str, Outcome)> = got.iter().map(|(id, o)| (id.as_str(), *o)).collect();
    assert_eq!(
        got, expected,
        "outcomes in arrival order (prefetch {prefetch})"
    );

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
            row("B", 1, "M1"),
            row("B", 2, "B-v2"),
            row("V", 1, "M2"),
            row("V", 2, "V-v2"),
            row("X", 1, "M2"),
        ]
    );
    let recorded: Vec<(String, String)> = sqlx::query_as(
        "SELECT message_id, pesanan_id FROM pesan_diproses WHERE message_id IN ('M1', 'M2')
         ORDER BY 1, 2",
    )
    .fetch_all(&db)
    .await
    .expect("diproses");
    let pair = |a: &str, b: &str| (a.to_owned(), b.to_owned());
    assert_eq!(
        recorded,
        [
            pair("M1", "A"),
            pair("M1", "B"),
            pair("M2", "V"),
            pair("M2", "X")
        ],
        "one claim per (message id, order)"
    );
    assert_nothing_dead_lettered(&env, &db).await;
}

/// Strict mode (PREFETCH=1): `urutan_terapkan`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_the_same_message_id_on_two_orders_is_applied_for_each() {
    shared_ids_are_applied_for_each_order(1).await;
}

/// Batch mode (PREFETCH=16): `urutan_terapkan_batch`, set-based (both
/// orders' copies of one id in one batch).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_the_same_message_id_on_two_orders_is_applied_for_each() {
    shared_ids_are_applied_for_each_order(16).await;
}

/// The attack of issue 43: a producer that may only publish to the entry
/// exchange sends events of its OWN entity with the message ids the
/// outbox will give next ("1".."50"). A victim then enqueues 10 events
/// with `urutan_enqueue` (the least-privilege producer role) and the relay
/// publishes them as message ids "1".."10": every one is applied, none is
/// dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_producer_cannot_take_the_outboxs_future_message_ids() {
    let env = TestEnv::new("dedup_attack").await;
    let db = env.db().await;
    let mut settings = env.settings(2);
    settings.prefetch = 8;
    let pool = RunningPool::ready(settings.clone()).await;

    let mut users = BrokerUsers::default();
    let attacker = format!("attacker-{}", env.name);
    users.add(&env, &attacker, "pw-attacker", ["^$", "^pesanan$", "^$"]);
    let claims: Vec<Msg> = (1..=50)
        .map(|n| Msg::event_with("ATTACKER", n, &n.to_string(), "palsu"))
        .collect();
    env.publisher_as(&attacker, "pw-attacker")
        .await
        .send_all(&claims)
        .await;
    wait_stored(&db, "ATTACKER", 50).await;
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM pesan_diproses
             WHERE pesanan_id = 'ATTACKER' AND message_id ~ '^[0-9]+$'"
        )
        .await,
        50,
        "the ids 1..50 are claimed, for the attacker's entity"
    );

    let roles = PgRoles::create(&env, &[]);
    let producer = store::connect(&roles.secret_url("producer"), 1)
        .await
        .expect("connect as the producer");
    let mut ids = Vec::new();
    for versi in 1..=10_i64 {
        let id: i64 = sqlx::query_scalar("SELECT urutan_enqueue('VICTIM', 'dibayar', $1)")
            .bind(versi)
            .fetch_one(&producer)
            .await
            .expect("urutan_enqueue");
        ids.push(id);
    }
    producer.close().await;
    assert_eq!(ids, (1..=10).collect::<Vec<i64>>(), "the ids taken before");
    let (relay_stop, relay) = start_relay(settings);
    wait_stored(&db, "VICTIM", 10).await;
    relay_stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), relay).await;
    pool.stop().await;

    let applied: Vec<(i64, String)> = sqlx::query_as(
        "SELECT versi, message_id FROM pesanan_riwayat WHERE pesanan_id = 'VICTIM' ORDER BY seq",
    )
    .fetch_all(&db)
    .await
    .expect("the victim's history");
    let expected: Vec<(i64, String)> = (1..=10).map(|v| (v, v.to_string())).collect();
    assert_eq!(
        applied, expected,
        "all 10 applied, in order, by their outbox ids"
    );
    assert_eq!(stored(&db, "ATTACKER").await, Some(50));
    assert_nothing_dead_lettered(&env, &db).await;
    let report = urutan_ops::verify::verify(&db, Some(0))
        .await
        .expect("verify");
    assert!(report.passed(), "urutan verify:\n{report}");
}

/// Records each call of the Rust handler: (order, message id, version).
#[derive(Default)]
struct Calls(Mutex<Vec<(String, String, i64)>>);

impl Handler for Calls {
    async fn handle(
        &self,
        _tx: &mut sqlx::PgConnection,
        event: &HandlerEvent,
    ) -> Result<(), HandlerError> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push((
            event.id.clone(),
            event.message_id.clone(),
            event.versi,
        ));
        Ok(())
    }
}

/// A version parked behind a gap (`GAP_POLICY=wait`) whose id another order
/// already applied: parked (not dead-lettered), its redelivery a duplicate,
/// released and applied when the gap closes. With a Rust handler the
/// release goes one version at a time (`release_one_by_one`), taking the
/// order from `urutan_lepas` (the id alone names two claims).
async fn a_parked_version_shares_its_id_with_another_order(rust_handler: bool) {
    let env = TestEnv::new(&format!("dedup_parked_{rust_handler}")).await;
    let db = env.db().await;
    let mut settings = env.settings(1);
    settings.gap_policy = GapPolicy::Wait;
    let (seen, hooks) = outcome_recorder();
    declared(&settings, 1).await;
    let calls = Arc::new(Calls::default());
    let handler: Option<SharedHandler> = rust_handler.then(|| calls.clone() as SharedHandler);
    let pool = RunningPool::start_with_handler(settings, hooks, handler).await;
    let publisher = env.publisher().await;

    publisher
        .send_all(&[
            Msg::event_with("B", 1, "G3", "dibuat"),
            Msg::event_with("A", 1, "A1", "dibuat"),
            Msg::event_with("A", 3, "G3", "dikirim"),
        ])
        .await;
    wait_count(
        &db,
        "SELECT count(*) FROM urutan_parkir WHERE pesanan_id = 'A' AND message_id = 'G3'",
        1,
        Duration::from_secs(30),
    )
    .await;
    publisher
        .send_all(&[Msg::event_with("A", 3, "G3", "dikirim")])
        .await;
    settled(&seen, 3).await;
    publisher
        .send_all(&[Msg::event_with("A", 2, "A2", "dibayar")])
        .await;
    wait_stored(&db, "A", 3).await;
    settled(&seen, 5).await;
    pool.stop().await;

    let got = seen.lock().map(|s| s.clone()).unwrap_or_default();
    let got: Vec<(&str, Outcome)> = got.iter().map(|(id, o)| (id.as_str(), *o)).collect();
    assert_eq!(
        got,
        [
            ("G3", Outcome::Applied),
            ("A1", Outcome::Applied),
            ("G3", Outcome::Duplicate),
            ("A2", Outcome::Applied),
            ("G3", Outcome::Applied),
        ],
        "B's G3, A's v1, A's parked G3 again, A's v2, A's G3 released"
    );
    let history: Vec<(String, i64, String)> =
        sqlx::query_as("SELECT pesanan_id, versi, message_id FROM pesanan_riwayat ORDER BY seq")
            .fetch_all(&db)
            .await
            .expect("history");
    let row = |id: &str, versi: i64, m: &str| (id.to_owned(), versi, m.to_owned());
    assert_eq!(
        history,
        [
            row("B", 1, "G3"),
            row("A", 1, "A1"),
            row("A", 2, "A2"),
            row("A", 3, "G3"),
        ]
    );
    if rust_handler {
        let calls = calls.0.lock().map(|c| c.clone()).unwrap_or_default();
        let call = |id: &str, m: &str, versi: i64| (id.to_owned(), m.to_owned(), versi);
        assert_eq!(
            calls,
            [
                call("B", "G3", 1),
                call("A", "A1", 1),
                call("A", "A2", 2),
                call("A", "G3", 3),
            ],
            "one handler call per applied version, the released one included"
        );
    }
    assert_eq!(count(&db, "SELECT count(*) FROM urutan_parkir").await, 0);
    assert_nothing_dead_lettered(&env, &db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_version_whose_id_another_order_applied_is_released() {
    a_parked_version_shares_its_id_with_another_order(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_rust_handler_a_parked_version_whose_id_another_order_applied_is_released() {
    a_parked_version_shares_its_id_with_another_order(true).await;
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

/// A database filled by the schema before dedup per order (migration
/// 0011), then migrated: no processed id is lost, each gets the order the
/// history, a parked message or the outbox knows for it; one no order is
/// known for (`''`) stays a duplicate for every order whose stored version
/// it could be, until retention purges it.
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
         INSERT INTO pesanan (id, status, versi)
             SELECT 'H' || g, 's', 1 FROM generate_series(1, 2000) g;
         INSERT INTO pesan_diproses (message_id) VALUES ('p1'), ('7'), ('lost');
         INSERT INTO urutan_parkir (pesanan_id, message_id, status, versi, shard, epoch)
             VALUES ('P', 'p1', 's', 3, 0, 0);
         INSERT INTO outbox (id, agregat_tipe, agregat_id, routing_key, payload)
             VALUES (7, 'pesanan', 'O', 'pesanan.s', '{\"id\":\"O\",\"status\":\"s\",\"versi\":1}');
         INSERT INTO pesanan (id, status, versi) VALUES ('O', 's', 1), ('anyone', 's', 2);",
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

    let apply = |order: &'static str, versi: i64, id: &'static str| {
        let db = db.clone();
        async move {
            store::apply(&db, &event(order, versi, id), 0)
                .await
                .expect("apply")
        }
    };
    let (applied, duplicate) = (
        Applied::Done(Outcome::Applied),
        Applied::Done(Outcome::Duplicate),
    );
    assert_eq!(apply("H1", 1, "h1").await, duplicate);
    assert_eq!(
        apply("other", 1, "h1").await,
        applied,
        "another order's message"
    );
    assert_eq!(apply("O", 1, "7").await, duplicate);
    assert_eq!(apply("other-7", 1, "7").await, applied);
    assert_eq!(apply("P", 3, "p1").await, duplicate, "parked for P");
    // An id of unknown order: a duplicate for every order it may have been
    // (one whose stored version is not below the message's)...
    assert_eq!(apply("anyone", 1, "lost").await, duplicate);
    assert_eq!(apply("anyone", 2, "lost").await, duplicate);
    // ... and not for a newer version (the message it recorded was
    // processed, so its order's stored version is at least its own).
    assert_eq!(apply("anyone", 3, "lost").await, applied);
    assert_eq!(apply("fresh", 1, "lost").await, applied);
    assert_eq!(apply("N", 1, "new").await, applied);
    assert_eq!(of("new").await, "N", "a new claim names its order");
    let unnamed = sqlx::query("INSERT INTO pesan_diproses (message_id) VALUES ('x')")
        .execute(&db)
        .await;
    assert!(unnamed.is_err(), "no claim without its order");
}

/// A database filled by the schema of migration 0036 (ids unique per day
/// partition): claims in past day partitions, in the default partition
/// (one of unknown order among them), parked and set-aside versions,
/// messages handed back; then migrated to 0037. No row is lost or moved;
/// every partition, those to come included, is unique on (message_id,
/// pesanan_id) and on nothing else; and the claims keep deduplicating per
/// order across the partitions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filled_database_moves_to_dedup_per_order() {
    let env = TestEnv::new("dedup_filled").await;
    let old = store::connect(&env.database_url(), 2)
        .await
        .expect("connect");
    store::MIGRATOR
        .run_to(BEFORE_PER_ENTITY, &old)
        .await
        .expect("the schema of 0036");
    sqlx::raw_sql(
        "SELECT urutan_partisi_siapkan();
         SELECT urutan_partisi_buat('pesan_diproses', (now() AT TIME ZONE 'UTC')::date - d)
             FROM generate_series(1, 3) d;
         -- Three days ago and yesterday: 50,000 claims each, in their partitions.
         INSERT INTO pesan_diproses (message_id, pesanan_id, diproses_pada)
             SELECT 'd' || d || '-' || g, 'O' || (g % 500),
                    date_trunc('day', now(), 'UTC') - make_interval(days => d) + g * interval '1 ms'
             FROM unnest(ARRAY[1, 3]) d, generate_series(1, 50000) g;
         -- The default partition: older claims, and today's.
         INSERT INTO pesan_diproses (message_id, pesanan_id, diproses_pada)
             SELECT 'a-' || g, 'O' || (g % 500), now() - (g % 10) * interval '1 day' - interval '4 days'
             FROM generate_series(1, 20000) g;
         INSERT INTO pesan_diproses (message_id, pesanan_id) VALUES ('lost', ''), ('today', 'T');
         INSERT INTO pesanan (id, status, versi)
             SELECT 'O' || g, 's', 5 FROM generate_series(0, 499) g;
         INSERT INTO pesanan (id, status, versi) VALUES ('P', 's', 1), ('S', 's', 1), ('anyone', 's', 4);
         -- Parked behind a gap, and set aside after a failure: claimed too.
         INSERT INTO urutan_parkir (pesanan_id, message_id, status, versi, shard, epoch)
             VALUES ('P', 'p-3', 's', 3, 0, 0);
         INSERT INTO urutan_parkir (pesanan_id, message_id, status, versi, shard, epoch,
                                    percobaan, jatuh_tempo, galat)
             VALUES ('S', 's-2', 's', 2, 0, 0, 1, now() + interval '1 hour', 'URTRY');
         INSERT INTO pesan_diproses (message_id, pesanan_id) VALUES ('p-3', 'P'), ('s-2', 'S');
         INSERT INTO urutan_dikembalikan (message_id, pesanan_id, versi, shard)
             VALUES ('r-1', 'R', 1, 0);",
    )
    .execute(&old)
    .await
    .expect("the filled database");
    let before: Vec<(String, i64)> = sqlx::query_as(
        "SELECT tableoid::regclass::text, count(*) FROM pesan_diproses GROUP BY 1 ORDER BY 1",
    )
    .fetch_all(&old)
    .await
    .expect("rows per partition");
    assert!(before.len() >= 3, "{before:?}");
    old.close().await;

    let began = std::time::Instant::now();
    let db = store::prepare(&env.database_url(), 2)
        .await
        .expect("migrate the filled database");
    eprintln!(
        "migrated 0036 -> 0037 with {} claims in {:?}",
        before.iter().map(|(_, n)| n).sum::<i64>(),
        began.elapsed()
    );
    let after: Vec<(String, i64)> = sqlx::query_as(
        "SELECT tableoid::regclass::text, count(*) FROM pesan_diproses GROUP BY 1 ORDER BY 1",
    )
    .fetch_all(&db)
    .await
    .expect("rows per partition");
    assert_eq!(after, before, "no claim lost or moved");

    // Each partition's unique indexes, as their key columns.
    let unique_keys = "SELECT c.relname::text,
                              array_agg(pg_get_indexdef(x.indexrelid, 0, true)
                                        ORDER BY x.indexrelid)::text
                       FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                       LEFT JOIN pg_index x ON x.indrelid = c.oid AND x.indisunique
                       WHERE i.inhparent = 'pesan_diproses'::regclass
                       GROUP BY 1 ORDER BY 1";
    let keys: Vec<(String, String)> = sqlx::query_as(unique_keys)
        .fetch_all(&db)
        .await
        .expect("unique indexes");
    assert!(
        keys.len() >= 3 + 1 + 7,
        "three past days, the default (today's: the day of migrating), the week ahead: {keys:?}"
    );
    for (partition, indexes) in &keys {
        assert!(
            indexes.matches("CREATE UNIQUE INDEX").count() == 1
                && indexes.contains("(message_id, pesanan_id)"),
            "{partition}: {indexes}"
        );
    }
    // A day created from now on gets it too.
    sqlx::query(
        "SELECT urutan_partisi_buat('pesan_diproses', (now() AT TIME ZONE 'UTC')::date + 30)",
    )
    .execute(&db)
    .await
    .expect("a day ahead");
    let keys: Vec<(String, String)> = sqlx::query_as(unique_keys)
        .fetch_all(&db)
        .await
        .expect("unique indexes");
    let (_, new_day) = keys.last().expect("the new day");
    assert!(
        new_day.matches("CREATE UNIQUE INDEX").count() == 1
            && new_day.contains("(message_id, pesanan_id)"),
        "{new_day}"
    );

    let apply = |order: &'static str, versi: i64, id: &'static str| {
        let db = db.clone();
        async move {
            store::apply(&db, &event(order, versi, id), 0)
                .await
                .expect("apply")
        }
    };
    let (applied, duplicate) = (
        Applied::Done(Outcome::Applied),
        Applied::Done(Outcome::Duplicate),
    );
    // Claimed three days ago for O5 (stored v5): a duplicate for O5, another
    // message for Z; the same in the default partition.
    assert_eq!(apply("O5", 5, "d3-5").await, duplicate);
    assert_eq!(apply("Z", 1, "d3-5").await, applied);
    assert_eq!(apply("O7", 2, "d1-7").await, duplicate);
    assert_eq!(apply("O9", 5, "a-9").await, duplicate);
    assert_eq!(apply("Y", 1, "a-9").await, applied);
    assert_eq!(apply("T", 1, "today").await, duplicate);
    assert_eq!(apply("Y", 2, "today").await, applied);
    assert_eq!(apply("anyone", 4, "lost").await, duplicate, "unknown order");
    // Parked and set aside: a redelivery is a duplicate; another order's
    // message with the same id is applied.
    assert_eq!(apply("P", 3, "p-3").await, duplicate);
    assert_eq!(apply("S", 2, "s-2").await, duplicate);
    assert_eq!(apply("Q", 1, "p-3").await, applied);
    assert_eq!(apply("Q", 2, "s-2").await, applied);
    assert_eq!(
        count(&db, "SELECT count(*) FROM urutan_parkir").await,
        2,
        "parked once each"
    );
    // Two orders' messages with one id handed back: both awaited.
    store::record_returned(&db, &event("R2", 1, "r-1"), 0)
        .await
        .expect("record a return");
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM urutan_dikembalikan WHERE message_id = 'r-1'"
        )
        .await,
        2
    );
}

/// A message handed back to its queue (`urutan_dikembalikan`) makes its
/// order's newer versions wait until it is back or dead-lettered. Another
/// order's message that carries the same id, applied or dead-lettered
/// (here: a contract violation), must not end that wait: the newer version
/// would overtake the returned one. The returned message itself, back, is
/// applied (the id is B's too, but that is another message) and ends it.
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
    assert_eq!(apply("A", 1, "M").await, Applied::Done(Outcome::Applied));
    assert_eq!(
        count(&db, waiting).await,
        0,
        "A's own message ends the wait"
    );
}

/// A dead-letter record of the retired reason `message_id_reused` (written
/// before migration 0037) still lists and shows; replayed now, its message
/// is applied: the id another order holds is no obstacle any more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_message_id_reused_record_lists_shows_and_replays() {
    let env = TestEnv::new("dedup_old_record").await;
    let db = env.db().await;
    let pool = RunningPool::ready(env.settings(1)).await;
    let publisher = env.publisher().await;
    publisher
        .send_all(&[Msg::event_with("A", 1, "OLD-1", "dibuat")])
        .await;
    wait_stored(&db, "A", 1).await;
    // What the previous version left: B's message with A's id, in the DLQ
    // with its record.
    let victim = Msg::event_with("B", 1, "OLD-1", "dibuat");
    publisher.send_to("pesanan.dlx", "", &victim).await;
    sqlx::query(
        "INSERT INTO urutan_dead_letter (delivery_key, message_id, pesanan_id, versi, shard,
                                         reason, detail, properties, headers, body, body_bytes)
         VALUES ('OLD-1', 'OLD-1', 'B', 1, 0, 'message_id_reused',
                 'the message_id was already processed for another order',
                 '{\"message_id\": \"OLD-1\", \"delivery_mode\": 2}',
                 '{\"x-pesanan-id\": \"B\"}', $1, length($1))",
    )
    .bind(&victim.body)
    .execute(&db)
    .await
    .expect("the old record");
    let conn = env.broker().await;
    wait_for(
        "the message in the DLQ",
        Duration::from_secs(10),
        || async { queue_len(&conn, "pesanan.dlq").await == 1 },
    )
    .await;

    let listed = urutan(&env, &[], &["dlq", "list", "--json"]).await;
    assert!(listed.ok(), "{listed}");
    let listed: serde_json::Value = serde_json::from_str(&listed.stdout).expect("json");
    assert!(
        listed
            .to_string()
            .contains("\"reason\":\"message_id_reused\""),
        "{listed}"
    );
    let shown = urutan(&env, &[], &["dlq", "show", "OLD-1"]).await;
    assert!(
        shown.ok() && shown.stdout.contains("message_id_reused"),
        "{shown}"
    );
    let replayed = urutan(&env, &[], &["dlq", "replay", "OLD-1"]).await;
    assert!(replayed.ok(), "{replayed}");
    assert!(
        replayed.stdout.contains("OLD-1 (order B, v1): applied"),
        "{replayed}"
    );
    wait_stored(&db, "B", 1).await;
    assert_eq!(queue_len(&conn, "pesanan.dlq").await, 0);
    pool.stop().await;
}
