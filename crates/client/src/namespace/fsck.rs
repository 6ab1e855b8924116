//! Finding and reclaiming inodes that no name reaches (`tessera fsck`): left by a client that
//! died between the steps of a create, unlink or rename.
//!
//! Safe on a live cluster. The namespace is walked from the root twice, with every partition's
//! inodes listed in between; an inode is unreachable only if neither walk reached it, no handle
//! is open on it, and its ctime is older than `min_age` before the first walk began. A create
//! or rename on its way during a walk changes the inode's ctime (a directory's number is made
//! before its name; a rename across directories links the new name before it removes the
//! old), so its inode is too young; a name that one walk missed while it moved is found by the
//! other. Directories move across parents only under the cluster's rename lock, which the
//! walks hold. The reclaim itself is refused by the server if the inode changed since it was
//! listed, or is open or named in its own partition by then.

use crate::route::{unexpected, Key};
use crate::{Client, Result};
use bytes::Bytes;
use futures::StreamExt;
use std::collections::HashSet;
use std::time::Duration;
use tessera_placement::{Ino, ROOT_INO};
use tessera_proto::{FileKind, Inode, Op, Response, Timespec, RENAME_LEASE, SCAN_PAGE_MAX};
use tracing::warn;

/// Directories listed, or partitions scanned, at once.
const PARALLEL: usize = 16;

/// An inode no name reaches.
#[derive(Debug, Clone)]
pub struct Orphan {
    pub inode: Inode,
    /// Deleted (with `repair`), its stripes dropped in the background.
    pub reclaimed: bool,
}

/// What [`Client::fsck`] found.
#[derive(Debug, Default)]
pub struct Fsck {
    /// Inodes the servers hold.
    pub inodes: u64,
    /// Of those, reached by a name.
    pub reachable: u64,
    /// Unreachable but open (files unlinked while open), or too young to judge.
    pub open: u64,
    pub young: u64,
    pub orphans: Vec<Orphan>,
}

impl Fsck {
    /// The bytes of the orphans' files (by size), all of them or only those reclaimed.
    #[must_use]
    pub fn bytes(&self, reclaimed_only: bool) -> u64 {
        self.orphans
            .iter()
            .filter(|o| o.inode.kind == FileKind::File && (o.reclaimed || !reclaimed_only))
            .map(|o| o.inode.size)
            .sum()
    }
}

impl Client {
    /// Finds the inodes no name reaches, older than `min_age`; with `repair`, deletes them.
    pub async fn fsck(&self, min_age: Duration, repair: bool) -> Result<Fsck> {
        let started = Timespec::now();
        let holder = rand::random::<u64>();
        self.meta(ROOT_INO, Op::RenameLock { holder }).await?;
        let keep = tokio::spawn({
            let c = self.clone();
            async move {
                loop {
                    tokio::time::sleep(RENAME_LEASE / 4).await;
                    if let Err(e) = c.meta(ROOT_INO, Op::RenameLock { holder }).await {
                        warn!("keeping the rename lock: {e}");
                    }
                }
            }
        });
        let found = async {
            let first = self.reachable().await?;
            let listed = self.all_inodes().await?;
            let second = self.reachable().await?;
            Ok::<_, crate::Error>((first, listed, second))
        }
        .await;
        keep.abort();
        if let Err(e) = self.meta(ROOT_INO, Op::RenameUnlock { holder }).await {
            warn!("giving back the rename lock: {e}");
        }
        let (first, listed, second) = found?;
        let old = |t: Timespec| {
            std::time::SystemTime::from(t) + min_age <= std::time::SystemTime::from(started)
        };
        let mut report = Fsck {
            inodes: listed.len() as u64,
            ..Fsck::default()
        };
        for inode in listed {
            if inode.ino == ROOT_INO || first.contains(&inode.ino) || second.contains(&inode.ino) {
                report.reachable += 1;
            } else if inode.open_count > 0 {
                report.open += 1;
            } else if !old(inode.ctime) {
                report.young += 1;
            } else {
                let reclaimed = repair && self.reclaim(&inode).await?;
                report.orphans.push(Orphan { inode, reclaimed });
            }
        }
        Ok(report)
    }

    /// Every inode number a name reaches from the root, the root too.
    async fn reachable(&self) -> Result<HashSet<Ino>> {
        let mut seen = HashSet::from([ROOT_INO]);
        let mut level = vec![ROOT_INO];
        while !level.is_empty() {
            let lists: Vec<_> = futures::stream::iter(std::mem::take(&mut level))
                .map(|dir| self.readdir_all(dir))
                .buffer_unordered(PARALLEL)
                .collect()
                .await;
            for list in lists {
                let list = match list {
                    Ok(list) => list,
                    // Removed since its name was listed.
                    Err(e) if e.is(&tessera_proto::ErrorCode::NotFound) => continue,
                    Err(e) => return Err(e),
                };
                for (_, entry, _) in list {
                    if seen.insert(entry.ino) && entry.kind == FileKind::Dir {
                        level.push(entry.ino);
                    }
                }
            }
        }
        Ok(seen)
    }

    /// Every inode of every partition.
    async fn all_inodes(&self) -> Result<Vec<Inode>> {
        let parts: Vec<_> = futures::stream::iter(0..self.router.config().partitions)
            .map(|p| self.partition_inodes(p))
            .buffer_unordered(PARALLEL)
            .collect()
            .await;
        let mut all = Vec::new();
        for p in parts {
            all.extend(p?);
        }
        Ok(all)
    }

    async fn partition_inodes(&self, partition: u32) -> Result<Vec<Inode>> {
        let mut all: Vec<Inode> = Vec::new();
        loop {
            let op = Op::InodeScan {
                partition,
                after: all.last().map(|i| i.ino),
                limit: SCAN_PAGE_MAX,
            };
            let key = Key::Partition(partition);
            match self.router.call(None, key, op, Bytes::new()).await?.0 {
                Response::Inodes { inodes, more } => {
                    all.extend(inodes);
                    if !more {
                        return Ok(all);
                    }
                }
                other => return Err(unexpected(&other)),
            }
        }
    }

    /// Deletes `inode` if it is still as listed and unused; whether it was.
    async fn reclaim(&self, inode: &Inode) -> Result<bool> {
        let op = Op::InodeReclaim {
            ino: inode.ino,
            change: inode.change,
            ctime: inode.ctime,
        };
        match self.meta(inode.ino, op).await {
            Ok(Response::Reclaimed(done)) => Ok(done),
            Ok(other) => Err(unexpected(&other)),
            Err(e) if e.is(&tessera_proto::ErrorCode::NotFound) => Ok(false),
            Err(e) => Err(e),
        }
    }
}
