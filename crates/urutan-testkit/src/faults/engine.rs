//! The fault-injection run: a fleet of real `urutan run` / `urutan relay` /
//! `urutan effects` processes (effects to a payment endpoint served here), a continuous workload, faults one after another at random
//! moments (seeded), recovery measured after each, then a drain and the
//! invariant checks. Shared by `benches/faults.rs` (the soak) and
//! `tests/faults.rs` (the CI variant).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::{DateTime, Utc};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::faults::fleet::{Fleet, FleetConfig};
use crate::faults::inject::{Ctx, Kind, Then, inject};
use crate::faults::links::{DbName, Links};
use crate::faults::report::{DirectSummary, FaultRecord, MixSummary, RunReport, summarize};
use crate::faults::services::Services;
use crate::faults::workload::{DirectLedger, Ledger, mix, produce, produce_direct};
use crate::scratch::Scratch;

/// How a run goes.
#[derive(Debug, Clone)]
pub struct Options {
    /// Faults to inject: every kind once (shuffled), then random kinds.
    pub faults: usize,
    /// The kinds to draw from: [`Kind::ALL`] on one broker (plus
    /// [`Kind::PAIR`] on a database pair), [`Kind::CLUSTER`] on the
    /// three-node cluster. A kind listed twice is drawn twice as often.
    pub kinds: Vec<Kind>,
    /// Versions per second the direct producer publishes straight to the
    /// hash exchange (0: none), over `direct_entities` orders of its own.
    pub direct_rate: u32,
    pub direct_entities: usize,
    pub seed: u64,
    pub shards: u16,
    /// How successive worker replicas consume (PREFETCH, BATCH_MAX), cycled.
    pub consume: Vec<crate::faults::fleet::Consume>,
    pub entities: usize,
    /// Events per second written through the outbox.
    pub rate: u32,
    pub handler_delay_ms: u64,
    /// Pause before each fault, in ms (random in this range).
    pub gap_ms: (u64, u64),
    /// Database stop length, in seconds (random in this range).
    pub db_stop_secs: (u64, u64),
    /// How long after a fault's end processing may take to resume before
    /// the fault counts as not recovered.
    pub recovery_limit: Duration,
    /// Where the processes' logs go.
    pub log_dir: PathBuf,
    /// The holds soak ([`crate::faults::holds`]): a handler that asks to
    /// retry or refuses, `ON_REFUSED=hold`, `GAP_POLICY=wait` with versions
    /// written out of order, an operator, and the "nothing waits" checks.
    pub holds: bool,
}

/// The faults in injection order: each kind once (so a short run covers
/// them all), then uniformly random kinds.
pub fn plan(faults: usize, kinds: &[Kind], rng: &mut StdRng) -> Vec<Kind> {
    let mut first = kinds.to_vec();
    first.shuffle(rng);
    first.truncate(faults);
    let rest = faults.saturating_sub(first.len());
    first.extend((0..rest).map(|_| kinds[rng.random_range(0..kinds.len())]));
    first
}

/// Runs the whole thing against `services` and reports (an `Err` only when
/// the run could not be set up or checked at all).
pub async fn run(services: &Services, opts: &Options) -> anyhow::Result<RunReport> {
    let started = Utc::now();
    let clock = Instant::now();
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let plan = plan(opts.faults, &opts.kinds, &mut rng);
    // Pair mode: everything reaches the database through its name (dropped
    // after `env`, whose database it drops through the name).
    let db_name = match &services.pair {
        Some(_) => Some(DbName::start(services).await?),
        None => None,
    };
    let services = &match &db_name {
        Some(name) => name.services(services),
        None => services.clone(),
    };
    let _restarter = services.restarter();
    let _binary = crate::faults::procs::freeze_binary()?;
    let tag = format!("{}_{:x}", std::process::id(), opts.seed & 0xff_ffff);
    let env: Scratch = services.scratch(&tag).await?;
    std::fs::create_dir_all(&opts.log_dir).context("create the log directory")?;
    let db = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(5))
        .connect_lazy(env.database_url().expose())?;
    let payee = crate::faults::payee::Payee::start().await?;
    if opts.holds {
        // Installed before any worker starts (it checks HANDLER_FUNCTION).
        urutan::store::prepare(&env.database_url(), 1)
            .await?
            .close()
            .await;
        sqlx::raw_sql(crate::faults::holds::HANDLER)
            .execute(&db)
            .await?;
    }
    // One broker: the fleet's links go through proxies (the wire faults).
    let links = match services.cluster {
        None => Some(Links::start(&env.amqp_urls(), env.database_url().expose()).await?),
        Some(_) => None,
    };
    let (amqp_url, database_url) = match &links {
        Some(links) => links.urls(&env.amqp_urls(), env.database_url().expose())?,
        None => (env.amqp_urls(), env.database_url().expose().to_owned()),
    };
    let mut fleet = Fleet::new(FleetConfig {
        amqp_url,
        database_url,
        shards: opts.shards,
        consume: opts.consume.clone(),
        handler_delay_ms: opts.handler_delay_ms,
        effects_url: payee.url.clone(),
        worker_env: if opts.holds {
            crate::faults::holds::worker_env()
        } else {
            Vec::new()
        },
        log_dir: opts.log_dir.clone(),
    });
    fleet.heal(&mut rng).await?;

    let stop = CancellationToken::new();
    let written = Arc::new(AtomicU64::new(0));
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let producer = tokio::spawn(produce(
        db.clone(),
        opts.entities,
        opts.rate,
        opts.seed ^ 1,
        opts.holds,
        written.clone(),
        stop.clone(),
    ));
    let operator_stop = CancellationToken::new();
    let operator = Arc::new(Mutex::new(crate::faults::holds::Operator::default()));
    let operating = opts.holds.then(|| {
        tokio::spawn(crate::faults::holds::operate(
            crate::faults::holds::Urls::of(&env, opts.shards),
            db.clone(),
            30,
            operator.clone(),
            operator_stop.clone(),
        ))
    });
    let mixer = tokio::spawn(mix(
        env.amqp_urls(),
        db.clone(),
        opts.entities,
        opts.seed ^ 2,
        ledger.clone(),
        stop.clone(),
    ));
    let direct_ledger = Arc::new(Mutex::new(DirectLedger::default()));
    let direct = (opts.direct_rate > 0).then(|| {
        tokio::spawn(produce_direct(
            env.amqp_urls(),
            opts.direct_entities,
            opts.direct_rate,
            opts.seed ^ 3,
            direct_ledger.clone(),
            stop.clone(),
        ))
    });
    tokio::time::sleep(Duration::from_secs(3)).await;

    let mut faults = Vec::new();
    let mut seq_marks = Vec::new();
    let planned = plan.len();
    let budget = time_budget()?;
    let mut cut_short = None;
    for (index, kind) in plan.into_iter().enumerate() {
        if budget.is_some_and(|b| clock.elapsed() >= b) {
            eprintln!("[faults] time budget spent: {index} of {planned} faults injected");
            cut_short = Some(format!(
                " The run's time budget (FAULTS_BUDGET_MIN) ended it after {index} of the {planned} planned faults."
            ));
            break;
        }
        let gap = rng.random_range(opts.gap_ms.0..=opts.gap_ms.1);
        tokio::time::sleep(Duration::from_millis(gap)).await;
        let mut violations = Vec::new();
        if let Err(e) = fleet.heal(&mut rng).await {
            violations.push(format!("fleet not healthy before the fault: {e:#}"));
        }
        let settled = settle(&env.amqp_urls(), &db, opts, SETTLE_LIMIT).await;
        seq_marks.push(max_seq(&db).await);
        let fault_start = Utc::now();
        eprintln!("[faults] #{index} {} ...", kind.label());
        let cx = Ctx {
            services,
            env: &env,
            fleet: &mut fleet,
            db: &db,
            rng: &mut rng,
            db_stop_secs: opts.db_stop_secs,
            payee: &payee,
            links: links.as_ref(),
            db_name: db_name.as_ref(),
        };
        let (ended, mut detail, then) = match inject(kind, cx).await {
            Ok(done) => {
                violations.extend(done.violation);
                (done.ended, done.detail, done.then)
            }
            Err(e) => {
                violations.push(format!("injection failed: {e:#}"));
                (Utc::now(), "injection failed".into(), None)
            }
        };
        let amqp = env.amqp_urls();
        let (recovery, e2e) = measure_recovery(
            &amqp,
            &db,
            index,
            seq_marks[index],
            ended,
            opts.recovery_limit,
        )
        .await;
        if recovery.is_none() || e2e.is_none() {
            violations.push(format!(
                "not processing again within {:?}",
                opts.recovery_limit
            ));
        }
        match then {
            Some(Then::RestartNode(node)) => {
                let t = Instant::now();
                match services.cluster(&["restart", &node]).await {
                    Ok(_) => {
                        detail += &format!(", {node} back in {:.0} s", t.elapsed().as_secs_f64());
                    }
                    Err(e) => violations.push(format!("{node} did not come back: {e:#}")),
                }
            }
            Some(Then::RejoinStandby) => {
                let t = Instant::now();
                match services.pair(&["rejoin"]).await {
                    Ok(out) => {
                        let how = if out.contains("(pg_basebackup)") {
                            "pg_basebackup"
                        } else {
                            "pg_rewind"
                        };
                        detail += &format!(
                            ", the old primary a standby again in {:.0} s ({how})",
                            t.elapsed().as_secs_f64()
                        );
                    }
                    Err(e) => violations.push(format!("the old primary did not rejoin: {e:#}")),
                }
            }
            None => {}
        }
        match settled {
            Ok(waited) if waited >= Duration::from_secs(1) => {
                detail += &format!(
                    " (started once the backlog before it had drained, after {:.1} s)",
                    waited.as_secs_f64()
                );
            }
            Ok(_) => {}
            Err(left) => detail += &format!(" (started over a backlog: {left})"),
        }
        eprintln!("[faults] #{index} {detail}: recovery {recovery:?} ms, end to end {e2e:?} ms");
        faults.push(FaultRecord {
            index,
            kind,
            started: fault_start,
            ended,
            detail,
            recovery_ms: recovery,
            e2e_ms: e2e,
            processed: 0,
            reordered: 0,
            violations,
        });
    }

    // Drain: the workload stops, the fleet (healed) finishes everything.
    if let Err(e) = fleet.heal(&mut rng).await {
        fleet
            .unexpected
            .push(format!("fleet not healthy for the drain: {e:#}"));
    }
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), producer).await;
    let _ = tokio::time::timeout(Duration::from_secs(30), mixer).await;
    if let Some(direct) = direct {
        let _ = tokio::time::timeout(Duration::from_secs(90), direct).await;
    }
    let direct_ledger = direct_ledger
        .lock()
        .map_err(|_| anyhow::anyhow!("direct ledger poisoned"))?
        .clone();
    let ledger = std::mem::take(
        &mut *ledger
            .lock()
            .map_err(|_| anyhow::anyhow!("ledger poisoned"))?,
    );
    eprintln!("[faults] draining ...");
    let drain =
        crate::faults::check::drain(services, &env, &db, &ledger.stale, Duration::from_secs(300))
            .await;
    let mut holds_status = None;
    let mut waiting_checks = Vec::new();
    if let Some(operating) = operating {
        // One more pass once drained, then the operator stops.
        tokio::time::sleep(Duration::from_secs(5)).await;
        operator_stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(180), operating).await;
        let (checks, status) = crate::faults::holds::nothing_waits(
            &crate::faults::holds::Urls::of(&env, opts.shards),
            &db,
        )
        .await?;
        waiting_checks = checks;
        holds_status = Some(status);
    }
    let released = if opts.holds {
        crate::faults::holds::released_messages(&db).await?
    } else {
        Vec::new()
    };
    let (verify_passed, verify_output) = crate::faults::check::run_verify(&env).await?;
    let mut checks = crate::faults::check::database_checks(&db, &ledger).await?;
    checks.extend(waiting_checks);
    checks.extend(crate::faults::check::queue_checks(services, &env, &ledger, &released).await?);
    if opts.direct_rate > 0 {
        checks.extend(crate::faults::check::direct_checks(&db, &direct_ledger).await?);
    }
    checks
        .extend(crate::faults::check::effects_checks(&db, &payee, Duration::from_secs(120)).await?);
    if let Err(left) = drain {
        checks.push(crate::faults::check::Check {
            name: "drained within 300 s".into(),
            violations: left.max(1),
            examples: vec![format!("{left} outstanding at the deadline")],
        });
    }
    fleet.stop_all().await;

    seq_marks.push(max_seq(&db).await);
    for (i, f) in faults.iter_mut().enumerate() {
        f.processed = seq_marks[i + 1] - seq_marks[i];
    }
    attribute(&db, &mut faults).await?;
    let reordered = crate::faults::check::reordered(&db).await?;
    for at in &reordered {
        if let Some(f) = faults.iter_mut().rev().find(|f| f.started <= *at) {
            f.reordered += 1;
        }
    }
    let history_rows: i64 = sqlx::query_scalar("SELECT count(*) FROM pesanan_riwayat")
        .fetch_one(&db)
        .await?;
    let moved_entities = crate::faults::check::moved_entities(&db).await?;
    db.close().await;
    Ok(RunReport {
        seed: opts.seed,
        settings: settings_line(opts) + cut_short.as_deref().unwrap_or(""),
        binary: crate::faults::procs::binary().display().to_string(),
        git_commit: git_commit(),
        started,
        duration_s: clock.elapsed().as_secs_f64(),
        events_written: written.load(Ordering::Relaxed),
        history_rows,
        moved_entities,
        drain_s: drain.ok().map(|d| d.as_secs_f64()),
        kinds: summarize(&faults),
        faults,
        reordered: reordered.len(),
        direct: (opts.direct_rate > 0).then_some(DirectSummary {
            entities: opts.direct_entities,
            confirmed: direct_ledger.confirmed,
            retried: direct_ledger.retried,
            returned: direct_ledger.returned,
        }),
        mix: MixSummary {
            poison_confirmed: ledger.poison_confirmed.len(),
            poison_unconfirmed: ledger.poison_uncertain.len(),
            duplicates: ledger.duplicates,
            stale: ledger.stale.len(),
        },
        checks,
        verify_passed,
        verify_output,
        unexpected_exits: fleet.unexpected.clone(),
        holds: opts.holds.then(|| crate::faults::report::HoldsSummary {
            operator: operator.lock().map(|o| o.clone()).unwrap_or_default(),
            status: holds_status.unwrap_or_default(),
        }),
    })
}

/// `FAULTS_BUDGET_MIN`: minutes after which no new fault starts (the run
/// then drains and checks as usual), so a long soak on a machine lent for a
/// fixed time still ends with its invariants checked. Unset: no budget.
fn time_budget() -> anyhow::Result<Option<Duration>> {
    match std::env::var("FAULTS_BUDGET_MIN") {
        Ok(m) => {
            let minutes: f64 = m
                .parse()
                .with_context(|| format!("FAULTS_BUDGET_MIN={m:?} is not a number of minutes"))?;
            Ok(Some(Duration::from_secs_f64(minutes * 60.0)))
        }
        Err(_) => Ok(None),
    }
}

fn settings_line(o: &Options) -> String {
    let direct = if o.direct_rate > 0 {
        format!(
            " A direct producer publishes {} versions/s of {} orders of its own straight to \
             `pesanan-hash` with publisher confirms.",
            o.direct_rate, o.direct_entities
        )
    } else {
        String::new()
    };
    let pair = if o.kinds.contains(&Kind::DbFailover) {
        " The database is a primary with a synchronous streaming standby (`deploy/postgres/pair.sh`), \
         reached through a proxy in the role of its DNS name (moved at a failover)."
    } else {
        ""
    };
    let links = if o.kinds.iter().any(|k| Kind::CLUSTER.contains(k)) {
        "every process given the three nodes' URLs"
    } else {
        "on one broker every process's links through fault-injecting proxies"
    };
    let line = format!(
        "Settings: SHARD_COUNT={}, 2 `urutan run` replicas taking turns as {}, \
         URUTAN_FAULT_HANDLER_DELAY_MS={} (slow handler, during every fault), 1 `urutan relay`, 1 `urutan effects` \
         (every applied version POSTed to an idempotent payment endpoint, 2 s timeout), \
         AMQP_HEARTBEAT=5, DATABASE_TIMEOUT=5s, {links}, \
         {} entities, {} events/s through the outbox, {}-{} ms between faults, each once the backlog before it has drained (at most {} \
         messages queued and {} outbox rows unsent, waited for at most {} s), database stops of {}-{} s.",
        o.shards,
        o.consume
            .iter()
            .map(|c| match c.batch_max {
                Some(b) => format!("PREFETCH={} BATCH_MAX={b}", c.prefetch),
                None => format!("PREFETCH={}", c.prefetch),
            })
            .collect::<Vec<_>>()
            .join(", "),
        o.handler_delay_ms,
        o.entities,
        o.rate,
        o.gap_ms.0,
        o.gap_ms.1,
        settle_most(o),
        settle_most(o),
        SETTLE_LIMIT.as_secs(),
        o.db_stop_secs.0,
        o.db_stop_secs.1
    );
    line + pair + &direct
}

/// The highest history `seq` (retried while the database is away, 60 s).
async fn max_seq(db: &PgPool) -> i64 {
    for _ in 0..120 {
        let seq: Result<Option<i64>, _> =
            sqlx::query_scalar("SELECT max(seq) FROM pesanan_riwayat")
                .fetch_one(db)
                .await;
        if let Ok(seq) = seq {
            return seq.unwrap_or(0);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    0
}

/// How long a fault waits at most for the backlog before it to drain.
const SETTLE_LIMIT: Duration = Duration::from_secs(60);

/// The backlog a fault may start over: half a second of the workload
/// queued, and as many outbox rows unsent.
fn settle_most(o: &Options) -> u32 {
    o.rate.max(2) / 2
}

/// Waits (at most `limit`) until the workers and the relay have caught up
/// with what the previous fault left behind: at most half a second of the
/// workload (`rate / 2`) ready in the shard queues together, and as many
/// outbox rows unsent. A fault then starts from a steady state, and its
/// recovery (a probe published after it, queued behind whatever is there)
/// is its own: with faults 0.5-1.5 s apart, a relay abort was charged
/// 10-30 s for the backlog of the database outage before it. Both reads
/// are cheap (passive declares; the outbox's partial index of unsent
/// rows), so the wait does not slow what it waits for. Returns how long
/// it waited, or what was still queued at the deadline; the fault goes
/// ahead either way.
async fn settle(
    amqp_url: &str,
    db: &PgPool,
    opts: &Options,
    limit: Duration,
) -> Result<Duration, String> {
    let start = Instant::now();
    let most = u64::from(settle_most(opts));
    let names = urutan::broker::Names::new("pesanan");
    let queues: Vec<String> = (0..opts.shards).map(|i| names.shard_queue(i)).collect();
    let mut left = "unknown (neither the broker nor the database answered)".to_owned();
    let mut conn = None;
    let mut settled = None;
    while start.elapsed() < limit {
        if conn.is_none() {
            conn = crate::faults::workload::connect_any(amqp_url).await;
        }
        let queued = match &conn {
            Some(c) => match urutan_ops::queue_infos(c, &queues).await {
                Ok(infos) => Some(
                    infos
                        .iter()
                        .flatten()
                        .map(|q| u64::from(q.ready))
                        .sum::<u64>(),
                ),
                Err(_) => {
                    conn = None;
                    None
                }
            },
            None => None,
        };
        let unsent = crate::faults::inject::unsent(db).await.ok();
        if let (Some(queued), Some(unsent)) = (queued, unsent) {
            if queued <= most && unsent <= most as i64 {
                settled = Some(start.elapsed());
                break;
            }
            left = format!("{queued} messages queued, {unsent} outbox rows unsent");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if let Some(c) = conn {
        let _ = urutan::broker::call("connection.close", c.close(200, "settled".into())).await;
    }
    settled.ok_or(left)
}

/// Recovery after a fault that ended at `ended`, in ms, polled for `limit`:
/// (workers, end to end). Workers: a probe message (a new entity
/// `probe-<index>`, published straight to the exchange once the broker
/// takes it) is applied. End to end: an event the producer wrote into the
/// outbox after `ended` is applied (so the relay is back too). Each is
/// measured to the start of the transaction that applied it.
async fn measure_recovery(
    amqp_url: &str,
    db: &PgPool,
    index: usize,
    seq: i64,
    ended: DateTime<Utc>,
    limit: Duration,
) -> (Option<f64>, Option<f64>) {
    let deadline = Instant::now() + limit;
    let probe = format!("probe-{index}");
    let mut published = None;
    let mut attempts = 0;
    let (mut workers, mut e2e) = (None, None);
    let mut shard = None;
    let since = |at: DateTime<Utc>| (at - ended).num_microseconds().map(|us| us as f64 / 1000.0);
    while Instant::now() < deadline && (workers.is_none() || e2e.is_none()) {
        if published.is_none() {
            attempts += 1;
            if crate::faults::workload::publish_probe(amqp_url, &probe)
                .await
                .is_ok()
            {
                published = since(Utc::now());
            }
        }
        if workers.is_none() {
            let at: Result<Option<(DateTime<Utc>, i32)>, _> = sqlx::query_as(
                "SELECT diterapkan_pada, shard FROM pesanan_riwayat WHERE pesanan_id = $1",
            )
            .bind(&probe)
            .fetch_optional(db)
            .await;
            if let Ok(Some((at, on))) = at {
                workers = since(at);
                shard = Some(on);
            }
        }
        if e2e.is_none() {
            let at: Result<Option<DateTime<Utc>>, _> = sqlx::query_scalar(
                "SELECT min(r.diterapkan_pada) FROM pesanan_riwayat r JOIN outbox o
                   ON o.id = CASE WHEN r.message_id ~ '^[0-9]+$' THEN r.message_id::bigint END
                 WHERE r.seq > $1 AND o.dibuat_pada >= $2",
            )
            .bind(seq)
            .bind(ended)
            .fetch_one(db)
            .await;
            e2e = at.ok().flatten().and_then(since);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Where the time went when the workers were slow (a slow publish is
    // the suite's, a slow apply the product's).
    if workers.is_none_or(|ms| ms > 2_000.0) {
        eprintln!(
            "[faults] #{index} {probe}: published {published:?} ms after the fault's end \
             ({attempts} attempt(s)), applied on shard {shard:?}"
        );
    }
    (workers, e2e)
}

/// Charges each order violation (by when its row was applied) and each lost
/// event (by when it was written) to the fault window it falls in.
async fn attribute(db: &PgPool, faults: &mut [FaultRecord]) -> anyhow::Result<()> {
    let offenders: Vec<(String, DateTime<Utc>)> = sqlx::query_as(
        "SELECT 'order/gap: ' || pesanan_id || ' v' || versi || ' at position ' || rn, diterapkan_pada
         FROM (SELECT pesanan_id, versi, diterapkan_pada,
                      row_number() OVER (PARTITION BY pesanan_id ORDER BY seq) AS rn
               FROM pesanan_riwayat) h
         WHERE versi <> rn + (SELECT count(*) FROM urutan_lewati l
                              WHERE l.pesanan_id = h.pesanan_id AND l.versi < h.versi
                                AND l.alasan IN ('refused', 'gap'))
         UNION ALL
         SELECT 'lost: outbox ' || o.id || ' (' || o.agregat_id || ')', o.dibuat_pada
         FROM outbox o WHERE NOT EXISTS
           (SELECT 1 FROM pesanan_riwayat r WHERE r.message_id = o.id::text)
           AND NOT EXISTS (SELECT 1 FROM urutan_lewati l
                           WHERE l.pesanan_id = o.agregat_id AND l.alasan = 'refused'
                             AND l.message_id = o.id::text)",
    )
    .fetch_all(db)
    .await?;
    for (what, at) in offenders {
        if let Some(f) = faults.iter_mut().rev().find(|f| f.started <= at) {
            f.violations.push(what);
        }
    }
    Ok(())
}

/// `git rev-parse --short HEAD` (+ `-dirty`), or `unknown`.
fn git_commit() -> String {
    let run = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let Some(head) = run(&["rev-parse", "--short", "HEAD"]).filter(|h| !h.is_empty()) else {
        return "unknown".into();
    };
    let dirty =
        run(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    if dirty { format!("{head}-dirty") } else { head }
}
