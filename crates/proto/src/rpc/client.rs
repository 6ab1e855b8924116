//! The client half of a connection: requests sent from any task, answers matched to their
//! callers by id, notices delivered to a subscriber.

use super::{RpcConfig, RpcError, READ_BUF};
use crate::auth::{client_handshake, AuthError};
use crate::frame::{encode_head, read_full, read_head, read_payload, FrameKind};
use crate::msg::{Notice, Request, Response};
use bytes::Bytes;
use std::collections::HashMap;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::io::BufReader;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tracing::debug;

/// Frames up to this size are written by the caller itself (see `Sender`).
const DIRECT_MAX: usize = 64 << 10;
/// Bytes of frames a client connection queues for its writer task. At the bound, a caller
/// sending another request waits until the writer has put some out (backpressure, at most the
/// connection's `request_timeout`, then `Timeout`): the queue is enough to keep the connection
/// busy, and what a peer that reads slowly is sent no longer piles up without end.
pub const OUTBOX_MAX: usize = 32 << 20;

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

    /// Ends the connection now: requests waiting for answers fail with `Closed` (`reason`),
    /// queued frames are dropped, and the socket is shut so its reader ends too. For a peer
    /// given up on (one that stopped answering and left the table).
    pub fn shut(&self, reason: &str) {
        self.shared.close(reason.to_owned());
        self.sender.abandon();
        let fd = std::os::fd::AsRawFd::as_raw_fd(self.sender.half.as_ref());
        // SAFETY: shutdown(2) on the socket this connection owns (still open: `half` lives);
        // it only ends the traffic, the descriptor is closed when the halves drop.
        unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
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
