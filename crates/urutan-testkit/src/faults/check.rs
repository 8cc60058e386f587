//! After the last fault: drain, then check every promise, with `urutan
//! verify` and with this suite's own, stricter queries.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::Context;
use lapin::options::{BasicAckOptions, BasicGetOptions};
use serde::Serialize;
use sqlx::PgPool;

use crate::faults::services::Services;
use crate::faults::workload::{DirectLedger, Ledger, direct_entity, direct_message_id};
use crate::scratch::Scratch;

/// One invariant's result.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: String,
    pub violations: i64,
    /// Up to 10 offenders.
    pub examples: Vec<String>,
}

/// Work still to do: unsent outbox rows, outbox rows not processed, parked
/// messages, confirmed stale events not processed, queued messages.
async fn outstanding(
    services: &Services,
    env: &Scratch,
    db: &PgPool,
    stale: &[String],
) -> anyhow::Result<i64> {
    let rows: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM outbox WHERE dikirim_pada IS NULL)
              + (SELECT count(*) FROM outbox o WHERE NOT EXISTS
                    (SELECT 1 FROM pesan_diproses d
                     WHERE d.message_id = o.id::text AND d.pesanan_id = o.agregat_id))
              + (SELECT count(*) FROM urutan_parkir)
              + (SELECT count(*) FROM unnest($1::text[]) s(id) WHERE NOT EXISTS
                    (SELECT 1 FROM pesan_diproses d WHERE d.message_id = s.id))",
    )
    .bind(stale)
    .fetch_one(db)
    .await?;
    Ok(rows + crate::faults::inject::queued(services, &env.vhost).await? as i64)
}

/// Waits (at most `limit`) until nothing is outstanding; returns how long it
/// took, or the amount left at the deadline.
pub async fn drain(
    services: &Services,
    env: &Scratch,
    db: &PgPool,
    stale: &[String],
    limit: Duration,
) -> Result<Duration, i64> {
    let start = Instant::now();
    let mut left = -1;
    while start.elapsed() < limit {
        match outstanding(services, env, db, stale).await {
            Ok(0) => return Ok(start.elapsed()),
            Ok(n) => left = n,
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(left)
}

/// Each check: a name and a query listing offenders (one text per row).
const CHECKS: &[(&str, &str)] = &[
    (
        "0 lost: every outbox row is in the history under its message id",
        "SELECT 'outbox ' || o.id || ' (' || o.agregat_id || ' v' || (o.payload->>'versi') || ')'
         FROM outbox o WHERE NOT EXISTS
           (SELECT 1 FROM pesanan_riwayat r WHERE r.message_id = o.id::text)
           AND NOT EXISTS (SELECT 1 FROM urutan_lewati l
                           WHERE l.pesanan_id = o.agregat_id AND l.alasan = 'refused'
                             AND l.message_id = o.id::text)",
    ),
    (
        "0 applied twice: one history row per message id and per version",
        "SELECT 'message ' || message_id || ' x' || count(*) FROM pesanan_riwayat
         GROUP BY message_id HAVING count(*) > 1
         UNION ALL
         SELECT pesanan_id || ' v' || versi || ' x' || count(*) FROM pesanan_riwayat
         GROUP BY pesanan_id, versi HAVING count(*) > 1",
    ),
    (
        "0 injected stale/duplicate/poison applied: every history row is an outbox row (or a probe, or a direct version)",
        "SELECT r.pesanan_id || ' v' || r.versi || ' from ' || r.message_id
         FROM pesanan_riwayat r WHERE NOT EXISTS
           (SELECT 1 FROM outbox o WHERE o.id::text = r.message_id)
           AND NOT (r.pesanan_id LIKE 'probe-%' AND r.message_id = r.pesanan_id)
           AND NOT (r.pesanan_id LIKE 'D-%' AND r.message_id = r.pesanan_id || '/v' || r.versi)",
    ),
    (
        "0 order violations or gaps: each entity's history is 1, 2, ... n in apply order \
         (but for the versions an operator skipped)",
        "SELECT pesanan_id || ': v' || versi || ' at position ' || rn || ' (seq ' || seq || ')'
         FROM (SELECT pesanan_id, versi, seq,
                      row_number() OVER (PARTITION BY pesanan_id ORDER BY seq) AS rn
               FROM pesanan_riwayat) h
         WHERE versi <> rn + (SELECT count(*) FROM urutan_lewati l
                              WHERE l.pesanan_id = h.pesanan_id AND l.versi < h.versi
                                AND l.alasan IN ('refused', 'gap'))",
    ),
    (
        "every entity at its newest version and status",
        "SELECT o.agregat_id || ': stored ' || coalesce(p.versi::text, 'nothing')
                || ', newest ' || (o.payload->>'versi')
         FROM (SELECT DISTINCT ON (agregat_id) agregat_id, payload FROM outbox x
               WHERE NOT EXISTS (SELECT 1 FROM urutan_lewati l
                                 WHERE l.pesanan_id = x.agregat_id AND l.alasan = 'refused'
                                   AND l.message_id = x.id::text)
               ORDER BY agregat_id, (payload->>'versi')::bigint DESC) o
         LEFT JOIN pesanan p ON p.id = o.agregat_id
         WHERE p.versi IS DISTINCT FROM (o.payload->>'versi')::bigint
            OR p.status IS DISTINCT FROM o.payload->>'status'",
    ),
    (
        "nothing left parked",
        "SELECT 'parked ' || message_id FROM urutan_parkir",
    ),
];

/// Runs the database checks.
pub async fn database_checks(db: &PgPool, ledger: &Ledger) -> anyhow::Result<Vec<Check>> {
    let mut out = Vec::new();
    for (name, sql) in CHECKS {
        let rows: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(*sql))
            .fetch_all(db)
            .await?;
        out.push(Check {
            name: (*name).to_owned(),
            violations: rows.len() as i64,
            examples: rows.into_iter().take(10).collect(),
        });
    }
    let unprocessed: Vec<String> = sqlx::query_scalar(
        "SELECT s.id FROM unnest($1::text[]) s(id) WHERE NOT EXISTS
           (SELECT 1 FROM pesan_diproses d WHERE d.message_id = s.id)",
    )
    .bind(&ledger.stale)
    .fetch_all(db)
    .await?;
    out.push(Check {
        name: format!(
            "every confirmed stale event ({}) recorded, none applied",
            ledger.stale.len()
        ),
        violations: unprocessed.len() as i64,
        examples: unprocessed.into_iter().take(10).collect(),
    });
    Ok(out)
}

/// `urutan verify` (the binary) against the run: (passed, its output).
pub async fn run_verify(env: &Scratch) -> anyhow::Result<(bool, String)> {
    let out = tokio::process::Command::new(crate::faults::procs::binary())
        .arg("verify")
        .env("AMQP_URL", env.amqp_urls())
        .env("DATABASE_URL", env.database_url().expose())
        .env("NO_COLOR", "1")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), out).await??;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((out.status.success(), text))
}

/// The queue checks: every shard queue empty, and the DLQ (emptied here)
/// held exactly the confirmed poison messages (plus possibly uncertain ones).
/// `released`: message ids of refused versions an operator released their
/// order without (`urutan hold release` leaves their dead letters).
pub async fn queue_checks(
    services: &Services,
    env: &Scratch,
    ledger: &Ledger,
    released: &[String],
) -> anyhow::Result<Vec<Check>> {
    let queued = crate::faults::inject::queued(services, &env.vhost).await?;
    let mut checks = vec![Check {
        name: "all shard queues empty".into(),
        violations: queued as i64,
        examples: Vec::new(),
    }];
    let conn = crate::faults::workload::connect_any(&env.amqp_urls())
        .await
        .context("no broker node answers")?;
    let ch = conn.create_channel().await?;
    let (mut markers, mut copies, mut strangers) = (BTreeSet::new(), 0_i64, Vec::new());
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let got = ch.basic_get("pesanan.dlq".into(), BasicGetOptions::default());
        let Some(msg) = tokio::time::timeout(Duration::from_secs(10), got).await?? else {
            break;
        };
        msg.delivery.acker.ack(BasicAckOptions::default()).await?;
        let id = msg
            .delivery
            .properties
            .message_id()
            .as_ref()
            .map(|s| s.as_str());
        match marker(&msg.delivery.data) {
            Some(n) if !markers.insert(n) => copies += 1,
            Some(_) => {}
            None if id.is_some_and(|id| released.iter().any(|r| r == id)) => {}
            None => strangers.push(format!(
                "message id {:?}",
                msg.delivery
                    .properties
                    .message_id()
                    .as_ref()
                    .map(|s| s.as_str())
            )),
        }
    }
    let _ = urutan::broker::call("connection.close", conn.close(200, "done".into())).await;
    let missing: Vec<String> = ledger
        .poison_confirmed
        .difference(&markers)
        .map(|n| format!("poison-{n} not in the DLQ"))
        .collect();
    let extra: Vec<String> = markers
        .iter()
        .filter(|n| !ledger.poison_confirmed.contains(n) && !ledger.poison_uncertain.contains(n))
        .map(|n| format!("poison-{n} in the DLQ but never sent"))
        .collect();
    let mut examples: Vec<String> = missing
        .iter()
        .chain(&extra)
        .chain(&strangers)
        .cloned()
        .collect();
    let violations = examples.len() as i64;
    examples.truncate(10);
    checks.push(Check {
        name: format!(
            "the DLQ holds exactly the poison messages ({} confirmed, {} with a lost confirm, \
             {} found, {} extra at-least-once copies)",
            ledger.poison_confirmed.len(),
            ledger.poison_uncertain.len(),
            markers.len(),
            copies
        ),
        violations,
        examples,
    });
    Ok(checks)
}

/// The `n` of the `poison-<n>` marker in a body.
fn marker(body: &[u8]) -> Option<u64> {
    let text = String::from_utf8_lossy(body);
    let at = text.find("poison-")? + "poison-".len();
    let digits: String = text[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// Entities whose history spans more than one shard (moved by a ring change).
pub async fn moved_entities(db: &PgPool) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT pesanan_id FROM pesanan_riwayat
                               GROUP BY pesanan_id HAVING count(DISTINCT shard) > 1) m",
    )
    .fetch_one(db)
    .await?)
}

/// The direct producer's orders: each at its newest confirmed version (or
/// the unconfirmed one after it, which may have been queued), with every
/// version 1..n applied under its own message id (order and duplicates are
/// checked for all orders by [`database_checks`]).
pub async fn direct_checks(db: &PgPool, direct: &DirectLedger) -> anyhow::Result<Vec<Check>> {
    let rows: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT pesanan_id, max(versi), count(*) FILTER
                  (WHERE message_id = pesanan_id || '/v' || versi)
         FROM pesanan_riwayat WHERE pesanan_id LIKE 'D-%' GROUP BY pesanan_id",
    )
    .fetch_all(db)
    .await?;
    let applied: std::collections::HashMap<String, (i64, i64)> = rows
        .into_iter()
        .map(|(id, top, n)| (id, (top, n)))
        .collect();
    let mut examples = Vec::new();
    for (e, next) in direct.next.iter().enumerate() {
        let id = direct_entity(e);
        let confirmed = next - 1;
        let (top, n) = applied.get(&id).copied().unwrap_or((0, 0));
        let uncertain_ok = direct.pending[e] && top == *next;
        if !(top == confirmed || uncertain_ok) || n != top {
            examples.push(format!(
                "{id}: confirmed up to v{confirmed}, applied up to v{top} ({n} under their ids, \
                 e.g. {})",
                direct_message_id(&id, confirmed.max(1))
            ));
        }
    }
    let violations = examples.len() as i64;
    examples.truncate(10);
    Ok(vec![Check {
        name: format!(
            "direct producer: every confirmed version applied, once, in order ({} orders, {} \
             versions confirmed, {} publishes retried)",
            direct.next.len(),
            direct.confirmed,
            direct.retried
        ),
        violations,
        examples,
    }])
}

/// When each relay or direct event that a worker processed but did not
/// apply was processed: it came after a newer version of its order had been
/// applied (out of version order), so it was recorded as stale. Injected
/// stale events and re-publishes are not counted (their ids are `stale-*`
/// or were already recorded).
pub async fn reordered(db: &PgPool) -> anyhow::Result<Vec<chrono::DateTime<chrono::Utc>>> {
    // Two branches instead of one `EXISTS … OR LIKE`: with the OR,
    // PostgreSQL ran the outbox lookup as a correlated sequential scan per
    // processed message, quadratic (hours at 690,000 messages, which is
    // what a 100-fault cluster soak processes); a join hashes it (3 s).
    Ok(sqlx::query_scalar(
        "SELECT d.diproses_pada FROM pesan_diproses d JOIN outbox o
             ON o.id::text = d.message_id AND o.agregat_id = d.pesanan_id
         WHERE NOT EXISTS (SELECT 1 FROM pesanan_riwayat r WHERE r.message_id = d.message_id)
         UNION ALL
         SELECT d.diproses_pada FROM pesan_diproses d
         WHERE d.message_id LIKE 'D-%/v%'
           AND NOT EXISTS (SELECT 1 FROM pesanan_riwayat r WHERE r.message_id = d.message_id)",
    )
    .fetch_all(db)
    .await?)
}

/// Waits (at most `limit`) until no effect is pending, then checks the
/// effects against what the endpoint charged: one effect per applied
/// version, every one sent, each charged exactly once, charges of an order
/// in version order, every request signed.
pub async fn effects_checks(
    db: &PgPool,
    payee: &crate::faults::payee::Payee,
    limit: Duration,
) -> anyhow::Result<Vec<Check>> {
    let start = Instant::now();
    let mut pending = -1;
    while start.elapsed() < limit {
        pending = urutan::effects::store::pending(db).await.unwrap_or(-1);
        if pending == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let mut out = vec![Check {
        name: format!("every effect delivered within {limit:?} of the drain"),
        violations: if pending == 0 { 0 } else { pending.max(1) },
        examples: if pending == 0 {
            vec![]
        } else {
            vec![format!("{pending} pending at the deadline")]
        },
    }];
    let per_version: Vec<String> = sqlx::query_scalar(
        "SELECT r.pesanan_id || ' v' || r.versi || ': ' || count(e.efek) || ' effect(s)'
         FROM pesanan_riwayat r LEFT JOIN urutan_efek e ON e.message_id = r.message_id
         GROUP BY r.pesanan_id, r.versi HAVING count(e.efek) <> 1
         UNION ALL
         SELECT 'effect ' || e.efek || ' (' || e.message_id || ') has no applied version'
         FROM urutan_efek e WHERE NOT EXISTS
           (SELECT 1 FROM pesanan_riwayat r WHERE r.message_id = e.message_id)
         UNION ALL
         SELECT 'effect ' || e.efek || ' (' || e.pesanan_id || ' v' || e.versi || ') dead-lettered: '
                || coalesce(e.kode::text, '-')
         FROM urutan_efek e WHERE e.keadaan = 'gagal'",
    )
    .fetch_all(db)
    .await?;
    out.push(listed(
        "exactly one effect per applied version, none dead-lettered",
        per_version,
    ));
    let effects: Vec<(String, String)> = sqlx::query_as(
        "SELECT e.message_id, t.url FROM urutan_efek e JOIN urutan_efek_tujuan t USING (tujuan)",
    )
    .fetch_all(db)
    .await?;
    let keys: Vec<String> = effects
        .iter()
        .map(|(id, url)| urutan::effects::sign::idempotency_key(id, url))
        .collect();
    let book = payee.book();
    let mut charged: std::collections::HashMap<&str, usize> = Default::default();
    for c in &book.charges {
        *charged.entry(c.key.as_str()).or_default() += 1;
    }
    let mut once = Vec::new();
    for key in &keys {
        match charged.remove(key.as_str()) {
            Some(1) => {}
            n => once.push(format!("{key}: charged {} time(s)", n.unwrap_or(0))),
        }
    }
    once.extend(
        charged
            .keys()
            .map(|k| format!("{k}: charged without an effect")),
    );
    out.push(listed(
        &format!(
            "every effect charged exactly once ({} charges, {} resends with the same key)",
            book.charges.len(),
            book.resends
        ),
        once,
    ));
    let mut last: std::collections::HashMap<&str, i64> = Default::default();
    let mut order = Vec::new();
    for c in &book.charges {
        let before = last.insert(c.order.as_str(), c.versi);
        if before.is_some_and(|v| v >= c.versi) {
            order.push(format!(
                "{}: v{} charged after v{}",
                c.order,
                c.versi,
                before.unwrap_or(0)
            ));
        }
    }
    out.push(listed("charges of each order in version order", order));
    out.push(Check {
        name: "every request signed (Standard Webhooks) with its idempotency key".into(),
        violations: book.refused as i64,
        examples: vec![],
    });
    Ok(out)
}

fn listed(name: &str, offenders: Vec<String>) -> Check {
    Check {
        name: name.to_owned(),
        violations: offenders.len() as i64,
        examples: offenders.into_iter().take(10).collect(),
    }
}
