//! Shared receive queues (`ibv_srq`, IBTA Vol 1 §10.2.9): one pool of receive WQEs that every QP created on it
//! ([`Engine::create_qp_srq`]) consumes, in post order, as messages arrive.
//!
//! Storage is a [`RecvQueue`] sized at [`Engine::create_srq`] (and again only by a resize through
//! [`Engine::modify_srq`], a control verb), so the per-packet path allocates nothing. A QP on an SRQ keeps a
//! one-WQE receive queue of its own: when a message needs a receive WQE and that queue is empty, the responder moves
//! the SRQ's oldest WQE into it ([`take_recv`], rxe `rxe_resp.c` `get_srq_wqe`), with its SGEs and MR leases; from
//! there it is used, completed on the QP's receive CQ, or flushed like any receive WQE of the QP. So a multi-packet
//! SEND keeps the WQE its FIRST packet took, and the rest of the responder is the same with or without an SRQ.
//!
//! Rules (IBTA Vol 1 §10.2.9; `ibv_create_srq(3)`, `ibv_modify_srq(3)`, `ibv_query_srq(3)`, `ibv_get_async_event(3)`;
//! rxe `rxe_srq.c` / `rxe_resp.c`):
//! * an empty SRQ is an empty receive queue: RC answers RNR NAK, UD and UC drop the message and count it
//!   (`drop_ud_no_recv` / `drop_uc_no_recv`);
//! * the limit ([`SrqAttr::srq_limit`]) is armed by `modify_srq(LIMIT)` (not by create: `ibv_create_srq(3)`); when a
//!   WQE taken from the SRQ leaves fewer than `srq_limit` WQEs, [`AsyncEventType::SrqLimitReached`] is raised once and
//!   the limit disarms (reads 0) until armed again;
//! * a QP on an SRQ that enters ERR raises [`AsyncEventType::QpLastWqeReached`] after its `QpFatal`: it takes no
//!   more WQEs from the SRQ; the SRQ's WQEs are not flushed (they belong to the SRQ, not to the QP);
//! * a WQE once taken stays with the QP that took it: a UD datagram too long for it is dropped and counted
//!   (`drop_ud_too_long`) and the WQE waits for that QP's next datagram, as on a QP with its own receive queue;
//! * `post_recv` on a QP on an SRQ is refused ([`PostErrorKind::QpOnSrq`]); `destroy_srq` is refused with `Busy`
//!   (EBUSY) while QPs use it; destroying it releases the MR leases of the WQEs still posted (no completions).

use std::collections::VecDeque;

use crate::engine::Engine;
use crate::error::{PostError, PostErrorKind, ResourceError};
use crate::qp::{Qp, RecvQueue};
use crate::verbs::{AsyncEvent, AsyncEventType, PdHandle, RecvWr, SrqAttr, SrqAttrMask, SrqHandle};

/// A shared receive queue.
#[derive(Debug)]
pub(crate) struct Srq {
    pub(crate) pd: PdHandle,
    /// The posted WQEs; `rq.cap` is the SRQ's `max_wr`.
    pub(crate) rq: RecvQueue,
    /// Armed limit (0 = not armed).
    pub(crate) limit: u32,
    /// QPs created on this SRQ and not destroyed.
    pub(crate) users: u32,
}

impl Srq {
    fn attr(&self) -> SrqAttr {
        SrqAttr {
            max_wr: self.rq.cap,
            max_sge: self.rq.max_sge,
            srq_limit: self.limit,
        }
    }
}

/// Whether `qp` has a receive WQE at its RQ head for the message that is starting: if its own queue is empty and it
/// is on an SRQ, the SRQ's oldest WQE is moved there first (its SGEs and MR leases go with it), and the limit event
/// is raised if that leaves the SRQ below its armed limit (`ibv_modify_srq(3)`; rxe `get_srq_wqe`: the count after
/// the removal is compared, and the limit is cleared when it fires). No allocation: the QP's one-WQE queue and the
/// event queue's room are reserved at create time.
pub(crate) fn take_recv(
    qp: &mut Qp,
    srqs: &mut [Option<Srq>],
    events: &mut VecDeque<AsyncEvent>,
) -> bool {
    if qp.rq.head != qp.rq.tail {
        return true;
    }
    let Some(h) = qp.srq else {
        return false;
    };
    let Some(srq) = srq_slot(srqs, h) else {
        return false;
    };
    if srq.rq.len() == 0 {
        return false;
    }
    let from = srq.rq.head;
    let w = *srq.rq.wqe(from);
    let src = srq.rq.slot(from) * srq.rq.max_sge as usize;
    let to = qp.rq.tail;
    let dst = qp.rq.slot(to) * qp.rq.max_sge as usize;
    let n = w.nsge as usize;
    qp.rq.segs[dst..dst + n].copy_from_slice(&srq.rq.segs[src..src + n]);
    let slot = qp.rq.slot(to);
    qp.rq.wqes[slot] = w;
    qp.rq.tail = to.wrapping_add(1);
    srq.rq.head = from.wrapping_add(1);
    if srq.limit != 0 && srq.rq.len() < srq.limit {
        srq.limit = 0;
        events.push_back(AsyncEvent {
            event_type: AsyncEventType::SrqLimitReached,
            qpn: None,
            cq: None,
            srq: Some(h),
        });
    }
    true
}

fn srq_slot(srqs: &mut [Option<Srq>], h: SrqHandle) -> Option<&mut Srq> {
    srqs.get_mut((h.0 as usize).wrapping_sub(1))
        .and_then(Option::as_mut)
}

impl Engine {
    pub(crate) fn srq_mut(&mut self, h: SrqHandle) -> Option<&mut Srq> {
        srq_slot(&mut self.srqs, h)
    }

    /// `ibv_create_srq`: an SRQ of protection domain `pd` with room for `max_wr` receive WQEs of up to `max_sge`
    /// SGEs each (0 SGEs is granted as 1). All storage is allocated here. The limit is not armed (`ibv_create_srq(3)`:
    /// `srq_limit` is ignored at creation; arm it with [`modify_srq`](Self::modify_srq)). Returns the handle and the
    /// granted attributes.
    ///
    /// Errors: `InvalidHandle("pd")`; `InvalidArgument` for `max_wr` 0 or above `max_srq_wr`, or `max_sge` above
    /// `max_srq_sge` (EINVAL, rxe `rxe_srq_chk_init`); `Exhausted("max_srq")` (ENOMEM).
    pub fn create_srq(
        &mut self,
        pd: PdHandle,
        max_wr: u32,
        max_sge: u32,
    ) -> Result<(SrqHandle, SrqAttr), ResourceError> {
        if !self.pd_live(pd) {
            return Err(ResourceError::InvalidHandle("pd"));
        }
        let d = self.cfg.device;
        if max_wr == 0 || max_wr > d.max_srq_wr {
            return Err(ResourceError::InvalidArgument(
                "srq max_wr must be 1..=max_srq_wr",
            ));
        }
        if max_sge > d.max_srq_sge {
            return Err(ResourceError::InvalidArgument(
                "srq max_sge exceeds max_srq_sge",
            ));
        }
        if self.srqs.iter().flatten().count() >= d.max_srq as usize {
            return Err(ResourceError::Exhausted("max_srq"));
        }
        let srq = Srq {
            pd,
            rq: RecvQueue::new(max_wr, max_sge),
            limit: 0,
            users: 0,
        };
        let attr = srq.attr();
        let idx = match self.srqs.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.srqs.push(None);
                self.srqs.len() - 1
            }
        };
        self.srqs[idx] = Some(srq);
        // Room for this SRQ's limit event, so raising it never allocates.
        self.events.reserve(1);
        Ok((SrqHandle(idx as u32 + 1), attr))
    }

    /// `ibv_query_srq`: capacity, SGEs per WR and the armed limit (0 once it fired or if never armed); `None` for a
    /// dead handle.
    pub fn query_srq(&self, srq: SrqHandle) -> Option<SrqAttr> {
        self.srqs
            .get((srq.0 as usize).wrapping_sub(1))
            .and_then(Option::as_ref)
            .map(Srq::attr)
    }

    /// WQEs posted on the SRQ and not yet taken by a QP; `None` for a dead handle.
    pub fn srq_outstanding(&self, srq: SrqHandle) -> Option<u32> {
        self.srqs
            .get((srq.0 as usize).wrapping_sub(1))
            .and_then(Option::as_ref)
            .map(|s| s.rq.len())
    }

    /// `ibv_modify_srq`. [`SrqAttrMask::MAX_WR`] resizes the SRQ to `attr.max_wr` WQEs, keeping those posted (in
    /// order); [`SrqAttrMask::LIMIT`] arms the limit event at `attr.srq_limit` (0 disarms). Checked as rxe
    /// `rxe_srq_chk_attr` does, nothing changed on error: `InvalidArgument` for `max_wr` 0, above `max_srq_wr`, below
    /// the WQEs now posted or below the armed (or newly given) limit, and for a limit above the SRQ's `max_wr`;
    /// `InvalidHandle("srq")`.
    pub fn modify_srq(
        &mut self,
        srq: SrqHandle,
        attr: &SrqAttr,
        mask: SrqAttrMask,
    ) -> Result<(), ResourceError> {
        let max_srq_wr = self.cfg.device.max_srq_wr;
        let s = self
            .srq_mut(srq)
            .ok_or(ResourceError::InvalidHandle("srq"))?;
        let new_cap = if mask.contains(SrqAttrMask::MAX_WR) {
            if attr.max_wr == 0 || attr.max_wr > max_srq_wr {
                return Err(ResourceError::InvalidArgument(
                    "srq max_wr must be 1..=max_srq_wr",
                ));
            }
            if attr.max_wr < s.rq.len() {
                return Err(ResourceError::InvalidArgument(
                    "srq max_wr below the WQEs posted",
                ));
            }
            attr.max_wr
        } else {
            s.rq.cap
        };
        let limit = if mask.contains(SrqAttrMask::LIMIT) {
            attr.srq_limit
        } else {
            s.limit
        };
        if limit > new_cap {
            return Err(ResourceError::InvalidArgument(
                "srq_limit exceeds the SRQ's max_wr",
            ));
        }
        if new_cap != s.rq.cap {
            let mut rq = RecvQueue::new(new_cap, s.rq.max_sge);
            let mut r = s.rq.head;
            while r != s.rq.tail {
                let t = rq.tail;
                let dst = rq.slot(t) * rq.max_sge as usize;
                let segs = s.rq.segs(r);
                rq.segs[dst..dst + segs.len()].copy_from_slice(segs);
                let slot = rq.slot(t);
                rq.wqes[slot] = *s.rq.wqe(r);
                rq.tail = t.wrapping_add(1);
                r = r.wrapping_add(1);
            }
            s.rq = rq;
        }
        s.limit = limit;
        Ok(())
    }

    /// `ibv_destroy_srq`. Refused with `Busy` (EBUSY, as the kernel's use count does) while QPs created on it exist;
    /// otherwise the WQEs still posted are discarded without completions and their MR leases released.
    pub fn destroy_srq(&mut self, srq: SrqHandle) -> Result<(), ResourceError> {
        let Engine { srqs, mrs, .. } = self;
        let i = (srq.0 as usize).wrapping_sub(1);
        let s = srqs
            .get_mut(i)
            .and_then(Option::as_mut)
            .ok_or(ResourceError::InvalidHandle("srq"))?;
        if s.users > 0 {
            return Err(ResourceError::Busy("SRQ has QPs"));
        }
        let mut r = s.rq.head;
        while r != s.rq.tail {
            for seg in s.rq.segs(r) {
                mrs.release(seg.mr.slot);
            }
            r = r.wrapping_add(1);
        }
        srqs[i] = None;
        Ok(())
    }

    /// Whether an SRQ of `pd` exists (`dealloc_pd` is refused while one does).
    pub(crate) fn pd_has_srq(&self, pd: PdHandle) -> bool {
        self.srqs.iter().flatten().any(|s| s.pd == pd)
    }

    /// `ibv_post_srq_recv`: posts receive WRs on the SRQ. As [`post_recv`](Self::post_recv): SGEs are checked
    /// against the SRQ's PD (lkey, bounds, LOCAL_WRITE) and leased now, a bad SGE is reported as LOC_PROT_ERR when a
    /// message lands in the WR. Errors name the first WR not posted (`bad_wr`): `UnknownSrq`, `TooManySges`
    /// (above the SRQ's `max_sge`), `QueueFull` (ENOMEM).
    pub fn post_srq_recv(&mut self, srq: SrqHandle, wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
        let Engine { srqs, mrs, .. } = self;
        let Some(s) = srq_slot(srqs, srq) else {
            return Err(PostError {
                index: 0,
                kind: PostErrorKind::UnknownSrq,
            });
        };
        for (index, wr) in wrs.iter().enumerate() {
            let fail = |kind| Err(PostError { index, kind });
            if wr.sg_list.len() > s.rq.max_sge as usize {
                return fail(PostErrorKind::TooManySges {
                    given: wr.sg_list.len(),
                    max: s.rq.max_sge,
                });
            }
            if s.rq.len() >= s.rq.cap {
                return fail(PostErrorKind::QueueFull);
            }
            s.rq.push(wr, s.pd, mrs);
        }
        Ok(())
    }
}

impl Engine {
    /// Receive WQEs posted to QP `qpn`'s own receive queue and not yet retired (completed or flushed); `None` for an
    /// unknown QP. A QP on an SRQ holds at most the one WQE it took. Lets a runtime that queues WRs before they reach
    /// the engine refuse a post that would exceed `max_recv_wr` (ibv_post_recv(3): ENOMEM when the queue is full).
    pub fn rq_len(&self, qpn: crate::Qpn) -> Option<u32> {
        let i = self.qidx(qpn)?;
        let qp = self.qps[i].as_deref()?;
        Some(qp.rq.tail.wrapping_sub(qp.rq.head))
    }
}
