//! What the cluster is: its settings fixed at creation ([`ClusterConfig`]), the partition
//! table as it travels ([`TableInfo`], checked when decoded), and the status the manager and
//! servers report ([`ClusterStatus`], [`NodeStatus`], [`NodeStats`]).

use crate::msg::OPEN_LEASE;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::time::Duration;
use tessera_placement::{validate_stripe_size, Epoch, NodeId, PartitionTable};

/// Cluster-wide settings fixed when the cluster is created. Checked when decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "UncheckedConfig")]
pub struct ClusterConfig {
    pub partitions: u32,
    pub stripe_size: u32,
    pub replication: u8,
    /// How long a client's open handles outlive its last lease renewal, milliseconds
    /// ([`OPEN_LEASE`] unless set; at least [`OPEN_LEASE_MIN`]).
    pub open_lease_ms: u32,
}

/// The shortest open lease a cluster accepts: clients renew three times per lease.
pub const OPEN_LEASE_MIN: Duration = Duration::from_millis(300);

impl ClusterConfig {
    /// A cluster of these settings with the default open lease.
    #[must_use]
    pub const fn new(partitions: u32, stripe_size: u32, replication: u8) -> Self {
        Self {
            partitions,
            stripe_size,
            replication,
            open_lease_ms: OPEN_LEASE.as_millis() as u32,
        }
    }

    /// How long a client's open handles outlive its last renewal.
    #[must_use]
    pub fn open_lease(&self) -> Duration {
        Duration::from_millis(u64::from(self.open_lease_ms))
    }

    /// At least one partition, 1 to 3 copies of each, a stripe size [`validate_stripe_size`]
    /// accepts.
    pub fn validate(&self) -> Result<(), String> {
        if self.partitions == 0 {
            return Err("the cluster needs at least one partition".into());
        }
        if !(1..=3).contains(&self.replication) {
            return Err(format!("replication {} must be 1 to 3", self.replication));
        }
        if self.open_lease() < OPEN_LEASE_MIN {
            return Err(format!(
                "an open lease of {:?} is shorter than {OPEN_LEASE_MIN:?}",
                self.open_lease()
            ));
        }
        validate_stripe_size(u64::from(self.stripe_size)).map(drop)
    }
}

#[derive(Deserialize)]
struct UncheckedConfig {
    partitions: u32,
    stripe_size: u32,
    replication: u8,
    open_lease_ms: u32,
}

impl TryFrom<UncheckedConfig> for ClusterConfig {
    type Error = String;

    fn try_from(c: UncheckedConfig) -> Result<Self, String> {
        let config = Self {
            partitions: c.partitions,
            stripe_size: c.stripe_size,
            replication: c.replication,
            open_lease_ms: c.open_lease_ms,
        };
        config.validate().map(|()| config)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAddr {
    pub id: NodeId,
    pub addr: SocketAddr,
}

/// Everything a client or server needs to route requests. Decoded only with a table of the
/// configured number of partitions and an address for every node it lists ([`Self::check`]);
/// the table's own lists are checked as it is decoded (`PartitionTable`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "UncheckedTableInfo")]
pub struct TableInfo {
    pub config: ClusterConfig,
    pub table: PartitionTable,
    pub nodes: Vec<NodeAddr>,
}

#[derive(Deserialize)]
struct UncheckedTableInfo {
    config: ClusterConfig,
    table: PartitionTable,
    nodes: Vec<NodeAddr>,
}

impl TryFrom<UncheckedTableInfo> for TableInfo {
    type Error = String;

    fn try_from(t: UncheckedTableInfo) -> Result<Self, String> {
        let info = Self {
            config: t.config,
            table: t.table,
            nodes: t.nodes,
        };
        info.check(info.config.partitions).map(|()| info)
    }
}

impl TableInfo {
    /// Is this a table to install in a cluster of `partitions` partitions (as the installer
    /// knows it)? Its table and its settings have that many, and every node its table lists
    /// has an address. A partition with no replica is not refused: it is lost (EIO).
    pub fn check(&self, partitions: u32) -> Result<(), String> {
        if self.table.partitions() != partitions || self.config.partitions != partitions {
            return Err(format!(
                "a table of {} partitions (settings of {}) for a cluster of {partitions}",
                self.table.partitions(),
                self.config.partitions
            ));
        }
        match self
            .table
            .nodes()
            .into_iter()
            .find(|&n| !self.nodes.iter().any(|a| a.id == n))
        {
            Some(n) => Err(format!(
                "the table lists node {n} but gives no address for it"
            )),
            None => Ok(()),
        }
    }
}

/// Counters a storage server reports with each heartbeat.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStats {
    /// Configured memory capacity, bytes.
    pub capacity: u64,
    /// Bytes held in stripes and metadata.
    pub used: u64,
    pub stripes: u64,
    pub inodes: u64,
    /// Requests being served right now (a load signal for replica choice).
    pub load: u32,
    pub reads: u64,
    pub writes: u64,
    pub meta_ops: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Partitions this node is receiving right now, and bytes received by syncs so far.
    pub syncing: u32,
    pub synced_bytes: u64,
    /// The partition table the node had installed when it measured (0: none): `used` counts
    /// copies an older table kept, which a newer one may have dropped.
    pub epoch: Epoch,
    /// Bytes of idle stripe buffers held for reuse, pre-faulted ones (`--prefault`) included:
    /// memory the process holds beyond `used`.
    pub pooled: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    pub id: NodeId,
    pub addr: SocketAddr,
    pub label: Option<String>,
    pub alive: bool,
    /// Being drained: its partitions are moving to the others, then it is retired.
    pub draining: bool,
    pub since_heartbeat_ms: u64,
    /// Partition copies this node holds in the current table.
    pub partitions: u32,
    pub stats: NodeStats,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterStatus {
    pub config: ClusterConfig,
    pub epoch: Option<Epoch>,
    pub expected_servers: u32,
    pub nodes: Vec<NodeStatus>,
    /// Partitions with fewer complete copies than the replication factor, with none left, and
    /// partition copies being received (rebuilds and migrations).
    pub degraded: u32,
    pub lost: u32,
    pub incoming: u32,
}
