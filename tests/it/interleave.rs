//! The interleaving model's test (the model: `urutan_testkit::interleave`).

use std::time::Duration;

use urutan_testkit::interleave::{DEFAULT_BASE, RunConfig, env_u64, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interleavings_keep_every_order_across_ring_changes() {
    let seed = env_u64("URUTAN_INTERLEAVE_SEED");
    let config = RunConfig {
        cases: env_u64("URUTAN_INTERLEAVE_CASES").unwrap_or(1000),
        base: env_u64("URUTAN_INTERLEAVE_BASE").unwrap_or(DEFAULT_BASE),
        seed,
        workers: env_u64("URUTAN_INTERLEAVE_WORKERS").unwrap_or(4) as usize,
        legacy: false,
        max_failures: 0,
        time_limit: Duration::from_secs(600),
    };
    let summary = run(config).await.expect("interleaving run");
    eprintln!("{}", summary.report(false));
    if seed.is_some() {
        for f in &summary.failures {
            eprintln!("{}", f.trace.join("\n"));
        }
    }
    assert!(
        summary.failures.is_empty(),
        "{} of {} cases broke per-order order (replay one with URUTAN_INTERLEAVE_SEED):\n{}",
        summary.failures.len(),
        summary.ran,
        summary.report(false)
    );
}

/// A seed is its case: run twice, a case takes the same steps with the same
/// outcomes (the trace), faults, operator and clock included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seed_replays_the_same_case() {
    use urutan_testkit::interleave::{ModelDb, case_seed, run_case};
    let name = format!("urutan_test_interleave_replay_{}", std::process::id());
    let db = ModelDb::create(name, false).await.expect("model database");
    let mut with_faults = 0;
    for i in 0..6 {
        let seed = case_seed(DEFAULT_BASE, i);
        let first = run_case(&db.pool, seed, false, true).await.expect("case");
        let again = run_case(&db.pool, seed, false, true).await.expect("case");
        with_faults += first.stats.fault_cases;
        assert_eq!(first.trace, again.trace, "seed {seed:#x} ran differently");
        assert!(first.violations.is_empty(), "{:?}", first.violations);
    }
    assert!(with_faults > 0, "no case drew handler faults");
}
