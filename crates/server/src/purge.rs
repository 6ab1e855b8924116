//! Dropping the stripes of deleted files, by the server that deleted their inodes (as CephFS's
//! purge queue and Lustre's object destroys do): the unlink, rename or close that removed the
//! last link or handle is answered as soon as the inode is gone, and the file's stripes, spread
//! over every server, are dropped in the background, in batches. The space comes back a moment
//! after the answer (docs/SEMANTICS.md).
//!
//! Only the primary of the inode's partition queues a file (mirrors apply the same change but
//! stay quiet). A server that dies with files still queued leaves their stripes behind on the
//! others until the cluster ends, as a client dying between the two steps did when clients
//! sent the drops.

use crate::handler::NodeHandler;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tessera_placement::{Ino, NodeId};
use tessera_proto::{ErrorCode, Op, Request, Response};
use tokio::sync::Notify;
use tracing::{debug, warn};

/// Files per drop request.
const BATCH: usize = 1024;
/// How long a server keeps trying to reach another before giving up on its part of a batch
/// (a dead server is taken out of the table within seconds, which ends the wait sooner).
const PATIENCE: Duration = Duration::from_secs(30);
const RETRY: Duration = Duration::from_millis(50);

/// Deleted files, with their sizes, whose stripes are still to be dropped. Unbounded: eight
/// bytes per file, and drained as fast as the servers answer.
#[derive(Default)]
pub struct Queue {
    files: Mutex<Vec<(Ino, u64)>>,
    wake: Notify,
}

impl Queue {
    pub fn push(&self, file: Ino, size: u64) {
        self.files
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((file, size));
        self.wake.notify_one();
    }

    fn take(&self) -> Vec<(Ino, u64)> {
        let mut files = self.files.lock().unwrap_or_else(PoisonError::into_inner);
        let first = files.len().min(BATCH);
        let rest = files.split_off(first);
        std::mem::replace(&mut *files, rest)
    }
}

/// Drops queued files until the server stops.
pub async fn run(h: Arc<NodeHandler>) {
    loop {
        h.purge.wake.notified().await;
        loop {
            let files = h.purge.take();
            if files.is_empty() {
                break;
            }
            let Some(t) = h.table() else { continue };
            let nodes = t.info.table.nodes();
            futures::future::join_all(nodes.into_iter().map(|n| drop_at(&h, n, &files))).await;
        }
    }
}

/// Drops `files` on node `n`: done when it answered, or left the table.
async fn drop_at(h: &NodeHandler, n: NodeId, files: &[(Ino, u64)]) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let Some(t) = h.table() else { return };
        if !t.info.table.nodes().contains(&n) {
            return;
        }
        if n == h.node() {
            if let Err(e) = h.store.drop_files(t.held(), files) {
                warn!("dropping deleted files' stripes here: {e}");
            }
            return;
        }
        let req = Request::Op {
            epoch: t.info.table.epoch(),
            op: Op::DropFiles {
                files: files.to_vec(),
            },
        };
        let addr = t.info.nodes.iter().find(|a| a.id == n).map(|a| a.addr);
        let outcome = match addr {
            Some(addr) => match h.peers.get(addr).await {
                Ok(c) => c
                    .call(&req, bytes::Bytes::new())
                    .await
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            },
            None => Err(format!("node {n} has no address in the table")),
        };
        match outcome {
            Ok((Response::Error(ErrorCode::StaleEpoch { .. } | ErrorCode::NotReady(_)), _)) => {
                h.want_refresh();
            }
            Ok((Response::Error(e), _)) => {
                warn!(node = n, "a node refused to drop deleted files: {e}");
                return;
            }
            Ok(_) => return,
            Err(e) => {
                debug!(node = n, "dropping deleted files failed, retrying: {e}");
                h.want_refresh();
            }
        }
        if Instant::now() > deadline {
            warn!(
                node = n,
                files = files.len(),
                "gave up dropping deleted files' stripes: node unreachable for {PATIENCE:?}"
            );
            return;
        }
        tokio::time::sleep(RETRY).await;
    }
}
