//! Shared receive queues for C programs: `ibv_create_srq`, `ibv_modify_srq`, `ibv_query_srq`, `ibv_destroy_srq`
//! (each `@@IBVERBS_1.1`, attached with `.symver` below as `exports` does) and the `post_srq_recv` slot of
//! `ibv_context.ops` (what the inline `ibv_post_srq_recv` calls, `../shared/libibverbs/ABI.md` §3.1), over
//! [`roce_verbs::Srq`]. A QP created with `ibv_qp_init_attr.srq` ([`srq_of`], used by `ibv_create_qp`) takes its
//! receive WRs from the SRQ.
//!
//! `ibv_create_srq_ex` is an inline function of `<infiniband/verbs.h>`: for a basic SRQ with a PD (comp_mask
//! `IBV_SRQ_INIT_ATTR_PD`, type `IBV_SRQT_BASIC` or unset) it calls the exported `ibv_create_srq`, so it works; XRC
//! and tag-matching SRQs need `verbs_context.create_srq_ex`, and the context is not extended, so the inline
//! function answers NULL + `EOPNOTSUPP` itself (rdma-core 44 `verbs.h`). The `IBVERBS_1.0` compatibility versions
//! of the four symbols (for binaries linked against libibverbs 1.0 structures) are not provided.
//!
//! Errors as the kernel and rxe give them (`rxe_srq.c`): `max_wr` 0 or above `max_srq_wr`, `max_sge` above
//! `max_srq_sge`, a limit above `max_wr`, a resize below the WRs posted, an unknown `srq_attr_mask` bit: `EINVAL`;
//! `ibv_destroy_srq` while QPs use the SRQ: `EBUSY`.
#![allow(clippy::missing_safety_doc)]

use core::ffi::{c_int, c_void};
use core::ptr::null_mut;
use std::sync::atomic::Ordering;

use roce_proto::{Lkey, SrqAttr, SrqAttrMask};
use roce_verbs::{Error, MAX_SGE, RecvWr, Sge};

use crate::abi::*;
use crate::exports::{BATCH, PdBlock, block, free, into_raw, null_errno, post_errno};

std::arch::global_asm!(
    ".symver rocev2_ibv_create_srq, ibv_create_srq@@IBVERBS_1.1\n",
    ".symver rocev2_ibv_modify_srq, ibv_modify_srq@@IBVERBS_1.1\n",
    ".symver rocev2_ibv_query_srq, ibv_query_srq@@IBVERBS_1.1\n",
    ".symver rocev2_ibv_destroy_srq, ibv_destroy_srq@@IBVERBS_1.1\n",
);

/// An SRQ: the `ibv_srq` the program sees, then the runtime handle.
#[repr(C)]
struct SrqBlock {
    srq: IbvSrq,
    rust: roce_verbs::Srq,
}

/// The runtime SRQ behind `ibv_qp_init_attr.srq`: `Ok(None)` for NULL.
///
/// # Safety
/// `srq` is NULL or an SRQ this library returned and not yet destroyed.
pub(crate) unsafe fn srq_of<'a>(srq: *mut c_void) -> Result<Option<&'a roce_verbs::Srq>, c_int> {
    if srq.is_null() {
        return Ok(None);
    }
    // SAFETY: per the contract.
    match unsafe { block::<SrqBlock, _>(srq) } {
        Some(b) => Ok(Some(&b.rust)),
        None => Err(libc::EINVAL),
    }
}

fn srq_attr_to_c(a: &SrqAttr) -> IbvSrqAttr {
    IbvSrqAttr {
        max_wr: a.max_wr,
        max_sge: a.max_sge,
        srq_limit: a.srq_limit,
    }
}

/// `ibv_create_srq`: `attr.max_wr` / `attr.max_sge` are checked against the device (`max_srq_wr`, `max_srq_sge`)
/// and written back as granted; `attr.srq_limit` is ignored (`ibv_create_srq(3)`: arm it with `ibv_modify_srq`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_create_srq(
    pd: *mut IbvPd,
    init: *mut IbvSrqInitAttr,
) -> *mut IbvSrq {
    // SAFETY: the caller passes a PD of ours and its init attributes.
    let (Some(p), Some(a)) = (unsafe { block::<PdBlock, _>(pd) }, unsafe { init.as_mut() }) else {
        return null_errno(libc::EINVAL);
    };
    let srq = match p.rust.create_srq(a.attr.max_wr, a.attr.max_sge) {
        Ok(s) => s,
        Err(e) => return null_errno(e.errno()),
    };
    let granted = match srq.query() {
        Ok(g) => g,
        Err(e) => return null_errno(e.errno()),
    };
    a.attr.max_wr = granted.max_wr;
    a.attr.max_sge = granted.max_sge;
    let b = into_raw(SrqBlock {
        srq: IbvSrq {
            context: p.pd.context,
            srq_context: a.srq_context,
            pd,
            handle: srq.handle().0,
            mutex: [0; 5],
            cond: [0; 6],
            events_completed: 0,
        },
        rust: srq,
    });
    p.users.fetch_add(1, Ordering::AcqRel);
    b.cast()
}

/// `ibv_modify_srq`: `IBV_SRQ_MAX_WR` resizes, `IBV_SRQ_LIMIT` arms the limit event (0 disarms). Returns 0 or the
/// errno value.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_modify_srq(
    srq: *mut IbvSrq,
    attr: *mut IbvSrqAttr,
    mask: c_int,
) -> c_int {
    // SAFETY: the caller passes an SRQ of ours and its attributes.
    let (Some(s), Some(a)) = (unsafe { block::<SrqBlock, _>(srq) }, unsafe {
        attr.as_ref()
    }) else {
        return libc::EINVAL;
    };
    if mask & !(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT) != 0 {
        return libc::EINVAL;
    }
    let attr = SrqAttr {
        max_wr: a.max_wr,
        max_sge: a.max_sge,
        srq_limit: a.srq_limit,
    };
    match s.rust.modify(&attr, SrqAttrMask(mask as u32)) {
        Ok(()) => 0,
        Err(e) => e.errno(),
    }
}

/// `ibv_query_srq`: `max_wr`, `max_sge`, and the armed limit (0 once the limit event fired).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_query_srq(srq: *mut IbvSrq, attr: *mut IbvSrqAttr) -> c_int {
    // SAFETY: the caller passes an SRQ of ours.
    let Some(s) = (unsafe { block::<SrqBlock, _>(srq) }) else {
        return libc::EINVAL;
    };
    if attr.is_null() {
        return libc::EINVAL;
    }
    match s.rust.query() {
        Ok(a) => {
            // SAFETY: the caller's out-parameter of this type.
            unsafe { attr.write(srq_attr_to_c(&a)) };
            0
        }
        Err(e) => e.errno(),
    }
}

/// `ibv_destroy_srq`: `EBUSY` while QPs use the SRQ (the SRQ stays usable); otherwise the WRs still posted are
/// discarded and the SRQ is freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_destroy_srq(srq: *mut IbvSrq) -> c_int {
    // SAFETY: the caller passes an SRQ of ours.
    let Some(s) = (unsafe { block::<SrqBlock, _>(srq) }) else {
        return libc::EINVAL;
    };
    match s.rust.clone().destroy() {
        Ok(()) => {}
        Err((_, Error::Busy(_))) => return libc::EBUSY,
        Err((_, e)) => return e.errno(),
    }
    // SAFETY: an SRQ of ours that the engine has destroyed; its PD is live (the SRQ is one of its users), and the
    // SRQ is not used after this call.
    unsafe {
        if let Some(p) = block::<PdBlock, _>((*srq).pd) {
            p.users.fetch_sub(1, Ordering::AcqRel);
        }
        free::<SrqBlock, _>(srq);
    }
    0
}

/// `ops.post_srq_recv` (the inline `ibv_post_srq_recv`): the chain in chunks of [`BATCH`] WRs, each posted all or
/// nothing; on error `*bad_wr` is the first WR of the chunk that failed (or the malformed WR) and nothing from it
/// on was posted. Returns 0, `ENOMEM` (the SRQ is full) or `EINVAL`.
pub(crate) unsafe extern "C" fn post_srq_recv(
    srq: *mut c_void,
    wr: *mut IbvRecvWr,
    bad: *mut *mut IbvRecvWr,
) -> c_int {
    let fail = |at: *mut IbvRecvWr, e: c_int| {
        if !bad.is_null() {
            // SAFETY: the caller's out-parameter.
            unsafe { *bad = at };
        }
        e
    };
    // SAFETY: the inline `ibv_post_srq_recv` passes one of our SRQs.
    let Some(s) = (unsafe { block::<SrqBlock, _>(srq) }) else {
        return fail(wr, libc::EINVAL);
    };
    let mut cur = wr;
    while !cur.is_null() {
        let mut sges = [[Sge::default(); MAX_SGE]; BATCH];
        let mut meta = [(0u64, 0usize); BATCH];
        let mut first = null_mut::<IbvRecvWr>();
        let mut n = 0;
        let mut err = None;
        while n < BATCH && !cur.is_null() {
            // SAFETY: a WR of the caller's chain.
            let w = unsafe { &*cur };
            let Ok(nsge) = usize::try_from(w.num_sge) else {
                err = Some((cur, libc::EINVAL));
                break;
            };
            if nsge > MAX_SGE || (nsge > 0 && w.sg_list.is_null()) {
                err = Some((cur, libc::EINVAL));
                break;
            }
            for (i, g) in sges[n].iter_mut().enumerate().take(nsge) {
                // SAFETY: `sg_list` has `num_sge` entries.
                let c = unsafe { *w.sg_list.add(i) };
                *g = Sge {
                    addr: c.addr,
                    length: c.length,
                    lkey: Lkey(c.lkey),
                };
            }
            meta[n] = (w.wr_id, nsge);
            if n == 0 {
                first = cur;
            }
            n += 1;
            cur = w.next;
        }
        if n > 0 {
            let wrs: [RecvWr<'_>; BATCH] = core::array::from_fn(|i| RecvWr {
                wr_id: meta[i].0,
                sg_list: &sges[i][..meta[i].1],
            });
            if let Err(e) = s.rust.post_recv(&wrs[..n]) {
                return fail(first, post_errno(&e));
            }
        }
        if let Some((at, e)) = err {
            return fail(at, e);
        }
    }
    0
}
