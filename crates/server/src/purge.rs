//! Dropping the stripes of deleted files, by the server that deleted their inodes (as CephFS's
//! purge queue and Lustre's object destroys do): the unlink, rename or close that removed the
//! last link or handle is answered as soon as the inode is gone, and the file's stripes, spread
//! over every server, are dropped in the background, in batches. The space comes back a moment
//! after the answer (docs/SEMANTICS.md). Each node finds a file's stripes by the file
//! (`Store::drop_files`), not by its size: stripes a failed or unpublished write stored past
//! the size go too.
//!
//! Every copy of the inode's partition queues the file (the mirrors apply the same change): the
//! drop survives the death of the server that answered, at the cost of one more drop request
//! per copy (batched; drops are idempotent). Without mirrors, a server that dies with files
//! still queued leaves their stripes behind on the others until the cluster ends.
//!
//! A node drops stripes only in the partitions it holds. One receiving a copy of a partition
//! (a rebuild, a migration) may thus ignore a drop and then get the file's stripes with the
//! copy's last round; so files whose drop began in the last [`REDO_WITHIN`] are dropped again
//! after every new table, when such a copy has become its holder's, also while their first
//! drop is still waiting for a node.

use crate::node::Node;
use crate::store::lock;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tessera_placement::{Ino, NodeId};
use tessera_proto::{ErrorCode, Op, Request, Response, TableInfo};
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::{debug, warn};

/// Files per drop request.
const BATCH: usize = 1024;
/// Batches leave at most this often: a loop of unlinks sent its files one per batch otherwise,
/// a drop request to every node per unlink. The first delete after a quiet spell leaves at
/// once, so the space of a lone `rm` comes back as soon as it can.
const GATHER: Duration = Duration::from_millis(5);
/// How long a server keeps trying to reach another before giving up on its part of a batch
/// (a dead server is taken out of the table within seconds, which ends the wait sooner).
const PATIENCE: Duration = Duration::from_secs(30);
const RETRY: Duration = Duration::from_millis(50);
/// Files deleted this recently are dropped again after a new table.
const REDO_WITHIN: Duration = Duration::from_secs(10);
/// The most files remembered for that.
const REDO_MAX: usize = 1 << 16;

#[derive(Clone, Copy)]
struct Deleted {
    file: Ino,
    at: Instant,
}

/// Deleted files whose stripes are still to be dropped (unbounded: drained as fast as the
/// servers answer), and those dropped lately.
#[derive(Default)]
pub struct Queue {
    files: Mutex<Vec<Deleted>>,
    recent: Mutex<VecDeque<Deleted>>,
    wake: Notify,
    /// Held while batches are on their way: a retiring server waits for them.
    sending: tokio::sync::Mutex<()>,
}

impl Queue {
    pub fn push(&self, file: Ino) {
        let at = Instant::now();
        lock(&self.files).push(Deleted { file, at });
        self.wake.notify_one();
    }

    /// A new table is installed: drop the files deleted lately once more.
    pub fn table_changed(&self) {
        let again: Vec<Deleted> = {
            let mut recent = lock(&self.recent);
            Self::trim(&mut recent);
            recent.drain(..).collect()
        };
        if !again.is_empty() {
            lock(&self.files).extend(again);
            self.wake.notify_one();
        }
    }

    fn trim(recent: &mut VecDeque<Deleted>) {
        while recent
            .front()
            .is_some_and(|d| recent.len() > REDO_MAX || d.at.elapsed() > REDO_WITHIN)
        {
            recent.pop_front();
        }
    }

    /// The next batch to drop, remembered as recent from now: a table installed while it is
    /// on its way (waiting out a dead node can take seconds) drops it once more. Remembered
    /// only once answered, it missed that table, and a copy made meanwhile kept its stripes.
    fn take(&self) -> Vec<Ino> {
        let batch = {
            let mut files = lock(&self.files);
            let first = files.len().min(BATCH);
            let rest = files.split_off(first);
            std::mem::replace(&mut *files, rest)
        };
        let out = batch.iter().map(|d| d.file).collect();
        let mut recent = lock(&self.recent);
        recent.extend(batch);
        Self::trim(&mut recent);
        out
    }
}

/// What dropping deleted files needs of a server beyond the [`Node`]: its queue.
pub trait Host: Node {
    fn queue(&self) -> &Queue;
}

/// Drops queued files until the server stops.
pub async fn run(h: Arc<impl Host>) {
    let mut last: Option<Instant> = None;
    loop {
        h.queue().wake.notified().await;
        if let Some(at) = last {
            tokio::time::sleep_until(at + GATHER).await;
        }
        last = Some(Instant::now());
        send_queued(&*h).await;
    }
}

/// A retired server's queue would die with it: it drops what is queued or on its way (a redo
/// after the table that took its last partition) before it exits, for at most `within`.
pub async fn finish(h: &impl Host, within: Duration) {
    if tokio::time::timeout(within, send_queued(h)).await.is_err() {
        warn!("exiting with deleted files' stripes not yet dropped everywhere");
    }
}

async fn send_queued(h: &impl Host) {
    let _sending = h.queue().sending.lock().await;
    loop {
        let files = h.queue().take();
        if files.is_empty() {
            return;
        }
        let Some(t) = h.table() else { continue };
        let nodes = t.info.table.nodes();
        futures::future::join_all(nodes.into_iter().map(|n| drop_at(h, n, &files))).await;
    }
}

/// Drops `files` on node `n`: done when it answered, or left the table. A partition fenced
/// for the last round of a copy refuses for a moment (`NotReady`): tried again, as a node not
/// reachable yet.
async fn drop_at(h: &impl Host, n: NodeId, files: &[Ino]) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let Some(t) = h.table() else { return };
        if !t.info.table.nodes().contains(&n) {
            return;
        }
        let outcome = if n == h.id() {
            h.store().drop_files(&t.held, files)
        } else {
            ask(h, &t.info, n, files).await
        };
        match outcome {
            Ok(()) => return,
            Err(ErrorCode::StaleEpoch { .. } | ErrorCode::NotReady(_)) => {}
            Err(e) => {
                warn!(node = n, "a node refused to drop deleted files: {e}");
                return;
            }
        }
        if Instant::now() > deadline {
            warn!(
                node = n,
                files = files.len(),
                "gave up dropping deleted files' stripes after {PATIENCE:?}"
            );
            return;
        }
        h.want_refresh();
        tokio::time::sleep(RETRY).await;
    }
}

/// Sends `files` to node `n` to drop; its error, or `NotReady` if it did not answer.
async fn ask(h: &impl Host, info: &TableInfo, n: NodeId, files: &[Ino]) -> Result<(), ErrorCode> {
    let req = Request::Op {
        epoch: info.table.epoch(),
        op: Op::DropFiles {
            files: files.to_vec(),
        },
    };
    match h.peers().call(info, n, &req).await {
        Ok((Response::Error(e), _)) => Err(e),
        Ok(_) => Ok(()),
        Err(e) => {
            debug!(node = n, "dropping deleted files failed, retrying: {e}");
            Err(ErrorCode::NotReady(format!("node {n} did not answer: {e}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_on_its_way_is_dropped_again_after_a_new_table() {
        let q = Queue::default();
        q.push(7);
        q.push(8);
        assert_eq!(q.take(), vec![7, 8]);
        assert!(q.take().is_empty());
        // A table installed before any node answered: the batch may have missed a copy.
        q.table_changed();
        assert_eq!(q.take(), vec![7, 8]);
        // Remembered still: every later table drops it again, within REDO_WITHIN.
        q.table_changed();
        assert_eq!(q.take(), vec![7, 8]);
    }

    #[test]
    fn batches_hold_at_most_batch_files_in_deletion_order() {
        let q = Queue::default();
        for f in 0..(BATCH as u64 + 3) {
            q.push(f);
        }
        let first = q.take();
        assert_eq!(first.len(), BATCH);
        assert_eq!(first[0], 0);
        assert_eq!(q.take(), vec![1024, 1025, 1026]);
    }
}
