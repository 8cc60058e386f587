//! Your entity (docs/contract.md section 9): `ENTITY=pengiriman`,
//! `DATABASE_SCHEMA=pengiriman` beside the default pipeline, in one
//! database and one vhost, without touching each other; `verify` passes on
//! both.

use std::time::Duration;

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString};
use sqlx::PgPool;
use urutan::config::Settings;
use urutan_testkit::fixtures::{
    Msg, Raw, RunningPool, TestEnv, count, queue_len, urutan, wait_count,
};

/// A shipment event as a producer of the `pengiriman` pipeline sends it:
/// the id in `x-pengiriman-id`.
fn shipment(id: &str, versi: i64) -> Raw<'static> {
    let mut headers = FieldTable::default();
    headers.insert(
        "x-pengiriman-id".into(),
        AMQPValue::LongString(LongString::from(id.as_bytes())),
    );
    let body = serde_json::json!({"id": id, "status": "dikirim", "versi": versi});
    Raw {
        exchange: "pengiriman",
        routing_key: "pengiriman.jakarta.dikirim",
        props: BasicProperties::default()
            .with_message_id(format!("kirim-{id}-v{versi}").into())
            .with_delivery_mode(2)
            .with_headers(headers),
        body: body.to_string().into_bytes(),
    }
}

fn shipments(settings: &Settings) -> Settings {
    Settings {
        entity: "pengiriman".to_owned(),
        database_schema: "pengiriman".to_owned(),
        topology_prefix: "pengiriman".to_owned(),
        ..settings.clone()
    }
}

async fn in_schema(db: &PgPool, schema: &str, table: &str) -> i64 {
    let sql = format!("SELECT count(*) FROM {schema}.{table}");
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .fetch_one(db)
        .await
        .expect("count")
}

#[tokio::test]
async fn two_entities_share_a_database_and_a_vhost_apart() {
    let env = TestEnv::new("entities").await;
    let orders_settings = env.settings(2);
    let shipments_settings = shipments(&orders_settings);
    let orders = RunningPool::ready(orders_settings).await;
    let shipping = RunningPool::ready(shipments_settings).await;
    let db = env.db().await;

    let publisher = env.publisher().await;
    let order_msgs: Vec<Msg> = (1..=5)
        .flat_map(|v| (0..8).map(move |e| Msg::event(&format!("O-{e}"), v)))
        .collect();
    publisher.send_all(&order_msgs).await;
    let mut raw: Vec<Raw<'static>> = (1..=4)
        .flat_map(|v| (0..6).map(move |e| shipment(&format!("S-{e}"), v)))
        .collect();
    // An order event sent to the shipments' exchange carries no
    // x-pengiriman-id: a contract violation there, dead-lettered in
    // pengiriman.dlq, and no concern of the orders' pipeline.
    let stray = Msg::event("O-stray", 1);
    raw.push(Raw {
        exchange: "pengiriman",
        routing_key: "pengiriman.x",
        props: stray.properties(),
        body: stray.body.clone(),
    });
    publisher.send_raw(raw).await;

    wait_count(
        &db,
        "SELECT count(*) FROM public.pesanan_riwayat",
        40,
        Duration::from_secs(60),
    )
    .await;
    wait_count(
        &db,
        "SELECT count(*) FROM pengiriman.pesanan_riwayat",
        24,
        Duration::from_secs(60),
    )
    .await;
    wait_count(
        &db,
        "SELECT count(*) FROM pengiriman.urutan_dead_letter",
        1,
        Duration::from_secs(30),
    )
    .await;
    orders.stop().await;
    shipping.stop().await;

    // Each pipeline's rows in its own schema only.
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM public.pesanan WHERE id LIKE 'S-%'"
        )
        .await,
        0
    );
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM pengiriman.pesanan WHERE id LIKE 'O-%'"
        )
        .await,
        0
    );
    assert_eq!(in_schema(&db, "pengiriman", "pesanan").await, 6);
    assert_eq!(in_schema(&db, "public", "pesanan").await, 8);
    assert_eq!(in_schema(&db, "public", "urutan_dead_letter").await, 0);
    let reason: String = sqlx::query_scalar("SELECT reason FROM pengiriman.urutan_dead_letter")
        .fetch_one(&db)
        .await
        .expect("the stray's record");
    assert_eq!(reason, "missing_entity_header");
    // Each schema migrated on its own.
    assert!(in_schema(&db, "pengiriman", "_sqlx_migrations").await > 0);

    // The shipments' broker objects, the hash on their own header.
    let conn = env.broker().await;
    assert_eq!(queue_len(&conn, "pengiriman.shard-000").await, 0);
    assert_eq!(queue_len(&conn, "pengiriman.dlq").await, 1);
    assert_eq!(queue_len(&conn, "pesanan.dlq").await, 0);

    // `urutan verify` passes on both, each through its own settings.
    let on_orders = urutan(&env, &[], &["verify"]).await;
    assert!(on_orders.ok(), "{on_orders}");
    let on_shipments = urutan(
        &env,
        &[("ENTITY", "pengiriman"), ("DATABASE_SCHEMA", "pengiriman")],
        &["verify"],
    )
    .await;
    assert!(on_shipments.ok(), "{on_shipments}");
}
