//! Memory per idle QP (issue #21), the part fixed by type layout: what every QP carries whether it is used or not.
//! The whole (heap bytes counted by a counting allocator over 16,384 RC QPs: the QP record, its queues, its room in
//! the engine's tables) is measured by `tests/scale.rs`; `docs/TESTING.md` has the breakdown.

use core::mem::{align_of, size_of};

use crate::qp::{Qp, ReqCtx};
use crate::timer::{Entry, QpTimers};

/// The QP record is at most 22 cache lines (1,408 B: 1,344 B before the responder's response queue kept its own count
/// of owed READ/atomic responses, whose 8 B crossed into a 22nd line; it was 1,472 B with 16-byte
/// `Option<Instant>` timer slots),
/// cache-line aligned, with the requester's hot state in one line of its own; a QP's ten timer slots take 88 B
/// (8-byte instants with a sentinel) and a timer heap entry 16 B (QPN and kind in one word; it was 24 B): the
/// engine reserves ten heap entries per QP, so that is 160 B per QP instead of 240 B.
#[test]
fn idle_qp_parts_stay_small() {
    assert!(size_of::<Qp>() <= 1408, "Qp record {} B", size_of::<Qp>());
    assert_eq!(align_of::<Qp>(), 64);
    assert_eq!((size_of::<ReqCtx>(), align_of::<ReqCtx>()), (64, 64));
    assert_eq!(size_of::<QpTimers>(), 88);
    assert_eq!(size_of::<Entry>(), 16);
}
