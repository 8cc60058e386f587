//! The story of an order's versions, told from an [`Explanation`]: one line
//! per thing that happened to a version (applied, parked, dead-lettered,
//! still in the outbox or a queue, stale) and, for a version nothing
//! happened to, why it is missing as far as urutan knows. Pure.

use std::fmt;

use chrono::{DateTime, Utc};

use super::clock::{age, when};
use super::explain::Explanation;
use urutan::outbox::OrderRow;

/// One line of the story.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// The version, or the first of a run of missing versions.
    pub versi: i64,
    /// The last version of the run (same as `versi` for one version).
    pub through: i64,
    /// `applied`, `parked`, `dead-lettered`, `unsent`, `set-aside`,
    /// `queued`, `stale`, `missing`.
    pub what: &'static str,
    pub shard: Option<i32>,
    pub epoch: String,
    pub message_id: String,
    pub at: Option<DateTime<Utc>>,
    pub note: String,
}

/// Every version from the lowest to the highest one known, in order; a run
/// of versions between two known ones is one "missing" line.
pub fn lines(x: &Explanation, now: DateTime<Utc>) -> Vec<Line> {
    let outbox = x.outbox.as_deref().unwrap_or_default();
    let dead = x.dead_letters.as_deref().unwrap_or_default();
    let mut known: Vec<i64> = x
        .applied
        .iter()
        .map(|a| a.versi)
        .chain(x.parked.iter().map(|p| p.versi))
        .chain(dead.iter().filter_map(|d| d.versi))
        .chain(x.skips.iter().filter_map(|s| s.versi))
        .chain(x.stale.iter().map(|s| s.versi))
        .chain(outbox.iter().filter_map(|o| o.versi))
        .chain(x.state.iter().map(|s| s.versi))
        .collect();
    known.sort_unstable();
    known.dedup();
    let stored = x.state.as_ref().map_or(0, |s| s.versi);
    let mut lines = Vec::new();
    let mut previous: Option<i64> = None;
    for v in known {
        if let Some(p) = previous.filter(|p| v > p + 1) {
            // Nothing is known between two known versions: the story of
            // the run is the same for each (see `missing`).
            lines.push(Line {
                what: "missing",
                through: v - 1,
                note: missing(x, stored, p + 1),
                ..line(p + 1)
            });
        }
        previous = Some(v);
        lines.extend(version(x, stored, v, now));
    }
    lines
}

/// What happened to known version `v`.
fn version(x: &Explanation, stored: i64, v: i64, now: DateTime<Utc>) -> Vec<Line> {
    let outbox = x.outbox.as_deref().unwrap_or_default();
    let dead = x.dead_letters.as_deref().unwrap_or_default();
    let applied = x.applied.iter().find(|a| a.versi == v);
    let parked: Vec<_> = x.parked.iter().filter(|p| p.versi == v).collect();
    let mut told = Vec::new();
    if let Some(a) = applied {
        // The stored state's epoch is that of its last applied version;
        // earlier ones have only a bound (see `explain`).
        let epoch = match &x.state {
            Some(s) if s.versi == v => s.epoch.to_string(),
            _ => a.epoch_at_most.map_or("-".into(), |e| format!("<={e}")),
        };
        told.push(Line {
            what: "applied",
            shard: Some(a.shard),
            epoch,
            message_id: a.message_id.clone(),
            at: Some(a.at),
            note: format!("status {}", a.status),
            ..line(v)
        });
    }
    for p in &parked {
        let retrying = x.retrying.iter().find(|r| r.message_id == p.message_id);
        let (what, note) = match retrying {
            Some(r) => (
                "retrying",
                format!(
                    "set aside after a transient failure: attempt {}, next try {} (in {}); last \
                     error: {}",
                    r.attempts,
                    when(r.next_try),
                    age(r.next_try, now),
                    r.last_error.as_deref().unwrap_or("-")
                ),
            ),
            None if x.hold.is_some() && v > stored => {
                ("held", "waits: its order is on hold (see above)".to_owned())
            }
            None => ("parked", waits(x, stored, v, p.epoch)),
        };
        told.push(Line {
            what,
            shard: Some(p.shard),
            epoch: p.epoch.to_string(),
            message_id: p.message_id.clone(),
            at: Some(p.since),
            note,
            ..line(v)
        });
    }
    for s in x.skips.iter().filter(|s| s.versi == Some(v)) {
        let note = if s.reason == urutan::effects::hold::REASON {
            format!(
                "its dead-lettered effect held the order's later effects since {}, released \
                 without it by `urutan hold release --effects` ({})",
                when(s.held_since),
                s.error.as_deref().unwrap_or("-")
            )
        } else {
            format!(
                "on hold ({}) since {}, released without it by `urutan hold release`",
                s.reason,
                when(s.held_since)
            )
        };
        told.push(Line {
            what: "skipped",
            message_id: s.message_id.clone().unwrap_or_default(),
            at: Some(s.skipped_at),
            note,
            ..line(v)
        });
    }
    for d in dead.iter().filter(|d| d.versi == Some(v)) {
        told.push(dead_letter(d, v));
    }
    let stale: Vec<_> = x.stale.iter().filter(|s| s.versi == v).collect();
    for s in &stale {
        told.push(Line {
            what: "stale",
            shard: Some(s.shard),
            message_id: s.message_id.clone(),
            at: Some(s.at),
            note: "arrived after a newer version had been applied: processed, not written".into(),
            ..line(v)
        });
    }
    // A row the relay set aside is told whatever else happened to its
    // version: it waits for an operator.
    told.extend(
        outbox
            .iter()
            .filter(|o| o.versi == Some(v) && o.set_aside.is_some())
            .map(|o| outbox_row(o, v, now)),
    );
    if applied.is_none() && parked.is_empty() {
        told.extend(
            outbox
                .iter()
                .filter(|o| o.versi == Some(v) && o.set_aside.is_none())
                .filter(|o| !stale.iter().any(|s| s.message_id == o.id.to_string()))
                .map(|o| outbox_row(o, v, now)),
        );
    }
    if told.is_empty() {
        let note = if v == stored {
            "the stored state is at this version, but it has no history row".into()
        } else {
            missing(x, stored, v)
        };
        told.push(Line {
            what: "missing",
            note,
            ..line(v)
        });
    }
    told
}

/// Known version `v` as its outbox row `o` tells it: set aside by the
/// relay, or (nothing applied or parked) unsent, queued, or processed and
/// stale.
fn outbox_row(o: &OrderRow, v: i64, now: DateTime<Utc>) -> Line {
    if let Some(aside) = &o.set_aside {
        return Line {
            what: "set-aside",
            message_id: o.id.to_string(),
            at: Some(aside.at),
            note: set_aside_note(aside),
            ..line(v)
        };
    }
    let (what, at, note) = match (o.sent_at, o.processed) {
        (None, _) => (
            "unsent",
            o.written_at,
            "in the outbox, not published yet (is `urutan relay` running? see \
             `urutan status`)"
                .to_owned(),
        ),
        (Some(sent), false) => (
            "queued",
            sent,
            format!(
                "published {} ago, not processed yet: still in a shard queue or being \
                 handled",
                age(now, sent)
            ),
        ),
        (Some(sent), true) => (
            "stale",
            sent,
            "processed but not applied: a newer version had been applied when it arrived"
                .to_owned(),
        ),
    };
    Line {
        what,
        message_id: o.id.to_string(),
        at: Some(at),
        note,
        ..line(v)
    }
}

/// Why an outbox row was set aside, and what the operator does about it.
pub fn set_aside_note(aside: &urutan::outbox::SetAsideRow) -> String {
    format!(
        "outbox row set aside by the relay, never published: reason {}: {}; fix the row and \
         clear its unroutable_at to retry it, or delete it",
        aside.reason, aside.detail
    )
}

fn line(versi: i64) -> Line {
    Line {
        versi,
        through: versi,
        what: "",
        shard: None,
        epoch: "-".into(),
        message_id: "-".into(),
        at: None,
        note: String::new(),
    }
}

fn dead_letter(d: &urutan::store::dead_letter::Record, v: i64) -> Line {
    let mut note = format!("reason {}: {}", d.reason, d.detail);
    if let Some(e) = &d.last_error {
        note.push_str(&format!(" (last error: {e})"));
    }
    match d.resolved() {
        None => note.push_str(&format!(
            "; still in the DLQ: `urutan dlq show {}`",
            d.message_id.as_deref().unwrap_or("<id>")
        )),
        Some((at, how)) => note.push_str(&format!("; {how} {}", when(at))),
    }
    Line {
        what: "dead-lettered",
        shard: Some(d.shard),
        message_id: d.message_id.clone().unwrap_or_else(|| "-".into()),
        at: Some(d.dead_lettered_at),
        note,
        ..line(v)
    }
}

/// What a parked version `v` of epoch `epoch` waits for (the release rule of
/// `urutan_lepas`, see `handoff`).
fn waits(x: &Explanation, stored: i64, v: i64, epoch: i64) -> String {
    if v <= stored + 1 {
        return "the next version: applied at its shard's next release (every 200 ms while \
                its worker runs)"
            .into();
    }
    let behind: Vec<String> = x
        .positions
        .iter()
        .filter(|(_, passed)| *passed < epoch)
        .map(|(s, _)| format!("{s:03}"))
        .collect();
    let mut holding = Vec::new();
    if !behind.is_empty() {
        holding.push(format!(
            "shard(s) {} have not passed it yet",
            behind.join(", ")
        ));
    }
    for (reason, _) in &x.windows {
        holding.push(format!("a window is open ({reason})"));
    }
    for r in x
        .returned
        .iter()
        .filter(|r| r.versi > stored && r.versi < v)
    {
        holding.push(format!(
            "versi {} ({}) was handed back to shard {:03} after a failure at {} and is not back \
             yet (it is waited for whatever the epochs)",
            r.versi,
            r.message_id,
            r.shard,
            r.since.format("%Y-%m-%d %H:%M:%S UTC")
        ));
    }
    if holding.is_empty() {
        holding.push("neither holds now: released at its shard's next release".into());
    }
    format!(
        "waits for versi {} (the next version) or for every shard to pass epoch {epoch} with no \
         window open: {}",
        stored + 1,
        holding.join("; ")
    )
}

/// Why `v` is missing, as far as urutan knows.
fn missing(x: &Explanation, stored: i64, v: i64) -> String {
    let searched = match &x.outbox {
        Ok(_) => "no history row, parked or dead-lettered message, or outbox row",
        Err(_) => "no history row, parked or dead-lettered message (the outbox was not searched)",
    };
    if v < stored {
        format!(
            "never applied; {searched}; if it arrives now it is stale (versi {stored} is applied)"
        )
    } else if let Some(p) = x.parked.iter().find(|p| p.versi > v) {
        format!(
            "never seen: {searched}; parked versi {} waits for it",
            p.versi
        )
    } else {
        format!("never seen: {searched}")
    }
}

impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let versi = if self.through == self.versi {
            self.versi.to_string()
        } else {
            format!("{}-{}", self.versi, self.through)
        };
        let shard = self.shard.map_or("-".into(), |s| format!("{s:03}"));
        let at = self.at.map_or("-".into(), when);
        write!(
            f,
            "{versi:<8} {:<13} {shard:<5} {:<6} {:<20} {at:<23} {}",
            self.what, self.epoch, self.message_id, self.note
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use urutan::outbox::OrderRow;
    use urutan::store::{AppliedVersion, OrderState, ParkedVersion, ReturnedVersion};

    fn at() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-11-30T12:00:00Z")
            .expect("time")
            .with_timezone(&Utc)
    }

    fn applied(versi: i64) -> AppliedVersion {
        AppliedVersion {
            versi,
            status: "dibuat".into(),
            message_id: format!("E-v{versi}"),
            shard: 1,
            at: at(),
            epoch_at_most: Some(3),
        }
    }

    fn order() -> Explanation {
        let mut x = Explanation::new("E");
        x.state = Some(OrderState {
            status: "dibuat".into(),
            versi: 4,
            epoch: 3,
            updated_at: at(),
            data: None,
        });
        x.applied = vec![applied(1), applied(2), applied(4)];
        x.positions = vec![(0, 3), (1, 3)];
        x
    }

    fn what(lines: &[Line]) -> Vec<(i64, i64, &'static str)> {
        lines.iter().map(|l| (l.versi, l.through, l.what)).collect()
    }

    #[test]
    fn gaps_are_told_with_what_is_known() {
        let mut x = order();
        x.parked.push(ParkedVersion {
            versi: 9,
            message_id: "E-v9".into(),
            shard: 0,
            epoch: 4,
            since: at(),
        });
        x.outbox = Ok(vec![OrderRow {
            id: 70,
            versi: Some(7),
            written_at: at(),
            sent_at: Some(at()),
            processed: false,
            set_aside: None,
        }]);
        let lines = lines(&x, at());
        assert_eq!(
            what(&lines),
            [
                (1, 1, "applied"),
                (2, 2, "applied"),
                (3, 3, "missing"),
                (4, 4, "applied"),
                (5, 6, "missing"),
                (7, 7, "queued"),
                (8, 8, "missing"),
                (9, 9, "parked"),
            ]
        );
        assert!(
            lines[2].note.contains("stale (versi 4 is applied)"),
            "{:?}",
            lines[2]
        );
        assert!(
            lines[4].note.contains("parked versi 9 waits for it"),
            "{:?}",
            lines[4]
        );
        assert!(
            lines[7].note.contains("waits for versi 5")
                && lines[7]
                    .note
                    .contains("shard(s) 000, 001 have not passed it yet"),
            "{:?}",
            lines[7]
        );
    }

    #[test]
    fn a_parked_version_names_the_returned_one_it_waits_for() {
        let mut x = order();
        x.positions = vec![(0, 4), (1, 4)];
        x.parked.push(ParkedVersion {
            versi: 6,
            message_id: "E-v6".into(),
            shard: 1,
            epoch: 4,
            since: at(),
        });
        x.returned.push(ReturnedVersion {
            versi: 5,
            message_id: "E-v5".into(),
            shard: 1,
            since: at(),
        });
        let lines = lines(&x, at());
        let parked = lines
            .iter()
            .find(|l| l.what == "parked")
            .expect("parked line");
        assert!(
            parked
                .note
                .contains("versi 5 (E-v5) was handed back to shard 001")
                && !parked.note.contains("neither holds now"),
            "{parked:?}"
        );
    }

    #[test]
    fn a_set_aside_outbox_row_is_told_with_its_reason() {
        let mut x = order();
        x.outbox = Ok(vec![OrderRow {
            id: 71,
            versi: Some(4),
            written_at: at(),
            sent_at: None,
            processed: false,
            set_aside: Some(urutan::outbox::SetAsideRow {
                at: at(),
                reason: "routing_key_too_long".into(),
                detail: "the routing key is 300 bytes".into(),
            }),
        }]);
        let lines = lines(&x, at());
        let aside = lines
            .iter()
            .find(|l| l.what == "set-aside")
            .expect("a set-aside line although versi 4 is applied");
        assert_eq!((aside.versi, aside.message_id.as_str()), (4, "71"));
        assert!(
            aside
                .note
                .contains("reason routing_key_too_long: the routing key is 300 bytes"),
            "{aside:?}"
        );
    }

    #[test]
    fn a_huge_gap_is_one_line() {
        let mut x = order();
        x.applied.push(applied(1_700_000_000_000));
        x.state.as_mut().expect("state").versi = 1_700_000_000_000;
        let lines = lines(&x, at());
        assert_eq!(lines.len(), 6);
        assert_eq!(what(&lines)[4], (5, 1_699_999_999_999, "missing"));
    }
}
