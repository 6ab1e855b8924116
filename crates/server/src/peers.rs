//! Connections from this server to other servers (mirrors, sync sources) and to the manager,
//! made on first use and remade after they break.

use bytes::Bytes;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use tessera_placement::NodeId;
use tessera_proto::{Request, Response, RpcClient, RpcConfig, RpcError, TableInfo};
use tokio::sync::OnceCell;

type Cell = Arc<OnceCell<Arc<RpcClient>>>;

pub struct Peers {
    rpc: Arc<RpcConfig>,
    conns: Mutex<HashMap<SocketAddr, Cell>>,
}

impl Peers {
    #[must_use]
    pub fn new(rpc: Arc<RpcConfig>) -> Self {
        Self {
            rpc,
            conns: Mutex::default(),
        }
    }

    pub async fn get(&self, addr: SocketAddr) -> Result<Arc<RpcClient>, RpcError> {
        let cell = {
            let mut conns = self.conns.lock().unwrap_or_else(PoisonError::into_inner);
            let cell = conns.entry(addr).or_default();
            if cell.get().is_some_and(|c| c.is_closed()) {
                *cell = Cell::default();
            }
            cell.clone()
        };
        let c = cell
            .get_or_try_init(|| async { RpcClient::connect(addr, &self.rpc).await.map(Arc::new) })
            .await?;
        Ok(c.clone())
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
