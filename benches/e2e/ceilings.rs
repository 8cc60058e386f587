//! The ceilings the worker pool is compared with: the broker alone (drain a
//! backlog with consumers that only ack) and the database alone (the apply
//! statement at the same concurrency, without the broker).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::{FutureExt, StreamExt};
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use urutan::broker::{Names, topology};
use urutan::message::{EntityHeader, Envelope, Event, decode};
use urutan::store::BatchItem;

use crate::env::BenchEnv;
use crate::load::{self, Workload};
use crate::procfs::{CpuSplit, ServiceCpu, service_cpu};

/// A drain: how many, how long, how fast.
#[derive(Debug, Clone, Copy)]
pub struct Measured {
    pub messages: usize,
    pub secs: f64,
    /// CPU per message over the drain: the bench's consumers or apply
    /// tasks, the broker, the database.
    pub cpu: CpuSplit,
}

impl Measured {
    pub fn rate(&self) -> f64 {
        self.messages as f64 / self.secs.max(1e-9)
    }
}

/// Generous bound for draining `n` messages (at ≥ 100 msg/s, plus a minute).
pub fn drain_limit(n: usize) -> Duration {
    Duration::from_secs(60 + (n / 100) as u64)
}

/// Declares the contract topology for `shards` shards in `env`'s vhost and
/// publishes the workload into it. Returns the publish rate.
pub async fn prepare_backlog(env: &BenchEnv, shards: u16, work: Workload) -> anyhow::Result<f64> {
    let conn = load::connect(&env.amqp_url(), "urutan-bench topology").await?;
    topology::declare(&conn, &Names::new("pesanan"), shards, 5, false)
        .await
        .context("declare the topology")?;
    let _ = urutan::broker::call("connection.close", conn.close(200, "declared".into())).await;
    let channels = if work.len() > 100_000 { 4 } else { 1 };
    let took = load::publish_backlog(&env.amqp_url(), work, channels).await?;
    Ok(work.len() as f64 / took.as_secs_f64().max(1e-9))
}

/// The worker's default `BATCH_LINGER_MS`: how long a batch waits for more
/// deliveries after its first one.
const BATCH_LINGER: Duration = Duration::from_millis(5);

/// Broker alone: one consumer per shard with `prefetch`, doing nothing but
/// ack — per message at prefetch 1; otherwise it collects deliveries as the
/// batch worker does (up to `prefetch`, lingering `BATCH_LINGER` after the
/// first) and acks them with one `multiple` ack. Timed from the first
/// delivery to the last ack.
pub async fn broker_only(work: Workload, shards: u16, prefetch: u16) -> anyhow::Result<Measured> {
    let env = BenchEnv::bench(&format!("broker_s{shards}_p{prefetch}")).await?;
    prepare_backlog(&env, shards, work).await?;
    let total = work.len();
    let conn = load::connect(&env.amqp_url(), "urutan-bench ack-only").await?;
    let acked = Arc::new(AtomicUsize::new(0));
    let first = Arc::new(OnceLock::<(Instant, ServiceCpu)>::new());
    let done = Arc::new(tokio::sync::Notify::new());
    let last = Arc::new(OnceLock::<(Instant, ServiceCpu)>::new());
    let cancel = CancellationToken::new();
    let mut tasks = tokio::task::JoinSet::new();
    let names = Names::new("pesanan");
    for shard in 0..shards {
        let ch = conn.create_channel().await?;
        ch.basic_qos(prefetch, BasicQosOptions::default()).await?;
        let queue = names.shard_queue(shard);
        let mut consumer = ch
            .basic_consume(
                queue.as_str().into(),
                format!("bench-{shard}").as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let (acked, first, last, done, cancel) = (
            acked.clone(),
            first.clone(),
            last.clone(),
            done.clone(),
            cancel.clone(),
        );
        tasks.spawn(async move {
            loop {
                let next = tokio::select! {
                    () = cancel.cancelled() => return anyhow::Ok(()),
                    next = consumer.next() => next,
                };
                let mut newest = match next {
                    Some(Ok(d)) => d,
                    Some(Err(e)) => return Err(e.into()),
                    None => bail!("consumer cancelled"),
                };
                first.get_or_init(|| (Instant::now(), service_cpu()));
                let mut n = 1;
                let deadline = tokio::time::Instant::now() + BATCH_LINGER;
                while n < usize::from(prefetch) {
                    match tokio::time::timeout_at(deadline, consumer.next()).await {
                        Ok(Some(Ok(d))) => {
                            newest = d;
                            n += 1;
                        }
                        Ok(Some(Err(e))) => return Err(e.into()),
                        Ok(None) => bail!("consumer cancelled"),
                        Err(_) => break,
                    }
                }
                let multiple = prefetch > 1;
                newest.acker.ack(BasicAckOptions { multiple }).await?;
                if acked.fetch_add(n, Ordering::SeqCst) + n >= total {
                    last.get_or_init(|| (Instant::now(), service_cpu()));
                    done.notify_one();
                }
            }
        });
    }
    let limit = drain_limit(total);
    let waited = tokio::time::timeout(limit, async {
        while last.get().is_none() {
            tokio::select! {
                () = done.notified() => {}
                () = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
            if let Some(Some(Err(e))) = tasks.join_next().now_or_never() {
                return Err(anyhow::anyhow!("consumer task panicked: {e}"));
            }
        }
        Ok(())
    })
    .await;
    cancel.cancel();
    while let Ok(Some(joined)) =
        tokio::time::timeout(Duration::from_secs(10), tasks.join_next()).await
    {
        joined.context("consumer task panicked")??;
    }
    waited.with_context(|| {
        format!(
            "broker drain: {} of {total} acked after {limit:?}",
            acked.load(Ordering::SeqCst)
        )
    })??;
    let _ = urutan::broker::call("connection.close", conn.close(200, "drained".into())).await;
    let (Some((t0, cpu0)), Some((t1, cpu1))) = (first.get(), last.get()) else {
        bail!("no delivery seen");
    };
    Ok(Measured {
        messages: total,
        secs: (*t1 - *t0).as_secs_f64(),
        cpu: CpuSplit::between(*cpu0, *cpu1, None, total),
    })
}

/// How the database-only variant groups messages into transactions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbMode {
    /// `urutan::store::apply`: one statement, one transaction per message.
    PerMessage,
    /// One transaction with a loop of `SELECT urutan_terapkan(...)`, n per commit.
    Loop(usize),
    /// `urutan::store::apply_batch` (`urutan_terapkan_batch`): the batch
    /// worker's own statement, one round trip and one transaction per n.
    Statement(usize),
}

/// Opens the `tasks` connections the drain will use and runs the apply
/// function once on each (so connecting and compiling PL/pgSQL happen
/// before the clock starts).
async fn warm_up(pool: &PgPool, tasks: u16) -> anyhow::Result<()> {
    let mut held = Vec::new();
    for i in 0..tasks {
        let mut conn = pool.acquire().await?;
        let entity = format!("warm-{i}");
        let event = serde_json::json!({
            "message_id": format!("{entity}-v1"), "id": entity, "status": "dibuat", "versi": 1,
        });
        let _: String = sqlx::query_scalar("SELECT urutan_terapkan($1, $2)")
            .bind(sqlx::types::Json(event))
            .bind(i32::from(i))
            .fetch_one(&mut *conn)
            .await?;
        held.push(conn);
    }
    Ok(())
}

/// The workload as decoded events, split by order over `tasks` tasks.
fn events_by_task(work: Workload, tasks: u16) -> Vec<Vec<Event>> {
    let mut split: Vec<Vec<Event>> = (0..tasks).map(|_| Vec::new()).collect();
    for i in 0..work.len() {
        let msg = work.message(i);
        let env = Envelope {
            message_id: Some(&msg.message_id),
            entity_header: EntityHeader::Text(msg.entity.as_bytes()),
            delivery_mode: Some(2),
            timestamp: None,
            body: &msg.body,
            headers_bytes: 0,
            headers_depth: 0,
        };
        let event = decode(&env, 1 << 20).expect("the workload is valid");
        split[(i % work.entities) % usize::from(tasks)].push(event);
    }
    split
}

async fn apply_chunk(
    pool: &PgPool,
    chunk: &[Event],
    shard: u16,
    mode: DbMode,
) -> anyhow::Result<()> {
    match mode {
        DbMode::PerMessage => {
            // One connection for the chunk, as the worker keeps one between
            // messages (sqlx pings a connection when it goes back to the pool).
            let mut conn = pool.acquire().await?;
            for e in chunk {
                urutan::store::apply(&mut *conn, e, shard).await?;
            }
        }
        DbMode::Loop(_) => {
            let mut tx = pool.begin().await?;
            for e in chunk {
                let _: String = sqlx::query_scalar("SELECT urutan_terapkan($1, $2)")
                    .bind(sqlx::types::Json(e))
                    .bind(i32::from(shard))
                    .fetch_one(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
        }
        DbMode::Statement(_) => {
            let items: Vec<BatchItem<'_>> = chunk.iter().map(BatchItem::Event).collect();
            urutan::store::apply_batch(&mut *pool.acquire().await?, &items, shard).await?;
        }
    }
    Ok(())
}

/// Database alone: `tasks` tasks (one per shard), each applying its orders'
/// messages in order as `mode` groups them. Returns the drain and a note on
/// which batch statement was used.
pub async fn db_only(
    work: Workload,
    tasks: u16,
    mode: DbMode,
    unix_db: bool,
) -> anyhow::Result<(Measured, String)> {
    let tag = format!("db_t{tasks}_{mode:?}");
    let mut env = BenchEnv::bench(&tag).await?;
    env.use_unix_socket(unix_db);
    let pool = env.pool(u32::from(tasks) + 2).await?;
    {
        let mut conn = pool.acquire().await?;
        urutan::reshard::handoff::register_shards(&mut conn, tasks).await?;
    }
    warm_up(&pool, tasks).await?;
    let split = events_by_task(work, tasks);
    let barrier = Arc::new(tokio::sync::Barrier::new(usize::from(tasks) + 1));
    let mut set = tokio::task::JoinSet::new();
    for (shard, events) in split.into_iter().enumerate() {
        let (pool, barrier) = (pool.clone(), barrier.clone());
        let shard = u16::try_from(shard).unwrap_or(0);
        set.spawn(async move {
            barrier.wait().await;
            let size = match mode {
                DbMode::PerMessage => 64,
                DbMode::Loop(n) | DbMode::Statement(n) => n,
            };
            for chunk in events.chunks(size.max(1)) {
                apply_chunk(&pool, chunk, shard, mode).await?;
            }
            anyhow::Ok(Instant::now())
        });
    }
    barrier.wait().await;
    let start = Instant::now();
    let cpu_start = service_cpu();
    let mut end = start;
    let limit = drain_limit(work.len());
    let all = tokio::time::timeout(limit, async {
        while let Some(joined) = set.join_next().await {
            end = end.max(joined.context("apply task panicked")??);
        }
        anyhow::Ok(())
    })
    .await;
    all.with_context(|| format!("database-only drain not done after {limit:?}"))??;
    let cpu_end = service_cpu();
    let applied: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pesanan_riwayat WHERE pesanan_id NOT LIKE 'warm-%'",
    )
    .fetch_one(&pool)
    .await?;
    pool.close().await;
    if usize::try_from(applied).unwrap_or(0) != work.len() {
        bail!("database-only: {applied} applied, expected {}", work.len());
    }
    let note = match mode {
        DbMode::PerMessage => "urutan::store::apply",
        DbMode::Loop(_) => "BEGIN; n × SELECT urutan_terapkan(…); COMMIT",
        DbMode::Statement(_) => "urutan::store::apply_batch (urutan_terapkan_batch)",
    };
    Ok((
        Measured {
            messages: work.len(),
            secs: (end - start).as_secs_f64(),
            cpu: CpuSplit::between(cpu_start, cpu_end, None, work.len()),
        },
        note.to_owned(),
    ))
}
