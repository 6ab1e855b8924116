//! How requests reach the servers: the [`Transport`] the routing paths send through, and its
//! real implementation, the client's multiplexed connections, one per server
//! ([`tessera_proto::Conns`]). Tests put an in-memory one in its place.

use crate::lane::{Lane, Sent};
use crate::Result;
use bytes::Bytes;
use std::future::Future;
use std::net::SocketAddr;
use tessera_placement::NodeId;
use tessera_proto::{Conns, NoticeSink, Request, Response, RpcError, Sink, Waiter};

/// A server's answer: the response and its payload, or why none came.
pub(crate) type Answer = std::result::Result<(Response, Bytes), RpcError>;

/// An answer on its way.
pub(crate) trait Reply: Send + 'static {
    fn wait(self) -> impl Future<Output = Answer> + Send;
}

impl Reply for Waiter {
    fn wait(self) -> impl Future<Output = Answer> + Send {
        Waiter::wait(self)
    }
}

/// Where requests to the servers go out and answers come back.
pub(crate) trait Transport: Send + Sync + 'static {
    type Reply: Reply;

    /// Queues `req` with `payload` to `node`, which listens at `addr`; the answer's payload
    /// is received into `sink` if it fits there. Requests queued one after another to one node
    /// arrive in that order. `Unavailable`: the node could not be reached.
    fn send(
        &self,
        node: NodeId,
        addr: SocketAddr,
        req: &Request,
        payload: Bytes,
        sink: Option<Box<dyn Sink>>,
    ) -> impl Future<Output = Result<Self::Reply>> + Send;

    /// Can `node` be reached again (a failover's check for a restarted server)?
    fn reach(&self, node: NodeId, addr: SocketAddr) -> impl Future<Output = Result<()>> + Send;

    /// Ends the connections to the nodes `keep` rejects (they left the table): requests
    /// waiting on them fail at once.
    fn forget(&self, keep: impl Fn(&NodeId) -> bool);

    /// From now on, answers come with promises and notices go to `sink` (see
    /// `Client::subscribe`). False if it was called before.
    fn subscribe(&self, sink: NoticeSink) -> bool;

    /// The sink given to [`Self::subscribe`].
    fn notices(&self) -> Option<&NoticeSink>;

    /// Sends `req` on `lane` (a blocking thread's own connection to `node`), its answer to be
    /// read with `Lane::answer`; `None` when the lane cannot take it (see `Lane::send`), or
    /// this transport has no lanes (the default). `Unavailable`: the node could not be reached.
    fn send_on_lane(
        &self,
        _lane: &Lane,
        _node: NodeId,
        _addr: SocketAddr,
        _req: &Request,
        _payload: &Bytes,
    ) -> impl Future<Output = Result<Option<std::result::Result<Sent, RpcError>>>> + Send {
        async { Ok(None) }
    }
}

impl Transport for Conns<NodeId> {
    type Reply = Waiter;

    async fn send(
        &self,
        node: NodeId,
        addr: SocketAddr,
        req: &Request,
        payload: Bytes,
        sink: Option<Box<dyn Sink>>,
    ) -> Result<Waiter> {
        let conn = self.get(node, addr).await?;
        Ok(conn.send_into(req, payload, sink).await?)
    }

    async fn reach(&self, node: NodeId, addr: SocketAddr) -> Result<()> {
        self.get(node, addr).await?;
        Ok(())
    }

    fn forget(&self, keep: impl Fn(&NodeId) -> bool) {
        Conns::forget(self, keep);
    }

    fn subscribe(&self, sink: NoticeSink) -> bool {
        Conns::subscribe(self, sink)
    }

    fn notices(&self) -> Option<&NoticeSink> {
        Conns::notices(self)
    }

    async fn send_on_lane(
        &self,
        lane: &Lane,
        node: NodeId,
        addr: SocketAddr,
        req: &Request,
        payload: &Bytes,
    ) -> Result<Option<std::result::Result<Sent, RpcError>>> {
        // The shared connection first: the lane's is made beside it.
        let shared = self.get(node, addr).await?;
        Ok(lane.send(self.rpc(), node, &shared, req, payload).await)
    }
}
