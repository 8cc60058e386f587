//! Readiness as the contract defines it (docs/contract.md, section 7): broker and database
//! reachable, and every owned shard has a registered consumer.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

/// Which process this is: the `role` label of `urutan_ready`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `urutan run`.
    #[default]
    Worker,
    /// `urutan relay`.
    Relay,
}

impl Role {
    pub fn label(self) -> &'static str {
        match self {
            Self::Worker => "worker",
            Self::Relay => "relay",
        }
    }
}

/// Shared, lock-light view of what the process can reach right now.
#[derive(Debug, Default)]
pub struct Health {
    role: Role,
    database: AtomicBool,
    broker: AtomicBool,
    /// Whether shards are placed by the replicas' membership (`urutan
    /// run`): then ready also needs a first placement.
    placement: AtomicBool,
    /// The membership placed this replica at least once.
    placed: AtomicBool,
    /// One entry per owned shard: true while its consumer is registered.
    consumers: Mutex<BTreeMap<u16, bool>>,
}

impl Health {
    pub fn new(role: Role) -> Self {
        Self {
            role,
            ..Self::default()
        }
    }

    /// [`Self::is_ready`], also set as `urutan_ready{role}` (1 or 0), so the
    /// gauge a scrape sees is what `/readyz` answers at that moment.
    pub fn report(&self) -> bool {
        let ready = self.is_ready();
        metrics::gauge!(crate::metrics::READY, "role" => self.role.label()).set(if ready {
            1.0
        } else {
            0.0
        });
        ready
    }

    /// Ready means: database and broker up, placed by the membership (when
    /// it places this process's shards), and every owned shard consuming. A
    /// replica placed on no shard (a standby) and a relay own none.
    pub fn is_ready(&self) -> bool {
        let consumers = self.lock();
        self.database.load(Ordering::Relaxed)
            && self.broker.load(Ordering::Relaxed)
            && (!self.placement.load(Ordering::Relaxed) || self.placed.load(Ordering::Relaxed))
            && consumers.values().all(|c| *c)
    }

    pub fn set_database(&self, up: bool) {
        self.database.store(up, Ordering::Relaxed);
    }

    /// Connected to the broker and owning shards `0..shards` (none consuming
    /// yet; a replica placed by the membership passes 0 and [`Self::own`]s
    /// its shards as they are placed).
    pub fn broker_up(&self, shards: u16) {
        let mut consumers = self.lock();
        for shard in 0..shards {
            consumers.insert(shard, false);
        }
        self.broker.store(true, Ordering::Relaxed);
    }

    pub fn broker_down(&self) {
        self.broker.store(false, Ordering::Relaxed);
        let mut consumers = self.lock();
        consumers.values_mut().for_each(|c| *c = false);
        self.active_gauge(&consumers);
    }

    pub fn broker_is_up(&self) -> bool {
        self.broker.load(Ordering::Relaxed)
    }

    /// Shards are placed by the replicas' membership: not ready before
    /// the first placement.
    pub fn expect_placement(&self) {
        self.placement.store(true, Ordering::Relaxed);
    }

    pub fn set_placed(&self, placed: bool) {
        self.placed.store(placed, Ordering::Relaxed);
    }

    /// `shard` is placed here: ready once its consumer is registered.
    pub fn own(&self, shard: u16) {
        let mut consumers = self.lock();
        consumers.entry(shard).or_insert(false);
        self.active_gauge(&consumers);
    }

    /// `shard` is no longer this process's (placed elsewhere, retired).
    pub fn disown(&self, shard: u16) {
        let mut consumers = self.lock();
        consumers.remove(&shard);
        self.active_gauge(&consumers);
    }

    /// A retired shard is no longer owned: it stops counting for readiness.
    pub fn retire(&self, shard: u16) {
        self.disown(shard);
    }

    /// Whether `shard`'s consumer is registered (only an owned shard counts).
    pub fn set_consumer(&self, shard: u16, registered: bool) {
        let mut consumers = self.lock();
        if let Some(slot) = consumers.get_mut(&shard) {
            *slot = registered;
        }
        self.active_gauge(&consumers);
    }

    /// The owned shards whose consumer is registered.
    pub fn registered(&self) -> Vec<u16> {
        self.lock()
            .iter()
            .filter(|(_, c)| **c)
            .map(|(s, _)| *s)
            .collect()
    }

    /// `urutan_shards_active` (a worker's): the owned shards with a
    /// registered consumer.
    fn active_gauge(&self, consumers: &BTreeMap<u16, bool>) {
        if self.role == Role::Worker {
            let active = consumers.values().filter(|c| **c).count();
            metrics::gauge!(crate::metrics::SHARDS_ACTIVE).set(active as f64);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u16, bool>> {
        self.consumers.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Pings the database every second (each ping bounded to 2 s), so `/readyz`
/// follows an outage and its end within a couple of seconds.
pub async fn watch_database(pool: PgPool, health: std::sync::Arc<Health>, stop: CancellationToken) {
    loop {
        let up = crate::store::ping(&pool, Duration::from_secs(2)).await;
        health.set_database(up);
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_needs_everything() {
        let h = Health::default();
        assert!(!h.is_ready());
        h.set_database(true);
        h.broker_up(0);
        assert!(h.is_ready(), "owning no shard (the relay)");
        h.broker_up(2);
        assert!(!h.is_ready(), "no consumer yet");
        h.set_consumer(0, true);
        h.set_consumer(1, true);
        assert!(h.is_ready());
        assert_eq!(h.registered(), [0, 1]);
        h.disown(1);
        h.set_consumer(1, false);
        assert!(h.is_ready(), "a shard placed elsewhere no longer counts");
        h.set_database(false);
        assert!(!h.is_ready());
        h.set_database(true);
        h.broker_down();
        assert!(!h.is_ready());
    }

    #[test]
    fn a_placed_replica_without_a_shard_is_ready() {
        let h = Health::new(Role::Worker);
        h.expect_placement();
        h.set_database(true);
        h.broker_up(0);
        assert!(!h.is_ready(), "not placed yet");
        h.set_placed(true);
        assert!(h.is_ready(), "a standby: placed on no shard");
        h.own(3);
        assert!(!h.is_ready(), "shard 3 placed here, no consumer yet");
        h.set_consumer(3, true);
        assert!(h.is_ready());
        h.set_consumer(7, true);
        assert_eq!(h.registered(), [3], "a shard not owned does not count");
    }

    #[test]
    fn the_gauge_reports_what_readyz_answers() {
        let h = Health::new(Role::Relay);
        assert_eq!(h.role.label(), "relay");
        assert!(!h.report());
        h.set_database(true);
        h.broker_up(0);
        assert!(h.report());
    }
}
