//! The engine: verbs objects, inputs, outputs. See [`Engine`] for the call protocol.

use std::collections::VecDeque;

use crate::cc::{Dcqcn, FixedRate, RateController, RateMetrics};
use crate::config::{CapPolicy, DeviceAttr, EngineConfig};
use crate::cq::Cq;
use crate::error::{CreateQpError, ModifyQpError, PostError, PostErrorKind, ResourceError};
use crate::mr::{MrBuffer, MrTable};
use crate::qp::{InMsg, Qp, RdResource, RecvQueue, ReqCtx, RespCtx, Seg, SendQueue, SendWqe};
use crate::qpn::QpnRange;
use crate::sched::{Pick, QpShape, Retime, Scheduler};
use crate::state::check_modify;
use crate::stats::Counters;
use crate::time::Instant;
use crate::timer::{QpTimers, Settle, TimerKind, Timers};
use crate::verbs::*;
use crate::wire::IPV4_IDENT;
use crate::wire::{self, TxTemplate};
use crate::{Psn, Qpn};

/// First QPN handed out (QPN 0 and 1 are the special SMI/GSI QPs; rxe starts its range at 0x11).
pub const FIRST_QPN: u32 = 0x11;

/// Metadata of one frame written by [`Engine::poll_transmit`] (STYLE E3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxMeta {
    /// Frame length in bytes (starting at the destination MAC; no FCS).
    pub len: usize,
    /// Local QP that produced the frame.
    pub qpn: Qpn,
    /// IP DSCP (6 bits) of the frame.
    pub dscp: u8,
    /// IP ECN code point of the frame (0 Not-ECT, 1 ECT(1), 2 ECT(0), 3 CE).
    pub ecn: u8,
    /// 802.1p priority the frame should carry on a priority-aware link: [`EngineConfig::cnp_prio`] for CNPs
    /// (`DCQCN.md` §2.2 N4, NVIDIA `cnp_802p_prio`), 0 for every other frame.
    pub prio: u8,
    /// What kind of frame it is (scheduling class).
    pub kind: TxKind,
    /// `Some` when the payload was left in MR memory for the link to gather ([`Engine::poll_transmit_gather`]).
    pub gather: Option<TxGather>,
}

/// Smallest payload (bytes) [`Engine::poll_transmit_gather`] leaves in MR memory for the link to gather; shorter
/// payloads are copied into the frame. Below this a copy costs less than what one more iovec costs a link: the
/// kernel's per-segment work in `sendmsg` (iov_iter setup, a separate `copy_from_user` call, a second cache line
/// to touch) plus, for the engine, a second ICRC update call (crc32fast's SIMD folding only starts at 128 bytes;
/// measured on the 2-vCPU development VM: 64 B hashes at ~10 ns, memcpy of 256 B costs ~5-10 ns hot).
pub const GATHER_MIN: usize = 256;

/// A payload piece a link reads straight from registered memory ([`Engine::poll_transmit_gather`]): `len` bytes
/// at `ptr`. Creating it is safe; reading through it is the link's `unsafe`, valid only as the engine documents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxSeg {
    /// First byte.
    pub ptr: *const u8,
    /// Length in bytes.
    pub len: usize,
}

impl TxSeg {
    /// An empty piece (to initialise arrays).
    pub const EMPTY: TxSeg = TxSeg {
        ptr: core::ptr::null(),
        len: 0,
    };
}

/// Layout of a gathered frame ([`Engine::poll_transmit_gather`]): `head` bytes of the transmit buffer, the first
/// `segs` [`TxSeg`]s, then `tail` bytes (pad + ICRC) of the transmit buffer starting at offset `head`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxGather {
    /// Header bytes at the start of the buffer (Ethernet .. extension headers).
    pub head: usize,
    /// Payload pieces used.
    pub segs: usize,
    /// Pad + ICRC bytes at `buf[head..]`.
    pub tail: usize,
}

/// Payload bytes the engine moved in user space ([`Engine::payload_copies`]): what a zero-copy test counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PayloadCopies {
    /// Bytes copied out of MR memory (transmit payload copied into frames, inline capture at post time, READ
    /// responses, READ/atomic sources).
    pub read_from_mr: u64,
    /// Bytes copied into MR memory (received SEND/WRITE/READ-response payload at its final offset, UD GRHs,
    /// atomic results).
    pub written_to_mr: u64,
    /// Payload bytes handed to a link as [`TxSeg`]s instead of being copied.
    pub gathered: u64,
}

/// Class of a transmitted frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxKind {
    /// Requester data or request packet (first transmission).
    Data,
    /// Requester packet retransmitted by go-back-N.
    Retransmit,
    /// READ response data.
    ReadResponse,
    /// ACK / NAK / RNR NAK / ATOMIC ACK.
    Ack,
    /// Congestion notification packet.
    Cnp,
}

/// A QP dump: state, PSNs, queue depths, retry counters, timers and non-zero counters ([`Engine::qp_display`]).
pub struct QpDump<'a> {
    qp: &'a Qp,
    shape: Option<&'a QpShape>,
}

impl core::fmt::Display for QpDump<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        core::fmt::Display::fmt(self.qp, f)?;
        if let Some(s) = self.shape {
            write!(f, "\n  shaper: {s}")?;
        }
        Ok(())
    }
}

impl core::fmt::Debug for QpDump<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        core::fmt::Display::fmt(self, f)
    }
}

/// Summary of a QP for tests and tools ([`Engine::qp_info`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpInfo {
    /// QP type.
    pub qp_type: QpType,
    /// State.
    pub state: QpState,
    /// Next PSN the requester will use for a new packet.
    pub next_psn: Psn,
    /// Oldest unacknowledged PSN.
    pub una_psn: Psn,
    /// Responder's expected PSN.
    pub epsn: Psn,
    /// Responder's MSN.
    pub msn: u32,
    /// Send WRs posted and not yet completed.
    pub sq_outstanding: u32,
    /// Receive WRs posted and not yet consumed.
    pub rq_outstanding: u32,
    /// UDP source port used by this QP (fixed per QP, S13); 0 before RTR.
    pub udp_sport: u16,
}

/// The sans-IO RoCE v2 engine: one port of an RNIC with its verbs objects, requester (send module) and responder.
///
/// # Call protocol (after quinn-proto `Connection`)
///
/// The engine does no I/O and reads no clock; the driver supplies `now` to every call (instants must not go
/// backwards). Methods come in four kinds:
///
/// * **(A) getters** on `&self`: [`query_device`](Self::query_device), [`query_qp`](Self::query_qp),
///   [`counters`](Self::counters), [`qp_counters`](Self::qp_counters), [`qp_dump`](Self::qp_dump), MR reads.
/// * **(B) inputs**: [`handle_frame`](Self::handle_frame) for every received Ethernet frame,
///   [`handle_timeout`](Self::handle_timeout) when the instant returned by `poll_timeout` has passed.
/// * **(C) commands** (verbs): `alloc_pd`, `reg_mr`, `create_cq`, `create_qp`, `modify_qp`, `post_send`,
///   `post_recv`, ...
/// * **(D) outputs**: [`poll_transmit`](Self::poll_transmit) (one frame per call), [`poll_timeout`](Self::poll_timeout),
///   [`poll_cq`](Self::poll_cq), [`poll_async_event`](Self::poll_async_event).
///
/// **After every (B) or (C) call, call the (D) methods**: `poll_transmit` until it returns `None` (or the driver's
/// TX budget is used up — E8: each call does a bounded amount of work), then `poll_timeout` to re-arm the driver's
/// timer, then drain completions and events. A `poll_transmit` whose buffer is too small consumes nothing: the same
/// frame is produced by the next call (S05).
///
/// Every protocol rule cites `ROCEV2.md` (the project's protocol reference) or the rxe source it mirrors.
pub struct Engine {
    pub(crate) cfg: EngineConfig,
    /// The QPNs `create_qp` hands out (`crate::qpn`), fixed at `new`.
    pub(crate) qpns: QpnRange,
    pub(crate) pds: Vec<bool>,
    pub(crate) mrs: MrTable,
    pub(crate) cqs: Vec<Option<Cq>>,
    pub(crate) ahs: Vec<Option<(PdHandle, AhAttr, TxTemplate)>>,
    pub(crate) qps: Vec<Option<Box<Qp>>>,
    /// Shared receive queues, indexed by `SrqHandle − 1` (`crate::srq`).
    pub(crate) srqs: Vec<Option<crate::srq::Srq>>,
    pub(crate) qp_free: Vec<u32>,
    pub(crate) live_qps: u32,
    pub(crate) timers: Timers,
    pub(crate) events: VecDeque<AsyncEvent>,
    /// CQs that received a completion since [`Engine::poll_ready_cq`] last returned them (indices; each at most
    /// once, capacity reserved at `create_cq`).
    pub(crate) cq_ready: VecDeque<u32>,
    pub(crate) stats: Counters,
    /// Which QP sends next and how fast: tiers, traffic classes, shapers (`crate::sched`).
    pub(crate) sched: Scheduler,
    pub(crate) rng: u64,
    pub(crate) ip_id: u16,
    /// Timer generation base for the next QP (see `QpTimers::with_base`).
    pub(crate) timer_epoch: u32,
    /// Payload bytes handed to links as [`TxSeg`]s.
    pub(crate) tx_gathered: u64,
    /// QP 1, the GSI (`crate::gsi`), when [`EngineConfig::gsi`] is set.
    pub(crate) gsi: Option<Box<crate::gsi::Gsi>>,
    /// Multicast groups and their attached UD QPs (`crate::mcast`).
    pub(crate) mcast: crate::mcast::McastTable,
}

impl core::fmt::Debug for Engine {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Engine")
            .field("qps", &self.live_qps)
            .field("mrs", &self.mrs.len())
            .field("timer_entries", &self.timers.len())
            .finish_non_exhaustive()
    }
}

/// The QPN of QP table slot `idx`: slot 0 is QP 1 (the GSI, `crate::gsi`), slot k ≥ 1 is the (k − 1)-th QPN of
/// the engine's range (`crate::qpn::QpnRange`: [`EngineConfig::first_qpn`]..=[`EngineConfig::last_qpn`] entered at
/// an offset drawn from the seed, `docs/MULTIPROCESS.md`).
pub(crate) fn slot_qpn(qpns: QpnRange, idx: usize) -> u32 {
    if idx == 0 {
        1
    } else {
        qpns.nth(idx as u32 - 1).value()
    }
}

/// The QP table slot of `qpn` (inverse of [`slot_qpn`], O(1)); `None` for QPNs no slot can hold.
pub(crate) fn qpn_slot(qpns: QpnRange, qpn: u32) -> Option<usize> {
    if qpn == 1 {
        Some(0)
    } else {
        Some(qpns.index(qpn)? as usize + 1)
    }
}

/// The capacity a per-QP table holding room for `cap` entries grows to when it needs `need`: unchanged if it fits,
/// else double (amortized O(1) per `create_qp`) but not past `max`, its size with every QP of the device, and never
/// below `need` (issue #21: at `max_qp` the tables carry no doubling slack).
pub(crate) fn grown(cap: usize, need: usize, max: usize) -> usize {
    if need <= cap {
        cap
    } else {
        cap.saturating_mul(2).min(max).max(need)
    }
}

pub(crate) fn splitmix(s: &mut u64) -> u64 {
    *s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Engine {
    /// A new engine for one port.
    pub fn new(mut cfg: EngineConfig) -> Engine {
        // QP0/QP1 are special; QPNs are 24 bits and every QP of the device must have one. Numbering starts at an
        // offset drawn from the seed (`crate::qpn`): a restarted process does not present its predecessor's QPNs.
        let qpns = QpnRange::new(cfg.first_qpn, cfg.last_qpn, cfg.device.max_qp, cfg.seed);
        cfg.first_qpn = qpns.first();
        cfg.last_qpn = qpns.last();
        let mut rng = cfg.seed;
        let ip_id = splitmix(&mut rng) as u16;
        // Largest frame: the netdev MTU (IP packet) plus the Ethernet header and an 802.1Q tag.
        let sched = Scheduler::new(cfg.sched.clone(), cfg.netdev_mtu + 18);
        let gsi = cfg.gsi;
        let mut e = Engine {
            cfg,
            qpns,
            pds: Vec::new(),
            mrs: MrTable::new(),
            cqs: Vec::new(),
            ahs: Vec::new(),
            // Slot 0 is QPN 1 (the GSI), never given to `create_qp` otherwise (see `slot_qpn`).
            qps: vec![None],
            srqs: Vec::new(),
            qp_free: if gsi.is_some() { vec![0] } else { Vec::new() },
            live_qps: 0,
            timers: Timers::default(),
            events: VecDeque::new(),
            cq_ready: VecDeque::new(),
            stats: Counters::default(),
            sched,
            rng,
            ip_id,
            timer_epoch: 0,
            tx_gathered: 0,
            gsi: None,
            mcast: crate::mcast::McastTable::default(),
        };
        if let Some(g) = gsi {
            // Only fails for device limits of 0 PDs/CQs/MRs/QPs: the engine then runs without a GSI.
            let _ = e.open_gsi(g);
            e.qp_free.retain(|&i| i != 0);
        }
        e
    }

    /// The configuration the engine was built with (`first_qpn` and `last_qpn` as clamped by [`new`](Self::new)).
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// The QPNs this engine hands out and where numbering starts in them ([`QpnRange`], `docs/MULTIPROCESS.md`):
    /// the QP slot created n-th (counting fresh slots from 0) is `qpn_range().nth(n)`, and
    /// `qpn_range().index(qpn)` maps a QPN of this engine back to n in O(1).
    pub fn qpn_range(&self) -> QpnRange {
        self.qpns
    }

    /// Device limits (`ibv_query_device` + `max_msg_sz` of `ibv_query_port`). `max_mtu` is additionally bounded by the
    /// netdev MTU (`ROCEV2.md §1.1`).
    pub fn query_device(&self) -> DeviceAttr {
        let mut d = self.cfg.device;
        if let Some(m) = Mtu::from_netdev_mtu(self.cfg.netdev_mtu) {
            d.max_mtu = d.max_mtu.min(m);
        }
        d
    }

    /// A PSN drawn from the engine's seeded RNG (for `sq_psn`/`rq_psn`, as applications use `rand()`).
    pub fn random_psn(&mut self) -> Psn {
        Psn::new(splitmix(&mut self.rng) as u32 & 0xFF_FFFF)
    }

    // ----------------------------------------------------------------------------------------------- PD / MR

    /// `ibv_alloc_pd`.
    pub fn alloc_pd(&mut self) -> Result<PdHandle, ResourceError> {
        if self.pds.iter().filter(|p| **p).count() as u32 >= self.cfg.device.max_pd {
            return Err(ResourceError::Exhausted("max_pd"));
        }
        if let Some(i) = self.pds.iter().position(|p| !*p) {
            self.pds[i] = true;
            return Ok(PdHandle(i as u32 + 1));
        }
        self.pds.push(true);
        Ok(PdHandle(self.pds.len() as u32))
    }

    pub(crate) fn pd_live(&self, pd: PdHandle) -> bool {
        pd.0 >= 1 && self.pds.get(pd.0 as usize - 1).copied().unwrap_or(false)
    }

    /// `ibv_dealloc_pd`: fails with `Busy` while MRs, QPs or AHs of the PD exist.
    pub fn dealloc_pd(&mut self, pd: PdHandle) -> Result<(), ResourceError> {
        if !self.pd_live(pd) {
            return Err(ResourceError::InvalidHandle("pd"));
        }
        let qp_use = self.qps.iter().flatten().any(|q| q.pd == pd);
        let ah_use = self.ahs.iter().flatten().any(|a| a.0 == pd);
        if self.mrs.pd_in_use(pd) || qp_use || ah_use || self.pd_has_srq(pd) {
            return Err(ResourceError::Busy("PD has MRs, QPs, AHs or SRQs"));
        }
        self.pds[pd.0 as usize - 1] = false;
        Ok(())
    }

    /// `ibv_reg_mr`: the engine takes `buffer` (STYLE V2) and assigns it a virtual address range of its own.
    /// [`mr_read`](Self::mr_read) / [`mr_write`](Self::mr_write) / [`mr_bytes`](Self::mr_bytes) copy its bytes;
    /// [`dereg_mr`](Self::dereg_mr) gives it back.
    ///
    /// `buffer` is anything that converts into an [`MrBuffer`]: `Vec<u8>`, `Box<[u8]>`, `&[u8]` (copied), `[u8; N]`
    /// or any [`MrMemory`](crate::MrMemory) (memory the application keeps using, e.g. roce-verbs' `MrBuf`); the MR's
    /// length is its length in bytes at this call. Errors: `InvalidHandle` (dead PD), `Exhausted` (`max_mr`),
    /// `InvalidArgument` (longer than `max_mr_size`, or REMOTE_WRITE/REMOTE_ATOMIC without LOCAL_WRITE); on error the
    /// buffer is dropped.
    pub fn reg_mr(
        &mut self,
        pd: PdHandle,
        buffer: impl Into<MrBuffer>,
        access: AccessFlags,
    ) -> Result<MrInfo, ResourceError> {
        self.reg_mr_inner(pd, buffer.into(), access, None)
    }

    /// `ibv_reg_mr_iova`: like [`reg_mr`](Self::reg_mr), but the MR's byte 0 has virtual address `iova` (for memory
    /// the application owns, usually its own address, so SGEs and peers use application pointers as with
    /// `ibv_reg_mr`). MRs may overlap in address space; keys tell them apart. Errors as `reg_mr`, plus
    /// `InvalidArgument` if `iova + length` overflows 64 bits.
    pub fn reg_mr_iova(
        &mut self,
        pd: PdHandle,
        buffer: impl Into<MrBuffer>,
        access: AccessFlags,
        iova: u64,
    ) -> Result<MrInfo, ResourceError> {
        self.reg_mr_inner(pd, buffer.into(), access, Some(iova))
    }

    fn reg_mr_inner(
        &mut self,
        pd: PdHandle,
        buf: MrBuffer,
        access: AccessFlags,
        iova: Option<u64>,
    ) -> Result<MrInfo, ResourceError> {
        if !self.pd_live(pd) {
            return Err(ResourceError::InvalidHandle("pd"));
        }
        if self.mrs.len() >= self.cfg.device.max_mr {
            return Err(ResourceError::Exhausted("max_mr"));
        }
        if buf.len() as u64 > self.cfg.device.max_mr_size {
            return Err(ResourceError::InvalidArgument("MR larger than max_mr_size"));
        }
        if iova.is_some_and(|a| a.checked_add(buf.len() as u64).is_none()) {
            return Err(ResourceError::InvalidArgument("iova + length overflows"));
        }
        // IBTA: remote write/atomic access requires local write.
        if access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
            && !access.contains(AccessFlags::LOCAL_WRITE)
        {
            return Err(ResourceError::InvalidArgument(
                "REMOTE_WRITE/REMOTE_ATOMIC require LOCAL_WRITE",
            ));
        }
        let random = splitmix(&mut self.rng);
        Ok(self.mrs.register(pd, buf, access, iova, random))
    }

    /// `ibv_dereg_mr`: returns the buffer ([`MrBuffer::downcast`] recovers its concrete type). Fails with `Busy`
    /// while a posted, not yet completed local WR (send or receive SGE) holds a lease on the MR, `InvalidHandle` for
    /// an unknown key. Remote access holds no lease: the responder resolves the R_Key again for every packet of an
    /// RDMA WRITE or READ response stream (also for replays of a duplicate READ), so a peer's READ from the MR never
    /// blocks deregistration, and a packet that arrives or is due after it gets NAK remote access error (rxe
    /// "RDMA/rxe: Replace mr by rkey in responder resources", 2022).
    pub fn dereg_mr(&mut self, lkey: Lkey) -> Result<MrBuffer, ResourceError> {
        self.mrs.deregister(lkey)
    }

    /// `ibv_dereg_mr` with the kernel's semantics (issue #16; Linux `rdma_core.c` destroys the MR object whatever
    /// work names it, rxe `rxe_mr.c`: an invalidated key fails the next access with a protection error): succeeds
    /// while posted WRs name the MR. Each QP with a send or receive WQE that names it goes to ERR at once, as an
    /// RNIC's QP does when its DMA finds the memory key gone: that queue's WQEs ahead of the first one naming the
    /// MR complete with WR_FLUSH_ERR, that one with LOC_PROT_ERR, and then every remaining WQE of both queues is
    /// flushed (`enter_error`, with its `QpFatal` event). So no WQE holds a lease when the MR goes, the key is
    /// unknown from now on (posts naming it fail their SGE check, remote accesses are NAKed: the responder resolves
    /// the R_Key per packet), and the engine never touches the memory again. Control path: scans the QPs. Errors:
    /// `InvalidHandle` for an unknown key; `InvalidArgument` (EINVAL) while a memory window is bound to the MR
    /// ([`mr_has_bound_mw`](Self::mr_has_bound_mw); rxe `rxe_dereg_mr` refuses while its `num_mw` is not 0): the
    /// MR stays registered and nothing changes. (Plain [`dereg_mr`](Self::dereg_mr), the runtime's deferred
    /// deregistration when the last handle goes, unbinds such windows instead.)
    pub fn dereg_mr_invalidate(&mut self, lkey: Lkey) -> Result<MrBuffer, ResourceError> {
        let slot = self
            .mrs
            .slot(lkey)
            .ok_or(ResourceError::InvalidHandle("lkey"))?;
        if self.mr_has_bound_mw(lkey) {
            return Err(ResourceError::InvalidArgument(
                "memory windows are bound to the MR",
            ));
        }
        if self.mr_busy(lkey) {
            for i in 0..self.qps.len() {
                self.fail_wrs_naming(i, slot);
            }
        }
        self.mrs.deregister(lkey)
    }

    /// [`dereg_mr_invalidate`](Self::dereg_mr_invalidate)'s work on QP `i`.
    fn fail_wrs_naming(&mut self, i: usize, slot: u32) {
        let Some(qp) = self.qps[i].as_deref() else {
            return;
        };
        let names = |segs: &[Seg]| segs.iter().any(|s| s.mr.slot == slot);
        let mut sq_hit = None;
        let mut w = qp.sq.head;
        while w != qp.sq.tail {
            if names(qp.sq.segs(w)) {
                sq_hit = Some(w);
                break;
            }
            w = w.wrapping_add(1);
        }
        let mut rq_hit = None;
        let mut r = qp.rq.head;
        while r != qp.rq.tail {
            if names(qp.rq.segs(r)) {
                rq_hit = Some(r);
                break;
            }
            r = r.wrapping_add(1);
        }
        if sq_hit.is_none() && rq_hit.is_none() {
            return;
        }
        if let Some(hit) = sq_hit {
            loop {
                let Some(qp) = self.qps[i].as_deref() else {
                    return;
                };
                let h = qp.sq.head;
                if h == qp.sq.tail {
                    break;
                }
                let status = if h == hit {
                    WcStatus::LocProtErr
                } else {
                    WcStatus::WrFlushErr
                };
                self.retire_send(i, h, status);
                if h == hit {
                    break;
                }
            }
        }
        if let Some(hit) = rq_hit {
            loop {
                let Some(qp) = self.qps[i].as_deref() else {
                    return;
                };
                let h = qp.rq.head;
                if h == qp.rq.tail {
                    break;
                }
                let wc = Wc {
                    wr_id: qp.rq.wqe(h).wr_id,
                    status: if h == hit {
                        WcStatus::LocProtErr
                    } else {
                        WcStatus::WrFlushErr
                    },
                    opcode: WcOpcode::Recv,
                    qp_num: qp.qpn,
                    ..Wc::default()
                };
                let cq = qp.recv_cq;
                self.retire_recv(i);
                self.push_wc(cq, wc);
                if h == hit {
                    break;
                }
            }
        }
        self.enter_error(i);
    }

    /// True while an in-flight WR or a saved READ/atomic responder resource holds a lease on the MR (so
    /// [`dereg_mr`](Self::dereg_mr) would fail with `Busy`); false for an unknown key.
    pub fn mr_busy(&self, lkey: Lkey) -> bool {
        self.mrs.get(lkey).is_some_and(|m| m.leased())
    }

    /// A copy of all bytes of the MR (tests, diagnostics; the engine never lends a slice of MR memory).
    pub fn mr_bytes(&self, lkey: Lkey) -> Option<Vec<u8>> {
        self.mrs.get(lkey).map(|m| m.buf.to_vec())
    }

    /// Copies `out.len()` bytes starting at byte `offset` of the MR into `out`. Errors: `InvalidHandle`,
    /// `InvalidArgument` (range outside the MR, or the memory faulted: [`MemoryFault`](crate::MemoryFault)).
    pub fn mr_read(&self, lkey: Lkey, offset: usize, out: &mut [u8]) -> Result<(), ResourceError> {
        let m = self
            .mrs
            .get(lkey)
            .ok_or(ResourceError::InvalidHandle("lkey"))?;
        if offset.checked_add(out.len()).is_none_or(|end| end > m.len) {
            return Err(ResourceError::InvalidArgument("range"));
        }
        m.buf.memory().read_at(offset, out).map_err(|_| {
            ResourceError::InvalidArgument("MR memory faulted (unmapped or protected)")
        })
    }

    /// Copies `data` into the MR at byte `offset`. Errors as [`mr_read`](Self::mr_read).
    pub fn mr_write(
        &mut self,
        lkey: Lkey,
        offset: usize,
        data: &[u8],
    ) -> Result<(), ResourceError> {
        let m = self
            .mrs
            .get_mut(lkey)
            .ok_or(ResourceError::InvalidHandle("lkey"))?;
        if offset.checked_add(data.len()).is_none_or(|end| end > m.len) {
            return Err(ResourceError::InvalidArgument("range"));
        }
        m.buf.memory_mut().write_at(offset, data).map_err(|_| {
            ResourceError::InvalidArgument("MR memory faulted (unmapped or protected)")
        })
    }

    // ----------------------------------------------------------------------------------------------- CQ / AH

    /// `ibv_create_cq` with room for `depth` completions (1..=max_cqe).
    pub fn create_cq(&mut self, depth: u32) -> Result<CqHandle, ResourceError> {
        if depth == 0 || depth > self.cfg.device.max_cqe {
            return Err(ResourceError::InvalidArgument(
                "cq depth must be 1..=max_cqe",
            ));
        }
        if self.cqs.iter().flatten().count() as u32 >= self.cfg.device.max_cq {
            return Err(ResourceError::Exhausted("max_cq"));
        }
        let cq = Cq::new(depth as usize);
        let i = match self.cqs.iter().position(Option::is_none) {
            Some(i) => {
                self.cqs[i] = Some(cq);
                i
            }
            None => {
                self.cqs.push(Some(cq));
                self.cqs.len() - 1
            }
        };
        // The ready list holds each CQ at most once: room for every slot means it never grows on the data path.
        let slots = self.cqs.len();
        self.cq_ready
            .reserve(slots.saturating_sub(self.cq_ready.len()));
        Ok(CqHandle(i as u32 + 1))
    }

    /// `ibv_destroy_cq`: fails with `Busy` while a QP uses it.
    pub fn destroy_cq(&mut self, cq: CqHandle) -> Result<(), ResourceError> {
        let slot = self.cq_mut(cq).ok_or(ResourceError::InvalidHandle("cq"))?;
        if slot.users > 0 {
            return Err(ResourceError::Busy("CQ is used by a QP"));
        }
        if slot.ready {
            // Control path: drop its ready-list entry so a new CQ in the same slot is not reported by it.
            let idx = cq.0 - 1;
            self.cq_ready.retain(|&c| c != idx);
        }
        self.cqs[cq.0 as usize - 1] = None;
        Ok(())
    }

    pub(crate) fn cq_mut(&mut self, cq: CqHandle) -> Option<&mut Cq> {
        self.cqs
            .get_mut((cq.0 as usize).wrapping_sub(1))
            .and_then(Option::as_mut)
    }

    /// `ibv_poll_cq`: moves up to `out.len()` completions into `out`; returns how many (0 = empty, not an error).
    #[must_use]
    pub fn poll_cq(&mut self, cq: CqHandle, out: &mut [Wc]) -> usize {
        self.cq_mut(cq).map_or(0, |c| c.poll(out))
    }

    /// The next CQ that received at least one completion since this method last returned it, or `None`.
    ///
    /// A driver that serves many CQs (one per QP is common) calls this instead of polling every CQ on every loop:
    /// the engine keeps a FIFO of CQs that gained completions, each CQ on it at most once, so the cost is O(1) per
    /// CQ with news, never a scan over all CQs. Edge-triggered: a CQ is listed again only when a *new* completion
    /// arrives after it was returned, so a caller that does not drain it fully (e.g. its own ring is full) must
    /// remember to poll it again. Completions taken with [`poll_cq`](Self::poll_cq) without consulting the list do
    /// not remove the CQ from it (it may then be reported with nothing left to poll).
    #[must_use]
    pub fn poll_ready_cq(&mut self) -> Option<CqHandle> {
        while let Some(i) = self.cq_ready.pop_front() {
            if let Some(Some(c)) = self.cqs.get_mut(i as usize)
                && c.ready
            {
                c.ready = false;
                if self.gsi.as_ref().is_some_and(|g| g.cq.0 == i + 1) {
                    continue; // the GSI's own CQ: drained by `poll_mad`
                }
                return Some(CqHandle(i + 1));
            }
        }
        None
    }

    /// Completions waiting in a CQ.
    pub fn cq_len(&self, cq: CqHandle) -> usize {
        self.cqs
            .get((cq.0 as usize).wrapping_sub(1))
            .and_then(Option::as_ref)
            .map_or(0, |c| c.ring.len())
    }

    /// `ibv_create_ah` for UD sends. The header template is built here, once.
    pub fn create_ah(&mut self, pd: PdHandle, attr: &AhAttr) -> Result<AhHandle, ResourceError> {
        if !self.pd_live(pd) {
            return Err(ResourceError::InvalidHandle("pd"));
        }
        if self.ahs.iter().flatten().count() as u32 >= self.cfg.device.max_ah {
            return Err(ResourceError::Exhausted("max_ah"));
        }
        let sgid = *self
            .cfg
            .gids
            .get(attr.sgid_index as usize)
            .ok_or(ResourceError::InvalidArgument("sgid_index"))?;
        if sgid.as_ipv4().is_some() != attr.dgid.as_ipv4().is_some() {
            return Err(ResourceError::InvalidArgument(
                "sgid and dgid differ in IP version",
            ));
        }
        let ident = IPV4_IDENT;
        // A multicast DGID has a fixed Ethernet destination (Linux `ib_resolve_eth_dmac`: `ip_eth_mc_map`).
        let mut attr = *attr;
        if let Some(m) = crate::mcast::multicast_mac(&attr.dgid) {
            attr.dmac = m;
        }
        let attr = &attr;
        let t = TxTemplate::new(
            self.cfg.mac,
            sgid,
            attr,
            0,
            Qpn::new(0),
            false,
            self.cfg.ecn_data,
            self.cfg.cnp_dscp,
            ident,
        );
        let e = Some((pd, *attr, t));
        if let Some(i) = self.ahs.iter().position(Option::is_none) {
            self.ahs[i] = e;
            return Ok(AhHandle(i as u32 + 1));
        }
        self.ahs.push(e);
        Ok(AhHandle(self.ahs.len() as u32))
    }

    /// `ibv_destroy_ah`: fails with `Busy` while a posted, not yet completed UD WR names it (control path: scans
    /// the send queues).
    pub fn destroy_ah(&mut self, ah: AhHandle) -> Result<(), ResourceError> {
        let in_use = self.qps.iter().flatten().any(|qp| {
            let mut w = qp.sq.head;
            while w != qp.sq.tail {
                if qp.sq.wqe(w).ud.is_some_and(|d| d.ah == ah) {
                    return true;
                }
                w = w.wrapping_add(1);
            }
            false
        });
        match self.ahs.get_mut((ah.0 as usize).wrapping_sub(1)) {
            Some(Some(_)) if in_use => {
                Err(ResourceError::Busy("AH is used by posted work requests"))
            }
            Some(e @ Some(_)) => {
                *e = None;
                Ok(())
            }
            _ => Err(ResourceError::InvalidHandle("ah")),
        }
    }

    // ----------------------------------------------------------------------------------------------- QP

    pub(crate) fn qidx(&self, qpn: Qpn) -> Option<usize> {
        let i = qpn_slot(self.qpns, qpn.value())?;
        match self.qps.get(i) {
            Some(Some(_)) => Some(i),
            _ => None,
        }
    }

    pub(crate) fn qp(&self, qpn: Qpn) -> Option<&Qp> {
        self.qps.get(self.qidx(qpn)?)?.as_deref()
    }

    /// `ibv_create_qp`. Capabilities are checked against [`DeviceAttr`]: with [`CapPolicy::Reject`] an excess fails
    /// naming the field; with [`CapPolicy::Clamp`] it is clamped. Returns the QPN and the granted capabilities (S09).
    /// All queue storage (WQE rings, SGE arrays, inline areas) is allocated here, never on the data path.
    pub fn create_qp(&mut self, init: &QpInitAttr) -> Result<(Qpn, QpCap), CreateQpError> {
        self.create_qp_srq(init, None)
    }

    /// `ibv_create_qp` with `ibv_qp_init_attr.srq`: as [`create_qp`](Self::create_qp); with `Some(srq)` the QP takes
    /// its receive WQEs from that SRQ (`crate::srq`): `cap.max_recv_wr` / `max_recv_sge` are ignored and granted as 0
    /// (as mlx5 reports them), and [`post_recv`](Self::post_recv) on the QP is refused. Errors as `create_qp`, and
    /// `InvalidHandle("srq")` for a dead SRQ.
    pub fn create_qp_srq(
        &mut self,
        init: &QpInitAttr,
        srq: Option<SrqHandle>,
    ) -> Result<(Qpn, QpCap), CreateQpError> {
        let srq_sge = match srq {
            None => None,
            Some(h) => match self.query_srq(h) {
                Some(a) => Some(a.max_sge),
                None => return Err(ResourceError::InvalidHandle("srq").into()),
            },
        };
        if !self.pd_live(init.pd) {
            return Err(ResourceError::InvalidHandle("pd").into());
        }
        if self.cq_mut(init.send_cq).is_none() || self.cq_mut(init.recv_cq).is_none() {
            return Err(ResourceError::InvalidHandle("cq").into());
        }
        if self.live_qps >= self.cfg.device.max_qp + u32::from(self.gsi.is_some()) {
            return Err(ResourceError::Exhausted("max_qp").into());
        }
        let d = self.cfg.device;
        let mut cap = init.cap;
        if srq.is_some() {
            cap.max_recv_wr = 0;
            cap.max_recv_sge = 0;
        }
        let checks: [(&'static str, &mut u32, u32); 5] = [
            ("max_send_wr", &mut cap.max_send_wr, d.max_qp_wr),
            ("max_recv_wr", &mut cap.max_recv_wr, d.max_qp_wr),
            ("max_send_sge", &mut cap.max_send_sge, d.max_sge),
            ("max_recv_sge", &mut cap.max_recv_sge, d.max_sge),
            (
                "max_inline_data",
                &mut cap.max_inline_data,
                d.max_inline_data,
            ),
        ];
        for (field, v, limit) in checks {
            if *v > limit {
                match self.cfg.cap_policy {
                    CapPolicy::Reject => {
                        return Err(CreateQpError::CapExceeded {
                            field,
                            requested: *v,
                            limit,
                        });
                    }
                    CapPolicy::Clamp => *v = limit,
                }
            }
        }
        if cap.max_send_wr == 0 && cap.max_recv_wr == 0 && srq.is_none() {
            return Err(
                ResourceError::InvalidArgument("max_send_wr and max_recv_wr are both 0").into(),
            );
        }
        cap.max_send_wr = cap.max_send_wr.max(1);
        cap.max_send_sge = cap.max_send_sge.max(1);
        if srq.is_none() {
            cap.max_recv_sge = cap.max_recv_sge.max(1);
        }
        // A destroyed QP's number is not handed out again at once: fresh slots first, then the slot freed longest
        // ago (rxe allocates QPNs cyclically too). The IB CM takes a REQ from a QPN that a live connection at the
        // peer still uses for a stale connection and rejects it (IBTA Vol 1 ch. 12; Linux `cm_req_handler`), so a
        // program closing one connection and opening the next to the same peer must not reuse the number.
        // (Slot 0, QPN 1, is free only while `Engine::new` opens the GSI on it.)
        let fresh = self.qps.len() - 1 < self.cfg.device.max_qp as usize;
        let idx = if self.qp_free.first() == Some(&0) {
            self.qp_free.remove(0) as usize
        } else if fresh || self.qp_free.is_empty() {
            let slots = self.qps.len() + 1;
            let want = grown(self.qps.capacity(), slots, self.max_qp_slots());
            self.qps.reserve_exact(want - self.qps.len());
            self.sched.reserve_slots(want);
            self.qps.push(None);
            self.qps.len() - 1
        } else {
            self.qp_free.remove(0) as usize
        };
        let qpn = Qpn::new(slot_qpn(self.qpns, idx));
        let qp = Qp {
            qpn,
            qp_type: init.qp_type,
            state: QpState::Reset,
            pd: init.pd,
            send_cq: init.send_cq,
            recv_cq: init.recv_cq,
            sq_sig_all: init.sq_sig_all,
            cap,
            attr: QpAttr {
                cap,
                // UD has no PATH_MTU attribute: its messages are limited by the port MTU (`ROCEV2.md §4.1`).
                path_mtu: if init.qp_type == QpType::Ud {
                    self.query_device().max_mtu
                } else {
                    QpAttr::default().path_mtu
                },
                ..QpAttr::default()
            },
            req: ReqCtx::INIT,
            sq: SendQueue::new(cap.max_send_wr, cap.max_send_sge, cap.max_inline_data),
            // On an SRQ: room for the one WQE the responder takes from it (`srq::take_recv`).
            rq: match srq_sge {
                Some(sge) => RecvQueue::new(1, sge),
                None => RecvQueue::new(cap.max_recv_wr, cap.max_recv_sge),
            },
            srq,
            // Responder resources and their response queue are sized at RTR by `max_dest_rd_atomic`, not by the
            // device maximum: an idle QP costs no READ/atomic state it was not granted (issue #21, per-QP memory).
            resp: RespCtx::new(0),
            timers: QpTimers::with_base(self.timer_epoch),
            counters: Counters::default(),
            tmpl: None,
            rate: match &self.cfg.dcqcn {
                Some(c) => Box::new(Dcqcn::new(c.clone())),
                None => Box::new(FixedRate::unlimited()),
            },
            sqd_notified: false,
            comm_est: false,
        };
        self.timer_epoch = self.timer_epoch.wrapping_add(1 << 20);
        self.sched.add_qp(idx, qp.pmtu());
        // The bucket starts at the controller's rate (a DCQCN RP: the line rate, `DCQCN.md` R0).
        self.sched.reset_qp(idx, qp.rate.rate_bps());
        self.qps[idx] = Some(Box::new(qp));
        self.live_qps += 1;
        self.reserve_per_qp();
        for cq in [init.send_cq, init.recv_cq] {
            if let Some(c) = self.cq_mut(cq) {
                c.users += 1;
            }
        }
        if let Some(s) = srq.and_then(|h| self.srq_mut(h)) {
            s.users += 1;
        }
        Ok((qpn, cap))
    }

    /// Sizes the engine-wide queues the per-packet path pushes to, so that after `create_qp` no packet allocates:
    /// the scheduler's queues are intrusive lists through its per-QP entries (sized by `Scheduler::add_qp`); the
    /// timer heap gets two entries per timer kind per QP; the async event queue room for three events per QP beyond
    /// those not yet polled.
    ///
    /// These tables, the QP table and the scheduler's entries grow by doubling (amortized O(1) per `create_qp`) but
    /// never past their size with every QP the device allows ([`grown`]), so a device filled to `max_qp` carries no
    /// growth slack (issue #21, memory per idle QP; `docs/TESTING.md`).
    fn reserve_per_qp(&mut self) {
        const TIMERS_PER_QP: usize = 2 * crate::timer::TIMER_KINDS;
        const EVENTS_PER_QP: usize = 3;
        let (live, all) = (self.live_qps as usize, self.max_qp_slots());
        let need = (TIMERS_PER_QP * live).max(self.timers.len());
        let cap = self.timers.capacity();
        let want = grown(cap, need, TIMERS_PER_QP * all);
        self.timers
            .reserve_exact(want.saturating_sub(self.timers.len()));
        let queued = self.events.len();
        let need = queued + EVENTS_PER_QP * live;
        let want = grown(self.events.capacity(), need, queued + EVENTS_PER_QP * all);
        self.events.reserve_exact(want - queued);
    }

    /// QP table slots with every QP of the device: `max_qp` and slot 0 (the GSI's); also the most live QPs there can
    /// be (`max_qp`, and the GSI when it is open: `create_qp`'s limit).
    fn max_qp_slots(&self) -> usize {
        self.cfg.device.max_qp as usize + 1
    }

    /// Replaces the QP's rate controller (the DCQCN seam, `crate::cc`; default: a [`crate::cc::Dcqcn`] reaction
    /// point when [`EngineConfig::dcqcn`] is set, else [`FixedRate::unlimited`]). The QP's bucket starts full at the
    /// new controller's rate (capped by the QP's limit).
    pub fn set_rate_controller(
        &mut self,
        qpn: Qpn,
        rc: Box<dyn RateController>,
    ) -> Result<(), ResourceError> {
        let i = self.qidx(qpn).ok_or(ResourceError::InvalidHandle("qpn"))?;
        let rate = rc.rate_bps();
        if let Some(q) = self.qps[i].as_mut() {
            q.rate = rc;
        }
        self.arm_rate_timer(i);
        self.sched.reset_qp(i, rate);
        self.reshaped(i);
        Ok(())
    }

    /// Sets a QP's own rate limit and bucket depth, like `ibv_modify_qp_rate_limit(rate_limit, max_burst_sz)`
    /// (`DCQCN.md §8`): `rate_bps` caps the rate its controller computes (`None` or 0 = no cap; the QP then runs at
    /// its controller's rate, unlimited by default), `burst_bytes` sets its token-bucket depth (`None` = the
    /// configured default, `SchedConfig`; always at least one frame, so `Some(0)` means per-packet pacing). The bucket
    /// starts full. Errors: `InvalidHandle` for an unknown QPN.
    pub fn set_qp_rate_limit(
        &mut self,
        qpn: Qpn,
        rate_bps: Option<u64>,
        burst_bytes: Option<u64>,
    ) -> Result<(), ResourceError> {
        let i = self.qidx(qpn).ok_or(ResourceError::InvalidHandle("qpn"))?;
        let ctl = self.qps[i].as_deref().and_then(|q| q.rate.rate_bps());
        self.sched
            .set_limit(i, rate_bps.filter(|&r| r > 0), burst_bytes, ctl);
        self.reshaped(i);
        Ok(())
    }

    /// Sets a QP's traffic class (0..=7): the DWRR class its requests are scheduled in (`DCQCN.md §9`, ETS weights in
    /// `SchedConfig::tcs`). The default is `SchedConfig::qp_tc`. The class is a scheduling attribute of this engine
    /// only; the frames' DSCP stays the one of the QP's address vector. Errors: `InvalidHandle` for an unknown QPN,
    /// `InvalidArgument` for a class above 7.
    pub fn set_qp_tc(&mut self, qpn: Qpn, tc: u8) -> Result<(), ResourceError> {
        let i = self.qidx(qpn).ok_or(ResourceError::InvalidHandle("qpn"))?;
        if tc as usize >= crate::sched::TRAFFIC_CLASSES {
            return Err(ResourceError::InvalidArgument(
                "traffic class must be 0..=7",
            ));
        }
        self.sched.set_tc(i, tc);
        Ok(())
    }

    /// The send scheduler (decision counters, per-QP shaping state).
    pub fn scheduler(&self) -> &Scheduler {
        &self.sched
    }

    /// After a bucket was replaced: a QP waiting for its `Shaper` timer is re-timed.
    fn reshaped(&mut self, i: usize) {
        let Some(at) = self.sched.parked_until(i) else {
            return;
        };
        let Some(qp) = self.qps.get_mut(i).and_then(Option::as_deref_mut) else {
            return;
        };
        let qpn = qp.qpn.value();
        self.timers.set(&mut qp.timers, qpn, TimerKind::Shaper, at);
    }

    /// The rate a QP is shaped to now, in bit/s (`None` = unlimited): the smaller of its controller's rate and its
    /// own limit.
    pub fn qp_rate_bps(&self, qpn: Qpn) -> Option<u64> {
        let i = self.qidx(qpn)?;
        self.sched.qp(i).and_then(|s| s.bucket().rate_bps())
    }

    /// Re-reads the QP's controller rate (after any call into the controller, STYLE E5 seam) and hands it to the
    /// QP's bucket; if the rate changed while the QP waits for its `Shaper` timer, the departure is re-timed
    /// (`DCQCN.md §2.3 R7`).
    pub(crate) fn apply_rate(&mut self, i: usize, now: Instant) {
        let Some(qp) = self.qps.get_mut(i).and_then(Option::as_deref_mut) else {
            return;
        };
        let retime = self.sched.set_qp_rate(i, now, qp.rate.rate_bps());
        self.sync_credit_lost(i);
        let Some(qp) = self.qps.get_mut(i).and_then(Option::as_deref_mut) else {
            return;
        };
        match retime {
            Retime::None => {}
            Retime::At(at) => {
                let qpn = qp.qpn.value();
                self.timers.set(&mut qp.timers, qpn, TimerKind::Shaper, at);
            }
            Retime::Now => {
                Timers::cancel(&mut qp.timers, TimerKind::Shaper);
                self.kick(i);
            }
        }
    }

    /// `ibv_destroy_qp`. Outstanding WRs are discarded without completions (like libibverbs), their MR leases
    /// released. Refused with `Busy` (EBUSY) while the QP is attached to a multicast group (rxe
    /// `rxe_qp_chk_destroy`).
    pub fn destroy_qp(&mut self, qpn: Qpn) -> Result<(), ResourceError> {
        let i = self
            .qidx(qpn)
            .filter(|_| !self.is_gsi(qpn))
            .ok_or(ResourceError::InvalidHandle("qpn"))?;
        if self.mcast.attached(qpn) {
            return Err(ResourceError::Busy("QP is attached to multicast groups"));
        }
        self.release_all(i);
        let Some(qp) = self.qps[i].take() else {
            return Err(ResourceError::InvalidHandle("qpn"));
        };
        for cq in [qp.send_cq, qp.recv_cq] {
            if let Some(c) = self.cq_mut(cq) {
                c.users = c.users.saturating_sub(1);
            }
        }
        if let Some(s) = qp.srq.and_then(|h| self.srq_mut(h)) {
            s.users = s.users.saturating_sub(1);
        }
        self.qp_free.push(i as u32);
        self.live_qps -= 1;
        Ok(())
    }

    /// Releases every MR lease the QP holds and empties its queues (no completions).
    fn release_all(&mut self, i: usize) {
        let Some(qp) = self.qps[i].as_deref_mut() else {
            return;
        };
        let mrs = &mut self.mrs;
        let mut w = qp.sq.head;
        while w != qp.sq.tail {
            for s in qp.sq.segs(w) {
                mrs.release(s.mr.slot);
            }
            w = w.wrapping_add(1);
        }
        qp.sq.head = qp.sq.tail;
        qp.sq.cur = qp.sq.tail;
        let mut r = qp.rq.head;
        while r != qp.rq.tail {
            for s in qp.rq.segs(r) {
                mrs.release(s.mr.slot);
            }
            r = r.wrapping_add(1);
        }
        qp.rq.head = qp.rq.tail;
        for res in qp.resp.res.iter_mut() {
            res.valid = false;
        }
        qp.resp.out.clear();
        qp.resp.msg = InMsg::None;
        qp.req.rd_atomic_out = 0;
    }

    /// `ibv_query_qp`: current attributes (state, PSNs, timers, granted caps).
    pub fn query_qp(&self, qpn: Qpn) -> Option<QpAttr> {
        let q = self.qp(qpn)?;
        let mut a = q.attr;
        a.qp_state = q.state;
        a.cur_qp_state = q.state;
        a.cap = q.cap;
        a.sq_psn = q.req.next_psn;
        a.rq_psn = q.resp.epsn;
        Some(a)
    }

    /// PSN / queue summary of a QP.
    pub fn qp_info(&self, qpn: Qpn) -> Option<QpInfo> {
        let q = self.qp(qpn)?;
        Some(QpInfo {
            qp_type: q.qp_type,
            state: q.state,
            next_psn: q.req.next_psn,
            una_psn: q.req.una_psn,
            epsn: q.resp.epsn,
            msn: q.resp.msn,
            sq_outstanding: q.sq.len(),
            rq_outstanding: q.rq.len(),
            udp_sport: q.tmpl.as_ref().map_or(0, |t| t.sport),
        })
    }

    /// A human-readable dump of a QP (state, PSNs, queue depths, retry counters, timers, non-zero counters).
    pub fn qp_dump(&self, qpn: Qpn) -> Option<String> {
        self.qp_display(qpn).map(|d| d.to_string())
    }

    /// The QP's rate controller state at `now`: current rate (RC), target rate (RT), α, whether it is limiting
    /// (`DCQCN.md` §2); `None` for an unknown QPN.
    pub fn qp_rate(&self, qpn: Qpn, now: Instant) -> Option<RateMetrics> {
        self.qp(qpn).map(|q| q.rate.metrics(now))
    }

    /// The same dump as a borrowed [`core::fmt::Display`] value (no allocation until formatted).
    pub fn qp_display(&self, qpn: Qpn) -> Option<QpDump<'_>> {
        let i = self.qidx(qpn)?;
        self.qp(qpn).map(|qp| QpDump {
            qp,
            shape: self.sched.qp(i),
        })
    }

    /// QPNs of all live QPs, ascending (control path: scans the QP table).
    pub fn qpns(&self) -> impl Iterator<Item = Qpn> + '_ {
        self.qps.iter().flatten().map(|q| q.qpn)
    }

    /// `ibv_modify_qp`: validates the transition and attribute mask against the table of `ROCEV2.md §4.6` (errors name
    /// the missing/extra attributes, STYLE V5) and the values against the device limits, then applies them.
    ///
    /// Effects: →RESET empties the queues (no completions); →ERR flushes every outstanding WR with WR_FLUSH_ERR;
    /// INIT→RTR sets the responder's expected PSN and builds the per-QP header template (UDP source port fixed for
    /// the QP lifetime, S13); RTR→RTS sets the requester's PSNs and retry counters.
    pub fn modify_qp(
        &mut self,
        qpn: Qpn,
        attr: &QpAttr,
        mask: QpAttrMask,
    ) -> Result<(), ModifyQpError> {
        let i = self
            .qidx(qpn)
            .filter(|_| !self.is_gsi(qpn))
            .ok_or(ModifyQpError::UnknownQp(qpn))?;
        if crate::gsi::controlled_qkey_refused(qpn, attr, mask) {
            return Err(crate::gsi::CONTROLLED_QKEY);
        }
        let dev = self.query_device();
        let Some(qp) = self.qps[i].as_deref() else {
            return Err(ModifyQpError::UnknownQp(qpn));
        };
        let cur = qp.state;
        let to = if mask.contains(QpAttrMask::STATE) {
            attr.qp_state
        } else {
            cur
        };
        check_modify(qp.qp_type, cur, to, mask)?;
        if mask.contains(QpAttrMask::CUR_STATE) && attr.cur_qp_state != cur {
            return Err(ModifyQpError::CurStateMismatch {
                given: attr.cur_qp_state,
                actual: cur,
            });
        }
        let bad = |attr: &'static str, reason: &'static str| {
            Err(ModifyQpError::InvalidValue { attr, reason })
        };
        if mask.contains(QpAttrMask::PORT) && attr.port_num != 1 {
            return bad("port_num", "the engine has one port, number 1");
        }
        if mask.contains(QpAttrMask::PKEY_INDEX) && attr.pkey_index != 0 {
            return bad("pkey_index", "the P_Key table has one entry (0xFFFF)");
        }
        if mask.contains(QpAttrMask::PATH_MTU) && attr.path_mtu > dev.max_mtu {
            return bad("path_mtu", "larger than the port MTU");
        }
        if mask.contains(QpAttrMask::TIMEOUT) && attr.timeout > 31 {
            return bad("timeout", "must be 0..=31");
        }
        if mask.contains(QpAttrMask::RETRY_CNT) && attr.retry_cnt > 7 {
            return bad("retry_cnt", "must be 0..=7");
        }
        if mask.contains(QpAttrMask::RNR_RETRY) && attr.rnr_retry > 7 {
            return bad("rnr_retry", "must be 0..=7");
        }
        if mask.contains(QpAttrMask::MIN_RNR_TIMER) && attr.min_rnr_timer > 31 {
            return bad("min_rnr_timer", "must be 0..=31");
        }
        if mask.contains(QpAttrMask::MAX_QP_RD_ATOMIC)
            && u32::from(attr.max_rd_atomic) > dev.max_qp_init_rd_atom
        {
            return bad("max_rd_atomic", "exceeds max_qp_init_rd_atom");
        }
        if mask.contains(QpAttrMask::MAX_DEST_RD_ATOMIC)
            && u32::from(attr.max_dest_rd_atomic) > dev.max_qp_rd_atom
        {
            return bad("max_dest_rd_atomic", "exceeds max_qp_rd_atom");
        }
        if mask.contains(QpAttrMask::ACCESS_FLAGS)
            && attr.qp_access_flags.0
                & !(AccessFlags::LOCAL_WRITE
                    | AccessFlags::REMOTE_WRITE
                    | AccessFlags::REMOTE_READ
                    | AccessFlags::REMOTE_ATOMIC)
                    .0
                != 0
        {
            return bad("qp_access_flags", "unsupported access bits");
        }
        if mask.contains(QpAttrMask::AV) {
            let Some(sgid) = self.cfg.gids.get(attr.ah_attr.sgid_index as usize) else {
                return bad("ah_attr.sgid_index", "no such GID table entry");
            };
            if sgid.as_ipv4().is_some() != attr.ah_attr.dgid.as_ipv4().is_some() {
                return bad(
                    "ah_attr.dgid",
                    "IP version differs from the source GID (S16)",
                );
            }
        }
        if mask.contains(QpAttrMask::DEST_QPN) && attr.dest_qp_num.value() > 0xFF_FFFF {
            return bad("dest_qp_num", "must fit 24 bits");
        }
        // Apply.
        let mac = self.cfg.mac;
        let gids = self.cfg.gids.clone();
        let (ecn_data, cnp_dscp) = (self.cfg.ecn_data, self.cfg.cnp_dscp);
        // IPv4 identification of this QP's packets (fixed per QP, see `wire::TxTemplate`).
        let ident = IPV4_IDENT;
        let Some(qp) = self.qps[i].as_deref_mut() else {
            return Err(ModifyQpError::UnknownQp(qpn));
        };
        let a = &mut qp.attr;
        let set = |b: QpAttrMask| mask.contains(b);
        if set(QpAttrMask::ACCESS_FLAGS) {
            a.qp_access_flags = attr.qp_access_flags;
        }
        if set(QpAttrMask::QKEY) {
            a.qkey = attr.qkey;
        }
        if set(QpAttrMask::AV) {
            a.ah_attr = attr.ah_attr;
        }
        if set(QpAttrMask::PATH_MTU) {
            a.path_mtu = attr.path_mtu;
        }
        if set(QpAttrMask::TIMEOUT) {
            a.timeout = attr.timeout;
        }
        if set(QpAttrMask::RETRY_CNT) {
            a.retry_cnt = attr.retry_cnt;
        }
        if set(QpAttrMask::RNR_RETRY) {
            a.rnr_retry = attr.rnr_retry;
        }
        if set(QpAttrMask::MIN_RNR_TIMER) {
            a.min_rnr_timer = attr.min_rnr_timer;
        }
        if set(QpAttrMask::MAX_QP_RD_ATOMIC) {
            a.max_rd_atomic = attr.max_rd_atomic.max(1);
        }
        if set(QpAttrMask::MAX_DEST_RD_ATOMIC) {
            // 0 is a valid choice: the responder then has no READ/atomic resources and refuses them (`execute`).
            a.max_dest_rd_atomic = attr.max_dest_rd_atomic;
        }
        if set(QpAttrMask::DEST_QPN) {
            a.dest_qp_num = attr.dest_qp_num;
        }
        if set(QpAttrMask::EN_SQD_ASYNC_NOTIFY) {
            a.en_sqd_async_notify = attr.en_sqd_async_notify;
        }
        if set(QpAttrMask::PATH_MIG_STATE) {
            a.path_mig_state = attr.path_mig_state;
        }
        if set(QpAttrMask::RQ_PSN) {
            a.rq_psn = attr.rq_psn;
            qp.resp.epsn = attr.rq_psn;
            qp.resp.ack_psn = attr.rq_psn - 1;
        }
        if set(QpAttrMask::SQ_PSN) {
            a.sq_psn = attr.sq_psn;
            qp.req.next_psn = attr.sq_psn;
            qp.req.una_psn = attr.sq_psn;
            qp.req.high_psn = attr.sq_psn;
        }
        if set(QpAttrMask::RETRY_CNT) || set(QpAttrMask::RNR_RETRY) {
            qp.req.retry_left = qp.attr.retry_cnt;
            qp.req.rnr_left = qp.attr.rnr_retry;
        }
        if set(QpAttrMask::MAX_DEST_RD_ATOMIC) || (cur == QpState::Init && to == QpState::Rtr) {
            let n = usize::from(qp.attr.max_dest_rd_atomic);
            qp.resp.res.clear();
            qp.resp.res.reserve_exact(n);
            qp.resp.res.resize(n, RdResource::EMPTY);
            qp.resp.res_next = 0;
            // Room for every response the resources can have queued (one stream or ATOMIC ACK each, an ACK or NAK
            // between them), so the per-packet path never grows the queue (`RespCtx::new`).
            let room = RespCtx::out_room(n);
            qp.resp.out.reserve(room.saturating_sub(qp.resp.out.len()));
        }
        // Header template: built when the path is (re)defined on a connected QP (S13: the UDP source port is
        // derived from both QPNs and stays fixed).
        if qp.qp_type != QpType::Ud
            && (set(QpAttrMask::AV) || set(QpAttrMask::DEST_QPN))
            && to >= QpState::Rtr
        {
            let sgid = gids[qp.attr.ah_attr.sgid_index as usize];
            qp.tmpl = Some(TxTemplate::new(
                mac,
                sgid,
                &qp.attr.ah_attr,
                wire::udp_sport(qp.qpn, qp.attr.dest_qp_num, qp.attr.ah_attr.flow_label),
                qp.attr.dest_qp_num,
                // S12: RC packets carry MigReq = 1 like hardware RNICs ("migrated", APM unused); receivers ignore it.
                qp.qp_type == QpType::Rc,
                ecn_data,
                cnp_dscp,
                ident,
            ));
        }
        if qp.qp_type == QpType::Ud && to >= QpState::Rtr && qp.tmpl.is_none() {
            // UD packets carry per-WR headers from their AH; the template only supplies the QP's source port.
            let sgid = gids[0];
            let av = AhAttr {
                dgid: sgid,
                ..AhAttr::default()
            };
            qp.tmpl = Some(TxTemplate::new(
                mac,
                sgid,
                &av,
                wire::udp_sport(qp.qpn, qp.qpn, 0),
                Qpn::new(0),
                false,
                ecn_data,
                cnp_dscp,
                ident,
            ));
        }
        qp.state = to;
        if to == QpState::Rts {
            qp.sqd_notified = false;
        }
        let pmtu = qp.pmtu();
        self.sched.set_pmtu(i, pmtu);
        match to {
            QpState::Reset => {
                self.release_all(i);
                if let Some(qp) = self.qps[i].as_deref_mut() {
                    for k in TimerKind::ALL {
                        Timers::cancel(&mut qp.timers, k);
                    }
                    // A new connection starts from scratch (IBTA 10.3.1, rxe `rxe_qp_reset`).
                    qp.tmpl = None;
                    self.sched.unpark(i);
                    // A reset QP forgets its congestion state; its bucket follows the controller's start rate.
                    qp.rate.reset();
                    self.sched.reset_qp(i, qp.rate.rate_bps());
                    qp.req = ReqCtx::INIT;
                    qp.resp.reset();
                    qp.sqd_notified = false;
                    qp.comm_est = false;
                }
            }
            // The consumer's own transition: no QP Fatal event (IBTA Vol 1 §11.6.3: affiliated asynchronous errors
            // report errors the QP met, not a modify the consumer asked for; mlx5/rxe raise none here).
            QpState::Err if cur != QpState::Err => self.move_to_error(i, false),
            QpState::Rts | QpState::Sqd => self.kick(i),
            _ => {}
        }
        Ok(())
    }

    // ----------------------------------------------------------------------------------------------- posting

    /// `ibv_post_send`: posts a chain of WRs with one doorbell. Synchronous errors are only those libibverbs
    /// returns synchronously (bad state, too many SGEs, inline too large, SQ full, opcode invalid for the QP type,
    /// UD destination missing); the index of the first rejected WR is returned and the WRs before it stay posted.
    ///
    /// lkey/bounds/access problems and messages longer than `max_msg_sz` are *not* post errors: the WR completes
    /// with LOC_PROT_ERR / LOC_LEN_ERR when the requester reaches it and the QP moves to ERR (STYLE V3, S10).
    /// Inline payload is copied now (S08). In ERR state WRs are accepted and flushed (WR_FLUSH_ERR).
    pub fn post_send(&mut self, qpn: Qpn, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
        let Some(i) = self.qidx(qpn).filter(|_| !self.is_gsi(qpn)) else {
            return Err(PostError {
                index: 0,
                kind: PostErrorKind::UnknownQp,
            });
        };
        let max_msg = u64::from(self.cfg.device.max_msg_sz);
        let mut result = Ok(());
        for (index, wr) in wrs.iter().enumerate() {
            if let Err(kind) = self.post_one_send(i, wr, max_msg) {
                result = Err(PostError { index, kind });
                break;
            }
        }
        let err_state = self.qps[i]
            .as_deref()
            .is_some_and(|q| q.state == QpState::Err);
        if err_state {
            self.flush_sq(i);
        } else {
            self.kick(i);
        }
        result
    }

    fn post_one_send(
        &mut self,
        i: usize,
        wr: &SendWr<'_>,
        max_msg: u64,
    ) -> Result<(), PostErrorKind> {
        let Engine {
            qps, mrs, ahs, cfg, ..
        } = self;
        let Some(qp) = qps[i].as_deref_mut() else {
            return Err(PostErrorKind::UnknownQp);
        };
        match qp.state {
            QpState::Rts | QpState::Sqd | QpState::Err => {}
            s => return Err(PostErrorKind::InvalidState(s)),
        }
        let t = qp.qp_type;
        let op_ok = match wr.op {
            SendOp::Send | SendOp::SendWithImm { .. } => true,
            SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. } => t != QpType::Ud,
            SendOp::SendWithInv { .. } | SendOp::RdmaRead { .. } => t == QpType::Rc,
            SendOp::AtomicCmpAndSwp { .. } | SendOp::AtomicFetchAndAdd { .. } => t == QpType::Rc,
            SendOp::AtomicWrite { .. } => t == QpType::Rc,
            // Local operations (`crate::mw`): RC and UC send queues, no SGL.
            SendOp::BindMw { .. } | SendOp::LocalInv { .. } => {
                t != QpType::Ud && wr.sg_list.is_empty()
            }
        };
        if !op_ok {
            return Err(PostErrorKind::InvalidOpcode);
        }
        let inline = wr.send_flags.contains(SendFlags::INLINE) && !wr.op.is_read_or_atomic();
        if !inline && wr.sg_list.len() > qp.cap.max_send_sge as usize {
            return Err(PostErrorKind::TooManySges {
                given: wr.sg_list.len(),
                max: qp.cap.max_send_sge,
            });
        }
        let len: u64 = if let SendOp::AtomicWrite { .. } = wr.op {
            // Its payload is the WR's own 8 bytes.
            8
        } else if inline && !wr.inline_data.is_empty() {
            wr.inline_data.iter().map(|s| s.len() as u64).sum()
        } else {
            wr.sg_list.iter().map(|s| u64::from(s.length)).sum()
        };
        if inline && len > u64::from(qp.cap.max_inline_data) {
            return Err(PostErrorKind::InlineTooLarge {
                given: len,
                max: qp.cap.max_inline_data,
            });
        }
        let ud = if t == QpType::Ud {
            let mut d = wr.ud.ok_or(PostErrorKind::InvalidUdDest)?;
            match ahs.get((d.ah.0 as usize).wrapping_sub(1)) {
                Some(Some((pd, a, _))) if *pd == qp.pd => {
                    // To a multicast group the BTH DestQP is 0xFFFFFF, whatever the WR names (IBTA Vol 1 §10.5).
                    if crate::mcast::is_multicast_gid(&a.dgid) {
                        d.remote_qpn = Qpn::new(crate::mcast::MULTICAST_QPN);
                    }
                }
                _ => return Err(PostErrorKind::InvalidUdDest),
            }
            if len
                > u64::from(
                    qp.pmtu()
                        .min(Mtu::from_netdev_mtu(cfg.netdev_mtu).map_or(256, Mtu::bytes)),
                )
            {
                return Err(PostErrorKind::UdTooLarge(len));
            }
            Some(d)
        } else {
            None
        };
        if qp.sq.len() >= qp.sq.cap {
            return Err(PostErrorKind::QueueFull);
        }
        let idx = qp.sq.tail;
        let slot = qp.sq.slot(idx);
        let mut w = SendWqe::EMPTY;
        w.wr_id = wr.wr_id;
        w.op = wr.op;
        w.flags = wr.send_flags;
        w.signaled = qp.sq_sig_all || wr.send_flags.contains(SendFlags::SIGNALED);
        w.len = len;
        w.inline = inline;
        w.ud = ud;
        // Length rules (S10; atomics: exactly one 8-byte local buffer).
        // A message may not span more than 2^22 PSNs (a quarter of the 24-bit space): beyond that the window
        // compares of `ROCEV2.md §2.3` break. Only a > 1 GiB message at PMTU 256 can hit this.
        let too_many_psns = crate::requester::packets_for(len, qp.pmtu()) > (1 << 22);
        if len > max_msg || too_many_psns || (wr.op.is_atomic() && len != 8) {
            w.local_err = Some(WcStatus::LocLenErr);
        }
        if inline {
            let base = slot * qp.sq.max_inline as usize;
            let area = &mut qp.sq.inline[base..base + qp.sq.max_inline as usize];
            let mut off = 0usize;
            if !wr.inline_data.is_empty() {
                for s in wr.inline_data {
                    area[off..off + s.len()].copy_from_slice(s);
                    off += s.len();
                }
            } else {
                for sge in wr.sg_list {
                    match mrs.check_local(
                        sge.lkey,
                        qp.pd,
                        sge.addr,
                        u64::from(sge.length),
                        AccessFlags::EMPTY,
                    ) {
                        Ok(r) => {
                            let n = sge.length as usize;
                            if mrs.read(r, &mut area[off..off + n]).is_err()
                                && w.local_err.is_none()
                            {
                                // The source's memory faulted (unmapped or protected by the application): the
                                // WR completes LOC_PROT_ERR in its turn, as an SGE that fails its check.
                                w.local_err = Some(WcStatus::LocProtErr);
                                qp.counters.mr_access_faults += 1;
                                self.stats.mr_access_faults += 1;
                            }
                            off += n;
                        }
                        Err(_) => return Err(PostErrorKind::InvalidInlineSge),
                    }
                }
            }
        } else {
            // Resolve and lease every SGE now; a bad one becomes LOC_PROT_ERR at execution time.
            let need = if wr.op.is_read_or_atomic() {
                AccessFlags::LOCAL_WRITE
            } else {
                AccessFlags::EMPTY
            };
            let base = slot * qp.sq.max_sge as usize;
            let mut n = 0u16;
            for sge in wr.sg_list {
                match mrs.check_local(sge.lkey, qp.pd, sge.addr, u64::from(sge.length), need) {
                    Ok(r) => {
                        mrs.lease(r.slot);
                        qp.sq.segs[base + n as usize] = Seg {
                            mr: r,
                            len: sge.length,
                        };
                        n += 1;
                    }
                    Err(_) => {
                        if w.local_err.is_none() {
                            w.local_err = Some(WcStatus::LocProtErr);
                        }
                    }
                }
            }
            w.nsge = n;
        }
        qp.sq.wqes[slot] = w;
        qp.sq.tail = idx.wrapping_add(1);
        self.sched.note_wqe(i, len);
        Ok(())
    }

    /// `ibv_post_recv`: posts receive WRs. SGEs are checked (lkey, bounds, LOCAL_WRITE) and leased now; a bad SGE
    /// is reported as LOC_PROT_ERR when a message lands in the WR. Allowed from INIT on; in ERR the WRs are flushed.
    pub fn post_recv(&mut self, qpn: Qpn, wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
        let Some(i) = self.qidx(qpn).filter(|_| !self.is_gsi(qpn)) else {
            return Err(PostError {
                index: 0,
                kind: PostErrorKind::UnknownQp,
            });
        };
        let mut result = Ok(());
        {
            let Engine { qps, mrs, .. } = self;
            let Some(qp) = qps[i].as_deref_mut() else {
                return Err(PostError {
                    index: 0,
                    kind: PostErrorKind::UnknownQp,
                });
            };
            for (index, wr) in wrs.iter().enumerate() {
                let fail = |kind| Err(PostError { index, kind });
                if qp.srq.is_some() {
                    result = fail(PostErrorKind::QpOnSrq);
                    break;
                }
                if qp.state == QpState::Reset {
                    result = fail(PostErrorKind::InvalidState(QpState::Reset));
                    break;
                }
                if wr.sg_list.len() > qp.cap.max_recv_sge as usize {
                    result = fail(PostErrorKind::TooManySges {
                        given: wr.sg_list.len(),
                        max: qp.cap.max_recv_sge,
                    });
                    break;
                }
                if qp.rq.len() >= qp.cap.max_recv_wr {
                    result = fail(PostErrorKind::QueueFull);
                    break;
                }
                qp.rq.push(wr, qp.pd, mrs);
            }
        }
        if self.qps[i]
            .as_deref()
            .is_some_and(|q| q.state == QpState::Err)
        {
            self.flush_rq(i);
        }
        result
    }

    // ----------------------------------------------------------------------------------------------- outputs

    /// `ibv_get_async_event`: the next asynchronous event, if any.
    #[must_use]
    pub fn poll_async_event(&mut self) -> Option<AsyncEvent> {
        self.events.pop_front()
    }

    /// Port counters (sum over QPs plus drops that belong to no QP).
    pub fn counters(&self) -> &Counters {
        &self.stats
    }

    /// Per-QP counters.
    pub fn qp_counters(&self, qpn: Qpn) -> Option<&Counters> {
        self.qp(qpn).map(|q| &q.counters)
    }

    /// The earliest instant at which [`handle_timeout`](Self::handle_timeout) has work, if any (settles stale heap
    /// entries first, so the answer is exact).
    #[must_use]
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        let sched = self.sched.poll_timeout();
        loop {
            let Some((at, q, _, _)) = self.timers.peek() else {
                return sched;
            };
            let qt = Self::qp_timers(&mut self.qps, self.qpns, q);
            if self.timers.head_is_pending(qt.as_deref())
                || self.timers.settle(qt, Instant::ZERO, false) == Settle::Pending
            {
                return Some(sched.map_or(at, |s| s.min(at)));
            }
        }
    }

    fn qp_timers(qps: &mut [Option<Box<Qp>>], qpns: QpnRange, qpn: u32) -> Option<&mut QpTimers> {
        let i = qpn_slot(qpns, qpn)?;
        qps.get_mut(i)?.as_deref_mut().map(|qp| &mut qp.timers)
    }

    /// Input: the driver saw the link go down (`up = false`) or come back. Raises `PortErr` / `PortActive` and counts
    /// `link_downed` (rxe semantics). QPs are not touched: their retransmit timers recover or expire as usual.
    pub fn handle_link_change(&mut self, up: bool) {
        let event_type = if up {
            AsyncEventType::PortActive
        } else {
            self.stats.link_downed += 1;
            AsyncEventType::PortErr
        };
        self.events.push_back(AsyncEvent {
            event_type,
            qpn: None,
            cq: None,
            srq: None,
        });
    }

    /// Processes every timer due at `now` (ACK timeouts → go-back-N or RETRY_EXC_ERR, RNR waits → retransmit,
    /// shaper waits → the QP becomes runnable).
    pub fn handle_timeout(&mut self, now: Instant) {
        self.sched.observe(now);
        while let Some((at, q, _, _)) = self.timers.peek() {
            if at > now {
                break;
            }
            let qt = Self::qp_timers(&mut self.qps, self.qpns, q);
            let Settle::Fire(kind) = self.timers.settle(qt, now, true) else {
                continue;
            };
            let Some(i) = qpn_slot(self.qpns, q) else {
                continue;
            };
            match kind {
                TimerKind::AckTimeout => self.on_ack_timeout(i, now),
                TimerKind::RnrRetry => self.on_rnr_timer(i),
                TimerKind::Shaper => {
                    self.sched.unpark(i);
                    self.sync_credit_lost(i);
                    self.kick(i);
                }
                TimerKind::RateTimer => {
                    if let Some(qp) = self.qps[i].as_deref_mut() {
                        qp.rate.on_timer(now);
                    }
                    self.arm_rate_timer(i);
                    self.apply_rate(i, now);
                    self.kick(i);
                }
                TimerKind::CnpPacing => self.on_cnp_window_end(i, now),
            }
        }
    }

    /// Keeps the QP's `RateTimer` in line with `RateController::next_timer`.
    pub(crate) fn arm_rate_timer(&mut self, i: usize) {
        let Some(qp) = self.qps.get_mut(i).and_then(Option::as_deref_mut) else {
            return;
        };
        match qp.rate.next_timer() {
            Some(t) => {
                let qpn = qp.qpn.value();
                self.timers
                    .set(&mut qp.timers, qpn, TimerKind::RateTimer, t);
            }
            None => Timers::cancel(&mut qp.timers, TimerKind::RateTimer),
        }
    }

    /// Writes at most one frame into `buf` and returns its metadata, or `None` if nothing is ready now.
    ///
    /// The scheduler (`crate::sched`, `DCQCN.md §9`) decides: control frames (CNP, ACK/NAK/ATOMIC ACK) first, then
    /// READ responses, then requests by deficit-weighted round robin across traffic classes and round robin over the
    /// QPs of a class — queues and bit masks, never a scan over all QPs. A QP whose shaper does not conform is parked
    /// on its `Shaper` timer; a class or port bucket that does not conform shows in
    /// [`poll_timeout`](Self::poll_timeout). If `buf` is too small for the next frame nothing is consumed (no PSN,
    /// no state change) and `None` is returned; `tx_refused` counts it (S05).
    #[must_use]
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<TxMeta> {
        self.transmit(now, buf, &mut [])
    }

    /// [`poll_transmit`](Self::poll_transmit) for a link that gathers (`sendmsg` iovecs, multi-buffer rings): a
    /// requester data packet whose payload is at least [`GATHER_MIN`] bytes of registered memory with a contiguous
    /// mapping ([`MrMemory::base_ptr`](crate::MrMemory::base_ptr)) is **not copied**. `buf` then holds the headers
    /// (`..head`) followed by pad + ICRC (`head..head + tail`), computed over the MR bytes in place, and `segs[..n]`
    /// the payload pieces (one per SGE piece), as [`TxMeta::gather`] says; the frame on the wire is
    /// `buf[..head] ++ segs ++ buf[head..head + tail]`, `TxMeta::len` bytes in all, and `buf` is still long enough
    /// to hold it linearised. Other frames (ACKs, READ responses, inline or short payloads, more pieces than
    /// `segs` has room for) are written whole into `buf` as by `poll_transmit` (`gather` = `None`).
    ///
    /// # Pointer validity
    ///
    /// The pieces point into MR memory. They stay readable until the next call on this engine that writes MR
    /// memory (`handle_frame`, `post_recv` does not) or deregisters (a WR's MRs cannot be deregistered before it
    /// completes): a link must send or linearise them within the driver's progress step that produced them, before
    /// feeding the engine received frames. Go-back-N reads the MR again, so a retransmission never depends on
    /// bytes a link kept.
    #[must_use]
    pub fn poll_transmit_gather(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        segs: &mut [TxSeg],
    ) -> Option<TxMeta> {
        self.transmit(now, buf, segs)
    }

    /// Payload bytes copied in user space by the engine so far, and payload bytes handed to a link for gathering.
    pub fn payload_copies(&self) -> PayloadCopies {
        PayloadCopies {
            read_from_mr: self.mrs.bytes_read.get(),
            written_to_mr: self.mrs.bytes_written,
            gathered: self.tx_gathered,
        }
    }

    fn transmit(&mut self, now: Instant, buf: &mut [u8], segs: &mut [TxSeg]) -> Option<TxMeta> {
        self.sched.observe(now);
        while let Some(pick) = self.sched.next(now) {
            let (i, r) = match pick {
                Pick::Park(i, at) => {
                    if let Some(qp) = self.qps.get_mut(i).and_then(Option::as_deref_mut) {
                        let qpn = qp.qpn.value();
                        self.timers.set(&mut qp.timers, qpn, TimerKind::Shaper, at);
                    }
                    self.sync_credit_lost(i);
                    continue;
                }
                Pick::Ctrl(i) => (i, self.emit_control(i, now, buf)),
                Pick::Read(i) => (i, self.emit_read_response(i, now, buf)),
                Pick::Data(i) => (i, self.emit_data(i, now, buf, segs)),
            };
            match r {
                Ok(Some(meta)) => {
                    self.sched.sent(now, pick, meta.len);
                    if let (Pick::Data(_), TxKind::Data) = (pick, meta.kind) {
                        self.rtt_sent(i, now);
                    }
                    if !matches!(pick, Pick::Ctrl(_))
                        && let Some(qp) = self.qps[i].as_deref_mut()
                    {
                        // TB7: the controller counts the bytes the shaper released.
                        qp.rate.on_tx(now, meta.len);
                        self.arm_rate_timer(i);
                        self.apply_rate(i, now);
                    }
                    self.kick(i);
                    self.sched.settle(i, false);
                    self.sync_credit_lost(i);
                    self.account_tx(i, &meta);
                    return Some(meta);
                }
                // Nothing to send for this QP now (it is queued again when it has work).
                // A request that waits for the PSN window or a fence keeps the QP backlogged: its packets wait, and
                // credit its bucket cannot hold meanwhile is lost (`sched`, "credit lost while backlogged").
                Ok(None) => {
                    let waiting = matches!(pick, Pick::Data(_))
                        && self.qps[i].as_deref().is_some_and(Self::has_request_work);
                    self.sched.settle(i, waiting);
                    self.sync_credit_lost(i);
                }
                Err(()) => {
                    // Buffer too small: the QP goes back to the front of its queue, nothing consumed.
                    self.stats.tx_refused += 1;
                    if let Some(qp) = self.qps[i].as_deref_mut() {
                        qp.counters.tx_refused += 1;
                    }
                    self.sched.unpop(pick);
                    return None;
                }
            }
        }
        None
    }

    /// After a first transmission of QP `i`: if it was an RC SEND/WRITE packet that asked for an ACK, its ACK closes
    /// an RTT sample (`sched::batch`; READ/atomic requests are left out: their answer carries data or waits for the
    /// responder's memory operation).
    fn rtt_sent(&mut self, i: usize, now: Instant) {
        let Some(qp) = self.qps[i].as_deref() else {
            return;
        };
        let last = qp.sq.cur.wrapping_sub(u32::from(qp.req.cur_pkt == 0));
        let rd = qp.sq.wqe(last).op.is_read_or_atomic();
        if qp.qp_type == QpType::Rc && qp.req.since_ackreq == 0 && !rd {
            self.sched.rtt_sent(i, qp.req.next_psn, now);
        }
    }

    /// The smoothed round-trip time the engine measured on its RC QPs (RFC 6298 smoothing; `SchedConfig::base_rtt`
    /// until the first sample). It sizes the batching window ([`drain_quota`](Self::drain_quota),
    /// [`tx_burst`](Self::tx_burst)).
    pub fn srtt(&self) -> core::time::Duration {
        self.sched.srtt()
    }

    /// The dynamic batching window for a driver's doorbell drain (issue #12, `DCQCN.md §10`): how many of the
    /// `pending` WQEs waiting in QP `qpn`'s ring to post now — one window of the QP's rate × SRTT (the line rate for an
    /// unshaped QP; at most the bucket depth for a shaped one) in WQEs of the QP's average size, less the WQEs the engine already holds unsent for it, at most the free
    /// send-queue slots and `SchedConfig::batch.max_wqes_per_round`; at least one while the QP has nothing unsent.
    /// An unknown QPN gets `pending`.
    pub fn drain_quota(&self, qpn: Qpn, pending: u32) -> u32 {
        let Some(i) = self.qidx(qpn) else {
            return pending;
        };
        let Some(qp) = self.qps[i].as_deref() else {
            return pending;
        };
        let unsent = qp.sq.tail.wrapping_sub(qp.sq.cur);
        let free = qp.sq.cap - qp.sq.len();
        self.sched.drain_quota(i, pending, unsent, free)
    }

    /// Frames a driver should produce per I/O call (one `flush`) now: a quarter of the SRTT at the port's rate, in
    /// frames of the average size sent, `1..=SchedConfig::batch.max_frames_per_io` (`DCQCN.md §10`: a batch never
    /// hides a CNP or an ACK from the engine for long).
    pub fn tx_burst(&self) -> usize {
        self.sched.tx_burst()
    }

    /// How long a driver may hold posted work back to send it in one I/O call with the posts that follow it (doorbell
    /// batching): `SRTT / SchedConfig::batch.rtt_fraction` (a quarter of the smoothed RTT by default) — the span
    /// [`tx_burst`](Self::tx_burst) gives one batch on the wire, so that batching never hides an ACK or a CNP from
    /// the peer for longer than that (`DCQCN.md §10`).
    pub fn batch_window(&self) -> core::time::Duration {
        self.sched.batch_window()
    }

    /// Brings `shaper_credit_lost_bytes` of QP `i` (and the port's sum) and `port_shaper_credit_lost_bytes` up to
    /// the scheduler's buckets (`crate::sched`, "credit lost while backlogged"). O(1).
    fn sync_credit_lost(&mut self, i: usize) {
        let port = self.sched.port_bucket().credit_lost_bytes();
        self.stats.port_shaper_credit_lost_bytes = port;
        let lost = self
            .sched
            .qp(i)
            .map_or(0, |s| s.bucket().credit_lost_bytes());
        if let Some(qp) = self.qps.get_mut(i).and_then(Option::as_deref_mut) {
            let d = lost.saturating_sub(qp.counters.shaper_credit_lost_bytes);
            qp.counters.shaper_credit_lost_bytes += d;
            self.stats.shaper_credit_lost_bytes += d;
        }
    }

    fn account_tx(&mut self, i: usize, meta: &TxMeta) {
        self.stats.sent_pkts += 1;
        self.stats.sent_bytes += meta.len as u64;
        if meta.kind == TxKind::Retransmit {
            self.stats.retransmitted_pkts += 1;
        }
        if meta.kind == TxKind::Cnp {
            self.stats.np_cnp_sent += 1;
        }
        if let Some(qp) = self.qps[i].as_deref_mut() {
            let c = &mut qp.counters;
            c.sent_pkts += 1;
            c.sent_bytes += meta.len as u64;
            if meta.kind == TxKind::Retransmit {
                c.retransmitted_pkts += 1;
            }
            if meta.kind == TxKind::Cnp {
                c.np_cnp_sent += 1;
            }
        }
    }

    /// Puts the QP on the scheduling queues it has work for (each at most once; a parked QP waits for its
    /// `Shaper` timer).
    pub(crate) fn kick(&mut self, i: usize) {
        let Some(qp) = self.qps[i].as_deref() else {
            return;
        };
        let front = qp.resp.out.front();
        if qp.resp.cnp_pending
            || qp.resp.fatal_nak.is_some()
            || front.is_some_and(|it| it.is_control())
        {
            self.sched.push_ctrl(i);
        }
        if front.is_some_and(|it| !it.is_control()) {
            self.sched.push_read(i);
        }
        if Self::has_request_work(qp) {
            self.sched.push_data(i);
        }
    }

    fn has_request_work(qp: &Qp) -> bool {
        qp.can_send() && !qp.req.rnr_wait && qp.sq.cur != qp.sq.tail
    }

    // ----------------------------------------------------------------------------------------------- completion

    /// Pushes a completion. On overrun (IBTA Vol 1 §11.4.2.1: a completion that finds the CQ full puts the CQ in
    /// error, an affiliated asynchronous error) the completion is lost and counted in `cq_overflow`; the first
    /// overrun marks the CQ, raises one `CqErr` and moves every QP that completes into this CQ to the error state
    /// (their outstanding WRs flush — into the overrun CQ, so they are counted as lost too — and each raises
    /// `QpFatal`), so a program waiting on them learns of it instead of waiting forever. The QP scan runs once per
    /// CQ, on this error path only.
    pub(crate) fn push_wc(&mut self, cq: CqHandle, wc: Wc) {
        let mut ok = false;
        let mut first_overrun = false;
        if let Some(c) = self.cq_mut(cq) {
            ok = c.push(wc);
            if !ok && !c.overrun {
                c.overrun = true;
                first_overrun = true;
            }
            if ok && !c.ready {
                c.ready = true;
                self.cq_ready.push_back(cq.0 - 1);
            }
        }
        if !ok {
            self.stats.cq_overflow += 1;
        }
        if first_overrun {
            self.events.push_back(AsyncEvent {
                event_type: AsyncEventType::CqErr,
                qpn: None,
                cq: Some(cq),
                srq: None,
            });
            for i in 0..self.qps.len() {
                let uses = self.qps[i].as_deref().is_some_and(|qp| {
                    (qp.send_cq == cq || qp.recv_cq == cq)
                        && !matches!(qp.state, QpState::Err | QpState::Reset)
                });
                if uses {
                    self.enter_error(i);
                }
            }
        }
    }

    /// Moves a QP to ERR: flushes SQ and RQ with WR_FLUSH_ERR, cancels timers, raises `QpFatal`.
    pub(crate) fn enter_error(&mut self, i: usize) {
        self.move_to_error(i, true);
    }

    /// Moves QP slot `i` to ERR (flushes, timers cancelled; `QpLastWqeReached` for a QP on an SRQ); `fatal` also
    /// raises `QpFatal` (an error the QP met, as opposed to the consumer's `modify_qp` to ERR).
    fn move_to_error(&mut self, i: usize, fatal: bool) {
        let Some(qp) = self.qps[i].as_deref_mut() else {
            return;
        };
        qp.state = QpState::Err;
        for k in TimerKind::ALL {
            Timers::cancel(&mut qp.timers, k);
        }
        qp.resp.cnp_owed = false;
        qp.req.rnr_wait = false;
        self.sched.unpark(i);
        let qpn = qp.qpn;
        let on_srq = qp.srq.is_some();
        if fatal {
            self.events.push_back(AsyncEvent {
                event_type: AsyncEventType::QpFatal,
                qpn: Some(qpn),
                cq: None,
                srq: None,
            });
        }
        if on_srq {
            // The QP takes no more WQEs from its SRQ (`ibv_get_async_event(3)`; rxe `flush_recv_queue`).
            self.events.push_back(AsyncEvent {
                event_type: AsyncEventType::QpLastWqeReached,
                qpn: Some(qpn),
                cq: None,
                srq: None,
            });
        }
        // Responder resources and pending responses are dropped — unless the responder itself failed: then the
        // responses queued for earlier requests still go out ahead of its final NAK (`responder_fatal`).
        if let Some(qp) = self.qps[i].as_deref_mut() {
            for res in qp.resp.res.iter_mut() {
                res.valid = false;
            }
            if qp.resp.fatal_nak.is_none() {
                qp.resp.out.clear();
            }
            qp.resp.msg = InMsg::None;
        }
        self.flush_sq(i);
        self.flush_rq(i);
        self.kick(i);
    }

    /// Completes every remaining send WQE with WR_FLUSH_ERR (signaled or not).
    pub(crate) fn flush_sq(&mut self, i: usize) {
        loop {
            let Some(qp) = self.qps[i].as_deref_mut() else {
                return;
            };
            if qp.sq.head == qp.sq.tail {
                qp.sq.cur = qp.sq.tail;
                qp.req.rd_atomic_out = 0;
                return;
            }
            let h = qp.sq.head;
            self.retire_send(i, h, WcStatus::WrFlushErr);
        }
    }

    /// Completes every remaining receive WQE with WR_FLUSH_ERR.
    pub(crate) fn flush_rq(&mut self, i: usize) {
        loop {
            let Some(qp) = self.qps[i].as_deref_mut() else {
                return;
            };
            if qp.rq.head == qp.rq.tail {
                return;
            }
            let h = qp.rq.head;
            let wc = Wc {
                wr_id: qp.rq.wqe(h).wr_id,
                status: WcStatus::WrFlushErr,
                opcode: WcOpcode::Recv,
                qp_num: qp.qpn,
                ..Wc::default()
            };
            let cq = qp.recv_cq;
            self.retire_recv(i);
            self.push_wc(cq, wc);
        }
    }

    /// Pops the RQ head, releasing its leases.
    pub(crate) fn retire_recv(&mut self, i: usize) {
        let Engine { qps, mrs, .. } = self;
        let Some(qp) = qps[i].as_deref_mut() else {
            return;
        };
        let h = qp.rq.head;
        for s in qp.rq.segs(h) {
            mrs.release(s.mr.slot);
        }
        qp.rq.head = h.wrapping_add(1);
    }

    /// Retires the SQ head WQE `h` with `status`: releases leases, generates a completion if signaled or failed.
    pub(crate) fn retire_send(&mut self, i: usize, h: u32, status: WcStatus) {
        let Engine { qps, mrs, .. } = self;
        let Some(qp) = qps[i].as_deref_mut() else {
            return;
        };
        debug_assert_eq!(h, qp.sq.head);
        let w = *qp.sq.wqe(h);
        for s in qp.sq.segs(h) {
            mrs.release(s.mr.slot);
        }
        // Was the WQE already passed by the segmentation cursor (counted in rd_atomic_out)?
        let passed = qp.sq.cur != h;
        qp.sq.head = h.wrapping_add(1);
        if qp.sq.cur.wrapping_sub(qp.sq.head) > qp.sq.tail.wrapping_sub(qp.sq.head) {
            // cur was behind head (retired while not yet started): move it along.
            qp.sq.cur = qp.sq.head;
            qp.req.cur_pkt = 0;
        }
        if passed && w.op.is_read_or_atomic() {
            qp.req.rd_atomic_out = qp.req.rd_atomic_out.saturating_sub(1);
        }
        if status != WcStatus::Success && status != WcStatus::WrFlushErr {
            qp.counters.send_err += 1;
            self.stats.send_err += 1;
        }
        // rxe `rdma_sends`: a SEND WQE retired by the completer (rxe_comp.c `do_complete`), flushes aside.
        if status != WcStatus::WrFlushErr
            && matches!(
                w.op,
                SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. }
            )
        {
            qp.counters.rdma_sends += 1;
            self.stats.rdma_sends += 1;
        }
        if w.signaled || status != WcStatus::Success {
            let byte_len = match w.op {
                SendOp::RdmaRead { .. } => w.rcvd as u32,
                _ => w.len.min(u64::from(u32::MAX)) as u32,
            };
            let wc = Wc {
                wr_id: w.wr_id,
                status,
                opcode: w.op.wc_opcode(),
                byte_len: if status == WcStatus::Success {
                    byte_len
                } else {
                    0
                },
                qp_num: qp.qpn,
                ..Wc::default()
            };
            let cq = qp.send_cq;
            self.push_wc(cq, wc);
        }
    }
}
