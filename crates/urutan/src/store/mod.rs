//! PostgreSQL: connecting (creating the database only when asked), migrations, the apply
//! transaction, dead-letter records, retention, and reads for operator
//! tools. Errors say whether to retry or give up.

mod apply;
pub mod dead_letter;
pub mod hold;
pub mod overdue;
pub mod pipeline;
mod read;
mod retention;

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgPool};
use tracing::info;

use crate::config::SecretUrl;
use crate::metrics::RetryReason;

pub use apply::{
    Applied, BatchItem, BatchResult, applied_with_status, apply, apply_batch, apply_with_handler,
    parse_result, record_returned,
};
pub(crate) use apply::{one_at_a_time, take_one_at_a_time};
pub use dead_letter::{
    NewDeadLetter, insert_dead_letter, purge_dead_letter_before, purge_dead_letter_by_key,
    purge_dead_letters_before, purge_resolved_dead_letters, purge_unresolved_dead_letters,
    record_dead_letters, resolve_dead_letter, store_dead_letter_x_death,
};
pub use read::{
    AppliedVersion, OrderState, ParkedOnShard, ParkedVersion, ReturnedVersion, StaleArrival,
    Standing, applied_versions, last_applied_by_shard, order_state, parked_by_shard,
    parked_versions, processed_at, returned_versions, stale_arrivals, standing, standing_by_id,
    stored_version,
};
pub use retention::{
    DAYS_AHEAD, IdPartitioned, Retention, expire_id_ranges, prepare_id_partitions,
    prepare_partitions, purge_expired, purge_expired_history, run_retention,
};

/// The embedded migrations of `migrations/`.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations");

/// A database failure, with the policy it calls for.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A failure that may pass: the database unreachable or briefly unable
    /// (connection lost, pool timeout, shutdown: hold the message and retry
    /// with backoff, in order), or this message's own transaction failing
    /// transiently ([`Self::sets_aside`]: set it aside). Never a reason to
    /// dead-letter at once.
    #[error("transient failure ({}): {source}", reason.label())]
    Transient {
        reason: RetryReason,
        #[source]
        source: sqlx::Error,
    },
    /// The database refused this message's data (an SQL data or integrity
    /// exception, or a program limit such as `stack depth limit exceeded`
    /// that the data hit): requeue it, so the delivery limit dead-letters
    /// it if it keeps failing. Retrying the same data cannot succeed.
    #[error("the database refused the message's data: {0}")]
    Refused(#[source] sqlx::Error),
    /// The handler (`HANDLER_FUNCTION`) refused this version (SQLSTATE
    /// `URREF`, raised by `urutan_panggil_penangan` with the handler's own
    /// SQLSTATE and message): dead-letter it as `handler_refused`.
    #[error("{0}")]
    HandlerRefused(String),
    /// A Rust handler asked to retry this version (after `after`, if it
    /// said), or panicked on it ([`RetryReason::Panic`]): set it aside.
    #[error("{error}")]
    Retry {
        reason: RetryReason,
        error: String,
        after: Option<Duration>,
    },
}

impl StoreError {
    /// A transient failure of this message's own transaction (the handler
    /// asked to retry, a serialization failure or deadlock, a lock or
    /// statement timeout): the message is set aside and the shard goes on
    /// (docs/contract.md section 11). Any other transient failure is the
    /// database's: the shard waits.
    pub fn sets_aside(&self) -> bool {
        matches!(
            self,
            Self::Retry { .. }
                | Self::Transient {
                    reason: RetryReason::HandlerRetry
                        | RetryReason::Serialization
                        | RetryReason::Deadlock
                        | RetryReason::LockTimeout
                        | RetryReason::StatementTimeout,
                    ..
                }
        )
    }

    /// This message's transaction lost to another one (SQLSTATE class 40:
    /// a serialization failure or a deadlock): the one it lost to usually
    /// commits at once, so it is tried again at once, in a fresh
    /// transaction, a few times before it is set aside with a backoff.
    pub fn contended(&self) -> bool {
        matches!(
            self,
            Self::Transient {
                reason: RetryReason::Serialization | RetryReason::Deadlock,
                ..
            }
        )
    }

    /// How long a handler asked to wait before the next try, if it said.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Retry { after, .. } => *after,
            _ => None,
        }
    }

    /// The `reason` label of `urutan_retries_total`.
    pub fn reason(&self) -> RetryReason {
        match self {
            Self::Transient { reason, .. } | Self::Retry { reason, .. } => *reason,
            Self::Refused(_) | Self::HandlerRefused(_) => RetryReason::Refused,
        }
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(source: sqlx::Error) -> Self {
        let reason = match &source {
            sqlx::Error::PoolTimedOut => RetryReason::PoolTimeout,
            sqlx::Error::Io(e) if e.kind() == std::io::ErrorKind::TimedOut => RetryReason::Timeout,
            sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::PoolClosed => {
                RetryReason::Connection
            }
            sqlx::Error::Database(db) => {
                let code = db.code().unwrap_or_default();
                match code.as_ref() {
                    "URREF" => return Self::HandlerRefused(db.message().to_owned()),
                    "URTRY" => RetryReason::HandlerRetry,
                    "55P03" => RetryReason::LockTimeout,
                    "57014" => RetryReason::StatementTimeout,
                    "40001" => RetryReason::Serialization,
                    "40P01" => RetryReason::Deadlock,
                    c if c.starts_with("08") || c.starts_with("57") || c.starts_with("53") => {
                        RetryReason::Connection
                    }
                    // 22 data exception, 23 integrity constraint violation,
                    // 54 program limit exceeded (e.g. 54001 stack depth).
                    c if c.starts_with("22") || c.starts_with("23") || c.starts_with("54") => {
                        return Self::Refused(source);
                    }
                    _ => RetryReason::Database,
                }
            }
            _ => RetryReason::Database,
        };
        Self::Transient { reason, source }
    }
}

/// Connection options for `url`. sqlx logs statement text (never the bound
/// values) at debug level, so event data stays out of the logs.
fn options(url: &SecretUrl) -> Result<PgConnectOptions, sqlx::Error> {
    let options: PgConnectOptions = url.expose().parse()?;
    Ok(options.application_name("urutan"))
}

/// Creates the database named in `url` if it does not exist yet (connecting
/// to the `postgres` maintenance database of the same server).
pub async fn ensure_database(url: &SecretUrl) -> Result<(), sqlx::Error> {
    let target = options(url)?;
    let name = target
        .get_database()
        .map(str::to_owned)
        .unwrap_or_else(|| target.get_username().to_owned());
    // Creating a database takes a second or more on a busy disk: expected,
    // so sqlx's slow-statement warning is lowered to debug for it.
    let mut admin = target
        .database("postgres")
        .log_slow_statements(log::LevelFilter::Debug, Duration::from_secs(1))
        .connect()
        .await?;
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(&name)
            .fetch_one(&mut admin)
            .await?;
    if !exists {
        let create = format!("CREATE DATABASE \"{}\"", name.replace('"', "\"\""));
        match sqlx::query(sqlx::AssertSqlSafe(create))
            .execute(&mut admin)
            .await
        {
            Ok(_) => info!(database = %name, "created the database"),
            // Someone else created it at the same moment: fine.
            Err(sqlx::Error::Database(e))
                if matches!(e.code().as_deref(), Some("42P04") | Some("23505")) => {}
            Err(e) => return Err(e),
        }
    }
    admin.close().await
}

/// How long a connection going back to the pool may take to answer the
/// check that it is still usable.
const RELEASE_CHECK: Duration = Duration::from_secs(5);

/// Opens a pool of `size` connections (sqlx turns Nagle's algorithm off on
/// each since 0.9.1). Acquiring waits at most 5 s, so a
/// database outage surfaces as a transient error instead of a hang. A
/// connection going back to the pool must answer a ping within
/// `RELEASE_CHECK` or is closed: sqlx's own release ping has no bound, and a
/// connection whose link went silent (no FIN, no RST) would keep its pool
/// slot forever (and `PgPool::close` would wait for it).
pub async fn connect(url: &SecretUrl, size: u32) -> Result<PgPool, sqlx::Error> {
    use sqlx::Connection as _;
    let options = options(url)?;
    PgPoolOptions::new()
        .max_connections(size)
        .acquire_timeout(Duration::from_secs(5))
        .test_before_acquire(false)
        .after_release(|conn, _| {
            Box::pin(async move {
                // An error (not `Ok(false)`) makes sqlx close it without the
                // goodbye a silent link would never carry.
                match tokio::time::timeout(RELEASE_CHECK, conn.ping()).await {
                    Ok(answer) => answer.map(|()| true),
                    Err(_) => Err(sqlx::Error::Io(std::io::ErrorKind::TimedOut.into())),
                }
            })
        })
        .connect_with(options)
        .await
}

/// Connects and applies the migrations. Never creates the database: a
/// missing one is an error (3D000) that names the fix, `urutan migrate
/// --create-database` ([`ensure_database`]).
///
/// A least-privilege role (see `deploy/postgres/`) may not run DDL: it
/// gets through when every migration is already applied, and otherwise
/// stops with a message saying to run `urutan migrate` as the owner.
pub async fn prepare(url: &SecretUrl, size: u32) -> Result<PgPool, sqlx::Error> {
    // One connection first: a refusal or an unreachable server is an error
    // at once (the pool would retry it until its acquire timeout).
    options(url)?.connect().await?.close().await?;
    let pool = connect(url, size).await?;
    ensure_schema(&pool).await?;
    let pending = pending_migrations(&pool).await;
    if pending.as_ref().is_ok_and(Vec::is_empty) {
        return Ok(pool);
    }
    // On a pool of its own, closed afterwards: a failed run leaves the
    // migrator's session lock behind on the connection it used.
    // Without the session limits of `Settings::database`: a migration on a
    // large table may rightly take longer.
    // Quiet: a migration's `DROP ... IF EXISTS` of what is not there is a
    // NOTICE, no news to whoever starts urutan.
    let unlimited = options(url)?.options([
        ("statement_timeout", "0"),
        ("idle_in_transaction_session_timeout", "0"),
        ("client_min_messages", "warning"),
    ]);
    let migrator_pool = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(unlimited)
        .await?;
    let mut migrated = MIGRATOR.run(&migrator_pool).await;
    if migrated.is_ok() {
        // The day partitions of the coming week (migration 0026), by the
        // owner and without a statement timeout: the first time, validating
        // the default partitions' bound reads them whole.
        migrated = retention::prepare_partitions(&migrator_pool)
            .await
            .map(drop)
            .map_err(sqlx::migrate::MigrateError::Execute);
    }
    if migrated.is_ok() {
        // The outbox's constraints added NOT VALID (migration 0038),
        // validated while writes go on.
        migrated = crate::outbox::validate_constraints(&migrator_pool)
            .await
            .map(drop)
            .map_err(sqlx::migrate::MigrateError::Execute);
    }
    migrator_pool.close().await;
    match migrated {
        Ok(()) => Ok(pool),
        Err(e) if is_permission_denied(&e) => {
            let pending = pending.unwrap_or_default();
            Err(sqlx::Error::Configuration(
                format!(
                    "{} migration(s) pending ({}) and this database role may not apply them: \
                     run `urutan migrate` as the database owner",
                    pending.len().max(1),
                    pending.join(", ")
                )
                .into(),
            ))
        }
        Err(e) => Err(e.into()),
    }
}

/// Checks the handler this pool's sessions name (`HANDLER_FUNCTION`, the
/// `urutan.handler` option of [`crate::config::Settings::schema_url`]):
/// a function of one `jsonb` that returns `void`. `Err` is one line naming
/// the setting and the fix; a database error is `Ok(Err)` only when it is
/// the check's answer.
pub async fn check_handler(
    pool: &PgPool,
    handler: &str,
) -> Result<Result<(), String>, sqlx::Error> {
    let found: Result<Option<(String, String)>, sqlx::Error> = sqlx::query_as(
        "SELECT f::text, format_type(p.prorettype, NULL)
         FROM urutan_penangan() f JOIN pg_proc p ON p.oid = f",
    )
    .fetch_optional(pool)
    .await;
    let create = format!(
        "create it (CREATE FUNCTION {handler}(event jsonb) RETURNS void ...) or unset HANDLER_FUNCTION"
    );
    Ok(match found {
        Ok(Some((_, returns))) if returns == "void" => Ok(()),
        Ok(Some((function, returns))) => Err(format!(
            "HANDLER_FUNCTION {handler}: {function} returns {returns}, not void: {create}"
        )),
        Ok(None) => Err(format!(
            "HANDLER_FUNCTION {handler}: the database connection does not name it: {create}"
        )),
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42883") => Err(format!(
            "HANDLER_FUNCTION {handler}: there is no function {handler}(event jsonb) in this database: {create}"
        )),
        Err(e) => return Err(e),
    })
}

/// Creates the schema the URL's `search_path` names (`DATABASE_SCHEMA`,
/// see [`crate::config::Settings::schema_url`]) if it does not exist yet:
/// then `current_schema()` is NULL. The name was checked to be a plain
/// identifier; `%I` quotes it all the same.
async fn ensure_schema(pool: &PgPool) -> Result<(), sqlx::Error> {
    let missing: Option<String> =
        sqlx::query_scalar("SELECT current_setting('search_path') WHERE current_schema() IS NULL")
            .fetch_optional(pool)
            .await?;
    let Some(schema) = missing else {
        return Ok(());
    };
    let create = format!(
        "CREATE SCHEMA IF NOT EXISTS \"{}\"",
        schema.replace('"', "\"\"")
    );
    match sqlx::query(sqlx::AssertSqlSafe(create)).execute(pool).await {
        Ok(_) => info!(schema = %schema, "created the schema"),
        // Created by another process at the same moment.
        Err(sqlx::Error::Database(e))
            if matches!(e.code().as_deref(), Some("42P06") | Some("23505")) => {}
        Err(e) => return Err(e),
    }
    Ok(())
}

/// The embedded migrations not applied (or applied with other contents) in
/// the database; an error if it cannot tell (no migrations table yet).
async fn pending_migrations(pool: &PgPool) -> Result<Vec<String>, sqlx::Error> {
    let applied: Vec<(i64, Vec<u8>)> =
        sqlx::query_as("SELECT version, checksum FROM _sqlx_migrations WHERE success")
            .fetch_all(pool)
            .await?;
    Ok(MIGRATOR
        .iter()
        .filter(|m| {
            !applied
                .iter()
                .any(|(v, sum)| *v == m.version && **sum == *m.checksum)
        })
        .map(|m| format!("{} {}", m.version, m.description))
        .collect())
}

fn is_permission_denied(e: &sqlx::migrate::MigrateError) -> bool {
    use sqlx::migrate::MigrateError;
    let (MigrateError::Execute(sqlx::Error::Database(db))
    | MigrateError::ExecuteMigration(sqlx::Error::Database(db), _)) = e
    else {
        return false;
    };
    db.code().as_deref() == Some("42501")
}

/// True if the database answers a trivial query within `limit`.
pub async fn ping(pool: &PgPool, limit: Duration) -> bool {
    let Ok(Ok(mut conn)) = tokio::time::timeout(limit, pool.acquire()).await else {
        return false;
    };
    let ping = async |c: &mut sqlx::PgConnection| sqlx::query("SELECT 1").execute(c).await;
    bounded(&mut conn, limit, ping).await.is_ok()
}

/// Runs `work` on `conn` for at most `limit`. On a timeout the connection
/// is closed instead of going back to the pool: sqlx would otherwise test it
/// with an unbounded ping, and a silent link (packets dropped, no FIN, no
/// RST) would keep that pool slot forever.
pub async fn bounded<T, E>(
    conn: &mut sqlx::pool::PoolConnection<sqlx::Postgres>,
    limit: Duration,
    work: impl AsyncFnOnce(&mut sqlx::PgConnection) -> Result<T, E>,
) -> Result<T, StoreError>
where
    StoreError: From<E>,
{
    let finished = tokio::time::timeout(limit, work(&mut *conn)).await;
    match finished {
        Ok(done) => Ok(done?),
        Err(_) => {
            conn.close_on_drop();
            let silent = std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer within {limit:?}"),
            );
            Err(sqlx::Error::Io(silent).into())
        }
    }
}
