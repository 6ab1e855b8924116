//! The cached partition table ([`Route`]) and the link to the manager it comes from: the
//! first fetch, refreshes after a stale answer, and the wait for a failover.

use super::transport::{Reply, Transport};
use super::{unexpected, Router};
use crate::options::ClientOptions;
use crate::{Error, Result};
use bytes::Bytes;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, PoisonError};
use std::time::Duration;
use tessera_placement::{
    meta_partition, stripe_partition, Epoch, Ino, NodeId, PartitionId, PartitionTable,
};
use tessera_proto::{
    BufferPool, ClusterConfig, ClusterStatus, ErrorCode, Notice, Request, Response, RpcClient,
    RpcConfig, TableInfo,
};
use tokio::time::Instant;
use tracing::debug;

/// How often the table is fetched again while waiting for the manager to declare an unreachable
/// node dead (it does after about 2 s of missed heartbeats).
pub(super) const FAILOVER_POLL: Duration = Duration::from_millis(150);

/// A server that has not answered for this long may have stopped (hung, cut off): from then on
/// the table is looked at every [`FAILOVER_POLL`], and the wait ends once it drops the server.
pub(super) const SUSPECT_AFTER: Duration = Duration::from_secs(1);

/// How long a table fetch waits for the manager before asking the servers: a hung manager
/// must not hold up a failover, and servers hold the table too.
const MANAGER_PATIENCE: Duration = Duration::from_secs(1);

/// What a request is routed by.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Key {
    Stripe(Ino, u64),
    Meta(Ino),
    /// A whole partition (a scan of its inodes).
    Partition(PartitionId),
}

pub(crate) struct Route {
    pub info: TableInfo,
    addrs: HashMap<NodeId, SocketAddr>,
}

impl Route {
    pub(super) fn new(info: TableInfo) -> Self {
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
            Key::Partition(part) => part,
        }
    }

    /// The complete replicas of `key`'s partition, primary first; `Lost` (EIO) if none is left.
    pub fn replicas(&self, key: Key) -> Result<&[NodeId]> {
        let p = self.partition(key);
        match self.info.table.all().get(p as usize) {
            Some(list) if !list.is_empty() => Ok(list),
            _ => Err(ErrorCode::Lost(p).into()),
        }
    }

    /// The node metadata requests for `key` go to: the partition's primary.
    pub fn primary(&self, key: Key) -> Result<NodeId> {
        Ok(self.replicas(key)?[0])
    }

    /// Where `node` listens.
    pub fn addr(&self, node: NodeId) -> Result<SocketAddr> {
        self.addrs
            .get(&node)
            .copied()
            .ok_or_else(|| Error::Unavailable(format!("node {node} is not in the partition table")))
    }
}

/// Does `table` still list `node` for partition `p` (complete or receiving)?
pub(super) fn lists(table: &PartitionTable, node: NodeId, p: PartitionId) -> bool {
    table.holds(node, p) || table.receives(node, p)
}

/// Does `table` list `node` anywhere?
pub(super) fn lists_anywhere(table: &PartitionTable, node: NodeId) -> bool {
    table
        .all()
        .iter()
        .chain(table.all_incoming())
        .any(|l| l.contains(&node))
}

/// A call to the manager by other means than its RPC connection (a simulated network).
pub(crate) type ManagerCall =
    Arc<dyn Fn(Request) -> futures::future::BoxFuture<'static, Result<Response>> + Send + Sync>;

/// What the manager said to a client's first request.
enum First {
    Table(Arc<RpcClient>, TableInfo),
    NotReady(String),
}

/// The connection to the manager, remade when it breaks.
pub(crate) struct Manager {
    addr: SocketAddr,
    rpc: Arc<RpcConfig>,
    conn: tokio::sync::Mutex<Option<Arc<RpcClient>>>,
    /// Taken instead of `conn` when set.
    via: Option<ManagerCall>,
}

impl Manager {
    /// Connects to the manager and fetches the table, waiting (up to `ready_timeout`) for a
    /// cluster that is still forming; while the manager cannot be reached, the table comes
    /// from the first of `seeds` (servers) to give one. The settings returned are those of
    /// every connection after it: their receive pool is sized to the cluster's stripes.
    pub(super) async fn connect(opts: &ClientOptions) -> Result<(Self, TableInfo)> {
        let mut rpc = RpcConfig::new(opts.secret.clone(), Arc::new(BufferPool::new(1 << 20, 64)));
        rpc.request_timeout = opts.request_timeout;
        let deadline = Instant::now() + opts.ready_timeout;
        let (conn, info) = loop {
            let why =
                match tokio::time::timeout(MANAGER_PATIENCE, Self::first_table(opts.manager, &rpc))
                    .await
                {
                    Ok(Ok(First::Table(conn, info))) => break (Some(conn), info),
                    Ok(Ok(First::NotReady(not_ready))) => Error::Unavailable(format!(
                        "cluster at {} not ready after {:?}: {not_ready}",
                        opts.manager, opts.ready_timeout
                    )),
                    // A refused handshake (wrong secret) is final; a manager that is still
                    // starting, or gone, is waited for.
                    Ok(Err(e @ tessera_proto::RpcError::Connect { .. })) => {
                        debug!("manager not reachable: {e}");
                        match seeded(&opts.seeds, &rpc).await {
                            Some(info) => break (None, info),
                            None => e.into(),
                        }
                    }
                    Ok(Err(e)) => return Err(e.into()),
                    Err(_) => match seeded(&opts.seeds, &rpc).await {
                        Some(info) => break (None, info),
                        None => Error::Unavailable(format!(
                            "the manager at {} does not answer",
                            opts.manager
                        )),
                    },
                };
            if Instant::now() > deadline {
                return Err(why);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        info.check(info.config.partitions).map_err(Error::Invalid)?;
        rpc.pool = Arc::new(BufferPool::new(info.config.stripe_size as usize, 64));
        Ok((Self::new(opts.manager, Arc::new(rpc), conn), info))
    }

    /// The manager's connection and table, or why it has none yet.
    async fn first_table(
        addr: SocketAddr,
        rpc: &RpcConfig,
    ) -> std::result::Result<First, tessera_proto::RpcError> {
        let manager = Arc::new(RpcClient::connect(addr, rpc).await?);
        Ok(
            match manager.call(&Request::GetTable, Bytes::new()).await?.0 {
                Response::Table(info) => First::Table(manager, info),
                Response::Error(ErrorCode::NotReady(why)) => First::NotReady(why),
                other => First::NotReady(format!("unexpected answer {other:?}")),
            },
        )
    }

    pub(super) fn new(addr: SocketAddr, rpc: Arc<RpcConfig>, conn: Option<Arc<RpcClient>>) -> Self {
        Self {
            addr,
            rpc,
            conn: tokio::sync::Mutex::new(conn),
            via: None,
        }
    }

    /// A manager reached through `via` instead of a connection.
    #[cfg(feature = "sim")]
    pub(crate) fn via(addr: SocketAddr, rpc: Arc<RpcConfig>, via: ManagerCall) -> Self {
        Self {
            via: Some(via),
            ..Self::new(addr, rpc, None)
        }
    }

    /// The settings of the client's connections.
    pub(super) fn rpc(&self) -> &Arc<RpcConfig> {
        &self.rpc
    }

    async fn call(&self, req: &Request) -> Result<Response> {
        if let Some(via) = &self.via {
            return via(req.clone()).await;
        }
        let mut guard = self.conn.lock().await;
        for _ in 0..2 {
            let conn = match guard.as_ref() {
                Some(c) if !c.is_closed() => c.clone(),
                _ => {
                    let c = Arc::new(RpcClient::connect(self.addr, &self.rpc).await?);
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
            self.addr
        )))
    }
}

impl<T: Transport> Router<T> {
    pub fn route(&self) -> Arc<Route> {
        self.route
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn config(&self) -> ClusterConfig {
        self.route().info.config
    }

    pub async fn status(&self) -> Result<ClusterStatus> {
        match self.manager.call(&Request::GetStatus).await? {
            Response::Status(s) => Ok(s),
            Response::Error(e) => Err(e.into()),
            other => Err(unexpected(&other)),
        }
    }

    /// Fetches the table again unless someone already did since we saw `seen`.
    pub async fn refresh(&self, seen: Epoch) -> Result<()> {
        self.fetch_table(seen, Duration::ZERO).await
    }

    /// Fetches the table unless its epoch is no longer `seen` or it was fetched less than
    /// `fresh` ago.
    async fn fetch_table(&self, seen: Epoch, fresh: Duration) -> Result<()> {
        let _one_at_a_time = self.refreshing.lock().await;
        if self.route().epoch() != seen {
            return Ok(());
        }
        let last = *self.fetched.lock().unwrap_or_else(PoisonError::into_inner);
        if !fresh.is_zero() && last.elapsed() < fresh {
            return Ok(());
        }
        let resp =
            match tokio::time::timeout(MANAGER_PATIENCE, self.manager.call(&Request::GetTable))
                .await
            {
                Ok(Ok(resp)) => resp,
                Ok(Err(e)) => self.table_from_servers(seen, e.to_string()).await?,
                Err(_) => self.table_from_servers(seen, "no answer".into()).await?,
            };
        *self.fetched.lock().unwrap_or_else(PoisonError::into_inner) = Instant::now();
        match resp {
            Response::Table(info) => {
                // The partition count is the cluster's for its life: a table of another is not
                // this cluster's.
                info.check(self.config().partitions)
                    .map_err(|e| Error::Invalid(format!("refusing a partition table: {e}")))?;
                if info.table.epoch() != seen {
                    debug!(
                        from = seen,
                        to = info.table.epoch(),
                        "partition table refreshed"
                    );
                    // Promises were made by the partitions' old primaries.
                    if let Some(sink) = self.transport.notices() {
                        sink.deliver(Notice::Reset);
                    }
                }
                // Connections to servers that left would hold what was sent to them until
                // their timeout.
                self.transport
                    .forget(|n| info.nodes.iter().any(|a| a.id == *n));
                *self.route.write().unwrap_or_else(PoisonError::into_inner) =
                    Arc::new(Route::new(info));
                Ok(())
            }
            Response::Error(ErrorCode::NotReady(_)) => Ok(()),
            Response::Error(e) => Err(e.into()),
            other => Err(unexpected(&other)),
        }
    }

    /// The newest table the servers of ours hold, for when the manager does not answer (`why`).
    /// `Unavailable` if none answers with a table at least as new as `seen`.
    async fn table_from_servers(&self, seen: Epoch, why: String) -> Result<Response> {
        debug!("manager: {why}; asking the servers for the table");
        let route = self.route();
        let ask = Request::GetTable;
        let answers = futures::future::join_all(route.info.nodes.iter().map(|n| {
            let ask = &ask;
            async move {
                let answer = async {
                    let reply = self.transport.send(n.id, n.addr, ask, Bytes::new(), None);
                    reply.await.ok()?.wait().await.ok()
                };
                match tokio::time::timeout(MANAGER_PATIENCE, answer).await {
                    Ok(Some((Response::Table(t), _))) => Some(t),
                    _ => None,
                }
            }
        }))
        .await;
        answers
            .into_iter()
            .flatten()
            .filter(|t| t.table.epoch() >= seen)
            .max_by_key(|t| t.table.epoch())
            .map(Response::Table)
            .ok_or_else(|| {
                Error::Unavailable(format!(
                    "the manager at {} is not answering ({why}), nor are the servers",
                    self.manager.addr
                ))
            })
    }

    /// Did `node` leave partition `p` (`None`: the whole table)? Looks at a table fetched at
    /// most [`FAILOVER_POLL`] / 2 ago.
    pub(super) async fn node_dropped(&self, node: NodeId, p: Option<PartitionId>) -> bool {
        let seen = self.route().epoch();
        if let Err(e) = self.fetch_table(seen, FAILOVER_POLL / 2).await {
            debug!("table refresh while waiting for node {node} failed: {e}");
        }
        let table = &self.route().info.table;
        match p {
            Some(p) => !lists(table, node, p),
            None => !lists_anywhere(table, node),
        }
    }

    /// Waits for `answer`, which `node` gives about partition `p` (`None`: about the node as a
    /// whole); `None` if the table drops `node` first, or once `quit` has passed. A server
    /// that stopped answering (hung, cut off) is given up as soon as the manager declares it
    /// dead, not after the request timeout.
    pub(super) async fn unless_dropped<F: std::future::Future>(
        &self,
        node: NodeId,
        p: Option<PartitionId>,
        quit: Option<Duration>,
        answer: F,
    ) -> Option<F::Output> {
        tokio::pin!(answer);
        let give_up = quit.map(|q| Instant::now() + q);
        let mut patience = SUSPECT_AFTER;
        loop {
            let wait = give_up.map_or(patience, |at| {
                patience.min(at.saturating_duration_since(Instant::now()))
            });
            if let Ok(done) = tokio::time::timeout(wait, &mut answer).await {
                return Some(done);
            }
            if give_up.is_some_and(|at| Instant::now() >= at) {
                debug!(node, partition = ?p, "gave up waiting for an answer");
                return None;
            }
            if self.node_dropped(node, p).await {
                debug!(node, partition = ?p, "gave up waiting: the node left the table");
                return None;
            }
            patience = FAILOVER_POLL;
        }
    }

    /// `nodes` could not be reached. Waits until the manager declared one of them dead (`gone`
    /// holds on a fresh table: a new epoch without it), or one accepts a connection again (a
    /// broken connection, a restarted server), looking every [`FAILOVER_POLL`]; fails with
    /// `Unavailable` (EIO) once `failover_timeout` has passed since `since`.
    pub(super) async fn await_failover(
        &self,
        nodes: &[NodeId],
        gone: impl Fn(&PartitionTable, NodeId) -> bool,
        since: Instant,
        what: &str,
    ) -> Result<()> {
        loop {
            let seen = self.route().epoch();
            if let Err(e) = self.fetch_table(seen, FAILOVER_POLL / 2).await {
                debug!("table refresh during failover failed: {e}");
            }
            let route = self.route();
            if nodes.iter().any(|&n| gone(&route.info.table, n)) {
                return Ok(());
            }
            for &n in nodes {
                if let Ok(Ok(())) = tokio::time::timeout(FAILOVER_POLL, self.reach(&route, n)).await
                {
                    return Ok(());
                }
            }
            if since.elapsed() >= self.failover_timeout {
                return Err(Error::Unavailable(format!(
                    "{what}: node {nodes:?} unreachable for {:?} and still in the partition table",
                    self.failover_timeout
                )));
            }
            tokio::time::sleep(FAILOVER_POLL).await;
        }
    }
}

/// The newest table `seeds` (servers) hold, each given [`MANAGER_PATIENCE`].
async fn seeded(seeds: &[SocketAddr], rpc: &RpcConfig) -> Option<TableInfo> {
    let asked = seeds.iter().map(|&addr| async move {
        let asked = async {
            let conn = RpcClient::connect(addr, rpc).await.ok()?;
            match conn.call(&Request::GetTable, Bytes::new()).await.ok()?.0 {
                Response::Table(t) => Some(t),
                _ => None,
            }
        };
        tokio::time::timeout(MANAGER_PATIENCE, asked)
            .await
            .ok()
            .flatten()
    });
    let newest = futures::future::join_all(asked)
        .await
        .into_iter()
        .flatten()
        .max_by_key(|t| t.table.epoch())?;
    debug!(
        epoch = newest.table.epoch(),
        "the manager is away: the table came from a server"
    );
    Some(newest)
}
