//! What needs attention: the one place that decides it, from what
//! `urutan status` read. Pure.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{Attention, Shard, Status, attention};

/// Decides what needs attention in what was read, at `now`. Pure.
pub fn assess(status: &Status, now: DateTime<Utc>, stuck_after: Duration) -> Vec<Attention> {
    let at = Clock { now, stuck_after };
    let mut found = Vec::new();
    services(status, &mut found);
    ring(status, &at, &mut found);
    for s in &status.shards {
        shard(s, &at, &mut found);
    }
    dead_letters(status, &mut found);
    outbox(status, &at, &mut found);
    orders(status, &at, &mut found);
    overdue(status, &at, &mut found);
    effects(status, &mut found);
    found
}

/// Versions that have waited longer than they should: what should have
/// moved them (a shard's release step, its gap check) has not.
fn overdue(status: &Status, at: &Clock, found: &mut Vec<Attention>) {
    use urutan::store::overdue::MARGIN;
    for o in status.overdue.iter().flatten() {
        let late = format!(
            "{} order(s), the longest overdue by {} (order {}: see `urutan explain`)",
            o.orders,
            at.age(o.since),
            crate::terminal::Clean(&o.example)
        );
        let margin = MARGIN.as_secs();
        let (code, message) = match o.kind.as_str() {
            "set_aside" => (
                "set_aside_overdue",
                format!(
                    "{late}: a message set aside after a transient failure is past its next try \
                     by more than {margin} s, and its order's later versions wait behind it: is \
                     the worker of its shard running and releasing? (its log, \
                     `urutan_orders_overdue`)"
                ),
            ),
            "gap" => (
                "gap_overdue",
                format!(
                    "{late}: an order's next version has been missing longer than GAP_TIMEOUT \
                     + {margin} s and the order is not held (with GAP_POLICY=wait its shard's \
                     worker holds it within a second): is that worker running? `urutan hold \
                     release ORDER_ID` applies what waits without the missing version"
                ),
            ),
            _ => (
                "parked_overdue",
                format!(
                    "{late}: a parked version free to go (nothing older is missing or held) \
                     has not been released for more than {margin} s: is the worker of its \
                     shard running and releasing?"
                ),
            ),
        };
        found.push(attention(code, message));
    }
}

/// Dead-lettered effects no operator has dealt with: a webhook the
/// endpoint never took (with `EFFECTS_ON_DEAD=skip` nothing else shows it).
fn effects(status: &Status, found: &mut Vec<Attention>) {
    let Some(e) = status.effects.as_ref().filter(|e| e.unresolved > 0) else {
        return;
    };
    found.push(attention(
        "effects_dead_lettered",
        format!(
            "{} dead-lettered effect(s) (webhooks an endpoint refused or never answered): see \
             `urutan dlq list --effects`; send them again after the fix (`urutan dlq replay \
             --effects ID`) or, if they hold their order, skip them (`urutan hold release \
             ORDER_ID --effects`)",
            e.unresolved
        ),
    ));
}

/// Orders on hold (an operator must replay or release), and orders retrying
/// a message set aside.
fn orders(status: &Status, at: &Clock, found: &mut Vec<Attention>) {
    let Some(o) = &status.orders else {
        return;
    };
    if o.held > 0 {
        let reasons: Vec<String> = o
            .held_by_reason
            .iter()
            .map(|r| format!("{} {}", r.orders, r.reason))
            .collect();
        let oldest = o
            .oldest_held_since
            .map(|t| format!(", the oldest for {}", at.age(t)))
            .unwrap_or_default();
        let effect = urutan::effects::hold::REASON;
        let mut advice = Vec::new();
        if o.held_by_reason.iter().any(|r| r.reason != effect) {
            advice.push(
                "their later versions wait; replay the refused version after the fix (`urutan \
                 dlq replay`) or resume the order without it (`urutan hold release`)",
            );
        }
        if o.held_by_reason.iter().any(|r| r.reason == effect) {
            advice.push(
                "a dead-lettered effect holds its order's later effects; send it again after the \
                 fix (`urutan dlq replay --effects ID`) or skip it (`urutan hold release ORDER_ID \
                 --effects`)",
            );
        }
        found.push(attention(
            "orders_held",
            format!(
                "{} order(s) on hold ({}){oldest}: {}; see `urutan hold list`",
                o.held,
                reasons.join(", "),
                advice.join("; ")
            ),
        ));
    }
    if o.retrying > 0 {
        found.push(attention(
            "orders_retrying",
            format!(
                "{} order(s) retrying a message set aside after a transient failure (their later \
                 versions wait; other orders go on): see `urutan explain ORDER_ID`",
                o.retrying
            ),
        ));
    }
}

/// When `urutan status` looked, and how long a wait may last before it is stuck.
struct Clock {
    now: DateTime<Utc>,
    stuck_after: Duration,
}

impl Clock {
    /// Whether something waiting since `since` has waited too long.
    fn stuck(&self, since: DateTime<Utc>) -> bool {
        (self.now - since)
            .to_std()
            .is_ok_and(|waited| waited > self.stuck_after)
    }

    /// How long ago `since` was, for a person.
    fn age(&self, since: DateTime<Utc>) -> String {
        crate::clock::age(self.now, since)
    }
}

/// The database and the broker: unreachable.
fn services(status: &Status, found: &mut Vec<Attention>) {
    if let Some(e) = &status.database.error {
        found.push(attention("database_unreachable", e.clone()));
    }
    if let Some(e) = &status.broker.error {
        found.push(attention("broker_unreachable", e.clone()));
    }
}

/// The ring and its windows: none recorded, a resharding or a window stuck.
fn ring(status: &Status, at: &Clock, found: &mut Vec<Attention>) {
    let database_read = status.database.reachable && status.outbox.is_some();
    if database_read && status.ring.is_none() {
        found.push(attention(
            "no_ring",
            "no ring is recorded: `urutan run` (or `urutan topology`) has not prepared the \
             topology against this database yet"
                .into(),
        ));
    }
    if let Some(ring) = status
        .ring
        .as_ref()
        .filter(|r| r.resharding && at.stuck(r.since))
    {
        found.push(attention(
            "resharding_stuck",
            format!(
                "resharding {} -> {} has been in progress for {} (it completes once every shard \
                 passed epoch {} and removed shards are drained)",
                ring.from.unwrap_or(ring.shard_count),
                ring.shard_count,
                at.age(ring.since),
                ring.epoch
            ),
        ));
    }
    for w in status.windows.iter().filter(|w| at.stuck(w.opened_at)) {
        let until = match w.epoch {
            Some(epoch) => format!("it closes once every shard passes epoch {epoch}"),
            None => "its epoch is not open yet (did its opener die?)".into(),
        };
        found.push(attention(
            "window_stuck",
            format!(
                "window {} ({}) has been open for {}: {until}",
                w.id,
                w.reason,
                at.age(w.opened_at)
            ),
        ));
    }
}

/// One shard: its queue, its consumer, its epoch and what it parked.
fn shard(s: &Shard, at: &Clock, found: &mut Vec<Attention>) {
    let expected = s.bound || s.active;
    match (s.exists, s.consumers) {
        (Some(false), _) if expected => found.push(attention(
            "shard_queue_missing",
            format!(
                "shard {:03}: queue {} does not exist on the broker",
                s.shard, s.queue
            ),
        )),
        (Some(true), Some(0)) if expected || s.ready.unwrap_or(0) > 0 => found.push(attention(
            "shard_without_consumer",
            format!(
                "shard {:03}: no consumer on {} ({} ready): is `urutan run` running?",
                s.shard,
                s.queue,
                s.ready.unwrap_or(0)
            ),
        )),
        _ => {}
    }
    if let Some(since) = s.epoch_waiting_since.filter(|t| s.active && at.stuck(*t)) {
        found.push(attention(
            "epoch_not_passed",
            format!(
                "shard {:03} is still at epoch {} while a later epoch was opened {} ago: \
                 its worker has not reached the marker",
                s.shard,
                s.epoch_passed.unwrap_or(0),
                at.age(since)
            ),
        ));
    }
    if s.epoch_unexplained {
        found.push(attention(
            "epoch_unexplained",
            format!(
                "shard {:03} is at epoch {}, which urutan never recorded: its position was \
                 not moved by a marker urutan sent (a forged marker, or a hand edit); \
                 messages on it may overtake older ones of their order",
                s.shard,
                s.epoch_passed.unwrap_or(0)
            ),
        ));
    }
    if let Some(since) = s.oldest_parked_at.filter(|t| at.stuck(*t)) {
        found.push(attention(
            "parked_too_long",
            format!(
                "shard {:03}: {} parked message(s), the oldest for {} (order {}: see \
                 `urutan explain`)",
                s.shard,
                s.parked,
                at.age(since),
                s.oldest_parked_order.as_deref().unwrap_or("?")
            ),
        ));
    }
}

/// The dead-letter queue: missing, or holding messages.
fn dead_letters(status: &Status, found: &mut Vec<Attention>) {
    let dl = &status.dead_letters;
    if status.broker.reachable {
        match dl.depth {
            None => found.push(attention(
                "dead_letter_queue_missing",
                format!(
                    "the dead-letter queue {} does not exist on the broker",
                    dl.queue
                ),
            )),
            // Settled ones (their versions released past or applied
            // since) need nobody: only the others count.
            Some(n) if i64::from(n) > dl.settled => found.push(attention(
                "dead_letters",
                format!(
                    "{} message(s) in {}: see `urutan dlq list`, fix the cause, then \
                     `urutan dlq replay`",
                    i64::from(n) - dl.settled,
                    dl.queue
                ),
            )),
            Some(_) => {}
        }
    }
}

/// The outbox: a backlog no relay drains, rows set aside.
fn outbox(status: &Status, at: &Clock, found: &mut Vec<Attention>) {
    if let Some(o) = &status.outbox
        && let Some(oldest) = o.oldest_unsent_at.filter(|t| at.stuck(*t))
    {
        let relay = match &o.relay {
            Some(r) => format!("the active relay (pid {}) is not keeping up", r.pid),
            None => "no relay is active: start `urutan relay`".into(),
        };
        found.push(attention(
            "outbox_backlog",
            format!(
                "{} outbox row(s) unsent, the oldest for {}: {relay}",
                o.unsent,
                at.age(oldest)
            ),
        ));
    }
    if let Some(o) = status.outbox.as_ref().filter(|o| o.unroutable > 0) {
        found.push(attention(
            "outbox_unroutable",
            format!(
                "{} outbox row(s) set aside: the broker returned them (routing key outside the \
                 entry binding); fix the key, then clear `unroutable_at` to retry",
                o.unroutable
            ),
        ));
    }
    if let Some(o) = status.outbox.as_ref() {
        let refused: Vec<String> = o
            .set_aside_by_reason
            .iter()
            .filter(|c| c.reason != "unroutable")
            .map(|c| format!("{} {}", c.count, c.reason))
            .collect();
        if !refused.is_empty() {
            found.push(attention(
                "outbox_set_aside",
                format!(
                    "outbox row(s) set aside, never published ({}): they break the contract \
                     (section 2) or the broker refused them; `urutan explain ORDER_ID` shows \
                     each; fix the row and clear `unroutable_at`, or delete it",
                    refused.join(", ")
                ),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::*;
    use super::*;
    use urutan::effects::read::Summary;

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-11-30T12:00:00Z")
            .expect("time")
            .with_timezone(&Utc)
    }

    fn minutes_ago(m: i64) -> DateTime<Utc> {
        now() - chrono::Duration::minutes(m)
    }

    fn shard(index: u16, consumers: u32) -> Shard {
        Shard {
            shard: index,
            queue: format!("pesanan.shard-{index:03}"),
            bound: true,
            active: true,
            exists: Some(true),
            ready: Some(0),
            replica: Some("a".into()),
            consumers: Some(consumers),
            consumers_registered: None,
            epoch_passed: Some(3),
            epoch_waiting_since: None,
            epoch_unexplained: false,
            parked: 0,
            oldest_parked_at: None,
            oldest_parked_order: None,
            last_applied_at: None,
        }
    }

    fn healthy() -> Status {
        let up = |url: &str| Reach {
            url: url.into(),
            reachable: true,
            error: None,
        };
        Status {
            checked_at: now(),
            exit_code: 0,
            attention: Vec::new(),
            database: up("postgres://db/urutan"),
            broker: up("amqp://rabbit/%2f"),
            ring: Some(Ring {
                versi: 1,
                shard_count: 2,
                from: None,
                epoch: 1,
                by: "`urutan run` on a (pid 1)".into(),
                since: minutes_ago(60),
                completed_at: Some(minutes_ago(60)),
                resharding: false,
            }),
            epochs: None,
            windows: Vec::new(),
            shards: vec![shard(0, 1), shard(1, 1)],
            replicas: Vec::new(),
            replicas_seen: Some(1),
            replicas_unknown: None,
            dead_letters: DeadLetters {
                queue: "pesanan.dlq".into(),
                depth: Some(0),
                records_available: true,
                by_reason: Vec::new(),
                settled: 0,
            },
            outbox: Some(Outbox {
                unsent: 0,
                oldest_unsent_at: None,
                unroutable: 0,
                set_aside: 0,
                set_aside_by_reason: Vec::new(),
                relay: None,
            }),
            orders: Some(Orders {
                held: 0,
                held_by_reason: Vec::new(),
                oldest_held_since: None,
                retrying: 0,
            }),
            effects: Some(Summary::default()),
            overdue: Some(Vec::new()),
        }
    }

    /// A replica's name is what its environment said (`REPLICA_NAME`):
    /// a bidirectional override in it would rewrite the operator's
    /// terminal line, so the text screen shows it escaped.
    #[test]
    fn a_replica_name_reaches_the_terminal_escaped() {
        let mut status = healthy();
        let name = "evil\u{202E}eman";
        status.shards[0].replica = Some(name.into());
        status.replicas = vec![Replica {
            name: name.into(),
            shard_count: 1,
            shards: vec![0],
            consumers: vec![0],
            joined_at: minutes_ago(5),
            lease_until: now(),
        }];
        let text = status.to_string();
        assert!(!text.contains('\u{202E}'), "{text}");
        assert_eq!(text.matches("evil\\u{202e}eman").count(), 2, "{text}");
    }

    #[test]
    fn unresolved_dead_lettered_effects_need_attention() {
        let mut status = healthy();
        status.effects = Some(Summary {
            pending: 4,
            oldest_pending_at: Some(minutes_ago(1)),
            dead_lettered: 3,
            unresolved: 0,
        });
        assert_eq!(codes(&status), Vec::<&str>::new(), "released: dealt with");
        status.effects = Some(Summary {
            dead_lettered: 3,
            unresolved: 2,
            ..Summary::default()
        });
        assert_eq!(codes(&status), ["effects_dead_lettered"]);
        let found = assess(&status, now(), Duration::from_secs(300));
        assert!(
            found[0].message.starts_with("2 dead-lettered effect(s)")
                && found[0].message.contains("urutan dlq replay --effects"),
            "{}",
            found[0].message
        );
    }

    #[test]
    fn held_and_retrying_orders_need_attention() {
        let mut status = healthy();
        status.orders = Some(Orders {
            held: 2,
            held_by_reason: vec![HeldReason {
                reason: "refused".into(),
                orders: 2,
            }],
            oldest_held_since: Some(minutes_ago(30)),
            retrying: 1,
        });
        assert_eq!(codes(&status), ["orders_held", "orders_retrying"]);
        let found = assess(&status, now(), Duration::from_secs(300));
        assert!(
            found[0].message.contains("2 refused"),
            "{}",
            found[0].message
        );
        assert!(
            found[0].message.contains("urutan hold release"),
            "{}",
            found[0].message
        );
        assert!(
            !found[0].message.contains("--effects"),
            "{}",
            found[0].message
        );
    }

    #[test]
    fn an_effect_hold_says_how_to_end_it() {
        let mut status = healthy();
        status.orders = Some(Orders {
            held: 1,
            held_by_reason: vec![HeldReason {
                reason: "effect".into(),
                orders: 1,
            }],
            oldest_held_since: Some(minutes_ago(3)),
            retrying: 0,
        });
        assert_eq!(codes(&status), ["orders_held"]);
        let found = assess(&status, now(), Duration::from_secs(300));
        let message = &found[0].message;
        assert!(message.contains("1 effect"), "{message}");
        assert!(
            message.contains("urutan dlq replay --effects")
                && message.contains("urutan hold release ORDER_ID --effects"),
            "{message}"
        );
        assert!(!message.contains("refused version"), "{message}");
    }

    fn codes(status: &Status) -> Vec<&'static str> {
        assess(status, now(), Duration::from_secs(300))
            .into_iter()
            .map(|a| a.code)
            .collect()
    }

    #[test]
    fn versions_overdue_need_attention_per_kind() {
        use urutan::store::overdue::Overdue;
        let mut s = healthy();
        let late = |kind: &str, example: &str| Overdue {
            kind: kind.into(),
            orders: 2,
            since: minutes_ago(3),
            example: example.into(),
        };
        s.overdue = Some(vec![
            late("set_aside", "S"),
            late("gap", "G"),
            late("parked", "P"),
        ]);
        assert_eq!(
            codes(&s),
            ["set_aside_overdue", "gap_overdue", "parked_overdue"]
        );
        let found = assess(&s, now(), Duration::from_secs(300));
        assert!(
            found[1]
                .message
                .starts_with("2 order(s), the longest overdue by 3 min (order G:"),
            "{}",
            found[1].message
        );
        s.overdue = None;
        assert_eq!(codes(&s), Vec::<&str>::new(), "unread: nothing to say");
    }

    #[test]
    fn a_healthy_pool_needs_nothing() {
        assert_eq!(codes(&healthy()), Vec::<&str>::new());
    }

    #[test]
    fn a_shard_without_consumer_or_queue_needs_attention() {
        let mut s = healthy();
        s.shards[1].consumers = Some(0);
        assert_eq!(codes(&s), ["shard_without_consumer"]);
        s.shards[1].exists = Some(false);
        s.shards[1].consumers = None;
        assert_eq!(codes(&s), ["shard_queue_missing"]);
        // An unbound, inactive queue left over: only if it holds messages.
        let mut extra = shard(2, 0);
        (extra.bound, extra.active) = (false, false);
        let mut s = healthy();
        s.shards.push(extra);
        assert_eq!(codes(&s), Vec::<&str>::new());
        s.shards[2].ready = Some(4);
        assert_eq!(codes(&s), ["shard_without_consumer"]);
    }

    #[test]
    fn a_position_no_recorded_epoch_explains_needs_attention() {
        let mut s = healthy();
        s.shards[0].epoch_passed = Some(i64::MAX);
        s.shards[0].epoch_unexplained = true;
        assert_eq!(codes(&s), ["epoch_unexplained"]);
    }

    #[test]
    fn waits_longer_than_stuck_after_need_attention() {
        let mut s = healthy();
        s.windows.push(Window {
            id: 1,
            reason: "broker restarted".into(),
            epoch: Some(9),
            opened_at: minutes_ago(4),
        });
        s.shards[0].epoch_waiting_since = Some(minutes_ago(4));
        s.shards[0].oldest_parked_at = Some(minutes_ago(4));
        s.shards[0].parked = 2;
        s.outbox = Some(Outbox {
            unsent: 7,
            oldest_unsent_at: Some(minutes_ago(4)),
            unroutable: 0,
            set_aside: 0,
            set_aside_by_reason: Vec::new(),
            relay: None,
        });
        assert_eq!(codes(&s), Vec::<&str>::new(), "4 min is not stuck yet");
        s.windows[0].opened_at = minutes_ago(6);
        s.shards[0].epoch_waiting_since = Some(minutes_ago(6));
        s.shards[0].oldest_parked_at = Some(minutes_ago(6));
        s.outbox = Some(Outbox {
            unsent: 7,
            oldest_unsent_at: Some(minutes_ago(6)),
            unroutable: 1,
            set_aside: 1,
            set_aside_by_reason: vec![aside("unroutable", 1)],
            relay: None,
        });
        assert_eq!(
            codes(&s),
            [
                "window_stuck",
                "epoch_not_passed",
                "parked_too_long",
                "outbox_backlog",
                "outbox_unroutable"
            ]
        );
        let found = assess(&s, now(), Duration::from_secs(300));
        assert!(found[3].message.contains("no relay is active"), "{found:?}");
    }

    fn aside(reason: &str, count: i64) -> urutan::outbox::SetAsideCount {
        urutan::outbox::SetAsideCount {
            reason: reason.into(),
            count,
            oldest_at: Some(minutes_ago(1)),
        }
    }

    #[test]
    fn outbox_rows_set_aside_need_attention_with_their_reasons() {
        let mut s = healthy();
        s.outbox = Some(Outbox {
            unsent: 0,
            oldest_unsent_at: None,
            unroutable: 0,
            set_aside: 3,
            set_aside_by_reason: vec![
                aside("routing_key_too_long", 2),
                aside("payload_invalid", 1),
            ],
            relay: None,
        });
        let found = assess(&s, now(), Duration::from_secs(300));
        assert_eq!(codes(&s), ["outbox_set_aside"]);
        assert!(
            found[0]
                .message
                .contains("2 routing_key_too_long, 1 payload_invalid"),
            "{found:?}"
        );
    }

    #[test]
    fn dead_letters_and_unreachable_services_need_attention() {
        let mut s = healthy();
        s.dead_letters.depth = Some(3);
        assert_eq!(codes(&s), ["dead_letters"]);
        s.broker.reachable = false;
        s.broker.error = Some("cannot connect to the broker".into());
        s.dead_letters.depth = None;
        assert_eq!(codes(&s), ["broker_unreachable"]);
        let mut s = healthy();
        s.ring = None;
        assert_eq!(codes(&s), ["no_ring"]);
    }
}
