//! Routing: the cached partition table, the connections to the servers, the choice of
//! replica, and the retry and failover rules. [`Router`] is put together from:
//!
//! * [`table`]: the table and the link to the manager (refresh, waiting out a failover);
//! * [`transport`]: how requests reach the servers (one connection per server, shared);
//! * [`write`]: stripe writes go to every complete replica at once, with one epoch;
//! * [`read`]: reads go to the replica this client measures as least loaded
//!   ([`crate::choose`]), a large read split over two, a late one hedged; a read failing on
//!   one replica is retried at once on another, then with a fresh table;
//! * here: metadata goes to the partition's primary, which forwards changes to the mirrors
//!   itself, and node-wide requests to every node.
//!
//! A node that cannot be reached is waited out: the table is fetched every
//! `FAILOVER_POLL` until the manager removed the node (declared dead) or `failover_timeout`
//! passes, then the request goes to the new table's replicas. A partition with no replica left
//! is lost: its requests fail at once with `Lost` (EIO). A caller may send its requests on a
//! lane of its own ([`crate::Lane`]), passed to the calls that can use one.

mod read;
mod table;
mod transport;
mod write;

#[cfg(test)]
mod tests;

pub(crate) use read::ReadPart;
pub use read::ReadSinks;
pub(crate) use table::{Key, Route};
pub(crate) use write::{Ack, Outcome};

use crate::lane::{Heard, Lane};
use crate::options::ClientOptions;
use crate::{Error, Result};
use bytes::Bytes;
use read::NodeLoad;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
pub(crate) use table::Manager;
use table::{lists, lists_anywhere, FAILOVER_POLL, SUSPECT_AFTER};
use tessera_placement::{NodeId, PartitionId};
use tessera_proto::{BufferPool, Conns, ErrorCode, NoticeSink, Op, Request, Response, TableInfo};
use tokio::time::Instant;
use tracing::debug;
pub(crate) use transport::{Reply, Transport};
#[cfg(feature = "sim")]
pub(crate) use {table::ManagerCall, transport::Answer};

/// What [`Router::call_or_mirror`] got.
pub(crate) struct Called {
    pub answer: Result<(Response, Bytes)>,
    /// Sent, then not answered: a change may have been applied.
    pub maybe_applied: bool,
    /// Answered by a mirror, not the primary.
    pub by_mirror: bool,
}

/// Attempts for one request before giving up (stale epochs, a cluster still settling).
const MAX_ATTEMPTS: u32 = 40;

pub(crate) struct Router<T = Conns<NodeId>> {
    manager: Manager,
    transport: T,
    failover_timeout: Duration,
    route: RwLock<Arc<Route>>,
    loads: Mutex<HashMap<NodeId, Arc<NodeLoad>>>,
    refreshing: tokio::sync::Mutex<()>,
    /// When the table was last fetched (requests waiting out a failover share fetches).
    fetched: Mutex<Instant>,
}

fn backoff(attempt: u32) -> Duration {
    Duration::from_millis((2u64 << attempt.min(7)).min(250))
}

fn kept_changing() -> Error {
    Error::Unavailable("the partition table kept changing; giving up".into())
}

impl Router {
    pub async fn connect(opts: &ClientOptions) -> Result<Self> {
        let (manager, info) = Manager::connect(opts).await?;
        let conns = Conns::new(manager.rpc().clone());
        Ok(Self::new(manager, info, conns, opts.failover_timeout))
    }
}

impl<T: Transport> Router<T> {
    pub(crate) fn new(
        manager: Manager,
        info: TableInfo,
        transport: T,
        failover_timeout: Duration,
    ) -> Self {
        Self {
            manager,
            transport,
            failover_timeout,
            route: RwLock::new(Arc::new(Route::new(info))),
            loads: Mutex::default(),
            refreshing: tokio::sync::Mutex::new(()),
            fetched: Mutex::new(Instant::now()),
        }
    }

    pub fn pool(&self) -> &BufferPool {
        &self.manager.rpc().pool
    }

    /// From now on, server connections are subscribed and deliver notices to `sink`; the
    /// connections made before are dropped (new ones replace them as needed). Once only.
    pub fn subscribe(&self, sink: NoticeSink) -> Result<()> {
        if !self.transport.subscribe(sink) {
            return Err(Error::Invalid("this client is subscribed already".into()));
        }
        Ok(())
    }

    /// Can `node` be reached? (`Unavailable` if not.)
    async fn reach(&self, route: &Route, node: NodeId) -> Result<()> {
        self.transport.reach(node, route.addr(node)?).await
    }

    /// Sends `req` to `node` and waits for the answer; an unreachable node, or one the table
    /// drops while the request waits, is `Unavailable`.
    async fn ask(
        &self,
        route: &Route,
        node: NodeId,
        req: &Request,
        payload: Bytes,
    ) -> Result<(Response, Bytes)> {
        let addr = route.addr(node)?;
        let asked = async {
            let reply = self.transport.send(node, addr, req, payload, None).await?;
            Ok::<_, Error>(reply.wait().await?)
        };
        self.unless_dropped(node, None, None, asked)
            .await
            .unwrap_or_else(|| Err(Error::Unavailable(format!("node {node} left the table"))))
    }

    /// Sends `op` for `key` to its partition's primary and waits, retrying across table
    /// changes, reconnects and failovers; on `lane` when given and this thread may use it.
    pub async fn call(
        &self,
        lane: Option<&Lane>,
        key: Key,
        op: Op,
        payload: Bytes,
    ) -> Result<(Response, Bytes)> {
        self.call_ex(lane, key, op, payload).await.0
    }

    /// [`Self::call`], also telling whether the request may have been applied by a server that
    /// then failed to answer (it was re-sent after a lost connection or a timeout): a
    /// non-idempotent operation may then find its own effect.
    pub async fn call_ex(
        &self,
        lane: Option<&Lane>,
        key: Key,
        op: Op,
        payload: Bytes,
    ) -> (Result<(Response, Bytes)>, bool) {
        let called = self.call_or_mirror(lane, key, op, payload, None).await;
        (called.answer, called.maybe_applied)
    }

    /// [`Self::call`] for a metadata read (`InodeGet`, `DirLookup`, `DirList`), which a mirror
    /// answers when the primary does not.
    pub async fn read_meta(&self, lane: Option<&Lane>, key: Key, op: Op) -> Result<Response> {
        let mirror = op.clone();
        let called = self
            .call_or_mirror(lane, key, op, Bytes::new(), Some(mirror))
            .await;
        called.answer.map(|(resp, _)| resp)
    }

    /// Sends `op` to `key`'s primary, as [`Self::call`]. With `mirror` (a read), a primary that
    /// cannot be reached, or does not answer within [`SUSPECT_AFTER`], has `mirror` asked of
    /// the partition's other replicas before the failover is waited for: they hold every change
    /// the primary acknowledged, and while the manager is away no table will replace the
    /// primary.
    pub async fn call_or_mirror(
        &self,
        lane: Option<&Lane>,
        key: Key,
        op: Op,
        payload: Bytes,
        mirror: Option<Op>,
    ) -> Called {
        let mut req = Request::Op { epoch: 0, op };
        let mut maybe_applied = false;
        let mut since = None;
        let done = |answer, maybe_applied, by_mirror| Called {
            answer,
            maybe_applied,
            by_mirror,
        };
        for attempt in 0..MAX_ATTEMPTS {
            let route = self.route();
            if let Request::Op { epoch, .. } = &mut req {
                *epoch = route.epoch();
            }
            let (node, mirrored) = match route.replicas(key) {
                Ok(r) => (r[0], r.len() > 1),
                Err(e) => return done(Err(e), maybe_applied, false),
            };
            let p = route.partition(key);
            let quit = (mirror.is_some() && mirrored).then_some(SUSPECT_AFTER);
            let answer = self
                .exchange(
                    lane,
                    &route,
                    (node, p),
                    &req,
                    &payload,
                    quit,
                    &mut maybe_applied,
                )
                .await;
            match answer {
                Ok((Response::Error(e), _)) if retryable(&e) => {
                    if let Err(e) = self.refresh(route.epoch()).await {
                        return done(Err(e), maybe_applied, false);
                    }
                    tokio::time::sleep(backoff(attempt)).await;
                }
                Ok((Response::Error(e), _)) => return done(Err(e.into()), maybe_applied, false),
                Ok(ok) => return done(Ok(ok), maybe_applied, false),
                Err(Error::Unavailable(why)) => {
                    debug!(node, "request failed: {why}");
                    if let Some(read) = &mirror {
                        if let Some(answer) = self.ask_mirrors(&route, key, read).await {
                            return done(answer, maybe_applied, true);
                        }
                    }
                    let since = *since.get_or_insert_with(Instant::now);
                    if let Err(e) = self
                        .await_failover(&[node], |t, n| !lists(t, n, p), since, "request")
                        .await
                    {
                        return done(Err(e), maybe_applied, false);
                    }
                }
                Err(e) => return done(Err(e), maybe_applied, false),
            }
        }
        done(Err(kept_changing()), maybe_applied, false)
    }

    /// `read` asked of `key`'s replicas after the primary, in turn, each given
    /// [`SUSPECT_AFTER`]: the first answer that is not a refusal to serve (stale table, not
    /// ready), or `None`.
    async fn ask_mirrors(
        &self,
        route: &Route,
        key: Key,
        read: &Op,
    ) -> Option<Result<(Response, Bytes)>> {
        let req = Request::Op {
            epoch: route.epoch(),
            op: read.clone(),
        };
        let p = route.partition(key);
        let mut unused = false;
        for &m in route.replicas(key).ok()?.iter().skip(1) {
            let asked = self
                .exchange(
                    None,
                    route,
                    (m, p),
                    &req,
                    &Bytes::new(),
                    Some(SUSPECT_AFTER),
                    &mut unused,
                )
                .await;
            match asked {
                Ok((Response::Error(e), _)) if retryable(&e) => {}
                Ok((Response::Error(e), _)) => return Some(Err(e.into())),
                Ok(ok) => {
                    debug!(
                        mirror = m,
                        partition = p,
                        "a mirror answered for its primary"
                    );
                    return Some(Ok(ok));
                }
                Err(e) => debug!(mirror = m, "the mirror did not answer either: {e}"),
            }
        }
        None
    }

    /// One request to `node` about partition `p` and its answer: on `lane` if given and it
    /// can take it, else on the shared connection. `maybe_applied` is set if it was sent but
    /// not answered. A node the table drops while the request waits is `Unavailable`, and so
    /// is one that has not answered after `quit`, if given (another replica may answer).
    #[allow(clippy::too_many_arguments)]
    async fn exchange(
        &self,
        lane: Option<&Lane>,
        route: &Route,
        (node, p): (NodeId, PartitionId),
        req: &Request,
        payload: &Bytes,
        quit: Option<Duration>,
        maybe_applied: &mut bool,
    ) -> Result<(Response, Bytes)> {
        let begun = Instant::now();
        let given_up = || quit.is_some_and(|q| begun.elapsed() >= q);
        let addr = route.addr(node)?;
        // Connecting waits for the server too: watched as the answer is.
        let dropped = || match quit.filter(|_| given_up()) {
            Some(q) => Error::Unavailable(format!("node {node} did not answer within {q:?}")),
            None => Error::Unavailable(format!(
                "node {node} left partition {p} while a request to it waited"
            )),
        };
        let on_lane = match lane {
            Some(lane) => self
                .unless_dropped(node, Some(p), quit, async {
                    self.transport
                        .send_on_lane(lane, node, addr, req, payload)
                        .await
                })
                .await
                .ok_or_else(dropped)??
                .map(|sent| (lane, sent)),
            None => None,
        };
        let answer = match on_lane {
            Some((lane, Ok(mut sent))) => {
                let mut patience = SUSPECT_AFTER;
                loop {
                    match lane.answer_within(sent, patience) {
                        Heard::Answer(answer) => break Some(answer),
                        Heard::Quiet(quiet)
                            if given_up() || self.node_dropped(node, Some(p)).await =>
                        {
                            // Dropped, the lane connection goes with the request.
                            drop(quiet);
                            break None;
                        }
                        Heard::Quiet(quiet) => sent = quiet,
                    }
                    patience = FAILOVER_POLL;
                }
            }
            Some((_, Err(e))) => Some(Err(e)),
            None => {
                let asked = async {
                    let reply = self
                        .transport
                        .send(node, addr, req, payload.clone(), None)
                        .await?;
                    Ok::<_, Error>(reply.wait().await)
                };
                match self.unless_dropped(node, Some(p), quit, asked).await {
                    Some(Err(e)) => return Err(e),
                    Some(Ok(answer)) => Some(answer),
                    None => None,
                }
            }
        };
        let Some(answer) = answer else {
            *maybe_applied = true;
            return Err(dropped());
        };
        *maybe_applied |= answer.is_err();
        answer.map_err(Error::from)
    }

    /// Sends a node-wide `op` to every node in the table (holding or receiving partitions) and
    /// waits for all. A node that cannot be reached is waited out until the manager removes it
    /// from the table; the op is then sent again to the new table's nodes (it is idempotent).
    pub async fn broadcast(&self, op: Op) -> Result<()> {
        let mut since = None;
        for attempt in 0..MAX_ATTEMPTS {
            let route = self.route();
            let req = Request::Op {
                epoch: route.epoch(),
                op: op.clone(),
            };
            let replies =
                futures::future::join_all(route.info.table.nodes().into_iter().map(|node| {
                    let (route, req) = (&route, &req);
                    async move { (node, self.ask(route, node, req, Bytes::new()).await) }
                }))
                .await;
            let (mut stale, mut down) = (false, Vec::new());
            for (node, reply) in replies {
                match reply {
                    Ok((Response::Error(e), _)) if retryable(&e) => stale = true,
                    Ok((Response::Error(e), _)) => return Err(e.into()),
                    Ok(_) => {}
                    Err(Error::Unavailable(why)) => {
                        debug!(node, "broadcast failed: {why}");
                        down.push(node);
                    }
                    Err(e) => return Err(e),
                }
            }
            if !down.is_empty() {
                let since = *since.get_or_insert_with(Instant::now);
                self.await_failover(&down, |t, n| !lists_anywhere(t, n), since, "broadcast")
                    .await?;
            } else if stale {
                self.refresh(route.epoch()).await?;
                tokio::time::sleep(backoff(attempt)).await;
            } else {
                return Ok(());
            }
        }
        Err(kept_changing())
    }
}

impl<T: Transport> Router<T> {
    /// Renews lease `holder` at every replica of the partitions of `inos` (its open files);
    /// whether a server let its handles go. A server that does not answer is asked again at
    /// the next renewal; one with a newer table has the table fetched, and the lease renewed
    /// where the files are now.
    pub async fn renew(&self, holder: u64, inos: &[tessera_placement::Ino]) -> bool {
        for _ in 0..2 {
            let route = self.route();
            let table = &route.info.table;
            let nodes: std::collections::BTreeSet<NodeId> = inos
                .iter()
                .flat_map(|&ino| table.replicas(route.partition(Key::Meta(ino))))
                .copied()
                .collect();
            let req = Request::Op {
                epoch: route.epoch(),
                op: Op::LeaseRenew { holder },
            };
            let replies = futures::future::join_all(
                nodes
                    .iter()
                    .map(|&node| self.ask(&route, node, &req, Bytes::new())),
            )
            .await;
            let (mut expired, mut stale) = (false, false);
            for reply in replies {
                match reply {
                    Ok((Response::Error(ErrorCode::LeaseExpired), _)) => expired = true,
                    Ok((Response::Error(e), _)) if retryable(&e) => stale = true,
                    Ok(_) => {}
                    Err(e) => debug!("renewing the lease: {e}"),
                }
            }
            if expired || !stale || self.refresh(route.epoch()).await.is_err() {
                return expired;
            }
        }
        false
    }
}

pub(crate) fn retryable(e: &ErrorCode) -> bool {
    matches!(e, ErrorCode::StaleEpoch { .. } | ErrorCode::NotReady(_))
}

pub(crate) fn unexpected(r: &Response) -> Error {
    Error::Unavailable(format!("unexpected answer from the cluster: {r:?}"))
}
