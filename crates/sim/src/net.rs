//! The in-memory network: endpoints by address (a server's real `Service`, or the manager's
//! real `State`), one FIFO link per (sender, receiver) pair as a TCP connection is, and the
//! faults the nemesis turns on: latency and its spikes, slow nodes, partitions (messages held
//! until healed, or the caller's timeout), duplicated requests and lost answers.
//!
//! Every delay and every fault is drawn from the seeded [`Rng`] when a message is sent, and
//! the runtime runs one task at a time on a paused clock, so a seed replays the same schedule.

use crate::rng::Rng;
use crate::Log;
use bytes::Bytes;
use futures::future::BoxFuture;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;
use tessera_manager::state::State;
use tessera_placement::NodeId;
use tessera_proto::{Conn, Handler, Reply, Request, Response, RpcError};
use tessera_server::handler::Service;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio::time::Instant;

/// A caller waits this long for an answer, as `RpcConfig::request_timeout`.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// How often a message held by a partition looks whether it healed.
const HELD_POLL: Duration = Duration::from_millis(20);

pub type Answer = Result<(Response, Bytes), RpcError>;

/// Who answers at an address.
#[derive(Clone)]
pub enum Target {
    /// A server; set once it has registered (until then its requests wait, as in a listen
    /// backlog).
    Server(Arc<OnceLock<Arc<Service>>>),
    Manager(Arc<Mutex<State>>),
}

struct Endpoint {
    target: Target,
    /// Its links' delivery tasks and its detached answers: a kill ends them all, and the
    /// answers they owed fail as a closed connection does.
    tasks: JoinSet<()>,
}

struct Msg {
    src: SocketAddr,
    req: Request,
    payload: Bytes,
    at: Instant,
    reply: Option<oneshot::Sender<Answer>>,
}

struct Link {
    tx: mpsc::UnboundedSender<Msg>,
    /// When its last message is delivered: the next one is not before (FIFO).
    last: Instant,
}

/// The faults in force now.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Extra latency range, in milliseconds (a spike).
    pub spike_ms: u64,
    /// Side of each address in a partition; addresses on different sides cannot talk.
    pub sides: BTreeMap<SocketAddr, u8>,
    /// Extra latency of messages to or from a slow node.
    pub slow: BTreeMap<SocketAddr, Duration>,
    /// Requests delivered twice, per mille.
    pub duplicate: u64,
    /// Answers lost (the connection breaks after the request was handled), per mille.
    pub lose_answer: u64,
}

struct Inner {
    rng: Rng,
    endpoints: BTreeMap<SocketAddr, Endpoint>,
    links: BTreeMap<(SocketAddr, SocketAddr), Link>,
    faults: Faults,
    /// Addresses that were killed: what they send goes nowhere.
    dead: BTreeSet<SocketAddr>,
}

pub struct SimNet {
    inner: Mutex<Inner>,
    pub log: Arc<Log>,
    /// Called after every message handled: the invariants.
    step: OnceLock<Box<dyn Fn() + Send + Sync>>,
    /// Where the manager's clock starts (its `State` takes `std::time::Instant`s).
    epoch_std: std::time::Instant,
    epoch: Instant,
}

impl SimNet {
    #[must_use]
    pub fn new(seed: u64, log: Arc<Log>) -> Arc<Self> {
        Arc::new(Self {
            inner: Mutex::new(Inner {
                rng: Rng::new(seed),
                endpoints: BTreeMap::new(),
                links: BTreeMap::new(),
                faults: Faults::default(),
                dead: BTreeSet::new(),
            }),
            log,
            step: OnceLock::new(),
            epoch_std: std::time::Instant::now(),
            epoch: Instant::now(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The simulated time as the manager's state wants it.
    #[must_use]
    pub fn now_std(&self) -> std::time::Instant {
        self.epoch_std + self.epoch.elapsed()
    }

    /// Draws from the simulation's random source.
    pub fn with_rng<R>(&self, f: impl FnOnce(&mut Rng) -> R) -> R {
        f(&mut self.lock().rng)
    }

    pub fn set_step(&self, f: Box<dyn Fn() + Send + Sync>) {
        let _ = self.step.set(f);
    }

    pub fn faults(&self) -> Faults {
        self.lock().faults.clone()
    }

    pub fn set_faults(&self, f: Faults) {
        self.lock().faults = f;
    }

    /// Someone answers at `addr` from now on.
    pub fn attach(&self, addr: SocketAddr, target: Target) {
        let mut inner = self.lock();
        inner.dead.remove(&addr);
        inner.endpoints.insert(
            addr,
            Endpoint {
                target,
                tasks: JoinSet::new(),
            },
        );
    }

    /// `addr` dies: what was queued to it or waits on it fails, what it sends goes nowhere.
    pub fn kill(&self, addr: SocketAddr) {
        let gone = {
            let mut inner = self.lock();
            inner.dead.insert(addr);
            inner.links.retain(|&(_, dst), _| dst != addr);
            inner.endpoints.remove(&addr)
        };
        drop(gone);
    }

    /// Whether `a` and `b` are on different sides of a partition.
    fn cut(&self, a: SocketAddr, b: SocketAddr) -> bool {
        let f = &self.lock().faults;
        let side = |x| f.sides.get(&x).copied().unwrap_or(0);
        side(a) != side(b)
    }

    /// A message's one-way latency now, drawn from the seed.
    fn latency(inner: &mut Inner, src: SocketAddr, dst: SocketAddr) -> Duration {
        let f = &inner.faults;
        let slow = f.slow.get(&src).copied().unwrap_or_default()
            + f.slow.get(&dst).copied().unwrap_or_default();
        let spike = f.spike_ms;
        let micros = inner.rng.range(50, 2000) + inner.rng.range(0, spike * 1000 + 1);
        Duration::from_micros(micros) + slow
    }

    /// Queues `req` from `src` to `dst`; the answer comes on the receiver returned.
    fn enqueue(
        self: &Arc<Self>,
        src: SocketAddr,
        dst: SocketAddr,
        req: Request,
        payload: Bytes,
    ) -> Result<oneshot::Receiver<Answer>, RpcError> {
        let mut inner = self.lock();
        if !inner.endpoints.contains_key(&dst) {
            return Err(RpcError::Connect {
                addr: dst,
                source: std::io::ErrorKind::ConnectionRefused.into(),
            });
        }
        let lat = Self::latency(&mut inner, src, dst);
        let dup = inner.faults.duplicate;
        let twice = inner.rng.chance(dup);
        let now = Instant::now();
        if !inner.links.contains_key(&(src, dst)) {
            let (tx, rx) = mpsc::unbounded_channel();
            let net = self.clone();
            if let Some(ep) = inner.endpoints.get_mut(&dst) {
                ep.tasks.spawn(net.deliver(dst, rx));
            }
            inner.links.insert((src, dst), Link { tx, last: now });
        }
        let (reply, answer) = oneshot::channel();
        let Some(link) = inner.links.get_mut(&(src, dst)) else {
            return Err(RpcError::Closed {
                addr: dst,
                reason: "no link".into(),
            });
        };
        link.last = link.last.max(now + lat);
        let mut reply = Some(reply);
        for _ in 0..if twice { 2 } else { 1 } {
            let _ = link.tx.send(Msg {
                src,
                req: req.clone(),
                payload: payload.clone(),
                at: link.last,
                // The copy's answer goes nowhere: the caller has the first.
                reply: reply.take(),
            });
        }
        if twice {
            self.log
                .event(format!("duplicate {src} -> {dst}: {}", kind(&req)));
        }
        Ok(answer)
    }

    /// Waits for an answer as a caller does: a closed connection or a timeout are errors.
    async fn answer(dst: SocketAddr, rx: oneshot::Receiver<Answer>) -> Answer {
        match tokio::time::timeout(REQUEST_TIMEOUT, rx).await {
            Ok(Ok(a)) => a,
            Ok(Err(_)) => Err(RpcError::Closed {
                addr: dst,
                reason: "the peer died".into(),
            }),
            Err(_) => Err(RpcError::Timeout {
                addr: dst,
                after: REQUEST_TIMEOUT,
            }),
        }
    }

    /// Sends `req` from `src` to `dst` and waits for the answer. A dead sender's requests go
    /// nowhere and never end (its tasks are frozen, as a killed process's).
    pub async fn call(
        self: &Arc<Self>,
        src: SocketAddr,
        dst: SocketAddr,
        req: Request,
        payload: Bytes,
    ) -> Answer {
        if self.lock().dead.contains(&src) {
            return futures::future::pending().await;
        }
        let rx = self.enqueue(src, dst, req, payload)?;
        Self::answer(dst, rx).await
    }

    /// The link task to `dst`: delivers its messages in order, at their time, once no
    /// partition holds them, and answers each as the serving loop does (a `Later` answer
    /// holds the link, a `Detached` one does not).
    async fn deliver(self: Arc<Self>, dst: SocketAddr, mut rx: mpsc::UnboundedReceiver<Msg>) {
        while let Some(mut m) = rx.recv().await {
            tokio::time::sleep_until(m.at).await;
            while self.cut(m.src, dst) {
                tokio::time::sleep(HELD_POLL).await;
            }
            let Some(target) = self.lock().endpoints.get(&dst).map(|e| e.target.clone()) else {
                return;
            };
            self.log.delivered(m.src, dst, &m.req);
            let answer = match target {
                Target::Manager(state) => {
                    let now = self.now_std();
                    let (resp, _) = state
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .answer(m.req, now);
                    Some((resp, Bytes::new()))
                }
                Target::Server(service) => {
                    let service = loop {
                        match service.get() {
                            Some(s) => break s.clone(),
                            None => tokio::time::sleep(HELD_POLL).await,
                        }
                    };
                    match service.handle(&Conn::default(), m.req, m.payload) {
                        Reply::Now(resp, payload) => Some((resp, payload)),
                        Reply::Later(fut) => Some(fut.await),
                        Reply::Detached(fut) => {
                            let net = self.clone();
                            let (src, reply) = (m.src, m.reply.take());
                            let mut inner = self.lock();
                            if let Some(ep) = inner.endpoints.get_mut(&dst) {
                                ep.tasks.spawn(async move {
                                    let a = fut.await;
                                    net.step();
                                    net.respond(dst, src, reply, a);
                                });
                            }
                            None
                        }
                    }
                }
            };
            self.step();
            if let Some(a) = answer {
                self.respond(dst, m.src, m.reply, a);
            }
        }
    }

    /// Sends an answer back after its latency, held while a partition lasts; maybe lost.
    fn respond(
        self: &Arc<Self>,
        from: SocketAddr,
        to: SocketAddr,
        reply: Option<oneshot::Sender<Answer>>,
        a: (Response, Bytes),
    ) {
        let Some(reply) = reply else { return };
        let (lat, lost) = {
            let mut inner = self.lock();
            let lat = Self::latency(&mut inner, from, to);
            let lose = inner.faults.lose_answer;
            let lost = inner.rng.chance(lose);
            (lat, lost)
        };
        let net = self.clone();
        let back = async move {
            tokio::time::sleep(lat).await;
            while net.cut(from, to) {
                tokio::time::sleep(HELD_POLL).await;
            }
            if lost {
                net.log.event(format!("answer lost {from} -> {to}"));
                drop(reply);
            } else {
                let _ = reply.send(Ok(a));
            }
        };
        let mut inner = self.lock();
        if let Some(ep) = inner.endpoints.get_mut(&from) {
            ep.tasks.spawn(back);
        }
    }

    fn step(&self) {
        if let Some(f) = self.step.get() {
            f();
        }
    }

    /// Whether `dst` answers (not dead, not cut off from `src`).
    fn reachable(&self, src: SocketAddr, dst: SocketAddr) -> bool {
        self.lock().endpoints.contains_key(&dst) && !self.cut(src, dst)
    }
}

/// A request's kind, for the log.
#[must_use]
pub fn kind(req: &Request) -> String {
    let s = match req {
        Request::Op { epoch, op } => format!("Op@{epoch} {op:?}"),
        Request::Replica { epoch, op } => format!("Replica@{epoch} {op:?}"),
        other => format!("{other:?}"),
    };
    s.chars().take(100).collect()
}

/// A server's end of the network.
pub struct ServerPort {
    pub net: Arc<SimNet>,
    pub me: SocketAddr,
}

impl tessera_server::Net for ServerPort {
    fn call<'a>(&'a self, addr: SocketAddr, req: &'a Request) -> BoxFuture<'a, Answer> {
        Box::pin(self.net.call(self.me, addr, req.clone(), Bytes::new()))
    }
}

/// A client's end of the network.
pub struct ClientPort {
    pub net: Arc<SimNet>,
    pub me: SocketAddr,
    pub manager: SocketAddr,
}

impl tessera_client::sim::Net for ClientPort {
    fn send(
        &self,
        _node: NodeId,
        addr: SocketAddr,
        req: Request,
        payload: Bytes,
    ) -> BoxFuture<'static, tessera_client::Result<BoxFuture<'static, Answer>>> {
        let queued = self.net.enqueue(self.me, addr, req, payload);
        Box::pin(async move {
            let rx = queued.map_err(|e| tessera_client::Error::Unavailable(e.to_string()))?;
            let waiting: BoxFuture<'static, Answer> = Box::pin(SimNet::answer(addr, rx));
            Ok(waiting)
        })
    }

    fn reach(
        &self,
        node: NodeId,
        addr: SocketAddr,
    ) -> BoxFuture<'static, tessera_client::Result<()>> {
        let ok = self.net.reachable(self.me, addr);
        Box::pin(async move {
            if ok {
                Ok(())
            } else {
                Err(tessera_client::Error::Unavailable(format!(
                    "node {node} unreachable"
                )))
            }
        })
    }

    fn manager(&self, req: Request) -> BoxFuture<'static, tessera_client::Result<Response>> {
        let (net, me, manager) = (self.net.clone(), self.me, self.manager);
        Box::pin(async move {
            match net.call(me, manager, req, Bytes::new()).await {
                Ok((resp, _)) => Ok(resp),
                Err(e) => Err(tessera_client::Error::Unavailable(e.to_string())),
            }
        })
    }
}
