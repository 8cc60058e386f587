//! Steps of integration-test scenarios that several test files share: CLI
//! calls off the async runtime and the broker application stopped (and
//! always started again).

use crate::fixtures::{command, sh};

/// Runs a command line off the async runtime (rabbitmqctl and pg_ctlcluster
/// take seconds) and panics with its output if it fails (see
/// [`sh`]).
pub async fn sh_blocking(program: &'static str, args: &[&str]) -> String {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        sh(program, &args)
    })
    .await
    .expect("command task panicked")
}

/// Starts the broker application again when dropped (also on panic), and
/// waits for it. A test that stops the broker declares it after its
/// `TestEnv`, so the broker is back before the env deletes its vhost.
pub struct BrokerGuard;

impl Drop for BrokerGuard {
    fn drop(&mut self) {
        let _ = command("rabbitmqctl").args(["-q", "start_app"]).output();
        let _ = command("rabbitmqctl")
            .args(["-q", "--timeout", "120", "await_startup"])
            .output();
    }
}
