//! The Tessera storage server: holds a node's partitions in memory ([`store`]) and serves them
//! over the wire protocol, checking every request's table epoch and partition ownership and
//! forwarding metadata changes to mirrors ([`handler`]); sends and receives partition copies
//! ([`sync`]); drops deleted files' stripes ([`purge`]); registers with the manager and reports
//! its statistics in heartbeats.
//!
//! Modules use one another one way: `handler` uses `sync` and `purge`, which see the server
//! only through the traits of `node` ([`node::Node`], `sync::Host`, `purge::Host`).
//!
//! A server reaches others through a [`Net`] (TCP, or a simulated network: [`start_on`]) and
//! measures time with tokio's clock, which a simulation pauses and advances.

pub mod handler;
mod leases;
mod node;
mod peers;
mod purge;
mod rename_lock;
pub mod store;
mod sync;
mod valid;
pub mod watch;

use handler::{NodeHandler, Service};
use node::Node;
pub use peers::Net;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tessera_placement::NodeId;
use tessera_proto::{
    BufferPool, ClusterConfig, Conns, ErrorCode, Request, Response, RpcConfig, RpcError, Secret,
};
use tokio::net::TcpListener;
use tracing::{debug, info, warn};

/// Memory of idle stripe buffers a server keeps for reuse (in whole stripes, at least one):
/// counted in bytes, so large stripes do not multiply it. Beyond it, freed stripes go back to
/// the allocator, which reuses their pages as well.
const POOL_BYTES: usize = 64 << 20;
/// Memory of idle stripe buffers kept through a quiet spell, and how long that spell is: after
/// a burst of writes and removes the pool shrinks to this, so the memory of removed files goes
/// back to the node.
const POOL_KEEP_QUIET_BYTES: usize = 16 << 20;
const POOL_QUIET: Duration = Duration::from_secs(5);
/// With `--prefault`: how long no stripe buffer must have been asked for before the pool is
/// filled (so filling does not compete with foreground I/O), how often that is checked, and
/// how much one step touches at most (a write arriving meanwhile waits for at most one step).
const PREFAULT_IDLE: Duration = Duration::from_secs(1);
const PREFAULT_TICK: Duration = Duration::from_millis(100);
const PREFAULT_STEP_BYTES: usize = 32 << 20;
/// Default copy rate of a node receiving partitions: a fraction of what loopback carries.
pub const DEFAULT_SYNC_RATE: u64 = 512 << 20;
/// How often a server with fenced partitions asks for the table (the fence lasts until the
/// table that settles the copy arrives).
const FENCED_POLL: Duration = Duration::from_millis(10);
/// How long a starting server keeps trying to reach the manager.
const REGISTER_PATIENCE: Duration = Duration::from_secs(30);
/// How long a retired server may spend dropping deleted files' stripes before it exits.
const RETIRED_PURGE_WAIT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Address to listen on (port 0 picks a free port).
    pub listen: SocketAddr,
    /// Address to register with the manager, if not the bound one (behind NAT). Unset with an
    /// unspecified `listen` (0.0.0.0): this machine's address towards the manager.
    pub advertise: Option<SocketAddr>,
    pub manager: SocketAddr,
    pub secret: Secret,
    /// Memory for stripes and metadata, bytes; past it writes fail with ENOSPC.
    pub capacity: u64,
    pub label: Option<String>,
    pub heartbeat: Duration,
    /// Bytes per second this node may receive partition copies at (rebuilds, migrations), so
    /// foreground I/O goes on; 0 for no limit.
    pub sync_rate: u64,
    /// Fault injection: every stripe request waits this long (a slow, overloaded node).
    pub fault_delay: Duration,
    /// Bytes of stripe buffers to keep pre-faulted, filled while idle (0: none). Counted
    /// within `capacity`: the pool is filled only with memory the data held leaves free.
    pub prefault: u64,
}

impl ServerOptions {
    #[must_use]
    pub fn new(listen: SocketAddr, manager: SocketAddr, secret: Secret, capacity: u64) -> Self {
        Self {
            listen,
            advertise: None,
            manager,
            secret,
            capacity,
            label: None,
            heartbeat: Duration::from_millis(500),
            sync_rate: DEFAULT_SYNC_RATE,
            fault_delay: Duration::ZERO,
            prefault: 0,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("the manager at {addr} refused this server: {source}")]
    Refused { addr: SocketAddr, source: RpcError },
    #[error("cannot reach the manager at {addr}: {reason}")]
    Unreachable { addr: SocketAddr, reason: String },
    #[error("the manager rejected the registration: {0}")]
    Rejected(String),
}

/// Why a server stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Drained and retired by the manager (scale-in).
    Retired,
    /// The manager declared it dead (stopped, hung or cut off for longer than its dead-node
    /// time) and forgot it: its partitions were rebuilt elsewhere, and what it holds is stale.
    /// It may join again as a new, empty node.
    Forgotten,
    /// One of its tasks ended, which they do not.
    Failed,
}

/// A running server.
pub struct RunningServer {
    addr: SocketAddr,
    node: NodeId,
    service: Arc<Service>,
    tasks: tokio::task::JoinSet<Ended>,
}

impl RunningServer {
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
    #[must_use]
    pub fn node(&self) -> NodeId {
        self.node
    }
    /// Where its requests are handled (a simulated network delivers them here).
    #[must_use]
    pub fn service(&self) -> &Arc<Service> {
        &self.service
    }
    /// Runs until the server stops, and says why.
    pub async fn wait(mut self) -> Ended {
        match self.tasks.join_next().await {
            Some(Ok(ended)) => ended,
            _ => Ended::Failed,
        }
    }
}

async fn register(
    opts: &ServerOptions,
    net: &dyn Net,
    addr: SocketAddr,
) -> Result<(NodeId, ClusterConfig), ServerError> {
    let deadline = tokio::time::Instant::now() + REGISTER_PATIENCE;
    let req = Request::Register {
        addr,
        capacity: opts.capacity,
        label: opts.label.clone(),
    };
    loop {
        match net.call(opts.manager, &req).await {
            Ok((Response::Registered { node, config }, _)) => return Ok((node, config)),
            Ok((Response::Error(e), _)) => return Err(ServerError::Rejected(e.to_string())),
            Ok((other, _)) => {
                return Err(ServerError::Rejected(format!(
                    "unexpected answer {other:?}"
                )))
            }
            Err(e @ RpcError::Auth { .. }) => {
                return Err(ServerError::Refused {
                    addr: opts.manager,
                    source: e,
                })
            }
            Err(e) if tokio::time::Instant::now() > deadline => {
                return Err(ServerError::Unreachable {
                    addr: opts.manager,
                    reason: e.to_string(),
                })
            }
            Err(e) => {
                warn!("manager not reachable yet ({e}); retrying");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    }
}

/// The address of this machine that packets to `peer` leave from (none is sent).
pub fn route_to(peer: SocketAddr) -> std::io::Result<std::net::IpAddr> {
    let any: SocketAddr = if peer.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let socket = std::net::UdpSocket::bind(any)?;
    socket.connect(peer)?;
    Ok(socket.local_addr()?.ip())
}

/// Binds, registers with the manager, and starts serving and heart-beating.
pub async fn start(opts: ServerOptions) -> Result<RunningServer, ServerError> {
    let listener = TcpListener::bind(opts.listen)
        .await
        .map_err(|source| ServerError::Bind {
            addr: opts.listen,
            source,
        })?;
    let bound = listener.local_addr().map_err(|source| ServerError::Bind {
        addr: opts.listen,
        source,
    })?;
    let addr = match opts.advertise {
        Some(addr) => addr,
        // Bound to every address: the manager and the clients are told the one this machine
        // reaches the manager from.
        None if bound.ip().is_unspecified() => {
            let ip = route_to(opts.manager).map_err(|e| ServerError::Unreachable {
                addr: opts.manager,
                reason: format!("no route from this machine: {e}"),
            })?;
            SocketAddr::new(ip, bound.port())
        }
        None => bound,
    };
    // Registration happens before the stripe size is known: its pool is sized for small frames.
    let probe = RpcConfig::new(opts.secret.clone(), Arc::new(BufferPool::new(64 << 10, 4)));
    let (node, config) = register(&opts, &Conns::new(Arc::new(probe)), addr).await?;
    let pool = stripe_pool(config, opts.prefault);
    let rpc = Arc::new(RpcConfig::new(opts.secret.clone(), pool.clone()));
    let net = Arc::new(Conns::new(rpc.clone()));
    let mut server = launch(opts, addr, node, config, pool, net);
    let serving = tessera_proto::serve(listener, rpc, server.service.clone());
    server.tasks.spawn(failed_at_end(serving));
    Ok(server)
}

/// [`start`] over another network than TCP (a simulation): registers through `net`, as `addr`,
/// and starts the background work; the caller delivers requests to
/// [`RunningServer::service`].
pub async fn start_on(
    opts: ServerOptions,
    addr: SocketAddr,
    net: Arc<dyn Net>,
) -> Result<RunningServer, ServerError> {
    let (node, config) = register(&opts, &*net, addr).await?;
    let pool = stripe_pool(config, opts.prefault);
    Ok(launch(opts, addr, node, config, pool, net))
}

/// The pool of stripe buffers of a cluster with `config`, keeping `prefault` bytes of them
/// pre-faulted.
fn stripe_pool(config: ClusterConfig, prefault: u64) -> Arc<BufferPool> {
    let stripe = config.stripe_size as usize;
    let prefault = usize::try_from(prefault).unwrap_or(usize::MAX) / stripe.max(1);
    Arc::new(BufferPool::new(stripe, stripes(stripe, POOL_BYTES)).with_prefault(prefault))
}

/// Whole stripes in `bytes`, at least one.
fn stripes(stripe: usize, bytes: usize) -> usize {
    (bytes / stripe.max(1)).max(1)
}

/// A registered server's handler and tasks: buffer trimming, copies, purges, heartbeats.
fn launch(
    opts: ServerOptions,
    addr: SocketAddr,
    node: NodeId,
    config: ClusterConfig,
    pool: Arc<BufferPool>,
    net: Arc<dyn Net>,
) -> RunningServer {
    info!(node, %addr, capacity = opts.capacity, "registered with the manager");
    let keep_quiet = stripes(config.stripe_size as usize, POOL_KEEP_QUIET_BYTES);
    let handler = Arc::new(
        NodeHandler::new(node, config, opts.capacity, pool.clone(), net)
            .with_fault_delay(opts.fault_delay),
    );
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(async move {
        loop {
            tokio::time::sleep(POOL_QUIET).await;
            let freed = pool.trim(keep_quiet);
            if freed > 0 {
                debug!(freed, "idle stripe buffers given back");
            }
        }
    });
    if handler.store.pool().prefault_target() > 0 {
        tasks.spawn(failed_at_end(prefault(handler.clone())));
    }
    tasks.spawn(failed_at_end(sync::run(
        handler.clone(),
        opts.manager,
        opts.sync_rate,
    )));
    tasks.spawn(failed_at_end(purge::run(handler.clone())));
    tasks.spawn(failed_at_end(handler.clone().run_leases()));
    let service = Arc::new(Service(handler.clone()));
    tasks.spawn(heartbeat(handler, opts, addr));
    RunningServer {
        addr,
        node,
        service,
        tasks,
    }
}

/// Fills the stripe pool with pre-faulted buffers, a step at a time, whenever no buffer was
/// asked for in the last [`PREFAULT_IDLE`]; never past the memory the data held leaves free.
async fn prefault(handler: Arc<NodeHandler>) {
    let stripe = handler.store.pool().buf_size().max(1);
    let step = stripes(stripe, PREFAULT_STEP_BYTES);
    let mut quiet_since = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(PREFAULT_TICK).await;
        if !handler.store.pool().quiet() {
            quiet_since = tokio::time::Instant::now();
            continue;
        }
        if quiet_since.elapsed() < PREFAULT_IDLE {
            continue;
        }
        let pool = handler.store.pool();
        let free = handler
            .store
            .capacity()
            .saturating_sub(handler.store.used());
        let limit = usize::try_from(free).unwrap_or(usize::MAX) / stripe;
        if pool.idle() >= pool.prefault_target().min(limit) {
            continue;
        }
        let h = handler.clone();
        match tokio::task::spawn_blocking(move || h.store.pool().prefault(limit, step)).await {
            Ok(added) => debug!(added, "stripe buffers pre-faulted"),
            Err(e) => {
                // Serving goes on without: the pool still recycles what writes give back.
                warn!("pre-faulting stopped: {e}");
                std::future::pending::<()>().await;
            }
        }
    }
}

/// A task that should run for the server's life: its end is a failure.
async fn failed_at_end(task: impl std::future::Future<Output = ()>) -> Ended {
    task.await;
    Ended::Failed
}

/// Claims this node's place at a manager that does not know it (restarted), with the table
/// this node holds. Whether the manager took it back (`None`: no answer, ask again later).
async fn rejoin(h: &NodeHandler, opts: &ServerOptions, addr: SocketAddr) -> Option<bool> {
    let Some(table) = h.table().map(|t| t.info.clone()) else {
        return Some(false);
    };
    let req = Request::Rejoin {
        node: h.id(),
        addr,
        capacity: opts.capacity,
        label: opts.label.clone(),
        table,
    };
    match h.peers().call_at(opts.manager, &req).await {
        Ok((Response::Registered { node, .. }, _)) if node == h.id() => {
            info!(node, "rejoined a restarted manager");
            Some(true)
        }
        Ok((other, _)) => {
            debug!("the manager did not take this node back: {other:?}");
            Some(false)
        }
        Err(e) => {
            debug!("rejoining failed: {e}");
            None
        }
    }
}

/// Reports statistics every `heartbeat` and installs newer tables, until the manager retires
/// or forgets this node (the connection to the manager is remade whenever it breaks).
async fn heartbeat(handler: Arc<NodeHandler>, opts: ServerOptions, addr: SocketAddr) -> Ended {
    let mut reachable = true;
    loop {
        let pause = if handler.copies.expire_fences(&handler.store) {
            FENCED_POLL
        } else {
            opts.heartbeat
        };
        tokio::select! {
            biased;
            () = tokio::time::sleep(pause) => {}
            () = handler.refresh_wanted() => {}
        }
        let hb = Request::Heartbeat {
            node: handler.id(),
            addr,
            stats: handler.stats(),
        };
        let answer = handler.peers().call_at(opts.manager, &hb).await;
        match &answer {
            // Serving goes on meanwhile; said once, not at every beat.
            Err(e) if std::mem::replace(&mut reachable, false) => {
                warn!("manager unreachable ({e}): serving with the table held");
            }
            Ok(_) if !std::mem::replace(&mut reachable, true) => info!("manager reachable again"),
            _ => {}
        }
        let epoch = match answer {
            Ok((Response::HeartbeatAck { epoch }, _)) => epoch,
            Ok((Response::Retired, _)) => {
                info!("drained and retired by the manager: exiting");
                purge::finish(&*handler, RETIRED_PURGE_WAIT).await;
                return Ended::Retired;
            }
            Ok((Response::Error(ErrorCode::NotFound), _)) => {
                match rejoin(&handler, &opts, addr).await {
                    Some(true) | None => continue,
                    Some(false) => {}
                }
                warn!("the manager declared this node dead and rebuilt its partitions elsewhere");
                return Ended::Forgotten;
            }
            Ok((other, _)) => {
                warn!("unexpected heartbeat answer {other:?}");
                continue;
            }
            Err(_) => continue,
        };
        if epoch.is_some() && epoch != handler.epoch() {
            match handler
                .peers()
                .call_at(opts.manager, &Request::GetTable)
                .await
            {
                Ok((Response::Table(info), _)) => handler.install(info),
                Ok((other, _)) => warn!("could not fetch the table: {other:?}"),
                Err(e) => warn!("could not fetch the table: {e}"),
            }
        }
    }
}
