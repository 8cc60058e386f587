//! Dead letters: every dead-lettered delivery gets exactly one record,
//! committed before its reject (strict and batch mode, delivery limit with
//! its last error, held while the database is down), and `urutan dlq`
//! lists, shows, replays and purges them without ever losing a message.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lapin::options::BasicPublishOptions;
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString};
use lapin::{BasicProperties, Connection};
use sqlx::PgPool;
use urutan::message::Event;
use urutan::shard::Hooks;

use crate::common::*;

async fn json_of(env: &TestEnv, args: &[&str]) -> serde_json::Value {
    let ran = urutan(env, &[], args).await;
    assert!(ran.ok(), "urutan {args:?}: {ran}");
    serde_json::from_str(&ran.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {ran}"))
}

/// A hook that panics on events with status `racun` while `broken` is set.
pub(crate) fn poison_while(broken: Arc<AtomicBool>) -> Hooks {
    Hooks {
        before_apply: Some(Arc::new(move |ev: &Event| {
            if ev.status == "racun" && broken.load(Ordering::SeqCst) {
                std::panic::resume_unwind(Box::new("the tax service is down"));
            }
        })),
        ..Hooks::default()
    }
}

/// A message whose body is not JSON.
pub(crate) fn not_json(message_id: &str, entity: &str) -> Msg {
    let mut msg = Msg::event(entity, 1);
    msg.message_id = Some(message_id.to_owned());
    msg.body = b"this is not json".to_vec();
    msg
}

/// Records as (delivery_key, message_id, pesanan_id, versi, shard, reason,
/// last_error, resolution), oldest first.
type RecordRow = (
    String,
    Option<String>,
    Option<String>,
    Option<i64>,
    i32,
    String,
    Option<String>,
    Option<String>,
);

async fn records(db: &PgPool) -> Vec<RecordRow> {
    sqlx::query_as(
        "SELECT delivery_key, message_id, pesanan_id, versi, shard, reason, last_error, resolution
         FROM urutan_dead_letter ORDER BY id",
    )
    .fetch_all(db)
    .await
    .expect("records")
}

async fn wait_dlq(conn: &Connection, n: u32) {
    wait_for(
        &format!("{n} message(s) in the DLQ"),
        Duration::from_secs(30),
        || async move { queue_len(conn, "pesanan.dlq").await == n },
    )
    .await;
}

/// Publishes `msgs` and waits until `n` messages are in the DLQ; a
/// connection to look further.
async fn publish_and_wait_dlq(env: &TestEnv, msgs: &[Msg], n: u32) -> Connection {
    env.publisher().await.send_all(msgs).await;
    let conn = env.broker().await;
    wait_dlq(&conn, n).await;
    conn
}

async fn wait_records(db: &PgPool, n: i64) {
    let records = "SELECT count(*) FROM urutan_dead_letter";
    wait_count(db, records, n, Duration::from_secs(30)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_mode_records_each_dead_letter_once_before_its_reject() {
    let env = TestEnv::new("dlq_strict").await;
    let db = env.db().await;
    // A record committed before a crash that came before the reject: the
    // redelivered message must not record anything new.
    let earlier = serde_json::json!({});
    let pre = urutan::store::NewDeadLetter {
        subject: urutan::store::dead_letter::Subject {
            delivery_key: "again-1".into(),
            message_id: Some("again-1".into()),
            pesanan_id: Some("C".into()),
            versi: None,
            shard: 0,
            reason: "invalid_json".into(),
            detail: "recorded before a crash".into(),
            last_error: None,
        },
        recorded_by: "worker",
        exchange: None,
        routing_key: None,
        properties: earlier.clone(),
        headers: earlier,
        body: Vec::new(),
        body_bytes: 0,
        x_death: None,
        dead_lettered_at: None,
    };
    urutan::store::insert_dead_letter(&db, &pre)
        .await
        .expect("pre-record");

    let pool = RunningPool::ready(env.settings(1)).await;
    let mut no_id = Msg::event("B", 2);
    no_id.message_id = None;
    let mut mismatch = Msg::event("A", 2);
    mismatch.body = br#"{"id":"Z","status":"x","versi":2}"#.to_vec();
    publish_and_wait_dlq(
        &env,
        &[
            Msg::event("A", 1),
            not_json("bad-1", "A"),
            mismatch,
            no_id,
            not_json("again-1", "C"),
            Msg::event("A", 3),
        ],
        4,
    )
    .await;
    wait_applied(&db, 2, Duration::from_secs(30)).await;
    let rows = records(&db).await;
    assert_eq!(rows.len(), 4, "{rows:?}");
    assert_eq!(rows[0].0, "again-1");
    assert_eq!(rows[0].5, "invalid_json", "the earlier record stays");
    let find = |key: &str| rows.iter().find(|r| r.0 == key).cloned();
    let bad = find("bad-1").expect("bad-1 recorded");
    assert_eq!(
        (
            bad.1.as_deref(),
            bad.2.as_deref(),
            bad.3,
            bad.4,
            bad.5.as_str()
        ),
        (Some("bad-1"), Some("A"), None, 0, "invalid_json")
    );
    let mismatch = find("A-v2").expect("A-v2 recorded");
    assert_eq!(
        (mismatch.2.as_deref(), mismatch.3, mismatch.5.as_str()),
        (Some("A"), Some(2), "id_mismatch"),
        "the order id comes from the header"
    );
    let no_id = rows
        .iter()
        .find(|r| r.0.starts_with("sha256:"))
        .expect("the message without an id has a hashed key");
    assert_eq!(
        (no_id.1.as_deref(), no_id.2.as_deref(), no_id.5.as_str()),
        (None, Some("B"), "missing_message_id")
    );
    let detail: String =
        sqlx::query_scalar("SELECT detail FROM urutan_dead_letter WHERE delivery_key = 'bad-1'")
            .fetch_one(&db)
            .await
            .expect("detail");
    assert_eq!(
        detail,
        "the body is not a JSON object with the contract's fields"
    );
    pool.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_delivery_limit_records_the_last_error_in_strict_and_batch_mode() {
    for prefetch in [1u16, 20] {
        let env = TestEnv::new(&format!("dlq_limit_{prefetch}")).await;
        let mut settings = env.settings(1);
        settings.delivery_limit = 2;
        settings.prefetch = prefetch;
        let broken = Arc::new(AtomicBool::new(true));
        let pool = RunningPool::ready_with(settings, poison_while(broken)).await;
        publish_and_wait_dlq(
            &env,
            &[
                Msg::event("A", 1),
                Msg::event_with("X", 1, "X-v1", "racun"),
                not_json("bad-1", "B"),
                Msg::event("A", 2),
            ],
            2,
        )
        .await;
        let db = env.db().await;
        let rows = records(&db).await;
        assert_eq!(rows.len(), 2, "prefetch {prefetch}: {rows:?}");
        let limit = rows.iter().find(|r| r.0 == "X-v1").expect("X-v1");
        assert_eq!(limit.5, "delivery_limit", "prefetch {prefetch}");
        assert_eq!(
            limit.6.as_deref(),
            Some("the handler panicked: the tax service is down"),
            "prefetch {prefetch}: the last error"
        );
        assert_eq!((limit.2.as_deref(), limit.3), (Some("X"), Some(1)));
        let bad = rows.iter().find(|r| r.0 == "bad-1").expect("bad-1");
        assert_eq!((bad.5.as_str(), bad.6.as_deref()), ("invalid_json", None));
        assert_eq!(count(&db, "SELECT count(*) FROM pesanan_riwayat").await, 2);
        pool.stop().await;
    }
}

/// While the database is down, a contract violation waits in its shard
/// like any message (it is never rejected without its record): nothing
/// reaches the DLQ, nothing overtakes it; once the database is back it is
/// recorded, then dead-lettered, and the shard flows on in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_is_held_until_its_record_can_be_written() {
    let env = TestEnv::new("dlq_held").await;
    let pool = RunningPool::ready(env.settings(1)).await;
    let db = env.db().await;
    db.close().await;
    let refused = RefusedConnections::start(&env);
    env.publisher()
        .await
        .send_all(&[not_json("bad-1", "A"), Msg::event("A", 1)])
        .await;
    let http = pool.http;
    wait_for("held retries", Duration::from_secs(20), || async move {
        let scrape = http_get(http, "/metrics").await.1;
        metric_sum(&scrape, "urutan_retries_total", &["shard=\"0\""]) >= 3.0
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let conn = env.broker().await;
    assert_eq!(
        queue_len(&conn, "pesanan.dlq").await,
        0,
        "rejected without a record"
    );
    assert_eq!(
        queue_len(&conn, "pesanan.shard-000").await,
        1,
        "the poison is held (unacked), the next message waits behind it"
    );
    drop(refused);
    wait_dlq(&conn, 1).await;
    let db = env.db().await;
    wait_applied(&db, 1, Duration::from_secs(30)).await;
    let rows = records(&db).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(
        (rows[0].0.as_str(), rows[0].5.as_str()),
        ("bad-1", "invalid_json")
    );
    pool.stop().await;
}

/// Publishes straight into the DLQ a message the broker dead-lettered
/// without a worker's record (as after a crash loop): an `x-death` saying
/// `delivery_limit` from shard 1.
async fn publish_unrecorded(env: &TestEnv, message_id: &str, entity: &str) {
    let publisher = env.publisher().await;
    let mut death = FieldTable::default();
    let text = |s: &str| AMQPValue::LongString(LongString::from(s.as_bytes()));
    death.insert("reason".into(), text("delivery_limit"));
    death.insert("queue".into(), text("pesanan.shard-001"));
    death.insert("count".into(), AMQPValue::LongLongInt(1));
    death.insert("exchange".into(), text("pesanan"));
    let ten_minutes_ago = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
        - 600;
    death.insert("time".into(), AMQPValue::Timestamp(ten_minutes_ago));
    let keys = FieldArray::from(vec![text("pesanan.jakarta.dibuat")]);
    death.insert("routing-keys".into(), AMQPValue::FieldArray(keys));
    let mut headers = FieldTable::default();
    headers.insert("x-pesanan-id".into(), text(entity));
    let deaths = FieldArray::from(vec![AMQPValue::FieldTable(death)]);
    headers.insert("x-death".into(), AMQPValue::FieldArray(deaths));
    let body = serde_json::json!({"id": entity, "status": "baru", "versi": 1}).to_string();
    let props = BasicProperties::default()
        .with_message_id(message_id.into())
        .with_delivery_mode(2)
        .with_headers(headers);
    let confirm = publisher
        .channel
        .basic_publish(
            "".into(),
            "pesanan.dlq".into(),
            BasicPublishOptions::default(),
            body.as_bytes(),
            props,
        )
        .await
        .expect("publish");
    assert!(confirm.await.expect("confirm").is_ack());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_filters_shows_json_and_records_what_the_broker_dead_lettered_alone() {
    let env = TestEnv::new("dlq_list").await;
    let pool = RunningPool::ready(env.settings(2)).await;
    let mut mismatch = Msg::event("B", 2);
    mismatch.body = br#"{"id":"Z","status":"x","versi":2}"#.to_vec();
    let mut no_id = Msg::event("E", 1);
    no_id.message_id = None;
    let conn = publish_and_wait_dlq(
        &env,
        &[
            not_json("bad-1", "A"),
            mismatch,
            not_json("bad-2", "C"),
            no_id,
        ],
        4,
    )
    .await;
    pool.stop().await;
    // Twice: an identical copy (as at-least-once dead-lettering can make).
    publish_unrecorded(&env, "lost-1", "D").await;
    publish_unrecorded(&env, "lost-1", "D").await;

    let first = urutan(&env, &[], &["dlq", "list", "--json"]).await;
    assert!(first.ok(), "{first}");
    assert!(
        first
            .stderr
            .contains("recorded 1 message(s) found in pesanan.dlq"),
        "{first}"
    );
    assert!(
        first.stderr.contains("removed 1 identical copies"),
        "{first}"
    );
    let all: serde_json::Value = serde_json::from_str(&first.stdout).expect("JSON");
    assert_eq!(all["depth"], 5, "{all}");
    assert_eq!(
        all["recorded"], 5,
        "the unrecorded message got its record: {all}"
    );
    let ids: Vec<&str> = all["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| m["message_id"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(ids.len(), 5);
    let lost = all["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .find(|m| m["message_id"] == "lost-1")
        .expect("lost-1 listed");
    assert_eq!(lost["reason"], "delivery_limit", "{lost}");
    assert_eq!(lost["shard"], 1, "{lost}");
    assert_eq!(lost["recorded_by"], "queue", "{lost}");
    let ago = chrono::Utc::now()
        - lost["dead_lettered_at"]
            .as_str()
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.with_timezone(&chrono::Utc))
            .expect("a time");
    assert!(
        (590..=700).contains(&ago.num_seconds()),
        "the x-death time: {ago}"
    );
    assert_eq!(
        queue_len(&conn, "pesanan.dlq").await,
        5,
        "nothing lost by listing"
    );

    let by_reason = json_of(&env, &["dlq", "list", "--reason", "invalid_json", "--json"]).await;
    let reasons: Vec<&str> = by_reason["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| m["message_id"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(reasons, ["bad-1", "bad-2"]);
    let by_order = json_of(&env, &["dlq", "list", "--order", "B", "--json"]).await;
    assert_eq!(
        by_order["messages"][0]["reason"], "id_mismatch",
        "{by_order}"
    );
    assert_eq!(by_order["messages"].as_array().map(Vec::len), Some(1));
    let later = json_of(
        &env,
        &["dlq", "list", "--since", "2099-01-01T00:00:00Z", "--json"],
    )
    .await;
    assert_eq!(later["messages"].as_array().map(Vec::len), Some(0));
    let recent = json_of(&env, &["dlq", "list", "--since", "5m", "--json"]).await;
    let recent = recent["messages"].as_array().map(Vec::len);
    assert_eq!(recent, Some(4), "lost-1 is older");

    let table = urutan(&env, &[], &["dlq", "list"]).await;
    assert!(table.ok(), "{table}");
    assert!(
        table
            .stdout
            .starts_with("pesanan.dlq: 5 message(s), 5 recorded\nDEAD-LETTERED (UTC)"),
        "{table}"
    );
    assert!(table.stdout.contains("id_mismatch"), "{table}");
    // A message without an id is listed by an abbreviated key, which
    // `show` takes.
    let key = table
        .stdout
        .split_whitespace()
        .find(|w| w.starts_with("sha256:"))
        .unwrap_or_else(|| panic!("no key listed: {table}"));
    assert_eq!(key.len(), 23, "{table}");
    let by_key = json_of(&env, &["dlq", "show", key, "--json"]).await;
    assert_eq!(by_key["reason"], "missing_message_id", "{by_key}");
    assert_eq!(by_key["pesanan_id"], "E", "{by_key}");

    // show: the record, its headers and body, and the x-death read from
    // the queue without losing anything.
    let shown = urutan(&env, &[], &["dlq", "show", "bad-1"]).await;
    assert!(shown.ok(), "{shown}");
    for part in [
        "reason        invalid_json: the body is not a JSON object",
        "x-pesanan-id: \"A\"",
        "rejected from pesanan.shard-",
        "this is not json",
        "state         in pesanan.dlq",
    ] {
        assert!(shown.stdout.contains(part), "missing {part:?}: {shown}");
    }
    assert_eq!(
        queue_len(&conn, "pesanan.dlq").await,
        5,
        "nothing lost by showing"
    );
    let as_json = json_of(&env, &["dlq", "show", "lost-1", "--json"]).await;
    assert_eq!(as_json["body"]["status"], "baru", "{as_json}");
    assert_eq!(
        as_json["x_death"][0]["routing-keys"][0],
        "pesanan.jakarta.dibuat"
    );
    let unknown = urutan(&env, &[], &["dlq", "show", "no-such-id"]).await;
    unknown.assert_fails_in_one_line("no dead-lettered message with id \"no-such-id\"");
    assert_eq!(queue_len(&conn, "pesanan.dlq").await, 5);
    let counts: Vec<(String, i64)> = sqlx::query_as(
        "SELECT delivery_key, count(*) FROM urutan_dead_letter GROUP BY 1 HAVING count(*) > 1",
    )
    .fetch_all(&env.db().await)
    .await
    .expect("counts");
    assert!(counts.is_empty(), "one record per message: {counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_reports_applied_stale_and_dead_lettered_again() {
    let env = TestEnv::new("dlq_replay").await;
    let mut settings = env.settings(1);
    settings.delivery_limit = 1;
    // A's v2 goes on past its refused v1 (holds: tests/it/holds.rs).
    settings.on_refused = urutan::config::OnRefused::Skip;
    let broken = Arc::new(AtomicBool::new(true));
    let pool = RunningPool::ready_with(settings, poison_while(broken.clone())).await;
    let conn = publish_and_wait_dlq(
        &env,
        &[
            Msg::event_with("A", 1, "A-v1", "racun"),
            Msg::event("A", 2),
            Msg::event_with("X", 1, "X-v1", "racun"),
            not_json("bad-1", "B"),
        ],
        3,
    )
    .await;
    let db = env.db().await;
    wait_records(&db, 3).await;

    // A dry run predicts and changes nothing.
    let before = records(&db).await;
    let dry = urutan(&env, &[], &["dlq", "replay", "--all", "--dry-run"]).await;
    assert!(dry.ok(), "{dry}");
    for part in [
        "A-v1 [delivery_limit]: would be stale: v2 is newer",
        "X-v1 [delivery_limit]: would be applied (a new order); it is valid, the handler failed",
        "bad-1 [invalid_json]: would be dead-lettered again: invalid_json",
    ] {
        assert!(dry.stdout.contains(part), "missing {part:?}: {dry}");
    }
    assert_eq!(records(&db).await, before, "the dry run changed a record");
    assert_eq!(queue_len(&conn, "pesanan.dlq").await, 3);
    assert_eq!(
        count(&db, "SELECT count(*) FROM pesanan WHERE id = 'X'").await,
        0
    );

    // The cause is fixed: one message by id; the others stay in the DLQ.
    broken.store(false, Ordering::SeqCst);
    let one = urutan(&env, &[], &["dlq", "replay", "X-v1"]).await;
    assert!(one.ok(), "{one}");
    assert!(one.stdout.contains("X-v1 (order X, v1): applied"), "{one}");
    assert_eq!(queue_len(&conn, "pesanan.dlq").await, 2);
    assert_eq!(
        count(&db, "SELECT count(*) FROM pesanan WHERE id = 'X'").await,
        1
    );

    // The rest: an old version is stale (never overwrites v2), a still
    // broken message is dead-lettered again with a new record.
    let rest = urutan(&env, &[], &["dlq", "replay", "--all"]).await;
    assert_eq!(rest.code, Some(1), "one did not get through: {rest}");
    assert!(
        rest.stdout
            .contains("A-v1 (order A, v1): stale: v2 is newer"),
        "{rest}"
    );
    assert!(
        rest.stdout
            .contains("bad-1 (order B): dead-lettered again: invalid_json"),
        "{rest}"
    );
    assert!(
        rest.stderr
            .contains("1 of 2 message(s) did not get through"),
        "{rest}"
    );
    wait_dlq(&conn, 1).await;
    let state: (String, i64) = sqlx::query_as("SELECT status, versi FROM pesanan WHERE id = 'A'")
        .fetch_one(&db)
        .await
        .expect("A");
    assert_eq!(state, ("dibuat".to_owned(), 2), "v1 did not overwrite v2");
    let rows = records(&db).await;
    let mut resolutions: Vec<(&str, Option<&str>)> = rows
        .iter()
        .map(|r| (r.0.as_str(), r.7.as_deref()))
        .collect();
    resolutions.sort();
    assert_eq!(
        resolutions,
        [
            ("A-v1", Some("replayed")),
            ("X-v1", Some("replayed")),
            ("bad-1", None),
            ("bad-1", Some("replayed")),
        ]
    );
    assert_eq!(
        rows.last().map(|r| r.7.as_deref()),
        Some(None),
        "the new record is the last"
    );
    let gone = urutan(&env, &[], &["dlq", "replay", "X-v1"]).await;
    assert_eq!(gone.code, Some(1), "{gone}");
    assert!(
        gone.stdout.contains("not in pesanan.dlq: replayed at"),
        "{gone}"
    );
    pool.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_asks_then_empties_the_queue_and_marks_the_records() {
    let env = TestEnv::new("dlq_purge").await;
    let pool = RunningPool::ready(env.settings(1)).await;
    let conn =
        publish_and_wait_dlq(&env, &[not_json("bad-1", "A"), not_json("bad-2", "B")], 2).await;
    pool.stop().await;
    publish_unrecorded(&env, "lost-1", "D").await;

    let refused = urutan(&env, &[], &["dlq", "purge"]).await;
    assert_eq!(refused.code, Some(1), "{refused}");
    assert!(
        refused.stderr.contains("refusing to purge without --yes"),
        "{refused}"
    );
    assert_eq!(queue_len(&conn, "pesanan.dlq").await, 3, "nothing purged");

    let purged = urutan(&env, &[], &["dlq", "purge", "--yes"]).await;
    assert!(purged.ok(), "{purged}");
    assert!(purged.stdout.contains("purged 3 message(s)"), "{purged}");
    assert_eq!(queue_len(&conn, "pesanan.dlq").await, 0);
    let db = env.db().await;
    let rows = records(&db).await;
    let marked: Vec<(&str, Option<&str>)> = rows
        .iter()
        .map(|r| (r.0.as_str(), r.7.as_deref()))
        .collect();
    assert_eq!(
        marked,
        [
            ("bad-1", Some("purged")),
            ("bad-2", Some("purged")),
            ("lost-1", Some("purged")),
        ]
    );
    let empty = json_of(&env, &["dlq", "list", "--json"]).await;
    assert_eq!(
        (empty["depth"].as_u64(), empty["recorded"].as_u64()),
        (Some(0), Some(0))
    );

    // Retention deletes resolved records older than it, nothing else.
    sqlx::query("UPDATE urutan_dead_letter SET resolved_at = now() - interval '100 days' WHERE delivery_key = 'bad-1'")
        .execute(&db)
        .await
        .expect("age");
    let retention = Duration::from_secs(90 * 86_400);
    let deleted = urutan::store::purge_resolved_dead_letters(&db, retention)
        .await
        .expect("retention");
    assert_eq!(deleted, 1);
    assert_eq!(
        count(&db, "SELECT count(*) FROM urutan_dead_letter").await,
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_one_clear_line() {
    let env = TestEnv::new("dlq_errors").await;
    env.db().await.close().await;
    let nobody = "amqp://guest:guest@127.0.0.1:1/%2f";
    for args in [&["dlq", "replay", "--all"][..], &["dlq", "purge", "--yes"]] {
        let ran = urutan(&env, &[("AMQP_URL", nobody)], args).await;
        ran.assert_fails_in_one_line("cannot reach the broker at amqp://guest:***@127.0.0.1:1/%2f");
    }
    // No topology yet in this vhost.
    let no_queue = urutan(&env, &[], &["dlq", "replay", "--all"]).await;
    no_queue.assert_fails_in_one_line(
        "the dead-letter queue `pesanan.dlq` does not exist in this vhost",
    );
    let listed = urutan(&env, &[("AMQP_URL", nobody)], &["dlq", "list"]).await;
    assert!(listed.ok(), "the records still answer: {listed}");
    assert!(
        listed.stderr.contains("warning: cannot reach the broker"),
        "{listed}"
    );
    let no_db = urutan(
        &env,
        &[("DATABASE_URL", "postgres://postgres@127.0.0.1:1/x")],
        &["dlq", "list"],
    )
    .await;
    assert_eq!(no_db.code, Some(1), "{no_db}");
    assert!(
        no_db
            .stderr
            .contains("cannot open the database postgres://postgres@127.0.0.1:1/x"),
        "{no_db}"
    );

    // A user that may not read the DLQ (the worker user's permissions).
    let user = format!("urutan-dlq-test-{:08x}", rand::random::<u32>());
    let mut users = BrokerUsers::default();
    users.add(&env, &user, "pw-dlq-test", WORKER_PERMISSIONS);
    let pool = RunningPool::ready(env.settings(1)).await;
    let conn = publish_and_wait_dlq(&env, &[not_json("bad-1", "A")], 1).await;
    pool.stop().await;
    let url = format!("amqp://{user}:pw-dlq-test@127.0.0.1:5672/{}", env.vhost);
    let refused = urutan(&env, &[("AMQP_URL", &url)], &["dlq", "purge", "--yes"]).await;
    refused.assert_refused_in_one_line("the broker user may not read (basic.get) the DLQ");
    // Looking needs no permission on the queue.
    let listed = urutan(&env, &[("AMQP_URL", &url)], &["dlq", "list", "--json"]).await;
    assert!(listed.ok(), "{listed}");
    assert!(
        listed.error_lines() == 0 && !listed.stderr.contains("warning"),
        "{listed}"
    );
    assert_eq!(queue_len(&conn, "pesanan.dlq").await, 1);

    let help = urutan(&env, &[], &["dlq", "replay", "--help"]).await;
    assert!(
        help.ok() && help.stdout.contains("Examples:\n  urutan dlq replay"),
        "{help}"
    );
}

/// The worker role records dead letters (and purges resolved ones); the
/// operator role and the operator RabbitMQ user of the least-privilege
/// scripts run `urutan dlq` with nothing more than their grants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_privilege_roles_record_and_operate_dead_letters() {
    let env = TestEnv::new("dlq_leastpriv").await;
    env.db().await.close().await; // the owner migrates
    let roles = PgRoles::create(&env, &["operator"]);
    let users = RabbitUsers::create(&env, true);
    let operator_amqp = users.url("operator");
    let as_operator = [
        ("AMQP_URL", operator_amqp.as_str()),
        ("DATABASE_URL", &roles.url("operator")),
    ];

    let mut settings = env.settings(1);
    settings.database_url = roles.secret_url("worker");
    settings.database_pool_size = Some(4);
    settings.delivery_limit = 1;
    let broken = Arc::new(AtomicBool::new(true));
    let pool = RunningPool::ready_with(settings, poison_while(broken.clone())).await;
    let conn = publish_and_wait_dlq(
        &env,
        &[
            Msg::event_with("X", 1, "X-v1", "racun"),
            not_json("bad-1", "B"),
            Msg::event("A", 1),
        ],
        2,
    )
    .await;
    let admin = env.db().await;
    assert_eq!(
        records(&admin).await.len(),
        2,
        "recorded as the worker role"
    );

    broken.store(false, Ordering::SeqCst);
    let replayed = urutan(&env, &as_operator, &["dlq", "replay", "X-v1"]).await;
    assert!(replayed.ok(), "{replayed}");
    assert!(
        replayed.stdout.contains("X-v1 (order X, v1): applied"),
        "{replayed}"
    );
    publish_unrecorded(&env, "lost-1", "D").await;
    let listed = urutan(&env, &as_operator, &["dlq", "list", "--json"]).await;
    assert!(listed.ok(), "{listed}");
    let listed: serde_json::Value = serde_json::from_str(&listed.stdout).expect("JSON");
    assert_eq!(
        (listed["depth"].as_u64(), listed["recorded"].as_u64()),
        (Some(2), Some(2))
    );
    let shown = urutan(&env, &as_operator, &["dlq", "show", "bad-1"]).await;
    assert!(
        shown.ok() && shown.stdout.contains("rejected from pesanan.shard-000"),
        "{shown}"
    );
    let purged = urutan(&env, &as_operator, &["dlq", "purge", "--yes"]).await;
    assert!(purged.ok(), "{purged}");
    assert_eq!(queue_len(&conn, "pesanan.dlq").await, 0);
    pool.stop().await;

    let worker_db = urutan::store::connect(&roles.secret_url("worker"), 1)
        .await
        .expect("worker connects");
    let deleted = urutan::store::purge_resolved_dead_letters(&worker_db, Duration::from_millis(1))
        .await
        .expect("the worker role may purge resolved records");
    assert_eq!(deleted, 3);
    worker_db.close().await;
    let operator_db = urutan::store::connect(&roles.secret_url("operator"), 1)
        .await
        .expect("operator connects");
    for sql in [
        "DELETE FROM urutan_dead_letter",
        "UPDATE pesanan SET versi = 9",
    ] {
        let refused = sqlx::query(sql).execute(&operator_db).await.expect_err(sql);
        let code = refused
            .as_database_error()
            .and_then(|e| e.code().map(|c| c.into_owned()));
        assert_eq!(code.as_deref(), Some("42501"), "the operator may {sql}");
    }
    operator_db.close().await;
}

/// The README's walkthrough: the database refuses a message (a constraint
/// added too strict), so the handler fails on it until it is dead-lettered
/// with the database's error; found with `list`/`show`, the cause fixed,
/// `replay` applies it. In batch mode the refused message is dead-lettered
/// at once (`database_refused`) with the same error. Run with
/// `--nocapture` to see the commands' output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_message_is_found_fixed_and_replayed() {
    for prefetch in [1u16, 10] {
        let env = TestEnv::new(&format!("dlq_walk_{prefetch}")).await;
        let db = env.db().await;
        let strict = "ALTER TABLE pesanan ADD CONSTRAINT status_dikenal \
                      CHECK (status IN ('dibuat', 'dibayar'))";
        sqlx::query(strict).execute(&db).await.expect("constraint");
        let mut settings = env.settings(1);
        settings.prefetch = prefetch;
        settings.delivery_limit = 2;
        let pool = RunningPool::ready(settings).await;
        publish_and_wait_dlq(
            &env,
            &[
                Msg::event_with("order-7", 1, "order-7-v1", "dibuat"),
                Msg::event_with("order-7", 2, "order-7-v2", "dikirim"),
                Msg::event_with("order-8", 1, "order-8-v1", "dibuat"),
            ],
            1,
        )
        .await;
        let (reason, last_error): (String, Option<String>) = sqlx::query_as(
            "SELECT reason, last_error FROM urutan_dead_letter WHERE message_id = 'order-7-v2'",
        )
        .fetch_one(&db)
        .await
        .expect("recorded");
        let expected = if prefetch == 1 {
            "delivery_limit"
        } else {
            "database_refused"
        };
        assert_eq!(reason, expected);
        let last_error = last_error.unwrap_or_default();
        assert!(
            last_error.contains("violates check constraint \"status_dikenal\""),
            "{last_error}"
        );
        for args in [&["dlq", "list"][..], &["dlq", "show", "order-7-v2"]] {
            let ran = urutan(&env, &[], args).await;
            assert!(ran.ok(), "{ran}");
            eprintln!("$ urutan {}\n{}", args.join(" "), ran.stdout);
        }
        sqlx::query("ALTER TABLE pesanan DROP CONSTRAINT status_dikenal")
            .execute(&db)
            .await
            .expect("fixed");
        let dry = urutan(&env, &[], &["dlq", "replay", "order-7-v2", "--dry-run"]).await;
        eprintln!("$ urutan dlq replay order-7-v2 --dry-run\n{}", dry.stdout);
        let predicted = "order-7-v2 [{expected}]: would be applied (stored v1); it is valid, \
                         the handler failed on it before (error returned from database: new row";
        assert!(
            dry.ok()
                && dry
                    .stdout
                    .contains(&predicted.replace("{expected}", expected)),
            "{dry}"
        );
        let replayed = urutan(&env, &[], &["dlq", "replay", "order-7-v2"]).await;
        eprintln!("$ urutan dlq replay order-7-v2\n{}", replayed.stdout);
        assert!(replayed.ok(), "{replayed}");
        assert!(
            replayed
                .stdout
                .contains("order-7-v2 (order order-7, v2): applied"),
            "{replayed}"
        );
        let state: (String, i64) =
            sqlx::query_as("SELECT status, versi FROM pesanan WHERE id = 'order-7'")
                .fetch_one(&db)
                .await
                .expect("order-7");
        assert_eq!(state, ("dikirim".to_owned(), 2));
        pool.stop().await;
    }
}

/// A `message_id` that is not UTF-8 once made lapin drop the connection
/// whenever the walk took it (the message was then recorded as
/// `unreadable` and had to be removed by hand). The patched codec reads it
/// lossily: it is listed like any other dead letter, on one connection, and
/// `purge` removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_id_that_is_not_utf8_is_listed_and_purged_like_any_other() {
    let env = TestEnv::new("dlq_unreadable").await;
    env.db().await.close().await;
    let conn = env.broker().await;
    urutan::broker::topology::declare(&conn, &urutan::broker::Names::new("pesanan"), 1, 5, false)
        .await
        .expect("topology");
    let body = br#"{"id":"A","status":"baru","versi":2}"#;
    crate::raw_amqp::publish_raw(
        &env.vhost,
        "pesanan.dlq",
        b"id-\xff\xfe",
        &[("x-pesanan-id", "A")],
        body,
    )
    .await;
    let listed = urutan(&env, &[], &["dlq", "list", "--json"]).await;
    assert!(listed.ok(), "{listed}");
    assert!(!listed.stderr.contains("cannot be read"), "{listed}");
    let json: serde_json::Value = serde_json::from_str(&listed.stdout).expect("JSON");
    let messages = json["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), 1, "{json}");
    assert_ne!(messages[0]["reason"], "unreadable", "{json}");
    let purge = urutan(&env, &[], &["dlq", "purge", "--yes"]).await;
    assert!(purge.ok(), "{purge}");
    assert_eq!(queue_len(&conn, "pesanan.dlq").await, 0, "purged");
}

/// Issue 29: unresolved dead-letter records are capped too. `urutan run`'s
/// retention pass deletes those recorded longer than
/// `DEAD_LETTER_UNRESOLVED_RETENTION` ago; newer unresolved records stay, and
/// resolved ones still go by `DEAD_LETTER_RETENTION` (from their resolution).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unresolved_dead_letters_expire_after_their_retention() {
    let env = TestEnv::new("dlq_unresolved_retention").await;
    let db = env.db().await;
    sqlx::query(
        "INSERT INTO urutan_dead_letter (delivery_key, shard, reason, detail, recorded_at,
             resolved_at, resolution)
         VALUES ('old-unresolved', 0, 'invalid_json', '', now() - interval '100 days', NULL, NULL),
                ('new-unresolved', 0, 'invalid_json', '', now() - interval '10 days', NULL, NULL),
                ('old-resolved', 0, 'invalid_json', '', now() - interval '200 days',
                 now() - interval '100 days', 'purged'),
                ('recently-resolved', 0, 'invalid_json', '', now() - interval '200 days',
                 now() - interval '10 days', 'replayed')",
    )
    .execute(&db)
    .await
    .expect("records");
    let mut vars = env.process_env(1);
    vars.push(("DEAD_LETTER_UNRESOLVED_RETENTION", "90d".to_owned()));
    vars.push(("DEAD_LETTER_RETENTION", "90d".to_owned()));
    let mut run = UrutanProcess::start("run", &vars);
    run.wait_ready().await;
    wait_records(&db, 2).await;
    let kept: Vec<String> =
        sqlx::query_scalar("SELECT delivery_key FROM urutan_dead_letter ORDER BY delivery_key")
            .fetch_all(&db)
            .await
            .expect("kept");
    assert_eq!(kept, ["new-unresolved", "recently-resolved"]);
    run.stop().await;
}

/// A message dead-lettered before its body was read (over 1 MiB: its
/// record holds no version), replayed after MAX_BODY_BYTES was
/// raised: the replay reports it applied as soon as it is (found by its
/// message id), and one that comes back stale as processed; not "not
/// processed yet" after the whole wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_tells_the_outcome_of_a_message_whose_body_was_never_read() {
    let env = TestEnv::new("dlq_replay_big").await;
    let big = |order: &str, versi: i64| {
        let mut msg = Msg::event(order, versi);
        let body = serde_json::json!({"id": order, "status": "dibuat", "versi": versi,
                                      "data": {"pad": "x".repeat(1_200_000)}});
        msg.body = body.to_string().into_bytes();
        msg
    };
    let mut settings = env.settings(1);
    settings.max_body_bytes = 1024;
    let pool = RunningPool::ready(settings.clone()).await;
    let conn = publish_and_wait_dlq(&env, &[big("L", 1), big("M", 1), Msg::event("M", 2)], 2).await;
    let db = env.db().await;
    wait_records(&db, 2).await;
    let versi: Option<i64> =
        sqlx::query_scalar("SELECT versi FROM urutan_dead_letter WHERE message_id = 'L-v1'")
            .fetch_one(&db)
            .await
            .expect("L's record");
    assert_eq!(versi, None, "the body was never read");
    pool.stop().await;

    settings.max_body_bytes = 4 * 1024 * 1024;
    let pool = RunningPool::ready(settings).await;
    let started = std::time::Instant::now();
    let replay = urutan(&env, &[], &["dlq", "replay", "L-v1", "M-v1"]).await;
    assert!(replay.ok(), "{replay}");
    assert!(
        replay.stdout.contains("L-v1 (order L): applied (v1"),
        "{replay}"
    );
    assert!(
        replay
            .stdout
            .contains("M-v1 (order M): processed for order M, not written"),
        "{replay}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "waited {:?}: {replay}",
        started.elapsed()
    );
    assert_eq!(queue_len(&conn, "pesanan.dlq").await, 0);
    pool.stop().await;
}
