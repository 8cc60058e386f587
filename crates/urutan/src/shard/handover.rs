//! The moment a shard changes hands between replicas gracefully.
//!
//! A stopping replica handles what has reached it, cancels its consumer,
//! and only then acks (so that no new delivery is pushed to it, spending a
//! delivery on RabbitMQ 3.10, while a standby takes over). The broker makes
//! the standby active at that cancel. A delivery it had already sent the
//! stopping replica but that arrived after the cancel went out (a slow
//! link, a busy broker) would come back to the queue only when the stopping
//! replica closed its channel: behind the next versions the standby had
//! already applied, which were then recorded as stale instead of applied
//! (`tests/it/replicas.rs`, `a_delivery_still_on_its_way_…`).
//!
//! So the shard has a *handover lock*, a PostgreSQL advisory lock:
//! - the stopping replica takes it before its cancel, on a connection of
//!   its own (never a pooled one: the lock must end with the connection);
//!   after the cancel-ok, which comes after the last delivery the broker
//!   sent it, it handles those deliveries too, acks, and lets it go;
//! - a consumer waits for it (shared, at most [`WAIT_AT_MOST`]) before it
//!   handles the first delivery of its channel, the first thing it gets
//!   once it is active.
//!
//! A stopping replica that cannot take the lock (the database is away) does
//! not cancel: it acks and closes at once, so whatever arrives meanwhile
//! goes back to the front of the queue before any standby starts (on 3.10
//! at the cost of a delivery each).

use std::time::Duration;

use sqlx::{Connection, PgConnection, PgPool};
use tracing::{debug, warn};

/// How long a consumer waits for a stopping replica to finish its
/// handover: far longer than a handover takes (a round trip and the last
/// few deliveries), short enough that a stopping replica whose database
/// link went silent (its lock lives until PostgreSQL notices) does not stop
/// the shard for long.
pub(super) const WAIT_AT_MOST: Duration = Duration::from_secs(30);

// The two-key form of the lock (`pg_advisory_lock(int4, int4)`, the shard
// second) is a key space of its own, apart from the one-key (`bigint`)
// locks urutan takes per order and for the relay.
const TAKE: &str = "SELECT pg_advisory_lock(hashtext('urutan-shard-handover'), $1)";
const WAIT: &str = "SELECT pg_advisory_xact_lock_shared(hashtext('urutan-shard-handover'), $1)";

/// The handover lock of one shard, held by a stopping replica.
pub(super) struct Held {
    conn: PgConnection,
    shard: u16,
}

impl Held {
    /// Takes the lock of `shard` exclusively on a new connection (within
    /// `limit`); `None` (logged) if the database does not let it.
    pub(super) async fn take(pool: &PgPool, shard: u16, limit: Duration) -> Option<Self> {
        let take = async {
            let mut conn = PgConnection::connect_with(&pool.connect_options()).await?;
            sqlx::query(TAKE)
                .bind(i32::from(shard))
                .execute(&mut conn)
                .await?;
            Ok::<_, sqlx::Error>(conn)
        };
        match tokio::time::timeout(limit, take).await {
            Ok(Ok(conn)) => Some(Self { conn, shard }),
            Ok(Err(e)) => {
                warn!(shard, error = %e, "cannot take the shard's handover lock; acking and closing without a cancel");
                None
            }
            Err(_) => {
                warn!(
                    shard,
                    "taking the shard's handover lock took over {limit:?}; acking and closing without a cancel"
                );
                None
            }
        }
    }

    /// Lets the lock go by ending its connection.
    pub(super) async fn release(self) {
        debug!(shard = self.shard, "handover done");
        if tokio::time::timeout(Duration::from_secs(5), self.conn.close())
            .await
            .is_err()
        {
            warn!(
                shard = self.shard,
                "closing the handover connection took over 5 s; it ends with its socket"
            );
        }
    }
}

/// Waits (at most [`WAIT_AT_MOST`]) until no replica holds `shard`'s
/// handover lock. A failure or a timeout is logged and lets the consumer
/// go on: the lock only guards a graceful handover.
pub(super) async fn wait(pool: &PgPool, shard: u16) {
    let wait = async {
        let mut conn = pool.acquire().await?;
        let query = sqlx::query(WAIT).bind(i32::from(shard));
        match tokio::time::timeout(WAIT_AT_MOST, query.execute(&mut *conn)).await {
            Ok(done) => done.map(|_| true),
            Err(_) => {
                // The wait may still be under way on the server: never reuse it.
                conn.close_on_drop();
                Ok(false)
            }
        }
    };
    match wait.await {
        Ok(true) => {}
        Ok(false) => warn!(
            shard,
            "a stopping replica kept this shard's handover lock over {WAIT_AT_MOST:?}; consuming anyway"
        ),
        Err(e) => {
            warn!(shard, error = %e, "cannot look at the shard's handover lock; consuming anyway")
        }
    }
}
