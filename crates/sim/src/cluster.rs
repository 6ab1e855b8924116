//! The simulated cluster: the manager's real [`State`] answering at one address (with the tick
//! its watch task runs), real servers ([`tessera_server::start_on`]) at others, each under a
//! supervisor that starts a forgotten server again as a new node, as `tessera up` does.

use crate::net::{ServerPort, SimNet, Target};
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;
use tessera_manager::state::State;
use tessera_proto::{ClusterConfig, Secret, TableInfo};
use tessera_server::handler::Service;
use tessera_server::{Ended, ServerOptions};
use tokio::task::JoinHandle;

/// The manager's dead-node time (`--dead-after`).
pub const DEAD_AFTER: Duration = Duration::from_secs(2);
const CAPACITY: u64 = 1 << 30;

pub struct Server {
    pub service: Arc<OnceLock<Arc<Service>>>,
    task: JoinHandle<()>,
}

#[derive(Default)]
struct Members {
    manager: Option<(Arc<Mutex<State>>, JoinHandle<()>)>,
    servers: BTreeMap<SocketAddr, Server>,
    next: u32,
    /// The newest table the manager held, kept across its restarts.
    last_table: Option<TableInfo>,
}

pub struct Cluster {
    pub net: Arc<SimNet>,
    pub config: ClusterConfig,
    pub expect: u32,
    pub manager_addr: SocketAddr,
    members: Mutex<Members>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Cluster {
    #[must_use]
    pub fn new(net: Arc<SimNet>, config: ClusterConfig, expect: u32) -> Arc<Self> {
        Arc::new(Self {
            net,
            config,
            expect,
            manager_addr: SocketAddr::from((Ipv4Addr::new(10, 0, 0, 1), 7000)),
            members: Mutex::default(),
        })
    }

    /// Starts a manager that knows nothing (the first, or one started again).
    pub fn start_manager(self: &Arc<Self>) {
        let state = Arc::new(Mutex::new(State::new(self.config, self.expect, DEAD_AFTER)));
        self.net
            .attach(self.manager_addr, Target::Manager(state.clone()));
        let (net, st) = (self.net.clone(), state.clone());
        // The manager's watch task: a few failure checks per dead-node time.
        let tick = tokio::spawn(async move {
            loop {
                tokio::time::sleep(DEAD_AFTER / 4).await;
                let now = net.now_std();
                lock(&st).tick(now);
            }
        });
        self.net.log.event("manager started".into());
        lock(&self.members).manager = Some((state, tick));
    }

    pub fn kill_manager(&self) {
        if let Some((_, tick)) = lock(&self.members).manager.take() {
            tick.abort();
            self.net.kill(self.manager_addr);
            self.net.log.event("manager killed".into());
        }
    }

    #[must_use]
    pub fn manager_up(&self) -> bool {
        lock(&self.members).manager.is_some()
    }

    /// The manager's table now (`None` while it is down or has none).
    #[must_use]
    pub fn table(&self) -> Option<TableInfo> {
        let mut m = lock(&self.members);
        let t = m
            .manager
            .as_ref()
            .and_then(|(s, _)| lock(s).table_info().ok().cloned());
        if let Some(t) = &t {
            m.last_table = Some(t.clone());
        }
        t
    }

    /// Starts a new server (`slow`: every stripe request waits that long).
    pub fn start_server(self: &Arc<Self>, slow: Duration) -> SocketAddr {
        let addr = {
            let mut m = lock(&self.members);
            m.next += 1;
            let n = m.next;
            SocketAddr::from((
                Ipv4Addr::new(10, 0, (n / 250 + 1) as u8, (n % 250 + 2) as u8),
                7000,
            ))
        };
        let cell: Arc<OnceLock<Arc<Service>>> = Arc::default();
        self.net.attach(addr, Target::Server(cell.clone()));
        let mut opts = ServerOptions::new(addr, self.manager_addr, Secret::new("sim"), CAPACITY);
        opts.fault_delay = slow;
        let (cluster, set) = (self.clone(), cell.clone());
        let port = Arc::new(ServerPort {
            net: self.net.clone(),
            me: addr,
        });
        let task = tokio::spawn(async move {
            let log = &cluster.net.log;
            match tessera_server::start_on(opts, addr, port).await {
                Ok(s) => {
                    log.event(format!("server {addr} registered as node {}", s.node()));
                    let _ = set.set(s.service().clone());
                    let ended = s.wait().await;
                    log.event(format!("server {addr} ended: {ended:?}"));
                    cluster.remove(addr);
                    if ended == Ended::Forgotten {
                        cluster.start_server(Duration::ZERO);
                    }
                }
                Err(e) => {
                    log.event(format!("server {addr} did not start: {e}"));
                    cluster.remove(addr);
                }
            }
        });
        lock(&self.members).servers.insert(
            addr,
            Server {
                service: cell,
                task,
            },
        );
        self.net.log.event(format!(
            "server {addr} started{}",
            if slow.is_zero() {
                String::new()
            } else {
                format!(", slow by {slow:?}")
            }
        ));
        addr
    }

    fn remove(&self, addr: SocketAddr) {
        lock(&self.members).servers.remove(&addr);
        self.net.kill(addr);
    }

    /// Kills the server at `addr`: its tasks stop, its memory is gone.
    pub fn kill_server(&self, addr: SocketAddr) {
        if let Some(s) = lock(&self.members).servers.remove(&addr) {
            s.task.abort();
        }
        self.net.kill(addr);
        self.net.log.event(format!("server {addr} killed"));
    }

    /// The servers alive now, with their handlers once registered.
    #[must_use]
    pub fn servers(&self) -> Vec<(SocketAddr, Option<Arc<Service>>)> {
        lock(&self.members)
            .servers
            .iter()
            .map(|(a, s)| (*a, s.service.get().cloned()))
            .collect()
    }

    /// Ends every task of the cluster.
    pub fn stop(&self) {
        let mut m = lock(&self.members);
        if let Some((_, tick)) = m.manager.take() {
            tick.abort();
        }
        for (_, s) in std::mem::take(&mut m.servers) {
            s.task.abort();
        }
    }
}
