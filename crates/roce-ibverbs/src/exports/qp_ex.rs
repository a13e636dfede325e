//! Extended QPs and the new post-send API: the `verbs_context.create_qp_ex` slot (`ibv_create_qp_ex`),
//! `ibv_qp_to_qp_ex`, and the `struct ibv_qp_ex` work-request builders (`ibv_wr_start`, `ibv_wr_send`,
//! `ibv_wr_rdma_write`, `ibv_wr_set_sge`, … `ibv_wr_complete` / `ibv_wr_abort`; ibv_wr_post(3)).
//!
//! Every QP block carries the `ibv_qp_ex` tail after its `ibv_qp` (`ibv_qp_ex` starts with an `ibv_qp`); only QPs
//! created with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS` have its function pointers set and are returned by
//! `ibv_qp_to_qp_ex` (NULL otherwise, as libibverbs' `VERBS_QP_EX` test). Rules, as rdma-core 44's rxe provider
//! (`providers/rxe/rxe.c` `check_qp_init_attr`, `wr_start` / `wr_complete` / `wr_abort`) answers them:
//! * `comp_mask` bits other than PD, CREATE_FLAGS and SEND_OPS_FLAGS, any `create_flags`, and `send_ops_flags`
//!   beyond the QP type's set are `EOPNOTSUPP`; a missing PD is `EINVAL`. The sets: RC — RDMA WRITE (with
//!   immediate), SEND (with immediate, with invalidate), RDMA READ, compare-and-swap, fetch-and-add, LOCAL_INV,
//!   BIND_MW, ATOMIC_WRITE; UC — RDMA WRITE (with immediate), SEND (with immediate, with invalidate), LOCAL_INV,
//!   BIND_MW; UD — SEND (with immediate);
//! * `ibv_wr_start` takes the QP's builder lock (rxe's send-queue spin lock; another thread's `ibv_wr_start` waits
//!   for it). A second `ibv_wr_start` by the thread that holds it, before `ibv_wr_complete` / `ibv_wr_abort`, spins
//!   for ever on rxe and mlx5 (`pthread_spin_lock` on `sq.lock`; mlx5's single-threaded mode aborts with
//!   "multithreading violation"). Here it never hangs and posts nothing the program did not complete: it keeps the
//!   open batch and marks it `EINVAL`, so `ibv_wr_complete` posts none of its WRs and answers `EINVAL` (the
//!   all-or-nothing answer of any misuse inside a batch, below) and `ibv_wr_abort` drops them; either releases the
//!   lock (issue #21). Builder calls, `ibv_wr_complete` and `ibv_wr_abort` from a thread that does not hold the
//!   lock (no `ibv_wr_start` before) touch nothing; `ibv_wr_complete` then answers `EINVAL`. Each `ibv_wr_<op>`
//!   starts a WR with
//!   the `wr_id` and `wr_flags` the program set in the `ibv_qp_ex`, and the `ibv_wr_set_*` calls complete it; the
//!   inline data is copied when it is set (the buffer may be reused at once, ibv_wr_post(3));
//! * `ibv_wr_complete` posts the WRs (exactly as `ibv_post_send` would post the same chain: the same checks and
//!   errors) and returns 0 or the errno; when a builder call failed before (an operation outside the QP's
//!   `send_ops_flags`, no WR started), nothing is posted and that errno is returned; `ibv_wr_abort` drops them.

use super::*;

/// `enum ibv_qp_init_attr_mask` (`IBV_QP_INIT_ATTR_PD`: `crate::abi`).
const IBV_QP_INIT_ATTR_CREATE_FLAGS: u32 = 4;
const IBV_QP_INIT_ATTR_SEND_OPS_FLAGS: u32 = 64;
/// `enum ibv_qp_create_send_ops_flags`.
const WITH_RDMA_WRITE: u64 = 1;
const WITH_RDMA_WRITE_WITH_IMM: u64 = 2;
const WITH_SEND: u64 = 4;
const WITH_SEND_WITH_IMM: u64 = 8;
const WITH_RDMA_READ: u64 = 16;
const WITH_ATOMIC_CMP_AND_SWP: u64 = 32;
const WITH_ATOMIC_FETCH_AND_ADD: u64 = 64;
const WITH_LOCAL_INV: u64 = 128;
const WITH_BIND_MW: u64 = 256;
const WITH_SEND_WITH_INV: u64 = 512;
const WITH_ATOMIC_WRITE: u64 = 4096;
const RC_OPS: u64 = WITH_RDMA_WRITE
    | WITH_LOCAL_INV
    | WITH_BIND_MW
    | WITH_ATOMIC_WRITE
    | WITH_RDMA_WRITE_WITH_IMM
    | WITH_SEND
    | WITH_SEND_WITH_IMM
    | WITH_RDMA_READ
    | WITH_ATOMIC_CMP_AND_SWP
    | WITH_ATOMIC_FETCH_AND_ADD
    | WITH_SEND_WITH_INV;
const UC_OPS: u64 = WITH_RDMA_WRITE
    | WITH_LOCAL_INV
    | WITH_BIND_MW
    | WITH_RDMA_WRITE_WITH_IMM
    | WITH_SEND
    | WITH_SEND_WITH_IMM
    | WITH_SEND_WITH_INV;
const UD_OPS: u64 = WITH_SEND | WITH_SEND_WITH_IMM;
// `enum ibv_wr_opcode` and `enum ibv_qp_type`: `crate::abi`.

/// What `create_qp_ex` reads of `struct ibv_qp_init_attr_ex`.
struct Req {
    comp_mask: u32,
    create_flags: u32,
    qp_type: c_int,
    pd: *mut IbvPd,
    send_ops_flags: u64,
}

/// `struct ibv_data_buf`.
#[repr(C)]
struct IbvDataBuf {
    addr: *const u8,
    length: usize,
}

type Qx = *mut IbvQp;

/// What `struct ibv_qp_ex` has after its `struct ibv_qp` head (offset 160: `comp_mask`, `wr_id`, `wr_flags` and 21
/// function pointers, 352 bytes in all; NULL on a QP without send_ops_flags).
#[repr(C)]
pub(super) struct QpExTail {
    comp_mask: u64,
    wr_id: u64,
    wr_flags: u32,
    wr_atomic_cmp_swp: Option<unsafe extern "C" fn(Qx, u32, u64, u64, u64)>,
    wr_atomic_fetch_add: Option<unsafe extern "C" fn(Qx, u32, u64, u64)>,
    wr_bind_mw: Option<unsafe extern "C" fn(Qx, *mut c_void, u32, *const c_void)>,
    wr_local_inv: Option<unsafe extern "C" fn(Qx, u32)>,
    wr_rdma_read: Option<unsafe extern "C" fn(Qx, u32, u64)>,
    wr_rdma_write: Option<unsafe extern "C" fn(Qx, u32, u64)>,
    wr_rdma_write_imm: Option<unsafe extern "C" fn(Qx, u32, u64, u32)>,
    wr_send: Option<unsafe extern "C" fn(Qx)>,
    wr_send_imm: Option<unsafe extern "C" fn(Qx, u32)>,
    wr_send_inv: Option<unsafe extern "C" fn(Qx, u32)>,
    wr_send_tso: Option<unsafe extern "C" fn(Qx, *mut c_void, u16, u16)>,
    wr_set_ud_addr: Option<unsafe extern "C" fn(Qx, *mut IbvAh, u32, u32)>,
    wr_set_xrc_srqn: Option<unsafe extern "C" fn(Qx, u32)>,
    wr_set_inline_data: Option<unsafe extern "C" fn(Qx, *const u8, usize)>,
    wr_set_inline_data_list: Option<unsafe extern "C" fn(Qx, usize, *const IbvDataBuf)>,
    wr_set_sge: Option<unsafe extern "C" fn(Qx, u32, u64, u32)>,
    wr_set_sge_list: Option<unsafe extern "C" fn(Qx, usize, *const IbvSge)>,
    wr_start: Option<unsafe extern "C" fn(Qx)>,
    wr_complete: Option<unsafe extern "C" fn(Qx) -> c_int>,
    wr_abort: Option<unsafe extern "C" fn(Qx)>,
    wr_atomic_write: Option<unsafe extern "C" fn(Qx, u32, u64, *const c_void)>,
}

impl QpExTail {
    /// The tail of a QP without the new post-send API.
    pub(super) const NONE: QpExTail = QpExTail {
        comp_mask: 0,
        wr_id: 0,
        wr_flags: 0,
        wr_atomic_cmp_swp: None,
        wr_atomic_fetch_add: None,
        wr_bind_mw: None,
        wr_local_inv: None,
        wr_rdma_read: None,
        wr_rdma_write: None,
        wr_rdma_write_imm: None,
        wr_send: None,
        wr_send_imm: None,
        wr_send_inv: None,
        wr_send_tso: None,
        wr_set_ud_addr: None,
        wr_set_xrc_srqn: None,
        wr_set_inline_data: None,
        wr_set_inline_data_list: None,
        wr_set_sge: None,
        wr_set_sge_list: None,
        wr_start: None,
        wr_complete: None,
        wr_abort: None,
        wr_atomic_write: None,
    };
}

/// One WR being built: the `ibv_send_wr` `ibv_wr_complete` posts, its SGEs and its inline bytes.
struct Built {
    wr: IbvSendWr,
    sges: Vec<IbvSge>,
    inline: Option<Vec<u8>>,
}

/// The WRs between `ibv_wr_start` and `ibv_wr_complete` (under the QP's builder lock).
#[derive(Default)]
pub(super) struct WrBatch {
    /// The QP's `send_ops_flags` (0: not an extended QP).
    ops: u64,
    wrs: Vec<Built>,
    /// The first builder error (an errno), reported by `ibv_wr_complete`.
    err: c_int,
}

/// `verbs_context.create_qp_ex(ctx, attr)`: the QP, or NULL with `errno`.
pub(super) unsafe extern "C" fn create_qp_ex(
    ctx: *mut IbvContext,
    attr: *mut IbvQpInitAttrEx,
) -> *mut IbvQp {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_create_qp_ex",
        || null_errno(libc::EIO),
        || unsafe { create_qp_ex_inner(ctx, attr) },
    )
}

unsafe fn create_qp_ex_inner(ctx: *mut IbvContext, attr: *mut IbvQpInitAttrEx) -> *mut IbvQp {
    // SAFETY: the caller's attributes (NULL is refused), read into a copy of the members used here (`ibv_create_qp`
    // below writes the granted `cap` back through `attr`).
    let Some(a) = (unsafe { attr.as_ref() }).map(|a| Req {
        comp_mask: a.comp_mask,
        create_flags: a.create_flags,
        qp_type: a.qp_type,
        pd: a.pd,
        send_ops_flags: a.send_ops_flags,
    }) else {
        return null_errno(libc::EINVAL);
    };
    let known =
        IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    if a.comp_mask & !known != 0 {
        return null_errno(libc::EOPNOTSUPP);
    }
    if a.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0 {
        return null_errno(libc::EOPNOTSUPP);
    }
    let ops = if a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0 {
        let allowed = match a.qp_type {
            IBV_QPT_RC => RC_OPS,
            IBV_QPT_UC => UC_OPS,
            IBV_QPT_UD => UD_OPS,
            _ => 0,
        };
        if a.send_ops_flags & !allowed != 0 {
            return null_errno(libc::EOPNOTSUPP);
        }
        a.send_ops_flags
    } else {
        0
    };
    if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 || a.pd.is_null() {
        return null_errno(libc::EINVAL);
    }
    // SAFETY: `struct ibv_qp_init_attr_ex` starts with the members of `struct ibv_qp_init_attr` (what
    // `ibv_create_qp_ex`'s own fallback passes too); the PD's context must be `ctx` (checked below on the made QP);
    // `ibv_create_qp`'s checks apply.
    let qp = unsafe { rocev2_ibv_create_qp(a.pd, attr.cast::<IbvQpInitAttr>()) };
    // SAFETY: NULL or a QP block just made.
    let Some(q) = (unsafe { block::<QpBlock, _>(qp) }) else {
        return qp;
    };
    // SAFETY: our QP's C part.
    if unsafe { (*q.qp.get()).context } != ctx {
        // SAFETY: the QP just made, not handed out.
        unsafe { rocev2_ibv_destroy_qp(qp) };
        return null_errno(libc::EINVAL);
    }
    if ops != 0 {
        // SAFETY: the block is not yet handed out: nobody else reads its tail or batch.
        unsafe {
            (*q.batch.get()).ops = ops;
            *q.ex.get() = QpExTail {
                wr_atomic_cmp_swp: Some(wr_atomic_cmp_swp),
                wr_atomic_fetch_add: Some(wr_atomic_fetch_add),
                wr_bind_mw: Some(wr_bind_mw),
                wr_local_inv: Some(wr_local_inv),
                wr_rdma_read: Some(wr_rdma_read),
                wr_rdma_write: Some(wr_rdma_write),
                wr_rdma_write_imm: Some(wr_rdma_write_imm),
                wr_send: Some(wr_send),
                wr_send_imm: Some(wr_send_imm),
                wr_send_inv: Some(wr_send_inv),
                wr_send_tso: Some(wr_send_tso),
                wr_set_ud_addr: Some(wr_set_ud_addr),
                wr_set_xrc_srqn: Some(wr_set_xrc_srqn),
                wr_set_inline_data: Some(wr_set_inline_data),
                wr_set_inline_data_list: Some(wr_set_inline_data_list),
                wr_set_sge: Some(wr_set_sge),
                wr_set_sge_list: Some(wr_set_sge_list),
                wr_start: Some(wr_start),
                wr_complete: Some(wr_complete),
                wr_abort: Some(wr_abort),
                wr_atomic_write: Some(wr_atomic_write),
                ..QpExTail::NONE
            };
        }
    }
    qp
}

/// `ibv_qp_to_qp_ex(qp)`: the QP as `struct ibv_qp_ex *` when it was created with `send_ops_flags`, else NULL
/// (libibverbs' `VERBS_QP_EX` test).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_qp_to_qp_ex(qp: *mut IbvQp) -> *mut IbvQp {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard("ibv_qp_to_qp_ex", null_mut, || {
        // SAFETY: QP blocks are `QpBlock`s.
        match unsafe { live_block::<QpBlock, _>(qp, Kind::Qp) } {
            // SAFETY: `ops` is written before the QP is handed out and never again.
            Some(q) if unsafe { (*q.batch.get()).ops } != 0 => qp,
            _ => null_mut(),
        }
    })
}

/// The QP's batch, for a builder call between `ibv_wr_start` and `ibv_wr_complete` / `ibv_wr_abort`; `None` when
/// this thread does not hold the QP's builder lock (a builder, complete or abort without `ibv_wr_start`, or while
/// another thread builds): the call is then refused instead of touching a batch another thread may be writing.
///
/// # Safety
/// `qp` is one of our extended QPs.
unsafe fn batch<'a>(qp: Qx) -> Option<(&'a QpBlock, &'a mut WrBatch)> {
    // SAFETY: per the contract.
    let q = unsafe { block::<QpBlock, _>(qp) }?;
    if q.building.load(Ordering::Acquire) != thread_token() {
        return None;
    }
    // SAFETY: the builder lock, held by this thread (checked above), makes it the only user of the batch.
    Some((q, unsafe { &mut *q.batch.get() }))
}

/// Starts a WR of `opcode` (needing send_ops flag `flag`) with the `wr_id` / `wr_flags` the program set.
///
/// # Safety
/// As [`batch`].
unsafe fn start_wr(qp: Qx, flag: u64, opcode: c_int, fill: impl FnOnce(&mut IbvSendWr)) {
    // SAFETY: per the contract.
    let Some((q, b)) = (unsafe { batch(qp) }) else {
        return;
    };
    if b.ops & flag == 0 {
        if b.err == 0 {
            b.err = libc::EOPNOTSUPP;
        }
        return;
    }
    // SAFETY: the program wrote `wr_id` / `wr_flags` before the call; this thread holds the builder lock.
    let (wr_id, flags) = unsafe {
        let t = &*q.ex.get();
        (t.wr_id, t.wr_flags)
    };
    let mut wr = IbvSendWr {
        wr_id,
        next: null_mut(),
        sg_list: null_mut(),
        num_sge: 0,
        opcode,
        send_flags: flags,
        imm_data: 0,
        wr: SendWrUnion {
            w0: 0,
            w1: 0,
            w2: 0,
            w3: 0,
        },
        qp_type_xrc_remote_srqn: 0,
        bind_mw_tso: [0; 6],
    };
    fill(&mut wr);
    b.wrs.push(Built {
        wr,
        sges: Vec::new(),
        inline: None,
    });
}

/// The WR started last (the `ibv_wr_set_*` calls complete it); none: a builder error.
///
/// # Safety
/// As [`batch`].
unsafe fn last<'a>(qp: Qx) -> Option<&'a mut Built> {
    // SAFETY: per the contract.
    let (_, b) = unsafe { batch(qp) }?;
    if b.wrs.is_empty() && b.err == 0 {
        b.err = libc::EINVAL;
    }
    b.wrs.last_mut()
}

/// A builder for an operation this RNIC does not offer (never in a QP's `send_ops_flags`): `EOPNOTSUPP`.
///
/// # Safety
/// As [`batch`].
unsafe fn unsupported(qp: Qx) {
    // SAFETY: per the contract.
    if let Some((_, b)) = unsafe { batch(qp) }
        && b.err == 0
    {
        b.err = libc::EOPNOTSUPP;
    }
}

/// This thread's builder-lock token: the address of a thread-local, unique among live threads and never 0.
pub(super) fn thread_token() -> usize {
    thread_local! {
        static TOKEN: u8 = const { 0 };
    }
    TOKEN.with(|t| t as *const u8 as usize)
}

unsafe extern "C" fn wr_start(qp: Qx) {
    // SAFETY: the inline `ibv_wr_start` passes one of our extended QPs.
    let Some(q) = (unsafe { block::<QpBlock, _>(qp) }) else {
        return;
    };
    let me = thread_token();
    loop {
        match q
            .building
            .compare_exchange_weak(0, me, Ordering::Acquire, Ordering::Relaxed)
        {
            Ok(_) => break,
            Err(holder) if holder == me => {
                // A second start inside this thread's own batch (module docs): keep the batch, fail it.
                // SAFETY: this thread holds the builder lock.
                let b = unsafe { &mut *q.batch.get() };
                if b.err == 0 {
                    b.err = libc::EINVAL;
                }
                return;
            }
            Err(_) => std::hint::spin_loop(),
        }
    }
    // SAFETY: the builder lock is held now.
    let b = unsafe { &mut *q.batch.get() };
    b.wrs.clear();
    b.err = 0;
}

unsafe extern "C" fn wr_complete(qp: Qx) -> c_int {
    // SAFETY: the inline `ibv_wr_complete` passes one of our QPs, after `ibv_wr_start`.
    let Some((q, b)) = (unsafe { batch(qp) }) else {
        return libc::EINVAL;
    };
    let mut wrs = std::mem::take(&mut b.wrs);
    let err = std::mem::take(&mut b.err);
    q.building.store(0, Ordering::Release);
    if err != 0 || wrs.is_empty() {
        return err;
    }
    // Link the chain: each WR's SGEs (or its inline bytes as one SGE) and its successor.
    let n = wrs.len();
    for i in 0..n {
        let (head, tail) = wrs.split_at_mut(i + 1);
        let w = &mut head[i];
        if let Some(data) = &mut w.inline {
            w.sges = vec![IbvSge {
                addr: data.as_mut_ptr() as u64,
                length: data.len() as u32,
                lkey: 0,
            }];
            w.wr.send_flags |= IBV_SEND_INLINE;
        }
        w.wr.sg_list = w.sges.as_mut_ptr();
        w.wr.num_sge = w.sges.len() as c_int;
        w.wr.next = tail
            .first_mut()
            .map_or(null_mut(), |x| &mut x.wr as *mut IbvSendWr);
    }
    let mut bad = null_mut();
    // SAFETY: a well-formed chain of our own, alive until the post returns (inline bytes are copied by it).
    unsafe { post_send_inner(qp, &mut wrs[0].wr, &mut bad) }
}

unsafe extern "C" fn wr_abort(qp: Qx) {
    // SAFETY: the inline `ibv_wr_abort` passes one of our QPs, after `ibv_wr_start`.
    if let Some((q, b)) = unsafe { batch(qp) } {
        b.wrs.clear();
        b.err = 0;
        q.building.store(0, Ordering::Release);
    }
}

unsafe extern "C" fn wr_atomic_cmp_swp(qp: Qx, rkey: u32, addr: u64, compare: u64, swap: u64) {
    // SAFETY: the caller holds the builder lock (`ibv_wr_start`).
    unsafe {
        start_wr(
            qp,
            WITH_ATOMIC_CMP_AND_SWP,
            IBV_WR_ATOMIC_CMP_AND_SWP,
            |w| {
                w.wr = SendWrUnion {
                    w0: addr,
                    w1: compare,
                    w2: swap,
                    w3: u64::from(rkey),
                }
            },
        )
    }
}
unsafe extern "C" fn wr_atomic_fetch_add(qp: Qx, rkey: u32, addr: u64, add: u64) {
    // SAFETY: as `wr_atomic_cmp_swp`.
    unsafe {
        start_wr(
            qp,
            WITH_ATOMIC_FETCH_AND_ADD,
            IBV_WR_ATOMIC_FETCH_AND_ADD,
            |w| {
                w.wr = SendWrUnion {
                    w0: addr,
                    w1: add,
                    w2: 0,
                    w3: u64::from(rkey),
                }
            },
        )
    }
}
/// `ibv_wr_bind_mw(qp, mw, rkey, bind_info)`: a BIND_MW WR (`exports/mw.rs` has its rules; a NULL `bind_info`
/// binds nothing: `EINVAL` at `ibv_wr_complete`).
unsafe extern "C" fn wr_bind_mw(qp: Qx, mw: *mut c_void, rkey: u32, info: *const c_void) {
    // SAFETY: the program's bind info (NULL: none).
    let info = unsafe { info.cast::<IbvMwBindInfo>().as_ref() }.copied();
    // SAFETY: as `wr_atomic_cmp_swp`.
    unsafe {
        start_wr(qp, WITH_BIND_MW, IBV_WR_BIND_MW, |w| {
            w.bind_mw_tso = match info {
                Some(i) => [
                    mw as usize as u64,
                    u64::from(rkey),
                    i.mr as usize as u64,
                    i.addr,
                    i.length,
                    u64::from(i.mw_access_flags),
                ],
                // A NULL window with a length is refused by the post.
                None => [0, 0, 0, 0, 1, 0],
            };
        })
    }
}
unsafe extern "C" fn wr_local_inv(qp: Qx, rkey: u32) {
    // SAFETY: as `wr_atomic_cmp_swp`.
    unsafe { start_wr(qp, WITH_LOCAL_INV, IBV_WR_LOCAL_INV, |w| w.imm_data = rkey) }
}
/// The `wr.rdma` part: remote address and R_Key.
fn rdma(addr: u64, rkey: u32) -> SendWrUnion {
    SendWrUnion {
        w0: addr,
        w1: u64::from(rkey),
        w2: 0,
        w3: 0,
    }
}
unsafe extern "C" fn wr_rdma_read(qp: Qx, rkey: u32, addr: u64) {
    // SAFETY: as `wr_atomic_cmp_swp`.
    unsafe {
        start_wr(qp, WITH_RDMA_READ, IBV_WR_RDMA_READ, |w| {
            w.wr = rdma(addr, rkey)
        })
    }
}
unsafe extern "C" fn wr_rdma_write(qp: Qx, rkey: u32, addr: u64) {
    // SAFETY: as `wr_atomic_cmp_swp`.
    unsafe {
        start_wr(qp, WITH_RDMA_WRITE, IBV_WR_RDMA_WRITE, |w| {
            w.wr = rdma(addr, rkey)
        })
    }
}
unsafe extern "C" fn wr_rdma_write_imm(qp: Qx, rkey: u32, addr: u64, imm: u32) {
    // SAFETY: as `wr_atomic_cmp_swp`.
    unsafe {
        start_wr(
            qp,
            WITH_RDMA_WRITE_WITH_IMM,
            IBV_WR_RDMA_WRITE_WITH_IMM,
            |w| {
                w.wr = rdma(addr, rkey);
                w.imm_data = imm;
            },
        )
    }
}
unsafe extern "C" fn wr_send(qp: Qx) {
    // SAFETY: as `wr_atomic_cmp_swp`.
    unsafe { start_wr(qp, WITH_SEND, IBV_WR_SEND, |_| ()) }
}
unsafe extern "C" fn wr_send_imm(qp: Qx, imm: u32) {
    // SAFETY: as `wr_atomic_cmp_swp`.
    unsafe {
        start_wr(qp, WITH_SEND_WITH_IMM, IBV_WR_SEND_WITH_IMM, |w| {
            w.imm_data = imm
        })
    }
}
unsafe extern "C" fn wr_send_inv(qp: Qx, rkey: u32) {
    // SAFETY: as `wr_atomic_cmp_swp`.
    unsafe {
        start_wr(qp, WITH_SEND_WITH_INV, IBV_WR_SEND_WITH_INV, |w| {
            w.imm_data = rkey
        })
    }
}
unsafe extern "C" fn wr_send_tso(qp: Qx, _hdr: *mut c_void, _hdr_sz: u16, _mss: u16) {
    // SAFETY: as `wr_atomic_cmp_swp`.
    unsafe { unsupported(qp) }
}
unsafe extern "C" fn wr_set_xrc_srqn(qp: Qx, _srqn: u32) {
    // SAFETY: as `wr_atomic_cmp_swp`.
    unsafe { unsupported(qp) }
}
/// `ibv_wr_atomic_write(qp, rkey, remote_addr, atomic_wr)`: an ATOMIC_WRITE WR whose 8 bytes are copied from
/// `atomic_wr` now (posted as its one inline SGE, which the post reads again at `ibv_wr_complete`).
unsafe extern "C" fn wr_atomic_write(qp: Qx, rkey: u32, addr: u64, data: *const c_void) {
    let bytes = if data.is_null() {
        None
    } else {
        // SAFETY: the program's 8 bytes (ibv_wr_post(3)).
        Some(unsafe { ptr::read_unaligned(data.cast::<[u8; 8]>()) })
    };
    // SAFETY: as `wr_atomic_cmp_swp`.
    unsafe {
        start_wr(qp, WITH_ATOMIC_WRITE, IBV_WR_ATOMIC_WRITE, |w| {
            w.wr = rdma(addr, rkey)
        })
    }
    // SAFETY: as `wr_atomic_cmp_swp`.
    if let Some(w) = unsafe { last(qp) }
        && w.wr.opcode == IBV_WR_ATOMIC_WRITE
    {
        // No bytes (NULL): no SGE, `EINVAL` at `ibv_wr_complete`.
        w.inline = bytes.map(|b| b.to_vec());
    }
}
unsafe extern "C" fn wr_set_ud_addr(qp: Qx, ah: *mut IbvAh, qpn: u32, qkey: u32) {
    // SAFETY: as `wr_atomic_cmp_swp`.
    if let Some(w) = unsafe { last(qp) } {
        w.wr.wr.w0 = ah as usize as u64;
        w.wr.wr.w1 = u64::from(qpn) | (u64::from(qkey) << 32);
    }
}
unsafe extern "C" fn wr_set_sge(qp: Qx, lkey: u32, addr: u64, length: u32) {
    // SAFETY: as `wr_atomic_cmp_swp`.
    if let Some(w) = unsafe { last(qp) } {
        w.inline = None;
        w.sges = vec![IbvSge { addr, length, lkey }];
    }
}
unsafe extern "C" fn wr_set_sge_list(qp: Qx, n: usize, list: *const IbvSge) {
    // SAFETY: as `wr_atomic_cmp_swp`.
    let Some(w) = (unsafe { last(qp) }) else {
        return;
    };
    w.inline = None;
    w.sges.clear();
    if n == 0 {
        return;
    }
    if list.is_null() || n > MAX_SGE {
        // Posted as more SGEs than the QP takes: `ibv_post_send`'s EINVAL at `ibv_wr_complete`.
        w.sges = vec![IbvSge::default(); n.min(MAX_SGE + 1)];
        return;
    }
    // SAFETY: the caller's array of `n` SGEs.
    w.sges
        .extend_from_slice(unsafe { std::slice::from_raw_parts(list, n) });
}
unsafe extern "C" fn wr_set_inline_data(qp: Qx, addr: *const u8, length: usize) {
    let buf = IbvDataBuf { addr, length };
    // SAFETY: as `wr_atomic_cmp_swp`; one buffer.
    unsafe { wr_set_inline_data_list(qp, 1, &buf) }
}
unsafe extern "C" fn wr_set_inline_data_list(qp: Qx, n: usize, bufs: *const IbvDataBuf) {
    // SAFETY: as `wr_atomic_cmp_swp`.
    let Some(w) = (unsafe { last(qp) }) else {
        return;
    };
    w.sges.clear();
    let mut data = Vec::new();
    if n > 0 && !bufs.is_null() {
        // SAFETY: the caller's array of `n` buffers.
        for b in unsafe { std::slice::from_raw_parts(bufs, n) } {
            if b.length > 0 && !b.addr.is_null() {
                // SAFETY: the caller's buffer of `length` bytes, copied now (ibv_wr_post(3)).
                data.extend_from_slice(unsafe { std::slice::from_raw_parts(b.addr, b.length) });
            }
        }
    }
    w.inline = Some(data);
}
