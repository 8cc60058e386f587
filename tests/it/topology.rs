//! The broker topology of docs/contract.md section 1, as the broker itself reports it
//! (`rabbitmqctl`), and the ways declaring it refuses to go on: fewer shards
//! than exist, a queue declared with other arguments, a missing plugin, and
//! invalid settings at start.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use urutan::broker::topology::{self, Names, ShardPlan, TopologyError};

use crate::common::*;

/// Runs a `rabbitmqctl`-style listing with `--formatter json`.
fn listing(program: &str, args: &[&str]) -> Vec<Value> {
    let mut all = vec!["-q"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--formatter", "json"]);
    let out = sh(program, &all);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{program} {args:?}: {e}: {out}"))
}

/// `[[key, type, value], ...]` as `key -> value`.
fn arguments(row: &Value) -> BTreeMap<String, Value> {
    row["arguments"]
        .as_array()
        .expect("arguments is a list")
        .iter()
        .map(|arg| {
            let key = arg[0].as_str().expect("argument key").to_owned();
            (key, arg[2].clone())
        })
        .collect()
}

fn by_name(rows: Vec<Value>) -> BTreeMap<String, Value> {
    rows.into_iter()
        .map(|row| (row["name"].as_str().expect("name").to_owned(), row))
        .collect()
}

fn queues(env: &TestEnv) -> BTreeMap<String, Value> {
    by_name(listing(
        "rabbitmqctl",
        &[
            "list_queues",
            "-p",
            &env.vhost,
            "name",
            "durable",
            "arguments",
        ],
    ))
}

fn exchanges(env: &TestEnv) -> BTreeMap<String, Value> {
    by_name(listing(
        "rabbitmqctl",
        &[
            "list_exchanges",
            "-p",
            &env.vhost,
            "name",
            "type",
            "durable",
            "arguments",
        ],
    ))
}

/// Every binding as `(source, destination, routing key)`, sorted.
fn bindings(env: &TestEnv) -> Vec<(String, String, String)> {
    let rows = listing(
        "rabbitmqctl",
        &[
            "list_bindings",
            "-p",
            &env.vhost,
            "source_name",
            "destination_name",
            "routing_key",
        ],
    );
    let field = |row: &Value, key: &str| row[key].as_str().expect(key).to_owned();
    let mut out: Vec<_> = rows
        .iter()
        .map(|r| {
            (
                field(r, "source_name"),
                field(r, "destination_name"),
                field(r, "routing_key"),
            )
        })
        .collect();
    out.sort();
    out
}

/// Queues bound to the hash exchange, with their routing keys (weights).
pub(crate) fn hash_bindings(env: &TestEnv) -> Vec<(String, String)> {
    bindings(env)
        .into_iter()
        .filter(|(source, _, _)| source == "pesanan-hash")
        .map(|(_, queue, key)| (queue, key))
        .collect()
}

fn shard(i: u16) -> String {
    Names::new("pesanan").shard_queue(i)
}

async fn declare(
    env: &TestEnv,
    shards: u16,
    delivery_limit: u32,
    allow_shrink: bool,
) -> Result<ShardPlan, TopologyError> {
    let conn = urutan::broker::connect(&env.amqp_url().into(), "t")
        .await
        .expect("connect");
    let names = Names::new("pesanan");
    let result = topology::declare(&conn, &names, shards, delivery_limit, allow_shrink).await;
    let _ = urutan::broker::call("connection.close", conn.close(200, "done".into())).await;
    result
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declares_the_contract_topology() {
    let env = TestEnv::new("topo").await;
    let plan = declare(&env, 4, 5, false).await.expect("declare");
    assert_eq!(
        plan,
        ShardPlan {
            bound: 4,
            consumed: 4
        }
    );

    let ex = exchanges(&env);
    let entry = &ex["pesanan"];
    assert_eq!(entry["type"], "topic");
    assert_eq!(entry["durable"], true);
    let hash = &ex["pesanan-hash"];
    assert_eq!(hash["type"], "x-consistent-hash");
    assert_eq!(hash["durable"], true);
    assert_eq!(arguments(hash)["hash-header"], "x-pesanan-id");
    let dlx = &ex["pesanan.dlx"];
    assert_eq!(dlx["type"], "fanout");
    assert_eq!(dlx["durable"], true);

    let qs = queues(&env);
    let expected_shard_args: BTreeMap<String, Value> = [
        ("x-queue-type", json!("quorum")),
        ("x-single-active-consumer", json!(true)),
        ("x-delivery-limit", json!(5)),
        ("x-dead-letter-exchange", json!("pesanan.dlx")),
        ("x-dead-letter-strategy", json!("at-least-once")),
        ("x-overflow", json!("reject-publish")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let names: Vec<_> = qs.keys().cloned().collect();
    assert_eq!(
        names,
        [
            "pesanan.dlq",
            "pesanan.shard-000",
            "pesanan.shard-001",
            "pesanan.shard-002",
            "pesanan.shard-003"
        ]
    );
    for i in 0..4 {
        let q = &qs[&shard(i)];
        assert_eq!(q["durable"], true, "{q}");
        assert_eq!(arguments(q), expected_shard_args, "{}", shard(i));
    }
    let dlq = &qs["pesanan.dlq"];
    assert_eq!(dlq["durable"], true);
    assert_eq!(arguments(dlq)["x-queue-type"], "quorum");

    let b = bindings(&env);
    let has = |s: &str, d: &str, k: &str| b.contains(&(s.to_owned(), d.to_owned(), k.to_owned()));
    assert!(has("pesanan", "pesanan-hash", "pesanan.#"), "{b:?}");
    assert!(has("pesanan.dlx", "pesanan.dlq", ""), "{b:?}");
    let expected: Vec<_> = (0..4).map(|i| (shard(i), "1".to_owned())).collect();
    assert_eq!(hash_bindings(&env), expected, "weight \"1\" each");
    assert_eq!(ring(&env), (0..4).map(shard).collect::<Vec<_>>());

    // Declaring again changes nothing.
    let before = (queues(&env), exchanges(&env), bindings(&env), ring(&env));
    assert_eq!(declare(&env, 4, 5, false).await.expect("again"), plan);
    let after = (queues(&env), exchanges(&env), bindings(&env), ring(&env));
    assert_eq!(before, after);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starting_with_more_shards_appends_them_and_fewer_is_refused() {
    let env = TestEnv::new("grow").await;
    declare(&env, 2, 5, false).await.expect("2 shards");
    assert_eq!(ring(&env), [shard(0), shard(1)]);
    let plan = declare(&env, 4, 5, false).await.expect("4 shards");
    assert_eq!(
        plan,
        ShardPlan {
            bound: 4,
            consumed: 4
        }
    );
    let all: Vec<_> = (0..4).map(|i| (shard(i), "1".to_owned())).collect();
    assert_eq!(hash_bindings(&env), all);
    // The old shards keep their buckets; the new ones come after them.
    assert_eq!(ring(&env), (0..4).map(shard).collect::<Vec<_>>());

    let err = declare(&env, 2, 5, false)
        .await
        .expect_err("shrink refused");
    assert!(
        matches!(
            err,
            TopologyError::Shrink {
                existing: 4,
                wanted: 2
            }
        ),
        "{err:?}"
    );
    let text = err.to_string();
    for part in ["4 shard queues", "SHARD_COUNT is 2", "--allow-shrink"] {
        assert!(text.contains(part), "`{part}` missing from: {text}");
    }
    assert_eq!(hash_bindings(&env), all, "a refused shrink changes nothing");

    let plan = declare(&env, 2, 5, true).await.expect("allowed shrink");
    assert_eq!(
        plan,
        ShardPlan {
            bound: 2,
            consumed: 4
        }
    );
    let first_two: Vec<_> = (0..2).map(|i| (shard(i), "1".to_owned())).collect();
    assert_eq!(hash_bindings(&env), first_two, "shards 002 and 003 unbound");
    assert_eq!(ring(&env), [shard(0), shard(1)]);
    assert!(
        queues(&env).contains_key(&shard(3)),
        "unbound shards stay until drained"
    );
    // A restart with the same settings finds the extra shards already unbound.
    let again = declare(&env, 2, 5, true).await.expect("shrink again");
    assert_eq!(again, plan);
    assert_eq!(hash_bindings(&env), first_two);

    // Growing back appends them again, after the kept ones.
    declare(&env, 4, 5, false).await.expect("grow back");
    assert_eq!(hash_bindings(&env), all);
    assert_eq!(ring(&env), (0..4).map(shard).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_with_other_arguments_is_a_clear_error() {
    let env = TestEnv::new("mismatch").await;
    declare(&env, 2, 5, false).await.expect("limit 5");
    let err = declare(&env, 2, 7, false).await.expect_err("limit 7");
    match &err {
        TopologyError::Mismatch { object, detail } => {
            assert_eq!(object, "pesanan.shard-000");
            assert!(detail.contains("x-delivery-limit"), "{detail}");
        }
        other => panic!("expected Mismatch, got {other:?}"),
    }
    let text = err.to_string();
    assert!(
        text.contains("pesanan.shard-000") && text.contains("DELIVERY_LIMIT"),
        "{text}"
    );
    assert!(!text.contains('\n'), "one line: {text}");
    // The queues keep their original limit.
    assert_eq!(arguments(&queues(&env)[&shard(1)])["x-delivery-limit"], 5);

    // An exchange of another kind under a contract name is named too.
    let other = TestEnv::new("mismatchx").await;
    let conn = other.broker().await;
    let ch = conn.create_channel().await.expect("channel");
    ch.exchange_declare(
        "pesanan".into(),
        lapin::ExchangeKind::Fanout,
        lapin::options::ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        },
        lapin::types::FieldTable::default(),
    )
    .await
    .expect("fanout pesanan");
    let err = declare(&other, 2, 5, false).await.expect_err("wrong type");
    assert!(
        matches!(&err, TopologyError::Mismatch { object, .. } if object == "pesanan"),
        "{err:?}"
    );
}

/// The `urutan` binary with exactly `env` as its environment.
fn urutan(args: &[&str], env: &[(&str, String)]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_urutan"));
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .env_clear();
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// Runs to completion (at most 10 s): (success, stderr, elapsed).
async fn run_to_end(args: &[&str], env: &[(&str, String)]) -> (bool, String, Duration) {
    let start = Instant::now();
    let out = tokio::time::timeout(Duration::from_secs(10), urutan(args, env).output())
        .await
        .expect("urutan did not exit within 10 s")
        .expect("run urutan");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.success(), stderr, start.elapsed())
}

fn assert_short_error(stderr: &str, names: &[&str]) {
    let lines: Vec<_> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(
        lines.len() <= 2 && stderr.len() < 400,
        "not short: {stderr}"
    );
    assert!(
        lines
            .first()
            .is_some_and(|l| names.iter().any(|n| l.contains(n))),
        "first line names none of {names:?}: {stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_configuration_fails_at_start_with_one_line() {
    let env = TestEnv::new("badcfg").await;
    let mut vars: Vec<(&str, String)> = env.process_env(2);

    vars.push(("SHARD_COUNT", "0".to_owned()));
    let (ok, stderr, took) = run_to_end(&["run"], &vars).await;
    assert!(!ok, "SHARD_COUNT=0 accepted");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert_short_error(&stderr, &["shard-count", "SHARD_COUNT"]);
    vars.pop();

    vars.push(("AMQP_URL", "nonsense".to_owned()));
    let (ok, stderr, took) = run_to_end(&["run"], &vars).await;
    assert!(!ok, "AMQP_URL=nonsense accepted");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert_short_error(&stderr, &["amqp-url", "AMQP_URL"]);
    vars.pop();

    vars.push(("DEDUP_RETENTION", "0s".to_owned()));
    let (ok, stderr, _) = run_to_end(&["run"], &vars).await;
    assert!(!ok, "DEDUP_RETENTION=0s accepted");
    assert_short_error(&stderr, &["dedup-retention", "DEDUP_RETENTION"]);
    vars.pop();

    for (name, flag, bad) in [
        ("GAP_POLICY", "gap-policy", "later"),
        ("GAP_TIMEOUT", "gap-timeout", "soon"),
        ("ON_REFUSED", "on-refused", "drop"),
    ] {
        vars.push((name, bad.to_owned()));
        let (ok, stderr, _) = run_to_end(&["run"], &vars).await;
        assert!(!ok, "{name}={bad} accepted");
        assert_short_error(&stderr, &[flag, name]);
        vars.pop();
    }

    // Passwords never print: an unreachable broker (retried, and logged each
    // time) and a database URL with a password (trust auth ignores it; the
    // "database ready" line shows the URL).
    let secret = "topsecret-pw";
    let db_url = format!(
        "postgres://postgres:{secret}@127.0.0.1:5432/{}",
        env.database
    );
    let vars = vec![
        ("AMQP_URL", format!("amqp://guest:{secret}@127.0.0.1:1/%2f")),
        ("DATABASE_URL", db_url),
        ("METRICS_ADDR", "127.0.0.1:0".to_owned()),
        ("RUST_LOG", "debug".to_owned()),
    ];
    let mut child = urutan(&["run"], &vars).spawn().expect("spawn urutan run");
    // Read stderr while it runs: at debug level the migrations alone fill a
    // pipe's buffer, and a child blocked on a full pipe would stall.
    let mut pipe = child.stderr.take().expect("stderr");
    let reader = tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        let mut all = Vec::new();
        let _ = pipe.read_to_end(&mut all).await;
        all
    });
    // Until the migrations are in (the "database ready" line follows at
    // once), then a moment for a few broker retries.
    let db = sqlx::PgPool::connect(env.database_url().expose())
        .await
        .expect("connect without migrating");
    let migrations = std::fs::read_dir("migrations").expect("migrations").count() as i64;
    wait_for(
        "the migrations applied",
        Duration::from_secs(60),
        || async {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM _sqlx_migrations WHERE success")
                .fetch_one(&db)
                .await
                .is_ok_and(|n| n == migrations)
        },
    )
    .await;
    db.close().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        child.try_wait().expect("try_wait").is_none(),
        "`urutan run` gave up on an unreachable broker"
    );
    let pid = child.id().expect("pid").to_string();
    sh("kill", &["-TERM", &pid]);
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("no exit within 10 s of SIGTERM")
        .expect("wait");
    let stderr = reader.await.expect("stderr reader");
    let out = std::process::Output {
        status,
        stdout: Vec::new(),
        stderr,
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {stderr}", out.status);
    assert!(
        !stderr.contains(secret),
        "a password was printed:\n{stderr}"
    );
    assert!(
        stderr.contains("postgres:***@127.0.0.1"),
        "no redacted URL:\n{stderr}"
    );
    assert!(
        stderr.contains("broker 127.0.0.1:1 unreachable (connection refused); retrying"),
        "the broker failure is logged:\n{stderr}"
    );

    // The one-shot commands name the unreachable service, redacted.
    let unreachable = [
        (
            "topology",
            "AMQP_URL",
            format!("amqp://guest:{secret}@127.0.0.1:1/%2f"),
            "amqp://guest:***@127.0.0.1:1/",
        ),
        (
            "migrate",
            "DATABASE_URL",
            format!("postgres://postgres:{secret}@127.0.0.1:1/x"),
            "postgres://postgres:***@127.0.0.1:1/x",
        ),
    ];
    for (command, var, url, shown) in unreachable {
        // The test's own vhost and database for the other service.
        let mut vars: Vec<(&str, String)> = env.process_env(2);
        vars.retain(|(name, _)| *name != var);
        vars.push((var, url));
        let (ok, stderr, took) = run_to_end(&[command], &vars).await;
        assert!(!ok, "`urutan {command}` succeeded without its service");
        assert!(took < Duration::from_secs(5), "took {took:?}");
        assert!(
            !stderr.contains(secret),
            "a password was printed:\n{stderr}"
        );
        assert!(stderr.contains(shown), "{shown} not named:\n{stderr}");
    }
}

/// Re-enables the plugin when dropped, also when the test panics.
struct PluginBack;

impl Drop for PluginBack {
    fn drop(&mut self) {
        let enabled = command("rabbitmq-plugins")
            .args(["-q", "enable", "rabbitmq_consistent_hash_exchange"])
            .output();
        if !matches!(&enabled, Ok(out) if out.status.success()) {
            eprintln!("COULD NOT RE-ENABLE rabbitmq_consistent_hash_exchange: {enabled:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serial_missing_plugin_is_reported_in_one_clear_line() {
    let env = TestEnv::new("noplugin").await;
    let guard = PluginBack;
    sh(
        "rabbitmq-plugins",
        &["-q", "disable", "rabbitmq_consistent_hash_exchange"],
    );
    let result = declare(&env, 2, 5, false).await;
    drop(guard);
    let err = result.expect_err("declared without the plugin");
    assert!(
        matches!(err, TopologyError::PluginMissing),
        "expected PluginMissing, got {err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("rabbitmq-plugins enable rabbitmq_consistent_hash_exchange"),
        "{text}"
    );
    assert!(!text.contains('\n'), "one line: {text}");

    // Back on: the same declaration now succeeds.
    let plan = declare(&env, 2, 5, false).await.expect("plugin re-enabled");
    assert_eq!(plan.bound, 2);
    assert_eq!(ring(&env), [shard(0), shard(1)]);
}

/// The users of `deploy/rabbitmq/least-privilege.sh`, made by the script
/// itself in the test's vhost: `urutan topology` runs as its topology user,
/// `urutan run` as its worker user (`TOPOLOGY_MODE=check`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_least_privilege_worker_checks_the_topology_passively() {
    let env = TestEnv::new("leastpriv").await;
    let users = RabbitUsers::create(&env, false);
    let mut settings = env.settings(3);
    settings.topology_mode = urutan::config::TopologyMode::Check;
    settings.amqp_url = users.url("worker").parse().expect("url");

    // Nothing declared yet: a clear, fatal error naming what is missing.
    let pool = RunningPool::start(settings.clone()).await;
    let result = tokio::time::timeout(Duration::from_secs(30), pool.task)
        .await
        .expect("stopped")
        .expect("task");
    let err = result.expect_err("missing topology").to_string();
    assert!(
        err.contains("pesanan.shard-000") && err.contains("urutan topology"),
        "{err}"
    );

    // Declared by the script's topology user (which also opens an epoch:
    // markers through amq.default), the least-privilege worker runs.
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_urutan"))
        .arg("topology")
        .envs(env.process_env(3))
        .env("AMQP_URL", users.url("topology"))
        .output()
        .expect("urutan topology");
    assert!(status.status.success(), "{status:?}");
    let pool = RunningPool::ready(settings).await;
    env.publisher()
        .await
        .send_all(&[Msg::event("L", 1), Msg::event("L", 2)])
        .await;
    let db = env.db().await;
    wait_applied(&db, 2, Duration::from_secs(30)).await;
    pool.stop().await;
}

/// `QUORUM_GROUP_SIZE` sets `x-quorum-initial-group-size` on the queues;
/// like `DELIVERY_LIMIT` it is part of the topology: the broker compares it
/// on every declare, so another value later is a clear mismatch error.
#[tokio::test]
async fn the_quorum_group_size_is_part_of_the_topology() {
    let env = TestEnv::new("topo_group").await;
    let conn = urutan::broker::connect(&env.amqp_url().into(), "t")
        .await
        .expect("connect");
    let names = Names::new("pesanan");
    let with = |size| topology::QueueSettings {
        delivery_limit: 5,
        quorum_group_size: size,
        dlq: Default::default(),
    };
    topology::declare_with(&conn, &names, 2, with(Some(1)), false)
        .await
        .expect("declare with a group size");
    topology::declare_with(&conn, &names, 3, with(Some(1)), false)
        .await
        .expect("declare again with the same size, one more shard");
    let listed = queues(&env);
    for queue in [shard(0), shard(2), "pesanan.dlq".to_owned()] {
        let args = arguments(&listed[&queue]);
        assert_eq!(args["x-quorum-initial-group-size"], json!(1), "{queue}");
    }
    let err = topology::declare_with(&conn, &names, 3, with(None), false)
        .await
        .expect_err("another value is a mismatch");
    assert!(
        err.to_string().contains("x-quorum-initial-group-size"),
        "{err}"
    );
    let _ = urutan::broker::call("connection.close", conn.close(200, "done".into())).await;
}
