//! An order that takes another order's message ids (issue 43, the hostile
//! scenario): dedup, dead letters and trace contexts are per (order id,
//! message id) (contract sections 2-4), so a producer that publishes its
//! own order's events with a victim's message ids, before and after the
//! victim's, in every path a version can take (strict and batch, parked
//! behind a gap, set aside after a handler's retry, refused and replayed)
//! changes nothing for the victim: each of its versions applies once, in
//! order, and the attacker's own apply too. The attacker is a broker user
//! that may only write to the entry exchange; the operator's commands run
//! as the operator role of `deploy/postgres/least-privilege.sql`.

use std::time::Duration;

use lapin::BasicProperties;
use lapin::options::BasicPublishOptions;
use lapin::types::{AMQPValue, FieldTable, LongString};
use sqlx::PgPool;
use urutan::config::{GapPolicy, OnRefused, Settings};
use urutan_testkit::fixtures::{
    BrokerUsers, Msg, PgRoles, RunningPool, TestEnv, count, queue_len, stored, urutan, wait_count,
    wait_for,
};

/// A handler that asks to retry the versions of an order `gagal` holds with
/// `coba`, and refuses them while it holds it with `tolak`; it records
/// every call.
const HANDLER: &str = "
CREATE TABLE gagal (pesanan_id TEXT PRIMARY KEY, cara TEXT NOT NULL);
CREATE TABLE panggilan (n BIGSERIAL PRIMARY KEY, pesanan_id TEXT, versi BIGINT, message_id TEXT);
CREATE FUNCTION tangani(event jsonb) RETURNS void LANGUAGE plpgsql AS $$
DECLARE v_cara TEXT;
BEGIN
    SELECT cara INTO v_cara FROM gagal WHERE pesanan_id = event->>'id';
    IF v_cara = 'coba' THEN
        RAISE EXCEPTION 'not yet' USING ERRCODE = 'URTRY';
    ELSIF v_cara = 'tolak' THEN
        RAISE EXCEPTION 'refused %', event->>'message_id';
    END IF;
    INSERT INTO panggilan (pesanan_id, versi, message_id)
    VALUES (event->>'id', (event->>'versi')::bigint, event->>'message_id');
END
$$;";

/// Makes the handler fail `order`'s versions (`coba`: retry, `tolak`:
/// refuse), or (`None`) apply them again.
async fn handler_on(db: &PgPool, order: &str, how: Option<&str>) {
    sqlx::query("DELETE FROM gagal WHERE pesanan_id = $1")
        .bind(order)
        .execute(db)
        .await
        .expect("mend");
    if let Some(how) = how {
        sqlx::query("INSERT INTO gagal VALUES ($1, $2)")
            .bind(order)
            .bind(how)
            .execute(db)
            .await
            .expect("fail");
    }
}

/// The handler's calls for `order`: (versi, message id), in order.
async fn calls(db: &PgPool, order: &str) -> Vec<(i64, String)> {
    sqlx::query_as("SELECT versi, message_id FROM panggilan WHERE pesanan_id = $1 ORDER BY n")
        .bind(order)
        .fetch_all(db)
        .await
        .expect("calls")
}

/// `order`'s history: (versi, message id), in apply order.
async fn history(db: &PgPool, order: &str) -> Vec<(i64, String)> {
    sqlx::query_as(
        "SELECT versi, message_id FROM pesanan_riwayat WHERE pesanan_id = $1 ORDER BY seq",
    )
    .bind(order)
    .fetch_all(db)
    .await
    .expect("history")
}

/// Waits until `sql` (a count) reaches `n`; on a timeout, says what is
/// parked, dead-lettered, held and stored.
async fn until(db: &PgPool, sql: &'static str, n: i64) {
    for _ in 0..600 {
        if count(db, sql).await == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "timed out waiting for `{sql}` to count {n}; {:#?}",
        state(db).await
    );
}

/// Waits until `order` is stored at `versi` (as [`until`]).
async fn stored_at(db: &PgPool, order: &str, versi: i64) {
    for _ in 0..600 {
        if stored(db, order).await == Some(versi) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "timed out waiting for {order} at v{versi}; {:#?}",
        state(db).await
    );
}

/// What is parked, dead-lettered, held and stored, one line each.
async fn state(db: &PgPool) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT 'parked ' || pesanan_id || ' ' || message_id || ' v' || versi
                || ' due ' || coalesce(jatuh_tempo::text, '-') || ' ' || coalesce(galat, '')
         FROM urutan_parkir
         UNION ALL SELECT 'dead ' || coalesce(pesanan_id, '?') || ' ' || delivery_key || ' '
                || reason || ' ' || coalesce(last_error, '') || ' '
                || coalesce(resolution, 'open') FROM urutan_dead_letter
         UNION ALL SELECT 'stored ' || id || ' v' || versi FROM pesanan
         UNION ALL SELECT 'held ' || pesanan_id || ' ' || alasan FROM urutan_tahan",
    )
    .fetch_all(db)
    .await
    .unwrap_or_else(|e| vec![e.to_string()])
}

fn v(order: &str, versi: i64, id: &str) -> Msg {
    Msg::event_with(
        order,
        versi,
        id,
        if order == "X" { "palsu" } else { "dibuat" },
    )
}

/// The scenario on one shard (so every message meets the others in
/// order), in strict (`prefetch` 1) or batch mode. The victim V's versions
/// 1..6 have message ids V1..V6; the attacker X takes each of them for its
/// own versions, before V's and while V's wait.
async fn an_order_takes_anothers_message_ids(prefetch: u16) {
    let env = TestEnv::new(&format!("taken_ids_p{prefetch}")).await;
    let db = env.db().await;
    sqlx::raw_sql(HANDLER).execute(&db).await.expect("handler");
    let roles = PgRoles::create(&env, &["operator"]);
    // The handler's own tables, for the worker role that calls it.
    sqlx::raw_sql(
        "GRANT SELECT ON gagal TO PUBLIC; GRANT INSERT ON panggilan TO PUBLIC;
         GRANT USAGE ON SEQUENCE panggilan_n_seq TO PUBLIC;",
    )
    .execute(&db)
    .await
    .expect("the handler's grants");
    let operator = roles.url("operator");
    let as_operator = [("DATABASE_URL", operator.as_str())];
    let mut users = BrokerUsers::default();
    let attacker_user = format!("taker-{}", env.name);
    users.add(&env, &attacker_user, "pw-taker", ["^$", "^pesanan$", "^$"]);

    let mut settings: Settings = env.settings(1);
    settings.database_url = roles.secret_url("worker");
    settings.database_pool_size = Some(4);
    settings.prefetch = prefetch;
    settings.handler_function = Some("tangani".into());
    settings.gap_policy = GapPolicy::Wait;
    settings.on_refused = OnRefused::Hold;
    settings.retry_backoff_min = Duration::from_millis(100);
    settings.retry_backoff_max = Duration::from_millis(300);
    settings.retry_max_attempts = 1000;
    let pool = RunningPool::ready(settings).await;
    let victim = env.publisher().await;
    let attacker = env.publisher_as(&attacker_user, "pw-taker").await;

    // The attacker takes V1 and V2 first.
    attacker.send_all(&[v("X", 1, "V1"), v("X", 2, "V2")]).await;
    stored_at(&db, "X", 2).await;
    // Strict or batch: V's v1 is applied, not a duplicate.
    victim.send_all(&[v("V", 1, "V1")]).await;
    stored_at(&db, "V", 1).await;

    // Set aside: V's v2 asks to retry; v3 waits behind it; the attacker's
    // v3, with id V3, is applied for X meanwhile.
    handler_on(&db, "V", Some("coba")).await;
    victim.send_all(&[v("V", 2, "V2"), v("V", 3, "V3")]).await;
    until(
        &db,
        "SELECT count(*) FROM urutan_parkir WHERE pesanan_id = 'V' AND message_id IN ('V2', 'V3')",
        2,
    )
    .await;
    attacker.send_all(&[v("X", 3, "V3")]).await;
    stored_at(&db, "X", 3).await;

    // Parked behind a gap: V's v5 (v4 missing) waits; X's v4 with id V5
    // is applied for X.
    victim.send_all(&[v("V", 5, "V5")]).await;
    until(
        &db,
        "SELECT count(*) FROM urutan_parkir WHERE pesanan_id = 'V' AND message_id = 'V5'",
        1,
    )
    .await;
    attacker.send_all(&[v("X", 4, "V5")]).await;
    stored_at(&db, "X", 4).await;
    handler_on(&db, "V", None).await;
    stored_at(&db, "V", 3).await;

    // Refused and held: V's v4 and X's v5, both with id V4: two dead
    // letters, two records, each its own.
    handler_on(&db, "V", Some("tolak")).await;
    handler_on(&db, "X", Some("tolak")).await;
    victim.send_all(&[v("V", 4, "V4")]).await;
    attacker.send_all(&[v("X", 5, "V4")]).await;
    until(
        &db,
        "SELECT count(*) FROM urutan_dead_letter WHERE message_id = 'V4' AND resolved_at IS NULL",
        2,
    )
    .await;
    let records: Vec<(String, String)> = sqlx::query_as(
        "SELECT pesanan_id, reason FROM urutan_dead_letter WHERE message_id = 'V4' ORDER BY 1",
    )
    .fetch_all(&db)
    .await
    .expect("records");
    let record = |o: &str| (o.to_owned(), "handler_refused".to_owned());
    assert_eq!(records, [record("V"), record("X")], "a record per order");
    let conn = env.broker().await;
    wait_for("both in the DLQ", Duration::from_secs(30), || {
        let conn = &conn;
        async move { queue_len(conn, "pesanan.dlq").await == 2 }
    })
    .await;

    let list = urutan(&env, &as_operator, &["dlq", "list", "--json"]).await;
    assert!(list.ok(), "{list}");
    let listed: serde_json::Value = serde_json::from_str(&list.stdout).expect("list json");
    let mut pairs: Vec<(String, String)> = listed["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| {
            let text = |k: &str| m[k].as_str().unwrap_or_default().to_owned();
            (text("message_id"), text("pesanan_id"))
        })
        .collect();
    pairs.sort();
    let pair = |m: &str, o: &str| (m.to_owned(), o.to_owned());
    assert_eq!(pairs, [pair("V4", "V"), pair("V4", "X")], "{list}");
    let show = urutan(
        &env,
        &as_operator,
        &["dlq", "show", "V4", "--order", "X", "--json"],
    )
    .await;
    assert!(show.ok(), "{show}");
    let shown: serde_json::Value = serde_json::from_str(&show.stdout).expect("show json");
    assert_eq!(shown["pesanan_id"], "X", "{show}");
    assert_eq!(shown["other_orders"], serde_json::json!(["V"]), "{show}");

    // The victim's replay takes its own message only; the attacker's stays.
    handler_on(&db, "V", None).await;
    let replay = urutan(
        &env,
        &as_operator,
        &["dlq", "replay", "V4", "--order", "V", "--wait", "30s"],
    )
    .await;
    assert!(replay.ok(), "{replay}");
    stored_at(&db, "V", 5).await;
    assert_eq!(queue_len(&conn, "pesanan.dlq").await, 1, "X's V4 stays");
    let open: Vec<String> =
        sqlx::query_scalar("SELECT pesanan_id FROM urutan_dead_letter WHERE resolved_at IS NULL")
            .fetch_all(&db)
            .await
            .expect("open records");
    assert_eq!(open, ["X"]);
    victim.send_all(&[v("V", 6, "V6")]).await;
    stored_at(&db, "V", 6).await;
    // A copy of V's last id, after it, for X: X's own version again.
    attacker.send_all(&[v("X", 6, "V6")]).await;

    // The attacker's own refused version is replayed on its own too.
    handler_on(&db, "X", None).await;
    let replay = urutan(
        &env,
        &as_operator,
        &["dlq", "replay", "V4", "--order", "X", "--wait", "30s"],
    )
    .await;
    assert!(replay.ok(), "{replay}");
    stored_at(&db, "X", 6).await;
    pool.stop().await;

    let expected = |order: &str, ids: &[&str]| -> Vec<(i64, String)> {
        let _ = order;
        ids.iter()
            .enumerate()
            .map(|(i, id)| (i as i64 + 1, (*id).to_owned()))
            .collect()
    };
    let victims = expected("V", &["V1", "V2", "V3", "V4", "V5", "V6"]);
    assert_eq!(history(&db, "V").await, victims, "V: each once, in order");
    assert_eq!(
        calls(&db, "V").await,
        victims,
        "V's handler: each once, in order"
    );
    let attackers = expected("X", &["V1", "V2", "V3", "V5", "V4", "V6"]);
    assert_eq!(history(&db, "X").await, attackers, "X applies its own");
    assert_eq!(calls(&db, "X").await, attackers);
    assert_eq!(count(&db, "SELECT count(*) FROM urutan_parkir").await, 0);
    assert_eq!(count(&db, "SELECT count(*) FROM urutan_tahan").await, 0);
    assert_eq!(queue_len(&conn, "pesanan.dlq").await, 0);

    let explain = urutan(&env, &as_operator, &["explain", "V"]).await;
    assert!(explain.ok(), "{explain}");
    for id in ["V1", "V2", "V3", "V4", "V5", "V6"] {
        assert!(explain.stdout.contains(id), "{id}: {explain}");
    }
    let verify = urutan(&env, &as_operator, &["verify"]).await;
    assert!(verify.ok(), "{verify}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_an_order_that_takes_another_orders_message_ids_changes_nothing_for_it() {
    an_order_takes_anothers_message_ids(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_an_order_that_takes_another_orders_message_ids_changes_nothing_for_it() {
    an_order_takes_anothers_message_ids(16).await;
}

/// The trace context of each message is kept per (order, message id): two
/// orders' versions with one message id, parked (a gap) in one batch, each
/// keep their own traceparent (the lookup by message id alone gave the
/// second the first's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_orders_with_one_message_id_keep_their_own_trace_contexts() {
    let env = TestEnv::new("taken_traces").await;
    let db = env.db().await;
    let mut settings = env.settings(1);
    settings.prefetch = 16;
    settings.gap_policy = GapPolicy::Wait;
    // Queued first, so that both arrive in one batch.
    let conn = urutan::broker::connect(&settings.amqp_url, "t")
        .await
        .expect("connect");
    let names = urutan::broker::Names::new("pesanan");
    urutan::broker::topology::declare(&conn, &names, 1, 5, false)
        .await
        .expect("declare");
    let ch = env.broker().await.create_channel().await.expect("channel");
    let trace = |n: char| format!("00-{}-{}-01", n.to_string().repeat(32), "b".repeat(16));
    for (order, n) in [("A", 'a'), ("B", 'c')] {
        let mut headers = FieldTable::default();
        headers.insert(
            "x-pesanan-id".into(),
            AMQPValue::LongString(LongString::from(order.as_bytes())),
        );
        headers.insert(
            "traceparent".into(),
            AMQPValue::LongString(LongString::from(trace(n).into_bytes())),
        );
        let body = serde_json::json!({"id": order, "status": "dibuat", "versi": 2});
        let props = BasicProperties::default()
            .with_message_id("M".into())
            .with_delivery_mode(2)
            .with_headers(headers);
        ch.basic_publish(
            "pesanan".into(),
            "pesanan.dibuat".into(),
            BasicPublishOptions::default(),
            body.to_string().as_bytes(),
            props,
        )
        .await
        .expect("publish")
        .await
        .expect("confirm");
    }
    let pool = RunningPool::ready(settings).await;
    wait_count(
        &db,
        "SELECT count(*) FROM urutan_parkir WHERE message_id = 'M'",
        2,
        Duration::from_secs(30),
    )
    .await;
    pool.stop().await;
    let traces: Vec<(String, Option<String>)> = sqlx::query_as(
        "SELECT pesanan_id, substr(traceparent, 4, 32) FROM urutan_parkir ORDER BY pesanan_id",
    )
    .fetch_all(&db)
    .await
    .expect("parked");
    assert_eq!(
        traces,
        [
            ("A".to_owned(), Some("a".repeat(32))),
            ("B".to_owned(), Some("c".repeat(32)))
        ],
        "each parked version continues its own message's trace"
    );
}
