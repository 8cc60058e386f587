//! The last phase of every delivery: the one place that turns an outcome's
//! [`Settle`] into a broker call, after everything it depends on committed.

use std::time::Instant;

use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicRejectOptions};

use crate::broker::{BrokerError, call};
use crate::metrics::ShardMetrics;
use crate::outcome::Settle;

/// A processed delivery whose broker action is not sent yet.
pub(super) struct InHand {
    pub delivery: Delivery,
    pub settle: Settle,
    pub received: Instant,
}

/// Settles processed deliveries: rejects one by one first, then one
/// `multiple = true` ack up to the last acked delivery (a multiple ack must
/// never cover a delivery that is still to be rejected).
pub(super) async fn settle_all(
    in_hand: &[InHand],
    metrics: &ShardMetrics,
) -> Result<(), BrokerError> {
    let mut last_ack = None;
    for held in in_hand {
        match held.settle {
            Settle::Ack => last_ack = Some(&held.delivery),
            other => settle_delivery(&held.delivery, other, false).await?,
        }
    }
    if let Some(delivery) = last_ack {
        settle_delivery(delivery, Settle::Ack, in_hand.len() > 1).await?;
    }
    for held in in_hand {
        metrics
            .handle_duration
            .record(held.received.elapsed().as_secs_f64());
    }
    Ok(())
}

/// The one function that turns a [`Settle`] into a broker call
/// (`multiple`: the ack also covers every earlier unsettled delivery).
async fn settle_delivery(
    delivery: &Delivery,
    settle: Settle,
    multiple: bool,
) -> Result<(), BrokerError> {
    let acker = &delivery.acker;
    let done = match settle {
        Settle::Ack => call("basic.ack", acker.ack(BasicAckOptions { multiple })).await?,
        Settle::DeadLetter => {
            let reject = acker.reject(BasicRejectOptions { requeue: false });
            call("basic.reject", reject).await?
        }
        Settle::Requeue => {
            let reject = acker.reject(BasicRejectOptions { requeue: true });
            call("basic.reject", reject).await?
        }
    };
    // `false`: the acker belongs to a dead channel; the message will be redelivered.
    if done {
        Ok(())
    } else {
        Err(BrokerError::ChannelLost)
    }
}
