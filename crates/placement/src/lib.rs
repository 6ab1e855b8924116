//! Where every byte of Tessera lives, as pure functions.
//!
//! Files are cut into fixed-size stripes; a stripe key (file id, stripe index) hashes with
//! xxh3-64 to one of `P` partitions; an epoch-versioned [`PartitionTable`] maps each partition to
//! an ordered replica list of node ids. Metadata uses the same hash: an inode and the entries of a
//! directory live in the partition of [`meta_partition`] of their id, so a directory's inode and
//! its entries are always on the same node (rmdir-if-empty and create-in-dir are single-node
//! atomic operations).
//!
//! Nothing here does I/O, so it is tested exhaustively with property tests.

mod assign;
mod reconfig;
mod stripe;
mod table;

pub use assign::{assign, capacity_shares, AssignError, NodeWeight};
pub use reconfig::{complete, plan, settle, CompleteError, Plan};
pub use stripe::{segments, Segment};
pub use table::{PartitionTable, TableError};

/// A storage node, numbered by the manager when it joins.
pub type NodeId = u32;
/// A partition number in `0..P`.
pub type PartitionId = u32;
/// Partition-table version; every data request carries the epoch it was routed with.
pub type Epoch = u64;
/// Inode number (file, directory or symlink id). Chosen at random by clients: hashed ones below
/// 2^62, placed ones (`placed_ino`) with `PLACED_INO` set.
pub type Ino = u64;

/// Default number of partitions: the bound on how far a cluster can scale out.
pub const DEFAULT_PARTITIONS: u32 = 1024;
/// Default stripe size (1 MiB). Stripe sizes are multiples of 1 MiB so that one FUSE request of
/// at most 1 MiB never spans two partitions.
pub const DEFAULT_STRIPE_SIZE: u32 = 1 << 20;
/// Largest stripe size accepted (bounds a frame's payload).
pub const MAX_STRIPE_SIZE: u32 = 64 << 20;
/// The root directory's inode number (as FUSE expects).
pub const ROOT_INO: Ino = 1;

/// Fixed seed so placement is identical on every node and across versions. Changing it
/// re-homes every stripe of a cluster: the test vectors in this crate pin it.
const HASH_SEED: u64 = 0x7e55_e7a0_5eed_0001;
/// The stripe index reserved for an object's metadata (inode and directory entries).
const META_STRIPE: u64 = u64::MAX;

/// Partition of stripe `stripe` of file `file`, for a cluster of `partitions` partitions.
#[must_use]
pub fn stripe_partition(file: Ino, stripe: u64, partitions: u32) -> PartitionId {
    assert!(partitions > 0, "a cluster has at least one partition");
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&file.to_le_bytes());
    key[8..].copy_from_slice(&stripe.to_le_bytes());
    let h = xxhash_rust::xxh3::xxh3_64_with_seed(&key, HASH_SEED);
    // P is fixed per cluster and small, so modulo keeps the distribution uniform enough.
    (h % u64::from(partitions)) as PartitionId
}

/// Set in an inode number that names its metadata partition instead of hashing to one.
pub const PLACED_INO: Ino = 1 << 62;

/// Partition holding the inode of `ino` and, for a directory, all of its entries.
#[must_use]
pub fn meta_partition(ino: Ino, partitions: u32) -> PartitionId {
    assert!(partitions > 0, "a cluster has at least one partition");
    if ino & PLACED_INO != 0 {
        return ((ino & !PLACED_INO) % u64::from(partitions)) as PartitionId;
    }
    stripe_partition(ino, META_STRIPE, partitions)
}

/// An inode number whose metadata lives in partition `p`, the rest of it from `random`. Files
/// are placed in their directory's partition, so that creating one (inode and name at once)
/// and looking one up (name and attributes at once) take one request each; directories hash,
/// which spreads the namespace over all nodes. The stripes of a placed file hash as any others.
#[must_use]
pub fn placed_ino(p: PartitionId, random: u64, partitions: u32) -> Ino {
    assert!(p < partitions, "partition {p} of {partitions}");
    // Below 2^61, plus p < 2^32: below 2^62, clear of the flag.
    let base = random >> 3;
    PLACED_INO | (base - base % u64::from(partitions) + u64::from(p))
}

/// The failure domain of servers labelled `label` (a rack, a switch, a host).
#[must_use]
pub fn failure_domain(label: &str) -> u32 {
    xxhash_rust::xxh3::xxh3_64_with_seed(label.as_bytes(), HASH_SEED) as u32
}

/// Checks a stripe size chosen by a user.
pub fn validate_stripe_size(size: u64) -> Result<u32, String> {
    if size == 0 || !size.is_multiple_of(1 << 20) || size > u64::from(MAX_STRIPE_SIZE) {
        return Err(format!(
            "stripe size {size} must be a non-zero multiple of 1 MiB and at most {} MiB",
            MAX_STRIPE_SIZE >> 20
        ));
    }
    Ok(size as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn hash_vectors_are_pinned() {
        // If these change, every existing cluster would re-home its data: do not edit lightly.
        let got: Vec<u32> = [(0, 0), (1, 0), (1, 1), (42, 7), (u64::MAX, 3)]
            .iter()
            .map(|&(f, s)| stripe_partition(f, s, DEFAULT_PARTITIONS))
            .collect();
        assert_eq!(got, PINNED_VECTORS);
        assert_eq!(
            meta_partition(ROOT_INO, DEFAULT_PARTITIONS),
            PINNED_ROOT_META
        );
        // The reference XXH3-64 of the empty input with seed 0, from the xxHash test suite.
        assert_eq!(xxhash_rust::xxh3::xxh3_64(b""), 0x2D06_8005_38D3_94C2);
    }
    const PINNED_VECTORS: [u32; 5] = [887, 289, 989, 163, 129];
    const PINNED_ROOT_META: u32 = 174;

    #[test]
    fn stripe_sizes() {
        assert!(validate_stripe_size(1 << 20).is_ok());
        assert!(validate_stripe_size(4 << 20).is_ok());
        assert!(validate_stripe_size(0).is_err());
        assert!(validate_stripe_size(1000).is_err());
        assert!(validate_stripe_size(128 << 20).is_err());
    }

    proptest! {
        #[test]
        fn partition_in_range(f in any::<u64>(), s in any::<u64>(), p in 1u32..100_000) {
            prop_assert!(stripe_partition(f, s, p) < p);
        }

        #[test]
        fn placed_inodes_land_in_their_partition(
            random in any::<u64>(),
            partitions in 1u32..=u32::MAX,
            at in any::<u32>(),
        ) {
            let p = at % partitions;
            let ino = placed_ino(p, random, partitions);
            prop_assert_eq!(meta_partition(ino, partitions), p);
            prop_assert!(ino & PLACED_INO != 0 && ino < 1 << 63);
        }

        #[test]
        fn hashed_inodes_hash(ino in 0u64..PLACED_INO, partitions in 1u32..100_000) {
            prop_assert_eq!(
                meta_partition(ino, partitions),
                stripe_partition(ino, META_STRIPE, partitions)
            );
        }
    }

    #[test]
    fn stripes_spread_evenly() {
        // 64 Ki consecutive stripes of one file over 1024 partitions: every partition gets
        // within 50 % of the mean (64), the uniformity the symmetric layout depends on.
        let mut counts = vec![0u32; 1024];
        for s in 0..65_536 {
            counts[stripe_partition(7, s, 1024) as usize] += 1;
        }
        let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
        assert!(*min >= 32 && *max <= 96, "min {min} max {max}");
    }
}
