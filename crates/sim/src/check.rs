//! The invariants, checked after every message handled and at the end, against the servers'
//! real stores and the manager's real table:
//!
//! * an acknowledged write is never lost while a copy survives: every live replica the
//!   manager lists holds the last acknowledged version of each stripe (or one written since);
//! * epochs only increase: the manager's, each server's, each client's;
//! * a visible name leads to an inode: every entry of the root directory on a live replica
//!   has its inode there (placed files live in their directory's partition).

use crate::cluster::Cluster;
use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use tessera_placement::{meta_partition, stripe_partition, Epoch, Ino, ROOT_INO};

/// Bytes of every stripe write.
pub const LEN: u32 = 32;

/// The bytes of version `v` of a stripe.
#[must_use]
pub fn content(v: u64) -> Bytes {
    Bytes::from(v.to_le_bytes().repeat(LEN as usize / 8))
}

/// What a stripe may hold: the version last acknowledged, or one written since (in flight, or
/// failed after it may have landed somewhere).
#[derive(Debug, Default, Clone)]
pub struct Expect {
    pub acked: Option<u64>,
    pub maybe: BTreeSet<u64>,
}

impl Expect {
    #[must_use]
    pub fn allows(&self, data: &[u8]) -> bool {
        let is = |v: u64| data == content(v).as_ref();
        match self.acked {
            None => data.iter().all(|&b| b == 0) || self.maybe.iter().any(|&v| is(v)),
            Some(a) => is(a) || self.maybe.iter().any(|&v| is(v)),
        }
    }
}

#[derive(Default)]
pub struct Model {
    pub stripes: BTreeMap<(Ino, u64), Expect>,
    manager_epoch: Epoch,
    server_epochs: BTreeMap<SocketAddr, Epoch>,
    pub client_epochs: BTreeMap<u32, Epoch>,
}

impl Model {
    /// A client's table epoch now: it must not go back.
    pub fn client_epoch(&mut self, client: u32, epoch: Epoch) -> Result<(), String> {
        let last = self.client_epochs.entry(client).or_default();
        if epoch < *last {
            return Err(format!(
                "client {client}'s epoch went back from {last} to {epoch}"
            ));
        }
        *last = epoch;
        Ok(())
    }

    /// Checks every invariant against the cluster as it is now.
    pub fn check(&mut self, c: &Cluster) -> Result<(), String> {
        let servers = c.servers();
        for (addr, service) in &servers {
            let Some(s) = service else { continue };
            let e = s.0.stats().epoch;
            let last = self.server_epochs.entry(*addr).or_default();
            if e < *last {
                return Err(format!(
                    "server {addr}'s epoch went back from {last} to {e}"
                ));
            }
            *last = e;
        }
        let Some(info) = c.table() else {
            return Ok(());
        };
        let epoch = info.table.epoch();
        if epoch < self.manager_epoch {
            return Err(format!(
                "the manager's epoch went back from {} to {epoch}",
                self.manager_epoch
            ));
        }
        if epoch != self.manager_epoch {
            c.net.log.table(&info);
        }
        self.manager_epoch = epoch;
        let parts = info.config.partitions;
        let live = |node| {
            let addr = info.nodes.iter().find(|n| n.id == node)?.addr;
            servers
                .iter()
                .find(|(a, _)| *a == addr)
                .and_then(|(_, s)| s.clone())
                .map(|s| (addr, s))
        };
        for (&(file, stripe), want) in &self.stripes {
            let p = stripe_partition(file, stripe, parts);
            for &node in info.table.replicas(p) {
                let Some((addr, s)) = live(node) else {
                    continue;
                };
                let data = s.0.store.read(p, file, stripe, 0, LEN).unwrap_or_default();
                if !want.allows(&data) {
                    return Err(format!(
                        "acknowledged write lost: file {file} stripe {stripe} (partition {p}) on \
                         node {node} ({addr}) at epoch {epoch} holds {data:?}, expected {want:?}"
                    ));
                }
            }
        }
        let root = meta_partition(ROOT_INO, parts);
        for &node in info.table.replicas(root) {
            let Some((addr, s)) = live(node) else {
                continue;
            };
            let Ok((entries, _)) = s.0.store.dir_list(root, ROOT_INO, None, u32::MAX) else {
                continue;
            };
            for (name, entry, _) in entries {
                if meta_partition(entry.ino, parts) != root {
                    continue;
                }
                if s.0.store.inode_get(root, entry.ino).is_err() {
                    return Err(format!(
                        "name {:?} on node {node} ({addr}) leads to no inode ({})",
                        String::from_utf8_lossy(&name),
                        entry.ino
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Whether the dust settled: the manager's table has every partition that is not lost on `r`
/// live replicas and nothing incoming, and every live server installed it. `Err` says what is missing.
pub fn settled(c: &Cluster, r: usize) -> Result<(), String> {
    let info = c.table().ok_or("the manager has no table")?;
    let t = &info.table;
    let servers = c.servers();
    let addr_of = |n| info.nodes.iter().find(|a| a.id == n).map(|a| a.addr);
    let live: BTreeSet<SocketAddr> = servers.iter().map(|(a, _)| *a).collect();
    for p in 0..t.partitions() {
        let reps = t.replicas(p);
        // Lost (more servers failed than it had copies): nothing can bring it back.
        if reps.is_empty() {
            continue;
        }
        if reps.len() != r || !t.all_incoming()[p as usize].is_empty() {
            return Err(format!(
                "partition {p}: replicas {reps:?}, incoming {:?}",
                t.all_incoming()[p as usize]
            ));
        }
        if let Some(&n) = reps
            .iter()
            .find(|&&n| addr_of(n).is_none_or(|a| !live.contains(&a)))
        {
            return Err(format!("partition {p}: replica {n} is not alive"));
        }
    }
    for (addr, s) in &servers {
        let e = s.as_ref().map(|s| s.0.stats().epoch);
        if e != Some(t.epoch()) {
            return Err(format!(
                "server {addr} at epoch {e:?}, the table at {}",
                t.epoch()
            ));
        }
    }
    Ok(())
}
