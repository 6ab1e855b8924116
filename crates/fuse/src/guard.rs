//! The entry guard every kernel request passes before it is served, and where it is served.
//!
//! Creates answered ahead (`complete.rs`) are not on the servers yet: a request about the new
//! file, or about a name in the directory it goes into, waits until they land, and a request
//! through a handle whose create then failed fails as the create did. The guard decides that
//! wait for every request, and hands the handler a proof of it: [`Settled`] (nothing the
//! request is about is on its way), or [`Entered`] for the few that may be answered before
//! (from what this mount knows, or into a handle's buffer), which settle before they ask the
//! servers. Only this module makes either, and [`Fs::serve`] and [`Fs::spawn`], the ways a
//! request reaches the cluster from a worker or the runtime, take a `Settled`: a handler that
//! did not pass the guard cannot serve. The dispatch in `lib.rs` calls the guard and passes
//! what it returns, the open file or listing included, to the handler.
//!
//! Requests that pass no guard: `init` and `destroy` (the session's ends), `ioctl` and the
//! extended attributes (refused, but for the root's tracing switch) and `releasedir` (forgets
//! a snapshot); none reaches the servers.
//!
//! Where: a worker serves a request itself, its metadata requests on the worker's lane, while
//! at most half the workers do so ([`Fs::on_worker`]): requests waiting on a slow server never
//! take every worker. Past that, on the runtime, the worker returning to the kernel at once.

use crate::fs::{Fs, Listing, OpenFile};
use fuser::{Errno, FileHandle};
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Proof that no create answered ahead in or of the inodes a request is about is on its way.
pub(crate) struct Settled(());

/// A request passed the guard without waiting: it may answer from what this mount knows, but
/// settles ([`Entered::settle`]) before it asks the servers.
pub(crate) struct Entered(());

impl Entered {
    /// Waits for the creates answered ahead in, or of, these inodes (`Complete::settle`).
    pub(crate) fn settle(self, fs: &Fs, inos: &[u64]) -> Settled {
        if let Some(c) = fs.complete() {
            for &ino in inos {
                c.settle(ino);
            }
        }
        Settled(())
    }
}

/// This worker counted among those serving requests themselves; uncounted when dropped.
pub(crate) struct OnWorker<'a> {
    fs: &'a Fs,
    /// At most half the workers were serving requests themselves (this one included).
    pub(crate) free: bool,
}

impl Drop for OnWorker<'_> {
    fn drop(&mut self) {
        self.fs.inline.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Fs {
    /// For a request about `inos` (a file, or directories whose names it reads or changes).
    pub(crate) fn enter(&self, inos: &[u64]) -> Settled {
        Entered(()).settle(self, inos)
    }

    /// For a request that may be answered before the creates answered ahead land: a look-up
    /// this mount answers absent itself, a create answered ahead too.
    pub(crate) fn enter_ahead(&self) -> Entered {
        Entered(())
    }

    /// For a request through handle `fh` of `ino`: once its create is in, the handle, unless
    /// that create failed.
    pub(crate) fn enter_open(
        &self,
        ino: u64,
        fh: FileHandle,
    ) -> Result<(Settled, Arc<OpenFile>), Errno> {
        let settled = self.enter(&[ino]);
        Ok((settled, self.usable(fh)?))
    }

    /// For a write: a small one waits in the handle's buffer, and need not wait for the
    /// create answered ahead; the handle settles before its bytes go to the servers.
    pub(crate) fn enter_write(&self, fh: FileHandle) -> Result<(Entered, Arc<OpenFile>), Errno> {
        Ok((Entered(()), self.usable(fh)?))
    }

    /// For a FLUSH (every close): as [`Self::enter_open`], but no thread waits for the create
    /// answered ahead (most closes come right after one): `then` runs now, on this worker, or
    /// on the worker that lands the create (`Complete::after`), which answers it.
    pub(crate) fn enter_after(
        self: &Arc<Self>,
        ino: u64,
        fh: FileHandle,
        then: impl FnOnce(&Arc<Fs>, Result<(Settled, Arc<OpenFile>), Errno>) + Send + 'static,
    ) {
        let fs = Arc::clone(self);
        let then = move || {
            let h = fs.usable(fh).map(|h| (Settled(()), h));
            then(&fs, h);
        };
        match self.complete() {
            Some(c) => c.after(ino, then),
            None => then(),
        }
    }

    /// For a request on an open directory's snapshot: the directory was settled at opendir,
    /// and every entry in the snapshot is on the servers.
    pub(crate) fn enter_listing(&self, fh: FileHandle) -> Result<(Settled, Arc<Listing>), Errno> {
        let list = self.listing(fh).ok_or(Errno::EBADF)?;
        Ok((Settled(()), list))
    }

    /// Handle `fh`, unless its create answered ahead failed.
    fn usable(&self, fh: FileHandle) -> Result<Arc<OpenFile>, Errno> {
        let h = self.file(fh).ok_or(Errno::EBADF)?;
        match h.unmade() {
            Some(e) => Err(e),
            None => Ok(h),
        }
    }

    /// Counts this worker among those serving requests themselves, for as long as the result
    /// lives; `free` says whether it may.
    pub(crate) fn on_worker(&self) -> OnWorker<'_> {
        let free = self.inline.fetch_add(1, Ordering::AcqRel) < self.threads / 2;
        OnWorker { fs: self, free }
    }

    /// Serves a request on this FUSE worker if it may ([`Self::on_worker`]), else on the
    /// runtime.
    pub(crate) fn serve<F, Fut>(self: &Arc<Self>, _: Settled, f: F)
    where
        F: FnOnce(Arc<Fs>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let fut = f(Arc::clone(self));
        let worker = self.on_worker();
        if worker.free {
            self.here(fut);
        } else {
            self.rt.spawn(fut);
        }
    }

    /// Serves a request on the runtime: for listings (see the crate doc).
    pub(crate) fn spawn<F, Fut>(self: &Arc<Self>, _: Settled, f: F)
    where
        F: FnOnce(Arc<Fs>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.rt.spawn(f(Arc::clone(self)));
    }
}
