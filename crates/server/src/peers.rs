//! Connections from this server to other servers (mirrors, sync sources) and to the manager,
//! through a [`Net`]: the connection set the client uses too ([`Conns`]), keyed by address,
//! or a simulated network (`tessera-sim`); and calls to a node of the table through it.

use bytes::Bytes;
use futures::future::BoxFuture;
use std::net::SocketAddr;
use std::sync::Arc;
use tessera_placement::NodeId;
use tessera_proto::{Conns, Request, Response, RpcError, TableInfo};

/// How a server reaches the manager and the other servers. Every request it sends carries no
/// payload; answers may (sync pages).
pub trait Net: Send + Sync + 'static {
    /// Sends `req` to whoever listens at `addr`: its answer, or why none came.
    fn call<'a>(
        &'a self,
        addr: SocketAddr,
        req: &'a Request,
    ) -> BoxFuture<'a, Result<(Response, Bytes), RpcError>>;
}

/// A connection per address, made on first use and remade after it breaks.
impl Net for Conns<SocketAddr> {
    fn call<'a>(
        &'a self,
        addr: SocketAddr,
        req: &'a Request,
    ) -> BoxFuture<'a, Result<(Response, Bytes), RpcError>> {
        Box::pin(async move { self.to(addr).await?.call(req, Bytes::new()).await })
    }
}

pub struct Peers(Arc<dyn Net>);

impl Peers {
    #[must_use]
    pub fn new(net: Arc<dyn Net>) -> Self {
        Self(net)
    }

    /// Sends `req` to whoever listens at `addr` (the manager, a sync source).
    pub async fn call_at(
        &self,
        addr: SocketAddr,
        req: &Request,
    ) -> Result<(Response, Bytes), RpcError> {
        self.0.call(addr, req).await
    }

    /// Sends `req` to node `n` of table `info`: its answer, or why none came.
    pub async fn call(
        &self,
        info: &TableInfo,
        n: NodeId,
        req: &Request,
    ) -> Result<(Response, Bytes), String> {
        let addr = info
            .nodes
            .iter()
            .find(|a| a.id == n)
            .map(|a| a.addr)
            .ok_or_else(|| format!("node {n} has no address in the table"))?;
        self.call_at(addr, req).await.map_err(|e| e.to_string())
    }
}
