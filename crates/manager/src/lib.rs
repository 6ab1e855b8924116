//! The Tessera manager: membership, failure detection and the epoch-versioned partition table
//! ([`state`]), the root directory, and an HTTP admin API with Prometheus metrics ([`http`]).
//! It is never on the data path: clients fetch the table and talk to the servers directly.

pub mod history;
pub mod http;
pub mod policy;
pub mod provision;
pub mod state;

use bytes::Bytes;
use policy::{Decision, Policy};
use provision::{ProvisionSpec, Provisioner};
use state::State;

/// Servers one scale request may add (each is a process or a provisioning command).
const MAX_ADD: u32 = 256;
/// How often memory use is sampled (history, elastic policy).
const SAMPLE_EVERY: Duration = Duration::from_secs(1);
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use tessera_placement::{meta_partition, ROOT_INO};
use tessera_proto::{
    BufferPool, ClusterConfig, Conn, ErrorCode, FileKind, Handler, Inode, Op, Reply, Request,
    Response, RpcClient, RpcConfig, Secret,
};
use tokio::net::TcpListener;
use tracing::{info, warn};

#[derive(Debug, Clone)]
pub struct ManagerOptions {
    pub listen: SocketAddr,
    /// HTTP admin API (`/status`, `/table`, `/metrics`, `/health`), if wanted.
    pub http: Option<SocketAddr>,
    pub secret: Secret,
    /// Bearer token the HTTP API requires (the cluster secret in clear).
    pub http_token: String,
    /// Servers that must join before the table is built.
    pub expect_servers: u32,
    pub config: ClusterConfig,
    /// Silence after which a server is declared dead and its copies rebuilt elsewhere.
    pub heartbeat_timeout: Duration,
    /// Permission bits of the root directory.
    pub root_mode: u32,
    /// Where new servers come from (`tessera scale --add`, the elastic policy).
    pub provision: Option<ProvisionSpec>,
    /// Grow and shrink with memory use (needs a provisioner to grow).
    pub policy: Option<policy::PolicyConfig>,
}

#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("invalid configuration: {0}")]
    Config(String),
}

impl ManagerOptions {
    fn validate(&self) -> Result<(), ManagerError> {
        let c = &self.config;
        let bad = |m: String| Err(ManagerError::Config(m));
        if self.expect_servers == 0 {
            return bad("the cluster needs at least one server (--expect)".into());
        }
        c.validate().map_err(ManagerError::Config)?;
        if u32::from(c.replication) > self.expect_servers {
            return bad(format!(
                "replication {} must be at most the server count {}",
                c.replication, self.expect_servers
            ));
        }
        if let Some(p) = &self.policy {
            p.validate()
                .map_err(|e| ManagerError::Config(e.to_string()))?;
            if self.provision.is_none() {
                return bad("the elastic policy needs a provisioner (--provision)".into());
            }
        }
        if self.heartbeat_timeout.is_zero() {
            return bad("the time after which a silent server is dead must not be zero".into());
        }
        Ok(())
    }
}

pub(crate) struct Shared {
    state: Mutex<State>,
    root_mode: u32,
    provisioner: Mutex<Option<Provisioner>>,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn provisioner(&self) -> MutexGuard<'_, Option<Provisioner>> {
        self.provisioner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Grows by `add` servers (through the provisioner) and drains `remove`.
    fn scale(
        &self,
        add: u32,
        remove: &[tessera_placement::NodeId],
        now: Instant,
    ) -> Result<(), ErrorCode> {
        if add > MAX_ADD {
            return Err(ErrorCode::Invalid(format!(
                "at most {MAX_ADD} servers can be added at once (asked for {add})"
            )));
        }
        if add > 0 {
            let taken = self.lock().member_addrs();
            let mut prov = self.provisioner();
            let prov = prov
                .as_mut()
                .ok_or_else(|| ErrorCode::Invalid(provision::ProvisionError::None.to_string()))?;
            prov.add(add, &taken)
                .map_err(|e| ErrorCode::Internal(e.to_string()))?;
        }
        if !remove.is_empty() {
            self.lock().drain(remove, now)?;
        }
        Ok(())
    }

    /// Hands retired servers to the provisioner, and reaps the processes it started.
    fn release_retired(&self) {
        let retired = self.lock().take_released();
        if let Some(p) = self.provisioner().as_mut() {
            for (node, addr) in retired {
                p.release(node, addr);
            }
            p.reap();
        }
    }
}

pub struct RunningManager {
    rpc_addr: SocketAddr,
    http_addr: Option<SocketAddr>,
    tasks: tokio::task::JoinSet<()>,
}

impl RunningManager {
    #[must_use]
    pub fn rpc_addr(&self) -> SocketAddr {
        self.rpc_addr
    }
    #[must_use]
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http_addr
    }
    pub async fn wait(mut self) {
        while self.tasks.join_next().await.is_some() {}
    }
}

struct ManagerHandler {
    shared: Arc<Shared>,
    rpc: Arc<RpcConfig>,
}

impl Handler for ManagerHandler {
    fn handle(&self, _: &Conn, req: Request, _payload: Bytes) -> Reply {
        let now = Instant::now();
        let resp = match req {
            Request::Scale { add, remove } => match self.shared.scale(add, &remove, now) {
                Ok(()) => Response::Ok,
                Err(e) => Response::Error(e),
            },
            req => {
                let (resp, built) = self.shared.lock().answer(req, now);
                if built {
                    tokio::spawn(create_root(self.shared.clone(), self.rpc.clone()));
                }
                resp
            }
        };
        Reply::Now(resp, Bytes::new())
    }
}

/// Failure detection: declares servers silent for longer than the timeout dead and publishes
/// the re-planned table (servers learn it from their next heartbeat, clients when a request
/// fails or is answered with a stale epoch).
async fn watch(shared: Arc<Shared>, timeout: Duration) {
    // A few checks per timeout bound how late a death is noticed.
    let every = (timeout / 4).clamp(Duration::from_millis(10), Duration::from_millis(200));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_sample: Option<Instant> = None;
    loop {
        tick.tick().await;
        let now = Instant::now();
        shared.lock().tick(now);
        shared.release_retired();
        if last_sample.is_none_or(|t| now.duration_since(t) >= SAMPLE_EVERY) {
            last_sample = Some(now);
            let decision = shared.lock().elastic(now);
            let acted = match decision {
                Decision::None => Ok(()),
                Decision::Add(n) => shared.scale(n, &[], now),
                Decision::Remove(ids) => shared.scale(0, &ids, now),
            };
            if let Err(e) = acted {
                warn!("elastic policy: {e}");
            }
        }
    }
}

/// Creates the root directory through the primary of its partition (which forwards it to the
/// other replicas); retries while the servers catch up with the new table, following the
/// table if the primary changes. (Clients wait for the root before they report ready.)
async fn create_root(shared: Arc<Shared>, rpc: Arc<RpcConfig>) {
    // SAFETY: getuid/getgid have no preconditions and cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let inode = Inode::new(
        ROOT_INO,
        FileKind::Dir,
        shared.root_mode,
        uid,
        gid,
        ROOT_INO,
        Vec::new(),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let target = shared.lock().table().and_then(|info| {
            let p = meta_partition(ROOT_INO, info.config.partitions);
            let node = info.table.primary(p)?;
            let addr = info.nodes.iter().find(|n| n.id == node)?.addr;
            Some((node, addr, info.table.epoch()))
        });
        let reply = match target {
            None => Err("the root's partition has no live primary".to_string()),
            Some((_, addr, epoch)) => {
                let req = Request::Op {
                    epoch,
                    op: Op::InodeCreate {
                        inode: inode.clone(),
                    },
                };
                match RpcClient::connect(addr, &rpc).await {
                    Ok(c) => c
                        .call(&req, Bytes::new())
                        .await
                        .map(|r| r.0)
                        .map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                }
            }
        };
        match reply {
            Ok(Response::Ok | Response::Error(ErrorCode::Exists)) => break,
            other if Instant::now() > deadline => {
                let node = target.map(|t| t.0);
                warn!(?node, "could not create the root directory: {other:?}");
                return;
            }
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    info!("root directory created; the cluster is ready");
}

/// Binds the RPC (and HTTP) listeners and starts serving.
pub async fn start(opts: ManagerOptions) -> Result<RunningManager, ManagerError> {
    opts.validate()?;
    let listener = TcpListener::bind(opts.listen)
        .await
        .map_err(|source| ManagerError::Bind {
            addr: opts.listen,
            source,
        })?;
    let rpc_addr = listener.local_addr().map_err(|source| ManagerError::Bind {
        addr: opts.listen,
        source,
    })?;
    let mut state = State::new(opts.config, opts.expect_servers, opts.heartbeat_timeout);
    if let Some(cfg) = opts.policy.clone() {
        let policy = Policy::new(cfg).map_err(|e| ManagerError::Config(e.to_string()))?;
        state.set_policy(policy);
    }
    let shared = Arc::new(Shared {
        state: Mutex::new(state),
        root_mode: opts.root_mode,
        provisioner: Mutex::new(
            opts.provision
                .clone()
                .map(|spec| Provisioner::new(spec, rpc_addr, opts.http_token.clone())),
        ),
    });
    let rpc = Arc::new(RpcConfig::new(
        opts.secret.clone(),
        Arc::new(BufferPool::new(64 << 10, 4)),
    ));
    let mut tasks = tokio::task::JoinSet::new();
    let handler = Arc::new(ManagerHandler {
        shared: shared.clone(),
        rpc: rpc.clone(),
    });
    tasks.spawn(tessera_proto::serve(listener, rpc, handler));
    tasks.spawn(watch(shared.clone(), opts.heartbeat_timeout));
    let http_addr = match opts.http {
        Some(addr) => {
            let l = TcpListener::bind(addr)
                .await
                .map_err(|source| ManagerError::Bind { addr, source })?;
            let bound = l
                .local_addr()
                .map_err(|source| ManagerError::Bind { addr, source })?;
            tasks.spawn(http::serve(l, shared, opts.http_token.clone()));
            Some(bound)
        }
        None => None,
    };
    info!(%rpc_addr, ?http_addr, expect = opts.expect_servers, "manager listening");
    Ok(RunningManager {
        rpc_addr,
        http_addr,
        tasks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: SocketAddr, path: &str, token: Option<&str>) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let auth = token
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn serves_the_table_status_and_metrics_to_members_only() {
        let opts = ManagerOptions {
            listen: "127.0.0.1:0".parse().unwrap(),
            http: Some("127.0.0.1:0".parse().unwrap()),
            secret: Secret::new("s3cret"),
            http_token: "s3cret".into(),
            expect_servers: 1,
            config: ClusterConfig::new(8, 1 << 20, 1),
            heartbeat_timeout: Duration::from_secs(5),
            root_mode: 0o755,
            provision: None,
            policy: None,
        };
        let m = start(opts.clone()).await.unwrap();
        let rpc = RpcConfig::new(Secret::new("s3cret"), Arc::new(BufferPool::new(1 << 16, 2)));
        let c = RpcClient::connect(m.rpc_addr(), &rpc).await.unwrap();
        let (resp, _) = c.call(&Request::GetTable, Bytes::new()).await.unwrap();
        assert!(
            matches!(resp, Response::Error(ErrorCode::NotReady(_))),
            "{resp:?}"
        );
        let reg = Request::Register {
            addr: "127.0.0.9:1".parse().unwrap(),
            capacity: 1 << 30,
            label: None,
        };
        assert!(matches!(
            c.call(&reg, Bytes::new()).await.unwrap().0,
            Response::Registered { node: 1, .. }
        ));
        let Response::Table(t) = c.call(&Request::GetTable, Bytes::new()).await.unwrap().0 else {
            panic!("no table")
        };
        assert_eq!((t.table.epoch(), t.table.load()[&1]), (1, 8));
        // Nothing is being synced: every completion is refused, a bad partition too.
        for partition in [0, 8, u32::MAX] {
            let done = Request::SyncDone {
                node: 1,
                partition,
                epoch: 1,
            };
            let resp = c.call(&done, Bytes::new()).await.unwrap().0;
            assert!(
                matches!(resp, Response::Error(ErrorCode::Invalid(_))),
                "{resp:?}"
            );
        }

        let http = m.http_addr().unwrap();
        assert!(get(http, "/health", None).await.contains("200 OK"));
        assert!(get(http, "/status", None).await.contains("401"));
        assert!(get(http, "/status", Some("wrong")).await.contains("401"));
        let status = get(http, "/status", Some("s3cret")).await;
        assert!(
            status.contains("200 OK") && status.contains("\"expected_servers\":1"),
            "{status}"
        );
        let metrics = get(http, "/metrics", Some("s3cret")).await;
        let table = get(http, "/table", Some("s3cret")).await;
        for key in ["\"incoming\":[[]", "\"changed\":[1,", "\"lost\":[]"] {
            assert!(table.contains(key), "{key} missing in {table}");
        }
        for name in [
            "tessera_epoch 1",
            "tessera_partitions{state=\"degraded\"} 0",
            "tessera_partitions{state=\"lost\"} 0",
            "tessera_partition_copies_incoming 0",
            "tessera_node_syncing_partitions{node=\"1\"} 0",
            "tessera_node_synced_bytes_total{node=\"1\"} 0",
            "tessera_node_memory_capacity_bytes{node=\"1\"} 1073741824",
            "tessera_node_ops_total",
        ] {
            assert!(metrics.contains(name), "{name} missing in {metrics}");
        }
        let bad = RpcConfig::new(Secret::new("guess"), Arc::new(BufferPool::new(1 << 16, 2)));
        assert!(RpcClient::connect(m.rpc_addr(), &bad).await.is_err());
        let mut wrong = opts;
        wrong.config.replication = 2;
        assert!(matches!(start(wrong).await, Err(ManagerError::Config(_))));
    }
}
