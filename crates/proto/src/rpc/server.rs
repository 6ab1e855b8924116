//! The serving half: the accept loop and each connection's loop, which reads requests, hands
//! them to the [`Handler`] and writes the answers, in arrival order but for detached ones.

use super::{RpcConfig, READ_BUF};
use crate::admit::{Admission, Ticket};
use crate::auth::server_handshake;
use crate::frame::{encode_head, read_frame, FrameError, FrameKind, Limits};
use crate::msg::{ErrorCode, Notice, Request, Response};
use crate::ratelimit::RateLimit;
use bytes::Bytes;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tracing::{debug, warn};

/// Buffer of a connection's writer: many small frames leave in one write.
const IO_BUF: usize = 256 << 10;

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
// Most answers are `Now`: boxing it would cost an allocation per request.
#[allow(clippy::large_enum_variant)]
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
/// Detached answers (`Reply::Detached`) one connection may have on their way at once. At the
/// bound the connection reads no further request until one of them is sent; each of them ends
/// by itself (a mirror's, a recall's or the rename lock's patience), so the wait does too.
pub const MAX_DETACHED: usize = 1024;

/// Accepts connections until the listener fails; each one is served on its own task.
pub async fn serve(listener: TcpListener, cfg: Arc<RpcConfig>, handler: Arc<dyn Handler>) {
    static ACCEPT_FAILED: RateLimit = RateLimit::new("failed accepts");
    static CROWDED: RateLimit =
        RateLimit::new("connections closed in their handshake to make room");
    static FULL: RateLimit = RateLimit::new("connections refused for the connection bound");
    let watchers = Watchers::default();
    let handshaking = Admission::new(MAX_HANDSHAKING);
    let max = cfg.max_connections.max(1);
    let open = Arc::new(tokio::sync::Semaphore::new(max));
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let Ok(slot) = open.clone().try_acquire_owned() else {
                    if FULL.hit() {
                        warn!(
                            %peer,
                            "refusing a connection: {max} are open, the most this port serves"
                        );
                    }
                    drop(stream);
                    continue;
                };
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
                    drop(slot);
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
    static DETACHED_FULL: RateLimit =
        RateLimit::new("connections that stopped reading for their detached answers");
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
    let detached = Arc::new(tokio::sync::Semaphore::new(MAX_DETACHED));
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
                let on_its_way = match detached.clone().try_acquire_owned() {
                    Ok(slot) => slot,
                    Err(_) => {
                        if DETACHED_FULL.hit() {
                            warn!(
                                %peer,
                                "{MAX_DETACHED} answers of one connection are waiting: reading \
                                 its next request once one is sent"
                            );
                        }
                        // What is answered already leaves before the wait.
                        if let Err(e) = w.lock().await.flush().await {
                            debug!(%peer, "connection ended while answering: {e}");
                            break;
                        }
                        match detached.clone().acquire_owned().await {
                            Ok(slot) => slot,
                            Err(_) => break,
                        }
                    }
                };
                let (writer, id) = (w.clone(), frame.id);
                tokio::spawn(async move {
                    let (resp, payload) = answer.await;
                    let mut w = writer.lock().await;
                    if let Err(e) = answer_with(&mut w, id, &resp, &payload, true).await {
                        debug!(%peer, "connection ended while answering: {e}");
                    }
                    drop(on_its_way);
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
