//! RabbitMQ: connecting, the topology (docs/contract.md, section 1), and lifting a
//! delivery into the contract's [`Envelope`](crate::message::Envelope).

pub mod delivery;
pub mod restart;
pub mod topology;

use std::time::Duration;

use lapin::{Connection, ConnectionProperties};

use crate::config::SecretUrl;

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

/// Opens a connection named `name` (shown in the broker's connection list).
/// No automatic recovery: the supervisor rebuilds connections itself, which
/// keeps the recovery path one we test.
pub async fn connect(url: &SecretUrl, name: &str) -> Result<Connection, BrokerError> {
    let props = ConnectionProperties::default().with_connection_name(name.into());
    call("connect", Connection::connect(url.expose(), props)).await
}
