//! A free list of frame buffers: after warm-up, queuing a frame allocates nothing (`STYLE.md` D5).

/// Recycled `Vec<u8>` frame buffers.
#[derive(Debug, Default)]
pub(crate) struct FramePool {
    free: Vec<Vec<u8>>,
    /// Capacity of a newly allocated buffer (at least the frame's length), so that a recycled buffer never has to
    /// grow for a later, longer frame.
    frame_cap: usize,
}

impl FramePool {
    /// A pool whose buffers hold frames of up to `frame_cap` bytes without growing.
    pub(crate) fn with_frame_cap(frame_cap: usize) -> Self {
        FramePool {
            free: Vec::new(),
            frame_cap,
        }
    }

    /// A buffer holding a copy of `data` (recycled when one is free).
    pub(crate) fn copy_of(&mut self, data: &[u8]) -> Vec<u8> {
        let mut v = self
            .free
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(self.frame_cap.max(data.len())));
        v.clear();
        v.extend_from_slice(data);
        v
    }

    /// Adds `n` free buffers of `frame_cap` bytes, so the next `n` frames in flight take no allocation.
    pub(crate) fn reserve(&mut self, n: usize) {
        self.free.reserve(n);
        let cap = self.frame_cap;
        self.free.extend((0..n).map(|_| Vec::with_capacity(cap)));
    }

    /// Returns a buffer to the pool.
    pub(crate) fn put(&mut self, v: Vec<u8>) {
        self.free.push(v);
    }
}
