//! A team's own processing in urutan's apply transaction (docs/handlers.md),
//! the scenario of a shop's order pipeline: an order that is created
//! (`dibuat`) reserves its items' stock, a paid one (`dibayar`) is charged,
//! a cancelled one (`dibatalkan`) gives its stock back and is refunded.
//!
//! Every write happens on the transaction urutan hands over, together with
//! its dedup claim, the version fence and the history row: a redelivery, a
//! duplicate, a stale version or a crash between commit and ack never
//! reserves or charges twice. Failures take urutan's paths:
//! - not enough stock, an unknown SKU, a malformed order: **refused**
//!   (`handler_refused`); the order is held at the version before until an
//!   operator restocks and replays it (`urutan-stock dlq replay ID`) or
//!   releases the order without it (`urutan-stock hold release ORDER`);
//! - a stock row locked too long by another order (`lock_timeout`) or a
//!   deadlock: **retried** later, that message alone, while the shard goes on.
//!
//! Run it with `GAP_POLICY=wait`: each step matters (a paid order must have
//! been created first), so a version waits for the ones before it.

use serde::Deserialize;
use sqlx::PgConnection;
use urutan::{Handler, HandlerError, HandlerEvent};

/// The team's tables (`schema.sql`).
pub const SCHEMA: &str = include_str!("../schema.sql");

/// The stock team's handler.
pub struct StockReservation;

/// The part of an order's `data` the handler reads (data that does not
/// fit is refused by `data_as`, with what did not fit).
#[derive(Debug, Deserialize)]
struct Order {
    #[serde(default)]
    items: Vec<Item>,
    /// The amount charged when it is paid.
    total: Option<i64>,
}

#[derive(Debug, Deserialize)]
struct Item {
    sku: String,
    qty: i64,
}

impl Handler for StockReservation {
    async fn handle(
        &self,
        tx: &mut PgConnection,
        event: &HandlerEvent,
    ) -> Result<(), HandlerError> {
        match event.status.as_str() {
            "dibuat" => reserve(tx, event).await,
            "dibayar" => charge(tx, event).await,
            "dibatalkan" => give_back(tx, event).await,
            _ => Ok(()),
        }
    }
}

/// Reserves every item, or none (the refusal rolls the transaction back).
async fn reserve(tx: &mut PgConnection, event: &HandlerEvent) -> Result<(), HandlerError> {
    let id = &event.id;
    for Item { sku, qty } in event.data_as::<Order>()?.items {
        if qty <= 0 {
            return Err(HandlerError::refuse(format!(
                "order {id}: quantity {qty} of {sku}"
            )));
        }
        let left: Option<i64> = sqlx::query_scalar(
            "UPDATE stok SET tersedia = tersedia - $2 WHERE sku = $1 AND tersedia >= $2
             RETURNING tersedia",
        )
        .bind(&sku)
        .bind(qty)
        .fetch_optional(&mut *tx)
        .await?;
        if left.is_none() {
            let on_hand: Option<i64> =
                sqlx::query_scalar("SELECT tersedia FROM stok WHERE sku = $1")
                    .bind(&sku)
                    .fetch_optional(&mut *tx)
                    .await?;
            return Err(HandlerError::refuse(match on_hand {
                Some(n) => format!("out of stock: {id} wants {qty} of {sku}, {n} left"),
                None => format!("unknown SKU {sku} in order {id}"),
            }));
        }
        sqlx::query(
            "INSERT INTO reservasi (pesanan_id, sku, jumlah) VALUES ($1, $2, $3)
             ON CONFLICT (pesanan_id, sku) DO UPDATE SET jumlah = reservasi.jumlah + EXCLUDED.jumlah",
        )
        .bind(id)
        .bind(&sku)
        .bind(qty)
        .execute(&mut *tx)
        .await?;
    }
    Ok(())
}

/// One charge of the order's total.
async fn charge(tx: &mut PgConnection, event: &HandlerEvent) -> Result<(), HandlerError> {
    let Some(total) = event.data_as::<Order>()?.total else {
        let id = &event.id;
        return Err(HandlerError::refuse(format!(
            "order {id} paid without a total"
        )));
    };
    sqlx::query("INSERT INTO tagihan (pesanan_id, versi, jumlah) VALUES ($1, $2, $3)")
        .bind(&event.id)
        .bind(event.versi)
        .bind(total)
        .execute(tx)
        .await?;
    Ok(())
}

/// Gives the order's reserved stock back and refunds what it paid.
async fn give_back(tx: &mut PgConnection, event: &HandlerEvent) -> Result<(), HandlerError> {
    sqlx::query(
        "WITH r AS (DELETE FROM reservasi WHERE pesanan_id = $1 RETURNING sku, jumlah)
         UPDATE stok s SET tersedia = s.tersedia + r.jumlah FROM r WHERE s.sku = r.sku",
    )
    .bind(&event.id)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "INSERT INTO tagihan (pesanan_id, versi, jumlah)
         SELECT $1, $2, -sum(jumlah) FROM tagihan WHERE pesanan_id = $1 HAVING sum(jumlah) <> 0",
    )
    .bind(&event.id)
    .bind(event.versi)
    .execute(tx)
    .await?;
    Ok(())
}
