//! A Rust handler (`urutan::handler`, docs/contract.md section 10) in the
//! pool: called with the open apply transaction for every applied version,
//! in strict, batch and release paths, once each through duplicates,
//! stale versions and versions that wait; its `retry` (with or without a
//! duration) and its panic set one message aside while the shard goes on;
//! its refusal and an SQL data error in it dead-letter the version as
//! `handler_refused` and hold the order until the replay.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::PgPool;
use urutan::config::{GapPolicy, Settings};
use urutan::handler::{Handler, HandlerError, HandlerEvent};
use urutan_testkit::fixtures::{
    Msg, RunningPool, TestEnv, count, http_get, metric_sum, stored, urutan, wait_count, wait_for,
    wait_stored,
};

/// What the test handler does for an order.
#[derive(Clone, Copy, Debug)]
enum Mode {
    Retry(Option<Duration>),
    Refuse,
    Panic,
    /// SQL the database refuses (division by zero).
    BadSql,
}

/// Records every call in `langkah` (one row per call, no key: a second
/// call of a version would show); fails as `modes` says for an order (or
/// for `*status`).
#[derive(Default)]
struct Recorder {
    modes: Mutex<HashMap<String, Mode>>,
}

impl Recorder {
    fn set(&self, key: &str, mode: Option<Mode>) {
        let mut modes = self.modes.lock().expect("modes");
        match mode {
            Some(mode) => modes.insert(key.to_owned(), mode),
            None => modes.remove(key),
        };
    }

    fn mode(&self, event: &HandlerEvent) -> Option<Mode> {
        let modes = self.modes.lock().expect("modes");
        let by_status = format!("*{}", event.status);
        modes
            .get(&event.id)
            .or_else(|| modes.get(&by_status))
            .copied()
    }
}

impl Handler for Recorder {
    async fn handle(
        &self,
        tx: &mut sqlx::PgConnection,
        event: &HandlerEvent,
    ) -> Result<(), HandlerError> {
        match self.mode(event) {
            Some(Mode::Retry(None)) => return Err(HandlerError::retry("not yet")),
            Some(Mode::Retry(Some(after))) => {
                return Err(HandlerError::retry_after(after, "not yet"));
            }
            Some(Mode::Refuse) => {
                return Err(HandlerError::refuse(format!("no stock for {}", event.id)));
            }
            Some(Mode::Panic) => panic!("the handler broke on {}", event.message_id),
            Some(Mode::BadSql) => {
                sqlx::query("SELECT 1 / 0").execute(&mut *tx).await?;
            }
            None => {}
        }
        sqlx::query(
            "INSERT INTO langkah (message_id, pesanan_id, versi, previous_versi, shard, data)
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&event.message_id)
        .bind(&event.id)
        .bind(event.versi)
        .bind(event.previous_versi)
        .bind(i32::from(event.shard))
        .bind(&event.data)
        .execute(tx)
        .await?;
        Ok(())
    }
}

const SIDE_TABLE: &str = "CREATE TABLE langkah (
    n BIGSERIAL PRIMARY KEY, message_id TEXT, pesanan_id TEXT, versi BIGINT,
    previous_versi BIGINT, shard INT, data JSONB)";

struct Scene {
    env: TestEnv,
    db: PgPool,
    pool: RunningPool,
    handler: Arc<Recorder>,
}

async fn scene(test: &str, shards: u16, prefetch: u16, tune: impl FnOnce(&mut Settings)) -> Scene {
    let env = TestEnv::new(test).await;
    let db = env.db().await;
    sqlx::raw_sql(SIDE_TABLE)
        .execute(&db)
        .await
        .expect("side table");
    let mut settings = env.settings(shards);
    settings.prefetch = prefetch;
    settings.retry_backoff_min = Duration::from_millis(100);
    settings.retry_backoff_max = Duration::from_millis(400);
    settings.retry_max_attempts = 1000;
    tune(&mut settings);
    let handler = Arc::new(Recorder::default());
    let pool = RunningPool::ready_with_handler(settings, handler.clone()).await;
    Scene {
        env,
        db,
        pool,
        handler,
    }
}

/// `order`'s calls: (versi, previous_versi), in call order.
async fn calls(db: &PgPool, order: &str) -> Vec<(i64, Option<i64>)> {
    sqlx::query_as("SELECT versi, previous_versi FROM langkah WHERE pesanan_id = $1 ORDER BY n")
        .bind(order)
        .fetch_all(db)
        .await
        .expect("calls")
}

fn versions(order: &str, vs: &[i64]) -> Vec<Msg> {
    vs.iter().map(|v| Msg::event(order, *v)).collect()
}

/// Exactly one call per applied version: the calls equal the history (by
/// message id), each order's in increasing versi with the version before.
async fn assert_one_call_per_applied_version(db: &PgPool) {
    let history: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT message_id, pesanan_id, versi FROM pesanan_riwayat ORDER BY message_id",
    )
    .fetch_all(db)
    .await
    .expect("history");
    let calls: Vec<(String, String, i64)> =
        sqlx::query_as("SELECT message_id, pesanan_id, versi FROM langkah ORDER BY message_id")
            .fetch_all(db)
            .await
            .expect("calls");
    assert_eq!(calls, history, "one call per applied version");
    let moved: Vec<(String, i64, Option<i64>)> = sqlx::query_as(
        "SELECT pesanan_id, versi, previous_versi FROM langkah ORDER BY pesanan_id, n",
    )
    .fetch_all(db)
    .await
    .expect("calls");
    let mut last: HashMap<String, i64> = HashMap::new();
    for (order, versi, previous) in moved {
        assert_eq!(previous, last.get(&order).copied(), "{order} v{versi}");
        assert!(previous.is_none_or(|p| p < versi), "{order}: in order");
        last.insert(order, versi);
    }
}

/// Duplicates, stale versions and versions that wait for a missing one
/// (`GAP_POLICY=wait`: applied later by the release step): one call per
/// applied version, on its first try, in strict, pipelined strict and
/// batch mode.
#[tokio::test]
async fn a_rust_handler_runs_once_per_applied_version_in_every_mode() {
    for (prefetch, gaps) in [
        (1, GapPolicy::Wait),
        (4, GapPolicy::Wait),
        (16, GapPolicy::Wait),
        (1, GapPolicy::Apply),
        (16, GapPolicy::Apply),
    ] {
        let test = format!("rust_once_p{prefetch}_{gaps:?}").to_lowercase();
        let s = scene(&test, 2, prefetch, |s| {
            s.gap_policy = gaps;
            // A message set aside would not be tried again within the test:
            // every call here is made on the first try.
            s.retry_backoff_min = Duration::from_secs(3600);
            s.retry_backoff_max = Duration::from_secs(3600);
        })
        .await;
        // With GAP_POLICY=wait, 3 waits for 2 (applied later, by the release step).
        let first = if gaps == GapPolicy::Wait {
            [1, 3, 2]
        } else {
            [1, 2, 3]
        };
        let mut msgs = Vec::new();
        for e in 0..6 {
            let order = format!("R-{e}");
            // 1, 3, 2 (or 1, 2, 3), 4, a duplicate of 4, a stale 2, 5.
            msgs.extend(versions(&order, &first));
            msgs.extend(versions(&order, &[4, 4]));
            msgs.push(Msg::event_with(
                &order,
                2,
                &format!("{order}-stale"),
                "dibuat",
            ));
            msgs.extend(versions(&order, &[5]));
        }
        s.env.publisher().await.send_all(&msgs).await;
        for e in 0..6 {
            wait_stored(&s.db, &format!("R-{e}"), 5).await;
        }
        assert_one_call_per_applied_version(&s.db).await;
        assert_eq!(
            calls(&s.db, "R-0").await,
            [
                (1, None),
                (2, Some(1)),
                (3, Some(2)),
                (4, Some(3)),
                (5, Some(4))
            ],
            "prefetch {prefetch}, {gaps:?}"
        );
        s.pool.stop().await;
    }
}

/// The handler asks order F to retry (after 200 ms) and panics on order P:
/// each is set aside and retried while every other order on the same shard
/// completes; once the handler agrees, both complete in order.
#[tokio::test]
async fn a_rust_handler_retry_or_panic_sets_one_message_aside() {
    for prefetch in [1, 16] {
        let s = scene(&format!("rust_retry_p{prefetch}"), 1, prefetch, |_| {}).await;
        s.handler
            .set("F", Some(Mode::Retry(Some(Duration::from_millis(200)))));
        s.handler.set("P", Some(Mode::Panic));
        let mut msgs = Vec::new();
        for v in 1..=3 {
            msgs.push(Msg::event("F", v));
            msgs.push(Msg::event("P", v));
            for o in 0..10 {
                msgs.push(Msg::event(&format!("O-{o}"), v));
            }
        }
        s.env.publisher().await.send_all(&msgs).await;
        wait_count(
            &s.db,
            "SELECT count(*) FROM pesanan_riwayat WHERE pesanan_id LIKE 'O-%'",
            30,
            Duration::from_secs(60),
        )
        .await;
        assert_eq!(stored(&s.db, "F").await, None, "F waits");
        assert_eq!(stored(&s.db, "P").await, None, "P waits");
        wait_for("F and P tried again", Duration::from_secs(15), || async {
            count(
                &s.db,
                "SELECT count(*) FROM urutan_parkir WHERE percobaan >= 2",
            )
            .await
                == 2
        })
        .await;
        let (error, attempts): (String, i32) = sqlx::query_as(
            "SELECT galat, percobaan FROM urutan_parkir WHERE pesanan_id = 'P' AND jatuh_tempo IS NOT NULL",
        )
        .fetch_one(&s.db)
        .await
        .expect("P set aside");
        assert!(error.contains("panicked"), "{error}");
        assert!(attempts >= 2);
        let scrape = http_get(s.pool.http, "/metrics").await.1;
        assert!(metric_sum(&scrape, "urutan_retries_total", &["reason=\"panic\""]) >= 2.0);
        assert!(
            metric_sum(
                &scrape,
                "urutan_retries_total",
                &["reason=\"handler_retry\""]
            ) >= 2.0
        );
        s.handler.set("F", None);
        s.handler.set("P", None);
        wait_stored(&s.db, "F", 3).await;
        wait_stored(&s.db, "P", 3).await;
        let seen = |c: Vec<(i64, Option<i64>)>| c.into_iter().map(|c| c.0).collect::<Vec<_>>();
        assert_eq!(seen(calls(&s.db, "F").await), [1, 2, 3]);
        assert_eq!(seen(calls(&s.db, "P").await), [1, 2, 3]);
        assert_one_call_per_applied_version(&s.db).await;
        s.pool.stop().await;
    }
}

/// A refusal (and SQL the database refuses, inside the handler) is
/// dead-lettered as `handler_refused` with the handler's words; its order
/// is held at the version before, later versions wait; replayed after the
/// fix, it is applied and the rest follow in order.
#[tokio::test]
async fn a_rust_handler_refusal_holds_the_order_until_the_replay() {
    let s = scene("rust_refuse", 1, 1, |_| {}).await;
    s.handler.set("*racun", Some(Mode::Refuse));
    s.handler.set("*bagi", Some(Mode::BadSql));
    let msgs = vec![
        Msg::event("A", 1),
        Msg::event_with("A", 2, "A-v2", "racun"),
        Msg::event("A", 3),
        Msg::event("B", 1),
        Msg::event_with("B", 2, "B-v2", "bagi"),
        Msg::event("B", 3),
        Msg::event("C", 1),
    ];
    s.env.publisher().await.send_all(&msgs).await;
    wait_stored(&s.db, "C", 1).await;
    wait_count(
        &s.db,
        "SELECT count(*) FROM urutan_dead_letter WHERE reason = 'handler_refused'",
        2,
        Duration::from_secs(30),
    )
    .await;
    let errors: Vec<(String, String)> =
        sqlx::query_as("SELECT message_id, last_error FROM urutan_dead_letter ORDER BY message_id")
            .fetch_all(&s.db)
            .await
            .expect("records");
    assert_eq!(errors[0].0, "A-v2");
    assert!(errors[0].1.contains("no stock for A"), "{errors:?}");
    assert_eq!(errors[1].0, "B-v2");
    assert!(errors[1].1.contains("division by zero"), "{errors:?}");
    wait_count(
        &s.db,
        "SELECT count(*) FROM urutan_parkir",
        2,
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(
        (stored(&s.db, "A").await, stored(&s.db, "B").await),
        (Some(1), Some(1))
    );
    assert_eq!(count(&s.db, "SELECT count(*) FROM urutan_tahan").await, 2);

    s.handler.set("*racun", None);
    s.handler.set("*bagi", None);
    let replay = urutan(&s.env, &[], &["dlq", "replay", "A-v2", "B-v2"]).await;
    assert!(replay.ok(), "{replay}");
    wait_stored(&s.db, "A", 3).await;
    wait_stored(&s.db, "B", 3).await;
    assert_one_call_per_applied_version(&s.db).await;
    assert_eq!(count(&s.db, "SELECT count(*) FROM urutan_tahan").await, 0);
    s.pool.stop().await;
}

/// The crate root's example, as a team writes it for a new entity
/// (shipments): no boxing, no lifetimes, its data read by `data_as`.
mod from_the_crate_docs {
    use urutan::{Handler, HandlerError, HandlerEvent};

    #[derive(serde::Deserialize)]
    struct Shipment {
        courier: String,
        kg: i64,
    }

    pub struct Shipments;

    impl Handler for Shipments {
        async fn handle(
            &self,
            tx: &mut sqlx::PgConnection,
            event: &HandlerEvent,
        ) -> Result<(), HandlerError> {
            let shipment: Shipment = event.data_as()?;
            sqlx::query("INSERT INTO shipments (id, version, courier, kg) VALUES ($1, $2, $3, $4)")
                .bind(&event.id)
                .bind(event.versi)
                .bind(shipment.courier)
                .bind(shipment.kg)
                .execute(tx)
                .await?;
            Ok(())
        }
    }
}

/// A shipment event with `data`, its id in `x-pengiriman-id`.
fn shipment(
    id: &str,
    versi: i64,
    data: serde_json::Value,
) -> urutan_testkit::fixtures::Raw<'static> {
    use lapin::types::{AMQPValue, FieldTable, LongString};
    let mut headers = FieldTable::default();
    let header = AMQPValue::LongString(LongString::from(id.as_bytes()));
    headers.insert("x-pengiriman-id".into(), header);
    let body = serde_json::json!({"id": id, "status": "dikirim", "versi": versi, "data": data});
    urutan_testkit::fixtures::Raw {
        exchange: "pengiriman",
        routing_key: "pengiriman.dikirim",
        props: lapin::BasicProperties::default()
            .with_message_id(format!("{id}-v{versi}").into())
            .with_delivery_mode(2)
            .with_headers(headers),
        body: body.to_string().into_bytes(),
    }
}

/// The crate root's handler for a new entity (`ENTITY=pengiriman`), run
/// by the library's own entry point (`urutan::Pool`): its versions applied
/// once each through a duplicate, a version whose data does not fit
/// refused with a reason that names the field and the type, and the pool
/// stopped cleanly by its shutdown token.
#[tokio::test]
async fn the_crate_docs_handler_runs_a_new_entity_in_the_library_pool() {
    let env = TestEnv::new("rust_crate_docs").await;
    let db = env.db().await;
    sqlx::raw_sql(
        "CREATE SCHEMA pengiriman; CREATE TABLE pengiriman.shipments (
             id TEXT, version BIGINT, courier TEXT, kg BIGINT, PRIMARY KEY (id, version))",
    )
    .execute(&db)
    .await
    .expect("the team's table");
    let free = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let http = free.local_addr().expect("its address");
    drop(free);
    let settings = Settings {
        entity: "pengiriman".to_owned(),
        database_schema: "pengiriman".to_owned(),
        topology_prefix: "pengiriman".to_owned(),
        metrics_addr: http,
        ..env.settings(2)
    };
    let shutdown = tokio_util::sync::CancellationToken::new();
    let pool = urutan::Pool::new(settings)
        .handler(from_the_crate_docs::Shipments)
        .shutdown_on(shutdown.clone());
    let running = tokio::spawn(pool.run());
    wait_for("/readyz 200", Duration::from_secs(30), || async move {
        http_get(http, "/readyz").await.0 == 200
    })
    .await;

    let jne = |kg: i64| serde_json::json!({"courier": "jne", "kg": kg});
    let publisher = env.publisher().await;
    publisher
        .send_raw(vec![
            shipment("K-1", 1, jne(2)),
            shipment("K-1", 2, jne(3)),
            shipment("K-1", 2, jne(3)),
            shipment("K-2", 1, serde_json::json!({"courier": "pos"})),
            shipment("K-3", 1, jne(7)),
        ])
        .await;
    wait_count(
        &db,
        "SELECT count(*) FROM pengiriman.urutan_dead_letter",
        1,
        Duration::from_secs(30),
    )
    .await;
    wait_count(
        &db,
        "SELECT count(*) FROM pengiriman.pesanan_riwayat",
        3,
        Duration::from_secs(30),
    )
    .await;
    let shipped: Vec<(String, i64, String, i64)> = sqlx::query_as(
        "SELECT id, version, courier, kg FROM pengiriman.shipments ORDER BY id, version",
    )
    .fetch_all(&db)
    .await
    .expect("shipments");
    let row = |id: &str, version, kg| (id.to_owned(), version, "jne".to_owned(), kg);
    assert_eq!(
        shipped,
        [row("K-1", 1, 2), row("K-1", 2, 3), row("K-3", 1, 7)]
    );
    let (reason, error): (String, String) = sqlx::query_as(
        "SELECT reason, last_error FROM pengiriman.urutan_dead_letter WHERE message_id = 'K-2-v1'",
    )
    .fetch_one(&db)
    .await
    .expect("K-2's record");
    assert_eq!(reason, "handler_refused");
    assert!(
        error.contains("K-2 v1")
            && error.contains("Shipment")
            && error.contains("missing field `kg`"),
        "{error}"
    );

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("the pool stops within 30 s")
        .expect("the pool's task")
        .expect("a clean stop");
}
