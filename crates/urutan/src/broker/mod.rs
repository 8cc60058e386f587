//! RabbitMQ: connecting, the topology (docs/contract.md, section 1), and lifting a
//! delivery into the contract's [`Envelope`](crate::message::Envelope).

pub mod delivery;
pub mod reply;
pub mod restart;
pub mod topology;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lapin::{Connection, ConnectionProperties};
use tracing::{info, warn};

use crate::config::BrokerUrls;

pub use topology::{Names, ShardPlan, TopologyError};

/// The longest any single broker call may take before it counts as a failure.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(15);

/// A broker failure: a lapin error or a call that took longer than [`CALL_TIMEOUT`].
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error(transparent)]
    Amqp(#[from] lapin::Error),
    #[error("the broker did not answer `{0}` within {CALL_TIMEOUT:?}")]
    Timeout(&'static str),
    #[error("broker node {node} did not complete the handshake within {after:?}")]
    HandshakeTimeout { node: String, after: Duration },
    #[error("the broker cancelled the consumer (was the queue deleted?)")]
    ConsumerCancelled,
    #[error("the channel was lost before the message could be settled")]
    ChannelLost,
}

/// Runs one broker call with [`CALL_TIMEOUT`].
pub async fn call<T>(
    what: &'static str,
    fut: impl Future<Output = lapin::Result<T>>,
) -> Result<T, BrokerError> {
    match tokio::time::timeout(CALL_TIMEOUT, fut).await {
        Ok(result) => Ok(result?),
        Err(_) => Err(BrokerError::Timeout(what)),
    }
}

/// How long one node of several may take to accept a connection before the
/// next is tried. A frozen node accepts TCP but never answers the handshake;
/// a single node gets the whole [`CALL_TIMEOUT`].
pub const NODE_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where this process's next connection starts in the node list: a random
/// node at first (so replicas spread over a cluster), then always the node
/// after the last one connected to (so a reconnect moves away from a node
/// that just failed).
static NEXT_NODE: std::sync::LazyLock<AtomicUsize> =
    std::sync::LazyLock::new(|| AtomicUsize::new(rand::random::<u16>().into()));

/// Opens a connection named `name` (shown in the broker's connection list)
/// to a live node of `nodes`, trying each once, and logs the node it uses.
/// No automatic recovery: the supervisor rebuilds connections itself, which
/// keeps the recovery path one we test.
pub async fn connect(nodes: &BrokerUrls, name: &str) -> Result<Connection, BrokerError> {
    Ok(connect_indexed(nodes, name).await?.0)
}

/// [`connect`], and the index in `nodes` of the node it connected to.
pub async fn connect_indexed(
    nodes: &BrokerUrls,
    name: &str,
) -> Result<(Connection, usize), BrokerError> {
    connect_from(nodes, name, NEXT_NODE.load(Ordering::Relaxed)).await
}

/// [`connect`], but starting at node `node` and setting it to the node
/// connected to: the connections of one pool stay on one node and move on
/// only when it fails.
pub async fn connect_on(
    nodes: &BrokerUrls,
    name: &str,
    node: &AtomicUsize,
) -> Result<Connection, BrokerError> {
    let (conn, index) = connect_from(nodes, name, node.load(Ordering::Relaxed)).await?;
    node.store(index, Ordering::Relaxed);
    Ok(conn)
}

async fn connect_from(
    nodes: &BrokerUrls,
    name: &str,
    start: usize,
) -> Result<(Connection, usize), BrokerError> {
    let urls = nodes.nodes();
    let limit = if urls.len() == 1 {
        CALL_TIMEOUT
    } else {
        NODE_CONNECT_TIMEOUT
    };
    let mut failure = None;
    for attempt in 0..urls.len() {
        let index = start.wrapping_add(attempt) % urls.len();
        let node = &urls[index];
        let props = ConnectionProperties::default().with_connection_name(name.into());
        let error =
            match tokio::time::timeout(limit, Connection::connect(node.expose(), props)).await {
                Ok(Ok(conn)) => {
                    NEXT_NODE.store(index + 1, Ordering::Relaxed);
                    info!(%node, connection = name, "connected to the broker");
                    return Ok((conn, index));
                }
                Ok(Err(e)) => BrokerError::Amqp(e),
                Err(_) => BrokerError::HandshakeTimeout {
                    node: node.to_string(),
                    after: limit,
                },
            };
        if urls.len() > 1 {
            warn!(%node, connection = name, error = %error, "broker node unavailable; trying the next");
        }
        failure = Some(error);
    }
    // The list is never empty, so some attempt failed.
    Err(failure.unwrap_or(BrokerError::Timeout("connect")))
}
