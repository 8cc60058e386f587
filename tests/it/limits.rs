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

/// The DLQ's arguments as the broker lists them.
fn dlq_arguments(env: &TestEnv) -> serde_json::Value {
    let listed = sh(
        "rabbitmqctl",
        &[
            "-q",
            "list_queues",
            "-p",
            &env.vhost,
            "name",
            "arguments",
            "--formatter",
            "json",
        ],
    );
    let queues: Vec<serde_json::Value> = serde_json::from_str(&listed).expect("json");
    queues
        .into_iter()
        .find(|q| q["name"] == "pesanan.dlq")
        .map(|q| {
            // [[name, type, value], ...] -> {name: value}
            let pairs = q["arguments"].as_array().cloned().unwrap_or_default();
            pairs
                .into_iter()
                .map(|a| (a[0].as_str().unwrap_or("").to_owned(), a[2].clone()))
                .collect::<serde_json::Map<_, _>>()
                .into()
        })
        .unwrap_or_else(|| panic!("no pesanan.dlq in {listed}"))
}

/// A full DLQ (DLQ_MAX_LENGTH=2) refuses further dead letters: the shard
/// queue keeps them in its dead-letter backlog (at-least-once), and they
/// arrive once the DLQ is drained. Five poison messages, none lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_a_full_dlq_refuses_dead_letters_and_loses_none() {
    let env = TestEnv::new("limits_dlq_full").await;
    let mut settings = env.settings(1);
    settings.dlq_max_length = 2;
    let pool = RunningPool::start(settings).await;
    pool.wait_ready().await;
    let args = dlq_arguments(&env);
    assert_eq!(args["x-max-length"], serde_json::json!(2), "{args}");
    assert_eq!(
        args["x-max-length-bytes"],
        serde_json::json!(1u64 << 30),
        "{args}"
    );
    assert_eq!(
        args["x-overflow"],
        serde_json::json!("reject-publish"),
        "{args}"
    );
    let poison: Vec<Msg> = (0..5)
        .map(|i| {
            let mut m = Msg::event(&format!("dlqfull-{i}"), 1);
            m.body = b"not json".to_vec();
            m
        })
        .collect();
    env.publisher().await.send_all(&poison).await;
    let conn = env.broker().await;
    // `messages` of a quorum queue counts its dead-letter backlog too.
    let counts = || {
        let listed = sh(
            "rabbitmqctl",
            &["-q", "list_queues", "-p", &env.vhost, "name", "messages"],
        );
        let of = |queue: &str| -> u64 {
            listed
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{queue}\t")))
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or(0)
        };
        (of("pesanan.dlq"), of("pesanan.shard-000"), listed.clone())
    };
    let start = Instant::now();
    loop {
        let (dlq, shard, listed) = counts();
        // RabbitMQ 3.10 admits one message past a quorum queue's cap.
        assert!(dlq <= 3, "the cap did not hold: {listed}");
        if dlq >= 2 && dlq + shard == 5 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the dead letters are not all in the DLQ or held by the shard after 30 s: {listed}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(7)).await;
    let (dlq, shard, listed) = counts();
    assert!(dlq <= 3 && dlq + shard == 5, "{listed}");
    // Making room: what the shard held is still there (the broker resends
    // it on its own timer, `dead_letter_worker_publisher_confirm_timeout`).
    let drained = drain_dlq(&conn).await.len() as u64;
    // rabbitmqctl's queue statistics lag by a few seconds.
    tokio::time::sleep(Duration::from_secs(7)).await;
    let (dlq, shard, listed) = counts();
    assert_eq!(
        drained + dlq + shard,
        5,
        "none lost after draining: {listed}"
    );
    pool.stop().await;
}

/// A DLQ declared before the caps (no x-max-length) is kept as it is: the
/// pool starts (no PRECONDITION_FAILED), with a warning naming the policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_an_uncapped_dlq_of_an_older_release_is_kept() {
    use lapin::options::QueueDeclareOptions;
    use lapin::types::{AMQPValue, FieldTable, LongString};
    let env = TestEnv::new("limits_dlq_old").await;
    let conn = env.broker().await;
    let ch = conn.create_channel().await.expect("channel");
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString(LongString::from("quorum")),
    );
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.queue_declare("pesanan.dlq".into(), durable, args)
        .await
        .expect("an old DLQ");
    let names = urutan::broker::Names::new("pesanan");
    urutan::broker::topology::declare(&conn, &names, 1, 5, false)
        .await
        .expect("the topology is declared over an uncapped DLQ");
    let args = dlq_arguments(&env);
    assert!(args.get("x-max-length").is_none(), "kept as it was: {args}");
    let differs = urutan::broker::topology::QueueSettings {
        delivery_limit: 5,
        quorum_group_size: Some(1),
        dlq: Default::default(),
    };
    let err = urutan::broker::topology::declare_with(&conn, &names, 1, differs, false)
        .await
        .expect_err("another group size is still a mismatch");
    assert!(err.to_string().contains("pesanan.dlq"), "{err}");
}
