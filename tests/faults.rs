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

#[path = "../benches/faults/check.rs"]
mod check;
#[path = "../benches/faults/engine.rs"]
mod engine;
#[path = "../benches/faults/fleet.rs"]
mod fleet;
#[path = "../benches/faults/inject.rs"]
mod inject;
#[path = "../benches/faults/payee.rs"]
mod payee;
#[path = "../benches/faults/procs.rs"]
mod procs;
#[path = "../benches/faults/report.rs"]
mod report;
#[path = "../benches/faults/services.rs"]
mod services;
#[path = "../benches/faults/workload.rs"]
mod workload;

use std::path::PathBuf;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serial_every_fault_kind_once_under_load_keeps_every_promise() {
    let seed = std::env::var("FAULTS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::random::<u32>() as u64);
    let opts = engine::Options {
        faults: inject::Kind::ALL.len(),
        kinds: inject::Kind::ALL.to_vec(),
        direct_rate: 0,
        direct_entities: 0,
        seed,
        shards: 12,
        prefetch: vec![1, 16],
        entities: 200,
        rate: 150,
        handler_delay_ms: 2,
        gap_ms: (500, 1500),
        db_stop_secs: (10, 10),
        recovery_limit: Duration::from_secs(30),
        log_dir: PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("faults-ci-{seed}")),
    };
    eprintln!(
        "fault suite: seed {seed} (replay: FAULTS_SEED={seed}), logs in {}",
        opts.log_dir.display()
    );
    let services = services::Services::from_env().expect("services");
    let run = tokio::time::timeout(Duration::from_secs(600), engine::run(&services, &opts));
    let report = run
        .await
        .expect("the fault run did not finish within 10 min")
        .expect("the fault run could not be set up or checked");
    eprintln!("{}", report::markdown(&report));

    let kinds: Vec<_> = report.faults.iter().map(|f| f.kind).collect();
    for kind in inject::Kind::ALL {
        assert!(kinds.contains(&kind), "{kind:?} was not injected");
    }
    assert!(
        report.events_written > 1_000 && report.mix.poison_confirmed > 0,
        "too little workload to prove anything: {} events, {} poison",
        report.events_written,
        report.mix.poison_confirmed
    );
    assert!(
        report.passed(),
        "seed {seed}: invariants or recovery failed (report above)"
    );
    for f in &report.faults {
        let bound = 2.0 * f.kind.goal().as_secs_f64() * 1000.0;
        let recovery = f.recovery_ms.unwrap_or(f64::INFINITY);
        assert!(
            recovery <= bound,
            "seed {seed}: after {} the workers processed again in {recovery:.0} ms (bound {bound:.0} ms)",
            f.kind.label()
        );
        // End to end includes the relay's reconnect backoff, which is not
        // reset between faults less than a minute apart and reaches 10 s
        // plus up to 100 % jitter (see docs/faults.md): bounded, not held
        // to the goal, until that is fixed.
        let e2e = f.e2e_ms.unwrap_or(f64::INFINITY);
        assert!(
            e2e <= E2E_BOUND_MS,
            "seed {seed}: after {} new outbox events were applied only after {e2e:.0} ms",
            f.kind.label()
        );
    }
}

/// Upper bound of the end-to-end recovery: the relay's longest backoff
/// (10 s + 100 % jitter) plus the goal.
const E2E_BOUND_MS: f64 = 30_000.0;
