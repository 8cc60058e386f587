//! A fault-injecting TCP proxy for tests: it forwards to one upstream address
//! and can be switched, at any moment and for every connection at once, to
//! - `Pass`: forward both ways;
//! - `Blackhole`: nothing gets through either way and the sockets stay open
//!   (a dead load balancer, a paused VM: no FIN, no RST). As with packets
//!   that vanish on a real network, TCP's retransmissions deliver what was
//!   held once the path works again: the bytes wait (and the senders' buffers
//!   fill up), they are not dropped, so a stream that survives the blackhole
//!   resumes intact; a close made meanwhile arrives only afterwards;
//! - `silence_open()`: the connections open now go silent for good, new ones
//!   pass (a load balancer or NAT that lost its flows);
//! - `delay(one_way, jitter)`: every byte arrives `one_way` (+ up to
//!   `jitter`) later, in order (the round trip grows by twice that);
//! - `limit(bytes_per_second)`: a bandwidth cap per direction and connection;
//! - `cut_open()`: close the connections open now, accept new ones;
//! - `reset()`: close every connection and refuse new ones (a node dying);
//! - and `retarget(addr)`: new connections go to another upstream, open ones
//!   stay where they are (a DNS name moved to a promoted standby).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use std::time::Instant;
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
    /// Where new connections go (`retarget` moves it).
    upstream: std::sync::Mutex<SocketAddr>,
    blackhole: AtomicBool,
    /// Cancelled by `silence_open`: the connections open then stop forwarding.
    silenced: std::sync::Mutex<CancellationToken>,
    open: AtomicUsize,
    /// One-way delay and jitter in microseconds, bandwidth in bytes/s (0: none).
    delay_us: AtomicU64,
    jitter_us: AtomicU64,
    rate: AtomicU64,
    /// Cancelled by `cut_open`: the connections open then are closed.
    cut: std::sync::Mutex<CancellationToken>,
    accepted: AtomicUsize,
    /// Connections accepted whose upstream could not be reached (closed at once).
    unreachable: AtomicUsize,
    /// Chunks forwarded (each about one write of a peer: a round trip's half).
    chunks: AtomicUsize,
    /// Cancelled by `reset`: ends the listener and every connection.
    dead: CancellationToken,
}

impl Proxy {
    /// Listens on a free local port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        let shared = Arc::new(Shared {
            upstream: std::sync::Mutex::new(upstream),
            blackhole: AtomicBool::new(false),
            silenced: Default::default(),
            delay_us: AtomicU64::new(0),
            jitter_us: AtomicU64::new(0),
            rate: AtomicU64::new(0),
            cut: Default::default(),
            open: AtomicUsize::new(0),
            accepted: AtomicUsize::new(0),
            unreachable: AtomicUsize::new(0),
            chunks: AtomicUsize::new(0),
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
                let upstream = *accept.upstream.lock().expect("lock");
                let Ok(server) = TcpStream::connect(upstream).await else {
                    accept.unreachable.fetch_add(1, Ordering::SeqCst);
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

    /// Every byte from now on arrives `one_way` plus up to `jitter` later
    /// (never reordered); zero for both ends the delay.
    pub fn delay(&self, one_way: Duration, jitter: Duration) {
        let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.shared.delay_us.store(us(one_way), Ordering::SeqCst);
        self.shared.jitter_us.store(us(jitter), Ordering::SeqCst);
    }

    /// At most `bytes_per_second` per direction and connection (0: no cap).
    pub fn limit(&self, bytes_per_second: u64) {
        self.shared.rate.store(bytes_per_second, Ordering::SeqCst);
    }

    /// Closes the connections open now; new ones are accepted.
    pub fn cut_open(&self) {
        let mut cut = self.shared.cut.lock().expect("lock");
        cut.cancel();
        *cut = CancellationToken::new();
    }

    /// Closes every connection and the listener, for good.
    pub fn reset(&self) {
        self.shared.dead.cancel();
    }

    /// Connections made from now on go to `upstream`; the open ones are
    /// left as they are.
    pub fn retarget(&self, upstream: SocketAddr) {
        *self.shared.upstream.lock().expect("lock") = upstream;
    }

    /// Connections open through the proxy now.
    pub fn open(&self) -> usize {
        self.shared.open.load(Ordering::SeqCst)
    }

    /// Chunks forwarded in either direction since the start.
    pub fn chunks(&self) -> usize {
        self.shared.chunks.load(Ordering::SeqCst)
    }

    /// Connections accepted since the start.
    pub fn accepted(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Connections closed at once since the start because their upstream
    /// could not be reached (after `retarget` to an address nobody listens on).
    pub fn unreachable(&self) -> usize {
        self.shared.unreachable.load(Ordering::SeqCst)
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
    let cut = shared.cut.lock().expect("lock").clone();
    tokio::select! {
        _ = shared.dead.cancelled() => {}
        _ = cut.cancelled() => {}
        _ = pump(client_read, server_write, &shared, &silenced) => {}
        _ = pump(server_read, client_write, &shared, &silenced) => {}
    }
    shared.open.fetch_sub(1, Ordering::SeqCst);
}

/// Copies one direction until either side closes; in blackhole mode nothing
/// is read or forwarded until it ends, once silenced the bytes are read and
/// dropped. Reading and writing are separate loops joined by a queue, so a
/// delay postpones each chunk without slowing the stream.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    shared: &Shared,
    silenced: &CancellationToken,
) {
    let (queue, mut queued) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let read = async move {
        let mut buf = vec![0u8; 64 * 1024];
        let mut last_due = Instant::now();
        let blackholed = || shared.blackhole.load(Ordering::SeqCst) && !silenced.is_cancelled();
        loop {
            while blackholed() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            // Read just as the blackhole began: held until it ends.
            while blackholed() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            if silenced.is_cancelled() {
                continue;
            }
            shared.chunks.fetch_add(1, Ordering::SeqCst);
            let jitter = shared.jitter_us.load(Ordering::SeqCst);
            let extra = if jitter == 0 {
                0
            } else {
                rand::random::<u64>() % jitter
            };
            let delay = Duration::from_micros(shared.delay_us.load(Ordering::SeqCst) + extra);
            // Never before the previous chunk: bytes keep their order.
            last_due = last_due.max(Instant::now() + delay);
            if queue.send((last_due, buf[..n].to_vec())).is_err() {
                return;
            }
        }
    };
    let write = async move {
        while let Some((due, chunk)) = queued.recv().await {
            tokio::time::sleep_until(due.into()).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
            let rate = shared.rate.load(Ordering::SeqCst);
            if rate > 0 {
                let pace = Duration::from_secs_f64(chunk.len() as f64 / rate as f64);
                tokio::time::sleep(pace).await;
            }
        }
    };
    // Joined, not raced: at the end of the stream the writer still delivers
    // what the reader queued (the queue closes when the reader ends).
    tokio::join!(read, write);
}
