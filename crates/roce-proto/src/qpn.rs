//! The QPNs one engine hands out: a contiguous range of the 24-bit QPN space, entered at an offset drawn from the
//! engine's seed and walked cyclically (`docs/MULTIPROCESS.md`, "QPN range").
//!
//! Why an offset: every process is its own RNIC with its own engine, and the IB CM of a peer remembers the
//! (GID, CA GUID, QPN) of every live connection. A REQ from a QPN that a live connection there still uses is a
//! stale connection and is rejected with REJ reason 10 (IBTA Vol 1 §12.9.8.3, Linux `cm_req_handler` /
//! `cm_insert_remote_qpn`, `roce_cm`). A client that crashed (no DREQ) and is started again on the same address has
//! the same CA GUID (it comes from the port MAC, as a real RNIC's is fixed per device); had it also the same first
//! QPN, the peer would reject it until that peer restarted too. Linux rxe avoids this because its QPN pool is one
//! per device and allocates cyclically (`rxe_pool.c`: `xa_alloc_cyclic` with the pool's `next` cursor), so the next
//! QP never takes the number just used. Engines of successive processes share no cursor, so each starts at an
//! offset of its own: with random seeds two consecutive processes share a first QPN with probability 1 / (range
//! length), about 1.5 · 10⁻⁵ for a 65 519-QPN slot. Same seed, same QPNs (simulations and tests pin seeds).

use crate::Qpn;
use crate::engine::splitmix;

/// Largest QPN an engine hands out: QPNs are 24 bits (IBTA Vol 1 §9.2, BTH DestQP), and 0xFFFFFF is the DestQP of
/// every multicast packet (IBTA Vol 1 §10.5, `crate::mcast`), never a QP's number.
pub const MAX_QPN: u32 = 0xFF_FFFE;

/// Mixed into the engine seed for the offset draw so that it is a stream of its own (the engine's RNG that draws
/// PSNs and the IPv4 identification keeps its sequence).
const OFFSET_STREAM: u64 = 0x5150_4e5f_5241_4e47;

/// The QPN range of one engine: `first..=last`, numbered from `first + offset`, wrapping from `last` to `first`.
///
/// The n-th QP slot (n = 0, 1, ... in the order the engine takes fresh slots) has QPN
/// `first + (offset + n) mod len`, `len = last - first + 1`; [`index`](Self::index) is the inverse. Both are O(1),
/// no scans. `len` is at least the engine's `max_qp`, so every QP slot has its own QPN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpnRange {
    first: u32,
    len: u32,
    offset: u32,
}

impl QpnRange {
    /// The range `first..=last` for `max_qp` QPs, entered at an offset drawn from `seed`.
    ///
    /// Clamped so that it holds (as `EngineConfig::first_qpn` documents): `first` ≥ 2 (QP0/QP1 are the SMI and
    /// GSI, never handed out), `last` ≤ [`MAX_QPN`], and at least `max_qp` QPNs (`max_qp` itself taken in
    /// `1..=2^23`): when `first..=last` is shorter, `first` moves down to `MAX_QPN + 1 - max_qp` at most and `last`
    /// up.
    pub fn new(first: u32, last: u32, max_qp: u32, seed: u64) -> QpnRange {
        let need = max_qp.clamp(1, 1 << 23);
        let first = first.clamp(2, MAX_QPN + 1 - need);
        let last = last.min(MAX_QPN).max(first + need - 1);
        let len = last - first + 1;
        let mut s = seed ^ OFFSET_STREAM;
        let offset = (splitmix(&mut s) % u64::from(len)) as u32;
        QpnRange { first, len, offset }
    }

    /// The lowest QPN of the range.
    pub fn first(&self) -> u32 {
        self.first
    }

    /// The highest QPN of the range.
    pub fn last(&self) -> u32 {
        self.first + self.len - 1
    }

    /// How many QPNs the range holds (`last - first + 1`).
    pub fn len(&self) -> u32 {
        self.len
    }

    /// Always false: a range holds at least one QPN.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Where numbering starts, counted from [`first`](Self::first) (`0..len`).
    pub fn offset(&self) -> u32 {
        self.offset
    }

    /// The QPN of the `n`-th QP slot (`n` counted from 0; taken modulo [`len`](Self::len)).
    pub fn nth(&self, n: u32) -> Qpn {
        let k = (u64::from(self.offset) + u64::from(n)) % u64::from(self.len);
        Qpn::new(self.first + k as u32)
    }

    /// The slot number `n` with `nth(n) == qpn`, in `0..len`; `None` for a QPN outside the range.
    pub fn index(&self, qpn: u32) -> Option<u32> {
        let d = qpn.checked_sub(self.first)?;
        if d >= self.len {
            return None;
        }
        // Per packet (`Engine::qidx`): a compare instead of a division (`d` and `offset` are both below `len`).
        Some(if d >= self.offset {
            d - self.offset
        } else {
            d + (self.len - self.offset)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nth_and_index_are_inverse_and_wrap_inside_the_range() {
        let r = QpnRange::new(0x1_0000, 0x1_FFFF, 16_384, 7);
        assert_eq!(
            (r.first(), r.last(), r.len()),
            (0x1_0000, 0x1_FFFF, 0x1_0000)
        );
        for n in [
            0,
            1,
            100,
            0xFFFF,
            0x1_0000 - r.offset() - 1,
            0x1_0000 - r.offset(),
        ] {
            let q = r.nth(n).value();
            assert!((0x1_0000..=0x1_FFFF).contains(&q), "{q:#x}");
            assert_eq!(r.index(q), Some(n % 0x1_0000));
        }
        assert_eq!(r.index(0xFFFF), None);
        assert_eq!(r.index(0x2_0000), None);
        assert_eq!(
            r.nth(0x1_0000 - r.offset()).value(),
            0x1_0000,
            "wraps from last to first"
        );
    }

    #[test]
    fn clamping_keeps_qp0_qp1_out_24_bits_and_room_for_max_qp() {
        let r = QpnRange::new(0, 1, 8, 0);
        assert_eq!((r.first(), r.last()), (2, 9));
        let r = QpnRange::new(0xFF_FFFF, 0xFF_FFFF, 16, 0);
        assert_eq!((r.first(), r.last()), (MAX_QPN - 15, MAX_QPN));
        assert_eq!(MAX_QPN, 0xFF_FFFE, "the multicast DestQP is no QP's number");
        let r = QpnRange::new(0x11, 0xFFFF_FFFF, 16_384, 0);
        assert_eq!(r.last(), MAX_QPN);
        // The last slot of a shared address ends below the multicast DestQP.
        let r = QpnRange::new(0xFF_0000, 0xFF_FFFF, 16_384, 0);
        assert_eq!((r.first(), r.last()), (0xFF_0000, MAX_QPN));
    }
}
