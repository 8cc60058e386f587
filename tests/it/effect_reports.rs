//! What operators see of the effects (webhooks) besides `urutan dlq`:
//! `urutan status` (text and `--json`: pending, dead-lettered, unresolved,
//! the attention code `effects_dead_lettered`) and `urutan explain ORDER`
//! (each effect: version, endpoint redacted, sent / pending / held /
//! dead-lettered with its answer). The dispatcher is the real `urutan
//! effects` binary, sending to a receiver started here whose URL holds a
//! token in its path, which no output may show.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::common::{Msg, RunningPool, TestEnv, UrutanProcess, urutan, wait_for};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// In the endpoint's path: never printed.
const TOKEN: &str = "tok-S3CRET";

/// (order, versi) -> the status the receiver answers (200 when not set).
type Answers = Arc<Mutex<HashMap<(String, i64), u16>>>;

async fn hook(State(answers): State<Answers>, body: Bytes) -> (StatusCode, &'static str) {
    let event: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let key = (
        event["id"].as_str().unwrap_or("?").to_owned(),
        event["versi"].as_i64().unwrap_or(0),
    );
    let code = answers.lock().expect("answers").get(&key).copied();
    match code {
        Some(422) => (StatusCode::UNPROCESSABLE_ENTITY, "card declined"),
        Some(_) => (StatusCode::SERVICE_UNAVAILABLE, "busy"),
        None => (StatusCode::OK, "ok"),
    }
}

/// The receiver on a local port, at `/pay/<TOKEN>` (stopped when dropped).
struct Receiver {
    addr: SocketAddr,
    answers: Answers,
    stop: CancellationToken,
}

impl Receiver {
    async fn start() -> Self {
        let answers = Answers::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let stop = CancellationToken::new();
        let app = Router::new()
            .route(&format!("/pay/{TOKEN}"), post(hook))
            .with_state(answers.clone());
        let until = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(until.cancelled_owned())
                .await;
        });
        Self {
            addr,
            answers,
            stop,
        }
    }

    fn answer(&self, order: &str, versi: i64, code: Option<u16>) {
        let mut answers = self.answers.lock().expect("answers");
        let key = (order.to_owned(), versi);
        match code {
            Some(code) => answers.insert(key, code),
            None => answers.remove(&key),
        };
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn dispatcher(env: &TestEnv, receiver: &Receiver, extra: &[(&str, &str)]) -> UrutanProcess {
    let mut vars: Vec<(String, String)> = (env.process_env(2).into_iter())
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    vars.push((
        "EFFECTS".into(),
        format!("*=http://{}/pay/{TOKEN}", receiver.addr),
    ));
    vars.push(("EFFECTS_SECRET".into(), SECRET.into()));
    for (k, v) in [
        ("EFFECTS_TIMEOUT", "1s"),
        ("EFFECTS_BACKOFF_MIN", "100ms"),
        ("EFFECTS_BACKOFF_MAX", "1s"),
        ("EFFECTS_MAX_ATTEMPTS", "1000"),
        ("EFFECTS_POLL", "50ms"),
    ]
    .iter()
    .chain(extra)
    {
        vars.push(((*k).to_owned(), (*v).to_owned()));
    }
    UrutanProcess::start("effects", &vars)
}

/// The states of `order`'s effects by version, with their attempts.
async fn states(db: &PgPool, order: &str) -> Vec<(i64, String, i32)> {
    sqlx::query_as(
        "SELECT versi, keadaan, percobaan FROM urutan_efek WHERE pesanan_id = $1 ORDER BY versi",
    )
    .bind(order)
    .fetch_all(db)
    .await
    .expect("effects")
}

async fn status_json(env: &TestEnv) -> serde_json::Value {
    let status = urutan(env, &[], &["status", "--json"]).await;
    serde_json::from_str(&status.stdout).unwrap_or_else(|e| panic!("{e}: {status}"))
}

fn codes(status: &serde_json::Value) -> Vec<String> {
    status["attention"]
        .as_array()
        .expect("attention")
        .iter()
        .map(|a| a["code"].as_str().expect("code").to_owned())
        .collect()
}

/// With `EFFECTS_ON_DEAD=skip` a dead-lettered effect holds nothing, so
/// only these show it: status needs attention until it is dealt with, and
/// explain lists every effect of the order with where it stands. Then with
/// `hold`: the held effects, and a released dead letter counts as dealt with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_explain_show_each_effect_and_dead_letters_need_attention() {
    let env = TestEnv::new("effect_reports").await;
    let db = env.db().await;
    let pool = RunningPool::ready(env.settings(2)).await;
    let receiver = Receiver::start().await;
    receiver.answer("A", 1, Some(422));
    receiver.answer("C", 1, Some(503));
    let mut skip = dispatcher(&env, &receiver, &[("EFFECTS_ON_DEAD", "skip")]);
    skip.wait_ready().await;
    let msgs: Vec<Msg> = [("A", 1), ("A", 2), ("C", 1), ("C", 2)]
        .into_iter()
        .map(|(o, v)| Msg::event(o, v))
        .collect();
    env.publisher().await.send_all(&msgs).await;
    wait_for(
        "A v1 dead-lettered, A v2 sent, C v1 retried",
        Duration::from_secs(60),
        || async {
            let a = states(&db, "A").await;
            let c = states(&db, "C").await;
            a.iter()
                .map(|(v, k, _)| (*v, k.as_str()))
                .collect::<Vec<_>>()
                == [(1, "gagal"), (2, "terkirim")]
                && c.len() == 2
                && c[0].2 >= 2
        },
    )
    .await;

    let status = status_json(&env).await;
    let effects = &status["effects"];
    assert_eq!(effects["dead_lettered"], 1, "{status}");
    assert_eq!(effects["unresolved"], 1, "{status}");
    assert_eq!(
        effects["pending"], 2,
        "C v1 retrying, C v2 behind it: {status}"
    );
    assert!(effects["oldest_pending_at"].is_string(), "{status}");
    assert_eq!(status["exit_code"], 1, "{status}");
    let found = codes(&status);
    assert!(
        found.contains(&"effects_dead_lettered".to_owned())
            && !found.contains(&"orders_held".to_owned()),
        "{found:?}"
    );
    let text = urutan(&env, &[], &["status"]).await;
    assert!(
        text.code == Some(1)
            && text.stdout.contains("[effects_dead_lettered]")
            && text.stdout.contains("2 pending")
            && text.stdout.contains("1 dead-lettered")
            && !text.stdout.contains(TOKEN),
        "{text}"
    );

    let endpoint = format!("http://{}/pay/…", receiver.addr);
    let explain = urutan(&env, &[], &["explain", "A"]).await;
    assert!(explain.ok(), "{explain}");
    let line = |text: &str, versi: i64| -> String {
        text.lines()
            .find(|l| l.contains(&endpoint) && l.contains(&format!(" v{versi} ")))
            .unwrap_or_else(|| panic!("no effect line of v{versi}:\n{text}"))
            .to_owned()
    };
    assert!(
        line(&explain.stdout, 1).contains("dead-lettered (HTTP 422: card declined)"),
        "{explain}"
    );
    assert!(
        line(&explain.stdout, 2).contains("sent (HTTP 200)"),
        "{explain}"
    );
    assert!(!explain.stdout.contains(TOKEN), "{explain}");
    let explain = urutan(&env, &[], &["explain", "C"]).await;
    let v1 = line(&explain.stdout, 1);
    assert!(
        v1.contains("pending (") && v1.contains("attempt(s), last HTTP 503: busy"),
        "{explain}"
    );
    assert!(line(&explain.stdout, 2).contains("pending ("), "{explain}");
    drop(skip);

    // With holds: H v1 dead-lettered holds v2, which explain shows held.
    receiver.answer("H", 1, Some(422));
    let mut hold = dispatcher(&env, &receiver, &[]);
    hold.wait_ready().await;
    receiver.answer("C", 1, None);
    env.publisher()
        .await
        .send_all(&[Msg::event("H", 1), Msg::event("H", 2)])
        .await;
    wait_for("H v1 dead-lettered", Duration::from_secs(60), || async {
        let h = states(&db, "H").await;
        h.len() == 2 && h[0].1 == "gagal"
    })
    .await;
    let explain = urutan(&env, &[], &["explain", "H"]).await;
    let (v1, v2) = (line(&explain.stdout, 1), line(&explain.stdout, 2));
    let effect: i64 = v1
        .split_whitespace()
        .next()
        .and_then(|id| id.parse().ok())
        .expect("the effect id first");
    assert!(
        v1.contains("dead-lettered (HTTP 422: card declined); holds the later effects")
            && v2.contains(&format!(
                "held (waits behind the dead-lettered effect {effect})"
            )),
        "{explain}"
    );
    let release = urutan(&env, &[], &["hold", "release", "H", "--effects"]).await;
    assert!(release.ok(), "{release}");
    wait_for("H v2 and C sent", Duration::from_secs(60), || async {
        states(&db, "H").await[1].1 == "terkirim"
            && states(&db, "C").await.iter().all(|c| c.1 == "terkirim")
    })
    .await;
    let status = status_json(&env).await;
    assert_eq!(status["effects"]["dead_lettered"], 2, "{status}");
    assert_eq!(status["effects"]["unresolved"], 1, "H's released: {status}");
    assert_eq!(status["effects"]["pending"], 0, "{status}");

    // A's dead letter sent after the fix: nothing needs attention for effects.
    receiver.answer("A", 1, None);
    let a1: i64 =
        sqlx::query_scalar("SELECT efek FROM urutan_efek WHERE pesanan_id = 'A' AND versi = 1")
            .fetch_one(&db)
            .await
            .expect("A v1");
    let replay = urutan(
        &env,
        &[],
        &[
            "dlq",
            "replay",
            "--effects",
            "--wait",
            "30s",
            &a1.to_string(),
        ],
    )
    .await;
    assert!(replay.ok() && replay.stdout.contains(": sent"), "{replay}");
    let status = status_json(&env).await;
    assert_eq!(status["effects"]["unresolved"], 0, "{status}");
    assert!(
        !codes(&status).contains(&"effects_dead_lettered".to_owned()),
        "{status}"
    );
    hold.stop().await;
    pool.stop().await;
}
