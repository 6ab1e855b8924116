//! Connections that never finish what they start, against real processes: idle and half-sent
//! connections to every port, and half-sent frames from peers that know the secret. The
//! cluster must keep serving its clients, close such connections, and give their memory back.

use anyhow::{Context, Result};
use serde_json::json;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tessera_proto::{auth::client_handshake, frame, Secret};
use tessera_testkit::{digest, free_port, held_memory, pattern, Cluster, ClusterSpec};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

const MIB: u64 = 1 << 20;

/// Connections opened to each flooded port (fewer if this process may not open that many).
const FLOOD: usize = 1500;
/// How long the flood of one port may take.
const FLOOD_TIME: Duration = Duration::from_secs(5);
/// Open files of the cluster's processes: a common default, which one flooded port exceeds.
const CLUSTER_OPEN_FILES: u64 = 1024;

async fn start(spec: ClusterSpec) -> Result<Cluster> {
    tokio::task::spawn_blocking(move || Cluster::start(&spec)).await?
}

/// Opens up to `n` connections to `addr` and sends each `first` (nothing, or the start of a
/// request), for at most `FLOOD_TIME`: a port that does not accept them fills its backlog,
/// and then connecting waits.
async fn flood(addr: SocketAddr, n: usize, first: &[u8]) -> Vec<TcpStream> {
    let deadline = Instant::now() + FLOOD_TIME;
    let mut held = Vec::with_capacity(n);
    while held.len() < n && Instant::now() < deadline {
        if let Ok(Ok(mut s)) = tokio::time::timeout_at(deadline, TcpStream::connect(addr)).await {
            let _ = s.write_all(first).await;
            held.push(s);
        }
    }
    held
}

/// How many of `conns` the other end closed within `within`.
async fn closed_within(conns: Vec<TcpStream>, within: Duration) -> usize {
    let deadline = Instant::now() + within;
    let mut waits = tokio::task::JoinSet::new();
    for mut s in conns {
        waits.spawn(async move {
            let mut buf = [0u8; 1024];
            loop {
                match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
                    Ok(Ok(0) | Err(_)) => return true,
                    Ok(Ok(_)) => {}
                    Err(_) => return false,
                }
            }
        });
    }
    let mut closed = 0;
    while let Some(done) = waits.join_next().await {
        closed += usize::from(done.unwrap_or(false));
    }
    closed
}

async fn get_health(http: SocketAddr) -> Result<String> {
    let mut s = TcpStream::connect(http).await?;
    s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    Ok(out)
}

/// Writes a file through a client in another process and reads it back.
async fn round_trip(cluster: &Arc<Cluster>, path: &str, seed: u64) -> Result<()> {
    let cluster = cluster.clone();
    let path = path.to_string();
    tokio::task::spawn_blocking(move || -> Result<()> {
        let mut w = cluster.worker()?;
        let len = 4 * MIB;
        w.ok(&json!({"cmd": "write_file", "path": path, "len": len, "seed": seed}))?;
        let v = w.ok(&json!({"cmd": "read_file", "path": path}))?;
        anyhow::ensure!(
            v["hash"] == digest(&pattern(seed, 0, len as usize)),
            "{path} read back wrong: {v}"
        );
        Ok(())
    })
    .await?
}

/// Thousands of idle and half-sent connections to the manager's HTTP and RPC ports and to a
/// server's port, from a process without the secret: the cluster's processes stay within
/// their open files, `/health`, `tessera status` and file I/O keep working while the flood
/// is held, and the servers close every one of those connections by themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floods_of_idle_connections_do_not_lock_clients_out() -> Result<()> {
    let http: SocketAddr = format!("127.0.0.1:{}", free_port("127.0.0.1")?).parse()?;
    let cluster = Arc::new(
        start(ClusterSpec {
            servers: 2,
            manager_args: vec!["--http".into(), http.to_string()],
            max_open_files: Some(CLUSTER_OPEN_FILES),
            ..ClusterSpec::default()
        })
        .await?,
    );
    let server = cluster.status().await?.nodes[0].addr;
    let room = tessera_proto::admit::raise_open_file_limit()?;
    let room = usize::try_from(room).unwrap_or(usize::MAX);
    let per_port = FLOOD.min(room.saturating_sub(512) / 3);

    let mut conns = flood(http, per_port / 2, b"").await;
    conns.extend(flood(http, per_port / 2, b"GET /health HTTP/1.1\r\nHost: x\r\n").await);
    conns.extend(flood(cluster.manager, per_port / 2, b"").await);
    conns.extend(flood(cluster.manager, per_port / 2, b"TSR").await);
    conns.extend(flood(server, per_port, b"").await);
    let flooded = conns.len();
    let started = Instant::now();

    // With the flood held open, clients get in.
    let health = tokio::time::timeout(Duration::from_secs(10), get_health(http))
        .await
        .context("/health did not answer within 10 s")??;
    assert!(
        health.starts_with("HTTP/1.1 200") && health.ends_with("ok\n"),
        "{health}"
    );
    let status = {
        let cluster = cluster.clone();
        tokio::task::spawn_blocking(move || cluster.tessera(&["status"])).await??
    };
    assert!(status.contains("127.0.0.2"), "{status}");
    round_trip(&cluster, "/during-flood", 1).await?;

    // Every flood connection is closed by the other end: past the bounds at once, the rest
    // after the handshake (RPC) or header (HTTP) timeout.
    let closed = closed_within(conns, Duration::from_secs(60)).await;
    assert_eq!(
        closed,
        flooded,
        "{} of {flooded} idle connections still open after {:?}",
        flooded - closed,
        started.elapsed()
    );
    round_trip(&cluster, "/after-flood", 2).await?;
    Ok(())
}

/// Peers that know the secret announce large requests and send part of them: a request over a
/// stripe is refused from its first bytes, a stalled stripe-sized one is closed after the
/// frame timeout, and the server's memory does not keep what they sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_frames_are_closed_and_their_memory_given_back() -> Result<()> {
    let cluster = Arc::new(
        start(ClusterSpec {
            servers: 1,
            memory: "512MiB".into(),
            ..ClusterSpec::default()
        })
        .await?,
    );
    let pid = cluster.servers[0].id();
    let server = cluster.status().await?.nodes[0].addr;
    let secret = Secret::new(&cluster.secret);
    let base = held_memory(pid)?;

    let mut conns = Vec::new();
    // Announced body, bytes sent of it: 8 requests of 48 MiB half sent, 8 of a stripe.
    let shapes = [(48 * MIB, 24 * MIB); 8]
        .into_iter()
        .chain([(MIB, MIB / 2); 8]);
    for (i, (announced, sent)) in shapes.enumerate() {
        let mut s = TcpStream::connect(server).await?;
        client_handshake(&mut s, &secret).await?;
        let head = frame::encode_head(
            i as u64 + 1,
            frame::FrameKind::Request,
            &[],
            announced as usize,
        )?;
        // A refused request ends in a reset: the writes then fail, as they should.
        let send = async {
            s.write_all(&head).await?;
            s.write_all(&vec![0x5a; sent as usize]).await
        };
        let _ = tokio::time::timeout(Duration::from_secs(20), send).await;
        conns.push(s);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let during = held_memory(pid)?;
    // What was sent is 200 MiB; a stripe for each stripe-sized request may be held until
    // the frame timeout, and the rest is slack for a process that is still warming up.
    assert!(
        during < base + 48 * MIB,
        "the server holds half-sent requests: {} MiB -> {} MiB",
        base >> 20,
        during >> 20
    );

    let count = conns.len();
    let closed = closed_within(conns, Duration::from_secs(30)).await;
    assert_eq!(closed, count, "stalled connections left open");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = held_memory(pid)?;
        if now < base + 32 * MIB {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the memory of closed connections was kept: {} MiB -> {} MiB -> {} MiB",
            base >> 20,
            during >> 20,
            now >> 20
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    round_trip(&cluster, "/after-bad-frames", 3).await?;
    Ok(())
}
