//! Memory windows (IBTA Vol 1 §10.6.7; `ibv_alloc_mw`, `ibv_bind_mw`, `IBV_WR_BIND_MW`, `IBV_WR_LOCAL_INV`,
//! SEND with invalidate), the facts as Linux rxe's `rxe_mw.c` applies them.
//!
//! A window is a second R_Key onto part of an MR: bound (a local operation on a send queue) to `length` bytes at
//! `addr` of an MR registered with MW_BIND, with remote rights of its own; remote accesses through its key are
//! checked against the window (key, PD, for type 2 the QP it was bound through, bounds, rights) and then translated
//! through the MR. Type 1 windows are bound by `ibv_bind_mw` (a BIND_MW WR the library posts) and stay valid until
//! rebound (length 0 unbinds) or deallocated; type 2 (2B) windows are bound by a BIND_MW WR to one QP and freed by
//! LOCAL_INV or a SEND with invalidate naming their key.
//!
//! Keys: bit 31 set (MR keys stay below 2^24, `max_mr` ≤ 2^16), slot + 1 in bits 30..8, the key byte in 7..0 — the
//! consumer-owned part (IBTA §10.6.3.1) that each bind replaces with the low byte of the WR's `rkey`. The table
//! lives inside the MR table so every remote check (`MrTable::check_remote`) resolves both kinds by key, without a
//! search. A window holds no lease on its MR: it names it by key, so when the MR is deregistered the window no
//! longer resolves (and [`MwTable::unbind_mr`] unbinds it at once, so a later MR in the same slot is never reached
//! through it).

use crate::engine::Engine;
use crate::error::ResourceError;
use crate::mr::{MrFault, MrRef, MrTable};
use crate::verbs::{AccessFlags, Lkey, PdHandle, Rkey, SendOp, WcStatus};
use roce_wire::Qpn;

/// Bit 31 of every window key (no MR key has it).
pub(crate) const MW_KEY_BIT: u32 = 1 << 31;
/// Most windows a table holds (slot + 1 must fit bits 30..8).
const MAX_SLOTS: u32 = (1 << 23) - 1;

/// Memory window type (`enum ibv_mw_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MwType {
    /// IBV_MW_TYPE_1: bound with `ibv_bind_mw`, associated with a PD.
    Type1 = 1,
    /// IBV_MW_TYPE_2 (2B): bound by a BIND_MW WR, associated with the QP that bound it.
    Type2 = 2,
}

impl MwType {
    /// From `enum ibv_mw_type`; `None` for any other value.
    pub fn from_raw(v: u32) -> Option<MwType> {
        match v {
            1 => Some(MwType::Type1),
            2 => Some(MwType::Type2),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Binding {
    /// The MR's key (its L_Key).
    mr_key: u32,
    addr: u64,
    len: u64,
    access: AccessFlags,
    /// Type 2: the QP it was bound through (the only one that may use it).
    qp: Option<Qpn>,
}

#[derive(Clone, Copy, Debug)]
struct Mw {
    pd: PdHandle,
    ty: MwType,
    key: u32,
    bound: Option<Binding>,
}

/// The windows of one engine (inside [`MrTable`]).
#[derive(Debug, Default)]
pub(crate) struct MwTable {
    slots: Vec<Option<Mw>>,
    gens: Vec<u8>,
    free: Vec<u32>,
    live: u32,
}

/// Why a bind failed (the WR completes MW_BIND_ERR).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BindError(pub(crate) &'static str);

impl MwTable {
    fn slot_of(&self, key: u32) -> Option<usize> {
        if key & MW_KEY_BIT == 0 {
            return None;
        }
        let s = ((key & !MW_KEY_BIT) >> 8).checked_sub(1)? as usize;
        matches!(self.slots.get(s), Some(Some(_))).then_some(s)
    }

    fn alloc(&mut self, pd: PdHandle, ty: MwType, random: u64) -> Option<Rkey> {
        let s = match self.free.pop() {
            Some(s) => s,
            None => {
                if self.slots.len() as u32 >= MAX_SLOTS {
                    return None;
                }
                self.slots.push(None);
                self.gens.push(0);
                (self.slots.len() - 1) as u32
            }
        };
        let g = &mut self.gens[s as usize];
        *g = g.wrapping_add(1 + (random % 255) as u8);
        let key = MW_KEY_BIT | ((s + 1) << 8) | u32::from(*g);
        self.slots[s as usize] = Some(Mw {
            pd,
            ty,
            key,
            bound: None,
        });
        self.live += 1;
        Some(Rkey(key))
    }

    fn dealloc(&mut self, mw: Rkey) -> bool {
        let Some(s) = self.slot_of(mw.0) else {
            return false;
        };
        // The slot's next window starts from the last key byte used, so its first key differs from it.
        if let Some(w) = self.slots[s].take() {
            self.gens[s] = (w.key & 0xff) as u8;
        }
        self.free.push(s as u32);
        self.live -= 1;
        true
    }

    pub(crate) fn pd_in_use(&self, pd: PdHandle) -> bool {
        self.slots.iter().flatten().any(|w| w.pd == pd)
    }

    /// Whether a window is bound to the MR with key `mr_key` (control path; scans the windows).
    pub(crate) fn bound_to(&self, mr_key: u32) -> bool {
        self.slots
            .iter()
            .flatten()
            .any(|w| w.bound.is_some_and(|b| b.mr_key == mr_key))
    }

    /// The MR with key `mr_key` goes away: every window bound to it is unbound (control path; scans the windows).
    pub(crate) fn unbind_mr(&mut self, mr_key: u32) {
        for w in self.slots.iter_mut().flatten() {
            if w.bound.is_some_and(|b| b.mr_key == mr_key) {
                w.bound = None;
            }
        }
    }

    /// Remote access through window key `rkey` by QP `qpn` of PD `pd` (rxe `rxe_lookup_mw` + bounds): the MR key it
    /// is bound to. Errors: [`MrFault`] as an MR check.
    fn resolve(
        &self,
        rkey: u32,
        pd: PdHandle,
        qpn: Qpn,
        addr: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<u32, MrFault> {
        let s = self.slot_of(rkey).ok_or(MrFault::BadKey)?;
        let w = self.slots[s].as_ref().ok_or(MrFault::BadKey)?;
        if w.key != rkey {
            return Err(MrFault::BadKey);
        }
        if w.pd != pd {
            return Err(MrFault::WrongPd);
        }
        let b = w.bound.ok_or(MrFault::BadKey)?;
        if b.qp.is_some_and(|q| q != qpn) || b.len == 0 {
            return Err(MrFault::BadKey);
        }
        if !b.access.contains(need) {
            return Err(MrFault::Access);
        }
        let off = addr.checked_sub(b.addr).ok_or(MrFault::OutOfBounds)?;
        if off.checked_add(len).is_none_or(|end| end > b.len) {
            return Err(MrFault::OutOfBounds);
        }
        Ok(b.mr_key)
    }

    /// Invalidates a type 2 window by key (LOCAL_INV, or SEND with invalidate received on QP `by_qp`): it becomes
    /// free (unbound). False if `rkey` is not a bound type 2 window of `pd` with exactly this key (or, remotely, was
    /// bound through another QP): type 1 windows cannot be invalidated (IBTA C10-71; rxe `rxe_invalidate_mw`).
    fn invalidate(&mut self, rkey: u32, pd: PdHandle, by_qp: Option<Qpn>) -> bool {
        let Some(s) = self.slot_of(rkey) else {
            return false;
        };
        let Some(w) = self.slots[s].as_mut() else {
            return false;
        };
        let ok = w.key == rkey
            && w.pd == pd
            && w.ty == MwType::Type2
            && w.bound
                .is_some_and(|b| by_qp.is_none_or(|q| b.qp == Some(q)));
        if ok {
            w.bound = None;
        }
        ok
    }
}

impl MrTable {
    /// Remote check of a window key (called by `check_remote` for keys with [`MW_KEY_BIT`]): the window's rules,
    /// then the MR's bounds (its own rights do not matter: the window's were checked against them at bind).
    pub(crate) fn check_remote_mw(
        &self,
        rkey: Rkey,
        pd: PdHandle,
        qpn: Qpn,
        addr: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<MrRef, MrFault> {
        let mr_key = self.mws.resolve(rkey.0, pd, qpn, addr, len, need)?;
        self.check_local(Lkey(mr_key), pd, addr, len, AccessFlags::EMPTY)
    }

    /// SEND with invalidate received on QP `qpn` naming a window key (see [`MwTable::invalidate`]).
    pub(crate) fn invalidate_mw_remote(&mut self, rkey: Rkey, pd: PdHandle, qpn: Qpn) -> bool {
        self.mws.invalidate(rkey.0, pd, Some(qpn))
    }

    /// Executes a bind (IBTA §10.6.7.2; the checks of rxe `rxe_check_bind_mw`) for QP `qpn` of PD `pd`.
    fn bind_mw(&mut self, pd: PdHandle, qpn: Qpn, op: &SendOp) -> Result<(), BindError> {
        let SendOp::BindMw {
            mw,
            rkey,
            mr,
            addr,
            length,
            access,
        } = *op
        else {
            return Err(BindError("not a bind"));
        };
        let s = self.mws.slot_of(mw.0).ok_or(BindError("unknown window"))?;
        let w = self.mws.slots[s].ok_or(BindError("unknown window"))?;
        if (rkey.0 | MW_KEY_BIT) >> 8 != w.key >> 8 {
            return Err(BindError("new key names another window"));
        }
        if w.pd != pd {
            // C10-72 (type 2) and the type 1 rule of `ibv_bind_mw`: the window is in the QP's PD.
            return Err(BindError("window of another PD"));
        }
        if w.ty == MwType::Type2 && w.bound.is_some() {
            return Err(BindError("type 2 window already bound (o10-37.2.30)"));
        }
        let remote =
            AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
        if !remote.contains(access) {
            return Err(BindError(
                "window rights other than remote read/write/atomic",
            ));
        }
        let new_key = (w.key & !0xff) | (rkey.0 & 0xff);
        if length == 0 {
            if w.ty == MwType::Type2 {
                return Err(BindError(
                    "zero-length bind of a type 2 window (o10-37.2.40)",
                ));
            }
            // Type 1: a zero-length bind unbinds (the window keeps its new key, reaches nothing).
            if let Some(m) = self.mws.slots[s].as_mut() {
                m.key = new_key;
                m.bound = None;
            }
            return Ok(());
        }
        let m = self.get(mr).ok_or(BindError("unknown MR"))?;
        if m.pd != pd {
            return Err(BindError("MR of another PD"));
        }
        if !m.access.contains(AccessFlags::MW_BIND) {
            return Err(BindError("MR without MW_BIND (C10-73)"));
        }
        if access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
            && !m.access.contains(AccessFlags::LOCAL_WRITE)
        {
            return Err(BindError(
                "remote write/atomic over an MR without local write (C10-74)",
            ));
        }
        let inside = addr
            .checked_sub(m.addr)
            .and_then(|off| off.checked_add(length))
            .is_some_and(|end| end <= m.len as u64);
        if !inside {
            return Err(BindError("window outside the MR (C10-75)"));
        }
        let binding = Binding {
            mr_key: mr.0,
            addr,
            len: length,
            access,
            qp: (w.ty == MwType::Type2).then_some(qpn),
        };
        if let Some(m) = self.mws.slots[s].as_mut() {
            m.key = new_key;
            m.bound = Some(binding);
        }
        Ok(())
    }

    /// LOCAL_INV of `rkey` by a QP of PD `pd`: a type 2 window is freed. False for anything else, an MR registered
    /// with `ibv_reg_mr` included (only windows and fast-registered regions can be invalidated, IBTA Vol 1
    /// §10.6.7; rxe `rxe_invalidate_mr` refuses user MRs).
    fn local_invalidate(&mut self, rkey: Rkey, pd: PdHandle) -> bool {
        rkey.0 & MW_KEY_BIT != 0 && self.mws.invalidate(rkey.0, pd, None)
    }
}

impl Engine {
    /// `ibv_alloc_mw`: a memory window of type `ty` in PD `pd`, unbound (type 1 windows are "valid" but reach no
    /// memory until bound; type 2 windows are free). Returns its initial R_Key (`ibv_mw.rkey`), which also names it
    /// in [`dealloc_mw`](Self::dealloc_mw) and as `mw` of [`SendOp::BindMw`] (any later key of it does too).
    ///
    /// Binding it ([`SendOp::BindMw`], executed in send-queue order) fails with MW_BIND_ERR unless: the window and
    /// the MR are in the QP's PD; the MR has MW_BIND (C10-73); write/atomic rights need LOCAL_WRITE on the MR
    /// (C10-74); the range lies inside the MR (C10-75); the new key keeps the window's index; a type 2 window is
    /// free (not bound: invalidate it first) and the length is not 0. Remote accesses through its key need the
    /// key's exact current value, the QP's PD, for type 2 the QP that bound it, a range inside the window and its
    /// rights; otherwise the request is NAKed with remote access error, as through a bad MR key.
    ///
    /// Errors: `InvalidHandle` (dead PD), `Exhausted` (`max_mw`).
    pub fn alloc_mw(&mut self, pd: PdHandle, ty: MwType) -> Result<Rkey, ResourceError> {
        if !self.pd_live(pd) {
            return Err(ResourceError::InvalidHandle("pd"));
        }
        if self.mrs.mws.live >= self.cfg.device.max_mw {
            return Err(ResourceError::Exhausted("max_mw"));
        }
        let random = crate::engine::splitmix(&mut self.rng);
        self.mrs
            .mws
            .alloc(pd, ty, random)
            .ok_or(ResourceError::Exhausted("max_mw"))
    }

    /// `ibv_dealloc_mw`: frees the window named by any of its keys (bound or not: its key stops granting access at
    /// once). Errors: `InvalidHandle` if it names no window.
    pub fn dealloc_mw(&mut self, mw: Rkey) -> Result<(), ResourceError> {
        if self.mrs.mws.dealloc(mw) {
            Ok(())
        } else {
            Err(ResourceError::InvalidHandle("mw"))
        }
    }

    /// Number of live memory windows.
    pub fn mw_count(&self) -> u32 {
        self.mrs.mws.live
    }

    /// Whether a memory window (type 1 or 2) is bound to the MR `lkey` (false for an unknown key). `ibv_dereg_mr`
    /// of such an MR fails with EINVAL ([`dereg_mr_invalidate`](Self::dereg_mr_invalidate); rxe `rxe_dereg_mr`
    /// refuses while the MR's `num_mw` is not 0). Control path: scans the windows.
    pub fn mr_has_bound_mw(&self, lkey: Lkey) -> bool {
        self.mrs.get(lkey).is_some() && self.mrs.mws.bound_to(lkey.0)
    }

    /// Executes the local operation at the head of QP index `i`'s send queue (the requester reached it and every
    /// WQE before it has completed): a bind or a local invalidate. Completes it (signaled, or on error) and, on
    /// error, moves the QP to ERR (rxe `rxe_do_local_ops`: MW_BIND_ERR for a bind, LOC_QP_OP_ERR for an invalidate).
    pub(crate) fn exec_local_op(&mut self, i: usize) {
        let Some(qp) = self.qps[i].as_deref_mut() else {
            return;
        };
        let h = qp.sq.head;
        let op = qp.sq.wqe(h).op;
        let (pd, qpn) = (qp.pd, qp.qpn);
        let status = match op {
            SendOp::BindMw { .. } => match self.mrs.bind_mw(pd, qpn, &op) {
                Ok(()) => WcStatus::Success,
                Err(_) => WcStatus::MwBindErr,
            },
            SendOp::LocalInv { rkey } => {
                if self.mrs.local_invalidate(rkey, pd) {
                    WcStatus::Success
                } else {
                    WcStatus::LocQpOpErr
                }
            }
            _ => return,
        };
        if let Some(qp) = self.qps[i].as_deref_mut() {
            qp.sq.cur = h.wrapping_add(1);
            qp.req.cur_pkt = 0;
        }
        self.retire_send(i, h, status);
        if status != WcStatus::Success {
            self.enter_error(i);
        }
    }
}
