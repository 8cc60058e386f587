//! Reading what `urutan status` shows: from PostgreSQL (one statement per
//! part, each bounded by the statement timeout) and from the broker
//! (passive declares).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::{Epochs, Outbox, RECENT_HISTORY, ReasonCount, Ring, Session, Window};
use crate::{QueueInfo, Tables};
use urutan::broker::Names;
use urutan::config::Settings;

/// What the database says.
#[derive(Debug, Default)]
pub(super) struct FromDatabase {
    pub(super) tables: Tables,
    pub(super) ring: Option<Ring>,
    pub(super) epochs: Option<Epochs>,
    pub(super) windows: Vec<Window>,
    /// shard → its position.
    pub(super) positions: BTreeMap<u16, Position>,
    /// shard → (count, oldest, its order).
    pub(super) parked: BTreeMap<u16, (i64, DateTime<Utc>, String)>,
    pub(super) last_applied: BTreeMap<u16, DateTime<Utc>>,
    pub(super) by_reason: Vec<ReasonCount>,
    pub(super) outbox: Option<Outbox>,
}

/// What the broker says.
pub(super) struct FromBroker {
    /// Queue of shard `i` at index `i`, `None` where it does not exist.
    pub(super) shards: Vec<Option<QueueInfo>>,
    pub(super) dead_letter_queue: Option<QueueInfo>,
}

/// One shard's row of `urutan_shard`, as status reads it.
#[derive(Debug, sqlx::FromRow)]
pub(super) struct Position {
    #[sqlx(rename = "shard")]
    index: i32,
    /// The highest epoch passed.
    pub(super) epoch: i64,
    pub(super) active: bool,
    /// When the oldest epoch not passed yet was opened.
    pub(super) waiting_since: Option<DateTime<Utc>>,
    /// No recorded epoch explains `epoch`: not moved by a marker urutan sent.
    pub(super) unexplained: bool,
}

fn shard(n: i32) -> u16 {
    u16::try_from(n).unwrap_or(u16::MAX)
}

pub(super) async fn read_database(db: &PgPool, names: &Names) -> Result<FromDatabase, sqlx::Error> {
    let mut read = FromDatabase {
        tables: Tables::look(db).await?,
        ..FromDatabase::default()
    };
    if read.tables.dead_letters {
        read.by_reason = urutan::store::dead_letter::unresolved_by_reason(db).await?;
    }
    if !read.tables.core {
        return Ok(read);
    }
    read.ring = urutan::reshard::ring::current(&mut *db.acquire().await?)
        .await?
        .map(|r| Ring {
            versi: r.version,
            shard_count: r.shard_count,
            from: r.from,
            epoch: r.epoch,
            by: r.by,
            since: r.started,
            completed_at: r.completed,
            resharding: r.completed.is_none(),
        });
    let latest: Option<(i64, String, DateTime<Utc>, Option<i64>)> = sqlx::query_as(
        "SELECT epoch, alasan, dibuka_pada, urutan_epoch_selesai() FROM urutan_epoch
         ORDER BY epoch DESC LIMIT 1",
    )
    .fetch_optional(db)
    .await?;
    read.epochs = latest.map(
        |(latest, latest_reason, latest_opened_at, passed_by_all)| Epochs {
            latest,
            latest_reason,
            latest_opened_at,
            passed_by_all,
        },
    );
    read.windows = sqlx::query_as::<_, (i64, String, Option<i64>, DateTime<Utc>)>(
        "SELECT jendela, sebab, epoch, dibuka_pada FROM urutan_jendela
         WHERE ditutup_pada IS NULL AND (epoch IS NULL OR epoch > coalesce(urutan_epoch_selesai(), 0))
         ORDER BY jendela",
    )
    .fetch_all(db)
    .await?
    .into_iter()
    .map(|(id, reason, epoch, opened_at)| Window {
        id,
        reason,
        epoch,
        opened_at,
    })
    .collect();
    // A position is explained by a recorded epoch, by 0 (no marker passed
    // yet), or by lying below the oldest epoch kept (older ones are pruned,
    // see `handoff::record_epoch`). Anything else was written by no marker
    // urutan sent.
    let positions: Vec<Position> = sqlx::query_as(
        "SELECT s.shard, s.epoch, s.aktif AS active,
                (SELECT min(e.dibuka_pada) FROM urutan_epoch e WHERE e.epoch > s.epoch)
                    AS waiting_since,
                s.epoch <> 0
                AND (s.epoch > coalesce((SELECT max(epoch) FROM urutan_epoch), 0)
                     OR (s.epoch >= (SELECT min(epoch) FROM urutan_epoch)
                         AND NOT EXISTS (SELECT 1 FROM urutan_epoch e WHERE e.epoch = s.epoch)))
                IS TRUE AS unexplained
         FROM urutan_shard s ORDER BY s.shard",
    )
    .fetch_all(db)
    .await?;
    read.positions = positions.into_iter().map(|p| (shard(p.index), p)).collect();
    let parked: Vec<(i32, i64, DateTime<Utc>, String)> = sqlx::query_as(
        "SELECT shard, count(*), min(diparkir_pada), (array_agg(pesanan_id ORDER BY seq))[1]
         FROM urutan_parkir GROUP BY shard",
    )
    .fetch_all(db)
    .await?;
    read.parked = parked
        .into_iter()
        .map(|(s, n, oldest, order)| (shard(s), (n, oldest, order)))
        .collect();
    let applied: Vec<(i32, DateTime<Utc>)> = sqlx::query_as(
        "SELECT shard, max(diterapkan_pada) FROM
             (SELECT shard, diterapkan_pada FROM pesanan_riwayat ORDER BY seq DESC LIMIT $1) r
         GROUP BY shard",
    )
    .bind(RECENT_HISTORY)
    .fetch_all(db)
    .await?;
    read.last_applied = applied.into_iter().map(|(s, t)| (shard(s), t)).collect();
    let (unsent, oldest_unsent_at, unroutable): (i64, Option<DateTime<Utc>>, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE unroutable_at IS NULL),
                    min(dibuat_pada) FILTER (WHERE unroutable_at IS NULL),
                    count(*) FILTER (WHERE unroutable_at IS NOT NULL)
             FROM outbox WHERE dikirim_pada IS NULL",
    )
    .fetch_one(db)
    .await?;
    let relay = relay_session(db, names).await?;
    read.outbox = Some(Outbox {
        unsent,
        oldest_unsent_at,
        unroutable,
        relay,
    });
    Ok(read)
}

/// The session holding the relay's advisory lock (`urutan relay` takes
/// `pg_try_advisory_lock(hashtext(key))`, the key from
/// [`urutan::outbox::relay::lock_key`]): in `pg_locks`, a bigint key is split into `classid`
/// (high half) and `objid` (low half) with `objsubid` 1.
async fn relay_session(db: &PgPool, names: &Names) -> Result<Option<Session>, sqlx::Error> {
    let row: Option<(i32, Option<DateTime<Utc>>, Option<String>)> = sqlx::query_as(
        "SELECT l.pid, a.backend_start, host(a.client_addr)
         FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
         WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
           AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND ((l.classid::bigint << 32) | l.objid::bigint) = hashtext($1)::bigint
         LIMIT 1",
    )
    .bind(urutan::outbox::relay::lock_key(&names.entry_exchange()))
    .fetch_optional(db)
    .await?;
    Ok(row.map(|(pid, since, client)| Session { pid, since, client }))
}

/// Probes every shard queue the database knows of, then further up until
/// one is missing (queues of a shrink not yet retired), and the DLQ.
pub(super) async fn read_broker(
    settings: &Settings,
    names: &Names,
    from_db: &FromDatabase,
) -> Result<FromBroker, String> {
    let conn = crate::open_broker(settings, "urutan status").await?;
    let known = from_db
        .ring
        .as_ref()
        .map_or(0, |r| r.shard_count)
        .max(from_db.positions.keys().next_back().map_or(0, |s| s + 1));
    let failed =
        |e: urutan::broker::BrokerError| format!("the broker failed a passive declare: {e}");
    let queues: Vec<String> = (0..known).map(|i| names.shard_queue(i)).collect();
    let mut shards = crate::queue_infos(&conn, &queues).await.map_err(failed)?;
    while shards.len() < 1000 {
        let next = names.shard_queue(u16::try_from(shards.len()).unwrap_or(u16::MAX));
        match crate::queue_infos(&conn, &[next]).await.map_err(failed)?[0] {
            Some(info) => shards.push(Some(info)),
            None => break,
        }
    }
    let dlq = crate::queue_infos(&conn, &[names.dead_letter_queue()])
        .await
        .map_err(failed)?[0];
    let _ = urutan::broker::call("connection.close", conn.close(200, "status".into())).await;
    Ok(FromBroker {
        shards,
        dead_letter_queue: dlq,
    })
}
