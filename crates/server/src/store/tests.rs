//! The store's tests: stripes, capacity and copies against models; the namespace in `names`.

use super::*;
use proptest::prelude::*;
use std::sync::Arc;
use tessera_placement::meta_partition;
use tessera_proto::{FileKind, Piece, SetAttr, Timespec, DIR_PAGE_INODE_BYTES, DIR_PAGE_MAX};

mod names;
mod orphans;

const SS: u32 = 4096;

fn store(capacity: u64) -> Store {
    Store::new(4, SS, capacity, Arc::new(BufferPool::new(SS as usize, 8)))
}

impl Store {
    /// Does the index of files' partitions name exactly the partitions holding stripes?
    fn placed_matches(&self) -> bool {
        let mut actual = BTreeSet::new();
        for (p, m) in self.partitions.iter().enumerate() {
            for (&file, stripes) in &lock(m).stripes {
                assert!(!stripes.is_empty(), "no empty stripe maps are kept");
                actual.insert((file, p as PartitionId));
            }
        }
        *lock(&self.placed) == actual
    }

    /// Is every partition charged what it holds, and the store the sum of its partitions?
    fn charges_add_up(&self) -> bool {
        let mut sum = 0;
        for m in &self.partitions {
            let part = lock(m);
            let stripes: u64 = part
                .stripes
                .values()
                .flatten()
                .map(|(_, b)| b.len() as u64)
                .sum();
            let inodes: u64 = part
                .inodes
                .values()
                .map(|i| INODE_COST + i.target.len() as u64)
                .sum();
            let entries: u64 = part.entries.map.keys().map(|(_, n)| entry_cost(n)).sum();
            if part.used != stripes + inodes + entries {
                return false;
            }
            sum += part.used;
        }
        sum == self.used()
    }
}

fn inode(ino: Ino, kind: FileKind) -> Inode {
    Inode {
        ino,
        kind,
        mode: 0o755,
        uid: 0,
        gid: 0,
        size: 0,
        nlink: if kind == FileKind::Dir { 2 } else { 1 },
        atime: Timespec::default(),
        mtime: Timespec::default(),
        ctime: Timespec::default(),
        parent: 0,
        target: Vec::new(),
        open_count: 0,
        opens: tessera_proto::Opens::default(),
        change: 0,
    }
}

fn t(secs: i64) -> Timespec {
    Timespec { secs, nanos: 0 }
}

fn entry(ino: Ino, kind: FileKind) -> DirEntry {
    DirEntry { ino, kind }
}

/// A number, from `n * 1000` on, whose inode lives in another partition than 0 (where the
/// tests' directories are): an entry may name it without its inode being here.
fn far(n: u64) -> Ino {
    (n * 1000..).find(|&i| meta_partition(i, 4) != 0).unwrap()
}

#[derive(Debug, Clone)]
enum StripeOp {
    Write {
        stripe: u64,
        offset: u32,
        data: Vec<u8>,
    },
    /// A scatter write: pieces as (gap after the one before, bytes), laid out by `scattered`.
    Scatter {
        stripe: u64,
        pieces: Vec<(u32, Vec<u8>)>,
    },
    Truncate(u64),
    Read {
        stripe: u64,
        offset: u32,
        len: u32,
    },
}

fn stripe_op() -> impl Strategy<Value = StripeOp> {
    prop_oneof![
        4 => (0u64..4, 0u32..SS).prop_flat_map(|(stripe, offset)| {
            prop::collection::vec(any::<u8>(), 0..=(SS - offset) as usize)
                .prop_map(move |data| StripeOp::Write { stripe, offset, data })
        }),
        2 => (0u64..4, prop::collection::vec((0u32..600, prop::collection::vec(any::<u8>(), 1..300)), 1..12))
            .prop_map(|(stripe, pieces)| StripeOp::Scatter { stripe, pieces }),
        1 => (0u64..(4 * u64::from(SS))).prop_map(StripeOp::Truncate),
        3 => (0u64..4, 0u32..SS, 0u32..SS).prop_map(|(stripe, offset, len)| StripeOp::Read { stripe, offset, len }),
    ]
}

/// The pieces of a scatter write and its payload: each piece `gap` bytes after the one before,
/// those past the stripe's end left out.
fn scattered(pieces: &[(u32, Vec<u8>)]) -> (Vec<Piece>, Bytes) {
    let (mut out, mut data, mut at) = (Vec::new(), Vec::new(), 0);
    for (gap, bytes) in pieces {
        let piece = Piece {
            offset: at + gap,
            len: bytes.len() as u32,
        };
        if piece.end() > u64::from(SS) {
            break;
        }
        at = piece.end() as u32;
        out.push(piece);
        data.extend_from_slice(bytes);
    }
    (out, Bytes::from(data))
}

/// Applies one change of a mixed workload to partition 0 (errors are part of it).
fn mixed(s: &Store, op: &StripeOp, k: u64) {
    match op {
        StripeOp::Write {
            stripe,
            offset,
            data,
        } => {
            let _ = s.write(0, 9 + k % 2, *stripe, *offset, Bytes::from(data.clone()));
            let mut i = inode(100 + k % 5, FileKind::File);
            i.size = k;
            let _ = s.inode_create(0, i);
            let _ = s.inode_extend(0, 100 + k % 5, k, t(k as i64));
        }
        StripeOp::Scatter { stripe, pieces } => {
            let (pieces, data) = scattered(pieces);
            let _ = s.write_scatter(0, 9 + k % 2, *stripe, &pieces, data);
        }
        StripeOp::Truncate(size) => {
            let _ = s.truncate(&[0], 9 + k % 2, *size);
            let _ = s.inode_link(0, 100 + k % 5, -1, t(1));
            let _ = s.dir_insert(
                0,
                1,
                format!("f{}", k % 7).into_bytes(),
                DirEntry {
                    ino: k,
                    kind: FileKind::File,
                },
                true,
                t(2),
            );
        }
        StripeOp::Read { stripe, .. } => {
            let _ = s.dir_remove(
                0,
                1,
                format!("f{}", stripe % 7).into_bytes(),
                None,
                None,
                t(3),
            );
        }
    }
}

type Contents = (
    Vec<(Ino, u64, Vec<u8>)>,
    Vec<Inode>,
    Vec<(Ino, Name, DirEntry)>,
);

/// Everything a partition holds, for comparing two copies.
fn contents(s: &Store) -> Contents {
    let snap = s.snapshot(0).unwrap();
    let mut stripes: Vec<_> = snap
        .stripes
        .iter()
        .flat_map(|(f, m)| m.iter().map(move |(i, b)| (*f, *i, b.to_vec())))
        .collect();
    stripes.sort();
    let mut inodes: Vec<_> = snap.inodes.values().cloned().collect();
    inodes.sort_by_key(|i| i.ino);
    let entries = snap
        .entries
        .iter()
        .map(|((d, n), e)| (*d, n.clone(), *e))
        .collect();
    (stripes, inodes, entries)
}

/// Sends the changes since `base` from `src` to `dst`, as a sync round does.
fn round(src: &Store, dst: &Store, base: Option<&Snapshot>) -> Snapshot {
    let snap = src.snapshot(0).unwrap();
    let d = snap.delta_from(base);
    let data: Vec<u8> = d.data.iter().flat_map(|b| b.to_vec()).collect();
    dst.apply_sync(0, d.items, &Bytes::from(data)).unwrap();
    snap
}

#[test]
fn a_fenced_partition_refuses_changes_but_serves_reads() {
    let s = store(1 << 30);
    s.write(0, 9, 0, 0, Bytes::from_static(b"abc")).unwrap();
    s.fence(0, true).unwrap();
    assert!(matches!(
        s.write(0, 9, 0, 0, Bytes::from_static(b"x")),
        Err(ErrorCode::NotReady(_))
    ));
    assert!(matches!(
        s.inode_create(0, inode(5, FileKind::File)),
        Err(ErrorCode::NotReady(_))
    ));
    assert_eq!(&s.read(0, 9, 0, 0, 3).unwrap()[..], b"abc");
    s.fence(0, false).unwrap();
    s.write(0, 9, 0, 0, Bytes::from_static(b"x")).unwrap();
}

proptest! {
    /// A copy built from a snapshot and then the deltas of later rounds, while the source
    /// keeps changing between rounds, ends equal to the source, with the same accounting;
    /// clearing it gives all its memory back.
    #[test]
    fn sync_rounds_converge(
        before in prop::collection::vec(stripe_op(), 0..30),
        during in prop::collection::vec(prop::collection::vec(stripe_op(), 0..20), 1..4),
    ) {
        let (src, dst) = (store(1 << 30), store(1 << 30));
        src.inode_create(0, inode(1, FileKind::Dir)).unwrap();
        for (k, op) in before.iter().enumerate() {
            mixed(&src, op, k as u64);
        }
        let mut base = round(&src, &dst, None);
        for (r, ops) in during.iter().enumerate() {
            for (k, op) in ops.iter().enumerate() {
                mixed(&src, op, (r * 100 + k) as u64);
            }
            base = round(&src, &dst, Some(&base));
        }
        drop(base);
        prop_assert_eq!(contents(&src), contents(&dst));
        for s in [&src, &dst] {
            let part = s.part(0).unwrap();
            let mut recount = HashMap::<Ino, u32>::new();
            for e in part.entries.map.values() {
                *recount.entry(e.ino).or_default() += 1;
            }
            prop_assert_eq!(&part.entries.named, &recount, "names counted as they are");
        }
        prop_assert_eq!(src.used(), dst.used());
        prop_assert_eq!((src.stripe_count(), src.inode_count()), (dst.stripe_count(), dst.inode_count()));
        prop_assert!(src.placed_matches() && dst.placed_matches());
        dst.clear(0).unwrap();
        prop_assert_eq!((dst.used(), dst.stripe_count(), dst.inode_count()), (0, 0, 0));
        prop_assert!(dst.placed_matches());
    }

    /// Stripe writes, truncates and reads agree with a plain byte-vector model, and the
    /// bytes accounted as used are exactly the bytes stored.
    #[test]
    fn stripes_match_a_model(ops in prop::collection::vec(stripe_op(), 1..60)) {
        let s = store(1 << 30);
        let mut model: Vec<Vec<u8>> = vec![Vec::new(); 4];
        for op in ops {
            match op {
                StripeOp::Write { stripe, offset, data } => {
                    let m = &mut model[stripe as usize];
                    let end = offset as usize + data.len();
                    if m.len() < end { m.resize(end, 0); }
                    m[offset as usize..end].copy_from_slice(&data);
                    s.write(0, 9, stripe, offset, Bytes::from(data)).unwrap();
                }
                StripeOp::Scatter { stripe, pieces } => {
                    let (pieces, data) = scattered(&pieces);
                    let m = &mut model[stripe as usize];
                    let mut at = 0;
                    for p in &pieces {
                        let (from, end) = (p.offset as usize, p.end() as usize);
                        if m.len() < end { m.resize(end, 0); }
                        m[from..end].copy_from_slice(&data[at..at + p.len as usize]);
                        at += p.len as usize;
                    }
                    let written = s.write_scatter(0, 9, stripe, &pieces, data);
                    if pieces.is_empty() {
                        prop_assert!(matches!(written, Err(ErrorCode::Invalid(_))));
                    } else {
                        written.unwrap();
                    }
                }
                StripeOp::Truncate(size) => {
                    s.truncate(&[0], 9, size).unwrap();
                    for (i, m) in model.iter_mut().enumerate() {
                        let start = i as u64 * u64::from(SS);
                        m.truncate(size.saturating_sub(start).min(u64::from(SS)) as usize);
                    }
                }
                StripeOp::Read { stripe, offset, len } => {
                    let got = s.read(0, 9, stripe, offset, len).unwrap();
                    let m = &model[stripe as usize];
                    let start = (offset as usize).min(m.len());
                    prop_assert_eq!(&got[..], &m[start..m.len().min(start + len as usize)]);
                }
            }
            let stored: usize = model.iter().map(Vec::len).sum();
            prop_assert_eq!(s.used(), stored as u64);
            prop_assert!(s.placed_matches());
        }
    }
}

proptest! {
    /// Whatever a workload does, copies included, each partition is charged exactly what it
    /// holds and the store the sum of its partitions.
    #[test]
    fn partition_charges_add_up_to_the_store(
        ops in prop::collection::vec(stripe_op(), 0..60),
        copied in 0usize..60,
    ) {
        let (src, dst) = (store(1 << 30), store(1 << 30));
        src.inode_create(0, inode(1, FileKind::Dir)).unwrap();
        let mut base = None;
        for (k, op) in ops.iter().enumerate() {
            mixed(&src, op, k as u64);
            let _ = src.dir_rename(0, 1, format!("f{}", k % 7).into_bytes(), format!("g{k}").into_bytes(), true, false, t(4));
            prop_assert!(src.charges_add_up());
            if k == copied {
                base = Some(round(&src, &dst, base.as_ref()));
                prop_assert!(dst.charges_add_up());
            }
        }
        round(&src, &dst, base.as_ref());
        prop_assert!(dst.charges_add_up());
        src.clear(0).unwrap();
        prop_assert!(src.charges_add_up());
        prop_assert_eq!(src.used(), 0);
    }
}

#[test]
fn full_stripe_writes_keep_the_received_buffer() {
    let s = store(1 << 20);
    let data = Bytes::from(vec![7u8; SS as usize]);
    let ptr = data.as_ptr();
    s.write(1, 5, 0, 0, data).unwrap();
    assert_eq!(
        s.read(1, 5, 0, 0, SS).unwrap().as_ptr(),
        ptr,
        "stored without a copy"
    );
    assert_eq!(s.stripe_count(), 1);
    s.truncate(&[0, 1, 2, 3], 5, 0).unwrap();
    assert_eq!((s.stripe_count(), s.used()), (0, 0));
}

#[test]
fn a_deleted_file_is_dropped_wherever_its_stripes_are_whatever_its_size() {
    let s = store(1 << 20);
    let held: Vec<PartitionId> = (0..4).collect();
    let put = |p: PartitionId, file: Ino, stripe: u64| {
        s.write(p, file, stripe, 0, Bytes::from_static(b"x"))
            .unwrap();
    };
    // Far past any size the files were given.
    for (p, stripe) in [(0, 0), (1, 1), (3, 900), (3, 901)] {
        put(p, 5, stripe);
    }
    put(2, 6, 0);
    s.drop_files(&held, &[5]).unwrap();
    assert_eq!(s.stripe_count(), 1, "file 6 keeps its stripe");
    s.drop_files(&held, &[5, 6, 7]).unwrap();
    assert_eq!((s.stripe_count(), s.used()), (0, 0));
    // Partitions not held are left alone.
    put(1, 7, 0);
    s.drop_files(&[0, 2, 3], &[7]).unwrap();
    assert_eq!(s.stripe_count(), 1);
    // A partition fenced for a copy's last round refuses, without stopping the others;
    // the drop is tried again once the fence is lifted.
    put(2, 8, 0);
    s.fence(1, true).unwrap();
    assert!(matches!(
        s.drop_files(&held, &[7, 8]),
        Err(ErrorCode::NotReady(_))
    ));
    assert_eq!(s.stripe_count(), 1);
    s.fence(1, false).unwrap();
    s.drop_files(&held, &[7, 8]).unwrap();
    assert_eq!(s.stripe_count(), 0);
    assert!(s.placed_matches());
}

#[test]
fn a_truncate_cuts_stripes_past_the_old_size_in_every_partition_held() {
    let s = store(1 << 20);
    for (p, stripe) in [(0, 0), (1, 1), (2, 2), (3, 700)] {
        s.write(p, 5, stripe, 0, Bytes::from(vec![1u8; SS as usize]))
            .unwrap();
    }
    s.truncate(&[0, 1, 2, 3], 5, u64::from(SS) + 10).unwrap();
    assert_eq!(
        (s.stripe_count(), s.used()),
        (2, u64::from(SS) + 10),
        "stripe 0 whole, 10 bytes of stripe 1"
    );
    assert!(s.placed_matches());
}

#[test]
fn a_reader_keeps_its_bytes_while_the_stripe_is_overwritten() {
    let s = store(1 << 20);
    s.write(0, 1, 0, 0, Bytes::from_static(b"aaaa")).unwrap();
    let held = s.read(0, 1, 0, 0, 4).unwrap();
    s.write(0, 1, 0, 1, Bytes::from_static(b"bb")).unwrap();
    assert_eq!(&held[..], b"aaaa", "copy on write");
    assert_eq!(&s.read(0, 1, 0, 0, 4).unwrap()[..], b"abba");
}

#[test]
fn enospc_changes_nothing() {
    let s = store(6000);
    s.write(0, 1, 0, 0, Bytes::from(vec![1u8; 4000])).unwrap();
    let before = s.used();
    assert_eq!(
        s.write(0, 1, 1, 0, Bytes::from(vec![2u8; 4000])),
        Err(ErrorCode::NoSpace)
    );
    assert_eq!(
        s.write(0, 1, 0, 3000, Bytes::from(vec![3u8; 1096]))
            .map(drop),
        Ok(()),
        "fits"
    );
    assert_eq!(
        s.write(0, 2, 0, 0, Bytes::from(vec![3u8; 2000])),
        Err(ErrorCode::NoSpace)
    );
    assert_eq!(s.used(), before + 96);
    assert_eq!(&s.read(0, 1, 0, 0, 3000).unwrap()[..], &[1u8; 3000][..]);
    assert_eq!(s.read(0, 1, 1, 0, 10).unwrap().len(), 0);
    assert!(
        matches!(
            s.write(0, 1, 0, SS - 1, Bytes::from_static(b"xx")),
            Err(ErrorCode::Invalid(_))
        ),
        "past the stripe end"
    );
    let tiny = store(10);
    assert_eq!(
        tiny.inode_create(0, inode(3, FileKind::File)),
        Err(ErrorCode::NoSpace)
    );
    assert_eq!((tiny.inode_count(), tiny.used()), (0, 0));
}

#[test]
fn a_scatter_write_that_finds_the_memory_full_changes_nothing() {
    let p = |offset, len| Piece { offset, len };
    let s = store(6000);
    s.write(0, 1, 0, 0, Bytes::from(vec![1u8; 3000])).unwrap();
    let before = s.used();
    // New stripes of 4096 and 4001 bytes: more than the 3000 left.
    let far = [p(10, 5), p(2000, 5), p(4000, 96)];
    assert_eq!(
        s.write_scatter(0, 1, 1, &far, Bytes::from(vec![2u8; 106])),
        Err(ErrorCode::NoSpace)
    );
    let grows = [p(100, 4), p(2990, 20), p(4000, 1)];
    assert_eq!(
        s.write_scatter(0, 2, 0, &grows, Bytes::from(vec![2u8; 25])),
        Err(ErrorCode::NoSpace)
    );
    assert_eq!((s.used(), s.stripe_count()), (before, 1));
    assert!(s.placed_matches() && s.charges_add_up());
    assert_eq!(&s.read(0, 1, 0, 0, SS).unwrap()[..], &[1u8; 3000][..]);
    assert_eq!(s.read(0, 1, 1, 0, SS).unwrap().len(), 0, "no stripe made");
    // A malformed one is refused before anything is charged.
    let overlapping = [p(0, 8), p(4, 8)];
    assert!(matches!(
        s.write_scatter(0, 1, 0, &overlapping, Bytes::from(vec![3u8; 16])),
        Err(ErrorCode::Invalid(_))
    ));
    // What fits is written, the bytes between pieces kept: 96 bytes more.
    let fits = [p(10, 2), p(2990, 106)];
    s.write_scatter(0, 1, 0, &fits, Bytes::from(vec![4u8; 108]))
        .unwrap();
    assert_eq!(s.used(), before + 96);
    let got = s.read(0, 1, 0, 0, SS).unwrap();
    assert_eq!(got.len(), 3096);
    assert_eq!(
        (&got[..10], &got[10..12], &got[12..2990]),
        (&[1u8; 10][..], &[4u8; 2][..], &[1u8; 2978][..])
    );
    assert!(got[2990..].iter().all(|&b| b == 4));
    assert!(s.charges_add_up());
}
