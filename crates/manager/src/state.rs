//! The manager's state machine: membership, heartbeats, the partition table. Pure: the caller
//! supplies the clock, so it is tested without waiting.

use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tessera_placement::{assign, NodeId, NodeWeight, PartitionTable};
use tessera_proto::{
    ClusterConfig, ClusterStatus, ErrorCode, NodeAddr, NodeStats, NodeStatus, TableInfo,
};

#[derive(Debug, Clone)]
pub struct Member {
    pub id: NodeId,
    pub addr: SocketAddr,
    pub capacity: u64,
    pub label: Option<String>,
    pub last_seen: Instant,
    pub stats: NodeStats,
}

#[derive(Debug)]
pub struct State {
    pub config: ClusterConfig,
    pub expect: u32,
    pub heartbeat_timeout: Duration,
    members: Vec<Member>,
    next_id: NodeId,
    table: Option<TableInfo>,
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
        }
    }

    fn alive(&self, m: &Member, now: Instant) -> bool {
        now.duration_since(m.last_seen) <= self.heartbeat_timeout
    }

    /// A server joins. Returns its id and whether this join completed the table.
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
        if let Some(m) = self.members.iter().find(|m| m.addr == addr) {
            if self.alive(m, now) {
                return Err(ErrorCode::Invalid(format!(
                    "{addr} is already registered as node {}",
                    m.id
                )));
            }
        }
        let id = self.next_id;
        self.next_id += 1;
        self.members.push(Member {
            id,
            addr,
            capacity,
            label,
            last_seen: now,
            stats: NodeStats {
                capacity,
                ..NodeStats::default()
            },
        });
        if self.table.is_some() {
            tracing::info!(node = id, %addr, "server joined after the table was built; it holds no partitions yet");
            return Ok((id, false));
        }
        if self.members.len() < self.expect as usize {
            return Ok((id, false));
        }
        let weights: Vec<NodeWeight> = self
            .members
            .iter()
            .map(|m| NodeWeight {
                node: m.id,
                capacity: m.capacity,
            })
            .collect();
        let replicas = assign(
            None,
            &weights,
            self.config.partitions,
            self.config.replication,
        )
        .map_err(|e| ErrorCode::Internal(format!("cannot place partitions: {e}")))?;
        let table =
            PartitionTable::new(1, replicas).map_err(|e| ErrorCode::Internal(e.to_string()))?;
        let nodes = self
            .members
            .iter()
            .map(|m| NodeAddr {
                id: m.id,
                addr: m.addr,
            })
            .collect();
        self.table = Some(TableInfo {
            config: self.config,
            table,
            nodes,
        });
        tracing::info!(
            servers = self.members.len(),
            "all expected servers joined: partition table epoch 1 built"
        );
        Ok((id, true))
    }

    pub fn heartbeat(
        &mut self,
        node: NodeId,
        stats: NodeStats,
        now: Instant,
    ) -> Result<Option<u64>, ErrorCode> {
        let m = self
            .members
            .iter_mut()
            .find(|m| m.id == node)
            .ok_or(ErrorCode::NotFound)?;
        m.last_seen = now;
        m.stats = stats;
        Ok(self.table.as_ref().map(|t| t.table.epoch()))
    }

    #[must_use]
    pub fn table(&self) -> Option<&TableInfo> {
        self.table.as_ref()
    }

    /// The table, or why there is none yet.
    pub fn table_info(&self) -> Result<&TableInfo, ErrorCode> {
        self.table.as_ref().ok_or_else(|| {
            ErrorCode::NotReady(format!(
                "waiting for servers: {} of {} joined",
                self.members.len(),
                self.expect
            ))
        })
    }

    #[must_use]
    pub fn status(&self, now: Instant) -> ClusterStatus {
        let load = self
            .table
            .as_ref()
            .map(|t| t.table.load())
            .unwrap_or_default();
        ClusterStatus {
            config: self.config,
            epoch: self.table.as_ref().map(|t| t.table.epoch()),
            expected_servers: self.expect,
            nodes: self
                .members
                .iter()
                .map(|m| NodeStatus {
                    id: m.id,
                    addr: m.addr,
                    label: m.label.clone(),
                    alive: self.alive(m, now),
                    since_heartbeat_ms: now.duration_since(m.last_seen).as_millis() as u64,
                    partitions: load.get(&m.id).copied().unwrap_or(0) as u32,
                    stats: m.stats,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> ClusterConfig {
        ClusterConfig {
            partitions: 64,
            stripe_size: 1 << 20,
            replication: 1,
        }
    }
    fn addr(i: u8) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, i], 7000))
    }

    #[test]
    fn table_is_built_when_the_expected_servers_joined() {
        let now = Instant::now();
        let mut s = State::new(cfg(), 3, Duration::from_secs(5));
        assert_eq!(s.register(addr(2), 1 << 30, None, now), Ok((1, false)));
        assert!(matches!(s.table_info(), Err(ErrorCode::NotReady(_))));
        assert_eq!(s.register(addr(3), 1 << 30, None, now), Ok((2, false)));
        assert_eq!(s.heartbeat(1, NodeStats::default(), now), Ok(None));
        assert_eq!(s.register(addr(4), 2 << 30, None, now), Ok((3, true)));
        assert_eq!(s.heartbeat(1, NodeStats::default(), now), Ok(Some(1)));
        // Proportional to capacity: node 3 has twice the memory.
        let load = s.table().unwrap().table.load();
        assert_eq!((load[&1], load[&2], load[&3]), (16, 16, 32));
        assert!(s.table_info().is_ok());
        // Late joiners do not change the table (elasticity is a later issue).
        assert_eq!(s.register(addr(5), 1 << 30, None, now), Ok((4, false)));
        assert_eq!(s.table().unwrap().table.epoch(), 1);
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
        // A dead node's address may be taken again (a restarted server).
        assert!(s
            .register(addr(2), 1, None, now + Duration::from_secs(6))
            .is_ok());
        assert_eq!(
            s.heartbeat(99, NodeStats::default(), now),
            Err(ErrorCode::NotFound)
        );
    }

    #[test]
    fn liveness_follows_heartbeats() {
        let t0 = Instant::now();
        let mut s = State::new(cfg(), 1, Duration::from_secs(5));
        s.register(addr(2), 1, None, t0).unwrap();
        assert!(s.status(t0 + Duration::from_secs(1)).nodes[0].alive);
        let later = t0 + Duration::from_secs(10);
        assert!(!s.status(later).nodes[0].alive);
        s.heartbeat(1, NodeStats::default(), later).unwrap();
        let st = s.status(later);
        assert!(st.nodes[0].alive);
        assert_eq!((st.epoch, st.nodes[0].partitions), (Some(1), 64));
    }
}
