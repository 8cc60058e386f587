//! Ordered batch mode (PREFETCH > 1): the same outcomes as one by one.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use sqlx::PgPool;
use urutan::message::Event;
use urutan::shard::{Hooks, Observed};
use urutan::store::{self, Applied, BatchItem, BatchResult};

use crate::common::*;

/// A stream with several versions per entity, out-of-order and repeated
/// versions, duplicate message ids, and (with `reuse`) message ids used
/// again for other orders: another message each (dedup is per (order,
/// message id)), so the outcomes do not depend on which order comes first.
fn stream(seed: u64, entities: usize, len: usize, reuse: bool) -> Vec<Msg> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    let mut next = move |n: u64| {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) % n
    };
    let mut out: Vec<Msg> = Vec::with_capacity(len);
    for i in 0..len {
        if i > 0 && next(10) == 0 {
            let dup = out[next(i as u64) as usize].clone();
            out.push(dup); // same message id again
            continue;
        }
        if reuse && i > 0 && next(25) == 0 {
            // An earlier message id used again for some order: a duplicate
            // for the same order, another message for another order.
            let reused = out[next(i as u64) as usize].message_id.clone();
            let entity = format!("E-{}", next(entities as u64));
            let versi = 1 + next(8) as i64;
            let id = reused.unwrap_or_default();
            out.push(Msg::event_with(&entity, versi, &id, "reused"));
            continue;
        }
        let entity = format!("E-{}", next(entities as u64));
        let versi = 1 + next(8) as i64;
        out.push(Msg::event_with(
            &entity,
            versi,
            &format!("m-{i}"),
            &format!("s{versi}"),
        ));
    }
    out
}

type Counts = Arc<Mutex<BTreeMap<&'static str, usize>>>;

fn counting_hooks() -> (Hooks, Counts) {
    let counts: Counts = Arc::default();
    let seen = counts.clone();
    let hooks = Hooks {
        on_outcome: Some(Arc::new(move |o: &Observed<'_>| {
            *seen
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(o.outcome.label())
                .or_default() += 1;
        })),
        ..Hooks::default()
    };
    (hooks, counts)
}

/// Per entity: the stored state and the history in apply order.
async fn state(db: &PgPool) -> State {
    let rows = sqlx::query_as("SELECT id, status, versi FROM pesanan ORDER BY id")
        .fetch_all(db)
        .await
        .expect("pesanan");
    let history = sqlx::query_as(
        "SELECT pesanan_id, versi, status, message_id FROM pesanan_riwayat ORDER BY pesanan_id, seq",
    )
    .fetch_all(db)
    .await
    .expect("history");
    (rows, history)
}

/// Stored state and history, per entity.
type State = (
    Vec<(String, String, i64)>,
    Vec<(String, i64, String, String)>,
);

async fn run_stream(
    shards: u16,
    prefetch: u16,
    msgs: &[Msg],
) -> (BTreeMap<&'static str, usize>, State) {
    run_stream_with(shards, prefetch, None, msgs).await
}

/// [`run_stream`] with a `BATCH_MAX` (`None`: as large as `PREFETCH`).
async fn run_stream_with(
    shards: u16,
    prefetch: u16,
    batch_max: Option<u16>,
    msgs: &[Msg],
) -> (BTreeMap<&'static str, usize>, State) {
    let (counts, state, _) = run_stream_handled(shards, prefetch, batch_max, false, msgs).await;
    (counts, state)
}

/// The calls of the test handler `panggil` per entity, in its apply
/// order: (message id, versi, previous_versi).
type Calls = BTreeMap<String, Vec<(String, i64, Option<i64>)>>;

/// A `HANDLER_FUNCTION` recording every call in `panggilan`.
const RECORDING_HANDLER: &str = "
CREATE TABLE panggilan (n BIGSERIAL PRIMARY KEY, message_id TEXT, pesanan_id TEXT,
                        versi BIGINT, previous_versi BIGINT, status TEXT);
CREATE FUNCTION panggil(event jsonb) RETURNS void LANGUAGE sql AS $$
    INSERT INTO panggilan (message_id, pesanan_id, versi, previous_versi, status)
    SELECT event->>'message_id', event->>'id', (event->>'versi')::bigint,
           (event->>'previous_versi')::bigint, event->>'status'
    -- the state this version wrote is what the handler sees
    FROM pesanan p WHERE p.id = event->>'id' AND p.versi = (event->>'versi')::bigint
$$;";

/// [`run_stream_with`], with the recording handler when `handled`; also
/// returns its calls.
async fn run_stream_handled(
    shards: u16,
    prefetch: u16,
    batch_max: Option<u16>,
    handled: bool,
    msgs: &[Msg],
) -> (BTreeMap<&'static str, usize>, State, Calls) {
    let env = TestEnv::new(&format!("diff_p{prefetch}")).await;
    let mut settings = env.settings(shards);
    settings.prefetch = prefetch;
    settings.batch_max = batch_max;
    if handled {
        let db = env.db().await;
        sqlx::raw_sql(RECORDING_HANDLER)
            .execute(&db)
            .await
            .expect("handler");
        settings.handler_function = Some("panggil".to_owned());
    }
    let (hooks, counts) = counting_hooks();
    // Queue everything first, so batches really form.
    let conn = urutan::broker::connect(&settings.amqp_url, "t")
        .await
        .expect("connect");
    urutan::broker::topology::declare(
        &conn,
        &urutan::broker::Names::new("pesanan"),
        shards,
        5,
        false,
    )
    .await
    .expect("declare");
    env.publisher().await.send_all(msgs).await;
    let pool = RunningPool::start_with(settings, hooks).await;
    let total = msgs.len();
    let seen = counts.clone();
    wait_for("every delivery settled", Duration::from_secs(120), || {
        let seen = seen.clone();
        async move { seen.lock().map(|c| c.values().sum::<usize>()).unwrap_or(0) >= total }
    })
    .await;
    pool.stop().await;
    let db = env.db().await;
    let state = state(&db).await;
    let counts = counts.lock().map(|c| c.clone()).unwrap_or_default();
    let mut calls = Calls::new();
    if handled {
        let rows: Vec<(String, String, i64, Option<i64>)> = sqlx::query_as(
            "SELECT pesanan_id, message_id, versi, previous_versi FROM panggilan ORDER BY n",
        )
        .fetch_all(&db)
        .await
        .expect("calls");
        for (order, message_id, versi, previous) in rows {
            calls
                .entry(order)
                .or_default()
                .push((message_id, versi, previous));
        }
    }
    (counts, state, calls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_mode_gives_the_same_outcomes_state_and_history_as_strict_mode() {
    let msgs = stream(7, 40, 1500, true);
    let (strict_counts, strict_state) = run_stream(4, 1, &msgs).await;
    let (batch_counts, batch_state) = run_stream(4, 64, &msgs).await;
    assert_eq!(strict_counts, batch_counts, "outcome counts");
    assert!(strict_counts.get("duplicate").copied().unwrap_or(0) > 0);
    assert!(strict_counts.get("stale").copied().unwrap_or(0) > 0);
    assert_eq!(strict_state, batch_state, "pesanan and pesanan_riwayat");
}

/// Pipelined strict mode (`PREFETCH=2`, `BATCH_MAX=1`: the next delivery is
/// on hand while one message is applied) against `PREFETCH=1`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_strict_mode_gives_the_same_outcomes_state_and_history_as_strict_mode() {
    let msgs = stream(11, 40, 1500, false);
    let (strict_counts, strict_state) = run_stream(4, 1, &msgs).await;
    let (piped_counts, piped_state) = run_stream_with(4, 2, Some(1), &msgs).await;
    assert_eq!(strict_counts, piped_counts, "outcome counts");
    assert!(strict_counts.get("duplicate").copied().unwrap_or(0) > 0);
    assert!(strict_counts.get("stale").copied().unwrap_or(0) > 0);
    assert_eq!(strict_state, piped_state, "pesanan and pesanan_riwayat");
}

/// With a `HANDLER_FUNCTION`: strict, pipelined strict and batch mode give
/// the same outcomes, state and history, and the same handler calls (one
/// per applied version, in each order's apply order, each seeing the state
/// its version wrote).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_handler_every_mode_makes_the_same_calls() {
    let msgs = stream(13, 30, 1000, false);
    let strict = run_stream_handled(4, 1, None, true, &msgs).await;
    let piped = run_stream_handled(4, 2, Some(1), true, &msgs).await;
    let batch = run_stream_handled(4, 64, None, true, &msgs).await;
    let applied = strict.1.1.len();
    let calls: usize = strict.2.values().map(Vec::len).sum();
    assert_eq!(calls, applied, "one call per applied version");
    for (mode, other) in [("pipelined strict", &piped), ("batch", &batch)] {
        assert_eq!(strict.0, other.0, "{mode}: outcome counts");
        assert_eq!(strict.1, other.1, "{mode}: pesanan and pesanan_riwayat");
        assert_eq!(strict.2, other.2, "{mode}: the handler's calls");
    }
}

fn event(m: &Msg) -> Event {
    let body: serde_json::Value = serde_json::from_slice(&m.body).expect("json");
    Event {
        message_id: m.message_id.clone().expect("id"),
        entity_id: body["id"].as_str().expect("id").to_owned(),
        status: body["status"].as_str().expect("status").to_owned(),
        versi: body["versi"].as_i64().expect("versi"),
        ..Default::default()
    }
}

async fn reset(db: &PgPool) {
    sqlx::query("TRUNCATE pesanan, pesan_diproses, pesanan_riwayat, urutan_parkir")
        .execute(db)
        .await
        .expect("truncate");
}

#[test]
fn any_chunking_of_a_stream_matches_one_by_one() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let env = rt.block_on(TestEnv::new("batchprop"));
    let db = rt.block_on(env.db());
    let config = ProptestConfig {
        cases: 24,
        ..ProptestConfig::default()
    };
    proptest!(config, |(seed in any::<u64>(), len in 1usize..120, chunk in 1usize..40)| {
        let msgs = stream(seed, 6, len, true);
        let events: Vec<Event> = msgs.iter().map(event).collect();
        let (one, one_state, batched, batched_state) = rt.block_on(async {
            reset(&db).await;
            let mut one = Vec::new();
            for e in &events {
                one.push(store::apply(&db, e, 0).await.expect("apply"));
            }
            let one_state = state(&db).await;
            reset(&db).await;
            let mut batched = Vec::new();
            let mut conn = db.acquire().await.expect("conn");
            for part in events.chunks(chunk) {
                let items: Vec<BatchItem<'_>> = part.iter().map(BatchItem::Event).collect();
                for r in store::apply_batch(&mut conn, &items, 0).await.expect("batch") {
                    batched.push(match r {
                        BatchResult::Event(applied) => applied,
                        BatchResult::Marker => Applied::Parked,
                    });
                }
            }
            (one, one_state, batched, state(&db).await)
        });
        prop_assert_eq!(one, batched);
        prop_assert_eq!(one_state, batched_state);
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_batch_a_violation_and_a_poison_are_dead_lettered_alone() {
    let env = TestEnv::new("batchbad").await;
    let mut settings = env.settings(1);
    settings.prefetch = 32;
    settings.delivery_limit = 2;
    // Dead letters in a batch, past a refused version (holds: tests/it/holds.rs).
    settings.on_refused = urutan::config::OnRefused::Skip;
    let poison_calls = Arc::new(AtomicUsize::new(0));
    let calls = poison_calls.clone();
    let (mut hooks, counts) = counting_hooks();
    hooks.before_apply = Some(Arc::new(move |e: &Event| {
        if e.status == "racun" {
            calls.fetch_add(1, Ordering::Relaxed);
            std::panic::resume_unwind(Box::new("poison"));
        }
    }));
    let conn = urutan::broker::connect(&settings.amqp_url, "t")
        .await
        .expect("connect");
    urutan::broker::topology::declare(&conn, &urutan::broker::Names::new("pesanan"), 1, 2, false)
        .await
        .expect("declare");
    let mut msgs = Vec::new();
    for v in 1..=20 {
        msgs.push(Msg::event("A", v));
        if v == 5 {
            let mut bad = Msg::event_with("A", 99, "bad", "x");
            bad.header = None;
            msgs.push(bad);
        }
        if v == 12 {
            msgs.push(Msg::event_with("A", 100, "poison", "racun"));
        }
    }
    env.publisher().await.send_all(&msgs).await;
    let pool = RunningPool::start_with(settings, hooks).await;
    let db = env.db().await;
    wait_for("A at v20", Duration::from_secs(60), || {
        let db = db.clone();
        async move { count(&db, "SELECT count(*) FROM pesanan_riwayat").await == 20 }
    })
    .await;
    let dead = drain_dlq_expecting(&conn, 2, Duration::from_secs(30)).await;
    let mut ids: Vec<_> = dead
        .iter()
        .filter_map(|d| {
            d.delivery
                .properties
                .message_id()
                .as_ref()
                .map(|i| i.to_string())
        })
        .collect();
    ids.sort();
    assert_eq!(ids, ["bad", "poison"], "only the two culprits");
    assert_gapless_in_order(&history(&db).await, 1, 20);
    assert_eq!(
        poison_calls.load(Ordering::Relaxed),
        3,
        "delivery limit 2: 3 attempts"
    );
    let c = counts.lock().map(|c| c.clone()).unwrap_or_default();
    assert_eq!(c.get("dead_lettered"), Some(&2));
    assert_eq!(c.get("applied"), Some(&20));
    pool.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_batch_split_into_several_statements_matches_one_by_one() {
    let env = TestEnv::new("batchsplit").await;
    let db = env.db().await;
    // Over the largest batch statement (`store::apply`'s 512 KiB).
    let filler = "x".repeat(4_000);
    let events: Vec<Event> = stream(11, 8, 150, false)
        .iter()
        .map(|m| {
            let mut e = event(m);
            let data = serde_json::json!({ "isi": filler });
            e.data = Some(serde_json::value::to_raw_value(&data).expect("raw"));
            e
        })
        .collect();
    let mut one = Vec::new();
    for e in &events {
        one.push(store::apply(&db, e, 0).await.expect("apply"));
    }
    let one_state = state(&db).await;
    reset(&db).await;
    // ~600 KB of parameters: sent as several statements in one transaction.
    let items: Vec<BatchItem<'_>> = events.iter().map(BatchItem::Event).collect();
    let mut conn = db.acquire().await.expect("conn");
    let batched: Vec<Applied> = store::apply_batch(&mut conn, &items, 0)
        .await
        .expect("batch")
        .into_iter()
        .map(|r| match r {
            BatchResult::Event(applied) => applied,
            BatchResult::Marker => Applied::Parked,
        })
        .collect();
    assert_eq!(one, batched);
    assert_eq!(one_state, state(&db).await);
}

/// Gives `db` a lock budget of `budget` per-entity (advisory) locks per
/// transaction: `urutan_terapkan_batch` raises what PostgreSQL raises when
/// its shared lock table is full (SQLSTATE 53200, "out of shared memory")
/// once its transaction holds more. The real table is server-wide (64 ×
/// max_connections by default, set at server start), so filling it would
/// fail every other session on the server; this reaches the same error
/// from the same statement in this test's database only. Each overflow
/// bumps the sequence `lock_overflows` (sequences ignore the rollback).
async fn limit_locks_per_transaction(db: &PgPool, budget: i64) {
    let statements = [
        "CREATE SEQUENCE lock_overflows".to_owned(),
        "ALTER FUNCTION urutan_terapkan_batch(JSONB, INT) RENAME TO urutan_terapkan_batch_asli"
            .to_owned(),
        format!(
            "CREATE FUNCTION urutan_terapkan_batch(p_pesan JSONB, p_shard INT)
             RETURNS TEXT[] LANGUAGE plpgsql AS $$
             DECLARE
                 v_hasil TEXT[] := urutan_terapkan_batch_asli(p_pesan, p_shard);
             BEGIN
                 IF (SELECT count(*) FROM pg_locks
                     WHERE locktype = 'advisory' AND pid = pg_backend_pid()) > {budget} THEN
                     PERFORM nextval('lock_overflows');
                     RAISE EXCEPTION 'out of shared memory' USING ERRCODE = '53200',
                         HINT = 'You might need to increase max_locks_per_transaction.';
                 END IF;
                 RETURN v_hasil;
             END
             $$"
        ),
    ];
    for sql in statements {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(db)
            .await
            .expect("lock budget");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_larger_than_the_lock_table_is_applied_in_smaller_transactions_in_order() {
    let env = TestEnv::new("batchlocks").await;
    let mut settings = env.settings(1);
    settings.prefetch = 64;
    let db = env.db().await;
    limit_locks_per_transaction(&db, 10).await;
    let (hooks, counts) = counting_hooks();
    let conn = urutan::broker::connect(&settings.amqp_url, "t")
        .await
        .expect("connect");
    urutan::broker::topology::declare(&conn, &urutan::broker::Names::new("pesanan"), 1, 5, false)
        .await
        .expect("declare");
    // 60 orders × 4 versions, version-major: a full batch of 64 holds ~60
    // entity locks, far over the budget of 10.
    let (entities, versions) = (60, 4);
    let mut msgs = Vec::new();
    for v in 1..=versions {
        for e in 0..entities {
            msgs.push(Msg::event(&format!("L-{e:03}"), v));
        }
    }
    env.publisher().await.send_all(&msgs).await;
    let pool = RunningPool::start_with(settings, hooks).await;
    let total = msgs.len() as i64;
    wait_for("every version applied", Duration::from_secs(60), || {
        let db = db.clone();
        async move { count(&db, "SELECT count(*) FROM pesanan_riwayat").await == total }
    })
    .await;
    pool.stop().await;
    let overflows: i64 = count(
        &db,
        "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM lock_overflows",
    )
    .await;
    assert!(overflows > 0, "the lock budget was hit");
    assert_gapless_in_order(&history(&db).await, entities, versions);
    let c = counts.lock().map(|c| c.clone()).unwrap_or_default();
    assert_eq!(c.get("applied"), Some(&(msgs.len())), "outcomes: {c:?}");
    assert_eq!(c.values().sum::<usize>(), msgs.len(), "outcomes: {c:?}");
}

/// Everything `urutan_terapkan_batch` can touch, in a comparable form.
type FullState = (
    Vec<(String, String, i64, i64)>,
    Vec<(String, i64, String, String, i32)>,
    Vec<(String, String, i64, i32, i64)>,
    Vec<(String, String)>,
    Vec<(i32, i64)>,
);

async fn full_state(db: &PgPool) -> FullState {
    (
        sqlx::query_as("SELECT id, status, versi, epoch FROM pesanan ORDER BY id")
            .fetch_all(db)
            .await
            .expect("pesanan"),
        sqlx::query_as(
            "SELECT pesanan_id, versi, status, message_id, shard FROM pesanan_riwayat ORDER BY seq",
        )
        .fetch_all(db)
        .await
        .expect("riwayat"),
        sqlx::query_as(
            "SELECT pesanan_id, message_id, versi, shard, epoch FROM urutan_parkir ORDER BY seq",
        )
        .fetch_all(db)
        .await
        .expect("parkir"),
        sqlx::query_as("SELECT message_id, pesanan_id FROM pesan_diproses ORDER BY 1")
            .fetch_all(db)
            .await
            .expect("diproses"),
        sqlx::query_as("SELECT shard, epoch FROM urutan_shard ORDER BY shard")
            .fetch_all(db)
            .await
            .expect("shard"),
    )
}

/// A starting state: two active shards at some epochs, orders last applied
/// in some epoch, maybe a parked message, maybe already processed ids.
async fn seed_state(db: &PgPool, seed: u64) {
    let mut x = seed;
    let mut next = move |n: u64| {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) % n
    };
    sqlx::query("TRUNCATE pesanan, pesan_diproses, pesanan_riwayat, urutan_parkir, urutan_shard")
        .execute(db)
        .await
        .expect("truncate");
    let (e0, e1) = (next(3) as i64, next(3) as i64);
    sqlx::query("INSERT INTO urutan_shard (shard, epoch) VALUES (0, $1), (1, $2)")
        .bind(e0)
        .bind(e1)
        .execute(db)
        .await
        .expect("shards");
    for entity in 0..6 {
        if next(3) > 0 {
            sqlx::query("INSERT INTO pesanan (id, status, versi, epoch) VALUES ($1, 's', $2, $3)")
                .bind(format!("E-{entity}"))
                .bind(next(4) as i64)
                .bind(next(3) as i64)
                .execute(db)
                .await
                .expect("pesanan");
        }
    }
    if next(4) == 0 {
        sqlx::query(
            "INSERT INTO urutan_parkir (pesanan_id, message_id, status, versi, shard, epoch)
             VALUES ($1, 'parked-before', 's', 9, 1, $2)",
        )
        .bind(format!("E-{}", next(6)))
        .bind(next(3) as i64)
        .execute(db)
        .await
        .expect("parkir");
    }
    // m-0 recorded for an order, m-5 before orders were recorded ('', in
    // the default partition, the only place such rows are: migration 0014).
    sqlx::raw_sql(
        "INSERT INTO pesan_diproses (message_id, pesanan_id) VALUES ('m-0', 'E-0');
         INSERT INTO pesan_diproses_awal (message_id, pesanan_id, diproses_pada)
             VALUES ('m-5', '', now() - interval '2 days')",
    )
    .execute(db)
    .await
    .expect("diproses");
}

/// One batch item of these tests: message id, order id,
/// version (all NULL for a marker) and marker epoch.
type Item = (Option<String>, Option<String>, Option<i64>, Option<i64>);

/// The set-based `urutan_terapkan_batch` (migration 0006) against the
/// per-message loop it replaces (`urutan_terapkan_batch_urut`), from the
/// same random starting states (epochs in progress, parked orders, stored
/// versions, processed ids) with random batches (markers, duplicates,
/// stale and repeated versions): identical answers and identical rows,
/// including the parked ones and the history order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_set_based_batch_matches_the_per_message_loop() {
    let env = TestEnv::new("batchset").await;
    let db = env.db().await;
    let (mut fast_paths, mut reused) = (0, 0);
    for seed in 0..60u64 {
        let msgs = stream(seed, 6, 1 + (seed as usize * 7) % 40, true);
        let with_marker = seed % 5 == 0;
        let mut rows: Vec<Item> = msgs
            .iter()
            .map(|m| {
                let e = event(m);
                (Some(e.message_id), Some(e.entity_id), Some(e.versi), None)
            })
            .collect();
        if with_marker {
            rows.insert(rows.len() / 2, (None, None, None, Some(3)));
        }
        // The events as one jsonb array (what `store::apply_batch` sends) ...
        let call = |function: &'static str| {
            let items: Vec<serde_json::Value> = rows
                .iter()
                .map(|r| match r {
                    (_, _, _, Some(epoch)) => serde_json::json!({ "marker": epoch }),
                    (message_id, id, versi, None) => serde_json::json!({
                        "message_id": message_id,
                        "id": id,
                        "status": versi.map(|v| format!("s{v}")),
                        "versi": versi,
                        "data": versi.map(|v| serde_json::json!({ "v": v })),
                    }),
                })
                .collect();
            let db = db.clone();
            async move {
                let sql = format!("SELECT {function}($1, 0)");
                let answers: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                    .bind(sqlx::types::Json(items))
                    .fetch_one(&db)
                    .await
                    .unwrap_or_else(|e| panic!("{function}: {e}"));
                (answers, full_state(&db).await)
            }
        };
        // ... and as the previous signature's arrays (a worker of the
        // previous version during a rolling upgrade).
        let call_previous = || {
            let rows = rows.clone();
            let db = db.clone();
            async move {
                let sql = "SELECT urutan_terapkan_batch($1, $2, $3, $4, $5, $6, 0)";
                let statuses: Vec<Option<String>> =
                    rows.iter().map(|r| r.2.map(|v| format!("s{v}"))).collect();
                let datas: Vec<Option<String>> = rows
                    .iter()
                    .map(|r| r.2.map(|v| format!(r#"{{"v":{v}}}"#)))
                    .collect();
                let answers: Vec<String> = sqlx::query_scalar(sql)
                    .bind(rows.iter().map(|r| r.0.clone()).collect::<Vec<_>>())
                    .bind(rows.iter().map(|r| r.1.clone()).collect::<Vec<_>>())
                    .bind(statuses)
                    .bind(rows.iter().map(|r| r.2).collect::<Vec<_>>())
                    .bind(datas)
                    .bind(rows.iter().map(|r| r.3).collect::<Vec<_>>())
                    .fetch_one(&db)
                    .await
                    .unwrap_or_else(|e| panic!("previous signature: {e}"));
                (answers, full_state(&db).await)
            }
        };
        seed_state(&db, seed).await;
        let looped = call("urutan_terapkan_batch_urut").await;
        seed_state(&db, seed).await;
        let set = call("urutan_terapkan_batch").await;
        assert_eq!(looped, set, "seed {seed}");
        seed_state(&db, seed).await;
        let previous = call_previous().await;
        assert_eq!(looped, previous, "seed {seed}, previous signature");
        // An id an earlier item carried for another order, applied.
        reused += rows
            .iter()
            .enumerate()
            .filter(|(j, (m, id, _, _))| {
                m.is_some()
                    && looped.0[*j] == "applied"
                    && rows[..*j]
                        .iter()
                        .any(|(m2, id2, _, _)| m2 == m && id2 != id)
            })
            .count();
        if !with_marker && !looped.0.iter().any(|a| a == "parked") {
            fast_paths += 1;
        }
    }
    assert!(reused > 0, "no id of another order was applied again");
    assert!(
        fast_paths > 10,
        "the set-based path ran only {fast_paths} times"
    );
}
