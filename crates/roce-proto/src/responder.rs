//! Receive path: frame filtering (ICRC, QPN, P_Key, peer address, opcode/QP type), the responder (ePSN,
//! duplicates, NAKs, RNR, RDMA WRITE/READ/atomics, receive scatter, UC and UD rules), the notification point (CNP
//! generation) and the reaction-point hook. Rules: `ROCEV2.md §5`, `§6` (rxe `rxe_recv.c`, `rxe_resp.c`).

use crate::Psn;
use crate::engine::{Engine, TxKind, TxMeta};
use crate::qp::{InMsg, RdResource, RespItem};
use crate::time::Instant;
use crate::timer::TimerKind;
use crate::verbs::{
    AccessFlags, AsyncEvent, AsyncEventType, QpState, QpType, Rkey, Wc, WcFlags, WcOpcode, WcStatus,
};
use crate::wire::{self, Ext, ParseError, PeerAddr, RxPkt, TxClass, TxHdr, op};

/// AETH syndromes (`ROCEV2.md §4.3`).
const SYN_ACK: u8 = 0x1F;
const NAK_SEQ: u8 = 0x60;
const NAK_INV_REQ: u8 = 0x61;
const NAK_REM_ACCESS: u8 = 0x62;
const NAK_REM_OP: u8 = 0x63;

/// Largest RETH DMA length accepted (2^31, S06).
const MAX_DMA_LEN: u32 = 1 << 31;

/// Outcome of executing one request packet.
enum Exec {
    /// Executed; ePSN advances by this many PSNs; `msg_end` closes a message (MSN += 1).
    Done { psns: u32, msg_end: bool },
    /// No receive WR: RNR NAK.
    Rnr,
    /// Class A/C error: NAK with this syndrome and move the QP to ERR (receive WR, if any, completes with `wc`).
    Fatal { syndrome: u8, wc: Option<WcStatus> },
    /// Silently dropped (counted by the caller).
    Drop,
}

impl Engine {
    /// Input: one received Ethernet frame. Never panics on any input; malformed, misaddressed or corrupted frames
    /// are dropped and counted (S20). ICRC is verified with the variant fields masked.
    pub fn handle_frame(&mut self, now: Instant, frame: &[u8]) {
        let pkt = match wire::parse(frame) {
            Ok(p) => p,
            Err(ParseError::BadIcrc) => {
                self.stats.rx_icrc_encapsulated += 1;
                return;
            }
            Err(ParseError::Malformed) => {
                self.stats.drop_malformed += 1;
                return;
            }
        };
        // P_Key: one table entry 0xFFFF (full member); match = equal low 15 bits (`ROCEV2.md §2.2`).
        if pkt.pkey & 0x7FFF != 0x7FFF {
            self.stats.drop_pkey_mismatch += 1;
            return;
        }
        // DestQP 0xFFFFFF: a multicast packet, addressed to a group rather than to one of our GIDs (`crate::mcast`).
        if pkt.dest_qp.value() == crate::mcast::MULTICAST_QPN {
            self.on_mcast_frame(now, frame, &pkt);
            return;
        }
        if !self.cfg.gids.contains(&pkt.dst_gid) {
            self.stats.drop_wrong_dest_ip += 1;
            return;
        }
        let Some(i) = self.qidx(pkt.dest_qp) else {
            self.stats.drop_unknown_qp += 1;
            return;
        };
        self.on_qp_frame(i, now, frame, &pkt);
    }

    /// A parsed packet for the QP at table index `i` (unicast: its DestQP; multicast: one attached QP): the QP type,
    /// state and peer filters, counters, the notification point, then the requester or responder.
    pub(crate) fn on_qp_frame(&mut self, i: usize, now: Instant, frame: &[u8], pkt: &RxPkt<'_>) {
        let pkt = *pkt;
        let Some(qp) = self.qps[i].as_deref_mut() else {
            return;
        };
        let class = pkt.opcode >> 5;
        // A CNP (`ROCEV2.md §6`) may reach a QP of any type; it passes the same state and peer checks as any other
        // packet before the reaction point sees it, so no third host can throttle a connection.
        let type_ok = pkt.opcode == op::CNP
            || match qp.qp_type {
                QpType::Rc => class == 0 && op::is_valid_rc(pkt.opcode),
                QpType::Uc => class == 1 && op::is_valid_uc(pkt.opcode),
                QpType::Ud => pkt.opcode == op::UD_SEND_ONLY || pkt.opcode == op::UD_SEND_ONLY_IMM,
            };
        if !type_ok {
            self.stats.drop_bad_opcode += 1;
            qp.counters.drop_bad_opcode += 1;
            return;
        }
        if !qp.can_receive() {
            self.stats.drop_unknown_qp += 1;
            qp.counters.drop_unknown_qp += 1;
            return;
        }
        if qp.qp_type != QpType::Ud {
            let sgid = self
                .cfg
                .gids
                .get(qp.attr.ah_attr.sgid_index as usize)
                .copied();
            if pkt.src_gid != qp.attr.ah_attr.dgid || Some(pkt.dst_gid) != sgid {
                self.stats.drop_wrong_peer += 1;
                qp.counters.drop_wrong_peer += 1;
                return;
            }
        }
        self.stats.rcvd_pkts += 1;
        self.stats.rcvd_bytes += frame.len() as u64;
        qp.counters.rcvd_pkts += 1;
        qp.counters.rcvd_bytes += frame.len() as u64;
        if pkt.opcode == op::CNP {
            self.on_cnp(i, now);
            return;
        }
        if qp.state == QpState::Rtr && !qp.comm_est {
            qp.comm_est = true;
            self.events.push_back(AsyncEvent {
                event_type: AsyncEventType::CommEst,
                qpn: Some(qp.qpn),
                cq: None,
                srq: None,
            });
        }
        // Notification point (`DCQCN.md` §2.2 N1–N3, S18): CE → at most one CNP per QP per `cnp_interval`; ECT-only
        // traffic never triggers one.
        if pkt.ecn == wire::ECN_CE {
            self.stats.np_ecn_marked_roce_packets += 1;
            qp.counters.np_ecn_marked_roce_packets += 1;
            let interval = self.cfg.cnp_interval;
            let window_end = qp.resp.last_cnp.map(|t| t + interval);
            // The flow to notify: the sender of this packet (UD: its DETH source QP). A CNP already waiting to be
            // sent keeps its destination.
            if !qp.resp.cnp_pending {
                let src_qp = match (qp.qp_type, pkt.ext.deth) {
                    (QpType::Ud, Some((_, q))) => q,
                    _ => qp.attr.dest_qp_num,
                };
                qp.resp.cnp_dest = Some(PeerAddr {
                    qpn: src_qp,
                    mac: pkt.src_mac,
                    gid: pkt.src_gid,
                });
            }
            match window_end {
                // N1: no CNP during the last N µs: send one now; a new window starts.
                None => Self::open_cnp_window(qp, now),
                Some(end) if now >= end => {
                    // A mark inside the window that just ended still owes its CNP (its window-end timer has not run
                    // yet at this instant): this CNP is that one too — one per window, never two at once.
                    qp.resp.cnp_owed = false;
                    Self::open_cnp_window(qp, now)
                }
                // N2: inside the open window: one CNP when it ends, however many marks arrive.
                Some(end) => {
                    if !qp.resp.cnp_owed {
                        qp.resp.cnp_owed = true;
                        let qpn = qp.qpn.value();
                        self.timers
                            .set(&mut qp.timers, qpn, TimerKind::CnpPacing, end);
                    }
                }
            }
        }
        if op::is_response(pkt.opcode) {
            self.on_response(i, &pkt, now);
        } else {
            match self.qps[i].as_deref().map(|q| q.qp_type) {
                Some(QpType::Ud) => self.on_ud_request(i, &pkt),
                Some(QpType::Uc) => self.on_uc_request(i, &pkt),
                Some(QpType::Rc) => self.on_rc_request(i, &pkt),
                None => {}
            }
        }
        self.kick(i);
    }

    /// A CNP is generated at `now` and a new CNP window opens (`DCQCN.md` §2.2).
    fn open_cnp_window(qp: &mut crate::qp::Qp, now: Instant) {
        qp.resp.cnp_pending = true;
        qp.resp.last_cnp = Some(now);
    }

    /// `CnpPacing` timer: the QP's CNP window ended with a CE mark inside it, so one CNP goes now and the next
    /// window starts (`DCQCN.md` §2.2 N2: "a marked packet inside an open window produces a CNP exactly at the
    /// window end", §6 E7.2).
    pub(crate) fn on_cnp_window_end(&mut self, i: usize, now: Instant) {
        let Some(qp) = self.qps[i].as_deref_mut() else {
            return;
        };
        if !qp.resp.cnp_owed || !qp.can_receive() {
            qp.resp.cnp_owed = false;
            return;
        }
        qp.resp.cnp_owed = false;
        Self::open_cnp_window(qp, now);
        self.kick(i);
    }

    /// Reaction point: a CNP that passed the receive filters (QP state, connected peer) goes to the QP's rate
    /// controller.
    fn on_cnp(&mut self, i: usize, now: Instant) {
        let Some(qp) = self.qps[i].as_deref_mut() else {
            return;
        };
        // Reaction point (`DCQCN.md` §2.3 R1 / §2.4 M1): the controller cuts or flags; without one the CNP is
        // counted as ignored (mlx5 `rp_cnp_ignored`).
        if qp.rate.on_cnp(now) {
            self.stats.rp_cnp_handled += 1;
            qp.counters.rp_cnp_handled += 1;
        } else {
            self.stats.rp_cnp_ignored += 1;
            qp.counters.rp_cnp_ignored += 1;
        }
        self.sched.observe(now);
        self.arm_rate_timer(i);
        self.apply_rate(i, now);
        self.kick(i);
    }

    /// Queues an ACK for `psn`, coalescing with an ACK already waiting at the back (`ROCEV2.md §5`).
    fn queue_ack(&mut self, i: usize, psn: Psn) {
        let Some(qp) = self.qps[i].as_deref_mut() else {
            return;
        };
        let msn = qp.resp.msn;
        let coalesced = qp.resp.out.update_back(|it| match it {
            RespItem::Ack {
                psn: p,
                syndrome: SYN_ACK,
                msn: m,
            } => {
                *p = psn;
                *m = msn;
                true
            }
            _ => false,
        });
        if coalesced == Some(true) {
            return;
        }
        qp.resp.out.push_back(RespItem::Ack {
            psn,
            syndrome: SYN_ACK,
            msn,
        });
    }

    fn queue_nak(&mut self, i: usize, psn: Psn, syndrome: u8) {
        let Some(qp) = self.qps[i].as_deref_mut() else {
            return;
        };
        let msn = qp.resp.msn;
        qp.resp.out.push_back(RespItem::Ack { psn, syndrome, msn });
    }

    /// Class A/C error: the NAK is owed even though the QP goes to ERR; the receive WR in use (if any) completes
    /// with `wc` first, the rest flush. Responses already queued for earlier requests (READ responses, ACKs, ATOMIC
    /// ACKs) are still sent, before the NAK: responses leave in PSN order, and those requests were executed — so
    /// the requester completes them and fails exactly the WR the NAK names (`ROCEV2.md §4.4`).
    fn responder_fatal(&mut self, i: usize, psn: Psn, syndrome: u8, wc: Option<WcStatus>) {
        let Some(qp) = self.qps[i].as_deref_mut() else {
            return;
        };
        qp.resp.fatal_nak = Some((psn, syndrome));
        qp.counters.resp_nak_sent += 1;
        self.stats.resp_nak_sent += 1;
        if syndrome == NAK_REM_ACCESS {
            qp.counters.resp_remote_access_errors += 1;
            self.stats.resp_remote_access_errors += 1;
        }
        if wc == Some(WcStatus::LocLenErr) {
            qp.counters.resp_local_length_error += 1;
            self.stats.resp_local_length_error += 1;
        }
        let qpn = qp.qpn;
        let ev = if syndrome == NAK_REM_ACCESS {
            AsyncEventType::QpAccessErr
        } else {
            AsyncEventType::QpReqErr
        };
        self.events.push_back(AsyncEvent {
            event_type: ev,
            qpn: Some(qpn),
            cq: None,
            srq: None,
        });
        if let (Some(status), true) = (wc, qp.rq.head != qp.rq.tail) {
            {
                let wc = Wc {
                    wr_id: qp.rq.wqe(qp.rq.head).wr_id,
                    status,
                    opcode: WcOpcode::Recv,
                    qp_num: qpn,
                    ..Wc::default()
                };
                let cq = qp.recv_cq;
                self.retire_recv(i);
                self.push_wc(cq, wc);
            }
        }
        self.enter_error(i);
    }

    fn on_rc_request(&mut self, i: usize, pkt: &RxPkt<'_>) {
        let Some(qp) = self.qps[i].as_deref_mut() else {
            return;
        };
        let p = pkt.psn;
        let d = p.diff(qp.resp.epsn);
        if d > 0 {
            // Sequence error: one NAK per gap (rxe `sent_psn_nak`).
            qp.counters.out_of_seq_request += 1;
            qp.counters.out_of_sequence += 1;
            self.stats.out_of_seq_request += 1;
            self.stats.out_of_sequence += 1;
            if !qp.resp.nak_sent {
                qp.resp.nak_sent = true;
                let e = qp.resp.epsn;
                self.queue_nak(i, e, NAK_SEQ);
            }
            return;
        }
        if d < 0 {
            qp.counters.duplicate_request += 1;
            self.stats.duplicate_request += 1;
            self.on_duplicate(i, pkt);
            return;
        }
        qp.resp.nak_sent = false;
        match self.execute(i, pkt) {
            Exec::Done { psns, msg_end } => {
                let Some(qp) = self.qps[i].as_deref_mut() else {
                    return;
                };
                qp.resp.epsn = p + psns;
                if msg_end {
                    qp.resp.msn = (qp.resp.msn + 1) & 0xFF_FFFF;
                }
                let is_rd = matches!(
                    pkt.opcode,
                    op::RDMA_READ_REQUEST | op::COMPARE_SWAP | op::FETCH_ADD
                );
                if !is_rd {
                    qp.resp.ack_psn = p;
                    if pkt.ack_req {
                        self.queue_ack(i, p);
                    } else {
                        qp.counters.ack_deferred += 1;
                        self.stats.ack_deferred += 1;
                    }
                }
            }
            Exec::Rnr => {
                let Some(qp) = self.qps[i].as_deref_mut() else {
                    return;
                };
                qp.counters.send_rnr_err += 1;
                self.stats.send_rnr_err += 1;
                // Suppress sequence NAKs for the rest of the rejected message until ePSN arrives again.
                qp.resp.nak_sent = true;
                let syn = 0x20 | (qp.attr.min_rnr_timer & 0x1F);
                self.queue_nak(i, p, syn);
            }
            Exec::Fatal { syndrome, wc } => self.responder_fatal(i, p, syndrome, wc),
            Exec::Drop => {}
        }
    }

    /// Duplicate request (`ROCEV2.md §5`): re-ACK SEND/WRITE, replay READ responses from the saved request after
    /// checking the sub-range, resend saved atomic results (never re-execute).
    fn on_duplicate(&mut self, i: usize, pkt: &RxPkt<'_>) {
        let Some(qp) = self.qps[i].as_deref_mut() else {
            return;
        };
        let p = pkt.psn;
        let pmtu = u64::from(qp.pmtu());
        match pkt.opcode {
            op::RDMA_READ_REQUEST => {
                let Some((va, rkey, len)) = pkt.ext.reth else {
                    return;
                };
                let hit = qp.resp.res.iter().position(|r| {
                    r.valid && !r.atomic && p.diff(r.psn) >= 0 && p.diff(r.psn + r.npsn.max(1)) < 0
                });
                let Some(ri) = hit else {
                    self.stats.drop_stale_response += 1;
                    qp.counters.drop_stale_response += 1;
                    return;
                };
                let r = qp.resp.res[ri];
                let skip = p.diff(r.psn) as u64 * pmtu;
                let ok = rkey == r.rkey.0
                    && va == r.va.wrapping_add(skip)
                    && u64::from(len) == r.len - skip.min(r.len);
                if !ok {
                    self.stats.drop_stale_response += 1;
                    qp.counters.drop_stale_response += 1;
                    return;
                }
                supersede_from(&mut qp.resp, p, Some(ri as u32));
                qp.resp.out.push_back(RespItem::Read {
                    res: ri as u32,
                    psn: p,
                    offset: skip,
                    first: true,
                    replay: true,
                });
            }
            op::COMPARE_SWAP | op::FETCH_ADD => {
                let hit = qp
                    .resp
                    .res
                    .iter()
                    .find(|r| r.valid && r.atomic && r.psn == p)
                    .copied();
                if let Some(r) = hit {
                    supersede_from(&mut qp.resp, p, None);
                    qp.resp.out.push_back(RespItem::AtomicAck {
                        psn: p,
                        orig: r.orig,
                        msn: r.msn,
                        replay: true,
                    });
                }
            }
            _ => {
                // SEND/WRITE: ACK the last SEND/WRITE executed, not ePSN−1 (a READ/atomic after it would take that
                // ACK as an implied NAK, `ROCEV2.md §5`).
                let e = qp.resp.ack_psn;
                self.queue_ack(i, e);
            }
        }
    }

    /// Executes an in-sequence RC request packet.
    fn execute(&mut self, i: usize, pkt: &RxPkt<'_>) -> Exec {
        let Engine {
            qps,
            mrs,
            stats,
            srqs,
            events,
            ..
        } = self;
        let Some(qp) = qps[i].as_deref_mut() else {
            return Exec::Drop;
        };
        let pmtu = u64::from(qp.pmtu());
        let plen = pkt.payload.len() as u64;
        let o = pkt.opcode & 0x1F;
        let pos = op::position(o);
        // Opcode sequence (`ROCEV2.md §5`): MIDDLE/LAST continue the open message of the same kind, everything else
        // starts a new one and needs none open.
        let open = qp.resp.msg;
        let seq_ok = match (pos, open) {
            (op::Pos::Middle | op::Pos::Last, InMsg::Send { .. }) => op::is_send(o),
            (op::Pos::Middle | op::Pos::Last, InMsg::Write { .. }) => op::is_write(o),
            (op::Pos::Middle | op::Pos::Last, InMsg::None) => false,
            (_, InMsg::None) => true,
            _ => false,
        };
        if !seq_ok {
            return Exec::Fatal {
                syndrome: NAK_INV_REQ,
                wc: None,
            };
        }
        // Lengths (S06): FIRST/MIDDLE exactly PMTU, LAST 1..=PMTU, ONLY ≤ PMTU.
        let len_ok = match pos {
            op::Pos::First | op::Pos::Middle => plen == pmtu,
            op::Pos::Last => plen >= 1 && plen <= pmtu,
            op::Pos::Only => plen <= pmtu,
        };
        if !len_ok {
            return Exec::Fatal {
                syndrome: NAK_INV_REQ,
                wc: None,
            };
        }
        let access = qp.attr.qp_access_flags;
        match o {
            op::SEND_FIRST
            | op::SEND_MIDDLE
            | op::SEND_LAST
            | op::SEND_LAST_IMM
            | op::SEND_ONLY
            | op::SEND_ONLY_IMM
            | op::SEND_LAST_INV
            | op::SEND_ONLY_INV => {
                let placed = match open {
                    InMsg::Send { placed } => placed,
                    _ => {
                        if !crate::srq::take_recv(qp, srqs, events) {
                            return Exec::Rnr;
                        }
                        0
                    }
                };
                let h = qp.rq.head;
                let rw = *qp.rq.wqe(h);
                if rw.bad {
                    return Exec::Fatal {
                        syndrome: NAK_REM_OP,
                        wc: Some(WcStatus::LocProtErr),
                    };
                }
                if placed + plen > rw.len {
                    return Exec::Fatal {
                        syndrome: NAK_INV_REQ,
                        wc: Some(WcStatus::LocLenErr),
                    };
                }
                if crate::requester::scatter(mrs, qp.rq.segs(h), placed, pkt.payload).is_err() {
                    // The receive buffer's memory faulted (unmapped or protected by the application): as a receive
                    // WQE whose SGE fails its check (`rw.bad` above; rxe `send_data_in` → malformed WQE).
                    qp.counters.mr_access_faults += 1;
                    stats.mr_access_faults += 1;
                    return Exec::Fatal {
                        syndrome: NAK_REM_OP,
                        wc: Some(WcStatus::LocProtErr),
                    };
                }
                let total = placed + plen;
                if matches!(pos, op::Pos::Last | op::Pos::Only) {
                    let mut wc = Wc {
                        wr_id: rw.wr_id,
                        status: WcStatus::Success,
                        opcode: WcOpcode::Recv,
                        byte_len: total as u32,
                        qp_num: qp.qpn,
                        src_qp: qp.attr.dest_qp_num,
                        ..Wc::default()
                    };
                    if let Some(imm) = pkt.ext.imm {
                        wc.imm_data = imm;
                        wc.wc_flags |= WcFlags::WITH_IMM;
                    }
                    if let Some(rkey) = pkt.ext.ieth {
                        if !mrs.invalidate_remote(Rkey(rkey), qp.pd, qp.qpn) {
                            return Exec::Fatal {
                                syndrome: NAK_INV_REQ,
                                wc: Some(WcStatus::LocProtErr),
                            };
                        }
                        wc.invalidated_rkey = Rkey(rkey);
                        wc.wc_flags |= WcFlags::WITH_INV;
                    }
                    qp.resp.msg = InMsg::None;
                    qp.counters.rdma_recvs += 1;
                    stats.rdma_recvs += 1;
                    let cq = qp.recv_cq;
                    self.retire_recv(i);
                    self.push_wc(cq, wc);
                    Exec::Done {
                        psns: 1,
                        msg_end: true,
                    }
                } else {
                    qp.resp.msg = InMsg::Send { placed: total };
                    Exec::Done {
                        psns: 1,
                        msg_end: false,
                    }
                }
            }
            op::WRITE_FIRST
            | op::WRITE_MIDDLE
            | op::WRITE_LAST
            | op::WRITE_LAST_IMM
            | op::WRITE_ONLY
            | op::WRITE_ONLY_IMM => {
                let with_imm = matches!(o, op::WRITE_LAST_IMM | op::WRITE_ONLY_IMM);
                if with_imm && !crate::srq::take_recv(qp, srqs, events) {
                    return Exec::Rnr;
                }
                let (rkey, va, len, placed) = match open {
                    InMsg::Write {
                        rkey,
                        va,
                        len,
                        placed,
                    } => (rkey, va, len, placed),
                    _ => {
                        let Some((va, rkey, dlen)) = pkt.ext.reth else {
                            return Exec::Fatal {
                                syndrome: NAK_INV_REQ,
                                wc: None,
                            };
                        };
                        if !access.contains(AccessFlags::REMOTE_WRITE) || dlen > MAX_DMA_LEN {
                            return Exec::Fatal {
                                syndrome: NAK_INV_REQ,
                                wc: None,
                            };
                        }
                        // The whole range is checked on the first packet; a zero-length WRITE touches no memory,
                        // so its R_Key and VA are not checked (IBTA, rxe).
                        if dlen > 0
                            && mrs
                                .check_remote(
                                    Rkey(rkey),
                                    qp.pd,
                                    qp.qpn,
                                    va,
                                    u64::from(dlen),
                                    AccessFlags::REMOTE_WRITE,
                                )
                                .is_err()
                        {
                            return Exec::Fatal {
                                syndrome: NAK_REM_ACCESS,
                                wc: None,
                            };
                        }
                        (Rkey(rkey), va, u64::from(dlen), 0)
                    }
                };
                let total = placed + plen;
                let ends = matches!(pos, op::Pos::Last | op::Pos::Only);
                if total > len || (ends && total != len) {
                    return Exec::Fatal {
                        syndrome: NAK_INV_REQ,
                        wc: None,
                    };
                }
                if plen > 0 {
                    // Every packet resolves the R_Key again (no lease is held between packets, see `RdResource`):
                    // the MR may have been deregistered or its R_Key invalidated since the message began.
                    let Ok(dst) = mrs.check_remote(
                        rkey,
                        qp.pd,
                        qp.qpn,
                        va.wrapping_add(placed),
                        plen,
                        AccessFlags::REMOTE_WRITE,
                    ) else {
                        return Exec::Fatal {
                            syndrome: NAK_REM_ACCESS,
                            wc: None,
                        };
                    };
                    if mrs.write(dst, pkt.payload).is_err() {
                        // The target's memory faulted: a translation fault, answered as an R_Key violation (rxe
                        // `write_data_in` → RESPST_ERR_RKEY_VIOLATION).
                        qp.counters.mr_access_faults += 1;
                        stats.mr_access_faults += 1;
                        return Exec::Fatal {
                            syndrome: NAK_REM_ACCESS,
                            wc: None,
                        };
                    }
                }
                if ends {
                    qp.resp.msg = InMsg::None;
                    qp.counters.rx_write_requests += 1;
                    stats.rx_write_requests += 1;
                    if with_imm {
                        let h = qp.rq.head;
                        let wc = Wc {
                            wr_id: qp.rq.wqe(h).wr_id,
                            status: WcStatus::Success,
                            opcode: WcOpcode::RecvRdmaWithImm,
                            byte_len: len as u32,
                            imm_data: pkt.ext.imm.unwrap_or(0),
                            qp_num: qp.qpn,
                            src_qp: qp.attr.dest_qp_num,
                            wc_flags: WcFlags::WITH_IMM,
                            ..Wc::default()
                        };
                        qp.counters.rdma_recvs += 1;
                        stats.rdma_recvs += 1;
                        let cq = qp.recv_cq;
                        self.retire_recv(i);
                        self.push_wc(cq, wc);
                    }
                    Exec::Done {
                        psns: 1,
                        msg_end: true,
                    }
                } else {
                    qp.resp.msg = InMsg::Write {
                        rkey,
                        va,
                        len,
                        placed: total,
                    };
                    Exec::Done {
                        psns: 1,
                        msg_end: false,
                    }
                }
            }
            op::ATOMIC_WRITE => {
                // RDMA ATOMIC WRITE (IBTA Vol 1 1.5 §9.4.6; rxe `atomic_write_reply`): RETH + exactly 8 payload
                // bytes written in one piece at an 8-byte aligned address with REMOTE_WRITE; ACKed like a WRITE
                // (a duplicate is re-ACKed, never re-executed).
                let Some((va, rkey, dlen)) = pkt.ext.reth else {
                    return Exec::Fatal {
                        syndrome: NAK_INV_REQ,
                        wc: None,
                    };
                };
                if !access.contains(AccessFlags::REMOTE_WRITE) || dlen != 8 || va % 8 != 0 {
                    return Exec::Fatal {
                        syndrome: NAK_INV_REQ,
                        wc: None,
                    };
                }
                let Ok(bytes) = <[u8; 8]>::try_from(pkt.payload) else {
                    return Exec::Fatal {
                        syndrome: NAK_INV_REQ,
                        wc: None,
                    };
                };
                let Ok(dst) =
                    mrs.check_remote(Rkey(rkey), qp.pd, qp.qpn, va, 8, AccessFlags::REMOTE_WRITE)
                else {
                    return Exec::Fatal {
                        syndrome: NAK_REM_ACCESS,
                        wc: None,
                    };
                };
                if mrs.atomic_write(dst, bytes).is_err() {
                    qp.counters.mr_access_faults += 1;
                    stats.mr_access_faults += 1;
                    return Exec::Fatal {
                        syndrome: NAK_REM_ACCESS,
                        wc: None,
                    };
                }
                qp.counters.rx_write_requests += 1;
                stats.rx_write_requests += 1;
                Exec::Done {
                    psns: 1,
                    msg_end: true,
                }
            }
            op::RDMA_READ_REQUEST | op::COMPARE_SWAP | op::FETCH_ADD
                if qp.resp.out.owed_rd_atomic() >= qp.resp.res.len() =>
            {
                // More READ/atomic requests outstanding than the responder resources (`max_dest_rd_atomic`): NAK
                // invalid request. With no resources at all this is every READ/atomic (IBTA; rxe `check_resource` →
                // RESPST_ERR_TOO_MANY_RDMA_ATM_REQ; siw "zero-sized Read and Receive Queues", 2020). Otherwise all
                // of them still have a response queued here, unsent: a requester within its initiator depth
                // (`ROCEV2.md §4.2` `max_rd_atomic`, set no higher than the peer's responder resources) has
                // received the response of the request `max_dest_rd_atomic` back before it sends a new one, so
                // this is a requester that ignores the limit (issue #21). Recycling the oldest resource instead (rxe) would drop a result
                // still owed, or queue responses without bound within one receive burst.
                Exec::Fatal {
                    syndrome: NAK_INV_REQ,
                    wc: None,
                }
            }
            op::RDMA_READ_REQUEST => {
                let Some((va, rkey, dlen)) = pkt.ext.reth else {
                    return Exec::Fatal {
                        syndrome: NAK_INV_REQ,
                        wc: None,
                    };
                };
                if !access.contains(AccessFlags::REMOTE_READ) || dlen > MAX_DMA_LEN {
                    return Exec::Fatal {
                        syndrome: NAK_INV_REQ,
                        wc: None,
                    };
                }
                // A zero-length READ reads no memory: R_Key and VA are not checked (IBTA, rxe). The resource keeps
                // the R_Key, not the MR: each response packet resolves it again (`RdResource`).
                if dlen > 0
                    && mrs
                        .check_remote(
                            Rkey(rkey),
                            qp.pd,
                            qp.qpn,
                            va,
                            u64::from(dlen),
                            AccessFlags::REMOTE_READ,
                        )
                        .is_err()
                {
                    return Exec::Fatal {
                        syndrome: NAK_REM_ACCESS,
                        wc: None,
                    };
                }
                let Some(ri) = alloc_resource(&mut qp.resp) else {
                    // Unreachable: a QP without resources refuses READs above.
                    return Exec::Drop;
                };
                let npsn = crate::requester::packets_for(u64::from(dlen), qp.pmtu());
                qp.resp.res[ri] = RdResource {
                    valid: true,
                    atomic: false,
                    psn: pkt.psn,
                    npsn,
                    va,
                    rkey: Rkey(rkey),
                    len: u64::from(dlen),
                    orig: 0,
                    msn: (qp.resp.msn + 1) & 0xFF_FFFF,
                };
                qp.resp.out.push_back(RespItem::Read {
                    res: ri as u32,
                    psn: pkt.psn,
                    offset: 0,
                    first: true,
                    replay: false,
                });
                qp.counters.rx_read_requests += 1;
                stats.rx_read_requests += 1;
                Exec::Done {
                    psns: npsn,
                    msg_end: true,
                }
            }
            op::COMPARE_SWAP | op::FETCH_ADD => {
                let Some((va, rkey, swap_add, compare)) = pkt.ext.atomic else {
                    return Exec::Fatal {
                        syndrome: NAK_INV_REQ,
                        wc: None,
                    };
                };
                if !access.contains(AccessFlags::REMOTE_ATOMIC) || va % 8 != 0 {
                    return Exec::Fatal {
                        syndrome: NAK_INV_REQ,
                        wc: None,
                    };
                }
                let Ok(mr) =
                    mrs.check_remote(Rkey(rkey), qp.pd, qp.qpn, va, 8, AccessFlags::REMOTE_ATOMIC)
                else {
                    return Exec::Fatal {
                        syndrome: NAK_REM_ACCESS,
                        wc: None,
                    };
                };
                if qp.resp.res.is_empty() {
                    // Unreachable: a QP without resources refuses atomics above.
                    return Exec::Drop;
                }
                // Remote memory holds the operand in little-endian order (see requester `on_atomic_ack`); the memory
                // performs the operation (a real atomic instruction on memory the application shares).
                let done = if o == op::COMPARE_SWAP {
                    mrs.compare_swap(mr, compare, swap_add)
                } else {
                    mrs.fetch_add(mr, swap_add)
                };
                let Ok(orig) = done else {
                    // The target's memory faulted: NAK remote access error, as for an R_Key violation (rxe
                    // `atomic_reply`: a failed atomic on the MR → RESPST_ERR_RKEY_VIOLATION). No resource is taken.
                    qp.counters.mr_access_faults += 1;
                    stats.mr_access_faults += 1;
                    return Exec::Fatal {
                        syndrome: NAK_REM_ACCESS,
                        wc: None,
                    };
                };
                let Some(ri) = alloc_resource(&mut qp.resp) else {
                    return Exec::Drop;
                };
                let msn = (qp.resp.msn + 1) & 0xFF_FFFF;
                qp.resp.res[ri] = RdResource {
                    valid: true,
                    atomic: true,
                    psn: pkt.psn,
                    npsn: 1,
                    va,
                    rkey: Rkey(rkey),
                    len: 8,
                    orig,
                    msn,
                };
                qp.resp.out.push_back(RespItem::AtomicAck {
                    psn: pkt.psn,
                    orig,
                    msn,
                    replay: false,
                });
                qp.counters.rx_atomic_requests += 1;
                stats.rx_atomic_requests += 1;
                Exec::Done {
                    psns: 1,
                    msg_end: true,
                }
            }
            _ => Exec::Fatal {
                syndrome: NAK_INV_REQ,
                wc: None,
            },
        }
    }

    /// UC: no ACK/NAK. A PSN gap drops the partial message; the QP resynchronises at the next FIRST/ONLY. A message
    /// that finds no receive WQE is dropped whole, without an RNR NAK (UC has none; rxe `rxe_resp.c`
    /// `RESPST_ERR_RNR`: UD/UC class D), and counted as `drop_uc_no_recv`.
    fn on_uc_request(&mut self, i: usize, pkt: &RxPkt<'_>) {
        let Some(qp) = self.qps[i].as_deref_mut() else {
            return;
        };
        let o = pkt.opcode & 0x1F;
        let pos = op::position(o);
        if pkt.psn != qp.resp.epsn {
            // Drop what was open (the receive WR stays posted) and resync only on a message start.
            qp.resp.msg = InMsg::None;
            qp.resp.uc_no_recv = false;
            if !matches!(pos, op::Pos::First | op::Pos::Only) {
                qp.counters.drop_uc_out_of_seq += 1;
                self.stats.drop_uc_out_of_seq += 1;
                qp.resp.epsn = pkt.psn + 1;
                return;
            }
            qp.counters.out_of_sequence += 1;
            self.stats.out_of_sequence += 1;
            qp.resp.epsn = pkt.psn;
        }
        if matches!(pos, op::Pos::Middle | op::Pos::Last) && qp.resp.msg == InMsg::None {
            if qp.resp.uc_no_recv {
                // The rest of a message whose FIRST found no receive WQE.
                qp.resp.uc_no_recv = pos == op::Pos::Middle;
                qp.counters.drop_uc_no_recv += 1;
                self.stats.drop_uc_no_recv += 1;
            } else {
                qp.counters.drop_uc_out_of_seq += 1;
                self.stats.drop_uc_out_of_seq += 1;
            }
            qp.resp.epsn = pkt.psn + 1;
            return;
        }
        if matches!(pos, op::Pos::First | op::Pos::Only) {
            qp.resp.msg = InMsg::None;
            qp.resp.uc_no_recv = false;
        }
        match self.execute(i, pkt) {
            Exec::Done { psns, msg_end } => {
                let Some(qp) = self.qps[i].as_deref_mut() else {
                    return;
                };
                qp.resp.epsn = pkt.psn + psns;
                if msg_end {
                    qp.resp.msn = (qp.resp.msn + 1) & 0xFF_FFFF;
                }
            }
            Exec::Fatal {
                wc: Some(status), ..
            } if status != WcStatus::LocLenErr => {
                // A local protection error on the receive WR is a local error: complete it, QP to ERR.
                self.responder_local_error(i, status);
            }
            Exec::Rnr => {
                let Some(qp) = self.qps[i].as_deref_mut() else {
                    return;
                };
                qp.resp.msg = InMsg::None;
                qp.resp.epsn = pkt.psn + 1;
                // A FIRST takes its MIDDLE/LAST packets down with it.
                qp.resp.uc_no_recv = pos == op::Pos::First;
                qp.counters.drop_uc_no_recv += 1;
                self.stats.drop_uc_no_recv += 1;
            }
            Exec::Fatal { .. } | Exec::Drop => {
                let Some(qp) = self.qps[i].as_deref_mut() else {
                    return;
                };
                qp.resp.msg = InMsg::None;
                qp.resp.epsn = pkt.psn + 1;
                qp.counters.drop_uc_out_of_seq += 1;
                self.stats.drop_uc_out_of_seq += 1;
            }
        }
    }

    fn responder_local_error(&mut self, i: usize, status: WcStatus) {
        let Some(qp) = self.qps[i].as_deref_mut() else {
            return;
        };
        if qp.rq.head != qp.rq.tail {
            let wc = Wc {
                wr_id: qp.rq.wqe(qp.rq.head).wr_id,
                status,
                opcode: WcOpcode::Recv,
                qp_num: qp.qpn,
                ..Wc::default()
            };
            let cq = qp.recv_cq;
            self.retire_recv(i);
            self.push_wc(cq, wc);
        }
        self.enter_error(i);
    }

    /// UD receive (`ROCEV2.md §5`, S07, S17): Q_Key check; a 40-byte GRH area precedes the payload in the receive
    /// buffer (IPv4: the IPv4 header in its last 20 bytes); too-large payloads are dropped and counted, the QP stays
    /// in RTS and the receive WR stays posted.
    fn on_ud_request(&mut self, i: usize, pkt: &RxPkt<'_>) {
        let Engine {
            qps,
            mrs,
            stats,
            srqs,
            events,
            ..
        } = self;
        let Some(qp) = qps[i].as_deref_mut() else {
            return;
        };
        let Some((qkey, src_qp)) = pkt.ext.deth else {
            stats.drop_malformed += 1;
            qp.counters.drop_malformed += 1;
            return;
        };
        if qkey != qp.attr.qkey {
            stats.drop_qkey_mismatch += 1;
            qp.counters.drop_qkey_mismatch += 1;
            return;
        }
        if !crate::srq::take_recv(qp, srqs, events) {
            stats.drop_ud_no_recv += 1;
            qp.counters.drop_ud_no_recv += 1;
            return;
        }
        let h = qp.rq.head;
        let rw = *qp.rq.wqe(h);
        let total = pkt.payload.len() as u64 + 40;
        if total > rw.len {
            stats.drop_ud_too_long += 1;
            qp.counters.drop_ud_too_long += 1;
            return;
        }
        if rw.bad {
            self.responder_local_error(i, WcStatus::LocProtErr);
            return;
        }
        let mut grh = [0u8; 40];
        let ih = pkt.ip_header;
        if ih.len() == 20 {
            grh[20..].copy_from_slice(ih);
        } else if ih.len() == 40 {
            grh.copy_from_slice(ih);
        }
        if crate::requester::scatter(mrs, qp.rq.segs(h), 0, &grh)
            .and_then(|()| crate::requester::scatter(mrs, qp.rq.segs(h), 40, pkt.payload))
            .is_err()
        {
            // The receive buffer's memory faulted: as a receive WQE whose SGE fails its check (`rw.bad`).
            qp.counters.mr_access_faults += 1;
            stats.mr_access_faults += 1;
            self.responder_local_error(i, WcStatus::LocProtErr);
            return;
        }
        let mut wc = Wc {
            wr_id: rw.wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: total as u32,
            qp_num: qp.qpn,
            src_qp,
            wc_flags: WcFlags::GRH,
            network_hdr_type: match ih.len() {
                20 => 2,
                40 => 1,
                _ => 0,
            },
            ..Wc::default()
        };
        if let Some(imm) = pkt.ext.imm {
            wc.imm_data = imm;
            wc.wc_flags |= WcFlags::WITH_IMM;
        }
        qp.counters.rdma_recvs += 1;
        stats.rdma_recvs += 1;
        let cq = qp.recv_cq;
        self.retire_recv(i);
        self.push_wc(cq, wc);
    }

    /// Emits one control frame for QP index `i`: the fatal NAK, a CNP, or the queued ACK/NAK/ATOMIC ACK.
    pub(crate) fn emit_control(
        &mut self,
        i: usize,
        _now: Instant,
        buf: &mut [u8],
    ) -> Result<Option<TxMeta>, ()> {
        let cnp_dscp = self.cfg.cnp_dscp;
        let (mac, ecn_data, ident) = (self.cfg.mac, self.cfg.ecn_data, self.ip_id);
        let Engine { qps, cfg, .. } = self;
        let Some(qp) = qps[i].as_deref_mut() else {
            return Ok(None);
        };
        let Some(tmpl) = qp.tmpl.as_ref() else {
            qp.resp.cnp_pending = false;
            qp.resp.fatal_nak = None;
            qp.resp.out.clear();
            return Ok(None);
        };
        let mut hdr = TxHdr {
            class: TxClass::Ctrl,
            opcode: op::ACKNOWLEDGE,
            se: false,
            ack_req: false,
            psn: Psn::new(0),
            dest_qp: None,
        };
        let mut ext = Ext::default();
        enum Which {
            Fatal,
            Cnp,
            Item,
        }
        let which;
        let cnp_tmpl;
        let mut use_tmpl = tmpl;
        let fatal = qp.resp.fatal_nak;
        if let (Some((psn, syn)), None) = (fatal, qp.resp.out.front()) {
            // The final NAK goes last: responses owed for the requests before the failing one (READ responses,
            // ACKs, ATOMIC ACKs) leave first, in PSN order (IBTA; `responder_fatal`).
            hdr.psn = psn;
            ext.aeth = Some((syn, qp.resp.msn));
            which = Which::Fatal;
        } else if fatal.is_none() && (qp.state == QpState::Err || qp.state == QpState::Reset) {
            qp.resp.cnp_pending = false;
            qp.resp.out.clear();
            return Ok(None);
        } else if fatal.is_none() && qp.resp.cnp_pending {
            // CNP (`ROCEV2.md §6`): BECN=1, DestQP = the flow's sender, PSN 0, M=0, 16 zero bytes, DSCP cnp_dscp.
            hdr.opcode = op::CNP;
            hdr.class = TxClass::Cnp;
            ext.cnp = true;
            if let Some(dest) = qp.resp.cnp_dest {
                hdr.dest_qp = Some(dest.qpn);
                if qp.qp_type == QpType::Ud {
                    let sgid = cfg.gids.first().copied().unwrap_or_default();
                    let av = crate::verbs::AhAttr {
                        dgid: dest.gid,
                        dmac: dest.mac,
                        ..Default::default()
                    };
                    cnp_tmpl = wire::TxTemplate::new(
                        mac, sgid, &av, tmpl.sport, dest.qpn, false, ecn_data, cnp_dscp, ident,
                    );
                    use_tmpl = &cnp_tmpl;
                }
            }
            which = Which::Cnp;
        } else {
            match qp.resp.out.front() {
                Some(RespItem::Ack { psn, syndrome, msn }) => {
                    hdr.psn = *psn;
                    ext.aeth = Some((*syndrome, *msn));
                }
                Some(RespItem::AtomicAck { psn, orig, msn, .. }) => {
                    hdr.opcode = op::ATOMIC_ACKNOWLEDGE;
                    hdr.psn = *psn;
                    ext.aeth = Some((SYN_ACK, *msn));
                    ext.atomic_ack = Some(*orig);
                }
                _ => return Ok(None),
            }
            which = Which::Item;
        }
        let need = wire::frame_len(use_tmpl, &hdr, &ext, 0);
        if buf.len() < need {
            return Err(());
        }
        let Some(len) = wire::emit(buf, use_tmpl, tmpl.sport, &hdr, &ext, 0, |_| {}) else {
            return Err(());
        };
        let (dscp, ecn) = use_tmpl.marks(hdr.class, cnp_dscp);
        let kind = match which {
            Which::Fatal => {
                qp.resp.fatal_nak = None;
                TxKind::Ack
            }
            Which::Cnp => {
                qp.resp.cnp_pending = false;
                TxKind::Cnp
            }
            Which::Item => {
                qp.resp.out.pop_front();
                TxKind::Ack
            }
        };
        let qpn = qp.qpn;
        let prio = if kind == TxKind::Cnp { cfg.cnp_prio } else { 0 };
        Ok(Some(TxMeta {
            len,
            qpn,
            dscp,
            ecn,
            prio,
            kind,
            gather: None,
        }))
    }

    /// Emits the next READ response packet of the item at the front of the QP's response queue (`ROCEV2.md §5`:
    /// segmented by PMTU; AETH on FIRST/LAST/ONLY; zero-length READ → one RESPONSE ONLY).
    pub(crate) fn emit_read_response(
        &mut self,
        i: usize,
        now: Instant,
        buf: &mut [u8],
    ) -> Result<Option<TxMeta>, ()> {
        let src = match self.read_response_source(i) {
            Ok(src) => src,
            Err(psn) => {
                // IBTA: the NAK takes the place of the response packet that cannot be sent, with its PSN; nothing
                // queued behind it (later PSNs) is sent.
                if let Some(qp) = self.qps[i].as_deref_mut() {
                    qp.resp.out.clear();
                }
                self.responder_fatal(i, psn, NAK_REM_ACCESS, None);
                return self.emit_control(i, now, buf);
            }
        };
        let cnp_dscp = self.cfg.cnp_dscp;
        let Engine { qps, mrs, .. } = self;
        let Some(qp) = qps[i].as_deref_mut() else {
            return Ok(None);
        };
        let Some(RespItem::Read {
            res,
            psn,
            offset,
            first,
            ..
        }) = qp.resp.out.front().copied()
        else {
            return Ok(None);
        };
        let Some(tmpl) = qp.tmpl.as_ref() else {
            return Ok(None);
        };
        let r = qp.resp.res[res as usize];
        let pmtu = u64::from(qp.pmtu());
        let remaining = r.len.saturating_sub(offset);
        let plen = remaining.min(pmtu);
        let last = remaining <= pmtu;
        let opcode = match (first, last) {
            (true, true) => op::READ_RESPONSE_ONLY,
            (true, false) => op::READ_RESPONSE_FIRST,
            (false, false) => op::READ_RESPONSE_MIDDLE,
            (false, true) => op::READ_RESPONSE_LAST,
        };
        let hdr = TxHdr {
            class: TxClass::Data,
            opcode,
            se: false,
            ack_req: false,
            psn,
            dest_qp: None,
        };
        let mut ext = Ext::default();
        if opcode != op::READ_RESPONSE_MIDDLE {
            ext.aeth = Some((SYN_ACK, r.msn));
        }
        let need = wire::frame_len(tmpl, &hdr, &ext, plen as usize);
        if buf.len() < need {
            return Err(());
        }
        let mut fault = false;
        let Some(len) = wire::emit(buf, tmpl, tmpl.sport, &hdr, &ext, plen as usize, |out| {
            fault = mrs.read(src, out).is_err();
        }) else {
            return Err(());
        };
        if fault {
            // The source's memory faulted (unmapped or protected by the application): the frame is not sent; a NAK
            // remote access error takes its place, as for an R_Key that no longer grants the range above (rxe
            // `read_reply`: a failed copy from the MR → RESPST_ERR_RKEY_VIOLATION).
            qp.counters.mr_access_faults += 1;
            self.stats.mr_access_faults += 1;
            qp.resp.out.clear();
            self.responder_fatal(i, psn, NAK_REM_ACCESS, None);
            return self.emit_control(i, now, buf);
        }
        let (dscp, ecn) = tmpl.marks(TxClass::Data, cnp_dscp);
        if last {
            qp.resp.out.pop_front();
        } else {
            qp.resp.out.update_front(|it| {
                if let RespItem::Read {
                    psn: p,
                    offset: off,
                    first: f,
                    ..
                } = it
                {
                    *p = psn + 1;
                    *off = offset + plen;
                    *f = false;
                }
            });
        }
        let qpn = qp.qpn;
        Ok(Some(TxMeta {
            len,
            qpn,
            dscp,
            ecn,
            prio: 0,
            kind: TxKind::ReadResponse,
            gather: None,
        }))
    }
}

impl Engine {
    /// Where the next READ response packet of QP index `i` reads its payload, or `Err(psn)` with that packet's PSN
    /// if the R_Key no longer grants the range (MR deregistered, R_Key invalidated): responder resources keep the
    /// R_Key, not the MR (`RdResource`), so each packet, first transmission or replay, resolves it again (rxe
    /// `read_reply` rechecks the rkey the same way). A zero-length packet reads nothing and is never refused.
    fn read_response_source(&self, i: usize) -> Result<crate::mr::MrRef, Psn> {
        let none = crate::qp::NO_SEG.mr;
        let Some(qp) = self.qps.get(i).and_then(|q| q.as_deref()) else {
            return Ok(none);
        };
        let Some(&RespItem::Read {
            res, psn, offset, ..
        }) = qp.resp.out.front()
        else {
            return Ok(none);
        };
        let Some(r) = qp.resp.res.get(res as usize) else {
            return Ok(none);
        };
        let plen = r.len.saturating_sub(offset).min(u64::from(qp.pmtu()));
        if plen == 0 {
            return Ok(none);
        }
        self.mrs
            .check_remote(
                r.rkey,
                qp.pd,
                qp.qpn,
                r.va.wrapping_add(offset),
                plen,
                AccessFlags::REMOTE_READ,
            )
            .map_err(|_| psn)
    }
}

/// Before the replay for a duplicate READ/atomic at PSN `p` is queued: drops every queued response for PSN `p` or
/// later, and (READ) the queued stream of the same resource `res`, wherever it stands.
///
/// A duplicate READ/atomic means the requester has gone back to `p` (go-back-N, `ROCEV2.md §4.4`): it takes
/// responses only in PSN order from `p`, discards anything for a later PSN until `p`'s response arrives, and sends
/// every later request again. Responses leave in the PSN order of the requests they answer (IBTA; rxe `rxe_resp.c`
/// `duplicate_request` makes the duplicate's replay the current reply at once), so the replay comes next after the
/// responses still owed for earlier PSNs, never behind streams for later READs that the requester would discard:
/// queued behind them, recovery waited for the local ACK timeout (issue #10; `roce-tests/tests/read_loss.rs`
/// `duplicate_read_is_answered_before_later_queued_streams`). What is dropped is asked for again by the re-sent
/// requests: READs replay from their resources, atomics resend their saved results, SEND/WRITEs are re-ACKed.
fn supersede_from(resp: &mut crate::qp::RespCtx, p: Psn, res: Option<u32>) {
    resp.out.retain(|it| {
        let (psn, same) = match *it {
            RespItem::Read { res: r, psn, .. } => (psn, Some(r) == res),
            RespItem::Ack { psn, .. } | RespItem::AtomicAck { psn, .. } => (psn, false),
        };
        !same && psn.diff(p) < 0
    });
}

/// Picks the responder resource for a new (in-sequence) READ/atomic: always the ring's next slot, i.e. the oldest
/// saved request, which is overwritten. If a response stream of that slot is still queued (a replay for an
/// earlier duplicate), it is dropped from the response queue: it would otherwise stream the new request's data
/// under the old PSNs. `None` only if the QP has no resources at all.
///
/// Why the oldest slot is always free to reuse: the resources form a ring of `max_dest_rd_atomic` entries filled in
/// PSN order (`ROCEV2.md §4.2`: responder resources = saved READ/atomic state for duplicates; `§5`: a duplicate
/// READ is re-executed from its saved request, a duplicate atomic answered from its saved result, an unknown one
/// silently dropped), and the requester may have at most `max_rd_atomic` of them outstanding (`§4.5`), which IBTA
/// requires to be no more than the remote `max_dest_rd_atomic` (initiator depth vs. responder resources). A new
/// READ/atomic therefore means the requester has completed the one `max_dest_rd_atomic` requests back — it retires
/// them in order — so neither its saved state nor a queued replay of it is needed any more. Linux rxe does the
/// same (`rxe_resp.c`: the resource at `res_head` is freed and reused unconditionally, duplicates find theirs by
/// PSN range). Skipping a busy slot instead (as this code once did) evicts a *newer* request the requester may
/// still retry, whose duplicates then find no resource and are dropped until the requester gives up with
/// RETRY_EXC_ERR (reproduced by `roce-tests/tests/read_loss.rs`).
fn alloc_resource(resp: &mut crate::qp::RespCtx) -> Option<usize> {
    let n = resp.res.len();
    if n == 0 {
        return None;
    }
    let ri = resp.res_next as usize % n;
    resp.res_next = ((ri + 1) % n) as u32;
    // At most one queued stream per resource: a replay first removes its resource's queued stream (`supersede_from`).
    resp.out.remove_read_of(ri as u32);
    Some(ri)
}
