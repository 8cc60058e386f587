//! Reading what `urutan status` shows: from PostgreSQL (one statement per
//! part, each bounded by the statement timeout), through the read functions
//! of the core module that owns each table (`reshard`, `store`,
//! `store::dead_letter`, `outbox`; only the relay's session, in `pg_locks`,
//! is read here), and from the broker (passive declares).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::{Epochs, Outbox, RECENT_HISTORY, ReasonCount, Ring, Session, Window};
use crate::{QueueInfo, Tables};
use urutan::broker::Names;
use urutan::config::Settings;
use urutan::reshard::read::{self as reshard, Position};
use urutan::store;

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
    /// Unresolved records whose versions are settled (see
    /// `store::dead_letter::settled_count`).
    pub(super) settled: i64,
    pub(super) outbox: Option<Outbox>,
    /// The live replicas, and shard → the live replica placed on it.
    pub(super) replicas: Vec<super::Replica>,
    pub(super) placement: BTreeMap<u16, String>,
}

/// What the broker says.
pub(super) struct FromBroker {
    /// Queue of shard `i` at index `i`, `None` where it does not exist.
    pub(super) shards: Vec<Option<QueueInfo>>,
    pub(super) dead_letter_queue: Option<QueueInfo>,
}

fn shard(n: i32) -> u16 {
    u16::try_from(n).unwrap_or(u16::MAX)
}

/// Everything status reads from PostgreSQL: the parts a database without
/// urutan's tables (or with old ones) lacks stay empty.
pub(super) async fn read_database(db: &PgPool, names: &Names) -> Result<FromDatabase, sqlx::Error> {
    let mut read = FromDatabase {
        tables: Tables::look(db).await?,
        ..FromDatabase::default()
    };
    if read.tables.dead_letters {
        read.by_reason = store::dead_letter::unresolved_by_reason(db).await?;
    }
    if !read.tables.core {
        return Ok(read);
    }
    if read.tables.dead_letters {
        read.settled = store::dead_letter::settled_count(db).await?;
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
    read.epochs = reshard::epochs(db).await?;
    read.windows = reshard::open_windows(db).await?;
    read.positions = reshard::positions(db)
        .await?
        .into_iter()
        .map(|p| (shard(p.shard), p))
        .collect();
    read.parked = store::parked_by_shard(db)
        .await?
        .into_iter()
        .map(|p| (shard(p.shard), (p.count, p.oldest_at, p.oldest_order)))
        .collect();
    read.last_applied = store::last_applied_by_shard(db, RECENT_HISTORY)
        .await?
        .into_iter()
        .map(|(s, t)| (shard(s), t))
        .collect();
    // Before migration 0042 there is no membership: no replica is shown.
    if let Ok((replicas, placed)) = urutan::replica::member::live(db).await {
        read.placement = placed
            .into_iter()
            .filter(|(_, owner, _)| replicas.iter().any(|r| &r.name == owner))
            .map(|(shard, owner, _)| (shard, owner))
            .collect();
        read.replicas = replicas
            .into_iter()
            .map(|r| super::Replica {
                name: r.name,
                shard_count: r.shards.len(),
                shards: r.shards,
                consumers: r.active,
                joined_at: r.joined_at,
                lease_until: r.lease_until,
            })
            .collect();
    }
    let backlog = urutan::outbox::backlog(db).await?;
    let relay = relay_session(db, names).await?;
    read.outbox = Some(Outbox {
        unsent: backlog.unsent,
        oldest_unsent_at: backlog.oldest_unsent_at,
        unroutable: backlog.unroutable,
        set_aside: backlog.set_aside.iter().map(|c| c.count).sum(),
        set_aside_by_reason: backlog.set_aside,
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
    open: crate::Open<'_>,
) -> Result<FromBroker, String> {
    let broker = crate::Broker::get(open, settings, "urutan status").await?;
    let conn = broker.conn();
    let known = from_db
        .ring
        .as_ref()
        .map_or(0, |r| r.shard_count)
        .max(from_db.positions.keys().next_back().map_or(0, |s| s + 1));
    let failed =
        |e: urutan::broker::BrokerError| format!("the broker failed a passive declare: {e}");
    let queues: Vec<String> = (0..known).map(|i| names.shard_queue(i)).collect();
    let mut shards = crate::queue_infos(conn, &queues).await.map_err(failed)?;
    while shards.len() < 1000 {
        let next = names.shard_queue(u16::try_from(shards.len()).unwrap_or(u16::MAX));
        match crate::queue_infos(conn, &[next]).await.map_err(failed)?[0] {
            Some(info) => shards.push(Some(info)),
            None => break,
        }
    }
    let dlq = crate::queue_infos(conn, &[names.dead_letter_queue()])
        .await
        .map_err(failed)?[0];
    broker.done().await;
    Ok(FromBroker {
        shards,
        dead_letter_queue: dlq,
    })
}

/// Orders on hold and orders retrying a message set aside, through their
/// owner, `urutan::store::hold`.
pub async fn orders(db: &sqlx::PgPool) -> Result<super::Orders, sqlx::Error> {
    let by_reason = urutan::store::hold::held_by_reason(db).await?;
    Ok(super::Orders {
        held: by_reason.iter().map(|(_, n, _)| n).sum(),
        held_by_reason: by_reason
            .iter()
            .map(|(reason, orders, _)| super::HeldReason {
                reason: reason.clone(),
                orders: *orders,
            })
            .collect(),
        oldest_held_since: by_reason.iter().map(|(_, _, since)| *since).min(),
        retrying: urutan::store::hold::retrying_orders(db).await?,
    })
}
