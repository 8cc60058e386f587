//! `team-ledger`: the `urutan` command (run, migrate, status, ...) with a
//! team's handler that books every applied version into its own table,
//! `buku_besar`, in urutan's apply transaction.

use urutan::{Handler, HandlerError, HandlerEvent};

struct Ledger;

impl Handler for Ledger {
    async fn handle(
        &self,
        tx: &mut sqlx::PgConnection,
        event: &HandlerEvent,
    ) -> Result<(), HandlerError> {
        sqlx::query("INSERT INTO buku_besar (pesanan_id, versi, status) VALUES ($1, $2, $3)")
            .bind(&event.id)
            .bind(event.versi)
            .bind(&event.status)
            .execute(tx)
            .await?;
        Ok(())
    }
}

fn main() -> std::process::ExitCode {
    urutan_cli::main_with(Ledger)
}
