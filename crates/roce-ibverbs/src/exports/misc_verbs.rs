//! The smaller verbs of the export table beyond the data path: fork support, `ibv_query_qp_data_in_order`, the
//! GID table, `ibv_reg_mr_iova`, `ibv_rereg_mr`, `ibv_resize_cq`, and address vectors from a received completion
//! (`ibv_init_ah_from_wc`, `ibv_create_ah_from_wc`). Each answers as its rdma-core 44 man page says; where this
//! RNIC lacks a capability the answer is that of a provider without it.

use super::*;

versioned! {
    "IBVERBS_1.1": [ibv_fork_init, ibv_rereg_mr, ibv_resize_cq, ibv_init_ah_from_wc, ibv_create_ah_from_wc]
    "IBVERBS_1.7": [ibv_reg_mr_iova]
    "IBVERBS_1.11": [_ibv_query_gid_table]
    "IBVERBS_1.13": [ibv_is_fork_initialized]
    "IBVERBS_1.14": [ibv_query_qp_data_in_order]
}

/// `enum ibv_fork_status` value `IBV_FORK_UNNEEDED`.
const IBV_FORK_UNNEEDED: c_int = 2;

/// `ibv_fork_init()`: 0. The engine reaches registered memory through this process's own mappings (no DMA, no
/// page pinning), so a `fork` cannot leave the RNIC writing into pages the parent no longer owns — the situation
/// ibv_fork_init(3) exists for, and which it calls "unneeded" when the kernel copies pinned pages on fork.
#[unsafe(no_mangle)]
pub extern "C" fn rocev2_ibv_fork_init() -> c_int {
    0
}

/// `ibv_is_fork_initialized()`: `IBV_FORK_UNNEEDED` (see [`rocev2_ibv_fork_init`]).
#[unsafe(no_mangle)]
pub extern "C" fn rocev2_ibv_is_fork_initialized() -> c_int {
    IBV_FORK_UNNEEDED
}

/// `ibv_query_qp_data_in_order(qp, op, flags)`: 0, "not guaranteed". The responder places each packet's payload
/// with one memory copy whose internal byte order is unspecified, so a program may not poll the last byte of a
/// message to learn that the rest has landed (the guarantee this verb reports; rdma-core answers 0 for providers
/// that do not implement it, e.g. rxe).
#[unsafe(no_mangle)]
pub extern "C" fn rocev2_ibv_query_qp_data_in_order(
    _qp: *mut IbvQp,
    _op: c_int,
    _flags: u32,
) -> c_int {
    0
}

/// `_ibv_query_gid_table(ctx, entries, max_entries, flags, entry_size)` (behind the inline
/// `ibv_query_gid_table`): every valid GID of every port (one port here), in `entries` with stride `entry_size`;
/// the count, or `-EINVAL` (bad context, `flags` ≠ 0, `entry_size` smaller than `struct ibv_gid_entry`, or fewer
/// than the table's entries of room).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2__ibv_query_gid_table(
    ctx: *mut IbvContext,
    entries: *mut IbvGidEntry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "_ibv_query_gid_table",
        || -(libc::EIO as isize),
        || unsafe {
            rocev2_ibv_query_gid_table_inner(ctx, entries, max_entries, flags, entry_size)
        },
    )
}

unsafe fn rocev2_ibv_query_gid_table_inner(
    ctx: *mut IbvContext,
    entries: *mut IbvGidEntry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    // SAFETY: the caller passes an open context.
    let Some(c) = (unsafe { ctx_block(ctx) }) else {
        return -(libc::EINVAL as isize);
    };
    let gids = c.dev.spec.gids();
    if flags != 0
        || entry_size < size_of::<IbvGidEntry>()
        || max_entries < gids.len()
        || (entries.is_null() && !gids.is_empty())
    {
        return -(libc::EINVAL as isize);
    }
    for (i, g) in gids.iter().enumerate() {
        // SAFETY: the caller's array of `max_entries` entries of `entry_size` bytes; `i < max_entries`. The stride
        // may leave an entry unaligned for a larger `entry_size`, hence the unaligned write.
        unsafe {
            entries
                .cast::<u8>()
                .add(i * entry_size)
                .cast::<IbvGidEntry>()
                .write_unaligned(IbvGidEntry {
                    gid: g.0,
                    gid_index: i as u32,
                    port_num: 1,
                    gid_type: IBV_GID_TYPE_ROCE_V2,
                    ndev_ifindex: c.dev.spec.ifindex,
                })
        };
    }
    gids.len() as isize
}

/// `ibv_reg_mr_iova(pd, addr, length, iova, access)` (IBVERBS_1.7): as [`rocev2_ibv_reg_mr_iova2`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_reg_mr_iova(
    pd: *mut IbvPd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut IbvMr {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_reg_mr_iova",
        || null_errno(libc::EIO),
        || unsafe { rocev2_ibv_reg_mr_iova_inner(pd, addr, length, iova, access) },
    )
}

unsafe fn rocev2_ibv_reg_mr_iova_inner(
    pd: *mut IbvPd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut IbvMr {
    // SAFETY: forwarded under the same contract.
    unsafe { rocev2_ibv_reg_mr_iova2(pd, addr, length, iova, access as u32) }
}

/// `enum ibv_rereg_mr_flags`.
const IBV_REREG_MR_CHANGE_TRANSLATION: c_int = 1;
const IBV_REREG_MR_CHANGE_PD: c_int = 2;
const IBV_REREG_MR_CHANGE_ACCESS: c_int = 4;
/// `enum ibv_rereg_mr_err_code`.
const IBV_REREG_MR_ERR_INPUT: c_int = -1;
const IBV_REREG_MR_ERR_CMD: c_int = -4;

/// `ibv_rereg_mr(mr, flags, pd, addr, length, access)`: changes the MR's translation (`addr`, `length`), PD and/or
/// access as `flags` says (ibv_rereg_mr(3)), in place: `lkey` and `rkey` stay (as mlx5 and rxe keep them; rdma-core's
/// `test_mr_rereg_*` rely on it), posted WQEs the new PD or memory no longer covers fail with a protection error
/// (roce-proto `rereg.rs`), and on failure the MR is unchanged.
/// Returns 0, `IBV_REREG_MR_ERR_INPUT` (-1, `errno = EINVAL`: unknown flags or none, a foreign MR or PD, or the
/// same checks as `ibv_reg_mr`) or `IBV_REREG_MR_ERR_CMD` (-4, with the registration's `errno`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_rereg_mr(
    mr: *mut IbvMr,
    flags: c_int,
    pd: *mut IbvPd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_rereg_mr",
        || {
            set_errno(libc::EIO);
            IBV_REREG_MR_ERR_CMD
        },
        || unsafe { rocev2_ibv_rereg_mr_inner(mr, flags, pd, addr, length, access) },
    )
}

unsafe fn rocev2_ibv_rereg_mr_inner(
    mr: *mut IbvMr,
    flags: c_int,
    pd: *mut IbvPd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    let input = |e: c_int| {
        set_errno(e);
        IBV_REREG_MR_ERR_INPUT
    };
    let all = IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_ACCESS;
    if flags == 0 || flags & !all != 0 {
        return input(libc::EINVAL);
    }
    // SAFETY: MR blocks are `MrBlock`s.
    let Some(m) = (unsafe { live_block::<MrBlock, _>(mr, Kind::Mr) }) else {
        return input(libc::EINVAL);
    };
    // The new PD is looked up before the MR's lock is taken (`ibv_dereg_mr` takes the live table's lock, then the
    // MR's: never the other way round).
    let asked_pd = if flags & IBV_REREG_MR_CHANGE_PD != 0 {
        // SAFETY: PD blocks are `PdBlock`s.
        match unsafe { live_block::<PdBlock, _>(pd, Kind::Pd) } {
            Some(p) => Some((p, pd)),
            None => return input(libc::EINVAL),
        }
    } else {
        None
    };
    let mut state = m.state.lock().unwrap_or_else(|p| p.into_inner());
    // SAFETY: our MR's C part; read under the MR's lock, which every writer of it holds.
    let cur = unsafe { &*m.mr.get() };
    let (p, new_pd) = match asked_pd {
        Some(x) => x,
        None => {
            let own = state.pd as *mut IbvPd;
            // SAFETY: the MR's own PD is live: the MR counts as one of its users.
            match unsafe { block::<PdBlock, _>(own) } {
                Some(p) => (p, own),
                None => return input(libc::EINVAL),
            }
        }
    };
    let (new_addr, new_len) = if flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0 {
        (addr, length)
    } else {
        (cur.addr, cur.length)
    };
    let new_access = if flags & IBV_REREG_MR_CHANGE_ACCESS != 0 {
        access as u32
    } else {
        state.access
    };
    let checked = match mr_access_checked(new_addr, new_len, new_access) {
        Ok(a) => a,
        Err(e) => {
            set_errno(e);
            return IBV_REREG_MR_ERR_CMD;
        }
    };
    let translation = (flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0).then_some((
        new_addr.cast::<u8>(),
        new_len,
        new_addr as u64,
    ));
    // SAFETY: `mr_access_checked` checked the memory as `ibv_reg_mr` does; the registration's contract is the
    // caller's (ibv_rereg_mr(3): the new range stays valid until deregistration). In place: the keys stay.
    match unsafe {
        state
            .rust
            .rereg_raw(&p.rust, AccessFlags(checked), translation)
    } {
        Ok(fresh) => state.rust = fresh,
        Err(e) => {
            set_errno(e.errno());
            return IBV_REREG_MR_ERR_CMD;
        }
    }
    if new_pd != state.pd as *mut IbvPd {
        p.users.fetch_add(1, Ordering::AcqRel);
        // SAFETY: the old PD is live: this MR was one of its users until now.
        unsafe { count_user::<PdBlock, _>(state.pd as *mut IbvPd, false) };
        state.pd = new_pd as usize;
    }
    state.access = new_access;
    // SAFETY: our MR's C part, written under the MR's lock; the program reads it after the call returns.
    unsafe {
        let c = &mut *m.mr.get();
        c.pd = new_pd;
        c.addr = new_addr;
        c.length = new_len;
        c.lkey = state.rust.lkey().0;
        c.rkey = state.rust.rkey().0;
    }
    0
}

/// `ibv_resize_cq(cq, cqe)`: 0 or an errno. The CQ holds exactly `cqe` completions from then on, grown or shrunk,
/// keeping those queued, and `cq->cqe` says so (ibv_resize_cq(3): "at least" `cqe`). `EINVAL` for `cqe` outside
/// 1..=`max_cqe` or below the completions not yet polled (rxe `rxe_cq.c` `rxe_cq_chk_attr`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_resize_cq(cq: *mut IbvCq, cqe: c_int) -> c_int {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_resize_cq",
        || libc::EIO,
        || unsafe { rocev2_ibv_resize_cq_inner(cq, cqe) },
    )
}

unsafe fn rocev2_ibv_resize_cq_inner(cq: *mut IbvCq, cqe: c_int) -> c_int {
    // SAFETY: CQ blocks are `CqBlock`s.
    let Some(c) = (unsafe { live_block::<CqBlock, _>(cq, Kind::Cq) }) else {
        return libc::EINVAL;
    };
    let Ok(depth) = u32::try_from(cqe) else {
        return libc::EINVAL;
    };
    if depth == 0 {
        return libc::EINVAL;
    }
    match c.rust.resize(depth) {
        Ok(()) => {
            // SAFETY: our CQ's C part (UnsafeCell): the program reads `cqe` after the call.
            unsafe { (*c.cq.get()).cqe = cqe };
            0
        }
        Err(e) => e.errno(),
    }
}

/// The 40-byte GRH area at the start of a UD receive buffer (`struct ibv_grh`): an IPv6 header, or for RoCE v2
/// over IPv4 20 zero bytes and the IPv4 header (as rxe and mlx5 fill it; roce-proto `responder.rs`).
#[repr(C)]
pub struct Grh([u8; 40]);

/// `ibv_init_ah_from_wc(ctx, port, wc, grh, ah_attr)`: the address vector that answers the sender of the UD
/// receive `wc` whose GRH area is `grh` (ibv_init_ah_from_wc(3)): destination GID = the packet's source address
/// (IPv4-mapped for IPv4), source GID index = the index of our GID the packet was sent to, the packet's flow label
/// and traffic class, hop limit 0xff, `is_global` 1. 0 or an errno: `EINVAL` without `IBV_WC_GRH`, for a bad
/// context or port, or when the packet's destination is none of our GIDs; `EPROTONOSUPPORT` for a GRH area that
/// holds neither header.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_init_ah_from_wc(
    ctx: *mut IbvContext,
    port: u8,
    wc: *const IbvWc,
    grh: *const Grh,
    ah: *mut IbvAhAttr,
) -> c_int {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_init_ah_from_wc",
        || libc::EIO,
        || unsafe { rocev2_ibv_init_ah_from_wc_inner(ctx, port, wc, grh, ah) },
    )
}

unsafe fn rocev2_ibv_init_ah_from_wc_inner(
    ctx: *mut IbvContext,
    port: u8,
    wc: *const IbvWc,
    grh: *const Grh,
    ah: *mut IbvAhAttr,
) -> c_int {
    // SAFETY: the caller passes an open context and its structures.
    let (Some(c), Some(w), Some(g)) = (unsafe { ctx_block(ctx) }, unsafe { wc.as_ref() }, unsafe {
        grh.as_ref()
    }) else {
        return libc::EINVAL;
    };
    if port != 1 || ah.is_null() || w.wc_flags & 1 == 0 {
        return libc::EINVAL;
    }
    let g = &g.0;
    let (sgid, dgid, tclass, flow) = if g[0] >> 4 == 6 {
        let vtf = u32::from_be_bytes([g[0], g[1], g[2], g[3]]);
        let mut s = [0u8; 16];
        let mut d = [0u8; 16];
        s.copy_from_slice(&g[8..24]);
        d.copy_from_slice(&g[24..40]);
        (s, d, (vtf >> 20) as u8, vtf & 0xf_ffff)
    } else if g[20] >> 4 == 4 && g[..20].iter().all(|&b| b == 0) {
        let mapped = |a: &[u8]| {
            let mut m = [0u8; 16];
            m[10] = 0xff;
            m[11] = 0xff;
            m[12..].copy_from_slice(a);
            m
        };
        (mapped(&g[32..36]), mapped(&g[36..40]), g[21], 0)
    } else {
        return libc::EPROTONOSUPPORT;
    };
    let Some(index) = c.dev.spec.gids().iter().position(|x| x.0 == dgid) else {
        return libc::EINVAL;
    };
    let out = IbvAhAttr {
        grh: IbvGlobalRoute {
            dgid: sgid,
            flow_label: flow,
            sgid_index: index as u8,
            hop_limit: 0xff,
            traffic_class: tclass,
        },
        dlid: w.slid,
        sl: w.sl,
        src_path_bits: w.dlid_path_bits,
        static_rate: 0,
        is_global: 1,
        port_num: port,
    };
    // SAFETY: the caller's out-parameter.
    unsafe { ah.write(out) };
    0
}

/// `ibv_create_ah_from_wc(pd, wc, grh, port)`: [`rocev2_ibv_init_ah_from_wc`] then `ibv_create_ah`; NULL with
/// `errno` on failure.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_create_ah_from_wc(
    pd: *mut IbvPd,
    wc: *const IbvWc,
    grh: *const Grh,
    port: u8,
) -> *mut IbvAh {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_create_ah_from_wc",
        || null_errno(libc::EIO),
        || unsafe { rocev2_ibv_create_ah_from_wc_inner(pd, wc, grh, port) },
    )
}

unsafe fn rocev2_ibv_create_ah_from_wc_inner(
    pd: *mut IbvPd,
    wc: *const IbvWc,
    grh: *const Grh,
    port: u8,
) -> *mut IbvAh {
    // SAFETY: PD blocks are `PdBlock`s.
    let Some(p) = (unsafe { live_block::<PdBlock, _>(pd, Kind::Pd) }) else {
        return null_errno(libc::EINVAL);
    };
    let mut attr = IbvAhAttr::default();
    // SAFETY: forwarded under the same contract; `attr` is ours.
    match unsafe { rocev2_ibv_init_ah_from_wc(p.pd.context, port, wc, grh, &mut attr) } {
        // SAFETY: a PD of ours and our attributes.
        0 => unsafe { rocev2_ibv_create_ah(pd, &mut attr) },
        e => null_errno(e),
    }
}
