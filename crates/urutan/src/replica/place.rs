//! Which live replica is active on which shard: a pure function of the
//! live replicas and the placement in force, so that every replica computes
//! the same and a move is decided once, in one transaction (`member`).
//!
//! Invariants of [`rebalance`] (property-tested below):
//! - balance: with R live replicas and N shards, each replica owns ⌊N/R⌋
//!   or ⌈N/R⌉ shards, and every shard has exactly one live owner;
//! - determinism: the order the replicas are listed in changes nothing;
//! - stickiness: a shard whose owner is live and within its share stays;
//!   from a balanced placement, a replica that joins takes shards only from
//!   the others' surplus (nothing moves between two old replicas), and the
//!   shards of one that leaves go to the others without moving any other.
//!
//! Which shards go where is rendezvous (highest random weight) hashing of
//! each shard over the replicas, bounded by their share: a free shard goes
//! to the highest-weight replica still under its share, and a replica over
//! its share gives up its lowest-weight shards. The first placement (every
//! shard free) is therefore bounded-load rendezvous hashing.

use std::cmp::Reverse;
use std::collections::BTreeMap;

/// Why a shard changed replica: the `reason` label of
/// `urutan_shard_moves_total`, stored with the placement (`alasan`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// Given to a replica that just joined (or to the first replicas, for
    /// shards nobody owned yet).
    Joined,
    /// Its owner stopped gracefully and gave it up.
    Left,
    /// Its owner's lease expired (killed, or cut off from the database or
    /// the broker).
    Lost,
    /// Moved between two live replicas to even out the shares.
    Rebalanced,
}

impl Reason {
    pub const ALL: [Reason; 4] = [
        Reason::Joined,
        Reason::Left,
        Reason::Lost,
        Reason::Rebalanced,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Self::Joined => "joined",
            Self::Left => "left",
            Self::Lost => "lost",
            Self::Rebalanced => "rebalanced",
        }
    }

    pub fn parse(label: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.label() == label)
    }
}

/// The rendezvous weight of `shard` on `replica`: FNV-1a over the name and
/// the shard number, then a 64-bit finaliser (splitmix64). Fixed here, not
/// `std`'s hasher: replicas of two builds (a rolling deploy) must agree.
pub fn weight(replica: &str, shard: u16) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in replica.bytes().chain(shard.to_be_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// The placement of shards `0..shards` over `live` (names, in any order,
/// duplicates ignored), starting from `current` (owner of shard `i` at index
/// `i`; a missing entry, `None`, or a name not in `live` is a free shard).
/// Every shard gets a live owner, `None` only when no replica is live.
pub fn rebalance(shards: u16, live: &[String], current: &[Option<String>]) -> Vec<Option<String>> {
    let mut names: Vec<&str> = live.iter().map(String::as_str).collect();
    names.sort_unstable();
    names.dedup();
    let n = usize::from(shards);
    if names.is_empty() {
        return vec![None; n];
    }
    // What each live replica owns now.
    let mut owned: BTreeMap<&str, Vec<u16>> = names.iter().map(|&r| (r, Vec::new())).collect();
    for shard in 0..shards {
        if let Some(Some(owner)) = current.get(usize::from(shard))
            && let Some(list) = owned.get_mut(owner.as_str())
        {
            list.push(shard);
        }
    }
    // Shares: ⌊N/R⌋ each, one more for the N mod R replicas owning the most
    // now (so that a balanced placement keeps its larger shares in place).
    let (base, extra) = (n / names.len(), n % names.len());
    let mut by_size = names.clone();
    by_size.sort_by_key(|&r| (Reverse(owned[r].len()), r));
    let share: BTreeMap<&str, usize> = by_size
        .iter()
        .enumerate()
        .map(|(i, &r)| (r, base + usize::from(i < extra)))
        .collect();
    // Each keeps its highest-weight shards up to its share.
    let mut placed: Vec<Option<&str>> = vec![None; n];
    let mut count: BTreeMap<&str, usize> = BTreeMap::new();
    for (&replica, list) in &owned {
        let mut list = list.clone();
        list.sort_by_key(|&s| (Reverse(weight(replica, s)), s));
        list.truncate(share[replica]);
        count.insert(replica, list.len());
        for s in list {
            placed[usize::from(s)] = Some(replica);
        }
    }
    // Free shards, in order, to the highest-weight replica under its share.
    for shard in 0..shards {
        if placed[usize::from(shard)].is_some() {
            continue;
        }
        let to = names
            .iter()
            .copied()
            .filter(|r| count[r] < share[r])
            .max_by_key(|&r| (weight(r, shard), Reverse(r)));
        if let Some(to) = to {
            *count.entry(to).or_default() += 1;
            placed[usize::from(shard)] = Some(to);
        }
    }
    placed
        .into_iter()
        .map(|owner| owner.map(str::to_owned))
        .collect()
}

/// Why `shard` moved from `from` to `to`: `left` names the replica that
/// is leaving gracefully in this rebalance (if any), `joined` whether `to`
/// joined in it. `None` when it did not move.
pub fn reason(
    from: Option<&str>,
    to: &str,
    live: &[String],
    left: Option<&str>,
    joined: bool,
) -> Option<Reason> {
    match from {
        Some(f) if f == to => None,
        Some(f) if Some(f) == left => Some(Reason::Left),
        Some(f) if !live.iter().any(|r| r == f) => Some(Reason::Lost),
        Some(_) if joined => Some(Reason::Joined),
        Some(_) => Some(Reason::Rebalanced),
        None => Some(Reason::Joined),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("urutan-{i}")).collect()
    }

    fn counts(placement: &[Option<String>]) -> BTreeMap<String, usize> {
        let mut c = BTreeMap::new();
        for owner in placement.iter().flatten() {
            *c.entry(owner.clone()).or_default() += 1;
        }
        c
    }

    fn assert_balanced(shards: u16, live: &[String], placement: &[Option<String>]) {
        let n = usize::from(shards);
        let r = live.len();
        assert_eq!(placement.len(), n);
        assert!(
            placement
                .iter()
                .all(|o| o.as_ref().is_some_and(|o| live.contains(o))),
            "a shard without a live owner: {placement:?}"
        );
        let c = counts(placement);
        for name in live {
            let k = c.get(name).copied().unwrap_or(0);
            assert!(
                k == n / r || k == n.div_ceil(r),
                "{name} owns {k} of {n} shards over {r} replicas: {c:?}"
            );
        }
    }

    #[test]
    fn twelve_shards_over_three_four_and_five() {
        for r in [3, 4, 5] {
            let live = names(r);
            let p = rebalance(12, &live, &[]);
            assert_balanced(12, &live, &p);
        }
        let live = names(13);
        let p = rebalance(12, &live, &[]);
        assert_eq!(counts(&p).len(), 12, "one shard each, one standby");
    }

    #[test]
    fn nobody_live_owns_nothing() {
        assert_eq!(rebalance(3, &[], &[]), vec![None, None, None]);
    }

    #[test]
    fn the_weight_is_fixed_across_builds() {
        // A rolling deploy mixes builds: the weight must never change.
        assert_eq!(weight("urutan-0", 0), 0xe7f6_d1ca_a5ed_dd2d);
        assert_ne!(weight("urutan-0", 1), weight("urutan-0", 0));
    }

    #[test]
    fn reasons() {
        let live = names(2);
        let (a, b) = (live[0].as_str(), live[1].as_str());
        assert_eq!(reason(Some(a), a, &live, None, false), None);
        assert_eq!(reason(None, a, &live, None, false), Some(Reason::Joined));
        assert_eq!(
            reason(Some("gone"), a, &live, Some("gone"), false),
            Some(Reason::Left)
        );
        assert_eq!(
            reason(Some("gone"), a, &live, None, false),
            Some(Reason::Lost)
        );
        assert_eq!(reason(Some(b), a, &live, None, true), Some(Reason::Joined));
        assert_eq!(
            reason(Some(b), a, &live, None, false),
            Some(Reason::Rebalanced)
        );
        for r in Reason::ALL {
            assert_eq!(Reason::parse(r.label()), Some(r));
        }
    }

    /// Shards, live replicas, and an arbitrary placement in force (owners
    /// live, dead or none).
    fn setting() -> impl Strategy<Value = (u16, Vec<String>, Vec<Option<String>>)> {
        (1u16..=40, 1usize..=9).prop_flat_map(|(shards, r)| {
            let owner = prop_oneof![
                Just(None),
                (0..r + 2).prop_map(|i| Some(format!("urutan-{i}"))),
            ];
            (
                Just(shards),
                Just(names(r)),
                proptest::collection::vec(owner, usize::from(shards)),
            )
        })
    }

    proptest! {
        #[test]
        fn always_balanced((shards, live, current) in setting()) {
            let p = rebalance(shards, &live, &current);
            assert_balanced(shards, &live, &p);
        }

        #[test]
        fn the_listing_order_changes_nothing((shards, live, current) in setting(), seed in any::<u64>()) {
            let mut shuffled = live.clone();
            let len = shuffled.len();
            for i in 0..len {
                shuffled.swap(i, (seed as usize).wrapping_add(i * 7) % len);
            }
            shuffled.push(live[0].clone());
            prop_assert_eq!(rebalance(shards, &live, &current), rebalance(shards, &shuffled, &current));
        }

        #[test]
        fn a_balanced_placement_stays((shards, live, current) in setting()) {
            let p = rebalance(shards, &live, &current);
            prop_assert_eq!(rebalance(shards, &live, &p), p);
        }

        #[test]
        fn a_joining_replica_takes_only_from_the_others((shards, live, current) in setting()) {
            let before = rebalance(shards, &live, &current);
            let newcomer = "urutan-new".to_owned();
            let mut more = live.clone();
            more.push(newcomer.clone());
            let after = rebalance(shards, &more, &before);
            assert_balanced(shards, &more, &after);
            for (b, a) in before.iter().zip(&after) {
                prop_assert!(b == a || a.as_ref() == Some(&newcomer),
                    "a shard moved from {b:?} to {a:?}, not to the newcomer");
            }
        }

        #[test]
        fn a_leaving_replica_moves_only_its_shards((shards, live, current) in setting(), which in any::<usize>()) {
            prop_assume!(live.len() > 1);
            let before = rebalance(shards, &live, &current);
            let gone = live[which % live.len()].clone();
            let fewer: Vec<String> = live.iter().filter(|r| **r != gone).cloned().collect();
            let after = rebalance(shards, &fewer, &before);
            assert_balanced(shards, &fewer, &after);
            for (b, a) in before.iter().zip(&after) {
                prop_assert!(b == a || b.as_ref() == Some(&gone),
                    "a shard moved from {b:?} to {a:?}, not from the one that left");
            }
        }
    }
}
