//! This client's lease on its open handles. Every open carries the lease's number (`holder`),
//! and a background task renews it at the servers of the open files, a small request to each
//! every third of the cluster's lease period (`ClusterConfig::open_lease`); a client that dies
//! stops renewing, and the servers let its handles go a period later (an unlinked file is then
//! deleted). A client that was only slow may learn that its lease ran out: it takes a new
//! number, and the handles opened under the old one fail from then on (EIO), as on NFS.

use crate::route::Router;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use tessera_placement::Ino;
use tracing::warn;

pub(crate) struct Lease {
    holder: AtomicU64,
    /// Handles open per inode: where the lease is to be renewed.
    open: Mutex<HashMap<Ino, u32>>,
}

fn new_holder() -> u64 {
    rand::random::<u64>().max(1)
}

impl Lease {
    pub(crate) fn new() -> Self {
        Self {
            holder: AtomicU64::new(new_holder()),
            open: Mutex::default(),
        }
    }

    /// The number opens carry now.
    pub(crate) fn holder(&self) -> u64 {
        self.holder.load(Ordering::Relaxed)
    }

    /// Is a handle opened under `holder` still covered by the lease?
    pub(crate) fn covers(&self, holder: u64) -> bool {
        self.holder() == holder
    }

    fn open(&self) -> std::sync::MutexGuard<'_, HashMap<Ino, u32>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn opened(&self, ino: Ino) {
        *self.open().entry(ino).or_default() += 1;
    }

    pub(crate) fn closed(&self, ino: Ino) {
        if let std::collections::hash_map::Entry::Occupied(mut n) = self.open().entry(ino) {
            *n.get_mut() -= 1;
            if *n.get() == 0 {
                n.remove();
            }
        }
    }

    fn open_inos(&self) -> Vec<Ino> {
        self.open().keys().copied().collect()
    }

    /// A server let `holder`'s handles go: later opens carry a new number.
    fn lost(&self, holder: u64) {
        let fresh = new_holder();
        if self
            .holder
            .compare_exchange(holder, fresh, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            warn!("this client's lease ran out: files it had open fail from now on");
        }
    }
}

/// Renews `lease` while the client (its router) lives.
pub(crate) async fn renew(router: Weak<Router>, lease: Arc<Lease>) {
    loop {
        let Some(every) = router.upgrade().map(|r| r.config().open_lease() / 3) else {
            return;
        };
        tokio::time::sleep(every).await;
        let Some(router) = router.upgrade() else {
            return;
        };
        let inos = lease.open_inos();
        if inos.is_empty() {
            continue;
        }
        let holder = lease.holder();
        // A server that does not answer in time is asked again next round.
        let expired = tokio::time::timeout(every, router.renew(holder, &inos)).await;
        if expired == Ok(true) {
            lease.lost(holder);
        }
    }
}
