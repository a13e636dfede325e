//! Memory per idle QP through the runtime (issue #21): what `Pd::create_qp` costs in live heap bytes, the engine's
//! QP (`roce-proto` `tests/scale.rs`, `docs/TESTING.md`) plus the runtime's own per-QP objects.
//!
//! This binary installs a global allocator that keeps the number of live heap bytes; its one test measures with no
//! other test running.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, Ordering};

use roce_verbs::*;

struct Live;

static LIVE: AtomicI64 = AtomicI64::new(0);

// SAFETY: forwards every call to `System` unchanged; only counts sizes.
unsafe impl GlobalAlloc for Live {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as i64, Ordering::Relaxed);
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as i64, Ordering::Relaxed);
        // SAFETY: as `alloc`.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as i64 - l.size() as i64, Ordering::Relaxed);
        // SAFETY: as `alloc`.
        unsafe { System.realloc(p, l, new) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as i64, Ordering::Relaxed);
        // SAFETY: as `alloc`.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static GLOBAL: Live = Live;

/// RC QPs with 1-WR queues of one SGE each, created on one device after a warm-up of 1,024 (which sizes the
/// tables), measured over the next 15,360 (up to the device's `max_qp`, 16,384). Measured 3,747 B per QP: the
/// engine's about 2,030 B and the runtime's about 1,720 B, of which 1,024 B are the two WQE rings' headers (an
/// `rtrb::RingBuffer` has its head and tail each on a 128-byte line: 384 B, in a 128-byte aligned `Arc` block of
/// 512 B) and the rest the rings' one-entry buffers, the QP's handle object (`Arc`), its slot in the runtime's QP
/// table and QPN map, and two small shared flags. The bound is 4 KiB; the aim for the engine alone is 1 KiB.
#[test]
fn idle_qp_through_the_runtime() {
    let (ca, _cb) = Context::sim_pair(RuntimeConfig::default()).unwrap();
    let pd = ca.alloc_pd().unwrap();
    let cq = ca.create_cq(1 << 16, None, Moderation::default()).unwrap();
    let cap = QpCap {
        max_send_wr: 1,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let mut qps = Vec::with_capacity(16_384);
    for _ in 0..1024 {
        qps.push(pd.create_qp(QpType::Rc, &cq, &cq, cap, true).unwrap());
    }
    let before = LIVE.load(Ordering::Relaxed);
    for _ in 1024..16_384 {
        qps.push(pd.create_qp(QpType::Rc, &cq, &cq, cap, true).unwrap());
    }
    let per_qp = (LIVE.load(Ordering::Relaxed) - before) as f64 / 15_360.0;
    let ring = size_of::<rtrb::RingBuffer<u8>>();
    eprintln!(
        "memory per idle QP through roce-verbs: {per_qp:.0} B (an rtrb ring header: {ring} B)"
    );
    assert!(
        per_qp < 4096.0,
        "{per_qp:.0} B per idle QP through the runtime (measured 3,747 B)"
    );
}
