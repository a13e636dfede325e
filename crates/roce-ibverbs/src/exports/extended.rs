//! The extended context (`struct verbs_context`, `ABI.md` §3, §4.2): every context is extended (`abi_compat` =
//! `UINTPTR_MAX`, `sz` = 648), with the slots the library implements set (these two, `create_cq_ex` in `cq_ex.rs`,
//! `create_qp_ex` in `qp_ex.rs`) and every other one NULL, so the inline functions of `verbs.h` degrade as on a
//! provider without them (`ibv_alloc_dm` … : `EOPNOTSUPP`):
//!
//! * `query_port` (what the inline `ibv_query_port` calls with `sizeof(struct ibv_port_attr)` = 52): the exported
//!   `ibv_query_port`'s answer, `port_cap_flags2` 0, at most the caller's `port_attr_len` bytes written (bytes past
//!   52 zeroed), as rdma-core's `__lib_query_port`;
//! * `query_device_ex` (the inline `ibv_query_device_ex`, e.g. pyverbs' and ibv_devinfo's): `orig_attr` as
//!   `ibv_query_device`, `phys_port_cnt_ex` 1, every extended capability 0 (no ODP, TSO, RSS, packet pacing, tag
//!   matching, timestamps), at most `attr_size` bytes written.

use super::*;

/// The `verbs_context` head of a new context.
pub(super) fn head() -> VerbsContextHead {
    let mut slots = [0usize; 39];
    slots[VCTX_QUERY_PORT] = query_port as *const () as usize;
    slots[VCTX_QUERY_DEVICE_EX] = query_device_ex as *const () as usize;
    slots[VCTX_CREATE_CQ_EX] = cq_ex::create_cq_ex as *const () as usize;
    slots[VCTX_CREATE_QP_EX] = qp_ex::create_qp_ex as *const () as usize;
    VerbsContextHead {
        slots,
        sz: VERBS_CONTEXT_SIZE,
    }
}

/// Copies `src` to `dst` (`len` bytes of room): the first `min(len, src.len())` bytes, zeros after them.
///
/// # Safety
/// `dst` has room for `len` bytes.
unsafe fn copy_out(dst: *mut u8, len: usize, src: &[u8]) {
    let n = len.min(src.len());
    // SAFETY: per the contract; `src` is a local slice.
    unsafe {
        ptr::copy_nonoverlapping(src.as_ptr(), dst, n);
        ptr::write_bytes(dst.add(n), 0, len - n);
    }
}

/// `verbs_context.query_port(ctx, port, attr, port_attr_len)`.
unsafe extern "C" fn query_port(
    ctx: *mut IbvContext,
    port: u8,
    attr: *mut u8,
    len: usize,
) -> c_int {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "verbs_context.query_port",
        || libc::EIO,
        || unsafe { query_port_inner(ctx, port, attr, len) },
    )
}

unsafe fn query_port_inner(ctx: *mut IbvContext, port: u8, attr: *mut u8, len: usize) -> c_int {
    if attr.is_null() {
        return libc::EINVAL;
    }
    let mut out = [0u8; PORT_ATTR_SIZE];
    // SAFETY: `out` has room for the 48-byte layout the exported verb writes (port_cap_flags2 stays 0).
    let r = unsafe { rocev2_ibv_query_port(ctx, port, out.as_mut_ptr().cast::<IbvPortAttr>()) };
    if r != 0 {
        return r;
    }
    // SAFETY: the caller's struct of `len` bytes.
    unsafe { copy_out(attr, len, &out) };
    0
}

/// `verbs_context.query_device_ex(ctx, input, attr, attr_size)` (`input`'s `comp_mask` was checked by the inline).
unsafe extern "C" fn query_device_ex(
    ctx: *mut IbvContext,
    _input: *const c_void,
    attr: *mut u8,
    size: usize,
) -> c_int {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "verbs_context.query_device_ex",
        || libc::EIO,
        || unsafe { query_device_ex_inner(ctx, _input, attr, size) },
    )
}

unsafe fn query_device_ex_inner(
    ctx: *mut IbvContext,
    _input: *const c_void,
    attr: *mut u8,
    size: usize,
) -> c_int {
    if attr.is_null() || size < size_of::<IbvDeviceAttr>() {
        return libc::EINVAL;
    }
    let mut out = [0u8; DEVICE_ATTR_EX_SIZE];
    // Queried into an aligned local (`out` is a byte array), then copied in as `orig_attr`, the first member.
    let mut orig = core::mem::MaybeUninit::<IbvDeviceAttr>::uninit();
    // SAFETY: `orig` has room for the struct.
    let r = unsafe { rocev2_ibv_query_device(ctx, orig.as_mut_ptr()) };
    if r != 0 {
        return r;
    }
    // SAFETY: written by the successful query; viewed as its bytes (a plain `repr(C)` struct of integers).
    let bytes = unsafe {
        std::slice::from_raw_parts(orig.as_ptr().cast::<u8>(), size_of::<IbvDeviceAttr>())
    };
    out[..bytes.len()].copy_from_slice(bytes);
    out[PHYS_PORT_CNT_EX_OFFSET..PHYS_PORT_CNT_EX_OFFSET + 4].copy_from_slice(&1u32.to_ne_bytes());
    // SAFETY: the caller's struct of `size` bytes.
    unsafe { copy_out(attr, size, &out) };
    0
}
