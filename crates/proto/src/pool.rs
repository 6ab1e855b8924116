//! A free list of stripe-sized buffers.
//!
//! Touching fresh pages costs 3-8x more than reusing warm ones on the machines Tessera runs on,
//! so frame payloads are read into recycled buffers and stripes give theirs back when replaced.

use bytes::{Bytes, BytesMut};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

impl std::fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferPool")
            .field("buf_size", &self.buf_size)
            .field("idle", &self.idle())
            .finish()
    }
}

pub struct BufferPool {
    free: Mutex<Vec<BytesMut>>,
    buf_size: usize,
    max_free: usize,
    /// A pooled-size buffer was asked for since the last `trim`.
    drawn: AtomicBool,
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
        }
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
        free.truncate(keep);
        before - free.len()
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
}
