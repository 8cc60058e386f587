//! Metric names (docs/contract.md, section 8) and the Prometheus recorder. Every metric
//! the code emits is named here; labels are bounded (never an entity or message id).

use std::sync::OnceLock;

use metrics::{Counter, Histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::outcome::Outcome;

pub const MESSAGES_TOTAL: &str = "urutan_messages_total";
pub const DEAD_LETTERS_TOTAL: &str = "urutan_dead_letters_total";
pub const RETRIES_TOTAL: &str = "urutan_retries_total";
pub const HANDLE_DURATION_SECONDS: &str = "urutan_handle_duration_seconds";
pub const END_TO_END_LAG_SECONDS: &str = "urutan_end_to_end_lag_seconds";
pub const BROKER_RECONNECTS_TOTAL: &str = "urutan_broker_reconnects_total";
pub const OUTBOX_PUBLISHED_TOTAL: &str = "urutan_outbox_published_total";
pub const OUTBOX_BACKLOG: &str = "urutan_outbox_backlog";
pub const OUTBOX_UNROUTABLE_TOTAL: &str = "urutan_outbox_unroutable_total";
pub const OUTBOX_UNROUTABLE: &str = "urutan_outbox_unroutable";
pub const OUTBOX_SET_ASIDE_TOTAL: &str = "urutan_outbox_set_aside_total";
pub const OUTBOX_SET_ASIDE: &str = "urutan_outbox_set_aside";
pub const HANDOFFS_TOTAL: &str = "urutan_handoffs_total";
pub const PARKED_MESSAGES: &str = "urutan_parked_messages";
pub const PARKED_TOTAL: &str = "urutan_parked_total";
pub const HANDOFF_DURATION_SECONDS: &str = "urutan_handoff_duration_seconds";
pub const EPOCHS_TOTAL: &str = "urutan_epochs_total";
pub const SHARDS: &str = "urutan_shards";
pub const SHARDS_ACTIVE: &str = "urutan_shards_active";
pub const SHARD_MOVES_TOTAL: &str = "urutan_shard_moves_total";
pub const RESHARDING: &str = "urutan_resharding";
pub const RESHARDING_DURATION_SECONDS: &str = "urutan_resharding_duration_seconds";
pub const OUTBOX_PUBLISH_DURATION_SECONDS: &str = "urutan_outbox_publish_duration_seconds";
pub const READY: &str = "urutan_ready";
pub const ORDERS_HELD: &str = "urutan_orders_held";
pub const HOLDS_TOTAL: &str = "urutan_holds_total";
pub const ORDERS_RETRYING: &str = "urutan_orders_retrying";
pub const HOLD_OLDEST_SECONDS: &str = "urutan_hold_oldest_seconds";
pub const RELAY_WAKEUPS_TOTAL: &str = "urutan_relay_wakeups_total";
pub const ORDERS_OVERDUE: &str = "urutan_orders_overdue";
pub const SET_ASIDE_TOTAL: &str = "urutan_set_aside_total";
pub const DEAD_LETTERS_REFUSED_TOTAL: &str = "urutan_dead_letters_refused_total";
/// 1, labelled with the crate's version and the commit it was built from.
pub const BUILD_INFO: &str = "urutan_build_info";

/// The commit this binary was built from (crates/urutan/build.rs), or `unknown`.
pub const COMMIT: &str = env!("URUTAN_COMMIT");

/// The `reason` label of `urutan_orders_held` and `urutan_holds_total`.
pub const HOLD_REASONS: [&str; 3] = ["refused", "gap", "effect"];
// `urutan effects` (described and registered in `effects::metric`).
pub const EFFECTS_SENT_TOTAL: &str = "urutan_effects_sent_total";
pub const EFFECTS_RETRIES_TOTAL: &str = "urutan_effects_retries_total";
pub const EFFECTS_DEAD_LETTERS_TOTAL: &str = "urutan_effects_dead_letters_total";
pub const EFFECTS_REQUEST_DURATION_SECONDS: &str = "urutan_effects_request_duration_seconds";
pub const EFFECTS_BACKLOG: &str = "urutan_effects_backlog";
pub const EFFECTS_OLDEST_PENDING_SECONDS: &str = "urutan_effects_oldest_pending_seconds";
pub const EFFECTS_DEAD_LETTERED: &str = "urutan_effects_dead_lettered";
pub const EFFECTS_IN_FLIGHT: &str = "urutan_effects_in_flight";
pub const EFFECTS_ROUTES_CURRENT: &str = "urutan_effects_routes_current";

/// Why a message was retried (held or requeued): the `reason` label of
/// `urutan_retries_total`, one variant per value the code emits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryReason {
    /// The database connection was lost or could not be opened.
    Connection,
    /// No pooled connection within the pool's acquire timeout.
    PoolTimeout,
    /// A database step got no answer within `DATABASE_TIMEOUT`.
    Timeout,
    /// A serialization failure (SQLSTATE 40001).
    Serialization,
    /// A deadlock (SQLSTATE 40P01).
    Deadlock,
    /// Any other database error that is not the message's fault.
    Database,
    /// The database refused the message's data (requeued).
    Refused,
    /// The handler panicked on the message.
    Panic,
    /// PostgreSQL's lock table could not hold a batch (the batch was split).
    LockTableFull,
    /// The handler asked to retry (SQLSTATE `URTRY`).
    HandlerRetry,
    /// A lock was not available in time (SQLSTATE 55P03).
    LockTimeout,
    /// A statement ran past its timeout (SQLSTATE 57014).
    StatementTimeout,
}

impl RetryReason {
    pub const ALL: [RetryReason; 12] = [
        RetryReason::Connection,
        RetryReason::PoolTimeout,
        RetryReason::Timeout,
        RetryReason::Serialization,
        RetryReason::Deadlock,
        RetryReason::Database,
        RetryReason::Refused,
        RetryReason::Panic,
        RetryReason::LockTableFull,
        RetryReason::HandlerRetry,
        RetryReason::LockTimeout,
        RetryReason::StatementTimeout,
    ];

    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            RetryReason::Connection => "connection",
            RetryReason::PoolTimeout => "pool_timeout",
            RetryReason::Timeout => "timeout",
            RetryReason::Serialization => "serialization",
            RetryReason::Deadlock => "deadlock",
            RetryReason::Database => "database",
            RetryReason::Refused => "refused",
            RetryReason::Panic => "panic",
            RetryReason::LockTableFull => "lock_table_full",
            RetryReason::HandlerRetry => "handler_retry",
            RetryReason::LockTimeout => "lock_timeout",
            RetryReason::StatementTimeout => "statement_timeout",
        }
    }
}

/// The per-message metrics of one shard worker, registered once (a
/// `counter!` with a `shard` label builds its key, formats the label and
/// looks it up in the registry on every call). Create it after [`install`]:
/// handles made before a recorder exists stay no-ops.
#[derive(Clone)]
pub struct ShardMetrics {
    /// The `shard` label value.
    pub shard: String,
    applied: Counter,
    stale: Counter,
    duplicate: Counter,
    dead_lettered: Counter,
    /// `urutan_handle_duration_seconds{shard}`.
    pub handle_duration: Histogram,
    /// `urutan_end_to_end_lag_seconds{shard}`.
    pub lag: Histogram,
    /// `urutan_parked_total{shard}`.
    pub parked: Counter,
}

impl ShardMetrics {
    /// The shard's series. Its four outcomes of `urutan_messages_total`
    /// are registered at zero, so `rate()` sees them from the first scrape;
    /// dead-letter and retry reasons (about 30 per shard) appear when first
    /// counted: a pool of many shards does not export hundreds of zeros.
    pub fn new(shard: u16) -> Self {
        let label = shard.to_string();
        let outcome = |o: &'static str| {
            let counter =
                metrics::counter!(MESSAGES_TOTAL, "shard" => label.clone(), "outcome" => o);
            counter.increment(0);
            counter
        };
        Self {
            applied: outcome("applied"),
            stale: outcome("stale"),
            duplicate: outcome("duplicate"),
            dead_lettered: outcome("dead_lettered"),
            handle_duration: metrics::histogram!(HANDLE_DURATION_SECONDS, "shard" => label.clone()),
            lag: metrics::histogram!(END_TO_END_LAG_SECONDS, "shard" => label.clone()),
            parked: metrics::counter!(PARKED_TOTAL, "shard" => label.clone()),
            shard: label,
        }
    }

    /// Counts a message set aside after a transient failure (`reason`) in
    /// `urutan_set_aside_total`: not a parked message.
    pub fn set_aside(&self, reason: RetryReason) {
        metrics::counter!(SET_ASIDE_TOTAL, "shard" => self.shard.clone(), "reason" => reason.label())
            .increment(1);
    }

    /// Counts one outcome in `urutan_messages_total`.
    pub fn outcome(&self, outcome: Outcome) {
        match outcome {
            Outcome::Applied => self.applied.increment(1),
            Outcome::Stale => self.stale.increment(1),
            Outcome::Duplicate => self.duplicate.increment(1),
            Outcome::DeadLettered(_) => self.dead_lettered.increment(1),
        }
    }
}

/// Registers the process-wide series of `urutan run` at zero (histograms
/// with empty buckets), so alerts and panels see them from the first scrape.
pub fn register_worker() {
    metrics::counter!(BROKER_RECONNECTS_TOTAL).increment(0);
    metrics::counter!(HANDOFFS_TOTAL).increment(0);
    metrics::counter!(EPOCHS_TOTAL).increment(0);
    let _ = metrics::histogram!(HANDOFF_DURATION_SECONDS);
    let _ = metrics::histogram!(RESHARDING_DURATION_SECONDS);
    for reason in HOLD_REASONS {
        metrics::counter!(HOLDS_TOTAL, "reason" => reason).increment(0);
        metrics::gauge!(ORDERS_HELD, "reason" => reason).set(0.0);
    }
    metrics::gauge!(ORDERS_RETRYING).set(0.0);
    metrics::gauge!(HOLD_OLDEST_SECONDS).set(0.0);
    for kind in crate::store::overdue::KINDS {
        metrics::gauge!(ORDERS_OVERDUE, "kind" => kind).set(0.0);
    }
}

/// Registers the series of `urutan relay` at zero (see [`register_worker`]).
pub fn register_relay() {
    metrics::counter!(OUTBOX_PUBLISHED_TOTAL).increment(0);
    metrics::counter!(OUTBOX_UNROUTABLE_TOTAL).increment(0);
    metrics::counter!(RELAY_WAKEUPS_TOTAL).increment(0);
    for reason in crate::outbox::check::SetAside::ALL {
        metrics::counter!(OUTBOX_SET_ASIDE_TOTAL, "reason" => reason.reason()).increment(0);
        metrics::gauge!(OUTBOX_SET_ASIDE, "reason" => reason.reason()).set(0.0);
    }
    metrics::counter!(EPOCHS_TOTAL).increment(0);
    metrics::counter!(BROKER_RECONNECTS_TOTAL).increment(0);
    let _ = metrics::histogram!(OUTBOX_PUBLISH_DURATION_SECONDS);
}

/// Handling time of one message: sub-millisecond to tens of seconds (a held retry).
const HANDLE_BUCKETS: &[f64] = &[
    0.000_5, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// Publish-to-commit lag: milliseconds to minutes (a backlog).
const LAG_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
];

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// The process's own series (CPU seconds, resident and virtual memory, open
/// and maximum file descriptors, threads, start time), read on each scrape.
static PROCESS: OnceLock<metrics_process::Collector> = OnceLock::new();

/// The `/metrics` body: the process's series read now, histogram samples
/// folded into their buckets, then everything in Prometheus text format.
pub fn render(handle: &PrometheusHandle) -> String {
    if let Some(process) = PROCESS.get() {
        process.collect();
    }
    handle.run_upkeep();
    handle.render()
}

/// Installs the process-wide Prometheus recorder once and returns its handle
/// (later calls, e.g. several pools in one test process, share it).
pub fn install() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full(HANDLE_DURATION_SECONDS.into()),
                    HANDLE_BUCKETS,
                )
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full(END_TO_END_LAG_SECONDS.into()),
                        LAG_BUCKETS,
                    )
                })
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full(OUTBOX_PUBLISH_DURATION_SECONDS.into()),
                        HANDLE_BUCKETS,
                    )
                })
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full(HANDOFF_DURATION_SECONDS.into()),
                        LAG_BUCKETS,
                    )
                })
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full(RESHARDING_DURATION_SECONDS.into()),
                        LAG_BUCKETS,
                    )
                })
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full(EFFECTS_REQUEST_DURATION_SECONDS.into()),
                        HANDLE_BUCKETS,
                    )
                })
                .unwrap_or_else(|e| unreachable!("bucket lists are not empty: {e}"));
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("another metrics recorder is installed; /metrics will be empty");
            }
            describe();
            metrics::gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION"), "commit" => COMMIT)
                .set(1.0);
            let process = PROCESS.get_or_init(metrics_process::Collector::default);
            process.describe();
            process.collect();
            // Histogram samples stay in memory until upkeep drains them into
            // buckets; without a scrape nobody would, and memory would grow
            // with every message.
            let upkeep = handle.clone();
            let _ = std::thread::Builder::new()
                .name("metrics-upkeep".into())
                .spawn(move || {
                    loop {
                        std::thread::sleep(UPKEEP_EVERY);
                        upkeep.run_upkeep();
                    }
                });
            handle
        })
        .clone()
}

/// How often histogram samples are folded into their buckets.
const UPKEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_gauge!(
        BUILD_INFO,
        "1, labelled with the version and the commit this binary was built from."
    );
    describe_counter!(MESSAGES_TOTAL, "Deliveries by shard and outcome.");
    describe_counter!(DEAD_LETTERS_TOTAL, "Dead-lettered deliveries by reason.");
    describe_counter!(
        RETRIES_TOTAL,
        "Held retries of a message (transient failures, handler failures)."
    );
    describe_histogram!(
        HANDLE_DURATION_SECONDS,
        Unit::Seconds,
        "Delivery received to ack sent."
    );
    describe_histogram!(
        END_TO_END_LAG_SECONDS,
        Unit::Seconds,
        "Message timestamp to commit."
    );
    describe_counter!(
        BROKER_RECONNECTS_TOTAL,
        "Broker connections re-established after a loss."
    );
    describe_counter!(
        OUTBOX_PUBLISHED_TOTAL,
        "Outbox rows published and confirmed."
    );
    describe_gauge!(
        OUTBOX_BACKLOG,
        "Outbox rows not yet sent (set-aside rows excluded)."
    );
    describe_counter!(
        OUTBOX_UNROUTABLE_TOTAL,
        "Outbox rows set aside because the broker returned them (routing key outside the entry binding)."
    );
    describe_gauge!(
        OUTBOX_UNROUTABLE,
        "Outbox rows set aside as unroutable, waiting for an operator."
    );
    describe_counter!(
        OUTBOX_SET_ASIDE_TOTAL,
        "Outbox rows the relay set aside instead of publishing, by reason (unroutable, a contract rule broken, refused by the broker)."
    );
    describe_gauge!(
        OUTBOX_SET_ASIDE,
        "Outbox rows set aside and not resolved, by reason, waiting for an operator."
    );
    describe_gauge!(
        READY,
        "1 while /readyz answers 200 (broker and database reachable, every owned shard consuming), else 0."
    );
    describe_counter!(
        HANDOFFS_TOTAL,
        "Orders that waited for their old shard during a resharding, then went on."
    );
    describe_gauge!(
        PARKED_MESSAGES,
        "Messages parked until their old shard drains."
    );
    describe_counter!(
        PARKED_TOTAL,
        "Messages parked behind an older version of their order (a resharding, a gap, a hold, a message set aside); set-aside messages count in urutan_set_aside_total."
    );
    describe_gauge!(
        SHARDS_ACTIVE,
        "Shards placed on this replica with a registered consumer."
    );
    describe_counter!(
        SHARD_MOVES_TOTAL,
        "Shards placed on this replica, by reason (joined, left, lost, rebalanced)."
    );
    describe_counter!(
        DEAD_LETTERS_REFUSED_TOTAL,
        "Refused set-aside versions whose dead letter the full DLQ would not take: each waits, set aside, and only its order with it."
    );
    describe_gauge!(
        ORDERS_HELD,
        "Orders on hold, by reason (refused, gap, effect)."
    );
    describe_counter!(HOLDS_TOTAL, "Orders put on hold, by reason.");
    describe_gauge!(
        ORDERS_RETRYING,
        "Orders with a message set aside after a transient failure."
    );
    describe_gauge!(
        HOLD_OLDEST_SECONDS,
        Unit::Seconds,
        "Age of the oldest hold (0: none)."
    );
    describe_counter!(
        RELAY_WAKEUPS_TOTAL,
        "Times the idle relay was woken by its pipeline's NOTIFY (an enqueue committed) before its one-second poll."
    );
    describe_gauge!(
        ORDERS_OVERDUE,
        "Orders with a version waiting longer than it should, by kind (set_aside: due more than 30 s ago; gap: missing longer than GAP_TIMEOUT + 30 s and not held; parked: releasable for more than 30 s)."
    );
    describe_counter!(
        SET_ASIDE_TOTAL,
        "Messages set aside after a transient failure of their own transaction, by shard and reason (later tries count in urutan_retries_total only)."
    );
    describe_histogram!(
        HANDOFF_DURATION_SECONDS,
        Unit::Seconds,
        "How long a parked message waited."
    );
    describe_counter!(EPOCHS_TOTAL, "Epoch markers put into every shard.");
    describe_gauge!(SHARDS, "Shards bound to the hash exchange.");
    describe_gauge!(RESHARDING, "1 while a resharding is in progress.");
    describe_histogram!(
        RESHARDING_DURATION_SECONDS,
        Unit::Seconds,
        "Recorded ring change to resharding complete."
    );
    describe_histogram!(
        OUTBOX_PUBLISH_DURATION_SECONDS,
        Unit::Seconds,
        "Publishing one wave of outbox rows until the broker confirmed it."
    );
}
