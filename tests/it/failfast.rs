//! What cannot heal stops a command at start (exit 2, one line naming the
//! setting, the URL masked, and the fix); what can heal is retried with one
//! log line per change; a command line people expect (docs/contract.md
//! section 6).

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::AsyncBufReadExt;

use crate::common::*;

/// Runs `urutan <args>` with exactly `vars` (no inherited environment): at
/// most 15 s. (exit code, stderr, how long it took.)
async fn run_with(args: &[&str], vars: &[(&str, String)]) -> (Option<i32>, String, Duration) {
    let start = Instant::now();
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_urutan"));
    cmd.args(args)
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_secs(15), cmd.output())
        .await
        .unwrap_or_else(|_| panic!("urutan {args:?} ran longer than 15 s"))
        .expect("run urutan");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code(), stderr, start.elapsed())
}

/// The variables of `env`, with `var` set to `value`.
fn with(env: &TestEnv, var: &'static str, value: String) -> Vec<(&'static str, String)> {
    let mut vars = env.process_env(2);
    vars.retain(|(k, _)| *k != var && *k != "RUST_LOG");
    vars.push((var, value));
    vars
}

fn database_exists(name: &str) -> bool {
    let sql = format!("SELECT count(*) FROM pg_database WHERE datname = '{name}'");
    psql(&sql).trim() == "1"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_stop_every_command_at_start_with_exit_2_and_one_line() {
    let env = TestEnv::new("failfast").await;
    env.db().await.close().await;
    let secret = "wr0ng-pw-failfast";
    let typo = format!("{}_typo", env.database);
    let amqp =
        |user: &str, password: &str, vhost: &str| ("AMQP_URL", amqp_url_as(user, password, vhost));
    let cases = [
        (
            "a wrong broker password",
            amqp("guest", secret, &env.vhost),
            format!("AMQP_URL amqp://guest:***@{}/", amqp_addr()),
            "check the user and password",
            &["run", "status", "topology", "dlq list"][..],
        ),
        (
            "an unknown vhost",
            amqp("guest", "guest", "no-such-vhost-failfast"),
            format!(
                "AMQP_URL amqp://guest:***@{}/no-such-vhost-failfast",
                amqp_addr()
            ),
            "create the vhost or fix the path",
            &["run", "status", "explain X"],
        ),
        (
            "a database name with a typo",
            (
                "DATABASE_URL",
                format!("postgres://postgres:{secret}@127.0.0.1:5432/{typo}"),
            ),
            format!("DATABASE_URL postgres://postgres:***@127.0.0.1:5432/{typo}"),
            "urutan migrate --create-database",
            &["run", "status", "migrate", "relay", "hold list"],
        ),
        (
            "a database user that does not exist",
            (
                "DATABASE_URL",
                format!(
                    "postgres://nobody_failfast:{secret}@127.0.0.1:5432/{}",
                    env.database
                ),
            ),
            "DATABASE_URL postgres://nobody_failfast:***@127.0.0.1:5432/".to_owned(),
            "check the user",
            &["run", "status", "migrate", "verify"],
        ),
    ];
    for (what, (var, value), shown, fix, commands) in cases {
        for command in commands {
            let args: Vec<&str> = command.split(' ').collect();
            let (code, stderr, took) = run_with(&args, &with(&env, var, value.clone())).await;
            let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
            let said =
                format!("`urutan {command}` with {what}: exit {code:?} after {took:?}:\n{stderr}");
            assert_eq!(code, Some(2), "{said}");
            assert!(took < Duration::from_secs(10), "{said}");
            assert_eq!(lines.len(), 1, "one line: {said}");
            assert!(
                lines[0].contains(&shown) && lines[0].contains(fix),
                "{said}"
            );
            assert!(!stderr.contains(secret), "a password was printed: {said}");
        }
    }
    assert!(
        !database_exists(&typo),
        "a command created the misspelt database"
    );

    // Only `migrate --create-database` creates it.
    let created = with(
        &env,
        "DATABASE_URL",
        format!("postgres://postgres@127.0.0.1:5432/{typo}"),
    );
    let (code, stderr, _) = run_with(&["migrate", "--create-database"], &created).await;
    let dropped = scopeguard(&typo);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(database_exists(&typo), "not created: {stderr}");
    drop(dropped);
}

/// Drops database `name` when dropped.
fn scopeguard(name: &str) -> impl Drop {
    struct Drops(String);
    impl Drop for Drops {
        fn drop(&mut self) {
            psql_ignoring_failure(&format!(
                "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
                self.0
            ));
        }
    }
    Drops(name.to_owned())
}

/// A `urutan` child whose standard error is collected line by line.
struct Watched {
    child: tokio::process::Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Watched {
    fn start(args: &[&str], vars: &[(&str, String)]) -> Self {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_urutan"));
        cmd.args(args)
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn urutan");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let mut reader = tokio::io::BufReader::new(child.stderr.take().expect("stderr")).lines();
        let collected = lines.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = reader.next_line().await {
                collected.lock().expect("lines").push(line);
            }
        });
        Self { child, lines }
    }

    fn text(&self) -> String {
        self.lines.lock().expect("lines").join("\n")
    }

    fn count(&self, needle: &str) -> usize {
        let lines = self.lines.lock().expect("lines");
        lines.iter().filter(|l| l.contains(needle)).count()
    }

    async fn wait_for_line(&self, needle: &str, limit: Duration) {
        let start = Instant::now();
        while self.count(needle) == 0 {
            assert!(
                start.elapsed() < limit,
                "no line with {needle:?} within {limit:?}:\n{}",
                self.text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Sends `signal`, waits (at most 15 s) and returns the exit code.
    async fn stop_with(&mut self, signal: &str) -> Option<i32> {
        let pid = self.child.id().expect("pid").to_string();
        sh("kill", &[&format!("-{signal}"), &pid]);
        let status = tokio::time::timeout(Duration::from_secs(15), self.child.wait())
            .await
            .expect("no exit within 15 s of the signal")
            .expect("wait");
        // The last lines reach the reader.
        tokio::time::sleep(Duration::from_millis(200)).await;
        status.code()
    }
}

/// A broker that cannot be reached at start is retried with one line, and
/// one more when it is back: not one per attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_broker_is_one_line_per_change() {
    let env = TestEnv::new("failfast_heal").await;
    env.db().await.close().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let vars = with(
        &env,
        "AMQP_URL",
        format!("amqp://guest:guest@127.0.0.1:{port}/{}", env.vhost),
    );
    let mut run = Watched::start(&["run"], &vars);
    let down = format!("broker 127.0.0.1:{port} unreachable (connection refused); retrying");
    run.wait_for_line(&down, Duration::from_secs(15)).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        run.count(&down),
        1,
        "one line for the outage:\n{}",
        run.text()
    );
    assert_eq!(run.count("unreachable"), 1, "{}", run.text());

    // Now something answers on that port: the broker, through a forwarder.
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("bind the port again");
    let broker_addr = amqp_addr();
    let forwarder = tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let addr = broker_addr.clone();
            tokio::spawn(async move {
                if let Ok(mut server) = tokio::net::TcpStream::connect(addr).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
    let back = format!("broker 127.0.0.1:{port} reachable again");
    run.wait_for_line(&back, Duration::from_secs(30)).await;
    run.wait_for_line("consuming", Duration::from_secs(30))
        .await;
    assert_eq!(run.stop_with("TERM").await, Some(0), "{}", run.text());
    assert_eq!(run.count(&back), 1, "{}", run.text());
    assert_eq!(run.count("unreachable"), 1, "{}", run.text());
    forwarder.abort();
}

/// A healthy first start says nothing alarming; settings work after the
/// subcommand, a host name is an address, contradictions and a malformed
/// RUST_LOG are one warning each, no colour codes go into a pipe, and
/// SIGHUP stops `run` cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_start_is_quiet_and_sighup_stops_it_cleanly() {
    let env = TestEnv::new("failfast_start").await;
    let mut vars = env.process_env(2);
    // The flags after the subcommand win over the environment.
    vars.retain(|(k, _)| !matches!(*k, "SHARD_COUNT" | "METRICS_ADDR" | "RUST_LOG" | "AMQP_URL"));
    vars.push(("SHARD_COUNT", "7".to_owned()));
    vars.push(("RUST_LOG", "info,urutan=loud".to_owned()));
    vars.push(("TERM", "xterm-256color".to_owned()));
    let amqp = env.amqp_url().expose().to_owned();
    let args = [
        "run",
        "--shard-count",
        "3",
        "--metrics-addr",
        "localhost:0",
        "--prefetch",
        "4",
        "--batch-max",
        "16",
        "--amqp-url",
        &amqp,
    ];
    // The database was made by the test kit: `run` migrates it.
    let mut run = Watched::start(&args, &vars);
    run.wait_for_line("consuming", Duration::from_secs(60))
        .await;
    assert_eq!(run.stop_with("HUP").await, Some(0), "{}", run.text());
    let text = run.text();
    assert!(
        text.contains("shards=3"),
        "the flag after `run` was ignored:\n{text}"
    );
    assert!(
        text.contains("http=127.0.0.1:"),
        "localhost:0 was not resolved:\n{text}"
    );
    assert!(
        text.contains("SIGHUP") && text.contains("stopped cleanly"),
        "{text}"
    );
    let warned = |needle: &str| {
        text.lines()
            .filter(|l| l.contains(" WARN ") && l.contains(needle))
            .count()
    };
    assert_eq!(warned("BATCH_MAX=16 is above PREFETCH=4"), 1, "{text}");
    assert_eq!(warned("RUST_LOG is malformed"), 1, "{text}");
    assert!(!text.contains('\u{1b}'), "colour codes in a pipe:\n{text}");
    for alarm in ["broker restarted", "does not exist, skipping", "ERROR"] {
        assert!(!text.contains(alarm), "{alarm:?} on a first start:\n{text}");
    }

    // Every setting in each subcommand's help, with its variable and default.
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_urutan"))
        .args(["run", "--help"])
        .env_clear()
        .output()
        .expect("run --help");
    let help = String::from_utf8_lossy(&help.stdout);
    for wanted in [
        "--shard-count <SHARD_COUNT>",
        "[env: SHARD_COUNT=]",
        "[default: 4]",
        "--database-url",
        "[env: METRICS_ADDR=]",
    ] {
        assert!(
            help.contains(wanted),
            "`run --help` lacks {wanted:?}:\n{help}"
        );
    }
}
