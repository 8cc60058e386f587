//! Walking the DLQ without ever handing a message back to it.
//!
//! AMQP 0-9-1 has no way to look at a queued message without taking it.
//! Giving a taken message back (`basic.reject`/`basic.nack` with requeue,
//! or closing the channel) counts as a delivery: on RabbitMQ 3.10 each of
//! those, from 4.3 only rejects and crashes. Quorum queues have a DEFAULT
//! delivery limit of 20 from 4.0 (a policy can set one on 3.10 too), and
//! the DLQ has no dead-letter exchange, so a message peeked that way often
//! enough would be DROPPED. So a walk never hands anything back. Each message
//! is taken (`basic.get`) and then, with publisher confirms:
//! - kept: published again to the END of the DLQ (default exchange, routing
//!   key = the DLQ, `mandatory`) with its properties and headers, `x-death`
//!   included, minus `x-delivery-count`; only once the broker confirmed the
//!   copy is the original acked. The copy is a new message: delivery count 0.
//! - replayed: published to the entry exchange (see [`Walker::replay`]);
//! - removed (purge): acked.
//!
//! What a crash can do: between confirm and ack, the message is in the DLQ
//! twice (same delivery key: one record); before the confirm, the channel
//! closes with the message unacked, which counts ONE delivery (a 4.x queue
//! would need 20 such crashes on the same message to drop it). A walk takes
//! at most the number of messages the queue held when it started, so it
//! never meets its own copies (they go behind those), nor messages
//! dead-lettered meanwhile. A second copy identical to a message the walk
//! already took (what such a crash, or at-least-once dead-lettering, leaves
//! behind) is removed: it holds nothing the first does not, and would keep
//! the queue's depth above its records.
//!
//! On the way, every message gets its record: the unresolved row of its
//! delivery key and order id is looked up (one record per (key, order):
//! two orders' messages may share an id), a message without one (dead-lettered by the
//! broker itself, or before these records existed) is recorded from the
//! message (`recorded_by = 'queue'`), and the broker's `x-death` is stored
//! in a row that has none yet.

use std::collections::HashMap;
use std::time::Duration;

use lapin::message::Delivery;
use lapin::options::QueueDeclareOptions;
use lapin::options::{BasicAckOptions, BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionStatus};
use sqlx::PgPool;

use super::DlqError;
use super::unreadable;
use urutan::broker::{Names, call};
use urutan::dead_letter;
use urutan::store::dead_letter::{Unresolved, find_unresolved};
use urutan::store::resolve_dead_letter;

/// A message taken from the DLQ, not yet settled.
pub(crate) struct Taken {
    pub delivery: Delivery,
    pub key: String,
    /// Its order id, as its record keeps it ([`dead_letter::order_id`]).
    pub order: Option<String>,
    /// Its unresolved record (`None` only for a second copy of a key whose
    /// record this walk already resolved).
    pub row: Option<Unresolved>,
    /// Another message with a key this walk already took (not identical:
    /// identical copies are removed, see the module doc).
    pub copy: bool,
}

/// How a replay's publish ended.
pub(crate) enum Published {
    /// Confirmed; the message left the DLQ and its record is resolved.
    Confirmed { routing_key: String },
    /// Returned unroutable or refused by the broker: kept in the DLQ.
    Kept(String),
}

/// One walk over the DLQ on its own confirm-mode channel.
pub(crate) struct Walker<'a> {
    ch: Channel,
    /// The connection's status: lapin drops the whole connection when it
    /// cannot parse a delivery.
    connection: ConnectionStatus,
    db: &'a PgPool,
    names: &'a Names,
    queue: String,
    max_body_bytes: usize,
    /// (Key, order)s taken so far, with the content digest of what was taken.
    taken_keys: HashMap<(String, Option<String>), String>,
    /// Messages in the queue when the walk started: the most it takes.
    pub depth: u32,
    taken: u32,
    /// Every message the walk set out to take was taken (or the queue ran
    /// empty), none unreadable.
    complete: bool,
    /// Messages recorded from the queue during this walk.
    pub recorded: u64,
    /// Identical copies removed during this walk.
    pub duplicates: u64,
}

impl<'a> Walker<'a> {
    pub async fn open(
        conn: &Connection,
        db: &'a PgPool,
        names: &'a Names,
        max_body_bytes: usize,
    ) -> Result<Self, DlqError> {
        let depth = depth(conn, names).await?;
        let ch = call("channel.open", conn.create_channel()).await?;
        let confirms = ch.confirm_select(ConfirmSelectOptions::default());
        call("confirm.select", confirms).await?;
        Ok(Self {
            ch,
            connection: conn.status().clone(),
            db,
            names,
            queue: names.dead_letter_queue(),
            max_body_bytes,
            taken_keys: HashMap::new(),
            depth,
            taken: 0,
            complete: false,
            recorded: 0,
            duplicates: 0,
        })
    }

    /// Takes the next message (`None`: the walk is over: [`Self::depth`]
    /// messages taken, or the queue is empty) and finds or writes its
    /// record. A message this client cannot parse drops the connection:
    /// that is [`DlqError::Unreadable`] (the broker gets the message back,
    /// which counts as one delivery), and it is recorded (see
    /// [`unreadable`]) so that no automatic walk tries again.
    pub async fn take(&mut self) -> Result<Option<Taken>, DlqError> {
        loop {
            let Some(delivery) = self.get().await? else {
                return Ok(None);
            };
            let key = dead_letter::delivery_key(&delivery.properties, &delivery.data);
            let order = dead_letter::order_id(
                &delivery.properties,
                &delivery.data,
                self.names.entity_header(),
            );
            let digest = dead_letter::content_digest(&delivery.properties, &delivery.data);
            let taken = (key, order);
            let copy = match self.taken_keys.get(&taken) {
                Some(seen) if *seen == digest => {
                    ack(&delivery).await?;
                    self.duplicates += 1;
                    continue;
                }
                Some(_) => true,
                None => {
                    self.taken_keys.insert(taken.clone(), digest);
                    false
                }
            };
            let (key, order) = taken;
            return self.with_record(delivery, key, order, copy).await.map(Some);
        }
    }

    /// `basic.get`, bounded by the walk's depth.
    async fn get(&mut self) -> Result<Option<Delivery>, DlqError> {
        if self.taken >= self.depth {
            self.complete = true;
            return Ok(None);
        }
        let get = self
            .ch
            .basic_get(self.queue.as_str().into(), BasicGetOptions::default());
        let lost = async {
            while self.connection.connected() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        let got = tokio::select! {
            biased;
            got = call("basic.get", get) => got,
            () = lost => {
                let row = unreadable::record(self.names);
                urutan::store::insert_dead_letter(self.db, &row).await?;
                return Err(DlqError::Unreadable(self.queue.clone()));
            }
        };
        let Some(message) = got.map_err(|e| DlqError::broker(e, "read (basic.get) the DLQ"))?
        else {
            self.complete = true;
            return Ok(None);
        };
        self.taken += 1;
        Ok(Some(message.delivery))
    }

    /// `delivery` with its record: found, or written from the message.
    async fn with_record(
        &mut self,
        delivery: Delivery,
        key: String,
        order: Option<String>,
        copy: bool,
    ) -> Result<Taken, DlqError> {
        let mut row = find_unresolved(self.db, &key, order.as_deref()).await?;
        if row.is_none() && !copy {
            let new = dead_letter::found_in_queue(
                &delivery,
                self.names.entity_header(),
                self.max_body_bytes,
            );
            if urutan::store::insert_dead_letter(self.db, &new)
                .await?
                .is_some()
            {
                self.recorded += 1;
            }
            row = find_unresolved(self.db, &key, order.as_deref()).await?;
        }
        let deaths = dead_letter::deaths(&delivery.properties);
        if let Some(row) = row.as_ref().filter(|r| !r.has_death && !deaths.is_empty()) {
            urutan::store::store_dead_letter_x_death(self.db, row.id, &deaths).await?;
        }
        Ok(Taken {
            delivery,
            key,
            order,
            row,
            copy,
        })
    }

    /// Puts `taken` at the end of the DLQ (see the module doc).
    pub async fn keep(&self, taken: Taken) -> Result<(), DlqError> {
        let props = with_headers(&taken.delivery.properties, |name| {
            name != "x-delivery-count"
        });
        let confirmation = self
            .publish("", &self.queue, &taken.delivery.data, props)
            .await
            .map_err(|e| DlqError::broker(e, "publish to the default exchange (amq.default)"))?;
        match confirmation {
            Confirmation::Ack(None) => ack(&taken.delivery).await,
            other => Err(DlqError::NotKept(format!("{other:?}"))),
        }
    }

    /// Replays `taken`: its record is marked `replayed` in a transaction
    /// that commits only after the broker confirmed the message on the
    /// entry exchange (`mandatory`: an unroutable message is returned, not
    /// confirmed into nowhere); then it is acked in the DLQ. The transaction
    /// holds the row while the message may already be dead-lettered again:
    /// the worker's new record of it waits for this commit and then finds
    /// the old row resolved, so it is recorded anew, never absorbed.
    /// A publish that is not confirmed keeps the message in the DLQ.
    pub async fn replay(&self, taken: Taken) -> Result<Published, DlqError> {
        let routing_key = self.replay_routing_key(&taken);
        let mut tx = self.db.begin().await?;
        if let (Some(row), false) = (&taken.row, taken.copy) {
            resolve_dead_letter(&mut *tx, row.id, "replayed").await?;
        }
        let props = with_headers(&taken.delivery.properties, |n| {
            !dead_letter::is_added_header(n)
        });
        let entry = self.names.entry_exchange();
        let confirmation = self
            .publish(&entry, &routing_key, &taken.delivery.data, props)
            .await
            .map_err(|e| DlqError::broker(e, &format!("publish to `{entry}`")))?;
        let why = match confirmation {
            Confirmation::Ack(None) => {
                tx.commit().await?;
                ack(&taken.delivery).await?;
                return Ok(Published::Confirmed { routing_key });
            }
            Confirmation::Ack(Some(returned)) => format!(
                "returned unroutable by `{entry}` with routing key `{routing_key}` ({})",
                returned.reply_text
            ),
            other => format!("not confirmed by the broker ({other:?})"),
        };
        tx.rollback().await?;
        self.keep(taken).await?;
        Ok(Published::Kept(why))
    }

    /// Removes `taken` from the DLQ: its record is marked `purged`
    /// (committed) before the ack.
    pub async fn remove(&self, taken: Taken) -> Result<(), DlqError> {
        if let (Some(row), false) = (&taken.row, taken.copy) {
            resolve_dead_letter(self.db, row.id, "purged").await?;
        }
        ack(&taken.delivery).await
    }

    /// Where a replay goes is urutan's choice, never the message's: always
    /// the entry exchange (whose `<prefix>.#` binding leads to the hash
    /// exchange, which routes on the `x-pesanan-id` header alone), with the
    /// routing key the worker recorded when it saw the message, if the
    /// entry exchange routes it; else `<prefix>.replay`. The message's own
    /// `x-death` is not read: a producer can write one (the broker keeps a
    /// producer's entry that names the same queue and reason, count
    /// raised), naming any exchange and routing key.
    fn replay_routing_key(&self, taken: &Taken) -> String {
        let recorded = taken
            .row
            .as_ref()
            .and_then(|r| r.worker_routing_key.clone());
        let key = recorded.unwrap_or_default();
        let prefix = self.names.entry_exchange();
        let routed = key == prefix || key.starts_with(&format!("{prefix}."));
        if routed {
            key
        } else {
            format!("{prefix}.replay")
        }
    }

    async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        props: BasicProperties,
    ) -> Result<Confirmation, urutan::broker::BrokerError> {
        let options = BasicPublishOptions {
            mandatory: true,
            ..Default::default()
        };
        let publish =
            self.ch
                .basic_publish(exchange.into(), routing_key.into(), options, body, props);
        let confirm = call("basic.publish", publish).await?;
        call("publisher confirm", confirm).await
    }

    /// Ends the walk. After a complete one, a recorded unreadable message
    /// is gone (someone removed it): its record is resolved.
    pub async fn close(self) -> Result<(), DlqError> {
        let _ = call("channel.close", self.ch.close(200, "done".into())).await;
        if self.complete {
            urutan::store::purge_dead_letter_by_key(self.db, &unreadable::key(self.names)).await?;
        }
        Ok(())
    }
}

/// Messages in the DLQ now (a passive declare: no permission needed, and
/// no message is touched).
pub(crate) async fn depth(conn: &Connection, names: &Names) -> Result<u32, DlqError> {
    let ch = call("channel.open", conn.create_channel()).await?;
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let queue = names.dead_letter_queue();
    let declare = ch.queue_declare(queue.as_str().into(), passive, FieldTable::default());
    let declared = call("queue.declare", declare).await.map_err(|e| match &e {
        urutan::broker::BrokerError::Amqp(amqp) if urutan::broker::topology::is_not_found(amqp) => {
            DlqError::NoQueue(queue.clone())
        }
        _ => DlqError::broker(e, &format!("find the queue `{queue}`")),
    })?;
    let _ = call("channel.close", ch.close(200, "done".into())).await;
    Ok(declared.message_count())
}

async fn ack(delivery: &Delivery) -> Result<(), DlqError> {
    let acked = call("basic.ack", delivery.acker.ack(BasicAckOptions::default())).await?;
    // `false`: the channel is gone, the message stays in the DLQ.
    if acked {
        Ok(())
    } else {
        Err(urutan::broker::BrokerError::ChannelLost.into())
    }
}

/// `props` with only the headers `keep` accepts, and without `user_id`.
///
/// The broker refuses a publish whose `user_id` is not the publishing
/// connection's user (406 PRECONDITION_FAILED, closing the channel): a
/// producer's `user_id` kept would stop every walk at that message. It is
/// in the message's record (`properties`), and nothing in urutan reads it.
fn with_headers(props: &BasicProperties, keep: impl Fn(&str) -> bool) -> BasicProperties {
    let mut out = without_user_id(props);
    if let Some(headers) = props.headers() {
        let mut kept = FieldTable::default();
        for (name, value) in headers.inner() {
            if keep(name.as_str()) {
                kept.insert(name.clone(), value.clone());
            }
        }
        out = out.with_headers(kept);
    }
    out
}

/// `props` minus `user_id` (lapin's properties have no way to unset one).
fn without_user_id(props: &BasicProperties) -> BasicProperties {
    let mut out = BasicProperties::default();
    macro_rules! copy {
        ($($get:ident => $set:ident),*) => {
            $(if let Some(v) = props.$get() { out = out.$set(v.clone()); })*
        };
    }
    copy!(
        content_type => with_content_type,
        content_encoding => with_content_encoding,
        headers => with_headers,
        delivery_mode => with_delivery_mode,
        priority => with_priority,
        correlation_id => with_correlation_id,
        reply_to => with_reply_to,
        expiration => with_expiration,
        message_id => with_message_id,
        timestamp => with_timestamp,
        kind => with_type,
        app_id => with_app_id,
        cluster_id => with_cluster_id
    );
    out
}
