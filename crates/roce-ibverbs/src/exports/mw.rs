//! Memory windows through the C ABI: the `ops.alloc_mw` / `ops.bind_mw` / `ops.dealloc_mw` slots that the inline
//! `ibv_alloc_mw`, `ibv_bind_mw` and `ibv_dealloc_mw` of `verbs.h` call, the `IBV_WR_BIND_MW` / `IBV_WR_LOCAL_INV`
//! send WRs (also built by `ibv_wr_bind_mw` / `ibv_wr_local_inv`), and `IBV_WR_ATOMIC_WRITE`'s operand. The rules
//! are the engine's (`roce_proto` `mw` module: IBTA Vol 1 §10.6.7, rxe `rxe_mw.c`); what this module adds is how
//! rdma-core 44's rxe provider (`providers/rxe/rxe.c`) maps the C calls onto them:
//! * `ibv_bind_mw` (type 1 only; the inline checks the type, the MR's PD and a NULL MR with a range) posts a
//!   BIND_MW WR whose new key is `ibv_inc_rkey(mw->rkey)` and, once it is posted, stores that key in `mw->rkey`
//!   (the program reads the window's key there; an error completion leaves undoing it to the program, as rxe);
//! * a BIND_MW WR names the window by `bind_mw.mw->rkey` (any key of it) and takes the new key byte from
//!   `bind_mw.rkey`; `IBV_ACCESS_ZERO_BASED` windows are refused (`EINVAL` at post, as rxe), access bits other
//!   than the remote ones are ignored (LOCAL_WRITE is what an MR needs, not a window);
//! * `ibv_alloc_mw` of a type other than 1 and 2 is `EINVAL` (there is no such type);
//! * a window counts as a user of its PD (`ibv_dealloc_pd` is `EBUSY` while it lives), and `ibv_close_device`
//!   frees the windows the program left (`live::drain_context`).

use super::*;

use roce_verbs::{Mw, MwType};

/// `IBV_ACCESS_ZERO_BASED`.
const IBV_ACCESS_ZERO_BASED: u32 = 0x20;
/// The access bits a window carries: REMOTE_WRITE | REMOTE_READ | REMOTE_ATOMIC.
const MW_REMOTE_ACCESS: u32 = 0x2 | 0x4 | 0x8;

#[repr(C)]
struct MwBlock {
    /// The program reads `rkey` (and `ibv_bind_mw` writes it) through its pointer.
    mw: UnsafeCell<IbvMw>,
    rust: Mw,
    /// The `ibv_pd *` this window counts as a user of (the library's record, not `ibv_mw.pd`).
    pd: usize,
}

/// `ops.alloc_mw(pd, type)`: a window, or NULL with `errno` (`EINVAL`: not a PD of ours or an unknown type;
/// the runtime's errno otherwise, `ENOMEM` at `max_mw`).
pub(super) unsafe extern "C" fn alloc_mw(pd: *mut IbvPd, ty: c_int) -> *mut IbvMw {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_alloc_mw",
        || null_errno(libc::EIO),
        || unsafe { alloc_mw_inner(pd, ty) },
    )
}

unsafe fn alloc_mw_inner(pd: *mut IbvPd, ty: c_int) -> *mut IbvMw {
    // SAFETY: PD blocks are `PdBlock`s.
    let Some(p) = (unsafe { live_block::<PdBlock, _>(pd, Kind::Pd) }) else {
        return null_errno(libc::EINVAL);
    };
    let Some(t) = u32::try_from(ty).ok().and_then(MwType::from_raw) else {
        return null_errno(libc::EINVAL);
    };
    match p.rust.alloc_mw(t) {
        Ok(w) => {
            p.users.fetch_add(1, Ordering::AcqRel);
            let rkey = w.rkey().0;
            let b = into_raw(MwBlock {
                mw: UnsafeCell::new(IbvMw {
                    context: p.pd.context,
                    pd,
                    rkey,
                    handle: rkey >> 8,
                    mw_type: ty,
                }),
                rust: w,
                pd: pd as usize,
            });
            live::insert(b, Kind::Mw, p.pd.context as usize);
            b.cast()
        }
        Err(e) => null_errno(e.errno()),
    }
}

/// `ops.dealloc_mw(mw)`: 0, or `EINVAL` for a pointer that is not a live window of ours.
pub(super) unsafe extern "C" fn dealloc_mw(mw: *mut IbvMw) -> c_int {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_dealloc_mw",
        || libc::EIO,
        || unsafe { dealloc_mw_inner(mw) },
    )
}

unsafe fn dealloc_mw_inner(mw: *mut IbvMw) -> c_int {
    if let Err(e) = live::take(mw, Kind::Mw, || Ok(())) {
        return e;
    }
    // SAFETY: a window of ours, out of the table and not used after this call.
    unsafe { release(mw) };
    0
}

/// Frees window block `mw` (the engine's window goes with it) and drops its PD use.
///
/// # Safety
/// `mw` is a window block of ours just removed from the live table, not used afterwards.
pub(super) unsafe fn release(mw: *mut IbvMw) {
    // SAFETY: per the contract.
    let b = unsafe { &*mw.cast::<MwBlock>() };
    // Fails only when the runtime is gone already (its windows went with it).
    let _ = b.rust.dealloc();
    // SAFETY: the PD of its own record is live (the window is one of its users); then the block goes.
    unsafe {
        count_user::<PdBlock, _>(b.pd as *mut IbvPd, false);
        free::<MwBlock, _>(mw);
    }
}

/// `ops.bind_mw(qp, mw, mw_bind)` (`ibv_bind_mw`, type 1): posts a BIND_MW WR with the new key
/// `ibv_inc_rkey(mw->rkey)` and stores that key in `mw->rkey`. 0 or the errno of the post (`EINVAL` for a NULL
/// argument, a type 2 window or a zero-based window).
pub(super) unsafe extern "C" fn bind_mw(
    qp: *mut IbvQp,
    mw: *mut IbvMw,
    bind: *mut IbvMwBind,
) -> c_int {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_bind_mw",
        || libc::EIO,
        || unsafe { bind_mw_inner(qp, mw, bind) },
    )
}

unsafe fn bind_mw_inner(qp: *mut IbvQp, mw: *mut IbvMw, bind: *mut IbvMwBind) -> c_int {
    // SAFETY: the caller's window and bind request (NULL refused).
    let (Some(w), Some(bd)) = (unsafe { mw.as_ref() }, unsafe { bind.as_ref() }) else {
        return libc::EINVAL;
    };
    if w.mw_type != 1 {
        return libc::EINVAL;
    }
    let old = w.rkey;
    let new = (old & !0xff) | (old.wrapping_add(1) & 0xff);
    let info = bd.bind_info;
    let mut wr = IbvSendWr {
        wr_id: bd.wr_id,
        next: null_mut(),
        sg_list: null_mut(),
        num_sge: 0,
        opcode: IBV_WR_BIND_MW,
        send_flags: bd.send_flags,
        imm_data: 0,
        wr: SendWrUnion {
            w0: 0,
            w1: 0,
            w2: 0,
            w3: 0,
        },
        qp_type_xrc_remote_srqn: 0,
        bind_mw_tso: [
            mw as usize as u64,
            u64::from(new),
            info.mr as usize as u64,
            info.addr,
            info.length,
            u64::from(info.mw_access_flags),
        ],
    };
    let mut bad = null_mut();
    // SAFETY: a one-WR chain of our own; the QP is the caller's.
    let rc = unsafe { post_send_inner(qp, &mut wr, &mut bad) };
    if rc == 0 {
        // SAFETY: the caller's window (read above; no reference to it lives now): the program reads the new key
        // here, as rxe stores it (before the bind has executed).
        unsafe { (*mw).rkey = new };
    }
    rc
}

/// The engine operation of an `IBV_WR_BIND_MW` WR (`bind_mw` member: window, new key, `bind_info`).
///
/// # Safety
/// `w` is the caller's WR; its `bind_mw.mw` is a window of ours and `bind_info.mr` NULL or an MR of ours (the data
/// path trusts its pointers as every provider does).
pub(super) unsafe fn bind_op(w: &IbvSendWr) -> Result<SendOp, c_int> {
    let [mw, rkey, mr, addr, length, access] = w.bind_mw_tso;
    let mw = mw as usize as *const IbvMw;
    let mr = mr as usize as *const IbvMr;
    let access = access as u32;
    if mw.is_null() || access & IBV_ACCESS_ZERO_BASED != 0 || (mr.is_null() && length != 0) {
        return Err(libc::EINVAL);
    }
    // SAFETY: per the contract (non-NULL, checked above).
    let mw_key = unsafe { (*mw).rkey };
    // SAFETY: per the contract; NULL only for an unbind (length 0).
    let lkey = unsafe { mr.as_ref() }.map_or(0, |m| m.lkey);
    Ok(SendOp::BindMw {
        mw: Rkey(mw_key),
        rkey: Rkey(rkey as u32),
        mr: roce_proto::Lkey(lkey),
        addr,
        length,
        access: AccessFlags(access & MW_REMOTE_ACCESS),
    })
}

/// The engine operation of an `IBV_WR_ATOMIC_WRITE` WR: `wr.rdma` names the target, its one 8-byte SGE the bytes
/// (read now, as inline data is).
///
/// # Safety
/// `w` is the caller's WR whose `sg_list` has `num_sge` readable entries, and its SGE names 8 readable bytes.
pub(super) unsafe fn atomic_write_op(w: &IbvSendWr) -> Result<SendOp, c_int> {
    if w.num_sge != 1 || w.sg_list.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: per the contract.
    let s = unsafe { *w.sg_list };
    if s.length != 8 || s.addr == 0 {
        return Err(libc::EINVAL);
    }
    // SAFETY: per the contract: 8 readable bytes at a non-NULL address, read unaligned.
    let value = unsafe { ptr::read_unaligned(s.addr as usize as *const [u8; 8]) };
    Ok(SendOp::AtomicWrite {
        remote_addr: w.wr.remote_addr(),
        rkey: Rkey(w.wr.rdma_rkey()),
        value,
    })
}
