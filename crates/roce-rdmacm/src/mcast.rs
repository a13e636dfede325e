//! rdma_cm multicast on RoCE (`rdma_join_multicast`, `rdma_join_multicast_ex`, `rdma_leave_multicast`), as Linux's
//! cma does it for an Ethernet port (`drivers/infiniband/core/cma.c` `cma_iboe_join_multicast`: no subnet
//! administrator, the join is local) and rdma-core's librdmacm completes it (`librdmacm/cma.c` `ucma_process_join`,
//! `rdma_leave_multicast`; read for the behaviour, not copied):
//!
//! * The id must be a `RDMA_PS_UDP` id bound to a device or with its address resolved (else `EINVAL`; the IPoIB
//!   port space's groups carry the IPoIB broadcast Q_Key, not offered: `ENOSYS`), the address an IP multicast
//!   address of the device's family (`EINVAL`), not already joined on the id (`EADDRINUSE`). Join flags: full member,
//!   or send-only full member (Linux allows it on RoCE: no IGMP join, the QP is not attached); others `EINVAL`.
//! * The MGID is the group's IPv4-mapped address (IPv6: the address) — the RoCE v2 form of `cma_iboe_set_mgid`.
//! * The join is answered at once through a `RDMA_CM_EVENT_MULTICAST_JOIN` event whose `param.ud` has the AH
//!   attributes towards the group (GRH with the MGID, hop limit 1 as Linux's RoCE multicast record), `qp_num`
//!   0xFFFFFF, `qkey` `RDMA_UDP_QKEY` and the join's context in `private_data`.
//! * When `rdma_get_cm_event` hands that event out and the id has a QP (and the join is not send-only), the QP is
//!   attached with `ibv_attach_mcast` (which makes the device's link join the IP group: the IGMP/MLD join); if that
//!   fails the event becomes `RDMA_CM_EVENT_MULTICAST_ERROR` with status `-errno` (librdmacm turns a failed attach
//!   into MULTICAST_ERROR).
//! * `rdma_leave_multicast` detaches the QP that was attached and forgets the join (`EADDRNOTAVAIL` for an address
//!   not joined); a JOIN event of it still queued is dropped. `rdma_destroy_id` leaves every group of the id, and
//!   `rdma_destroy_qp` detaches the QP from them first (the device refuses to destroy an attached QP, rxe
//!   `rxe_qp_chk_destroy`; librdmacm would leak it).

use std::net::{IpAddr, SocketAddr};

use core::ffi::c_void;
use libc::c_int;

use crate::abi::*;
use crate::bridge;
use crate::cma::{EventBlock, R, RDMA_UDP_QKEY, St, State, gid_of, push_event_with};

/// `RDMA_CM_EVENT_MULTICAST_JOIN` / `_ERROR` (`enum rdma_cm_event_type`).
pub const EV_MULTICAST_JOIN: c_int = 12;
pub const EV_MULTICAST_ERROR: c_int = 13;
/// `enum rdma_cm_mc_join_flags`.
pub const RDMA_MC_JOIN_FLAG_FULLMEMBER: u32 = 0;
pub const RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER: u32 = 1;
/// `enum rdma_cm_join_mc_attr_mask`.
pub const RDMA_CM_JOIN_MC_ATTR_ADDRESS: u32 = 1;
pub const RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS: u32 = 2;
pub const RDMA_CM_JOIN_MC_ATTR_RESERVED: u32 = 4;
/// The QPN of every multicast group (IBTA Vol 1 §10.5; `param.ud.qp_num` of the JOIN event).
pub const MULTICAST_QPN: u32 = 0xFF_FFFF;
/// Hop limit of the group's AH: Linux's RoCE multicast record (`cma_iboe_join_multicast`) uses 1.
pub const MC_HOP_LIMIT: u8 = 1;

/// `struct rdma_cm_join_mc_attr_ex` (16 bytes).
#[repr(C)]
pub struct RdmaCmJoinMcAttrEx {
    pub comp_mask: u32,
    pub join_flags: u32,
    pub addr: *mut libc::sockaddr,
}

const _: () = assert!(size_of::<RdmaCmJoinMcAttrEx>() == 16);

/// One join of an id.
#[derive(Debug)]
pub(crate) struct Mc {
    pub addr: IpAddr,
    pub mgid: [u8; 16],
    pub flags: u32,
    /// The QP `ibv_attach_mcast` attached (`ibv_qp *`), if any.
    pub qp: usize,
}

/// `rdma_join_multicast_ex` under the lock (module docs); the JOIN event is queued.
pub(crate) fn join(
    st: &mut State,
    id: usize,
    addr: SocketAddr,
    flags: u32,
    context: usize,
) -> R<()> {
    let i = st.ids.get(&id).ok_or(libc::EINVAL)?;
    if i.ps == RDMA_PS_IPOIB {
        return Err(libc::ENOSYS);
    }
    if i.ps != RDMA_PS_UDP || !matches!(i.st, St::Bound | St::AddrResolved) {
        return Err(libc::EINVAL);
    }
    let dev = i.dev.ok_or(libc::EINVAL)?;
    let ip = addr.ip();
    if !ip.is_multicast() || ip.is_ipv4() != st.devs[dev].ip.is_ipv4() {
        return Err(libc::EINVAL);
    }
    if flags != RDMA_MC_JOIN_FLAG_FULLMEMBER && flags != RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER {
        return Err(libc::EINVAL);
    }
    let tos = i.tos;
    let list = st.mcast.entry(id).or_default();
    if list.iter().any(|m| m.addr == ip) {
        return Err(libc::EADDRINUSE);
    }
    let mgid = gid_of(ip);
    list.push(Mc {
        addr: ip,
        mgid,
        flags,
        qp: 0,
    });
    let ah = IbvAhAttr {
        grh: IbvGlobalRoute {
            dgid: mgid,
            flow_label: 0,
            sgid_index: 0,
            hop_limit: MC_HOP_LIMIT,
            traffic_class: tos,
        },
        is_global: 1,
        port_num: 1,
        ..IbvAhAttr::default()
    };
    push_event_with(st, id, 0, EV_MULTICAST_JOIN, 0, None, &[], |e| {
        let ud = e.ud_mut();
        ud.ah_attr = ah;
        ud.qp_num = MULTICAST_QPN;
        ud.qkey = RDMA_UDP_QKEY;
        ud.private_data = context as *const c_void;
        ud.private_data_len = 0;
    });
    Ok(())
}

/// Called by `rdma_get_cm_event` for the event block `e` it hands out: a MULTICAST_JOIN attaches the id's QP (module
/// docs), or becomes MULTICAST_ERROR.
pub(crate) fn on_event(st: &mut State, e: usize) {
    // SAFETY: a live event block, not yet handed to the program.
    let ev = unsafe { &mut (*(e as *mut EventBlock)).ev };
    if ev.event != EV_MULTICAST_JOIN {
        return;
    }
    let id = ev.id as usize;
    let mgid = ev.ud_mut().ah_attr.grh.dgid;
    let Some(m) = st
        .mcast
        .get_mut(&id)
        .and_then(|l| l.iter_mut().find(|m| m.mgid == mgid))
    else {
        return;
    };
    // SAFETY: `id` has a live id block (its events are dropped when it goes).
    let qp = unsafe { (*(id as *mut RdmaCmId)).qp };
    if qp.is_null() || m.flags == RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER || m.qp != 0 {
        return;
    }
    // SAFETY: the id's QP (made by rdma_create_qp or the program's, live while the id names it); 16 GID bytes.
    let r = unsafe { bridge::ibv_attach_mcast(qp, &mgid, 0) };
    if r == 0 {
        m.qp = qp as usize;
    } else {
        ev.event = EV_MULTICAST_ERROR;
        ev.status = -r;
    }
}

/// Detaches the QP of join `m`, if one was attached.
fn detach(m: &mut Mc) {
    if m.qp != 0 {
        // SAFETY: the QP attached by `on_event`, still live: `rdma_destroy_qp` detaches before destroying it.
        unsafe { bridge::ibv_detach_mcast(m.qp as *mut IbvQp, &m.mgid, 0) };
        m.qp = 0;
    }
}

/// Queued, not yet handed out JOIN events of `id` for `mgid` (all of the id's when `None`) are dropped.
fn drop_queued(st: &mut State, id: usize, mgid: Option<[u8; 16]>) {
    let mut dead = Vec::new();
    for q in st.chans.values() {
        for &e in q {
            // SAFETY: queued blocks are live EventBlocks.
            let ev = unsafe { &mut (*(e as *mut EventBlock)).ev };
            if ev.id as usize == id
                && ev.event == EV_MULTICAST_JOIN
                && mgid.is_none_or(|g| ev.ud_mut().ah_attr.grh.dgid == g)
            {
                dead.push(e);
            }
        }
    }
    st.dead.extend(dead);
}

/// `rdma_leave_multicast` under the lock. Errors: `EADDRNOTAVAIL` when `addr` is not joined on the id.
pub(crate) fn leave(st: &mut State, id: usize, addr: SocketAddr) -> R<()> {
    let list = st.mcast.get_mut(&id).ok_or(libc::EADDRNOTAVAIL)?;
    let k = list
        .iter()
        .position(|m| m.addr == addr.ip())
        .ok_or(libc::EADDRNOTAVAIL)?;
    let mut m = list.remove(k);
    detach(&mut m);
    if list.is_empty() {
        st.mcast.remove(&id);
    }
    drop_queued(st, id, Some(m.mgid));
    Ok(())
}

/// Every join of `id` ends (`rdma_destroy_id`).
pub(crate) fn leave_all(st: &mut State, id: usize) {
    if let Some(mut list) = st.mcast.remove(&id) {
        for m in &mut list {
            detach(m);
        }
        drop_queued(st, id, None);
    }
}

/// The joins of `id` detach the QP `qp` (`rdma_destroy_qp`, before it destroys it).
pub(crate) fn detach_qp(st: &mut State, id: usize, qp: *mut IbvQp) {
    for m in st.mcast.get_mut(&id).into_iter().flatten() {
        if m.qp == qp as usize {
            detach(m);
        }
    }
}
