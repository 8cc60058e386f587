//! `urutan run`: prepares the database and the topology, then keeps one
//! worker per shard this replica is placed on (see `replica`) consuming,
//! each on a broker connection of its own that it reconnects alone when
//! lost (see `shard::link`), until shutdown. The
//! pool's own connection (`urutan run`) prepares the topology; when it is
//! lost, or a shard finds the broker restarted, the workers stop cleanly
//! and everything is prepared again.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use crate::broker::{self, Names, ShardPlan};
use crate::config::{Settings, TopologyMode};
use crate::handler::SharedHandler;
use crate::heal::{self, Unhealable};
use crate::health::{self, Health, Role};
use crate::metrics as m;
use crate::replica::Membership;
use crate::replica::workers::Workers;
use crate::reshard::handoff::EpochError;
use crate::reshard::prepare::{PrepareError, Prepared, prepare_topology};
use crate::reshard::ring;
use crate::shard::{Hooks, Link, ShardWorker};
use crate::store;

/// Why `run` stopped with an error: only conditions a restart cannot fix.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Prepare(#[from] PrepareError),
    #[error("cannot serve HTTP: {0}")]
    Http(#[from] std::io::Error),
    /// `METRICS_ADDR` cannot be bound (in use, or not this host's).
    #[error("cannot listen on METRICS_ADDR {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    /// A setting no retry can fix (one line naming it and the fix).
    #[error("{0}")]
    Setting(String),
}

/// A worker pool, built (HTTP port bound) but not yet running.
pub struct Supervisor {
    settings: Settings,
    hooks: Hooks,
    /// The team's Rust handler ([`Self::with_handler`]).
    handler: Option<SharedHandler>,
    listener: TcpListener,
    metrics: PrometheusHandle,
    health: Arc<Health>,
}

impl Supervisor {
    /// Binds `METRICS_ADDR` (port 0 picks a free one, see [`Self::http_addr`]).
    pub async fn build(settings: Settings) -> Result<Self, RunError> {
        Self::build_with_hooks(settings, Hooks::default()).await
    }

    /// [`Self::build`] with fault-injection and observation hooks in every
    /// worker: for tests, crash drills and the demo, not for production.
    #[doc(hidden)]
    pub async fn build_with_hooks(settings: Settings, hooks: Hooks) -> Result<Self, RunError> {
        let listener = TcpListener::bind(settings.metrics_addr)
            .await
            .map_err(|source| RunError::Listen {
                addr: settings.metrics_addr,
                source,
            })?;
        let metrics = m::install();
        m::register_worker();
        Ok(Self {
            settings,
            hooks,
            handler: None,
            listener,
            metrics,
            health: Arc::new(Health::new(Role::Worker)),
        })
    }

    /// Runs `handler` in the apply transaction of every applied version
    /// (docs/contract.md section 10), besides any `HANDLER_FUNCTION`.
    pub fn with_handler(mut self, handler: SharedHandler) -> Self {
        self.handler = Some(handler);
        self
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
            handler,
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
        let db_outage = heal::database_outage(&settings.database_url);
        let failed = |e: &sqlx::Error| db_outage.failed(&heal::database_cause(e));
        // A refusal no retry can fix (a wrong password, no such database, a
        // role that may not migrate) ends `run` at start.
        let prepared = retry_until_ready(&shutdown, failed, || async {
            match store::prepare(&database, settings.pool_size()).await {
                Ok(pool) => Ok(Ok(pool)),
                Err(e) => match Unhealable::database(&settings.database_url, &e) {
                    Some(refused) => Ok(Err(refused)),
                    None => Err(e),
                },
            }
        })
        .await;
        let pool = match prepared {
            None => {
                background.cancel();
                return Ok(());
            }
            Some(Err(refused)) => {
                background.cancel();
                return Err(RunError::Setting(refused.to_string()));
            }
            Some(Ok(pool)) => pool,
        };
        db_outage.recovered();
        info!(database = %settings.database_url, "database ready (migrations applied)");
        // Today's day partitions before any worker writes (after a week
        // without a pool they would be missing; the retention task keeps
        // them ahead from here on).
        match store::prepare_partitions(&pool).await {
            Ok(0) => {}
            Ok(n) => info!(partitions = n, "created the day partitions ahead"),
            Err(e) => {
                warn!(error = %e, "could not create the day partitions ahead; the retention task will try again")
            }
        }
        // Before anything consumes or records this process's entity: the
        // pipeline this schema holds must be the one these settings name.
        if let Some(refusal) = pipeline_refusal(&pool, &settings).await {
            background.cancel();
            pool.close().await;
            return Err(RunError::Setting(refusal));
        }
        record_producer_defaults(&pool, &settings).await;
        if let Some(handler) = &settings.handler_function {
            let checked =
                retry_until_ready(&shutdown, failed, || store::check_handler(&pool, handler)).await;
            if let Some(Err(wrong)) = checked {
                background.cancel();
                pool.close().await;
                return Err(RunError::Setting(wrong));
            }
            db_outage.recovered();
            info!(handler = %handler, "the handler is called in every apply transaction");
        }
        health.set_database(true);
        tasks.spawn(health::watch_database(
            pool.clone(),
            health.clone(),
            background.clone(),
        ));
        tasks.spawn(store::hold::watch(
            pool.clone(),
            settings.gap_timeout,
            background.clone(),
        ));
        tasks.spawn(store::run_retention(
            pool.clone(),
            store::Retention::of(&settings),
            background.clone(),
        ));

        let result = consume_until_shutdown(
            &settings,
            (&hooks, handler.as_ref()),
            &pool,
            &health,
            &shutdown,
        )
        .await;
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

/// What runs besides urutan's own code in each worker: the hooks (tests,
/// drills, the demo) and the team's Rust handler.
type Code<'a> = (&'a Hooks, Option<&'a SharedHandler>);

/// The broker loop: connect, declare, run one worker per shard; when the
/// pool's connection is lost (or a shard saw a broker restart), count it,
/// back off and do it again. When the
/// recorded ring changes (another replica or `urutan topology` resharded),
/// stop the workers gracefully and prepare again.
async fn consume_until_shutdown(
    settings: &Settings,
    code: Code<'_>,
    pool: &PgPool,
    health: &Arc<Health>,
    shutdown: &CancellationToken,
) -> Result<(), RunError> {
    let names = settings.names();
    let mut lost_before = false;
    // Until the pool first consumes, a refusal no retry can fix (a wrong
    // password, an unknown vhost) ends `run`; afterwards (a password
    // changed while running) it is retried like an outage.
    let mut started = false;
    let broker_outage = heal::broker_outage(&settings.amqp_url);
    let db_outage = heal::database_outage(&settings.database_url);
    // Switched to check mode once the broker refused a declare: a refusal
    // is not transient, and asking again only repeats it.
    let mut prepare_with = settings.clone();
    // This replica's lease and placement live across reconnects.
    let membership = Membership::new(settings.replica(), pool.clone());
    health.expect_placement();
    info!(replica = %membership.name, "joining the pipeline's replicas");
    loop {
        let failed = |e: &PrepareError| match e {
            PrepareError::Unavailable(EpochError::Database(e)) => {
                db_outage.failed(&heal::database_cause(e));
            }
            PrepareError::Unavailable(EpochError::Broker(e)) => {
                broker_outage.failed(&heal::broker_cause(e));
            }
            other => broker_outage.failed(&heal::one_line(&other.to_string())),
        };
        // Retried while the broker or the database fails; a refusal ends `run`.
        let connected = retry_until_ready(shutdown, failed, || async {
            match connect_and_mark(&prepare_with, &names, pool).await {
                Err(refused) if !refused.is_retryable() => Ok(Err(refused.into())),
                Err(PrepareError::Unavailable(EpochError::Broker(e))) if !started => {
                    match Unhealable::broker(&settings.amqp_url, &e) {
                        Some(refused) => Ok(Err(RunError::Setting(refused.to_string()))),
                        None => Err(PrepareError::Unavailable(EpochError::Broker(e))),
                    }
                }
                attempt => attempt.map(Ok),
            }
        })
        .await;
        let Some(connected) = connected else {
            return Ok(());
        };
        let (conn, node, prepared) = connected?;
        broker_outage.recovered();
        db_outage.recovered();
        started = true;
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
        announce(settings, health, &plan, lost_before);

        // Everything of this connection stops with `stop`: on shutdown, on
        // a connection loss (the workers end) or when the ring changed.
        let stop = shutdown.child_token();
        let (side_tasks, watcher) = spawn_side_tasks(
            pool,
            &conn,
            &names,
            (ring, waiting),
            plan,
            epoch,
            health,
            &stop,
        );
        let (owned_tx, owned) = watch::channel(None);
        let member = tokio::spawn(membership.clone().keep(
            plan.consumed,
            health.clone(),
            owned_tx,
            stop.clone(),
            shutdown.clone(),
        ));
        let link = shard_link(settings, &conn, &names, node).await;
        // Shared by this replica's workers: after a loss to each other, their
        // apply transactions take turns (`shard::contention`).
        let contention = Arc::new(crate::shard::Contention::default());
        let make = |shard| shard_worker(settings, code, pool, health, &names, &contention, shard);
        let mut workers = Workers::new(make, link.clone(), health.clone(), stop.clone());
        tokio::select! {
            () = workers.follow(owned) => {}
            () = stop.cancelled() => {}
            () = link.restart_seen.cancelled() => {}
            () = lost(&conn) => warn!("lost the pool's broker connection"),
        }
        stop.cancel();
        workers.stop_all().await;
        let _ = member.await;
        let ring_changed = wind_down((side_tasks, watcher), health, &conn).await;
        if shutdown.is_cancelled() {
            info!("all shards stopped; broker connections closed");
            return Ok(());
        }
        if ring_changed {
            info!("workers stopped for the new ring; preparing it");
            lost_before = false;
        } else {
            warn!("reconnecting to the broker and preparing the topology again");
            lost_before = true;
        }
    }
}

/// Logs and counts that the pool consumes again (a reconnect when the
/// connection was lost before), and tells the health endpoints.
fn announce(settings: &Settings, health: &Health, plan: &ShardPlan, lost_before: bool) {
    if lost_before {
        metrics::counter!(m::BROKER_RECONNECTS_TOTAL).increment(1);
        info!("reconnected to the broker");
    }
    info!(broker = %settings.amqp_url, shards = plan.consumed, bound = plan.bound,
          prefetch = settings.prefetch, "consuming");
    // The shards are owned as the membership places them.
    health.broker_up(0);
    metrics::gauge!(m::SHARDS).set(f64::from(plan.bound));
}

/// After `stop` was cancelled and the workers stopped: waits for the side
/// tasks and closes the connection. Returns whether the recorded ring changed.
async fn wind_down(
    (side_tasks, watcher): (TaskTracker, tokio::task::JoinHandle<bool>),
    health: &Health,
    conn: &lapin::Connection,
) -> bool {
    let ring_changed = watcher.await.unwrap_or(false);
    side_tasks.wait().await;
    health.broker_down();
    if conn.status().connected() {
        let _ = broker::call("connection.close", conn.close(200, "shutdown".into())).await;
    }
    ring_changed
}

/// The tasks beside the workers of one connection, stopped by `stop`: the
/// ring watcher (its handle: whether the ring changed) and, when shrinking,
/// the retirement of the removed shards.
#[allow(clippy::too_many_arguments)]
fn spawn_side_tasks(
    pool: &PgPool,
    conn: &Arc<lapin::Connection>,
    names: &Names,
    watched: (i64, bool),
    plan: ShardPlan,
    epoch: i64,
    health: &Arc<Health>,
    stop: &CancellationToken,
) -> (TaskTracker, tokio::task::JoinHandle<bool>) {
    let side_tasks = TaskTracker::new();
    let watcher = side_tasks.spawn(ring::watch(pool.clone(), watched, stop.clone()));
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
    (side_tasks, watcher)
}

/// What the shards of connection `conn` share of it.
async fn shard_link(
    settings: &Settings,
    conn: &lapin::Connection,
    names: &Names,
    node: usize,
) -> Arc<Link> {
    // Probed once more: whether the shards' connections can tell a
    // restart by it (see `shard::link`).
    let sentinel = !broker::restart::restarted(conn, names)
        .await
        .unwrap_or(true);
    Arc::new(Link {
        broker: settings.broker(),
        names: names.clone(),
        node: node.into(),
        sentinel,
        restart_seen: CancellationToken::new(),
    })
}

/// Resolves once `conn` is no longer connected (looked at every 250 ms).
async fn lost(conn: &lapin::Connection) {
    while conn.status().connected() {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Connects, then [`prepare_topology`].
async fn connect_and_mark(
    settings: &Settings,
    names: &Names,
    pool: &PgPool,
) -> Result<(lapin::Connection, usize, Prepared), PrepareError> {
    let (conn, node) = broker::connect_indexed(&settings.broker(), "urutan run").await?;
    let prepared = prepare_topology(settings, names, pool, &conn, false).await?;
    Ok((conn, node, prepared))
}

/// The worker of `shard`, on a broker connection of its own (see
/// `shard::link`), started when the placement gives this replica the shard.
fn shard_worker(
    settings: &Settings,
    code: Code<'_>,
    pool: &PgPool,
    health: &Arc<Health>,
    names: &Names,
    contention: &Arc<crate::shard::Contention>,
    shard: u16,
) -> ShardWorker {
    ShardWorker {
        shard,
        queue: names.shard_queue(shard),
        entity_header: names.entity_header().to_owned(),
        entry_exchange: names.entry_exchange(),
        dead_letter_exchange: names.dead_letter_exchange(),
        retry: crate::store::hold::RetryPolicy::of(settings),
        prefetch: settings.prefetch,
        batch_size: settings.batch_size(),
        batch_linger: Duration::from_millis(settings.batch_linger_ms),
        delivery_limit: settings.delivery_limit,
        max_body_bytes: settings.max_body_bytes as usize,
        database_timeout: settings.database_timeout + Duration::from_secs(5),
        pool: pool.clone(),
        health: health.clone(),
        hooks: code.0.clone(),
        handler: code.1.cloned(),
        traces: settings.traces.clone(),
        contention: contention.clone(),
    }
}

/// Calls `attempt` with capped, jittered exponential backoff until it
/// succeeds, telling `failed` of each failure (an [`heal::Outage`] logs one
/// line per change, not one per attempt); `None` if `shutdown` came first.
async fn retry_until_ready<T, E, F, Fut>(
    shutdown: &CancellationToken,
    failed: impl Fn(&E),
    mut attempt: F,
) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut backoff = crate::retry::backoff();
    loop {
        let result = tokio::select! {
            () = shutdown.cancelled() => return None,
            result = attempt() => result,
        };
        match result {
            Ok(value) => return Some(value),
            Err(e) => {
                failed(&e);
                let delay = crate::retry::next_delay(&mut backoff);
                if !crate::retry::sleep_unless_stopped(delay, shutdown).await {
                    return None;
                }
            }
        }
    }
}

/// Why this pool must not run on this schema (`ENTITY` names another
/// pipeline than the one it holds), if it can tell; a failed look is no
/// verdict (the pool's own reads will meet what failed).
async fn pipeline_refusal(pool: &PgPool, settings: &Settings) -> Option<String> {
    let mut conn = pool.acquire().await.ok()?;
    let found = store::pipeline::look(&mut conn, settings).await.ok()?;
    found.refusal()
}

/// Keeps `urutan_enqueue`'s defaults (entity, topology prefix, body limit)
/// equal to this pool's settings. Never fatal: what it cannot write only
/// affects SQL producers that rely on the default routing key, so it says
/// what to do and the pool goes on.
async fn record_producer_defaults(pool: &PgPool, settings: &Settings) {
    use crate::outbox::defaults::{self, Recorded};
    match defaults::record(pool, settings).await {
        Ok(Recorded::Unchanged) => {}
        Ok(Recorded::Written) => info!(
            prefix = %settings.topology_prefix,
            "urutan_enqueue's default routing key is now <prefix>.<status>"
        ),
        Ok(Recorded::Refused) => warn!(
            prefix = %settings.topology_prefix,
            "urutan_pengaturan names another entity, prefix or MAX_BODY_BYTES and this role may \
             not change it: run `urutan migrate` with these settings as the database owner"
        ),
        Err(e) => warn!(error = %e, "could not record urutan_enqueue's defaults"),
    }
    match store::pipeline::name_views(pool, &settings.entity, false).await {
        Ok(views) if views.is_empty() => {}
        Ok(views) => debug!(?views, "the entity's views are up to date"),
        Err(e) => warn!(
            error = %e,
            entity = %settings.entity,
            "could not create the entity's views (<entity>, <entity>_riwayat): run `urutan \
             migrate` as the database owner"
        ),
    }
}
