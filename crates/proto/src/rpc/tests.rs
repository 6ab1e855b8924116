//! The connection's two halves against each other, and against raw sockets.

use super::*;
use crate::auth::{client_handshake, server_handshake};
use crate::frame::{encode_head, FrameKind};
use crate::msg::{ErrorCode, Notice, Op, Request, Response};
use bytes::Bytes;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};

/// Echoes the payload back; `NodeStats` answers an error; `DropFiles` also sends the
/// connection's watcher a notice about the file.
struct Echo;
impl Handler for Echo {
    fn handle(&self, conn: &Conn, req: Request, payload: Bytes) -> Reply {
        match req {
            Request::Op {
                op: Op::NodeStats, ..
            } => Reply::Now(Response::Error(ErrorCode::NotFound), Bytes::new()),
            Request::Op {
                op: Op::DropFiles { files },
                ..
            } => {
                if let Some(w) = conn.watcher() {
                    for ino in files {
                        w.notify(Notice::Attr { ino });
                    }
                }
                Reply::Now(Response::Ok, payload)
            }
            _ => Reply::Now(Response::Ok, payload),
        }
    }
}

fn cfg(secret: &str) -> Arc<RpcConfig> {
    Arc::new(RpcConfig::new(
        Secret::new(secret),
        Arc::new(BufferPool::new(1 << 20, 8)),
    ))
}

async fn start(secret: &str) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(serve(l, cfg(secret), Arc::new(Echo)));
    addr
}

const GET: Request = Request::GetTable;

#[tokio::test]
async fn many_requests_in_flight() {
    let addr = start("k").await;
    let c = Arc::new(RpcClient::connect(addr, &cfg("k")).await.unwrap());
    let calls = (0..200u32).map(|i| {
        let c = c.clone();
        tokio::spawn(async move {
            let payload = Bytes::from(vec![i as u8; (i as usize) * 997]);
            let (resp, back) = c.call(&GET, payload.clone()).await.unwrap();
            assert_eq!(resp, Response::Ok);
            assert_eq!(back, payload);
        })
    });
    for t in calls {
        t.await.unwrap();
    }
    let (resp, _) = c
        .call(
            &Request::Op {
                epoch: 1,
                op: Op::NodeStats,
            },
            Bytes::new(),
        )
        .await
        .unwrap();
    assert_eq!(resp, Response::Error(ErrorCode::NotFound));
}

/// Lanes block their thread: made and used off the runtime's workers (as a FUSE worker
/// does), here on a blocking-pool thread.
async fn lane(
    addr: SocketAddr,
    cfg: &Arc<RpcConfig>,
    watcher: Option<u64>,
) -> Result<crate::LaneConn, RpcError> {
    let (h, cfg) = (tokio::runtime::Handle::current(), cfg.clone());
    tokio::task::spawn_blocking(move || h.block_on(crate::LaneConn::connect(addr, &cfg, watcher)))
        .await
        .unwrap()
}

/// A lane's answers carry their promises to the subscribed connection it attached to.
#[tokio::test]
async fn a_lane_attached_to_a_subscribed_connection_has_its_notices_sent_there() {
    let (addr, cfg) = (start("k").await, cfg("k"));
    let main = RpcClient::connect(addr, &cfg).await.unwrap();
    let (tx, mut heard) = mpsc::unbounded_channel();
    let sink = NoticeSink::new(move |n| {
        let _ = tx.send(n);
    });
    main.subscribe(sink).await.unwrap();
    let watcher = main.watcher().expect("subscribed");
    let mut conn = lane(addr, &cfg, Some(watcher)).await.unwrap();
    let drop_file = Request::Op {
        epoch: 1,
        op: Op::DropFiles { files: vec![7] },
    };
    let (conn, answer) = tokio::task::spawn_blocking(move || {
        let answer = conn.call(&drop_file, b"xyz");
        (conn, answer)
    })
    .await
    .unwrap();
    assert_eq!(answer.unwrap(), (Response::Ok, Bytes::from_static(b"xyz")));
    assert_eq!(heard.recv().await, Some(Notice::Attr { ino: 7 }));
    assert!(!conn.is_broken());

    let unknown = lane(addr, &cfg, Some(watcher + 1000)).await;
    assert!(
        matches!(unknown, Err(RpcError::Refused { .. })),
        "{:?}",
        unknown.err()
    );
    // Once the subscribed connection ended, nothing attaches to it any more.
    drop(main);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match lane(addr, &cfg, Some(watcher)).await {
            Err(RpcError::Refused { .. }) => break,
            Ok(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            other => panic!("attached to an ended connection: {:?}", other.err()),
        }
    }
}

/// A lane whose server went away fails its call, and says it is broken.
#[tokio::test]
async fn a_lane_to_a_closed_server_fails_and_is_not_used_again() {
    let (addr, server) = mute_server().await;
    let mut conn = lane(addr, &cfg("k"), None).await.unwrap();
    let (conn, first, second) = tokio::task::spawn_blocking(move || {
        let first = conn.call(&GET, b"");
        let second = conn.call(&GET, b"");
        (conn, first, second)
    })
    .await
    .unwrap();
    server.await.unwrap();
    assert!(matches!(first, Err(RpcError::Closed { .. })), "{first:?}");
    assert!(matches!(second, Err(RpcError::Closed { .. })), "{second:?}");
    assert!(conn.is_broken());
}

/// A lane can send a request and read its answer later; reading with nothing sent is an
/// error, not a wait for the read timeout.
#[tokio::test]
async fn a_lane_reads_an_answer_after_sending_and_refuses_to_read_without() {
    let (addr, cfg) = (start("k").await, cfg("k"));
    let mut conn = lane(addr, &cfg, None).await.unwrap();
    let (conn, early, sent, answer) = tokio::task::spawn_blocking(move || {
        let early = conn.recv();
        let sent = conn.send(&GET, b"later");
        let answer = conn.recv();
        (conn, early, sent, answer)
    })
    .await
    .unwrap();
    assert!(matches!(early, Err(RpcError::Closed { .. })), "{early:?}");
    assert!(sent.is_ok(), "{sent:?}");
    assert_eq!(answer.unwrap().1, Bytes::from_static(b"later"));
    assert!(!conn.is_broken());
}

struct VecSink(Vec<u8>);
impl Sink for VecSink {
    fn buf(&mut self) -> &mut [u8] {
        &mut self.0
    }
    fn bytes(&self) -> &[u8] {
        &self.0
    }
}

#[tokio::test]
async fn payloads_land_in_the_callers_sink_when_they_fit() {
    let addr = start("k").await;
    let c = RpcClient::connect(addr, &cfg("k")).await.unwrap();
    for len in [1usize, 4096, 300_000, 1 << 20] {
        let payload = Bytes::from((0..len).map(|i| (i % 251) as u8).collect::<Vec<_>>());
        let sink = Box::new(VecSink(vec![0; 1 << 20]));
        let at = sink.0.as_ptr();
        let w = c
            .send_into(&GET, payload.clone(), Some(sink))
            .await
            .unwrap();
        let (_, back) = w.wait().await.unwrap();
        assert_eq!(back, payload);
        assert_eq!(back.as_ptr(), at, "{len} bytes were copied out of the sink");
    }
    // Too large for the sink: received as usual, the sink is not touched.
    let payload = Bytes::from(vec![7u8; 5000]);
    let w = c
        .send_into(&GET, payload.clone(), Some(Box::new(VecSink(vec![0; 100]))))
        .await
        .unwrap();
    assert_eq!(w.wait().await.unwrap().1, payload);
}

#[tokio::test]
async fn wrong_secret_is_refused() {
    let addr = start("right").await;
    match RpcClient::connect(addr, &cfg("wrong")).await {
        Err(RpcError::Auth {
            source: AuthError::Refused,
            ..
        }) => {}
        other => panic!("expected refusal, got {:?}", other.err()),
    }
}

#[tokio::test]
async fn malformed_frame_closes_only_its_connection() {
    let addr = start("k").await;
    let good = RpcClient::connect(addr, &cfg("k")).await.unwrap();
    // A raw, authenticated connection that sends a frame whose header is not a request.
    let mut raw = TcpStream::connect(addr).await.unwrap();
    client_handshake(&mut raw, &Secret::new("k")).await.unwrap();
    let head = encode_head(1, FrameKind::Request, &[0xff, 0xff, 0xff], 0).unwrap();
    raw.write_all(&head).await.unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(
        raw.read(&mut buf).await.unwrap(),
        0,
        "server closed the bad connection"
    );
    // A truncated frame, then hang-up, also ends only that connection.
    let mut raw2 = TcpStream::connect(addr).await.unwrap();
    client_handshake(&mut raw2, &Secret::new("k"))
        .await
        .unwrap();
    raw2.write_all(&head[..5]).await.unwrap();
    drop(raw2);
    // A request announcing a payload larger than a pooled buffer is refused at once.
    let mut raw3 = TcpStream::connect(addr).await.unwrap();
    client_handshake(&mut raw3, &Secret::new("k"))
        .await
        .unwrap();
    let huge = encode_head(1, FrameKind::Request, &[], 48 << 20).unwrap();
    raw3.write_all(&huge).await.unwrap();
    assert_eq!(raw3.read(&mut buf).await.unwrap(), 0, "refused");
    let (resp, back) = good
        .call(&GET, Bytes::from_static(b"still here"))
        .await
        .unwrap();
    assert_eq!((resp, &back[..]), (Response::Ok, &b"still here"[..]));
}

/// A request stalled mid-frame is closed after the frame timeout; an idle connection is
/// not.
#[tokio::test]
async fn a_request_stalled_mid_frame_is_closed_an_idle_connection_is_not() {
    let patience = Duration::from_millis(300);
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let mut cfg = RpcConfig::new(Secret::new("k"), Arc::new(BufferPool::new(1 << 20, 8)));
    cfg.frame_timeout = patience;
    tokio::spawn(serve(l, Arc::new(cfg), Arc::new(Echo)));
    let header = postcard::to_allocvec(&GET).unwrap();
    let mut idle = TcpStream::connect(addr).await.unwrap();
    client_handshake(&mut idle, &Secret::new("k"))
        .await
        .unwrap();
    let mut stalled = TcpStream::connect(addr).await.unwrap();
    client_handshake(&mut stalled, &Secret::new("k"))
        .await
        .unwrap();
    let mut frame = encode_head(1, FrameKind::Request, &header, 1000).unwrap();
    frame.extend_from_slice(&[0; 10]);
    stalled.write_all(&frame).await.unwrap();
    let started = tokio::time::Instant::now();
    let mut buf = [0u8; 64];
    assert_eq!(stalled.read(&mut buf).await.unwrap(), 0, "closed");
    assert!(started.elapsed() >= patience, "{:?}", started.elapsed());
    tokio::time::sleep(patience * 3).await;
    let mut frame = encode_head(2, FrameKind::Request, &header, 2).unwrap();
    frame.extend_from_slice(b"hi");
    idle.write_all(&frame).await.unwrap();
    let mut answer = [0u8; 64];
    let mut got = 0;
    while !answer[..got].ends_with(b"hi") {
        let n = idle.read(&mut answer[got..]).await.unwrap();
        assert!(n > 0, "the idle connection was closed");
        got += n;
    }
}

/// Silent connections past `MAX_HANDSHAKING` push the oldest out, and a client connecting
/// during the flood gets in.
#[tokio::test]
async fn a_flood_of_silent_connections_does_not_keep_a_client_out() {
    let addr = start("k").await;
    let mut flood = Vec::new();
    for _ in 0..MAX_HANDSHAKING + 16 {
        flood.push(TcpStream::connect(addr).await.unwrap());
    }
    let c = RpcClient::connect(addr, &cfg("k")).await.unwrap();
    let (_, back) = c.call(&GET, Bytes::from_static(b"in")).await.unwrap();
    assert_eq!(&back[..], b"in");
    // The oldest were closed at once, not after the handshake timeout (5 s).
    for s in &mut flood[..16] {
        let mut buf = [0u8; 64];
        let read = tokio::time::timeout(Duration::from_secs(4), s.read(&mut buf)).await;
        assert!(matches!(read, Ok(Ok(0) | Err(_))), "{read:?}");
    }
}

/// A server that accepts one connection, reads one request, then vanishes without
/// answering.
async fn mute_server() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        server_handshake(&mut s, &Secret::new("k")).await.unwrap();
        let mut buf = [0u8; 64];
        let _ = s.read(&mut buf).await;
    });
    (addr, server)
}

#[tokio::test]
async fn dead_peer_fails_pending_and_later_calls() {
    let (addr, server) = mute_server().await;
    let c = RpcClient::connect(addr, &cfg("k")).await.unwrap();
    let err = c.call(&GET, Bytes::new()).await.unwrap_err();
    assert!(matches!(err, RpcError::Closed { .. }), "{err}");
    assert!(c.is_closed());
    assert!(matches!(
        c.call(&GET, Bytes::new()).await,
        Err(RpcError::Closed { .. })
    ));
    server.await.unwrap();
}

/// Answers `GetTable` at once and every other request detached, when the gate lets it.
struct Gated {
    gate: Arc<Semaphore>,
    seen: Arc<AtomicUsize>,
}

impl Handler for Gated {
    fn handle(&self, _: &Conn, req: Request, _: Bytes) -> Reply {
        self.seen.fetch_add(1, Ordering::Relaxed);
        if req == GET {
            return Reply::Now(Response::Ok, Bytes::new());
        }
        let gate = self.gate.clone();
        Reply::Detached(Box::pin(async move {
            if let Ok(passed) = gate.acquire().await {
                passed.forget();
            }
            (Response::Ok, Bytes::new())
        }))
    }
}

/// A connection with `MAX_DETACHED` answers on their way reads no further request until one
/// of them is sent; then it goes on.
#[tokio::test]
async fn a_connection_at_its_bound_of_detached_answers_reads_on_once_one_is_sent() {
    let (gate, seen) = (Arc::new(Semaphore::new(0)), Arc::new(AtomicUsize::new(0)));
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let handler = Gated {
        gate: gate.clone(),
        seen: seen.clone(),
    };
    tokio::spawn(serve(l, cfg("k"), Arc::new(handler)));
    let c = RpcClient::connect(addr, &cfg("k")).await.unwrap();
    let held = Request::Op {
        epoch: 1,
        op: Op::NodeStats,
    };
    let mut detached = Vec::new();
    for _ in 0..=MAX_DETACHED {
        detached.push(c.send(&held, Bytes::new()).await.unwrap());
    }
    let after = c.send(&GET, Bytes::new()).await.unwrap();
    // The request past the bound is read (it is the one that finds the bound), the next not.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while seen.load(Ordering::Relaxed) <= MAX_DETACHED {
        assert!(tokio::time::Instant::now() < deadline, "requests not read");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        seen.load(Ordering::Relaxed),
        MAX_DETACHED + 1,
        "a request was read past the bound"
    );
    gate.add_permits(1);
    assert_eq!(after.wait().await.unwrap().0, Response::Ok);
    gate.add_permits(MAX_DETACHED);
    for w in detached {
        assert_eq!(w.wait().await.unwrap().0, Response::Ok);
    }
}

/// Past `max_connections`, a new connection is refused at once; the open ones are served,
/// and once one ends a new one gets in.
#[tokio::test]
async fn connections_past_the_bound_are_refused_until_one_ends() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let mut bounded = RpcConfig::new(Secret::new("k"), Arc::new(BufferPool::new(1 << 20, 8)));
    bounded.max_connections = 3;
    tokio::spawn(serve(l, Arc::new(bounded), Arc::new(Echo)));
    let mut open = Vec::new();
    for _ in 0..3 {
        let c = RpcClient::connect(addr, &cfg("k")).await.unwrap();
        assert_eq!(c.call(&GET, Bytes::new()).await.unwrap().0, Response::Ok);
        open.push(c);
    }
    let refused = RpcClient::connect(addr, &cfg("k")).await;
    assert!(
        matches!(refused, Err(RpcError::Connect { .. })),
        "{:?}",
        refused.err()
    );
    for c in &open {
        assert_eq!(c.call(&GET, Bytes::new()).await.unwrap().0, Response::Ok);
    }
    drop(open.pop());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match RpcClient::connect(addr, &cfg("k")).await {
            Ok(c) => {
                assert_eq!(c.call(&GET, Bytes::new()).await.unwrap().0, Response::Ok);
                break;
            }
            Err(RpcError::Connect { .. }) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("no room made by the connection that ended: {e}"),
        }
    }
}
