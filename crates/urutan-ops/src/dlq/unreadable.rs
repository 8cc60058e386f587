//! The record that stands for a message at the head of the DLQ that lapin
//! cannot parse (it drops the connection on such a delivery, e.g. a
//! `message_id` that is not UTF-8): nothing of it can be read, so it is one
//! record per queue, reason `unreadable`. While it is unresolved, `list` and
//! `show` do not walk the queue by themselves. The table's reads and writes
//! are the core's ([`urutan::store::dead_letter`]).

use serde_json::json;
use sqlx::PgPool;

use urutan::broker::Names;
use urutan::store::NewDeadLetter;
use urutan::store::dead_letter::{self, Subject};

/// The delivery key of the record, before the DLQ's name.
pub(crate) const PREFIX: &str = "unreadable:";

/// The delivery key of the unreadable message's record for `names`' DLQ.
pub(crate) fn key(names: &Names) -> String {
    format!("{PREFIX}{}", names.dead_letter_queue())
}

/// The record of an unreadable message in `names`' DLQ, to insert.
pub(crate) fn record(names: &Names) -> NewDeadLetter {
    NewDeadLetter {
        subject: Subject {
            delivery_key: key(names),
            message_id: None,
            pesanan_id: None,
            versi: None,
            shard: -1,
            reason: "unreadable".to_owned(),
            detail: "a message in the DLQ that urutan's AMQP client cannot parse (e.g. a \
                     message_id that is not UTF-8); remove it with the management UI"
                .to_owned(),
            last_error: None,
        },
        recorded_by: "queue",
        exchange: None,
        routing_key: None,
        properties: json!({}),
        headers: json!({}),
        body: Vec::new(),
        body_bytes: 0,
        x_death: None,
        dead_lettered_at: None,
    }
}

/// Whether an unreadable message is recorded in the DLQ.
pub(crate) async fn known(db: &PgPool, names: &Names) -> Result<bool, sqlx::Error> {
    dead_letter::is_unresolved(db, &key(names)).await
}
