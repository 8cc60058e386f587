//! Settings: one validated struct, read from environment variables and flags
//! (docs/contract.md, section 5). A bad value stops the process at start with one line
//! that names the setting; secrets inside URLs never reach `Debug` or logs.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

mod env;
pub use env::VARIABLES;

/// Everything the worker pool and the other commands need to know.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Broker URL (`amqp://` or `amqps://`), or a cluster's nodes as several
    /// URLs separated by commas (same vhost in each): every connection goes
    /// to a live node and moves on when one fails. Passwords are never logged.
    pub amqp_url: BrokerUrls,

    /// AMQP heartbeat in seconds (0: the broker's, 60 s by default). A silent
    /// broker link (no FIN, no RST) is noticed after about two heartbeats on
    /// both sides: the broker then hands this process's shards to a standby
    /// replica, and this process reconnects. A `heartbeat=` in a node URL wins.
    pub amqp_heartbeat: u16,

    /// PostgreSQL URL. The database must exist: only `urutan migrate
    /// --create-database` (and the demo, for its own) creates it.
    pub database_url: SecretUrl,

    /// The longest a database statement, or a transaction left idle, may
    /// take (server-side `statement_timeout` and
    /// `idle_in_transaction_session_timeout`); the worker also gives up waiting
    /// for one transaction after this plus 5 s, and retries it. Bounds how long
    /// a silent database link (no FIN, no RST) can hold a message and its
    /// order's lock. Options in `DATABASE_URL` (`options[statement_timeout]=…`) win.
    pub database_timeout: Duration,

    /// Number of shard queues (1-999).
    pub shard_count: u16,

    /// Per-shard prefetch; 1 is the strict mode.
    pub prefetch: u16,

    /// Ordered batch mode (PREFETCH > 1): most deliveries applied in one
    /// transaction (default: PREFETCH).
    pub batch_max: Option<u16>,

    /// Ordered batch mode: how long to wait for more deliveries after the
    /// first one of a batch, in milliseconds.
    pub batch_linger_ms: u64,

    /// Deliveries of one message before the queue dead-letters it (`x-delivery-limit`).
    pub delivery_limit: u32,

    /// Replicas of each quorum queue (`x-quorum-initial-group-size`), fixed
    /// when the topology is first declared; unset: the broker's default.
    pub quorum_group_size: Option<u16>,

    /// Address of the HTTP endpoints `/metrics`, `/healthz`, `/readyz`.
    pub metrics_addr: SocketAddr,

    /// How long processed message ids are kept for deduplication (e.g. `30d`, `12h`).
    pub dedup_retention: Duration,

    /// How long history rows (`pesanan_riwayat`) are kept: `None` (`keep`,
    /// the default) keeps them forever; expired by whole day partitions.
    pub history_retention: Option<Duration>,

    /// How long dead-letter records are kept once resolved (replayed or
    /// purged with `urutan dlq`), e.g. `90d`.
    pub dead_letter_retention: Duration,

    /// How long a dead-letter record is kept while unresolved (its message
    /// still in the DLQ or lost from it), counted from when it was recorded,
    /// e.g. `90d`. Bounds the table under a flood of poison messages.
    pub dead_letter_unresolved_retention: Duration,

    /// Log format: `text` or `json` (level from `RUST_LOG`).
    pub log_format: LogFormat,

    /// The entity's name (`ENTITY`, docs/contract.md section 9): the hash
    /// header is `x-<entity>-id`, and the default topology prefix.
    pub entity: String,

    /// The PostgreSQL schema holding every urutan table and function of this
    /// pipeline (`DATABASE_SCHEMA`): two pipelines share a database in two schemas.
    pub database_schema: String,

    /// The team's PostgreSQL function `(event jsonb) RETURNS void`, called in
    /// the apply transaction of every applied version (`HANDLER_FUNCTION`,
    /// docs/contract.md section 10), as `name` or `schema.name`.
    pub handler_function: Option<String>,

    /// Backoff of a message set aside after a transient failure of its own
    /// transaction (`RETRY_BACKOFF_MIN` × 2^attempt, capped at
    /// `RETRY_BACKOFF_MAX`, jittered).
    pub retry_backoff_min: Duration,
    pub retry_backoff_max: Duration,

    /// Attempts before a message set aside is refused (`RETRY_MAX_ATTEMPTS`).
    pub retry_max_attempts: u32,

    /// What a refused version does to its order (`ON_REFUSED`).
    pub on_refused: OnRefused,

    /// Whether a version above stored + 1 waits for the versions between
    /// (`GAP_POLICY`), and how long a missing one is waited for before its
    /// order is held (`GAP_TIMEOUT`).
    pub gap_policy: GapPolicy,
    pub gap_timeout: Duration,
    /// With `GAP_POLICY=wait`: the parked versions a shard keeps before a
    /// version that would wait for a gap is dead-lettered (`gap_limit`).
    pub gap_waiting_max: u32,

    /// Prefix of every broker object name (`pesanan`, `pesanan-hash`,
    /// `pesanan.shard-000`, ...); defaults to the entity.
    pub topology_prefix: String,

    /// Largest accepted message body; larger ones are dead-lettered.
    pub max_body_bytes: u32,

    /// Database connections in the pool (default: shard count + 2).
    pub database_pool_size: Option<u32>,

    /// `declare`: the pool declares (and extends) the topology itself;
    /// `check`: it only checks it passively, for a least-privilege user
    /// (declare it with `urutan topology`).
    pub topology_mode: TopologyMode,

    /// Accept a `SHARD_COUNT` smaller than the ring has (shrinking): the top
    /// shards are unbound (they get no new messages), drained in order and
    /// their queues deleted.
    pub allow_shrink: bool,

    /// Most messages the dead-letter queue holds (`x-max-length`). When it
    /// is full, further dead letters wait in their shard queue's
    /// dead-letter backlog (nothing is dropped) until `urutan dlq` makes room.
    pub dlq_max_length: u64,

    /// Most bytes of message bodies the dead-letter queue holds
    /// (`x-max-length-bytes`); as DLQ_MAX_LENGTH when reached.
    pub dlq_max_bytes: u64,

    /// Where spans go (`OTEL_EXPORTER_OTLP_ENDPOINT` and the other OTEL_*
    /// variables, read by [`crate::trace::Traces::from_env`]); off by
    /// default: trace contexts are still carried, nothing is exported.
    pub traces: crate::trace::Traces,

    /// This replica's name among the replicas of the pipeline
    /// (`REPLICA_NAME`, docs/contract.md section 13): unset, the host name
    /// and the process id ([`crate::replica::default_name`]); in
    /// Kubernetes, the pod name. Two live replicas must not share a name.
    pub replica_name: Option<String>,
}

impl Default for Settings {
    /// Every setting at its documented default (docs/contract.md, section 5):
    /// the local services, 4 shards, strict mode.
    fn default() -> Self {
        fn local<T: FromStr<Err = String>>(url: &str) -> T {
            url.parse().unwrap_or_else(|e| unreachable!("{url}: {e}"))
        }
        let days = |n: u64| Duration::from_secs(n * 86_400);
        Self {
            amqp_url: local("amqp://guest:guest@127.0.0.1:5672/%2f"),
            amqp_heartbeat: 10,
            database_url: local("postgres://postgres@127.0.0.1:5432/urutan"),
            database_timeout: Duration::from_secs(30),
            shard_count: 4,
            prefetch: 1,
            batch_max: None,
            batch_linger_ms: 5,
            delivery_limit: 5,
            quorum_group_size: None,
            metrics_addr: SocketAddr::from(([0, 0, 0, 0], 9464)),
            dedup_retention: days(30),
            history_retention: None,
            dead_letter_retention: days(90),
            dead_letter_unresolved_retention: days(90),
            log_format: LogFormat::Text,
            entity: DEFAULT_ENTITY.to_owned(),
            database_schema: DEFAULT_SCHEMA.to_owned(),
            handler_function: None,
            retry_backoff_min: Duration::from_secs(1),
            retry_backoff_max: Duration::from_secs(300),
            retry_max_attempts: 20,
            on_refused: OnRefused::Hold,
            gap_policy: GapPolicy::Apply,
            gap_timeout: Duration::from_secs(600),
            gap_waiting_max: 100_000,
            topology_prefix: DEFAULT_ENTITY.to_owned(),
            max_body_bytes: 1024 * 1024,
            database_pool_size: None,
            topology_mode: TopologyMode::Declare,
            allow_shrink: false,
            dlq_max_length: 100_000,
            dlq_max_bytes: 1 << 30,
            traces: crate::trace::Traces::off(),
            replica_name: None,
        }
    }
}

impl Settings {
    /// Deliveries applied per transaction: 1 in strict mode (PREFETCH=1),
    /// else BATCH_MAX (default PREFETCH), never more than PREFETCH.
    pub fn batch_size(&self) -> u16 {
        self.batch_max.unwrap_or(self.prefetch).min(self.prefetch)
    }

    /// Settings that contradict each other, one line each (warned about at
    /// start; the process goes on with what [`Self::batch_size`] and the
    /// others make of them).
    pub fn contradictions(&self) -> Vec<String> {
        let mut found = Vec::new();
        if let Some(batch) = self.batch_max
            && batch > self.prefetch
        {
            found.push(format!(
                "BATCH_MAX={batch} is above PREFETCH={}: a batch never holds more than \
                 PREFETCH deliveries, so batches hold {}; raise PREFETCH or lower BATCH_MAX",
                self.prefetch,
                self.batch_size()
            ));
        }
        found
    }

    /// The broker nodes to connect to, with the heartbeat setting applied.
    pub fn broker(&self) -> BrokerUrls {
        self.amqp_url.with_heartbeat(self.amqp_heartbeat)
    }

    /// The broker object names and the hash header of this pipeline.
    pub fn names(&self) -> crate::broker::Names {
        crate::broker::Names::with_entity(&self.topology_prefix, &self.entity)
    }

    /// The database URL in this pipeline's schema: every unqualified name
    /// resolves in [`Self::database_schema`] (`search_path`; `public`
    /// leaves the server's default), and with [`Self::handler_function`]
    /// the apply functions call it (`urutan.handler`). Options the URL sets
    /// itself win.
    pub fn schema_url(&self) -> SecretUrl {
        let mut options = Vec::new();
        if self.database_schema != DEFAULT_SCHEMA {
            options.push(("search_path", self.database_schema.as_str()));
        }
        if let Some(handler) = &self.handler_function {
            options.push(("urutan.handler", handler.as_str()));
        }
        // Read by the apply and release functions (`urutan_celah_tunggu`).
        let gap_max = self.gap_waiting_max.to_string();
        if self.gap_policy == GapPolicy::Wait {
            options.push(("urutan.gap", "wait"));
            options.push(("urutan.gap_max", gap_max.as_str()));
        }
        with_options(&self.database_url, &options)
    }

    /// [`Self::schema_url`] with the session limits of [`Self::database_timeout`]
    /// and TCP keepalives (a dead client's backend, and its locks, go within
    /// about 30 s) added, except those the URL sets itself.
    pub fn database(&self) -> SecretUrl {
        let ms = self.database_timeout.as_millis().to_string();
        let limits = [
            ("statement_timeout", ms.as_str()),
            ("idle_in_transaction_session_timeout", ms.as_str()),
            ("tcp_keepalives_idle", "10"),
            ("tcp_keepalives_interval", "5"),
            ("tcp_keepalives_count", "3"),
            ("tcp_user_timeout", "30000"),
        ];
        with_options(&self.schema_url(), &limits)
    }

    /// This replica's name: `REPLICA_NAME`, else the host name and the
    /// process id.
    pub fn replica(&self) -> String {
        self.replica_name
            .clone()
            .unwrap_or_else(crate::replica::default_name)
    }

    /// Connections the database pool may open.
    pub fn pool_size(&self) -> u32 {
        self.database_pool_size
            .unwrap_or(u32::from(self.shard_count) + 2)
    }
}

/// A `REPLICA_NAME`: 1 to 200 characters, no control characters.
pub fn parse_replica_name(s: &str) -> Result<String, String> {
    let name = s.trim();
    if name.is_empty() || name.chars().count() > 200 || name.chars().any(char::is_control) {
        return Err(format!(
            "{s:?} is not a replica name: 1 to 200 characters, no control characters (e.g. the pod name)"
        ));
    }
    Ok(name.to_owned())
}

/// The default entity (`ENTITY`): orders, as in the contract's names.
pub const DEFAULT_ENTITY: &str = "pesanan";

/// The default schema (`DATABASE_SCHEMA`).
pub const DEFAULT_SCHEMA: &str = "public";

/// `url` with each `options[key]=value` the URL does not set itself.
fn with_options(url: &SecretUrl, options: &[(&str, &str)]) -> SecretUrl {
    url.with(|u| {
        let set: Vec<String> = u.query_pairs().map(|(k, _)| k.into_owned()).collect();
        let mut pairs = u.query_pairs_mut();
        for (key, value) in options {
            let key = format!("options[{key}]");
            if !set.contains(&key) {
                pairs.append_pair(&key, value);
            }
        }
    })
}

/// What a refused version (the handler refused it, the database refused its
/// data, its retries ran out, the delivery limit) does to its order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnRefused {
    /// The order is held: its later versions are recorded and wait until
    /// the refused message is replayed or `urutan hold release` skips it.
    Hold,
    /// The order's later versions go on (the refused one is skipped).
    Skip,
}

impl OnRefused {
    /// The setting's values, as written.
    pub const VALUES: [&str; 2] = ["hold", "skip"];
}

impl FromStr for OnRefused {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "hold" => Ok(Self::Hold),
            "skip" => Ok(Self::Skip),
            _ => Err("use `hold` or `skip`".into()),
        }
    }
}

/// What a version above stored + 1 does (`GAP_POLICY`, docs/contract.md
/// section 11).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GapPolicy {
    /// Applied at once (whole-state events: the versions between are
    /// `stale` if they come later).
    Apply,
    /// Waits until the versions between are applied; one missing longer
    /// than `GAP_TIMEOUT` holds the order.
    Wait,
}

impl GapPolicy {
    /// The setting's values, as written.
    pub const VALUES: [&str; 2] = ["apply", "wait"];
}

impl FromStr for GapPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "apply" => Ok(Self::Apply),
            "wait" => Ok(Self::Wait),
            _ => Err("use `apply` or `wait`".into()),
        }
    }
}

/// Whether `urutan run` declares the topology or only checks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopologyMode {
    Declare,
    Check,
}

impl TopologyMode {
    /// The setting's values, as written.
    pub const VALUES: [&str; 2] = ["declare", "check"];
}

impl FromStr for TopologyMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "declare" => Ok(Self::Declare),
            "check" => Ok(Self::Check),
            _ => Err("use `declare` or `check`".into()),
        }
    }
}

/// Output format of the logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

impl LogFormat {
    /// The setting's values, as written.
    pub const VALUES: [&str; 2] = ["text", "json"];
}

impl FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            _ => Err("use `text` or `json`".into()),
        }
    }
}

/// A URL that may carry a password: usable as a string by the clients, but
/// printed (`Debug`, `Display`) with the password replaced by `***`.
#[derive(Clone)]
pub struct SecretUrl {
    raw: String,
    redacted: String,
}

impl SecretUrl {
    /// The full URL, password included: only for handing to a client library.
    pub fn expose(&self) -> &str {
        &self.raw
    }

    /// The URL parsed, for tools that need its parts.
    pub fn parsed(&self) -> url::Url {
        // Parsing succeeded in `from_str`, so it succeeds again.
        url::Url::parse(&self.raw).unwrap_or_else(|_| unreachable!("validated in from_str"))
    }

    /// `host:port` (the scheme's default port when the URL names none): what
    /// a log line about reaching it names.
    pub fn address(&self) -> String {
        let url = self.parsed();
        let port = url.port().unwrap_or(match url.scheme() {
            "amqp" => 5672,
            "amqps" => 5671,
            _ => 5432,
        });
        format!("{}:{port}", url.host_str().unwrap_or_default())
    }

    /// The same URL with another password-free part changed by `edit`.
    pub fn with(&self, edit: impl FnOnce(&mut url::Url)) -> SecretUrl {
        let mut url = self.parsed();
        edit(&mut url);
        Self::from_str(url.as_str()).unwrap_or_else(|_| unreachable!("an edited valid URL"))
    }
}

impl FromStr for SecretUrl {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut url = url::Url::parse(s).map_err(|e| format!("not a URL ({e})"))?;
        match url.scheme() {
            "amqp" | "amqps" | "postgres" | "postgresql" => {}
            other => return Err(format!("unsupported scheme `{other}`")),
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err("the URL has no host".into());
        }
        if url.password().is_some() {
            // Cannot fail: the URL has a host, so it can carry a password.
            let _ = url.set_password(Some("***"));
        }
        // sqlx also takes the password as a query parameter.
        if url.query_pairs().any(|(k, _)| k == "password") {
            let pairs: Vec<(String, String)> = url
                .query_pairs()
                .map(|(k, v)| {
                    let v = if k == "password" {
                        "***".into()
                    } else {
                        v.into_owned()
                    };
                    (k.into_owned(), v)
                })
                .collect();
            url.query_pairs_mut().clear().extend_pairs(pairs);
        }
        Ok(Self {
            raw: s.to_owned(),
            redacted: url.to_string(),
        })
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted)
    }
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted)
    }
}

/// The broker's nodes (docs/contract.md, section 5): one `amqp://` or
/// `amqps://` URL, or a cluster's nodes as several URLs separated by commas.
/// Every URL names the same vhost, since the topology lives in one vhost.
/// Printed as the list with every password replaced by `***`.
#[derive(Clone)]
pub struct BrokerUrls(Vec<SecretUrl>);

impl BrokerUrls {
    /// The node URLs in the order given (never empty).
    pub fn nodes(&self) -> &[SecretUrl] {
        &self.0
    }

    /// The nodes' `host:port`, separated by commas.
    pub fn addresses(&self) -> String {
        let all: Vec<String> = self.0.iter().map(SecretUrl::address).collect();
        all.join(",")
    }

    /// The same nodes asking for a heartbeat of `seconds` (0: leave it to the
    /// broker), except those whose URL already names one.
    pub fn with_heartbeat(&self, seconds: u16) -> BrokerUrls {
        if seconds == 0 {
            return self.clone();
        }
        let nodes = self.0.iter().map(|node| {
            if node.parsed().query_pairs().any(|(k, _)| k == "heartbeat") {
                return node.clone();
            }
            node.with(|u| {
                u.query_pairs_mut()
                    .append_pair("heartbeat", &seconds.to_string());
            })
        });
        BrokerUrls(nodes.collect())
    }
}

impl From<SecretUrl> for BrokerUrls {
    fn from(url: SecretUrl) -> Self {
        Self(vec![url])
    }
}

impl FromStr for BrokerUrls {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut nodes = Vec::new();
        for (n, part) in s.split(',').map(str::trim).enumerate() {
            let which = || format!("URL {} of the list", n + 1);
            if part.is_empty() {
                return Err(format!("{} is empty", which()));
            }
            let url: SecretUrl = part.parse().map_err(|e| format!("{}: {e}", which()))?;
            if !matches!(url.parsed().scheme(), "amqp" | "amqps") {
                return Err(format!("{}: use amqp:// or amqps:// ({url})", which()));
            }
            nodes.push(url);
        }
        let vhost = |u: &SecretUrl| u.parsed().path().to_owned();
        if let Some(other) = nodes.iter().find(|u| vhost(u) != vhost(&nodes[0])) {
            return Err(format!(
                "every node URL must name the same vhost: {} and {other} differ",
                nodes[0]
            ));
        }
        Ok(Self(nodes))
    }
}

impl fmt::Debug for BrokerUrls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for BrokerUrls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, url) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            fmt::Display::fmt(url, f)?;
        }
        Ok(())
    }
}

/// `30d`, `12h`, `15m`, `90s` (anything `humantime` reads); zero is refused.
/// `host:port` or `ip:port` (`localhost:9464`, `[::1]:9464`), for
/// `METRICS_ADDR` and `CONSOLE_LISTEN`: a host name is resolved now, at
/// start, to its first address.
pub fn parse_address(text: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs;
    if let Ok(addr) = text.parse() {
        return Ok(addr);
    }
    let mut found = text
        .to_socket_addrs()
        .map_err(|e| format!("use host:port, e.g. `127.0.0.1:9464` or `localhost:9464` ({e})"))?;
    found
        .next()
        .ok_or_else(|| format!("the host of `{text}` has no address"))
}

/// `HISTORY_RETENTION`: `keep` (forever: `None`) or a duration.
pub fn parse_retention(s: &str) -> Result<Option<Duration>, String> {
    if s.trim().eq_ignore_ascii_case("keep") {
        return Ok(None);
    }
    parse_duration(s)
        .map(Some)
        .map_err(|e| format!("{e}, or `keep` to keep them forever"))
}

pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{e} (e.g. `30d`, `12h`)"))?;
    if d.is_zero() {
        return Err("must be longer than zero".into());
    }
    Ok(d)
}

/// A topology prefix: 1-200 characters from `[A-Za-z0-9._-]`.
/// `ENTITY`: `^[a-z][a-z0-9_]{0,30}$` (docs/contract.md section 9).
pub fn parse_entity(s: &str) -> Result<String, String> {
    let mut chars = s.chars();
    let ok = s.len() <= 31
        && chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if ok {
        Ok(s.to_owned())
    } else {
        Err("use 1-31 characters: a lowercase letter, then [a-z0-9_]".into())
    }
}

/// `DATABASE_SCHEMA`: a plain lowercase SQL identifier (no quoting needed
/// anywhere it is used), not one of PostgreSQL's own schemas.
pub fn parse_schema(s: &str) -> Result<String, String> {
    let mut chars = s.chars();
    let ok = s.len() <= 63
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !s.starts_with("pg_")
        && s != "information_schema";
    if ok {
        Ok(s.to_owned())
    } else {
        Err("use a lowercase identifier of 1-63 characters ([a-z_][a-z0-9_]*, not pg_*)".into())
    }
}

/// `HANDLER_FUNCTION`: `name` or `schema.name`, each a plain SQL
/// identifier (`[A-Za-z_][A-Za-z0-9_]*`; unquoted, so PostgreSQL folds it
/// to lowercase as in `CREATE FUNCTION`).
pub fn parse_handler(s: &str) -> Result<String, String> {
    let ident = |p: &str| {
        let mut chars = p.chars();
        p.len() <= 63
            && chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    let parts: Vec<&str> = s.split('.').collect();
    if parts.len() <= 2 && parts.iter().all(|p| ident(p)) {
        Ok(s.to_owned())
    } else {
        Err("use `name` or `schema.name` of a function (event jsonb) RETURNS void".into())
    }
}

pub fn parse_prefix(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() <= 200
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(s.to_owned())
    } else {
        Err("use 1-200 characters from [A-Za-z0-9._-]".into())
    }
}
