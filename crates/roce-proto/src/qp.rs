//! QP context: send queue (WQE ring preallocated at create time), receive queue, requester hot state, responder
//! state, timers and counters. The protocol logic lives in `requester.rs` / `responder.rs` (`impl Engine`).

use core::fmt;

use crate::cc::RateController;
use crate::mr::MrRef;
use crate::stats::Counters;
use crate::time::Instant;
use crate::timer::{QpTimers, TimerKind};
use crate::verbs::{
    CqHandle, PdHandle, QpAttr, QpCap, QpState, QpType, Rkey, SendFlags, SendOp, UdDest, WcStatus,
};
use crate::wire::TxTemplate;
use crate::{Psn, Qpn};

/// A send WQE slot. SGEs and inline bytes live in the queue's flat preallocated arrays.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SendWqe {
    pub(crate) wr_id: u64,
    pub(crate) op: SendOp,
    pub(crate) flags: SendFlags,
    pub(crate) signaled: bool,
    /// Message length in bytes.
    pub(crate) len: u64,
    pub(crate) nsge: u16,
    /// Payload is in the inline area (captured at post time).
    pub(crate) inline: bool,
    pub(crate) ud: Option<UdDest>,
    /// Local error detected at post time, reported when the requester reaches the WQE (V3).
    pub(crate) local_err: Option<WcStatus>,
    /// PSN of the first packet (assigned when the WQE is first started).
    pub(crate) first_psn: Psn,
    /// PSNs the WQE occupies (packets; for READ the response packets).
    pub(crate) npsn: u32,
    pub(crate) started: bool,
    /// READ: bytes placed so far; atomic: 8 once the ATOMIC ACK arrived.
    pub(crate) rcvd: u64,
    /// READ/atomic: all responses received.
    pub(crate) resp_done: bool,
}

impl SendWqe {
    pub(crate) const EMPTY: SendWqe = SendWqe {
        wr_id: 0,
        op: SendOp::Send,
        flags: SendFlags::EMPTY,
        signaled: false,
        len: 0,
        nsge: 0,
        inline: false,
        ud: None,
        local_err: None,
        first_psn: Psn::new(0),
        npsn: 0,
        started: false,
        rcvd: 0,
        resp_done: false,
    };

    /// PSN of the last packet.
    pub(crate) fn last_psn(&self) -> Psn {
        self.first_psn + self.npsn.saturating_sub(1)
    }
}

/// A resolved SGE: a checked MR reference and a length.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Seg {
    pub(crate) mr: MrRef,
    pub(crate) len: u32,
}

pub(crate) const NO_SEG: Seg = Seg {
    mr: MrRef {
        slot: u32::MAX,
        offset: 0,
    },
    len: 0,
};

/// Send queue: a ring of `cap` WQEs with free-running indices `head ≤ cur ≤ tail`.
#[derive(Debug)]
pub(crate) struct SendQueue {
    pub(crate) wqes: Vec<SendWqe>,
    pub(crate) segs: Vec<Seg>,
    pub(crate) inline: Vec<u8>,
    pub(crate) cap: u32,
    pub(crate) max_sge: u32,
    pub(crate) max_inline: u32,
    /// Oldest WQE not yet completed.
    pub(crate) head: u32,
    /// WQE the requester is segmenting (or next to start).
    pub(crate) cur: u32,
    /// Next free slot.
    pub(crate) tail: u32,
}

impl SendQueue {
    pub(crate) fn new(cap: u32, max_sge: u32, max_inline: u32) -> Self {
        SendQueue {
            wqes: vec![SendWqe::EMPTY; cap as usize],
            segs: vec![NO_SEG; (cap * max_sge.max(1)) as usize],
            inline: vec![0; (cap * max_inline) as usize],
            cap,
            max_sge: max_sge.max(1),
            max_inline,
            head: 0,
            cur: 0,
            tail: 0,
        }
    }
    pub(crate) fn slot(&self, idx: u32) -> usize {
        (idx % self.cap) as usize
    }
    pub(crate) fn wqe(&self, idx: u32) -> &SendWqe {
        &self.wqes[self.slot(idx)]
    }
    pub(crate) fn wqe_mut(&mut self, idx: u32) -> &mut SendWqe {
        let s = self.slot(idx);
        &mut self.wqes[s]
    }
    pub(crate) fn segs(&self, idx: u32) -> &[Seg] {
        let s = self.slot(idx) * self.max_sge as usize;
        let n = self.wqe(idx).nsge as usize;
        &self.segs[s..s + n]
    }
    pub(crate) fn inline_bytes(&self, idx: u32) -> &[u8] {
        let s = self.slot(idx) * self.max_inline as usize;
        let n = self.wqe(idx).len as usize;
        &self.inline[s..s + n.min(self.max_inline as usize)]
    }
    pub(crate) fn len(&self) -> u32 {
        self.tail.wrapping_sub(self.head)
    }
}

/// A receive WQE slot.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RecvWqe {
    pub(crate) wr_id: u64,
    pub(crate) nsge: u16,
    pub(crate) len: u64,
    /// An SGE failed the lkey/bounds/LOCAL_WRITE check at post time.
    pub(crate) bad: bool,
}

#[derive(Debug)]
pub(crate) struct RecvQueue {
    pub(crate) wqes: Vec<RecvWqe>,
    pub(crate) segs: Vec<Seg>,
    pub(crate) cap: u32,
    pub(crate) max_sge: u32,
    pub(crate) head: u32,
    pub(crate) tail: u32,
}

impl RecvQueue {
    pub(crate) fn new(cap: u32, max_sge: u32) -> Self {
        RecvQueue {
            wqes: vec![
                RecvWqe {
                    wr_id: 0,
                    nsge: 0,
                    len: 0,
                    bad: false
                };
                cap.max(1) as usize
            ],
            segs: vec![NO_SEG; (cap.max(1) * max_sge.max(1)) as usize],
            cap: cap.max(1),
            max_sge: max_sge.max(1),
            head: 0,
            tail: 0,
        }
    }
    pub(crate) fn slot(&self, idx: u32) -> usize {
        (idx % self.cap) as usize
    }
    pub(crate) fn len(&self) -> u32 {
        self.tail.wrapping_sub(self.head)
    }

    /// Appends a receive WQE for `wr` (the caller checked room and the SGE count): each SGE is checked against the
    /// MR table (PD `pd`, LOCAL_WRITE) and leases its MR; a WQE with a bad SGE is kept, marked `bad`, and fails when
    /// a message consumes it (IBTA Vol 1 §10.8.3.1: the error is reported with the completion). Shared by a QP's
    /// receive queue and an SRQ.
    pub(crate) fn push(
        &mut self,
        wr: &crate::verbs::RecvWr<'_>,
        pd: PdHandle,
        mrs: &mut crate::mr::MrTable,
    ) {
        let idx = self.tail;
        let slot = self.slot(idx);
        let base = slot * self.max_sge as usize;
        let mut w = RecvWqe {
            wr_id: wr.wr_id,
            nsge: 0,
            len: 0,
            bad: false,
        };
        for sge in wr.sg_list {
            match mrs.check_local(
                sge.lkey,
                pd,
                sge.addr,
                u64::from(sge.length),
                crate::verbs::AccessFlags::LOCAL_WRITE,
            ) {
                Ok(r) => {
                    mrs.lease(r.slot);
                    self.segs[base + w.nsge as usize] = Seg {
                        mr: r,
                        len: sge.length,
                    };
                    w.nsge += 1;
                    w.len += u64::from(sge.length);
                }
                Err(_) => w.bad = true,
            }
        }
        self.wqes[slot] = w;
        self.tail = idx.wrapping_add(1);
    }
    pub(crate) fn wqe(&self, idx: u32) -> &RecvWqe {
        &self.wqes[self.slot(idx)]
    }
    pub(crate) fn segs(&self, idx: u32) -> &[Seg] {
        let s = self.slot(idx) * self.max_sge as usize;
        &self.segs[s..s + self.wqe(idx).nsge as usize]
    }
}

/// Requester hot state: one cache line (STYLE §10 ⑤; rxe `rxe_req_info`/`rxe_comp_info`).
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReqCtx {
    /// PSN of the next new packet (`req_psn`).
    pub(crate) next_psn: Psn,
    /// Oldest unacknowledged PSN (`comp_psn`), the go-back-N restart point.
    pub(crate) una_psn: Psn,
    /// One past the highest PSN ever transmitted (tells retransmissions from first transmissions).
    pub(crate) high_psn: Psn,
    /// Packets of the current WQE already emitted in this pass.
    pub(crate) cur_pkt: u32,
    /// READ/atomic WQEs started and not completed.
    pub(crate) rd_atomic_out: u32,
    /// Packets since the last AckReq.
    pub(crate) since_ackreq: u32,
    /// Remaining transport retries / RNR retries (reloaded on progress).
    pub(crate) retry_left: u8,
    pub(crate) rnr_left: u8,
    /// Waiting for the RNR timer: send nothing.
    pub(crate) rnr_wait: bool,
    /// A NAK/implied-NAK retry is in progress: further NAKs and out-of-order responses do not start another one
    /// until progress is made (only a timeout does, rxe `rxe_comp.c`).
    pub(crate) retrying: bool,
}

impl ReqCtx {
    /// The state of a new QP, and of one moved to RESET (IBTA 10.3.1; rxe `rxe_qp_reset`): nothing of a previous
    /// connection survives. The PSNs are set again by RTR→RTS (`SQ_PSN`), the retry budgets by `RETRY_CNT` /
    /// `RNR_RETRY`.
    pub(crate) const INIT: ReqCtx = ReqCtx {
        next_psn: Psn::new(0),
        una_psn: Psn::new(0),
        high_psn: Psn::new(0),
        cur_pkt: 0,
        rd_atomic_out: 0,
        since_ackreq: 0,
        retry_left: 0,
        rnr_left: 0,
        rnr_wait: false,
        retrying: false,
    };
}

/// What the responder still has to transmit, in PSN order (ACKs must not overtake READ responses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RespItem {
    /// ACK (syndrome 0x1F) or NAK/RNR NAK for `psn`.
    Ack { psn: Psn, syndrome: u8, msn: u32 },
    /// READ response packets from `psn`, `offset` bytes into resource `res`, up to its end. `replay`: answers a
    /// duplicate request (the requester may have completed it already), not counted against its initiator depth.
    Read {
        res: u32,
        psn: Psn,
        offset: u64,
        first: bool,
        replay: bool,
    },
    /// ATOMIC ACKNOWLEDGE; `replay` as for `Read`.
    AtomicAck {
        psn: Psn,
        orig: u64,
        msn: u32,
        replay: bool,
    },
}

impl RespItem {
    pub(crate) fn is_control(&self) -> bool {
        !matches!(self, RespItem::Read { .. })
    }
}

/// A saved READ/atomic request (responder resources, `max_dest_rd_atomic` of them).
///
/// It keeps the request's R_Key and range, never a reference to (or a lease on) the MR: every READ response packet
/// resolves `rkey` again, so the MR can be deregistered once the requester has its data, and a later packet of the
/// stream or a replay for a duplicate naming a deregistered or invalidated R_Key gets NAK remote access error (rxe
/// "RDMA/rxe: Replace mr by rkey in responder resources", 2022; `ROCEV2.md §5`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RdResource {
    pub(crate) valid: bool,
    pub(crate) atomic: bool,
    pub(crate) psn: Psn,
    pub(crate) npsn: u32,
    pub(crate) va: u64,
    pub(crate) rkey: Rkey,
    pub(crate) len: u64,
    pub(crate) orig: u64,
    pub(crate) msn: u32,
}

impl RdResource {
    pub(crate) const EMPTY: RdResource = RdResource {
        valid: false,
        atomic: false,
        psn: Psn::new(0),
        npsn: 0,
        va: 0,
        rkey: Rkey(0),
        len: 0,
        orig: 0,
        msn: 0,
    };
}

/// The message the responder is in the middle of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum InMsg {
    None,
    /// SEND: RQ WQE at `rq.head` claimed; bytes placed so far.
    Send {
        placed: u64,
    },
    /// RDMA WRITE: the RETH's R_Key and VA (each packet resolves them again, like READ responses: see
    /// [`RdResource`]), message length and bytes placed so far.
    Write {
        rkey: Rkey,
        va: u64,
        len: u64,
        placed: u64,
    },
}

/// The QP dump's words for the message in progress: `none`, `SEND placed N`, `RDMA WRITE rkey 0x.. va 0x.. len N
/// placed N` (bytes).
impl fmt::Display for InMsg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            InMsg::None => f.write_str("none"),
            InMsg::Send { placed } => write!(f, "SEND placed {placed}"),
            InMsg::Write {
                rkey,
                va,
                len,
                placed,
            } => write!(
                f,
                "RDMA WRITE rkey {rkey} va {va:#x} len {len} placed {placed}"
            ),
        }
    }
}

#[derive(Debug)]
pub(crate) struct RespCtx {
    pub(crate) epsn: Psn,
    /// PSN of the last SEND/WRITE packet executed (`rq_psn − 1` before the first): what a duplicate SEND/WRITE is
    /// re-acknowledged with, never a later READ/atomic's PSN (`ROCEV2.md §5`; rxe `resp.ack_psn` − 1).
    pub(crate) ack_psn: Psn,
    pub(crate) msn: u32,
    /// A sequence NAK (or RNR NAK) was sent; suppress more until ePSN arrives (rxe `sent_psn_nak`).
    pub(crate) nak_sent: bool,
    pub(crate) msg: InMsg,
    /// UC: the open message's FIRST was dropped for lack of a receive WQE; its MIDDLE/LAST are dropped with it and
    /// counted as `drop_uc_no_recv`, not as a sequence gap.
    pub(crate) uc_no_recv: bool,
    pub(crate) res: Vec<RdResource>,
    pub(crate) res_next: u32,
    pub(crate) out: crate::resp_queue::RespQueue,
    /// A CNP is to be sent (the control tier picks it up).
    pub(crate) cnp_pending: bool,
    /// Start of the QP's current CNP window: when its last CNP was generated (`DCQCN.md` §2.2).
    pub(crate) last_cnp: Option<Instant>,
    /// A CE mark arrived inside the open window: one CNP is owed at its end (`CnpPacing` timer, §2.2 N2).
    pub(crate) cnp_owed: bool,
    /// Where a UD CNP goes (the source QPN of the CE-marked packet and its addresses).
    pub(crate) cnp_dest: Option<crate::wire::PeerAddr>,
    /// The responder moved the QP to ERR; the final NAK is still owed.
    pub(crate) fatal_nak: Option<(Psn, u8)>,
}

impl RespCtx {
    /// A new responder with room for `res_cap` responder resources (sized at RTR by `max_dest_rd_atomic`) and the
    /// responses they can have queued, so the per-packet path never allocates.
    pub(crate) fn new(res_cap: usize) -> RespCtx {
        RespCtx {
            epsn: Psn::new(0),
            ack_psn: Psn::new(0) - 1,
            msn: 0,
            nak_sent: false,
            msg: InMsg::None,
            uc_no_recv: false,
            res: Vec::with_capacity(res_cap),
            res_next: 0,
            out: crate::resp_queue::RespQueue::with_capacity(Self::out_room(res_cap)),
            cnp_pending: false,
            last_cnp: None,
            cnp_owed: false,
            cnp_dest: None,
            fatal_nak: None,
        }
    }

    /// Capacity of the response queue for `res_cap` responder resources: one READ stream or ATOMIC ACK per
    /// resource, an ACK or NAK between each two, and a few more.
    pub(crate) fn out_room(res_cap: usize) -> usize {
        2 * res_cap + 4
    }

    /// Back to the state of [`RespCtx::new`], keeping the allocations: RESET ends the connection, so nothing of it
    /// survives (MSN, ePSN, duplicate-ACK PSN, NAK suppression, open message, saved READ/atomic requests, queued
    /// responses, CNP pacing; IBTA 10.3.1, rxe `rxe_qp_reset`).
    pub(crate) fn reset(&mut self) {
        let res = core::mem::take(&mut self.res);
        let out = core::mem::take(&mut self.out);
        *self = RespCtx {
            res,
            out,
            ..RespCtx::new(0)
        };
        self.res.clear();
        self.out.clear();
    }
}

pub(crate) struct Qp {
    pub(crate) qpn: Qpn,
    pub(crate) qp_type: QpType,
    pub(crate) state: QpState,
    pub(crate) pd: PdHandle,
    pub(crate) send_cq: CqHandle,
    pub(crate) recv_cq: CqHandle,
    pub(crate) sq_sig_all: bool,
    pub(crate) cap: QpCap,
    pub(crate) attr: QpAttr,
    pub(crate) req: ReqCtx,
    pub(crate) sq: SendQueue,
    pub(crate) rq: RecvQueue,
    /// The SRQ the QP takes its receive WQEs from (`crate::srq`); `rq` then holds at most the one taken.
    pub(crate) srq: Option<crate::verbs::SrqHandle>,
    pub(crate) resp: RespCtx,
    pub(crate) timers: QpTimers,
    pub(crate) counters: Counters,
    pub(crate) tmpl: Option<TxTemplate>,
    pub(crate) rate: Box<dyn RateController>,
    pub(crate) sqd_notified: bool,
    pub(crate) comm_est: bool,
}

impl Qp {
    pub(crate) fn pmtu(&self) -> u32 {
        self.attr.path_mtu.bytes()
    }

    /// Whether the requester may send (RTS, or SQD finishing started messages).
    pub(crate) fn can_send(&self) -> bool {
        matches!(self.state, QpState::Rts | QpState::Sqd)
    }

    /// Whether the responder accepts requests.
    pub(crate) fn can_receive(&self) -> bool {
        matches!(
            self.state,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        )
    }
}

impl fmt::Debug for Qp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// The QP dump (`rocev2 stat --qp`, test failure messages), in verbs/IBTA terms: type and state as `ibv_qp_type`
/// and `ibv_qp_state` name them, QPNs and PSNs in hex (as `rocev2 stat` and Wireshark print them).
impl fmt::Display for Qp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = &self.req;
        writeln!(
            f,
            "QP {} {} state={} dest_qp={} pmtu={} timeout={} retry_cnt={} rnr_retry={}",
            self.qpn,
            self.qp_type.name(),
            self.state.name(),
            self.attr.dest_qp_num,
            self.pmtu(),
            self.attr.timeout,
            self.attr.retry_cnt,
            self.attr.rnr_retry
        )?;
        writeln!(
            f,
            "  requester: next_psn={:#x} una_psn={:#x} high_psn={:#x} sq head/cur/tail={}/{}/{} (depth {}) \
             cur_pkt={} rd_atomic_out={}/{} retry_left={} rnr_left={} rnr_wait={}",
            r.next_psn.value(),
            r.una_psn.value(),
            r.high_psn.value(),
            self.sq.head,
            self.sq.cur,
            self.sq.tail,
            self.sq.cap,
            r.cur_pkt,
            r.rd_atomic_out,
            self.attr.max_rd_atomic,
            r.retry_left,
            r.rnr_left,
            r.rnr_wait
        )?;
        writeln!(
            f,
            "  responder: epsn={:#x} msn={} nak_sent={} msg={} rq {}/{} (depth {}) pending_out={} cnp_pending={} \
             cnp_owed={}",
            self.resp.epsn.value(),
            self.resp.msn,
            self.resp.nak_sent,
            self.resp.msg,
            self.rq.head,
            self.rq.tail,
            self.rq.cap,
            self.resp.out.len(),
            self.resp.cnp_pending,
            self.resp.cnp_owed
        )?;
        write!(f, "  timers:")?;
        for k in TimerKind::ALL {
            if let Some(t) = self.timers.get(k) {
                write!(f, " {}@{t}", k.name())?;
            }
        }
        writeln!(f)?;
        match self.rate.rate_bps() {
            Some(r) => writeln!(f, "  rate: {r} bit/s ({:?})", self.rate)?,
            None => writeln!(f, "  rate: line ({:?})", self.rate)?,
        }
        write!(f, "  counters:")?;
        for (n, v) in self.counters.iter().filter(|(_, v)| *v != 0) {
            write!(f, " {n}={v}")?;
        }
        Ok(())
    }
}
