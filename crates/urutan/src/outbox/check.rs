//! What the relay publishes: an outbox row that meets the contract's section 2
//! (docs/contract.md, section 4), checked with the worker's own decoder
//! ([`crate::message::decode`]) so the two never disagree. A row that does
//! not is set aside with a [`SetAside`] reason and never reaches the broker.
//! Pure code.

use crate::message::{self, EntityHeader, Envelope, Rejection};

/// Why the relay set an outbox row aside instead of publishing it: the
/// bounded `reason` of `urutan_outbox_set_aside_total`, `urutan status` and
/// the `outbox.alasan_sisih` column (migration 0038).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetAside {
    /// The broker returned it: its routing key is outside `<prefix>.#`.
    Unroutable,
    /// An empty routing key.
    RoutingKeyEmpty,
    /// A routing key over 255 bytes (an AMQP short string).
    RoutingKeyTooLong,
    /// An entity id (`agregat_id`) over 128 bytes.
    EntityIdTooLong,
    /// An empty entity id, or one with control characters.
    EntityIdInvalid,
    /// The payload is not a contract body.
    PayloadInvalid,
    /// The body is over `MAX_BODY_BYTES`.
    BodyTooLarge,
    /// The broker refused it: a nack-free refusal that closed the channel or
    /// the connection while this row was the one being published.
    BrokerRefused,
}

impl SetAside {
    /// Every reason (a new variant belongs here too).
    pub const ALL: [SetAside; 8] = [
        SetAside::Unroutable,
        SetAside::RoutingKeyEmpty,
        SetAside::RoutingKeyTooLong,
        SetAside::EntityIdTooLong,
        SetAside::EntityIdInvalid,
        SetAside::PayloadInvalid,
        SetAside::BodyTooLarge,
        SetAside::BrokerRefused,
    ];

    /// The code: a metric label and the value of `outbox.alasan_sisih`.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Unroutable => "unroutable",
            Self::RoutingKeyEmpty => "routing_key_empty",
            Self::RoutingKeyTooLong => "routing_key_too_long",
            Self::EntityIdTooLong => "entity_id_too_long",
            Self::EntityIdInvalid => "entity_id_invalid",
            Self::PayloadInvalid => "payload_invalid",
            Self::BodyTooLarge => "body_too_large",
            Self::BrokerRefused => "broker_refused",
        }
    }
}

/// The parts of an outbox row the contract talks about.
#[derive(Debug, Clone, Copy)]
pub struct Candidate<'a> {
    /// `outbox.id`: the message id.
    pub id: i64,
    pub agregat_id: &'a str,
    pub routing_key: &'a str,
    /// `payload::text`: the body as published.
    pub payload: &'a str,
}

/// A row that may not be published: the reason, and a line saying why (sizes,
/// never the values: an id may be 200 KB, a payload anything).
pub type Refusal = (SetAside, String);

/// The length of the longest header value the relay adds beside the entity
/// id (`traceparent`, 55 bytes), with room for its name and encoding.
const OTHER_HEADERS_BYTES: usize = 128;

/// Whether `row` may be published, against contract section 2 and the
/// broker's limits: routing key 1-255 bytes (a short string), entity id
/// 1-128 bytes of plain text, the payload a contract body whose `id` is the
/// entity id, at most `max_body_bytes`. Never panics, whatever the row.
pub fn check(row: &Candidate<'_>, max_body_bytes: usize) -> Result<(), Refusal> {
    let key = row.routing_key.len();
    if key == 0 {
        return Err((SetAside::RoutingKeyEmpty, "the routing key is empty".into()));
    }
    if key > 255 {
        return Err((
            SetAside::RoutingKeyTooLong,
            format!("the routing key is {key} bytes; at most 255 (an AMQP short string)"),
        ));
    }
    let id = row.agregat_id.len();
    if id > 128 {
        return Err((
            SetAside::EntityIdTooLong,
            format!("agregat_id is {id} bytes; the entity id is at most 128"),
        ));
    }
    let message_id = row.id.to_string();
    let envelope = Envelope {
        message_id: Some(&message_id),
        entity_header: EntityHeader::Text(row.agregat_id.as_bytes()),
        delivery_mode: Some(2),
        timestamp: None,
        body: row.payload.as_bytes(),
        headers_bytes: id + OTHER_HEADERS_BYTES,
        headers_depth: 0,
    };
    match message::decode(&envelope, max_body_bytes) {
        Ok(_) => Ok(()),
        Err(rejection) => Err(refusal(rejection, row.payload.len(), max_body_bytes)),
    }
}

/// The set-aside reason of what the worker's decoder refused.
fn refusal(rejection: Rejection, body: usize, max_body_bytes: usize) -> Refusal {
    match rejection {
        Rejection::InvalidEntityHeader | Rejection::MissingEntityHeader => (
            SetAside::EntityIdInvalid,
            format!("agregat_id: {rejection}"),
        ),
        Rejection::BodyTooLarge => (
            SetAside::BodyTooLarge,
            format!("the payload is {body} bytes; MAX_BODY_BYTES is {max_body_bytes}"),
        ),
        other => (
            SetAside::PayloadInvalid,
            format!("the payload is not a contract body: {other}"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: usize = 1024 * 1024;

    fn row<'a>(agregat_id: &'a str, routing_key: &'a str, payload: &'a str) -> Candidate<'a> {
        Candidate {
            id: 7,
            agregat_id,
            routing_key,
            payload,
        }
    }

    fn reason(row: Candidate<'_>) -> Option<&'static str> {
        check(&row, LIMIT).err().map(|(r, _)| r.reason())
    }

    #[test]
    fn a_contract_row_passes() {
        let body = r#"{"id": "P-1", "status": "dibuat", "versi": 1, "data": {"x": [1]}}"#;
        assert_eq!(reason(row("P-1", "pesanan.dibuat", body)), None);
        let max_key = format!("pesanan.{}", "k".repeat(247));
        assert_eq!(reason(row("P-1", &max_key, body)), None);
    }

    #[test]
    fn keys_and_ids_out_of_bounds_are_named() {
        let body = r#"{"id": "P", "status": "s", "versi": 1}"#;
        let long_key = "k".repeat(300);
        assert_eq!(
            reason(row("P", &long_key, body)),
            Some("routing_key_too_long")
        );
        assert_eq!(reason(row("P", "", body)), Some("routing_key_empty"));
        let long_id = "i".repeat(200 * 1024);
        let (why, said) = check(&row(&long_id, "pesanan.x", body), LIMIT).expect_err("long id");
        assert_eq!(why, SetAside::EntityIdTooLong);
        assert!(said.len() < 100, "the detail never holds the value: {said}");
        for bad in ["", "a\nb", "x\u{fffd}", "\u{9b}"] {
            let body = format!(
                r#"{{"id": {}, "status": "s", "versi": 1}}"#,
                serde_json::json!(bad)
            );
            assert_eq!(
                reason(row(bad, "pesanan.x", &body)),
                Some("entity_id_invalid"),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_payload_that_is_not_a_contract_body_is_named() {
        for body in [
            "[1, 2]",
            "\"text\"",
            r#"{"status": "s", "versi": 1}"#,
            r#"{"id": "Q", "status": "s", "versi": 1}"#,
            r#"{"id": "P", "status": "", "versi": 1}"#,
            r#"{"id": "P", "status": "s", "versi": 0}"#,
            r#"{"id": "P", "status": "s", "versi": 1.5}"#,
            r#"{"id": "P", "status": "s", "versi": 9007199254740992}"#,
            r#"{"id": "P", "status": "s"}"#,
        ] {
            assert_eq!(
                reason(row("P", "pesanan.x", body)),
                Some("payload_invalid"),
                "{body}"
            );
        }
    }

    #[test]
    fn a_body_over_the_limit_is_named() {
        let body = r#"{"id": "P", "status": "s", "versi": 1}"#;
        let (why, said) = check(&row("P", "pesanan.x", body), body.len() - 1).expect_err("big");
        assert_eq!(why, SetAside::BodyTooLarge);
        assert!(said.contains("MAX_BODY_BYTES"), "{said}");
        assert!(check(&row("P", "pesanan.x", body), body.len()).is_ok());
    }

    #[test]
    fn every_reason_is_distinct_and_a_label() {
        let labels: std::collections::HashSet<_> =
            SetAside::ALL.iter().map(|r| r.reason()).collect();
        assert_eq!(labels.len(), SetAside::ALL.len());
        for label in labels {
            assert!(
                !label.is_empty() && label.len() <= 40,
                "{label}: the column's CHECK takes [a-z_]{{1,40}}"
            );
            assert!(label.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'));
        }
    }
}
