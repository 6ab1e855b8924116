//! The Tessera wire protocol.
//!
//! * [`msg`]: the request and response messages (postcard-encoded headers).
//! * [`cluster`]: the cluster's settings, the table as it travels, and status reports.
//! * [`frame`]: length-prefixed frames: a fixed prefix, the header, then the raw payload (stripe
//!   bytes travel as-is, never re-encoded).
//! * [`auth`]: the handshake that proves both ends know the cluster secret.
//! * [`rpc`]: a multiplexed connection (many requests in flight, matched by request id;
//!   `rpc/client.rs`) and the serving loop used by the manager and the storage servers
//!   (`rpc/server.rs`).
//! * [`lane`]: a connection one thread uses synchronously (request, then the answer read by
//!   that thread itself), for metadata calls whose latency is a chain of wake-ups.
//! * [`conns`]: a set of connections, one per peer, remade once broken (client and server).
//! * [`pool`]: reusable stripe-sized buffers, so payloads land in warm memory.
//! * [`admit`]: a bound on a port's connections that have not proven themselves yet.
//! * [`scatter`]: the pieces of a scatter write (many pieces of one stripe in one request).
//! * [`ratelimit`]: warnings about peers, at most one per period per kind, with a count.

pub mod admit;
pub mod auth;
pub mod cluster;
pub mod conns;
pub mod frame;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod lane;
pub mod msg;
pub mod pool;
pub mod ratelimit;
pub mod rpc;
pub mod scatter;

pub use auth::{AuthError, Secret};
pub use cluster::*;
pub use conns::Conns;
pub use frame::{FrameError, Limits};
pub use lane::LaneConn;
pub use msg::*;
pub use pool::BufferPool;
pub use ratelimit::RateLimit;
pub use rpc::{
    serve, Conn, Handler, NoticeSink, Reply, RpcClient, RpcConfig, RpcError, Sink, Waiter, Watcher,
    FRAME_TIMEOUT, MAX_CONNECTIONS, MAX_DETACHED, MAX_HANDSHAKING, OUTBOX_MAX,
};
pub use scatter::{check_pieces, Piece, SCATTER_PIECES_MAX};

/// Version of the protocol spoken by this build; both ends must agree. Raise it with any change
/// to the messages or to what inode numbers mean (2: placed inodes, `DirCreate`, listings and
/// look-ups carrying inodes; 3: `Inode::change`, `DirUnlink`; 4: `Subscribe` and notices; 5:
/// `Attach`, `Subscribed`; 6: `Notice::Listing`; 7: `DirRename` in one step, `Renamed`; 8:
/// deleted files' stripes dropped by servers, `DropFiles`; 9: completeness recalled before
/// another's change, `Relinquish`; 10: only directories have hashed numbers, only files and
/// the like placed ones, and servers refuse requests that would break the namespace; 11:
/// `InodeRetract`, `DropFiles` without sizes, `RenameLock`; 13: opens held under client
/// leases, their holders in `SyncItem::Inode` and `DirCreate`, `LeaseRenew`, `InodeRevoke`,
/// `InodeScan`, `InodeReclaim`, `ClusterConfig::open_lease_ms`; 14: `NodeStats::pooled`; 15:
/// `WriteScatter`; 16: `InodeReserve`).
pub const PROTOCOL_VERSION: u16 = 16;
/// First bytes of every connection.
pub const MAGIC: [u8; 4] = *b"TSRA";
