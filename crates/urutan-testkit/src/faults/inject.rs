//! The fault kinds and how each is injected into a running fleet. Each
//! injection returns when the fault is over (the process restarted, the
//! broker or database back): that instant starts the recovery clock.

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use anyhow::Context;
use chrono::{DateTime, Utc};
use rand::RngExt;
use rand::rngs::StdRng;
use serde::Serialize;
use sqlx::PgPool;

use crate::faults::fleet::Fleet;
use crate::faults::links::{DbName, Links};
use crate::faults::payee::Payee;
use crate::faults::services::Services;
use crate::scratch::Scratch;

/// A fault the suite injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// The active replica aborts after an outcome is durable, before its ack.
    WorkerCommitAck,
    /// SIGKILL of the active replica with work in flight, as soon as one of
    /// its transactions is open (seen in `pg_stat_activity`) if within 2 s.
    WorkerKillInFlight,
    /// The relay aborts after a batch is confirmed, before it is marked sent.
    RelayPublishMark,
    /// `rabbitmqctl close_all_connections` for the run's vhost.
    CloseConnections,
    /// `stop_app`, 0-3 s, `start_app` with the fleet running.
    BrokerRestart,
    /// Workers stopped, a backlog queued, `stop_app`/`start_app` (the ring
    /// is rebuilt in another order), workers started again.
    BrokerRestartBacklog,
    /// The database cluster stopped for 10-30 s, then started.
    DbStop,
    /// The database cluster restarted.
    DbRestart,
    /// Rolling restart: a new replica started, the active one SIGTERMed.
    RollingSigterm,
    /// SIGKILL of the effects dispatcher while the payment endpoint is
    /// answering one of its requests (the charge made, the answer not yet
    /// read), if one is seen within 2 s; a new dispatcher started.
    DispatcherKillMidRequest,
    /// Every process's broker link silent for 15 s: bytes dropped both ways,
    /// sockets kept open (a dead load balancer); then passing again. With
    /// `AMQP_HEARTBEAT=5` the links are given up after ~2 heartbeats.
    BrokerBlackhole,
    /// Every process's database link silent for 10-20 s, sockets kept open
    /// (`DATABASE_TIMEOUT=5s` bounds each apply).
    DbBlackhole,
    /// 100 ms ± 50 ms more one way on every broker and database link for
    /// 10 s (a congested or far network), then back to normal.
    WireLatency,
    /// Cluster: SIGKILL of the node that leads most shard queues. The
    /// recovery clock starts at the kill (the other two must take over);
    /// the node is started again after the measurement.
    NodeKillBusiest,
    /// Cluster: every node restarted one by one (`cluster.sh rolling`, each
    /// once no quorum queue depends on it); the clock starts after the last.
    NodeRolling,
    /// Cluster: the node that leads most shard queues frozen (SIGSTOP) for
    /// 30 s, then thawed; the clock starts at the thaw.
    NodeFreeze,
    /// Cluster: the node that leads most shard queues cut off from the
    /// other two for 30 s (`cluster.sh partition`: the Erlang distribution
    /// between them refused, the clients' links to every node kept), then
    /// healed; the clock starts at the heal.
    NodePartition,
    /// Cluster: workers stopped, a backlog queued, all three nodes stopped
    /// and started (`cluster.sh full-restart`), workers started again.
    ClusterFullRestartBacklog,
    /// Pair mode: the primary killed (`-m immediate`, a crash), its
    /// synchronous standby promoted, the database's name moved to it and the
    /// connections through the name closed; the clock starts once the name
    /// points at the new primary. After the measurement the old primary
    /// rejoins as the standby (`pair.sh rejoin`), so the next failover has
    /// one to go to.
    DbFailover,
}

impl Kind {
    pub const ALL: [Kind; 13] = [
        Kind::WorkerCommitAck,
        Kind::WorkerKillInFlight,
        Kind::RelayPublishMark,
        Kind::CloseConnections,
        Kind::BrokerRestart,
        Kind::BrokerRestartBacklog,
        Kind::DbStop,
        Kind::DbRestart,
        Kind::RollingSigterm,
        Kind::DispatcherKillMidRequest,
        Kind::BrokerBlackhole,
        Kind::DbBlackhole,
        Kind::WireLatency,
    ];

    /// The faults of a run against the three-node cluster (`FAULTS_CLUSTER`).
    pub const CLUSTER: [Kind; 5] = [
        Kind::NodeKillBusiest,
        Kind::NodeRolling,
        Kind::NodeFreeze,
        Kind::NodePartition,
        Kind::ClusterFullRestartBacklog,
    ];

    /// The faults a run on a database pair (`FAULTS_PG_PAIR`) adds to [`Kind::ALL`].
    pub const PAIR: [Kind; 1] = [Kind::DbFailover];

    pub fn label(self) -> &'static str {
        match self {
            Kind::WorkerCommitAck => "worker abort between commit and ack",
            Kind::WorkerKillInFlight => "worker SIGKILL in flight / mid-transaction",
            Kind::RelayPublishMark => "relay abort between publish and mark-sent",
            Kind::CloseConnections => "rabbitmqctl close_all_connections",
            Kind::BrokerRestart => "broker restart (stop_app/start_app)",
            Kind::BrokerRestartBacklog => "broker restart with a backlog",
            Kind::DbStop => "database stopped 10-30 s",
            Kind::DbRestart => "database restart",
            Kind::RollingSigterm => "SIGTERM under load (rolling restart)",
            Kind::DispatcherKillMidRequest => "effects dispatcher SIGKILL mid-request",
            Kind::BrokerBlackhole => "broker links blackholed 15 s",
            Kind::DbBlackhole => "database links blackholed 10-20 s",
            Kind::WireLatency => "100 ms (± 50) added to every link for 10 s",
            Kind::NodeKillBusiest => "cluster: SIGKILL of the busiest node (then restarted)",
            Kind::NodeRolling => "cluster: rolling restart of the three nodes",
            Kind::NodeFreeze => "cluster: busiest node frozen 30 s",
            Kind::NodePartition => "cluster: busiest node cut off from the others 30 s",
            Kind::ClusterFullRestartBacklog => "cluster: full stop and start with a backlog",
            Kind::DbFailover => "database failover: primary killed, standby promoted, DNS moved",
        }
    }

    /// The recovery goal: 5 s after a process restart, 10 s after the
    /// broker or the database is back (a lost cluster node: below). A full
    /// cluster stop and start takes
    /// 40-50 s, during which the producers keep writing (~6,000 outbox
    /// events at 150/s, and the direct producer's): the probe queues behind
    /// all of that (6,000-12,000 messages when the workers start), so its
    /// recovery is a backlog drain at ~170-190 messages/s on 2 cores: 60 s
    /// (measured 35 s in the first run with a 10 s goal, then 53.3 s and
    /// 67.6 s with 11,553 queued). A single broker's restart with a backlog is the
    /// same story on a smaller scale: the probe, published after the
    /// restart, queues behind the workers' backlog (3,862 messages in one
    /// CI run): 15 s (measured 7.7 s at most in the 3.10 soak, 21.6 s and
    /// 23.0 s in CI runs on 4.3.6 and 4.0.5).
    ///
    /// A lost node, whatever lost it (SIGKILL, partition, freeze, or the
    /// rolling restart that follows one): 70 s. RabbitMQ 4.x quorum queues keep the
    /// messages checked out to a consumer whose node went away, and with single
    /// active consumer its active slot, for `consumer_disconnected_timeout`
    /// (60 s by default) before handing them to the standby: a shard whose
    /// active consumer's connection was on the killed node stalls ~60 s
    /// (measured: 0.3-4.6 s when no active consumer was there, 60 s and
    /// over 60 s when one was). Shortening it (policy
    /// `consumer-disconnected-timeout`) is a decision for the deployment.
    /// The stall outlives the fault that caused it: a frozen node measured
    /// 59.1 s and a rolling restart 39.6 s and 84.7 s when a SIGKILL came
    /// just before them (a rolling restart alone: 0.5 s).
    ///
    /// A database failover: 10 s from the moment the name points at the
    /// promoted standby, as after the database is back: to the processes it
    /// is a database restart under the same name (their connections closed,
    /// new ones to a server that takes writes). The kill-to-move time is the
    /// provider's (here about 1 s; minutes on some managed services) and is
    /// in the fault's detail.
    pub fn goal(self) -> Duration {
        match self {
            Kind::ClusterFullRestartBacklog => Duration::from_secs(60),
            Kind::NodeKillBusiest | Kind::NodePartition | Kind::NodeFreeze | Kind::NodeRolling => {
                Duration::from_secs(70)
            }
            Kind::BrokerRestartBacklog => Duration::from_secs(15),
            // Reconnects made during the blackhole time out (5 s handshake)
            // and back off; the first after its end gets through.
            Kind::BrokerBlackhole => Duration::from_secs(15),
            Kind::WorkerCommitAck
            | Kind::WorkerKillInFlight
            | Kind::RelayPublishMark
            | Kind::RollingSigterm
            | Kind::DispatcherKillMidRequest => Duration::from_secs(5),
            _ => Duration::from_secs(10),
        }
    }
}

/// What one injection did.
#[derive(Debug)]
pub struct Injection {
    /// When the fault was over (the recovery clock starts here).
    pub ended: DateTime<Utc>,
    /// What happened, for the report.
    pub detail: String,
    /// A broken expectation of the injection itself (e.g. SIGTERM did not
    /// exit 0): counted as a violation.
    pub violation: Option<String>,
    /// What to do once the recovery was measured (the fault lasts through
    /// the measurement).
    pub then: Option<Then>,
}

/// The end of a fault, once its recovery was measured.
#[derive(Debug)]
pub enum Then {
    /// Start this cluster node again.
    RestartNode(String),
    /// Make the old primary the new one's standby (`pair.sh rejoin`).
    RejoinStandby,
}

/// The run's handles an injection needs.
pub struct Ctx<'a> {
    pub services: &'a Services,
    pub env: &'a Scratch,
    pub fleet: &'a mut Fleet,
    pub db: &'a PgPool,
    pub rng: &'a mut StdRng,
    /// The database stop lasts this range of seconds.
    pub db_stop_secs: (u64, u64),
    /// The effects' endpoint (to see a request in flight).
    pub payee: &'a Payee,
    /// The proxies every process's links go through (none on a cluster).
    pub links: Option<&'a Links>,
    /// The database's name in pair mode.
    pub db_name: Option<&'a DbName>,
}

/// Injects one fault of `kind` and returns when it is over.
pub async fn inject(kind: Kind, cx: Ctx<'_>) -> anyhow::Result<Injection> {
    match kind {
        Kind::WorkerCommitAck => commit_ack(cx).await,
        Kind::WorkerKillInFlight => kill_in_flight(cx).await,
        Kind::RelayPublishMark => relay_abort(cx).await,
        Kind::CloseConnections => {
            let vhost = cx.env.vhost.as_str();
            let ctl = cx.services;
            ctl.rabbitmqctl(&["-q", "close_all_connections", "-p", vhost, "fault drill"])
                .await?;
            Ok(done("closed every connection of the vhost".into(), None))
        }
        Kind::BrokerRestart => {
            let pause = cx.rng.random_range(0..3000);
            restart_broker(cx.services, pause).await?;
            Ok(done(format!("broker down {pause} ms + restart"), None))
        }
        Kind::BrokerRestartBacklog => restart_with_backlog(cx).await,
        Kind::DbStop => {
            let (lo, hi) = cx.db_stop_secs;
            let secs = cx.rng.random_range(lo..=hi);
            cx.services.pg_ctl("stop").await?;
            tokio::time::sleep(Duration::from_secs(secs)).await;
            cx.services.pg_ctl("start").await?;
            Ok(done(format!("database down {secs} s"), None))
        }
        Kind::DbRestart => {
            cx.services.pg_ctl("restart").await?;
            Ok(done("database restarted".into(), None))
        }
        Kind::RollingSigterm => rolling(cx).await,
        Kind::DispatcherKillMidRequest => dispatcher_kill(cx).await,
        Kind::BrokerBlackhole | Kind::DbBlackhole | Kind::WireLatency => wire(kind, cx).await,
        Kind::NodeKillBusiest => {
            let node = busiest(cx.services, &cx.env.vhost).await?;
            cx.services.cluster(&["kill", &node]).await?;
            let mut killed = done(format!("{node} SIGKILLed (led most shard queues)"), None);
            killed.then = Some(Then::RestartNode(node));
            Ok(killed)
        }
        Kind::NodeRolling => {
            let t = std::time::Instant::now();
            cx.services.cluster(&["rolling"]).await?;
            Ok(done(
                format!(
                    "c1, c2, c3 restarted one by one in {:.0} s",
                    t.elapsed().as_secs_f64()
                ),
                None,
            ))
        }
        Kind::NodeFreeze => {
            let node = busiest(cx.services, &cx.env.vhost).await?;
            cx.services.cluster(&["freeze", &node, "30"]).await?;
            Ok(done(
                format!("{node} (led most shard queues) frozen 30 s"),
                None,
            ))
        }
        Kind::NodePartition => {
            let node = busiest(cx.services, &cx.env.vhost).await?;
            cx.services.cluster(&["partition", &node, "30"]).await?;
            Ok(done(
                format!(
                    "{node} (led most shard queues) cut off from the other two nodes 30 s, \
                     its clients still connected to it"
                ),
                None,
            ))
        }
        Kind::ClusterFullRestartBacklog => {
            let services = cx.services;
            stop_workers_then(cx, async {
                let t = std::time::Instant::now();
                services.cluster(&["full-restart"]).await?;
                Ok(format!(
                    "cluster stopped and started in {:.0} s",
                    t.elapsed().as_secs_f64()
                ))
            })
            .await
        }
        Kind::DbFailover => failover(cx).await,
    }
}

/// Kills the primary, promotes the standby and moves the name, once a
/// synchronous standby streams (else nothing is injected: a violation).
async fn failover(cx: Ctx<'_>) -> anyhow::Result<Injection> {
    let Some(name) = cx.db_name else {
        let v = "database failover: this run is not on a database pair".to_owned();
        return Ok(done(v.clone(), Some(v)));
    };
    // Asked through the name, that is of the primary.
    let sync: Result<i64, _> = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_replication
         WHERE state = 'streaming' AND sync_state = 'sync'",
    )
    .fetch_one(cx.db)
    .await;
    if !matches!(sync, Ok(n) if n > 0) {
        let v =
            format!("database failover not injected: no synchronous standby streams ({sync:?})");
        return Ok(done(v.clone(), Some(v)));
    }
    let services = cx.services;
    let old = crate::faults::links::primary(services).await?;
    let killed = std::time::Instant::now();
    services.pair(&["kill-primary"]).await?;
    services.pair(&["promote"]).await?;
    let new = name.follow(services).await?;
    let mut moved = done(
        format!(
            "primary :{} killed, :{} promoted and the name moved {:.1} s later",
            old.port(),
            new.port(),
            killed.elapsed().as_secs_f64()
        ),
        None,
    );
    moved.then = Some(Then::RejoinStandby);
    Ok(moved)
}

/// The cluster node (c1, c2 or c3) that leads most of the run's shard queues.
async fn busiest(services: &Services, vhost: &str) -> anyhow::Result<String> {
    let node = services.cluster(&["busiest", vhost]).await?;
    let node = node.trim().to_owned();
    anyhow::ensure!(!node.is_empty(), "no shard queue leader found");
    Ok(node)
}

fn done(detail: String, violation: Option<String>) -> Injection {
    Injection {
        ended: Utc::now(),
        detail,
        violation,
        then: None,
    }
}

/// One of the active replicas, at random.
async fn pick_active(cx: &mut Ctx<'_>) -> usize {
    let active = cx.fleet.active_workers().await;
    active[cx.rng.random_range(0..active.len())]
}

/// Arms the replica that looks active; if it does not abort within 10 s
/// (it was a standby after all), disarms it and arms the other one.
async fn commit_ack(mut cx: Ctx<'_>) -> anyhow::Result<Injection> {
    let first = pick_active(&mut cx).await;
    let order: Vec<usize> = std::iter::once(first)
        .chain((0..cx.fleet.workers.len()).filter(|i| *i != first))
        .collect();
    let mut tried = Vec::new();
    for (turn, i) in order.into_iter().enumerate() {
        let limit = Duration::from_secs(if turn == 0 { 10 } else { 30 });
        let w = &mut cx.fleet.workers[i];
        w.signal("USR1")?;
        match w.wait_exit(limit).await {
            Some(s) if s.signal() == Some(6) => {
                let detail = format!("{} aborted after commit{}", w.name, tried_note(&tried));
                cx.fleet.workers[i] = cx.fleet.spawn_worker(cx.rng)?;
                return Ok(done(detail, None));
            }
            Some(other) => {
                let v = format!("{} exited with {other} instead of aborting", w.name);
                cx.fleet.workers[i] = cx.fleet.spawn_worker(cx.rng)?;
                return Ok(done(v.clone(), Some(v)));
            }
            None => {
                w.signal("USR2")?;
                tried.push(w.name.clone());
            }
        }
    }
    let v = format!("no replica aborted after being armed{}", tried_note(&tried));
    Ok(done(v.clone(), Some(v)))
}

fn tried_note(tried: &[String]) -> String {
    if tried.is_empty() {
        String::new()
    } else {
        format!(" (armed first, idle: {})", tried.join(", "))
    }
}

async fn kill_in_flight(mut cx: Ctx<'_>) -> anyhow::Result<Injection> {
    let i = pick_active(&mut cx).await;
    tokio::time::sleep(Duration::from_millis(cx.rng.random_range(0..1000))).await;
    let mut in_tx = false;
    for _ in 0..400 {
        if open_apply_transactions(cx.db).await > 0 {
            in_tx = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let w = &mut cx.fleet.workers[i];
    w.kill().await;
    let detail = format!(
        "{} SIGKILLed {}",
        w.name,
        if in_tx {
            "with an apply transaction open"
        } else {
            "(no open transaction seen)"
        }
    );
    cx.fleet.workers[i] = cx.fleet.spawn_worker(cx.rng)?;
    Ok(done(detail, None))
}

/// Worker transactions open right now (a statement running or idle in a
/// transaction after `urutan_terapkan…`), the probe's own session excluded.
async fn open_apply_transactions(db: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()
           AND state IN ('active', 'idle in transaction')
           AND query LIKE '%urutan_terapkan%'",
    )
    .fetch_one(db)
    .await
    .unwrap_or(0)
}

/// The wire faults, on the proxies in front of the broker and the database.
async fn wire(kind: Kind, cx: Ctx<'_>) -> anyhow::Result<Injection> {
    use crate::proxy::Mode;
    let Some(links) = cx.links else {
        let v = format!("{}: this run has no proxied links", kind.label());
        return Ok(done(v.clone(), Some(v)));
    };
    let detail = match kind {
        Kind::BrokerBlackhole => {
            links.broker.set(Mode::Blackhole);
            tokio::time::sleep(Duration::from_secs(15)).await;
            links.broker.set(Mode::Pass);
            "every broker link silent 15 s".to_owned()
        }
        Kind::DbBlackhole => {
            let secs = cx.rng.random_range(10..=20);
            links.database.set(Mode::Blackhole);
            tokio::time::sleep(Duration::from_secs(secs)).await;
            links.database.set(Mode::Pass);
            format!("every database link silent {secs} s")
        }
        _ => {
            let (delay, jitter) = (Duration::from_millis(100), Duration::from_millis(50));
            links.broker.delay(delay, jitter);
            links.database.delay(delay, jitter);
            tokio::time::sleep(Duration::from_secs(10)).await;
            links.broker.delay(Duration::ZERO, Duration::ZERO);
            links.database.delay(Duration::ZERO, Duration::ZERO);
            "100 ms ± 50 ms one way on every link for 10 s".to_owned()
        }
    };
    Ok(done(detail, None))
}

async fn dispatcher_kill(cx: Ctx<'_>) -> anyhow::Result<Injection> {
    tokio::time::sleep(Duration::from_millis(cx.rng.random_range(0..1000))).await;
    let mut mid_request = false;
    for _ in 0..400 {
        if cx.payee.in_flight() > 0 {
            mid_request = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let Some(mut old) = cx.fleet.dispatcher.take() else {
        let v = "no effects dispatcher was running".to_owned();
        return Ok(done(v.clone(), Some(v)));
    };
    old.kill().await;
    let detail = format!(
        "{} SIGKILLed {}",
        old.name,
        if mid_request {
            "mid-request"
        } else {
            "(no request in flight seen)"
        }
    );
    cx.fleet.dispatcher = Some(cx.fleet.spawn_dispatcher()?);
    Ok(done(detail, None))
}

async fn relay_abort(cx: Ctx<'_>) -> anyhow::Result<Injection> {
    let mut violation = None;
    if let Some(mut old) = cx.fleet.relay.take() {
        old.signal("TERM")?;
        match old.wait_exit(Duration::from_secs(30)).await {
            Some(s) if s.success() => {}
            other => {
                old.kill().await;
                violation = Some(format!(
                    "{} did not exit 0 on SIGTERM ({other:?})",
                    old.name
                ));
            }
        }
    }
    let batch = cx.rng.random_range(20..=200);
    let mut faulty = cx.fleet.spawn_relay(Some(batch))?;
    let status = faulty.wait_exit(Duration::from_secs(30)).await;
    let detail = match status {
        Some(s) if s.signal() == Some(6) => {
            format!("relay aborted after a confirmed batch of <= {batch}")
        }
        other => {
            faulty.kill().await;
            let v = format!("{} did not abort in 30 s ({other:?})", faulty.name);
            violation.get_or_insert(v.clone());
            v
        }
    };
    cx.fleet.relay = Some(cx.fleet.spawn_relay(None)?);
    Ok(done(detail, violation))
}

async fn restart_broker(ctl: &Services, pause_ms: u64) -> anyhow::Result<()> {
    ctl.rabbitmqctl(&["-q", "stop_app"]).await?;
    tokio::time::sleep(Duration::from_millis(pause_ms)).await;
    ctl.rabbitmqctl(&["-q", "start_app"]).await?;
    ctl.rabbitmqctl(&["-q", "--timeout", "120", "await_startup"])
        .await?;
    Ok(())
}

async fn restart_with_backlog(cx: Ctx<'_>) -> anyhow::Result<Injection> {
    let services = cx.services;
    let pause = cx.rng.random_range(0..2000);
    stop_workers_then(cx, async move {
        restart_broker(services, pause).await?;
        Ok("broker restarted".to_owned())
    })
    .await
}

/// Stops every replica (SIGTERM, must exit 0), lets a backlog queue for
/// 2-4 s, runs `restart` (which says what it did), starts the replicas.
async fn stop_workers_then(
    cx: Ctx<'_>,
    restart: impl std::future::Future<Output = anyhow::Result<String>>,
) -> anyhow::Result<Injection> {
    let mut violation = None;
    for w in &cx.fleet.workers {
        w.signal("TERM")?;
    }
    for w in &mut cx.fleet.workers {
        match w.wait_exit(Duration::from_secs(40)).await {
            Some(s) if s.success() => {}
            other => {
                w.kill().await;
                violation = Some(format!("{} did not exit 0 on SIGTERM ({other:?})", w.name));
            }
        }
    }
    cx.fleet.workers.clear();
    tokio::time::sleep(Duration::from_millis(cx.rng.random_range(2000..4000))).await;
    let backlog = queued(cx.services, &cx.env.vhost)
        .await
        .context("count the backlog")?;
    let what = restart.await?;
    let after = queued(cx.services, &cx.env.vhost)
        .await
        .context("count the backlog")?;
    let unsent = unsent(cx.db).await.unwrap_or(-1);
    for _ in 0..crate::faults::fleet::REPLICAS {
        let w = cx.fleet.spawn_worker(cx.rng)?;
        cx.fleet.workers.push(w);
    }
    Ok(done(
        format!(
            "{what} over a backlog of {backlog} messages \
             ({after} queued and {unsent} outbox rows unsent when the workers started)"
        ),
        violation,
    ))
}

/// Outbox rows the relay has not published yet (the outbox's partial
/// index of unsent rows: cheap to poll).
pub async fn unsent(db: &PgPool) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT count(*) FROM outbox WHERE dikirim_pada IS NULL")
        .fetch_one(db)
        .await
}

/// Messages (ready + unacked) in the run's shard queues.
pub async fn queued(services: &Services, vhost: &str) -> anyhow::Result<u64> {
    let out = services
        .rabbitmqctl(&["-q", "list_queues", "-p", vhost, "name", "messages"])
        .await?;
    Ok(out
        .lines()
        .filter(|l| l.contains(".shard-"))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum())
}

async fn rolling(mut cx: Ctx<'_>) -> anyhow::Result<Injection> {
    let mut fresh = cx.fleet.spawn_worker(cx.rng)?;
    fresh.wait_ready(crate::faults::fleet::READY_LIMIT).await?;
    let i = pick_active(&mut cx).await;
    let old = &mut cx.fleet.workers[i];
    old.signal("TERM")?;
    let status = old.wait_exit(Duration::from_secs(40)).await;
    let violation = match status {
        Some(s) if s.success() => None,
        other => {
            old.kill().await;
            Some(format!(
                "{} did not exit 0 within 40 s of SIGTERM ({other:?})",
                old.name
            ))
        }
    };
    let detail = format!("{} replaced by {}", old.name, fresh.name);
    cx.fleet.workers[i] = fresh;
    Ok(done(detail, violation))
}
