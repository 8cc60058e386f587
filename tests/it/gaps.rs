//! Gaps that wait (`GAP_POLICY=wait`, docs/contract.md section 11): a
//! version above stored + 1 waits until the versions between are applied,
//! so the handler sees every step in order; a version missing longer than
//! `GAP_TIMEOUT` holds its order (reason `gap`) until it comes, or until
//! `urutan hold release` applies what waits without it.

use std::time::Duration;

use sqlx::PgPool;
use urutan::config::{GapPolicy, Settings};
use urutan_testkit::fixtures::{
    Msg, RunningPool, TestEnv, count, http_get, metric_sum, stored, urutan, wait_count, wait_for,
    wait_stored,
};

/// A handler that records every call.
const HANDLER: &str = "
CREATE TABLE panggilan (n BIGSERIAL PRIMARY KEY, pesanan_id TEXT, versi BIGINT,
                        previous_versi BIGINT);
CREATE FUNCTION catat(event jsonb) RETURNS void LANGUAGE sql AS $$
    INSERT INTO panggilan (pesanan_id, versi, previous_versi)
    VALUES (event->>'id', (event->>'versi')::bigint, (event->>'previous_versi')::bigint)
$$;";

struct Scene {
    env: TestEnv,
    db: PgPool,
    pool: RunningPool,
}

async fn scene(test: &str, prefetch: u16, tune: impl FnOnce(&mut Settings)) -> Scene {
    let env = TestEnv::new(test).await;
    let db = env.db().await;
    sqlx::raw_sql(HANDLER).execute(&db).await.expect("handler");
    let mut settings = env.settings(2);
    settings.prefetch = prefetch;
    settings.handler_function = Some("catat".into());
    settings.gap_policy = GapPolicy::Wait;
    tune(&mut settings);
    let pool = RunningPool::ready(settings).await;
    Scene { env, db, pool }
}

/// The handler's calls for `order`: (versi, previous_versi), in order.
async fn calls(db: &PgPool, order: &str) -> Vec<(i64, Option<i64>)> {
    sqlx::query_as("SELECT versi, previous_versi FROM panggilan WHERE pesanan_id = $1 ORDER BY n")
        .bind(order)
        .fetch_all(db)
        .await
        .expect("calls")
}

async fn wait_parked(db: &PgPool, order: &str, n: i64) {
    wait_for(
        &format!("{n} version(s) of {order} parked"),
        Duration::from_secs(30),
        || async {
            let parked: i64 =
                sqlx::query_scalar("SELECT count(*) FROM urutan_parkir WHERE pesanan_id = $1")
                    .bind(order)
                    .fetch_one(db)
                    .await
                    .expect("parked");
            parked == n
        },
    )
    .await;
}

fn versions(order: &str, vs: &[i64]) -> Vec<Msg> {
    vs.iter().map(|v| Msg::event(order, *v)).collect()
}

/// The contract's scenario: versions 1, 2, 4, 5, 3 published in that order
/// reach the handler as 1, 2, 3, 4, 5, in strict and in batch mode; an
/// order without gaps is not slowed.
#[tokio::test]
async fn versions_wait_for_the_missing_ones_in_every_mode() {
    for prefetch in [1, 16] {
        let s = scene(&format!("gap_wait_p{prefetch}"), prefetch, |_| {}).await;
        let publisher = s.env.publisher().await;
        publisher.send_all(&versions("A", &[1, 2, 4, 5])).await;
        publisher.send_all(&versions("B", &[1, 2, 3])).await;
        wait_stored(&s.db, "B", 3).await;
        wait_parked(&s.db, "A", 2).await;
        assert_eq!(stored(&s.db, "A").await, Some(2), "v4 and v5 wait for v3");
        publisher.send_all(&versions("A", &[3])).await;
        wait_stored(&s.db, "A", 5).await;
        let seen: Vec<i64> = calls(&s.db, "A").await.iter().map(|c| c.0).collect();
        assert_eq!(
            seen,
            [1, 2, 3, 4, 5],
            "every step, in order (prefetch {prefetch})"
        );
        let previous: Vec<Option<i64>> = calls(&s.db, "A").await.iter().map(|c| c.1).collect();
        assert_eq!(previous, [None, Some(1), Some(2), Some(3), Some(4)]);
        assert_eq!(count(&s.db, "SELECT count(*) FROM urutan_tahan").await, 0);
        wait_parked(&s.db, "A", 0).await;
        s.pool.stop().await;
    }
}

/// A version that never comes holds its order after `GAP_TIMEOUT` (reason
/// `gap`, the missing version named); `urutan hold release` applies the
/// waiting versions without it, records the skip, and the missing version
/// arriving later is stale.
#[tokio::test]
async fn a_version_that_never_comes_holds_the_order_until_released() {
    let s = scene("gap_hold", 1, |s| s.gap_timeout = Duration::from_secs(2)).await;
    let publisher = s.env.publisher().await;
    publisher.send_all(&versions("H", &[1, 2, 4, 5])).await;
    wait_for("the gap hold", Duration::from_secs(30), || async {
        count(
            &s.db,
            "SELECT count(*) FROM urutan_tahan WHERE pesanan_id = 'H' AND alasan = 'gap' AND versi = 3",
        )
        .await
            == 1
    })
    .await;
    assert_eq!(stored(&s.db, "H").await, Some(2));
    let held = urutan(&s.env, &[], &["hold", "list", "--json"]).await;
    assert!(held.ok(), "{held}");
    let list: serde_json::Value = serde_json::from_str(&held.stdout).expect("json");
    assert_eq!(list[0]["order"], "H", "{held}");
    assert_eq!(list[0]["reason"], "gap");
    assert_eq!(list[0]["versi"], 3, "the missing version");
    assert_eq!(list[0]["waiting"], 2);
    let text = urutan(&s.env, &[], &["hold", "list"]).await;
    assert!(text.stdout.contains("missing v3"), "{text}");
    let explain = urutan(&s.env, &[], &["explain", "H"]).await;
    assert!(explain.stdout.contains("ON HOLD (gap)"), "{explain}");
    let status = urutan(&s.env, &[], &["status", "--json"]).await;
    assert!(status.stdout.contains("\"orders_held\""), "{status}");
    // (The metrics are the test process's, shared with the other tests.)
    let scrape = http_get(s.pool.http, "/metrics").await.1;
    assert!(metric_sum(&scrape, "urutan_holds_total", &["reason=\"gap\""]) >= 1.0);

    let released = urutan(&s.env, &[], &["hold", "release", "H"]).await;
    assert!(released.ok(), "{released}");
    assert!(released.stdout.contains("without v3"), "{released}");
    wait_stored(&s.db, "H", 5).await;
    let seen: Vec<i64> = calls(&s.db, "H").await.iter().map(|c| c.0).collect();
    assert_eq!(
        seen,
        [1, 2, 4, 5],
        "the waiting versions, in order, past the gap"
    );
    let explain = urutan(&s.env, &[], &["explain", "H"]).await;
    assert!(explain.stdout.contains("skipped"), "{explain}");
    publisher.send_all(&versions("H", &[3])).await;
    wait_count(
        &s.db,
        "SELECT count(*) FROM pesan_diproses WHERE message_id = 'H-v3'",
        1,
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(stored(&s.db, "H").await, Some(5), "v3 late: stale");
    assert_eq!(
        calls(&s.db, "H").await.len(),
        4,
        "never called for a stale version"
    );
    s.pool.stop().await;
}

/// The missing version arriving after its order was held goes through:
/// the hold ends and the versions that waited follow in order.
#[tokio::test]
async fn the_missing_version_arriving_late_ends_the_gap_hold() {
    let s = scene("gap_late", 1, |s| s.gap_timeout = Duration::from_secs(1)).await;
    let publisher = s.env.publisher().await;
    publisher.send_all(&versions("J", &[1, 3, 4])).await;
    wait_count(
        &s.db,
        "SELECT count(*) FROM urutan_tahan WHERE pesanan_id = 'J' AND alasan = 'gap'",
        1,
        Duration::from_secs(30),
    )
    .await;
    publisher.send_all(&versions("J", &[2])).await;
    wait_stored(&s.db, "J", 4).await;
    let seen: Vec<i64> = calls(&s.db, "J").await.iter().map(|c| c.0).collect();
    assert_eq!(seen, [1, 2, 3, 4]);
    assert_eq!(count(&s.db, "SELECT count(*) FROM urutan_tahan").await, 0);
    assert_eq!(
        count(&s.db, "SELECT count(*) FROM urutan_lewati").await,
        0,
        "nothing skipped"
    );
    s.pool.stop().await;
}

/// A version that arrives after its order was held for a gap waits for the
/// gap like the ones before it (issue 44: a gap hold has no message id, and
/// the SQL's comparison with it was NULL, so v5 was applied past the missing
/// v2). Strict and batch mode.
#[tokio::test]
async fn a_version_arriving_after_a_gap_hold_waits_for_the_gap() {
    for prefetch in [1, 16] {
        let s = scene(&format!("gap_after_hold_p{prefetch}"), prefetch, |s| {
            s.gap_timeout = Duration::from_secs(1);
        })
        .await;
        let publisher = s.env.publisher().await;
        publisher.send_all(&versions("K", &[1, 3, 4])).await;
        wait_count(
            &s.db,
            "SELECT count(*) FROM urutan_tahan WHERE pesanan_id = 'K' AND alasan = 'gap'",
            1,
            Duration::from_secs(30),
        )
        .await;
        // Held for v2: v5 arrives, and must wait with v3 and v4.
        publisher.send_all(&versions("K", &[5])).await;
        wait_parked(&s.db, "K", 3).await;
        assert_eq!(
            stored(&s.db, "K").await,
            Some(1),
            "prefetch {prefetch}: past the gap"
        );
        publisher.send_all(&versions("K", &[2])).await;
        wait_stored(&s.db, "K", 5).await;
        let seen: Vec<i64> = calls(&s.db, "K").await.iter().map(|c| c.0).collect();
        assert_eq!(seen, [1, 2, 3, 4, 5], "prefetch {prefetch}");
        assert_eq!(count(&s.db, "SELECT count(*) FROM urutan_tahan").await, 0);
        s.pool.stop().await;
    }
}

/// What a producer plants above gaps is bounded (issue 43): with
/// `GAP_WAITING_MAX=5` a shard keeps 5 waiting versions; the next one that
/// would wait is dead-lettered (`gap_limit`) with its claim withdrawn, so
/// once its gap is filled a replay applies it. Orders without a gap, and
/// the versions already waiting, are not touched. Strict and batch mode.
#[tokio::test]
async fn versions_waiting_for_gaps_are_capped_per_shard() {
    for prefetch in [1, 16] {
        let s = scene(&format!("gap_cap_{prefetch}"), prefetch, |s| {
            s.shard_count = 1;
            s.gap_waiting_max = 5;
        })
        .await;
        // Eight orders' v2 with no v1: five wait, three are refused.
        let planted: Vec<Msg> = (0..8).map(|i| Msg::event(&format!("G{i}"), 2)).collect();
        s.env.publisher().await.send_all(&planted).await;
        wait_count(
            &s.db,
            "SELECT count(*) FROM urutan_dead_letter WHERE reason = 'gap_limit'",
            3,
            Duration::from_secs(30),
        )
        .await;
        assert_eq!(count(&s.db, "SELECT count(*) FROM urutan_parkir").await, 5);
        // A message with no gap still goes through at once.
        s.env
            .publisher()
            .await
            .send_all(&[Msg::event("free", 1)])
            .await;
        wait_stored(&s.db, "free", 1).await;
        // The gaps filled: the waiting ones are released, a refused one is
        // applied by its replay (not a duplicate: its claim was withdrawn).
        let refused: Vec<String> = sqlx::query_scalar(
            "SELECT pesanan_id FROM urutan_dead_letter WHERE reason = 'gap_limit' ORDER BY 1",
        )
        .fetch_all(&s.db)
        .await
        .expect("refused orders");
        let firsts: Vec<Msg> = (0..8).map(|i| Msg::event(&format!("G{i}"), 1)).collect();
        s.env.publisher().await.send_all(&firsts).await;
        let waited: Vec<String> = (0..8)
            .map(|i| format!("G{i}"))
            .filter(|o| !refused.contains(o))
            .collect();
        for order in &waited {
            wait_stored(&s.db, order, 2).await;
        }
        let victim = &refused[0];
        wait_stored(&s.db, victim, 1).await;
        let replay = urutan(&s.env, &[], &["dlq", "replay", &format!("{victim}-v2")]).await;
        assert!(replay.ok(), "{replay}");
        wait_stored(&s.db, victim, 2).await;
        assert_eq!(calls(&s.db, victim).await, [(1, None), (2, Some(1))]);
        let scrape = http_get(s.pool.http, "/metrics").await.1;
        assert!(
            metric_sum(
                &scrape,
                "urutan_dead_letters_total",
                &["reason=\"gap_limit\""]
            ) >= 3.0
        );
        s.pool.stop().await;
    }
}

/// Tuples of `urutan_parkir` and its indexes read so far by this
/// connection (returned by scans, fetched through indexes), not yet flushed
/// to the statistics: within one transaction, the difference of two reads
/// is what the statements between them read.
async fn parked_rows_read(conn: &mut sqlx::PgConnection) -> i64 {
    sqlx::query_scalar(
        "SELECT sum(pg_stat_get_xact_tuples_returned(c.oid) + pg_stat_get_xact_tuples_fetched(c.oid))::bigint
         FROM pg_class c
         WHERE c.oid = 'urutan_parkir'::regclass
            OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'urutan_parkir'::regclass)",
    )
    .fetch_one(conn)
    .await
    .expect("statistics")
}

/// Versions a producer plants above gaps are released through an index,
/// not a scan (issue 43): with 400 of them waiting on the shard (v3 of 300
/// orders that have v1, and v3..v102 of one more), one release call, the
/// worker's own (`handoff::release_with` with GAP_POLICY=wait), reads a
/// handful of `urutan_parkir` tuples instead of every waiting row (the scan
/// read all 400 on every call, every 200 ms). And they still go when their
/// gap is filled: each v2 lets its order's waiting versions go, in order.
#[tokio::test]
async fn versions_waiting_for_gaps_are_released_through_an_index() {
    let s = scene("gap_index", 16, |s| s.shard_count = 1).await;
    let orders: Vec<String> = (0..300).map(|i| format!("P{i}")).collect();
    let mut planted: Vec<Msg> = orders.iter().map(|o| Msg::event(o, 1)).collect();
    planted.push(Msg::event("ONE", 1));
    planted.extend(orders.iter().map(|o| Msg::event(o, 3)));
    planted.extend((3..=102).map(|v| Msg::event("ONE", v)));
    s.env.publisher().await.send_all(&planted).await;
    wait_count(
        &s.db,
        "SELECT count(*) FROM urutan_parkir",
        400,
        Duration::from_secs(120),
    )
    .await;

    let mut tx = s.db.begin().await.expect("begin");
    sqlx::query("SET LOCAL urutan.gap = 'wait'")
        .execute(&mut *tx)
        .await
        .expect("gap policy");
    let before = parked_rows_read(&mut tx).await;
    let policy = urutan::store::hold::RetryPolicy {
        gap_timeout: Some(Duration::from_secs(600)),
        ..Default::default()
    };
    let released = urutan::reshard::handoff::release_with(&mut tx, 0, 200, &policy, None)
        .await
        .expect("release");
    let read = parked_rows_read(&mut tx).await - before;
    tx.rollback().await.expect("rollback");
    assert!(released.is_empty(), "nothing may go yet: {released:?}");
    assert!(
        read < 40,
        "one release call read {read} urutan_parkir tuples with 400 versions waiting for gaps: \
         a scan, not an index"
    );

    let fills: Vec<Msg> = orders
        .iter()
        .chain(std::iter::once(&"ONE".to_owned()))
        .map(|o| Msg::event(o, 2))
        .collect();
    s.env.publisher().await.send_all(&fills).await;
    wait_stored(&s.db, "ONE", 102).await;
    for order in &orders {
        wait_stored(&s.db, order, 3).await;
    }
    let one: Vec<i64> = calls(&s.db, "ONE").await.into_iter().map(|c| c.0).collect();
    assert_eq!(
        one,
        (1..=102).collect::<Vec<i64>>(),
        "ONE's versions in order"
    );
    assert_eq!(count(&s.db, "SELECT count(*) FROM urutan_parkir").await, 0);
    s.pool.stop().await;
}
