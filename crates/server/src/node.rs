//! What the parts of a server share: the table it installed, the narrow view of the server
//! that its background work (partition copies, purges) takes ([`Node`]), and the shapes of an
//! answer.

use crate::peers::Peers;
use crate::store::Store;
use bytes::Bytes;
use std::sync::Arc;
use tessera_placement::{Epoch, NodeId, PartitionId};
use tessera_proto::{ErrorCode, Reply, Response, TableInfo};

/// A partition table and the partitions this node holds in it (node-wide operations visit
/// only those).
pub struct Installed {
    pub info: TableInfo,
    /// Sorted.
    pub(crate) held: Vec<PartitionId>,
    /// The latest change epoch of any partition this node holds or receives: node-wide
    /// operations routed before it may have missed a copy here.
    pub(crate) node_changed: Epoch,
}

/// A server as its copies and purges see it: who it is, its table, its store, its peers.
pub trait Node: Send + Sync + 'static {
    fn id(&self) -> NodeId;
    /// The table installed, if any.
    fn table(&self) -> Option<Arc<Installed>>;
    fn store(&self) -> &Store;
    fn peers(&self) -> &Peers;
    /// Asks for the table to be fetched from the manager now.
    fn want_refresh(&self);

    fn epoch(&self) -> Option<Epoch> {
        self.table().map(|t| t.info.table.epoch())
    }
}

/// A response and its payload.
pub(crate) type Answer = (Response, Bytes);

pub(crate) fn err(e: ErrorCode) -> Answer {
    (Response::Error(e), Bytes::new())
}

pub(crate) fn stale(current: Epoch) -> ErrorCode {
    ErrorCode::StaleEpoch { current }
}

pub(crate) fn now(a: Answer) -> Reply {
    Reply::Now(a.0, a.1)
}

pub(crate) fn ok() -> Answer {
    (Response::Ok, Bytes::new())
}
