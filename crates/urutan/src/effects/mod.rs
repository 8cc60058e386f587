//! Downstream effects: a webhook per applied version and matching endpoint,
//! recorded in the apply transaction and delivered by `urutan effects`.
//!
//! ```text
//! apply transaction (any path) ─> pesanan_riwayat row ─> trigger: one urutan_efek row
//!                                 per endpoint whose route matches the status     [migration 0009]
//! urutan effects (one or more replicas)
//!   ─> claim the first pending effect of each order (lease, SKIP LOCKED)          [store]
//!   ─> POST the applied event, Standard Webhooks headers and signature            [send, sign]
//!   ─> record: sent (2xx) / retry later (408, 429, 5xx, timeout, no answer)
//!      / dead-lettered (other 4xx, or retries exhausted)                          [store]
//! ```
//!
//! Guarantees: an effect exists iff its version was applied; per order,
//! effects go out one at a time in version order (the next waits until the
//! previous one is sent or dead-lettered; with `EFFECTS_ON_DEAD=hold`, the
//! default, a dead-lettered one holds the order's later effects until it is
//! replayed and sent or released: [`hold`]), orders in parallel; an effect is
//! never in flight twice at once; a crash at any point only causes a resend
//! with the same `webhook-id` / `Idempotency-Key` (per effect: the message
//! id and a hash of the endpoint, [`sign::idempotency_key`]). An endpoint that honours
//! the key therefore acts exactly once; one that does not gets at least once.
//!
//! [`routes`] parses `EFFECTS` and `EFFECTS_SECRET`; [`dispatch`] is the
//! dispatcher loop.

pub mod dispatch;
pub mod hold;
pub mod http;
pub mod read;
pub mod routes;
pub mod send;
pub mod sign;
pub mod store;

use std::fmt;
use std::time::Duration;

pub use dispatch::{AfterSend, Dispatcher, StartError, after_send_from_env};
pub use routes::{ConfigError, EndpointSecrets, ProxyUrl, Route, Routes, Secret, StatusMatch};

/// Settings of `urutan effects` (the shared ones come from [`crate::config::Settings`]).
/// `EFFECTS` and `EFFECTS_SECRET` stay raw strings until [`Self::config`]
/// parses them, so that a bad value is reported without its secrets.
#[derive(Clone)]
pub struct EffectsSettings {
    /// `STATUS=URL` entries separated by `;` (`*` = every status); unset: no effects.
    pub effects: Option<String>,

    /// Webhook signing secret: `whsec_<base64>` (Standard Webhooks) or any
    /// string of 16+ bytes; several separated by spaces all sign (rotation).
    pub effects_secret: Option<String>,

    /// Secrets of their own for some endpoints, so that no receiver can sign
    /// for another: a JSON object from endpoint URL (as in EFFECTS) to secret,
    /// e.g. `{"https://pay.internal/capture": "whsec_…"}`. Endpoints not
    /// named sign with EFFECTS_SECRET.
    pub effects_secrets: Option<String>,

    /// Proxy for every webhook (`http://`, `https://` or `socks5://` URL).
    /// Unset: direct connections; HTTP_PROXY, HTTPS_PROXY and ALL_PROXY are ignored.
    pub effects_proxy: Option<String>,

    /// Timeout of one attempt, connect to last byte (e.g. `10s`, `500ms`).
    pub effects_timeout: Duration,

    /// Attempts before an effect that keeps failing (5xx, 408, 429, timeout,
    /// no connection) is dead-lettered.
    pub effects_max_attempts: i32,

    /// First retry delay; it doubles per attempt (with jitter) up to EFFECTS_BACKOFF_MAX.
    pub effects_backoff_min: Duration,

    /// Longest retry delay.
    pub effects_backoff_max: Duration,

    /// Effects in flight at once (each of a different order).
    pub effects_concurrency: u32,

    /// How often to look for new effects when idle.
    pub effects_poll: Duration,

    /// How long sent effects are kept (dead-lettered ones are kept until removed).
    pub effects_retention: Duration,

    /// `EFFECTS_ON_DEAD`: whether a dead-lettered effect holds its order's
    /// later effects (until replayed or released) or lets them go.
    pub effects_on_dead: OnDead,
}

/// What a dead-lettered effect does to its order's later effects
/// (`EFFECTS_ON_DEAD`, docs/contract.md sections 5 and 11). Only new dead
/// letters follow it: a hold already recorded stays until it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnDead {
    /// The order's later effects wait until the dead one is replayed and
    /// sent (`urutan dlq replay --effects`) or skipped (`urutan hold
    /// release --effects`); its versions are still applied.
    Hold,
    /// The order's next effect goes.
    Skip,
}

impl OnDead {
    /// The setting's values, as written.
    pub const VALUES: [&str; 2] = ["hold", "skip"];
}

impl std::str::FromStr for OnDead {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "hold" => Ok(Self::Hold),
            "skip" => Ok(Self::Skip),
            _ => Err("use `hold` or `skip`".into()),
        }
    }
}

impl fmt::Debug for EffectsSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let routes = self.effects.as_deref().map(Routes::parse);
        f.debug_struct("EffectsSettings")
            .field("effects", &routes)
            .field(
                "effects_secret",
                &self.effects_secret.as_ref().map(|_| "***"),
            )
            .field(
                "effects_secrets",
                &self.effects_secrets.as_ref().map(|_| "***"),
            )
            .field(
                "effects_proxy",
                &self.effects_proxy.as_deref().map(ProxyUrl::parse),
            )
            .field("effects_timeout", &self.effects_timeout)
            .field("effects_max_attempts", &self.effects_max_attempts)
            .field("effects_backoff_min", &self.effects_backoff_min)
            .field("effects_backoff_max", &self.effects_backoff_max)
            .field("effects_concurrency", &self.effects_concurrency)
            .field("effects_poll", &self.effects_poll)
            .field("effects_retention", &self.effects_retention)
            .field("effects_on_dead", &self.effects_on_dead)
            .finish()
    }
}

/// The validated configuration of the dispatcher.
#[derive(Debug, Clone)]
pub struct Config {
    /// Empty: no new effects are recorded (pending ones are still delivered).
    pub routes: Routes,
    /// The default signing secret (`EFFECTS_SECRET`).
    pub secret: Secret,
    /// Endpoints that sign with their own secret instead (`EFFECTS_SECRETS`).
    pub endpoint_secrets: EndpointSecrets,
    /// `EFFECTS_PROXY`; `None`: direct, whatever the environment says.
    pub proxy: Option<ProxyUrl>,
}

impl Config {
    /// The secret that signs requests to `url` (an effect's stored URL).
    pub fn secret_for(&self, url: &str) -> &Secret {
        self.endpoint_secrets.get(url).unwrap_or(&self.secret)
    }
}

impl Default for EffectsSettings {
    /// No routes, no secret, and the documented defaults (docs/contract.md, section 5).
    fn default() -> Self {
        Self {
            effects: None,
            effects_secret: None,
            effects_secrets: None,
            effects_proxy: None,
            effects_timeout: Duration::from_secs(10),
            effects_max_attempts: 15,
            effects_backoff_min: Duration::from_secs(1),
            effects_backoff_max: Duration::from_secs(600),
            effects_concurrency: 32,
            effects_poll: Duration::from_millis(200),
            effects_retention: Duration::from_secs(7 * 86_400),
            effects_on_dead: OnDead::Hold,
        }
    }
}

impl EffectsSettings {
    /// Parses `EFFECTS` and `EFFECTS_SECRET`. The dispatcher always needs
    /// the secret: even with `EFFECTS` unset it delivers what is pending.
    pub fn config(&self) -> Result<Config, ConfigError> {
        let routes = Routes::parse(self.effects.as_deref().unwrap_or(""))?;
        let secret = match self.effects_secret.as_deref() {
            Some(raw) => Secret::parse(raw)?,
            None => return Err(ConfigError::SecretMissing),
        };
        let endpoint_secrets = match self.effects_secrets.as_deref() {
            Some(raw) => EndpointSecrets::parse(raw)?,
            None => EndpointSecrets::default(),
        };
        // A URL that matches no route is a typo that would sign with the default.
        if !routes.is_empty() {
            let known = |u: &str| routes.0.iter().any(|r| r.url.as_str() == u);
            if let Some(url) = endpoint_secrets.urls().find(|u| !known(u)) {
                let shown =
                    url::Url::parse(url).map_or_else(|_| "…".into(), |u| routes::redact(&u));
                return Err(ConfigError::Secrets(format!(
                    "names {shown}, an endpoint that no EFFECTS route has"
                )));
            }
        }
        let proxy = self
            .effects_proxy
            .as_deref()
            .map(ProxyUrl::parse)
            .transpose()?;
        Ok(Config {
            routes,
            secret,
            endpoint_secrets,
            proxy,
        })
    }

    /// How long a claim holds an effect: long enough that an attempt (at
    /// most the timeout) always ends first, so no effect is in flight twice.
    pub fn lease(&self) -> Duration {
        self.effects_timeout * 2 + Duration::from_secs(5)
    }
}

/// Metric names of the dispatcher (labels bounded: `endpoint` is a
/// configured `host[:port]` and first path segment, `reason` a fixed list;
/// never an order or message id).
pub mod metric {
    use crate::metrics as names;
    pub const SENT_TOTAL: &str = names::EFFECTS_SENT_TOTAL;
    pub const RETRIES_TOTAL: &str = names::EFFECTS_RETRIES_TOTAL;
    pub const DEAD_LETTERS_TOTAL: &str = names::EFFECTS_DEAD_LETTERS_TOTAL;
    pub const REQUEST_DURATION_SECONDS: &str = names::EFFECTS_REQUEST_DURATION_SECONDS;
    pub const BACKLOG: &str = names::EFFECTS_BACKLOG;
    pub const OLDEST_PENDING_SECONDS: &str = names::EFFECTS_OLDEST_PENDING_SECONDS;
    pub const DEAD_LETTERED: &str = names::EFFECTS_DEAD_LETTERED;
    pub const IN_FLIGHT: &str = names::EFFECTS_IN_FLIGHT;
    pub const ROUTES_CURRENT: &str = names::EFFECTS_ROUTES_CURRENT;

    /// Describes the series and registers the per-endpoint counters at zero.
    pub fn register(endpoints: &[String]) {
        use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
        describe_counter!(SENT_TOTAL, "Effects answered 2xx, by endpoint.");
        describe_counter!(
            RETRIES_TOTAL,
            "Effect attempts that will be retried (408, 429, 5xx, timeout, connection)."
        );
        describe_counter!(
            DEAD_LETTERS_TOTAL,
            "Effects dead-lettered (4xx, other answers, attempts exhausted)."
        );
        describe_histogram!(
            REQUEST_DURATION_SECONDS,
            Unit::Seconds,
            "One webhook attempt, request to answer (or timeout)."
        );
        describe_gauge!(BACKLOG, "Pending effects by endpoint.");
        describe_gauge!(
            OLDEST_PENDING_SECONDS,
            "Age of the oldest pending effect by endpoint."
        );
        describe_gauge!(
            DEAD_LETTERED,
            "Dead-lettered effects held in the database by endpoint."
        );
        describe_gauge!(IN_FLIGHT, "Effects being sent by this dispatcher.");
        describe_gauge!(
            ROUTES_CURRENT,
            "1 while the routes in the database are this dispatcher's EFFECTS, else 0."
        );
        for endpoint in endpoints {
            metrics::counter!(SENT_TOTAL, "endpoint" => endpoint.clone()).increment(0);
            let _ = metrics::histogram!(REQUEST_DURATION_SECONDS, "endpoint" => endpoint.clone());
            for reason in super::send::RETRY_REASONS {
                metrics::counter!(RETRIES_TOTAL, "endpoint" => endpoint.clone(), "reason" => *reason)
                    .increment(0);
            }
            for reason in super::send::DEAD_REASONS {
                metrics::counter!(DEAD_LETTERS_TOTAL, "endpoint" => endpoint.clone(), "reason" => *reason)
                    .increment(0);
            }
        }
        metrics::gauge!(IN_FLIGHT).set(0.0);
        // Counted here, where a dead letter makes the hold; the held gauge
        // (`urutan_orders_held`) is `urutan run`'s, read from the database.
        metrics::counter!(names::HOLDS_TOTAL, "reason" => "effect").increment(0);
    }
}
