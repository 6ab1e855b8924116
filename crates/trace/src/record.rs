//! What one traced operation holds.

use std::sync::Arc;

/// Declares [`Op`] with its stable codes and names (stored in every trace's header).
macro_rules! ops {
    ($($op:ident = $code:literal $name:literal,)*) => {
        /// The operation a record is of: the kernel's requests to a FUSE mount, which the
        /// client library's calls are recorded as too.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Op {
            $($op,)*
            /// A code this reader does not know (written by a newer writer).
            Other(u8),
        }

        impl Op {
            /// Every operation this version knows, in code order.
            pub const ALL: &'static [Op] = &[$(Op::$op,)*];

            pub fn code(self) -> u8 {
                match self {
                    $(Op::$op => $code,)*
                    Op::Other(c) => c,
                }
            }

            pub fn from_code(code: u8) -> Op {
                match code {
                    $($code => Op::$op,)*
                    c => Op::Other(c),
                }
            }

            pub fn name(self) -> &'static str {
                match self {
                    $(Op::$op => $name,)*
                    Op::Other(_) => "other",
                }
            }
        }
    };
}

ops! {
    Lookup = 0 "lookup",
    Getattr = 1 "getattr",
    Setattr = 2 "setattr",
    Truncate = 3 "truncate",
    Readlink = 4 "readlink",
    Mknod = 5 "mknod",
    Mkdir = 6 "mkdir",
    Unlink = 7 "unlink",
    Rmdir = 8 "rmdir",
    Symlink = 9 "symlink",
    Rename = 10 "rename",
    Link = 11 "link",
    Open = 12 "open",
    Create = 13 "create",
    Read = 14 "read",
    Write = 15 "write",
    Flush = 16 "flush",
    Fsync = 17 "fsync",
    Release = 18 "release",
    Fallocate = 19 "fallocate",
    Opendir = 20 "opendir",
    Readdir = 21 "readdir",
    Readdirplus = 22 "readdirplus",
    Releasedir = 23 "releasedir",
    Statfs = 24 "statfs",
    Ioctl = 25 "ioctl",
    Setxattr = 26 "setxattr",
    Getxattr = 27 "getxattr",
    Listxattr = 28 "listxattr",
    Removexattr = 29 "removexattr",
    Getlk = 30 "getlk",
    Setlk = 31 "setlk",
}

impl Op {
    /// Moves file bytes (its `size` and result are byte counts).
    pub fn is_data(self) -> bool {
        matches!(self, Op::Read | Op::Write)
    }
}

/// How the file's data was handled when the request was made: the kernel reshapes a mount's
/// requests (page cache: read-ahead and page-sized writes; write-back cache: writes gathered
/// late); the client library takes them as the program made them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    #[default]
    PageCache,
    DirectIo,
    WritebackCache,
    /// A call of the client library (a Rust or Python program linked with it): no kernel.
    Library,
}

impl Mode {
    pub(crate) fn code(self) -> u8 {
        match self {
            Mode::PageCache => 0,
            Mode::DirectIo => 1,
            Mode::WritebackCache => 2,
            Mode::Library => 3,
        }
    }

    pub(crate) fn from_code(code: u8) -> Mode {
        match code {
            1 => Mode::DirectIo,
            2 => Mode::WritebackCache,
            3 => Mode::Library,
            _ => Mode::PageCache,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Mode::PageCache => "page-cache",
            Mode::DirectIo => "direct-io",
            Mode::WritebackCache => "writeback-cache",
            Mode::Library => "library",
        }
    }

    pub fn from_name(name: &str) -> Option<Mode> {
        [
            Mode::PageCache,
            Mode::DirectIo,
            Mode::WritebackCache,
            Mode::Library,
        ]
        .into_iter()
        .find(|m| m.name() == name)
    }
}

/// One operation as a producer hands it to the [`crate::Writer`]: strings borrowed, interned
/// by the writer.
#[derive(Debug, Clone, Copy)]
pub struct Event<'a> {
    pub op: Op,
    pub mode: Mode,
    /// Attributed through the open handle to the process that opened it (a write-back or
    /// read-ahead request the kernel made on its own).
    pub via_handle: bool,
    pub pid: u32,
    pub uid: u32,
    pub exe: Option<&'a [u8]>,
    pub ino: u64,
    pub path: Option<&'a [u8]>,
    /// The second name of a rename, link or symlink (for a symlink: what it points to).
    pub target: Option<&'a [u8]>,
    pub offset: u64,
    /// What the application (the kernel, for it) asked for: bytes for a read or write.
    pub size: u64,
    /// Bytes of file data the servers were asked for to serve it (a read's fetches, read
    /// ahead included; a write's or flush's stripe writes, counted once whatever the number of
    /// replicas): fewer than `size` when it was served from what an earlier request brought or
    /// left in the client's buffer, more when it read ahead or sent what earlier writes left.
    pub server_size: Option<u64>,
    /// Per operation: open flags (open, create), the rename flags, the new size's presence...
    pub flags: u32,
    /// Nanoseconds since the trace began ([`crate::Writer::now`]).
    pub start_ns: u64,
    pub end_ns: u64,
    /// At least 0: success (bytes for a read or write, entries for a listing); below 0: the
    /// negated errno.
    pub result: i64,
}

impl Event<'_> {
    /// An operation with every other field empty.
    pub fn new(op: Op) -> Self {
        Event {
            op,
            mode: Mode::PageCache,
            via_handle: false,
            pid: 0,
            uid: 0,
            exe: None,
            ino: 0,
            path: None,
            target: None,
            offset: 0,
            size: 0,
            server_size: None,
            flags: 0,
            start_ns: 0,
            end_ns: 0,
            result: 0,
        }
    }
}

/// One operation as read back from a trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub op: Op,
    pub mode: Mode,
    pub via_handle: bool,
    pub pid: u32,
    pub uid: u32,
    pub exe: Option<Arc<str>>,
    pub ino: u64,
    pub path: Option<Arc<str>>,
    pub target: Option<Arc<str>>,
    pub offset: u64,
    pub size: u64,
    pub server_size: Option<u64>,
    pub flags: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    pub result: i64,
}

impl Record {
    /// The errno it failed with, if it failed.
    pub fn errno(&self) -> Option<i32> {
        (self.result < 0).then(|| i32::try_from(-self.result).unwrap_or(i32::MAX))
    }

    pub fn duration_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }
}

/// Records lost because the writer had no room for them (or could not write them): counted,
/// between two times, where in the stream they would have been.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Gap {
    pub dropped: u64,
    pub from_ns: u64,
    pub to_ns: u64,
}
