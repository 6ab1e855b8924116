//! Structural requests sent raw with the cluster secret (issue 28), to a real cluster with
//! mirrors: the servers refuse those that would break the namespace, decide the same way on
//! every copy, and the namespace goes on working. Then a request-level fuzzer: random but
//! well-formed metadata requests, after which the namespace must still be a tree.
//!
//! The fuzzer runs a few fixed seeds; `TESSERA_FUZZ_SEEDS=7,8,9` picks others (a failure
//! names its seed, which replays exactly) and `TESSERA_FUZZ_ITERS=N` sends N requests a seed.

use anyhow::{bail, ensure, Context, Result};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;
use tessera_client::{
    Client, ClientOptions, DirEntry, ErrorCode, FileKind, Inode, OpenOptions, SetAttr, Timespec,
};
use tessera_placement::{meta_partition, placed_ino, Ino, PLACED_INO, ROOT_INO};
use tessera_proto::{check_name, Op, Response, DIR_PAGE_MAX};
use tessera_testkit::{Cluster, ClusterSpec, Raw};

const EINVAL: i32 = 22;

fn spec() -> ClusterSpec {
    ClusterSpec {
        servers: 3,
        replication: 2,
        memory: "256MiB".into(),
        partitions: 32,
        ..ClusterSpec::default()
    }
}

/// A cluster, a client of it that caches no directory, and a raw sender.
async fn start() -> Result<(Cluster, Client, Raw)> {
    let cluster = tokio::task::spawn_blocking(|| Cluster::start(&spec())).await??;
    let mut opts = ClientOptions::new(cluster.manager, &cluster.secret);
    opts.dir_cache_ttl = Duration::ZERO;
    let client = Client::connect(opts).await?;
    let raw = Raw::connect(cluster.manager, &cluster.secret).await?;
    Ok((cluster, client, raw))
}

fn same_error(a: &ErrorCode, b: &ErrorCode) -> bool {
    std::mem::discriminant(a) == std::mem::discriminant(b)
}

/// Sends `op` raw and expects it refused with `want` (any message, for `Invalid`).
async fn refused(raw: &mut Raw, op: Op, want: ErrorCode) -> Result<()> {
    match raw.call(&op).await? {
        Response::Error(e) if same_error(&e, &want) => Ok(()),
        other => bail!("{op:?}: expected {want:?}, got {other:?}"),
    }
}

fn invalid() -> ErrorCode {
    ErrorCode::Invalid(String::new())
}

fn dir_inode(ino: Ino, parent: Ino) -> Inode {
    Inode::new(ino, FileKind::Dir, 0o755, 0, 0, parent, Vec::new())
}

fn insert(dir: Ino, name: &[u8], ino: Ino, kind: FileKind) -> Op {
    Op::DirInsert {
        dir,
        name: name.to_vec(),
        entry: DirEntry { ino, kind },
        replace: false,
        mtime: Timespec::default(),
    }
}

fn set(ino: Ino, attr: SetAttr) -> Op {
    Op::InodeSetAttr { ino, attr }
}

/// A file written, read back, renamed within and across directories and removed, in a new
/// directory `name` of the root, which is then removed too.
async fn ordinary_ops_work(c: &Client, name: &str) -> Result<()> {
    let dir = format!("/{name}");
    c.create_dir(&dir).await?;
    c.create_dir(&format!("{dir}/sub")).await?;
    let (a, b, moved) = (
        format!("{dir}/a"),
        format!("{dir}/b"),
        format!("{dir}/sub/c"),
    );
    c.write(&a, b"still a file system").await?;
    ensure!(c.read(&a).await? == b"still a file system");
    c.rename_path(&a, &b).await?;
    c.rename_path(&b, &moved).await?;
    let mut f = c.open(&moved, &OpenOptions::read()).await?;
    ensure!(f.read_to_end().await? == b"still a file system");
    f.close().await?;
    c.remove_file(&moved).await?;
    c.remove_dir(&format!("{dir}/sub")).await?;
    c.remove_dir(&dir).await?;
    ensure!(c.stat(&dir).await.is_err(), "{dir} is still there");
    Ok(())
}

/// Every copy of `dir`'s partition lists the same entries, and every copy of each inode's
/// partition holds the same inode: the copies decided every request alike.
async fn copies_agree(raw: &mut Raw, dirs: &[Ino], inodes: &[Ino]) -> Result<()> {
    let reads = dirs
        .iter()
        .map(|&dir| Op::DirList {
            dir,
            after: None,
            limit: DIR_PAGE_MAX,
        })
        .chain(inodes.iter().map(|&ino| Op::InodeGet { ino }));
    for op in reads {
        let answers = raw.everywhere(&op).await?;
        ensure!(
            answers.windows(2).all(|w| w[0] == w[1]),
            "the copies differ on {op:?}: {answers:?}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_root_can_be_neither_removed_nor_replaced() -> Result<()> {
    let (_cluster, c, mut raw) = start().await?;
    // Empty, as in a new cluster, and reached by no name.
    refused(&mut raw, Op::DirDestroy { dir: ROOT_INO }, invalid()).await?;
    let root = c.getattr(ROOT_INO).await?;
    let reclaim = Op::InodeReclaim {
        ino: ROOT_INO,
        change: root.change,
        ctime: root.ctime,
    };
    refused(&mut raw, reclaim, invalid()).await?;
    let d = c.create_dir("/d").await?.ino;
    let device = Inode::new(
        ROOT_INO,
        FileKind::CharDevice(0),
        0o600,
        0,
        0,
        0,
        Vec::new(),
    );
    refused(&mut raw, Op::InodeCreate { inode: device }, invalid()).await?;
    let again = dir_inode(ROOT_INO, ROOT_INO);
    refused(
        &mut raw,
        Op::InodeCreate { inode: again },
        ErrorCode::Exists,
    )
    .await?;
    let unlink = Op::InodeLink {
        ino: ROOT_INO,
        delta: -2,
        ctime: Timespec::default(),
    };
    refused(&mut raw, unlink, invalid()).await?;
    let reparent = SetAttr {
        parent: Some(d),
        ..SetAttr::default()
    };
    refused(&mut raw, set(ROOT_INO, reparent), invalid()).await?;
    refused(
        &mut raw,
        insert(d, b"up", ROOT_INO, FileKind::Dir),
        invalid(),
    )
    .await?;

    let root = c.getattr(ROOT_INO).await?;
    ensure!(
        (root.kind, root.parent) == (FileKind::Dir, ROOT_INO),
        "{root:?}"
    );
    ensure!(c.read_dir("/d").await?.is_empty());
    copies_agree(&mut raw, &[ROOT_INO, d], &[ROOT_INO, d]).await?;
    ordinary_ops_work(&c, "after").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn numbers_are_not_reused_and_kinds_never_change() -> Result<()> {
    let (_cluster, c, mut raw) = start().await?;
    let d = c.create_dir("/d").await?.ino;
    c.write("/d/f", b"hello").await?;
    let f = c.stat("/d/f").await?.ino;
    let l = c.symlink_path("/d/f", "/d/l").await?.ino;

    refused(
        &mut raw,
        Op::InodeCreate {
            inode: dir_inode(d, ROOT_INO),
        },
        ErrorCode::Exists,
    )
    .await?;
    let create = |name: &[u8], inode| Op::DirCreate {
        dir: d,
        name: name.to_vec(),
        inode,
        mtime: Timespec::default(),
        holder: 1,
    };
    let as_link = Inode::new(f, FileKind::Symlink, 0o777, 0, 0, 0, b"x".to_vec());
    refused(&mut raw, create(b"g", as_link), ErrorCode::Exists).await?;
    let as_dir = Inode::new(f, FileKind::Dir, 0o755, 0, 0, d, Vec::new());
    refused(&mut raw, create(b"h", as_dir), invalid()).await?;
    let file_alone = Inode::new(f ^ 1, FileKind::File, 0o644, 0, 0, 0, Vec::new());
    refused(&mut raw, Op::InodeCreate { inode: file_alone }, invalid()).await?;
    let resize = SetAttr {
        size: Some(0),
        ..SetAttr::default()
    };
    refused(&mut raw, set(d, resize.clone()), ErrorCode::IsDir).await?;
    refused(&mut raw, set(l, resize.clone()), invalid()).await?;
    let extend = Op::InodeExtend {
        ino: l,
        size: 99,
        mtime: Timespec::default(),
    };
    refused(&mut raw, extend, invalid()).await?;
    // Through the library, as errnos.
    let e = c.setattr(l, resize).await.unwrap_err();
    ensure!(e.errno() == EINVAL, "{e}");

    ensure!(c.stat("/d").await?.kind == FileKind::Dir);
    ensure!(c.read("/d/f").await? == b"hello");
    ensure!(c.read_link("/d/l").await? == b"/d/f");
    copies_agree(&mut raw, &[d], &[d, f, l]).await?;
    ordinary_ops_work(&c, "after").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_lead_to_inodes_of_their_kind_and_full_directories_stay() -> Result<()> {
    let (_cluster, c, mut raw) = start().await?;
    let d = c.create_dir("/d").await?.ino;
    c.write("/d/f", b"hello").await?;
    let f = c.stat("/d/f").await?.ino;
    let partitions = raw.info().config.partitions;
    let ghost = placed_ino(meta_partition(d, partitions), 12345, partitions);
    refused(
        &mut raw,
        insert(d, b"ghost", ghost, FileKind::File),
        ErrorCode::NotFound,
    )
    .await?;
    refused(&mut raw, insert(d, b"k", f, FileKind::Symlink), invalid()).await?;
    refused(&mut raw, insert(d, b"k", f, FileKind::Dir), invalid()).await?;
    refused(&mut raw, insert(d, b"k", d, FileKind::Dir), invalid()).await?;
    refused(&mut raw, insert(d, b"k", 77, FileKind::File), invalid()).await?;
    refused(&mut raw, Op::DirDestroy { dir: d }, ErrorCode::NotEmpty).await?;

    // One link dropped too many leaves a named file where it is.
    let drop = Op::InodeLink {
        ino: f,
        delta: -1,
        ctime: Timespec::default(),
    };
    ensure!(matches!(
        raw.call(&drop).await?,
        Response::Links { nlink: 0 }
    ));
    ensure!(c.read("/d/f").await? == b"hello");
    c.remove_file("/d/f").await?;
    ensure!(c.stat("/d/f").await.is_err());

    // A directory destroyed by its first half of rmdir alone: its name can still be removed.
    let e = c.create_dir("/d/e").await?.ino;
    ensure!(raw.call(&Op::DirDestroy { dir: e }).await? == Response::Ok);
    c.remove_dir("/d/e").await?;
    copies_agree(&mut raw, &[ROOT_INO, d], &[d]).await?;
    ordinary_ops_work(&c, "after").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_names_are_refused_everywhere() -> Result<()> {
    let (_cluster, c, mut raw) = start().await?;
    let d = c.create_dir("/d").await?.ino;
    c.write("/d/f", b"x").await?;
    let f = c.stat("/d/f").await?.ino;
    let partitions = raw.info().config.partitions;
    let long = vec![b'x'; 256];
    for (k, name) in [&b""[..], b".", b"..", b"a/b", b"a\0b", &long]
        .into_iter()
        .enumerate()
    {
        let want = if name.len() > 255 {
            ErrorCode::NameTooLong
        } else {
            invalid()
        };
        refused(&mut raw, insert(d, name, f, FileKind::File), want.clone()).await?;
        let inode = Inode::new(
            placed_ino(meta_partition(d, partitions), k as u64, partitions),
            FileKind::File,
            0o644,
            0,
            0,
            0,
            Vec::new(),
        );
        let create = Op::DirCreate {
            dir: d,
            name: name.to_vec(),
            inode,
            mtime: Timespec::default(),
            holder: 1,
        };
        refused(&mut raw, create, want.clone()).await?;
        let rename = Op::DirRename {
            dir: d,
            from: b"f".to_vec(),
            to: name.to_vec(),
            replace: true,
            replace_dir: false,
            mtime: Timespec::default(),
        };
        refused(&mut raw, rename, want).await?;
    }
    let names: Vec<Vec<u8>> = c.read_dir("/d").await?.into_iter().map(|e| e.0).collect();
    ensure!(names == [b"f"], "{names:?}");
    copies_agree(&mut raw, &[d], &[d, f]).await?;
    ordinary_ops_work(&c, "after").await
}

// ---- the request-level fuzzer ----

/// What the fuzzer knows of the namespace it made, to send requests that mostly make sense: a
/// directory is made and named in either order (as `mkdir` and a rename do), files are made
/// with their names, and names are drawn from few, so that they meet.
///
/// A directory is never given a name while it has one: no server can see that (the name and
/// the directory live in different partitions), see `SEMANTICS.md`.
struct Model {
    rng: StdRng,
    partitions: u32,
    /// Directories made (and not destroyed), the root first.
    dirs: Vec<Ino>,
    /// Of those, the ones without a name.
    unnamed: Vec<Ino>,
    /// Numbers of directories named but not made (or destroyed).
    dangling: Vec<Ino>,
    files: Vec<(Ino, FileKind)>,
    names: BTreeMap<Ino, Vec<Vec<u8>>>,
    /// Every number used so far.
    used: HashSet<Ino>,
}

const NAMES: [&[u8]; 8] = [b"a", b"b", b"c", b"dd", b"e.txt", b"f f", b"g", b"h"];

impl Model {
    fn new(seed: u64, partitions: u32) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed),
            partitions,
            dirs: vec![ROOT_INO],
            unnamed: Vec::new(),
            dangling: Vec::new(),
            files: Vec::new(),
            names: BTreeMap::new(),
            used: HashSet::from([ROOT_INO]),
        }
    }

    fn fresh_dir_number(&mut self) -> Ino {
        loop {
            let ino = self.rng.gen_range(2..PLACED_INO);
            if self.used.insert(ino) {
                return ino;
            }
        }
    }

    fn fresh_placed(&mut self, dir: Ino) -> Ino {
        loop {
            let ino = placed_ino(
                meta_partition(dir, self.partitions),
                self.rng.gen(),
                self.partitions,
            );
            if self.used.insert(ino) {
                return ino;
            }
        }
    }

    fn dir(&mut self) -> Ino {
        match self.rng.gen_range(0..20) {
            0 => ROOT_INO,
            1 => self.rng.gen(),
            2 => self.any_ino(),
            _ => *self.dirs.choose(&mut self.rng).expect("the root"),
        }
    }

    /// A number: one used, the root, or one never seen, of either sort.
    fn any_ino(&mut self) -> Ino {
        match self.rng.gen_range(0..10) {
            0 => ROOT_INO,
            1 => self.rng.gen_range(0..PLACED_INO),
            2 => PLACED_INO | self.rng.gen_range(0..PLACED_INO),
            3 | 4 if !self.files.is_empty() => self.files.choose(&mut self.rng).expect("some").0,
            _ => *self.dirs.choose(&mut self.rng).expect("the root"),
        }
    }

    fn kind(&mut self) -> FileKind {
        match self.rng.gen_range(0..7) {
            0 => FileKind::Dir,
            1 => FileKind::Symlink,
            2 => FileKind::Fifo,
            3 => FileKind::Socket,
            4 => FileKind::CharDevice(self.rng.gen()),
            5 => FileKind::BlockDevice(self.rng.gen()),
            _ => FileKind::File,
        }
    }

    fn name(&mut self, dir: Ino) -> Vec<u8> {
        let known = self.names.get(&dir).and_then(|n| n.choose(&mut self.rng));
        match (self.rng.gen_range(0..10), known) {
            (0, _) => [&b""[..], b".", b"..", b"x/y", b"n\0", &[b'l'; 256]]
                .choose(&mut self.rng)
                .expect("some")
                .to_vec(),
            (1..=5, Some(n)) => n.clone(),
            _ => NAMES.choose(&mut self.rng).expect("some").to_vec(),
        }
    }

    fn time(&mut self) -> Timespec {
        Timespec {
            secs: self.rng.gen_range(0..2_000_000_000),
            nanos: self.rng.gen_range(0..1_000_000_000),
        }
    }

    /// A new inode as a client would make it, now and then misshapen.
    fn inode(&mut self, ino: Ino, kind: FileKind, parent: Ino) -> Inode {
        let target = if kind == FileKind::Symlink {
            b"/some/where".to_vec()
        } else {
            Vec::new()
        };
        let mut i = Inode::new(
            ino,
            kind,
            self.rng.gen_range(0..0o10000),
            0,
            0,
            parent,
            target,
        );
        let t = self.time();
        (i.atime, i.mtime, i.ctime) = (t, t, t);
        match self.rng.gen_range(0..12) {
            0 => i.nlink = self.rng.gen_range(0..4),
            1 => i.open_count = self.rng.gen_range(0..3),
            2 => i.size = self.rng.gen_range(0..100),
            3 => i.parent = self.any_ino(),
            4 => i.mode |= 0o40000,
            _ => {}
        }
        i
    }

    /// A directory without a name: made, or not yet.
    fn nameless_dir(&mut self) -> Ino {
        match self.unnamed.choose(&mut self.rng) {
            Some(&d) if self.rng.gen_range(0..4) > 0 => d,
            _ => self.fresh_dir_number(),
        }
    }

    /// An entry: of a known file (its kind, now and then another), or of a directory without
    /// a name.
    fn entry(&mut self) -> DirEntry {
        match self.rng.gen_range(0..6) {
            0 | 1 => DirEntry {
                ino: self.nameless_dir(),
                kind: FileKind::Dir,
            },
            2 => {
                let (ino, kind) = (self.any_ino(), self.kind());
                // A directory of the same sort named twice is what no server can see.
                let named_dir = kind == FileKind::Dir && ino & PLACED_INO == 0 && ino > ROOT_INO;
                DirEntry {
                    ino,
                    kind: if named_dir { FileKind::File } else { kind },
                }
            }
            _ => match self.files.choose(&mut self.rng).copied() {
                Some((ino, kind)) if self.rng.gen_range(0..8) > 0 => DirEntry { ino, kind },
                Some((ino, _)) => DirEntry {
                    ino,
                    kind: self.kind(),
                },
                None => DirEntry {
                    ino: self.nameless_dir(),
                    kind: FileKind::Dir,
                },
            },
        }
    }

    fn op(&mut self) -> Op {
        let mtime = self.time();
        match self.rng.gen_range(0..16) {
            0 | 1 => {
                let parent = self.dir();
                let ino = match (
                    self.rng.gen_range(0..6),
                    self.dangling.choose(&mut self.rng),
                ) {
                    (0, _) => self.any_ino(),
                    (1..=3, Some(&d)) => d,
                    _ => self.fresh_dir_number(),
                };
                let kind = if self.rng.gen_range(0..6) == 0 {
                    self.kind()
                } else {
                    FileKind::Dir
                };
                Op::InodeCreate {
                    inode: self.inode(ino, kind, parent),
                }
            }
            2..=4 => {
                let dir = self.dir();
                let ino = match self.rng.gen_range(0..8) {
                    0 => self.any_ino(),
                    _ => self.fresh_placed(dir),
                };
                let kind = match self.kind() {
                    FileKind::Dir if self.rng.gen_range(0..4) > 0 => FileKind::File,
                    k => k,
                };
                Op::DirCreate {
                    dir,
                    name: self.name(dir),
                    inode: self.inode(ino, kind, 0),
                    mtime,
                    holder: self.rng.gen_range(1..3),
                }
            }
            5 | 6 => {
                let dir = self.dir();
                Op::DirInsert {
                    dir,
                    name: self.name(dir),
                    entry: self.entry(),
                    replace: self.rng.gen(),
                    mtime,
                }
            }
            7 => {
                let dir = self.dir();
                let expect = self.rng.gen::<bool>().then(|| self.any_ino());
                Op::DirRemove {
                    dir,
                    name: self.name(dir),
                    expect,
                    want_dir: [None, Some(false), Some(true)]
                        .choose(&mut self.rng)
                        .copied()
                        .flatten(),
                    mtime,
                }
            }
            8 => {
                let dir = self.dir();
                Op::DirUnlink {
                    dir,
                    name: self.name(dir),
                    mtime,
                }
            }
            9 => {
                let dir = self.dir();
                Op::DirRename {
                    dir,
                    from: self.name(dir),
                    to: self.name(dir),
                    replace: self.rng.gen(),
                    replace_dir: self.rng.gen(),
                    mtime,
                }
            }
            10 => Op::DirDestroy { dir: self.dir() },
            11 => Op::InodeLink {
                ino: self.any_ino(),
                delta: self.rng.gen_range(-3..=3),
                ctime: mtime,
            },
            12 => {
                let ino = self.any_ino();
                let attr = SetAttr {
                    mode: self.rng.gen::<bool>().then(|| self.rng.gen()),
                    uid: self.rng.gen::<bool>().then(|| self.rng.gen()),
                    size: (self.rng.gen_range(0..4) == 0).then(|| self.rng.gen_range(0..1 << 20)),
                    mtime: Some(mtime),
                    ctime: mtime,
                    parent: (self.rng.gen_range(0..4) == 0).then(|| self.dir()),
                    ..SetAttr::default()
                };
                Op::InodeSetAttr { ino, attr }
            }
            13 if self.rng.gen::<bool>() => Op::InodeExtend {
                ino: self.any_ino(),
                size: self.rng.gen_range(0..1 << 30),
                mtime,
            },
            13 => Op::InodeReserve {
                ino: self.any_ino(),
                len: self.rng.gen_range(0..1 << 30),
                mtime,
            },
            14 => {
                let ino = self.any_ino();
                let holder = self.rng.gen_range(1..3);
                match self.rng.gen_range(0..4) {
                    0 => Op::InodeOpen { ino, holder },
                    1 => Op::InodeClose { ino, holder },
                    2 => Op::InodeRevoke { ino, holder },
                    _ => {
                        let now = self.time();
                        Op::InodeReclaim {
                            ino,
                            change: self.rng.gen_range(0..3),
                            ctime: now,
                        }
                    }
                }
            }
            _ => {
                let dir = self.dir();
                let name = self.name(dir);
                [
                    Op::DirLookup { dir, name },
                    Op::DirList {
                        dir,
                        after: None,
                        limit: self.rng.gen_range(0..3),
                    },
                    Op::InodeGet {
                        ino: self.any_ino(),
                    },
                    Op::Relinquish { dir },
                ]
                .choose(&mut self.rng)
                .expect("some")
                .clone()
            }
        }
    }

    /// Learns what a request that succeeded made or undid.
    fn learn(&mut self, op: &Op, answer: &Response) {
        match op {
            Op::InodeCreate { inode } => {
                self.dirs.push(inode.ino);
                if let Some(k) = self.dangling.iter().position(|&d| d == inode.ino) {
                    self.dangling.swap_remove(k);
                } else {
                    self.unnamed.push(inode.ino);
                }
            }
            Op::DirCreate {
                dir, name, inode, ..
            } => {
                self.named(*dir, name);
                self.files.push((inode.ino, inode.kind));
            }
            Op::DirInsert {
                dir, name, entry, ..
            } => {
                self.named(*dir, name);
                if entry.kind == FileKind::Dir {
                    if let Some(k) = self.unnamed.iter().position(|&d| d == entry.ino) {
                        self.unnamed.swap_remove(k);
                    } else {
                        self.dangling.push(entry.ino);
                    }
                }
                if let Response::Replaced(Some(old)) = answer {
                    self.unnamed_now(old, entry.ino);
                }
            }
            Op::DirRemove { .. } => {
                if let Response::Entry(old) = answer {
                    self.unnamed_now(old, 0);
                }
            }
            Op::DirRename { dir, to, .. } => {
                self.named(*dir, to);
                if let Response::Renamed {
                    moved: Some(moved),
                    replaced: Some(old),
                    ..
                } = answer
                {
                    self.unnamed_now(old, moved.ino);
                }
            }
            Op::DirDestroy { dir } => {
                self.dirs.retain(|d| d != dir);
                match self.unnamed.iter().position(|d| d == dir) {
                    Some(k) => drop(self.unnamed.swap_remove(k)),
                    None => self.dangling.push(*dir),
                }
            }
            _ => {}
        }
    }

    fn named(&mut self, dir: Ino, name: &[u8]) {
        let names = self.names.entry(dir).or_default();
        if !names.iter().any(|n| n == name) {
            names.push(name.to_vec());
        }
    }

    /// A directory's name was removed or replaced (by one for `kept`, which keeps its own).
    fn unnamed_now(&mut self, old: &DirEntry, kept: Ino) {
        if old.kind != FileKind::Dir || old.ino == kept {
            return;
        }
        self.dangling.retain(|&d| d != old.ino);
        if self.dirs.contains(&old.ino) {
            self.unnamed.push(old.ino);
        }
    }
}

/// What walking the namespace from the root found, beyond what must hold.
#[derive(Debug, Default)]
struct Walk {
    dirs: Vec<Ino>,
    inodes: Vec<Ino>,
    /// Names of directories gone (destroyed by a first half of rmdir alone): `(dir, name)`.
    gone_dirs: Vec<(Ino, Vec<u8>)>,
    /// Names whose inode lives on another server and is missing, or of another kind: the
    /// caller's word there (see `SEMANTICS.md`).
    remote_unsure: usize,
}

/// Walks the namespace from the root and checks that it is a tree: the root a directory that
/// is its own parent, every name valid and never the root's or its directory's, every entry of
/// the sort its number says, every directory reached by one name only, every name whose inode
/// lives in its directory's partition leading to an inode of the entry's kind.
async fn walk(c: &Client, partitions: u32) -> Result<Walk> {
    let root = c.getattr(ROOT_INO).await.context("the root")?;
    ensure!(
        (root.kind, root.parent) == (FileKind::Dir, ROOT_INO),
        "root: {root:?}"
    );
    let mut w = Walk::default();
    let mut seen = HashSet::from([ROOT_INO]);
    let mut queue = vec![ROOT_INO];
    while let Some(dir) = queue.pop() {
        w.dirs.push(dir);
        let listed = c.readdir_all(dir).await;
        for (name, entry, inode) in listed.with_context(|| format!("listing {dir}"))? {
            let at = format!("{:?} in {dir}: {entry:?}", String::from_utf8_lossy(&name));
            check_name(&name).map_err(|e| anyhow::anyhow!("{at}: {e}"))?;
            ensure!(entry.ino != ROOT_INO && entry.ino != dir, "{at}");
            let is_dir = entry.kind == FileKind::Dir;
            ensure!(
                is_dir == (entry.ino & PLACED_INO == 0),
                "{at}: numbered otherwise"
            );
            let found = match inode {
                Some(i) => Some(i),
                None => match c.getattr(entry.ino).await {
                    Ok(i) => Some(i),
                    Err(e) if e.is(&ErrorCode::NotFound) => None,
                    Err(e) => return Err(e).context(at),
                },
            };
            let here = meta_partition(entry.ino, partitions) == meta_partition(dir, partitions);
            match &found {
                Some(i) if i.kind == entry.kind => w.inodes.push(i.ino),
                None if is_dir => w.gone_dirs.push((dir, name.clone())),
                _ if here => bail!("{at} leads to {found:?}"),
                _ => w.remote_unsure += 1,
            }
            if is_dir && found.is_some() {
                ensure!(seen.insert(entry.ino), "{at}: a second name of a directory");
                queue.push(entry.ino);
            }
        }
    }
    Ok(w)
}

/// One seed's run: `iters` random requests, then the checks.
async fn fuzz(seed: u64, iters: usize) -> Result<()> {
    let (_cluster, c, mut raw) = start().await?;
    let partitions = raw.info().config.partitions;
    let mut model = Model::new(seed, partitions);
    let mut log = Vec::new();
    for _ in 0..iters {
        let op = model.op();
        let answer = raw.call(&op).await?;
        log.push(format!("{op:?} -> {answer:?}"));
        match &answer {
            Response::Error(ErrorCode::Internal(_) | ErrorCode::Lost(_)) => {
                bail!("the servers failed: {}", log.join("\n"))
            }
            Response::Error(_) => {}
            _ => model.learn(&op, &answer),
        }
    }
    let checked = async {
        let w = walk(&c, partitions).await?;
        copies_agree(&mut raw, &w.dirs, &w.inodes).await?;
        for (dir, name) in &w.gone_dirs {
            let removed = c.rmdir(*dir, name).await;
            removed.with_context(|| format!("rmdir {name:?} in {dir}"))?;
        }
        let ordinary = ordinary_ops_work(&c, &format!("check-{seed}")).await;
        ordinary.context("ordinary operations")?;
        let again = walk(&c, partitions).await?;
        ensure!(again.gone_dirs.is_empty(), "{:?}", again.gone_dirs);
        eprintln!(
            "seed {seed}: {} directories, {} inodes, {} removed directories' names, {} names \
             of inodes elsewhere missing or of another kind",
            w.dirs.len(),
            w.inodes.len(),
            w.gone_dirs.len(),
            w.remote_unsure
        );
        Ok::<_, anyhow::Error>(())
    };
    checked
        .await
        .with_context(|| format!("seed {seed}, requests:\n{}", log.join("\n")))
}

fn env_list(name: &str) -> Option<Vec<u64>> {
    let v = std::env::var(name).ok()?;
    Some(v.split(',').filter_map(|s| s.trim().parse().ok()).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_requests_leave_a_namespace_that_is_a_tree() -> Result<()> {
    let seeds = env_list("TESSERA_FUZZ_SEEDS").unwrap_or_else(|| vec![1, 2, 3]);
    let iters = env_list("TESSERA_FUZZ_ITERS")
        .and_then(|v| v.first().copied())
        .unwrap_or(600) as usize;
    for seed in seeds {
        fuzz(seed, iters).await?;
    }
    Ok(())
}
