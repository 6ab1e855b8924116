//! The Tessera client library: the only code that turns file operations into stripe requests.
//!
//! * [`Client`] connects to the manager, caches the partition table and one multiplexed
//!   connection per storage server, and routes every request by the partition of its key,
//!   refreshing the table and retrying when a server answers that the epoch is stale. With
//!   mirrors, stripe writes go to every replica at once ([`WriteAck`] says when one is done),
//!   reads to the least loaded replica (large ones split over two), metadata to the primary;
//!   a server that dies is waited out until the manager replaces it (`failover_timeout`).
//! * [`namespace`](Client::lookup) holds the metadata operations, inode by inode (what a FUSE
//!   layer needs) and by path (what the command line and Python need).
//! * [`File`] is an open file: it aggregates small sequential writes into stripe-sized
//!   requests, keeps many stripe requests in flight, reads ahead on sequential reads, and
//!   publishes its size and mtime on flush and close (close-to-open consistency).
//! * [`Lane`]: blocking threads' own connections. A client handle on a lane
//!   ([`Client::on_lane`]) sends its metadata requests there when its thread runs them through
//!   `Lane::block_on`, and reads the answers itself (a FUSE worker).

mod choose;
pub mod config;
mod error;
mod file;
mod lane;
mod lease;
mod namespace;
mod options;
mod path;
mod route;
#[cfg(feature = "sim")]
pub mod sim;
mod trace;

pub use error::{Error, Result};
pub use file::File;
pub use lane::Lane;
pub use namespace::{Fsck, Moved, Orphan, Unlinked, Usage};
pub use options::{ClientOptions, OpenOptions, WriteAck};
pub use route::ReadSinks;
pub use tessera_proto::{
    DirEntry, ErrorCode, FileKind, Inode, Listed, Name, Notice, NoticeSink, SetAttr, Sink,
    Timespec, NAME_MAX, RECALL_PATIENCE,
};
pub use trace::TraceOptions;

use route::Router;
use std::sync::Arc;
use std::time::Duration;

/// A connection to a Tessera cluster. Cheap to clone; all clones share connections and caches.
#[derive(Clone)]
pub struct Client {
    router: Arc<Router>,
    dirs: Arc<path::DirCache>,
    opts: Arc<ClientOptions>,
    /// Where this handle's requests may go out instead of the shared connections.
    lane: Option<Lane>,
    /// The trace its calls by path are recorded in (`ClientOptions::trace`).
    trace: Option<Arc<trace::Tracer>>,
    /// The lease the handles this client opens are held under.
    lease: Arc<lease::Lease>,
}

impl Client {
    /// Connects to the manager and waits (up to `ready_timeout`) until the cluster is ready.
    pub async fn connect(opts: ClientOptions) -> Result<Self> {
        let router = Router::connect(&opts).await?;
        let deadline = std::time::Instant::now() + opts.ready_timeout;
        let trace = match &opts.trace {
            Some(t) => Some(Arc::new(trace::Tracer::start(t)?)),
            None => None,
        };
        let client = Self {
            router: Arc::new(router),
            dirs: Arc::new(path::DirCache::new(opts.dir_cache_ttl)),
            opts: Arc::new(opts),
            lane: None,
            trace,
            lease: Arc::new(lease::Lease::new()),
        };
        tokio::spawn(lease::renew(
            Arc::downgrade(&client.router),
            client.lease.clone(),
        ));
        // The manager creates the root right after the table; a new cluster may not have it yet.
        loop {
            match client.getattr(tessera_placement::ROOT_INO).await {
                Ok(_) => return Ok(client),
                Err(e)
                    if e.is(&tessera_proto::ErrorCode::NotFound)
                        && std::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Stripe size of this cluster.
    #[must_use]
    pub fn stripe_size(&self) -> u32 {
        self.router.config().stripe_size
    }

    /// The same connections, creating files and directories owned by `uid`:`gid` (a FUSE mount
    /// creates them for the calling process, not for itself).
    #[must_use]
    pub fn as_user(&self, uid: u32, gid: u32) -> Self {
        if self.opts.uid == uid && self.opts.gid == gid {
            return self.clone();
        }
        Self {
            opts: Arc::new(ClientOptions {
                uid,
                gid,
                ..(*self.opts).clone()
            }),
            ..self.clone()
        }
    }

    /// The same connections, the files it opens reading `stripes` stripes ahead on sequential
    /// reads instead of `ClientOptions::readahead`: a reader that bounds its own memory (a
    /// collective output's merge) asks for 0.
    #[must_use]
    pub fn with_readahead(&self, stripes: usize) -> Self {
        if self.opts.readahead == stripes {
            return self.clone();
        }
        Self {
            opts: Arc::new(ClientOptions {
                readahead: stripes,
                ..(*self.opts).clone()
            }),
            ..self.clone()
        }
    }

    /// The same connections, this handle's requests (and those of the files it opens) going
    /// out on `lane` when their thread runs them through [`Lane::block_on`] (see [`Lane`]);
    /// elsewhere, on the shared connections as ever.
    #[must_use]
    pub fn on_lane(&self, lane: &Lane) -> Self {
        Self {
            lane: Some(lane.clone()),
            ..self.clone()
        }
    }

    /// Epoch of the partition table this client routes with.
    #[must_use]
    pub fn epoch(&self) -> tessera_placement::Epoch {
        self.router.route().epoch()
    }

    /// Asks the servers for callback promises from now on: each tells `sink` when something
    /// it answered this client changes (`Notice`); the client adds `Notice::Reset` when a
    /// connection ends or the partition table changes. For caches that outlive a request (the
    /// FUSE mount's kernel cache). Once per client.
    pub fn subscribe(&self, sink: tessera_proto::NoticeSink) -> Result<()> {
        self.router.subscribe(sink)
    }

    /// The file this client's calls are traced into, if they are.
    #[must_use]
    pub fn trace_file(&self) -> Option<&std::path::Path> {
        self.trace.as_deref().map(trace::Tracer::path)
    }

    /// Writes out the trace's records so far (they are written every 250 ms anyway, and the
    /// trace is finished when the last handle of the client and its files is dropped).
    pub fn flush_trace(&self) {
        if let Some(t) = &self.trace {
            t.flush();
        }
    }

    /// Finishes the trace (what is buffered and an end marker are written): later calls of
    /// this client and its clones are not recorded. Otherwise it is finished when the last
    /// handle of the client and of the files it opened is dropped.
    pub fn stop_trace(&self) {
        if let Some(t) = &self.trace {
            t.close();
        }
    }

    /// The cluster's status, as the manager sees it.
    pub async fn status(&self) -> Result<tessera_proto::ClusterStatus> {
        self.router.status().await
    }
}
