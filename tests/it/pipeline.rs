//! The happy path and the contract's outcomes, end to end.

use std::time::Duration;

use lapin::types::{AMQPValue, LongString};

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applies_every_version_in_order_per_entity_across_shards() {
    let env = TestEnv::new("order").await;
    let pool = RunningPool::ready(env.settings(4)).await;
    let publisher = env.publisher().await;
    let (entities, versions) = (200, 5);
    // Interleaved: every entity's v1, then every entity's v2, ...
    let msgs: Vec<Msg> = (1..=versions)
        .flat_map(|v| (0..entities).map(move |e| Msg::event(&format!("P-{e}"), v)))
        .collect();
    publisher.send_all(&msgs).await;

    let db = env.db().await;
    let total = entities as i64 * versions;
    wait_applied(&db, total, Duration::from_secs(90)).await;
    let history = history(&db).await;
    assert_gapless_in_order(&history, entities, versions);
    let shards: std::collections::HashSet<i32> = history.iter().map(|h| h.2).collect();
    assert_eq!(shards.len(), 4, "entities spread over all 4 shards");
    assert_eq!(
        count(&db, "SELECT count(*) FROM pesan_diproses").await,
        total
    );
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM pesanan WHERE versi = 5 AND status = 'dibuat'"
        )
        .await,
        entities as i64
    );
    let scrape = http_get(pool.http, "/metrics").await.1;
    assert!(metric_sum(&scrape, "urutan_messages_total", &["outcome=\"applied\""]) >= total as f64);
    assert!(
        scrape.contains("urutan_handle_duration_seconds_bucket"),
        "histogram has buckets"
    );
    pool.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_and_stale_events_change_nothing() {
    let env = TestEnv::new("dupstale").await;
    let pool = RunningPool::ready(env.settings(2)).await;
    let publisher = env.publisher().await;
    let db = env.db().await;
    publisher
        .send_all(&[Msg::event("A", 1), Msg::event("A", 2), Msg::event("A", 3)])
        .await;
    wait_applied(&db, 3, Duration::from_secs(30)).await;
    // A duplicate of v2 (same message id, even with a different body), then
    // a stale v1 under a new id, then a marker to know both were handled.
    publisher
        .send_all(&[
            Msg::event_with("A", 9, "A-v2", "berubah"),
            Msg::event_with("A", 1, "A-v1-again", "basi"),
            Msg::event("A", 4),
        ])
        .await;
    wait_applied(&db, 4, Duration::from_secs(30)).await;
    let (status, versi): (String, i64) =
        sqlx::query_as("SELECT status, versi FROM pesanan WHERE id = 'A'")
            .fetch_one(&db)
            .await
            .expect("row");
    assert_eq!((status.as_str(), versi), ("dibuat", 4));
    // The stale one's id is recorded (so a redelivery is a duplicate); the duplicate adds nothing.
    assert_eq!(count(&db, "SELECT count(*) FROM pesan_diproses").await, 5);
    assert_gapless_in_order(&history(&db).await, 1, 4);
    pool.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_bad_input_is_dead_lettered_while_the_shard_flows() {
    let env = TestEnv::new("badinput").await;
    let mut settings = env.settings(1);
    settings.max_body_bytes = 4096;
    let pool = RunningPool::ready(settings).await;
    let publisher = env.publisher().await;

    let mut bad = Vec::new();
    let with = |f: &dyn Fn(&mut Msg), id: &str| {
        let mut m = Msg::event_with("B", 1, id, "dibuat");
        f(&mut m);
        m
    };
    bad.push(with(&|m| m.message_id = None, "no-id"));
    bad.push(with(&|m| m.header = None, "bad-no-header"));
    bad.push(with(
        &|m| m.header = Some(AMQPValue::LongLongInt(42)),
        "bad-numeric-header",
    ));
    bad.push(with(
        &|m| m.header = Some(AMQPValue::LongString(LongString::from(&b"C"[..]))),
        "bad-id-mismatch",
    ));
    bad.push(with(&|m| m.delivery_mode = Some(1), "bad-transient"));
    bad.push(with(&|m| m.body = vec![b'{'; 5000], "bad-oversized"));
    bad.push(with(
        &|m| m.body = b"{\"id\":\"B\xff\"}".to_vec(),
        "bad-not-utf8",
    ));
    bad.push(with(&|m| m.body = b"not json".to_vec(), "bad-not-json"));
    bad.push(with(
        &|m| m.body = br#"{"id":"B","status":"s","versi":0}"#.to_vec(),
        "bad-versi",
    ));
    bad.push(with(
        &|m| m.body = br#"{"id":"B","status":"","versi":1}"#.to_vec(),
        "bad-status",
    ));
    // Interleave: good B-v1, bad..., good B-v2 ... so the shard must keep flowing.
    let mut msgs = Vec::new();
    for (i, b) in bad.iter().enumerate() {
        msgs.push(Msg::event("B", i as i64 + 1));
        msgs.push(b.clone());
    }
    publisher.send_all(&msgs).await;

    let db = env.db().await;
    let n = bad.len() as i64;
    wait_applied(&db, n, Duration::from_secs(30)).await;
    assert_gapless_in_order(&history(&db).await, 1, n);
    let conn = env.broker().await;
    let dead = drain_dlq_expecting(&conn, bad.len(), Duration::from_secs(30)).await;
    assert_eq!(
        dead.len(),
        bad.len(),
        "exactly the bad messages are dead-lettered"
    );
    // Dead-lettered unchanged: the bodies are the ones published.
    let mut bodies: Vec<_> = dead.iter().map(|d| d.delivery.data.clone()).collect();
    let mut expected: Vec<_> = bad.iter().map(|b| b.body.clone()).collect();
    bodies.sort();
    expected.sort();
    assert_eq!(bodies, expected);
    let scrape = http_get(pool.http, "/metrics").await.1;
    for reason in [
        "missing_message_id",
        "missing_entity_header",
        "entity_header_not_string",
        "id_mismatch",
        "not_persistent",
        "body_too_large",
        "body_not_utf8",
        "invalid_json",
        "invalid_versi",
        "invalid_status",
    ] {
        let label = format!("reason=\"{reason}\"");
        assert!(
            metric_sum(&scrape, "urutan_dead_letters_total", &[&label]) >= 1.0,
            "no dead letter counted for {reason}"
        );
    }
    pool.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_header_table_is_dead_lettered_and_a_large_one_is_applied() {
    use lapin::options::BasicPublishOptions;
    use lapin::types::FieldTable;
    let env = TestEnv::new("pipeline_headers").await;
    let pool = RunningPool::ready(env.settings(1)).await;
    let conn = env.broker().await;
    let ch = conn.create_channel().await.expect("channel");
    ch.confirm_select(Default::default())
        .await
        .expect("confirms");
    // 1,000 extra headers of 100 bytes (~110 KiB: under the broker's frame
    // size, over urutan's limit), then 300 of them (~33 KiB: allowed).
    for (versi, extra) in [(1i64, 1000usize), (2, 300)] {
        let mut headers = FieldTable::default();
        headers.insert("x-pesanan-id".into(), AMQPValue::LongString("H".into()));
        for i in 0..extra {
            headers.insert(
                format!("x-padding-{i:04}").as_str().into(),
                AMQPValue::LongString("p".repeat(100).as_str().into()),
            );
        }
        let body = format!(r#"{{"id":"H","status":"s","versi":{versi}}}"#);
        let props = lapin::BasicProperties::default()
            .with_message_id(format!("headers-{extra}").as_str().into())
            .with_delivery_mode(2)
            .with_headers(headers);
        let confirm = ch
            .basic_publish(
                "pesanan".into(),
                "pesanan.uji".into(),
                BasicPublishOptions::default(),
                body.as_bytes(),
                props,
            )
            .await
            .expect("publish")
            .await
            .expect("confirm");
        assert!(confirm.is_ack());
    }
    let db = env.db().await;
    wait_applied(&db, 1, Duration::from_secs(30)).await;
    let dead = drain_dlq_expecting(&conn, 1, Duration::from_secs(30)).await;
    assert_eq!(message_id(&dead[0]), Some("headers-1000"));
    let scrape = http_get(pool.http, "/metrics").await.1;
    assert!(
        metric_sum(
            &scrape,
            "urutan_dead_letters_total",
            &["reason=\"headers_too_large\""]
        ) >= 1.0,
        "reason counted"
    );
    pool.stop().await;
}
