//! QP1, the General Services Interface (GSI) QP of the port (IBTA Vol 1 §13.4 and §3.5.x; Annex A17: on RoCE v2
//! management datagrams travel as UD packets in UDP 4791 like any other).
//!
//! The GSI is an ordinary UD QP in the engine's QP table — numbered 1, in slot 0 of the table — so it goes through
//! the same responder, requester, scheduler, counters and captures as every other QP; it is not a side channel.
//! The engine owns it: its PD, CQ and receive MR are created by [`Engine::new`] when [`EngineConfig::gsi`](crate::EngineConfig::gsi) is set
//! (the default), it is brought to RTS with Q_Key [`GSI_QKEY`] (`0x8001_0000`, IBTA Vol 1 §13.4.6.2 / Linux
//! `IB_QP1_QKEY`) and P_Key index 0 (the default P_Key 0xFFFF), and the verbs that name QPN 1 from outside
//! (`modify_qp`, `post_send`, `post_recv`, `destroy_qp`) are refused with "unknown QP".
//!
//! * Receive: every received `UD_SEND_ONLY` for QP 1 with Q_Key `0x8001_0000` lands in one of
//!   [`GsiConfig::recv_slots`] fixed 296-byte slots (40-byte GRH area + the 256-byte MAD) of the GSI MR, exactly as
//!   the UD responder delivers to any QP; [`Engine::poll_mad`] copies the MAD into the caller's 256-byte buffer,
//!   names the sender (GID from the GRH area, source QP from DETH) and re-posts the slot. Nothing is allocated per
//!   MAD. A datagram whose payload is not exactly 256 bytes is dropped and counted (`GsiStats::drop_bad_len`).
//! * Send: [`Engine::send_mad`] posts one inline UD SEND of the 256 bytes to the destination's QP 1 with the GSI
//!   Q_Key (the WR names a controlled Q_Key, so the requester uses the QP's own, IBTA Vol 1 §10.2.4 / C10-14).
//!   Address handles are cached per destination (at most `send_depth` of them).
//! * Controlled Q_Keys: a Q_Key with bit 31 set may only be set on QP 1 — an ordinary UD QP asking for one in
//!   `modify_qp` gets `InvalidValue("qkey")` (IBTA Vol 1 §10.2.4 "Q_Keys": controlled Q_Keys are given out only to
//!   privileged consumers; Linux `ib_uverbs_modify_qp` answers EPERM for `IB_QP_QKEY` with bit 31 set without
//!   CAP_NET_RAW, "RDMA/uverbs: Restrict usage of privileged QKEYs", 2023). Since an unprivileged UD QP cannot hold
//!   such a Q_Key and a WR naming one falls back to the QP's own, only QP 1 ever sends with one.

use roce_wire::mad::{GSI_QKEY, GSI_QPN, MAD_LEN};

use crate::engine::Engine;
use crate::error::ModifyQpError;
use crate::verbs::*;
use crate::{Psn, Qpn, ResourceError};

/// Bytes of one receive slot: the UD GRH area and a MAD.
const SLOT: usize = 40 + MAD_LEN;

/// Sizing of the GSI QP ([`EngineConfig::gsi`](crate::EngineConfig::gsi)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GsiConfig {
    /// Receive WRs kept posted (MADs that may wait for [`Engine::poll_mad`]; more are dropped and counted in the
    /// QP's `drop_ud_no_recv`, and the sender's CM retries). Default 32.
    pub recv_slots: u32,
    /// Send queue depth (MADs sent but not yet on the wire) and the size of the address-handle cache. Default 16.
    pub send_depth: u32,
}

impl Default for GsiConfig {
    fn default() -> Self {
        GsiConfig {
            recv_slots: 32,
            send_depth: 16,
        }
    }
}

/// MAD-level counters of the GSI (packet-level ones are QP 1's ordinary [`crate::Counters`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GsiStats {
    /// MADs handed out by [`Engine::poll_mad`].
    pub mads_received: u64,
    /// MADs posted by [`Engine::send_mad`].
    pub mads_sent: u64,
    /// Datagrams for QP 1 whose payload was not exactly 256 bytes (dropped).
    pub drop_bad_len: u64,
    /// Receive completions in error (the GSI QP left RTS; should not happen).
    pub recv_errors: u64,
}

/// A MAD returned by [`Engine::poll_mad`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MadRecv {
    /// The sender's GID (its IP source address; IPv4 as an IPv4-mapped GID).
    pub src_gid: Gid,
    /// The sender's QP (DETH source QPN; 1 for a peer's GSI).
    pub src_qp: Qpn,
}

/// Where [`Engine::send_mad`] sends a MAD.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MadDest {
    /// Destination GID.
    pub dgid: Gid,
    /// Destination MAC address.
    pub dmac: [u8; 6],
    /// Destination QP (1 for a peer's GSI).
    pub qpn: Qpn,
    /// Index of the source GID in the port's GID table.
    pub sgid_index: u8,
}

/// Why [`Engine::send_mad`] refused a MAD.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GsiError {
    /// The engine was built without a GSI ([`EngineConfig::gsi`](crate::EngineConfig::gsi) is `None`).
    #[error("this engine has no GSI QP")]
    NoGsi,
    /// A MAD is exactly 256 bytes (IBTA Vol 1 §13.4.2).
    #[error("a MAD is 256 bytes, got {0}")]
    BadLength(usize),
    /// The send queue or the address-handle cache is full: poll the engine and retry.
    #[error("GSI send queue full")]
    Busy,
    /// The destination cannot be reached from this port (e.g. `sgid_index` out of range, IP version mismatch).
    #[error("bad MAD destination: {0}")]
    Dest(ResourceError),
}

/// The engine's GSI state (owned by [`Engine`], `None` when disabled).
#[derive(Debug)]
pub(crate) struct Gsi {
    pub(crate) cq: CqHandle,
    pd: PdHandle,
    lkey: Lkey,
    addr: u64,
    /// Cached address handles by destination; `next` is the round-robin victim when full.
    ahs: Vec<(Gid, [u8; 6], u8, AhHandle)>,
    next: usize,
    send_depth: usize,
    pub(crate) stats: GsiStats,
}

/// True when `modify_qp` must refuse `attr` for QP `qpn`: a Q_Key with bit 31 set (a controlled Q_Key, IBTA Vol 1
/// §10.2.4) on any QP but QP 1.
pub(crate) fn controlled_qkey_refused(qpn: Qpn, attr: &QpAttr, mask: QpAttrMask) -> bool {
    mask.contains(QpAttrMask::QKEY) && attr.qkey & 0x8000_0000 != 0 && qpn != GSI_QPN
}

impl Engine {
    /// Creates QP 1 with its PD, CQ and receive MR and brings it to RTS (called once by [`Engine::new`], when the
    /// QP table is still empty so the QP lands in slot 0 = QPN 1).
    pub(crate) fn open_gsi(&mut self, cfg: GsiConfig) -> Result<(), &'static str> {
        let recv = cfg.recv_slots.max(1);
        let send = cfg.send_depth.max(1);
        let pd = self.alloc_pd().map_err(|_| "pd")?;
        let cq = self.create_cq(recv + send).map_err(|_| "cq")?;
        let mr = self
            .reg_mr(
                pd,
                vec![0u8; recv as usize * SLOT],
                AccessFlags::LOCAL_WRITE,
            )
            .map_err(|_| "mr")?;
        let (qpn, _) = self
            .create_qp(&QpInitAttr {
                qp_type: QpType::Ud,
                pd,
                send_cq: cq,
                recv_cq: cq,
                cap: QpCap {
                    max_send_wr: send,
                    max_recv_wr: recv,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: MAD_LEN as u32,
                },
                sq_sig_all: false,
            })
            .map_err(|_| "qp")?;
        if qpn != GSI_QPN {
            return Err("QP 1 slot taken");
        }
        let mut attr = QpAttr {
            qp_state: QpState::Init,
            pkey_index: 0,
            port_num: 1,
            qkey: GSI_QKEY,
            ..QpAttr::default()
        };
        let m = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY;
        self.modify_qp(qpn, &attr, m).map_err(|_| "init")?;
        attr.qp_state = QpState::Rtr;
        self.modify_qp(qpn, &attr, QpAttrMask::STATE)
            .map_err(|_| "rtr")?;
        attr.qp_state = QpState::Rts;
        attr.sq_psn = Psn::new(0);
        self.modify_qp(qpn, &attr, QpAttrMask::STATE | QpAttrMask::SQ_PSN)
            .map_err(|_| "rts")?;
        for slot in 0..recv {
            let sge = [Sge {
                addr: mr.addr + u64::from(slot) * SLOT as u64,
                length: SLOT as u32,
                lkey: mr.lkey,
            }];
            self.post_recv(
                qpn,
                &[RecvWr {
                    wr_id: u64::from(slot),
                    sg_list: &sge,
                }],
            )
            .map_err(|_| "post_recv")?;
        }
        self.gsi = Some(Box::new(Gsi {
            cq,
            pd,
            lkey: mr.lkey,
            addr: mr.addr,
            ahs: Vec::with_capacity(send as usize),
            next: 0,
            send_depth: send as usize,
            stats: GsiStats::default(),
        }));
        Ok(())
    }

    /// Whether `qpn` is the engine's own GSI QP (refused to the verbs that take a QPN from outside).
    pub(crate) fn is_gsi(&self, qpn: Qpn) -> bool {
        qpn == GSI_QPN && self.gsi.is_some()
    }

    /// The GSI's MAD counters, or `None` without a GSI.
    pub fn gsi_stats(&self) -> Option<GsiStats> {
        self.gsi.as_ref().map(|g| g.stats)
    }

    /// Output: the next MAD received on QP 1, copied into `out`, with its sender; `None` when none is waiting (or
    /// the engine has no GSI). Call after every `handle_frame` batch, like `poll_cq`. Copies 296 bytes, allocates
    /// nothing, and re-posts the receive slot at once. Datagrams that are not 256-byte MADs are dropped here and
    /// counted ([`GsiStats::drop_bad_len`]); send completions of the GSI (only errors are signaled) are consumed.
    pub fn poll_mad(&mut self, out: &mut [u8; MAD_LEN]) -> Option<MadRecv> {
        loop {
            let (cq, lkey, addr) = {
                let g = self.gsi.as_ref()?;
                (g.cq, g.lkey, g.addr)
            };
            let mut wc = [Wc::default(); 1];
            if self.poll_cq(cq, &mut wc) == 0 {
                return None;
            }
            let wc = wc[0];
            let g = self.gsi.as_deref_mut()?;
            if wc.opcode != WcOpcode::Recv {
                continue;
            }
            if wc.status != WcStatus::Success {
                g.stats.recv_errors += 1;
                continue;
            }
            let slot = wc.wr_id;
            let off = slot as usize * SLOT;
            let mut grh = [0u8; 40];
            let ok = wc.byte_len as usize == SLOT
                && self.mr_read(lkey, off, &mut grh).is_ok()
                && self.mr_read(lkey, off + 40, out).is_ok();
            self.repost(slot, lkey, addr);
            let g = self.gsi.as_deref_mut()?;
            if !ok {
                g.stats.drop_bad_len += 1;
                continue;
            }
            g.stats.mads_received += 1;
            // The GRH area (`ROCEV2.md §5`): an IPv6 header, or an IPv4 header in its last 20 bytes.
            let src_gid = if grh[0] >> 4 == 6 {
                let mut b = [0u8; 16];
                b.copy_from_slice(&grh[8..24]);
                Gid(b)
            } else {
                Gid::from_ipv4([grh[32], grh[33], grh[34], grh[35]])
            };
            return Some(MadRecv {
                src_gid,
                src_qp: wc.src_qp,
            });
        }
    }

    /// Re-posts receive slot `slot` of the GSI (the public `post_recv` refuses QP 1, so the GSI is detached for
    /// the call: a pointer move, no allocation).
    fn repost(&mut self, slot: u64, lkey: Lkey, addr: u64) {
        let g = self.gsi.take();
        let sge = [Sge {
            addr: addr + slot * SLOT as u64,
            length: SLOT as u32,
            lkey,
        }];
        let _ = self.post_recv(
            GSI_QPN,
            &[RecvWr {
                wr_id: slot,
                sg_list: &sge,
            }],
        );
        self.gsi = g;
    }

    /// Input: sends the 256-byte `mad` from QP 1 to `dest` as one UD SEND with the GSI Q_Key `0x8001_0000`
    /// (IBTA Vol 1 §13.4). The MAD is copied now (inline); drain `poll_transmit` afterwards as after any post.
    ///
    /// Errors: [`GsiError::NoGsi`], [`GsiError::BadLength`] unless `mad.len() == 256`, [`GsiError::Busy`] when the
    /// send queue (or every cached address handle) is still in use, [`GsiError::Dest`] for an unusable
    /// destination. Control path: a new destination creates an address handle (cached, at most `send_depth`).
    pub fn send_mad(&mut self, dest: &MadDest, mad: &[u8]) -> Result<(), GsiError> {
        if mad.len() != MAD_LEN {
            return Err(GsiError::BadLength(mad.len()));
        }
        let ah = self.gsi_ah(dest)?;
        let g = self.gsi.take();
        let data = [mad];
        let wr = SendWr::new(0, SendOp::Send, &[]).inline(&data);
        let wr = SendWr {
            ud: Some(UdDest {
                ah,
                remote_qpn: dest.qpn,
                // Bit 31 set: the requester puts the QP's own Q_Key (GSI_QKEY) into DETH.
                remote_qkey: GSI_QKEY,
            }),
            ..wr
        };
        let r = self.post_send(GSI_QPN, &[wr]);
        self.gsi = g;
        let g = self.gsi.as_deref_mut().ok_or(GsiError::NoGsi)?;
        match r {
            Ok(()) => {
                g.stats.mads_sent += 1;
                Ok(())
            }
            Err(_) => Err(GsiError::Busy),
        }
    }

    /// The cached address handle for `dest`, creating one (and evicting an idle one when the cache is full).
    fn gsi_ah(&mut self, dest: &MadDest) -> Result<AhHandle, GsiError> {
        let g = self.gsi.as_deref().ok_or(GsiError::NoGsi)?;
        let key = (dest.dgid, dest.dmac, dest.sgid_index);
        if let Some(e) = g.ahs.iter().find(|e| (e.0, e.1, e.2) == key) {
            return Ok(e.3);
        }
        let (pd, full, n) = (g.pd, g.ahs.len() >= g.send_depth, g.ahs.len());
        if full {
            // Evict the first idle handle, round robin (destroy_ah refuses one a posted WR still names).
            let start = g.next;
            let mut freed = None;
            for k in 0..n {
                let j = (start + k) % n;
                let ah = self.gsi.as_deref().ok_or(GsiError::NoGsi)?.ahs[j].3;
                if self.destroy_ah(ah).is_ok() {
                    freed = Some(j);
                    break;
                }
            }
            let j = freed.ok_or(GsiError::Busy)?;
            let g = self.gsi.as_deref_mut().ok_or(GsiError::NoGsi)?;
            g.ahs.swap_remove(j);
            g.next = (j + 1) % n;
        }
        let attr = AhAttr {
            dgid: dest.dgid,
            sgid_index: dest.sgid_index,
            dmac: dest.dmac,
            ..AhAttr::default()
        };
        let ah = self.create_ah(pd, &attr).map_err(GsiError::Dest)?;
        let g = self.gsi.as_deref_mut().ok_or(GsiError::NoGsi)?;
        g.ahs.push((key.0, key.1, key.2, ah));
        Ok(ah)
    }
}

/// `modify_qp`'s error for a controlled Q_Key on an ordinary QP.
pub(crate) const CONTROLLED_QKEY: ModifyQpError = ModifyQpError::InvalidValue {
    attr: "qkey",
    reason: "a Q_Key with bit 31 set is a controlled Q_Key, reserved to QP1 (IBTA Vol 1 10.2.4)",
};
