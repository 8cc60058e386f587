//! The console's pages (maud: HTML checked at compile time, every value
//! escaped). No script anywhere: the Content-Security-Policy forbids it.
//! What a producer wrote (order ids, message ids, errors) is shown as text,
//! never as markup, and stripped of terminal control characters.

use chrono::{DateTime, Utc};
use maud::{DOCTYPE, Markup, html};
use urutan::store::dead_letter::Listed;
use urutan::store::hold::{Hold, Retrying};

use super::actions::{Chosen, DeadLetterAction, Outcome};
use super::{Csrf, DeadLetterFilter, LIST_AT_MOST};
use crate::audit::AuditRow;
use crate::clock::when;
use crate::explain::Explanation;
use crate::status::Status;
use crate::terminal::clean;

/// A text whose line breaks stay (a `pre` block), other controls escaped.
fn lines(text: &str) -> String {
    crate::terminal::Lines(text).to_string()
}

/// `text` as one path segment of a link (percent-encoded).
pub(super) fn path_segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn order_link(id: &str) -> Markup {
    html! { a href={ "/orders/" (path_segment(id)) } { (clean(id)) } }
}

fn at(t: Option<DateTime<Utc>>) -> String {
    t.map_or_else(|| "-".to_owned(), when)
}

/// The frame of every page: title, navigation, the order search.
fn page(title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · urutan console" }
                link rel="stylesheet" href="/console.css";
                link rel="icon" href="/favicon.svg" type="image/svg+xml";
            }
            body {
                header {
                    nav {
                        a href="/" { "Overview" }
                        a href="/dead-letters" { "Dead letters" }
                        a href="/holds" { "Held and retrying" }
                        a href="/effects" { "Effects" }
                        a href="/audit" { "Audit" }
                    }
                    form action="/orders" method="get" class="find" {
                        label for="find-order" { "Order" }
                        input id="find-order" name="id" type="search" placeholder="order id" required;
                        button type="submit" { "Explain" }
                    }
                }
                main {
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
}

pub(super) fn login(wrong: bool) -> Markup {
    page(
        "Sign in",
        html! {
            @if wrong { p class="bad" { "That is not the console's token." } }
            form action="/login" method="post" {
                label for="token" { "CONSOLE_TOKEN" }
                input id="token" name="token" type="password" autocomplete="current-password" required;
                button type="submit" { "Sign in" }
            }
        },
    )
}

pub(super) fn problem(text: &str) -> Markup {
    page(
        "Cannot show this",
        html! { p class="bad" { (clean(text)) } },
    )
}

pub(super) fn unknown_order(id: &str) -> Markup {
    page(
        "Unknown order",
        html! { p { "Nothing is known of order " code { (clean(id)) } ": never stored, queued, parked, dead-lettered or in the outbox." } },
    )
}

pub(super) fn overview(s: &Status) -> Markup {
    let healthy = s.attention.is_empty();
    page(
        "Overview",
        html! {
            p class={ "verdict " (if healthy { "good" } else { "bad" }) } {
                @if healthy { "Healthy" } @else { "Needs attention" }
                " · checked " (when(s.checked_at))
            }
            @if !healthy {
                h2 { "Attention" }
                table {
                    thead { tr { th { "code" } th { "what" } } }
                    tbody {
                        @for a in &s.attention {
                            tr { td { code.word { (a.code) } } td { (clean(&a.message)) } }
                        }
                    }
                }
            }
            h2 { "Services" }
            table {
                tbody {
                    tr { th { "database" } td { (s.database.url) } td { (reach(&s.database)) } }
                    tr { th { "broker" } td { (s.broker.url) } td { (reach(&s.broker)) } }
                }
            }
            h2 { "Ring" }
            @match &s.ring {
                Some(r) => p {
                    (r.shard_count) " shards (ring version " (r.versi) ", epoch " (r.epoch) ", by " (clean(&r.by)) ", since " (when(r.since)) ")"
                    @if r.resharding { strong { " · resharding in progress" } @if let Some(from) = r.from { " from " (from) " shards" } }
                },
                None => p { "No ring recorded." },
            }
            h2 { "Shards" }
            table {
                thead { tr {
                    th { "shard" } th { "queue" } th { "ready" } th { "consumer" } th { "replica" }
                    th { "epoch passed" } th { "parked" } th { "oldest parked" } th { "last applied" }
                } }
                tbody {
                    @for sh in &s.shards {
                        tr {
                            td { (sh.shard) }
                            td { code { (sh.queue) } @if !sh.bound { " (not bound)" } }
                            td { (opt(sh.ready)) }
                            td { (consumers(sh)) }
                            td.replica { @match &sh.replica { Some(r) => { (clean(r)) }, None => { "-" } } }
                            td { (opt(sh.epoch_passed)) @if sh.epoch_unexplained { " (unexplained)" } }
                            td { (sh.parked) }
                            td {
                                (at(sh.oldest_parked_at))
                                @if let Some(o) = &sh.oldest_parked_order { " · " (order_link(o)) }
                            }
                            td { (at(sh.last_applied_at)) }
                        }
                    }
                }
            }
            (replicas(s))
            h2 { "Dead letters" }
            p {
                code { (s.dead_letters.queue) } ": " (opt(s.dead_letters.depth)) " message(s)"
                " · " a href="/dead-letters" { "list" }
            }
            @if !s.dead_letters.by_reason.is_empty() {
                ul {
                    @for r in &s.dead_letters.by_reason {
                        li { a href={ "/dead-letters?reason=" (path_segment(&r.reason)) } { (r.reason) } ": " (r.count) ", newest " (when(r.last_at)) }
                    }
                }
            }
            @if let Some(o) = &s.orders {
                h2 { "Held and retrying orders" }
                p {
                    (o.held) " held"
                    @for r in &o.held_by_reason { " · " (r.reason) ": " (r.orders) }
                    " · " (o.retrying) " retrying · " a href="/holds" { "list" }
                }
            }
            @if let Some(o) = &s.outbox {
                h2 { "Outbox" }
                p {
                    (o.unsent) " unsent (oldest " (at(o.oldest_unsent_at)) "), " (o.set_aside) " set aside; relay: "
                    @match &o.relay { Some(r) => { "active (pid " (r.pid) ")" }, None => { "none active" } }
                }
                @if !o.set_aside_by_reason.is_empty() {
                    p { "Set aside, never published (the relay goes on with the rows behind them; " code { "urutan explain ORDER_ID" } " shows each row and why):" }
                    ul {
                        @for c in &o.set_aside_by_reason {
                            li { code { (c.reason) } ": " (c.count) ", oldest written " (at(c.oldest_at)) }
                        }
                    }
                }
            }
            @if let Some(e) = &s.effects {
                h2 { "Effects" }
                p { (e.pending) " pending, " (e.dead_lettered) " dead-lettered (" (e.unresolved) " unresolved) · " a href="/effects" { "more" } }
            }
        },
    )
}

/// A shard's consumers: the active one, and standbys when the broker's
/// Prometheus endpoint counts them (a shard moving between replicas).
fn consumers(sh: &crate::status::Shard) -> String {
    match (sh.consumers, sh.consumers_registered) {
        (Some(active), Some(all)) if all > active => {
            format!("{active} (+{} standby)", all - active)
        }
        (active, _) => opt(active),
    }
}

/// The live replicas of `urutan run`, each with its share of the shards,
/// as `urutan status` shows them (docs/contract.md section 13). A name is
/// what `REPLICA_NAME` said (the environment's, a pod's): text, never
/// markup.
fn replicas(s: &Status) -> Markup {
    html! {
        h2 { "Replicas" }
        @if s.replicas.is_empty() {
            p {
                "None live."
                @if let Some(n) = s.replicas_seen { " The broker sees up to " (n) " consumer(s) on a shard queue." }
            }
        } @else {
            table.replicas {
                thead { tr {
                    th { "replica" } th { "shards" } th { "which" } th { "consuming" } th { "joined" }
                } }
                tbody {
                    @for r in &s.replicas {
                        tr {
                            td { code { (clean(&r.name)) } }
                            td { (r.shard_count) }
                            td {
                                @if r.shards.is_empty() { "standby (no shard)" }
                                @else { (r.shards.iter().map(|s| format!("{s:03}")).collect::<Vec<_>>().join(" ")) }
                            }
                            td { (r.consumers.len()) }
                            td { (when(r.joined_at)) }
                        }
                    }
                }
            }
        }
    }
}

fn reach(r: &crate::status::Reach) -> Markup {
    html! {
        @if r.reachable { span class="good" { "reachable" } }
        @else { span class="bad" { "unreachable" } @if let Some(e) = &r.error { ": " (clean(e)) } }
    }
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "?".to_owned(), |v| v.to_string())
}

/// An order: its state, then its story as a timeline (the same lines
/// `urutan explain` prints), holds, retries and skips.
/// A hidden field with the client's CSRF token, in every form that posts.
fn csrf_field(csrf: &Csrf) -> Markup {
    html! { input type="hidden" name="csrf" value=(csrf.0); }
}

pub(super) fn order(x: &Explanation, now: DateTime<Utc>, csrf: &Csrf) -> Markup {
    let lines = crate::story::lines(x, now);
    page(
        &format!("Order {}", clean(&x.order_id)),
        html! {
            @match &x.state {
                Some(s) => p { "Stored: version " strong { (s.versi) } " (" (clean(&s.status)) "), epoch " (s.epoch) ", updated " (when(s.updated_at)) },
                None => p { "Not stored." },
            }
            @for h in x.hold.iter().chain(x.effect_hold.iter()) {
                p class="bad" {
                    "Held (" (h.reason) ") since " (when(h.since))
                    @if let Some(v) = h.versi { " by version " (v) }
                    @if let Some(m) = &h.message_id { " (message " code { (clean(m)) } ")" }
                    "; " (h.waiting) " waiting behind it"
                    @if let Some(e) = &h.error { ": " (clean(e)) }
                }
            }
            @if x.hold.is_some() || x.effect_hold.is_some() {
                form action="/holds/release" method="post" {
                    (csrf_field(csrf))
                    input type="hidden" name="order" value=(x.order_id);
                    button type="submit" { "Release this hold…" }
                }
            }
            @for r in &x.retrying {
                p { "Retrying version " (r.versi) " (message " code { (clean(&r.message_id)) } "), attempt " (r.attempts) ", next try " (when(r.next_try))
                    @if let Some(e) = &r.last_error { ": " (clean(e)) } }
            }
            h2 { "Timeline" }
            table class="timeline" {
                thead { tr { th { "versi" } th { "what" } th { "shard" } th { "epoch" } th { "message id" } th { "at" } th { "note" } } }
                tbody {
                    @for l in &lines {
                        tr class={ "what-" (l.what.replace(' ', "-")) } {
                            td { (l.versi) @if l.through != l.versi { "–" (l.through) } }
                            td { (l.what) }
                            td { (l.shard.map_or_else(|| "-".to_owned(), |s| format!("{s:03}"))) }
                            td { (l.epoch) }
                            td { code { (clean(&l.message_id)) } }
                            td { (at(l.at)) }
                            td { (clean(&l.note)) }
                        }
                    }
                }
            }
            @if !x.skips.is_empty() {
                h2 { "Skipped" }
                ul { @for s in &x.skips { li { (clean(&format!("{s:?}"))) } } }
            }
            @if let Some(audit) = x.audit.as_ref().filter(|a| !a.is_empty()) {
                h2 { "Operator actions" }
                (audit_table(audit))
            }
        },
    )
}

/// The two buttons of a form that chooses dead letters: each posts the
/// same form to its action, which first asks to confirm.
fn dead_letter_buttons(what: &str) -> Markup {
    html! {
        p class="actions" {
            @for action in [DeadLetterAction::Replay, DeadLetterAction::Purge] {
                button type="submit" formaction=(action.path()) {
                    (action.verb()) " " (what) "…"
                }
                " "
            }
            "(you see what a replay would do, and confirm, on the next page)"
        }
    }
}

pub(super) fn dead_letters(rows: &[Listed], filter: &DeadLetterFilter, csrf: &Csrf) -> Markup {
    let value = |v: &Option<String>| v.clone().unwrap_or_default();
    page(
        "Dead letters",
        html! {
            form action="/dead-letters" method="get" class="filter" {
                label { "reason " input name="reason" value=(value(&filter.reason)); }
                label { "order " input name="order" value=(value(&filter.order)); }
                label { "since " input name="since" placeholder="2026-12-05T10:00:00Z" value=(value(&filter.since)); }
                button type="submit" { "Filter" }
            }
            p { (rows.len()) " unresolved record(s)" @if rows.len() as u32 >= LIST_AT_MOST { " (the oldest " (LIST_AT_MOST) " shown)" } }
            form action=(DeadLetterAction::Replay.path()) method="post" {
            (csrf_field(csrf))
            table {
                thead { tr { th { "select" } th { "id" } th { "dead-lettered" } th { "reason" } th { "order" } th { "versi" } th { "message id" } th { "detail" } } }
                tbody {
                    @for d in rows {
                        tr {
                            td { input type="checkbox" name="id" value=(d.id) aria-label={ "select dead letter " (d.id) }; }
                            td { a href={ "/dead-letters/" (d.id) } { (d.id) } }
                            td { (when(d.dead_lettered_at)) }
                            td { code { (d.reason) } }
                            td { @if let Some(o) = &d.pesanan_id { (order_link(o)) } @else { "-" } }
                            td { (opt(d.versi)) }
                            td { code { (clean(d.message_id.as_deref().unwrap_or("-"))) } }
                            td { (clean(&d.detail)) }
                        }
                    }
                }
            }
            @if !rows.is_empty() { (dead_letter_buttons("selected")) }
            }
        },
    )
}

/// One dead letter: why, the message as it was (headers, properties, the
/// body pretty-printed and capped), its deaths, and how to replay it.
pub(super) fn dead_letter(
    d: &urutan::store::dead_letter::Shown,
    body: &str,
    csrf: &Csrf,
) -> Markup {
    let pretty = |v: &serde_json::Value| serde_json::to_string_pretty(v).unwrap_or_default();
    page(
        &format!("Dead letter {}", d.id),
        html! {
            table {
                tbody {
                    tr { th { "reason" } td { code { (d.reason) } ": " (clean(&d.detail)) } }
                    tr { th { "order" } td { @if let Some(o) = &d.pesanan_id { (order_link(o)) } @else { "-" } @if let Some(v) = d.versi { " versi " (v) } } }
                    tr { th { "message id" } td { code { (clean(d.message_id.as_deref().unwrap_or("-"))) } } }
                    tr { th { "dead-lettered" } td { (when(d.dead_lettered_at)) " by the " (d.recorded_by) @if d.shard >= 0 { " on shard " (d.shard) } } }
                    tr { th { "state" } td {
                        @match d.resolved() {
                            Some((at, how)) => { (how) " " (when(at)) },
                            None => { "in the dead-letter queue" },
                        }
                    } }
                    @if let Some(e) = &d.last_error { tr { th { "last error" } td { (clean(e)) } } }
                    tr { th { "published to" } td { code { (clean(d.exchange.as_deref().unwrap_or("-"))) } " / " code { (clean(d.routing_key.as_deref().unwrap_or("-"))) } } }
                }
            }
            h2 { "Headers" }
            pre { (lines(&pretty(&d.headers.0))) }
            h2 { "Properties" }
            pre { (lines(&pretty(&d.properties.0))) }
            h2 { "Body (" (d.body_bytes) " bytes)" }
            pre { (lines(body)) }
            @if let Some(deaths) = &d.x_death {
                h2 { "x-death" }
                pre { (lines(&format!("{:#?}", deaths.0))) }
            }
            @if d.resolved().is_none() {
                h2 { "Replay or purge" }
                form action=(DeadLetterAction::Replay.path()) method="post" {
                    (csrf_field(csrf))
                    input type="hidden" name="id" value=(d.id);
                    (dead_letter_buttons("this message"))
                }
                p { "The same from a shell: " }
                pre { "urutan dlq replay " (clean(d.message_id.as_deref().unwrap_or("MESSAGE_ID"))) " --dry-run\nurutan dlq replay " (clean(d.message_id.as_deref().unwrap_or("MESSAGE_ID"))) }
            }
        },
    )
}

pub(super) fn holds(held: &[Hold], retrying: &[Retrying], csrf: &Csrf) -> Markup {
    page(
        "Held and retrying orders",
        html! {
            h2 { "Held (" (held.len()) ")" }
            form action="/holds/release" method="post" {
            (csrf_field(csrf))
            table {
                thead { tr { th { "release" } th { "order" } th { "why" } th { "since" } th { "versi" } th { "message id" } th { "waiting" } th { "error" } } }
                tbody {
                    @for h in held {
                        tr {
                            td { input type="checkbox" name="order" value=(h.order) aria-label={ "release " (clean(&h.order)) }; }
                            td { (order_link(&h.order)) }
                            td { code { (h.reason) } }
                            td { (when(h.since)) }
                            td { (opt(h.versi)) }
                            td { code { (clean(h.message_id.as_deref().unwrap_or("-"))) } }
                            td { (h.waiting) }
                            td { (clean(h.error.as_deref().unwrap_or(""))) }
                        }
                    }
                }
            }
            @if !held.is_empty() { p { button type="submit" { "Release the selected orders…" } " (you confirm on the next page)" } }
            }
            h2 { "Retrying (" (retrying.len()) ")" }
            table {
                thead { tr { th { "order" } th { "versi" } th { "message id" } th { "attempts" } th { "next try" } th { "last error" } } }
                tbody {
                    @for r in retrying {
                        tr {
                            td { (order_link(&r.order)) }
                            td { (r.versi) }
                            td { code { (clean(&r.message_id)) } }
                            td { (r.attempts) }
                            td { (when(r.next_try)) }
                            td { (clean(r.last_error.as_deref().unwrap_or(""))) }
                        }
                    }
                }
            }
        },
    )
}

/// What releasing `orders` does, before anything is done.
pub(super) fn confirm_release(orders: &[String], holds: &[Hold], csrf: &Csrf) -> Markup {
    page(
        "Release held orders?",
        html! {
            p {
                "Releasing an order records what holds it (the refused or missing version, or the dead-lettered effect) as "
                strong { "skipped" } "; the versions (or effects) waiting behind it then go on, in order. "
                "To apply the held version instead, fix its cause and replay it (" code { "urutan dlq replay" } ")."
            }
            table {
                thead { tr { th { "order" } th { "held" } th { "by" } th { "since" } th { "waiting" } } }
                tbody {
                    @for o in orders {
                        @let of: Vec<&Hold> = holds.iter().filter(|h| &h.order == o).collect();
                        @if of.is_empty() {
                            tr { td { (order_link(o)) } td colspan="4" { "not held (nothing will be done)" } }
                        }
                        @for h in of {
                            tr {
                                td { (order_link(o)) }
                                td { code { (h.reason) } @if let Some(e) = h.effect { " (effect " (e) ")" } }
                                td { (opt(h.versi).replace('?', "-")) " " code { (clean(h.message_id.as_deref().unwrap_or(""))) } }
                                td { (when(h.since)) }
                                td { (h.waiting) }
                            }
                        }
                    }
                }
            }
            form action="/holds/release" method="post" {
                (csrf_field(csrf))
                @for o in orders { input type="hidden" name="order" value=(o); }
                input type="hidden" name="confirm" value="yes";
                button type="submit" { "Release " (orders.len()) " order(s)" }
                " " a href="/holds" { "Cancel" }
            }
        },
    )
}

/// What each release did.
pub(super) fn released(results: &[(String, String, String)]) -> Markup {
    page(
        "Released",
        html! {
            table {
                thead { tr { th { "order" } th { "held" } th { "result" } } }
                tbody {
                    @for (order, target, result) in results {
                        tr { td { (order_link(order)) } td { (clean(target)) } td { (clean(result)) } }
                    }
                }
            }
            p { "Each action is in the " a href="/audit" { "audit" } "." }
        },
    )
}

/// A chosen record's columns: id, order and version, message id, reason.
fn chosen_cells(c: &Chosen) -> Markup {
    html! {
        td { a href={ "/dead-letters/" (c.id) } { (c.id) } }
        @match &c.record {
            Some(r) => {
                td { @if let Some(o) = &r.pesanan_id { (order_link(o)) } @else { "-" } @if let Some(v) = r.versi { " v" (v) } }
                td { code { (clean(r.message_id.as_deref().unwrap_or(&r.delivery_key))) } }
                td { code { (r.reason) } }
            }
            None => { td { "-" } td { "-" } td { "-" } }
        }
    }
}

/// What replaying (or purging) the chosen dead letters does, before
/// anything is done: for each, what `urutan dlq replay --dry-run` predicts.
pub(super) fn confirm_dead_letters(
    action: DeadLetterAction,
    chosen: &[Chosen],
    predictions: &[(i64, String)],
    csrf: &Csrf,
) -> Markup {
    let predicted = |id: i64| {
        predictions
            .iter()
            .find(|(p, _)| *p == id)
            .map_or("", |(_, said)| said.as_str())
    };
    page(
        &format!("{} dead letters?", action.verb()),
        html! {
            @match action {
                DeadLetterAction::Replay => p {
                    "Each message is published back to the entry exchange (publisher confirms) and only then removed from the dead-letter queue; "
                    "the pool processes it in order. An old version never overwrites newer state. What each would become, as "
                    code { "urutan dlq replay --dry-run" } " predicts it now:"
                },
                DeadLetterAction::Purge => p {
                    "Each message is removed from the dead-letter queue " strong { "for good" } " (the others stay) and its record marked purged. "
                    "What a replay would do instead, as " code { "urutan dlq replay --dry-run" } " predicts it now:"
                },
            }
            table {
                thead { tr { th { "id" } th { "order" } th { "message id" } th { "reason" } th { "what a replay would do (dry run)" } } }
                tbody {
                    @for c in chosen {
                        tr { (chosen_cells(c)) td { (clean(predicted(c.id))) } }
                    }
                }
            }
            form action=(action.path()) method="post" {
                (csrf_field(csrf))
                @for c in chosen { input type="hidden" name="id" value=(c.id); }
                input type="hidden" name="confirm" value="yes";
                button type="submit" { (action.verb()) " " (chosen.len()) " message(s)" }
                " " a href="/dead-letters" { "Cancel" }
            }
        },
    )
}

/// What replaying (or purging) did to each chosen dead letter.
pub(super) fn dead_letters_done(action: DeadLetterAction, outcomes: &[Outcome]) -> Markup {
    let title = match action {
        DeadLetterAction::Replay => "Replayed",
        DeadLetterAction::Purge => "Purged",
    };
    page(
        title,
        html! {
            table {
                thead { tr { th { "id" } th { "order" } th { "message" } th { "result" } } }
                tbody {
                    @for o in outcomes {
                        tr {
                            td { a href={ "/dead-letters/" (o.id) } { (o.id) } }
                            td { @if let Some(order) = &o.order { (order_link(order)) } @else { "-" } }
                            td { (clean(&o.target)) }
                            td { (clean(&o.result)) }
                        }
                    }
                }
            }
            p { "Each action is in the " a href="/audit" { "audit" } ". " a href="/dead-letters" { "Back to the dead letters" } }
        },
    )
}

fn audit_table(rows: &[AuditRow]) -> Markup {
    html! {
        table {
            thead { tr { th { "when" } th { "who" } th { "action" } th { "order" } th { "on" } th { "result" } } }
            tbody {
                @for a in rows {
                    tr {
                        td { (when(a.at)) }
                        td { (clean(&a.by)) }
                        td { code { (a.action) } }
                        td { @if let Some(o) = &a.order { (order_link(o)) } }
                        td { (clean(&a.target)) }
                        td { (clean(&a.result)) }
                    }
                }
            }
        }
    }
}

/// The newest operator actions.
pub(super) fn audit(rows: &[AuditRow]) -> Markup {
    page(
        "Audit",
        html! {
            p { "Operator actions taken in the console, newest first (at most " (LIST_AT_MOST) ")." }
            (audit_table(rows))
        },
    )
}

pub(super) fn effects(
    s: &urutan::effects::read::Summary,
    endpoints: &[urutan::effects::read::Endpoint],
    dead: &[urutan::effects::store::DeadEffect],
) -> Markup {
    page(
        "Effects",
        html! {
            table {
                tbody {
                    tr { th { "pending" } td { (s.pending) } td { "oldest " (at(s.oldest_pending_at)) } }
                    tr { th { "dead-lettered" } td { (s.dead_lettered) } td { (s.unresolved) " unresolved (holding their orders' later effects under EFFECTS_ON_DEAD=hold)" } }
                }
            }
            h2 { "By endpoint" }
            @if endpoints.is_empty() {
                p { "No endpoint is configured (EFFECTS_ROUTES)." }
            } @else {
                table {
                    thead { tr {
                        th { "endpoint (redacted)" } th { "pending" } th { "failing" }
                        th { "oldest pending" } th { "dead-lettered" } th { "last failure" }
                    } }
                    tbody {
                        @for e in endpoints {
                            tr {
                                td { code { (clean(&e.endpoint)) } }
                                td { (e.pending) }
                                td class=[(e.failing > 0).then_some("bad")] { (e.failing) }
                                td { (at(e.oldest_pending_at)) }
                                td class=[(e.dead_lettered > 0).then_some("bad")] { (e.dead_lettered) }
                                td { (e.last_failure.as_deref().map(|f| clean(&cap(f, 200))).unwrap_or_default()) }
                            }
                        }
                    }
                }
            }
            h2 { "Dead-lettered effects" }
            @if dead.is_empty() {
                p { "None." }
            } @else {
                table {
                    thead { tr {
                        th { "effect" } th { "order" } th { "versi" } th { "endpoint (redacted)" }
                        th { "attempts" } th { "status" } th { "dead-lettered" } th { "last answer" }
                    } }
                    tbody {
                        @for d in dead {
                            tr {
                                td { (d.effect) }
                                td { a href={ "/orders/" (path_segment(&d.order_id)) } { (clean(&d.order_id)) } }
                                td { (d.versi) }
                                td { code { (clean(&d.endpoint)) } }
                                td { (d.attempts) }
                                td { (d.http_status.map(|c| c.to_string()).unwrap_or_else(|| "-".into())) }
                                td { (at(d.dead_lettered_at)) }
                                td { (d.answer.as_deref().map(|a| clean(&cap(a, 200))).unwrap_or_default()) }
                            }
                        }
                    }
                }
                p { "Send them again: " code { "urutan dlq replay --effects ID…" } "; skip one and let its order's later effects go: " code { "urutan hold release --effects ORDER" } "." }
            }
        },
    )
}

/// At most `max` characters of `text`, `…` marking a cut.
fn cap(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_segment_keeps_nothing_that_could_leave_it() {
        assert_eq!(path_segment("A-1_b.c~"), "A-1_b.c~");
        assert_eq!(path_segment("a/b?c#d e"), "a%2Fb%3Fc%23d%20e");
        assert_eq!(path_segment("é"), "%C3%A9");
    }

    #[test]
    fn what_a_producer_wrote_is_text_not_markup() {
        let page = unknown_order("<script>alert(1)</script>").into_string();
        assert!(!page.contains("<script>"), "{page}");
        assert!(page.contains("&lt;script&gt;"), "{page}");
    }
}
