//! The requester (send module): WQE → packets (segmentation, PSN assignment, window and `max_rd_atomic` limits,
//! fence), and the completer: ACK/NAK/READ response/ATOMIC ACK handling, go-back-N, local ACK timeout, RNR waits.
//! Rules: `ROCEV2.md §4` (rxe `rxe_req.c`, `rxe_comp.c`).

use core::time::Duration;

use crate::Psn;
use crate::engine::{Engine, TxKind, TxMeta};
use crate::qp::Qp;
use crate::time::Instant;
use crate::timer::{TimerKind, Timers};
use crate::verbs::{QpState, QpType, SendFlags, SendOp, WcStatus};
use crate::wire::{self, Ext, RxPkt, TxClass, TxHdr, op};

/// Local ACK timeout for the `timeout` attribute: 4.096 µs · 2^timeout; `None` for 0 (infinite) (`ROCEV2.md §4.2`).
pub fn local_ack_timeout(timeout: u8) -> Option<Duration> {
    if timeout == 0 {
        None
    } else {
        Some(Duration::from_nanos(4096u64 << timeout.min(31)))
    }
}

/// Packets a message of `len` bytes needs at path MTU `pmtu` (`ROCEV2.md §4.1`: zero-length = one packet).
pub fn packets_for(len: u64, pmtu: u32) -> u32 {
    len.div_ceil(u64::from(pmtu))
        .max(1)
        .min(u64::from(u32::MAX)) as u32
}

/// Bytes `off..off + out.len()` of the SGE list gathered into `out` (one copy, MR → `out`). Errors: the memory of
/// a piece faulted ([`MemoryFault`](crate::MemoryFault)).
pub(crate) fn gather(
    mrs: &crate::mr::MrTable,
    segs: &[crate::qp::Seg],
    mut off: u64,
    out: &mut [u8],
) -> Result<(), crate::MemoryFault> {
    let mut done = 0usize;
    for s in segs {
        let l = u64::from(s.len);
        if off >= l {
            off -= l;
            continue;
        }
        let take = ((l - off) as usize).min(out.len() - done);
        // Straight into the frame buffer: the only copy of the payload on transmit.
        mrs.read(
            crate::mr::MrRef {
                slot: s.mr.slot,
                offset: s.mr.offset + off as usize,
            },
            &mut out[done..done + take],
        )?;
        done += take;
        off = 0;
        if done == out.len() {
            break;
        }
    }
    Ok(())
}

/// Calls `f` with each (MR reference, length) piece of the SGE list bytes `off..off + len`.
fn pieces_of(
    segs: &[crate::qp::Seg],
    mut off: u64,
    len: usize,
    mut f: impl FnMut(crate::mr::MrRef, usize),
) {
    let mut done = 0usize;
    for s in segs {
        if done == len {
            break;
        }
        let l = u64::from(s.len);
        if off >= l {
            off -= l;
            continue;
        }
        let take = ((l - off) as usize).min(len - done);
        f(
            crate::mr::MrRef {
                slot: s.mr.slot,
                offset: s.mr.offset + off as usize,
            },
            take,
        );
        done += take;
        off = 0;
    }
}

/// The SGE list bytes `off..off + len` as link-gatherable pieces in `out`: their count, or `None` (copy instead)
/// if a piece's memory has no contiguous mapping or `out` is too short.
fn gather_segs(
    mrs: &crate::mr::MrTable,
    segs: &[crate::qp::Seg],
    off: u64,
    len: usize,
    out: &mut [crate::engine::TxSeg],
) -> Option<usize> {
    let mut n = 0usize;
    let mut ok = true;
    let mut total = 0usize;
    pieces_of(segs, off, len, |r, take| {
        if !ok {
            return;
        }
        match (mrs.ptr(r, take), out.get_mut(n)) {
            (Some(ptr), Some(slot)) => {
                *slot = crate::engine::TxSeg { ptr, len: take };
                n += 1;
                total += take;
            }
            _ => ok = false,
        }
    });
    (ok && total == len).then_some(n)
}

/// Scatters `data` into the SGEs starting `off` bytes into the list. Errors: the memory of a piece faulted
/// ([`MemoryFault`](crate::MemoryFault)); pieces before it were written.
pub(crate) fn scatter(
    mrs: &mut crate::mr::MrTable,
    segs: &[crate::qp::Seg],
    mut off: u64,
    data: &[u8],
) -> Result<(), crate::MemoryFault> {
    let mut done = 0usize;
    for s in segs {
        let l = u64::from(s.len);
        if off >= l {
            off -= l;
            continue;
        }
        let take = ((l - off) as usize).min(data.len() - done);
        mrs.write(
            crate::mr::MrRef {
                slot: s.mr.slot,
                offset: s.mr.offset + off as usize,
            },
            &data[done..done + take],
        )?;
        done += take;
        off = 0;
        if done == data.len() {
            break;
        }
    }
    Ok(())
}

enum Step {
    /// Emit a packet of the current WQE.
    Packet,
    /// The WQE at the head failed locally: complete it with this status and move to ERR.
    LocalError(WcStatus),
    /// The WQE at the head is a local operation (bind MW, local invalidate): execute it (`crate::mw`).
    LocalOp,
    /// Nothing to do now.
    Wait,
}

impl Engine {
    /// Decides what the requester does next on QP `qp` (no side effects).
    fn next_step(qp: &Qp, max_unacked: u32) -> Step {
        if !qp.can_send() || qp.req.rnr_wait || qp.sq.cur == qp.sq.tail {
            return Step::Wait;
        }
        let w = qp.sq.wqe(qp.sq.cur);
        // A WQE that failed locally (at post, or when its memory faulted while its packets were built, possibly
        // after some were sent) sends nothing more.
        if let Some(e) = w.local_err {
            // Report in SQ order: only once everything before it completed.
            return if qp.sq.head == qp.sq.cur {
                Step::LocalError(e)
            } else {
                Step::Wait
            };
        }
        if !w.started && qp.state == QpState::Sqd {
            return Step::Wait;
        }
        if w.op.is_local() {
            // In SQ order: once every WQE before it has completed (so a window's key changes only after the work
            // posted before the bind or invalidate is done, and completions stay in order).
            return if qp.sq.head == qp.sq.cur {
                Step::LocalOp
            } else {
                Step::Wait
            };
        }
        if qp.req.cur_pkt == 0 {
            // Fence (IBTA, `ROCEV2.md §4.5`): wait for prior READ/atomic WRs to complete.
            if w.flags.contains(SendFlags::FENCE) && qp.req.rd_atomic_out > 0 {
                return Step::Wait;
            }
            if w.op.is_read_or_atomic()
                && qp.req.rd_atomic_out >= u32::from(qp.attr.max_rd_atomic.max(1))
            {
                return Step::Wait;
            }
        }
        if qp.qp_type == QpType::Rc && qp.req.next_psn.diff(qp.req.una_psn) >= max_unacked as i32 {
            return Step::Wait;
        }
        Step::Packet
    }

    /// Emits the requester's next packet for QP index `i` (READ responses have their own scheduling tier,
    /// `emit_read_response`). `Err(())`: `buf` too small, nothing consumed.
    pub(crate) fn emit_data(
        &mut self,
        i: usize,
        now: Instant,
        buf: &mut [u8],
        segs: &mut [crate::engine::TxSeg],
    ) -> Result<Option<TxMeta>, ()> {
        loop {
            let Some(qp) = self.qps[i].as_deref() else {
                return Ok(None);
            };
            return match Self::next_step(qp, self.cfg.max_unacked_psns) {
                Step::Wait => Ok(None),
                Step::LocalError(status) => {
                    let h = qp.sq.head;
                    self.retire_send(i, h, status);
                    self.enter_error(i);
                    Ok(None)
                }
                Step::LocalOp => {
                    // No packet: execute it and go on to the next WQE.
                    self.exec_local_op(i);
                    continue;
                }
                Step::Packet => self.emit_request(i, now, buf, segs),
            };
        }
    }

    fn emit_request(
        &mut self,
        i: usize,
        now: Instant,
        buf: &mut [u8],
        segs: &mut [crate::engine::TxSeg],
    ) -> Result<Option<TxMeta>, ()> {
        let Engine {
            qps,
            mrs,
            ahs,
            cfg,
            tx_gathered,
            stats,
            ..
        } = self;
        let Some(qp) = qps[i].as_deref_mut() else {
            return Ok(None);
        };
        let cur = qp.sq.cur;
        let w = *qp.sq.wqe(cur);
        let pmtu = qp.pmtu();
        let rc = qp.qp_type == QpType::Rc;
        let base = match qp.qp_type {
            QpType::Rc => 0x00,
            QpType::Uc => 0x20,
            QpType::Ud => 0x00,
        };
        let psn = if w.started || qp.req.cur_pkt > 0 {
            // Resuming (go-back-N) or continuing: PSN follows from the WQE's first PSN.
            match w.op {
                SendOp::RdmaRead { .. } => w.first_psn + (w.rcvd / u64::from(pmtu)) as u32,
                _ => w.first_psn + qp.req.cur_pkt,
            }
        } else {
            qp.req.next_psn
        };
        let npsn = match w.op {
            SendOp::AtomicCmpAndSwp { .. } | SendOp::AtomicFetchAndAdd { .. } => 1,
            _ => packets_for(w.len, pmtu),
        };
        let mut ext = Ext::default();
        let mut hdr = TxHdr {
            class: TxClass::Data,
            opcode: 0,
            se: false,
            ack_req: false,
            psn,
            dest_qp: None,
        };
        let (offset, plen, last_pkt) = match w.op {
            SendOp::RdmaRead { remote_addr, rkey } => {
                hdr.opcode = op::RDMA_READ_REQUEST;
                hdr.ack_req = true;
                ext.reth = Some((
                    remote_addr.wrapping_add(w.rcvd),
                    rkey.0,
                    (w.len - w.rcvd) as u32,
                ));
                (0, 0, true)
            }
            SendOp::AtomicCmpAndSwp {
                remote_addr,
                rkey,
                compare,
                swap,
            } => {
                hdr.opcode = op::COMPARE_SWAP;
                hdr.ack_req = true;
                ext.atomic = Some((remote_addr, rkey.0, swap, compare));
                (0, 0, true)
            }
            SendOp::AtomicFetchAndAdd {
                remote_addr,
                rkey,
                add,
            } => {
                hdr.opcode = op::FETCH_ADD;
                hdr.ack_req = true;
                ext.atomic = Some((remote_addr, rkey.0, add, 0));
                (0, 0, true)
            }
            _ => {
                let k = qp.req.cur_pkt;
                let offset = u64::from(k) * u64::from(pmtu);
                let plen = (w.len - offset.min(w.len)).min(u64::from(pmtu)) as usize;
                let first = k == 0;
                let last = k + 1 >= npsn;
                let pos = match (first, last) {
                    (true, true) => 3,   // ONLY
                    (true, false) => 0,  // FIRST
                    (false, false) => 1, // MIDDLE
                    (false, true) => 2,  // LAST
                };
                let (opc, reth, imm, inv) = match w.op {
                    SendOp::Send => (
                        [
                            op::SEND_FIRST,
                            op::SEND_MIDDLE,
                            op::SEND_LAST,
                            op::SEND_ONLY,
                        ][pos],
                        false,
                        None,
                        None,
                    ),
                    SendOp::SendWithImm { imm } => (
                        [
                            op::SEND_FIRST,
                            op::SEND_MIDDLE,
                            op::SEND_LAST_IMM,
                            op::SEND_ONLY_IMM,
                        ][pos],
                        false,
                        Some(imm),
                        None,
                    ),
                    SendOp::SendWithInv { invalidate_rkey } => (
                        [
                            op::SEND_FIRST,
                            op::SEND_MIDDLE,
                            op::SEND_LAST_INV,
                            op::SEND_ONLY_INV,
                        ][pos],
                        false,
                        None,
                        Some(invalidate_rkey.0),
                    ),
                    SendOp::RdmaWrite { .. } => (
                        [
                            op::WRITE_FIRST,
                            op::WRITE_MIDDLE,
                            op::WRITE_LAST,
                            op::WRITE_ONLY,
                        ][pos],
                        true,
                        None,
                        None,
                    ),
                    SendOp::RdmaWriteWithImm { imm, .. } => (
                        [
                            op::WRITE_FIRST,
                            op::WRITE_MIDDLE,
                            op::WRITE_LAST_IMM,
                            op::WRITE_ONLY_IMM,
                        ][pos],
                        true,
                        Some(imm),
                        None,
                    ),
                    // One packet: its 8 bytes are the WQE's own (`w.len` is 8).
                    SendOp::AtomicWrite { .. } => (op::ATOMIC_WRITE, true, None, None),
                    _ => unreachable_op(),
                };
                hdr.opcode = base | opc;
                if let (
                    true,
                    SendOp::RdmaWrite { remote_addr, rkey }
                    | SendOp::RdmaWriteWithImm {
                        remote_addr, rkey, ..
                    }
                    | SendOp::AtomicWrite {
                        remote_addr, rkey, ..
                    },
                ) = (reth && (pos == 0 || pos == 3), w.op)
                {
                    ext.reth = Some((remote_addr, rkey.0, w.len as u32));
                }
                if last {
                    ext.imm = imm;
                    ext.ieth = inv;
                    hdr.se = w.flags.contains(SendFlags::SOLICITED)
                        && matches!(
                            w.op,
                            SendOp::Send
                                | SendOp::SendWithImm { .. }
                                | SendOp::SendWithInv { .. }
                                | SendOp::RdmaWriteWithImm { .. }
                        );
                }
                if qp.qp_type == QpType::Ud {
                    hdr.opcode = if imm.is_some() {
                        op::UD_SEND_ONLY_IMM
                    } else {
                        op::UD_SEND_ONLY
                    };
                    if let Some(d) = w.ud {
                        hdr.dest_qp = Some(d.remote_qpn);
                        let qkey = if d.remote_qkey & 0x8000_0000 != 0 {
                            qp.attr.qkey
                        } else {
                            d.remote_qkey
                        };
                        ext.deth = Some((qkey, qp.qpn));
                    }
                }
                // AckReq on the last packet of every message and at least every `ack_req_every` packets (rxe).
                hdr.ack_req = rc && (last || qp.req.since_ackreq + 1 >= cfg.ack_req_every);
                (offset, plen, last)
            }
        };
        let tmpl = match w.ud {
            Some(d) if qp.qp_type == QpType::Ud => match ahs.get((d.ah.0 as usize).wrapping_sub(1))
            {
                Some(Some((_, _, t))) => t,
                _ => return Ok(None),
            },
            _ => match qp.tmpl.as_ref() {
                Some(t) => t,
                None => return Ok(None),
            },
        };
        // UD packets leave with the QP's own source port.
        let sport = qp.tmpl.as_ref().map_or(tmpl.sport, |t| t.sport);
        // `emit` checks the buffer length before writing anything: too short = nothing consumed.
        let inline = w.inline;
        let sq = &qp.sq;
        // Zero copy where the caller's link gathers: the payload pieces stay in MR memory.
        let value = match w.op {
            SendOp::AtomicWrite { value, .. } => Some(value),
            _ => None,
        };
        let nsegs = if inline || value.is_some() || plen < crate::engine::GATHER_MIN {
            None
        } else {
            gather_segs(mrs, sq.segs(cur), offset, plen, segs)
        };
        // The payload's memory faulted (the application unmapped or protected it): nothing is sent.
        let mut fault = false;
        let (len, gathered) = match nsegs {
            Some(n) => {
                let pieces = &segs[..n];
                let hash = |h: &mut crc32fast::Hasher| {
                    pieces_of(sq.segs(cur), offset, plen, |r, take| {
                        if !fault && mrs.crc32_update(r, take, h).is_err() {
                            fault = true;
                        }
                    });
                };
                let Some((head, tail, len)) =
                    wire::emit_gather(buf, tmpl, sport, &hdr, &ext, plen, hash)
                else {
                    return Err(());
                };
                let g = crate::engine::TxGather {
                    head,
                    segs: pieces.len(),
                    tail,
                };
                (len, Some(g))
            }
            None => {
                let written = wire::emit(buf, tmpl, sport, &hdr, &ext, plen, |out| {
                    if let Some(v) = value {
                        out.copy_from_slice(&v[..out.len()]);
                    } else if inline {
                        let src = sq.inline_bytes(cur);
                        let o = offset as usize;
                        out.copy_from_slice(&src[o..o + out.len()]);
                    } else {
                        fault = gather(mrs, sq.segs(cur), offset, out).is_err();
                    }
                });
                let Some(len) = written else { return Err(()) };
                (len, None)
            }
        };
        if fault {
            // As a gather whose SGE fails its check: the WR completes LOC_PROT_ERR in SQ order and the QP goes to
            // ERR (rxe `rxe_req.c`: a failed copy from the MR → IB_WC_LOC_PROT_ERR, `req_error`). Packets of it
            // already sent are not taken back.
            qp.sq.wqe_mut(cur).local_err = Some(WcStatus::LocProtErr);
            qp.counters.mr_access_faults += 1;
            stats.mr_access_faults += 1;
            return self.emit_data(i, now, buf, segs);
        }
        if gathered.is_some() {
            *tx_gathered += plen as u64;
        }
        // Commit state only now that the frame is written.
        let (meta_dscp, meta_ecn) = tmpl.marks(TxClass::Data, cfg.cnp_dscp);
        let w = qp.sq.wqe_mut(cur);
        if !w.started {
            w.started = true;
            w.first_psn = psn;
            w.npsn = npsn;
        }
        let is_rd = w.op.is_read_or_atomic();
        let next = if is_rd { w.first_psn + npsn } else { psn + 1 };
        qp.req.next_psn = next;
        let retransmit = next.diff(qp.req.high_psn) <= 0;
        if !retransmit {
            qp.req.high_psn = next;
        }
        qp.req.since_ackreq = if hdr.ack_req {
            0
        } else {
            qp.req.since_ackreq + 1
        };
        if last_pkt {
            qp.sq.cur = cur.wrapping_add(1);
            qp.req.cur_pkt = 0;
            if is_rd {
                qp.req.rd_atomic_out += 1;
            }
        } else {
            qp.req.cur_pkt += 1;
        }
        let qpn = qp.qpn;
        if let (true, None, Some(d)) = (
            rc,
            qp.timers.get(TimerKind::AckTimeout),
            local_ack_timeout(qp.attr.timeout),
        ) {
            self.timers
                .set(&mut qp.timers, qpn.value(), TimerKind::AckTimeout, now + d);
        }
        let ty = qp.qp_type;
        if last_pkt && ty != QpType::Rc {
            // UC/UD: the WR is complete once its last packet is on the wire.
            self.retire_send(i, cur, WcStatus::Success);
        }
        Ok(Some(TxMeta {
            len,
            qpn,
            dscp: meta_dscp,
            ecn: meta_ecn,
            prio: 0,
            kind: if retransmit {
                TxKind::Retransmit
            } else {
                TxKind::Data
            },
            gather: gathered,
        }))
    }

    // ------------------------------------------------------------------------------------------ completer

    /// Handles an ACK / NAK / READ response / ATOMIC ACK for the requester of QP index `i` (`ROCEV2.md §4.4`).
    pub(crate) fn on_response(&mut self, i: usize, pkt: &RxPkt<'_>, now: Instant) {
        let Some(qp) = self.qps[i].as_deref_mut() else {
            return;
        };
        if qp.qp_type != QpType::Rc || !matches!(qp.state, QpState::Rts | QpState::Sqd) {
            self.stats.drop_bad_opcode += 1;
            qp.counters.drop_bad_opcode += 1;
            return;
        }
        let p = pkt.psn;
        // Valid responses refer to the outstanding window [una, high): everything ever sent and not yet
        // acknowledged. After a go-back-N rewind `next_psn` is behind `high_psn`, and a response in between
        // acknowledges packets the responder did receive before the rewind (IBTA; rxe `rxe_comp.c` check_psn compares
        // with the WQE's PSNs, not with the rewound send pointer).
        if p.diff(qp.req.una_psn) < 0 {
            // A duplicate response (the responder re-ACKs every duplicate request, often una−1, and answers a
            // re-requested READ whose original responses arrived meanwhile): harmless and ignored (`ROCEV2.md §4.4`; rxe `check_psn`: older
            // PSN → done), but counted, so that a requester busy with them is visible.
            self.stats.duplicate_response += 1;
            qp.counters.duplicate_response += 1;
            return;
        }
        if p.diff(qp.req.high_psn) >= 0 {
            // Beyond anything ever sent: a ghost response.
            self.stats.drop_stale_response += 1;
            qp.counters.drop_stale_response += 1;
            return;
        }
        match pkt.opcode {
            op::ACKNOWLEDGE => {
                let Some((syndrome, _msn)) = pkt.ext.aeth else {
                    return;
                };
                match syndrome >> 5 {
                    0b00 => {
                        self.ack_through(i, p, now, true);
                    }
                    0b01 => self.on_rnr_nak(i, p, syndrome & 0x1F, now),
                    0b11 => {
                        let code = syndrome & 0x1F;
                        if code == 0 {
                            self.on_seq_nak(i, p, now);
                        } else {
                            let status = match code {
                                1 => WcStatus::RemInvReqErr,
                                2 => WcStatus::RemAccessErr,
                                4 => WcStatus::RemInvRdReqErr,
                                _ => WcStatus::RemOpErr,
                            };
                            match status {
                                WcStatus::RemInvReqErr => {
                                    qp.counters.req_remote_invalid_request += 1;
                                    self.stats.req_remote_invalid_request += 1;
                                }
                                WcStatus::RemAccessErr => {
                                    qp.counters.req_remote_access_errors += 1;
                                    self.stats.req_remote_access_errors += 1;
                                }
                                _ => {}
                            }
                            self.fail_nakked(i, p, status);
                        }
                    }
                    _ => {
                        self.stats.drop_bad_opcode += 1;
                        qp.counters.drop_bad_opcode += 1;
                    }
                }
            }
            op::READ_RESPONSE_FIRST
            | op::READ_RESPONSE_MIDDLE
            | op::READ_RESPONSE_LAST
            | op::READ_RESPONSE_ONLY
            | op::ATOMIC_ACKNOWLEDGE => self.on_rd_response(i, pkt, now),
            _ => {
                self.stats.drop_bad_opcode += 1;
                if let Some(qp) = self.qps[i].as_deref_mut() {
                    qp.counters.drop_bad_opcode += 1;
                }
            }
        }
    }

    /// Error NAK (0x61–0x64) for PSN `p` (`ROCEV2.md §4.4`): the WR containing `p` completes with `status` and the QP
    /// goes to ERR. Everything before `p` was received by the responder: SEND/WRITEs ending before `p` complete
    /// successfully (the NAK acknowledges them); a READ/atomic ending before `p` whose responses never arrived
    /// (lost) cannot complete — the responder has stopped — but it is not what failed: it completes with
    /// WR_FLUSH_ERR, and the error status goes to the WR the NAK names.
    fn fail_nakked(&mut self, i: usize, p: Psn, status: WcStatus) {
        loop {
            let Some(qp) = self.qps[i].as_deref_mut() else {
                return;
            };
            let h = qp.sq.head;
            if h == qp.sq.tail {
                break;
            }
            let w = *qp.sq.wqe(h);
            if !w.started || p.diff(w.last_psn()) <= 0 {
                break;
            }
            let st = if w.op.is_read_or_atomic() {
                WcStatus::WrFlushErr
            } else {
                WcStatus::Success
            };
            self.retire_send(i, h, st);
        }
        self.fail_head(i, status);
    }

    /// Coalesced ACK through PSN `n` (`ROCEV2.md §4.4`): retire every SEND/WRITE whose last PSN ≤ n; an unanswered
    /// READ/atomic at or before `n` means its responses were lost (implied NAK).
    pub(crate) fn ack_through(
        &mut self,
        i: usize,
        n: Psn,
        now: Instant,
        explicit: bool,
    ) -> Option<Psn> {
        // `blocked`: resume PSN of an unanswered READ/atomic that `n` covers — its responses were lost.
        let mut blocked = None;
        loop {
            let qp = self.qps[i].as_deref_mut()?;
            let h = qp.sq.head;
            if h == qp.sq.tail {
                break;
            }
            let w = *qp.sq.wqe(h);
            if !w.started {
                break;
            }
            if w.op.is_read_or_atomic() {
                if n.diff(w.first_psn) >= 0 {
                    blocked = Some(w.first_psn + (w.rcvd / u64::from(qp.pmtu())) as u32);
                }
                break;
            }
            if w.last_psn().diff(n) <= 0 {
                self.retire_send(i, h, WcStatus::Success);
            } else {
                break;
            }
        }
        let qp = self.qps[i].as_deref_mut()?;
        // Never move the restart point past an unanswered READ/atomic.
        let una = blocked.unwrap_or(n + 1);
        if una.diff(qp.req.una_psn) > 0 {
            qp.req.una_psn = una;
            self.catch_up(i);
            self.progress(i, now);
        }
        if let (true, Some(resume)) = (explicit, blocked) {
            // Implied NAK (`ROCEV2.md §4.4`).
            let Some(qp) = self.qps[i].as_deref_mut() else {
                return blocked;
            };
            if !qp.req.retrying {
                qp.counters.implied_nak_seq_err += 1;
                self.stats.implied_nak_seq_err += 1;
                self.retry(i, resume, now);
                if let Some(qp) = self.qps[i].as_deref_mut() {
                    qp.req.retrying = true;
                }
            }
        }
        self.check_drained(i);
        self.kick(i);
        blocked
    }

    /// After a go-back-N rewind the responder may acknowledge packets beyond the rewound send pointer (it received
    /// them before the rewind): when `una_psn` passes `next_psn`, the send pointer jumps forward to `una_psn`, so
    /// nothing acknowledged is sent again and no PSN is reused.
    fn catch_up(&mut self, i: usize) {
        let Some(qp) = self.qps[i].as_deref() else {
            return;
        };
        if qp.req.una_psn.diff(qp.req.next_psn) > 0 {
            let una = qp.req.una_psn;
            self.go_back(i, una);
        }
    }

    /// Forward progress: reload retry counters and restart (or stop) the local ACK timer.
    fn progress(&mut self, i: usize, now: Instant) {
        let Some(qp) = self.qps[i].as_deref_mut() else {
            return;
        };
        self.sched.rtt_acked(i, qp.req.una_psn, now);
        qp.req.retry_left = qp.attr.retry_cnt;
        qp.req.rnr_left = qp.attr.rnr_retry;
        qp.req.retrying = false;
        let qpn = qp.qpn.value();
        if qp.req.una_psn != qp.req.next_psn || qp.sq.head != qp.sq.cur {
            match local_ack_timeout(qp.attr.timeout) {
                Some(d) => self
                    .timers
                    .set(&mut qp.timers, qpn, TimerKind::AckTimeout, now + d),
                None => Timers::cancel(&mut qp.timers, TimerKind::AckTimeout),
            }
        } else {
            Timers::cancel(&mut qp.timers, TimerKind::AckTimeout);
        }
    }

    fn on_seq_nak(&mut self, i: usize, p: Psn, now: Instant) {
        let Some(qp) = self.qps[i].as_deref_mut() else {
            return;
        };
        qp.counters.rcvd_seq_err += 1;
        qp.counters.packet_seq_err += 1;
        self.stats.rcvd_seq_err += 1;
        self.stats.packet_seq_err += 1;
        if qp.req.rnr_wait {
            return;
        }
        let mut from = p;
        if p.diff(qp.req.una_psn) > 0 {
            // The NAK acknowledges everything before `p`; progress ends a retry in progress.
            from = self.ack_through(i, p - 1, now, false).unwrap_or(p);
        }
        // One retry at a time: while one is in progress (no progress since it started) further NAKs — the other
        // losses of the same burst, or NAKs beyond an unanswered READ/atomic that blocks the acknowledgement — do not
        // start another; only a timeout does (`ROCEV2.md §4.4`; rxe `comp.started_retry`). Otherwise one lossy burst
        // spends the whole `retry_cnt` budget at once.
        if self.qps[i].as_deref().is_none_or(|q| q.req.retrying) {
            return;
        }
        self.retry(i, from, now);
        if let Some(qp) = self.qps[i].as_deref_mut() {
            qp.req.retrying = true;
        }
    }

    fn on_rnr_nak(&mut self, i: usize, p: Psn, code: u8, now: Instant) {
        if self.qps[i]
            .as_deref()
            .is_some_and(|q| p.diff(q.req.una_psn) > 0)
        {
            self.ack_through(i, p - 1, now, false);
        }
        let Some(qp) = self.qps[i].as_deref_mut() else {
            return;
        };
        qp.counters.rcvd_rnr_err += 1;
        self.stats.rcvd_rnr_err += 1;
        if qp.req.rnr_wait {
            return;
        }
        if qp.attr.rnr_retry != 7 {
            if qp.req.rnr_left == 0 {
                qp.counters.retry_rnr_exceeded_err += 1;
                self.stats.retry_rnr_exceeded_err += 1;
                self.fail_head(i, WcStatus::RnrRetryExcErr);
                return;
            }
            qp.req.rnr_left -= 1;
        }
        // Wait exactly the advertised RNR time, then go back to the NAKed PSN (S04, S19: no busy loop).
        qp.req.rnr_wait = true;
        Timers::cancel(&mut qp.timers, TimerKind::AckTimeout);
        let qpn = qp.qpn.value();
        let wait = wire::rnr_timer(code);
        self.timers
            .set(&mut qp.timers, qpn, TimerKind::RnrRetry, now + wait);
    }

    pub(crate) fn on_rnr_timer(&mut self, i: usize) {
        let Some(qp) = self.qps[i].as_deref_mut() else {
            return;
        };
        if !qp.req.rnr_wait {
            return;
        }
        qp.req.rnr_wait = false;
        let una = qp.req.una_psn;
        self.go_back(i, una);
    }

    pub(crate) fn on_ack_timeout(&mut self, i: usize, now: Instant) {
        let Some(qp) = self.qps[i].as_deref_mut() else {
            return;
        };
        if !matches!(qp.state, QpState::Rts | QpState::Sqd) || qp.req.rnr_wait {
            return;
        }
        if qp.req.una_psn == qp.req.next_psn && qp.sq.head == qp.sq.cur {
            return;
        }
        qp.counters.local_ack_timeout_err += 1;
        self.stats.local_ack_timeout_err += 1;
        let una = qp.req.una_psn;
        self.retry(i, una, now);
    }

    /// One transport retry from `psn` (timeout, sequence NAK, implied NAK), or RETRY_EXC_ERR when the budget is
    /// spent. IBTA semantics: `retry_cnt` 7 is a count of 7 retries, not infinite (rxe differs, `ROCEV2.md §7`).
    fn retry(&mut self, i: usize, psn: Psn, now: Instant) {
        let Some(qp) = self.qps[i].as_deref_mut() else {
            return;
        };
        if qp.req.retry_left == 0 {
            qp.counters.retry_exceeded_err += 1;
            self.stats.retry_exceeded_err += 1;
            self.fail_head(i, WcStatus::RetryExcErr);
            return;
        }
        qp.req.retry_left -= 1;
        qp.counters.completer_retry_err += 1;
        self.stats.completer_retry_err += 1;
        let qpn = qp.qpn.value();
        if let Some(d) = local_ack_timeout(qp.attr.timeout) {
            self.timers
                .set(&mut qp.timers, qpn, TimerKind::AckTimeout, now + d);
        }
        self.go_back(i, psn);
    }

    /// Go-back-N: the next packet sent is `psn`; the SQ is walked again from the WQE that contains it (partially
    /// acknowledged SEND/WRITE resume with MIDDLE/LAST, partially received READs re-request the remainder).
    fn go_back(&mut self, i: usize, psn: Psn) {
        // Karn's rule: no RTT sample across a retransmission.
        self.sched.rtt_cancel(i);
        let Some(qp) = self.qps[i].as_deref_mut() else {
            return;
        };
        let pmtu = qp.pmtu();
        let mut idx = qp.sq.head;
        let mut found = false;
        while idx != qp.sq.tail {
            let w = qp.sq.wqe(idx);
            if !w.started {
                break;
            }
            if psn.diff(w.first_psn) >= 0 && psn.diff(w.first_psn + w.npsn) < 0 {
                found = true;
                break;
            }
            idx = idx.wrapping_add(1);
        }
        let mut rd = 0;
        let mut k = qp.sq.head;
        while k != idx {
            if qp.sq.wqe(k).op.is_read_or_atomic() {
                rd += 1;
            }
            k = k.wrapping_add(1);
        }
        qp.req.rd_atomic_out = rd;
        qp.sq.cur = idx;
        qp.req.since_ackreq = 0;
        if found {
            let w = *qp.sq.wqe(idx);
            if w.op.is_read_or_atomic() {
                qp.req.cur_pkt = 0;
                qp.req.next_psn = w.first_psn + (w.rcvd / u64::from(pmtu)) as u32;
            } else {
                qp.req.cur_pkt = psn.diff(w.first_psn) as u32;
                qp.req.next_psn = psn;
            }
        } else {
            qp.req.cur_pkt = 0;
            qp.req.next_psn = psn;
        }
        self.kick(i);
    }

    /// Completes the head WQE with `status` and moves the QP to ERR (remaining WRs flush).
    fn fail_head(&mut self, i: usize, status: WcStatus) {
        let Some(qp) = self.qps[i].as_deref_mut() else {
            return;
        };
        if qp.sq.head != qp.sq.tail {
            let h = qp.sq.head;
            self.retire_send(i, h, status);
        }
        self.enter_error(i);
    }

    /// READ response or ATOMIC ACK with PSN `p` (`ROCEV2.md §4.4`): it first acknowledges every earlier SEND/WRITE;
    /// then it must belong to the READ/atomic at the head of the SQ. A response beyond an unanswered READ/atomic
    /// means that one's responses were lost (implied NAK → retry from its resume PSN).
    fn on_rd_response(&mut self, i: usize, pkt: &RxPkt<'_>, now: Instant) {
        let p = pkt.psn;
        let is_atomic_ack = pkt.opcode == op::ATOMIC_ACKNOWLEDGE;
        // Retire SEND/WRITEs that end before `p` (coalesced acknowledgement, with progress).
        if self.qps[i]
            .as_deref()
            .is_some_and(|qp| p.diff(qp.req.una_psn) > 0)
        {
            self.ack_through(i, p - 1, now, false);
        }
        let Engine {
            qps, mrs, stats, ..
        } = self;
        let Some(qp) = qps[i].as_deref_mut() else {
            return;
        };
        let h = qp.sq.head;
        let pmtu = qp.pmtu();
        if h == qp.sq.tail || !qp.sq.wqe(h).started {
            stats.drop_stale_response += 1;
            qp.counters.drop_stale_response += 1;
            return;
        }
        let w = *qp.sq.wqe(h);
        if !w.op.is_read_or_atomic() {
            // A response inside a SEND/WRITE's PSN range: the responder is confused.
            self.fail_head(i, WcStatus::BadRespErr);
            return;
        }
        let resume = w.first_psn + (w.rcvd / u64::from(pmtu)) as u32;
        if p.diff(resume) < 0 {
            stats.drop_stale_response += 1;
            qp.counters.drop_stale_response += 1;
            return;
        }
        if p.diff(w.last_psn()) > 0 || p.diff(resume) > 0 {
            // Responses of this READ/atomic were lost. One retry at a time: later out-of-order responses of the
            // same burst are dropped until the retried responses arrive.
            if qp.req.retrying {
                stats.drop_stale_response += 1;
                qp.counters.drop_stale_response += 1;
                return;
            }
            stats.implied_nak_seq_err += 1;
            qp.counters.implied_nak_seq_err += 1;
            self.retry(i, resume, now);
            if let Some(qp) = self.qps[i].as_deref_mut() {
                qp.req.retrying = true;
            }
            return;
        }
        // p == resume: the response we wait for.
        if is_atomic_ack != w.op.is_atomic() {
            self.fail_head(i, WcStatus::BadRespErr);
            return;
        }
        if is_atomic_ack {
            let Some(orig) = pkt.ext.atomic_ack else {
                self.fail_head(i, WcStatus::BadRespErr);
                return;
            };
            // The original value lands in the local 8-byte buffer in little-endian order (the host order of the
            // x86/ARM machines this runs on, as a hardware RNIC writes it).
            if scatter(mrs, qp.sq.segs(h), 0, &orig.to_le_bytes()).is_err() {
                // The local target's memory faulted (unmapped or protected by the application): rxe `do_atomic`
                // → IB_WC_LOC_PROT_ERR, QP to ERR.
                qp.counters.mr_access_faults += 1;
                stats.mr_access_faults += 1;
                self.fail_head(i, WcStatus::LocProtErr);
                return;
            }
            let wm = qp.sq.wqe_mut(h);
            wm.rcvd = 8;
            wm.resp_done = true;
            qp.req.una_psn = p + 1;
            self.retire_send(i, h, WcStatus::Success);
            self.catch_up(i);
        } else {
            let remaining = w.len - w.rcvd;
            let plen = pkt.payload.len() as u64;
            let is_last = matches!(pkt.opcode, op::READ_RESPONSE_LAST | op::READ_RESPONSE_ONLY);
            let len_ok = if is_last {
                plen == remaining
            } else {
                plen == u64::from(pmtu) && remaining > plen
            };
            if !len_ok {
                self.fail_head(i, WcStatus::BadRespErr);
                return;
            }
            if scatter(mrs, qp.sq.segs(h), w.rcvd, pkt.payload).is_err() {
                // The READ target's memory faulted: rxe `do_read` → IB_WC_LOC_PROT_ERR, QP to ERR (mlx5 reports
                // the same local protection error for a READ into memory it cannot translate).
                qp.counters.mr_access_faults += 1;
                stats.mr_access_faults += 1;
                self.fail_head(i, WcStatus::LocProtErr);
                return;
            }
            let wm = qp.sq.wqe_mut(h);
            wm.rcvd += plen;
            qp.req.una_psn = p + 1;
            if is_last {
                wm.resp_done = true;
                self.retire_send(i, h, WcStatus::Success);
            }
            self.catch_up(i);
        }
        self.progress(i, now);
        self.check_drained(i);
        self.kick(i);
    }

    /// SQD: raise `SqDrained` once nothing is outstanding (if requested).
    pub(crate) fn check_drained(&mut self, i: usize) {
        let Some(qp) = self.qps[i].as_deref_mut() else {
            return;
        };
        if qp.state == QpState::Sqd
            && !qp.sqd_notified
            && qp.req.cur_pkt == 0
            && qp.sq.head == qp.sq.cur
            && qp.req.una_psn == qp.req.next_psn
        {
            qp.sqd_notified = true;
            if qp.attr.en_sqd_async_notify {
                self.events.push_back(crate::verbs::AsyncEvent {
                    event_type: crate::verbs::AsyncEventType::SqDrained,
                    qpn: Some(qp.qpn),
                    cq: None,
                    srq: None,
                });
            }
        }
    }
}

#[cold]
fn unreachable_op() -> (u8, bool, Option<u32>, Option<u32>) {
    // READ/atomics are handled before; keep a harmless value instead of panicking.
    (op::SEND_ONLY, false, None, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeout_and_segment_math() {
        assert_eq!(local_ack_timeout(0), None);
        assert_eq!(
            local_ack_timeout(14),
            Some(Duration::from_nanos(4096 << 14))
        );
        assert_eq!(local_ack_timeout(14).unwrap().as_micros(), 67_108);
        assert_eq!(packets_for(0, 1024), 1);
        assert_eq!(packets_for(1024, 1024), 1);
        assert_eq!(packets_for(1025, 1024), 2);
        assert_eq!(packets_for(612, 256), 3);
        assert_eq!(packets_for(1 << 31, 4096), 1 << 19);
    }
}
