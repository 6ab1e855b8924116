//! Connections from this server to other servers (mirrors, sync sources) and to the manager,
//! made on first use and remade after they break.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use tessera_proto::{RpcClient, RpcConfig, RpcError};
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
}
