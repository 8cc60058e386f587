//! urutan's operator tooling, over the core library (`urutan`):
//!
//! - [`dlq`]: `urutan dlq`, dead letters listed, shown, replayed, purged;
//! - [`hold`]: `urutan hold`, orders on hold listed and released;
//! - [`verify`]: `urutan verify`, the invariants checked from the database;
//! - [`terminal`]: producer text made safe to print.
//!
//! And what an operator asks every day, answered from PostgreSQL and the
//! broker without changing either:
//!
//! - `status`: `urutan status [--json]`, is the pool healthy right now?
//!   (ring, windows, shards, dead letters, outbox, relay, replicas); its exit
//!   code makes it a check;
//! - `explain`: `urutan explain ORDER_ID`, why is this order in this
//!   state? (its versions, where each went, what still waits).
//!
//! Both only read: no migration, no database created, no object declared;
//! broker objects are looked at with passive declares (no configure
//! permission needed). Every database statement is bounded by
//! [`STATEMENT_TIMEOUT`], every broker call by [`broker::CALL_TIMEOUT`].

pub mod audit;
mod clock;
pub mod console;
pub mod dlq;
mod effects_view;
pub mod explain;
pub mod hold;
pub mod replicas;
pub mod status;
mod story;
pub mod terminal;
pub mod verify;
mod view;

use std::time::Duration;

use lapin::Connection;
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool};

use urutan::broker::{self, BrokerError, call};
use urutan::config::Settings;

/// Exit code: everything looked at is fine (status) or the order was shown
/// (explain).
pub const EXIT_OK: u8 = 0;
/// Exit code: something needs attention (status) or the order is unknown
/// (explain).
pub const EXIT_ATTENTION: u8 = 1;
/// Exit code: the database or the broker cannot be reached, so the answer
/// is incomplete (what could be read is still shown). 2 is the command-line
/// usage error.
pub const EXIT_UNREACHABLE: u8 = 3;

/// A command ended with this exit code (not 0) after reporting why.
#[derive(Debug, thiserror::Error)]
#[error("exit code {0}")]
pub struct Exit(pub u8);

/// `urutan status`: prints the status (text or JSON) to standard output;
/// `Err` carries the exit code when something needs attention (1) or a
/// service cannot be reached (3).
pub async fn status(settings: &Settings, options: &status::StatusOptions) -> Result<(), Exit> {
    let found = status::gather(settings, options).await;
    if options.json {
        match serde_json::to_string_pretty(&found) {
            Ok(json) => println!("{json}"),
            Err(e) => {
                eprintln!("urutan status: cannot write JSON: {e}");
                return Err(Exit(EXIT_UNREACHABLE));
            }
        }
    } else {
        print!("{}", crate::terminal::Lines(&found.to_string()));
    }
    match found.exit_code {
        EXIT_OK => Ok(()),
        code => Err(Exit(code)),
    }
}

/// `urutan explain ORDER_ID`: prints the order's story to standard output;
/// an unknown order (1) or an unreachable service (3) is one line on
/// standard error and the exit code.
pub async fn explain(settings: &Settings, order_id: &str) -> Result<(), Exit> {
    let found = match explain::gather(settings, order_id).await {
        Ok(found) => found,
        Err(e) => {
            eprintln!("urutan explain: {e}");
            return Err(Exit(EXIT_UNREACHABLE));
        }
    };
    if found.is_unknown() {
        eprintln!(
            "urutan explain: order {order_id:?} is unknown: no stored state, history, parked or \
             dead-lettered message, or outbox row (sent outbox rows are purged after \
             OUTBOX_RETENTION)"
        );
        return Err(Exit(EXIT_ATTENTION));
    }
    print!("{}", crate::terminal::Lines(&found.to_string()));
    if let Err(e) = &found.queues {
        eprintln!("urutan explain: queue depths unknown: {e}");
        return Err(Exit(EXIT_UNREACHABLE));
    }
    Ok(())
}

/// The longest one statement of these commands may run.
pub const STATEMENT_TIMEOUT: Duration = Duration::from_secs(10);

/// Opens a small read pool on an existing database (never creates it, never
/// migrates), named `application` in `pg_stat_activity`, with the
/// connection limits of `DATABASE_TIMEOUT` (keepalives) but statements
/// bounded by [`STATEMENT_TIMEOUT`].
pub async fn open_database(settings: &Settings, application: &str) -> Result<PgPool, String> {
    let shown = &settings.database_url;
    let mut bounded = settings.clone();
    let ms = STATEMENT_TIMEOUT.as_millis().to_string();
    bounded.database_url = shown.with(|u| {
        if !u
            .query_pairs()
            .any(|(k, _)| k == "options[statement_timeout]")
        {
            u.query_pairs_mut()
                .append_pair("options[statement_timeout]", &ms);
        }
    });
    let options: PgConnectOptions = bounded
        .database()
        .expose()
        .parse()
        .map_err(|e| format!("cannot use DATABASE_URL {shown}: {e}"))?;
    // A slow read here is no alarm: sqlx would log it at WARN.
    let options = options
        .application_name(application)
        .log_slow_statements(log::LevelFilter::Debug, Duration::from_secs(1));
    PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(options)
        .await
        .map_err(|e| format!("cannot connect to the database {shown}: {e}"))
}

/// What the read commands read through: the CLI opens both per command
/// ([`Open::default`]); the console keeps them open across pages.
#[derive(Default, Clone, Copy)]
pub struct Open<'a> {
    /// An open database pool, else one is opened (and closed) per read.
    pub db: Option<&'a PgPool>,
    /// An open broker connection, else one is opened (and closed) per read.
    pub broker: Option<&'a Connection>,
}

/// A broker connection: `open`'s, else one opened for this read (`name`
/// in the broker's connection list) and closed by [`Broker::done`].
pub(crate) enum Broker<'a> {
    Shared(&'a Connection),
    Owned(Box<Connection>),
}

impl<'a> Broker<'a> {
    pub(crate) async fn get(
        open: Open<'a>,
        settings: &Settings,
        name: &str,
    ) -> Result<Self, String> {
        Ok(match open.broker {
            Some(conn) => Self::Shared(conn),
            None => Self::Owned(Box::new(open_broker(settings, name).await?)),
        })
    }

    pub(crate) fn conn(&self) -> &Connection {
        match self {
            Self::Shared(conn) => conn,
            Self::Owned(conn) => conn,
        }
    }

    /// Closes a connection opened for this read; a shared one stays open.
    pub(crate) async fn done(self) {
        if let Self::Owned(conn) = self {
            let _ = broker::call("connection.close", conn.close(200, "read".into())).await;
        }
    }
}

/// Connects to the broker (a live node of `AMQP_URL`), or says in one line
/// why not.
pub async fn open_broker(settings: &Settings, name: &str) -> Result<Connection, String> {
    let nodes = settings.broker();
    broker::connect(&nodes, name)
        .await
        .map_err(|e| format!("cannot connect to the broker {nodes}: {e}"))
}

/// What a passive `queue.declare` tells about a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct QueueInfo {
    /// Messages ready for delivery (not those delivered and not yet acked).
    pub ready: u32,
    /// Consumers registered, the active one and those standing by
    /// (single active consumer).
    pub consumers: u32,
}

/// Looks at `queues` with passive declares; `None` for a queue that does not
/// exist. A missing queue closes the channel it was asked on, so a new one
/// is opened after each.
pub async fn queue_infos(
    conn: &Connection,
    queues: &[String],
) -> Result<Vec<Option<QueueInfo>>, BrokerError> {
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let mut infos = Vec::with_capacity(queues.len());
    let mut channel = None;
    for queue in queues {
        let ch = match &channel {
            Some(ch) => ch,
            None => channel.insert(call("channel.open", conn.create_channel()).await?),
        };
        let probe = ch.queue_declare(queue.as_str().into(), passive, FieldTable::default());
        match call("queue.declare", probe).await {
            Ok(q) => infos.push(Some(QueueInfo {
                ready: q.message_count(),
                consumers: q.consumer_count(),
            })),
            Err(BrokerError::Amqp(e)) if broker::topology::is_not_found(&e) => {
                infos.push(None);
                channel = None;
            }
            Err(e) => return Err(e),
        }
    }
    if let Some(ch) = channel {
        let _ = call("channel.close", ch.close(200, "looked".into())).await;
    }
    Ok(infos)
}

/// Which of urutan's tables exist (a database that was never migrated, or
/// migrated by an older version, lacks some).
#[derive(Debug, Clone, Copy, Default)]
pub struct Tables {
    /// The contract's tables and the epoch, ring and window tables.
    pub core: bool,
    /// `urutan_dead_letter` (migration 20261130000008).
    pub dead_letters: bool,
    /// `urutan_dikembalikan` (migration 20261130000010).
    pub returned: bool,
}

impl Tables {
    pub async fn look(db: &PgPool) -> Result<Self, sqlx::Error> {
        let (core, dead_letters, returned): (bool, bool, bool) = sqlx::query_as(
            "SELECT to_regclass('pesanan') IS NOT NULL AND to_regclass('pesanan_riwayat') IS NOT NULL
                    AND to_regclass('outbox') IS NOT NULL AND to_regclass('urutan_epoch') IS NOT NULL
                    AND to_regclass('urutan_shard') IS NOT NULL AND to_regclass('urutan_parkir') IS NOT NULL
                    AND to_regclass('urutan_ring') IS NOT NULL AND to_regclass('urutan_jendela') IS NOT NULL,
                    to_regclass('urutan_dead_letter') IS NOT NULL,
                    to_regclass('urutan_dikembalikan') IS NOT NULL",
        )
        .fetch_one(db)
        .await?;
        Ok(Self {
            core,
            dead_letters,
            returned,
        })
    }
}

/// Which setting to set when `settings` do not name the pipeline the
/// database holds (no urutan tables in `DATABASE_SCHEMA` but some in
/// another schema, or another entity's pipeline here): see
/// [`urutan::store::pipeline::Found::advice`]. `None` when they do, when
/// the database holds no pipeline at all, or when it cannot tell.
pub async fn pipeline_advice(db: &PgPool, settings: &Settings) -> Option<String> {
    let mut conn = db.acquire().await.ok()?;
    let found = urutan::store::pipeline::look(&mut conn, settings)
        .await
        .ok()?;
    found.advice()
}

/// What to say when the dead-letter records cannot be read.
pub const NO_DEAD_LETTER_RECORDS: &str =
    "dead-letter records: not available (no urutan_dead_letter table in DATABASE_SCHEMA)";
