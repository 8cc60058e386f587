//! Several broker nodes in `AMQP_URL` (docs/contract.md, section 5): every
//! connection goes to a live node, and a process whose node dies moves on to
//! another. The "nodes" here are TCP proxies in front of the one local broker,
//! so a node can die (reset), freeze (accept, never answer) or go silent
//! (blackhole) on demand.

use std::time::Duration;

use urutan::config::BrokerUrls;

use crate::common::*;
use crate::proxy::{Mode, Proxy};

const BROKER: &str = "127.0.0.1:5672";

/// `env`'s broker URL with another port.
fn url_on(env: &TestEnv, port: u16) -> String {
    env.amqp_url()
        .with(|u| {
            let _ = u.set_port(Some(port));
        })
        .expose()
        .to_owned()
}

fn nodes(urls: &[String]) -> BrokerUrls {
    urls.join(",").parse().expect("node list")
}

#[tokio::test]
async fn a_dead_or_frozen_node_is_skipped() {
    let env = TestEnv::new("nodes_skip").await;
    // Dead: nothing listens. Frozen: TCP accepted, the handshake never answered.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let dead_port = dead.local_addr().expect("addr").port();
    drop(dead);
    let frozen = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let frozen_port = frozen.local_addr().expect("addr").port();
    let held = tokio::spawn(async move {
        let mut sockets = Vec::new();
        while let Ok((socket, _)) = frozen.accept().await {
            sockets.push(socket);
        }
    });
    let live = Proxy::start(BROKER.parse().expect("addr")).await;
    let list = nodes(&[
        url_on(&env, dead_port),
        url_on(&env, frozen_port),
        url_on(&env, live.addr.port()),
    ]);
    // Whatever node the process starts at, each connect ends on the live one.
    for round in 0..3 {
        let conn = tokio::time::timeout(
            Duration::from_secs(20),
            urutan::broker::connect(&list, "nodes-test"),
        )
        .await
        .unwrap_or_else(|_| panic!("round {round}: connect took over 20 s"))
        .unwrap_or_else(|e| panic!("round {round}: no live node found: {e}"));
        assert!(conn.status().connected());
        assert_eq!(
            live.accepted(),
            round + 1,
            "round {round} went through the live node"
        );
        let _ = urutan::broker::call("connection.close", conn.close(200, "done".into())).await;
    }
    // No live node at all: an error that names a node, password redacted.
    let none = nodes(&[url_on(&env, dead_port)]);
    let err = urutan::broker::connect(&none, "nodes-test")
        .await
        .expect_err("nothing listens")
        .to_string();
    assert!(!err.contains("guest:guest"), "{err}");
    held.abort();
}

/// A pool connected through one node keeps going through another when that
/// node dies under load, and order per order holds.
#[tokio::test]
async fn the_pool_moves_to_another_node_when_its_node_dies() {
    let env = TestEnv::new("nodes_failover").await;
    let node_a = Proxy::start(BROKER.parse().expect("addr")).await;
    let node_b = Proxy::start(BROKER.parse().expect("addr")).await;
    let mut settings = env.settings(4);
    settings.amqp_url = nodes(&[
        url_on(&env, node_a.addr.port()),
        url_on(&env, node_b.addr.port()),
    ]);
    let pool = RunningPool::start(settings).await;
    pool.wait_ready().await;

    let (entities, versions) = (20, 30);
    let publisher = env.publisher().await;
    let first: Vec<Msg> = (1..=versions / 2)
        .flat_map(|v| (0..entities).map(move |e| Msg::event(&format!("order-{e}"), v)))
        .collect();
    publisher.send_all(&first).await;

    let (used, other) = if node_a.open() > 0 {
        (&node_a, &node_b)
    } else {
        (&node_b, &node_a)
    };
    assert!(
        used.open() > 0 && other.open() == 0,
        "the pool uses one node"
    );
    used.reset();

    let rest: Vec<Msg> = (versions / 2 + 1..=versions)
        .flat_map(|v| (0..entities).map(move |e| Msg::event(&format!("order-{e}"), v)))
        .collect();
    publisher.send_all(&rest).await;

    let db = env.db().await;
    let expected = (entities * versions as usize) as i64;
    wait_for("every version applied", Duration::from_secs(60), || {
        let db = db.clone();
        async move { count(&db, "SELECT count(*) FROM pesanan_riwayat").await == expected }
    })
    .await;
    assert_gapless_in_order(&history(&db).await, entities, versions);
    assert!(
        other.open() > 0,
        "the pool reconnected through the other node"
    );
    pool.wait_ready().await;
    let (_, scrape) = http_get(pool.http, "/metrics").await;
    assert!(metric_sum(&scrape, "urutan_broker_reconnects_total", &[]) >= 1.0);
    pool.stop().await;
}

/// The broker link of the active replica goes silent (no FIN, no RST): with
/// `AMQP_HEARTBEAT=2` both sides give it up after about two heartbeats, the
/// silent replica stops renewing its lease, and the standby (one shard, two
/// replicas: the second is placed on nothing) takes the shard over when the
/// lease runs out; the silent replica applies nothing after that, and order
/// per order holds.
#[tokio::test]
async fn a_blackholed_replica_is_given_up_and_a_standby_takes_over() {
    use std::sync::{Arc, Mutex};
    use std::time::Instant;
    use urutan::shard::Hooks;

    let env = TestEnv::new("nodes_blackhole").await;
    let link = Proxy::start(BROKER.parse().expect("addr")).await;
    let heartbeat = 2u16;
    let outcomes = |log: &Arc<Mutex<Vec<Instant>>>| {
        let log = log.clone();
        Hooks {
            on_outcome: Some(Arc::new(move |_| {
                log.lock().expect("log").push(Instant::now())
            })),
            ..Hooks::default()
        }
    };
    let (silent_log, standby_log) = (Arc::default(), Arc::default());
    let mut silent = env.settings(1);
    silent.amqp_url = nodes(&[url_on(&env, link.addr.port())]);
    silent.amqp_heartbeat = heartbeat;
    let silent = RunningPool::start_with(silent, outcomes(&silent_log)).await;
    silent.wait_ready().await;
    let mut standby = env.settings(1);
    standby.amqp_heartbeat = heartbeat;
    let standby = RunningPool::start_with(standby, outcomes(&standby_log)).await;
    standby.wait_ready().await;

    let (entities, versions) = (10, 20);
    let batch = |range: std::ops::RangeInclusive<i64>| -> Vec<Msg> {
        range
            .flat_map(|v| (0..entities).map(move |e| Msg::event(&format!("order-{e}"), v)))
            .collect()
    };
    let publisher = env.publisher().await;
    publisher.send_all(&batch(1..=versions / 2)).await;
    let db = env.db().await;
    let applied = |n: i64| {
        let db = db.clone();
        move || {
            let db = db.clone();
            async move { count(&db, "SELECT count(*) FROM pesanan_riwayat").await == n }
        }
    };
    let half = (entities * versions as usize / 2) as i64;
    wait_for(
        "the first half applied",
        Duration::from_secs(30),
        applied(half),
    )
    .await;
    assert!(
        standby_log.lock().expect("log").is_empty(),
        "the standby was idle"
    );

    let silenced = Instant::now();
    link.set(Mode::Blackhole);
    publisher
        .send_all(&batch(versions / 2 + 1..=versions))
        .await;
    let http = silent.http;
    wait_for(
        "the silent replica's /readyz 503",
        Duration::from_secs(20),
        || async move { http_get(http, "/readyz").await.0 == 503 },
    )
    .await;
    let noticed = silenced.elapsed();
    wait_for(
        "every version applied",
        Duration::from_secs(60),
        applied(2 * half),
    )
    .await;
    let taken_over = silenced.elapsed();
    eprintln!(
        "blackhole with heartbeat {heartbeat} s: noticed after {noticed:?}, all applied after {taken_over:?}"
    );
    let bound = Duration::from_secs(u64::from(heartbeat) * 3 + 2);
    assert!(
        noticed <= bound,
        "noticed after {noticed:?}, bound {bound:?}"
    );

    let last_silent = *silent_log
        .lock()
        .expect("log")
        .last()
        .expect("silent applied the first half");
    let first_standby = *standby_log
        .lock()
        .expect("log")
        .first()
        .expect("standby took over");
    assert!(
        last_silent < first_standby,
        "the silent replica applied a message after the standby took over"
    );
    assert_gapless_in_order(&history(&db).await, entities, versions);
    link.set(Mode::Pass);
    silent.stop().await;
    standby.stop().await;
}
