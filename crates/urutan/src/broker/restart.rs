//! Noticing that the broker restarted.
//!
//! A restart can rebuild the consistent-hash ring in another order (RabbitMQ
//! up to 4.1 keeps it in a RAM table of the Mnesia store, refilled by
//! parallel binding recovery), and the broker tells its clients nothing of
//! it. What a restart does drop visibly is every non-durable object. So
//! urutan keeps one, the *sentinel* (a non-durable, internal fanout exchange
//! `<prefix>.alive` with no bindings: nothing can publish to it or route
//! through it): every worker pool probes it on each connection, before it
//! consumes anything. Missing means the broker started since it was last
//! declared (or urutan never ran here): the ring may have changed, and the
//! caller opens a window (see `handoff`) before declaring the sentinel again.
//!
//! A false alarm (the sentinel deleted by hand, a first start) only costs a
//! window. In a cluster, a non-durable exchange lives as long as any node
//! does, like the ring itself on the Mnesia store.

use lapin::options::ExchangeDeclareOptions;
use lapin::types::FieldTable;
use lapin::{Connection, ExchangeKind};

use super::reply::{is_access_refused, is_not_found};
use super::{BrokerError, Names, call};

/// Whether the sentinel is gone: the broker (re)started since it was
/// declared. Costs one channel (a missing exchange closes it). A user with
/// no permission at all on the sentinel cannot probe it on RabbitMQ 4.2.6+
/// (403 to a passive declare): that counts as a restart, the safe answer
/// (as when the user cannot declare it, see `reshard::prepare`).
pub async fn restarted(conn: &Connection, names: &Names) -> Result<bool, BrokerError> {
    let ch = call("channel.open", conn.create_channel()).await?;
    let passive = ExchangeDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let probe = ch.exchange_declare(
        names.restart_sentinel().as_str().into(),
        ExchangeKind::Fanout,
        passive,
        FieldTable::default(),
    );
    match call("exchange.declare", probe).await {
        Ok(()) => {
            let _ = call("channel.close", ch.close(200, "sentinel probed".into())).await;
            Ok(false)
        }
        Err(BrokerError::Amqp(e)) if is_not_found(&e) || is_access_refused(&e) => Ok(true),
        Err(e) => Err(e),
    }
}

/// Declares the sentinel (idempotent). Needs configure permission on its
/// name; the caller decides what a refusal means.
pub async fn declare_sentinel(conn: &Connection, names: &Names) -> Result<(), BrokerError> {
    let ch = call("channel.open", conn.create_channel()).await?;
    let options = ExchangeDeclareOptions {
        durable: false,
        auto_delete: false,
        internal: true,
        ..Default::default()
    };
    call(
        "exchange.declare",
        ch.exchange_declare(
            names.restart_sentinel().as_str().into(),
            ExchangeKind::Fanout,
            options,
            FieldTable::default(),
        ),
    )
    .await?;
    let _ = call("channel.close", ch.close(200, "sentinel declared".into())).await;
    Ok(())
}
