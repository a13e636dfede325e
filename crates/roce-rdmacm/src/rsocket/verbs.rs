//! The libibverbs data path rsockets use, as a C program compiled against `<infiniband/verbs.h>` reaches it:
//! `ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq` and `ibv_req_notify_cq` are inline functions there that call
//! through `ctx->ops` (offsets of `docs/spec/LIBIBVERBS-ABI.md` §4.1), the rest are exported functions of
//! `libibverbs.so.1` (rocev2's under `rocev2 run`). Structure layouts: ABI.md §4.3.

use core::ffi::c_void;
use libc::c_int;

/// `struct ibv_sge` (16 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvSge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `struct ibv_send_wr` (128 bytes) with the `wr.rdma` member of its union.
#[repr(C)]
pub struct IbvSendWr {
    pub wr_id: u64,
    pub next: *mut IbvSendWr,
    pub sg_list: *mut IbvSge,
    pub num_sge: c_int,
    pub opcode: c_int,
    pub send_flags: c_int,
    /// Big-endian (`__be32`).
    pub imm_data: u32,
    pub remote_addr: u64,
    pub rkey: u32,
    pub rest: [u8; 76],
}

/// `struct ibv_recv_wr` (32 bytes).
#[repr(C)]
pub struct IbvRecvWr {
    pub wr_id: u64,
    pub next: *mut IbvRecvWr,
    pub sg_list: *mut IbvSge,
    pub num_sge: c_int,
}

/// `struct ibv_wc` (48 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvWc {
    pub wr_id: u64,
    pub status: c_int,
    pub opcode: c_int,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// Big-endian (`__be32`).
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: u32,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// `struct ibv_mr` (48 bytes).
#[repr(C)]
pub struct IbvMr {
    pub context: *mut c_void,
    pub pd: *mut c_void,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ibv_comp_channel` (16 bytes).
#[repr(C)]
pub struct IbvCompChannel {
    pub context: *mut c_void,
    pub fd: c_int,
    pub refcnt: c_int,
}

const _: () = {
    assert!(size_of::<IbvSge>() == 16);
    assert!(size_of::<IbvSendWr>() == 128);
    assert!(core::mem::offset_of!(IbvSendWr, imm_data) == 36);
    assert!(core::mem::offset_of!(IbvSendWr, remote_addr) == 40);
    assert!(core::mem::offset_of!(IbvSendWr, rkey) == 48);
    assert!(size_of::<IbvRecvWr>() == 32);
    assert!(size_of::<IbvWc>() == 48);
    assert!(core::mem::offset_of!(IbvWc, imm_data) == 24);
    assert!(core::mem::offset_of!(IbvWc, wc_flags) == 36);
    assert!(size_of::<IbvMr>() == 48);
    assert!(core::mem::offset_of!(IbvMr, lkey) == 36);
};

pub const IBV_WR_RDMA_WRITE_WITH_IMM: c_int = 1;
pub const IBV_SEND_INLINE: c_int = 8;
pub const IBV_WC_SUCCESS: c_int = 0;
pub const IBV_WC_WITH_IMM: u32 = 1 << 1;

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

type PollCqFn = unsafe extern "C" fn(*mut c_void, c_int, *mut IbvWc) -> c_int;
type ReqNotifyFn = unsafe extern "C" fn(*mut c_void, c_int) -> c_int;
type PostSendFn = unsafe extern "C" fn(*mut c_void, *mut IbvSendWr, *mut *mut IbvSendWr) -> c_int;
type PostRecvFn = unsafe extern "C" fn(*mut c_void, *mut IbvRecvWr, *mut *mut IbvRecvWr) -> c_int;

/// The `ops` slot at `off` bytes from the start of the object's `ibv_context` (the object's first member).
///
/// # Safety
/// `obj` is a live CQ or QP of a libibverbs context whose slot at `off` holds a function of type `F`.
unsafe fn slot<F: Copy>(obj: *mut c_void, off: usize) -> F {
    // SAFETY: per the contract: `obj->context` is at offset 0 and the slot is a non-NULL function pointer
    // (ABI.md §4.1: never NULL on a context handed out).
    unsafe {
        let ctx = *obj.cast::<*mut u8>();
        *ctx.add(off).cast::<F>()
    }
}

/// `ibv_poll_cq` (ctx + 96).
///
/// # Safety
/// `cq` is a live CQ; `wc` holds `n` entries.
pub unsafe fn poll_cq(cq: *mut c_void, n: c_int, wc: *mut IbvWc) -> c_int {
    // SAFETY: per the contract.
    unsafe { slot::<PollCqFn>(cq, 96)(cq, n, wc) }
}

/// `ibv_req_notify_cq` (ctx + 104).
///
/// # Safety
/// `cq` is a live CQ.
pub unsafe fn req_notify_cq(cq: *mut c_void) -> c_int {
    // SAFETY: per the contract.
    unsafe { slot::<ReqNotifyFn>(cq, 104)(cq, 0) }
}

/// `ibv_post_send` (ctx + 208); `0` or an errno value.
///
/// # Safety
/// `qp` is a live QP; `wr` a valid chain whose SGEs are registered memory or inline data.
pub unsafe fn post_send(qp: *mut c_void, wr: &mut IbvSendWr) -> c_int {
    let mut bad = core::ptr::null_mut();
    // SAFETY: per the contract.
    unsafe { slot::<PostSendFn>(qp, 208)(qp, wr, &mut bad) }
}

/// `ibv_post_recv` (ctx + 216); `0` or an errno value.
///
/// # Safety
/// `qp` is a live QP; `wr` a valid chain.
pub unsafe fn post_recv(qp: *mut c_void, wr: &mut IbvRecvWr) -> c_int {
    let mut bad = core::ptr::null_mut();
    // SAFETY: per the contract.
    unsafe { slot::<PostRecvFn>(qp, 216)(qp, wr, &mut bad) }
}
