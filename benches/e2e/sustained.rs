//! Sustained load (`--sustained`): what rate can the pool take while keeping
//! its latency low? Open-loop publishing at fixed rates, in steps up to and
//! past saturation, with the consumers running at the same time on the same
//! machine (the broker ingests and delivers at once, as in production). For
//! every step: the achieved rate and publish → commit latency percentiles;
//! per curve, the knee: the highest offered rate whose p99 stays under 50 ms
//! and under 250 ms.
//!
//! Curves, each in its own vhost and database: the broker alone (consumers
//! that only ack, prefetch 1: what the machine can do), strict mode
//! (`PREFETCH=1`), pipelined strict mode (`PREFETCH=2`, `BATCH_MAX=1`: one
//! message applied at a time, the next delivery already on hand) and batch
//! mode at two prefetches.
//!
//! Latency of a worker curve: publish → the applied row visible to another
//! session, i.e. after its commit (the history table polled every
//! [`POLL`]); of the broker curve: publish → delivery to the ack-only
//! consumer.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use urutan::broker::{Names, topology};
use urutan_testkit::markdown::row;

use crate::env::BenchEnv;
use crate::load::{self, Cursor, now_ns};
use crate::runs::{percentile, publish_step, start_consuming};

/// How often a worker curve looks for newly committed rows.
const POLL: Duration = Duration::from_millis(5);
/// p99 bounds that define the knees.
pub const KNEES_MS: [f64; 2] = [50.0, 250.0];

/// What runs the consumers of one curve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Consumer {
    /// Ack-only consumers at prefetch 1.
    BrokerOnly,
    /// `urutan run` with `PREFETCH` and `BATCH_MAX`.
    Worker { prefetch: u16, batch_max: u16 },
}

impl Consumer {
    pub fn label(&self) -> String {
        match self {
            Consumer::BrokerOnly => "broker alone (ack-only, prefetch 1)".into(),
            Consumer::Worker {
                prefetch: 1,
                batch_max: 1,
            } => "strict (PREFETCH=1)".into(),
            Consumer::Worker {
                prefetch,
                batch_max: 1,
            } => format!("pipelined strict (PREFETCH={prefetch}, BATCH_MAX=1)"),
            Consumer::Worker { prefetch, .. } => format!("batch (PREFETCH={prefetch})"),
        }
    }
}

/// One offered rate, held for the step's duration.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Step {
    pub offered: f64,
    /// What the publisher achieved (msg/s).
    pub published: f64,
    /// Messages done ÷ (last done − first published): what the consumers kept up with.
    pub done_rate: f64,
    pub messages: usize,
    /// Not done within the step's bound (counted as infinitely late).
    pub unfinished: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
    /// Past saturation: p50 over 1 s, a tenth of the messages behind, or unfinished ones.
    pub saturated: bool,
}

/// One configuration's steps.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Curve {
    pub consumer: Consumer,
    pub label: String,
    pub steps: Vec<Step>,
    pub error: Option<String>,
}

impl Curve {
    /// The highest offered rate whose p99 stays under `bound_ms`, with
    /// every lower step under it too.
    pub fn knee(&self, bound_ms: f64) -> Option<f64> {
        self.steps
            .iter()
            .take_while(|s| s.p99_ms < bound_ms && !s.saturated)
            .map(|s| s.offered)
            .last()
    }
}

/// What a `--sustained` run measures.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SustainedPlan {
    pub shards: u16,
    pub rates: Vec<f64>,
    pub step_secs: f64,
    /// Every curve is run this many times (in a rotated order per round,
    /// so the machine's drift spreads over all of them); the report takes
    /// each step's median.
    pub rounds: usize,
    pub consumers: Vec<Consumer>,
}

impl SustainedPlan {
    pub fn new(quick: bool, step_secs: Option<f64>, rounds: Option<usize>) -> Self {
        let rates = [
            200.0, 400.0, 600.0, 800.0, 1000.0, 1300.0, 1600.0, 2000.0, 2500.0, 3200.0, 4000.0,
            5000.0, 6500.0, 8000.0, 10000.0,
        ];
        Self {
            shards: 4,
            rates: rates.to_vec(),
            step_secs: step_secs.unwrap_or(if quick { 4.0 } else { 6.0 }),
            rounds: rounds.unwrap_or(if quick { 1 } else { 3 }).max(1),
            consumers: vec![
                Consumer::BrokerOnly,
                Consumer::Worker {
                    prefetch: 1,
                    batch_max: 1,
                },
                Consumer::Worker {
                    prefetch: 2,
                    batch_max: 1,
                },
                Consumer::Worker {
                    prefetch: 16,
                    batch_max: 16,
                },
                Consumer::Worker {
                    prefetch: 64,
                    batch_max: 64,
                },
            ],
        }
    }
}

/// When each message was done (µs since the epoch), by message id.
type DoneTimes = Arc<Mutex<HashMap<String, i64>>>;

/// Runs one curve: steps up the rates until two steps were saturated.
pub async fn curve(
    consumer: Consumer,
    plan: &SustainedPlan,
    bin: &Path,
    logs: &Path,
) -> anyhow::Result<Curve> {
    let tag = match consumer {
        Consumer::BrokerOnly => "sustained_broker".to_owned(),
        Consumer::Worker {
            prefetch,
            batch_max,
        } => format!("sustained_p{prefetch}_b{batch_max}"),
    };
    let env = BenchEnv::bench(&tag).await?;
    let conn = Arc::new(load::connect(&env.amqp_url(), "urutan-bench sustained").await?);
    topology::declare(&conn, &Names::new("pesanan"), plan.shards, 5, false).await?;
    let done: DoneTimes = Arc::default();
    let stop = CancellationToken::new();
    let mut worker = None;
    let mut pool = None;
    let watcher = match consumer {
        Consumer::BrokerOnly => tokio::spawn(ack_only(
            conn.clone(),
            plan.shards,
            done.clone(),
            stop.clone(),
        )),
        Consumer::Worker {
            prefetch,
            batch_max,
        } => {
            let db = env.pool(2).await?;
            let extra = [("BATCH_MAX", batch_max.to_string())];
            let log = logs.join(format!("{tag}.log"));
            let w = start_consuming(bin, &env, &db, plan.shards, prefetch, &extra, log).await?;
            worker = Some(w);
            let watch = tokio::spawn(watch_commits(db.clone(), done.clone(), stop.clone()));
            pool = Some(db);
            watch
        }
    };
    let ch = load::confirm_channel(&conn).await?;
    let mut cursor = Cursor::new(2_000);
    let mut out = Curve {
        consumer,
        label: consumer.label(),
        steps: Vec::new(),
        error: None,
    };
    // Warm up (connections, prepared statements, JIT of the broker's path).
    let warm = load::publish_paced(&ch, &mut cursor, "warm", 200.0, Duration::from_secs(2)).await?;
    wait_done(&done, &warm, Duration::from_secs(30)).await;
    let mut saturated = 0;
    for (i, &rate) in plan.rates.iter().enumerate() {
        if let Some(w) = worker.as_mut() {
            w.check_alive()?;
        }
        let prefix = format!("s{i}");
        let (sent, published) =
            publish_step(&ch, &mut cursor, &prefix, rate, plan.step_secs).await?;
        // A saturated step leaves a backlog: give it the step's length
        // three times over (plus 10 s) to drain before giving up on it.
        let bound = Duration::from_secs_f64(plan.step_secs * 3.0 + 10.0);
        wait_done(&done, &sent, bound).await;
        let step = summarize(rate, published, &sent, &done);
        eprintln!(
            "e2e sustained {}: {rate:.0} msg/s offered, {:.0} done, p50 {:.1} / p99 {:.1} / p99.9 {:.1} ms{}",
            out.label,
            step.done_rate,
            step.p50_ms,
            step.p99_ms,
            step.p999_ms,
            if step.saturated { " (saturated)" } else { "" }
        );
        saturated += usize::from(step.saturated);
        let unfinished = step.unfinished;
        out.steps.push(step);
        if saturated >= 2 || unfinished > 0 {
            break;
        }
    }
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), watcher).await;
    let _ = urutan::broker::call("connection.close", conn.close(200, "done".into())).await;
    if let Some(mut w) = worker {
        let _ = w.stop(Duration::from_secs(30)).await;
    }
    if let Some(db) = pool {
        db.close().await;
    }
    Ok(out)
}

/// Waits (at most `limit`) until every message of `sent` is done.
async fn wait_done(done: &DoneTimes, sent: &[(String, i64)], limit: Duration) {
    let start = Instant::now();
    while start.elapsed() < limit {
        let all = {
            let done = done.lock().expect("done times");
            sent.iter().all(|(id, _)| done.contains_key(id))
        };
        if all {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn summarize(offered: f64, published: f64, sent: &[(String, i64)], done: &DoneTimes) -> Step {
    let done = done.lock().expect("done times");
    let mut lat = Vec::with_capacity(sent.len());
    let mut unfinished = 0;
    let mut last_done = i64::MIN;
    for (id, t) in sent {
        match done.get(id) {
            Some(d) => {
                lat.push((d - t) as f64 / 1000.0);
                last_done = last_done.max(*d);
            }
            None => {
                unfinished += 1;
                lat.push(f64::INFINITY);
            }
        }
    }
    lat.sort_by(f64::total_cmp);
    let first = sent.first().map_or(0, |s| s.1);
    let finished = sent.len() - unfinished;
    let span_s = (last_done - first) as f64 / 1e6;
    let done_rate = finished as f64 / span_s.max(1e-9);
    let p50 = percentile(&lat, 0.50);
    Step {
        offered,
        published,
        done_rate,
        messages: sent.len(),
        unfinished,
        p50_ms: p50,
        p99_ms: percentile(&lat, 0.99),
        p999_ms: percentile(&lat, 0.999),
        max_ms: lat.last().copied().unwrap_or(f64::NAN),
        saturated: unfinished > 0 || p50 > 1000.0 || done_rate < 0.9 * published,
    }
}

/// Ack-only consumers, one per shard queue at prefetch 1, recording when
/// each message arrived.
async fn ack_only(
    conn: Arc<lapin::Connection>,
    shards: u16,
    done: DoneTimes,
    stop: CancellationToken,
) {
    let names = Names::new("pesanan");
    let mut tasks = tokio::task::JoinSet::new();
    for shard in 0..shards {
        let Ok(ch) = conn.create_channel().await else {
            return;
        };
        if ch.basic_qos(1, BasicQosOptions::default()).await.is_err() {
            return;
        }
        let queue = names.shard_queue(shard);
        let Ok(mut consumer) = ch
            .basic_consume(
                queue.as_str().into(),
                format!("sustained-{shard}").as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
        else {
            return;
        };
        let (done, stop) = (done.clone(), stop.clone());
        tasks.spawn(async move {
            loop {
                let next = tokio::select! {
                    () = stop.cancelled() => return,
                    next = consumer.next() => next,
                };
                let Some(Ok(delivery)) = next else { return };
                let at = now_ns() / 1_000;
                if let Some(id) = delivery.properties.message_id().as_ref() {
                    done.lock().expect("done times").insert(id.to_string(), at);
                }
                if delivery
                    .acker
                    .ack(BasicAckOptions::default())
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
}

/// Records when each applied row became visible: polls the history above
/// the highest `seq` below which every row was seen (rows commit out of
/// `seq` order across shards; a gap still open after 2 s is a `seq` that
/// never committed, and skipped).
async fn watch_commits(db: PgPool, done: DoneTimes, stop: CancellationToken) {
    let mut floor: i64 = 0;
    let mut above: HashSet<i64> = HashSet::new();
    let mut gap_since: Option<Instant> = None;
    while !stop.is_cancelled() {
        let rows: Result<Vec<(i64, String)>, _> = sqlx::query_as(
            "SELECT seq, message_id FROM pesanan_riwayat WHERE seq > $1 ORDER BY seq LIMIT 100000",
        )
        .bind(floor)
        .fetch_all(&db)
        .await;
        let at = now_ns() / 1_000;
        if let Ok(rows) = rows {
            let mut done = done.lock().expect("done times");
            for (seq, id) in rows {
                if above.insert(seq) {
                    done.insert(id, at);
                }
            }
        }
        while above.remove(&(floor + 1)) {
            floor += 1;
        }
        if above.is_empty() {
            gap_since = None;
        } else if gap_since.get_or_insert_with(Instant::now).elapsed() > Duration::from_secs(2) {
            floor += 1;
            gap_since = None;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The run: every curve of `plan` once per round (two attempts each);
/// returns the rounds, each in `plan.consumers` order.
pub async fn run(plan: &SustainedPlan, bin: &Path, logs: &Path) -> Vec<Vec<Curve>> {
    let mut rounds = Vec::new();
    for round in 0..plan.rounds {
        let mut curves: Vec<Option<Curve>> = vec![None; plan.consumers.len()];
        let n = plan.consumers.len();
        for k in 0..n {
            let i = (k + round) % n;
            let consumer = plan.consumers[i];
            eprintln!(
                "e2e sustained: round {} of {}: {}",
                round + 1,
                plan.rounds,
                consumer.label()
            );
            let mut result = curve(consumer, plan, bin, logs).await;
            if let Err(e) = &result {
                eprintln!("e2e sustained {}: {e:#}; once more", consumer.label());
                result = curve(consumer, plan, bin, logs).await;
            }
            curves[i] = Some(result.unwrap_or_else(|e| Curve {
                consumer,
                label: consumer.label(),
                steps: Vec::new(),
                error: Some(format!("{e:#}")),
            }));
        }
        rounds.push(curves.into_iter().flatten().collect());
    }
    rounds
}

/// Each curve's steps as the median over `rounds` (a round that stopped
/// before a rate, because two earlier steps saturated, counts there as
/// saturated with infinite latency).
pub fn medians(plan: &SustainedPlan, rounds: &[Vec<Curve>]) -> Vec<Curve> {
    let median = |mut v: Vec<f64>| -> f64 {
        v.sort_by(f64::total_cmp);
        if v.is_empty() {
            f64::NAN
        } else {
            v[v.len() / 2]
        }
    };
    plan.consumers
        .iter()
        .enumerate()
        .map(|(i, &consumer)| {
            let runs: Vec<&Curve> = rounds.iter().filter_map(|r| r.get(i)).collect();
            let mut steps = Vec::new();
            for &rate in &plan.rates {
                let at: Vec<Option<&Step>> = runs
                    .iter()
                    .map(|c| c.steps.iter().find(|st| st.offered == rate))
                    .collect();
                let present: Vec<&Step> = at.iter().flatten().copied().collect();
                if present.is_empty() {
                    break;
                }
                let pick = |f: fn(&Step) -> f64| {
                    median(at.iter().map(|st| st.map_or(f64::INFINITY, f)).collect())
                };
                let saturated = at
                    .iter()
                    .filter(|st| st.is_none_or(|st| st.saturated))
                    .count();
                steps.push(Step {
                    offered: rate,
                    published: median(present.iter().map(|st| st.published).collect()),
                    done_rate: median(present.iter().map(|st| st.done_rate).collect()),
                    messages: present.iter().map(|st| st.messages).max().unwrap_or(0),
                    unfinished: present.iter().map(|st| st.unfinished).max().unwrap_or(0),
                    p50_ms: pick(|st| st.p50_ms),
                    p99_ms: pick(|st| st.p99_ms),
                    p999_ms: pick(|st| st.p999_ms),
                    max_ms: pick(|st| st.max_ms),
                    saturated: saturated * 2 > at.len(),
                });
            }
            let error = runs.iter().find_map(|c| c.error.clone());
            Curve {
                consumer,
                label: consumer.label(),
                steps,
                error,
            }
        })
        .collect()
}

/// The results as Markdown: the knees with their ratio to the broker's, then
/// every step.
pub fn markdown(
    plan: &SustainedPlan,
    curves: &[Curve],
    rounds: &[Vec<Curve>],
    machine: &str,
    took: Duration,
) -> String {
    let mut s = String::from("# Sustained load: latency against the offered rate\n\n");
    s += &format!(
        "{} shards, open-loop publishing (one publisher, publisher confirms) at each rate for \
         {:.0} s while the consumers run; a step is kept until its messages are done (at most \
         3 × the step + 10 s). Latency: publish → commit (the applied row visible to another \
         session, polled every {} ms) for `urutan run`, publish → delivery for the broker alone. \
         Every figure is the median of {} round(s), each running every curve in a rotated \
         order. {machine}. Took {:.0} s.\n\n",
        plan.shards,
        plan.step_secs,
        POLL.as_millis(),
        plan.rounds,
        took.as_secs_f64()
    );
    let broker = curves.iter().find(|c| c.consumer == Consumer::BrokerOnly);
    let ratio = |knee: Option<f64>, of: Option<f64>| match (knee, of) {
        (Some(k), Some(b)) if b > 0.0 => format!("{:.2}", k / b),
        _ => "—".into(),
    };
    let rate = |r: Option<f64>| r.map_or("below the first step".to_owned(), |r| format!("{r:.0}"));
    s += "## Knees: the highest offered rate (msg/s) whose p99 stays under the bound\n\n";
    s += "| consumers | p99 < 50 ms | × broker alone | p99 < 250 ms | × broker alone | highest rate done |\n";
    s += "|---|---:|---:|---:|---:|---:|\n";
    for c in curves {
        let best = c
            .steps
            .iter()
            .map(|st| st.done_rate.min(st.published))
            .reduce(f64::max);
        s += &row(&[
            &c.label,
            &rate(c.knee(KNEES_MS[0])),
            &ratio(
                c.knee(KNEES_MS[0]),
                broker.and_then(|b| b.knee(KNEES_MS[0])),
            ),
            &rate(c.knee(KNEES_MS[1])),
            &ratio(
                c.knee(KNEES_MS[1]),
                broker.and_then(|b| b.knee(KNEES_MS[1])),
            ),
            &best.map_or("—".into(), |b| format!("{b:.0}")),
        ]);
    }
    if rounds.len() > 1 {
        s += "\nEach round's knees (p99 < 50 ms / < 250 ms), for the spread:\n\n";
        for (i, c) in curves.iter().enumerate() {
            let each: Vec<String> = rounds
                .iter()
                .filter_map(|r| r.get(i))
                .map(|r| {
                    format!(
                        "{} / {}",
                        rate(r.knee(KNEES_MS[0])),
                        rate(r.knee(KNEES_MS[1]))
                    )
                })
                .collect();
            s += &format!("- {}: {}\n", c.label, each.join("; "));
        }
    }
    s += "\n## Every step (medians)\n\n";
    s += "| consumers | offered | published | done | p50 (ms) | p99 (ms) | p99.9 (ms) | max (ms) | |\n";
    s += "|---|---:|---:|---:|---:|---:|---:|---:|---|\n";
    let ms = |v: f64| {
        if v.is_finite() {
            format!("{v:.1}")
        } else {
            "∞".into()
        }
    };
    for c in curves {
        if let Some(e) = &c.error {
            s += &format!("| {} | failed: {e} | | | | | | | |\n", c.label);
        }
        for st in &c.steps {
            let note = if st.unfinished > 0 {
                format!("saturated, {} not done in time", st.unfinished)
            } else if st.saturated {
                "saturated".into()
            } else {
                String::new()
            };
            s += &row(&[
                &c.label,
                &format!("{:.0}", st.offered),
                &format!("{:.0}", st.published),
                &format!("{:.0}", st.done_rate),
                &ms(st.p50_ms),
                &ms(st.p99_ms),
                &ms(st.p999_ms),
                &ms(st.max_ms),
                &note,
            ]);
        }
    }
    s
}
