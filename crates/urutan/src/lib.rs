//! urutan: applies order events ("pesanan") from RabbitMQ to PostgreSQL in
//! order per entity, in parallel across entities, exactly once in effect.
//!
//! How a message travels, and the module that owns each step:
//!
//! ```text
//! producer ─> `pesanan` (topic) ─> `pesanan-hash` (x-consistent-hash on x-pesanan-id)
//!          ─> shard queues `pesanan.shard-NNN` (quorum, single active consumer)   [broker::topology]
//!          ─> shard worker, one per queue, in arrival order                     [shard]
//!             ─> envelope lifted from the delivery                               [broker::delivery]
//!             ─> decode + validate against the contract (pure)                   [message]
//!             ─> one transaction: dedup claim, versioned upsert, history row     [store]
//!             ─> outcome ─> ack / reject, in one place                           [outcome, shard]
//! ```
//!
//! Around it: [`config`] (the settings, plain data: the `urutan` binary
//! reads them from the environment and flags), [`supervisor`] (starts the
//! workers, reconnects, owns shutdown), [`reshard`] (order across ring
//! changes: the recorded ring, epochs and windows, parking, retiring shards),
//! [`health`] + [`http`] + [`metrics`] (what operators see), [`dead_letter`]
//! (what a rejected delivery's record holds, written by the workers before
//! they reject), [`telemetry`] (logs), [`outbox`] (the producer side: the
//! relay), [`effects`] (webhooks for applied versions, recorded in the apply
//! transaction, sent by `urutan effects`).
//!
//! This crate carries no command-line code (no clap, anyhow or indicatif),
//! so a team can embed it. The operator tooling (`urutan status`, `explain`,
//! `dlq`, `verify`) is the `urutan-ops` crate; the binary is the workspace's
//! root package (docs/ARCHITECTURE.md).
//!
//! The external contract (names, message format, outcomes, tables, settings,
//! commands, metrics, endpoints) is `docs/contract.md`; "section N" in the
//! doc comments refers to it.

pub mod broker;
pub mod config;
pub mod dead_letter;
pub mod effects;
pub mod handler;
pub mod heal;
pub mod health;
pub mod http;
pub mod message;
pub mod metrics;
pub mod outbox;
pub mod outcome;
pub mod replica;
pub mod reshard;
mod retry;
pub mod rfc3339;
pub mod shard;
pub mod store;
pub mod supervisor;
pub mod telemetry;
pub mod trace;
