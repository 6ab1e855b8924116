//! The store's namespace tests: links, opens, renames, creates and unlinks, directory rules and
//! listings.

use super::*;

#[test]
fn links_and_open_handles_decide_when_an_inode_goes() {
    let s = store(1 << 20);
    s.inode_create(0, inode(7, FileKind::File)).unwrap();
    assert_eq!(
        s.inode_create(0, inode(7, FileKind::File)),
        Err(ErrorCode::Exists)
    );
    assert_eq!(s.inode_open(0, 7, 1).unwrap().opens.total(), 1);
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
        s.inode_close(0, 7, 2, false),
        Ok((0, false)),
        "a holder without handles releases nothing"
    );
    assert_eq!(
        s.inode_close(0, 7, 1, false),
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
fn reservations_hand_out_the_bytes_after_the_size_one_after_another() {
    let s = store(1 << 20);
    s.inode_create(0, inode(8, FileKind::File)).unwrap();
    s.inode_extend(0, 8, 10, t(1)).unwrap();
    let ends: Vec<u64> = [5, 0, 7]
        .iter()
        .map(|&len| s.inode_reserve(0, 8, len, t(2)).unwrap().size)
        .collect();
    assert_eq!(
        ends,
        [15, 15, 22],
        "each after the size the one before left"
    );
    let i = s.inode_get(0, 8).unwrap();
    assert_eq!((i.size, i.mtime), (22, t(2)));
    assert!(
        matches!(
            s.inode_reserve(0, 8, u64::MAX - 3, t(3)),
            Err(ErrorCode::Invalid(_))
        ),
        "past what a file can hold"
    );
    assert_eq!(
        s.inode_get(0, 8).unwrap().size,
        22,
        "a refused one changes nothing"
    );
    s.inode_create(0, inode(9, FileKind::Dir)).unwrap();
    assert_eq!(s.inode_reserve(0, 9, 1, t(4)), Err(ErrorCode::IsDir));
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
    s.inode_open(0, 22, 1).unwrap();
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
