//! Deterministic simulation of Tessera's distributed protocol, in the spirit of FoundationDB's
//! and TigerBeetle's: the manager's real state machine, the servers' real handlers, stores,
//! copies and heartbeats, and the client's real router run over an in-memory network
//! ([`net`]) on one thread with a paused clock; a nemesis kills, restarts, partitions, delays,
//! duplicates and slows while clients write and check data, and the invariants ([`check`])
//! are checked after every message. Every choice comes from the seed, so a failing seed
//! replays the same schedule. Run it on a runtime built with `start_paused(true)`, one per
//! seed (see `tests/seeds.rs`).

pub mod check;
pub mod cluster;
pub mod net;
mod rng;

use check::{content, Expect, Model, LEN};
use cluster::Cluster;
use net::{ClientPort, Faults, SimNet};
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;
use tessera_client::sim::SimClient;
use tessera_placement::{meta_partition, placed_ino, stripe_partition, Ino, ROOT_INO};
use tessera_proto::{ClusterConfig, ErrorCode, FileKind, Inode, Op, Request, Response, Timespec};
use tokio::time::Instant;

/// What one run simulates.
#[derive(Debug, Clone)]
pub struct Options {
    pub servers: u32,
    pub partitions: u32,
    pub replication: u8,
    pub clients: u32,
    /// How long clients work and the nemesis strikes (simulated time).
    pub workload: Duration,
    /// Keep every delivery in the log (a replay), not only the events.
    pub verbose: bool,
    /// Whether the nemesis restarts the manager (off by default: a restarted manager can adopt
    /// an older table than it published, docs/SEMANTICS.md).
    pub manager_restarts: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            servers: 4,
            partitions: 16,
            replication: 2,
            clients: 2,
            workload: Duration::from_secs(8),
            verbose: false,
            manager_restarts: false,
        }
    }
}

/// The schedule of a run: its events (and, verbose, every delivery), and a hash of all of it
/// that two runs of one seed must share.
pub struct Log {
    verbose: bool,
    start: Instant,
    lines: Mutex<Vec<String>>,
    hash: Mutex<std::collections::hash_map::DefaultHasher>,
    deliveries: std::sync::atomic::AtomicU64,
}

impl Log {
    fn new(verbose: bool) -> Self {
        Self {
            verbose,
            start: Instant::now(),
            lines: Mutex::default(),
            hash: Mutex::default(),
            deliveries: 0.into(),
        }
    }

    fn stamp(&self) -> String {
        format!("{:>9.3}s", self.start.elapsed().as_secs_f64())
    }

    fn hash(&self, what: &str) {
        let mut h = self.hash.lock().unwrap_or_else(PoisonError::into_inner);
        self.start.elapsed().as_nanos().hash(&mut *h);
        what.hash(&mut *h);
    }

    /// A fault, a start, an end: always kept.
    pub fn event(&self, what: String) {
        self.hash(&what);
        let line = format!("{} {what}", self.stamp());
        lock(&self.lines).push(line);
    }

    /// A table the manager published (verbose only: it is in the deliveries' hash already).
    pub fn table(&self, info: &tessera_proto::TableInfo) {
        if self.verbose {
            let t = &info.table;
            let parts: Vec<String> = (0..t.partitions())
                .map(|p| format!("{p}:{:?}+{:?}", t.replicas(p), t.all_incoming()[p as usize]))
                .collect();
            let line = format!("{} table {} {}", self.stamp(), t.epoch(), parts.join(" "));
            lock(&self.lines).push(line);
        }
    }

    /// A message delivered.
    pub fn delivered(&self, src: SocketAddr, dst: SocketAddr, req: &Request) {
        self.deliveries
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Inodes carry the wall clock's times: only the request's kind goes into the hash.
        let what = net::kind(req);
        let kind: String = what
            .chars()
            .take_while(|c| !matches!(c, ' ' | '{' | '('))
            .collect();
        let op: String = what
            .split(' ')
            .nth(1)
            .unwrap_or("")
            .chars()
            .take_while(|c| c.is_alphanumeric())
            .collect();
        self.hash(&format!("{src}>{dst} {kind} {op}"));
        if self.verbose {
            let line = format!("{}   {src} -> {dst} {what}", self.stamp());
            lock(&self.lines).push(line);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How a run ended.
pub struct Outcome {
    pub seed: u64,
    /// The first invariant broken, or why the run could not finish.
    pub failure: Option<String>,
    /// The schedule's hash: a replay of the seed has the same.
    pub hash: u64,
    pub log: Vec<String>,
    pub deliveries: u64,
    /// Writes acknowledged, reads checked.
    pub acked: u64,
    pub reads: u64,
}

struct Run {
    opts: Options,
    cluster: Arc<Cluster>,
    model: Mutex<Model>,
    failure: OnceLock<String>,
    failed: tokio::sync::Notify,
    acked: std::sync::atomic::AtomicU64,
    reads: std::sync::atomic::AtomicU64,
    /// The names each client made and not removed yet.
    names: Mutex<BTreeMap<u32, Vec<Vec<u8>>>>,
}

impl Run {
    fn fail(&self, why: String) {
        if self.failure.set(why.clone()).is_ok() {
            self.cluster.net.log.event(format!("FAILED: {why}"));
            self.failed.notify_waiters();
        }
    }

    fn check(&self) {
        if self.failure.get().is_some() {
            return;
        }
        let r = lock(&self.model).check(&self.cluster);
        if let Err(e) = r {
            self.fail(e);
        }
    }

    fn rand(&self, lo: u64, hi: u64) -> u64 {
        self.cluster.net.with_rng(|r| r.range(lo, hi))
    }

    fn client(&self, id: u32, info: tessera_proto::TableInfo) -> SimClient<ClientPort> {
        let port = ClientPort {
            net: self.cluster.net.clone(),
            me: SocketAddr::from((Ipv4Addr::new(10, 9, 0, id as u8 + 1), 9000)),
            manager: self.cluster.manager_addr,
        };
        SimClient::new(
            Arc::new(port),
            self.cluster.manager_addr,
            info,
            Duration::from_secs(30),
        )
    }

    /// The manager's table, once it has one.
    async fn first_table(&self) -> Result<tessera_proto::TableInfo, String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Some(t) = self.cluster.table() {
                return Ok(t);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err("no partition table after 60 s".into())
    }
}

/// Runs seed `seed`. Call it on a fresh current-thread runtime with a paused clock.
pub async fn run(seed: u64, opts: Options) -> Outcome {
    let log = Arc::new(Log::new(opts.verbose));
    let net = SimNet::new(seed, log.clone());
    let config = ClusterConfig::new(opts.partitions, 1 << 20, opts.replication);
    let cluster = Cluster::new(net.clone(), config, opts.servers);
    let run = Arc::new(Run {
        opts: opts.clone(),
        cluster: cluster.clone(),
        model: Mutex::default(),
        failure: OnceLock::new(),
        failed: tokio::sync::Notify::new(),
        acked: 0.into(),
        reads: 0.into(),
        names: Mutex::default(),
    });
    let checker = run.clone();
    net.set_step(Box::new(move || checker.check()));
    log.event(format!("seed {seed}: {opts:?}"));
    let failed = run.failed.notified();
    tokio::pin!(failed);
    failed.as_mut().enable();
    let result = tokio::select! {
        biased;
        () = failed => Ok(()),
        r = scenario(run.clone()) => r,
    };
    if let Err(e) = result {
        run.fail(e);
    }
    cluster.stop();
    let hash = lock(&log.hash).finish();
    let lines = lock(&log.lines).clone();
    Outcome {
        seed,
        failure: run.failure.get().cloned(),
        hash,
        log: lines,
        deliveries: log.deliveries.load(std::sync::atomic::Ordering::Relaxed),
        acked: run.acked.load(std::sync::atomic::Ordering::Relaxed),
        reads: run.reads.load(std::sync::atomic::Ordering::Relaxed),
    }
}

/// Start, work under faults, let the dust settle, check.
async fn scenario(run: Arc<Run>) -> Result<(), String> {
    let c = &run.cluster;
    c.start_manager();
    for _ in 0..run.opts.servers {
        c.start_server(Duration::ZERO);
    }
    let info = run.first_table().await?;
    let boot = run.client(0, info.clone());
    let root = Inode::new(ROOT_INO, FileKind::Dir, 0o755, 0, 0, ROOT_INO, Vec::new());
    match boot.meta(ROOT_INO, Op::InodeCreate { inode: root }).await {
        Ok(_) => {}
        Err(e) if e.is(&ErrorCode::Exists) => {}
        Err(e) => return Err(format!("the root directory could not be made: {e}")),
    }
    c.net.log.event("root directory made".into());
    let until = Instant::now() + run.opts.workload;
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(nemesis(run.clone(), until));
    for id in 1..=run.opts.clients {
        let client = run.client(id, info.clone());
        tasks.spawn(work(run.clone(), id, client, until));
    }
    // Clients finish their last operation; one stuck past any failover is a failure.
    let patience = until + Duration::from_secs(180);
    while let Some(done) = tokio::time::timeout_at(patience, tasks.join_next())
        .await
        .map_err(|_| "a client operation did not finish within 180 s".to_string())?
    {
        done.map_err(|e| format!("a task failed: {e}"))??;
    }
    settle(&run).await?;
    lock(&run.model).check(c)?;
    // Every acknowledged write reads back through a fresh client.
    let info = run.first_table().await?;
    let reader = run.client(run.opts.clients + 1, info.clone());
    let stripes = lock(&run.model).stripes.clone();
    let lost = |file, stripe| {
        let p = stripe_partition(file, stripe, info.config.partitions);
        info.table.replicas(p).is_empty()
    };
    for ((file, stripe), want) in stripes {
        if lost(file, stripe) {
            continue;
        }
        let data = reader
            .read(file, stripe, 0, LEN)
            .await
            .map_err(|e| format!("final read of file {file} stripe {stripe}: {e}"))?;
        if !want.allows(&data) {
            return Err(format!(
                "final read of file {file} stripe {stripe} gave {data:?}, expected {want:?}"
            ));
        }
    }
    c.net.log.event("all checks passed".into());
    Ok(())
}

/// Heals everything, brings the cluster back to its size, and waits until every partition
/// has its replicas on live servers that all hold the manager's table.
async fn settle(run: &Run) -> Result<(), String> {
    let c = &run.cluster;
    c.net.set_faults(Faults::default());
    c.net.log.event("faults healed".into());
    if !c.manager_up() {
        c.start_manager();
    }
    while c.servers().len() < run.opts.servers as usize {
        c.start_server(Duration::ZERO);
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match check::settled(c, usize::from(run.opts.replication)) {
            Ok(()) => {
                c.net.log.event("settled".into());
                return Ok(());
            }
            Err(e) if Instant::now() > deadline => {
                return Err(format!("the cluster did not settle within 120 s: {e}"))
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// A client's work until `until`: writes, reads checked against the model, names made and
/// removed in the root directory. Each stripe is written by one client only, one write at a
/// time, so the model knows what it may hold.
async fn work(
    run: Arc<Run>,
    id: u32,
    client: SimClient<ClientPort>,
    until: Instant,
) -> Result<(), String> {
    const FILES: u64 = 3;
    const STRIPES: u64 = 3;
    let parts = run.opts.partitions;
    let mut version = 0u64;
    while Instant::now() < until {
        let file: Ino = u64::from(id) * 1000 + run.rand(0, FILES);
        let stripe = run.rand(0, STRIPES);
        let key = (file, stripe);
        match run.rand(0, 10) {
            0..=4 => {
                version += 1;
                let v = (u64::from(id) << 32) | version;
                lock(&run.model)
                    .stripes
                    .entry(key)
                    .or_default()
                    .maybe
                    .insert(v);
                let r = client.write(file, stripe, 0, content(v)).await;
                if r.is_ok() {
                    run.acked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let mut m = lock(&run.model);
                    let e = m.stripes.entry(key).or_default();
                    *e = Expect {
                        acked: Some(v),
                        maybe: std::collections::BTreeSet::new(),
                    };
                }
            }
            5..=7 => {
                let want = lock(&run.model).stripes.get(&key).cloned();
                if let Ok(data) = client.read(file, stripe, 0, LEN).await {
                    run.reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let want = want.unwrap_or_default();
                    if !want.allows(&data) {
                        return Err(format!(
                            "client {id} read file {file} stripe {stripe}: {data:?}, expected \
                             {want:?}"
                        ));
                    }
                }
            }
            8 => {
                let k = run.rand(0, 1 << 20);
                let name = format!("c{id}-{k}").into_bytes();
                let p = meta_partition(ROOT_INO, parts);
                let ino = placed_ino(p, run.rand(0, u64::MAX), parts);
                let inode = Inode::new(ino, FileKind::File, 0o644, 0, 0, ROOT_INO, Vec::new());
                let op = Op::DirCreate {
                    dir: ROOT_INO,
                    name: name.clone(),
                    inode,
                    mtime: Timespec::default(),
                    holder: 0,
                };
                if let Ok(Response::Inode(_)) = client.meta(ROOT_INO, op).await {
                    lock(&run.names).entry(id).or_default().push(name);
                }
            }
            _ => {
                let name = lock(&run.names).get_mut(&id).and_then(Vec::pop);
                if let Some(name) = name {
                    let op = Op::DirUnlink {
                        dir: ROOT_INO,
                        name,
                        mtime: Timespec::default(),
                    };
                    let _ = client.meta(ROOT_INO, op).await;
                }
            }
        }
        lock(&run.model).client_epoch(id, client.epoch())?;
        tokio::time::sleep(Duration::from_millis(run.rand(1, 40))).await;
    }
    Ok(())
}

/// Strikes now and then until `until`: kills and starts servers, partitions the network,
/// raises latency, slows a node, duplicates requests, loses answers, restarts the manager.
async fn nemesis(run: Arc<Run>, until: Instant) -> Result<(), String> {
    let c = &run.cluster;
    let r = usize::from(run.opts.replication);
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(run.rand(200, 1500))).await;
        let servers: Vec<SocketAddr> = c.servers().iter().map(|(a, _)| *a).collect();
        let lasting = Duration::from_millis(run.rand(300, 4000));
        let mut f = c.net.faults();
        let what = run.rand(0, 8);
        match what {
            0 if servers.len() > r => {
                let victim = servers[run.rand(0, servers.len() as u64) as usize];
                c.kill_server(victim);
            }
            1 if servers.len() <= run.opts.servers as usize => {
                let slow = if run.rand(0, 3) == 0 {
                    Duration::from_millis(run.rand(5, 200))
                } else {
                    Duration::ZERO
                };
                c.start_server(slow);
            }
            2 => {
                let mut all = servers.clone();
                all.push(c.manager_addr);
                f.sides = all
                    .into_iter()
                    .filter(|_| run.rand(0, 3) == 0)
                    .map(|a| (a, 1))
                    .collect();
                let cut: Vec<String> = f.sides.keys().map(ToString::to_string).collect();
                c.net
                    .log
                    .event(format!("partition [{}] for {lasting:?}", cut.join(" ")));
            }
            3 => {
                f.spike_ms = run.rand(10, 300);
                c.net.log.event(format!(
                    "latency spike to {} ms for {lasting:?}",
                    f.spike_ms
                ));
            }
            4 if !servers.is_empty() => {
                let node = servers[run.rand(0, servers.len() as u64) as usize];
                f.slow
                    .insert(node, Duration::from_millis(run.rand(50, 800)));
                c.net.log.event(format!("{node} slow for {lasting:?}"));
            }
            5 => {
                f.duplicate = 100;
                c.net
                    .log
                    .event(format!("requests duplicated for {lasting:?}"));
            }
            6 => {
                f.lose_answer = 30;
                c.net.log.event(format!("answers lost for {lasting:?}"));
            }
            7 if run.opts.manager_restarts => {
                c.kill_manager();
                tokio::time::sleep(Duration::from_millis(run.rand(0, 3000))).await;
                c.start_manager();
                continue;
            }
            _ => continue,
        }
        if (2..=6).contains(&what) {
            c.net.set_faults(f);
            let (net, log) = (c.net.clone(), c.net.log.clone());
            // Each fault heals by itself; heal only what it set.
            tokio::spawn(async move {
                tokio::time::sleep(lasting).await;
                let mut now = net.faults();
                match what {
                    2 => now.sides.clear(),
                    3 => now.spike_ms = 0,
                    4 => now.slow.clear(),
                    5 => now.duplicate = 0,
                    _ => now.lose_answer = 0,
                }
                net.set_faults(now);
                log.event(format!("fault {what} healed"));
            });
        }
    }
    Ok(())
}
