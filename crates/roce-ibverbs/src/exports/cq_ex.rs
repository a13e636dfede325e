//! Extended CQs (`ibv_create_cq_ex`, the `verbs_context.create_cq_ex` slot, and the `struct ibv_cq_ex` polling API:
//! `ibv_start_poll` / `ibv_next_poll` / `ibv_end_poll` and `ibv_wc_read_*`, ibv_create_cq_ex(3)).
//!
//! Every CQ block carries the `ibv_cq_ex` tail after its `ibv_cq` (`ibv_cq_ex` starts with an `ibv_cq`, `ABI.md`
//! §4.3; `ibv_cq_ex_to_cq` is a cast), so `ibv_destroy_cq`, `ibv_poll_cq`, `ibv_req_notify_cq`, completion events and
//! `ibv_resize_cq` work on an extended CQ as on any other; only CQs made by `ibv_create_cq_ex` have the tail's
//! function pointers set. Rules, as rdma-core 44 with rxe answers them:
//! * `wc_flags` beyond the standard fields (byte_len, imm, qp_num, src_qp, slid, sl, dlid_path_bits: rxe
//!   `RXE_SUP_WC_EX_FLAGS`) — completion time stamps, wall clock, cvlan, flow tag, tag matching — are `EOPNOTSUPP`
//!   (no device clock, no such fields);
//! * `comp_mask` bits other than FLAGS and PD are `EOPNOTSUPP` (`ibv_cmd_create_cq_ex`); a parent domain
//!   (`IBV_CQ_INIT_ATTR_MASK_PD` with a PD) is `EOPNOTSUPP` (none can exist: `ibv_alloc_parent_domain` is refused);
//! * `flags`: `IBV_CREATE_CQ_ATTR_SINGLE_THREADED` is a hint; `IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN` is `EOPNOTSUPP`
//!   (rxe `rxe_create_cq` refuses any flag), unknown bits `EINVAL` (the kernel's check);
//! * `cqe` and `comp_vector` are checked as `ibv_create_cq`'s;
//! * `ibv_start_poll` takes the oldest completion (or `ENOENT`, returned and in `errno`, with nothing held), sets
//!   `status` and `wr_id` and holds the CQ's poll lock until `ibv_end_poll` (rxe's spin lock; another thread's
//!   `ibv_start_poll` waits for it). A second `ibv_start_poll` by the thread that holds it spins for ever on rxe
//!   (`pthread_spin_lock` on the CQ's lock); here it answers `EINVAL` and takes nothing, so the completion in hand
//!   stays current and none is lost (issue #21); `ibv_next_poll`
//!   takes the next one (or `ENOENT`); the `ibv_wc_read_*` functions read the completion taken last, with the values
//!   `ibv_poll_cq` would give (`sl` included: 2 for IPv4, 1 for IPv6 on UD receives).

use super::*;

/// `enum ibv_create_cq_wc_flags`: the standard fields (rxe `RXE_SUP_WC_EX_FLAGS`).
const IBV_WC_STANDARD_FLAGS: u64 = 0x7f;
/// `enum ibv_cq_init_attr_mask`.
const IBV_CQ_INIT_ATTR_MASK_FLAGS: u32 = 1;
const IBV_CQ_INIT_ATTR_MASK_PD: u32 = 2;
/// `enum ibv_create_cq_attr_flags`.
const IBV_CREATE_CQ_ATTR_SINGLE_THREADED: u32 = 1;
const IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN: u32 = 2;

/// `struct ibv_cq_init_attr_ex` (56 bytes).
#[repr(C)]
pub(super) struct IbvCqInitAttrEx {
    cqe: u32,
    cq_context: *mut c_void,
    channel: *mut IbvCompChannel,
    comp_vector: u32,
    wc_flags: u64,
    comp_mask: u32,
    flags: u32,
    parent_domain: *mut IbvPd,
}

/// `struct ibv_poll_cq_attr`.
#[repr(C)]
pub(super) struct IbvPollCqAttr {
    comp_mask: u32,
}

type Read32 = unsafe extern "C" fn(*mut IbvCq) -> u32;
type Read8 = unsafe extern "C" fn(*mut IbvCq) -> u8;

/// What `struct ibv_cq_ex` has after its `struct ibv_cq` head (offset 128: `comp_mask`, `status`, `wr_id` and 18
/// function pointers; NULL on a CQ made by `ibv_create_cq`).
#[repr(C)]
pub(super) struct CqExTail {
    comp_mask: u32,
    status: c_int,
    wr_id: u64,
    start_poll: Option<unsafe extern "C" fn(*mut IbvCq, *mut IbvPollCqAttr) -> c_int>,
    next_poll: Option<unsafe extern "C" fn(*mut IbvCq) -> c_int>,
    end_poll: Option<unsafe extern "C" fn(*mut IbvCq)>,
    read_opcode: Option<unsafe extern "C" fn(*mut IbvCq) -> c_int>,
    read_vendor_err: Option<Read32>,
    read_byte_len: Option<Read32>,
    read_imm_data: Option<Read32>,
    read_qp_num: Option<Read32>,
    read_src_qp: Option<Read32>,
    read_wc_flags: Option<Read32>,
    read_slid: Option<Read32>,
    read_sl: Option<Read8>,
    read_dlid_path_bits: Option<Read8>,
    read_completion_ts: Option<unsafe extern "C" fn(*mut IbvCq) -> u64>,
    read_cvlan: Option<unsafe extern "C" fn(*mut IbvCq) -> u16>,
    read_flow_tag: Option<Read32>,
    read_tm_info: Option<unsafe extern "C" fn(*mut IbvCq, *mut c_void)>,
    read_completion_wallclock_ns: Option<unsafe extern "C" fn(*mut IbvCq) -> u64>,
}

impl CqExTail {
    /// The tail of a CQ made by `ibv_create_cq`.
    pub(super) const NONE: CqExTail = CqExTail {
        comp_mask: 0,
        status: 0,
        wr_id: 0,
        start_poll: None,
        next_poll: None,
        end_poll: None,
        read_opcode: None,
        read_vendor_err: None,
        read_byte_len: None,
        read_imm_data: None,
        read_qp_num: None,
        read_src_qp: None,
        read_wc_flags: None,
        read_slid: None,
        read_sl: None,
        read_dlid_path_bits: None,
        read_completion_ts: None,
        read_cvlan: None,
        read_flow_tag: None,
        read_tm_info: None,
        read_completion_wallclock_ns: None,
    };
}

/// `verbs_context.create_cq_ex(ctx, attr)`: the `struct ibv_cq_ex *` (the CQ block), or NULL with `errno`.
pub(super) unsafe extern "C" fn create_cq_ex(
    ctx: *mut IbvContext,
    attr: *mut IbvCqInitAttrEx,
) -> *mut IbvCq {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_create_cq_ex",
        || null_errno(libc::EIO),
        || unsafe { create_cq_ex_inner(ctx, attr) },
    )
}

unsafe fn create_cq_ex_inner(ctx: *mut IbvContext, attr: *mut IbvCqInitAttrEx) -> *mut IbvCq {
    // SAFETY: the caller's attributes (NULL is refused).
    let Some(a) = (unsafe { attr.as_ref() }) else {
        return null_errno(libc::EINVAL);
    };
    if a.wc_flags & !IBV_WC_STANDARD_FLAGS != 0 {
        return null_errno(libc::EOPNOTSUPP);
    }
    if a.comp_mask & !(IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD) != 0 {
        return null_errno(libc::EOPNOTSUPP);
    }
    if a.comp_mask & IBV_CQ_INIT_ATTR_MASK_PD != 0 && !a.parent_domain.is_null() {
        return null_errno(libc::EOPNOTSUPP);
    }
    if a.comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS != 0 {
        let known = IBV_CREATE_CQ_ATTR_SINGLE_THREADED | IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN;
        if a.flags & !known != 0 {
            return null_errno(libc::EINVAL);
        }
        if a.flags & IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN != 0 {
            return null_errno(libc::EOPNOTSUPP);
        }
    }
    let Ok(cqe) = c_int::try_from(a.cqe) else {
        return null_errno(libc::EINVAL);
    };
    // SAFETY: forwarded: `ibv_create_cq`'s checks (context, channel, depth, vector) apply.
    let cq =
        unsafe { rocev2_ibv_create_cq(ctx, cqe, a.cq_context, a.channel, a.comp_vector as c_int) };
    // SAFETY: NULL or a CQ block just made.
    if let Some(c) = unsafe { block::<CqBlock, _>(cq) } {
        // SAFETY: the block is not yet handed out: nobody else reads its tail.
        unsafe {
            *c.ex.get() = CqExTail {
                start_poll: Some(start_poll),
                next_poll: Some(next_poll),
                end_poll: Some(end_poll),
                read_opcode: Some(read_opcode),
                read_vendor_err: Some(read_vendor_err),
                read_byte_len: Some(read_byte_len),
                read_imm_data: Some(read_imm_data),
                read_qp_num: Some(read_qp_num),
                read_src_qp: Some(read_src_qp),
                read_wc_flags: Some(read_wc_flags),
                read_slid: Some(read_slid),
                read_sl: Some(read_sl),
                read_dlid_path_bits: Some(read_dlid_path_bits),
                ..CqExTail::NONE
            }
        };
    }
    cq
}

/// Takes one completion into the CQ's current entry and its `status` / `wr_id`; `ENOENT` when there is none.
///
/// # Safety
/// `c` is the block of `cq`, whose poll lock the caller holds.
unsafe fn take_one(c: &CqBlock) -> c_int {
    let mut w = [Wc::default()];
    if c.rust.poll(&mut w) == 0 {
        set_errno(libc::ENOENT);
        return libc::ENOENT;
    }
    let wc = wc_to_c(&w[0]);
    // SAFETY: the poll lock makes this thread the only one touching the current entry and the tail's status.
    unsafe {
        *c.cur.get() = wc;
        let t = &mut *c.ex.get();
        t.status = wc.status;
        t.wr_id = wc.wr_id;
    }
    0
}

unsafe extern "C" fn start_poll(cq: *mut IbvCq, attr: *mut IbvPollCqAttr) -> c_int {
    // SAFETY: the inline `ibv_start_poll` passes one of our extended CQs.
    let Some(c) = (unsafe { block::<CqBlock, _>(cq) }) else {
        return libc::EINVAL;
    };
    // SAFETY: the caller's attributes, or NULL.
    if unsafe { attr.as_ref() }.is_some_and(|a| a.comp_mask != 0) {
        return libc::EINVAL;
    }
    let me = qp_ex::thread_token();
    loop {
        match c
            .polling
            .compare_exchange_weak(0, me, Ordering::Acquire, Ordering::Relaxed)
        {
            Ok(_) => break,
            // A second start inside this thread's own poll (module docs): refused, the poll goes on.
            Err(holder) if holder == me => return libc::EINVAL,
            Err(_) => std::hint::spin_loop(),
        }
    }
    // SAFETY: the poll lock is held.
    let r = unsafe { take_one(c) };
    if r != 0 {
        // Nothing taken: the poll ends here, without `ibv_end_poll` (ibv_create_cq_ex(3)).
        c.polling.store(0, Ordering::Release);
    }
    r
}

unsafe extern "C" fn next_poll(cq: *mut IbvCq) -> c_int {
    // SAFETY: as `start_poll`.
    let Some(c) = (unsafe { block::<CqBlock, _>(cq) }) else {
        return libc::EINVAL;
    };
    // SAFETY: between a successful `ibv_start_poll` and `ibv_end_poll` the caller holds the poll lock.
    unsafe { take_one(c) }
}

unsafe extern "C" fn end_poll(cq: *mut IbvCq) {
    // SAFETY: as `start_poll`.
    if let Some(c) = unsafe { block::<CqBlock, _>(cq) } {
        c.polling.store(0, Ordering::Release);
    }
}

/// The completion taken last.
///
/// # Safety
/// `cq` is one of our CQs, polled by this thread since a successful `ibv_start_poll`.
unsafe fn cur(cq: *mut IbvCq) -> IbvWc {
    // SAFETY: per the contract.
    match unsafe { block::<CqBlock, _>(cq) } {
        Some(c) => unsafe { *c.cur.get() },
        None => IbvWc::default(),
    }
}

unsafe extern "C" fn read_opcode(cq: *mut IbvCq) -> c_int {
    // SAFETY: per `cur`'s contract (the inline's caller's).
    unsafe { cur(cq) }.opcode
}
unsafe extern "C" fn read_vendor_err(cq: *mut IbvCq) -> u32 {
    // SAFETY: as `read_opcode`.
    unsafe { cur(cq) }.vendor_err
}
unsafe extern "C" fn read_byte_len(cq: *mut IbvCq) -> u32 {
    // SAFETY: as `read_opcode`.
    unsafe { cur(cq) }.byte_len
}
unsafe extern "C" fn read_imm_data(cq: *mut IbvCq) -> u32 {
    // SAFETY: as `read_opcode`.
    unsafe { cur(cq) }.imm_data
}
unsafe extern "C" fn read_qp_num(cq: *mut IbvCq) -> u32 {
    // SAFETY: as `read_opcode`.
    unsafe { cur(cq) }.qp_num
}
unsafe extern "C" fn read_src_qp(cq: *mut IbvCq) -> u32 {
    // SAFETY: as `read_opcode`.
    unsafe { cur(cq) }.src_qp
}
unsafe extern "C" fn read_wc_flags(cq: *mut IbvCq) -> u32 {
    // SAFETY: as `read_opcode`.
    unsafe { cur(cq) }.wc_flags
}
unsafe extern "C" fn read_slid(cq: *mut IbvCq) -> u32 {
    // SAFETY: as `read_opcode`.
    u32::from(unsafe { cur(cq) }.slid)
}
unsafe extern "C" fn read_sl(cq: *mut IbvCq) -> u8 {
    // SAFETY: as `read_opcode`.
    unsafe { cur(cq) }.sl
}
unsafe extern "C" fn read_dlid_path_bits(cq: *mut IbvCq) -> u8 {
    // SAFETY: as `read_opcode`.
    unsafe { cur(cq) }.dlid_path_bits
}
