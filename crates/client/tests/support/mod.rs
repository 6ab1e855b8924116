//! Test support shared by the client's integration tests: a manager reduced to a script.
#![allow(dead_code)] // each test file uses part of it

use bytes::Bytes;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tessera_placement::{assign, meta_partition, NodeId, NodeWeight, PartitionTable, ROOT_INO};
use tessera_proto::{
    serve, BufferPool, ClusterConfig, Conn, ErrorCode, FileKind, Handler, Inode, NodeAddr, Op,
    Reply, Request, Response, RpcClient, RpcConfig, Secret, TableInfo,
};

/// A scripted manager on 127.0.0.1 and `servers` real storage servers on 127.0.0.2 on, which
/// register with it; the test then publishes tables.
pub async fn start(
    config: ClusterConfig,
    secret: &str,
    servers: u8,
) -> (
    Arc<FakeManager>,
    SocketAddr,
    Vec<tessera_server::RunningServer>,
) {
    let manager = Arc::new(FakeManager::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let maddr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, Arc::new(rpc(secret)), manager.clone()));
    let mut running = Vec::new();
    for i in 0..servers {
        let listen = format!("127.0.0.{}:0", i + 2).parse().unwrap();
        let mut opts =
            tessera_server::ServerOptions::new(listen, maddr, Secret::new(secret), 256 << 20);
        opts.heartbeat = Duration::from_millis(100);
        running.push(tessera_server::start(opts).await.unwrap());
    }
    (manager, maddr, running)
}

/// [`start`], a table with every partition assigned (epoch 1) that every server has, the
/// root directory, and a client.
pub async fn ready(
    config: ClusterConfig,
    secret: &str,
    servers: u8,
) -> (
    Arc<FakeManager>,
    Vec<tessera_server::RunningServer>,
    tessera_client::Client,
) {
    let (manager, maddr, running) = start(config, secret, servers).await;
    let table = manager.publish_assigned(1);
    manager.fetched_by(u32::from(servers)).await;
    create_root(&table, secret).await;
    let opts = tessera_client::ClientOptions::new(maddr, secret);
    let client = tessera_client::Client::connect(opts).await.unwrap();
    (manager, running, client)
}

pub fn rpc(secret: &str) -> RpcConfig {
    RpcConfig::new(Secret::new(secret), Arc::new(BufferPool::new(1 << 20, 8)))
}

/// Creates the root directory through the primary of its partition (which forwards it to the
/// other replicas), as the real manager does.
pub async fn create_root(info: &TableInfo, secret: &str) {
    let p = meta_partition(ROOT_INO, info.config.partitions);
    let owner = info.table.replicas(p)[0];
    let addr = info.nodes.iter().find(|n| n.id == owner).unwrap().addr;
    let root = Inode::new(ROOT_INO, FileKind::Dir, 0o755, 0, 0, ROOT_INO, Vec::new());
    let conn = RpcClient::connect(addr, &rpc(secret)).await.unwrap();
    let req = Request::Op {
        epoch: info.table.epoch(),
        op: Op::InodeCreate { inode: root },
    };
    for _ in 0..200 {
        if conn.call(&req, Bytes::new()).await.unwrap().0 == Response::Ok {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the root's server never installed the table");
}

/// A manager reduced to what the tests need: members, and tables the test publishes.
pub struct FakeManager {
    pub config: ClusterConfig,
    members: Mutex<Vec<NodeAddr>>,
    table: Mutex<Option<TableInfo>>,
    /// Tables handed out since the last publish.
    fetched: Mutex<u32>,
}

impl FakeManager {
    pub fn new(config: ClusterConfig) -> Self {
        Self {
            config,
            members: Mutex::default(),
            table: Mutex::default(),
            fetched: Mutex::default(),
        }
    }

    pub fn table(&self) -> TableInfo {
        self.table.lock().unwrap().clone().unwrap()
    }

    /// A table at `epoch` over every member, `config.replication` copies of each partition.
    pub fn publish_assigned(&self, epoch: u64) -> TableInfo {
        let nodes = self.members.lock().unwrap().clone();
        let weights: Vec<_> = nodes
            .iter()
            .map(|n| NodeWeight {
                node: n.id,
                capacity: 1,
                domain: None,
            })
            .collect();
        let replicas = assign(
            None,
            &weights,
            self.config.partitions,
            self.config.replication,
        )
        .unwrap();
        let info = TableInfo {
            config: self.config,
            table: PartitionTable::new(epoch, replicas).unwrap(),
            nodes,
        };
        *self.table.lock().unwrap() = Some(info.clone());
        *self.fetched.lock().unwrap() = 0;
        info
    }

    /// The next epoch with these replica lists (nothing incoming).
    pub fn publish_next(&self, replicas: Vec<Vec<NodeId>>) {
        let mut guard = self.table.lock().unwrap();
        let info = guard.as_mut().unwrap();
        let incoming = vec![Vec::new(); replicas.len()];
        info.table = info.table.next(replicas, incoming).unwrap();
        *self.fetched.lock().unwrap() = 0;
    }

    /// Waits until `servers` fetched the last table published.
    pub async fn fetched_by(&self, servers: u32) {
        for _ in 0..400 {
            if *self.fetched.lock().unwrap() >= servers {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("the servers did not fetch the new table");
    }
}

impl Handler for FakeManager {
    fn handle(&self, _: &Conn, req: Request, _: Bytes) -> Reply {
        let resp = match req {
            Request::Register { addr, .. } => {
                let mut m = self.members.lock().unwrap();
                let id = m.len() as u32 + 1;
                m.push(NodeAddr { id, addr });
                Response::Registered {
                    node: id,
                    config: self.config,
                }
            }
            Request::Heartbeat { .. } => Response::HeartbeatAck {
                epoch: self.table.lock().unwrap().as_ref().map(|t| t.table.epoch()),
            },
            Request::GetTable => match self.table.lock().unwrap().clone() {
                Some(t) => {
                    *self.fetched.lock().unwrap() += 1;
                    Response::Table(t)
                }
                None => Response::Error(ErrorCode::NotReady("no table".into())),
            },
            _ => Response::Error(ErrorCode::Invalid("not in this test".into())),
        };
        Reply::Now(resp, Bytes::new())
    }
}
