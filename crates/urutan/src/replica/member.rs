//! The membership transaction: renew (or drop) this replica's lease, drop
//! expired ones, and rewrite the placement from the replicas still live.
//! Every replica runs it under one advisory lock, so each sees the
//! placement the one before it left, and a move is decided once.

use std::time::Duration;

use sqlx::{PgPool, Postgres, Row, Transaction};

use super::place::{self, Reason};

// The two-key form, apart from the one-key locks urutan takes per order and
// from the shards' handover locks (`hashtext('urutan-shard-handover')`).
const LOCK: &str = "SELECT pg_advisory_xact_lock(hashtext('urutan-replika'), 0)";

/// A replica's life lock, held for as long as it lives by a connection of
/// its own: the second key is that connection's backend pid (unique among
/// live backends), recorded as `hidup_pid`. A replica killed (kill -9, a
/// lost node) loses its connection and with it the lock at once, so the
/// others take its shards at their next renewal instead of when its lease
/// runs out.
pub const LIFE_LOCK: &str = "SELECT pg_backend_pid() FROM (
    SELECT pg_advisory_lock(hashtext('urutan-replika-hidup'), pg_backend_pid())) locked";

/// Replicas whose lease ran out, or whose life lock is gone.
const DEAD: &str = "DELETE FROM urutan_replika r
    WHERE r.sewa_sampai < now()
       OR (r.hidup_pid IS NOT NULL AND NOT EXISTS (
            SELECT 1 FROM pg_locks l
            WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
              AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
              AND l.classid = hashtext('urutan-replika-hidup')::oid
              AND l.objid = r.hidup_pid::oid))";

/// Renews `name`'s lease for `lease` (joining if it had no row: a new
/// replica, or one whose lease ran out), reporting `active` (the shards it
/// has a consumer on), and rebalances shards `0..shards`. Returns the shards
/// `name` owns, each with why it got it.
pub async fn renew(
    pool: &PgPool,
    name: &str,
    shards: u16,
    lease: Duration,
    active: &[u16],
    life_pid: Option<i32>,
) -> Result<Vec<(u16, Reason)>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query(LOCK).execute(&mut *tx).await?;
    let active: Vec<i32> = active.iter().map(|&s| i32::from(s)).collect();
    let joined: bool = sqlx::query_scalar(
        "WITH old AS (SELECT 1 FROM urutan_replika WHERE nama = $1 AND sewa_sampai >= now())
         INSERT INTO urutan_replika (nama, sewa_sampai, aktif, hidup_pid)
         VALUES ($1, now() + make_interval(secs => $2), $3, $4)
         ON CONFLICT (nama) DO UPDATE
            SET sewa_sampai = EXCLUDED.sewa_sampai, aktif = EXCLUDED.aktif,
                hidup_pid = EXCLUDED.hidup_pid,
                bergabung_pada = CASE WHEN urutan_replika.sewa_sampai < now()
                                      THEN now() ELSE urutan_replika.bergabung_pada END
         RETURNING NOT EXISTS (SELECT 1 FROM old)",
    )
    .bind(name)
    .bind(lease.as_secs_f64())
    .bind(&active)
    .bind(life_pid)
    .fetch_one(&mut *tx)
    .await?;
    rebalance(&mut tx, shards, None, joined.then_some(name)).await?;
    let mine = sqlx::query(
        "SELECT shard, alasan FROM urutan_penempatan WHERE replika = $1 AND shard < $2 ORDER BY shard",
    )
    .bind(name)
    .bind(i32::from(shards))
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(mine
        .iter()
        .filter_map(|row| {
            let shard = u16::try_from(row.get::<i32, _>("shard")).ok()?;
            let reason = Reason::parse(row.get::<&str, _>("alasan")).unwrap_or(Reason::Joined);
            Some((shard, reason))
        })
        .collect())
}

/// Deletes `name`'s row and gives its shards to the others at once (a
/// graceful stop: they register their consumers while this replica hands
/// its shards over).
pub async fn leave(pool: &PgPool, name: &str, shards: u16) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query(LOCK).execute(&mut *tx).await?;
    sqlx::query("DELETE FROM urutan_replika WHERE nama = $1")
        .bind(name)
        .execute(&mut *tx)
        .await?;
    rebalance(&mut tx, shards, Some(name), None).await?;
    tx.commit().await
}

/// Drops expired replicas and rewrites the placement of shards `0..shards`
/// where it changes: `left` is leaving gracefully, `joined` just joined.
async fn rebalance(
    tx: &mut Transaction<'_, Postgres>,
    shards: u16,
    left: Option<&str>,
    joined: Option<&str>,
) -> Result<(), sqlx::Error> {
    sqlx::query(DEAD).execute(&mut **tx).await?;
    let live: Vec<String> = sqlx::query_scalar("SELECT nama FROM urutan_replika")
        .fetch_all(&mut **tx)
        .await?;
    let rows: Vec<(i32, String)> =
        sqlx::query_as("SELECT shard, replika FROM urutan_penempatan WHERE shard < $1")
            .bind(i32::from(shards))
            .fetch_all(&mut **tx)
            .await?;
    let mut current = vec![None; usize::from(shards)];
    for (shard, owner) in rows {
        if let Some(slot) = usize::try_from(shard).ok().and_then(|s| current.get_mut(s)) {
            *slot = Some(owner);
        }
    }
    let placed = place::rebalance(shards, &live, &current);
    let (mut moved, mut to, mut why) = (Vec::new(), Vec::new(), Vec::new());
    for (shard, (from, owner)) in current.iter().zip(&placed).enumerate() {
        let Some(owner) = owner else { continue };
        let reason = place::reason(
            from.as_deref(),
            owner,
            &live,
            left,
            joined == Some(owner.as_str()),
        );
        if let (Some(reason), Ok(shard)) = (reason, i32::try_from(shard)) {
            moved.push(shard);
            to.push(owner.clone());
            why.push(reason.label());
        }
    }
    if live.is_empty() {
        // Nobody left to give them to: the next replica to start takes them.
        sqlx::query("DELETE FROM urutan_penempatan WHERE shard < $1")
            .bind(i32::from(shards))
            .execute(&mut **tx)
            .await?;
    } else if !moved.is_empty() {
        sqlx::query(
            "INSERT INTO urutan_penempatan (shard, replika, alasan)
             SELECT * FROM unnest($1::int[], $2::text[], $3::text[])
             ON CONFLICT (shard) DO UPDATE
                SET replika = EXCLUDED.replika, alasan = EXCLUDED.alasan, sejak = now()",
        )
        .bind(&moved)
        .bind(&to)
        .bind(&why)
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// One live replica as `urutan status` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveReplica {
    pub name: String,
    pub joined_at: chrono::DateTime<chrono::Utc>,
    pub lease_until: chrono::DateTime<chrono::Utc>,
    /// Shards the placement gives it.
    pub shards: Vec<u16>,
    /// Shards it reported a registered consumer on.
    pub active: Vec<u16>,
}

/// Live replicas (lease not expired), with their placed and active shards;
/// and the owner of each placed shard. For `urutan status`.
pub async fn live(
    pool: &PgPool,
) -> Result<(Vec<LiveReplica>, Vec<(u16, String, Reason)>), sqlx::Error> {
    let rows = sqlx::query(
        "SELECT r.nama, r.bergabung_pada, r.sewa_sampai, r.aktif,
                coalesce(array_agg(p.shard ORDER BY p.shard) FILTER (WHERE p.shard IS NOT NULL), '{}') AS shards
         FROM urutan_replika r LEFT JOIN urutan_penempatan p ON p.replika = r.nama
         WHERE r.sewa_sampai >= now()
         GROUP BY r.nama ORDER BY r.nama",
    )
    .fetch_all(pool)
    .await?;
    let shards = |v: Vec<i32>| -> Vec<u16> {
        v.into_iter()
            .filter_map(|s| u16::try_from(s).ok())
            .collect()
    };
    let replicas = rows
        .iter()
        .map(|row| LiveReplica {
            name: row.get("nama"),
            joined_at: row.get("bergabung_pada"),
            lease_until: row.get("sewa_sampai"),
            shards: shards(row.get("shards")),
            active: shards(row.get("aktif")),
        })
        .collect();
    let placed: Vec<(i32, String, String)> =
        sqlx::query_as("SELECT shard, replika, alasan FROM urutan_penempatan ORDER BY shard")
            .fetch_all(pool)
            .await?;
    let placed = placed
        .into_iter()
        .filter_map(|(s, r, a)| {
            Some((
                u16::try_from(s).ok()?,
                r,
                Reason::parse(&a).unwrap_or(Reason::Joined),
            ))
        })
        .collect();
    Ok((replicas, placed))
}
