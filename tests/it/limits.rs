//! Limits a hostile client cannot push past (docs/security.md, "Limits" and
//! "Secrets"): the HTTP endpoints' header timeout and connection cap, and
//! settings whose passwords never reach `--help` or an error.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::*;

/// `urutan run` on `env`: the real binary, its own HTTP port.
async fn running_pool(env: &TestEnv) -> UrutanProcess {
    let mut pool = UrutanProcess::start("run", &env.process_env(1));
    pool.wait_ready().await;
    pool
}

/// A request whose headers never end is closed by the server within the
/// header timeout (5 s), instead of holding a connection for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_a_half_sent_http_request_is_closed() {
    let env = TestEnv::new("limits_half").await;
    let pool = running_pool(&env).await;
    let mut stream = TcpStream::connect(pool.http()).await.expect("connect");
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .expect("half a request");
    let start = Instant::now();
    let mut buf = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(15), stream.read_to_end(&mut buf)).await;
    assert!(
        closed.is_ok(),
        "a half-sent request was still open after 15 s"
    );
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    let idle = TcpStream::connect(pool.http()).await.expect("connect");
    let mut idle = idle;
    let start = Instant::now();
    let closed = tokio::time::timeout(Duration::from_secs(15), idle.read_to_end(&mut buf)).await;
    assert!(
        closed.is_ok(),
        "an idle connection was still open after 15 s"
    );
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    pool.stop().await;
}

/// More idle connections than the cap (64), under a descriptor limit that
/// leaves room for the cap but not for the flood: the oldest are closed to
/// admit new ones, so `/healthz` (the liveness probe) still answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_an_idle_connection_flood_leaves_healthz_answering() {
    let env = TestEnv::new("limits_flood").await;
    let mut pool = running_pool(&env).await;
    let pid = pool.process.pid;
    let in_use = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fds")
        .count();
    let limit = (in_use + 100).to_string();
    sh(
        "prlimit",
        &[
            "--pid",
            &pid.to_string(),
            &format!("--nofile={limit}:{limit}"),
        ],
    );
    let mut flood = Vec::new();
    for _ in 0..300 {
        flood.push(TcpStream::connect(pool.http()).await.expect("connect"));
    }
    // Let the server accept what it can.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, body) = http_get(pool.http(), "/healthz").await;
    assert_eq!(
        (status, body.as_str()),
        (200, "ok\n"),
        "healthz under the flood"
    );
    pool.assert_running();
    drop(flood);
    pool.stop().await;
}

/// `--help` shows no setting's value that may hold a password, and a
/// malformed URL's error does not echo it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_help_and_bad_urls_never_show_passwords() {
    let env = TestEnv::new("limits_help").await;
    let secret_vars = [
        ("AMQP_URL", "amqp://u:pw-amqp-41@127.0.0.1:5672/%2f"),
        ("DATABASE_URL", "postgres://u:pw-db-42@127.0.0.1/x"),
        ("BROKER_METRICS_URL", "http://u:pw-metrics-43@h:15692"),
        ("EFFECTS", "*=https://u:pw-fx-44@h/hook"),
        ("EFFECTS_SECRET", "pw-secret-45-0123456789"),
        (
            "EFFECTS_SECRETS",
            r#"{"https://h/hook": "pw-secrets-46-0123456789"}"#,
        ),
        ("EFFECTS_PROXY", "http://u:pw-proxy-47@proxy:3128"),
    ];
    let passwords = [
        "pw-amqp-41",
        "pw-db-42",
        "pw-metrics-43",
        "pw-fx-44",
        "pw-secret-45",
        "pw-secrets-46",
        "pw-proxy-47",
    ];
    for args in [
        &["--help"][..],
        &["run", "--help"],
        &["status", "--help"],
        &["effects", "--help"],
    ] {
        let ran = urutan(&env, &secret_vars, args).await;
        assert!(ran.ok(), "{args:?}: {ran}");
        assert!(ran.stdout.contains("Usage:"), "{args:?}: {ran}");
        for pw in passwords {
            assert!(
                !ran.stdout.contains(pw) && !ran.stderr.contains(pw),
                "{args:?} shows {pw}: {ran}"
            );
        }
    }
    for (var, bad) in [
        ("AMQP_URL", "amqp://u:pw-bad-51@127.0.0.1:notaport/%2f"),
        (
            "AMQP_URL",
            "amqp://u:pw-bad-52@n1:5672/a,amqp://u:pw-bad-53@n2:5672/b",
        ),
        ("AMQP_URL", "http://u:pw-bad-54@h/"),
        ("DATABASE_URL", "postgres://u:pw-bad-55@[::1/x"),
        ("DATABASE_URL", "pw-bad-56 is not a url"),
    ] {
        let ran = urutan(&env, &[(var, bad)], &["verify"]).await;
        assert!(!ran.ok(), "{bad}: {ran}");
        assert!(
            ran.stderr.contains(&format!("<{var}>")),
            "names the setting: {ran}"
        );
        assert!(
            !ran.stdout.contains("pw-bad") && !ran.stderr.contains("pw-bad"),
            "{var}: {ran}"
        );
    }
}
