//! Day partitions (migrations 0026 and 0036, issue 33): the dedup guarantee
//! across a partition boundary (a redelivery just after midnight is still a
//! `duplicate`), in strict and batch mode and for a parked copy; expiry by
//! whole days, detached then dropped; HISTORY_RETENTION; and the conversion of a database
//! filled by the old schema, without losing a row.

use std::time::{Duration, Instant};

use sqlx::PgPool;
use urutan::config::GapPolicy;
use urutan::outcome::Outcome;

use crate::common::*;

/// The topology of one shard, declared before the pool starts (so nothing
/// published is unroutable).
async fn declared(settings: &urutan::config::Settings) {
    let conn = urutan::broker::connect(&settings.amqp_url, "t")
        .await
        .expect("connect");
    let names = urutan::broker::Names::new("pesanan");
    urutan::broker::topology::declare(&conn, &names, 1, 5, false)
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

/// Moves the claims of `ids` to the last second of yesterday (UTC), into
/// yesterday's own day partition: as if they had been processed just before
/// midnight.
async fn claimed_yesterday(db: &PgPool, ids: &[&str]) {
    sqlx::query(
        "SELECT urutan_partisi_buat('pesan_diproses', (now() AT TIME ZONE 'UTC')::date - 1)",
    )
    .execute(db)
    .await
    .expect("yesterday's partition");
    let moved = sqlx::query(
        "UPDATE pesan_diproses SET diproses_pada = date_trunc('day', now(), 'UTC') - interval '1 second'
         WHERE message_id = ANY($1)",
    )
    .bind(ids)
    .execute(db)
    .await
    .expect("age the claims")
    .rows_affected();
    assert_eq!(moved, ids.len() as u64, "every claim moved");
    let partitions: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT tableoid::regclass::text FROM pesan_diproses WHERE message_id = ANY($1)",
    )
    .bind(ids)
    .fetch_all(db)
    .await
    .expect("where the claims are");
    assert_eq!(partitions.len(), 1, "{partitions:?}");
    assert!(
        partitions[0].starts_with("pesan_diproses_h"),
        "in yesterday's day partition, not today's: {partitions:?}"
    );
}

async fn redeliveries_after_midnight_are_duplicates(prefetch: u16) {
    let env = TestEnv::new(&format!("partition_dedup_p{prefetch}")).await;
    let db = env.db().await;
    let mut settings = env.settings(1);
    settings.prefetch = prefetch;
    let (seen, hooks) = outcome_recorder();
    declared(&settings).await;
    let pool = RunningPool::start_with(settings, hooks).await;
    let publisher = env.publisher().await;

    let before = [
        Msg::event_with("A", 1, "A1", "dibuat"),
        Msg::event_with("A", 2, "A2", "dibayar"),
        Msg::event_with("B", 1, "B1", "dibuat"),
    ];
    publisher.send_all(&before).await;
    settled(&seen, before.len()).await;
    claimed_yesterday(&db, &["A1", "A2", "B1"]).await;

    // Just after midnight: the same messages again, the id B claimed
    // yesterday on an older version of A (another message: dedup is per
    // (order, message id), so stale, not a duplicate), an older version with
    // a new id, and the next version.
    let after = [
        Msg::event_with("A", 1, "A1", "dibuat"),
        Msg::event_with("A", 2, "A2", "dibayar"),
        Msg::event_with("A", 1, "B1", "palsu"),
        Msg::event_with("A", 1, "A1-again", "dibuat"),
        Msg::event_with("A", 3, "A3", "dikirim"),
    ];
    publisher.send_all(&after).await;
    settled(&seen, before.len() + after.len()).await;
    pool.stop().await;

    let got = seen.lock().map(|s| s.clone()).unwrap_or_default();
    let got: Vec<(&str, Outcome)> = got[before.len()..]
        .iter()
        .map(|(id, o)| (id.as_str(), *o))
        .collect();
    assert_eq!(
        got,
        [
            ("A1", Outcome::Duplicate),
            ("A2", Outcome::Duplicate),
            ("B1", Outcome::Stale),
            ("A1-again", Outcome::Stale),
            ("A3", Outcome::Applied),
        ],
        "outcomes after midnight (prefetch {prefetch})"
    );
    let claims: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT message_id, pesanan_id, count(*) FROM pesan_diproses GROUP BY 1, 2 ORDER BY 1, 2",
    )
    .fetch_all(&db)
    .await
    .expect("claims");
    let claim = |m: &str, o: &str| (m.to_owned(), o.to_owned(), 1_i64);
    assert_eq!(
        claims,
        [
            claim("A1", "A"),
            claim("A1-again", "A"),
            claim("A2", "A"),
            claim("A3", "A"),
            claim("B1", "A"),
            claim("B1", "B"),
        ],
        "one claim per (order, message id): the duplicates' new claims withdrawn"
    );
    assert_eq!(
        count(&db, "SELECT count(*) FROM urutan_basi").await,
        2,
        "only the real stale arrivals are recorded as such"
    );
    let history: Vec<(String, i64)> =
        sqlx::query_as("SELECT pesanan_id, versi FROM pesanan_riwayat ORDER BY seq")
            .fetch_all(&db)
            .await
            .expect("history");
    let row = |id: &str, v: i64| (id.to_owned(), v);
    assert_eq!(
        history,
        [row("A", 1), row("A", 2), row("B", 1), row("A", 3)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivery_after_midnight_is_a_duplicate_in_strict_mode() {
    redeliveries_after_midnight_are_duplicates(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivery_after_midnight_is_a_duplicate_in_batch_mode() {
    redeliveries_after_midnight_are_duplicates(16).await;
}

/// A version parked before midnight (waiting for the one before it) and
/// redelivered after: a duplicate, parked once, applied once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_copy_from_yesterday_is_a_duplicate() {
    let env = TestEnv::new("partition_parked").await;
    let db = env.db().await;
    let mut settings = env.settings(1);
    settings.gap_policy = GapPolicy::Wait;
    let (seen, hooks) = outcome_recorder();
    declared(&settings).await;
    let pool = RunningPool::start_with(settings, hooks).await;
    let publisher = env.publisher().await;

    publisher
        .send_all(&[
            Msg::event_with("P", 1, "P1", "dibuat"),
            Msg::event_with("P", 3, "P3", "dikirim"),
        ])
        .await;
    wait_for(
        "P3 parked behind the missing P2",
        Duration::from_secs(30),
        || async {
            count(
                &db,
                "SELECT count(*) FROM urutan_parkir WHERE message_id = 'P3'",
            )
            .await
                == 1
        },
    )
    .await;
    claimed_yesterday(&db, &["P3"]).await;
    publisher
        .send_all(&[Msg::event_with("P", 3, "P3", "dikirim")])
        .await;
    settled(&seen, 2).await;
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM urutan_parkir WHERE message_id = 'P3'"
        )
        .await,
        1,
        "parked once"
    );
    publisher
        .send_all(&[Msg::event_with("P", 2, "P2", "dibayar")])
        .await;
    wait_for("P at version 3", Duration::from_secs(30), || async {
        count(
            &db,
            "SELECT coalesce(max(versi), 0) FROM pesanan WHERE id = 'P'",
        )
        .await
            == 3
    })
    .await;
    settled(&seen, 4).await;
    pool.stop().await;

    let got = seen.lock().map(|s| s.clone()).unwrap_or_default();
    let got: Vec<(&str, Outcome)> = got.iter().map(|(id, o)| (id.as_str(), *o)).collect();
    assert_eq!(
        got,
        [
            ("P1", Outcome::Applied),
            ("P3", Outcome::Duplicate),
            ("P2", Outcome::Applied),
            ("P3", Outcome::Applied),
        ],
        "the parked copy's redelivery is a duplicate; the parked one is applied on release"
    );
    let history: Vec<i64> =
        sqlx::query_scalar("SELECT versi FROM pesanan_riwayat WHERE pesanan_id = 'P' ORDER BY seq")
            .fetch_all(&db)
            .await
            .expect("history");
    assert_eq!(history, [1, 2, 3], "each version applied once, in order");
    assert_eq!(count(&db, "SELECT count(*) FROM urutan_parkir").await, 0);
}

/// Rows of a day long past, in that day's own partition (created for the
/// test; the pool creates them from today on).
async fn fill_day(db: &PgPool, days_ago: i32, rows: i32) {
    sqlx::query(
        "SELECT urutan_partisi_buat(t, (now() AT TIME ZONE 'UTC')::date - $1)
         FROM unnest(ARRAY['pesan_diproses', 'pesanan_riwayat']) t",
    )
    .bind(days_ago)
    .execute(db)
    .await
    .expect("the day's partitions");
    sqlx::query(
        "INSERT INTO pesan_diproses (message_id, pesanan_id, diproses_pada)
         SELECT 'd' || $1 || '-' || g, 'O' || g, date_trunc('day', now(), 'UTC') - make_interval(days => $1) + g * interval '1 ms'
         FROM generate_series(1, $2) g",
    )
    .bind(days_ago)
    .bind(rows)
    .execute(db)
    .await
    .expect("claims of the day");
    sqlx::query(
        "INSERT INTO pesanan_riwayat (pesanan_id, versi, status, message_id, shard, diterapkan_pada)
         SELECT 'O' || g, $1, 'dibuat', 'd' || $1 || '-' || g, 0, date_trunc('day', now(), 'UTC') - make_interval(days => $1) + g * interval '1 ms'
         FROM generate_series(1, $2) g",
    )
    .bind(days_ago)
    .bind(rows)
    .execute(db)
    .await
    .expect("history of the day");
}

async fn partitions_of(db: &PgPool, table: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
         WHERE i.inhparent = $1::regclass ORDER BY 1",
    )
    .bind(table)
    .fetch_all(db)
    .await
    .expect("partitions")
}

/// Expiry drops whole days (in well under a second of database time for a
/// day of 200,000 rows), keeps the days within the retention, trims the
/// default partition's old rows, and leaves history alone unless
/// HISTORY_RETENTION says otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_days_are_dropped_whole() {
    let env = TestEnv::new("partition_expiry").await;
    let db = env.db().await;
    fill_day(&db, 40, 200_000).await;
    fill_day(&db, 29, 1_000).await;
    fill_day(&db, 1, 1_000).await;
    // Rows from before partitioning: in the default partition.
    sqlx::query(
        "INSERT INTO pesan_diproses (message_id, pesanan_id, diproses_pada)
         SELECT 'awal-' || g, 'O', now() - interval '45 days' FROM generate_series(1, 7000) g",
    )
    .execute(&db)
    .await
    .expect("old rows in the default partition");
    sqlx::query("ANALYZE pesan_diproses, pesanan_riwayat")
        .execute(&db)
        .await
        .expect("analyze");
    let old_day = partitions_of(&db, "pesan_diproses")
        .await
        .into_iter()
        .find(|p| p.starts_with("pesan_diproses_h"))
        .expect("the oldest day partition");

    let began = Instant::now();
    let purged = urutan::store::purge_expired(&db, Duration::from_secs(30 * 86_400))
        .await
        .expect("purge");
    let took = began.elapsed();
    assert!(
        purged >= 200_000 + 7_000 - 2_000,
        "the day's rows (estimated) and the default partition's: {purged}"
    );
    assert!(
        took < Duration::from_secs(5),
        "dropping a day is a catalog change: {took:?}"
    );
    let left = partitions_of(&db, "pesan_diproses").await;
    assert!(!left.contains(&old_day), "{old_day} dropped: {left:?}");
    assert_eq!(
        count(&db, "SELECT count(*) FROM pesan_diproses WHERE message_id LIKE 'd40-%' OR message_id LIKE 'awal-%'").await,
        0
    );
    assert_eq!(
        count(&db, "SELECT count(*) FROM pesan_diproses").await,
        2_000,
        "the days within the retention stay"
    );
    assert_eq!(
        count(&db, "SELECT count(*) FROM pesanan_riwayat").await,
        202_000,
        "history is kept (HISTORY_RETENTION=keep) whatever DEDUP_RETENTION does"
    );

    let purged = urutan::store::purge_expired_history(&db, Duration::from_secs(7 * 86_400))
        .await
        .expect("history purge");
    assert!(purged >= 200_000, "{purged}");
    assert_eq!(
        count(&db, "SELECT count(*) FROM pesanan_riwayat").await,
        1_000,
        "HISTORY_RETENTION=7d keeps yesterday only"
    );
    let again = urutan::store::purge_expired(&db, Duration::from_secs(30 * 86_400))
        .await
        .expect("second purge");
    assert_eq!(again, 0);
}

/// The pool prepares the coming week's day partitions, so the day after
/// today never lands in the default partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_coming_week_is_partitioned_ahead() {
    let env = TestEnv::new("partition_ahead").await;
    let db = env.db().await;
    let days: Vec<String> = sqlx::query_scalar(
        "SELECT to_char((now() AT TIME ZONE 'UTC')::date + d, 'YYYYMMDD')
         FROM generate_series(1, $1) d",
    )
    .bind(urutan::store::DAYS_AHEAD)
    .fetch_all(&db)
    .await
    .expect("days");
    for table in ["pesan_diproses", "pesanan_riwayat"] {
        let have = partitions_of(&db, table).await;
        for day in &days {
            let name = format!("{table}_h{day}");
            assert!(have.contains(&name), "{name} missing: {have:?}");
        }
    }
    // A claim dated tomorrow goes to tomorrow's partition.
    let into: String = sqlx::query_scalar(
        "INSERT INTO pesan_diproses (message_id, pesanan_id, diproses_pada)
         VALUES ('tomorrow', 'O', now() + interval '1 day') RETURNING tableoid::regclass::text",
    )
    .fetch_one(&db)
    .await
    .expect("insert");
    assert!(into.starts_with("pesan_diproses_h"), "{into}");
    assert_eq!(
        urutan::store::prepare_partitions(&db).await.expect("again"),
        0,
        "nothing left to create"
    );
}

/// A database filled by the old schema (migrations up to 0025) converts in
/// a moment: no row moves or is lost, old ids still deduplicate, the
/// effects trigger still fires, and the pool goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_of_the_old_schema_converts_without_losing_a_row() {
    let env = TestEnv::new("partition_upgrade").await;
    let url = env.database_url();
    let old = {
        let pool = urutan::store::connect(&url, 1).await.expect("connect");
        let before = sqlx::migrate::Migrator::with_migrations(
            urutan::store::MIGRATOR
                .iter()
                .filter(|m| m.version < 20261205000026)
                .cloned()
                .collect(),
        );
        before.run(&pool).await.expect("the old schema");
        pool
    };
    sqlx::query(
        "INSERT INTO pesan_diproses (message_id, pesanan_id, diproses_pada)
         SELECT 'm' || g, 'O' || (g % 1000), now() - (g % 20) * interval '1 day'
         FROM generate_series(1, 300000) g",
    )
    .execute(&old)
    .await
    .expect("old claims");
    sqlx::query(
        "INSERT INTO pesanan (id, status, versi) SELECT 'O' || g, 'dibuat', 300 FROM generate_series(0, 999) g",
    )
    .execute(&old)
    .await
    .expect("old orders");
    sqlx::query(
        "INSERT INTO pesanan_riwayat (pesanan_id, versi, status, message_id, shard, diterapkan_pada)
         SELECT 'O' || (g % 1000), g / 1000 + 1, 'dibuat', 'm' || g, 0, now() - (g % 20) * interval '1 day'
         FROM generate_series(0, 299999) g",
    )
    .execute(&old)
    .await
    .expect("old history");
    old.close().await;

    let began = Instant::now();
    let db = urutan::store::prepare(&url, 2)
        .await
        .expect("migrate the filled database");
    let took = began.elapsed();
    assert!(
        took < Duration::from_secs(20),
        "converting (and validating the bound of) 600,000 rows took {took:?}"
    );
    assert_eq!(
        count(&db, "SELECT count(*) FROM pesan_diproses").await,
        300_000
    );
    assert_eq!(
        count(&db, "SELECT count(*) FROM pesanan_riwayat").await,
        300_000
    );
    assert_eq!(
        count(&db, "SELECT count(*) FROM pesan_diproses_awal").await,
        300_000,
        "the old rows stayed where they were: the default partition"
    );
    let kind: String = sqlx::query_scalar(
        "SELECT relkind::text FROM pg_class WHERE oid = 'pesanan_riwayat'::regclass",
    )
    .fetch_one(&db)
    .await
    .expect("kind");
    assert_eq!(kind, "p", "partitioned");

    // The pool on the converted database: an old id is a duplicate, a new
    // version is applied after the old history.
    let (seen, hooks) = outcome_recorder();
    declared(&env.settings(1)).await;
    let pool = RunningPool::start_with(env.settings(1), hooks).await;
    let publisher = env.publisher().await;
    publisher
        .send_all(&[
            Msg::event_with("O7", 300, "m7007", "dibuat"),
            Msg::event_with("O7", 301, "fresh", "dibayar"),
        ])
        .await;
    settled(&seen, 2).await;
    pool.stop().await;
    let got = seen.lock().map(|s| s.clone()).unwrap_or_default();
    assert_eq!(
        got,
        [
            ("m7007".to_owned(), Outcome::Duplicate),
            ("fresh".to_owned(), Outcome::Applied)
        ]
    );
    let last: i64 = sqlx::query_scalar(
        "SELECT versi FROM pesanan_riwayat WHERE pesanan_id = 'O7' ORDER BY seq DESC LIMIT 1",
    )
    .fetch_one(&db)
    .await
    .expect("last history row");
    assert_eq!(
        last, 301,
        "history goes on in apply order (seq) across the conversion"
    );
}

/// Whether an insert into `table` (the parent) gets its lock within 500 ms
/// while something else holds locks: `Err` with the database's message if not.
async fn insert_waits_at_most_500ms(db: &PgPool, sql: &'static str) -> Result<(), String> {
    let mut tx = db.begin().await.expect("begin");
    sqlx::query("SET LOCAL lock_timeout = '500ms'")
        .execute(&mut *tx)
        .await
        .expect("lock_timeout");
    let done = sqlx::query(sql).execute(&mut *tx).await;
    tx.rollback().await.expect("rollback");
    done.map(|_| ()).map_err(|e| e.to_string())
}

/// Expiring a day never holds the parent's lock while the day's files are
/// removed (seconds for a busy day; 1.8 + 5.1 s for a day of 172.8 million
/// dedup and history rows in `benches/sql/day-drop.sh`): the partition is
/// detached first, in a transaction of its own, and only then dropped. Held
/// open, that drop lets workers insert into both tables and read across
/// every day; a drop of an attached day (the previous way,
/// `urutan_partisi_buang`) does not. A detached day a crash left behind
/// goes at the next pass; a table that urutan did not detach stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiring_a_day_removes_its_files_without_the_parents_lock() {
    let env = TestEnv::new("partition_detach").await;
    let db = env.db().await;
    fill_day(&db, 40, 1_000).await;
    fill_day(&db, 1, 1_000).await;
    let dedup_insert = "INSERT INTO pesan_diproses (message_id, pesanan_id) VALUES ('now-1', 'O')";
    let history_insert =
        "INSERT INTO pesanan_riwayat (pesanan_id, versi, status, message_id, shard)
                          VALUES ('O', 1, 'dibuat', 'now-1', 0)";
    let read_every_day = "INSERT INTO urutan_basi (pesanan_id, versi, message_id, shard)
                          SELECT 'O', 1, 'read', 0 WHERE EXISTS
                              (SELECT 1 FROM pesan_diproses WHERE message_id = 'd1-1')";

    // The first step alone, as a crash right after it would leave it.
    let detached: Vec<(String, i64)> = sqlx::query_as(
        "SELECT l.partisi, l.baris FROM unnest(ARRAY['pesan_diproses', 'pesanan_riwayat']) t,
             LATERAL urutan_partisi_lepas(t, interval '30 days') l",
    )
    .fetch_all(&db)
    .await
    .expect("detach");
    let names: Vec<&str> = detached.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names.len(),
        2,
        "the 40-day-old day of both tables: {names:?}"
    );
    assert!(
        !partitions_of(&db, "pesan_diproses")
            .await
            .iter()
            .any(|p| names.contains(&p.as_str())),
        "detached"
    );
    assert_eq!(
        count(&db, "SELECT count(*) FROM pesan_diproses").await,
        1_000,
        "the detached day is no longer read"
    );

    // The second step, held open: the workers' statements do not wait.
    let mut dropping = db.begin().await.expect("begin");
    let dropped: Vec<String> = sqlx::query_scalar(
        "SELECT h.partisi FROM unnest(ARRAY['pesan_diproses', 'pesanan_riwayat']) t,
             LATERAL urutan_partisi_hapus(t) h",
    )
    .fetch_all(&mut *dropping)
    .await
    .expect("drop the detached days");
    assert_eq!(dropped.len(), 2, "{dropped:?}");
    for sql in [dedup_insert, history_insert, read_every_day] {
        insert_waits_at_most_500ms(&db, sql)
            .await
            .unwrap_or_else(|e| panic!("waited behind the drop of a detached day: {e}\n{sql}"));
    }
    dropping.commit().await.expect("commit the drop");
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_class WHERE relname = ANY ($1)")
        .bind(&names)
        .fetch_one(&db)
        .await
        .expect("look for the tables");
    assert_eq!(left, 0, "both detached days dropped");

    // The previous way, for contrast: a drop of an attached day, held open,
    // makes the same insert wait (so the check above can fail).
    fill_day(&db, 41, 10).await;
    let mut old_way = db.begin().await.expect("begin");
    sqlx::query("SELECT * FROM urutan_partisi_buang('pesan_diproses', interval '30 days')")
        .execute(&mut *old_way)
        .await
        .expect("drop an attached day");
    let blocked = insert_waits_at_most_500ms(&db, dedup_insert).await;
    old_way.rollback().await.expect("rollback");
    assert!(
        blocked.is_err_and(|e| e.contains("lock timeout")),
        "an insert went ahead while an attached day was being dropped"
    );

    // A table of a day's name that urutan did not detach (a team's copy) is
    // never dropped; the day itself goes through the pool's purge.
    sqlx::query("CREATE TABLE pesan_diproses_h20000101 (message_id text)")
        .execute(&db)
        .await
        .expect("a team's table");
    sqlx::query("ANALYZE pesan_diproses")
        .execute(&db)
        .await
        .expect("analyze");
    let purged = urutan::store::purge_expired(&db, Duration::from_secs(30 * 86_400))
        .await
        .expect("purge");
    assert_eq!(purged, 10, "the 41-day-old day (estimated rows)");
    let day_41 = day_tag(&db, 41).await;
    assert!(
        partitions_of(&db, "pesan_diproses")
            .await
            .iter()
            .all(|p| !p.ends_with(&day_41)),
        "the 41-day-old day expired"
    );
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM pg_class WHERE relname = 'pesan_diproses_h20000101'"
        )
        .await,
        1,
        "a table urutan did not detach stays"
    );
}

/// `YYYYMMDD` of the UTC day `days_ago` days before today.
async fn day_tag(db: &PgPool, days_ago: i32) -> String {
    sqlx::query_scalar("SELECT to_char((now() AT TIME ZONE 'UTC')::date - $1, 'YYYYMMDD')")
        .bind(days_ago)
        .fetch_one(db)
        .await
        .expect("a day")
}

/// A relay and a worker that start together both prepare the next id-range
/// partition: the second waits for the first and finds it made (the demo's
/// log once had `WARN relation "outbox_p16777217" already exists`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_preparing_the_next_id_partition_never_collide() {
    let env = TestEnv::new("partition_race").await;
    let db = env.db().await;
    // The first id handed out: the next range partition is now due.
    sqlx::query("SELECT urutan_enqueue('R-1', 'dibuat', 1)")
        .execute(&db)
        .await
        .expect("enqueue");
    let mut first = db.begin().await.expect("begin");
    let made = urutan::store::prepare_id_partitions(&mut *first)
        .await
        .expect("the first preparation");
    assert_eq!(made, 1, "the next outbox partition");
    let second = tokio::spawn({
        let db = db.clone();
        async move { urutan::store::prepare_id_partitions(&db).await }
    });
    // The second runs while the first has not committed.
    tokio::time::sleep(Duration::from_millis(500)).await;
    first.commit().await.expect("commit");
    let second = tokio::time::timeout(Duration::from_secs(30), second)
        .await
        .expect("the second preparation ends")
        .expect("join");
    assert_eq!(
        second.expect("the second preparation"),
        0,
        "nothing left to make"
    );
}
