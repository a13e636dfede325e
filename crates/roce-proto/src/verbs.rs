//! Verbs data types shared by the engine and its users: handles, access flags, work requests, work completions,
//! QP attributes. Names and numeric values follow libibverbs `verbs.h` (see `ROCEV2.md §4.4`, `§4.6`, `§4.7`).

use core::fmt;
use core::ops::{BitAnd, BitOr, BitOrAssign};

use crate::{Psn, Qpn};

macro_rules! handle {
    ($(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(pub u32);
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:#x}", self.0)
            }
        }
    };
}

handle!(
    /// A protection domain (`ibv_pd`). Objects (MRs, QPs, AHs) of one PD may be used together only.
    PdHandle
);
handle!(
    /// A completion queue (`ibv_cq`).
    CqHandle
);
handle!(
    /// An address handle (`ibv_ah`) used by UD send work requests.
    AhHandle
);
handle!(
    /// A shared receive queue (`ibv_srq`, IBTA Vol 1 §10.2.9): receive WQEs that every QP created on it consumes.
    SrqHandle
);
handle!(
    /// Local key of a memory region (`ibv_mr.lkey`), named in [`Sge::lkey`].
    Lkey
);
handle!(
    /// Remote key of a memory region (`ibv_mr.rkey`), carried in RETH/AtomicETH/IETH.
    Rkey
);

macro_rules! flags {
    ($(#[$m:meta])* $name:ident { $($(#[$fm:meta])* $flag:ident = $v:expr,)* }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
        pub struct $name(pub u32);
        impl $name {
            /// No flag set.
            pub const EMPTY: Self = Self(0);
            $($(#[$fm])* pub const $flag: Self = Self($v);)*
            /// True if every bit of `other` is set in `self`.
            pub const fn contains(self, other: Self) -> bool {
                self.0 & other.0 == other.0
            }
            /// True if any bit of `other` is set in `self`.
            pub const fn intersects(self, other: Self) -> bool {
                self.0 & other.0 != 0
            }
            /// The raw bits.
            pub const fn bits(self) -> u32 {
                self.0
            }
            /// Every flag as `(name, bit)`.
            pub const ALL_BITS: &'static [(&'static str, u32)] = &[$((stringify!($flag), $v),)*];
            /// Names of the set bits (for diagnostics).
            pub fn names(self) -> impl Iterator<Item = &'static str> {
                Self::ALL_BITS.iter().filter(move |(_, v)| self.0 & v != 0).map(|(n, _)| *n)
            }
        }
        impl BitOr for $name {
            type Output = Self;
            fn bitor(self, rhs: Self) -> Self {
                Self(self.0 | rhs.0)
            }
        }
        impl BitOrAssign for $name {
            fn bitor_assign(&mut self, rhs: Self) {
                self.0 |= rhs.0;
            }
        }
        impl BitAnd for $name {
            type Output = Self;
            fn bitand(self, rhs: Self) -> Self {
                Self(self.0 & rhs.0)
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let mut first = true;
                for n in self.names() {
                    if !first {
                        f.write_str("|")?;
                    }
                    f.write_str(n)?;
                    first = false;
                }
                if first {
                    f.write_str("0")?;
                }
                Ok(())
            }
        }
    };
}

flags!(
    /// `ibv_access_flags` (`ROCEV2.md §4.7`): permissions of an MR and of a QP's responder.
    AccessFlags {
        /// IBV_ACCESS_LOCAL_WRITE: the local side may write (receive scatter, READ response placement).
        LOCAL_WRITE = 1,
        /// IBV_ACCESS_REMOTE_WRITE.
        REMOTE_WRITE = 2,
        /// IBV_ACCESS_REMOTE_READ.
        REMOTE_READ = 4,
        /// IBV_ACCESS_REMOTE_ATOMIC.
        REMOTE_ATOMIC = 8,
        /// IBV_ACCESS_MW_BIND: memory windows may be bound to the MR (IBTA Vol 1 §10.6.7, C10-73).
        MW_BIND = 16,
    }
);

flags!(
    /// `ibv_send_flags` (`ROCEV2.md §4.7`).
    SendFlags {
        /// IBV_SEND_FENCE: wait for prior READ/atomic WRs to complete before starting (`ROCEV2.md §4.5`).
        FENCE = 1,
        /// IBV_SEND_SIGNALED: generate a completion on success.
        SIGNALED = 2,
        /// IBV_SEND_SOLICITED: set BTH.SE on the last packet.
        SOLICITED = 4,
        /// IBV_SEND_INLINE: copy the payload at post time.
        INLINE = 8,
    }
);

flags!(
    /// `ibv_wc_flags`.
    WcFlags {
        /// IBV_WC_GRH: a 40-byte GRH area precedes the payload (UD receives).
        GRH = 1,
        /// IBV_WC_WITH_IMM: `imm_data` is valid.
        WITH_IMM = 2,
        /// IBV_WC_WITH_INV: `invalidated_rkey` is valid.
        WITH_INV = 8,
    }
);

flags!(
    /// `ibv_qp_attr_mask` bits (`ROCEV2.md §4.6`): which fields of [`QpAttr`] a `modify_qp` call sets.
    QpAttrMask {
        /// IBV_QP_STATE.
        STATE = 1,
        /// IBV_QP_CUR_STATE.
        CUR_STATE = 1 << 1,
        /// IBV_QP_EN_SQD_ASYNC_NOTIFY.
        EN_SQD_ASYNC_NOTIFY = 1 << 2,
        /// IBV_QP_ACCESS_FLAGS.
        ACCESS_FLAGS = 1 << 3,
        /// IBV_QP_PKEY_INDEX.
        PKEY_INDEX = 1 << 4,
        /// IBV_QP_PORT.
        PORT = 1 << 5,
        /// IBV_QP_QKEY.
        QKEY = 1 << 6,
        /// IBV_QP_AV.
        AV = 1 << 7,
        /// IBV_QP_PATH_MTU.
        PATH_MTU = 1 << 8,
        /// IBV_QP_TIMEOUT.
        TIMEOUT = 1 << 9,
        /// IBV_QP_RETRY_CNT.
        RETRY_CNT = 1 << 10,
        /// IBV_QP_RNR_RETRY.
        RNR_RETRY = 1 << 11,
        /// IBV_QP_RQ_PSN.
        RQ_PSN = 1 << 12,
        /// IBV_QP_MAX_QP_RD_ATOMIC.
        MAX_QP_RD_ATOMIC = 1 << 13,
        /// IBV_QP_ALT_PATH.
        ALT_PATH = 1 << 14,
        /// IBV_QP_MIN_RNR_TIMER.
        MIN_RNR_TIMER = 1 << 15,
        /// IBV_QP_SQ_PSN.
        SQ_PSN = 1 << 16,
        /// IBV_QP_MAX_DEST_RD_ATOMIC.
        MAX_DEST_RD_ATOMIC = 1 << 17,
        /// IBV_QP_PATH_MIG_STATE.
        PATH_MIG_STATE = 1 << 18,
        /// IBV_QP_CAP.
        CAP = 1 << 19,
        /// IBV_QP_DEST_QPN.
        DEST_QPN = 1 << 20,
        /// IBV_QP_RATE_LIMIT.
        RATE_LIMIT = 1 << 25,
    }
);

/// QP transport type (`ibv_qp_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpType {
    /// Reliable connected (IBV_QPT_RC = 2).
    Rc,
    /// Unreliable connected (IBV_QPT_UC = 3).
    Uc,
    /// Unreliable datagram (IBV_QPT_UD = 4).
    Ud,
}

impl QpType {
    /// The transport's name as `rdma resource show qp` writes it: `RC`, `UC`, `UD`.
    pub const fn name(self) -> &'static str {
        match self {
            QpType::Rc => "RC",
            QpType::Uc => "UC",
            QpType::Ud => "UD",
        }
    }
}

/// QP state (`ibv_qp_state`, `ROCEV2.md §4.6`); discriminants are the libibverbs values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum QpState {
    /// IBV_QPS_RESET: no traffic, queues empty.
    Reset = 0,
    /// IBV_QPS_INIT: receives may be posted, nothing processed.
    Init = 1,
    /// IBV_QPS_RTR: responder active.
    Rtr = 2,
    /// IBV_QPS_RTS: requester active.
    Rts = 3,
    /// IBV_QPS_SQD: send queue drained/draining.
    Sqd = 4,
    /// IBV_QPS_SQE: send queue error (UC/UD).
    Sqe = 5,
    /// IBV_QPS_ERR: everything flushed.
    Err = 6,
}

impl QpState {
    /// The state's name as `ibv_qp_state`'s and `rdma resource show qp` write it: `RESET`, `INIT`, `RTR`, `RTS`,
    /// `SQD`, `SQE`, `ERR`.
    pub const fn name(self) -> &'static str {
        match self {
            QpState::Reset => "RESET",
            QpState::Init => "INIT",
            QpState::Rtr => "RTR",
            QpState::Rts => "RTS",
            QpState::Sqd => "SQD",
            QpState::Sqe => "SQE",
            QpState::Err => "ERR",
        }
    }
}

impl QpState {
    /// All states, in numeric order.
    pub const ALL: [QpState; 7] = [
        QpState::Reset,
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
        QpState::Sqe,
        QpState::Err,
    ];
}

/// Path MTU (`ibv_mtu`, `ROCEV2.md §1.1`): payload bytes per packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Mtu {
    /// 256 bytes (IBV_MTU_256 = 1).
    Mtu256 = 1,
    /// 512 bytes.
    Mtu512 = 2,
    /// 1024 bytes.
    Mtu1024 = 3,
    /// 2048 bytes.
    Mtu2048 = 4,
    /// 4096 bytes (IBV_MTU_4096 = 5).
    Mtu4096 = 5,
}

impl Mtu {
    /// Payload bytes per packet.
    pub const fn bytes(self) -> u32 {
        256 << (self as u32 - 1)
    }

    /// The largest IB MTU whose packets fit an Ethernet netdev MTU (rxe rule: ≤ netdev MTU − 80,
    /// `ROCEV2.md §1.1`). `None` below 336 bytes.
    pub fn from_netdev_mtu(netdev_mtu: u32) -> Option<Mtu> {
        let room = netdev_mtu.checked_sub(80)?;
        [
            Mtu::Mtu4096,
            Mtu::Mtu2048,
            Mtu::Mtu1024,
            Mtu::Mtu512,
            Mtu::Mtu256,
        ]
        .into_iter()
        .find(|m| m.bytes() <= room)
    }
}

/// A 128-bit GID. RoCE v2 over IPv4 uses the IPv4-mapped form `::ffff:a.b.c.d` (`ROCEV2.md §1.2`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The IPv4-mapped GID of `a.b.c.d`.
    pub const fn from_ipv4(ip: [u8; 4]) -> Gid {
        Gid([
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, ip[0], ip[1], ip[2], ip[3],
        ])
    }
    /// The IPv4 address if this GID is IPv4-mapped.
    pub fn as_ipv4(&self) -> Option<[u8; 4]> {
        let b = &self.0;
        if b[..10].iter().all(|&x| x == 0) && b[10] == 0xff && b[11] == 0xff {
            Some([b[12], b[13], b[14], b[15]])
        } else {
            None
        }
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(ip) = self.as_ipv4() {
            return write!(f, "::ffff:{}.{}.{}.{}", ip[0], ip[1], ip[2], ip[3]);
        }
        for (i, c) in self.0.chunks(2).enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{:x}", u16::from_be_bytes([c[0], c[1]]))?;
        }
        Ok(())
    }
}

/// Address vector (`ibv_ah_attr` with GRH, RoCE v2): where packets of a connected QP (or one UD WR) go.
///
/// There is no neighbour resolution inside the sans-IO engine, so the destination MAC is part of the vector.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AhAttr {
    /// Destination GID (IPv4-mapped for an IPv4 outer header).
    pub dgid: Gid,
    /// Index into the port GID table ([`crate::EngineConfig::gids`]) of the source GID.
    pub sgid_index: u8,
    /// Traffic class: DSCP = `traffic_class >> 2`; the ECN bits are chosen by the engine (ECT(0) on data).
    pub traffic_class: u8,
    /// IP TTL / hop limit (0 means 64).
    pub hop_limit: u8,
    /// IPv6 flow label (20 bits); also the UDP source port entropy input when non-zero (`ROCEV2.md §1.4`).
    pub flow_label: u32,
    /// Destination MAC address.
    pub dmac: [u8; 6],
}

/// Requested or granted queue sizes (`ibv_qp_cap`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpCap {
    /// Send queue depth in WRs.
    pub max_send_wr: u32,
    /// Receive queue depth in WRs.
    pub max_recv_wr: u32,
    /// Maximum SGEs per send WR.
    pub max_send_sge: u32,
    /// Maximum SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Maximum inline payload per send WR, in bytes.
    pub max_inline_data: u32,
}

/// Arguments of [`crate::Engine::create_qp`] (`ibv_qp_init_attr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpInitAttr {
    /// Transport type.
    pub qp_type: QpType,
    /// Protection domain.
    pub pd: PdHandle,
    /// CQ for send completions.
    pub send_cq: CqHandle,
    /// CQ for receive completions.
    pub recv_cq: CqHandle,
    /// Requested queue sizes; the granted values are returned by `create_qp` (S09).
    pub cap: QpCap,
    /// If true every send WR is signaled regardless of [`SendFlags::SIGNALED`].
    pub sq_sig_all: bool,
}

/// Path migration state (`ibv_mig_state`). APM is not implemented; the engine sends BTH.M = 1 ("migrated").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MigState {
    /// IBV_MIG_MIGRATED (the only state the engine uses).
    #[default]
    Migrated,
    /// IBV_MIG_REARM.
    Rearm,
    /// IBV_MIG_ARMED.
    Armed,
}

/// QP attributes (`ibv_qp_attr`) for [`crate::Engine::modify_qp`] and [`crate::Engine::query_qp`]. Only the fields
/// named in the accompanying [`QpAttrMask`] are read by `modify_qp`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpAttr {
    /// Target state (IBV_QP_STATE).
    pub qp_state: QpState,
    /// Asserted current state (IBV_QP_CUR_STATE).
    pub cur_qp_state: QpState,
    /// Responder permissions: REMOTE_WRITE / REMOTE_READ / REMOTE_ATOMIC (IBV_QP_ACCESS_FLAGS).
    pub qp_access_flags: AccessFlags,
    /// P_Key table index (IBV_QP_PKEY_INDEX); the table has one entry, 0xFFFF.
    pub pkey_index: u16,
    /// Port number (IBV_QP_PORT); the engine has port 1.
    pub port_num: u8,
    /// Q_Key (UD, IBV_QP_QKEY).
    pub qkey: u32,
    /// Primary path (IBV_QP_AV).
    pub ah_attr: AhAttr,
    /// Path MTU (IBV_QP_PATH_MTU).
    pub path_mtu: Mtu,
    /// Local ACK timeout exponent 0..31: 4.096 µs · 2^timeout, 0 = infinite (IBV_QP_TIMEOUT, `ROCEV2.md §4.2`).
    pub timeout: u8,
    /// Transport retry count 0..7 (IBV_QP_RETRY_CNT). IBTA semantics: 7 is a count, not infinite.
    pub retry_cnt: u8,
    /// RNR retry count 0..7, 7 = infinite (IBV_QP_RNR_RETRY).
    pub rnr_retry: u8,
    /// Expected receive PSN (IBV_QP_RQ_PSN).
    pub rq_psn: Psn,
    /// Initial send PSN (IBV_QP_SQ_PSN).
    pub sq_psn: Psn,
    /// Outstanding READ/atomic requests as initiator (IBV_QP_MAX_QP_RD_ATOMIC).
    pub max_rd_atomic: u8,
    /// Responder resources for READ/atomic (IBV_QP_MAX_DEST_RD_ATOMIC).
    pub max_dest_rd_atomic: u8,
    /// RNR timer code put into RNR NAKs (IBV_QP_MIN_RNR_TIMER, `ROCEV2.md §4.2`).
    pub min_rnr_timer: u8,
    /// Remote QPN (IBV_QP_DEST_QPN).
    pub dest_qp_num: Qpn,
    /// Raise `SqDrained` when SQD is reached (IBV_QP_EN_SQD_ASYNC_NOTIFY).
    pub en_sqd_async_notify: bool,
    /// Path migration state (IBV_QP_PATH_MIG_STATE).
    pub path_mig_state: MigState,
    /// Queue sizes (IBV_QP_CAP; reported by `query_qp`, not modifiable).
    pub cap: QpCap,
}

impl Default for QpAttr {
    fn default() -> Self {
        QpAttr {
            qp_state: QpState::Reset,
            cur_qp_state: QpState::Reset,
            qp_access_flags: AccessFlags::EMPTY,
            pkey_index: 0,
            port_num: 1,
            qkey: 0,
            ah_attr: AhAttr::default(),
            path_mtu: Mtu::Mtu1024,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            rq_psn: Psn::new(0),
            sq_psn: Psn::new(0),
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            dest_qp_num: Qpn::new(0),
            en_sqd_async_notify: false,
            path_mig_state: MigState::Migrated,
            cap: QpCap::default(),
        }
    }
}

/// One scatter/gather element (`ibv_sge`): `length` bytes at virtual address `addr` of the MR named by `lkey`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sge {
    /// Virtual address inside the MR (as returned by `reg_mr`, plus an offset).
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the MR.
    pub lkey: Lkey,
}

/// The operation of a send work request (`ibv_wr_opcode` plus its operands, `ROCEV2.md §4.7`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOp {
    /// IBV_WR_SEND.
    Send,
    /// IBV_WR_SEND_WITH_IMM; `imm` is carried as the 4 ImmDt bytes (big-endian on the wire).
    SendWithImm {
        /// Immediate data.
        imm: u32,
    },
    /// IBV_WR_SEND_WITH_INV: the responder invalidates `invalidate_rkey`, the key of a type 2 window bound by the
    /// receiving QP (RC only). Any other key (an MR's R_Key included: only windows and fast-registered regions can
    /// be invalidated, IBTA Vol 1 §10.6.7; rxe `rxe_invalidate_mr`) is NAKed invalid request: this WR completes
    /// [`WcStatus::RemInvReqErr`] and both QPs go to ERR.
    SendWithInv {
        /// R_Key to invalidate at the responder.
        invalidate_rkey: Rkey,
    },
    /// IBV_WR_RDMA_WRITE.
    RdmaWrite {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: Rkey,
    },
    /// IBV_WR_RDMA_WRITE_WITH_IMM (consumes a receive WR at the responder).
    RdmaWriteWithImm {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: Rkey,
        /// Immediate data.
        imm: u32,
    },
    /// IBV_WR_RDMA_READ (RC only): the SGL is the local destination.
    RdmaRead {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: Rkey,
    },
    /// IBV_WR_ATOMIC_CMP_AND_SWP (RC only): the SGL is one 8-byte local destination for the original value.
    AtomicCmpAndSwp {
        /// Remote virtual address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: Rkey,
        /// Compare operand.
        compare: u64,
        /// Swap operand.
        swap: u64,
    },
    /// IBV_WR_ATOMIC_FETCH_AND_ADD (RC only): the SGL is one 8-byte local destination for the original value.
    AtomicFetchAndAdd {
        /// Remote virtual address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: Rkey,
        /// Addend.
        add: u64,
    },
    /// IBV_WR_ATOMIC_WRITE (RC only, IBTA Vol 1 1.5 §9.4.6 "RDMA ATOMIC WRITE"; rxe): `value`'s 8 bytes (in memory
    /// order) are written at the 8-byte aligned `remote_addr` in one piece. No SGL; completes on the ACK like an
    /// RDMA WRITE, opcode [`WcOpcode::AtomicWrite`].
    AtomicWrite {
        /// Remote virtual address (8-byte aligned).
        remote_addr: u64,
        /// Remote key (needs REMOTE_WRITE).
        rkey: Rkey,
        /// The 8 bytes to write, in memory order.
        value: [u8; 8],
    },
    /// IBV_WR_BIND_MW (and `ibv_bind_mw` for type 1): binds memory window `mw` (any key of it: the window is found
    /// by the key's index bits) to `length` bytes at `addr` of the MR `mr`, with remote rights `access`; the window's
    /// key byte becomes `rkey`'s low byte (IBTA Vol 1 §10.6.7.2, rxe `rxe_mw.c`). A local operation: no packet;
    /// completes with [`WcOpcode::BindMw`], or [`WcStatus::MwBindErr`] (and the QP goes to ERR) when a rule of
    /// [`crate::Engine::alloc_mw`]'s docs fails. RC and UC only.
    BindMw {
        /// The window.
        mw: Rkey,
        /// Its new R_Key (index bits must be the window's; the low byte is the new key byte).
        rkey: Rkey,
        /// The MR the window covers (ignored when `length` is 0: a type 1 unbind).
        mr: Lkey,
        /// Start address inside the MR.
        addr: u64,
        /// Length in bytes (0 unbinds a type 1 window; invalid for type 2).
        length: u64,
        /// Remote rights of the window (REMOTE_WRITE / REMOTE_READ / REMOTE_ATOMIC).
        access: AccessFlags,
    },
    /// IBV_WR_LOCAL_INV: invalidates `rkey`, a type 2 window's key, at this side (IBTA Vol 1 §10.6.7.2.5; rxe
    /// `rxe_invalidate_mw`). A local operation: no packet; completes with [`WcOpcode::LocalInv`], or
    /// [`WcStatus::LocQpOpErr`] (QP to ERR, rxe `rxe_do_local_ops`) if the key names nothing that can be
    /// invalidated: a memory region registered with `reg_mr` cannot be (rxe `rxe_invalidate_mr` accepts only
    /// fast-registration MRs, which rocev2 does not have). RC and UC only.
    LocalInv {
        /// Key to invalidate.
        rkey: Rkey,
    },
}

impl SendOp {
    /// The completion opcode reported for this operation.
    pub const fn wc_opcode(&self) -> WcOpcode {
        match self {
            SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. } => {
                WcOpcode::Send
            }
            SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. } => WcOpcode::RdmaWrite,
            SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
            SendOp::AtomicCmpAndSwp { .. } => WcOpcode::CompSwap,
            SendOp::AtomicFetchAndAdd { .. } => WcOpcode::FetchAdd,
            SendOp::AtomicWrite { .. } => WcOpcode::AtomicWrite,
            SendOp::BindMw { .. } => WcOpcode::BindMw,
            SendOp::LocalInv { .. } => WcOpcode::LocalInv,
        }
    }

    /// True for the local operations (bind MW, local invalidate): executed by the requester in SQ order, no packet.
    pub const fn is_local(&self) -> bool {
        matches!(self, SendOp::BindMw { .. } | SendOp::LocalInv { .. })
    }

    /// True for READ and atomics (responses carry data; limited by `max_rd_atomic`).
    pub const fn is_read_or_atomic(&self) -> bool {
        matches!(
            self,
            SendOp::RdmaRead { .. }
                | SendOp::AtomicCmpAndSwp { .. }
                | SendOp::AtomicFetchAndAdd { .. }
        )
    }

    /// True for the atomics.
    pub const fn is_atomic(&self) -> bool {
        matches!(
            self,
            SendOp::AtomicCmpAndSwp { .. } | SendOp::AtomicFetchAndAdd { .. }
        )
    }
}

/// UD destination of a send WR (`ibv_send_wr.wr.ud`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdDest {
    /// Address handle from [`crate::Engine::create_ah`].
    pub ah: AhHandle,
    /// Destination QPN.
    pub remote_qpn: Qpn,
    /// Q_Key to put into DETH (if its bit 31 is set the QP's own Q_Key is used, as IBTA specifies).
    pub remote_qkey: u32,
}

/// A send work request (`ibv_send_wr`), posted with [`crate::Engine::post_send`].
///
/// The payload is `sg_list` (gathered from MR memory when the packets are built, so the MRs stay leased until the
/// WR completes), or, with [`SendFlags::INLINE`], copied at post time: from `inline_data` if it is non-empty,
/// otherwise from the MR bytes that `sg_list` names (S08).
#[derive(Clone, Copy, Debug)]
pub struct SendWr<'a> {
    /// Opaque id returned in the completion.
    pub wr_id: u64,
    /// Operation.
    pub op: SendOp,
    /// Scatter/gather list.
    pub sg_list: &'a [Sge],
    /// Application slices to send inline (only with [`SendFlags::INLINE`]); concatenated in order.
    pub inline_data: &'a [&'a [u8]],
    /// Flags.
    pub send_flags: SendFlags,
    /// Destination for UD QPs (ignored on RC/UC).
    pub ud: Option<UdDest>,
}

impl<'a> SendWr<'a> {
    /// A WR with operation `op` over `sg_list`, no flags.
    pub fn new(wr_id: u64, op: SendOp, sg_list: &'a [Sge]) -> Self {
        SendWr {
            wr_id,
            op,
            sg_list,
            inline_data: &[],
            send_flags: SendFlags::EMPTY,
            ud: None,
        }
    }
    /// Adds flags.
    pub fn flags(mut self, f: SendFlags) -> Self {
        self.send_flags |= f;
        self
    }
    /// Sets [`SendFlags::SIGNALED`].
    pub fn signaled(self) -> Self {
        self.flags(SendFlags::SIGNALED)
    }
    /// Makes the WR inline with the given application bytes.
    pub fn inline(mut self, data: &'a [&'a [u8]]) -> Self {
        self.inline_data = data;
        self.send_flags |= SendFlags::INLINE;
        self
    }
    /// Sets the UD destination.
    pub fn ud(mut self, dest: UdDest) -> Self {
        self.ud = Some(dest);
        self
    }
}

/// A receive work request (`ibv_recv_wr`), posted with [`crate::Engine::post_recv`].
#[derive(Clone, Copy, Debug)]
pub struct RecvWr<'a> {
    /// Opaque id returned in the completion.
    pub wr_id: u64,
    /// Where incoming SEND payload is scattered (UD: a 40-byte GRH area first, `ROCEV2.md §5`, S17).
    pub sg_list: &'a [Sge],
}

/// Completion status (`ibv_wc_status`, `ROCEV2.md §4.4`); discriminants are the libibverbs values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
#[allow(missing_docs)]
pub enum WcStatus {
    Success = 0,
    LocLenErr = 1,
    LocQpOpErr = 2,
    LocEecOpErr = 3,
    LocProtErr = 4,
    WrFlushErr = 5,
    MwBindErr = 6,
    BadRespErr = 7,
    LocAccessErr = 8,
    RemInvReqErr = 9,
    RemAccessErr = 10,
    RemOpErr = 11,
    RetryExcErr = 12,
    RnrRetryExcErr = 13,
    LocRddViolErr = 14,
    RemInvRdReqErr = 15,
    RemAbortErr = 16,
    InvEecnErr = 17,
    InvEecStateErr = 18,
    FatalErr = 19,
    RespTimeoutErr = 20,
    GeneralErr = 21,
}

impl WcStatus {
    /// The libibverbs name (`ibv_wc_status_str` style: `IBV_WC_...`).
    pub const fn name(self) -> &'static str {
        match self {
            WcStatus::Success => "IBV_WC_SUCCESS",
            WcStatus::LocLenErr => "IBV_WC_LOC_LEN_ERR",
            WcStatus::LocQpOpErr => "IBV_WC_LOC_QP_OP_ERR",
            WcStatus::LocEecOpErr => "IBV_WC_LOC_EEC_OP_ERR",
            WcStatus::LocProtErr => "IBV_WC_LOC_PROT_ERR",
            WcStatus::WrFlushErr => "IBV_WC_WR_FLUSH_ERR",
            WcStatus::MwBindErr => "IBV_WC_MW_BIND_ERR",
            WcStatus::BadRespErr => "IBV_WC_BAD_RESP_ERR",
            WcStatus::LocAccessErr => "IBV_WC_LOC_ACCESS_ERR",
            WcStatus::RemInvReqErr => "IBV_WC_REM_INV_REQ_ERR",
            WcStatus::RemAccessErr => "IBV_WC_REM_ACCESS_ERR",
            WcStatus::RemOpErr => "IBV_WC_REM_OP_ERR",
            WcStatus::RetryExcErr => "IBV_WC_RETRY_EXC_ERR",
            WcStatus::RnrRetryExcErr => "IBV_WC_RNR_RETRY_EXC_ERR",
            WcStatus::LocRddViolErr => "IBV_WC_LOC_RDD_VIOL_ERR",
            WcStatus::RemInvRdReqErr => "IBV_WC_REM_INV_RD_REQ_ERR",
            WcStatus::RemAbortErr => "IBV_WC_REM_ABORT_ERR",
            WcStatus::InvEecnErr => "IBV_WC_INV_EECN_ERR",
            WcStatus::InvEecStateErr => "IBV_WC_INV_EEC_STATE_ERR",
            WcStatus::FatalErr => "IBV_WC_FATAL_ERR",
            WcStatus::RespTimeoutErr => "IBV_WC_RESP_TIMEOUT_ERR",
            WcStatus::GeneralErr => "IBV_WC_GENERAL_ERR",
        }
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Completion opcode (`ibv_wc_opcode`); discriminants are the libibverbs values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcOpcode {
    /// IBV_WC_SEND.
    Send = 0,
    /// IBV_WC_RDMA_WRITE.
    RdmaWrite = 1,
    /// IBV_WC_RDMA_READ.
    RdmaRead = 2,
    /// IBV_WC_COMP_SWAP.
    CompSwap = 3,
    /// IBV_WC_FETCH_ADD.
    FetchAdd = 4,
    /// IBV_WC_BIND_MW.
    BindMw = 5,
    /// IBV_WC_LOCAL_INV.
    LocalInv = 6,
    /// IBV_WC_ATOMIC_WRITE.
    AtomicWrite = 9,
    /// IBV_WC_RECV.
    Recv = 128,
    /// IBV_WC_RECV_RDMA_WITH_IMM.
    RecvRdmaWithImm = 129,
}

/// A work completion (`ibv_wc`), returned by [`crate::Engine::poll_cq`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wc {
    /// The WR's id.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// Operation (for flushed WRs: the WR's operation, like rxe).
    pub opcode: WcOpcode,
    /// Bytes transferred (receives: payload, plus 40 for UD's GRH area; READ: bytes read).
    pub byte_len: u32,
    /// Immediate data (valid with [`WcFlags::WITH_IMM`]).
    pub imm_data: u32,
    /// Invalidated R_Key (valid with [`WcFlags::WITH_INV`]).
    pub invalidated_rkey: Rkey,
    /// Local QPN.
    pub qp_num: Qpn,
    /// Source QPN (UD receives).
    pub src_qp: Qpn,
    /// Flags.
    pub wc_flags: WcFlags,
    /// UD receives: the network header the packet came with, as mlx5 reports it on RoCE in `ibv_wc.sl` (the CQE's
    /// L3 header type: 2 = IPv4, 1 = IPv6; UCX reads it to parse the 40-byte GRH area, issue #16); 0 otherwise.
    pub network_hdr_type: u8,
}

impl Default for Wc {
    fn default() -> Self {
        Wc {
            wr_id: 0,
            status: WcStatus::Success,
            opcode: WcOpcode::Send,
            byte_len: 0,
            imm_data: 0,
            invalidated_rkey: Rkey(0),
            qp_num: Qpn::new(0),
            src_qp: Qpn::new(0),
            wc_flags: WcFlags::EMPTY,
            network_hdr_type: 0,
        }
    }
}

/// Asynchronous event kinds (`ibv_event_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AsyncEventType {
    /// IBV_EVENT_CQ_ERR: a completion could not be queued (CQ overrun); the completion is lost.
    CqErr,
    /// IBV_EVENT_QP_FATAL: the QP entered ERR because of a local or transport error.
    QpFatal,
    /// IBV_EVENT_QP_REQ_ERR: the responder detected an invalid request (NAK 0x61 sent).
    QpReqErr,
    /// IBV_EVENT_QP_ACCESS_ERR: the responder detected an access violation (NAK 0x62 sent).
    QpAccessErr,
    /// IBV_EVENT_SQ_DRAINED: the QP reached SQD with nothing outstanding.
    SqDrained,
    /// IBV_EVENT_COMM_EST: first packet received in RTR.
    CommEst,
    /// IBV_EVENT_PORT_ACTIVE: the driver reported the link up.
    PortActive,
    /// IBV_EVENT_PORT_ERR: the driver reported the link down.
    PortErr,
    /// IBV_EVENT_SRQ_LIMIT_REACHED: the number of WQEs on an SRQ fell below its armed limit; the limit is disarmed
    /// (`ibv_modify_srq(3)`, `ibv_query_srq(3)`; rxe `rxe_resp.c` `get_srq_wqe`). [`AsyncEvent::srq`] names the SRQ.
    SrqLimitReached,
    /// IBV_EVENT_QP_LAST_WQE_REACHED: a QP attached to an SRQ entered ERR and will consume no more WQEs from it
    /// (`ibv_get_async_event(3)`; rxe `rxe_resp.c` `flush_recv_queue`).
    QpLastWqeReached,
}

/// An asynchronous event, returned by [`crate::Engine::poll_async_event`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AsyncEvent {
    /// Kind.
    pub event_type: AsyncEventType,
    /// Affected QP, if any.
    pub qpn: Option<Qpn>,
    /// Affected CQ, if any.
    pub cq: Option<CqHandle>,
    /// Affected SRQ, if any ([`AsyncEventType::SrqLimitReached`]).
    pub srq: Option<SrqHandle>,
}

flags!(
    /// `ibv_srq_attr_mask`: which fields of [`SrqAttr`] a [`crate::Engine::modify_srq`] call sets.
    SrqAttrMask {
        /// IBV_SRQ_MAX_WR: resize the SRQ to `max_wr` WQEs.
        MAX_WR = 1,
        /// IBV_SRQ_LIMIT: arm the limit event at `srq_limit` (0 disarms).
        LIMIT = 2,
    }
);

/// SRQ attributes (`ibv_srq_attr`): what [`crate::Engine::query_srq`] reports and
/// [`crate::Engine::modify_srq`] sets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SrqAttr {
    /// WQEs the SRQ holds (its capacity).
    pub max_wr: u32,
    /// SGEs per receive WR.
    pub max_sge: u32,
    /// The armed limit: [`AsyncEventType::SrqLimitReached`] fires when fewer WQEs than this remain; 0 = not armed.
    pub srq_limit: u32,
}

/// What `reg_mr` returns: the keys and the virtual address range the engine assigned to the buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MrInfo {
    /// Local key (for SGEs).
    pub lkey: Lkey,
    /// Remote key (for the peer's RETH/AtomicETH).
    pub rkey: Rkey,
    /// Virtual address of byte 0 of the buffer.
    pub addr: u64,
    /// Length in bytes.
    pub length: u64,
}
