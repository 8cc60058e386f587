//! The `urutan` commands that do more than call one library function, one
//! module each: they open what the command needs, run it, and say how it
//! ended. The others (`dlq`, `status`, `explain`) are a call into the
//! library; `demo` has its own module beside this one.

pub mod effects;
pub mod migrate;
pub mod relay;
pub mod run;
pub mod topology;
pub mod verify;

/// Cancels a token on the first SIGTERM, SIGINT or SIGHUP (the pool's own).
pub use urutan::pool::stop_on_signal;
