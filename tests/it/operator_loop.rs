//! The operator's loop closes (issue 48, item 2): a dead letter whose
//! version was released past or applied since is settled and no longer
//! keeps `urutan status` red; `urutan dlq purge` takes message ids, a
//! reason, `--settled`, `--entity` and `--dry-run` beside the whole-DLQ
//! purge; every state-changing command leaves an audit row naming the OS
//! user and host, as the console's actions do.

use std::time::Duration;

use sqlx::PgPool;
use urutan::config::{OnRefused, Settings};
use urutan_testkit::fixtures::{
    Msg, RunningPool, TestEnv, queue_len, urutan, wait_count, wait_for, wait_stored,
};

/// A handler that refuses every version whose status is `racun`.
const HANDLER: &str = "
CREATE FUNCTION tolak_racun(event jsonb) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF event->>'status' = 'racun' THEN
        RAISE EXCEPTION 'refused %', event->>'message_id';
    END IF;
END
$$;";

/// Waits (30 s at most) until the DLQ holds `n` messages.
async fn wait_dlq(env: &TestEnv, n: u32) {
    let conn = env.broker().await;
    let conn = &conn;
    wait_for(
        &format!("{n} message(s) in pesanan.dlq"),
        Duration::from_secs(30),
        || async move { queue_len(conn, "pesanan.dlq").await == n },
    )
    .await;
}

/// The audit rows: (who, action, order, result), oldest first.
async fn audit(db: &PgPool) -> Vec<(String, String, Option<String>, String)> {
    sqlx::query_as("SELECT oleh, tindakan, pesanan_id, hasil FROM urutan_audit ORDER BY seq")
        .fetch_all(db)
        .await
        .expect("audit rows")
}

/// Every row says the command line, the OS user and the host.
fn assert_cli_rows(rows: &[(String, String, Option<String>, String)]) {
    for (who, ..) in rows {
        assert!(who.starts_with("cli (os user) "), "{who}");
        assert!(who.contains('@'), "user@host: {who}");
    }
}

fn settings(env: &TestEnv) -> Settings {
    let mut settings = env.settings(1);
    settings.handler_function = Some("tolak_racun".into());
    settings.on_refused = OnRefused::Hold;
    settings
}

#[tokio::test]
async fn a_release_settles_its_dead_letter_and_status_turns_green() {
    let env = TestEnv::new("loop_release").await;
    let db = env.db().await;
    sqlx::raw_sql(HANDLER).execute(&db).await.expect("handler");
    let pool = RunningPool::ready(settings(&env)).await;
    let msgs = vec![
        Msg::event("C", 1),
        Msg::event_with("C", 2, "C-v2", "racun"),
        Msg::event("C", 3),
    ];
    env.publisher().await.send_all(&msgs).await;
    wait_count(
        &db,
        "SELECT count(*) FROM urutan_parkir WHERE pesanan_id = 'C'",
        1,
        Duration::from_secs(30),
    )
    .await;
    wait_dlq(&env, 1).await;

    let red = urutan(&env, &[], &["status"]).await;
    assert_eq!(red.code, Some(1), "{red}");
    assert!(red.stdout.contains("[dead_letters]"), "{red}");

    let released = urutan(&env, &[], &["hold", "release", "C"]).await;
    assert!(released.ok(), "{released}");
    assert!(released.stdout.contains("dlq purge C-v2"), "{released}");
    wait_stored(&db, "C", 3).await;

    // The message is still in the DLQ, its version settled: green.
    let green = urutan(&env, &[], &["status"]).await;
    assert!(!green.stdout.contains("[dead_letters]"), "{green}");
    assert!(green.stdout.contains("1 settled"), "{green}");
    assert_eq!(green.code, Some(0), "{green}");
    let listed = urutan(&env, &[], &["dlq", "list"]).await;
    assert!(
        listed.stdout.contains("settled: version released past"),
        "{listed}"
    );

    let dry = urutan(&env, &[], &["dlq", "purge", "--settled", "--dry-run"]).await;
    assert!(dry.ok(), "{dry}");
    assert!(dry.stdout.contains("would purge 1"), "{dry}");
    assert!(dry.stdout.contains("C-v2"), "{dry}");
    wait_dlq(&env, 1).await;
    let purged = urutan(&env, &[], &["dlq", "purge", "--settled", "--yes"]).await;
    assert!(purged.ok(), "{purged}");
    wait_dlq(&env, 0).await;
    let resolution: Option<String> =
        sqlx::query_scalar("SELECT resolution FROM urutan_dead_letter WHERE message_id = 'C-v2'")
            .fetch_one(&db)
            .await
            .expect("the record");
    assert_eq!(resolution.as_deref(), Some("purged"));
    pool.stop().await;

    let rows = audit(&db).await;
    assert_cli_rows(&rows);
    let actions: Vec<(&str, Option<&str>)> = rows
        .iter()
        .map(|(_, action, order, _)| (action.as_str(), order.as_deref()))
        .collect();
    assert_eq!(
        actions,
        [("hold_release", Some("C")), ("dlq_purge", Some("C"))]
    );
}

#[tokio::test]
async fn purge_by_id_reason_and_entity_with_a_dry_run_each_audited() {
    let env = TestEnv::new("loop_purge").await;
    let db = env.db().await;
    let pool = RunningPool::ready(env.settings(1)).await;
    let mut no_header = Msg::event_with("A", 1, "m-a", "dibuat");
    no_header.header = None;
    let mut no_header_too = Msg::event_with("B", 1, "m-b", "dibuat");
    no_header_too.header = None;
    let mut transient = Msg::event_with("E", 1, "m-e", "dibuat");
    transient.delivery_mode = Some(1);
    let mut transient_too = Msg::event_with("F", 1, "m-f", "dibuat");
    transient_too.delivery_mode = Some(1);
    let publisher = env.publisher().await;
    publisher
        .send_all(&[no_header, no_header_too, transient, transient_too])
        .await;
    wait_dlq(&env, 4).await;
    // E's version 2 applied: its dead-lettered version 1 is superseded.
    publisher.send(&Msg::event("E", 2)).await;
    wait_stored(&db, "E", 2).await;
    let status = urutan(&env, &[], &["status"]).await;
    assert!(
        status.stdout.contains("3 message(s) in pesanan.dlq"),
        "only the unsettled count: {status}"
    );

    let dry = urutan(&env, &[], &["dlq", "purge", "m-a", "--dry-run"]).await;
    assert!(dry.ok(), "{dry}");
    assert!(dry.stdout.contains("would purge 1"), "{dry}");
    wait_dlq(&env, 4).await;

    // Named by id: no confirmation needed.
    let one = urutan(&env, &[], &["dlq", "purge", "m-a"]).await;
    assert!(one.ok(), "{one}");
    wait_dlq(&env, 3).await;
    // An id with another order's entity id: nothing purged.
    let other = urutan(&env, &[], &["dlq", "purge", "m-b", "--order", "Z"]).await;
    assert_eq!(other.code, Some(1), "{other}");
    wait_dlq(&env, 3).await;

    // A reason may take more than meant: asked on a terminal, else --yes.
    let unasked = urutan(&env, &[], &["dlq", "purge", "--reason", "not_persistent"]).await;
    assert_eq!(unasked.code, Some(1), "{unasked}");
    assert!(unasked.stderr.contains("--yes"), "{unasked}");
    wait_dlq(&env, 3).await;
    let by_reason = urutan(
        &env,
        &[],
        &["dlq", "purge", "--reason", "not_persistent", "--yes"],
    )
    .await;
    assert!(by_reason.ok(), "{by_reason}");
    wait_dlq(&env, 1).await;

    let unknown = urutan(&env, &[], &["dlq", "purge", "no-such-id"]).await;
    assert_eq!(unknown.code, Some(1), "{unknown}");
    assert!(unknown.stdout.contains("nothing done"), "{unknown}");

    // A replay is audited too (m-b lacks its header: dead-lettered again).
    let replayed = urutan(&env, &[], &["dlq", "replay", "m-b", "--wait", "5s"]).await;
    assert!(replayed.stdout.contains("m-b"), "{replayed}");
    wait_dlq(&env, 1).await;

    // The whole DLQ, as the contract's `dlq purge --yes`.
    let whole = urutan(&env, &[], &["dlq", "purge", "--yes"]).await;
    assert!(whole.ok(), "{whole}");
    wait_dlq(&env, 0).await;
    pool.stop().await;

    let rows = audit(&db).await;
    assert_cli_rows(&rows);
    let actions: Vec<(&str, Option<&str>)> = rows
        .iter()
        .map(|(_, action, order, _)| (action.as_str(), order.as_deref()))
        .collect();
    assert_eq!(
        actions,
        [
            ("dlq_purge", Some("A")),
            ("dlq_purge", Some("Z")), // m-b of order Z: nothing done, audited all the same
            ("dlq_purge", Some("E")),
            ("dlq_purge", Some("F")),
            ("dlq_purge", None), // no-such-id
            ("dlq_replay", Some("B")),
            ("dlq_purge", None), // the whole DLQ
        ],
        "{rows:?}"
    );
}
