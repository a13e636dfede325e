//! Shared receive queues for C programs: `ibv_create_srq`, `ibv_modify_srq`, `ibv_query_srq`, `ibv_destroy_srq`
//! (each `@@IBVERBS_1.1`, attached with `.symver` below as `exports` does) and the `post_srq_recv` slot of
//! `ibv_context.ops` (what the inline `ibv_post_srq_recv` calls, `docs/spec/LIBIBVERBS-ABI.md` §3.1), over
//! [`roce_verbs::Srq`]. A QP created with `ibv_qp_init_attr.srq` ([`srq_of`], used by `ibv_create_qp`) takes its
//! receive WRs from the SRQ.
//!
//! `ibv_create_srq_ex` is an inline function of `<infiniband/verbs.h>`: for a basic SRQ with a PD (comp_mask
//! `IBV_SRQ_INIT_ATTR_PD`, type `IBV_SRQT_BASIC` or unset) it calls the exported `ibv_create_srq`, so it works; XRC
//! and tag-matching SRQs need `verbs_context.create_srq_ex`, which is not set, so the inline function answers NULL
//! + `EOPNOTSUPP` itself (rdma-core 44 `verbs.h`). The `IBVERBS_1.0` twins are refused in module `compat`.
//!
//! As every object of the library: an SRQ is in the table of live objects (module `live`: a second destroy or a
//! foreign pointer is `EINVAL`, `ibv_close_device` releases one the program left), its limit event
//! (`IBV_EVENT_SRQ_LIMIT_REACHED`) reaches `ibv_get_async_event` (module `async_events`) and `ibv_destroy_srq`
//! waits until every such event handed out was acknowledged, and no panic crosses the C boundary (`guard`).
//!
//! Errors as the kernel and rxe give them (`rxe_srq.c`): `max_wr` 0 or above `max_srq_wr`, `max_sge` above
//! `max_srq_sge`, a limit above `max_wr`, a resize below the WRs posted, an unknown `srq_attr_mask` bit: `EINVAL`;
//! `ibv_destroy_srq` while QPs use the SRQ: `EBUSY`.
#![allow(clippy::missing_safety_doc)]

use core::ptr::null_mut;

use roce_proto::{Lkey, SrqAttr, SrqAttrMask};
use roce_verbs::{Error, MAX_SGE, RecvWr, Sge};

use super::*;

std::arch::global_asm!(
    ".symver rocev2_ibv_create_srq, ibv_create_srq@@IBVERBS_1.1\n",
    ".symver rocev2_ibv_modify_srq, ibv_modify_srq@@IBVERBS_1.1\n",
    ".symver rocev2_ibv_query_srq, ibv_query_srq@@IBVERBS_1.1\n",
    ".symver rocev2_ibv_destroy_srq, ibv_destroy_srq@@IBVERBS_1.1\n",
);

/// An SRQ: the `ibv_srq` the program sees, then the runtime handle.
#[repr(C)]
pub(super) struct SrqBlock {
    srq: IbvSrq,
    rust: roce_verbs::Srq,
    /// Async events handed out for it (`ibv_destroy_srq` waits until as many were acknowledged).
    pub(super) async_handed: AtomicU32,
}

/// The runtime SRQ behind `ibv_qp_init_attr.srq`: `Ok(None)` for NULL.
///
/// # Safety
/// `srq` is NULL or an SRQ this library returned and not yet destroyed.
pub(super) unsafe fn srq_of<'a>(srq: *mut c_void) -> Result<Option<&'a roce_verbs::Srq>, c_int> {
    if srq.is_null() {
        return Ok(None);
    }
    // SAFETY: checked against the table of live objects.
    match unsafe { live_block::<SrqBlock, _>(srq, Kind::Srq) } {
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
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_create_srq",
        || null_errno(libc::EIO),
        || unsafe { create_srq_inner(pd, init) },
    )
}

unsafe fn create_srq_inner(pd: *mut IbvPd, init: *mut IbvSrqInitAttr) -> *mut IbvSrq {
    // SAFETY: a live PD of ours (checked) and the caller's init attributes.
    let (Some(p), Some(a)) = (unsafe { live_block::<PdBlock, _>(pd, Kind::Pd) }, unsafe {
        init.as_mut()
    }) else {
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
        async_handed: AtomicU32::new(0),
    });
    p.users.fetch_add(1, Ordering::AcqRel);
    let ctx = p.pd.context as usize;
    // SAFETY: the block was just made; its handle is the engine's.
    let handle = unsafe { (*b).srq.handle };
    async_events::register_srq(handle, ctx, b as usize);
    live::insert(b, Kind::Srq, ctx);
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
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_modify_srq",
        || libc::EIO,
        || unsafe { modify_srq_inner(srq, attr, mask) },
    )
}

unsafe fn modify_srq_inner(srq: *mut IbvSrq, attr: *mut IbvSrqAttr, mask: c_int) -> c_int {
    // SAFETY: a live SRQ of ours (checked) and the caller's attributes.
    let (Some(s), Some(a)) = (
        unsafe { live_block::<SrqBlock, _>(srq, Kind::Srq) },
        unsafe { attr.as_ref() },
    ) else {
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
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_query_srq",
        || libc::EIO,
        || unsafe { query_srq_inner(srq, attr) },
    )
}

unsafe fn query_srq_inner(srq: *mut IbvSrq, attr: *mut IbvSrqAttr) -> c_int {
    // SAFETY: a live SRQ of ours (checked).
    let Some(s) = (unsafe { live_block::<SrqBlock, _>(srq, Kind::Srq) }) else {
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
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_destroy_srq",
        || libc::EIO,
        || unsafe { destroy_srq_inner(srq) },
    )
}

unsafe fn destroy_srq_inner(srq: *mut IbvSrq) -> c_int {
    // Out of the table only once the engine let it go (under the table's lock: two destroys cannot both pass).
    let r = live::take(srq, Kind::Srq, || {
        // SAFETY: a live SRQ of ours (the table says so, under its lock).
        let s = unsafe { &*srq.cast::<SrqBlock>() };
        match s.rust.clone().destroy() {
            Ok(()) => Ok(()),
            Err((_, Error::Busy(_))) => Err(libc::EBUSY),
            Err((_, e)) => Err(e.errno()),
        }
    });
    if let Err(e) = r {
        return e;
    }
    // SAFETY: an SRQ of ours, out of the table, that the engine has destroyed; its PD is live (the SRQ is one of
    // its users), and the SRQ is not used after this call.
    unsafe {
        let b = &*srq.cast::<SrqBlock>();
        async_events::unregister_srq(b.srq.handle, srq as usize);
        async_events::wait_count(
            ptr::addr_of_mut!((*srq).mutex),
            ptr::addr_of_mut!((*srq).cond),
            ptr::addr_of!((*srq).events_completed),
            b.async_handed.load(Ordering::Acquire),
        );
        if let Some(p) = block::<PdBlock, _>((*srq).pd) {
            p.users.fetch_sub(1, Ordering::AcqRel);
        }
        free::<SrqBlock, _>(srq);
    }
    0
}

/// Frees an SRQ `ibv_close_device` found still alive, after the context's QPs (no use counts to check: everything
/// of the context goes; the runtime SRQ goes with its last QP).
///
/// # Safety
/// `srq` is an SRQ block just removed from the live table, not used afterwards.
pub(super) unsafe fn release(srq: *mut IbvSrq) {
    // SAFETY: per the contract.
    unsafe {
        let b = &*srq.cast::<SrqBlock>();
        async_events::unregister_srq(b.srq.handle, srq as usize);
        let _ = b.rust.clone().destroy();
        free::<SrqBlock, _>(srq);
    }
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
