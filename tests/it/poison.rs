//! Messages the handler cannot get through: a panic is retried in place
//! until the queue's delivery limit dead-letters it, a transient database
//! failure is held (never dead-lettered), and dedup retention removes only
//! expired ids.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lapin::types::AMQPValue;
use urutan::message::Event;
use urutan::shard::Hooks;

use crate::common::*;

/// Hooks with only `before_apply` set (whatever other hooks exist).
fn before_apply(f: impl Fn(&Event) + Send + Sync + 'static) -> Hooks {
    let mut hooks = Hooks::default();
    hooks.before_apply.replace(Arc::new(f));
    hooks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_message_is_requeued_until_the_delivery_limit_and_only_it_is_dead_lettered() {
    let env = TestEnv::new("poison").await;
    let limit = 2;
    let poison_calls = Arc::new(AtomicUsize::new(0));
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let hooks = {
        let (calls, seen) = (poison_calls.clone(), seen.clone());
        before_apply(move |ev: &Event| {
            seen.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(ev.message_id.clone());
            if ev.status == "racun" {
                calls.fetch_add(1, Ordering::SeqCst);
                // A panic that skips the panic hook: no backtrace per delivery.
                std::panic::resume_unwind(Box::new("poison"));
            }
        })
    };
    let mut settings = env.settings(1);
    settings.delivery_limit = limit;
    let pool = RunningPool::ready_with(settings, hooks).await;

    let publisher = env.publisher().await;
    publisher
        .send_all(&[
            Msg::event("A", 1),
            Msg::event_with("X", 1, "poison-1", "racun"),
            Msg::event("A", 2),
            Msg::event("A", 3),
            Msg::event("B", 1),
        ])
        .await;

    let db = env.db().await;
    wait_applied(&db, 4, Duration::from_secs(30)).await;
    let conn = env.broker().await;
    let dead = drain_dlq_expecting(&conn, 1, Duration::from_secs(30)).await;
    let ids: Vec<_> = dead.iter().map(message_id).collect();
    assert_eq!(ids, [Some("poison-1")], "only the poison");
    let reason = x_death_reason(&dead[0].delivery.properties);
    assert_eq!(reason.as_deref(), Some("delivery_limit"));

    let deliveries = poison_calls.load(Ordering::SeqCst);
    eprintln!("the poison was delivered {deliveries} times with x-delivery-limit = {limit}");
    // RabbitMQ 3.10 dead-letters when a return makes the delivery count
    // exceed the limit: limit + 1 deliveries.
    assert_eq!(deliveries, limit as usize + 1);
    // Requeued at the front each time: nothing overtook it.
    let order = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let mut expected = vec!["A-v1".to_owned()];
    expected.extend(std::iter::repeat_n("poison-1".to_owned(), deliveries));
    expected.extend(["A-v2", "A-v3", "B-v1"].map(String::from));
    assert_eq!(order, expected);

    let history = history(&db).await;
    let a: Vec<_> = history.iter().filter(|h| h.0 == "A").cloned().collect();
    assert_gapless_in_order(&a, 1, 3);
    assert_eq!(count(&db, "SELECT count(*) FROM pesan_diproses").await, 4);
    assert_eq!(
        count(&db, "SELECT count(*) FROM pesanan WHERE id = 'X'").await,
        0
    );

    let scrape = http_get(pool.http, "/metrics").await.1;
    let counted = metric_sum(
        &scrape,
        "urutan_dead_letters_total",
        &["reason=\"delivery_limit\""],
    );
    eprintln!("urutan_dead_letters_total{{reason=\"delivery_limit\"}} = {counted}");
    assert!(
        counted >= 1.0,
        "the broker dead-lettered the poison but urutan_dead_letters_total{{reason=\"delivery_limit\"}} is {counted}"
    );
    pool.stop().await;
}

/// The `reason` of the first `x-death` entry of a dead-lettered message.
fn x_death_reason(props: &lapin::BasicProperties) -> Option<String> {
    let headers = props.headers().as_ref()?;
    let AMQPValue::FieldArray(deaths) = headers.inner().get("x-death")? else {
        return None;
    };
    let AMQPValue::FieldTable(first) = deaths.as_slice().first()? else {
        return None;
    };
    match first.inner().get("reason")? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_message_keeps_order_while_the_database_refuses_briefly() {
    let env = TestEnv::new("held").await;
    let pool = RunningPool::ready(env.settings(1)).await;
    let publisher = env.publisher().await;
    publisher.send(&Msg::event("H", 1)).await;
    let db = env.db().await;
    wait_applied(&db, 1, Duration::from_secs(30)).await;
    db.close().await;

    // The database refuses the worker: no new connections to this database,
    // and the existing ones are terminated.
    let refused = RefusedConnections::start(&env);

    publisher
        .send_all(&[
            Msg::event("H", 2),
            Msg::event("H", 3),
            Msg::event("I", 1),
            Msg::event("H", 4),
        ])
        .await;
    // Held, not dead-lettered, not lost: the pool reports the database down
    // and retries while the messages wait in the queue.
    let http = pool.http;
    wait_for("held retries", Duration::from_secs(20), || async move {
        let scrape = http_get(http, "/metrics").await.1;
        http_get(http, "/readyz").await.0 == 503
            && metric_sum(&scrape, "urutan_retries_total", &["shard=\"0\""]) >= 3.0
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let conn = env.broker().await;
    assert_eq!(
        queue_len(&conn, "pesanan.shard-000").await,
        3,
        "one held (unacked), three waiting behind it"
    );
    assert_eq!(
        http_get(pool.http, "/readyz").await.0,
        503,
        "still not ready"
    );
    refused.allow();

    let db = env.db().await;
    wait_applied(&db, 5, Duration::from_secs(60)).await;
    let history = history(&db).await;
    let order: Vec<_> = history.iter().map(|h| (h.0.as_str(), h.1)).collect();
    assert_eq!(order, [("H", 1), ("H", 2), ("H", 3), ("I", 1), ("H", 4)]);
    assert!(drain_dlq(&conn).await.is_empty(), "nothing dead-lettered");
    pool.wait_ready().await;
    pool.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_purges_only_expired_ids() {
    let env = TestEnv::new("retention").await;
    let db = env.db().await;
    let seed = "INSERT INTO pesan_diproses (message_id, pesanan_id, diproses_pada)
        SELECT 'old-' || g, 'O', now() - interval '40 days' - g * interval '1 second'
          FROM generate_series(1, 12000) g
        UNION ALL
        SELECT 'edge-' || g, 'O', now() - interval '29 days 23 hours' FROM generate_series(1, 100) g
        UNION ALL
        SELECT 'new-' || g, 'O', now() - g * interval '1 minute' FROM generate_series(1, 500) g";
    sqlx::query(seed).execute(&db).await.expect("seed");

    let retention = Duration::from_secs(30 * 86_400);
    let purged = tokio::time::timeout(
        Duration::from_secs(60),
        urutan::store::purge_expired(&db, retention),
    )
    .await
    .expect("purge within 60 s")
    .expect("purge");
    assert_eq!(purged, 12_000);
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM pesan_diproses WHERE message_id LIKE 'old-%'"
        )
        .await,
        0
    );
    assert_eq!(
        count(&db, "SELECT count(*) FROM pesan_diproses").await,
        600,
        "recent and not-yet-expired ids stay"
    );
    let again = urutan::store::purge_expired(&db, retention)
        .await
        .expect("second purge");
    assert_eq!(again, 0);
}

/// A `message_id` that is not UTF-8 (AMQP only says "octets") is read
/// lossily by the patched codec and refused by urutan (`invalid_message_id`,
/// see `hostile.rs`): nothing is lost, the message is isolated and the
/// shard keeps its order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_id_that_is_not_utf8_is_dead_lettered_and_the_shard_flows() {
    let env = TestEnv::new("poison_utf8").await;
    let mut settings = env.settings(1);
    settings.delivery_limit = 2;
    let pool = RunningPool::ready(settings).await;
    let publisher = env.publisher().await;
    publisher.send(&Msg::event("A", 1)).await;
    let body = br#"{"id":"A","status":"baru","versi":2,"data":null}"#;
    crate::raw_amqp::publish_raw(
        &env.vhost,
        "pesanan.shard-000",
        b"id-\xff\xfe",
        &[("x-pesanan-id", "A")],
        body,
    )
    .await;
    publisher.send(&Msg::event("A", 3)).await;
    let db = env.db().await;
    let conn = env.broker().await;
    wait_for(
        "the bad message dead-lettered",
        Duration::from_secs(60),
        || {
            let conn = &conn;
            async move { queue_len(conn, "pesanan.dlq").await == 1 }
        },
    )
    .await;
    wait_applied(&db, 2, Duration::from_secs(30)).await;
    let scrape = http_get(pool.http, "/metrics").await.1;
    eprintln!(
        "{}",
        scrape
            .lines()
            .filter(|l| l.contains("dead_letters") || l.contains("reconnects"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    pool.stop().await;
}

/// RabbitMQ 3.10.8 returns a requeued message to the front of its shard
/// queue, except after a message of that queue was dead-lettered by the
/// delivery limit: from then on a requeued message can be overtaken by the
/// messages behind it. A failing X-v1 must still be applied before X-v2,
/// whatever the broker's requeue position: the worker records each message
/// it hands back, and a newer version of that order waits (parked) until
/// the returned one is applied or dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requeued_message_is_not_overtaken_after_a_delivery_limit_dead_letter() {
    requeued_messages_are_not_overtaken(1, None).await;
}

/// The same in pipelined strict mode (`PREFETCH=2`, `BATCH_MAX=1`): when a
/// message is handed back, the one behind it is already on hand and comes
/// first; if it is a newer version of the same order it must wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requeued_message_is_not_overtaken_in_pipelined_strict_mode() {
    requeued_messages_are_not_overtaken(2, Some(1)).await;
}

async fn requeued_messages_are_not_overtaken(prefetch: u16, batch_max: Option<u16>) {
    let env = TestEnv::new(&format!("requeue_order_p{prefetch}")).await;
    let failures = Arc::new(Mutex::new(std::collections::HashMap::<String, usize>::new()));
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let hooks = {
        let (failures, seen) = (failures.clone(), seen.clone());
        before_apply(move |ev: &Event| {
            seen.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(ev.message_id.clone());
            // "racun": always fails; "gagal-N": fails its first N deliveries.
            let mut failures = failures.lock().unwrap_or_else(|p| p.into_inner());
            let failed = failures.entry(ev.message_id.clone()).or_default();
            let fail_times = match ev.status.as_str() {
                "racun" => usize::MAX,
                s => s
                    .strip_prefix("gagal-")
                    .map_or(0, |n| n.parse().unwrap_or(0)),
            };
            if *failed < fail_times {
                *failed += 1;
                drop(failures);
                std::panic::resume_unwind(Box::new("fails on purpose"));
            }
        })
    };
    let mut settings = env.settings(1);
    settings.delivery_limit = 3;
    settings.prefetch = prefetch;
    settings.batch_max = batch_max;
    // The order of requeued messages, past a refused one (holds:
    // tests/it/holds.rs).
    settings.on_refused = urutan::config::OnRefused::Skip;
    let pool = RunningPool::ready_with(settings, hooks).await;

    let publisher = env.publisher().await;
    publisher
        .send_all(&[
            Msg::event_with("A", 1, "A-v1", "racun"),
            Msg::event("A", 2),
            Msg::event_with("X", 1, "X-v1", "gagal-2"),
            Msg::event("X", 2),
            Msg::event("B", 1),
            Msg::event_with("X", 3, "X-v3", "gagal-1"),
            Msg::event("X", 4),
            Msg::event("B", 2),
        ])
        .await;

    let db = env.db().await;
    wait_for("the last versions stored", Duration::from_secs(60), || {
        let db = db.clone();
        async move {
            let last = "SELECT count(*) FROM pesanan
                        WHERE (id, versi) IN (('A', 2), ('X', 4), ('B', 2))";
            count(&db, last).await == 3
                && count(&db, "SELECT count(*) FROM urutan_parkir").await == 0
        }
    })
    .await;
    let conn = env.broker().await;
    let dead = drain_dlq_expecting(&conn, 1, Duration::from_secs(30)).await;
    assert_eq!(
        message_id(&dead[0]),
        Some("A-v1"),
        "only the poison is dead-lettered"
    );
    let order = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
    eprintln!("deliveries in the order the handler saw them: {order:?}");
    let history = history(&db).await;
    let x: Vec<i64> = history.iter().filter(|h| h.0 == "X").map(|h| h.1).collect();
    assert_eq!(
        x,
        [1, 2, 3, 4],
        "X applied in order, nothing skipped as stale"
    );
    let b: Vec<i64> = history.iter().filter(|h| h.0 == "B").map(|h| h.1).collect();
    assert_eq!(b, [1, 2]);
    let a: Vec<i64> = history.iter().filter(|h| h.0 == "A").map(|h| h.1).collect();
    assert_eq!(a, [2], "A-v2 applied once A-v1 was dead-lettered");
    assert_eq!(
        count(&db, "SELECT count(*) FROM urutan_dikembalikan").await,
        0,
        "no returned message is still recorded"
    );
    pool.stop().await;
}

/// A panic outside a message's own guards (here an outcome hook's, after
/// the commit and before the ack; in issue 44 the tracing subscriber's,
/// whose span stack a span entered across an await had corrupted) must not
/// end the shard's worker: before, its task died and, while the pool's
/// other shards went on, nothing consumed that shard again: every version
/// behind waited forever. Now the worker opens its channel again, the
/// unacked delivery comes back (a duplicate of what committed) and every
/// version is applied, in strict and batch mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_the_worker_outside_a_message_does_not_strand_its_shard() {
    for prefetch in [1, 8] {
        let env = TestEnv::new(&format!("worker_panic_p{prefetch}")).await;
        let panicked = Arc::new(AtomicUsize::new(0));
        let mut hooks = Hooks::default();
        let once = panicked.clone();
        hooks
            .on_outcome
            .replace(Arc::new(move |seen: &urutan::shard::Observed<'_>| {
                if seen.shard == 1 && once.fetch_add(1, Ordering::SeqCst) == 0 {
                    std::panic::resume_unwind(Box::new("an observer's bug"));
                }
            }));
        let mut settings = env.settings(2);
        settings.prefetch = prefetch;
        let pool = RunningPool::ready_with(settings, hooks).await;
        let orders = 20;
        let msgs: Vec<Msg> = (1..=5)
            .flat_map(|v| (0..orders).map(move |o| Msg::event(&format!("W-{o}"), v)))
            .collect();
        env.publisher().await.send_all(&msgs).await;
        let db = env.db().await;
        wait_applied(&db, 5 * orders, Duration::from_secs(30)).await;
        for o in 0..orders {
            assert_eq!(stored(&db, &format!("W-{o}")).await, Some(5));
        }
        assert!(panicked.load(Ordering::SeqCst) > 1, "shard 1 panicked once");
        pool.stop().await;
    }
}
