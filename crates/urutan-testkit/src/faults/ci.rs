//! What the two CI runs of the fault engine share (`tests/faults.rs` on one
//! broker, `tests/cluster.rs` on the three-node cluster): the seed, the
//! options, and the verdict: every kind injected, every invariant held,
//! each workers' recovery within twice its goal and the end-to-end one
//! within [`E2E_BOUND_MS`].

use std::time::Duration;

use crate::faults::engine::{self, Options};
use crate::faults::inject::Kind;
use crate::faults::report::RunReport;

/// Upper bound of the end-to-end recovery: the relay's reconnect backoff
/// (its attempts fail for as long as the broker is away, each waiting
/// longer, up to 10 s + jitter) plus its catching up with the outbox rows
/// written meanwhile; at least the workers' bound of the fault (README,
/// "Proven under faults").
pub const E2E_BOUND_MS: f64 = 30_000.0;

/// `FAULTS_SEED`, else a random one (printed by [`run`] for a replay).
pub fn seed() -> u64 {
    std::env::var("FAULTS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::random::<u32>() as u64)
}

/// Each of `kinds` once, in a seeded order, under the CI workload: 12
/// shards, strict and batch replicas taking turns, 200 orders at 150
/// events/s through the outbox, 0.5-1.5 s between faults.
pub fn options(kinds: &[Kind], seed: u64, logs: &str) -> Options {
    Options {
        holds: false,
        faults: kinds.len(),
        kinds: kinds.to_vec(),
        direct_rate: 0,
        direct_entities: 0,
        seed,
        shards: 12,
        consume: crate::faults::fleet::Consume::ROTATION.to_vec(),
        entities: 200,
        rate: 150,
        handler_delay_ms: 2,
        gap_ms: (500, 1500),
        db_stop_secs: (10, 10),
        recovery_limit: Duration::from_secs(30),
        log_dir: crate::target_tmpdir().join(format!("{logs}-{seed}")),
    }
}

/// Runs the engine (bounded by `limit`), prints the report and asserts the
/// verdict; returns the report and the worst workers' recovery in ms.
pub async fn run(what: &str, opts: &Options, limit: Duration) -> (RunReport, f64) {
    let seed = opts.seed;
    eprintln!(
        "{what}: seed {seed} (replay: FAULTS_SEED={seed}), logs in {}",
        opts.log_dir.display()
    );
    let services = crate::faults::services::Services::from_env().expect("services");
    let report = tokio::time::timeout(limit, engine::run(&services, opts))
        .await
        .unwrap_or_else(|_| panic!("{what}: the run did not finish within {limit:?}"))
        .unwrap_or_else(|e| panic!("{what}: the run could not be set up or checked: {e:#}"));
    let md = crate::faults::report::markdown(&report);
    eprintln!("{md}");
    if let Ok(path) = std::env::var("FAULTS_REPORT") {
        std::fs::write(&path, &md).expect("write FAULTS_REPORT");
    }

    let injected: Vec<_> = report.faults.iter().map(|f| f.kind).collect();
    for kind in &opts.kinds {
        assert!(injected.contains(kind), "{kind:?} was not injected");
    }
    assert!(
        report.passed(),
        "seed {seed}: invariants or recovery failed (report above)"
    );
    let mut worst = 0.0_f64;
    for f in &report.faults {
        let bound = 2.0 * f.kind.goal().as_secs_f64() * 1000.0;
        let recovery = f.recovery_ms.unwrap_or(f64::INFINITY);
        worst = worst.max(recovery);
        assert!(
            recovery <= bound,
            "seed {seed}: after {} the workers processed again in {recovery:.0} ms (bound {bound:.0} ms)",
            f.kind.label()
        );
        let e2e = f.e2e_ms.unwrap_or(f64::INFINITY);
        assert!(
            e2e <= E2E_BOUND_MS.max(bound),
            "seed {seed}: after {} new outbox events were applied only after {e2e:.0} ms",
            f.kind.label()
        );
    }
    (report, worst)
}
