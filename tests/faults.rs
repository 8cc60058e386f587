//! The CI variant of the fault-injection suite (issue 5): every fault kind
//! once, in a seeded random order, against the real `urutan` binary, broker
//! and database, in about three minutes. It restarts the broker and the
//! database, so its name starts with `serial_` (CI runs those alone).
//! The engine is shared with `benches/faults.rs` (the soak).
//!
//! Fails on any invariant violation, on a fault after which nothing was
//! applied, and on a workers' recovery above twice its goal (5 s after a
//! process restart, 10 s after the broker or database is back; twice for CI
//! noise) or an end-to-end one above 30 s.
//!
//! With `FAULTS_PG_PAIR` set (as root; `benches/faults/private-services.sh
//! --pair`), the database is a primary with a synchronous standby and the
//! database failover is one more kind (about 15 s more, the old primary's
//! rejoin included); without it, the run is on the shared services as before.

use urutan_testkit::faults::{ci as faults_ci, inject};

// The test proxy, shared with the integration tests (not every mode is used here).

use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serial_every_fault_kind_once_under_load_keeps_every_promise() {
    let mut kinds = inject::Kind::ALL.to_vec();
    if std::env::var_os("FAULTS_PG_PAIR").is_some() {
        kinds.extend(inject::Kind::PAIR);
    }
    let opts = faults_ci::options(&kinds, faults_ci::seed(), "faults-ci");
    let (report, _) = faults_ci::run("fault suite", &opts, Duration::from_secs(900)).await;
    assert!(
        report.events_written > 1_000 && report.mix.poison_confirmed > 0,
        "too little workload to prove anything: {} events, {} poison",
        report.events_written,
        report.mix.poison_confirmed
    );
}
