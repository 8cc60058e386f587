//! Several replicas of the pool on one broker: each is active on the shards
//! placed on it (single active consumer keeps one consumer per shard at
//! work), and a shard changes replica only after its old one handed it over.
//! `share`: replicas as processes.

mod share;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio_util::sync::CancellationToken;
use urutan::message::Event;
use urutan::shard::Hooks;

use crate::common::*;

/// Hooks with only `before_apply` set (whatever other hooks exist).
fn before_apply(f: impl Fn(&Event) + Send + Sync + 'static) -> Hooks {
    let mut hooks = Hooks::default();
    hooks.before_apply.replace(Arc::new(f));
    hooks
}

/// Per shard queue: (consumers, active consumers), from the broker.
fn consumers(env: &TestEnv) -> BTreeMap<String, (usize, usize)> {
    let out = sh(
        "rabbitmqctl",
        &[
            "-q",
            "list_consumers",
            "-p",
            &env.vhost,
            "queue_name",
            "active",
            "--formatter",
            "json",
        ],
    );
    let rows: Vec<Value> = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let mut per_queue = BTreeMap::new();
    for row in rows {
        let queue = row["queue_name"].as_str().expect("queue_name").to_owned();
        let entry = per_queue.entry(queue).or_insert((0, 0));
        entry.0 += 1;
        if row["active"] == true {
            entry.1 += 1;
        }
    }
    per_queue
}

/// How many orders are stored at version `versi`.
async fn orders_at_version(db: &sqlx::PgPool, versi: i64) -> usize {
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM pesanan WHERE versi = $1")
        .bind(versi)
        .fetch_one(db)
        .await
        .expect("count orders at a version");
    usize::try_from(n).expect("a count")
}

fn every_shard(shards: u16, consumers: usize) -> BTreeMap<String, (usize, usize)> {
    (0..shards)
        .map(|i| (format!("pesanan.shard-{i:03}"), (consumers, 1)))
        .collect()
}

/// Two replicas share 4 shards, 2 each, and each handles only the orders of
/// its own shards; when the first stops mid-run, its shards go to the
/// second. Per shard, the replica handling it changes at most once, from the
/// first to the second: never two at once, nothing reordered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_the_shards_and_never_consume_one_at_once() {
    let env = TestEnv::new("replicas").await;
    let shards = 4;
    let (entities, versions) = (100usize, 10i64);
    let total = entities as i64 * versions;
    // The first replica stops itself (as SIGTERM would) mid-run, from inside
    // its handler, once it has handled this many messages.
    let stop_after = 120;

    // (replica, order) of every message handled, in order.
    let handled: Arc<Mutex<Vec<(u8, String)>>> = Arc::default();
    let second_when_first_stopped = Arc::new(AtomicUsize::new(usize::MAX));
    let first_token: Arc<OnceLock<CancellationToken>> = Arc::new(OnceLock::new());
    let seen_by = |handled: &Mutex<Vec<(u8, String)>>, replica: u8| {
        let list = handled.lock().unwrap_or_else(|p| p.into_inner());
        list.iter().filter(|(r, _)| *r == replica).count()
    };

    let first_hooks = {
        let (handled, at_stop, token) = (
            handled.clone(),
            second_when_first_stopped.clone(),
            first_token.clone(),
        );
        before_apply(move |e: &Event| {
            handled
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((1, e.entity_id.clone()));
            if seen_by(&handled, 1) == stop_after {
                at_stop.store(seen_by(&handled, 2), Ordering::SeqCst);
                if let Some(token) = token.get() {
                    token.cancel();
                }
            }
        })
    };
    let second_hooks = {
        let handled = handled.clone();
        before_apply(move |e: &Event| {
            handled
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((2, e.entity_id.clone()));
        })
    };

    let first = RunningPool::start_with(env.settings(shards), first_hooks).await;
    first_token
        .set(first.shutdown.clone())
        .expect("token set once");
    first.wait_ready().await;
    let second = RunningPool::start_with(env.settings(shards), second_hooks).await;
    second.wait_ready().await;

    // Every shard: one consumer, active; the two replicas 2 shards each.
    let expected = every_shard(shards, 1);
    wait_for("1 consumer per shard", Duration::from_secs(30), || {
        let ok = consumers(&env) == expected;
        async move { ok }
    })
    .await;
    let db = env.db().await;
    let per_replica: Vec<i64> = sqlx::query_scalar(
        "SELECT count(*) FROM urutan_penempatan GROUP BY replika ORDER BY replika",
    )
    .fetch_all(&db)
    .await
    .expect("placement");
    assert_eq!(per_replica, [2, 2], "2 shards placed on each replica");

    let publisher = env.publisher().await;
    let msgs: Vec<Msg> = (1..=versions)
        .flat_map(|v| (0..entities).map(move |e| Msg::event(&format!("R-{e}"), v)))
        .collect();
    publisher.send_all(&msgs).await;

    tokio::time::timeout(Duration::from_secs(60), first.shutdown.cancelled())
        .await
        .expect("the first replica handled its messages within 60 s");
    first.stop().await;
    let second_before = second_when_first_stopped.load(Ordering::SeqCst);
    assert!(
        second_before > 0 && second_before != usize::MAX,
        "the second replica handled nothing while the first was active (it stood by)"
    );

    wait_for("every version applied", Duration::from_secs(90), || {
        let db = db.clone();
        async move { count(&db, "SELECT count(*) FROM pesanan_riwayat").await == total }
    })
    .await;
    let history = history(&db).await;
    let shard_of: BTreeMap<&str, i32> = history.iter().map(|(e, _, s)| (e.as_str(), *s)).collect();
    let handled = handled.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let mut by_shard: BTreeMap<i32, Vec<u8>> = BTreeMap::new();
    for (replica, order) in &handled {
        let shard = shard_of[order.as_str()];
        let list = by_shard.entry(shard).or_default();
        if list.last() != Some(replica) {
            list.push(*replica);
        }
    }
    eprintln!("handlers per shard, in turn: {by_shard:?}");
    for (shard, turns) in &by_shard {
        assert!(
            turns == &[1] || turns == &[2] || turns == &[1, 2],
            "shard {shard} was handled by {turns:?} in turn (two replicas at once?)"
        );
    }
    assert!(
        by_shard.values().any(|t| t == &[2]),
        "the second replica owned no shard of its own"
    );
    // A message in flight at the handover may be handled by both (then it
    // is a duplicate for the second).
    assert!(
        handled.len() >= total as usize && handled.len() <= total as usize + usize::from(shards),
        "handled {} messages for {total}",
        handled.len()
    );
    assert_eq!(consumers(&env), every_shard(shards, 1), "one consumer left");

    assert_gapless_in_order(&history, entities, versions);
    assert_eq!(
        count(&db, "SELECT count(*) FROM pesan_diproses").await,
        total
    );
    let conn = env.broker().await;
    assert!(drain_dlq(&conn).await.is_empty(), "nothing dead-lettered");
    second.stop().await;
}

/// A rolling restart with a backlog: each replica is stopped gracefully (as
/// by SIGTERM) while its consumer holds prefetched deliveries. "Finish and ack
/// what is in flight" must not spend deliveries: on RabbitMQ 3.10 a channel
/// closed with unacked deliveries adds to their `x-delivery-count`, so
/// enough graceful restarts would dead-letter good messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_handovers_spend_no_delivery() {
    let env = TestEnv::new("handover").await;
    let n = 60;
    let mut settings = env.settings(1);
    settings.prefetch = 10;
    settings.delivery_limit = 1;
    // Declare, then queue the whole backlog before any replica consumes.
    let conn = urutan::broker::connect(&env.amqp_url().into(), "t")
        .await
        .expect("connect");
    let names = urutan::broker::Names::new("pesanan");
    urutan::broker::topology::declare(&conn, &names, 1, 1, false)
        .await
        .expect("declare");
    let msgs: Vec<Msg> = (1..=n).map(|v| Msg::event("G", v)).collect();
    env.publisher().await.send_all(&msgs).await;

    // Three replicas in turn, each stopping itself while handling its third message.
    for _ in 0..3 {
        let token: Arc<OnceLock<CancellationToken>> = Arc::new(OnceLock::new());
        let handled = Arc::new(AtomicUsize::new(0));
        let hooks = {
            let (token, handled) = (token.clone(), handled.clone());
            before_apply(move |_: &Event| {
                if handled.fetch_add(1, Ordering::SeqCst) + 1 == 3
                    && let Some(token) = token.get()
                {
                    token.cancel();
                }
            })
        };
        let pool = RunningPool::start_with(settings.clone(), hooks).await;
        token.set(pool.shutdown.clone()).expect("token set once");
        tokio::time::timeout(Duration::from_secs(30), pool.shutdown.cancelled())
            .await
            .expect("a replica handled 3 messages within 30 s");
        pool.stop().await;
    }

    // The last replica runs until the entity reaches its last version.
    let pool = RunningPool::start(settings).await;
    let db = env.db().await;
    wait_for("G at its last version", Duration::from_secs(60), || {
        let db = db.clone();
        async move { count(&db, "SELECT coalesce(max(versi), 0) FROM pesanan").await == n }
    })
    .await;
    let dead = drain_dlq(&conn).await;
    let dead_ids: Vec<_> = dead
        .iter()
        .filter_map(|d| d.delivery.properties.message_id().as_ref())
        .map(|id| id.to_string())
        .collect();
    assert!(
        dead_ids.is_empty(),
        "graceful restarts dead-lettered good messages: {dead_ids:?}"
    );
    assert_gapless_in_order(&history(&db).await, 1, n);
    pool.stop().await;
}

/// A replica stopping gracefully while a delivery is still on its way to
/// it: `versions` versions of 4 orders (`<prefix>0`…) queued on one shard,
/// pipelined strict mode (PREFETCH=4, BATCH_MAX=1: while one delivery is
/// handled, the next ones are on their way). The stopping replica reaches
/// the broker through a link that, once it consumes, delays every byte
/// 400 ms each way, so whatever the broker sends it after an ack is still on
/// its way when it stops; it stops itself at its sixth message after that,
/// with a standby waiting. With `db_link`, it reaches the database through
/// that proxy too, which turns away new connections as it stops (its pooled
/// ones keep working; the handover lock needs a new one). Every version must
/// be applied once, in order, none recorded as stale.
async fn hand_over_with_a_delivery_on_its_way(
    env: &TestEnv,
    prefix: &str,
    versions: i64,
    db_link: Option<Arc<crate::proxy::Proxy>>,
) {
    let entities = 4_usize;
    let mut settings = env.settings(1);
    settings.prefetch = 4;
    settings.batch_max = Some(1);
    let conn = urutan::broker::connect(&env.amqp_url().into(), "t")
        .await
        .expect("connect");
    let names = urutan::broker::Names::new("pesanan");
    urutan::broker::topology::declare(&conn, &names, 1, settings.delivery_limit, false)
        .await
        .expect("declare");
    let ids: Vec<String> = (0..entities).map(|e| format!("{prefix}{e}")).collect();
    let msgs: Vec<Msg> = (1..=versions)
        .flat_map(|v| ids.iter().map(move |id| Msg::event(id, v)))
        .collect();
    env.publisher().await.send_all(&msgs).await;

    let broker_link = crate::proxy::Proxy::start(amqp_addr().parse().expect("addr")).await;
    let mut stopping_settings = settings.clone();
    stopping_settings.amqp_url = env
        .amqp_url()
        .with(|u| {
            let _ = u.set_port(Some(broker_link.addr.port()));
        })
        .into();
    if let Some(db_link) = &db_link {
        stopping_settings.database_url = settings.database_url.with(|u| {
            let _ = u.set_port(Some(db_link.addr.port()));
        });
    }
    let token: Arc<OnceLock<CancellationToken>> = Arc::new(OnceLock::new());
    let handled = Arc::new(AtomicUsize::new(0));
    let slow_since = Arc::new(OnceLock::new());
    let hooks = {
        let (token, handled, slow_since, db_link) = (
            token.clone(),
            handled.clone(),
            slow_since.clone(),
            db_link.clone(),
        );
        before_apply(move |_: &Event| {
            let n = handled.fetch_add(1, Ordering::SeqCst) + 1;
            if slow_since
                .get()
                .is_some_and(|&since: &usize| n == since + 6)
                && let Some(token) = token.get()
            {
                if let Some(db_link) = &db_link {
                    db_link.retarget("127.0.0.1:1".parse().expect("addr"));
                }
                token.cancel();
            }
        })
    };
    let stopping = RunningPool::start_with(stopping_settings, hooks).await;
    token
        .set(stopping.shutdown.clone())
        .expect("token set once");
    // The standby registers once the stopping replica consumes.
    wait_for(
        "the stopping replica consumes",
        Duration::from_secs(60),
        || {
            let handled = handled.clone();
            async move { handled.load(Ordering::SeqCst) > 0 }
        },
    )
    .await;
    broker_link.delay(Duration::from_millis(400), Duration::ZERO);
    slow_since
        .set(handled.load(Ordering::SeqCst))
        .expect("set once");
    let standby = RunningPool::start(settings).await;
    tokio::time::timeout(Duration::from_secs(60), stopping.shutdown.cancelled())
        .await
        .expect("the stopping replica handled 6 more messages within 60 s");
    stopping.stop().await;
    if let Some(db_link) = &db_link {
        assert!(
            db_link.unreachable() > 0,
            "the stopping replica never asked for a new database connection (its handover lock)"
        );
    }

    let db = env.db().await;
    wait_for(
        "every order at its last version",
        Duration::from_secs(60),
        || {
            let db = db.clone();
            async move {
                orders_at_version(&db, versions).await == entities
                    && count(&db, "SELECT count(*) FROM urutan_parkir").await == 0
            }
        },
    )
    .await;
    assert_gapless_in_order(&history(&db).await, entities, versions);
    assert_eq!(
        count(&db, "SELECT count(*) FROM urutan_basi").await,
        0,
        "a version reached a worker after a newer one (recorded as stale)"
    );
    standby.stop().await;
}

/// A replica that stops gracefully cancels its consumer once it has handled
/// what arrived, and the standby becomes active at that cancel. A delivery
/// the broker had already sent the stopping replica, still on its way (a
/// slow link; a busy broker), must not be overtaken by the standby: before
/// the fix, it came back to the queue only when the stopping replica closed
/// its channel, behind the next versions the standby had already applied
/// (seen once in CI's fault suite as a lost version after
/// `close_all_connections`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_still_on_its_way_at_a_graceful_handover_is_not_overtaken() {
    let env = TestEnv::new("late_handover").await;
    hand_over_with_a_delivery_on_its_way(&env, "L", 50, None).await;
}

/// The handover lock of shard 0, as a stopping replica takes it (see
/// `urutan::shard::handover`).
const HOLD_SHARD_0: &str = "SELECT pg_advisory_lock(hashtext('urutan-shard-handover'), 0)";

/// A consumer handles nothing while a stopping replica holds the shard's
/// handover lock, and waits for it at most 30 s: a replica whose database
/// link went silent in the middle of its handover (its lock lives until
/// PostgreSQL notices) does not stop the shard for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_waits_for_a_handover_under_way_but_not_forever() {
    let env = TestEnv::new("handover_wait").await;
    let db = env.db().await;
    let mut holder = db.acquire().await.expect("a connection");
    sqlx::query(HOLD_SHARD_0)
        .execute(&mut *holder)
        .await
        .expect("hold the handover lock");
    let started = Instant::now();
    let pool = RunningPool::ready(env.settings(1)).await;
    env.publisher().await.send_all(&[Msg::event("W", 1)]).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        count(&db, "SELECT count(*) FROM pesanan").await,
        0,
        "applied while another replica held the shard's handover lock"
    );
    wait_for(
        "the message applied once the wait gave up",
        Duration::from_secs(60),
        || {
            let db = db.clone();
            async move { count(&db, "SELECT count(*) FROM pesanan_riwayat").await == 1 }
        },
    )
    .await;
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(29),
        "applied after {waited:?}, before the 30 s wait ended, with the lock still held"
    );
    let held: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted
                        AND pid = pg_backend_pid())",
    )
    .fetch_one(&mut *holder)
    .await
    .expect("look at the lock");
    assert!(held, "the lock was still held when the consumer went on");
    holder.close().await.expect("let the lock go");
    pool.stop().await;
}

/// A replica that stops gracefully but cannot take the shard's handover
/// lock (new database connections fail: the database is going away, its
/// pooled connections still work) does not cancel its consumer: it acks what
/// it handled and closes its channel, so a delivery still on its way goes
/// back to the front of the queue before the standby becomes active. No
/// version is overtaken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_cannot_take_the_handover_lock_still_hands_over_in_order() {
    let env = TestEnv::new("handover_nolock").await;
    let db_link = crate::proxy::Proxy::start("127.0.0.1:5432".parse().expect("addr")).await;
    hand_over_with_a_delivery_on_its_way(&env, "N", 40, Some(Arc::new(db_link))).await;
}
