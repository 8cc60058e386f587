//! urutan: applies order events ("pesanan") from RabbitMQ to PostgreSQL in
//! order per entity, in parallel across entities, exactly once in effect.
//!
//! Your own code runs in the transaction that applies each version: a
//! [`Handler`]. Its writes commit with the version or not at all, so a
//! redelivery, a duplicate or a crash between commit and ack never runs it
//! twice for one version. A complete one, for shipments:
//!
//! ```no_run
//! use urutan::{Handler, HandlerError, HandlerEvent};
//!
//! #[derive(serde::Deserialize)]
//! struct Shipment {
//!     courier: String,
//!     kg: i64,
//! }
//!
//! struct Shipments;
//!
//! impl Handler for Shipments {
//!     async fn handle(&self, tx: &mut sqlx::PgConnection, event: &HandlerEvent) -> Result<(), HandlerError> {
//!         let shipment: Shipment = event.data_as()?; // data that does not fit: refused
//!         sqlx::query("INSERT INTO shipments (id, version, courier, kg) VALUES ($1, $2, $3, $4)")
//!             .bind(&event.id).bind(event.versi).bind(shipment.courier).bind(shipment.kg)
//!             .execute(tx)
//!             .await?; // a deadlock or a lock timeout: retried; a data error: refused
//!         Ok(())
//!     }
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let pool = urutan::Pool::from_env()?; // AMQP_URL, DATABASE_URL, ENTITY, SHARD_COUNT, ...
//!     urutan::telemetry::init(pool.settings().log_format);
//!     pool.handler(Shipments).run().await?; // until SIGTERM, SIGINT or SIGHUP
//!     Ok(())
//! }
//! ```
//!
//! [`HandlerError::retry`] sets the message aside and tries it again later
//! (a panic does too) while the shard goes on; [`HandlerError::refuse`]
//! dead-letters it and holds its entity until it is replayed or released
//! (docs/handlers.md). The `urutan-cli` crate's `main_with(Shipments)` is a
//! binary with every `urutan` command (`status`, `explain`, `dlq`, `hold`,
//! ...) and this handler in its pool.
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
pub mod pool;
pub mod replica;
pub mod reshard;
mod retry;
pub mod rfc3339;
pub mod shard;
pub mod store;
pub mod supervisor;
pub mod telemetry;
pub mod trace;

pub use config::Settings;
pub use handler::{Handler, HandlerError, HandlerEvent, SharedHandler};
pub use heal::WrongSetting;
pub use outbox::{EnqueueError, NewEvent, enqueue};
pub use pool::{Pool, run};
pub use supervisor::RunError;
