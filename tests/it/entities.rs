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

/// An enqueue wakes only its own pipeline's relay (issue 44): each
/// pipeline NOTIFYs and LISTENs on a channel of its own
/// (`urutan::outbox::notify_channel`, as `urutan_saluran_outbox()` computes
/// it in SQL; past 63 bytes a hash of the schema name). Measured by each
/// relay's `urutan_relay_wakeups_total`; each still publishes its own rows
/// well within its one-second poll.
#[tokio::test]
async fn an_enqueue_wakes_only_its_own_pipelines_relay() {
    use urutan::outbox::notify_channel;
    use urutan_testkit::fixtures::{UrutanProcess, metric_sum, wait_for};

    let env = TestEnv::new("notify_apart").await;
    let orders_settings = env.settings(2);
    let orders = RunningPool::ready(orders_settings.clone()).await;
    let shipping = RunningPool::ready(shipments(&orders_settings)).await;
    let db = env.db().await;
    let mut orders_vars = env.process_env(2);
    orders_vars.push(("RUST_LOG", "warn".to_owned()));
    let mut shipping_vars = orders_vars.clone();
    shipping_vars.push(("ENTITY", "pengiriman".to_owned()));
    shipping_vars.push(("DATABASE_SCHEMA", "pengiriman".to_owned()));
    let mut relays = [
        UrutanProcess::start("relay", &orders_vars),
        UrutanProcess::start("relay", &shipping_vars),
    ];
    for relay in &mut relays {
        relay.wait_ready().await;
    }
    let wakeups = async |relay: &UrutanProcess| {
        metric_sum(&relay.scrape().await, "urutan_relay_wakeups_total", &[])
    };

    // The channels, as SQL and Rust name them.
    for (schema, channel) in [
        ("public", "urutan_outbox"),
        ("pengiriman", "urutan_outbox_pengiriman"),
    ] {
        let sql = format!("SELECT {schema}.urutan_saluran_outbox()");
        let in_sql: String = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_one(&db)
            .await
            .expect("urutan_saluran_outbox");
        assert_eq!(in_sql, channel);
        assert_eq!(notify_channel(schema), channel);
    }

    // Five enqueues in each schema, one transaction each; per pipeline, the
    // other relay is never woken and its own publishes each within 0.9 s.
    let pipelines = [("public", "O"), ("pengiriman", "S")];
    for (index, (schema, prefix)) in pipelines.into_iter().enumerate() {
        let before: Vec<f64> = [wakeups(&relays[0]).await, wakeups(&relays[1]).await].into();
        for i in 0..5 {
            let sql = format!("SELECT {schema}.urutan_enqueue('{prefix}-{i}', 'dibuat', 1)");
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .execute(&db)
                .await
                .expect("enqueue");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let sent = format!(
            "SELECT count(*) FROM {schema}.outbox WHERE agregat_id LIKE '{prefix}-%' \
             AND dikirim_pada IS NOT NULL"
        );
        wait_for(
            &format!("{schema}: 5 sent"),
            Duration::from_secs(20),
            || async {
                sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sent.clone()))
                    .fetch_one(&db)
                    .await
                    .is_ok_and(|n| n == 5)
            },
        )
        .await;
        let (own, other) = (&relays[index], &relays[1 - index]);
        wait_for(
            &format!("{schema}: its relay woken 5 times"),
            Duration::from_secs(10),
            || async { wakeups(own).await - before[index] >= 5.0 },
        )
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let woken = wakeups(other).await - before[1 - index];
        assert_eq!(
            woken, 0.0,
            "an enqueue in {schema} woke the other pipeline's relay"
        );
        let latency = format!(
            "SELECT extract(epoch FROM max(dikirim_pada - dibuat_pada))::float8 FROM {schema}.outbox \
             WHERE agregat_id LIKE '{prefix}-%'"
        );
        let slowest: f64 = sqlx::query_scalar(sqlx::AssertSqlSafe(latency))
            .fetch_one(&db)
            .await
            .expect("latency");
        eprintln!(
            "{schema}: slowest enqueue to publish {slowest:.3} s, the other relay woken {woken} times"
        );
        assert!(
            slowest < 0.9,
            "{schema}: {slowest} s: not woken by its NOTIFY?"
        );
    }

    // A schema name too long for a plain channel name: hashed, within 63
    // bytes, and its enqueue notifies exactly that channel.
    let long = "a_pipeline_in_a_schema_with_a_name_long_enough_to_hash";
    let migrated = urutan(&env, &[("DATABASE_SCHEMA", long)], &["migrate"]).await;
    assert!(migrated.ok(), "{migrated}");
    let channel = notify_channel(long);
    assert!(
        channel.len() <= 63 && channel.starts_with("urutan_outbox_"),
        "{channel}"
    );
    assert_ne!(channel, format!("urutan_outbox_{long}"));
    let in_sql: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT {long}.urutan_saluran_outbox()"
    )))
    .fetch_one(&db)
    .await
    .expect("urutan_saluran_outbox");
    assert_eq!(in_sql, channel);
    let mut listener = sqlx::postgres::PgListener::connect(env.database_url().expose())
        .await
        .expect("listener");
    listener.listen(&channel).await.expect("listen");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {long}.urutan_enqueue('L-1', 'dibuat', 1, routing_key => 'pesanan.x')"
    )))
    .execute(&db)
    .await
    .expect("enqueue in the long schema");
    let note = tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .expect("no NOTIFY within 5 s")
        .expect("listener");
    assert_eq!(note.channel(), channel);

    for relay in relays {
        relay.stop().await;
    }
    orders.stop().await;
    shipping.stop().await;
}
