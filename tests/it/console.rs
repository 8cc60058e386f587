//! `urutan console` (docs/contract.md section 12, issue 34): the pages read
//! what the CLI reads (an order's story, the shards, dead letters, holds,
//! effects); loopback only without `CONSOLE_TOKEN`; with it, every page
//! needs the token or the login form's cookie; strict security headers.

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::common::*;

/// One HTTP/1.1 exchange: (status, head, body). `Host` is `addr` unless
/// `headers` name another.
async fn exchange(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        let host = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("host"))
            .map_or_else(|| addr.to_string(), |(_, v)| (*v).to_owned());
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
        for (k, v) in headers
            .iter()
            .filter(|(k, _)| !k.eq_ignore_ascii_case("host"))
        {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
        stream.write_all(req.as_bytes()).await.ok()?;
        // To the end of the body: its Content-Length when given (a server
        // may keep the connection open, as chromedriver does), else EOF.
        let mut buf = Vec::new();
        let mut chunk = [0u8; 8192];
        loop {
            let n = stream.read(&mut chunk).await.ok()?;
            buf.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&buf);
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let length = head.lines().find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())?
                });
                if length.is_some_and(|len| body.len() >= len) {
                    break;
                }
            }
            if n == 0 {
                break;
            }
        }
        let text = String::from_utf8_lossy(&buf).into_owned();
        let (head, body) = text.split_once("\r\n\r\n")?;
        let status = head.split_whitespace().nth(1)?.parse().ok()?;
        Some((status, head.to_ascii_lowercase(), body.to_owned()))
    };
    tokio::time::timeout(Duration::from_secs(30), attempt)
        .await
        .ok()
        .flatten()
        .unwrap_or((0, String::new(), String::new()))
}

async fn get(addr: SocketAddr, path: &str) -> (u16, String, String) {
    exchange(addr, "GET", path, &[], "").await
}

/// A free port on loopback (bound, then let go).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// `urutan console` on `listen` with `extra` variables; killed on drop.
struct Console {
    child: tokio::process::Child,
    addr: SocketAddr,
    /// Its stdout and stderr.
    log: tempfile::NamedTempFile,
}

impl Console {
    async fn start(env: &TestEnv, extra: &[(&str, &str)]) -> Self {
        let port = free_port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
        let log = tempfile::NamedTempFile::new().expect("a log file");
        let out = log.reopen().expect("the log file");
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_urutan"));
        cmd.arg("console")
            .env_clear()
            .env("CONSOLE_LISTEN", addr.to_string())
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::from(out.try_clone().expect("the log file")))
            .stderr(Stdio::from(out))
            .kill_on_drop(true);
        for (k, v) in env.process_env(1) {
            cmd.env(k, v);
        }
        for (k, v) in extra {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("start urutan console");
        wait_for(
            "the console answers",
            Duration::from_secs(30),
            || async move { exchange(addr, "GET", "/console.css", &[], "").await.0 == 200 },
        )
        .await;
        Self { child, addr, log }
    }

    /// What it logged so far.
    fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }
}

impl Drop for Console {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_the_pool_and_an_orders_story() {
    let env = TestEnv::new("console").await;
    let pool = RunningPool::start(env.settings(2)).await;
    pool.wait_ready().await;
    env.publisher()
        .await
        .send_all(&[
            Msg::event_with("C-1", 1, "c1-first", "dibuat"),
            Msg::event_with("C-1", 2, "c1-second", "dibayar"),
        ])
        .await;
    let db = env.db().await;
    wait_applied(&db, 2, Duration::from_secs(30)).await;

    let console = Console::start(&env, &[]).await;
    let (status, head, body) = get(console.addr, "/").await;
    assert_eq!(status, 200, "{body}");
    for header in [
        "content-security-policy: default-src 'none'",
        "frame-ancestors 'none'",
        "x-frame-options: deny",
        "x-content-type-options: nosniff",
        "cache-control: no-store",
        "referrer-policy: same-origin",
    ] {
        assert!(head.contains(header), "{header} missing in:\n{head}");
    }
    assert!(
        !body.contains("<script"),
        "no script on any page (the CSP forbids it)"
    );
    for expected in [
        "Shards",
        "pesanan.shard-000",
        "pesanan.shard-001",
        "Dead letters",
    ] {
        assert!(body.contains(expected), "{expected} missing:\n{body}");
    }

    let (status, _, body) = get(console.addr, "/orders/C-1").await;
    assert_eq!(status, 200, "{body}");
    for expected in [
        "version <strong>2</strong>",
        "c1-first",
        "c1-second",
        "applied",
    ] {
        assert!(body.contains(expected), "{expected} missing:\n{body}");
    }
    let (status, head, _) = get(console.addr, "/orders?id=C-1").await;
    assert_eq!(status, 303, "the search goes to the order's page");
    assert!(head.contains("location: /orders/c-1"), "{head}");

    let (status, _, body) = get(console.addr, "/orders/never-seen").await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("Unknown order"), "{body}");

    for path in [
        "/dead-letters",
        "/dead-letters?reason=invalid_json&order=C-1",
        "/holds",
        "/effects",
    ] {
        let (status, _, body) = get(console.addr, path).await;
        assert_eq!(status, 200, "{path}: {body}");
    }
    let (status, _, body) = get(console.addr, "/dead-letters?since=yesterday").await;
    assert_eq!(
        status, 400,
        "a malformed filter is said, not ignored: {body}"
    );
    assert!(body.contains("RFC 3339"), "{body}");
    pool.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_loopback_the_console_needs_a_token() {
    let env = TestEnv::new("console_open").await;
    let ran = run_binary(
        std::path::Path::new(env!("CARGO_BIN_EXE_urutan")),
        &env,
        &[("CONSOLE_LISTEN", "0.0.0.0:0")],
        &["console"],
    )
    .await;
    ran.assert_refused_in_one_line("CONSOLE_TOKEN");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_token_every_page_needs_it() {
    let env = TestEnv::new("console_token").await;
    env.db().await.close().await;
    let console = Console::start(&env, &[("CONSOLE_TOKEN", "s3cret-token")]).await;
    let addr = console.addr;

    for path in ["/", "/orders/A", "/dead-letters", "/holds", "/effects"] {
        let (status, _, body) = get(addr, path).await;
        assert_eq!(status, 401, "{path} without the token");
        assert!(body.contains("Sign in"), "the login form: {body}");
    }
    let (status, _, _) = exchange(addr, "GET", "/", &[("Authorization", "Bearer wrong")], "").await;
    assert_eq!(status, 401);
    let (status, _, _) = exchange(
        addr,
        "GET",
        "/",
        &[("Authorization", "Bearer s3cret-token")],
        "",
    )
    .await;
    assert_eq!(status, 200, "the bearer token opens every page");

    let form = [("Content-Type", "application/x-www-form-urlencoded")];
    let (status, head, _) = exchange(addr, "POST", "/login", &form, "token=nope").await;
    assert_eq!(status, 401);
    assert!(!head.contains("urutan_console="), "no session: {head}");
    let (status, head, _) = exchange(addr, "POST", "/login", &form, "token=s3cret-token").await;
    assert_eq!(status, 303, "{head}");
    let cookie = head
        .lines()
        .filter_map(|l| l.strip_prefix("set-cookie: "))
        .find(|c| c.starts_with("urutan_console="))
        .expect("a session cookie")
        .to_owned();
    assert!(
        cookie.contains("httponly") && cookie.contains("samesite=strict"),
        "{cookie}"
    );
    assert!(
        !cookie.contains("s3cret-token"),
        "the cookie is not the token: {cookie}"
    );
    let session = cookie.split(';').next().expect("name=value").to_owned();
    let (status, _, body) = exchange(addr, "GET", "/holds", &[("Cookie", &session)], "").await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_proxy_the_console_needs_a_token_and_its_cookies_are_secure() {
    let env = TestEnv::new("console_proxy").await;
    env.db().await.close().await;

    // Without a token: what a proxy forwarded is refused, whatever the path.
    let open = Console::start(&env, &[]).await;
    let (status, _, _) = get(open.addr, "/").await;
    assert_eq!(status, 200, "straight on loopback");
    for forwarded in [
        ("X-Forwarded-For", "203.0.113.9"),
        ("Forwarded", "for=203.0.113.9;proto=https"),
    ] {
        for path in ["/", "/dead-letters", "/login"] {
            let (status, _, body) = exchange(open.addr, "GET", path, &[forwarded], "").await;
            assert_eq!(status, 403, "{path} with {forwarded:?}: {body}");
            assert!(body.contains("CONSOLE_TOKEN"), "names the fix: {body}");
        }
    }
    drop(open);

    // With a token: proxied pages are served to whoever has it, and over
    // HTTPS (the proxy says so) the cookies are Secure; not on plain HTTP.
    let console = Console::start(&env, &[("CONSOLE_TOKEN", "s3cret-token")]).await;
    let bearer = ("Authorization", "Bearer s3cret-token");
    let https = ("X-Forwarded-Proto", "https");
    let via = ("X-Forwarded-For", "203.0.113.9");
    let (status, head, body) = exchange(console.addr, "GET", "/", &[bearer, https, via], "").await;
    assert_eq!(status, 200, "{body}");
    assert!(
        head.contains("set-cookie: urutan_csrf=") && head.contains("; secure"),
        "a Secure CSRF cookie over HTTPS: {head}"
    );
    let (_, head, _) = exchange(console.addr, "GET", "/", &[bearer], "").await;
    assert!(
        !head.contains("; secure"),
        "not Secure on plain HTTP: {head}"
    );
    let form = ("Content-Type", "application/x-www-form-urlencoded");
    let (status, head, _) = exchange(
        console.addr,
        "POST",
        "/login",
        &[form, https, via],
        "token=s3cret-token",
    )
    .await;
    assert_eq!(status, 303, "{head}");
    let session = head
        .lines()
        .filter_map(|l| l.strip_prefix("set-cookie: "))
        .find(|c| c.starts_with("urutan_console="))
        .expect("a session cookie");
    assert!(session.contains("; secure"), "{session}");
}

/// The `urutan_csrf` cookie a page set: `name=value`.
fn csrf_cookie(head: &str) -> String {
    head.lines()
        .filter_map(|l| l.strip_prefix("set-cookie: "))
        .find(|c| c.starts_with("urutan_csrf="))
        .and_then(|c| c.split(';').next())
        .expect("a CSRF cookie")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releasing_held_orders_is_confirmed_first_and_audited() {
    let env = TestEnv::new("console_release").await;
    let mut settings = env.settings(1);
    settings.gap_policy = urutan::config::GapPolicy::Wait;
    settings.gap_timeout = Duration::from_secs(1);
    let pool = RunningPool::start(settings).await;
    pool.wait_ready().await;
    // H waits for a v2 that never comes: held (reason gap) after a second.
    env.publisher()
        .await
        .send_all(&[Msg::event("H", 1), Msg::event("H", 3)])
        .await;
    let db = env.db().await;
    wait_count(
        &db,
        "SELECT count(*) FROM urutan_tahan WHERE pesanan_id = 'H'",
        1,
        Duration::from_secs(30),
    )
    .await;

    let console = Console::start(&env, &[]).await;
    let addr = console.addr;
    let (status, head, body) = get(addr, "/holds").await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains(r#"name="order" value="H""#),
        "a checkbox per held order: {body}"
    );
    let cookie = csrf_cookie(&head);
    let token = cookie.trim_start_matches("urutan_csrf=").to_owned();
    let form = |extra: &str| format!("csrf={token}&order=H{extra}");
    let headers = [
        ("Content-Type", "application/x-www-form-urlencoded"),
        ("Cookie", cookie.as_str()),
    ];

    // Forged: no token, a wrong one, another site's page.
    let plain = [("Content-Type", "application/x-www-form-urlencoded")];
    let (status, _, _) = exchange(
        addr,
        "POST",
        "/holds/release",
        &plain,
        &form("&confirm=yes"),
    )
    .await;
    assert_eq!(status, 403, "without the CSRF cookie");
    let (status, _, _) = exchange(
        addr,
        "POST",
        "/holds/release",
        &headers,
        "csrf=00&order=H&confirm=yes",
    )
    .await;
    assert_eq!(status, 403, "with a wrong CSRF field");
    let foreign = [headers[0], headers[1], ("Origin", "https://evil.example")];
    let (status, _, _) = exchange(
        addr,
        "POST",
        "/holds/release",
        &foreign,
        &form("&confirm=yes"),
    )
    .await;
    assert_eq!(status, 403, "from another site's page");
    assert_eq!(
        count(&db, "SELECT count(*) FROM urutan_tahan").await,
        1,
        "nothing done"
    );

    // First the confirmation, which changes nothing.
    let (status, _, body) = exchange(addr, "POST", "/holds/release", &headers, &form("")).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("Release 1 order(s)") && body.contains("skipped"),
        "{body}"
    );
    assert_eq!(
        count(&db, "SELECT count(*) FROM urutan_tahan").await,
        1,
        "still held"
    );
    assert_eq!(count(&db, "SELECT count(*) FROM urutan_audit").await, 0);

    // Confirmed: released, audited, and H goes on past the missing v2.
    let (status, _, body) = exchange(
        addr,
        "POST",
        "/holds/release",
        &headers,
        &form("&confirm=yes"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("released"), "{body}");
    wait_stored(&db, "H", 3).await;
    let audit: Vec<(String, Option<String>, String, String)> =
        sqlx::query_as("SELECT tindakan, pesanan_id, oleh, hasil FROM urutan_audit")
            .fetch_all(&db)
            .await
            .expect("audit");
    assert_eq!(audit.len(), 1, "{audit:?}");
    assert_eq!(audit[0].0, "hold_release");
    assert_eq!(audit[0].1.as_deref(), Some("H"));
    assert!(
        audit[0]
            .2
            .starts_with("console (loopback, no token) 127.0.0.1:"),
        "who, and how it got in: {audit:?}"
    );
    assert!(audit[0].3.starts_with("released"), "result: {audit:?}");

    let (_, _, page) = get(addr, "/orders/H").await;
    assert!(
        page.contains("Operator actions") && page.contains("hold_release"),
        "{page}"
    );
    let (_, _, page) = get(addr, "/audit").await;
    assert!(page.contains("hold_release"), "{page}");
    let explained = run_binary(
        std::path::Path::new(env!("CARGO_BIN_EXE_urutan")),
        &env,
        &[],
        &["explain", "H"],
    )
    .await;
    assert!(
        explained.stdout.contains("operator:") && explained.stdout.contains("hold_release"),
        "urutan explain shows the action:\n{}",
        explained.stdout
    );
    pool.stop().await;
}

/// Messages in the DLQ now.
async fn dlq_depth(env: &TestEnv) -> u32 {
    let conn = env.broker().await;
    let depth = queue_len(&conn, "pesanan.dlq").await;
    let _ = conn.close(200, "done".into()).await;
    depth
}

/// Waits until the DLQ holds `n` messages (a settled message leaves a
/// quorum queue's count a moment after its ack).
async fn wait_depth(env: &TestEnv, n: u32) {
    wait_for(
        &format!("{n} message(s) in the DLQ"),
        Duration::from_secs(30),
        move || async move { dlq_depth(env).await == n },
    )
    .await;
}

/// The id of the dead-letter record of message `message_id`.
async fn record_id(db: &sqlx::PgPool, message_id: &str) -> i64 {
    sqlx::query_scalar("SELECT id FROM urutan_dead_letter WHERE message_id = $1")
        .bind(message_id)
        .fetch_one(db)
        .await
        .unwrap_or_else(|e| panic!("the record of {message_id}: {e}"))
}

/// (message id, resolution) of every dead-letter record, by message id.
async fn resolutions(db: &sqlx::PgPool) -> Vec<(String, Option<String>)> {
    sqlx::query_as("SELECT message_id, resolution FROM urutan_dead_letter ORDER BY message_id, id")
        .fetch_all(db)
        .await
        .expect("records")
}

/// The audit as (action, order, result), oldest first.
async fn audited(db: &sqlx::PgPool) -> Vec<(String, Option<String>, String)> {
    sqlx::query_as("SELECT tindakan, pesanan_id, hasil FROM urutan_audit ORDER BY seq")
        .fetch_all(db)
        .await
        .expect("audit")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaying_a_dead_letter_shows_the_prediction_then_applies_it() {
    let env = TestEnv::new("console_replay").await;
    let mut settings = env.settings(1);
    settings.delivery_limit = 1;
    settings.on_refused = urutan::config::OnRefused::Skip;
    let broken = Arc::new(AtomicBool::new(true));
    let pool = RunningPool::ready_with(settings, crate::dlq::poison_while(broken.clone())).await;
    env.publisher()
        .await
        .send(&Msg::event_with("R", 1, "R-v1", "racun"))
        .await;
    let db = env.db().await;
    wait_count(
        &db,
        "SELECT count(*) FROM urutan_dead_letter",
        1,
        Duration::from_secs(30),
    )
    .await;
    wait_depth(&env, 1).await;
    let id = record_id(&db, "R-v1").await;

    let console = Console::start(&env, &[]).await;
    let addr = console.addr;
    let (status, head, body) = get(addr, "/dead-letters").await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains(&format!(r#"name="id" value="{id}""#)),
        "a checkbox per dead letter: {body}"
    );
    assert!(body.contains("Replay selected") && body.contains("Purge selected"));
    let (status, _, page) = get(addr, &format!("/dead-letters/{id}")).await;
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains("Replay this message") && page.contains("Purge this message"),
        "{page}"
    );
    let cookie = csrf_cookie(&head);
    let token = cookie.trim_start_matches("urutan_csrf=").to_owned();
    let headers = [
        ("Content-Type", "application/x-www-form-urlencoded"),
        ("Cookie", cookie.as_str()),
    ];

    // First what a replay would do; nothing changes.
    let form = format!("csrf={token}&id={id}");
    let (status, _, body) = exchange(addr, "POST", "/dead-letters/replay", &headers, &form).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("would be applied (a new order); it is valid, the handler failed on it"),
        "the dry run's prediction: {body}"
    );
    assert!(body.contains("Replay 1 message(s)"), "{body}");
    assert_eq!(dlq_depth(&env).await, 1, "still dead-lettered");
    assert_eq!(count(&db, "SELECT count(*) FROM pesanan").await, 0);
    assert_eq!(count(&db, "SELECT count(*) FROM urutan_audit").await, 0);

    // The cause is fixed; confirmed: applied, out of the DLQ, audited.
    broken.store(false, Ordering::SeqCst);
    let (status, _, body) = exchange(
        addr,
        "POST",
        "/dead-letters/replay",
        &headers,
        &format!("{form}&confirm=yes"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("applied (v1 is now the stored state)"),
        "{body}"
    );
    let state: (String, i64) = sqlx::query_as("SELECT status, versi FROM pesanan WHERE id = 'R'")
        .fetch_one(&db)
        .await
        .expect("R is stored");
    assert_eq!(state, ("racun".to_owned(), 1));
    wait_depth(&env, 0).await; // gone from the DLQ
    assert_eq!(
        resolutions(&db).await,
        [("R-v1".to_owned(), Some("replayed".to_owned()))]
    );
    let audit = audited(&db).await;
    assert_eq!(audit.len(), 1, "{audit:?}");
    assert_eq!(audit[0].0, "dlq_replay");
    assert_eq!(audit[0].1.as_deref(), Some("R"));
    assert!(audit[0].2.starts_with("applied"), "{audit:?}");

    // Again: nothing is left to replay, and that is said (and audited).
    let (status, _, body) = exchange(
        addr,
        "POST",
        "/dead-letters/replay",
        &headers,
        &format!("{form}&confirm=yes"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("nothing done: already replayed"), "{body}");

    let (_, _, page) = get(addr, "/audit").await;
    assert!(
        page.contains("dlq_replay") && page.contains("R-v1"),
        "{page}"
    );
    let explained = urutan(&env, &[], &["explain", "R"]).await;
    assert!(
        explained.stdout.contains("operator:") && explained.stdout.contains("dlq_replay"),
        "urutan explain shows the action:\n{}",
        explained.stdout
    );
    pool.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purging_selected_dead_letters_removes_only_those_and_forgeries_change_nothing() {
    let env = TestEnv::new("console_purge").await;
    let pool = RunningPool::ready(env.settings(1)).await;
    env.publisher()
        .await
        .send_all(&[
            crate::dlq::not_json("bad-1", "P-1"),
            crate::dlq::not_json("bad-2", "P-2"),
            crate::dlq::not_json("bad-3", "P-3"),
        ])
        .await;
    let db = env.db().await;
    wait_count(
        &db,
        "SELECT count(*) FROM urutan_dead_letter",
        3,
        Duration::from_secs(30),
    )
    .await;
    wait_depth(&env, 3).await;
    pool.stop().await;
    let (one, two) = (record_id(&db, "bad-1").await, record_id(&db, "bad-2").await);

    let console = Console::start(&env, &[("CONSOLE_TOKEN", "purge-token")]).await;
    let addr = console.addr;
    let bearer = ("Authorization", "Bearer purge-token");
    let (status, head, _) = exchange(addr, "GET", "/dead-letters", &[bearer], "").await;
    assert_eq!(status, 200);
    let cookie = csrf_cookie(&head);
    let token = cookie.trim_start_matches("urutan_csrf=").to_owned();
    let content = ("Content-Type", "application/x-www-form-urlencoded");
    let headers = [content, ("Cookie", cookie.as_str()), bearer];
    let form = format!("csrf={token}&id={one}&id={two}");
    let confirmed = format!("{form}&confirm=yes");

    // Refused, each with nothing done: without the console's token, without
    // the CSRF cookie, with a wrong CSRF field, from another site's page.
    let (status, _, _) = exchange(
        addr,
        "POST",
        "/dead-letters/purge",
        &[content, ("Cookie", cookie.as_str())],
        &confirmed,
    )
    .await;
    assert_eq!(status, 401, "without CONSOLE_TOKEN");
    let (status, _, _) = exchange(
        addr,
        "POST",
        "/dead-letters/purge",
        &[content, bearer],
        &confirmed,
    )
    .await;
    assert_eq!(status, 403, "without the CSRF cookie");
    let wrong = format!("csrf=00&id={one}&id={two}&confirm=yes");
    let (status, _, _) = exchange(addr, "POST", "/dead-letters/purge", &headers, &wrong).await;
    assert_eq!(status, 403, "with a wrong CSRF field");
    let foreign = [
        headers[0],
        headers[1],
        headers[2],
        ("Origin", "https://evil.example"),
    ];
    for action in ["/dead-letters/purge", "/dead-letters/replay"] {
        let (status, _, _) = exchange(addr, "POST", action, &foreign, &confirmed).await;
        assert_eq!(status, 403, "{action} from another site's page");
    }
    assert_eq!(dlq_depth(&env).await, 3, "nothing purged");
    assert!(
        resolutions(&db).await.iter().all(|(_, r)| r.is_none()),
        "every record unresolved"
    );
    assert_eq!(count(&db, "SELECT count(*) FROM urutan_audit").await, 0);

    // The confirmation: what a replay would do instead; nothing changes.
    let (status, _, body) = exchange(addr, "POST", "/dead-letters/purge", &headers, &form).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("would be dead-lettered again: invalid_json")
            && body.contains("Purge 2 message(s)")
            && body.contains("bad-1")
            && body.contains("bad-2")
            && !body.contains("bad-3"),
        "{body}"
    );
    assert_eq!(dlq_depth(&env).await, 3, "nothing purged yet");

    // Confirmed: exactly those two gone, their records purged; the third kept.
    let (status, _, body) =
        exchange(addr, "POST", "/dead-letters/purge", &headers, &confirmed).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body.matches("purged: removed from the DLQ").count(),
        2,
        "{body}"
    );
    wait_depth(&env, 1).await; // the third is kept
    assert_eq!(
        resolutions(&db).await,
        [
            ("bad-1".to_owned(), Some("purged".to_owned())),
            ("bad-2".to_owned(), Some("purged".to_owned())),
            ("bad-3".to_owned(), None),
        ]
    );
    let audit = audited(&db).await;
    let orders: Vec<(&str, Option<&str>)> = audit
        .iter()
        .map(|(action, order, _)| (action.as_str(), order.as_deref()))
        .collect();
    assert_eq!(
        orders,
        [("dlq_purge", Some("P-1")), ("dlq_purge", Some("P-2"))]
    );
    assert!(audit.iter().all(|a| a.2.starts_with("purged")), "{audit:?}");
    let who: String = sqlx::query_scalar("SELECT oleh FROM urutan_audit LIMIT 1")
        .fetch_one(&db)
        .await
        .expect("who");
    assert!(
        who.starts_with("console (token, bearer) 127.0.0.1:"),
        "{who}"
    );
    // The kept one is still there to list, with its message.
    let listed = urutan(&env, &[], &["dlq", "list", "--json"]).await;
    assert!(listed.ok() && listed.stdout.contains("bad-3"), "{listed}");
}

/// chromedriver in a process group of its own, with the browsers it starts:
/// the whole group is killed when the test ends, passed or failed (a
/// panicking test never reaches the session's DELETE).
struct Driver(tokio::process::Child);

impl Drop for Driver {
    fn drop(&mut self) {
        if let Some(pid) = self.0.id() {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{pid}")])
                .status();
        }
    }
}

/// A WebDriver command to chromedriver at `driver`: the response's `value`.
async fn webdriver(
    driver: SocketAddr,
    method: &str,
    path: &str,
    body: serde_json::Value,
) -> serde_json::Value {
    let text = if method == "GET" {
        String::new()
    } else {
        body.to_string()
    };
    let (status, _, answer) = exchange(
        driver,
        method,
        path,
        &[("Content-Type", "application/json")],
        &text,
    )
    .await;
    let answer: serde_json::Value = serde_json::from_str(&answer)
        .unwrap_or_else(|e| panic!("{method} {path}: {status}, not JSON ({e}): {answer}"));
    assert_eq!(status, 200, "{method} {path}: {answer}");
    answer["value"].clone()
}

/// One WebDriver session (one browser window) of chromedriver at `driver`.
struct Browser {
    driver: SocketAddr,
    session: String,
    /// Where every page's screenshot is left to look at.
    shots: std::path::PathBuf,
    /// Where the documentation's screenshots are written.
    docs: std::path::PathBuf,
}

/// The pages whose screenshots docs/operations.md shows (docs/console/).
const DOCUMENTED: [&str; 7] = [
    "overview",
    "order",
    "dead-letters",
    "dead-letter",
    "holds",
    "effects",
    "audit",
];

impl Browser {
    async fn command(
        &self,
        method: &str,
        path: &str,
        body: serde_json::Value,
    ) -> serde_json::Value {
        let path = format!("/session/{}{path}", self.session);
        webdriver(self.driver, method, &path, body).await
    }

    async fn open(&self, url: &str) {
        self.command("POST", "/url", serde_json::json!({"url": url}))
            .await;
    }

    async fn run(&self, script: &str) -> serde_json::Value {
        self.command(
            "POST",
            "/execute/sync",
            serde_json::json!({"script": script, "args": []}),
        )
        .await
    }

    /// Clicks the element `css` selects (a checkbox, a submit button).
    async fn click(&self, css: &str) {
        let found = self
            .command(
                "POST",
                "/element",
                serde_json::json!({"using": "css selector", "value": css}),
            )
            .await;
        // The W3C web element identifier.
        let element = found["element-6066-11e4-a52e-4f735466cecf"]
            .as_str()
            .unwrap_or_else(|| panic!("no element `{css}`: {found}"))
            .to_owned();
        self.command(
            "POST",
            &format!("/element/{element}/click"),
            serde_json::json!({}),
        )
        .await;
    }

    /// Waits until the page shows `expected` (a form's answer can take
    /// the time of a replay); what it shows instead, if it never does.
    async fn wait_text(&self, expected: &str) {
        let path = format!("/session/{}/execute/sync", self.session);
        let script =
            serde_json::json!({"script": "return document.body.innerText", "args": []}).to_string();
        let json = [("Content-Type", "application/json")];
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let mut shown = String::new();
        while tokio::time::Instant::now() < deadline {
            let (_, _, answer) = exchange(self.driver, "POST", &path, &json, &script).await;
            if let Some(text) = serde_json::from_str::<serde_json::Value>(&answer)
                .ok()
                .and_then(|a| a["value"].as_str().map(str::to_owned))
            {
                if text.contains(expected) {
                    return;
                }
                shown = text;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("the page did not show `{expected}` within 60 s; it shows:\n{shown}");
    }

    /// The page open now: an urutan console page with its stylesheet,
    /// showing `expected`, without an error in the browser's console; its
    /// screenshot saved as `name`.png.
    async fn check(&self, name: &str, expected: &str) {
        let title = self.command("GET", "/title", serde_json::Value::Null).await;
        assert!(
            title
                .as_str()
                .is_some_and(|t| t.ends_with("urutan console")),
            "{name}: title {title}"
        );
        let text = self.run("return document.body.innerText").await;
        assert!(
            text.as_str().is_some_and(|t| t.contains(expected)),
            "{name}: `{expected}` not shown:\n{text}"
        );
        let styled = self
            .run("return getComputedStyle(document.querySelector('header')).backgroundColor")
            .await;
        assert_eq!(styled, "rgb(31, 58, 95)", "{name}: the stylesheet applies");
        let log = self
            .command("POST", "/se/log", serde_json::json!({"type": "browser"}))
            .await;
        let errors: Vec<&serde_json::Value> = log
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["level"] == "SEVERE")
            .collect();
        assert!(
            errors.is_empty(),
            "{name}: the browser's console: {errors:?}"
        );
        let png = self
            .command("GET", "/screenshot", serde_json::Value::Null)
            .await;
        use base64::Engine as _;
        let png = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().expect("base64"))
            .expect("a PNG");
        std::fs::write(self.shots.join(format!("{name}.png")), &png).expect("write the screenshot");
        if DOCUMENTED.contains(&name) {
            std::fs::write(self.docs.join(format!("{name}.png")), &png)
                .expect("write the documentation's screenshot");
        }
    }
}

/// chromedriver (killed with its browsers when the [`Driver`] drops) and
/// one session of Debian's headless chromium, with `extra` arguments; the
/// profile directory lives as long as the returned `TempDir`.
async fn start_browser(extra: &[&str]) -> (Driver, Browser, tempfile::TempDir) {
    let chromium = std::path::Path::new("/usr/bin/chromium");
    let chromedriver = std::path::Path::new("/usr/bin/chromedriver");
    assert!(
        chromium.exists() && chromedriver.exists(),
        "Debian's chromium and chromium-driver are needed (deploy/local/test.sh installs them)"
    );
    let port = free_port();
    let driver: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let chromedriver = Driver(
        tokio::process::Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start chromedriver"),
    );
    wait_for(
        "chromedriver ready",
        Duration::from_secs(30),
        || async move { exchange(driver, "GET", "/status", &[], "").await.0 == 200 },
    )
    .await;
    let profile = tempfile::tempdir().expect("a browser profile");
    let mut args: Vec<String> = [
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1280,800",
        "--hide-scrollbars",
    ]
    .into_iter()
    .chain(extra.iter().copied())
    .map(str::to_owned)
    .collect();
    args.push(format!("--user-data-dir={}", profile.path().display()));
    let session = webdriver(
        driver,
        "POST",
        "/session",
        serde_json::json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:loggingPrefs": {"browser": "ALL"},
            "goog:chromeOptions": {"binary": "/usr/bin/chromium", "args": args}
        }}}),
    )
    .await;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let browser = Browser {
        driver,
        session: session["sessionId"]
            .as_str()
            .expect("a session id")
            .to_owned(),
        shots: root.join("target/console-screenshots"),
        docs: root.join("docs/console"),
    };
    (chromedriver, browser, profile)
}

/// Every page in a real browser (Debian's chromium, headless, through
/// chromedriver): it renders with its stylesheet, under the
/// Content-Security-Policy, without one error in the browser's console (a
/// policy violation is one). A dead letter is replayed, two of three
/// purged, and a held order released, by clicking through the forms
/// (checkboxes, buttons, the confirmation) as an operator would;
/// PostgreSQL and the DLQ show it.
/// A screenshot of each page is left in `target/console-screenshots/`,
/// and those docs/operations.md shows are written to `docs/console/`
/// (a 1280×800 window).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_renders_in_a_real_browser() {
    let env = TestEnv::new("console_browser").await;
    let mut settings = env.settings(2);
    settings.gap_policy = urutan::config::GapPolicy::Wait;
    settings.gap_timeout = Duration::from_secs(1);
    settings.delivery_limit = 1;
    settings.on_refused = urutan::config::OnRefused::Skip;
    let broken = Arc::new(AtomicBool::new(true));
    let pool = RunningPool::ready_with(settings, crate::dlq::poison_while(broken.clone())).await;
    env.publisher()
        .await
        .send_all(&[
            Msg::event("B-1", 1),
            Msg::event("B-1", 2),
            Msg::event("B-2", 1),
            Msg::event("B-2", 3),
            // Refused while the handler is broken: replayed once it is not.
            Msg::event_with("B-4", 1, "B-4-v1", "racun"),
            crate::dlq::not_json("B-5-poison", "B-5"),
            crate::dlq::not_json("B-6-poison", "B-6"),
        ])
        .await;
    // A poison message (not JSON): a dead letter whose page shows it.
    let mut poison = Msg::event_with("B-3", 1, "B-3-poison", "dibuat");
    poison.body = b"{not json <b>bold</b>".to_vec();
    env.publisher().await.send(&poison).await;
    let db = env.db().await;
    wait_count(
        &db,
        "SELECT count(*) FROM urutan_tahan",
        1,
        Duration::from_secs(30),
    )
    .await;
    wait_count(
        &db,
        "SELECT count(*) FROM urutan_dead_letter",
        4,
        Duration::from_secs(30),
    )
    .await;
    wait_depth(&env, 4).await;
    broken.store(false, Ordering::SeqCst);
    let poisoned = record_id(&db, "B-3-poison").await;
    let refused = record_id(&db, "B-4-v1").await;
    let (five, six) = (
        record_id(&db, "B-5-poison").await,
        record_id(&db, "B-6-poison").await,
    );
    let console = Console::start(&env, &[]).await;

    let (_chromedriver, browser, _profile) = start_browser(&[]).await;
    let driver = browser.driver;
    std::fs::create_dir_all(&browser.shots).expect("screenshot directory");
    std::fs::create_dir_all(&browser.docs).expect("docs/console");
    let url = |path: &str| format!("http://{}{path}", console.addr);

    let pages = [
        ("overview", "/".to_owned(), "Shards"),
        ("order", "/orders/B-1".to_owned(), "Timeline"),
        ("held-order", "/orders/B-2".to_owned(), "Release this hold"),
        ("dead-letters", "/dead-letters".to_owned(), "B-3-poison"),
        (
            "dead-letter",
            format!("/dead-letters/{poisoned}"),
            "{not json <b>bold</b>",
        ),
        ("holds", "/holds".to_owned(), "Release the selected orders"),
        ("effects", "/effects".to_owned(), "pending"),
    ];
    for (name, path, expected) in &pages {
        browser.open(&url(path)).await;
        browser.check(name, expected).await;
    }

    // A replay from the message's page: the prediction, then the outcome.
    browser
        .open(&url(&format!("/dead-letters/{refused}")))
        .await;
    browser
        .click("button[formaction='/dead-letters/replay']")
        .await;
    browser.wait_text("Replay 1 message(s)").await;
    browser
        .check("confirm-replay", "would be applied (a new order)")
        .await;
    browser.click("main form button[type=submit]").await;
    browser
        .wait_text("applied (v1 is now the stored state)")
        .await;
    browser.check("replayed", "Replayed").await;
    let state: (String, i64) = sqlx::query_as("SELECT status, versi FROM pesanan WHERE id = 'B-4'")
        .fetch_one(&db)
        .await
        .expect("B-4 is stored");
    assert_eq!(state, ("racun".to_owned(), 1));
    wait_depth(&env, 3).await; // B-4's message left the DLQ

    // Two of the three left purged: ticked on the list, confirmed.
    browser.open(&url("/dead-letters")).await;
    for id in [five, six] {
        browser
            .click(&format!("input[name='id'][value='{id}']"))
            .await;
    }
    browser
        .click("button[formaction='/dead-letters/purge']")
        .await;
    browser.wait_text("Purge 2 message(s)").await;
    browser
        .check(
            "confirm-purge",
            "would be dead-lettered again: invalid_json",
        )
        .await;
    browser.click("main form button[type=submit]").await;
    browser.wait_text("purged: removed from the DLQ").await;
    browser.check("purged", "Purged").await;
    wait_depth(&env, 1).await; // only B-3's message is left
    let left: Vec<(String, Option<String>)> = resolutions(&db).await;
    assert_eq!(
        left,
        [
            ("B-3-poison".to_owned(), None),
            ("B-4-v1".to_owned(), Some("replayed".to_owned())),
            ("B-5-poison".to_owned(), Some("purged".to_owned())),
            ("B-6-poison".to_owned(), Some("purged".to_owned())),
        ]
    );

    // B-2's hold (v2 missing) released: ticked on the list, confirmed; v3
    // then goes on, and v2 is recorded as skipped.
    browser.open(&url("/holds")).await;
    browser.click("input[name='order'][value='B-2']").await;
    browser.click("main form button[type=submit]").await;
    browser.wait_text("Release 1 order(s)").await;
    browser.check("confirm-release", "B-2").await;
    browser.click("main form button[type=submit]").await;
    browser.wait_text("version(s) go on in order").await;
    browser.check("released", "Released").await;
    wait_count(
        &db,
        "SELECT count(*) FROM pesanan WHERE id = 'B-2' AND versi = 3",
        1,
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(count(&db, "SELECT count(*) FROM urutan_tahan").await, 0);
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM urutan_lewati WHERE pesanan_id = 'B-2'"
        )
        .await,
        1,
        "the missing v2, recorded as skipped"
    );

    browser.open(&url("/audit")).await;
    browser.check("audit", "hold_release").await;
    assert_eq!(
        count(&db, "SELECT count(*) FROM urutan_audit").await,
        4,
        "one row per message or order acted on"
    );
    let _ = exchange(
        driver,
        "DELETE",
        &format!("/session/{}", browser.session),
        &[],
        "",
    )
    .await;
    pool.stop().await;
}

/// The console's own broker connections on `vhost` (their pids).
async fn console_connections(vhost: &str) -> Vec<String> {
    let args = [
        "-q",
        "-s",
        "list_connections",
        "pid",
        "vhost",
        "client_properties",
    ];
    let listed = ctl(args.iter().map(|s| (*s).to_owned()).collect()).await;
    listed
        .lines()
        .filter_map(|line| {
            let mut cells = line.splitn(3, '\t');
            let (pid, on, props) = (cells.next()?, cells.next()?, cells.next()?);
            (on == vhost && props.contains("urutan console")).then(|| pid.to_owned())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_keeps_one_broker_connection_and_opens_another_once_it_is_closed() {
    let env = TestEnv::new("console_broker").await;
    let pool = RunningPool::start(env.settings(2)).await;
    pool.wait_ready().await;
    let console = Console::start(&env, &[]).await;
    let reachable = |body: &str| body.contains("reachable") && !body.contains("unreachable");

    // Pages read through one connection, kept open between them.
    for path in ["/", "/", "/"] {
        let (status, _, body) = get(console.addr, path).await;
        assert_eq!(status, 200, "{body}");
        assert!(reachable(&body), "the broker should be reachable: {body}");
    }
    let first = console_connections(&env.vhost).await;
    assert_eq!(first.len(), 1, "one console connection: {first:?}");

    // Closed by the broker (an operator, a node restart): the next pages
    // open a new one and read through it.
    ctl(vec![
        "-q".into(),
        "close_connection".into(),
        first[0].clone(),
        "test: the console's connection".into(),
    ])
    .await;
    wait_for(
        "the console reads the broker again",
        Duration::from_secs(20),
        || async {
            let (status, _, body) = get(console.addr, "/").await;
            status == 200 && reachable(&body)
        },
    )
    .await;
    let second = console_connections(&env.vhost).await;
    assert_eq!(second.len(), 1, "one console connection again: {second:?}");
    assert_ne!(second, first, "a new connection");
    pool.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_effects_page_shows_each_endpoint_redacted_with_what_is_not_sent() {
    let env = TestEnv::new("console_effects").await;
    let db = env.db().await;
    // As the dispatcher records them: two endpoints (one with a token in
    // its path), a sent effect, two pending (one failing), one dead-lettered.
    sqlx::raw_sql(
        "INSERT INTO urutan_efek_tujuan (tujuan, url) VALUES
             (1, 'https://pay.internal:8443/capture/secret-token'),
             (2, 'https://ship.internal/notify');
         INSERT INTO urutan_efek (pesanan_id, versi, tujuan, message_id, isi, keadaan, percobaan,
                                  selesai_pada, kode, jawaban) VALUES
             ('E-1', 1, 1, 'E-1-v1', '{}', 'terkirim', 1, now(), 200, NULL),
             ('E-2', 1, 1, 'E-2-v1', '{}', 'menunggu', 0, NULL, NULL, NULL),
             ('E-3', 1, 1, 'E-3-v1', '{}', 'menunggu', 2, NULL, 503, 'HTTP 503: <b>down</b>'),
             ('E-4', 1, 2, 'E-4-v1', '{}', 'gagal', 10, now(), 400, 'HTTP 400: bad request');",
    )
    .execute(&db)
    .await
    .expect("record effects");
    let console = Console::start(&env, &[]).await;
    let (status, _, body) = get(console.addr, "/effects").await;
    assert_eq!(status, 200, "{body}");
    assert!(
        !body.contains("secret-token"),
        "a URL's path is redacted: {body}"
    );
    assert!(
        body.contains("https://pay.internal:8443/capture/…"),
        "{body}"
    );
    assert!(body.contains("https://ship.internal/notify"), "{body}");
    assert!(
        !body.contains("<b>down</b>") && body.contains("&lt;b&gt;down&lt;/b&gt;"),
        "an endpoint's answer is text: {body}"
    );
    // One row per endpoint: pay has 2 pending, 1 failing, 0 dead-lettered.
    let row = |endpoint: &str| -> Vec<String> {
        let start = body.find(endpoint).expect("the endpoint's row");
        let row = &body[start..start + body[start..].find("</tr>").expect("row end")];
        row.split("<td")
            .skip(1)
            .map(|cell| {
                let text = &cell[cell.find('>').expect("cell") + 1..];
                text[..text.find("</td>").unwrap_or(text.len())].to_owned()
            })
            .collect()
    };
    let pay = row("https://pay.internal:8443/capture/…");
    assert_eq!(&pay[..2], ["2", "1"], "pending, failing: {pay:?}");
    assert_eq!(pay[3], "0", "dead-lettered: {pay:?}");
    let ship = row("https://ship.internal/notify</code>");
    assert_eq!((ship[0].as_str(), ship[3].as_str()), ("0", "1"), "{ship:?}");
    assert!(
        body.contains("href=\"/orders/E-4\""),
        "the dead-lettered effect's order: {body}"
    );
}

/// DNS rebinding (issue 43): a page on a foreign name that resolves to
/// loopback sends its own name as `Host` (and as `Origin`). A console
/// without a token answers none of it: every page and action is refused
/// (421) before it runs, with no CSRF cookie and nothing read, even with
/// the operator's own CSRF token and a forged loopback `Origin`; a loopback
/// `Host` whose POST comes from a foreign `Origin` is refused (403). In
/// headless chromium, with the name mapped to 127.0.0.1, the page and a
/// script on it (a fetch and a purge) get the same. Loopback names still
/// work, and the purge they make is audited as such.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_host_name_gets_nothing_from_a_console_without_a_token() {
    let env = TestEnv::new("console_rebind").await;
    let pool = RunningPool::ready(env.settings(1)).await;
    env.publisher()
        .await
        .send_all(&[
            crate::dlq::not_json("rb-1", "RB-1"),
            crate::dlq::not_json("rb-2", "RB-2"),
        ])
        .await;
    let db = env.db().await;
    wait_count(
        &db,
        "SELECT count(*) FROM urutan_dead_letter",
        2,
        Duration::from_secs(30),
    )
    .await;
    wait_depth(&env, 2).await;
    pool.stop().await;
    let one = record_id(&db, "rb-1").await;

    let console = Console::start(&env, &[]).await;
    let addr = console.addr;
    let port = addr.port();
    // What an attacker would need: the operator's CSRF cookie and token.
    let (status, head, _) = get(addr, "/dead-letters").await;
    assert_eq!(status, 200);
    let cookie = csrf_cookie(&head);
    let token = cookie.trim_start_matches("urutan_csrf=").to_owned();
    let confirmed = format!("csrf={token}&id={one}&confirm=yes");
    let evil = format!("evil.example:{port}");
    let evil_origin = format!("http://{evil}");
    let loopback_origin = format!("http://127.0.0.1:{port}");
    let content = ("Content-Type", "application/x-www-form-urlencoded");

    let record = format!("/dead-letters/{one}");
    for path in ["/", "/dead-letters", record.as_str(), "/audit", "/login"] {
        let (status, head, body) = exchange(addr, "GET", path, &[("Host", &evil)], "").await;
        assert_eq!(status, 421, "{path}: {body}");
        assert!(
            !head.contains("urutan_csrf="),
            "{path}: a CSRF cookie: {head}"
        );
        assert!(
            body.contains("answers only requests for localhost") && !body.contains("rb-1"),
            "{path}: {body}"
        );
    }
    for origin in [None, Some(evil_origin.as_str()), Some(&loopback_origin)] {
        for action in ["/dead-letters/purge", "/dead-letters/replay"] {
            let mut headers = vec![("Host", evil.as_str()), content, ("Cookie", &cookie)];
            headers.extend(origin.map(|o| ("Origin", o)));
            let (status, _, body) = exchange(addr, "POST", action, &headers, &confirmed).await;
            assert_eq!(status, 421, "{action} from {origin:?}: {body}");
        }
    }
    let from_foreign_page = [
        content,
        ("Cookie", cookie.as_str()),
        ("Origin", evil_origin.as_str()),
    ];
    let (status, _, body) = exchange(
        addr,
        "POST",
        "/dead-letters/purge",
        &from_foreign_page,
        &confirmed,
    )
    .await;
    assert_eq!(status, 403, "a loopback Host, a foreign Origin: {body}");

    // The same in a real browser: evil.example resolves to 127.0.0.1.
    let (_chromedriver, browser, _profile) =
        start_browser(&["--host-resolver-rules=MAP evil.example 127.0.0.1"]).await;
    browser.open(&format!("http://{evil}/dead-letters")).await;
    let text = browser.run("return document.body.innerText").await;
    assert!(
        text.as_str().is_some_and(
            |t| t.contains("answers only requests for localhost") && !t.contains("rb-1")
        ),
        "the rebinding page: {text}"
    );
    // The attacker's own page on that origin has no CSP of the console's:
    // as if it had been served before the name was rebound.
    browser
        .command(
            "POST",
            "/goog/cdp/execute",
            serde_json::json!({"cmd": "Page.setBypassCSP", "params": {"enabled": true}}),
        )
        .await;
    browser.open(&format!("http://{evil}/console.css")).await;
    let script = format!(
        "const done = arguments[arguments.length - 1];
         (async () => {{
             const read = await fetch('/dead-letters', {{credentials: 'include'}});
             const body = await read.text();
             const purge = await fetch('/dead-letters/purge', {{method: 'POST',
                 credentials: 'include',
                 headers: {{'Content-Type': 'application/x-www-form-urlencoded'}},
                 body: '{confirmed}'}});
             done([read.status, body.includes('rb-1'), purge.status]);
         }})().catch(e => done(String(e)));"
    );
    let seen = browser
        .command(
            "POST",
            "/execute/async",
            serde_json::json!({"script": script, "args": []}),
        )
        .await;
    assert_eq!(
        seen,
        serde_json::json!([421, false, 421]),
        "the script's reads"
    );
    assert_eq!(dlq_depth(&env).await, 2, "nothing purged");
    assert!(resolutions(&db).await.iter().all(|(_, r)| r.is_none()));
    assert_eq!(count(&db, "SELECT count(*) FROM urutan_audit").await, 0);

    // Loopback names, with or without a port, still work; so do actions.
    for host in ["localhost", "127.0.0.1", &format!("[::1]:{port}")] {
        let (status, _, body) = exchange(addr, "GET", "/", &[("Host", host)], "").await;
        assert_eq!(status, 200, "{host}: {body}");
    }
    let localhost = format!("localhost:{port}");
    let origin = format!("http://{localhost}");
    let (status, _, body) = exchange(
        addr,
        "POST",
        "/dead-letters/purge",
        &[
            ("Host", &localhost),
            ("Origin", &origin),
            ("Sec-Fetch-Site", "same-origin"),
            content,
            ("Cookie", &cookie),
        ],
        &confirmed,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("purged: removed from the DLQ"), "{body}");
    wait_depth(&env, 1).await;
    let who: String = sqlx::query_scalar("SELECT oleh FROM urutan_audit")
        .fetch_one(&db)
        .await
        .expect("one audit row");
    assert!(
        who.starts_with("console (loopback, no token) 127.0.0.1:"),
        "{who}"
    );
    let _ = exchange(
        browser.driver,
        "DELETE",
        &format!("/session/{}", browser.session),
        &[],
        "",
    )
    .await;
}

/// The console serves through the metrics port's accept loop: a half-sent
/// request and an idle connection are closed within the header timeout
/// (5 s), and a flood of idle connections beyond the cap (64), under a
/// descriptor limit that leaves room for the cap but not for the flood,
/// leaves it answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_has_the_metrics_ports_http_limits() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    let env = TestEnv::new("console_limits").await;
    env.db().await.close().await;
    let console = Console::start(&env, &[]).await;
    let addr = console.addr;

    let mut half = TcpStream::connect(addr).await.expect("connect");
    half.write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .await
        .expect("half a request");
    let mut idle = TcpStream::connect(addr).await.expect("connect");
    let start = std::time::Instant::now();
    for (what, stream) in [
        ("a half-sent request", &mut half),
        ("an idle connection", &mut idle),
    ] {
        let mut buf = Vec::new();
        let closed =
            tokio::time::timeout(Duration::from_secs(15), stream.read_to_end(&mut buf)).await;
        assert!(closed.is_ok(), "{what} was still open after 15 s");
    }
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );

    let pid = console.child.id().expect("the console runs");
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
        flood.push(TcpStream::connect(addr).await.expect("connect"));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, _, body) = get(addr, "/holds").await;
    assert_eq!(status, 200, "a page under the flood: {body}");
    drop(flood);
    let (status, _, _) = get(addr, "/").await;
    assert_eq!(status, 200, "after the flood");
}

/// Wrong tokens, in the login form or as bearer tokens, count per client:
/// five within a minute are refused (401), each logged with the client's
/// address (never the token) and audited; the sixth attempt is refused
/// unchecked (429, Retry-After), the right token too, while a session
/// cookie taken before still works, and the action it takes is audited as
/// a session cookie's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_tokens_are_rate_limited_logged_and_audited() {
    let env = TestEnv::new("console_logins").await;
    let db = env.db().await;
    let console = Console::start(&env, &[("CONSOLE_TOKEN", "rl-token-7")]).await;
    let addr = console.addr;
    let form = [("Content-Type", "application/x-www-form-urlencoded")];
    let (status, head, _) = exchange(addr, "POST", "/login", &form, "token=rl-token-7").await;
    assert_eq!(status, 303, "{head}");
    let session = head
        .lines()
        .filter_map(|l| l.strip_prefix("set-cookie: "))
        .find(|c| c.starts_with("urutan_console="))
        .and_then(|c| c.split(';').next())
        .expect("a session cookie")
        .to_owned();

    for guess in ["guess-1", "guess-2", "guess-3"] {
        let (status, _, _) =
            exchange(addr, "POST", "/login", &form, &format!("token={guess}")).await;
        assert_eq!(status, 401, "{guess}");
    }
    for guess in ["guess-4", "guess-5"] {
        let bearer = format!("Bearer {guess}");
        let (status, _, _) = exchange(addr, "GET", "/", &[("Authorization", &bearer)], "").await;
        assert_eq!(status, 401, "{guess}");
    }
    let (status, head, body) = exchange(addr, "POST", "/login", &form, "token=guess-6").await;
    assert_eq!(status, 429, "the sixth: {body}");
    assert!(head.contains("retry-after: "), "{head}");
    let (status, _, _) = exchange(addr, "POST", "/login", &form, "token=rl-token-7").await;
    assert_eq!(status, 429, "the right token is not checked either");
    let right = ("Authorization", "Bearer rl-token-7");
    let (status, _, _) = exchange(addr, "GET", "/", &[right], "").await;
    assert_eq!(status, 429, "nor as a bearer token");

    let (status, head, body) = exchange(addr, "GET", "/holds", &[("Cookie", &session)], "").await;
    assert_eq!(status, 200, "the session goes on: {body}");
    let csrf = csrf_cookie(&head);
    let token = csrf.trim_start_matches("urutan_csrf=").to_owned();
    let cookies = format!("{session}; {csrf}");
    let (status, _, body) = exchange(
        addr,
        "POST",
        "/holds/release",
        &[form[0], ("Cookie", &cookies)],
        &format!("csrf={token}&order=NOT-HELD&confirm=yes"),
    )
    .await;
    assert_eq!(status, 200, "{body}");

    let audit: Vec<(String, String, String)> =
        sqlx::query_as("SELECT tindakan, oleh, hasil FROM urutan_audit ORDER BY seq")
            .fetch_all(&db)
            .await
            .expect("audit");
    let refused: Vec<&str> = audit
        .iter()
        .filter(|(action, _, result)| action == "console_login" && result == "refused: wrong token")
        .map(|(_, who, _)| who.as_str())
        .collect();
    assert_eq!(refused.len(), 5, "one row per wrong token: {audit:?}");
    let by = |how: &str| {
        refused
            .iter()
            .filter(|w| w.starts_with(&format!("console (wrong token, {how}) 127.0.0.1:")))
            .count()
    };
    assert_eq!((by("login form"), by("bearer")), (3, 2), "{audit:?}");
    let (action, who, _) = audit.last().expect("the release");
    assert_eq!(action, "hold_release");
    assert!(
        who.starts_with("console (token, session cookie) 127.0.0.1:"),
        "{who}"
    );
    let log = console.log();
    assert_eq!(
        log.matches("a wrong token was refused").count(),
        5,
        "each logged: {log}"
    );
    assert!(log.contains("client=127.0.0.1:"), "{log}");
    for secret in ["guess-", "rl-token-7"] {
        assert!(!log.contains(secret), "the log shows {secret}: {log}");
        assert!(
            audit.iter().all(|row| !format!("{row:?}").contains(secret)),
            "the audit shows {secret}: {audit:?}"
        );
    }
}

/// The overview shows each shard's active replica and each live replica
/// with its shard count, as `urutan status` does (docs/contract.md section
/// 13). Replica names come from the environment (`REPLICA_NAME`, a pod's
/// name): two replicas named with markup are shown as text, in a real
/// browser (headless chromium) and in the HTML itself, never as markup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overview_shows_each_replica_and_its_shards_as_text() {
    const FIRST: &str = "<script>alert(1)</script>";
    const SECOND: &str = "r2 <b>bold</b> & \"quoted\"";
    let env = TestEnv::new("console_replicas").await;
    let mut settings = env.settings(4);
    settings.replica_name = Some(FIRST.to_owned());
    let first = RunningPool::start(settings).await;
    first.wait_ready().await;
    let mut settings = env.settings(4);
    settings.replica_name = Some(SECOND.to_owned());
    let second = RunningPool::start(settings).await;
    second.wait_ready().await;
    let db = env.db().await;
    wait_for(
        "2 shards placed on each replica",
        Duration::from_secs(30),
        || {
            let db = db.clone();
            async move {
                let per: Vec<i64> = sqlx::query_scalar(
                    "SELECT count(*) FROM urutan_penempatan GROUP BY replika ORDER BY replika",
                )
                .fetch_all(&db)
                .await
                .unwrap_or_default();
                per == [2, 2]
            }
        },
    )
    .await;

    let console = Console::start(&env, &[]).await;
    let (status, _, body) = get(console.addr, "/").await;
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains("<script"), "a name is never markup:\n{body}");
    assert!(!body.contains("<b>bold"), "a name is never markup:\n{body}");
    for escaped in [
        "&lt;script&gt;alert(1)&lt;/script&gt;",
        "r2 &lt;b&gt;bold&lt;/b&gt; &amp; &quot;quoted&quot;",
    ] {
        assert!(body.contains(escaped), "{escaped} missing:\n{body}");
    }

    let (_chromedriver, browser, _profile) = start_browser(&[]).await;
    std::fs::create_dir_all(&browser.shots).expect("screenshot directory");
    browser.open(&format!("http://{}/", console.addr)).await;
    browser.check("overview-replicas", "Replicas").await;
    let markup = browser
        .run("return document.querySelectorAll('script, main b').length")
        .await;
    assert_eq!(markup, 0, "no element made of a replica's name");
    // Each live replica with its shard count, as the browser shows them.
    let rows = browser
        .run(
            "return [...document.querySelectorAll('table.replicas tbody tr')]
                .map(r => [...r.cells].slice(0, 2).map(c => c.innerText))",
        )
        .await;
    let mut rows: Vec<(String, String)> = rows
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| {
            let cell = |i: usize| r[i].as_str().expect("a cell").to_owned();
            (cell(0), cell(1))
        })
        .collect();
    rows.sort();
    assert_eq!(
        rows,
        [
            (FIRST.to_owned(), "2".to_owned()),
            (SECOND.to_owned(), "2".to_owned())
        ],
        "each live replica with its shard count"
    );
    // Each shard's replica: the one the placement gives it.
    let shown = browser
        .run("return [...document.querySelectorAll('td.replica')].map(c => c.innerText)")
        .await;
    let placed: Vec<String> =
        sqlx::query_scalar("SELECT replika FROM urutan_penempatan ORDER BY shard")
            .fetch_all(&db)
            .await
            .expect("placement");
    assert_eq!(shown, serde_json::json!(placed), "each shard's replica");

    // One replica stops: the page says the other holds all 4.
    second.stop().await;
    wait_for(
        "the first replica holds every shard",
        Duration::from_secs(30),
        || {
            let db = db.clone();
            async move {
                count(&db, "SELECT count(*) FROM urutan_replika").await == 1
                    && count(&db, "SELECT count(DISTINCT replika) FROM urutan_penempatan").await
                        == 1
            }
        },
    )
    .await;
    let (_, _, body) = get(console.addr, "/").await;
    assert!(
        !body.contains("r2 &lt;b&gt;"),
        "a replica that left is not shown:\n{body}"
    );
    assert_eq!(
        body.matches("&lt;script&gt;alert(1)&lt;/script&gt;")
            .count(),
        5,
        "the first replica on its row and on each of the 4 shards:\n{body}"
    );
    first.stop().await;
}
