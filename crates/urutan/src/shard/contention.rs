//! The shards' apply transactions one at a time while they lose to each
//! other.
//!
//! A handler that updates rows many orders share (a stock level, a
//! counter) in an order that depends on the event makes two shards'
//! transactions deadlock. Trying the loser again at once (see
//! `steps::again_if_contended`) keeps the shard going, but PostgreSQL only
//! looks for a deadlock after `deadlock_timeout` (1 s by default) of
//! waiting, so each one still costs both shards that second, and with such
//! a handler the next pair of transactions meets the same way. Those
//! transactions wait on each other's rows anyway: they gain nothing from
//! running side by side.
//!
//! So once an apply transaction of this pool loses to another one (SQLSTATE
//! class 40, in the worker or in the release step), every apply and release
//! transaction of the pool's workers takes one transaction-level advisory
//! lock (per schema) first, for [`SERIALIZE_FOR`] after the last such loss:
//! they run one at a time and cannot deadlock with each other. The lock is
//! the first thing each of them takes, so a transaction waiting for it
//! holds nothing another one could wait for. Without a loss nothing of
//! this costs anything.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::info;

/// How long the pool's apply transactions stay one at a time after the
/// last one lost to another. Long beside the `deadlock_timeout` one loss
/// costs (a handler that keeps contending pays it about once per period),
/// short enough that a passing burst does not slow the pool for long.
pub const SERIALIZE_FOR: Duration = Duration::from_secs(30);

/// Whether the pool's apply transactions go one at a time, shared by its
/// shard workers.
#[derive(Debug, Default)]
pub struct Contention {
    /// When the last transaction lost to another one.
    last_lost: Mutex<Option<Instant>>,
}

impl Contention {
    /// An apply or release transaction lost to another one: the pool's
    /// transactions go one at a time for `SERIALIZE_FOR` from now.
    pub fn lost(&self) {
        let mut last = self.last_lost.lock().unwrap_or_else(|e| e.into_inner());
        let was = last.is_some_and(|at| at.elapsed() < SERIALIZE_FOR);
        *last = Some(Instant::now());
        if !was {
            info!(
                for_s = SERIALIZE_FOR.as_secs(),
                "apply transactions lost to each other (a deadlock or a serialization failure): \
                 this pool applies one transaction at a time for a while"
            );
        }
    }

    /// Whether the pool's apply transactions go one at a time now.
    pub fn serialized(&self) -> bool {
        let last = self.last_lost.lock().unwrap_or_else(|e| e.into_inner());
        last.is_some_and(|at| at.elapsed() < SERIALIZE_FOR)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loss_serializes_for_a_while() {
        let contention = Contention::default();
        assert!(!contention.serialized(), "nothing lost: side by side");
        contention.lost();
        assert!(contention.serialized());
        *contention.last_lost.lock().expect("lock") =
            Instant::now().checked_sub(SERIALIZE_FOR + Duration::from_secs(1));
        assert!(!contention.serialized(), "over once the period passed");
    }
}
