//! A process's connections to its peers: one multiplexed [`RpcClient`] per peer, made on first
//! use and remade once it broke (or the peer moved). The client's connections to the servers
//! and a server's to its mirrors and sync sources are both such a set.

use crate::rpc::{NoticeSink, RpcClient, RpcConfig, RpcError};
use std::collections::HashMap;
use std::hash::Hash;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use tokio::sync::OnceCell;

type Cell = Arc<OnceCell<Arc<RpcClient>>>;

/// Connections by key (a node id, or the peer's address itself).
pub struct Conns<K> {
    rpc: Arc<RpcConfig>,
    /// Where connections deliver notices, once [`Self::subscribe`] was called.
    notices: OnceLock<NoticeSink>,
    conns: Mutex<HashMap<K, Cell>>,
}

impl<K: Eq + Hash> Conns<K> {
    #[must_use]
    pub fn new(rpc: Arc<RpcConfig>) -> Self {
        Self {
            rpc,
            notices: OnceLock::new(),
            conns: Mutex::default(),
        }
    }

    /// The settings its connections are made with.
    #[must_use]
    pub fn rpc(&self) -> &Arc<RpcConfig> {
        &self.rpc
    }

    /// The connection to `key`, at `addr`: made on first use, and again once the last one
    /// closed or `key` moved to another address. Callers asking at once share one attempt.
    pub async fn get(&self, key: K, addr: SocketAddr) -> Result<Arc<RpcClient>, RpcError> {
        let cell = {
            let mut conns = self.conns.lock().unwrap_or_else(PoisonError::into_inner);
            let cell = conns.entry(key).or_default();
            if cell
                .get()
                .is_some_and(|c| c.is_closed() || c.peer() != addr)
            {
                *cell = Cell::default();
            }
            cell.clone()
        };
        let c = cell
            .get_or_try_init(|| async {
                let c = RpcClient::connect(addr, &self.rpc).await?;
                if let Some(sink) = self.notices.get() {
                    c.subscribe(sink.clone()).await?;
                }
                Ok::<_, RpcError>(Arc::new(c))
            })
            .await?;
        Ok(c.clone())
    }

    /// From now on, connections are subscribed and deliver notices to `sink`; those made
    /// before are dropped (new ones replace them as needed). False if it was called before.
    pub fn subscribe(&self, sink: NoticeSink) -> bool {
        if self.notices.set(sink).is_err() {
            return false;
        }
        self.conns
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        true
    }

    /// Shuts and forgets the connections to peers `keep` rejects (peers that left): what
    /// waits on them fails at once instead of at its timeout.
    pub fn forget(&self, keep: impl Fn(&K) -> bool) {
        let gone: Vec<Cell> = {
            let mut conns = self.conns.lock().unwrap_or_else(PoisonError::into_inner);
            let gone = conns
                .iter()
                .filter(|(k, _)| !keep(k))
                .map(|(_, c)| c.clone());
            let gone = gone.collect();
            conns.retain(|k, _| keep(k));
            gone
        };
        for c in gone.iter().filter_map(|c| c.get()) {
            c.shut("the peer left the cluster");
        }
    }

    /// The sink given to [`Self::subscribe`], if it was called.
    #[must_use]
    pub fn notices(&self) -> Option<&NoticeSink> {
        self.notices.get()
    }
}

impl Conns<SocketAddr> {
    /// The connection to the peer at `addr`, for a set keyed by address.
    pub async fn to(&self, addr: SocketAddr) -> Result<Arc<RpcClient>, RpcError> {
        self.get(addr, addr).await
    }
}
