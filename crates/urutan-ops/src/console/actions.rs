//! The console's actions: releasing held orders, replaying and purging
//! dead letters. Each is a POST whose `csrf` field must match the client's
//! CSRF cookie (its `Origin` and `Host` were checked before, by the
//! console's guard: `admit`), shows what it will do on a confirmation page
//! first, and leaves one audit row per order (or dead letter) acted on,
//! naming how the request got in.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Extension;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use sqlx::PgPool;
use urutan::effects::hold as effects_hold;
use urutan::store::dead_letter::{self, Record};
use urutan::store::hold;

use super::admit::Auth;
use super::{CSRF_COOKIE, Console, Csrf, LIST_AT_MOST, cookie, pages, same, who};
use crate::terminal::clean;

/// A form's fields, names repeated where a form selects many.
struct Fields(Vec<(String, String)>);

impl Fields {
    fn parse(body: &str) -> Self {
        Self(
            url::form_urlencoded::parse(body.as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }

    fn one(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn all(&self, name: &str) -> impl Iterator<Item = &str> {
        self.0
            .iter()
            .filter(move |(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Why a POST is refused as not coming from this console's own page (its
/// CSRF field is not the client's CSRF cookie), if it is.
fn forged(headers: &HeaderMap, fields: &Fields) -> Option<&'static str> {
    let expected = cookie(headers, CSRF_COOKIE).unwrap_or_default();
    let given = fields.one("csrf").unwrap_or_default();
    if expected.is_empty() || !same(given, expected) {
        return Some(
            "this form did not come from this console (its CSRF token is missing or wrong): \
             open the page again and resubmit",
        );
    }
    None
}

fn refused(status: StatusCode, why: &str) -> Response {
    (status, Html(pages::problem(why).into_string())).into_response()
}

/// `POST /holds/release`: `order` (one or many), `csrf`, and `confirm=yes`
/// once confirmed. Without `confirm`, the confirmation page: each order's
/// hold and what releasing it does. With it, each order is released
/// (its held version, or its held effect, recorded as skipped; what waits
/// behind goes on in order) and audited.
pub(super) async fn release_holds(
    State(console): State<Console>,
    ConnectInfo(client): ConnectInfo<SocketAddr>,
    Extension(auth): Extension<Auth>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let fields = Fields::parse(&body);
    if let Some(why) = forged(&headers, &fields) {
        return refused(StatusCode::FORBIDDEN, why);
    }
    let mut orders: Vec<String> = fields
        .all("order")
        .map(str::trim)
        .filter(|o| !o.is_empty())
        .map(str::to_owned)
        .collect();
    orders.sort();
    orders.dedup();
    if orders.is_empty() {
        return refused(StatusCode::BAD_REQUEST, "select at least one held order");
    }
    if orders.len() > LIST_AT_MOST as usize {
        return refused(
            StatusCode::BAD_REQUEST,
            &format!("at most {LIST_AT_MOST} orders at a time"),
        );
    }
    let csrf = Csrf(fields.one("csrf").unwrap_or_default().to_owned());
    if fields.one("confirm") != Some("yes") {
        let mut holds = Vec::new();
        for order in &orders {
            match hold::holds(&console.db, Some(order), 4).await {
                Ok(h) => holds.extend(h),
                Err(e) => return super::unavailable("the holds", e),
            }
        }
        return Html(pages::confirm_release(&orders, &holds, &csrf).into_string()).into_response();
    }
    let who = who(auth.describe(), client, &headers);
    let mut results = Vec::with_capacity(orders.len());
    for order in &orders {
        let (target, result) = release_one(&console.db, order).await;
        if let Err(e) = crate::audit::record(
            &console.db,
            &who,
            "hold_release",
            Some(order),
            &target,
            &result,
        )
        .await
        {
            tracing::error!(error = %e, order = %clean(order), "console: cannot write the audit row of a release");
        }
        tracing::info!(order = %clean(order), by = %who, result = %result, "console: hold release");
        results.push((order.clone(), target, result));
    }
    Html(pages::released(&results).into_string()).into_response()
}

/// Releases `order`'s holds (a version hold and an effect hold each):
/// (what was acted on, the result), for the audit.
async fn release_one(db: &PgPool, order: &str) -> (String, String) {
    let holds = match hold::holds(db, Some(order), 4).await {
        Ok(h) => h,
        Err(e) => {
            return (
                "its hold".into(),
                format!("failed: cannot read the hold: {e}"),
            );
        }
    };
    if holds.is_empty() {
        return ("its hold".into(), "not held: nothing done".into());
    }
    let mut targets = Vec::new();
    let mut results = Vec::new();
    for h in &holds {
        let version = h.versi.map_or_else(String::new, |v| format!(" v{v}"));
        if let Some(effect) = h.effect {
            targets.push(format!("effect hold: effect {effect} of{version}"));
            results.push(match effects_hold::release(db, order).await {
                Ok(skipped) if skipped.is_empty() => {
                    "effect hold not released (its effect is being sent again)".to_owned()
                }
                Ok(skipped) => format!(
                    "effect hold released: {} effect(s) skipped, {} go on",
                    skipped.len(),
                    skipped.last().map_or(0, |s| s.waiting)
                ),
                Err(e) => format!("failed: {e}"),
            });
        } else {
            targets.push(format!("{} hold{version}", h.reason));
            results.push(match hold::release_hold(db, order).await {
                Ok(Some(r)) => format!(
                    "released: {}{} recorded as skipped; {} version(s) go on in order",
                    r.versi
                        .map_or_else(|| "the hold".to_owned(), |v| format!("v{v}")),
                    r.message_id
                        .map_or_else(String::new, |m| format!(" (message {})", clean(&m))),
                    r.waiting
                ),
                Ok(None) => "not held any more: nothing done".to_owned(),
                Err(e) => format!("failed: {e}"),
            });
        }
    }
    (targets.join("; "), results.join("; "))
}

/// How long a replay waits for the pool to process what it published
/// before the result page shows what each message became (`dlq replay
/// --wait`).
const REPLAY_WAIT: Duration = Duration::from_secs(15);

/// An action on dead letters, chosen by record id (`id` fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DeadLetterAction {
    /// `dlq replay` of the chosen messages.
    Replay,
    /// `dlq purge` of the chosen messages only.
    Purge,
}

impl DeadLetterAction {
    /// Where its form posts.
    pub(super) fn path(self) -> &'static str {
        match self {
            Self::Replay => "/dead-letters/replay",
            Self::Purge => "/dead-letters/purge",
        }
    }

    /// Its name in the audit.
    fn audited_as(self) -> &'static str {
        match self {
            Self::Replay => "dlq_replay",
            Self::Purge => "dlq_purge",
        }
    }

    /// The verb on its buttons and titles.
    pub(super) fn verb(self) -> &'static str {
        match self {
            Self::Replay => "Replay",
            Self::Purge => "Purge",
        }
    }
}

/// A dead-letter record chosen in a form, as it is when the form arrives.
pub(super) struct Chosen {
    pub id: i64,
    /// `None`: no record has this id.
    pub record: Option<Record>,
}

impl Chosen {
    /// Its delivery key and order while its message is in the DLQ
    /// (unresolved): two orders' messages may share a key.
    fn in_queue(&self) -> Option<(&str, Option<&str>)> {
        self.record
            .as_ref()
            .filter(|r| r.resolved().is_none())
            .map(|r| (r.delivery_key.as_str(), r.pesanan_id.as_deref()))
    }

    /// What the audit says was acted on.
    fn target(&self) -> String {
        let Some(r) = &self.record else {
            return format!("dead letter {}", self.id);
        };
        let message = r.message_id.as_deref().unwrap_or(&r.delivery_key);
        let version = r.versi.map_or_else(String::new, |v| format!(", v{v}"));
        format!(
            "dead letter {}: message {} ({}{version})",
            self.id,
            clean(message),
            r.reason
        )
    }

    /// Why nothing is done to it, when it is not in the DLQ.
    fn not_in_queue(&self) -> Option<String> {
        match &self.record {
            None => Some("no such dead-letter record".to_owned()),
            Some(r) => r
                .resolved()
                .map(|(at, how)| format!("already {how} at {}", urutan::rfc3339::text(&at))),
        }
    }
}

/// One chosen record's outcome, for the result page and the audit.
pub(super) struct Outcome {
    pub id: i64,
    pub order: Option<String>,
    pub target: String,
    pub result: String,
}

/// `POST /dead-letters/replay`: `id` (record ids, one or many), `csrf`,
/// and `confirm=yes` once confirmed. Without `confirm`, the confirmation
/// page with what `dlq replay --dry-run` predicts for each; with it, each
/// is replayed (`dlq replay`), its outcome shown and audited.
pub(super) async fn replay_dead_letters(
    State(console): State<Console>,
    ConnectInfo(client): ConnectInfo<SocketAddr>,
    Extension(auth): Extension<Auth>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let by = who(auth.describe(), client, &headers);
    dead_letter_action(DeadLetterAction::Replay, &console, &by, &headers, &body).await
}

/// `POST /dead-letters/purge`: as [`replay_dead_letters`], but the chosen
/// messages are purged (`dlq purge`, of those only): taken from the DLQ
/// and dropped, their records marked purged.
pub(super) async fn purge_dead_letters(
    State(console): State<Console>,
    ConnectInfo(client): ConnectInfo<SocketAddr>,
    Extension(auth): Extension<Auth>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let by = who(auth.describe(), client, &headers);
    dead_letter_action(DeadLetterAction::Purge, &console, &by, &headers, &body).await
}

async fn dead_letter_action(
    action: DeadLetterAction,
    console: &Console,
    who: &str,
    headers: &HeaderMap,
    body: &str,
) -> Response {
    let fields = Fields::parse(body);
    if let Some(why) = forged(headers, &fields) {
        return refused(StatusCode::FORBIDDEN, why);
    }
    let mut ids = Vec::new();
    for id in fields.all("id").map(str::trim).filter(|i| !i.is_empty()) {
        match id.parse::<i64>() {
            Ok(id) => ids.push(id),
            Err(_) => {
                return refused(
                    StatusCode::BAD_REQUEST,
                    &format!("`{id}` is not a dead-letter record id (ids are numbers)"),
                );
            }
        }
    }
    ids.sort_unstable();
    ids.dedup();
    if ids.is_empty() {
        return refused(StatusCode::BAD_REQUEST, "select at least one dead letter");
    }
    if ids.len() > LIST_AT_MOST as usize {
        return refused(
            StatusCode::BAD_REQUEST,
            &format!("at most {LIST_AT_MOST} dead letters at a time"),
        );
    }
    let mut chosen = Vec::with_capacity(ids.len());
    for id in ids {
        match dead_letter::shown_by_id(&console.db, id).await {
            Ok(shown) => chosen.push(Chosen {
                id,
                record: shown.map(|s| s.record),
            }),
            Err(e) => return super::unavailable("the dead letters", e),
        }
    }
    let ctx = crate::dlq::Ctx::new(console.settings.clone(), console.db.clone());
    let keys: Vec<crate::dlq::Wanted> = chosen
        .iter()
        .filter_map(Chosen::in_queue)
        .map(|(key, order)| (key.to_owned(), order.map(str::to_owned)))
        .collect();
    if fields.one("confirm") != Some("yes") {
        let predicted = match crate::dlq::predictions(&ctx, false, None, &keys).await {
            Ok(p) => p,
            Err(e) => return super::unavailable("the dead letters", e),
        };
        let predictions: Vec<(i64, String)> = chosen
            .iter()
            .map(|c| {
                let said = match (c.not_in_queue(), c.in_queue()) {
                    (Some(why), _) => format!("{why}: nothing will be done"),
                    (None, Some((key, order))) => predicted
                        .iter()
                        .find(|p| {
                            p.record.delivery_key == key && p.record.pesanan_id.as_deref() == order
                        })
                        .map_or_else(
                            || "no prediction: its record changed meanwhile".to_owned(),
                            |p| p.prediction.clone(),
                        ),
                    (None, None) => String::new(),
                };
                (c.id, said)
            })
            .collect();
        let csrf = Csrf(fields.one("csrf").unwrap_or_default().to_owned());
        return Html(
            pages::confirm_dead_letters(action, &chosen, &predictions, &csrf).into_string(),
        )
        .into_response();
    }
    let results = act(action, &ctx, &chosen, &keys).await;
    let mut outcomes = Vec::with_capacity(chosen.len());
    for (c, result) in chosen.iter().zip(results) {
        let order = c.record.as_ref().and_then(|r| r.pesanan_id.clone());
        let target = c.target();
        if let Err(e) = crate::audit::record(
            &console.db,
            who,
            action.audited_as(),
            order.as_deref(),
            &target,
            &result,
        )
        .await
        {
            tracing::error!(error = %e, record = c.id, "console: cannot write the audit row of a dead-letter action");
        }
        tracing::info!(record = c.id, by = %who, action = action.audited_as(), result = %clean(&result), "console: dead-letter action");
        outcomes.push(Outcome {
            id: c.id,
            order,
            target,
            result,
        });
    }
    Html(pages::dead_letters_done(action, &outcomes).into_string()).into_response()
}

/// Replays or purges the messages of `keys` (the chosen records in the
/// DLQ) through the `dlq` commands' own code; the result of each of
/// `chosen`, in its order.
async fn act(
    action: DeadLetterAction,
    ctx: &crate::dlq::Ctx,
    chosen: &[Chosen],
    keys: &[crate::dlq::Wanted],
) -> Vec<String> {
    let selection = crate::dlq::Selection::messages(keys.to_vec());
    type Done = Vec<(crate::dlq::Wanted, String)>;
    let done: Result<Done, anyhow::Error> = if keys.is_empty() {
        Ok(Vec::new())
    } else {
        match action {
            DeadLetterAction::Replay => crate::dlq::replay_messages(ctx, selection, REPLAY_WAIT)
                .await
                .map(|all| {
                    all.into_iter()
                        .map(|r| ((r.key, r.pesanan_id), r.became.describe()))
                        .collect()
                }),
            DeadLetterAction::Purge => {
                crate::dlq::purge_messages(ctx, selection).await.map(|all| {
                    all.into_iter()
                        .map(|p| ((p.key, p.order), p.gone.describe()))
                        .collect()
                })
            }
        }
    };
    chosen
        .iter()
        .map(|c| {
            if let Some(why) = c.not_in_queue() {
                return format!("nothing done: {why}");
            }
            let (key, order) = c.in_queue().unwrap_or_default();
            match &done {
                Ok(done) => done
                    .iter()
                    .find(|((k, o), _)| k == key && o.as_deref() == order)
                    .map_or_else(
                        || "nothing done: not met in the DLQ".to_owned(),
                        |(_, result)| result.clone(),
                    ),
                Err(e) => format!(
                    "failed: {e:#} (its page shows whether its message is still in the DLQ)"
                ),
            }
        })
        .collect()
}
