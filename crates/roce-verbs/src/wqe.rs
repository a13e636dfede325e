//! Owned work-queue entries: what travels through a QP's lock-free ring from an application thread to the engine
//! thread (`STYLE.md` D6, §10 step ①).
//!
//! A [`roce_proto::SendWr`] borrows its SGE list and inline slices; a ring entry must own them. A WR with at most
//! [`INLINE_SGES`] SGEs carries them in its entry (the common case: one ring push per post); a longer list (up to
//! [`MAX_SGE`]) travels through a second ring of SGEs beside the WQE ring, sized at `create_qp` for the QP's granted
//! `max_*_sge` ([`wqe_ring`]), so no QP pays for 32 SGEs in every entry. Inline payload is copied into a fixed
//! [`MAX_INLINE`]-byte buffer. Nothing is allocated per post.

use roce_proto::{RecvWr, SendFlags, SendOp, SendWr, Sge, UdDest};

/// SGEs per work request the runtime carries: rxe's `RXE_MAX_SGE` (32), the engine's default `max_sge`
/// (`roce_proto::DeviceAttr::max_sge`); [`crate::Pd::create_qp`] refuses more.
pub const MAX_SGE: usize = 32;
/// Inline payload bytes per send work request the runtime carries (the engine's `max_inline_data` default).
pub const MAX_INLINE: usize = 256;
/// SGEs a ring entry carries itself; longer lists go through the QP's SGE ring.
pub(crate) const INLINE_SGES: usize = 4;

/// An SGE list as a ring entry holds it: the SGEs themselves when there are at most [`INLINE_SGES`], else only
/// their number (the SGEs follow in the QP's SGE ring, in post order).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SgeList {
    n: u8,
    sges: [Sge; INLINE_SGES],
}

impl SgeList {
    /// The entry form of `sges`; `None` if there are more than [`MAX_SGE`].
    fn new(sges: &[Sge]) -> Option<SgeList> {
        if sges.len() > MAX_SGE {
            return None;
        }
        let mut l = SgeList {
            n: sges.len() as u8,
            sges: [Sge::default(); INLINE_SGES],
        };
        if let Some(dst) = l.sges.get_mut(..sges.len()) {
            dst.copy_from_slice(sges);
        }
        Some(l)
    }

    /// Number of SGEs.
    pub(crate) fn len(&self) -> usize {
        self.n as usize
    }

    /// True when the SGEs are in the QP's SGE ring rather than in the entry.
    fn spilled(&self) -> bool {
        self.len() > INLINE_SGES
    }

    /// The SGEs: the entry's own, or the first [`Self::len`] of `spill` (filled by [`WqeConsumer::front`]).
    pub(crate) fn resolve<'a>(&'a self, spill: &'a [Sge; MAX_SGE]) -> &'a [Sge] {
        if self.spilled() {
            &spill[..self.len()]
        } else {
            &self.sges[..self.len()]
        }
    }
}

/// An entry of a QP ring (send or receive): gives its SGE list.
pub(crate) trait RingEntry {
    fn sges(&self) -> &SgeList;
}

/// An owned send work request.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SendWqe {
    pub(crate) wr_id: u64,
    pub(crate) op: SendOp,
    pub(crate) sges: SgeList,
    pub(crate) flags: SendFlags,
    pub(crate) ud: Option<UdDest>,
    inline_len: u16,
    inline: [u8; MAX_INLINE],
}

/// Why a WR cannot be carried by the ring (checked synchronously at post time).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WqeError {
    TooManySges,
    InlineTooLong,
}

impl RingEntry for SendWqe {
    fn sges(&self) -> &SgeList {
        &self.sges
    }
}

impl SendWqe {
    /// Copies `wr` (its SGEs, or their number when they spill, and, for inline WRs with application slices, the
    /// inline bytes).
    pub(crate) fn from_wr(wr: &SendWr<'_>) -> Result<SendWqe, WqeError> {
        let sges = SgeList::new(wr.sg_list).ok_or(WqeError::TooManySges)?;
        let mut inline = [0u8; MAX_INLINE];
        let mut len = 0usize;
        if wr.send_flags.contains(SendFlags::INLINE) {
            for part in wr.inline_data {
                let end = len + part.len();
                let dst = inline.get_mut(len..end).ok_or(WqeError::InlineTooLong)?;
                dst.copy_from_slice(part);
                len = end;
            }
        }
        Ok(SendWqe {
            wr_id: wr.wr_id,
            op: wr.op,
            sges,
            flags: wr.send_flags,
            ud: wr.ud,
            inline_len: len as u16,
            inline,
        })
    }

    /// Calls `f` with the borrowed form the engine takes; `spill` as [`SgeList::resolve`] takes it.
    pub(crate) fn with_wr<R>(&self, spill: &[Sge; MAX_SGE], f: impl FnOnce(&SendWr<'_>) -> R) -> R {
        let part: &[u8] = &self.inline[..self.inline_len as usize];
        let parts: [&[u8]; 1] = [part];
        let wr = SendWr {
            wr_id: self.wr_id,
            op: self.op,
            sg_list: self.sges.resolve(spill),
            inline_data: if self.inline_len > 0 { &parts } else { &[] },
            send_flags: self.flags,
            ud: self.ud,
        };
        f(&wr)
    }
}

/// An owned receive work request.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RecvWqe {
    pub(crate) wr_id: u64,
    pub(crate) sges: SgeList,
}

impl RingEntry for RecvWqe {
    fn sges(&self) -> &SgeList {
        &self.sges
    }
}

impl RecvWqe {
    pub(crate) fn from_wr(wr: &RecvWr<'_>) -> Result<RecvWqe, WqeError> {
        Ok(RecvWqe {
            wr_id: wr.wr_id,
            sges: SgeList::new(wr.sg_list).ok_or(WqeError::TooManySges)?,
        })
    }
}

/// One queue of a QP from the application to the engine: a single-producer single-consumer ring of entries and,
/// when the QP may post more than [`INLINE_SGES`] SGEs per WR, a ring of the spilled SGEs with room for
/// `max_wr * max_sge` (so it is never full while the entry ring has room). Both rings are allocated here, at
/// `create_qp`; the producer pushes a WR's spilled SGEs before its entry, so the consumer that sees the entry sees
/// the SGEs (rtrb publishes each push with a release store and reads with an acquire load).
pub(crate) fn wqe_ring<T: RingEntry>(
    max_wr: u32,
    max_sge: u32,
) -> (WqeProducer<T>, WqeConsumer<T>) {
    let (wp, wc) = rtrb::RingBuffer::<T>::new(max_wr.max(1) as usize);
    let (sp, sc) = if max_sge as usize > INLINE_SGES {
        let (p, c) = rtrb::RingBuffer::<Sge>::new(max_wr.max(1) as usize * max_sge as usize);
        (Some(p), Some(c))
    } else {
        (None, None)
    };
    (
        WqeProducer { wqes: wp, sges: sp },
        WqeConsumer { wqes: wc, sges: sc },
    )
}

/// The application side of [`wqe_ring`].
pub(crate) struct WqeProducer<T> {
    wqes: rtrb::Producer<T>,
    sges: Option<rtrb::Producer<Sge>>,
}

impl<T: RingEntry> WqeProducer<T> {
    /// Free entries.
    pub(crate) fn slots(&self) -> usize {
        self.wqes.slots()
    }

    /// Pushes `wqe`, whose SGE list was made from `sges` (spilled ones go to the SGE ring first).
    /// `TooManySges` if they spill and the QP was created without room for them (its `max_*_sge` ≤
    /// [`INLINE_SGES`]); a full ring is the caller's check ([`Self::slots`]).
    pub(crate) fn push(&mut self, wqe: T, sges: &[Sge]) -> Result<(), WqeError> {
        if wqe.sges().spilled() {
            let ring = self.sges.as_mut().ok_or(WqeError::TooManySges)?;
            if ring.slots() < sges.len() {
                return Err(WqeError::TooManySges);
            }
            for s in sges {
                let _ = ring.push(*s);
            }
        }
        // Cannot fail when the caller checked `slots`.
        let _ = self.wqes.push(wqe);
        Ok(())
    }
}

/// The engine side of [`wqe_ring`].
pub(crate) struct WqeConsumer<T> {
    wqes: rtrb::Consumer<T>,
    sges: Option<rtrb::Consumer<Sge>>,
}

impl<T: RingEntry> WqeConsumer<T> {
    /// Entries waiting.
    pub(crate) fn len(&self) -> usize {
        self.wqes.slots()
    }

    /// True when no entry is waiting.
    pub(crate) fn is_empty(&self) -> bool {
        self.wqes.is_empty()
    }

    /// The oldest entry, without consuming it; its spilled SGEs (if any) are copied into `spill` for
    /// [`SgeList::resolve`]. `None` when the ring is empty (or, never by construction, its SGEs are missing).
    pub(crate) fn front(&mut self, spill: &mut [Sge; MAX_SGE]) -> Option<&T> {
        let wqe = self.wqes.peek().ok()?;
        let l = wqe.sges();
        if l.spilled() {
            // Pushed before the entry, so present; if not (never), the entry waits rather than use stale SGEs.
            let chunk = self.sges.as_mut()?.read_chunk(l.len()).ok()?;
            let (a, b) = chunk.as_slices();
            spill[..a.len()].copy_from_slice(a);
            spill[a.len()..a.len() + b.len()].copy_from_slice(b);
        }
        Some(wqe)
    }

    /// Consumes the oldest entry and its spilled SGEs.
    pub(crate) fn pop(&mut self) {
        if let Ok(wqe) = self.wqes.pop() {
            let l = wqe.sges();
            if l.spilled()
                && let Some(chunk) = self.sges.as_mut().and_then(|r| r.read_chunk(l.len()).ok())
            {
                chunk.commit_all();
            }
        }
    }
}
