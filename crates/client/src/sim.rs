//! The client's routing over a simulated network, for `tessera-sim`: the router as it is
//! (writes to every replica, reads from the chosen one, retries across epochs, failover), with
//! a [`Net`] in place of the connections to the servers and to the manager. No lanes, no
//! subscriptions (promises and notices are not simulated).

use crate::route::{Answer, Key, Manager, ManagerCall, Reply, Router, Transport};
use crate::Result;
use bytes::Bytes;
use futures::future::BoxFuture;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tessera_placement::{Epoch, Ino, NodeId};
use tessera_proto::{
    BufferPool, NoticeSink, Op, Request, Response, RpcConfig, Secret, Sink, TableInfo,
};

/// A simulated network as a client sees it.
pub trait Net: Send + Sync + 'static {
    /// Queues `req` with `payload` to `node` at `addr`: the answer on its way, or `Unavailable`
    /// if the node cannot be reached. Requests queued one after another to one node arrive in
    /// that order.
    fn send(
        &self,
        node: NodeId,
        addr: SocketAddr,
        req: Request,
        payload: Bytes,
    ) -> BoxFuture<'static, Result<BoxFuture<'static, Answer>>>;

    /// Can `node` at `addr` be reached?
    fn reach(&self, node: NodeId, addr: SocketAddr) -> BoxFuture<'static, Result<()>>;

    /// Sends `req` to the manager.
    fn manager(&self, req: Request) -> BoxFuture<'static, Result<Response>>;
}

struct Over<N>(Arc<N>);

struct Answering(BoxFuture<'static, Answer>);

impl Reply for Answering {
    fn wait(self) -> impl Future<Output = Answer> + Send {
        self.0
    }
}

impl<N: Net> Transport for Over<N> {
    type Reply = Answering;

    async fn send(
        &self,
        node: NodeId,
        addr: SocketAddr,
        req: &Request,
        payload: Bytes,
        _sink: Option<Box<dyn Sink>>,
    ) -> Result<Answering> {
        Ok(Answering(
            self.0.send(node, addr, req.clone(), payload).await?,
        ))
    }

    async fn reach(&self, node: NodeId, addr: SocketAddr) -> Result<()> {
        self.0.reach(node, addr).await
    }

    fn forget(&self, _keep: impl Fn(&NodeId) -> bool) {}

    fn subscribe(&self, _sink: NoticeSink) -> bool {
        false
    }

    fn notices(&self) -> Option<&NoticeSink> {
        None
    }
}

/// A client's router over a [`Net`].
pub struct SimClient<N: Net>(Router<Over<N>>);

impl<N: Net> SimClient<N> {
    /// A client that starts from `info` (fetched from the manager) and reaches the manager at
    /// `manager` through `net`.
    #[must_use]
    pub fn new(
        net: Arc<N>,
        manager: SocketAddr,
        info: TableInfo,
        failover_timeout: Duration,
    ) -> Self {
        let pool = Arc::new(BufferPool::new(info.config.stripe_size as usize, 4));
        let rpc = Arc::new(RpcConfig::new(Secret::new("sim"), pool));
        let to_manager = net.clone();
        let via: ManagerCall = Arc::new(move |req| to_manager.manager(req));
        let manager = Manager::via(manager, rpc, via);
        Self(Router::new(manager, info, Over(net), failover_timeout))
    }

    /// The epoch of the table this client routes with.
    #[must_use]
    pub fn epoch(&self) -> Epoch {
        self.0.route().epoch()
    }

    /// Writes `data` at `offset` of a stripe, to every replica.
    pub async fn write(&self, file: Ino, stripe: u64, offset: u32, data: Bytes) -> Result<()> {
        let op = Op::WriteStripe {
            file,
            stripe,
            offset,
        };
        self.0.write(Key::Stripe(file, stripe), &op, &data).await
    }

    /// Reads `len` bytes at `offset` of a stripe.
    pub async fn read(&self, file: Ino, stripe: u64, offset: u32, len: u32) -> Result<Bytes> {
        let parts = self.0.send_read(file, stripe, offset, len, None).await?;
        let mut out = Vec::with_capacity(len as usize);
        for part in parts {
            out.extend_from_slice(&self.0.finish_read(part).await?);
        }
        Ok(Bytes::from(out))
    }

    /// A metadata request to the primary of `ino`'s partition: its answer (an error answer is
    /// `Err`).
    pub async fn meta(&self, ino: Ino, op: Op) -> Result<Response> {
        let (resp, _) = self.0.call(None, Key::Meta(ino), op, Bytes::new()).await?;
        Ok(resp)
    }
}
