//! The fault-injection engine: a fleet of real `urutan` processes under a
//! workload while faults are injected, then the invariants checked
//! (`benches/README.md`). [`ci`] is what the two CI runs share.

pub mod check;
pub mod ci;
pub mod engine;
pub mod fleet;
pub mod holds;
pub mod inject;
pub mod links;
pub mod payee;
pub mod procs;
pub mod report;
pub mod services;
pub mod workload;
