//! UD multicast (IBTA Vol 1 §10.5 "multicast", §9.2 "DestQP 0xFFFFFF"; RoCE v2: `ROCEV2.md §1.2`, the group is an IP
//! multicast address): the groups UD QPs are attached to (`ibv_attach_mcast` / `ibv_detach_mcast`) and the delivery of
//! a multicast packet to every attached QP, as rxe does it (`drivers/infiniband/sw/rxe/rxe_mcast.c` for the table and
//! its limits, `rxe_recv.c` `rxe_rcv_mcast_pkt` for the delivery: one copy per attached QP, each checked as a unicast
//! UD packet — QP state, Q_Key, a posted receive).
//!
//! The table is sized by [`DeviceAttr`](crate::DeviceAttr): at most `max_mcast_grp` groups, `max_mcast_qp_attach` QPs
//! per group and `max_total_mcast_qp_attach` attachments in all. Groups are kept sorted by MGID, so the receive path
//! finds a group by binary search (no scan over QPs, no allocation: attach and detach, on the control path, are the only
//! writers).

use crate::engine::Engine;
use crate::error::ResourceError;
use crate::time::Instant;
use crate::verbs::{Gid, QpType};
use crate::wire::RxPkt;
use roce_wire::Qpn;

/// The BTH DestQP of every multicast packet (IBTA Vol 1 §10.5: multicast packets carry DestQP 0xFFFFFF; rxe and
/// ib_verbs.h `IB_MULTICAST_QPN`).
pub const MULTICAST_QPN: u32 = 0xFF_FFFF;

/// True if `gid` names a multicast group: an IPv6 multicast address (`ff00::/8`) or an IPv4-mapped one whose IPv4
/// address is in `224.0.0.0/4` (Linux `rdma_is_multicast_addr`, which `ib_attach_mcast` checks).
pub fn is_multicast_gid(gid: &Gid) -> bool {
    match gid.as_ipv4() {
        Some(v4) => v4[0] & 0xF0 == 0xE0,
        None => gid.0[0] == 0xFF,
    }
}

/// The Ethernet destination of a multicast GID (RFC 1112 §6.4 `01:00:5e` + the low 23 bits of the IPv4 group; RFC 2464
/// §7 `33:33` + the low 32 bits of the IPv6 group; Linux `ip_eth_mc_map` / `ipv6_eth_mc_map`, which
/// `ib_resolve_eth_dmac` uses for a multicast DGID). `None` for a unicast GID.
pub fn multicast_mac(gid: &Gid) -> Option<[u8; 6]> {
    if !is_multicast_gid(gid) {
        return None;
    }
    Some(match gid.as_ipv4() {
        Some(v4) => [0x01, 0x00, 0x5e, v4[1] & 0x7F, v4[2], v4[3]],
        None => [0x33, 0x33, gid.0[12], gid.0[13], gid.0[14], gid.0[15]],
    })
}

/// One group: its MGID and the QPs attached to it, in attach order.
#[derive(Clone, Debug)]
struct Group {
    mgid: Gid,
    qps: Vec<Qpn>,
}

/// The multicast groups of one port (see the module docs).
#[derive(Clone, Debug, Default)]
pub(crate) struct McastTable {
    /// Sorted by MGID bytes.
    groups: Vec<Group>,
    /// Attachments over all groups.
    total: u32,
}

impl McastTable {
    fn find(&self, mgid: &Gid) -> Result<usize, usize> {
        self.groups.binary_search_by(|g| g.mgid.0.cmp(&mgid.0))
    }

    /// True if `qpn` is attached to any group (control path: scans the groups).
    pub(crate) fn attached(&self, qpn: Qpn) -> bool {
        self.groups.iter().any(|g| g.qps.contains(&qpn))
    }
}

impl Engine {
    /// `ibv_attach_mcast`: attaches UD QP `qpn` to the multicast group `mgid`. Returns true when the group is new on
    /// this port (the driver then joins the IP group on its link: an IGMP/MLD join, as Linux's cma does for RoCE).
    ///
    /// Attaching a QP that is already attached succeeds and changes nothing (rxe `rxe_attach_mcg`).
    ///
    /// Errors: `InvalidHandle` for an unknown QP (EINVAL); `InvalidArgument` for a QP that is not UD or an MGID that is
    /// not multicast ([`is_multicast_gid`]; EINVAL, as `ib_attach_mcast`); `Exhausted` past `max_mcast_grp`,
    /// `max_mcast_qp_attach` or `max_total_mcast_qp_attach` (ENOMEM, as rxe).
    pub fn attach_mcast(&mut self, qpn: Qpn, mgid: Gid) -> Result<bool, ResourceError> {
        let i = self
            .qidx(qpn)
            .filter(|_| !self.is_gsi(qpn))
            .ok_or(ResourceError::InvalidHandle("qpn"))?;
        if self.qps[i].as_deref().map(|q| q.qp_type) != Some(QpType::Ud) {
            return Err(ResourceError::InvalidArgument(
                "multicast attach needs a UD QP",
            ));
        }
        if !is_multicast_gid(&mgid) {
            return Err(ResourceError::InvalidArgument("GID is not multicast"));
        }
        let dev = self.cfg.device;
        let t = &mut self.mcast;
        match t.find(&mgid) {
            Ok(g) => {
                let grp = &mut t.groups[g];
                if grp.qps.contains(&qpn) {
                    return Ok(false);
                }
                if grp.qps.len() as u32 >= dev.max_mcast_qp_attach {
                    return Err(ResourceError::Exhausted("max_mcast_qp_attach"));
                }
                if t.total >= dev.max_total_mcast_qp_attach {
                    return Err(ResourceError::Exhausted("max_total_mcast_qp_attach"));
                }
                grp.qps.push(qpn);
                t.total += 1;
                Ok(false)
            }
            Err(at) => {
                if t.groups.len() as u32 >= dev.max_mcast_grp {
                    return Err(ResourceError::Exhausted("max_mcast_grp"));
                }
                if dev.max_mcast_qp_attach == 0 || t.total >= dev.max_total_mcast_qp_attach {
                    return Err(ResourceError::Exhausted("max_total_mcast_qp_attach"));
                }
                let mut qps = Vec::with_capacity(dev.max_mcast_qp_attach.min(64) as usize);
                qps.push(qpn);
                t.groups.insert(at, Group { mgid, qps });
                t.total += 1;
                Ok(true)
            }
        }
    }

    /// `ibv_detach_mcast`: detaches QP `qpn` from `mgid`. Returns true when the group has no QP left on this port (the
    /// driver then leaves the IP group on its link).
    ///
    /// Errors: `InvalidHandle` for an unknown QP; `InvalidArgument` for a non-UD QP or a non-multicast MGID, and — as
    /// rxe's `rxe_detach_mcg` (EINVAL) — for a group that does not exist or that the QP is not attached to.
    pub fn detach_mcast(&mut self, qpn: Qpn, mgid: Gid) -> Result<bool, ResourceError> {
        let i = self
            .qidx(qpn)
            .filter(|_| !self.is_gsi(qpn))
            .ok_or(ResourceError::InvalidHandle("qpn"))?;
        if self.qps[i].as_deref().map(|q| q.qp_type) != Some(QpType::Ud) {
            return Err(ResourceError::InvalidArgument(
                "multicast detach needs a UD QP",
            ));
        }
        if !is_multicast_gid(&mgid) {
            return Err(ResourceError::InvalidArgument("GID is not multicast"));
        }
        let t = &mut self.mcast;
        let g = t
            .find(&mgid)
            .map_err(|_| ResourceError::InvalidArgument("no such multicast group"))?;
        let grp = &mut t.groups[g];
        let k = grp
            .qps
            .iter()
            .position(|&q| q == qpn)
            .ok_or(ResourceError::InvalidArgument(
                "QP is not attached to the group",
            ))?;
        grp.qps.remove(k);
        t.total -= 1;
        if grp.qps.is_empty() {
            t.groups.remove(g);
            return Ok(true);
        }
        Ok(false)
    }

    /// The multicast groups QP `qpn` is attached to (control path; for tools and the destroy check).
    pub fn mcast_groups_of(&self, qpn: Qpn) -> Vec<Gid> {
        self.mcast
            .groups
            .iter()
            .filter(|g| g.qps.contains(&qpn))
            .map(|g| g.mgid)
            .collect()
    }

    /// Receive path of a packet with DestQP [`MULTICAST_QPN`] (rxe `rxe_rcv_mcast_pkt`): the destination must be a
    /// multicast GID with QPs attached on this port, else `drop_unknown_qp` (rxe drops it when no group matches the
    /// DGID; a unicast DGID is ours, so the counter of a DestQP no QP answers to, not `drop_wrong_dest_ip`); then every
    /// attached QP gets the packet as a unicast UD packet addressed to it (state, opcode, Q_Key, receive WR checks and
    /// counters per QP). No allocation: the members are read by index.
    pub(crate) fn on_mcast_frame(&mut self, now: Instant, frame: &[u8], pkt: &RxPkt<'_>) {
        let found = if is_multicast_gid(&pkt.dst_gid) {
            self.mcast.find(&pkt.dst_gid).ok()
        } else {
            None
        };
        let Some(g) = found else {
            self.stats.drop_unknown_qp += 1;
            return;
        };
        let n = self.mcast.groups[g].qps.len();
        for k in 0..n {
            // Delivery never attaches or detaches, so the group and its members stay where they are.
            let qpn = self.mcast.groups[g].qps[k];
            let Some(i) = self.qidx(qpn) else {
                continue;
            };
            self.on_qp_frame(i, now, frame, pkt);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multicast_gids_and_macs() {
        let v4 = Gid::from_ipv4([239, 214, 0x81, 7]);
        assert!(is_multicast_gid(&v4));
        assert_eq!(
            multicast_mac(&v4),
            Some([0x01, 0x00, 0x5e, 0x56, 0x81, 7]),
            "RFC 1112: low 23 bits"
        );
        assert!(is_multicast_gid(&Gid::from_ipv4([224, 0, 0, 1])));
        assert!(!is_multicast_gid(&Gid::from_ipv4([240, 0, 0, 1])));
        assert!(!is_multicast_gid(&Gid::from_ipv4([198, 18, 50, 1])));
        let mut v6 = [0u8; 16];
        v6[0] = 0xff;
        v6[1] = 0x0e;
        v6[12..].copy_from_slice(&[1, 2, 3, 4]);
        assert!(is_multicast_gid(&Gid(v6)));
        assert_eq!(
            multicast_mac(&Gid(v6)),
            Some([0x33, 0x33, 1, 2, 3, 4]),
            "RFC 2464"
        );
        let mut u6 = [0u8; 16];
        u6[0] = 0xfe;
        u6[1] = 0x80;
        assert!(!is_multicast_gid(&Gid(u6)));
        assert_eq!(multicast_mac(&Gid(u6)), None);
    }
}
