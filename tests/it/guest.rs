//! The demo is a guest on a shared machine (`deploy/local/guest.sh`): with
//! its services up it skips set-up; with one stopped it says which and how
//! to start it, and changes nothing (it never runs `setup.sh`, which starts
//! what is stopped, once the services are installed).

use std::process::Command;
use std::time::{Duration, Instant};

fn repo() -> &'static std::path::Path {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn bash(script: &str, vars: &[(&str, &str)]) -> (Option<i32>, String, String, Duration) {
    let start = Instant::now();
    let out = Command::new("timeout")
        .args(["60", "bash", "-c", script])
        .current_dir(repo())
        .envs(vars.iter().copied())
        .output()
        .expect("bash");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        start.elapsed(),
    )
}

#[test]
fn the_demo_uses_running_services_without_set_up() {
    let (code, stdout, stderr, _) = bash("source deploy/local/guest.sh && guest_check", &[]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("set-up skipped"), "{stdout}");
    assert!(!stdout.contains("setup:"), "setup.sh ran: {stdout}");
}

#[test]
fn the_demo_reports_a_stopped_service_and_changes_nothing() {
    let (code, stdout, stderr, took) = bash(
        "exec bash deploy/local/demo.sh",
        &[
            ("DATABASE_URL", "postgres://postgres@127.0.0.1:1/urutan"),
            ("AMQP_URL", "amqp://guest:guest@127.0.0.1:2/%2f"),
        ],
    );
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    assert!(
        stderr.contains("PostgreSQL at 127.0.0.1:1 and RabbitMQ at 127.0.0.1:2 not reachable"),
        "{stderr}"
    );
    assert!(
        stderr.contains("deploy/local/setup.sh"),
        "names the fix: {stderr}"
    );
    assert!(
        !stdout.contains("setup:") && !stderr.contains("setup:"),
        "setup.sh ran: {stdout}{stderr}"
    );
    assert!(!stderr.contains("Compiling"), "went on to build: {stderr}");
    assert!(took < Duration::from_secs(15), "took {took:?}");
}
