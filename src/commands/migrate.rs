//! `urutan migrate`: applies the database migrations and exits.

use anyhow::Context;
use tracing::info;
use urutan::config::Settings;
use urutan::store;

pub const HELP: &str = "\
Run it as the database owner; least-privilege roles (deploy/postgres/) may not.

Examples:
  urutan migrate
  DATABASE_URL=postgres://owner@db:5432/urutan urutan migrate";

pub async fn run(settings: Settings) -> anyhow::Result<()> {
    let pool = store::prepare(&settings.database(), 1)
        .await
        .with_context(|| format!("cannot migrate {}", settings.database_url))?;
    pool.close().await;
    info!(database = %settings.database_url, "migrations applied");
    Ok(())
}
