//! Versions that wait longer than they should (issue 44 item 5): a message
//! set aside past its due time, an order whose missing version outlived
//! `GAP_TIMEOUT` unheld, a parked version free to go and not released.
//! `urutan status` flags each (exit 1, a code, `overdue` in `--json`) and
//! every `urutan run` keeps `urutan_orders_overdue{kind}`; a hold, a due
//! time ahead, a gap younger than `GAP_TIMEOUT` are not overdue. Also: a
//! set-aside message counts in `urutan_set_aside_total`, not as parked.

use std::time::Duration;

use sqlx::PgPool;
use urutan_testkit::fixtures::{
    Msg, TestEnv, UrutanProcess, metric_sum, urutan, wait_for, wait_stored,
};

/// A handler that asks to retry every version of an order listed in `gagal`.
const HANDLER: &str = "
CREATE TABLE gagal (pesanan_id TEXT PRIMARY KEY);
CREATE FUNCTION tangani(event jsonb) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM gagal WHERE pesanan_id = event->>'id') THEN
        RAISE EXCEPTION 'not yet' USING ERRCODE = 'URTRY';
    END IF;
END
$$;";

/// Rows a worker of shard 3 would have left, were one running: the pool
/// has one shard, so nothing releases or holds them (a stranded shard).
/// Overdue: S (due 5 min ago), G (v2 missing for 11 min, GAP_TIMEOUT 10 min),
/// P (v2 free to go for 10 min). Not overdue: S2 (due in an hour), S3 (due
/// 10 s ago, within the margin), G2 (v2 missing for 5 min), H (held: its
/// versions wait for an operator), P2 (v2 free to go since its v1 was
/// applied a moment ago).
const STRANDED: &str = "
INSERT INTO pesanan (id, status, versi, diperbarui_pada) VALUES
    ('G', 'dibuat', 1, now() - interval '20 minutes'),
    ('G2', 'dibuat', 1, now() - interval '20 minutes'),
    ('H', 'dibuat', 1, now() - interval '20 minutes'),
    ('P', 'dibuat', 1, now() - interval '10 minutes'),
    ('P2', 'dibuat', 1, now());
INSERT INTO urutan_tahan (pesanan_id, alasan, message_id, versi, shard, galat)
    VALUES ('H', 'refused', 'H-v2', 2, 3, 'refused');
INSERT INTO urutan_parkir (pesanan_id, message_id, status, versi, shard, epoch, diparkir_pada,
                           percobaan, jatuh_tempo, galat) VALUES
    ('S', 'S-v1', 'dibuat', 1, 3, 0, now() - interval '9 minutes', 3,
     now() - interval '5 minutes', 'not yet'),
    ('S2', 'S2-v1', 'dibuat', 1, 3, 0, now() - interval '9 minutes', 3,
     now() + interval '1 hour', 'not yet'),
    ('S3', 'S3-v1', 'dibuat', 1, 3, 0, now() - interval '9 minutes', 3,
     now() - interval '10 seconds', 'not yet'),
    ('G', 'G-v3', 'dibuat', 3, 3, 0, now() - interval '11 minutes', 0, NULL, NULL),
    ('G2', 'G2-v3', 'dibuat', 3, 3, 0, now() - interval '5 minutes', 0, NULL, NULL),
    ('H', 'H-v3', 'dibuat', 3, 3, 0, now() - interval '10 minutes', 0, NULL, NULL),
    ('P', 'P-v2', 'dibuat', 2, 3, 0, now() - interval '10 minutes', 0, NULL, NULL),
    ('P2', 'P2-v2', 'dibuat', 2, 3, 0, now() - interval '10 minutes', 0, NULL, NULL);";

/// `urutan status --json`: its exit code and document.
async fn status(env: &TestEnv) -> (Option<i32>, serde_json::Value) {
    let ran = urutan(env, &[("GAP_TIMEOUT", "10m")], &["status", "--json"]).await;
    let doc = serde_json::from_str(&ran.stdout).unwrap_or_else(|e| panic!("{e}: {ran}"));
    (ran.code, doc)
}

fn codes(doc: &serde_json::Value) -> Vec<String> {
    doc["attention"]
        .as_array()
        .expect("attention")
        .iter()
        .map(|a| a["code"].as_str().expect("code").to_owned())
        .collect()
}

/// `kind` in `overdue`: (orders, example order); `None` if absent.
fn overdue(doc: &serde_json::Value, kind: &str) -> Option<(i64, String)> {
    doc["overdue"]
        .as_array()
        .expect("overdue")
        .iter()
        .find_map(|o| {
            (o["kind"] == kind).then(|| {
                (
                    o["orders"].as_i64().expect("orders"),
                    o["example"].as_str().expect("example").to_owned(),
                )
            })
        })
}

fn gauge(scrape: &str, kind: &str) -> f64 {
    metric_sum(
        scrape,
        "urutan_orders_overdue",
        &[&format!("kind=\"{kind}\"")],
    )
}

async fn worker(env: &TestEnv) -> UrutanProcess {
    let mut vars = env.process_env(1);
    vars.push(("HANDLER_FUNCTION", "tangani".to_owned()));
    vars.push(("RETRY_BACKOFF_MIN", "2s".to_owned()));
    vars.push(("RETRY_BACKOFF_MAX", "2s".to_owned()));
    vars.push(("GAP_POLICY", "wait".to_owned()));
    vars.push(("GAP_TIMEOUT", "10m".to_owned()));
    let mut worker = UrutanProcess::start("run", &vars);
    worker.wait_ready().await;
    worker
}

async fn execute(db: &PgPool, sql: &'static str) {
    sqlx::raw_sql(sql).execute(db).await.expect(sql);
}

#[tokio::test]
async fn versions_waiting_past_their_time_need_attention() {
    let env = TestEnv::new("overdue").await;
    let db = env.db().await;
    execute(&db, HANDLER).await;
    execute(&db, "INSERT INTO gagal VALUES ('F')").await;
    let mut run = worker(&env).await;
    env.publisher()
        .await
        .send_all(&[Msg::event("F", 1), Msg::event("F", 2), Msg::event("O", 1)])
        .await;
    wait_stored(&db, "O", 1).await;

    // F v1 set aside (its own counter), F v2 parked behind it (parked).
    let set_aside = |s: &str| {
        metric_sum(
            s,
            "urutan_set_aside_total",
            &["shard=\"0\"", "reason=\"handler_retry\""],
        )
    };
    let scrape = run
        .wait_scrape("F set aside", Duration::from_secs(20), |s| {
            set_aside(s) >= 1.0
        })
        .await;
    assert_eq!(
        set_aside(&scrape),
        1.0,
        "set aside once (tried again since)"
    );
    assert_eq!(
        metric_sum(&scrape, "urutan_parked_total", &[]),
        1.0,
        "only F v2 is parked; the set-aside v1 is not counted as parked"
    );

    // F is retried every 2 s while its worker runs: explained, not overdue.
    let (code, doc) = status(&env).await;
    assert_eq!(code, Some(1), "orders_retrying: {doc}");
    assert!(codes(&doc).contains(&"orders_retrying".to_owned()), "{doc}");
    assert_eq!(overdue(&doc, "set_aside"), None, "{doc}");

    // A stranded shard: flagged by status and by the running worker's gauge.
    execute(&db, STRANDED).await;
    let scrape = run
        .wait_scrape("the overdue gauge", Duration::from_secs(20), |s| {
            gauge(s, "set_aside") == 1.0 && gauge(s, "gap") == 1.0 && gauge(s, "parked") == 1.0
        })
        .await;
    eprintln!(
        "{}",
        scrape
            .lines()
            .filter(|l| l.starts_with("urutan_orders_overdue"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let (code, doc) = status(&env).await;
    assert_eq!(code, Some(1), "{doc}");
    let found = codes(&doc);
    for code in ["set_aside_overdue", "gap_overdue", "parked_overdue"] {
        assert!(found.contains(&code.to_owned()), "{code}: {found:?}");
    }
    assert_eq!(overdue(&doc, "set_aside"), Some((1, "S".into())), "{doc}");
    assert_eq!(overdue(&doc, "gap"), Some((1, "G".into())), "{doc}");
    assert_eq!(overdue(&doc, "parked"), Some((1, "P".into())), "{doc}");
    let text = urutan(&env, &[("GAP_TIMEOUT", "10m")], &["status"]).await;
    assert_eq!(text.code, Some(1), "{text}");
    eprintln!("$ urutan status\n{}", text.stdout);
    for line in [
        "order S: see `urutan explain`): a message set aside",
        "order G: see `urutan explain`): an order's next version has been missing longer than \
         GAP_TIMEOUT",
        "order P: see `urutan explain`): a parked version free to go",
    ] {
        assert!(text.stdout.contains(line), "{line}:\n{}", text.stdout);
    }

    // The worker stops while F is set aside: once due (as if 5 minutes
    // passed), F is overdue too.
    let log = run.stop().await;
    assert!(!log.contains("panicked"), "{log}");
    execute(
        &db,
        "UPDATE urutan_parkir SET jatuh_tempo = now() - interval '5 minutes'
         WHERE pesanan_id = 'F' AND jatuh_tempo IS NOT NULL",
    )
    .await;
    let (_, doc) = status(&env).await;
    assert_eq!(overdue(&doc, "set_aside"), Some((2, "S".into())), "{doc}");

    // Running again, the worker tries F at once: applied once the handler
    // agrees, and nothing of F is overdue. The stranded rows cleared, the
    // gauge and status are quiet again.
    execute(&db, "DELETE FROM gagal").await;
    let run = worker(&env).await;
    wait_stored(&db, "F", 2).await;
    execute(
        &db,
        "DELETE FROM urutan_parkir WHERE shard = 3; DELETE FROM urutan_tahan",
    )
    .await;
    let mut run = run;
    run.wait_scrape("the overdue gauge at 0", Duration::from_secs(20), |s| {
        s.contains("urutan_orders_overdue")
            && ["set_aside", "gap", "parked"]
                .iter()
                .all(|k| gauge(s, k) == 0.0)
    })
    .await;
    let (_, doc) = status(&env).await;
    assert_eq!(doc["overdue"], serde_json::json!([]), "{doc}");
    let found = codes(&doc);
    assert!(!found.iter().any(|c| c.ends_with("_overdue")), "{found:?}");
    run.stop().await;
    wait_for("nothing parked", Duration::from_secs(5), || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM urutan_parkir")
            .fetch_one(&db)
            .await
            .is_ok_and(|n| n == 0)
    })
    .await;
}
