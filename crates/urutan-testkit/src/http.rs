//! A tiny HTTP/1.0 GET for the `/metrics`, `/healthz` and `/readyz`
//! endpoints, shared by the integration tests ([`crate::fixtures`]) and
//! the fault engine ([`crate::faults::procs`]).

use std::net::SocketAddr;
use std::time::Duration;

/// `GET path` on `addr` within `bound`: (status, body); status 0 when it
/// failed or took longer.
pub async fn get(addr: SocketAddr, path: &str, bound: Duration) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        let req = format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n");
        stream.write_all(req.as_bytes()).await.ok()?;
        let mut buf = Vec::new();
        stream.read_to_end(&mut buf).await.ok()?;
        let text = String::from_utf8_lossy(&buf).into_owned();
        let status = text.split_whitespace().nth(1)?.parse().ok()?;
        let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
        Some((status, body))
    };
    tokio::time::timeout(bound, attempt)
        .await
        .ok()
        .flatten()
        .unwrap_or((0, String::new()))
}
