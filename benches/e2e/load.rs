//! The workload: valid contract messages (string `x-pesanan-id` header,
//! persistent, ~300-byte JSON body) for `entities` orders with `versions`
//! versions each, published version-major through the `pesanan` exchange
//! with publisher confirms; and an open-loop publisher at a fixed rate.

use std::collections::VecDeque;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, PublisherConfirm};
use urutan::config::SecretUrl;

/// Publishes pipelined, at most this many unconfirmed per channel.
const CONFIRM_WINDOW: usize = 1_000;
const STATUSES: [&str; 4] = ["dibuat", "dibayar", "dikirim", "selesai"];

/// One message ready to publish.
pub struct Msg {
    pub message_id: String,
    pub entity: String,
    pub body: Vec<u8>,
}

pub fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// A contract body of about 300 bytes; `t_ns` is the publish time.
pub fn body(entity: &str, versi: i64, t_ns: i64) -> Vec<u8> {
    let status = STATUSES[usize::try_from(versi - 1).unwrap_or(0) % STATUSES.len()];
    let n = entity.bytes().fold(0u64, |a, b| a * 31 + u64::from(b)) % 10_000;
    serde_json::json!({
        "id": entity,
        "status": status,
        "versi": versi,
        "data": {
            "t_ns": t_ns,
            "pelanggan": format!("C-{n:07}"),
            "kota": "jakarta",
            "mata_uang": "IDR",
            "total": 62_500 * (n % 5 + 1),
            "items": [
                {"sku": format!("SKU-{:05}", n % 30_000), "qty": n % 3 + 1, "harga": 62_500},
                {"sku": "SKU-20417", "qty": 1, "harga": 12_500}
            ],
            "catatan": "kirim sebelum jam 17.00"
        }
    })
    .to_string()
    .into_bytes()
}

/// `entities` orders × `versions` versions, version-major (all v1, then v2, …):
/// consecutive messages of a shard belong to different orders, and every
/// order's versions arrive in order.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    pub entities: usize,
    pub versions: i64,
    /// The first order's number (`P-<first>`): successive drains into one
    /// database use disjoint orders (`--scale`).
    pub first: usize,
}

impl Workload {
    /// About `messages` messages, 4 versions per order.
    pub fn about(messages: usize) -> Self {
        Self {
            entities: messages.div_ceil(4).max(1),
            versions: 4,
            first: 0,
        }
    }

    /// The same workload on other orders, numbered from `first`.
    pub fn starting_at(self, first: usize) -> Self {
        Self { first, ..self }
    }

    pub fn len(&self) -> usize {
        self.entities * usize::try_from(self.versions).unwrap_or(0)
    }

    pub fn entity(&self, e: usize) -> String {
        format!("P-{:07}", self.first + e)
    }

    /// Message `i` of the workload, in publish order.
    pub fn message(&self, i: usize) -> Msg {
        let e = i % self.entities;
        let versi = i64::try_from(i / self.entities).unwrap_or(0) + 1;
        let entity = self.entity(e);
        Msg {
            message_id: format!("{entity}-v{versi}"),
            body: body(&entity, versi, now_ns()),
            entity,
        }
    }
}

pub async fn connect(url: &SecretUrl, name: &str) -> anyhow::Result<Connection> {
    let props = ConnectionProperties::default().with_connection_name(name.into());
    tokio::time::timeout(
        Duration::from_secs(15),
        Connection::connect(url.expose(), props),
    )
    .await
    .context("connecting to the broker took over 15 s")?
    .context("connect to the broker")
}

pub fn properties(msg: &Msg) -> BasicProperties {
    let mut headers = FieldTable::default();
    headers.insert(
        "x-pesanan-id".into(),
        AMQPValue::LongString(LongString::from(msg.entity.as_bytes())),
    );
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    BasicProperties::default()
        .with_message_id(msg.message_id.as_str().into())
        .with_delivery_mode(2)
        .with_timestamp(secs)
        .with_content_type("application/json".into())
        .with_headers(headers)
}

pub async fn confirm_channel(conn: &Connection) -> anyhow::Result<Channel> {
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    Ok(ch)
}

/// Sends one message to the entry exchange; the confirm comes later.
pub async fn send(ch: &Channel, msg: &Msg) -> anyhow::Result<PublisherConfirm> {
    let publish = ch.basic_publish(
        "pesanan".into(),
        "pesanan.jakarta.bench".into(),
        BasicPublishOptions::default(),
        &msg.body,
        properties(msg),
    );
    tokio::time::timeout(Duration::from_secs(30), publish)
        .await
        .context("basic.publish took over 30 s")?
        .context("basic.publish")
}

async fn confirmed(confirm: PublisherConfirm) -> anyhow::Result<()> {
    let c = tokio::time::timeout(Duration::from_secs(60), confirm)
        .await
        .context("no publisher confirm within 60 s")??;
    if !c.is_ack() {
        bail!("the broker nacked a publish");
    }
    Ok(())
}

/// Publishes the whole workload (confirmed) on `channels` parallel channels;
/// each order stays on one channel so its versions keep their order.
/// Returns the time it took.
pub async fn publish_backlog(
    url: &SecretUrl,
    work: Workload,
    channels: usize,
) -> anyhow::Result<Duration> {
    let conn = connect(url, "urutan-bench publisher").await?;
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..channels {
        let ch = confirm_channel(&conn).await?;
        tasks.spawn(async move {
            let mut window: VecDeque<PublisherConfirm> = VecDeque::new();
            for i in (0..work.len()).filter(|i| (i % work.entities) % channels == c) {
                window.push_back(send(&ch, &work.message(i)).await?);
                if window.len() >= CONFIRM_WINDOW
                    && let Some(front) = window.pop_front()
                {
                    confirmed(front).await?;
                }
            }
            for confirm in window {
                confirmed(confirm).await?;
            }
            let _ = urutan::broker::call("channel.close", ch.close(200, "published".into())).await;
            anyhow::Ok(())
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.context("publisher task panicked")??;
    }
    let took = start.elapsed();
    let _ = urutan::broker::call("connection.close", conn.close(200, "published".into())).await;
    Ok(took)
}

/// Hands out the next version of orders in round robin (for the open-loop load).
pub struct Cursor {
    entities: usize,
    next: usize,
    versi: Vec<i64>,
}

impl Cursor {
    pub fn new(entities: usize) -> Self {
        Self {
            entities,
            next: 0,
            versi: vec![0; entities],
        }
    }

    fn next_message(&mut self, prefix: &str) -> Msg {
        let e = self.next;
        self.next = (self.next + 1) % self.entities;
        self.versi[e] += 1;
        let versi = self.versi[e];
        let entity = format!("L-{e:06}");
        Msg {
            message_id: format!("{prefix}-{entity}-v{versi}"),
            body: body(&entity, versi, now_ns()),
            entity,
        }
    }
}

/// Publishes at `rate` msg/s for `duration` (open loop: the schedule does not
/// wait for the worker), confirms collected alongside. Returns each message
/// id with its publish time in µs since the epoch.
pub async fn publish_paced(
    ch: &Channel,
    cursor: &mut Cursor,
    prefix: &str,
    rate: f64,
    duration: Duration,
) -> anyhow::Result<Vec<(String, i64)>> {
    let total = (rate * duration.as_secs_f64()).round() as usize;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<PublisherConfirm>(100_000);
    let confirmer = tokio::spawn(async move {
        while let Some(confirm) = rx.recv().await {
            confirmed(confirm).await?;
        }
        anyhow::Ok(())
    });
    let mut sent = Vec::with_capacity(total);
    let start = Instant::now();
    while sent.len() < total {
        let due = ((start.elapsed().as_secs_f64() * rate) as usize + 1).min(total);
        while sent.len() < due {
            let msg = cursor.next_message(prefix);
            let t_us = now_ns() / 1_000;
            let confirm = send(ch, &msg).await?;
            tx.send(confirm)
                .await
                .context("confirm collector stopped")?;
            sent.push((msg.message_id, t_us));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    drop(tx);
    tokio::time::timeout(Duration::from_secs(120), confirmer)
        .await
        .context("confirms took over 120 s")?
        .context("confirm task panicked")??;
    Ok(sent)
}
