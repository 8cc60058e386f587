//! `/metrics` as an operator reads it: every metric urutan names is in
//! docs/operations.md's table; a worker exports its build and its process
//! (CPU, memory, file descriptors) and no dead-letter or retry series before
//! it counts one.

use std::collections::BTreeSet;
use std::time::Duration;

use urutan_testkit::fixtures::{Msg, TestEnv, UrutanProcess, wait_count};

fn docs() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md"))
        .expect("docs/operations.md")
}

/// Names in `# TYPE <name> <type>` lines of a scrape.
fn exported(scrape: &str) -> BTreeSet<String> {
    scrape
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// Every metric name constant of crates/urutan/src/metrics.rs (the one
/// place the code names its metrics), exported now or only once counted.
#[test]
fn the_operations_guide_lists_every_metric_urutan_names() {
    let source = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/crates/urutan/src/metrics.rs"
    ))
    .expect("metrics.rs");
    let names: Vec<&str> = source
        .lines()
        .filter(|l| l.starts_with("pub const ") && l.contains(": &str = \"urutan_"))
        .filter_map(|l| l.split('"').nth(1))
        .collect();
    assert!(names.len() > 35, "found only {names:?}");
    let docs = docs();
    let missing: Vec<_> = names
        .iter()
        .filter(|n| !docs.contains(&format!("`{n}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/operations.md's metrics table lacks {missing:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_exports_its_build_and_process_and_reasons_only_once_counted() {
    let env = TestEnv::new("metrics_scrape").await;
    let db = env.db().await;
    let mut vars = env.process_env(2);
    vars.push(("RUST_LOG", "warn".to_owned()));
    let mut pool = UrutanProcess::start("run", &vars);
    pool.wait_ready().await;

    let scrape = pool.scrape().await;
    let version = env!("CARGO_PKG_VERSION");
    let build = scrape
        .lines()
        .find(|l| l.starts_with("urutan_build_info{"))
        .unwrap_or_else(|| panic!("no urutan_build_info in\n{scrape}"));
    assert!(
        build.contains(&format!("version=\"{version}\"")) && build.ends_with(" 1"),
        "{build}"
    );
    let commit = build
        .split("commit=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_default();
    assert!(
        commit == "unknown"
            || (commit.len() == 12 && commit.chars().all(|c| c.is_ascii_hexdigit())),
        "{build}"
    );
    let resident: f64 = scrape
        .lines()
        .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no process_resident_memory_bytes in\n{scrape}"));
    assert!(resident > 1e6, "resident memory {resident}");
    for name in [
        "process_cpu_seconds_total",
        "process_open_fds",
        "process_threads",
    ] {
        assert!(
            scrape.contains(&format!("\n{name} ")),
            "no {name} in\n{scrape}"
        );
    }
    // Reasons appear when counted: nothing dead-lettered yet, no series.
    assert!(
        !scrape.contains("urutan_dead_letters_total{"),
        "dead-letter series before any dead letter:\n{scrape}"
    );
    assert!(scrape.contains("urutan_messages_total{"), "{scrape}");

    // Everything exported is documented.
    let docs = docs();
    let undocumented: Vec<_> = exported(&scrape)
        .into_iter()
        .filter(|n| !docs.contains(&format!("`{n}`")))
        .collect();
    assert!(
        undocumented.is_empty(),
        "exported but not in docs/operations.md: {undocumented:?}"
    );

    // One message without its header: now its reason's series exists.
    let mut bad = Msg::event("M-1", 1);
    bad.header = None;
    env.publisher().await.send_all(&[bad]).await;
    wait_count(
        &db,
        "SELECT count(*) FROM urutan_dead_letter",
        1,
        Duration::from_secs(30),
    )
    .await;
    let scrape = pool
        .wait_scrape("the dead letter counted", Duration::from_secs(30), |s| {
            s.contains("urutan_dead_letters_total{")
        })
        .await;
    let series: Vec<_> = scrape
        .lines()
        .filter(|l| l.starts_with("urutan_dead_letters_total{"))
        .collect();
    assert_eq!(series.len(), 1, "{series:?}");
    assert!(series[0].ends_with(" 1"), "{series:?}");
}
