//! A team's own crate outside this workspace (examples/outside, as
//! docs/handlers.md tells a team to write it): copied out of the repository
//! and built there with its own lock and target directory, so nothing of this
//! workspace (its `[patch]` above all) reaches it by accident.
//!
//! Without the `[patch.crates-io]` lines the build must stop and print them
//! (crates/urutan/build.rs): the published AMQP codec has no nesting limit,
//! and one header nested 16,000 levels deep would crash every worker. With
//! the lines it builds, applies an event through the team's handler, and
//! dead-letters a 16,000-level header while it keeps running.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use urutan_testkit::fixtures::{Msg, TestEnv, UrutanProcess, wait_count};
use urutan_testkit::wire;

use crate::raw_amqp;

/// The repository's root (this package's manifest directory).
fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// examples/outside copied to `dir`, its relative paths into this
/// repository made absolute, with or without its `[patch.crates-io]`.
fn copy_out(dir: &Path, with_patch: bool) {
    let root = repo().display().to_string();
    let manifest = std::fs::read_to_string(repo().join("examples/outside/Cargo.toml"))
        .expect("examples/outside/Cargo.toml");
    let mut manifest = manifest
        .replace("\"../../", &format!("\"{root}/"))
        .replace("\"../..\"", &format!("\"{root}\""));
    if !with_patch {
        let start = manifest
            .find("[patch.crates-io]")
            .expect("a [patch] section");
        let end = manifest[start..]
            .find("\n\n")
            .map_or(manifest.len(), |n| start + n);
        manifest.replace_range(start..end, "");
    }
    std::fs::create_dir_all(dir.join("src")).expect("src");
    std::fs::write(dir.join("Cargo.toml"), manifest).expect("Cargo.toml");
    std::fs::copy(
        repo().join("examples/outside/src/main.rs"),
        dir.join("src/main.rs"),
    )
    .expect("main.rs");
    // This workspace's lock: the same versions as the suite's own build (the
    // build without the patch fetches the published codec once).
    std::fs::copy(repo().join("Cargo.lock"), dir.join("Cargo.lock")).expect("Cargo.lock");
}

/// `cargo build` of the crate in `dir`, into `target` (shared by both
/// builds, outside this workspace's own target directory's lock).
fn cargo_build(dir: &Path, target: &Path) -> Output {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    std::process::Command::new(cargo)
        .args(["build", "--quiet"])
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", target)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .output()
        .expect("run cargo")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_teams_own_crate_needs_the_codec_patch_and_survives_a_deep_header() {
    let work = tempfile::tempdir().expect("a directory outside the repository");
    // One target directory for both builds, kept between runs of the suite
    // under this workspace's target (dependencies built once).
    let target = repo().join("target/outside");

    // Without the patch: the build stops, naming the lines to add.
    let bare = work.path().join("bare");
    copy_out(&bare, false);
    let refused = cargo_build(&bare, &target);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success(),
        "built without the patch:\n{stderr}"
    );
    let line = format!(
        "amq-protocol-types = {{ path = \"{}/patches/amq-protocol-types\" }}",
        repo().display()
    );
    assert!(
        stderr.contains("[patch.crates-io]") && stderr.contains(&line),
        "the refusal names the lines to add ({line}):\n{stderr}"
    );

    // With it: builds.
    let team = work.path().join("team");
    copy_out(&team, true);
    let built = cargo_build(&team, &target);
    assert!(
        built.status.success(),
        "the team's crate did not build:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let binary = target.join("debug/team-ledger");

    // One event through the team's handler, then a header nested 16,000
    // levels deep, then another event: both applied and booked, the deep
    // one dead-lettered, the worker never restarted.
    let env = TestEnv::new("outside_crate").await;
    let db = env.db().await;
    let mut vars = env.process_env(2);
    vars.push(("RUST_LOG", "warn".to_owned()));
    let mut migrate = UrutanProcess::start_binary(&binary, "migrate", &vars);
    let status = migrate
        .process
        .wait_exit(Duration::from_secs(60))
        .await
        .expect("migrate exits");
    assert!(status.success(), "migrate: {}", migrate.log());
    sqlx::raw_sql(
        "CREATE TABLE buku_besar (pesanan_id text, versi bigint, status text,
                                  dicatat_pada timestamptz DEFAULT now())",
    )
    .execute(&db)
    .await
    .expect("the team's table");
    let mut pool = UrutanProcess::start_binary(&binary, "run", &vars);
    pool.wait_ready().await;
    let publisher = env.publisher().await;
    publisher.send_all(&[Msg::event("T-1", 1)]).await;
    let deep = wire::nested(16_000, |i| i % 10 != 0, &wire::text(b"leaf"));
    let headers = wire::table(&[
        (b"x-pesanan-id".as_slice(), wire::text(b"T-deep")),
        (b"x-deep".as_slice(), deep),
    ]);
    raw_amqp::publish_raw_to(
        &env.vhost,
        "pesanan",
        "pesanan.test",
        &wire::properties(&headers, b"deep-16000"),
        br#"{"id":"T-deep","status":"baru","versi":1}"#,
    )
    .await;
    publisher.send_all(&[Msg::event("T-2", 1)]).await;

    wait_count(
        &db,
        "SELECT count(*) FROM buku_besar",
        2,
        Duration::from_secs(60),
    )
    .await;
    wait_count(
        &db,
        "SELECT count(*) FROM urutan_dead_letter
         WHERE message_id = 'deep-16000' AND reason = 'headers_too_deep'",
        1,
        Duration::from_secs(60),
    )
    .await;
    pool.assert_running();
    let booked: Vec<(String, i64)> =
        sqlx::query_as("SELECT pesanan_id, versi FROM buku_besar ORDER BY pesanan_id")
            .fetch_all(&db)
            .await
            .expect("booked");
    assert_eq!(booked, [("T-1".to_owned(), 1), ("T-2".to_owned(), 1)]);
}
