//! Readiness as the contract defines it (docs/contract.md, section 7): broker and database
//! reachable, and every owned shard has a registered consumer.

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
    /// One flag per owned shard: true while its consumer is registered.
    consumers: Mutex<Vec<bool>>,
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

    /// Ready means: database and broker up, and every owned shard consuming
    /// (a relay owns no shard).
    pub fn is_ready(&self) -> bool {
        let consumers = self.consumers.lock().unwrap_or_else(|p| p.into_inner());
        self.database.load(Ordering::Relaxed)
            && self.broker.load(Ordering::Relaxed)
            && consumers.iter().all(|c| *c)
    }

    pub fn set_database(&self, up: bool) {
        self.database.store(up, Ordering::Relaxed);
    }

    /// Connected to the broker and owning `shards` shards (none consuming yet).
    pub fn broker_up(&self, shards: u16) {
        *self.consumers.lock().unwrap_or_else(|p| p.into_inner()) = vec![false; shards.into()];
        self.broker.store(true, Ordering::Relaxed);
    }

    pub fn broker_down(&self) {
        self.broker.store(false, Ordering::Relaxed);
        self.consumers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter_mut()
            .for_each(|c| *c = false);
    }

    /// A retired shard is no longer owned: it stops counting for readiness.
    pub fn retire(&self, shard: u16) {
        self.set_consumer(shard, true);
    }

    pub fn set_consumer(&self, shard: u16, registered: bool) {
        let mut consumers = self.consumers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(slot) = consumers.get_mut(usize::from(shard)) {
            *slot = registered;
        }
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
        h.set_database(false);
        assert!(!h.is_ready());
        h.set_database(true);
        h.broker_down();
        assert!(!h.is_ready());
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
