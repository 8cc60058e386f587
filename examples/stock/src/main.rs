//! `urutan-stock`: the `urutan` command line (run, status, explain, dlq,
//! hold, verify, ...) with the stock team's handler in every worker.
//!
//! ```text
//! psql "$DATABASE_URL" -f examples/stock/schema.sql
//! GAP_POLICY=wait cargo run -p urutan-stock -- run
//! cargo run -p urutan-stock -- hold list
//! ```

fn main() -> std::process::ExitCode {
    urutan_cli::main_with(urutan_stock::StockReservation)
}
