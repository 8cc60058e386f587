//! A shard worker's own broker connection.
//!
//! Each shard consumes on a connection of its own, named `urutan run
//! <queue>` in the broker's connection list, so a connection failure (a
//! frame the client cannot parse, a forced close) costs only that shard:
//! on RabbitMQ 3.10 a channel that closes with unacked messages adds to
//! their `x-delivery-count`, and one shared connection spent a delivery of
//! every shard's in-flight messages each time it dropped. The shard
//! reconnects alone, with backoff; the others keep consuming.
//!
//! A broker restart is still handled once, by the pool (a window, then an
//! epoch, see `reshard::prepare`), before anything is consumed: every shard
//! connection probes the restart sentinel first, and one that finds it gone
//! consumes nothing and asks the pool to prepare again.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};

use lapin::Connection;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{Ended, ShardWorker};
use crate::broker::{self, BrokerError, Names, call, restart};
use crate::config::BrokerUrls;
use crate::heal;
use crate::metrics as m;
use crate::retry;

/// A connection that lived this long was not lost to a repeated failure:
/// the next loss starts the backoff over.
const STABLE: Duration = Duration::from_secs(30);

/// What the shard workers of one pool generation share.
pub struct Link {
    pub broker: BrokerUrls,
    pub names: Names,
    /// The node (index in `broker`) the shards connect to first: the one
    /// the pool's connection uses, until a shard finds it down.
    pub node: AtomicUsize,
    /// The restart sentinel was in place after the pool prepared: a probe
    /// tells whether the broker restarted since. Without it (a user that may
    /// not declare it), every reconnect counts as a restart, as it does for
    /// the pool's own connection.
    pub sentinel: bool,
    /// Cancelled by a shard that saw (or must assume) a broker restart: the
    /// pool stops its workers and prepares again.
    pub restart_seen: CancellationToken,
}

impl ShardWorker {
    /// Runs the shard on a connection of its own until `stop`, reconnecting
    /// it (alone, with backoff) whenever it is lost.
    pub async fn run_connected(self, link: Arc<Link>, stop: CancellationToken) {
        let name = format!("urutan run {}", self.queue);
        let mut delays = retry::backoff();
        let mut lost = false;
        loop {
            let Some(conn) = self.open(&link, &name, lost, &stop).await else {
                return;
            };
            if lost {
                metrics::counter!(m::BROKER_RECONNECTS_TOTAL).increment(1);
                info!(shard = self.shard, "shard reconnected to the broker");
            }
            let since = Instant::now();
            let ended = self.clone().run(conn.clone(), stop.clone()).await;
            if conn.status().connected() {
                let _ = call("connection.close", conn.close(200, "shard stopped".into())).await;
            }
            if ended != Ended::ConnectionLost {
                return;
            }
            if since.elapsed() > STABLE {
                delays = retry::backoff();
            }
            let delay = retry::next_delay(&mut delays);
            warn!(shard = self.shard, retry_in = ?delay,
                  "shard lost its broker connection; reconnecting it (other shards go on)");
            lost = true;
            if !retry::sleep_unless_stopped(delay, &stop).await {
                return;
            }
        }
    }

    /// Connects (retrying with backoff) and passes the restart check.
    /// `None`: `stop`, or the broker restarted (the pool prepares again).
    async fn open(
        &self,
        link: &Link,
        name: &str,
        reconnect: bool,
        stop: &CancellationToken,
    ) -> Option<Arc<Connection>> {
        let mut delays = retry::backoff();
        let mut tries = 0u32;
        loop {
            let assume_restart = reconnect || tries > 0;
            tries += 1;
            let attempt = async {
                let conn = broker::connect_on(&link.broker, name, &link.node).await?;
                let restarted = if link.sentinel {
                    restart::restarted(&conn, &link.names).await
                } else {
                    Ok(assume_restart)
                };
                Ok::<_, BrokerError>((conn, restarted))
            };
            let result = tokio::select! {
                () = stop.cancelled() => return None,
                result = attempt => result,
            };
            let error = match result {
                Ok((conn, Ok(false))) => {
                    heal::broker_outage(&link.broker).recovered();
                    return Some(Arc::new(conn));
                }
                Ok((conn, Ok(true))) => {
                    let _ = call("connection.close", conn.close(200, "restart seen".into())).await;
                    warn!(
                        shard = self.shard,
                        "the broker restarted (or cannot tell): preparing the topology again \
                         before any shard consumes"
                    );
                    link.restart_seen.cancel();
                    return None;
                }
                Ok((conn, Err(e))) => {
                    let _ = call("connection.close", conn.close(200, "probe failed".into())).await;
                    e
                }
                Err(e) => e,
            };
            // One line per change for the whole process, not one per
            // attempt and shard.
            heal::broker_outage(&link.broker).failed(&heal::broker_cause(&error));
            let delay = retry::next_delay(&mut delays);
            if !retry::sleep_unless_stopped(delay, stop).await {
                return None;
            }
        }
    }
}
