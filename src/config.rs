//! Settings: one validated struct, read from environment variables and flags
//! (docs/contract.md, section 5). A bad value stops the process at start with one line
//! that names the setting; secrets inside URLs never reach `Debug` or logs.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use clap::Args;

/// Everything the worker pool and the other commands need to know.
#[derive(Debug, Clone, Args)]
pub struct Settings {
    /// Broker URL (`amqp://` or `amqps://`), or a cluster's nodes as several
    /// URLs separated by commas (same vhost in each): every connection goes
    /// to a live node and moves on when one fails. Passwords are never logged.
    #[arg(
        long,
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
    #[arg(long, env = "AMQP_HEARTBEAT", default_value_t = 10,
          value_parser = clap::value_parser!(u16).range(0..=600))]
    pub amqp_heartbeat: u16,

    /// PostgreSQL URL; the database is created if it does not exist.
    #[arg(
        long,
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
    #[arg(long, env = "DATABASE_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub database_timeout: Duration,

    /// Number of shard queues (1-999).
    #[arg(long, env = "SHARD_COUNT", default_value_t = 4,
          value_parser = clap::value_parser!(u16).range(1..=999))]
    pub shard_count: u16,

    /// Per-shard prefetch; 1 is the strict mode.
    #[arg(long, env = "PREFETCH", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub prefetch: u16,

    /// Ordered batch mode (PREFETCH > 1): most deliveries applied in one
    /// transaction (default: PREFETCH).
    #[arg(long, env = "BATCH_MAX",
          value_parser = clap::value_parser!(u16).range(1..))]
    pub batch_max: Option<u16>,

    /// Ordered batch mode: how long to wait for more deliveries after the
    /// first one of a batch, in milliseconds.
    #[arg(long, env = "BATCH_LINGER_MS", default_value_t = 5,
          value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub batch_linger_ms: u64,

    /// Deliveries of one message before the queue dead-letters it (`x-delivery-limit`).
    #[arg(long, env = "DELIVERY_LIMIT", default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub delivery_limit: u32,

    /// Replicas of each quorum queue (`x-quorum-initial-group-size`), fixed
    /// when the topology is first declared; unset: the broker's default.
    #[arg(long, env = "QUORUM_GROUP_SIZE",
          value_parser = clap::value_parser!(u16).range(1..=99))]
    pub quorum_group_size: Option<u16>,

    /// Address of the HTTP endpoints `/metrics`, `/healthz`, `/readyz`.
    #[arg(long, env = "METRICS_ADDR", default_value = "0.0.0.0:9464")]
    pub metrics_addr: SocketAddr,

    /// How long processed message ids are kept for deduplication (e.g. `30d`, `12h`).
    #[arg(long, env = "DEDUP_RETENTION", default_value = "30d", value_parser = parse_duration)]
    pub dedup_retention: Duration,

    /// How long dead-letter records are kept once resolved (replayed or
    /// purged with `urutan dlq`), e.g. `90d`.
    #[arg(long, env = "DEAD_LETTER_RETENTION", default_value = "90d", value_parser = parse_duration)]
    pub dead_letter_retention: Duration,

    /// How long a dead-letter record is kept while unresolved (its message
    /// still in the DLQ or lost from it), counted from when it was recorded,
    /// e.g. `90d`. Bounds the table under a flood of poison messages.
    #[arg(long, env = "DEAD_LETTER_UNRESOLVED_RETENTION", default_value = "90d", value_parser = parse_duration)]
    pub dead_letter_unresolved_retention: Duration,

    /// Log format: `text` or `json` (level from `RUST_LOG`).
    #[arg(long, env = "LOG_FORMAT", default_value = "text")]
    pub log_format: LogFormat,

    /// Prefix of every broker object name (`pesanan`, `pesanan-hash`, `pesanan.shard-000`, ...).
    #[arg(long, env = "TOPOLOGY_PREFIX", default_value = "pesanan", value_parser = parse_prefix)]
    pub topology_prefix: String,

    /// Largest accepted message body; larger ones are dead-lettered.
    #[arg(long, env = "MAX_BODY_BYTES", default_value_t = 1024 * 1024,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_body_bytes: u32,

    /// Database connections in the pool (default: shard count + 2).
    #[arg(long, env = "DATABASE_POOL_SIZE",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub database_pool_size: Option<u32>,

    /// `declare`: the pool declares (and extends) the topology itself;
    /// `check`: it only checks it passively, for a least-privilege user
    /// (declare it with `urutan topology`).
    #[arg(long, env = "TOPOLOGY_MODE", default_value = "declare")]
    pub topology_mode: TopologyMode,

    /// Accept a `SHARD_COUNT` smaller than the ring has (shrinking): the top
    /// shards are unbound (they get no new messages), drained in order and
    /// their queues deleted.
    #[arg(long, env = "ALLOW_SHRINK", default_value_t = false)]
    pub allow_shrink: bool,

    /// Most messages the dead-letter queue holds (`x-max-length`). When it
    /// is full, further dead letters wait in their shard queue's
    /// dead-letter backlog (nothing is dropped) until `urutan dlq` makes room.
    #[arg(long, env = "DLQ_MAX_LENGTH", default_value_t = 100_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub dlq_max_length: u64,

    /// Most bytes of message bodies the dead-letter queue holds
    /// (`x-max-length-bytes`); as DLQ_MAX_LENGTH when reached.
    #[arg(long, env = "DLQ_MAX_BYTES", default_value_t = 1 << 30,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub dlq_max_bytes: u64,
}

impl Settings {
    /// Settings with every default, for tests and tools.
    pub fn defaults() -> Self {
        use clap::Parser;
        #[derive(Parser)]
        struct Wrapper {
            #[command(flatten)]
            settings: Settings,
        }
        // Only the process environment could make this fail; tests that call it set valid values.
        Wrapper::try_parse_from(["urutan"])
            .map(|w| w.settings)
            .unwrap_or_else(|e| panic!("default settings are invalid: {e}"))
    }

    /// Deliveries applied per transaction: 1 in strict mode (PREFETCH=1),
    /// else BATCH_MAX (default PREFETCH), never more than PREFETCH.
    pub fn batch_size(&self) -> u16 {
        self.batch_max.unwrap_or(self.prefetch).min(self.prefetch)
    }

    /// The broker nodes to connect to, with the heartbeat setting applied.
    pub fn broker(&self) -> BrokerUrls {
        self.amqp_url.with_heartbeat(self.amqp_heartbeat)
    }

    /// The database URL with the session limits of [`Self::database_timeout`]
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
        self.database_url.with(|u| {
            let set: Vec<String> = u.query_pairs().map(|(k, _)| k.into_owned()).collect();
            let mut pairs = u.query_pairs_mut();
            for (key, value) in limits {
                let key = format!("options[{key}]");
                if !set.contains(&key) {
                    pairs.append_pair(&key, value);
                }
            }
        })
    }

    /// Connections the database pool may open.
    pub fn pool_size(&self) -> u32 {
        self.database_pool_size
            .unwrap_or(u32::from(self.shard_count) + 2)
    }
}

/// Whether `urutan run` declares the topology or only checks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TopologyMode {
    Declare,
    Check,
}

/// Output format of the logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
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

/// `30d`, `12h`, `15m`, `90s` (anything `humantime` reads); zero is refused.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{e} (e.g. `30d`, `12h`)"))?;
    if d.is_zero() {
        return Err("must be longer than zero".into());
    }
    Ok(d)
}

fn parse_prefix(s: &str) -> Result<String, String> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        settings: Settings,
    }

    fn parse(args: &[&str]) -> Result<Settings, String> {
        let mut argv = vec!["urutan"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv)
            .map(|c| c.settings)
            .map_err(|e| e.to_string())
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
        assert_eq!(s.max_body_bytes, 1_048_576);
        assert_eq!((s.dlq_max_length, s.dlq_max_bytes), (100_000, 1 << 30));
        assert_eq!(s.batch_size(), 1, "strict mode by default");
        let s = parse(&["--prefetch", "64"]).expect("batch");
        assert_eq!(s.batch_size(), 64, "BATCH_MAX defaults to PREFETCH");
        let s = parse(&["--prefetch", "64", "--batch-max", "500"]).expect("batch");
        assert_eq!(s.batch_size(), 64, "a batch never exceeds PREFETCH");
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
}
