//! Refuses to build urutan with lapin's AMQP type codec as published.
//!
//! The published `amq-protocol-types` parses header tables recursively
//! without a limit: one message whose header nests 16,000 levels crashes
//! every worker that consumes it, in turn (patches/amq-protocol-types). The
//! workspace takes the patched codec through `[patch.crates-io]`, but a
//! `[patch]` applies only in the workspace that writes it: a team's own crate
//! that depends on urutan by path or git would silently build with the
//! unpatched codec. The patched crate declares `links = "urutan_amqp_codec"`
//! and says `PATCHED` from its build script; when that is missing, this
//! script stops the build and prints the exact lines the team must add.
//!
//! It also names the commit built (`URUTAN_COMMIT`, for
//! `urutan_build_info{version,commit}`): `unknown` outside a git checkout.
use std::env;
use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    commit();
    if env::var_os("DEP_URUTAN_AMQP_CODEC_PATCHED").is_some() {
        return;
    }
    let manifest = env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    // crates/urutan → the repository's root, where patches/ lives.
    let root = Path::new(&manifest)
        .ancestors()
        .nth(2)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "<the urutan repository>".to_owned());
    eprintln!(
        "\nurutan must be built with its patched AMQP codec (without it, one message with a \
         deeply nested header crashes every worker).\n\
         A [patch] is not inherited from a dependency: add these lines to the Cargo.toml at \
         the root of YOUR workspace, then build again.\n\
         \n\
         If you depend on urutan by path:\n\
         \n\
         [patch.crates-io]\n\
         amq-protocol-types = {{ path = \"{root}/patches/amq-protocol-types\" }}\n\
         \n\
         If you depend on urutan by git (the same url and rev as your urutan line):\n\
         \n\
         [patch.crates-io]\n\
         amq-protocol-types = {{ git = \"<urutan's git url>\", rev = \"<urutan's rev>\" }}\n\
         \n\
         (docs/handlers.md, \"Your own crate\")\n"
    );
    std::process::exit(1);
}

/// `cargo::rustc-env=URUTAN_COMMIT=<12 hex digits>`, rebuilt when HEAD moves.
fn commit() {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|out| out.status.success())
            .and_then(|out| String::from_utf8(out.stdout).ok())
            .map(|s| s.trim().to_owned())
    };
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    // HEAD and the branch it points at: a new commit or a checkout reruns this.
    for path in ["HEAD", "packed-refs"] {
        if let Some(file) = git(&["rev-parse", "--git-path", path]) {
            println!("cargo::rerun-if-changed={file}");
        }
    }
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"])
        && let Some(file) = git(&["rev-parse", "--git-path", &branch])
    {
        println!("cargo::rerun-if-changed={file}");
    }
    println!("cargo::rustc-env=URUTAN_COMMIT={commit}");
}
