//! What SQL producers need to know about the pipeline: `urutan_enqueue`
//! (migration 0024) reads the entity, the topology prefix (its default
//! routing key is `<prefix>.<status>`) and the body limit from the one row of
//! `urutan_pengaturan`; `urutan migrate` and `urutan run` keep that row equal
//! to their own settings.

use sqlx::PgPool;

use crate::config::Settings;

/// What [`record`] did to `urutan_pengaturan`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// The row already said the same.
    Unchanged,
    /// The row now says what these settings say.
    Written,
    /// It differs and this database role may not write it (a least-privilege
    /// role without the grant): `urutan migrate` as the owner fixes it.
    Refused,
}

/// Writes `settings`' entity, topology prefix and `MAX_BODY_BYTES` into
/// `urutan_pengaturan` if the row says otherwise (one statement; an equal
/// row is not touched, so a role that may only read it passes).
pub async fn record(db: &PgPool, settings: &Settings) -> Result<Recorded, sqlx::Error> {
    let limit = i32::try_from(settings.max_body_bytes).unwrap_or(i32::MAX);
    let written = sqlx::query(
        "UPDATE urutan_pengaturan
         SET entitas = $1, awalan = $2, batas_badan = $3, diperbarui_pada = now()
         WHERE (entitas, awalan, batas_badan) IS DISTINCT FROM ($1, $2, $3)",
    )
    .bind(&settings.entity)
    .bind(&settings.topology_prefix)
    .bind(limit)
    .execute(db)
    .await;
    match written {
        Ok(done) if done.rows_affected() > 0 => Ok(Recorded::Written),
        Ok(_) => Ok(Recorded::Unchanged),
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42501") => {
            Ok(Recorded::Refused)
        }
        Err(e) => Err(e),
    }
}
