//! The transactional outbox: producers write their business change and the
//! event in ONE transaction ([`enqueue`]); `urutan relay` ([`relay`]) moves
//! the rows to the broker with publisher confirms, in order per aggregate.
//! The operator commands read it here too ([`rows_of_order`], [`backlog`]).
//! A row the relay cannot publish is set aside with its reason
//! ([`check::SetAside`]) and holds up nothing behind it.
//! Producers in other languages call the SQL function `urutan_enqueue`,
//! which reads the pipeline's defaults that [`defaults`] records.

pub mod check;
pub mod defaults;
mod publish;
mod read;
pub mod relay;

pub use read::{Backlog, OrderRow, SetAsideCount, SetAsideRow, backlog, rows_of_order};

use serde_json::Value;
use sqlx::{PgConnection, PgPool};

/// The channel of the pipeline in schema `public`, and the start of every
/// other's ([`notify_channel`]).
pub const NOTIFY_CHANNEL: &str = "urutan_outbox";

/// The channel the relay of the pipeline in `schema` (`DATABASE_SCHEMA`)
/// LISTENs on, and [`enqueue`] and `urutan_enqueue` notify (at commit): one
/// per pipeline, so an enqueue wakes only its own pipeline's relay.
/// `urutan_outbox` in `public` (as before migration 0045),
/// `urutan_outbox_<schema>` elsewhere, or `urutan_outbox_` and the first
/// 32 hex digits of the schema name's SHA-256 where that would pass
/// PostgreSQL's 63-byte identifier limit (a longer LISTEN name would be cut,
/// a longer `pg_notify` one refused). The SQL function
/// `urutan_saluran_outbox()` computes the same name (a test holds them equal).
pub fn notify_channel(schema: &str) -> String {
    use sha2::Digest as _;
    /// PostgreSQL's longest identifier in bytes (NAMEDATALEN - 1).
    const LONGEST: usize = 63;
    if schema == crate::config::DEFAULT_SCHEMA {
        return NOTIFY_CHANNEL.to_owned();
    }
    let plain = format!("{NOTIFY_CHANNEL}_{schema}");
    if plain.len() <= LONGEST {
        return plain;
    }
    let digest = sha2::Sha256::digest(schema.as_bytes());
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("{NOTIFY_CHANNEL}_{hex}")
}

/// An event about one order, as a producer states it. Optional fields
/// default (`..Default::default()`), so adding one touches no call site.
#[derive(Debug, Clone, Default)]
pub struct NewEvent<'a> {
    /// The order id: the body's `id` and the `x-pesanan-id` header.
    pub agregat_id: &'a str,
    /// The order's status at this version (1-64 characters).
    pub status: &'a str,
    /// The version, increasing per order (>= 1).
    pub versi: i64,
    /// Optional extra state, any JSON.
    pub data: Option<&'a Value>,
    /// Routing key on the `pesanan` exchange, e.g. `pesanan.jakarta.dibuat`.
    pub routing_key: &'a str,
    /// The producer's W3C trace context (`00-<trace id>-<span id>-<flags>`),
    /// continued by the relay's publish span (docs/operations.md, "How to
    /// see a trace"); `None`: the transaction's `urutan.traceparent`
    /// setting if any, else a new trace.
    pub traceparent: Option<&'a str>,
}

impl<'a> NewEvent<'a> {
    /// An event with no optional field set.
    pub fn new(agregat_id: &'a str, status: &'a str, versi: i64, routing_key: &'a str) -> Self {
        NewEvent {
            agregat_id,
            status,
            versi,
            routing_key,
            ..Default::default()
        }
    }

    /// With `data`, the optional extra state.
    pub fn with_data(self, data: &'a Value) -> Self {
        NewEvent {
            data: Some(data),
            ..self
        }
    }

    /// With the producer's trace context `traceparent`.
    pub fn with_traceparent(self, traceparent: &'a str) -> Self {
        NewEvent {
            traceparent: Some(traceparent),
            ..self
        }
    }
}

/// Why an event cannot be enqueued.
#[derive(Debug, thiserror::Error)]
pub enum EnqueueError {
    #[error("invalid event: {0}")]
    Invalid(&'static str),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// Inserts `event` into the outbox inside the caller's transaction and
/// returns its outbox id (which becomes the message id). Nothing is sent
/// until the caller commits; a rollback discards the event with the change.
///
/// ```no_run
/// # async fn example(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// use urutan::outbox::{enqueue, NewEvent};
/// let mut tx = pool.begin().await?;
/// // ... the producer's own business writes on `tx` ...
/// enqueue(&mut tx, &NewEvent {
///     agregat_id: "P-1001", status: "dibayar", versi: 3,
///     routing_key: "pesanan.jakarta.dibayar", ..Default::default()
/// }).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub async fn enqueue(conn: &mut PgConnection, event: &NewEvent<'_>) -> Result<i64, EnqueueError> {
    validate(event)?;
    let payload = serde_json::json!({
        "id": event.agregat_id,
        "status": event.status,
        "versi": event.versi,
        "data": event.data,
    });
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO outbox (agregat_tipe, agregat_id, routing_key, payload, traceparent)
         VALUES ('pesanan', $1, $2, $3, coalesce($4, urutan_traceparent_producer()))
         RETURNING id",
    )
    .bind(event.agregat_id)
    .bind(event.routing_key)
    .bind(sqlx::types::Json(&payload))
    .bind(event.traceparent)
    .fetch_one(&mut *conn)
    .await?;
    sqlx::query("SELECT pg_notify(urutan_saluran_outbox(), '')")
        .execute(&mut *conn)
        .await?;
    Ok(id)
}

/// Validates the outbox's CHECK constraints that migration 0038 added NOT
/// VALID (`urutan_outbox_sahkan`: SHARE UPDATE EXCLUSIVE, so producers and
/// the relay go on). Returns how many stay NOT VALID because a row written
/// before them breaks them (they are enforced for new rows all the same;
/// the database logs a warning naming each); `None` when this role does not
/// own the table. `urutan migrate` calls it.
pub async fn validate_constraints<'c>(
    db: impl sqlx::PgExecutor<'c>,
) -> Result<Option<i32>, sqlx::Error> {
    sqlx::query_scalar("SELECT urutan_outbox_sahkan()")
        .fetch_one(db)
        .await
}

/// An outbox row the relay has published (broker-confirmed).
#[derive(Debug, Clone)]
pub struct SentRow {
    /// `outbox.id`, the message id it was published with.
    pub id: i64,
    pub aggregate_id: String,
    /// The published body (`outbox.payload` as JSON text).
    pub payload: String,
    pub versi: i64,
}

/// Up to `n` random published rows with `versi >= min_versi` (a full scan:
/// for the demo's injected duplicates and stale events, and checks).
pub async fn sample_sent(
    db: &PgPool,
    n: usize,
    min_versi: i64,
) -> Result<Vec<SentRow>, sqlx::Error> {
    let rows: Vec<(i64, String, String, i64)> = sqlx::query_as(
        "SELECT id, agregat_id, payload::text, (payload->>'versi')::bigint FROM outbox
         WHERE dikirim_pada IS NOT NULL AND (payload->>'versi')::bigint >= $2
         ORDER BY random() LIMIT $1",
    )
    .bind(i64::try_from(n).unwrap_or(i64::MAX))
    .bind(min_versi)
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, aggregate_id, payload, versi)| SentRow {
            id,
            aggregate_id,
            payload,
            versi,
        })
        .collect())
}

/// The contract rules a producer can break (docs/contract.md, section 2), checked
/// before the row exists so a bad event never reaches the broker.
fn validate(event: &NewEvent<'_>) -> Result<(), EnqueueError> {
    let id_len = event.agregat_id.len();
    // Control characters too: the worker refuses such an id (and the
    // outbox's CHECK constraint the row).
    if id_len == 0 || id_len > 128 || !crate::message::is_plain_id(event.agregat_id) {
        return Err(EnqueueError::Invalid(
            "agregat_id must be 1-128 bytes without control characters",
        ));
    }
    let status_len = event.status.chars().count();
    if !(1..=64).contains(&status_len) || event.status.contains('\0') {
        return Err(EnqueueError::Invalid(
            "status must be 1-64 characters without NUL",
        ));
    }
    if event.versi < 1 {
        return Err(EnqueueError::Invalid("versi must be >= 1"));
    }
    if event.routing_key.is_empty() || event.routing_key.len() > 255 {
        return Err(EnqueueError::Invalid("routing_key must be 1-255 bytes"));
    }
    if let Some(traceparent) = event.traceparent
        && crate::trace::TraceParent::parse(traceparent.as_bytes()).is_none()
    {
        return Err(EnqueueError::Invalid(
            "traceparent must be a W3C traceparent: 00-<32 hex>-<16 hex>-<2 hex>, lowercase",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_schema_has_its_own_channel_within_63_bytes() {
        assert_eq!(notify_channel("public"), "urutan_outbox");
        assert_eq!(notify_channel("pengiriman"), "urutan_outbox_pengiriman");
        let fits = "a".repeat(63 - "urutan_outbox_".len());
        assert_eq!(notify_channel(&fits), format!("urutan_outbox_{fits}"));
        let long = format!("{fits}b");
        let hashed = notify_channel(&long);
        assert_eq!(hashed.len(), "urutan_outbox_".len() + 32, "{hashed}");
        assert_ne!(hashed, notify_channel(&format!("{fits}c")));
    }

    fn event(id: &str, status: &str, versi: i64) -> NewEvent<'static> {
        NewEvent {
            agregat_id: Box::leak(id.to_owned().into_boxed_str()),
            status: Box::leak(status.to_owned().into_boxed_str()),
            versi,
            routing_key: "pesanan.x",
            ..Default::default()
        }
    }

    #[test]
    fn producer_side_validation() {
        assert!(validate(&event("P", "dibuat", 1)).is_ok());
        assert!(validate(&event("", "dibuat", 1)).is_err());
        assert!(validate(&event(&"x".repeat(129), "dibuat", 1)).is_err());
        assert!(validate(&event("a\nb", "dibuat", 1)).is_err());
        assert!(validate(&event("a\0b", "dibuat", 1)).is_err());
        assert!(validate(&event("P", "", 1)).is_err());
        assert!(validate(&event("P", &"s".repeat(65), 1)).is_err());
        assert!(validate(&event("P", "dibuat", 0)).is_err());
        let valid = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let upper = valid.to_uppercase();
        for (traceparent, ok) in [(valid, true), (upper.as_str(), false), ("00-x", false)] {
            let traced = event("P", "dibuat", 1).with_traceparent(traceparent);
            assert_eq!(validate(&traced).is_ok(), ok, "{traceparent}");
        }
    }
}
