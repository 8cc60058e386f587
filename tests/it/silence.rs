//! A silent database link (packets dropped, sockets left open, as a dead NAT
//! or load balancer leaves them): no apply may hang on it. The worker gives a
//! transaction up after `DATABASE_TIMEOUT` + 5 s and retries on a new
//! connection; the server ends the abandoned session (and frees its order's
//! lock) after `DATABASE_TIMEOUT` idle in transaction or in a statement.

use std::time::{Duration, Instant};

use crate::common::*;
use crate::proxy::Proxy;

#[tokio::test]
async fn a_silent_database_link_holds_no_apply_beyond_its_bound() {
    let env = TestEnv::new("silent_db").await;
    let link = Proxy::start("127.0.0.1:5432".parse().expect("addr")).await;
    let mut settings = env.settings(2);
    settings.database_url = settings.database_url.with(|u| {
        let _ = u.set_port(Some(link.addr.port()));
    });
    settings.database_timeout = Duration::from_secs(2);
    let pool = RunningPool::start(settings).await;
    pool.wait_ready().await;

    let (entities, versions) = (10, 40);
    let publisher = env.publisher().await;
    let events: Vec<Msg> = (1..=versions)
        .flat_map(|v| (0..entities).map(move |e| Msg::event(&format!("order-{e}"), v)))
        .collect();
    let db = env.db().await;
    let applied = || async { count(&db, "SELECT count(*) FROM pesanan_riwayat").await };
    publisher.send_all(&events[..events.len() / 2]).await;
    wait_for("some versions applied", Duration::from_secs(30), || async {
        applied().await > 0
    })
    .await;
    // Every connection the pool holds goes silent, mid-load, for good.
    link.silence_open();
    let silenced = Instant::now();
    publisher.send_all(&events[events.len() / 2..]).await;
    let total = events.len() as i64;
    wait_for("every version applied", Duration::from_secs(60), || async {
        applied().await == total
    })
    .await;
    let took = silenced.elapsed();
    eprintln!(
        "silent database link, DATABASE_TIMEOUT=2s: everything applied {took:?} after the silence"
    );
    assert_gapless_in_order(&history(&db).await, entities, versions);
    // Bound: the client gives up after 2 + 5 s, the server ends the held
    // session after 2 s; the rest is backoff (at most 5 s) and the work.
    assert!(took < Duration::from_secs(30), "took {took:?}");
    pool.wait_ready().await;
    pool.stop().await;
}
