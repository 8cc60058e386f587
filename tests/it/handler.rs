//! The team's handler (`HANDLER_FUNCTION`, docs/contract.md section 10):
//! called in the apply transaction of every applied version, exactly once
//! in effect through a kill -9, duplicates and stale versions, in strict
//! and batch mode; its refusal dead-letters the version as
//! `handler_refused`; its request to retry is retried; a handler that does
//! not exist stops `urutan run` in one line.

use std::collections::BTreeMap;
use std::time::Duration;

use sqlx::PgPool;
use urutan_testkit::fixtures::{
    Msg, RunningPool, TestEnv, UrutanProcess, count, drain_dlq, metric_sum, urutan, wait_applied,
    wait_count, wait_for,
};

/// The side table and the handler that writes it: one row per call, with
/// everything the event carried (no key: a second call would show).
const SIDE_TABLE: &str = "
CREATE SCHEMA tim;
CREATE TABLE tim.langkah (
    n BIGSERIAL PRIMARY KEY, message_id TEXT, pesanan_id TEXT, versi BIGINT,
    previous_versi BIGINT, status TEXT, data JSONB, shard INT, event JSONB);
CREATE FUNCTION tim.catat(event jsonb) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF event->>'status' = 'racun' THEN
        RAISE EXCEPTION 'no stock for %', event->>'id';
    END IF;
    INSERT INTO tim.langkah (message_id, pesanan_id, versi, previous_versi, status, data, shard, event)
    VALUES (event->>'message_id', event->>'id', (event->>'versi')::bigint,
            (event->>'previous_versi')::bigint, event->>'status', event->'data',
            (event->>'shard')::int, event);
END
$$;";

async fn with_side_table(env: &TestEnv) -> PgPool {
    let db = env.db().await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(SIDE_TABLE))
        .execute(&db)
        .await
        .expect("side table and handler");
    db
}

/// `entities` × `versions`, each version followed by a duplicate (same
/// message id) every 3rd version and a stale copy (the previous version
/// under a new id) every 4th; returns the messages and how many distinct
/// message ids they carry.
fn stream(entities: usize, versions: i64) -> (Vec<Msg>, i64) {
    let mut msgs = Vec::new();
    let mut ids = 0;
    for v in 1..=versions {
        for e in 0..entities {
            let entity = format!("H-{e}");
            let mut msg = Msg::event(&entity, v);
            let data = serde_json::json!({"id": entity, "status": "dibuat", "versi": v,
                                         "data": {"qty": v}});
            msg.body = data.to_string().into_bytes();
            msgs.push(msg.clone());
            ids += 1;
            if v % 3 == 0 {
                msgs.push(msg);
            }
            if v % 4 == 0 {
                let stale = format!("{entity}-stale-{v}");
                msgs.push(Msg::event_with(&entity, v - 1, &stale, "dibuat"));
                ids += 1;
            }
        }
    }
    (msgs, ids)
}

/// The handler's rows equal the history exactly: one call per applied
/// version (same message id, order, version, shard), none for a stale or
/// duplicate delivery, each with the version it moved from. (Two shards
/// commit side by side, so rows are compared by message id, and each
/// order's calls in its own apply order.)
async fn assert_one_call_per_applied_version(db: &PgPool) {
    type Row = (String, String, i64, Option<i64>, i32);
    let calls: Vec<Row> = sqlx::query_as(
        "SELECT message_id, pesanan_id, versi, previous_versi, shard FROM tim.langkah ORDER BY n",
    )
    .fetch_all(db)
    .await
    .expect("calls");
    let history: Vec<(String, String, i64, i32)> = sqlx::query_as(
        "SELECT message_id, pesanan_id, versi, shard FROM pesanan_riwayat ORDER BY seq",
    )
    .fetch_all(db)
    .await
    .expect("history");
    assert_eq!(
        calls.len(),
        history.len(),
        "one handler call per applied version"
    );
    let applied: BTreeMap<&str, (&str, i64, i32)> = history
        .iter()
        .map(|(id, order, versi, shard)| (id.as_str(), (order.as_str(), *versi, *shard)))
        .collect();
    let mut previous: BTreeMap<&str, i64> = BTreeMap::new();
    for (message_id, order, versi, previous_versi, shard) in &calls {
        assert_eq!(
            applied.get(message_id.as_str()),
            Some(&(order.as_str(), *versi, *shard)),
            "a call for {message_id}, which the history has as applied"
        );
        let before = previous.insert(order, *versi);
        assert_eq!(*previous_versi, before, "previous_versi of {message_id}");
    }
    assert_eq!(applied.len(), calls.len(), "no message called twice");
}

/// A kill -9 mid-stream (commits not yet acked come back as duplicates),
/// duplicates and stale versions: the handler's side table holds exactly
/// one row per applied version.
#[tokio::test]
async fn a_handler_writes_once_per_applied_version_through_a_kill() {
    let env = TestEnv::new("handler_kill").await;
    let db = with_side_table(&env).await;
    let (entities, versions) = (20, 30);
    let (msgs, ids) = stream(entities, versions);
    // Topology first, so that the stream is queued before the first worker.
    let topology = urutan(&env, &[], &["topology"]).await;
    assert!(topology.ok(), "{topology}");
    env.publisher().await.send_all(&msgs).await;

    let mut vars = env.process_env(4);
    vars.push(("HANDLER_FUNCTION", "tim.catat".to_owned()));
    let mut first = UrutanProcess::start("run", &vars);
    wait_for("100 versions applied", Duration::from_secs(60), || async {
        count(&db, "SELECT count(*) FROM pesanan_riwayat").await >= 100
    })
    .await;
    first.kill().await;
    let total = entities as i64 * versions;
    assert!(
        count(&db, "SELECT count(*) FROM pesanan_riwayat").await < total,
        "the worker finished before the kill; nothing was tested"
    );

    let second = UrutanProcess::start("run", &vars);
    wait_applied(&db, total, Duration::from_secs(120)).await;
    wait_count(
        &db,
        "SELECT count(*) FROM pesan_diproses",
        ids,
        Duration::from_secs(60),
    )
    .await;
    second.stop().await;
    assert_one_call_per_applied_version(&db).await;
    let with_data = count(
        &db,
        "SELECT count(*) FROM tim.langkah WHERE (data->>'qty')::bigint = versi
           AND event ? 'previous_versi' AND event->>'status' = 'dibuat'",
    )
    .await;
    assert_eq!(with_data, total, "each call carried its version's event");
    assert!(
        drain_dlq(&env.broker().await).await.is_empty(),
        "nothing dead-lettered"
    );
}

/// Batch mode (and duplicates inside one batch) calls the handler once per
/// applied version too, each with the state that version wrote.
#[tokio::test]
async fn batch_mode_calls_the_handler_once_per_applied_version() {
    let env = TestEnv::new("handler_batch").await;
    let db = with_side_table(&env).await;
    let mut settings = env.settings(2);
    settings.prefetch = 32;
    settings.handler_function = Some("tim.catat".to_owned());
    let pool = RunningPool::ready(settings).await;
    let (msgs, ids) = stream(10, 20);
    env.publisher().await.send_all(&msgs).await;
    wait_applied(&db, 200, Duration::from_secs(60)).await;
    wait_count(
        &db,
        "SELECT count(*) FROM pesan_diproses",
        ids,
        Duration::from_secs(30),
    )
    .await;
    pool.stop().await;
    assert_one_call_per_applied_version(&db).await;
    let seen_state = count(
        &db,
        "SELECT count(*) FROM tim.langkah WHERE versi = previous_versi + 1 OR previous_versi IS NULL",
    )
    .await;
    assert_eq!(seen_state, 200, "each call saw the version before it");
}

/// An error of the handler that is not a request to retry refuses that
/// version: dead-lettered as `handler_refused` with the handler's SQLSTATE
/// and message, its writes rolled back; other orders go on.
#[tokio::test]
async fn a_handler_error_dead_letters_the_version_as_handler_refused() {
    let env = TestEnv::new("handler_refused").await;
    let db = with_side_table(&env).await;
    let mut settings = env.settings(1);
    settings.handler_function = Some("tim.catat".to_owned());
    let pool = RunningPool::ready(settings).await;
    let publisher = env.publisher().await;
    publisher.send(&Msg::event("R-1", 1)).await;
    publisher
        .send(&Msg::event_with("R-1", 2, "R-1-v2", "racun"))
        .await;
    for v in 1..=3 {
        publisher.send(&Msg::event("R-2", v)).await;
    }
    wait_count(
        &db,
        "SELECT count(*) FROM urutan_dead_letter WHERE reason = 'handler_refused'",
        1,
        Duration::from_secs(30),
    )
    .await;
    wait_count(
        &db,
        "SELECT count(*) FROM pesanan WHERE id = 'R-2' AND versi = 3",
        1,
        Duration::from_secs(30),
    )
    .await;
    let (message_id, order, last_error): (String, String, String) = sqlx::query_as(
        "SELECT message_id, pesanan_id, last_error FROM urutan_dead_letter
         WHERE reason = 'handler_refused'",
    )
    .fetch_one(&db)
    .await
    .expect("the record");
    assert_eq!((message_id.as_str(), order.as_str()), ("R-1-v2", "R-1"));
    assert!(
        last_error.contains("P0001") && last_error.contains("no stock for R-1"),
        "the handler's SQLSTATE and message: {last_error}"
    );
    let stored: i64 = sqlx::query_scalar("SELECT versi FROM pesanan WHERE id = 'R-1'")
        .fetch_one(&db)
        .await
        .expect("R-1");
    assert_eq!(stored, 1, "the refused version changed nothing");
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM tim.langkah WHERE message_id = 'R-1-v2'"
        )
        .await,
        0,
        "its handler writes were rolled back"
    );
    let scrape = urutan_testkit::fixtures::http_get(pool.http, "/metrics")
        .await
        .1;
    assert!(
        metric_sum(
            &scrape,
            "urutan_dead_letters_total",
            &["reason=\"handler_refused\""]
        ) >= 1.0,
        "counted under its reason"
    );
    pool.stop().await;
    let dead = drain_dlq(&env.broker().await).await;
    assert_eq!(dead.len(), 1, "only the refused version in the DLQ");
}

/// A handler asking to retry (SQLSTATE URTRY) is retried, counted as
/// `handler_retry`, and applied once when it says yes.
#[tokio::test]
async fn a_handler_asking_to_retry_is_applied_once_it_agrees() {
    let env = TestEnv::new("handler_retry").await;
    let db = env.db().await;
    sqlx::raw_sql(
        "CREATE TABLE siap (ok BOOLEAN NOT NULL);
         INSERT INTO siap VALUES (false);
         CREATE TABLE panggilan (message_id TEXT);
         CREATE FUNCTION tunggu(event jsonb) RETURNS void LANGUAGE plpgsql AS $$
         BEGIN
             IF NOT (SELECT ok FROM siap) THEN
                 RAISE EXCEPTION 'not yet' USING ERRCODE = 'URTRY';
             END IF;
             INSERT INTO panggilan VALUES (event->>'message_id');
         END $$;",
    )
    .execute(&db)
    .await
    .expect("handler");
    let mut settings = env.settings(1);
    settings.handler_function = Some("tunggu".to_owned());
    let pool = RunningPool::ready(settings).await;
    env.publisher().await.send(&Msg::event("T-1", 1)).await;
    let http = pool.http;
    wait_for(
        "a handler_retry retry",
        Duration::from_secs(30),
        || async move {
            let scrape = urutan_testkit::fixtures::http_get(http, "/metrics").await.1;
            metric_sum(
                &scrape,
                "urutan_retries_total",
                &["reason=\"handler_retry\""],
            ) >= 1.0
        },
    )
    .await;
    assert_eq!(
        count(&db, "SELECT count(*) FROM pesanan").await,
        0,
        "not applied yet"
    );
    sqlx::query("UPDATE siap SET ok = true")
        .execute(&db)
        .await
        .expect("agree");
    wait_applied(&db, 1, Duration::from_secs(30)).await;
    pool.stop().await;
    assert_eq!(
        count(&db, "SELECT count(*) FROM panggilan").await,
        1,
        "called once"
    );
}

/// `urutan run` with a handler that does not exist, or does not return
/// void, stops at once with exit code 2 and one line naming the setting.
#[tokio::test]
async fn run_stops_in_one_line_on_a_wrong_handler() {
    let env = TestEnv::new("handler_wrong").await;
    let db = env.db().await;
    sqlx::query("CREATE FUNCTION berapa(event jsonb) RETURNS int LANGUAGE sql AS 'SELECT 1'")
        .execute(&db)
        .await
        .expect("a function returning int");
    for (handler, expected) in [
        (
            "tidak_ada",
            "HANDLER_FUNCTION tidak_ada: there is no function tidak_ada(event jsonb)",
        ),
        (
            "berapa",
            "HANDLER_FUNCTION berapa: berapa(jsonb) returns integer, not void",
        ),
    ] {
        let ran = urutan(&env, &[("HANDLER_FUNCTION", handler)], &["run"]).await;
        assert_eq!(ran.code, Some(2), "{ran}");
        assert!(ran.stderr.contains(expected), "{ran}");
        assert_eq!(ran.error_lines(), 1, "one line: {ran}");
    }
    let ran = urutan(&env, &[("HANDLER_FUNCTION", "a;b")], &["run"]).await;
    assert_eq!(ran.code, Some(2), "a malformed name is refused: {ran}");
    assert!(ran.stderr.contains("--handler-function"), "{ran}");
}
