//! The database's TCP connections write without Nagle's delay: sqlx 0.9.0
//! left `TCP_NODELAY` off (a statement written in two pieces then waited
//! ~40 ms for a delayed ACK; urutan worked around it until sqlx 0.9.1 set it
//! again). This test is the proof that the library now does it.

use std::time::{Duration, Instant};

use crate::common::TestEnv;

/// What Nagle costs when it is on: statements larger than one write wait
/// for the server's delayed ACK. With it off, each round trip of a 64 KiB
/// statement takes a few milliseconds here; with it on, about 40.
#[tokio::test]
async fn a_large_statement_is_not_held_back_by_nagle() {
    let env = TestEnv::new("nodelay_timing").await;
    let db = env.db().await;
    let mut conn = db.acquire().await.expect("a connection");
    let big = "x".repeat(64 * 1024);
    let mut took = Vec::new();
    for _ in 0..15 {
        let began = Instant::now();
        let n: i32 = sqlx::query_scalar("SELECT length($1::text)")
            .bind(&big)
            .fetch_one(&mut *conn)
            .await
            .expect("the statement");
        took.push(began.elapsed());
        assert_eq!(n, 64 * 1024);
    }
    took.sort();
    let median = took[took.len() / 2];
    assert!(
        median < Duration::from_millis(20),
        "a 64 KiB statement took {median:?} (median of 15): Nagle's algorithm holds it back"
    );
    drop(conn);
    db.close().await;
}
