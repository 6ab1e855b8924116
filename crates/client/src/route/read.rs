//! The read path: a stripe read goes to the replica this client measures as least loaded
//! ([`crate::choose`]), a large one split over two; a late answer is hedged on another
//! replica; a replica that fails is replaced at once by the next, then the table is refreshed
//! (waiting out a failover). Lone reads of unmirrored stripes may go out on the caller's lane.

use super::table::{lists, Key, Route};
use super::transport::{Answer, Reply, Transport};
use super::{backoff, kept_changing, retryable, unexpected, Router, MAX_ATTEMPTS};
use crate::choose::{self, Load};
use crate::lane::Lane;
use crate::{Error, Result};
use bytes::Bytes;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tessera_placement::{Ino, NodeId};
use tessera_proto::{Op, Request, Response, RpcError, Sink, Waiter};
use tokio::time::Instant;
use tracing::debug;

/// Weight of a new latency sample in a node's moving average.
const EWMA_WEIGHT: f64 = 0.2;
/// A latency not measured for this long is forgotten: a node skipped as a hot spot is tried
/// again (and measured) after it, so one that recovered is used again.
const LATENCY_FRESH: Duration = Duration::from_secs(2);
/// Latencies are compared per this many bytes read (smaller reads count as this size), so large
/// and small reads measure a node alike.
pub(crate) const LATENCY_UNIT: u32 = 64 << 10;

/// Memory for read answers, supplied by the caller: a stripe read from one replica is received
/// straight into it, and the `Bytes` that [`crate::File::read_at`] returns then lie in it, copied only
/// from the socket. (The Python binding hands out `bytes` objects this way.)
pub trait ReadSinks: Send + Sync {
    /// A sink of at least `len` bytes, or `None` to receive into the client's own buffers.
    fn sink(&self, len: usize) -> Option<Box<dyn Sink>>;
}

/// Read load this client puts on one node, as [`crate::choose`] ranks replicas by.
#[derive(Default)]
pub(super) struct NodeLoad {
    outstanding: AtomicU32,
    /// Moving average of microseconds per [`LATENCY_UNIT`], and when it was last sampled.
    latency: Mutex<Option<(f64, Instant)>>,
}

impl NodeLoad {
    fn load(&self, now: Instant) -> Load {
        let latency = *self.latency.lock().unwrap_or_else(PoisonError::into_inner);
        Load {
            outstanding: self.outstanding.load(Ordering::Relaxed),
            latency: latency
                .filter(|(_, at)| now.duration_since(*at) < LATENCY_FRESH)
                .map(|(l, _)| l),
        }
    }

    fn record(&self, elapsed: Duration, len: u32) {
        let units = f64::from(len.max(LATENCY_UNIT)) / f64::from(LATENCY_UNIT);
        let sample = elapsed.as_secs_f64() * 1e6 / units;
        let now = Instant::now();
        let mut latency = self.latency.lock().unwrap_or_else(PoisonError::into_inner);
        let avg = match *latency {
            // A forgotten average is replaced: a node that recovered is trusted at once.
            Some((avg, at)) if now.duration_since(at) < LATENCY_FRESH => {
                avg + EWMA_WEIGHT * (sample - avg)
            }
            _ => sample,
        };
        *latency = Some((avg, now));
    }
}

/// Counts one outstanding request on a node until dropped.
struct Busy(Arc<NodeLoad>);

impl Busy {
    fn new(load: Arc<NodeLoad>) -> Self {
        load.outstanding.fetch_add(1, Ordering::Relaxed);
        Self(load)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.outstanding.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A read in flight, counted against its node's load until answered.
struct Tracked<R> {
    node: NodeId,
    waiter: R,
    busy: Busy,
    sent: Instant,
    len: u32,
}

impl<R: Reply> Tracked<R> {
    async fn wait(self) -> (NodeId, Answer) {
        let answer = self.waiter.wait().await;
        // Only served reads measure service time (a stale-epoch refusal is quick and says
        // nothing about it).
        if matches!(answer, Ok((Response::Ok, _))) {
            self.busy.0.record(self.sent.elapsed(), self.len);
        }
        (self.node, answer)
    }
}

/// A replica a request failed on: `down` (with why) when it could not be reached, `None` when
/// it answered that it cannot serve the request now (stale epoch, not ready).
#[derive(Debug, Clone)]
struct Tried {
    node: NodeId,
    down: Option<String>,
}

enum Pending<R> {
    /// Waited for by whoever finishes the read (it does so at once).
    Sent(Tracked<R>),
    /// Read ahead: a task waits for it, so its latency is measured when it arrives, not when
    /// the reader gets to it. With when it was sent.
    Spawned(NodeId, Instant, tokio::task::JoinHandle<(NodeId, Answer)>),
    Failed(Tried),
}

/// One piece of a stripe read, sent to one replica: bytes `offset..offset + len` of the stripe.
pub(crate) struct ReadPart<R = Waiter> {
    pub offset: u32,
    pub len: u32,
    key: Key,
    op: Op,
    pending: Pending<R>,
}

impl<R: Reply> ReadPart<R> {
    /// Lets a task wait for the answer (for reads whose bytes are needed only later).
    pub fn detach(&mut self) {
        let placeholder = Pending::Failed(Tried {
            node: 0,
            down: None,
        });
        self.pending = match std::mem::replace(&mut self.pending, placeholder) {
            Pending::Sent(t) => Pending::Spawned(t.node, t.sent, tokio::spawn(t.wait())),
            other => other,
        };
    }
}

impl<T: Transport> Router<T> {
    /// Queues a read of bytes `offset..offset + len` of a stripe to the replica the load
    /// measurements choose; a read of at least [`choose::SPLIT_MIN`] with two usable replicas
    /// is split between the two best, which serve it at once. `Lost` if no replica is left.
    pub async fn send_read(
        &self,
        file: Ino,
        stripe: u64,
        offset: u32,
        len: u32,
        sinks: Option<&dyn ReadSinks>,
    ) -> Result<Vec<ReadPart<T::Reply>>> {
        let key = Key::Stripe(file, stripe);
        let route = self.route();
        let (order, loads, usable) = self.read_order(route.replicas(key)?);
        let cut = match loads.as_slice() {
            [a, b, ..] => choose::split_at(len, usable, *a, *b),
            _ => None,
        };
        let pieces = match cut {
            Some(at) => vec![(order[0], offset, at), (order[1], offset + at, len - at)],
            None => vec![(order[0], offset, len)],
        };
        // A split answer comes in two pieces: only a whole one can be the caller's memory.
        let sinks = sinks.filter(|_| pieces.len() == 1);
        let mut parts = Vec::with_capacity(pieces.len());
        for (node, offset, len) in pieces {
            let op = Op::ReadStripe {
                file,
                stripe,
                offset,
                len,
            };
            let sink = sinks.and_then(|s| s.sink(len as usize));
            let pending = match self.send_tracked(&route, node, &op, len, sink).await {
                Ok(t) => Pending::Sent(t),
                Err(e) => Pending::Failed(Tried {
                    node,
                    down: Some(e.to_string()),
                }),
            };
            parts.push(ReadPart {
                offset,
                len,
                key,
                op,
                pending,
            });
        }
        Ok(parts)
    }

    /// A lone stripe read on `lane` (a FUSE worker's random read) when the stripe has one
    /// replica: sent and answered on the lane, with no hand-off to the runtime. `None`: the
    /// lane is not this thread's to use now (see [`Lane::block_on`]), or mirrors to choose
    /// among and hedge over (`send_read` does that).
    pub async fn read_on_lane(
        &self,
        lane: &Lane,
        file: Ino,
        stripe: u64,
        offset: u32,
        len: u32,
    ) -> Option<Result<Bytes>> {
        let key = Key::Stripe(file, stripe);
        if !lane.here() || self.route().replicas(key).map_or(true, |r| r.len() != 1) {
            return None;
        }
        let op = Op::ReadStripe {
            file,
            stripe,
            offset,
            len,
        };
        Some(match self.call(Some(lane), key, op, Bytes::new()).await {
            Ok((Response::Ok, data)) => Ok(data),
            Ok((other, _)) => Err(unexpected(&other)),
            Err(e) => Err(e),
        })
    }

    async fn send_tracked(
        &self,
        route: &Route,
        node: NodeId,
        op: &Op,
        len: u32,
        sink: Option<Box<dyn Sink>>,
    ) -> Result<Tracked<T::Reply>> {
        let addr = route.addr(node)?;
        let req = Request::Op {
            epoch: route.epoch(),
            op: op.clone(),
        };
        let busy = Busy::new(self.load_of(node));
        let sent = Instant::now();
        let waiter = self
            .transport
            .send(node, addr, &req, Bytes::new(), sink)
            .await?;
        Ok(Tracked {
            node,
            waiter,
            busy,
            sent,
            len,
        })
    }

    /// The bytes of a part sent by [`Self::send_read`]; if its replica failed, read again from
    /// another (see [`Self::read`]).
    pub async fn finish_read(&self, part: ReadPart<T::Reply>) -> Result<Bytes> {
        let ReadPart {
            key,
            op,
            len,
            pending,
            ..
        } = part;
        let outcome = match pending {
            Pending::Sent(t) => {
                let (node, sent) = (t.node, t.sent);
                let first = async move {
                    let (node, answer) = t.wait().await;
                    settle(node, answer)
                };
                self.hedged(key, &op, len, node, sent, first).await?
            }
            Pending::Spawned(node, sent, task) => {
                let first = async move {
                    match task.await {
                        Ok((node, answer)) => settle(node, answer),
                        Err(e) => Ok(Err(Tried {
                            node,
                            down: Some(e.to_string()),
                        })),
                    }
                };
                self.hedged(key, &op, len, node, sent, first).await?
            }
            Pending::Failed(tried) => Err(tried),
        };
        match outcome {
            Ok(b) => Ok(b),
            Err(tried) => self.read(key, &op, len, vec![tried]).await,
        }
    }

    /// [`Self::race`], given up once the table drops `node` (a replica that stopped answering,
    /// when no other could be asked): the read then goes to the replicas left.
    async fn hedged(
        &self,
        key: Key,
        op: &Op,
        len: u32,
        node: NodeId,
        sent: Instant,
        first: impl std::future::Future<Output = Result<std::result::Result<Bytes, Tried>>>,
    ) -> Result<std::result::Result<Bytes, Tried>> {
        let p = self.route().partition(key);
        let race = self.race(key, op, len, node, sent, first);
        self.unless_dropped(node, Some(p), None, race)
            .await
            .unwrap_or_else(|| {
                Ok(Err(Tried {
                    node,
                    down: Some("it left the partition table while the read waited".into()),
                }))
            })
    }

    /// Waits for a read sent to `node` at `sent`; if it is late (see [`choose::hedge_after`])
    /// and another usable replica exists, sends it there too and takes the first good answer.
    /// A late node is marked slow at once, so the next reads avoid it (CEFT-PVFS's hot-spot
    /// skipping, without waiting for the slow answer to measure it).
    async fn race(
        &self,
        key: Key,
        op: &Op,
        len: u32,
        node: NodeId,
        sent: Instant,
        first: impl std::future::Future<Output = Result<std::result::Result<Bytes, Tried>>>,
    ) -> Result<std::result::Result<Bytes, Tried>> {
        tokio::pin!(first);
        let route = self.route();
        let others: Vec<NodeId> = route
            .replicas(key)
            .map(|r| r.iter().copied().filter(|&n| n != node).collect())
            .unwrap_or_default();
        let (order, loads, usable) = self.read_order(&others);
        if usable == 0 {
            return first.await;
        }
        let best = loads
            .iter()
            .filter_map(|l| l.latency)
            .chain(self.load_of(node).load(Instant::now()).latency)
            .min_by(f64::total_cmp);
        let late = sent + choose::hedge_after(len, best, LATENCY_UNIT);
        if let Ok(done) = tokio::time::timeout_at(late, &mut first).await {
            return done;
        }
        self.load_of(node).record(sent.elapsed(), len);
        let Ok(t) = self.send_tracked(&route, order[0], op, len, None).await else {
            return first.await;
        };
        debug!(
            late = node,
            to = order[0],
            "read is late: asking another replica too"
        );
        let second = async move {
            let (node, answer) = t.wait().await;
            settle(node, answer)
        };
        tokio::pin!(second);
        tokio::select! {
            biased;
            r = &mut first => match r? {
                Ok(b) => Ok(Ok(b)),
                Err(_) => second.await,
            },
            r = &mut second => match r? {
                Ok(b) => Ok(Ok(b)),
                Err(_) => first.await,
            },
        }
    }

    /// Reads with retries: a replica that fails (unreachable, stale, not ready) is replaced at
    /// once by the next one in load order; when every replica failed, the table is refreshed
    /// (waiting out a failover if some were unreachable) and the round starts again.
    async fn read(&self, key: Key, op: &Op, len: u32, mut tried: Vec<Tried>) -> Result<Bytes> {
        let mut since = None;
        for attempt in 0..MAX_ATTEMPTS {
            let route = self.route();
            let untried: Vec<NodeId> = route
                .replicas(key)?
                .iter()
                .copied()
                .filter(|n| tried.iter().all(|t| t.node != *n))
                .collect();
            let Some(&node) = self.read_order(&untried).0.first() else {
                let down: Vec<NodeId> = tried
                    .iter()
                    .filter(|t| t.down.is_some())
                    .map(|t| t.node)
                    .collect();
                if down.is_empty() {
                    self.refresh(route.epoch()).await?;
                    tokio::time::sleep(backoff(attempt)).await;
                } else {
                    let p = route.partition(key);
                    let since = *since.get_or_insert_with(Instant::now);
                    self.await_failover(&down, |t, n| !lists(t, n, p), since, "read")
                        .await?;
                }
                tried.clear();
                continue;
            };
            let p = route.partition(key);
            let answer = match self.send_tracked(&route, node, op, len, None).await {
                Ok(t) => match self.unless_dropped(node, Some(p), None, t.wait()).await {
                    Some((_, answer)) => answer.map_err(Error::from),
                    None => Err(Error::Unavailable(
                        "it left the partition table while the read waited".into(),
                    )),
                },
                Err(e) => Err(e),
            };
            let outcome = match answer {
                Ok(answer) => settle(node, Ok(answer))?,
                Err(Error::Unavailable(why)) => Err(Tried {
                    node,
                    down: Some(why),
                }),
                Err(e) => return Err(e),
            };
            match outcome {
                Ok(b) => return Ok(b),
                Err(t) => {
                    debug!(node, down = ?t.down, "read failed on a replica, trying another");
                    tried.push(t);
                }
            }
        }
        Err(kept_changing())
    }

    fn load_of(&self, node: NodeId) -> Arc<NodeLoad> {
        self.loads
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(node)
            .or_default()
            .clone()
    }

    /// `nodes` in the order a read should try them, their loads in that order, and how many of
    /// the first are usable (not hot spots).
    fn read_order(&self, nodes: &[NodeId]) -> (Vec<NodeId>, Vec<Load>, usize) {
        let now = Instant::now();
        let loads: Vec<Load> = nodes.iter().map(|&n| self.load_of(n).load(now)).collect();
        let (order, usable) = choose::rank(&loads);
        (
            order.iter().map(|&i| nodes[i]).collect(),
            order.iter().map(|&i| loads[i]).collect(),
            usable,
        )
    }
}

/// A read's answer: its bytes, a replica to try instead of this one, or a final error.
fn settle(node: NodeId, answer: Answer) -> Result<std::result::Result<Bytes, Tried>> {
    match answer {
        Ok((Response::Ok, b)) => Ok(Ok(b)),
        Ok((Response::Error(e), _)) if retryable(&e) => Ok(Err(Tried { node, down: None })),
        Ok((Response::Error(e), _)) => Err(e.into()),
        Ok((other, _)) => Err(unexpected(&other)),
        Err(RpcError::Encode(m)) => Err(Error::Invalid(m)),
        Err(e) => Ok(Err(Tried {
            node,
            down: Some(e.to_string()),
        })),
    }
}
