//! A deterministic interleaving model of per-order order across ring
//! changes (issue 13), driving the REAL decision code: the SQL functions of
//! `migrations/` through `store::apply`, `handoff::release_with`
//! (`handoff::release` in `legacy`), `store::hold::set_aside`,
//! `store::hold::hold_refused`, `store::hold::release_hold`,
//! `handoff::pass_marker`, `handoff::record_epoch`, `handoff::open_window`,
//! `handoff::close_windows`, `handoff::register_shards` and
//! `handoff::ring_change_unfinished`, against the real PostgreSQL (one
//! database per worker, emptied between cases). Only the broker is
//! simulated: shard queues are in-memory `VecDeque`s, the consistent-hash
//! ring is a jump hash over the bound shards in ring order.
//!
//! Each case (a seed) draws shards, orders (each published by ONE producer,
//! a direct one or the outbox relay, in increasing `versi`, sometimes with
//! gaps) and ring changes (broker restarts that rebuild the ring in another
//! order, grow, shrink), then runs a random interleaving of atomic steps:
//! direct publishes, relay connects/markers/batches, one step of a
//! `prepare_topology` (the pool's, or `urutan topology`'s while the pool
//! keeps consuming), one shard handling its front item (a marker or a
//! message; sometimes the ack is a separate, later step), releases, pool
//! crashes between commit and ack, pool reconnects, retirement steps (and,
//! in cases with handler faults, below: the clock, the operator, crashes
//! around set-aside and release). At the
//! end everything is drained and released, and the invariant is checked:
//! every order's history (`pesanan_riwayat` by `seq`) is every published
//! version exactly once, in increasing `versi`; nothing came out `stale`;
//! nothing is left parked or queued; every redelivery was a `duplicate`; no
//! retired queue was deleted with a message in it.
//!
//! Handler faults, retries and holds (docs/contract.md sections 10-11):
//! every model database has a `HANDLER_FUNCTION`, [`MODEL_HANDLER`]
//! (`model_handler`, named by the pool's `urutan.handler` session option as
//! `Settings::schema_url` sets it), called by the real SQL in every apply
//! and release. It records each version it sees applied in `model_applied`;
//! for the (order, versi) pairs listed in `model_fail` it asks to retry
//! (SQLSTATE `URTRY`) on its first K calls, or refuses (a plain error) until
//! the operator fixes it. The model counts the failing calls itself
//! (`Sim::failed_call`): a decrement inside the handler would roll back
//! with the failed transaction. About 40 % of the cases draw such faults (with
//! `RETRY_MAX_ATTEMPTS` 2-4, K up to one more than that, `ON_REFUSED=hold`,
//! `GAP_POLICY=apply`) from a second random stream of the seed, so a case
//! that draws none takes exactly the steps, with the same outcomes, that it
//! took before faults were modelled.
//!
//! The worker's decisions stay in its code; the model mirrors only the
//! sequence of calls `shard::steps` makes, with each call a step of its own
//! (a crash may fall between any two):
//! - a delivery: `store::apply`; on an error with `StoreError::sets_aside()`
//!   → `store::hold::set_aside` (claimed, parked with a due time) → ack; on
//!   `StoreError::HandlerRefused` → `store::hold::hold_refused` (ON_REFUSED=
//!   hold) → the dead letter (reject: the model's dead-letter queue); any
//!   other error ends the run (the model has no database outage);
//! - a release (`release_in_transaction`): `handoff::release_with(conn,
//!   shard, 200, &policy, None)` inside a transaction; each `refused` row is
//!   published to the dead-letter exchange before the commit. A worker may
//!   die before the commit: all of it rolls back, and a refused version's
//!   dead letter may already be published (the operator then finds a copy
//!   of a message that is still set aside).
//!
//! Dead-letter records (`urutan_dead_letter`) are not written: they take
//! part in no apply or release decision. Time is the model's: the backoff is
//! an hour, and a clock step makes one set-aside message due, or all of
//! them (`Sim::clock`). The operator (`Sim::operator`) takes a dead
//! letter now and then: it purges one whose version it skipped; it releases
//! the order held by it (`store::hold::release_hold`, `urutan hold
//! release`, recorded as a skip) or, more often, fixes the handler for that
//! version (sometimes not) and replays it (`urutan dlq replay`: a new
//! delivery with the same message id, through the ring as it is then); it
//! decides nothing about a version whose replay is still queued (as `urutan
//! dlq replay` waits for its outcome). At the end it has dealt with every
//! dead letter, and the check is then: every order's history is every
//! published version except those the operator skipped, once, in
//! increasing `versi`; `model_applied` equals it (with each version's
//! `previous_versi`); `urutan_lewati` lists exactly the operator's skips;
//! nothing is left held, parked or dead-lettered.
//!
//! Gaps, effects and dying shard workers (issue 44), drawn from a third
//! random stream of the seed (`EXTRA_SALT`; a case that draws none takes
//! the steps it took before):
//! - `GAP_POLICY=wait` (about 30 % of the cases; the model database's
//!   second pool, whose URL sets `urutan.gap`): producers publish some
//!   versions before their predecessor, a version above stored + 1 parks
//!   until the release step lets it go; a gap-timeout step is
//!   `store::hold::hold_gaps` (`GAP_TIMEOUT` passed for every gap waiting
//!   then); the operator releases (`urutan hold release`) a gap hold whose
//!   version was never published (or was skipped) once every other version
//!   below the highest one waiting has arrived, and waits for any other.
//!   Gap timeouts happen once everything is published and consumed, unless
//!   [`Mode::open_gap_defects`] (two open defects: see there);
//! - effects (about 30 %): one route for every status, so every applied
//!   version records an effect; a model dispatcher claims
//!   (`effects::store::claim`), sends (each send checked at once: no effect
//!   of an earlier version of its order still pending or held, none of a
//!   later one sent before), and records 2xx, a failure to try again, a
//!   dead letter (`EFFECTS_ON_DEAD=hold`: the order's later effects wait),
//!   or dies mid-request (its leases expire when the clock says); the
//!   operator replays a dead-lettered effect (`urutan dlq replay
//!   --effects`) or releases the order's effects without it (`urutan hold
//!   release --effects`);
//! - a shard's worker task dies while its process lives (about 35 %), with
//!   [`WorkerDeath`]: its channel reopened (the current worker) or left
//!   open with what it held unacked (before commit 33fcef8, issue 44 item
//!   1).
//!
//! Nothing waits, checked at the end (`stuck`): for every order, its first
//! version neither applied nor skipped by the operator is a violation when
//! the version before it is applied (or it is the first), with where it
//! is (queued behind a stranded worker, parked and why, held, dead-lettered,
//! never published); every parked or held row left is a violation
//! (`left-parked`, `left-held`), and so is every effect not sent unless the
//! operator released it (`effect-waiting`); `urutan_lewati` lists exactly the
//! operator's skips (refused, gap, effect), in order. Not modelled: a Rust
//! handler (`release_with` with a handler), `ON_REFUSED=skip`, the delivery
//! limit, `GAP_WAITING_MAX`, batch mode.
//!
//! `legacy` runs the protocol before the fix (no windows, no sentinel; the
//! "ring change cut short" flag of migration 0005 instead) against a
//! database with only migrations 0001-0006: it shows the bug the windows
//! fix (see `benches/interleave.rs --legacy`).
//!
//! Environment: `URUTAN_INTERLEAVE_CASES` (default 1000; see
//! tests/it/interleave.rs for what a run costs),
//! `URUTAN_INTERLEAVE_SEED` (replay one case, with its trace),
//! `URUTAN_INTERLEAVE_BASE` (first seed of the run), `URUTAN_INTERLEAVE_WORKERS`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sqlx::PgPool;
use sqlx::pool::PoolConnection;
use sqlx::postgres::Postgres;
use urutan::config::{SecretUrl, Settings};
use urutan::message::Event;
use urutan::outcome::Outcome;
use urutan::reshard::handoff;
use urutan::store::hold::RetryPolicy;
use urutan::store::{self, Applied, StoreError};

pub const PG_BASE: &str = "postgres://postgres@127.0.0.1:5432";

/// Default first seed of a run (CI runs the same cases every time; the
/// bench draws another base unless told).
pub const DEFAULT_BASE: u64 = 0x5EED_0013;

/// Every wait on the database is bounded by this (per statement).
const STATEMENT_LIMIT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------
// Randomness: SplitMix64, so a seed means the same case on every platform
// and whatever version of `rand`.

#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }
    /// True with probability `percent` / 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }
}

/// The seed of case `i` of a run starting at `base`.
pub fn case_seed(base: u64, i: u64) -> u64 {
    Rng::new(base.wrapping_add(i.wrapping_mul(0xD1B5_4A32_D192_ED03))).next_u64()
}

/// Jump consistent hash (Lamping & Veach): a bucket in `0..n`; growing `n`
/// moves keys only to the new buckets, like appending shards to the
/// x-consistent-hash ring.
fn jump(mut key: u64, n: usize) -> usize {
    let (mut b, mut j) = (-1i64, 0i64);
    while j < n as i64 {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    b as usize
}

// ---------------------------------------------------------------------------
// The case.

#[derive(Debug, Clone)]
struct OrderSpec {
    id: String,
    key: u64,
    versions: Vec<i64>,
    /// Published through the outbox relay (else: a direct producer).
    relay: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    Restart,
    Grow,
    Shrink,
}

#[derive(Debug, Clone)]
struct Spec {
    shards: usize,
    orders: Vec<OrderSpec>,
    changes: Vec<Change>,
}

/// What the case's handler (`model_handler`, [`MODEL_HANDLER`]) does wrong
/// for one version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// Asks to retry (SQLSTATE `URTRY`) on its first `n` calls for that
    /// version (the model counts the calls: see [`Sim::failed_call`]).
    Retry(u32),
    /// Refuses it (a plain `RAISE`: `handler_refused`) until the operator
    /// "fixes the handler" for it.
    Refuse,
}

/// A case's handler faults and retry policy (drawn from the seed's own
/// second stream, [`FAULT_SALT`]: a case that draws none is exactly the case
/// it was before faults were modelled).
#[derive(Debug, Clone)]
struct Faults {
    /// (order, versi, fault).
    plan: Vec<(usize, i64, Fault)>,
    /// `RETRY_MAX_ATTEMPTS`.
    max_attempts: u32,
    /// How often the operator releases a held order (a skip) rather than
    /// replaying the refused message, in percent.
    skip_percent: u64,
    /// How often the operator replays without fixing the handler first (the
    /// replay may fail again), in percent (never while draining).
    unfixed_percent: u64,
}

/// Salt of the second random stream of a seed (faults, the operator, the
/// clock, crashes around set-aside and release).
const FAULT_SALT: u64 = 0xFA17_0031_5E7A_51DE;

fn draw_faults(rng: &mut Rng, spec: &Spec) -> Option<Faults> {
    if !rng.chance(40) {
        return None;
    }
    let max_attempts = rng.range(2, 4) as u32;
    let rate = rng.range(3, 10) as u64;
    let mut plan = Vec::new();
    for (o, order) in spec.orders.iter().enumerate() {
        for &versi in &order.versions {
            if rng.chance(rate) {
                let fault = if rng.chance(70) {
                    // Up to one more call than there are attempts: some run
                    // out (`retries_exhausted`).
                    Fault::Retry(rng.range(1, max_attempts as usize + 1) as u32)
                } else {
                    Fault::Refuse
                };
                plan.push((o, versi, fault));
            }
        }
    }
    Some(Faults {
        plan,
        max_attempts,
        skip_percent: rng.range(20, 60) as u64,
        unfixed_percent: rng.range(0, 30) as u64,
    })
}

/// The wait before a set-aside message is due (`RETRY_BACKOFF_MIN` =
/// `RETRY_BACKOFF_MAX`, so jitter changes nothing): longer than any case,
/// so only the model's clock ([`Sim::clock`]) makes one due.
const BACKOFF: Duration = Duration::from_secs(3600);

/// Versions (orders) per release call, as the worker's `RELEASE_BATCH`.
const RELEASE_BATCH: i32 = 200;

/// Salt of the third random stream of a seed: gaps (`GAP_POLICY=wait`,
/// versions published out of order, gap timeouts), effects (the dispatcher,
/// its crashes, effect holds) and shard workers that die. A case that draws
/// none of them takes exactly the steps it took before they were modelled.
const EXTRA_SALT: u64 = 0x0E44_D1E5_6A95_EFEC;

/// `GAP_TIMEOUT` of the model: longer than any case, so only a gap-timeout
/// step ([`Sim::gap_check`], which asks `urutan_tahan_celah` with no wait at
/// all: the timeout has passed for every gap waiting then) holds an order.
const GAP_TIMEOUT: Duration = Duration::from_secs(3600);

/// The dispatcher's lease on a claimed effect: longer than any case, so a
/// claim is taken again only after the model's clock expired the lease of a
/// dispatcher that died ([`Sim::clock`]).
const EFFECT_LEASE: Duration = Duration::from_secs(3600);

/// The one effect route of a case with effects (`EFFECTS=*=...`): every
/// applied version has one effect.
const EFFECT_URL: &str = "http://model.invalid/effect";

/// What a shard's worker task that dies while its process lives leaves
/// behind (issue 44 item 1: a tracing span guard held across an `.await`
/// made the subscriber panic inside one shard's worker).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WorkerDeath {
    /// The current worker: the panic is caught, its channel is closed and
    /// opened again; the deliveries it held go back to the front of its
    /// queue and are redelivered in order.
    #[default]
    Reopen,
    /// Before the fix (commit 33fcef8): the task ends and its channel stays
    /// open; the deliveries it held stay unacked, nothing consumes or
    /// releases the shard again until the process's connection ends.
    Strand,
}

/// How a run's cases treat two things the model can do either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Mode {
    /// What a shard's worker that dies leaves behind.
    pub worker_death: WorkerDeath,
    /// In cases with `GAP_POLICY=wait`: the operator skips a refused
    /// version (`urutan hold release`) while later ones are still on their
    /// way. Off by default: then, after the release, a version parked
    /// before it goes past any gap, not only the skipped version's
    /// (`urutan_celah_dilewati`), and a version still on its way comes out
    /// `stale` (the contract's "the waiting versions are applied in order";
    /// open in issue 44). (`GAP_TIMEOUT` expiring mid-stream, once a
    /// second defect here, is always modelled since migration 0046 fixed
    /// it: a version arriving while its order was held for a gap was
    /// applied past the gap, and a missing version set aside after the
    /// hold waited behind it forever.)
    pub open_gap_defects: bool,
}

/// The case's gaps, effects and worker deaths (the third stream,
/// [`EXTRA_SALT`]).
#[derive(Debug, Clone, Copy, Default)]
struct Extras {
    /// `GAP_POLICY=wait` (a pool with `urutan.gap=wait`): producers publish
    /// some versions before their predecessor; gap timeouts hold orders, and
    /// the operator releases a hold whose version was never published.
    gaps: bool,
    /// Effects on (a route for every status), dispatched by a model
    /// dispatcher that sometimes fails an attempt, dead-letters an effect
    /// (`EFFECTS_ON_DEAD=hold`) or dies; the operator replays or releases.
    effects: bool,
    /// Shard worker tasks die now and then ([`WorkerDeath`]).
    worker_deaths: bool,
}

fn draw_extras(rng: &mut Rng) -> Extras {
    Extras {
        gaps: rng.chance(30),
        effects: rng.chance(30),
        worker_deaths: rng.chance(35),
    }
}

/// The order in which one producer publishes its versions: in `versi`
/// order, except (gap cases) some pairs of neighbours swapped, the later
/// version first, as a producer whose versions race.
fn publish_order(rng: &mut Rng, versions: &[i64], swaps: bool) -> Vec<i64> {
    let mut out = versions.to_vec();
    if swaps {
        let mut i = 0;
        while i + 1 < out.len() {
            if rng.chance(25) {
                out.swap(i, i + 1);
                i += 2;
            } else {
                i += 1;
            }
        }
    }
    out
}

/// The case's handler, installed in every model database (not `legacy`)
/// and named by the pool's `urutan.handler` session option, as
/// `Settings::schema_url` sets it for `HANDLER_FUNCTION`. It asks to retry
/// or refuses as `model_fail` says, and otherwise records the version in
/// `model_applied` (in the apply transaction: one row per applied version).
pub const MODEL_HANDLER: &str = "
CREATE TABLE IF NOT EXISTS model_fail (
    pesanan_id TEXT NOT NULL,
    versi      BIGINT NOT NULL,
    cara       TEXT NOT NULL CHECK (cara IN ('retry', 'refuse')),
    remaining  INT NOT NULL,
    PRIMARY KEY (pesanan_id, versi)
);
CREATE TABLE IF NOT EXISTS model_applied (
    seq            BIGSERIAL PRIMARY KEY,
    pesanan_id     TEXT NOT NULL,
    versi          BIGINT NOT NULL,
    message_id     TEXT NOT NULL,
    previous_versi BIGINT,
    shard          INT
);
CREATE OR REPLACE FUNCTION model_handler(event jsonb) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_cara TEXT;
BEGIN
    SELECT cara INTO v_cara FROM model_fail
    WHERE pesanan_id = event->>'id' AND versi = (event->>'versi')::bigint AND remaining > 0;
    IF v_cara = 'retry' THEN
        RAISE EXCEPTION 'model: % not yet', event->>'message_id' USING ERRCODE = 'URTRY';
    ELSIF v_cara = 'refuse' THEN
        RAISE EXCEPTION 'model: % refused', event->>'message_id';
    END IF;
    INSERT INTO model_applied (pesanan_id, versi, message_id, previous_versi, shard)
    VALUES (event->>'id', (event->>'versi')::bigint, event->>'message_id',
            (event->>'previous_versi')::bigint, (event->>'shard')::int);
END
$$;";

fn draw_spec(rng: &mut Rng) -> Spec {
    let shards = rng.range(2, 6);
    let orders = (0..rng.range(3, 8))
        .map(|i| {
            let count = rng.range(5, 15);
            // Some producers skip versions (1, 2, 4, 7, ...).
            let gaps = rng.chance(40);
            let mut v = if gaps && rng.chance(30) { 2 } else { 1 };
            let mut versions = Vec::with_capacity(count);
            for _ in 0..count {
                versions.push(v);
                v += if gaps && rng.chance(35) {
                    rng.range(2, 4) as i64
                } else {
                    1
                };
            }
            OrderSpec {
                id: format!("o{i}"),
                key: rng.next_u64(),
                versions,
                relay: rng.chance(25),
            }
        })
        .collect();
    let changes = (0..rng.range(0, 3))
        .map(|_| match rng.below(5) {
            0 | 1 => Change::Restart,
            2 | 3 => Change::Grow,
            _ => Change::Shrink,
        })
        .collect();
    Spec {
        shards,
        orders,
        changes,
    }
}

// ---------------------------------------------------------------------------
// The simulated broker and processes.

#[derive(Debug, Clone)]
enum Item {
    Marker(i64),
    Msg {
        order: usize,
        versi: i64,
        mid: String,
    },
}

#[derive(Debug, Default)]
struct Queue {
    items: VecDeque<Item>,
    exists: bool,
    /// Where the worker is with the front item.
    stage: Stage,
    /// Its worker task died with its channel open ([`WorkerDeath::Strand`]):
    /// nothing consumes or releases it until the pool's connection ends.
    stranded: bool,
}

/// Where a shard's worker is with its front delivery; every crash or lost
/// connection puts it back to `Idle` (the delivery goes back to the front).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
enum Stage {
    #[default]
    Idle,
    /// Handled (committed), not settled yet: acked, or with `dead` rejected
    /// to the dead-letter queue.
    Handled { dead: bool },
    /// Its apply failed (rolled back); the worker's next call for it
    /// (`set_aside`, or `hold_refused` then the dead letter) is not made yet.
    Failed(Failure),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Failure {
    /// `StoreError::sets_aside()`: the error's text.
    SetAside(String),
    /// `StoreError::HandlerRefused`: the handler's error.
    Refused(String),
}

/// A message in the dead-letter queue.
#[derive(Debug, Clone)]
struct Dead {
    order: usize,
    versi: i64,
    mid: String,
}

/// One `prepare_topology` in progress; `step` is the next thing it does.
#[derive(Debug)]
struct Prep {
    owner: Owner,
    /// The broker connection it runs on (dead once the broker restarted).
    conn: u64,
    step: Step,
    wanted: usize,
    /// `Plan::Change { from, to }` (None: `Keep`).
    change: Option<(usize, usize)>,
    bound: usize,
    consumed: usize,
    epoch: i64,
    marker_shards: Vec<i32>,
    marker_i: usize,
    /// Dies (process killed) right before this step.
    dies_at: Option<Step>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    /// The worker pool (re)connecting; consumes once prepared.
    Pool,
    /// `urutan topology` resharding while the pool keeps consuming.
    Topology,
}

/// The steps of `reshard::prepare::prepare_topology`, in its order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    /// `pause_publishing`, then `ring::current` + `ring::resolve`.
    Pause,
    /// `broker::restart::restarted` (probe), `open_window` if missing.
    Probe,
    /// `open_window("resharding ...")` for a `Plan::Change`.
    ReshardWindow,
    /// `topology::declare`: bind/unbind, then declare the sentinel (last).
    Declare,
    /// `handoff::register_shards(plan.consumed)`.
    Register,
    /// `open_epoch`, database half: `record_epoch`.
    RecordEpoch,
    /// `open_epoch`, broker half: one marker per active shard (one per step).
    Markers,
    /// `close_windows(epoch)`.
    CloseWindows,
    /// `ring::record_change`, `resume_publishing`; the pool starts consuming.
    Resume,
}

const DEATH_POINTS: [Step; 7] = [
    Step::Probe,
    Step::ReshardWindow,
    Step::Declare,
    Step::Register,
    Step::RecordEpoch,
    Step::Markers,
    Step::CloseWindows,
];

#[derive(Debug)]
enum PoolState {
    Down,
    Preparing,
    Consuming {
        conn: u64,
        consumed: usize,
        retire: Option<Retire>,
    },
}

/// `retire::retire_shards`: shards `from..top` (top first) once each has
/// passed `epoch`.
#[derive(Debug, Clone, Copy)]
struct Retire {
    from: usize,
    top: usize,
    epoch: i64,
}

#[derive(Debug)]
enum RelayState {
    Down,
    /// `session`: "relay connected" epoch recorded, putting its markers.
    Marking {
        conn: u64,
        epoch: i64,
        shards: Vec<i32>,
        i: usize,
    },
    Ready {
        conn: u64,
    },
}

#[derive(Debug, Clone, Copy)]
struct RingRecord {
    count: usize,
    epoch: i64,
    done: bool,
}

/// What one run of cases saw (summed over cases).
#[derive(Debug, Default, Clone)]
pub struct Stats {
    pub steps: u64,
    pub messages: u64,
    pub parked: u64,
    pub released: u64,
    pub duplicates: u64,
    pub restarts: u64,
    pub remaps: u64,
    pub grows: u64,
    pub shrinks: u64,
    pub retired: u64,
    pub prep_deaths: u64,
    pub pool_crashes: u64,
    pub windows: u64,
    pub epochs: u64,
    /// Cases whose handler has faults.
    pub fault_cases: u64,
    /// Handler calls that asked to retry.
    pub handler_retries: u64,
    /// Messages set aside at their delivery (`store::hold::set_aside`).
    pub set_aside: u64,
    /// Set-aside messages set aside again by a release (`retry`).
    pub retried: u64,
    /// Versions refused (at delivery, or by a release).
    pub refused: u64,
    /// Refused messages the operator replayed.
    pub replays: u64,
    /// Held orders the operator released without their version.
    pub skips: u64,
    /// Releases whose worker died before the commit.
    pub release_crashes: u64,
    /// Cases with `GAP_POLICY=wait`.
    pub gap_cases: u64,
    /// Orders held by a gap timeout (`urutan_tahan_celah`).
    pub gap_holds: u64,
    /// Gap holds the operator released (the version was never published).
    pub gap_releases: u64,
    /// Cases with effects.
    pub effect_cases: u64,
    /// Effects sent (a send whose result was lost to a crash included).
    pub effects_sent: u64,
    /// Attempts the endpoint failed (tried again).
    pub effect_retries: u64,
    /// Effects dead-lettered (each holding its order's later effects).
    pub effects_dead: u64,
    /// Dead-lettered effects the operator replayed / released (skipped).
    pub effect_replays: u64,
    pub effect_skips: u64,
    /// Dispatchers that died with claims (some mid-request).
    pub dispatcher_crashes: u64,
    /// Shard worker tasks that died while their process lived.
    pub worker_deaths: u64,
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        self.steps += o.steps;
        self.messages += o.messages;
        self.parked += o.parked;
        self.released += o.released;
        self.duplicates += o.duplicates;
        self.restarts += o.restarts;
        self.remaps += o.remaps;
        self.grows += o.grows;
        self.shrinks += o.shrinks;
        self.retired += o.retired;
        self.prep_deaths += o.prep_deaths;
        self.pool_crashes += o.pool_crashes;
        self.windows += o.windows;
        self.epochs += o.epochs;
        self.fault_cases += o.fault_cases;
        self.handler_retries += o.handler_retries;
        self.set_aside += o.set_aside;
        self.retried += o.retried;
        self.refused += o.refused;
        self.replays += o.replays;
        self.skips += o.skips;
        self.release_crashes += o.release_crashes;
        self.gap_cases += o.gap_cases;
        self.gap_holds += o.gap_holds;
        self.gap_releases += o.gap_releases;
        self.effect_cases += o.effect_cases;
        self.effects_sent += o.effects_sent;
        self.effect_retries += o.effect_retries;
        self.effects_dead += o.effects_dead;
        self.effect_replays += o.effect_replays;
        self.effect_skips += o.effect_skips;
        self.dispatcher_crashes += o.dispatcher_crashes;
        self.worker_deaths += o.worker_deaths;
    }
}

struct Sim<'a> {
    db: &'a PgPool,
    legacy: bool,
    rng: Rng,
    spec: Spec,
    queues: Vec<Queue>,
    /// Bound shards in ring order.
    ring: Vec<usize>,
    broker_gen: u64,
    sentinel: bool,
    pool: PoolState,
    /// SHARD_COUNT of the pool.
    pool_count: usize,
    /// The recorded ring changed under the consuming pool (`ring::watch`).
    pool_must_reprepare: bool,
    prep: Option<Prep>,
    /// A `urutan topology` died; its operator runs it again.
    topology_died: bool,
    /// A prepare holds `pause_publishing` (relay batches wait).
    paused: bool,
    relay: RelayState,
    /// Outbox rows in id order: (order, versi).
    outbox: Vec<(usize, i64)>,
    outbox_sent: usize,
    /// Next version index per order (direct producers).
    next_direct: Vec<usize>,
    changes_left: Vec<Change>,
    ring_rec: RingRecord,
    /// Message ids whose claim is committed (applied, parked or set
    /// aside; a refusal by a release drops it).
    committed: HashSet<String>,
    /// (order, versi) of every message id published.
    mids: HashMap<String, (usize, i64)>,
    /// The second random stream (faults, operator, clock, crashes around
    /// set-aside and release): see [`FAULT_SALT`].
    frng: Rng,
    faults: Option<Faults>,
    /// `RETRY_*`, `ON_REFUSED=hold` (no gap waits).
    policy: RetryPolicy,
    /// The dead-letter queue.
    dlq: Vec<Dead>,
    /// Versions the operator released their order without: (order, versi,
    /// message id), in order.
    skipped: Vec<(usize, i64, String)>,
    /// Every skip the operator made, as `urutan_lewati` must record it, in
    /// order: (order id, versi, message id, reason).
    skip_log: Vec<(String, Option<i64>, Option<String>, String)>,
    /// The third stream (gaps, effects, worker deaths): [`EXTRA_SALT`].
    xrng: Rng,
    extras: Extras,
    worker_death: WorkerDeath,
    /// Gap timeouts mid-stream, and refused versions skipped while later
    /// ones are on their way: see [`Mode`].
    open_gap_defects: bool,
    /// Per order, its versions in the order its producer publishes them.
    publish_order: Vec<Vec<i64>>,
    /// Gap holds the operator released: (order, the missing versi).
    gap_skipped: Vec<(usize, i64)>,
    /// Effects the model dispatcher claimed and has not settled yet.
    claims: Vec<urutan::effects::store::Claimed>,
    /// Effects whose claim died with a dispatcher: their lease expires
    /// when the model's clock says so.
    lost_claims: Vec<i64>,
    /// Per order, the `versi` of every effect sent, in sending order.
    effect_sends: HashMap<String, Vec<i64>>,
    /// Effects the operator released (skipped): (order id, versi).
    effect_skipped: Vec<(String, i64)>,
    violations: Vec<String>,
    trace: Vec<String>,
    keep_trace: bool,
    stats: Stats,
}

impl<'a> Sim<'a> {
    fn log(&mut self, line: impl FnOnce() -> String) {
        if self.keep_trace {
            let n = self.trace.len();
            self.trace.push(format!("{n:4} {}", line()));
        }
    }

    /// `kind`: one of [`KINDS`].
    fn violation(&mut self, kind: &str, what: String) {
        let what = format!("{kind}: {what}");
        self.log(|| format!("VIOLATION {what}"));
        self.violations.push(what);
    }

    async fn conn(&self) -> anyhow::Result<PoolConnection<Postgres>> {
        Ok(tokio::time::timeout(STATEMENT_LIMIT, self.db.acquire()).await??)
    }

    fn route(&self, order: usize) -> Option<usize> {
        if self.ring.is_empty() {
            return None;
        }
        Some(self.ring[jump(self.spec.orders[order].key, self.ring.len())])
    }

    fn existing(&self) -> usize {
        self.queues
            .iter()
            .rposition(|q| q.exists)
            .map_or(0, |i| i + 1)
    }

    /// Shards a live consumer of the pool takes from.
    fn live_shards(&self) -> Vec<usize> {
        match &self.pool {
            PoolState::Consuming { conn, consumed, .. } if *conn == self.broker_gen => (0
                ..*consumed)
                .filter(|&s| self.queues.get(s).is_some_and(|q| q.exists && !q.stranded))
                .collect(),
            _ => Vec::new(),
        }
    }

    fn ensure_queue(&mut self, s: usize) {
        while self.queues.len() <= s {
            self.queues.push(Queue::default());
        }
        self.queues[s].exists = true;
    }

    /// A producer publishes through the exchange: the CURRENT ring picks the
    /// queue (nothing else: no pause, no marker).
    fn publish(&mut self, order: usize, versi: i64, mid: String) -> bool {
        let Some(shard) = self.route(order) else {
            return false;
        };
        self.log(|| format!("publish {mid} -> shard {shard}"));
        self.mids.insert(mid.clone(), (order, versi));
        self.queues[shard]
            .items
            .push_back(Item::Msg { order, versi, mid });
        self.stats.messages += 1;
        true
    }

    fn direct_left(&self) -> Vec<usize> {
        (0..self.spec.orders.len())
            .filter(|&o| {
                !self.spec.orders[o].relay
                    && self.next_direct[o] < self.spec.orders[o].versions.len()
            })
            .collect()
    }

    fn publish_direct(&mut self, order: usize) -> bool {
        let versi = self.publish_order[order][self.next_direct[order]];
        let mid = format!("{}-v{versi}", self.spec.orders[order].id);
        if self.publish(order, versi, mid) {
            self.next_direct[order] += 1;
            true
        } else {
            false
        }
    }

    // -- the relay (`outbox::relay`) ----------------------------------------

    /// `session`: connects, then `open_epoch("relay connected")` OUTSIDE the
    /// publish lock (as the real relay does): record now, markers later.
    async fn relay_connect(&mut self) -> anyhow::Result<()> {
        let (epoch, shards) = handoff::record_epoch(&mut *self.conn().await?, "relay connected")
            .await
            .context("record_epoch")?;
        self.stats.epochs += 1;
        self.log(|| format!("relay connected: epoch {epoch} recorded for {shards:?}"));
        self.relay = RelayState::Marking {
            conn: self.broker_gen,
            epoch,
            shards,
            i: 0,
        };
        Ok(())
    }

    fn put_marker(&mut self, shard: i32, epoch: i64) -> bool {
        let s = shard as usize;
        // Published to the default exchange, mandatory, confirmed: a queue
        // that is gone returns it (NotConfirmed).
        if self.queues.get(s).is_some_and(|q| q.exists) {
            self.queues[s].items.push_back(Item::Marker(epoch));
            true
        } else {
            false
        }
    }

    fn relay_mark(&mut self) {
        let (conn, epoch, shard, last) = match &self.relay {
            RelayState::Marking {
                conn,
                epoch,
                shards,
                i,
            } => (*conn, *epoch, shards[*i], *i + 1 == shards.len()),
            _ => return,
        };
        if conn != self.broker_gen || !self.put_marker(shard, epoch) {
            self.log(|| format!("relay: marker {epoch} for shard {shard} failed; relay down"));
            self.relay = RelayState::Down;
            return;
        }
        self.log(|| format!("relay: marker {epoch} -> shard {shard}"));
        if last {
            self.relay = RelayState::Ready { conn };
        } else if let RelayState::Marking { i, .. } = &mut self.relay {
            *i += 1;
        }
    }

    /// `relay_batch`: holds the pause shared; a ring change cut short
    /// (a window without epoch; legacy: the flag) opens an epoch and closes
    /// it first; then publishes up to `n` rows in id order.
    async fn relay_batch(&mut self, n: usize) -> anyhow::Result<()> {
        let RelayState::Ready { conn } = self.relay else {
            return Ok(());
        };
        if conn != self.broker_gen {
            self.relay = RelayState::Down;
            return Ok(());
        }
        if self.paused {
            return Ok(()); // waits on the shared lock
        }
        let mut db = self.conn().await?;
        let unfinished = if self.legacy {
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM urutan_ring_berubah)")
                .fetch_one(&mut *db)
                .await?
        } else {
            handoff::ring_change_unfinished(&mut db).await?
        };
        if unfinished {
            let (epoch, shards) =
                handoff::record_epoch(&mut db, "a ring change was cut short").await?;
            self.stats.epochs += 1;
            for &s in &shards {
                if !self.put_marker(s, epoch) {
                    self.log(|| format!("relay: cut-short marker {epoch} to {s} failed"));
                    self.relay = RelayState::Down;
                    return Ok(());
                }
            }
            if self.legacy {
                sqlx::query("DELETE FROM urutan_ring_berubah")
                    .execute(&mut *db)
                    .await?;
            } else {
                handoff::close_windows(&mut db, epoch).await?;
            }
            self.log(|| format!("relay: ring change cut short: epoch {epoch}, windows closed"));
        }
        drop(db);
        for _ in 0..n {
            if self.outbox_sent == self.outbox.len() {
                break;
            }
            let (order, versi) = self.outbox[self.outbox_sent];
            let mid = format!("out-{}", self.outbox_sent + 1);
            if !self.publish(order, versi, mid) {
                break;
            }
            self.outbox_sent += 1;
        }
        Ok(())
    }

    // -- prepare_topology --------------------------------------------------

    fn start_prep(&mut self, owner: Owner, wanted: usize) {
        let dies_at = if self.rng.chance(12) {
            Some(DEATH_POINTS[self.rng.below(DEATH_POINTS.len())])
        } else {
            None
        };
        if owner == Owner::Pool {
            // A reconnect: the old connection's consumers are gone; what
            // they had not acked goes back to the front of its queue.
            for q in &mut self.queues {
                q.stage = Stage::Idle;
                q.stranded = false;
            }
            self.pool = PoolState::Preparing;
        }
        self.log(|| {
            format!("prepare ({owner:?}, SHARD_COUNT {wanted}) starts; dies at {dies_at:?}")
        });
        self.prep = Some(Prep {
            owner,
            conn: self.broker_gen,
            step: Step::Pause,
            wanted,
            change: None,
            bound: 0,
            consumed: 0,
            epoch: 0,
            marker_shards: Vec::new(),
            marker_i: 0,
            dies_at,
        });
    }

    /// The preparing process is gone (killed, or its broker connection
    /// failed): its session ends, and with it the pause.
    fn abort_prep(&mut self, why: &str) {
        let Some(prep) = self.prep.take() else {
            return;
        };
        self.paused = false;
        self.log(|| format!("prepare ({:?}) {why} before {:?}", prep.owner, prep.step));
        match prep.owner {
            Owner::Pool => self.pool = PoolState::Down,
            Owner::Topology => self.topology_died = true,
        }
    }

    /// One step of the prepare in progress, in `prepare_topology`'s order.
    async fn prep_step(&mut self, may_die: bool) -> anyhow::Result<()> {
        let Some(step) = self.prep.as_ref().map(|p| p.step) else {
            return Ok(());
        };
        if may_die && self.prep.as_ref().and_then(|p| p.dies_at) == Some(step) {
            self.stats.prep_deaths += 1;
            self.abort_prep("died");
            return Ok(());
        }
        let broker_alive = self
            .prep
            .as_ref()
            .is_some_and(|p| p.conn == self.broker_gen);
        let legacy = self.legacy;
        match step {
            Step::Pause => {
                // pause_publishing: relay batches are atomic here, so the
                // exclusive lock is free at once.
                self.paused = true;
                let wanted = self.prep.as_ref().map_or(0, |p| p.wanted);
                let rec = self.ring_rec;
                let change = (wanted != rec.count).then_some((rec.count, wanted));
                let prep = self.prep.as_mut().context("prep")?;
                prep.change = change;
                prep.step = Step::Probe;
            }
            Step::Probe => {
                if !broker_alive {
                    self.abort_prep("lost the broker");
                    return Ok(());
                }
                // New protocol only: the old one had no sentinel.
                if !legacy && !self.sentinel {
                    handoff::open_window(&mut *self.conn().await?, "broker restarted").await?;
                    self.stats.windows += 1;
                    self.log(|| "probe: sentinel missing -> window opened".to_owned());
                }
                self.prep.as_mut().context("prep")?.step = Step::ReshardWindow;
            }
            Step::ReshardWindow => {
                let change = self.prep.as_ref().and_then(|p| p.change);
                if legacy {
                    // Before the fix: `ring_change_begins`, unconditionally.
                    sqlx::query(
                        "INSERT INTO urutan_ring_berubah DEFAULT VALUES ON CONFLICT DO NOTHING",
                    )
                    .execute(&mut *self.conn().await?)
                    .await?;
                } else if let Some((from, to)) = change {
                    handoff::open_window(
                        &mut *self.conn().await?,
                        &format!("resharding {from} -> {to}"),
                    )
                    .await?;
                    self.stats.windows += 1;
                    self.log(|| format!("window opened: resharding {from} -> {to}"));
                }
                self.prep.as_mut().context("prep")?.step = Step::Declare;
            }
            Step::Declare => {
                if !broker_alive {
                    self.abort_prep("lost the broker");
                    return Ok(());
                }
                let target = self.prep.as_ref().map_or(0, |p| p.wanted);
                let consumed = self.existing().max(target);
                for index in 0..consumed {
                    self.ensure_queue(index);
                    if index >= target {
                        self.ring.retain(|&s| s != index);
                    } else if !self.ring.contains(&index) {
                        // Binding in index order appends a new shard.
                        self.ring.push(index);
                    }
                }
                // Last, in `topology::declare` (new code only).
                self.sentinel = true;
                let ring = self.ring.clone();
                self.log(|| format!("declare: bound {target}, consumed {consumed}, ring {ring:?}"));
                let prep = self.prep.as_mut().context("prep")?;
                prep.bound = target;
                prep.consumed = consumed;
                prep.step = Step::Register;
            }
            Step::Register => {
                let consumed = self.prep.as_ref().map_or(0, |p| p.consumed);
                handoff::register_shards(&mut *self.conn().await?, consumed as u16).await?;
                self.prep.as_mut().context("prep")?.step = Step::RecordEpoch;
            }
            Step::RecordEpoch => {
                let (epoch, shards) =
                    handoff::record_epoch(&mut *self.conn().await?, "topology prepared").await?;
                self.stats.epochs += 1;
                self.log(|| format!("prepare: epoch {epoch} recorded for {shards:?}"));
                let prep = self.prep.as_mut().context("prep")?;
                prep.epoch = epoch;
                prep.marker_shards = shards;
                prep.marker_i = 0;
                prep.step = Step::Markers;
            }
            Step::Markers => {
                let (epoch, shard, done) = {
                    let p = self.prep.as_ref().context("prep")?;
                    match p.marker_shards.get(p.marker_i) {
                        Some(&s) => (p.epoch, Some(s), false),
                        None => (p.epoch, None, true),
                    }
                };
                if let Some(shard) = shard {
                    if !broker_alive || !self.put_marker(shard, epoch) {
                        self.abort_prep("could not put a marker");
                        return Ok(());
                    }
                    self.log(|| format!("prepare: marker {epoch} -> shard {shard}"));
                    self.prep.as_mut().context("prep")?.marker_i += 1;
                }
                if done {
                    self.prep.as_mut().context("prep")?.step = Step::CloseWindows;
                }
            }
            Step::CloseWindows => {
                let epoch = self.prep.as_ref().map_or(0, |p| p.epoch);
                if legacy {
                    sqlx::query("DELETE FROM urutan_ring_berubah")
                        .execute(&mut *self.conn().await?)
                        .await?;
                } else {
                    handoff::close_windows(&mut *self.conn().await?, epoch).await?;
                    self.log(|| format!("close_windows({epoch})"));
                }
                self.prep.as_mut().context("prep")?.step = Step::Resume;
            }
            Step::Resume => {
                let prep = self.prep.take().context("prep")?;
                if let Some((_, to)) = prep.change {
                    self.ring_rec = RingRecord {
                        count: to,
                        epoch: prep.epoch,
                        done: false,
                    };
                }
                self.paused = false;
                self.log(|| format!("prepare ({:?}) done: epoch {}", prep.owner, prep.epoch));
                match prep.owner {
                    Owner::Pool => {
                        let retire = (prep.consumed > prep.bound).then_some(Retire {
                            from: prep.bound,
                            top: prep.consumed,
                            epoch: prep.epoch,
                        });
                        self.pool = PoolState::Consuming {
                            conn: prep.conn,
                            consumed: prep.consumed,
                            retire,
                        };
                        self.pool_must_reprepare = false;
                    }
                    Owner::Topology => {
                        self.topology_died = false;
                        // `ring::watch` of the consuming pool sees the new
                        // record and prepares again.
                        self.pool_must_reprepare = true;
                    }
                }
            }
        }
        Ok(())
    }

    // -- the worker pool ---------------------------------------------------

    fn event(&self, order: usize, versi: i64, mid: &str) -> Event {
        Event {
            message_id: mid.to_owned(),
            entity_id: self.spec.orders[order].id.clone(),
            status: "dibuat".to_owned(),
            versi,
            ..Default::default()
        }
    }

    /// One shard's worker takes its next step with its front delivery:
    /// handles it (a marker, or a message: `store::apply`), or makes the
    /// call that follows a failed apply, or settles (acks, or rejects to the
    /// dead-letter queue) the one it handled.
    async fn consume(&mut self, shard: usize, ack_now: bool) -> anyhow::Result<()> {
        match std::mem::take(&mut self.queues[shard].stage) {
            Stage::Idle => {}
            Stage::Handled { dead } => {
                self.settle(shard, dead);
                return Ok(());
            }
            Stage::Failed(failure) => return self.after_failure(shard, failure, ack_now).await,
        }
        let Some(item) = self.queues[shard].items.front().cloned() else {
            return Ok(());
        };
        self.stats.steps += 1;
        match item {
            Item::Marker(epoch) => {
                handoff::pass_marker(self.db, shard as u16, epoch).await?;
                self.log(|| format!("shard {shard}: passed marker {epoch}"));
            }
            Item::Msg { order, versi, mid } => {
                let event = self.event(order, versi, &mid);
                let applied = tokio::time::timeout(
                    STATEMENT_LIMIT,
                    store::apply(self.db, &event, shard as u16),
                )
                .await?;
                let applied = match applied {
                    Ok(applied) => applied,
                    Err(e) => {
                        // The worker's `decide`: `held_unless(sets_aside, apply)`.
                        let failure = match &e {
                            e if e.sets_aside() => {
                                self.failed_call(order, versi).await?;
                                Failure::SetAside(e.to_string())
                            }
                            StoreError::HandlerRefused(error) => Failure::Refused(error.clone()),
                            _ => bail!("apply {mid}: {e}"),
                        };
                        self.log(|| format!("shard {shard}: {mid} -> {failure:?}"));
                        if self.committed.contains(&mid) {
                            self.violation(
                                "redelivery",
                                format!("redelivered {mid} reached the handler: {failure:?}"),
                            );
                        }
                        // Its next call now, or as a later step (a crash may
                        // come between).
                        if self.frng.chance(70) {
                            return self.after_failure(shard, failure, ack_now).await;
                        }
                        self.queues[shard].stage = Stage::Failed(failure);
                        return Ok(());
                    }
                };
                self.log(|| format!("shard {shard}: {mid} -> {applied:?}"));
                let redelivery = !self.committed.insert(mid.clone());
                match applied {
                    Applied::Done(Outcome::Duplicate) if redelivery => self.stats.duplicates += 1,
                    _ if redelivery => self.violation(
                        "redelivery",
                        format!("redelivered {mid} came out {applied:?}"),
                    ),
                    Applied::Done(Outcome::Applied) => {}
                    Applied::Done(Outcome::Stale) => {
                        self.violation("stale", format!("{mid} came out stale (shard {shard})"))
                    }
                    Applied::Parked => self.stats.parked += 1,
                    other => self.violation(
                        "first-delivery",
                        format!("{mid} came out {other:?} on first delivery"),
                    ),
                }
            }
        }
        if ack_now {
            self.settle(shard, false);
        } else {
            self.queues[shard].stage = Stage::Handled { dead: false };
        }
        Ok(())
    }

    /// The worker's call after a failed apply of its front message, as
    /// `shard::steps` makes it: a transient failure of the message's own
    /// transaction is set aside (`set_aside`: claimed, parked with a due
    /// time, then acked); a refusal by the handler holds its order
    /// (`hold_order`: `store::hold::hold_refused`, ON_REFUSED=hold) and is
    /// then dead-lettered.
    async fn after_failure(
        &mut self,
        shard: usize,
        failure: Failure,
        ack_now: bool,
    ) -> anyhow::Result<()> {
        let Some(Item::Msg { order, versi, mid }) = self.queues[shard].items.front().cloned()
        else {
            bail!("shard {shard}: a failure without its message");
        };
        let event = self.event(order, versi, &mid);
        let dead = match failure {
            Failure::SetAside(error) => {
                let applied = tokio::time::timeout(
                    STATEMENT_LIMIT,
                    store::hold::set_aside(self.db, &event, shard as u16, &error, &self.policy),
                )
                .await?
                .map_err(|e| anyhow::anyhow!("set_aside {mid}: {e}"))?;
                self.log(|| format!("shard {shard}: {mid} set aside -> {applied:?}"));
                if applied == Applied::Parked {
                    self.committed.insert(mid);
                    self.stats.set_aside += 1;
                } else {
                    self.violation(
                        "first-delivery",
                        format!("{mid} failed, then set aside came out {applied:?}"),
                    );
                }
                false
            }
            Failure::Refused(error) => {
                let held = store::hold::hold_refused(self.db, &event, shard as u16, Some(&error))
                    .await
                    .map_err(|e| anyhow::anyhow!("hold_refused {mid}: {e}"))?;
                self.stats.refused += 1;
                self.log(|| format!("shard {shard}: {mid} refused; order held anew: {held}"));
                true
            }
        };
        if ack_now {
            self.settle(shard, dead);
        } else {
            self.queues[shard].stage = Stage::Handled { dead };
        }
        Ok(())
    }

    /// Acks the front delivery (with `dead`: rejects it, into the
    /// dead-letter queue).
    fn settle(&mut self, shard: usize, dead: bool) {
        self.queues[shard].stage = Stage::Idle;
        let item = self.queues[shard].items.pop_front();
        if let (true, Some(Item::Msg { order, versi, mid })) = (dead, item) {
            self.log(|| format!("shard {shard}: {mid} dead-lettered"));
            self.dlq.push(Dead { order, versi, mid });
        }
    }

    /// The case's handler failed transiently on a call for (order, versi):
    /// one of its failing calls is spent (the model counts them: the
    /// handler's own decrement would roll back with the failed transaction).
    async fn failed_call(&mut self, order: usize, versi: i64) -> anyhow::Result<()> {
        self.stats.handler_retries += 1;
        sqlx::query(
            "UPDATE model_fail SET remaining = remaining - 1
             WHERE pesanan_id = $1 AND versi = $2 AND cara = 'retry' AND remaining > 0",
        )
        .bind(&self.spec.orders[order].id)
        .bind(versi)
        .execute(self.db)
        .await?;
        Ok(())
    }

    /// The shard's release step. Legacy: `handoff::release`. Otherwise the
    /// worker's `release_in_transaction`: `handoff::release_with` in a
    /// transaction; each refused version is published to the dead-letter
    /// exchange (and recorded) before the commit. With `may_crash` (cases
    /// with faults) the worker sometimes dies before the commit: everything
    /// rolls back, and a refused version's dead letter may already be
    /// published. (A release that commits runs as one statement: nothing
    /// else runs between its publishes and its commit in the model.)
    async fn release(&mut self, shard: usize, may_crash: bool) -> anyhow::Result<usize> {
        if self.legacy {
            let released = tokio::time::timeout(
                STATEMENT_LIMIT,
                handoff::release(self.db, shard as u16, RELEASE_BATCH),
            )
            .await??;
            return self.released(shard, released).await;
        }
        let dies = may_crash && self.faults.is_some() && self.frng.chance(4);
        if !dies {
            // Committed, then its dead letters published: the same, in the
            // model, as published then committed (nothing runs in between),
            // and one round trip instead of three.
            let released = tokio::time::timeout(
                STATEMENT_LIMIT,
                handoff::release_with(
                    &mut *self.conn().await?,
                    shard as u16,
                    RELEASE_BATCH,
                    &self.policy,
                    None,
                ),
            )
            .await??;
            return self.released(shard, released).await;
        }
        let mut tx = self.db.begin().await?;
        let released = tokio::time::timeout(
            STATEMENT_LIMIT,
            handoff::release_with(&mut tx, shard as u16, RELEASE_BATCH, &self.policy, None),
        )
        .await??;
        // The worker dies before the commit.
        let refused: Vec<&handoff::Released> =
            released.iter().filter(|r| r.result == "refused").collect();
        let published = !refused.is_empty() && self.frng.chance(50);
        let dead: Vec<Dead> = if published {
            refused
                .iter()
                .filter_map(|r| {
                    let &(order, versi) = self.mids.get(&r.message_id)?;
                    Some(Dead {
                        order,
                        versi,
                        mid: r.message_id.clone(),
                    })
                })
                .collect()
        } else {
            Vec::new()
        };
        tx.rollback().await?;
        let n = released.len();
        self.log(|| {
            format!(
                "shard {shard}: release of {n} rolled back: the pool died before the commit \
                 (dead letters already published: {:?})",
                dead.iter().map(|d| &d.mid).collect::<Vec<_>>()
            )
        });
        self.dlq.extend(dead);
        // The handler's failing calls were made all the same.
        for r in &released {
            let failed = r.result == "retry" || r.reason.as_deref() == Some("retries_exhausted");
            if let (true, Some(&(order, versi))) = (failed, self.mids.get(&r.message_id)) {
                self.failed_call(order, versi).await?;
            }
        }
        self.stats.release_crashes += 1;
        self.pool_crash();
        Ok(0)
    }

    /// What a committed release did.
    async fn released(
        &mut self,
        shard: usize,
        released: Vec<handoff::Released>,
    ) -> anyhow::Result<usize> {
        for r in &released {
            self.stats.released += 1;
            let (id, result, reason) = (r.message_id.clone(), r.result.clone(), r.reason.clone());
            self.log(|| format!("shard {shard}: released {id} -> {result} {reason:?}"));
            let at = self.mids.get(&r.message_id).copied();
            match (r.result.as_str(), at) {
                ("applied", _) => {}
                ("retry", Some((order, versi))) => {
                    self.stats.retried += 1;
                    self.failed_call(order, versi).await?;
                }
                ("refused", Some((order, versi))) => {
                    if r.reason.as_deref() == Some("retries_exhausted") {
                        self.failed_call(order, versi).await?;
                    }
                    // Out of the sequence: its claim dropped, a replay is new.
                    self.committed.remove(&r.message_id);
                    self.stats.refused += 1;
                    self.dlq.push(Dead {
                        order,
                        versi,
                        mid: r.message_id.clone(),
                    });
                }
                _ => self.violation(
                    "stale",
                    format!("released {} came out {}", r.message_id, r.result),
                ),
            }
        }
        Ok(released.len())
    }

    /// One attempt of `retire::retire_when_drained` for the top shard left.
    async fn retire_step(&mut self) -> anyhow::Result<bool> {
        let PoolState::Consuming {
            conn,
            retire: Some(r),
            ..
        } = self.pool
        else {
            return Ok(false);
        };
        if conn != self.broker_gen {
            return Ok(false);
        }
        let shard = r.top - 1;
        // The real decision: past the marker, and nothing it parked waits.
        if urutan::reshard::retire::progress(self.db, shard as u16, r.epoch).await?
            == urutan::reshard::retire::Progress::Draining
        {
            return Ok(false);
        }
        // queue.delete: whatever is still in it is gone.
        let lost: Vec<String> = self.queues[shard]
            .items
            .iter()
            .filter_map(|i| match i {
                Item::Msg { mid, .. } if !self.committed.contains(mid) => Some(mid.clone()),
                _ => None,
            })
            .collect();
        if !lost.is_empty() {
            self.violation(
                "lost",
                format!("retired shard {shard} deleted with {lost:?} in it"),
            );
        }
        self.queues[shard] = Queue::default();
        self.ring.retain(|&s| s != shard);
        sqlx::query("UPDATE urutan_shard SET aktif = false WHERE shard = $1")
            .bind(shard as i32)
            .execute(self.db)
            .await?;
        self.stats.retired += 1;
        self.log(|| format!("retired shard {shard}"));
        if let PoolState::Consuming { retire, .. } = &mut self.pool {
            *retire = (shard > r.from).then_some(Retire { top: shard, ..r });
        }
        Ok(true)
    }

    /// `ring::drained` + `complete`: the resharding in progress is over.
    async fn resharding_done(&mut self) -> anyhow::Result<bool> {
        if self.ring_rec.done {
            return Ok(true);
        }
        let drained: bool = sqlx::query_scalar(
            "SELECT coalesce(min(epoch) FILTER (WHERE aktif), 0) >= $1
                    AND NOT coalesce(bool_or(aktif AND shard >= $2), false)
             FROM urutan_shard",
        )
        .bind(self.ring_rec.epoch)
        .bind(self.ring_rec.count as i32)
        .fetch_one(self.db)
        .await?;
        self.ring_rec.done = drained;
        Ok(drained)
    }

    fn broker_restart(&mut self, remap: bool) {
        self.broker_gen += 1;
        // Non-durable: the sentinel is gone.
        self.sentinel = false;
        self.stats.restarts += 1;
        if remap && self.ring.len() > 1 {
            let before = self.ring.clone();
            while self.ring == before {
                self.rng.shuffle(&mut self.ring);
            }
            self.stats.remaps += 1;
        }
        // Every connection drops; unacked deliveries go back to the front.
        for q in &mut self.queues {
            q.stage = Stage::Idle;
            q.stranded = false;
        }
        if matches!(self.pool, PoolState::Consuming { .. }) {
            self.pool = PoolState::Down;
        }
        self.relay = RelayState::Down;
        let ring = self.ring.clone();
        self.log(|| format!("BROKER RESTART (remap {remap}): ring {ring:?}"));
    }

    fn pool_crash(&mut self) {
        self.stats.pool_crashes += 1;
        for q in &mut self.queues {
            q.stage = Stage::Idle;
            q.stranded = false;
        }
        if self.prep.as_ref().is_some_and(|p| p.owner == Owner::Pool) {
            self.abort_prep("crashed");
        }
        self.pool = PoolState::Down;
        self.log(|| "pool crashed (unacked deliveries back to the front)".to_owned());
    }

    /// Starts a ring change (`Change`), if one may start now.
    async fn ring_change(&mut self, change: Change) -> anyhow::Result<bool> {
        match change {
            Change::Restart => {
                let remap = self.rng.chance(80);
                self.broker_restart(remap);
                Ok(true)
            }
            Change::Grow | Change::Shrink => {
                if self.prep.is_some() || !self.resharding_done().await? {
                    return Ok(false);
                }
                let count = self.ring_rec.count;
                let to = if change == Change::Grow {
                    count + self.rng.range(1, 3)
                } else if count > 2 {
                    count - self.rng.range(1, (count - 2).min(2))
                } else {
                    return Ok(true); // nothing to shrink: spent
                };
                self.pool_count = to;
                if change == Change::Grow {
                    self.stats.grows += 1;
                } else {
                    self.stats.shrinks += 1;
                }
                // Either `urutan topology` while the pool consumes, or the
                // pool restarted with the new SHARD_COUNT.
                if self.rng.chance(50) {
                    self.start_prep(Owner::Topology, to);
                } else {
                    self.start_prep(Owner::Pool, to);
                }
                Ok(true)
            }
        }
    }

    fn all_published(&self) -> bool {
        self.direct_left().is_empty() && self.outbox_sent == self.outbox.len()
    }

    /// One random step.
    async fn step(&mut self) -> anyhow::Result<()> {
        // Gaps, effects, worker deaths: the third stream (a case without
        // them draws nothing from it).
        let x = self.extras;
        if (x.gaps || x.effects || x.worker_deaths) && self.extra_step().await? {
            return Ok(());
        }
        // Steps of cases with faults, drawn from the second stream (so that
        // a case without faults takes exactly the steps it always took).
        if self.faults.is_some() {
            match self.frng.below(100) {
                0..=3 => {
                    let all = self.frng.chance(30);
                    self.clock(all).await?;
                    return Ok(());
                }
                4..=7 if !self.dlq.is_empty() => {
                    let i = self.frng.below(self.dlq.len());
                    self.operator(i, true).await?;
                    return Ok(());
                }
                _ => {}
            }
        }
        let live = self.live_shards();
        let busy: Vec<usize> = live
            .iter()
            .copied()
            .filter(|&s| !self.queues[s].items.is_empty())
            .collect();
        let direct = self.direct_left();
        let roll = self.rng.below(1000);
        match roll {
            0..=399 if !busy.is_empty() => {
                let s = busy[self.rng.below(busy.len())];
                let ack_now = self.rng.chance(85);
                self.consume(s, ack_now).await?;
            }
            400..=599 if !direct.is_empty() => {
                let o = direct[self.rng.below(direct.len())];
                self.publish_direct(o);
            }
            600..=679 => match self.relay {
                RelayState::Down => {
                    if self.outbox_sent < self.outbox.len() {
                        self.relay_connect().await?;
                    }
                }
                RelayState::Marking { .. } => self.relay_mark(),
                RelayState::Ready { .. } => {
                    let n = self.rng.range(1, 3);
                    self.relay_batch(n).await?;
                }
            },
            680..=759 if !live.is_empty() => {
                let s = live[self.rng.below(live.len())];
                self.release(s, true).await?;
            }
            760..=879 if self.prep.is_some() => self.prep_step(true).await?,
            880..=909 if self.prep.is_none() && self.topology_died && self.rng.chance(50) => {
                // The operator saw `urutan topology` fail and runs it again.
                self.start_prep(Owner::Topology, self.pool_count);
            }
            880..=909 if self.prep.is_none() => {
                let live = matches!(self.pool,
                    PoolState::Consuming { conn, .. } if conn == self.broker_gen);
                let reconnect = self.pool_must_reprepare || !live || self.rng.chance(10);
                if reconnect {
                    self.start_prep(Owner::Pool, self.pool_count);
                }
            }
            910..=919 if self.pool_inflight() => self.pool_crash(),
            920..=929 if !matches!(self.relay, RelayState::Down) && self.rng.chance(30) => {
                self.log(|| "relay connection dropped".to_owned());
                self.relay = RelayState::Down;
            }
            930..=969 => {
                self.retire_step().await?;
            }
            970..=999 if !self.changes_left.is_empty() => {
                let change = self.changes_left[0];
                if self.ring_change(change).await? {
                    self.changes_left.remove(0);
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn pool_inflight(&self) -> bool {
        self.queues.iter().any(|q| q.stage != Stage::Idle)
    }

    /// Time passes (the model's clock): one message set aside (or, with
    /// `all`, every one) becomes due. Nothing else reads the time: the
    /// backoff ([`BACKOFF`]) is longer than any case.
    async fn clock(&mut self, all: bool) -> anyhow::Result<bool> {
        let waiting: Vec<i64> = sqlx::query_scalar(
            "SELECT seq FROM urutan_parkir WHERE jatuh_tempo > now() ORDER BY seq",
        )
        .fetch_all(self.db)
        .await?;
        if waiting.is_empty() {
            return Ok(false);
        }
        let due = if all {
            waiting
        } else {
            vec![waiting[self.frng.below(waiting.len())]]
        };
        sqlx::query(
            "UPDATE urutan_parkir SET jatuh_tempo = now() - interval '1 second' WHERE seq = ANY($1)",
        )
        .bind(&due)
        .execute(self.db)
        .await?;
        self.log(|| format!("clock: set-aside rows {due:?} are due"));
        Ok(true)
    }

    /// The operator takes one dead letter (the `i`th): a version already
    /// skipped is purged; a refused message holding its order is either
    /// skipped (`store::hold::release_hold`, as `urutan hold release`) or
    /// replayed; any other is replayed. A replay (`urutan dlq replay`)
    /// publishes the message again, a new delivery with the same message id,
    /// through the ring as it is now; before it the operator fixes the
    /// handler for that version (unless `unfixed` and the draw says not).
    /// Nothing is decided about a version while a replay of it is still
    /// queued (`urutan dlq replay` waits for the outcome).
    async fn operator(&mut self, i: usize, unfixed: bool) -> anyhow::Result<bool> {
        let Some(dead) = self.dlq.get(i).cloned() else {
            return Ok(false);
        };
        let Dead { order, versi, mid } = dead;
        let id = self.spec.orders[order].id.clone();
        if self.skipped.iter().any(|s| s.2 == mid) {
            self.log(|| format!("operator: purges {mid} (skipped)"));
            self.dlq.remove(i);
            return Ok(true);
        }
        let queued = self.queues.iter().any(|q| {
            q.items
                .iter()
                .any(|it| matches!(it, Item::Msg { mid: m, .. } if *m == mid))
        });
        if queued {
            return Ok(false);
        }
        let holds = store::hold::holds(self.db, Some(&id), 10).await?;
        let held_by_it = holds
            .iter()
            .any(|h| h.reason == "refused" && h.message_id.as_deref() == Some(mid.as_str()));
        let (skip_percent, unfixed_percent) = self
            .faults
            .as_ref()
            .map_or((0, 0), |f| (f.skip_percent, f.unfixed_percent));
        // With GAP_POLICY=wait the operator skips a refused version only
        // once the versions before the highest one waiting are all there
        // (unless the run exercises the open gap defects: `Mode`).
        let careful = self.extras.gaps && !self.open_gap_defects;
        if held_by_it
            && self.frng.chance(skip_percent)
            && (!careful || self.all_arrived(order, versi).await?)
        {
            let released = store::hold::release_hold(self.db, &id).await?;
            self.log(|| format!("operator: hold release {id} -> {released:?}"));
            match released {
                Some(r)
                    if r.message_id.as_deref() == Some(mid.as_str()) && r.versi == Some(versi) =>
                {
                    self.stats.skips += 1;
                    self.skip_log.push((
                        id.clone(),
                        Some(versi),
                        Some(mid.clone()),
                        "refused".to_owned(),
                    ));
                    self.skipped.push((order, versi, mid));
                }
                other => self.violation(
                    "skipped",
                    format!("hold release of {id} (held by {mid}, v{versi}) returned {other:?}"),
                ),
            }
            self.dlq.remove(i);
            return Ok(true);
        }
        if self.ring.is_empty() {
            return Ok(false);
        }
        let fix = !(unfixed && self.frng.chance(unfixed_percent));
        if fix {
            sqlx::query("DELETE FROM model_fail WHERE pesanan_id = $1 AND versi = $2")
                .bind(&id)
                .bind(versi)
                .execute(self.db)
                .await?;
        }
        self.log(|| {
            format!("operator: replays {mid} (held by it: {held_by_it}; handler fixed: {fix})")
        });
        self.dlq.remove(i);
        self.stats.replays += 1;
        self.publish(order, versi, mid);
        Ok(true)
    }

    // -- shard workers that die, gaps, effects (the third stream) ----------

    /// A shard's worker task dies while its process lives (a panic outside
    /// a message's own guards). [`WorkerDeath::Reopen`]: its channel is
    /// closed and opened again, what it held goes back to the front of its
    /// queue (a version it committed and had not acked comes back a
    /// `duplicate`). [`WorkerDeath::Strand`]: the channel stays open, the
    /// delivery it held stays unacked and the shard is neither consumed nor
    /// released until the pool's connection ends.
    fn worker_dies(&mut self, shard: usize) {
        self.stats.worker_deaths += 1;
        let stage = std::mem::take(&mut self.queues[shard].stage);
        match self.worker_death {
            WorkerDeath::Reopen => {
                self.log(|| {
                    format!(
                        "shard {shard}: worker panicked ({stage:?}); channel reopened, \
                         its deliveries back to the front"
                    )
                });
            }
            WorkerDeath::Strand => {
                self.queues[shard].stranded = true;
                self.log(|| {
                    format!(
                        "shard {shard}: worker task ended ({stage:?}); its channel stays open, \
                         nothing consumes the shard"
                    )
                });
            }
        }
    }

    /// The shard's gap check (`hold_gaps`, about once a second in the
    /// worker) after `GAP_TIMEOUT` passed for every gap waiting now.
    async fn gap_check(&mut self, shard: usize) -> anyhow::Result<()> {
        let held = store::hold::hold_gaps(self.db, shard as u16, Duration::ZERO).await?;
        for h in held {
            self.stats.gap_holds += 1;
            self.log(|| {
                format!(
                    "shard {shard}: gap timeout: {} held, v{} missing ({} waiting)",
                    h.order, h.versi, h.waiting
                )
            });
        }
        Ok(())
    }

    /// The operator looks at the gap holds (`urutan hold list`): a missing
    /// version its producer never published is released (`urutan hold
    /// release`, recorded as a skip) once every other version below the
    /// highest one waiting has arrived (a release lets every version that
    /// waits then go past any gap, as the contract says: one still on its
    /// way would come out `stale`); one that was or will be published is
    /// waited for (its arrival ends the hold).
    async fn gap_operator(&mut self) -> anyhow::Result<bool> {
        let holds = store::hold::holds(self.db, None, 1000).await?;
        let mut acted = false;
        for h in holds.into_iter().filter(|h| h.reason == "gap") {
            let Some(order) = self.spec.orders.iter().position(|o| o.id == h.order) else {
                self.violation(
                    "left-held",
                    format!("a gap hold of unknown order {}", h.order),
                );
                continue;
            };
            let Some(missing) = h.versi else {
                self.violation(
                    "left-held",
                    format!("gap hold of {} without a version", h.order),
                );
                continue;
            };
            // A version the operator skipped (refused) never comes either.
            let skipped = self.skipped.iter().any(|s| s.0 == order && s.1 == missing);
            if self.spec.orders[order].versions.contains(&missing) && !skipped {
                continue;
            }
            if !self.all_arrived(order, missing).await? {
                continue;
            }
            let released = store::hold::release_hold(self.db, &h.order).await?;
            self.log(|| {
                format!(
                    "operator: hold release {} (gap v{missing}) -> {released:?}",
                    h.order
                )
            });
            match released {
                Some(r) if r.reason == "gap" && r.versi == Some(missing) => {
                    self.stats.gap_releases += 1;
                    self.gap_skipped.push((order, missing));
                    self.skip_log
                        .push((h.order.clone(), r.versi, r.message_id, r.reason));
                    acted = true;
                }
                other => self.violation(
                    "skipped",
                    format!(
                        "hold release of {} (gap v{missing}) returned {other:?}",
                        h.order
                    ),
                ),
            }
        }
        Ok(acted)
    }

    /// Every version of `order` between the stored one and the highest one
    /// waiting has arrived (is parked), `except` the one an operator would
    /// skip and those the operator skipped already: releasing a hold then
    /// lets nothing go past a version still on its way.
    async fn all_arrived(&self, order: usize, except: i64) -> anyhow::Result<bool> {
        let id = &self.spec.orders[order].id;
        let waiting: Vec<i64> =
            sqlx::query_scalar("SELECT versi FROM urutan_parkir WHERE pesanan_id = $1")
                .bind(id)
                .fetch_all(self.db)
                .await?;
        let stored = store::stored_version(self.db, id).await?.unwrap_or(0);
        let top = waiting.iter().copied().max().unwrap_or(0);
        Ok(self.spec.orders[order].versions.iter().all(|&v| {
            v <= stored
                || v > top
                || v == except
                || waiting.contains(&v)
                || self.skipped.iter().any(|s| s.0 == order && s.1 == v)
        }))
    }

    /// The model dispatcher claims every effect that may go now (up to 50,
    /// `urutan_efek_klaim`), and keeps its claims sorted: orders due at the
    /// same instant (released in one transaction) come out of the claim in
    /// any order, and a seed must replay the same case.
    async fn dispatch_claim(&mut self) -> anyhow::Result<usize> {
        let mut claimed = urutan::effects::store::claim(self.db, 50, EFFECT_LEASE, "model").await?;
        claimed.sort_by(|a, b| (&a.pesanan_id, a.versi).cmp(&(&b.pesanan_id, b.versi)));
        let got = claimed.len();
        for c in claimed {
            self.log(|| {
                format!(
                    "dispatcher: claimed {}'s v{} (attempt {})",
                    c.pesanan_id, c.versi, c.percobaan
                )
            });
            self.claims.push(c);
        }
        self.claims
            .sort_by(|a, b| (&a.pesanan_id, a.versi).cmp(&(&b.pesanan_id, b.versi)));
        Ok(got)
    }

    /// The dispatcher sends its `i`th claimed effect and records what the
    /// endpoint answered: `outcome` 0 sent, 1 a failure to try again, 2 given
    /// up (dead-lettered, holding its order's later effects), 3 the
    /// dispatcher dies mid-request (the endpoint got it; nothing recorded).
    /// A send is checked at once: none of its order's effects of an earlier
    /// version may still be pending or dead-lettered and held.
    async fn dispatch_send(&mut self, i: usize, outcome: u8) -> anyhow::Result<()> {
        use urutan::effects::OnDead;
        use urutan::effects::store::{Recorded, Settled, record};
        let c = self.claims.remove(i);
        let before: Vec<(i64, String, bool)> = sqlx::query_as(
            "SELECT versi, keadaan, ditahan_sejak IS NOT NULL FROM urutan_efek
             WHERE pesanan_id = $1 AND versi < $2 AND keadaan <> 'terkirim'
               AND NOT (keadaan = 'gagal' AND ditahan_sejak IS NULL)
             ORDER BY versi",
        )
        .bind(&c.pesanan_id)
        .bind(c.versi)
        .fetch_all(self.db)
        .await?;
        let sends = self.effect_sends.entry(c.pesanan_id.clone()).or_default();
        let later: Vec<i64> = sends.iter().copied().filter(|&v| v > c.versi).collect();
        sends.push(c.versi);
        self.stats.effects_sent += 1;
        self.log(|| {
            format!(
                "dispatcher: sends {}'s v{} (outcome {outcome})",
                c.pesanan_id, c.versi
            )
        });
        if !before.is_empty() || !later.is_empty() {
            self.violation(
                "effect-order",
                format!(
                    "effect of {} v{} sent while earlier ones wait {before:?} (versi, state, held) \
                     or after later ones {later:?}",
                    c.pesanan_id, c.versi
                ),
            );
        }
        let result = match outcome {
            0 => Recorded::Sent { code: 200 },
            1 => {
                self.stats.effect_retries += 1;
                Recorded::Retry {
                    code: Some(503),
                    answer: "model: busy".to_owned(),
                    after: Duration::ZERO,
                }
            }
            2 => Recorded::Dead {
                code: Some(422),
                answer: "model: refused".to_owned(),
            },
            _ => {
                // Mid-request: the endpoint got it, the answer is lost.
                self.claims.push(c);
                self.dispatcher_dies();
                return Ok(());
            }
        };
        let settled = record(self.db, c.efek, c.percobaan, &result, OnDead::Hold).await?;
        if settled == Settled::Lost {
            self.violation(
                "effect-order",
                format!(
                    "the dispatcher's claim of {} v{} was lost",
                    c.pesanan_id, c.versi
                ),
            );
        }
        if matches!(result, Recorded::Dead { .. }) {
            self.stats.effects_dead += 1;
            self.log(|| {
                format!(
                    "dispatcher: {} v{} dead-lettered ({settled:?})",
                    c.pesanan_id, c.versi
                )
            });
        }
        Ok(())
    }

    /// The dispatcher dies: its claims' leases run until the clock expires
    /// them ([`Sim::clock`]).
    fn dispatcher_dies(&mut self) {
        if self.claims.is_empty() {
            return;
        }
        self.stats.dispatcher_crashes += 1;
        let lost: Vec<i64> = self.claims.drain(..).map(|c| c.efek).collect();
        self.log(|| format!("dispatcher died holding {} claim(s)", lost.len()));
        self.lost_claims.extend(lost);
    }

    /// The leases of a dead dispatcher's claims expire (time passes).
    async fn expire_lost_claims(&mut self) -> anyhow::Result<bool> {
        if self.lost_claims.is_empty() {
            return Ok(false);
        }
        let ids = std::mem::take(&mut self.lost_claims);
        sqlx::query(
            "WITH e AS (UPDATE urutan_efek SET sewa_sampai = now() - interval '1 second'
                        WHERE efek = ANY($1) AND sewa_sampai > now() RETURNING pesanan_id)
             UPDATE urutan_efek_kepala k SET siap_pada = now() - interval '1 second'
             WHERE k.pesanan_id IN (SELECT pesanan_id FROM e)",
        )
        .bind(&ids)
        .execute(self.db)
        .await?;
        self.log(|| format!("clock: leases of {} lost claim(s) expired", ids.len()));
        Ok(true)
    }

    /// The operator takes the effect holds (`urutan hold list`): replays
    /// the dead-lettered effect (`urutan dlq replay --effects`), or, with
    /// `may_skip` and as the draw says, releases the order's effects
    /// without it (`urutan hold release --effects`, recorded as a skip).
    async fn effect_operator(&mut self, may_skip: bool) -> anyhow::Result<bool> {
        let holds = urutan::effects::hold::holds(self.db, None, 1000).await?;
        let mut acted = false;
        for h in holds {
            if may_skip && self.xrng.chance(40) {
                let skipped = urutan::effects::hold::release(self.db, &h.order).await?;
                for s in &skipped {
                    self.stats.effect_skips += 1;
                    self.effect_skipped.push((h.order.clone(), s.versi));
                    self.skip_log.push((
                        h.order.clone(),
                        Some(s.versi),
                        Some(s.message_id.clone()),
                        "effect".to_owned(),
                    ));
                }
                let n = skipped.len();
                self.log(|| format!("operator: hold release {} --effects: {n} skipped", h.order));
                acted |= n > 0;
            } else if let Some(effect) = h.effect {
                urutan::effects::store::revive_dead(self.db, &[effect]).await?;
                self.stats.effect_replays += 1;
                self.log(|| format!("operator: dlq replay --effects {} ({})", effect, h.order));
                acted = true;
            }
        }
        Ok(acted)
    }

    /// One step of the third stream (gaps, effects, worker deaths), if the
    /// draw picks one this case has; false: none taken.
    async fn extra_step(&mut self) -> anyhow::Result<bool> {
        let x = self.extras;
        let roll = self.xrng.below(100);
        match roll {
            0..=2 if x.worker_deaths => {
                let live = self.live_shards();
                if live.is_empty() {
                    return Ok(false);
                }
                let s = live[self.xrng.below(live.len())];
                self.worker_dies(s);
            }
            3..=6 if x.gaps => {
                let live = self.live_shards();
                if live.is_empty() {
                    return Ok(false);
                }
                let s = live[self.xrng.below(live.len())];
                self.gap_check(s).await?;
            }
            7..=8 if x.gaps => {
                self.gap_operator().await?;
            }
            9..=12 if x.effects => {
                self.dispatch_claim().await?;
            }
            15..=22 if x.effects && !self.claims.is_empty() => {
                let i = self.xrng.below(self.claims.len());
                let outcome = match self.xrng.below(100) {
                    0..=69 => 0,
                    70..=84 => 1,
                    85..=93 => 2,
                    _ => 3,
                };
                self.dispatch_send(i, outcome).await?;
            }
            23 if x.effects => self.dispatcher_dies(),
            24..=25 if x.effects => {
                self.expire_lost_claims().await?;
            }
            26..=27 if x.effects => {
                self.effect_operator(true).await?;
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Drains the effects: the dispatcher sends every effect it may (all
    /// answered 2xx), expired leases included; the operator replays what
    /// is dead-lettered.
    async fn drain_effects(&mut self) -> anyhow::Result<bool> {
        let mut progress = false;
        for _ in 0..1000 {
            while !self.claims.is_empty() {
                self.dispatch_send(0, 0).await?;
                progress = true;
            }
            let expired = self.expire_lost_claims().await?;
            let replayed = self.effect_operator(false).await?;
            if self.dispatch_claim().await? == 0 && !expired && !replayed {
                break;
            }
            progress = true;
        }
        Ok(progress)
    }

    /// Ends the case: everything published, prepared, consumed, released.
    async fn drain(&mut self) -> anyhow::Result<()> {
        while self.prep.is_some() {
            self.prep_step(false).await?;
        }
        for o in 0..self.spec.orders.len() {
            while !self.spec.orders[o].relay
                && self.next_direct[o] < self.spec.orders[o].versions.len()
            {
                self.publish_direct(o);
            }
        }
        let mut idle_rounds = 0;
        for _round in 0..200 {
            let mut progress = false;
            if self.topology_died {
                // The operator runs the failed `urutan topology` again
                // (until then, with no relay running, nothing closes the
                // window it left open, and the pool does not consume the
                // shards it bound: see the report of issue 13).
                self.start_prep(Owner::Topology, self.pool_count);
                while self.prep.is_some() {
                    self.prep_step(false).await?;
                }
                progress = true;
            }
            let pool_live =
                matches!(self.pool, PoolState::Consuming { conn, .. } if conn == self.broker_gen);
            if !pool_live || self.pool_must_reprepare {
                self.start_prep(Owner::Pool, self.pool_count);
                while self.prep.is_some() {
                    self.prep_step(false).await?;
                }
                progress = true;
            }
            // The relay publishes what is left.
            loop {
                match self.relay {
                    RelayState::Down if self.outbox_sent < self.outbox.len() => {
                        self.relay_connect().await?
                    }
                    RelayState::Marking { .. } => self.relay_mark(),
                    RelayState::Ready { .. } if self.outbox_sent < self.outbox.len() => {
                        self.relay_batch(3).await?
                    }
                    _ => break,
                }
                progress = true;
            }
            // Every live shard, in a random interleaving, until empty.
            loop {
                let busy: Vec<usize> = self
                    .live_shards()
                    .into_iter()
                    .filter(|&s| !self.queues[s].items.is_empty())
                    .collect();
                if busy.is_empty() {
                    break;
                }
                let s = busy[self.rng.below(busy.len())];
                self.consume(s, true).await?;
                progress = true;
            }
            // Releases; with faults, time passes (every message set aside
            // is due) and they run again, until nothing was set aside anew.
            for _ in 0..10 {
                for s in self.live_shards() {
                    if self.release(s, false).await? > 0 {
                        progress = true;
                    }
                }
                if self.faults.is_none() || !self.clock(true).await? {
                    break;
                }
                progress = true;
            }
            while self.retire_step().await? {
                progress = true;
            }
            if self.extras.gaps {
                // Each live shard's gap check, once GAP_TIMEOUT has passed;
                // the operator releases what was never published.
                for s in self.live_shards() {
                    self.gap_check(s).await?;
                }
                if self.gap_operator().await? {
                    progress = true;
                }
            }
            if self.extras.effects && self.drain_effects().await? {
                progress = true;
            }
            // The operator deals with every dead letter (replays fix the
            // handler first).
            let mut i = 0;
            while i < self.dlq.len() {
                if self.operator(i, false).await? {
                    progress = true;
                } else {
                    i += 1;
                }
            }
            let parked: i64 = sqlx::query_scalar("SELECT count(*) FROM urutan_parkir")
                .fetch_one(self.db)
                .await?;
            let held: i64 = if self.faults.is_none() && !self.extras.gaps {
                0
            } else {
                sqlx::query_scalar("SELECT count(*) FROM urutan_tahan")
                    .fetch_one(self.db)
                    .await?
            };
            let queued = self.queues.iter().any(|q| !q.items.is_empty());
            let retiring = matches!(
                self.pool,
                PoolState::Consuming {
                    retire: Some(_),
                    ..
                }
            );
            let effects: i64 = if self.extras.effects {
                sqlx::query_scalar(
                    "SELECT count(*) FROM urutan_efek WHERE keadaan = 'menunggu'
                        OR (keadaan = 'gagal' AND ditahan_sejak IS NOT NULL)",
                )
                .fetch_one(self.db)
                .await?
            } else {
                0
            };
            if parked == 0
                && held == 0
                && effects == 0
                && self.dlq.is_empty()
                && !queued
                && !retiring
            {
                return Ok(());
            }
            if progress {
                idle_rounds = 0;
            } else {
                idle_rounds += 1;
                if idle_rounds >= 3 {
                    break;
                }
            }
        }
        Ok(())
    }

    async fn check(&mut self) -> anyhow::Result<()> {
        if !self.legacy {
            self.check_nothing_waits().await?;
        }
        let parked: Vec<(String, i32, i64)> =
            sqlx::query_as("SELECT message_id, shard, epoch FROM urutan_parkir ORDER BY seq")
                .fetch_all(self.db)
                .await?;
        if !parked.is_empty() {
            let shards: Vec<(i32, bool)> =
                sqlx::query_as("SELECT shard, aktif FROM urutan_shard ORDER BY shard")
                    .fetch_all(self.db)
                    .await?;
            self.violation("left-parked", format!(
                "left parked: {parked:?} (message, shard, epoch); shards (shard, aktif): {shards:?}"
            ));
            // Reported; now release them anyway (as if their shard's worker
            // still ran) so that the history check below also says whether
            // the order would have been kept.
            let stranded: HashSet<i32> = parked.iter().map(|p| p.1).collect();
            let mut stranded: Vec<i32> = stranded.into_iter().collect();
            stranded.sort_unstable();
            for _ in 0..20 {
                for &s in &stranded {
                    self.release(s as usize, false).await?;
                }
            }
        }
        let leftover: Vec<String> = self
            .queues
            .iter()
            .enumerate()
            .filter(|(_, q)| q.items.iter().any(|i| matches!(i, Item::Msg { .. })))
            .map(|(s, q)| format!("shard {s}: {} items", q.items.len()))
            .collect();
        if !leftover.is_empty() {
            self.violation("unconsumed", format!("never consumed: {leftover:?}"));
        }
        let rows: Vec<(String, i64)> =
            sqlx::query_as("SELECT pesanan_id, versi FROM pesanan_riwayat ORDER BY seq")
                .fetch_all(self.db)
                .await?;
        let mut history: HashMap<String, Vec<i64>> = HashMap::new();
        for (id, versi) in rows {
            history.entry(id).or_default().push(versi);
        }
        for (i, o) in self.spec.orders.clone().into_iter().enumerate() {
            let got = history.get(&o.id).cloned().unwrap_or_default();
            // Every published version except those the operator skipped.
            let expected: Vec<i64> = o
                .versions
                .iter()
                .copied()
                .filter(|&v| !self.skipped.iter().any(|s| s.0 == i && s.1 == v))
                .collect();
            if got != expected {
                // Only missing versions (still parked, say), or out of order?
                let in_order =
                    got.windows(2).all(|w| w[0] < w[1]) && got.iter().all(|v| expected.contains(v));
                let kind = if in_order {
                    "history-missing"
                } else {
                    "history"
                };
                let skipped: Vec<i64> = o
                    .versions
                    .iter()
                    .copied()
                    .filter(|v| !expected.contains(v))
                    .collect();
                self.violation(
                    kind,
                    format!(
                        "history of {} is {got:?}, published {:?}, skipped {skipped:?}",
                        o.id, o.versions
                    ),
                );
            }
        }
        if !self.legacy {
            self.check_handler_and_holds(&history).await?;
        }
        Ok(())
    }

    /// Nothing waits: every order's first version not applied (and not
    /// skipped by the operator) is a violation `stuck` when the version
    /// before it is applied (or it is the first): it waits for nothing the
    /// model will still do. Says where it is: queued (behind a worker that
    /// died?), parked (set aside, waiting for a gap), held, dead-lettered,
    /// or nowhere.
    async fn check_nothing_waits(&mut self) -> anyhow::Result<()> {
        let rows: Vec<(String, i64)> =
            sqlx::query_as("SELECT pesanan_id, versi FROM pesanan_riwayat ORDER BY seq")
                .fetch_all(self.db)
                .await?;
        let applied: HashSet<(String, i64)> = rows.into_iter().collect();
        for (i, o) in self.spec.orders.clone().into_iter().enumerate() {
            let expected: Vec<i64> = o
                .versions
                .iter()
                .copied()
                .filter(|&v| !self.skipped.iter().any(|s| s.0 == i && s.1 == v))
                .collect();
            let Some(k) = expected
                .iter()
                .position(|&v| !applied.contains(&(o.id.clone(), v)))
            else {
                continue;
            };
            let versi = expected[k];
            let before = k.checked_sub(1).map(|p| expected[p]);
            let whereabouts = self.whereabouts(i, versi).await?;
            self.violation(
                "stuck",
                format!(
                    "{} v{versi} is not applied, the version before it ({before:?}) is: {whereabouts}",
                    o.id
                ),
            );
        }
        Ok(())
    }

    /// Where version `versi` of order `order` is now.
    async fn whereabouts(&self, order: usize, versi: i64) -> anyhow::Result<String> {
        let id = &self.spec.orders[order].id;
        let mut found = Vec::new();
        let live = self.live_shards();
        for (s, q) in self.queues.iter().enumerate() {
            for (k, item) in q.items.iter().enumerate() {
                if let Item::Msg {
                    order: o,
                    versi: v,
                    mid,
                } = item
                    && *o == order
                    && *v == versi
                {
                    found.push(format!(
                        "{mid} queued on shard {s} at {k} (worker stranded: {}, consumed: {}, stage {:?})",
                        q.stranded,
                        live.contains(&s),
                        q.stage
                    ));
                }
            }
        }
        let parked: Vec<(i32, bool, i32, Option<String>)> = sqlx::query_as(
            "SELECT shard, coalesce(jatuh_tempo > now(), false), percobaan, galat FROM urutan_parkir
             WHERE pesanan_id = $1 AND versi = $2",
        )
        .bind(id)
        .bind(versi)
        .fetch_all(self.db)
        .await?;
        for (shard, not_due, attempts, error) in parked {
            found.push(format!(
                "parked on shard {shard} (not due yet: {not_due}, attempts {attempts}, {error:?})"
            ));
        }
        let held: Vec<(String, Option<i64>, Option<String>)> = sqlx::query_as(
            "SELECT alasan, versi, message_id FROM urutan_tahan WHERE pesanan_id = $1",
        )
        .bind(id)
        .fetch_all(self.db)
        .await?;
        for (reason, v, mid) in held {
            found.push(format!("its order held ({reason}, v{v:?}, {mid:?})"));
        }
        for d in self
            .dlq
            .iter()
            .filter(|d| d.order == order && d.versi == versi)
        {
            found.push(format!("{} dead-lettered", d.mid));
        }
        if !self.publish_order[order][..self.next_direct[order]].contains(&versi)
            && !self.outbox[..self.outbox_sent].contains(&(order, versi))
        {
            found.push("never published".to_owned());
        }
        Ok(if found.is_empty() {
            "nowhere".to_owned()
        } else {
            found.join("; ")
        })
    }

    /// The effects: per order, the first send of each effect follows the
    /// order's history (every applied version's effect attempted, in
    /// `versi` order, none after a later one); each ended sent, or
    /// dead-lettered and released by the operator; none waits.
    async fn check_effects(&mut self, history: &HashMap<String, Vec<i64>>) -> anyhow::Result<()> {
        for o in self.spec.orders.clone() {
            let applied = history.get(&o.id).cloned().unwrap_or_default();
            let sends = self.effect_sends.get(&o.id).cloned().unwrap_or_default();
            let mut firsts: Vec<i64> = Vec::new();
            for v in sends {
                if !firsts.contains(&v) {
                    firsts.push(v);
                }
            }
            if firsts != applied {
                self.violation(
                    "effect",
                    format!(
                        "{}'s effects were first sent as {firsts:?}, history {applied:?}",
                        o.id
                    ),
                );
            }
        }
        let waiting: Vec<(String, i64, String, bool)> = sqlx::query_as(
            "SELECT pesanan_id, versi, keadaan, ditahan_sejak IS NOT NULL FROM urutan_efek
             WHERE keadaan <> 'terkirim' ORDER BY pesanan_id, versi",
        )
        .fetch_all(self.db)
        .await?;
        let unexplained: Vec<(String, i64, String, bool)> = waiting
            .into_iter()
            .filter(|(id, v, keadaan, held)| {
                !(keadaan == "gagal"
                    && !held
                    && self.effect_skipped.iter().any(|s| s.0 == *id && s.1 == *v))
            })
            .collect();
        if !unexplained.is_empty() {
            self.violation(
                "effect-waiting",
                format!("effects left (order, versi, state, held): {unexplained:?}"),
            );
        }
        Ok(())
    }

    /// The handler's own table is the history (one row per applied
    /// version, each with the version stored before it); the skips are the
    /// operator's; nothing is left held or dead-lettered.
    async fn check_handler_and_holds(
        &mut self,
        history: &HashMap<String, Vec<i64>>,
    ) -> anyhow::Result<()> {
        let rows: Vec<(String, i64, Option<i64>)> = sqlx::query_as(
            "SELECT pesanan_id, versi, previous_versi FROM model_applied ORDER BY seq",
        )
        .fetch_all(self.db)
        .await?;
        let mut calls: HashMap<String, Vec<(i64, Option<i64>)>> = HashMap::new();
        for (id, versi, previous) in rows {
            calls.entry(id).or_default().push((versi, previous));
        }
        for o in self.spec.orders.clone() {
            let got = calls.remove(&o.id).unwrap_or_default();
            let applied = history.get(&o.id).cloned().unwrap_or_default();
            let expected: Vec<(i64, Option<i64>)> = applied
                .iter()
                .enumerate()
                .map(|(k, &v)| (v, k.checked_sub(1).map(|p| applied[p])))
                .collect();
            if got != expected {
                self.violation(
                    "handler",
                    format!(
                        "the handler saw {} as {got:?} (versi, previous_versi), history {applied:?}",
                        o.id
                    ),
                );
            }
        }
        let skips: Vec<(String, Option<i64>, Option<String>, String)> = sqlx::query_as(
            "SELECT pesanan_id, versi, message_id, alasan FROM urutan_lewati ORDER BY seq",
        )
        .fetch_all(self.db)
        .await?;
        let expected = self.skip_log.clone();
        if skips != expected {
            self.violation(
                "skipped",
                format!("urutan_lewati holds {skips:?}, the operator skipped {expected:?}"),
            );
        }
        let held: Vec<(String, String, Option<String>)> = sqlx::query_as(
            "SELECT pesanan_id, alasan, message_id FROM urutan_tahan ORDER BY pesanan_id",
        )
        .fetch_all(self.db)
        .await?;
        if self.extras.effects {
            self.check_effects(history).await?;
        }
        if !held.is_empty() || !self.dlq.is_empty() {
            let dead: Vec<&String> = self.dlq.iter().map(|d| &d.mid).collect();
            self.violation(
                "left-held",
                format!(
                    "left held: {held:?} (order, reason, message); dead letters left: {dead:?}"
                ),
            );
        }
        Ok(())
    }
}

/// The kinds of violation, as reported.
pub const KINDS: [&str; 15] = [
    "history",
    "history-missing",
    "stale",
    "redelivery",
    "first-delivery",
    "lost",
    "left-parked",
    "unconsumed",
    "handler",
    "skipped",
    "left-held",
    "stuck",
    "effect-order",
    "effect",
    "effect-waiting",
];

/// What one case found.
#[derive(Debug)]
pub struct CaseResult {
    pub seed: u64,
    pub violations: Vec<String>,
    pub trace: Vec<String>,
    pub stats: Stats,
}

/// Runs one case on `model` (emptied first); a shard's worker that dies
/// does as `worker_death` says.
pub async fn run_case(
    model: &ModelDb,
    seed: u64,
    legacy: bool,
    mode: Mode,
    keep_trace: bool,
) -> anyhow::Result<CaseResult> {
    let worker_death = mode.worker_death;
    reset(&model.pool, legacy).await?;
    let mut rng = Rng::new(seed);
    let spec = draw_spec(&mut rng);
    let mut frng = Rng::new(seed ^ FAULT_SALT);
    let faults = if legacy {
        None
    } else {
        draw_faults(&mut frng, &spec)
    };
    let mut xrng = Rng::new(seed ^ EXTRA_SALT);
    let extras = if legacy {
        Extras::default()
    } else {
        draw_extras(&mut xrng)
    };
    // GAP_POLICY=wait: the worker's URL sets `urutan.gap`.
    let db = match (&model.gap_pool, extras.gaps) {
        (Some(gap_pool), true) => gap_pool,
        _ => &model.pool,
    };
    let publish_order: Vec<Vec<i64>> = spec
        .orders
        .iter()
        .map(|o| publish_order(&mut xrng, &o.versions, extras.gaps))
        .collect();
    if extras.effects {
        sqlx::query(
            "WITH t AS (INSERT INTO urutan_efek_tujuan (url) VALUES ($1) RETURNING tujuan)
             INSERT INTO urutan_efek_rute (status, tujuan) SELECT '*', tujuan FROM t",
        )
        .bind(EFFECT_URL)
        .execute(db)
        .await?;
    }
    if let Some(f) = &faults {
        for &(o, versi, fault) in &f.plan {
            let (cara, remaining) = match fault {
                Fault::Retry(n) => ("retry", n as i32),
                Fault::Refuse => ("refuse", 1),
            };
            sqlx::query("INSERT INTO model_fail VALUES ($1, $2, $3, $4)")
                .bind(&spec.orders[o].id)
                .bind(versi)
                .bind(cara)
                .bind(remaining)
                .execute(db)
                .await?;
        }
    }
    let policy = RetryPolicy {
        min: BACKOFF,
        max: BACKOFF,
        max_attempts: faults.as_ref().map_or(20, |f| f.max_attempts),
        hold_refused: true,
        gap_timeout: extras.gaps.then_some(GAP_TIMEOUT),
    };
    let mut outbox_rows: Vec<(usize, i64)> = Vec::new();
    {
        // The application writes the relay orders' rows in some interleaving.
        let mut next: Vec<usize> = vec![0; spec.orders.len()];
        loop {
            let left: Vec<usize> = (0..spec.orders.len())
                .filter(|&o| spec.orders[o].relay && next[o] < spec.orders[o].versions.len())
                .collect();
            if left.is_empty() {
                break;
            }
            let o = left[rng.below(left.len())];
            outbox_rows.push((o, publish_order[o][next[o]]));
            next[o] += 1;
        }
    }
    let shards = spec.shards;
    let mut sim = Sim {
        db,
        legacy,
        rng,
        queues: Vec::new(),
        ring: Vec::new(),
        broker_gen: 0,
        sentinel: false,
        pool: PoolState::Down,
        pool_count: shards,
        pool_must_reprepare: false,
        prep: None,
        topology_died: false,
        paused: false,
        relay: RelayState::Down,
        outbox: outbox_rows,
        outbox_sent: 0,
        next_direct: vec![0; spec.orders.len()],
        changes_left: spec.changes.clone(),
        ring_rec: RingRecord {
            count: shards,
            epoch: 0,
            done: true,
        },
        spec,
        committed: HashSet::new(),
        mids: HashMap::new(),
        frng,
        stats: Stats {
            fault_cases: u64::from(faults.is_some()),
            gap_cases: u64::from(extras.gaps),
            effect_cases: u64::from(extras.effects),
            ..Stats::default()
        },
        faults,
        policy,
        dlq: Vec::new(),
        skipped: Vec::new(),
        skip_log: Vec::new(),
        xrng,
        extras,
        worker_death,
        open_gap_defects: mode.open_gap_defects,
        publish_order,
        gap_skipped: Vec::new(),
        claims: Vec::new(),
        lost_claims: Vec::new(),
        effect_sends: HashMap::new(),
        effect_skipped: Vec::new(),
        violations: Vec::new(),
        trace: Vec::new(),
        keep_trace,
    };
    if keep_trace {
        let spec = format!("{:?}", sim.spec);
        sim.log(|| format!("seed {seed:#x} legacy {legacy}: {spec}"));
        let faults = format!("{:?}", sim.faults);
        sim.log(|| format!("faults: {faults}"));
        let extras = format!("{:?} (worker death: {worker_death:?})", sim.extras);
        let order = format!("{:?}", sim.publish_order);
        sim.log(|| format!("extras: {extras}; published in the order {order}"));
    }
    // The first start: the topology is declared (no window: nothing was
    // there before), the pool consumes.
    sim.start_prep(Owner::Pool, shards);
    while sim.prep.is_some() {
        sim.prep_step(false).await?;
    }
    let mut steps = 0;
    while steps < 2000 && (!sim.all_published() || !sim.changes_left.is_empty() || steps < 150) {
        sim.step().await?;
        steps += 1;
    }
    sim.drain().await?;
    sim.check().await?;
    Ok(CaseResult {
        seed,
        violations: sim.violations,
        trace: sim.trace,
        stats: sim.stats,
    })
}

// ---------------------------------------------------------------------------
// Databases.

/// Tables a case writes, and their serial columns (restarted so that a
/// seed replays with the same epoch numbers). DELETE, not TRUNCATE: a
/// TRUNCATE of these small tables costs ~150 ms here, a DELETE ~1 ms.
const TABLES: [(&str, &str); 9] = [
    ("pesanan", ""),
    ("pesanan_riwayat", "seq"),
    ("pesan_diproses", ""),
    ("outbox", "id"),
    ("urutan_epoch", "epoch"),
    ("urutan_shard", ""),
    ("urutan_parkir", "seq"),
    ("urutan_ring", "versi"),
    ("urutan_jendela", "jendela"),
];

/// Tables of the holds, the effects and the model's handler (not `legacy`).
const FAULT_TABLES: [(&str, &str); 8] = [
    ("urutan_tahan", ""),
    ("urutan_lewati", "seq"),
    ("model_fail", ""),
    ("model_applied", "seq"),
    ("urutan_efek", "efek"),
    ("urutan_efek_kepala", ""),
    ("urutan_efek_rute", ""),
    ("urutan_efek_tujuan", "tujuan"),
];

async fn reset(db: &PgPool, legacy: bool) -> anyhow::Result<()> {
    let mut sql = String::from("BEGIN;");
    let faults = if legacy { &[][..] } else { &FAULT_TABLES[..] };
    for &(table, serial) in TABLES.iter().chain(faults) {
        let table = match table {
            "urutan_jendela" if legacy => "urutan_ring_berubah",
            t => t,
        };
        let _ = write!(sql, "DELETE FROM {table};");
        // The flag table of migration 0005 has no serial column.
        let serial = if table == "urutan_ring_berubah" {
            ""
        } else {
            serial
        };
        if !serial.is_empty() {
            let _ = write!(
                sql,
                "SELECT setval(pg_get_serial_sequence('{table}', '{serial}'), 1, false);"
            );
        }
    }
    sql.push_str("COMMIT;");
    tokio::time::timeout(
        STATEMENT_LIMIT,
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(db),
    )
    .await??;
    Ok(())
}

/// The migrations before the fix (0001-0006), for `legacy`.
const LEGACY_MIGRATIONS: [&str; 6] = [
    include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../migrations/20261129000001_kontrak.sql"
    )),
    include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../migrations/20261129000002_epoch.sql"
    )),
    include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../migrations/20261129000003_epoch_order.sql"
    )),
    include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../migrations/20261129000004_batch.sql"
    )),
    include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../migrations/20261130000005_ring.sql"
    )),
    include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../migrations/20261130000006_batch_set.sql"
    )),
];

/// A database of the run's own, dropped (FORCE) when this is dropped.
pub struct ModelDb {
    pub name: String,
    pub pool: PgPool,
    /// The same database through a URL with `GAP_POLICY=wait` (not
    /// `legacy`).
    pub gap_pool: Option<PgPool>,
}

impl ModelDb {
    pub async fn create(name: String, legacy: bool) -> anyhow::Result<Self> {
        let url: SecretUrl = format!("{PG_BASE}/{name}")
            .parse()
            .map_err(|e: String| anyhow::anyhow!(e))?;
        // Durability is no concern of the model: commits need not wait for
        // the disk (this database only; ~4 ms less per statement here).
        store::ensure_database(&url).await?;
        let admin = store::connect(
            &format!("{PG_BASE}/postgres")
                .parse()
                .map_err(|e: String| anyhow::anyhow!(e))?,
            1,
        )
        .await?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER DATABASE \"{name}\" SET synchronous_commit = off"
        )))
        .execute(&admin)
        .await?;
        admin.close().await;
        let (url, gap_url) = if legacy {
            let pool = store::connect(&url, 2).await?;
            for sql in LEGACY_MIGRATIONS {
                sqlx::raw_sql(sql).execute(&pool).await?;
            }
            pool.close().await;
            (url, None)
        } else {
            // The worker's URL with HANDLER_FUNCTION set.
            let mut settings = Settings {
                database_url: url,
                handler_function: Some("model_handler".to_owned()),
                ..Settings::default()
            };
            let url = settings.schema_url();
            let pool = store::prepare(&url, 2).await?;
            sqlx::raw_sql(MODEL_HANDLER).execute(&pool).await?;
            pool.close().await;
            settings.gap_policy = urutan::config::GapPolicy::Wait;
            (url, Some(settings.schema_url()))
        };
        // The model's own pool: `store::connect` pings every connection
        // given back (against links that go silent, which the model has
        // none of): a second round trip for each of the model's statements.
        let model_pool = |url: SecretUrl| async move {
            let options: sqlx::postgres::PgConnectOptions = url.expose().parse()?;
            anyhow::Ok(
                sqlx::postgres::PgPoolOptions::new()
                    .max_connections(2)
                    .acquire_timeout(STATEMENT_LIMIT)
                    .connect_with(options.application_name("urutan"))
                    .await?,
            )
        };
        let pool = model_pool(url).await?;
        let gap_pool = match gap_url {
            Some(url) => Some(model_pool(url).await?),
            None => None,
        };
        Ok(Self {
            name,
            pool,
            gap_pool,
        })
    }
}

impl Drop for ModelDb {
    fn drop(&mut self) {
        crate::scratch::drop_database(PG_BASE, &self.name);
    }
}

// ---------------------------------------------------------------------------
// Runs.

#[derive(Debug, Clone)]
pub struct RunConfig {
    pub cases: u64,
    pub base: u64,
    /// Replay this one seed (with its trace) instead.
    pub seed: Option<u64>,
    pub workers: usize,
    pub legacy: bool,
    /// What dying shard workers and gap timeouts do.
    pub mode: Mode,
    /// Stop after this many failing cases (0: never).
    pub max_failures: usize,
    /// Give up (report what ran) after this long.
    pub time_limit: Duration,
}

#[derive(Debug)]
pub struct Summary {
    pub ran: u64,
    pub failures: Vec<CaseResult>,
    pub elapsed: Duration,
    pub stats: Stats,
}

impl Summary {
    pub fn report(&self, legacy: bool) -> String {
        let s = &self.stats;
        let mut out = format!(
            "interleave ({}): {} cases in {:.1} s, {} failing; {} messages, {} handled \
             items, {} parked, {} released, {} redeliveries (all duplicate unless listed), \
             {} broker restarts ({} remapped), {} grows, {} shrinks, {} shards retired, {} \
             prepares died, {} pool crashes, {} windows, {} epochs; {} cases with handler \
             faults: {} retries asked, {} set aside, {} set aside again, {} refused, {} \
             replayed, {} skipped, {} releases died before commit; {} cases with \
             GAP_POLICY=wait: {} gap holds, {} released; {} cases with effects: {} sent, {} \
             failed attempts, {} dead-lettered, {} replayed, {} skipped, {} dispatchers died; \
             {} shard workers died",
            if legacy { "legacy protocol" } else { "windows" },
            self.ran,
            self.elapsed.as_secs_f64(),
            self.failures.len(),
            s.messages,
            s.steps,
            s.parked,
            s.released,
            s.duplicates,
            s.restarts,
            s.remaps,
            s.grows,
            s.shrinks,
            s.retired,
            s.prep_deaths,
            s.pool_crashes,
            s.windows,
            s.epochs,
            s.fault_cases,
            s.handler_retries,
            s.set_aside,
            s.retried,
            s.refused,
            s.replays,
            s.skips,
            s.release_crashes,
            s.gap_cases,
            s.gap_holds,
            s.gap_releases,
            s.effect_cases,
            s.effects_sent,
            s.effect_retries,
            s.effects_dead,
            s.effect_replays,
            s.effect_skips,
            s.dispatcher_crashes,
            s.worker_deaths
        );
        for kind in KINDS {
            let n = self
                .failures
                .iter()
                .filter(|f| {
                    f.violations
                        .iter()
                        .any(|v| v.starts_with(&format!("{kind}:")))
                })
                .count();
            if n > 0 {
                let _ = write!(out, "\n  cases with a {kind} violation: {n}");
            }
        }
        for f in self.failures.iter().take(10) {
            let _ = write!(
                out,
                "\n  seed {:#x} (replay: URUTAN_INTERLEAVE_SEED={:#x}): {}",
                f.seed,
                f.seed,
                f.violations.join("; ")
            );
        }
        out
    }
}

pub fn parse_seed(s: &str) -> anyhow::Result<u64> {
    let s = s.trim();
    Ok(match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16)?,
        None => s.parse()?,
    })
}

pub async fn run(config: RunConfig) -> anyhow::Result<Summary> {
    let started = Instant::now();
    let tag = format!(
        "urutan_test_interleave_{}_{:08x}",
        std::process::id(),
        Rng::new(started.elapsed().as_nanos() as u64 ^ u64::from(std::process::id())).next_u64()
            as u32
    );
    if let Some(seed) = config.seed {
        let db = ModelDb::create(format!("{tag}_0"), config.legacy).await?;
        let result = run_case(&db, seed, config.legacy, config.mode, true).await?;
        let stats = result.stats.clone();
        let failures = if result.violations.is_empty() {
            Vec::new()
        } else {
            vec![result]
        };
        return Ok(Summary {
            ran: 1,
            stats,
            failures,
            elapsed: started.elapsed(),
        });
    }
    let next = Arc::new(AtomicU64::new(0));
    let failures_seen = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for w in 0..config.workers.max(1) {
        let db = ModelDb::create(format!("{tag}_{w}"), config.legacy).await?;
        let (next, failures_seen, config) = (next.clone(), failures_seen.clone(), config.clone());
        tasks.push(tokio::spawn(async move {
            let mut stats = Stats::default();
            let mut failures = Vec::new();
            let mut ran = 0u64;
            loop {
                if started.elapsed() > config.time_limit
                    || (config.max_failures > 0
                        && failures_seen.load(Ordering::Relaxed) >= config.max_failures as u64)
                {
                    break;
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= config.cases {
                    break;
                }
                let seed = case_seed(config.base, i);
                let result = run_case(&db, seed, config.legacy, config.mode, false)
                    .await
                    .with_context(|| format!("case seed {seed:#x}"))?;
                ran += 1;
                stats.add(&result.stats);
                if !result.violations.is_empty() {
                    failures_seen.fetch_add(1, Ordering::Relaxed);
                    failures.push(result);
                }
            }
            drop(db);
            anyhow::Ok((ran, stats, failures))
        }));
    }
    let mut summary = Summary {
        ran: 0,
        failures: Vec::new(),
        elapsed: Duration::ZERO,
        stats: Stats::default(),
    };
    for t in tasks {
        let (ran, stats, failures) = t.await??;
        summary.ran += ran;
        summary.stats.add(&stats);
        summary.failures.extend(failures);
    }
    summary.failures.sort_by_key(|f| f.seed);
    summary.elapsed = started.elapsed();
    if summary.ran < config.cases && config.max_failures == 0 {
        bail!(
            "only {} of {} cases ran within {:?}",
            summary.ran,
            config.cases,
            config.time_limit
        );
    }
    Ok(summary)
}

pub fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| parse_seed(&v).ok())
}
