//! The fault suite against the three-node RabbitMQ 4.3 cluster (issue 15):
//! each cluster fault once (seeded order) under a continuous load from the
//! relay and from a direct producer, then every invariant: nothing lost,
//! nothing applied twice, order per order, the DLQ holds exactly the poison,
//! and each workers' recovery within twice its goal.
//!
//! Runs only when `FAULTS_CLUSTER` names `deploy/brokers/cluster.sh`
//! (`deploy/brokers/cluster-check.sh` starts the cluster and sets it);
//! otherwise it prints one line and passes, so a run against the machine's
//! broker is not affected. It kills and restarts cluster nodes, hence
//! `serial_` (run alone).

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

/// End-to-end bound, as in `tests/faults.rs`: the relay's longest
/// reconnect backoff (10 s + 100 % jitter) plus the goal; at least the
/// workers' bound.
const E2E_BOUND_MS: f64 = 30_000.0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serial_cluster_faults_keep_every_promise() {
    if std::env::var("FAULTS_CLUSTER").map_or(true, |v| v.trim().is_empty()) {
        println!("cluster faults: skipped (run deploy/brokers/cluster-check.sh)");
        return;
    }
    let seed = std::env::var("FAULTS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::random::<u32>() as u64);
    let opts = engine::Options {
        faults: inject::Kind::CLUSTER.len(),
        kinds: inject::Kind::CLUSTER.to_vec(),
        direct_rate: 100,
        direct_entities: 100,
        seed,
        shards: 12,
        prefetch: vec![1, 16],
        entities: 200,
        rate: 150,
        handler_delay_ms: 2,
        gap_ms: (500, 1500),
        db_stop_secs: (10, 10),
        recovery_limit: Duration::from_secs(150),
        log_dir: PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("faults-cluster-{seed}")),
    };
    eprintln!(
        "cluster faults: seed {seed} (replay: FAULTS_SEED={seed}), logs in {}",
        opts.log_dir.display()
    );
    let services = services::Services::from_env().expect("services");
    let run = tokio::time::timeout(Duration::from_secs(900), engine::run(&services, &opts));
    let report = run
        .await
        .expect("the cluster fault run did not finish within 15 min")
        .expect("the cluster fault run could not be set up or checked");
    let md = report::markdown(&report);
    eprintln!("{md}");
    if let Ok(path) = std::env::var("FAULTS_REPORT") {
        std::fs::write(&path, &md).expect("write FAULTS_REPORT");
    }

    let kinds: Vec<_> = report.faults.iter().map(|f| f.kind).collect();
    for kind in inject::Kind::CLUSTER {
        assert!(kinds.contains(&kind), "{kind:?} was not injected");
    }
    let direct = report.direct.as_ref().map_or(0, |d| d.confirmed);
    assert!(
        report.events_written > 1_000 && direct > 1_000 && report.mix.poison_confirmed > 0,
        "too little workload to prove anything: {} outbox events, {direct} direct versions, {} poison",
        report.events_written,
        report.mix.poison_confirmed
    );
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
    // One line for cluster-check.sh to quote.
    println!(
        "cluster faults: PASS {} faults, recovery max {:.1} s, {} versions, {} out of order, {:.0} s",
        report.faults.len(),
        worst / 1000.0,
        report.history_rows,
        report.reordered,
        report.duration_s
    );
}
