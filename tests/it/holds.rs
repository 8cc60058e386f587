//! Failures, retries and holds (docs/contract.md section 11): one failing
//! order never stalls its shard (its message is set aside and retried, its
//! later versions wait); a refused version holds its order until it is
//! replayed (`urutan dlq replay`) or the order released without it
//! (`urutan hold release`); retries run out into a refusal; with
//! `ON_REFUSED=skip` the order goes on. In strict and batch mode.

use std::time::Duration;

use sqlx::PgPool;
use urutan::config::{OnRefused, Settings};
use urutan_testkit::fixtures::{
    Msg, RunningPool, TestEnv, count, drain_dlq, http_get, metric_sum, queue_len, stored, urutan,
    wait_count, wait_for, wait_stored,
};

/// A handler that asks to retry while `gagal` holds the order's id with
/// `coba`, and refuses it while `gagal` holds it with `tolak`; it records
/// every call in `panggilan`.
const HANDLER: &str = "
CREATE TABLE gagal (pesanan_id TEXT PRIMARY KEY, cara TEXT NOT NULL);
CREATE TABLE panggilan (n BIGSERIAL PRIMARY KEY, pesanan_id TEXT, versi BIGINT, message_id TEXT);
CREATE FUNCTION tangani(event jsonb) RETURNS void LANGUAGE plpgsql AS $$
DECLARE v_cara TEXT;
BEGIN
    SELECT cara INTO v_cara FROM gagal
    WHERE pesanan_id = event->>'id' OR (pesanan_id = '*' || (event->>'status'));
    IF v_cara = 'coba' THEN
        RAISE EXCEPTION 'not yet' USING ERRCODE = 'URTRY';
    ELSIF v_cara = 'tolak' THEN
        RAISE EXCEPTION 'refused %', event->>'message_id';
    END IF;
    INSERT INTO panggilan (pesanan_id, versi, message_id)
    VALUES (event->>'id', (event->>'versi')::bigint, event->>'message_id');
END
$$;";

struct Scene {
    env: TestEnv,
    db: PgPool,
    pool: RunningPool,
}

/// A pool on `shards` shards with the handler, quick retries and
/// `ON_REFUSED=hold` (the contract's default), `prefetch` as given.
async fn scene(test: &str, shards: u16, prefetch: u16, tune: impl FnOnce(&mut Settings)) -> Scene {
    let env = TestEnv::new(test).await;
    let db = env.db().await;
    sqlx::raw_sql(HANDLER).execute(&db).await.expect("handler");
    let mut settings = env.settings(shards);
    settings.prefetch = prefetch;
    settings.handler_function = Some("tangani".into());
    settings.retry_backoff_min = Duration::from_millis(100);
    settings.retry_backoff_max = Duration::from_millis(400);
    settings.retry_max_attempts = 1000;
    settings.on_refused = OnRefused::Hold;
    tune(&mut settings);
    let pool = RunningPool::ready(settings).await;
    Scene { env, db, pool }
}

async fn fail(db: &PgPool, order: &str, how: &str) {
    sqlx::query("INSERT INTO gagal VALUES ($1, $2)")
        .bind(order)
        .bind(how)
        .execute(db)
        .await
        .expect("break");
}

async fn mend(db: &PgPool) {
    sqlx::query("DELETE FROM gagal")
        .execute(db)
        .await
        .expect("mend");
}

/// The handler's calls for `order`, in order: its versions.
async fn calls(db: &PgPool, order: &str) -> Vec<i64> {
    sqlx::query_scalar("SELECT versi FROM panggilan WHERE pesanan_id = $1 ORDER BY n")
        .bind(order)
        .fetch_all(db)
        .await
        .expect("calls")
}

/// Every order's versions 1..=n interleaved: (order, versi) in publish order.
fn interleaved(orders: &[&str], n: i64) -> Vec<Msg> {
    (1..=n)
        .flat_map(|v| orders.iter().map(move |o| Msg::event(o, v)))
        .collect()
}

async fn scrape(pool: &RunningPool) -> String {
    http_get(pool.http, "/metrics").await.1
}

/// The contract's scenario: the handler keeps asking to retry for order F.
/// Every other order on the same (single) shard completes; F's later
/// versions wait; once the handler agrees, F completes 1..n in order.
#[tokio::test]
async fn one_order_asking_to_retry_never_stalls_its_shard() {
    for prefetch in [1, 16] {
        let s = scene(&format!("retry_p{prefetch}"), 1, prefetch, |_| {}).await;
        fail(&s.db, "F", "coba").await;
        let others: Vec<String> = (0..20).map(|i| format!("O-{i}")).collect();
        let mut orders: Vec<&str> = others.iter().map(String::as_str).collect();
        orders.insert(7, "F");
        s.env
            .publisher()
            .await
            .send_all(&interleaved(&orders, 5))
            .await;
        wait_count(
            &s.db,
            "SELECT count(*) FROM pesanan_riwayat WHERE pesanan_id LIKE 'O-%'",
            100,
            Duration::from_secs(60),
        )
        .await;
        assert_eq!(
            stored(&s.db, "F").await,
            None,
            "F waits (prefetch {prefetch})"
        );
        assert_eq!(
            count(
                &s.db,
                "SELECT count(*) FROM urutan_parkir WHERE pesanan_id = 'F'"
            )
            .await,
            5,
            "F v1 set aside, v2..v5 waiting behind it"
        );
        // Set aside once, then tried again (each try counted).
        wait_for(
            "F retried, and counted",
            Duration::from_secs(15),
            || async {
                let scrape = scrape(&s.pool).await;
                metric_sum(
                    &scrape,
                    "urutan_retries_total",
                    &["reason=\"handler_retry\""],
                ) >= 2.0
            },
        )
        .await;
        let status = urutan(&s.env, &[], &["status", "--json"]).await;
        assert!(status.stdout.contains("\"orders_retrying\""), "{status}");
        let explain = urutan(&s.env, &[], &["explain", "F"]).await;
        assert!(explain.stdout.contains("retrying"), "{explain}");
        assert!(explain.stdout.contains("attempt"), "{explain}");

        mend(&s.db).await;
        wait_stored(&s.db, "F", 5).await;
        assert_eq!(
            calls(&s.db, "F").await,
            [1, 2, 3, 4, 5],
            "in order, once each"
        );
        wait_count(
            &s.db,
            "SELECT count(*) FROM urutan_parkir",
            0,
            Duration::from_secs(10),
        )
        .await;
        s.pool.stop().await;
    }
}

/// A refused version holds its order at the version before; its later
/// versions are recorded and wait; another order goes on. Replayed after
/// the fix, it is applied and the rest follow in order.
#[tokio::test]
async fn a_refused_version_holds_its_order_until_it_is_replayed() {
    for prefetch in [1, 16] {
        let s = scene(&format!("hold_replay_p{prefetch}"), 1, prefetch, |_| {}).await;
        fail(&s.db, "*racun", "tolak").await;
        let publisher = s.env.publisher().await;
        let mut msgs = vec![Msg::event("A", 1), Msg::event_with("A", 2, "A-v2", "racun")];
        msgs.extend((3..=4).map(|v| Msg::event("A", v)));
        msgs.extend((1..=3).map(|v| Msg::event("B", v)));
        publisher.send_all(&msgs).await;
        wait_stored(&s.db, "B", 3).await;
        wait_count(
            &s.db,
            "SELECT count(*) FROM urutan_parkir WHERE pesanan_id = 'A'",
            2,
            Duration::from_secs(30),
        )
        .await;
        assert_eq!(
            stored(&s.db, "A").await,
            Some(1),
            "held at the version before"
        );
        let held = urutan(&s.env, &[], &["hold", "list", "--json"]).await;
        assert!(held.ok(), "{held}");
        let list: serde_json::Value = serde_json::from_str(&held.stdout).expect("json");
        assert_eq!(list[0]["order"], "A", "{held}");
        assert_eq!(list[0]["reason"], "refused");
        assert_eq!(list[0]["message_id"], "A-v2");
        assert_eq!(list[0]["versi"], 2);
        assert_eq!(list[0]["waiting"], 2);
        let status = urutan(&s.env, &[], &["status", "--json"]).await;
        assert!(status.stdout.contains("\"orders_held\""), "{status}");
        let explain = urutan(&s.env, &[], &["explain", "A"]).await;
        assert!(explain.stdout.contains("ON HOLD (refused)"), "{explain}");
        assert!(explain.stdout.contains("held"), "{explain}");
        wait_for("the held gauge", Duration::from_secs(15), || async {
            let scrape = scrape(&s.pool).await;
            metric_sum(&scrape, "urutan_orders_held", &["reason=\"refused\""]) == 1.0
        })
        .await;
        // The dry run says what follows the refused version once it applies.
        let dry = urutan(&s.env, &[], &["dlq", "replay", "A-v2", "--dry-run"]).await;
        assert!(dry.ok(), "{dry}");
        assert!(
            dry.stdout.contains(
                "it holds its order: once it applies, the 2 waiting version(s) follow in order \
                 (v3, v4) and the hold ends"
            ),
            "{dry}"
        );

        mend(&s.db).await;
        let replay = urutan(&s.env, &[], &["dlq", "replay", "A-v2"]).await;
        assert!(replay.ok(), "{replay}");
        wait_stored(&s.db, "A", 4).await;
        assert_eq!(
            calls(&s.db, "A").await,
            [1, 2, 3, 4],
            "the refused one, then the rest"
        );
        assert_eq!(count(&s.db, "SELECT count(*) FROM urutan_tahan").await, 0);
        s.pool.stop().await;
    }
}

/// A refused version replayed while its handler still asks to retry is set
/// aside like any message (its order stays held); once the handler agrees
/// it is applied, the hold ends and the waiting versions follow in order.
#[tokio::test]
async fn a_replay_that_fails_transiently_is_retried_and_then_releases_the_order() {
    let s = scene("hold_replay_retry", 1, 1, |_| {}).await;
    fail(&s.db, "*racun", "tolak").await;
    let msgs = vec![
        Msg::event("G", 1),
        Msg::event_with("G", 2, "G-v2", "racun"),
        Msg::event("G", 3),
    ];
    s.env.publisher().await.send_all(&msgs).await;
    wait_count(
        &s.db,
        "SELECT count(*) FROM urutan_parkir WHERE pesanan_id = 'G'",
        1,
        Duration::from_secs(30),
    )
    .await;
    mend(&s.db).await;
    fail(&s.db, "G", "coba").await;
    let replay = urutan(&s.env, &[], &["dlq", "replay", "G-v2"]).await;
    assert!(replay.ok(), "{replay}");
    wait_count(
        &s.db,
        "SELECT count(*) FROM urutan_parkir WHERE pesanan_id = 'G' AND jatuh_tempo IS NOT NULL",
        1,
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(stored(&s.db, "G").await, Some(1), "still held");
    mend(&s.db).await;
    wait_stored(&s.db, "G", 3).await;
    assert_eq!(calls(&s.db, "G").await, [1, 2, 3]);
    assert_eq!(count(&s.db, "SELECT count(*) FROM urutan_tahan").await, 0);
    s.pool.stop().await;
}

/// `urutan hold release` resumes an order without its refused version: the
/// rest is applied in order, the skip recorded and told by `explain`.
#[tokio::test]
async fn hold_release_skips_the_refused_version() {
    let s = scene("hold_release", 2, 1, |_| {}).await;
    fail(&s.db, "*racun", "tolak").await;
    let msgs = vec![
        Msg::event("C", 1),
        Msg::event_with("C", 2, "C-v2", "racun"),
        Msg::event("C", 3),
        Msg::event("C", 4),
    ];
    s.env.publisher().await.send_all(&msgs).await;
    wait_count(
        &s.db,
        "SELECT count(*) FROM urutan_parkir WHERE pesanan_id = 'C'",
        2,
        Duration::from_secs(30),
    )
    .await;
    let released = urutan(&s.env, &[], &["hold", "release", "C"]).await;
    assert!(released.ok(), "{released}");
    assert!(released.stdout.contains("without v2"), "{released}");
    wait_stored(&s.db, "C", 4).await;
    assert_eq!(calls(&s.db, "C").await, [1, 3, 4]);
    let explain = urutan(&s.env, &[], &["explain", "C"]).await;
    assert!(explain.stdout.contains("skipped"), "{explain}");
    assert!(explain.stdout.contains("dead-lettered"), "{explain}");
    let again = urutan(&s.env, &[], &["hold", "release", "C"]).await;
    assert_eq!(again.code, Some(1), "not held any more: {again}");
    assert!(again.stderr.contains("not on hold"), "{again}");
    s.pool.stop().await;
}

/// A message set aside that keeps failing is refused after
/// RETRY_MAX_ATTEMPTS: dead-lettered (`retries_exhausted`, in the DLQ with
/// its record) and its order held; replayed after the fix, it is applied
/// and the rest follow.
#[tokio::test]
async fn retries_run_out_into_a_refusal_that_holds() {
    let s = scene("retries_exhausted", 1, 1, |s| s.retry_max_attempts = 3).await;
    fail(&s.db, "E", "coba").await;
    let msgs: Vec<Msg> = (1..=3).map(|v| Msg::event("E", v)).collect();
    s.env.publisher().await.send_all(&msgs).await;
    wait_count(
        &s.db,
        "SELECT count(*) FROM urutan_dead_letter WHERE reason = 'retries_exhausted'",
        1,
        Duration::from_secs(30),
    )
    .await;
    let conn = s.env.broker().await;
    wait_for(
        "the refused message in the DLQ",
        Duration::from_secs(10),
        || async { queue_len(&conn, "pesanan.dlq").await == 1 },
    )
    .await;
    assert_eq!(
        count(
            &s.db,
            "SELECT count(*) FROM urutan_tahan WHERE pesanan_id = 'E'"
        )
        .await,
        1
    );
    let (message_id, attempts_error): (String, String) = sqlx::query_as(
        "SELECT message_id, last_error FROM urutan_dead_letter WHERE reason = 'retries_exhausted'",
    )
    .fetch_one(&s.db)
    .await
    .expect("record");
    assert_eq!(message_id, "E-v1");
    assert!(attempts_error.contains("URTRY"), "{attempts_error}");
    let scrape = scrape(&s.pool).await;
    assert!(
        metric_sum(
            &scrape,
            "urutan_dead_letters_total",
            &["reason=\"retries_exhausted\""]
        ) >= 1.0
    );
    mend(&s.db).await;
    let replay = urutan(&s.env, &[], &["dlq", "replay", "E-v1"]).await;
    assert!(replay.ok(), "{replay}");
    wait_stored(&s.db, "E", 3).await;
    assert_eq!(calls(&s.db, "E").await, [1, 2, 3]);
    s.pool.stop().await;
}

/// `ON_REFUSED=skip`: the refused version is dead-lettered and its order's
/// later versions go on (no hold).
#[tokio::test]
async fn on_refused_skip_lets_the_order_go_on() {
    let s = scene("refused_skip", 1, 1, |s| s.on_refused = OnRefused::Skip).await;
    fail(&s.db, "*racun", "tolak").await;
    let msgs = vec![
        Msg::event("K", 1),
        Msg::event_with("K", 2, "K-v2", "racun"),
        Msg::event("K", 3),
    ];
    s.env.publisher().await.send_all(&msgs).await;
    wait_stored(&s.db, "K", 3).await;
    assert_eq!(calls(&s.db, "K").await, [1, 3]);
    assert_eq!(count(&s.db, "SELECT count(*) FROM urutan_tahan").await, 0);
    s.pool.stop().await;
}

/// A full DLQ stops only the order whose refusal it will not take (issue
/// 43): before, the release step rolled back every 200 ms and another
/// order's set-aside version stayed stuck until the DLQ was purged. Here
/// order A's version is refused while the DLQ (capped at 1) is full; order
/// B, released in the same pass, goes on at once; A's refusal waits, set
/// aside with the reason, and reaches the DLQ (and holds A) once it has room.
#[tokio::test]
async fn a_full_dlq_holds_only_the_order_it_refuses() {
    let s = scene("holds_dlq_full", 1, 1, |s| s.dlq_max_length = 1).await;
    let conn = s.env.broker().await;
    // Fill the DLQ (3.10 takes one past the cap).
    let poison: Vec<Msg> = (0..3)
        .map(|i| {
            let mut m = Msg::event(&format!("poison-{i}"), 1);
            m.body = b"not json".to_vec();
            m
        })
        .collect();
    s.env.publisher().await.send_all(&poison).await;
    wait_for("a full DLQ", Duration::from_secs(20), || async {
        queue_len(&conn, "pesanan.dlq").await >= 1
    })
    .await;
    // A and B set aside; then A is refused and B may go.
    fail(&s.db, "A", "coba").await;
    fail(&s.db, "B", "coba").await;
    s.env
        .publisher()
        .await
        .send_all(&interleaved(&["A", "B"], 2))
        .await;
    wait_count(
        &s.db,
        "SELECT count(DISTINCT pesanan_id) FROM urutan_parkir WHERE percobaan >= 1",
        2,
        Duration::from_secs(20),
    )
    .await;
    sqlx::query("UPDATE gagal SET cara = 'tolak' WHERE pesanan_id = 'A'")
        .execute(&s.db)
        .await
        .expect("refuse A");
    sqlx::query("DELETE FROM gagal WHERE pesanan_id = 'B'")
        .execute(&s.db)
        .await
        .expect("mend B");
    tokio::time::timeout(Duration::from_secs(10), wait_stored(&s.db, "B", 2))
        .await
        .expect("B waited for the full DLQ");
    assert_eq!(calls(&s.db, "B").await, [1, 2]);
    // A is not lost: still set aside, the reason its last error.
    let (attempts, error): (i32, String) = sqlx::query_as(
        "SELECT percobaan, galat FROM urutan_parkir WHERE pesanan_id = 'A' AND versi = 1",
    )
    .fetch_one(&s.db)
    .await
    .expect("A's v1 set aside");
    assert!(attempts >= 1);
    assert!(error.contains("dead-letter queue is full"), "{error}");
    assert!(stored(&s.db, "A").await.is_none(), "A applied");
    let metrics = scrape(&s.pool).await;
    assert!(metric_sum(&metrics, "urutan_dead_letters_refused_total", &[]) >= 1.0);
    // Room in the DLQ: A's refusal is dead-lettered and holds A.
    wait_for(
        "A's refusal in the DLQ",
        Duration::from_secs(60),
        || async {
            drain_dlq(&conn).await;
            count(
                &s.db,
                "SELECT count(*) FROM urutan_dead_letter
                 WHERE message_id = 'A-v1' AND reason = 'handler_refused'",
            )
            .await
                == 1
        },
    )
    .await;
    assert_eq!(
        count(
            &s.db,
            "SELECT count(*) FROM urutan_tahan WHERE pesanan_id = 'A'"
        )
        .await,
        1
    );
    s.pool.stop().await;
}
