//! Messages. A request or response frame carries one of these as its header; bulk data (stripe
//! contents) travels beside it as the frame's raw payload.

use crate::cluster::{ClusterConfig, ClusterStatus, NodeStats, TableInfo};
use crate::scatter::Piece;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tessera_placement::{meta_partition, stripe_partition, ROOT_INO};
pub use tessera_placement::{Epoch, Ino, NodeId, PartitionId, PartitionTable};

/// A file name component: raw bytes, as POSIX allows (no '/', no NUL, at most [`NAME_MAX`]).
pub type Name = Vec<u8>;
/// Longest name component, as on Linux.
pub const NAME_MAX: usize = 255;
/// Longest symbolic link target, as `PATH_MAX` on Linux.
pub const SYMLINK_MAX: usize = 4096;
/// How long a change waits for the holder of a directory's completeness promise to give it
/// back (`Notice::Listing`, `Op::Relinquish`) before it goes ahead anyway.
pub const RECALL_PATIENCE: Duration = Duration::from_secs(2);
/// How long [`Op::RenameLock`] stays with a holder that does not give it back (it died).
pub const RENAME_LEASE: Duration = Duration::from_secs(10);
/// How long a client's open handles outlive its last lease renewal ([`Op::LeaseRenew`]) unless
/// the cluster is created with another (`ClusterConfig::open_lease_ms`).
pub const OPEN_LEASE: Duration = Duration::from_secs(30);
/// Largest number of inodes a server returns for one [`Op::InodeScan`].
pub const SCAN_PAGE_MAX: u32 = 1024;
/// Largest number of entries a server returns for one [`Op::DirList`].
pub const DIR_PAGE_MAX: u32 = 1024;
/// Inodes carried in one page of a listing, at most this many bytes of them (symlink targets
/// make them long); the rest of the page's entries come without.
pub const DIR_PAGE_INODE_BYTES: usize = 256 << 10;

/// A listed directory entry: name, entry, and its inode when that lives in the directory's
/// partition (a placed file; see `placement::placed_ino`), so a listing with attributes costs
/// no request per file.
pub type Listed = (Name, DirEntry, Option<Inode>);

/// A point in time with nanoseconds, as POSIX timestamps are.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
pub struct Timespec {
    pub secs: i64,
    pub nanos: u32,
}

impl Timespec {
    #[must_use]
    pub fn now() -> Self {
        Self::from(SystemTime::now())
    }
}

impl From<SystemTime> for Timespec {
    fn from(t: SystemTime) -> Self {
        match t.duration_since(UNIX_EPOCH) {
            Ok(d) => Self {
                secs: d.as_secs() as i64,
                nanos: d.subsec_nanos(),
            },
            Err(e) => {
                let d = e.duration();
                if d.subsec_nanos() == 0 {
                    Self {
                        secs: -(d.as_secs() as i64),
                        nanos: 0,
                    }
                } else {
                    Self {
                        secs: -(d.as_secs() as i64) - 1,
                        nanos: 1_000_000_000 - d.subsec_nanos(),
                    }
                }
            }
        }
    }
}

impl From<Timespec> for SystemTime {
    fn from(t: Timespec) -> Self {
        if t.secs >= 0 {
            UNIX_EPOCH + Duration::new(t.secs as u64, t.nanos)
        } else {
            UNIX_EPOCH - Duration::from_secs(t.secs.unsigned_abs())
                + Duration::from_nanos(u64::from(t.nanos))
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    /// Named pipes, sockets and device nodes: only a name and attributes here; each node's
    /// kernel carries their data locally (a FIFO does not connect processes on two nodes).
    Fifo,
    Socket,
    /// With the device number (`rdev`).
    CharDevice(u32),
    BlockDevice(u32),
}

/// An inode: lives in the partition [`tessera_placement::meta_partition`] of its number.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inode {
    pub ino: Ino,
    pub kind: FileKind,
    /// Permission bits, including setuid, setgid and sticky (`0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// File size in bytes: the largest extent written or the size set by truncate.
    pub size: u64,
    pub nlink: u32,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    /// For a directory, its parent (the root is its own parent); 0 otherwise.
    pub parent: Ino,
    /// For a symbolic link, its target.
    pub target: Vec<u8>,
    /// Open handles across all clients: an unlinked file keeps its data until this is zero.
    pub open_count: u32,
    /// Who holds them, by client lease ([`Op::LeaseRenew`]): kept by the servers (a copy of a
    /// partition carries it beside the inode, [`SyncItem::Inode`]), never sent to clients.
    #[serde(skip)]
    pub opens: Opens,
    /// Raised by one with every change of the inode but opens and closes (as NFSv4's change
    /// attribute): a mount keeps the pages it cached of a file whose counter is where its own
    /// last change left it.
    pub change: u64,
}

impl Inode {
    /// A new inode with one link (two for a directory: its entry and its `.`), times `now`, no
    /// open handles; a symbolic link's size is its target's length.
    #[must_use]
    pub fn new(
        ino: Ino,
        kind: FileKind,
        mode: u32,
        uid: u32,
        gid: u32,
        parent: Ino,
        target: Vec<u8>,
    ) -> Self {
        let now = Timespec::now();
        Self {
            ino,
            kind,
            mode: mode & 0o7777,
            uid,
            gid,
            size: target.len() as u64,
            nlink: if kind == FileKind::Dir { 2 } else { 1 },
            atime: now,
            mtime: now,
            ctime: now,
            parent: if kind == FileKind::Dir { parent } else { 0 },
            target,
            open_count: 0,
            opens: Opens::default(),
            change: 0,
        }
    }

    /// The inode as `DirCreate` makes it: the creator's handle, if it opened it (`open_count`
    /// 1), held under lease `holder`.
    #[must_use]
    pub fn created_by(mut self, holder: u64) -> Self {
        self.opens = Opens::default();
        if self.open_count > 0 {
            self.opens.open(holder);
        }
        self.open_count = self.opens.total();
        self
    }

    /// One more handle of `holder`.
    pub fn open_by(&mut self, holder: u64) {
        self.opens.open(holder);
        self.open_count = self.opens.total();
    }

    /// Releases one handle of `holder` ([`Opens::close`]), or with `all` every one of them.
    pub fn close_by(&mut self, holder: u64, all: bool) {
        if all {
            self.opens.revoke(holder);
        } else {
            self.opens.close(holder);
        }
        self.open_count = self.opens.total();
    }
}

/// Open handles on an inode, counted per holder: the lease number of the client that opened
/// them ([`Op::LeaseRenew`]), so that a client that stops renewing loses exactly its own.
/// Changed through [`Inode::open_by`] and [`Inode::close_by`], which keep `open_count`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Opens(Vec<(u64, u32)>);

impl Opens {
    /// Handles of every holder.
    #[must_use]
    pub fn total(&self) -> u32 {
        self.0.iter().fold(0, |n, &(_, c)| n.saturating_add(c))
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Holders with at least one handle, and how many each.
    pub fn holders(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.0.iter().copied()
    }

    fn open(&mut self, holder: u64) {
        match self.0.iter_mut().find(|(h, _)| *h == holder) {
            Some((_, c)) => *c = c.saturating_add(1),
            None => self.0.push((holder, 1)),
        }
    }

    /// Releases one handle of `holder`; a holder with none (its lease ran out) changes nothing.
    fn close(&mut self, holder: u64) {
        if let Some(at) = self.0.iter().position(|(h, _)| *h == holder) {
            self.0[at].1 -= 1;
            if self.0[at].1 == 0 {
                self.0.swap_remove(at);
            }
        }
    }

    /// Drops every handle of `holder`.
    fn revoke(&mut self, holder: u64) {
        self.0.retain(|(h, _)| *h != holder);
    }
}

/// A directory entry, stored in the partition of the directory's inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    pub ino: Ino,
    pub kind: FileKind,
}

/// Attribute changes; `None` leaves a field as it is. `ctime` is always set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// Sets the inode's size only; the client drops the stripes beyond it with
    /// [`Op::TruncateStripes`].
    pub size: Option<u64>,
    pub atime: Option<Timespec>,
    pub mtime: Option<Timespec>,
    pub ctime: Timespec,
    /// A directory moved to another parent by rename (its `..`).
    pub parent: Option<Ino>,
}

/// Operations a storage server performs. Every one is routed by the partition of its key
/// (stripe or inode) under the table epoch the request carries; the server recomputes the
/// partition and refuses a request for a partition it does not hold at that epoch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    /// Write the payload at `offset` inside a stripe (creating it; a gap reads as zeros).
    /// Applied atomically: a concurrent read sees all of it or none. Reply: `Ok`.
    WriteStripe { file: Ino, stripe: u64, offset: u32 },
    /// Write the payload, cut into `pieces` in order, each piece at its offset of a stripe
    /// (creating it; a gap reads as zeros; the bytes between pieces are left as they are).
    /// The pieces are in increasing offset order, not overlapping, inside the stripe, at most
    /// [`crate::SCATTER_PIECES_MAX`], their lengths adding up to the payload's
    /// ([`crate::check_pieces`]): else `Invalid`, and nothing is written. Applied atomically,
    /// as `WriteStripe`. Reply: `Ok`.
    WriteScatter {
        file: Ino,
        stripe: u64,
        pieces: Vec<Piece>,
    },
    /// Read up to `len` bytes at `offset` in a stripe. The reply payload may be shorter than
    /// `len` (or empty) where the stripe holds less: the client fills holes with zeros up to the
    /// file size. Reply: `Ok` with payload.
    ReadStripe {
        file: Ino,
        stripe: u64,
        offset: u32,
        len: u32,
    },
    /// Node-wide: cut every stripe of `file` held here to end at byte `size` of the file.
    TruncateStripes { file: Ino, size: u64 },
    /// Node-wide, from the server that deleted these files' inodes: delete every stripe of
    /// them held here, whatever their sizes were. Reply: `Ok`.
    DropFiles { files: Vec<Ino> },
    /// Create an inode; `Exists` if the number is taken. Reply: `Ok`.
    InodeCreate { inode: Inode },
    /// Reply: `Inode`.
    InodeGet { ino: Ino },
    /// Reply: `Inode` (the updated one).
    InodeSetAttr { ino: Ino, attr: SetAttr },
    /// Raise the size to at least `size` and set mtime/ctime (a writer's flush). Reply: `Inode`.
    InodeExtend {
        ino: Ino,
        size: u64,
        mtime: Timespec,
    },
    /// Add `len` to the size and set mtime/ctime, atomically: the bytes `[size - len, size)`
    /// of the answer are the caller's to write, no other reservation's (many clients
    /// appending to one file). Reply: `Inode`.
    InodeReserve { ino: Ino, len: u64, mtime: Timespec },
    /// Undo a writer's extend whose last bytes were not stored: if the size is still `from`
    /// (nobody extended the file since), it becomes `to`. Reply: `Inode`.
    InodeRetract { ino: Ino, from: u64, to: u64 },
    /// Add `delta` to the link count. When links and open handles both reach zero the server
    /// deletes the inode and drops its stripes in the background. Reply: `Links`.
    InodeLink {
        ino: Ino,
        delta: i32,
        ctime: Timespec,
    },
    /// Count an open handle of lease `holder` and return the inode (close-to-open: attributes
    /// fetched at open). Renews the holder's lease at the servers that apply it. Reply: `Inode`.
    InodeOpen { ino: Ino, holder: u64 },
    /// Release an open handle of `holder` (none if its lease ran out: nothing changes); may
    /// delete an unlinked inode (as `InodeLink`). Reply: `Links`.
    InodeClose { ino: Ino, holder: u64 },
    /// From the primary of the inode's partition, whose lease of `holder` ran out: drop every
    /// open handle `holder` has on `ino` (which may delete it, as `InodeClose`). Reply: `Links`.
    InodeRevoke { ino: Ino, holder: u64 },
    /// Node-wide: the client with lease number `holder` is alive, and keeps its open handles
    /// on the partitions this node holds for another lease period. Sent to every replica of
    /// the partitions of the client's open files. Reply: `Ok`; `LeaseExpired` if this node let
    /// the holder's handles go (its lease ran out before); `StaleEpoch` if the request's epoch
    /// is older than this node's table (renewed all the same: the client fetches the table and
    /// renews where its files are now).
    LeaseRenew { holder: u64 },
    /// Inodes of `partition` in number order, after `after`, at most `limit` (capped at
    /// [`SCAN_PAGE_MAX`]), for `tessera fsck`. Reply: `Inodes`.
    InodeScan {
        partition: PartitionId,
        after: Option<Ino>,
        limit: u32,
    },
    /// Delete inode `ino` (a file's stripes with it) if it is still as a scan saw it (`change`,
    /// `ctime`), no handle is open on it, no name of its partition leads to it and, for a
    /// directory, it has no entries: an inode that no name reaches (`tessera fsck`).
    /// Reply: `Reclaimed`.
    InodeReclaim {
        ino: Ino,
        change: u64,
        ctime: Timespec,
    },
    /// Add an entry to directory `dir` (whose inode lives on this node); with `replace`, an
    /// existing entry is replaced when POSIX rename allows it (file over file, dir over dir) and
    /// returned. Errors: `NotFound` (no such dir), `NotDir`, `Exists`, `IsDir`/`NotDir` on a kind
    /// mismatch. Updates the directory's mtime. Reply: `Replaced`.
    DirInsert {
        dir: Ino,
        name: Name,
        entry: DirEntry,
        replace: bool,
        mtime: Timespec,
    },
    /// Remove an entry; `expect` guards against a concurrent change, `want_dir` enforces
    /// unlink (`Some(false)` -> `IsDir`) or rmdir (`Some(true)` -> `NotDir`). Reply: `Entry`.
    DirRemove {
        dir: Ino,
        name: Name,
        expect: Option<Ino>,
        want_dir: Option<bool>,
        mtime: Timespec,
    },
    /// unlink in one step: `DirRemove` of a non-directory (`IsDir` for a directory) and, if its
    /// inode lives in this partition (a placed file), `InodeLink` -1 on it, atomically.
    /// Reply: `Unlinked`, with the directory's attributes after the removal.
    DirUnlink {
        dir: Ino,
        name: Name,
        mtime: Timespec,
    },
    /// Reply: `Found` (with the inode when it lives in the same partition, as a placed file's
    /// does), or `NotFound`.
    DirLookup { dir: Ino, name: Name },
    /// Entries of `dir` in name order, after `after`, at most `limit` (capped at
    /// [`DIR_PAGE_MAX`]). Reply: `Entries`, with the inodes held here (up to
    /// [`DIR_PAGE_INODE_BYTES`] of them).
    DirList {
        dir: Ino,
        after: Option<Name>,
        limit: u32,
    },
    /// Rename within one directory, atomically. Same replace rules as `DirInsert`, but a
    /// directory at `to` is replaced only with `replace_dir` (the caller checked it is empty;
    /// else `IsDir`). The moved inode's ctime is set, and a replaced file loses its link, here
    /// when their inodes live in this partition. Reply: `Renamed`.
    DirRename {
        dir: Ino,
        from: Name,
        to: Name,
        replace: bool,
        replace_dir: bool,
        mtime: Timespec,
    },
    /// rmdir's second half: delete directory inode `dir` if it has no entries (`NotEmpty`
    /// otherwise). From then on inserts into it fail with `NotFound`. Reply: `Ok`.
    DirDestroy { dir: Ino },
    /// `InodeCreate` and an exclusive `DirInsert` of its name, atomically: for an inode placed
    /// in the directory's partition (`placement::placed_ino`; `Invalid` otherwise). `Exists` if
    /// the name or the inode number is taken (nothing changes); else as `DirInsert`. A create
    /// that opens (`open_count` 1) holds its handle under lease `holder`.
    /// Reply: `Inode`, the directory after the insert.
    DirCreate {
        dir: Ino,
        name: Name,
        inode: Inode,
        mtime: Timespec,
        holder: u64,
    },
    /// Reply: `Stats`.
    NodeStats,
    /// From the holder of directory `dir`'s completeness promise, answering the `Listing`
    /// notice that recalled it: every create it answered early there is in. The server lets
    /// the change that recalled the promise go ahead. Reply: `Ok`.
    Relinquish { dir: Ino },
    /// Sent by `node`, which is receiving `partition`, to the partition's primary: the next
    /// page of the changes since the previous round (round 0: everything). Page 0 of a round
    /// takes a new snapshot of the partition; `from` pages through it. With `fence`, the
    /// primary refuses changes to the partition (retryable `NotReady`) until it installs a
    /// table in which the partition changed, or a few seconds pass: the last round then leaves
    /// nothing behind. Reply: `SyncPage`, the stripe bytes of its items in the payload.
    SyncPull {
        partition: PartitionId,
        node: NodeId,
        round: u32,
        from: u64,
        fence: bool,
    },
    /// Take the cluster's rename lock (at the primary of the root's partition) for `holder`, a
    /// number the caller drew. A rename that moves a directory to another parent holds it for
    /// its loop check and its changes, so two such renames cannot each pass the check and
    /// together cut a subtree off (as the kernel's per-file-system rename lock does). Waits
    /// while another holds it; a holder that neither finishes nor releases it loses it after
    /// [`RENAME_LEASE`]. Reply: `Ok`.
    RenameLock { holder: u64 },
    /// Give the rename lock back (nothing happens unless `holder` holds it). Reply: `Ok`.
    RenameUnlock { holder: u64 },
}

impl Op {
    /// The partition the operation's key (stripe, or inode or directory) hashes to in a cluster
    /// of `partitions`; `None` for node-wide operations.
    #[must_use]
    pub fn partition(&self, partitions: u32) -> Option<PartitionId> {
        let p = partitions;
        match self {
            Op::InodeScan { partition, .. } => Some(*partition),
            Op::WriteStripe { file, stripe, .. }
            | Op::WriteScatter { file, stripe, .. }
            | Op::ReadStripe { file, stripe, .. } => Some(stripe_partition(*file, *stripe, p)),
            Op::InodeCreate { inode } => Some(meta_partition(inode.ino, p)),
            Op::InodeGet { ino }
            | Op::InodeSetAttr { ino, .. }
            | Op::InodeExtend { ino, .. }
            | Op::InodeReserve { ino, .. }
            | Op::InodeRetract { ino, .. }
            | Op::InodeLink { ino, .. }
            | Op::InodeOpen { ino, .. }
            | Op::InodeClose { ino, .. }
            | Op::InodeRevoke { ino, .. }
            | Op::InodeReclaim { ino, .. } => Some(meta_partition(*ino, p)),
            Op::DirInsert { dir, .. }
            | Op::DirRemove { dir, .. }
            | Op::DirUnlink { dir, .. }
            | Op::DirLookup { dir, .. }
            | Op::DirList { dir, .. }
            | Op::DirRename { dir, .. }
            | Op::DirDestroy { dir }
            | Op::DirCreate { dir, .. }
            | Op::Relinquish { dir } => Some(meta_partition(*dir, p)),
            Op::SyncPull { partition, .. } => Some(*partition),
            Op::RenameLock { .. } | Op::RenameUnlock { .. } => Some(meta_partition(ROOT_INO, p)),
            Op::TruncateStripes { .. }
            | Op::DropFiles { .. }
            | Op::NodeStats
            | Op::LeaseRenew { .. } => None,
        }
    }
}

/// One piece of a partition's state, sent by the primary to a node receiving the partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SyncItem {
    /// A stripe whose `len` bytes come next in the payload.
    Stripe {
        file: Ino,
        index: u64,
        len: u32,
    },
    NoStripe {
        file: Ino,
        index: u64,
    },
    /// An inode and who holds its open handles.
    Inode(Inode, Opens),
    NoInode(Ino),
    Entry {
        dir: Ino,
        name: Name,
        entry: DirEntry,
    },
    NoEntry {
        dir: Ino,
        name: Name,
    },
}

/// Requests. Storage servers answer `Op`; the manager answers the rest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    Op {
        epoch: Epoch,
        op: Op,
    },
    /// A metadata change the primary of its partition forwards to the other replicas before
    /// applying it itself; replicas apply it as they would the `Op`. Reply: as for `Op`.
    Replica {
        epoch: Epoch,
        op: Op,
    },
    /// A server finished receiving a partition (to the manager). Reply: `Ok`, or `Invalid` if
    /// the table moved on and the copy is no longer wanted.
    SyncDone {
        node: NodeId,
        partition: PartitionId,
        epoch: Epoch,
    },
    /// Grow or shrink the cluster (to the manager): start `add` servers through the manager's
    /// provisioner, and drain the servers `remove` (their partitions move to the others, then
    /// they are retired). Reply: `Ok` once decided; the moves run in the background.
    Scale {
        add: u32,
        remove: Vec<NodeId>,
    },
    /// A storage server joins. Reply: `Registered`.
    Register {
        addr: SocketAddr,
        capacity: u64,
        label: Option<String>,
    },
    /// A server a restarted manager does not know claims its place (to the manager): its id,
    /// and the newest table it holds, from which the manager recovers the cluster. Reply:
    /// `Registered` with the same id, or `NotFound` if the cluster moved on without it (it
    /// must join again as a new, empty node).
    Rejoin {
        node: NodeId,
        addr: SocketAddr,
        capacity: u64,
        label: Option<String>,
        table: TableInfo,
    },
    /// Reply: `HeartbeatAck`, or `NotFound` if the manager does not know this node at this
    /// address (declared dead, or the manager restarted: see `Rejoin`).
    Heartbeat {
        node: NodeId,
        addr: SocketAddr,
        stats: NodeStats,
    },
    /// Reply: `Table`, or `NotReady` until the expected servers have joined. Servers answer it
    /// too, with the newest table they hold, so clients go on while the manager is away.
    GetTable,
    /// Reply: `Status`.
    GetStatus,
    /// From now on, tell this connection (`Notice` frames) when something it was answered
    /// changes: the attributes of an inode it got, a name it looked up in a directory (a
    /// callback promise, as AFS makes them). Reply: `Subscribed`.
    Subscribe,
    /// Make the promises answers on this connection carry to the subscribed connection
    /// `watcher` of the same server (its `Subscribed` id): a client's extra connections (a
    /// thread's own, see `lane`) then keep its cache coherent as its subscribed one does.
    /// Reply: `Ok`, or `NotFound` if that connection has ended.
    Attach {
        watcher: u64,
    },
}

/// A storage server's word to a subscribed connection (frame kind 2, request id 0) that
/// something it was answered no longer holds. Sent when the change is applied, to everyone but
/// the connection that made it (whose cache saw the change), unless the server changed more
/// than that connection asked (a size after an N-to-1 write).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Notice {
    /// Inode `ino`'s attributes changed, or it is gone. Its promise is used up: the connection
    /// hears of the inode again only after it is answered it again.
    Attr { ino: Ino },
    /// Name `name` in directory `dir` was removed or now leads elsewhere, or (to those told
    /// it did not exist) it now exists.
    Entry { dir: Ino, name: Name },
    /// Directory `dir`, which this connection made (`InodeCreate`) and was promised to hear of
    /// any name another adds to it, is about to get such a name or be removed, or the promise
    /// could not be kept: the names this connection knows of are no longer all there are.
    /// Another's change waits for the answer, `Op::Relinquish`, until the holder's creates
    /// there are in (or [`RECALL_PATIENCE`] passes).
    Listing { dir: Ino },
    /// Forget every answer from this server: it could not keep track (its queue to this
    /// connection overflowed). A client also tells itself this when a connection ends or the
    /// partition table changes (promises stay with the node that made them).
    Reset,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    Ok,
    Inode(Inode),
    Links {
        nlink: u32,
    },
    Entry(DirEntry),
    /// A looked-up entry and, if it lives in the directory's partition, its inode.
    Found {
        entry: DirEntry,
        inode: Option<Inode>,
    },
    Replaced(Option<DirEntry>),
    /// `DirRename` done. `moved`: the entry renamed (`None`: nothing changed, the names were
    /// one or led to one inode); `ctime_set`: its inode lives here and got the time. The entry
    /// overwritten, and, if its inode was here, what dropping the link did to it (as
    /// `Unlinked`); the directory after.
    Renamed {
        moved: Option<DirEntry>,
        ctime_set: bool,
        replaced: Option<DirEntry>,
        nlink: Option<u32>,
        dir: Inode,
    },
    /// The entry removed; if its inode was here, what dropping the link did to it (as
    /// `Links`; with `nlink: None` the link is the caller's to drop); the directory after.
    Unlinked {
        entry: DirEntry,
        nlink: Option<u32>,
        dir: Inode,
    },
    Entries {
        entries: Vec<Listed>,
        more: bool,
    },
    /// A page of a partition's inodes (`InodeScan`).
    Inodes {
        inodes: Vec<Inode>,
        more: bool,
    },
    /// `InodeReclaim`: whether the inode was deleted (else it was in use or changed).
    Reclaimed(bool),
    Stats(NodeStats),
    SyncPage {
        items: Vec<SyncItem>,
        /// Where the next page of this round starts; `None` when the round is complete.
        next: Option<u64>,
    },
    Registered {
        node: NodeId,
        config: ClusterConfig,
    },
    HeartbeatAck {
        epoch: Option<Epoch>,
    },
    /// To a drained server's heartbeat: it holds nothing any more and may exit.
    Retired,
    Table(TableInfo),
    Status(ClusterStatus),
    /// To `Subscribe`: the id other connections of the client name to `Attach` to this one.
    Subscribed {
        watcher: u64,
    },
    Error(ErrorCode),
}

/// Errors carried in a response. File-system errors map one to one onto POSIX errnos.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum ErrorCode {
    #[error("routed with a stale partition table (server is at epoch {current})")]
    StaleEpoch { current: Epoch },
    #[error("no such file or directory")]
    NotFound,
    #[error("file exists")]
    Exists,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("directory not empty")]
    NotEmpty,
    #[error("no space left on the cluster")]
    NoSpace,
    #[error("file name too long")]
    NameTooLong,
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("cluster not ready: {0}")]
    NotReady(String),
    #[error("server error: {0}")]
    Internal(String),
    #[error("partition {0} is lost: every copy of it was on servers that died")]
    Lost(PartitionId),
    /// The client's lease ran out (it did not renew in time): its open handles were let go.
    #[error("this client's lease ran out: its open files were closed by the servers")]
    LeaseExpired,
}

impl ErrorCode {
    /// The POSIX errno a file-system client reports for this error.
    #[must_use]
    pub fn errno(&self) -> i32 {
        match self {
            Self::NotFound => 2,                                         // ENOENT
            Self::Exists => 17,                                          // EEXIST
            Self::NotDir => 20,                                          // ENOTDIR
            Self::IsDir => 21,                                           // EISDIR
            Self::NotEmpty => 39,                                        // ENOTEMPTY
            Self::NoSpace => 28,                                         // ENOSPC
            Self::NameTooLong => 36,                                     // ENAMETOOLONG
            Self::Invalid(_) => 22,                                      // EINVAL
            Self::StaleEpoch { .. } | Self::NotReady(_) => 11,           // EAGAIN
            Self::Internal(_) | Self::Lost(_) | Self::LeaseExpired => 5, // EIO
        }
    }
}

/// Validates one name component.
pub fn check_name(name: &[u8]) -> Result<(), ErrorCode> {
    if name.len() > NAME_MAX {
        return Err(ErrorCode::NameTooLong);
    }
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0)
    {
        return Err(ErrorCode::Invalid(format!(
            "bad file name {:?}",
            String::from_utf8_lossy(name)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::NodeAddr;

    #[test]
    fn timespec_round_trip() {
        for t in [
            Timespec { secs: 0, nanos: 0 },
            Timespec {
                secs: 1_700_000_000,
                nanos: 123_456_789,
            },
            Timespec {
                secs: -5,
                nanos: 500,
            },
        ] {
            assert_eq!(Timespec::from(SystemTime::from(t)), t);
        }
    }

    proptest::proptest! {
        /// A POSIX timespec before 1970 is negative seconds plus positive nanoseconds.
        #[test]
        fn timespec_system_time_round_trip(
            secs in -(1i64 << 40)..(1i64 << 40),
            nanos in 0u32..1_000_000_000,
        ) {
            let t = Timespec { secs, nanos };
            let st = SystemTime::from(t);
            let signed_nanos = |s: SystemTime| match s.duration_since(UNIX_EPOCH) {
                Ok(d) => d.as_nanos() as i128,
                Err(e) => -(e.duration().as_nanos() as i128),
            };
            proptest::prop_assert_eq!(
                signed_nanos(st),
                i128::from(secs) * 1_000_000_000 + i128::from(nanos)
            );
            proptest::prop_assert_eq!(Timespec::from(st), t);
        }
    }

    fn info(partitions: u32, lists: Vec<Vec<NodeId>>, addrs: &[NodeId]) -> TableInfo {
        TableInfo {
            config: ClusterConfig::new(partitions, 1 << 20, 2),
            table: PartitionTable::new(1, lists).unwrap(),
            nodes: addrs
                .iter()
                .map(|&id| NodeAddr {
                    id,
                    addr: SocketAddr::from(([127, 0, 0, 1], 7000 + id as u16)),
                })
                .collect(),
        }
    }

    #[test]
    fn a_table_info_fits_its_cluster_and_names_every_node_it_lists() {
        let good = info(2, vec![vec![1, 2], vec![2, 1]], &[1, 2, 3]);
        assert_eq!(good.check(2), Ok(()));
        let decode = |i: &TableInfo| {
            postcard::from_bytes::<TableInfo>(&postcard::to_allocvec(i).unwrap()).map_err(|_| ())
        };
        assert_eq!(decode(&good), Ok(good.clone()));
        assert!(good.check(3).is_err(), "another cluster's partition count");
        let unknown = info(2, vec![vec![1, 2], vec![2, 4]], &[1, 2]);
        assert!(unknown.check(2).unwrap_err().contains("node 4"));
        assert!(
            decode(&unknown).is_err(),
            "decoded with a node without address"
        );
        let mut torn = good;
        torn.config.partitions = 3;
        assert!(torn.check(2).is_err() && torn.check(3).is_err());
        assert!(decode(&torn).is_err());
    }

    #[test]
    fn opens_are_counted_per_holder_and_kept_from_clients() {
        let mut file = Inode::new(5, FileKind::File, 0o644, 0, 0, 0, Vec::new());
        file.open_count = 1;
        let mut i = file.created_by(7);
        i.open_by(7);
        i.open_by(9);
        assert_eq!((i.open_count, i.opens.total()), (3, 3));
        i.close_by(8, false);
        assert_eq!(i.open_count, 3, "a holder without handles closes nothing");
        i.close_by(7, true);
        assert_eq!(i.opens.holders().collect::<Vec<_>>(), vec![(9, 1)]);
        let sent: Inode = postcard::from_bytes(&postcard::to_allocvec(&i).unwrap()).unwrap();
        assert_eq!((sent.open_count, sent.opens.is_empty()), (1, true));
        i.close_by(9, false);
        i.close_by(9, false);
        assert!(i.opens.is_empty() && i.open_count == 0);
    }

    #[test]
    fn names() {
        assert!(check_name(b"a.txt").is_ok());
        assert_eq!(check_name(&[b'x'; 256]), Err(ErrorCode::NameTooLong));
        for bad in [&b""[..], b".", b"..", b"a/b", b"a\0"] {
            assert!(matches!(check_name(bad), Err(ErrorCode::Invalid(_))));
        }
    }
}
