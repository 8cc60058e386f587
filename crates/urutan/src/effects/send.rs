//! One HTTP attempt of one effect, and what its answer means (pure policy:
//! [`classify`], [`backoff`]).

use std::time::Duration;

use super::routes::{ProxyUrl, Secret};
use super::sign;
use super::store::Claimed;
use crate::trace::TraceParent;

/// Most bytes of an answer's body kept with a dead letter or retry.
const ANSWER_BYTES: usize = 2048;

/// What came back from one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// An HTTP answer: status, `Retry-After` (seconds, if given), body excerpt.
    Http {
        code: u16,
        retry_after: Option<u64>,
        body: String,
    },
    /// No answer within the timeout.
    Timeout,
    /// No answer at all (refused, reset, DNS, TLS, ...).
    Connection(String),
    /// The request cannot be made at all (e.g. a message id with a control
    /// character is not a valid header value): retrying cannot help.
    Invalid(String),
}

/// What an answer calls for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Sent,
    /// Try again later; the `reason` label of the retry counter.
    Retry(&'static str),
    /// Give up now; the `reason` label of the dead-letter counter.
    Dead(&'static str),
}

/// A 2xx is done; 408, 429, any 5xx, a timeout or a connection error is
/// retried; any other answer (4xx, and 1xx/3xx: redirects are not followed)
/// will not get better by retrying and is dead-lettered at once.
pub fn classify(answer: &Answer) -> Verdict {
    match answer {
        Answer::Http { code, .. } => match code {
            200..=299 => Verdict::Sent,
            408 => Verdict::Retry("http_408"),
            429 => Verdict::Retry("http_429"),
            500..=599 => Verdict::Retry("http_5xx"),
            400..=499 => Verdict::Dead("http_4xx"),
            _ => Verdict::Dead("http_other"),
        },
        Answer::Timeout => Verdict::Retry("timeout"),
        Answer::Connection(_) => Verdict::Retry("connection"),
        Answer::Invalid(_) => Verdict::Dead("invalid_request"),
    }
}

/// The dead-letter reason when retries run out.
pub const EXHAUSTED: &str = "attempts_exhausted";

/// Every `reason` the retry and dead-letter counters use (registered at zero).
pub const RETRY_REASONS: &[&str] = &["http_408", "http_429", "http_5xx", "timeout", "connection"];
pub const DEAD_REASONS: &[&str] = &["http_4xx", "http_other", "invalid_request", EXHAUSTED];

/// Delay before attempt `attempt + 1` after attempt `attempt` (1-based)
/// failed: `min * 2^(attempt-1)` capped at `max`, then "equal jitter" (a
/// random point in its upper half), and never less than a `Retry-After`
/// the endpoint asked for (itself capped at `max`). `unit` in [0, 1) is the
/// random draw.
pub fn backoff(
    attempt: i32,
    min: Duration,
    max: Duration,
    retry_after: Option<u64>,
    unit: f64,
) -> Duration {
    let exp = u32::try_from(attempt.saturating_sub(1))
        .unwrap_or(0)
        .min(30);
    let base = min.saturating_mul(1u32 << exp).min(max);
    let jittered = base.mul_f64(0.5 + 0.5 * unit.clamp(0.0, 1.0));
    let asked = retry_after.map_or(Duration::ZERO, |s| Duration::from_secs(s).min(max));
    jittered.max(asked)
}

/// The HTTP client: no redirects, no proxy but `proxy` (reqwest would
/// otherwise read `HTTP_PROXY`, `HTTPS_PROXY` and `ALL_PROXY`: whoever sets
/// one in the environment would see every signed webhook), TLS with rustls on
/// `ring`, `timeout` for the whole attempt (connect to last byte).
pub fn client(
    timeout: Duration,
    proxy: Option<&ProxyUrl>,
) -> Result<reqwest::Client, reqwest::Error> {
    // Installed once per process; a provider installed earlier stays.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let builder = reqwest::Client::builder().no_proxy();
    let builder = match proxy {
        Some(p) => builder.proxy(reqwest::Proxy::all(p.0.as_str())?),
        None => builder,
    };
    builder
        .timeout(timeout)
        .connect_timeout(timeout.min(Duration::from_secs(5)))
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("urutan/", env!("CARGO_PKG_VERSION")))
        .build()
}

/// Sends `effect` once, signed now, with `traceparent` (the webhook span),
/// and reads at most `ANSWER_BYTES` of the answer.
pub async fn attempt(
    client: &reqwest::Client,
    secret: &Secret,
    effect: &Claimed,
    traceparent: TraceParent,
) -> Answer {
    let timestamp = chrono::Utc::now().timestamp();
    let body = effect.isi.as_bytes();
    // Signed with the key it is sent with, as Standard Webhooks verifies.
    let key = sign::idempotency_key(&effect.message_id, &effect.url);
    let request = client
        .post(&effect.url)
        .header("content-type", "application/json")
        .header("webhook-id", &key)
        .header("webhook-timestamp", timestamp.to_string())
        .header(
            "webhook-signature",
            sign::signature(secret, &key, timestamp, body),
        )
        .header("idempotency-key", &key)
        .header(crate::trace::HEADER, traceparent.to_string())
        .body(effect.isi.clone());
    let mut response = match request.send().await {
        Ok(r) => r,
        Err(e) => return failure(e),
    };
    let code = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok());
    let mut bytes = Vec::new();
    while bytes.len() < ANSWER_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
            // The status is what counts; a body cut short is still an answer.
            Ok(None) | Err(_) => break,
        }
    }
    bytes.truncate(ANSWER_BYTES);
    Answer::Http {
        code,
        retry_after,
        // PostgreSQL text cannot hold NUL.
        body: String::from_utf8_lossy(&bytes).replace('\0', ""),
    }
}

fn failure(e: reqwest::Error) -> Answer {
    if e.is_timeout() {
        return Answer::Timeout;
    }
    // The chain without the URL (it may carry a token).
    let invalid = e.is_builder();
    let e = e.without_url();
    let mut text = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    let text = text.replace('\0', "");
    if invalid {
        Answer::Invalid(text)
    } else {
        Answer::Connection(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http(code: u16) -> Answer {
        Answer::Http {
            code,
            retry_after: None,
            body: String::new(),
        }
    }

    #[test]
    fn answers_map_to_the_policy() {
        for code in [200, 201, 202, 204, 299] {
            assert_eq!(classify(&http(code)), Verdict::Sent, "{code}");
        }
        for code in [408, 429, 500, 502, 503, 504, 599] {
            assert!(matches!(classify(&http(code)), Verdict::Retry(_)), "{code}");
        }
        for code in [400, 401, 403, 404, 409, 410, 422, 499] {
            assert_eq!(classify(&http(code)), Verdict::Dead("http_4xx"), "{code}");
        }
        assert_eq!(classify(&http(301)), Verdict::Dead("http_other"));
        assert_eq!(classify(&Answer::Timeout), Verdict::Retry("timeout"));
        assert_eq!(
            classify(&Answer::Connection("refused".into())),
            Verdict::Retry("connection")
        );
        assert_eq!(
            classify(&Answer::Invalid("bad header".into())),
            Verdict::Dead("invalid_request")
        );
    }

    #[test]
    fn backoff_grows_is_capped_and_jittered() {
        let (min, max) = (Duration::from_secs(1), Duration::from_secs(60));
        assert_eq!(backoff(1, min, max, None, 0.999_999).as_millis(), 999);
        assert_eq!(backoff(1, min, max, None, 0.0), Duration::from_millis(500));
        assert_eq!(backoff(4, min, max, None, 0.0), Duration::from_secs(4));
        assert_eq!(backoff(40, min, max, None, 0.0), Duration::from_secs(30));
        assert!(backoff(40, min, max, None, 0.999) <= max);
        assert_eq!(
            backoff(1, min, max, Some(20), 0.0),
            Duration::from_secs(20),
            "Retry-After is honoured"
        );
        assert_eq!(
            backoff(1, min, max, Some(3600), 0.0),
            max,
            "and capped at the most"
        );
        assert_eq!(backoff(0, min, max, None, 0.0), Duration::from_millis(500));
    }
}
