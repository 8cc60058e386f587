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
//! - except an unroutable row: returned with a routing key outside
//!   `<prefix>.#` (the entry exchange's only binding), which no retry can
//!   route. It is set aside (`unroutable_at`, `unroutable_reason`), never
//!   retried until an operator clears the mark, and the rows behind it,
//!   its aggregate's included, go on (docs/security.md);
//! - `dikirim_pada` is set only for confirmed rows, in the transaction that
//!   locked them; anything else stays unsent and is published again (the
//!   worker absorbs the duplicate by message id).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection};
use lapin::{Confirmation, PublisherConfirm};
use opentelemetry::trace::SpanKind;
use sqlx::postgres::PgListener;
use sqlx::{Connection as _, PgConnection};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::NOTIFY_CHANNEL;
use crate::broker::{self, BrokerError, Names, call};
use crate::config::{SecretUrl, Settings};
use crate::heal;
use crate::health::Health;
use crate::metrics as m;
use crate::reshard::handoff;
use crate::retry;
use crate::store::IdPartitioned;
use crate::trace::{self, TraceParent, Traces};

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
}

/// One outbox row on its way out.
#[derive(Debug, sqlx::FromRow)]
struct Row {
    id: i64,
    agregat_id: String,
    routing_key: String,
    payload: String,
    dibuat_pada: DateTime<Utc>,
    /// The producer's trace context, as written (checked when published).
    traceparent: Option<String>,
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
    pub async fn run(self, shutdown: CancellationToken) {
        let mut backoff = retry::backoff();
        // Whether an earlier session had relayed: its broker connection is
        // gone, so the next one is a reconnect.
        let mut was_active = false;
        while !shutdown.is_cancelled() {
            let mut active = false;
            let result = self.session(&shutdown, &mut active, was_active).await;
            if active {
                was_active = true;
                // It got through to relaying: the next failure is a new
                // outage and starts from a short delay.
                backoff = retry::backoff();
            }
            self.health.broker_down();
            match result {
                Ok(()) => return,
                Err(e) => {
                    self.health.set_database(false);
                    self.outage(&e);
                    let delay = retry::next_delay(&mut backoff);
                    if !retry::sleep_unless_stopped(delay, &shutdown).await {
                        return;
                    }
                }
            }
        }
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
    /// Sets `active` once connected to both and ready to relay; counts the
    /// broker connection in `urutan_broker_reconnects_total` if `reconnect`.
    async fn session(
        &self,
        shutdown: &CancellationToken,
        active: &mut bool,
        reconnect: bool,
    ) -> Result<(), RelayError> {
        let url = &self.settings.database();
        let mut db = PgConnection::connect(url.expose()).await?;
        self.health.set_database(true);
        if !acquire_lock(&mut db, &self.settings.topology_prefix, shutdown).await? {
            return Ok(()); // shutdown while standby
        }
        info!("active relay (holding the outbox lock)");
        let conn = broker::connect(&self.settings.broker(), "urutan relay").await?;
        if reconnect {
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
        let mut listener = listen(url).await?;
        *active = true;
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
            let sent = self.relay_batch(&mut db, (&conn, &channel), &names).await?;
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
                _ = tokio::time::timeout(Duration::from_secs(1), listener.recv()) => {}
            }
        };
        let _ = call("channel.close", channel.close(200, "relay stopping".into())).await;
        close(conn).await;
        self.health.broker_down();
        result
    }

    /// Publishes one batch and marks what was confirmed. `None`: nothing was
    /// unsent. `Some(n)`: n rows confirmed and marked (n may be short of the
    /// batch after a nack/return, in which case the rest is retried later).
    async fn relay_batch(
        &self,
        db: &mut PgConnection,
        (conn, channel): (&Connection, &Channel),
        names: &Names,
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
        let traces = &self.settings.traces;
        let (confirmed, unroutable) = publish_waves(channel, names, traces, &rows).await?;
        if let Some(hook) = &self.after_publish {
            hook();
        }
        sqlx::query("UPDATE outbox SET dikirim_pada = now() WHERE id = ANY($1)")
            .bind(&confirmed)
            .execute(&mut *tx)
            .await?;
        set_aside(&mut tx, &unroutable).await?;
        tx.commit().await?;
        metrics::counter!(m::OUTBOX_PUBLISHED_TOTAL).increment(confirmed.len() as u64);
        metrics::counter!(m::OUTBOX_UNROUTABLE_TOTAL).increment(unroutable.len() as u64);
        if confirmed.len() + unroutable.len() < rows.len() {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Ok(Some(confirmed.len()))
    }
}

/// Publishes `rows` in waves (one per aggregate position, so no aggregate has
/// two messages in flight) and waits for each wave's confirms. Returns the
/// ids the broker confirmed and the ones it returned as unroutable (routing
/// key outside the entry binding: set aside with their reason). Stops after
/// a wave with a nack or an unexplained return; the rest is retried later.
async fn publish_waves(
    channel: &Channel,
    names: &Names,
    traces: &Traces,
    rows: &[Row],
) -> Result<(Vec<i64>, Vec<(i64, String)>), RelayError> {
    let exchange = names.entry_exchange();
    let mut confirmed = Vec::with_capacity(rows.len());
    let mut unroutable = Vec::new();
    for wave in waves(rows) {
        let started = Instant::now();
        let mut pending = Vec::with_capacity(wave.len());
        for &i in &wave {
            let mut span = publish_span(traces, &exchange, &rows[i]);
            let confirm = publish(channel, &exchange, names.entity_header(), &rows[i], &span);
            let confirm = match confirm.await {
                Ok(confirm) => confirm,
                Err(e) => {
                    span.fail("basic.publish failed");
                    return Err(e.into());
                }
            };
            pending.push((&rows[i], confirm, span));
        }
        let mut complete = true;
        for (row, confirm, mut span) in pending {
            let id = row.id;
            let confirmation = call("publisher confirm", confirm).await;
            span.set(
                "urutan.publish.result",
                match &confirmation {
                    Ok(Confirmation::Ack(None)) => "confirmed",
                    Ok(Confirmation::Ack(Some(_))) => "returned",
                    Ok(Confirmation::Nack(_) | Confirmation::NotRequested) => "refused",
                    Err(_) => "connection_lost",
                },
            );
            if !matches!(confirmation, Ok(Confirmation::Ack(None))) {
                span.fail("not confirmed");
            }
            match confirmation? {
                Confirmation::Ack(None) => confirmed.push(id),
                Confirmation::Ack(Some(returned)) if !names.routes(&row.routing_key) => {
                    warn!(
                        outbox_id = id,
                        "unroutable (returned, routing key outside the entry binding); set aside"
                    );
                    let reason = format!(
                        "returned by the broker ({} {}): the routing key is outside `{}`",
                        returned.reply_code,
                        returned.reply_text,
                        names.entry_binding_key()
                    );
                    unroutable.push((id, reason));
                }
                Confirmation::Ack(Some(_)) => {
                    warn!(
                        outbox_id = id,
                        "unroutable (returned); is the topology declared?"
                    );
                    complete = false;
                }
                Confirmation::Nack(_) | Confirmation::NotRequested => {
                    warn!(outbox_id = id, "the broker refused the message (nack)");
                    complete = false;
                }
            }
        }
        metrics::histogram!(m::OUTBOX_PUBLISH_DURATION_SECONDS)
            .record(started.elapsed().as_secs_f64());
        if !complete {
            break;
        }
    }
    Ok((confirmed, unroutable))
}

/// Splits rows (in id order) into waves with at most one row per aggregate:
/// wave k holds the k-th row of every aggregate, so each aggregate's rows go
/// out in id order, one confirmed wave after another.
fn waves(rows: &[Row]) -> Vec<Vec<usize>> {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    let mut waves: Vec<Vec<usize>> = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        let k = seen.entry(row.agregat_id.as_str()).or_insert(0);
        if waves.len() <= *k {
            waves.push(Vec::new());
        }
        waves[*k].push(i);
        *k += 1;
    }
    waves
}

/// The publish span of `row`: a child of the producer's `traceparent` if
/// it is a valid one, else the root of a new trace (the value itself is
/// never logged or recorded).
fn publish_span(traces: &Traces, exchange: &str, row: &Row) -> trace::Span {
    let given = row.traceparent.as_deref();
    let parent = given.and_then(|t| TraceParent::parse(t.as_bytes()));
    let mut span = traces.start("publish", SpanKind::Producer, parent);
    if span.is_recording() {
        span.set("messaging.system", "rabbitmq");
        span.set("messaging.destination.name", exchange.to_owned());
        span.set("messaging.message.id", row.id.to_string());
        span.set("urutan.order_id", row.agregat_id.clone());
        span.set("urutan.outbox_id", row.id);
        if given.is_some() && parent.is_none() {
            span.set("urutan.traceparent.invalid", true);
        }
    }
    span
}

async fn publish(
    channel: &Channel,
    exchange: &str,
    entity_header: &str,
    row: &Row,
    span: &trace::Span,
) -> Result<PublisherConfirm, BrokerError> {
    let mut headers = FieldTable::default();
    headers.insert(
        entity_header.into(),
        AMQPValue::LongString(LongString::from(row.agregat_id.as_bytes())),
    );
    headers.insert(
        trace::HEADER.into(),
        AMQPValue::LongString(LongString::from(span.traceparent().to_string())),
    );
    let props = BasicProperties::default()
        .with_message_id(row.id.to_string().into())
        .with_headers(headers)
        .with_delivery_mode(2)
        .with_content_type("application/json".into())
        .with_timestamp(row.dibuat_pada.timestamp().max(0) as u64);
    let options = BasicPublishOptions {
        mandatory: true,
        ..Default::default()
    };
    call(
        "basic.publish",
        channel.basic_publish(
            exchange.into(),
            row.routing_key.as_str().into(),
            options,
            row.payload.as_bytes(),
            props,
        ),
    )
    .await
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

async fn listen(url: &SecretUrl) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect(url.expose()).await?;
    listener.listen(NOTIFY_CHANNEL).await?;
    Ok(listener)
}

/// Marks rows the broker cannot route, with why; the operator clears the
/// mark to retry (migration 0017).
async fn set_aside(tx: &mut PgConnection, rows: &[(i64, String)]) -> Result<(), sqlx::Error> {
    for (id, reason) in rows {
        sqlx::query(
            "UPDATE outbox SET unroutable_at = now(), unroutable_reason = $2 WHERE id = $1",
        )
        .bind(id)
        .bind(reason)
        .execute(&mut *tx)
        .await?;
    }
    Ok(())
}

async fn update_backlog(db: &mut PgConnection) -> Result<(), sqlx::Error> {
    let backlog = super::read::backlog(&mut *db).await?;
    metrics::gauge!(m::OUTBOX_BACKLOG).set(backlog.unsent as f64);
    metrics::gauge!(m::OUTBOX_UNROUTABLE).set(backlog.unroutable as f64);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: i64, agg: &str) -> Row {
        Row {
            id,
            agregat_id: agg.into(),
            routing_key: "pesanan.x".into(),
            payload: "{}".into(),
            dibuat_pada: Utc::now(),
            traceparent: None,
        }
    }

    #[test]
    fn only_keys_outside_the_entry_binding_are_unroutable() {
        let names = Names::new("pesanan");
        for key in ["pesanan", "pesanan.x", "pesanan.jakarta.dibuat", "pesanan."] {
            assert!(names.routes(key), "{key}");
        }
        for key in ["nowhere.x", "pesananx", "pesanan-hash", "", "x.pesanan"] {
            assert!(!names.routes(key), "{key}");
        }
    }

    #[test]
    fn waves_hold_one_row_per_aggregate_in_id_order() {
        let rows = [
            row(1, "A"),
            row(2, "B"),
            row(3, "A"),
            row(4, "A"),
            row(5, "C"),
            row(6, "B"),
        ];
        let waves = waves(&rows);
        assert_eq!(waves, vec![vec![0, 1, 4], vec![2, 5], vec![3]]);
        for wave in &waves {
            let aggs: std::collections::HashSet<_> =
                wave.iter().map(|&i| rows[i].agregat_id.as_str()).collect();
            assert_eq!(aggs.len(), wave.len());
        }
    }
}
