//! Multiplexed RPC over one TCP connection.
//!
//! A client keeps any number of requests in flight on one connection: a caller puts its frame
//! on the socket itself when nothing is queued before it (else a writer task sends it, in
//! order), and a reader task matches responses to waiting callers by request id. A server
//! answers the requests of one connection in the order they arrived, on the task that reads
//! them (store operations are in-memory and short), so a client's writes on one connection
//! apply in the order it sent them. Round trips matter: metadata operations are made of them.

use crate::admit::{Admission, Ticket};
use crate::auth::{client_handshake, server_handshake, AuthError, Secret};
use crate::frame::{
    encode_head, read_frame, read_full, read_head, read_payload, FrameError, FrameKind, Limits,
};
use crate::msg::{ErrorCode, Notice, Request, Response};
use crate::pool::BufferPool;
use crate::ratelimit::RateLimit;
use bytes::Bytes;
use std::collections::HashMap;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, warn};

/// Buffer of a connection's writer: many small frames leave in one write.
const IO_BUF: usize = 256 << 10;
/// Reads go through a smaller buffer than writes. A buffered reader reads a payload straight
/// into its destination only while the rest is at least a buffer long; otherwise it refills
/// with whatever the socket holds, the next frame's payload included, and copies that again:
/// with 256 KiB, up to a quarter of every 1 MiB stripe took that extra copy (5.6 % of the
/// mount's time in a sequential read). 32 KiB still holds many small answers.
const READ_BUF: usize = 32 << 10;
/// Frames up to this size are written by the caller itself (see `Sender`).
const DIRECT_MAX: usize = 64 << 10;
/// Bytes of frames a client connection queues for its writer task. At the bound, a caller
/// sending another request waits until the writer has put some out (backpressure, at most the
/// connection's `request_timeout`, then `Timeout`): the queue is enough to keep the connection
/// busy, and what a peer that reads slowly is sent no longer piles up without end.
pub const OUTBOX_MAX: usize = 32 << 20;

/// Settings shared by every connection of a process.
#[derive(Debug)]
pub struct RpcConfig {
    pub secret: Secret,
    pub limits: Limits,
    /// Where received payloads are read into. Serving, a request's payload may be at most one
    /// of its buffers (a stripe, on a server).
    pub pool: Arc<BufferPool>,
    pub connect_timeout: Duration,
    /// How long a caller waits for a response before giving up on it.
    pub request_timeout: Duration,
    /// Serving: how long a request may take to arrive once begun (`FRAME_TIMEOUT`).
    pub frame_timeout: Duration,
}

impl RpcConfig {
    #[must_use]
    pub fn new(secret: Secret, pool: Arc<BufferPool>) -> Self {
        Self {
            secret,
            limits: Limits::default(),
            pool,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(60),
            frame_timeout: FRAME_TIMEOUT,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot connect to {addr}: {source}")]
    Auth { addr: SocketAddr, source: AuthError },
    #[error("connection to {addr} lost: {reason}")]
    Closed { addr: SocketAddr, reason: String },
    #[error("request to {addr} got no answer within {after:?}")]
    Timeout { addr: SocketAddr, after: Duration },
    #[error("cannot encode request: {0}")]
    Encode(String),
    #[error("{addr} refused: {why}")]
    Refused { addr: SocketAddr, why: String },
}

/// Where a subscribed client connection delivers the server's notices (on its reader task:
/// this must not block). A connection that ends delivers `Notice::Reset`.
#[derive(Clone)]
pub struct NoticeSink(Arc<dyn Fn(Notice) + Send + Sync>);

impl NoticeSink {
    pub fn new(f: impl Fn(Notice) + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }

    pub fn deliver(&self, n: Notice) {
        (self.0)(n);
    }
}

impl std::fmt::Debug for NoticeSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NoticeSink")
    }
}

/// A frame on its way out; `sent` bytes of head + payload are on the socket already.
struct Outgoing {
    head: Vec<u8>,
    payload: Bytes,
    sent: usize,
}

impl Outgoing {
    fn len(&self) -> usize {
        self.head.len() + self.payload.len()
    }

    /// Writes as much as the socket takes now, without waiting; true when all of it is out.
    fn write_some(&mut self, half: &OwnedWriteHalf) -> std::io::Result<bool> {
        while self.sent < self.len() {
            let (h, p) = (self.head.len(), self.sent);
            let n = if p < h {
                let bufs = [IoSlice::new(&self.head[p..]), IoSlice::new(&self.payload)];
                half.try_write_vectored(&bufs)
            } else {
                half.try_write(&self.payload[p - h..])
            };
            match n {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }
}

/// The sending side of a client connection. A caller writes a small frame to the socket itself
/// when nothing is queued before it (no hand-off to another task: the lowest latency); large
/// frames, and whatever the socket does not take at once, are queued, in order, for the
/// writer task, up to [`OUTBOX_MAX`] bytes (`room`). The writes are
/// non-blocking, so a caller that is cancelled never leaves half a frame behind.
struct Sender {
    half: OwnedWriteHalf,
    queue: Mutex<Outbox>,
    wake: tokio::sync::Notify,
    /// Woken when the writer took frames off the queue (or gave up on them).
    room: tokio::sync::Notify,
}

#[derive(Default)]
struct Outbox {
    frames: std::collections::VecDeque<Outgoing>,
    /// Bytes of the frames in `frames`.
    bytes: usize,
    /// The client is gone: the writer task sends what is queued and ends.
    closing: bool,
}

impl Sender {
    fn lock(&self) -> std::sync::MutexGuard<'_, Outbox> {
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn send(&self, mut frame: Outgoing) -> std::io::Result<()> {
        let mut out = self.lock();
        // A stripe-sized frame goes to the writer task: copying it into the socket here would
        // put that copy on the caller's path instead of beside it.
        if out.frames.is_empty() && frame.len() <= DIRECT_MAX && frame.write_some(&self.half)? {
            return Ok(());
        }
        out.bytes += frame.len();
        out.frames.push_back(frame);
        drop(out);
        self.wake.notify_one();
        Ok(())
    }

    /// Waits until the queue holds less than [`OUTBOX_MAX`] bytes, for at most `patience`;
    /// false if it did not come to that. Callers passing at once may each queue a frame beyond
    /// it: the bound is exceeded by at most one frame per thread.
    async fn room(&self, patience: Duration) -> bool {
        if self.lock().bytes < OUTBOX_MAX {
            return true;
        }
        let wait = async {
            loop {
                let freed = self.room.notified();
                tokio::pin!(freed);
                freed.as_mut().enable();
                if self.lock().bytes < OUTBOX_MAX {
                    return;
                }
                freed.await;
            }
        };
        tokio::time::timeout(patience, wait).await.is_ok()
    }

    /// The writer is gone: nothing queued will go out, and callers waiting for room go on
    /// (to find the connection closed).
    fn abandon(&self) {
        let mut out = self.lock();
        out.frames.clear();
        out.bytes = 0;
        drop(out);
        self.room.notify_waiters();
    }

    /// The writer task: drains the queue whenever the socket can take more.
    async fn run(&self) -> std::io::Result<()> {
        loop {
            self.wake.notified().await;
            loop {
                let (empty, closing) = {
                    let mut out = self.lock();
                    let before = out.bytes;
                    while let Some(front) = out.frames.front_mut() {
                        if !front.write_some(&self.half)? {
                            break;
                        }
                        let len = front.len();
                        out.frames.pop_front();
                        out.bytes -= len;
                    }
                    if out.bytes < before {
                        self.room.notify_waiters();
                    }
                    (out.frames.is_empty(), out.closing)
                };
                if empty && closing {
                    return Ok(());
                }
                if empty {
                    break;
                }
                self.half.writable().await?;
            }
        }
    }
}

type Answer = Result<(Response, Bytes), RpcError>;

/// Memory of the caller's that a response payload is received into directly, so the bytes are
/// copied once, from the socket, to where the caller wants them (a Python `bytes` object being
/// built, say). The answer's payload is then a `Bytes` owning the sink.
pub trait Sink: Send + 'static {
    /// The memory: stable, and written only through this, for as long as the sink lives.
    fn buf(&mut self) -> &mut [u8];
    /// The same memory, read-only.
    fn bytes(&self) -> &[u8];
}

/// A filled sink as the owner of a `Bytes`.
struct Filled(Box<dyn Sink>);

impl AsRef<[u8]> for Filled {
    fn as_ref(&self) -> &[u8] {
        self.0.bytes()
    }
}

struct Waiting {
    tx: oneshot::Sender<Answer>,
    sink: Option<Box<dyn Sink>>,
}

#[derive(Default)]
struct Pending {
    waiting: HashMap<u64, Waiting>,
    /// Set once the connection is gone; no new request may wait after that.
    closed: Option<String>,
}

struct Shared {
    addr: SocketAddr,
    pending: Mutex<Pending>,
    notices: OnceLock<NoticeSink>,
    watcher: OnceLock<u64>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn close(&self, reason: String) {
        let mut p = self.lock();
        if p.closed.is_none() {
            p.closed = Some(reason.clone());
        }
        for (_, w) in p.waiting.drain() {
            let _ = w.tx.send(Err(RpcError::Closed {
                addr: self.addr,
                reason: reason.clone(),
            }));
        }
    }
}

/// Connects to `addr` and proves we know the cluster secret.
pub(crate) async fn dial(addr: SocketAddr, cfg: &RpcConfig) -> Result<TcpStream, RpcError> {
    let mut stream = tokio::time::timeout(cfg.connect_timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| RpcError::Connect {
            addr,
            source: std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"),
        })?
        .map_err(|source| RpcError::Connect { addr, source })?;
    let _ = stream.set_nodelay(true);
    client_handshake(&mut stream, &cfg.secret)
        .await
        .map_err(|e| match e {
            // A peer that vanished mid-handshake is unreachable, not refusing us: the
            // caller may fail over.
            AuthError::Io(source) => RpcError::Connect { addr, source },
            AuthError::Timeout => RpcError::Connect {
                addr,
                source: std::io::Error::new(std::io::ErrorKind::TimedOut, e.to_string()),
            },
            source => RpcError::Auth { addr, source },
        })?;
    Ok(stream)
}

/// A connection to a manager or storage server. Cheap to share (`&self` calls run concurrently).
pub struct RpcClient {
    shared: Arc<Shared>,
    sender: Arc<Sender>,
    next_id: AtomicU64,
    request_timeout: Duration,
}

impl RpcClient {
    /// Connects and authenticates with the cluster secret.
    pub async fn connect(addr: SocketAddr, cfg: &RpcConfig) -> Result<Self, RpcError> {
        let (rd, wr) = dial(addr, cfg).await?.into_split();
        let shared = Arc::new(Shared {
            addr,
            pending: Mutex::default(),
            notices: OnceLock::new(),
            watcher: OnceLock::new(),
        });
        let sender = Arc::new(Sender {
            half: wr,
            queue: Mutex::default(),
            wake: tokio::sync::Notify::new(),
            room: tokio::sync::Notify::new(),
        });
        let (w_sender, w_shared) = (sender.clone(), shared.clone());
        tokio::spawn(async move {
            if let Err(e) = w_sender.run().await {
                w_shared.close(format!("write failed: {e}"));
                w_sender.abandon();
            }
        });
        let r_shared = shared.clone();
        let (limits, pool) = (cfg.limits, cfg.pool.clone());
        tokio::spawn(async move {
            let mut rd = BufReader::with_capacity(READ_BUF, rd);
            let reason = loop {
                let head = match read_head(&mut rd, limits).await {
                    Ok(Some(h)) => h,
                    Ok(None) => break "closed by peer".to_string(),
                    Err(e) => break e.to_string(),
                };
                if head.kind == FrameKind::Notice {
                    let notice: Notice = match postcard::from_bytes(&head.header) {
                        Ok(n) => n,
                        Err(e) => break format!("undecodable notice: {e}"),
                    };
                    if head.payload_len > 0 {
                        break "a notice with a payload".to_string();
                    }
                    if let Some(sink) = r_shared.notices.get() {
                        sink.deliver(notice);
                    }
                    continue;
                }
                if head.kind != FrameKind::Response {
                    break "peer sent a request on a client connection".to_string();
                }
                let resp: Response = match postcard::from_bytes(&head.header) {
                    Ok(r) => r,
                    Err(e) => break format!("undecodable response: {e}"),
                };
                // A missing waiter timed out; its late answer is read and dropped.
                let waiter = r_shared.lock().waiting.remove(&head.id);
                let (tx, sink) = match waiter {
                    Some(w) => (Some(w.tx), w.sink),
                    None => (None, None),
                };
                let payload = match sink {
                    Some(mut sink)
                        if head.payload_len > 0 && head.payload_len <= sink.bytes().len() =>
                    {
                        match read_full(&mut rd, &mut sink.buf()[..head.payload_len]).await {
                            Ok(()) => Bytes::from_owner(Filled(sink)).slice(..head.payload_len),
                            Err(e) => break e.to_string(),
                        }
                    }
                    _ => match read_payload(&mut rd, head.payload_len, &pool).await {
                        Ok(p) => p,
                        Err(e) => break e.to_string(),
                    },
                };
                if let Some(tx) = tx {
                    let _ = tx.send(Ok((resp, payload)));
                }
            };
            debug!(addr = %r_shared.addr, "connection ended: {reason}");
            r_shared.close(reason);
            if let Some(sink) = r_shared.notices.get() {
                sink.deliver(Notice::Reset);
            }
        });
        Ok(Self {
            shared,
            sender,
            next_id: AtomicU64::new(1),
            request_timeout: cfg.request_timeout,
        })
    }

    /// Sends a request with a raw payload and waits for its response.
    pub async fn call(&self, req: &Request, payload: Bytes) -> Result<(Response, Bytes), RpcError> {
        self.send(req, payload).await?.wait().await
    }

    /// Queues a request and returns without waiting for the answer. Requests sent one after
    /// another on one connection reach the server, and are applied, in that order.
    pub async fn send(&self, req: &Request, payload: Bytes) -> Result<Waiter, RpcError> {
        self.send_into(req, payload, None).await
    }

    /// [`Self::send`], receiving the response's payload into `sink` if it fits there (else
    /// into a pooled buffer, as `send` does).
    pub async fn send_into(
        &self,
        req: &Request,
        payload: Bytes,
        sink: Option<Box<dyn Sink>>,
    ) -> Result<Waiter, RpcError> {
        let addr = self.shared.addr;
        let header = postcard::to_allocvec(req).map_err(|e| RpcError::Encode(e.to_string()))?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let head = encode_head(id, FrameKind::Request, &header, payload.len())
            .map_err(|e| RpcError::Encode(e.to_string()))?;
        if !self.sender.room(self.request_timeout).await {
            return Err(RpcError::Timeout {
                addr,
                after: self.request_timeout,
            });
        }
        let (wtx, wrx) = oneshot::channel();
        {
            let mut p = self.shared.lock();
            if let Some(reason) = &p.closed {
                return Err(RpcError::Closed {
                    addr,
                    reason: reason.clone(),
                });
            }
            p.waiting.insert(id, Waiting { tx: wtx, sink });
        }
        let frame = Outgoing {
            head,
            payload,
            sent: 0,
        };
        if let Err(e) = self.sender.send(frame) {
            let reason = format!("write failed: {e}");
            self.shared.close(reason.clone());
            return Err(RpcError::Closed { addr, reason });
        }
        Ok(Waiter {
            id,
            rx: wrx,
            shared: self.shared.clone(),
            timeout: self.request_timeout,
        })
    }

    /// Asks the server to send this connection's notices to `sink` from now on
    /// ([`Request::Subscribe`]); once per connection.
    pub async fn subscribe(&self, sink: NoticeSink) -> Result<(), RpcError> {
        let addr = self.shared.addr;
        if self.shared.notices.set(sink).is_err() {
            return Ok(());
        }
        match self.call(&Request::Subscribe, Bytes::new()).await?.0 {
            Response::Subscribed { watcher } => {
                let _ = self.shared.watcher.set(watcher);
                Ok(())
            }
            other => Err(RpcError::Refused {
                addr,
                why: format!("no notices: {other:?}"),
            }),
        }
    }

    /// The server's id for this connection's notices once subscribed: other connections
    /// `Attach` to it (see `lane`).
    #[must_use]
    pub fn watcher(&self) -> Option<u64> {
        self.shared.watcher.get().copied()
    }

    /// True once the connection is gone; a new one must be made.
    #[must_use]
    pub fn is_closed(&self) -> bool {
        self.shared.lock().closed.is_some()
    }

    #[must_use]
    pub fn peer(&self) -> SocketAddr {
        self.shared.addr
    }
}

impl Drop for RpcClient {
    fn drop(&mut self) {
        self.sender.lock().closing = true;
        self.sender.wake.notify_one();
    }
}

/// The answer to a request sent with [`RpcClient::send`].
pub struct Waiter {
    id: u64,
    rx: oneshot::Receiver<Answer>,
    shared: Arc<Shared>,
    timeout: Duration,
}

impl Waiter {
    pub async fn wait(self) -> Result<(Response, Bytes), RpcError> {
        let addr = self.shared.addr;
        match tokio::time::timeout(self.timeout, self.rx).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(_)) => Err(RpcError::Closed {
                addr,
                reason: "connection dropped".into(),
            }),
            Err(_) => {
                self.shared.lock().waiting.remove(&self.id);
                Err(RpcError::Timeout {
                    addr,
                    after: self.timeout,
                })
            }
        }
    }
}

/// Does `buf` start with a complete frame?
fn whole_frame(buf: &[u8]) -> bool {
    match buf.get(..4).and_then(|b| <[u8; 4]>::try_from(b).ok()) {
        Some(len) => 4 + u32::from_le_bytes(len) as usize <= buf.len(),
        None => false,
    }
}

/// Serves requests. `handle` runs once per request, in arrival order within a connection.
type Answering = std::pin::Pin<Box<dyn std::future::Future<Output = (Response, Bytes)> + Send>>;

/// A handler's answer: ready now (store operations); later, still in request order (the
/// connection waits for it: a slow node); or detached, when ready, while the connection goes on
/// with the requests after it (a metadata change waiting for the mirrors: its client awaits
/// each such change before it sends what depends on it).
pub enum Reply {
    Now(Response, Bytes),
    Later(Answering),
    Detached(Answering),
}

pub trait Handler: Send + Sync + 'static {
    fn handle(&self, conn: &Conn, req: Request, payload: Bytes) -> Reply;
}

/// Notices a connection may have queued before it counts as not keeping up (then it is told
/// `Reset` instead of the ones that did not fit).
const NOTICE_QUEUE: usize = 4096;

/// The connection a request came on, as a handler sees it.
#[derive(Default)]
pub struct Conn {
    watcher: OnceLock<Watcher>,
}

impl Conn {
    /// How to send this connection notices, if it subscribed.
    #[must_use]
    pub fn watcher(&self) -> Option<&Watcher> {
        self.watcher.get()
    }
}

/// A subscribed connection's notice queue; cheap to clone and keep.
#[derive(Clone, Debug)]
pub struct Watcher {
    id: u64,
    tx: mpsc::Sender<Notice>,
    overflowed: Arc<AtomicBool>,
}

impl Watcher {
    /// A notice queue of `capacity` and its receiving end (see `write_notices`).
    #[must_use]
    pub fn new(capacity: usize) -> (Self, mpsc::Receiver<Notice>) {
        static IDS: AtomicU64 = AtomicU64::new(1);
        let (tx, rx) = mpsc::channel(capacity);
        let w = Self {
            id: IDS.fetch_add(1, Ordering::Relaxed),
            tx,
            overflowed: Arc::new(AtomicBool::new(false)),
        };
        (w, rx)
    }

    /// Unique among this process's connections.
    #[must_use]
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Queues `n`; a full queue makes the connection forget everything instead (`Reset`).
    pub fn notify(&self, n: Notice) {
        if let Err(mpsc::error::TrySendError::Full(_)) = self.tx.try_send(n) {
            self.overflowed.store(true, Ordering::Relaxed);
        }
    }

    /// The connection ended: promises made to it can be dropped.
    #[must_use]
    pub fn is_gone(&self) -> bool {
        self.tx.is_closed()
    }
}

type Writer = Arc<tokio::sync::Mutex<BufWriter<OwnedWriteHalf>>>;

/// Writes a subscribed connection's notices as they come, a batch at a time.
async fn write_notices(w: Writer, mut rx: mpsc::Receiver<Notice>, overflowed: Arc<AtomicBool>) {
    let mut batch = Vec::new();
    while rx.recv_many(&mut batch, 256).await > 0 {
        if overflowed.swap(false, Ordering::Relaxed) {
            batch.push(Notice::Reset);
        }
        let mut w = w.lock().await;
        for n in batch.drain(..) {
            if let Err(e) = write_frame(&mut w, 0, FrameKind::Notice, &n, &Bytes::new()).await {
                debug!("connection ended while sending notices: {e}");
                return;
            }
        }
        if w.flush().await.is_err() {
            return;
        }
    }
}

/// Connections of one listening port that may be in their handshake at once; past it, the
/// oldest is closed to make room (`admit`). Authenticated connections are not counted.
pub const MAX_HANDSHAKING: usize = 256;
/// How long a request may take to arrive once its first byte has. A connection stalled in the
/// middle of a frame is closed, and the memory of the part received goes with it; between
/// requests a connection may stay idle as long as it likes.
pub const FRAME_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts connections until the listener fails; each one is served on its own task.
pub async fn serve(listener: TcpListener, cfg: Arc<RpcConfig>, handler: Arc<dyn Handler>) {
    static ACCEPT_FAILED: RateLimit = RateLimit::new("failed accepts");
    static CROWDED: RateLimit =
        RateLimit::new("connections closed in their handshake to make room");
    let watchers = Watchers::default();
    let handshaking = Admission::new(MAX_HANDSHAKING);
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let (ticket, evicted) = handshaking.admit();
                if evicted && CROWDED.hit() {
                    warn!(
                        %peer,
                        "over {MAX_HANDSHAKING} connections in their handshake: closing the oldest"
                    );
                }
                let (cfg, handler, watchers) = (cfg.clone(), handler.clone(), watchers.clone());
                tokio::spawn(async move {
                    serve_connection(stream, peer, ticket, &cfg, handler, &watchers).await;
                });
            }
            Err(e) => {
                // Typically EMFILE: back off instead of spinning.
                if ACCEPT_FAILED.hit() {
                    warn!("accept failed: {e}");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// The subscribed connections of one listener, by watcher id: what `Attach` names.
#[derive(Clone, Default)]
pub struct Watchers(Arc<Mutex<HashMap<u64, Watcher>>>);

impl Watchers {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Watcher>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Writes one frame from the serving side, without flushing.
async fn write_frame<T: serde::Serialize>(
    w: &mut BufWriter<OwnedWriteHalf>,
    id: u64,
    kind: FrameKind,
    header: &T,
    payload: &Bytes,
) -> std::io::Result<()> {
    let head = postcard::to_allocvec(header)
        .map_err(|e| e.to_string())
        .and_then(|h| encode_head(id, kind, &h, payload.len()).map_err(|e| e.to_string()))
        .map_err(|e| std::io::Error::other(format!("cannot encode a frame: {e}")))?;
    w.write_all(&head).await?;
    if !payload.is_empty() {
        w.write_all(payload).await?;
    }
    Ok(())
}

/// Writes one answer (and flushes, if asked).
async fn answer_with(
    w: &mut BufWriter<OwnedWriteHalf>,
    id: u64,
    resp: &Response,
    payload: &Bytes,
    flush: bool,
) -> std::io::Result<()> {
    write_frame(w, id, FrameKind::Response, resp, payload).await?;
    if flush {
        w.flush().await?;
    }
    Ok(())
}

/// Authenticates and serves one connection until it closes or misbehaves. A malformed frame
/// ends this connection only, with a logged warning.
async fn serve_connection(
    mut stream: TcpStream,
    peer: SocketAddr,
    mut handshaking: Ticket,
    cfg: &RpcConfig,
    handler: Arc<dyn Handler>,
    watchers: &Watchers,
) {
    static REFUSED: RateLimit = RateLimit::new("refused connections");
    static BAD_FRAME: RateLimit = RateLimit::new("connections closed for a bad frame");
    static STALLED: RateLimit = RateLimit::new("connections closed stalled in a request");
    static NOT_REQUEST: RateLimit = RateLimit::new("connections closed for a bad request");
    let _ = stream.set_nodelay(true);
    match handshaking
        .run(server_handshake(&mut stream, &cfg.secret))
        .await
    {
        Some(Ok(())) => drop(handshaking),
        Some(Err(e)) => {
            if REFUSED.hit() {
                warn!(%peer, "refused connection: {e}");
            }
            return;
        }
        // Newer connections needed the room (`serve` says so).
        None => return,
    }
    let (rd, wr) = stream.into_split();
    // Answers are written by this task, not handed to another (one wake-up less per request),
    // except detached ones, written by their own task when ready.
    let w: Writer = Arc::new(tokio::sync::Mutex::new(BufWriter::with_capacity(
        IO_BUF, wr,
    )));
    let mut rd = BufReader::with_capacity(READ_BUF, rd);
    // A request's payload must fit a pooled buffer (a stripe, on a server): a frame announcing
    // more is refused from its first bytes, before any memory is set aside for it.
    let limits = Limits {
        max_payload: u32::try_from(cfg.pool.buf_size()).unwrap_or(u32::MAX),
        ..cfg.limits
    };
    let conn = Conn::default();
    let mut notices = None;
    loop {
        // Wait as long as it takes for the next request to begin...
        match rd.fill_buf().await {
            Ok([]) => break,
            Ok(_) => {}
            Err(e) => {
                debug!(%peer, "connection ended: {e}");
                break;
            }
        }
        // ...but once begun, it must arrive whole in time.
        let patience = cfg.frame_timeout;
        let read = tokio::time::timeout(patience, read_frame(&mut rd, limits, &cfg.pool));
        let frame = match read.await {
            Ok(Ok(Some(f))) => f,
            Ok(Ok(None)) => break,
            Ok(Err(FrameError::Io(e))) => {
                debug!(%peer, "connection ended: {e}");
                break;
            }
            Ok(Err(e)) => {
                if BAD_FRAME.hit() {
                    warn!(%peer, "closing connection: {e}");
                }
                break;
            }
            Err(_) => {
                if STALLED.hit() {
                    warn!(%peer, "closing connection: a request took over {patience:?} to arrive");
                }
                break;
            }
        };
        if frame.kind != FrameKind::Request {
            if NOT_REQUEST.hit() {
                warn!(%peer, "closing connection: a response frame where a request was expected");
            }
            break;
        }
        let req: Request = match postcard::from_bytes(&frame.header) {
            Ok(r) => r,
            Err(e) => {
                if NOT_REQUEST.hit() {
                    warn!(%peer, "closing connection: malformed request: {e}");
                }
                break;
            }
        };
        let reply = match req {
            Request::Subscribe => {
                if conn.watcher.get().is_none() {
                    let (watcher, rx) = Watcher::new(NOTICE_QUEUE);
                    let overflowed = watcher.overflowed.clone();
                    watchers.lock().insert(watcher.id, watcher.clone());
                    let _ = conn.watcher.set(watcher);
                    notices = Some(tokio::spawn(write_notices(w.clone(), rx, overflowed)));
                }
                let watcher = conn.watcher.get().map_or(0, Watcher::id);
                Reply::Now(Response::Subscribed { watcher }, Bytes::new())
            }
            Request::Attach { watcher } => {
                let found = watchers
                    .lock()
                    .get(&watcher)
                    .filter(|w| !w.is_gone())
                    .cloned();
                let resp = match found {
                    Some(found) if conn.watcher.get().is_none_or(|w| w.id == found.id) => {
                        let _ = conn.watcher.set(found);
                        Response::Ok
                    }
                    Some(_) => Response::Error(ErrorCode::Invalid(
                        "this connection's answers go to another watcher already".into(),
                    )),
                    None => Response::Error(ErrorCode::NotFound),
                };
                Reply::Now(resp, Bytes::new())
            }
            req => handler.handle(&conn, req, frame.payload),
        };
        let (resp, payload) = match reply {
            Reply::Now(resp, payload) => (resp, payload),
            Reply::Later(answer) => answer.await,
            Reply::Detached(answer) => {
                let (writer, id) = (w.clone(), frame.id);
                tokio::spawn(async move {
                    let (resp, payload) = answer.await;
                    let mut w = writer.lock().await;
                    if let Err(e) = answer_with(&mut w, id, &resp, &payload, true).await {
                        debug!(%peer, "connection ended while answering: {e}");
                    }
                });
                // Answers held back for a batch must not wait for the detached one.
                if !whole_frame(rd.buffer()) {
                    if let Err(e) = w.lock().await.flush().await {
                        debug!(%peer, "connection ended while answering: {e}");
                        break;
                    }
                }
                continue;
            }
        };
        // Another whole request already read: answer it too, in one write. Else send now.
        let flush = !whole_frame(rd.buffer());
        let mut w = w.lock().await;
        if let Err(e) = answer_with(&mut w, frame.id, &resp, &payload, flush).await {
            debug!(%peer, "connection ended while answering: {e}");
            break;
        }
    }
    // Every end of the connection comes here: its watcher must leave the registry.
    if let Some(task) = notices {
        task.abort();
        if let Some(w) = conn.watcher.get() {
            watchers.lock().remove(&w.id);
        }
    }
    let mut w = w.lock().await;
    if let Err(e) = w.shutdown().await {
        debug!(%peer, "connection ended: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::{ErrorCode, Op};
    use tokio::io::AsyncReadExt;

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
        tokio::task::spawn_blocking(move || {
            h.block_on(crate::LaneConn::connect(addr, &cfg, watcher))
        })
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
}
