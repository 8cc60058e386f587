//! The settings as the command line reads them: every setting is an
//! environment variable (and a flag), parsed and range-checked by clap into
//! the library's plain structs ([`Settings`], [`EffectsSettings`],
//! [`RelaySettings`]), whose docs and defaults they mirror (a test checks the
//! defaults agree). A bad value stops the process at start with one line that
//! names the setting; a value that may hold a password is never echoed.

use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use clap::builder::{PossibleValue, TypedValueParser};
use clap::{Args, value_parser};
use urutan::config::{
    BrokerUrls, DEFAULT_ENTITY, DEFAULT_SCHEMA, GapPolicy, LogFormat, OnRefused, SecretUrl,
    Settings, TopologyMode, parse_address, parse_duration, parse_entity, parse_handler,
    parse_prefix, parse_replica_name, parse_retention, parse_schema,
};
use urutan::effects::{EffectsSettings, OnDead};
use urutan::outbox::relay::RelaySettings;

/// Everything the worker pool and the other commands need to know.
#[derive(Clone, Args)]
pub struct SettingsArgs {
    /// Broker URL (`amqp://` or `amqps://`), or a cluster's nodes as several
    /// URLs separated by commas (same vhost in each): every connection goes
    /// to a live node and moves on when one fails. Passwords are never logged.
    #[arg(
        long, global = true,
        env = "AMQP_URL",
        hide_env_values = true,
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f",
        value_parser = SecretParser::<BrokerUrls>::new()
    )]
    pub amqp_url: BrokerUrls,

    /// AMQP heartbeat in seconds (0: the broker's, 60 s by default). A silent
    /// broker link (no FIN, no RST) is noticed after about two heartbeats on
    /// both sides: the broker then hands this process's shards to a standby
    /// replica, and this process reconnects. A `heartbeat=` in a node URL wins.
    #[arg(long, global = true, env = "AMQP_HEARTBEAT", default_value_t = 10,
          value_parser = value_parser!(u16).range(0..=600))]
    pub amqp_heartbeat: u16,

    /// PostgreSQL URL. The database must exist: only `urutan migrate
    /// --create-database` (and the demo, for its own) creates it.
    #[arg(
        long, global = true,
        env = "DATABASE_URL",
        hide_env_values = true,
        default_value = "postgres://postgres@127.0.0.1:5432/urutan",
        value_parser = SecretParser::<SecretUrl>::new()
    )]
    pub database_url: SecretUrl,

    /// The longest a database statement, or a transaction left idle, may
    /// take (server-side `statement_timeout` and
    /// `idle_in_transaction_session_timeout`); the worker also gives up waiting
    /// for one transaction after this plus 5 s, and retries it. Bounds how long
    /// a silent database link (no FIN, no RST) can hold a message and its
    /// order's lock. Options in `DATABASE_URL` (`options[statement_timeout]=…`) win.
    #[arg(long, global = true, env = "DATABASE_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub database_timeout: Duration,

    /// Number of shard queues (1-999).
    #[arg(long, global = true, env = "SHARD_COUNT", default_value_t = 4,
          value_parser = value_parser!(u16).range(1..=999))]
    pub shard_count: u16,

    /// Per-shard prefetch; 1 is the strict mode.
    #[arg(long, global = true, env = "PREFETCH", default_value_t = 1,
          value_parser = value_parser!(u16).range(1..))]
    pub prefetch: u16,

    /// Ordered batch mode (PREFETCH > 1): most deliveries applied in one
    /// transaction (default: PREFETCH).
    #[arg(long, global = true, env = "BATCH_MAX",
          value_parser = value_parser!(u16).range(1..))]
    pub batch_max: Option<u16>,

    /// Ordered batch mode: how long to wait for more deliveries after the
    /// first one of a batch, in milliseconds.
    #[arg(long, global = true, env = "BATCH_LINGER_MS", default_value_t = 5,
          value_parser = value_parser!(u64).range(0..=10_000))]
    pub batch_linger_ms: u64,

    /// Deliveries of one message before the queue dead-letters it (`x-delivery-limit`).
    #[arg(long, global = true, env = "DELIVERY_LIMIT", default_value_t = 5,
          value_parser = value_parser!(u32).range(1..))]
    pub delivery_limit: u32,

    /// Replicas of each quorum queue (`x-quorum-initial-group-size`), fixed
    /// when the topology is first declared; unset: the broker's default.
    #[arg(long, global = true, env = "QUORUM_GROUP_SIZE",
          value_parser = value_parser!(u16).range(1..=99))]
    pub quorum_group_size: Option<u16>,

    /// Address of the HTTP endpoints `/metrics`, `/healthz`, `/readyz`.
    #[arg(long, global = true, env = "METRICS_ADDR", default_value = "0.0.0.0:9464",
          value_parser = parse_address)]
    pub metrics_addr: SocketAddr,

    /// How long processed message ids are kept for deduplication (e.g. `30d`, `12h`).
    #[arg(long, global = true, env = "DEDUP_RETENTION", default_value = "30d", value_parser = parse_duration)]
    pub dedup_retention: Duration,

    /// How long history rows are kept (e.g. `400d`); `keep`: forever.
    /// Expired by whole UTC days (day partitions).
    #[arg(long, global = true, env = "HISTORY_RETENTION", default_value = "keep", value_parser = parse_retention)]
    pub history_retention: ::std::option::Option<Duration>,

    /// How long dead-letter records are kept once resolved (replayed or
    /// purged with `urutan dlq`), e.g. `90d`.
    #[arg(long, global = true, env = "DEAD_LETTER_RETENTION", default_value = "90d", value_parser = parse_duration)]
    pub dead_letter_retention: Duration,

    /// How long a dead-letter record is kept while unresolved (its message
    /// still in the DLQ or lost from it), counted from when it was recorded,
    /// e.g. `90d`. Bounds the table under a flood of poison messages.
    #[arg(long, global = true, env = "DEAD_LETTER_UNRESOLVED_RETENTION", default_value = "90d", value_parser = parse_duration)]
    pub dead_letter_unresolved_retention: Duration,

    /// Log format: `text` or `json` (level from `RUST_LOG`).
    #[arg(long, global = true, env = "LOG_FORMAT", default_value = "text", value_parser = one_of::<LogFormat>(LogFormat::VALUES))]
    pub log_format: LogFormat,

    /// The entity's name: the hash header is `x-<ENTITY>-id`, and the
    /// default topology prefix (`^[a-z][a-z0-9_]{0,30}$`).
    #[arg(long, global = true, env = "ENTITY", default_value = DEFAULT_ENTITY, value_parser = parse_entity)]
    pub entity: String,

    /// The PostgreSQL schema holding every urutan table and function of this
    /// pipeline (created by `urutan migrate` if missing); two pipelines
    /// share a database in two schemas.
    #[arg(long, global = true, env = "DATABASE_SCHEMA", default_value = DEFAULT_SCHEMA, value_parser = parse_schema)]
    pub database_schema: String,

    /// A PostgreSQL function `(event jsonb) RETURNS void` (`name` or
    /// `schema.name`) called in the apply transaction of every applied
    /// version; unset: none.
    #[arg(long, global = true, env = "HANDLER_FUNCTION", value_parser = parse_handler)]
    pub handler_function: Option<String>,

    /// Shortest wait before a message set aside after a transient failure
    /// is tried again (doubling per attempt, jittered).
    #[arg(long, global = true, env = "RETRY_BACKOFF_MIN", default_value = "1s", value_parser = parse_duration)]
    pub retry_backoff_min: Duration,

    /// Longest wait between two attempts of a message set aside.
    #[arg(long, global = true, env = "RETRY_BACKOFF_MAX", default_value = "5m", value_parser = parse_duration)]
    pub retry_backoff_max: Duration,

    /// Attempts before a message set aside is refused.
    #[arg(long, global = true, env = "RETRY_MAX_ATTEMPTS", default_value_t = 20,
          value_parser = value_parser!(u32).range(1..=1_000_000))]
    pub retry_max_attempts: u32,

    /// `hold`: a refused version holds its order (later versions wait until
    /// it is replayed or `urutan hold release`); `skip`: they go on.
    #[arg(long, global = true, env = "ON_REFUSED", default_value = "hold", value_parser = one_of::<OnRefused>(OnRefused::VALUES))]
    pub on_refused: OnRefused,

    /// `apply`: a version above stored + 1 is applied at once; `wait`: it
    /// waits until the versions between are applied.
    #[arg(long, global = true, env = "GAP_POLICY", default_value = "apply", value_parser = one_of::<GapPolicy>(GapPolicy::VALUES))]
    pub gap_policy: GapPolicy,

    /// With GAP_POLICY=wait, how long a missing version is waited for
    /// before its order is held (`urutan hold release` then applies what waits).
    #[arg(long, global = true, env = "GAP_TIMEOUT", default_value = "10m", value_parser = parse_duration)]
    pub gap_timeout: Duration,

    /// With GAP_POLICY=wait, the parked versions one shard keeps: past
    /// it, a version that would wait for a missing one is dead-lettered
    /// (`gap_limit`; replay it once the gap is filled).
    #[arg(long, global = true, env = "GAP_WAITING_MAX", default_value_t = 100_000,
          value_parser = value_parser!(u32).range(1..=100_000_000))]
    pub gap_waiting_max: u32,

    /// Prefix of every broker object name (`pesanan`, `pesanan-hash`,
    /// `pesanan.shard-000`, ...); default: ENTITY.
    #[arg(long, global = true, env = "TOPOLOGY_PREFIX", value_parser = parse_prefix)]
    pub topology_prefix: Option<String>,

    /// Largest accepted message body; larger ones are dead-lettered.
    #[arg(long, global = true, env = "MAX_BODY_BYTES", default_value_t = 1024 * 1024,
          value_parser = value_parser!(u32).range(1..))]
    pub max_body_bytes: u32,

    /// Database connections in the pool (default: shard count + 2).
    #[arg(long, global = true, env = "DATABASE_POOL_SIZE",
          value_parser = value_parser!(u32).range(1..))]
    pub database_pool_size: Option<u32>,

    /// `declare`: the pool declares (and extends) the topology itself;
    /// `check`: it only checks it passively, for a least-privilege user
    /// (declare it with `urutan topology`).
    #[arg(long, global = true, env = "TOPOLOGY_MODE", default_value = "declare", value_parser = one_of::<TopologyMode>(TopologyMode::VALUES))]
    pub topology_mode: TopologyMode,

    /// Accept a `SHARD_COUNT` smaller than the ring has (shrinking): the top
    /// shards are unbound (they get no new messages), drained in order and
    /// their queues deleted.
    #[arg(long, global = true, env = "ALLOW_SHRINK", default_value_t = false)]
    pub allow_shrink: bool,

    /// Most messages the dead-letter queue holds (`x-max-length`). When it
    /// is full, further dead letters wait in their shard queue's
    /// dead-letter backlog (nothing is dropped) until `urutan dlq` makes room.
    #[arg(long, global = true, env = "DLQ_MAX_LENGTH", default_value_t = 100_000,
          value_parser = value_parser!(u64).range(1..))]
    pub dlq_max_length: u64,

    /// Most bytes of message bodies the dead-letter queue holds
    /// (`x-max-length-bytes`); as DLQ_MAX_LENGTH when reached.
    #[arg(long, global = true, env = "DLQ_MAX_BYTES", default_value_t = 1 << 30,
          value_parser = value_parser!(u64).range(1..))]
    pub dlq_max_bytes: u64,

    /// This replica's name among the replicas of the pipeline, unique while
    /// it lives (default: the host name and the process id; in Kubernetes,
    /// the pod name).
    #[arg(long, global = true, env = "REPLICA_NAME", value_parser = parse_replica_name)]
    pub replica_name: Option<String>,
}

impl From<SettingsArgs> for Settings {
    fn from(a: SettingsArgs) -> Self {
        Self {
            amqp_url: a.amqp_url,
            amqp_heartbeat: a.amqp_heartbeat,
            database_url: a.database_url,
            database_timeout: a.database_timeout,
            shard_count: a.shard_count,
            prefetch: a.prefetch,
            batch_max: a.batch_max,
            batch_linger_ms: a.batch_linger_ms,
            delivery_limit: a.delivery_limit,
            quorum_group_size: a.quorum_group_size,
            metrics_addr: a.metrics_addr,
            dedup_retention: a.dedup_retention,
            history_retention: a.history_retention,
            dead_letter_retention: a.dead_letter_retention,
            dead_letter_unresolved_retention: a.dead_letter_unresolved_retention,
            log_format: a.log_format,
            topology_prefix: a.topology_prefix.unwrap_or_else(|| a.entity.clone()),
            entity: a.entity,
            retry_backoff_min: a.retry_backoff_min,
            retry_backoff_max: a.retry_backoff_max.max(a.retry_backoff_min),
            retry_max_attempts: a.retry_max_attempts,
            on_refused: a.on_refused,
            gap_policy: a.gap_policy,
            gap_timeout: a.gap_timeout,
            gap_waiting_max: a.gap_waiting_max,
            database_schema: a.database_schema,
            handler_function: a.handler_function,
            max_body_bytes: a.max_body_bytes,
            database_pool_size: a.database_pool_size,
            topology_mode: a.topology_mode,
            allow_shrink: a.allow_shrink,
            dlq_max_length: a.dlq_max_length,
            dlq_max_bytes: a.dlq_max_bytes,
            // The OTEL_* variables are the SDK's, read at start (`execute`).
            traces: urutan::trace::Traces::off(),
            replica_name: a.replica_name,
        }
    }
}

/// Settings of `urutan effects` (the shared ones come from [`crate::config::Settings`]).
/// `EFFECTS` and `EFFECTS_SECRET` stay raw strings until [`Self::config`]
/// parses them, so that a bad value is reported without its secrets.
#[derive(Clone, Args)]
pub struct EffectsArgs {
    /// `STATUS=URL` entries separated by `;` (`*` = every status); unset: no effects.
    #[arg(long, env = "EFFECTS", hide_env_values = true)]
    pub effects: Option<String>,

    /// Webhook signing secret: `whsec_<base64>` (Standard Webhooks) or any
    /// string of 16+ bytes; several separated by spaces all sign (rotation).
    #[arg(long, env = "EFFECTS_SECRET", hide_env_values = true)]
    pub effects_secret: Option<String>,

    /// Secrets of their own for some endpoints, so that no receiver can sign
    /// for another: a JSON object from endpoint URL (as in EFFECTS) to secret,
    /// e.g. `{"https://pay.internal/capture": "whsec_…"}`. Endpoints not
    /// named sign with EFFECTS_SECRET.
    #[arg(long, env = "EFFECTS_SECRETS", hide_env_values = true)]
    pub effects_secrets: Option<String>,

    /// Proxy for every webhook (`http://`, `https://` or `socks5://` URL).
    /// Unset: direct connections; HTTP_PROXY, HTTPS_PROXY and ALL_PROXY are ignored.
    #[arg(long, env = "EFFECTS_PROXY", hide_env_values = true)]
    pub effects_proxy: Option<String>,

    /// Timeout of one attempt, connect to last byte (e.g. `10s`, `500ms`).
    #[arg(long, env = "EFFECTS_TIMEOUT", default_value = "10s",
          value_parser = parse_duration)]
    pub effects_timeout: Duration,

    /// Attempts before an effect that keeps failing (5xx, 408, 429, timeout,
    /// no connection) is dead-lettered.
    #[arg(long, env = "EFFECTS_MAX_ATTEMPTS", default_value_t = 15,
          value_parser = value_parser!(i32).range(1..=1000))]
    pub effects_max_attempts: i32,

    /// First retry delay; it doubles per attempt (with jitter) up to EFFECTS_BACKOFF_MAX.
    #[arg(long, env = "EFFECTS_BACKOFF_MIN", default_value = "1s",
          value_parser = parse_duration)]
    pub effects_backoff_min: Duration,

    /// Longest retry delay.
    #[arg(long, env = "EFFECTS_BACKOFF_MAX", default_value = "10m",
          value_parser = parse_duration)]
    pub effects_backoff_max: Duration,

    /// Effects in flight at once (each of a different order).
    #[arg(long, env = "EFFECTS_CONCURRENCY", default_value_t = 32,
          value_parser = value_parser!(u32).range(1..=10_000))]
    pub effects_concurrency: u32,

    /// How often to look for new effects when idle.
    #[arg(long, env = "EFFECTS_POLL", default_value = "200ms",
          value_parser = parse_duration)]
    pub effects_poll: Duration,

    /// How long sent effects are kept (dead-lettered ones are kept until removed).
    #[arg(long, env = "EFFECTS_RETENTION", default_value = "7d",
          value_parser = parse_duration)]
    pub effects_retention: Duration,

    /// `hold`: a dead-lettered effect holds its order's later effects until
    /// it is replayed (`urutan dlq replay --effects`) or released (`urutan
    /// hold release --effects`); `skip`: they go on.
    #[arg(long, env = "EFFECTS_ON_DEAD", default_value = "hold",
          value_parser = one_of::<OnDead>(OnDead::VALUES))]
    pub effects_on_dead: OnDead,
}

impl From<EffectsArgs> for EffectsSettings {
    fn from(a: EffectsArgs) -> Self {
        Self {
            effects: a.effects,
            effects_secret: a.effects_secret,
            effects_secrets: a.effects_secrets,
            effects_proxy: a.effects_proxy,
            effects_timeout: a.effects_timeout,
            effects_max_attempts: a.effects_max_attempts,
            effects_backoff_min: a.effects_backoff_min,
            effects_backoff_max: a.effects_backoff_max,
            effects_concurrency: a.effects_concurrency,
            effects_poll: a.effects_poll,
            effects_retention: a.effects_retention,
            effects_on_dead: a.effects_on_dead,
        }
    }
}

/// Relay-only settings (the shared ones come from [`Settings`]).
#[derive(Clone, Args)]
pub struct RelayArgs {
    /// Outbox rows read and published per transaction.
    #[arg(long, env = "RELAY_BATCH", default_value_t = 500,
          value_parser = value_parser!(i64).range(1..=10_000))]
    pub relay_batch: i64,
    /// How long sent outbox rows are kept before they are purged.
    #[arg(long, env = "OUTBOX_RETENTION", default_value = "7d",
          value_parser = parse_duration)]
    pub outbox_retention: Duration,
}

impl From<RelayArgs> for RelaySettings {
    fn from(a: RelayArgs) -> Self {
        Self {
            relay_batch: a.relay_batch,
            outbox_retention: a.outbox_retention,
        }
    }
}

/// A setting with a fixed set of values (shown in `--help`), parsed by the
/// library's `FromStr`; a wrong value is one line that names the setting
/// and says what to use instead.
fn one_of<T>(values: [&'static str; 2]) -> OneOf<T> {
    OneOf {
        values,
        parsed: std::marker::PhantomData,
    }
}

/// The parser [`one_of`] makes.
#[derive(Clone)]
struct OneOf<T> {
    /// What `--help` lists.
    values: [&'static str; 2],
    parsed: std::marker::PhantomData<fn() -> T>,
}

impl<T> TypedValueParser for OneOf<T>
where
    T: FromStr<Err = String> + Clone + Send + Sync + 'static,
{
    type Value = T;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<T, clap::Error> {
        let name = arg.map_or_else(|| "a setting".to_owned(), ToString::to_string);
        let text = value.to_string_lossy();
        text.parse().map_err(|fix: String| {
            clap::Error::raw(
                clap::error::ErrorKind::InvalidValue,
                format!(
                    "invalid value '{}' for '{name}': {fix}\n",
                    text.escape_debug()
                ),
            )
            .with_cmd(cmd)
        })
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(Box::new(self.values.iter().map(PossibleValue::new)))
    }
}

/// Parses a setting that may hold a password (`T::from_str`) so that clap's
/// error never echoes the value: clap's own "invalid value '…'" would print a
/// malformed URL, password and all. The error names the setting and says why.
#[derive(Clone)]
pub struct SecretParser<T>(std::marker::PhantomData<fn() -> T>);

impl<T> SecretParser<T> {
    pub fn new() -> Self {
        Self(std::marker::PhantomData)
    }
}

impl<T> Default for SecretParser<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> clap::builder::TypedValueParser for SecretParser<T>
where
    T: FromStr<Err = String> + Clone + Send + Sync + 'static,
{
    type Value = T;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<T, clap::Error> {
        let name = arg.map_or_else(|| "a setting".to_owned(), ToString::to_string);
        let refuse = |why: String| {
            clap::Error::raw(
                clap::error::ErrorKind::ValueValidation,
                format!("invalid value for '{name}' (not shown: it may hold a password): {why}\n"),
            )
            .with_cmd(cmd)
        };
        let text = value.to_str().ok_or_else(|| refuse("not UTF-8".into()))?;
        text.parse().map_err(refuse)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        settings: SettingsArgs,
    }

    fn parse(args: &[&str]) -> Result<Settings, String> {
        let mut argv = vec!["urutan"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv)
            .map(|c| c.settings.into())
            .map_err(|e| e.to_string())
    }

    /// The flags' defaults are the library's `Settings::default()`.
    #[test]
    fn the_flags_default_to_the_library_defaults() {
        let parsed = parse(&[]).expect("defaults");
        assert_eq!(format!("{parsed:?}"), format!("{:?}", Settings::default()));
        let effects = EffectsCli::try_parse_from(["urutan"]).expect("effects defaults");
        assert_eq!(
            format!("{:?}", EffectsSettings::from(effects.effects)),
            format!("{:?}", EffectsSettings::default())
        );
        let relay = RelayCli::try_parse_from(["urutan"]).expect("relay defaults");
        assert_eq!(
            format!("{:?}", RelaySettings::from(relay.relay)),
            format!("{:?}", RelaySettings::default())
        );
    }

    #[derive(Parser)]
    struct EffectsCli {
        #[command(flatten)]
        effects: EffectsArgs,
    }

    #[test]
    fn effects_on_dead_is_hold_or_skip() {
        let parse = |args: &[&str]| {
            let mut argv = vec!["urutan"];
            argv.extend_from_slice(args);
            EffectsCli::try_parse_from(argv)
                .map(|c| EffectsSettings::from(c.effects).effects_on_dead)
                .map_err(|e| e.to_string())
        };
        assert_eq!(parse(&[]), Ok(OnDead::Hold), "the contract's default");
        assert_eq!(parse(&["--effects-on-dead", "skip"]), Ok(OnDead::Skip));
        assert_eq!(parse(&["--effects-on-dead", "hold"]), Ok(OnDead::Hold));
        let err = parse(&["--effects-on-dead", "maybe"]).expect_err("maybe");
        assert!(
            err.contains("--effects-on-dead") && err.contains("hold") && err.contains("skip"),
            "{err}"
        );
    }

    #[derive(Parser)]
    struct RelayCli {
        #[command(flatten)]
        relay: RelayArgs,
    }

    #[test]
    fn defaults_follow_the_contract() {
        let s = parse(&[]).expect("defaults");
        assert_eq!(s.shard_count, 4);
        assert_eq!(s.prefetch, 1);
        assert_eq!(s.delivery_limit, 5);
        assert_eq!(s.metrics_addr.to_string(), "0.0.0.0:9464");
        assert_eq!(s.dedup_retention, Duration::from_secs(30 * 86_400));
        assert_eq!(s.dead_letter_retention, Duration::from_secs(90 * 86_400));
        assert_eq!(
            s.dead_letter_unresolved_retention,
            Duration::from_secs(90 * 86_400)
        );
        assert_eq!(s.log_format, LogFormat::Text);
        assert_eq!(s.topology_prefix, "pesanan");
        assert_eq!(
            (s.entity.as_str(), s.database_schema.as_str()),
            ("pesanan", "public")
        );
        assert_eq!(s.handler_function, None);
        assert_eq!(s.max_body_bytes, 1_048_576);
        assert_eq!((s.dlq_max_length, s.dlq_max_bytes), (100_000, 1 << 30));
        assert_eq!(s.batch_size(), 1, "strict mode by default");
        let s = parse(&["--prefetch", "64"]).expect("batch");
        assert_eq!(s.batch_size(), 64, "BATCH_MAX defaults to PREFETCH");
        let s = parse(&["--prefetch", "64", "--batch-max", "500"]).expect("batch");
        assert_eq!(s.batch_size(), 64, "a batch never exceeds PREFETCH");
    }

    #[test]
    fn the_entity_names_the_header_and_the_default_prefix() {
        let s = parse(&["--entity", "pengiriman"]).expect("entity");
        assert_eq!(s.topology_prefix, "pengiriman");
        assert_eq!(s.names().entity_header(), "x-pengiriman-id");
        assert_eq!(s.names().shard_queue(3), "pengiriman.shard-003");
        let s = parse(&["--entity", "pengiriman", "--topology-prefix", "kirim"]).expect("both");
        assert_eq!(s.names().hash_exchange(), "kirim-hash");
        assert_eq!(s.names().entity_header(), "x-pengiriman-id");
        for bad in ["Pesanan", "1pesanan", "pe-sanan", "", &"a".repeat(32)] {
            let err = parse(&["--entity", bad]).expect_err(bad);
            assert!(err.contains("--entity"), "{err}");
        }
    }

    #[test]
    fn the_schema_and_the_handler_reach_every_database_session() {
        let s = parse(&[
            "--database-schema",
            "pengiriman",
            "--handler-function",
            "tim.catat",
        ])
        .expect("schema and handler");
        let url = s.database().expose().to_owned();
        assert!(url.contains("options%5Bsearch_path%5D=pengiriman"), "{url}");
        assert!(
            url.contains("options%5Burutan.handler%5D=tim.catat"),
            "{url}"
        );
        let plain = parse(&[]).expect("defaults").database().expose().to_owned();
        assert!(
            !plain.contains("search_path") && !plain.contains("urutan.handler"),
            "{plain}"
        );
        for bad in ["pg_catalog", "Public", "a-b", "information_schema"] {
            let err = parse(&["--database-schema", bad]).expect_err(bad);
            assert!(err.contains("--database-schema"), "{err}");
        }
        for bad in ["a;b", "a.b.c", "f()", "1f"] {
            let err = parse(&["--handler-function", bad]).expect_err(bad);
            assert!(err.contains("--handler-function"), "{err}");
        }
    }

    #[test]
    fn zero_shards_is_refused_with_the_setting_named() {
        let err = parse(&["--shard-count", "0"]).expect_err("0 shards");
        assert!(err.contains("--shard-count"), "{err}");
    }

    #[test]
    fn bad_urls_are_refused() {
        assert!(parse(&["--amqp-url", "not a url"]).is_err());
        assert!(parse(&["--amqp-url", "http://x/"]).is_err());
        assert!(parse(&["--database-url", "postgres://"]).is_err());
        assert!(parse(&["--dedup-retention", "0s"]).is_err());
        assert!(parse(&["--log-format", "xml"]).is_err());
        assert!(parse(&["--amqp-url", "postgres://db/x"]).is_err());
    }

    #[test]
    fn several_broker_nodes_are_one_setting() {
        let s = parse(&[
            "--amqp-url",
            "amqp://u:pw-a@n1:5672/vh, amqp://u:pw-b@n2:5672/vh,amqps://u:pw-c@n3:5671/vh",
        ])
        .expect("three nodes");
        let nodes: Vec<&str> = s.amqp_url.nodes().iter().map(|u| u.expose()).collect();
        assert_eq!(
            nodes,
            [
                "amqp://u:pw-a@n1:5672/vh",
                "amqp://u:pw-b@n2:5672/vh",
                "amqps://u:pw-c@n3:5671/vh"
            ]
        );
        let shown = format!("{} {:?}", s.amqp_url, s.amqp_url);
        assert!(!shown.contains("pw-"), "{shown}");
        assert!(
            shown.contains("amqp://u:***@n1:5672/vh,amqp://u:***@n2:5672/vh"),
            "{shown}"
        );
        let with_heartbeat: Vec<String> = s
            .broker()
            .nodes()
            .iter()
            .map(|u| u.expose().to_owned())
            .collect();
        assert_eq!(with_heartbeat[0], "amqp://u:pw-a@n1:5672/vh?heartbeat=10");
        let s = parse(&[
            "--amqp-url",
            "amqp://n1/vh?heartbeat=3",
            "--amqp-heartbeat",
            "7",
        ])
        .expect("valid");
        assert_eq!(s.broker().nodes()[0].expose(), "amqp://n1/vh?heartbeat=3");
        let s = parse(&["--amqp-url", "amqp://n1/vh", "--amqp-heartbeat", "0"]).expect("valid");
        assert_eq!(s.broker().nodes()[0].expose(), "amqp://n1/vh");
        let err = parse(&["--amqp-url", "amqp://n1/a,amqp://n2/b"]).expect_err("vhosts differ");
        assert!(err.contains("same vhost"), "{err}");
        let s = parse(&[
            "--database-url",
            "postgres://db/u?options[statement_timeout]=5000",
            "--database-timeout",
            "9s",
        ])
        .expect("valid");
        let url = s.database().parsed();
        let options: Vec<(String, String)> = url
            .query_pairs()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        let get = |k: &str| {
            options
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(
            get("options[statement_timeout]"),
            Some("5000"),
            "the URL wins"
        );
        assert_eq!(
            get("options[idle_in_transaction_session_timeout]"),
            Some("9000")
        );
        assert_eq!(get("options[tcp_user_timeout]"), Some("30000"));
        let err = parse(&["--amqp-url", "amqp://n1/a,"]).expect_err("empty entry");
        assert!(err.contains("URL 2 of the list is empty"), "{err}");
    }

    #[test]
    fn passwords_never_print() {
        let s = parse(&[
            "--amqp-url",
            "amqp://user:hunter2@broker:5672/%2f",
            "--database-url",
            "postgres://app:sekret-pw@db/urutan",
        ])
        .expect("valid");
        let shown = format!("{s:?} {} {}", s.amqp_url, s.database_url);
        assert!(
            !shown.contains("hunter2") && !shown.contains("sekret-pw"),
            "{shown}"
        );
        assert!(shown.contains("user:***@broker"), "{shown}");
        let q = parse(&[
            "--database-url",
            "postgres://db/u?sslmode=require&password=qpw-9",
        ])
        .expect("valid");
        let shown_q = format!("{q:?}");
        assert!(
            !shown_q.contains("qpw-9") && shown_q.contains("password=***"),
            "{shown_q}"
        );
        assert!(shown_q.contains("sslmode=require"), "{shown_q}");
        assert_eq!(
            s.amqp_url.nodes()[0].expose(),
            "amqp://user:hunter2@broker:5672/%2f"
        );
    }

    /// A value for each variable, none of them the default.
    const SAMPLES: [(&str, &str); 34] = [
        ("AMQP_URL", "amqp://u:p@h:5673/v"),
        ("AMQP_HEARTBEAT", "30"),
        ("DATABASE_URL", "postgres://u@h/db"),
        ("DATABASE_TIMEOUT", "45s"),
        ("SHARD_COUNT", "7"),
        ("PREFETCH", "9"),
        ("BATCH_MAX", "3"),
        ("BATCH_LINGER_MS", "12"),
        ("DELIVERY_LIMIT", "8"),
        ("QUORUM_GROUP_SIZE", "3"),
        ("METRICS_ADDR", "127.0.0.1:9999"),
        ("DEDUP_RETENTION", "12h"),
        ("HISTORY_RETENTION", "400d"),
        ("DEAD_LETTER_RETENTION", "10d"),
        ("DEAD_LETTER_UNRESOLVED_RETENTION", "11d"),
        ("LOG_FORMAT", "json"),
        ("ENTITY", "pengiriman"),
        ("DATABASE_SCHEMA", "kirim"),
        ("HANDLER_FUNCTION", "tim.catat"),
        ("RETRY_BACKOFF_MIN", "2s"),
        ("RETRY_BACKOFF_MAX", "9s"),
        ("RETRY_MAX_ATTEMPTS", "6"),
        ("ON_REFUSED", "skip"),
        ("GAP_POLICY", "wait"),
        ("GAP_TIMEOUT", "3m"),
        ("GAP_WAITING_MAX", "50"),
        ("TOPOLOGY_PREFIX", "kirim.x"),
        ("MAX_BODY_BYTES", "2048"),
        ("DATABASE_POOL_SIZE", "4"),
        ("TOPOLOGY_MODE", "check"),
        ("ALLOW_SHRINK", "true"),
        ("DLQ_MAX_LENGTH", "77"),
        ("DLQ_MAX_BYTES", "88"),
        ("REPLICA_NAME", "pod-1"),
    ];

    /// `vars` as the command line's flags (`--shard-count 7`).
    fn as_flags(vars: &[(&str, &str)]) -> Vec<String> {
        use clap::CommandFactory;
        let cli = Cli::command();
        let mut argv = Vec::new();
        for (name, value) in vars {
            let arg = cli
                .get_arguments()
                .find(|a| a.get_env().is_some_and(|e| e == *name))
                .unwrap_or_else(|| panic!("no flag reads {name}"));
            let flag = format!("--{}", arg.get_long().expect("a long flag"));
            match *value {
                "true" if *name == "ALLOW_SHRINK" => argv.push(flag),
                _ => argv.extend([flag, (*value).to_owned()]),
            }
        }
        argv
    }

    fn from_vars(vars: &[(&str, &str)]) -> Result<Settings, urutan::WrongSetting> {
        Settings::from_vars(|name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    /// The library's `Settings::from_env` (an embedded pool's settings)
    /// reads every variable the command line reads, alike.
    #[test]
    fn the_library_reads_the_environment_as_the_command_line_does() {
        use clap::CommandFactory;
        let mut read_here: Vec<String> = Cli::command()
            .get_arguments()
            .filter_map(|a| a.get_env())
            .map(|e| e.to_string_lossy().into_owned())
            .collect();
        let mut read_there: Vec<String> = urutan::config::VARIABLES
            .iter()
            .map(|v| (*v).to_owned())
            .collect();
        read_here.sort();
        read_there.sort();
        assert_eq!(read_here, read_there, "the same variables");
        let mut sampled: Vec<String> = SAMPLES.iter().map(|(n, _)| (*n).to_owned()).collect();
        sampled.sort();
        assert_eq!(sampled, read_there, "a sample of each");

        let flags = as_flags(&SAMPLES);
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let here = parse(&flags).expect("the flags");
        let there = from_vars(&SAMPLES).expect("the variables");
        assert_eq!(format!("{there:?}"), format!("{here:?}"));
        assert_ne!(format!("{there:?}"), format!("{:?}", Settings::default()));

        // Out of range or malformed: refused by both.
        for wrong in [
            ("SHARD_COUNT", "1000"),
            ("SHARD_COUNT", "0"),
            ("PREFETCH", "0"),
            ("AMQP_HEARTBEAT", "601"),
            ("BATCH_LINGER_MS", "10001"),
            ("QUORUM_GROUP_SIZE", "100"),
            ("RETRY_MAX_ATTEMPTS", "1000001"),
            ("GAP_WAITING_MAX", "0"),
            ("DELIVERY_LIMIT", "-1"),
            ("ENTITY", "Pesanan"),
            ("LOG_FORMAT", "xml"),
            ("AMQP_URL", "http://h"),
        ] {
            let flags = as_flags(&[wrong]);
            let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
            assert!(parse(&flags).is_err(), "the flags take {wrong:?}");
            let refused = from_vars(&[wrong]).expect_err("refused");
            assert!(refused.0.starts_with(wrong.0), "{refused}");
        }
    }
}
