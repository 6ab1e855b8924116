//! How a client connects and behaves ([`ClientOptions`]), and how a file is opened
//! ([`OpenOptions`]).

use crate::trace::TraceOptions;
use std::net::SocketAddr;
use std::time::Duration;
use tessera_proto::Secret;

/// When a stripe write counts as done (see [`ClientOptions::write_ack`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WriteAck {
    /// When every complete replica has it: an acknowledged write survives the loss of all but
    /// one replica.
    #[default]
    All,
    /// When the primary has it; the mirrors' acknowledgements are collected later (at most
    /// [`ClientOptions::mirror_lag`] outstanding per open file) and waited for by flush, fsync
    /// and close. Writes return sooner; until the next flush, a write is only as safe as the
    /// primary's node, and another client reading a mirror may see older data.
    Primary,
}

/// How a client connects and behaves.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    pub manager: SocketAddr,
    /// Servers asked for the partition table when the manager cannot be reached at connect,
    /// so that a client can start while the manager is away (the cluster file lists them).
    pub seeds: Vec<SocketAddr>,
    pub secret: Secret,
    /// How long `connect` waits for a cluster that is still forming.
    pub ready_timeout: Duration,
    /// How long one request may go unanswered before it fails.
    pub request_timeout: Duration,
    /// Stripe writes one open file keeps in flight.
    pub write_window: usize,
    /// When a stripe write counts as done; `OpenOptions::write_ack` overrides it per file.
    pub write_ack: WriteAck,
    /// With [`WriteAck::Primary`]: writes of one open file whose mirror acknowledgements may
    /// still be outstanding; beyond it, a write waits for the oldest.
    pub mirror_lag: usize,
    /// How long a request waits for an unreachable server to be replaced (the manager declares
    /// it dead and publishes a table without it) before failing with EIO.
    pub failover_timeout: Duration,
    /// Stripes read ahead on a sequential read pattern (0 disables read-ahead).
    pub readahead: usize,
    /// How long a resolved directory path may be reused without asking its server again
    /// (0 disables; like NFS's directory attribute cache).
    pub dir_cache_ttl: Duration,
    /// Owner given to new files and directories.
    pub uid: u32,
    pub gid: u32,
    /// Applied to the mode of files and directories created by path.
    pub umask: u32,
    /// Record every call by path, and every call on a file opened by path, into a trace
    /// file (docs/TRACING.md); `None`: off.
    pub trace: Option<TraceOptions>,
}

impl ClientOptions {
    #[must_use]
    pub fn new(manager: SocketAddr, secret: &str) -> Self {
        // SAFETY: geteuid/getegid have no preconditions and cannot fail.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        Self {
            manager,
            seeds: Vec::new(),
            secret: Secret::new(secret),
            ready_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(60),
            write_window: 16,
            write_ack: WriteAck::All,
            mirror_lag: 64,
            failover_timeout: Duration::from_secs(15),
            readahead: 8,
            dir_cache_ttl: Duration::from_secs(1),
            uid,
            gid,
            umask: 0o022,
            trace: None,
        }
    }
}

/// How to open a file; mirrors `std::fs::OpenOptions`.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    pub read: bool,
    pub write: bool,
    pub append: bool,
    pub truncate: bool,
    pub create: bool,
    pub create_new: bool,
    /// Permission bits for a new file (before the umask, for opens by path).
    pub mode: u32,
    /// When this file's writes count as done; `None`: the client's `write_ack`.
    pub write_ack: Option<WriteAck>,
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self {
            read: true,
            write: false,
            append: false,
            truncate: false,
            create: false,
            create_new: false,
            mode: 0o666,
            write_ack: None,
        }
    }
}

impl OpenOptions {
    /// The flags of an open(2) that asks for the same, as traces record them.
    pub(crate) fn flags(&self) -> u32 {
        let access = match (self.read, self.write || self.append) {
            (_, false) => libc::O_RDONLY,
            (false, true) => libc::O_WRONLY,
            (true, true) => libc::O_RDWR,
        };
        let bits = [
            (self.append, libc::O_APPEND),
            (self.truncate, libc::O_TRUNC),
            (self.create || self.create_new, libc::O_CREAT),
            (self.create_new, libc::O_EXCL),
        ];
        let flags = bits
            .iter()
            .filter(|(on, _)| *on)
            .fold(access, |f, (_, bit)| f | bit);
        u32::try_from(flags).unwrap_or(0)
    }

    /// Read only.
    #[must_use]
    pub fn read() -> Self {
        Self::default()
    }
    /// Write, creating or truncating (like `File::create`).
    #[must_use]
    pub fn create() -> Self {
        Self {
            read: false,
            write: true,
            truncate: true,
            create: true,
            ..Self::default()
        }
    }
    /// Read and write an existing file.
    #[must_use]
    pub fn read_write() -> Self {
        Self {
            write: true,
            ..Self::default()
        }
    }
}
