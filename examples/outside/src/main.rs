//! `team-ledger`: the `urutan` command (run, migrate, status, ...) with a
//! team's handler that books every applied version into its own table,
//! `buku_besar`, in urutan's apply transaction.

use std::sync::Arc;

use futures::future::BoxFuture;
use urutan::handler::{Handler, HandlerError, HandlerEvent};

struct Ledger;

impl Handler for Ledger {
    fn handle<'a>(
        &'a self,
        tx: &'a mut sqlx::PgConnection,
        event: &'a HandlerEvent,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            sqlx::query("INSERT INTO buku_besar (pesanan_id, versi, status) VALUES ($1, $2, $3)")
                .bind(&event.id)
                .bind(event.versi)
                .bind(&event.status)
                .execute(&mut *tx)
                .await?;
            Ok(())
        })
    }
}

fn main() -> std::process::ExitCode {
    urutan_cli::main_with(Some(Arc::new(Ledger)))
}
