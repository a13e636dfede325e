//! The hostile-peer suite (issue #21): what a peer, or a third party on the path, can put on the wire against a
//! connected RC pair, each case asserting the counted drop or the exact NAK and completion status, and that memory
//! outside the MRs a request names is never read or written.
//!
//! Canaries: the responder B registers its target MR between two neighbours at adjacent virtual addresses (same PD,
//! every remote right), plus MRs at VA 0 and at the top of the 64-bit space, all filled with known bytes. A range
//! check that wrapped or ran past an MR's end would land in one of them; every case checks that none changed. On the
//! requester A the READ/atomic destination is the middle of a larger MR whose outer thirds are checked the same way.
//!
//! Rules exercised, with their sources: R_Key, range and rights (`docs/spec/ROCEV2.md §5`, IBTA Vol 1 §9.7.5.1.3 /
//! C9-88: NAK remote access error); QP access flags and message length beyond 2^31 and misaligned atomics (IBTA
//! §9.4.5, rxe `rxe_resp.c` `check_rkey` / `RESPST_ERR_MISALIGNED_ATOMIC`: NAK invalid request); receive filtering
//! (`ROCEV2.md §5`: address vector, P_Key, QPN); responses (`ROCEV2.md §4.4`: ghost and duplicate ACKs); duplicates
//! (`ROCEV2.md §5`: re-ACK, never re-execute); RNR and sequence-NAK pacing (`ROCEV2.md §4.4`, rxe
//! `comp.started_retry`); the DCQCN rate floor (`docs/spec/DCQCN.md §2.3`).

use std::time::Duration;

use super::util::*;
use crate::*;

const LEN: usize = 4096;
/// Virtual address of B's target MR; its neighbours sit at `BASE - LEN` and `BASE + LEN`.
const BASE: u64 = 0x10_0000;
/// Every right an MR can grant.
#[allow(non_snake_case)]
fn ALL() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

struct Rig {
    p: Pair,
    a: End,
    b: End,
    /// A's source/destination: 3 × LEN, only the middle third is ever named by an SGE.
    local: MrInfo,
    /// B's target MR at `BASE`, zeroed.
    target: MrInfo,
    /// Canary MRs on B: (info, fill byte).
    canaries: Vec<(MrInfo, u8)>,
    /// The bytes of `local` at the start, to compare its outer thirds.
    local_init: Vec<u8>,
}

fn rig_with(o: &ConnOpts) -> Rig {
    let mut p = Pair::new();
    let (a, b) = connect(&mut p, o);
    let local = mr(&mut p.a, a.pd, 3 * LEN, |i| (i as u8) ^ 0x5A);
    let local_init = p.a.mr_bytes(local.lkey).unwrap();
    let mut canaries = Vec::new();
    for (iova, fill) in [
        (BASE - LEN as u64, 0xC1u8),
        (BASE + LEN as u64, 0xC2),
        (0, 0xC3),
        (u64::MAX - LEN as u64, 0xC4),
    ] {
        let m = p.b.reg_mr_iova(b.pd, vec![fill; LEN], ALL(), iova).unwrap();
        canaries.push((m, fill));
    }
    let target = p.b.reg_mr_iova(b.pd, vec![0u8; LEN], ALL(), BASE).unwrap();
    Rig {
        p,
        a,
        b,
        local,
        target,
        canaries,
        local_init,
    }
}

fn rig() -> Rig {
    rig_with(&ConnOpts::default())
}

impl Rig {
    /// The middle third of A's MR, `len` bytes.
    fn sge(&self, len: u32) -> Sge {
        sge(&self.local, LEN as u64, len)
    }

    /// Posts one signaled WR on A, drives the pair and returns A's completions.
    fn run(&mut self, op: SendOp, len: u32) -> Vec<Wc> {
        let s = [self.sge(len)];
        self.p
            .a
            .post_send(self.a.qpn, &[SendWr::new(7, op, &s)])
            .unwrap();
        self.p.drive();
        poll_all(&mut self.p.a, self.a.cq)
    }

    /// No canary on B changed, B's target is still zero unless `target_may_change`, and A's MR outside the SGE's
    /// third is as it was.
    fn assert_memory_intact(&self, target_may_change: bool) {
        for (m, fill) in &self.canaries {
            let bytes = self.p.b.mr_bytes(m.lkey).unwrap();
            assert!(
                bytes.iter().all(|b| b == fill),
                "canary MR at {:#x} was written",
                m.addr
            );
        }
        if !target_may_change {
            let t = self.p.b.mr_bytes(self.target.lkey).unwrap();
            assert!(t.iter().all(|&b| b == 0), "target MR was written");
        }
        let l = self.p.a.mr_bytes(self.local.lkey).unwrap();
        assert_eq!(l[..LEN], self.local_init[..LEN], "A's MR below the SGE");
        assert_eq!(
            l[2 * LEN..],
            self.local_init[2 * LEN..],
            "A's MR above the SGE"
        );
    }

    /// The one completion of a failed WR, the requester's and responder's counters for it, and both QPs in ERR.
    fn assert_nak(&self, wcs: &[Wc], status: WcStatus) {
        assert_eq!(wcs.len(), 1, "{wcs:?}");
        assert_eq!((wcs[0].wr_id, wcs[0].status), (7, status));
        let (req, resp) = match status {
            WcStatus::RemAccessErr => ("req_remote_access_errors", "resp_remote_access_errors"),
            WcStatus::RemInvReqErr => ("req_remote_invalid_request", "resp_nak_sent"),
            s => panic!("unexpected {s:?}"),
        };
        assert_eq!(self.p.a.counters().get(req), Some(1), "{req}");
        assert_eq!(self.p.b.counters().get(resp), Some(1), "{resp}");
        assert_eq!(self.p.b.counters().resp_nak_sent, 1);
        assert_eq!(
            self.p.a.query_qp(self.a.qpn).unwrap().qp_state,
            QpState::Err
        );
        assert_eq!(
            self.p.b.query_qp(self.b.qpn).unwrap().qp_state,
            QpState::Err
        );
        assert_counters_add_up(&self.p.a);
        assert_counters_add_up(&self.p.b);
    }

    /// A frame A sent to B, for re-emitting forged requests (a SEND carries no RETH: `craft` adds what is needed).
    fn a_to_b_template(&mut self) -> Vec<u8> {
        self.p
            .b
            .post_recv(
                self.b.qpn,
                &[RecvWr {
                    wr_id: 99,
                    sg_list: &[],
                }],
            )
            .unwrap();
        self.p
            .a
            .post_send(self.a.qpn, &[SendWr::new(98, SendOp::Send, &[])])
            .unwrap();
        self.p.drive();
        assert_eq!(poll_all(&mut self.p.a, self.a.cq).len(), 1);
        assert_eq!(poll_all(&mut self.p.b, self.b.cq).len(), 1);
        self.p
            .captured
            .iter()
            .rev()
            .find(|c| c.1 == Dir::AtoB)
            .unwrap()
            .2
            .clone()
    }

    /// The PSN B expects next (A's next PSN).
    fn epsn(&self) -> u32 {
        self.p.b.query_qp(self.b.qpn).unwrap().rq_psn.value()
    }
}

/// Builds a remote operation from a VA and an R_Key.
type MakeOp = fn(u64, Rkey) -> SendOp;

fn write(remote_addr: u64, rkey: Rkey) -> SendOp {
    SendOp::RdmaWrite { remote_addr, rkey }
}
fn read(remote_addr: u64, rkey: Rkey) -> SendOp {
    SendOp::RdmaRead { remote_addr, rkey }
}

#[test]
fn write_whose_va_plus_len_wraps_2_64_is_nak_remote_access() {
    let mut r = rig();
    // An MR ending at the top of the address space; VA + 64 wraps to 48, inside the canary at VA 0.
    let top = r.canaries[3].0;
    let wcs = r.run(write(u64::MAX - 16, top.rkey), 64);
    r.assert_nak(&wcs, WcStatus::RemAccessErr);
    r.assert_memory_intact(false);

    // And through the target's own key: a VA below the MR whose offset + length wraps.
    let mut r = rig();
    let t = r.target.rkey;
    let wcs = r.run(write(u64::MAX - 7, t), 64);
    r.assert_nak(&wcs, WcStatus::RemAccessErr);
    r.assert_memory_intact(false);
}

#[test]
fn write_and_read_crossing_the_mr_end_are_nak_remote_access() {
    // Single packet, then a 3-packet message (PMTU 1024) whose first packet is in range: the whole range is checked
    // on the first packet, so nothing of the message is written.
    for len in [64u32, 3000] {
        let mut r = rig();
        let t = r.target.rkey;
        let wcs = r.run(write(BASE + LEN as u64 - 1000, t), len.max(1001));
        r.assert_nak(&wcs, WcStatus::RemAccessErr);
        r.assert_memory_intact(false);
    }
    // A READ that would take 100 bytes of the neighbour above.
    let mut r = rig();
    let t = r.target.rkey;
    let wcs = r.run(read(BASE + LEN as u64 - 100, t), 200);
    r.assert_nak(&wcs, WcStatus::RemAccessErr);
    r.assert_memory_intact(false);
    let l = r.p.a.mr_bytes(r.local.lkey).unwrap();
    assert_eq!(l, r.local_init, "A's READ destination was written");
    // A READ that starts below the MR.
    let mut r = rig();
    let t = r.target.rkey;
    let wcs = r.run(read(BASE - 8, t), 16);
    r.assert_nak(&wcs, WcStatus::RemAccessErr);
    assert_eq!(r.p.a.mr_bytes(r.local.lkey).unwrap(), r.local_init);
}

#[test]
fn rkey_of_another_pd_a_deregistered_mr_or_without_the_right_is_nak_remote_access() {
    // Another PD of B's: a valid key, a valid range, but not the QP's PD.
    let mut r = rig();
    let pd2 = r.p.b.alloc_pd().unwrap();
    let other =
        r.p.b
            .reg_mr_iova(pd2, vec![0xD0u8; LEN], ALL(), BASE + 8 * LEN as u64)
            .unwrap();
    let wcs = r.run(write(other.addr, other.rkey), 64);
    r.assert_nak(&wcs, WcStatus::RemAccessErr);
    r.assert_memory_intact(false);
    assert!(
        r.p.b
            .mr_bytes(other.lkey)
            .unwrap()
            .iter()
            .all(|&b| b == 0xD0)
    );

    // A deregistered MR: its key is refused at once.
    let mut r = rig();
    let gone =
        r.p.b
            .reg_mr_iova(r.b.pd, vec![0u8; LEN], ALL(), BASE + 8 * LEN as u64)
            .unwrap();
    r.p.b.dereg_mr(gone.lkey).unwrap();
    let wcs = r.run(write(gone.addr, gone.rkey), 64);
    r.assert_nak(&wcs, WcStatus::RemAccessErr);
    r.assert_memory_intact(false);

    // MRs without the right the request needs (each has the other remote rights).
    let cases: [(AccessFlags, MakeOp); 3] = [
        (
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC,
            write,
        ),
        (
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC,
            read,
        ),
        (
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
            |va, rkey| SendOp::AtomicFetchAndAdd {
                remote_addr: va,
                rkey,
                add: 1,
            },
        ),
    ];
    for (access, op) in cases {
        let mut r = rig();
        let m =
            r.p.b
                .reg_mr_iova(r.b.pd, vec![0xE0u8; LEN], access, BASE + 8 * LEN as u64)
                .unwrap();
        let wcs = r.run(op(m.addr, m.rkey), 8);
        r.assert_nak(&wcs, WcStatus::RemAccessErr);
        r.assert_memory_intact(false);
        assert!(r.p.b.mr_bytes(m.lkey).unwrap().iter().all(|&b| b == 0xE0));
    }
}

/// A WRITE in flight when the responder deregisters its MR: the packets that arrive after it are NAKed (the R_Key is
/// resolved per packet), the requester's WR fails with REM_ACCESS_ERR, and the memory, handed back to the owner by
/// `dereg_mr`, is never touched again (the engine holds no reference to it).
#[test]
fn a_deregistered_mr_is_refused_while_a_write_to_it_is_in_flight() {
    let mut r = rig();
    let big =
        r.p.b
            .reg_mr_iova(r.b.pd, vec![0u8; 16 * 1024], ALL(), BASE + 8 * LEN as u64)
            .unwrap();
    let local = mr(&mut r.p.a, r.a.pd, 16 * 1024, |i| (i % 251) as u8 + 1);
    let s = [sge(&local, 0, 16 * 1024)];
    // The wire carries the WRITE's first 3 packets and loses the rest until the MR is gone; go-back-N then sends
    // them again.
    let open = std::rc::Rc::new(std::cell::Cell::new(false));
    let (o2, mut n) = (open.clone(), 0);
    r.p.filter = Box::new(move |d, _| {
        if d == Dir::AtoB && !o2.get() {
            n += 1;
            return n <= 3;
        }
        true
    });
    r.p.a
        .post_send(
            r.a.qpn,
            &[SendWr::new(
                7,
                SendOp::RdmaWrite {
                    remote_addr: big.addr,
                    rkey: big.rkey,
                },
                &s,
            )],
        )
        .unwrap();
    r.p.drive_for(Duration::from_micros(100));
    let placed = r.p.b.counters().rcvd_pkts as usize;
    assert_eq!(placed, 3);
    let buf = r.p.b.dereg_mr(big.lkey).unwrap();
    open.set(true);
    let bytes = buf.to_vec();
    r.p.drive();
    let wcs = poll_all(&mut r.p.a, r.a.cq);
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].status, WcStatus::RemAccessErr);
    assert_eq!(r.p.b.counters().resp_remote_access_errors, 1);
    // What B placed before the deregistration is the WRITE's first packets; nothing after them.
    assert!(bytes[..placed * 1024].iter().all(|&b| b != 0));
    assert!(bytes[placed * 1024..].iter().all(|&b| b == 0));
    r.assert_memory_intact(false);
}

#[test]
fn qp_without_remote_rights_misaligned_atomic_and_read_beyond_2_31_are_nak_invalid_request() {
    // The responder QP grants no remote write.
    let o = ConnOpts {
        access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
        ..ConnOpts::default()
    };
    let mut r = rig_with(&o);
    let t = r.target.rkey;
    let wcs = r.run(write(BASE, t), 64);
    r.assert_nak(&wcs, WcStatus::RemInvReqErr);
    r.assert_memory_intact(false);

    // Atomics on a VA that is not 8-byte aligned (IBTA §9.4.5: naturally aligned).
    let misaligned: [MakeOp; 2] = [
        |_, rkey| SendOp::AtomicFetchAndAdd {
            remote_addr: BASE + 4,
            rkey,
            add: 1,
        },
        |_, rkey| SendOp::AtomicCmpAndSwp {
            remote_addr: BASE + LEN as u64 - 4,
            rkey,
            compare: 0,
            swap: u64::MAX,
        },
    ];
    for make in misaligned {
        let mut r = rig();
        let op = make(BASE, r.target.rkey);
        let wcs = r.run(op, 8);
        r.assert_nak(&wcs, WcStatus::RemInvReqErr);
        r.assert_memory_intact(false);
        assert_eq!(r.p.a.mr_bytes(r.local.lkey).unwrap(), r.local_init);
    }

    // A READ request whose RETH asks for more than 2^31 bytes (max_msg_sz): the requester never sends one, so it is
    // forged with A's address, QPN and the expected PSN. B answers NAK invalid request (0x61) and reads nothing.
    for dma_len in [(1u32 << 31) + 1, u32::MAX] {
        let mut r = rig();
        let tpl = r.a_to_b_template();
        let epsn = r.epsn();
        let forged = craft(
            &tpl,
            0x0C,
            epsn,
            roce_wire::ExtRepr {
                reth: Some(roce_wire::RethRepr {
                    va: BASE,
                    rkey: r.target.rkey.0,
                    dma_len,
                }),
                ..roce_wire::ExtRepr::NONE
            },
            &[],
        );
        let before = r.p.captured.len();
        let now = r.p.now;
        r.p.b.handle_frame(now, &forged);
        r.p.transmit();
        let out: Vec<_> = r.p.captured[before..]
            .iter()
            .filter(|c| c.1 == Dir::BtoA)
            .collect();
        assert_eq!(out.len(), 1, "one answer");
        let rep = roce_wire::RoceRepr::parse(&out[0].2).unwrap().repr;
        assert_eq!(rep.bth.opcode.0, 0x11);
        assert_eq!(rep.bth.psn.value(), epsn);
        assert_eq!(
            rep.ext.aeth.unwrap().syndrome,
            roce_wire::AethSyndrome::Nak(roce_wire::NakCode::InvalidRequest)
        );
        assert_eq!(r.p.b.counters().resp_nak_sent, 1);
        assert_eq!(r.p.b.counters().rx_read_requests, 0);
        assert_eq!(
            r.p.b.query_qp(r.b.qpn).unwrap().qp_state,
            QpState::Err,
            "class C error: the responder QP goes to ERR"
        );
        r.p.drive();
        r.assert_memory_intact(false);
    }
}

/// Receive filtering (`ROCEV2.md §5`): a WRITE forged with a valid R_Key and the expected PSN, but from another IP
/// address, with another P_Key, or to a QPN nobody holds, is dropped and counted before it reaches memory; the
/// connection then goes on. The UDP source port is flow entropy (`ROCEV2.md §1.4`) and not part of a connection: a
/// packet from the peer's address with another source port is judged by its PSN like any other (an old PSN is a
/// duplicate, re-ACKed and not executed; a future one is out of sequence, NAKed once).
#[test]
fn forged_source_pkey_and_qpn_are_counted_drops() {
    let mut r = rig();
    let tpl = r.a_to_b_template();
    let epsn = r.epsn();
    let reth = |rk: Rkey| roce_wire::ExtRepr {
        reth: Some(roce_wire::RethRepr {
            va: BASE,
            rkey: rk.0,
            dma_len: 8,
        }),
        ..roce_wire::ExtRepr::NONE
    };
    let w = craft(&tpl, 0x0A, epsn, reth(r.target.rkey), &[0xEE; 8]);
    let edit = |f: &dyn Fn(&mut roce_wire::RoceRepr)| {
        reemit(
            &w,
            |rep| {
                f(rep);
            },
            &[0xEE; 8],
        )
    };
    let from_third = edit(&|rep| {
        if let roce_wire::IpRepr::Ipv4(ip) = &mut rep.ip {
            ip.src_addr = [10, 0, 0, 3].into();
        }
    });
    // 0x7FFF would match: the table's 0xFFFF is a full member, so a limited member's key is accepted (IBTA §10.9.3).
    let bad_pkey = edit(&|rep| rep.bth.pkey = 0x1234);
    let no_qp = edit(&|rep| rep.bth.dest_qp = Qpn::new(0xABCD));
    let old_psn_other_port = edit(&|rep| {
        rep.udp.src_port ^= 0x5555;
        rep.bth.psn = Psn::new(epsn.wrapping_sub(1) & 0xFF_FFFF);
    });
    let future_psn_other_port = edit(&|rep| {
        rep.udp.src_port ^= 0x5555;
        rep.bth.psn = Psn::new((epsn + 1000) & 0xFF_FFFF);
    });
    let now = r.p.now;
    let c0 = r.p.b.counters().clone();
    for _ in 0..100 {
        r.p.b.handle_frame(now, &from_third);
        r.p.b.handle_frame(now, &bad_pkey);
        r.p.b.handle_frame(now, &no_qp);
    }
    r.p.b.handle_frame(now, &old_psn_other_port);
    r.p.b.handle_frame(now, &future_psn_other_port);
    let c = r.p.b.counters();
    assert_eq!(c.drop_wrong_peer - c0.drop_wrong_peer, 100);
    assert_eq!(c.drop_pkey_mismatch - c0.drop_pkey_mismatch, 100);
    assert_eq!(c.drop_unknown_qp - c0.drop_unknown_qp, 100);
    assert_eq!(c.duplicate_request - c0.duplicate_request, 1);
    assert_eq!(c.out_of_seq_request - c0.out_of_seq_request, 1);
    assert_eq!(
        c.rx_write_requests, c0.rx_write_requests,
        "nothing executed"
    );
    r.assert_memory_intact(false);
    r.p.drive();
    // The connection is intact: a genuine WRITE lands.
    let t = r.target.rkey;
    let wcs = r.run(write(BASE, t), 64);
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].status, WcStatus::Success);
    assert_eq!(
        r.p.b.mr_bytes(r.target.lkey).unwrap()[..64],
        r.local_init[LEN..LEN + 64]
    );
    r.assert_memory_intact(true);
    assert_counters_add_up(&r.p.b);
}

/// Responses nobody asked for (`ROCEV2.md §4.4`): an ACK or NAK beyond every PSN sent, a READ response and an
/// ATOMIC ACK with nothing outstanding are `drop_stale_response`; a UD opcode on an RC QP is `drop_bad_opcode`; an
/// ACK with a reserved syndrome and an old PSN is an ignored `duplicate_response`. None completes a WR, moves a PSN or writes memory.
#[test]
fn ghost_acks_and_unexpected_responses_are_counted_drops() {
    let mut r = rig();
    r.a_to_b_template();
    let ack =
        r.p.captured
            .iter()
            .rev()
            .find(|c| c.1 == Dir::BtoA && c.2[42] == 0x11)
            .unwrap()
            .2
            .clone();
    let (_, ack_psn, _) = bth_of(&ack);
    let next = r.p.a.query_qp(r.a.qpn).unwrap().sq_psn.value();
    assert_eq!(next, (ack_psn + 1) & 0xFF_FFFF);
    let aeth = |s: roce_wire::AethSyndrome| roce_wire::ExtRepr {
        aeth: Some(roce_wire::AethRepr {
            syndrome: s,
            msn: Msn::new(5),
        }),
        ..roce_wire::ExtRepr::NONE
    };
    let good = roce_wire::AethSyndrome::Ack { credit: 31 };
    let ghost_ack = craft(&ack, 0x11, next + 500, aeth(good), &[]);
    let ghost_nak = craft(
        &ack,
        0x11,
        next + 500,
        aeth(roce_wire::AethSyndrome::Nak(roce_wire::NakCode::PsnSeqErr)),
        &[],
    );
    let read_resp = craft(&ack, 0x10, next, aeth(good), &[0xAB; 64]);
    let atomic_ack = craft(
        &ack,
        0x12,
        next,
        roce_wire::ExtRepr {
            atomic_ack_eth: Some(roce_wire::AtomicAckEthRepr { orig_value: 0x4242 }),
            ..aeth(good)
        },
        &[],
    );
    let reserved = craft(
        &ack,
        0x11,
        ack_psn,
        aeth(roce_wire::AethSyndrome::Reserved(0x40)),
        &[],
    );
    let ud_send = craft(
        &ack,
        0x64,
        next,
        roce_wire::ExtRepr {
            deth: Some(roce_wire::DethRepr {
                qkey: 0x1111_1111,
                src_qp: Qpn::new(0x11),
            }),
            ..roce_wire::ExtRepr::NONE
        },
        &[1, 2, 3, 4],
    );
    let c0 = r.p.a.counters().clone();
    let now = r.p.now;
    for _ in 0..50 {
        for f in [
            &ghost_ack,
            &ghost_nak,
            &read_resp,
            &atomic_ack,
            &reserved,
            &ud_send,
        ] {
            r.p.a.handle_frame(now, f);
        }
    }
    let c = r.p.a.counters();
    assert_eq!(c.drop_stale_response - c0.drop_stale_response, 200);
    assert_eq!(c.drop_bad_opcode - c0.drop_bad_opcode, 50);
    // The reserved syndrome carries an old PSN: judged a duplicate before its syndrome is read.
    assert_eq!(c.duplicate_response - c0.duplicate_response, 50);
    assert_eq!(c.completer_retry_err, c0.completer_retry_err, "no retry");
    assert!(poll_all(&mut r.p.a, r.a.cq).is_empty(), "no completion");
    assert_eq!(r.p.a.query_qp(r.a.qpn).unwrap().sq_psn.value(), next);
    assert_eq!(r.p.a.mr_bytes(r.local.lkey).unwrap(), r.local_init);
    r.p.drive();
    assert_eq!(r.p.a.poll_transmit(r.p.now, &mut [0u8; 9000]), None);
    // Still usable.
    let t = r.target.rkey;
    let wcs = r.run(write(BASE, t), 64);
    assert_eq!(wcs[0].status, WcStatus::Success);
    assert_counters_add_up(&r.p.a);
}

/// A duplicate flood (`ROCEV2.md §5`): 10,000 copies of an old WRITE are re-ACKed (at most one ACK each), never
/// executed again (the later WRITE's bytes stay), and complete nothing at either end.
#[test]
fn duplicate_flood_is_acked_not_executed() {
    let mut r = rig();
    let t = r.target.rkey;
    let before = r.p.captured.len();
    assert_eq!(r.run(write(BASE, t), 64)[0].status, WcStatus::Success);
    let old = r.p.captured[before..]
        .iter()
        .find(|c| c.1 == Dir::AtoB && c.2[42] == 0x0A)
        .unwrap()
        .2
        .clone();
    // A second WRITE of other bytes to the same place.
    r.p.a.mr_write(r.local.lkey, LEN, &[0x77; 64]).unwrap();
    assert_eq!(r.run(write(BASE, t), 64)[0].status, WcStatus::Success);
    let sent0 = r.p.b.counters().sent_pkts;
    let dup0 = r.p.b.counters().duplicate_request;
    let now = r.p.now;
    for _ in 0..10_000 {
        r.p.b.handle_frame(now, &old);
    }
    assert_eq!(r.p.b.counters().duplicate_request - dup0, 10_000);
    r.p.drive();
    let acks = r.p.b.counters().sent_pkts - sent0;
    assert!(acks <= 10_000, "{acks} answers to 10,000 duplicates");
    assert_eq!(
        &r.p.b.mr_bytes(r.target.lkey).unwrap()[..64],
        &[0x77; 64],
        "duplicate re-executed"
    );
    assert!(poll_all(&mut r.p.a, r.a.cq).is_empty());
    assert!(poll_all(&mut r.p.b, r.b.cq).is_empty());
    assert_eq!(r.p.b.counters().rx_write_requests, 2);
    r.assert_memory_intact(true);
    assert_counters_add_up(&r.p.a);
    assert_counters_add_up(&r.p.b);
}

/// An RNR storm: B never posts a receive and A retries forever (`rnr_retry` 7). The retries are paced by the RNR
/// timer B advertises (`ROCEV2.md §4.4`, S04/S19): over 1 s of virtual time A sends at most one SEND per timer
/// period, then completes once B posts.
#[test]
fn rnr_storm_retries_are_paced_by_the_rnr_timer() {
    let o = ConnOpts {
        min_rnr_timer: 14, // 0.96 ms
        ..ConnOpts::default()
    };
    let mut r = rig_with(&o);
    let s = [r.sge(64)];
    r.p.a
        .post_send(r.a.qpn, &[SendWr::new(7, SendOp::Send, &s)])
        .unwrap();
    let before = r.p.captured.len();
    r.p.advance(Duration::from_secs(1));
    let sends = r.p.captured[before..]
        .iter()
        .filter(|c| c.1 == Dir::AtoB)
        .count();
    let period = wire::rnr_timer(14);
    let most = (Duration::from_secs(1).as_nanos() / period.as_nanos()) as usize + 1;
    assert!(
        sends <= most && sends >= most / 2,
        "{sends} SENDs in 1 s, RNR timer {period:?}"
    );
    assert_eq!(r.p.a.counters().rcvd_rnr_err as usize, sends);
    assert!(poll_all(&mut r.p.a, r.a.cq).is_empty());
    let rs = [sge(&r.target, 0, 64)];
    r.p.b
        .post_recv(
            r.b.qpn,
            &[RecvWr {
                wr_id: 1,
                sg_list: &rs,
            }],
        )
        .unwrap();
    r.p.drive();
    // A's retries stop and the SEND lands once a receive is there.
    let wcs = poll_all(&mut r.p.a, r.a.cq);
    assert_eq!(wcs.len(), 1);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (7, WcStatus::Success));
    assert_eq!(
        r.p.b.mr_bytes(r.target.lkey).unwrap()[..64],
        r.local_init[LEN..LEN + 64]
    );
    r.assert_memory_intact(true);
}

/// A NAK storm: 1,000 forged sequence-error NAKs (from the peer's address, in window) for a 32-packet WRITE whose
/// ACKs are lost start one go-back-N retry, not 1,000 (`ROCEV2.md §4.4`; rxe `comp.started_retry`): the retransmitted
/// packets stay within one message, and the WR still completes.
#[test]
fn sequence_nak_storm_starts_one_retry() {
    let mut r = rig();
    r.a_to_b_template();
    let ack =
        r.p.captured
            .iter()
            .rev()
            .find(|c| c.1 == Dir::BtoA && c.2[42] == 0x11)
            .unwrap()
            .2
            .clone();
    let first = r.p.a.query_qp(r.a.qpn).unwrap().sq_psn.value();
    let big = mr(&mut r.p.a, r.a.pd, 32 * 1024, |i| (i % 253) as u8);
    let dst =
        r.p.b
            .reg_mr_iova(r.b.pd, vec![0u8; 32 * 1024], ALL(), BASE + 16 * LEN as u64)
            .unwrap();
    // B→A lost while the storm runs.
    r.p.filter = Box::new(|d, _| d == Dir::AtoB);
    let s = [sge(&big, 0, 32 * 1024)];
    r.p.a
        .post_send(
            r.a.qpn,
            &[SendWr::new(
                7,
                SendOp::RdmaWrite {
                    remote_addr: dst.addr,
                    rkey: dst.rkey,
                },
                &s,
            )],
        )
        .unwrap();
    r.p.drive_for(Duration::from_micros(200));
    let nak = craft(
        &ack,
        0x11,
        first,
        roce_wire::ExtRepr {
            aeth: Some(roce_wire::AethRepr {
                syndrome: roce_wire::AethSyndrome::Nak(roce_wire::NakCode::PsnSeqErr),
                msn: Msn::new(1),
            }),
            ..roce_wire::ExtRepr::NONE
        },
        &[],
    );
    let retx0 = r.p.a.counters().retransmitted_pkts;
    for _ in 0..1000 {
        let now = r.p.now;
        r.p.a.handle_frame(now, &nak);
        r.p.transmit();
    }
    let c = r.p.a.counters();
    assert_eq!(c.rcvd_seq_err, 1000);
    assert_eq!(c.completer_retry_err, 1, "one retry for the storm");
    assert!(
        c.retransmitted_pkts - retx0 <= 32,
        "{} packets retransmitted",
        c.retransmitted_pkts - retx0
    );
    r.p.filter = Box::new(|_, _| true);
    r.p.drive();
    let wcs = poll_all(&mut r.p.a, r.a.cq);
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].status, WcStatus::Success);
    assert_eq!(
        r.p.b.mr_bytes(dst.lkey).unwrap(),
        r.p.a.mr_bytes(big.lkey).unwrap()
    );
}

/// A CNP flood from the connected peer (every 2 µs for 1 s of virtual time, while A sends): the DCQCN reaction
/// point never sets a rate below its configured minimum (`DCQCN.md §2.3`: `R_C ≥ min_rate`), and A still finishes.
#[test]
fn cnp_flood_never_takes_the_rate_below_the_minimum() {
    let rp = DcqcnConfig::new(cc::Profile::Paper, 10e9);
    let min = match &rp {
        DcqcnConfig::Paper(p) => p.min_rate_bps,
        _ => unreachable!(),
    };
    let mut p = Pair::with_configs(
        EngineConfig {
            dcqcn: Some(rp),
            ..cfg(MAC_A, IP_A, 1)
        },
        cfg(MAC_B, IP_B, 2),
    );
    let (a, b) = connect(&mut p, &ConnOpts::default());
    let src = mr(&mut p.a, a.pd, 64 * 1024, |i| i as u8);
    let dst = mr(&mut p.b, b.pd, 64 * 1024, |_| 0);
    let s = [sge(&src, 0, 64 * 1024)];
    p.a.post_send(
        a.qpn,
        &[SendWr::new(
            1,
            SendOp::RdmaWrite {
                remote_addr: dst.addr,
                rkey: dst.rkey,
            },
            &s,
        )],
    )
    .unwrap();
    p.drive_for(Duration::from_micros(20));
    let ack = p
        .captured
        .iter()
        .find(|c| c.1 == Dir::AtoB)
        .unwrap()
        .2
        .clone();
    // A CNP from B to A: re-emit A's own frame with the addresses swapped.
    let cnp = reemit(
        &ack,
        |rep| {
            if let roce_wire::IpRepr::Ipv4(ip) = &mut rep.ip {
                core::mem::swap(&mut ip.src_addr, &mut ip.dst_addr);
            }
            core::mem::swap(&mut rep.eth.src_addr, &mut rep.eth.dst_addr);
            rep.bth.opcode = roce_wire::Opcode(0x81);
            rep.bth.becn = true;
            rep.bth.ack_req = false;
            rep.bth.psn = Psn::new(0);
            rep.bth.dest_qp = a.qpn;
            rep.ext = roce_wire::ExtRepr {
                cnp: Some(roce_wire::CnpRepr),
                ..roce_wire::ExtRepr::NONE
            };
        },
        &[],
    );
    let mut lowest = u64::MAX;
    for _ in 0..500_000 {
        let now = p.now;
        p.a.handle_frame(now, &cnp);
        if let Some(r) = p.a.qp_rate(a.qpn, now).unwrap().rate_bps {
            lowest = lowest.min(r);
        }
        p.advance(Duration::from_micros(2));
    }
    assert!(p.a.counters().rp_cnp_handled > 0);
    assert!(
        lowest as f64 >= min * 0.999,
        "rate {lowest} b/s below the minimum {min}"
    );
    p.drive();
    let wcs = poll_all(&mut p.a, a.cq);
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].status, WcStatus::Success);
}

/// IPv4 options, fragments, a UDP length that disagrees with the IP length, and extension headers cut short: each
/// is `drop_malformed` at the RoCE parser (`roce_wire::RoceRepr::parse`; RoCE v2 never sends options or fragments,
/// rxe assumes a 20-byte header), with a correct IP checksum and ICRC, so the check under test is the one that
/// refuses it; nothing reaches a QP.
#[test]
fn ipv4_options_fragments_bad_udp_length_and_truncated_headers_are_malformed_drops() {
    let mut r = rig();
    let tpl = r.a_to_b_template();
    let epsn = r.epsn();
    let w = craft(
        &tpl,
        0x0A,
        epsn,
        roce_wire::ExtRepr {
            reth: Some(roce_wire::RethRepr {
                va: BASE,
                rkey: r.target.rkey.0,
                dma_len: 8,
            }),
            ..roce_wire::ExtRepr::NONE
        },
        &[0xEE; 8],
    );
    // Fix the IPv4 header checksum and the ICRC after an edit of the bytes from offset 14.
    let seal = |mut f: Vec<u8>| {
        let mut ip = roce_wire::Ipv4Packet::new_unchecked(&mut f[14..]);
        ip.fill_checksum();
        let _ = roce_wire::icrc::fill(&mut f[14..]);
        f
    };
    let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
    // Options: IHL 6 with a 4-byte NOP option between the IP and UDP headers.
    {
        let mut f = w[..34].to_vec();
        f.extend_from_slice(&[1, 1, 1, 0]);
        f.extend_from_slice(&w[34..]);
        f[14] = 0x46;
        let tl = u16::from_be_bytes([f[16], f[17]]) + 4;
        f[16..18].copy_from_slice(&tl.to_be_bytes());
        cases.push(("IPv4 options", seal(f)));
    }
    for (name, flags) in [("more fragments", 0x20u8), ("fragment offset", 0x40 | 0x01)] {
        let mut f = w.clone();
        f[20] = flags;
        cases.push((name, seal(f)));
    }
    for (name, delta) in [("UDP length short", -4i32), ("UDP length long", 4)] {
        let mut f = w.clone();
        let ul = (i32::from(u16::from_be_bytes([f[38], f[39]])) + delta) as u16;
        f[38..40].copy_from_slice(&ul.to_be_bytes());
        cases.push((name, seal(f)));
    }
    // Truncated extension header: the RETH (16 bytes) cut to 10, with IP and UDP lengths that agree.
    {
        let mut f = w[..54 + 10].to_vec();
        f.extend_from_slice(&[0; 4]); // room for an ICRC
        let tl = (f.len() - 14) as u16;
        f[16..18].copy_from_slice(&tl.to_be_bytes());
        let ul = (f.len() - 34) as u16;
        f[38..40].copy_from_slice(&ul.to_be_bytes());
        cases.push(("RETH cut short", seal(f)));
    }
    let now = r.p.now;
    for (name, f) in &cases {
        let m0 = r.p.b.counters().drop_malformed;
        let rcvd0 = r.p.b.counters().rcvd_pkts;
        r.p.b.handle_frame(now, f);
        assert_eq!(r.p.b.counters().drop_malformed, m0 + 1, "{name}");
        assert_eq!(r.p.b.counters().rcvd_pkts, rcvd0, "{name}");
    }
    assert_eq!(r.p.b.counters().rx_icrc_encapsulated, 0);
    r.assert_memory_intact(false);
    // The unmodified frame is accepted (the cases above differ from it only in what they test).
    r.p.b.handle_frame(now, &w);
    assert_eq!(r.p.b.counters().rx_write_requests, 1);
}

/// Random datagrams while a verified run goes on: 200 WRITEs of random sizes over lossy wire while every delivered
/// frame is followed by three hostile ones (random bytes; a real frame with a random field changed and its ICRC
/// recomputed, from a third address; a real frame cut at a random length). Every WR completes successfully and
/// exactly once, B's memory equals the model, no canary changes and the counters add up.
#[test]
fn random_datagram_flood_during_a_verified_run() {
    let mut r = rig();
    let big =
        r.p.b
            .reg_mr_iova(r.b.pd, vec![0u8; 64 * 1024], ALL(), BASE + 16 * LEN as u64)
            .unwrap();
    let src = mr(&mut r.p.a, r.a.pd, 64 * 1024, |i| (i * 7 % 256) as u8);
    let mut model = vec![0u8; 64 * 1024];
    let mut seed = 0x1234_5678_9abc_def0u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut drop_rng = 99u64;
    r.p.filter = Box::new(move |_, _| {
        drop_rng = drop_rng.wrapping_mul(6364136223846793005).wrapping_add(1);
        (drop_rng >> 33) % 100 >= 2
    });
    let mut completed = std::collections::HashSet::new();
    for n in 0..200u64 {
        let len = 1 + (rnd() % 8000) as u32;
        let off = rnd() % (64 * 1024 - u64::from(len));
        let soff = rnd() % (64 * 1024 - u64::from(len));
        let s = [sge(&src, soff, len)];
        r.p.a
            .post_send(
                r.a.qpn,
                &[SendWr::new(
                    n,
                    SendOp::RdmaWrite {
                        remote_addr: big.addr + off,
                        rkey: big.rkey,
                    },
                    &s,
                )],
            )
            .unwrap();
        let sb = r.p.a.mr_bytes(src.lkey).unwrap();
        model[off as usize..(off + u64::from(len)) as usize]
            .copy_from_slice(&sb[soff as usize..(soff + u64::from(len)) as usize]);
        // Step until this WR completes, with hostile frames after every step.
        let mut guard = 0;
        loop {
            let progressed = r.p.step();
            let real = r.p.captured.last().map(|c| c.2.clone());
            let now = r.p.now;
            let mut junk = vec![0u8; (rnd() % 200) as usize];
            junk.iter_mut().for_each(|b| *b = rnd() as u8);
            r.p.a.handle_frame(now, &junk);
            r.p.b.handle_frame(now, &junk);
            if let Some(f) = real {
                let cut = (rnd() as usize) % f.len();
                r.p.b.handle_frame(now, &f[..cut]);
                r.p.a.handle_frame(now, &f[..cut]);
                if let Ok(p) = roce_wire::RoceRepr::parse(&f) {
                    let mut rep = p.repr;
                    if let roce_wire::IpRepr::Ipv4(ip) = &mut rep.ip {
                        ip.src_addr = [10, 0, 0, 9].into();
                    }
                    rep.bth.psn = Psn::new(rnd() as u32 & 0xFF_FFFF);
                    if rnd() % 2 == 0 {
                        rep.bth.dest_qp = Qpn::new(rnd() as u32 & 0xFF_FFFF);
                    }
                    let payload = p.payload.to_vec();
                    let mut out = vec![0u8; rep.buffer_len()];
                    if rep.emit(&mut out, |b| b.copy_from_slice(&payload)).is_ok() {
                        r.p.a.handle_frame(now, &out);
                        r.p.b.handle_frame(now, &out);
                    }
                }
            }
            for wc in poll_all(&mut r.p.a, r.a.cq) {
                assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                assert!(completed.insert(wc.wr_id), "{} completed twice", wc.wr_id);
            }
            if completed.contains(&n) {
                break;
            }
            assert!(progressed, "stalled at WR {n}");
            guard += 1;
            assert!(guard < 200_000, "WR {n} never completed");
        }
    }
    r.p.drive();
    assert_eq!(completed.len(), 200);
    assert_eq!(r.p.b.mr_bytes(big.lkey).unwrap(), model, "data differs");
    assert!(r.p.b.counters().drop_wrong_peer > 0);
    assert!(r.p.b.counters().drop_malformed > 0);
    r.assert_memory_intact(false);
    assert_counters_add_up(&r.p.a);
    assert_counters_add_up(&r.p.b);
}

/// The responder's count of READ/atomic responses it owes for new requests (`RespQueue::owed_rd_atomic`, the
/// responder-resource check of every incoming READ/atomic: kept with the queue, not a scan of it per request)
/// across the paths that change the response queue: new READs and atomics count; a duplicate READ/atomic
/// supersedes what was queued from its PSN on and queues a replay that does not count; reusing a resource drops
/// its queued replay; a sequence NAK does not count; transmitting uncounts; a READ beyond `max_dest_rd_atomic` is
/// NAKed invalid request while the responses owed before it stay counted until they are sent. Debug builds also
/// check the count against a recount of the queue whenever it is read.
#[test]
fn owed_rd_atomic_count_across_read_atomic_duplicate_and_nak_paths() {
    let o = ConnOpts {
        max_dest_rd_atomic: 4,
        ..ConnOpts::default()
    };
    let mut r = rig_with(&o);
    let tpl = r.a_to_b_template();
    let e = r.epsn();
    let rkey = r.target.rkey.0;
    let read = |i: u32| roce_wire::ExtRepr {
        reth: Some(roce_wire::RethRepr {
            va: BASE + 64 * u64::from(i),
            rkey,
            dma_len: 64,
        }),
        ..roce_wire::ExtRepr::NONE
    };
    let fetch_add = roce_wire::ExtRepr {
        atomic_eth: Some(roce_wire::AtomicEthRepr {
            va: BASE + 2048,
            rkey,
            swap_add: 1,
            compare: 0,
        }),
        ..roce_wire::ExtRepr::NONE
    };
    let send = |r: &mut Rig, opcode: u8, psn: u32, ext: roce_wire::ExtRepr| {
        let f = craft(&tpl, opcode, psn & 0xFF_FFFF, ext, &[]);
        let now = r.p.now;
        r.p.b.handle_frame(now, &f);
        let q = r.p.b.qp(r.b.qpn).expect("B's QP");
        (q.resp.out.owed_rd_atomic(), q.resp.out.len())
    };
    const READ: u8 = 0x0C;
    const FETCH_ADD: u8 = 0x14;
    // New requests: resources 0, 1, 2.
    assert_eq!(send(&mut r, READ, e, read(0)), (1, 1));
    assert_eq!(send(&mut r, FETCH_ADD, e + 1, fetch_add), (2, 2));
    assert_eq!(send(&mut r, READ, e + 2, read(2)), (3, 3));
    // A duplicate of the first READ: everything queued from its PSN on goes, its replay does not count.
    assert_eq!(send(&mut r, READ, e, read(0)), (0, 1));
    // A duplicate of the atomic: its saved result is resent, not counted.
    assert_eq!(send(&mut r, FETCH_ADD, e + 1, fetch_add), (0, 2));
    // New again: resource 3, then resource 0 reused, which drops its queued replay.
    assert_eq!(send(&mut r, READ, e + 3, read(3)), (1, 3));
    assert_eq!(send(&mut r, FETCH_ADD, e + 4, fetch_add), (2, 3));
    r.p.transmit();
    let q = r.p.b.qp(r.b.qpn).unwrap();
    assert_eq!((q.resp.out.owed_rd_atomic(), q.resp.out.len()), (0, 0));
    // A PSN gap: NAK sequence error queued, nothing owed.
    assert_eq!(send(&mut r, READ, e + 6, read(6)), (0, 1));
    r.p.transmit();
    // Four new READs fill the responder resources; a fifth is NAKed invalid request (QP to ERR), and the four
    // responses owed before it stay counted until they leave, ahead of the NAK.
    for k in 0..4 {
        assert_eq!(
            send(&mut r, READ, e + 5 + k, read(5 + k)),
            (k as usize + 1, k as usize + 1)
        );
    }
    assert_eq!(send(&mut r, READ, e + 9, read(9)), (4, 4));
    assert_eq!(r.p.b.query_qp(r.b.qpn).unwrap().qp_state, QpState::Err);
    r.p.transmit();
    let q = r.p.b.qp(r.b.qpn).unwrap();
    assert_eq!((q.resp.out.owed_rd_atomic(), q.resp.out.len()), (0, 0));
}

/// 64 requests of `opcode` (READ 0x0C or FETCH_ADD 0x14) in one burst, in sequence from the peer's address, against
/// a responder that granted `max_dest_rd_atomic` 4; returns the rig, B's ePSN before the burst and B's answers.
fn rd_atomic_burst(opcode: u8) -> (Rig, u32, Vec<roce_wire::RoceRepr>) {
    let o = ConnOpts {
        max_dest_rd_atomic: 4,
        ..ConnOpts::default()
    };
    let mut r = rig_with(&o);
    let tpl = r.a_to_b_template();
    let epsn = r.epsn();
    let now = r.p.now;
    let before = r.p.captured.len();
    for i in 0..64u32 {
        let ext = if opcode == 0x0C {
            roce_wire::ExtRepr {
                reth: Some(roce_wire::RethRepr {
                    va: BASE + 64 * u64::from(i % 16),
                    rkey: r.target.rkey.0,
                    dma_len: 64,
                }),
                ..roce_wire::ExtRepr::NONE
            }
        } else {
            roce_wire::ExtRepr {
                atomic_eth: Some(roce_wire::AtomicEthRepr {
                    va: BASE + 8,
                    rkey: r.target.rkey.0,
                    swap_add: u64::from(i) + 1,
                    compare: 0,
                }),
                ..roce_wire::ExtRepr::NONE
            }
        };
        let f = craft(&tpl, opcode, (epsn + i) & 0xFF_FFFF, ext, &[]);
        r.p.b.handle_frame(now, &f);
        // The response queue never outgrows the room reserved for the resources (no allocation per packet).
        let q = r.p.b.qp(r.b.qpn).expect("B's QP");
        assert!(
            q.resp.out.len() <= qp::RespCtx::out_room(4),
            "response queue {} after request {i}",
            q.resp.out.len()
        );
    }
    r.p.transmit();
    let answers = r.p.captured[before..]
        .iter()
        .filter(|c| c.1 == Dir::BtoA)
        .map(|c| roce_wire::RoceRepr::parse(&c.2).unwrap().repr)
        .collect();
    (r, epsn, answers)
}

/// B's answers after the four granted requests: one NAK invalid request for the fifth PSN, and the QP in ERR.
fn assert_fifth_is_nak_invalid_request(r: &Rig, epsn: u32, after: &[roce_wire::RoceRepr]) {
    assert_eq!(after.len(), 1, "one NAK, nothing after it: {after:?}");
    assert_eq!(after[0].bth.opcode.0, 0x11, "ACKNOWLEDGE");
    assert_eq!(after[0].bth.psn.value(), (epsn + 4) & 0xFF_FFFF);
    assert_eq!(
        after[0].ext.aeth.unwrap().syndrome,
        roce_wire::AethSyndrome::Nak(roce_wire::NakCode::InvalidRequest)
    );
    assert_eq!(
        r.p.b.query_qp(r.b.qpn).unwrap().qp_state,
        QpState::Err,
        "class C error: the responder QP goes to ERR"
    );
}

/// A requester that ignores the responder's resources: 64 FETCH_ADDs in one burst against 4 granted responder
/// resources (`max_dest_rd_atomic`). The requester may have at most that many READ/atomic requests outstanding
/// (`ROCEV2.md §4.2` `max_rd_atomic`: the initiator depth, set no higher than the responder's resources); a new one
/// while all four responses are still owed is more than that, NAK invalid request (rxe's
/// `RESPST_ERR_TOO_MANY_RDMA_ATM_REQ`). The first four execute once each with the right ATOMIC ACK values, the
/// fifth is NAKed, nothing after it executes, and the response queue never grows past its reserved room (issue #21:
/// it used to hold all 64 ATOMIC ACKs of the burst, recycling resources whose results were still unsent).
#[test]
fn atomics_beyond_the_granted_resources_are_nak_invalid_request() {
    let (r, epsn, ans) = rd_atomic_burst(0x14);
    assert!(ans.len() >= 4, "{ans:?}");
    let mut sum = 0u64;
    for (i, a) in ans[..4].iter().enumerate() {
        assert_eq!(a.bth.opcode.0, 0x12, "ATOMIC ACKNOWLEDGE {i}");
        assert_eq!(a.bth.psn.value(), (epsn + i as u32) & 0xFF_FFFF);
        assert_eq!(
            a.ext.atomic_ack_eth.unwrap().orig_value,
            sum,
            "ATOMIC ACK {i}"
        );
        sum += i as u64 + 1;
    }
    assert_fifth_is_nak_invalid_request(&r, epsn, &ans[4..]);
    let t = r.p.b.mr_bytes(r.target.lkey).unwrap();
    assert_eq!(u64::from_le_bytes(t[8..16].try_into().unwrap()), sum);
    assert!(t[..8].iter().chain(&t[16..]).all(|&b| b == 0));
    assert_eq!(r.p.b.counters().rx_atomic_requests, 4);
    r.assert_memory_intact(true);
}

/// The same for RDMA READs: 64 one-packet READs in one burst against 4 resources. The four granted ones are answered
/// in full and in order, the fifth is NAK invalid request (before, the ring recycled the oldest resource and dropped
/// its queued response, so the first 60 READs went unanswered without a word).
#[test]
fn reads_beyond_the_granted_resources_are_nak_invalid_request() {
    let (r, epsn, ans) = rd_atomic_burst(0x0C);
    assert!(ans.len() >= 4, "{ans:?}");
    for (i, a) in ans[..4].iter().enumerate() {
        assert_eq!(a.bth.opcode.0, 0x10, "RDMA READ response only {i}");
        assert_eq!(a.bth.psn.value(), (epsn + i as u32) & 0xFF_FFFF);
    }
    assert_fifth_is_nak_invalid_request(&r, epsn, &ans[4..]);
    assert_eq!(r.p.b.counters().rx_read_requests, 4);
    r.assert_memory_intact(false);
}

/// The limit counts the requester's requests, not replays for duplicates: a requester within its 4 READs (READs 0..3
/// answered, then a late duplicate of READ 3 arrives, as after a spurious retransmission, and READs 4..7 follow in
/// the same burst) is answered in full and its QP goes on, although the queue then holds a replay beside three
/// fresh streams.
#[test]
fn a_replay_for_a_duplicate_does_not_count_against_the_requester() {
    let o = ConnOpts {
        max_dest_rd_atomic: 4,
        ..ConnOpts::default()
    };
    let mut r = rig_with(&o);
    let tpl = r.a_to_b_template();
    let epsn = r.epsn();
    let now = r.p.now;
    let read = |r: &Rig, i: u32| {
        craft(
            &tpl,
            0x0C,
            (epsn + i) & 0xFF_FFFF,
            roce_wire::ExtRepr {
                reth: Some(roce_wire::RethRepr {
                    va: BASE + 64 * u64::from(i),
                    rkey: r.target.rkey.0,
                    dma_len: 64,
                }),
                ..roce_wire::ExtRepr::NONE
            },
            &[],
        )
    };
    for i in 0..4 {
        let f = read(&r, i);
        r.p.b.handle_frame(now, &f);
    }
    r.p.transmit();
    let before = r.p.captured.len();
    for i in [3, 4, 5, 6, 7] {
        let f = read(&r, i);
        r.p.b.handle_frame(now, &f);
    }
    r.p.transmit();
    let psns: Vec<(u8, u32)> = r.p.captured[before..]
        .iter()
        .filter(|c| c.1 == Dir::BtoA)
        .map(|c| {
            let rep = roce_wire::RoceRepr::parse(&c.2).unwrap().repr;
            (
                rep.bth.opcode.0,
                rep.bth.psn.value().wrapping_sub(epsn) & 0xFF_FFFF,
            )
        })
        .collect();
    assert_eq!(psns, [(0x10, 4), (0x10, 5), (0x10, 6), (0x10, 7)]);
    assert_eq!(r.p.b.query_qp(r.b.qpn).unwrap().qp_state, QpState::Rts);
    assert_eq!(r.p.b.counters().rx_read_requests, 8);
}
