//! [`Settings`] from the environment, for a pool embedded in a team's own
//! program ([`crate::Pool::from_env`]): the variables `urutan run` reads
//! (docs/contract.md section 5), with the same parsers, ranges and
//! defaults. The `urutan` command line reads the same variables (and
//! flags) through clap; a test of its settings checks that both read each
//! variable alike.

use std::fmt::Display;
use std::ops::RangeInclusive;
use std::str::FromStr;

use super::{
    Settings, parse_address, parse_duration, parse_entity, parse_handler, parse_prefix,
    parse_replica_name, parse_retention, parse_schema,
};
use crate::heal::WrongSetting;

/// Every variable [`Settings::from_env`] reads (besides the `OTEL_*` ones
/// of [`crate::trace::Traces::from_env`]).
pub const VARIABLES: [&str; 34] = [
    "AMQP_URL",
    "AMQP_HEARTBEAT",
    "DATABASE_URL",
    "DATABASE_TIMEOUT",
    "SHARD_COUNT",
    "PREFETCH",
    "BATCH_MAX",
    "BATCH_LINGER_MS",
    "DELIVERY_LIMIT",
    "QUORUM_GROUP_SIZE",
    "METRICS_ADDR",
    "DEDUP_RETENTION",
    "HISTORY_RETENTION",
    "DEAD_LETTER_RETENTION",
    "DEAD_LETTER_UNRESOLVED_RETENTION",
    "LOG_FORMAT",
    "ENTITY",
    "DATABASE_SCHEMA",
    "HANDLER_FUNCTION",
    "RETRY_BACKOFF_MIN",
    "RETRY_BACKOFF_MAX",
    "RETRY_MAX_ATTEMPTS",
    "ON_REFUSED",
    "GAP_POLICY",
    "GAP_TIMEOUT",
    "GAP_WAITING_MAX",
    "TOPOLOGY_PREFIX",
    "MAX_BODY_BYTES",
    "DATABASE_POOL_SIZE",
    "TOPOLOGY_MODE",
    "ALLOW_SHRINK",
    "DLQ_MAX_LENGTH",
    "DLQ_MAX_BYTES",
    "REPLICA_NAME",
];

/// The variables that may hold a password: their value is never echoed.
const SECRET: [&str; 2] = ["AMQP_URL", "DATABASE_URL"];

impl Settings {
    /// The settings `urutan run` would use: each variable of [`VARIABLES`]
    /// that is set, the documented default for each one that is not, and
    /// the traces' `OTEL_*` variables. A wrong value is one line naming the
    /// variable and the fix (never a value that may hold a password).
    pub fn from_env() -> Result<Self, WrongSetting> {
        let mut settings = Self::from_vars(|name| std::env::var(name).ok())?;
        settings.traces = crate::trace::Traces::from_env().map_err(WrongSetting)?;
        Ok(settings)
    }

    /// [`Self::from_env`] with each variable read through `var` (`None`:
    /// unset), without the traces (off).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, WrongSetting> {
        let read = Reader { var: &var };
        let d = Self::default();
        let entity = read.or("ENTITY", parse_entity, d.entity)?;
        let retry_backoff_min =
            read.or("RETRY_BACKOFF_MIN", parse_duration, d.retry_backoff_min)?;
        Ok(Self {
            amqp_url: read.or("AMQP_URL", FromStr::from_str, d.amqp_url)?,
            amqp_heartbeat: read.or("AMQP_HEARTBEAT", within(0..=600), d.amqp_heartbeat)?,
            database_url: read.or("DATABASE_URL", FromStr::from_str, d.database_url)?,
            database_timeout: read.or("DATABASE_TIMEOUT", parse_duration, d.database_timeout)?,
            shard_count: read.or("SHARD_COUNT", within(1..=999), d.shard_count)?,
            prefetch: read.or("PREFETCH", within(1..=u16::MAX), d.prefetch)?,
            batch_max: read.optional("BATCH_MAX", within(1..=u16::MAX))?,
            batch_linger_ms: read.or("BATCH_LINGER_MS", within(0..=10_000), d.batch_linger_ms)?,
            delivery_limit: read.or("DELIVERY_LIMIT", within(1..=u32::MAX), d.delivery_limit)?,
            quorum_group_size: read.optional("QUORUM_GROUP_SIZE", within(1..=99))?,
            metrics_addr: read.or("METRICS_ADDR", parse_address, d.metrics_addr)?,
            dedup_retention: read.or("DEDUP_RETENTION", parse_duration, d.dedup_retention)?,
            history_retention: read.or("HISTORY_RETENTION", parse_retention, None)?,
            dead_letter_retention: read.or(
                "DEAD_LETTER_RETENTION",
                parse_duration,
                d.dead_letter_retention,
            )?,
            dead_letter_unresolved_retention: read.or(
                "DEAD_LETTER_UNRESOLVED_RETENTION",
                parse_duration,
                d.dead_letter_unresolved_retention,
            )?,
            log_format: read.or("LOG_FORMAT", FromStr::from_str, d.log_format)?,
            topology_prefix: read.or("TOPOLOGY_PREFIX", parse_prefix, entity.clone())?,
            entity,
            database_schema: read.or("DATABASE_SCHEMA", parse_schema, d.database_schema)?,
            handler_function: read.optional("HANDLER_FUNCTION", parse_handler)?,
            retry_backoff_max: read
                .or("RETRY_BACKOFF_MAX", parse_duration, d.retry_backoff_max)?
                .max(retry_backoff_min),
            retry_backoff_min,
            retry_max_attempts: read.or(
                "RETRY_MAX_ATTEMPTS",
                within(1..=1_000_000),
                d.retry_max_attempts,
            )?,
            on_refused: read.or("ON_REFUSED", FromStr::from_str, d.on_refused)?,
            gap_policy: read.or("GAP_POLICY", FromStr::from_str, d.gap_policy)?,
            gap_timeout: read.or("GAP_TIMEOUT", parse_duration, d.gap_timeout)?,
            gap_waiting_max: read.or(
                "GAP_WAITING_MAX",
                within(1..=100_000_000),
                d.gap_waiting_max,
            )?,
            max_body_bytes: read.or("MAX_BODY_BYTES", within(1..=u32::MAX), d.max_body_bytes)?,
            database_pool_size: read.optional("DATABASE_POOL_SIZE", within(1..=u32::MAX))?,
            topology_mode: read.or("TOPOLOGY_MODE", FromStr::from_str, d.topology_mode)?,
            allow_shrink: read.or("ALLOW_SHRINK", parse_bool, d.allow_shrink)?,
            dlq_max_length: read.or("DLQ_MAX_LENGTH", within(1..=u64::MAX), d.dlq_max_length)?,
            dlq_max_bytes: read.or("DLQ_MAX_BYTES", within(1..=u64::MAX), d.dlq_max_bytes)?,
            traces: d.traces,
            replica_name: read.optional("REPLICA_NAME", parse_replica_name)?,
        })
    }
}

/// Reads one variable at a time through `var`.
struct Reader<'a> {
    var: &'a dyn Fn(&str) -> Option<String>,
}

impl Reader<'_> {
    /// `name` parsed by `parse`, `None` when unset.
    fn optional<T>(
        &self,
        name: &str,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> Result<Option<T>, WrongSetting> {
        let Some(value) = (self.var)(name) else {
            return Ok(None);
        };
        parse(&value).map(Some).map_err(|fix| {
            WrongSetting(if SECRET.contains(&name) {
                format!("{name} (not shown: it may hold a password): {fix}")
            } else {
                format!("{name}={value:?}: {fix}")
            })
        })
    }

    /// `name` parsed by `parse`, `default` when unset.
    fn or<T>(
        &self,
        name: &str,
        parse: impl Fn(&str) -> Result<T, String>,
        default: T,
    ) -> Result<T, WrongSetting> {
        Ok(self.optional(name, parse)?.unwrap_or(default))
    }
}

/// A whole number in `range`.
fn within<T>(range: RangeInclusive<T>) -> impl Fn(&str) -> Result<T, String>
where
    T: FromStr + PartialOrd + Display,
{
    move |s| {
        let n: T = s
            .trim()
            .parse()
            .map_err(|_| "use a whole number".to_owned())?;
        if range.contains(&n) {
            Ok(n)
        } else {
            Err(format!("{n} is not in {}..={}", range.start(), range.end()))
        }
    }
}

/// `true` or `false`, as the command line's flags read them.
fn parse_bool(s: &str) -> Result<bool, String> {
    match s {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err("use `true` or `false`".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::time::Duration;

    fn read(vars: &[(&str, &str)]) -> Result<Settings, WrongSetting> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Settings::from_vars(|name| vars.get(name).cloned())
    }

    #[test]
    fn unset_variables_are_the_defaults() {
        let read = read(&[]).expect("defaults");
        assert_eq!(format!("{read:?}"), format!("{:?}", Settings::default()));
    }

    #[test]
    fn set_variables_are_read_and_the_prefix_follows_the_entity() {
        let read = read(&[
            ("SHARD_COUNT", "8"),
            ("PREFETCH", "16"),
            ("ENTITY", "pengiriman"),
            ("GAP_POLICY", "wait"),
            ("HISTORY_RETENTION", "400d"),
            ("RETRY_BACKOFF_MIN", "10m"),
            ("RETRY_BACKOFF_MAX", "1m"),
        ])
        .expect("settings");
        assert_eq!((read.shard_count, read.prefetch), (8, 16));
        assert_eq!(read.topology_prefix, "pengiriman");
        assert_eq!(read.gap_policy, super::super::GapPolicy::Wait);
        assert_eq!(
            read.history_retention,
            Some(Duration::from_secs(400 * 86_400))
        );
        assert_eq!(read.retry_backoff_max, read.retry_backoff_min, "max >= min");
    }

    #[test]
    fn a_wrong_value_names_its_variable_and_never_a_password() {
        let wrong = read(&[("SHARD_COUNT", "0")]).expect_err("zero shards");
        assert_eq!(wrong.0, "SHARD_COUNT=\"0\": 0 is not in 1..=999");
        let wrong = read(&[("GAP_POLICY", "later")]).expect_err("policy");
        assert!(wrong.0.starts_with("GAP_POLICY=\"later\": use"), "{wrong}");
        let wrong = read(&[("DATABASE_URL", "mysql://u:hunter2@db/x")]).expect_err("scheme");
        assert!(wrong.0.starts_with("DATABASE_URL (not shown"), "{wrong}");
        assert!(!wrong.0.contains("hunter2"), "{wrong}");
    }
}
