//! A second team's pipeline (`ENTITY=tagihan`, `DATABASE_SCHEMA=billing`)
//! in its own words: every reason and report names `x-tagihan-id`, its
//! state and history read under its own name, and a forgotten `ENTITY` or
//! `DATABASE_SCHEMA` is one line naming the setting, never advice that
//! would start a second pipeline (issue 48, item 1).

use std::time::Duration;

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString};
use urutan::config::Settings;
use urutan_testkit::fixtures::{Raw, RunningPool, TestEnv, urutan, wait_count};

/// A pool on the test's database that migrates nothing (`TestEnv::db`
/// would migrate `public`).
async fn plain_db(env: &TestEnv) -> sqlx::PgPool {
    urutan::store::connect(&env.database_url(), 2)
        .await
        .expect("connect")
}

const BILLING: [(&str, &str); 2] = [("ENTITY", "tagihan"), ("DATABASE_SCHEMA", "billing")];

fn billing(settings: &Settings) -> Settings {
    Settings {
        entity: "tagihan".to_owned(),
        database_schema: "billing".to_owned(),
        topology_prefix: "tagihan".to_owned(),
        ..settings.clone()
    }
}

/// An invoice event with its id in header `header`.
fn invoice(header: &str, id: &str, versi: i64) -> Raw<'static> {
    let mut headers = FieldTable::default();
    headers.insert(
        header.into(),
        AMQPValue::LongString(LongString::from(id.as_bytes())),
    );
    let body = serde_json::json!({"id": id, "status": "terbit", "versi": versi});
    Raw {
        exchange: "tagihan",
        routing_key: "tagihan.terbit",
        props: BasicProperties::default()
            .with_message_id(format!("inv-{id}-v{versi}").into())
            .with_delivery_mode(2)
            .with_headers(headers),
        body: body.to_string().into_bytes(),
    }
}

/// Runs the billing pipeline until one invoice is applied and one message
/// with the default entity's header is dead-lettered.
async fn billing_pipeline(env: &TestEnv) {
    let pool = RunningPool::ready(billing(&env.settings(2))).await;
    let publisher = env.publisher().await;
    publisher
        .send_raw(vec![
            invoice("x-tagihan-id", "T-1", 1),
            invoice("x-pesanan-id", "T-2", 1),
        ])
        .await;
    let db = plain_db(env).await;
    let limit = Duration::from_secs(60);
    wait_count(&db, "SELECT count(*) FROM billing.pesanan", 1, limit).await;
    wait_count(
        &db,
        "SELECT count(*) FROM billing.urutan_dead_letter",
        1,
        limit,
    )
    .await;
    pool.stop().await;
}

#[tokio::test]
async fn a_second_team_reads_its_own_header_and_names() {
    let env = TestEnv::new("words_own").await;
    billing_pipeline(&env).await;
    let db = plain_db(&env).await;

    let (reason, detail): (String, String) =
        sqlx::query_as("SELECT reason, detail FROM billing.urutan_dead_letter")
            .fetch_one(&db)
            .await
            .expect("the record");
    assert_eq!(reason, "missing_entity_header");
    assert_eq!(detail, "the x-tagihan-id header is missing");

    let listed = urutan(&env, &BILLING, &["dlq", "list"]).await;
    assert!(listed.ok(), "{listed}");
    assert!(
        listed.stdout.contains("the x-tagihan-id header is missing"),
        "{listed}"
    );
    let explained = urutan(&env, &BILLING, &["explain", "T-2"]).await;
    assert!(explained.stdout.contains("x-tagihan-id"), "{explained}");
    for said in [&listed.stdout, &explained.stdout] {
        assert!(!said.contains("x-pesanan-id header"), "{said}");
    }

    // Its state and history under its own name: the pool made the views,
    // `urutan migrate` refreshes them.
    let migrated = urutan(&env, &BILLING, &["migrate"]).await;
    assert!(migrated.ok(), "{migrated}");
    let state: (String, i64) = sqlx::query_as("SELECT id, versi FROM billing.tagihan")
        .fetch_one(&db)
        .await
        .expect("the view tagihan");
    assert_eq!(state, ("T-1".to_owned(), 1));
    let history: i64 =
        sqlx::query_scalar("SELECT count(*) FROM billing.tagihan_riwayat WHERE pesanan_id = 'T-1'")
            .fetch_one(&db)
            .await
            .expect("the view tagihan_riwayat");
    assert_eq!(history, 1);
    // The default pipeline gets no views named for it.
    let none: Option<String> =
        sqlx::query_scalar("SELECT to_regclass('billing.pesanan_pesanan')::text")
            .fetch_one(&db)
            .await
            .expect("regclass");
    assert_eq!(none, None);
}

#[tokio::test]
async fn a_forgotten_setting_is_one_line_naming_it() {
    let env = TestEnv::new("words_forgot").await;
    billing_pipeline(&env).await;
    let db = plain_db(&env).await;
    let only_entity = [("ENTITY", "tagihan")];
    let only_schema = [("DATABASE_SCHEMA", "billing")];

    // Reports: which setting, never `urutan migrate` (which would start a
    // second, empty pipeline in `public`).
    let status = urutan(&env, &only_entity, &["status"]).await;
    assert_ne!(status.code, Some(0), "{status}");
    assert!(
        status.stdout.contains("DATABASE_SCHEMA=billing"),
        "{status}"
    );
    assert!(!status.stdout.contains("run `urutan migrate`"), "{status}");
    let explain = urutan(&env, &only_entity, &["explain", "T-1"]).await;
    assert!(
        explain.stderr.contains("DATABASE_SCHEMA=billing"),
        "{explain}"
    );
    assert!(
        !explain.stderr.contains("run `urutan migrate`"),
        "{explain}"
    );
    let verify = urutan(&env, &only_entity, &["verify"]).await;
    verify.assert_refused_in_one_line("set DATABASE_SCHEMA=billing");
    let status = urutan(&env, &only_schema, &["status"]).await;
    assert!(status.stdout.contains("set ENTITY=tagihan"), "{status}");

    // A relay or a pool with a forgotten setting stops at once.
    let relay = urutan(&env, &only_schema, &["relay"]).await;
    relay.assert_refused_in_one_line("set ENTITY=tagihan");
    let run = urutan(&env, &only_schema, &["run"]).await;
    run.assert_refused_in_one_line("set ENTITY=tagihan");
    let run = urutan(&env, &only_entity, &["run"]).await;
    run.assert_refused_in_one_line("set DATABASE_SCHEMA=billing");
    let migrate = urutan(&env, &only_schema, &["migrate"]).await;
    migrate.assert_refused_in_one_line("set ENTITY=tagihan");

    // Nothing was created in `public`, and the billing pipeline still says
    // tagihan.
    let public: Option<String> = sqlx::query_scalar("SELECT to_regclass('public.pesanan')::text")
        .fetch_one(&db)
        .await
        .expect("regclass");
    assert_eq!(public, None, "a second pipeline was started in public");
    let entity: String = sqlx::query_scalar("SELECT entitas FROM billing.urutan_pengaturan")
        .fetch_one(&db)
        .await
        .expect("recorded entity");
    assert_eq!(entity, "tagihan");
}
