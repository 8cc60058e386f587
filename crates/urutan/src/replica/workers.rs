//! The shard workers of one replica, following the placement: a worker is
//! started for each shard placed here and stopped (a graceful handover, see
//! `shard::handover`) for each shard placed elsewhere; the others run on
//! untouched.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::Owned;
use crate::health::Health;
use crate::shard::{Link, ShardWorker};

/// How often finished workers are looked for, besides placement changes.
const REAP_EVERY: Duration = Duration::from_secs(1);

/// One running shard worker.
struct Running {
    /// Stops this worker alone (a child of the generation's stop).
    token: CancellationToken,
    handle: JoinHandle<()>,
    /// Cancelled because the shard was placed elsewhere: handing over.
    leaving: bool,
}

/// The running workers of one broker connection's life.
pub struct Workers<F> {
    /// Builds the worker of a shard.
    make: F,
    link: Arc<Link>,
    health: Arc<Health>,
    stop: CancellationToken,
    running: BTreeMap<u16, Running>,
    /// Shards whose worker ended by itself (a retired shard): not started
    /// again in this connection's life.
    ended: BTreeSet<u16>,
}

impl<F: Fn(u16) -> ShardWorker> Workers<F> {
    pub fn new(make: F, link: Arc<Link>, health: Arc<Health>, stop: CancellationToken) -> Self {
        Self {
            make,
            link,
            health,
            stop,
            running: BTreeMap::new(),
            ended: BTreeSet::new(),
        }
    }

    /// Follows the placement until `owned` closes (never, while its sender
    /// lives): the caller drops this future when the connection's life ends.
    pub async fn follow(&mut self, mut owned: watch::Receiver<Owned>) {
        let mut reap = tokio::time::interval(REAP_EVERY);
        reap.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let mine: Option<BTreeSet<u16>> = owned
                .borrow_and_update()
                .as_ref()
                .map(|o| o.keys().copied().collect());
            if let Some(mine) = mine {
                self.reconcile(&mine);
            }
            tokio::select! {
                changed = owned.changed() => if changed.is_err() { return },
                _ = reap.tick() => {}
            }
        }
    }

    /// Starts and stops workers so that exactly the shards in `mine` run.
    fn reconcile(&mut self, mine: &BTreeSet<u16>) {
        let finished: Vec<u16> = self
            .running
            .iter()
            .filter(|(_, r)| r.handle.is_finished())
            .map(|(&s, _)| s)
            .collect();
        for shard in finished {
            if let Some(r) = self.running.remove(&shard)
                && !r.leaving
            {
                debug!(shard, "the shard's worker ended by itself");
                self.ended.insert(shard);
                self.health.disown(shard);
            }
        }
        for (&shard, r) in &mut self.running {
            if !r.leaving && !mine.contains(&shard) {
                r.leaving = true;
                r.token.cancel();
                self.health.disown(shard);
            }
        }
        for &shard in mine {
            // A shard placed back here while its worker still hands it
            // over starts again once that worker is done.
            if self.running.contains_key(&shard) || self.ended.contains(&shard) {
                continue;
            }
            self.health.own(shard);
            let token = self.stop.child_token();
            let worker = (self.make)(shard);
            let handle = tokio::spawn(worker.run_connected(self.link.clone(), token.clone()));
            self.running.insert(
                shard,
                Running {
                    token,
                    handle,
                    leaving: false,
                },
            );
        }
    }

    /// Stops every worker (each finishes and hands over what it holds) and
    /// waits for them.
    pub async fn stop_all(self) {
        for r in self.running.values() {
            r.token.cancel();
        }
        for (shard, r) in self.running {
            if let Err(e) = r.handle.await {
                debug!(shard, error = %e, "a shard worker panicked");
            }
            self.health.disown(shard);
        }
    }
}
