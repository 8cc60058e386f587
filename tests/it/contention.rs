//! A handler whose transactions wait on each other (docs/contract.md
//! sections 3 and 11): serialization failures and deadlocks are retried at
//! once, message by message, before anything is set aside with a backoff,
//! so a contended drain costs little more than one without shared rows
//! (issue 44; figures in `benches/results/contended-handler.md`).

use std::time::{Duration, Instant};

use sqlx::PgPool;
use urutan_testkit::fixtures::{Msg, TestEnv, UrutanProcess, count, urutan, wait_for};

/// Two handlers with the same work: `tim.berebut` updates two rows every
/// order shares, first one or the other as the event says (the shards'
/// transactions wait on each other and deadlock); `tim.sendiri` updates two
/// rows of the order's own. Both record each call.
const HANDLERS: &str = "
CREATE SCHEMA tim;
CREATE TABLE tim.bersama (id INT PRIMARY KEY, n BIGINT NOT NULL);
INSERT INTO tim.bersama VALUES (1, 0), (2, 0);
CREATE TABLE tim.sendiri (pesanan_id TEXT, k INT, n BIGINT NOT NULL, PRIMARY KEY (pesanan_id, k));
CREATE TABLE tim.panggilan (n BIGSERIAL PRIMARY KEY, message_id TEXT, pesanan_id TEXT, versi BIGINT);
CREATE FUNCTION tim.catat(event jsonb) RETURNS void LANGUAGE sql AS $$
    INSERT INTO tim.panggilan (message_id, pesanan_id, versi)
    VALUES (event->>'message_id', event->>'id', (event->>'versi')::bigint)
$$;
CREATE FUNCTION tim.berebut(event jsonb) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_dulu INT := 1 + (hashtext(event->>'message_id') & 1);
BEGIN
    UPDATE tim.bersama SET n = n + 1 WHERE id = v_dulu;
    PERFORM pg_sleep(0.002);
    UPDATE tim.bersama SET n = n + 1 WHERE id = 3 - v_dulu;
    PERFORM tim.catat(event);
END
$$;
CREATE FUNCTION tim.sendiri(event jsonb) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tim.sendiri VALUES (event->>'id', 1, 1) ON CONFLICT (pesanan_id, k)
    DO UPDATE SET n = tim.sendiri.n + 1;
    PERFORM pg_sleep(0.002);
    INSERT INTO tim.sendiri VALUES (event->>'id', 2, 1) ON CONFLICT (pesanan_id, k)
    DO UPDATE SET n = tim.sendiri.n + 1;
    PERFORM tim.catat(event);
END
$$;";

const ORDERS: usize = 300;
const VERSIONS: i64 = 3;

/// `ORDERS` × `VERSIONS` versions of orders `<prefix>-<i>`, version by
/// version across the orders; every other order's v2 before its v1 (v2
/// waits for it: `GAP_POLICY=wait`).
fn stream(prefix: &str) -> Vec<Msg> {
    let mut msgs = Vec::new();
    for v in 1..=VERSIONS {
        for i in 0..ORDERS {
            let order = format!("{prefix}-{i}");
            let versi = match (i % 2, v) {
                (1, 1) => 2,
                (1, 2) => 1,
                _ => v,
            };
            msgs.push(Msg::event(&order, versi));
        }
    }
    msgs
}

async fn applied(db: &PgPool, prefix: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM pesanan_riwayat WHERE pesanan_id LIKE $1 || '-%'")
        .bind(prefix)
        .fetch_one(db)
        .await
        .expect("history")
}

/// One drain: the stream queued, a pool with `handler` killed -9 once a
/// part is applied, a second pool started. Returns the versions left at the
/// restart and the time from its readiness to the last one applied.
async fn drain(env: &TestEnv, db: &PgPool, prefix: &str, handler: &str) -> (i64, Duration) {
    env.publisher().await.send_all(&stream(prefix)).await;
    let mut vars = env.process_env(2);
    vars.push(("PREFETCH", "8".to_owned()));
    vars.push(("GAP_POLICY", "wait".to_owned()));
    vars.push(("HANDLER_FUNCTION", handler.to_owned()));
    let mut first = UrutanProcess::start("run", &vars);
    wait_for("a part applied", Duration::from_secs(60), || async {
        applied(db, prefix).await >= 50
    })
    .await;
    first.kill().await;
    let total = ORDERS as i64 * VERSIONS;
    let left = total - applied(db, prefix).await;
    let mut second = UrutanProcess::start("run", &vars);
    second.wait_ready().await;
    let started = Instant::now();
    wait_for(
        &format!("{prefix}: every version applied"),
        Duration::from_secs(180),
        || async { applied(db, prefix).await == total },
    )
    .await;
    let took = started.elapsed();
    second.sigterm();
    second.wait_exit(Duration::from_secs(30)).await;
    (left, took)
}

/// Per order, the history and the handler's calls are each version once,
/// in version order.
async fn assert_in_order_once(db: &PgPool, prefix: &str) {
    let total = ORDERS as i64 * VERSIONS;
    for (what, sql) in [
        (
            "history",
            "SELECT count(*) FROM (SELECT pesanan_id, versi,
                    lag(versi) OVER (PARTITION BY pesanan_id ORDER BY seq) AS sebelum
                 FROM pesanan_riwayat WHERE pesanan_id LIKE $1 || '-%') h
             WHERE versi = coalesce(sebelum, 0) + 1",
        ),
        (
            "handler calls",
            "SELECT count(*) FROM (SELECT pesanan_id, versi,
                    lag(versi) OVER (PARTITION BY pesanan_id ORDER BY n) AS sebelum
                 FROM tim.panggilan WHERE pesanan_id LIKE $1 || '-%') h
             WHERE versi = coalesce(sebelum, 0) + 1",
        ),
    ] {
        let in_order: i64 = sqlx::query_scalar(sql)
            .bind(prefix)
            .fetch_one(db)
            .await
            .expect(what);
        assert_eq!(
            in_order, total,
            "{prefix}: {what}, each version once in order"
        );
    }
    let calls: i64 =
        sqlx::query_scalar("SELECT count(*) FROM tim.panggilan WHERE pesanan_id LIKE $1 || '-%'")
            .bind(prefix)
            .fetch_one(db)
            .await
            .expect("calls");
    assert_eq!(calls, total, "{prefix}: one handler call per version");
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// 2 shards, PREFETCH=8, GAP_POLICY=wait, 900 versions drained after a
/// kill -9 and a restart, alternating a handler that updates two shared
/// rows (in an order that depends on the event) with one that touches no
/// shared row: per version, the contended drain takes at most 3× the
/// other (medians of 3 rounds each); every version applied once and in
/// order, the handler called once per version. A ratio of timings: it
/// runs alone (`serial_`), not beside the parallel suite, which would skew
/// the rounds it measures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serial_a_contended_handler_drains_within_three_times_an_uncontended_one() {
    let env = TestEnv::new("contended").await;
    let db = env.db().await;
    sqlx::raw_sql(HANDLERS)
        .execute(&db)
        .await
        .expect("handlers");
    let topology = urutan(&env, &[], &["topology", "--shard-count", "2"]).await;
    assert!(topology.ok(), "{topology}");
    let (mut contended, mut alone) = (Vec::new(), Vec::new());
    for round in 0..3 {
        for (handler, times) in [("tim.berebut", &mut contended), ("tim.sendiri", &mut alone)] {
            let prefix = format!("r{round}{}", &handler[4..6]);
            let (left, took) = drain(&env, &db, &prefix, handler).await;
            assert_in_order_once(&db, &prefix).await;
            let per_version = took.as_secs_f64() * 1000.0 / left.max(1) as f64;
            eprintln!(
                "contention: round {round} {handler}: {left} versions left at the restart, \
                 drained in {:.2} s ({per_version:.2} ms per version)",
                took.as_secs_f64()
            );
            times.push(per_version);
        }
    }
    let shared: i64 = count(&db, "SELECT sum(n)::bigint FROM tim.bersama").await;
    assert_eq!(
        shared,
        2 * 3 * ORDERS as i64 * VERSIONS,
        "each contended call updated both shared rows once"
    );
    let (contended, alone) = (median(contended), median(alone));
    let ratio = contended / alone;
    eprintln!(
        "contention: median {contended:.2} ms per version contended, {alone:.2} alone: {ratio:.2}x"
    );
    assert!(
        ratio <= 3.0,
        "a contended drain took {ratio:.2}x an uncontended one ({contended:.2} against {alone:.2} ms per version)"
    );
}
