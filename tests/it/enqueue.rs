//! `urutan_enqueue` (docs/contract.md section 4): producers in any language
//! enqueue with one SQL call in their own transaction. A rollback leaves no
//! event; a commit wakes the relay at once (NOTIFY, measured against its
//! one-second poll) and the pool applies it; a plain `INSERT INTO outbox`
//! still works; a call that would become a dead letter fails in the
//! producer's transaction; the default routing key follows the pipeline's
//! own entity, prefix and schema; the least-privilege producer may call it.

use std::time::{Duration, Instant};

use sqlx::postgres::PgListener;
use sqlx::{PgConnection, PgPool};
use urutan::config::Settings;

use crate::common::*;
use crate::handoff::start_relay;

/// `SELECT urutan_enqueue($1, $2, $3, $4)` on `conn` (a producer transaction).
async fn enqueue(
    conn: &mut PgConnection,
    id: &str,
    status: &str,
    versi: i64,
    data: Option<serde_json::Value>,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT urutan_enqueue($1, $2, $3, $4)")
        .bind(id)
        .bind(status)
        .bind(versi)
        .bind(data.map(sqlx::types::Json))
        .fetch_one(conn)
        .await
}

/// Waits until outbox row `id` is confirmed by the broker, then until its
/// version is applied; returns both times, measured from `from`.
async fn sent_then_applied(db: &PgPool, id: i64, from: Instant) -> (Duration, Duration) {
    let limit = Duration::from_secs(20);
    let poll = async |sql: &'static str| loop {
        let done: bool = sqlx::query_scalar(sql)
            .bind(id)
            .fetch_one(db)
            .await
            .expect("poll");
        if done {
            return from.elapsed();
        }
        assert!(
            from.elapsed() < limit,
            "outbox row {id}: not through in {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    let sent = poll("SELECT dikirim_pada IS NOT NULL FROM outbox WHERE id = $1").await;
    let applied =
        poll("SELECT EXISTS (SELECT 1 FROM pesan_diproses WHERE message_id = $1::text)").await;
    (sent, applied)
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueued_in_a_producer_transaction_is_applied_if_and_only_if_it_commits() {
    let env = TestEnv::new("enqueue").await;
    let pool = RunningPool::ready(env.settings(4)).await;
    let (relay_stop, relay) = start_relay(env.settings(4));
    let db = env.db().await;
    sqlx::query("CREATE TABLE toko (id TEXT PRIMARY KEY, status TEXT NOT NULL)")
        .execute(&db)
        .await
        .expect("the producer's own table");

    // Rolled back with the producer's own write: the event never existed.
    let mut tx = db.begin().await.expect("begin");
    sqlx::query("INSERT INTO toko VALUES ('E-RB', 'dibuat')")
        .execute(&mut *tx)
        .await
        .expect("own write");
    enqueue(&mut tx, "E-RB", "dibuat", 1, None)
        .await
        .expect("enqueue");
    tx.rollback().await.expect("rollback");

    // Committed: 20 orders × 3 versions, each in the transaction of its own write.
    let statuses = ["dibuat", "dibayar", "dikirim"];
    for versi in 1..=3_i64 {
        for order in 0..20 {
            let id = format!("E-{order}");
            let status = statuses[versi as usize - 1];
            let mut tx = db.begin().await.expect("begin");
            sqlx::query(
                "INSERT INTO toko VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET status = $2",
            )
            .bind(&id)
            .bind(status)
            .execute(&mut *tx)
            .await
            .expect("own write");
            let data = (versi % 2 == 1).then(|| serde_json::json!({"n": versi}));
            enqueue(&mut tx, &id, status, versi, data)
                .await
                .expect("enqueue");
            tx.commit().await.expect("commit");
        }
    }
    // A plain INSERT INTO outbox, without NOTIFY: the relay's poll finds it.
    sqlx::query(
        "INSERT INTO outbox (agregat_tipe, agregat_id, routing_key, payload)
         VALUES ('pesanan', 'E-PLAIN', 'pesanan.jakarta.dibuat',
                 '{\"id\": \"E-PLAIN\", \"status\": \"dibuat\", \"versi\": 1}')",
    )
    .execute(&db)
    .await
    .expect("plain insert");

    wait_applied(&db, 61, Duration::from_secs(60)).await;
    wait_count(
        &db,
        "SELECT count(*) FROM outbox WHERE dikirim_pada IS NULL",
        0,
        Duration::from_secs(10),
    )
    .await;
    let checks: [(&str, &'static str, i64); 7] = [
        (
            "every order at its last version",
            "SELECT count(*) FROM pesanan WHERE id LIKE 'E-_%' AND versi = 3 AND status = 'dikirim'
               AND data = '{\"n\": 3}'",
            20,
        ),
        (
            "the plain insert applied",
            "SELECT count(*) FROM pesanan WHERE id = 'E-PLAIN' AND versi = 1",
            1,
        ),
        (
            "the rolled-back event left no trace",
            "SELECT (SELECT count(*) FROM pesanan WHERE id = 'E-RB')
                  + (SELECT count(*) FROM outbox WHERE agregat_id = 'E-RB')
                  + (SELECT count(*) FROM pesan_diproses WHERE pesanan_id = 'E-RB')",
            0,
        ),
        (
            "the default routing key is <prefix>.<status>, agregat_tipe the entity",
            "SELECT count(*) FROM outbox WHERE agregat_id <> 'E-PLAIN'
               AND routing_key = 'pesanan.' || (payload->>'status') AND agregat_tipe = 'pesanan'",
            60,
        ),
        (
            "the payload is the contract body, data only when given",
            "SELECT count(*) FROM outbox WHERE agregat_id <> 'E-PLAIN'
               AND payload - 'data' = jsonb_build_object('id', agregat_id,
                     'status', payload->>'status', 'versi', (payload->>'versi')::bigint)
               AND (payload ? 'data') = ((payload->>'versi')::int % 2 = 1)",
            60,
        ),
        (
            "every version applied once, in order, from its outbox row",
            "SELECT count(*) FROM pesanan_riwayat h JOIN outbox o ON o.id::text = h.message_id
             WHERE (o.payload->>'versi')::bigint = h.versi AND o.agregat_id = h.pesanan_id",
            61,
        ),
        (
            "nothing dead-lettered",
            "SELECT count(*) FROM urutan_dead_letter",
            0,
        ),
    ];
    for (what, sql, want) in checks {
        assert_eq!(count(&db, sql).await, want, "{what}");
    }

    // How fast a commit reaches the broker and the pool, the relay idle
    // (it waits for NOTIFY, polling every second): a notified relay is
    // there in milliseconds, a polling one after 0-1 s (median 500 ms).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (mut sent, mut applied) = (Vec::new(), Vec::new());
    for i in 0..7_u64 {
        // Commits at different points of the poll cycle.
        tokio::time::sleep(Duration::from_millis(150 + 110 * i)).await;
        let mut tx = db.begin().await.expect("begin");
        let id = enqueue(&mut tx, &format!("E-LAT-{i}"), "dibuat", 1, None)
            .await
            .expect("enqueue");
        tx.commit().await.expect("commit");
        let (s, a) = sent_then_applied(&db, id, Instant::now()).await;
        sent.push(s);
        applied.push(a);
    }
    eprintln!(
        "urutan_enqueue: commit to broker-confirmed median {:?} (max {:?}), to applied median {:?} (max {:?}); the relay polls every 1 s",
        median(sent.clone()),
        sent.iter().max().expect("samples"),
        median(applied.clone()),
        applied.iter().max().expect("samples"),
    );
    assert!(
        median(sent) < Duration::from_millis(300),
        "the relay is not woken at commit (it waited for its poll)"
    );

    relay_stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), relay).await;
    pool.stop().await;
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_call_fails_in_the_producers_transaction_and_notify_waits_for_commit() {
    let env = TestEnv::new("enqueue_bad").await;
    let db = env.db().await;
    let long_id = "x".repeat(129);
    let long_status = "s".repeat(65);
    let big = serde_json::json!({"s": "y".repeat(1024 * 1024)});
    type Bad<'a> = (
        Option<&'a str>,
        Option<&'a str>,
        Option<i64>,
        Option<&'a str>,
        &'a str,
    );
    let bad: [Bad; 12] = [
        (
            None,
            Some("dibuat"),
            Some(1),
            None,
            "id must be 1-128 bytes",
        ),
        (Some(""), Some("dibuat"), Some(1), None, "id must be"),
        (Some(&long_id), Some("dibuat"), Some(1), None, "id must be"),
        (Some("P"), None, Some(1), None, "status must be 1-64"),
        (Some("P"), Some(""), Some(1), None, "status must be"),
        (
            Some("P"),
            Some(&long_status),
            Some(1),
            None,
            "status must be",
        ),
        (Some("P"), Some("dibuat"), None, None, "versi must be"),
        (Some("P"), Some("dibuat"), Some(0), None, "versi must be"),
        (Some("P"), Some("dibuat"), Some(-3), None, "versi must be"),
        (
            Some("P"),
            Some("dibuat"),
            Some(1 << 53),
            None,
            "versi must be",
        ),
        (
            Some("P"),
            Some("dibuat"),
            Some(1),
            Some("lain.dibuat"),
            "routing key",
        ),
        (
            Some("P"),
            Some("dibuat"),
            Some(1),
            Some("pesananx.y"),
            "routing key",
        ),
    ];
    for (id, status, versi, key, says) in bad {
        let mut tx = db.begin().await.expect("begin");
        let err = sqlx::query_scalar::<_, i64>("SELECT urutan_enqueue($1, $2, $3, NULL, $4)")
            .bind(id)
            .bind(status)
            .bind(versi)
            .bind(key)
            .fetch_one(&mut *tx)
            .await
            .expect_err(&format!("accepted {id:?} {status:?} {versi:?} {key:?}"));
        let sqlx::Error::Database(e) = &err else {
            panic!("{err}")
        };
        assert_eq!(e.code().as_deref(), Some("22023"), "{err}");
        assert!(e.message().contains(says), "{err} should say {says:?}");
        // The producer's transaction is aborted: its own writes go too.
        assert!(
            sqlx::query("SELECT 1").execute(&mut *tx).await.is_err(),
            "the transaction goes on after a refused event"
        );
        tx.rollback().await.expect("rollback");
    }
    let mut conn = db.acquire().await.expect("conn");
    let err = enqueue(&mut conn, "P", "dibuat", 1, Some(big))
        .await
        .expect_err("a body above MAX_BODY_BYTES");
    assert!(err.to_string().contains("MAX_BODY_BYTES"), "{err}");
    assert_eq!(count(&db, "SELECT count(*) FROM outbox").await, 0);

    // The limits themselves pass; named arguments, as the contract names them.
    let edge: i64 = sqlx::query_scalar(
        "SELECT urutan_enqueue(id => repeat('x', 128), status => repeat('s', 64),
                               versi => 9007199254740991, routing_key => 'pesanan')",
    )
    .fetch_one(&mut *conn)
    .await
    .expect("the contract's limits are valid");
    assert!(edge > 0);

    // NOTIFY urutan_outbox: at commit, never before it, never on rollback.
    let mut listener = PgListener::connect(env.database_url().expose())
        .await
        .expect("listener");
    listener.listen("urutan_outbox").await.expect("listen");
    let quiet = async |l: &mut PgListener| {
        tokio::time::timeout(Duration::from_millis(300), l.recv())
            .await
            .is_err()
    };
    let mut tx = db.begin().await.expect("begin");
    enqueue(&mut tx, "N-1", "dibuat", 1, None)
        .await
        .expect("enqueue");
    assert!(quiet(&mut listener).await, "notified before commit");
    tx.rollback().await.expect("rollback");
    assert!(quiet(&mut listener).await, "notified on rollback");
    let mut tx = db.begin().await.expect("begin");
    enqueue(&mut tx, "N-1", "dibuat", 1, None)
        .await
        .expect("enqueue");
    tx.commit().await.expect("commit");
    let note = tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .expect("no NOTIFY within 5 s of the commit")
        .expect("listener");
    assert_eq!(note.channel(), "urutan_outbox");

    // The least-privilege producer may call it; the worker may not enqueue.
    let roles = PgRoles::create(&env, &[]);
    for (role, allowed) in [("producer", true), ("worker", false)] {
        let as_role = urutan::store::connect(&roles.secret_url(role), 1)
            .await
            .expect("connect");
        let mut tx = as_role.begin().await.expect("begin");
        let result = enqueue(&mut tx, "P-ROLE", "dibuat", 1, None).await;
        match (&result, allowed) {
            (Ok(_), true) => {}
            (Err(sqlx::Error::Database(e)), false) if e.code().as_deref() == Some("42501") => {}
            _ => panic!("{role}: {result:?}"),
        }
        drop(tx);
        as_role.close().await;
    }
    drop(conn);
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_routing_key_follows_the_pipelines_entity_prefix_and_schema() {
    let env = TestEnv::new("enqueue_entity").await;
    let shipments = Settings {
        entity: "pengiriman".to_owned(),
        database_schema: "pengiriman".to_owned(),
        topology_prefix: "pengiriman".to_owned(),
        ..env.settings(2)
    };
    // `urutan run` records its entity and prefix for urutan_enqueue.
    let pool = RunningPool::ready(shipments.clone()).await;
    let (relay_stop, relay) = start_relay(shipments);
    // A producer session on the default search_path calls the schema's function.
    let db = env.db().await;
    for versi in 1..=3_i64 {
        let mut tx = db.begin().await.expect("begin");
        sqlx::query_scalar::<_, i64>("SELECT pengiriman.urutan_enqueue('S-1', 'dikirim', $1)")
            .bind(versi)
            .fetch_one(&mut *tx)
            .await
            .expect("enqueue");
        tx.commit().await.expect("commit");
    }
    wait_count(
        &db,
        "SELECT count(*) FROM pengiriman.pesanan_riwayat",
        3,
        Duration::from_secs(60),
    )
    .await;
    let checks: [(&str, &'static str, i64); 3] = [
        (
            "rows in the pipeline's own outbox, keyed <prefix>.<status>",
            "SELECT count(*) FROM pengiriman.outbox
             WHERE routing_key = 'pengiriman.dikirim' AND agregat_tipe = 'pengiriman'",
            3,
        ),
        (
            "nothing in the default pipeline's outbox",
            "SELECT count(*) FROM public.outbox",
            0,
        ),
        (
            "applied in order",
            "SELECT count(*) FROM pengiriman.pesanan WHERE id = 'S-1' AND versi = 3",
            1,
        ),
    ];
    for (what, sql, want) in checks {
        assert_eq!(count(&db, sql).await, want, "{what}");
    }
    relay_stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), relay).await;
    pool.stop().await;
    db.close().await;
}
