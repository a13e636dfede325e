//! The libibverbs data path rsockets use, as a C program compiled against `<infiniband/verbs.h>` reaches it:
//! `ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq` and `ibv_req_notify_cq` are inline functions there that call
//! through `ctx->ops` (`docs/spec/LIBIBVERBS-ABI.md` §4.1), the rest are exported functions of `libibverbs.so.1`
//! (rocev2's under `rocev2 run`). The structures are roce-ibverbs' own declarations (`roce_abi::verbs`, layouts
//! asserted there, ABI.md §4.3).

use core::ffi::c_void;
use libc::c_int;

use crate::abi::{IbvCompChannel, IbvCq, IbvMr, IbvQp, IbvRecvWr, IbvSendWr, IbvWc};

unsafe extern "C" {
    pub fn ibv_reg_mr(pd: *mut c_void, addr: *mut c_void, len: usize, access: c_int) -> *mut IbvMr;
    pub fn ibv_dereg_mr(mr: *mut IbvMr) -> c_int;
    pub fn ibv_get_cq_event(
        ch: *mut IbvCompChannel,
        cq: *mut *mut c_void,
        ctx: *mut *mut c_void,
    ) -> c_int;
    pub fn ibv_ack_cq_events(cq: *mut c_void, n: u32);
}

/// `ibv_poll_cq` (`ctx->ops.poll_cq`).
///
/// # Safety
/// `cq` is a live CQ of rocev2's libibverbs; `wc` holds `n` entries.
pub unsafe fn poll_cq(cq: *mut c_void, n: c_int, wc: *mut IbvWc) -> c_int {
    let cq = cq.cast::<IbvCq>();
    // SAFETY: per the contract: `cq->context` is its open context, whose `ops.poll_cq` is never NULL (ABI.md §4.1).
    unsafe { ((*(*cq).context).ops.poll_cq)(cq, n, wc) }
}

/// `ibv_req_notify_cq(cq, 0)` (`ctx->ops.req_notify_cq`).
///
/// # Safety
/// `cq` is a live CQ of rocev2's libibverbs.
pub unsafe fn req_notify_cq(cq: *mut c_void) -> c_int {
    let cq = cq.cast::<IbvCq>();
    // SAFETY: per the contract: the slot is never NULL on a context handed out (ABI.md §4.1).
    unsafe { ((*(*cq).context).ops.req_notify_cq)(cq, 0) }
}

/// `ibv_post_send` (`ctx->ops.post_send`); `0` or an errno value.
///
/// # Safety
/// `qp` is a live QP of rocev2's libibverbs; `wr` a valid chain whose SGEs are registered memory or inline data.
pub unsafe fn post_send(qp: *mut c_void, wr: &mut IbvSendWr) -> c_int {
    let qp = qp.cast::<IbvQp>();
    let mut bad = core::ptr::null_mut();
    // SAFETY: per the contract: `qp->context` is its open context, whose slot is never NULL (ABI.md §4.1).
    unsafe { ((*(*qp).context).ops.post_send)(qp, wr, &mut bad) }
}

/// `ibv_post_recv` (`ctx->ops.post_recv`); `0` or an errno value.
///
/// # Safety
/// `qp` is a live QP of rocev2's libibverbs; `wr` a valid chain.
pub unsafe fn post_recv(qp: *mut c_void, wr: &mut IbvRecvWr) -> c_int {
    let qp = qp.cast::<IbvQp>();
    let mut bad = core::ptr::null_mut();
    // SAFETY: per the contract: `qp->context` is its open context, whose slot is never NULL (ABI.md §4.1).
    unsafe { ((*(*qp).context).ops.post_recv)(qp, wr, &mut bad) }
}
