//! `ibv_rereg_mr` in place (ibv_rereg_mr(3)): the MR keeps its slot, L_Key and R_Key, and gets a new PD, access
//! and/or translation (memory and virtual address).
//!
//! Rules (ibv_rereg_mr(3); rdma-core `tests/test_mr.py` `test_mr_rereg_*`, which use the keys read before the call
//! afterwards, as mlx5 keeps them; Linux `rxe_verbs.c` `rxe_rereg_user_mr` keeps the MR object and its keys too):
//! * the keys are unchanged, so a peer that learned the R_Key keeps using it;
//! * remote accesses are checked per packet against the new attributes (the responder resolves the R_Key for every
//!   packet), so a new access or PD applies to the next packet;
//! * a posted WQE that names the MR and has not started was checked against the old PD or memory: when the PD or
//!   the translation changes it fails when it is reached (receive: the WQE is marked bad, LOC_PROT_ERR when a
//!   message lands in it and the requester sees REM_OP_ERR; send: LOC_PROT_ERR), as an RNIC's DMA fails when it
//!   finds the address outside the new translation or the QP's PD different from the MR's;
//! * a send WQE already started reads the new memory at the offsets it resolved (bounds are re-checked at every
//!   access, so nothing outside the MR is ever read);
//! * with a new translation the old memory is given back: the engine never touches it again.
//!
//! Control path: scans the QPs and SRQs.

use crate::engine::Engine;
use crate::error::ResourceError;
use crate::mr::MrBuffer;
use crate::verbs::{AccessFlags, Lkey, MrInfo, PdHandle, WcStatus};

impl Engine {
    /// `ibv_rereg_mr`: gives the MR `lkey` the PD `pd`, the access `access` and, when `translation` is
    /// `Some((buffer, iova))`, new memory whose byte 0 has virtual address `iova`; the keys stay. Returns the MR's
    /// new [`MrInfo`] and the old memory if the translation changed. Errors (the MR unchanged, the new buffer
    /// dropped): `InvalidHandle` (unknown key or dead PD), `InvalidArgument` (as [`reg_mr`](Self::reg_mr): longer
    /// than `max_mr_size`, `iova + length` overflows, REMOTE_WRITE/REMOTE_ATOMIC without LOCAL_WRITE).
    pub fn rereg_mr(
        &mut self,
        lkey: Lkey,
        pd: PdHandle,
        access: AccessFlags,
        translation: Option<(MrBuffer, u64)>,
    ) -> Result<(MrInfo, Option<MrBuffer>), ResourceError> {
        let slot = self
            .mrs
            .slot(lkey)
            .ok_or(ResourceError::InvalidHandle("lkey"))?;
        if !self.pd_live(pd) {
            return Err(ResourceError::InvalidHandle("pd"));
        }
        if let Some((buf, iova)) = &translation {
            if buf.len() as u64 > self.cfg.device.max_mr_size {
                return Err(ResourceError::InvalidArgument("MR larger than max_mr_size"));
            }
            if iova.checked_add(buf.len() as u64).is_none() {
                return Err(ResourceError::InvalidArgument("iova + length overflows"));
            }
        }
        // IBTA: remote write/atomic access requires local write (as reg_mr).
        if access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
            && !access.contains(AccessFlags::LOCAL_WRITE)
        {
            return Err(ResourceError::InvalidArgument(
                "REMOTE_WRITE/REMOTE_ATOMIC require LOCAL_WRITE",
            ));
        }
        let old_pd = self.mrs.get(lkey).map(|m| m.pd);
        if translation.is_some() || old_pd != Some(pd) {
            self.fail_queued_wqes_naming(slot);
        }
        let mr = self
            .mrs
            .get_mut(lkey)
            .ok_or(ResourceError::InvalidHandle("lkey"))?;
        mr.pd = pd;
        mr.access = access;
        let old = translation.map(|(buf, iova)| {
            mr.addr = iova;
            mr.len = buf.len();
            std::mem::replace(&mut mr.buf, buf)
        });
        let info = MrInfo {
            lkey,
            rkey: crate::verbs::Rkey(lkey.0),
            addr: mr.addr,
            length: mr.len as u64,
        };
        Ok((info, old))
    }

    /// Marks every not yet started WQE that names MR slot `slot` as failing with a protection error when reached:
    /// receive WQEs of QPs and SRQs become `bad`, send WQEs get LOC_PROT_ERR.
    fn fail_queued_wqes_naming(&mut self, slot: u32) {
        let names = |segs: &[crate::qp::Seg]| segs.iter().any(|s| s.mr.slot == slot);
        for qp in self.qps.iter_mut().flatten() {
            let mut w = qp.sq.cur;
            while w != qp.sq.tail {
                let s = qp.sq.slot(w);
                if !qp.sq.wqes[s].started && names(qp.sq.segs(w)) {
                    let wqe = &mut qp.sq.wqes[s];
                    wqe.local_err.get_or_insert(WcStatus::LocProtErr);
                }
                w = w.wrapping_add(1);
            }
            mark_recv_bad(&mut qp.rq, slot);
        }
        for srq in self.srqs.iter_mut().flatten() {
            mark_recv_bad(&mut srq.rq, slot);
        }
    }
}

fn mark_recv_bad(rq: &mut crate::qp::RecvQueue, slot: u32) {
    let mut r = rq.head;
    while r != rq.tail {
        if rq.segs(r).iter().any(|s| s.mr.slot == slot) {
            let s = rq.slot(r);
            rq.wqes[s].bad = true;
        }
        r = r.wrapping_add(1);
    }
}
