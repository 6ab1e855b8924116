//! Connections from this server to other servers (mirrors, sync sources) and to the manager:
//! the connection set the client uses too ([`Conns`]), keyed by address, and calls to a node
//! of the table through it.

use bytes::Bytes;
use std::net::SocketAddr;
use std::sync::Arc;
use tessera_placement::NodeId;
use tessera_proto::{Conns, Request, Response, RpcClient, RpcConfig, RpcError, TableInfo};

pub struct Peers(Conns<SocketAddr>);

impl Peers {
    #[must_use]
    pub fn new(rpc: Arc<RpcConfig>) -> Self {
        Self(Conns::new(rpc))
    }

    /// The connection to `addr`, made on first use and remade after it breaks.
    pub async fn get(&self, addr: SocketAddr) -> Result<Arc<RpcClient>, RpcError> {
        self.0.to(addr).await
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
        let conn = self.get(addr).await.map_err(|e| e.to_string())?;
        conn.call(req, Bytes::new())
            .await
            .map_err(|e| e.to_string())
    }
}
