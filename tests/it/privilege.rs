//! The least-privilege PostgreSQL roles of `deploy/postgres/least-privilege.sql`:
//! the worker, the relay and a producer run the whole pipeline (including a
//! resharding and the dedup purge) with only their grants, cannot do what
//! they do not need, and a role that may not migrate stops with a clear
//! message when migrations are pending.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use urutan::config::{SecretUrl, Settings};

use crate::common::*;
use crate::handoff::{drain_and_check, produce, start_relay};

/// The SQLSTATE of running `sql` as the role behind `url` (None: allowed).
async fn refusal(url: &SecretUrl, sql: &'static str) -> Option<String> {
    let db = urutan::store::connect(url, 1).await.expect("connect");
    let result = sqlx::query(sql).execute(&db).await;
    db.close().await;
    match result {
        Ok(_) => None,
        Err(sqlx::Error::Database(e)) => e.code().map(|c| c.into_owned()),
        Err(e) => panic!("{sql}: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_privilege_roles_run_the_pipeline_and_nothing_more() {
    let env = TestEnv::new("privilege").await;
    let admin = env.db().await; // the owner applies the migrations
    let roles = PgRoles::create(&env, &[]);
    let as_role = |role: &str, shards: u16| {
        let mut s = env.settings(shards);
        s.database_url = roles.secret_url(role);
        s.database_pool_size = Some(4);
        s
    };

    let pool = RunningPool::start(as_role("worker", 4)).await;
    pool.wait_ready().await;
    // A ring change cut short: the relay role must open the epoch and clear
    // the flag before it publishes.
    sqlx::query("INSERT INTO urutan_jendela (sebab) VALUES ('a test cut it short')")
        .execute(&admin)
        .await
        .expect("flag");
    let relay = start_relay(as_role("relay", 4));
    wait_for("the relay opened the epoch", Duration::from_secs(30), || {
        let admin = admin.clone();
        async move {
            let sql = "SELECT count(*) FROM urutan_epoch WHERE alasan = 'a ring change was cut short'";
            count(&admin, sql).await == 1
        }
    })
    .await;
    let producer_db = urutan::store::connect(&roles.secret_url("producer"), 2)
        .await
        .expect("producer connects");
    let producer = tokio::spawn(produce(
        producer_db,
        50,
        8,
        Duration::from_millis(300),
        Arc::new(AtomicBool::new(false)),
    ));
    // A resharding as the worker role: ring record, shard registry, epochs.
    tokio::time::sleep(Duration::from_secs(1)).await;
    pool.stop().await;
    let pool = RunningPool::start(as_role("worker", 6)).await;
    let written = drain_and_check(&admin, producer, relay, vec![pool], 50).await;
    assert_eq!(
        count(&admin, "SELECT count(*) FROM urutan_ring").await,
        2,
        "the grow was recorded"
    );
    assert_eq!(
        count(
            &admin,
            "SELECT count(*) FROM urutan_jendela WHERE epoch IS NULL"
        )
        .await,
        0,
        "the flag was cleared"
    );
    // The dedup purge as the worker role.
    let worker_db = urutan::store::connect(&roles.secret_url("worker"), 1)
        .await
        .expect("worker connects");
    let purged = urutan::store::purge_expired(&worker_db, Duration::ZERO)
        .await
        .expect("the worker may purge expired message ids");
    assert_eq!(purged as i64, written);
    worker_db.close().await;

    // Nothing more than that.
    let denied = "42501";
    for (role, sql) in [
        ("worker", "SELECT count(*) FROM outbox"),
        ("worker", "DELETE FROM pesanan"),
        ("worker", "DELETE FROM pesanan_riwayat"),
        ("worker", "CREATE TABLE intruder (x int)"),
        ("relay", "SELECT count(*) FROM pesanan"),
        (
            "relay",
            "INSERT INTO urutan_ring (shard_count, epoch, oleh) VALUES (1, 1, 'x')",
        ),
        ("producer", "SELECT payload FROM outbox"),
        ("producer", "DELETE FROM outbox"),
    ] {
        assert_eq!(
            refusal(&roles.secret_url(role), sql).await.as_deref(),
            Some(denied),
            "{role} may run {sql}"
        );
    }

    // A pending migration: the worker role stops with a clear message; the
    // owner applies it.
    sqlx::query(
        "DELETE FROM _sqlx_migrations WHERE version = (SELECT max(version) FROM _sqlx_migrations)",
    )
    .execute(&admin)
    .await
    .expect("forget the last migration");
    let refused = urutan::store::prepare(&roles.secret_url("worker"), 1)
        .await
        .expect_err("a worker role applied a migration");
    assert!(
        refused
            .to_string()
            .contains("run `urutan migrate` as the database owner"),
        "unclear: {refused}"
    );
    urutan::store::prepare(&env.database_url(), 1)
        .await
        .expect("the owner migrates")
        .close()
        .await;
    urutan::store::prepare(&roles.secret_url("worker"), 1)
        .await
        .expect("the worker role starts once migrated")
        .close()
        .await;
    admin.close().await;
}

/// What the least-privilege script and the migrations close (issue 29):
/// PUBLIC may neither connect to the database nor create temporary objects;
/// the operator may set a dead-lettered effect pending again but not
/// rewrite what it sends; a SECURITY DEFINER function reads its own
/// tables, never a caller's temporary table of the same name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn public_has_no_connect_or_temp_and_definer_functions_ignore_pg_temp() {
    let env = TestEnv::new("privilege_pub").await;
    let admin = env.db().await; // the owner applies the migrations
    let roles = PgRoles::create(&env, &["operator"]);
    let public: (bool, bool) = sqlx::query_as(
        "SELECT has_database_privilege('public', current_database(), 'CONNECT'),
                has_database_privilege('public', current_database(), 'TEMPORARY')",
    )
    .fetch_one(&admin)
    .await
    .expect("privileges");
    assert_eq!(public, (false, false), "PUBLIC keeps CONNECT/TEMPORARY");
    assert_eq!(
        refusal(&roles.secret_url("worker"), "CREATE TEMP TABLE t (x int)")
            .await
            .as_deref(),
        Some("42501"),
        "the worker may create temporary tables"
    );

    let operator = roles.secret_url("operator");
    for sql in [
        "UPDATE urutan_efek SET isi = '{}'",
        "UPDATE urutan_efek SET message_id = 'x'",
        "UPDATE urutan_efek SET tujuan = 1",
    ] {
        assert_eq!(
            refusal(&operator, sql).await.as_deref(),
            Some("42501"),
            "the operator may run {sql}"
        );
    }
    let replay = "UPDATE urutan_efek SET keadaan = 'menunggu', percobaan = 0, coba_pada = now(),
                  sewa_sampai = NULL, sewa_oleh = NULL, selesai_pada = NULL
                  WHERE keadaan = 'gagal' AND efek = ANY('{1}')";
    assert_eq!(refusal(&operator, replay).await, None, "replay --effects");

    // No route is configured; a temporary table says there is one.
    let mut conn = admin.acquire().await.expect("a connection");
    sqlx::query("CREATE TEMP TABLE urutan_efek_rute (status text)")
        .execute(&mut *conn)
        .await
        .expect("temp table");
    sqlx::query("INSERT INTO pg_temp.urutan_efek_rute VALUES ('*')")
        .execute(&mut *conn)
        .await
        .expect("temp row");
    let active: bool = sqlx::query_scalar("SELECT urutan_efek_aktif()")
        .fetch_one(&mut *conn)
        .await
        .expect("urutan_efek_aktif");
    assert!(!active, "the function read the caller's temporary table");
    let unsafe_paths: Vec<String> = sqlx::query_scalar(
        "SELECT p.proname::text FROM pg_proc p
         WHERE p.prosecdef AND p.pronamespace = current_schema()::regnamespace
           AND NOT coalesce(p.proconfig, '{}') @> ARRAY['search_path=public, pg_temp']",
    )
    .fetch_all(&mut *conn)
    .await
    .expect("definer functions");
    assert!(
        unsafe_paths.is_empty(),
        "search_path not pinned: {unsafe_paths:?}"
    );
}

/// No SECURITY DEFINER function is PUBLIC's to run (issue 43: a producer
/// deleted 59 of 60 epochs through `urutan_epoch_pangkas`): every one, read
/// from the catalog, has EXECUTE revoked from PUBLIC, and the least-privilege
/// producer is refused the ones the worker and the relay are granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_definer_function_is_publics_to_run() {
    let env = TestEnv::new("privilege_definer").await;
    let admin = env.db().await;
    let roles = PgRoles::create(&env, &["operator"]);
    let definers: i64 = count(
        &admin,
        "SELECT count(*) FROM pg_proc p
         WHERE p.prosecdef AND p.pronamespace = current_schema()::regnamespace",
    )
    .await;
    assert!(definers >= 10, "only {definers} definer functions found");
    let public: Vec<String> = sqlx::query_scalar(
        "SELECT p.oid::regprocedure::text FROM pg_proc p
         WHERE p.prosecdef AND p.pronamespace = current_schema()::regnamespace
           AND (p.proacl IS NULL OR EXISTS (
                SELECT 1 FROM aclexplode(p.proacl) a
                WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE'))
         ORDER BY 1",
    )
    .fetch_all(&admin)
    .await
    .expect("definer functions");
    assert!(public.is_empty(), "PUBLIC may run {public:?}");
    sqlx::query("INSERT INTO urutan_epoch (alasan) SELECT 'test' FROM generate_series(1, 5)")
        .execute(&admin)
        .await
        .expect("epochs");
    let epochs = count(&admin, "SELECT count(*) FROM urutan_epoch").await;
    for (role, sql) in [
        ("producer", "SELECT urutan_epoch_pangkas(0)"),
        ("producer", "SELECT urutan_efek_aktif()"),
        ("operator", "SELECT urutan_epoch_pangkas(0)"),
        ("producer", "SELECT urutan_partisi_id_siapkan()"),
    ] {
        assert_eq!(
            refusal(&roles.secret_url(role), sql).await.as_deref(),
            Some("42501"),
            "{role} may run {sql}"
        );
    }
    assert_eq!(
        count(&admin, "SELECT count(*) FROM urutan_epoch").await,
        epochs,
        "epochs were pruned"
    );
    // The roles that need them still may.
    for (role, sql) in [
        ("worker", "SELECT urutan_epoch_pangkas(1000)"),
        ("relay", "SELECT urutan_epoch_pangkas(1000)"),
        ("worker", "SELECT urutan_efek_aktif()"),
    ] {
        assert_eq!(
            refusal(&roles.secret_url(role), sql).await,
            None,
            "{role} may not run {sql}"
        );
    }
    admin.close().await;
}

/// The dispatcher and the operator update only the columns their code
/// does (issue 29): neither can rewrite what a webhook sends nor what a
/// dead-letter record says about its message, also where an older run of
/// the script had granted UPDATE on the whole table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dispatcher_and_operator_cannot_rewrite_payloads() {
    let env = TestEnv::new("privilege_cols").await;
    let admin = env.db().await; // the owner applies the migrations
    let roles = PgRoles::create(&env, &["operator", "dispatcher"]);
    // A deployment that ran an older script: table-wide UPDATE grants.
    for grant in [
        format!(
            "GRANT UPDATE ON urutan_efek TO {}",
            roles.name("dispatcher")
        ),
        format!(
            "GRANT UPDATE ON urutan_dead_letter TO {}",
            roles.name("operator")
        ),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(grant))
            .execute(&admin)
            .await
            .expect("old grant");
    }
    roles.rerun();
    admin.close().await;

    let dispatcher = roles.secret_url("dispatcher");
    let operator = roles.secret_url("operator");
    for (url, sql) in [
        (&dispatcher, "UPDATE urutan_efek SET isi = '{}'"),
        (&dispatcher, "UPDATE urutan_efek SET message_id = 'x'"),
        (&dispatcher, "UPDATE urutan_efek SET pesanan_id = 'x'"),
        (&dispatcher, "UPDATE urutan_efek SET versi = 1"),
        (&dispatcher, "UPDATE urutan_efek SET tujuan = 1"),
        (&operator, "UPDATE urutan_dead_letter SET body = ''"),
        (&operator, "UPDATE urutan_dead_letter SET headers = '{}'"),
        (&operator, "UPDATE urutan_dead_letter SET message_id = 'x'"),
        (&operator, "UPDATE urutan_dead_letter SET pesanan_id = 'x'"),
        (&operator, "UPDATE urutan_dead_letter SET routing_key = 'x'"),
        (&operator, "UPDATE urutan_dead_letter SET exchange = 'x'"),
        (&operator, "UPDATE urutan_dead_letter SET reason = 'x'"),
    ] {
        assert_eq!(
            refusal(url, sql).await.as_deref(),
            Some("42501"),
            "allowed: {sql}"
        );
    }
    // What their code updates (a claim, a result; a resolve, an x-death).
    for (url, sql) in [
        (
            &dispatcher,
            "UPDATE urutan_efek SET sewa_sampai = now(), sewa_oleh = 'd', percobaan = percobaan + 1
             WHERE efek = -1",
        ),
        (
            &dispatcher,
            "UPDATE urutan_efek SET keadaan = 'gagal', kode = 500, jawaban = 'x',
             sewa_sampai = NULL, sewa_oleh = NULL, coba_pada = now(), selesai_pada = now()
             WHERE efek = -1",
        ),
        (
            &operator,
            "UPDATE urutan_dead_letter SET resolved_at = now(), resolution = 'purged'
             WHERE id = -1",
        ),
        (
            &operator,
            "UPDATE urutan_dead_letter SET x_death = '[]' WHERE id = -1",
        ),
    ] {
        assert_eq!(refusal(url, sql).await, None, "refused: {sql}");
    }
}

/// `least-privilege.sql -v schema=...` (issue 44): a pipeline in its own
/// `DATABASE_SCHEMA` runs with the roles it makes, and the least-privilege
/// operator can read an order with `urutan explain` and the pipeline with
/// `urutan status` (explain used to fail on `urutan_epoch`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_privilege_roles_run_a_pipeline_in_its_own_schema() {
    let env = TestEnv::new("privilege_schema").await;
    let owner = Settings {
        entity: "tagihan".to_owned(),
        topology_prefix: "tagihan".to_owned(),
        database_schema: "billing".to_owned(),
        ..env.settings(2)
    };
    // The owner migrates (the schema is created with the tables).
    RunningPool::ready(owner.clone()).await.stop().await;
    let roles = PgRoles::create_in(&env, &["operator"], "billing");
    let mut worker = owner.clone();
    worker.database_url = roles.secret_url("worker");
    worker.database_pool_size = Some(4);
    let pool = RunningPool::ready(worker).await;
    let producer = urutan::store::connect(&roles.secret_url("producer"), 1)
        .await
        .expect("producer connects");
    let mut relay = owner.clone();
    relay.database_url = roles.secret_url("relay");
    let relay = start_relay(relay);
    for v in 1..=3_i64 {
        sqlx::query("SELECT billing.urutan_enqueue('INV-1', 'ditagih', $1)")
            .bind(v)
            .execute(&producer)
            .await
            .expect("the producer enqueues in its pipeline's schema");
    }
    let admin = env.db().await;
    wait_count(
        &admin,
        "SELECT count(*) FROM billing.pesanan WHERE id = 'INV-1' AND versi = 3",
        1,
        Duration::from_secs(30),
    )
    .await;
    let operator = roles.url("operator");
    let vars = [
        ("DATABASE_URL", operator.as_str()),
        ("DATABASE_SCHEMA", "billing"),
        ("ENTITY", "tagihan"),
    ];
    let explained = urutan(&env, &vars, &["explain", "INV-1"]).await;
    assert!(explained.ok(), "explain as the operator: {explained}");
    assert!(explained.stdout.contains("INV-1"), "{explained}");
    let status = urutan(&env, &vars, &["status", "--json"]).await;
    assert!(
        status.code == Some(0) || status.code == Some(1),
        "status as the operator: {status}"
    );
    assert!(
        !status.stderr.contains("permission denied"),
        "status as the operator: {status}"
    );
    relay.0.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), relay.1).await;
    pool.stop().await;
    producer.close().await;
    admin.close().await;
}

/// A permission refused mid-command cannot heal: every operator command
/// stops with exit 2 and one line naming DATABASE_URL and the fix (issue
/// 44: `hold`, `dlq`, `verify` and `topology` exited 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_permission_exits_2_in_every_command() {
    let env = TestEnv::new("privilege_exit").await;
    env.db().await.close().await; // migrated by the owner
    let roles = PgRoles::create(&env, &[]);
    let relay = roles.url("relay");
    let vars = [("DATABASE_URL", relay.as_str())];
    for args in [
        &["hold", "list"][..],
        &["hold", "release", "X"],
        &["dlq", "show", "X"],
        &["verify"],
        &["topology"],
    ] {
        let ran = urutan(&env, &vars, args).await;
        assert_eq!(ran.code, Some(2), "{args:?}: {ran}");
        let line = ran.stderr.lines().last().unwrap_or_default();
        assert!(
            line.starts_with("error: DATABASE_URL") && line.contains("permission denied"),
            "{args:?}: {ran}"
        );
    }
}

/// Issue 43: the producer role inserts only the columns a producer states
/// (agregat_tipe, agregat_id, routing_key, payload, traceparent), also where
/// an older run of the script granted INSERT on the whole table: a planted
/// `id` made another producer's `urutan_enqueue` fail with a duplicate key,
/// and a planted `dikirim_pada` or set-aside mark hid a row from the relay.
/// A row the relay could not publish fails in the producer's own
/// transaction (the CHECK constraints of migration 0038).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_producer_writes_only_its_columns_and_only_rows_the_relay_can_publish() {
    let env = TestEnv::new("privilege_producer").await;
    let admin = env.db().await; // the owner applies the migrations
    let roles = PgRoles::create(&env, &[]);
    let old_grant = format!("GRANT INSERT ON outbox TO {}", roles.name("producer"));
    sqlx::query(sqlx::AssertSqlSafe(old_grant))
        .execute(&admin)
        .await
        .expect("old grant");
    roles.rerun();
    admin.close().await;
    let producer = roles.secret_url("producer");

    for sql in [
        "INSERT INTO outbox (id, agregat_tipe, agregat_id, routing_key, payload)
         VALUES (nextval('outbox_id_seq') + 1, 'pesanan', 'P', 'pesanan.x',
                 '{\"id\": \"P\", \"status\": \"s\", \"versi\": 1}')",
        "INSERT INTO outbox (agregat_tipe, agregat_id, routing_key, payload, dikirim_pada)
         VALUES ('pesanan', 'P', 'pesanan.x', '{\"id\": \"P\", \"status\": \"s\", \"versi\": 1}', now())",
        "INSERT INTO outbox (agregat_tipe, agregat_id, routing_key, payload, dibuat_pada)
         VALUES ('pesanan', 'P', 'pesanan.x', '{\"id\": \"P\", \"status\": \"s\", \"versi\": 1}', now())",
        "INSERT INTO outbox (agregat_tipe, agregat_id, routing_key, payload, unroutable_at)
         VALUES ('pesanan', 'P', 'pesanan.x', '[]', now())",
        "INSERT INTO outbox (agregat_tipe, agregat_id, routing_key, payload, alasan_sisih)
         VALUES ('pesanan', 'P', 'pesanan.x', '{\"id\": \"P\", \"status\": \"s\", \"versi\": 1}', 'x')",
        "UPDATE outbox SET dikirim_pada = now()",
    ] {
        assert_eq!(
            refusal(&producer, sql).await.as_deref(),
            Some("42501"),
            "the producer may run {sql}"
        );
    }
    let check = "23514";
    for sql in [
        "INSERT INTO outbox (agregat_tipe, agregat_id, routing_key, payload)
         VALUES ('pesanan', 'P', 'pesanan.' || repeat('k', 292),
                 '{\"id\": \"P\", \"status\": \"s\", \"versi\": 1}')",
        "INSERT INTO outbox (agregat_tipe, agregat_id, routing_key, payload)
         VALUES ('pesanan', 'P', '', '{\"id\": \"P\", \"status\": \"s\", \"versi\": 1}')",
        "INSERT INTO outbox (agregat_tipe, agregat_id, routing_key, payload)
         SELECT 'pesanan', i, 'pesanan.x', jsonb_build_object('id', i, 'status', 's', 'versi', 1)
         FROM repeat('i', 200 * 1024) AS i",
        "INSERT INTO outbox (agregat_tipe, agregat_id, routing_key, payload)
         SELECT 'pesanan', i, 'pesanan.x', jsonb_build_object('id', i, 'status', 's', 'versi', 1)
         FROM (VALUES (E'a\\nb'), ('')) AS v (i)",
        "INSERT INTO outbox (agregat_tipe, agregat_id, routing_key, payload)
         VALUES ('pesanan', 'P', 'pesanan.x', '[\"P\", \"s\", 1]')",
        "INSERT INTO outbox (agregat_tipe, agregat_id, routing_key, payload)
         VALUES ('pesanan', 'P', 'pesanan.x', '{\"status\": \"s\", \"versi\": 1}')",
        "INSERT INTO outbox (agregat_tipe, agregat_id, routing_key, payload)
         VALUES ('pesanan', 'P', 'pesanan.x', '{\"id\": \"Q\", \"status\": \"s\", \"versi\": 1}')",
        "INSERT INTO outbox (agregat_tipe, agregat_id, routing_key, payload)
         VALUES ('pesanan', 'P', 'pesanan.x', '{\"id\": \"P\", \"status\": \"\", \"versi\": 1}')",
        "INSERT INTO outbox (agregat_tipe, agregat_id, routing_key, payload)
         VALUES ('pesanan', 'P', 'pesanan.x', '{\"id\": \"P\", \"status\": \"s\", \"versi\": 0}')",
        "INSERT INTO outbox (agregat_tipe, agregat_id, routing_key, payload)
         VALUES ('pesanan', 'P', 'pesanan.x', '{\"id\": \"P\", \"status\": \"s\", \"versi\": 1.5}')",
        "INSERT INTO outbox (agregat_tipe, agregat_id, routing_key, payload)
         VALUES ('pesanan', 'P', 'pesanan.x', '{\"id\": \"P\", \"status\": \"s\", \"versi\": \"1\"}')",
        "INSERT INTO outbox (agregat_tipe, agregat_id, routing_key, payload)
         VALUES ('pesanan', 'P', 'pesanan.x',
                 '{\"id\": \"P\", \"status\": \"s\", \"versi\": 9007199254740992}')",
    ] {
        assert_eq!(
            refusal(&producer, sql).await.as_deref(),
            Some(check),
            "not refused by a CHECK: {sql}"
        );
    }
    // What a producer writes, with INSERT and with urutan_enqueue.
    for sql in [
        "INSERT INTO outbox (agregat_tipe, agregat_id, routing_key, payload, traceparent)
         VALUES ('pesanan', 'P', 'pesanan.x',
                 '{\"id\": \"P\", \"status\": \"s\", \"versi\": 1, \"data\": [1]}',
                 '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01')
         RETURNING id",
        "SELECT urutan_enqueue('P', 'dibayar', 2)",
    ] {
        assert_eq!(refusal(&producer, sql).await, None, "refused: {sql}");
    }
}
