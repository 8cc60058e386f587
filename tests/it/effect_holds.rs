//! Effect holds (`EFFECTS_ON_DEAD`, docs/contract.md sections 5, 6, 8 and
//! 11): with the default, `hold`, a dead-lettered effect holds its order's
//! later effects (never its versions) until `urutan dlq replay --effects`
//! sends it or `urutan hold release ORDER_ID --effects` skips it; with
//! `skip` they go on. Events go through the real broker and worker pool;
//! the dispatcher is the real `urutan effects` binary, sending to a
//! receiver started here that answers 422 for the versions it is told to
//! refuse and records, in arrival order, what it accepted.

use std::collections::HashSet;
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
use urutan::effects::OnDead;
use urutan::effects::store::{Recorded, Settled, claim, record};

use crate::common::{
    Msg, PgRoles, RunningPool, TestEnv, UrutanProcess, http_get, metric_sum, stored, urutan,
    wait_for,
};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// Short timeouts and fast polling, so that every wait below is short.
const FAST: &[(&str, &str)] = &[
    ("EFFECTS_TIMEOUT", "1s"),
    ("EFFECTS_BACKOFF_MIN", "100ms"),
    ("EFFECTS_BACKOFF_MAX", "1s"),
    ("EFFECTS_POLL", "50ms"),
];

/// What the receiver saw: every request and every accepted one, as
/// (order, versi) in arrival order.
#[derive(Default)]
struct Inbox {
    refuse: HashSet<(String, i64)>,
    requests: Vec<(String, i64)>,
    accepted: Vec<(String, i64)>,
}

async fn hook(State(inbox): State<Arc<Mutex<Inbox>>>, body: Bytes) -> StatusCode {
    let event: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let key = (
        event["id"].as_str().unwrap_or("?").to_owned(),
        event["versi"].as_i64().unwrap_or(0),
    );
    let mut inbox = inbox.lock().expect("inbox");
    inbox.requests.push(key.clone());
    if inbox.refuse.contains(&key) {
        return StatusCode::UNPROCESSABLE_ENTITY;
    }
    inbox.accepted.push(key);
    StatusCode::OK
}

/// The webhook receiver on a local port (stopped when dropped).
struct Receiver {
    addr: SocketAddr,
    inbox: Arc<Mutex<Inbox>>,
    stop: CancellationToken,
}

impl Receiver {
    async fn start() -> Self {
        let inbox = Arc::<Mutex<Inbox>>::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let stop = CancellationToken::new();
        let app = Router::new()
            .route("/hook", post(hook))
            .with_state(inbox.clone());
        let until = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(until.cancelled_owned())
                .await;
        });
        Self { addr, inbox, stop }
    }

    fn effects(&self) -> String {
        format!("*=http://{}/hook", self.addr)
    }

    fn refuse(&self, order: &str, versi: i64) {
        let mut inbox = self.inbox.lock().expect("inbox");
        inbox.refuse.insert((order.to_owned(), versi));
    }

    fn fix(&self) {
        self.inbox.lock().expect("inbox").refuse.clear();
    }

    /// The versions of `order` accepted, in arrival order.
    fn accepted(&self, order: &str) -> Vec<i64> {
        let inbox = self.inbox.lock().expect("inbox");
        let of = |(o, v): &(String, i64)| (o == order).then_some(*v);
        inbox.accepted.iter().filter_map(of).collect()
    }

    /// The versions of `order` requested (refused ones too), in arrival order.
    fn requested(&self, order: &str) -> Vec<i64> {
        let inbox = self.inbox.lock().expect("inbox");
        let of = |(o, v): &(String, i64)| (o == order).then_some(*v);
        inbox.requests.iter().filter_map(of).collect()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// `urutan effects` on `env` sending to `receiver`, with `extra` settings.
fn dispatcher(env: &TestEnv, receiver: &Receiver, extra: &[(&str, &str)]) -> UrutanProcess {
    let mut vars: Vec<(String, String)> = (env.process_env(2).into_iter())
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    vars.push(("EFFECTS".into(), receiver.effects()));
    vars.push(("EFFECTS_SECRET".into(), SECRET.into()));
    vars.extend((FAST.iter().chain(extra)).map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    UrutanProcess::start("effects", &vars)
}

/// The pool (two shards, strict mode) and the database.
async fn pipeline(env: &TestEnv) -> (RunningPool, PgPool) {
    let db = env.db().await;
    let pool = RunningPool::ready(env.settings(2)).await;
    (pool, db)
}

fn versions(order: &str, range: std::ops::RangeInclusive<i64>) -> Vec<Msg> {
    range.map(|v| Msg::event(order, v)).collect()
}

/// The states of `order`'s effects by version.
async fn effect_states(db: &PgPool, order: &str) -> Vec<(i64, String)> {
    sqlx::query_as("SELECT versi, keadaan FROM urutan_efek WHERE pesanan_id = $1 ORDER BY versi")
        .bind(order)
        .fetch_all(db)
        .await
        .expect("effects")
}

/// Waits until `order` is at `versi` with its effects in `states` (by version).
async fn wait_effects(db: &PgPool, order: &str, versi: i64, states: &[&str]) {
    let want: Vec<(i64, String)> = (1..).zip(states.iter().map(|s| (*s).to_owned())).collect();
    wait_for(
        &format!("{order} at v{versi}, effects {states:?}"),
        Duration::from_secs(60),
        || async {
            stored(db, order).await == Some(versi) && effect_states(db, order).await == want
        },
    )
    .await;
}

/// `urutan hold list --json`, parsed.
async fn hold_list(env: &TestEnv, vars: &[(&str, &str)]) -> Vec<serde_json::Value> {
    let listed = urutan(env, vars, &["hold", "list", "--json"]).await;
    assert!(listed.ok(), "{listed}");
    serde_json::from_str(&listed.stdout).expect("hold list JSON")
}

async fn held_gauge(pool: &RunningPool) -> f64 {
    let scrape = http_get(pool.http, "/metrics").await.1;
    metric_sum(&scrape, "urutan_orders_held", &["reason=\"effect\""])
}

/// The default (`hold`): a 4xx for A's v2 dead-letters that effect; A's
/// versions 1..4 are all applied, but its v3 and v4 effects wait, seen by
/// `hold list`, `status`, `explain` and the metrics. Replayed once the
/// endpoint is fixed, v2's effect is sent, then v3 and v4, in order. B,
/// meanwhile, is not held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_effect_holds_its_orders_later_effects_until_replayed() {
    let env = TestEnv::new("effect_hold_replay").await;
    let receiver = Receiver::start().await;
    receiver.refuse("A", 2);
    let (pool, db) = pipeline(&env).await;
    let mut dispatcher = dispatcher(&env, &receiver, &[]);
    dispatcher.wait_ready().await;
    let mut msgs = versions("A", 1..=4);
    msgs.extend(versions("B", 1..=2));
    env.publisher().await.send_all(&msgs).await;

    let held = ["terkirim", "gagal", "menunggu", "menunggu"];
    wait_effects(&db, "A", 4, &held).await;
    wait_effects(&db, "B", 2, &["terkirim", "terkirim"]).await;
    // Several claim rounds later (50 ms poll), v3 and v4 still wait.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        effect_states(&db, "A").await,
        (1..).zip(held.map(String::from)).collect::<Vec<_>>()
    );
    assert_eq!(
        receiver.requested("A"),
        [1, 2],
        "v3, v4 not sent while held"
    );
    assert_eq!(receiver.accepted("B"), [1, 2], "another order is not held");

    let holds = hold_list(&env, &[]).await;
    assert_eq!(holds.len(), 1, "{holds:?}");
    let hold = &holds[0];
    assert!(
        hold["order"] == "A"
            && hold["reason"] == "effect"
            && hold["versi"] == 2
            && hold["message_id"] == "A-v2"
            && hold["waiting"] == 2,
        "{hold}"
    );
    assert!(
        hold["since"].is_string() && hold["shard"].is_null(),
        "{hold}"
    );
    assert!(
        hold["error"]
            .as_str()
            .is_some_and(|e| e.contains("HTTP 422")),
        "{hold}"
    );
    let effect = hold["effect"].as_i64().expect("the effect's id");
    let table = urutan(&env, &[], &["hold", "list"]).await;
    assert!(
        table
            .stdout
            .contains(&format!("held by effect {effect} of v2"))
            && table.stdout.contains("--effects"),
        "{table}"
    );
    let status = urutan(&env, &[], &["status", "--json"]).await;
    assert!(status.stdout.contains("\"orders_held\""), "{status}");
    let explain = urutan(&env, &[], &["explain", "A"]).await;
    assert!(
        explain.stdout.contains("EFFECTS ON HOLD (effect)"),
        "{explain}"
    );
    assert!(!explain.stdout.contains("ON HOLD (refused)"), "{explain}");
    // A version release is not an effect release.
    let versions_only = urutan(&env, &[], &["hold", "release", "A"]).await;
    assert_eq!(versions_only.code, Some(1), "{versions_only}");
    assert!(
        versions_only
            .stderr
            .contains("urutan hold release A --effects"),
        "{versions_only}"
    );
    wait_for(
        "urutan_orders_held{reason=effect} 1",
        Duration::from_secs(15),
        || async { held_gauge(&pool).await == 1.0 },
    )
    .await;
    let counted = dispatcher.scrape().await;
    assert_eq!(
        metric_sum(&counted, "urutan_holds_total", &["reason=\"effect\""]),
        1.0
    );

    // The endpoint is fixed: the replay sends v2, then v3 and v4 go, in order.
    receiver.fix();
    let id = effect.to_string();
    let replayed = urutan(
        &env,
        &[],
        &["dlq", "replay", "--effects", &id, "--wait", "30s"],
    )
    .await;
    assert!(
        replayed.ok() && replayed.stdout.contains(": sent"),
        "{replayed}"
    );
    wait_effects(&db, "A", 4, &["terkirim"; 4]).await;
    assert_eq!(
        receiver.accepted("A"),
        [1, 2, 3, 4],
        "in order at the receiver"
    );
    assert_eq!(receiver.requested("A"), [1, 2, 2, 3, 4]);
    assert!(hold_list(&env, &[]).await.is_empty(), "the hold ended");
    wait_for(
        "urutan_orders_held{reason=effect} 0",
        Duration::from_secs(15),
        || async { held_gauge(&pool).await == 0.0 },
    )
    .await;
    let counted = dispatcher.scrape().await;
    assert_eq!(
        metric_sum(&counted, "urutan_holds_total", &["reason=\"effect\""]),
        1.0
    );
    dispatcher.stop().await;
    pool.stop().await;
}

/// `urutan hold release ORDER_ID --effects` (as the least-privilege
/// operator, the dispatcher as its own role) skips the dead effect: it
/// stays dead-lettered, the skip is recorded and told by `explain`, and
/// the order's later effects go in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_release_effects_skips_the_dead_effect() {
    let env = TestEnv::new("effect_hold_release").await;
    let db = env.db().await; // the owner migrates
    let roles = PgRoles::create(&env, &["operator", "dispatcher"]);
    let operator_url = roles.url("operator");
    let as_operator = [("DATABASE_URL", operator_url.as_str())];
    let receiver = Receiver::start().await;
    receiver.refuse("C", 2);
    let pool = RunningPool::ready(env.settings(2)).await;
    let dispatcher_url = roles.url("dispatcher");
    let mut dispatcher = dispatcher(&env, &receiver, &[("DATABASE_URL", &dispatcher_url)]);
    dispatcher.wait_ready().await;
    env.publisher().await.send_all(&versions("C", 1..=4)).await;
    wait_effects(&db, "C", 4, &["terkirim", "gagal", "menunggu", "menunggu"]).await;
    let holds = hold_list(&env, &as_operator).await;
    assert!(
        holds.len() == 1 && holds[0]["reason"] == "effect",
        "{holds:?}"
    );

    let released = urutan(&env, &as_operator, &["hold", "release", "C", "--effects"]).await;
    assert!(released.ok(), "{released}");
    assert!(
        released.stdout.contains("of v2 (message C-v2)"),
        "{released}"
    );
    wait_effects(&db, "C", 4, &["terkirim", "gagal", "terkirim", "terkirim"]).await;
    assert_eq!(receiver.accepted("C"), [1, 3, 4], "the rest, in order");
    assert!(hold_list(&env, &as_operator).await.is_empty());
    let skip: (String, i64, String) =
        sqlx::query_as("SELECT alasan, versi, galat FROM urutan_lewati WHERE pesanan_id = 'C'")
            .fetch_one(&db)
            .await
            .expect("the skip");
    assert_eq!((skip.0.as_str(), skip.1), ("effect", 2));
    assert!(skip.2.contains("HTTP 422"), "{skip:?}");
    // (`urutan explain` reads more than the operator role may: as the owner.)
    let explain = urutan(&env, &[], &["explain", "C"]).await;
    assert!(
        explain.stdout.contains("skipped") && explain.stdout.contains("hold release --effects"),
        "{explain}"
    );
    let dead = urutan(&env, &as_operator, &["dlq", "list", "--effects", "--json"]).await;
    let dead: serde_json::Value = serde_json::from_str(&dead.stdout).expect("JSON");
    let dead = dead["effects"].as_array().expect("effects");
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert!(
        dead[0]["order_id"] == "C" && dead[0]["versi"] == 2,
        "{dead:?}"
    );

    // Released already, or never held: one line, exit 1.
    for order in ["C", "nobody"] {
        let again = urutan(&env, &as_operator, &["hold", "release", order, "--effects"]).await;
        assert_eq!(again.code, Some(1), "{again}");
        assert!(again.stderr.contains("effects are not on hold"), "{again}");
        assert_eq!(again.stderr.trim().lines().count(), 1, "{again}");
    }
    dispatcher.stop().await;
    pool.stop().await;
}

/// `EFFECTS_ON_DEAD=skip`: the behaviour before holds, a dead-lettered
/// effect lets its order's next one go, and nothing is held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn effects_on_dead_skip_lets_later_effects_go() {
    let env = TestEnv::new("effect_hold_skip").await;
    let receiver = Receiver::start().await;
    receiver.refuse("D", 2);
    let (pool, db) = pipeline(&env).await;
    let mut dispatcher = dispatcher(&env, &receiver, &[("EFFECTS_ON_DEAD", "skip")]);
    dispatcher.wait_ready().await;
    env.publisher().await.send_all(&versions("D", 1..=3)).await;
    wait_effects(&db, "D", 3, &["terkirim", "gagal", "terkirim"]).await;
    assert_eq!(receiver.accepted("D"), [1, 3]);
    assert!(hold_list(&env, &[]).await.is_empty());
    let holding: i64 =
        sqlx::query_scalar("SELECT count(*) FROM urutan_efek WHERE ditahan_sejak IS NOT NULL")
            .fetch_one(&db)
            .await
            .expect("holding effects");
    assert_eq!(holding, 0);
    let counted = dispatcher.scrape().await;
    assert_eq!(
        metric_sum(&counted, "urutan_holds_total", &["reason=\"effect\""]),
        0.0
    );
    dispatcher.stop().await;
    pool.stop().await;
}

/// A wrong `EFFECTS_ON_DEAD` stops `urutan effects` at once, naming the
/// setting and its values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_effects_on_dead_is_refused_naming_the_setting() {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_urutan"));
    cmd.arg("effects")
        .env("EFFECTS_ON_DEAD", "maybe")
        .env("EFFECTS_SECRET", SECRET)
        .env("DATABASE_URL", "postgres://postgres@127.0.0.1:1/never")
        .env("METRICS_ADDR", "127.0.0.1:0")
        .env("NO_COLOR", "1")
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .expect("urutan effects did not exit within 30 s")
        .expect("run urutan effects");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let first = stderr.lines().next().unwrap_or_default();
    assert!(
        first.contains("EFFECTS_ON_DEAD") && first.contains("maybe"),
        "the first line names the setting: {stderr}"
    );
    assert!(
        stderr.contains("hold") && stderr.contains("skip"),
        "{stderr}"
    );
    assert!(stderr.len() < 400, "short: {stderr}");
}

/// The claim and the results at the store (no dispatcher): under `hold` a
/// dead letter makes one hold (a replay that dies again makes none), the
/// claim takes nothing after it, not even an effect recorded later, and a
/// release lets the next one be claimed at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claim_takes_nothing_behind_a_holding_dead_effect() {
    let env = TestEnv::new("effect_hold_claim").await;
    let db = env.db().await;
    let tujuan: i32 = sqlx::query_scalar(
        "INSERT INTO urutan_efek_tujuan (url) VALUES ('http://127.0.0.1:9/pay') RETURNING tujuan",
    )
    .fetch_one(&db)
    .await
    .expect("endpoint");
    let add = |from: i64, to: i64| {
        sqlx::query(
            "INSERT INTO urutan_efek (pesanan_id, versi, tujuan, message_id, isi)
             SELECT 'H', v, $1, 'H-v' || v, '{}' FROM generate_series($2::bigint, $3) v",
        )
        .bind(tujuan)
        .bind(from)
        .bind(to)
        .execute(&db)
    };
    add(1, 2).await.expect("effects");
    let lease = Duration::from_secs(600);
    let dead = Recorded::Dead {
        code: Some(404),
        answer: "gone".into(),
    };
    let first = claim(&db, 8, lease, "test").await.expect("claim");
    assert_eq!(first.len(), 1);
    let v1 = first[0].efek;
    let settled = record(&db, v1, 1, &dead, OnDead::Hold)
        .await
        .expect("record");
    assert_eq!(settled, Settled::Held);
    assert!(
        claim(&db, 8, lease, "test")
            .await
            .expect("claim")
            .is_empty(),
        "v2 held"
    );
    add(3, 3).await.expect("a later effect");
    assert!(
        claim(&db, 8, lease, "test")
            .await
            .expect("claim")
            .is_empty(),
        "v3 held too"
    );

    // Replayed and dead again: the same hold, not a new one.
    urutan::effects::store::revive_dead(&db, &[v1])
        .await
        .expect("revive");
    let again = claim(&db, 8, lease, "test").await.expect("claim");
    assert_eq!((again.len(), again[0].efek), (1, v1));
    let settled = record(&db, v1, 1, &dead, OnDead::Hold)
        .await
        .expect("record");
    assert_eq!(settled, Settled::Recorded, "the hold stays");
    let holds = urutan::effects::hold::holds(&db, None, 10)
        .await
        .expect("holds");
    assert_eq!(holds.len(), 1);
    assert_eq!((holds[0].effect, holds[0].waiting), (Some(v1), 2));

    let skipped = urutan::effects::hold::release(&db, "H")
        .await
        .expect("release");
    assert_eq!(
        (skipped.len(), skipped[0].versi, skipped[0].waiting),
        (1, 1, 2)
    );
    let next = claim(&db, 8, lease, "test").await.expect("claim");
    assert_eq!((next.len(), next[0].versi), (1, 2), "v2 goes at once");
    assert!(
        urutan::effects::hold::release(&db, "H")
            .await
            .expect("release")
            .is_empty()
    );
    assert_eq!(urutan::effects::hold::held(&db).await.expect("held"), None);
}
