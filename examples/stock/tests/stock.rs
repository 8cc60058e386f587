//! The stock team's binary against the real RabbitMQ and PostgreSQL:
//! reservations and charges exactly once through a kill -9, duplicates and
//! out-of-order versions; out of stock holds the order until it is
//! restocked and replayed; an unknown SKU is released without its version.
//! Every operator command used is the team's own binary's.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use urutan::config::GapPolicy;
use urutan_testkit::fixtures::{
    Msg, Ran, RunningPool, TestEnv, UrutanProcess, count, run_binary, wait_count, wait_for,
};

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_urutan-stock"))
}

async fn stock_cli(env: &TestEnv, args: &[&str]) -> Ran {
    run_binary(binary(), env, &[], args).await
}

/// The team's tables, and `skus` in stock.
async fn shop(env: &TestEnv, skus: &[(&str, i64)]) -> PgPool {
    let db = env.db().await;
    sqlx::raw_sql(urutan_stock::SCHEMA)
        .execute(&db)
        .await
        .expect("the team's tables");
    for (sku, n) in skus {
        sqlx::query("INSERT INTO stok VALUES ($1, $2)")
            .bind(sku)
            .bind(n)
            .execute(&db)
            .await
            .expect("stock");
    }
    db
}

/// Version `versi` of `order` in `status`, with `data`.
fn event(order: &str, versi: i64, status: &str, data: serde_json::Value) -> Msg {
    let mut msg = Msg::event_with(order, versi, &format!("{order}-v{versi}"), status);
    let body = serde_json::json!({"id": order, "status": status, "versi": versi, "data": data});
    msg.body = body.to_string().into_bytes();
    msg
}

/// An order's life: created (1 A, 2 B), paid (100), and every 4th cancelled.
fn life(i: usize) -> Vec<Msg> {
    let order = format!("S-{i}");
    let data = serde_json::json!({"items": [{"sku": "A", "qty": 1}, {"sku": "B", "qty": 2}],
                                  "total": 100});
    let mut msgs = vec![
        event(&order, 1, "dibuat", data.clone()),
        event(&order, 2, "dibayar", data.clone()),
    ];
    if i.is_multiple_of(4) {
        msgs.push(event(&order, 3, "dibatalkan", data));
    }
    msgs
}

async fn scalar(db: &PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(db).await.expect(sql)
}

/// 200 orders' lives as published: every other order's v2 before its v1
/// (v2 waits for it), every 5th order's first message twice. Returns them
/// and how many versions they hold.
fn lives() -> (Vec<Msg>, i64) {
    const ORDERS: usize = 200;
    let mut msgs = Vec::new();
    for i in 0..ORDERS {
        let mut life = life(i);
        if !i.is_multiple_of(2) {
            life.swap(0, 1);
        }
        if i.is_multiple_of(5) {
            life.push(life[0].clone());
        }
        msgs.extend(life);
    }
    let versions = (0..ORDERS).map(|i| life(i).len() as i64).sum::<i64>();
    (msgs, versions)
}

/// Waits (at most 120 s) until `versions` versions are applied; else fails
/// with what still waits (parked and set-aside rows, holds, each shard's
/// position) and the tail of `pool`'s log.
async fn every_version_applied(db: &PgPool, versions: i64, pool: &UrutanProcess) {
    let limit = Duration::from_secs(120);
    let started = std::time::Instant::now();
    while scalar(db, "SELECT count(*) FROM pesanan_riwayat").await < versions {
        if started.elapsed() > limit {
            let waiting: Vec<String> = sqlx::query_scalar(
                "SELECT format('parked %s v%s on shard %s (stored v%s, attempts %s, due %s)',
                               u.message_id, u.versi, u.shard, p.versi, u.percobaan, u.jatuh_tempo)
                 FROM urutan_parkir u LEFT JOIN pesanan p ON p.id = u.pesanan_id
                 UNION ALL SELECT format('held %s (%s)', pesanan_id, alasan) FROM urutan_tahan
                 UNION ALL SELECT format('shard %s at epoch %s', shard, epoch) FROM urutan_shard",
            )
            .fetch_all(db)
            .await
            .unwrap_or_default();
            panic!(
                "not every version applied within {limit:?}; waiting:\n{}\nlog tail:\n{}",
                waiting.join("\n"),
                pool.process.tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// 200 orders' lives, published with duplicates and each order's versions
/// reversed in pairs (so versions wait for the ones before them), through
/// a kill -9 of the pool mid-stream: stock reserved, charged and given back
/// exactly once per applied version; `verify` of the team's binary passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stock_is_reserved_and_charged_once_through_a_kill_9() {
    const ORDERS: usize = 200;
    let env = TestEnv::new("stock_kill9").await;
    let db = shop(&env, &[("A", 1_000_000), ("B", 1_000_000)]).await;
    let mut vars = env.process_env(2);
    vars.push(("GAP_POLICY", "wait".to_owned()));
    vars.push(("PREFETCH", "8".to_owned()));
    let mut pool = UrutanProcess::start_binary(binary(), "run", &vars);
    pool.wait_ready().await;

    let (msgs, versions) = lives();
    let publisher = env.publisher().await;
    let (first, rest) = msgs.split_at(msgs.len() / 2);
    publisher.send_all(first).await;
    wait_for("a quarter applied", Duration::from_secs(60), || async {
        scalar(&db, "SELECT count(*) FROM pesanan_riwayat").await >= versions / 4
    })
    .await;
    pool.kill().await;
    publisher.send_all(rest).await;
    let mut pool = UrutanProcess::start_binary(binary(), "run", &vars);
    pool.wait_ready().await;
    every_version_applied(&db, versions, &pool).await;

    let cancelled = (0..ORDERS).filter(|i| i.is_multiple_of(4)).count() as i64;
    let kept = ORDERS as i64 - cancelled;
    assert_eq!(
        scalar(&db, "SELECT tersedia FROM stok WHERE sku = 'A'").await,
        1_000_000 - kept
    );
    assert_eq!(
        scalar(&db, "SELECT tersedia FROM stok WHERE sku = 'B'").await,
        1_000_000 - 2 * kept
    );
    assert_eq!(
        scalar(&db, "SELECT count(*) FROM reservasi").await,
        2 * kept
    );
    assert_eq!(
        scalar(&db, "SELECT count(*) FROM tagihan WHERE jumlah > 0").await,
        ORDERS as i64,
        "one charge per paid order"
    );
    assert_eq!(
        scalar(&db, "SELECT count(*) FROM tagihan WHERE jumlah < 0").await,
        cancelled,
        "one refund per cancelled order"
    );
    assert_eq!(
        scalar(&db, "SELECT sum(jumlah)::bigint FROM tagihan").await,
        100 * kept
    );
    pool.sigterm();
    pool.wait_exit(Duration::from_secs(30)).await;
    let verify = stock_cli(&env, &["verify"]).await;
    assert!(verify.ok(), "{verify}");
}

/// The same lives published in four parts, a pool started for each and
/// killed -9 a varied 50-650 ms later (mid-batch, mid-release, between a
/// commit and its ack), then a last pool: every version is applied, in
/// order, and `verify` passes. (Issue 44: one such run stranded a shard
/// whose worker task had died.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_version_is_applied_through_kill_9s_again_and_again() {
    let env = TestEnv::new("stock_kills").await;
    let db = shop(&env, &[("A", 1_000_000), ("B", 1_000_000)]).await;
    let mut vars = env.process_env(2);
    vars.push(("GAP_POLICY", "wait".to_owned()));
    vars.push(("PREFETCH", "8".to_owned()));
    let (msgs, versions) = lives();
    let publisher = env.publisher().await;
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    eprintln!("kill delays from seed {seed}");
    for part in msgs.chunks(msgs.len().div_ceil(4)) {
        let mut pool = UrutanProcess::start_binary(binary(), "run", &vars);
        pool.wait_ready().await;
        publisher.send_all(part).await;
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        tokio::time::sleep(Duration::from_millis(50 + (seed >> 33) % 600)).await;
        pool.kill().await;
    }
    let mut pool = UrutanProcess::start_binary(binary(), "run", &vars);
    pool.wait_ready().await;
    every_version_applied(&db, versions, &pool).await;
    let out_of_order = scalar(
        &db,
        "SELECT count(*) FROM (SELECT versi, lag(versi) OVER (PARTITION BY pesanan_id ORDER BY seq)
                                 AS sebelum FROM pesanan_riwayat) h
         WHERE versi <> coalesce(sebelum, 0) + 1",
    )
    .await;
    assert_eq!(
        out_of_order, 0,
        "every order's versions applied 1, 2, 3 in order"
    );
    assert_eq!(
        scalar(&db, "SELECT count(*) FROM tagihan WHERE jumlah > 0").await,
        200,
        "one charge per paid order"
    );
    pool.sigterm();
    pool.wait_exit(Duration::from_secs(30)).await;
    let verify = stock_cli(&env, &["verify"]).await;
    assert!(verify.ok(), "{verify}");
}

/// Out of stock: the order's creation is refused (dead-lettered as
/// `handler_refused`) and the order held with its payment waiting; after a
/// restock, the team's binary replays it: reserved, then charged. An
/// unknown SKU: the order is released without its creation (recorded as
/// skipped), its payment goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_stock_holds_the_order_until_restocked_and_replayed() {
    let env = TestEnv::new("stock_hold").await;
    let db = shop(&env, &[("X", 1)]).await;
    let mut settings = env.settings(1);
    settings.gap_policy = GapPolicy::Wait;
    let pool =
        RunningPool::ready_with_handler(settings, Arc::new(urutan_stock::StockReservation)).await;
    let one_x = serde_json::json!({"items": [{"sku": "X", "qty": 1}], "total": 40});
    let unknown = serde_json::json!({"items": [{"sku": "NOPE", "qty": 1}], "total": 10});
    let msgs = vec![
        event("O1", 1, "dibuat", one_x.clone()),
        event("O2", 1, "dibuat", one_x.clone()),
        event("O2", 2, "dibayar", one_x.clone()),
        event("O3", 1, "dibuat", unknown.clone()),
        event("O3", 2, "dibayar", unknown),
    ];
    env.publisher().await.send_all(&msgs).await;
    wait_count(
        &db,
        "SELECT count(*) FROM urutan_dead_letter WHERE reason = 'handler_refused'",
        2,
        Duration::from_secs(30),
    )
    .await;
    wait_count(
        &db,
        "SELECT count(*) FROM urutan_parkir",
        2,
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(
        count(&db, "SELECT tersedia FROM stok WHERE sku = 'X'").await,
        0
    );
    let error: String =
        sqlx::query_scalar("SELECT last_error FROM urutan_dead_letter WHERE message_id = 'O2-v1'")
            .fetch_one(&db)
            .await
            .expect("O2's record");
    assert!(error.contains("out of stock"), "{error}");
    let held = stock_cli(&env, &["hold", "list", "--json"]).await;
    assert!(held.ok(), "{held}");
    let list: serde_json::Value = serde_json::from_str(&held.stdout).expect("json");
    let orders: Vec<&str> = list
        .as_array()
        .expect("holds")
        .iter()
        .filter_map(|h| h["order"].as_str())
        .collect();
    assert_eq!(orders.len(), 2, "{held}");
    assert!(orders.contains(&"O2") && orders.contains(&"O3"), "{held}");

    sqlx::query("UPDATE stok SET tersedia = 5 WHERE sku = 'X'")
        .execute(&db)
        .await
        .expect("restock");
    let replay = stock_cli(&env, &["dlq", "replay", "O2-v1"]).await;
    assert!(replay.ok(), "{replay}");
    let released = stock_cli(&env, &["hold", "release", "O3"]).await;
    assert!(released.ok(), "{released}");
    wait_count(
        &db,
        "SELECT count(*) FROM pesanan WHERE versi = 2",
        2,
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(
        count(&db, "SELECT tersedia FROM stok WHERE sku = 'X'").await,
        4
    );
    assert_eq!(
        count(&db, "SELECT count(*) FROM tagihan WHERE pesanan_id = 'O2'").await,
        1
    );
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM reservasi WHERE pesanan_id = 'O3'"
        )
        .await,
        0,
        "released without its creation"
    );
    let explain = stock_cli(&env, &["explain", "O3"]).await;
    assert!(explain.stdout.contains("skipped"), "{explain}");
    pool.stop().await;
}
