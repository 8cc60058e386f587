//! How a delivery ends (docs/contract.md, section 3), and what each ending asks of the
//! broker. `shard` turns a [`Settle`] into the one broker call.

use crate::message::Rejection;

/// Every delivery ends in exactly one outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// New entity, or a newer version: state written, history row, id recorded.
    Applied,
    /// Not newer than the stored version: only the id recorded.
    Stale,
    /// The message id was already recorded: nothing changed.
    Duplicate,
    /// Broke the contract (or exhausted its deliveries): the broker moves it to the DLQ.
    DeadLettered(Rejection),
}

impl Outcome {
    /// The `outcome` label of `urutan_messages_total`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Applied => "applied",
            Self::Stale => "stale",
            Self::Duplicate => "duplicate",
            Self::DeadLettered(_) => "dead_lettered",
        }
    }

    /// What the broker is told once the outcome is durable.
    pub fn settle(self) -> Settle {
        match self {
            Self::Applied | Self::Stale | Self::Duplicate => Settle::Ack,
            Self::DeadLettered(_) => Settle::DeadLetter,
        }
    }
}

/// The broker action that closes a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// `basic.ack`: done.
    Ack,
    /// `basic.reject(requeue = false)`: the queue dead-letters it unchanged.
    DeadLetter,
    /// `basic.reject(requeue = true)`: the handler failed on this message (a
    /// panic, or data the database refuses); it comes back at the front of the
    /// queue, and the queue's delivery limit dead-letters it if it keeps failing.
    Requeue,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_map_to_the_contract() {
        assert_eq!(Outcome::Applied.settle(), Settle::Ack);
        assert_eq!(Outcome::Stale.settle(), Settle::Ack);
        assert_eq!(Outcome::Duplicate.settle(), Settle::Ack);
        let dead = Outcome::DeadLettered(Rejection::IdMismatch);
        assert_eq!(dead.settle(), Settle::DeadLetter);
        let labels: Vec<_> = [Outcome::Applied, Outcome::Stale, Outcome::Duplicate, dead]
            .iter()
            .map(|o| o.label())
            .collect();
        assert_eq!(labels, ["applied", "stale", "duplicate", "dead_lettered"]);
    }
}
