//! Replicas as processes share the shards (docs/contract.md section 13):
//! each `urutan run` is active on its share, a new one takes its share, the
//! shards of one killed or stopped are taken by the others, and nothing is
//! reordered, applied twice or skipped meanwhile. Each test runs a steady
//! stream of events throughout and prints how long shards paused.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgPool;

use crate::common::*;

const SHARDS: u16 = 12;
/// Entities of the stream, and how often each gets its next version.
const ENTITIES: usize = 48;
const EVERY: Duration = Duration::from_millis(300);

/// A replica: `urutan run` named `name`.
fn replica(env: &TestEnv, name: &str) -> UrutanProcess {
    let mut vars = env.process_env(SHARDS);
    vars.push(("REPLICA_NAME", name.to_owned()));
    UrutanProcess::start("run", &vars)
}

/// Per shard, the pid of its one active consumer (from its tag,
/// `urutan-<pid>-<queue>`); a shard with none, or with two active, is absent.
fn active_by_shard(env: &TestEnv) -> BTreeMap<u16, u32> {
    let out = sh(
        "rabbitmqctl",
        &[
            "-q",
            "list_consumers",
            "-p",
            &env.vhost,
            "queue_name",
            "consumer_tag",
            "active",
            "--formatter",
            "json",
        ],
    );
    let rows: Vec<Value> = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let mut active: BTreeMap<u16, Vec<u32>> = BTreeMap::new();
    for row in rows.iter().filter(|r| r["active"] == true) {
        let queue = row["queue_name"].as_str().unwrap_or_default();
        let Some(shard) = queue
            .strip_prefix("pesanan.shard-")
            .and_then(|s| s.parse().ok())
        else {
            continue;
        };
        let pid = row["consumer_tag"]
            .as_str()
            .and_then(|t| t.strip_prefix("urutan-"))
            .and_then(|t| t.split('-').next())
            .and_then(|p| p.parse().ok());
        if let Some(pid) = pid {
            active.entry(shard).or_default().push(pid);
        }
    }
    active
        .into_iter()
        .filter(|(_, pids)| pids.len() == 1)
        .map(|(shard, pids)| (shard, pids[0]))
        .collect()
}

/// Waits (at most `limit`) until every shard has one active consumer, each
/// of `pids` on its share (⌊N/R⌋ or ⌈N/R⌉: 4 each for 3 replicas, well
/// within the 3 to 5 asked for) and no other process on any; returns the
/// placement and how long it took.
async fn wait_shared(
    env: &TestEnv,
    pids: &[u32],
    limit: Duration,
) -> (BTreeMap<u16, u32>, Duration) {
    let start = Instant::now();
    let want: BTreeSet<u32> = pids.iter().copied().collect();
    let n = usize::from(SHARDS);
    let share = n / pids.len()..=n.div_ceil(pids.len());
    loop {
        let active = active_by_shard(env);
        let mut per: BTreeMap<u32, usize> = BTreeMap::new();
        for pid in active.values() {
            *per.entry(*pid).or_default() += 1;
        }
        let shared = active.len() == usize::from(SHARDS)
            && per.keys().copied().collect::<BTreeSet<_>>() == want
            && per.values().all(|k| share.contains(k));
        if shared {
            return (active, start.elapsed());
        }
        assert!(
            start.elapsed() < limit,
            "after {limit:?}, not every shard active on one of {pids:?} with {share:?} each: {active:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The database's clock.
async fn db_now(db: &PgPool) -> DateTime<Utc> {
    sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(db)
        .await
        .expect("now")
}

/// Per shard, its longest pause since `since`: the longest time between
/// two of its applies (or from its last apply to now) ending after `since`.
async fn pauses(db: &PgPool, since: DateTime<Utc>) -> BTreeMap<u16, f64> {
    let rows: Vec<(i32, f64)> = sqlx::query_as(
        "WITH g AS (
            SELECT shard, diterapkan_pada AS at,
                   lag(diterapkan_pada) OVER (PARTITION BY shard ORDER BY seq) AS prev
            FROM pesanan_riwayat)
         SELECT shard, extract(epoch FROM max(gap))::float8 FROM (
             SELECT shard, at - coalesce(prev, at) AS gap FROM g WHERE at > $1
             UNION ALL
             SELECT shard, clock_timestamp() - max(at) FROM g GROUP BY shard) p
         GROUP BY shard",
    )
    .bind(since)
    .fetch_all(db)
    .await
    .expect("pauses");
    rows.into_iter()
        .map(|(s, gap)| (u16::try_from(s).expect("shard"), gap))
        .collect()
}

/// The longest pause among `shards`.
fn longest(pauses: &BTreeMap<u16, f64>, shards: impl Iterator<Item = u16>) -> f64 {
    shards
        .filter_map(|s| pauses.get(&s).copied())
        .fold(0.0, f64::max)
}

/// Shards of `placement` on `pid`, and on any other process.
fn split(placement: &BTreeMap<u16, u32>, pid: u32) -> (Vec<u16>, Vec<u16>) {
    let (on, off): (Vec<_>, Vec<_>) = placement.iter().partition(|(_, p)| **p == pid);
    (
        on.into_iter().map(|(s, _)| *s).collect(),
        off.into_iter().map(|(s, _)| *s).collect(),
    )
}

/// Stops the stream and checks the outcome: every version applied once,
/// in order, nothing dead-lettered, `urutan verify` clean.
async fn stop_and_check(env: &TestEnv, db: &PgPool, stream: Stream) {
    let last = stream.stop().await;
    let total = ENTITIES as i64 * last;
    wait_applied(db, total, Duration::from_secs(60)).await;
    assert_gapless_in_order(&history(db).await, ENTITIES, last);
    let conn = env.broker().await;
    assert!(drain_dlq(&conn).await.is_empty(), "nothing dead-lettered");
    let report = urutan_ops::verify::verify(db, Some(0))
        .await
        .expect("verify");
    assert!(report.passed(), "urutan verify: {report}");
    eprintln!("{total} versions applied once, in order ({ENTITIES} orders x {last})");
}

/// Three replicas started one after another share 12 shards; one killed
/// (kill -9) loses its shards to the survivors within 30 s, theirs never
/// pausing over 5 s; a new one takes its share; one stopped with SIGTERM
/// exits 0 and the others cover everything within 20 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_share_the_shards_through_kills_joins_and_stops() {
    let env = TestEnv::new("replicas_share").await;
    let mut r1 = replica(&env, "r1");
    r1.wait_ready().await;
    let db = env.db().await;
    let stream = Stream::start(&env, ENTITIES, EVERY).await;
    let mut r2 = replica(&env, "r2");
    r2.wait_ready().await;
    let mut r3 = replica(&env, "r3");
    r3.wait_ready().await;
    let pids = [r1.process.pid, r2.process.pid, r3.process.pid];
    let (placement, took) = wait_shared(&env, &pids, Duration::from_secs(60)).await;
    eprintln!("3 replicas share 12 shards {took:?} after the third started: {placement:?}");

    // kill -9 of r2: the survivors take its shards within 30 s.
    let (moved, kept) = split(&placement, r2.process.pid);
    let killed_at = db_now(&db).await;
    let start = Instant::now();
    r2.kill().await;
    let (placement, _) = wait_shared(
        &env,
        &pids[..1]
            .iter()
            .chain(&pids[2..])
            .copied()
            .collect::<Vec<_>>(),
        Duration::from_secs(30),
    )
    .await;
    let took = start.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let p = pauses(&db, killed_at).await;
    let (moved_pause, kept_pause) = (
        longest(&p, moved.iter().copied()),
        longest(&p, kept.iter().copied()),
    );
    eprintln!(
        "kill -9: shards {moved:?} taken over after {took:?}; longest pause {moved_pause:.1} s \
         on them, {kept_pause:.1} s on the survivors' own"
    );
    assert!(
        kept_pause <= 5.0,
        "a survivor's own shard paused {kept_pause:.1} s (> 5 s) after the kill: {p:?}"
    );

    // A new replica takes its share (3 to 5) within 60 s.
    let joined_at = db_now(&db).await;
    let start = Instant::now();
    let mut r4 = replica(&env, "r4");
    let pids = [r1.process.pid, r3.process.pid, r4.process.pid];
    let (after_join, _) = wait_shared(&env, &pids, Duration::from_secs(60)).await;
    let took = start.elapsed();
    r4.wait_ready().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let p = pauses(&db, joined_at).await;
    let (taken, untouched) = split(&after_join, r4.process.pid);
    let untouched: Vec<u16> = untouched
        .into_iter()
        .filter(|s| placement.get(s) == after_join.get(s))
        .collect();
    let (taken_pause, untouched_pause) = (
        longest(&p, taken.iter().copied()),
        longest(&p, untouched.iter().copied()),
    );
    eprintln!(
        "join: r4 active on {taken:?} after {took:?}; longest pause {taken_pause:.1} s on them, \
         {untouched_pause:.1} s on the shards that stayed"
    );
    assert!(
        untouched_pause <= 5.0,
        "a shard that stayed paused {untouched_pause:.1} s: {p:?}"
    );
    assert_eq!(
        untouched.len() + taken.len(),
        usize::from(SHARDS),
        "only shards given to the new replica moved: {placement:?} -> {after_join:?}"
    );

    // SIGTERM of r1: exits 0, the others cover all 12 within 20 s.
    let (given, stayed) = split(&after_join, r1.process.pid);
    let left_at = db_now(&db).await;
    let start = Instant::now();
    r1.sigterm();
    let status = r1.wait_exit(Duration::from_secs(20)).await;
    assert!(status.success(), "SIGTERM: {status}\n{}", r1.log());
    let exit_took = start.elapsed();
    let pids = [r3.process.pid, r4.process.pid];
    loop {
        let active = active_by_shard(&env);
        if active.len() == usize::from(SHARDS) && active.values().all(|p| pids.contains(p)) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "20 s after SIGTERM, not every shard on r3 or r4: {active:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let cover_took = start.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let p = pauses(&db, left_at).await;
    let (given_pause, stayed_pause) = (
        longest(&p, given.iter().copied()),
        longest(&p, stayed.iter().copied()),
    );
    eprintln!(
        "SIGTERM: r1 exited after {exit_took:?}, its shards {given:?} covered after {cover_took:?}; \
         longest pause {given_pause:.1} s on them, {stayed_pause:.1} s on the others"
    );
    assert!(
        stayed_pause <= 5.0,
        "a shard that stayed paused {stayed_pause:.1} s: {p:?}"
    );

    stop_and_check(&env, &db, stream).await;
    r3.stop().await;
    r4.stop().await;
}

/// A rolling restart of 3 replicas, one pod at a time (surge 1, unavailable
/// 0): start a fourth, SIGTERM an old one, and again, under a steady
/// stream. No shard idles more than a few seconds, nothing is reordered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_pauses_no_shard_long_and_reorders_nothing() {
    let env = TestEnv::new("replicas_roll").await;
    let mut old = Vec::new();
    for name in ["a1", "a2", "a3"] {
        let mut r = replica(&env, name);
        r.wait_ready().await;
        old.push(r);
    }
    let db = env.db().await;
    let pids: Vec<u32> = old.iter().map(|r| r.process.pid).collect();
    wait_shared(&env, &pids, Duration::from_secs(60)).await;
    let stream = Stream::start(&env, ENTITIES, EVERY).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rolled_at = db_now(&db).await;
    let mut new = Vec::new();
    let mut live = pids;
    for (i, mut gone) in old.into_iter().enumerate() {
        let mut r = replica(&env, &format!("b{}", i + 1));
        r.wait_ready().await;
        live.push(r.process.pid);
        // The new pod is ready once its shards' consumers are registered;
        // it becomes active on them once their old owner handed them over.
        tokio::time::sleep(Duration::from_secs(2)).await;
        gone.sigterm();
        let status = gone.wait_exit(Duration::from_secs(30)).await;
        assert!(status.success(), "SIGTERM: {status}\n{}", gone.log());
        live.retain(|p| *p != gone.process.pid);
        let (_, took) = wait_shared(&env, &live, Duration::from_secs(30)).await;
        eprintln!(
            "rolled {} -> b{}: shared again {took:?} after the old one exited",
            i + 1,
            i + 1
        );
        new.push(r);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let p = pauses(&db, rolled_at).await;
    let worst = p.values().copied().fold(0.0, f64::max);
    eprintln!("rolling restart: longest pause per shard (s): {p:?}");
    assert!(
        worst <= 5.0,
        "a shard idled {worst:.1} s during the rolling restart"
    );
    stop_and_check(&env, &db, stream).await;
    for r in new {
        r.stop().await;
    }
}
