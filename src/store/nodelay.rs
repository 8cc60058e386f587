//! Nagle's algorithm off on the database's TCP connections.
//!
//! sqlx 0.9.0 connects without `TCP_NODELAY` (a regression: sqlx issue
//! #4335, fixed upstream by pull request #4336, not in a release yet). With
//! Nagle on, a statement the client writes in more than one piece waits for
//! the server's delayed ACK, about 40 ms. sqlx does not hand out a
//! connection's socket, so right after connecting [`disable_nagle`] asks the
//! server which client port it sees (`inet_client_port()`), finds this
//! process's socket with that local port whose peer is the port urutan
//! connected to (through `/proc/self/fd`, working on a duplicate of the
//! descriptor from `pidfd_getfd`, so no unsafe code), and sets `TCP_NODELAY`
//! on it. Behind a proxy the server sees the proxy's port, and nothing
//! matches (a proxy in this very process, as in the tests, has a socket
//! with that local port, but its peer is the server, not the proxy).
//!
//! Where that cannot be done (not Linux, a proxy between urutan and the
//! server, a sandbox that refuses `pidfd_getfd`), the connection works as
//! before and batch statements stay small enough to be written in one piece
//! ([`statement_limit`]).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering};

use sqlx::PgConnection;
use tracing::{debug, warn};

/// Most bytes of parameters per batch statement while Nagle may be on for
/// some connection: a larger statement does not fit the socket's initial send
/// buffer, is written in two pieces, and the second waits for the server's
/// delayed ACK. Larger batches are then sent as several statements in one
/// transaction.
pub const WITH_NAGLE: usize = 8 * 1024;

/// Most bytes of parameters per batch statement once every connection has
/// Nagle off: one statement per batch at any `BATCH_MAX` in practice
/// (256 events of 2 KiB each).
const WITHOUT_NAGLE: usize = 512 * 1024;

/// Nothing known yet (no connection opened).
const UNKNOWN: u8 = 0;
/// Every connection opened so far writes without delay (Nagle off, or a
/// Unix socket).
const OFF_EVERYWHERE: u8 = 1;
/// At least one connection kept Nagle on.
const MAYBE_ON: u8 = 2;

static NAGLE: AtomicU8 = AtomicU8::new(UNKNOWN);

/// How many bytes of parameters one batch statement may carry.
pub fn statement_limit() -> usize {
    if NAGLE.load(Ordering::Relaxed) == OFF_EVERYWHERE {
        WITHOUT_NAGLE
    } else {
        WITH_NAGLE
    }
}

fn record(nagle_off: bool) {
    if nagle_off {
        // Never upgrades a connection that kept Nagle on.
        let _ = NAGLE.compare_exchange(
            UNKNOWN,
            OFF_EVERYWHERE,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    } else if NAGLE.swap(MAYBE_ON, Ordering::Relaxed) != MAYBE_ON {
        warn!(
            "could not turn Nagle's algorithm off on a database connection; \
             batch statements stay under {WITH_NAGLE} bytes"
        );
    }
}

/// Turns Nagle's algorithm off on `conn`'s socket, if it is a TCP socket
/// this process can find; `peer` is the port urutan connected to. Fails only
/// if the connection cannot answer a query (it is then useless anyway).
pub async fn disable_nagle(conn: &mut PgConnection, peer: u16) -> Result<(), sqlx::Error> {
    let client_port: Option<i32> = sqlx::query_scalar("SELECT inet_client_port()")
        .fetch_one(&mut *conn)
        .await?;
    let Some(local) = client_port.and_then(|p| u16::try_from(p).ok()) else {
        // A Unix socket: no Nagle.
        record(true);
        return Ok(());
    };
    match set_on_socket(local, peer) {
        Ok(true) => record(true),
        Ok(false) => {
            debug!(
                local,
                peer, "no socket of this process has these ports (a proxy?)"
            );
            record(false);
        }
        Err(error) => {
            debug!(%error, "cannot reach this connection's socket");
            record(false);
        }
    }
    Ok(())
}

/// Finds this process's TCP socket whose local port is `local` and whose
/// peer's port is `peer`, and sets `TCP_NODELAY` on it; `Ok(false)` if there
/// is none.
#[cfg(target_os = "linux")]
fn set_on_socket(local: u16, peer: u16) -> std::io::Result<bool> {
    let Some(fd) = socket_with_ports(local, peer)? else {
        return Ok(false);
    };
    // The duplicate shares the socket: the option holds for sqlx's descriptor.
    rustix::net::sockopt::set_tcp_nodelay(&fd, true)?;
    Ok(true)
}

/// A duplicate of this process's TCP socket with local port `local` and
/// peer port `peer`, if there is one.
#[cfg(target_os = "linux")]
pub fn socket_with_ports(local: u16, peer: u16) -> std::io::Result<Option<rustix::fd::OwnedFd>> {
    use rustix::process::{PidfdFlags, PidfdGetfdFlags, getpid, pidfd_getfd, pidfd_open};
    let me = pidfd_open(getpid(), PidfdFlags::empty())?;
    for entry in std::fs::read_dir("/proc/self/fd")? {
        let entry = entry?;
        let Some(number) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        // Only sockets ("socket:[inode]"); the link of a descriptor closed
        // meanwhile is simply gone.
        let is_socket = std::fs::read_link(entry.path())
            .is_ok_and(|target| target.to_string_lossy().starts_with("socket:"));
        if !is_socket {
            continue;
        }
        // A duplicate: if the number was closed and reused meanwhile, we get
        // whatever it is now, and the addresses below tell.
        let Ok(fd) = pidfd_getfd(&me, number, PidfdGetfdFlags::empty()) else {
            continue;
        };
        let ports = |addr: Option<rustix::net::SocketAddrAny>| {
            addr.and_then(|a| SocketAddr::try_from(a).ok())
                .map(|a| a.port())
        };
        let mine = ports(rustix::net::getsockname(&fd).ok());
        let theirs = ports(rustix::net::getpeername(&fd).ok().flatten());
        if mine == Some(local) && theirs == Some(peer) {
            return Ok(Some(fd));
        }
    }
    Ok(None)
}

#[cfg(not(target_os = "linux"))]
fn set_on_socket(_local: u16, _peer: u16) -> std::io::Result<bool> {
    Err(std::io::Error::other("only done on Linux"))
}
