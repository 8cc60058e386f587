//! What a run measured: per fault, per fault kind, the injected mix and the
//! invariant checks; rendered as Markdown and JSON.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::faults::check::Check;
use crate::faults::inject::Kind;
use crate::markdown::row;

/// Timestamps as RFC 3339 text (chrono is built without its serde feature).
fn rfc3339<S: serde::Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&t.to_rfc3339())
}

/// One injected fault.
#[derive(Debug, Clone, Serialize)]
pub struct FaultRecord {
    pub index: usize,
    pub kind: Kind,
    #[serde(serialize_with = "rfc3339")]
    pub started: DateTime<Utc>,
    /// When the fault was over (process restarted, broker or database back).
    #[serde(serialize_with = "rfc3339")]
    pub ended: DateTime<Utc>,
    pub detail: String,
    /// Fault over → the workers applied a probe message published after it
    /// (start of its transaction). None: not within the recovery limit.
    pub recovery_ms: Option<f64>,
    /// Fault over → an event written into the outbox after it was applied
    /// (relay and workers both back).
    pub e2e_ms: Option<f64>,
    /// Versions applied from this fault's start to the next one's.
    pub processed: i64,
    /// Relay or direct events processed in this window after a newer
    /// version of their order (out of version order at a worker).
    pub reordered: usize,
    /// What went wrong in or after this fault (attributed invariant
    /// violations included).
    pub violations: Vec<String>,
}

/// The figures of one fault kind.
#[derive(Debug, Clone, Serialize)]
pub struct KindSummary {
    pub kind: Kind,
    pub label: &'static str,
    pub injected: usize,
    pub processed: i64,
    pub reordered: usize,
    pub violations: usize,
    pub recovery_p50_ms: Option<f64>,
    pub recovery_max_ms: Option<f64>,
    pub e2e_p50_ms: Option<f64>,
    pub e2e_max_ms: Option<f64>,
    pub goal_ms: f64,
    /// Faults whose workers' recovery exceeded the goal (or never came).
    pub over_goal: usize,
    /// Faults whose end-to-end recovery exceeded the goal (or never came).
    pub e2e_over_goal: usize,
}

/// What the mixer put into the stream.
#[derive(Debug, Clone, Serialize)]
pub struct MixSummary {
    pub poison_confirmed: usize,
    pub poison_unconfirmed: usize,
    pub duplicates: u64,
    pub stale: usize,
}

/// What the direct producer published.
#[derive(Debug, Clone, Serialize)]
pub struct DirectSummary {
    pub entities: usize,
    pub confirmed: u64,
    pub retried: u64,
    /// Publishes acked but returned as unroutable (sent again).
    pub returned: u64,
}

/// Everything one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub seed: u64,
    pub settings: String,
    pub binary: String,
    pub git_commit: String,
    #[serde(serialize_with = "rfc3339")]
    pub started: DateTime<Utc>,
    pub duration_s: f64,
    pub events_written: u64,
    pub history_rows: i64,
    pub moved_entities: i64,
    pub drain_s: Option<f64>,
    pub faults: Vec<FaultRecord>,
    pub kinds: Vec<KindSummary>,
    pub mix: MixSummary,
    pub direct: Option<DirectSummary>,
    /// Relay or direct events that reached a worker after a newer version
    /// of their order (recorded as stale instead of applied).
    pub reordered: usize,
    pub checks: Vec<Check>,
    pub verify_passed: bool,
    pub verify_output: String,
    pub unexpected_exits: Vec<String>,
    /// The holds soak's operator and the final `urutan status`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holds: Option<HoldsSummary>,
}

/// What the holds soak's operator did, and `urutan status` at the end.
#[derive(Debug, Clone, Serialize)]
pub struct HoldsSummary {
    pub operator: crate::faults::holds::Operator,
    pub status: String,
}

impl RunReport {
    /// Every invariant held, every fault recovered, nothing unexpected.
    pub fn passed(&self) -> bool {
        self.verify_passed
            && self.drain_s.is_some()
            && self.unexpected_exits.is_empty()
            && self.checks.iter().all(|c| c.violations == 0)
            && self
                .faults
                .iter()
                .all(|f| f.violations.is_empty() && f.recovery_ms.is_some())
    }
}

/// The median and maximum of `xs` (None when empty).
fn p50_max(xs: &mut [f64]) -> (Option<f64>, Option<f64>) {
    xs.sort_by(f64::total_cmp);
    if xs.is_empty() {
        return (None, None);
    }
    (Some(xs[xs.len() / 2]), xs.last().copied())
}

/// The per-kind table from the fault records.
pub fn summarize(faults: &[FaultRecord]) -> Vec<KindSummary> {
    Kind::ALL
        .iter()
        .chain(&Kind::CLUSTER)
        .chain(&Kind::PAIR)
        .filter_map(|&kind| {
            let of: Vec<&FaultRecord> = faults.iter().filter(|f| f.kind == kind).collect();
            if of.is_empty() {
                return None;
            }
            let goal = kind.goal().as_secs_f64() * 1000.0;
            let mut rec: Vec<f64> = of.iter().filter_map(|f| f.recovery_ms).collect();
            let (p50, max) = p50_max(&mut rec);
            let mut e2e: Vec<f64> = of.iter().filter_map(|f| f.e2e_ms).collect();
            let (e2e_p50, e2e_max) = p50_max(&mut e2e);
            Some(KindSummary {
                kind,
                label: kind.label(),
                injected: of.len(),
                processed: of.iter().map(|f| f.processed).sum(),
                reordered: of.iter().map(|f| f.reordered).sum(),
                violations: of.iter().map(|f| f.violations.len()).sum(),
                recovery_p50_ms: p50,
                recovery_max_ms: max,
                e2e_p50_ms: e2e_p50,
                e2e_max_ms: e2e_max,
                goal_ms: goal,
                over_goal: of
                    .iter()
                    .filter(|f| f.recovery_ms.is_none_or(|r| r > goal))
                    .count(),
                e2e_over_goal: of
                    .iter()
                    .filter(|f| f.e2e_ms.is_none_or(|r| r > goal))
                    .count(),
            })
        })
        .collect()
}

fn ms(x: Option<f64>) -> String {
    x.map_or("—".into(), |v| format!("{:.0}", v))
}

fn secs(d: Duration) -> String {
    format!("{:.0} s", d.as_secs_f64())
}

/// The Markdown report.
pub fn markdown(r: &RunReport) -> String {
    let mut s = String::new();
    let verdict = if r.passed() { "PASSED" } else { "FAILED" };
    s += &format!("# Fault-injection run: {verdict}\n\n");
    s += &format!(
        "Seed `{}` (replay: `--seed {}`), {} faults in {}, commit `{}`, binary `{}`.\n\n{}\n\n",
        r.seed,
        r.seed,
        r.faults.len(),
        secs(Duration::from_secs_f64(r.duration_s)),
        r.git_commit,
        r.binary,
        r.settings
    );
    s += &format!(
        "{} events written through the outbox, {} versions applied, {} entities changed shard \
         (ring changes), drained in {}.\n\n",
        r.events_written,
        r.history_rows,
        r.moved_entities,
        r.drain_s
            .map_or("— (NOT drained)".into(), |d| format!("{d:.1} s"))
    );
    if let Some(h) = &r.holds {
        let o = &h.operator;
        s += &format!(
            "Operator (holds soak): {} refused versions fixed and replayed, {} orders released \
             without their refused version, {} gap holds released, {} effect holds replayed, {} \
             holds left for a later pass (a version still on its way); failed commands: {:?}.\n\n\
             `urutan status` at the end:\n\n```\n{}\n```\n\n",
            o.replays,
            o.releases,
            o.gap_releases,
            o.effect_replays,
            o.deferred,
            o.failed_commands,
            h.status.trim_end()
        );
    }
    if let Some(d) = &r.direct {
        s += &format!(
            "Direct producer: {} versions of {} orders confirmed straight into `pesanan-hash` \
             ({} publishes retried with the same message id, {} of them after the broker \
             returned one as unroutable).\n\n",
            d.confirmed, d.entities, d.retried, d.returned
        );
    }
    s += &format!(
        "Out of version order at a worker (relay or direct events recorded as stale, not \
         applied): {}.\n\n",
        r.reordered
    );
    s += "| fault kind | injected | messages processed | out of order | violations | recovery p50 / max (ms) | end-to-end p50 / max (ms) | goal | over goal (recovery / e2e) |\n";
    s += "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for k in &r.kinds {
        s += &row(&[
            &k.label,
            &k.injected,
            &k.processed,
            &k.reordered,
            &k.violations,
            &format!("{} / {}", ms(k.recovery_p50_ms), ms(k.recovery_max_ms)),
            &format!("{} / {}", ms(k.e2e_p50_ms), ms(k.e2e_max_ms)),
            &format!("≤ {:.0} s", k.goal_ms / 1000.0),
            &format!("{} / {}", k.over_goal, k.e2e_over_goal),
        ]);
    }
    let m = &r.mix;
    s += &format!(
        "| poison messages (mixed in) | {} (+{} unconfirmed) | | | see checks | | | | |\n\
         | duplicate publishes (mixed in) | {} | | | see checks | | | | |\n\
         | stale events (mixed in) | {} | | | see checks | | | | |\n\n",
        m.poison_confirmed, m.poison_unconfirmed, m.duplicates, m.stale
    );
    s += "Recovery: from the fault's end (process restarted, broker or database back, the \
          database's name moved to the promoted standby) to the start \
          of the transaction that applied a probe message published right after it (the workers \
          process again). End to end: to the first applied event that the producer wrote into the \
          outbox after the fault's end (the relay is back too). Both read \
          `pesanan_riwayat.diterapkan_pada`.\n\n";
    s += "## Invariants after the drain\n\n| check | violations |\n|---|---:|\n";
    let verify = if r.verify_passed {
        "0 (PASSED)"
    } else {
        "FAILED"
    };
    s += &row(&[&"`urutan verify` (6 checks)", &verify]);
    for c in &r.checks {
        s += &row(&[&c.name, &c.violations]);
    }
    for c in r.checks.iter().filter(|c| c.violations > 0) {
        s += &format!("\n{}: e.g. {}\n", c.name, c.examples.join("; "));
    }
    if !r.unexpected_exits.is_empty() {
        s += &format!(
            "\nUnexpected process exits: {}\n",
            r.unexpected_exits.join("; ")
        );
    }
    s += "\n## Faults\n\n| # | kind | detail | recovery (ms) | end to end (ms) | processed | out of order | violations |\n|---:|---|---|---:|---:|---:|---:|---|\n";
    for f in &r.faults {
        s += &row(&[
            &f.index,
            &f.kind.label(),
            &f.detail,
            &ms(f.recovery_ms),
            &ms(f.e2e_ms),
            &f.processed,
            &f.reordered,
            &f.violations.join("; "),
        ]);
    }
    s += &format!(
        "\n## `urutan verify`\n\n```\n{}\n```\n",
        r.verify_output.trim()
    );
    s
}
