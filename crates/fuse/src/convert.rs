//! Translations between the client's types and the kernel's: attributes, file types, times,
//! names, error numbers and open(2) flags. Pure.

use fuser::{Errno, FileAttr, FileType, INodeNo, TimeOrNow};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::SystemTime;
use tessera_client::{Error, ErrorCode, FileKind, Inode, Name, OpenOptions, SetAttr, Timespec};

/// `st_blksize` of files: Python sizes its buffers by it, so with the stripe size (1 MiB) every
/// small read at a random offset copied 1 MiB (2 K/s, against 65-80 K/s at 128 KiB), and
/// reading back 8 KiB at a time ran at 2 GB/s against 4.7-6 (BENCHMARKS.md). coreutils use
/// 128 KiB buffers for the same trade; the kernel still reads ahead in 1 MiB requests.
const PREFERRED_IO: u32 = 128 << 10;
/// `st_blksize` of directories: glibc sizes `opendir`'s buffer by it (up to 1 MiB), and larger
/// buffers list faster: `scandir` with attributes, 20 000 entries, 165-173 K/s at 1 MiB
/// against 112-123 K/s at 128 KiB.
const PREFERRED_LISTING: u32 = 1 << 20;

/// The kernel's attributes of `i`.
pub(crate) fn attr(i: &Inode) -> FileAttr {
    FileAttr {
        ino: INodeNo(i.ino),
        size: i.size,
        blocks: i.size.div_ceil(512),
        atime: time(i.atime),
        mtime: time(i.mtime),
        ctime: time(i.ctime),
        crtime: time(i.ctime),
        kind: file_type(i.kind),
        perm: (i.mode & 0o7777) as u16,
        nlink: i.nlink,
        uid: i.uid,
        gid: i.gid,
        rdev: match i.kind {
            FileKind::CharDevice(rdev) | FileKind::BlockDevice(rdev) => rdev,
            _ => 0,
        },
        blksize: if i.kind == FileKind::Dir {
            PREFERRED_LISTING
        } else {
            PREFERRED_IO
        },
        flags: 0,
    }
}

/// What a negative entry carries: only its inode number (0) means anything.
pub(crate) fn absent() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: SystemTime::UNIX_EPOCH,
        mtime: SystemTime::UNIX_EPOCH,
        ctime: SystemTime::UNIX_EPOCH,
        crtime: SystemTime::UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}

pub(crate) fn errno(e: &Error) -> Errno {
    Errno::from_i32(e.errno())
}

/// For requests naming an inode the kernel knows: if it is gone, the kernel's name for it is
/// stale (the file was deleted or replaced on another node); ESTALE makes the kernel look the
/// name up again instead of failing.
pub(crate) fn ino_errno(e: &Error) -> Errno {
    if e.is(&ErrorCode::NotFound) {
        Errno::ESTALE
    } else {
        errno(e)
    }
}

fn time(t: Timespec) -> SystemTime {
    t.into()
}

pub(crate) fn file_type(k: FileKind) -> FileType {
    match k {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDevice(_) => FileType::CharDevice,
        FileKind::BlockDevice(_) => FileType::BlockDevice,
    }
}

/// The changes a setattr request asks for; the change time is now.
pub(crate) fn set_attr(
    mode: Option<u32>,
    uid: Option<u32>,
    gid: Option<u32>,
    size: Option<u64>,
    atime: Option<TimeOrNow>,
    mtime: Option<TimeOrNow>,
) -> SetAttr {
    SetAttr {
        mode: mode.map(|m| m & 0o7777),
        uid,
        gid,
        size,
        atime: set_time(atime),
        mtime: set_time(mtime),
        ctime: Timespec::now(),
        parent: None,
    }
}

fn set_time(t: Option<TimeOrNow>) -> Option<Timespec> {
    t.map(|t| match t {
        TimeOrNow::SpecificTime(t) => requested_time(t),
        TimeOrNow::Now => Timespec::now(),
    })
}

/// The kernel's timestamp in a setattr request. The kernel sends a POSIX timespec (a time
/// before 1970 as negative seconds plus positive nanoseconds: -1 s and 0.25 s is -0.75 s), but
/// fuser 0.18 makes it `UNIX_EPOCH - (1 s + 0.25 s)`: the pair is read back out of that. Checked
/// against the kernel by tests/posix/test_mount.py (`test_utime_before_1970`), which fails when
/// a fuser that converts right comes in and this must go.
fn requested_time(t: SystemTime) -> Timespec {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(_) => Timespec::from(t),
        Err(before) => Timespec {
            secs: 0i64
                .checked_sub_unsigned(before.duration().as_secs())
                .unwrap_or(i64::MIN),
            nanos: before.duration().subsec_nanos(),
        },
    }
}

pub(crate) fn name(n: &OsStr) -> Name {
    n.as_bytes().to_vec()
}

/// Open options from open(2) flags. Reading is always allowed: the kernel may read pages of a
/// write-only file to fill its cache, and permissions were checked by the kernel already.
pub(crate) fn open_options(flags: i32, mode: u32) -> OpenOptions {
    let acc = flags & libc::O_ACCMODE;
    OpenOptions {
        read: true,
        write: acc == libc::O_WRONLY || acc == libc::O_RDWR,
        // The mount places appends itself (`OpenFile::append`); the kernel's writeback of
        // cached pages gives their real offsets.
        append: false,
        truncate: flags & libc::O_TRUNC != 0,
        create: false,
        create_new: false,
        mode,
        ..OpenOptions::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::time::Duration;

    /// What fuser 0.18 hands `setattr` for the kernel's (secs, nanos).
    fn as_fuser_gives(secs: i64, nanos: u32) -> SystemTime {
        if secs >= 0 {
            SystemTime::UNIX_EPOCH + Duration::new(secs.unsigned_abs(), nanos)
        } else {
            SystemTime::UNIX_EPOCH - Duration::new(secs.unsigned_abs(), nanos)
        }
    }

    #[test]
    fn a_quarter_second_before_1970() {
        // touch -d "1969-12-31 23:59:59.25"
        let t = requested_time(as_fuser_gives(-1, 250_000_000));
        assert_eq!((t.secs, t.nanos), (-1, 250_000_000));
    }

    proptest! {
        /// Times set through the mount are stored as the kernel sent them and given back to
        /// it unchanged, before and after 1970.
        #[test]
        fn set_times_round_trip(
            secs in -(1i64 << 40)..(1i64 << 40),
            nanos in 0u32..1_000_000_000,
        ) {
            let stored = requested_time(as_fuser_gives(secs, nanos));
            prop_assert_eq!((stored.secs, stored.nanos), (secs, nanos));
            prop_assert_eq!(Timespec::from(time(stored)), stored);
        }
    }
}
