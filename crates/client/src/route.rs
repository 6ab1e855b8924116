//! Routing: the cached partition table, one connection per server, and the retry rules.

use crate::{ClientOptions, Error, Result};
use bytes::Bytes;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};
use tessera_placement::{meta_partition, stripe_partition, Epoch, Ino, NodeId, PartitionId};
use tessera_proto::{
    BufferPool, ClusterConfig, ClusterStatus, ErrorCode, Op, Request, Response, RpcClient,
    RpcConfig, TableInfo, Waiter,
};
use tokio::sync::OnceCell;
use tracing::debug;

/// Attempts for one request before giving up (stale epochs, a cluster still settling).
const MAX_ATTEMPTS: u32 = 40;
/// Connection failures tolerated for one request (a restarted server gets a new connection).
const MAX_CONN_FAILURES: u32 = 3;

/// What a request is routed by.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Key {
    Stripe(Ino, u64),
    Meta(Ino),
}

pub(crate) struct Route {
    pub info: TableInfo,
    addrs: HashMap<NodeId, SocketAddr>,
}

impl Route {
    fn new(info: TableInfo) -> Self {
        let addrs = info.nodes.iter().map(|n| (n.id, n.addr)).collect();
        Self { info, addrs }
    }

    pub fn epoch(&self) -> Epoch {
        self.info.table.epoch()
    }

    pub fn partition(&self, key: Key) -> PartitionId {
        let p = self.info.config.partitions;
        match key {
            Key::Stripe(file, stripe) => stripe_partition(file, stripe, p),
            Key::Meta(ino) => meta_partition(ino, p),
        }
    }

    /// The node a request for `key` goes to: the partition's primary.
    pub fn target(&self, key: Key) -> NodeId {
        self.info.table.replicas(self.partition(key))[0]
    }
}

type Cell = Arc<OnceCell<Arc<RpcClient>>>;

pub(crate) struct Router {
    manager_addr: SocketAddr,
    rpc: RpcConfig,
    manager: tokio::sync::Mutex<Option<Arc<RpcClient>>>,
    route: RwLock<Arc<Route>>,
    conns: Mutex<HashMap<NodeId, Cell>>,
    refreshing: tokio::sync::Mutex<()>,
}

fn backoff(attempt: u32) -> Duration {
    Duration::from_millis((2u64 << attempt.min(7)).min(250))
}

impl Router {
    pub async fn connect(opts: &ClientOptions) -> Result<Self> {
        let mut rpc = RpcConfig::new(opts.secret.clone(), Arc::new(BufferPool::new(1 << 20, 64)));
        rpc.request_timeout = opts.request_timeout;
        let deadline = Instant::now() + opts.ready_timeout;
        // A manager that is still starting refuses connections: keep trying until the deadline;
        // a refused handshake (wrong secret) is final.
        let manager = loop {
            match RpcClient::connect(opts.manager, &rpc).await {
                Ok(c) => break Arc::new(c),
                Err(e @ tessera_proto::RpcError::Connect { .. }) if Instant::now() < deadline => {
                    debug!("manager not reachable yet: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e.into()),
            }
        };
        let info = loop {
            match manager.call(&Request::GetTable, Bytes::new()).await?.0 {
                Response::Table(info) => break info,
                Response::Error(ErrorCode::NotReady(why)) => {
                    if Instant::now() > deadline {
                        return Err(Error::Unavailable(format!(
                            "cluster at {} not ready after {:?}: {why}",
                            opts.manager, opts.ready_timeout
                        )));
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                other => return Err(unexpected(&other)),
            }
        };
        // Size the receive pool to the cluster's stripes.
        rpc.pool = Arc::new(BufferPool::new(info.config.stripe_size as usize, 64));
        Ok(Self {
            manager_addr: opts.manager,
            rpc,
            manager: tokio::sync::Mutex::new(Some(manager)),
            route: RwLock::new(Arc::new(Route::new(info))),
            conns: Mutex::default(),
            refreshing: tokio::sync::Mutex::new(()),
        })
    }

    pub fn route(&self) -> Arc<Route> {
        self.route
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn config(&self) -> ClusterConfig {
        self.route().info.config
    }

    pub fn pool(&self) -> &BufferPool {
        &self.rpc.pool
    }

    async fn manager_call(&self, req: &Request) -> Result<Response> {
        let mut guard = self.manager.lock().await;
        for _ in 0..2 {
            let conn = match guard.as_ref() {
                Some(c) if !c.is_closed() => c.clone(),
                _ => {
                    let c = Arc::new(RpcClient::connect(self.manager_addr, &self.rpc).await?);
                    *guard = Some(c.clone());
                    c
                }
            };
            match conn.call(req, Bytes::new()).await {
                Ok((resp, _)) => return Ok(resp),
                Err(e) => {
                    debug!("manager call failed, reconnecting: {e}");
                    *guard = None;
                }
            }
        }
        Err(Error::Unavailable(format!(
            "manager at {} is not answering",
            self.manager_addr
        )))
    }

    pub async fn status(&self) -> Result<ClusterStatus> {
        match self.manager_call(&Request::GetStatus).await? {
            Response::Status(s) => Ok(s),
            Response::Error(e) => Err(e.into()),
            other => Err(unexpected(&other)),
        }
    }

    /// Fetches the table again unless someone already did since we saw `seen`.
    pub async fn refresh(&self, seen: Epoch) -> Result<()> {
        let _one_at_a_time = self.refreshing.lock().await;
        if self.route().epoch() != seen {
            return Ok(());
        }
        match self.manager_call(&Request::GetTable).await? {
            Response::Table(info) => {
                if info.table.epoch() != seen {
                    debug!(
                        from = seen,
                        to = info.table.epoch(),
                        "partition table refreshed"
                    );
                }
                *self.route.write().unwrap_or_else(PoisonError::into_inner) =
                    Arc::new(Route::new(info));
                Ok(())
            }
            Response::Error(ErrorCode::NotReady(_)) => Ok(()),
            Response::Error(e) => Err(e.into()),
            other => Err(unexpected(&other)),
        }
    }

    /// The connection to `node`, made on first use and remade after it breaks.
    pub async fn conn(&self, route: &Route, node: NodeId) -> Result<Arc<RpcClient>> {
        let addr = *route.addrs.get(&node).ok_or_else(|| {
            Error::Unavailable(format!("node {node} is not in the partition table"))
        })?;
        let cell = {
            let mut conns = self.conns.lock().unwrap_or_else(PoisonError::into_inner);
            let cell = conns.entry(node).or_default();
            if cell
                .get()
                .is_some_and(|c| c.is_closed() || c.peer() != addr)
            {
                *cell = Cell::default();
            }
            cell.clone()
        };
        let c = cell
            .get_or_try_init(|| async { RpcClient::connect(addr, &self.rpc).await.map(Arc::new) })
            .await?;
        Ok(c.clone())
    }

    /// Queues `op` to the primary of `key`'s partition without waiting for the answer.
    /// Requests queued one after another to the same partition apply in that order.
    pub async fn send(&self, key: Key, op: Op, payload: Bytes) -> Result<Waiter> {
        let route = self.route();
        let conn = self.conn(&route, route.target(key)).await?;
        Ok(conn
            .send(
                &Request::Op {
                    epoch: route.epoch(),
                    op,
                },
                payload,
            )
            .await?)
    }

    /// Sends `op` for `key` and waits, retrying across table changes and reconnects.
    pub async fn call(&self, key: Key, op: Op, payload: Bytes) -> Result<(Response, Bytes)> {
        let mut req = Request::Op { epoch: 0, op };
        let mut conn_failures = 0;
        for attempt in 0..MAX_ATTEMPTS {
            let route = self.route();
            if let Request::Op { epoch, .. } = &mut req {
                *epoch = route.epoch();
            }
            let node = route.target(key);
            let result = match self.conn(&route, node).await {
                Ok(conn) => conn.call(&req, payload.clone()).await.map_err(Error::from),
                Err(e) => Err(e),
            };
            match result {
                Ok((Response::Error(e), _)) if retryable(&e) => {
                    self.refresh(route.epoch()).await?;
                    tokio::time::sleep(backoff(attempt)).await;
                }
                Ok((Response::Error(e), _)) => return Err(e.into()),
                Ok(ok) => return Ok(ok),
                Err(Error::Unavailable(msg)) => {
                    conn_failures += 1;
                    if conn_failures >= MAX_CONN_FAILURES {
                        return Err(Error::Unavailable(format!("node {node}: {msg}")));
                    }
                    self.refresh(route.epoch()).await?;
                    tokio::time::sleep(backoff(attempt + 3)).await;
                }
                Err(e) => return Err(e),
            }
        }
        Err(Error::Unavailable(
            "the partition table kept changing; giving up".into(),
        ))
    }

    /// Sends a node-wide `op` to every node in the table and waits for all.
    pub async fn broadcast(&self, op: Op) -> Result<()> {
        for attempt in 0..MAX_ATTEMPTS {
            let route = self.route();
            let req = Request::Op {
                epoch: route.epoch(),
                op: op.clone(),
            };
            let replies =
                futures::future::join_all(route.info.table.nodes().into_iter().map(|node| {
                    let (route, req) = (&route, &req);
                    async move {
                        let conn = self.conn(route, node).await?;
                        Ok::<_, Error>(conn.call(req, Bytes::new()).await?.0)
                    }
                }))
                .await;
            let mut stale = false;
            for r in replies {
                match r? {
                    Response::Error(e) if retryable(&e) => stale = true,
                    Response::Error(e) => return Err(e.into()),
                    _ => {}
                }
            }
            if !stale {
                return Ok(());
            }
            self.refresh(route.epoch()).await?;
            tokio::time::sleep(backoff(attempt)).await;
        }
        Err(Error::Unavailable(
            "the partition table kept changing; giving up".into(),
        ))
    }
}

pub(crate) fn retryable(e: &ErrorCode) -> bool {
    matches!(e, ErrorCode::StaleEpoch { .. } | ErrorCode::NotReady(_))
}

pub(crate) fn unexpected(r: &Response) -> Error {
    Error::Unavailable(format!("unexpected answer from the cluster: {r:?}"))
}
