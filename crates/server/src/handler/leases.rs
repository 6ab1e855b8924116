//! The server's side of client leases (`crate::leases` holds the rules): renewals, and the
//! periodic look that lets the handles of holders that stopped renewing go.

use super::NodeHandler;
use crate::node::{err, ok, stale, Answer, Installed, Node};
use crate::store::lock;
use bytes::Bytes;
use std::sync::Arc;
use tessera_placement::{Epoch, Ino};
use tessera_proto::{ErrorCode, Op, Reply, Response};
use tokio::time::Instant;
use tracing::{debug, info};

impl NodeHandler {
    /// Renews `holder`'s lease here, unless its handles were let go already (`LeaseExpired`);
    /// a client behind this node's table is told so, to renew where its files are now.
    pub(super) fn renew(&self, t: &Installed, epoch: Epoch, holder: u64) -> Answer {
        let mut leases = lock(&self.leases);
        if leases.was_expired(holder) {
            return err(ErrorCode::LeaseExpired);
        }
        leases.renew(holder, Instant::now());
        let current = t.info.table.epoch();
        if epoch < current {
            return err(stale(current));
        }
        ok()
    }

    /// One look at the leases of the handles open in the partitions this node is primary of:
    /// the handles of holders that did not renew for a lease period are let go
    /// ([`Op::InodeRevoke`], replicated as any change).
    async fn expire_leases(self: &Arc<Self>) {
        let Some(t) = self.table() else { return };
        let table = &t.info.table;
        let mut open = Vec::new();
        for p in (0..table.partitions()).filter(|&p| table.primary(p) == Some(self.node)) {
            if let Ok(held) = self.store.open_holders(p) {
                open.extend(held.into_iter().map(|(ino, h)| (p, ino, h)));
            }
        }
        let now = Instant::now();
        let gone: Vec<(Ino, u64)> = {
            let since = lock(&self.primary_since);
            let mut leases = lock(&self.leases);
            let gone = open
                .iter()
                .filter(|&&(p, _, h)| leases.is_expired(h, since[p as usize], now))
                .map(|&(_, ino, h)| (ino, h))
                .collect();
            leases.prune(&open.iter().map(|&(_, _, h)| h).collect(), now);
            gone
        };
        for (ino, holder) in gone {
            let op = Op::InodeRevoke { ino, holder };
            let (resp, _) = match self.serve(None, table.epoch(), op, Bytes::new()) {
                Reply::Now(resp, payload) => (resp, payload),
                Reply::Later(answer) | Reply::Detached(answer) => answer.await,
            };
            match resp {
                Response::Error(e) => debug!(ino, holder, "letting an expired lease go: {e}"),
                _ => info!(
                    ino,
                    holder, "a client's lease ran out: its handle was let go"
                ),
            }
        }
    }

    /// Lets the handles of clients that stopped renewing go, for the server's life.
    pub(crate) async fn run_leases(self: Arc<Self>) {
        let every = lock(&self.leases).period() / 4;
        loop {
            tokio::time::sleep(every).await;
            self.expire_leases().await;
        }
    }

    /// `holder` opened or closed here: as good as a renewal.
    pub(super) fn renewed(&self, holder: u64) {
        lock(&self.leases).renew(holder, Instant::now());
    }
}
