//! Fault-injection and observation points of a shard worker.

use std::sync::Arc;

use crate::message::Event;
use crate::outcome::Outcome;

/// A fault-injection callback, given each valid event before it is applied.
pub type EventHook = Arc<dyn Fn(&Event) + Send + Sync>;

/// What an observer learns about each finished delivery.
#[derive(Debug, Clone, Copy)]
pub struct Observed<'a> {
    pub shard: u16,
    pub outcome: Outcome,
    pub message_id: Option<&'a str>,
}

/// An observer of outcomes (the demo's live counters and latency report).
pub type OutcomeHook = Arc<dyn Fn(&Observed<'_>) + Send + Sync>;

/// Fault-injection and observation points for tests, drills and the demo;
/// empty in production.
#[derive(Clone, Default)]
pub struct Hooks {
    /// Called with each valid event just before it is applied (may panic or sleep).
    pub before_apply: Option<EventHook>,
    /// Called once per outcome, after it is durable and before the ack (for
    /// a parked message: when it is released).
    pub on_outcome: Option<OutcomeHook>,
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks")
            .field("before_apply", &self.before_apply.is_some())
            .field("on_outcome", &self.on_outcome.is_some())
            .finish()
    }
}

/// A fault-injection setting that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error("{name} must be a whole number, got {value:?}")]
    NotANumber { name: String, value: String },
    #[error("cannot listen for SIGUSR1/SIGUSR2: {0}")]
    Signal(std::io::Error),
}

/// A whole-number fault setting from the environment (`None`: unset).
pub(crate) fn env_number(name: &str) -> Result<Option<u64>, HookError> {
    let Some(value) = std::env::var_os(name) else {
        return Ok(None);
    };
    let value = value.to_string_lossy();
    let n = value.trim().parse().map_err(|_| HookError::NotANumber {
        name: name.to_owned(),
        value: value.to_string(),
    })?;
    Ok(Some(n))
}

impl Hooks {
    /// Fault injection for `urutan run` (crash drills: `tests/faults.rs`,
    /// `benches/faults.rs`); no hook is installed unless one of these is set:
    /// - `URUTAN_FAULT_HANDLER_DELAY_MS=<ms>`: a slow handler; each valid event
    ///   waits that long before it is applied (in `block_in_place`, so the
    ///   runtime's other tasks, heartbeats included, keep running);
    /// - `URUTAN_FAULT_ABORT_AFTER_COMMIT=<n>`: abort at the n-th outcome, which
    ///   is durable and not yet acked (a crash between commit and ack), counted
    ///   from start or, with `URUTAN_FAULT_ARM_ON_SIGUSR1` set, from the last
    ///   SIGUSR1, and not at all after a SIGUSR2 (so a drill picks the moment
    ///   and the replica).
    pub fn from_env() -> Result<Self, HookError> {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        let number = env_number;
        let mut hooks = Hooks::default();
        if let Some(ms) = number("URUTAN_FAULT_HANDLER_DELAY_MS")?.filter(|ms| *ms > 0) {
            let delay = std::time::Duration::from_millis(ms);
            hooks.before_apply = Some(Arc::new(move |_| {
                tokio::task::block_in_place(|| std::thread::sleep(delay))
            }));
        }
        if let Some(n) = number("URUTAN_FAULT_ABORT_AFTER_COMMIT")? {
            let armed = Arc::new(AtomicBool::new(
                std::env::var_os("URUTAN_FAULT_ARM_ON_SIGUSR1").is_none(),
            ));
            let outcomes = Arc::new(AtomicU64::new(0));
            if !armed.load(Ordering::SeqCst) {
                use tokio::signal::unix::{SignalKind, signal};
                let mut usr1 = signal(SignalKind::user_defined1()).map_err(HookError::Signal)?;
                let mut usr2 = signal(SignalKind::user_defined2()).map_err(HookError::Signal)?;
                let (arm, count) = (armed.clone(), outcomes.clone());
                tokio::spawn(async move {
                    loop {
                        tokio::select! {
                            Some(()) = usr1.recv() => {
                                count.store(0, Ordering::SeqCst);
                                arm.store(true, Ordering::SeqCst);
                            }
                            Some(()) = usr2.recv() => arm.store(false, Ordering::SeqCst),
                            else => return,
                        }
                    }
                });
            }
            hooks.on_outcome = Some(Arc::new(move |_| {
                if armed.load(Ordering::SeqCst) && outcomes.fetch_add(1, Ordering::SeqCst) + 1 >= n
                {
                    std::process::abort();
                }
            }));
        }
        Ok(hooks)
    }
}

impl Hooks {
    /// The one way the before-apply hook is called, in strict, pipelined
    /// and batch mode alike. A panic in it is the handler failing on this
    /// message: `Err` with the panic's text (what the message is retried,
    /// then dead-lettered with).
    pub(super) fn run_before_apply(&self, event: &Event) -> Result<(), String> {
        let Some(hook) = &self.before_apply else {
            return Ok(());
        };
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| hook(event)))
            .map_err(|panic| panic_message(panic.as_ref()))
    }
}

/// The text of a handler's panic payload (what `panic!` or `resume_unwind`
/// was given): the reason a message that panicked is retried, then
/// dead-lettered with.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        format!("the handler panicked: {s}")
    } else if let Some(s) = payload.downcast_ref::<String>() {
        format!("the handler panicked: {s}")
    } else {
        "the handler panicked".to_owned()
    }
}
