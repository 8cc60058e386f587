//! Test harness: every test gets its own RabbitMQ vhost and PostgreSQL
//! database (dropped at the end, even on panic), talks to the real services,
//! and bounds every wait.

use std::future::Future;
use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use urutan::config::{SecretUrl, Settings};
use urutan::outcome::Outcome;
use urutan::shard::{Hooks, Observed};
use urutan::supervisor::{RunError, Supervisor};

pub const AMQP_BASE: &str = "amqp://guest:guest@127.0.0.1:5672";
pub const PG_BASE: &str = "postgres://postgres@127.0.0.1:5432";

// The broker under test is the local one unless the environment names
// another (deploy/brokers/matrix.sh runs the suite on RabbitMQ 4.0 and 4.3):
//
// | variable | default |
// |---|---|
// | `URUTAN_TEST_AMQP_BASE` | [`AMQP_BASE`] |
// | `URUTAN_TEST_RABBITMQCTL` | `rabbitmqctl` |
// | `URUTAN_TEST_RABBITMQ_DIAGNOSTICS` | `rabbitmq-diagnostics` |
// | `URUTAN_TEST_RABBITMQ_PLUGINS` | `rabbitmq-plugins` |
//
// The CLI variables are command lines, split on whitespace, e.g.
// `bash deploy/brokers/node.sh ctl urutan-m43`.

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| default.to_owned())
}

/// `amqp://guest:guest@host:port` of the broker under test.
pub fn amqp_base() -> String {
    env_or("URUTAN_TEST_AMQP_BASE", AMQP_BASE)
}

/// `host:port` of the broker under test.
pub fn amqp_addr() -> String {
    let base = amqp_base();
    let rest = base.split_once("://").map_or(base.as_str(), |(_, r)| r);
    let addr = rest.rsplit_once('@').map_or(rest, |(_, a)| a);
    addr.trim_end_matches('/').to_owned()
}

/// An AMQP URL of the broker under test for `user` in `vhost`.
pub fn amqp_url_as(user: &str, password: &str, vhost: &str) -> String {
    format!(
        "amqp://{user}:{password}@{}/{}",
        amqp_addr(),
        vhost.replace('/', "%2f")
    )
}

/// The command line that stands for a RabbitMQ CLI tool of the broker under
/// test (`rabbitmqctl`, `rabbitmq-diagnostics`, `rabbitmq-plugins`); any
/// other program as it is.
pub fn cli_line(program: &str) -> String {
    match program {
        "rabbitmqctl" => env_or("URUTAN_TEST_RABBITMQCTL", program),
        "rabbitmq-diagnostics" => env_or("URUTAN_TEST_RABBITMQ_DIAGNOSTICS", program),
        "rabbitmq-plugins" => env_or("URUTAN_TEST_RABBITMQ_PLUGINS", program),
        _ => program.to_owned(),
    }
}

/// A [`Command`] for `program`, the RabbitMQ CLI tools aimed at the broker
/// under test (see [`cli_line`]).
pub fn command(program: &str) -> Command {
    let line = cli_line(program);
    let mut words = line.split_whitespace();
    let mut cmd = Command::new(words.next().unwrap_or(program));
    cmd.args(words);
    cmd
}

/// Waits for `cond` to hold, polling every 100 ms, for at most `limit`.
pub async fn wait_for<F, Fut>(what: &str, limit: Duration, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if cond().await {
            return;
        }
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether the broker under test keeps its consistent-hash rings across a
/// restart: Khepri (its metadata store from 4.2, the only one from 4.3)
/// stores them; the Mnesia store (3.x up to 4.1) rebuilds them at boot in
/// an order of its own.
pub fn broker_keeps_rings() -> bool {
    let khepri = "try rabbit_khepri:is_enabled() catch _:_ -> false end.";
    sh("rabbitmqctl", &["-q", "eval", khepri]).trim() == "true"
}

/// Restarts the broker app (`stop_app`, `start_app`, `await_startup`) until
/// the consistent-hash ring of `env`'s `pesanan-hash` differs from the one
/// before, at most eight times, and returns whether it did. The Mnesia store
/// (3.x up to 4.1) rebuilds the ring at boot in an order of its own, which
/// now and then is the old one (4.0.5 did in about half its restarts):
/// a scenario about keys that move must see them move. A broker on Khepri
/// (4.2+) keeps its ring: one restart, and the ring must be the same.
///
/// Call it from a multi-threaded runtime: it blocks (CLI calls, sleeps)
/// inside `block_in_place`, so the relay and producers on the same runtime
/// keep running meanwhile.
pub fn restart_broker_until_the_ring_changes(env: &TestEnv) -> bool {
    tokio::task::block_in_place(|| restart_until_the_ring_changes(env))
}

fn restart_until_the_ring_changes(env: &TestEnv) -> bool {
    let keeps = broker_keeps_rings();
    let before = ring(env);
    for restart in 1..=8 {
        sh("rabbitmqctl", &["-q", "stop_app"]);
        sh("rabbitmqctl", &["-q", "start_app"]);
        sh("rabbitmqctl", &["-q", "await_startup"]);
        let changed = settled_ring(env, before.len()) != before;
        if keeps {
            assert!(!changed, "a broker on Khepri rebuilt its ring at a restart");
            return false;
        }
        if changed {
            return true;
        }
        eprintln!("restart {restart}: the broker rebuilt the same ring; again");
    }
    panic!("eight broker restarts rebuilt the same ring: the test would prove nothing");
}

/// The ring once the broker has rebuilt it: `buckets` long and the same in
/// two reads 500 ms apart (bounded by 30 s). Right after `await_startup`
/// 4.0.5 can still be adding bindings, and a half-built ring compares as
/// "changed" while the finished one is the old (a run saw "changed" and
/// then 0 of 300 orders moved).
fn settled_ring(env: &TestEnv, buckets: usize) -> Vec<String> {
    let start = Instant::now();
    let mut last = ring(env);
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let now = ring(env);
        if now.len() == buckets && now == last {
            return now;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the ring did not settle at {buckets} buckets within 30 s: {} now",
            now.len()
        );
        last = now;
    }
}

/// After [`restart_broker_until_the_ring_changes`]: some order changed shard
/// if and only if the ring changed.
pub fn assert_orders_moved_as_the_ring_did(ring_changed: bool, moved: i64) {
    if ring_changed {
        assert!(
            moved > 0,
            "the ring changed and no order moved: the test proved nothing"
        );
    } else {
        assert_eq!(
            moved, 0,
            "the ring was kept and {moved} orders changed shard"
        );
    }
}

/// Runs a command line and panics with its output if it fails; the
/// RabbitMQ CLI tools act on the broker under test (see [`command`]).
pub fn sh(program: &str, args: &[&str]) -> String {
    let out = command(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `rabbitmqctl` (the broker under test) off the async runtime: it takes
/// about a second.
pub async fn ctl(args: Vec<String>) -> String {
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        sh("rabbitmqctl", &args)
    })
    .await
    .expect("rabbitmqctl task panicked")
}

/// Runs `sql` as the superuser in the `postgres` database (statements
/// about databases and roles) and panics with psql's output if it fails;
/// the output (`-Atq`: the rows' values).
pub fn psql(sql: &str) -> String {
    sh("psql", &crate::psql::superuser_args("postgres", sql))
}

/// [`psql`] for a clean-up (in a `Drop`): a failure is ignored.
pub fn psql_ignoring_failure(sql: &str) {
    let _ = crate::psql::superuser("postgres", sql).output();
}

/// `env`'s database refusing connections (`ALLOW_CONNECTIONS false`, its
/// sessions terminated) until [`Self::allow`] or the drop, which lets them
/// in again also when the test fails meanwhile (so the database can be
/// dropped and nothing is left behind).
pub struct RefusedConnections {
    allow: String,
}

impl RefusedConnections {
    pub fn start(env: &TestEnv) -> Self {
        psql(&format!(
            "ALTER DATABASE \"{0}\" ALLOW_CONNECTIONS false; \
             SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = '{0}'",
            env.database
        ));
        Self {
            allow: format!("ALTER DATABASE \"{}\" ALLOW_CONNECTIONS true", env.database),
        }
    }

    /// Lets connections in again, and panics if psql fails (the drop does
    /// it once more, harmlessly).
    pub fn allow(self) {
        psql(&self.allow);
    }
}

impl Drop for RefusedConnections {
    fn drop(&mut self) {
        psql_ignoring_failure(&self.allow);
    }
}

/// A vhost and a database of one's own, dropped at the end (even on
/// panic; kept for inspection when a test fails with `URUTAN_TEST_KEEP`
/// set): the shared scratch type (`urutan_testkit::scratch`), with the
/// tests' conveniences below.
pub use crate::scratch::Scratch as TestEnv;

/// Fails once, with what to do, when the services every integration test
/// needs are not there (instead of a refused connection deep in a test).
fn require_services() {
    static CHECKED: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    let checked = CHECKED.get_or_init(|| {
        let timeout = Duration::from_secs(3);
        let reachable = |addr: &str| {
            use std::net::ToSocketAddrs;
            addr.to_socket_addrs()
                .ok()
                .and_then(|mut a| a.next())
                .is_some_and(|a| std::net::TcpStream::connect_timeout(&a, timeout).is_ok())
        };
        let pg = PG_BASE.rsplit_once('@').map_or(PG_BASE, |(_, a)| a);
        let mut missing = Vec::new();
        if !reachable(&amqp_addr()) {
            missing.push(format!("RabbitMQ at {}", amqp_addr()));
        }
        if !reachable(pg) {
            missing.push(format!("PostgreSQL at {pg}"));
        }
        if command("rabbitmqctl").arg("--help").output().is_err() {
            missing.push("the `rabbitmqctl` command".to_owned());
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "the integration tests need a live RabbitMQ (with the consistent-hash \
                 plugin) and PostgreSQL; missing: {}. `bash deploy/local/test.sh` installs, \
                 starts and prepares them, then runs the suite (see the README).",
                missing.join(", ")
            ))
        }
    });
    if let Err(what) = checked {
        panic!("{what}");
    }
}

impl TestEnv {
    /// A vhost and a database of one's own on the broker and database
    /// under test; panics with what to do if the live services are missing.
    pub async fn new(test: &str) -> Self {
        require_services();
        let place = crate::scratch::Place {
            amqp_bases: vec![amqp_base()],
            pg_base: PG_BASE.to_owned(),
            rabbitmqctl: cli_line("rabbitmqctl")
                .split_whitespace()
                .map(str::to_owned)
                .collect(),
            pg_socket_dir: None,
        };
        let name = format!("{test}_{:08x}", rand::random::<u32>());
        let keep = crate::scratch::Keep {
            var: "URUTAN_TEST_KEEP",
            only_on_panic: true,
        };
        Self::create(place, "test", &name, Some(keep))
            .await
            .expect("create the test's vhost and database")
    }

    /// Default settings pointed at this environment, HTTP on a free port.
    pub fn settings(&self, shards: u16) -> Settings {
        Settings {
            amqp_url: self.amqp_url().into(),
            database_url: self.database_url(),
            shard_count: shards,
            metrics_addr: "127.0.0.1:0".parse().expect("addr"),
            ..Settings::default()
        }
    }

    /// Environment variables that point the `urutan` binary here.
    pub fn process_env(&self, shards: u16) -> Vec<(&'static str, String)> {
        vec![
            ("AMQP_URL", self.amqp_url().expose().to_owned()),
            ("DATABASE_URL", self.database_url().expose().to_owned()),
            ("SHARD_COUNT", shards.to_string()),
            ("METRICS_ADDR", "127.0.0.1:0".to_owned()),
            ("RUST_LOG", "info".to_owned()),
        ]
    }

    pub async fn db(&self) -> PgPool {
        urutan::store::prepare(&self.database_url(), 4)
            .await
            .expect("connect test database")
    }

    pub async fn broker(&self) -> Connection {
        Connection::connect(self.amqp_url().expose(), ConnectionProperties::default())
            .await
            .expect("connect test vhost")
    }

    pub async fn publisher(&self) -> Publisher {
        Publisher::on(self.broker().await).await
    }

    /// A publisher connected as `user` (made with [`BrokerUsers::add`]).
    pub async fn publisher_as(&self, user: &str, password: &str) -> Publisher {
        let url = amqp_url_as(user, password, &self.vhost);
        let conn = Connection::connect(&url, ConnectionProperties::default())
            .await
            .expect("connect as the user");
        Publisher::on(conn).await
    }
}

/// One message as a test wants to publish it; every field can break the contract.
#[derive(Clone, Debug)]
pub struct Msg {
    pub message_id: Option<String>,
    pub header: Option<AMQPValue>,
    pub delivery_mode: Option<u8>,
    pub body: Vec<u8>,
}

impl Msg {
    /// A valid event for `entity` at `versi`, message id `<entity>-v<versi>`.
    pub fn event(entity: &str, versi: i64) -> Self {
        Self::event_with(entity, versi, &format!("{entity}-v{versi}"), "dibuat")
    }

    /// Its AMQP properties: message id, delivery mode, `x-pesanan-id`, as set.
    pub fn properties(&self) -> BasicProperties {
        let mut props = BasicProperties::default();
        if let Some(id) = &self.message_id {
            props = props.with_message_id(id.as_str().into());
        }
        if let Some(mode) = self.delivery_mode {
            props = props.with_delivery_mode(mode);
        }
        if let Some(header) = &self.header {
            let mut headers = FieldTable::default();
            headers.insert("x-pesanan-id".into(), header.clone());
            props = props.with_headers(headers);
        }
        props
    }

    pub fn event_with(entity: &str, versi: i64, message_id: &str, status: &str) -> Self {
        let body = serde_json::json!({"id": entity, "status": status, "versi": versi});
        Self {
            message_id: Some(message_id.to_owned()),
            header: Some(AMQPValue::LongString(LongString::from(entity.as_bytes()))),
            delivery_mode: Some(2),
            body: body.to_string().into_bytes(),
        }
    }
}

pub struct Publisher {
    _conn: Connection,
    pub channel: Channel,
}

impl Publisher {
    /// A confirming channel on `conn`.
    async fn on(conn: Connection) -> Self {
        let channel = conn.create_channel().await.expect("channel");
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .expect("confirms");
        Publisher {
            _conn: conn,
            channel,
        }
    }

    /// Publishes to the entry exchange and waits for the broker's confirm.
    pub async fn send(&self, msg: &Msg) {
        self.send_to("pesanan", "pesanan.test", msg).await;
    }

    pub async fn send_to(&self, exchange: &str, routing_key: &str, msg: &Msg) {
        self.send_all_to(exchange, routing_key, std::slice::from_ref(msg))
            .await;
    }

    /// Publishes `msgs` in order, pipelined, then waits for every confirm.
    pub async fn send_all(&self, msgs: &[Msg]) {
        self.send_all_to("pesanan", "pesanan.test", msgs).await;
    }

    pub async fn send_all_to(&self, exchange: &str, routing_key: &str, msgs: &[Msg]) {
        let raw = msgs.iter().map(|msg| Raw {
            exchange,
            routing_key,
            props: msg.properties(),
            body: msg.body.clone(),
        });
        self.send_raw(raw.collect()).await;
    }

    /// Publishes each of `raw` (anything a producer may send), then waits for
    /// every confirm; panics on a timeout or a nack.
    pub async fn send_raw(&self, raw: Vec<Raw<'_>>) {
        let mut confirms = Vec::with_capacity(raw.len());
        for r in raw {
            let confirm = tokio::time::timeout(
                Duration::from_secs(10),
                self.channel.basic_publish(
                    r.exchange.into(),
                    r.routing_key.into(),
                    BasicPublishOptions::default(),
                    &r.body,
                    r.props,
                ),
            )
            .await
            .expect("publish timed out")
            .expect("publish");
            confirms.push(confirm);
        }
        for confirm in confirms {
            let confirmation = tokio::time::timeout(Duration::from_secs(30), confirm)
                .await
                .expect("confirm timed out")
                .expect("confirm");
            assert!(confirmation.is_ack(), "broker nacked a publish");
        }
    }
}

/// One publish exactly as given: exchange, routing key, properties, body.
pub struct Raw<'a> {
    pub exchange: &'a str,
    pub routing_key: &'a str,
    pub props: BasicProperties,
    pub body: Vec<u8>,
}

/// Ready messages in `queue` (unacked ones are not counted).
pub async fn queue_len(conn: &Connection, queue: &str) -> u32 {
    let ch = conn.create_channel().await.expect("channel");
    let q = ch
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("passive declare");
    let _ = urutan::broker::call("channel.close", ch.close(200, "".into())).await;
    q.message_count()
}

/// Takes every message out of the dead-letter queue (acking them).
pub async fn drain_dlq(conn: &Connection) -> Vec<lapin::message::BasicGetMessage> {
    use lapin::options::{BasicAckOptions, BasicGetOptions};
    let ch = conn.create_channel().await.expect("channel");
    let mut out = Vec::new();
    while let Some(msg) = ch
        .basic_get("pesanan.dlq".into(), BasicGetOptions::default())
        .await
        .expect("basic.get")
    {
        msg.delivery
            .acker
            .ack(BasicAckOptions::default())
            .await
            .expect("ack");
        out.push(msg);
    }
    out
}

/// The `message_id` of a message taken out of a queue (a dead letter).
pub fn message_id(msg: &lapin::message::BasicGetMessage) -> Option<&str> {
    let id = msg.delivery.properties.message_id().as_ref();
    id.map(|id| id.as_str())
}

/// Drains the DLQ until `n` messages came out (bounded by `limit`), then
/// checks for half a second that no more arrive.
pub async fn drain_dlq_expecting(
    conn: &Connection,
    n: usize,
    limit: Duration,
) -> Vec<lapin::message::BasicGetMessage> {
    let start = Instant::now();
    let mut dead = Vec::new();
    while dead.len() < n {
        assert!(
            start.elapsed() < limit,
            "timed out: {} of {n} dead letters after {limit:?}",
            dead.len()
        );
        dead.extend(drain_dlq(conn).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    dead.extend(drain_dlq(conn).await);
    dead
}

/// Rows of `pesanan_riwayat` in apply order: (entity, versi, shard).
pub async fn history(db: &PgPool) -> Vec<(String, i64, i32)> {
    sqlx::query_as("SELECT pesanan_id, versi, shard FROM pesanan_riwayat ORDER BY seq")
        .fetch_all(db)
        .await
        .expect("history")
}

pub async fn count(db: &PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(db).await.expect(sql)
}

/// Waits (at most `limit`) until `sql`, a `count(*)`, counts `n`.
pub async fn wait_count(db: &PgPool, sql: &'static str, n: i64, limit: Duration) {
    let what = format!("`{sql}` to count {n}");
    wait_for(&what, limit, || async move { count(db, sql).await == n }).await;
}

/// The outcomes a pool reported, in order: (message id, outcome).
pub type Outcomes = std::sync::Arc<std::sync::Mutex<Vec<(String, Outcome)>>>;

/// Hooks that record every outcome the pool reports, in order (for a
/// parked message: when it is released), and the record they fill.
pub fn outcome_recorder() -> (Outcomes, Hooks) {
    let seen: Outcomes = Outcomes::default();
    let hooks = {
        let seen = seen.clone();
        Hooks {
            on_outcome: Some(std::sync::Arc::new(move |o: &Observed<'_>| {
                seen.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((o.message_id.unwrap_or("").to_owned(), o.outcome));
            })),
            ..Hooks::default()
        }
    };
    (seen, hooks)
}

/// An order's stored version (`pesanan.versi`), if it has one.
pub async fn stored(db: &PgPool, order: &str) -> Option<i64> {
    sqlx::query_scalar("SELECT versi FROM pesanan WHERE id = $1")
        .bind(order)
        .fetch_optional(db)
        .await
        .expect("stored")
}

/// Waits (at most 30 s) until `order` is stored at `versi`.
pub async fn wait_stored(db: &PgPool, order: &str, versi: i64) {
    wait_for(
        &format!("{order} stored at v{versi}"),
        Duration::from_secs(30),
        || async { stored(db, order).await == Some(versi) },
    )
    .await;
}

/// Waits (at most `limit`) until `n` versions are applied (`n` rows in
/// `pesanan_riwayat`).
pub async fn wait_applied(db: &PgPool, n: i64, limit: Duration) {
    wait_count(db, "SELECT count(*) FROM pesanan_riwayat", n, limit).await;
}

/// Asserts that every entity's history is exactly `1..=n` in apply order.
pub fn assert_gapless_in_order(history: &[(String, i64, i32)], entities: usize, n: i64) {
    use std::collections::HashMap;
    let mut last: HashMap<&str, i64> = HashMap::new();
    for (entity, versi, _) in history {
        let prev = last.entry(entity).or_insert(0);
        assert_eq!(
            *versi,
            *prev + 1,
            "entity {entity}: {versi} applied after {prev}"
        );
        *prev = *versi;
    }
    assert_eq!(last.len(), entities, "entities seen");
    assert!(last.values().all(|v| *v == n), "every entity reaches {n}");
}

/// An in-process worker pool.
pub struct RunningPool {
    pub http: SocketAddr,
    pub shutdown: CancellationToken,
    pub task: JoinHandle<Result<(), RunError>>,
}

impl RunningPool {
    pub async fn start(settings: Settings) -> Self {
        Self::start_with(settings, Hooks::default()).await
    }

    pub async fn start_with(settings: Settings, hooks: Hooks) -> Self {
        Self::start_with_handler(settings, hooks, None).await
    }

    /// [`Self::start_with`], with a Rust handler in every worker.
    pub async fn start_with_handler(
        settings: Settings,
        hooks: Hooks,
        handler: Option<urutan::handler::SharedHandler>,
    ) -> Self {
        let mut supervisor = Supervisor::build_with_hooks(settings, hooks)
            .await
            .expect("build");
        if let Some(handler) = handler {
            supervisor = supervisor.with_handler(handler);
        }
        let http = supervisor.http_addr();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(supervisor.run(shutdown.clone()));
        Self {
            http,
            shutdown,
            task,
        }
    }

    /// [`Self::start`], then [`Self::wait_ready`].
    pub async fn ready(settings: Settings) -> Self {
        Self::ready_with(settings, Hooks::default()).await
    }

    /// [`Self::start_with`], then [`Self::wait_ready`].
    pub async fn ready_with(settings: Settings, hooks: Hooks) -> Self {
        let pool = Self::start_with(settings, hooks).await;
        pool.wait_ready().await;
        pool
    }

    /// A ready pool whose workers run `handler` (a Rust handler).
    pub async fn ready_with_handler(
        settings: Settings,
        handler: urutan::handler::SharedHandler,
    ) -> Self {
        let pool = Self::start_with_handler(settings, Hooks::default(), Some(handler)).await;
        pool.wait_ready().await;
        pool
    }

    pub async fn wait_ready(&self) {
        let http = self.http;
        wait_for("/readyz 200", Duration::from_secs(30), || async move {
            http_get(http, "/readyz").await.0 == 200
        })
        .await;
    }

    /// Cancels and waits (bounded) for a clean stop.
    pub async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .expect("pool did not stop within 30 s")
            .expect("pool task panicked")
            .expect("pool returned an error");
    }
}

/// A `urutan` command as a child process (the shared child-process type,
/// `urutan_testkit::process`; SIGKILLed when dropped, so no test leaves
/// one behind), its own HTTP port, its log in a temporary directory. Its
/// waits are bounded and panic with the log.
pub struct UrutanProcess {
    pub process: crate::process::Urutan,
    _logs: tempfile::TempDir,
}

impl UrutanProcess {
    /// Starts `urutan <command>` with `vars` on top of the inherited
    /// environment.
    pub fn start<K: AsRef<str>, V: AsRef<str>>(command: &str, vars: &[(K, V)]) -> Self {
        Self::start_binary(&crate::cargo_binary(), command, vars)
    }

    /// [`Self::start`] of another binary with urutan's commands (a team's
    /// own, built with `urutan_cli::main_with`).
    pub fn start_binary<K: AsRef<str>, V: AsRef<str>>(
        binary: &std::path::Path,
        command: &str,
        vars: &[(K, V)],
    ) -> Self {
        let logs = tempfile::tempdir().expect("a log directory");
        let process = crate::process::Urutan::spawn(
            binary,
            &format!("urutan {command}"),
            &[command],
            vars,
            logs.path().join(format!("{command}.log")),
        )
        .unwrap_or_else(|e| panic!("spawn urutan {command}: {e:#}"));
        Self {
            process,
            _logs: logs,
        }
    }

    /// Where its `/metrics`, `/healthz` and `/readyz` are.
    pub fn http(&self) -> SocketAddr {
        self.process.http
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.process.log).unwrap_or_default()
    }

    /// The body of `/metrics`, empty if it did not answer 200.
    pub async fn scrape(&self) -> String {
        let (status, body) = http_get(self.http(), "/metrics").await;
        if status == 200 { body } else { String::new() }
    }

    /// Waits (at most `limit`) until `cond` holds on a scrape of
    /// `/metrics`; returns that scrape.
    pub async fn wait_scrape(
        &mut self,
        what: &str,
        limit: Duration,
        cond: impl Fn(&str) -> bool,
    ) -> String {
        let start = Instant::now();
        loop {
            let scrape = self.scrape().await;
            if cond(&scrape) {
                return scrape;
            }
            self.assert_running();
            assert!(
                start.elapsed() < limit,
                "{}: timed out after {limit:?} waiting for {what}\nlast scrape:\n{scrape}\nlog:\n{}",
                self.process.name,
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits (30 s at most) until `/readyz` answers 200.
    pub async fn wait_ready(&mut self) {
        if let Err(e) = self.process.wait_ready(Duration::from_secs(30)).await {
            panic!("{e:#}\n{}", self.log());
        }
    }

    /// Panics with the log if it has exited.
    pub fn assert_running(&mut self) {
        if let Some(status) = self.process.exited() {
            panic!("{} exited ({status}):\n{}", self.process.name, self.log());
        }
    }

    pub fn sigterm(&self) {
        self.process.signal("TERM").expect("SIGTERM");
    }

    /// SIGKILL, and reap it.
    pub async fn kill(&mut self) {
        self.process.kill().await;
    }

    /// Waits (at most `limit`) for it to exit by itself.
    pub async fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        match self.process.wait_exit(limit).await {
            Some(status) => status,
            None => panic!(
                "{} still running after {limit:?}:\n{}",
                self.process.name,
                self.log()
            ),
        }
    }

    /// SIGTERM and a clean exit (within 30 s); the log.
    pub async fn stop(mut self) -> String {
        self.sigterm();
        let status = self.wait_exit(Duration::from_secs(30)).await;
        assert!(
            status.success(),
            "{} did not stop cleanly ({status}):\n{}",
            self.process.name,
            self.log()
        );
        self.log()
    }
}

/// A tiny HTTP/1.0 GET, bounded by 5 s: (status, body); status 0 on failure.
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    crate::http::get(addr, path, Duration::from_secs(5)).await
}

/// The value of one sample line of a Prometheus scrape, summed over lines
/// whose name and labels contain every fragment of `filter`.
pub fn metric_sum(scrape: &str, name: &str, filter: &[&str]) -> f64 {
    scrape
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.split(['{', ' ']).next() == Some(name) && filter.iter().all(|f| l.contains(f))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

pub fn status_of(versi: i64) -> String {
    format!("status-{versi}")
}

/// Writes `events` through the outbox in ONE producer transaction and
/// commits; returns the outbox ids.
pub async fn enqueue_tx(db: &PgPool, events: &[(String, i64)]) -> Vec<i64> {
    let mut tx = db.begin().await.expect("begin");
    let mut ids = Vec::with_capacity(events.len());
    for (entity, versi) in events {
        let status = status_of(*versi);
        let data = serde_json::json!({"kota": "jakarta", "versi": versi});
        let id = urutan::outbox::enqueue(
            &mut tx,
            &urutan::outbox::NewEvent::new(entity, &status, *versi, "pesanan.jakarta.diperbarui")
                .with_data(&data),
        )
        .await
        .expect("enqueue");
        ids.push(id);
    }
    tx.commit().await.expect("commit");
    ids
}

/// The least-privilege PostgreSQL roles of `deploy/postgres/least-privilege.sql`
/// in one test database, named `urutan_<kind>_<tag>`; dropped with their
/// grants on drop. The worker, relay and producer roles always exist; the
/// `optional` kinds (`operator`, `dispatcher`) are made only when named.
pub struct PgRoles {
    database: String,
    /// The pipeline's `DATABASE_SCHEMA` the script grants on.
    schema: String,
    names: Vec<(&'static str, String)>,
}

impl PgRoles {
    pub fn create(env: &TestEnv, optional: &[&'static str]) -> Self {
        Self::create_in(env, optional, "public")
    }

    /// [`Self::create`] for the pipeline in `schema` (`-v schema=...`).
    pub fn create_in(env: &TestEnv, optional: &[&'static str], schema: &str) -> Self {
        let tag = format!("{:08x}", rand::random::<u32>());
        let kinds = ["worker", "relay", "producer"].iter().chain(optional);
        let roles = Self {
            database: env.database.clone(),
            schema: schema.to_owned(),
            names: kinds.map(|k| (*k, format!("urutan_{k}_{tag}"))).collect(),
        };
        roles.rerun();
        roles
    }

    /// Runs the script again for the same roles (as after an upgrade).
    pub fn rerun(&self) {
        let roles = self;
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/postgres/least-privilege.sql"
        );
        let mut psql = Command::new("psql");
        psql.arg(format!("{PG_BASE}/{}", roles.database)).args([
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-f",
            script,
        ]);
        psql.args(["-v", &format!("schema={}", roles.schema)]);
        for (kind, name) in &roles.names {
            psql.args(["-v", &format!("{kind}_role={name}")]);
            psql.env(format!("{}_PASSWORD", kind.to_uppercase()), "pw");
        }
        let out = psql.output().expect("run psql");
        assert!(
            out.status.success(),
            "least-privilege.sql failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The role of `kind`.
    pub fn name(&self, kind: &str) -> &str {
        let found = self.names.iter().find(|(k, _)| *k == kind);
        &found.unwrap_or_else(|| panic!("no {kind} role made")).1
    }

    /// `DATABASE_URL` for the role of `kind`.
    pub fn url(&self, kind: &str) -> String {
        format!(
            "postgres://{}:pw@127.0.0.1:5432/{}",
            self.name(kind),
            self.database
        )
    }

    /// [`Self::url`], parsed.
    pub fn secret_url(&self, kind: &str) -> SecretUrl {
        self.url(kind).parse().expect("role url")
    }
}

impl Drop for PgRoles {
    fn drop(&mut self) {
        let names: Vec<&str> = self.names.iter().map(|(_, n)| n.as_str()).collect();
        let names = names.join(", ");
        let _ = Command::new("psql")
            .arg(format!("{PG_BASE}/{}", self.database))
            .args(["-q", "-c", &format!("DROP OWNED BY {names}")])
            .args(["-c", &format!("DROP ROLE {names}")])
            .output();
    }
}

/// The least a worker of the prefix `pesanan` needs (configure, write,
/// read): configure nothing, write only `amq.default` (epoch markers), read
/// only the shard queues. The worker user of
/// `deploy/rabbitmq/least-privilege.sh` may also configure the restart
/// sentinel.
pub const WORKER_PERMISSIONS: [&str; 3] = ["^$", "^amq\\.default$", "^pesanan\\.shard-\\d{3}$"];

/// Every permission (configure, write, read) on every object.
pub const ALL_PERMISSIONS: [&str; 3] = [".*", ".*", ".*"];

/// RabbitMQ users made for one test (users are broker-wide), deleted when
/// dropped.
#[derive(Default)]
pub struct BrokerUsers(Vec<String>);

impl BrokerUsers {
    /// Users made some other way (by a script), to delete at the end.
    pub fn new(users: impl IntoIterator<Item = String>) -> Self {
        Self(users.into_iter().collect())
    }

    /// Adds the user `user` with `password` and gives it `permissions`
    /// (the configure, write and read patterns) in `env`'s vhost; it is
    /// deleted at the end.
    pub fn add(&mut self, env: &TestEnv, user: &str, password: &str, permissions: [&str; 3]) {
        self.0.push(user.to_owned());
        add_user(env, user, password, permissions);
    }
}

impl Drop for BrokerUsers {
    fn drop(&mut self) {
        for user in &self.0 {
            delete_user(user);
        }
    }
}

/// Adds the RabbitMQ user `user` with `password` and gives it
/// `permissions` (the configure, write and read patterns) in `env`'s vhost.
/// The caller deletes it ([`delete_user`]; [`BrokerUsers::add`] does both).
pub fn add_user(env: &TestEnv, user: &str, password: &str, permissions: [&str; 3]) {
    let [configure, write, read] = permissions;
    sh("rabbitmqctl", &["-q", "add_user", user, password]);
    let vhost = env.vhost.as_str();
    sh(
        "rabbitmqctl",
        &[
            "-q",
            "set_permissions",
            "-p",
            vhost,
            user,
            configure,
            write,
            read,
        ],
    );
}

/// Deletes the RabbitMQ user `user`; one already gone is fine.
pub fn delete_user(user: &str) {
    let _ = command("rabbitmqctl")
        .args(["-q", "delete_user", user])
        .output();
}

/// The least-privilege RabbitMQ users of `deploy/rabbitmq/least-privilege.sh`
/// in one test's vhost, made by the script itself: the `topology` user
/// `topo-<env>` and the `worker` user `worker-<env>` always, the `operator`
/// user `operator-<env>` when asked; deleted when dropped.
pub struct RabbitUsers {
    vhost: String,
    /// (kind, user, password)
    made: Vec<(&'static str, String, &'static str)>,
    _delete: BrokerUsers,
}

impl RabbitUsers {
    pub fn create(env: &TestEnv, operator: bool) -> Self {
        let mut made = vec![
            ("topology", format!("topo-{}", env.name), "t0pology-pw"),
            ("worker", format!("worker-{}", env.name), "w0rker-pw"),
        ];
        if operator {
            made.push(("operator", format!("operator-{}", env.name), "0perator-pw"));
        }
        let users = Self {
            vhost: env.vhost.clone(),
            _delete: BrokerUsers::new(made.iter().map(|(_, user, _)| user.clone())),
            made,
        };
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/rabbitmq/least-privilege.sh"
        );
        let mut bash = Command::new("bash");
        bash.arg(script)
            .env("VHOST", &users.vhost)
            .env("RABBITMQCTL", cli_line("rabbitmqctl"));
        for (kind, user, password) in &users.made {
            let kind = kind.to_uppercase();
            bash.env(format!("{kind}_USER"), user)
                .env(format!("{kind}_PASSWORD"), password);
        }
        let made = bash.output().expect("least-privilege.sh");
        assert!(made.status.success(), "least-privilege.sh: {made:?}");
        users
    }

    fn find(&self, kind: &str) -> &(&'static str, String, &'static str) {
        let found = self.made.iter().find(|(k, _, _)| *k == kind);
        found.unwrap_or_else(|| panic!("no {kind} user made"))
    }

    /// The user of `kind`.
    pub fn name(&self, kind: &str) -> &str {
        &self.find(kind).1
    }

    /// `AMQP_URL` for the user of `kind`.
    pub fn url(&self, kind: &str) -> String {
        let (_, user, password) = self.find(kind);
        amqp_url_as(user, password, &self.vhost)
    }
}

/// One finished run of the `urutan` binary.
pub struct Ran {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Ran {
    pub fn ok(&self) -> bool {
        self.code == Some(0)
    }

    /// Lines urutan logged at WARN or ERROR (lapin's own are not counted),
    /// and the command's own error line (`error: …`).
    pub fn error_lines(&self) -> usize {
        // Targets `urutan` (the library), `urutan_cli` (the commands), `urutan_ops`.
        let ours = |l: &&str| {
            l.starts_with("error: ") || l.contains("ERROR urutan") || l.contains("WARN urutan")
        };
        self.stderr.lines().filter(ours).count()
    }

    /// Asserts that it failed (exit code 1) with `expected` on standard
    /// error, in its one WARN or ERROR line (see [`Self::error_lines`]).
    #[track_caller]
    pub fn assert_fails_in_one_line(&self, expected: &str) {
        self.assert_fails_with(1, expected);
    }

    /// Asserts that it stopped on what no retry can fix (exit code 2: a
    /// refusal, a wrong setting) with `expected` in its one error line.
    #[track_caller]
    pub fn assert_refused_in_one_line(&self, expected: &str) {
        self.assert_fails_with(2, expected);
    }

    #[track_caller]
    fn assert_fails_with(&self, code: i32, expected: &str) {
        assert_eq!(self.code, Some(code), "{self}");
        assert!(self.stderr.contains(expected), "{self}");
        assert_eq!(self.error_lines(), 1, "one line: {self}");
    }
}

impl std::fmt::Display for Ran {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// Runs `urutan <args>` against `env` (extra variables in `vars`, which
/// override), stdin closed, at most 90 s.
pub async fn urutan(env: &TestEnv, vars: &[(&str, &str)], args: &[&str]) -> Ran {
    run_binary(&crate::cargo_binary(), env, vars, args).await
}

/// `urutan` with another binary that has urutan's commands (a team's
/// own, built with `urutan_cli::main_with`).
pub async fn run_binary(
    binary: &std::path::Path,
    env: &TestEnv,
    vars: &[(&str, &str)],
    args: &[&str],
) -> Ran {
    let mut cmd = tokio::process::Command::new(binary);
    for (k, v) in env.process_env(1) {
        cmd.env(k, v);
    }
    // The log filter an operator gets (no RUST_LOG).
    cmd.env_remove("RUST_LOG").env("NO_COLOR", "1");
    for (k, v) in vars {
        cmd.env(k, v);
    }
    cmd.args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let child = cmd.spawn().expect("spawn urutan");
    let out = tokio::time::timeout(Duration::from_secs(90), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("urutan {args:?} ran longer than 90 s"))
        .expect("urutan output");
    Ran {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The consistent-hash ring of `pesanan-hash`, in bucket order.
pub fn ring(env: &TestEnv) -> Vec<String> {
    let out = sh(
        "rabbitmq-diagnostics",
        &[
            "-q",
            "consistent_hash_exchange_ring_state",
            "-p",
            &env.vhost,
            "pesanan-hash",
            "--formatter",
            "json",
        ],
    );
    let state: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let buckets = state["buckets"].as_object().expect("buckets");
    let mut ring: Vec<(u64, String)> = buckets
        .iter()
        .map(|(i, q)| {
            let index = i.parse().expect("bucket index");
            (index, q.as_str().expect("queue").to_owned())
        })
        .collect();
    ring.sort();
    ring.into_iter().map(|(_, q)| q).collect()
}

/// A steady stream of events: every `every`, the next version of each of
/// `entities` orders (`S-0`, `S-1`, ...), published until stopped.
pub struct Stream {
    stop: CancellationToken,
    handle: tokio::task::JoinHandle<i64>,
}

impl Stream {
    pub async fn start(env: &TestEnv, entities: usize, every: Duration) -> Self {
        let publisher = env.publisher().await;
        let stop = CancellationToken::new();
        let until = stop.clone();
        let handle = tokio::spawn(async move {
            let mut versi = 0;
            let mut tick = tokio::time::interval(every);
            while !until.is_cancelled() {
                tick.tick().await;
                versi += 1;
                let round: Vec<Msg> = (0..entities)
                    .map(|e| Msg::event(&format!("S-{e}"), versi))
                    .collect();
                publisher.send_all(&round).await;
            }
            versi
        });
        Self { stop, handle }
    }

    /// Stops it; the last version published.
    pub async fn stop(self) -> i64 {
        self.stop.cancel();
        self.handle.await.expect("the stream")
    }
}
