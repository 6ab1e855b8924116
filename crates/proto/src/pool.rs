//! A free list of stripe-sized buffers.
//!
//! Touching fresh pages costs 3-8x more than reusing warm ones on the machines Tessera runs on,
//! so frame payloads are read into recycled buffers and stripes give theirs back when replaced.
//! A pool may also be given a number of buffers to pre-fault ([`BufferPool::with_prefault`]):
//! its owner touches them while idle ([`BufferPool::prefault`]), so writes of new data find
//! memory the kernel has already zeroed and mapped.

use bytes::{Bytes, BytesMut};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

impl std::fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferPool")
            .field("buf_size", &self.buf_size)
            .field("idle", &self.idle())
            .field("prefault", &self.prefault)
            .finish()
    }
}

pub struct BufferPool {
    free: Mutex<Vec<BytesMut>>,
    buf_size: usize,
    max_free: usize,
    /// A pooled-size buffer was asked for since the last `trim`.
    drawn: AtomicBool,
    /// The same, since the last `quiet`.
    busy: AtomicBool,
    /// Buffers to keep pre-faulted: held through trims, and `max_free` is at least this.
    prefault: usize,
}

impl BufferPool {
    /// A pool of buffers of `buf_size` bytes keeping at most `max_free` idle ones.
    #[must_use]
    pub fn new(buf_size: usize, max_free: usize) -> Self {
        Self {
            free: Mutex::new(Vec::new()),
            buf_size,
            max_free,
            drawn: AtomicBool::new(false),
            busy: AtomicBool::new(false),
            prefault: 0,
        }
    }

    /// The same pool, keeping up to `bufs` buffers pre-faulted once [`BufferPool::prefault`]
    /// has filled it (never freed by `trim`).
    #[must_use]
    pub fn with_prefault(mut self, bufs: usize) -> Self {
        self.prefault = bufs;
        self.max_free = self.max_free.max(bufs);
        self
    }

    /// Size of the pooled buffers.
    #[must_use]
    pub fn buf_size(&self) -> usize {
        self.buf_size
    }

    /// An empty buffer with room for at least `len` bytes. Only large requests are served from
    /// the pool: a small one gets a buffer of its own size, so small payloads kept by a store do
    /// not each pin a stripe-sized buffer.
    #[must_use]
    pub fn get(&self, len: usize) -> BytesMut {
        if len <= self.buf_size && len > self.buf_size / 2 {
            self.drawn.store(true, Ordering::Relaxed);
            self.busy.store(true, Ordering::Relaxed);
            if let Some(b) = self.lock().pop() {
                return b;
            }
            return BytesMut::with_capacity(self.buf_size);
        }
        BytesMut::with_capacity(len)
    }

    /// Returns a buffer to the pool (dropped if the pool is full or it is too small).
    pub fn put(&self, mut b: BytesMut) {
        if b.capacity() < self.buf_size {
            return;
        }
        b.clear();
        let mut free = self.lock();
        if free.len() < self.max_free {
            free.push(b);
        }
    }

    /// Returns a frozen buffer if nobody else holds a reference to it.
    pub fn recycle(&self, b: Bytes) {
        if let Ok(m) = b.try_into_mut() {
            self.put(m);
        }
    }

    /// Frees the idle buffers beyond `keep` if none was asked for since the last call: called
    /// periodically, a pool that served a burst of writes gives its memory back once the burst
    /// is over (the pool is for reuse within a workload, not memory held for good). Returns
    /// how many it freed.
    pub fn trim(&self, keep: usize) -> usize {
        if self.drawn.swap(false, Ordering::Relaxed) {
            return 0;
        }
        let mut free = self.lock();
        let before = free.len();
        free.truncate(keep.max(self.prefault));
        before - free.len()
    }

    /// Whether no pooled-size buffer was asked for since the last call (tracked apart from
    /// `trim`'s flag, so the two callers do not steal each other's news).
    pub fn quiet(&self) -> bool {
        !self.busy.swap(false, Ordering::Relaxed)
    }

    /// Adds up to `step` pre-faulted buffers, while fewer than the pool's prefault target and
    /// `limit` are idle; returns how many it added. Each buffer's pages are written once, so
    /// the kernel faults and zeroes them here rather than under a write: slow (it is most of
    /// what a write of fresh memory costs), so call it from a blocking thread, while idle.
    pub fn prefault(&self, limit: usize, step: usize) -> usize {
        let target = self.prefault.min(limit);
        let want = target.saturating_sub(self.idle()).min(step);
        // Touched outside the lock, which writes and reads take.
        let fresh: Vec<BytesMut> = (0..want)
            .map(|_| {
                // Written, not `zeroed`: a zeroed allocation of fresh pages is left untouched.
                let mut b = BytesMut::with_capacity(self.buf_size);
                b.resize(self.buf_size, 0);
                b.clear();
                b
            })
            .collect();
        let mut free = self.lock();
        let room = target.saturating_sub(free.len());
        let added = room.min(fresh.len());
        free.extend(fresh.into_iter().take(added));
        added
    }

    /// How many buffers the pool keeps pre-faulted.
    #[must_use]
    pub fn prefault_target(&self) -> usize {
        self.prefault
    }

    /// Idle buffers held.
    #[must_use]
    pub fn idle(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<BytesMut>> {
        // A panic while holding this lock cannot leave the list inconsistent.
        self.free
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuses_buffers() {
        let pool = BufferPool::new(1024, 2);
        let mut a = pool.get(1000);
        a.extend_from_slice(b"hello");
        let ptr = a.as_ptr();
        pool.recycle(a.freeze());
        assert_eq!(pool.idle(), 1);
        let b = pool.get(1000);
        assert_eq!(b.as_ptr(), ptr, "the same memory comes back");
        assert!(b.is_empty());
        // Shared buffers are not recycled; oversized requests bypass the pool.
        assert!(
            pool.get(5).capacity() < 1024,
            "small requests are not pooled"
        );
        let c = pool.get(600).freeze();
        let _held = c.clone();
        pool.recycle(c);
        assert_eq!(pool.idle(), 0);
        assert!(pool.get(4096).capacity() >= 4096);
    }

    #[test]
    fn trims_only_after_a_quiet_spell() {
        let pool = BufferPool::new(1024, 8);
        let bufs: Vec<_> = (0..6).map(|_| pool.get(1000)).collect();
        for b in bufs {
            pool.put(b);
        }
        assert_eq!(pool.idle(), 6);
        assert_eq!(pool.trim(2), 0, "buffers were taken since the last trim");
        assert_eq!(pool.trim(2), 4, "a quiet spell frees all but `keep`");
        assert_eq!(pool.idle(), 2);
        let _small = pool.get(5);
        assert_eq!(pool.trim(0), 2, "small requests do not count as use");
        assert_eq!(pool.trim(0), 0);
    }

    #[test]
    fn prefaults_up_to_its_target_in_steps_and_keeps_them() {
        let pool = BufferPool::new(1024, 2).with_prefault(5);
        assert_eq!(pool.prefault(usize::MAX, 2), 2);
        assert_eq!(pool.prefault(usize::MAX, 2), 2);
        assert_eq!(pool.prefault(usize::MAX, 2), 1, "stops at the target");
        assert_eq!(pool.prefault(usize::MAX, 2), 0);
        assert_eq!(pool.idle(), 5);
        // Quiet spells do not take them back, and neither does trim's `keep`.
        assert_eq!(pool.trim(0), 0);
        assert_eq!(pool.trim(0), 0);
        assert_eq!(pool.idle(), 5);
        // Writes take them; returned ones are kept up to the target, not just `max_free`.
        let taken: Vec<_> = (0..5).map(|_| pool.get(1000)).collect();
        assert!(taken.iter().all(|b| b.capacity() >= 1024 && b.is_empty()));
        assert_eq!(pool.idle(), 0);
        assert!(!pool.quiet(), "a draw is news to the prefaulter");
        assert!(pool.quiet());
        for b in taken {
            pool.put(b);
        }
        assert_eq!(pool.idle(), 5);
        // A limit below the target (memory the server has room for) bounds the fill.
        let small = BufferPool::new(1024, 2).with_prefault(5);
        assert_eq!(small.prefault(3, 10), 3);
        assert_eq!(small.prefault(3, 10), 0);
        assert_eq!(small.idle(), 3);
        // No target, nothing prefaulted.
        assert_eq!(BufferPool::new(1024, 2).prefault(usize::MAX, 4), 0);
    }
}
