//! `urutan migrate`: applies the database migrations and exits; with
//! `--create-database`, creates the database first if it is missing (the
//! only command that creates one).

use anyhow::Context;
use tracing::{info, warn};
use urutan::config::Settings;
use urutan::heal::Unhealable;
use urutan::store;

pub const HELP: &str = "\
Run it as the database owner; least-privilege roles (deploy/postgres/) may not.
It also records ENTITY, TOPOLOGY_PREFIX and MAX_BODY_BYTES for urutan_enqueue
(its default routing key is <prefix>.<status>): give it the pipeline's settings.
Nothing else creates the database: a missing one stops every command with the
fix, `urutan migrate --create-database` (which needs a role allowed to CREATEDB).

Examples:
  urutan migrate
  urutan migrate --create-database
  DATABASE_URL=postgres://owner@db:5432/urutan urutan migrate";

/// `--create-database`: the database of `DATABASE_URL`, created if missing.
pub async fn create_database(settings: &Settings) -> anyhow::Result<()> {
    let url = &settings.database_url;
    match store::ensure_database(url).await {
        Ok(()) => Ok(()),
        Err(e) => match Unhealable::database(url, &e) {
            Some(refused) => Err(refused.into()),
            None => Err(e).with_context(|| format!("cannot create the database of {url}")),
        },
    }
}

pub async fn run(settings: Settings) -> anyhow::Result<()> {
    let pool = match store::prepare(&settings.database(), 1).await {
        Ok(pool) => pool,
        Err(e) => {
            if let Some(refused) = Unhealable::database(&settings.database_url, &e) {
                return Err(refused.into());
            }
            return Err(e).with_context(|| format!("cannot migrate {}", settings.database_url));
        }
    };
    // The day partitions of the coming week, on every run (not only when a
    // migration was pending): a scheduled `urutan migrate` keeps them ahead
    // even where no pool runs its retention.
    store::prepare_partitions(&pool)
        .await
        .context("cannot create the day partitions of pesan_diproses and pesanan_riwayat")?;
    // The outbox's CHECK constraints (migration 0038), on every run: one an
    // old row broke is validated once that row has expired.
    if let Some(left) = urutan::outbox::validate_constraints(&pool)
        .await
        .context("cannot validate the outbox's CHECK constraints")?
        .filter(|left| *left > 0)
    {
        warn!(
            constraints = left,
            "outbox CHECK constraint(s) stay NOT VALID: rows written before them break them \
             (new rows are checked all the same); `urutan migrate` validates them again later"
        );
    }
    // urutan_enqueue's defaults: this pipeline's entity, prefix and body limit.
    let recorded = urutan::outbox::defaults::record(&pool, &settings)
        .await
        .context("cannot record the pipeline's settings in urutan_pengaturan")?;
    // The entity's own names for its state and history (views).
    let views = urutan::store::pipeline::name_views(&pool, &settings.entity, true)
        .await
        .with_context(|| format!("cannot create the views of ENTITY={}", settings.entity))?;
    if !views.is_empty() {
        info!(
            ?views,
            "state and history readable under the entity's own name"
        );
    }
    pool.close().await;
    if recorded == urutan::outbox::defaults::Recorded::Refused {
        anyhow::bail!(
            "this role may not record ENTITY/TOPOLOGY_PREFIX/MAX_BODY_BYTES in urutan_pengaturan: \
             run `urutan migrate` as the database owner"
        );
    }
    info!(database = %settings.database_url, ?recorded, "migrations applied");
    Ok(())
}
