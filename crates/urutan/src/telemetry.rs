//! Logs: text for people, JSON for machines; level from `RUST_LOG` (default `info`).
//! Spans carry shard, message id, entity id and redelivered; never a payload or secret.
//!
//! Two rules hold whatever `RUST_LOG` says:
//! - nothing that could print a payload or a password (see `may_leak`);
//! - no ERROR for an answer urutan asked for: lapin logs every channel the
//!   broker closes at ERROR, including the ones closed by a passive probe of
//!   an object that does not exist yet (the shard queues, the restart
//!   sentinel) and by a declare this user may not make. urutan gets the same
//!   answer back from the call and decides what it means (a probe's "no",
//!   or a refusal it reports itself, see `is_answered_declare`). Every
//!   other lapin error still shows.
//!
//! Where lines go: standard error, one whole line at a time. While a
//! progress bar is on screen ([`print_above`]), above it instead of through
//! it; while diverted to a file ([`divert`]), to that file, and only the
//! most severe ones to the screen too (`urutan demo`, whose screen is for
//! the person watching).

use std::fs::File;
use std::io::Write;
use std::sync::Mutex;

use tracing::level_filters::LevelFilter;
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::filter::{EnvFilter, FilterExt, filter_fn};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::{Context, Filter, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, fmt};

use crate::config::LogFormat;

/// Without `RUST_LOG`: info.
const DEFAULT_FILTER: &str = "info";

/// Without `RUST_LOG`, for commands whose output is a report on standard
/// output (`urutan status`, `urutan explain`): warnings and errors only.
const REPORT_FILTER: &str = "warn";

/// Logs that would print a payload or a password whatever `RUST_LOG` asks:
/// lapin's returned messages (the whole message) and lapin's TRACE frame
/// dumps (bodies, and the SASL response that holds the broker password).
fn may_leak(meta: &Metadata<'_>) -> bool {
    let target = meta.target();
    target.starts_with("lapin::returned_messages")
        || (target.starts_with("lapin") && *meta.level() == tracing::Level::TRACE)
}

/// Installs the global subscriber (once; later calls are ignored).
pub fn init(format: LogFormat) {
    init_with(format, DEFAULT_FILTER);
}

/// [`init`] for a command that reports on standard output: without
/// `RUST_LOG`, only warnings and errors are logged (to standard error).
pub fn init_for_reports(format: LogFormat) {
    init_with(format, REPORT_FILTER);
}

fn init_with(format: LogFormat, default_filter: &str) {
    let (env, malformed) = env_filter(default_filter);
    // The hint keeps the combined filter from disabling every level.
    let safe = filter_fn(|meta| !may_leak(meta)).with_max_level_hint(LevelFilter::TRACE);
    let filter = env.and(safe).and(AnsweredDeclares);
    let layer = match format {
        LogFormat::Text => fmt::layer()
            .with_ansi(colours_wanted())
            .with_writer(AboveBar)
            .boxed(),
        LogFormat::Json => fmt::layer()
            .json()
            .flatten_event(true)
            .with_writer(AboveBar)
            .boxed(),
    };
    let installed = tracing_subscriber::registry()
        .with(layer.with_filter(filter))
        .try_init();
    if let (Ok(()), Some(why)) = (installed, malformed) {
        tracing::warn!("RUST_LOG is malformed ({why}); logging at `{default_filter}` instead");
    }
}

/// The filter `RUST_LOG` asks for, or `default_filter` without it; with
/// why `RUST_LOG` was not used when it is set but cannot be read.
fn env_filter(default_filter: &str) -> (EnvFilter, Option<String>) {
    let fallback = || EnvFilter::new(default_filter);
    match std::env::var("RUST_LOG") {
        Ok(text) if !text.trim().is_empty() => match EnvFilter::builder().parse(&text) {
            Ok(filter) => (filter, None),
            Err(e) => (fallback(), Some(e.to_string())),
        },
        Ok(_) | Err(std::env::VarError::NotPresent) => (fallback(), None),
        Err(std::env::VarError::NotUnicode(_)) => (fallback(), Some("not UTF-8".into())),
    }
}

/// Colours only for a person: standard error is a terminal and `NO_COLOR`
/// is unset (or empty, <https://no-color.org>).
fn colours_wanted() -> bool {
    use std::io::IsTerminal;
    let no_colour = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    !no_colour && std::io::stderr().is_terminal()
}

/// Drops lapin's ERROR "Channel closed" events for a declare the broker
/// answered with 404 NOT_FOUND (a passive probe of an object that does not
/// exist) or 403 ACCESS_REFUSED (a declare this user may not make).
struct AnsweredDeclares;

impl<S: Subscriber> Filter<S> for AnsweredDeclares {
    fn enabled(&self, _: &Metadata<'_>, _: &Context<'_, S>) -> bool {
        true
    }

    fn event_enabled(&self, event: &Event<'_>, _: &Context<'_, S>) -> bool {
        let meta = event.metadata();
        if !meta.target().starts_with("lapin") || *meta.level() != tracing::Level::ERROR {
            return true;
        }
        let mut fields = LapinClose::default();
        event.record(&mut fields);
        !is_answered_declare(&fields.message, &fields.method)
            && !is_connection_failure(meta.target(), &fields)
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::TRACE)
    }
}

/// The fields of lapin's "Channel closed" event, as text.
#[derive(Default)]
struct LapinClose {
    message: String,
    method: String,
    error: String,
}

impl tracing::field::Visit for LapinClose {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            "method" => self.method = format!("{value:?}"),
            "error" => self.error = format!("{value:?}"),
            _ => {}
        }
    }
}

/// Whether lapin's event (`message`, and the `Debug` of the broker's
/// `channel.close` method) reports the broker's answer to an
/// `exchange.declare` or `queue.declare` (class 40 or 50, method 10): 404
/// (only a passive declare gets it: the probe's "does not exist") or 403
/// (the user may not configure it: the caller reports what to do). A 404 or
/// 403 on anything else (a publish, a consume, a bind) is not matched.
fn is_answered_declare(message: &str, method: &str) -> bool {
    let declare = method.contains("class_id: 40, method_id: 10")
        || method.contains("class_id: 50, method_id: 10");
    let answer = method.contains("reply_code: 404,") || method.contains("reply_code: 403,");
    message == "Channel closed" && method.starts_with("Close {") && declare && answer
}

/// Whether lapin's event reports its connection failing (the broker closed
/// it, e.g. a refused login or an unknown vhost; or the link broke):
/// lapin hands the same error back to the call, and urutan says what it
/// means in one line (a refusal stops the command, an outage is one line
/// per change, see `heal`), so lapin's own lines (three per attempt, with
/// its internals) are dropped.
fn is_connection_failure(target: &str, fields: &LapinClose) -> bool {
    let LapinClose {
        message,
        method,
        error,
    } = fields;
    let connection_closed = target == "lapin::channel"
        && message == "Connection closed"
        && method.starts_with("Close {")
        && (method.contains("reply_code: 403,")
            || method.contains("reply_code: 530,")
            || method.contains("reply_code: 320,"));
    // The broker's close-ok to a connection it closed itself: lapin did
    // not expect it, and says so twice.
    let late_close_ok =
        target == "lapin::channel" && error.contains("unexpected connection close-ok");
    connection_closed
        || late_close_ok
        || (target == "lapin::channels" && message == "Connection error")
        || (target == "lapin::io_loop" && message.starts_with("Exponential backoff attempts"))
}

/// Where log lines go besides standard error, and what of them.
struct Route {
    /// While a progress bar is on screen: runs a write with the bar cleared
    /// and draws it again afterwards (indicatif's `ProgressBar::suspend`).
    bar: Option<Suspend>,
    /// The file every line goes to, and the least severe level that still
    /// shows on screen as well, while diverted.
    file: Option<(File, Level)>,
}

static ROUTE: Mutex<Route> = Mutex::new(Route {
    bar: None,
    file: None,
});

fn route() -> std::sync::MutexGuard<'static, Route> {
    // Nothing panics while holding the lock; a poisoned one is still consistent.
    ROUTE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs one write while the screen's progress bar is out of the way.
pub type Suspend = Box<dyn Fn(&mut dyn FnMut()) + Send>;

/// Until the guard drops, log lines are printed above a progress bar
/// instead of into it: `suspend` clears the bar, runs the write and draws it
/// again (with indicatif: `move |write| bar.suspend(write)`).
pub fn print_above(suspend: impl Fn(&mut dyn FnMut()) + Send + 'static) -> BarGuard {
    route().bar = Some(Box::new(suspend));
    BarGuard(())
}

/// See [`print_above`].
#[must_use = "log lines go above the bar only while the guard lives"]
pub struct BarGuard(());

impl Drop for BarGuard {
    fn drop(&mut self) {
        route().bar = None;
    }
}

/// Until the guard drops, every log line goes to `file` (without colour
/// codes), and only lines at `screen` or more severe also to standard error.
pub fn divert(file: File, screen: Level) -> DivertGuard {
    route().file = Some((file, screen));
    DivertGuard(())
}

/// See [`divert`].
#[must_use = "log lines go to the file only while the guard lives"]
pub struct DivertGuard(());

impl Drop for DivertGuard {
    fn drop(&mut self) {
        route().file = None;
    }
}

/// Standard error (or the diverted file), one whole log line at a time.
struct AboveBar;

impl<'a> MakeWriter<'a> for AboveBar {
    type Writer = LineWriter;

    fn make_writer(&'a self) -> Self::Writer {
        LineWriter {
            line: Vec::with_capacity(256),
            level: Level::ERROR,
        }
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> Self::Writer {
        LineWriter {
            line: Vec::with_capacity(256),
            level: *meta.level(),
        }
    }
}

/// Collects one formatted event; writes it when dropped.
struct LineWriter {
    line: Vec<u8>,
    level: Level,
}

impl Write for LineWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.line.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for LineWriter {
    fn drop(&mut self) {
        if self.line.is_empty() {
            return;
        }
        // Nowhere to report a failed log write: the lines are dropped.
        let mut route = route();
        if let Some((file, screen)) = &mut route.file {
            let _ = file.write_all(&without_colours(&self.line));
            // Level orders by verbosity: ERROR is the least.
            if self.level > *screen {
                return;
            }
        }
        let mut write = || {
            let _ = std::io::stderr().lock().write_all(&self.line);
        };
        match &route.bar {
            Some(suspend) => suspend(&mut write),
            None => write(),
        }
    }
}

/// `line` without ANSI colour codes (`ESC [ ... m`).
fn without_colours(line: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(line.len());
    let mut i = 0;
    while i < line.len() {
        if line[i] == 0x1b && line.get(i + 1) == Some(&b'[') {
            i += 2;
            while i < line.len() && !line[i].is_ascii_alphabetic() {
                i += 1;
            }
            i += 1;
        } else {
            out.push(line[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lapin_payload_logs_are_always_filtered() {
        use tracing::callsite::Identifier;
        struct Cs;
        impl tracing::Callsite for Cs {
            fn set_interest(&self, _: tracing::subscriber::Interest) {}
            fn metadata(&self) -> &Metadata<'_> {
                unreachable!()
            }
        }
        static CS: Cs = Cs;
        let meta = |target: &'static str, level| {
            Metadata::new(
                "e",
                target,
                level,
                None,
                None,
                None,
                tracing::field::FieldSet::new(&[], Identifier(&CS)),
                tracing::metadata::Kind::EVENT,
            )
        };
        assert!(may_leak(&meta(
            "lapin::returned_messages",
            tracing::Level::WARN
        )));
        assert!(may_leak(&meta("lapin::io_loop", tracing::Level::TRACE)));
        assert!(!may_leak(&meta("lapin::io_loop", tracing::Level::DEBUG)));
        assert!(!may_leak(&meta("urutan::shard", tracing::Level::TRACE)));
    }

    /// The `Debug` of lapin's `channel.close` method, as lapin 4 prints it.
    fn close(code: u16, text: &str, class_id: u16, method_id: u16) -> String {
        format!(
            "Close {{ reply_code: {code}, reply_text: ShortString({text:?}), class_id: \
             {class_id}, method_id: {method_id} }}"
        )
    }

    #[test]
    fn colour_codes_stay_out_of_files() {
        let line = b"\x1b[2m2026\x1b[0m \x1b[32m INFO\x1b[0m urutan: hello\n";
        assert_eq!(without_colours(line), b"2026  INFO urutan: hello\n");
    }

    #[test]
    fn only_answered_declares_are_dropped() {
        let closed = "Channel closed";
        let probe = close(
            404,
            "NOT_FOUND - no queue 'pesanan.shard-004' in vhost '/'",
            50,
            10,
        );
        assert!(is_answered_declare(closed, &probe));
        let sentinel = close(
            404,
            "NOT_FOUND - no exchange 'pesanan.alive' in vhost '/'",
            40,
            10,
        );
        assert!(is_answered_declare(closed, &sentinel));
        let refused = close(
            403,
            "ACCESS_REFUSED - access to exchange 'pesanan.dlx'",
            40,
            10,
        );
        assert!(is_answered_declare(closed, &refused));
        // Real failures stay: a publish to a missing exchange (basic.publish
        // is 60/40), a refused consume (60/20), an ack timeout (406 on
        // basic.ack), a mismatch on declare (406), a connection close.
        let publish = close(404, "NOT_FOUND - no exchange 'pesanan'", 60, 40);
        assert!(!is_answered_declare(closed, &publish));
        let consume = close(403, "ACCESS_REFUSED - access to queue", 60, 20);
        assert!(!is_answered_declare(closed, &consume));
        let timeout = close(406, "PRECONDITION_FAILED - delivery acknowledgement", 0, 0);
        assert!(!is_answered_declare(closed, &timeout));
        let mismatch = close(406, "PRECONDITION_FAILED - inequivalent arg", 50, 10);
        assert!(!is_answered_declare(closed, &mismatch));
        assert!(!is_answered_declare("Connection closed", &probe));
    }
}
