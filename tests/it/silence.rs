//! A silent database link (packets dropped, sockets left open, as a dead NAT
//! or load balancer leaves them): no apply may hang on it. The worker gives a
//! transaction up after `DATABASE_TIMEOUT` + 5 s and retries on a new
//! connection; the server ends the abandoned session (and frees its order's
//! lock) after `DATABASE_TIMEOUT` idle in transaction or in a statement.

use std::time::{Duration, Instant};

use crate::common::*;
use crate::proxy::Proxy;

/// Proxies in front of the local database and broker, and `env`'s settings
/// for `shards` shards pointed through them.
async fn behind_proxies(env: &TestEnv, shards: u16) -> (Proxy, Proxy, urutan::config::Settings) {
    let db_link = Proxy::start("127.0.0.1:5432".parse().expect("addr")).await;
    let broker_link = Proxy::start("127.0.0.1:5672".parse().expect("addr")).await;
    let mut settings = env.settings(shards);
    settings.database_url = settings.database_url.with(|u| {
        let _ = u.set_port(Some(db_link.addr.port()));
    });
    settings.amqp_url = env
        .amqp_url()
        .with(|u| {
            let _ = u.set_port(Some(broker_link.addr.port()));
        })
        .into();
    (db_link, broker_link, settings)
}

/// `versions` versions of `entities` orders (`order-<e>`): every order's v1,
/// then every order's v2, and so on.
fn rounds(entities: usize, versions: i64) -> Vec<Msg> {
    (1..=versions)
        .flat_map(|v| (0..entities).map(move |e| Msg::event(&format!("order-{e}"), v)))
        .collect()
}

/// Publishes the first half of [`rounds`] to `env`'s running pool and
/// waits (at most 30 s) until some of it is applied, then `breaks` a link,
/// publishes the second half and waits (at most `limit`) until every
/// version is applied, each order's in order. Returns how long after the
/// break the last one was applied.
async fn through_a_break(
    env: &TestEnv,
    (entities, versions): (usize, i64),
    limit: Duration,
    breaks: impl FnOnce(),
) -> Duration {
    let events = rounds(entities, versions);
    let publisher = env.publisher().await;
    let db = env.db().await;
    let applied = || async { count(&db, "SELECT count(*) FROM pesanan_riwayat").await };
    publisher.send_all(&events[..events.len() / 2]).await;
    wait_for("some versions applied", Duration::from_secs(30), || async {
        applied().await > 0
    })
    .await;
    breaks();
    let broken = Instant::now();
    publisher.send_all(&events[events.len() / 2..]).await;
    let total = events.len() as i64;
    wait_for("every version applied", limit, || async {
        applied().await == total
    })
    .await;
    let took = broken.elapsed();
    assert_gapless_in_order(&history(&db).await, entities, versions);
    took
}

/// Serial (alone, after the parallel tests): it measures a bound in
/// seconds with a 2 s statement timeout, which the full parallel suite on two
/// cores outlasts again and again (a statement set aside, retried, timed out
/// again: the 60 s wait ran out twice in full runs, never alone).
#[tokio::test]
async fn serial_a_silent_database_link_holds_no_apply_beyond_its_bound() {
    let env = TestEnv::new("silent_db").await;
    let (link, _broker_link, mut settings) = behind_proxies(&env, 2).await;
    settings.database_timeout = Duration::from_secs(2);
    // On a loaded machine a statement can outlast this short timeout
    // (57014): that message is set aside (docs/contract.md section 11) and
    // tried again after RETRY_BACKOFF_MIN, doubling. Retries here come
    // within half a second, so the bound below measures the silence.
    settings.retry_backoff_min = Duration::from_millis(100);
    settings.retry_backoff_max = Duration::from_millis(500);
    let pool = RunningPool::start(settings).await;
    pool.wait_ready().await;

    // Every connection the pool holds goes silent, mid-load, for good.
    let silence = || link.silence_open();
    let took = through_a_break(&env, (10, 40), Duration::from_secs(60), silence).await;
    eprintln!(
        "silent database link, DATABASE_TIMEOUT=2s: everything applied {took:?} after the silence"
    );
    // Bound: the client gives up after 2 + 5 s, the server ends the held
    // session after 2 s; the rest is backoff (at most 5 s) and the work.
    assert!(took < Duration::from_secs(30), "took {took:?}");
    pool.wait_ready().await;
    pool.stop().await;
}

/// Order holds on slow, jittery links to both services (jitter never
/// reorders bytes within a connection, only delays them), and batch mode
/// stays bounded by round trips, not by the link, with a 100 ms database
/// round trip: about 15 per batch of 256. Prints both drain rates.
#[tokio::test]
async fn batch_mode_on_a_slow_database_link() {
    let mut rates = Vec::new();
    for one_way in [Duration::ZERO, Duration::from_millis(50)] {
        let env = TestEnv::new("slow_db").await;
        let (db_link, broker_link, mut settings) = behind_proxies(&env, 4).await;
        settings.prefetch = 256;
        let (entities, versions) = (40, 100);
        let publisher = env.publisher().await;
        // Migrated on the fast link: 43 migrations take about 6 round trips
        // each, 26 s at a 100 ms round trip (measured), which is not what
        // this test is about and outlasted the pool's 30 s readiness wait.
        let db = env.db().await;
        // The pool starts on the slow links; the clock runs from the first
        // publish (so start-up round trips do not count) to the last apply.
        db_link.delay(one_way, one_way / 5);
        broker_link.delay(one_way / 10, one_way / 50);
        let pool = RunningPool::start(settings).await;
        pool.wait_ready().await;
        let events = rounds(entities, versions);
        let chunks_before = db_link.chunks();
        let started = Instant::now();
        publisher.send_all(&events).await;
        let total = events.len() as i64;
        wait_for("the backlog applied", Duration::from_secs(120), || async {
            count(&db, "SELECT count(*) FROM pesanan_riwayat").await == total
        })
        .await;
        let rate = total as f64 / started.elapsed().as_secs_f64();
        assert_gapless_in_order(&history(&db).await, entities, versions);
        let chunks = db_link.chunks() - chunks_before;
        eprintln!(
            "batch mode (PREFETCH=256, 4 shards), database one-way delay {one_way:?}: {rate:.0} msg/s, {chunks} database chunks"
        );
        rates.push(rate);
        db_link.delay(Duration::ZERO, Duration::ZERO);
        broker_link.delay(Duration::ZERO, Duration::ZERO);
        pool.stop().await;
    }
    let ratio = rates[1] / rates[0];
    eprintln!("batch mode with a 100 ms database round trip: {ratio:.2} of its rate without");
    // sqlx sets TCP_NODELAY on its socket (0.9.1), so a batch of up to 256
    // costs a few round trips (BEGIN, one statement, COMMIT), well under a
    // second at 100 ms, whatever the machine. Under sqlx 0.9.0's Nagle a
    // batch went as one statement per 8 KiB (about 15 round trips) and this
    // test measured 700-780 msg/s. The rate without latency is the
    // machine's, so the ratio is not asserted; the round-trip bound is,
    // with room.
    assert!(
        rates[1] > 400.0,
        "{:.0} msg/s with a 100 ms database round trip",
        rates[1]
    );
}

/// Connections to both services reset mid-load (RST/FIN, new ones accepted),
/// on a bandwidth-capped broker link: everything is applied once, in order.
#[tokio::test]
async fn links_cut_under_load_on_a_narrow_broker_link() {
    let env = TestEnv::new("cut_links").await;
    let (db_link, broker_link, settings) = behind_proxies(&env, 3).await;
    broker_link.limit(256 * 1024);
    let pool = RunningPool::start(settings).await;
    pool.wait_ready().await;
    let cut = || {
        db_link.cut_open();
        broker_link.cut_open();
    };
    through_a_break(&env, (12, 30), Duration::from_secs(90), cut).await;
    assert!(
        broker_link.accepted() >= 2,
        "the pool reconnected to the broker"
    );
    pool.wait_ready().await;
    pool.stop().await;
}
