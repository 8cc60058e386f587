//! `urutan run`: prepares the database and the topology, then keeps one
//! worker per shard consuming, reconnecting to the broker whenever the
//! connection is lost, until shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use metrics_exporter_prometheus::PrometheusHandle;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{error, info, warn};

use crate::broker::{self, Names, ShardPlan, TopologyError, topology};
use crate::config::{Settings, TopologyMode};
use crate::health::{self, Health, Role};
use crate::metrics as m;
use crate::reshard::handoff::{self, EpochError};
use crate::reshard::ring::{self, Plan, RingError};
use crate::shard::{Hooks, ShardWorker};
use crate::store;

/// Why `run` stopped with an error: only conditions a restart cannot fix.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Prepare(#[from] PrepareError),
    #[error("cannot serve HTTP: {0}")]
    Http(#[from] std::io::Error),
}

/// Why [`prepare_topology`] failed.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// The broker or the database failed on the way: try again.
    #[error(transparent)]
    Unavailable(#[from] EpochError),
    /// A refusal that no retry can change.
    #[error(transparent)]
    Refused(#[from] Refused),
}

impl PrepareError {
    /// Whether trying again may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unavailable(_))
    }
}

impl From<sqlx::Error> for PrepareError {
    fn from(e: sqlx::Error) -> Self {
        Self::Unavailable(e.into())
    }
}

impl From<broker::BrokerError> for PrepareError {
    fn from(e: broker::BrokerError) -> Self {
        Self::Unavailable(e.into())
    }
}

/// A topology request that no retry can grant.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error(transparent)]
    Topology(#[from] TopologyError),
    #[error(transparent)]
    Ring(#[from] RingError),
    #[error(
        "this broker user may not put epoch markers into the shard queues ({0}): grant it write \
         permission on `amq.default` (deploy/rabbitmq/least-privilege.sh does)"
    )]
    Markers(String),
}

/// What [`prepare_topology`] set up.
#[derive(Debug, Clone, Copy)]
pub struct Prepared {
    pub plan: ShardPlan,
    /// The epoch opened once the bindings were in place.
    pub epoch: i64,
    /// The `versi` of the recorded ring the bindings follow.
    pub ring: i64,
    /// This replica wants another shard count but a resharding is in
    /// progress: prepare again once it completes.
    pub waiting: bool,
    /// Asked to declare, the broker refused (the user may not configure
    /// the topology): it was checked passively instead. Later prepares of
    /// this pool only check.
    pub declare_refused: bool,
}

/// A worker pool, built (HTTP port bound) but not yet running.
pub struct Supervisor {
    settings: Settings,
    hooks: Hooks,
    listener: TcpListener,
    metrics: PrometheusHandle,
    health: Arc<Health>,
}

impl Supervisor {
    /// Binds `METRICS_ADDR` (port 0 picks a free one, see [`Self::http_addr`]).
    pub async fn build(settings: Settings, hooks: Hooks) -> std::io::Result<Self> {
        let listener = TcpListener::bind(settings.metrics_addr).await?;
        let metrics = m::install();
        m::register_worker();
        Ok(Self {
            settings,
            hooks,
            listener,
            metrics,
            health: Arc::new(Health::new(Role::Worker)),
        })
    }

    /// Where `/metrics`, `/healthz` and `/readyz` are served.
    pub fn http_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .unwrap_or(self.settings.metrics_addr)
    }

    /// Runs until `shutdown` is cancelled, then stops taking messages,
    /// finishes and acks the in-flight ones, closes and returns.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), RunError> {
        let Self {
            settings,
            hooks,
            listener,
            metrics,
            health,
        } = self;
        let tasks = TaskTracker::new();
        let background = shutdown.child_token();
        let http = tasks.spawn(crate::http::serve(
            listener,
            metrics,
            health.clone(),
            background.clone(),
        ));
        let database = settings.database();
        let Some(pool) = retry_until_ready("database", &shutdown, || {
            store::prepare(&database, settings.pool_size())
        })
        .await
        else {
            background.cancel();
            return Ok(());
        };
        info!(database = %settings.database_url, "database ready (migrations applied)");
        health.set_database(true);
        tasks.spawn(health::watch_database(
            pool.clone(),
            health.clone(),
            background.clone(),
        ));
        tasks.spawn(store::run_retention(
            pool.clone(),
            store::Retention::of(&settings),
            background.clone(),
        ));

        let result = consume_until_shutdown(&settings, &hooks, &pool, &health, &shutdown).await;
        background.cancel();
        tasks.close();
        tasks.wait().await;
        // Bounded: a connection whose link went silent may never say goodbye.
        if tokio::time::timeout(Duration::from_secs(10), pool.close())
            .await
            .is_err()
        {
            warn!("database connections did not close within 10 s; leaving them");
        }
        if http.is_finished() {
            // Only reachable if the server failed early; surface that.
            if let Ok(Err(e)) = http.await {
                return Err(RunError::Http(e));
            }
        }
        result
    }
}

/// The broker loop: connect, declare, run one worker per shard; when the
/// connection is lost, count it, back off and do it again. When the
/// recorded ring changes (another replica or `urutan topology` resharded),
/// stop the workers gracefully and prepare again.
async fn consume_until_shutdown(
    settings: &Settings,
    hooks: &Hooks,
    pool: &PgPool,
    health: &Arc<Health>,
    shutdown: &CancellationToken,
) -> Result<(), RunError> {
    let names = Names::new(&settings.topology_prefix);
    let mut lost_before = false;
    // Switched to check mode once the broker refused a declare: a refusal
    // is not transient, and asking again only repeats it.
    let mut prepare_with = settings.clone();
    loop {
        // Retried while the broker or the database fails; a refusal ends `run`.
        let connected = retry_until_ready("broker", shutdown, || async {
            match connect_and_mark(&prepare_with, &names, pool).await {
                Err(refused) if !refused.is_retryable() => Ok(Err(refused)),
                attempt => attempt.map(Ok),
            }
        })
        .await;
        let Some(connected) = connected else {
            return Ok(());
        };
        let (conn, prepared) = connected?;
        let Prepared {
            plan,
            epoch,
            ring,
            waiting,
            declare_refused,
        } = prepared;
        if declare_refused {
            prepare_with.topology_mode = TopologyMode::Check;
        }
        let conn = Arc::new(conn);
        if lost_before {
            metrics::counter!(m::BROKER_RECONNECTS_TOTAL).increment(1);
            info!("reconnected to the broker");
        }
        info!(broker = %settings.amqp_url, shards = plan.consumed, bound = plan.bound,
              prefetch = settings.prefetch, "consuming");
        health.broker_up(plan.consumed);
        metrics::gauge!(m::SHARDS).set(f64::from(plan.bound));

        // Everything of this connection stops with `stop`: on shutdown, on
        // a connection loss (the workers end) or when the ring changed.
        let stop = shutdown.child_token();
        let side_tasks = TaskTracker::new();
        let watcher = side_tasks.spawn(ring::watch(pool.clone(), (ring, waiting), stop.clone()));
        if plan.consumed > plan.bound {
            info!(
                from = plan.consumed,
                to = plan.bound,
                "shrinking: draining the removed shards"
            );
            side_tasks.spawn(crate::reshard::retire::retire_shards(
                pool.clone(),
                conn.clone(),
                names.clone(),
                (plan.bound, plan.consumed),
                epoch,
                health.clone(),
                stop.clone(),
            ));
        }
        side_tasks.close();
        run_workers(settings, hooks, pool, health, &names, &conn, plan, &stop).await;
        stop.cancel();
        let ring_changed = watcher.await.unwrap_or(false);
        side_tasks.wait().await;
        health.broker_down();
        if shutdown.is_cancelled() || ring_changed {
            let _ = broker::call("connection.close", conn.close(200, "shutdown".into())).await;
        }
        if shutdown.is_cancelled() {
            info!("all shards stopped; broker connection closed");
            return Ok(());
        }
        if ring_changed {
            info!("workers stopped for the new ring; preparing it");
            lost_before = false;
        } else {
            warn!("lost the broker connection; reconnecting");
            lost_before = true;
        }
    }
}

/// Connects, then [`prepare_topology`].
async fn connect_and_mark(
    settings: &Settings,
    names: &Names,
    pool: &PgPool,
) -> Result<(lapin::Connection, Prepared), PrepareError> {
    let conn = broker::connect(&settings.broker(), "urutan run").await?;
    let prepared = prepare_topology(settings, names, pool, &conn, false).await?;
    Ok((conn, prepared))
}

/// Resolves `SHARD_COUNT` against the recorded ring (see `ring`), declares
/// (or, in check mode, checks) the topology for the result and opens an
/// epoch, with relay publishing paused meanwhile, so that when the ring
/// changes (shards bound or unbound) every message routed by the old ring is
/// queued before the marker and every message routed by the new one after it
/// (see `handoff`). `explicit`: asked by `urutan topology`, which may set
/// the ring back to an earlier count.
pub async fn prepare_topology(
    settings: &Settings,
    names: &Names,
    pool: &PgPool,
    conn: &lapin::Connection,
    explicit: bool,
) -> Result<Prepared, PrepareError> {
    // A session of its own: if this is cancelled half-way, dropping it ends
    // the session and with it the pause.
    let mut db = pool.acquire().await?.detach();
    handoff::pause_publishing(&mut db, names).await?;
    let marked = async {
        let current = ring::current(&mut db).await?;
        let earlier = ring::earlier_counts(&mut db).await?;
        let request = ring::Request {
            wanted: settings.shard_count,
            allow_shrink: settings.allow_shrink,
            explicit,
        };
        let (decision, waiting) =
            match (ring::resolve(current.as_ref(), &earlier, request), &current) {
                (Ok(decision), _) => (decision, false),
                // A replica waits (following the recorded ring) rather than
                // fail; `urutan topology` refuses.
                (Err(busy @ RingError::InProgress { .. }), Some(current)) if !explicit => {
                    warn!(
                        refused = %busy,
                        "waiting for the resharding in progress; following the recorded ring \
                         until it completes"
                    );
                    let follow = Plan::Follow {
                        recorded: current.shard_count,
                        configured: settings.shard_count,
                        versi: current.versi,
                    };
                    (follow, true)
                }
                (Err(refused), _) => return Err(Refused::from(refused).into()),
            };
        if let (
            Plan::Follow {
                recorded,
                configured,
                ..
            },
            false,
        ) = (decision, waiting)
        {
            warn!(
                shard_count = configured,
                recorded,
                "SHARD_COUNT here is a count the ring had before it was resharded: following \
                 the recorded ring; set SHARD_COUNT to the recorded count on this replica"
            );
        }
        // Before anything the new ring routes can be consumed: a resharding
        // changes the bindings below, and a broker restart may have rebuilt
        // the ring already.
        let restarted = broker::restart::restarted(conn, names).await?;
        if restarted {
            handoff::open_window(&mut db, "broker restarted").await?;
        }
        if let Plan::Change { from, to } = decision {
            // A first record changes the bindings only if the broker has
            // another number of shards (a deployment from before the record).
            let from = match from {
                Some(from) => Some(from),
                None => Some(topology::count_existing_shards(conn, names).await?)
                    .filter(|&existing| existing != 0 && existing != to),
            };
            if let Some(from) = from {
                handoff::open_window(&mut db, &format!("resharding {from} -> {to}")).await?;
            }
        }
        let (target, allow_shrink) = (
            decision.target(),
            decision.allows_shrink(settings.allow_shrink),
        );
        let mut mode = settings.topology_mode;
        let mut plan = match mode {
            TopologyMode::Declare => {
                let queues = topology::QueueSettings {
                    delivery_limit: settings.delivery_limit,
                    quorum_group_size: settings.quorum_group_size,
                };
                topology::declare_with(conn, names, target, queues, allow_shrink).await
            }
            TopologyMode::Check => topology::check(conn, names, target, allow_shrink).await,
        };
        if let Err(TopologyError::AccessRefused { detail }) = &plan
            && !explicit
        {
            // Once per process, also if a transient failure after it makes
            // this pool ask again before it switched to checking.
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                warn!(
                    refused = %detail,
                    "this broker user may not declare the topology: checking it passively \
                     instead (as TOPOLOGY_MODE=check does). Set TOPOLOGY_MODE=check to skip \
                     the attempt; a new SHARD_COUNT needs `urutan topology` run as a user \
                     allowed to configure the topology (deploy/rabbitmq/least-privilege.sh \
                     makes one)"
                );
            });
            mode = TopologyMode::Check;
            plan = topology::check(conn, names, target, allow_shrink).await;
        }
        let plan = match plan {
            Ok(plan) => plan,
            Err(TopologyError::Broker(e)) => return Err(e.into()),
            Err(fatal) => return Err(Refused::from(fatal).into()),
        };
        if restarted && mode == TopologyMode::Check {
            mark_broker_alive(conn, names).await?;
        }
        handoff::register_shards(&mut db, plan.consumed).await?;
        let epoch = match handoff::open_epoch(&mut db, conn, names, "topology prepared").await {
            Ok(epoch) => epoch,
            Err(EpochError::Broker(broker::BrokerError::Amqp(e)))
                if topology::is_access_refused(&e) =>
            {
                return Err(Refused::Markers(topology::refusal_text(&e)).into());
            }
            Err(e) => return Err(e.into()),
        };
        handoff::close_windows(&mut db, epoch).await?;
        let ring = match decision {
            Plan::Change { from, to } => {
                let who = ring::requester(if explicit { "topology" } else { "run" });
                let versi = ring::record_change(&mut db, (from, to), epoch, &who).await?;
                if let Some(from) = from {
                    info!(from, to, epoch, "resharding started");
                }
                versi
            }
            Plan::Keep { versi, .. } | Plan::Follow { versi, .. } => versi,
        };
        Ok(Prepared {
            plan,
            epoch,
            ring,
            waiting,
            declare_refused: mode != settings.topology_mode,
        })
    }
    .await;
    handoff::resume_publishing(db).await;
    marked
}

/// Declares the restart sentinel once the window for the restart it
/// revealed is recorded (in check mode: `topology::declare` does it
/// otherwise). A user without configure permission on it (a
/// least-privilege worker, `TOPOLOGY_MODE=check`) cannot: then every
/// connection looks like the first after a restart, which is safe (a window
/// each time: messages that are not their order's next version wait for the
/// epoch) but slower; say once how to fix it.
async fn mark_broker_alive(conn: &lapin::Connection, names: &Names) -> Result<(), EpochError> {
    static WARNED: std::sync::Once = std::sync::Once::new();
    match broker::restart::declare_sentinel(conn, names).await {
        Ok(()) => Ok(()),
        Err(broker::BrokerError::Amqp(e)) if broker::topology::is_access_refused(&e) => {
            WARNED.call_once(|| {
                warn!(
                    exchange = %names.restart_sentinel(),
                    "cannot declare the restart sentinel (ACCESS_REFUSED): every reconnect is \
                     treated as a broker restart (safe, but messages that skip a version wait \
                     for the epoch each time); grant this user configure permission on it \
                     (deploy/rabbitmq/least-privilege.sh does)"
                );
            });
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// Runs the workers of one connection until they all end (shutdown or loss).
#[allow(clippy::too_many_arguments)]
async fn run_workers(
    settings: &Settings,
    hooks: &Hooks,
    pool: &PgPool,
    health: &Arc<Health>,
    names: &Names,
    conn: &Arc<lapin::Connection>,
    plan: ShardPlan,
    stop: &CancellationToken,
) {
    let workers = TaskTracker::new();
    for shard in 0..plan.consumed {
        let worker = ShardWorker {
            shard,
            queue: names.shard_queue(shard),
            prefetch: settings.prefetch,
            batch_size: settings.batch_size(),
            batch_linger: Duration::from_millis(settings.batch_linger_ms),
            delivery_limit: settings.delivery_limit,
            max_body_bytes: settings.max_body_bytes as usize,
            database_timeout: settings.database_timeout + Duration::from_secs(5),
            pool: pool.clone(),
            health: health.clone(),
            hooks: hooks.clone(),
        };
        workers.spawn(worker.run(conn.clone(), stop.clone()));
    }
    workers.close();
    workers.wait().await;
}

/// Calls `attempt` with capped, jittered exponential backoff until it
/// succeeds; `None` if `shutdown` came first.
async fn retry_until_ready<T, E, F, Fut>(
    what: &str,
    shutdown: &CancellationToken,
    mut attempt: F,
) -> Option<T>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    // At most 3 s plus up to 100 % jitter between attempts: back within
    // seconds once the service is.
    let mut backoff = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_secs(3))
        .with_jitter()
        .without_max_times()
        .build();
    loop {
        let result = tokio::select! {
            () = shutdown.cancelled() => return None,
            result = attempt() => result,
        };
        match result {
            Ok(value) => return Some(value),
            Err(e) => {
                let delay = backoff.next().unwrap_or(Duration::from_secs(3));
                error!(error = %e, retry_in = ?delay, "{what} unavailable");
                tokio::select! {
                    () = shutdown.cancelled() => return None,
                    () = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}
