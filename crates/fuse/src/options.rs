//! How to mount: the options the command line hands the mount.

use std::time::Duration;

/// How to mount.
#[derive(Debug, Clone)]
pub struct MountOptions {
    /// FUSE worker threads (requests served at once).
    pub threads: usize,
    /// How long the kernel may reuse attributes and directory entries (1 s by default). Opens
    /// revalidate whatever the value; `stat` may show another node's changes this late.
    pub attr_ttl: Duration,
    /// How long the kernel may reuse a name or attributes that a server promised to tell of
    /// changes to (`leases.rs`; 60 s by default): a change elsewhere drops them at once.
    /// Zero: no promises, everything cached for `attr_ttl` only.
    pub lease: Duration,
    /// Let other users in (`allow_other`); permissions are still enforced by the kernel.
    pub allow_other: bool,
    /// Bypass the page cache (every read and write goes to the cluster).
    pub direct_io: bool,
    /// Let the kernel gather small writes in its page cache (faster small writes; the file
    /// system then sees page-sized, reordered writes).
    pub writeback_cache: bool,
    /// I/O tracing (`trace.rs`): off unless a directory is given.
    pub trace: crate::TraceOptions,
}

impl Default for MountOptions {
    fn default() -> Self {
        Self {
            threads: 8,
            attr_ttl: Duration::from_secs(1),
            lease: Duration::from_secs(60),
            allow_other: false,
            direct_io: false,
            writeback_cache: false,
            trace: crate::TraceOptions::default(),
        }
    }
}
