//! `urutan console` (docs/contract.md section 12): the operator console in
//! the browser, served by its own process from the same binary. Its pages
//! read what the CLI reads, through the same read API (`status::gather`,
//! `explain::gather`, the store's hold and dead-letter reads), so the two
//! never disagree.
//!
//! Safe by default: without `CONSOLE_TOKEN` it listens on loopback only;
//! with it, every page needs the token (`Authorization: Bearer <token>`, or
//! the login form's session cookie). Every response carries a strict
//! Content-Security-Policy (no script at all, no framing) and no-store.
//! Actions (releasing held orders; replaying and purging dead letters, one
//! or many, through the `urutan dlq` commands' own code) are POSTs that carry a
//! CSRF token (a double-submit cookie, SameSite=Strict), are confirmed on a
//! page of their own before anything changes, and leave an audit row each
//! (`urutan_audit`: who, when, what, result), which the console and
//! `urutan explain` show.

mod actions;
mod pages;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::Router;
use axum::extract::{Form, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::get;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use urutan::config::Settings;
use urutan::heal::WrongSetting;

/// `urutan console` options (contract section 5).
#[derive(Debug, Clone, clap::Args)]
pub struct ConsoleOptions {
    /// Address of the console; anything but loopback requires CONSOLE_TOKEN.
    #[arg(long, env = "CONSOLE_LISTEN", default_value = "127.0.0.1:8088", value_parser = urutan::config::parse_address)]
    pub console_listen: SocketAddr,
    /// When set, every console page and action requires it
    /// (`Authorization: Bearer <token>`, or the login form).
    #[arg(long, env = "CONSOLE_TOKEN", hide_env_values = true)]
    pub console_token: Option<String>,
}

/// The name of the session cookie the login form sets.
const COOKIE: &str = "urutan_console";

/// The name of the CSRF cookie (double submit: every form carries the
/// same value in its `csrf` field).
const CSRF_COOKIE: &str = "urutan_csrf";

/// This client's CSRF token, for the forms of the page being rendered.
#[derive(Debug, Clone)]
pub(crate) struct Csrf(pub String);

/// The value of cookie `name` in `headers`, if any.
fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| c.trim().strip_prefix(name)?.strip_prefix('='))
}

/// Rows a list page shows at most.
pub(crate) const LIST_AT_MOST: u32 = 200;

/// What every request handler shares.
#[derive(Clone)]
struct Console {
    settings: Settings,
    db: PgPool,
    /// The broker connection the pages read through, kept open between
    /// them (opening one per page was most of a page's time).
    broker: Arc<tokio::sync::Mutex<Option<Arc<lapin::Connection>>>>,
    /// `CONSOLE_TOKEN`, if set.
    token: Option<String>,
}

impl Console {
    /// The open connections a page reads through: the console's pool, and
    /// its broker connection, opened on first use and again once lost. When
    /// the broker cannot be reached, the read opens its own and reports why.
    async fn open(&self) -> (PgPool, Option<Arc<lapin::Connection>>) {
        let mut cached = self.broker.lock().await;
        if !cached.as_ref().is_some_and(|c| c.status().connected()) {
            *cached = crate::open_broker(&self.settings, "urutan console")
                .await
                .ok()
                .map(Arc::new);
        }
        (self.db.clone(), cached.clone())
    }

    /// The session cookie's value for the token: a digest, so the cookie
    /// is not the token itself, and every session ends when the token
    /// changes.
    fn session(token: &str) -> String {
        let digest = Sha256::digest(format!("urutan-console-session:{token}").as_bytes());
        digest.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Whether `headers` carry the token or the session cookie.
    fn admits(&self, headers: &HeaderMap) -> bool {
        let Some(token) = &self.token else {
            return true;
        };
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if bearer.is_some_and(|given| same(given.trim(), token)) {
            return true;
        }
        cookie(headers, COOKIE).is_some_and(|given| same(given, &Self::session(token)))
    }

    /// Who acts, for the audit: the client's address and how it got in.
    fn who(&self, client: SocketAddr, headers: &HeaderMap) -> String {
        let how = if self.token.is_none() {
            "no token set"
        } else if headers.contains_key(header::AUTHORIZATION) {
            "bearer token"
        } else {
            "session cookie"
        };
        let forwarded = forwarded_for(headers);
        if forwarded.is_empty() {
            format!("console client {} ({how})", client.ip())
        } else {
            format!(
                "console client {} ({how}), forwarded for {forwarded}",
                client.ip()
            )
        }
    }
}

/// Behind a proxy the peer is the proxy: whom it says it forwarded for
/// (`X-Forwarded-For`, else `Forwarded`), kept as its claim for the audit:
/// printable ASCII, at most 100 bytes.
fn forwarded_for(headers: &HeaderMap) -> String {
    let said = headers
        .get("x-forwarded-for")
        .or_else(|| headers.get(header::FORWARDED))
        .map(|v| v.as_bytes())
        .unwrap_or_default();
    let kept: String = said
        .iter()
        .take(100)
        .filter(|b| b.is_ascii_graphic() || **b == b' ')
        .map(|b| char::from(*b))
        .collect();
    kept.trim().to_owned()
}

/// Equality in time independent of where the strings differ.
fn same(given: &str, expected: &str) -> bool {
    given.len() == expected.len()
        && given
            .bytes()
            .zip(expected.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// Serves the console until `shutdown`. A non-loopback address without a
/// token is a wrong setting (exit code 2, one line).
pub async fn run(
    settings: Settings,
    options: ConsoleOptions,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let token = options.console_token.filter(|t| !t.is_empty());
    let listen = options.console_listen;
    if token.is_none() && !listen.ip().is_loopback() {
        return Err(WrongSetting(format!(
            "CONSOLE_LISTEN={listen} is not a loopback address and CONSOLE_TOKEN is unset: \
             set CONSOLE_TOKEN (every page then needs it) or listen on 127.0.0.1"
        ))
        .into());
    }
    let db = crate::open_database(&settings, "urutan console")
        .await
        .map_err(anyhow::Error::msg)?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| WrongSetting(format!("CONSOLE_LISTEN={listen}: cannot listen: {e}")))?;
    let bound = listener.local_addr()?;
    tracing::info!(
        address = %bound,
        token = token.is_some(),
        "console listening (http://{bound}/)"
    );
    let console = Console {
        settings,
        db: db.clone(),
        broker: Arc::default(),
        token,
    };
    let broker = console.broker.clone();
    axum::serve(
        listener,
        router(console).into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async move { shutdown.cancelled().await })
    .await?;
    db.close().await;
    if let Some(conn) = broker.lock().await.take() {
        let closing = conn.close(200, "console stopped".into());
        let _ = urutan::broker::call("connection.close", closing).await;
    }
    Ok(())
}

fn router(console: Console) -> Router {
    Router::new()
        .route("/", get(overview))
        .route("/orders", get(find_order))
        .route("/orders/{id}", get(order))
        .route("/dead-letters", get(dead_letters))
        .route("/dead-letters/{id}", get(dead_letter))
        .route("/holds", get(holds))
        .route("/effects", get(effects))
        .route("/console.css", get(stylesheet))
        .route("/favicon.svg", get(favicon))
        .route("/login", get(login_form).post(login))
        .route(
            "/holds/release",
            axum::routing::post(actions::release_holds),
        )
        .route(
            actions::DeadLetterAction::Replay.path(),
            axum::routing::post(actions::replay_dead_letters),
        )
        .route(
            actions::DeadLetterAction::Purge.path(),
            axum::routing::post(actions::purge_dead_letters),
        )
        .route("/audit", get(audit))
        .layer(middleware::from_fn(csrf_cookie))
        .layer(middleware::from_fn_with_state(console.clone(), guard))
        .layer(middleware::from_fn(security_headers))
        .with_state(console)
}

/// Every page but the login form and the stylesheet needs the token (when
/// one is set): a 401 with the login form otherwise. Without a token, a
/// request that came through a proxy is refused: listening on loopback
/// protects nothing once a proxy forwards the world to it.
async fn guard(State(console): State<Console>, request: Request, next: Next) -> Response {
    if console.token.is_none() && proxied(request.headers()) {
        tracing::warn!("console: refused a request forwarded by a proxy: CONSOLE_TOKEN is unset");
        return (
            StatusCode::FORBIDDEN,
            Html(
                pages::problem(
                    "This request came through a proxy (it carries Forwarded or X-Forwarded-For) \
                     and this console has no CONSOLE_TOKEN: behind a proxy, anyone who reaches \
                     the proxy would reach the console. Set CONSOLE_TOKEN (every page then \
                     needs it; a proxy that authenticates users itself can send it as \
                     `Authorization: Bearer <token>`).",
                )
                .into_string(),
            ),
        )
            .into_response();
    }
    let open = matches!(
        request.uri().path(),
        "/login" | "/console.css" | "/favicon.svg"
    );
    if open || console.admits(request.headers()) {
        return next.run(request).await;
    }
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        Html(pages::login(false).into_string()),
    )
        .into_response()
}

/// Whether a proxy forwarded this request (RFC 7239 `Forwarded`, or the
/// de-facto `X-Forwarded-For`).
fn proxied(headers: &HeaderMap) -> bool {
    headers.contains_key(header::FORWARDED) || headers.contains_key("x-forwarded-for")
}

/// `; Secure` for a cookie set on a page served over HTTPS by a proxy that
/// terminates TLS (`X-Forwarded-Proto: https`), so that the browser never
/// sends it over plain HTTP; nothing on plain loopback HTTP.
fn secure(headers: &HeaderMap) -> &'static str {
    let https = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("https"));
    if https { "; Secure" } else { "" }
}

/// Gives every client a CSRF token (a random cookie, set on its first
/// page), handed to the page's forms through a request extension.
async fn csrf_cookie(mut request: Request, next: Next) -> Response {
    let (token, new) = match cookie(request.headers(), CSRF_COOKIE) {
        Some(t) if t.len() == 64 && t.bytes().all(|b| b.is_ascii_hexdigit()) => {
            (t.to_owned(), false)
        }
        _ => {
            let bytes: [u8; 32] = rand::random();
            (
                bytes.iter().map(|b| format!("{b:02x}")).collect::<String>(),
                true,
            )
        }
    };
    request.extensions_mut().insert(Csrf(token.clone()));
    let secure = secure(request.headers());
    let mut response = next.run(request).await;
    if new
        && let Ok(value) = HeaderValue::from_str(&format!(
            "{CSRF_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict{secure}"
        ))
    {
        response.headers_mut().append(header::SET_COOKIE, value);
    }
    response
}

/// Headers on every response: no script, no framing, nothing cached
/// (message bodies can hold personal data).
async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    let set = |headers: &mut HeaderMap, name, value: &'static str| {
        headers.insert(name, HeaderValue::from_static(value));
    };
    set(
        headers,
        header::CONTENT_SECURITY_POLICY,
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; \
         frame-ancestors 'none'; base-uri 'none'",
    );
    set(headers, header::X_FRAME_OPTIONS, "DENY");
    set(headers, header::X_CONTENT_TYPE_OPTIONS, "nosniff");
    // Not `no-referrer`: under it a browser sends `Origin: null` with
    // every form, and the actions' Origin check would refuse the console's
    // own forms. `same-origin` still tells no other site anything.
    set(headers, header::REFERRER_POLICY, "same-origin");
    set(headers, header::CACHE_CONTROL, "no-store");
    response
}

async fn stylesheet() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("console.css"),
    )
        .into_response()
}

async fn favicon() -> Response {
    (
        [(header::CONTENT_TYPE, "image/svg+xml")],
        include_str!("favicon.svg"),
    )
        .into_response()
}

async fn login_form() -> Html<String> {
    Html(pages::login(false).into_string())
}

#[derive(Deserialize)]
struct Login {
    token: String,
}

/// The login form's answer: the session cookie (HttpOnly, SameSite=Strict)
/// and back to the overview, or the form again.
async fn login(
    State(console): State<Console>,
    headers: HeaderMap,
    Form(form): Form<Login>,
) -> Response {
    let Some(token) = &console.token else {
        return Redirect::to("/").into_response();
    };
    if !same(form.token.trim(), token) {
        return (
            StatusCode::UNAUTHORIZED,
            Html(pages::login(true).into_string()),
        )
            .into_response();
    }
    let cookie = format!(
        "{COOKIE}={}; Path=/; HttpOnly; SameSite=Strict; Max-Age=43200{}",
        Console::session(token),
        secure(&headers)
    );
    ([(header::SET_COOKIE, cookie)], Redirect::to("/")).into_response()
}

/// A page that could not be read: the reason, on a page of its own.
fn unavailable(what: &str, e: impl std::fmt::Display) -> Response {
    tracing::warn!(error = %e, "console: cannot read {what}");
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Html(pages::problem(&format!("cannot read {what}: {e}")).into_string()),
    )
        .into_response()
}

async fn overview(State(console): State<Console>) -> Response {
    let options = crate::status::StatusOptions {
        json: false,
        stuck_after: Duration::from_secs(300),
        broker_metrics_url: None,
    };
    let (db, broker) = console.open().await;
    let open = crate::Open {
        db: Some(&db),
        broker: broker.as_deref(),
    };
    let status = crate::status::gather_on(&console.settings, &options, open).await;
    Html(pages::overview(&status).into_string()).into_response()
}

#[derive(Deserialize)]
struct Find {
    id: Option<String>,
}

/// The order search form's target: to the order's page.
async fn find_order(Query(find): Query<Find>) -> Response {
    match find
        .id
        .map(|id| id.trim().to_owned())
        .filter(|id| !id.is_empty())
    {
        Some(id) => Redirect::to(&format!("/orders/{}", pages::path_segment(&id))).into_response(),
        None => Redirect::to("/").into_response(),
    }
}

async fn order(
    State(console): State<Console>,
    Path(id): Path<String>,
    Extension(csrf): Extension<Csrf>,
) -> Response {
    let (db, broker) = console.open().await;
    let open = crate::Open {
        db: Some(&db),
        broker: broker.as_deref(),
    };
    match crate::explain::gather_on(&console.settings, &id, open).await {
        Ok(x) if x.is_unknown() => (
            StatusCode::NOT_FOUND,
            Html(pages::unknown_order(&id).into_string()),
        )
            .into_response(),
        Ok(x) => Html(pages::order(&x, chrono::Utc::now(), &csrf).into_string()).into_response(),
        Err(e) => unavailable("the order", e),
    }
}

#[derive(Deserialize, Default)]
pub(crate) struct DeadLetterFilter {
    pub reason: Option<String>,
    pub order: Option<String>,
    /// Dead-lettered at or after this time (RFC 3339).
    pub since: Option<String>,
}

async fn dead_letters(
    State(console): State<Console>,
    Query(filter): Query<DeadLetterFilter>,
    Extension(csrf): Extension<Csrf>,
) -> Response {
    let non_empty = |v: &Option<String>| {
        v.as_deref()
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
    };
    let reason = non_empty(&filter.reason);
    let order = non_empty(&filter.order);
    let since = match non_empty(&filter.since) {
        None => None,
        Some(text) => match chrono::DateTime::parse_from_rfc3339(&text) {
            Ok(t) => Some(t.with_timezone(&chrono::Utc)),
            Err(e) => {
                return (
                    StatusCode::BAD_REQUEST,
                    Html(
                        pages::problem(&format!(
                            "since: `{text}` is not an RFC 3339 time ({e}), e.g. 2026-12-05T10:00:00Z"
                        ))
                        .into_string(),
                    ),
                )
                    .into_response();
            }
        },
    };
    match urutan::store::dead_letter::list_unresolved(
        &console.db,
        reason.as_deref(),
        order.as_deref(),
        since,
        LIST_AT_MOST,
    )
    .await
    {
        Ok(rows) => Html(pages::dead_letters(&rows, &filter, &csrf).into_string()).into_response(),
        Err(e) => unavailable("the dead letters", e),
    }
}

async fn holds(State(console): State<Console>, Extension(csrf): Extension<Csrf>) -> Response {
    let limit = i64::from(LIST_AT_MOST);
    let held = urutan::store::hold::holds(&console.db, None, limit).await;
    let retrying = urutan::store::hold::retrying(&console.db, None, limit).await;
    match (held, retrying) {
        (Ok(held), Ok(retrying)) => {
            Html(pages::holds(&held, &retrying, &csrf).into_string()).into_response()
        }
        (Err(e), _) | (_, Err(e)) => unavailable("the held orders", e),
    }
}

async fn effects(State(console): State<Console>) -> Response {
    let db = &console.db;
    let read = async {
        let summary = urutan::effects::read::summary(db).await?;
        let endpoints = urutan::effects::read::by_endpoint(db).await?;
        let dead =
            urutan::effects::store::dead_effects(db, None, None, i64::from(LIST_AT_MOST)).await?;
        Ok::<_, sqlx::Error>((summary, endpoints, dead))
    };
    match read.await {
        Ok((summary, endpoints, dead)) => {
            Html(pages::effects(&summary, &endpoints, &dead).into_string()).into_response()
        }
        Err(e) => unavailable("the effects", e),
    }
}

async fn audit(State(console): State<Console>) -> Response {
    match crate::audit::recent(&console.db, i64::from(LIST_AT_MOST)).await {
        Ok(rows) => Html(pages::audit(&rows).into_string()).into_response(),
        Err(e) => unavailable("the audit", e),
    }
}

/// Bytes of a dead letter's body shown (of what the record kept).
const BODY_SHOWN: usize = 16 * 1024;

async fn dead_letter(
    State(console): State<Console>,
    Path(id): Path<String>,
    Extension(csrf): Extension<Csrf>,
) -> Response {
    let Ok(id) = id.parse::<i64>() else {
        return (
            StatusCode::NOT_FOUND,
            Html(pages::problem("no such dead-letter record (ids are numbers)").into_string()),
        )
            .into_response();
    };
    match urutan::store::dead_letter::shown_by_id(&console.db, id).await {
        Ok(Some(shown)) => {
            let body = crate::dlq::show::body_text(&shown.body, BODY_SHOWN);
            Html(pages::dead_letter(&shown, &body, &csrf).into_string()).into_response()
        }
        Ok(None) => (
            StatusCode::NOT_FOUND,
            Html(pages::problem(&format!("no dead-letter record {id}")).into_string()),
        )
            .into_response(),
        Err(e) => unavailable("the dead letter", e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &[u8])]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                *name,
                HeaderValue::from_bytes(value).expect("a header value"),
            );
        }
        map
    }

    #[test]
    fn a_proxys_claim_is_kept_short_and_printable() {
        assert_eq!(forwarded_for(&headers(&[])), "");
        assert_eq!(
            forwarded_for(&headers(&[("x-forwarded-for", b"203.0.113.9, 10.0.0.1")])),
            "203.0.113.9, 10.0.0.1"
        );
        assert_eq!(
            forwarded_for(&headers(&[("forwarded", b"for=203.0.113.9")])),
            "for=203.0.113.9"
        );
        let hostile = [b"\xc3\xa9\t".as_slice(), &[b'a'; 300], b"\xff"].concat();
        let kept = forwarded_for(&headers(&[("x-forwarded-for", &hostile)]));
        assert!(kept.len() <= 100, "{kept}");
        assert!(
            kept.bytes().all(|b| b.is_ascii_graphic() || b == b' '),
            "{kept}"
        );
    }

    #[test]
    fn cookies_are_secure_only_behind_https() {
        assert_eq!(secure(&headers(&[])), "");
        assert_eq!(secure(&headers(&[("x-forwarded-proto", b"http")])), "");
        assert_eq!(
            secure(&headers(&[("x-forwarded-proto", b"HTTPS")])),
            "; Secure"
        );
        assert!(proxied(&headers(&[("x-forwarded-for", b"1.2.3.4")])));
        assert!(proxied(&headers(&[("forwarded", b"for=1.2.3.4")])));
        assert!(!proxied(&headers(&[("x-forwarded-proto", b"https")])));
    }
}
