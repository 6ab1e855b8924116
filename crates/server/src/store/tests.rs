//! The store's tests: stripes, capacity, copies, inodes and directories against models.

use super::*;
use proptest::prelude::*;
use std::sync::Arc;
use tessera_placement::meta_partition;
use tessera_proto::{FileKind, SetAttr, Timespec, DIR_PAGE_INODE_BYTES, DIR_PAGE_MAX};

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
        1 => (0u64..(4 * u64::from(SS))).prop_map(StripeOp::Truncate),
        3 => (0u64..4, 0u32..SS, 0u32..SS).prop_map(|(stripe, offset, len)| StripeOp::Read { stripe, offset, len }),
    ]
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
fn links_and_open_handles_decide_when_an_inode_goes() {
    let s = store(1 << 20);
    s.inode_create(0, inode(7, FileKind::File)).unwrap();
    assert_eq!(
        s.inode_create(0, inode(7, FileKind::File)),
        Err(ErrorCode::Exists)
    );
    assert_eq!(s.inode_open(0, 7).unwrap().open_count, 1);
    assert_eq!(s.inode_link(0, 7, 1, t(1)), Ok((2, false)));
    assert_eq!(s.inode_link(0, 7, -1, t(2)), Ok((1, false)));
    assert_eq!(s.inode_link(0, 7, -1, t(3)), Ok((0, false)), "still open");
    assert!(s.inode_get(0, 7).is_ok());
    let extended = s.inode_extend(0, 7, 1, t(4)).unwrap();
    assert_eq!(extended.size, 1);
    // Three link changes and the extend; the open counts for nothing.
    assert_eq!(
        extended.change, 4,
        "every change but opens and closes counts"
    );
    let attr = SetAttr {
        mode: Some(0o600),
        ..SetAttr::default()
    };
    assert_eq!(s.inode_setattr(0, 7, &attr).unwrap().change, 5);
    assert_eq!(
        s.inode_close(0, 7),
        Ok((0, true)),
        "last close reaps it; its stripes are to be dropped"
    );
    assert_eq!(s.inode_get(0, 7), Err(ErrorCode::NotFound));
    assert_eq!((s.inode_count(), s.used()), (0, 0));
    s.inode_create(0, inode(9, FileKind::File)).unwrap();
    assert_eq!(
        s.inode_link(0, 9, -1, t(4)),
        Ok((0, true)),
        "whatever its size: a failed write may have stored stripes past it"
    );
    s.inode_create(0, inode(8, FileKind::File)).unwrap();
    assert_eq!(s.inode_extend(0, 8, 100, t(5)).unwrap().size, 100);
    assert_eq!(
        s.inode_extend(0, 8, 50, t(6)).unwrap().size,
        100,
        "extend never shrinks"
    );
    let retracted = s.inode_retract(0, 8, 100, 40).unwrap();
    assert_eq!(retracted.size, 40, "the extent taken back");
    assert_eq!(
        s.inode_retract(0, 8, 100, 10).unwrap(),
        retracted,
        "moved since: left alone"
    );
    let a = SetAttr {
        size: Some(10),
        mode: Some(0o600),
        parent: Some(4),
        ctime: t(7),
        ..SetAttr::default()
    };
    let i = s.inode_setattr(0, 8, &a).unwrap();
    assert_eq!((i.size, i.mode, i.parent, i.ctime), (10, 0o600, 4, t(7)));
}

#[test]
fn a_rename_over_a_placed_file_drops_its_link_and_sets_times_in_one_step() {
    let s = store(1 << 20);
    s.inode_create(0, inode(10, FileKind::Dir)).unwrap();
    s.inode_create(0, inode(30, FileKind::Dir)).unwrap();
    let mut full = inode(21, FileKind::File);
    full.size = 5;
    s.dir_create(0, 10, b"tmp".to_vec(), inode(20, FileKind::File), t(1))
        .unwrap();
    s.dir_create(0, 10, b"target".to_vec(), full, t(1)).unwrap();
    s.dir_insert(
        0,
        10,
        b"sub".to_vec(),
        entry(30, FileKind::Dir),
        false,
        t(1),
    )
    .unwrap();
    let renamed = s
        .dir_rename(
            0,
            10,
            b"tmp".to_vec(),
            b"target".to_vec(),
            true,
            false,
            t(2),
        )
        .unwrap();
    let expected = Renamed {
        moved: Some(entry(20, FileKind::File)),
        ctime_set: true,
        replaced: Some(entry(21, FileKind::File)),
        links: Some((0, true)),
        dir: s.inode_get(0, 10).unwrap(),
    };
    assert_eq!(renamed, expected, "21 is gone and had data");
    assert_eq!(renamed.dir.mtime, t(2));
    assert_eq!(s.inode_get(0, 21), Err(ErrorCode::NotFound));
    assert_eq!(s.inode_get(0, 20).unwrap().ctime, t(2));
    // A directory at the target only on the caller's word that it is empty.
    s.dir_create(0, 10, b"d".to_vec(), inode(22, FileKind::File), t(3))
        .unwrap();
    s.inode_create(0, inode(31, FileKind::Dir)).unwrap();
    s.dir_insert(
        0,
        10,
        b"sub2".to_vec(),
        entry(31, FileKind::Dir),
        false,
        t(3),
    )
    .unwrap();
    let dir_over_dir = |replace_dir| {
        s.dir_rename(
            0,
            10,
            b"sub2".to_vec(),
            b"sub".to_vec(),
            true,
            replace_dir,
            t(4),
        )
    };
    assert_eq!(dir_over_dir(false), Err(ErrorCode::IsDir));
    let renamed = dir_over_dir(true).unwrap();
    assert_eq!(renamed.replaced, Some(entry(30, FileKind::Dir)));
    assert_eq!(
        renamed.links, None,
        "a directory is destroyed by the caller"
    );
    assert_eq!(s.inode_get(0, 10).unwrap().nlink, 3, "2 + sub");
}

#[test]
fn create_names_an_inode_at_once_or_changes_nothing() {
    let s = store(1 << 20);
    s.inode_create(0, inode(10, FileKind::Dir)).unwrap();
    let f = inode(20, FileKind::File);
    let d = s.dir_create(0, 10, b"f".to_vec(), f.clone(), t(1)).unwrap();
    assert_eq!(d, s.inode_get(0, 10).unwrap());
    let entry = DirEntry {
        ino: 20,
        kind: FileKind::File,
    };
    assert_eq!(s.dir_lookup(0, 10, b"f"), Ok((entry, Some(f.clone()))));
    assert_eq!(s.inode_get(0, 10).unwrap().mtime, t(1));
    let used = s.used();
    // The name taken, the number taken, no directory, not a directory, a bad name.
    let refused = [
        (10, "f", 21, ErrorCode::Exists),
        (10, "g", 20, ErrorCode::Exists),
        (99, "g", 22, ErrorCode::NotFound),
        (20, "g", 23, ErrorCode::NotDir),
    ];
    for (dir, name, ino, err) in refused {
        let file = inode(ino, FileKind::File);
        let got = s.dir_create(0, dir, name.as_bytes().to_vec(), file, t(2));
        assert_eq!(got, Err(err));
    }
    assert!(matches!(
        s.dir_create(0, 10, b"a/b".to_vec(), inode(24, FileKind::File), t(2)),
        Err(ErrorCode::Invalid(_))
    ));
    assert_eq!(s.used(), used, "a refused create reserves nothing");
    assert_eq!(s.inode_get(0, 10).unwrap().mtime, t(1));
    for ino in 21..25 {
        assert_eq!(s.inode_get(0, ino), Err(ErrorCode::NotFound));
    }
    let tiny = store(INODE_COST);
    tiny.inode_create(0, inode(10, FileKind::Dir)).unwrap();
    assert_eq!(
        tiny.dir_create(0, 10, b"f".to_vec(), inode(20, FileKind::File), t(1)),
        Err(ErrorCode::NoSpace)
    );
    assert_eq!(tiny.dir_lookup(0, 10, b"f"), Err(ErrorCode::NotFound));
}

#[test]
fn unlink_drops_name_and_link_at_once_when_the_inode_is_here() {
    let unlink = |s: &Store, name: &str| {
        s.dir_unlink(0, 10, name.into(), t(3))
            .map(|(entry, links, dir)| (entry, links, dir.mtime))
    };
    let s = store(1 << 20);
    s.inode_create(0, inode(10, FileKind::Dir)).unwrap();
    for (name, ino) in [("a", 20), ("b", 21), ("open", 22)] {
        s.dir_create(0, 10, name.into(), inode(ino, FileKind::File), t(1))
            .unwrap();
    }
    s.inode_extend(0, 20, 5, t(2)).unwrap();
    s.inode_link(0, 21, 1, t(2)).unwrap(); // a second name elsewhere
    s.inode_open(0, 22).unwrap();
    let e = |ino| DirEntry {
        ino,
        kind: FileKind::File,
    };
    assert_eq!(unlink(&s, "a"), Ok((e(20), Some((0, true)), t(3))));
    assert_eq!(s.inode_get(0, 20), Err(ErrorCode::NotFound), "reaped");
    assert_eq!(unlink(&s, "b"), Ok((e(21), Some((1, false)), t(3))));
    assert_eq!(s.inode_get(0, 21).unwrap().nlink, 1);
    let kept = unlink(&s, "open");
    assert_eq!(kept, Ok((e(22), Some((0, false)), t(3))), "open: kept");
    // A name whose inode lives elsewhere (a hard link): the caller drops the link.
    let far = DirEntry {
        ino: far(99),
        kind: FileKind::File,
    };
    s.dir_insert(0, 10, b"far".to_vec(), far, false, t(4))
        .unwrap();
    assert_eq!(unlink(&s, "far"), Ok((far, None, t(3))));
    s.inode_create(0, inode(30, FileKind::Dir)).unwrap();
    let sub = DirEntry {
        ino: 30,
        kind: FileKind::Dir,
    };
    s.dir_insert(0, 10, b"sub".to_vec(), sub, false, t(6))
        .unwrap();
    assert_eq!(unlink(&s, "sub"), Err(ErrorCode::IsDir));
    assert_eq!(unlink(&s, "gone"), Err(ErrorCode::NotFound));
}

#[test]
fn an_inode_named_here_outlives_links_dropped_too_many_times() {
    let s = store(1 << 20);
    s.inode_create(0, inode(10, FileKind::Dir)).unwrap();
    s.dir_create(0, 10, b"f".to_vec(), inode(20, FileKind::File), t(1))
        .unwrap();
    // A second name without a link, as a rename between two directories here makes for a
    // moment; then a buggy client drops the one link and unlinks one name.
    s.dir_insert(0, 10, b"g".to_vec(), entry(20, FileKind::File), false, t(1))
        .unwrap();
    assert_eq!(s.inode_link(0, 20, -1, t(2)), Ok((0, false)));
    assert_eq!(
        s.inode_link(0, 20, -1, t(2)),
        Ok((0, false)),
        "no underflow"
    );
    let unlinked = s.dir_unlink(0, 10, b"f".to_vec(), t(3)).unwrap();
    assert_eq!(unlinked.1, Some((0, false)));
    assert_eq!(
        s.dir_lookup(0, 10, b"g").map(|(_, i)| i.is_some()),
        Ok(true),
        "the other name still leads to the inode"
    );
    let unlinked = s.dir_unlink(0, 10, b"g".to_vec(), t(4)).unwrap();
    assert_eq!(unlinked.1, Some((0, true)), "its last name gone: deleted");
    assert_eq!(s.inode_get(0, 20), Err(ErrorCode::NotFound));
    // A rename over a name of an inode that has another name here keeps it.
    s.dir_create(0, 10, b"a".to_vec(), inode(21, FileKind::File), t(5))
        .unwrap();
    s.dir_insert(0, 10, b"b".to_vec(), entry(21, FileKind::File), false, t(5))
        .unwrap();
    s.dir_create(0, 10, b"c".to_vec(), inode(22, FileKind::File), t(5))
        .unwrap();
    let renamed = s
        .dir_rename(0, 10, b"c".to_vec(), b"a".to_vec(), true, false, t(6))
        .unwrap();
    assert_eq!(renamed.links, Some((0, false)));
    assert!(s.inode_get(0, 21).is_ok(), "still named b");
}

#[test]
fn an_entry_leads_to_an_inode_of_its_kind_where_the_server_sees_it() {
    let s = store(1 << 20);
    s.inode_create(0, inode(10, FileKind::Dir)).unwrap();
    s.dir_create(0, 10, b"f".to_vec(), inode(20, FileKind::File), t(1))
        .unwrap();
    let here = (2..).find(|&i| meta_partition(i, 4) == 0).unwrap();
    assert_eq!(
        s.dir_insert(
            0,
            10,
            b"x".to_vec(),
            entry(here, FileKind::Dir),
            false,
            t(2)
        ),
        Err(ErrorCode::NotFound),
        "an inode that would be here is not"
    );
    assert!(matches!(
        s.dir_insert(
            0,
            10,
            b"x".to_vec(),
            entry(20, FileKind::Symlink),
            false,
            t(2)
        ),
        Err(ErrorCode::Invalid(_))
    ));
    assert_eq!(
        s.dir_insert(0, 10, b"x".to_vec(), entry(20, FileKind::File), false, t(2)),
        Ok(None)
    );
    assert_eq!(
        s.dir_insert(
            0,
            10,
            b"y".to_vec(),
            entry(far(1), FileKind::File),
            false,
            t(2)
        ),
        Ok(None),
        "an inode elsewhere is the caller's word"
    );
    assert_eq!(s.inode_get(0, 10).unwrap().mtime, t(2));
}

#[test]
fn only_a_regular_file_changes_size() {
    let s = store(1 << 20);
    let mut link = inode(12, FileKind::Symlink);
    link.target = b"/x".to_vec();
    link.size = 2;
    s.inode_create(0, link).unwrap();
    s.inode_create(0, inode(13, FileKind::Dir)).unwrap();
    s.inode_create(0, inode(14, FileKind::File)).unwrap();
    let resize = SetAttr {
        size: Some(9),
        ..SetAttr::default()
    };
    assert!(matches!(
        s.inode_setattr(0, 12, &resize),
        Err(ErrorCode::Invalid(_))
    ));
    assert_eq!(s.inode_setattr(0, 13, &resize), Err(ErrorCode::IsDir));
    assert!(matches!(
        s.inode_extend(0, 12, 9, t(1)),
        Err(ErrorCode::Invalid(_))
    ));
    assert_eq!(s.inode_extend(0, 13, 9, t(1)), Err(ErrorCode::IsDir));
    assert_eq!(s.inode_get(0, 12).unwrap().size, 2, "unchanged");
    assert_eq!(s.inode_setattr(0, 14, &resize).unwrap().size, 9);
    assert_eq!(s.inode_extend(0, 14, 10, t(1)).unwrap().size, 10);
}

#[test]
fn directory_rules() {
    let s = store(1 << 20);
    let (d, f, sub) = (10, far(11), far(12));
    s.inode_create(0, inode(d, FileKind::Dir)).unwrap();
    let file = DirEntry {
        ino: f,
        kind: FileKind::File,
    };
    let dir = DirEntry {
        ino: sub,
        kind: FileKind::Dir,
    };
    assert_eq!(
        s.dir_insert(0, 99, b"x".to_vec(), file, false, t(1)),
        Err(ErrorCode::NotFound)
    );
    s.inode_create(0, inode(13, FileKind::File)).unwrap();
    assert_eq!(
        s.dir_insert(0, 13, b"x".to_vec(), file, false, t(1)),
        Err(ErrorCode::NotDir)
    );
    assert_eq!(
        s.dir_insert(0, d, b"f".to_vec(), file, false, t(1)),
        Ok(None)
    );
    assert_eq!(
        s.dir_insert(0, d, b"f".to_vec(), file, false, t(1)),
        Err(ErrorCode::Exists)
    );
    assert_eq!(
        s.dir_insert(0, d, b"f".to_vec(), dir, true, t(1)),
        Err(ErrorCode::NotDir)
    );
    assert_eq!(
        s.dir_insert(0, d, b"s".to_vec(), dir, false, t(2)),
        Ok(None)
    );
    assert_eq!(
        s.dir_insert(0, d, b"s".to_vec(), file, true, t(2)),
        Err(ErrorCode::IsDir)
    );
    let di = s.inode_get(0, d).unwrap();
    assert_eq!((di.nlink, di.mtime), (3, t(2)), "2 + one subdirectory");
    assert!(matches!(
        s.dir_insert(0, d, b"a/b".to_vec(), file, false, t(2)),
        Err(ErrorCode::Invalid(_))
    ));
    assert_eq!(
        s.dir_lookup(0, d, b"f"),
        Ok((file, None)),
        "the file's inode lives elsewhere"
    );
    assert_eq!(
        s.dir_remove(0, d, b"s".to_vec(), None, Some(false), t(3)),
        Err(ErrorCode::IsDir)
    );
    assert_eq!(
        s.dir_remove(0, d, b"f".to_vec(), None, Some(true), t(3)),
        Err(ErrorCode::NotDir)
    );
    assert_eq!(
        s.dir_remove(0, d, b"f".to_vec(), Some(999), None, t(3)),
        Err(ErrorCode::NotFound)
    );
    assert_eq!(s.dir_destroy(0, d), Err(ErrorCode::NotEmpty));
    let moved = s
        .dir_rename(0, d, b"f".to_vec(), b"g".to_vec(), false, false, t(4))
        .unwrap();
    assert_eq!(
        (moved.moved, moved.ctime_set, moved.replaced, moved.links),
        (Some(file), false, None, None),
        "the file's inode lives elsewhere: its ctime is the caller's to set"
    );
    assert_eq!(moved.dir, s.inode_get(0, d).unwrap());
    assert_eq!(
        s.dir_rename(0, d, b"g".to_vec(), b"s".to_vec(), true, true, t(4)),
        Err(ErrorCode::IsDir),
        "file over dir"
    );
    assert_eq!(
        s.dir_rename(0, d, b"g".to_vec(), b"s".to_vec(), false, false, t(4)),
        Err(ErrorCode::Exists)
    );
    assert_eq!(
        s.dir_remove(0, d, b"s".to_vec(), Some(sub), Some(true), t(5)),
        Ok(dir)
    );
    assert_eq!(s.inode_get(0, d).unwrap().nlink, 2);
    assert_eq!(
        s.dir_remove(0, d, b"g".to_vec(), None, Some(false), t(5)),
        Ok(file)
    );
    assert_eq!(s.dir_destroy(0, d), Ok(()));
    assert_eq!(s.dir_lookup(0, d, b"g"), Err(ErrorCode::NotFound));
    assert_eq!(
        s.dir_insert(0, d, b"late".to_vec(), file, false, t(6)),
        Err(ErrorCode::NotFound),
        "no inserts into a removed dir"
    );
    assert_eq!(s.used(), 256, "only inode 13 is left");
}

#[test]
fn listings_page_in_name_order_and_stay_in_their_directory() {
    let s = store(1 << 24);
    for d in [20, 21] {
        s.inode_create(0, inode(d, FileKind::Dir)).unwrap();
    }
    for i in 0..25u64 {
        let e = DirEntry {
            ino: far(100 + i),
            kind: FileKind::File,
        };
        s.dir_insert(0, 20, format!("n{i:02}").into_bytes(), e, false, t(1))
            .unwrap();
        s.dir_insert(0, 21, format!("m{i:02}").into_bytes(), e, false, t(1))
            .unwrap();
    }
    let mut names = Vec::new();
    let mut after = None;
    loop {
        let (page, more) = s.dir_list(0, 20, after.clone(), 10).unwrap();
        assert!(page.len() <= 10);
        after = page.last().map(|(n, _, _)| n.clone());
        names.extend(
            page.into_iter()
                .map(|(n, _, _)| String::from_utf8(n).unwrap()),
        );
        if !more {
            break;
        }
    }
    let want: Vec<_> = (0..25).map(|i| format!("n{i:02}")).collect();
    assert_eq!(names, want);
    assert_eq!(s.dir_list(0, 99, None, 10), Err(ErrorCode::NotFound));
}

#[test]
fn listings_carry_the_inodes_held_with_them_up_to_a_budget() {
    let s = store(1 << 30);
    s.inode_create(0, inode(10, FileKind::Dir)).unwrap();
    // A file placed here, one whose inode lives elsewhere, and symlinks with long targets.
    s.dir_create(0, 10, b"a".to_vec(), inode(11, FileKind::File), t(1))
        .unwrap();
    let away = DirEntry {
        ino: far(12),
        kind: FileKind::File,
    };
    s.dir_insert(0, 10, b"b".to_vec(), away, false, t(1))
        .unwrap();
    let links = 2 * DIR_PAGE_INODE_BYTES / 4096;
    for i in 0..links as u64 {
        let mut l = inode(100 + i, FileKind::Symlink);
        l.target = vec![b'x'; 4096];
        s.dir_create(0, 10, format!("l{i:04}").into_bytes(), l, t(1))
            .unwrap();
    }
    let (page, _) = s.dir_list(0, 10, None, DIR_PAGE_MAX).unwrap();
    assert_eq!(page[0].2, Some(inode(11, FileKind::File)));
    assert_eq!((page[1].1, page[1].2.clone()), (away, None));
    let with: Vec<_> = page[2..].iter().map(|(_, _, i)| i.is_some()).collect();
    assert!(
        with[0] && !with[with.len() - 1],
        "the budget stops inodes, not entries"
    );
    assert_eq!(with.len(), links);
    let carried: usize = page
        .iter()
        .filter_map(|(_, _, i)| i.as_ref())
        .map(|i| i.target.len())
        .sum();
    assert!(carried <= DIR_PAGE_INODE_BYTES);
}
