//! The store's side of leases and `tessera fsck`: handles let go per holder, scans in pages,
//! and reclaiming an inode only while nothing uses it.

use super::*;

#[test]
fn a_holder_revoked_loses_its_handles_and_an_unlinked_file_goes() {
    let s = store(1 << 20);
    s.inode_create(0, inode(7, FileKind::File)).unwrap();
    s.inode_open(0, 7, 1).unwrap();
    s.inode_open(0, 7, 1).unwrap();
    s.inode_open(0, 7, 2).unwrap();
    assert_eq!(s.open_holders(0).unwrap().len(), 2);
    assert_eq!(s.inode_link(0, 7, -1, t(1)), Ok((0, false)), "open");
    assert_eq!(s.inode_close(0, 7, 1, true), Ok((0, false)), "2 holds it");
    assert_eq!(s.inode_close(0, 7, 1, false), Ok((0, false)), "late close");
    assert_eq!(s.inode_get(0, 7).unwrap().opens.total(), 1);
    assert_eq!(s.inode_close(0, 7, 2, true), Ok((0, true)), "deleted");
    assert!(s.open_holders(0).unwrap().is_empty());
    assert_eq!((s.inode_count(), s.used()), (0, 0));
}

#[test]
fn a_scan_pages_through_a_partition_in_number_order() {
    let s = store(1 << 20);
    let inos: Vec<Ino> = (0..25).map(|i| 1000 - i * 7).collect();
    for &i in &inos {
        s.inode_create(0, inode(i, FileKind::Dir)).unwrap();
    }
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let (page, more) = s.inode_scan(0, after, 10).unwrap();
        assert!(page.len() <= 10);
        seen.extend(page.iter().map(|i| i.ino));
        after = seen.last().copied();
        if !more {
            break;
        }
    }
    let mut want = inos;
    want.sort_unstable();
    assert_eq!(seen, want);
}

#[test]
fn reclaim_takes_only_an_unchanged_unused_unnamed_inode() {
    let s = store(1 << 20);
    s.inode_create(0, inode(10, FileKind::Dir)).unwrap();
    s.dir_create(0, 10, "named".into(), inode(20, FileKind::File), t(1))
        .unwrap();
    s.inode_create(0, inode(21, FileKind::File)).unwrap();
    s.inode_create(0, inode(11, FileKind::Dir)).unwrap();
    let seen = |ino| s.inode_get(0, ino).unwrap();
    let (i10, i20, i21, i11) = (seen(10), seen(20), seen(21), seen(11));
    let reclaim = |i: &Inode| s.inode_reclaim(0, i.ino, i.change, i.ctime);
    assert_eq!(reclaim(&i20), Ok(None), "named here");
    assert_eq!(reclaim(&i10), Ok(None), "a directory with entries");
    s.inode_open(0, 21, 5).unwrap();
    assert_eq!(reclaim(&i21), Ok(None), "open");
    s.inode_close(0, 21, 5, false).unwrap();
    s.inode_extend(0, 21, 3, t(2)).unwrap();
    assert_eq!(reclaim(&i21), Ok(None), "changed since the scan");
    assert_eq!(
        reclaim(&seen(21)),
        Ok(Some((0, true))),
        "a file: drop stripes"
    );
    assert_eq!(reclaim(&i11), Ok(Some((0, false))), "an empty directory");
    assert_eq!(reclaim(&i11), Err(ErrorCode::NotFound));
    assert_eq!(s.inode_count(), 2);
}
