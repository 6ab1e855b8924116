//! Routing: the cached partition table, one connection per server, the choice of replica, and
//! the retry and failover rules.
//!
//! * Stripe writes go to every complete replica at once, with one epoch ([`Router::send_write`]).
//! * Reads go to the replica this client measures as least loaded ([`crate::choose`]); a large
//!   read is split over two ([`Router::send_read`]). A read failing on one replica is retried
//!   at once on another, then with a fresh table.
//! * Metadata goes to the partition's primary, which forwards changes to the mirrors itself.
//! * A node that cannot be reached is waited out: the table is fetched every
//!   [`FAILOVER_POLL`] until the manager removed the node (declared dead) or
//!   `failover_timeout` passes, then the request goes to the new table's replicas.
//! * A partition with no replica left is lost: its requests fail at once with `Lost` (EIO).

use crate::choose::{self, Load};
use crate::lane::Lane;
use crate::{ClientOptions, Error, ReadSinks, Result};
use bytes::Bytes;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};
use std::time::{Duration, Instant};
use tessera_placement::{
    meta_partition, stripe_partition, Epoch, Ino, NodeId, PartitionId, PartitionTable,
};
use tessera_proto::{
    BufferPool, ClusterConfig, ClusterStatus, ErrorCode, Notice, NoticeSink, Op, Request, Response,
    RpcClient, RpcConfig, RpcError, Sink, TableInfo, Waiter,
};
use tokio::sync::OnceCell;
use tracing::debug;

/// Attempts for one request before giving up (stale epochs, a cluster still settling).
const MAX_ATTEMPTS: u32 = 40;
/// Waits before a stripe write refused for want of space is tried again: deleted files give
/// their space back a moment after the unlink (the servers drop their stripes in the
/// background), so a program that removes files to make room finds it, as on a local disk. A
/// cluster that stays full answers ENOSPC after these (0.6 s in all).
const NO_SPACE_WAITS: [Duration; 5] = [
    Duration::from_millis(20),
    Duration::from_millis(40),
    Duration::from_millis(80),
    Duration::from_millis(160),
    Duration::from_millis(320),
];
/// How often the table is fetched again while waiting for the manager to declare an unreachable
/// node dead (it does after about 2 s of missed heartbeats).
const FAILOVER_POLL: Duration = Duration::from_millis(150);
/// Weight of a new latency sample in a node's moving average.
const EWMA_WEIGHT: f64 = 0.2;
/// A latency not measured for this long is forgotten: a node skipped as a hot spot is tried
/// again (and measured) after it, so one that recovered is used again.
const LATENCY_FRESH: Duration = Duration::from_secs(2);
/// Latencies are compared per this many bytes read (smaller reads count as this size), so large
/// and small reads measure a node alike.
const LATENCY_UNIT: u32 = 64 << 10;

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
}

/// Does `table` still list `node` for partition `p` (complete or receiving)?
fn lists(table: &PartitionTable, node: NodeId, p: PartitionId) -> bool {
    table.holds(node, p) || table.receives(node, p)
}

/// Does `table` list `node` anywhere?
fn lists_anywhere(table: &PartitionTable, node: NodeId) -> bool {
    table
        .all()
        .iter()
        .chain(table.all_incoming())
        .any(|l| l.contains(&node))
}

/// Read load this client puts on one node, as [`crate::choose`] ranks replicas by.
#[derive(Default)]
struct NodeLoad {
    outstanding: AtomicU32,
    /// Moving average of microseconds per [`LATENCY_UNIT`], and when it was last sampled.
    latency: Mutex<Option<(f64, Instant)>>,
}

impl NodeLoad {
    fn load(&self, now: Instant) -> Load {
        let latency = *self.latency.lock().unwrap_or_else(PoisonError::into_inner);
        Load {
            outstanding: self.outstanding.load(Ordering::Relaxed),
            latency: latency
                .filter(|(_, at)| now.duration_since(*at) < LATENCY_FRESH)
                .map(|(l, _)| l),
        }
    }

    fn record(&self, elapsed: Duration, len: u32) {
        let units = f64::from(len.max(LATENCY_UNIT)) / f64::from(LATENCY_UNIT);
        let sample = elapsed.as_secs_f64() * 1e6 / units;
        let now = Instant::now();
        let mut latency = self.latency.lock().unwrap_or_else(PoisonError::into_inner);
        let avg = match *latency {
            // A forgotten average is replaced: a node that recovered is trusted at once.
            Some((avg, at)) if now.duration_since(at) < LATENCY_FRESH => {
                avg + EWMA_WEIGHT * (sample - avg)
            }
            _ => sample,
        };
        *latency = Some((avg, now));
    }
}

/// Counts one outstanding request on a node until dropped.
struct Busy(Arc<NodeLoad>);

impl Busy {
    fn new(load: Arc<NodeLoad>) -> Self {
        load.outstanding.fetch_add(1, Ordering::Relaxed);
        Self(load)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.outstanding.fetch_sub(1, Ordering::Relaxed);
    }
}

type Answer = std::result::Result<(Response, Bytes), RpcError>;

/// A read in flight, counted against its node's load until answered.
struct Tracked {
    node: NodeId,
    waiter: Waiter,
    busy: Busy,
    sent: Instant,
    len: u32,
}

impl Tracked {
    async fn wait(self) -> (NodeId, Answer) {
        let answer = self.waiter.wait().await;
        // Only served reads measure service time (a stale-epoch refusal is quick and says
        // nothing about it).
        if matches!(answer, Ok((Response::Ok, _))) {
            self.busy.0.record(self.sent.elapsed(), self.len);
        }
        (self.node, answer)
    }
}

/// A replica a request failed on: `down` (with why) when it could not be reached, `None` when
/// it answered that it cannot serve the request now (stale epoch, not ready).
#[derive(Debug, Clone)]
pub(crate) struct Tried {
    node: NodeId,
    down: Option<String>,
}

enum Pending {
    /// Waited for by whoever finishes the read (it does so at once).
    Sent(Tracked),
    /// Read ahead: a task waits for it, so its latency is measured when it arrives, not when
    /// the reader gets to it. With when it was sent.
    Spawned(NodeId, Instant, tokio::task::JoinHandle<(NodeId, Answer)>),
    Failed(Tried),
}

/// One piece of a stripe read, sent to one replica: bytes `offset..offset + len` of the stripe.
pub(crate) struct ReadPart {
    pub offset: u32,
    pub len: u32,
    key: Key,
    op: Op,
    pending: Pending,
}

impl ReadPart {
    /// Lets a task wait for the answer (for reads whose bytes are needed only later).
    pub fn detach(&mut self) {
        let placeholder = Pending::Failed(Tried {
            node: 0,
            down: None,
        });
        self.pending = match std::mem::replace(&mut self.pending, placeholder) {
            Pending::Sent(t) => Pending::Spawned(t.node, t.sent, tokio::spawn(t.wait())),
            other => other,
        };
    }
}

/// A stripe write on its way on a lane ([`Router::send_write_on_lane`]).
pub(crate) struct LaneWrite {
    lane: Lane,
    sent: std::result::Result<crate::lane::Sent, RpcError>,
}

/// The largest write sent on a lane: the lane copies it into its frame, and a small file's
/// close is what it is for.
const LANE_WRITE_MAX: usize = 64 << 10;

/// A stripe write queued to one replica; `Err` if it could not even be queued.
pub(crate) struct Ack {
    pub node: NodeId,
    waiter: Result<Waiter>,
}

/// How a write ended on the replicas waited for.
pub(crate) enum Outcome {
    Done,
    /// Must be re-sent: a replica answered stale/not ready, or these nodes were unreachable.
    Retry(Vec<NodeId>),
    Failed(Error),
}

/// Waits for one replica's acknowledgement.
pub(crate) async fn wait_ack(ack: Ack) -> Outcome {
    let waiter = match ack.waiter {
        Ok(w) => w,
        Err(Error::Unavailable(why)) => {
            debug!(node = ack.node, "write not queued: {why}");
            return Outcome::Retry(vec![ack.node]);
        }
        Err(e) => return Outcome::Failed(e),
    };
    match waiter.wait().await {
        Ok((Response::Ok, _)) => Outcome::Done,
        Ok((Response::Error(e), _)) if retryable(&e) => Outcome::Retry(Vec::new()),
        Ok((Response::Error(e), _)) => Outcome::Failed(e.into()),
        Ok((other, _)) => Outcome::Failed(unexpected(&other)),
        Err(RpcError::Encode(m)) => Outcome::Failed(Error::Invalid(m)),
        Err(e) => {
            debug!(node = ack.node, "write lost: {e}");
            Outcome::Retry(vec![ack.node])
        }
    }
}

/// Waits for all `acks` at once: failed if one failed, else a retry if one needs it.
pub(crate) async fn wait_acks(acks: Vec<Ack>) -> Outcome {
    let mut all = Outcome::Done;
    for outcome in futures::future::join_all(acks.into_iter().map(wait_ack)).await {
        all = match (all, outcome) {
            (Outcome::Failed(e), _) | (_, Outcome::Failed(e)) => Outcome::Failed(e),
            (Outcome::Retry(mut a), Outcome::Retry(b)) => {
                a.extend(b);
                Outcome::Retry(a)
            }
            (Outcome::Retry(a), Outcome::Done) | (Outcome::Done, Outcome::Retry(a)) => {
                Outcome::Retry(a)
            }
            (Outcome::Done, Outcome::Done) => Outcome::Done,
        };
    }
    all
}

type Cell = Arc<OnceCell<Arc<RpcClient>>>;

pub(crate) struct Router {
    manager_addr: SocketAddr,
    rpc: RpcConfig,
    /// Where subscribed connections deliver notices, once `subscribe` was called.
    notices: OnceLock<NoticeSink>,
    failover_timeout: Duration,
    manager: tokio::sync::Mutex<Option<Arc<RpcClient>>>,
    route: RwLock<Arc<Route>>,
    conns: Mutex<HashMap<NodeId, Cell>>,
    loads: Mutex<HashMap<NodeId, Arc<NodeLoad>>>,
    refreshing: tokio::sync::Mutex<()>,
    /// When the table was last fetched (requests waiting out a failover share fetches).
    fetched: Mutex<Instant>,
}

fn backoff(attempt: u32) -> Duration {
    Duration::from_millis((2u64 << attempt.min(7)).min(250))
}

fn kept_changing() -> Error {
    Error::Unavailable("the partition table kept changing; giving up".into())
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
                Response::Table(info) => {
                    info.check(info.config.partitions).map_err(Error::Invalid)?;
                    break info;
                }
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
            notices: OnceLock::new(),
            failover_timeout: opts.failover_timeout,
            manager: tokio::sync::Mutex::new(Some(manager)),
            route: RwLock::new(Arc::new(Route::new(info))),
            conns: Mutex::default(),
            loads: Mutex::default(),
            refreshing: tokio::sync::Mutex::new(()),
            fetched: Mutex::new(Instant::now()),
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
        let resp = self.manager_call(&Request::GetTable).await?;
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
                    if let Some(sink) = self.notices.get() {
                        sink.deliver(Notice::Reset);
                    }
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

    /// From now on, server connections are subscribed and deliver notices to `sink`; the
    /// connections made before are dropped (new ones replace them as needed). Once only.
    pub fn subscribe(&self, sink: NoticeSink) -> Result<()> {
        self.notices
            .set(sink)
            .map_err(|_| Error::Invalid("this client is subscribed already".into()))?;
        self.conns
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        Ok(())
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
            .get_or_try_init(|| async {
                let c = RpcClient::connect(addr, &self.rpc).await?;
                if let Some(sink) = self.notices.get() {
                    c.subscribe(sink.clone()).await?;
                }
                Ok::<_, Error>(Arc::new(c))
            })
            .await?;
        Ok(c.clone())
    }

    /// Sends `req` to `node` and waits for the answer; an unreachable node is `Unavailable`.
    async fn ask(
        &self,
        route: &Route,
        node: NodeId,
        req: &Request,
        payload: Bytes,
    ) -> Result<(Response, Bytes)> {
        let conn = self.conn(route, node).await?;
        Ok(conn.call(req, payload).await?)
    }

    /// `nodes` could not be reached. Waits until the manager declared one of them dead (`gone`
    /// holds on a fresh table: a new epoch without it), or one accepts a connection again (a
    /// broken connection, a restarted server), looking every [`FAILOVER_POLL`]; fails with
    /// `Unavailable` (EIO) once `failover_timeout` has passed since `since`.
    async fn await_failover(
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
                if let Ok(Ok(_)) = tokio::time::timeout(FAILOVER_POLL, self.conn(&route, n)).await {
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

    fn load_of(&self, node: NodeId) -> Arc<NodeLoad> {
        self.loads
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(node)
            .or_default()
            .clone()
    }

    /// `nodes` in the order a read should try them, their loads in that order, and how many of
    /// the first are usable (not hot spots).
    fn read_order(&self, nodes: &[NodeId]) -> (Vec<NodeId>, Vec<Load>, usize) {
        let now = Instant::now();
        let loads: Vec<Load> = nodes.iter().map(|&n| self.load_of(n).load(now)).collect();
        let (order, usable) = choose::rank(&loads);
        (
            order.iter().map(|&i| nodes[i]).collect(),
            order.iter().map(|&i| loads[i]).collect(),
            usable,
        )
    }

    /// Queues a stripe write to every complete replica of `key`'s partition at once, with
    /// `route`'s epoch, primary first; `Lost` if it has none. A replica it could not be queued
    /// to has an `Err` waiter: the write is re-sent with the others. Writes queued one after
    /// another apply in that order on every replica (one connection per node).
    pub async fn send_write(
        &self,
        route: &Route,
        key: Key,
        op: &Op,
        data: &Bytes,
    ) -> Result<Vec<Ack>> {
        let req = Request::Op {
            epoch: route.epoch(),
            op: op.clone(),
        };
        let req = &req;
        Ok(
            futures::future::join_all(route.replicas(key)?.iter().map(|&node| async move {
                let waiter = match self.conn(route, node).await {
                    Ok(conn) => conn.send(req, data.clone()).await.map_err(Error::from),
                    Err(e) => Err(e),
                };
                Ack { node, waiter }
            }))
            .await,
        )
    }

    /// Writes to every replica and waits for all, retrying across table changes and failovers.
    pub async fn write(&self, key: Key, op: &Op, data: &Bytes) -> Result<()> {
        let mut since = None;
        let mut no_space = NO_SPACE_WAITS.iter();
        for attempt in 0..MAX_ATTEMPTS {
            let route = self.route();
            match wait_acks(self.send_write(&route, key, op, data).await?).await {
                Outcome::Done => return Ok(()),
                Outcome::Failed(e) if e.is(&ErrorCode::NoSpace) => match no_space.next() {
                    Some(&wait) => tokio::time::sleep(wait).await,
                    None => return Err(e),
                },
                Outcome::Failed(e) => return Err(e),
                Outcome::Retry(down) if down.is_empty() => {
                    self.refresh(route.epoch()).await?;
                    tokio::time::sleep(backoff(attempt)).await;
                }
                Outcome::Retry(down) => {
                    let p = route.partition(key);
                    let since = *since.get_or_insert_with(Instant::now);
                    self.await_failover(&down, |t, n| !lists(t, n, p), since, "write")
                        .await?;
                }
            }
        }
        Err(kept_changing())
    }

    /// Queues a read of bytes `offset..offset + len` of a stripe to the replica the load
    /// measurements choose; a read of at least [`choose::SPLIT_MIN`] with two usable replicas
    /// is split between the two best, which serve it at once. `Lost` if no replica is left.
    pub async fn send_read(
        &self,
        file: Ino,
        stripe: u64,
        offset: u32,
        len: u32,
        sinks: Option<&dyn ReadSinks>,
    ) -> Result<Vec<ReadPart>> {
        let key = Key::Stripe(file, stripe);
        let route = self.route();
        let (order, loads, usable) = self.read_order(route.replicas(key)?);
        let cut = match loads.as_slice() {
            [a, b, ..] => choose::split_at(len, usable, *a, *b),
            _ => None,
        };
        let pieces = match cut {
            Some(at) => vec![(order[0], offset, at), (order[1], offset + at, len - at)],
            None => vec![(order[0], offset, len)],
        };
        // A split answer comes in two pieces: only a whole one can be the caller's memory.
        let sinks = sinks.filter(|_| pieces.len() == 1);
        let mut parts = Vec::with_capacity(pieces.len());
        for (node, offset, len) in pieces {
            let op = Op::ReadStripe {
                file,
                stripe,
                offset,
                len,
            };
            let sink = sinks.and_then(|s| s.sink(len as usize));
            let pending = match self.send_tracked(&route, node, &op, len, sink).await {
                Ok(t) => Pending::Sent(t),
                Err(e) => Pending::Failed(Tried {
                    node,
                    down: Some(e.to_string()),
                }),
            };
            parts.push(ReadPart {
                offset,
                len,
                key,
                op,
                pending,
            });
        }
        Ok(parts)
    }

    /// A lone stripe read by a thread with a lane (a FUSE worker's random read) when the stripe
    /// has one replica: sent and answered on the lane, with no hand-off to the runtime. `None`:
    /// no lane, or mirrors to choose among and hedge over (`send_read` does that).
    pub async fn read_on_lane(
        &self,
        file: Ino,
        stripe: u64,
        offset: u32,
        len: u32,
    ) -> Option<Result<Bytes>> {
        let key = Key::Stripe(file, stripe);
        if Lane::current().is_none() || self.route().replicas(key).map_or(true, |r| r.len() != 1) {
            return None;
        }
        let op = Op::ReadStripe {
            file,
            stripe,
            offset,
            len,
        };
        Some(match self.call(key, op, Bytes::new()).await {
            Ok((Response::Ok, data)) => Ok(data),
            Ok((other, _)) => Err(unexpected(&other)),
            Err(e) => Err(e),
        })
    }

    /// A small stripe write sent on this thread's lane, when the stripe has one replica and
    /// its node is not the one `beside` (a request the thread makes while this is on its way)
    /// goes to; `None` otherwise, nothing sent. [`Self::finish_lane_write`] reads the answer.
    pub async fn send_write_on_lane(
        &self,
        key: Key,
        op: &Op,
        data: &Bytes,
        beside: Key,
    ) -> Option<LaneWrite> {
        let lane = Lane::current()?;
        if data.len() > LANE_WRITE_MAX {
            return None;
        }
        let route = self.route();
        let node = match route.replicas(key) {
            Ok(&[node]) if route.primary(beside).ok() != Some(node) => node,
            _ => return None,
        };
        let conn = self.conn(&route, node).await.ok()?;
        let req = Request::Op {
            epoch: route.epoch(),
            op: op.clone(),
        };
        let sent = lane.send(self, node, &conn, &req, data).await?;
        Some(LaneWrite { lane, sent })
    }

    /// The answer to a [`Self::send_write_on_lane`]; a write that failed or was refused is sent
    /// again as [`Self::write`] sends it (across table changes, failovers and full servers).
    pub async fn finish_lane_write(
        &self,
        w: LaneWrite,
        key: Key,
        op: &Op,
        data: &Bytes,
    ) -> Result<()> {
        let why = match w.sent.and_then(|sent| w.lane.answer(sent)) {
            Ok((Response::Ok, _)) => return Ok(()),
            Ok((Response::Error(e), _)) => e.to_string(),
            Ok((other, _)) => return Err(unexpected(&other)),
            Err(e) => e.to_string(),
        };
        debug!("a write on a lane did not go through ({why}), sending it again");
        self.write(key, op, data).await
    }

    async fn send_tracked(
        &self,
        route: &Route,
        node: NodeId,
        op: &Op,
        len: u32,
        sink: Option<Box<dyn Sink>>,
    ) -> Result<Tracked> {
        let conn = self.conn(route, node).await?;
        let req = Request::Op {
            epoch: route.epoch(),
            op: op.clone(),
        };
        let busy = Busy::new(self.load_of(node));
        let sent = Instant::now();
        let waiter = conn.send_into(&req, Bytes::new(), sink).await?;
        Ok(Tracked {
            node,
            waiter,
            busy,
            sent,
            len,
        })
    }

    /// The bytes of a part sent by [`Self::send_read`]; if its replica failed, read again from
    /// another (see [`Self::read`]).
    pub async fn finish_read(&self, part: ReadPart) -> Result<Bytes> {
        let ReadPart {
            key,
            op,
            len,
            pending,
            ..
        } = part;
        let outcome = match pending {
            Pending::Sent(t) => {
                let (node, sent) = (t.node, t.sent);
                let first = async move {
                    let (node, answer) = t.wait().await;
                    settle(node, answer)
                };
                self.hedged(key, &op, len, node, sent, first).await?
            }
            Pending::Spawned(node, sent, task) => {
                let first = async move {
                    match task.await {
                        Ok((node, answer)) => settle(node, answer),
                        Err(e) => Ok(Err(Tried {
                            node,
                            down: Some(e.to_string()),
                        })),
                    }
                };
                self.hedged(key, &op, len, node, sent, first).await?
            }
            Pending::Failed(tried) => Err(tried),
        };
        match outcome {
            Ok(b) => Ok(b),
            Err(tried) => self.read(key, &op, len, vec![tried]).await,
        }
    }

    /// Waits for a read sent to `node` at `sent`; if it is late (see [`choose::hedge_after`])
    /// and another usable replica exists, sends it there too and takes the first good answer.
    /// A late node is marked slow at once, so the next reads avoid it (CEFT-PVFS's hot-spot
    /// skipping, without waiting for the slow answer to measure it).
    async fn hedged(
        &self,
        key: Key,
        op: &Op,
        len: u32,
        node: NodeId,
        sent: Instant,
        first: impl std::future::Future<Output = Result<std::result::Result<Bytes, Tried>>>,
    ) -> Result<std::result::Result<Bytes, Tried>> {
        tokio::pin!(first);
        let route = self.route();
        let others: Vec<NodeId> = route
            .replicas(key)
            .map(|r| r.iter().copied().filter(|&n| n != node).collect())
            .unwrap_or_default();
        let (order, loads, usable) = self.read_order(&others);
        if usable == 0 {
            return first.await;
        }
        let best = loads
            .iter()
            .filter_map(|l| l.latency)
            .chain(self.load_of(node).load(Instant::now()).latency)
            .min_by(f64::total_cmp);
        let late = sent + choose::hedge_after(len, best, LATENCY_UNIT);
        if let Ok(done) = tokio::time::timeout_at(late.into(), &mut first).await {
            return done;
        }
        self.load_of(node).record(sent.elapsed(), len);
        let Ok(t) = self.send_tracked(&route, order[0], op, len, None).await else {
            return first.await;
        };
        debug!(
            late = node,
            to = order[0],
            "read is late: asking another replica too"
        );
        let second = async move {
            let (node, answer) = t.wait().await;
            settle(node, answer)
        };
        tokio::pin!(second);
        tokio::select! {
            r = &mut first => match r? {
                Ok(b) => Ok(Ok(b)),
                Err(_) => second.await,
            },
            r = &mut second => match r? {
                Ok(b) => Ok(Ok(b)),
                Err(_) => first.await,
            },
        }
    }

    /// Reads with retries: a replica that fails (unreachable, stale, not ready) is replaced at
    /// once by the next one in load order; when every replica failed, the table is refreshed
    /// (waiting out a failover if some were unreachable) and the round starts again.
    async fn read(&self, key: Key, op: &Op, len: u32, mut tried: Vec<Tried>) -> Result<Bytes> {
        let mut since = None;
        for attempt in 0..MAX_ATTEMPTS {
            let route = self.route();
            let untried: Vec<NodeId> = route
                .replicas(key)?
                .iter()
                .copied()
                .filter(|n| tried.iter().all(|t| t.node != *n))
                .collect();
            let Some(&node) = self.read_order(&untried).0.first() else {
                let down: Vec<NodeId> = tried
                    .iter()
                    .filter(|t| t.down.is_some())
                    .map(|t| t.node)
                    .collect();
                if down.is_empty() {
                    self.refresh(route.epoch()).await?;
                    tokio::time::sleep(backoff(attempt)).await;
                } else {
                    let p = route.partition(key);
                    let since = *since.get_or_insert_with(Instant::now);
                    self.await_failover(&down, |t, n| !lists(t, n, p), since, "read")
                        .await?;
                }
                tried.clear();
                continue;
            };
            let answer = match self.send_tracked(&route, node, op, len, None).await {
                Ok(t) => t.wait().await.1.map_err(Error::from),
                Err(e) => Err(e),
            };
            let outcome = match answer {
                Ok(answer) => settle(node, Ok(answer))?,
                Err(Error::Unavailable(why)) => Err(Tried {
                    node,
                    down: Some(why),
                }),
                Err(e) => return Err(e),
            };
            match outcome {
                Ok(b) => return Ok(b),
                Err(t) => {
                    debug!(node, down = ?t.down, "read failed on a replica, trying another");
                    tried.push(t);
                }
            }
        }
        Err(kept_changing())
    }

    /// Sends `op` for `key` to its partition's primary and waits, retrying across table
    /// changes, reconnects and failovers.
    pub async fn call(&self, key: Key, op: Op, payload: Bytes) -> Result<(Response, Bytes)> {
        self.call_ex(key, op, payload).await.0
    }

    /// [`Self::call`], also telling whether the request may have been applied by a server that
    /// then failed to answer (it was re-sent after a lost connection or a timeout): a
    /// non-idempotent operation may then find its own effect.
    pub async fn call_ex(
        &self,
        key: Key,
        op: Op,
        payload: Bytes,
    ) -> (Result<(Response, Bytes)>, bool) {
        let mut req = Request::Op { epoch: 0, op };
        let mut maybe_applied = false;
        let mut since = None;
        for attempt in 0..MAX_ATTEMPTS {
            let route = self.route();
            if let Request::Op { epoch, .. } = &mut req {
                *epoch = route.epoch();
            }
            let node = match route.primary(key) {
                Ok(n) => n,
                Err(e) => return (Err(e), maybe_applied),
            };
            let answer = self
                .exchange(&route, node, &req, &payload, &mut maybe_applied)
                .await;
            match answer {
                Ok((Response::Error(e), _)) if retryable(&e) => {
                    if let Err(e) = self.refresh(route.epoch()).await {
                        return (Err(e), maybe_applied);
                    }
                    tokio::time::sleep(backoff(attempt)).await;
                }
                Ok((Response::Error(e), _)) => return (Err(e.into()), maybe_applied),
                Ok(ok) => return (Ok(ok), maybe_applied),
                Err(Error::Unavailable(why)) => {
                    debug!(node, "request failed: {why}");
                    let p = route.partition(key);
                    let since = *since.get_or_insert_with(Instant::now);
                    if let Err(e) = self
                        .await_failover(&[node], |t, n| !lists(t, n, p), since, "request")
                        .await
                    {
                        return (Err(e), maybe_applied);
                    }
                }
                Err(e) => return (Err(e), maybe_applied),
            }
        }
        (Err(kept_changing()), maybe_applied)
    }

    /// One request to `node` and its answer: on the running operation's lane if it has one,
    /// else on the shared connection. `maybe_applied` is set if it was sent but not answered.
    async fn exchange(
        &self,
        route: &Route,
        node: NodeId,
        req: &Request,
        payload: &Bytes,
        maybe_applied: &mut bool,
    ) -> Result<(Response, Bytes)> {
        let conn = self.conn(route, node).await?;
        let answer = match Lane::current() {
            Some(lane) => lane
                .send(self, node, &conn, req, payload)
                .await
                .map(|sent| sent.and_then(|sent| lane.answer(sent))),
            None => None,
        };
        let answer = match answer {
            Some(answer) => answer,
            None => match conn.send(req, payload.clone()).await {
                Ok(waiter) => waiter.wait().await,
                Err(e) => return Err(e.into()),
            },
        };
        *maybe_applied |= answer.is_err();
        answer.map_err(Error::from)
    }

    pub(crate) fn rpc(&self) -> &RpcConfig {
        &self.rpc
    }

    /// Sends a node-wide `op` to every node in the table (holding or receiving partitions) and
    /// waits for all. A node that cannot be reached is waited out until the manager removes it
    /// from the table; the op is then sent again to the new table's nodes (it is idempotent).
    pub async fn broadcast(&self, op: Op) -> Result<()> {
        let mut since = None;
        for attempt in 0..MAX_ATTEMPTS {
            let route = self.route();
            let req = Request::Op {
                epoch: route.epoch(),
                op: op.clone(),
            };
            let replies =
                futures::future::join_all(route.info.table.nodes().into_iter().map(|node| {
                    let (route, req) = (&route, &req);
                    async move { (node, self.ask(route, node, req, Bytes::new()).await) }
                }))
                .await;
            let (mut stale, mut down) = (false, Vec::new());
            for (node, reply) in replies {
                match reply {
                    Ok((Response::Error(e), _)) if retryable(&e) => stale = true,
                    Ok((Response::Error(e), _)) => return Err(e.into()),
                    Ok(_) => {}
                    Err(Error::Unavailable(why)) => {
                        debug!(node, "broadcast failed: {why}");
                        down.push(node);
                    }
                    Err(e) => return Err(e),
                }
            }
            if !down.is_empty() {
                let since = *since.get_or_insert_with(Instant::now);
                self.await_failover(&down, |t, n| !lists_anywhere(t, n), since, "broadcast")
                    .await?;
            } else if stale {
                self.refresh(route.epoch()).await?;
                tokio::time::sleep(backoff(attempt)).await;
            } else {
                return Ok(());
            }
        }
        Err(kept_changing())
    }
}

/// A read's answer: its bytes, a replica to try instead of this one, or a final error.
fn settle(node: NodeId, answer: Answer) -> Result<std::result::Result<Bytes, Tried>> {
    match answer {
        Ok((Response::Ok, b)) => Ok(Ok(b)),
        Ok((Response::Error(e), _)) if retryable(&e) => Ok(Err(Tried { node, down: None })),
        Ok((Response::Error(e), _)) => Err(e.into()),
        Ok((other, _)) => Err(unexpected(&other)),
        Err(RpcError::Encode(m)) => Err(Error::Invalid(m)),
        Err(e) => Ok(Err(Tried {
            node,
            down: Some(e.to_string()),
        })),
    }
}

pub(crate) fn retryable(e: &ErrorCode) -> bool {
    matches!(e, ErrorCode::StaleEpoch { .. } | ErrorCode::NotReady(_))
}

pub(crate) fn unexpected(r: &Response) -> Error {
    Error::Unavailable(format!("unexpected answer from the cluster: {r:?}"))
}
