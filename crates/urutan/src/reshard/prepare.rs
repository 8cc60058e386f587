//! Topology preparation: what a pool (`urutan run`) or `urutan topology`
//! does before any worker consumes. `SHARD_COUNT` is resolved against the
//! recorded ring ([`ring`]), the topology declared (or checked) for the
//! result, and an epoch opened ([`handoff`]), with relay publishing paused
//! meanwhile: when the ring changes (shards bound or unbound), every message
//! routed by the old ring is queued before the epoch's marker and every
//! message routed by the new one after it.

use sqlx::{PgConnection, PgPool};
use tracing::{info, warn};

use crate::broker::{self, Names, ShardPlan, TopologyError, topology};
use crate::config::{Settings, TopologyMode};
use crate::reshard::handoff::{self, EpochError};
use crate::reshard::ring::{self, Plan, RingError};

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

/// Prepares the topology for `settings` (see the module doc), in a database
/// session of its own that holds the relay's publishing paused: if this is
/// cancelled half-way, dropping the session ends the pause. `explicit`:
/// asked by `urutan topology`, which may set the ring back to an earlier
/// count and is refused where a replica waits.
pub async fn prepare_topology(
    settings: &Settings,
    names: &Names,
    pool: &PgPool,
    conn: &lapin::Connection,
    explicit: bool,
) -> Result<Prepared, PrepareError> {
    let mut db = pool.acquire().await?.detach();
    handoff::pause_publishing(&mut db, names).await?;
    let prepared = prepare_paused(&mut db, settings, names, conn, explicit).await;
    handoff::resume_publishing(db).await;
    prepared
}

/// [`prepare_topology`]'s steps, publishing paused: plan, windows for what
/// moves, bindings, epoch.
async fn prepare_paused(
    db: &mut PgConnection,
    settings: &Settings,
    names: &Names,
    conn: &lapin::Connection,
    explicit: bool,
) -> Result<Prepared, PrepareError> {
    let (decision, waiting) = resolve_plan(db, settings, explicit).await?;
    // Before anything the new ring routes can be consumed: a resharding
    // changes the bindings below, and a broker restart may have rebuilt the
    // ring already.
    let restarted = broker::restart::restarted(conn, names).await?;
    if restarted {
        // No ring recorded and no shard queue yet: urutan never ran here,
        // so the sentinel is missing because it was never declared, not
        // because the broker restarted. The window is no news then.
        let first_start = matches!(decision, Plan::Change { from: None, .. })
            && topology::count_existing_shards(conn, names).await? == 0;
        if first_start {
            info!("first start on this database: declaring the topology and the restart sentinel");
            handoff::open_window_quietly(db, "first start").await?;
        } else {
            handoff::open_window(db, "broker restarted").await?;
        }
    }
    if let Plan::Change { from, to } = decision {
        open_resharding_window(db, conn, names, from, to).await?;
    }
    let (plan, mode) = bind(settings, names, conn, decision, explicit).await?;
    if restarted && mode == TopologyMode::Check {
        mark_broker_alive(conn, names).await?;
    }
    let (epoch, ring) = start_epoch(db, conn, names, decision, plan, explicit).await?;
    Ok(Prepared {
        plan,
        epoch,
        ring,
        waiting,
        declare_refused: mode != settings.topology_mode,
    })
}

/// `SHARD_COUNT` against the recorded ring: the plan, and whether this
/// replica waits for a resharding in progress (following the recorded
/// ring meanwhile; `urutan topology` is refused instead).
async fn resolve_plan(
    db: &mut PgConnection,
    settings: &Settings,
    explicit: bool,
) -> Result<(Plan, bool), PrepareError> {
    let current = ring::current(db).await?;
    let earlier = ring::earlier_counts(db).await?;
    let request = ring::Request {
        wanted: settings.shard_count,
        allow_shrink: settings.allow_shrink,
        explicit,
    };
    match (ring::resolve(current.as_ref(), &earlier, request), &current) {
        (Ok(decision), _) => {
            if let Plan::Follow {
                recorded,
                configured,
                ..
            } = decision
            {
                warn!(
                    shard_count = configured,
                    recorded,
                    "SHARD_COUNT here is a count the ring had before it was resharded: \
                     following the recorded ring; set SHARD_COUNT to the recorded count on \
                     this replica"
                );
            }
            Ok((decision, false))
        }
        (Err(busy @ RingError::InProgress { .. }), Some(current)) if !explicit => {
            warn!(
                refused = %busy,
                "waiting for the resharding in progress; following the recorded ring until it \
                 completes"
            );
            let follow = Plan::Follow {
                recorded: current.shard_count,
                configured: settings.shard_count,
                version: current.version,
            };
            Ok((follow, true))
        }
        (Err(refused), _) => Err(Refused::from(refused).into()),
    }
}

/// A window for a change of the bindings from `from` to `to` shards. A first
/// record (`from` unknown) changes them only if the broker has another
/// number of shards (a deployment from before the record).
async fn open_resharding_window(
    db: &mut PgConnection,
    conn: &lapin::Connection,
    names: &Names,
    from: Option<u16>,
    to: u16,
) -> Result<(), PrepareError> {
    let from = match from {
        Some(from) => Some(from),
        None => Some(topology::count_existing_shards(conn, names).await?)
            .filter(|&existing| existing != 0 && existing != to),
    };
    if let Some(from) = from {
        handoff::open_window(db, &format!("resharding {from} -> {to}")).await?;
    }
    Ok(())
}

/// Declares the topology for `decision` (or checks it, in check mode, or
/// when the broker refuses this user the declare); returns the shards and
/// the mode that did it.
async fn bind(
    settings: &Settings,
    names: &Names,
    conn: &lapin::Connection,
    decision: Plan,
    explicit: bool,
) -> Result<(ShardPlan, TopologyMode), PrepareError> {
    let target = decision.target();
    let allow_shrink = decision.allows_shrink(settings.allow_shrink);
    let mut mode = settings.topology_mode;
    let mut plan = match mode {
        TopologyMode::Declare => {
            let queues = topology::QueueSettings {
                delivery_limit: settings.delivery_limit,
                quorum_group_size: settings.quorum_group_size,
                dlq: topology::DlqCaps {
                    max_length: settings.dlq_max_length,
                    max_bytes: settings.dlq_max_bytes,
                },
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
    match plan {
        Ok(plan) => Ok((plan, mode)),
        Err(TopologyError::Broker(e)) => Err(e.into()),
        Err(fatal) => Err(Refused::from(fatal).into()),
    }
}

/// Once the bindings are in place: the shards registered, an epoch opened
/// (its marker in every shard queue), the open windows closed by it, and a
/// change of the ring recorded. Returns the epoch and the ring's `versi`.
async fn start_epoch(
    db: &mut PgConnection,
    conn: &lapin::Connection,
    names: &Names,
    decision: Plan,
    plan: ShardPlan,
    explicit: bool,
) -> Result<(i64, i64), PrepareError> {
    handoff::register_shards(db, plan.consumed).await?;
    let epoch = match handoff::open_epoch(db, conn, names, "topology prepared").await {
        Ok(epoch) => epoch,
        Err(EpochError::Broker(broker::BrokerError::Amqp(e)))
            if topology::is_access_refused(&e) =>
        {
            return Err(Refused::Markers(topology::refusal_text(&e)).into());
        }
        Err(e) => return Err(e.into()),
    };
    handoff::close_windows(db, epoch).await?;
    let ring = match decision {
        Plan::Change { from, to } => {
            let who = ring::requester(if explicit { "topology" } else { "run" });
            let version = ring::record_change(db, (from, to), epoch, &who).await?;
            if let Some(from) = from {
                info!(from, to, epoch, "resharding started");
            }
            version
        }
        Plan::Keep { version, .. } | Plan::Follow { version, .. } => version,
    };
    Ok((epoch, ring))
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
