//! A fault-injecting TCP proxy for tests: it forwards to one upstream address
//! and can be switched, at any moment and for every connection at once, to
//! - `Pass`: forward both ways;
//! - `Blackhole`: swallow every byte both ways and keep the sockets open (a
//!   dead load balancer, a paused VM: no FIN, no RST);
//! - `silence_open()`: the connections open now go silent for good, new ones
//!   pass (a load balancer or NAT that lost its flows);
//! - and `reset()`: close every connection and refuse new ones (a node dying).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Pass,
    Blackhole,
}

pub struct Proxy {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
}

struct Shared {
    blackhole: AtomicBool,
    /// Cancelled by `silence_open`: the connections open then stop forwarding.
    silenced: std::sync::Mutex<CancellationToken>,
    open: AtomicUsize,
    accepted: AtomicUsize,
    /// Cancelled by `reset`: ends the listener and every connection.
    dead: CancellationToken,
}

impl Proxy {
    /// Listens on a free local port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        let shared = Arc::new(Shared {
            blackhole: AtomicBool::new(false),
            silenced: Default::default(),
            open: AtomicUsize::new(0),
            accepted: AtomicUsize::new(0),
            dead: CancellationToken::new(),
        });
        let accept = shared.clone();
        tokio::spawn(async move {
            loop {
                let client = tokio::select! {
                    _ = accept.dead.cancelled() => return,
                    client = listener.accept() => client,
                };
                let Ok((client, _)) = client else { continue };
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                accept.accepted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(forward(client, server, accept.clone()));
            }
        });
        Self { addr, shared }
    }

    pub fn set(&self, mode: Mode) {
        self.shared
            .blackhole
            .store(mode == Mode::Blackhole, Ordering::SeqCst);
    }

    /// The connections open now swallow every byte from here on; connections
    /// made later pass.
    pub fn silence_open(&self) {
        let mut silenced = self.shared.silenced.lock().expect("lock");
        silenced.cancel();
        *silenced = CancellationToken::new();
    }

    /// Closes every connection and the listener, for good.
    pub fn reset(&self) {
        self.shared.dead.cancel();
    }

    /// Connections open through the proxy now.
    pub fn open(&self) -> usize {
        self.shared.open.load(Ordering::SeqCst)
    }

    /// Connections accepted since the start.
    pub fn accepted(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.dead.cancel();
    }
}

async fn forward(client: TcpStream, server: TcpStream, shared: Arc<Shared>) {
    shared.open.fetch_add(1, Ordering::SeqCst);
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let silenced = shared.silenced.lock().expect("lock").clone();
    tokio::select! {
        _ = shared.dead.cancelled() => {}
        _ = pump(client_read, server_write, &shared, &silenced) => {}
        _ = pump(server_read, client_write, &shared, &silenced) => {}
    }
    shared.open.fetch_sub(1, Ordering::SeqCst);
}

/// Copies one direction until either side closes; in blackhole mode the
/// bytes are read and dropped.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    shared: &Shared,
    silenced: &CancellationToken,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if shared.blackhole.load(Ordering::SeqCst) || silenced.is_cancelled() {
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
