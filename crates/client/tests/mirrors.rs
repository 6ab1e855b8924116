//! The client with replicated partitions: real storage servers, a scripted manager whose
//! tables the test writes, and TCP proxies in front of the servers so a test can make one
//! unreachable (as a killed server is) while the manager still lists it.

use bytes::Bytes;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tessera_client::{Client, ClientOptions, OpenOptions, WriteAck};
use tessera_placement::{stripe_partition, NodeId};
use tessera_proto::{serve, ClusterConfig, Op, Request, Response, RpcClient, RpcConfig, Secret};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

mod support;

use support::FakeManager;

const SECRET: &str = "mirrors";
const MIB: usize = 1 << 20;

fn config(replication: u8) -> ClusterConfig {
    ClusterConfig::new(64, MIB as u32, replication)
}

/// A TCP proxy in front of a server; `cut` closes its connections and stops listening, so the
/// server is unreachable as a killed one is.
struct Proxy {
    addr: SocketAddr,
    target: Arc<Mutex<Option<SocketAddr>>>,
    tasks: Arc<Mutex<JoinSet<()>>>,
}

impl Proxy {
    async fn start(ip: &str) -> Self {
        let listener = TcpListener::bind(format!("{ip}:0")).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let target: Arc<Mutex<Option<SocketAddr>>> = Arc::default();
        let tasks: Arc<Mutex<JoinSet<()>>> = Arc::default();
        let (t, ts) = (target.clone(), tasks.clone());
        tasks.lock().unwrap().spawn(async move {
            while let Ok((mut down, _)) = listener.accept().await {
                let Some(to) = *t.lock().unwrap() else {
                    continue;
                };
                ts.lock().unwrap().spawn(async move {
                    if let Ok(mut up) = TcpStream::connect(to).await {
                        let _ = up.set_nodelay(true);
                        let _ = down.set_nodelay(true);
                        let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                    }
                });
            }
        });
        Self {
            addr,
            target,
            tasks,
        }
    }

    fn cut(&self) {
        self.tasks.lock().unwrap().abort_all();
    }
}

fn rpc() -> RpcConfig {
    support::rpc(SECRET)
}

struct Cluster {
    manager: Arc<FakeManager>,
    maddr: SocketAddr,
    proxies: Vec<Proxy>,
    /// Each node's own address (not through its proxy).
    direct: Vec<(NodeId, SocketAddr)>,
    _servers: Vec<tessera_server::RunningServer>,
}

impl Cluster {
    /// `delays[i]`: fault delay of server i (every stripe request waits that long).
    async fn start(replication: u8, delays: &[Duration]) -> Self {
        let manager = Arc::new(FakeManager::new(config(replication)));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let maddr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, Arc::new(rpc()), manager.clone()));
        let (mut proxies, mut servers, mut direct) = (Vec::new(), Vec::new(), Vec::new());
        for (i, delay) in delays.iter().enumerate() {
            let ip = format!("127.0.0.{}", i + 2);
            let proxy = Proxy::start(&ip).await;
            let listen = free_addr(&ip);
            let mut opts =
                tessera_server::ServerOptions::new(listen, maddr, Secret::new(SECRET), 512 << 20);
            opts.heartbeat = Duration::from_millis(100);
            opts.advertise = Some(proxy.addr);
            opts.fault_delay = *delay;
            let server = tessera_server::start(opts).await.unwrap();
            *proxy.target.lock().unwrap() = Some(listen);
            direct.push((server.node(), listen));
            proxies.push(proxy);
            servers.push(server);
        }
        let first = manager.publish_assigned(1);
        support::create_root(&first, SECRET).await;
        Self {
            manager,
            maddr,
            proxies,
            direct,
            _servers: servers,
        }
    }

    async fn client(&self, tweak: impl FnOnce(&mut ClientOptions)) -> Client {
        let mut opts = ClientOptions::new(self.maddr, SECRET);
        tweak(&mut opts);
        Client::connect(opts).await.unwrap()
    }

    /// A whole stripe as node `node` holds it, asked directly (not through its proxy).
    async fn stripe_on(&self, node: NodeId, file: u64, stripe: u64) -> (Response, Bytes) {
        let addr = self.direct.iter().find(|(n, _)| *n == node).unwrap().1;
        let conn = RpcClient::connect(addr, &rpc()).await.unwrap();
        let req = Request::Op {
            epoch: self.manager.table().table.epoch(),
            op: Op::ReadStripe {
                file,
                stripe,
                offset: 0,
                len: MIB as u32,
            },
        };
        conn.call(&req, Bytes::new()).await.unwrap()
    }
}

/// A free port on `ip` (the server's own address; its proxy's is the one it registers).
fn free_addr(ip: &str) -> SocketAddr {
    std::net::TcpListener::bind(format!("{ip}:0"))
        .unwrap()
        .local_addr()
        .unwrap()
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3] ^ seed)
        .collect()
}

/// Checks that every replica of every stripe of `path` holds exactly what was written (a hole
/// at a stripe's end may be left out).
async fn check_replicas(cluster: &Cluster, client: &Client, path: &str, data: &[u8]) {
    let ino = client.stat(path).await.unwrap().ino;
    let info = cluster.manager.table();
    for (stripe, want) in data.chunks(MIB).enumerate() {
        let p = stripe_partition(ino, stripe as u64, info.config.partitions);
        for &node in info.table.replicas(p) {
            let (resp, got) = cluster.stripe_on(node, ino, stripe as u64).await;
            assert_eq!(resp, Response::Ok, "{path} stripe {stripe} on node {node}");
            // A stripe with a hole at its end (written past) holds only what comes before it.
            let (held, hole) = want.split_at(got.len().min(want.len()));
            assert!(
                got == held && hole.iter().all(|&b| b == 0),
                "{path} stripe {stripe} differs on node {node}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_reach_every_replica_with_both_protocols() {
    let cluster = Cluster::start(2, &[Duration::ZERO; 3]).await;
    let client = cluster.client(|o| o.mirror_lag = 2).await;
    let all = pattern(1, 3 * MIB + 12_345);
    client.write("/all", &all).await.unwrap();

    let primary = pattern(2, 5 * MIB + 7);
    let opts = OpenOptions {
        write_ack: Some(WriteAck::Primary),
        ..OpenOptions::create()
    };
    let mut f = client.open("/primary", &opts).await.unwrap();
    for chunk in primary.chunks(256 << 10) {
        f.write(chunk).await.unwrap();
    }
    f.close().await.unwrap();

    for (path, data) in [("/all", &all), ("/primary", &primary)] {
        assert!(
            client.read(path).await.unwrap() == *data,
            "{path} reads back"
        );
        check_replicas(&cluster, &client, path, data).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_replica_costs_the_application_no_error() {
    let cluster = Cluster::start(2, &[Duration::ZERO; 3]).await;
    let client = cluster.client(|_| {}).await;
    let before = pattern(3, 6 * MIB);
    client.write("/before", &before).await.unwrap();

    // While the loop below writes and reads, node 2 becomes unreachable (as if killed); the
    // manager notices a little later and publishes a table without it (every partition keeps
    // its other copy).
    let dead = cluster.direct[1].0;
    let proxy = cluster.proxies[1].tasks.clone();
    let manager = cluster.manager.clone();
    let publisher = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        proxy.lock().unwrap().abort_all();
        tokio::time::sleep(Duration::from_millis(700)).await;
        let lists = manager.table().table.all().to_vec();
        let without = lists
            .into_iter()
            .map(|l| l.into_iter().filter(|&n| n != dead).collect())
            .collect();
        manager.publish_next(without);
    });

    let started = Instant::now();
    let mut written = Vec::new();
    let mut i = 0u8;
    while started.elapsed() < Duration::from_millis(2_500) || i < 3 {
        let data = pattern(10 + i, 2 * MIB + 1000 * usize::from(i));
        let path = format!("/f{i}");
        let ack = if i.is_multiple_of(2) {
            WriteAck::All
        } else {
            WriteAck::Primary
        };
        let opts = OpenOptions {
            write_ack: Some(ack),
            ..OpenOptions::create()
        };
        let mut f = client.open(&path, &opts).await.unwrap();
        f.write(&data).await.unwrap();
        f.close().await.unwrap();
        client.create_dir(&format!("/d{i}")).await.unwrap();
        assert!(client.read("/before").await.unwrap() == before, "/before");
        assert!(client.read(&path).await.unwrap() == data, "{path}");
        written.push((path, data));
        i += 1;
    }
    publisher.await.unwrap();
    assert_eq!(client.epoch(), 2, "the client follows the new table");
    cluster.manager.fetched_by(2).await;
    for (path, data) in &written {
        assert!(client.read(path).await.unwrap() == *data, "{path}");
        check_replicas(&cluster, &client, path, data).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_partition_fails_with_eio_at_once() {
    let cluster = Cluster::start(1, &[Duration::ZERO; 2]).await;
    let client = cluster.client(|_| {}).await;
    let data = pattern(4, 16 * MIB);
    client.write("/f", &data).await.unwrap();
    let mut f = client.open("/f", &OpenOptions::read_write()).await.unwrap();
    let info = cluster.manager.table();
    let (gone, kept) = (cluster.direct[1].0, cluster.direct[0].0);
    let on = |node: NodeId| {
        (0..16u64).find(|&s| info.table.replicas(stripe_partition(f.ino(), s, 64)) == [node])
    };
    let (lost, safe) = (on(gone).unwrap(), on(kept).unwrap());

    // Node 2 dies with the only copy of its partitions.
    cluster.proxies[1].cut();
    let lists = info
        .table
        .all()
        .iter()
        .map(|l| l.iter().copied().filter(|&n| n != gone).collect())
        .collect();
    cluster.manager.publish_next(lists);
    cluster.manager.fetched_by(1).await;

    let started = Instant::now();
    let at = lost * MIB as u64;
    let err = f.read_at(at, 4096).await.unwrap_err();
    assert_eq!(err.errno(), libc_eio(), "{err}");
    assert!(err.to_string().contains("partition"), "{err}");
    let err = f.write_at(at, &vec![7; MIB]).await.unwrap_err();
    assert_eq!(err.errno(), libc_eio(), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "no waiting on a lost partition"
    );
    // The rest of the file is still there.
    let at = safe * MIB as u64;
    let got = f.read_at(at, MIB).await.unwrap();
    assert!(
        got == data[at as usize..at as usize + MIB],
        "a stripe that survived"
    );
}

fn libc_eio() -> i32 {
    5
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_skip_a_slow_replica() {
    let slow = Duration::from_millis(80);
    let cluster = Cluster::start(2, &[Duration::ZERO, slow]).await;
    let client = cluster.client(|_| {}).await;
    let data = pattern(5, 8 * MIB);
    client.write("/f", &data).await.unwrap();
    let mut f = client.open("/f", &OpenOptions::read()).await.unwrap();
    // Not sequential (no read-ahead): each read is one split request pair or one request.
    let order = [5u64, 1, 7, 3, 6, 2, 0, 4];
    // The first reads measure both nodes.
    for s in [2u64, 6] {
        let at = (s as usize) * MIB;
        assert!(f.read_at(at as u64, MIB).await.unwrap() == data[at..at + MIB]);
    }
    let started = Instant::now();
    let reads = 3 * order.len();
    for s in order.iter().cycle().take(reads) {
        let at = (*s as usize) * MIB;
        assert!(f.read_at(at as u64, MIB).await.unwrap() == data[at..at + MIB]);
    }
    let took = started.elapsed();
    // Each read that touched the slow node would take 80 ms: 24 of them 1.9 s.
    assert!(
        took < slow * (reads as u32) / 3,
        "{reads} reads took {took:?}: the slow replica was not skipped"
    );
    f.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_never_replaced_fails_after_the_failover_timeout() {
    let cluster = Cluster::start(2, &[Duration::ZERO; 3]).await;
    let client = cluster
        .client(|o| o.failover_timeout = Duration::from_millis(800))
        .await;
    let opts = OpenOptions {
        read: true,
        ..OpenOptions::create()
    };
    let mut f = client.open("/f", &opts).await.unwrap();
    // The manager never declares the node dead: writes to its partitions cannot complete.
    // (Metadata is not tried here: the primary itself waits for a dead mirror, longer.)
    cluster.proxies[1].cut();
    let started = Instant::now();
    let data = pattern(6, 8 * MIB);
    let written = f.write(&data).await;
    // A read waits for the handle's writes first, and reports their failure.
    let err = written.and(f.read_at(0, 1).await.map(drop)).unwrap_err();
    assert_eq!(err.errno(), libc_eio(), "{err}");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_secs(10),
        "failed after {took:?}"
    );
}

/// Stripe write requests every node has served so far.
async fn writes_served(cluster: &Cluster) -> u64 {
    let mut sum = 0;
    for &(_, addr) in &cluster.direct {
        let conn = RpcClient::connect(addr, &rpc()).await.unwrap();
        let req = Request::Op {
            epoch: cluster.manager.table().table.epoch(),
            op: Op::NodeStats,
        };
        match conn.call(&req, Bytes::new()).await.unwrap() {
            (Response::Stats(s), _) => sum += s.writes,
            other => panic!("{other:?}"),
        }
    }
    sum
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scatter_writes_reach_every_replica_one_request_per_stripe() {
    let cluster = Cluster::start(2, &[Duration::ZERO; 3]).await;
    let client = cluster.client(|o| o.mirror_lag = 2).await;
    for (path, ack) in [("/all", WriteAck::All), ("/primary", WriteAck::Primary)] {
        // Another writer's bytes, which the pieces must leave as they are.
        let mut want = pattern(6, 3 * MIB + 5000);
        client.write(path, &want).await.unwrap();
        // 100-byte records at every third slot; one crossing into stripe 1, touching pieces
        // (sent as one), and a last one past the end (the size grows to it).
        let mut pieces: Vec<(u64, Vec<u8>)> = (0..3 * MIB as u64 / 300)
            .map(|i| (i * 300 + 7, pattern(i as u8, 100)))
            .filter(|(at, _)| at + 100 <= 3 * MIB as u64)
            .collect();
        pieces.push((3 * MIB as u64 + 4000, vec![1; 30]));
        pieces.push((3 * MIB as u64 + 4030, vec![2; 50]));
        pieces.push((4 * MIB as u64 + 10, vec![3; 20]));
        want.resize(4 * MIB + 30, 0);
        for (at, bytes) in &pieces {
            want[*at as usize..*at as usize + bytes.len()].copy_from_slice(bytes);
        }
        let before = writes_served(&cluster).await;
        let opts = OpenOptions {
            write_ack: Some(ack),
            ..OpenOptions::read_write()
        };
        let mut f = client.open(path, &opts).await.unwrap();
        let refs: Vec<(u64, &[u8])> = pieces.iter().map(|(a, b)| (*a, &b[..])).collect();
        let total: usize = pieces.iter().map(|(_, b)| b.len()).sum();
        assert_eq!(f.write_scatter(&refs).await.unwrap(), total);
        assert_eq!(f.len(), want.len() as u64);
        f.close().await.unwrap();
        assert_eq!(
            writes_served(&cluster).await - before,
            5 * 2,
            "{path}: one request per stripe and replica"
        );
        assert!(
            client.read(path).await.unwrap() == want,
            "{path} reads back"
        );
        check_replicas(&cluster, &client, path, &want).await;
    }

    // More pieces in a stripe than one request carries: two requests.
    let pieces: Vec<(u64, &[u8])> = (0..tessera_proto::SCATTER_PIECES_MAX as u64 + 10)
        .map(|i| (2 * i, &b"x"[..]))
        .collect();
    let before = writes_served(&cluster).await;
    let mut f = client.open("/many", &OpenOptions::create()).await.unwrap();
    f.write_scatter(&pieces).await.unwrap();
    f.close().await.unwrap();
    assert_eq!(writes_served(&cluster).await - before, 2 * 2);
    let want: Vec<u8> = (0..2 * pieces.len() - 1)
        .map(|i| if i % 2 == 0 { b'x' } else { 0 })
        .collect();
    assert!(client.read("/many").await.unwrap() == want);
    check_replicas(&cluster, &client, "/many", &want).await;

    // Pieces out of order or overlapping are refused, and nothing is written.
    let held = client.read("/all").await.unwrap();
    let mut f = client
        .open("/all", &OpenOptions::read_write())
        .await
        .unwrap();
    for bad in [
        [(10, &b"ab"[..]), (11, &b"c"[..])],
        [(10, &b"ab"[..]), (2, &b"c"[..])],
    ] {
        let e = f.write_scatter(&bad).await.unwrap_err();
        assert!(e.to_string().contains("increasing offset order"), "{e}");
    }
    f.close().await.unwrap();
    assert!(client.read("/all").await.unwrap() == held);
}
