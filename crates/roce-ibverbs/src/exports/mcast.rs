//! `ibv_attach_mcast` / `ibv_detach_mcast` (ibv_attach_mcast(3)): a UD QP joins or leaves a multicast group
//! ([`roce_verbs::Qp::attach_mcast`]; the engine's rules in `roce_proto::mcast`). The errors are the kernel's and
//! rxe's, returned as the value (rdma-core returns the errno of the command): EINVAL for a pointer that is not a QP
//! of ours, a QP that is not UD or a GID that is not multicast (`ib_attach_mcast`), and — as rxe's
//! `rxe_detach_mcg` — for a detach from a group the QP is not attached to; ENOMEM past `max_mcast_grp`,
//! `max_mcast_qp_attach` or `max_total_mcast_qp_attach` (rxe); EIO when the link cannot join the IP group. A second
//! attach of one QP to one group succeeds and changes nothing (rxe `rxe_attach_mcg`). The LID is ignored, as on every
//! RoCE port (`is_valid_mcast_lid`). `ibv_destroy_qp` is refused with EBUSY while the QP is attached
//! (`rxe_qp_chk_destroy`).

use super::*;

/// The GID `gid` points at, or `None` for NULL.
///
/// # Safety
/// `gid` is NULL or points at 16 readable bytes (`union ibv_gid`).
unsafe fn read_gid(gid: *const [u8; 16]) -> Option<Gid> {
    // SAFETY: per the contract.
    unsafe { gid.as_ref() }.map(|g| Gid(*g))
}

/// # Safety
/// `qp` is NULL or a QP of this library; `gid` NULL or a `union ibv_gid`.
unsafe fn mcast(qp: *mut IbvQp, gid: *const [u8; 16], attach: bool) -> c_int {
    // SAFETY: per the contract (a pointer that is not a live QP answers EINVAL).
    let (Some(q), Some(g)) = (unsafe { live_block::<QpBlock, _>(qp, Kind::Qp) }, unsafe {
        read_gid(gid)
    }) else {
        return libc::EINVAL;
    };
    let r = if attach {
        q.rust.attach_mcast(g)
    } else {
        q.rust.detach_mcast(g)
    };
    match r {
        Ok(()) => 0,
        Err(e) => e.errno(),
    }
}

/// `ibv_attach_mcast(qp, gid, lid)`: 0 or an errno value (module docs).
///
/// # Safety
/// `qp` is NULL or a QP of this library; `gid` NULL or a `union ibv_gid`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_attach_mcast(
    qp: *mut IbvQp,
    gid: *const [u8; 16],
    _lid: u16,
) -> c_int {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_attach_mcast",
        || libc::EIO,
        || unsafe { mcast(qp, gid, true) },
    )
}

/// `ibv_detach_mcast(qp, gid, lid)`: 0 or an errno value (module docs).
///
/// # Safety
/// `qp` is NULL or a QP of this library; `gid` NULL or a `union ibv_gid`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_detach_mcast(
    qp: *mut IbvQp,
    gid: *const [u8; 16],
    _lid: u16,
) -> c_int {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_detach_mcast",
        || libc::EIO,
        || unsafe { mcast(qp, gid, false) },
    )
}

/// True if the QP is attached to a multicast group (`ibv_destroy_qp` then answers EBUSY).
pub(super) fn attached(q: &QpBlock) -> bool {
    q.rust.mcast_groups().is_ok_and(|g| !g.is_empty())
}
