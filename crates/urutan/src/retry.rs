//! How urutan waits before trying a lost service again: the pool's start,
//! a shard's broker link and the relay all use this one backoff.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use tokio_util::sync::CancellationToken;

/// The longest delay before jitter.
const MAX_DELAY: Duration = Duration::from_secs(3);

/// 0.2 s doubling to 3 s, plus up to 100 % jitter: at most 6 s between
/// attempts, so urutan is back within seconds of its services. Never ends.
pub(crate) fn backoff() -> ExponentialBackoff {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(MAX_DELAY)
        .with_jitter()
        .without_max_times()
        .build()
}

/// The next delay of `delays` (the cap if it ever ran out).
pub(crate) fn next_delay(delays: &mut ExponentialBackoff) -> Duration {
    delays.next().unwrap_or(MAX_DELAY)
}

/// Sleeps `delay` unless `stop` is cancelled first; `false` if it was.
pub(crate) async fn sleep_unless_stopped(delay: Duration, stop: &CancellationToken) -> bool {
    tokio::select! {
        () = stop.cancelled() => false,
        () = tokio::time::sleep(delay) => true,
    }
}
