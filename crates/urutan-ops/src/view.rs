//! The screens for people: `urutan status` and `urutan explain` as text.

use std::fmt::{self, Write as _};

use chrono::{DateTime, Utc};

use super::clock::{age, when};
use super::explain::Explanation;
use super::status::Status;
use super::terminal::clean;

fn ago(now: DateTime<Utc>, t: Option<DateTime<Utc>>) -> String {
    t.map_or("-".into(), |t| format!("{} ago", age(now, t)))
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or("?".into(), |v| v.to_string())
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let now = self.checked_at;
        let verdict = match self.exit_code {
            0 => "healthy".to_owned(),
            3 => "incomplete: a service cannot be reached (exit 3)".to_owned(),
            code => format!("needs attention (exit {code})"),
        };
        writeln!(f, "urutan status at {}: {verdict}", when(now))?;
        writeln!(f)?;
        for (label, reach) in [("database", &self.database), ("broker", &self.broker)] {
            let state = reach.error.as_deref().unwrap_or("reachable");
            writeln!(f, "{label:<13}{}: {state}", reach.url)?;
        }
        self.fmt_ring(f)?;
        writeln!(f)?;
        self.fmt_shards(f)?;
        writeln!(f)?;
        self.fmt_replicas(f)?;
        self.fmt_dead_letters(f)?;
        self.fmt_outbox(f)?;
        super::effects_view::status_line(self, f)?;
        writeln!(f)?;
        if self.attention.is_empty() {
            writeln!(f, "nothing needs attention")?;
        } else {
            writeln!(f, "needs attention:")?;
            for a in &self.attention {
                writeln!(f, "  - {} [{}]", a.message, a.code)?;
            }
        }
        Ok(())
    }
}

impl Status {
    /// The ring, its epochs and its open windows.
    fn fmt_ring(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let now = self.checked_at;
        match &self.ring {
            Some(r) => {
                let progress = if r.resharding {
                    format!(
                        "RESHARDING {} -> {} in progress for {} (until every shard passes epoch {})",
                        opt(r.from),
                        r.shard_count,
                        age(now, r.since),
                        r.epoch
                    )
                } else {
                    "no resharding in progress".into()
                };
                writeln!(
                    f,
                    "{:<13}{} shards (record {}, {} by {}); {progress}",
                    "ring",
                    r.shard_count,
                    r.versi,
                    when(r.since),
                    r.by
                )?;
            }
            None => writeln!(f, "{:<13}none recorded", "ring")?,
        }
        if let Some(e) = &self.epochs {
            writeln!(
                f,
                "{:<13}latest {} ({}, {} ago); every shard has passed {}",
                "epochs",
                e.latest,
                e.latest_reason,
                age(now, e.latest_opened_at),
                opt(e.passed_by_all)
            )?;
        }
        if self.windows.is_empty() {
            writeln!(f, "{:<13}none open", "windows")?;
        }
        for w in &self.windows {
            let until = w.epoch.map_or("its epoch is not open yet".into(), |e| {
                format!("closes with epoch {e}")
            });
            writeln!(
                f,
                "{:<13}#{} {} (open {}; {until})",
                "window",
                w.id,
                w.reason,
                age(now, w.opened_at)
            )?;
        }
        Ok(())
    }

    /// The outbox's backlog and its relay.
    fn fmt_outbox(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let now = self.checked_at;
        match &self.outbox {
            Some(o) => {
                let relay = match &o.relay {
                    Some(r) => format!(
                        "relay active (pid {}{}{})",
                        r.pid,
                        r.client
                            .as_deref()
                            .map_or(String::new(), |c| format!(" from {c}")),
                        r.since
                            .map_or(String::new(), |t| format!(", since {}", when(t)))
                    ),
                    None => "no relay active".into(),
                };
                let oldest = o.oldest_unsent_at.map_or(String::new(), |t| {
                    format!(", the oldest {} old", age(now, t))
                });
                let aside = match o.set_aside {
                    0 => String::new(),
                    n => format!(
                        ", {n} set aside ({})",
                        o.set_aside_by_reason
                            .iter()
                            .map(|c| format!("{} {}", c.count, c.reason))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                };
                writeln!(
                    f,
                    "{:<13}{} unsent{oldest}{aside}; {relay}",
                    "outbox", o.unsent
                )?;
            }
            None => writeln!(f, "{:<13}unknown (database not read)", "outbox")?,
        }
        Ok(())
    }

    fn fmt_shards(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let now = self.checked_at;
        writeln!(
            f,
            "shard  queue                     ready  consumers      epoch  parked  last applied  replica"
        )?;
        for s in &self.shards {
            let queue = match s.exists {
                Some(false) => format!("{} (missing)", s.queue),
                _ if !s.bound => format!("{} (unbound)", s.queue),
                _ => s.queue.clone(),
            };
            let consumers = match (s.consumers, s.consumers_registered) {
                (Some(active), Some(all)) if all > active => {
                    format!("{active} (+{} standby)", all - active)
                }
                (active, _) => opt(active),
            };
            let parked = match s.oldest_parked_at {
                Some(t) if s.parked > 0 => format!("{} ({})", s.parked, age(now, t)),
                _ => s.parked.to_string(),
            };
            writeln!(
                f,
                "{:03}    {queue:<25} {:>5}  {consumers:<13}  {:>5}  {parked:>6}  {:<12}  {}",
                s.shard,
                opt(s.ready),
                opt(s.epoch_passed),
                ago(now, s.last_applied_at),
                s.replica.as_deref().map_or_else(|| "-".into(), clean)
            )?;
        }
        if self.shards.is_empty() {
            writeln!(f, "(no shard known)")?;
        }
        Ok(())
    }

    /// The live replicas and their shares (docs/contract.md section 13).
    fn fmt_replicas(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let now = self.checked_at;
        if self.replicas.is_empty() {
            let seen = match (self.replicas_seen, &self.replicas_unknown) {
                (Some(n), _) => {
                    format!(" (the broker sees up to {n} consumer(s) on a shard queue)")
                }
                _ => String::new(),
            };
            return writeln!(f, "{:<13}none live{seen}", "replicas");
        }
        writeln!(f, "{:<13}{} live", "replicas", self.replicas.len())?;
        for r in &self.replicas {
            let shards: Vec<String> = r.shards.iter().map(|s| format!("{s:03}")).collect();
            let role = if r.shards.is_empty() {
                "standby (no shard)".to_owned()
            } else {
                format!("{} shard(s): {}", r.shard_count, shards.join(" "))
            };
            writeln!(
                f,
                "  {:<30} {role}; {} consuming; joined {}",
                clean(&r.name),
                r.consumers.len(),
                ago(now, Some(r.joined_at))
            )?;
        }
        Ok(())
    }

    fn fmt_dead_letters(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let now = self.checked_at;
        let dl = &self.dead_letters;
        let depth = dl
            .depth
            .map_or("depth unknown".into(), |n| format!("{n} message(s)"));
        let mut reasons = String::new();
        if !dl.records_available {
            reasons.push_str(super::NO_DEAD_LETTER_RECORDS);
        } else if dl.by_reason.is_empty() {
            reasons.push_str("no dead-letter record waiting");
        } else {
            reasons.push_str("by reason:");
            for r in &dl.by_reason {
                let _ = write!(
                    reasons,
                    " {} {} (last {} ago);",
                    r.reason,
                    r.count,
                    age(now, r.last_at)
                );
            }
            reasons.pop();
        }
        if dl.settled > 0 {
            let _ = write!(
                reasons,
                "; {} settled (their versions were released past or applied since: `urutan dlq \
                 purge --settled`)",
                dl.settled
            );
        }
        writeln!(f, "{:<13}{}: {depth}; {reasons}", "dead letters", dl.queue)
    }
}

impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let now = Utc::now();
        match &self.state {
            Some(s) => {
                writeln!(
                    f,
                    "order {}: status {} at versi {} (epoch {}), updated {} ({} ago)",
                    self.order_id,
                    s.status,
                    s.versi,
                    s.epoch,
                    when(s.updated_at),
                    age(now, s.updated_at)
                )?;
                if let Some(data) = &s.data {
                    writeln!(f, "data: {}", cap(data, 200))?;
                }
            }
            None => writeln!(
                f,
                "order {}: no stored state (nothing applied)",
                self.order_id
            )?,
        }
        if let Some(h) = &self.hold {
            let gap = h.reason == "gap";
            let by = match (&h.message_id, h.versi) {
                (None, Some(v)) if gap => format!("the missing v{v}"),
                (Some(id), Some(v)) => format!("v{v} (message {})", crate::terminal::Clean(id)),
                (_, Some(v)) => format!("v{v}"),
                _ => "-".into(),
            };
            let way_out = if gap {
                "it may still come (then the rest follow)"
            } else {
                "replay it after the fix (`urutan dlq replay`)"
            };
            writeln!(
                f,
                "ON HOLD ({}) since {} ({} ago), held by {by}; {} version(s) wait behind it: \
                 {way_out}, or resume without it (`urutan hold release {}`)",
                h.reason,
                when(h.since),
                age(now, h.since),
                h.waiting,
                self.order_id
            )?;
            if let Some(error) = &h.error {
                let label = if gap { "why" } else { "refused" };
                writeln!(f, "  {label}: {}", crate::terminal::Clean(error))?;
            }
        }
        if let Some(h) = &self.effect_hold {
            writeln!(
                f,
                "EFFECTS ON HOLD (effect) since {} ({} ago), held by the dead-lettered effect {} \
                 of v{}; {} effect(s) wait behind it (its versions go on): send it again after \
                 the fix (`urutan dlq replay --effects {}`) or let the rest go without it \
                 (`urutan hold release {} --effects`)",
                when(h.since),
                age(now, h.since),
                h.effect.unwrap_or_default(),
                h.versi.unwrap_or_default(),
                h.waiting,
                h.effect.unwrap_or_default(),
                self.order_id
            )?;
            if let Some(error) = &h.error {
                writeln!(f, "  {}", crate::terminal::Clean(error))?;
            }
        }
        writeln!(f)?;
        writeln!(
            f,
            "{:<8} {:<13} {:<5} {:<6} {:<20} {:<23} note",
            "versi", "what", "shard", "epoch", "message id", "when"
        )?;
        for line in super::story::lines(self, now) {
            writeln!(f, "{line}")?;
        }
        for d in self
            .dead_letters
            .iter()
            .flatten()
            .filter(|d| d.versi.is_none())
        {
            writeln!(
                f,
                "(version unknown) dead-lettered on shard {:03} {}: reason {}: {}",
                d.shard,
                when(d.dead_lettered_at),
                d.reason,
                d.detail
            )?;
        }
        for o in self.outbox.iter().flatten().filter(|o| o.versi.is_none()) {
            if let Some(aside) = &o.set_aside {
                writeln!(
                    f,
                    "(version unknown) outbox row {} {}: {}",
                    o.id,
                    when(aside.at),
                    crate::terminal::Clean(&super::story::set_aside_note(aside))
                )?;
            }
        }
        super::effects_view::explain_lines(self, now, f)?;
        for a in self.audit.iter().flatten() {
            writeln!(
                f,
                "operator: {} {} on {} by {}: {}",
                when(a.at),
                a.action,
                crate::terminal::Clean(&a.target),
                crate::terminal::Clean(&a.by),
                crate::terminal::Clean(&a.result)
            )?;
        }
        writeln!(f)?;
        self.fmt_queues(f)?;
        if let Err(e) = &self.outbox {
            writeln!(f, "outbox: {e}")?;
        }
        if self.dead_letters.is_none() {
            writeln!(f, "{}", super::NO_DEAD_LETTER_RECORDS)?;
        }
        writeln!(
            f,
            "epochs: <=E is an upper bound (the latest epoch opened before that version was \
             applied; the history does not record epochs); the stored version's is exact"
        )
    }
}

impl Explanation {
    fn fmt_queues(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (shards, dlq) = match &self.queues {
            Ok(q) => q,
            Err(e) => return writeln!(f, "queued: unknown ({e})"),
        };
        let total: u32 = shards.iter().flatten().map(|q| q.ready).sum();
        let last = self
            .applied
            .last()
            .map(|a| a.shard)
            .or(self.parked.last().map(|p| p.shard));
        let here = last
            .and_then(|s| usize::try_from(s).ok())
            .and_then(|s| Some((s, shards.get(s).copied().flatten()?)))
            .map_or(String::new(), |(s, q)| {
                format!(
                    "shard {s:03}, where it was last seen, holds {} ready message(s); ",
                    q.ready
                )
            });
        writeln!(
            f,
            "queued: a queued message cannot be looked at without taking it (single-active-\
             consumer queues refuse basic.get): {here}all {} shard queues hold {total}; the \
             dead-letter queue holds {}",
            shards.len(),
            dlq.map_or("?".into(), |q| q.ready.to_string())
        )
    }
}

/// `s` cut to at most `max` characters, marked when cut.
fn cap(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}… ({} bytes)", &s[..i], s.len()),
        None => s.to_owned(),
    }
}
