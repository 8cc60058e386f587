//! The outbox's and the effects' retention (migration 0033, issue 33): both
//! tables are partitioned by id range; the relay and the dispatcher detach a
//! partition, then drop it (migration 0036), once all its ids are handed out, its newest row is past
//! the retention and nothing in it waits (an unsent outbox row, a pending or
//! dead-lettered effect keeps it). Partitions are created ahead, sized to
//! about a day of ids; a database filled by the old schema converts without
//! losing a row, and its old rows are trimmed the old way.
//! (Processed ids and history: `partitions`; dead-letter records:
//! `dlq::unresolved_dead_letters_expire_after_their_retention`.)

use std::time::{Duration, Instant};

use sqlx::PgPool;

use crate::common::*;

const WEEK: Duration = Duration::from_secs(7 * 86_400);
/// The first partition's size on a new database: 2^24 ids.
const FIRST: i64 = 1 << 24;

/// The id-range partitions of `table`: (name, first id, end).
async fn ranges(db: &PgPool, table: &str) -> Vec<(String, i64, i64)> {
    sqlx::query_as("SELECT partisi, dari, ke FROM urutan_partisi_id_daftar($1)")
        .bind(table)
        .fetch_all(db)
        .await
        .expect("the partitions")
}

async fn purge_outbox(db: &PgPool) -> u64 {
    let mut conn = db.acquire().await.expect("connection");
    tokio::time::timeout(
        Duration::from_secs(60),
        urutan::outbox::relay::purge_sent(&mut conn, WEEK),
    )
    .await
    .expect("purge within 60 s")
    .expect("purge")
}

/// `sql` in the open transaction `tx`, which must not wait (see its lock_timeout).
async fn exec_in(tx: &mut sqlx::PgTransaction<'_>, sql: &'static str) {
    sqlx::query(sql)
        .execute(&mut **tx)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

async fn exec(db: &PgPool, sql: &'static str) -> u64 {
    sqlx::query(sql)
        .execute(db)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .rows_affected()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sent_outbox_partition_is_dropped_whole_and_an_unsent_row_keeps_it() {
    let env = TestEnv::new("outbox_retention").await;
    let db = env.db().await;
    assert_eq!(
        ranges(&db, "outbox").await,
        [("outbox_p1".to_owned(), 1, 1 + FIRST)],
        "a new database has its first partition from id 1"
    );
    exec(
        &db,
        "INSERT INTO outbox (agregat_tipe, agregat_id, routing_key, payload, dibuat_pada, dikirim_pada)
         SELECT 'pesanan', 'old-' || g, 'pesanan.x', jsonb_build_object('id', 'old-' || g, 'status', 's', 'versi', 1),
                now() - interval '8 days', now() - interval '8 days'
         FROM generate_series(1, 12000) g
         UNION ALL
         SELECT 'pesanan', 'unsent-' || g, 'pesanan.x', jsonb_build_object('id', 'unsent-' || g, 'status', 's', 'versi', 1),
                now() - interval '30 days', NULL
         FROM generate_series(1, 50) g",
    )
    .await;
    // Not every id of the first partition is handed out yet: nothing goes.
    assert_eq!(purge_outbox(&db).await, 0);
    assert_eq!(count(&db, "SELECT count(*) FROM outbox").await, 12_050);

    // Every id of the first partition handed out: the purge creates the
    // next partition ahead; rows now land there.
    exec(&db, "SELECT setval('outbox_id_seq', (1 << 24) + 100)").await;
    purge_outbox(&db).await;
    let now = ranges(&db, "outbox").await;
    assert!(now.iter().any(|r| r.1 == 1 + FIRST), "{now:?}");
    exec(
        &db,
        "INSERT INTO outbox (agregat_tipe, agregat_id, routing_key, payload, dikirim_pada)
         SELECT 'pesanan', 'recent-' || g, 'pesanan.x', jsonb_build_object('id', 'recent-' || g, 'status', 's', 'versi', 1),
                now() - interval '6 days 23 hours'
         FROM generate_series(1, 100) g",
    )
    .await;
    // Fifty rows never sent (say, unroutable for a month) keep their
    // partition, and so the 12,000 sent ones beside them.
    assert_eq!(purge_outbox(&db).await, 0);
    assert_eq!(count(&db, "SELECT count(*) FROM outbox").await, 12_150);
    assert!(
        ranges(&db, "outbox")
            .await
            .iter()
            .any(|r| r.0 == "outbox_p1")
    );

    exec(
        &db,
        "UPDATE outbox SET dikirim_pada = now() - interval '8 days' WHERE dikirim_pada IS NULL",
    )
    .await;
    // The settled partition is detached first (migration 0036); while it
    // is dropped (its files removed: seconds for a big one), a producer's
    // INSERT does not wait.
    let detached: Vec<String> =
        sqlx::query_scalar("SELECT partisi FROM urutan_partisi_id_lepas('outbox', '7 days')")
            .fetch_all(&db)
            .await
            .expect("detach");
    assert_eq!(detached, ["outbox_p1"]);
    let mut dropping = db.begin().await.expect("begin");
    let dropped: Vec<String> =
        sqlx::query_scalar("SELECT partisi FROM urutan_partisi_hapus('outbox')")
            .fetch_all(&mut *dropping)
            .await
            .expect("drop");
    assert_eq!(dropped, ["outbox_p1"]);
    let mut producer = db.begin().await.expect("begin");
    exec_in(&mut producer, "SET LOCAL lock_timeout = '500ms'").await;
    exec_in(
        &mut producer,
        "INSERT INTO outbox (agregat_tipe, agregat_id, routing_key, payload)
         VALUES ('pesanan', 'during-the-drop', 'pesanan.x',
                 '{\"id\": \"during-the-drop\", \"status\": \"s\", \"versi\": 1}')",
    )
    .await;
    producer.rollback().await.expect("rollback");
    dropping.commit().await.expect("commit the drop");
    assert_eq!(purge_outbox(&db).await, 0, "nothing else to expire");
    assert!(
        !ranges(&db, "outbox")
            .await
            .iter()
            .any(|r| r.0 == "outbox_p1"),
        "the settled partition is dropped"
    );
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM pg_class WHERE relname = 'outbox_p1'"
        )
        .await,
        0,
        "dropped, not only detached"
    );
    assert_eq!(
        count(&db, "SELECT count(*) FROM outbox").await,
        100,
        "the rows of the partition being filled stay, though sent"
    );
    assert_eq!(purge_outbox(&db).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sent_effects_partition_is_dropped_whole_and_a_dead_letter_keeps_it() {
    let env = TestEnv::new("effects_retention").await;
    let db = env.db().await;
    exec(
        &db,
        "INSERT INTO urutan_efek_tujuan (url) VALUES ('http://127.0.0.1:9/x')",
    )
    .await;
    exec(
        &db,
        "INSERT INTO urutan_efek (pesanan_id, versi, tujuan, message_id, isi, keadaan, dibuat_pada, selesai_pada)
         SELECT 'O' || g, 1, (SELECT min(tujuan) FROM urutan_efek_tujuan), 'm' || g, '{}'::jsonb,
                CASE WHEN g = 7 THEN 'gagal' ELSE 'terkirim' END,
                now() - interval '8 days', now() - interval '8 days'
         FROM generate_series(1, 3000) g",
    )
    .await;
    exec(&db, "SELECT setval('urutan_efek_efek_seq', (1 << 24) + 5)").await;
    let purge = |db: PgPool| async move {
        urutan::effects::store::purge_sent(&db, WEEK)
            .await
            .expect("purge")
    };
    assert_eq!(
        purge(db.clone()).await,
        0,
        "a dead-lettered effect keeps it"
    );
    assert_eq!(count(&db, "SELECT count(*) FROM urutan_efek").await, 3000);
    exec(
        &db,
        "UPDATE urutan_efek SET keadaan = 'menunggu' WHERE keadaan = 'gagal'",
    )
    .await;
    purge(db.clone()).await;
    assert_eq!(
        count(&db, "SELECT count(*) FROM urutan_efek").await,
        3000,
        "so does a pending one"
    );
    exec(
        &db,
        "UPDATE urutan_efek SET keadaan = 'terkirim' WHERE keadaan = 'menunggu'",
    )
    .await;
    purge(db.clone()).await;
    assert_eq!(count(&db, "SELECT count(*) FROM urutan_efek").await, 0);
    let left = ranges(&db, "urutan_efek").await;
    assert!(
        left.iter().all(|r| r.1 > FIRST),
        "only partitions ahead are left: {left:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_ahead_are_sized_to_a_day_of_ids() {
    let env = TestEnv::new("outbox_partition_size").await;
    let db = env.db().await;
    // The first row came two hours ago and 8,388,608 ids went since:
    // about 100 million a day, so the next partition holds 2^27 ids.
    exec(
        &db,
        "INSERT INTO outbox (agregat_tipe, agregat_id, routing_key, payload, dibuat_pada)
         VALUES ('pesanan', 'first', 'pesanan.x',
                 '{\"id\": \"first\", \"status\": \"s\", \"versi\": 1}', now() - interval '2 hours')",
    )
    .await;
    exec(&db, "SELECT setval('outbox_id_seq', 1 << 23)").await;
    let created: i32 = sqlx::query_scalar("SELECT urutan_partisi_id_siapkan()")
        .fetch_one(&db)
        .await
        .expect("prepare");
    assert_eq!(created, 1);
    let now = ranges(&db, "outbox").await;
    assert_eq!(
        now[1],
        (
            format!("outbox_p{}", 1 + FIRST),
            1 + FIRST,
            1 + FIRST + (1 << 27)
        ),
        "{now:?}"
    );
    // A day of ids ahead already: nothing more to create.
    let again: i32 = sqlx::query_scalar("SELECT urutan_partisi_id_siapkan()")
        .fetch_one(&db)
        .await
        .expect("prepare again");
    assert_eq!(again, 0);
}

/// A database filled by the old schema (migrations up to 0032) converts in
/// a moment: no row moves or is lost, new rows go on, the relay's purge
/// trims the old sent rows the old way and never an unsent one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filled_outbox_and_effects_convert_without_losing_a_row() {
    let env = TestEnv::new("outbox_upgrade").await;
    let url = env.database_url();
    let old = {
        let pool = urutan::store::connect(&url, 1).await.expect("connect");
        let before = sqlx::migrate::Migrator::with_migrations(
            urutan::store::MIGRATOR
                .iter()
                .filter(|m| m.version < 20261205000033)
                .cloned()
                .collect(),
        );
        before.run(&pool).await.expect("the old schema");
        pool
    };
    // Over 64 MB of outbox (the bound is validated after the migration,
    // while writes go on) and a small effects table (validated at once).
    exec(
        &old,
        "INSERT INTO outbox (agregat_tipe, agregat_id, routing_key, payload, dikirim_pada)
         SELECT 'pesanan', 'O' || g, 'pesanan.x', jsonb_build_object('pad', repeat('x', 300)),
                CASE WHEN g <= 240000 THEN now() - interval '8 days' END
         FROM generate_series(1, 250000) g",
    )
    .await;
    exec(
        &old,
        "INSERT INTO urutan_efek_tujuan (url) VALUES ('http://127.0.0.1:9/x')",
    )
    .await;
    exec(
        &old,
        "INSERT INTO urutan_efek (pesanan_id, versi, tujuan, message_id, isi, keadaan, selesai_pada)
         SELECT 'O' || g, 1, (SELECT min(tujuan) FROM urutan_efek_tujuan), 'm' || g, '{}'::jsonb,
                CASE WHEN g <= 900 THEN 'terkirim' ELSE 'menunggu' END,
                CASE WHEN g <= 900 THEN now() - interval '8 days' END
         FROM generate_series(1, 1000) g",
    )
    .await;
    old.close().await;

    let began = Instant::now();
    let db = urutan::store::prepare(&url, 2)
        .await
        .expect("migrate the filled database");
    let took = began.elapsed();
    assert!(
        took < Duration::from_secs(30),
        "converting (and validating the bound of) 250,000 outbox rows took {took:?}"
    );
    assert_eq!(count(&db, "SELECT count(*) FROM outbox").await, 250_000);
    assert_eq!(
        count(&db, "SELECT count(*) FROM outbox_awal").await,
        250_000,
        "the old rows stayed where they were: the default partition"
    );
    assert_eq!(count(&db, "SELECT count(*) FROM urutan_efek").await, 1000);
    let validated: Vec<(String, bool)> = sqlx::query_as(
        "SELECT conname::text, convalidated FROM pg_constraint
         WHERE conname IN ('outbox_awal_batas', 'urutan_efek_awal_batas') ORDER BY 1",
    )
    .fetch_all(&db)
    .await
    .expect("bounds");
    assert_eq!(
        validated,
        [
            ("outbox_awal_batas".to_owned(), true),
            ("urutan_efek_awal_batas".to_owned(), true)
        ]
    );
    // The large table's range partitions start 2^24 ids past its last
    // id; the small one's right after it.
    assert_eq!(ranges(&db, "outbox").await[0].1, 250_001 + FIRST);
    assert_eq!(ranges(&db, "urutan_efek").await[0].1, 1001);

    // Producers go on; the pending effects are still due.
    let id: i64 = sqlx::query_scalar("SELECT urutan_enqueue('O1', 'dibayar', 2)")
        .fetch_one(&db)
        .await
        .expect("enqueue after the conversion");
    assert_eq!(id, 250_001);
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM urutan_efek WHERE keadaan = 'menunggu'"
        )
        .await,
        100
    );

    // The relay's purge trims the old sent rows, not the unsent ones.
    assert_eq!(purge_outbox(&db).await, 240_000);
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM outbox WHERE dikirim_pada IS NULL"
        )
        .await,
        10_001
    );
    assert_eq!(count(&db, "SELECT count(*) FROM outbox").await, 10_001);
    assert_eq!(
        urutan::effects::store::purge_sent(&db, WEEK)
            .await
            .expect("effects purge"),
        900
    );
    assert_eq!(count(&db, "SELECT count(*) FROM urutan_efek").await, 100);
}
