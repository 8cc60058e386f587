//! Hostile producer data against the operator's tools and logs: `urutan dlq`
//! and `urutan explain` never hand a producer's escape sequence to the
//! terminal, `dlq replay` survives a `user_id` and ignores a forged
//! `x-death`, and no producer string forges a log line.

use std::time::Duration;

use lapin::options::{BasicPublishOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString};
use lapin::{BasicProperties, Connection};

use crate::common::*;

fn text(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s.as_bytes()))
}

/// A valid event for `entity`, v1, as the properties and body a producer
/// would send (`x-pesanan-id` header, persistent).
fn event(message_id: &str, entity: &str) -> (BasicProperties, Vec<u8>) {
    let mut headers = FieldTable::default();
    headers.insert("x-pesanan-id".into(), text(entity));
    let props = BasicProperties::default()
        .with_message_id(message_id.into())
        .with_delivery_mode(2)
        .with_headers(headers);
    let body = serde_json::json!({"id": entity, "status": "baru", "versi": 1});
    (props, body.to_string().into_bytes())
}

/// An `x-death` as the broker writes it (and as a producer can forge it).
fn x_death(queue: &str, exchange: &str, routing_key: &str) -> AMQPValue {
    let mut death = FieldTable::default();
    death.insert("reason".into(), text("delivery_limit"));
    death.insert("queue".into(), text(queue));
    death.insert("count".into(), AMQPValue::LongLongInt(1));
    death.insert("exchange".into(), text(exchange));
    let keys = FieldArray::from(vec![text(routing_key)]);
    death.insert("routing-keys".into(), AMQPValue::FieldArray(keys));
    AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::FieldTable(death)]))
}

/// Puts a message straight into the DLQ (as the broker dead-letters it),
/// through `conn`, and waits for the confirm.
async fn into_dlq(conn: &Connection, props: BasicProperties, body: &[u8]) {
    let ch = conn.create_channel().await.expect("channel");
    ch.confirm_select(Default::default())
        .await
        .expect("confirms");
    let confirm = ch
        .basic_publish(
            "".into(),
            "pesanan.dlq".into(),
            BasicPublishOptions::default(),
            body,
            props,
        )
        .await
        .expect("publish");
    let confirmed = tokio::time::timeout(Duration::from_secs(10), confirm)
        .await
        .expect("confirm timed out")
        .expect("confirm");
    assert!(confirmed.is_ack(), "the broker refused the message");
}

/// Terminal control: C0 but newline and tab, DEL, C1, bidi overrides.
fn has_control(out: &str) -> bool {
    out.chars().any(|c| {
        (c.is_control() && c != '\n')
            || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
    })
}

/// A producer's message id, header and body with an OSC 52 clipboard write,
/// a clear-screen, a C1 CSI and a bidi override: `dlq list`, `dlq show` and
/// `explain` print them escaped (no raw ESC, BEL...), `--json` stays JSON
/// that holds them exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_and_explain_never_print_a_producers_escape_sequences() {
    let env = TestEnv::new("tool_escape").await;
    let pool = RunningPool::ready(env.settings(1)).await; // the topology
    let evil = "m\u{1b}]52;c;aGFja2Vk\u{7}\u{1b}[2J\r\u{9b}31m\u{202e}1";
    let (props, _) = event(evil, "E1");
    let mut headers = props.headers().clone().unwrap_or_default();
    headers.insert("x-note\u{1b}[8m".into(), text("\u{1b}]0;owned\u{7}"));
    let props = props.with_headers(headers);
    let body = serde_json::json!({"id": "E1", "status": "x\u{1b}[2J", "versi": 1}).to_string();
    into_dlq(&env.broker().await, props, body.as_bytes()).await;

    let listed = urutan(&env, &[], &["dlq", "list"]).await;
    assert!(listed.ok(), "{listed}");
    assert!(
        !has_control(&listed.stdout),
        "{listed:?}",
        listed = listed.stdout
    );
    // An id with control characters is itself a contract violation now
    // (`invalid_message_id`), listed under its digest; `show` prints it.
    assert!(listed.stdout.contains("invalid_message_id"), "{listed}");

    let json = urutan(&env, &[], &["dlq", "list", "--json"]).await;
    let parsed: serde_json::Value = serde_json::from_str(&json.stdout).expect("JSON");
    // Not kept as an id (it is not one): the record is keyed by its digest.
    assert_eq!(
        parsed["messages"][0]["message_id"],
        serde_json::Value::Null,
        "{json}"
    );
    let key = parsed["messages"][0]["delivery_key"]
        .as_str()
        .expect("a key")
        .to_owned();

    let shown = urutan(&env, &[], &["dlq", "show", &key]).await;
    assert!(shown.ok(), "{shown}");
    assert!(!has_control(&shown.stdout), "{:?}", shown.stdout);
    for part in ["x-note\\x1b[8m", "\\u{202e}1", "\\x9b31m"] {
        assert!(shown.stdout.contains(part), "missing {part:?}: {shown}");
    }

    let story = urutan(&env, &[], &["explain", "E1"]).await;
    assert!(!has_control(&story.stdout), "{:?}", story.stdout);
    assert!(story.stdout.contains("invalid_message_id"), "{story}");
    pool.stop().await;
}

/// A message in the DLQ whose `user_id` is its producer's (the broker
/// checks it at publish) does not stop `dlq replay`: the broker would
/// refuse it from the operator's connection (406, channel closed); the
/// replay drops it and replays the rest too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_goes_on_past_a_message_with_a_producers_user_id() {
    let env = TestEnv::new("tool_userid").await;
    let user = format!("urutan-producer-{:08x}", rand::random::<u32>());
    let mut users = BrokerUsers::default();
    users.add(&env, &user, "pr0ducer-pw", ALL_PERMISSIONS);
    let pool = RunningPool::ready(env.settings(1)).await;
    let producer = lapin::Connection::connect(
        &amqp_url_as(&user, "pr0ducer-pw", &env.vhost),
        lapin::ConnectionProperties::default(),
    )
    .await
    .expect("producer connection");
    let (props, body) = event("U-v1", "U");
    into_dlq(&producer, props.with_user_id(user.as_str().into()), &body).await;
    let (props, body) = event("V-v1", "V");
    into_dlq(&producer, props, &body).await;

    let replayed = urutan(&env, &[], &["dlq", "replay", "--all"]).await;
    assert!(replayed.ok(), "{replayed}");
    for part in ["U-v1 (order U, v1): applied", "V-v1 (order V, v1): applied"] {
        assert!(
            replayed.stdout.contains(part),
            "missing {part:?}: {replayed}"
        );
    }
    assert_eq!(queue_len(&env.broker().await, "pesanan.dlq").await, 0);
    pool.stop().await;
}

/// A forged `x-death` naming another exchange and a routing key that
/// another queue on the entry exchange is bound to: the replay goes where
/// urutan sends replays (the entry exchange, a key only the hash exchange's
/// binding matches) and is applied on its shard; the other queue gets
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_ignores_a_forged_x_death_route() {
    let env = TestEnv::new("tool_xdeath").await;
    let pool = RunningPool::ready(env.settings(2)).await;
    let conn = env.broker().await;
    // Someone else's consumer of some of the entry exchange's keys.
    let ch = conn.create_channel().await.expect("channel");
    ch.queue_declare(
        "audit".into(),
        QueueDeclareOptions::default(),
        FieldTable::default(),
    )
    .await
    .expect("declare audit");
    ch.queue_bind(
        "audit".into(),
        "pesanan".into(),
        "pesanan.audit.#".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .expect("bind audit");
    let (props, body) = event("F-v1", "F");
    let mut headers = props.headers().clone().unwrap_or_default();
    headers.insert(
        "x-death".into(),
        x_death("pesanan.shard-001", "pesanan", "pesanan.audit.stolen"),
    );
    into_dlq(&conn, props.with_headers(headers), &body).await;

    let replayed = urutan(&env, &[], &["dlq", "replay", "F-v1"]).await;
    assert!(replayed.ok(), "{replayed}");
    assert!(
        replayed.stdout.contains("F-v1 (order F, v1): applied"),
        "{replayed}"
    );
    assert_eq!(
        queue_len(&conn, "audit").await,
        0,
        "the replay went to `audit`"
    );
    assert_eq!(queue_len(&conn, "pesanan.dlq").await, 0);
    pool.stop().await;
}
