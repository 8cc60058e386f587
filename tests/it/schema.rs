//! `sql/schema.sql` is the schema as the migrations leave it: every table,
//! index, trigger and the current body of every function, in one readable
//! file (migrations are history: a function may be defined in one and
//! redefined in several later ones). This test migrates a fresh database,
//! dumps it with `pg_dump --schema-only` and compares; a migration that
//! changes the schema therefore lands with the regenerated file, which shows
//! the change in review.
//!
//! Regenerate: `URUTAN_BLESS_SCHEMA=1 cargo test --test it schema::`

use std::process::Command;

use crate::common::TestEnv;

const FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/sql/schema.sql");

/// The dump without what changes from run to run or machine to machine:
/// pg_dump's random `\restrict` key and its version lines, and the day the
/// default partitions' bound names (the day after the migration ran).
fn normalized(dump: &str) -> String {
    dump.lines()
        .filter(|l| {
            !(l.starts_with("\\restrict ")
                || l.starts_with("\\unrestrict ")
                || l.starts_with("-- Dumped from")
                || l.starts_with("-- Dumped by"))
        })
        .map(|l| format!("{}\n", without_bound_day(l)))
        .collect()
}

/// `... _awal_batas CHECK ((diproses_pada < '2026-12-06 00:00:00+00'::...` with
/// the quoted time replaced by `<the day after migrating>`.
fn without_bound_day(line: &str) -> String {
    if !line.contains("_awal_batas CHECK") {
        return line.to_owned();
    }
    let mut parts = line.splitn(3, '\'');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(head), Some(_day), Some(tail)) => {
            format!("{head}'<the day after migrating>'{tail}")
        }
        _ => line.to_owned(),
    }
}

fn major(version_line: &str) -> Option<u32> {
    // "pg_dump (PostgreSQL) 15.20 (Debian ...)"
    version_line
        .split_whitespace()
        .nth(2)?
        .split('.')
        .next()?
        .parse()
        .ok()
}

const HEADER: &str = "-- The schema as urutan's migrations leave it (generated: do not edit).\n\
-- Regenerate: URUTAN_BLESS_SCHEMA=1 cargo test --test it schema::\n";

#[tokio::test]
async fn sql_schema_sql_is_what_the_migrations_build() {
    let env = TestEnv::new("schema").await;
    env.db().await.close().await;
    let version = Command::new("pg_dump")
        .arg("--version")
        .output()
        .expect("pg_dump (postgresql-client) is installed");
    let version = String::from_utf8_lossy(&version.stdout).into_owned();
    let out = Command::new("pg_dump")
        // Not the day partitions: their names are dates (migration 0026).
        .args([
            "--schema-only",
            "--no-owner",
            "--no-privileges",
            "--exclude-table=pesan_diproses_h*",
            "--exclude-table=pesanan_riwayat_h*",
            "-d",
        ])
        .arg(env.database_url().expose())
        .output()
        .expect("run pg_dump");
    assert!(
        out.status.success(),
        "pg_dump failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dumped_by = format!(
        "-- pg_dump major version: {}\n",
        major(&version).expect("pg_dump's version")
    );
    let now = format!(
        "{HEADER}{dumped_by}{}",
        normalized(&String::from_utf8_lossy(&out.stdout))
    );
    if std::env::var_os("URUTAN_BLESS_SCHEMA").is_some() {
        std::fs::write(FILE, &now).expect("write sql/schema.sql");
        eprintln!("schema: wrote {FILE}");
        return;
    }
    let recorded = std::fs::read_to_string(FILE).expect("read sql/schema.sql");
    if !recorded.contains(&dumped_by) {
        // Another major version formats the dump differently: nothing to
        // compare against (the file is kept for the version CI runs).
        eprintln!(
            "schema: not compared: sql/schema.sql was dumped by another pg_dump major version"
        );
        return;
    }
    if recorded != now {
        let first = recorded
            .lines()
            .zip(now.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(recorded.lines().count().min(now.lines().count()));
        panic!(
            "sql/schema.sql is not what the migrations build (first difference at line {}:\n  file:     {:?}\n  migrated: {:?}).\n\
             Regenerate it with `URUTAN_BLESS_SCHEMA=1 cargo test --test it schema::` and review the diff.",
            first + 1,
            recorded.lines().nth(first).unwrap_or("<end>"),
            now.lines().nth(first).unwrap_or("<end>"),
        );
    }
}

/// Every table and function of urutan's schema says what it is for
/// (`COMMENT ON`, shown in `sql/schema.sql` and by `\d+` / `\df+`): a
/// migration that adds one adds its comment.
#[tokio::test]
async fn every_table_and_function_is_documented() {
    let env = TestEnv::new("schema_docs").await;
    let db = env.db().await;
    let undocumented: Vec<String> = sqlx::query_scalar(
        "SELECT 'table ' || c.relname FROM pg_class c
         WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p')
           AND c.relname <> '_sqlx_migrations' AND obj_description(c.oid, 'pg_class') IS NULL
         UNION ALL
         SELECT 'function ' || p.oid::regprocedure FROM pg_proc p
         WHERE p.pronamespace = current_schema()::regnamespace
           AND obj_description(p.oid, 'pg_proc') IS NULL
         ORDER BY 1",
    )
    .fetch_all(&db)
    .await
    .expect("catalog");
    db.close().await;
    assert!(
        undocumented.is_empty(),
        "without COMMENT ON: {undocumented:?}"
    );
}
