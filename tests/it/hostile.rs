//! Hostile producers against the real broker and database: what anyone with
//! write on `pesanan` can send (a header nested 20,000 levels deep, a
//! `message_id` that is not UTF-8, a `versi` beyond 2^53 - 1, `data` that
//! `jsonb` refuses) is dead-lettered with a contract reason on its first
//! delivery, by a pool that keeps running on the same broker connection,
//! while every other order, on every shard, is applied.

use std::collections::BTreeSet;
use std::time::Duration;

use sqlx::{Connection, PgPool};
use urutan::message::{EntityHeader, Envelope, Rejection, decode};
use urutan::store::StoreError;

use crate::common::*;
use crate::{raw_amqp, wire};

const SHARDS: u16 = 2;

/// One valid event for each of 20 orders (both shards get some) at `versi`.
fn good(versi: i64) -> Vec<Msg> {
    (0..20)
        .map(|i| Msg::event(&format!("G-{i:02}"), versi))
        .collect()
}

/// A contract body for `id` at version 1.
fn body(id: &str) -> Vec<u8> {
    format!(r#"{{"id":"{id}","status":"baru","versi":1}}"#).into_bytes()
}

/// `urutan run` as a child process: a crash is its exit, not the test
/// binary's, and its metrics are its own.
async fn start_pool(env: &TestEnv) -> UrutanProcess {
    let mut vars = env.process_env(SHARDS);
    vars.push(("RUST_LOG", "warn".to_owned()));
    let mut pool = UrutanProcess::start("run", &vars);
    pool.wait_ready().await;
    pool
}

/// A pool under attack: see [`between_good_rounds`].
struct Attacked {
    pool: UrutanProcess,
    /// The test's own broker connection (for the DLQ).
    conn: lapin::Connection,
    /// The vhost's broker connections before the hostile messages.
    before: BTreeSet<String>,
    /// Its connection is one of `before`: kept open to the end.
    _publisher: Publisher,
}

/// Starts the pool ([`start_pool`]), publishes v1 of the good orders, then
/// `hostile` (each the AMQP properties and the body of a message a hostile
/// producer builds by hand, sent raw to `pesanan` with key `pesanan.test`),
/// then v2 of the good orders.
async fn between_good_rounds(env: &TestEnv, hostile: &[(Vec<u8>, Vec<u8>)]) -> Attacked {
    let pool = start_pool(env).await;
    let publisher = env.publisher().await;
    let conn = env.broker().await;
    publisher.send_all(&good(1)).await;
    let before = connections(&env.vhost);
    for (properties, body) in hostile {
        raw_amqp::publish_raw_to(&env.vhost, "pesanan", "pesanan.test", properties, body).await;
    }
    publisher.send_all(&good(2)).await;
    Attacked {
        pool,
        conn,
        before,
        _publisher: publisher,
    }
}

impl Attacked {
    /// After the hostile messages: the pool runs, never reconnected, kept
    /// every broker connection it had in `vhost`, and counted `n` dead
    /// letters for `reason`.
    async fn assert_same_connection(&mut self, vhost: &str, reason: &str, n: f64) {
        let before = &self.before;
        self.pool.assert_running();
        let scrape = self.pool.scrape().await;
        let label = format!("reason=\"{reason}\"");
        assert_eq!(
            metric_sum(&scrape, "urutan_dead_letters_total", &[&label]),
            n,
            "{scrape}"
        );
        assert_eq!(
            metric_sum(&scrape, "urutan_broker_reconnects_total", &[]),
            0.0
        );
        assert_eq!(metric_sum(&scrape, "urutan_retries_total", &[]), 0.0);
        let after = connections(vhost);
        assert!(
            before.is_subset(&after),
            "a connection was dropped: before {before:?}, after {after:?}"
        );
    }
}

/// The broker's connections to `vhost` (their Erlang pids).
fn connections(vhost: &str) -> BTreeSet<String> {
    let out = sh(
        "rabbitmqctl",
        &[
            "-q",
            "list_connections",
            "--no-table-headers",
            "vhost",
            "pid",
        ],
    );
    out.lines()
        .filter_map(|l| l.split_once('\t'))
        .filter(|(v, _)| *v == vhost)
        .map(|(_, pid)| pid.to_owned())
        .collect()
}

/// (reason, message_id, shard) of every dead-letter record, oldest first.
async fn dead_letters(db: &PgPool) -> Vec<(String, Option<String>, i32)> {
    sqlx::query_as("SELECT reason, message_id, shard FROM urutan_dead_letter ORDER BY id")
        .fetch_all(db)
        .await
        .expect("dead-letter records")
}

async fn wait_records(db: &PgPool, n: usize) {
    wait_for(
        &format!("{n} dead-letter records"),
        Duration::from_secs(60),
        || async move { dead_letters(db).await.len() == n },
    )
    .await;
}

/// The critical finding of issue 29: one header nested 20,000 levels deep
/// (about 100 KB, under `frame_max`) used to overflow the stack of lapin's
/// reading thread in every worker that took it, and `urutan dlq` after
/// them. Now it is refused as `headers_too_deep` on its first delivery
/// (as are 40 levels, where the codec keeps the rest as bytes, and 17,
/// one past the limit), recorded, and the tools read it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_nested_20000_levels_deep_is_dead_lettered_and_the_pool_keeps_running() {
    let env = TestEnv::new("hostile_deep").await;
    let db = env.db().await;
    let deep = |levels: usize, id: &str| {
        // Mostly arrays (5 bytes a level), a table every tenth level.
        let value = wire::nested(levels, |i| i % 10 != 0, &wire::text(b"leaf"));
        let headers = wire::table(&[
            (b"x-pesanan-id".as_slice(), wire::text(id.as_bytes())),
            (b"x-deep".as_slice(), value),
        ]);
        (
            wire::properties(&headers, format!("deep-{levels}").as_bytes()),
            body(id),
        )
    };
    let hostile: Vec<_> = [(20_000, "D-1"), (40, "D-2"), (17, "D-3"), (16, "D-4")]
        .into_iter()
        .map(|(levels, id)| deep(levels, id))
        .collect();
    let mut hit = between_good_rounds(&env, &hostile).await;

    // Everything valid applied (16 levels is within the contract), on both
    // shards, after the hostile messages.
    wait_applied(&db, 41, Duration::from_secs(60)).await;
    wait_records(&db, 3).await;
    let records = dead_letters(&db).await;
    let mut refused: Vec<_> = records
        .iter()
        .map(|(reason, id, _)| (reason.as_str(), id.as_deref().unwrap_or("?")))
        .collect();
    refused.sort_unstable();
    assert_eq!(
        refused,
        [
            ("headers_too_deep", "deep-17"),
            ("headers_too_deep", "deep-20000"),
            ("headers_too_deep", "deep-40"),
        ]
    );
    let shards: Vec<i32> = sqlx::query_scalar(
        "SELECT DISTINCT shard FROM pesanan_riwayat WHERE versi = 2 AND pesanan_id LIKE 'G-%'
         ORDER BY shard",
    )
    .fetch_all(&db)
    .await
    .expect("shards");
    assert_eq!(shards, [0, 1], "both shards flowed");
    // The record keeps the headers, cut at the contract's depth.
    let headers: String = sqlx::query_scalar(
        "SELECT headers::text FROM urutan_dead_letter WHERE message_id = 'deep-20000'",
    )
    .fetch_one(&db)
    .await
    .expect("the record's headers");
    assert!(headers.contains(urutan::dead_letter::TOO_DEEP), "{headers}");
    assert!(headers.contains(r#""x-pesanan-id": "D-1""#), "{headers}");
    hit.assert_same_connection(&env.vhost, "headers_too_deep", 3.0)
        .await;
    assert_eq!(queue_len(&hit.conn, "pesanan.dlq").await, 3);

    // The operator's tools read the DLQ with the message in it.
    let listed = urutan(&env, &[], &["dlq", "list", "--json"]).await;
    assert!(listed.ok(), "{listed}");
    let listed: serde_json::Value = serde_json::from_str(&listed.stdout).expect("JSON");
    let reasons: Vec<_> = listed["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| m["reason"].as_str().unwrap_or("?").to_owned())
        .collect();
    assert_eq!(reasons, ["headers_too_deep"; 3], "{listed}");
    let purged = urutan(&env, &[], &["dlq", "purge", "--yes"]).await;
    assert!(purged.ok(), "{purged}");
    assert_eq!(queue_len(&hit.conn, "pesanan.dlq").await, 0);
    hit.pool.stop().await;
}

/// A `message_id` that is not UTF-8 used to fail lapin's frame parser and
/// drop the pool's broker connection for every shard. Now the codec reads
/// it lossily and urutan refuses it (`invalid_message_id`, as an id with
/// control characters), on the same connection, delivered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_id_that_is_not_utf8_is_dead_lettered_on_the_same_connection() {
    let env = TestEnv::new("hostile_msgid").await;
    let db = env.db().await;
    let ids: [(&[u8], &str); 3] = [
        (b"id-\xff\xfe", "B-1"),
        (&[0xff; 255], "B-2"),
        (b"id-\x1b]52;c;aGk=\x07", "B-3"), // a clipboard write
    ];
    let hostile: Vec<_> = ids
        .into_iter()
        .map(|(message_id, order)| {
            let headers =
                wire::table(&[(b"x-pesanan-id".as_slice(), wire::text(order.as_bytes()))]);
            (wire::properties(&headers, message_id), body(order))
        })
        .collect();
    let mut hit = between_good_rounds(&env, &hostile).await;

    wait_applied(&db, 40, Duration::from_secs(60)).await;
    wait_records(&db, 3).await;
    for (reason, message_id, _) in dead_letters(&db).await {
        assert_eq!(reason, "invalid_message_id");
        assert_eq!(message_id, None, "a lossy id is no message id");
    }
    assert_eq!(
        count(&db, "SELECT count(*) FROM pesanan WHERE id LIKE 'B-%'").await,
        0
    );
    hit.assert_same_connection(&env.vhost, "invalid_message_id", 3.0)
        .await;
    // Each was delivered once: no reconnect handed it out again.
    let dead = drain_dlq_expecting(&hit.conn, 3, Duration::from_secs(10)).await;
    assert_eq!(dead.len(), 3);
    for d in &dead {
        assert_eq!(
            urutan::broker::delivery::previous_deliveries(&d.delivery),
            0
        );
    }
    hit.pool.stop().await;
}

/// `versi` beyond 2^53 - 1 (contract section 2) and `data` that `jsonb`
/// refuses (a lone surrogate, a number `numeric` cannot hold) used to pass
/// decoding, fail the apply on every delivery and end as `delivery_limit`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versi_and_data_postgresql_refuses_are_contract_violations() {
    let env = TestEnv::new("hostile_body").await;
    let mut settings = env.settings(1);
    settings.delivery_limit = 2;
    let pool = RunningPool::start(settings).await;
    pool.wait_ready().await;
    let raw = |id: &str, versi: &str, data: &str| {
        let mut msg = Msg::event(id, 1);
        msg.message_id = Some(format!("{id}-m"));
        msg.body = format!(r#"{{"id":"{id}","status":"baru","versi":{versi},"data":{data}}}"#)
            .into_bytes();
        msg
    };
    let cases = [
        (
            raw("V-1", "9007199254740992", "null"),
            Some("invalid_versi"),
        ),
        (
            raw("V-2", "9223372036854775807", "null"),
            Some("invalid_versi"),
        ),
        (raw("V-3", "9007199254740991", "null"), None),
        (raw("S-1", "1", r#""\ud800""#), Some("invalid_json")),
        (raw("S-2", "1", r#"{"k":"\udc00x"}"#), Some("invalid_json")),
        (raw("N-1", "1", "1e1000000"), Some("invalid_json")),
        (raw("N-2", "1", "[0.0e-99999]"), Some("invalid_json")),
        (raw("OK", "1", r#"{"e":"\ud83d\ude00","n":1e300}"#), None),
    ];
    let msgs: Vec<Msg> = cases.iter().map(|(m, _)| m.clone()).collect();
    env.publisher().await.send_all(&msgs).await;

    let db = env.db().await;
    wait_applied(&db, 2, Duration::from_secs(60)).await;
    wait_records(&db, 6).await;
    let mut got: Vec<_> = dead_letters(&db)
        .await
        .into_iter()
        .map(|(reason, id, _)| (id.unwrap_or_default(), reason))
        .collect();
    got.sort_unstable();
    let mut want: Vec<_> = cases
        .iter()
        .filter_map(|(m, r)| Some((m.message_id.clone()?, (*r)?.to_owned())))
        .collect();
    want.sort_unstable();
    assert_eq!(got, want);
    let stored: Option<i64> = sqlx::query_scalar("SELECT versi FROM pesanan WHERE id = 'V-3'")
        .fetch_optional(&db)
        .await
        .expect("V-3");
    assert_eq!(stored, Some(9_007_199_254_740_991));
    pool.stop().await;
}

/// Each `data` literal: what decoding says and what PostgreSQL says agree
/// (decoded iff `SELECT $1::jsonb` accepts it), at the edges of `numeric`
/// and of UTF-16 escapes, and on random numbers around them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jsonb_refusals_match_postgresql() {
    let mut pg = sqlx::PgConnection::connect(&format!("{PG_BASE}/postgres"))
        .await
        .expect("connect PostgreSQL");
    let mut literals: Vec<String> = [
        r#""\ud800""#,
        r#""\udc00""#,
        r#""\ud800\udc00""#,
        r#""\udbff\udfff""#,
        r#""\ud800x""#,
        r#""\ud800\ud800""#,
        r#""\\ud800""#,
        r#"{"\udfff":1}"#,
        r#""\u0000""#,
        r#""\\u0000""#,
        "-0",
        "1E+0001",
        "0e1073741822",
        "0e1073741823",
        "0e-1073741823",
        "1e99999999999999999999",
    ]
    .map(str::to_owned)
    .to_vec();
    for (digits, point, exponents) in [
        (
            "1",
            "",
            [131_070, 131_071, 131_072, -16_382, -16_383, -16_384],
        ),
        (
            "12.5",
            "",
            [131_068, 131_069, 131_070, -16_381, -16_382, -16_383],
        ),
        (
            "0.001",
            "",
            [131_073, 131_074, 131_075, -16_379, -16_380, -16_381],
        ),
        ("0", ".0", [1_000_000, -16_381, -16_382, -16_383, 5, -5]),
    ] {
        for e in exponents {
            literals.push(format!("{digits}{point}e{e}"));
            literals.push(format!("-{digits}{point}E{e:+}"));
        }
    }
    for n in [131_071, 131_072, 131_073] {
        literals.push(format!("1{}", "0".repeat(n - 1)));
    }
    for n in [16_382, 16_383, 16_384] {
        literals.push(format!("0.{}", "5".repeat(n)));
        literals.push(format!("[1.{}1]", "0".repeat(n - 1)));
    }
    for _ in 0..200 {
        let int = rand::random_range(0..3_000u32);
        let frac = "7".repeat(rand::random_range(0..20_000usize));
        let e = rand::random_range(-20_000..140_000i64);
        literals.push(format!(
            "{int}.{}e{e}",
            if frac.is_empty() { "0" } else { &frac }
        ));
    }
    for data in &literals {
        let text = format!(r#"{{"id":"P","status":"s","versi":1,"data":{data}}}"#);
        let env = Envelope {
            message_id: Some("m"),
            entity_header: EntityHeader::Text(b"P"),
            delivery_mode: Some(2),
            timestamp: None,
            body: text.as_bytes(),
            headers_bytes: 0,
            headers_depth: 0,
        };
        let decoded = decode(&env, usize::MAX);
        let stored = sqlx::query("SELECT $1::text::jsonb")
            .bind(data)
            .execute(&mut pg)
            .await;
        let shown = &data[..data.len().min(60)];
        match (&decoded, &stored) {
            (Ok(_), Ok(_)) => {}
            (Err(Rejection::InvalidJson | Rejection::NulCharacter), Err(_)) => {}
            _ => panic!(
                "{shown} ({} bytes): decode {:?}, PostgreSQL {:?}",
                data.len(),
                decoded.err(),
                stored.err()
            ),
        }
    }
}

/// PostgreSQL's program limits (SQLSTATE class 54, e.g. 54001 `stack depth
/// limit exceeded`) are the data's fault: refused, never held as transient
/// (a held message would wedge its shard forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_limit_is_refused_not_transient() {
    let mut pg = sqlx::PgConnection::connect(&format!("{PG_BASE}/postgres"))
        .await
        .expect("connect PostgreSQL");
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let error = sqlx::query("SELECT $1::text::jsonb")
        .bind(deep)
        .execute(&mut pg)
        .await
        .expect_err("too deep for PostgreSQL");
    let code = match &error {
        sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
        _ => None,
    };
    assert_eq!(code.as_deref(), Some("54001"), "{error}");
    assert!(
        matches!(StoreError::from(error), StoreError::Refused(_)),
        "class 54 must be refused"
    );
}
