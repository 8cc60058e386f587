//! Times for people, as the screens of `urutan status` and `urutan explain`
//! show them.

use chrono::{DateTime, Utc};

/// A wall-clock time for people.
pub fn when(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// How long ago `since` was, in the largest fitting unit ("42 s", "7 min",
/// "3 h", "2 d").
pub fn age(now: DateTime<Utc>, since: DateTime<Utc>) -> String {
    let s = (now - since).num_seconds().max(0);
    match s {
        0..120 => format!("{s} s"),
        120..7_200 => format!("{} min", s / 60),
        7_200..172_800 => format!("{} h", s / 3_600),
        _ => format!("{} d", s / 86_400),
    }
}
