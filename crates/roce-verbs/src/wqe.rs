//! Owned work-queue entries: what travels through a QP's lock-free ring from an application thread to the engine
//! thread (`STYLE.md` D6, §10 step ①).
//!
//! A [`roce_proto::SendWr`] borrows its SGE list and inline slices; a ring entry must own them, so SGEs are copied
//! into a fixed array of [`MAX_SGE`] and inline payload into a fixed [`MAX_INLINE`]-byte buffer. Nothing is
//! allocated per post.

use roce_proto::{RecvWr, SendFlags, SendOp, SendWr, Sge, UdDest};

/// SGEs per work request the runtime carries (the engine may allow more; the ring entry is fixed-size).
pub const MAX_SGE: usize = 4;
/// Inline payload bytes per send work request the runtime carries (the engine's `max_inline_data` default).
pub const MAX_INLINE: usize = 256;

/// A fixed-capacity SGE list.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SgeList {
    n: u8,
    sges: [Sge; MAX_SGE],
}

impl SgeList {
    /// Copies `sges`; `None` if there are more than [`MAX_SGE`].
    pub(crate) fn new(sges: &[Sge]) -> Option<SgeList> {
        if sges.len() > MAX_SGE {
            return None;
        }
        let mut l = SgeList {
            n: sges.len() as u8,
            sges: [Sge::default(); MAX_SGE],
        };
        l.sges[..sges.len()].copy_from_slice(sges);
        Some(l)
    }

    pub(crate) fn as_slice(&self) -> &[Sge] {
        &self.sges[..self.n as usize]
    }
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

impl SendWqe {
    /// Copies `wr` (its SGEs and, for inline WRs with application slices, the inline bytes).
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

    /// Calls `f` with the borrowed form the engine takes.
    pub(crate) fn with_wr<R>(&self, f: impl FnOnce(&SendWr<'_>) -> R) -> R {
        let part: &[u8] = &self.inline[..self.inline_len as usize];
        let parts: [&[u8]; 1] = [part];
        let wr = SendWr {
            wr_id: self.wr_id,
            op: self.op,
            sg_list: self.sges.as_slice(),
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

impl RecvWqe {
    pub(crate) fn from_wr(wr: &RecvWr<'_>) -> Result<RecvWqe, WqeError> {
        Ok(RecvWqe {
            wr_id: wr.wr_id,
            sges: SgeList::new(wr.sg_list).ok_or(WqeError::TooManySges)?,
        })
    }
}
