//! `urutan relay`: moves outbox rows to the `pesanan` exchange, at least
//! once, in order per aggregate.
//!
//! Invariants:
//! - one active relay per topology prefix: it holds a PostgreSQL session
//!   advisory lock on the same connection that selects and marks rows, so
//!   losing the connection loses both together; standbys poll the lock every
//!   second and take over as soon as the holder's session ends;
//! - rows are read in `id` order and published in waves that hold at most
//!   one row per aggregate; a wave's confirms are awaited before the next
//!   wave, and a `basic.nack` or `basic.return` stops the batch, so no row
//!   of an aggregate is ever published for the first time after a later one;
//! - except a row that cannot be published (contract section 4): one that
//!   breaks the contract's section 2 ([`super::check`]: routing key, entity
//!   id, body, size), one the broker returns as unroutable (routing key
//!   outside `<prefix>.#`), or one the broker refuses by closing the channel
//!   or the connection. It is set aside (`unroutable_at`, `alasan_sisih`,
//!   `unroutable_reason`: migrations 0017 and 0038), never retried until an
//!   operator clears the mark, and the rows behind it, its aggregate's
//!   included, go on (docs/security.md). No input panics the relay;
//! - a refusal is not an outage: the row is set aside, the relay connects
//!   again, and when several rows were in flight it publishes them one at a
//!   time until the broker names the one; its backoff grows until a session
//!   gets something done, so nothing makes it spin;
//! - `dikirim_pada` is set only for confirmed rows, in the transaction that
//!   locked them; anything else stays unsent and is published again (the
//!   worker absorbs the duplicate by message id).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lapin::options::ConfirmSelectOptions;
use lapin::{Channel, Connection};
use sqlx::postgres::PgListener;
use sqlx::{Connection as _, PgConnection};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::check::{self, Candidate, SetAside};
use super::publish::{Row, publish_waves};
use crate::broker::{self, BrokerError, Names, call};
use crate::config::{SecretUrl, Settings};
use crate::heal::{self, WrongSetting};
use crate::health::Health;
use crate::metrics as m;
use crate::reshard::handoff;
use crate::retry;
use crate::store::{IdPartitioned, pipeline};

/// Pause between two purges of sent rows.
const PURGE_EVERY: Duration = Duration::from_secs(300);
/// How often the backlog gauge is refreshed while busy.
const BACKLOG_EVERY: Duration = Duration::from_secs(1);

/// Relay-only settings (the shared ones come from [`Settings`]).
#[derive(Debug, Clone)]
pub struct RelaySettings {
    /// Outbox rows read and published per transaction.
    pub relay_batch: i64,
    /// How long sent outbox rows are kept before they are purged.
    pub outbox_retention: Duration,
}

impl Default for RelaySettings {
    fn default() -> Self {
        Self {
            relay_batch: 500,
            outbox_retention: Duration::from_secs(7 * 86_400),
        }
    }
}

/// A fault-injection callback run after a batch was confirmed and before it
/// is marked sent (a crash there must only cause duplicates).
pub type AfterPublish = Arc<dyn Fn() + Send + Sync>;

/// Fault injection for `urutan relay` (crash drills): with
/// `URUTAN_FAULT_ABORT_AFTER_PUBLISH` set, the process aborts after the
/// first confirmed batch, before marking it sent. Unset: no hook.
pub fn after_publish_from_env() -> Option<AfterPublish> {
    fn abort() {
        std::process::abort()
    }
    std::env::var_os("URUTAN_FAULT_ABORT_AFTER_PUBLISH").map(|_| Arc::new(abort) as AfterPublish)
}

/// Why one relay session ended; all of them are retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("broker: {0}")]
    Broker(#[from] BrokerError),
    #[error("cannot open an epoch: {0}")]
    Epoch(#[from] handoff::EpochError),
    #[error("the broker connection was lost")]
    ConnectionLost,
    /// The broker closed the channel or the connection because of outbox
    /// rows being published (a frame or precondition error): not an outage.
    #[error("the broker refused outbox row(s) {ids:?}: {said}")]
    Refused { ids: Vec<i64>, said: String },
    /// `ENTITY` or `DATABASE_SCHEMA` name another pipeline than the
    /// database holds (see `store::pipeline`): no retry can fix it.
    #[error("{0}")]
    Setting(String),
}

/// What the relay keeps from one session to the next.
#[derive(Debug, Default)]
struct Carry {
    /// An earlier session got through to relaying: its broker connection is
    /// gone, so the next one is a reconnect.
    was_active: bool,
    /// Rows in flight when the broker refused one of them without saying
    /// which: published one at a time until it does.
    suspects: HashSet<i64>,
}

/// What one session got done.
#[derive(Debug, Default)]
struct Done {
    /// Connected to both and ready to relay.
    active: bool,
    /// A batch went through (or nothing was waiting): its next failure is a
    /// new one. Connecting is not enough: a session that fails at its first
    /// batch, again and again, must back off, not spin.
    progressed: bool,
}

/// The relay: run it with [`Relay::run`] until shutdown.
pub struct Relay {
    pub settings: Settings,
    pub relay: RelaySettings,
    pub after_publish: Option<AfterPublish>,
    /// Ready while this relay can reach both the database and the broker.
    pub health: Arc<Health>,
}

impl Relay {
    /// Relays until `shutdown`; the batch in progress is finished first.
    /// Stops early, logging the one line that names the setting, when
    /// `ENTITY` or `DATABASE_SCHEMA` name another pipeline than the
    /// database holds (see [`Self::run_checked`]).
    pub async fn run(self, shutdown: CancellationToken) {
        if let Err(wrong) = self.run_checked(shutdown).await {
            tracing::error!("{wrong}");
        }
    }

    /// [`Self::run`], returning the wrong setting it stopped on (`urutan
    /// relay` exits 2 with it).
    pub async fn run_checked(self, shutdown: CancellationToken) -> Result<(), WrongSetting> {
        let mut backoff = retry::backoff();
        let mut carry = Carry::default();
        while !shutdown.is_cancelled() {
            let mut done = Done::default();
            let result = self.session(&shutdown, &mut carry, &mut done).await;
            carry.was_active |= done.active;
            if done.progressed {
                // The next failure is a new one: it starts from a short delay.
                backoff = retry::backoff();
            }
            self.health.broker_down();
            match result {
                Ok(()) => return Ok(()),
                Err(RelayError::Setting(line)) => return Err(WrongSetting(line)),
                // Logged with its rows where it happened; the backoff goes on
                // growing (no batch went through), so a broker that refuses
                // row after row is never met with a reconnect storm.
                Err(RelayError::Refused { .. }) => {
                    let delay = retry::next_delay(&mut backoff);
                    if !retry::sleep_unless_stopped(delay, &shutdown).await {
                        return Ok(());
                    }
                }
                Err(e) => {
                    self.health.set_database(false);
                    self.outage(&e);
                    let delay = retry::next_delay(&mut backoff);
                    if !retry::sleep_unless_stopped(delay, &shutdown).await {
                        return Ok(());
                    }
                }
            }
        }
        Ok(())
    }

    /// Logs `e` once per change of the service's state (see `heal`): the
    /// rows stay unsent until it is back.
    fn outage(&self, e: &RelayError) {
        let broker = heal::broker_outage(&self.settings.amqp_url);
        match e {
            RelayError::Database(e) | RelayError::Epoch(handoff::EpochError::Database(e)) => {
                heal::database_outage(&self.settings.database_url).failed(&heal::database_cause(e));
            }
            RelayError::Broker(e) | RelayError::Epoch(handoff::EpochError::Broker(e)) => {
                broker.failed(&heal::broker_cause(e));
            }
            other => broker.failed(&heal::one_line(&other.to_string())),
        }
    }

    /// One life of the relay: become the active relay, then pump.
    /// Says in `done` what it got done; counts the broker connection in
    /// `urutan_broker_reconnects_total` if an earlier session was active.
    async fn session(
        &self,
        shutdown: &CancellationToken,
        carry: &mut Carry,
        done: &mut Done,
    ) -> Result<(), RelayError> {
        let url = &self.settings.database();
        let mut db = PgConnection::connect(url.expose()).await?;
        self.health.set_database(true);
        // Before anything is published or marked: the pipeline this
        // database holds must be the one these settings name.
        let found = pipeline::look(&mut db, &self.settings).await?;
        if let Some(refusal) = found.refusal() {
            return Err(RelayError::Setting(refusal));
        }
        if !acquire_lock(&mut db, &self.settings.topology_prefix, shutdown).await? {
            return Ok(()); // shutdown while standby
        }
        info!("active relay (holding the outbox lock)");
        let conn = broker::connect(&self.settings.broker(), "urutan relay").await?;
        if carry.was_active {
            metrics::counter!(crate::metrics::BROKER_RECONNECTS_TOTAL).increment(1);
            info!("reconnected to the broker");
        }
        // A broker restart may have changed the ring: mark every shard
        // before publishing anything routed by it (see `handoff`).
        let names = self.settings.names();
        handoff::open_epoch(&mut db, &conn, &names, "relay connected").await?;
        let channel = call("channel.open", conn.create_channel()).await?;
        call(
            "confirm.select",
            channel.confirm_select(ConfirmSelectOptions::default()),
        )
        .await?;
        self.health.broker_up(0);
        let mut listener = listen(url, &self.settings.database_schema).await?;
        done.active = true;
        heal::broker_outage(&self.settings.amqp_url).recovered();
        heal::database_outage(&self.settings.database_url).recovered();
        let (mut last_purge, mut last_backlog) = (None::<Instant>, None::<Instant>);
        let result = loop {
            if shutdown.is_cancelled() {
                break Ok(());
            }
            // Idle, nothing else would notice a lost connection (and /readyz
            // must say so); the wait below wakes at least every second.
            if !conn.status().connected() || !channel.status().connected() {
                break Err(RelayError::ConnectionLost);
            }
            if last_purge.is_none_or(|t| t.elapsed() > PURGE_EVERY) {
                purge_sent(&mut db, self.relay.outbox_retention).await?;
                last_purge = Some(Instant::now());
            }
            let sent = self
                .relay_batch(&mut db, (&conn, &channel), &names, carry)
                .await?;
            done.progressed = true;
            if last_backlog.is_none_or(|t| t.elapsed() > BACKLOG_EVERY) || sent.is_none() {
                update_backlog(&mut db).await?;
                last_backlog = Some(Instant::now());
            }
            if sent.is_some() {
                continue; // there may be more right away
            }
            // Nothing to send: sleep until NOTIFY, at most one second.
            tokio::select! {
                () = shutdown.cancelled() => {}
                woken = tokio::time::timeout(Duration::from_secs(1), listener.recv()) => {
                    if let Ok(Ok(_)) = woken {
                        metrics::counter!(crate::metrics::RELAY_WAKEUPS_TOTAL).increment(1);
                    }
                }
            }
        };
        let _ = call("channel.close", channel.close(200, "relay stopping".into())).await;
        close(conn).await;
        self.health.broker_down();
        result
    }

    /// Publishes one batch and marks what was confirmed; sets aside what
    /// cannot be published. `None`: nothing was unsent. `Some(n)`: n rows
    /// confirmed and marked (n may be short of the batch after a
    /// nack/return, in which case the rest is retried later). A refusal by
    /// the broker commits what it learnt, then ends the session
    /// ([`RelayError::Refused`]): its channel or connection is gone.
    async fn relay_batch(
        &self,
        db: &mut PgConnection,
        (conn, channel): (&Connection, &Channel),
        names: &Names,
        carry: &mut Carry,
    ) -> Result<Option<usize>, RelayError> {
        let mut tx = db.begin().await?;
        handoff::hold_publishing(&mut tx, names).await?;
        if handoff::ring_change_unfinished(&mut tx).await? {
            // Outside the transaction: the epoch is committed before its
            // markers are published (a worker passes only recorded ones).
            tx.rollback().await?;
            handoff::finish_cut_short(db, conn, names).await?;
            return Ok(Some(0));
        }
        // A valid traceparent is 55 bytes: a longer (invalid) value is not
        // read whole.
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT id, agregat_id, routing_key, payload::text AS payload, dibuat_pada,
                    left(traceparent, 56) AS traceparent
             FROM outbox WHERE dikirim_pada IS NULL AND unroutable_at IS NULL
             ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED",
        )
        .bind(self.relay.relay_batch)
        .fetch_all(&mut *tx)
        .await?;
        if rows.is_empty() {
            tx.commit().await?;
            return Ok(None);
        }
        let max_body = usize::try_from(self.settings.max_body_bytes).unwrap_or(usize::MAX);
        let mut aside = Vec::new();
        let mut valid = Vec::with_capacity(rows.len());
        for row in &rows {
            match check::check(&candidate(row), max_body) {
                Ok(()) => valid.push(row),
                Err((why, said)) => {
                    warn!(
                        outbox_id = row.id,
                        reason = why.reason(),
                        "{said}; set aside"
                    );
                    aside.push((row.id, why, said));
                }
            }
        }
        let one_by_one = valid.iter().any(|r| carry.suspects.contains(&r.id));
        let traces = &self.settings.traces;
        let published = publish_waves(channel, names, traces, &valid, one_by_one).await?;
        if let Some(hook) = &self.after_publish {
            hook();
        }
        let confirmed = published.confirmed;
        sqlx::query("UPDATE outbox SET dikirim_pada = now() WHERE id = ANY($1)")
            .bind(&confirmed)
            .execute(&mut *tx)
            .await?;
        aside.extend(published.set_aside);
        set_aside(&mut tx, &aside).await?;
        tx.commit().await?;
        metrics::counter!(m::OUTBOX_PUBLISHED_TOTAL).increment(confirmed.len() as u64);
        for (id, why, _) in &aside {
            metrics::counter!(m::OUTBOX_SET_ASIDE_TOTAL, "reason" => why.reason()).increment(1);
            if *why == SetAside::Unroutable {
                metrics::counter!(m::OUTBOX_UNROUTABLE_TOTAL).increment(1);
            }
            carry.suspects.remove(id);
        }
        for id in &confirmed {
            carry.suspects.remove(id);
        }
        if let Some((ids, said)) = published.refused {
            if let [id] = ids[..] {
                warn!(
                    outbox_id = id,
                    reason = SetAside::BrokerRefused.reason(),
                    "the broker refused this outbox row ({said}); set aside, connecting again"
                );
            } else {
                warn!(
                    outbox_ids = ?ids,
                    "the broker refused one of these outbox rows ({said}); publishing them one at \
                     a time to find it"
                );
                carry.suspects.extend(ids.iter().copied());
            }
            return Err(RelayError::Refused { ids, said });
        }
        if confirmed.len() + aside.len() < rows.len() {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Ok(Some(confirmed.len()))
    }
}

/// The parts of `row` the contract checks.
fn candidate(row: &Row) -> Candidate<'_> {
    Candidate {
        id: row.id,
        agregat_id: &row.agregat_id,
        routing_key: &row.routing_key,
        payload: &row.payload,
    }
}

/// The key of the advisory lock the active relay of the topology `prefix`
/// holds (`pg_try_advisory_lock(hashtext(key))`): one relay publishes, the
/// others stand by. `urutan status` looks for its holder.
pub fn lock_key(prefix: &str) -> String {
    format!("urutan-relay:{prefix}")
}

/// Waits (polling every second) for the relay lock of `prefix`; false if
/// `shutdown` came first.
async fn acquire_lock(
    db: &mut PgConnection,
    prefix: &str,
    shutdown: &CancellationToken,
) -> Result<bool, sqlx::Error> {
    let mut announced = false;
    loop {
        let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock(hashtext($1))")
            .bind(lock_key(prefix))
            .fetch_one(&mut *db)
            .await?;
        if got {
            return Ok(true);
        }
        if !announced {
            info!("another relay is active; standing by");
            announced = true;
        }
        tokio::select! {
            () = shutdown.cancelled() => return Ok(false),
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// Listens on the pipeline's own channel ([`super::notify_channel`]).
async fn listen(url: &SecretUrl, schema: &str) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect(url.expose()).await?;
    listener.listen(&super::notify_channel(schema)).await?;
    Ok(listener)
}

/// Sets rows aside with their reason (code and words); the operator fixes a
/// row and clears the mark to retry it (migrations 0017 and 0038). The
/// outbox's CHECK constraints exempt a set-aside row, so this never fails
/// on the row that breaks them.
async fn set_aside(
    tx: &mut PgConnection,
    rows: &[(i64, SetAside, String)],
) -> Result<(), sqlx::Error> {
    if rows.is_empty() {
        return Ok(());
    }
    let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
    let reasons: Vec<&str> = rows.iter().map(|r| r.1.reason()).collect();
    let said: Vec<&str> = rows.iter().map(|r| r.2.as_str()).collect();
    sqlx::query(
        "UPDATE outbox o SET unroutable_at = now(), alasan_sisih = s.alasan,
                unroutable_reason = s.galat
         FROM unnest($1::bigint[], $2::text[], $3::text[]) AS s (id, alasan, galat)
         WHERE o.id = s.id",
    )
    .bind(&ids)
    .bind(&reasons)
    .bind(&said)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

async fn update_backlog(db: &mut PgConnection) -> Result<(), sqlx::Error> {
    let backlog = super::read::backlog(&mut *db).await?;
    metrics::gauge!(m::OUTBOX_BACKLOG).set(backlog.unsent as f64);
    metrics::gauge!(m::OUTBOX_UNROUTABLE).set(backlog.unroutable as f64);
    for reason in SetAside::ALL {
        let n = backlog
            .set_aside
            .iter()
            .find(|c| c.reason == reason.reason())
            .map_or(0, |c| c.count);
        metrics::gauge!(m::OUTBOX_SET_ASIDE, "reason" => reason.reason()).set(n as f64);
    }
    Ok(())
}

/// Expires sent rows older than `retention` on the relay's own connection:
/// whole id-range partitions once every row in them is sent (created ahead
/// here too), and the rows from before partitioning 5,000 per statement
/// ([`crate::store::expire_id_ranges`]).
pub async fn purge_sent(db: &mut PgConnection, retention: Duration) -> Result<u64, sqlx::Error> {
    let total = crate::store::expire_id_ranges(db, IdPartitioned::Outbox, retention).await?;
    if total > 0 {
        info!(rows = total, "purged sent outbox rows");
    }
    Ok(total)
}

async fn close(conn: Connection) {
    let _ = call("connection.close", conn.close(200, "relay stopping".into())).await;
}
