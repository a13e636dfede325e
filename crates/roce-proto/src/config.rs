//! Engine configuration and device limits (`ibv_device_attr`), with documented defaults.

use core::time::Duration;

use crate::cc::DcqcnConfig;
use crate::sched::SchedConfig;
use crate::verbs::{Gid, Mtu};

/// Limits the engine enforces and reports through [`crate::Engine::query_device`] (`ibv_device_attr`).
///
/// The defaults are the true limits of this implementation: every value is enforced by the verbs that use it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Maximum number of QPs (`max_qp`).
    pub max_qp: u32,
    /// Maximum WRs per send or receive queue (`max_qp_wr`).
    pub max_qp_wr: u32,
    /// Maximum SGEs per WR (`max_sge`), ≥ 16.
    pub max_sge: u32,
    /// Maximum inline payload per send WR in bytes (≥ 256).
    pub max_inline_data: u32,
    /// Maximum number of CQs (`max_cq`).
    pub max_cq: u32,
    /// Maximum CQ depth (`max_cqe`).
    pub max_cqe: u32,
    /// Maximum number of MRs (`max_mr`).
    pub max_mr: u32,
    /// Maximum number of memory windows (`max_mw`; rxe `RXE_MAX_MW` is 2^16 too).
    pub max_mw: u32,
    /// Maximum MR size in bytes (`max_mr_size`).
    pub max_mr_size: u64,
    /// Maximum number of PDs (`max_pd`).
    pub max_pd: u32,
    /// Maximum number of address handles (`max_ah`).
    pub max_ah: u32,
    /// Responder resources per QP (`max_qp_rd_atom`, bound for `max_dest_rd_atomic`).
    pub max_qp_rd_atom: u32,
    /// Initiator depth per QP (`max_qp_init_rd_atom`, bound for `max_rd_atomic`).
    pub max_qp_init_rd_atom: u32,
    /// Maximum message size in bytes (`ibv_port_attr.max_msg_sz`): 2^31 (S10, rxe `RXE_MAX_MSG_SIZE`).
    pub max_msg_sz: u32,
    /// Largest path MTU the port supports (`max_mtu`).
    pub max_mtu: Mtu,
    /// Maximum number of shared receive queues (`max_srq`).
    pub max_srq: u32,
    /// Maximum WQEs per SRQ (`max_srq_wr`).
    pub max_srq_wr: u32,
    /// Maximum SGEs per SRQ receive WR (`max_srq_sge`).
    pub max_srq_sge: u32,
    /// Maximum multicast groups with QPs attached (`max_mcast_grp`; `crate::mcast`).
    pub max_mcast_grp: u32,
    /// Maximum QPs attached to one multicast group (`max_mcast_qp_attach`; rxe `RXE_MAX_MCAST_QP_ATTACH` is 56).
    pub max_mcast_qp_attach: u32,
    /// Maximum attachments over all groups (`max_total_mcast_qp_attach`).
    pub max_total_mcast_qp_attach: u32,
}

impl Default for DeviceAttr {
    fn default() -> Self {
        DeviceAttr {
            max_qp: 16384,
            max_qp_wr: 16384,
            max_sge: 32,
            max_inline_data: 256,
            max_cq: 16384,
            max_cqe: 1 << 20,
            max_mr: 1 << 16,
            max_mw: 1 << 16,
            max_mr_size: 1 << 32,
            max_pd: 1024,
            max_ah: 4096,
            max_qp_rd_atom: 128,
            max_qp_init_rd_atom: 128,
            max_msg_sz: 1 << 31,
            max_mtu: Mtu::Mtu4096,
            max_srq: 1024,
            max_srq_wr: 16384,
            max_srq_sge: 32,
            max_mcast_grp: 1024,
            max_mcast_qp_attach: 56,
            max_total_mcast_qp_attach: 1024 * 56,
        }
    }
}

/// What `create_qp` does when a requested capability exceeds the device limit (S09).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CapPolicy {
    /// Fail with [`crate::CreateQpError::CapExceeded`] naming the field (libibverbs EINVAL behaviour).
    #[default]
    Reject,
    /// Clamp to the device limit and report the granted values.
    Clamp,
}

/// Engine (port) configuration. All randomness derives from `seed` (STYLE E1/E10).
#[derive(Clone, Debug, PartialEq)]
pub struct EngineConfig {
    /// Local MAC address (source MAC of every frame).
    pub mac: [u8; 6],
    /// Port GID table; index = `sgid_index`. IPv4 addresses appear as IPv4-mapped GIDs.
    pub gids: Vec<Gid>,
    /// Netdev (Ethernet payload) MTU; bounds the path MTU like rxe (`ROCEV2.md §1.1`).
    pub netdev_mtu: u32,
    /// Device limits.
    pub device: DeviceAttr,
    /// Capability-exceeded policy for `create_qp`.
    pub cap_policy: CapPolicy,
    /// Seed of the deterministic RNG (IP identification start, random initial PSNs offered by
    /// [`crate::Engine::random_psn`]) and of the QPN offset ([`Self::first_qpn`], [`crate::QpnRange`]; a stream of
    /// its own, so the PSNs do not depend on it). Same seed, same QPNs; real runs draw one per process.
    pub seed: u64,
    /// Maximum unacknowledged PSNs per RC QP (rxe `RXE_MAX_UNACKED_PSNS` = 128, `ROCEV2.md §4.1`).
    pub max_unacked_psns: u32,
    /// Set AckReq at least every this many packets of a long message (rxe `RXE_MAX_PKT_PER_ACK` = 64).
    pub ack_req_every: u32,
    /// Minimum time between two CNPs of one QP, the notification point's window N (DCQCN paper: 50 µs; NVIDIA
    /// `min_time_between_cnps`; `DCQCN.md` §2.2, `ROCEV2.md §5`, S18). The first CE mark after a quiet window is
    /// answered at once, marks inside an open window with one CNP at its end; 0 answers every CE mark.
    pub cnp_interval: Duration,
    /// DSCP of CNPs (default 48 / CS6, `ROCEV2.md §6`; NVIDIA `cnp_dscp`).
    pub cnp_dscp: u8,
    /// 802.1p priority of CNPs, reported in [`crate::TxMeta::prio`] (default 6, NVIDIA `cnp_802p_prio`,
    /// `DCQCN.md` §2.2 N4). In the engine CNPs are always sent ahead of data (the scheduler's strict tier).
    pub cnp_prio: u8,
    /// Mark data packets ECT(0) (ECN-capable, `ROCEV2.md §1.4`). ACKs/NAKs are sent Not-ECT.
    pub ecn_data: bool,
    /// Send scheduler and shapers (`crate::sched`, `DCQCN.md §7, §9`).
    pub sched: SchedConfig,
    /// DCQCN reaction point for every new QP (`docs/spec/DCQCN.md` §2.3–§2.5); `None`: QPs send at line rate
    /// and ignore CNPs (`rp_cnp_ignored`). [`crate::Engine::set_rate_controller`] overrides it per QP.
    pub dcqcn: Option<DcqcnConfig>,
    /// Lowest QPN handed out (default [`crate::FIRST_QPN`], 0x11, as rxe). QPs are numbered in creation order through
    /// `first_qpn..=last_qpn` starting at an offset drawn from [`seed`](Self::seed) and wrapping from `last_qpn` to
    /// `first_qpn` ([`crate::QpnRange`]): a restarted process does not present the QPNs of the one before it to a
    /// peer's CM, which would reject them as a stale connection (REJ reason 10, IBTA Vol 1 §12.9.8.3;
    /// `docs/MULTIPROCESS.md`, "QPN range"). A process that shares its device address with others numbers its QPs
    /// inside its slot's range so the kernel can steer each packet to it by destination QPN (`roce_link::reuseport`).
    /// Clamped by [`crate::Engine::new`] to at least 2 (QP0/QP1 are special) and so that `max_qp` QPNs fit in 24 bits
    /// below the multicast DestQP 0xFFFFFF.
    pub first_qpn: u32,
    /// Highest QPN handed out (default and at most [`crate::MAX_QPN`], 0xFF_FFFE: 0xFFFFFF is the multicast DestQP; a
    /// shared address's slot ends at `slot << 16 | 0xFFFF`). Raised by [`crate::Engine::new`] when
    /// `first_qpn..=last_qpn` holds fewer than `device.max_qp` QPNs.
    pub last_qpn: u32,
    /// QP 1, the GSI (`crate::gsi`, IBTA Vol 1 §13.4): created with the engine unless `None`. It takes one PD, CQ,
    /// MR and QP slot of its own (not counted against `device.max_qp`).
    pub gsi: Option<crate::gsi::GsiConfig>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            mac: [0x02, 0, 0, 0, 0, 1],
            gids: vec![Gid::from_ipv4([192, 0, 2, 1])],
            netdev_mtu: 4200,
            device: DeviceAttr::default(),
            cap_policy: CapPolicy::Reject,
            seed: 0,
            max_unacked_psns: 128,
            ack_req_every: 64,
            cnp_interval: Duration::from_micros(50),
            cnp_dscp: 48,
            cnp_prio: 6,
            ecn_data: true,
            sched: SchedConfig::default(),
            dcqcn: None,
            first_qpn: crate::FIRST_QPN,
            last_qpn: crate::qpn::MAX_QPN,
            gsi: Some(crate::gsi::GsiConfig::default()),
        }
    }
}
