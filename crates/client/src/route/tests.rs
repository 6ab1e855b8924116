//! The read and write paths over an in-memory transport: servers that answer at once, never
//! (a slow node), or cannot be reached (a dead one), and a log of what each was sent.

use super::table::{Key, Manager};
use super::transport::{Answer, Reply, Transport};
use super::Router;
use crate::{Error, Result};
use bytes::Bytes;
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tessera_placement::{NodeId, PartitionTable};
use tessera_proto::{
    BufferPool, ClusterConfig, NodeAddr, NoticeSink, Op, Request, Response, RpcConfig, Secret,
    Sink, TableInfo,
};

const PARTITIONS: u32 = 4;
const STRIPE: u32 = 1 << 20;
const FILE: u64 = 7;

#[derive(Clone, Copy, PartialEq)]
enum Node {
    Up,
    /// Takes requests and never answers (the test ends first).
    Slow,
    /// Cannot be reached.
    Dead,
}

#[derive(Default)]
struct Memory {
    nodes: Mutex<HashMap<NodeId, Node>>,
    /// Every request queued, with its node, in order.
    sent: Mutex<Vec<(NodeId, Op)>>,
    notices: OnceLock<NoticeSink>,
    /// The table the servers hold (answered to `GetTable`), once set.
    table: Mutex<Option<TableInfo>>,
}

struct MemReply(Pin<Box<dyn Future<Output = Answer> + Send>>);

impl Reply for MemReply {
    fn wait(self) -> impl Future<Output = Answer> + Send {
        self.0
    }
}

impl Memory {
    fn set(&self, node: NodeId, state: Node) {
        self.nodes.lock().unwrap().insert(node, state);
    }

    fn sent(&self) -> Vec<(NodeId, Op)> {
        self.sent.lock().unwrap().clone()
    }

    fn state(&self, node: NodeId) -> Node {
        *self.nodes.lock().unwrap().get(&node).unwrap_or(&Node::Up)
    }
}

/// The bytes `node` holds: every byte is its id, so a read tells who served it.
fn served_by(node: NodeId, len: u32) -> Bytes {
    Bytes::from(vec![node as u8; len as usize])
}

impl Transport for Memory {
    type Reply = MemReply;

    async fn send(
        &self,
        node: NodeId,
        _addr: SocketAddr,
        req: &Request,
        _payload: Bytes,
        _sink: Option<Box<dyn Sink>>,
    ) -> Result<MemReply> {
        let state = self.state(node);
        if state == Node::Dead {
            return Err(Error::Unavailable(format!("node {node} is dead")));
        }
        let answer: Answer = match req {
            Request::GetTable => match self.table.lock().unwrap().clone() {
                Some(t) => Ok((Response::Table(t), Bytes::new())),
                None => Ok((
                    Response::Error(tessera_proto::ErrorCode::NotReady("no table".into())),
                    Bytes::new(),
                )),
            },
            Request::Op { op, .. } => {
                self.sent.lock().unwrap().push((node, op.clone()));
                let payload = match op {
                    Op::ReadStripe { len, .. } => served_by(node, *len),
                    _ => Bytes::new(),
                };
                Ok((Response::Ok, payload))
            }
            _ => panic!("not a request for servers: {req:?}"),
        };
        Ok(MemReply(match state {
            Node::Slow => Box::pin(async move {
                tokio::time::sleep(Duration::from_secs(600)).await;
                answer
            }),
            _ => Box::pin(async move { answer }),
        }))
    }

    async fn reach(&self, node: NodeId, _addr: SocketAddr) -> Result<()> {
        match self.state(node) {
            Node::Dead => Err(Error::Unavailable(format!("node {node} is dead"))),
            _ => Ok(()),
        }
    }

    fn forget(&self, _keep: impl Fn(&NodeId) -> bool) {}

    fn subscribe(&self, sink: NoticeSink) -> bool {
        self.notices.set(sink).is_ok()
    }

    fn notices(&self) -> Option<&NoticeSink> {
        self.notices.get()
    }
}

/// A router over `Memory` with nodes 1 and 2 each holding every partition, the primary
/// alternating. Its manager is never reached.
fn router() -> Router<Memory> {
    let replicas = (0..PARTITIONS)
        .map(|p| if p % 2 == 0 { vec![1, 2] } else { vec![2, 1] })
        .collect();
    let info = table(1, replicas);
    let rpc = RpcConfig::new(Secret::new("memory"), Arc::new(BufferPool::new(1 << 20, 4)));
    let manager = Manager::new(([127, 0, 0, 1], 9).into(), Arc::new(rpc), None);
    Router::new(manager, info, Memory::default(), Duration::from_secs(1))
}

/// The table of nodes 1 and 2 at `epoch` with these replica lists.
fn table(epoch: u64, replicas: Vec<Vec<NodeId>>) -> TableInfo {
    TableInfo {
        config: ClusterConfig::new(PARTITIONS, STRIPE, 2),
        table: PartitionTable::new(epoch, replicas).unwrap(),
        nodes: (1..=2)
            .map(|id| NodeAddr {
                id,
                addr: SocketAddr::from(([127, 0, 0, 1], 9000 + id as u16)),
            })
            .collect(),
    }
}

/// The replicas of stripe `s` of the test file, primary first.
fn replicas(r: &Router<Memory>, s: u64) -> Vec<NodeId> {
    r.route().replicas(Key::Stripe(FILE, s)).unwrap().to_vec()
}

async fn read(r: &Router<Memory>, stripe: u64, offset: u32, len: u32) -> Vec<Bytes> {
    let parts = r.send_read(FILE, stripe, offset, len, None).await.unwrap();
    let mut got = Vec::new();
    for part in parts {
        got.push(r.finish_read(part).await.unwrap());
    }
    got
}

#[tokio::test]
async fn a_write_goes_to_every_replica_of_its_partition_primary_first() {
    let r = router();
    for stripe in 0..4 {
        let op = Op::WriteStripe {
            file: FILE,
            stripe,
            offset: 0,
        };
        let key = Key::Stripe(FILE, stripe);
        let acks = r
            .send_write(&r.route(), key, &op, &Bytes::from_static(b"abc"))
            .await
            .unwrap();
        let nodes: Vec<NodeId> = acks.iter().map(|a| a.node).collect();
        assert_eq!(nodes, replicas(&r, stripe), "stripe {stripe}");
        assert!(matches!(r.wait_acks(acks).await, super::Outcome::Done));
    }
    let sent: Vec<NodeId> = r.transport.sent().iter().map(|(n, _)| *n).collect();
    let want: Vec<NodeId> = (0..4).flat_map(|s| replicas(&r, s)).collect();
    assert_eq!(
        sent, want,
        "each write went to its partition's replicas, primary first"
    );
}

#[tokio::test]
async fn a_small_read_goes_to_one_replica() {
    let r = router();
    let got = read(&r, 0, 100, 4096).await;
    assert_eq!(got.len(), 1);
    let primary = replicas(&r, 0)[0];
    assert_eq!(
        got[0],
        served_by(primary, 4096),
        "unmeasured: the primary serves"
    );
    assert_eq!(r.transport.sent().len(), 1, "one request only");
}

#[tokio::test]
async fn a_read_moves_on_from_a_dead_replica_to_the_other() {
    let r = router();
    let [dead, alive] = replicas(&r, 1)[..] else {
        panic!("two replicas")
    };
    r.transport.set(dead, Node::Dead);
    let got = read(&r, 1, 0, 4096).await;
    assert_eq!(got, vec![served_by(alive, 4096)]);
}

#[tokio::test]
async fn a_late_read_is_hedged_on_the_other_replica() {
    let r = router();
    let [slow, fast] = replicas(&r, 2)[..] else {
        panic!("two replicas")
    };
    r.transport.set(slow, Node::Slow);
    // The slow node never answers: only the hedge can end this read.
    let got = tokio::time::timeout(Duration::from_secs(60), read(&r, 2, 0, 4096))
        .await
        .expect("the read was hedged");
    assert_eq!(got, vec![served_by(fast, 4096)]);
    let asked: Vec<NodeId> = r.transport.sent().iter().map(|(n, _)| *n).collect();
    assert_eq!(
        asked,
        vec![slow, fast],
        "asked the slow node first, then the other"
    );
    // The late node is now measured slow: the next read goes to the other at once.
    let got = tokio::time::timeout(Duration::from_secs(60), read(&r, 2, 0, 4096))
        .await
        .expect("the read went to the fast node");
    assert_eq!(got, vec![served_by(fast, 4096)]);
}

#[tokio::test]
async fn a_large_read_is_split_over_two_replicas() {
    let r = router();
    let parts = r.send_read(FILE, 3, 0, STRIPE, None).await.unwrap();
    assert_eq!(parts.len(), 2, "split");
    let (a, b) = (&parts[0], &parts[1]);
    assert_eq!((a.offset, a.offset + a.len), (0, b.offset));
    assert_eq!(b.offset + b.len, STRIPE, "the parts cover the read");
    let sent = r.transport.sent();
    let nodes: Vec<NodeId> = sent.iter().map(|(n, _)| *n).collect();
    assert_eq!(nodes, replicas(&r, 3), "one part on each replica");
    for (part, (node, op)) in parts.into_iter().zip(sent) {
        let (offset, len) = (part.offset, part.len);
        assert!(
            matches!(op, Op::ReadStripe { offset: o, len: l, .. } if o == offset && l == len),
            "{op:?}"
        );
        assert_eq!(r.finish_read(part).await.unwrap(), served_by(node, len));
    }
}

/// Node `gone` stopped answering and the cluster moved on without it (its manager is away:
/// the servers hold the new table).
fn drop_node(r: &Router<Memory>, gone: NodeId) {
    r.transport.set(gone, Node::Slow);
    let left: Vec<Vec<NodeId>> = (0..PARTITIONS)
        .map(|_| vec![if gone == 1 { 2 } else { 1 }])
        .collect();
    *r.transport.table.lock().unwrap() = Some(table(2, left));
}

#[tokio::test]
async fn a_request_to_a_node_that_stopped_answering_moves_on_once_the_table_drops_it() {
    let r = router();
    let ino = (1..)
        .find(|&i| r.route().primary(Key::Meta(i)).ok() == Some(1))
        .unwrap();
    drop_node(&r, 1);
    let asked = r.call(None, Key::Meta(ino), Op::InodeGet { ino }, Bytes::new());
    let got = tokio::time::timeout(Duration::from_secs(30), asked)
        .await
        .expect("not left waiting for the request timeout");
    assert!(matches!(got, Ok((Response::Ok, _))), "{got:?}");
    assert_eq!(
        r.route().epoch(),
        2,
        "the servers' table, the manager being away"
    );
    let asked: Vec<NodeId> = r.transport.sent().iter().map(|(n, _)| *n).collect();
    assert_eq!(asked, vec![1, 2], "the hung primary, then the new one");
}

#[tokio::test]
async fn a_write_to_a_mirror_that_stopped_answering_completes_once_the_table_drops_it() {
    let r = router();
    drop_node(&r, 2);
    let op = Op::WriteStripe {
        file: FILE,
        stripe: 0,
        offset: 0,
    };
    let data = Bytes::from_static(b"abc");
    let write = r.write(Key::Stripe(FILE, 0), &op, &data);
    tokio::time::timeout(Duration::from_secs(30), write)
        .await
        .expect("not left waiting for the request timeout")
        .expect("written to the replica left");
    let to_one = r.transport.sent().iter().filter(|(n, _)| *n == 1).count();
    assert_eq!(
        to_one,
        2,
        "sent again to the node left: {:?}",
        r.transport.sent()
    );
}

/// An inode whose partition's primary is node 1.
fn ino_on_1(r: &Router<Memory>) -> u64 {
    (1..)
        .find(|&i| r.route().primary(Key::Meta(i)).ok() == Some(1))
        .unwrap()
}

#[tokio::test]
async fn with_the_manager_away_a_mirror_answers_reads_of_a_dead_or_hung_primary() {
    for primary in [Node::Dead, Node::Slow] {
        let r = router();
        let ino = ino_on_1(&r);
        r.transport.set(1, primary);
        let read = r.read_meta(None, Key::Meta(ino), Op::InodeGet { ino });
        let got = tokio::time::timeout(Duration::from_secs(30), read)
            .await
            .expect("not left waiting for a table that will not come");
        assert!(matches!(got, Ok(Response::Ok)), "{got:?}");
        let asked: Vec<NodeId> = r.transport.sent().iter().map(|(n, _)| *n).collect();
        let expected: &[NodeId] = if primary == Node::Slow { &[1, 2] } else { &[2] };
        assert_eq!(asked, expected, "the primary, then its mirror");
        assert_eq!(
            r.route().epoch(),
            1,
            "no new table: nobody replaced the primary"
        );
    }
}

#[tokio::test]
async fn with_the_manager_away_a_change_waits_for_the_primary_and_an_open_to_read_does_not() {
    let r = router();
    let ino = ino_on_1(&r);
    r.transport.set(1, Node::Dead);
    let open = Op::InodeOpen { ino, holder: 9 };
    let read = Some(Op::InodeGet { ino });
    let called = r
        .call_or_mirror(None, Key::Meta(ino), open.clone(), Bytes::new(), read)
        .await;
    assert!(called.by_mirror && called.answer.is_ok());
    assert!(
        matches!(r.transport.sent().as_slice(), [(2, Op::InodeGet { .. })]),
        "the mirror is asked to read, not to open: {:?}",
        r.transport.sent()
    );
    let changed = r.call(None, Key::Meta(ino), open, Bytes::new()).await;
    assert!(
        matches!(changed, Err(Error::Unavailable(_))),
        "a change fails after the failover timeout: {changed:?}"
    );
    assert_eq!(r.transport.sent().len(), 1, "never made by a mirror");
}
