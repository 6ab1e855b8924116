//! The manager's state machine: membership, failure detection and the partition table. Pure:
//! the caller supplies the clock, so it is tested without waiting.
//!
//! The first table is built when the expected servers have joined. From then on every change
//! of membership re-plans it with [`plan`]: a dead server vanishes from the table at once (its
//! copies are rebuilt as incoming copies on the survivors), a new one receives its
//! capacity-proportional share as incoming copies. Servers sync incoming copies and report
//! [`State::sync_done`]; [`complete`] then promotes them, one epoch per completion. `goal` is
//! the assignment the table converges to.

use crate::history::{History, Sample};
use crate::policy::{Decision, NodeLoad, Policy};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tessera_placement::{
    assign, complete, failure_domain, plan, settle, Epoch, NodeId, NodeWeight, PartitionId,
    PartitionTable,
};
use tessera_proto::{
    ClusterConfig, ClusterStatus, ErrorCode, NodeAddr, NodeStats, NodeStatus, Request, Response,
    TableInfo,
};
use tracing::{info, warn};

mod recovery;

#[derive(Debug, Clone)]
pub struct Member {
    pub id: NodeId,
    pub addr: SocketAddr,
    pub capacity: u64,
    pub label: Option<String>,
    pub last_seen: Instant,
    pub stats: NodeStats,
    /// Declared dead: final. Its copies may have missed writes since, so a restarted server
    /// registers again under a new id and receives its share afresh.
    pub dead: bool,
    /// Being drained (scale-in): it serves what it holds while its copies move to the others;
    /// once it holds nothing it is retired.
    pub draining: bool,
    pub joined: Instant,
}

impl Member {
    /// A server that joins now, alive.
    fn new(
        id: NodeId,
        addr: SocketAddr,
        capacity: u64,
        label: Option<String>,
        now: Instant,
    ) -> Self {
        Self {
            id,
            addr,
            capacity,
            label,
            last_seen: now,
            stats: NodeStats {
                capacity,
                ..NodeStats::default()
            },
            dead: false,
            draining: false,
            joined: now,
        }
    }
}

/// What a heartbeat learns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Beat {
    /// The current epoch (the server fetches a newer table).
    Epoch(Option<Epoch>),
    /// The server was drained and retired: it may exit.
    Retired,
}

#[derive(Debug)]
pub struct State {
    pub config: ClusterConfig,
    pub expect: u32,
    /// Silence after which a server is declared dead.
    pub heartbeat_timeout: Duration,
    members: Vec<Member>,
    next_id: NodeId,
    table: Option<TableInfo>,
    /// Where every partition's copies should end up; indexed by partition.
    goal: Vec<Vec<NodeId>>,
    /// When deaths were last checked (every tick, so at most a fraction of the timeout ago
    /// while the manager runs).
    last_check: Option<Instant>,
    /// Servers drained and retired (told so at their next heartbeat).
    retired: BTreeSet<NodeId>,
    /// Retired servers not yet handed to the provisioner for release.
    released: Vec<(NodeId, SocketAddr)>,
    started: Instant,
    history: History,
    policy: Option<Policy>,
    /// Servers the policy asked for: how many members it expects, until when.
    awaiting: Option<(usize, Instant)>,
    /// Recovering a running cluster from the tables its servers hold (this manager was
    /// restarted): until then the table is not changed, so no epoch is published twice.
    recovering_until: Option<Instant>,
    /// The newest epoch any server reported (in a claim or a heartbeat), even one
    /// that is not this manager's: the next table is numbered above it, so no epoch is
    /// published twice with other contents after a restart.
    seen: Epoch,
}

impl State {
    #[must_use]
    pub fn new(config: ClusterConfig, expect: u32, heartbeat_timeout: Duration) -> Self {
        Self {
            config,
            expect,
            heartbeat_timeout,
            members: Vec::new(),
            next_id: 1,
            table: None,
            goal: Vec::new(),
            last_check: None,
            retired: BTreeSet::new(),
            released: Vec::new(),
            started: Instant::now(),
            history: History::default(),
            policy: None,
            awaiting: None,
            recovering_until: None,
            seen: 0,
        }
    }

    fn alive(&self, m: &Member, now: Instant) -> bool {
        !m.dead && now.saturating_duration_since(m.last_seen) <= self.heartbeat_timeout
    }

    fn live_weights(&self) -> Vec<NodeWeight> {
        self.members
            .iter()
            .filter(|m| !m.dead)
            .map(|m| NodeWeight {
                node: m.id,
                capacity: m.capacity,
                // Servers labelled alike (a rack, a host) are one failure domain.
                domain: m.label.as_deref().map(failure_domain),
            })
            .collect()
    }

    /// Periodic failure detection: declares silent servers dead and, if the table used any of
    /// them, publishes a re-planned table. Returns the epoch published, if any.
    pub fn tick(&mut self, now: Instant) -> Option<Epoch> {
        if self.recovering_until.is_some_and(|until| now >= until) {
            return self.recovered(now);
        }
        if self.reap(now) {
            self.replan("servers died")
        } else {
            None
        }
    }

    /// Marks members silent for longer than the timeout dead. Returns whether one of them is
    /// in the table (so the table must change).
    fn reap(&mut self, now: Instant) -> bool {
        let in_table = self
            .table
            .as_ref()
            .map(|t| t.table.nodes())
            .unwrap_or_default();
        let timeout = self.heartbeat_timeout;
        let last = self.last_check.replace(now);
        if let Some(gap) = last.map(|l| now.saturating_duration_since(l)) {
            if gap > timeout {
                // The manager itself was not running (stopped, starved): heartbeats sent
                // meanwhile are still queued, so this silence proves nothing. Declaring every
                // server dead would lose the cluster; start a fresh grace period instead.
                warn!(
                    gap_ms = gap.as_millis() as u64,
                    "the manager was not running for longer than the heartbeat timeout: no \
                     server is declared dead for it"
                );
                for m in self.members.iter_mut().filter(|m| !m.dead) {
                    m.last_seen = m.last_seen.max(now);
                }
                return false;
            }
        }
        let mut replan = false;
        for m in &mut self.members {
            let silent = now.saturating_duration_since(m.last_seen);
            if m.dead || silent <= timeout {
                continue;
            }
            m.dead = true;
            let held = in_table.contains(&m.id);
            warn!(
                node = m.id,
                addr = %m.addr,
                silent_ms = silent.as_millis() as u64,
                in_table = held,
                "server missed its heartbeats: declared dead"
            );
            replan |= held;
        }
        replan
    }

    /// Re-plans the table over the live members and publishes it (not while recovering: the
    /// end of the recovery re-plans once for everything that changed meanwhile).
    fn replan(&mut self, why: &str) -> Option<Epoch> {
        if self.recovering_until.is_some() {
            return None;
        }
        let info = self.table.as_ref()?;
        let alive = self.live_weights();
        let draining: Vec<NodeId> = self
            .members
            .iter()
            .filter(|m| m.draining && !m.dead)
            .map(|m| m.id)
            .collect();
        let (goal, replicas, incoming) =
            match plan(&info.table, &alive, &draining, self.config.replication) {
                Ok(p) => (p.goal, p.replicas, p.incoming),
                Err(e) => {
                    // Only when no server is left: drop the dead ones, nothing to rebuild onto.
                    warn!("cannot re-plan the partitions ({e}); keeping the surviving copies only");
                    let live: BTreeSet<NodeId> = alive.iter().map(|w| w.node).collect();
                    let keep = |l: &Vec<NodeId>| -> Vec<NodeId> {
                        l.iter().copied().filter(|n| live.contains(n)).collect()
                    };
                    let replicas: Vec<Vec<NodeId>> = info.table.all().iter().map(keep).collect();
                    let incoming: Vec<Vec<NodeId>> = info
                        .table
                        .all_incoming()
                        .iter()
                        .zip(&replicas)
                        .map(|(i, r)| if r.is_empty() { Vec::new() } else { keep(i) })
                        .collect();
                    let goal = replicas
                        .iter()
                        .zip(&incoming)
                        .map(|(r, i)| r.iter().chain(i).copied().collect())
                        .collect();
                    (goal, replicas, incoming)
                }
            };
        let epoch = self.publish(replicas, incoming).ok()?;
        self.goal = goal;
        self.retire_drained();
        if let Some(t) = self.table.as_ref().map(|t| &t.table) {
            info!(
                epoch,
                servers = alive.len(),
                degraded = t.degraded(self.config.replication).count(),
                lost = t.lost().count(),
                incoming = t.copies_incoming(),
                "{why}: partition table re-planned"
            );
        }
        Some(epoch)
    }

    /// Installs the next table with these lists and the live members' addresses.
    fn publish(
        &mut self,
        replicas: Vec<Vec<NodeId>>,
        incoming: Vec<Vec<NodeId>>,
    ) -> Result<Epoch, ErrorCode> {
        let nodes = self.live_addrs();
        let seen = self.seen;
        let info = self
            .table
            .as_mut()
            .ok_or_else(|| ErrorCode::Internal("no partition table yet".into()))?;
        // A server holds a table this manager does not know (a restart adopted an older one):
        // go past it, with every partition changed.
        let base = if seen > info.table.epoch() {
            info.table.renumbered(seen + 1)
        } else {
            info.table.clone()
        };
        // A planner bug must not take the manager down: keep the old table and say so.
        let next = base.next(replicas, incoming).map_err(|e| {
            warn!("refusing an inconsistent next table: {e}");
            ErrorCode::Internal(format!("inconsistent next table: {e}"))
        })?;
        info.table = next;
        info.nodes = nodes;
        Ok(info.table.epoch())
    }

    fn live_addrs(&self) -> Vec<NodeAddr> {
        self.members
            .iter()
            .filter(|m| !m.dead)
            .map(|m| NodeAddr {
                id: m.id,
                addr: m.addr,
            })
            .collect()
    }

    /// A server joins. Returns its id and whether this join built the first table. A server
    /// joining once the table exists (a new one, or a restarted one under a new id) gets its
    /// share of the partitions as incoming copies.
    pub fn register(
        &mut self,
        addr: SocketAddr,
        capacity: u64,
        label: Option<String>,
        now: Instant,
    ) -> Result<(NodeId, bool), ErrorCode> {
        if capacity == 0 {
            return Err(ErrorCode::Invalid("a server must offer some memory".into()));
        }
        if let Some(m) = self
            .members
            .iter()
            .find(|m| m.addr == addr && self.alive(m, now))
        {
            return Err(ErrorCode::Invalid(format!(
                "{addr} is already registered as node {}",
                m.id
            )));
        }
        // Whoever timed out goes now, so the one re-plan below accounts for it.
        self.reap(now);
        let id = self.next_id;
        self.next_id += 1;
        self.members
            .push(Member::new(id, addr, capacity, label, now));
        if self.table.is_some() {
            info!(node = id, %addr, "server joined a running cluster: it receives its share");
            self.replan("a server joined");
            return Ok((id, false));
        }
        let weights = self.live_weights();
        if weights.len() < self.expect as usize {
            return Ok((id, false));
        }
        let replicas = assign(
            None,
            &weights,
            self.config.partitions,
            self.config.replication,
        )
        .map_err(|e| ErrorCode::Internal(format!("cannot place partitions: {e}")))?;
        let table = PartitionTable::new(1, replicas.clone())
            .map_err(|e| ErrorCode::Internal(e.to_string()))?;
        self.goal = replicas;
        self.table = Some(TableInfo {
            config: self.config,
            table,
            nodes: self.live_addrs(),
        });
        info!(
            servers = weights.len(),
            "all expected servers joined: partition table epoch 1 built"
        );
        Ok((id, true))
    }

    /// A server's heartbeat. Returns the current epoch (the server fetches a newer table), or
    /// that it was retired. A server already declared dead is answered `NotFound`: it must
    /// restart to rejoin.
    pub fn heartbeat(
        &mut self,
        node: NodeId,
        addr: SocketAddr,
        stats: NodeStats,
        now: Instant,
    ) -> Result<Beat, ErrorCode> {
        self.seen = self.seen.max(stats.epoch);
        if self.retired.contains(&node) {
            return Ok(Beat::Retired);
        }
        // Late is dead, whether or not the periodic tick has noticed yet.
        if self.reap(now) {
            self.replan("servers died");
        }
        let m = self
            .members
            .iter_mut()
            .find(|m| m.id == node && m.addr == addr && !m.dead)
            .ok_or(ErrorCode::NotFound)?;
        m.last_seen = now;
        m.stats = stats;
        Ok(Beat::Epoch(self.table.as_ref().map(|t| t.table.epoch())))
    }

    /// The answer to a request from a server or a client, and whether a registration built the
    /// first table (the root directory is to be made). `Scale` needs the provisioner: the
    /// caller answers it.
    pub fn answer(&mut self, req: Request, now: Instant) -> (Response, bool) {
        let resp = match req {
            Request::Register {
                addr,
                capacity,
                label,
            } => match self.register(addr, capacity, label, now) {
                Ok((node, built)) => {
                    let config = self.config;
                    return (Response::Registered { node, config }, built);
                }
                Err(e) => Response::Error(e),
            },
            Request::Rejoin {
                node,
                addr,
                capacity,
                label,
                table,
            } => match self.rejoin(node, addr, capacity, label, table, now) {
                Ok(node) => Response::Registered {
                    node,
                    config: self.config,
                },
                Err(e) => Response::Error(e),
            },
            Request::Heartbeat { node, addr, stats } => {
                match self.heartbeat(node, addr, stats, now) {
                    Ok(Beat::Epoch(epoch)) => Response::HeartbeatAck { epoch },
                    Ok(Beat::Retired) => Response::Retired,
                    Err(e) => Response::Error(e),
                }
            }
            Request::GetTable => match self.table_info() {
                Ok(t) => Response::Table(t.clone()),
                Err(e) => Response::Error(e),
            },
            Request::SyncDone {
                node,
                partition,
                epoch,
            } => match self.sync_done(node, partition, epoch, now) {
                // Published before answering: the server fetches the new table next.
                Ok(_) => Response::Ok,
                Err(e) => {
                    warn!(node, partition, epoch, "sync completion refused: {e}");
                    Response::Error(e)
                }
            },
            Request::GetStatus => Response::Status(self.status(now)),
            Request::Scale { .. } => Response::Error(ErrorCode::Internal(
                "scaling is the provisioner's, not the state's".into(),
            )),
            Request::Op { .. }
            | Request::Replica { .. }
            | Request::Subscribe
            | Request::Attach { .. } => Response::Error(ErrorCode::Invalid(
                "the manager serves no file operations".into(),
            )),
        };
        (resp, false)
    }

    /// Starts draining `nodes` (scale-in): their partitions get copies on the other servers,
    /// and each is retired once it holds nothing. Returns the epoch published.
    pub fn drain(&mut self, nodes: &[NodeId], now: Instant) -> Result<Epoch, ErrorCode> {
        if self.table.is_none() {
            return Err(ErrorCode::NotReady("no partition table yet".into()));
        }
        if self.recovering_until.is_some() {
            return Err(ErrorCode::NotReady(
                "the manager is recovering the cluster; try again shortly".into(),
            ));
        }
        for &n in nodes {
            match self.members.iter().find(|m| m.id == n) {
                None if self.retired.contains(&n) => {
                    return Err(ErrorCode::Invalid(format!("node {n} is already retired")))
                }
                None => return Err(ErrorCode::Invalid(format!("no node {n} in this cluster"))),
                Some(m) if !self.alive(m, now) => {
                    return Err(ErrorCode::Invalid(format!("node {n} is not alive")))
                }
                Some(_) => {}
            }
        }
        let staying = self
            .members
            .iter()
            .filter(|m| self.alive(m, now) && !m.draining && !nodes.contains(&m.id))
            .count();
        if staying < usize::from(self.config.replication).max(1) {
            return Err(ErrorCode::Invalid(format!(
                "removing {} server(s) would leave {staying}, fewer than the replication factor {}",
                nodes.len(),
                self.config.replication
            )));
        }
        for m in self.members.iter_mut().filter(|m| nodes.contains(&m.id)) {
            m.draining = true;
        }
        info!(?nodes, "draining servers");
        self.replan("servers draining")
            .ok_or_else(|| ErrorCode::Internal("could not re-plan the partitions".into()))
    }

    /// Retires draining servers that no longer appear in the table.
    fn retire_drained(&mut self) {
        let Some(in_table) = self.table.as_ref().map(|t| t.table.nodes()) else {
            return;
        };
        let (done, keep): (Vec<Member>, Vec<Member>) = std::mem::take(&mut self.members)
            .into_iter()
            .partition(|m| m.draining && !m.dead && !in_table.contains(&m.id));
        self.members = keep;
        for m in done {
            info!(node = m.id, addr = %m.addr, "server drained: retired");
            self.retired.insert(m.id);
            self.released.push((m.id, m.addr));
        }
        if let Some(info) = self.table.as_mut() {
            let members = &self.members;
            info.nodes.retain(|n| members.iter().any(|m| m.id == n.id));
        }
    }

    /// Addresses of the current members.
    #[must_use]
    pub fn member_addrs(&self) -> Vec<SocketAddr> {
        self.members.iter().map(|m| m.addr).collect()
    }

    /// Servers retired since the last call, for the provisioner to release.
    pub fn take_released(&mut self) -> Vec<(NodeId, SocketAddr)> {
        std::mem::take(&mut self.released)
    }

    /// Live servers that are not draining, with their capacity and use (for the policy).
    pub fn serving(&self, now: Instant) -> impl Iterator<Item = &Member> {
        self.members
            .iter()
            .filter(move |m| self.alive(m, now) && !m.draining)
    }

    /// `node` finished receiving `partition`: it becomes a complete replica (and copies the
    /// goal no longer wants are dropped once the goal's copies are complete). Returns the
    /// epoch published.
    pub fn sync_done(
        &mut self,
        node: NodeId,
        partition: PartitionId,
        epoch: Epoch,
        now: Instant,
    ) -> Result<Epoch, ErrorCode> {
        if self.recovering_until.is_some() {
            // A newer table may yet be claimed: publishing now could reuse its epoch.
            return Err(ErrorCode::NotReady(
                "the manager is recovering the cluster; report the copy again".into(),
            ));
        }
        // A sender that has just been declared dead must not be promoted.
        if self.reap(now) {
            self.replan("servers died");
        }
        let Some(info) = self.table.as_ref() else {
            return Err(ErrorCode::Invalid(
                "no partition table yet: nothing is being synced".into(),
            ));
        };
        let t = &info.table;
        if partition >= t.partitions() {
            return Err(ErrorCode::Invalid(format!(
                "partition {partition} does not exist (the cluster has {})",
                t.partitions()
            )));
        }
        if epoch > t.epoch() {
            return Err(ErrorCode::Invalid(format!(
                "sync reported at epoch {epoch}, but the table is at epoch {}",
                t.epoch()
            )));
        }
        if !t.receives(node, partition) {
            return Err(ErrorCode::Invalid(format!(
                "node {node} is not receiving partition {partition} at epoch {}: the table \
                 moved on and the copy is no longer wanted",
                t.epoch()
            )));
        }
        let (rep, inc) =
            complete(t, partition, node).map_err(|e| ErrorCode::Invalid(e.to_string()))?;
        let mut replicas = t.all().to_vec();
        let mut incoming = t.all_incoming().to_vec();
        let p = partition as usize;
        replicas[p] = rep;
        incoming[p] = inc;
        // The last copy of the reconfiguration: the copies it replaced go, all at once.
        let settled = settle(&self.goal, &mut replicas, &incoming);
        let epoch = self.publish(replicas, incoming)?;
        info!(node, partition, epoch, "copy synced: now a replica");
        if settled {
            info!(epoch, "reconfiguration complete: replaced copies dropped");
        }
        self.retire_drained();
        Ok(epoch)
    }

    #[must_use]
    pub fn table(&self) -> Option<&TableInfo> {
        self.table.as_ref()
    }

    /// Where every partition's copies should end up (empty before the first table).
    #[must_use]
    pub fn goal(&self) -> &[Vec<NodeId>] {
        &self.goal
    }

    /// The table to hand out, or why there is none: none while recovering, as the one
    /// adopted so far may be older than one a server still holds.
    pub fn table_info(&self) -> Result<&TableInfo, ErrorCode> {
        if self.recovering_until.is_some() {
            return Err(ErrorCode::NotReady(
                "the manager is recovering the cluster from its servers' tables".into(),
            ));
        }
        self.table.as_ref().ok_or_else(|| {
            ErrorCode::NotReady(format!(
                "waiting for servers: {} of {} joined",
                self.members.iter().filter(|m| !m.dead).count(),
                self.expect
            ))
        })
    }

    #[must_use]
    pub fn status(&self, now: Instant) -> ClusterStatus {
        let table = self.table.as_ref().map(|t| &t.table);
        let load = table.map(PartitionTable::load).unwrap_or_default();
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        ClusterStatus {
            config: self.config,
            epoch: table.map(PartitionTable::epoch),
            expected_servers: self.expect,
            nodes: self
                .members
                .iter()
                .map(|m| NodeStatus {
                    id: m.id,
                    addr: m.addr,
                    label: m.label.clone(),
                    alive: self.alive(m, now),
                    draining: m.draining,
                    since_heartbeat_ms: now.saturating_duration_since(m.last_seen).as_millis()
                        as u64,
                    partitions: count(load.get(&m.id).copied().unwrap_or(0)),
                    stats: m.stats,
                })
                .collect(),
            degraded: count(table.map_or(0, |t| t.degraded(self.config.replication).count())),
            lost: count(table.map_or(0, |t| t.lost().count())),
            incoming: count(table.map_or(0, PartitionTable::copies_incoming)),
        }
    }

    /// Memory allocated and used over time, sampled by [`State::elastic`].
    #[must_use]
    pub fn history(&self) -> &History {
        &self.history
    }

    /// Turns on the elastic policy.
    pub fn set_policy(&mut self, policy: Policy) {
        self.policy = Some(policy);
    }

    /// Samples memory use into the history and, with a policy, decides whether to grow or
    /// shrink (the caller provisions or drains). No decision while copies move, servers drain,
    /// servers asked for have not joined yet, or some server's memory use predates the table
    /// (the copies a finished reconfiguration replaced would count twice).
    pub fn elastic(&mut self, now: Instant) -> Decision {
        let live: Vec<&Member> = self.members.iter().filter(|m| self.alive(m, now)).collect();
        // Once the servers asked for joined, a later scale-in must not look like waiting.
        if self
            .awaiting
            .is_some_and(|(want, until)| live.len() >= want || now >= until)
        {
            self.awaiting = None;
        }
        self.history.record(Sample {
            t_ms: now.saturating_duration_since(self.started).as_millis() as u64,
            nodes: u32::try_from(live.len()).unwrap_or(u32::MAX),
            allocated: live.iter().map(|m| m.capacity).sum(),
            used: live.iter().map(|m| m.stats.used).sum(),
        });
        let Some(policy) = self.policy.as_mut() else {
            return Decision::None;
        };
        let Some(epoch) = self.table.as_ref().map(|t| t.table.epoch()) else {
            return Decision::None;
        };
        let loads: Vec<NodeLoad> = live
            .iter()
            .map(|m| NodeLoad {
                node: m.id,
                capacity: m.capacity,
                used: m.stats.used,
                draining: m.draining,
                removable: true,
                joined_at: m.joined,
            })
            .collect();
        let waiting = self.awaiting.is_some();
        let stale = live.iter().any(|m| m.stats.epoch < epoch);
        let moving = self
            .table
            .as_ref()
            .is_some_and(|t| t.table.copies_incoming() > 0);
        let draining = live.iter().any(|m| m.draining);
        let d = policy.decide(now, &loads, waiting || moving || draining || stale);
        match &d {
            Decision::Add(n) => {
                self.awaiting = Some((live.len() + *n as usize, now + PROVISION_PATIENCE));
                info!(usage = ?Policy::usage(&loads), "elastic policy: adding {n} server(s)");
            }
            Decision::Remove(ids) => {
                info!(usage = ?Policy::usage(&loads), ?ids, "elastic policy: removing servers");
            }
            Decision::None => {}
        }
        d
    }
}

/// How long the policy waits for servers it asked for before it may ask again.
const PROVISION_PATIENCE: Duration = Duration::from_secs(60);

#[cfg(test)]
mod tests {
    use super::recovery::GENERATION;
    use super::*;

    fn cfg() -> ClusterConfig {
        cfg_r(1)
    }
    fn cfg_r(replication: u8) -> ClusterConfig {
        ClusterConfig::new(64, 1 << 20, replication)
    }
    fn addr(i: u8) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, i], 7000))
    }
    const SEC: Duration = Duration::from_secs(1);

    /// A cluster of `n` equal servers (ids 1..=n) with a table, heartbeat timeout 2 s.
    fn cluster(n: u8, r: u8, t0: Instant) -> State {
        let mut s = State::new(cfg_r(r), u32::from(n), 2 * SEC);
        for i in 0..n {
            s.register(addr(i + 2), 1 << 30, None, t0).unwrap();
        }
        assert_eq!(s.table().unwrap().table.epoch(), 1);
        s
    }

    fn beat(s: &mut State, nodes: impl IntoIterator<Item = NodeId>, now: Instant) {
        for n in nodes {
            s.heartbeat(n, addr(n as u8 + 1), NodeStats::default(), now)
                .unwrap();
        }
    }

    fn table(s: &State) -> &PartitionTable {
        &s.table().unwrap().table
    }

    /// Reports every incoming copy synced, one at a time, as servers would.
    fn sync_all(s: &mut State, now: Instant) {
        while let Some((p, node)) =
            (0..table(s).partitions()).find_map(|p| table(s).incoming(p).first().map(|&n| (p, n)))
        {
            let e = table(s).epoch();
            assert_eq!(s.sync_done(node, p, e, now), Ok(e + 1));
        }
    }

    /// An elastic policy on `s`: out above 70 %, in below 30 %, one node at a time, no cooldown.
    fn elastic(s: &mut State) {
        use crate::policy::{PolicyConfig, Step};
        let config = PolicyConfig {
            high: 0.7,
            low: 0.3,
            step: Step::Nodes(1),
            min_nodes: 2,
            max_nodes: 8,
            cooldown: Duration::ZERO,
        };
        s.set_policy(Policy::new(config).unwrap());
    }

    /// Every member reports `used` bytes of its 1 GiB, measured under table `epoch` (by
    /// default the current one).
    fn report(s: &mut State, used: u64, epoch: Option<Epoch>, now: Instant) {
        let epoch = epoch.unwrap_or_else(|| table(s).epoch());
        let ids: Vec<(NodeId, SocketAddr)> = s.members.iter().map(|m| (m.id, m.addr)).collect();
        for (n, a) in ids {
            let stats = NodeStats {
                capacity: 1 << 30,
                used,
                epoch,
                ..NodeStats::default()
            };
            s.heartbeat(n, a, stats, now).unwrap();
        }
    }

    #[test]
    fn the_policy_waits_for_memory_use_measured_under_the_current_table() {
        let t0 = Instant::now();
        let mut s = cluster(2, 1, t0);
        elastic(&mut s);
        // 80 % full, but measured before the table existed: it may count dropped copies.
        report(&mut s, 800 << 20, Some(0), t0);
        assert_eq!(s.elastic(t0), Decision::None);
        report(&mut s, 800 << 20, None, t0);
        assert_eq!(s.elastic(t0), Decision::Add(1));
    }

    #[test]
    fn a_scale_out_once_met_does_not_hold_back_later_decisions() {
        let t0 = Instant::now();
        let mut s = cluster(2, 1, t0);
        elastic(&mut s);
        report(&mut s, 800 << 20, None, t0);
        assert_eq!(s.elastic(t0), Decision::Add(1));
        // The server asked for joins and takes its share.
        s.register(addr(9), 1 << 30, None, t0).unwrap();
        sync_all(&mut s, t0);
        report(&mut s, 10 << 20, None, t0);
        let Decision::Remove(ids) = s.elastic(t0) else {
            panic!("no scale-in at 1 % use");
        };
        s.drain(&ids, t0).unwrap();
        sync_all(&mut s, t0);
        assert_eq!(s.members.len(), 2);
        // Full again with two servers, fewer than the three once asked for: not still waiting.
        report(&mut s, 800 << 20, None, t0);
        assert_eq!(s.elastic(t0), Decision::Add(1));
    }

    #[test]
    fn table_is_built_when_the_expected_servers_joined() {
        let now = Instant::now();
        let mut s = State::new(cfg(), 3, Duration::from_secs(5));
        assert_eq!(s.register(addr(2), 1 << 30, None, now), Ok((1, false)));
        assert!(matches!(s.table_info(), Err(ErrorCode::NotReady(_))));
        assert_eq!(s.register(addr(3), 1 << 30, None, now), Ok((2, false)));
        assert_eq!(
            s.heartbeat(1, addr(2), NodeStats::default(), now),
            Ok(Beat::Epoch(None))
        );
        assert_eq!(s.register(addr(4), 2 << 30, None, now), Ok((3, true)));
        assert_eq!(
            s.heartbeat(1, addr(2), NodeStats::default(), now),
            Ok(Beat::Epoch(Some(1)))
        );
        // Proportional to capacity: node 3 has twice the memory.
        let load = table(&s).load();
        assert_eq!((load[&1], load[&2], load[&3]), (16, 16, 32));
        assert!(s.table_info().is_ok());
        assert_eq!(s.goal(), table(&s).all());
    }

    #[test]
    fn a_late_join_receives_its_share_as_incoming_copies() {
        let t0 = Instant::now();
        let mut s = cluster(3, 1, t0);
        assert_eq!(s.register(addr(9), 1 << 30, None, t0), Ok((4, false)));
        let t = table(&s);
        assert_eq!(t.epoch(), 2);
        // About a quarter of the copies head for node 4; nothing is complete there yet.
        let coming: Vec<PartitionId> = (0..64).filter(|&p| t.receives(4, p)).collect();
        assert_eq!(coming.len(), t.copies_incoming());
        assert!((15..=17).contains(&coming.len()), "{}", coming.len());
        assert!(!t.load().contains_key(&4));
        assert!(s.table().unwrap().nodes.iter().any(|n| n.id == 4));
        // Only the partitions that change are fenced.
        assert!((0..64).all(|p| (t.changed(p) == 2) == t.receives(4, p)));
        // Once synced, node 4 holds its share and the old holders let go.
        sync_all(&mut s, t0);
        let t = table(&s);
        assert_eq!(t.copies_incoming(), 0);
        assert_eq!(t.load()[&4], coming.len());
        assert!(t.all().iter().all(|l| l.len() == 1));
        assert_eq!(s.goal(), t.all());
    }

    #[test]
    fn a_death_publishes_a_table_without_it_and_rebuilds_to_r() {
        let t0 = Instant::now();
        let mut s = cluster(4, 2, t0);
        let before = table(&s).clone();
        let t1 = t0 + SEC;
        beat(&mut s, [1, 2, 4], t1);
        assert_eq!(s.tick(t1 + SEC), None, "within the timeout");
        // Node 3 has been silent for 2.5 s.
        assert_eq!(s.tick(t0 + 2 * SEC + SEC / 2), Some(2));
        let t = table(&s);
        assert!(!t.nodes().contains(&3));
        assert!(!s.table().unwrap().nodes.iter().any(|n| n.id == 3));
        let held = before.load()[&3];
        assert_eq!(t.degraded(2).count(), held);
        assert_eq!(t.lost().count(), 0);
        for p in 0..64 {
            let (rep, inc) = (t.replicas(p), t.incoming(p));
            assert!(
                rep.len() + inc.len() >= 2,
                "partition {p}: {rep:?} + {inc:?}"
            );
            assert_eq!(s.goal()[p as usize].len(), 2);
            // Survivors keep serving; untouched partitions are not fenced.
            assert!(rep.iter().all(|&n| before.holds(n, p)));
            assert_eq!(t.changed(p) == 2, before.holds(3, p) || !inc.is_empty());
        }
        // The dead node stays listed, down; its late heartbeat is refused.
        let st = s.status(t0 + 3 * SEC);
        let dead = st.nodes.iter().find(|n| n.id == 3).unwrap();
        assert!(!dead.alive && dead.partitions == 0);
        assert_eq!(
            s.heartbeat(3, addr(4), NodeStats::default(), t0 + 3 * SEC),
            Err(ErrorCode::NotFound)
        );
        // A second tick changes nothing more.
        beat(&mut s, [1, 2, 4], t0 + 3 * SEC);
        assert_eq!(s.tick(t0 + 3 * SEC), None);
        sync_all(&mut s, t0 + 3 * SEC);
        let t = table(&s);
        assert!(t.all().iter().all(|l| l.len() == 2 && !l.contains(&3)));
        assert_eq!((t.degraded(2).count(), t.copies_incoming()), (0, 0));
    }

    #[test]
    fn a_death_with_single_copies_loses_partitions() {
        let t0 = Instant::now();
        let mut s = cluster(2, 1, t0);
        let held = table(&s).load()[&2];
        beat(&mut s, [1], t0 + 2 * SEC);
        assert_eq!(s.tick(t0 + 3 * SEC), Some(2));
        let t = table(&s);
        let lost: Vec<PartitionId> = t.lost().collect();
        assert_eq!(lost.len(), held);
        assert!(lost.iter().all(|&p| t.incoming(p).is_empty()));
        assert_eq!(t.copies_incoming(), 0);
        let st = s.status(t0 + 3 * SEC);
        assert_eq!((st.lost, st.degraded, st.incoming), (held as u32, 0, 0));
    }

    #[test]
    fn a_restarted_server_rejoins_under_a_new_id() {
        let t0 = Instant::now();
        let mut s = cluster(3, 2, t0);
        beat(&mut s, [1, 2], t0 + 2 * SEC);
        // Node 3 restarts on its old address after the timeout: the old id dies and the new
        // one is planned in, in one step.
        assert_eq!(
            s.register(addr(4), 1 << 30, None, t0 + 3 * SEC),
            Ok((4, false))
        );
        let t = table(&s);
        assert_eq!(t.epoch(), 2);
        assert!(!t.nodes().contains(&3));
        assert!(t.copies_incoming() > 0);
        sync_all(&mut s, t0 + 3 * SEC);
        let t = table(&s);
        assert!(t.all().iter().all(|l| l.len() == 2));
        let load = t.load();
        assert!(load.values().all(|&c| (42..=44).contains(&c)), "{load:?}");
    }

    /// The table of a 4-server, r = 2 cluster that lost node 4 and rebuilt (epoch > 1).
    fn held_table(t0: Instant) -> TableInfo {
        let mut old = cluster(4, 2, t0);
        beat(&mut old, [1, 2, 3], t0 + 2 * SEC);
        old.tick(t0 + 3 * SEC);
        sync_all(&mut old, t0 + 3 * SEC);
        old.table().unwrap().clone()
    }

    #[test]
    fn a_restarted_manager_recovers_the_cluster_from_the_servers_tables() {
        let t0 = Instant::now();
        let held = held_table(t0);
        let e = held.table.epoch();
        assert!(e > 2, "{e}");
        let mut stale = held.clone();
        stale.table = PartitionTable::new(e - 1, held.table.all().to_vec()).unwrap();

        let mut s = State::new(cfg_r(2), 4, 2 * SEC);
        // A server started afresh before the first claim held nothing: it is forgotten.
        assert_eq!(s.register(addr(9), 1 << 30, None, t0), Ok((1, false)));
        // Node 1 claims with an older table, node 2 with the newest: the newest is kept.
        assert_eq!(s.rejoin(1, addr(2), 1 << 30, None, stale, t0), Ok(1));
        assert_eq!(s.table().unwrap().table.epoch(), e - 1);
        // Not handed out while recovering: a newer table may yet be claimed.
        assert!(matches!(s.table_info(), Err(ErrorCode::NotReady(_))));
        assert_eq!(s.rejoin(2, addr(3), 1 << 30, None, held.clone(), t0), Ok(2));
        assert_eq!(s.table(), Some(&held));
        assert_eq!(
            s.heartbeat(1, addr(2), NodeStats::default(), t0),
            Ok(Beat::Epoch(Some(e)))
        );
        // Not a member of the table: a node the cluster moved on from (node 4 died).
        assert_eq!(
            s.rejoin(4, addr(5), 1 << 30, None, held.clone(), t0),
            Err(ErrorCode::NotFound)
        );
        // The fresh registrant was forgotten: its next beat tells it to join again.
        assert_eq!(
            s.heartbeat(1, addr(9), NodeStats::default(), t0),
            Err(ErrorCode::NotFound)
        );
        // Nothing changes while recovering: a copy reported done waits, a drain too.
        assert!(matches!(
            s.sync_done(1, 0, e, t0),
            Err(ErrorCode::NotReady(_))
        ));
        assert!(matches!(s.drain(&[1], t0), Err(ErrorCode::NotReady(_))));
        assert_eq!(s.tick(t0 + SEC), None);
        // Node 3 comes back in time; a new server joins during the recovery.
        assert_eq!(
            s.rejoin(3, addr(4), 1 << 30, None, held.clone(), t0 + SEC),
            Ok(3)
        );
        assert_eq!(s.register(addr(9), 1 << 30, None, t0 + SEC), Ok((4, false)));
        s.heartbeat(4, addr(9), NodeStats::default(), t0 + 2 * SEC)
            .unwrap();
        beat(&mut s, [1, 2, 3], t0 + 2 * SEC);
        assert_eq!(table(&s).epoch(), e);
        // At the end of the recovery the table is re-planned once, epochs going on.
        assert_eq!(s.tick(t0 + 2 * SEC), Some((e | GENERATION) + 2));
        assert!((0..64).any(|p| table(&s).receives(4, p)));
        // The recovery is over: late claims are refused.
        assert_eq!(
            s.rejoin(5, addr(6), 1 << 30, None, held, t0 + 2 * SEC),
            Err(ErrorCode::NotFound)
        );
        sync_all(&mut s, t0 + 2 * SEC);
        assert!(table(&s).all().iter().all(|l| l.len() == 2));
        // A server reports a table this manager never saw: the next one goes past it, with
        // every partition changed.
        let ahead = table(&s).epoch() + 10;
        let stats = NodeStats {
            epoch: ahead,
            ..NodeStats::default()
        };
        assert_eq!(
            s.heartbeat(7, addr(8), stats, t0 + 2 * SEC),
            Err(ErrorCode::NotFound)
        );
        s.register(addr(8), 1 << 30, None, t0 + 2 * SEC).unwrap();
        let t = table(&s);
        assert!(t.epoch() > ahead);
        assert!((0..64).all(|p| t.changed(p) > ahead));
    }

    #[test]
    fn a_recovery_drops_the_servers_that_did_not_come_back() {
        let t0 = Instant::now();
        let held = held_table(t0);
        let e = held.table.epoch();
        let mut s = State::new(cfg_r(2), 4, 2 * SEC);
        assert!(matches!(
            s.rejoin(
                1,
                addr(2),
                1 << 30,
                None,
                TableInfo {
                    config: cfg(),
                    ..held.clone()
                },
                t0
            ),
            Err(ErrorCode::Invalid(_))
        ));
        assert_eq!(s.rejoin(1, addr(2), 1 << 30, None, held.clone(), t0), Ok(1));
        assert_eq!(s.rejoin(1, addr(2), 1 << 30, None, held.clone(), t0), Ok(1));
        assert_eq!(s.rejoin(2, addr(3), 1 << 30, None, held, t0), Ok(2));
        beat(&mut s, [1, 2], t0 + 2 * SEC);
        assert_eq!(s.tick(t0 + 2 * SEC), Some((e | GENERATION) + 2));
        let t = table(&s);
        assert!(!t.nodes().contains(&3));
        assert!(
            t.all().iter().all(|l| !l.is_empty()),
            "nothing lost with r = 2"
        );
    }

    #[test]
    fn sync_done_promotes_and_drops_the_extra_copy_at_the_goal() {
        let t0 = Instant::now();
        let mut s = cluster(2, 1, t0);
        s.register(addr(9), 1 << 30, None, t0).unwrap();
        let t = table(&s).clone();
        let p = (0..64).find(|&p| t.receives(3, p)).unwrap();
        let old = t.replicas(p).to_vec();
        assert_eq!(s.goal()[p as usize], vec![3]);
        assert_eq!(s.sync_done(3, p, t.epoch(), t0), Ok(3));
        let u = table(&s);
        // Complete, but the old holder keeps its copy (and gets the writes) until the whole
        // reconfiguration is done; only p changed.
        let mut both = old.clone();
        both.push(3);
        assert_eq!((u.replicas(p), u.incoming(p)), (&both[..], &[][..]));
        assert_eq!(u.changed(p), 3);
        assert!((0..64).filter(|&q| q != p).all(|q| u.changed(q) <= 2));
        while let Some(q) = (0..64).find(|&q| table(&s).receives(3, q)) {
            let e = table(&s).epoch();
            s.sync_done(3, q, e, t0).unwrap();
        }
        // The last copy done: every replaced copy goes at once.
        let u = table(&s);
        assert_eq!((u.replicas(p), u.incoming(p)), (&[3][..], &[][..]));
        assert!(u.all().iter().all(|l| l.len() == 1));
        assert_ne!(old, vec![3]);
    }

    #[test]
    fn a_drained_server_is_retired_once_its_copies_moved() {
        let t0 = Instant::now();
        let mut s = cluster(3, 1, t0);
        // Refused: unknown node, and draining below the replication factor.
        assert!(matches!(s.drain(&[9], t0), Err(ErrorCode::Invalid(_))));
        let mut r3 = cluster(3, 3, t0);
        assert!(matches!(r3.drain(&[1], t0), Err(ErrorCode::Invalid(_))));
        s.drain(&[2], t0).unwrap();
        assert!(s.status(t0).nodes.iter().any(|n| n.id == 2 && n.draining));
        // Node 2 keeps serving while its partitions are copied to 1 and 3.
        loop {
            let t = table(&s).clone();
            let Some(p) = (0..64).find(|&p| !t.incoming(p).is_empty()) else {
                break;
            };
            assert!(t.holds(2, p));
            let to = t.incoming(p)[0];
            assert_ne!(to, 2);
            s.sync_done(to, p, t.epoch(), t0).unwrap();
        }
        let t = table(&s);
        assert!(!t.nodes().contains(&2));
        assert!(t.all().iter().all(|l| l.len() == 1));
        assert!(!t.nodes().is_empty() && table_addrs(&s).iter().all(|&n| n != 2));
        assert_eq!(s.take_released().len(), 1);
        assert_eq!(
            s.heartbeat(2, addr(3), NodeStats::default(), t0),
            Ok(Beat::Retired)
        );
        assert!(matches!(s.drain(&[2], t0), Err(ErrorCode::Invalid(_))));
    }

    fn table_addrs(s: &State) -> Vec<NodeId> {
        s.table()
            .map(|t| t.nodes.iter().map(|n| n.id).collect())
            .unwrap_or_default()
    }

    #[test]
    fn sync_done_for_a_copy_that_is_not_incoming_is_invalid() {
        let t0 = Instant::now();
        let mut s = State::new(cfg_r(2), 2, 2 * SEC);
        s.register(addr(2), 1 << 30, None, t0).unwrap();
        // No table yet.
        assert!(matches!(
            s.sync_done(1, 0, 0, t0),
            Err(ErrorCode::Invalid(_))
        ));
        s.register(addr(3), 1 << 30, None, t0).unwrap();
        let e = table(&s).epoch();
        for (node, p, epoch) in [(1, 0, e), (7, 0, e), (1, 64, e), (1, u32::MAX, e)] {
            assert!(
                matches!(s.sync_done(node, p, epoch, t0), Err(ErrorCode::Invalid(_))),
                "{node} {p}"
            );
        }
        s.register(addr(4), 1 << 30, None, t0).unwrap();
        let t = table(&s).clone();
        let p = (0..64).find(|&p| t.receives(3, p)).unwrap();
        // An epoch from the future, and a second report of the same copy.
        assert!(matches!(
            s.sync_done(3, p, t.epoch() + 1, t0),
            Err(ErrorCode::Invalid(_))
        ));
        assert_eq!(s.sync_done(3, p, t.epoch(), t0), Ok(t.epoch() + 1));
        assert!(matches!(
            s.sync_done(3, p, t.epoch() + 1, t0),
            Err(ErrorCode::Invalid(_))
        ));
        assert_eq!(table(&s).epoch(), t.epoch() + 1);
    }

    #[test]
    fn status_counts_degraded_lost_and_incoming() {
        let t0 = Instant::now();
        let mut s = cluster(4, 2, t0);
        let st = s.status(t0);
        assert_eq!((st.degraded, st.lost, st.incoming), (0, 0, 0));
        assert_eq!(st.nodes.iter().map(|n| n.partitions).sum::<u32>(), 128);
        beat(&mut s, [1, 2], t0 + 2 * SEC);
        // Nodes 3 and 4 die: partitions on both are lost, those on one are degraded.
        s.tick(t0 + 3 * SEC).unwrap();
        let t = table(&s).clone();
        let st = s.status(t0 + 3 * SEC);
        let with = |n: usize| (0..64).filter(|&p| t.replicas(p).len() == n).count() as u32;
        assert_eq!((st.lost, st.degraded), (with(0), with(1)));
        assert!(st.lost > 0 && st.degraded > 0);
        assert_eq!(st.incoming as usize, t.copies_incoming());
        assert_eq!(st.incoming, st.degraded);
        let parts: u32 = st.nodes.iter().map(|n| n.partitions).sum();
        assert_eq!(parts as usize, t.all().iter().map(Vec::len).sum::<usize>());
        assert_eq!(st.nodes.iter().filter(|n| n.alive).count(), 2);
    }

    #[test]
    fn a_stalled_manager_declares_no_one_dead() {
        let t0 = Instant::now();
        let mut s = cluster(2, 1, t0);
        // Nothing ran for 10 s (the manager was stopped): every server gets a fresh grace period.
        assert_eq!(s.tick(t0 + 10 * SEC), None);
        assert!(s.status(t0 + 10 * SEC).nodes.iter().all(|n| n.alive));
        beat(&mut s, [1], t0 + 11 * SEC);
        assert_eq!(s.tick(t0 + 12 * SEC), None);
        // Silence while the manager runs still counts.
        assert_eq!(s.tick(t0 + 12 * SEC + SEC / 2), Some(2));
        assert!(!table(&s).nodes().contains(&2));
    }

    #[test]
    fn bad_registrations_and_heartbeats() {
        let now = Instant::now();
        let mut s = State::new(cfg(), 2, Duration::from_secs(5));
        assert!(matches!(
            s.register(addr(2), 0, None, now),
            Err(ErrorCode::Invalid(_))
        ));
        s.register(addr(2), 1, None, now).unwrap();
        assert!(matches!(
            s.register(addr(2), 1, None, now),
            Err(ErrorCode::Invalid(_))
        ));
        // A dead node's address may be taken again (a restarted server), and the dead one
        // does not count towards the expected servers.
        s.tick(now + Duration::from_secs(4));
        assert_eq!(
            s.register(addr(2), 1, None, now + Duration::from_secs(6)),
            Ok((2, false))
        );
        assert_eq!(
            s.heartbeat(99, addr(100), NodeStats::default(), now),
            Err(ErrorCode::NotFound)
        );
    }

    #[test]
    fn liveness_follows_heartbeats() {
        let t0 = Instant::now();
        let mut s = State::new(cfg(), 1, Duration::from_secs(5));
        s.register(addr(2), 1, None, t0).unwrap();
        assert!(s.status(t0 + Duration::from_secs(1)).nodes[0].alive);
        let later = t0 + Duration::from_secs(4);
        s.heartbeat(1, addr(2), NodeStats::default(), later)
            .unwrap();
        let st = s.status(later);
        assert!(st.nodes[0].alive);
        assert_eq!((st.epoch, st.nodes[0].partitions), (Some(1), 64));
        // Silent too long: down in the status before the tick, dead after it.
        assert_eq!(s.tick(later + Duration::from_secs(3)), None);
        assert!(!s.status(later + Duration::from_secs(6)).nodes[0].alive);
        assert_eq!(s.tick(later + Duration::from_secs(6)), Some(2));
        let st = s.status(later + Duration::from_secs(6));
        assert_eq!((st.lost, st.nodes[0].partitions), (64, 0));
        assert!(s.table().unwrap().nodes.is_empty());
    }
}
