//! `urutan console` (docs/contract.md section 12): the operator console in
//! the browser, served by its own process from the same binary. Its pages
//! read what the CLI reads, through the same read API (`status::gather`,
//! `explain::gather`, the store's hold and dead-letter reads), so the two
//! never disagree.
//!
//! Safe by default: without `CONSOLE_TOKEN` it listens on loopback only and
//! answers only requests for a loopback name or its own address (no DNS
//! rebinding); with it, every page needs the token (`Authorization: Bearer
//! <token>`, or the login form's session cookie), and wrong tokens are
//! rate-limited, logged and audited (`admit`). It serves through the
//! metrics port's accept loop (`urutan::http::serve_router`: header-read
//! timeout, connection lifetime and cap). Every response carries a strict
//! Content-Security-Policy (no script at all, no framing) and no-store.
//! Actions (releasing held orders; replaying and purging dead letters, one
//! or many, through the `urutan dlq` commands' own code) are POSTs that carry a
//! CSRF token (a double-submit cookie, SameSite=Strict), are confirmed on a
//! page of their own before anything changes, and leave an audit row each
//! (`urutan_audit`: who, when, what, result), which the console and
//! `urutan explain` show.

mod actions;
mod admit;
mod pages;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Extension;
use axum::Router;
use axum::extract::{ConnectInfo, Form, Path, Query, Request, State};
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
    /// The address listened on: a `Host` a console without a token
    /// answers, besides the loopback names.
    listen: SocketAddr,
    /// Wrong tokens per client (the login form's and bearer tokens).
    attempts: Arc<admit::Attempts>,
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

    /// How `headers` get in: `Ok(None)` when they carry no credential,
    /// `Err(())` when they carry a wrong bearer token (a guess).
    fn admits(&self, headers: &HeaderMap) -> Result<Option<admit::Auth>, ()> {
        let Some(token) = &self.token else {
            return Ok(Some(admit::Auth::Loopback));
        };
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if bearer.is_some_and(|given| same(given.trim(), token)) {
            return Ok(Some(admit::Auth::Bearer));
        }
        if cookie(headers, COOKIE).is_some_and(|given| same(given, &Self::session(token))) {
            return Ok(Some(admit::Auth::Session));
        }
        if bearer.is_some() { Err(()) } else { Ok(None) }
    }

    /// A wrong token from `client`: counted, logged (never the token) and
    /// audited.
    async fn wrong_token(&self, client: SocketAddr, headers: &HeaderMap, how: &str) {
        self.attempts.failed(client.ip(), Instant::now());
        let by = who(&format!("wrong token, {how}"), client, headers);
        tracing::warn!(client = %client, by = %by, "console: a wrong token was refused");
        if let Err(e) = crate::audit::record(
            &self.db,
            &by,
            "console_login",
            None,
            &format!("the console ({how})"),
            "refused: wrong token",
        )
        .await
        {
            tracing::error!(error = %e, "console: cannot write the audit row of a refused token");
        }
    }
}

/// Who acts, for the audit: how it got in, the client's address and port,
/// and behind a proxy whom the proxy says it forwarded for, e.g.
/// `console (token, bearer) 127.0.0.1:5555`.
fn who(how: &str, client: SocketAddr, headers: &HeaderMap) -> String {
    let forwarded = forwarded_for(headers);
    if forwarded.is_empty() {
        format!("console ({how}) {client}")
    } else {
        format!("console ({how}) {client}, forwarded for {forwarded}")
    }
}

/// The client of a request (its peer, as the accept loop recorded it).
fn client_of(request: &Request) -> SocketAddr {
    request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(SocketAddr::from(([0, 0, 0, 0], 0)), |c| c.0)
}

/// A short plain-text refusal.
fn plainly(status: StatusCode, why: impl Into<String>) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        why.into(),
    )
        .into_response()
}

/// 429 with the wait, for a client over the wrong-token limit.
fn too_many(wait: Duration) -> Response {
    let mut response = plainly(
        StatusCode::TOO_MANY_REQUESTS,
        format!(
            "Too many wrong tokens from this address: try again in {} s.\n",
            wait.as_secs()
        ),
    );
    if let Ok(value) = HeaderValue::from_str(&wait.as_secs().to_string()) {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
    response
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
        listen: bound,
        attempts: Arc::default(),
    };
    let broker = console.broker.clone();
    urutan::http::serve_router(
        listener,
        router(console),
        urutan::http::Limits::default(),
        shutdown,
    )
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

/// Before any page or action ([`admit`]): without a token, a `Host` that
/// is not a loopback name or the listen address is refused (421), and so
/// is a request that came through a proxy (listening on loopback protects
/// nothing once a proxy forwards the world to it); a request that changes
/// something must come from this console's own page (`Origin`). Then
/// every page but the login form and the stylesheet needs the token (when
/// one is set): a 401 with the login form otherwise, a 429 for a client
/// over the wrong-token limit. The page gets how it was admitted
/// ([`admit::Auth`]) for its audit rows.
async fn guard(State(console): State<Console>, mut request: Request, next: Next) -> Response {
    let client = client_of(&request);
    if console.token.is_none()
        && let Some(why) = admit::foreign_host(request.headers(), request.uri(), console.listen)
    {
        tracing::warn!(client = %client, "console: refused a request for another host name: CONSOLE_TOKEN is unset");
        return plainly(StatusCode::MISDIRECTED_REQUEST, why);
    }
    if let Some(why) = admit::foreign_origin(
        request.method(),
        request.headers(),
        request.uri(),
        console.listen,
        console.token.is_some(),
    ) {
        tracing::warn!(client = %client, path = %request.uri().path(), "console: refused a request from another site's page");
        return plainly(StatusCode::FORBIDDEN, why);
    }
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
    let auth = match console.admits(request.headers()) {
        Ok(Some(auth)) => Some(auth),
        Ok(None) => None,
        Err(()) => {
            if let Some(wait) = console.attempts.refused_for(client.ip(), Instant::now()) {
                tracing::debug!(client = %client, "console: a bearer token refused (too many wrong ones)");
                return too_many(wait);
            }
            console
                .wrong_token(client, request.headers(), "bearer")
                .await;
            None
        }
    };
    if let Some(auth) = auth {
        // Over the limit, a right guess is not told apart from a wrong one.
        if auth == admit::Auth::Bearer
            && let Some(wait) = console.attempts.refused_for(client.ip(), Instant::now())
        {
            return too_many(wait);
        }
        request.extensions_mut().insert(auth);
        return next.run(request).await;
    }
    if open {
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
/// and back to the overview, or the form again. A client over the
/// wrong-token limit gets 429 and its token is not checked.
async fn login(
    State(console): State<Console>,
    ConnectInfo(client): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Form(form): Form<Login>,
) -> Response {
    let Some(token) = &console.token else {
        return Redirect::to("/").into_response();
    };
    if let Some(wait) = console.attempts.refused_for(client.ip(), Instant::now()) {
        tracing::debug!(client = %client, "console: a login refused unchecked (too many wrong tokens)");
        return too_many(wait);
    }
    if !same(form.token.trim(), token) {
        console.wrong_token(client, &headers, "login form").await;
        return (
            StatusCode::UNAUTHORIZED,
            Html(pages::login(true).into_string()),
        )
            .into_response();
    }
    console.attempts.succeeded(client.ip());
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
