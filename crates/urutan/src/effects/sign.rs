//! Standard Webhooks signatures: `webhook-signature` is `v1,<base64 of
//! HMAC-SHA256(key, "{webhook-id}.{webhook-timestamp}.{body}")>`, one per
//! key, separated by spaces.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::routes::Secret;

/// An effect's idempotency key (`webhook-id` and `Idempotency-Key`):
/// `<message_id>.<12 hex digits of SHA-256 of the endpoint URL>`. Per
/// endpoint, so that a receiver deduplicating keys across endpoints (one
/// gateway in front of several) takes each endpoint's effect of a version;
/// the same on every resend, since an effect keeps its message id and URL.
/// The URL is hashed, not shown: its path may hold a token.
pub fn idempotency_key(message_id: &str, url: &str) -> String {
    use sha2::Digest as _;
    let digest = Sha256::digest(url.as_bytes());
    let hex: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    format!("{message_id}.{hex}")
}

/// The `webhook-signature` header value for one request.
pub fn signature(secret: &Secret, id: &str, timestamp: i64, body: &[u8]) -> String {
    secret
        .keys()
        .iter()
        .map(|key| {
            // HMAC takes a key of any length: `new_from_slice` cannot fail.
            let mut mac = Hmac::<Sha256>::new_from_slice(key)
                .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
            mac.update(id.as_bytes());
            mac.update(b".");
            mac.update(timestamp.to_string().as_bytes());
            mac.update(b".");
            mac.update(body);
            format!("v1,{}", BASE64.encode(mac.finalize().into_bytes()))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// True if one of the space-separated `v1,` signatures of `header` is the
/// one `secret` makes (what a receiver checks; used by the tests).
pub fn verify(secret: &Secret, header: &str, id: &str, timestamp: i64, body: &[u8]) -> bool {
    let expected = signature(secret, id, timestamp, body);
    let expected: Vec<&str> = expected.split(' ').collect();
    header.split(' ').any(|sig| expected.contains(&sig))
}

/// The Standard Webhooks headers of a received request, as a receiver
/// reads them (the tests', the demo's and the fault suite's payment
/// endpoints); missing or unreadable headers read as empty (timestamp 0).
#[derive(Debug, Clone, Default)]
pub struct Received {
    /// `webhook-id`: the idempotency key ([`idempotency_key`]: the applied
    /// message's id and a hash of the endpoint).
    pub id: String,
    /// `webhook-timestamp`, seconds since the epoch.
    pub timestamp: i64,
    /// `webhook-signature`.
    pub signature: String,
    /// `Idempotency-Key` (urutan sends the same value as `webhook-id`).
    pub idempotency_key: String,
}

impl Received {
    pub fn from_headers(headers: &axum::http::HeaderMap) -> Self {
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned()
        };
        Self {
            id: header("webhook-id"),
            timestamp: header("webhook-timestamp").parse().unwrap_or(0),
            signature: header("webhook-signature"),
            idempotency_key: header("idempotency-key"),
        }
    }

    /// True if the signature is one `secret` makes for this id, timestamp
    /// and `body`.
    pub fn signed_by(&self, secret: &Secret, body: &[u8]) -> bool {
        verify(secret, &self.signature, &self.id, self.timestamp, body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test vector of the Standard Webhooks specification.
    #[test]
    fn matches_the_standard_webhooks_test_vector() {
        let secret = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").expect("secret");
        let sig = signature(
            &secret,
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1_614_265_330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn idempotency_keys_are_per_endpoint_and_stable() {
        let pay = idempotency_key("m-7", "https://gw.internal/pay");
        let index = idempotency_key("m-7", "https://gw.internal/index");
        assert_ne!(pay, index, "one key per endpoint");
        assert_eq!(pay, idempotency_key("m-7", "https://gw.internal/pay"));
        assert!(
            pay.starts_with("m-7.") && pay.len() == "m-7.".len() + 12,
            "{pay}"
        );
        assert!(!pay.contains("pay"), "the URL is hashed, never shown");
    }

    #[test]
    fn every_key_signs_and_any_one_verifies() {
        let both = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw plain-secret-0123456789")
            .expect("two keys");
        let header = signature(&both, "m-1", 1_700_000_000, b"{}");
        assert_eq!(header.split(' ').count(), 2);
        let new_only = Secret::parse("plain-secret-0123456789").expect("one key");
        assert!(verify(&new_only, &header, "m-1", 1_700_000_000, b"{}"));
        assert!(!verify(&new_only, &header, "m-2", 1_700_000_000, b"{}"));
        assert!(!verify(&new_only, &header, "m-1", 1_700_000_001, b"{}"));
        assert!(!verify(&new_only, &header, "m-1", 1_700_000_000, b"{ }"));
    }
}
