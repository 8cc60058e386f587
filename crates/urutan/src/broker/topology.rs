//! The broker topology (docs/contract.md, section 1), declared idempotently:
//! `pesanan` (topic) → `pesanan-hash` (x-consistent-hash on `x-pesanan-id`)
//! → shard quorum queues bound with weight "1" in index order → dead letters
//! to `pesanan.dlx` → `pesanan.dlq`.

use lapin::options::{
    ExchangeBindOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{Channel, Connection, ExchangeKind};
use tracing::{info, warn};

use super::reply::amqp_reply_code;
pub use super::reply::{is_access_refused, is_not_found};
use super::{BrokerError, call};

/// Broker object names, all derived from one prefix (default: the entity,
/// `pesanan`), and the entity's hash header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    prefix: String,
    entity_header: String,
}

impl Names {
    /// The names under `prefix`, for the default entity (`x-pesanan-id`).
    pub fn new(prefix: &str) -> Self {
        Self::with_entity(prefix, crate::config::DEFAULT_ENTITY)
    }
    /// The names under `prefix` for `entity` (hash header `x-<entity>-id`).
    pub fn with_entity(prefix: &str, entity: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
            entity_header: format!("x-{entity}-id"),
        }
    }
    /// The header carrying the entity id, which the hash exchange hashes.
    pub fn entity_header(&self) -> &str {
        &self.entity_header
    }
    /// The topic exchange producers publish to.
    pub fn entry_exchange(&self) -> String {
        self.prefix.clone()
    }
    /// The consistent-hash exchange.
    pub fn hash_exchange(&self) -> String {
        format!("{}-hash", self.prefix)
    }
    /// Shard queue `index`, zero-padded so names sort in shard order.
    pub fn shard_queue(&self, index: u16) -> String {
        format!("{}.shard-{index:03}", self.prefix)
    }
    pub fn dead_letter_exchange(&self) -> String {
        format!("{}.dlx", self.prefix)
    }
    pub fn dead_letter_queue(&self) -> String {
        format!("{}.dlq", self.prefix)
    }
    /// Binding key of the hash exchange on the entry exchange.
    pub fn entry_binding_key(&self) -> String {
        format!("{}.#", self.prefix)
    }
    /// Whether the entry binding matches `routing_key` (topic `<prefix>.#`:
    /// the prefix itself, or the prefix and a dot).
    pub fn routes(&self, routing_key: &str) -> bool {
        routing_key
            .strip_prefix(self.prefix.as_str())
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
    }
    /// The non-durable exchange whose absence tells that the broker
    /// restarted (see [`crate::broker::restart`]).
    pub fn restart_sentinel(&self) -> String {
        format!("{}.alive", self.prefix)
    }
}

/// Which shard queues exist after declaring, and which receive new messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardPlan {
    /// Shards `0..bound` are bound to the hash exchange (= `SHARD_COUNT`).
    pub bound: u16,
    /// Shards `0..consumed` exist and need a worker (more than `bound` only
    /// after an allowed shrink, until the extra queues are drained).
    pub consumed: u16,
}

/// Why the topology could not be declared.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error(
        "the broker lacks the x-consistent-hash exchange type: enable the plugin with \
         `rabbitmq-plugins enable rabbitmq_consistent_hash_exchange`"
    )]
    PluginMissing,
    #[error(
        "the broker has {existing} shard queues but SHARD_COUNT is {wanted}: shrinking moves \
         keys between shards; set SHARD_COUNT={existing}, or pass --allow-shrink to unbind the \
         extra shards and drain them"
    )]
    Shrink { existing: u16, wanted: u16 },
    #[error(
        "`{object}` exists on the broker with other settings ({detail}); delete it or start \
         with the settings it was declared with (e.g. the same DELIVERY_LIMIT)"
    )]
    Mismatch { object: String, detail: String },
    #[error(
        "`{object}` does not exist on the broker: declare the topology first with \
         `urutan topology` (same SHARD_COUNT and TOPOLOGY_PREFIX), as a user allowed to \
         configure it"
    )]
    Missing { object: String },
    #[error(
        "this broker user may not declare the topology ({detail}): run `urutan topology` as a \
         user allowed to configure it (deploy/rabbitmq/least-privilege.sh makes one), and run \
         the pool with TOPOLOGY_MODE=check"
    )]
    AccessRefused { detail: String },
    #[error(transparent)]
    Broker(#[from] BrokerError),
}

/// Declares everything for `shard_count` shards and returns the shard plan.
/// Safe to run any number of times and from several processes at once:
/// existing shards are kept, new ones are appended at the end of the ring.
/// A user without configure permission gets [`TopologyError::AccessRefused`]
/// (not retryable: a refusal is not transient).
pub async fn declare(
    conn: &Connection,
    names: &Names,
    shard_count: u16,
    delivery_limit: u32,
    allow_shrink: bool,
) -> Result<ShardPlan, TopologyError> {
    let queues = QueueSettings {
        delivery_limit,
        quorum_group_size: None,
        dlq: DlqCaps::default(),
    };
    declare_with(conn, names, shard_count, queues, allow_shrink).await
}

/// What urutan sets on the quorum queues it declares.
#[derive(Debug, Clone, Copy)]
pub struct QueueSettings {
    /// `x-delivery-limit` of the shard queues.
    pub delivery_limit: u32,
    /// `x-quorum-initial-group-size` (replicas per queue); `None` leaves it
    /// to the broker's default. Like the delivery limit it is compared on
    /// every declare: another value than the queues were created with is a
    /// mismatch (change the members of existing queues with
    /// `rabbitmq-queues grow/shrink`, not with this setting).
    pub quorum_group_size: Option<u16>,
    /// The dead-letter queue's caps.
    pub dlq: DlqCaps,
}

/// Caps of the dead-letter queue (`DLQ_MAX_LENGTH`, `DLQ_MAX_BYTES`), with
/// `x-overflow = reject-publish`: the shard queues dead-letter at least once,
/// so a full DLQ refuses a dead letter and its shard queue keeps it in its
/// dead-letter backlog and retries; nothing is dropped (`drop-head` would
/// silently lose the oldest dead letters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DlqCaps {
    pub max_length: u64,
    pub max_bytes: u64,
}

impl Default for DlqCaps {
    fn default() -> Self {
        Self {
            max_length: 100_000,
            max_bytes: 1 << 30,
        }
    }
}

/// [`declare`] with every queue setting. A refusal of the broker user's
/// permissions becomes [`TopologyError::AccessRefused`], whichever step met it.
pub async fn declare_with(
    conn: &Connection,
    names: &Names,
    shard_count: u16,
    queues: QueueSettings,
    allow_shrink: bool,
) -> Result<ShardPlan, TopologyError> {
    let declared = async {
        let existing = count_existing_shards(conn, names).await?;
        if existing > shard_count && !allow_shrink {
            return Err(TopologyError::Shrink {
                existing,
                wanted: shard_count,
            });
        }
        let ch = call("channel.open", conn.create_channel()).await?;
        let ch = declare_dead_lettering(conn, ch, names, &queues).await?;
        declare_entry(&ch, names).await?;
        let consumed = existing.max(shard_count);
        declare_shard_queues(&ch, names, &queues, consumed, shard_count).await?;
        let _ = call("channel.close", ch.close(200, "topology declared".into())).await;
        // Last: whoever probes it next knows the ring has not been rebuilt by a
        // restart since this declaration (see `restart`).
        super::restart::declare_sentinel(conn, names).await?;
        if existing != 0 && existing < shard_count {
            info!(
                from = existing,
                to = shard_count,
                "appended new shards to the ring"
            );
        }
        Ok::<_, TopologyError>(ShardPlan {
            bound: shard_count,
            consumed,
        })
    }
    .await;
    match declared {
        Err(TopologyError::Broker(BrokerError::Amqp(e))) if is_access_refused(&e) => {
            Err(TopologyError::AccessRefused {
                detail: refusal_text(&e),
            })
        }
        other => other,
    }
}

/// Declares the durable exchange `name` of `kind`.
async fn declare_exchange(
    ch: &Channel,
    name: &str,
    kind: ExchangeKind,
    args: FieldTable,
) -> Result<(), TopologyError> {
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    call(
        "exchange.declare",
        ch.exchange_declare(name.into(), kind, durable, args),
    )
    .await
    .map_err(|e| mismatch_or(e, name))
}

/// The dead-letter exchange, the DLQ and its binding; returns the channel
/// to go on with (the DLQ's declaration may have replaced it).
async fn declare_dead_lettering(
    conn: &Connection,
    ch: Channel,
    names: &Names,
    queues: &QueueSettings,
) -> Result<Channel, TopologyError> {
    let dlx = names.dead_letter_exchange();
    let dlq = names.dead_letter_queue();
    declare_exchange(&ch, &dlx, ExchangeKind::Fanout, FieldTable::default()).await?;
    let ch = declare_dlq(conn, ch, &dlq, queues).await?;
    call(
        "queue.bind",
        ch.queue_bind(
            dlq.as_str().into(),
            dlx.as_str().into(),
            "".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        ),
    )
    .await?;
    Ok(ch)
}

/// The entry exchange and the consistent-hash exchange bound to it.
async fn declare_entry(ch: &Channel, names: &Names) -> Result<(), TopologyError> {
    let entry = names.entry_exchange();
    let hash = names.hash_exchange();
    declare_exchange(ch, &entry, ExchangeKind::Topic, FieldTable::default()).await?;
    let mut hash_args = FieldTable::default();
    hash_args.insert("hash-header".into(), string(names.entity_header()));
    declare_exchange(
        ch,
        &hash,
        ExchangeKind::Custom("x-consistent-hash".into()),
        hash_args,
    )
    .await
    .map_err(plugin_missing_or)?;
    call(
        "exchange.bind",
        ch.exchange_bind(
            hash.as_str().into(),
            entry.as_str().into(),
            names.entry_binding_key().as_str().into(),
            ExchangeBindOptions::default(),
            FieldTable::default(),
        ),
    )
    .await?;
    Ok(())
}

/// The `consumed` shard queues: those below `shard_count` bound to the
/// hash exchange, the others (being retired) unbound from it.
async fn declare_shard_queues(
    ch: &Channel,
    names: &Names,
    queues: &QueueSettings,
    consumed: u16,
    shard_count: u16,
) -> Result<(), TopologyError> {
    let hash = names.hash_exchange();
    let queue_opts = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    for index in 0..consumed {
        let queue = names.shard_queue(index);
        call(
            "queue.declare",
            ch.queue_declare(queue.as_str().into(), queue_opts, shard_args(names, queues)),
        )
        .await
        .map_err(|e| mismatch_or(e, &queue))?;
        // Binding in index order appends each new shard at the end of the
        // ring; re-binding an existing shard changes nothing.
        let (route, unbind) = (queue.as_str().into(), index >= shard_count);
        if unbind {
            call(
                "queue.unbind",
                ch.queue_unbind(
                    route,
                    hash.as_str().into(),
                    "1".into(),
                    FieldTable::default(),
                ),
            )
            .await?;
        } else {
            call(
                "queue.bind",
                ch.queue_bind(
                    route,
                    hash.as_str().into(),
                    "1".into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                ),
            )
            .await?;
        }
    }
    Ok(())
}

/// Checks, with passive declares only (no configure permission needed),
/// that the topology for `shard_count` shards exists, for a worker running
/// with a least-privilege user (`TOPOLOGY_MODE=check`). Passive declares
/// cannot see arguments; `urutan topology` is what declares them.
///
/// RabbitMQ 4.2.6 and later refuse a passive declare (403) to a user with no
/// permission at all on the object; the worker user has none on the
/// exchanges and the DLQ (it only reads the shard queues). Such an object
/// cannot be checked: it is named in one warning, not a fatal error.
pub async fn check(
    conn: &Connection,
    names: &Names,
    shard_count: u16,
    allow_shrink: bool,
) -> Result<ShardPlan, TopologyError> {
    let existing = count_existing_shards(conn, names).await?;
    if existing < shard_count {
        return Err(TopologyError::Missing {
            object: names.shard_queue(existing),
        });
    }
    if existing > shard_count && !allow_shrink {
        return Err(TopologyError::Shrink {
            existing,
            wanted: shard_count,
        });
    }
    let mut unchecked = Vec::new();
    let passive_exchange = ExchangeDeclareOptions {
        passive: true,
        ..Default::default()
    };
    for exchange in [
        names.entry_exchange(),
        names.hash_exchange(),
        names.dead_letter_exchange(),
    ] {
        // A missing object closes the channel: one channel per probe.
        let ch = call("channel.open", conn.create_channel()).await?;
        let probe = ch.exchange_declare(
            exchange.as_str().into(),
            ExchangeKind::Direct,
            passive_exchange,
            FieldTable::default(),
        );
        match call("exchange.declare", probe).await {
            Ok(()) => {}
            Err(BrokerError::Amqp(e)) if is_not_found(&e) => {
                return Err(TopologyError::Missing { object: exchange });
            }
            Err(BrokerError::Amqp(e)) if is_access_refused(&e) => {
                unchecked.push(exchange);
                continue;
            }
            Err(e) => return Err(e.into()),
        }
        let _ = call("channel.close", ch.close(200, "checked".into())).await;
    }
    let ch = call("channel.open", conn.create_channel()).await?;
    let passive_queue = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let dlq = names.dead_letter_queue();
    let probe = ch.queue_declare(dlq.as_str().into(), passive_queue, FieldTable::default());
    match call("queue.declare", probe).await {
        Ok(_) => {}
        Err(BrokerError::Amqp(e)) if is_not_found(&e) => {
            return Err(TopologyError::Missing { object: dlq });
        }
        Err(BrokerError::Amqp(e)) if is_access_refused(&e) => unchecked.push(dlq),
        Err(e) => return Err(e.into()),
    }
    let _ = call("channel.close", ch.close(200, "checked".into())).await;
    if !unchecked.is_empty() {
        tracing::warn!(
            objects = %unchecked.join(", "),
            "topology check: not checked, this user has no permission on them (RabbitMQ \
             4.2.6+ refuses a passive declare then); `urutan topology` declares them"
        );
    }
    Ok(ShardPlan {
        bound: shard_count,
        consumed: existing,
    })
}

/// Number of consecutive shard queues `000, 001, ...` on the broker. The
/// first missing one closes the probing channel, which ends the count.
pub async fn count_existing_shards(conn: &Connection, names: &Names) -> Result<u16, BrokerError> {
    let ch = call("channel.open", conn.create_channel()).await?;
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    for index in 0..=999 {
        let queue = names.shard_queue(index);
        let probe = ch.queue_declare(queue.as_str().into(), passive, FieldTable::default());
        match call("queue.declare", probe).await {
            Ok(_) => {}
            Err(BrokerError::Amqp(e)) if is_not_found(&e) => return Ok(index),
            Err(e) => return Err(e),
        }
    }
    let _ = call("channel.close", ch.close(200, "probe done".into())).await;
    Ok(1000)
}

/// Deletes every object of the topology named by `names` (messages
/// included). Only for throwaway topologies such as the demo's.
pub async fn delete_all(conn: &Connection, names: &Names) -> Result<(), BrokerError> {
    use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
    let shards = count_existing_shards(conn, names).await?;
    let ch = call("channel.open", conn.create_channel()).await?;
    let mut queues: Vec<String> = (0..shards).map(|i| names.shard_queue(i)).collect();
    queues.push(names.dead_letter_queue());
    for queue in queues {
        let delete = ch.queue_delete(queue.as_str().into(), QueueDeleteOptions::default());
        call("queue.delete", delete).await?;
    }
    for exchange in [
        names.hash_exchange(),
        names.entry_exchange(),
        names.dead_letter_exchange(),
    ] {
        let delete = ch.exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default());
        call("exchange.delete", delete).await?;
    }
    let _ = call("channel.close", ch.close(200, "deleted".into())).await;
    Ok(())
}

/// Declares the dead-letter queue with its caps; returns the channel to go
/// on with. A DLQ declared before the caps existed (same arguments without
/// them) is kept as it is, with one warning naming the policy that caps it:
/// a queue's arguments cannot change, and deleting it would lose its dead
/// letters.
async fn declare_dlq(
    conn: &Connection,
    ch: lapin::Channel,
    dlq: &str,
    queues: &QueueSettings,
) -> Result<lapin::Channel, TopologyError> {
    let opts = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    let capped = ch.queue_declare(dlq.into(), opts, dlq_args(queues));
    let refused = match call("queue.declare", capped).await {
        Ok(_) => return Ok(ch),
        Err(e) if reply_code(&e) == Some(406) => e,
        Err(e) => return Err(TopologyError::Broker(e)),
    };
    // The 406 closed the channel.
    let ch = call("channel.open", conn.create_channel()).await?;
    let legacy = ch.queue_declare(dlq.into(), opts, quorum_args(queues));
    if call("queue.declare", legacy).await.is_err() {
        return Err(mismatch_or(refused, dlq));
    }
    warn!(
        queue = %dlq,
        "the dead-letter queue was declared without length caps and keeps its arguments; cap it \
         with a policy: rabbitmqctl set_policy --apply-to queues urutan-dlq-caps '^{}$' \
         '{{\"max-length\":{},\"max-length-bytes\":{},\"overflow\":\"reject-publish\"}}'",
        dlq.replace('.', "\\."),
        queues.dlq.max_length,
        queues.dlq.max_bytes
    );
    Ok(ch)
}

/// The DLQ's arguments: a quorum queue capped by [`DlqCaps`], refusing
/// (never dropping) what does not fit.
fn dlq_args(queues: &QueueSettings) -> FieldTable {
    let mut args = quorum_args(queues);
    let cap = |n: u64| AMQPValue::LongLongInt(i64::try_from(n).unwrap_or(i64::MAX));
    args.insert("x-max-length".into(), cap(queues.dlq.max_length));
    args.insert("x-max-length-bytes".into(), cap(queues.dlq.max_bytes));
    args.insert("x-overflow".into(), string("reject-publish"));
    args
}

fn quorum_args(queues: &QueueSettings) -> FieldTable {
    let mut args = FieldTable::default();
    args.insert("x-queue-type".into(), string("quorum"));
    if let Some(size) = queues.quorum_group_size {
        args.insert(
            "x-quorum-initial-group-size".into(),
            AMQPValue::LongLongInt(i64::from(size)),
        );
    }
    args
}

fn shard_args(names: &Names, queues: &QueueSettings) -> FieldTable {
    let delivery_limit = queues.delivery_limit;
    let mut args = quorum_args(queues);
    args.insert("x-single-active-consumer".into(), AMQPValue::Boolean(true));
    args.insert(
        "x-delivery-limit".into(),
        AMQPValue::LongLongInt(i64::from(delivery_limit)),
    );
    args.insert(
        "x-dead-letter-exchange".into(),
        string(&names.dead_letter_exchange()),
    );
    args.insert("x-dead-letter-strategy".into(), string("at-least-once"));
    args.insert("x-overflow".into(), string("reject-publish"));
    args
}

fn string(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s.as_bytes()))
}

fn reply_code(e: &BrokerError) -> Option<u16> {
    match e {
        BrokerError::Amqp(e) => amqp_reply_code(e),
        _ => None,
    }
}

/// The broker's reply text of a refusal (e.g. "ACCESS_REFUSED - access to
/// exchange 'pesanan.dlx' in vhost '/' refused for user 'urutan-worker'").
pub(crate) fn refusal_text(e: &lapin::Error) -> String {
    match e.kind() {
        lapin::ErrorKind::ProtocolError(amqp) => amqp.get_message().to_string(),
        _ => e.to_string(),
    }
}

/// 406 PRECONDITION_FAILED on a declare: the object exists with other arguments.
fn mismatch_or(e: BrokerError, object: &str) -> TopologyError {
    if reply_code(&e) == Some(406) {
        TopologyError::Mismatch {
            object: object.to_owned(),
            detail: e.to_string(),
        }
    } else {
        TopologyError::Broker(e)
    }
}

/// "invalid exchange type": the plugin is not enabled. RabbitMQ 3.10 says so
/// with 503 COMMAND_INVALID (closing the connection), 4.x with 406
/// PRECONDITION_FAILED (closing the channel), which reads as a mismatch.
fn plugin_missing_or(e: TopologyError) -> TopologyError {
    match e {
        TopologyError::Broker(b)
            if reply_code(&b) == Some(503) || b.to_string().contains("invalid exchange type") =>
        {
            TopologyError::PluginMissing
        }
        TopologyError::Mismatch { detail, .. } if detail.contains("invalid exchange type") => {
            TopologyError::PluginMissing
        }
        other => other,
    }
}
