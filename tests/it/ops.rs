//! Operating urutan (issue 17, parts 3-5), through the real `urutan` binary
//! where exit codes and output matter: `urutan status` as a check,
//! `urutan explain` version by version, a least-privilege worker falling
//! back to the passive check, a first start without ERROR lines, and the
//! demo's quiet screen.

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use crate::common::*;

/// `urutan <args>` to completion (bounded): exit code, stdout, stderr.
async fn urutan(args: &[&str], vars: &[(&str, String)]) -> (i32, String, String) {
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_urutan"))
        .args(args)
        .envs(vars.iter().map(|(k, v)| (*k, v.as_str())))
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(90), run)
        .await
        .unwrap_or_else(|_| panic!("urutan {args:?} did not finish within 90 s"))
        .expect("run urutan");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `urutan status --json` parsed, with its exit code.
async fn status_json(vars: &[(&str, String)]) -> (i32, Value) {
    let (code, stdout, stderr) = urutan(&["status", "--json"], vars).await;
    let json = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("status --json is not JSON ({e}):\n{stdout}\n{stderr}"));
    (code, json)
}

fn codes(status: &Value) -> Vec<String> {
    status["attention"]
        .as_array()
        .expect("attention")
        .iter()
        .map(|a| a["code"].as_str().expect("code").to_owned())
        .collect()
}

/// Log lines at `level` (text format).
fn lines_at<'a>(log: &'a str, level: &str) -> Vec<&'a str> {
    let level = format!(" {level} ");
    log.lines().filter(|l| l.contains(&level)).collect()
}

/// `urutan_dead_letter` exactly as /work/notes/dead-letter-schema.md fixes
/// it (created by migration 20261130000008 once merged): true if this test
/// created it.
async fn ensure_dead_letter_table(db: &sqlx::PgPool) -> bool {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('urutan_dead_letter') IS NOT NULL")
        .fetch_one(db)
        .await
        .expect("regclass");
    if !exists {
        sqlx::raw_sql(
            "CREATE TABLE urutan_dead_letter (
                 id BIGSERIAL PRIMARY KEY, delivery_key TEXT NOT NULL, message_id TEXT,
                 pesanan_id TEXT, versi BIGINT, shard INT NOT NULL, reason TEXT NOT NULL,
                 detail TEXT NOT NULL, last_error TEXT,
                 dead_lettered_at TIMESTAMPTZ NOT NULL DEFAULT now(),
                 resolved_at TIMESTAMPTZ, resolution TEXT);
             CREATE UNIQUE INDEX ON urutan_dead_letter (delivery_key) WHERE resolved_at IS NULL;",
        )
        .execute(db)
        .await
        .expect("create urutan_dead_letter");
    }
    !exists
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_is_a_check_healthy_stopped_dead_letters_unreachable() {
    let env = TestEnv::new("opsstatus").await;
    let vars = env.process_env(3);
    let pool = RunningPool::ready(env.settings(3)).await;
    env.publisher()
        .await
        .send_all(&[Msg::event("S", 1), Msg::event("S", 2)])
        .await;
    let db = env.db().await;
    wait_applied(&db, 2, Duration::from_secs(30)).await;

    // Healthy: exit 0, every shard with its consumer, the JSON's fields.
    let (code, status) = status_json(&vars).await;
    assert_eq!(code, 0, "a healthy pool:\n{status:#}");
    assert_eq!(codes(&status), Vec::<String>::new());
    assert_eq!(status["ring"]["shard_count"], 3);
    assert_eq!(status["ring"]["resharding"], false);
    let shards = status["shards"].as_array().expect("shards");
    assert_eq!(shards.len(), 3, "{status:#}");
    for (i, s) in shards.iter().enumerate() {
        assert_eq!(s["shard"], i);
        assert_eq!(s["queue"], format!("pesanan.shard-{i:03}"));
        assert_eq!(s["exists"], true);
        assert_eq!(s["consumers"], 1, "shard {i}: {s:#}");
        assert_eq!(s["epoch_passed"], status["epochs"]["latest"]);
        assert_eq!(s["parked"], 0);
    }
    assert!(
        shards.iter().any(|s| s["last_applied_at"].is_string()),
        "the shard that applied S has a last apply: {status:#}"
    );
    assert_eq!(status["dead_letters"]["depth"], 0);
    assert_eq!(status["outbox"]["unsent"], 0);
    assert!(status["outbox"]["relay"].is_null(), "no relay runs here");
    assert!(status["windows"].as_array().expect("windows").is_empty());
    assert_eq!(status["database"]["reachable"], true);
    assert_eq!(status["broker"]["reachable"], true);
    let (code, text, _) = urutan(&["status"], &vars).await;
    assert_eq!(code, 0, "{text}");
    for expected in [
        "healthy",
        "pesanan.shard-000",
        "pesanan.shard-002",
        "nothing needs attention",
    ] {
        assert!(text.contains(expected), "no `{expected}` in:\n{text}");
    }

    // A second replica: the two share the 3 shards (2 and 1), and status
    // shows each live replica with its shards and each shard's replica.
    let second = RunningPool::ready(env.settings(3)).await;
    let mut seen = Value::Null;
    let shared = |status: &Value| {
        let mut counts: Vec<u64> = status["replicas"]
            .as_array()
            .map(|r| r.iter().filter_map(|r| r["shard_count"].as_u64()).collect())
            .unwrap_or_default();
        counts.sort_unstable();
        let consumed = status["shards"].as_array().is_some_and(|s| {
            s.iter()
                .all(|s| s["consumers"] == 1 && s["replica"].is_string())
        });
        counts == [1, 2] && consumed
    };
    for _ in 0..100 {
        let (_, status) = status_json(&vars).await;
        seen = status;
        if shared(&seen) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(shared(&seen), "two replicas sharing 3 shards: {seen:#}");
    let names: Vec<&str> = seen["replicas"]
        .as_array()
        .expect("replicas")
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    for s in seen["shards"].as_array().expect("shards") {
        let replica = s["replica"].as_str().expect("a replica");
        assert!(names.contains(&replica), "{replica} is not live: {seen:#}");
    }
    let (_, text, _) = urutan(&["status"], &vars).await;
    assert!(text.contains("replicas     2 live"), "{text}");
    second.stop().await;

    // A poison message: the DLQ is not empty, which needs attention; the
    // records by reason once the dead-letter table exists.
    let mut poison = Msg::event("S", 3);
    poison.body = b"{not json".to_vec();
    env.publisher().await.send(&poison).await;
    let conn = env.broker().await;
    wait_for("dead-lettered", Duration::from_secs(30), || {
        let conn = &conn;
        async move { queue_len(conn, "pesanan.dlq").await == 1 }
    })
    .await;
    let created = ensure_dead_letter_table(&db).await;
    let (code, text, _) = urutan(&["status"], &vars).await;
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("urutan dlq list"), "{text}");
    if created {
        sqlx::query(
            "INSERT INTO urutan_dead_letter (delivery_key, message_id, pesanan_id, versi, shard,
                                             reason, detail)
             VALUES ('S-v3', 'S-v3', 'S', 3, 0, 'invalid_json', 'not JSON')",
        )
        .execute(&db)
        .await
        .expect("record");
    }
    let (code, status) = status_json(&vars).await;
    assert_eq!(code, 1);
    assert_eq!(codes(&status), ["dead_letters"], "{status:#}");
    assert_eq!(status["dead_letters"]["depth"], 1);
    assert_eq!(status["dead_letters"]["records_available"], true);
    if created {
        assert_eq!(
            status["dead_letters"]["by_reason"][0]["reason"],
            "invalid_json"
        );
        assert_eq!(status["dead_letters"]["by_reason"][0]["count"], 1);
    }
    drain_dlq(&conn).await;

    // A stopped pool: every shard without a consumer.
    pool.stop().await;
    let (code, status) = status_json(&vars).await;
    assert_eq!(code, 1, "{status:#}");
    let missing: Vec<String> = codes(&status);
    assert_eq!(missing, ["shard_without_consumer"; 3], "{status:#}");

    // A window and a parked message open longer than --stuck-after.
    sqlx::query("INSERT INTO urutan_jendela (sebab, epoch, dibuka_pada) VALUES ('a test', 1000000, now() - interval '1 hour')")
        .execute(&db)
        .await
        .expect("window");
    let (code, text, _) = urutan(&["status", "--stuck-after", "10m"], &vars).await;
    assert_eq!(code, 1);
    assert!(
        text.contains("window") && text.contains("[window_stuck]"),
        "{text}"
    );

    // Unreachable services: exit 3, named in one line.
    let mut no_broker = vars.clone();
    no_broker.push(("AMQP_URL", "amqp://guest:guest@127.0.0.1:1/%2f".into()));
    let (code, status) = status_json(&no_broker).await;
    assert_eq!(code, 3, "{status:#}");
    assert!(codes(&status).contains(&"broker_unreachable".to_owned()));
    assert!(
        status["ring"].is_object(),
        "the database part is still read"
    );
    let mut no_db = vars.clone();
    no_db.push(("DATABASE_URL", "postgres://postgres@127.0.0.1:1/x".into()));
    let (code, text, _) = urutan(&["status"], &no_db).await;
    assert_eq!(code, 3, "{text}");
    assert!(
        text.contains("cannot connect to the database postgres://postgres@127.0.0.1:1/x"),
        "{text}"
    );

    // Its reads are bounded by their own statement timeout.
    let reader = urutan_ops::open_database(&env.settings(3), "ops test")
        .await
        .expect("open");
    let timeout: String = sqlx::query_scalar("SHOW statement_timeout")
        .fetch_one(&reader)
        .await
        .expect("show");
    assert_eq!(timeout, "10s");
    reader.close().await;

    let (code, help, _) = urutan(&["status", "--help"], &[]).await;
    assert_eq!(code, 0);
    assert!(
        help.contains("Exit codes") && help.contains("Examples"),
        "{help}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_tells_what_became_of_each_version() {
    let env = TestEnv::new("opsexplain").await;
    let vars = env.process_env(2);
    let pool = RunningPool::ready(env.settings(2)).await;
    let db = env.db().await;
    let publisher = env.publisher().await;
    // v3 never sent: v4 is applied at once (same epoch), v3 is missing.
    publisher
        .send_all(&[Msg::event("E", 1), Msg::event("E", 2), Msg::event("E", 4)])
        .await;
    wait_applied(&db, 3, Duration::from_secs(30)).await;
    let (code, text, stderr) = urutan(&["explain", "E"], &vars).await;
    assert_eq!(code, 0, "{text}{stderr}");
    assert!(text.contains("order E: status dibuat at versi 4"), "{text}");
    let history: Vec<(i64, i32)> =
        sqlx::query_as("SELECT versi, shard FROM pesanan_riwayat WHERE pesanan_id = 'E'")
            .fetch_all(&db)
            .await
            .expect("history");
    let epoch: i64 = sqlx::query_scalar("SELECT epoch FROM pesanan WHERE id = 'E'")
        .fetch_one(&db)
        .await
        .expect("epoch");
    for (versi, shard) in history {
        let line = row(&text, versi);
        let fields: Vec<&str> = line.split_whitespace().collect();
        // The stored version's epoch is exact, earlier ones a bound.
        let shown = if versi == 4 {
            epoch.to_string()
        } else {
            format!("<={}", fields[3].trim_start_matches("<="))
        };
        assert_eq!(
            fields[..5],
            [
                versi.to_string().as_str(),
                "applied",
                &format!("{shard:03}"),
                &shown,
                &format!("E-v{versi}")
            ],
            "versi {versi}: {line}\n{text}"
        );
    }
    let v3 = row(&text, 3);
    assert!(
        v3.contains("missing") && v3.contains("never applied") && v3.contains("stale"),
        "{v3}"
    );

    // A window not behind the order yet: v6 (not the next version) parks,
    // v5 is missing and v6 waits for it.
    sqlx::query("INSERT INTO urutan_jendela (sebab, epoch) VALUES ('a test window', 1000000)")
        .execute(&db)
        .await
        .expect("window");
    publisher.send(&Msg::event("E", 6)).await;
    let parked = "SELECT count(*) FROM urutan_parkir";
    wait_count(&db, parked, 1, Duration::from_secs(30)).await;
    // A dead-lettered v7 (recorded as the dlq helper's worker records it)
    // and an unsent v8 in the outbox.
    ensure_dead_letter_table(&db).await;
    sqlx::raw_sql(
        "INSERT INTO urutan_dead_letter (delivery_key, message_id, pesanan_id, versi, shard,
                                         reason, detail)
         VALUES ('E-v7', 'E-v7', 'E', 7, 1, 'delivery_limit', 'failed 5 times');
         INSERT INTO outbox (agregat_tipe, agregat_id, routing_key, payload)
         VALUES ('pesanan', 'E', 'pesanan.x', '{\"id\": \"E\", \"status\": \"s\", \"versi\": 8}');",
    )
    .execute(&db)
    .await
    .expect("dead letter and outbox row");
    let (code, text, stderr) = urutan(&["explain", "E"], &vars).await;
    assert_eq!(code, 0, "{text}{stderr}");
    let v5 = row(&text, 5);
    assert!(
        v5.contains("missing") && v5.contains("parked versi 6 waits for it"),
        "{v5}\n{text}"
    );
    let v6 = row(&text, 6);
    assert!(
        v6.contains("parked")
            && v6.contains("E-v6")
            && v6.contains("waits for versi 5")
            && v6.contains("a window is open (a test window)"),
        "{v6}\n{text}"
    );
    let v7 = row(&text, 7);
    assert!(
        v7.contains("dead-lettered") && v7.contains("reason delivery_limit"),
        "{v7}"
    );
    assert!(row(&text, 8).contains("unsent"), "{text}");
    assert!(text.contains("queued: "), "{text}");

    // Unknown order, bad input, no database: one line, non-zero.
    let (code, out, stderr) = urutan(&["explain", "NOPE-1"], &vars).await;
    assert_eq!(code, 1, "{out}{stderr}");
    assert!(out.is_empty(), "{out}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("\"NOPE-1\" is unknown"), "{stderr}");
    let (code, _, stderr) = urutan(&["explain", ""], &vars).await;
    assert_eq!(code, 2, "{stderr}");
    let mut no_db = vars.clone();
    no_db.push(("DATABASE_URL", "postgres://postgres@127.0.0.1:1/x".into()));
    let (code, _, stderr) = urutan(&["explain", "E"], &no_db).await;
    assert_eq!(code, 3, "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    let (code, help, _) = urutan(&["explain", "--help"], &[]).await;
    assert_eq!(code, 0);
    assert!(
        help.contains("Exit codes") && help.contains("Examples"),
        "{help}"
    );
    pool.stop().await;
}

/// The first line of the explanation's table for `versi` (a line starting
/// with it, or a range that holds it).
fn row(text: &str, versi: i64) -> String {
    text.lines()
        .find(|l| {
            let first = l.split_whitespace().next().unwrap_or("");
            match first.split_once('-') {
                Some((a, b)) => {
                    a.parse::<i64>().is_ok_and(|a| a <= versi)
                        && b.parse::<i64>().is_ok_and(|b| versi <= b)
                }
                None => first.parse::<i64>() == Ok(versi),
            }
        })
        .unwrap_or_else(|| panic!("no line for versi {versi}:\n{text}"))
        .to_owned()
}

/// Runs `urutan run` with `vars` until it stops by itself (30 s at most),
/// asserts that it exited with code 2 (a refusal no retry can fix), and
/// returns its log.
async fn run_until_it_fails(vars: &[(&str, String)]) -> String {
    let mut run = UrutanProcess::start("run", vars);
    let code = run
        .wait_exit(Duration::from_secs(30))
        .await
        .code()
        .unwrap_or(-1);
    let log = run.log();
    assert_eq!(code, 2, "{log}");
    log
}

/// Part 5 (a) and (b): a worker whose user may not configure the topology
/// (the script's worker user, and the issue's user with configure `^$`)
/// falls back to the passive check and says so once; with nothing declared
/// it stops with one line naming the fix; `urutan topology` as that user
/// refuses with the fix. A first start logs no ERROR line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_declare_falls_back_to_the_check_and_says_so_once() {
    let env = TestEnv::new("opsrefused").await;
    let (bare_user, mute_user) = (format!("bare-{}", env.name), format!("mute-{}", env.name));
    let script_users = RabbitUsers::create(&env, false);
    let mut users = BrokerUsers::default();
    // The issue's user: configure nothing at all.
    let bare = ["^$", r"^amq\.default$", r"^pesanan\.shard-.*"];
    users.add(&env, &bare_user, "b4re-pw", bare);
    // A user that may not even put epoch markers into the shard queues.
    let mute = ["^$", "^$", r"^pesanan\.shard-.*"];
    users.add(&env, &mute_user, "mu7e-pw", mute);
    let as_user = |amqp_url: String| {
        let mut vars = env.process_env(3);
        vars.push(("AMQP_URL", amqp_url));
        vars
    };
    let worker = as_user(script_users.url("worker"));
    let fallback = "this broker user may not declare the topology: checking it passively";

    // Nothing declared: one WARN, then one error line naming the fix, exit 2.
    let log = run_until_it_fails(&worker).await;
    assert_eq!(lines_at(&log, "WARN").len(), 1, "{log}");
    assert!(lines_at(&log, "WARN")[0].contains(fallback), "{log}");
    assert_eq!(lines_at(&log, "ERROR"), Vec::<&str>::new(), "{log}");
    let errors: Vec<&str> = log.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(errors.len(), 1, "{log}");
    assert!(
        errors[0].contains("pesanan.shard-000") && errors[0].contains("urutan topology"),
        "{log}"
    );
    let (code, _, stderr) = urutan(&["topology"], &worker).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("may not declare the topology (ACCESS_REFUSED")
            && stderr.contains("run `urutan topology` as a user allowed to configure it"),
        "{stderr}"
    );

    // Declared by the topology user: both restricted workers get ready in
    // declare mode, warn once, and log no ERROR.
    let as_topology = as_user(script_users.url("topology"));
    let (code, _, stderr) = urutan(&["topology"], &as_topology).await;
    assert_eq!(code, 0, "{stderr}");
    let bare_url = amqp_url_as(&bare_user, "b4re-pw", &env.vhost);
    for (user, amqp_url) in [
        (script_users.name("worker"), script_users.url("worker")),
        (bare_user.as_str(), bare_url),
    ] {
        let mut run = UrutanProcess::start("run", &as_user(amqp_url));
        run.wait_ready().await;
        env.publisher().await.send(&Msg::event(user, 1)).await;
        let db = env.db().await;
        wait_for("applied", Duration::from_secs(30), || {
            let db = db.clone();
            async move {
                sqlx::query_scalar::<_, i64>("SELECT count(*) FROM pesanan WHERE id = $1")
                    .bind(user)
                    .fetch_one(&db)
                    .await
                    .expect("count")
                    == 1
            }
        })
        .await;
        let log = run.stop().await;
        let fallbacks = log.lines().filter(|l| l.contains(fallback)).count();
        assert_eq!(fallbacks, 1, "{user}: {log}");
        assert_eq!(lines_at(&log, "ERROR"), Vec::<&str>::new(), "{user}: {log}");
    }

    // No write on amq.default: the check passes, the epoch cannot be
    // opened; it stops (not retries) with the missing permission named.
    let as_mute = as_user(amqp_url_as(&mute_user, "mu7e-pw", &env.vhost));
    let log = run_until_it_fails(&as_mute).await;
    let last = log.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: ")
            && last.contains("may not put epoch markers")
            && last.contains("write permission on `amq.default`"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_start_logs_no_error_and_real_errors_still_show() {
    for rust_log in [None, Some("info")] {
        let env = TestEnv::new("opsfirst").await;
        let mut vars = env.process_env(4);
        vars.retain(|(k, _)| *k != "RUST_LOG");
        if let Some(level) = rust_log {
            vars.push(("RUST_LOG", level.to_owned()));
        }
        let mut run = UrutanProcess::start("run", &vars);
        run.wait_ready().await;
        let log = run.stop().await;
        assert!(log.contains("consuming"), "{log}");
        assert_eq!(
            lines_at(&log, "ERROR"),
            Vec::<&str>::new(),
            "RUST_LOG={rust_log:?}"
        );
        assert!(!log.contains("NOT_FOUND"), "{log}");

        // A real channel error (a queue declared with other arguments)
        // still shows lapin's ERROR and urutan's own.
        let mut other = vars.clone();
        other.push(("DELIVERY_LIMIT", "3".into()));
        let (code, _, stderr) = urutan(&["topology"], &other).await;
        assert_eq!(code, 2, "a setting the broker contradicts: {stderr}");
        let errors = lines_at(&stderr, "ERROR");
        assert!(
            errors
                .iter()
                .any(|l| l.contains("lapin::channel") && l.contains("PRECONDITION_FAILED")),
            "{stderr}"
        );
        assert!(
            stderr.lines().any(|l| l.starts_with("error: ")
                && l.contains("exists on the broker with other settings")),
            "{stderr}"
        );
    }
}

/// Part 5 (c): the demo's screen holds the report and no log line when all
/// is well; the log file holds the rest (the poison messages' warnings).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_keeps_its_screen_for_the_person() {
    let env = TestEnv::new("opsdemo").await;
    let log_file = tempfile::NamedTempFile::new().expect("log file");
    let log_path = log_file.path().to_string_lossy().into_owned();
    let mut vars = env.process_env(2);
    vars.retain(|(k, _)| *k != "RUST_LOG");
    let args = [
        "demo",
        "--orders",
        "60",
        "--duplicates",
        "5",
        "--stale",
        "5",
        "--poison",
        "2",
        "--timeout",
        "60s",
        "--log-file",
        &log_path,
    ];
    let (code, stdout, stderr) = urutan(&args, &vars).await;
    crate::scratch::drop_database(crate::common::PG_BASE, &format!("{}_demo", env.database));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stdout.contains("verification PASSED"), "{stdout}");
    assert!(stdout.contains(&format!("logs: {log_path}")), "{stdout}");
    assert_eq!(stderr.trim(), "", "nothing but the bar on standard error");
    let log = std::fs::read_to_string(&log_path).expect("read the log");
    assert!(log.contains("dead-lettering a message"), "{log}");
    assert!(!log.contains("slow statement"), "{log}");
    assert!(!log.contains('\u{1b}'), "no colour codes in the file");
    assert_eq!(lines_at(&log, "ERROR"), Vec::<&str>::new(), "{log}");
}

/// A version that arrived after a newer one was applied is told as `stale`
/// (with its message id and shard), in strict mode and in a set-based
/// batch; before, it was "missing … never applied", and one below every
/// applied version was not listed at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_shows_stale_arrivals() {
    for prefetch in [1, 16] {
        let env = TestEnv::new(&format!("opsstale{prefetch}")).await;
        let mut settings = env.settings(1);
        settings.prefetch = prefetch;
        let pool = RunningPool::ready(settings).await;
        let msgs = [
            Msg::event("S", 2),
            Msg::event("S", 1),
            Msg::event("S", 4),
            Msg::event("S", 3),
        ];
        env.publisher().await.send_all(&msgs).await;
        let db = env.db().await;
        wait_count(
            &db,
            "SELECT count(*) FROM pesan_diproses WHERE pesanan_id = 'S'",
            4,
            Duration::from_secs(30),
        )
        .await;
        pool.stop().await;
        let vars = env.process_env(1);
        let (code, text, stderr) = urutan(&["explain", "S"], &vars).await;
        assert_eq!(code, 0, "{text}{stderr}");
        for (versi, message_id) in [(1, "S-v1"), (3, "S-v3")] {
            let line = text
                .lines()
                .find(|l| l.contains(message_id))
                .unwrap_or_else(|| panic!("v{versi} not told (prefetch {prefetch}):\n{text}"));
            assert!(line.contains("stale"), "{line}\n{text}");
        }
        assert!(!text.contains("missing"), "prefetch {prefetch}:\n{text}");
    }
}
