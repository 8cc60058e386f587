//! The effects (webhooks) on the screens for people: a line of `urutan
//! status`, and an order's effects in `urutan explain`. Endpoints come
//! redacted from [`urutan::effects::read`].

use std::fmt;

use chrono::{DateTime, Utc};

use super::clock::{age, when};
use super::explain::Explanation;
use super::status::Status;
use urutan::effects::read::State;

/// `effects      3 pending, the oldest 2m old; 2 dead-lettered (1 unresolved)`.
pub(crate) fn status_line(status: &Status, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    let Some(e) = &status.effects else {
        return writeln!(
            f,
            "{:<13}unknown (no effect tables, or not read)",
            "effects"
        );
    };
    let oldest = e.oldest_pending_at.map_or(String::new(), |t| {
        format!(", the oldest {} old", age(status.checked_at, t))
    });
    let released = e.dead_lettered - e.unresolved;
    let dead = match (e.dead_lettered, released) {
        (0, _) => "none dead-lettered".to_owned(),
        (n, 0) => format!("{n} dead-lettered (`urutan dlq list --effects`)"),
        (n, r) => format!("{n} dead-lettered, {r} of them released (`urutan dlq list --effects`)"),
    };
    writeln!(f, "{:<13}{} pending{oldest}; {dead}", "effects", e.pending)
}

/// Most effects of one order listed (the first, in the order they go).
pub(crate) const EFFECTS_LISTED: i64 = 200;

/// The order's effects, one line each, in the order they go.
pub(crate) fn explain_lines(
    found: &Explanation,
    now: DateTime<Utc>,
    f: &mut fmt::Formatter<'_>,
) -> fmt::Result {
    let Some(effects) = &found.effects else {
        return Ok(());
    };
    if effects.is_empty() {
        return Ok(());
    }
    writeln!(f)?;
    writeln!(f, "effects (webhooks, in the order they go):")?;
    writeln!(
        f,
        "{:>8}  {:<8} {:<40} state",
        "effect", "versi", "endpoint"
    )?;
    for e in effects {
        let state = match &e.state {
            State::Sent { at, code } => format!(
                "sent{}{}",
                code.map_or(String::new(), |c| format!(" (HTTP {c})")),
                at.map_or(String::new(), |t| format!(
                    " {} ({} ago)",
                    when(t),
                    age(now, t)
                ))
            ),
            State::Pending {
                attempts: 0,
                next_try_secs,
                ..
            } => format!("pending (not tried yet; {})", next(*next_try_secs)),
            State::Pending {
                attempts,
                next_try_secs,
                last,
            } => format!(
                "pending ({attempts} attempt(s), last {}; {})",
                last.as_deref().unwrap_or("-"),
                next(*next_try_secs)
            ),
            State::Held { behind } => {
                format!("held (waits behind the dead-lettered effect {behind})")
            }
            State::DeadLettered { answer, holding } => format!(
                "dead-lettered ({answer}){}",
                if *holding {
                    "; holds the later effects"
                } else {
                    ""
                }
            ),
        };
        let line = format!(
            "{:>8}  {:<8} {:<40} {state}",
            e.effect,
            format!("v{}", e.versi),
            e.endpoint
        );
        writeln!(f, "{}", crate::terminal::Clean(&line))?;
    }
    if i64::try_from(effects.len()).unwrap_or(i64::MAX) >= EFFECTS_LISTED {
        writeln!(f, "(the first {EFFECTS_LISTED} effects only)")?;
    }
    Ok(())
}

/// When the next try is, for a person.
fn next(secs: f64) -> String {
    if secs < 1.0 {
        "due now".to_owned()
    } else {
        format!("next try in {secs:.0}s")
    }
}
