//! Blocking threads' own connections to the servers, for request-and-answer calls.
//!
//! A caller that serves requests on threads that block (a FUSE mount's workers) makes a
//! [`Lane`] and a client handle on it ([`crate::Client::on_lane`]), and runs each operation
//! through [`Lane::block_on`]. Within it, on that thread, each request the handle (and the files
//! opened through it) sends for metadata (look-ups, creates, attributes, opens and closes)
//! goes out on the thread's own connection to the node, and the thread reads the answer itself
//! (`tessera_proto::LaneConn`) instead of being woken by the shared connection's reader task:
//! one wake-up fewer per request. So does a lone stripe read of a stripe without mirrors (a
//! random read: nothing else is in flight while the thread waits for it), and a small file's
//! last stripe write at its close, sent before the size goes to another node and answered after
//! it. Other stripe reads and writes, and anything the handle runs elsewhere (in tasks the
//! operation spawns, on the runtime), keep using the shared connections: a lane connection
//! serves one request at a time, and only while its thread waits in `block_on`. Requests an
//! operation makes at once (a join) take turns on the lane: such operations are better run on
//! the runtime.
//!
//! Coherence: a lane connection is attached to the subscribed shared connection it was made
//! beside, so the promises its answers carry are kept for that connection, and it is remade
//! once that connection is replaced. A promise is then never made to a connection whose end
//! the client has already heard of (`Notice::Reset`).

use bytes::Bytes;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::thread::ThreadId;
use std::time::Duration;
use tessera_placement::NodeId;
use tessera_proto::{LaneConn, Request, Response, RpcClient, RpcConfig, RpcError};
use tokio::runtime::Handle;
use tracing::debug;

/// Connections of the threads that run operations through it, by thread and node. Cheap to
/// clone (clones share them).
#[derive(Clone, Default)]
pub struct Lane {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Default)]
struct Inner {
    /// The threads in [`Lane::block_on`] now.
    running: HashSet<ThreadId>,
    conns: HashMap<(ThreadId, NodeId), Slot>,
}

struct Slot {
    conn: LaneConn,
    /// The shared connection it is attached to.
    beside: Weak<RpcClient>,
}

/// Takes the calling thread off a lane's running threads, also if the operation panicked.
struct Running<'a>(&'a Lane, ThreadId);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.lock().running.remove(&self.1);
    }
}

impl Lane {
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `f` to completion on this thread (which must not be a runtime worker: this
    /// blocks); the requests of client handles on this lane that `f` makes go out on this
    /// thread's connections.
    pub fn block_on<F: Future>(&self, rt: &Handle, f: F) -> F::Output {
        let me = std::thread::current().id();
        self.lock().running.insert(me);
        let _running = Running(self, me);
        rt.block_on(f)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Connections this lane has to servers (over all its threads).
    #[must_use]
    pub fn connections(&self) -> usize {
        self.lock().conns.len()
    }

    /// Is the calling thread running an operation through [`Self::block_on`], so that it may
    /// block on this lane's connections?
    pub(crate) fn here(&self) -> bool {
        self.lock().running.contains(&std::thread::current().id())
    }

    /// Sends `req` to `node` and returns before its answer, which [`Self::answer`] reads on
    /// this thread (at once, for a call; after asking another node something, for a request
    /// sent beside that one: until then a request to `node` would need a second connection).
    /// `None`: the lane cannot serve it now (this thread is not in `block_on`, or no connection
    /// could be made beside `shared`); use the shared connection.
    pub(crate) async fn send(
        &self,
        rpc: &RpcConfig,
        node: NodeId,
        shared: &Arc<RpcClient>,
        req: &Request,
        payload: &Bytes,
    ) -> Option<Result<Sent, RpcError>> {
        let me = std::thread::current().id();
        let slot = {
            let mut inner = self.lock();
            if !inner.running.contains(&me) {
                return None;
            }
            inner.conns.remove(&(me, node))
        };
        let (mut conn, fresh) = match slot {
            Some(s) if s.beside.as_ptr() == Arc::as_ptr(shared) && !s.conn.is_broken() => {
                (s.conn, false)
            }
            _ => match LaneConn::connect(shared.peer(), rpc, shared.watcher()).await {
                Ok(c) => (c, true),
                Err(e) => {
                    debug!(node, "no lane connection: {e}");
                    return None;
                }
            },
        };
        let beside = Arc::downgrade(shared);
        Some(conn.send(req, payload).map(|()| Sent {
            thread: me,
            node,
            conn,
            beside,
            fresh,
        }))
    }

    /// Waits for the answer to a request [`Self::send`] sent.
    pub(crate) fn answer(&self, mut sent: Sent) -> Result<(Response, Bytes), RpcError> {
        let answer = sent.conn.recv();
        self.put_back(sent);
        answer
    }

    /// [`Self::answer`], or the request back if no answer began within `within` (ask again,
    /// or drop it to give the connection up).
    pub(crate) fn answer_within(&self, mut sent: Sent, within: Duration) -> Heard {
        let answer = match sent.conn.recv_within(within) {
            Ok(None) => return Heard::Quiet(sent),
            Ok(Some(answer)) => Ok(answer),
            Err(e) => Err(e),
        };
        self.put_back(sent);
        Heard::Answer(answer)
    }

    /// Keeps the connection of an answered request for the thread's next one.
    fn put_back(&self, sent: Sent) {
        let Sent {
            thread,
            node,
            conn,
            beside,
            fresh,
        } = sent;
        let mut inner = self.lock();
        if fresh {
            // Drop the connections beside shared ones that ended (servers that left).
            inner
                .conns
                .retain(|_, s| s.beside.upgrade().is_some_and(|c| !c.is_closed()));
        }
        inner.conns.insert((thread, node), Slot { conn, beside });
    }
}

/// What [`Lane::answer_within`] heard.
pub(crate) enum Heard {
    Answer(Result<(Response, Bytes), RpcError>),
    /// Nothing yet: the request, still on its way.
    Quiet(Sent),
}

/// A request sent on a lane, its answer still to be read ([`Lane::answer`]).
pub(crate) struct Sent {
    thread: ThreadId,
    node: NodeId,
    conn: LaneConn,
    beside: Weak<RpcClient>,
    fresh: bool,
}
