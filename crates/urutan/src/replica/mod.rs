//! Replicas share the shards (docs/contract.md section 13).
//!
//! Every `urutan run` is a replica named by `REPLICA_NAME`. It keeps a row
//! with a lease in `urutan_replika` (renewed every [`RENEW_EVERY`], dead to
//! the others [`LEASE`] after its last renewal), and each renewal rewrites
//! the placement (`urutan_penempatan`, [`place::rebalance`]): every live
//! replica is active on ⌊N/R⌋ or ⌈N/R⌉ shards, and only the shards of a
//! replica that came or went move. A replica consumes only the shards the
//! placement gives it ([`workers`]); a non-owner registers no consumer at
//! all, which is what makes this work on RabbitMQ 3.10, where a standby
//! consumer never takes over from a live active one.
//!
//! What keeps order through a move (tests/it/replicas.rs):
//! - the old owner stops taking deliveries, settles everything it holds
//!   (ack after commit), takes the shard's handover lock, cancels its
//!   consumer, settles what arrived before the cancel-ok and lets the lock
//!   go (`shard::handover`); the new owner's consumer, registered meanwhile,
//!   becomes active at that cancel (single active consumer: the broker
//!   never delivers to two consumers of one queue at once) and waits for the
//!   handover lock before its first delivery;
//! - a killed owner's unacked messages go back to the front of the queue
//!   when its connection drops; its lease runs out and a survivor takes the
//!   shard;
//! - a paused (zombie) owner whose lease ran out still holds the queue's
//!   active consumer until the broker drops its connection (heartbeat), so
//!   the new owner's consumer stands by until then; a commit the zombie
//!   makes late is harmless (dedup per order and message id, and the
//!   versioned write `WHERE versi < new`), so no epoch fence is needed.
//!
//! The lease is renewed only while this replica's broker connection is up
//! (a replica cut off from the broker lets its shards go).

pub mod member;
pub mod place;
pub mod workers;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::health::Health;
use crate::metrics as m;
pub use place::Reason;

/// How often a replica renews its lease and looks at the placement.
pub const RENEW_EVERY: Duration = Duration::from_secs(1);

/// How long after its last renewal a replica is dead to the others (its
/// shards are given to the survivors at their next renewal).
pub const LEASE: Duration = Duration::from_secs(10);

/// The shards this replica owns, each with why it got it; `None` until the
/// first renewal.
pub type Owned = Option<BTreeMap<u16, Reason>>;

/// This replica's membership, kept across broker reconnects (its row lives
/// on while the lease runs).
pub struct Membership {
    pub name: String,
    pool: PgPool,
    /// The shards owned at the last renewal: a shard not among them is a
    /// move (counted in `urutan_shard_moves_total`).
    known: Mutex<BTreeSet<u16>>,
    /// The connection holding this replica's life lock
    /// ([`member::LIFE_LOCK`]), and its backend pid; made again when lost.
    life: tokio::sync::Mutex<Option<(sqlx::PgConnection, i32)>>,
}

impl Membership {
    pub fn new(name: String, pool: PgPool) -> Arc<Self> {
        for reason in Reason::ALL {
            metrics::counter!(m::SHARD_MOVES_TOTAL, "reason" => reason.label()).increment(0);
        }
        metrics::gauge!(m::SHARDS_ACTIVE).set(0.0);
        Arc::new(Self {
            name,
            pool,
            known: Mutex::new(BTreeSet::new()),
            life: tokio::sync::Mutex::new(None),
        })
    }

    /// Renews the lease every [`RENEW_EVERY`] while the broker is up and
    /// publishes the shards owned (of `0..shards`) to `owned`, until `stop`.
    /// If `shutdown` is cancelled by then, leaves: the row is deleted and
    /// the shards given to the others at once, while the workers hand over.
    pub async fn keep(
        self: Arc<Self>,
        shards: u16,
        health: Arc<Health>,
        owned: watch::Sender<Owned>,
        stop: CancellationToken,
        shutdown: CancellationToken,
    ) {
        let mut failing = false;
        loop {
            if health.broker_is_up() {
                let active = health.registered();
                let life = self.life_pid().await;
                match member::renew(&self.pool, &self.name, shards, LEASE, &active, life).await {
                    Ok(mine) => {
                        if std::mem::take(&mut failing) {
                            info!(replica = %self.name, "membership renewed again");
                        }
                        self.publish(&mine, &owned);
                        health.set_placed(true);
                    }
                    Err(e) if !failing => {
                        failing = true;
                        warn!(replica = %self.name, error = %e,
                              "cannot renew this replica's lease; keeping its shards meanwhile");
                    }
                    Err(_) => {}
                }
            }
            tokio::select! {
                () = stop.cancelled() => break,
                () = tokio::time::sleep(RENEW_EVERY) => {}
            }
        }
        if shutdown.is_cancelled() {
            let leave = member::leave(&self.pool, &self.name, shards);
            match tokio::time::timeout(Duration::from_secs(5), leave).await {
                Ok(Ok(())) => {
                    info!(replica = %self.name, "left: the other replicas take the shards")
                }
                Ok(Err(e)) => warn!(replica = %self.name, error = %e,
                                    "could not leave; the others take the shards when the lease runs out"),
                Err(_) => warn!(replica = %self.name,
                                "leaving took over 5 s; the others take the shards when the lease runs out"),
            }
        }
    }

    /// The backend pid of the connection holding this replica's life lock,
    /// connecting and locking again if that connection is gone; `None`
    /// while it cannot (the others then go by the lease alone).
    async fn life_pid(&self) -> Option<i32> {
        use sqlx::Connection;
        let mut life = self.life.lock().await;
        if let Some((conn, pid)) = life.as_mut() {
            if tokio::time::timeout(Duration::from_secs(2), conn.ping())
                .await
                .is_ok_and(|ok| ok.is_ok())
            {
                return Some(*pid);
            }
            *life = None;
        }
        let options = self.pool.connect_options();
        let locked = tokio::time::timeout(Duration::from_secs(5), async {
            let mut conn = sqlx::PgConnection::connect_with(&options).await?;
            let pid: i32 = sqlx::query_scalar(member::LIFE_LOCK)
                .fetch_one(&mut conn)
                .await?;
            Ok::<_, sqlx::Error>((conn, pid))
        })
        .await;
        match locked {
            Ok(Ok((conn, pid))) => {
                *life = Some((conn, pid));
                Some(pid)
            }
            Ok(Err(e)) => {
                warn!(replica = %self.name, error = %e, "cannot hold the life lock; going by the lease alone");
                None
            }
            Err(_) => None,
        }
    }

    /// Counts the moves to this replica and publishes what it owns.
    fn publish(&self, mine: &[(u16, Reason)], owned: &watch::Sender<Owned>) {
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        let now: BTreeMap<u16, Reason> = mine.iter().copied().collect();
        for (shard, reason) in &now {
            if !known.contains(shard) {
                metrics::counter!(m::SHARD_MOVES_TOTAL, "reason" => reason.label()).increment(1);
                info!(replica = %self.name, shard, reason = reason.label(), "shard placed here");
            }
        }
        for shard in known.iter().filter(|s| !now.contains_key(s)) {
            info!(replica = %self.name, shard, "shard placed elsewhere; handing it over");
        }
        *known = now.keys().copied().collect();
        owned.send_if_modified(|old| {
            let changed = old.as_ref() != Some(&now);
            *old = Some(now);
            changed
        });
    }
}

/// The default `REPLICA_NAME`: the host name and the process id (and, for a
/// second pool in one process, as tests run them, its number).
pub fn default_name() -> String {
    static POOLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = POOLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "urutan".to_owned());
    match n {
        0 => format!("{host}-{}", std::process::id()),
        n => format!("{host}-{}-{}", std::process::id(), n + 1),
    }
}
