//! Times in the commands' JSON and text output: RFC 3339, UTC, milliseconds
//! (`2026-12-02T04:17:43.512Z`). One format for `status`, `explain` and
//! `dlq`; use with `#[serde(serialize_with = "crate::rfc3339::one")]`.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serializer;

/// The text of `t`.
pub fn text(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// Serializes a time as its text.
pub fn one<S: Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&text(t))
}

/// Serializes an optional time as its text, or null.
pub fn option<S: Serializer>(t: &Option<DateTime<Utc>>, s: S) -> Result<S::Ok, S::Error> {
    match t {
        Some(t) => one(t, s),
        None => s.serialize_none(),
    }
}
