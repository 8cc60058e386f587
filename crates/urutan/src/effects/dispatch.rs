//! The dispatcher loop of `urutan effects`: claims what may go, sends each
//! claimed effect in a task of its own (at most EFFECTS_CONCURRENCY, each of
//! a different order), records the result, and keeps the gauges fresh.
//!
//! Invariants: a claim is made only for free slots, so a claimed effect is
//! sent at once (well inside its lease); an attempt ends (answer or timeout)
//! before its lease can expire; on shutdown no new claim is made and the
//! attempts in flight finish and are recorded.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sqlx::PgPool;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use super::metric as m;
use super::routes::endpoint_label;
use super::send::{self, Answer, Verdict};
use super::store::{self, Claimed, Recorded, Settled};
use super::{Config, EffectsSettings};
use crate::trace::{self, TraceParent, Traces};
use opentelemetry::trace::SpanKind;

/// A fault-injection callback run after an answer came back and before it
/// is recorded (a crash there must only cause a resend with the same key).
pub type AfterSend = Arc<dyn Fn() + Send + Sync>;

/// Fault injection for `urutan effects` (crash drills): with
/// `URUTAN_FAULT_ABORT_AFTER_EFFECT_SENT=<n>`, the process aborts once the
/// n-th answer came back, before it is recorded. Unset: no hook.
pub fn after_send_from_env() -> Result<Option<AfterSend>, crate::shard::HookError> {
    let Some(n) = crate::shard::env_number("URUTAN_FAULT_ABORT_AFTER_EFFECT_SENT")? else {
        return Ok(None);
    };
    let answers = std::sync::atomic::AtomicU64::new(0);
    Ok(Some(Arc::new(move || {
        if answers.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1 >= n {
            std::process::abort();
        }
    })))
}

/// How often the backlog gauges are refreshed and the routes compared.
const GAUGES_EVERY: Duration = Duration::from_secs(2);
/// How often sent effects past their retention are purged.
const PURGE_EVERY: Duration = Duration::from_secs(300);
/// Pause after the database failed a claim.
const DATABASE_PAUSE: Duration = Duration::from_secs(1);

/// The dispatcher; build it with [`Dispatcher::new`], then [`Dispatcher::run`].
pub struct Dispatcher {
    pool: PgPool,
    client: reqwest::Client,
    /// The routes, the secrets that sign for each endpoint, the proxy.
    config: Config,
    settings: EffectsSettings,
    /// Who holds a lease (`host:pid:random`), for operators reading the table.
    owner: String,
    after_send: Option<AfterSend>,
    /// True while the database answered the last claim (`/readyz`).
    pub ready: Arc<AtomicBool>,
    /// Where webhook spans go (off: contexts only).
    traces: Traces,
}

/// When the periodic chores last ran.
#[derive(Default)]
struct Chores {
    gauges: Option<Instant>,
    purge: Option<Instant>,
}

/// Why a dispatcher cannot start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot build the HTTP client: {0}")]
    Client(#[from] reqwest::Error),
    #[error("cannot write the effect routes: {0}")]
    Routes(#[from] sqlx::Error),
}

/// Everything one delivery task needs, shared.
struct Shared {
    pool: PgPool,
    client: reqwest::Client,
    /// Only its secrets are used here (`Config::secret_for`).
    signing: Config,
    settings: EffectsSettings,
    after_send: Option<AfterSend>,
    /// Woken when a slot frees (the order's next effect may now go).
    wake: Notify,
    traces: Traces,
}

impl Dispatcher {
    /// Builds the HTTP client and writes `config`'s routes into the
    /// database (the routes of the dispatcher started last are in force).
    pub async fn new(
        pool: PgPool,
        config: Config,
        settings: EffectsSettings,
        after_send: Option<AfterSend>,
    ) -> Result<Self, StartError> {
        let client = send::client(settings.effects_timeout, config.proxy.as_ref())?;
        match store::sync_routes(&pool, &config.routes).await? {
            store::Sync::Unchanged => info!(routes = %config.routes, "effect routes unchanged"),
            store::Sync::Replaced { before } if config.routes.is_empty() => warn!(
                before = ?before,
                "EFFECTS is unset: new versions record no effects from now on; pending ones are still delivered"
            ),
            store::Sync::Replaced { before } => {
                info!(routes = %config.routes, before = ?before, "effect routes now in force")
            }
        }
        let endpoints: Vec<String> = config
            .routes
            .0
            .iter()
            .map(|r| endpoint_label(&r.url))
            .collect();
        m::register(&endpoints);
        let owner = format!(
            "{}:{}:{:04x}",
            std::env::var("HOSTNAME").unwrap_or_else(|_| "localhost".into()),
            std::process::id(),
            rand::random::<u16>()
        );
        Ok(Self {
            pool,
            client,
            config,
            settings,
            owner,
            after_send,
            ready: Arc::new(AtomicBool::new(true)),
            traces: Traces::off(),
        })
    }

    /// Exports a span per webhook request to `traces` ([`crate::trace`]);
    /// without it the requests still carry their `traceparent`.
    pub fn with_traces(mut self, traces: Traces) -> Self {
        self.traces = traces;
        self
    }

    /// Dispatches until `shutdown`, then lets the attempts in flight finish.
    pub async fn run(self, shutdown: CancellationToken) {
        let concurrency = usize::try_from(self.settings.effects_concurrency).unwrap_or(1);
        let slots = Arc::new(Semaphore::new(concurrency));
        let shared = Arc::new(Shared {
            pool: self.pool.clone(),
            client: self.client.clone(),
            signing: self.config.clone(),
            settings: self.settings.clone(),
            after_send: self.after_send.clone(),
            wake: Notify::new(),
            traces: self.traces.clone(),
        });
        let tracker = TaskTracker::new();
        let mut chores = Chores::default();
        info!(owner = %self.owner, concurrency, "dispatching effects");
        while !shutdown.is_cancelled() {
            self.housekeeping(&mut chores).await;
            if let Err(e) = self.claim_and_send(&slots, &shared, &tracker).await {
                self.ready.store(false, Ordering::Relaxed);
                warn!(error = %e, "cannot claim effects; retrying");
                tokio::select! {
                    () = shutdown.cancelled() => {}
                    () = tokio::time::sleep(DATABASE_PAUSE) => {}
                }
                continue;
            }
            self.ready.store(true, Ordering::Relaxed);
            metrics::gauge!(m::IN_FLIGHT).set((concurrency - slots.available_permits()) as f64);
            // A finished attempt may free its order's next effect: look again.
            tokio::select! {
                () = shutdown.cancelled() => {}
                () = shared.wake.notified() => {}
                () = tokio::time::sleep(self.settings.effects_poll) => {}
            }
        }
        tracker.close();
        info!(
            in_flight = concurrency - slots.available_permits(),
            "stopping: finishing the attempts in flight"
        );
        tracker.wait().await;
        metrics::gauge!(m::IN_FLIGHT).set(0.0);
    }

    /// Claims as many effects as there are free slots and starts sending
    /// each at once (so well inside its lease).
    async fn claim_and_send(
        &self,
        slots: &Arc<Semaphore>,
        shared: &Arc<Shared>,
        tracker: &TaskTracker,
    ) -> Result<(), sqlx::Error> {
        let free = slots.available_permits();
        if free == 0 {
            return Ok(());
        }
        let limit = i64::try_from(free).unwrap_or(i64::MAX);
        let claimed = store::claim(&self.pool, limit, self.settings.lease(), &self.owner).await?;
        for effect in claimed {
            // Only this loop takes slots, and it asked for at most `free`.
            let Ok(permit) = slots.clone().try_acquire_owned() else {
                break;
            };
            tracker.spawn(deliver(shared.clone(), effect, permit));
        }
        Ok(())
    }

    /// The gauges every [`GAUGES_EVERY`], the purge every [`PURGE_EVERY`].
    async fn housekeeping(&self, chores: &mut Chores) {
        if chores.gauges.is_none_or(|t| t.elapsed() > GAUGES_EVERY) {
            self.refresh_gauges().await;
            chores.gauges = Some(Instant::now());
        }
        if chores.purge.is_none_or(|t| t.elapsed() > PURGE_EVERY) {
            match store::purge_sent(&self.pool, self.settings.effects_retention).await {
                Ok(0) => {}
                Ok(n) => info!(purged = n, "sent effects past their retention purged"),
                Err(e) => warn!(error = %e, "cannot purge sent effects"),
            }
            chores.purge = Some(Instant::now());
        }
    }

    /// Backlog, oldest pending and dead-lettered per endpoint; whether the
    /// routes in force are still this dispatcher's.
    async fn refresh_gauges(&self) {
        match store::backlog(&self.pool).await {
            Ok(rows) => {
                // Several URLs may share a label (host and first segment): sum them.
                let mut by_label: BTreeMap<String, (i64, f64, i64)> = BTreeMap::new();
                for (url, pending, oldest, dead) in rows {
                    let label =
                        url::Url::parse(&url).map_or_else(|_| "?".into(), |u| endpoint_label(&u));
                    let entry = by_label.entry(label).or_default();
                    entry.0 += pending;
                    entry.1 = entry.1.max(oldest);
                    entry.2 += dead;
                }
                for (label, (pending, oldest, dead)) in by_label {
                    metrics::gauge!(m::BACKLOG, "endpoint" => label.clone()).set(pending as f64);
                    metrics::gauge!(m::OLDEST_PENDING_SECONDS, "endpoint" => label.clone())
                        .set(oldest);
                    metrics::gauge!(m::DEAD_LETTERED, "endpoint" => label).set(dead as f64);
                }
            }
            Err(e) => warn!(error = %e, "cannot read the effect backlog"),
        }
        if let Ok(mut current) = store::current_routes(&self.pool).await {
            current.sort(); // byte order, as `mine` (SQL sorts by collation)
            let mut mine: Vec<(String, String)> = self
                .config
                .routes
                .0
                .iter()
                .map(|r| (r.status.as_sql().to_owned(), r.url.as_str().to_owned()))
                .collect();
            mine.sort();
            mine.dedup();
            let same = mine == current;
            metrics::gauge!(m::ROUTES_CURRENT).set(if same { 1.0 } else { 0.0 });
            if !same {
                debug!("the effect routes in force were written by another dispatcher");
            }
        }
    }
}

/// Sends one claimed effect and records what its answer calls for.
async fn deliver(shared: Arc<Shared>, effect: Claimed, permit: OwnedSemaphorePermit) {
    let endpoint = url::Url::parse(&effect.url).map_or_else(|_| "?".into(), |u| endpoint_label(&u));
    let mut span = webhook_span(&shared.traces, &effect, &endpoint);
    let start = Instant::now();
    let answer = send::attempt(
        &shared.client,
        shared.signing.secret_for(&effect.url),
        &effect,
        span.traceparent(),
    )
    .await;
    answered(&mut span, &answer);
    metrics::histogram!(m::REQUEST_DURATION_SECONDS, "endpoint" => endpoint.clone())
        .record(start.elapsed().as_secs_f64());
    if let Some(hook) = &shared.after_send {
        hook();
    }
    let recorded = decide(&shared.settings, &effect, &answer, &endpoint);
    record(&shared, &effect, &recorded).await;
    drop(permit);
    shared.wake.notify_one();
}

/// The span of one webhook request: a child of its version's apply span
/// (a new trace if the effect has none, or an invalid one).
fn webhook_span(traces: &Traces, effect: &Claimed, endpoint: &str) -> trace::Span {
    let parent = effect
        .traceparent
        .as_deref()
        .and_then(|t| TraceParent::parse(t.as_bytes()));
    let mut span = traces.start("webhook", SpanKind::Client, parent);
    if span.is_recording() {
        span.set("http.request.method", "POST");
        // The endpoint as labelled in metrics: its URL may carry a token.
        span.set("urutan.endpoint", endpoint.to_owned());
        span.set("urutan.order_id", effect.pesanan_id.clone());
        span.set("urutan.versi", effect.versi);
        span.set("urutan.effect.attempt", i64::from(effect.percobaan));
    }
    span
}

/// Records `answer` on the webhook span.
fn answered(span: &mut trace::Span, answer: &Answer) {
    if let Answer::Http { code, .. } = answer {
        span.set("http.response.status_code", i64::from(*code));
    }
    match send::classify(answer) {
        Verdict::Sent => span.set("urutan.outcome", "sent"),
        Verdict::Retry(reason) | Verdict::Dead(reason) => {
            span.set("urutan.outcome", reason);
            span.fail(reason);
        }
    }
}

/// What to record for `answer`, counted and logged.
fn decide(
    settings: &EffectsSettings,
    effect: &Claimed,
    answer: &Answer,
    endpoint: &str,
) -> Recorded {
    let (code, retry_after, text) = match answer {
        Answer::Http {
            code,
            retry_after,
            body,
        } => (Some(*code), *retry_after, body.clone()),
        Answer::Timeout => (
            None,
            None,
            format!("no answer within {:?}", settings.effects_timeout),
        ),
        Answer::Connection(e) | Answer::Invalid(e) => (None, None, e.clone()),
    };
    let order = (&effect.pesanan_id, effect.versi, &effect.message_id);
    match send::classify(answer) {
        Verdict::Sent => {
            metrics::counter!(m::SENT_TOTAL, "endpoint" => endpoint.to_owned()).increment(1);
            debug!(order = ?order.0, versi = order.1, message_id = ?order.2, endpoint, "effect sent");
            Recorded::Sent {
                code: code.unwrap_or(200),
            }
        }
        Verdict::Retry(reason) if effect.percobaan < settings.effects_max_attempts => {
            let after = send::backoff(
                effect.percobaan,
                settings.effects_backoff_min,
                settings.effects_backoff_max,
                retry_after,
                rand::random::<f64>(),
            );
            metrics::counter!(m::RETRIES_TOTAL, "endpoint" => endpoint.to_owned(), "reason" => reason)
                .increment(1);
            info!(order = ?order.0, versi = order.1, message_id = ?order.2, endpoint, reason,
                  attempt = effect.percobaan, retry_in = ?after, "effect not delivered; will retry");
            Recorded::Retry {
                code,
                answer: text,
                after,
            }
        }
        verdict => {
            let reason = match verdict {
                Verdict::Dead(reason) => reason,
                _ => send::EXHAUSTED,
            };
            metrics::counter!(m::DEAD_LETTERS_TOTAL, "endpoint" => endpoint.to_owned(), "reason" => reason)
                .increment(1);
            warn!(order = ?order.0, versi = order.1, message_id = ?order.2, endpoint, reason,
                  code, attempt = effect.percobaan, "effect dead-lettered");
            Recorded::Dead { code, answer: text }
        }
    }
}

/// Records `recorded`, retrying while the database is away and the lease
/// holds; if it cannot, the effect is claimed again after its lease (and
/// sent again with the same key). A dead letter that holds its order
/// (`EFFECTS_ON_DEAD=hold`) counts a hold.
async fn record(shared: &Shared, effect: &Claimed, recorded: &Recorded) {
    let give_up = Instant::now() + shared.settings.effects_timeout;
    let mut pause = Duration::from_millis(100);
    let on_dead = shared.settings.effects_on_dead;
    loop {
        match store::record(
            &shared.pool,
            effect.efek,
            effect.percobaan,
            recorded,
            on_dead,
        )
        .await
        {
            Ok(Settled::Recorded) => return,
            Ok(Settled::Held) => {
                metrics::counter!(crate::metrics::HOLDS_TOTAL, "reason" => "effect").increment(1);
                warn!(order = ?effect.pesanan_id, versi = effect.versi, message_id = ?effect.message_id,
                      "the order's later effects wait behind its dead-lettered effect \
                       (`urutan dlq replay --effects`, or `urutan hold release --effects`)");
                return;
            }
            Ok(Settled::Lost) => {
                warn!(order = ?effect.pesanan_id, versi = effect.versi, message_id = ?effect.message_id,
                      "lost the claim of an effect before recording its result (lease expired)");
                return;
            }
            Err(e) if Instant::now() + pause < give_up => {
                debug!(error = %e, "cannot record an effect's result yet");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
            Err(e) => {
                warn!(error = %e, order = ?effect.pesanan_id, versi = effect.versi,
                      "cannot record an effect's result; it will be sent again with the same key");
                return;
            }
        }
    }
}
