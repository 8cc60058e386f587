//! The Grafana dashboard (`deploy/grafana/urutan.json`) and the alert rules
//! (`deploy/prometheus/alerts.yaml`) query only metrics that exist: every
//! `urutan_*` name is one `src/metrics.rs` names and the real `urutan run` /
//! `urutan relay` / `urutan effects` processes export, every `rabbitmq_*`
//! name is one the broker's `rabbitmq_prometheus` plugin serves on
//! `/metrics/per-object`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::{Msg, TestEnv, UrutanProcess, enqueue_tx, http_get, metric_sum, sh};

const DASHBOARD: &str = include_str!("../../deploy/grafana/urutan.json");
const ALERTS: &str = include_str!("../../deploy/prometheus/alerts.yaml");
const METRICS_RS: &str = include_str!("../../crates/urutan/src/metrics.rs");
/// The broker's Prometheus endpoint with per-queue series (`vhost`, `queue`).
const RABBITMQ_METRICS: &str = "/metrics/per-object";
const RABBITMQ_PROMETHEUS_PORT: u16 = 15692;

/// Metric names in `text`: tokens `urutan_…` or `rabbitmq_…` (lower case,
/// digits, `_`), with a histogram's `_bucket`/`_sum`/`_count` stripped.
fn metric_names(text: &str) -> BTreeSet<String> {
    let word = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_';
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(pos) = rest.find(['u', 'r']) {
        let preceded_by_word = rest[..pos]
            .chars()
            .next_back()
            .is_some_and(|c| word(c) || c.is_ascii_uppercase());
        let token: String = rest[pos..].chars().take_while(|c| word(*c)).collect();
        if !preceded_by_word && (token.starts_with("urutan_") || token.starts_with("rabbitmq_")) {
            names.insert(base_name(&token).to_owned());
        }
        rest = &rest[pos + token.len().max(1)..];
    }
    names
}

fn base_name(name: &str) -> &str {
    ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|suffix| name.strip_suffix(suffix))
        .unwrap_or(name)
}

/// Every PromQL query of a Grafana dashboard: panel targets' `expr`, and
/// template variables' `query`/`definition`.
fn dashboard_queries(dashboard: &str) -> Vec<String> {
    fn walk(value: &serde_json::Value, out: &mut Vec<String>) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, value) in map {
                    match (key.as_str(), value) {
                        ("expr" | "query" | "definition", serde_json::Value::String(q)) => {
                            out.push(q.clone())
                        }
                        _ => walk(value, out),
                    }
                }
            }
            serde_json::Value::Array(values) => values.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let json: serde_json::Value = serde_json::from_str(dashboard).expect("dashboard is JSON");
    assert!(json["panels"].is_array(), "a dashboard has panels");
    let mut out = Vec::new();
    walk(&json, &mut out);
    out
}

/// Every `expr:` of a rules file, inline or as an indented block (`expr: |`).
fn rule_expressions(rules: &str) -> Vec<String> {
    let indent = |l: &str| l.len() - l.trim_start().len();
    let mut out = Vec::new();
    let mut lines = rules.lines().peekable();
    while let Some(line) = lines.next() {
        let Some(rest) = line.trim_start().strip_prefix("expr:") else {
            continue;
        };
        let rest = rest.trim();
        if !rest.starts_with(['|', '>']) {
            out.push(rest.to_owned());
            continue;
        }
        let mut block = String::new();
        while let Some(next) = lines.next_if(|l| l.trim().is_empty() || indent(l) > indent(line)) {
            block.push_str(next.trim());
            block.push('\n');
        }
        out.push(block);
    }
    out
}

/// The metric names `src/metrics.rs` defines (`pub const X: &str = "urutan_…";`).
fn code_names() -> BTreeSet<String> {
    METRICS_RS
        .lines()
        .filter(|l| l.starts_with("pub const ") && l.contains(": &str = \"urutan_"))
        .filter_map(|l| l.split('"').nth(1))
        .map(str::to_owned)
        .collect()
}

/// Every metric name the dashboard and the alert rules query.
fn used_names() -> BTreeSet<String> {
    let queries = dashboard_queries(DASHBOARD);
    let exprs = rule_expressions(ALERTS);
    assert!(queries.len() > 20, "dashboard queries found: {queries:?}");
    assert!(exprs.len() > 10, "alert expressions found: {exprs:?}");
    queries
        .iter()
        .chain(&exprs)
        .flat_map(|q| metric_names(q))
        .collect()
}

/// The `urutan_*` names in `used` that `known` lacks.
fn unknown_urutan_names(used: &BTreeSet<String>, known: &BTreeSet<String>) -> Vec<String> {
    used.iter()
        .filter(|n| n.starts_with("urutan_") && !known.contains(*n))
        .cloned()
        .collect()
}

#[test]
fn the_scanner_catches_a_misspelled_metric() {
    let dashboard = r#"{"panels": [{"targets": [
        {"expr": "sum by (le) (rate(urutan_handle_duration_seconds_bucket[5m]))"},
        {"expr": "sum(rate(urutan_mesages_total{shard=~\"$shard\"}[5m])) + rabbitmq_queue_consumers"}]}]}"#;
    let used: BTreeSet<String> = dashboard_queries(dashboard)
        .iter()
        .flat_map(|q| metric_names(q))
        .collect();
    let expected: BTreeSet<String> = [
        "urutan_handle_duration_seconds",
        "urutan_mesages_total",
        "rabbitmq_queue_consumers",
    ]
    .map(str::to_owned)
    .into();
    assert_eq!(used, expected);
    assert_eq!(
        unknown_urutan_names(&used, &code_names()),
        ["urutan_mesages_total"]
    );
    let rules = "      - alert: X\n        expr: |\n          max(urutan_ready)\n          and urutan_shards\n        for: 1m\n      - alert: Y\n        expr: up == 0\n";
    assert_eq!(
        rule_expressions(rules),
        ["max(urutan_ready)\nand urutan_shards\n", "up == 0"]
    );
}

#[test]
fn the_dashboard_and_alerts_use_only_metrics_the_code_names() {
    let known = code_names();
    assert!(
        known.contains("urutan_messages_total") && known.len() >= 18,
        "metric constants read from src/metrics.rs: {known:?}"
    );
    let used = used_names();
    let unknown = unknown_urutan_names(&used, &known);
    assert!(
        unknown.is_empty(),
        "deploy/grafana/urutan.json or deploy/prometheus/alerts.yaml query metrics \
         src/metrics.rs does not define: {unknown:?}"
    );
    for contract in [
        "urutan_messages_total",
        "urutan_dead_letters_total",
        "urutan_retries_total",
        "urutan_handle_duration_seconds",
        "urutan_end_to_end_lag_seconds",
        "urutan_broker_reconnects_total",
        "urutan_outbox_published_total",
        "urutan_outbox_backlog",
        "urutan_ready",
        "rabbitmq_queue_messages_ready",
        "rabbitmq_queue_consumers",
    ] {
        assert!(used.contains(contract), "nothing shows {contract}");
    }
}

/// `urutan <command>` pointed at `env` (2 shards), with `extra` variables.
fn start(env: &TestEnv, command: &str, extra: &[(&str, &str)]) -> UrutanProcess {
    let mut vars: Vec<(String, String)> = (env.process_env(2).into_iter())
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    vars.extend(
        extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    UrutanProcess::start(command, &vars)
}

/// The metric names of a Prometheus text scrape (histograms by base name).
fn scrape_names(scrape: &str) -> BTreeSet<String> {
    scrape
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(|n| base_name(n).to_owned())
        .collect()
}

/// True if a sample of `name` has every `label="value"` of `labels`.
fn has_series(scrape: &str, name: &str, labels: &[&str]) -> bool {
    scrape
        .lines()
        .any(|l| l.split(['{', ' ']).next() == Some(name) && labels.iter().all(|f| l.contains(f)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_of_the_dashboard_and_alerts_is_exported() {
    let used = used_names();
    let env = TestEnv::new("deploy").await;
    let mut worker = start(&env, "run", &[]);
    let ready = |s: &str| metric_sum(s, "urutan_ready", &["role=\"worker\""]) == 1.0;
    let first = worker
        .wait_scrape(
            "urutan_ready{role=\"worker\"} 1",
            Duration::from_secs(60),
            ready,
        )
        .await;
    assert_eq!(http_get(worker.http(), "/readyz").await.0, 200);

    // Zero-initialised from the first scrape: each shard's outcomes.
    for shard in ["0", "1"] {
        let shard = format!("shard=\"{shard}\"");
        for outcome in ["applied", "stale", "duplicate", "dead_lettered"] {
            let outcome = format!("outcome=\"{outcome}\"");
            assert!(
                has_series(&first, "urutan_messages_total", &[&shard, &outcome]),
                "urutan_messages_total{{{shard},{outcome}}} missing:\n{first}"
            );
        }
    }
    // A dead-letter or retry reason appears when first counted (issue 48:
    // no shards x reasons of zeros up front): none yet.
    for lazy in ["urutan_dead_letters_total", "urutan_retries_total"] {
        assert!(
            !has_series(&first, lazy, &[]),
            "{lazy} before any was counted:\n{first}"
        );
    }
    assert!(has_series(&first, "urutan_broker_reconnects_total", &[]));

    let mut relay = start(&env, "relay", &[]);
    relay
        .wait_scrape(
            "urutan_ready{role=\"relay\"} 1",
            Duration::from_secs(60),
            |s| metric_sum(s, "urutan_ready", &["role=\"relay\""]) == 1.0,
        )
        .await;

    // Traffic: an outbox event (relay → worker: applied) and a poison
    // message (dead-lettered).
    let db = env.db().await;
    enqueue_tx(&db, &[("P-deploy-1".to_owned(), 1)]).await;
    let mut poison = Msg::event("P-deploy-2", 1);
    poison.body = b"{not json".to_vec();
    env.publisher().await.send(&poison).await;

    let limit = Duration::from_secs(60);
    let worker_scrape = worker
        .wait_scrape("an applied and a dead-lettered message", limit, |s| {
            metric_sum(s, "urutan_messages_total", &["outcome=\"applied\""]) >= 1.0
                && metric_sum(s, "urutan_dead_letters_total", &["reason=\"invalid_json\""]) >= 1.0
        })
        .await;
    let relay_scrape = relay
        .wait_scrape("an outbox row published", limit, |s| {
            metric_sum(s, "urutan_outbox_published_total", &[]) >= 1.0
                && has_series(s, "urutan_outbox_backlog", &[])
        })
        .await;

    // The broker drops both connections: each process reconnects and counts
    // it (UrutanBrokerReconnectStorm), the relay too.
    sh(
        "rabbitmqctl",
        &[
            "-q",
            "close_all_connections",
            "--vhost",
            &env.vhost,
            "deploy test",
        ],
    );
    for (process, role) in [(&mut worker, "worker"), (&mut relay, "relay")] {
        let ready = format!("role=\"{role}\"");
        process
            .wait_scrape(
                &format!("the {role} to count its reconnect and be ready again"),
                limit,
                |s| {
                    metric_sum(s, "urutan_broker_reconnects_total", &[]) >= 1.0
                        && metric_sum(s, "urutan_ready", &[&ready]) == 1.0
                },
            )
            .await;
    }

    // A second relay stands by (the first holds the outbox lock): not ready,
    // and its gauge says so as /readyz does.
    let mut standby = start(&env, "relay", &[]);
    standby
        .wait_scrape("a standby relay's urutan_ready 0", limit, |s| {
            has_series(s, "urutan_ready", &["role=\"relay\""])
                && metric_sum(s, "urutan_ready", &["role=\"relay\""]) == 0.0
        })
        .await;
    assert_eq!(http_get(standby.http(), "/readyz").await.0, 503);
    drop(standby);

    // The effects dispatcher (an endpoint nobody listens on: it retries).
    let mut effects = start(
        &env,
        "effects",
        &[
            ("EFFECTS", "*=http://127.0.0.1:9/hook"),
            ("EFFECTS_SECRET", "a-secret-of-sixteen-bytes-or-more"),
        ],
    );
    let effects_scrape = effects
        .wait_scrape(
            "urutan_ready{role=\"effects\"} 1 and its backlog",
            limit,
            |s| {
                metric_sum(s, "urutan_ready", &["role=\"effects\""]) == 1.0
                    && has_series(s, "urutan_effects_backlog", &[])
            },
        )
        .await;
    let in_effects = scrape_names(&effects_scrape);

    let (in_worker, in_relay) = (scrape_names(&worker_scrape), scrape_names(&relay_scrape));
    let mut missing = Vec::new();
    let mut exporter = BTreeMap::new();
    // Created by the first retry (tests/it/rust_handler.rs, dlq.rs count it);
    // this traffic has none.
    let counted_on_first_use = ["urutan_retries_total"];
    for name in used
        .iter()
        .filter(|n| n.starts_with("urutan_") && !counted_on_first_use.contains(&n.as_str()))
    {
        let by = match (in_worker.contains(name), in_relay.contains(name)) {
            (true, true) => "worker+relay",
            (true, false) => "worker",
            (false, true) => "relay",
            (false, false) if in_effects.contains(name) => "effects",
            (false, false) => {
                missing.push(name.clone());
                continue;
            }
        };
        exporter.insert(name.clone(), by);
    }
    eprintln!("urutan metrics the dashboard and alerts use, by exporter: {exporter:#?}");
    assert!(
        missing.is_empty(),
        "queried by the dashboard or the alerts but exported by none of urutan run, \
         urutan relay, urutan effects: {missing:?}\nworker:\n{worker_scrape}\nrelay:\n{relay_scrape}\n\
         effects:\n{effects_scrape}"
    );

    rabbitmq_names_are_served(&env, &used).await;
}

/// Every `rabbitmq_*` name in `used` is served on the broker's per-object
/// endpoint for this test's vhost, with the shard and DLQ queue labels the
/// rules match on.
async fn rabbitmq_names_are_served(env: &TestEnv, used: &BTreeSet<String>) {
    let broker = SocketAddr::from(([127, 0, 0, 1], RABBITMQ_PROMETHEUS_PORT));
    if http_get(broker, RABBITMQ_METRICS).await.0 != 200 {
        let enabled = Command::new("rabbitmq-plugins")
            .args(["-q", "enable", "rabbitmq_prometheus"])
            .output()
            .is_ok_and(|o| o.status.success());
        if !enabled {
            eprintln!(
                "SKIPPED the rabbitmq_* half: the rabbitmq_prometheus plugin is not enabled \
                 and `rabbitmq-plugins enable rabbitmq_prometheus` failed \
                 (deploy/local/setup.sh enables it)"
            );
            return;
        }
    }
    let names: Vec<&String> = used.iter().filter(|n| n.starts_with("rabbitmq_")).collect();
    assert!(!names.is_empty(), "the dashboard shows no RabbitMQ metric");
    let vhost = format!("vhost=\"{}\"", env.vhost);
    let start = Instant::now();
    let limit = Duration::from_secs(60);
    loop {
        let (_, scrape) = http_get(broker, RABBITMQ_METRICS).await;
        let missing: Vec<_> = names
            .iter()
            .filter(|n| !has_series(&scrape, n, &[&vhost]))
            .collect();
        // The queue labels the alerts match: pesanan.shard-NNN with its
        // consumer, and pesanan.dlq holding the poison message.
        let shard_consumed = metric_sum(
            &scrape,
            "rabbitmq_queue_consumers",
            &[&vhost, "queue=\"pesanan.shard-000\""],
        ) >= 1.0;
        let dlq = metric_sum(
            &scrape,
            "rabbitmq_queue_messages",
            &[&vhost, "queue=\"pesanan.dlq\""],
        );
        if missing.is_empty() && shard_consumed && dlq >= 1.0 {
            return;
        }
        assert!(
            start.elapsed() < limit,
            "after {limit:?} RabbitMQ's {RABBITMQ_METRICS} lacks {missing:?} for {vhost} \
             (shard-000 consumed: {shard_consumed}, DLQ messages: {dlq})"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
