//! The `EFFECTS`, `EFFECTS_SECRET`, `EFFECTS_SECRETS` and `EFFECTS_PROXY`
//! settings, parsed into typed values at start; a bad value is one error line
//! that never shows a secret or a URL's credentials.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

/// Which applied versions a route takes: one status, or every one (`*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StatusMatch {
    Any,
    Status(String),
}

impl StatusMatch {
    /// The value stored in `urutan_efek_rute.status` (`*` for any).
    pub fn as_sql(&self) -> &str {
        match self {
            Self::Any => "*",
            Self::Status(s) => s,
        }
    }
}

/// One `STATUS=URL` entry of `EFFECTS`.
#[derive(Clone, PartialEq, Eq)]
pub struct Route {
    pub status: StatusMatch,
    pub url: url::Url,
}

impl fmt::Debug for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.status.as_sql(), redact(&self.url))
    }
}

/// The parsed `EFFECTS`: routes in the order given (empty: no effects).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Routes(pub Vec<Route>);

/// Why `EFFECTS` or `EFFECTS_SECRET` was refused: one line, secrets left out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "EFFECTS entry {entry} ({shown}): {problem}; expected STATUS=URL entries separated by `;` (STATUS `*` = every status), e.g. `dibayar=https://pay.internal/capture;*=https://search.internal/index`"
    )]
    Entry {
        entry: usize,
        shown: String,
        problem: String,
    },
    #[error("EFFECTS_SECRET {0}")]
    Secret(String),
    #[error("EFFECTS_SECRETS {0}")]
    Secrets(String),
    #[error("EFFECTS_PROXY {0}")]
    Proxy(String),
    #[error(
        "EFFECTS is set but EFFECTS_SECRET is not: every webhook is signed (use `whsec_<base64>` or any string of 16 bytes or more)"
    )]
    SecretMissing,
}

/// Longest status the contract allows (section 2: 1-64 characters).
const STATUS_MAX_CHARS: usize = 64;

impl Routes {
    /// Parses `STATUS=URL` entries separated by `;` (blank entries, e.g. a
    /// trailing `;`, are skipped). A status is 1-64 characters or `*`; a
    /// URL is absolute `http` or `https` with a host and no fragment.
    pub fn parse(raw: &str) -> Result<Self, ConfigError> {
        let mut routes: Vec<Route> = Vec::new();
        for (i, entry) in raw.split(';').enumerate() {
            let entry = entry.trim();
            if entry.is_empty() {
                continue;
            }
            let fail = |problem: &str| ConfigError::Entry {
                entry: i + 1,
                shown: shown(entry),
                problem: problem.to_owned(),
            };
            let Some((status, url)) = entry.split_once('=') else {
                return Err(fail("no `=`"));
            };
            let (status, url) = (status.trim(), url.trim());
            let status = match status {
                "" => return Err(fail("the status is empty")),
                "*" => StatusMatch::Any,
                s if s.chars().count() > STATUS_MAX_CHARS => {
                    return Err(fail("a status has at most 64 characters"));
                }
                s => StatusMatch::Status(s.to_owned()),
            };
            let url = url::Url::parse(url).map_err(|e| fail(&format!("not a URL ({e})")))?;
            if !matches!(url.scheme(), "http" | "https") {
                return Err(fail(&format!(
                    "unsupported scheme `{}` (use http or https)",
                    url.scheme()
                )));
            }
            if url.host_str().is_none_or(str::is_empty) {
                return Err(fail("the URL has no host"));
            }
            if url.fragment().is_some() {
                return Err(fail("the URL has a fragment (`#...`)"));
            }
            let route = Route { status, url };
            if !routes.contains(&route) {
                routes.push(route);
            }
        }
        Ok(Self(routes))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for Routes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown: Vec<String> = self.0.iter().map(|r| format!("{r:?}")).collect();
        f.write_str(&shown.join(";"))
    }
}

/// An entry as an error may show it: the status and the URL's host only.
fn shown(entry: &str) -> String {
    let (status, url) = entry.split_once('=').unwrap_or((entry, ""));
    let status: String = status.trim().chars().take(STATUS_MAX_CHARS + 1).collect();
    match url::Url::parse(url.trim()) {
        Ok(url) => format!("`{status}={}`", redact_origin(&url)),
        Err(_) if url.is_empty() => format!("`{status}`"),
        Err(_) => format!("`{status}=…`"),
    }
}

/// A URL as output and logs may show it: scheme, host and port, and at most
/// the path's first segment (`https://pay.internal:8443/capture/…`); never
/// the user, password, the rest of the path or the query, which may carry
/// tokens. `…` marks what was left out.
pub fn redact(url: &url::Url) -> String {
    let origin = format!("{}://{}", url.scheme(), host_port(url));
    let mut segments = url
        .path_segments()
        .into_iter()
        .flatten()
        .filter(|s| !s.is_empty());
    let first = segments.next();
    let cut = segments.next().is_some() || url.query().is_some();
    match (first, cut) {
        (Some(first), true) => format!("{origin}/{first}/…"),
        (Some(first), false) => format!("{origin}/{first}"),
        (None, true) => format!("{origin}/…"),
        (None, false) => format!("{origin}/"),
    }
}

/// [`redact`] of a URL as stored (`urutan_efek_tujuan.url`); `?` if it
/// does not parse (it always does: it was parsed before it was stored).
pub fn redact_str(url: &str) -> String {
    url::Url::parse(url).map_or_else(|_| "?".into(), |u| redact(&u))
}

/// Scheme, host and port only (a proxy: its path means nothing).
pub fn redact_origin(url: &url::Url) -> String {
    format!("{}://{}/…", url.scheme(), host_port(url))
}

/// `host` or `host:port` (the port only when not the scheme's default).
fn host_port(url: &url::Url) -> String {
    let host = url.host_str().unwrap_or("?");
    match url.port() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_owned(),
    }
}

/// The `endpoint` label of the effect metrics: `host[:port]` plus the
/// path's first segment (`pay.internal:8443/capture`), so two endpoints on
/// one host are two series. Bounded: endpoints come from `EFFECTS`, never
/// from an order or a message.
pub fn endpoint_label(url: &url::Url) -> String {
    let first = url
        .path_segments()
        .into_iter()
        .flatten()
        .find(|s| !s.is_empty());
    match first {
        Some(first) => format!("{}/{first}", host_port(url)),
        None => host_port(url),
    }
}

/// The signing keys of `EFFECTS_SECRET`: one or more secrets separated by
/// spaces (each signs: key rotation, as Standard Webhooks allows). A secret
/// `whsec_<base64>` is the Standard Webhooks format (the key is the decoded
/// bytes); any other string is used as it is (its UTF-8 bytes).
#[derive(Clone)]
pub struct Secret(Vec<Vec<u8>>);

/// Shortest key accepted (HMAC-SHA256 wants at least 16 bytes of key).
const SECRET_MIN_BYTES: usize = 16;

impl Secret {
    pub fn parse(raw: &str) -> Result<Self, ConfigError> {
        let mut keys = Vec::new();
        for (i, part) in raw.split_whitespace().enumerate() {
            let n = i + 1;
            let key = match part.strip_prefix("whsec_") {
                Some(b64) => BASE64.decode(b64).map_err(|_| {
                    ConfigError::Secret(format!("secret {n}: `whsec_` must be followed by base64"))
                })?,
                None => part.as_bytes().to_vec(),
            };
            if key.len() < SECRET_MIN_BYTES {
                return Err(ConfigError::Secret(format!(
                    "secret {n}: at least {SECRET_MIN_BYTES} bytes of key, got {}",
                    key.len()
                )));
            }
            keys.push(key);
        }
        if keys.is_empty() {
            return Err(ConfigError::Secret("is empty".into()));
        }
        Ok(Self(keys))
    }

    pub fn keys(&self) -> &[Vec<u8>] {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({} key(s), ***)", self.0.len())
    }
}

/// `EFFECTS_SECRETS`: endpoints with a secret of their own, so that no
/// receiver holds a key that signs for another (Standard Webhooks: one
/// secret per endpoint). A JSON object from an endpoint URL, exactly as in
/// `EFFECTS`, to its secret (same forms as `EFFECTS_SECRET`, several
/// separated by spaces for rotation): `{"https://pay.internal/capture":
/// "whsec_…"}`. Endpoints not named sign with `EFFECTS_SECRET`.
#[derive(Clone, Default)]
pub struct EndpointSecrets(Vec<(String, Secret)>);

impl EndpointSecrets {
    /// Parses the JSON object; errors show neither a secret nor a URL's
    /// credentials, path or query.
    pub fn parse(raw: &str) -> Result<Self, ConfigError> {
        let fail = |why: String| ConfigError::Secrets(why);
        // serde_json's messages may quote the value: only its position is kept.
        let map: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(raw).map_err(|e| {
                fail(format!(
                    "is not a JSON object {{\"URL\": \"secret\", …}} (line {}, column {})",
                    e.line(),
                    e.column()
                ))
            })?;
        let mut secrets = Vec::new();
        for (n, (url, secret)) in map.iter().enumerate() {
            let which = format!("entry {}", n + 1);
            let url = url::Url::parse(url.trim())
                .ok()
                .filter(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some())
                .ok_or_else(|| fail(format!("{which}: the key is not an http(s) URL")))?;
            let which = format!("{which} ({})", redact_origin(&url));
            let secret = secret
                .as_str()
                .ok_or_else(|| fail(format!("{which}: the secret is not a JSON string")))
                .and_then(|s| {
                    Secret::parse(s).map_err(|e| match e {
                        ConfigError::Secret(why) => fail(format!("{which}: {why}")),
                        other => other,
                    })
                })?;
            secrets.push((url.as_str().to_owned(), secret));
        }
        Ok(Self(secrets))
    }

    /// The own secret of the endpoint `url` (as stored for an effect), if any.
    pub fn get(&self, url: &str) -> Option<&Secret> {
        self.0.iter().find(|(u, _)| u == url).map(|(_, s)| s)
    }

    /// The endpoints named, normalized as [`url::Url`] writes them.
    pub fn urls(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(u, _)| u.as_str())
    }
}

impl fmt::Debug for EndpointSecrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EndpointSecrets({} endpoint(s), ***)", self.0.len())
    }
}

/// `EFFECTS_PROXY`: the one proxy webhooks go through (none when unset; the
/// `HTTP_PROXY` family of variables is ignored). Printed without credentials.
#[derive(Clone)]
pub struct ProxyUrl(pub url::Url);

impl ProxyUrl {
    pub fn parse(raw: &str) -> Result<Self, ConfigError> {
        url::Url::parse(raw.trim())
            .ok()
            .filter(|u| {
                matches!(u.scheme(), "http" | "https" | "socks5" | "socks5h")
                    && u.host_str().is_some()
            })
            .map(Self)
            .ok_or_else(|| {
                ConfigError::Proxy("is not an http(s):// or socks5:// URL with a host".into())
            })
    }
}

impl fmt::Debug for ProxyUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact_origin(&self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_contract_example_parses() {
        let routes =
            Routes::parse("dibayar=https://pay.internal/capture;*=https://search.internal/index")
                .expect("valid");
        assert_eq!(routes.0.len(), 2);
        assert_eq!(routes.0[0].status, StatusMatch::Status("dibayar".into()));
        assert_eq!(routes.0[0].url.as_str(), "https://pay.internal/capture");
        assert_eq!(routes.0[1].status, StatusMatch::Any);
        assert_eq!(routes.0[1].status.as_sql(), "*");
    }

    #[test]
    fn blanks_spaces_and_repeats_are_tolerated() {
        let routes =
            Routes::parse(" dibayar = http://a:8080/x ; ;dibayar=http://a:8080/x;").expect("valid");
        assert_eq!(routes.0.len(), 1, "the same route twice counts once");
        assert!(Routes::parse("").expect("empty").is_empty());
        assert!(Routes::parse(" ; ").expect("blank").is_empty());
        let shared = Routes::parse("a=http://h/x;b=http://h/x").expect("valid");
        assert_eq!(shared.0.len(), 2, "one endpoint for two statuses");
    }

    #[test]
    fn bad_entries_are_refused_with_their_position() {
        let cases = [
            ("dibayar", "entry 1", "no `=`"),
            ("a=http://h/;=http://h/", "entry 2", "status is empty"),
            ("a=pay.internal/capture", "entry 1", "not a URL"),
            ("a=ftp://h/x", "entry 1", "unsupported scheme `ftp`"),
            ("a=http://h/x#frag", "entry 1", "fragment"),
            ("a=https://", "entry 1", "not a URL"),
        ];
        for (raw, entry, problem) in cases {
            let err = Routes::parse(raw).expect_err(raw).to_string();
            assert!(err.contains(entry) && err.contains(problem), "{raw}: {err}");
            assert!(!err.contains('\n'), "one line: {err}");
        }
        let long = format!("{}=http://h/", "s".repeat(65));
        assert!(Routes::parse(&long).is_err());
        let max = format!("{}=http://h/", "s".repeat(64));
        assert!(Routes::parse(&max).is_ok());
    }

    #[test]
    fn secrets_in_urls_never_print() {
        let routes =
            Routes::parse("a=https://user:pw-123@pay.internal:8443/hook/tok-456?key=q-789")
                .expect("valid");
        let shown = format!("{routes} {routes:?}");
        for secret in ["pw-123", "tok-456", "q-789", "user"] {
            assert!(!shown.contains(secret), "{shown}");
        }
        assert!(shown.contains("pay.internal:8443"), "{shown}");
        let err = Routes::parse("a=https://u:pw-123@h/x;b=ftp://u:pw-456@h/t")
            .expect_err("ftp")
            .to_string();
        assert!(!err.contains("pw-") && !err.contains("/t"), "{err}");
        let err = Routes::parse("a=not a url with pw-789")
            .expect_err("bad")
            .to_string();
        assert!(!err.contains("pw-789"), "{err}");
    }

    #[test]
    fn endpoint_labels_are_host_port_and_first_segment() {
        let url = url::Url::parse("https://u:p@pay.internal:8443/a/b?c=d").expect("url");
        assert_eq!(endpoint_label(&url), "pay.internal:8443/a");
        let url = url::Url::parse("http://search/x").expect("url");
        assert_eq!(endpoint_label(&url), "search/x");
        let url = url::Url::parse("http://search:80").expect("url");
        assert_eq!(endpoint_label(&url), "search");
    }

    #[test]
    fn redacted_urls_keep_the_origin_and_the_first_segment() {
        for (raw, shown) in [
            (
                "https://u:pw@pay.internal:8443/capture/tok-1?k=q-2",
                "https://pay.internal:8443/capture/…",
            ),
            (
                "https://pay.internal/capture",
                "https://pay.internal/capture",
            ),
            ("http://search:9200/?k=q", "http://search:9200/…"),
            ("http://search", "http://search/"),
        ] {
            let url = url::Url::parse(raw).expect("url");
            assert_eq!(redact(&url), shown, "{raw}");
            assert_eq!(redact_str(raw), shown, "{raw}");
        }
        assert_eq!(redact_str("not a url"), "?");
    }

    #[test]
    fn endpoint_secrets_are_looked_up_by_url_and_never_print() {
        let s = EndpointSecrets::parse(
            r#"{"https://pay.internal/capture": "pay-secret-0123456789", "http://Search:80/x": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}"#,
        )
        .expect("valid");
        assert_eq!(
            s.get("https://pay.internal/capture")
                .map(|k| k.keys()[0].clone()),
            Some(b"pay-secret-0123456789".to_vec())
        );
        assert!(
            s.get("http://search/x").is_some(),
            "normalized like EFFECTS"
        );
        assert!(s.get("https://other/").is_none());
        assert!(!format!("{s:?}").contains("pay-secret"));
        for (raw, problem) in [
            ("\"hush-hush-0123456789\"", "not a JSON object"),
            (
                "{\"not a url\": \"x-secret-0123456789\"}",
                "not an http(s) URL",
            ),
            ("{\"https://h/\": 12345678901234567}", "not a JSON string"),
            (
                "{\"https://u:pw-1@h/t\": \"short-pw\"}",
                "at least 16 bytes",
            ),
        ] {
            let err = EndpointSecrets::parse(raw).expect_err(raw).to_string();
            assert!(err.contains(problem), "{raw}: {err}");
            for secret in [
                "hush-hush",
                "x-secret",
                "12345678",
                "short-pw",
                "pw-1",
                "/t",
            ] {
                assert!(!err.contains(secret), "{raw}: {err}");
            }
        }
    }

    #[test]
    fn proxies_print_without_credentials() {
        let p = ProxyUrl::parse("http://u:pw-9@proxy.internal:3128").expect("valid");
        assert_eq!(format!("{p:?}"), "http://proxy.internal:3128/…");
        let err = ProxyUrl::parse("proxy pw-9").expect_err("bad").to_string();
        assert!(!err.contains("pw-9"), "{err}");
    }

    #[test]
    fn secrets_standard_plain_and_rotated() {
        let std = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").expect("whsec");
        assert_eq!(std.keys().len(), 1);
        assert_eq!(std.keys()[0].len(), 24, "the decoded key");
        let plain = Secret::parse("a-plain-secret-of-enough-bytes").expect("plain");
        assert_eq!(plain.keys()[0], b"a-plain-secret-of-enough-bytes");
        let two = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw another-plain-secret-1234")
            .expect("rotation");
        assert_eq!(two.keys().len(), 2);
        assert!(Secret::parse("").is_err());
        assert!(Secret::parse("short").is_err());
        assert!(Secret::parse("whsec_!!!notbase64!!!").is_err());
        assert!(!format!("{two:?}").contains("another"), "never printed");
    }
}
