//! The relay's publishing of one batch of outbox rows: in waves that hold at
//! most one row per aggregate, each wave's confirms awaited before the next.
//! What the broker says of each row decides its fate: confirmed (marked
//! sent), returned as unroutable (set aside), nacked (retried later), or
//! refused by closing the channel or the connection (the row's fault, not an
//! outage: see [`Published::refused`]).

use std::collections::HashMap;
use std::time::Instant;

use chrono::{DateTime, Utc};
use lapin::options::BasicPublishOptions;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, PublisherConfirm};
use opentelemetry::trace::SpanKind;
use tracing::warn;

use super::check::SetAside;
use crate::broker::{BrokerError, Names, call};
use crate::heal;
use crate::metrics as m;
use crate::trace::{self, TraceParent, Traces};

/// One outbox row on its way out.
#[derive(Debug, sqlx::FromRow)]
pub(super) struct Row {
    pub(super) id: i64,
    pub(super) agregat_id: String,
    pub(super) routing_key: String,
    pub(super) payload: String,
    pub(super) dibuat_pada: DateTime<Utc>,
    /// The producer's trace context, as written (checked when published).
    pub(super) traceparent: Option<String>,
}

/// What the broker made of a batch.
#[derive(Debug, Default)]
pub(super) struct Published {
    /// Confirmed: to be marked sent.
    pub(super) confirmed: Vec<i64>,
    /// Returned as unroutable, or refused alone: set aside, with why.
    pub(super) set_aside: Vec<(i64, SetAside, String)>,
    /// The broker closed the channel or the connection because of what was
    /// being published (a frame or precondition error), after which nothing
    /// more of the batch was sent: the rows in flight then, and what it
    /// said. One row in flight is the culprit (it is in `set_aside` too);
    /// several are published again one at a time to find it.
    pub(super) refused: Option<(Vec<i64>, String)>,
}

/// Publishes `rows` in waves (one per aggregate position, so no aggregate has
/// two messages in flight) and waits for each wave's confirms; `one_by_one`
/// publishes one row per wave (to tell which row the broker refuses). Stops
/// after a wave with a nack or an unexplained return (the rest is retried
/// later) or a refusal; any other broker failure is an error.
pub(super) async fn publish_waves(
    channel: &Channel,
    names: &Names,
    traces: &Traces,
    rows: &[&Row],
    one_by_one: bool,
) -> Result<Published, BrokerError> {
    let exchange = names.entry_exchange();
    let mut out = Published {
        confirmed: Vec::with_capacity(rows.len()),
        ..Published::default()
    };
    let mut all = waves(rows);
    if one_by_one {
        all = all.into_iter().flatten().map(|i| vec![i]).collect();
    }
    for wave in all {
        let started = Instant::now();
        let mut pending = Vec::with_capacity(wave.len());
        let mut failed = None;
        for &i in &wave {
            let mut span = publish_span(traces, &exchange, rows[i]);
            let confirm = publish(channel, &exchange, names.entity_header(), rows[i], &span);
            match confirm.await {
                Ok(confirm) => pending.push((rows[i], confirm, span)),
                Err(e) => {
                    span.fail("basic.publish failed");
                    failed = Some((rows[i].id, e));
                    break;
                }
            }
        }
        let mut in_flight: Vec<i64> = pending.iter().map(|(row, _, _)| row.id).collect();
        let mut complete = failed.is_none();
        let mut error = None;
        for (row, confirm, span) in pending {
            match confirmed(names, row, call("publisher confirm", confirm).await, span) {
                Ok(Fate::Confirmed) => out.confirmed.push(row.id),
                Ok(Fate::Unroutable(reason)) => {
                    out.set_aside.push((row.id, SetAside::Unroutable, reason))
                }
                Ok(Fate::Retry) => complete = false,
                Err(e) => {
                    error.get_or_insert(e);
                }
            }
        }
        metrics::histogram!(m::OUTBOX_PUBLISH_DURATION_SECONDS)
            .record(started.elapsed().as_secs_f64());
        if let Some((id, e)) = failed {
            in_flight.push(id);
            error.get_or_insert(e);
        }
        if let Some(e) = error {
            let Some(said) = refusal(&e) else {
                return Err(e);
            };
            in_flight.retain(|id| !out.confirmed.contains(id));
            if let [culprit] = in_flight[..] {
                let why = format!("the broker refused it: {said}");
                out.set_aside.push((culprit, SetAside::BrokerRefused, why));
            }
            out.refused = Some((in_flight, said));
            break;
        }
        if !complete {
            break;
        }
    }
    Ok(out)
}

/// What a publisher confirm says of one row.
enum Fate {
    Confirmed,
    /// Returned: its routing key is outside the entry binding, so no retry
    /// can route it (with why).
    Unroutable(String),
    /// Nacked, or returned although its key is inside the binding (is the
    /// topology declared?): published again later.
    Retry,
}

fn confirmed(
    names: &Names,
    row: &Row,
    confirmation: Result<Confirmation, BrokerError>,
    mut span: trace::Span,
) -> Result<Fate, BrokerError> {
    let id = row.id;
    span.set(
        "urutan.publish.result",
        match &confirmation {
            Ok(Confirmation::Ack(None)) => "confirmed",
            Ok(Confirmation::Ack(Some(_))) => "returned",
            Ok(Confirmation::Nack(_) | Confirmation::NotRequested) => "refused",
            Err(_) => "connection_lost",
        },
    );
    if !matches!(confirmation, Ok(Confirmation::Ack(None))) {
        span.fail("not confirmed");
    }
    Ok(match confirmation? {
        Confirmation::Ack(None) => Fate::Confirmed,
        Confirmation::Ack(Some(returned)) if !names.routes(&row.routing_key) => {
            warn!(
                outbox_id = id,
                "unroutable (returned, routing key outside the entry binding); set aside"
            );
            Fate::Unroutable(format!(
                "returned by the broker ({} {}): the routing key is outside `{}`",
                returned.reply_code,
                returned.reply_text,
                names.entry_binding_key()
            ))
        }
        Confirmation::Ack(Some(_)) => {
            warn!(
                outbox_id = id,
                "unroutable (returned); is the topology declared?"
            );
            Fate::Retry
        }
        Confirmation::Nack(_) | Confirmation::NotRequested => {
            // A full queue (`x-overflow = reject-publish`) nacks: it passes.
            warn!(outbox_id = id, "the broker refused the message (nack)");
            Fate::Retry
        }
    })
}

/// What the broker said, if it closed the channel or the connection because
/// of the message being published rather than an outage: 311
/// CONTENT_TOO_LARGE, 406 PRECONDITION_FAILED (e.g. over its
/// `max_message_size`), 501 FRAME_ERROR (e.g. a header frame over
/// `frame_max`), 502 SYNTAX_ERROR, 503 COMMAND_INVALID, 505
/// UNEXPECTED_FRAME. Not 320 CONNECTION_FORCED (a broker stopping or an
/// operator closing connections), nor an I/O error or a timeout.
pub(super) fn refusal(e: &BrokerError) -> Option<String> {
    let BrokerError::Amqp(e) = e else {
        return None;
    };
    let lapin::ErrorKind::ProtocolError(amqp) = e.kind() else {
        return None;
    };
    let code = amqp.get_id();
    matches!(code, 311 | 406 | 501 | 502 | 503 | 505)
        .then(|| format!("{code} {}", heal::one_line(amqp.get_message().as_str())))
}

/// Splits rows (in id order) into waves with at most one row per aggregate:
/// wave k holds the k-th row of every aggregate, so each aggregate's rows go
/// out in id order, one confirmed wave after another.
fn waves(rows: &[&Row]) -> Vec<Vec<usize>> {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    let mut waves: Vec<Vec<usize>> = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        let k = seen.entry(row.agregat_id.as_str()).or_insert(0);
        if waves.len() <= *k {
            waves.push(Vec::new());
        }
        waves[*k].push(i);
        *k += 1;
    }
    waves
}

/// The publish span of `row`: a child of the producer's `traceparent` if
/// it is a valid one, else the root of a new trace (the value itself is
/// never logged or recorded).
fn publish_span(traces: &Traces, exchange: &str, row: &Row) -> trace::Span {
    let given = row.traceparent.as_deref();
    let parent = given.and_then(|t| TraceParent::parse(t.as_bytes()));
    let mut span = traces.start("publish", SpanKind::Producer, parent);
    if span.is_recording() {
        span.set("messaging.system", "rabbitmq");
        span.set("messaging.destination.name", exchange.to_owned());
        span.set("messaging.message.id", row.id.to_string());
        span.set("urutan.order_id", row.agregat_id.clone());
        span.set("urutan.outbox_id", row.id);
        if given.is_some() && parent.is_none() {
            span.set("urutan.traceparent.invalid", true);
        }
    }
    span
}

/// Publishes one row (checked by `check::check` first). Every short string
/// is made with `ShortString::try_new`: a value over 255 bytes is a
/// refusal of this row, never a panic.
async fn publish(
    channel: &Channel,
    exchange: &str,
    entity_header: &str,
    row: &Row,
    span: &trace::Span,
) -> Result<PublisherConfirm, BrokerError> {
    let short = |s: String| {
        ShortString::try_new(s).map_err(|e| BrokerError::Amqp(lapin::Error::from(io_error(e))))
    };
    let mut headers = FieldTable::default();
    headers.insert(
        short(entity_header.to_owned())?,
        AMQPValue::LongString(LongString::from(row.agregat_id.as_bytes())),
    );
    headers.insert(
        short(trace::HEADER.to_owned())?,
        AMQPValue::LongString(LongString::from(span.traceparent().to_string())),
    );
    let props = BasicProperties::default()
        .with_message_id(short(row.id.to_string())?)
        .with_headers(headers)
        .with_delivery_mode(2)
        .with_content_type(short("application/json".to_owned())?)
        .with_timestamp(row.dibuat_pada.timestamp().max(0) as u64);
    let options = BasicPublishOptions {
        mandatory: true,
        ..Default::default()
    };
    let routing_key = short(row.routing_key.clone())?;
    let exchange = short(exchange.to_owned())?;
    call(
        "basic.publish",
        channel.basic_publish(
            exchange,
            routing_key,
            options,
            row.payload.as_bytes(),
            props,
        ),
    )
    .await
}

fn io_error(e: impl std::error::Error + Send + Sync + 'static) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::protocol::{AMQPError, AMQPErrorKind, AMQPHardError, AMQPSoftError};

    fn row(id: i64, agg: &str) -> Row {
        Row {
            id,
            agregat_id: agg.into(),
            routing_key: "pesanan.x".into(),
            payload: "{}".into(),
            dibuat_pada: Utc::now(),
            traceparent: None,
        }
    }

    fn closed(kind: AMQPErrorKind, text: &str) -> BrokerError {
        let amqp = AMQPError::new(kind, ShortString::try_new(text).expect("short"));
        BrokerError::Amqp(lapin::ErrorKind::ProtocolError(amqp).into())
    }

    #[test]
    fn only_keys_outside_the_entry_binding_are_unroutable() {
        let names = Names::new("pesanan");
        for key in ["pesanan", "pesanan.x", "pesanan.jakarta.dibuat", "pesanan."] {
            assert!(names.routes(key), "{key}");
        }
        for key in ["nowhere.x", "pesananx", "pesanan-hash", "", "x.pesanan"] {
            assert!(!names.routes(key), "{key}");
        }
    }

    #[test]
    fn waves_hold_one_row_per_aggregate_in_id_order() {
        let rows = [
            row(1, "A"),
            row(2, "B"),
            row(3, "A"),
            row(4, "A"),
            row(5, "C"),
            row(6, "B"),
        ];
        let rows: Vec<&Row> = rows.iter().collect();
        let waves = waves(&rows);
        assert_eq!(waves, vec![vec![0, 1, 4], vec![2, 5], vec![3]]);
        for wave in &waves {
            let aggs: std::collections::HashSet<_> =
                wave.iter().map(|&i| rows[i].agregat_id.as_str()).collect();
            assert_eq!(aggs.len(), wave.len());
        }
    }

    #[test]
    fn a_frame_or_precondition_error_is_the_rows_refusal_not_an_outage() {
        for (kind, code) in [
            (AMQPErrorKind::Hard(AMQPHardError::FRAMEERROR), 501),
            (AMQPErrorKind::Hard(AMQPHardError::SYNTAXERROR), 502),
            (AMQPErrorKind::Hard(AMQPHardError::UNEXPECTEDFRAME), 505),
            (AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED), 406),
            (AMQPErrorKind::Soft(AMQPSoftError::CONTENTTOOLARGE), 311),
        ] {
            let said = refusal(&closed(kind, "frame_too_large")).expect("a refusal");
            assert_eq!(said, format!("{code} frame_too_large"));
        }
        for kind in [
            AMQPErrorKind::Hard(AMQPHardError::CONNECTIONFORCED),
            AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND),
            AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED),
            AMQPErrorKind::Hard(AMQPHardError::INTERNALERROR),
        ] {
            assert_eq!(refusal(&closed(kind.clone(), "x")), None, "{kind:?}");
        }
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert_eq!(refusal(&BrokerError::Amqp(io.into())), None);
        assert_eq!(refusal(&BrokerError::Timeout("publisher confirm")), None);
    }
}
