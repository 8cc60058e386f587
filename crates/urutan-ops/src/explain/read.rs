//! Reading what `urutan explain` shows from PostgreSQL: the order's state,
//! history, parked and returned messages, dead-letter records, outbox rows,
//! and the shards' positions (one statement per part, each bounded by the
//! statement timeout), each through the read functions of the core module
//! that owns the table (`store`, `store::dead_letter`, `outbox`,
//! `reshard::read`).

use sqlx::PgPool;

use super::Explanation;
use crate::Tables;
use urutan::reshard::read as reshard;
use urutan::store::{self, dead_letter};

pub(super) enum ReadError {
    NotMigrated,
    /// Not migrated here, the pipeline is elsewhere: which setting to set.
    WrongPipeline(String),
    Sql(sqlx::Error),
}

impl From<sqlx::Error> for ReadError {
    fn from(e: sqlx::Error) -> Self {
        Self::Sql(e)
    }
}

/// Everything the database knows of order `id` (the broker's part is
/// added by the caller).
pub(super) async fn read(db: &PgPool, id: &str) -> Result<Explanation, ReadError> {
    let tables = Tables::look(db).await?;
    if !tables.core {
        return Err(ReadError::NotMigrated);
    }
    let mut found = Explanation::new(id);
    found.state = store::order_state(db, id).await?;
    found.applied = store::applied_versions(db, id).await?;
    found.parked = store::parked_versions(db, id).await?;
    if tables.returned {
        found.returned = store::returned_versions(db, id).await?;
    }
    if tables.dead_letters {
        found.dead_letters = Some(dead_letter::of_order(db, id).await?);
    }
    // Holds, retries and skips (migration 0020; an older schema has none).
    if let Ok(holds) = urutan::store::hold::holds(db, Some(id), 4).await {
        let (effects, versions): (Vec<_>, Vec<_>) =
            holds.into_iter().partition(|h| h.effect.is_some());
        found.hold = versions.into_iter().next();
        found.effect_hold = effects.into_iter().next();
        found.retrying = urutan::store::hold::retrying(db, Some(id), 1000).await?;
        found.skips = urutan::store::hold::skips(db, id).await?;
    }
    // Operator actions in the console (migration 0027; an older schema,
    // or a role without the grant, has none to show).
    found.audit = crate::audit::of_order(db, id, 100).await.ok();
    // Stale arrivals (migration 0025; an older schema has none).
    if let Ok(stale) = store::stale_arrivals(db, id).await {
        found.stale = stale;
    }
    // Its effects (migration 0009; an older schema has none).
    found.effects = urutan::effects::read::of_order(db, id, crate::effects_view::EFFECTS_LISTED)
        .await
        .ok();
    // The outbox has no index on the order id: on a large outbox this scan
    // is what [`crate::STATEMENT_TIMEOUT`] bounds, and a timeout is
    // reported rather than fatal.
    found.outbox = urutan::outbox::rows_of_order(db, id)
        .await
        .map_err(|e| format!("the outbox could not be searched: {e}"));
    found.passed_by_all = reshard::passed_by_all(db).await?;
    found.positions = reshard::positions(db)
        .await?
        .into_iter()
        .filter(|p| p.active)
        .filter_map(|p| Some((u16::try_from(p.shard).ok()?, p.epoch)))
        .collect();
    found.windows = reshard::open_windows(db)
        .await?
        .into_iter()
        .map(|w| (w.reason, w.epoch))
        .collect();
    Ok(found)
}
