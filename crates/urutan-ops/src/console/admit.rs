//! Who may talk to the console, decided before any page or action runs
//! (docs/contract.md section 12, docs/security.md "The console").
//!
//! - **Host.** Without `CONSOLE_TOKEN` the console answers only requests
//!   whose `Host` is a loopback name (`localhost`, any `127.x.y.z`, `[::1]`;
//!   any port) or its own listen address: a page on a foreign name that
//!   resolves to loopback (DNS rebinding) sends its own name as `Host` and
//!   is refused (421). With a token any `Host` is served (a reverse proxy's
//!   name): a rebinding page has neither the token nor the session cookie,
//!   which the browser keeps for the console's own name.
//! - **Origin.** A request that changes something (any method but GET and
//!   HEAD) whose `Origin` is present must come from the very authority the
//!   request was sent to (its `Host`) and, without a token, that authority
//!   must also be one the `Host` check allows; `Origin: null` is refused,
//!   and so is `Sec-Fetch-Site` other than `same-origin` or `none`.
//! - **Login attempts.** A wrong token, in the login form or as a bearer
//!   token, counts against the client's address (an IPv6 client by its
//!   /64): the sixth within a minute is refused with 429 without being
//!   checked, until the minute is over. The table is bounded; when full,
//!   the entry whose minute began first makes room.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::http::uri::Authority;
use axum::http::{HeaderMap, Method, Uri, header};

/// How a request got in, for the audit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Auth {
    /// No `CONSOLE_TOKEN` is set: a loopback client with a loopback `Host`.
    Loopback,
    /// `Authorization: Bearer <CONSOLE_TOKEN>`.
    Bearer,
    /// The login form's session cookie.
    Session,
}

impl Auth {
    /// As the audit's `oleh` column says it.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Self::Loopback => "loopback, no token",
            Self::Bearer => "token, bearer",
            Self::Session => "token, session cookie",
        }
    }
}

/// A `Host` or `Origin` authority: the host in lowercase (an IPv6
/// address in brackets) and the port, if given.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Named {
    host: String,
    port: Option<u16>,
}

impl Named {
    /// `host[:port]`, nothing else (no user info, no path).
    fn parse(text: &str) -> Option<Self> {
        if text.is_empty() || text.contains(['@', '/', '?', '#']) {
            return None;
        }
        let authority: Authority = text.parse().ok()?;
        Some(Self {
            host: authority.host().to_ascii_lowercase(),
            port: authority.port_u16(),
        })
    }

    /// The host as an address, if it is one.
    fn ip(&self) -> Option<IpAddr> {
        let bare = self
            .host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(&self.host);
        bare.parse().ok()
    }

    /// A name no DNS answer can point elsewhere: `localhost` (browsers
    /// resolve it themselves), a loopback address, or the console's own.
    fn is_local(&self, listen: SocketAddr) -> bool {
        self.host == "localhost"
            || self
                .ip()
                .is_some_and(|ip| ip.is_loopback() || ip == listen.ip())
    }
}

/// The authority a request was sent to: its `Host`, or the authority of an
/// absolute-form request line (which then wins, RFC 9112 3.2.2).
fn target(headers: &HeaderMap, uri: &Uri) -> Option<Named> {
    if let Some(authority) = uri.authority() {
        return Named::parse(authority.as_str());
    }
    Named::parse(headers.get(header::HOST)?.to_str().ok()?.trim())
}

/// Why a console without a token refuses this request's `Host`, if it does.
pub(crate) fn foreign_host(headers: &HeaderMap, uri: &Uri, listen: SocketAddr) -> Option<String> {
    let local = target(headers, uri).is_some_and(|named| named.is_local(listen));
    (!local).then(|| {
        format!(
            "This console (no CONSOLE_TOKEN) answers only requests for localhost, 127.0.0.1, \
             [::1] or {listen}; this one named another host (a page on another name that \
             resolves to this machine is refused). Open it as http://{listen}/, or set \
             CONSOLE_TOKEN to serve other names.\n"
        )
    })
}

/// Why a request that changes something is refused as coming from another
/// site's page, if it is (see the module's doc).
pub(crate) fn foreign_origin(
    method: &Method,
    headers: &HeaderMap,
    uri: &Uri,
    listen: SocketAddr,
    token_set: bool,
) -> Option<&'static str> {
    if matches!(*method, Method::GET | Method::HEAD) {
        return None;
    }
    let fetch_site = headers
        .get("sec-fetch-site")
        .map(|v| v.to_str().unwrap_or_default().trim().to_ascii_lowercase());
    if fetch_site.is_some_and(|site| site != "same-origin" && site != "none") {
        return Some("This form was sent from another site's page (Sec-Fetch-Site).\n");
    }
    let origin = headers.get(header::ORIGIN)?;
    let refused = Some("This form was sent from another site's page (Origin).\n");
    let Some((scheme, rest)) = origin.to_str().ok().and_then(|o| o.split_once("://")) else {
        return refused; // `null`, or not an origin at all
    };
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "http" => 80,
        "https" => 443,
        _ => return refused,
    };
    let (Some(from), Some(to)) = (Named::parse(rest), target(headers, uri)) else {
        return refused;
    };
    let same = from.host == to.host
        && from.port.unwrap_or(default_port) == to.port.unwrap_or(default_port);
    if !same || (!token_set && !from.is_local(listen)) {
        return refused;
    }
    None
}

/// Wrong tokens allowed per client and window before it is refused.
const FAILURES: u32 = 5;
/// The window the failures are counted in.
const WINDOW: Duration = Duration::from_secs(60);
/// Clients tracked at once.
const TRACKED: usize = 1024;

/// Wrong-token attempts per client, bounded ([`TRACKED`] clients).
#[derive(Debug, Default)]
pub(crate) struct Attempts {
    /// Per client: when its window began, and its failures in it.
    table: Mutex<HashMap<IpAddr, (Instant, u32)>>,
}

/// A client as the limit counts it: an IPv4 address, or an IPv6 /64 (one
/// host usually holds a whole /64).
fn client_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let prefix = u128::from(v6) & !u128::from(u64::MAX);
                IpAddr::V6(Ipv6Addr::from(prefix))
            }
        },
    }
}

impl Attempts {
    /// How long `client` must wait before its token is checked again, if
    /// it is over the limit.
    pub(crate) fn refused_for(&self, client: IpAddr, now: Instant) -> Option<Duration> {
        let table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        let (start, failures) = *table.get(&client_key(client))?;
        let left = WINDOW.checked_sub(now.saturating_duration_since(start))?;
        (failures >= FAILURES && !left.is_zero()).then_some(left.max(Duration::from_secs(1)))
    }

    /// Counts a wrong token from `client`.
    pub(crate) fn failed(&self, client: IpAddr, now: Instant) {
        let mut table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        let key = client_key(client);
        if !table.contains_key(&key) && table.len() >= TRACKED {
            table.retain(|_, (start, _)| now.saturating_duration_since(*start) < WINDOW);
            if table.len() >= TRACKED
                && let Some(oldest) = table.iter().min_by_key(|(_, (start, _))| *start)
            {
                let oldest = *oldest.0;
                table.remove(&oldest);
            }
        }
        let entry = table.entry(key).or_insert((now, 0));
        if now.saturating_duration_since(entry.0) >= WINDOW {
            *entry = (now, 0);
        }
        entry.1 += 1;
    }

    /// Forgets `client`'s failures (it showed the token).
    pub(crate) fn succeeded(&self, client: IpAddr) {
        let mut table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        table.remove(&client_key(client));
    }

    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.table
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    const LISTEN: &str = "127.0.0.1:8088";

    fn listen() -> SocketAddr {
        LISTEN.parse().expect("addr")
    }

    fn with(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(*name, HeaderValue::from_str(value).expect("value"));
        }
        headers
    }

    fn host_ok(host: &str) -> bool {
        foreign_host(&with(&[("host", host)]), &Uri::from_static("/"), listen()).is_none()
    }

    #[test]
    fn only_loopback_names_and_the_listen_address_are_hosts() {
        for ok in [
            "localhost",
            "LOCALHOST:8088",
            "127.0.0.1",
            "127.0.0.1:8088",
            "127.9.8.7:1",
            "[::1]",
            "[::1]:8088",
        ] {
            assert!(host_ok(ok), "{ok}");
        }
        for refused in [
            "evil.example:8088",
            "evil.example",
            "localhost.evil.example",
            "127.0.0.1.nip.io:8088",
            "10.0.0.1:8088",
            "user@localhost:8088",
            "",
            "[::2]:8088",
        ] {
            assert!(!host_ok(refused), "{refused}");
        }
        let none = foreign_host(&HeaderMap::new(), &Uri::from_static("/"), listen());
        assert!(none.is_some(), "no Host at all");
        let absolute = Uri::from_static("http://evil.example:8088/");
        assert!(
            foreign_host(&with(&[("host", LISTEN)]), &absolute, listen()).is_some(),
            "an absolute-form target wins over Host"
        );
        let elsewhere: SocketAddr = "[::1]:9000".parse().expect("addr");
        assert!(
            foreign_host(
                &with(&[("host", "[::1]:9000")]),
                &Uri::from_static("/"),
                elsewhere
            )
            .is_none()
        );
    }

    fn origin_ok(pairs: &[(&'static str, &str)], token: bool) -> bool {
        let uri = Uri::from_static("/holds/release");
        foreign_origin(&Method::POST, &with(pairs), &uri, listen(), token).is_none()
    }

    #[test]
    fn an_origin_must_be_the_host_it_was_sent_to_and_local_without_a_token() {
        assert!(origin_ok(&[("host", LISTEN)], false), "no Origin: a form");
        assert!(origin_ok(
            &[("host", LISTEN), ("origin", "http://127.0.0.1:8088")],
            false
        ));
        assert!(origin_ok(
            &[
                ("host", "localhost:8088"),
                ("origin", "http://localhost:8088")
            ],
            false
        ));
        for (host, origin) in [
            (LISTEN, "https://evil.example"),
            (LISTEN, "http://localhost:8088"),
            (LISTEN, "http://127.0.0.1:3000"),
            (LISTEN, "null"),
            (LISTEN, "ftp://127.0.0.1:8088"),
            // DNS rebinding: the page's name as Host and Origin.
            ("evil.example:8088", "http://evil.example:8088"),
        ] {
            assert!(
                !origin_ok(&[("host", host), ("origin", origin)], false),
                "{host} {origin}"
            );
        }
        // With a token, behind a proxy: the proxy's name, TLS's default port.
        assert!(origin_ok(
            &[
                ("host", "urutan.example.com"),
                ("origin", "https://urutan.example.com")
            ],
            true
        ));
        assert!(!origin_ok(
            &[
                ("host", "127.0.0.1:8088"),
                ("origin", "https://urutan.example.com")
            ],
            true
        ));
        assert!(!origin_ok(
            &[("host", LISTEN), ("sec-fetch-site", "cross-site")],
            false
        ));
        assert!(!origin_ok(
            &[("host", LISTEN), ("sec-fetch-site", "same-site")],
            true
        ));
        assert!(origin_ok(
            &[("host", LISTEN), ("sec-fetch-site", "same-origin")],
            false
        ));
        let get = foreign_origin(
            &Method::GET,
            &with(&[("host", LISTEN), ("origin", "https://evil.example")]),
            &Uri::from_static("/"),
            listen(),
            false,
        );
        assert!(get.is_none(), "a GET changes nothing");
    }

    #[test]
    fn the_sixth_wrong_token_in_a_minute_waits_for_the_minute() {
        let attempts = Attempts::default();
        let client: IpAddr = "192.0.2.7".parse().expect("ip");
        let t0 = Instant::now();
        for _ in 0..5 {
            assert!(attempts.refused_for(client, t0).is_none());
            attempts.failed(client, t0);
        }
        let wait = attempts.refused_for(client, t0).expect("limited");
        assert!(wait <= WINDOW && wait > Duration::from_secs(50), "{wait:?}");
        let other: IpAddr = "192.0.2.8".parse().expect("ip");
        assert!(attempts.refused_for(other, t0).is_none(), "per client");
        assert!(attempts.refused_for(client, t0 + WINDOW).is_none());
        attempts.failed(client, t0 + WINDOW);
        assert!(
            attempts.refused_for(client, t0 + WINDOW).is_none(),
            "new window"
        );
        // One /64 is one client.
        let a: IpAddr = "2001:db8::1".parse().expect("ip");
        let b: IpAddr = "2001:db8::ffff:1".parse().expect("ip");
        for _ in 0..5 {
            attempts.failed(a, t0);
        }
        assert!(attempts.refused_for(b, t0).is_some());
        attempts.succeeded(b);
        assert!(attempts.refused_for(a, t0).is_none());
    }

    #[test]
    fn the_table_stays_bounded() {
        let attempts = Attempts::default();
        let t0 = Instant::now();
        for i in 0..(TRACKED as u32 * 3) {
            let ip = IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i));
            attempts.failed(ip, t0 + Duration::from_millis(u64::from(i)));
        }
        assert_eq!(attempts.tracked(), TRACKED);
    }
}
