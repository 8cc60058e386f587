//! Issue 29, item 3: one shard's broken connection stays on its shard. Each
//! shard consumes on a connection of its own; force-closing one of them
//! (as a frame the client cannot parse would) makes only that shard
//! reconnect: the others' in-flight deliveries are never returned, so
//! their `x-delivery-count` never rises toward the delivery limit.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use urutan::message::Event;
use urutan::outcome::Outcome;
use urutan::shard::{Hooks, Observed};

use crate::common::*;

const CLOSED_SHARD: u16 = 1;

/// The connection (pid and client properties) consuming `queue` in `vhost`,
/// if a consumer is registered.
async fn consumer_connection(vhost: &str, queue: &str) -> Option<(String, String)> {
    let own = |v: &[&str]| -> Vec<String> {
        ["-q", "-s"]
            .iter()
            .chain(v)
            .map(|s| (*s).to_owned())
            .collect()
    };
    let consumers = ctl(own(&[
        "list_consumers",
        "-p",
        vhost,
        "queue_name",
        "channel_pid",
    ]))
    .await;
    let channel = consumers.lines().find_map(|line| {
        let (name, pid) = line.split_once('\t')?;
        (name == queue).then(|| pid.trim().to_owned())
    })?;
    let channels = ctl(own(&["list_channels", "-p", vhost, "pid", "connection"])).await;
    let connection = channels.lines().find_map(|line| {
        let (pid, conn) = line.split_once('\t')?;
        (pid == channel).then(|| conn.trim().to_owned())
    })?;
    let connections = ctl(own(&["list_connections", "pid", "client_properties"])).await;
    connections.lines().find_map(|line| {
        let (pid, props) = line.split_once('\t')?;
        (pid == connection).then(|| (connection.clone(), props.to_owned()))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_one_shards_connection_leaves_the_other_shards_alone() {
    let env = TestEnv::new("shard_isolation").await;
    // Every call of the handler per message id, and every outcome with its shard.
    let handled: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let outcomes: Arc<Mutex<Vec<(u16, String, Outcome)>>> = Arc::default();
    let hooks = {
        let (handled, outcomes) = (handled.clone(), outcomes.clone());
        Hooks {
            // Slow enough that every shard always has a delivery in flight.
            before_apply: Some(Arc::new(move |ev: &Event| {
                *handled
                    .lock()
                    .expect("handled")
                    .entry(ev.message_id.clone())
                    .or_default() += 1;
                tokio::task::block_in_place(|| std::thread::sleep(Duration::from_millis(15)));
            })),
            on_outcome: Some(Arc::new(move |o: &Observed<'_>| {
                outcomes.lock().expect("outcomes").push((
                    o.shard,
                    o.message_id.unwrap_or_default().to_owned(),
                    o.outcome,
                ));
            })),
        }
    };
    let shards = 4;
    let pool = RunningPool::start_with(env.settings(shards), hooks).await;
    pool.wait_ready().await;

    let (entities, versions) = (40, 80);
    let msgs: Vec<Msg> = (1..=versions)
        .flat_map(|v| (0..entities).map(move |e| Msg::event(&format!("order-{e}"), v)))
        .collect();
    env.publisher().await.send_all(&msgs).await;

    // Close the shard's connection five times, each once its consumer is back.
    let queue = format!("pesanan.shard-{CLOSED_SHARD:03}");
    let (mut closed, mut names) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let started = std::time::Instant::now();
        let (pid, props) = loop {
            match consumer_connection(&env.vhost, &queue).await {
                Some((pid, props)) if !closed.contains(&pid) => break (pid, props),
                _ => {}
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "no new consumer on {queue} within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        ctl(vec![
            "-q".into(),
            "close_connection".into(),
            pid.clone(),
            "test: one shard's connection".into(),
        ])
        .await;
        closed.push(pid);
        names.push(props);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    let so_far = outcomes.lock().expect("outcomes").len();
    assert!(
        so_far < entities * versions as usize,
        "the closes came while messages were still flowing ({so_far} handled)"
    );

    let db = env.db().await;
    let total = (entities * versions as usize) as i64;
    wait_for("every version applied", Duration::from_secs(120), || {
        let db = db.clone();
        async move { count(&db, "SELECT count(*) FROM pesanan_riwayat").await == total }
    })
    .await;
    assert_gapless_in_order(&history(&db).await, entities, versions);

    let outcomes = outcomes.lock().expect("outcomes").clone();
    let handled = handled.lock().expect("handled").clone();
    let mut by_shard: HashMap<u16, usize> = HashMap::new();
    for (shard, message_id, outcome) in &outcomes {
        *by_shard.entry(*shard).or_default() += 1;
        if *shard == CLOSED_SHARD {
            continue;
        }
        assert_eq!(
            *outcome,
            Outcome::Applied,
            "shard {shard}: {message_id} was {outcome:?} (redelivered?)"
        );
        assert_eq!(
            handled.get(message_id).copied(),
            Some(1),
            "shard {shard}: {message_id} handled more than once (redelivered)"
        );
    }
    assert_eq!(
        by_shard.len(),
        usize::from(shards),
        "every shard had messages"
    );

    for props in &names {
        assert!(
            props.contains(&format!("\"urutan run {queue}\"")),
            "the connection names its shard: {props}"
        );
    }

    let conn = env.broker().await;
    let dead = drain_dlq(&conn).await;
    assert!(dead.is_empty(), "{} message(s) dead-lettered", dead.len());
    let _ = urutan::broker::call("connection.close", conn.close(200, "".into())).await;
    pool.wait_ready().await;
    let (_, scrape) = http_get(pool.http, "/metrics").await;
    // The metrics recorder is the test process's, shared by every in-process
    // pool of the suite: the empty DLQ above is this test's dead-letter
    // check; the reconnects below are a lower bound, so others only add.
    let reconnects = metric_sum(&scrape, "urutan_broker_reconnects_total", &[]);
    assert!(
        reconnects >= 5.0,
        "urutan_broker_reconnects_total {reconnects}"
    );
    pool.stop().await;
}
