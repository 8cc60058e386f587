//! `urutan verify`: checks the system's promises from the database alone
//! (the outbox is the source of truth for what was published), plus the
//! dead-letter queue's depth. Run it once the queues are drained.

use std::fmt;

use sqlx::PgPool;

/// How many offending entities a report lists per check.
const LIST_AT_MOST: i64 = 20;

/// One invariant and what broke it.
#[derive(Debug, Clone)]
pub struct Check {
    pub name: &'static str,
    /// Number of entities (or rows) that violate it.
    pub violations: i64,
    /// Up to `LIST_AT_MOST` offenders.
    pub examples: Vec<String>,
}

/// The verification report.
#[derive(Debug, Clone)]
pub struct Report {
    pub entities: i64,
    pub history_rows: i64,
    pub sent_outbox_rows: i64,
    pub unsent_outbox_rows: i64,
    pub dead_letters: Option<u32>,
    pub checks: Vec<Check>,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.violations == 0)
    }
}

/// Each check: a name and a query returning `(offender)` rows; the count is
/// the number of rows.
const CHECKS: &[(&str, &str)] = &[
    (
        "every entity is at the highest version published for it",
        "SELECT o.agregat_id || ': stored ' || coalesce(p.versi::text, 'nothing')
                || ', published up to ' || o.top
         FROM (SELECT agregat_id, max((payload->>'versi')::bigint) AS top
               FROM outbox WHERE dikirim_pada IS NOT NULL GROUP BY agregat_id) o
         LEFT JOIN pesanan p ON p.id = o.agregat_id
         WHERE p.versi IS DISTINCT FROM o.top",
    ),
    (
        "history strictly increases per entity in apply order",
        "SELECT pesanan_id || ': versi ' || versi || ' applied after ' || prev
         FROM (SELECT pesanan_id, versi,
                      lag(versi) OVER (PARTITION BY pesanan_id ORDER BY seq) AS prev
               FROM pesanan_riwayat) h
         WHERE versi <= prev",
    ),
    (
        "no version applied twice",
        "SELECT pesanan_id || ': versi ' || versi || ' x' || count(*)
         FROM pesanan_riwayat GROUP BY pesanan_id, versi HAVING count(*) > 1",
    ),
    (
        "stored state is the last applied version (no stale overwrite)",
        "SELECT p.id || ': stored ' || p.versi || '/' || p.status
                || ', last applied ' || coalesce(h.versi::text, 'nothing') || '/' || coalesce(h.status, '')
         FROM pesanan p
         LEFT JOIN LATERAL (SELECT versi, status FROM pesanan_riwayat r
                            WHERE r.pesanan_id = p.id ORDER BY seq DESC LIMIT 1) h ON true
         WHERE (h.versi IS DISTINCT FROM p.versi OR h.status IS DISTINCT FROM p.status)
           -- An order last written before the oldest history kept
           -- (HISTORY_RETENTION) may have none left.
           AND (h.versi IS NOT NULL OR p.diperbarui_pada >= coalesce((SELECT min(diterapkan_pada) FROM
                    (SELECT diterapkan_pada FROM pesanan_riwayat ORDER BY seq LIMIT 1) k), '-infinity'))",
    ),
    (
        "every sent outbox row was processed",
        "SELECT 'outbox ' || o.id || ' (' || o.agregat_id || ')'
         FROM outbox o
         WHERE o.dikirim_pada IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM pesan_diproses d WHERE d.message_id = o.id::text
                                           AND d.pesanan_id IN (o.agregat_id, ''))",
    ),
    (
        "no published version was skipped (each sent version has a history row)",
        "SELECT o.agregat_id || ': versi ' || (o.payload->>'versi') || ' never applied'
         FROM outbox o
         WHERE o.dikirim_pada IS NOT NULL
           -- Sent after the oldest history kept (HISTORY_RETENTION).
           AND o.dikirim_pada >= coalesce((SELECT min(diterapkan_pada) FROM
                    (SELECT diterapkan_pada FROM pesanan_riwayat ORDER BY seq LIMIT 1) k), '-infinity')
           AND NOT EXISTS (SELECT 1 FROM pesanan_riwayat r
                           WHERE r.pesanan_id = o.agregat_id
                             AND r.versi = (o.payload->>'versi')::bigint)",
    ),
];

/// Runs every check. `dead_letters` is the DLQ depth if the caller looked.
pub async fn verify(db: &PgPool, dead_letters: Option<u32>) -> Result<Report, sqlx::Error> {
    let mut checks = Vec::with_capacity(CHECKS.len());
    for (name, sql) in CHECKS {
        let violations: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM ({sql}) v"
        )))
        .fetch_one(db)
        .await?;
        let examples: Vec<String> = if violations > 0 {
            sqlx::query_scalar(sqlx::AssertSqlSafe(format!("{sql} LIMIT {LIST_AT_MOST}")))
                .fetch_all(db)
                .await?
        } else {
            Vec::new()
        };
        checks.push(Check {
            name,
            violations,
            examples,
        });
    }
    let (entities, history_rows, sent, unsent): (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM pesanan), (SELECT count(*) FROM pesanan_riwayat),
                (SELECT count(*) FROM outbox WHERE dikirim_pada IS NOT NULL),
                (SELECT count(*) FROM outbox WHERE dikirim_pada IS NULL)",
    )
    .fetch_one(db)
    .await?;
    Ok(Report {
        entities,
        history_rows,
        sent_outbox_rows: sent,
        unsent_outbox_rows: unsent,
        dead_letters,
        checks,
    })
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "verification: {} entities, {} applied versions, {} sent outbox rows ({} unsent)",
            self.entities, self.history_rows, self.sent_outbox_rows, self.unsent_outbox_rows
        )?;
        if let Some(n) = self.dead_letters {
            writeln!(f, "  dead-letter queue holds {n} message(s)")?;
        }
        for check in &self.checks {
            let mark = if check.violations == 0 {
                "ok  "
            } else {
                "FAIL"
            };
            writeln!(f, "  [{mark}] {}", check.name)?;
            if check.violations > 0 {
                writeln!(f, "         {} violation(s), e.g.:", check.violations)?;
                for example in &check.examples {
                    writeln!(f, "           {example}")?;
                }
            }
        }
        let verdict = if self.passed() { "PASSED" } else { "FAILED" };
        write!(f, "verification {verdict}")
    }
}
