//! Resharding and ring changes: everything that keeps per-order order when
//! the consistent-hash ring moves an order to another shard.
//!
//! - [`ring`]: the recorded ring (`urutan_ring`): which `SHARD_COUNT` the
//!   bindings follow, who changed it, and when a resharding completed
//!   (nothing routed by the old ring left);
//! - [`handoff`]: epochs, epoch markers, windows, parking and release: how a
//!   moved order's newer messages wait for its older ones on the old shard
//!   (the migrations written before this module call it `src/handoff.rs`;
//!   applied migrations cannot change, not even their comments);
//! - [`retire`]: draining and deleting the shard queues a shrink removed;
//! - [`prepare`]: topology preparation, the step that moves the ring: plan,
//!   bindings, epoch, with the relay's publishing paused;
//! - [`read`]: the epochs, the shards' positions and the open windows, as
//!   the operator commands read them.
//!
//! The supervisor and `urutan topology` drive them ([`prepare::prepare_topology`]); the shard
//! worker passes markers and releases parked messages; the SQL that decides
//! is in `migrations/` (see `docs/glossary.md` for its names).

pub mod handoff;
pub mod prepare;
pub mod read;
pub mod retire;
pub mod ring;
