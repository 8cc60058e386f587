//! The database's TCP connections write without Nagle's delay
//! (`src/store/nodelay.rs`): sqlx 0.9.0 leaves `TCP_NODELAY` off, and a
//! statement written in two pieces then waits ~40 ms for a delayed ACK.

use std::time::{Duration, Instant};

use crate::common::TestEnv;
use crate::proxy::Proxy;

/// The pool's connection has `TCP_NODELAY` on its own socket.
#[tokio::test]
async fn a_pooled_database_connection_has_nagle_off() {
    let env = TestEnv::new("nodelay_socket").await;
    let db = env.db().await;
    let mut conn = db.acquire().await.expect("a connection");
    let (local, peer): (i32, i32) = sqlx::query_as("SELECT inet_client_port(), inet_server_port()")
        .fetch_one(&mut *conn)
        .await
        .expect("the test database is reached over TCP");
    let local = u16::try_from(local).expect("a port");
    let peer = u16::try_from(peer).expect("a port");
    let socket = urutan::store::nodelay::socket_with_ports(local, peer)
        .expect("read this process's descriptors")
        .expect("the connection's socket is in this process");
    assert!(
        rustix::net::sockopt::tcp_nodelay(&socket).expect("read TCP_NODELAY"),
        "TCP_NODELAY is off on the database connection's socket"
    );
    drop(conn);
    db.close().await;
}

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

/// Behind a proxy the server reports the proxy's port, no socket of ours
/// matches, and batch statements stay small enough for a socket with Nagle
/// on (the proxy's upstream socket, in this very process, must not be taken
/// for ours).
#[tokio::test]
async fn behind_a_proxy_batch_statements_stay_small() {
    let env = TestEnv::new("nodelay_proxy").await;
    env.db().await.close().await;
    let proxy = Proxy::start("127.0.0.1:5432".parse().expect("addr")).await;
    let url = env.database_url().with(|u| {
        let _ = u.set_port(Some(proxy.addr.port()));
    });
    let db = urutan::store::connect(&url, 1)
        .await
        .expect("connect through the proxy");
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&db)
        .await
        .expect("a statement through the proxy");
    assert_eq!(one, 1);
    assert_eq!(
        urutan::store::nodelay::statement_limit(),
        urutan::store::nodelay::WITH_NAGLE,
        "a proxied connection (Nagle still on) must keep batch statements small"
    );
    db.close().await;
}
