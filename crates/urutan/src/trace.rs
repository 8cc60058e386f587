//! Traces (docs/contract.md section 12): W3C trace context carried from the
//! producer to the webhook, and spans exported over OTLP/HTTP when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is set.
//!
//! ```text
//! outbox.traceparent (or a new trace) ─> relay "publish" span ─> AMQP header `traceparent`
//!   ─> worker "apply" span (child of the header; a direct producer's header is continued)
//!   ─> urutan_efek.traceparent (the apply span, written in the apply transaction)
//!   ─> dispatcher "webhook" span ─> HTTP header `traceparent`
//! ```
//!
//! The context is carried whether or not spans are exported: with no
//! exporter ([`Traces::off`], the default) a span is only its ids, drawn at
//! random, and nothing else is built or sent.
//!
//! A producer's value is untrusted: only a version-00 `traceparent` of
//! exactly 55 bytes, lowercase hex, with non-zero ids is continued
//! ([`TraceParent::parse`]); anything else (wrong length, another AMQP type,
//! a huge value) is ignored and a new trace is started. The raw value is
//! never logged.
//!
//! Spans (and the collector's headers and credentials) go through a proxy
//! only when `OTEL_EXPORTER_OTLP_PROXY` names one, and not even then for a
//! collector that `NO_PROXY` lists: the `HTTP_PROXY`/`HTTPS_PROXY`/`ALL_PROXY`
//! variables, set for other programs, are ignored, as the effects
//! dispatcher ignores them.

use std::fmt;
use std::sync::Arc;

use lapin::types::{AMQPValue, FieldTable};
use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, Status, TraceContextExt, TraceFlags, TraceId, TraceState,
    Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue, Value};
use opentelemetry_otlp::WithHttpConfig as _;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};

/// The kind of a span (producer, consumer, client...), as [`Traces::start`] takes it.
pub use opentelemetry::trace::SpanKind;

/// The AMQP and HTTP header (and the column) that carries the context.
pub const HEADER: &str = "traceparent";

/// The length of a version-00 `traceparent`.
const LENGTH: usize = 55;

/// A W3C `traceparent`: trace id, parent span id, flags (version 00).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    flags: u8,
}

impl TraceParent {
    /// Reads a producer's value strictly: `00-<32 hex>-<16 hex>-<2 hex>`,
    /// lowercase, neither id all zeros. `None` for anything else, including
    /// other versions (their longer form is not continued).
    pub fn parse(text: &[u8]) -> Option<Self> {
        if text.len() != LENGTH || &text[..3] != b"00-" || text[35] != b'-' || text[52] != b'-' {
            return None;
        }
        let mut trace_id = [0; 16];
        let mut span_id = [0; 8];
        let mut flags = [0; 1];
        hex_into(&text[3..35], &mut trace_id)?;
        hex_into(&text[36..52], &mut span_id)?;
        hex_into(&text[53..55], &mut flags)?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(Self {
            trace_id,
            span_id,
            flags: flags[0],
        })
    }

    /// The `traceparent` header of a delivery, if it is a valid one in an
    /// AMQP string; any other type or value is `None`.
    pub fn from_headers(headers: Option<&FieldTable>) -> Option<Self> {
        match headers?.inner().get(HEADER)? {
            AMQPValue::LongString(s) => Self::parse(s.as_bytes()),
            AMQPValue::ShortString(s) => Self::parse(s.as_str().as_bytes()),
            _ => None,
        }
    }

    /// A new trace: random trace and span ids, sampled.
    fn root() -> Self {
        Self {
            trace_id: nonzero_u128().to_be_bytes(),
            span_id: nonzero_u64().to_be_bytes(),
            flags: 1,
        }
    }

    /// A span under this one: same trace and flags, a new span id.
    fn child(self) -> Self {
        Self {
            span_id: nonzero_u64().to_be_bytes(),
            ..self
        }
    }

    /// The trace id as 32 lowercase hex digits.
    pub fn trace_id(&self) -> String {
        hex(&self.trace_id)
    }

    /// The span id as 16 lowercase hex digits.
    pub fn span_id(&self) -> String {
        hex(&self.span_id)
    }

    /// As the OpenTelemetry API's remote parent.
    fn remote_context(self) -> Context {
        Context::new().with_remote_span_context(SpanContext::new(
            TraceId::from_bytes(self.trace_id),
            SpanId::from_bytes(self.span_id),
            TraceFlags::new(self.flags),
            true,
            TraceState::NONE,
        ))
    }

    fn of_span(context: &SpanContext) -> Option<Self> {
        context.is_valid().then(|| Self {
            trace_id: context.trace_id().to_bytes(),
            span_id: context.span_id().to_bytes(),
            flags: context.trace_flags().to_u8(),
        })
    }
}

impl fmt::Display for TraceParent {
    /// The header value: `00-<trace id>-<span id>-<flags>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "00-{}-{}-{:02x}",
            hex(&self.trace_id),
            hex(&self.span_id),
            self.flags
        )
    }
}

impl fmt::Debug for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

fn hex_into(text: &[u8], out: &mut [u8]) -> Option<()> {
    fn digit(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        }
    }
    for (byte, pair) in out.iter_mut().zip(text.chunks_exact(2)) {
        *byte = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(())
}

fn hex(bytes: &[u8]) -> String {
    use fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

fn nonzero_u128() -> u128 {
    loop {
        let n: u128 = rand::random();
        if n != 0 {
            return n;
        }
    }
}

fn nonzero_u64() -> u64 {
    loop {
        let n: u64 = rand::random();
        if n != 0 {
            return n;
        }
    }
}

/// Where spans go: nowhere ([`Traces::off`], the default), or to an OTLP/HTTP
/// endpoint through the SDK's batch processor (its own thread: the export's
/// blocking client never runs on the async runtime).
#[derive(Clone, Default)]
pub struct Traces {
    exporting: Option<Arc<Exporting>>,
}

struct Exporting {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

impl fmt::Debug for Traces {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.is_on() {
            "Traces(otlp)"
        } else {
            "Traces(off)"
        })
    }
}

/// The endpoint variables, signal-specific first (the SDK reads them too).
const ENDPOINT_VARIABLES: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// The one proxy the exporter goes through (urutan's own; the standard
/// proxy variables are ignored).
const PROXY_VARIABLE: &str = "OTEL_EXPORTER_OTLP_PROXY";

/// The timeout variables (milliseconds), signal-specific first.
const TIMEOUT_VARIABLES: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
    "OTEL_EXPORTER_OTLP_TIMEOUT",
];

/// The protocol variables: only `http/protobuf` is built in.
const PROTOCOL_VARIABLES: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
];

impl Traces {
    /// No exporter: contexts are carried, no span is recorded or sent.
    pub fn off() -> Self {
        Self::default()
    }

    /// From the standard OTEL_* variables: off unless
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`)
    /// is set and `OTEL_SDK_DISABLED` is not `true`; the SDK reads the rest
    /// (headers, timeout, sampler, batch sizes, resource attributes). The
    /// service name is `urutan` unless `OTEL_SERVICE_NAME` or
    /// `OTEL_RESOURCE_ATTRIBUTES` names one. `Err` is one line naming the
    /// variable and the fix (never its value: it may carry a token).
    pub fn from_env() -> Result<Self, String> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// [`Self::from_env`] with the variables read through `var`.
    fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let set = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        if set("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(Self::off());
        }
        let Some((name, endpoint)) = ENDPOINT_VARIABLES
            .iter()
            .find_map(|name| set(name).map(|v| (*name, v)))
        else {
            return Ok(Self::off());
        };
        check_endpoint(name, &endpoint)?;
        for name in PROTOCOL_VARIABLES {
            if let Some(protocol) = set(name)
                && protocol.trim() != "http/protobuf"
            {
                return Err(format!(
                    "{name} must be http/protobuf (the only OTLP protocol built in); unset it or set it to http/protobuf"
                ));
            }
        }
        install_crypto();
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(http_client(&var)?)
            .build()
            .map_err(|e| format!("cannot build the OTLP trace exporter from the OTEL_* variables: {e}; fix them, or unset {name} to export no traces"))?;
        let default_name = set("OTEL_SERVICE_NAME").is_none()
            && !set("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|a| a.contains("service.name="));
        Ok(Self::exporting(exporter, default_name))
    }

    /// Exports to the OTLP/HTTP traces URL `endpoint` (e.g.
    /// `http://127.0.0.1:4318/v1/traces`), as service `urutan` (tests, and a
    /// binary that configures it in code; the other OTEL_* variables still apply).
    pub fn otlp_http(endpoint: &str) -> Result<Self, String> {
        use opentelemetry_otlp::WithExportConfig;
        check_endpoint("the OTLP endpoint", endpoint)?;
        install_crypto();
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(http_client(&|name| std::env::var(name).ok())?)
            .with_endpoint(endpoint)
            .build()
            .map_err(|e| format!("cannot build the OTLP trace exporter: {e}"))?;
        Ok(Self::exporting(exporter, true))
    }

    fn exporting(exporter: opentelemetry_otlp::SpanExporter, default_name: bool) -> Self {
        let mut resource = opentelemetry_sdk::Resource::builder();
        if default_name {
            resource = resource.with_service_name("urutan");
        }
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource.build())
            .build();
        let tracer = provider.tracer("urutan");
        Self {
            exporting: Some(Arc::new(Exporting { provider, tracer })),
        }
    }

    /// Whether spans are exported.
    pub fn is_on(&self) -> bool {
        self.exporting.is_some()
    }

    /// Starts span `name` under `parent` (a remote context), or a new trace
    /// without one. It ends when dropped.
    pub fn start(&self, name: &'static str, kind: SpanKind, parent: Option<TraceParent>) -> Span {
        let Some(exporting) = &self.exporting else {
            let context = parent.map_or_else(TraceParent::root, TraceParent::child);
            return Span {
                context,
                recording: None,
            };
        };
        let parent_context = parent.map_or_else(Context::new, TraceParent::remote_context);
        let span = exporting
            .tracer
            .span_builder(name)
            .with_kind(kind)
            .start_with_context(&exporting.tracer, &parent_context);
        // The SDK always draws valid ids; should it not, the span still
        // carries a context of its own.
        let context = TraceParent::of_span(span.span_context())
            .unwrap_or_else(|| parent.map_or_else(TraceParent::root, TraceParent::child));
        Span {
            context,
            recording: Some(span),
        }
    }

    /// Exports the spans ended so far (blocking: call it off the async
    /// runtime, e.g. in `spawn_blocking`). Nothing to do when off.
    pub fn flush(&self) {
        if let Some(exporting) = &self.exporting
            && let Err(e) = exporting.provider.force_flush()
        {
            tracing::warn!(error = %e, "cannot export the last spans");
        }
    }

    /// Exports what is left and stops the exporter (blocking, as [`Self::flush`]).
    pub fn shutdown(&self) {
        if let Some(exporting) = &self.exporting
            && let Err(e) = exporting.provider.shutdown()
        {
            tracing::warn!(error = %e, "cannot export the last spans");
        }
    }
}

/// The exporter's HTTP client (for an `https://` collector) needs the
/// process's rustls provider: ring, as for the webhooks (installed once; a
/// provider installed earlier stays).
fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The exporter's blocking HTTP client: the timeout of the OTEL_* variables
/// (10 s by default), and no proxy but `OTEL_EXPORTER_OTLP_PROXY`'s, which
/// `NO_PROXY` (or `no_proxy`) bypasses for the hosts it lists. Built on a
/// thread of its own: a blocking client must not be built on the async
/// runtime. `Err` names the variable, never its value.
fn http_client(var: &impl Fn(&str) -> Option<String>) -> Result<reqwest::blocking::Client, String> {
    let set = |name: &str| var(name).filter(|v| !v.trim().is_empty());
    let timeout = TIMEOUT_VARIABLES
        .iter()
        .find_map(|name| set(name)?.trim().parse::<u64>().ok())
        .map_or(
            std::time::Duration::from_secs(10),
            std::time::Duration::from_millis,
        );
    let proxy = match set(PROXY_VARIABLE) {
        None => None,
        Some(url) => {
            check_proxy(&url)?;
            let no_proxy = set("NO_PROXY").or_else(|| set("no_proxy"));
            let proxy = reqwest::Proxy::all(url.trim())
                .map_err(|_| format!("{PROXY_VARIABLE} is not a usable proxy URL"))?
                .no_proxy(no_proxy.as_deref().and_then(reqwest::NoProxy::from_string));
            Some(proxy)
        }
    };
    std::thread::Builder::new()
        .name("otlp-client".into())
        .spawn(move || {
            let builder = reqwest::blocking::Client::builder().no_proxy();
            let builder = match proxy {
                Some(proxy) => builder.proxy(proxy),
                None => builder,
            };
            builder.timeout(timeout).build()
        })
        .map_err(|e| format!("cannot start the OTLP exporter's client: {e}"))?
        .join()
        .map_err(|_| "cannot build the OTLP exporter's client".to_owned())?
        .map_err(|e| format!("cannot build the OTLP exporter's client: {e}"))
}

/// `OTEL_EXPORTER_OTLP_PROXY` must be an `http://` or `https://` URL with a host.
fn check_proxy(url: &str) -> Result<(), String> {
    let ok = url::Url::parse(url.trim())
        .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{PROXY_VARIABLE} is not an http:// or https:// URL; set it to the proxy spans must go through (e.g. http://proxy:3128), or unset it to reach the collector directly"
        ))
    }
}

/// An OTLP/HTTP endpoint must be an `http://` or `https://` URL with a host.
fn check_endpoint(name: &str, endpoint: &str) -> Result<(), String> {
    let ok = url::Url::parse(endpoint.trim())
        .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name} is not an http:// or https:// URL; set it to the collector's OTLP/HTTP address (e.g. http://localhost:4318), or unset it to export no traces"
        ))
    }
}

/// One span: its context (what goes into the next `traceparent`), and the
/// SDK's span when exported. Attributes and events cost nothing when off.
pub struct Span {
    context: TraceParent,
    recording: Option<opentelemetry_sdk::trace::Span>,
}

impl Span {
    /// This span as the parent of the next hop.
    pub fn traceparent(&self) -> TraceParent {
        self.context
    }

    /// Whether attributes are recorded (compute costly ones only then).
    pub fn is_recording(&self) -> bool {
        self.recording.is_some()
    }

    /// Sets attribute `key`.
    pub fn set(&mut self, key: &'static str, value: impl Into<Value>) {
        if let Some(span) = &mut self.recording {
            span.set_attribute(KeyValue::new(key, value.into()));
        }
    }

    /// Adds event `name` (a hold, a parking, a retry...).
    pub fn event(&mut self, name: &'static str) {
        if let Some(span) = &mut self.recording {
            span.add_event(name, Vec::new());
        }
    }

    /// Marks the span failed with `description` (no payload, no secret).
    pub fn fail(&mut self, description: &str) {
        if let Some(span) = &mut self.recording {
            span.set_status(Status::error(description.to_owned()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::{LongString, ShortString};

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_round_trips() {
        let parsed = TraceParent::parse(VALID.as_bytes()).expect("valid");
        assert_eq!(parsed.to_string(), VALID);
        assert_eq!(parsed.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(parsed.span_id(), "00f067aa0ba902b7");
    }

    #[test]
    fn hostile_values_are_refused() {
        let refused = [
            "",
            "00",
            &VALID[..54],
            &format!("{VALID}0"),
            &VALID.replace("4bf9", "4BF9"),
            &VALID.replace("4bf9", "4bg9"),
            &VALID.replacen("00-", "01-", 1),
            &VALID.replacen("00-", "ff-", 1),
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x",
            "00-4bf92f3577b34da6a3ce929d0e0e473é-00f067aa0ba902b-01",
        ];
        for text in refused {
            assert_eq!(TraceParent::parse(text.as_bytes()), None, "{text:?}");
        }
        assert_eq!(TraceParent::parse(&vec![b'0'; 1 << 20]), None);
    }

    #[test]
    fn only_an_amqp_string_header_is_read() {
        let with = |value: AMQPValue| {
            let mut table = FieldTable::default();
            table.insert(HEADER.into(), value);
            TraceParent::from_headers(Some(&table))
        };
        let expected = TraceParent::parse(VALID.as_bytes());
        assert_eq!(
            with(AMQPValue::LongString(LongString::from(VALID))),
            expected
        );
        assert_eq!(
            with(AMQPValue::ShortString(ShortString::from(VALID))),
            expected
        );
        assert_eq!(with(AMQPValue::LongLongInt(7)), None);
        assert_eq!(with(AMQPValue::FieldTable(FieldTable::default())), None);
        assert_eq!(TraceParent::from_headers(None), None);
        assert_eq!(
            TraceParent::from_headers(Some(&FieldTable::default())),
            None
        );
    }

    #[test]
    fn without_an_exporter_spans_still_carry_the_trace() {
        let traces = Traces::off();
        let parent = TraceParent::parse(VALID.as_bytes()).expect("valid");
        let child = traces.start("apply", SpanKind::Consumer, Some(parent));
        assert!(!child.is_recording());
        let child = child.traceparent();
        assert_eq!(child.trace_id(), parent.trace_id());
        assert_ne!(child.span_id(), parent.span_id());
        assert_eq!(
            TraceParent::parse(child.to_string().as_bytes()),
            Some(child)
        );
        let root = traces
            .start("publish", SpanKind::Producer, None)
            .traceparent();
        assert_ne!(root.trace_id(), parent.trace_id());
        assert!(root.to_string().ends_with("-01"), "a new trace is sampled");
    }

    #[test]
    fn settings_from_the_environment() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        let off = Traces::from_lookup(env(&[])).expect("unset is off");
        assert!(!off.is_on(), "no endpoint, no exporter");
        let disabled = Traces::from_lookup(env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("OTEL_SDK_DISABLED", "true"),
        ]));
        assert!(!disabled.expect("disabled").is_on());
        let wrong = Traces::from_lookup(env(&[(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "collector:4318 secret-token",
        )]));
        let why = wrong.expect_err("not a URL");
        assert!(why.contains("OTEL_EXPORTER_OTLP_ENDPOINT"), "{why}");
        assert!(
            !why.contains("secret-token"),
            "the value is not echoed: {why}"
        );
        let grpc = Traces::from_lookup(env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ]));
        assert!(grpc.expect_err("grpc").contains("http/protobuf"));
        let proxy = Traces::from_lookup(env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("OTEL_EXPORTER_OTLP_PROXY", "proxy:3128 pw-proxy-secret"),
        ]));
        let why = proxy.expect_err("not a proxy URL");
        assert!(why.contains("OTEL_EXPORTER_OTLP_PROXY"), "{why}");
        assert!(!why.contains("pw-proxy-secret"), "not echoed: {why}");
        let through = Traces::from_lookup(env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("OTEL_EXPORTER_OTLP_PROXY", "http://u:pw@127.0.0.1:3128"),
            ("NO_PROXY", "collector.internal"),
        ]));
        assert!(through.expect("a proxy").is_on());
    }
}
