//! A thread's own connections to the servers, for request-and-answer calls.
//!
//! A thread that serves requests by blocking (a FUSE worker) runs an operation through
//! [`Lane::block_on`]. Within it, each request `Router::call_ex` makes (metadata: look-ups,
//! creates, attributes, opens and closes) goes out on this thread's connection to the node,
//! and the thread reads the answer itself (`tessera_proto::LaneConn`) instead of being woken
//! by the shared connection's reader task: one wake-up fewer per request. So does a lone
//! stripe read of a stripe without mirrors (a random read: nothing else is in flight while the
//! thread waits for it), and a small file's last stripe write at its close, sent before the
//! size goes to another node and answered after it. Other stripe reads and writes, and tasks
//! the operation spawns, keep using the shared connections (a lane serves one request at a
//! time and only while its thread waits). Requests an operation makes at once (a join) take
//! turns on the lane: such operations are better run on the runtime.
//!
//! Coherence: a lane connection is attached to the subscribed shared connection it was made
//! beside, so the promises its answers carry are kept for that connection, and it is remade
//! once that connection is replaced. A promise is then never made to a connection whose end
//! the client has already heard of (`Notice::Reset`).

use crate::route::Router;
use bytes::Bytes;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use tessera_placement::NodeId;
use tessera_proto::{LaneConn, Request, Response, RpcClient, RpcError};
use tokio::runtime::Handle;
use tracing::debug;

tokio::task_local! {
    static CURRENT: Lane;
}

/// One thread's connections, by node. Cheap to clone (clones share them).
#[derive(Clone, Default)]
pub struct Lane {
    conns: Arc<Mutex<HashMap<NodeId, Slot>>>,
}

struct Slot {
    conn: LaneConn,
    /// The shared connection it is attached to.
    beside: Weak<RpcClient>,
}

impl Lane {
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `f` to completion on this thread (which must not be a runtime worker: this
    /// blocks), its requests going out on this lane.
    pub fn block_on<F: Future>(&self, rt: &Handle, f: F) -> F::Output {
        rt.block_on(CURRENT.scope(self.clone(), f))
    }

    fn conns(&self) -> MutexGuard<'_, HashMap<NodeId, Slot>> {
        self.conns.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Servers this lane has a connection to.
    #[must_use]
    pub fn connections(&self) -> usize {
        self.conns().len()
    }

    /// The lane of the operation being run, if any.
    pub(crate) fn current() -> Option<Self> {
        CURRENT.try_with(Self::clone).ok()
    }

    /// Sends `req` to `node` and returns before its answer, which [`Self::answer`] reads on
    /// this thread (at once, for a call; after asking another node something, for a request
    /// sent beside that one: until then a request to `node` would need a second connection).
    /// `None`: the lane cannot serve it now (no connection could be made beside `shared`); use
    /// the shared connection.
    pub(crate) async fn send(
        &self,
        router: &Router,
        node: NodeId,
        shared: &Arc<RpcClient>,
        req: &Request,
        payload: &Bytes,
    ) -> Option<Result<Sent, RpcError>> {
        let slot = self.conns().remove(&node);
        let (mut conn, fresh) = match slot {
            Some(s) if s.beside.as_ptr() == Arc::as_ptr(shared) && !s.conn.is_broken() => {
                (s.conn, false)
            }
            _ => match LaneConn::connect(shared.peer(), router.rpc(), shared.watcher()).await {
                Ok(c) => (c, true),
                Err(e) => {
                    debug!(node, "no lane connection: {e}");
                    return None;
                }
            },
        };
        let beside = Arc::downgrade(shared);
        Some(conn.send(req, payload).map(|()| Sent {
            node,
            conn,
            beside,
            fresh,
        }))
    }

    /// Waits for the answer to a request [`Self::send`] sent.
    pub(crate) fn answer(&self, sent: Sent) -> Result<(Response, Bytes), RpcError> {
        let Sent {
            node,
            mut conn,
            beside,
            fresh,
        } = sent;
        let answer = conn.recv();
        let mut conns = self.conns();
        if fresh {
            // Drop the connections beside shared ones that ended (servers that left).
            conns.retain(|_, s| s.beside.upgrade().is_some_and(|c| !c.is_closed()));
        }
        conns.insert(node, Slot { conn, beside });
        answer
    }
}

/// A request sent on a lane, its answer still to be read ([`Lane::answer`]).
pub(crate) struct Sent {
    node: NodeId,
    conn: LaneConn,
    beside: Weak<RpcClient>,
    fresh: bool,
}
