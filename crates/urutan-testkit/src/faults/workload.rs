//! The continuous workload: a producer that writes every order's next
//! version through the outbox (so `urutan relay` publishes it), and a mixer
//! that publishes poison messages, duplicates and stale events straight to
//! the exchange; on a cluster also a direct producer that publishes its own
//! orders' versions straight to the hash exchange. All ride out every
//! fault: they retry, never give up.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

const STATUSES: [&str; 5] = ["dibuat", "menunggu_bayar", "dibayar", "dikirim", "selesai"];

/// The order id of entity `e`.
pub fn entity(e: usize) -> String {
    format!("F-{e:04}")
}

/// What the mixer sent, for the checks: the DLQ must hold exactly the
/// poison messages, stale events must be recorded and never applied.
#[derive(Debug, Default)]
pub struct Ledger {
    /// Poison messages the broker confirmed (their `poison-<n>` markers).
    pub poison_confirmed: BTreeSet<u64>,
    /// Poison messages whose confirm never came (a connection lost under
    /// them): each may or may not be in the DLQ.
    pub poison_uncertain: BTreeSet<u64>,
    /// Re-publishes of already processed outbox rows, confirmed.
    pub duplicates: u64,
    /// Message ids of confirmed stale events (versi <= the stored one).
    pub stale: Vec<String>,
}

/// Enqueues `rate` events per second through the outbox, each the next
/// version of a random order among `entities`, until `stop`. On any database
/// error it waits and re-reads the versions from the outbox, so an
/// ambiguous commit never leaves a gap or a repeated version.
pub async fn produce(
    db: PgPool,
    entities: usize,
    rate: u32,
    seed: u64,
    reversed_pairs: bool,
    written: Arc<AtomicU64>,
    stop: CancellationToken,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut next = vec![1_i64; entities];
    let per_tick = (rate as usize / 20).max(1);
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !stop.is_cancelled() {
        tick.tick().await;
        let mut chosen: Vec<usize> = (0..per_tick)
            .map(|_| rng.random_range(0..entities))
            .collect();
        chosen.sort_unstable();
        chosen.dedup();
        // With `reversed_pairs` a third of the writes are two versions, the
        // later one first (GAP_POLICY=wait makes it wait for the other).
        let counts: Vec<i64> = chosen
            .iter()
            .map(|_| {
                if reversed_pairs && rng.random_range(0..3) == 0 {
                    2
                } else {
                    1
                }
            })
            .collect();
        let write = tokio::time::timeout(
            Duration::from_secs(10),
            enqueue(&db, &chosen, &next, &counts),
        );
        if matches!(write.await, Ok(Ok(()))) {
            for (e, n) in chosen.iter().zip(&counts) {
                next[*e] += n;
            }
            written.fetch_add(counts.iter().sum::<i64>() as u64, Ordering::Relaxed);
            continue;
        }
        // Committed or not? Ask the outbox once the database answers.
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
            if let Ok(Ok(())) =
                tokio::time::timeout(Duration::from_secs(10), resync(&db, &mut next)).await
            {
                break;
            }
        }
    }
}

/// One producer transaction: the next `counts[i]` versions of each chosen
/// order, the highest first.
async fn enqueue(
    db: &PgPool,
    chosen: &[usize],
    next: &[i64],
    counts: &[i64],
) -> Result<(), sqlx::Error> {
    let mut tx = db.begin().await?;
    let writes = chosen
        .iter()
        .zip(counts)
        .flat_map(|(e, n)| (0..*n).rev().map(move |k| (*e, next[*e] + k)));
    for (e, versi) in writes {
        let id = entity(e);
        let status = STATUSES[versi as usize % STATUSES.len()];
        let event = urutan::outbox::NewEvent {
            agregat_id: &id,
            status,
            versi,
            routing_key: &format!("pesanan.faults.{status}"),
            ..Default::default()
        };
        urutan::outbox::enqueue(&mut tx, &event)
            .await
            .map_err(|e| match e {
                urutan::outbox::EnqueueError::Database(e) => e,
                other => sqlx::Error::Protocol(other.to_string()),
            })?;
    }
    tx.commit().await
}

/// Sets `next` from the highest version of each order in the outbox.
async fn resync(db: &PgPool, next: &mut [i64]) -> Result<(), sqlx::Error> {
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT agregat_id, max((payload->>'versi')::bigint) FROM outbox GROUP BY agregat_id",
    )
    .fetch_all(db)
    .await?;
    for (id, top) in rows {
        if let Some(e) = id.strip_prefix("F-").and_then(|n| n.parse::<usize>().ok())
            && e < next.len()
        {
            next[e] = top + 1;
        }
    }
    Ok(())
}

/// One message as the mixer publishes it.
struct Direct {
    message_id: Option<String>,
    header: Option<AMQPValue>,
    body: Vec<u8>,
    /// `Some(n)` for poison message `poison-<n>`.
    poison: Option<u64>,
    /// The id of a stale event.
    stale: Option<String>,
}

/// About once a second publishes a few messages straight to `pesanan`:
/// a poison message one time in four, up to two duplicates of processed
/// outbox rows and up to two stale events, until `stop`.
pub async fn mix(
    amqp_url: String,
    db: PgPool,
    entities: usize,
    seed: u64,
    ledger: Arc<Mutex<Ledger>>,
    stop: CancellationToken,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut poison_n = 0_u64;
    let mut stale_n = 0_u64;
    let mut link: Option<(Connection, Channel)> = None;
    while !stop.is_cancelled() {
        let pause = Duration::from_millis(rng.random_range(500..1500));
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(pause) => {}
        }
        let mut burst = Vec::new();
        if rng.random_bool(0.25) {
            poison_n += 1;
            burst.push(poison(poison_n));
        }
        let dups = rng.random_range(0..=2);
        let picks: Vec<i64> = (0..dups).map(|_| rng.random_range(1..i64::MAX)).collect();
        burst.extend(duplicates(&db, &picks).await.unwrap_or_default());
        for _ in 0..rng.random_range(0..=2_u32) {
            let e = rng.random_range(0..entities);
            let pick: f64 = rng.random();
            if let Ok(Some(m)) = stale(&db, e, pick, stale_n + 1).await {
                stale_n += 1;
                burst.push(m);
            }
        }
        if burst.is_empty() {
            continue;
        }
        if link.is_none() {
            link = open(&amqp_url).await;
        }
        let Some((_, ch)) = &link else { continue };
        if publish(ch, &burst, &ledger).await.is_err() {
            link = None;
        }
    }
    if let Some((conn, _)) = link {
        let _ = urutan::broker::call("connection.close", conn.close(200, "done".into())).await;
    }
}

/// Where the next [`connect_any`] starts in the list of nodes: each call
/// starts one further, so a dead node is never everybody's first choice.
static NEXT_NODE: AtomicUsize = AtomicUsize::new(0);

/// A connection to one of `urls` (comma-separated nodes, as in `AMQP_URL`):
/// each node in turn, each attempt bounded by 5 s (a frozen node does not
/// answer at all).
pub async fn connect_any(urls: &str) -> Option<Connection> {
    let nodes: Vec<&str> = urls.split(',').map(str::trim).collect();
    let start = NEXT_NODE.fetch_add(1, Ordering::Relaxed);
    for i in 0..nodes.len() {
        let url = nodes[(start + i) % nodes.len()];
        let attempt = Connection::connect(url, ConnectionProperties::default());
        if let Ok(Ok(conn)) = tokio::time::timeout(Duration::from_secs(5), attempt).await {
            return Some(conn);
        }
    }
    None
}

/// A connection (see [`connect_any`]) and a channel in confirm mode.
async fn open(urls: &str) -> Option<(Connection, Channel)> {
    let conn = connect_any(urls).await?;
    let attempt = async {
        let ch = conn.create_channel().await.ok()?;
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .ok()?;
        Some(ch)
    };
    let ch = tokio::time::timeout(Duration::from_secs(5), attempt)
        .await
        .ok()
        .flatten()?;
    Some((conn, ch))
}

/// Publishes the burst and waits for its confirms (10 s); records poison
/// markers as uncertain first and as confirmed on ack.
async fn publish(
    ch: &Channel,
    burst: &[Direct],
    ledger: &Mutex<Ledger>,
) -> Result<(), &'static str> {
    if let Ok(mut l) = ledger.lock() {
        l.poison_uncertain
            .extend(burst.iter().filter_map(|m| m.poison));
    }
    let mut confirms = Vec::new();
    for m in burst {
        let mut props = BasicProperties::default().with_delivery_mode(2);
        if let Some(id) = &m.message_id {
            props = props.with_message_id(id.as_str().into());
        }
        if let Some(header) = &m.header {
            let mut headers = FieldTable::default();
            headers.insert("x-pesanan-id".into(), header.clone());
            props = props.with_headers(headers);
        }
        let sent = ch.basic_publish(
            "pesanan".into(),
            "pesanan.faults.mix".into(),
            BasicPublishOptions::default(),
            &m.body,
            props,
        );
        let confirm = tokio::time::timeout(Duration::from_secs(10), sent)
            .await
            .map_err(|_| "publish timed out")?
            .map_err(|_| "publish failed")?;
        confirms.push(confirm);
    }
    for (m, confirm) in burst.iter().zip(confirms) {
        let confirmation = tokio::time::timeout(Duration::from_secs(10), confirm)
            .await
            .map_err(|_| "confirm timed out")?
            .map_err(|_| "confirm failed")?;
        if !confirmation.is_ack() {
            continue; // not taken: a poison stays uncertain, the rest is harmless
        }
        let Ok(mut l) = ledger.lock() else { continue };
        if let Some(n) = m.poison {
            l.poison_uncertain.remove(&n);
            l.poison_confirmed.insert(n);
        } else if let Some(id) = &m.stale {
            l.stale.push(id.clone());
        } else {
            l.duplicates += 1;
        }
    }
    Ok(())
}

/// Publishes probe `id` (a new entity at version 1) on a fresh connection
/// and waits for the broker's confirm (each step bounded).
pub async fn publish_probe(url: &str, id: &str) -> Result<(), &'static str> {
    let (conn, ch) = open(url).await.ok_or("no connection")?;
    let probe = Direct {
        message_id: Some(id.to_owned()),
        header: Some(string(id)),
        body: serde_json::json!({"id": id, "status": "probe", "versi": 1})
            .to_string()
            .into_bytes(),
        poison: None,
        stale: None,
    };
    let result = publish(
        &ch,
        std::slice::from_ref(&probe),
        &Mutex::new(Ledger::default()),
    )
    .await;
    let _ = urutan::broker::call("connection.close", conn.close(200, "done".into())).await;
    result
}

fn string(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s.as_bytes()))
}

/// Poison message `poison-<n>`, breaking the contract one of five ways; its
/// body always carries the marker, so the DLQ can be matched against it.
fn poison(n: u64) -> Direct {
    let marker = format!("poison-{n}");
    let body = |id: &str, versi: i64| {
        serde_json::json!({"id": id, "status": "racun", "versi": versi, "data": {"marker": marker}})
            .to_string()
            .into_bytes()
    };
    let (message_id, header, body) = match n % 5 {
        0 => (
            Some(marker.clone()),
            Some(AMQPValue::LongLongInt(n as i64)),
            body("7", 1),
        ),
        1 => (
            Some(marker.clone()),
            Some(string(&marker)),
            format!("{{not json {marker}").into_bytes(),
        ),
        2 => (
            Some(marker.clone()),
            Some(string("F-0000")),
            body("F-0001", 1),
        ),
        3 => (None, Some(string(&marker)), body(&marker, 1)),
        _ => (
            Some(marker.clone()),
            Some(string(&marker)),
            body(&marker, 0),
        ),
    };
    Direct {
        message_id,
        header,
        body,
        poison: Some(n),
        stale: None,
    }
}

/// Re-publishes of outbox rows that were already processed (so each is a
/// `duplicate` whatever shard it reaches), picked near the `picks` fractions.
async fn duplicates(db: &PgPool, picks: &[i64]) -> Result<Vec<Direct>, sqlx::Error> {
    if picks.is_empty() {
        return Ok(Vec::new());
    }
    let top: Option<i64> = sqlx::query_scalar("SELECT max(id) FROM outbox")
        .fetch_one(db)
        .await?;
    let Some(top) = top else {
        return Ok(Vec::new());
    };
    let ids: Vec<i64> = picks.iter().map(|p| p % top + 1).collect();
    let rows: Vec<(i64, String, String)> = sqlx::query_as(
        "SELECT o.id, o.agregat_id, o.payload::text FROM outbox o
         WHERE o.id = ANY($1)
           AND EXISTS (SELECT 1 FROM pesan_diproses d
                     WHERE d.message_id = o.id::text AND d.pesanan_id = o.agregat_id)",
    )
    .bind(&ids)
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, entity, payload)| Direct {
            message_id: Some(id.to_string()),
            header: Some(string(&entity)),
            body: payload.into_bytes(),
            poison: None,
            stale: None,
        })
        .collect())
}

/// A stale event for entity `e` (a version at or below its stored one, with
/// a new message id `stale-<n>`), if it has one stored.
async fn stale(db: &PgPool, e: usize, pick: f64, n: u64) -> Result<Option<Direct>, sqlx::Error> {
    let id = entity(e);
    let stored: Option<i64> = sqlx::query_scalar("SELECT versi FROM pesanan WHERE id = $1")
        .bind(&id)
        .fetch_optional(db)
        .await?;
    Ok(stored.map(|top| {
        let versi = 1 + (pick * top as f64) as i64;
        let message_id = format!("stale-{n}");
        let body = serde_json::json!({"id": id, "status": "basi", "versi": versi.min(top)});
        Direct {
            message_id: Some(message_id.clone()),
            header: Some(string(&id)),
            body: body.to_string().into_bytes(),
            poison: None,
            stale: Some(message_id),
        }
    }))
}

/// The order id of direct-producer entity `e` (apart from the outbox's `F-`).
pub fn direct_entity(e: usize) -> String {
    format!("D-{e:04}")
}

/// The message id of version `versi` of direct order `id`: fixed, so a
/// retried publish is deduplicated by the worker.
pub fn direct_message_id(id: &str, versi: i64) -> String {
    format!("{id}/v{versi}")
}

/// What the direct producer sent, for the checks.
#[derive(Debug, Default, Clone)]
pub struct DirectLedger {
    /// Per entity: the next version to publish (1 + the last confirmed).
    pub next: Vec<i64>,
    /// Per entity: its version `next` was published but not confirmed (it
    /// may or may not be in a queue).
    pub pending: Vec<bool>,
    /// Versions confirmed by the broker.
    pub confirmed: u64,
    /// Publishes sent again (same message id) after a failure or a missing
    /// confirm; every 100 ms tick of an outage counts each waiting order.
    pub retried: u64,
    /// Publishes the broker acked but returned: routed to no queue (sent
    /// again like any other failure).
    pub returned: u64,
}

/// Publishes `rate` versions per second straight to `pesanan-hash` with
/// publisher confirms, each the next version of one of `entities` direct
/// orders, until `stop`. An order moves on to its next version only once
/// the broker confirmed the current one; a version that failed (nack,
/// returned as unroutable, timeout, connection lost) is published again,
/// with the same message id, before anything newer of that order, so a gap
/// never appears. After `stop` it retries what is unconfirmed for up to 60 s.
///
/// Publishes are `mandatory`, as the README asks of every producer: while
/// a cluster starts, the exchange can route a message to no queue, and
/// without `mandatory` the broker acks it anyway. The version is then lost
/// and the producer goes on to the next one; if an earlier attempt of it
/// was still held by a dead connection's channel, that copy is enqueued
/// later, after its successor (seen once: D-0069 v197 after v198, seed
/// 3794941549, a full cluster stop and start). A link that failed is
/// closed (bounded) before the next one opens, so none of its publishes
/// can trail the retries.
pub async fn produce_direct(
    amqp_url: String,
    entities: usize,
    rate: u32,
    seed: u64,
    ledger: Arc<Mutex<DirectLedger>>,
    stop: CancellationToken,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut next = vec![1_i64; entities];
    let mut pending = vec![false; entities];
    let (mut confirmed, mut retried, mut returned) = (0_u64, 0_u64, 0_u64);
    let per_tick = (rate as usize / 10).max(1);
    let mut link: Option<(Connection, Channel)> = None;
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut finish_by = None;
    loop {
        tick.tick().await;
        if stop.is_cancelled() && finish_by.is_none() {
            finish_by = Some(tokio::time::Instant::now() + Duration::from_secs(60));
        }
        // Unconfirmed versions first; new ones only while running.
        let mut chosen: Vec<usize> = (0..entities).filter(|e| pending[*e]).collect();
        if finish_by.is_none() {
            chosen.extend((0..per_tick).map(|_| rng.random_range(0..entities)));
        } else if chosen.is_empty() || finish_by.is_some_and(|t| tokio::time::Instant::now() > t) {
            break;
        }
        chosen.sort_unstable();
        chosen.dedup();
        retried += chosen.iter().filter(|e| pending[**e]).count() as u64;
        if link.is_none() {
            link = open(&amqp_url).await;
        }
        let acked = match &link {
            Some((_, ch)) => publish_versions(ch, &chosen, &next, &mut returned).await,
            None => Err(Vec::new()),
        };
        let acked = match acked {
            Ok(acked) => acked,
            Err(partial) => {
                if let Some((conn, _)) = link.take() {
                    let _ =
                        urutan::broker::call("connection.close", conn.close(320, "retry".into()))
                            .await;
                }
                partial
            }
        };
        for (e, ok) in chosen
            .iter()
            .zip(acked.iter().chain(std::iter::repeat(&false)))
        {
            if *ok {
                next[*e] += 1;
                pending[*e] = false;
                confirmed += 1;
            } else {
                pending[*e] = true;
            }
        }
        if let Ok(mut l) = ledger.lock() {
            *l = DirectLedger {
                next: next.clone(),
                pending: pending.clone(),
                confirmed,
                retried,
                returned,
            };
        }
    }
    if let Some((conn, _)) = link {
        let _ = urutan::broker::call("connection.close", conn.close(200, "done".into())).await;
    }
}

/// Publishes version `next[e]` of each chosen direct order (`mandatory`) and
/// waits for the confirms (10 s): whether each was acked and not returned,
/// or `Err` with those known so far when the channel failed (the rest count
/// as not confirmed).
async fn publish_versions(
    ch: &Channel,
    chosen: &[usize],
    next: &[i64],
    returned: &mut u64,
) -> Result<Vec<bool>, Vec<bool>> {
    let mut confirms = Vec::new();
    for e in chosen {
        let id = direct_entity(*e);
        let versi = next[*e];
        let status = STATUSES[versi as usize % STATUSES.len()];
        let mut headers = FieldTable::default();
        headers.insert("x-pesanan-id".into(), string(&id));
        let props = BasicProperties::default()
            .with_delivery_mode(2)
            .with_message_id(direct_message_id(&id, versi).into())
            .with_headers(headers);
        let body = serde_json::json!({"id": id, "status": status, "versi": versi}).to_string();
        let sent = ch.basic_publish(
            "pesanan-hash".into(),
            "".into(),
            BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            },
            body.as_bytes(),
            props,
        );
        match tokio::time::timeout(Duration::from_secs(10), sent).await {
            Ok(Ok(confirm)) => confirms.push(confirm),
            _ => return Err(vec![false; confirms.len()]),
        }
    }
    let mut acked = Vec::new();
    for confirm in confirms {
        match tokio::time::timeout(Duration::from_secs(10), confirm).await {
            Ok(Ok(lapin::Confirmation::Ack(None))) => acked.push(true),
            // Acked with the message returned: routed to no queue, not sent.
            Ok(Ok(lapin::Confirmation::Ack(Some(_)))) => {
                *returned += 1;
                acked.push(false);
            }
            Ok(Ok(_)) => acked.push(false),
            _ => return Err(acked),
        }
    }
    Ok(acked)
}
