//! Which pipeline a database holds, and whether this process's settings
//! name it (docs/contract.md section 9).
//!
//! Every schema holding urutan's tables records its pipeline's entity and
//! topology prefix in `urutan_pengaturan` (written by `urutan migrate` and
//! `urutan run`). A process started with a forgotten `ENTITY` or
//! `DATABASE_SCHEMA` would otherwise work on the wrong tables or the wrong
//! broker objects without a word: a relay publishing to exchanges nobody
//! consumes, a pool migrating a second, empty pipeline into `public`, or a
//! report advising `urutan migrate`. [`look`] finds out what the database
//! holds; [`Found::refusal`] is the one line a relay or a pool stops with,
//! [`Found::advice`] the one a report shows.
//!
//! The views named for the entity ([`name_views`]) let a team read a
//! pipeline's state and history under its own name (`tagihan`,
//! `tagihan_riwayat`), beside the contract's table names.

use sqlx::{PgConnection, PgPool};

use crate::config::{DEFAULT_ENTITY, Settings};

/// A pipeline recorded in one schema of the database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    pub schema: String,
    /// `ENTITY` as recorded in `urutan_pengaturan`.
    pub entity: String,
    /// `TOPOLOGY_PREFIX` as recorded.
    pub prefix: String,
    /// A pool has worked on it: it holds state, or a ring was recorded
    /// (`urutan run` records the ring before any worker consumes). A
    /// freshly migrated schema (seeded with the default entity) is not in
    /// use, so its first pool may record its own entity.
    pub in_use: bool,
}

/// What [`look`] found, seen from `settings`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The configured schema (`DATABASE_SCHEMA`).
    pub schema: String,
    /// The entity of this process (`ENTITY`).
    pub entity: String,
    /// The pipeline in the configured schema, if it holds urutan's tables.
    pub here: Option<Recorded>,
    /// Pipelines recorded in the database's other schemas.
    pub elsewhere: Vec<Recorded>,
}

/// Reads every schema's `urutan_pengaturan` in the database `db` is
/// connected to (a schema this role may not read is left out).
pub async fn look(db: &mut PgConnection, settings: &Settings) -> Result<Found, sqlx::Error> {
    let schemas: Vec<String> = sqlx::query_scalar(
        "SELECT n.nspname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE c.relname = 'urutan_pengaturan' AND c.relkind IN ('r', 'p')
           AND has_schema_privilege(n.oid, 'USAGE')
           AND has_table_privilege(c.oid, 'SELECT')
         ORDER BY 1",
    )
    .fetch_all(&mut *db)
    .await?;
    let mut found = Found {
        schema: settings.database_schema.clone(),
        entity: settings.entity.clone(),
        here: None,
        elsewhere: Vec::new(),
    };
    for schema in schemas {
        let Some(recorded) = recorded_in(&mut *db, &schema).await? else {
            continue;
        };
        if schema == settings.database_schema {
            found.here = Some(recorded);
        } else {
            found.elsewhere.push(recorded);
        }
    }
    Ok(found)
}

/// The pipeline recorded in `schema` (`None`: its settings row is missing).
async fn recorded_in(db: &mut PgConnection, schema: &str) -> Result<Option<Recorded>, sqlx::Error> {
    let q = quote_ident(schema);
    // Tables a schema migrated by an old version may lack count as empty.
    let sql = format!(
        "SELECT entitas, awalan,
                (to_regclass('{q}.pesanan') IS NOT NULL
                   AND EXISTS (SELECT 1 FROM {q}.pesanan))
                OR (to_regclass('{q}.urutan_ring') IS NOT NULL
                   AND EXISTS (SELECT 1 FROM {q}.urutan_ring))
         FROM {q}.urutan_pengaturan LIMIT 1",
        q = q.replace('\'', "''"),
    );
    let row: Option<(String, String, Option<bool>)> = match sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .fetch_optional(db)
        .await
    {
        Ok(row) => row,
        // A table this role may not read is no pipeline it can use.
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42501") => None,
        Err(e) => return Err(e),
    };
    Ok(row.map(|(entity, prefix, in_use)| Recorded {
        schema: schema.to_owned(),
        entity,
        prefix,
        in_use: in_use.unwrap_or(false),
    }))
}

/// `name` as a quoted SQL identifier.
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

impl Found {
    /// The configured schema holds a pipeline of another entity that is in
    /// use: `ENTITY` was forgotten (or is wrong).
    fn other_entity_here(&self) -> Option<&Recorded> {
        self.here
            .as_ref()
            .filter(|r| r.in_use && r.entity != self.entity)
    }

    /// The configured schema holds no pipeline, another one holds this
    /// entity's: `DATABASE_SCHEMA` was forgotten (or is wrong).
    fn this_entity_elsewhere(&self) -> Option<&Recorded> {
        if self.here.is_some() {
            return None;
        }
        self.elsewhere.iter().find(|r| r.entity == self.entity)
    }

    /// Why a relay or a pool must not start with these settings (one line
    /// naming the setting to set), or `None`. Only what is certain: this
    /// schema's pipeline in use under another entity, or no pipeline here
    /// but this entity's in another schema. (Another entity's pipeline in
    /// another schema is no reason: two pipelines share a database so.)
    pub fn refusal(&self) -> Option<String> {
        if let Some(refusal) = self.entity_refusal() {
            return Some(refusal);
        }
        if let Some(r) = self.this_entity_elsewhere() {
            return Some(format!(
                "DATABASE_SCHEMA={} holds no urutan tables, but schema {} holds the pipeline of \
                 ENTITY={}: set DATABASE_SCHEMA={} (to start a second pipeline of this entity in \
                 {}, run `urutan migrate` there first)",
                self.schema, r.schema, r.entity, r.schema, self.schema
            ));
        }
        None
    }

    /// The part of [`Self::refusal`] that `urutan migrate` stops on too:
    /// this schema's pipeline holds state under another entity (migrating
    /// would record this process's entity for it). Another pipeline of
    /// this entity elsewhere is no reason: migrating is how a second one
    /// starts.
    pub fn entity_refusal(&self) -> Option<String> {
        let r = self.other_entity_here()?;
        Some(format!(
            "DATABASE_SCHEMA={} holds the pipeline of ENTITY={} (TOPOLOGY_PREFIX={}), not \
             ENTITY={}: set ENTITY={} (the entity of a pipeline that holds state does not \
             change; a new entity gets its own DATABASE_SCHEMA)",
            r.schema, r.entity, r.prefix, self.entity, r.entity
        ))
    }

    /// What a report (`status`, `explain`, `verify`) says when these
    /// settings do not name the pipeline the database holds: which setting
    /// to set; `None` when they do, or when the database holds no pipeline
    /// at all (then, and only then, `urutan migrate` is the advice).
    pub fn advice(&self) -> Option<String> {
        if let Some(refusal) = self.entity_refusal() {
            return Some(refusal);
        }
        if let Some(r) = self.this_entity_elsewhere() {
            return Some(format!(
                "DATABASE_SCHEMA={} holds no urutan tables, but schema {} holds the pipeline of \
                 ENTITY={}: set DATABASE_SCHEMA={}",
                self.schema, r.schema, r.entity, r.schema
            ));
        }
        if self.here.is_some() || self.elsewhere.is_empty() {
            return None;
        }
        let others: Vec<String> = self
            .elsewhere
            .iter()
            .map(|r| {
                if r.entity == DEFAULT_ENTITY && self.entity == DEFAULT_ENTITY {
                    format!("DATABASE_SCHEMA={}", r.schema)
                } else {
                    format!("DATABASE_SCHEMA={} ENTITY={}", r.schema, r.entity)
                }
            })
            .collect();
        Some(format!(
            "DATABASE_SCHEMA={} holds no urutan tables; this database's pipelines are in other \
             schemas: set {} (running `urutan migrate` here would start a new, empty pipeline)",
            self.schema,
            others.join(", or ")
        ))
    }
}

/// Creates (or refreshes) the views `<entity>` and `<entity>_riwayat` over
/// `pesanan` and `pesanan_riwayat` in the pipeline's schema, for a
/// non-default entity: its state and history under its own name. A name
/// already taken by something else (a table of the team's own) is left
/// alone; so is an existing view unless `refresh` (`urutan migrate`
/// refreshes them, for the columns a migration adds; a pool only creates
/// missing ones, as a role that may not replace them). Returns the views
/// written.
pub async fn name_views(
    db: &PgPool,
    entity: &str,
    refresh: bool,
) -> Result<Vec<String>, sqlx::Error> {
    let mut written = Vec::new();
    if entity == DEFAULT_ENTITY {
        return Ok(written);
    }
    for (view, table) in [
        (entity.to_owned(), "pesanan"),
        (format!("{entity}_riwayat"), "pesanan_riwayat"),
    ] {
        // `relkind`: 'v' a view (ours, refreshed), none: free.
        let kind: Option<String> = sqlx::query_scalar(
            "SELECT c.relkind::text FROM pg_class c
             WHERE c.oid = to_regclass(quote_ident($1))",
        )
        .bind(&view)
        .fetch_optional(db)
        .await?;
        match kind.as_deref() {
            None => {}
            Some("v") if refresh => {}
            Some(_) => continue,
        }
        let name = quote_ident(&view);
        let mut tx = db.begin().await?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "CREATE OR REPLACE VIEW {name} AS SELECT * FROM {table}"
        )))
        .execute(&mut *tx)
        .await?;
        let comment = format!(
            "{table} of the {entity} pipeline under its own name (ENTITY={entity}; made by \
             urutan migrate; read-only)"
        );
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "COMMENT ON VIEW {name} IS '{}'",
            comment.replace('\'', "''")
        )))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        written.push(view);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorded(schema: &str, entity: &str, in_use: bool) -> Recorded {
        Recorded {
            schema: schema.into(),
            entity: entity.into(),
            prefix: entity.into(),
            in_use,
        }
    }

    fn found(here: Option<Recorded>, elsewhere: Vec<Recorded>) -> Found {
        Found {
            schema: "public".into(),
            entity: "pesanan".into(),
            here,
            elsewhere,
        }
    }

    #[test]
    fn another_entity_in_use_here_names_entity() {
        let f = found(Some(recorded("public", "tagihan", true)), vec![]);
        let line = f.refusal().expect("refused");
        assert!(line.contains("set ENTITY=tagihan"), "{line}");
        // Freshly migrated (not in use): its first pool records its entity.
        let f = found(Some(recorded("public", "tagihan", false)), vec![]);
        assert_eq!(f.refusal(), None);
        assert_eq!(f.advice(), None);
    }

    #[test]
    fn this_entity_elsewhere_names_the_schema() {
        let f = found(None, vec![recorded("billing", "pesanan", true)]);
        let line = f.refusal().expect("refused");
        assert!(line.contains("set DATABASE_SCHEMA=billing"), "{line}");
    }

    #[test]
    fn other_pipelines_elsewhere_are_advice_not_refusal() {
        let f = found(None, vec![recorded("billing", "tagihan", true)]);
        assert_eq!(f.refusal(), None);
        let advice = f.advice().expect("advice");
        assert!(
            advice.contains("DATABASE_SCHEMA=billing ENTITY=tagihan"),
            "{advice}"
        );
        assert!(!advice.contains("run `urutan migrate`"), "{advice}");
        assert_eq!(found(None, vec![]).advice(), None);
    }
}
