//! A free list of frame buffers: after warm-up, queuing a frame allocates nothing (`STYLE.md` D5).

/// Recycled `Vec<u8>` frame buffers.
#[derive(Debug, Default)]
pub(crate) struct FramePool {
    free: Vec<Vec<u8>>,
}

impl FramePool {
    /// A buffer holding a copy of `data` (recycled when one is free).
    pub(crate) fn copy_of(&mut self, data: &[u8]) -> Vec<u8> {
        let mut v = self.free.pop().unwrap_or_default();
        v.clear();
        v.extend_from_slice(data);
        v
    }

    /// Returns a buffer to the pool.
    pub(crate) fn put(&mut self, v: Vec<u8>) {
        self.free.push(v);
    }
}
